//! memlab: every benchmark of the project as one binary.
//!
//! Each benchmark is a subcommand. The shared conventions (see the design
//! brief, "The memlab convention"):
//!
//! * a readable, aligned table on stdout by default; `--json` prints one
//!   JSON object per result row instead (always with `bench`, `system`,
//!   `threads`, then the figures), and `--out FILE.jsonl` also writes the
//!   rows to a file;
//! * `--repeat N` runs every configuration N times (default 3) and reports
//!   the median with min and max; systems are compared as ratios of runs
//!   made in the same invocation;
//! * `--threads 1,2,...` picks the thread counts (default 1, 2 and powers of
//!   two up to the online CPUs);
//! * `--quick` finishes in under a minute on 2 cores;
//! * a progress bar on stderr while it runs; notes and errors on stderr;
//! * exit status 1 when a run failed or a correctness check failed, 3 when a
//!   run hung (a watchdog aborts it).
//!
//! `memlab plot FILE.jsonl -o FIG.png` draws any of the outputs.
//!
//! To add a benchmark: a module with the workload that takes resolved
//! options and a `report::Reporter`, a variant of `Command` with a
//! `#[command(flatten)] run: RunOpts`, and a match arm in [`main_entry`].
//!
//! The key-value benchmarks (`ycsb`, `frag`, `churn`, `fill`) compare the
//! Nibble variants with in-process hash maps under three allocators. The
//! allocator is per process, so all code lives in this library and three
//! binaries call [`main_entry`]: `memlab` (glibc malloc), `memlab-jemalloc`
//! and `memlab-mimalloc`. The parent runs each measurement in a fresh child
//! process of the right binary (module `child`), which also keeps RSS
//! figures clean.

#![deny(clippy::undocumented_unsafe_blocks)]

mod buddy;
mod cache;
mod child;
mod churn;
mod error;
mod evict;
mod expire;
mod fill;
mod frag;
mod jmp;
mod keys;
mod kv;
mod plot;
mod prims;
mod report;
mod server;
mod shared;
mod util;
mod vm;
mod ycsb;

pub use child::Alloc;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use ::buddy::AllocatorKind;
use clap::{Args, Parser, Subcommand};

use crate::error::{BenchError, Result};
use crate::kv::System;
use crate::report::Reporter;

