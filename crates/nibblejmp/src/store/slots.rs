//! Epoch slots: who is inside an operation, and since when (dissertation
//! §4.5, re-placed into shared memory).
//!
//! The meta segment holds `EPOCH_SLOTS` slots; a process claims up to
//! `Options::epoch_slots` of them at attach (its pid + start time in the
//! owner word) and lends them to its threads one operation at a time
//! ([`Op`]). An operation stores the TSC in its slot (then a SeqCst fence)
//! before it touches the index, and clears it at the end; a reclaimer
//! frees a segment only when every non-zero stamp is past the segment's
//! retirement stamp ([`Inner::min_epoch`]).
//!
//! A slot also carries its operation's *intent* (kind, the key's two
//! buckets, old and new object), written before the bucket locks are
//! taken, so that whoever finds the slot's process dead can finish or roll
//! back the update (`locks.rs`). A dead owner's slot is reclaimed rather
//! than left to hold the epoch back forever: its intent resolved, its
//! locks released, the slot freed ([`Inner::reclaim_slot`]).

use super::*;

/// An operation's hold on an epoch slot: pinned while it lives.
pub(crate) struct Op<'a> {
    inner: &'a Inner,
    pub(crate) local: usize,
    pub(crate) slot: usize,
}

impl Op<'_> {
    /// Leave the epoch (while waiting for space) ...
    pub(crate) fn unpin(&self) {
        self.inner.slot(self.slot).tsc.store(0, Ordering::Release);
    }

    /// ... and enter it again.
    pub(crate) fn repin(&self) {
        self.inner.pin(self.slot);
    }
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        let s = self.inner.slot(self.slot);
        s.intent_kind.store(INTENT_NONE, Ordering::Relaxed);
        s.tsc.store(0, Ordering::Release);
        self.inner.local[self.local]
            .busy
            .store(false, Ordering::Release);
    }
}

/// A snapshot of a slot's intent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Intent {
    pub(super) kind: u64,
    pub(super) b0: u64,
    pub(super) b1: u64,
    pub(super) old: u64,
    pub(super) new: u64,
}

impl Inner {
    pub(crate) fn pin(&self, slot: usize) {
        self.slot(slot)
            .tsc
            .store(topology::rdtsc().max(1), Ordering::Relaxed);
        // Pairs with the reclaimer's fence before it scans the slots: either
        // it sees our stamp, or we see its state change (§4.5).
        fence(Ordering::SeqCst);
    }

