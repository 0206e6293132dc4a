//! `memlab fill`: YCSB-A throughput as the store fills up (dissertation
//! §5.4 Fig. 20, Nibble vs MICA; §6.3 Fig. 29, Nibble vs Nibble-2).
//!
//! ```text
//!  for each utilization u (10 %, 30 %, 50 %, 70 %, 90 %):
//!    a fresh store whose block pool the data fills to u           (Nibble's
//!      count: 8 B header + key + value per record)
//!    2 × records random overwrites, unmeasured (`ycsb::condition`)
//!    YCSB-A, uniform, 2 threads, warm-up + `seconds`              -> one row
//! ```
//!
//! Every update of Nibble appends a new version and leaves a dead one, so
//! compaction must reclaim space at the rate updates consume it; the fuller
//! the store, the less garbage each compacted segment yields and the more it
//! copies (Fig. 20: at ≥ 70 % compaction dominates). Nibble-2 overwrites in
//! place and never compacts in this workload (Fig. 29). The rows carry the
//! compaction counters of the measured run (`segments_compacted`,
//! `bytes_relocated`, `compaction_passes`: deltas over warm-up + run), and
//! `fill-ratio` each utilization's throughput over that of the lowest one,
//! paired run by run.
//!
//! By default the data set is held fixed (the records that fill the lowest
//! utilization of a `--capacity-mib` store) and the store shrinks
//! (`--hold data`): throughput then changes only with utilization. With
//! `--hold capacity` the store is fixed and the data grows, as the paper's
//! figure is sometimes read; the data set then grows ninefold from 10 % to
//! 90 %, and cache and TLB misses of the larger index and data mix into
//! the ratio (at 128 MiB the 10 % point fits this machine's 32 MiB L3).
//!
//! The in-process baselines load the same number of records (they have no
//! capacity, so "utilization" only names the data volume); for them the
//! compaction columns are empty.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::child::{self, Job};
use crate::error::{Context, Result};
use crate::kv::{Kv, System};
use crate::report::{Reporter, Row};
use crate::util::{self, Spread, Watchdog};
use crate::ycsb::{self, Dist, KeyBuf, RunSpec, Workload, YcsbCell};

/// What `memlab fill` holds fixed as utilization rises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Hold {
    /// The data set; the store shrinks.
    Data,
    /// The store; the data set grows.
    Capacity,
}

/// One utilization step: the target and the records that reach it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
pub struct FillPoint {
    pub utilization_pct: u32,
    pub records: u64,
    /// Nibble capacity of this step, bytes.
    pub capacity: usize,
}

/// One child's work: every utilization for one system.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct FillJob {
    pub system: System,
    pub threads: usize,
    pub capacity: usize,
    pub value_size: usize,
    pub points: Vec<FillPoint>,
    pub warmup_ms: u64,
    pub measure_ms: u64,
    pub seed: u64,
}

/// What one utilization measured.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct FillCell {
    pub utilization_pct: u32,
    pub records: u64,
    /// The YCSB-A run (its checks with the overwrite pass's failed writes).
    #[serde(flatten)]
    pub ycsb: YcsbCell,
    /// Nibble: live bytes / pool bytes after the load.
    pub live_fraction: Option<f64>,
    pub segments_compacted: Option<u64>,
    pub bytes_relocated: Option<u64>,
    pub compaction_passes: Option<u64>,
}

/// The records whose Nibble footprint (header + key + value) first reaches
/// `target` bytes.
pub fn records_for(target: u64, value_size: usize) -> u64 {
    let mut k = KeyBuf::default();
    let per = (nibble::object::HEADER_MIN_BYTES + value_size) as u64;
    let (mut sum, mut n) = (0u64, 0u64);
    while sum < target {
        sum += per + k.ycsb(n).len() as u64;
        n += 1;
    }
    n
}

/// The block pool of a store of `capacity` bytes (a throwaway store tells).
pub fn pool_bytes(capacity: usize) -> Result<u64> {
    let s = nibble::Store::new(nibble::Config::new(capacity))
        .with_context(|| format!("cannot create a store of {capacity} bytes"))?;
    Ok(s.stats().pool_bytes)
}