#[derive(Parser)]
#[command(
    name = "memlab",
    version,
    about = "memlab: the memory-management stack's benchmarks, one subcommand each",
    long_about = "memlab: the memory-management stack's benchmarks, one subcommand each.\n\n\
        Every benchmark prints an aligned table by default, or one JSON object per result row \
        with --json (fields bench, system, threads and the figures). --quick finishes in under \
        a minute on 2 cores; --repeat N reports the median and min/max of N runs.",
    after_help = "Examples:\n  \
        memlab buddy --quick\n  \
        memlab buddy --json --out results/buddy.jsonl\n  \
        memlab ycsb --quick --systems nibble,nibble2,dashmap-mimalloc\n  \
        memlab frag --quick --out results/frag.jsonl\n  \
        memlab server --quick --out results/server.jsonl\n  \
        memlab jmp --quick --out results/jmp.jsonl\n  \
        memlab plot results/buddy.jsonl -o results/buddy.png",
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Physical-frame allocators (distributed buddy vs global-lock vs linux-pcp):
    /// per-CPU throughput and latency, cross-CPU imbalance, exhaustion
    #[command(
        long_about = "Physical-frame allocators of the buddy crate side by side: distributed (per-CPU heaps \
    that borrow and return frames), global-lock (one buddy, one lock) and linux-pcp (zone buddy plus \
    per-CPU single-frame caches).\n\n\
    local: threads pinned one per CPU allocate and free batches of 64 blocks on their own heap; \
    ops = allocs + frees; p50/p99 latency of single calls.\n\
    imbalance: producer/consumer pairs; frames allocated on one CPU's heap are freed on another's; \
    time series of stats() every 100 ms, then a full-coalescing check.\n\
    exhaustion: allocate until OutOfMemory; every frame must be handed out exactly once; \
    free everything cross-thread; the pool must be whole again.\n\n\
    Exit status 1 if a run failed or a check (frames lost, not coalesced) failed."
    )]
    Buddy(BuddyArgs),
    /// Key-value stores under YCSB A/B/C/F (uniform and zipfian): Nibble variants vs
    /// hash maps with glibc, jemalloc and mimalloc
    #[command(long_about = YCSB_ABOUT)]
    Ycsb(YcsbArgs),
    /// Memory bloat (RSS / live data) after a destructive allocation pattern (Fig. 14)
    #[command(long_about = FRAG_ABOUT)]
    Frag(FragArgs),
    /// A Postmark-like trace with heavy insert/delete churn, weak scaling (§5.3)
    #[command(long_about = CHURN_ABOUT)]
    Churn(ChurnArgs),
    /// YCSB-A throughput as capacity utilization rises from 10% to 90% (Figs. 20, 29)
    #[command(long_about = FILL_ABOUT)]
    Fill(FillArgs),
    /// Cache mode: miss ratio of each eviction policy on a zipfian trace vs an exact
    /// LRU, and throughput of a full cache under eviction vs a store that never evicts
    Evict(EvictArgs),
    /// Bulk TTL expiry: memory held by expired objects, bytes read to expire them and
    /// time to reuse, with TTL placement on and off side by side
    Expire(ExpireArgs),
    /// Cache against caches: miss ratio vs cache size (zipf, scan, mixed TTLs) for
    /// Nibble, Nibble-2, Segcache, memcached and redis-server, and throughput of a
    /// full cache under eviction over the memcached protocol
    Cache(CacheArgs),
    /// Small objects in process: keys a fixed budget holds (16, 64, 512-byte
    /// values) in Nibble, Nibble-2 and Segcache's storage engine
    Keys(KeysArgs),
    /// The nibble server vs redis-server and memcached over loopback: closed-loop
    /// load generator (throughput, p50/p99/p99.9, RSS), churn, redis-benchmark
    #[command(long_about = server::ABOUT)]
    Server(server::ServerArgs),
    /// SpaceJMP on Linux: VAS switch vs mmap, 1 GiB attach (4 KiB / 2 MiB pages),
    /// GUPS over windows (MAP, MP, VAS), time to first query of a persisted index
    #[command(long_about = jmp::ABOUT)]
    Jmp(jmp::JmpArgs),
    /// Issue 8's shared store: client processes on it directly vs the nibble server and
    /// redis-server over a Unix socket (SpaceJMP Fig. 10), and restart of a multi-GiB store
    #[command(long_about = shared::ABOUT)]
    Shared(shared::SharedArgs),
    /// Refcache vs shared atomic counter vs SNZI on one shared object (RadixVM Fig. 8)
    Refcache(RefcacheArgs),
    /// Lookups with concurrent writers: Bonsai tree, radix map, skip list, RwLock<BTreeMap>
    Tree(TreeArgs),
    /// Address-space designs (RadixVM, Bonsai VM, Linux-style) on the software and
    /// userfaultfd MMUs vs native mmap: local, pipeline, global (RadixVM §5)
    Mapbench(MapbenchArgs),
    /// Page-fault cost per design while one thread spends a fraction of its time in
    /// mmap/munmap (Bonsai Figs. 16-18)
    Faultbench(FaultbenchArgs),
    /// Draw a JSON-lines result file (PNG or SVG): panels per bench, lines per system
    Plot(PlotArgs),
    /// (internal) run one measurement in this process and print its results
    #[command(name = "__cell", hide = true)]
    Cell {
        /// The job, as JSON
        spec: String,
    },
    /// (internal) a child process of `memlab jmp`
    #[command(name = "__jmp", hide = true)]
    JmpChild {
        /// ROLE ARG N
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

const SYSTEMS_HELP: &str = "nibble, nibble2, nibble-1head, nibble-atomic-epoch, \
    hashmap-{glibc,jemalloc,mimalloc}, dashmap-{glibc,jemalloc,mimalloc}; by name only: \
    nibble2-prefault (Nibble-2 with its log mapped in at creation)";

const YCSB_ABOUT: &str = "YCSB core workloads on every key-value system (dissertation §5.4, §6.3).\n\n\
    Per (run, threads, system) a fresh process loads --records records (keys \"user\"+fnv64(i), values of \
    --value-size bytes; the load is its own row), then runs each workload for --seconds: A (50% read, 50% update), \
    B (95/5), C (100% read), F (50% read, 50% read-modify-write), under the uniform and YCSB's scrambled zipfian \
    (theta 0.99) request distributions. Rows: ops_per_sec (median [min, max]), p50/p99 latency of every 16th op. \
    ycsb-ratio: each Nibble variant / the best in-process baseline of the cell.\n\n\
    Systems: nibble, nibble2 (in-place overwrite), nibble-1head (one log head), nibble-atomic-epoch (global \
    epoch), and hashmap (64 x Mutex<HashMap>) and dashmap, each with glibc malloc, jemalloc and mimalloc (run \
    in the sibling binaries memlab-jemalloc and memlab-mimalloc).\n\n\
    --quick: 200k records, 1 s per cell, workloads A and C, 2 threads, 1 run (unless given).\n\
    Exit status 1 if a read missed or returned a wrong value, or a run failed.";

const FRAG_ABOUT: &str = "Fig. 14 of the dissertation: for each size pair A->B, insert objects of A bytes until \
    live data reaches --target-mib, delete 90% at random, insert objects of B bytes until live data is back at the \
    target or an insert fails; then bloat = VmRSS / live bytes. Every cell runs in a fresh process. Nibble \
    variants get 1.5 x the target as capacity and compact_now + one retry on out-of-memory (completed = NO if the \
    target was not reached).\n\n\
    --quick: target 128 MiB, 1 run (unless given).";

const CHURN_ABOUT: &str = "A Postmark-like trace (dissertation §5.3): per thread, its own keys: create --files \
    files of 500-4096 B, then --ops transactions (10% create, 10% delete, 40% read, 40% append 64-512 B = read + \
    write back), then delete the rest. Weak scaling: time to completion and ops/s per thread count.\n\n\
    --quick: 20k files and 400k transactions per thread, 1 run (unless given).";

const FILL_ABOUT: &str = "YCSB-A (uniform) throughput as the store fills (dissertation Fig. 20 and Fig. 29): for each \
    utilization, a fresh store whose block pool the live data (header + key + value) fills to that share, then \
    YCSB-A for --seconds at 2 threads. --hold data (default): one data set (what fills the lowest utilization of a \
    --capacity-mib store, 1 GiB by default) on ever smaller stores, so only utilization changes; --hold capacity: \
    one store of --capacity-mib, ever more data. Rows carry Nibble's compaction counters; fill-ratio: throughput \
    relative to the lowest utilization.\n\n\
    --quick: utilizations 10,50,90, 1 s, 1 run (unless given).";

/// Options every benchmark subcommand takes.
#[derive(Args, Clone)]
struct RunOpts {
    /// One JSON object per result row on stdout instead of tables
    #[arg(long)]
    json: bool,
    /// Short runs: the whole subcommand finishes in under 60 s on 2 cores
    #[arg(long)]
    quick: bool,
    /// Runs per configuration; the median and min/max are reported
    /// [default: 3; key-value benchmarks with --quick: 1]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: Option<u32>,
    /// Thread counts, comma-separated [default: 1,2 and powers of two up to the online CPUs]
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..4097))]
    threads: Option<Vec<u32>>,
    /// Also write the JSON lines to this file (truncated)
    #[arg(long, value_name = "FILE.jsonl")]
    out: Option<PathBuf>,
}

