//! Recovery after a power cut from a fuzzy checkpoint (the design is in
//! `store/checkpoint.rs`; this is its redo half, in the manner of ARIES's
//! redo from the last checkpoint, with the log's checksummed objects as
//! the records).
//!
//! 1. Read the checkpoint file whole and check it (size, geometry,
//!    CRC-32C, records sorted). Read every segment's stamp (one small
//!    read each, read-ahead off, on many threads: the reads wait on the
//!    disk, not the CPU). Walk a segment iff the snapshot marked it (open
//!    at the snapshot, or closed after the checkpoint began) or its stamp
//!    is at or after the checkpoint's epoch; every other segment takes its
//!    table entry from the checkpoint (state, used, live bytes, earliest
//!    expiry) and is never read.
//! 2. Empty the index and load the records that name segments not walked,
//!    each into its recorded bucket (lock-free, on the recovery threads).
//!    A record naming a segment the snapshot had free, or a bucket with no
//!    room, is a doubt: fall back to the full pass.
//! 3. Walk the chosen segments as the full pass does (re-derive each one's
//!    state and end, verify every checksum, then index its live objects
//!    with the full pass's prefetching inserts), with one more rule: a
//!    copy of the key found in the index that names a segment not walked
//!    is matched by the key's full hash (from its record: its object is
//!    not read) and compared with the record's version; the walked copy
//!    wins a tie. Tombstones and stamps are collected on the way.
//! 4. Apply the tombstones: a key whose indexed copy has a version at or
//!    below a tombstone's is removed (a walked copy is also marked DEAD).
//!    Newest first, then tombstones, is the order a per-key model of puts
//!    and deletes with growing versions gives (`tests/checkpoint.rs`).
//! 5. Live bytes and earliest expiries of the walked segments from the
//!    entries naming them; the item count from the entries; the version
//!    floor from the checkpoint's bound and every version walked; the
//!    epoch counter above every stamp; compaction told that entries may
//!    name DEAD objects (expired ones it removed before the cut).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{RebuildTally, RecoveryReport, REBUILD_LOCK_STRIPES};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::store::{Inner, Loaded, Marker, CHECKPOINT_FILE, SECOND_BUCKET_BIT, SNAPSHOT_WALK_BIT};

/// Threads reading the segments' stamps (each read waits on the disk).
const STAMP_READ_THREADS: usize = 16;
/// Records a loader thread takes at a time.
const RECORDS_PER_GRAB: usize = 1 << 14;

/// What a checkpoint recovery came to.
pub(crate) enum Outcome {
    /// Recovered from the checkpoint.
    Done,
    /// No checkpoint file: the full pass runs.
    NoCheckpoint,
    /// A checkpoint that could not be used (why): the full pass runs.
    Fallback(String),
}

/// The checkpoint as recovery's index inserts see it.
pub(crate) struct View<'a> {
    pub(crate) ck: &'a Loaded,
    pub(crate) walked: &'a [bool],
}

/// What one walking thread collected.
#[derive(Default)]
struct CkTally {
    rebuild: RebuildTally,
    max_version: u64,
    max_stamp: u64,
}

impl Inner {
    /// Find `key`'s entry in its buckets, matching an entry that names a
    /// segment not walked by its record's full hash (its object is not
    /// read): (bucket, index, location, the record's version if it is the
    /// checkpoint's).
    pub(super) fn find_merged(
        &self,
        v: &View<'_>,
        key: &[u8],
        hash: u64,
        b0: usize,
        b1: usize,
        tag: u64,
    ) -> Option<(usize, usize, u64, Option<u64>)> {
        let bs = if b0 == b1 { [b0, usize::MAX] } else { [b0, b1] };
        for b in bs.into_iter().filter(|&b| b != usize::MAX) {
            for (i, e) in self.bucket(b).entries.iter().enumerate() {
                let e = e.load(Ordering::Acquire);
                if e == 0 || e >> LOC_BITS != tag {
                    continue;
                }
                let loc = e & LOC_MASK;
                if v.walked.get(self.seg_of(loc)).copied().unwrap_or(true) {
                    if let Some(h) = self.obj_header(loc) {
                        if h.key_len as usize == key.len() && self.obj_key(&h) == key {
                            return Some((b, i, loc, None));
                        }
                    }
                } else if let Some(r) = v.ck.record(e) {
                    if r[1] == hash {
                        return Some((b, i, loc, Some(r[2] & !SECOND_BUCKET_BIT)));
                    }
                }
            }
        }
        None
    }

    /// The epoch in segment `s`'s stamp, if it starts with an intact one.
    fn stamp_epoch(&self, s: usize) -> Option<u64> {
        let h = self.obj_header(s as u64 * self.geo.seg_bytes + 1)?;
        let st = self.obj_state(h.loc()).load(Ordering::Acquire);
        if st & (OBJ_COMMITTED | OBJ_DEAD) != OBJ_COMMITTED | OBJ_DEAD || !self.obj_intact(&h) {
            return None;
        }
        match self.marker(&h) {
            Some((Marker::Stamp, e)) => Some(e),
            _ => None,
        }
    }

