//! Compaction under a cross-process lease (dissertation §4.4 and ch. 6).
//!
//! One process at a time compacts: it holds the *lease*, a word in the
//! meta segment naming it (pid + start time). A process takes the lease
//! when it is free or when its holder is dead (checked through `/proc`);
//! a takeover first undoes what the dead holder left half done:
//!
//! ```text
//!  holder A: lease=A ─ victim CLOSED→COMPACTING ─ move, move, ✗ SIGKILL
//!  process B (its compaction thread, or a writer out of space):
//!            lease A dead → CAS A→B ─ COMPACTING→CLOSED, A's dest OPEN→CLOSED ─ passes
//! ```
//!
//! A dead holder's half-finished *move* needs nothing here: it held the
//! key's bucket locks with an intent in its epoch slot, and whoever next
//! needs those buckets (or reclaims the slot) finishes or rolls it back.
//! Objects already moved are live in the destination and dead in the
//! victim, so the victim is simply compacted again later.
//!
//! A pass (as Nibble's workers, with Nibble's cost-benefit score):
//!
//! 1. Segments retired earlier become free once every epoch slot has
//!    moved past their stamp.
//! 2. If free segments are below the trigger (or the pass is forced),
//!    pick the CLOSED segment with the best `(1-u)·age/(1+u)` (u = live
//!    bytes / segment bytes) whose close stamp is older than every
//!    operation in flight (so no append into it is still unpublished).
//! 3. For each object that is committed, not dead, and still named by the
//!    index: lock its buckets, copy it into the compactor's open segment,
//!    swap the index entry, commit the copy, mark the original dead. An
//!    object whose expiry has passed is not copied: its entry is cleared
//!    (a delete). Segments whose earliest expiry (`min_expiry_ms`) has
//!    passed are picked first, so expired data is reclaimed even in
//!    segments whose live-byte count looks full.
//! 4. Retire the victim with a TSC stamp.
//!
//! Segments are a fixed size here (not sized to their live data as in
//! Nibble): a destination is filled by several victims in turn.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::layout::*;
use crate::proc_id;
use crate::store::{Inner, Marker, Obj, Op, ValidLoc};
use crate::testing::{point, CrashPoint};

/// How often a process that does not hold the lease checks its holder.
const LEASE_CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// Sleep of the compaction thread between rounds.
const IDLE_SLEEP: Duration = Duration::from_millis(5);
/// Segments at or above this live fraction (permille) are not worth moving.
const MAX_VICTIM_LIVE_PERMILLE: u64 = 980;
/// Passes one round of the compaction thread runs at most.
const PASSES_PER_ROUND: u32 = 8;

/// Result of one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Enough free segments: nothing to do.
    Idle,
    /// One segment compacted.
    Compacted,
    /// No candidate worth compacting.
    Futile,
    /// No free segment for the destination.
    NoSpace,
    /// A lock wait timed out.
    Busy,
    /// The victim had a damaged region: its live objects were moved, it
    /// stays CLOSED and tagged quarantined (never picked again until an
    /// index rebuild); other victims may be compacted.
    Quarantined,
}

