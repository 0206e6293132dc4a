//! The semantics every design must have (issue 7, "Tests"), one suite run
//! against each design on each MMU backend: the software MMU (TLB
//! simulated) and the userfaultfd MMU (real faults, the kernel's TLB).
//! Where the kernel offers no userfaultfd, the userfaultfd cases print
//! why and pass without running; any other failure to build fails.
//!
//! Software-MMU-only checks, by nature: "no touch reached a freed frame"
//! (`stale_touches`, counted by the simulated TLB; on the userfaultfd
//! backend it is 0 by construction, as the kernel flushes before the
//! design frees) and two mappings of one segment page seeing each
//! other's stores while both are mapped (the userfaultfd arena holds a
//! copy of the frame; it is written back at unmap, which is checked on
//! both).
//!
//! Set `RADIXVM_STRESS=1` for the long random workload.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use radixvm::mmu::uffd::UffdError;
use radixvm::{
    new_space_on, Access, AddressSpace, Backend, Backing, Cpu, Design, Frames, MapAt, Prot,
    Segment, VmError, PAGE_SIZE_BYTES,
};
use rand::{Rng, SeedableRng};

const POOL_BYTES: usize = 64 << 20;
const PAGE: u64 = PAGE_SIZE_BYTES;
const BASE: u64 = 0x1000_0000;

fn frames() -> Arc<Frames> {
    Frames::new(POOL_BYTES).expect("frame pool")
}

/// A new address space, or `None` (after saying why) where the backend
/// is the userfaultfd one and the kernel offers no userfaultfd.
fn new_space(
    design: Design,
    backend: Backend,
    frames: &Arc<Frames>,
) -> Option<Arc<dyn AddressSpace>> {
    match new_space_on(design, backend, frames) {
        Ok(space) => Some(space),
        Err(e @ UffdError::Unavailable(_)) => {
            println!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Maps `pages` fresh anonymous read-write pages at `BASE`.
fn map_rw_at_base(cpu: &Cpu<'_>, pages: u64) {
    cpu.mmap(
        MapAt::Fixed(BASE),
        pages * PAGE,
        Prot::READ_WRITE,
        Backing::Anonymous,
    )
    .unwrap();
}

/// Live frames once Refcache has freed what was released (`quiesce`
/// returns only when no review queue holds a frame and no free taken off
/// a queue is still running).
fn quiesced(frames: &Frames) -> i64 {
    assert!(radixvm::frameref::quiesce(), "Refcache epochs stuck");
    frames.live_frames()
}

fn stress() -> bool {
    std::env::var_os("RADIXVM_STRESS").is_some()
}

fn munmap_revokes_on_every_cpu(design: Design, backend: Backend) {
    let frames = frames();
    let Some(space) = new_space(design, backend, &frames) else {
        return;
    };
    let pages = 8;
    let barrier = Barrier::new(2);
    let unmapped = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let cpu = Cpu::attach(&*space, 1);
            barrier.wait(); // mapped
            for p in 0..pages {
                cpu.write(BASE + p * PAGE, 7).unwrap(); // TLB now holds them
            }
            barrier.wait(); // touched
            barrier.wait(); // unmapped
            assert!(unmapped.load(Ordering::SeqCst));
            for p in 0..pages {
                assert_eq!(
                    cpu.read(BASE + p * PAGE),
                    Err(VmError::Unmapped(BASE + p * PAGE))
                );
            }
        });
        let cpu = Cpu::attach(&*space, 0);
        map_rw_at_base(&cpu, pages);
        barrier.wait();
        barrier.wait();
        for p in 0..pages {
            assert_eq!(cpu.read(BASE + p * PAGE).unwrap(), 7);
        }
        cpu.munmap(BASE, pages * PAGE).unwrap();
        unmapped.store(true, Ordering::SeqCst);
        for p in 0..pages {
            assert!(cpu.read(BASE + p * PAGE).is_err());
        }
        barrier.wait();
    });
    assert_eq!(space.stats().stale_touches, 0);
    drop(space);
    assert_eq!(quiesced(&frames), 0);
}

