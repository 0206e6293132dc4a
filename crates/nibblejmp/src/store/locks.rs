//! Breakable locks: bucket and head locks that a dead process cannot
//! wedge (the crate essay's "Breakable locks"; nibble's seqlock bucket,
//! dissertation §4.3, made cross-process).
//!
//! A lock word is `seq << 8 | holder slot + 1`. A waiter spins with
//! backoff and, every `SPINS_BETWEEN_LIVENESS_CHECKS` spins, looks up the
//! holder's slot owner: if that process is dead, it steals the lock with a
//! compare-and-swap on the exact word it saw (the sequence number rules
//! out ABA), resolves the dead holder's intent ([`Inner::resolve`]: roll
//! forward if the entry already names the new object, back otherwise;
//! every step an idempotent `fetch_or`) and unlocks. A head taken over
//! this way is repaired ([`Inner::repair_head`]): segments its holder
//! claimed but never linked are closed, and `used` covers every complete
//! append. A wait behind a live holder ends with `Busy` after
//! `Options::lock_wait`.

use super::*;
use nibble::backoff::Backoff;

impl Inner {
    /// The (bucket, entry) of `b0`/`b1` that names `loc`, if any. The
    /// caller holds both buckets' locks when it acts on the answer.
    pub(crate) fn find_entry(&self, b0: usize, b1: usize, loc: u64) -> Option<(usize, usize)> {
        [b0, b1].into_iter().find_map(|b| {
            self.bucket(b)
                .entries
                .iter()
                .position(|e| {
                    let e = e.load(Ordering::Acquire);
                    e != 0 && e & LOC_MASK == loc
                })
                .map(|i| (b, i))
        })
    }

    fn bucket_has(&self, b: u64, loc: u64) -> bool {
        b != 0
            && b <= self.geo.index_buckets
            && self.bucket(b as usize - 1).entries.iter().any(|e| {
                let e = e.load(Ordering::Acquire);
                e != 0 && e & LOC_MASK == loc
            })
    }

    /// Finish or roll back a dead holder's bucket update. Every step is
    /// idempotent, so two processes resolving the same intent agree (the
    /// deciding fact, whether the index holds `new` / still holds `old`,
    /// cannot change while one of the key's buckets is held).
    fn resolve(&self, it: Intent) {
        let present =
            |loc: u64| loc != 0 && (self.bucket_has(it.b0, loc) || self.bucket_has(it.b1, loc));
        match it.kind {
            INTENT_PUT | INTENT_MOVE if it.new != 0 => {
                if present(it.new) {
                    self.mark(it.new, OBJ_COMMITTED);
                    if it.old != 0 && it.old != it.new {
                        self.mark(it.old, OBJ_DEAD);
                    }
                } else {
                    self.mark(it.new, OBJ_DEAD);
                }
            }
            INTENT_DEL if it.old != 0 && !present(it.old) => self.mark(it.old, OBJ_DEAD),
            _ => {}
        }
    }

    /// Take bucket `b` from dead holder `holder` (word `w`), resolve its
    /// intent and unlock. False if someone else moved first.
    pub(super) fn break_bucket(&self, my_slot: usize, b: usize, w: u64, holder: usize) -> bool {
        let it = self.intent_of(holder);
        let word = &self.bucket(b).word;
        if !self.steal(word, w, my_slot) {
            return false;
        }
        if it.kind != INTENT_NONE && (it.b0 == b as u64 + 1 || it.b1 == b as u64 + 1) {
            self.resolve(it);
        }
        release(word);
        true
    }

    /// Take head `h` from a dead holder; on success the caller holds it.
    pub(super) fn break_head(&self, my_slot: usize, h: usize, w: u64) -> bool {
        if !self.steal(&self.head(h).lock, w, my_slot) {
            return false;
        }
        self.repair_head(h);
        true
    }

