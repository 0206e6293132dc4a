//! Shrinking: halving a sparse subtable in place, so the index's memory
//! follows the key count down as well as up (issue 26).
//!
//! The dissertation's index only grows (§4.3): a store that once held
//! many small keys keeps the index they needed after they are deleted,
//! and on a small store that is the largest fixed overhead left (after
//! `memlab server --quick`'s churn, 4 MiB of index for 86k keys that need
//! 1 MiB, 6 % of the live data). Redis shrinks its dicts for the same
//! reason (`htNeedsResize`: fill under 10 %).
//!
//! A halving is a split run backwards, under the same protocol as
//! [`Index::grow`](super::Index::grow): lock every bucket of the subtable
//! in ascending order, re-check, move, publish `n / 2` with a release
//! store, unlock. An entry sits in its home bucket or its second one;
//! for `n / 2` buckets both are the old position modulo `n / 2` (the
//! neighbour is an offset from home modulo the size, and `n / 2` divides
//! `n`), so bucket `c + n/2` merges into bucket `c` and nothing needs a
//! rehash. A pair whose entries do not fit in one bucket (15) cancels the
//! halving before anything moved. Readers and writers re-check `n` after
//! their buckets (as for growth), so one that used the old size retries.
//! SCAN's reverse-binary cursor is Redis's, which survives shrinking too
//! (an entry may be returned twice, none present throughout is missed).
//!
//! The upper half is not unmapped at once: a reader that loaded the old
//! `n` may still be reading those buckets, and `MADV_DONTNEED` would
//! reset their version words to 0, which a later growth could count back
//! up to a version that reader saw (a seqlock ABA). So a halving returns
//! a [`Shrunk`] ticket; the caller (a compaction worker) stamps it with
//! the epoch clock and calls [`Index::release_shrunk`] once every
//! operation older than the stamp has finished. The release holds bucket
//! 0's lock (which serialises resizes) and skips a subtable that grew
//! back meanwhile. The budget is given back at the halving (the index's
//! own share first, then what it borrowed from the log), so the store's
//! accounting follows the key count at once and RSS within a decay step.
//!
//! When: a subtable whose entries fall below [`SHRINK_LOAD`] of its slots,
//! never below the initial size, halved again and again in one call while
//! it stays below (so a short dip between a bulk delete and the inserts
//! that follow takes it the whole way down); after the last halving its
//! load is under twice that, far from the growth load (0.85), so the two
//! cannot alternate.
//! The compaction worker looks on every step, under load as when idle:
//! a halving locks the whole subtable as a doubling does, and like a
//! doubling it comes once per halving of the key count, so it costs the
//! writers what growth costs them. Waiting for the clients to fall quiet
//! would miss the common case of a bulk delete followed by new inserts:
//! the index would keep the size of the deleted keys' peak and grow
//! back from there (`memlab frag`'s 64→128 pair: 32 MiB of index for
//! 1.15 M keys that need 16 MiB).
//! A pair that overflows is not placed elsewhere: moving an entry to its
//! other bucket could move it behind a running SCAN's cursor; the
//! halving is cancelled, and the subtable is tried again only once
//! deletes have taken its count below 3/4 of what it was (so a subtable
//! that cannot halve is not locked whole on every step).

use super::bucket::BucketGuard;
use super::*;

/// A subtable halves when its entries fill less than this share of its
/// slots (Redis: 10 %); after the halving the load is under 0.4, far
/// below the growth load. A merged pair rarely overflows at this load:
/// the two-choice insert leaves buckets evenly filled and deletes thin
/// them evenly (a pair holds 6 entries on average, 15 is four standard
/// deviations away); a higher threshold would cancel most halvings.
pub const SHRINK_LOAD: f64 = 0.2;

/// A halved subtable whose upper half can be released (see the module
/// docs): subtable `subtable` was halved to `n` buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shrunk {
    subtable: usize,
    n: usize,
}

impl Index {
    /// Halve every subtable whose load is below [`SHRINK_LOAD`], as often
    /// as it stays below (a bulk delete that leaves 5 % is followed by
    /// inserts at once, so the whole way down is taken while it is
    /// there); returns the halvings whose memory
    /// [`Index::release_shrunk`] may release once no operation that
    /// started before this call is running.
    pub fn shrink_sparse(&self) -> Vec<Shrunk> {
        let mut out = Vec::new();
        for (i, st) in self.subtables.iter().enumerate() {
            while self.sparse(st, st.n.load(Ordering::Relaxed)) {
                let Some(n) = self.halve(st) else {
                    break;
                };
                out.push(Shrunk { subtable: i, n });
            }
        }
        out
    }

