//! `memlab ycsb`: the YCSB core workloads over every key-value system
//! (dissertation §5.4, Figs. 18-19; Nibble-2: §6.3, Figs. 30-31).
//!
//! ```text
//!  per (repeat, threads, system): one fresh child process
//!    load    records keys "user<fnv(i)>", i in 0..records, inserted by
//!            `threads` threads (thread t: i = t, t+T, ...)      -> row workload=load
//!    2 × records random overwrites, unmeasured (see [`load`])
//!    for distribution in uniform, zipfian:
//!      for workload in A, B, C, F:
//!        warm-up, then `seconds` of closed-loop ops per thread -> one row each
//! ```
//!
//! Workloads (YCSB's core properties; no inserts, no deletes after the load,
//! so every key read exists — a miss is a correctness failure):
//!
//! | workload | mix |
//! |---|---|
//! | A | 50 % read, 50 % update |
//! | B | 95 % read, 5 % update |
//! | C | 100 % read |
//! | F | 50 % read, 50 % read-modify-write (read, change, write back; one op) |
//!
//! An update writes a whole value of `--value-size` bytes (default 1 KiB, the
//! paper's). Every value carries its key number in bytes 0..8 and a version
//! in 8..16; every read checks length and key number, so torn or misplaced
//! values are caught (`bad_values`, a failed check).
//!
//! Keys are YCSB's: `"user"` followed by the decimal of `fnvhash64(i)`
//! (YCSB's `buildKeyName` with hashed inserts, the default), 8 to 23 bytes.
//!
//! Request distributions:
//!
//! * `uniform`: key number uniform in `[0, records)` (YCSB's
//!   `UniformLongGenerator`).
//! * `zipfian`: YCSB's `ScrambledZipfianGenerator`, θ = 0.99, reproduced
//!   exactly: a `ZipfianGenerator` over items `0..=10^10` (Gray et al.,
//!   SIGMOD 1994) with YCSB's precomputed ζ(10^10, 0.99) = 26.46902820178302,
//!   whose draw is then scrambled as `fnvhash64(draw) % itemcount` (FNV-1a
//!   over the 8 little-endian bytes, then `Math.abs`). As in YCSB's
//!   `CoreWorkload`, the key space given to the generator is
//!   `[0, records]` (records + 1 items, the "expected new keys" of a workload
//!   without inserts being 0) and a draw of `records` is rejected and
//!   redrawn. So the popular keys are scattered over the key space, and the
//!   hottest key gets ≈ 1/26.47 ≈ 3.8 % of the requests. (YCSB since 0.13
//!   constructs the generator over 10^16 items but still uses the ζ of
//!   10^10; we keep the two consistent, as the original YCSB was.)
//!
//! Throughput is the sum over threads of ops / measured seconds; latency is
//! the duration of every 16th op ([`SAMPLE_EVERY`]), read with `rdtsc`
//! and converted with the calibrated TSC rate. Threads are pinned one per
//! online CPU, round-robin.
//!
//! Nibble capacity: `max(64 MiB, 2.5 × records × (24 + value + 8))` — room
//! for the data (24 bytes bounds the key, 8 is Nibble's object header) at
//! ~40 % utilization, so compaction stays in the background as in §5.4
//! (which ran at ~12 %). `memlab fill` is the experiment that raises it.
//!
//! Every system is told the record count before the load, as YCSB's own
//! clients pass `recordcount` to their stores: a map's `with_capacity`
//! (DashMap's, or each of the sharded map's shards), Nibble's
//! `Config::expected_keys` (its index starts at the size that holds them).
//! So nobody rehashes during the load; values are still allocated (maps)
//! or appended (Nibble) as they come, page faults included.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use topology::{rdtsc, tsc_to_ns};

use crate::child::{self, Job};
use crate::error::{Context, Result};
use crate::kv::{Kv, KvError, System};
use crate::report::{Checks, Reporter, Row};
use crate::util::{self, join_all, new_hist, Rng, Spread, Watchdog};

mod driver;
mod job;
mod keys;

pub use driver::*;
pub use job::*;
pub use keys::*;