/// Run one job (in the child).
pub fn run_job(job: &FillJob, emit: &mut dyn FnMut(FillCell)) -> Result<()> {
    let cpus = util::online_cpus();
    let n = job.points.len() as u32;
    let _wd = Watchdog::arm(
        Duration::from_millis(job.warmup_ms + job.measure_ms) * n
            + Duration::from_secs(120 + 60 * n as u64),
        format!("fill {}", job.system),
    );
    for p in &job.points {
        let what = format!("fill {} utilization={}%", job.system, p.utilization_pct);
        let kv = job.system.build(p.capacity)?;
        let kv: &dyn Kv = &*kv;
        let (_, pass) = ycsb::load(kv, p.records, job.value_size, job.threads, &cpus, job.seed)
            .context(&what)?;
        let before = kv.nibble().map(|s| s.stats());
        let spec = RunSpec {
            workload: Workload::A,
            dist: Dist::Uniform,
            records: p.records,
            value_size: job.value_size,
            threads: job.threads,
            warmup: Duration::from_millis(job.warmup_ms),
            duration: Duration::from_millis(job.measure_ms),
            seed: job.seed,
        };
        let r = ycsb::run_workload(kv, &spec, &cpus).context(&what)?;
        let after = kv.nibble().map(|s| s.stats());
        let delta = |f: fn(&nibble::Stats) -> u64| match (&before, &after) {
            (Some(b), Some(a)) => Some(f(a).saturating_sub(f(b))),
            _ => None,
        };
        let mut ycsb = ycsb::cell_of(Workload::A.name(), Some(Dist::Uniform), job.threads, &r);
        ycsb.checks.add(pass.checks);
        emit(FillCell {
            utilization_pct: p.utilization_pct,
            records: p.records,
            ycsb,
            live_fraction: before
                .as_ref()
                .map(|b| b.live_bytes as f64 / b.pool_bytes.max(1) as f64),
            segments_compacted: delta(|s| s.segments_compacted),
            bytes_relocated: delta(|s| s.bytes_relocated),
            compaction_passes: delta(|s| s.compaction_passes),
        });
    }
    Ok(())
}

/// `memlab fill`, resolved.
pub struct FillOpts {
    pub systems: Vec<System>,
    pub threads: Vec<usize>,
    pub capacity: usize,
    /// Hold the data set and shrink the store (true), or hold the store
    /// and grow the data set (false).
    pub fixed_data: bool,
    pub value_size: usize,
    pub utilizations: Vec<u32>,
    pub warmup: Duration,
    pub duration: Duration,
    pub repeat: usize,
}

