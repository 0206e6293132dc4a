//! The sparse buddy structure a heap uses for *foreign* frames (fos thesis
//! §4.1.1): frames it holds but does not own.
//!
//! A heap owns a few contiguous ranges and manages them with the dense
//! [`DenseBuddy`](crate::dense::DenseBuddy). Frames of other owners arrive
//! when a client frees them here or when a peer lends them; their number is
//! bounded by the high watermark, far below the size of the pool, so a dense
//! structure over the whole pool per heap would waste memory. Instead each
//! order keeps an ordered set of the free block starts. Buddies still
//! coalesce (a block's buddy lies in the same ownership range, since ranges
//! are aligned to the maximum order), and a whole owner's range can be
//! selected with one range query, which is how frames are sent home.

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use crate::{FrameNo, ORDER_SLOTS};

/// Approximate bytes a `BTreeSet<u64>` spends per element (node payload plus
/// amortised node headers); used only for the metadata figure in statistics.
const BTREE_BYTES_PER_ENTRY: u64 = 16;

/// Free foreign blocks, one ordered set per order.
pub struct SparseBuddy {
    max_order: u32,
    sets: Vec<BTreeSet<FrameNo>>,
    nonempty_mask: u32,
    free_frames: u64,
    blocks: u64,
}

impl SparseBuddy {
    /// An empty structure for blocks up to `2^max_order` frames.
    pub fn new(max_order: u32) -> Self {
        assert!((max_order as usize) < ORDER_SLOTS, "max order too large");
        SparseBuddy {
            max_order,
            sets: (0..=max_order).map(|_| BTreeSet::new()).collect(),
            nonempty_mask: 0,
            free_frames: 0,
            blocks: 0,
        }
    }

    /// Free frames held.
    pub fn free_frames(&self) -> u64 {
        self.free_frames
    }

    /// Number of free blocks held.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The order of the largest free block, if any.
    pub fn largest_free_order(&self) -> Option<u32> {
        (self.nonempty_mask != 0).then(|| 31 - self.nonempty_mask.leading_zeros())
    }

    /// Approximate bytes of metadata.
    pub fn metadata_bytes(&self) -> u64 {
        self.blocks * BTREE_BYTES_PER_ENTRY + core::mem::size_of::<Self>() as u64
    }

    /// Take a block of `2^order` frames, splitting a larger one if needed.
    pub fn alloc(&mut self, order: u32) -> Option<FrameNo> {
        if order > self.max_order {
            return None;
        }
        let avail = self.nonempty_mask >> order;
        if avail == 0 {
            return None;
        }
        let mut j = order + avail.trailing_zeros();
        let f = self.remove_first(j)?;
        while j > order {
            j -= 1;
            self.insert(f + (1u64 << j), j);
        }
        self.free_frames -= 1u64 << order;
        Some(f)
    }

    /// Add a free block, coalescing with buddies already held.
    pub fn free(&mut self, f: FrameNo, order: u32) {
        self.free_frames += 1u64 << order;
        let (mut f, mut k) = (f, order);
        while k < self.max_order && self.remove(f ^ (1u64 << k), k) {
            f &= !(1u64 << k);
            k += 1;
        }
        self.insert(f, k);
    }

    /// Remove and return every block that lies in `[lo, hi)`.
    pub fn take_range(&mut self, lo: FrameNo, hi: FrameNo) -> Vec<(FrameNo, u32)> {
        let mut out = Vec::new();
        for k in 0..=self.max_order {
            let found: Vec<FrameNo> = self.sets[k as usize].range(lo..hi).copied().collect();
            for f in found {
                self.remove(f, k);
                self.free_frames -= 1u64 << k;
                out.push((f, k));
            }
        }
        out
    }

    /// Remove and return the largest block held.
    pub fn pop_largest(&mut self) -> Option<(FrameNo, u32)> {
        let k = self.largest_free_order()?;
        let f = self.remove_first(k)?;
        self.free_frames -= 1u64 << k;
        Some((f, k))
    }

    /// Every free block as `(frame, order)`.
    pub fn free_blocks(&self) -> impl Iterator<Item = (FrameNo, u32)> + '_ {
        self.sets
            .iter()
            .enumerate()
            .flat_map(|(k, s)| s.iter().map(move |&f| (f, k as u32)))
    }

    fn insert(&mut self, f: FrameNo, k: u32) {
        self.sets[k as usize].insert(f);
        self.nonempty_mask |= 1 << k;
        self.blocks += 1;
    }

    fn remove(&mut self, f: FrameNo, k: u32) -> bool {
        let set = &mut self.sets[k as usize];
        if !set.remove(&f) {
            return false;
        }
        if set.is_empty() {
            self.nonempty_mask &= !(1 << k);
        }
        self.blocks -= 1;
        true
    }

    fn remove_first(&mut self, k: u32) -> Option<FrameNo> {
        let set = &mut self.sets[k as usize];
        let f = set.pop_first()?;
        if set.is_empty() {
            self.nonempty_mask &= !(1 << k);
        }
        self.blocks -= 1;
        Some(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesces_buddies() {
        let mut s = SparseBuddy::new(4);
        s.free(1000 * 16 + 1, 0);
        s.free(1000 * 16, 0);
        s.free(1000 * 16 + 2, 1);
        assert_eq!(s.free_blocks().collect::<Vec<_>>(), vec![(16000, 2)]);
        assert_eq!(s.free_frames(), 4);
    }

    #[test]
    fn alloc_splits_and_take_range() {
        let mut s = SparseBuddy::new(4);
        s.free(32, 4);
        assert_eq!(s.alloc(0), Some(32));
        assert_eq!(s.free_frames(), 15);
        s.free(64, 2);
        let home = s.take_range(32, 48);
        assert_eq!(home.iter().map(|&(_, k)| 1u64 << k).sum::<u64>(), 15);
        assert_eq!(s.free_blocks().collect::<Vec<_>>(), vec![(64, 2)]);
        assert_eq!(s.pop_largest(), Some((64, 2)));
        assert_eq!(s.free_frames(), 0);
    }
}
