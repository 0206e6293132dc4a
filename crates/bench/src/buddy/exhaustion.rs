//! (c) exhaustion: allocate until out of memory (every frame exactly once),
//! free everything cross-thread, and check the pool is whole again.

use super::*;

pub(super) struct ExhRun {
    pub(super) allocated_frames: u64,
    /// Free frames (plus in flight) the allocator still had when every thread had seen OOM.
    pub(super) free_at_oom: u64,
    /// Duration of the failing call, slowest thread.
    pub(super) oom_ns: u64,
    pub(super) duplicates: u64,
    pub(super) fin: Stats,
}

pub(super) struct ExhShared<'a> {
    pub(super) a: &'a dyn FrameAllocator,
    pub(super) order: u32,
    pub(super) threads: usize,
    pub(super) slots: Vec<Mutex<Vec<FrameNo>>>,
    pub(super) start: Barrier,
    pub(super) filled: Barrier,
    pub(super) release: Barrier,
}

/// Thread `i`: allocate until OOM, deposit the blocks, wait, then free the
/// blocks thread `i + 1` got, on this thread's heap. Returns the duration of
/// the failing call.
pub(super) fn exh_worker(sh: &ExhShared, i: usize, cpu: usize, heap: usize) -> Result<u64> {
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
                )
                .into())
            }
            Err(AllocError::OutOfMemory { .. }) => break Ok(tsc_to_ns(t1.wrapping_sub(t0))),
            Err(e) => {
                break Err(format!(
                    "alloc_on(heap {heap}, order {order}) after {} blocks: {e}",
                    got.len()
                )
                .into())
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
        Some(e) => Err(format!("{free_errs} frees failed, first: {e}").into()),
    }
}

pub(super) fn exhaustion_run(
    kind: AllocatorKind,
    threads: usize,
    order: u32,
    cpus: &[usize],
) -> Result<ExhRun> {
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

pub(super) fn exhaustion(
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
                let row = Row::new(BENCH, kind.name(), threads)
                    .set("order", order)
                    .set("allocated_frames", w.allocated_frames)
                    .set("total_frames", w.fin.total_frames)
                    .set_spread("oom_detect_ns", &oom, 0)
                    .set("fully_coalesced", w.fin.fully_coalesced());
                rep.emit(set_coalescing(row, &w.fin).set("reps_ok", reps_ok))?;
            }
        }
    }
    Ok(())
}
