//! `memlab buddy`: the physical-frame allocators of the `buddy` crate, side
//! by side (distributed, global-lock, linux-pcp), in three workloads.
//!
//! * **local** — every thread pinned to its own CPU allocates and frees on
//!   that CPU's heap: batches of [`LOCAL_BATCH`] blocks allocated, then freed
//!   newest first. This is the common case the distributed design optimizes:
//!   heaps private to a CPU should scale, one global lock should not.
//!   Throughput counts `ops = allocs + frees`; latency of single calls is
//!   sampled about once every [`SAMPLE_EVERY`] ops with `rdtsc`.
//!
//! * **imbalance** — producer/consumer pairs: the producer, on an even CPU,
//!   allocates on its heap and sends the blocks over a bounded channel to
//!   the consumer on the next CPU, which frees them on *its* heap. Frames
//!   drain out of one heap and pile up in another, so the distributed
//!   allocator must borrow, forward frees and send frames home (§4.1.2-3 of
//!   the fos thesis). A time series samples `stats()` every
//!   [`SERIES_INTERVAL`]; at the end everything is freed, the allocator is
//!   quiesced and must be fully coalesced.
//!
//! * **exhaustion** — all threads allocate until `OutOfMemory`. Every frame
//!   of the pool must have been handed out exactly once (no premature OOM,
//!   no duplicates), the failing call must come back in bounded time, and
//!   after every block is freed — by a *different* thread than the one that
//!   got it, on its own heap — and a quiesce, the pool must be whole again.
//!
//! The allocators manage frame numbers only; no memory is mapped, so what
//! is measured is the allocator's bookkeeping and synchronization. Runs of
//! the systems are interleaved (`for rep { for system { run } }`) so that
//! the ratios compare runs made under the same conditions.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use buddy::{AllocError, AllocatorKind, BuddyConfig, FrameAllocator, FrameNo, Stats};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use topology::{rdtsc, tsc_to_ns};

use crate::report::{Reporter, Row};
use crate::util::{self, join_all, new_hist, Rng, Spread, Watchdog};

/// Blocks allocated, then freed, per round of the local workload.
pub const LOCAL_BATCH: usize = 64;
/// Mean interval, in ops, between latency samples (jittered uniformly in
/// `[1, 2 * SAMPLE_EVERY)` so it does not alias with the batch).
pub const SAMPLE_EVERY: u64 = 64;
/// Frames in the local workload's pool, at least (1 GiB).
const LOCAL_MIN_POOL_FRAMES: u64 = 1 << 18;
/// Imbalance: frames per producer/consumer pair (256 MiB).
const IMBALANCE_POOL_FRAMES_PER_PAIR: u64 = 1 << 16;
/// Imbalance: blocks per channel message.
const IMBALANCE_BATCH: usize = 32;
/// Imbalance: channel bound, in batches. Kept the same for every order: a
/// shallow channel makes the producer park on every send, and the run then
/// measures futex wake-ups instead of the allocator.
const IMBALANCE_CHANNEL_BATCHES: usize = 32;
/// Imbalance: frames' worth of blocks the consumer keeps before freeing the
/// oldest, one configuration each. A small live set: frames drain back home
/// through the consumer's heap (returns). Half the pool (the producer's
/// whole share with 2 heaps): the producer's heap runs dry and must borrow.
pub const IMBALANCE_QUEUE_FRAMES: [u64; 2] = [4096, 32768];
/// Imbalance: time-series sampling interval.
pub const SERIES_INTERVAL: Duration = Duration::from_millis(100);
/// Exhaustion: pool size (64 MiB).
const EXHAUSTION_POOL_FRAMES: u64 = 1 << 14;
/// A run taking this much longer than planned is declared hung.
const HANG_GRACE: Duration = Duration::from_secs(60);

/// The workloads, selectable with `--workload`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Per-CPU alloc/free throughput and latency.
    Local,
    /// Producer/consumer across CPUs; rebalancing time series.
    Imbalance,
    /// Allocate until out of memory; free everything; check the pool.
    Exhaustion,
}

