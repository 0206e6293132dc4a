//! (a) local: threads pinned one per CPU allocate and free batches on their
//! own heap; throughput and sampled call latency.

use super::*;

pub(super) struct LocalThread {
    pub(super) ops: u64,
    pub(super) secs: f64,
    pub(super) hist: Histogram<u64>,
}

pub(super) fn local_worker(
    a: &dyn FrameAllocator,
    heap: usize,
    cpu: usize,
    order: u32,
    phase: &AtomicU8,
    barrier: &Barrier,
    seed: u64,
) -> Result<LocalThread> {
    let pinned = util::pin_to(cpu);
    barrier.wait();
    pinned?;
    let mut s = Sampler::new(seed)?;
    let mut blocks: Vec<FrameNo> = Vec::with_capacity(LOCAL_BATCH);
    let mut ops = 0u64;
    let mut start: Option<Instant> = None;
    loop {
        match phase.load(Ordering::Acquire) {
            PHASE_STOP => break,
            PHASE_MEASURE if start.is_none() => {
                start = Some(Instant::now());
                ops = 0;
                s.hist.reset();
            }
            _ => {}
        }
        for _ in 0..LOCAL_BATCH {
            match s.call(|| a.alloc_on(heap, order)) {
                Ok(f) => blocks.push(f),
                Err(e) => {
                    return Err(format!(
                        "alloc_on(heap {heap}, order {order}) with {} blocks held: {e}",
                        blocks.len()
                    )
                    .into())
                }
            }
        }
        while let Some(f) = blocks.pop() {
            s.call(|| a.free_on(heap, f, order))
                .with_context(|| format!("free_on(heap {heap}, frame {f}, order {order})"))?;
        }
        ops += 2 * LOCAL_BATCH as u64;
    }
    let Some(start) = start else {
        return Err("stopped before the measurement began".into());
    };
    Ok(LocalThread {
        ops,
        secs: start.elapsed().as_secs_f64(),
        hist: s.hist,
    })
}

pub(super) struct LocalRun {
    pub(super) ops_per_sec: f64,
    pub(super) hist: Histogram<u64>,
    pub(super) metadata_bytes: u64,
    pub(super) rss_bytes: Option<u64>,
    pub(super) heaps: usize,
}

/// Pool for the local workload: 1 GiB, or more so that every thread's
/// working set is at most 1/16 of it (4 GiB for 512-frame blocks on 2 threads).
pub(super) fn local_pool_frames(order: u32, threads: usize) -> u64 {
    let ws = (LOCAL_BATCH as u64) << order;
    (ws * threads.max(2) as u64 * 16)
        .next_power_of_two()
        .max(LOCAL_MIN_POOL_FRAMES)
}

pub(super) fn local_run(
    kind: AllocatorKind,
    threads: usize,
    order: u32,
    warmup: Duration,
    duration: Duration,
    cpus: &[usize],
) -> Result<LocalRun> {
    let ncpu = cpus.len();
    let heaps = threads.min(ncpu);
    let alloc = build(kind, local_pool_frames(order, threads), heaps)?;
    let a: &dyn FrameAllocator = &*alloc;
    let phase = &AtomicU8::new(PHASE_WARMUP);
    let barrier = &Barrier::new(threads + 1);
    let _wd = Watchdog::arm(
        warmup + duration + HANG_GRACE,
        format!("buddy local {kind} threads={threads} order={order}"),
    );
    let per_thread = thread::scope(|s| {
        let handles = (0..threads)
            .map(|i| {
                let (cpu, heap) = (cpus[i % ncpu], i % heaps);
                s.spawn(move || local_worker(a, heap, cpu, order, phase, barrier, i as u64 + 1))
            })
            .collect();
        barrier.wait();
        thread::sleep(warmup);
        phase.store(PHASE_MEASURE, Ordering::Release);
        thread::sleep(duration);
        phase.store(PHASE_STOP, Ordering::Release);
        join_all(handles)
    })?;
    let mut hist = new_hist()?;
    let mut ops_per_sec = 0.0;
    for t in &per_thread {
        ops_per_sec += t.ops as f64 / t.secs;
        hist.add(&t.hist).context("histogram")?;
    }
    Ok(LocalRun {
        ops_per_sec,
        hist,
        metadata_bytes: a.stats().metadata_bytes,
        rss_bytes: util::rss_bytes(),
        heaps,
    })
}