impl RunOpts {
    fn threads(&self) -> Vec<usize> {
        match &self.threads {
            Some(v) => {
                let mut t: Vec<usize> = v.iter().map(|&x| x as usize).collect();
                t.dedup();
                t
            }
            None => util::default_threads(util::online_cpus().len()),
        }
    }

    /// Runs per configuration: as given, else 3 (or `quick_default` with --quick).
    fn repeat(&self, quick_default: u32) -> usize {
        self.repeat
            .unwrap_or(if self.quick { quick_default } else { 3 }) as usize
    }

    fn reporter(&self) -> Result<Reporter> {
        Reporter::new(self.json, self.out.as_deref()).map_err(BenchError::Output)
    }

    /// Run a workload with this run's reporter: the exit status it earned.
    fn report(&self, run: impl FnOnce(&mut Reporter) -> std::io::Result<()>) -> Result<i32> {
        let mut rep = self.reporter()?;
        run(&mut rep).map_err(BenchError::Output)?;
        Ok(rep.exit_code())
    }

    /// Warm-up before a measured run of `secs`: 50 ms with --quick, else
    /// [`warmup_for`].
    fn warmup(&self, secs: f64) -> Duration {
        if self.quick {
            Duration::from_millis(50)
        } else {
            warmup_for(secs)
        }
    }
}

#[derive(Args)]
struct BuddyArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Workloads to run, comma-separated
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "local,imbalance,exhaustion"
    )]
    workload: Vec<buddy::Workload>,
    /// Allocators, comma-separated: distributed, global-lock, linux-pcp [default: all]
    #[arg(long, value_delimiter = ',')]
    allocator: Option<Vec<AllocatorKind>>,
    /// Block sizes of the local workload in frames (powers of two), comma-separated
    #[arg(long, value_delimiter = ',', default_value = "1,8,512", value_parser = parse_pow2)]
    sizes: Vec<u64>,
    /// Measured time per local run and per imbalance run, ms
    /// [default: local 1000, imbalance 2000; --quick: 250 and 1000]
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..))]
    duration_ms: Option<u64>,
}

fn parse_pow2(s: &str) -> Result<u64> {
    let v: u64 = parse_number(s)?;
    // Larger blocks would need pools (and metadata) of many GiB per thread.
    if v == 0 || !v.is_power_of_two() || v > 1 << 10 {
        return Err(usage(format!(
            "{v} is not a power of two between 1 and 1024 frames"
        )));
    }
    Ok(v)
}

