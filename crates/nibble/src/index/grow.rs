//! Growth: doubling one subtable in place (dissertation §4.3).
//!
//! The resizer locks every bucket of the subtable in ascending order (the
//! order writers use), re-checks that the growth is still needed, reserves
//! the new half's bytes against the index budget, then moves each entry
//! whose bucket changes from `c` to `c + n` (same slot, so the split cannot
//! overflow) and publishes `2n` with a release store before it unlocks.
//! Entries keep only 16 hash bits, so the resizer asks the store for each
//! moved key's full hash (`rehash`); if that panics, the copies are
//! unpublished and the budget is given back. The keys are scattered over
//! the log, so each rehash is a cache miss: the resizer hints the objects
//! of the bucket [`REHASH_PREFETCH_BUCKETS`] ahead to the owner
//! (`rehash_prefetch`), and those misses overlap.

use super::*;

impl Index {
    /// Doubles the subtable of `hash` unless its neighbourhood has room
    /// again (another thread grew it, or an entry was removed). Call it
    /// after [`WriteGuard::insert`] returned [`IndexError::Full`], with the
    /// guard dropped, then retry the insert. Fails with
    /// [`IndexError::Full`] if the subtable is at its reservation or the
    /// index at its byte budget; existing entries are unaffected.
    pub fn grow(&self, hash: u64) -> Result<(), IndexError> {
        self.grow_subtable(self.subtable(hash), Trigger::Full(hash))
    }

    /// The resize of §4.3: lock every bucket, split, publish, unlock.
    pub(super) fn grow_subtable(&self, st: &Subtable, trigger: Trigger) -> Result<(), IndexError> {
        // Bucket 0 first: this also serialises concurrent resizers, and
        // once we hold it `n` cannot change (publishing needs it).
        let first = st.bucket(0).lock();
        let n = st.n.load(Ordering::Acquire);
        let mut guards = Vec::with_capacity(2 * n);
        guards.push(first);
        guards.extend((1..n).map(|c| st.bucket(c).lock()));

        let still_needed = match trigger {
            Trigger::Full(hash) => {
                let (home, second) = self.neighbourhood(hash, n);
                free_slots(&guards[home]) + free_slots(&guards[second]) == 0
            }
            Trigger::Load => {
                st.counters.entries.load(Ordering::Relaxed) > st.grow_at.load(Ordering::Relaxed)
            }
        };
        if !still_needed {
            return Ok(());
        }

        let m = 2 * n;
        let added_bytes = (n * BUCKET_BYTES) as u64;
        let reserved = if m <= self.max_buckets {
            self.reserve_budget(added_bytes)
        } else {
            None
        };
        let Some(mut reserved) = reserved else {
            st.counters.failed_resizes.fetch_add(1, Ordering::Relaxed);
            // Stop the proactive check from locking the subtable again: the
            // reservation never grows back, and the budget only when the
            // owner frees space, which a later insert that finds its
            // neighbourhood full tries (and a success re-arms the check).
            st.grow_at.store(u64::MAX, Ordering::Relaxed);
            return Err(IndexError::Full);
        };

        // The new half is unpublished (no reader or writer can reach it
        // before `n` changes); locking it only lets us write through guards.
        // Locking writes every new bucket, so whole huge pages there cost
        // no more resident memory than 4 KiB ones; its pages are mapped in
        // writable first (`populate`), so that the locks' loads do not map
        // the zero page for their CAS to replace with a TLB flush.
        st.buckets.in_use(m);
        st.buckets.populate(n, m);
        guards.extend((n..m).map(|c| st.bucket(c).lock()));
        if st.dirty_above_n.load(Ordering::Relaxed) {
            for guard in &mut guards[n..] {
                for i in 0..ENTRIES_PER_BUCKET {
                    guard.store(i, 0);
                }
            }
        }
        st.dirty_above_n.store(true, Ordering::Relaxed);

        // Pass 1: copy every entry whose bucket changes from c to c + n.
        // An entry keeps its role (home or second bucket), and each of
        // those is, for 2n buckets, the same index or that plus n: the
        // split moves entries only from c to c + n, slot for slot, so it
        // can never overflow. Only user code (`rehash`) can panic here;
        // until pass 2 the old half is intact and the copies invisible.
        let mut mismatches = 0u64;
        // The objects of the first buckets, then each step the bucket
        // `REHASH_PREFETCH_BUCKETS` ahead: hints only, read from locked
        // buckets.
        let prefetch = self.rehash_prefetch.get();
        let prefetch_bucket = |g: &bucket::BucketGuard<'_, ENTRIES_PER_BUCKET>| {
            if let Some(p) = prefetch {
                for i in 0..ENTRIES_PER_BUCKET {
                    let e = g.load(i);
                    if e != 0 {
                        p(e & LOC_MASK);
                    }
                }
            }
        };
        for g in &guards[..REHASH_PREFETCH_BUCKETS.min(n)] {
            prefetch_bucket(g);
        }
        for c in 0..n {
            if let Some(g) = guards[..n].get(c + REHASH_PREFETCH_BUCKETS) {
                prefetch_bucket(g);
            }
            for i in 0..ENTRIES_PER_BUCKET {
                let e = guards[c].load(i);
                if e == 0 {
                    continue;
                }
                let hash = (self.rehash)(e & LOC_MASK);
                let (home, second) = self.neighbourhood(hash, n);
                let (home2, second2) = self.neighbourhood(hash, m);
                let c2 = if c == home {
                    home2
                } else if c == second {
                    second2
                } else {
                    usize::MAX
                };
                if tag_bits(hash) != tag_bits(e) || (c2 != c && c2 != c + n) {
                    mismatches += 1;
                    continue;
                }
                if c2 != c {
                    guards[c2].store(i, e);
                }
            }
        }
        // Pass 2: remove the originals of what was copied.
        for c in 0..n {
            for i in 0..ENTRIES_PER_BUCKET {
                if guards[c + n].load(i) != 0 {
                    guards[c].store(i, 0);
                }
            }
        }
        st.dirty_above_n.store(false, Ordering::Relaxed);
        reserved.bytes = 0;
        if mismatches > 0 {
            st.counters
                .rehash_mismatches
                .fetch_add(mismatches, Ordering::Relaxed);
        }
        st.grow_at
            .store(grow_threshold(self.grow_load_factor, m), Ordering::Relaxed);
        // Release: whoever learns the new size also sees the moved entries
        // (and the bucket unlocks below come after it, which is what the
        // re-checks of `n` in `read` and `lock` rely on).
        st.n.store(m, Ordering::Release);
        st.counters.resizes.fetch_add(1, Ordering::Relaxed);
        st.shrink_below.store(u64::MAX, Ordering::Relaxed);
        drop(guards);
        // Chunks that held old buckets were faulted in 4 KiB pages; now
        // that every bucket below `m` is resident, fold them into huge
        // pages (outside the locks: it copies up to the subtable's size).
        st.buckets.collapse(m);
        Ok(())
    }
}

