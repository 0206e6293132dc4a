//! RadixVM Figure 8 as a micro-benchmark: N threads repeatedly take and
//! drop a reference to one shared object (map and unmap a shared page),
//! under Refcache, a shared atomic counter, and SNZI; plus bytes of
//! counting state per object.
//!
//! ```text
//! cargo run --release -p refcache --example refbench -- [--threads 1,2] [--secs 1] [--runs 3] [--json]
//! ```
//! Prints a table, or with `--json` one object per row:
//! `{"bench":"refcache","system":"refcache","threads":2,"ops_per_sec":...,...}`
//! (`ops_per_sec` counts inc+dec pairs, summed over threads).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use refcache::scheme::RefcacheCounter;
use refcache::{Config, CounterKind, RefCounter, SharedCount, Snzi, ThreadCount};

struct Args {
    threads: Vec<usize>,
    secs: f64,
    runs: usize,
    json: bool,
}

fn parse() -> Args {
    let mut args = Args {
        threads: vec![1, 2],
        secs: 1.0,
        runs: 3,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--threads" => {
                args.threads = it
                    .next()
                    .expect("--threads LIST")
                    .split(',')
                    .map(|t| t.parse().expect("thread count"))
                    .collect()
            }
            "--secs" => args.secs = it.next().expect("--secs S").parse().expect("seconds"),
            "--runs" => args.runs = it.next().expect("--runs N").parse().expect("runs"),
            "--json" => args.json = true,
            "--quick" => args.secs = 0.3,
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

/// One timed cell: pairs per second, summed over threads.
fn measure<C: RefCounter>(counter: &C, threads: usize, secs: f64) -> f64 {
    const BATCH_PAIRS: u64 = 256;
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let barrier = Barrier::new(threads + 1);
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, total, barrier) = (&stop, &total, &barrier);
            s.spawn(move || {
                let cpus = topology::allowed_cpus();
                if !cpus.is_empty() {
                    let _ = topology::pin_current_thread(cpus[t % cpus.len()]);
                }
                let mut handle = counter.thread(t);
                barrier.wait();
                let mut pairs = 0;
                while !stop.load(Ordering::Relaxed) {
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
            (measure(&c, threads, secs), c.bytes_per_object())
        }
        CounterKind::Snzi => {
            let c = Snzi::new(threads.max(1), 1);
            (measure(&c, threads, secs), RefCounter::bytes_per_object(&c))
        }
    }
}

fn main() {
    let args = parse();
    if !args.json {
        println!(
            "{:<10} {:>7} {:>14} {:>10} {:>12}",
            "system", "threads", "pairs/s", "spread%", "bytes/obj"
        );
    }
    for &threads in &args.threads {
        for kind in CounterKind::ALL {
            let mut runs: Vec<f64> = Vec::new();
            let mut bytes = 0;
            for _ in 0..args.runs.max(1) {
                let (rate, b) = cell(kind, threads, args.secs);
                runs.push(rate);
                bytes = b;
            }
            runs.sort_by(f64::total_cmp);
            let median = runs[runs.len() / 2];
            let spread = (runs[runs.len() - 1] - runs[0]) / median * 100.0;
            if args.json {
                println!(
                    "{{\"bench\":\"refcache\",\"system\":\"{kind}\",\"threads\":{threads},\
                     \"ops_per_sec\":{median:.0},\"spread_pct\":{spread:.1},\"runs\":{},\
                     \"bytes_per_object\":{bytes}}}",
                    runs.len()
                );
            } else {
                println!(
                    "{:<10} {:>7} {:>14.0} {:>10.1} {:>12}",
                    kind.name(),
                    threads,
                    median,
                    spread,
                    bytes
                );
            }
        }
    }
}
