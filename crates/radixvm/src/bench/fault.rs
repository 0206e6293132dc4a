//! faultbench (Bonsai §7.3, Figures 16-18): one mapper thread spends a
//! fraction of each [`FAULT_PERIOD_US`] in mmap/munmap of its own page
//! while the others take soft faults on a segment; see the parent
//! module's essay for the workload and what its rows report.

use super::*;
/// faultbench's mapper (CPU 0): spends `fraction` of every
/// [`FAULT_PERIOD_US`] in mmap/munmap of one page until `stopped`;
/// returns the mmap+munmap pairs done.
fn mapper_body(cpu: &Cpu<'_>, fraction: f64, stopped: &dyn Fn() -> bool) -> u64 {
    let at = BENCH_BASE_BYTES;
    let period = Duration::from_micros(FAULT_PERIOD_US);
    let busy = period.mul_f64(fraction);
    let mut maps = 0;
    while !stopped() {
        let t0 = Instant::now();
        while t0.elapsed() < busy {
            cpu.mmap(
                MapAt::Fixed(at),
                PAGE_SIZE_BYTES,
                Prot::READ_WRITE,
                Backing::Anonymous,
            )
            .expect("mapper mmap");
            cpu.munmap(at, PAGE_SIZE_BYTES).expect("mapper munmap");
            maps += 1;
        }
        while t0.elapsed() < period {
            std::hint::spin_loop();
        }
    }
    maps
}

/// faultbench's faulter `f` (CPU `f + 1`): maps its part of `segment`,
/// reads it once (allocating the frames), calls `start`, then until
/// `stopped` drops its translations and reads every page again; returns
/// (faulting reads, nanoseconds spent in them).
fn faulter_body(
    cpu: &Cpu<'_>,
    f: usize,
    segment: &Arc<Segment>,
    start: &dyn Fn(),
    stopped: &dyn Fn() -> bool,
) -> (u64, u64) {
    let id = f + 1;
    let len = FAULT_REGION_PAGES * PAGE_SIZE_BYTES;
    let backing = Backing::Segment {
        segment: segment.clone(),
        offset_pages: f as u64 * FAULT_REGION_PAGES,
    };
    let a = cpu
        .mmap(
            MapAt::Fixed(BENCH_BASE_BYTES + id as u64 * REGION_STRIDE_BYTES),
            len,
            Prot::READ,
            backing,
        )
        .expect("faulter mmap");
    // First pass allocates the segment's frames: not measured.
    for p in 0..FAULT_REGION_PAGES {
        let _ = cpu.read(a + p * PAGE_SIZE_BYTES);
    }
    let mmu = cpu.space().mmu();
    let vpns = a / PAGE_SIZE_BYTES..a / PAGE_SIZE_BYTES + FAULT_REGION_PAGES;
    let mut scratch = Vec::new();
    let (mut n, mut nanos) = (0u64, 0u64);
    start();
    while !stopped() {
        // Reclaim our translations (no address-space lock).
        mmu.clear(mmu.table_of(id), vpns.clone(), &mut scratch);
        scratch.clear();
        mmu.shootdown(id, 1 << id, vpns.clone());
        let t0 = Instant::now();
        for p in 0..FAULT_REGION_PAGES {
            cpu.touch(a + p * PAGE_SIZE_BYTES, Access::Read)
                .expect("faulter read");
        }
        nanos += t0.elapsed().as_nanos() as u64;
        n += FAULT_REGION_PAGES;
    }
    (n, nanos)
}

/// What one faultbench run measured.
struct FaultSample {
    faults_per_sec: f64,
    fault_ns: f64,
    maps_per_sec: f64,
    /// mmap+munmap pairs by the mapper.
    maps: u64,
    /// The design's shootdown messages (remote targets).
    messages: u64,
    /// Kernel TLB-shootdown interrupts during the run, system-wide.
    kernel_tlb: Option<u64>,
}

/// One faultbench run.
fn fault_sample(
    design: Design,
    backend: Backend,
    threads: usize,
    fraction: f64,
    secs: f64,
) -> FaultSample {
    let faulters = threads.saturating_sub(1).max(1);
    if backend == Backend::Percore {
        return percore_fault_sample(design, faulters, fraction, secs);
    }
    let frames = Frames::new(POOL_BYTES).expect("frame pool");
    let space = new_space_on(design, backend, &frames).expect("checked by usable_systems");
    let segment = Segment::new(&frames, FAULT_REGION_PAGES * faulters as u64);
    let stop = AtomicBool::new(false);
    let faults = AtomicU64::new(0);
    let fault_nanos = AtomicU64::new(0);
    let maps = AtomicU64::new(0);
    let start = Barrier::new(faulters + 2);
    let mut elapsed = Duration::ZERO;
    let mut kernel_tlb = None;
    std::thread::scope(|s| {
        let (space, stop, start, maps) = (&space, &stop, &start, &maps);
        let stopped = || stop.load(Ordering::Relaxed);
        s.spawn(move || {
            pin(0);
            let cpu = Cpu::attach(&**space, 0);
            start.wait();
            maps.fetch_add(mapper_body(&cpu, fraction, &stopped), Ordering::Relaxed);
        });
        for f in 0..faulters {
            let (faults, fault_nanos, segment) = (&faults, &fault_nanos, &segment);
            s.spawn(move || {
                pin(f + 1);
                let cpu = Cpu::attach(&**space, f + 1);
                let (n, nanos) = faulter_body(
                    &cpu,
                    f,
                    segment,
                    &|| {
                        start.wait();
                    },
                    &stopped,
                );
                faults.fetch_add(n, Ordering::Relaxed);
                fault_nanos.fetch_add(nanos, Ordering::Relaxed);
            });
        }
        start.wait();
        let tlb_before = kernel_tlb_shootdowns();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        elapsed = t0.elapsed();
        kernel_tlb = tlb_before.zip(kernel_tlb_shootdowns()).map(|(a, b)| b - a);
    });
    let n = faults.load(Ordering::Relaxed).max(1) as f64;
    let secs = elapsed.as_secs_f64();
    let maps = maps.load(Ordering::Relaxed);
    FaultSample {
        faults_per_sec: n / secs,
        fault_ns: fault_nanos.load(Ordering::Relaxed) as f64 / n,
        maps_per_sec: maps as f64 / secs,
        maps,
        messages: stats_of(space.mmu()).shootdown_targets,
        kernel_tlb,
    }
}

