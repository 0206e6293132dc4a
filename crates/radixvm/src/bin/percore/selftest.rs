//! Multi-process checks of the per-core backend, run by
//! `tests/percore.rs` through this binary (they need the shared heap as
//! the global allocator and fork, which a test harness's threads forbid).
//!
//! * `stale` — after `munmap` returns, another core's store to the page
//!   faults (it never reaches the freed frame). With `--broken` the
//!   targets acknowledge without dropping their translations, and the
//!   check must report the stale store.
//! * `targets` — a model of which cores a munmap messages: exactly the
//!   cores (other than the initiator) that touched a page of the range,
//!   checked against the design's bookkeeping (each core's table) and
//!   each core's acknowledgement count.
//! * `stress` — workers map, touch and unmap shared ranges at random; at
//!   each checkpoint every worker checks its real page table against its
//!   shadow (no stale and no lost translation, and the real page is the
//!   frame the shadow names). `RADIXVM_STRESS_ROUNDS` sets the length.
//! * `cross` — a frame that one core allocated (from its heap's memfd)
//!   and another core maps is the same memory: a store on either core is
//!   seen by the other, by the pool's own mapping, and by a `pread` of the
//!   memfd at the offset [`Frames::file_of`] names for the frame.
//! * `death` — a worker kills itself mid-run; the run must end with an
//!   error naming it, not hang. `--hang`: it stops answering instead.
//! * `heap` — the shared heap across processes: workers allocate and free
//!   concurrently, blocks never overlap; each worker's private cache
//!   spills to the shared stacks when full, stays bounded, and is empty
//!   after a flush.

use std::sync::atomic::{AtomicU64, Ordering};

use radixvm::mmu::{Counter, Miss, Mmu, Op};
use radixvm::percore::{self, heap, PercoreMmu, Worker};
use radixvm::{
    new_space_on, Access, AddressSpace, Backend, Backing, Cpu, Design, Frames, MapAt, Prot,
    VmError, PAGE_SIZE_BYTES,
};

const POOL_BYTES: usize = 256 << 20;
const BASE_BYTES: u64 = 1 << 32;

pub fn run(args: Vec<String>) -> Result<(), String> {
    let name = args.first().ok_or("selftest NAME")?.clone();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let design = args
        .iter()
        .position(|a| a == "--design")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(Design::RadixVm), |d| d.parse())?;
    let workers = args
        .iter()
        .position(|a| a == "--workers")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(2), |w| w.parse().map_err(|e| format!("{e}")))?;
    let pages: u64 = args
        .iter()
        .position(|a| a == "--pages")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(1), |w| w.parse().map_err(|e| format!("--pages: {e}")))?;
    if !(1..=64).contains(&pages) {
        return Err(format!("--pages {pages}: expected 1 to 64"));
    }
    let frames = Frames::new_memfd(POOL_BYTES).map_err(|e| e.to_string())?;
    let space = new_space_on(design, Backend::Percore, &frames).map_err(|e| e.to_string())?;
    let mmu = space.mmu().percore().ok_or("not a per-core space")?;
    let result = match name.as_str() {
        "stale" => stale(&*space, mmu, flag("--broken"), pages),
        "targets" => targets(&*space, workers),
        "stress" => stress(&*space, mmu, workers),
        "cross" => cross(&*space, workers),
        "death" => death(&*space, flag("--hang")),
        "heap" => heap(&*space, workers),
        other => Err(format!("unknown selftest {other}")),
    };
    if result.is_err() {
        // A failed run may have left a dead worker's locks held
        // (`percore::run`): exit without dropping the space.
        std::mem::forget(space);
    }
    result
}

fn vpn_of(addr: u64) -> u64 {
    addr / PAGE_SIZE_BYTES
}

