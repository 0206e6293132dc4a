//! Recovery on attach (issue 8, "crash behaviour"; dissertation §12.1.3 on
//! restartable stores).
//!
//! Every attach reclaims the epoch slots of dead processes (resolving the
//! bucket updates they had in flight and releasing their head locks). When
//! the attaching process is alone and the store was not shut down cleanly
//! (the last process died, or the machine rebooted with the store on a
//! disk directory), or when asked, it also:
//!
//! 1. repairs segment states: a segment being compacted goes back to
//!    CLOSED; a compaction destination or a head segment no head links is
//!    closed; retired segments are freed (nobody is pinned); a dead lease
//!    holder is cleared;
//! 2. verifies the index: every entry names an intact, committed, live
//!    object inside its segment's `used` bytes whose hash tag matches;
//! 3. if the index fails verification (or a rebuild was asked for),
//!    rebuilds it from the log: every segment is scanned header by header
//!    and each committed, not-dead object is indexed, the newest version
//!    winning if a key appears twice (it cannot after the intents are
//!    resolved; the check is a second line of defence);
//! 4. recomputes the live-byte counters, each segment's earliest expiry
//!    and the item counter from the index.
//!
//! Objects keep their whole nibble header (version, flags, expiry) in the
//! log, so a rebuilt index serves the same items with the same metadata;
//! expired objects stay invisible and compaction reclaims them.
//!
//! The log is the truth the rebuild relies on because every transition an
//! object goes through is one atomic word in the object itself (COMMITTED,
//! DEAD), ordered with the index update under the bucket lock, and a dead
//! holder's in-flight update is resolved from its intent before the scan.

use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::layout::*;
use crate::proc_id;
use crate::store::Inner;

/// What recovery found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Recovery ran (unclean shutdown or a requested rebuild).
    pub ran: bool,
    /// The previous run did not shut down cleanly.
    pub unclean: bool,
    /// Segments whose state was repaired.
    pub segments_repaired: u64,
    /// Index entries that failed verification.
    pub bad_entries: u64,
    /// The index was rebuilt from the log.
    pub rebuilt: bool,
    /// Objects indexed by the rebuild.
    pub objects_indexed: u64,
    /// Committed, live objects in the log that the index does not name
    /// (before any rebuild).
    pub unindexed_objects: u64,
    /// Duplicate live copies of a key resolved by version in the rebuild.
    pub duplicates: u64,
    /// Segments whose scan stopped at a damaged object.
    pub damaged_segments: u64,
}