impl Inner {
    /// Take the lease if it is ours, free, or held by a dead process.
    pub(crate) fn try_acquire_lease(&self) -> bool {
        let lease = &self.meta().lease;
        let o = lease.owner.load(Ordering::Acquire);
        if o == self.me {
            return true;
        }
        let takeover = o != 0;
        if takeover && proc_id::alive(o) {
            return false;
        }
        if lease
            .owner
            .compare_exchange(o, self.me, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        if takeover {
            self.hdr().lease_takeovers.fetch_add(1, Ordering::Relaxed);
        }
        // Undo what a previous holder left (a clean release leaves nothing).
        let mut st = self.compactor.lock().unwrap_or_else(|p| p.into_inner());
        st.dest = None;
        for s in 0..self.geo.log_segments as usize {
            let e = self.seg(s);
            let state = e.state.load(Ordering::Acquire);
            if state == SEG_COMPACTING {
                e.state.store(SEG_CLOSED, Ordering::Release);
            } else if state == seg_state(SEG_OPEN, TAG_COMPACTOR) {
                self.close_segment(s);
            }
        }
        lease.dest.store(0, Ordering::Release);
        lease
            .heartbeat_ms
            .store(nibble::object::now_ms(), Ordering::Relaxed);
        true
    }

    /// Give the lease back (closing our destination segment).
    pub(crate) fn release_lease(&self) {
        let lease = &self.meta().lease;
        if lease.owner.load(Ordering::Acquire) != self.me {
            return;
        }
        let mut st = self.compactor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = st.dest.take() {
            self.close_segment(d);
        }
        lease.dest.store(0, Ordering::Release);
        let _ = lease
            .owner
            .compare_exchange(self.me, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Free retired segments whose epoch has passed.
    pub(crate) fn reclaim_retired(&self) -> u64 {
        let any = (0..self.geo.log_segments as usize)
            .any(|s| self.seg(s).state.load(Ordering::Relaxed) == SEG_RETIRED);
        if !any {
            return 0;
        }
        let epoch = self.min_epoch();
        // Durability's reuse rule: no reuse before a flush that began after
        // the retirement (see `store/durability.rs`); flush now if that is
        // all that holds a segment back.
        let mut reuse = self.reuse_stamp();
        if reuse < epoch
            && (0..self.geo.log_segments as usize).any(|s| {
                let e = self.seg(s);
                e.state.load(Ordering::Acquire) == SEG_RETIRED && {
                    let st = e.stamp.load(Ordering::Acquire);
                    st < epoch && st >= reuse
                }
            })
        {
            self.flush_for_reuse();
            reuse = self.reuse_stamp();
        }
        let min = epoch.min(reuse);
        let mut n = 0;
        for s in 0..self.geo.log_segments as usize {
            let e = self.seg(s);
            if e.state.load(Ordering::Acquire) == SEG_RETIRED
                && e.stamp.load(Ordering::Acquire) < min
                && e.state
                    .compare_exchange(SEG_RETIRED, SEG_FREE, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                n += 1;
            }
        }
        n
    }

    fn needs_compaction(&self) -> bool {
        self.count_free() * 1000
            < self.geo.log_segments * self.opts.compaction_trigger_permille as u64
    }

    /// The best victim by cost-benefit, if any is worth it. A segment
    /// whose earliest expiry has passed is a candidate however live it
    /// looks (its live bytes count expired objects), ahead of the others.
    fn pick_victim(&self) -> Option<usize> {
        let min = self.min_epoch();
        let now = topology::rdtsc();
        let now_ms = nibble::object::now_ms();
        let mut best: Option<(f64, usize)> = None;
        for s in 0..self.geo.log_segments as usize {
            let e = self.seg(s);
            if e.state.load(Ordering::Acquire) != SEG_CLOSED {
                continue;
            }
            let stamp = e.stamp.load(Ordering::Acquire);
            if stamp >= min {
                continue; // an append into it may still be unpublished
            }
            let live = e.live.load(Ordering::Relaxed).min(self.geo.seg_bytes);
            let exp = e.min_expiry_ms.load(Ordering::Relaxed);
            let expired = exp != 0 && exp <= now_ms;
            if !expired && live * 1000 >= self.geo.seg_bytes * MAX_VICTIM_LIVE_PERMILLE {
                continue;
            }
            let u = live as f64 / self.geo.seg_bytes as f64;
            let age = now.saturating_sub(stamp) as f64 + 1.0;
            let score = if expired {
                f64::INFINITY
            } else {
                (1.0 - u) * age / (1.0 + u)
            };
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, s));
            }
        }
        best.map(|(_, s)| s)
    }

