//! `memlab ycsb`: the YCSB core workloads over every key-value system
//! (dissertation §5.4, Figs. 18-19; Nibble-2: §6.3, Figs. 30-31).
//!
//! ```text
//!  per (repeat, threads, system): one fresh child process
//!    load    records keys "user<fnv(i)>", i in 0..records, inserted by
//!            `threads` threads (thread t: i = t, t+T, ...)      -> row workload=load
//!    2 × records random overwrites, unmeasured (see [`condition`])
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
//! Nibble capacity: `max(64 MiB, 2.5 × records × (24 + value + 18))` — room
//! for the data (24 bytes bounds the key, 18 is Nibble's object header) at
//! ~40 % utilization, so compaction stays in the background as in §5.4
//! (which ran at ~12 %). `memlab fill` is the experiment that raises it.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use topology::{rdtsc, tsc_to_ns};

use crate::child::{self, Job};
use crate::kv::{Kv, KvError, System};
use crate::report::{Reporter, Row};
use crate::util::{self, join_all, new_hist, Rng, Spread, Watchdog};

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
// Keys and generators

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 bytes of `val`, low byte
/// first, as a Java `long`, then `Math.abs` (which leaves `Long.MIN_VALUE`
/// negative, as Java does).
pub fn fnvhash64(mut val: i64) -> i64 {
    const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
    const FNV_PRIME_64: u64 = 1_099_511_628_211;
    let mut h = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        let octet = (val & 0xff) as u64;
        val >>= 8;
        h ^= octet;
        h = h.wrapping_mul(FNV_PRIME_64);
    }
    (h as i64).wrapping_abs()
}

/// YCSB's `ZipfianGenerator` (Gray et al., "Quickly generating
/// billion-record synthetic databases", SIGMOD 1994) over `0..=items-1`
/// with a precomputed ζ(items).
#[derive(Clone, Copy, Debug)]
pub struct Zipfian {
    items: f64,
    zetan: f64,
    alpha: f64,
    eta: f64,
    /// `1 + 0.5^θ`: below it (times ζ(n)) the draw is item 1.
    two_cut: f64,
}

impl Zipfian {
    /// `items` items, constant `theta`, ζ(items, theta) = `zetan`.
    pub fn new(items: u64, theta: f64, zetan: f64) -> Zipfian {
        let zeta2theta = 1.0 + 0.5f64.powf(theta);
        let items = items as f64;
        Zipfian {
            items,
            zetan,
            alpha: 1.0 / (1.0 - theta),
            eta: (1.0 - (2.0 / items).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan),
            two_cut: zeta2theta,
        }
    }

    /// The generator `ScrambledZipfianGenerator` wraps: items
    /// `0..=ZIPF_ITEM_COUNT` (YCSB passes min 0, max ITEM_COUNT).
    pub fn ycsb_scrambled_base() -> Zipfian {
        Zipfian::new(ZIPF_ITEM_COUNT + 1, ZIPFIAN_CONSTANT, ZIPF_ZETAN)
    }

    /// The draw for a uniform `u` in `[0, 1)` (YCSB's `nextLong`).
    #[inline]
    pub fn draw(&self, u: f64) -> i64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < self.two_cut {
            return 1;
        }
        (self.items * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as i64
    }
}

/// Picks key numbers in `[0, records)`.
#[derive(Clone, Copy, Debug)]
pub struct KeyChooser {
    dist: Dist,
    records: u64,
    zipf: Zipfian,
}

impl KeyChooser {
    pub fn new(dist: Dist, records: u64) -> KeyChooser {
        KeyChooser {
            dist,
            records: records.max(1),
            zipf: Zipfian::ycsb_scrambled_base(),
        }
    }

    #[inline]
    pub fn next(&self, rng: &mut Rng) -> u64 {
        match self.dist {
            Dist::Uniform => rng.range(0, self.records),
            Dist::Zipfian => {
                // ScrambledZipfianGenerator(0, records): itemcount records+1;
                // CoreWorkload redraws keys not yet inserted.
                let itemcount = self.records as i64 + 1;
                loop {
                    let d = self.zipf.draw(rng.next_f64());
                    let k = fnvhash64(d).rem_euclid(itemcount) as u64;
                    if k < self.records {
                        return k;
                    }
                }
            }
        }
    }
}

/// A key built in place, without allocating.
pub struct KeyBuf {
    buf: [u8; KEY_BYTES_MAX],
}

impl Default for KeyBuf {
    fn default() -> Self {
        KeyBuf {
            buf: [0; KEY_BYTES_MAX],
        }
    }
}

