//! The operations: put, get, delete, set_expiry and scan over the index
//! and the log (the crate essay's object life cycle; Nibble's API,
//! dissertation §4.1).
//!
//! A put appends first, outside any bucket lock, then records its intent,
//! locks the key's two buckets (lower first), decides its condition,
//! version and kept expiry, swaps the entry (the linearization point),
//! commits the new object and kills the old one. A get takes no lock at
//! all: an entry is one atomic word and the object it names is immutable
//! but for its state and expiry words, which are read atomically. Every
//! operation holds an epoch slot ([`Op`]) from before it reads the index
//! until after its last access to the log.

use super::*;
use nibble::check_condition;

impl Inner {
    /// Find the entry of `key` in its buckets: (bucket, index, loc).
    pub(crate) fn find(
        &self,
        key: &[u8],
        b0: usize,
        b1: usize,
        tag: u64,
    ) -> Option<(usize, usize, u64)> {
        let bs = if b0 == b1 { [b0, usize::MAX] } else { [b0, b1] };
        for b in bs {
            if b == usize::MAX {
                continue;
            }
            for (i, e) in self.bucket(b).entries.iter().enumerate() {
                let e = e.load(Ordering::Acquire);
                if e == 0 || e >> LOC_BITS != tag {
                    continue;
                }
                let loc = e & LOC_MASK;
                if let Some(h) = self.obj_header(loc) {
                    if h.key_len as usize == key.len() && self.obj_key(&h) == key {
                        return Some((b, i, loc));
                    }
                }
            }
        }
        None
    }

