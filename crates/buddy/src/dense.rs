//! A conventional binary buddy allocator over one contiguous range of frames
//! (fos thesis §2.1.1).
//!
//! The range is a binary tree whose leaves are frames; a node is free when
//! both halves are. We keep, per order `k`, a doubly linked free list of the
//! blocks of `2^k` frames that are free and whose buddy is not, so that
//!
//! * `alloc(k)` takes the head of the first non-empty list at order `j >= k`
//!   (found with one `trailing_zeros` over a bit mask of non-empty lists) and
//!   splits it, pushing the upper halves onto lists `j-1 .. k`;
//! * `free(f, k)` looks at the buddy `f ^ 2^k`: if it heads a free block of the
//!   same order, it is unlinked and the pair merges into order `k+1`, and so on
//!   up to the maximum order.
//!
//! Both are `O(max_order)` with no search. The links live in side arrays
//! indexed by frame (like Linux's `struct page`), not inside the free frames:
//! writing links into free memory would fault in pages nobody asked for and
//! inflate the pool's RSS. The cost is 9 bytes per frame (0.2% of 4 KiB),
//! of address space: the arrays start zeroed (`calloc`, fresh zero pages)
//! and a link is read only for a block on a free list, which `push` wrote,
//! so a page of them becomes resident only once a free-list head lies in
//! it (a pool that is mostly one coalesced free block touches a few).
//!
//! Frame numbers are global ("pool offset / 4 KiB"); `base` must be aligned to
//! `2^max_order` frames so that local alignment equals global alignment. The
//! range may end with a partial maximum-order block: it is seeded as the
//! largest aligned blocks that fit, and coalescing never looks past the end.

use alloc::vec;
use alloc::vec::Vec;

use crate::{FrameNo, ORDER_SLOTS};

/// Link value meaning "no block".
const NIL: u32 = u32::MAX;
/// Set in `state[i]` when frame `i` heads a free block; the low bits hold its order.
const FREE_HEAD: u8 = 0x80;
const ORDER_MASK: u8 = 0x3f;

/// A dense buddy allocator over frames `[base, base + len)`.
pub struct DenseBuddy {
    base: FrameNo,
    len: u32,
    max_order: u32,
    state: Vec<u8>,
    next: Vec<u32>,
    prev: Vec<u32>,
    heads: [u32; ORDER_SLOTS],
    blocks_per_order: [u32; ORDER_SLOTS],
    /// Bit `k` set when the order-`k` list is non-empty.
    nonempty_mask: u32,
    free_frames: u64,
}

impl DenseBuddy {
    /// A buddy over `len` frames starting at global frame `base`, all free.
    ///
    /// # Panics
    /// If `base` is not aligned to `2^max_order`, if `len` does not fit in
    /// `u32`, or if `max_order >= ORDER_SLOTS` (construction-time programming
    /// errors, never reachable from allocation input).
    pub fn new_free(base: FrameNo, len: u64, max_order: u32) -> Self {
        let mut b = Self::new_empty(base, len, max_order);
        let mut at = 0u64;
        while at < len {
            let mut order = max_order;
            while at & ((1u64 << order) - 1) != 0 || at + (1u64 << order) > len {
                order -= 1;
            }
            b.push(at as u32, order);
            b.free_frames += 1u64 << order;
            at += 1u64 << order;
        }
        b
    }

    /// A buddy over `len` frames starting at `base`, with nothing free.
    pub fn new_empty(base: FrameNo, len: u64, max_order: u32) -> Self {
        assert!((max_order as usize) < ORDER_SLOTS, "max order too large");
        assert!(base & ((1u64 << max_order) - 1) == 0, "base not aligned");
        assert!(len < NIL as u64, "range too large for 32-bit links");
        let n = len as usize;
        DenseBuddy {
            base,
            len: len as u32,
            max_order,
            // Zeroed, not NIL: `next`/`prev` are read only for list members
            // (`push` sets both), and zeroed arrays cost no RSS until written.
            state: vec![0; n],
            next: vec![0; n],
            prev: vec![0; n],
            heads: [NIL; ORDER_SLOTS],
            blocks_per_order: [0; ORDER_SLOTS],
            nonempty_mask: 0,
            free_frames: 0,
        }
    }

    /// First global frame of the range.
    pub fn base(&self) -> FrameNo {
        self.base
    }

    /// Number of frames in the range.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// True when the range holds no frames at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when global frame `f` lies in this range.
    pub fn contains(&self, f: FrameNo) -> bool {
        f >= self.base && f - self.base < self.len as u64
    }

    /// Free frames in the range.
    pub fn free_frames(&self) -> u64 {
        self.free_frames
    }

    /// The order of the largest free block, if any.
    pub fn largest_free_order(&self) -> Option<u32> {
        (self.nonempty_mask != 0).then(|| 31 - self.nonempty_mask.leading_zeros())
    }

    /// Number of free blocks of each order.
    pub fn blocks_per_order(&self) -> &[u32; ORDER_SLOTS] {
        &self.blocks_per_order
    }

    /// Bytes of metadata this structure holds (side arrays).
    pub fn metadata_bytes(&self) -> u64 {
        self.len as u64 * (1 + 4 + 4) + core::mem::size_of::<Self>() as u64
    }