/// The `--systems` option of the key-value benchmarks.
#[derive(Args)]
struct SystemsArg {
    /// Systems, comma-separated [default: all]: nibble, nibble2, nibble-1head,
    /// nibble-atomic-epoch, hashmap-{glibc,jemalloc,mimalloc}, dashmap-{glibc,jemalloc,mimalloc}
    #[arg(long, value_delimiter = ',', value_parser = parse_system)]
    systems: Option<Vec<System>>,
}

impl SystemsArg {
    fn resolve(&self) -> Vec<System> {
        let mut v = self
            .systems
            .clone()
            .unwrap_or_else(|| kv::ALL_SYSTEMS.to_vec());
        let mut seen = Vec::new();
        v.retain(|s| {
            let new = !seen.contains(s);
            seen.push(*s);
            new
        });
        v
    }
}

fn parse_system(s: &str) -> Result<System> {
    s.parse::<System>()
        .map_err(|e| usage(format!("{e}; the systems are {SYSTEMS_HELP}")))
}

fn parse_value_size(s: &str) -> Result<usize> {
    let v: usize = parse_number(s)?;
    if !(16..=1 << 20).contains(&v) {
        return Err(usage(format!(
            "{v}: values must be 16 B to 1 MiB (they carry a 16-byte stamp)"
        )));
    }
    Ok(v)
}

fn parse_seconds(s: &str) -> Result<f64> {
    let v: f64 = parse_number(s)?;
    if !(0.01..=3600.0).contains(&v) {
        return Err(usage(format!("{v}: seconds must be between 0.01 and 3600")));
    }
    Ok(v)
}

fn parse_pair(s: &str) -> Result<(usize, usize)> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| usage(format!("{s:?}: a pair is A:B (bytes), e.g. 1024:4096")))?;
    let p = |x: &str| -> Result<usize> {
        let v: usize = parse_number(x)?;
        if !(32..=16 << 20).contains(&v) {
            return Err(usage(format!("{v}: object sizes must be 32 B to 16 MiB")));
        }
        Ok(v)
    };
    Ok((p(a)?, p(b)?))
}

#[derive(Args)]
struct YcsbArgs {
    #[command(flatten)]
    run: RunOpts,
    #[command(flatten)]
    systems: SystemsArg,
    /// Records loaded [default: 1000000; --quick: 200000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    records: Option<u64>,
    /// Value bytes
    #[arg(long, default_value = "1024", value_parser = parse_value_size)]
    value_size: usize,
    /// Measured seconds per cell (after a warm-up of a tenth of it, at most 0.25 s)
    /// [default: 2; --quick: 1]
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f64>,
    /// Workloads, comma-separated [default: a,b,c,f; --quick: a,c]
    #[arg(long, value_enum, value_delimiter = ',')]
    workloads: Option<Vec<ycsb::Workload>>,
    /// Request distributions, comma-separated
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "uniform,zipfian"
    )]
    distributions: Vec<ycsb::Dist>,
}

#[derive(Args)]
struct FragArgs {
    #[command(flatten)]
    run: RunOpts,
    #[command(flatten)]
    systems: SystemsArg,
    /// Live data to reach, MiB [default: 1024; --quick: 128]
    #[arg(long, value_parser = clap::value_parser!(u64).range(8..=16384))]
    target_mib: Option<u64>,
    /// Size pairs A:B in bytes, comma-separated
    /// [default: 64:128,256:512,1000:1024,1024:256,1024:4096,4096:10240,10240:102400,102400:10240]
    #[arg(long, value_delimiter = ',', value_parser = parse_pair)]
    pairs: Option<Vec<(usize, usize)>>,
    /// Longest compact_now after an out-of-memory insert, seconds
    #[arg(long, default_value = "20", value_parser = parse_seconds)]
    compact_timeout: f64,
    /// Cells run at once, each in its own process (RSS is per process, so they do not
    /// disturb each other's figures) [default: the online CPUs, at most 4]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    jobs: Option<u32>,
}

#[derive(Args)]
struct ChurnArgs {
    #[command(flatten)]
    run: RunOpts,
    #[command(flatten)]
    systems: SystemsArg,
    /// Files created per thread before the transactions [default: 50000; --quick: 20000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    files: Option<u64>,
    /// Transactions per thread [default: 2000000; --quick: 400000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    ops: Option<u64>,
}

