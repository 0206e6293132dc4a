//! Baseline 2: Linux-style — one zone buddy behind one lock, plus per-CPU
//! caches of single frames (fos thesis §2.1.1: "Linux has addressed this
//! problem by using per-cpu free lists ... Linux only caches single-page
//! ranges").
//!
//! As in `mm/page_alloc.c`, an order-0 allocation pops the CPU's list; an
//! empty list refills `batch` frames from the zone under the zone lock; a
//! free pushes onto the list and, when the list exceeds `high`, drains
//! `batch` frames back. Larger orders always take the zone lock. Linux
//! protects its per-CPU lists by disabling interrupts; user threads can
//! migrate, so each list here has its own (normally uncontended) mutex.
//!
//! The zone and list locks are `xsync`'s because on the per-core backend
//! the allocator is shared between processes, where parking_lot's wake-ups
//! are lost.

use alloc::vec::Vec;
use crossbeam_utils::CachePadded;
use xsync::Mutex;

use crate::check::AllocTable;
use crate::dense::DenseBuddy;
use crate::stats::{summarize_blocks, Stats};
use crate::{
    validate_free, AllocError, BuddyConfig, ConfigError, FrameAllocator, FrameNo, FreeError,
};

/// Zone buddy + per-CPU order-0 caches.
pub struct PcpBuddy {
    zone: CachePadded<Mutex<DenseBuddy>>,
    pcp: Vec<CachePadded<Mutex<Vec<FrameNo>>>>,
    frames: u64,
    max_order: u32,
    batch: usize,
    high: usize,
    check: Option<AllocTable>,
}

impl PcpBuddy {
    /// Build over frames `0..frames`, one cache per heap (CPU).
    pub fn new(frames: u64, config: &BuddyConfig) -> Result<Self, ConfigError> {
        let cpus = config.heaps_or_cpus();
        let max_order = config.resolve_max_order(frames, cpus)?;
        let batch = config.pcp_batch_frames.max(1);
        let high = config.pcp_high_frames.max(batch);
        Ok(PcpBuddy {
            zone: CachePadded::new(Mutex::new(DenseBuddy::new_free(0, frames, max_order))),
            pcp: (0..cpus)
                .map(|_| CachePadded::new(Mutex::new(Vec::with_capacity(high + 1))))
                .collect(),
            frames,
            max_order,
            batch,
            high,
            check: config
                .check_frees
                .then(|| AllocTable::new(frames, max_order)),
        })
    }

    fn record_alloc(&self, f: FrameNo, order: u32) -> Result<FrameNo, AllocError> {
        if let Some(t) = &self.check {
            t.on_alloc(f, order)
                .expect("allocator handed out a live frame");
        }
        Ok(f)
    }
}

impl FrameAllocator for PcpBuddy {
    fn name(&self) -> &'static str {
        "linux-pcp"
    }
    fn total_frames(&self) -> u64 {
        self.frames
    }
    fn max_order(&self) -> u32 {
        self.max_order
    }
    fn num_heaps(&self) -> usize {
        self.pcp.len()
    }

    fn alloc_on(&self, heap: usize, order: u32) -> Result<FrameNo, AllocError> {
        if order > self.max_order {
            return Err(AllocError::OrderTooLarge {
                order,
                max_order: self.max_order,
            });
        }
        if order > 0 {
            let mut f = self.zone.lock().alloc(order);
            if f.is_none() {
                // Frames parked in per-CPU caches may complete a block.
                self.quiesce();
                f = self.zone.lock().alloc(order);
            }
            return self.record_alloc(f.ok_or(AllocError::OutOfMemory { order })?, order);
        }
        let mut list = self.pcp[crate::heap_index(heap, self.pcp.len())].lock();
        if list.is_empty() {
            let mut zone = self.zone.lock();
            for _ in 0..self.batch {
                match zone.alloc(0) {
                    Some(f) => list.push(f),
                    None => break,
                }
            }
        }
        match list.pop() {
            Some(f) => self.record_alloc(f, 0),
            None => {
                drop(list);
                // Like Linux under pressure: drain the other CPUs' caches and retry once.
                self.quiesce();
                let f = self.zone.lock().alloc(0);
                self.record_alloc(f.ok_or(AllocError::OutOfMemory { order })?, 0)
            }
        }
    }

    fn free_on(&self, heap: usize, frame: FrameNo, order: u32) -> Result<(), FreeError> {
        validate_free(frame, order, self.frames, self.max_order)?;
        if let Some(t) = &self.check {
            t.on_free(frame, order)?;
        }
        if order > 0 {
            self.zone.lock().free(frame, order);
            return Ok(());
        }
        let mut list = self.pcp[crate::heap_index(heap, self.pcp.len())].lock();
        list.push(frame);
        if list.len() > self.high {
            let mut zone = self.zone.lock();
            // Linux frees the coldest frames: the bottom of the stack.
            for f in list.drain(..self.batch) {
                zone.free(f, 0);
            }
        }
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
        let mut holders = Vec::with_capacity(self.pcp.len() + 1);
        let mut free = 0;
        for l in &self.pcp {
            let list = l.lock();
            free += list.len() as u64;
            holders.push(list.iter().map(|&f| (f, 0)).collect());
        }
        let zone = self.zone.lock();
        free += zone.free_frames();
        let metadata = zone.metadata_bytes()
            + self.pcp.len() as u64 * (self.high as u64 + 1) * 8
            + self.check.as_ref().map_or(0, |t| t.metadata_bytes());
        holders.push(zone.free_blocks().collect());
        drop(zone);
        let mut s = Stats {
            allocator: self.name(),
            total_frames: self.frames,
            free_frames: free,
            max_order: self.max_order,
            metadata_bytes: metadata,
            ..Default::default()
        };
        summarize_blocks(&mut s, &holders);
        s
    }

    fn quiesce(&self) {
        for l in &self.pcp {
            let mut list = l.lock();
            if list.is_empty() {
                continue;
            }
            let mut zone = self.zone.lock();
            for f in list.drain(..) {
                zone.free(f, 0);
            }
        }
    }
}