pub fn run(o: &FillOpts, rep: &mut Reporter) -> std::io::Result<()> {
    const BENCH: &str = "fill";
    const RATIO: &str = "fill-ratio";
    let (systems, skipped) = child::available(&o.systems);
    for n in &skipped {
        rep.note(BENCH, n);
        eprintln!("memlab: note: {n}");
    }
    let pool = match pool_bytes(o.capacity) {
        Ok(p) => p,
        Err(e) => {
            rep.error(format!("{BENCH}: {e}"));
            return Ok(());
        }
    };
    let u_min = o.utilizations.iter().copied().min().unwrap_or(10).max(1) as u64;
    let mut points = Vec::new();
    for &u in &o.utilizations {
        let p = if o.fixed_data {
            // The data set of the lowest utilization at --capacity; the
            // store shrinks so that the same data fills u of its pool.
            let capacity = (o.capacity as u64 * u_min / u as u64) as usize;
            let pool_u = match pool_bytes(capacity) {
                Ok(p) => p,
                Err(e) => {
                    rep.error(format!("{BENCH}: {e}"));
                    return Ok(());
                }
            };
            let records = records_for(pool * u_min / 100, o.value_size);
            // Re-aim at u of this pool (pool size is not exactly linear in
            // capacity): the data differs by a fraction of a percent.
            let records = records.min(records_for(pool_u * u as u64 / 100, o.value_size));
            FillPoint {
                utilization_pct: u,
                records,
                capacity,
            }
        } else {
            FillPoint {
                utilization_pct: u,
                records: records_for(pool * u as u64 / 100, o.value_size),
                capacity: o.capacity,
            }
        };
        points.push(p);
    }
    let setup = if o.fixed_data {
        format!(
            "a fixed data set (the records that fill {u_min}% of a {:.0} MiB store) on stores shrunk so that it \
             fills each utilization of their block pool",
            o.capacity as f64 / (1u64 << 20) as f64
        )
    } else {
        format!(
            "a store of {:.0} MiB (block pool {:.1} MiB) loaded to each utilization of its block pool",
            o.capacity as f64 / (1u64 << 20) as f64,
            pool as f64 / (1u64 << 20) as f64
        )
    };
    rep.note(
        BENCH,
        &format!(
            "YCSB-A (50% read, 50% update), uniform, on {setup} (utilization = live data ({} B header + key + \
             {} B value per record) / pool), then 2 x records random overwrites (unmeasured); {} ms warm-up + {} ms \
             measured; fresh store per utilization, one process per (system, run). ops_per_sec: median of {} runs \
             [min, max]. Compaction columns: deltas over warm-up + run (Nibble variants only). Baselines load the \
             same records.",
            nibble::object::HEADER_MIN_BYTES,
            o.value_size,
            o.warmup.as_millis(),
            o.duration.as_millis(),
            o.repeat
        ),
    );
    rep.note(
        RATIO,
        &format!(
            "ratio = ops_per_sec at this utilization / ops_per_sec at {}%, same system, paired run by run: median \
             [min, max].",
            o.utilizations.first().copied().unwrap_or(0)
        ),
    );
    let total = (o.repeat * o.threads.len() * systems.len() * points.len()) as u64;
    let pb = rep.start_progress(total, "memlab fill");
    // [run][threads][system] -> cells
    let mut cells: Vec<Vec<Vec<Vec<FillCell>>>> =
        vec![vec![vec![Vec::new(); systems.len()]; o.threads.len()]; o.repeat];
    for (r, per_run) in cells.iter_mut().enumerate() {
        for (ti, &threads) in o.threads.iter().enumerate() {
            for (si, &system) in systems.iter().enumerate() {
                let slot = &mut per_run[ti][si];
                pb.set_message(format!("{system} t={threads} run {}", r + 1));
                let job = Job::Fill(FillJob {
                    system,
                    threads,
                    capacity: o.capacity,
                    value_size: o.value_size,
                    points: points.clone(),
                    warmup_ms: o.warmup.as_millis() as u64,
                    measure_ms: o.duration.as_millis() as u64,
                    seed: 1 + r as u64,
                });
                let mut got = 0;
                let res = child::run_child(&job, o.capacity.min(4 << 30), &pb, |c: FillCell| {
                    pb.inc(1);
                    got += 1;
                    slot.push(c);
                });
                if got < points.len() {
                    pb.inc((points.len() - got) as u64);
                }
                if let Err(e) = res {
                    rep.error(format!(
                        "{BENCH} {system} threads={threads} run {}: {e}",
                        r + 1
                    ));
                }
            }
        }
    }
    for (ti, &threads) in o.threads.iter().enumerate() {
        for (si, &system) in systems.iter().enumerate() {
            for p in &points {
                let at =
                    |r: usize, u: u32| cells[r][ti][si].iter().find(|c| c.utilization_pct == u);
                let runs: Vec<&FillCell> = (0..o.repeat)
                    .filter_map(|r| at(r, p.utilization_pct))
                    .collect();
                if runs.is_empty() {
                    continue;
                }
                for (r, c) in runs.iter().enumerate() {
                    let what = format!(
                        "{BENCH} {system} threads={threads} utilization={}% run {}",
                        p.utilization_pct,
                        r + 1
                    );
                    c.ycsb.checks.report(rep, &what, "reads of loaded keys");
                }
                let ops = Spread::of(&runs.iter().map(|c| c.ycsb.ops_per_sec).collect::<Vec<_>>());
                let med = |f: &dyn Fn(&FillCell) -> Option<f64>| -> Option<f64> {
                    let v: Vec<f64> = runs.iter().filter_map(|c| f(c)).collect();
                    (!v.is_empty()).then(|| Spread::of(&v).median)
                };
                let p50 = med(&|c| Some(c.ycsb.p50_ns as f64)).unwrap_or(f64::NAN);
                let p99 = med(&|c| Some(c.ycsb.p99_ns as f64)).unwrap_or(f64::NAN);
                let mut row = Row::new(BENCH, system.name(), threads)
                    .set("utilization", p.utilization_pct)
                    .set_spread("ops_per_sec", &ops, 0)
                    .set_f("p50_ns", p50, 0)
                    .set_f("p99_ns", p99, 0)
                    .set("records", p.records)
                    .set("capacity_bytes", p.capacity);
                let opt = |row: Row, k: &str, v: Option<f64>, d: i32| match v {
                    Some(x) => row.set_f(k, x, d),
                    None => row.set(k, serde_json::Value::Null),
                };
                row = opt(row, "live_fraction", med(&|c| c.live_fraction), 3);
                row = opt(
                    row,
                    "segments_compacted",
                    med(&|c| c.segments_compacted.map(|x| x as f64)),
                    0,
                );
                row = opt(
                    row,
                    "bytes_relocated",
                    med(&|c| c.bytes_relocated.map(|x| x as f64)),
                    0,
                );
                row = opt(
                    row,
                    "compaction_passes",
                    med(&|c| c.compaction_passes.map(|x| x as f64)),
                    0,
                );
                row = row.set(
                    "put_errors",
                    runs.iter().map(|c| c.ycsb.checks.put_errors).sum::<u64>(),
                );
                rep.emit(row)?;
            }
            // Ratio to the first utilization, paired run by run.
            let Some(first) = points.first() else {
                continue;
            };
            for p in &points {
                let ratios: Vec<f64> = (0..o.repeat)
                    .filter_map(|r| {
                        let c = cells[r][ti][si]
                            .iter()
                            .find(|c| c.utilization_pct == p.utilization_pct)?;
                        let b = cells[r][ti][si]
                            .iter()
                            .find(|c| c.utilization_pct == first.utilization_pct)?;
                        Some(c.ycsb.ops_per_sec / b.ycsb.ops_per_sec)
                    })
                    .filter(|x| x.is_finite())
                    .collect();
                if ratios.is_empty() {
                    continue;
                }
                let s = Spread::of(&ratios);
                rep.emit(
                    Row::new(RATIO, system.name(), threads)
                        .set("utilization", p.utilization_pct)
                        .set_spread("ratio", &s, 3),
                )?;
            }
        }
    }
    rep.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_reach_the_target() {
        let n = records_for(1 << 20, 1024);
        // Header + 1 KiB value + a YCSB key of 20-26 bytes each.
        let per = |key: usize| (nibble::object::HEADER_MIN_BYTES + 1024 + key) as u64;
        assert!(
            ((1 << 20) / per(26)..=(1 << 20) / per(20) + 1).contains(&n),
            "{n}"
        );
        assert_eq!(records_for(0, 1024), 0);
    }

    #[test]
    fn fill_steps_on_nibble2() {
        let cap = 16 << 20;
        let pool = pool_bytes(cap).unwrap();
        let job = FillJob {
            system: "nibble2".parse().unwrap(),
            threads: 2,
            capacity: cap,
            value_size: 256,
            points: vec![
                FillPoint {
                    utilization_pct: 10,
                    records: records_for(pool / 10, 256),
                    capacity: cap,
                },
                FillPoint {
                    utilization_pct: 80,
                    records: records_for(pool * 8 / 10, 256),
                    capacity: cap,
                },
            ],
            warmup_ms: 10,
            measure_ms: 100,
            seed: 1,
        };
        let mut got = Vec::new();
        run_job(&job, &mut |c| got.push(c)).unwrap();
        assert_eq!(got.len(), 2);
        for c in &got {
            assert_eq!((c.ycsb.checks.misses, c.ycsb.checks.bad_values), (0, 0));
            assert!(c.ycsb.ops_per_sec > 0.0);
        }
        let f = got[1].live_fraction.unwrap();
        assert!((0.75..0.85).contains(&f), "{f}");
    }
}
