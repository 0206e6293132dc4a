//! Log segments and the append (dissertation §4.4, re-placed).
//!
//! The log is a fixed array of equal segments in the log segment file; the
//! segment table in the meta segment holds each one's state word, used
//! bytes, live bytes, earliest expiry and close/retire stamp. A segment is
//! claimed by a compare-and-swap of its state word from FREE to OPEN
//! (tagged with the head, or the compactor, that will fill it), so there
//! is no allocator state to corrupt, and one claimed by a process that dies
//! before linking it is recognisable by its tag. Clients leave the last
//! `reserve_segments` free segments to compaction.
//!
//! An append locks some head (this CPU's first: a busy head is skipped,
//! not waited on), writes the object uncommitted at the head's offset,
//! advances the offset and unlocks; a head whose segment is full closes it
//! (stamped, so compaction waits until no append into it can still be
//! publishing) and claims another.

use super::*;

/// Outcome of an append attempt.
pub(crate) enum Append {
    Done(ValidLoc),
    NoSpace,
}

impl Inner {
    pub(crate) fn count_free(&self) -> u64 {
        (0..self.geo.log_segments as usize)
            .filter(|&s| self.seg(s).state.load(Ordering::Relaxed) == SEG_FREE)
            .count() as u64
    }

    /// Claim a free segment for `tag`; clients leave the reserve alone.
    pub(crate) fn claim_segment(&self, tag: u64, use_reserve: bool) -> Option<usize> {
        let n = self.geo.log_segments as usize;
        if !use_reserve && self.count_free() <= self.geo.reserve_segments {
            return None;
        }
        let start = self.hdr().alloc_hint.fetch_add(1, Ordering::Relaxed) as usize % n;
        for i in 0..n {
            let s = (start + i) % n;
            let e = self.seg(s);
            if e.state.load(Ordering::Relaxed) == SEG_FREE
                && e.state
                    .compare_exchange(
                        SEG_FREE,
                        seg_state(SEG_OPEN, tag),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                e.used.store(0, Ordering::Relaxed);
                e.live.store(0, Ordering::Relaxed);
                e.min_expiry_ms.store(0, Ordering::Relaxed);
                e.stamp.store(0, Ordering::Release);
                self.write_stamp(s);
                return Some(s);
            }
        }
        None
    }

    pub(crate) fn close_segment(&self, s: usize) {
        let e = self.seg(s);
        e.stamp.store(ordered_stamp(), Ordering::Release);
        e.state.store(SEG_CLOSED, Ordering::Release);
    }

    /// Append an object under a head; the caller is pinned.
    pub(super) fn append(
        &self,
        op: &Op<'_>,
        key: &[u8],
        value: &[u8],
        hdr: &Header,
        kv_crc: u32,
    ) -> Result<Append> {
        // The header's capacity: a tombstone has room past its value.
        let size = object_bytes(key.len(), (hdr.value_cap as usize).max(value.len()));
        let h = self.lock_head(op)?;
        let head = self.head(h);
        loop {
            let cur = head.seg.load(Ordering::Acquire);
            let off = head.off.load(Ordering::Acquire);
            if cur != 0 && off + size <= self.geo.seg_bytes {
                let s = cur as usize - 1;
                let loc = self
                    .valid_loc(s as u64 * self.geo.seg_bytes + off + 1)
                    .expect("a head's offset leaves room for the object in its segment");
                // SAFETY: `size` bytes at `off` fit the head's segment
                // (checked above) and we hold the head's lock: nobody else
                // appends there, and nothing names the space yet.
                unsafe { self.write_object(loc, key, value, hdr, kv_crc) };
                point(CrashPoint::AppendMidCopy);
                head.off.store(off + size, Ordering::Release);
                self.seg(s).used.store(off + size, Ordering::Release);
                self.unlock_head(h);
                return Ok(Append::Done(loc));
            }
            if cur != 0 {
                head.seg.store(0, Ordering::Release);
                self.close_segment(cur as usize - 1);
            }
            match self.claim_segment(h as u64, false) {
                Some(s) => {
                    point(CrashPoint::SegmentClaimed);
                    // Past the segment's stamp, if it has one.
                    let start = self.seg(s).used.load(Ordering::Acquire);
                    head.off.store(start, Ordering::Relaxed);
                    head.seg.store(s as u64 + 1, Ordering::Release);
                }
                None => {
                    self.unlock_head(h);
                    return Ok(Append::NoSpace);
                }
            }
        }
    }

    /// Write state word (uncommitted, with the object's checksum; `kv_crc`
    /// is [`obj_crc_kv`] of `key` and `value`), header, key and value at
    /// `loc`.
    ///
    /// # Safety
    /// The caller reserved `object_bytes(key.len(), value.len())` bytes at
    /// `loc`, inside `loc`'s segment, under a head lock (or in the
    /// compactor's own segment), and has not published them: no one else
    /// reads or writes them.
    pub(crate) unsafe fn write_object(
        &self,
        loc: ValidLoc,
        key: &[u8],
        value: &[u8],
        hdr: &Header,
        kv_crc: u32,
    ) {
        debug_assert!(
            (loc.0 - 1) % self.geo.seg_bytes + object_bytes(key.len(), value.len())
                <= self.geo.seg_bytes
        );
        debug_assert_eq!(kv_crc, obj_crc_kv(key, value));
        let p = self.obj(loc);
        let hb = hdr.encode_wide();
        self.obj_state(loc).store(
            obj_state_word(obj_crc_finish(kv_crc, &hb)),
            Ordering::Relaxed,
        );
        // SAFETY: the bytes lie in one segment of the log mapping and only
        // this thread accesses them (this function's contract); header,
        // key and value follow each other without overlapping the
        // caller's slices (which are not log memory).
        unsafe {
            std::ptr::copy_nonoverlapping(hb.as_ptr(), p.add(8), HEADER_BYTES);
            let k = p.add(OBJ_PREFIX_BYTES as usize);
            std::ptr::copy_nonoverlapping(key.as_ptr(), k, key.len());
            std::ptr::copy_nonoverlapping(value.as_ptr(), k.add(key.len()), value.len());
        }
    }

    /// Copy the object `from` (`bytes` long) to `to` (compaction),
    /// uncommitted.
    ///
    /// # Safety
    /// `bytes` is `from`'s size; `to` is unpublished room of `bytes` bytes
    /// in the compactor's own open segment (another segment than
    /// `from`'s), which only the caller writes.
    pub(crate) unsafe fn copy_object(&self, from: &Obj, to: ValidLoc, bytes: u64) {
        debug_assert_eq!(
            bytes,
            object_bytes(from.key_len as usize, from.value_cap as usize)
        );
        // SAFETY: `from` is a checked object of `bytes` bytes inside its
        // segment; `to` has `bytes` bytes of room in another segment (the
        // contract), so the ranges are in the mapping and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.obj(from.loc), self.obj(to), bytes as usize) };
        // Uncommitted, with the checksum `from` was verified against: the
        // covered bytes are the same.
        self.obj_state(to)
            .store(obj_state_word(from.crc), Ordering::Release);
    }
}