/// Worker 0 maps a region of `pages` pages; in even rounds worker 0
/// writes its first page first, in odd rounds worker 1 does (with
/// fault-around, that worker's table then holds every page of the region,
/// touched or not); then the other writes its last page; worker 0 unmaps
/// it. Afterwards every store to every page of the region must fault on
/// both workers. Repeated over many regions.
fn stale(
    space: &dyn AddressSpace,
    mmu: &PercoreMmu,
    broken: bool,
    pages: u64,
) -> Result<(), String> {
    const ROUNDS: u64 = 200;
    mmu.break_shootdowns(broken);
    let len = pages * PAGE_SIZE_BYTES;
    let run = percore::run(space, 2, None, &|cpu: &Cpu<'_>, w: &Worker<'_>| {
        let mut reached = 0;
        let mut faulted = 0;
        for round in 0..ROUNDS {
            let addr = BASE_BYTES + round * len;
            let last = addr + len - PAGE_SIZE_BYTES;
            let first_writer = (round % 2) as usize;
            if w.id == 0 {
                cpu.mmap(
                    MapAt::Fixed(addr),
                    len,
                    Prot::READ_WRITE,
                    Backing::Anonymous,
                )
                .expect("mmap");
            }
            w.barrier();
            if w.id == first_writer {
                cpu.write(addr, 0x11).expect("first write");
            }
            w.barrier();
            if w.id != first_writer {
                cpu.write(last, 0x22).expect("second write");
            }
            w.barrier();
            if w.id == 0 {
                // One page: the second write went to the first page too.
                let first = if pages == 1 { 0x22 } else { 0x11 };
                assert_eq!(cpu.read(addr).expect("read 0"), first, "one frame");
                assert_eq!(cpu.read(last).expect("read 0"), 0x22, "one frame");
                cpu.munmap(addr, len).expect("munmap");
            }
            w.barrier();
            for page in 0..pages {
                let a = addr + page * PAGE_SIZE_BYTES;
                // The raw access: a fault must come back, not a hit.
                match w.mmu().access(w.id, vpn_of(a), 0, Op::Store(0x33)) {
                    Ok(_) => reached += 1,
                    Err(Miss::Fault) => faulted += 1,
                }
                // And through the design: the page is gone.
                if cpu.write(a, 0x44) != Err(VmError::Unmapped(a)) {
                    reached += 1;
                }
            }
            w.barrier();
        }
        [reached, faulted, 0, 0]
    })?;
    let counters = mmu.counters();
    let reached: u64 = run.results.iter().map(|r| r[0]).sum();
    let faulted: u64 = run.results.iter().map(|r| r[1]).sum();
    println!(
        "stale: {ROUNDS} rounds of {pages} pages, stores after munmap on both workers: \
         {faulted} faulted, {reached} reached the frame; messages sent {}, acknowledged {}",
        counters.total(Counter::ShootdownTargets),
        counters.total(Counter::AcksSelf) + counters.total(Counter::AcksProxy)
    );
    if reached > 0 {
        return Err(format!(
            "STALE: {reached} stores after munmap reached the old frame"
        ));
    }
    if counters.total(Counter::ShootdownTargets) != ROUNDS {
        return Err(format!(
            "expected one message per round, got {}",
            counters.total(Counter::ShootdownTargets)
        ));
    }
    Ok(())
}

/// The byte at `offset` of file `fd`, read with `pread` (not through any
/// mapping).
fn file_byte(fd: i32, offset: u64) -> Option<u8> {
    let mut b = 0u8;
    // SAFETY: one byte into a valid local; `fd` is an open memfd of the
    // frame pool.
    let n = unsafe { libc::pread(fd, (&mut b as *mut u8).cast(), 1, offset as libc::off_t) };
    (n == 1).then_some(b)
}

