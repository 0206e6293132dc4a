//! Process-per-VAS rows of `jmp-switch` and `jmp-gups`: switch cost against
//! the VAS's mapped size (disjoint and overlapping VASes, beside the
//! in-process remap at the same size) and GUPS over overlapping windows
//! with one process per window's VAS ([`crate::procvas`]).

use super::*;
use crate::procvas::{thread_faults, CommonMem, Mover, ProcOptions, ProcSpaces, MAX_LANES};

const SWITCH_BENCH: &str = "jmp-switch";
/// Pages of a segment the switch loop touches, spread over its whole size.
const TOUCH_PAGES: u64 = 64;
/// Most repeats a lane reports (its result is a fixed-size `Copy` value).
const MAX_REPEATS: usize = 16;

/// What a timing lane brings home.
#[derive(Clone, Copy)]
struct LaneTimes {
    samples: [f64; MAX_REPEATS],
    n: usize,
    faults: u64,
}

impl LaneTimes {
    fn stat(&self) -> Stat {
        stat(self.samples[..self.n].to_vec())
    }
}

/// One byte in page `i % TOUCH_PAGES` of the current VAS's first segment.
fn touch(m: &Mover, i: u64, stride: usize) -> crate::Result<u8> {
    let d = m.data(0)?;
    Ok(d[((i % TOUCH_PAGES) as usize * stride).min(d.len() - 1)])
}

/// Two VASes, one segment each of `bytes`; at one base when `overlap`.
fn pair(jmp: &Jmp, tag: &str, bytes: u64, overlap: bool) -> Res<[String; 2]> {
    let (sa, sb) = (format!("pz-{tag}a"), format!("pz-{tag}b"));
    seg(jmp, &sa, bytes, false, None, false)?;
    if overlap {
        jmp.seg_clone(&sa, &sb)?;
    } else {
        seg(jmp, &sb, bytes, false, None, false)?;
    }
    let names = [format!("pzv-{tag}a"), format!("pzv-{tag}b")];
    vas(jmp, &names[0], &[&sa])?;
    vas(jmp, &names[1], &[&sb])?;
    Ok(names)
}

fn unpair(jmp: &Jmp, tag: &str) -> Res<()> {
    for x in ["a", "b"] {
        jmp.vas_remove(&format!("pzv-{tag}{x}"))?;
        jmp.seg_remove(&format!("pz-{tag}{x}"))?;
    }
    Ok(())
}

fn size_row(system: &str, bytes: u64, s: Stat, faults_per_switch: f64, note: &str) -> Row {
    let mut figures = vec![fig("seg_mib", (bytes >> 20) as f64, 0)];
    figs3(
        &mut figures,
        ["ns_per_switch", "ns_per_switch_min", "ns_per_switch_max"],
        s,
        1,
    );
    figures.push(fig("faults_per_switch", faults_per_switch, 3));
    Row {
        bench: SWITCH_BENCH,
        system: system.into(),
        labels: Vec::new(),
        figures,
        note: note.into(),
    }
}

/// Switch cost against mapped size: in-process remap (overlapping), and
/// process-per-VAS for overlapping and disjoint pairs.
pub(super) fn bench_switch_sizes(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink) -> Res<()> {
    sink.note(
        SWITCH_BENCH,
        "size sweep: each switch touches one byte in one of 64 pages spread over the \
         segment; vas-process-*: one process per VAS keeps its page table, the switch \
         is a futex hand-off between two processes pinned to one CPU (the kernel's \
         page-table load is real, the thread's move is user-level)",
    );
    let repeat = opts.repeat.clamp(1, MAX_REPEATS);
    // The floor: the same hand-off between two processes whose VASes have
    // no segments (nothing to lock, nothing to touch).
    for v in ["pzv-ea", "pzv-eb"] {
        jmp.vas_create(v, 0o660)?;
    }
    let mut rt = ProcSpaces::start(jmp, &["pzv-ea", "pzv-eb"], ProcOptions::default())?;
    let n = lane_pairs(opts);
    let t = rt.run(move |m| {
        let mut out = LaneTimes {
            samples: [0.0; MAX_REPEATS],
            n: repeat,
            faults: 0,
        };
        m.switch(0)?;
        m.switch(1)?;
        for r in 0..repeat {
            let t = Instant::now();
            for _ in 0..n {
                m.switch(0)?;
                m.switch(1)?;
            }
            out.samples[r] = t.elapsed().as_nanos() as f64 / (2 * n) as f64;
        }
        Ok(out)
    })?;
    drop(rt);
    sink.row(size_row(
        "process-handoff",
        0,
        t.stat(),
        0.0,
        "floor: the lane's hand-off between two processes on one CPU, empty VASes",
    ));
    for v in ["pzv-ea", "pzv-eb"] {
        jmp.vas_remove(v)?;
    }
    for &bytes in &opts.switch_sizes {
        let stride = (bytes / TOUCH_PAGES).max(1) as usize;
        for (tag, overlap, system, note) in [
            (
                "o",
                true,
                "vas-process-overlap",
                "one process per VAS, both segments at one base",
            ),
            (
                "d",
                false,
                "vas-process-disjoint",
                "one process per VAS, segments at distinct bases",
            ),
        ] {
            let names = pair(jmp, tag, bytes, overlap)?;
            if overlap {
                remap_row(jmp, &names, opts, sink, repeat, bytes, stride)?;
            }
            let t = lane_switches(jmp, &names, opts, repeat, stride)?;
            let per = t.faults as f64 / (2 * lane_pairs(opts) * repeat as u64) as f64;
            sink.row(size_row(system, bytes, t.stat(), per, note));
            unpair(jmp, tag)?;
        }
    }
    Ok(())
}