pub(super) fn local(
    opts: &BuddyOpts,
    cpus: &[usize],
    rep: &mut Reporter,
    pb: &ProgressBar,
) -> std::io::Result<()> {
    const BENCH: &str = "buddy-local";
    let (warmup, duration) = (opts.local_warmup(), opts.local_duration());
    rep.note(
        BENCH,
        &format!(
            "ops = allocs + frees. Each thread pinned to its own CPU, alloc_on/free_on that CPU's heap: \
             {LOCAL_BATCH} blocks allocated, then freed newest first; {} ms per run after {} ms warm-up.",
            duration.as_millis(),
            warmup.as_millis()
        ),
    );
    rep.note(
        BENCH,
        &format!(
            "ops_per_sec: median of {} runs (min, max). p50/p99_ns: one alloc or free call, ~1 in {SAMPLE_EVERY} \
             sampled with rdtsc, all runs merged. Pool >= 1 GiB of frame numbers (no memory mapped); \
             metadata_bytes: the allocator's own; rss_bytes: process VmRSS with the allocator live (max).",
            opts.repeat
        ),
    );
    rep.note(
        "buddy-local-ratio",
        "ratio = ops_per_sec of system / ops_per_sec of global-lock, paired run by run: median (min, max).",
    );
    for &size in &opts.sizes {
        let order = order_of(size);
        for &threads in &opts.threads {
            let mut runs: Vec<Vec<Option<LocalRun>>> =
                opts.allocators.iter().map(|_| Vec::new()).collect();
            for r in 0..opts.repeat {
                for (ai, &kind) in opts.allocators.iter().enumerate() {
                    pb.set_message(format!(
                        "local {kind} t={threads} size={size} rep {}",
                        r + 1
                    ));
                    let res = local_run(kind, threads, order, warmup, duration, cpus);
                    pb.inc(1);
                    runs[ai].push(match res {
                        Ok(run) => Some(run),
                        Err(e) => {
                            rep.error(format!(
                                "{BENCH} {kind} threads={threads} size_frames={size}: {e}"
                            ));
                            None
                        }
                    });
                }
            }
            for (ai, &kind) in opts.allocators.iter().enumerate() {
                let ok: Vec<&LocalRun> = runs[ai].iter().flatten().collect();
                if ok.is_empty() {
                    continue;
                }
                let ops = Spread::of(&ok.iter().map(|r| r.ops_per_sec).collect::<Vec<_>>());
                let mut hist = new_hist().map_err(std::io::Error::other)?;
                for r in &ok {
                    hist.add(&r.hist)
                        .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
                }
                let ns = |q: f64| tsc_to_ns(hist.value_at_quantile(q));
                rep.emit(
                    Row::new(BENCH, kind.name(), threads)
                        .set("size_frames", size)
                        .set_spread("ops_per_sec", &ops, 0)
                        .set("p50_ns", ns(0.5))
                        .set("p99_ns", ns(0.99))
                        .set("heaps", ok[0].heaps)
                        .set("metadata_bytes", ok[0].metadata_bytes)
                        .set("rss_bytes", ok.iter().filter_map(|r| r.rss_bytes).max()),
                )?;
            }
            let base = opts
                .allocators
                .iter()
                .position(|&k| k == AllocatorKind::GlobalLock);
            let Some(base) = base else { continue };
            for (ai, &kind) in opts.allocators.iter().enumerate() {
                if ai == base {
                    continue;
                }
                let ratios: Vec<f64> = runs[ai]
                    .iter()
                    .zip(&runs[base])
                    .filter_map(|(x, b)| Some(x.as_ref()?.ops_per_sec / b.as_ref()?.ops_per_sec))
                    .collect();
                if ratios.is_empty() {
                    continue;
                }
                let s = Spread::of(&ratios);
                rep.emit(
                    Row::new("buddy-local-ratio", &format!("{kind}/global-lock"), threads)
                        .set("size_frames", size)
                        .set_spread("ratio", &s, 3),
                )?;
            }
        }
    }
    Ok(())
}
