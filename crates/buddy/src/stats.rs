//! Statistics, and the *distributed fragmentation* figure (fos thesis §2.1,
//! §4.1.3): free frames that one global buddy allocator would have
//! coalesced into a larger block, but that cannot be coalesced because the
//! pieces sit in different heaps.
//!
//! We compute it exactly from a snapshot of every free block: feed all of
//! them into a fresh sparse buddy (which coalesces as a single global buddy
//! would), then count the frames of every ideal block that is not itself one
//! of the snapshot's blocks. Within one heap buddies are always coalesced, so
//! an ideal block made of several real ones is split across holders.

use alloc::collections::BTreeSet;
use alloc::vec;
use alloc::vec::Vec;

use crate::sparse::SparseBuddy;
use crate::{FrameNo, ORDER_SLOTS};

/// Per-heap figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Heap id.
    pub heap: usize,
    /// Frames this heap owns (its ownership ranges).
    pub owned_frames: u64,
    /// Free frames it holds that it owns.
    pub free_owned_frames: u64,
    /// Free frames it holds that other heaps own.
    pub free_foreign_frames: u64,
    /// Largest free block it holds.
    pub largest_free_order: Option<u32>,
    /// Successful borrows (grants with frames) received.
    pub borrows: u64,
    /// Borrow attempts that came back empty.
    pub borrow_failures: u64,
    /// Frames received through borrowing.
    pub frames_borrowed: u64,
    /// Frames lent to peers.
    pub frames_lent: u64,
    /// Frames sent home to their owners (high watermark or quiesce).
    pub frames_returned: u64,
    /// Frees of foreign frames forwarded to the owner instead of kept.
    pub forwarded_frees: u64,
    /// Current low watermark, frames.
    pub low_watermark: u64,
    /// Current high watermark, frames.
    pub high_watermark: u64,
    /// Current estimate of the balanced share of free frames per heap.
    pub est_share: u64,
    /// Allocations served.
    pub allocs: u64,
    /// Frees accepted.
    pub frees: u64,
}

/// An allocator-wide snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Allocator name.
    pub allocator: &'static str,
    /// Frames managed.
    pub total_frames: u64,
    /// Free frames held by heaps, caches and the zone.
    pub free_frames: u64,
    /// Free frames in messages not yet delivered.
    pub in_flight_frames: u64,
    /// Maximum order.
    pub max_order: u32,
    /// Free blocks of each order, over all holders (index = order).
    pub free_blocks_by_order: Vec<u64>,
    /// Largest free block anywhere.
    pub largest_free_order: Option<u32>,
    /// Free frames a single global buddy would have coalesced further.
    pub distributed_fragmentation_frames: u64,
    /// Bytes of allocator metadata (lists, sets, tables).
    pub metadata_bytes: u64,
    /// Per-heap figures (empty for allocators without heaps).
    pub heaps: Vec<HeapStats>,
}

impl Stats {
    /// Sum of a per-heap counter.
    pub fn sum(&self, f: impl Fn(&HeapStats) -> u64) -> u64 {
        self.heaps.iter().map(f).sum()
    }

    /// True when every frame is free and held as a maximum-order block (or
    /// as the largest aligned blocks that fit a partial tail).
    pub fn fully_coalesced(&self) -> bool {
        self.free_frames == self.total_frames && self.distributed_fragmentation_frames == 0
    }
}

/// Fill the block-level fields of `stats` from the free blocks of every
/// holder. `holders[i]` lists the free blocks of holder `i`.
pub fn summarize_blocks(stats: &mut Stats, holders: &[Vec<(FrameNo, u32)>]) {
    let mut by_order = vec![0u64; ORDER_SLOTS];
    let mut actual = BTreeSet::new();
    let mut ideal = SparseBuddy::new(stats.max_order);
    for blocks in holders {
        for &(f, k) in blocks {
            by_order[k as usize] += 1;
            actual.insert((f, k));
            ideal.free(f, k);
        }
    }
    by_order.truncate(stats.max_order as usize + 1);
    stats.largest_free_order = by_order.iter().rposition(|&n| n > 0).map(|k| k as u32);
    stats.free_blocks_by_order = by_order;
    stats.distributed_fragmentation_frames = ideal
        .free_blocks()
        .filter(|b| !actual.contains(b))
        .map(|(_, k)| 1u64 << k)
        .sum();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragmentation_counts_split_buddies_only() {
        let mut s = Stats {
            max_order: 3,
            ..Default::default()
        };
        // Heap 0 holds [0,4), heap 1 holds [4,8): one order-3 block split in two.
        // Heap 1 also holds [8,16) whole.
        summarize_blocks(&mut s, &[vec![(0, 2)], vec![(4, 2), (8, 3)]]);
        assert_eq!(s.distributed_fragmentation_frames, 8);
        assert_eq!(s.largest_free_order, Some(3));
        assert_eq!(s.free_blocks_by_order, vec![0, 0, 2, 1]);
    }
}