/// faultbench on the per-core backend: worker 0 maps, workers 1.. fault,
/// each a process with its own page table. The timed part starts when
/// every faulter has its frames ([`crate::percore::Worker::start_clock`]).
fn percore_fault_sample(design: Design, faulters: usize, fraction: f64, secs: f64) -> FaultSample {
    let frames = Frames::new_memfd(POOL_BYTES).expect("memfd frame pool");
    let space = new_space_on(design, Backend::Percore, &frames).expect("checked by usable_systems");
    let segment = Segment::new(&frames, FAULT_REGION_PAGES * faulters as u64);
    let run = crate::percore::run_after_setup(&*space, faulters + 1, Some(secs), &|cpu, worker| {
        let stopped = || worker.stopped();
        if worker.id == 0 {
            worker.start_clock();
            [0, 0, mapper_body(cpu, fraction, &stopped), 0]
        } else {
            let (n, nanos) = faulter_body(
                cpu,
                worker.id - 1,
                &segment,
                &|| worker.start_clock(),
                &stopped,
            );
            [n, nanos, 0, 0]
        }
    })
    .unwrap_or_else(|e| {
        // The space may hold locks of a dead worker: leave without
        // dropping it.
        eprintln!("faultbench {} on percore: {e}", design.name());
        std::process::exit(1)
    });
    let n = run.results.iter().map(|r| r[0]).sum::<u64>().max(1) as f64;
    let nanos: u64 = run.results.iter().map(|r| r[1]).sum();
    let maps: u64 = run.results.iter().map(|r| r[2]).sum();
    FaultSample {
        faults_per_sec: n / run.secs,
        fault_ns: nanos as f64 / n,
        maps_per_sec: maps as f64 / run.secs,
        maps,
        messages: stats_of(space.mmu()).shootdown_targets,
        kernel_tlb: run.kernel_tlb,
    }
}

/// Runs faultbench (designs only: native faults cannot be isolated from
/// the mapper's lock in one process), calling `row` per row. Thread
/// counts below 2 run as 2 (one mapper, one faulter); userfaultfd rows
/// are left out (with a note on stderr) where the kernel offers none.
pub fn faultbench(options: &Options, mut row: impl FnMut(&FaultRow)) -> Vec<FaultRow> {
    let mut rows = Vec::new();
    let systems = usable_systems(&options.systems, |why| eprintln!("faultbench: {why}"));
    let mut thread_counts: Vec<usize> = options.threads.iter().map(|&t| t.max(2)).collect();
    thread_counts.dedup();
    for &threads in &thread_counts {
        for &fraction in &options.map_fractions {
            for &system in &systems {
                let System::Design(design, backend) = system else {
                    continue;
                };
                let samples: Vec<_> = (0..options.runs.max(1))
                    .map(|_| fault_sample(design, backend, threads, fraction, options.secs))
                    .collect();
                let (fault_ns, spread_pct) =
                    median_spread(samples.iter().map(|s| s.fault_ns).collect());
                let (faults_per_sec, _) =
                    median_spread(samples.iter().map(|s| s.faults_per_sec).collect());
                let (maps_per_sec, _) =
                    median_spread(samples.iter().map(|s| s.maps_per_sec).collect());
                let maps = samples.iter().map(|s| s.maps).sum::<u64>();
                let messages: u64 = samples.iter().map(|s| s.messages).sum();
                let kernel_tlb: Option<u64> = samples.iter().map(|s| s.kernel_tlb).sum();
                let r = FaultRow {
                    system,
                    fault_around_pages: super::fault_around_of(system),
                    threads,
                    map_fraction: fraction,
                    faults_per_sec,
                    fault_ns,
                    maps_per_sec,
                    messages_per_map: messages as f64 / maps.max(1) as f64,
                    kernel_tlb_ipis_per_map: kernel_tlb
                        .filter(|_| system.tlb() == "real" && maps > 0)
                        .map(|k| k as f64 / maps as f64),
                    spread_pct,
                    runs: samples.len(),
                };
                row(&r);
                rows.push(r);
            }
        }
    }
    rows
}