#[derive(Args)]
struct CacheArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Keys in the working set [default: 1000000; --quick: 100000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1000..))]
    keys: Option<u64>,
    /// Value bytes
    #[arg(long, default_value = "1000")]
    value_bytes: usize,
    /// Cache sizes, percent of the data (keys + values), comma-separated
    /// [default: 1,5,10,25,50; --quick: 10,20,30,40,50]
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<f64>>,
    /// Traces: zipf<alpha>, scan (a one-off scan), ttl (mixed TTLs, paced)
    #[arg(long, value_delimiter = ',', default_value = "zipf0.8,zipf1.0,zipf1.2,scan,ttl",
          value_parser = cache::TraceKind::parse)]
    traces: Vec<cache::TraceKind>,
    /// Systems, comma-separated [default: all]
    #[arg(long, value_delimiter = ',', value_enum)]
    systems: Option<Vec<cache::CacheSys>>,
    /// Client threads of the throughput runs; 0 = no throughput runs [default: 2]
    #[arg(long, value_delimiter = ',')]
    clients: Option<Vec<usize>>,
    /// Seconds of each throughput run [default: 3; --quick: 1]
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f64>,
    /// Pin throughput client thread t to allowed CPU t mod CPUs, so every
    /// run of every system sees the same client placement
    #[arg(long)]
    pin_clients: bool,
    /// The nibble server binary [default: `nibble` next to memlab]
    #[arg(long)]
    nibble_bin: Option<PathBuf>,
}

#[derive(Args)]
struct EvictArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Keys in the trace [default: 200000; --quick: 60000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1000..))]
    keys: Option<u64>,
    /// Value bytes (small values make the index, not the log, the limit)
    #[arg(long, default_value = "1000")]
    value_bytes: usize,
    /// Zipf exponent of key popularity
    #[arg(long, default_value = "1.0")]
    alpha: f64,
    /// Cache sizes, percent of the data (keys + values), comma-separated
    #[arg(long, value_delimiter = ',', default_value = "10,20,40")]
    sizes: Vec<u32>,
    /// Seconds of each throughput run [default: 3; --quick: 1]
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f64>,
}

#[derive(Args)]
struct ExpireArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Persistent keys (no TTL) [default: 300000; --quick: 100000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1000..))]
    keys: Option<u64>,
    /// Value bytes
    #[arg(long, default_value = "200")]
    value_bytes: usize,
    /// Writes per second in the write phase [default: 200000; --quick: 100000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1000..))]
    rate: Option<u64>,
    /// Seconds of the write phase [default: 10; --quick: 4]
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f64>,
    /// Seconds without writes after it (TTLs are 1 s and 5 s) [default: 8; --quick: 7]
    #[arg(long, value_parser = parse_seconds)]
    drain: Option<f64>,
    /// Store capacity, MiB
    #[arg(long, default_value = "512", value_parser = clap::value_parser!(u64).range(16..=65536))]
    capacity_mib: u64,
}

#[derive(Args)]
struct KeysArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Memory budget of every system, MiB [default: 256; --quick: 64]
    #[arg(long, value_parser = clap::value_parser!(u64).range(16..=65536))]
    capacity_mib: Option<u64>,
    /// Value sizes in bytes, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "16,64,512")]
    value_bytes: Vec<usize>,
    /// Systems, comma-separated [default: all]
    #[arg(long, value_delimiter = ',', value_enum)]
    systems: Option<Vec<keys::KeysSys>>,
}

#[derive(Args)]
struct FillArgs {
    #[command(flatten)]
    run: RunOpts,
    #[command(flatten)]
    systems: SystemsArg,
    /// Store capacity, MiB (with --hold data: of the lowest utilization's store)
    #[arg(long, value_parser = clap::value_parser!(u64).range(16..=65536))]
    capacity_mib: Option<u64>,
    /// Utilizations in percent, comma-separated [default: 10,30,50,70,90; --quick: 10,50,90]
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=97))]
    utilizations: Option<Vec<u32>>,
    /// Measured seconds per utilization [default: 2; --quick: 1]
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f64>,
    /// Value bytes
    #[arg(long, default_value = "1024", value_parser = parse_value_size)]
    value_size: usize,
    /// What stays fixed as utilization rises: `data` (the store shrinks) or
    /// `capacity` (the data set grows)
    #[arg(long, value_enum, default_value = "data")]
    hold: fill::Hold,
}

#[derive(Args)]
struct PlotArgs {
    /// JSON-lines result files (as written by --json or --out)
    #[arg(required = true, value_name = "FILE.jsonl")]
    inputs: Vec<PathBuf>,
    /// Output image; the format follows the extension (.png or .svg)
    #[arg(short, long, value_name = "FIG.png")]
    output: PathBuf,
    /// Field on the y axis [default: the first of ops_per_sec, bloat, ratio a row has]
    #[arg(long)]
    y: Option<String>,
    /// Field on the x axis [default: the first of t_ms, utilization, pair_index, threads a row has]
    #[arg(long)]
    x: Option<String>,
    /// Fields that split a bench into panels, comma-separated
    /// [default: size_frames,order,queue_frames,phase,workload,distribution,mix,key_bytes,value_bytes,protocol]
    #[arg(long, value_delimiter = ',')]
    by: Option<Vec<String>>,
    /// Only benches whose name contains this text
    #[arg(long)]
    bench: Option<String>,
    /// Figure title [default: file names and the y field]
    #[arg(long)]
    title: Option<String>,
}

