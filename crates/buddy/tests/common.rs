//! Helpers shared by the integration tests.

use buddy::{new_allocator, AllocatorKind, BuddyConfig, FrameAllocator};

/// A checked configuration with `heaps` heaps and optional max order.
pub fn config(heaps: usize, max_order: Option<u32>) -> BuddyConfig {
    BuddyConfig {
        heaps: Some(heaps),
        max_order,
        check_frees: true,
        ..Default::default()
    }
}

/// Build `kind` over `frames` frames.
pub fn build(kind: AllocatorKind, frames: u64, cfg: &BuddyConfig) -> Box<dyn FrameAllocator> {
    new_allocator(kind, frames, cfg).expect("valid configuration")
}

/// Assert the allocator holds every frame, coalesced as far as a single buddy would.
pub fn assert_fully_coalesced(a: &dyn FrameAllocator) {
    a.quiesce();
    let s = a.stats();
    assert_eq!(
        s.in_flight_frames,
        0,
        "{}: frames still in flight",
        a.name()
    );
    assert_eq!(s.free_frames, s.total_frames, "{}: frames lost", a.name());
    assert_eq!(
        s.distributed_fragmentation_frames,
        0,
        "{}: free frames not coalesced: {s:?}",
        a.name()
    );
    let expected_max_blocks = s.total_frames >> s.max_order;
    assert_eq!(
        s.free_blocks_by_order[s.max_order as usize],
        expected_max_blocks,
        "{}: not back to maximum-order blocks",
        a.name()
    );
}