fn mmap_is_visible_to_every_cpu(design: Design, backend: Backend) {
    let frames = frames();
    let Some(space) = new_space(design, backend, &frames) else {
        return;
    };
    let barrier = Barrier::new(2);
    let addr = std::sync::Mutex::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let cpu = Cpu::attach(&*space, 3);
            barrier.wait();
            let a = *addr.lock().unwrap();
            for p in 0..4 {
                assert_eq!(cpu.read(a + p * PAGE).unwrap(), 0, "fresh pages are zero");
                cpu.write(a + p * PAGE + 5, p as u8 + 1).unwrap();
            }
            barrier.wait();
        });
        let cpu = Cpu::attach(&*space, 0);
        let a = cpu
            .mmap(
                MapAt::Anywhere,
                4 * PAGE,
                Prot::READ_WRITE,
                Backing::Anonymous,
            )
            .unwrap();
        *addr.lock().unwrap() = a;
        barrier.wait();
        barrier.wait();
        for p in 0..4 {
            assert_eq!(cpu.read(a + p * PAGE + 5).unwrap(), p as u8 + 1);
        }
    });
    assert_eq!(space.stats().stale_touches, 0);
}

fn mprotect_and_partial_unmap(design: Design, backend: Backend) {
    let frames = frames();
    let Some(space) = new_space(design, backend, &frames) else {
        return;
    };
    let cpu = Cpu::attach(&*space, 0);
    let a = cpu
        .mmap(
            MapAt::Hint(BASE),
            6 * PAGE,
            Prot::READ_WRITE,
            Backing::Anonymous,
        )
        .unwrap();
    assert_eq!(a, BASE, "a free hint is taken");
    for p in 0..6 {
        cpu.write(a + p * PAGE, 1).unwrap();
    }
    cpu.mprotect(a + 2 * PAGE, 2 * PAGE, Prot::READ).unwrap();
    assert_eq!(
        cpu.write(a + 2 * PAGE, 2),
        Err(VmError::Protection(a + 2 * PAGE))
    );
    assert_eq!(
        cpu.read(a + 3 * PAGE).unwrap(),
        1,
        "contents survive mprotect"
    );
    cpu.write(a + 4 * PAGE, 2).unwrap();
    cpu.mprotect(a, PAGE, Prot::NONE).unwrap();
    assert_eq!(cpu.read(a), Err(VmError::Protection(a)));
    cpu.mprotect(a, PAGE, Prot::READ_WRITE).unwrap();
    assert_eq!(cpu.read(a).unwrap(), 1);
    cpu.munmap(a + PAGE, PAGE).unwrap();
    assert!(cpu.read(a + PAGE).is_err());
    assert_eq!(cpu.read(a + 5 * PAGE).unwrap(), 1);
    assert!(
        cpu.mprotect(a, 3 * PAGE, Prot::READ).is_err(),
        "hole in range"
    );
    let b = cpu
        .mmap(
            MapAt::Hint(BASE),
            PAGE,
            Prot::READ_WRITE,
            Backing::Anonymous,
        )
        .unwrap();
    assert_ne!(b, BASE, "a taken hint is not");
    cpu.munmap(a, 6 * PAGE).unwrap();
    cpu.munmap(b, PAGE).unwrap();
    drop(cpu);
    assert_eq!(quiesced(&frames), 0);
}

fn segments_share_frames(design: Design, backend: Backend) {
    let frames = frames();
    let segment = Segment::new(&frames, 4);
    {
        let Some(space) = new_space(design, backend, &frames) else {
            return;
        };
        let cpu = Cpu::attach(&*space, 0);
        let seg = |offset_pages| Backing::Segment {
            segment: segment.clone(),
            offset_pages,
        };
        let a = cpu
            .mmap(MapAt::Anywhere, 4 * PAGE, Prot::READ_WRITE, seg(0))
            .unwrap();
        let b = cpu
            .mmap(MapAt::Anywhere, 2 * PAGE, Prot::READ, seg(2))
            .unwrap();
        cpu.write(a + 3 * PAGE, 9).unwrap();
        if backend == Backend::Software {
            // Both mapped at once share the frame itself.
            assert_eq!(cpu.read(b + PAGE).unwrap(), 9);
        }
        assert!(cpu.write(b, 1).is_err());
        assert_eq!(
            cpu.mmap(MapAt::Anywhere, 4 * PAGE, Prot::READ, seg(1)),
            Err(VmError::PastSegmentEnd)
        );
        cpu.munmap(a, 4 * PAGE).unwrap();
        assert_eq!(
            cpu.read(b + PAGE).unwrap(),
            9,
            "the segment keeps its frames"
        );
    }
    assert_eq!(quiesced(&frames), 1, "one segment page was touched");
    drop(segment);
    assert_eq!(quiesced(&frames), 0);
}

