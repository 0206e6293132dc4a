//! RadixVM Figure 8 as a library function, for `memlab refcache` (which
//! reports the rows): N threads repeatedly take and drop a reference to
//! one shared object (map and unmap a shared page) under each counting
//! scheme, plus the bytes of counting state per object.
//!
//! Each cell runs `runs` times; a row reports the median and the spread
//! ((max - min) / median). `pairs_per_sec` counts inc+dec pairs, summed
//! over threads. Threads are pinned to the allowed CPUs in turn. The runs
//! of one thread count are interleaved (run 1 of every scheme, then run 2
//! of every scheme, ...), so that a change in machine load between runs
//! affects every scheme alike and the ratios stay comparable.
//!
//! The loop calls the schemes' real `inc` and `dec`; the handle passes
//! through [`core::hint::black_box`] before each batch, so the compiler
//! can assume nothing about it across batches. Within a batch nothing is
//! folded either (checked in the generated code): the shared counter's
//! operations are `lock inc` / `lock dec`, and Refcache's fast path reads
//! the global epoch with Acquire between an `inc` and its `dec`, so the
//! two stay two read-modify-writes of the cache slot. (A `black_box` per
//! pair instead put a stack store and reload between the shared
//! counter's locked operations and cut its 2-thread rate here from about
//! 100 M to 55-73 M pairs/s: it is not used, to keep the baseline honest.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use std::vec::Vec;

use crate::scheme::RefcacheCounter;
use crate::{Config, CounterKind, RefCounter, SharedCount, Snzi, ThreadCount};

/// inc+dec pairs between checks of the stop flag.
pub const BATCH_PAIRS: u64 = 256;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Seconds per run.
    pub secs: f64,
    /// Runs per cell.
    pub runs: usize,
    /// Schemes.
    pub kinds: Vec<CounterKind>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            threads: std::vec![1, 2],
            secs: 1.0,
            runs: 3,
            kinds: CounterKind::ALL.to_vec(),
        }
    }
}

impl Options {
    /// `--quick`: under 10 seconds on 2 cores.
    pub fn quick() -> Options {
        Options {
            secs: 0.3,
            ..Options::default()
        }
    }
}

/// One result row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The scheme.
    pub kind: CounterKind,
    /// Threads taking and dropping references.
    pub threads: usize,
    /// Median inc+dec pairs per second, all threads together.
    pub pairs_per_sec: f64,
    /// (max - min) / median over runs, in percent.
    pub spread_pct: f64,
    /// Runs measured.
    pub runs: usize,
    /// Bytes of counting state per object.
    pub bytes_per_object: usize,
}

fn pin(thread: usize) {
    let cpus = topology::allowed_cpus();
    if !cpus.is_empty() {
        let _ = topology::pin_current_thread(cpus[thread % cpus.len()]);
    }
}

/// One timed run: pairs per second, summed over threads.
fn measure<C: RefCounter>(counter: &C, threads: usize, secs: f64) -> f64 {
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let barrier = Barrier::new(threads + 1);
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, total, barrier) = (&stop, &total, &barrier);
            s.spawn(move || {
                pin(t);
                let mut handle = counter.thread(t);
                barrier.wait();
                let mut pairs = 0;
                while !stop.load(Ordering::Relaxed) {
                    let handle = std::hint::black_box(&mut handle);
                    for _ in 0..BATCH_PAIRS {
                        handle.inc();
                        handle.dec();
                    }
                    pairs += BATCH_PAIRS;
                }
                total.fetch_add(pairs, Ordering::Relaxed);
            });
        }
        barrier.wait();
        let start = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        elapsed = start.elapsed();
    });
    total.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64()
}

fn cell(kind: CounterKind, threads: usize, secs: f64) -> (f64, usize) {
    match kind {
        CounterKind::Refcache => {
            let c = RefcacheCounter::new(Config::default());
            (measure(&c, threads, secs), c.bytes_per_object())
        }
        CounterKind::SharedAtomic => {
            let c = SharedCount::new(1);
            (measure(&c, threads, secs), RefCounter::bytes_per_object(&c))
        }
        CounterKind::Snzi => {
            let c = Snzi::new(threads.max(1), 1);
            (measure(&c, threads, secs), RefCounter::bytes_per_object(&c))
        }
    }
}

/// Runs every cell, calling `row` as each finishes (for progress output).
pub fn run(options: &Options, mut row: impl FnMut(&Row)) -> Vec<Row> {
    let mut rows = Vec::new();
    let runs = options.runs.max(1);
    for &threads in &options.threads {
        // rates[k]: the runs of scheme k, measured round-robin.
        let mut rates: Vec<Vec<f64>> = std::vec![Vec::new(); options.kinds.len()];
        let mut bytes = std::vec![0; options.kinds.len()];
        for _ in 0..runs {
            for (k, &kind) in options.kinds.iter().enumerate() {
                let (rate, b) = cell(kind, threads, options.secs);
                rates[k].push(rate);
                bytes[k] = b;
            }
        }
        for (k, &kind) in options.kinds.iter().enumerate() {
            let rates = &mut rates[k];
            rates.sort_by(f64::total_cmp);
            let median = rates[rates.len() / 2];
            let r = Row {
                kind,
                threads,
                pairs_per_sec: median,
                spread_pct: (rates[rates.len() - 1] - rates[0]) / median * 100.0,
                runs: rates.len(),
                bytes_per_object: bytes[k],
            };
            row(&r);
            rows.push(r);
        }
    }
    rows
}