    /// An empty entry in the emptier of the two buckets (home on a tie).
    pub(crate) fn empty_entry(&self, b0: usize, b1: usize) -> Option<(usize, usize)> {
        let empties = |b: usize| {
            self.bucket(b)
                .entries
                .iter()
                .filter(|e| e.load(Ordering::Relaxed) == 0)
                .count()
        };
        let b = if b0 != b1 && empties(b1) > empties(b0) {
            b1
        } else {
            b0
        };
        self.bucket(b)
            .entries
            .iter()
            .position(|e| e.load(Ordering::Relaxed) == 0)
            .map(|i| (b, i))
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if key.len() > nibble::MAX_KEY_BYTES {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max: nibble::MAX_KEY_BYTES,
            });
        }
        Ok(())
    }

    /// The general write (see [`SharedStore::put_with`]); returns the new
    /// version.
    pub(crate) fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64> {
        let op = self.begin();
        self.write(&op, key, value, opts)
    }

    /// Append `key` → `value` and swap it into the index under the key's
    /// bucket locks, as the crate essay's `put` timeline. The condition is
    /// decided under the locks, and so are the version (above every earlier
    /// one of the key) and a kept expiry; the new object's header is
    /// rewritten before the index store if they changed: the object is not
    /// published yet (uncommitted, in a segment no compactor may pick while
    /// we are pinned), so nobody reads it.
    pub(crate) fn write(
        &self,
        op: &Op<'_>,
        key: &[u8],
        value: &[u8],
        o: PutOptions,
    ) -> Result<u64> {
        self.check_key(key)?;
        let size = object_bytes(key.len(), value.len());
        if size > self.geo.seg_bytes || value.len() > u32::MAX as usize {
            return Err(Error::ValueTooLarge {
                len: key.len() + value.len(),
                max: (self.geo.seg_bytes - OBJ_PREFIX_BYTES) as usize,
            });
        }
        let hash = nibble::hash_key(key);
        let (b0, b1, tag) = self.buckets_of(hash);
        let (cond, flags, version) = (o.condition, o.flags, self.new_version());
        // `Keep` is decided under the bucket locks, below.
        let expiry = o.expiry.expiry_ms(None);
        if cond != Condition::Always {
            // Cheap optimistic check first, so a failing condition does
            // not leave a dead object in the log.
            let cur = self.find_live(key, b0, b1, tag);
            check_condition(cond, cur.as_ref().map(Obj::header))?;
        }
        let mut hdr = Header {
            key_len: key.len() as u32,
            value_len: value.len() as u32,
            value_cap: value.len() as u32,
            flags,
            version,
            expiry_ms: expiry,
            // The wide layout has every field.
            expiry_slot: true,
            flags_slot: true,
            slack_slot: true,
            // The shared store never evicts, so it keeps no pinned mark.
            pinned: false,
        };
        let kv_crc = obj_crc_kv(key, value);
        let loc = self.append_waiting(op, key, value, &hdr, kv_crc)?;
        let new = loc;
        let loc = new.get();
        self.set_intent(op, INTENT_PUT, b0, b1, 0, loc);
        point(CrashPoint::PutAppended);
        if let Err(e) = self.lock_pair(op, b0, b1) {
            self.mark(loc, OBJ_DEAD);
            return Err(e);
        }
        let found = self.find(key, b0, b1, tag);
        let old_hdr = found.and_then(|(_, _, old)| self.obj_header(old));
        let live_old = old_hdr.filter(|h| !h.expired());
        if let Err(e) = check_condition(cond, live_old.as_ref().map(Obj::header)) {
            self.mark(loc, OBJ_DEAD);
            self.unlock_pair(b0, b1);
            return Err(e.into());
        }
        if let Some(oh) = old_hdr {
            hdr.version = hdr.version.max(oh.version + 1) & nibble::object::FIELD48_MASK;
        }
        if o.expiry == Expiry::Keep {
            hdr.expiry_ms = live_old.map_or(0, |h| h.expiry_ms);
        }
        if hdr.version != version || hdr.expiry_ms != expiry {
            self.rewrite_header(new, &hdr, kv_crc);
        }
        let entry = (tag << LOC_BITS) | loc;
        let old = match found {
            Some((b, i, old)) => {
                self.set_intent_old(op, old);
                self.bucket(b).entries[i].store(entry, Ordering::Release);
                Some(old)
            }
            None => match self.empty_entry(b0, b1) {
                Some((b, i)) => {
                    self.bucket(b).entries[i].store(entry, Ordering::Release);
                    None
                }
                None => {
                    self.mark(loc, OBJ_DEAD);
                    self.unlock_pair(b0, b1);
                    return Err(Error::IndexFull);
                }
            },
        };
        point(CrashPoint::PutEntryStored);
        self.mark(loc, OBJ_COMMITTED);
        point(CrashPoint::PutCommitted);
        self.add_live(loc, size);
        self.note_expiry(loc, hdr.expiry_ms);
        match old {
            Some(old) => {
                self.kill_replaced(op, old);
                if let Some(oh) = old_hdr {
                    self.sub_live(
                        old,
                        object_bytes(oh.key_len as usize, oh.value_cap as usize),
                    );
                }
            }
            None => self.count_items(op, 1),
        }
        self.unlock_pair(b0, b1);
        Ok(hdr.version)
    }

    /// Append an object (see `segments.rs`), waiting for compaction while
    /// the log is full, up to `Options::oom_wait` without progress.
    pub(crate) fn append_waiting(
        &self,
        op: &Op<'_>,
        key: &[u8],
        value: &[u8],
        hdr: &Header,
        kv_crc: u32,
    ) -> Result<ValidLoc> {
        let deadline = Instant::now() + self.opts.oom_wait;
        loop {
            match self.append(op, key, value, hdr, kv_crc)? {
                Append::Done(loc) => return Ok(loc),
                Append::NoSpace => {
                    // Holding our pin would keep retired segments from
                    // being reused: leave the epoch while waiting.
                    op.unpin();
                    let progress = self.make_space();
                    // Out of memory when compaction made no room in
                    // time, or when others kept taking the room it made
                    // for ten times as long.
                    let now = Instant::now();
                    if (!progress && now >= deadline) || now >= deadline + self.opts.oom_wait * 10 {
                        return Err(Error::OutOfMemory {
                            live_bytes: self.live_bytes(),
                            capacity_bytes: self.geo.capacity_bytes,
                        });
                    }
                    if !progress {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    op.repin();
                }
            }
        }
    }

    /// Rewrite the header of an unpublished object this operation appended,
    /// and its checksum (`kv_crc`: that of its key and value). (It is not
    /// published, so nobody reads it; the stores are atomic anyway, as
    /// every access to header words after the append. Key and value
    /// lengths are unchanged, so scans that size it agree. A death between
    /// the header and the checksum leaves an uncommitted object with a bad
    /// checksum, which intent resolution kills and scans skip.)
    pub(crate) fn rewrite_header(&self, loc: ValidLoc, hdr: &Header, kv_crc: u32) {
        let hb = hdr.encode_wide();
        let crc = obj_crc_finish(kv_crc, &hb);
        for (i, chunk) in hb.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            self.obj_word(loc, 1 + i)
                .store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
        let _ = self
            .obj_state(loc)
            .fetch_update(Ordering::Release, Ordering::Relaxed, |st| {
                Some((st & !OBJ_CRC_MASK) | (u64::from(crc) << OBJ_CRC_SHIFT))
            });
    }

    /// Record that the object at `loc` expires at `expiry_ms` (0 = never)
    /// in its segment's earliest expiry.
    pub(crate) fn note_expiry(&self, loc: u64, expiry_ms: u64) {
        if expiry_ms != 0 {
            let _ = self.seg(self.seg_of(loc)).min_expiry_ms.fetch_update(
                Ordering::AcqRel,
                Ordering::Relaxed,
                |m| (m == 0 || expiry_ms < m).then_some(expiry_ms),
            );
        }
    }

    /// Add `delta` (±1) to the item counter stripe of `op`'s slot.
    pub(crate) fn count_items(&self, op: &Op<'_>, delta: i64) {
        self.meta().counts[op.slot % COUNT_STRIPES]
            .items
            .fetch_add(delta as u64, Ordering::Relaxed);
    }

    /// Keys in the index (the sum of the counter stripes).
    pub(crate) fn len(&self) -> u64 {
        let sum = self
            .meta()
            .counts
            .iter()
            .fold(0u64, |a, c| a.wrapping_add(c.items.load(Ordering::Relaxed)));
        (sum as i64).max(0) as u64
    }

    /// The key's object and header if present and not expired; the caller
    /// is pinned.
    fn find_live(&self, key: &[u8], b0: usize, b1: usize, tag: u64) -> Option<Obj> {
        let (_, _, loc) = self.find(key, b0, b1, tag)?;
        let o = self.obj_header(loc)?;
        (!o.expired()).then_some(o)
    }

    pub(crate) fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<ItemMeta>> {
        buf.clear();
        self.check_key(key)?;
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
        let _op = self.begin();
        // No seqlock validation is needed: an entry is one word, read
        // atomically; the object it names has an immutable key and value
        // (header words are loaded atomically) and stays mapped while we
        // are pinned (see the crate essay). Its checksum is verified before
        // a byte is returned (`integrity.rs`).
        Ok(self
            .find_checked(key, b0, b1, tag)?
            .filter(|o| !o.expired())
            .map(|o| {
                buf.extend_from_slice(self.obj_value(&o));
                ItemMeta::of(&o)
            }))
    }

    pub(crate) fn meta_of(&self, key: &[u8]) -> Result<Option<ItemMeta>> {
        self.check_key(key)?;
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
        let _op = self.begin();
        Ok(self
            .find_checked(key, b0, b1, tag)?
            .filter(|o| !o.expired())
            .map(|o| ItemMeta::of(&o)))
    }

    /// Delete `key` if `cond` holds (an expired item is removed either way
    /// and reported as `KeyNotFound`).
    pub(crate) fn delete_if(&self, key: &[u8], cond: Condition) -> Result<()> {
        self.check_key(key)?;
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
        let op = self.begin();
        // With checkpoints on, the delete leaves a tombstone in the log
        // (`store/checkpoint.rs`): appended now, made to count under the
        // locks.
        let tomb = self.append_tombstone(&op, key)?;
        self.set_intent(&op, INTENT_DEL, b0, b1, 0, 0);
        if let Err(e) = self.lock_pair(&op, b0, b1) {
            self.finish_tombstone(tomb, key, None);
            return Err(e);
        }
        let Some((b, i, old)) = self.find(key, b0, b1, tag) else {
            self.finish_tombstone(tomb, key, None);
            self.unlock_pair(b0, b1);
            return Err(Error::KeyNotFound);
        };
        let oh = self.obj_header(old);
        let live = oh.filter(|h| !h.expired());
        if live.is_some() {
            if let Err(e) = check_condition(cond, live.as_ref().map(Obj::header)) {
                self.finish_tombstone(tomb, key, None);
                self.unlock_pair(b0, b1);
                return Err(e.into());
            }
        }
        self.set_intent_old(&op, old);
        self.bucket(b).entries[i].store(0, Ordering::Release);
        point(CrashPoint::DeleteEntryCleared);
        self.finish_tombstone(tomb, key, Some(oh.map_or(0, |h| h.version)));
        if tomb.is_some() {
            // The kill waits for the flush that makes the tombstone
            // durable (`store/durability.rs` rule 1): a cut that keeps the
            // kill keeps the tombstone, which removes every older copy
            // whose own kill is still pending.
            self.kill_replaced(&op, old);
        } else {
            self.mark(old, OBJ_DEAD);
        }
        if let Some(oh) = oh {
            self.sub_live(
                old,
                object_bytes(oh.key_len as usize, oh.value_cap as usize),
            );
        }
        self.count_items(&op, -1);
        self.unlock_pair(b0, b1);
        if live.is_some() {
            Ok(())
        } else {
            Err(Error::KeyNotFound)
        }
    }

    pub(crate) fn delete(&self, key: &[u8]) -> Result<bool> {
        match self.delete_if(key, Condition::Always) {
            Ok(()) => Ok(true),
            Err(Error::KeyNotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Set or clear the expiry of `key` in place: one atomic store of the
    /// header word that holds the expiry (its low 16 bits, the top of the
    /// version, are kept), under the key's bucket locks, so it cannot race
    /// a put's "keep the expiry" or a compaction move. Readers load header
    /// words atomically and see the old or the new expiry. The version is
    /// kept, as `nibble::Store` keeps it; no space is needed, so this works
    /// in a full store too.
    pub(crate) fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> Result<bool> {
        self.check_key(key)?;
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
        let t = expiry_ms.map_or(0, |t| t.clamp(1, nibble::object::FIELD48_MASK));
        let op = self.begin();
        // No intent to resolve (one atomic store), but the buckets are
        // named so that a reclaimer of a dead holder finds its locks.
        self.set_intent(&op, INTENT_NONE, b0, b1, 0, 0);
        self.lock_pair(&op, b0, b1)?;
        let done = match self.find_live(key, b0, b1, tag) {
            Some(o) => {
                let loc = o.loc().get();
                let w = self.obj_word(o.loc(), EXPIRY_WORD);
                let old = w.load(Ordering::Relaxed);
                w.store(
                    (old & !EXPIRY_WORD_MASK) | (t << EXPIRY_SHIFT),
                    Ordering::Release,
                );
                self.note_expiry(loc, t);
                point(CrashPoint::ExpiryStored);
                true
            }
            None => false,
        };
        self.unlock_pair(b0, b1);
        Ok(done)
    }

    /// One step of a cursor over the keys (Redis SCAN: the cursor is the
    /// next bucket; a key present for the whole iteration is returned,
    /// exactly once, since an entry never moves between buckets while the
    /// store is attached). Visits buckets until `count` keys are found or
    /// `16 × count` buckets were read, so a sparse index costs bounded work
    /// per step.
    pub(crate) fn scan(
        &self,
        cursor: u64,
        count: usize,
        with_expired: bool,
    ) -> Result<(u64, Vec<Vec<u8>>)> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let n = self.geo.index_buckets;
        let count = count.max(1);
        let max_buckets = (count as u64).saturating_mul(SCAN_BUCKETS_PER_KEY);
        let mut keys = Vec::new();
        let mut b = cursor;
        let now = nibble::object::now_ms();
        let _op = self.begin();
        let mut visited = 0;
        while b < n && keys.len() < count && visited < max_buckets {
            for e in &self.bucket(b as usize).entries {
                let e = e.load(Ordering::Acquire);
                if e == 0 {
                    continue;
                }
                let loc = e & LOC_MASK;
                if let Some(h) = self.obj_header(loc) {
                    if !self.obj_intact(&h) {
                        self.note_damaged(loc, "a scan");
                    } else if with_expired || !h.expired_at(now) {
                        keys.push(self.obj_key(&h).to_vec());
                    }
                } else {
                    self.note_damaged(loc, "a scan");
                }
            }
            b += 1;
            visited += 1;
        }
        Ok((if b >= n { 0 } else { b }, keys))
    }

    pub(crate) fn live_bytes(&self) -> u64 {
        (0..self.geo.log_segments as usize)
            .map(|s| self.seg(s).live.load(Ordering::Relaxed))
            .sum()
    }

    /// Free space for a writer: retired segments whose epoch passed, then a
    /// compaction pass if this process can hold the lease. True if a
    /// client-usable segment is free now.
    pub(crate) fn make_space(&self) -> bool {
        self.reclaim_retired();
        if self.count_free() > self.geo.reserve_segments {
            return true;
        }
        self.compact_inline();
        self.count_free() > self.geo.reserve_segments
    }

    /// Key iteration: every key, in bucket order (a snapshot per bucket;
    /// keys written concurrently may or may not appear).
    pub(crate) fn for_each_key(&self, mut f: impl FnMut(&[u8], &Header)) {
        const BUCKETS_PER_PIN: usize = 256;
        let n = self.geo.index_buckets as usize;
        let mut b = 0;
        while b < n {
            let _op = self.begin();
            for bb in b..(b + BUCKETS_PER_PIN).min(n) {
                for e in &self.bucket(bb).entries {
                    let e = e.load(Ordering::Acquire);
                    if e == 0 {
                        continue;
                    }
                    let loc = e & LOC_MASK;
                    match self.obj_header(loc) {
                        Some(h) if self.obj_intact(&h) => f(self.obj_key(&h), &h),
                        _ => self.note_damaged(loc, "key iteration"),
                    }
                }
            }
            b += BUCKETS_PER_PIN;
        }
    }
}