impl Index {
    /// Reserve `bytes` more bucket bytes: within `max_bytes`, or past it
    /// with the part above borrowed from the overflow. `None` when neither
    /// has room.
    fn reserve_budget(&self, bytes: u64) -> Option<BudgetReservation<'_>> {
        let mut b = self.bucket_bytes.load(Ordering::Relaxed);
        loop {
            let new = b + bytes;
            let own_limit = self.max_bytes.max(self.metadata_bytes + b);
            let over = (self.metadata_bytes + new).saturating_sub(own_limit);
            if over > 0 && !self.overflow.get().is_some_and(|o| o.take(over)) {
                return None;
            }
            match self.bucket_bytes.compare_exchange_weak(
                b,
                new,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.borrowed_bytes.fetch_add(over, Ordering::Relaxed);
                    return Some(BudgetReservation {
                        index: self,
                        bytes,
                        borrowed: over,
                    });
                }
                Err(cur) => {
                    if let (true, Some(o)) = (over > 0, self.overflow.get()) {
                        o.give_back(over);
                    }
                    b = cur;
                }
            }
        }
    }
}

/// Gives reserved budget bytes (and what was borrowed for them) back
/// unless the resize completed (a panicking `rehash` must not leak
/// budget).
struct BudgetReservation<'a> {
    index: &'a Index,
    bytes: u64,
    borrowed: u64,
}

impl Drop for BudgetReservation<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.index
                .bucket_bytes
                .fetch_sub(self.bytes, Ordering::Relaxed);
            if self.borrowed > 0 {
                self.index
                    .borrowed_bytes
                    .fetch_sub(self.borrowed, Ordering::Relaxed);
                if let Some(o) = self.index.overflow.get() {
                    o.give_back(self.borrowed);
                }
            }
        }
    }
}