/// Everything `memlab buddy` needs, resolved from the command line.
pub struct BuddyOpts {
    pub workloads: Vec<Workload>,
    pub allocators: Vec<AllocatorKind>,
    pub threads: Vec<usize>,
    /// Block sizes of the local workload, in frames (powers of two).
    pub sizes: Vec<u64>,
    pub repeat: usize,
    pub quick: bool,
    /// Overrides the measured duration of local and imbalance runs.
    pub duration: Option<Duration>,
}

impl BuddyOpts {
    fn local_warmup(&self) -> Duration {
        Duration::from_millis(if self.quick { 30 } else { 100 })
    }
    fn local_duration(&self) -> Duration {
        self.duration
            .unwrap_or(Duration::from_millis(if self.quick { 250 } else { 1000 }))
    }
    fn imbalance_duration(&self) -> Duration {
        self.duration
            .unwrap_or(Duration::from_millis(if self.quick { 1000 } else { 2000 }))
    }
    fn imbalance_orders(&self) -> Vec<u32> {
        if self.quick {
            vec![0]
        } else {
            vec![0, 3]
        }
    }
    /// Imbalance uses pairs: the even thread counts of the list (at least 2).
    fn imbalance_threads(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .threads
            .iter()
            .copied()
            .filter(|t| t % 2 == 0)
            .collect();
        if v.is_empty() {
            v.push(2);
        }
        v
    }
}

/// Run the selected workloads; rows go to `rep`.
pub fn run(opts: &BuddyOpts, rep: &mut Reporter) -> std::io::Result<()> {
    let cpus = util::online_cpus();
    let n_alloc = opts.allocators.len() as u64;
    let r = opts.repeat as u64;
    let mut total = 0;
    for w in &opts.workloads {
        total += match w {
            Workload::Local => opts.sizes.len() as u64 * opts.threads.len() as u64 * n_alloc * r,
            Workload::Imbalance => {
                opts.imbalance_orders().len() as u64
                    * IMBALANCE_QUEUE_FRAMES.len() as u64
                    * opts.imbalance_threads().len() as u64
                    * n_alloc
                    * r
            }
            Workload::Exhaustion => 2 * opts.threads.len() as u64 * n_alloc * r,
        };
    }
    let pb = util::progress_bar(total, "memlab buddy");
    rep.set_progress(pb.clone());
    for w in &opts.workloads {
        match w {
            Workload::Local => local(opts, &cpus, rep, &pb)?,
            Workload::Imbalance => imbalance(opts, &cpus, rep, &pb)?,
            Workload::Exhaustion => exhaustion(opts, &cpus, rep, &pb)?,
        }
        rep.flush()?;
    }
    pb.finish_and_clear();
    rep.set_progress(ProgressBar::hidden());
    Ok(())
}

fn build(
    kind: AllocatorKind,
    frames: u64,
    heaps: usize,
) -> Result<Box<dyn FrameAllocator>, String> {
    let cfg = BuddyConfig {
        check_frees: false,
        heaps: Some(heaps),
        ..Default::default()
    };
    buddy::new_allocator(kind, frames, &cfg)
        .map_err(|e| format!("cannot build {kind} over {frames} frames with {heaps} heaps: {e}"))
}

fn order_of(frames: u64) -> u32 {
    frames.trailing_zeros()
}

// ---------------------------------------------------------------------------
// (a) local

const PHASE_WARMUP: u8 = 0;
const PHASE_MEASURE: u8 = 1;
const PHASE_STOP: u8 = 2;

/// Times about one call in [`SAMPLE_EVERY`] into a histogram of TSC ticks.
struct Sampler {
    countdown: u64,
    rng: Rng,
    hist: Histogram<u64>,
}

impl Sampler {
    fn new(seed: u64) -> Result<Sampler, String> {
        let mut rng = Rng::new(seed);
        Ok(Sampler {
            countdown: rng.range(1, 2 * SAMPLE_EVERY),
            rng,
            hist: new_hist()?,
        })
    }

    #[inline(always)]
    fn call<T>(&mut self, f: impl FnOnce() -> T) -> T {
        self.countdown -= 1;
        if self.countdown != 0 {
            return f();
        }
        self.countdown = self.rng.range(1, 2 * SAMPLE_EVERY);
        let t0 = rdtsc();
        let r = f();
        let t1 = rdtsc();
        self.hist.saturating_record(t1.wrapping_sub(t0).max(1));
        r
    }
}

