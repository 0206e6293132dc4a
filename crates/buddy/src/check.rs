//! The allocation table: one byte per frame recording which frames head a
//! live allocation and of what order, so that bad frees are caught before
//! they corrupt an allocator.
//!
//! A distributed allocator cannot catch a double free by itself: the second
//! free may arrive at a heap that never saw the first (the frame is foreign
//! there). The table is shared by all heaps but touched one frame at a time
//! with single atomic operations, so it adds no lock and no shared hot line
//! beyond the frame being freed. It is on by default in debug builds and off
//! in release builds (`BuddyConfig::check_frees`), like Linux's
//! `CONFIG_DEBUG_VM` page checks.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU8, Ordering};

use crate::{FrameNo, FreeError};

/// Set in a frame's byte while it heads a live allocation; low bits = order.
const LIVE_HEAD: u8 = 0x80;

/// Per-frame allocation state.
pub struct AllocTable {
    state: Box<[AtomicU8]>,
    max_order: u32,
}

impl AllocTable {
    /// A table for `frames` frames, none allocated.
    pub fn new(frames: u64, max_order: u32) -> Self {
        let state: Vec<AtomicU8> = (0..frames).map(|_| AtomicU8::new(0)).collect();
        AllocTable {
            state: state.into_boxed_slice(),
            max_order,
        }
    }

    /// Bytes used by the table.
    pub fn metadata_bytes(&self) -> u64 {
        self.state.len() as u64
    }

    /// Record that `f` now heads a live allocation of `order`.
    ///
    /// Returns an error if the allocator handed out a frame that is already
    /// live, which would be an allocator bug.
    pub fn on_alloc(&self, f: FrameNo, order: u32) -> Result<(), FreeError> {
        let prev = self.state[f as usize].swap(LIVE_HEAD | order as u8, Ordering::AcqRel);
        if prev != 0 {
            return Err(FreeError::AlreadyAllocated { frame: f });
        }
        Ok(())
    }

    /// Check and record the free of `(f, order)`.
    pub fn on_free(&self, f: FrameNo, order: u32) -> Result<(), FreeError> {
        let want = LIVE_HEAD | order as u8;
        match self.state[f as usize].compare_exchange(want, 0, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(actual) if actual & LIVE_HEAD != 0 => Err(FreeError::WrongOrder {
                frame: f,
                given: order,
                allocated: (actual & !LIVE_HEAD) as u32,
            }),
            Err(_) => Err(self.explain_not_live(f)),
        }
    }

    /// Turn the live allocation `(f, order)` into live allocations of
    /// order `into` covering the same frames (`FrameAllocator::split`).
    pub fn on_split(&self, f: FrameNo, order: u32, into: u32) -> Result<(), FreeError> {
        self.on_free(f, order)?;
        let end = f + (1u64 << order);
        let mut g = f;
        while g < end {
            self.state[g as usize].store(LIVE_HEAD | into as u8, Ordering::Release);
            g += 1u64 << into;
        }
        Ok(())
    }

    /// `f` heads no live allocation: either it lies inside one, or it is free.
    fn explain_not_live(&self, f: FrameNo) -> FreeError {
        for k in 1..=self.max_order {
            let head = f & !((1u64 << k) - 1);
            let s = self.state[head as usize].load(Ordering::Acquire);
            if s & LIVE_HEAD != 0 && (s & !LIVE_HEAD) as u32 >= k {
                return FreeError::NotAllocationStart { frame: f, head };
            }
        }
        FreeError::NotAllocated { frame: f }
    }
}