impl Inner {
    /// Run recovery; the caller holds the attach lock and no other live
    /// process is attached.
    pub(crate) fn recover(&self, unclean: bool, force_rebuild: bool) -> Result<RecoveryReport> {
        let mut r = RecoveryReport {
            ran: true,
            unclean,
            ..RecoveryReport::default()
        };
        if unclean {
            self.hdr().recoveries.fetch_add(1, Ordering::Relaxed);
        }
        // 1. Locks and segment states.
        for b in 0..self.geo.index_buckets as usize {
            let w = &self.bucket(b).word;
            let v = w.load(Ordering::Acquire);
            if lock_holder(v).is_some() {
                // Every holder is dead and its slot reclaimed: a lock word
                // still held has no intent left to resolve.
                w.store(unlock_word(v), Ordering::Release);
            }
        }
        for h in 0..self.geo.heads as usize {
            let l = &self.head(h).lock;
            let v = l.load(Ordering::Acquire);
            if lock_holder(v).is_some() {
                l.store(unlock_word(v), Ordering::Release);
            }
            self.repair_head(h);
        }
        for h in self.geo.heads as usize..MAX_HEADS {
            self.head(h).seg.store(0, Ordering::Relaxed);
        }
        let lease = &self.meta().lease;
        let lo = lease.owner.load(Ordering::Acquire);
        if lo != 0 && !proc_id::alive(lo) {
            lease.owner.store(0, Ordering::Release);
            lease.dest.store(0, Ordering::Release);
        }
        for s in 0..self.geo.log_segments as usize {
            let e = self.seg(s);
            let st = e.state.load(Ordering::Acquire);
            let linked = (0..self.geo.heads as usize)
                .any(|h| self.head(h).seg.load(Ordering::Acquire) == s as u64 + 1);
            let fixed = match st & 0xFF {
                SEG_COMPACTING => Some(SEG_CLOSED),
                SEG_OPEN if !linked => Some(SEG_CLOSED),
                SEG_RETIRED => Some(SEG_FREE),
                SEG_FREE | SEG_OPEN | SEG_CLOSED => None,
                _ => Some(SEG_CLOSED),
            };
            if let Some(ns) = fixed {
                e.state.store(ns, Ordering::Release);
                r.segments_repaired += 1;
            }
            if e.used.load(Ordering::Relaxed) > self.geo.seg_bytes {
                e.used.store(self.geo.seg_bytes, Ordering::Relaxed);
                r.segments_repaired += 1;
            }
        }
        // 2. Verify: every entry sound, and as many entries as the log has
        //    live objects (an index that lost entries is caught here).
        r.bad_entries = self.verify_index();
        let (live_in_log, damaged) = self.count_log_objects();
        r.damaged_segments = damaged;
        let entries = self.count_entries();
        r.unindexed_objects = live_in_log.saturating_sub(entries);
        // 3. Rebuild if needed.
        if r.bad_entries > 0 || r.unindexed_objects > 0 || force_rebuild {
            r.damaged_segments = 0;
            self.rebuild_index(&mut r)?;
            self.hdr().rebuilds.fetch_add(1, Ordering::Relaxed);
        }
        // 4. Live bytes.
        self.recompute_live();
        Ok(r)
    }

    fn entry_ok(&self, e: u64) -> bool {
        let loc = e & LOC_MASK;
        let Some(h) = self.obj_header(loc) else {
            return false;
        };
        let s = self.seg_of(loc);
        let st = self.seg(s).state.load(Ordering::Relaxed) & 0xFF;
        let end =
            (loc - 1) % self.geo.seg_bytes + object_bytes(h.key_len as usize, h.value_cap as usize);
        let os = self.obj_state(loc).load(Ordering::Acquire);
        (st == SEG_OPEN || st == SEG_CLOSED)
            && end <= self.seg(s).used.load(Ordering::Relaxed)
            && os & OBJ_COMMITTED != 0
            && os & OBJ_DEAD == 0
            && nibble::hash_key(self.obj_key(loc, &h)) >> LOC_BITS == e >> LOC_BITS
    }

    /// Entries that fail verification.
    pub(crate) fn verify_index(&self) -> u64 {
        let mut bad = 0;
        for b in 0..self.geo.index_buckets as usize {
            for e in &self.bucket(b).entries {
                let e = e.load(Ordering::Acquire);
                if e != 0 && !self.entry_ok(e) {
                    bad += 1;
                }
            }
        }
        bad
    }

    /// Index entries in use.
    fn count_entries(&self) -> u64 {
        (0..self.geo.index_buckets as usize)
            .map(|b| {
                self.bucket(b)
                    .entries
                    .iter()
                    .filter(|e| e.load(Ordering::Relaxed) != 0)
                    .count() as u64
            })
            .sum()
    }