struct LocalThread {
    ops: u64,
    secs: f64,
    hist: Histogram<u64>,
}

fn local_worker(
    a: &dyn FrameAllocator,
    heap: usize,
    cpu: usize,
    order: u32,
    phase: &AtomicU8,
    barrier: &Barrier,
    seed: u64,
) -> Result<LocalThread, String> {
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
                    ))
                }
            }
        }
        while let Some(f) = blocks.pop() {
            s.call(|| a.free_on(heap, f, order))
                .map_err(|e| format!("free_on(heap {heap}, frame {f}, order {order}): {e}"))?;
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

struct LocalRun {
    ops_per_sec: f64,
    hist: Histogram<u64>,
    metadata_bytes: u64,
    rss_bytes: Option<u64>,
    heaps: usize,
}

/// Pool for the local workload: 1 GiB, or more so that every thread's
/// working set is at most 1/16 of it (4 GiB for 512-frame blocks on 2 threads).
fn local_pool_frames(order: u32, threads: usize) -> u64 {
    let ws = (LOCAL_BATCH as u64) << order;
    (ws * threads.max(2) as u64 * 16)
        .next_power_of_two()
        .max(LOCAL_MIN_POOL_FRAMES)
}

fn local_run(
    kind: AllocatorKind,
    threads: usize,
    order: u32,
    warmup: Duration,
    duration: Duration,
    cpus: &[usize],
) -> Result<LocalRun, String> {
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
        hist.add(&t.hist).map_err(|e| format!("histogram: {e:?}"))?;
    }
    Ok(LocalRun {
        ops_per_sec,
        hist,
        metadata_bytes: a.stats().metadata_bytes,
        rss_bytes: util::rss_bytes(),
        heaps,
    })
}

fn local(
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

// ---------------------------------------------------------------------------
// (b) imbalance

/// Time-series figures taken from `Stats`, in row order.
const SERIES_FIELDS: [&str; 8] = [
    "free_frames",
    "in_flight_frames",
    "live_frames",
    "borrows",
    "frames_borrowed",
    "frames_returned",
    "forwarded_frees",
    "distributed_fragmentation_frames",
];

fn series_figures(s: &Stats) -> [u64; 8] {
    [
        s.free_frames,
        s.in_flight_frames,
        s.total_frames
            .saturating_sub(s.free_frames + s.in_flight_frames),
        s.sum(|h| h.borrows),
        s.sum(|h| h.frames_borrowed),
        s.sum(|h| h.frames_returned),
        s.sum(|h| h.forwarded_frees),
        s.distributed_fragmentation_frames,
    ]
}

struct ImbSample {
    t_ms: u64,
    ops_per_sec: f64,
    figures: [u64; 8],
}

struct ImbRun {
    samples: Vec<ImbSample>,
    mean_ops_per_sec: f64,
    last: Stats,
    fin: Stats,
}

/// What the producers and consumers of one imbalance run share.
struct PairCtx<'a> {
    a: &'a dyn FrameAllocator,
    order: u32,
    /// Allocations plus frees so far.
    ops: AtomicU64,
    stop: AtomicBool,
    barrier: Barrier,
}

fn producer(
    cx: &PairCtx,
    heap: usize,
    cpu: usize,
    tx: SyncSender<Vec<FrameNo>>,
) -> Result<(), String> {
    let (a, order, ops) = (cx.a, cx.order, &cx.ops);
    let pinned = util::pin_to(cpu);
    cx.barrier.wait();
    pinned?;
    while !cx.stop.load(Ordering::Relaxed) {
        let mut batch = Vec::with_capacity(IMBALANCE_BATCH);
        for _ in 0..IMBALANCE_BATCH {
            match a.alloc_on(heap, order) {
                Ok(f) => batch.push(f),
                Err(e) => {
                    let held = batch.len();
                    // Hand what we have to the consumer so it is freed.
                    let _ = tx.send(batch);
                    return Err(format!("producer alloc_on(heap {heap}, order {order}) after {held} blocks of a batch: {e}"));
                }
            }
        }
        ops.fetch_add(IMBALANCE_BATCH as u64, Ordering::Relaxed);
        if tx.send(batch).is_err() {
            return Err("consumer hung up".into());
        }
    }
    Ok(())
}