/// The in-process switch between the overlapping pair: a remap each time.
fn remap_row(
    jmp: &Jmp,
    names: &[String; 2],
    opts: &Options,
    sink: &mut dyn Sink,
    repeat: usize,
    bytes: u64,
    stride: usize,
) -> Res<()> {
    let ha = jmp.vas_attach(&names[0], AttachOptions::default())?;
    let hb = jmp.vas_attach(&names[1], AttachOptions::default())?;
    let segs = ["pz-oa", "pz-ob"];
    let n = (opts.switch_iters / 100).max(50);
    let mut samples = Vec::new();
    let f0 = thread_faults();
    for _ in 0..repeat {
        let t = Instant::now();
        for i in 0..n {
            for (h, s) in [(&ha, segs[0]), (&hb, segs[1])] {
                let x = h.switch()?;
                let d = x.bytes(s)?;
                black_box(d[((i % TOUCH_PAGES) as usize * stride).min(d.len() - 1)]);
            }
        }
        samples.push(t.elapsed().as_nanos() as f64 / (2 * n) as f64);
    }
    let faults = (thread_faults() - f0) as f64 / (2 * n * repeat as u64) as f64;
    sink.row(size_row(
        "vas-overlap-remap",
        bytes,
        stat(samples),
        faults,
        "in-process: process-wide remap (mmap MAP_FIXED) per switch",
    ));
    Ok(())
}

/// Switch pairs per timed lane run.
fn lane_pairs(opts: &Options) -> u64 {
    (opts.switch_iters / 20).max(100)
}

/// Time `lane_pairs` round trips between the two VASes on a lane.
fn lane_switches(
    jmp: &Jmp,
    names: &[String; 2],
    opts: &Options,
    repeat: usize,
    stride: usize,
) -> Res<LaneTimes> {
    let mut rt = ProcSpaces::start(jmp, &[&names[0], &names[1]], ProcOptions::default())?;
    let n = lane_pairs(opts);
    let out = rt.run(move |m| {
        // Warm up: every touched page once in each VAS.
        for v in 0..2 {
            m.switch(v)?;
            for i in 0..TOUCH_PAGES {
                black_box(touch(m, i, stride)?);
            }
        }
        let mut out = LaneTimes {
            samples: [0.0; MAX_REPEATS],
            n: repeat,
            faults: 0,
        };
        for r in 0..repeat {
            let t = Instant::now();
            for i in 0..n {
                for v in 0..2 {
                    m.switch(v)?;
                    let f0 = m.faults();
                    black_box(touch(m, i, stride)?);
                    out.faults += m.faults() - f0;
                }
            }
            out.samples[r] = t.elapsed().as_nanos() as f64 / (2 * n) as f64;
        }
        Ok(out)
    })?;
    Ok(out)
}