    /// Take a lock word from a dead holder for `my_slot`: a
    /// compare-and-swap on the exact word `w` the caller saw (its sequence
    /// number rules out ABA), counted in `broken_locks`. False if someone
    /// else moved first.
    fn steal(&self, word: &AtomicU64, w: u64, my_slot: usize) -> bool {
        let stolen = word
            .compare_exchange(
                w,
                lock_word(w, my_slot),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok();
        if stolen {
            self.hdr().broken_locks.fetch_add(1, Ordering::Relaxed);
        }
        stolen
    }

    /// Under head `h`'s lock, after its holder died: segments the holder
    /// claimed but never linked are closed, and the head's segment's
    /// `used` covers every complete append.
    pub(crate) fn repair_head(&self, h: usize) {
        let head = self.head(h);
        let cur = head.seg.load(Ordering::Acquire);
        for s in 0..self.geo.log_segments as usize {
            let e = self.seg(s);
            let st = e.state.load(Ordering::Acquire);
            if st == seg_state(SEG_OPEN, h as u64) && cur != s as u64 + 1 {
                self.close_segment(s);
            }
        }
        if cur != 0 && cur <= self.geo.log_segments {
            let e = self.seg(cur as usize - 1);
            let off = head.off.load(Ordering::Acquire).min(self.geo.seg_bytes);
            e.used.fetch_max(off, Ordering::AcqRel);
        }
    }

    /// Lock bucket `b`, breaking it if its holder is dead; `Busy` after
    /// `lock_wait` behind a live holder.
    pub(crate) fn lock_bucket(&self, op: &Op<'_>, b: usize) -> Result<()> {
        let word = &self.bucket(b).word;
        let mut spins = 0u32;
        let mut backoff = Backoff::with_spin_rounds(SPINS_BEFORE_YIELD);
        let start = Instant::now();
        loop {
            let w = word.load(Ordering::Acquire);
            match lock_holder(w) {
                None => {
                    if word
                        .compare_exchange_weak(
                            w,
                            lock_word(w, op.slot),
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                    {
                        return Ok(());
                    }
                }
                Some(h) => {
                    spins += 1;
                    if spins.is_multiple_of(SPINS_BETWEEN_LIVENESS_CHECKS) {
                        let owner = self.slot(h).owner.load(Ordering::Acquire);
                        if lock_breakable(owner) {
                            self.break_bucket(op.slot, b, w, h);
                            continue;
                        }
                        self.check_wait(start, || {
                            format!(
                                "index bucket {b} held by live process {}",
                                proc_id::pid_of(owner)
                            )
                        })?;
                    }
                    backoff.snooze();
                }
            }
        }
    }

    pub(crate) fn unlock_bucket(&self, b: usize) {
        release(&self.bucket(b).word);
    }

    /// Lock a key's two buckets, lower index first (one global order).
    pub(crate) fn lock_pair(&self, op: &Op<'_>, b0: usize, b1: usize) -> Result<()> {
        let (lo, hi) = (b0.min(b1), b0.max(b1));
        self.lock_bucket(op, lo)?;
        if hi != lo {
            if let Err(e) = self.lock_bucket(op, hi) {
                self.unlock_bucket(lo);
                return Err(e);
            }
        }
        Ok(())
    }

    pub(crate) fn unlock_pair(&self, b0: usize, b1: usize) {
        if b0 != b1 {
            self.unlock_bucket(b0.max(b1));
        }
        self.unlock_bucket(b0.min(b1));
    }

    /// Lock some head, starting from this CPU's (§4.4: a busy head is
    /// skipped, not waited on); dead holders' heads are taken over.
    pub(super) fn lock_head(&self, op: &Op<'_>) -> Result<usize> {
        let n = self.geo.heads as usize;
        let first = topology::current_cpu() % n;
        let start = Instant::now();
        let mut rounds = 0u32;
        let mut backoff = Backoff::with_spin_rounds(SPINS_BEFORE_YIELD);
        loop {
            for i in 0..n {
                let h = (first + i) % n;
                let lock = &self.head(h).lock;
                let w = lock.load(Ordering::Acquire);
                if lock_holder(w).is_none()
                    && lock
                        .compare_exchange(
                            w,
                            lock_word(w, op.slot),
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                {
                    return Ok(h);
                }
            }
            rounds += 1;
            if rounds.is_multiple_of(64) {
                for h in 0..n {
                    let w = self.head(h).lock.load(Ordering::Acquire);
                    if let Some(holder) = lock_holder(w) {
                        let owner = self.slot(holder).owner.load(Ordering::Acquire);
                        if lock_breakable(owner) && self.break_head(op.slot, h, w) {
                            return Ok(h);
                        }
                    }
                }
                self.check_wait(start, || {
                    "every log head held by live processes".to_string()
                })?;
            }
            backoff.snooze();
        }
    }

    pub(super) fn unlock_head(&self, h: usize) {
        release(&self.head(h).lock);
    }

    /// `Busy` (naming what is `held`) once a wait for a live holder that
    /// began at `start` has lasted longer than `Options::lock_wait`:
    /// writers never spin forever.
    fn check_wait(&self, start: Instant, held: impl FnOnce() -> String) -> Result<()> {
        if start.elapsed() > self.opts.lock_wait {
            return Err(Error::Busy(format!(
                "{} for over {:?}",
                held(),
                self.opts.lock_wait
            )));
        }
        Ok(())
    }
}

/// Unlock a lock word this process's slot holds (the holder byte cleared,
/// the sequence number kept: see `layout::unlock_word`).
pub(super) fn release(word: &AtomicU64) {
    let w = word.load(Ordering::Relaxed);
    word.store(unlock_word(w), Ordering::Release);
}

/// Whether a lock held by a slot with this owner word may be broken: the
/// slot is free (cannot hold a lock), being reclaimed (its owner died), or
/// its owner is dead.
fn lock_breakable(owner: u64) -> bool {
    owner == 0 || owner & RECLAIM_BIT != 0 || !proc_id::alive(owner)
}
