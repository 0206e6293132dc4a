//! Baseline 1: one buddy allocator behind one global lock (fos thesis
//! §2.1.1, "the original method ... was to place a big lock around the buddy
//! allocator"). Every allocation and free from every CPU takes the same lock.
//!
//! The lock is `xsync`'s because on the per-core backend the allocator is
//! shared between processes, where parking_lot's wake-ups are lost.

use xsync::Mutex;

use crate::check::AllocTable;
use crate::dense::DenseBuddy;
use crate::stats::{summarize_blocks, Stats};
use crate::{
    validate_free, AllocError, BuddyConfig, ConfigError, FrameAllocator, FrameNo, FreeError,
};

/// A single buddy allocator under a single mutex.
pub struct GlobalLockBuddy {
    zone: Mutex<DenseBuddy>,
    frames: u64,
    max_order: u32,
    check: Option<AllocTable>,
}

impl GlobalLockBuddy {
    /// Build over frames `0..frames`.
    pub fn new(frames: u64, config: &BuddyConfig) -> Result<Self, ConfigError> {
        let max_order = config.resolve_max_order(frames, config.heaps_or_cpus())?;
        Ok(GlobalLockBuddy {
            zone: Mutex::new(DenseBuddy::new_free(0, frames, max_order)),
            frames,
            max_order,
            check: config
                .check_frees
                .then(|| AllocTable::new(frames, max_order)),
        })
    }
}

impl FrameAllocator for GlobalLockBuddy {
    fn name(&self) -> &'static str {
        "global-lock"
    }
    fn total_frames(&self) -> u64 {
        self.frames
    }
    fn max_order(&self) -> u32 {
        self.max_order
    }
    fn num_heaps(&self) -> usize {
        1
    }

    fn alloc_on(&self, _heap: usize, order: u32) -> Result<FrameNo, AllocError> {
        if order > self.max_order {
            return Err(AllocError::OrderTooLarge {
                order,
                max_order: self.max_order,
            });
        }
        let f = self
            .zone
            .lock()
            .alloc(order)
            .ok_or(AllocError::OutOfMemory { order })?;
        if let Some(t) = &self.check {
            t.on_alloc(f, order)
                .expect("allocator handed out a live frame");
        }
        Ok(f)
    }

    fn free_on(&self, _heap: usize, frame: FrameNo, order: u32) -> Result<(), FreeError> {
        validate_free(frame, order, self.frames, self.max_order)?;
        if let Some(t) = &self.check {
            t.on_free(frame, order)?;
        }
        self.zone.lock().free(frame, order);
        Ok(())
    }

    fn split(&self, frame: FrameNo, order: u32, into_order: u32) -> Result<(), FreeError> {
        crate::split_checked(
            self.check.as_ref(),
            (frame, order, into_order),
            self.frames,
            self.max_order,
        )
    }

    fn stats(&self) -> Stats {
        let zone = self.zone.lock();
        let mut s = Stats {
            allocator: self.name(),
            total_frames: self.frames,
            free_frames: zone.free_frames(),
            max_order: self.max_order,
            metadata_bytes: zone.metadata_bytes()
                + self.check.as_ref().map_or(0, |t| t.metadata_bytes()),
            ..Default::default()
        };
        let blocks = zone.free_blocks().collect();
        drop(zone);
        summarize_blocks(&mut s, &[blocks]);
        s
    }

    fn quiesce(&self) {}
}
