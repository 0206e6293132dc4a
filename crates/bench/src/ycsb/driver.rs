//! The driver (also used by `fill`): load (with its overwrite pass), and the timed
//! workload threads with a shared warm-up / measure / stop phase.

use super::*;

pub(super) const PHASE_WARMUP: u8 = 0;
pub(super) const PHASE_MEASURE: u8 = 1;
pub(super) const PHASE_STOP: u8 = 2;

/// What a phase measured, all threads together.
pub struct PhaseResult {
    pub ops: u64,
    pub ops_per_sec: f64,
    /// Sampled op durations, TSC ticks.
    pub hist: Histogram<u64>,
    pub checks: Checks,
    /// Minor page faults of the whole process while the phase ran (every
    /// thread, the store's own workers included); 0 where not measured.
    pub minflt: u64,
}

impl PhaseResult {
    pub fn p_ns(&self, q: f64) -> u64 {
        tsc_to_ns(self.hist.value_at_quantile(q))
    }
}

pub(super) struct ThreadResult {
    pub(super) ops: u64,
    pub(super) secs: f64,
    pub(super) hist: Histogram<u64>,
    pub(super) checks: Checks,
}

pub(super) fn merge(threads: Vec<ThreadResult>, wall_secs: Option<f64>) -> Result<PhaseResult> {
    let mut r = PhaseResult {
        ops: 0,
        ops_per_sec: 0.0,
        hist: new_hist()?,
        checks: Checks::default(),
        minflt: 0,
    };
    for t in threads {
        r.ops += t.ops;
        if wall_secs.is_none() && t.secs > 0.0 {
            r.ops_per_sec += t.ops as f64 / t.secs;
        }
        r.hist.add(&t.hist).context("histogram")?;
        r.checks.add(t.checks);
    }
    if let Some(w) = wall_secs {
        r.ops_per_sec = r.ops as f64 / w.max(1e-9);
    }
    Ok(r)
}

/// Insert records `0..records` with `threads` pinned threads (failing on
/// the first failed insert), then make `2 × records` writes of records
/// picked uniformly at random, unmeasured, so that the measured runs find
/// the store near its steady state: the load's result and this overwrite
/// pass's (its failed writes are counted, not fatal; its first error says
/// "(overwrite pass)").
///
/// Right after the load, Nibble's log still has never-used space (60 % of
/// the pool at YCSB's capacity) and every loaded segment is fully live.
/// Measured at 1 thread, 1 M records, YCSB-A uniform in 1 s cells:
/// straight after the load, 1.3 M/s (appending into free space), then
/// ~0.45 M/s for several seconds (compaction copying the old, still mostly
/// live load segments, which the cost-benefit score favours for their
/// age); after `records` random overwrites, 1.1 M/s rising to a steady
/// ~1.5 M/s after ~2 × records updates. A sequential pass would leave the
/// load segments entirely dead, which makes the next compactions
/// unrealistically cheap. The baselines get the same pass (their
/// allocators see the same frees).
pub fn load(
    kv: &dyn Kv,
    records: u64,
    value_size: usize,
    threads: usize,
    cpus: &[usize],
    seed: u64,
) -> Result<(PhaseResult, PhaseResult)> {
    let loaded = write_all(
        kv, records, records, value_size, threads, cpus, seed, 0, true,
    )?;
    let mut pass = write_all(
        kv,
        records,
        2 * records,
        value_size,
        threads,
        cpus,
        seed,
        1,
        false,
    )
    .context("overwrite pass")?;
    if let Some(e) = &mut pass.checks.first_error {
        e.push_str(" (overwrite pass)");
    }
    Ok((loaded, pass))
}

/// `strict` (the load): write records `0..records` once each (`writes ==
/// records`), stop at the first failure. Else: `writes` writes of records
/// picked uniformly at random, failures counted.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_all(
    kv: &dyn Kv,
    records: u64,
    writes: u64,
    value_size: usize,
    threads: usize,
    cpus: &[usize],
    seed: u64,
    version: u64,
    strict: bool,
) -> Result<PhaseResult> {
    let ncpu = cpus.len().max(1);
    let barrier = &Barrier::new(threads);
    let minflt0 = util::minor_faults();
    let per = thread::scope(|s| {
        let handles = (0..threads)
            .map(|t| {
                let cpu = cpus[t % ncpu];
                s.spawn(move || -> Result<(ThreadResult, Instant, Instant)> {
                    let pinned = util::pin_to(cpu);
                    barrier.wait();
                    pinned?;
                    let mut hist = new_hist()?;
                    let mut key = KeyBuf::default();
                    let mut val = filler_value(value_size, seed + t as u64);
                    let start = Instant::now();
                    let mut n = 0u64;
                    let mut checks = Checks::default();
                    let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(t as u64 + 7));
                    let mut j = t as u64;
                    while j < writes {
                        let i = if strict {
                            j
                        } else {
                            rng.range(0, records.max(1))
                        };
                        j += threads as u64;
                        stamp(&mut val, i, version);
                        let k = key.ycsb(i);
                        let r = if n.is_multiple_of(SAMPLE_EVERY) {
                            let t0 = rdtsc();
                            let r = kv.put(k, &val);
                            hist.saturating_record(rdtsc().wrapping_sub(t0).max(1));
                            r
                        } else {
                            kv.put(k, &val)
                        };
                        match r {
                            Ok(()) => n += 1,
                            Err(e) if strict => {
                                return Err(e).with_context(|| {
                                    format!(
                                    "load: insert of record {i} after {n} inserts by this thread"
                                )
                                })
                            }
                            Err(e) => checks.put_failed(|| format!("overwrite of record {i}: {e}")),
                        }
                    }
                    let end = Instant::now();
                    Ok((
                        ThreadResult {
                            ops: n,
                            secs: (end - start).as_secs_f64(),
                            hist,
                            checks,
                        },
                        start,
                        end,
                    ))
                })
            })
            .collect();
        join_all(handles)
    })?;
    let t0 = per.iter().map(|p| p.1).min();
    let t1 = per.iter().map(|p| p.2).max();
    let wall = match (t0, t1) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    let mut r = merge(per.into_iter().map(|p| p.0).collect(), Some(wall))?;
    r.minflt = util::minor_faults().saturating_sub(minflt0);
    Ok(r)
}