fn consumer(
    cx: &PairCtx,
    heap: usize,
    cpu: usize,
    keep_frames: u64,
    rx: Receiver<Vec<FrameNo>>,
) -> Result<(), String> {
    let (a, order, ops) = (cx.a, cx.order, &cx.ops);
    let pinned = util::pin_to(cpu);
    cx.barrier.wait();
    pinned?;
    let keep = ((keep_frames >> order) as usize).max(1);
    let mut q: VecDeque<FrameNo> = VecDeque::with_capacity(keep + IMBALANCE_BATCH);
    let free = |f: FrameNo| {
        a.free_on(heap, f, order)
            .map_err(|e| format!("consumer free_on(heap {heap}, frame {f}, order {order}): {e}"))
    };
    // Runs until the producer hangs up and the channel is empty.
    for batch in rx.iter() {
        q.extend(batch);
        let mut n = 0;
        while q.len() > keep {
            free(q.pop_front().expect("len > keep"))?;
            n += 1;
        }
        ops.fetch_add(n, Ordering::Relaxed);
    }
    for f in q {
        free(f)?;
    }
    Ok(())
}

fn imbalance_run(
    kind: AllocatorKind,
    threads: usize,
    order: u32,
    queue_frames: u64,
    duration: Duration,
    cpus: &[usize],
) -> Result<ImbRun, String> {
    let ncpu = cpus.len();
    let pairs = (threads / 2).max(1);
    let heaps = (2 * pairs).min(ncpu);
    let frames = IMBALANCE_POOL_FRAMES_PER_PAIR * pairs as u64;
    let alloc = build(kind, frames, heaps)?;
    let a: &dyn FrameAllocator = &*alloc;
    let failed = &AtomicBool::new(false);
    let cx = &PairCtx {
        a,
        order,
        ops: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        barrier: Barrier::new(2 * pairs + 1),
    };
    let _wd = Watchdog::arm(
        duration + HANG_GRACE,
        format!(
            "buddy imbalance {kind} threads={threads} order={order} queue_frames={queue_frames}"
        ),
    );
    let (samples, mean_ops_per_sec, last) = thread::scope(|s| {
        let mut handles = Vec::new();
        for p in 0..pairs {
            let (tx, rx) = sync_channel::<Vec<FrameNo>>(IMBALANCE_CHANNEL_BATCHES);
            let (ip, ic) = (2 * p, 2 * p + 1);
            let (cpu_p, cpu_c) = (cpus[ip % ncpu], cpus[ic % ncpu]);
            let (heap_p, heap_c) = (ip % heaps, ic % heaps);
            handles.push(s.spawn(move || {
                let r = producer(cx, heap_p, cpu_p, tx);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                r
            }));
            handles.push(s.spawn(move || {
                let r = consumer(cx, heap_c, cpu_c, queue_frames, rx);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                r
            }));
        }
        cx.barrier.wait();
        let t0 = Instant::now();
        let (mut prev_t, mut prev_ops) = (t0, 0u64);
        let mut samples = Vec::new();
        let mut last = Stats::default();
        let mut k = 1u32;
        while SERIES_INTERVAL * k <= duration && !failed.load(Ordering::Relaxed) {
            let target = t0 + SERIES_INTERVAL * k;
            if let Some(d) = target.checked_duration_since(Instant::now()) {
                thread::sleep(d);
            }
            let (now, n) = (Instant::now(), cx.ops.load(Ordering::Relaxed));
            last = a.stats();
            samples.push(ImbSample {
                t_ms: (SERIES_INTERVAL * k).as_millis() as u64,
                ops_per_sec: (n - prev_ops) as f64 / (now - prev_t).as_secs_f64(),
                figures: series_figures(&last),
            });
            (prev_t, prev_ops) = (now, n);
            k += 1;
        }
        let mean = prev_ops as f64 / (prev_t - t0).as_secs_f64().max(1e-9);
        cx.stop.store(true, Ordering::Relaxed);
        join_all(handles).map(|_| (samples, mean, last))
    })?;
    a.quiesce();
    Ok(ImbRun {
        samples,
        mean_ops_per_sec,
        last,
        fin: a.stats(),
    })
}