impl KeyBuf {
    /// YCSB's key of record `keynum`: `"user"` + `fnvhash64(keynum)` in decimal.
    #[inline]
    pub fn ycsb(&mut self, keynum: u64) -> &[u8] {
        let h = fnvhash64(keynum as i64);
        self.buf[..4].copy_from_slice(b"user");
        let mut digits = [0u8; 20];
        let mut n = h.unsigned_abs();
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let mut at = 4;
        if h < 0 {
            self.buf[at] = b'-';
            at += 1;
        }
        let d = &digits[i..];
        self.buf[at..at + d.len()].copy_from_slice(d);
        &self.buf[..at + d.len()]
    }
}

/// A value of `size` bytes of pseudo-random filler.
pub fn filler_value(size: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ 0x5eed);
    (0..size).map(|_| rng.next_u64() as u8).collect()
}

/// Write the key number and a version into a value (`value.len() >= 16`).
#[inline]
pub fn stamp(value: &mut [u8], keynum: u64, version: u64) {
    value[..8].copy_from_slice(&keynum.to_le_bytes());
    value[8..16].copy_from_slice(&version.to_le_bytes());
}

/// Is `v` a value of `size` bytes stamped for `keynum`?
#[inline]
pub fn value_ok(v: &[u8], keynum: u64, size: usize) -> bool {
    v.len() == size && v[..8] == keynum.to_le_bytes()
}

/// Nibble capacity for `records` values of `value_size` bytes.
pub fn capacity_for(records: u64, value_size: usize) -> usize {
    let need = CAPACITY_FACTOR
        * records as f64
        * (KEY_BYTES_MAX + value_size + nibble::object::HEADER_MIN_BYTES) as f64;
    (need as usize).max(MIN_CAPACITY)
}

// ---------------------------------------------------------------------------
// The driver (also used by `fill`)

const PHASE_WARMUP: u8 = 0;
const PHASE_MEASURE: u8 = 1;
const PHASE_STOP: u8 = 2;

/// What a phase measured, all threads together.
pub struct PhaseResult {
    pub ops: u64,
    pub ops_per_sec: f64,
    /// Sampled op durations, TSC ticks.
    pub hist: Histogram<u64>,
    /// Reads that found no value (must be 0).
    pub misses: u64,
    /// Reads that returned a wrong value (must be 0).
    pub bad_values: u64,
    /// Writes that failed (out of memory).
    pub put_errors: u64,
    pub first_error: Option<String>,
}

impl PhaseResult {
    pub fn p_ns(&self, q: f64) -> u64 {
        tsc_to_ns(self.hist.value_at_quantile(q))
    }
}

struct ThreadResult {
    ops: u64,
    secs: f64,
    hist: Histogram<u64>,
    misses: u64,
    bad_values: u64,
    put_errors: u64,
    first_error: Option<String>,
}

fn merge(threads: Vec<ThreadResult>, wall_secs: Option<f64>) -> Result<PhaseResult, String> {
    let mut r = PhaseResult {
        ops: 0,
        ops_per_sec: 0.0,
        hist: new_hist()?,
        misses: 0,
        bad_values: 0,
        put_errors: 0,
        first_error: None,
    };
    for t in threads {
        r.ops += t.ops;
        if wall_secs.is_none() && t.secs > 0.0 {
            r.ops_per_sec += t.ops as f64 / t.secs;
        }
        r.hist
            .add(&t.hist)
            .map_err(|e| format!("histogram: {e:?}"))?;
        r.misses += t.misses;
        r.bad_values += t.bad_values;
        r.put_errors += t.put_errors;
        if r.first_error.is_none() {
            r.first_error = t.first_error;
        }
    }
    if let Some(w) = wall_secs {
        r.ops_per_sec = r.ops as f64 / w.max(1e-9);
    }
    Ok(r)
}

/// Insert records `0..records` with `threads` pinned threads; fails on the
/// first failed insert.
pub fn load(
    kv: &dyn Kv,
    records: u64,
    value_size: usize,
    threads: usize,
    cpus: &[usize],
    seed: u64,
) -> Result<PhaseResult, String> {
    write_all(
        kv, records, records, value_size, threads, cpus, seed, 0, true,
    )
}