/// Latency is sampled on every this-many-th op of each thread.
pub const SAMPLE_EVERY: u64 = 16;
/// YCSB's zipfian constant.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// Items of the underlying zipfian generator (YCSB's original `ITEM_COUNT`).
pub const ZIPF_ITEM_COUNT: u64 = 10_000_000_000;
/// ζ(10^10, 0.99), YCSB's `ScrambledZipfianGenerator.ZETAN`.
pub const ZIPF_ZETAN: f64 = 26.469_028_201_783_02;
/// Nibble capacity per record: this many times the record's bytes.
pub const CAPACITY_FACTOR: f64 = 2.5;
/// Smallest Nibble capacity the benchmarks use.
pub const MIN_CAPACITY: usize = 64 << 20;
/// Bound on a YCSB key's length ("user" + at most 20 characters).
pub const KEY_BYTES_MAX: usize = 24;
/// A phase that runs this much longer than planned is declared hung.
const HANG_GRACE: Duration = Duration::from_secs(120);

/// A YCSB core workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Workload {
    /// 50 % read, 50 % update
    A,
    /// 95 % read, 5 % update
    B,
    /// 100 % read
    C,
    /// 50 % read, 50 % read-modify-write
    F,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::A => "A",
            Workload::B => "B",
            Workload::C => "C",
            Workload::F => "F",
        }
    }

    /// Reads per thousand ops; the rest are updates (A, B) or
    /// read-modify-writes (F).
    pub fn read_permille(self) -> u64 {
        match self {
            Workload::A | Workload::F => 500,
            Workload::B => 950,
            Workload::C => 1000,
        }
    }
}

/// A request distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Dist {
    /// Uniform over the loaded keys
    Uniform,
    /// YCSB's scrambled zipfian, θ = 0.99
    Zipfian,
}

impl Dist {
    pub fn name(self) -> &'static str {
        match self {
            Dist::Uniform => "uniform",
            Dist::Zipfian => "zipfian",
        }
    }
}

// ---------------------------------------------------------------------------
// The parent side

/// `memlab ycsb`, resolved.
pub struct YcsbOpts {
    pub systems: Vec<System>,
    pub threads: Vec<usize>,
    pub records: u64,
    pub value_size: usize,
    pub workloads: Vec<Workload>,
    pub distributions: Vec<Dist>,
    pub warmup: Duration,
    pub duration: Duration,
    pub repeat: usize,
}

/// Cells of one (workload, distribution), in row order.
fn cell_keys(o: &YcsbOpts) -> Vec<(String, Option<String>)> {
    let mut v = vec![("load".to_string(), None)];
    for d in &o.distributions {
        for w in &o.workloads {
            v.push((w.name().to_string(), Some(d.name().to_string())));
        }
    }
    v
}