    /// Allocate a block of `2^order` frames; `None` when no block that large is free.
    #[inline]
    pub fn alloc(&mut self, order: u32) -> Option<FrameNo> {
        if order > self.max_order {
            return None;
        }
        let avail = self.nonempty_mask >> order;
        if avail == 0 {
            return None;
        }
        let mut j = order + avail.trailing_zeros();
        let idx = self.heads[j as usize];
        self.unlink(idx, j);
        while j > order {
            j -= 1;
            self.push(idx + (1u32 << j), j);
        }
        self.free_frames -= 1u64 << order;
        Some(self.base + idx as u64)
    }

    /// Free a block of `2^order` frames at global frame `f`, coalescing with
    /// free buddies. The caller guarantees the block was allocated from this
    /// buddy with this order (the allocation table checks it when enabled).
    #[inline]
    pub fn free(&mut self, f: FrameNo, order: u32) {
        debug_assert!(self.contains(f));
        debug_assert!(order <= self.max_order);
        let mut idx = (f - self.base) as u32;
        debug_assert_eq!(idx & ((1u32 << order) - 1), 0, "misaligned free");
        debug_assert_eq!(self.state[idx as usize] & FREE_HEAD, 0, "double free");
        self.free_frames += 1u64 << order;
        let mut k = order;
        while k < self.max_order {
            let buddy = idx ^ (1u32 << k);
            let fits = buddy as u64 + (1u64 << k) <= self.len as u64;
            if !fits || self.state[buddy as usize] != FREE_HEAD | k as u8 {
                break;
            }
            self.unlink(buddy, k);
            idx = idx.min(buddy);
            k += 1;
        }
        self.push(idx, k);
    }

    /// Every free block as `(global frame, order)`.
    pub fn free_blocks(&self) -> impl Iterator<Item = (FrameNo, u32)> + '_ {
        (0..=self.max_order).flat_map(move |k| {
            let mut cur = self.heads[k as usize];
            core::iter::from_fn(move || {
                if cur == NIL {
                    return None;
                }
                let here = cur;
                cur = self.next[here as usize];
                Some((self.base + here as u64, k))
            })
        })
    }

    /// Walk every list and check the structure's invariants; returns a
    /// description of the first violation. For tests.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let mut frames = 0u64;
        let mut covered = vec![false; self.len as usize];
        for (f, k) in self.free_blocks() {
            let i = (f - self.base) as usize;
            if i & ((1usize << k) - 1) != 0 {
                return Err("free block misaligned");
            }
            if self.state[i] != FREE_HEAD | k as u8 {
                return Err("state byte disagrees with list");
            }
            for c in covered.iter_mut().skip(i).take(1 << k) {
                if *c {
                    return Err("free blocks overlap");
                }
                *c = true;
            }
            if k < self.max_order {
                let b = i ^ (1usize << k);
                if b + (1usize << k) <= self.len as usize && self.state[b] == FREE_HEAD | k as u8 {
                    return Err("uncoalesced buddies");
                }
            }
            frames += 1u64 << k;
        }
        if frames != self.free_frames {
            return Err("free frame count mismatch");
        }
        Ok(())
    }

    #[inline]
    fn push(&mut self, idx: u32, order: u32) {
        let k = order as usize;
        let old = self.heads[k];
        self.next[idx as usize] = old;
        self.prev[idx as usize] = NIL;
        if old != NIL {
            self.prev[old as usize] = idx;
        }
        self.heads[k] = idx;
        self.state[idx as usize] = FREE_HEAD | (order as u8 & ORDER_MASK);
        self.blocks_per_order[k] += 1;
        self.nonempty_mask |= 1 << order;
    }

    #[inline]
    fn unlink(&mut self, idx: u32, order: u32) {
        let k = order as usize;
        let (p, n) = (self.prev[idx as usize], self.next[idx as usize]);
        if p == NIL {
            self.heads[k] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        }
        self.state[idx as usize] = 0;
        self.blocks_per_order[k] -= 1;
        if self.heads[k] == NIL {
            self.nonempty_mask &= !(1 << order);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_partial_tail_with_aligned_blocks() {
        let b = DenseBuddy::new_free(0, 13, 3);
        // 8 + 4 + 1
        let blocks: Vec<_> = b.free_blocks().collect();
        assert_eq!(b.free_frames(), 13);
        assert!(blocks.contains(&(0, 3)));
        assert!(blocks.contains(&(8, 2)));
        assert!(blocks.contains(&(12, 0)));
        b.check_invariants().unwrap();
    }

    #[test]
    fn split_and_coalesce_round_trip() {
        let mut b = DenseBuddy::new_free(64, 64, 6);
        let a = b.alloc(0).unwrap();
        let c = b.alloc(3).unwrap();
        let d = b.alloc(5).unwrap();
        assert_eq!(b.free_frames(), 64 - 1 - 8 - 32);
        b.check_invariants().unwrap();
        b.free(c, 3);
        b.free(a, 0);
        b.free(d, 5);
        assert_eq!(b.free_blocks().collect::<Vec<_>>(), vec![(64, 6)]);
        b.check_invariants().unwrap();
    }

    #[test]
    fn exhausts_and_reports_none() {
        let mut b = DenseBuddy::new_free(0, 8, 3);
        for _ in 0..8 {
            assert!(b.alloc(0).is_some());
        }
        assert_eq!(b.alloc(0), None);
        assert_eq!(b.largest_free_order(), None);
    }
}
