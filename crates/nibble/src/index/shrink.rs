//! Shrinking: rebuilding a sparse subtable smaller in place, so the
//! index's memory follows the key count down as well as up (issue 26).
//!
//! The dissertation's index only grows (§4.3): a store that once held
//! many small keys keeps the index they needed after they are deleted,
//! and on a small store that is the largest fixed overhead left (after
//! `memlab server --quick`'s churn, 4 MiB of index for 86k keys that need
//! 1 MiB, 6 % of the live data). Redis shrinks its dicts for the same
//! reason (`htNeedsResize`: fill under 10 %).
//!
//! A shrink is the growth's rebuild (`index/grow.rs`) to a smaller size,
//! under the same protocol: lock every bucket of the subtable in
//! ascending order, re-check, place every entry in a scratch array of the
//! new size, write it over the locked buckets, empty the buckets above
//! the new size, bump the generation, publish the size with a release
//! store, unlock. The new size puts the subtable at [`SHRINK_TO_LOAD`]
//! (never under the initial size). If a neighbourhood of the smaller
//! table would overflow, nothing has changed yet: the shrink is
//! cancelled, and the subtable is tried again only once deletes have
//! taken its count below 3/4 of what it was (so a subtable that cannot
//! shrink is not locked whole on every step). Readers and writers
//! re-check `n` after their buckets (as for growth), so one that used the
//! old size retries; a SCAN restarts the subtable (`index/scan.rs`).
//!
//! The buckets above the new size are not unmapped at once: a reader that
//! loaded the old `n` may still be reading them, and `MADV_DONTNEED`
//! would reset their version words to 0, which a later growth could
//! count back up to a version that reader saw (a seqlock ABA). So a
//! shrink returns a [`Shrunk`] ticket; the caller (a compaction worker)
//! stamps it with the epoch clock and calls [`Index::release_shrunk`]
//! once every operation older than the stamp has finished. The release
//! holds bucket 0's lock (which serialises resizes) and skips a subtable
//! that grew back meanwhile. The budget is given back at the shrink (the
//! index's own share first, then what it borrowed from the log), so the
//! store's accounting follows the key count at once and RSS within a
//! decay step.
//!
//! When: a subtable whose entries fall below [`SHRINK_LOAD`] of its
//! slots, above the initial size. After the shrink its load is
//! [`SHRINK_TO_LOAD`], far from both the shrink load and the growth load
//! (0.85), so the two cannot alternate.
//! The compaction worker looks on every step, under load as when idle:
//! a shrink locks the whole subtable as a growth does, and like a growth
//! it comes once per large change of the key count, so it costs the
//! writers what growth costs them. Waiting for the clients to fall quiet
//! would miss the common case of a bulk delete followed by new inserts:
//! the index would keep the size of the deleted keys' peak and grow
//! back from there (`memlab frag`'s 64→128 pair: 32 MiB of index for
//! 1.15 M keys that need 10 MiB).

use super::*;

/// A subtable shrinks when its entries fill less than this share of its
/// slots (Redis: 10 %).
pub const SHRINK_LOAD: f64 = 0.2;

/// The load a shrink leaves a subtable at: room for the inserts that
/// usually follow a bulk delete to grow it by a few quarters, not by
/// every quarter, and a rebuild that rarely finds a neighbourhood full.
pub const SHRINK_TO_LOAD: f64 = 0.5;

/// A shrunk subtable whose buckets above its new size can be released
/// (see the module docs): subtable `subtable` went from `from` buckets
/// to `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shrunk {
    subtable: usize,
    n: usize,
    from: usize,
}

impl Index {
    /// Shrink every subtable whose load is below [`SHRINK_LOAD`]; returns
    /// the shrinks whose memory [`Index::release_shrunk`] may release once
    /// no operation that started before this call is running.
    pub fn shrink_sparse(&self) -> Vec<Shrunk> {
        let mut out = Vec::new();
        for (i, st) in self.subtables.iter().enumerate() {
            while self.sparse(st, st.n.load(Ordering::Relaxed)) {
                let Some((from, n)) = self.shrink(st) else {
                    break;
                };
                out.push(Shrunk {
                    subtable: i,
                    n,
                    from,
                });
            }
        }
        out
    }

    /// Whether a subtable of `n` buckets is sparse enough to shrink.
    fn sparse(&self, st: &Subtable, n: usize) -> bool {
        let entries = st.counters.entries.load(Ordering::Relaxed);
        n > self.initial_buckets
            && entries < st.shrink_below.load(Ordering::Relaxed)
            && (entries as f64) < SHRINK_LOAD * (n * ENTRIES_PER_BUCKET) as f64
    }

    /// Shrink `st` to [`SHRINK_TO_LOAD`] if it is still sparse and every
    /// entry fits; returns the old and the new size.
    fn shrink(&self, st: &Subtable) -> Option<(usize, usize)> {
        let first = st.bucket(0).lock();
        let n = st.n.load(Ordering::Acquire);
        if !self.sparse(st, n) {
            return None;
        }
        let mut guards = Vec::with_capacity(n);
        guards.push(first);
        guards.extend((1..n).map(|c| st.bucket(c).lock()));
        let entries = st.counters.entries.load(Ordering::Relaxed);
        let m = ((entries as f64 / (SHRINK_TO_LOAD * ENTRIES_PER_BUCKET as f64)).ceil() as usize)
            .max(self.initial_buckets);
        if m >= n {
            return None;
        }
        let mut mismatches = 0;
        let Some(scratch) = self.rebuild(&guards, m, &mut mismatches) else {
            st.shrink_below.store(entries / 4 * 3, Ordering::Relaxed);
            st.counters
                .shrinks_cancelled
                .fetch_add(1, Ordering::Relaxed);
            return None;
        };
        // The buckets above `m` go back to free (zero) entries, as a
        // growth expects of buckets above `n`.
        self.publish_rebuild(st, guards, scratch, mismatches, m);
        st.counters.shrinks.fetch_add(1, Ordering::Relaxed);
        self.return_budget(((n - m) * BUCKET_BYTES) as u64);
        Some((n, m))
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

    /// Drop the pages of a shrunk subtable's buckets above its new size,
    /// unless it grew back over them meanwhile (a later shrink of the
    /// same subtable leaves them unused). Call only once every operation
    /// that started before the shrink has finished (module docs).
    pub fn release_shrunk(&self, s: Shrunk) {
        let Some(st) = self.subtables.get(s.subtable) else {
            return;
        };
        // Bucket 0's lock keeps a growth from writing those buckets
        // while they are released.
        let _first = st.bucket(0).lock();
        if st.n.load(Ordering::Acquire) > s.n {
            return;
        }
        st.buckets.release(s.n, s.from);
    }
}
