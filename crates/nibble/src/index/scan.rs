//! SCAN over the index: a resumable cursor that survives resizes.
//!
//! Within a subtable the buckets are visited in index order. A resize
//! rebuilds the subtable (`index/grow.rs`): an entry may land in any
//! bucket, ahead of the cursor or behind it. So the cursor carries the
//! low [`GENERATION_BITS`] of the subtable's generation (its count of
//! completed resizes) next to the bucket, and a cursor whose generation
//! is stale restarts its subtable at bucket 0: an entry present for the
//! whole scan is returned at least once (entries visited before the
//! resize are returned again, as Redis's cursor may return a key twice).
//! A resize comes once per quarter more keys (or a bulk delete), so a
//! scan restarts a subtable a bounded number of times; every restart
//! re-reads at most that subtable. Each bucket is read with the seqlock
//! protocol.

use super::*;

/// A scan call stops after visiting this many buckets per requested
/// location, so that a mostly empty table does not make one call long.
const SCAN_VISITS_PER_COUNT: usize = 10;

/// Bits of the subtable generation a cursor carries, between the
/// subtable number (above) and the bucket (below). A cursor from 2^16
/// resizes ago reads as current: the scan then goes on from its bucket
/// (duplicates, or misses of entries the resizes moved behind it; only a
/// client that holds a cursor through 65,536 resizes of one subtable).
pub const GENERATION_BITS: u32 = 16;

impl Index {
    /// Redis-style SCAN: starting at `cursor` (0 to begin), appends the
    /// locations of some buckets to `out` and returns the cursor to pass
    /// next, or 0 when the scan is complete.
    ///
    /// Subtables are walked in order; within one, buckets in index order.
    /// A subtable that resized since the cursor was issued is walked again
    /// from its first bucket, so an entry present for the whole scan is
    /// returned at least once even if subtables grow or shrink in between
    /// (it may be returned more than once; entries added or removed
    /// meanwhile may or may not be). Each bucket is read with the seqlock
    /// protocol. One call stops once it has appended at least `count`
    /// locations, or visited `10 × count` buckets.
    pub fn scan(&self, cursor: u64, count: usize, out: &mut Vec<Loc>) -> u64 {
        let bucket_bits = self.cursor_bucket_bits;
        let bucket_mask = (1u64 << bucket_bits) - 1;
        let gen_mask = (1u64 << GENERATION_BITS) - 1;
        let sti = cursor >> (bucket_bits + GENERATION_BITS);
        if sti >= self.subtables.len() as u64 {
            return 0;
        }
        let mut sti = sti as usize;
        let mut gen = (cursor >> bucket_bits) & gen_mask;
        let mut v = (cursor & bucket_mask) as usize;
        let count = count.max(1);
        let start = out.len();
        let mut visited = 0;
        loop {
            let st = &self.subtables[sti];
            let (n, now) = self.scan_bucket(st, v, gen, out);
            if now != gen {
                // Resized since the cursor was issued (or this is the
                // subtable's first visit): walk it from the start.
                gen = now;
                v = 0;
                continue;
            }
            v += 1;
            visited += 1;
            if v >= n {
                sti += 1;
                v = 0;
                if sti == self.subtables.len() {
                    return 0;
                }
                gen = self.subtables[sti].generation.load(Ordering::Acquire) & gen_mask;
            }
            if out.len() - start >= count || visited >= count * SCAN_VISITS_PER_COUNT {
                return ((sti as u64) << (bucket_bits + GENERATION_BITS))
                    | (gen << bucket_bits)
                    | v as u64;
            }
        }
    }

    /// Appends the entries of bucket `v` (one consistent read, for the
    /// current size) if the subtable's generation is `gen` (low bits)
    /// and `v` is below its size; returns the size and the generation it
    /// saw (a different generation appends nothing). A `v` past the size
    /// under the right generation (a forged cursor) appends nothing.
    fn scan_bucket(&self, st: &Subtable, v: usize, gen: u64, out: &mut Vec<Loc>) -> (usize, u64) {
        let gen_mask = (1u64 << GENERATION_BITS) - 1;
        loop {
            let n = st.n.load(Ordering::Acquire);
            let now = st.generation.load(Ordering::Relaxed) & gen_mask;
            if now != gen || v >= n {
                return (n, now);
            }
            let bucket = st.bucket(v);
            let version = bucket.read_begin();
            let entries: [u64; ENTRIES_PER_BUCKET] = core::array::from_fn(|i| bucket.load(i));
            if bucket.read_validate(version)
                && st.n.load(Ordering::Relaxed) == n
                && st.generation.load(Ordering::Relaxed) & gen_mask == now
            {
                out.extend(entries.iter().filter(|&&e| e != 0).map(|e| e & LOC_MASK));
                return (n, now);
            }
        }
    }
}