    /// Every segment's stamp, read with the log's read-ahead off.
    fn read_stamps(&self) -> Vec<Option<u64>> {
        let n = self.geo.log_segments as usize;
        let advise = |how| {
            // SAFETY: the range is the log mapping (page-aligned start,
            // `log_bytes` long), which lives as long as `self`; advice
            // changes no memory.
            unsafe { libc::madvise(self.log_base(), self.log_bytes() as usize, how) };
        };
        advise(libc::MADV_RANDOM);
        let out: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        let next = AtomicUsize::new(0);
        let work = || loop {
            let s = next.fetch_add(1, Ordering::Relaxed);
            if s >= n {
                return;
            }
            // 0 = no stamp; a stamp's epoch is stored + 1.
            let e = self.stamp_epoch(s).map_or(0, |e| e.saturating_add(1));
            out[s].store(e, Ordering::Relaxed);
        };
        std::thread::scope(|sc| {
            for _ in 1..STAMP_READ_THREADS.min(n) {
                sc.spawn(work);
            }
            work();
        });
        advise(libc::MADV_NORMAL);
        out.iter()
            .map(|e| e.load(Ordering::Relaxed).checked_sub(1))
            .collect()
    }

    /// Recover from the checkpoint file if there is a usable one.
    pub(crate) fn try_checkpoint_recovery(&self, r: &mut RecoveryReport) -> Outcome {
        let path = self.dir.join(CHECKPOINT_FILE);
        if !path.exists() {
            return Outcome::NoCheckpoint;
        }
        let t = std::time::Instant::now();
        let read = self.read_checkpoint();
        log::debug!("checkpoint recovery: file read in {:?}", t.elapsed());
        let ck = match read {
            Ok(c) => c,
            Err(why) => {
                log::warn!("not using the checkpoint: {why}; walking the whole log");
                return Outcome::Fallback(why);
            }
        };
        match self.recover_from(&ck, r) {
            Ok(()) => Outcome::Done,
            Err(e) => {
                let why = e.to_string();
                log::warn!(
                    "recovery from the checkpoint of {} failed: {why}; walking the whole log",
                    self.dir.display()
                );
                Outcome::Fallback(why)
            }
        }
    }

