//! The live-bytes table (dissertation §4.4-4.5), striped by CPU.
//!
//! Every PUT adds its object's size to the live bytes of the segment it
//! appended to and subtracts the old version's size from the segment that
//! held it; DEL subtracts; compaction moves counts from victims to its
//! destinations. Compaction reads the counts to score segments
//! (cost-benefit, `(1-u)·age/(1+u)`) and `Stats` sums them.
//!
//! The paper keeps one atomic counter per segment. Under skewed updates
//! that counter is shared: a hot key's previous version usually sits in a
//! segment another CPU is still appending to, so that CPU's add and this
//! CPU's subtract pull one cache line back and forth on every update, a
//! large share of a skewed write's cost from two threads on. Here each counter is split
//! into one signed cell per *stripe*; a CPU only writes its own stripe's
//! cells, and the stripes are separate arrays (stripe-major), so two CPUs
//! never write one line. A segment's live bytes are the sum over stripes.
//! A stripe may go negative (bytes added on one CPU, freed on another);
//! the sum may not, at rest.
//!
//! Reads are not atomic snapshots: a sum taken while objects move can be
//! off by the objects in flight, and is clamped at zero. Every reader
//! treats the count as a heuristic already (victim selection, its
//! prechecks, statistics); none decides correctness by it. At rest the sum
//! is exact. Cells are reset only when a segment is created, when no
//! operation can still subtract from it: its previous life was retired
//! through the epoch table, which outwaits every writer that could have
//! unlinked one of its objects.
//!
//! Memory: `stripes x slots x 8` bytes of address space, stripes = CPUs
//! up to [`MAX_STRIPES`], no more than the 128-byte padded counter per
//! slot it replaces. The cells start as zeroed memory (`calloc`, fresh
//! zero pages), so only the pages of slots in use become resident: the
//! memory layer hands out the lowest free slot first, which keeps them
//! few on a store far below its capacity.

use std::sync::atomic::{AtomicI64, Ordering};

/// Most stripes: with more CPUs than this, CPUs share stripes (only those
/// that run at once on the same segments contend).
pub const MAX_STRIPES: usize = 16;

/// Cells per cache line pair (128 bytes): each stripe's array is padded to
/// a multiple of it so no two stripes share a line (or an adjacent-line
/// prefetch pair).
const CELLS_PER_LINE_PAIR: usize = 16;

/// Live bytes of every segment slot, one signed cell per stripe.
pub struct LiveBytes {
    stripes: usize,
    /// Cells per stripe: the slot count rounded up to a line pair.
    stride: usize,
    cells: Box<[AtomicI64]>,
}

/// `n` cells at zero, allocated zeroed: no page is written (or becomes
/// resident) until a cell in it is.
fn zeroed_cells(n: usize) -> Box<[AtomicI64]> {
    // `vec![0; n]` allocates with `alloc_zeroed` and writes nothing.
    let raw = Box::into_raw(vec![0i64; n].into_boxed_slice()) as *mut [AtomicI64];
    // SAFETY: `AtomicI64` has the size, alignment and bit validity of
    // `i64`, so the zeroed `i64` slice is a valid `[AtomicI64]` of the
    // same length and layout; `raw` came from `Box::into_raw` and is
    // owned by nobody else, so the new box takes it over.
    unsafe { Box::from_raw(raw) }
}

impl LiveBytes {
    /// A table for `slots` segment slots with `stripes` stripes (clamped to
    /// `1..=MAX_STRIPES`).
    pub fn new(slots: usize, stripes: usize) -> LiveBytes {
        let stripes = stripes.clamp(1, MAX_STRIPES);
        let stride = slots.div_ceil(CELLS_PER_LINE_PAIR) * CELLS_PER_LINE_PAIR;
        LiveBytes {
            stripes,
            stride,
            cells: zeroed_cells(stripes * stride),
        }
    }

    /// Bytes the table occupies.
    pub fn bytes(&self) -> u64 {
        (self.cells.len() * core::mem::size_of::<AtomicI64>()) as u64
    }

    /// Number of stripes.
    #[cfg(test)]
    pub fn stripes(&self) -> usize {
        self.stripes
    }

    /// Add `delta` bytes (negative to subtract) to segment `seg`, in the
    /// calling CPU's stripe.
    #[inline]
    pub fn add(&self, seg: u32, delta: i64) {
        let stripe = topology::current_cpu() % self.stripes;
        self.add_in(stripe, seg, delta);
    }

    /// [`LiveBytes::add`] in a given stripe (tests; callers that know their
    /// CPU).
    #[inline]
    pub fn add_in(&self, stripe: usize, seg: u32, delta: i64) {
        self.cells[stripe % self.stripes * self.stride + seg as usize]
            .fetch_add(delta, Ordering::Relaxed);
    }

    /// The live bytes of `seg`: the sum over stripes, clamped at zero.
    pub fn get(&self, seg: u32) -> u64 {
        let sum: i64 = (0..self.stripes)
            .map(|s| self.cells[s * self.stride + seg as usize].load(Ordering::Relaxed))
            .sum();
        sum.max(0) as u64
    }

    /// Zero `seg` in every stripe (a new segment in the slot).
    pub fn reset(&self, seg: u32) {
        for s in 0..self.stripes {
            self.cells[s * self.stride + seg as usize].store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_sum_and_clamp() {
        let t = LiveBytes::new(5, 3);
        assert_eq!(t.stripes(), 3);
        assert_eq!(t.bytes(), 3 * 16 * 8);
        t.add_in(0, 2, 1000);
        t.add_in(1, 2, -400);
        t.add_in(2, 2, 24);
        t.add_in(1, 4, 7);
        assert_eq!(t.get(2), 624);
        assert_eq!(t.get(4), 7);
        assert_eq!(t.get(0), 0);
        // A stripe ahead of another (a subtract seen before its add).
        t.add_in(0, 3, -50);
        assert_eq!(t.get(3), 0);
        t.add_in(1, 3, 80);
        assert_eq!(t.get(3), 30);
        t.reset(2);
        assert_eq!(t.get(2), 0);
        assert_eq!(t.get(4), 7);
    }

    #[test]
    fn stripe_count_is_clamped() {
        assert_eq!(LiveBytes::new(1, 0).stripes(), 1);
        assert_eq!(LiveBytes::new(1, 1000).stripes(), MAX_STRIPES);
    }

    #[test]
    fn concurrent_adds_sum_exactly_at_rest() {
        let t = LiveBytes::new(64, 4);
        std::thread::scope(|s| {
            for th in 0..4i64 {
                let t = &t;
                s.spawn(move || {
                    for i in 0..10_000i64 {
                        let seg = (i % 64) as u32;
                        t.add(seg, 100 + th);
                        t.add_in((i + th) as usize, seg, -(100 + th));
                        t.add(seg, 1);
                    }
                });
            }
        });
        let total: u64 = (0..64).map(|s| t.get(s)).sum();
        assert_eq!(total, 4 * 10_000);
    }
}