    /// Take one of this process's epoch slots and pin it.
    pub(crate) fn begin(&self) -> Op<'_> {
        let n = self.local.len();
        let start = topology::current_cpu() % n;
        loop {
            for i in 0..n {
                let l = (start + i) % n;
                if self.local[l]
                    .busy
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    let slot = self.local[l].slot;
                    self.slot(slot).ops.fetch_add(1, Ordering::Relaxed);
                    self.pin(slot);
                    return Op {
                        inner: self,
                        local: l,
                        slot,
                    };
                }
            }
            std::thread::yield_now();
        }
    }

    /// The oldest stamp of any operation in flight (u64::MAX if none),
    /// reclaiming slots of dead processes that hold it back.
    pub(crate) fn min_epoch(&self) -> u64 {
        fence(Ordering::SeqCst);
        let mut min = u64::MAX;
        for i in 0..EPOCH_SLOTS {
            let s = self.slot(i);
            let t = s.tsc.load(Ordering::Acquire);
            if t == 0 {
                continue;
            }
            let owner = s.owner.load(Ordering::Acquire);
            if owner != 0 && owner != self.me && slot_owner_dead(owner) {
                self.reclaim_slot(i, owner);
                continue;
            }
            min = min.min(t);
        }
        min
    }

    pub(super) fn intent_of(&self, slot: usize) -> Intent {
        let s = self.slot(slot);
        Intent {
            kind: s.intent_kind.load(Ordering::Acquire),
            b0: s.intent_b0.load(Ordering::Acquire),
            b1: s.intent_b1.load(Ordering::Acquire),
            old: s.intent_old.load(Ordering::Acquire),
            new: s.intent_new.load(Ordering::Acquire),
        }
    }

    pub(crate) fn set_intent(
        &self,
        op: &Op<'_>,
        kind: u64,
        b0: usize,
        b1: usize,
        old: u64,
        new: u64,
    ) {
        let s = self.slot(op.slot);
        s.intent_b0.store(b0 as u64 + 1, Ordering::Relaxed);
        s.intent_b1.store(b1 as u64 + 1, Ordering::Relaxed);
        s.intent_old.store(old, Ordering::Relaxed);
        s.intent_new.store(new, Ordering::Relaxed);
        s.intent_kind.store(kind, Ordering::Release);
    }

    pub(crate) fn set_intent_old(&self, op: &Op<'_>, old: u64) {
        self.slot(op.slot).intent_old.store(old, Ordering::Release);
    }

    pub(crate) fn set_intent_new(&self, op: &Op<'_>, new: u64) {
        self.slot(op.slot).intent_new.store(new, Ordering::Release);
    }

    /// Reclaim slot `i` of the dead owner `owner`: resolve and release the
    /// locks it holds, clear it, free it.
    pub(crate) fn reclaim_slot(&self, i: usize, owner: u64) -> bool {
        let s = self.slot(i);
        if s.owner
            .compare_exchange(
                owner,
                RECLAIM_BIT | self.me,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        let it = self.intent_of(i);
        for b in [it.b0, it.b1] {
            if b == 0 || b > self.geo.index_buckets {
                continue;
            }
            let w = self.bucket(b as usize - 1).word.load(Ordering::Acquire);
            if lock_holder(w) == Some(i) {
                // Steal as ourselves (slot i is ours now: we hold RECLAIM).
                self.break_bucket(i, b as usize - 1, w, i);
            }
        }
        for h in 0..self.geo.heads as usize {
            let lock = &self.head(h).lock;
            let w = lock.load(Ordering::Acquire);
            if lock_holder(w) == Some(i) && self.break_head(i, h, w) {
                super::locks::release(lock);
            }
        }
        s.intent_kind.store(INTENT_NONE, Ordering::Relaxed);
        s.tsc.store(0, Ordering::Relaxed);
        s.owner.store(0, Ordering::Release);
        self.hdr().slots_reclaimed.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Reclaim every slot whose owner is dead.
    pub(crate) fn reclaim_dead_slots(&self) -> u64 {
        let mut n = 0;
        for i in 0..EPOCH_SLOTS {
            let owner = self.slot(i).owner.load(Ordering::Acquire);
            if owner != 0
                && owner != self.me
                && slot_owner_dead(owner)
                && self.reclaim_slot(i, owner)
            {
                n += 1;
            }
        }
        n
    }

    /// Live processes (other than us) with a slot in the table.
    pub(crate) fn others_alive(&self) -> bool {
        (0..EPOCH_SLOTS).any(|i| {
            let o = self.slot(i).owner.load(Ordering::Acquire);
            o != 0 && o & RECLAIM_BIT == 0 && o != self.me && proc_id::alive(o)
        })
    }
}

/// A TSC stamp taken after every earlier load and store is globally
/// visible: `MFENCE; LFENCE; RDTSC` (Intel SDM; the sequence
/// `epoch::TscClock::stamp_ordered` uses). A plain RDTSC may execute before
/// the index updates a retirement or close stamp must follow.
pub(crate) fn ordered_stamp() -> u64 {
    fence(Ordering::SeqCst);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: LFENCE exists on every x86-64 processor (SSE2), touches no
    // memory or registers and leaves the flags alone.
    unsafe {
        core::arch::asm!("lfence", options(nostack, preserves_flags));
    }
    topology::rdtsc().max(1)
}

/// Whether a slot owner word names a dead process (or a dead reclaimer).
pub(crate) fn slot_owner_dead(owner: u64) -> bool {
    owner != 0 && !proc_id::alive(owner & !RECLAIM_BIT)
}
