//! SCAN over the index: a resumable cursor that survives growth
//! (Redis's reverse-binary cursor, per subtable).
//!
//! Buckets are visited in reverse-binary order of their index; a doubling
//! splits bucket `c` into `c` and `c + n` only, so the buckets not yet
//! visited stay unvisited and an entry present for the whole scan is
//! returned at least once. Each bucket is read with the seqlock protocol.

use super::*;

/// A scan call stops after visiting this many buckets per requested
/// location, so that a mostly empty table does not make one call long.
const SCAN_VISITS_PER_COUNT: usize = 10;

/// Redis's reverse-binary cursor increment: the next bucket index after
/// `v` among `mask + 1` buckets, counting with the bits reversed, so that
/// the buckets not yet visited stay unvisited when the table doubles.
#[inline]
fn next_cursor(v: u64, mask: u64) -> u64 {
    (v | !mask).reverse_bits().wrapping_add(1).reverse_bits()
}

impl Index {
    /// Redis-style SCAN: starting at `cursor` (0 to begin), appends the
    /// locations of some buckets to `out` and returns the cursor to pass
    /// next, or 0 when the scan is complete.
    ///
    /// Subtables are walked in order; within one, buckets are visited in
    /// reverse-binary order of their index. A doubling splits bucket `c`
    /// into `c` and `c + n` only, so an entry present for the whole scan is
    /// returned at least once even if subtables grow in between (it may be
    /// returned more than once; entries added or removed meanwhile may or
    /// may not be). Each bucket is read with the seqlock protocol. One call
    /// stops once it has appended at least `count` locations, or visited
    /// `10 × count` buckets.
    pub fn scan(&self, cursor: u64, count: usize, out: &mut Vec<Loc>) -> u64 {
        let bucket_mask = (1u64 << self.cursor_bucket_bits) - 1;
        let mut sti = (cursor >> self.cursor_bucket_bits) as usize;
        let mut v = cursor & bucket_mask;
        if sti >= self.subtables.len() {
            return 0;
        }
        let count = count.max(1);
        let start = out.len();
        let mut visited = 0;
        loop {
            let mask = self.scan_bucket(&self.subtables[sti], v, out);
            v = next_cursor(v, mask);
            visited += 1;
            if v == 0 {
                sti += 1;
                if sti == self.subtables.len() {
                    return 0;
                }
            }
            if out.len() - start >= count || visited >= count * SCAN_VISITS_PER_COUNT {
                return ((sti as u64) << self.cursor_bucket_bits) | v;
            }
        }
    }

    /// Appends the entries of bucket `v mod n` (one consistent read, for
    /// the current `n`) and returns the mask `n - 1` it used.
    fn scan_bucket(&self, st: &Subtable, v: u64, out: &mut Vec<Loc>) -> u64 {
        loop {
            let n = st.n.load(Ordering::Acquire);
            let mask = n as u64 - 1;
            let bucket = st.bucket((v & mask) as usize);
            let version = bucket.read_begin();
            let entries: [u64; ENTRIES_PER_BUCKET] = core::array::from_fn(|i| bucket.load(i));
            if bucket.read_validate(version) && st.n.load(Ordering::Relaxed) == n {
                out.extend(entries.iter().filter(|&&e| e != 0).map(|e| e & LOC_MASK));
                return mask;
            }
        }
    }
}