/// Round `r`: worker `r % workers` maps a page and stores to it (its
/// fault allocates the frame on its core, from its heap's memfd); worker
/// `(r + 1) % workers` reads the value and stores another, which the
/// first reads back. Both tables must name one frame, and the pool's
/// mapping and the frame's memfd (`pread` at [`Frames::file_of`]) must
/// hold the last value.
fn cross(space: &dyn AddressSpace, workers: usize) -> Result<(), String> {
    const ROUNDS: u64 = 200;
    if workers < 2 {
        return Err("cross needs two workers or more".into());
    }
    let run = percore::run(space, workers, None, &|cpu: &Cpu<'_>, w: &Worker<'_>| {
        // Per worker: wrong values seen, frames the two tables disagreed
        // on, frames (allocated by this worker) in another core's memfd.
        let mut bad = [0u64; 4];
        let frames = w.mmu().frames();
        let files = frames.capacity_frames() / frames.file_frames();
        for r in 0..ROUNDS {
            let addr = BASE_BYTES + r * PAGE_SIZE_BYTES;
            let (a, b) = ((r as usize) % workers, (r as usize + 1) % workers);
            let (first, second) = ((r % 200) as u8 + 1, (r % 200) as u8 + 50);
            if w.id == a {
                cpu.mmap(
                    MapAt::Fixed(addr),
                    PAGE_SIZE_BYTES,
                    Prot::READ_WRITE,
                    Backing::Anonymous,
                )
                .expect("mmap");
                cpu.write(addr + 9, first).expect("write in a");
                let frame = w.mmu().shadow(w.id, vpn_of(addr)).frame();
                if frame / frames.file_frames() != topology::current_cpu() as u64 % files {
                    bad[2] += 1;
                }
            }
            w.barrier();
            if w.id == b {
                if cpu.read(addr + 9).expect("read in b") != first {
                    bad[0] += 1;
                }
                cpu.write(addr + 10, second).expect("write in b");
            }
            w.barrier();
            if w.id == a {
                if cpu.read(addr + 10).expect("read in a") != second {
                    bad[0] += 1;
                }
                let frame = w.mmu().shadow(a, vpn_of(addr)).frame();
                if !w.mmu().present_in(b, vpn_of(addr))
                    || w.mmu().shadow(b, vpn_of(addr)).frame() != frame
                {
                    bad[1] += 1;
                }
                let pool = frames.ptr(frame);
                // SAFETY: a live frame of the pool (mapped in this space),
                // read only.
                let via_pool =
                    unsafe { [pool.add(9).read_volatile(), pool.add(10).read_volatile()] };
                let (fd, offset) = frames.file_of(frame).expect("a memfd pool");
                let via_file = [file_byte(fd, offset + 9), file_byte(fd, offset + 10)];
                if via_pool != [first, second] || via_file != [Some(first), Some(second)] {
                    bad[0] += 1;
                }
                cpu.munmap(addr, PAGE_SIZE_BYTES).expect("munmap");
                bad[3] += 1;
            }
            w.barrier();
        }
        bad
    })?;
    let sum = |k: usize| run.results.iter().map(|r| r[k]).sum::<u64>();
    println!(
        "cross: {workers} workers, {} pages shared between cores: {} wrong values, \
         {} frames the tables disagree on; {} frames from another core's memfd",
        sum(3),
        sum(0),
        sum(1),
        sum(2)
    );
    if sum(0) + sum(1) != 0 {
        return Err("a page shared between cores is not one frame".into());
    }
    Ok(())
}

/// A small deterministic generator (the model must not depend on the
/// workers' schedule).
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Whether worker `w` touches page `p` in round `r` of the model.
fn touches(r: u64, w: usize, p: u64) -> bool {
    mix(r * 1_000_003 + w as u64 * 7919 + p).is_multiple_of(3)
}

fn targets(space: &dyn AddressSpace, workers: usize) -> Result<(), String> {
    const ROUNDS: u64 = 100;
    const PAGES: u64 = 8;
    // Per worker: rounds where its acks, its table or the messages
    // disagreed with the model.
    let run = percore::run(space, workers, None, &|cpu: &Cpu<'_>, w: &Worker<'_>| {
        let mut bad = [0u64; 4];
        let counters = w.mmu().counters();
        for r in 0..ROUNDS {
            let addr = BASE_BYTES + (r % 4) * PAGES * PAGE_SIZE_BYTES;
            let initiator = (r as usize) % workers;
            if w.id == initiator {
                cpu.mmap(
                    MapAt::Fixed(addr),
                    PAGES * PAGE_SIZE_BYTES,
                    Prot::READ_WRITE,
                    Backing::Anonymous,
                )
                .expect("mmap");
            }
            w.barrier();
            for p in 0..PAGES {
                if touches(r, w.id, p) {
                    cpu.write(addr + p * PAGE_SIZE_BYTES, w.id as u8)
                        .expect("write");
                }
            }
            w.barrier();
            // The design's bookkeeping: my table holds exactly my pages.
            for p in 0..PAGES {
                if w.mmu().present_in(w.id, vpn_of(addr) + p) != touches(r, w.id, p) {
                    bad[0] += 1;
                }
            }
            let acks_before =
                counters.get(w.id, Counter::AcksSelf) + counters.get(w.id, Counter::AcksProxy);
            let sent_before = counters.get(w.id, Counter::ShootdownTargets);
            w.barrier();
            if w.id == initiator {
                cpu.munmap(addr, PAGES * PAGE_SIZE_BYTES).expect("munmap");
            }
            w.barrier();
            let acks = counters.get(w.id, Counter::AcksSelf)
                + counters.get(w.id, Counter::AcksProxy)
                - acks_before;
            let expect_ack = w.id != initiator && (0..PAGES).any(|p| touches(r, w.id, p));
            if acks != expect_ack as u64 {
                bad[1] += 1;
            }
            if w.id == initiator {
                let sent = counters.get(w.id, Counter::ShootdownTargets) - sent_before;
                let model = (0..workers)
                    .filter(|&o| o != initiator && (0..PAGES).any(|p| touches(r, o, p)))
                    .count() as u64;
                if sent != model {
                    bad[2] += 1;
                }
                bad[3] += sent;
            }
        }
        bad
    })?;
    let sum = |k: usize| run.results.iter().map(|r| r[k]).sum::<u64>();
    println!(
        "targets: {workers} workers, {ROUNDS} munmaps, {} messages; disagreements: tables {}, \
         acks {}, messages {}",
        sum(3),
        sum(0),
        sum(1),
        sum(2)
    );
    if sum(0) + sum(1) + sum(2) != 0 {
        return Err("the messaged cores disagree with the model".into());
    }
    Ok(())
}

