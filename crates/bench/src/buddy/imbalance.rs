//! (b) imbalance: producer/consumer pairs free frames on another CPU's heap;
//! a time series of the allocator's stats, then a full-coalescing check.

use super::*;

/// Time-series figures taken from `Stats`, in row order.
pub(super) const SERIES_FIELDS: [&str; 8] = [
    "free_frames",
    "in_flight_frames",
    "live_frames",
    "borrows",
    "frames_borrowed",
    "frames_returned",
    "forwarded_frees",
    "distributed_fragmentation_frames",
];

pub(super) fn series_figures(s: &Stats) -> [u64; 8] {
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

pub(super) struct ImbSample {
    pub(super) t_ms: u64,
    pub(super) ops_per_sec: f64,
    pub(super) figures: [u64; 8],
}

pub(super) struct ImbRun {
    pub(super) samples: Vec<ImbSample>,
    pub(super) mean_ops_per_sec: f64,
    pub(super) last: Stats,
    pub(super) fin: Stats,
}

/// What the producers and consumers of one imbalance run share.
pub(super) struct PairCtx<'a> {
    pub(super) a: &'a dyn FrameAllocator,
    pub(super) order: u32,
    /// Allocations plus frees so far.
    pub(super) ops: AtomicU64,
    pub(super) stop: AtomicBool,
    pub(super) barrier: Barrier,
}

pub(super) fn producer(
    cx: &PairCtx,
    heap: usize,
    cpu: usize,
    tx: SyncSender<Vec<FrameNo>>,
) -> Result<()> {
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
                    return Err(e).with_context(|| format!("producer alloc_on(heap {heap}, order {order}) after {held} blocks of a batch"));
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

pub(super) fn consumer(
    cx: &PairCtx,
    heap: usize,
    cpu: usize,
    keep_frames: u64,
    rx: Receiver<Vec<FrameNo>>,
) -> Result<()> {
    let (a, order, ops) = (cx.a, cx.order, &cx.ops);
    let pinned = util::pin_to(cpu);
    cx.barrier.wait();
    pinned?;
    let keep = ((keep_frames >> order) as usize).max(1);
    let mut q: VecDeque<FrameNo> = VecDeque::with_capacity(keep + IMBALANCE_BATCH);
    let free = |f: FrameNo| {
        a.free_on(heap, f, order)
            .with_context(|| format!("consumer free_on(heap {heap}, frame {f}, order {order})"))
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

pub(super) fn imbalance_run(
    kind: AllocatorKind,
    threads: usize,
    order: u32,
    queue_frames: u64,
    duration: Duration,
    cpus: &[usize],
) -> Result<ImbRun> {
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
pub(super) fn check_whole(s: &Stats) -> Result<()> {
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
        Err(wrong.join("; ").into())
    }
}

pub(super) fn max_order_blocks(s: &Stats) -> u64 {
    s.free_blocks_by_order
        .get(s.max_order as usize)
        .copied()
        .unwrap_or(0)
}

/// The pool's coalescing after a run, in row order: blocks of the
/// largest order free, how many a whole pool has, and the frames
/// fragmented across heaps.
pub(super) fn set_coalescing(row: Row, fin: &Stats) -> Row {
    row.set("free_blocks_at_max_order", max_order_blocks(fin))
        .set(
            "expected_max_order_blocks",
            fin.total_frames >> fin.max_order,
        )
        .set(
            "distributed_fragmentation_frames",
            fin.distributed_fragmentation_frames,
        )
}

pub(super) fn imbalance(
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
                let row = Row::new(FINAL, kind.name(), threads)
                    .set("order", order)
                    .set("queue_frames", queue)
                    .set("fully_coalesced", w.fin.fully_coalesced())
                    .set("free_frames", w.fin.free_frames)
                    .set("total_frames", w.fin.total_frames)
                    .set("in_flight_frames", w.fin.in_flight_frames);
                rep.emit(
                    set_coalescing(row, &w.fin)
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