    fn recover_from(&self, ck: &Loaded, r: &mut RecoveryReport) -> Result<()> {
        let n = self.geo.log_segments as usize;
        let t0 = std::time::Instant::now();
        let lap = |what: &str| log::debug!("checkpoint recovery: {what} after {:?}", t0.elapsed());
        let doubt = |what: String| Err(Error::Corrupt(format!("checkpoint: {what}")));
        // Heads and lease are re-derived (no process is attached).
        self.clear_heads_and_lease();
        // 1. Which segments to walk.
        let stamps = self.read_stamps();
        let walked: Vec<bool> = (0..n)
            .map(|s| {
                ck.segs[s][0] & SNAPSHOT_WALK_BIT != 0 || stamps[s].is_some_and(|e| e >= ck.epoch)
            })
            .collect();
        let max_stamp = stamps.iter().flatten().copied().max().unwrap_or(0);
        lap("stamps read");
        for (s, (&[st, used, live, min_exp], &walk)) in ck.segs.iter().zip(&walked).enumerate() {
            let e = self.seg(s);
            e.stamp.store(0, Ordering::Relaxed);
            if walk {
                continue; // re-derived by its walk
            }
            let (state, used, live, min_exp) = match st & 0xFF {
                SEG_CLOSED => (st & 0xFFFF, used.min(self.geo.seg_bytes), live, min_exp),
                SEG_COMPACTING => (SEG_CLOSED, used.min(self.geo.seg_bytes), live, min_exp),
                _ => (SEG_FREE, 0, 0, 0),
            };
            e.state.store(state, Ordering::Relaxed);
            e.used.store(used, Ordering::Relaxed);
            e.live.store(live, Ordering::Relaxed);
            e.min_expiry_ms.store(min_exp, Ordering::Relaxed);
        }
        // 2. The index: the records of segments not walked.
        self.clear_index();
        let loaded = AtomicU64::new(0);
        let bad = AtomicBool::new(false);
        let next = AtomicUsize::new(0);
        let load = || loop {
            let first = next.fetch_add(RECORDS_PER_GRAB, Ordering::Relaxed);
            if first >= ck.recs.len() || bad.load(Ordering::Relaxed) {
                return;
            }
            for rec in &ck.recs[first..(first + RECORDS_PER_GRAB).min(ck.recs.len())] {
                let s = self.seg_of(rec[0] & LOC_MASK);
                if walked.get(s).copied().unwrap_or(true) {
                    continue;
                }
                let (b0, b1, tag) = self.buckets_of(rec[1]);
                let b = if rec[2] & SECOND_BUCKET_BIT != 0 {
                    b1
                } else {
                    b0
                };
                let placed = rec[0] >> LOC_BITS == tag
                    && ck.segs[s][0] & 0xFF != SEG_FREE
                    && ck.segs[s][0] & 0xFF != SEG_RETIRED
                    && self.bucket(b).entries.iter().any(|x| {
                        x.compare_exchange(0, rec[0], Ordering::AcqRel, Ordering::Relaxed)
                            .is_ok()
                    });
                if !placed {
                    bad.store(true, Ordering::Relaxed);
                    return;
                }
                loaded.fetch_add(1, Ordering::Relaxed);
            }
        };
        std::thread::scope(|sc| {
            for _ in 1..self.recovery_threads() {
                sc.spawn(load);
            }
            load();
        });
        if bad.load(Ordering::Relaxed) {
            return doubt("a record names a free segment or does not fit its bucket".into());
        }
        r.checkpoint_keys = loaded.load(Ordering::Relaxed);
        lap("index cleared, records loaded");
        // 3. Walk the segments written since the checkpoint began.
        let view = View {
            ck,
            walked: &walked,
        };
        let stripes: Vec<Mutex<()>> = (0..REBUILD_LOCK_STRIPES).map(|_| Mutex::new(())).collect();
        let parts = self
            .par_segments(|s, acc: &mut CkTally| {
                if !walked[s] {
                    return;
                }
                // As the full pass: the segment ends after its last live
                // object or tombstone (stale bytes may follow).
                let (mut live, mut end, mut next, mut contiguous) = (false, 0, 0, true);
                let w = self.walk_intact(s, self.geo.seg_bytes, true, |h, size, intact| {
                    let os = self.obj_state(h.loc()).load(Ordering::Acquire);
                    let off = (h.loc().get() - 1) % self.geo.seg_bytes;
                    contiguous &= intact && off == next;
                    next = off + size;
                    if !intact || os & OBJ_COMMITTED == 0 {
                        return true;
                    }
                    let mut keep = os & OBJ_DEAD == 0;
                    match self.marker(h) {
                        Some((Marker::Stamp, e)) if !keep && off == 0 => {
                            acc.max_stamp = acc.max_stamp.max(e)
                        }
                        // A tombstone is walked by the rebuild, which
                        // applies it (not one past a resynchronization:
                        // it may be stale).
                        Some((Marker::Tombstone, _)) => keep |= contiguous,
                        _ => {}
                    }
                    acc.max_version = acc.max_version.max(h.version);
                    if keep {
                        live = true;
                        end = off + size;
                    }
                    true
                });
                let (state, used) = if live {
                    (SEG_CLOSED, end.min(w.end))
                } else {
                    (SEG_FREE, 0)
                };
                let e = self.seg(s);
                e.state.store(state, Ordering::Relaxed);
                e.used.store(used, Ordering::Relaxed);
                e.live.store(0, Ordering::Relaxed);
                e.min_expiry_ms.store(0, Ordering::Relaxed);
                self.rebuild_segment(s, w.resyncs != 0, &stripes, &mut acc.rebuild, Some(&view));
            })
            .ok_or_else(|| Error::Corrupt("recovery: a checkpoint walk thread panicked".into()))?;
        self.hdr().alloc_hint.store(0, Ordering::Relaxed);
        lap("segments walked");
        let (mut max_version, mut max_stamp) = (ck.bound, max_stamp);
        let mut rebuilds = Vec::new();
        for p in parts {
            max_version = max_version.max(p.max_version).max(p.rebuild.max_version);
            max_stamp = max_stamp.max(p.max_stamp);
            rebuilds.push(p.rebuild);
        }
        let mut tombstones = Vec::new();
        let damaged_objects = Self::fold_rebuild(r, rebuilds, &mut tombstones)?;
        for &t in &tombstones {
            if let Some(h) = self.obj_header(t) {
                max_version = max_version.max(h.version);
            }
        }
        // 4. Tombstones: a key whose copy is not newer is deleted.
        r.tombstones_applied = self.apply_tombstones(&tombstones, Some(&view));
        // 5. Accounting, counters, the floor and the epoch.
        for (s, &w) in walked.iter().enumerate() {
            let e = self.seg(s);
            if w && e.state.load(Ordering::Relaxed) == seg_state(SEG_CLOSED, TAG_QUARANTINED) {
                e.state.store(SEG_CLOSED, Ordering::Relaxed);
            }
        }
        lap("tombstones applied");
        let items = self.account_from_index(Some(&walked));
        lap("live bytes summed");
        for (i, c) in self.meta().counts.iter().enumerate() {
            c.items
                .store(if i == 0 { items } else { 0 }, Ordering::Relaxed);
        }
        if damaged_objects > 0 {
            self.hdr()
                .damaged_objects
                .fetch_add(damaged_objects, Ordering::Relaxed);
            log::error!(
                "nibblejmp store {}: recovery skipped {damaged_objects} damaged objects or regions in {} segments (checksum mismatch); their keys are not indexed",
                self.dir.display(),
                r.damaged_segments
            );
        }
        self.raise_version_floor(max_version);
        self.resume_checkpoints(ck.epoch, max_stamp);
        self.hdr().rebuilds.fetch_add(1, Ordering::Relaxed);
        r.damaged_objects = damaged_objects;
        r.rebuilt = true;
        r.checkpoint_epoch = ck.epoch;
        r.segments_walked = walked.iter().filter(|&&w| w).count() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;

    /// The merge rule of one key, as a pure function (tested against a model
    /// in `tests`): the copy kept, given the checkpoint's version (if it names
    /// the key in a segment not walked), the walked copies' versions and the
    /// walked tombstones' versions. `Some(None)`: the checkpoint's copy;
    /// `Some(Some(i))`: walked copy `i`; `None`: the key is absent.
    fn merge_rule(ckpt: Option<u64>, walked: &[u64], tombstones: &[u64]) -> Option<Option<usize>> {
        let best_walked = walked
            .iter()
            .enumerate()
            .max_by_key(|&(i, &v)| (v, Reverse(i)))
            .map(|(i, &v)| (v, i));
        let winner = match (ckpt, best_walked) {
            (Some(c), Some((w, i))) => {
                if w >= c {
                    (w, Some(i))
                } else {
                    (c, None)
                }
            }
            (Some(c), None) => (c, None),
            (None, Some((w, i))) => (w, Some(i)),
            (None, None) => return None,
        };
        if tombstones.iter().any(|&t| winner.0 <= t) {
            None
        } else {
            Some(winner.1)
        }
    }

    /// A per-key model: a random history of puts (versions growing) and
    /// deletes, all acknowledged (a flush after the last), a checkpoint
    /// taken after op `c`. What recovery can find: the checkpoint's copy
    /// (if its segment is not walked), the walked copies that look live on
    /// disk (the last put's; every copy a later put replaced, since the
    /// kill waits for a flush and may not have reached the disk; a
    /// compaction move of a live copy, same version), the tombstones of
    /// deletes after the checkpoint and, not yet compacted away, of some
    /// before it. Whatever the rule is given, the result must be the
    /// state after the last operation.
    #[test]
    fn merge_rule_gives_the_last_acknowledged_state() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..20_000 {
            let len = 1 + rnd(8) as usize;
            // (is_put, version): a put's own version; a delete's is the
            // deleted copy's (0: nothing to delete, no tombstone).
            let mut ops = Vec::new();
            let (mut cur, mut next_v) = (None::<u64>, 1u64);
            let mut states = vec![None];
            for _ in 0..len {
                if rnd(3) == 0 {
                    ops.push((false, cur.unwrap_or(0)));
                    cur = None;
                } else {
                    next_v += 1 + rnd(3);
                    ops.push((true, next_v));
                    cur = Some(next_v);
                }
                states.push(cur);
            }
            let c = rnd(len as u64 + 1) as usize;
            let at_ckpt = states[c];
            let ckpt_walked = rnd(4) == 0; // its segment was open at the snapshot
            let mut walked = Vec::new();
            let mut tombs = Vec::new();
            for (i, &(put, v)) in ops.iter().enumerate() {
                let after = i >= c;
                if put {
                    let last = states[len] == Some(v);
                    let replaced_by_put = ops[i + 1..].first().is_some_and(|o| o.0);
                    let in_walk = after || (ckpt_walked && at_ckpt == Some(v));
                    if in_walk && (last || (replaced_by_put && rnd(2) == 0)) {
                        walked.push(v);
                    }
                    if (last || at_ckpt == Some(v)) && states[len] == Some(v) && rnd(3) == 0 {
                        walked.push(v); // a compaction move after the checkpoint
                    }
                } else if v != 0 && (after || rnd(2) == 0) {
                    tombs.push(v);
                }
            }
            let ckpt = if ckpt_walked { None } else { at_ckpt };
            for i in (1..walked.len()).rev() {
                walked.swap(i, rnd(i as u64 + 1) as usize);
            }
            let got = merge_rule(ckpt, &walked, &tombs).map(|w| match w {
                None => ckpt.unwrap_or(0),
                Some(i) => walked[i],
            });
            assert_eq!(
                got, states[len],
                "ops {ops:?}, checkpoint after {c} ({ckpt:?}), walked {walked:?}, tombstones {tombs:?}"
            );
        }
    }
}