/// Make `2 × records` writes of records picked uniformly at random,
/// unmeasured, so that the measured runs find the store near its steady
/// state. Right after the load, Nibble's log still has never-used space
/// (60 % of the pool at YCSB's capacity) and every loaded segment is fully
/// live. Measured at 1 thread, 1 M records, YCSB-A uniform in 1 s cells:
/// straight after the load, 1.3 M/s (appending into free space), then
/// ~0.45 M/s for several seconds (compaction copying the old, still mostly
/// live load segments, which the cost-benefit score favours for their
/// age); after `records` random overwrites, 1.1 M/s rising to a steady
/// ~1.5 M/s after ~2 × records updates. A sequential pass would leave the
/// load segments entirely dead, which makes the next compactions
/// unrealistically cheap. The baselines get the same pass (their
/// allocators see the same frees). Failed writes are counted, not fatal.
pub fn condition(
    kv: &dyn Kv,
    records: u64,
    value_size: usize,
    threads: usize,
    cpus: &[usize],
    seed: u64,
) -> Result<PhaseResult, String> {
    write_all(
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
}

/// `strict` (the load): write records `0..records` once each (`writes ==
/// records`), stop at the first failure. Else: `writes` writes of records
/// picked uniformly at random, failures counted.
#[allow(clippy::too_many_arguments)]
fn write_all(
    kv: &dyn Kv,
    records: u64,
    writes: u64,
    value_size: usize,
    threads: usize,
    cpus: &[usize],
    seed: u64,
    version: u64,
    strict: bool,
) -> Result<PhaseResult, String> {
    let ncpu = cpus.len().max(1);
    let barrier = &Barrier::new(threads);
    let per = thread::scope(|s| {
        let handles = (0..threads)
            .map(|t| {
                let cpu = cpus[t % ncpu];
                s.spawn(move || -> Result<(ThreadResult, Instant, Instant), String> {
                    let pinned = util::pin_to(cpu);
                    barrier.wait();
                    pinned?;
                    let mut hist = new_hist()?;
                    let mut key = KeyBuf::default();
                    let mut val = filler_value(value_size, seed + t as u64);
                    let start = Instant::now();
                    let (mut n, mut put_errors) = (0u64, 0u64);
                    let mut first_error = None;
                    let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(t as u64 + 7));
                    let mut j = t as u64;
                    while j < writes {
                        let i = if strict { j } else { rng.range(0, records.max(1)) };
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
                                return Err(format!(
                                    "load: insert of record {i} after {n} inserts by this thread: {e}"
                                ))
                            }
                            Err(e) => {
                                put_errors += 1;
                                first_error.get_or_insert_with(|| format!("overwrite of record {i}: {e}"));
                            }
                        }
                    }
                    let end = Instant::now();
                    Ok((
                        ThreadResult {
                            ops: n,
                            secs: (end - start).as_secs_f64(),
                            hist,
                            misses: 0,
                            bad_values: 0,
                            put_errors,
                            first_error,
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
    merge(per.into_iter().map(|p| p.0).collect(), Some(wall))
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
enum Op {
    Read,
    Update,
    Rmw,
}

fn worker(
    kv: &dyn Kv,
    s: &RunSpec,
    phase: &AtomicU8,
    barrier: &Barrier,
    cpu: usize,
    seed: u64,
) -> Result<ThreadResult, String> {
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
    let (mut n, mut ops, mut misses, mut bad, mut put_errors) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut version = seed << 40;
    let mut first_error: Option<String> = None;
    let mut start: Option<Instant> = None;
    loop {
        if n.is_multiple_of(SAMPLE_EVERY) {
            match phase.load(Ordering::Acquire) {
                PHASE_STOP => break,
                PHASE_MEASURE if start.is_none() => {
                    start = Some(Instant::now());
                    (ops, misses, bad, put_errors) = (0, 0, 0, 0);
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
                Ok(true) => bad += u64::from(!value_ok(&buf, keynum, s.value_size)),
                Ok(false) => misses += 1,
                Err(e) => return Err(format!("get: {e}")),
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
                    Ok(true) => bad += 1,
                    Ok(false) => misses += 1,
                    Err(e) => return Err(format!("get: {e}")),
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
            Err(e) => {
                put_errors += 1;
                first_error.get_or_insert_with(|| format!("put: {e}"));
            }
        }
    }
    let Some(start) = start else {
        return Err("stopped before the measurement began".into());
    };
    Ok(ThreadResult {
        ops,
        secs: start.elapsed().as_secs_f64(),
        hist,
        misses,
        bad_values: bad,
        put_errors,
        first_error,
    })
}

/// Run one workload on a loaded store.
pub fn run_workload(kv: &dyn Kv, s: &RunSpec, cpus: &[usize]) -> Result<PhaseResult, String> {
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

// ---------------------------------------------------------------------------
// The child side

/// One child's work: load, then every (distribution, workload) at one
/// thread count, on one store.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct YcsbJob {
    pub system: System,
    pub threads: usize,
    pub records: u64,
    pub value_size: usize,
    pub workloads: Vec<Workload>,
    pub distributions: Vec<Dist>,
    pub warmup_ms: u64,
    pub measure_ms: u64,
    pub capacity: usize,
    pub seed: u64,
}

/// One measured cell.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct YcsbCell {
    /// `load`, `A`, `B`, `C`, `F`.
    pub workload: String,
    /// None for the load.
    pub distribution: Option<String>,
    pub threads: usize,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub misses: u64,
    pub bad_values: u64,
    pub put_errors: u64,
    pub first_error: Option<String>,
}

fn cell_of(workload: &str, dist: Option<Dist>, threads: usize, r: &PhaseResult) -> YcsbCell {
    YcsbCell {
        workload: workload.to_string(),
        distribution: dist.map(|d| d.name().to_string()),
        threads,
        ops: r.ops,
        ops_per_sec: r.ops_per_sec,
        p50_ns: r.p_ns(0.5),
        p99_ns: r.p_ns(0.99),
        misses: r.misses,
        bad_values: r.bad_values,
        put_errors: r.put_errors,
        first_error: r.first_error.clone(),
    }
}

/// Run a job (in the child).
pub fn run_job(job: &YcsbJob, emit: &mut dyn FnMut(YcsbCell)) -> Result<(), String> {
    let cpus = util::online_cpus();
    let cells = (job.workloads.len() * job.distributions.len()) as u32;
    let _wd = Watchdog::arm(
        Duration::from_millis(job.warmup_ms + job.measure_ms) * cells
            + Duration::from_micros(40 * job.records)
            + HANG_GRACE,
        format!("ycsb {} threads={}", job.system, job.threads),
    );
    let kv = job.system.build(job.capacity)?;
    let kv: &dyn Kv = &*kv;
    let r = load(
        kv,
        job.records,
        job.value_size,
        job.threads,
        &cpus,
        job.seed,
    )
    .map_err(|e| format!("ycsb {} threads={}: {e}", job.system, job.threads))?;
    emit(cell_of("load", None, job.threads, &r));
    let c = condition(
        kv,
        job.records,
        job.value_size,
        job.threads,
        &cpus,
        job.seed,
    )
    .map_err(|e| {
        format!(
            "ycsb {} threads={}: overwrite pass: {e}",
            job.system, job.threads
        )
    })?;
    // Its failed writes are reported with the first measured cell's.
    let mut carry = Some((c.put_errors, c.first_error));
    for &dist in &job.distributions {
        for &workload in &job.workloads {
            let spec = RunSpec {
                workload,
                dist,
                records: job.records,
                value_size: job.value_size,
                threads: job.threads,
                warmup: Duration::from_millis(job.warmup_ms),
                duration: Duration::from_millis(job.measure_ms),
                seed: job.seed ^ ((workload as u64) << 8 | dist as u64),
            };
            let r = run_workload(kv, &spec, &cpus).map_err(|e| {
                format!(
                    "ycsb {} {} {} threads={}: {e}",
                    job.system,
                    workload.name(),
                    dist.name(),
                    job.threads
                )
            })?;
            let mut cell = cell_of(workload.name(), Some(dist), job.threads, &r);
            if let Some((n, e)) = carry.take() {
                cell.put_errors += n;
                if cell.first_error.is_none() {
                    cell.first_error = e.map(|e| format!("{e} (overwrite pass)"));
                }
            }
            emit(cell);
        }
    }
    Ok(())
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
             capacity {:.0} MiB (2.5 x records x (24 B key + value + 18 B header), >= 64 MiB).",
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
    let pb = util::progress_bar(total, "memlab ycsb");
    rep.set_progress(pb.clone());
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
        crate::report::check_run(
            rep,
            &what,
            "reads of loaded keys",
            c.misses,
            c.bad_values,
            c.put_errors,
            c.first_error.as_deref(),
        );
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
                // The load has no request distribution: null ("-" in the table).
                let row = Row::new(BENCH, system.name(), threads)
                    .set("workload", wl.as_str())
                    .set("distribution", dist.clone());
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
    rep.flush()?;
    pb.finish_and_clear();
    rep.set_progress(ProgressBar::hidden());
    Ok(())
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
            let r = load(&*kv, 2000, 64, 2, &cpus, 1).unwrap();
            assert_eq!(r.ops, 2000);
            let c = condition(&*kv, 2000, 64, 2, &cpus, 1).unwrap();
            assert_eq!((c.ops, c.put_errors), (4000, 0));
            for w in [Workload::A, Workload::B, Workload::C, Workload::F] {
                for d in [Dist::Uniform, Dist::Zipfian] {
                    let s = RunSpec {
                        workload: w,
                        dist: d,
                        records: 2000,
                        value_size: 64,
                        threads: 2,
                        warmup: Duration::from_millis(5),
                        duration: Duration::from_millis(30),
                        seed: 3,
                    };
                    let r = run_workload(&*kv, &s, &cpus).unwrap();
                    assert!(r.ops > 0);
                    assert_eq!(
                        (r.misses, r.bad_values, r.put_errors),
                        (0, 0, 0),
                        "{sys} {w:?} {d:?}"
                    );
                }
            }
        }
    }
}