/// Whether a quiesced, idle allocator has its whole pool back, coalesced.
/// `Err` says what is wrong.
fn check_whole(s: &Stats) -> Result<(), String> {
    let expected = s.total_frames >> s.max_order;
    let at_max = max_order_blocks(s);
    let mut wrong = Vec::new();
    if s.free_frames + s.in_flight_frames != s.total_frames {
        wrong.push(format!(
            "{} frames lost (free {} + in flight {} of {})",
            s.total_frames as i64 - (s.free_frames + s.in_flight_frames) as i64,
            s.free_frames,
            s.in_flight_frames,
            s.total_frames
        ));
    }
    if s.in_flight_frames != 0 {
        wrong.push(format!(
            "{} frames still in flight after quiesce",
            s.in_flight_frames
        ));
    }
    if !s.fully_coalesced() {
        wrong.push(format!(
            "not fully coalesced ({} frames of distributed fragmentation)",
            s.distributed_fragmentation_frames
        ));
    }
    if at_max != expected {
        wrong.push(format!(
            "{at_max} free blocks of the maximum order {}, expected {expected}; free blocks by order {:?}",
            s.max_order, s.free_blocks_by_order
        ));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

fn max_order_blocks(s: &Stats) -> u64 {
    s.free_blocks_by_order
        .get(s.max_order as usize)
        .copied()
        .unwrap_or(0)
}

fn imbalance(
    opts: &BuddyOpts,
    cpus: &[usize],
    rep: &mut Reporter,
    pb: &ProgressBar,
) -> std::io::Result<()> {
    const BENCH: &str = "buddy-imbalance";
    const FINAL: &str = "buddy-imbalance-final";
    let duration = opts.imbalance_duration();
    rep.note(
        BENCH,
        &format!(
            "Producer on CPU 2i allocates on its heap and sends blocks (batches of {IMBALANCE_BATCH}, \
             channel of {IMBALANCE_CHANNEL_BATCHES} batches) to a consumer on CPU 2i+1 that frees them on its heap, \
             keeping the newest queue_frames frames' worth of blocks (a small live set, and half the pool: \
             then the producer's heap runs dry). Pool {} MiB per pair. {} ms per run.",
            (IMBALANCE_POOL_FRAMES_PER_PAIR * 4096) >> 20,
            duration.as_millis()
        ),
    );
    rep.note(
        BENCH,
        &format!(
            "Every {} ms: ops_per_sec = (allocs + frees)/s in that interval, median (min, max) of {} runs; \
             other columns: stats() at that instant, median of the runs, counters summed over heaps.",
            SERIES_INTERVAL.as_millis(),
            opts.repeat
        ),
    );
    rep.note(
        FINAL,
        "After the consumer freed everything and quiesce(): the pool must be whole and fully coalesced \
         (worst of the runs shown; reps_ok = runs that passed). mean_ops_per_sec: whole run, median.",
    );
    for (order, queue) in opts
        .imbalance_orders()
        .into_iter()
        .flat_map(|o| IMBALANCE_QUEUE_FRAMES.map(|q| (o, q)))
    {
        for threads in opts.imbalance_threads() {
            // Interleaved (for rep { for system }) like the local runs, so that
            // a disturbance hits every system alike.
            let mut all_runs: Vec<Vec<ImbRun>> =
                opts.allocators.iter().map(|_| Vec::new()).collect();
            for r in 0..opts.repeat {
                for (ai, &kind) in opts.allocators.iter().enumerate() {
                    pb.set_message(format!(
                        "imbalance {kind} t={threads} order={order} queue={queue} rep {}",
                        r + 1
                    ));
                    let res = imbalance_run(kind, threads, order, queue, duration, cpus);
                    pb.inc(1);
                    match res {
                        Ok(run) => all_runs[ai].push(run),
                        Err(e) => rep.error(format!(
                            "{BENCH} {kind} threads={threads} order={order} queue_frames={queue}: {e}"
                        )),
                    }
                }
            }
            for (&kind, runs) in opts.allocators.iter().zip(&all_runs) {
                if runs.is_empty() {
                    continue;
                }
                let n = runs.iter().map(|r| r.samples.len()).min().unwrap_or(0);
                for i in 0..n {
                    let ops = Spread::of(
                        &runs
                            .iter()
                            .map(|r| r.samples[i].ops_per_sec)
                            .collect::<Vec<_>>(),
                    );
                    let mut row = Row::new(BENCH, kind.name(), threads)
                        .set("order", order)
                        .set("queue_frames", queue)
                        .set("t_ms", runs[0].samples[i].t_ms)
                        .set_spread("ops_per_sec", &ops, 0);
                    for (j, name) in SERIES_FIELDS.iter().enumerate() {
                        let v = Spread::of(
                            &runs
                                .iter()
                                .map(|r| r.samples[i].figures[j] as f64)
                                .collect::<Vec<_>>(),
                        );
                        row = row.set(name, v.median.round() as u64);
                    }
                    rep.emit(row)?;
                }
                let mut reps_ok = 0;
                let mut worst: Option<&ImbRun> = None;
                for (r, run) in runs.iter().enumerate() {
                    match check_whole(&run.fin) {
                        Ok(()) => reps_ok += 1,
                        Err(e) => {
                            rep.fail(format!(
                                "{FINAL} {kind} threads={threads} order={order} queue_frames={queue} run {}: {e}",
                                r + 1
                            ));
                            worst.get_or_insert(run);
                        }
                    }
                }
                let w = worst.unwrap_or(runs.last().expect("non-empty"));
                let mean = Spread::of(&runs.iter().map(|r| r.mean_ops_per_sec).collect::<Vec<_>>());
                rep.emit(
                    Row::new(FINAL, kind.name(), threads)
                        .set("order", order)
                        .set("queue_frames", queue)
                        .set("fully_coalesced", w.fin.fully_coalesced())
                        .set("free_frames", w.fin.free_frames)
                        .set("total_frames", w.fin.total_frames)
                        .set("in_flight_frames", w.fin.in_flight_frames)
                        .set("free_blocks_at_max_order", max_order_blocks(&w.fin))
                        .set(
                            "expected_max_order_blocks",
                            w.fin.total_frames >> w.fin.max_order,
                        )
                        .set(
                            "distributed_fragmentation_frames",
                            w.fin.distributed_fragmentation_frames,
                        )
                        .set("borrows", w.last.sum(|h| h.borrows))
                        .set("forwarded_frees", w.last.sum(|h| h.forwarded_frees))
                        .set_f("mean_ops_per_sec", mean.median, 0)
                        .set("reps_ok", reps_ok),
                )?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// (c) exhaustion

struct ExhRun {
    allocated_frames: u64,
    /// Free frames (plus in flight) the allocator still had when every thread had seen OOM.
    free_at_oom: u64,
    /// Duration of the failing call, slowest thread.
    oom_ns: u64,
    duplicates: u64,
    fin: Stats,
}

struct ExhShared<'a> {
    a: &'a dyn FrameAllocator,
    order: u32,
    threads: usize,
    slots: Vec<Mutex<Vec<FrameNo>>>,
    start: Barrier,
    filled: Barrier,
    release: Barrier,
}

/// Thread `i`: allocate until OOM, deposit the blocks, wait, then free the
/// blocks thread `i + 1` got, on this thread's heap. Returns the duration of
/// the failing call.
fn exh_worker(sh: &ExhShared, i: usize, cpu: usize, heap: usize) -> Result<u64, String> {
    let (a, order) = (sh.a, sh.order);
    let cap = (a.total_frames() >> order) as usize;
    let pinned = util::pin_to(cpu);
    sh.start.wait();
    let mut got = Vec::new();
    let result = pinned.and_then(|()| loop {
        let t0 = rdtsc();
        let r = a.alloc_on(heap, order);
        let t1 = rdtsc();
        match r {
            Ok(f) if got.len() < cap => got.push(f),
            Ok(_) => {
                break Err(format!(
                    "more than {cap} blocks of order {order} handed out to one thread"
                ))
            }
            Err(AllocError::OutOfMemory { .. }) => break Ok(tsc_to_ns(t1.wrapping_sub(t0))),
            Err(e) => {
                break Err(format!(
                    "alloc_on(heap {heap}, order {order}) after {} blocks: {e}",
                    got.len()
                ))
            }
        }
    });
    *sh.slots[i].lock().unwrap_or_else(|p| p.into_inner()) = got;
    // Every worker must reach both barriers, whatever happened, or the others hang.
    sh.filled.wait();
    sh.release.wait();
    let theirs = std::mem::take(
        &mut *sh.slots[(i + 1) % sh.threads]
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    );
    let mut free_errs = 0;
    let mut first = None;
    for f in theirs {
        if let Err(e) = a.free_on(heap, f, order) {
            free_errs += 1;
            first.get_or_insert(format!(
                "free_on(heap {heap}, frame {f}, order {order}): {e}"
            ));
        }
    }
    let oom_ns = result?;
    match first {
        None => Ok(oom_ns),
        Some(e) => Err(format!("{free_errs} frees failed, first: {e}")),
    }
}

fn exhaustion_run(
    kind: AllocatorKind,
    threads: usize,
    order: u32,
    cpus: &[usize],
) -> Result<ExhRun, String> {
    let ncpu = cpus.len();
    let heaps = threads.min(ncpu);
    let alloc = build(kind, EXHAUSTION_POOL_FRAMES, heaps)?;
    let sh = &ExhShared {
        a: &*alloc,
        order,
        threads,
        slots: (0..threads).map(|_| Mutex::new(Vec::new())).collect(),
        start: Barrier::new(threads + 1),
        filled: Barrier::new(threads + 1),
        release: Barrier::new(threads + 1),
    };
    let _wd = Watchdog::arm(
        HANG_GRACE,
        format!("buddy exhaustion {kind} threads={threads} order={order}"),
    );
    let (oom, allocated_frames, free_at_oom, duplicates) = thread::scope(|s| {
        let handles = (0..threads)
            .map(|i| s.spawn(move || exh_worker(sh, i, cpus[i % ncpu], i % heaps)))
            .collect();
        sh.start.wait();
        sh.filled.wait();
        // Everybody has seen OOM: count what they hold, check no frame is held twice.
        let st = sh.a.stats();
        let mut seen = vec![false; sh.a.total_frames() as usize];
        let (mut blocks, mut dup) = (0u64, 0u64);
        for slot in &sh.slots {
            for &f in slot.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                blocks += 1;
                for x in f..(f + (1u64 << order)).min(seen.len() as u64) {
                    dup += u64::from(std::mem::replace(&mut seen[x as usize], true));
                }
            }
        }
        sh.release.wait();
        join_all(handles).map(|oom| {
            (
                oom,
                blocks << order,
                st.free_frames + st.in_flight_frames,
                dup,
            )
        })
    })?;
    sh.a.quiesce();
    Ok(ExhRun {
        allocated_frames,
        free_at_oom,
        oom_ns: oom.into_iter().max().unwrap_or(0),
        duplicates,
        fin: sh.a.stats(),
    })
}

fn exhaustion(
    opts: &BuddyOpts,
    cpus: &[usize],
    rep: &mut Reporter,
    pb: &ProgressBar,
) -> std::io::Result<()> {
    const BENCH: &str = "buddy-exhaustion";
    rep.note(
        BENCH,
        &format!(
            "All threads allocate until OutOfMemory from a {} MiB pool; then thread i frees thread i+1's blocks \
             on its own heap, and quiesce(). allocated_frames must equal total_frames (worst of {} runs); \
             oom_detect_ns: duration of the failing call, slowest thread, median (min, max).",
            (EXHAUSTION_POOL_FRAMES * 4096) >> 20,
            opts.repeat
        ),
    );
    for order in [0u32, 3] {
        for &threads in &opts.threads {
            for &kind in &opts.allocators {
                let mut runs = Vec::new();
                for r in 0..opts.repeat {
                    pb.set_message(format!(
                        "exhaustion {kind} t={threads} order={order} rep {}",
                        r + 1
                    ));
                    let res = exhaustion_run(kind, threads, order, cpus);
                    pb.inc(1);
                    match res {
                        Ok(run) => runs.push(run),
                        Err(e) => rep.error(format!(
                            "{BENCH} {kind} threads={threads} order={order}: {e}"
                        )),
                    }
                }
                if runs.is_empty() {
                    continue;
                }
                let what = format!("{BENCH} {kind} threads={threads} order={order}");
                let mut reps_ok = 0;
                let mut worst: Option<&ExhRun> = None;
                for (r, run) in runs.iter().enumerate() {
                    let mut wrong = Vec::new();
                    let total = run.fin.total_frames;
                    if run.allocated_frames != total {
                        wrong.push(format!(
                            "OutOfMemory after {} of {total} frames ({} still free or in flight at OOM)",
                            run.allocated_frames, run.free_at_oom
                        ));
                    }
                    if run.duplicates != 0 {
                        wrong.push(format!("{} frames handed out twice", run.duplicates));
                    }
                    if let Err(e) = check_whole(&run.fin) {
                        wrong.push(format!("after freeing everything and quiesce: {e}"));
                    }
                    if wrong.is_empty() {
                        reps_ok += 1;
                    } else {
                        rep.fail(format!("{what} run {}: {}", r + 1, wrong.join("; ")));
                        worst.get_or_insert(run);
                    }
                }
                let w = worst.unwrap_or(runs.last().expect("non-empty"));
                let oom = Spread::of(&runs.iter().map(|r| r.oom_ns as f64).collect::<Vec<_>>());
                rep.emit(
                    Row::new(BENCH, kind.name(), threads)
                        .set("order", order)
                        .set("allocated_frames", w.allocated_frames)
                        .set("total_frames", w.fin.total_frames)
                        .set_spread("oom_detect_ns", &oom, 0)
                        .set("fully_coalesced", w.fin.fully_coalesced())
                        .set("free_blocks_at_max_order", max_order_blocks(&w.fin))
                        .set(
                            "expected_max_order_blocks",
                            w.fin.total_frames >> w.fin.max_order,
                        )
                        .set(
                            "distributed_fragmentation_frames",
                            w.fin.distributed_fragmentation_frames,
                        )
                        .set("reps_ok", reps_ok),
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_pool_sizes() {
        assert_eq!(local_pool_frames(0, 1), 1 << 18);
        assert_eq!(local_pool_frames(3, 2), 1 << 18);
        assert_eq!(local_pool_frames(9, 2), 1 << 20);
    }

    #[test]
    fn check_whole_reports_lost_and_split_frames() {
        let mut s = Stats {
            total_frames: 16,
            free_frames: 16,
            max_order: 3,
            free_blocks_by_order: vec![0, 0, 0, 2],
            ..Default::default()
        };
        assert!(check_whole(&s).is_ok());
        s.free_frames = 15;
        let e = check_whole(&s).unwrap_err();
        assert!(e.contains("1 frames lost"), "{e}");
        s.free_frames = 16;
        s.distributed_fragmentation_frames = 8;
        s.free_blocks_by_order = vec![0, 0, 2, 1];
        let e = check_whole(&s).unwrap_err();
        assert!(
            e.contains("not fully coalesced") && e.contains("expected 2"),
            "{e}"
        );
    }

    #[test]
    fn imbalance_smoke_all_allocators() {
        let cpus = util::online_cpus();
        for kind in AllocatorKind::ALL {
            let run =
                imbalance_run(kind, 2, 0, 4096, Duration::from_millis(200), &cpus).expect("run");
            assert_eq!(run.samples.len(), 2, "{kind}");
            assert!(run.mean_ops_per_sec > 0.0);
            check_whole(&run.fin).expect("whole");
        }
    }

    #[test]
    fn exhaustion_smoke_all_allocators() {
        for kind in AllocatorKind::ALL {
            let run = exhaustion_run(kind, 1, 0, &[topology::current_cpu()]).expect("run");
            assert_eq!(run.allocated_frames, EXHAUSTION_POOL_FRAMES, "{kind}");
            assert_eq!(run.duplicates, 0);
            check_whole(&run.fin).expect("whole");
        }
    }
}