/// What a GUPS lane brings home: per repeat, when its timed pass started
/// and ended (CLOCK_MONOTONIC, ns), and the faults after the first pass.
#[derive(Clone, Copy)]
struct GupsLane {
    start_ns: [u64; MAX_REPEATS],
    end_ns: [u64; MAX_REPEATS],
    faults: u64,
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC is system-wide, so the
    // lanes' VAS processes read one clock.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// VAS-process GUPS: `w` overlapping windows, one process per window's
/// VAS (one page table each) with a carrier thread per lane; one lane per
/// CPU, each moving between the VAS processes per batch.
pub(super) fn gups_process(
    jmp: &Jmp,
    opts: &Options,
    sink: &mut dyn Sink,
    w: u64,
    vases: &[String],
) -> Res<()> {
    let (win, batch, updates) = gups_sizes(opts);
    let repeat = opts.repeat.clamp(1, MAX_REPEATS);
    let names: Vec<&str> = vases.iter().map(|s| s.as_str()).collect();
    let lanes = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, MAX_LANES);
    // A start barrier the lanes' VAS processes all see.
    let barrier = CommonMem::new(8)?;
    let rt = ProcSpaces::start(
        jmp,
        &names,
        ProcOptions {
            lanes,
            ..ProcOptions::default()
        },
    )?;
    let words = (win / 8) as usize;
    let per_lane = (updates / lanes as u64).max(batch);
    let bar = barrier.addr();
    let body = move |m: &mut Mover| -> crate::Result<GupsLane> {
        // SAFETY: the barrier is common memory mapped before the runtimes
        // forked (the same page in every process, 8-aligned), dropped after
        // them.
        let ready = unsafe { &*(bar as *const AtomicU64) };
        // First pass: fault every page of every window (the paper's table
        // is resident), then count what the timed passes fault.
        // The lane's stack, the barrier page and the clock's vDSO page are
        // faulted here too, in each process, so the count is the windows'
        // alone.
        let mut warm = Rng(1);
        let mut base = 0u64;
        for v in 0..w as usize {
            m.switch(v)?;
            let b = m.data_mut(0)?;
            for x in b.iter_mut().step_by(4096) {
                *x = 0;
            }
            // SAFETY: as in the timed loop below.
            let t64 = unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut u64, words) };
            update_batch(t64, &mut warm, 16);
            black_box(monotonic_ns());
            black_box(ready.load(Ordering::Relaxed));
            base += m.faults();
        }
        let mut out = GupsLane {
            start_ns: [0; MAX_REPEATS],
            end_ns: [0; MAX_REPEATS],
            faults: 0,
        };
        // SAFETY: sched_getcpu has no preconditions; the lanes are pinned to
        // distinct CPUs, so they draw distinct streams.
        let cpu = unsafe { libc::sched_getcpu() } as u64;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((cpu + 1) << 32));
        for r in 0..repeat {
            // All lanes start each pass together.
            let gen = (r as u64 + 1) * lanes as u64;
            ready.fetch_add(1, Ordering::AcqRel);
            while ready.load(Ordering::Acquire) < gen {
                std::hint::spin_loop();
            }
            out.start_ns[r] = monotonic_ns();
            let mut done = 0;
            while done < per_lane {
                m.switch((rng.next() % w) as usize)?;
                let b = m.data_mut(0)?;
                // SAFETY: the window's data area is page-aligned and at
                // least `words * 8` bytes; the slice ends with this batch.
                let t64 =
                    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut u64, words) };
                update_batch(t64, &mut rng, batch);
                done += batch;
            }
            out.end_ns[r] = monotonic_ns();
        }
        let mut after = 0u64;
        for v in 0..w as usize {
            m.switch(v)?;
            after += m.faults();
        }
        out.faults = after - base;
        Ok(out)
    };
    let results: Vec<crate::Result<GupsLane>> = std::thread::scope(|s| {
        let rt = &rt;
        let hs: Vec<_> = (0..lanes)
            .map(|l| s.spawn(move || rt.run_lane(l, body)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(crate::Error::Lane("a lane thread panicked".into())))
            })
            .collect()
    });
    let lanes_out = results.into_iter().collect::<crate::Result<Vec<_>>>()?;
    let total = per_lane * lanes as u64;
    let mups: Vec<f64> = (0..repeat)
        .map(|r| {
            let t0 = lanes_out.iter().map(|l| l.start_ns[r]).min().unwrap_or(0);
            let t1 = lanes_out.iter().map(|l| l.end_ns[r]).max().unwrap_or(0);
            total as f64 / ((t1 - t0).max(1) as f64 / 1e9) / 1e6
        })
        .collect();
    let faults: u64 = lanes_out.iter().map(|l| l.faults).sum();
    let switches = rt.switches();
    drop(rt);
    let mut row = gups_row(
        "VAS-process",
        w,
        opts,
        mups,
        "overlapping windows, one process per VAS (page tables kept) with a carrier thread \
         per lane; one lane per CPU",
    );
    row.figures.push(fig("lanes", lanes as f64, 0));
    row.figures
        .push(fig("faults_after_first_pass", faults as f64, 0));
    row.figures.push(fig("switches", switches as f64, 0));
    sink.row(row);
    Ok(())
}