/// Slots of shared ranges in the stress test, and pages per slot.
const STRESS_SLOTS: u64 = 8;
const STRESS_PAGES: u64 = 4;

fn stress(space: &dyn AddressSpace, mmu: &PercoreMmu, workers: usize) -> Result<(), String> {
    let rounds: u64 = std::env::var("RADIXVM_STRESS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    const OPS_PER_ROUND: u64 = 200;
    let frames = mmu.frames().clone();
    let ops = AtomicU64::new(0);
    let run = percore::run(space, workers, None, &|cpu: &Cpu<'_>, w: &Worker<'_>| {
        let mut bad = [0u64; 4];
        let mut x = w.id as u64 + 1;
        for round in 0..rounds {
            for _ in 0..OPS_PER_ROUND {
                x = mix(x + round);
                let slot = x % STRESS_SLOTS;
                let addr = BASE_BYTES + slot * STRESS_PAGES * PAGE_SIZE_BYTES;
                let page = addr + (x >> 8) % STRESS_PAGES * PAGE_SIZE_BYTES;
                match (x >> 16) % 8 {
                    0 => {
                        cpu.mmap(
                            MapAt::Fixed(addr),
                            STRESS_PAGES * PAGE_SIZE_BYTES,
                            Prot::READ_WRITE,
                            Backing::Anonymous,
                        )
                        .expect("mmap");
                    }
                    1 => cpu
                        .munmap(addr, STRESS_PAGES * PAGE_SIZE_BYTES)
                        .expect("munmap"),
                    2..=4 => match cpu.write(page, w.id as u8 + 1) {
                        Ok(()) | Err(VmError::Unmapped(_)) => {}
                        Err(e) => panic!("write: {e}"),
                    },
                    _ => match cpu.touch(page, Access::Read) {
                        Ok(()) | Err(VmError::Unmapped(_)) => {}
                        Err(e) => panic!("read: {e}"),
                    },
                }
            }
            ops.fetch_add(OPS_PER_ROUND, Ordering::Relaxed);
            // Checkpoint: nobody changes anything between the barriers.
            w.barrier();
            for vpn in vpn_of(BASE_BYTES)..vpn_of(BASE_BYTES) + STRESS_SLOTS * STRESS_PAGES {
                let shadow = w.mmu().shadow(w.id, vpn);
                let real = w.mmu().access(w.id, vpn, 0, Op::Load);
                match (shadow.present() && shadow.permits(Access::Read), real) {
                    (true, Ok(v)) => {
                        // SAFETY: the shadow names a live frame of the
                        // pool (installed, not yet unmapped: nobody
                        // unmaps between the barriers).
                        let f = unsafe { *frames.ptr(shadow.frame()) };
                        if f != v {
                            bad[2] += 1;
                        }
                    }
                    (false, Ok(_)) => bad[0] += 1,
                    (true, Err(_)) => bad[1] += 1,
                    (false, Err(_)) => {}
                }
            }
            w.barrier();
        }
        bad
    })?;
    let sum = |k: usize| run.results.iter().map(|r| r[k]).sum::<u64>();
    let c = mmu.counters();
    println!(
        "stress: {workers} workers, {} ops in {:.2} s, {} messages ({} answered by IPI); \
         checkpoint errors: stale {}, lost {}, wrong frame {}",
        workers as u64 * rounds * OPS_PER_ROUND,
        run.secs,
        c.total(Counter::ShootdownTargets),
        c.total(Counter::AcksProxy),
        sum(0),
        sum(1),
        sum(2)
    );
    if sum(0) + sum(1) + sum(2) != 0 {
        return Err("real page tables disagree with the shadows".into());
    }
    Ok(())
}

fn death(space: &dyn AddressSpace, hang: bool) -> Result<(), String> {
    let addr = BASE_BYTES;
    let r = percore::run(space, 2, None, &|cpu: &Cpu<'_>, w: &Worker<'_>| {
        if w.id == 0 {
            cpu.mmap(
                MapAt::Fixed(addr),
                PAGE_SIZE_BYTES,
                Prot::READ_WRITE,
                Backing::Anonymous,
            )
            .expect("mmap");
        }
        w.barrier();
        if w.id == 1 {
            cpu.write(addr, 1).expect("write");
        }
        w.barrier();
        if w.id == 1 {
            if hang {
                // Stop answering: block the IPI and never poll.
                // SAFETY: sigprocmask with a valid set; then sleep.
                unsafe {
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, libc::SIGUSR1);
                    libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                }
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
            // SAFETY: kills this worker process only.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        // Worker 0: a munmap that must message worker 1.
        std::thread::sleep(std::time::Duration::from_millis(50));
        cpu.munmap(addr, PAGE_SIZE_BYTES).expect("munmap");
        [0; 4]
    });
    match r {
        Ok(_) => Err("the run succeeded although worker 1 died".into()),
        Err(e) => {
            println!("death: the run ended with: {e}");
            // The space may hold locks of the dead worker: leave without
            // dropping it.
            std::process::exit(0)
        }
    }
}

fn heap(space: &dyn AddressSpace, workers: usize) -> Result<(), String> {
    const ROUNDS: u64 = 20_000;
    /// Boxes per spill round: more than a class's private cache holds.
    const CACHE_ROUND_BOXES: u64 = 300;
    let run = percore::run(space, workers, None, &|_cpu: &Cpu<'_>, w: &Worker<'_>| {
        let mut bad = 0;
        let mut live: Vec<Vec<u64>> = Vec::new();
        let tag = w.id as u64 + 1;
        for r in 0..ROUNDS {
            let len = 1 + (mix(r + tag * 77) % 600) as usize;
            live.push(vec![tag << 32 | r; len]);
            if live.len() > 64 {
                let v = live.swap_remove((mix(r) % 64) as usize);
                bad += v.iter().filter(|&&x| x >> 32 != tag).count() as u64;
            }
        }
        for v in &live {
            bad += v.iter().filter(|&&x| x >> 32 != tag).count() as u64;
        }
        drop(live);
        // More frees of one class than the private cache holds: the
        // surplus goes back to the shared stacks as chains, and what the
        // others allocate from there next must not overlap what this
        // worker still caches or holds.
        for round in 0..4u64 {
            let boxes: Vec<Box<[u64; 8]>> = (0..CACHE_ROUND_BOXES)
                .map(|i| Box::new([tag << 32 | (round * CACHE_ROUND_BOXES + i); 8]))
                .collect();
            w.barrier();
            for b in &boxes {
                bad += b.iter().filter(|&&x| x >> 32 != tag).count() as u64;
            }
            w.barrier();
        }
        let cached = heap::thread_cache_blocks();
        heap::flush_thread_cache();
        let left = heap::thread_cache_blocks();
        [bad, cached, left, 0]
    })?;
    let bad: u64 = run.results.iter().map(|r| r[0]).sum();
    let cached = run.results.iter().map(|r| r[1]).max().unwrap_or(0);
    let left: u64 = run.results.iter().map(|r| r[2]).sum();
    println!(
        "heap: {workers} processes, {ROUNDS} allocations each, {bad} corrupted words, \
         at most {cached} blocks in a private cache, {left} after the flush"
    );
    if bad != 0 {
        return Err("blocks of different processes overlapped".into());
    }
    if cached == 0 || cached > heap::MAX_CACHED_BLOCKS {
        return Err(format!(
            "a worker's private cache held {cached} blocks (expected 1..={})",
            heap::MAX_CACHED_BLOCKS
        ));
    }
    if left != 0 {
        return Err(format!(
            "{left} blocks stayed in private caches after a flush"
        ));
    }
    Ok(())
}