/// One measured run of a workload.
#[derive(Clone, Copy, Debug)]
pub struct RunSpec {
    pub workload: Workload,
    pub dist: Dist,
    pub records: u64,
    pub value_size: usize,
    pub threads: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub seed: u64,
}

#[derive(Clone, Copy)]
pub(super) enum Op {
    Read,
    Update,
    Rmw,
}

pub(super) fn worker(
    kv: &dyn Kv,
    s: &RunSpec,
    phase: &AtomicU8,
    barrier: &Barrier,
    cpu: usize,
    seed: u64,
) -> Result<ThreadResult> {
    let pinned = util::pin_to(cpu);
    barrier.wait();
    pinned?;
    let chooser = KeyChooser::new(s.dist, s.records);
    let mut rng = Rng::new(seed);
    let mut key = KeyBuf::default();
    let mut val = filler_value(s.value_size, seed);
    let mut buf: Vec<u8> = Vec::with_capacity(s.value_size);
    let mut hist = new_hist()?;
    let read_pm = s.workload.read_permille();
    let second = if s.workload == Workload::F {
        Op::Rmw
    } else {
        Op::Update
    };
    let (mut n, mut ops) = (0u64, 0u64);
    let mut version = seed << 40;
    let mut checks = Checks::default();
    let mut start: Option<Instant> = None;
    loop {
        if n.is_multiple_of(SAMPLE_EVERY) {
            match phase.load(Ordering::Acquire) {
                PHASE_STOP => break,
                PHASE_MEASURE if start.is_none() => {
                    start = Some(Instant::now());
                    ops = 0;
                    // The counts start over; a first error stays.
                    checks = Checks {
                        first_error: checks.first_error.take(),
                        ..Checks::default()
                    };
                    hist.reset();
                }
                _ => {}
            }
        }
        let keynum = chooser.next(&mut rng);
        let k = key.ycsb(keynum);
        let op = if rng.next_u64() % 1000 < read_pm {
            Op::Read
        } else {
            second
        };
        let sample = n.is_multiple_of(SAMPLE_EVERY);
        let t0 = if sample { rdtsc() } else { 0 };
        let mut put_result: Result<(), KvError> = Ok(());
        match op {
            Op::Read => match kv.get_into(k, &mut buf) {
                Ok(true) => checks.bad_values += u64::from(!value_ok(&buf, keynum, s.value_size)),
                Ok(false) => checks.misses += 1,
                Err(e) => return Err(e).context("get"),
            },
            Op::Update => {
                version += 1;
                stamp(&mut val, keynum, version);
                put_result = kv.put(k, &val);
            }
            Op::Rmw => {
                match kv.get_into(k, &mut buf) {
                    Ok(true) if value_ok(&buf, keynum, s.value_size) => {
                        // Modify: a new version, and one byte of the body.
                        version += 1;
                        buf[8..16].copy_from_slice(&version.to_le_bytes());
                        let last = buf.len() - 1;
                        buf[last] = buf[last].wrapping_add(1);
                        put_result = kv.put(k, &buf);
                    }
                    Ok(true) => checks.bad_values += 1,
                    Ok(false) => checks.misses += 1,
                    Err(e) => return Err(e).context("get"),
                }
            }
        }
        if sample {
            hist.saturating_record(rdtsc().wrapping_sub(t0).max(1));
        }
        n += 1;
        // A failed write is not a completed op; it is counted apart.
        match put_result {
            Ok(()) => ops += 1,
            Err(e) => checks.put_failed(|| format!("put: {e}")),
        }
    }
    // A thread the scheduler kept off the CPU for the whole measurement
    // window sees the stop before the start: it measured nothing, and
    // `merge` leaves a zero-length window out of the rate.
    let secs = start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    if start.is_none() {
        ops = 0;
        hist.reset();
        checks = Checks {
            first_error: checks.first_error.take(),
            ..Checks::default()
        };
    }
    Ok(ThreadResult {
        ops,
        secs,
        hist,
        checks,
    })
}

/// Run one workload on a loaded store.
pub fn run_workload(kv: &dyn Kv, s: &RunSpec, cpus: &[usize]) -> Result<PhaseResult> {
    let ncpu = cpus.len().max(1);
    let phase = &AtomicU8::new(PHASE_WARMUP);
    let barrier = &Barrier::new(s.threads + 1);
    let per = thread::scope(|sc| {
        let handles = (0..s.threads)
            .map(|t| {
                let cpu = cpus[t % ncpu];
                let seed = s.seed.wrapping_mul(1000).wrapping_add(t as u64 + 1);
                sc.spawn(move || worker(kv, s, phase, barrier, cpu, seed))
            })
            .collect();
        barrier.wait();
        thread::sleep(s.warmup);
        phase.store(PHASE_MEASURE, Ordering::Release);
        thread::sleep(s.duration);
        phase.store(PHASE_STOP, Ordering::Release);
        join_all(handles)
    })?;
    merge(per, None)
}