fn run_buddy(a: BuddyArgs) -> Result<i32> {
    let mut allocators = a.allocator.unwrap_or_else(|| AllocatorKind::ALL.to_vec());
    allocators.dedup();
    let opts = buddy::BuddyOpts {
        workloads: a.workload,
        allocators,
        threads: a.run.threads(),
        sizes: a.sizes,
        repeat: a.run.repeat(3),
        quick: a.run.quick,
        duration: a.duration_ms.map(Duration::from_millis),
    };
    a.run.report(|rep| buddy::run(&opts, rep))
}

/// Warm-up before a measured run of `secs`: a tenth, at most 0.25 s.
fn warmup_for(secs: f64) -> Duration {
    Duration::from_secs_f64((secs / 10.0).min(0.25))
}

fn run_ycsb(a: YcsbArgs) -> Result<i32> {
    let q = a.run.quick;
    let secs = a.seconds.unwrap_or(if q { 1.0 } else { 2.0 });
    let threads = match (&a.run.threads, q) {
        (None, true) => vec![2],
        _ => a.run.threads(),
    };
    let opts = ycsb::YcsbOpts {
        systems: a.systems.resolve(),
        threads,
        records: a.records.unwrap_or(if q { 200_000 } else { 1_000_000 }),
        value_size: a.value_size,
        workloads: a.workloads.clone().unwrap_or_else(|| {
            use ycsb::Workload::*;
            if q {
                vec![A, C]
            } else {
                vec![A, B, C, F]
            }
        }),
        distributions: a.distributions.clone(),
        warmup: a.run.warmup(secs),
        duration: Duration::from_secs_f64(secs),
        repeat: a.run.repeat(1),
    };
    a.run.report(|rep| ycsb::run(&opts, rep))
}

fn run_frag(a: FragArgs) -> Result<i32> {
    let q = a.run.quick;
    if a.run.threads.is_some() {
        eprintln!("memlab frag: note: --threads is ignored (the pattern runs on one thread)");
    }
    let opts = frag::FragOpts {
        systems: a.systems.resolve(),
        pairs: a
            .pairs
            .clone()
            .unwrap_or_else(|| frag::DEFAULT_PAIRS.to_vec()),
        target_bytes: a.target_mib.unwrap_or(if q { 128 } else { 1024 }) << 20,
        compact_timeout: Duration::from_secs_f64(a.compact_timeout),
        repeat: a.run.repeat(1),
        jobs: a
            .jobs
            .map_or_else(|| util::online_cpus().len().min(4), |j| j as usize),
    };
    a.run.report(|rep| frag::run(&opts, rep))
}

fn run_churn(a: ChurnArgs) -> Result<i32> {
    let q = a.run.quick;
    let opts = churn::ChurnOpts {
        systems: a.systems.resolve(),
        threads: a.run.threads(),
        files_per_thread: a.files.unwrap_or(if q { 20_000 } else { 50_000 }),
        ops_per_thread: a.ops.unwrap_or(if q { 400_000 } else { 2_000_000 }),
        repeat: a.run.repeat(1),
    };
    a.run.report(|rep| churn::run(&opts, rep))
}

fn run_fill(a: FillArgs) -> Result<i32> {
    let q = a.run.quick;
    let secs = a.seconds.unwrap_or(if q { 1.0 } else { 2.0 });
    let mut utilizations = a.utilizations.clone().unwrap_or_else(|| {
        if q {
            vec![10, 50, 90]
        } else {
            vec![10, 30, 50, 70, 90]
        }
    });
    utilizations.sort_unstable();
    utilizations.dedup();
    let opts = fill::FillOpts {
        systems: a.systems.resolve(),
        threads: match &a.run.threads {
            None => vec![2],
            Some(_) => a.run.threads(),
        },
        capacity: (a.capacity_mib.unwrap_or(1024) << 20) as usize,
        fixed_data: a.hold == fill::Hold::Data,
        value_size: a.value_size,
        utilizations,
        warmup: a.run.warmup(secs),
        duration: Duration::from_secs_f64(secs),
        repeat: a.run.repeat(1),
    };
    a.run.report(|rep| fill::run(&opts, rep))
}

fn run_plot(a: PlotArgs) -> Result<i32> {
    let output = a.output.clone();
    plot::plot(&plot::PlotOpts {
        inputs: a.inputs,
        output: a.output,
        x: a.x,
        y: a.y,
        by: a.by,
        bench: a.bench,
        title: a.title,
    })?;
    eprintln!("memlab plot: wrote {}", output.display());
    Ok(0)
}

#[derive(Args)]
struct RefcacheArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Seconds per run [default: 1; --quick: 0.3]
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f64>,
}