/// Two CPUs replace the same range with mappings of two segments over and
/// over; a third reads it. If the operations did not serialize, the range
/// would end up mixing the two.
fn overlapping_operations_serialize(design: Design, backend: Backend) {
    let frames = frames();
    let pages = 16;
    let segments: Vec<_> = (0..2).map(|_| Segment::new(&frames, pages)).collect();
    let Some(space) = new_space(design, backend, &frames) else {
        return;
    };
    {
        let cpu = Cpu::attach(&*space, 0);
        for (i, s) in segments.iter().enumerate() {
            let backing = Backing::Segment {
                segment: s.clone(),
                offset_pages: 0,
            };
            let a = cpu
                .mmap(MapAt::Anywhere, pages * PAGE, Prot::READ_WRITE, backing)
                .unwrap();
            for p in 0..pages {
                cpu.write(a + p * PAGE, i as u8 + 1).unwrap();
            }
            cpu.munmap(a, pages * PAGE).unwrap();
        }
    }
    let rounds = if stress() { 5000 } else { 300 };
    std::thread::scope(|s| {
        for t in 0..2 {
            let (space, segments) = (&space, &segments);
            s.spawn(move || {
                let cpu = Cpu::attach(&**space, t);
                for r in 0..rounds {
                    let backing = Backing::Segment {
                        segment: segments[(r + t) % 2].clone(),
                        offset_pages: 0,
                    };
                    cpu.mmap(MapAt::Fixed(BASE), pages * PAGE, Prot::READ, backing)
                        .unwrap();
                    let _ = cpu.read(BASE + (r as u64 % pages) * PAGE);
                }
            });
        }
        s.spawn(|| {
            let cpu = Cpu::attach(&*space, 2);
            for r in 0..rounds as u64 {
                let v = cpu.read(BASE + (r % pages) * PAGE);
                assert!(
                    matches!(v, Ok(1) | Ok(2) | Err(VmError::Unmapped(_))),
                    "{v:?}"
                );
            }
        });
    });
    let cpu = Cpu::attach(&*space, 0);
    let first = cpu.read(BASE).unwrap();
    for p in 0..pages {
        assert_eq!(
            cpu.read(BASE + p * PAGE).unwrap(),
            first,
            "page {p} mixes mappings"
        );
    }
    assert_eq!(space.stats().stale_touches, 0);
}

/// Random mixed workload on two CPUs (a third just touches): afterwards
/// nothing leaked and no touch ever reached a freed frame.
fn random_workload_leaks_nothing(design: Design, backend: Backend) {
    let frames = frames();
    let Some(space) = new_space(design, backend, &frames) else {
        return;
    };
    let ops = if stress() { 200_000 } else { 3_000 };
    let slots = 32u64;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2usize {
            let space = &space;
            s.spawn(move || {
                let cpu = Cpu::attach(&**space, t);
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64 + 17);
                for _ in 0..ops {
                    let start = BASE + rng.gen_range(0..slots) * PAGE;
                    let len = rng.gen_range(1..5) * PAGE;
                    match rng.gen_range(0..10) {
                        0..=1 => {
                            cpu.mmap(
                                MapAt::Fixed(start),
                                len,
                                Prot::READ_WRITE,
                                Backing::Anonymous,
                            )
                            .unwrap();
                        }
                        2..=3 => cpu.munmap(start, len).unwrap(),
                        4 => {
                            let _ = cpu.mprotect(start, len, Prot::READ);
                        }
                        5..=7 => {
                            let _ = cpu.write(start, 1);
                        }
                        _ => {
                            let _ = cpu.read(start);
                        }
                    }
                }
            });
        }
        s.spawn(|| {
            let cpu = Cpu::attach(&*space, 5);
            let mut rng = rand::rngs::StdRng::seed_from_u64(99);
            while !stop.load(Ordering::Relaxed) {
                let _ = cpu.touch(BASE + rng.gen_range(0..slots) * PAGE, Access::Read);
                std::thread::yield_now();
            }
        });
        // The toucher stops when the workers are done.
        while space.stats().mmaps + space.stats().munmaps < 1 {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(space.stats().stale_touches, 0);
    {
        let cpu = Cpu::attach(&*space, 0);
        cpu.munmap(BASE, (slots + 8) * PAGE).unwrap();
    }
    assert_eq!(quiesced(&frames), 0, "{design}: frames leaked");
    drop(space);
    assert_eq!(quiesced(&frames), 0);
}