    /// One pass; the caller holds the lease and the process's compactor
    /// mutex (`st`).
    fn pass(&self, dest: &mut Option<usize>, force: bool) -> Pass {
        self.reclaim_retired();
        if !force && !self.needs_compaction() {
            return Pass::Idle;
        }
        let Some(v) = self.pick_victim() else {
            return Pass::Futile;
        };
        let ve = self.seg(v);
        if ve
            .state
            .compare_exchange(
                SEG_CLOSED,
                SEG_COMPACTING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return Pass::Futile;
        }
        let used = ve.used.load(Ordering::Acquire).min(self.geo.seg_bytes);
        // The walk verifies every object's checksum and gets past damage
        // (`store/integrity.rs`): a damaged object is dropped from the
        // index, not moved.
        let mut failed = None;
        let mut unlocated = 0u64;
        let w = self.walk_intact(v, used, false, |h, size, intact| {
            let st = self.obj_state(h.loc()).load(Ordering::Acquire);
            if st & OBJ_COMMITTED == 0 || st & OBJ_DEAD != 0 {
                if !intact || st & OBJ_COMMITTED == 0 {
                    return true;
                }
                return match self.pass_dead(h, size, dest) {
                    Ok(()) => true,
                    Err(p) => {
                        failed = Some(p);
                        false
                    }
                };
            }
            let r = if !intact {
                self.note_damaged(h.loc().get(), "compaction");
                self.drop_object(h, false)
                    .map(|found| unlocated += u64::from(!found))
            } else if h.expired() {
                self.drop_object(h, true).and_then(|d| {
                    if d {
                        Ok(())
                    } else {
                        self.move_object(h, size, dest)
                    }
                })
            } else {
                self.move_object(h, size, dest)
            };
            match r {
                Ok(()) => true,
                Err(p) => {
                    failed = Some(p);
                    false
                }
            }
        });
        if let Some(p) = failed {
            ve.state.store(SEG_CLOSED, Ordering::Release);
            return p;
        }
        if w.regions > 0 || unlocated > 0 {
            // Index entries may name objects inside an unparseable region,
            // or a damaged object under its original key's buckets: keep
            // the segment (never picked again) until an index rebuild.
            self.note_damaged(
                v as u64 * self.geo.seg_bytes + 1,
                "compaction (unparseable region)",
            );
            ve.state
                .store(seg_state(SEG_CLOSED, TAG_QUARANTINED), Ordering::Release);
            return Pass::Quarantined;
        }
        ve.live.store(0, Ordering::Relaxed);
        ve.stamp
            .store(crate::store::ordered_stamp(), Ordering::Release);
        ve.state.store(SEG_RETIRED, Ordering::Release);
        self.hdr().compactions.fetch_add(1, Ordering::Relaxed);
        self.meta().lease.passes.fetch_add(1, Ordering::Relaxed);
        self.meta()
            .lease
            .heartbeat_ms
            .store(nibble::object::now_ms(), Ordering::Relaxed);
        Pass::Compacted
    }