fn run_refcache(a: RefcacheArgs) -> Result<i32> {
    let opts = prims::RefcacheOpts {
        threads: a.run.threads(),
        secs: a.seconds.unwrap_or(if a.run.quick { 0.3 } else { 1.0 }),
        runs: a.run.repeat(3),
    };
    a.run.report(|rep| prims::run_refcache(&opts, rep))
}

#[derive(Args)]
struct TreeArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Systems, comma-separated [default: all]: bonsai, bonsai-pin64, radix,
    /// radix-nocollapse, skiplist, rwlock-btree, ...
    #[arg(long, value_delimiter = ',')]
    systems: Option<Vec<String>>,
    /// Writer counts, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    writers: Vec<usize>,
    /// Seconds per run [default: 1; --quick: 0.3]
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f64>,
}

fn run_tree(a: TreeArgs) -> Result<i32> {
    if let Some(bad) = a
        .systems
        .iter()
        .flatten()
        .find(|s| !bonsai::bench::SYSTEMS.contains(&s.as_str()))
    {
        return Err(usage(format!(
            "unknown system {bad:?}; the systems are {}",
            bonsai::bench::SYSTEMS.join(", ")
        )));
    }
    let opts = prims::TreeOpts {
        // --threads gives reader counts here.
        readers: a.run.threads.as_ref().map_or(vec![1], |_| a.run.threads()),
        writers: a.writers.clone(),
        secs: a.seconds.unwrap_or(if a.run.quick { 0.3 } else { 1.0 }),
        runs: a.run.repeat(3),
        systems: a.systems.clone(),
    };
    a.run.report(|rep| prims::run_tree(&opts, rep))
}

#[derive(Args)]
struct MapbenchArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Workloads, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "local,pipeline,global")]
    workloads: Vec<String>,
    /// Region size in pages (per thread), comma-separated
    #[arg(long, value_delimiter = ',', default_value = "4", value_parser = clap::value_parser!(u64).range(1..65537))]
    pages: Vec<u64>,
    /// Systems, comma-separated [default: all]: radixvm-sw, bonsai-sw, linux-sw,
    /// radixvm-uffd, bonsai-uffd, linux-uffd, native-linux, radixvm-percore,
    /// bonsai-percore, linux-percore (the -percore rows run in the sibling
    /// binary radixvm-percore)
    #[arg(long, value_delimiter = ',')]
    systems: Option<Vec<String>>,
    /// Seconds per run [default: 1; --quick: 0.2]
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f64>,
}

fn run_mapbench(a: MapbenchArgs) -> Result<i32> {
    let workloads = a
        .workloads
        .iter()
        .map(|w| w.parse().map_err(BenchError::Usage))
        .collect::<Result<Vec<radixvm::bench::Workload>>>()?;
    let systems = match &a.systems {
        Some(list) => vm::parse_systems(list)?,
        None => radixvm::bench::System::ALL
            .into_iter()
            .chain(radixvm::bench::System::PERCORE)
            .collect(),
    };
    let opts = vm::MapOpts {
        threads: a.run.threads(),
        secs: a.seconds.unwrap_or(if a.run.quick { 0.2 } else { 1.0 }),
        runs: a.run.repeat(3),
        region_pages: a.pages.clone(),
        workloads,
        systems,
    };
    a.run.report(|rep| vm::run_mapbench(&opts, rep))
}

#[derive(Args)]
struct FaultbenchArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Fractions of the mapper's time spent in mmap/munmap, comma-separated
    /// [default: 0,0.1,0.25,0.5,0.75,0.9; --quick: 0,0.25,0.5,0.9]
    #[arg(long, value_delimiter = ',')]
    fractions: Option<Vec<f64>>,
    /// Systems, comma-separated [default: every design on every backend]
    #[arg(long, value_delimiter = ',')]
    systems: Option<Vec<String>>,
    /// Seconds per run [default: 1; --quick: 0.2]
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f64>,
}

fn run_faultbench(a: FaultbenchArgs) -> Result<i32> {
    let fractions = a.fractions.clone().unwrap_or_else(|| {
        if a.run.quick {
            vec![0.0, 0.25, 0.5, 0.9]
        } else {
            vec![0.0, 0.1, 0.25, 0.5, 0.75, 0.9]
        }
    });
    if let Some(bad) = fractions.iter().find(|f| !(0.0..=1.0).contains(*f)) {
        return Err(usage(format!("fraction {bad} is not between 0 and 1")));
    }
    let systems = match &a.systems {
        Some(list) => vm::parse_systems(list)?,
        None => radixvm::bench::System::ALL
            .into_iter()
            .chain(radixvm::bench::System::PERCORE)
            .filter(|s| *s != radixvm::bench::System::Native)
            .collect(),
    };
    let opts = vm::FaultOpts {
        // One mapper and the rest faulting: 2 threads at least.
        threads: a.run.threads.as_ref().map_or(vec![2], |_| a.run.threads()),
        secs: a.seconds.unwrap_or(if a.run.quick { 0.2 } else { 1.0 }),
        runs: a.run.repeat(3),
        fractions,
        systems,
    };
    a.run.report(|rep| vm::run_faultbench(&opts, rep))
}