macro_rules! suite {
    ($($name:ident),*) => {
        mod radixvm_sw { use super::*; $( #[test] fn $name() { super::$name(Design::RadixVm, Backend::Software) } )* }
        mod bonsai_sw { use super::*; $( #[test] fn $name() { super::$name(Design::Bonsai, Backend::Software) } )* }
        mod linux_sw { use super::*; $( #[test] fn $name() { super::$name(Design::Linux, Backend::Software) } )* }
        mod radixvm_uffd { use super::*; $( #[test] fn $name() { super::$name(Design::RadixVm, Backend::Userfaultfd) } )* }
        mod bonsai_uffd { use super::*; $( #[test] fn $name() { super::$name(Design::Bonsai, Backend::Userfaultfd) } )* }
        mod linux_uffd { use super::*; $( #[test] fn $name() { super::$name(Design::Linux, Backend::Userfaultfd) } )* }
    };
}

suite!(
    munmap_revokes_on_every_cpu,
    mmap_is_visible_to_every_cpu,
    mprotect_and_partial_unmap,
    segments_share_frames,
    overlapping_operations_serialize,
    random_workload_leaks_nothing
);

/// RadixVM §5: pages touched by one CPU are unmapped with no shootdown.
fn radixvm_local_unmap_needs_no_shootdown(backend: Backend) {
    let frames = frames();
    let Some(space) = new_space(Design::RadixVm, backend, &frames) else {
        return;
    };
    std::thread::scope(|s| {
        for t in 0..2usize {
            let space = &space;
            s.spawn(move || {
                let cpu = Cpu::attach(&**space, t);
                for _ in 0..50 {
                    let a = cpu
                        .mmap(
                            MapAt::Anywhere,
                            8 * PAGE,
                            Prot::READ_WRITE,
                            Backing::Anonymous,
                        )
                        .unwrap();
                    for p in 0..8 {
                        cpu.write(a + p * PAGE, 1).unwrap();
                    }
                    cpu.munmap(a, 8 * PAGE).unwrap();
                }
            });
        }
    });
    let stats = space.stats();
    assert_eq!(stats.shootdowns, 0);
    assert_eq!(stats.faults, 2 * 50 * 8);
    let shared = new_space(Design::Linux, backend, &frames).expect("built once already");
    let _idle = Cpu::attach(&*shared, 1);
    let cpu = Cpu::attach(&*shared, 0);
    let a = cpu
        .mmap(MapAt::Anywhere, PAGE, Prot::READ_WRITE, Backing::Anonymous)
        .unwrap();
    cpu.write(a, 1).unwrap();
    cpu.munmap(a, PAGE).unwrap();
    assert_eq!(
        shared.stats().shootdowns,
        1,
        "a shared table shoots down every CPU"
    );
    assert_eq!(shared.stats().shootdown_targets, 1);
}

#[test]
fn radixvm_local_unmap_needs_no_shootdown_sw() {
    radixvm_local_unmap_needs_no_shootdown(Backend::Software);
}

#[test]
fn radixvm_local_unmap_needs_no_shootdown_uffd() {
    radixvm_local_unmap_needs_no_shootdown(Backend::Userfaultfd);
}

/// On the userfaultfd backend the first touch of each page is a real
/// fault (counted by the fault fixup), a second touch is not, and a page
/// unmapped and mapped again faults again (the zap was real).
#[test]
fn uffd_faults_are_real() {
    let frames = frames();
    let Some(space) = new_space(Design::Bonsai, Backend::Userfaultfd, &frames) else {
        return;
    };
    let cpu = Cpu::attach(&*space, 0);
    let pages = 16;
    map_rw_at_base(&cpu, pages);
    for p in 0..pages {
        cpu.write(BASE + p * PAGE + 1, p as u8).unwrap();
    }
    assert_eq!(space.stats().tlb_misses, pages, "one real fault per page");
    assert_eq!(space.stats().faults, pages);
    for p in 0..pages {
        assert_eq!(cpu.read(BASE + p * PAGE + 1).unwrap(), p as u8);
    }
    assert_eq!(
        space.stats().tlb_misses,
        pages,
        "present pages take no fault"
    );
    cpu.munmap(BASE, pages * PAGE).unwrap();
    assert_eq!(cpu.read(BASE), Err(VmError::Unmapped(BASE)));
    map_rw_at_base(&cpu, pages);
    assert_eq!(cpu.read(BASE + 1).unwrap(), 0, "a fresh mapping is zero");
    cpu.mprotect(BASE, PAGE, Prot::READ).unwrap();
    assert_eq!(cpu.write(BASE, 1), Err(VmError::Protection(BASE)));
    assert_eq!(space.stats().tlb_misses, pages + 3);
}

/// `MapAt::Anywhere` reuses its window once it wraps around, but never
/// hands out a range that is still mapped.
#[test]
fn anywhere_wraps_without_clobbering() {
    let len = 1 << 30;
    let rounds = 2 * radixvm::space::WINDOW_BYTES / len;
    for design in Design::ALL {
        let frames = frames();
        let space = new_space(design, Backend::Software, &frames).expect("software MMU");
        let cpu = Cpu::attach(&*space, 0);
        let kept = cpu
            .mmap(MapAt::Anywhere, len, Prot::READ_WRITE, Backing::Anonymous)
            .unwrap();
        cpu.write(kept + 5, 42).unwrap();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..rounds {
            let a = cpu
                .mmap(MapAt::Anywhere, len, Prot::READ_WRITE, Backing::Anonymous)
                .unwrap();
            assert!(
                a + len <= kept || a >= kept + len,
                "{design}: {a:#x} overlaps the kept mapping"
            );
            seen.insert(a);
            cpu.munmap(a, len).unwrap();
        }
        assert!(
            (seen.len() as u64) < rounds,
            "{design}: addresses were reused"
        );
        assert_eq!(cpu.read(kept + 5).unwrap(), 42, "{design}");
    }
}

/// A fault outside the userfaultfd MMU's probes still kills the process
/// the usual way (the fixup handler hands it on instead of looping): a
/// child copy of this test binary makes a userfaultfd space and then
/// stores through a null pointer.
#[test]
fn uffd_handler_passes_other_faults_on() {
    if std::env::var_os("RADIXVM_CRASH_CHILD").is_some() {
        let frames = frames();
        let _space = new_space(Design::Linux, Backend::Userfaultfd, &frames);
        let null = std::hint::black_box(std::ptr::null_mut::<u8>());
        // SAFETY: deliberately unsound: this child process exists to take
        // SIGSEGV here.
        unsafe { null.write_volatile(1) };
        std::process::exit(0);
    }
    let frames = frames();
    if new_space(Design::Linux, Backend::Userfaultfd, &frames).is_none() {
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            "uffd_handler_passes_other_faults_on",
            "--test-threads",
            "1",
        ])
        .env("RADIXVM_CRASH_CHILD", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run the child");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the child did not die: the fault handler loops");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "child: {status:?}");
}

/// RadixVM frees frames epochs after munmap; an allocation that finds the
/// pool empty meanwhile reclaims (ends epochs itself) instead of failing.
#[test]
fn radixvm_reclaims_released_frames_when_the_pool_runs_dry() {
    let frames = Frames::new(1 << 20).expect("frame pool");
    let pool_frames = frames.capacity_frames();
    let space = new_space(Design::RadixVm, Backend::Software, &frames).expect("software MMU");
    let cpu = Cpu::attach(&*space, 0);
    let pages = pool_frames / 2;
    for round in 0..20 {
        let a = cpu
            .mmap(
                MapAt::Anywhere,
                pages * PAGE,
                Prot::READ_WRITE,
                Backing::Anonymous,
            )
            .unwrap();
        for p in 0..pages {
            cpu.write(a + p * PAGE, 1)
                .unwrap_or_else(|e| panic!("round {round}, page {p}: {e}"));
        }
        cpu.munmap(a, pages * PAGE).unwrap();
    }
    drop(cpu);
    drop(space);
    assert_eq!(quiesced(&frames), 0);
}
