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
fn memfds_pool() {
    roundtrip(Backing::Memfds(4));
}

/// Reads page `offset` of file `fd` (pread, not through the pool's mapping).
fn file_byte(fd: i32, offset: u64) -> u8 {
    let mut b = 0u8;
    // SAFETY: one byte into a valid local; `fd` is an open file of the pool.
    let n = unsafe { libc::pread(fd, (&mut b as *mut u8).cast(), 1, offset as libc::off_t) };
    assert_eq!(n, 1, "pread at {offset}");
    b
}

#[test]
fn memfds_pool_places_frames_by_number() {
    let files = 4usize;
    let pool = FramePool::new(&PoolConfig {
        bytes: 16 << 20,
        backing: Backing::Memfds(files),
        populate: false,
    })
    .unwrap();
    let part = pool.frames() / files as u64;
    assert_eq!(pool.file_frames(), part);
    assert_eq!(pool.fd(), None, "several files: no single fd");
    let mut fds = Vec::new();
    // The first and last frame of every part, and its neighbours across
    // the edges.
    for k in 0..files as u64 {
        for (f, page) in [(k * part, 0), (k * part + part - 1, part - 1)] {
            let (fd, offset) = pool.file_of(f).unwrap();
            assert_eq!(offset, page * FRAME_SIZE_BYTES as u64, "frame {f}");
            let tag = (f % 251) as u8 + 1;
            // SAFETY: the frame lies inside the live mapping; nobody else
            // uses it.
            unsafe { pool.frame_ptr(f).as_ptr().add(7).write_volatile(tag) };
            assert_eq!(file_byte(fd, offset + 7), tag, "frame {f} in file {k}");
            fds.push(fd);
        }
        assert_eq!(fds[fds.len() - 1], fds[fds.len() - 2], "one file per part");
    }
    fds.dedup();
    assert_eq!(fds.len(), files, "a file per part");
    let e = FramePool::new(&PoolConfig {
        bytes: 3 * FRAME_SIZE_BYTES,
        backing: Backing::Memfds(2),
        populate: false,
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("equal memfds"), "{e}");
    let anon = FramePool::new(&PoolConfig {
        bytes: 1 << 20,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(anon.file_of(0), None);
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
