//! The frame pool under each backing, and blocks that carry addresses.

use buddy::pool::{Backing, FramePool, PoolConfig, PooledAllocator};
use buddy::{AllocatorKind, BuddyConfig, FRAME_SIZE_BYTES};

fn roundtrip(backing: Backing) {
    let pool = FramePool::new(&PoolConfig {
        bytes: 64 << 20,
        backing: backing.clone(),
        populate: false,
    })
    .unwrap();
    assert_eq!(pool.frames(), (64 << 20) / FRAME_SIZE_BYTES as u64);
    let last = pool.frames() - 1;
    let p = pool.frame_ptr(last);
    // SAFETY: the frame lies inside the live mapping and nobody else uses it.
    unsafe {
        p.as_ptr().write_bytes(0xab, FRAME_SIZE_BYTES);
        assert_eq!(*p.as_ptr().add(FRAME_SIZE_BYTES - 1), 0xab);
    }
    assert_eq!(pool.frame_of(p.as_ptr()), Some(last));
    assert_eq!(pool.frame_of(std::ptr::null()), None);
    assert_eq!(pool.backing(), &backing);
}

#[test]
fn anonymous_pool_is_huge_page_aligned() {
    let pool = FramePool::new(&PoolConfig {
        bytes: 8 << 20,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(pool.frame_ptr(0).as_ptr() as usize % (2 << 20), 0);
    roundtrip(Backing::Anonymous);
}

#[test]
fn memfd_pool() {
    roundtrip(Backing::Memfd);
}

#[test]
fn file_pool() {
    let path = std::env::temp_dir().join(format!("buddy-pool-test-{}", std::process::id()));
    roundtrip(Backing::File(path.clone()));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn empty_pool_and_bad_path_are_errors() {
    let e = FramePool::new(&PoolConfig {
        bytes: 100,
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("no 4 KiB frame"), "{e}");
    let e = FramePool::new(&PoolConfig {
        bytes: 1 << 20,
        backing: Backing::HugeTlbfs("/nonexistent-dir/pool".into()),
        populate: false,
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("/nonexistent-dir/pool"), "{e}");
}

#[test]
fn pooled_allocator_hands_out_writable_blocks() {
    let pa = PooledAllocator::new(
        &PoolConfig {
            bytes: 16 << 20,
            ..Default::default()
        },
        AllocatorKind::Distributed,
        &BuddyConfig {
            heaps: Some(2),
            check_frees: true,
            ..Default::default()
        },
    )
    .unwrap();
    let b = pa.alloc_block(4).unwrap();
    assert_eq!(b.bytes(), 64 << 10);
    // SAFETY: the block is ours until freed and lies inside the pool.
    unsafe { b.ptr.as_ptr().write_bytes(7, b.bytes()) };
    assert_eq!(pa.pool().frame_of(b.ptr.as_ptr()), Some(b.frame));
    pa.free_block(b).unwrap();
    pa.allocator().quiesce();
    assert!(pa.stats().fully_coalesced());
}