pub fn run(o: &YcsbOpts, rep: &mut Reporter) -> std::io::Result<()> {
    const BENCH: &str = "ycsb";
    const RATIO: &str = "ycsb-ratio";
    let (systems, skipped) = child::available(&o.systems);
    for n in &skipped {
        rep.note(BENCH, n);
        eprintln!("memlab: note: {n}");
    }
    let capacity = capacity_for(o.records, o.value_size);
    rep.note(
        BENCH,
        &format!(
            "YCSB core workloads: load, then A (50% read/50% update), B (95/5), C (100% read), F (50% read/50% \
             read-modify-write); {} records of {} B values, keys \"user\"+fnv64(i); request distributions uniform and \
             scrambled zipfian (theta 0.99, YCSB's generator). Each (system, threads, repeat) runs in a fresh process \
             that loads once, makes 2 x records random overwrites (unmeasured: Nibble's log near steady state), and runs every workload on that store; {} ms warm-up + {} ms measured per cell. Nibble \
             capacity {:.0} MiB (2.5 x records x (24 B key + value + 8 B header), >= 64 MiB).",
            o.records,
            o.value_size,
            o.warmup.as_millis(),
            o.duration.as_millis(),
            capacity as f64 / (1u64 << 20) as f64
        ),
    );
    rep.note(
        BENCH,
        &format!(
            "ops_per_sec: median of {} runs [min, max]; load: records / wall time. p50/p99_ns: every {SAMPLE_EVERY}th \
             op timed with rdtsc, median over runs. Threads pinned round-robin to the online CPUs.",
            o.repeat
        ),
    );
    rep.note(
        RATIO,
        "ratio = ops_per_sec of the system / ops_per_sec of the best in-process baseline of that cell (by median), \
         paired run by run: median [min, max].",
    );
    let keys = cell_keys(o);
    let total = (o.repeat * o.threads.len() * systems.len() * keys.len()) as u64;
    // Each child is primed with its footprint: a Nibble store's capacity (its
    // log cycles through all of it), the loaded data for a baseline.
    let data = (o.records as usize) * (o.value_size + 128);
    let pb = rep.start_progress(total, "memlab ycsb");
    // (system index, repeat, cell)
    let mut cells: Vec<(usize, usize, YcsbCell)> = Vec::new();
    for r in 0..o.repeat {
        for &threads in &o.threads {
            for (si, &system) in systems.iter().enumerate() {
                pb.set_message(format!("{system} t={threads} rep {}", r + 1));
                let job = Job::Ycsb(YcsbJob {
                    system,
                    threads,
                    records: o.records,
                    value_size: o.value_size,
                    workloads: o.workloads.clone(),
                    distributions: o.distributions.clone(),
                    warmup_ms: o.warmup.as_millis() as u64,
                    measure_ms: o.duration.as_millis() as u64,
                    capacity,
                    seed: 1 + r as u64,
                });
                let mut got = 0;
                let prime = if system.is_baseline() { data } else { capacity };
                let res = child::run_child(&job, prime.min(4 << 30), &pb, |c: YcsbCell| {
                    pb.inc(1);
                    got += 1;
                    cells.push((si, r, c));
                });
                if got < keys.len() {
                    pb.inc((keys.len() - got) as u64);
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
    for (si, r, c) in &cells {
        let what = format!(
            "{BENCH} {} {} {} threads={} run {}",
            systems[*si],
            c.workload,
            c.distribution.as_deref().unwrap_or(""),
            c.threads,
            r + 1
        );
        c.checks.report(rep, &what, "reads of loaded keys");
    }
    // Rows, grouped by cell then threads then system; the ratios after them.
    let mut ratio_rows = Vec::new();
    for (wl, dist) in &keys {
        for &threads in &o.threads {
            let of = |si: usize| -> Vec<Option<&YcsbCell>> {
                (0..o.repeat)
                    .map(|r| {
                        cells
                            .iter()
                            .find(|(s, rr, c)| {
                                *s == si
                                    && *rr == r
                                    && c.threads == threads
                                    && c.workload == *wl
                                    && c.distribution == *dist
                            })
                            .map(|x| &x.2)
                    })
                    .collect()
            };
            let per_sys: Vec<Vec<Option<&YcsbCell>>> = (0..systems.len()).map(of).collect();
            let mut medians: Vec<Option<f64>> = Vec::new();
            for (si, &system) in systems.iter().enumerate() {
                let ok: Vec<&YcsbCell> = per_sys[si].iter().flatten().copied().collect();
                if ok.is_empty() {
                    medians.push(None);
                    continue;
                }
                let ops = Spread::of(&ok.iter().map(|c| c.ops_per_sec).collect::<Vec<_>>());
                let p50 = Spread::of(&ok.iter().map(|c| c.p50_ns as f64).collect::<Vec<_>>());
                let p99 = Spread::of(&ok.iter().map(|c| c.p99_ns as f64).collect::<Vec<_>>());
                medians.push(Some(ops.median));
                let flt = Spread::of(&ok.iter().map(|c| c.minflt_per_op).collect::<Vec<_>>());
                // The load has no request distribution: null ("-" in the table).
                let row = Row::new(BENCH, system.name(), threads)
                    .set("workload", wl.as_str())
                    .set("distribution", dist.clone());
                let row = if wl == "load" {
                    // Page faults per record: the load is where a store
                    // maps its memory in (`minflt` of the whole process).
                    row.set_f("minflt_per_record", flt.median, 3)
                } else {
                    row
                };
                rep.emit(
                    row.set_spread("ops_per_sec", &ops, 0)
                        .set_f("p50_ns", p50.median, 0)
                        .set_f("p99_ns", p99.median, 0)
                        .set("records", o.records)
                        .set("value_size", o.value_size)
                        .set("runs", ok.len()),
                )?;
            }
            // Ratio to the best baseline of this cell.
            let best = systems
                .iter()
                .enumerate()
                .filter(|(si, s)| s.is_baseline() && medians[*si].is_some())
                .max_by(|a, b| {
                    medians[a.0]
                        .unwrap_or(0.0)
                        .total_cmp(&medians[b.0].unwrap_or(0.0))
                })
                .map(|(si, _)| si);
            let Some(best) = best else { continue };
            for (si, &system) in systems.iter().enumerate() {
                if system.is_baseline() {
                    continue;
                }
                let ratios: Vec<f64> = per_sys[si]
                    .iter()
                    .zip(&per_sys[best])
                    .filter_map(|(x, b)| Some(x.as_ref()?.ops_per_sec / b.as_ref()?.ops_per_sec))
                    .filter(|x| x.is_finite())
                    .collect();
                if ratios.is_empty() {
                    continue;
                }
                let s = Spread::of(&ratios);
                let row = Row::new(RATIO, system.name(), threads)
                    .set("workload", wl.as_str())
                    .set("distribution", dist.clone());
                ratio_rows.push(
                    row.set_spread("ratio", &s, 3)
                        .set("baseline", systems[best].name()),
                );
            }
        }
    }
    for row in ratio_rows {
        rep.emit(row)?;
    }
    rep.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_ycsb() {
        // Values of YCSB's Utils.fnvhash64 (Java long arithmetic, Math.abs).
        assert_eq!(fnvhash64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnvhash64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnvhash64(12345), 1_792_800_413_050_876_852);
    }

    #[test]
    fn keys_look_like_ycsb() {
        let mut k = KeyBuf::default();
        assert_eq!(k.ycsb(0), b"user6284781860667377211");
        assert!(k.ycsb(77).starts_with(b"user"));
    }

    #[test]
    fn zipfian_is_skewed_and_in_range() {
        let records = 100_000u64;
        let c = KeyChooser::new(Dist::Zipfian, records);
        let mut rng = Rng::new(7);
        let n = 400_000;
        let mut counts = std::collections::HashMap::new();
        for _ in 0..n {
            let k = c.next(&mut rng);
            assert!(k < records);
            *counts.entry(k).or_insert(0u64) += 1;
        }
        let mut v: Vec<u64> = counts.values().copied().collect();
        v.sort_unstable_by_key(|&x| std::cmp::Reverse(x));
        // The hottest item draws 1/zeta(1e10) of the requests (~3.8 %).
        let top = v[0] as f64 / n as f64;
        assert!((0.03..0.05).contains(&top), "top share {top}");
        // Scattered: the hottest keys are not 0, 1, 2...
        let hot: Vec<u64> = {
            let mut e: Vec<(u64, u64)> = counts.into_iter().collect();
            e.sort_unstable_by_key(|x| std::cmp::Reverse(x.1));
            e.iter().take(3).map(|x| x.0).collect()
        };
        assert!(hot.iter().any(|&k| k > 2), "{hot:?}");
    }

    #[test]
    fn uniform_covers_range() {
        let c = KeyChooser::new(Dist::Uniform, 10);
        let mut rng = Rng::new(1);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            seen[c.next(&mut rng) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn load_and_run_every_workload_on_a_map_and_nibble() {
        let cpus = util::online_cpus();
        for sys in ["hashmap-glibc", "nibble2"] {
            let sys: System = sys.parse().unwrap();
            let kv = sys.build(capacity_for(2000, 64)).unwrap();
            let (r, c) = load(&*kv, 2000, 64, 2, &cpus, 1).unwrap();
            assert_eq!(r.ops, 2000);
            assert_eq!((c.ops, c.checks.put_errors), (4000, 0));
            for w in [Workload::A, Workload::B, Workload::C, Workload::F] {
                for d in [Dist::Uniform, Dist::Zipfian] {
                    let s = RunSpec {
                        workload: w,
                        dist: d,
                        records: 2000,
                        value_size: 64,
                        threads: 2,
                        warmup: Duration::from_millis(5),
                        duration: Duration::from_millis(100),
                        seed: 3,
                    };
                    let r = run_workload(&*kv, &s, &cpus).unwrap();
                    assert!(r.ops > 0);
                    let k = &r.checks;
                    assert_eq!(
                        (k.misses, k.bad_values, k.put_errors),
                        (0, 0, 0),
                        "{sys} {w:?} {d:?}"
                    );
                }
            }
        }
    }
}