    /// Begin an operation on the object `h` with intent `kind` (naming
    /// `h` as the old object) and lock its key's buckets: the operation,
    /// the two buckets and the hash tag. `Busy` if a live process holds a
    /// bucket too long.
    fn lock_key_of(
        &self,
        h: &Obj,
        kind: u64,
    ) -> std::result::Result<(Op<'_>, usize, usize, u64), Pass> {
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(self.obj_key(h)));
        let op = self.begin();
        self.set_intent(&op, kind, b0, b1, h.loc().get(), 0);
        if self.lock_pair(&op, b0, b1).is_err() {
            return Err(Pass::Busy);
        }
        Ok((op, b0, b1, tag))
    }

    /// Remove an expired (`expired`) or damaged object from the index (a
    /// delete under the key's bucket locks, with a DEL intent, so a death
    /// halfway is resolved like any delete's) instead of moving it. False
    /// if, under the locks, an expired object is indexed but no longer
    /// expired (a `set_expiry` came first): the caller moves it instead.
    /// For a damaged object, whether its entry was found: the buckets
    /// searched are those of its key as stored, which may be damaged.
    fn drop_object(&self, h: &Obj, expired: bool) -> std::result::Result<bool, Pass> {
        let loc = h.loc().get();
        let (op, b0, b1, _) = self.lock_key_of(h, INTENT_DEL)?;
        let found = self.find_entry(b0, b1, loc);
        let still_expired = self.obj_header(loc).is_some_and(|h| h.expired());
        if expired && found.is_some() && !still_expired {
            self.unlock_pair(b0, b1);
            return Ok(false);
        }
        if let Some((b, i)) = found {
            self.bucket(b).entries[i].store(0, Ordering::Release);
            self.mark(loc, OBJ_DEAD);
            self.count_items(&op, -1);
            if expired {
                self.hdr().expired_reclaimed.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.unlock_pair(b0, b1);
        Ok(expired || found.is_some())
    }

    /// Move one live object into the destination segment.
    fn move_object(
        &self,
        h: &Obj,
        size: u64,
        dest: &mut Option<usize>,
    ) -> std::result::Result<(), Pass> {
        let loc = h.loc().get();
        let (op, b0, b1, tag) = self.lock_key_of(h, INTENT_MOVE)?;
        let found = self.find_entry(b0, b1, loc);
        let Some((b, i)) = found else {
            self.unlock_pair(b0, b1);
            return Ok(()); // not the key's current value
        };
        let (d, to) = match self.dest_room(size, dest) {
            Ok(r) => r,
            Err(p) => {
                self.unlock_pair(b0, b1);
                return Err(p);
            }
        };
        let de = self.seg(d);
        let doff = de.used.load(Ordering::Relaxed);
        // SAFETY: `to` has `size` bytes of room in our own destination
        // segment (`fits` above), which only the lease holder (us, under
        // the compactor mutex) writes; `h` is a checked object of `size`
        // bytes in the victim.
        unsafe { self.copy_object(h, to, size) };
        let new = to.get();
        de.used.store(doff + size, Ordering::Release);
        self.set_intent_new(&op, new);
        point(CrashPoint::MoveCopied);
        self.bucket(b).entries[i].store((tag << LOC_BITS) | new, Ordering::Release);
        point(CrashPoint::MoveEntryStored);
        self.mark(new, OBJ_COMMITTED);
        self.kill_replaced(&op, loc);
        de.live.fetch_add(size, Ordering::Relaxed);
        // The copy's expiry, read under the locks (a `set_expiry` may have
        // changed it since `h` was read).
        if let Some(nh) = self.obj_header(new) {
            self.note_expiry(new, nh.expiry_ms);
        }
        self.unlock_pair(b0, b1);
        Ok(())
    }

    /// Room for `size` bytes in the destination segment (closing a full
    /// one and claiming another): the segment and the location.
    fn dest_room(
        &self,
        size: u64,
        dest: &mut Option<usize>,
    ) -> std::result::Result<(usize, ValidLoc), Pass> {
        let fits = |d: usize| self.seg(d).used.load(Ordering::Relaxed) + size <= self.geo.seg_bytes;
        if !dest.is_some_and(fits) {
            if let Some(d) = dest.take() {
                self.close_segment(d);
            }
            match self.claim_segment(TAG_COMPACTOR, true) {
                Some(d) if fits(d) => {
                    *dest = Some(d);
                    self.meta()
                        .lease
                        .dest
                        .store(d as u64 + 1, Ordering::Release);
                }
                Some(d) => {
                    // Cannot happen (an object fits a segment with its
                    // stamp); give the segment back as closed.
                    self.close_segment(d);
                    return Err(Pass::NoSpace);
                }
                None => {
                    self.meta().lease.dest.store(0, Ordering::Release);
                    return Err(Pass::NoSpace);
                }
            }
        }
        let d = dest.unwrap_or_default();
        let doff = self.seg(d).used.load(Ordering::Relaxed);
        let to = self
            .valid_loc(d as u64 * self.geo.seg_bytes + doff + 1)
            .ok_or(Pass::NoSpace)?;
        Ok((d, to))
    }

    /// A committed, DEAD object of the victim (see `store/checkpoint.rs`):
    /// a tombstone still needed by the completed checkpoint is copied to
    /// the destination (COMMITTED | DEAD there too); after a checkpoint
    /// recovery, an index entry that still names a DEAD object (an
    /// expired one compaction removed before the cut) is removed.
    fn pass_dead(
        &self,
        h: &Obj,
        size: u64,
        dest: &mut Option<usize>,
    ) -> std::result::Result<(), Pass> {
        match self.marker(h) {
            Some((Marker::Tombstone, epoch)) if self.ck_on() && self.tombstone_needed(epoch) => {
                let (d, to) = self.dest_room(size, dest)?;
                // SAFETY: `to` has `size` bytes of room in our own
                // destination segment (`dest_room`), which only the lease
                // holder (us, under the compactor mutex) writes; `h` is a
                // checked object of `size` bytes in the victim.
                unsafe { self.copy_object(h, to, size) };
                let de = self.seg(d);
                de.used
                    .store(de.used.load(Ordering::Relaxed) + size, Ordering::Release);
                self.mark(to.get(), OBJ_COMMITTED | OBJ_DEAD);
                self.ck.tombstones_kept.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Some(_) => Ok(()),
            None if self.ck.stale_dead.load(Ordering::Relaxed) => {
                let loc = h.loc().get();
                let (op, b0, b1, _) = self.lock_key_of(h, INTENT_DEL)?;
                if let Some((b, i)) = self.find_entry(b0, b1, loc) {
                    self.bucket(b).entries[i].store(0, Ordering::Release);
                    self.count_items(&op, -1);
                }
                self.unlock_pair(b0, b1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// A writer out of space: compact here if this process can hold the
    /// lease (another process's compactor is otherwise relied on).
    pub(crate) fn compact_inline(&self) {
        if !self.try_acquire_lease() {
            return;
        }
        let Ok(mut st) = self.compactor.try_lock() else {
            return; // our own compaction thread is at work
        };
        let mut dest = st.dest;
        for _ in 0..PASSES_PER_ROUND {
            let p = self.pass(&mut dest, false);
            if p != Pass::Compacted || self.count_free() > self.geo.reserve_segments + 1 {
                break;
            }
        }
        self.reclaim_retired();
        st.dest = dest;
        drop(st);
        if !self.opts.compaction_thread {
            self.release_lease();
        }
    }

    /// Forced passes until nothing is worth compacting.
    pub(crate) fn compact_forced(&self) -> Result<u64> {
        if !self.try_acquire_lease() {
            return Err(Error::Busy(
                "another live process holds the compaction lease".into(),
            ));
        }
        let mut st = self.compactor.lock().unwrap_or_else(|p| p.into_inner());
        let mut dest = st.dest;
        let mut n = 0;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            match self.pass(&mut dest, true) {
                Pass::Compacted => n += 1,
                Pass::Quarantined => {}
                Pass::Busy => {
                    st.dest = dest;
                    return Err(Error::Busy("a bucket lock stayed held".into()));
                }
                _ => break,
            }
        }
        // Let segments retired by this call become free.
        for _ in 0..100 {
            self.reclaim_retired();
            if !(0..self.geo.log_segments as usize)
                .any(|s| self.seg(s).state.load(Ordering::Relaxed) == SEG_RETIRED)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        st.dest = dest;
        drop(st);
        if !self.opts.compaction_thread {
            self.release_lease();
        }
        Ok(n)
    }

    /// The compaction thread: compete for the lease; while holding it,
    /// run passes when space runs low.
    pub(crate) fn compaction_loop(&self) {
        let mut last_check = Instant::now() - LEASE_CHECK_INTERVAL;
        while !self.stop.load(Ordering::Acquire) {
            let mine = self.meta().lease.owner.load(Ordering::Acquire) == self.me;
            let holder = mine
                || (last_check.elapsed() >= LEASE_CHECK_INTERVAL && {
                    last_check = Instant::now();
                    self.try_acquire_lease()
                });
            if holder {
                let mut st = self.compactor.lock().unwrap_or_else(|p| p.into_inner());
                let mut dest = st.dest;
                for _ in 0..PASSES_PER_ROUND {
                    if self.stop.load(Ordering::Acquire)
                        || self.pass(&mut dest, false) != Pass::Compacted
                    {
                        break;
                    }
                }
                st.dest = dest;
                self.meta()
                    .lease
                    .heartbeat_ms
                    .store(nibble::object::now_ms(), Ordering::Relaxed);
            }
            std::thread::sleep(IDLE_SLEEP);
        }
    }
}