    /// Walk every segment in use: calls `f(loc, header)` for each committed,
    /// not-dead object; returns the number of segments whose walk stopped
    /// at a damaged object.
    fn walk_log(
        &self,
        mut f: impl FnMut(u64, &nibble::object::Header) -> Result<()>,
    ) -> Result<u64> {
        let mut damaged = 0;
        for s in 0..self.geo.log_segments as usize {
            let e = self.seg(s);
            let st = e.state.load(Ordering::Acquire) & 0xFF;
            if st != SEG_OPEN && st != SEG_CLOSED {
                continue;
            }
            let used = e.used.load(Ordering::Acquire).min(self.geo.seg_bytes);
            let base = s as u64 * self.geo.seg_bytes;
            let mut off = 0;
            while off + OBJ_PREFIX_BYTES <= used {
                let loc = base + off + 1;
                let Some(h) = self.obj_header(loc) else {
                    damaged += 1;
                    break;
                };
                let size = object_bytes(h.key_len as usize, h.value_cap as usize);
                if off + size > used {
                    damaged += 1;
                    break;
                }
                off += size;
                let os = self.obj_state(loc).load(Ordering::Acquire);
                if os & OBJ_COMMITTED == 0 || os & OBJ_DEAD != 0 {
                    continue;
                }
                f(loc, &h)?;
            }
        }
        Ok(damaged)
    }

    /// (committed live objects in the log, damaged segments).
    fn count_log_objects(&self) -> (u64, u64) {
        let mut n = 0;
        let damaged = self
            .walk_log(|_, _| {
                n += 1;
                Ok(())
            })
            .unwrap_or(0);
        (n, damaged)
    }

    fn rebuild_index(&self, r: &mut RecoveryReport) -> Result<()> {
        r.rebuilt = true;
        for b in 0..self.geo.index_buckets as usize {
            let bk = self.bucket(b);
            for e in &bk.entries {
                e.store(0, Ordering::Relaxed);
            }
            let w = bk.word.load(Ordering::Relaxed);
            bk.word.store(unlock_word(w & !0xFF), Ordering::Release);
        }
        r.damaged_segments += self.walk_log(|loc, h| {
            let mut rr = RecoveryReport::default();
            self.rebuild_insert(loc, h, &mut rr)?;
            r.objects_indexed += rr.objects_indexed;
            r.duplicates += rr.duplicates;
            Ok(())
        })?;
        Ok(())
    }

    fn rebuild_insert(
        &self,
        loc: u64,
        h: &nibble::object::Header,
        r: &mut RecoveryReport,
    ) -> Result<()> {
        let key = self.obj_key(loc, h);
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
        let entry = (tag << LOC_BITS) | loc;
        if let Some((b, i, other)) = self.find(key, b0, b1, tag) {
            r.duplicates += 1;
            let ov = self.obj_header(other).map(|oh| oh.version).unwrap_or(0);
            if h.version > ov {
                self.bucket(b).entries[i].store(entry, Ordering::Release);
                self.mark(other, OBJ_DEAD);
            } else {
                self.mark(loc, OBJ_DEAD);
            }
            return Ok(());
        }
        match self.empty_entry(b0, b1) {
            Some((b, i)) => {
                self.bucket(b).entries[i].store(entry, Ordering::Release);
                r.objects_indexed += 1;
                Ok(())
            }
            None => Err(Error::Corrupt(format!(
                "index rebuild: both buckets of a key are full at object {loc:#x}"
            ))),
        }
    }

    /// Live bytes and earliest expiry per segment, and the item counter,
    /// from the index.
    fn recompute_live(&self) {
        for s in 0..self.geo.log_segments as usize {
            self.seg(s).live.store(0, Ordering::Relaxed);
            self.seg(s).min_expiry_ms.store(0, Ordering::Relaxed);
        }
        let mut items = 0u64;
        for b in 0..self.geo.index_buckets as usize {
            for e in &self.bucket(b).entries {
                let e = e.load(Ordering::Acquire);
                if e == 0 {
                    continue;
                }
                let loc = e & LOC_MASK;
                items += 1;
                if let Some(h) = self.obj_header(loc) {
                    self.add_live(loc, object_bytes(h.key_len as usize, h.value_cap as usize));
                    self.note_expiry(loc, h.expiry_ms);
                }
            }
        }
        for (i, c) in self.meta().counts.iter().enumerate() {
            c.items
                .store(if i == 0 { items } else { 0 }, Ordering::Relaxed);
        }
    }
}