/// The whole program; `alloc` is the global allocator of the calling binary.
pub fn main_entry(alloc: Alloc) -> ExitCode {
    child::set_self_alloc(alloc);
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Buddy(a) => run_buddy(a),
        Command::Ycsb(a) => run_ycsb(a),
        Command::Frag(a) => run_frag(a),
        Command::Churn(a) => run_churn(a),
        Command::Fill(a) => run_fill(a),
        Command::Evict(a) => {
            let q = a.run.quick;
            let opts = evict::EvictOpts {
                keys: a.keys.unwrap_or(if q { 60_000 } else { 200_000 }),
                value_bytes: a.value_bytes,
                alpha: a.alpha,
                sizes_pct: a.sizes.clone(),
                threads: a.run.threads(),
                seconds: a.seconds.unwrap_or(if q { 1.0 } else { 3.0 }),
                repeat: a.run.repeat(1),
            };
            a.run.report(|rep| evict::run(&opts, rep))
        }
        Command::Expire(a) => {
            let q = a.run.quick;
            let opts = expire::ExpireOpts {
                keys: a.keys.unwrap_or(if q { 100_000 } else { 300_000 }),
                value_bytes: a.value_bytes,
                rate: a.rate.unwrap_or(if q { 100_000 } else { 200_000 }),
                write_secs: a.seconds.unwrap_or(if q { 4.0 } else { 10.0 }),
                drain_secs: a.drain.unwrap_or(if q { 7.0 } else { 8.0 }),
                capacity_mib: a.capacity_mib as usize,
                repeat: a.run.repeat(1),
            };
            a.run.report(|rep| expire::run(&opts, rep))
        }
        Command::Keys(a) => {
            let opts = keys::KeysOpts {
                capacity_mib: a.capacity_mib.unwrap_or(if a.run.quick { 64 } else { 256 }) as usize,
                value_sizes: a.value_bytes.clone(),
                systems: a.systems.clone().unwrap_or_else(|| {
                    vec![
                        keys::KeysSys::Nibble,
                        keys::KeysSys::Nibble2,
                        keys::KeysSys::Segcache,
                        keys::KeysSys::SegcacheHeap,
                    ]
                }),
                // The counts are deterministic: one run unless asked.
                repeat: a.run.repeat.unwrap_or(1) as usize,
            };
            a.run.report(|rep| keys::run(&opts, rep))
        }
        Command::Cache(a) => {
            let q = a.run.quick;
            let opts = cache::CacheOpts {
                keys: a.keys.unwrap_or(if q { 100_000 } else { 1_000_000 }),
                value_bytes: a.value_bytes,
                sizes_pct: a.sizes.clone().unwrap_or_else(|| {
                    if q {
                        vec![10.0, 20.0, 30.0, 40.0, 50.0]
                    } else {
                        vec![1.0, 5.0, 10.0, 25.0, 50.0]
                    }
                }),
                traces: a.traces.clone(),
                systems: a
                    .systems
                    .clone()
                    .unwrap_or_else(|| cache::CacheSys::ALL.to_vec()),
                tput_clients: a
                    .clients
                    .clone()
                    .unwrap_or_else(|| vec![2])
                    .into_iter()
                    .filter(|&c| c > 0)
                    .collect(),
                tput_secs: a.seconds.unwrap_or(if q { 1.0 } else { 3.0 }),
                repeat: a.run.repeat(1),
                pin_clients: a.pin_clients,
                nibble_bin: a.nibble_bin.clone(),
            };
            a.run.report(|rep| cache::run(&opts, rep))
        }
        Command::Server(a) => server::run_cli(a),
        Command::Jmp(a) => jmp::run(a),
        Command::Shared(a) => shared::run_cli(a),
        Command::Refcache(a) => run_refcache(a),
        Command::Tree(a) => run_tree(a),
        Command::Mapbench(a) => run_mapbench(a),
        Command::Faultbench(a) => run_faultbench(a),
        Command::Plot(a) => run_plot(a),
        Command::Cell { spec } => Ok(child::child_main(&spec)),
        Command::JmpChild { args } => jmp::child(&args),
    };
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("memlab: error: {e}");
            ExitCode::from(1)
        }
    }
}

/// A command-line value that is out of range or unknown.
pub(crate) fn usage(msg: String) -> BenchError {
    BenchError::Usage(msg)
}

/// A command-line number (surrounding white space allowed).
pub(crate) fn parse_number<T: std::str::FromStr>(s: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    s.trim().parse().map_err(|e| usage(format!("{s:?}: {e}")))
}