    /// Whether a subtable of `n` buckets is sparse enough to halve.
    fn sparse(&self, st: &Subtable, n: usize) -> bool {
        let entries = st.counters.entries.load(Ordering::Relaxed);
        n > self.initial_buckets
            && entries < st.shrink_below.load(Ordering::Relaxed)
            && (entries as f64) < SHRINK_LOAD * (n * ENTRIES_PER_BUCKET) as f64
    }

    /// Halve `st` if it is still sparse and every merged pair fits;
    /// returns the new size.
    fn halve(&self, st: &Subtable) -> Option<usize> {
        let first = st.bucket(0).lock();
        let n = st.n.load(Ordering::Acquire);
        // Above `n` lie copies of an abandoned growth: leave that rare
        // case to the growth that zeroes them.
        if !self.sparse(st, n) || st.dirty_above_n.load(Ordering::Relaxed) {
            return None;
        }
        let mut guards = Vec::with_capacity(n);
        guards.push(first);
        guards.extend((1..n).map(|c| st.bucket(c).lock()));
        let h = n / 2;
        let used = |g: &BucketGuard<'_, ENTRIES_PER_BUCKET>| {
            (0..ENTRIES_PER_BUCKET).filter(|&i| g.load(i) != 0).count()
        };
        if (0..h).any(|c| used(&guards[c]) + used(&guards[c + h]) > ENTRIES_PER_BUCKET) {
            let entries = st.counters.entries.load(Ordering::Relaxed);
            st.shrink_below.store(entries / 4 * 3, Ordering::Relaxed);
            st.counters
                .shrinks_cancelled
                .fetch_add(1, Ordering::Relaxed);
            return None;
        }
        for c in 0..h {
            let (low, high) = guards.split_at_mut(h);
            let (to, from) = (&mut low[c], &high[c]);
            let mut slot = 0;
            for i in 0..ENTRIES_PER_BUCKET {
                let e = from.load(i);
                if e == 0 {
                    continue;
                }
                // The pair fits (checked above), so a free slot is left.
                while slot < ENTRIES_PER_BUCKET && to.load(slot) != 0 {
                    slot += 1;
                }
                if slot < ENTRIES_PER_BUCKET {
                    to.store(slot, e);
                }
            }
        }
        // The upper half goes back to free (zero) entries, as a growth
        // expects of buckets above `n`.
        for g in &mut guards[h..] {
            for i in 0..ENTRIES_PER_BUCKET {
                g.store(i, 0);
            }
        }
        st.grow_at
            .store(grow_threshold(self.grow_load_factor, h), Ordering::Relaxed);
        st.n.store(h, Ordering::Release);
        st.counters.shrinks.fetch_add(1, Ordering::Relaxed);
        st.shrink_below.store(u64::MAX, Ordering::Relaxed);
        drop(guards);
        self.return_budget((h * BUCKET_BYTES) as u64);
        Some(h)
    }

    /// Give `bytes` of bucket budget back: what is now above the index's
    /// own share goes back to the log it was borrowed from.
    fn return_budget(&self, bytes: u64) {
        let after = self.bucket_bytes.fetch_sub(bytes, Ordering::Relaxed) - bytes;
        let still_over = (self.metadata_bytes + after).saturating_sub(self.max_bytes);
        let mut borrowed = self.borrowed_bytes.load(Ordering::Relaxed);
        while borrowed > still_over {
            match self.borrowed_bytes.compare_exchange_weak(
                borrowed,
                still_over,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if let Some(o) = self.overflow.get() {
                        o.give_back(borrowed - still_over);
                    }
                    break;
                }
                Err(cur) => borrowed = cur,
            }
        }
    }

    /// Drop the pages of a halved subtable's upper half, unless it grew
    /// back over it meanwhile (a later halving of the same subtable
    /// leaves it unused). Call only once every operation that started
    /// before the halving has finished (module docs).
    pub fn release_shrunk(&self, s: Shrunk) {
        let Some(st) = self.subtables.get(s.subtable) else {
            return;
        };
        // Bucket 0's lock keeps a growth from writing the upper half
        // while it is released.
        let _first = st.bucket(0).lock();
        if st.n.load(Ordering::Acquire) > s.n {
            return;
        }
        st.buckets.release(s.n, 2 * s.n);
    }
}
