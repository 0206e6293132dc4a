//! `memlab server`: the nibble server against redis-server and memcached,
//! over the network, on the same machine (issue 4, "Benchmarks").
//!
//! # What runs
//!
//! ```text
//!  per repeat, per system (nibble, nibble2, redis, memcached), in turn:
//!    start the server on a free loopback port, memory limit M
//!    open --connections connections
//!    load      SET every key 0..keys (value --value-size B), pipelined  -> row phase=load
//!    per client thread count (--threads, default 2):
//!      get     100 % GET   ┐
//!      set     100 % SET   ├ warm-up, then --seconds measured           -> one row each
//!      mixed   --read-ratio GET, the rest SET ┘
//!    redis-benchmark -t set,get -P 16 -c 50 -n N (RESP systems)         -> bench redis-benchmark
//!    stop the server
//!    start a fresh one; churn; wait; RSS against live bytes; stop       -> bench server-churn
//!  then the ratios of nibble and nibble2 to redis and memcached         -> bench server-ratio
//! ```
//!
//! Systems run one after another, never at the same time, and the order is
//! the same in every repeat, so the ratios of a repeat compare runs made
//! minutes apart on the same machine; `--repeat` (default 3) gives their
//! median and spread. Each system gets the same memory limit M
//! (`--memory-mib`): nibble `--maxmemory M` (its engine's capacity),
//! `redis-server --maxmemory M --maxmemory-policy noeviction --save ''
//! --appendonly no`, and `memcached -t 2 -m M/MiB -U 0`. Nibble speaks
//! RESP unless `--protocol memcached`; redis-server is always measured over
//! RESP and memcached over its text protocol, so the ratio of nibble to
//! each is over that peer's own protocol only when `--protocol` matches.
//!
//! # The load generator
//!
//! Closed loop (see `server_load.rs` for the mechanics): `--connections`
//! connections spread over the client threads, each connection with one
//! batch of `--pipeline` requests in flight at all times. Keys are
//! `"key:"` + 12 digits (16 bytes), chosen uniformly or with YCSB's
//! scrambled zipfian (θ 0.99, the generator of `memlab ycsb`) over
//! `--keys` keys, all loaded before measuring, so every GET must hit: a
//! miss or a value of the wrong length fails a check (exit status 1).
//! Throughput counts the replies received inside the measured window
//! (after the warm-up; requests still in flight at its end are drained and
//! not counted). Latency is per request, from writing its batch to parsing
//! its reply, in an HDR histogram (1 ns to 100 s, 3 significant digits):
//! p50, p99, p99.9 of every request in the window. The client runs on the
//! same two cores as the server, as the issue prescribes; a client thread
//! costs the server CPU time, and that is part of what the ratios compare.
//!
//! # Memory
//!
//! After each phase the server's `VmRSS` (from `/proc/PID/status`) is
//! reported against the live bytes the generator knows it stored (key +
//! value bytes of every key; overwrites keep sizes, so it is `keys x (16 +
//! value size)`), with bloat = RSS / live. The churn phase runs on a fresh
//! server: insert values of 64-256 B until live data reaches `--churn-mib`,
//! delete 90 % of them at random, insert values of 512-1024 B until live
//! data is back at the target (the destructive pattern of `memlab frag`:
//! an allocator cannot reuse the holes for the new sizes), wait at least
//! 3 s (1.5 s with `--quick`) and then until RSS falls by less than 1 %
//! over a second (at most 10x the minimum; `settle_ms`), so background
//! compaction, decay or purging is counted whenever it finishes, by the
//! same rule for every server; then report RSS, peak RSS (`VmHWM`), the server's own `used_memory` /
//! `bytes` and key count, and bloat. Then, for servers that have it,
//! `MEMORY PURGE` (Redis: jemalloc returns its dirty pages at once) and RSS
//! again (`rss_purged_bytes`): the peer's best case, beside the as-is
//! figure the ratios use. A SET the server refuses (out of memory) is
//! counted and the key is not live; `completed = NO` says the target was
//! not reached.
//!
//! Before each server starts, memlab touches and frees as much memory as
//! the limit (`util::prime_memory`), so no system pays for the virtual
//! machine handing back cold pages more than another.
//!
//! # Peers and their absence
//!
//! `redis-server`, `redis-benchmark` and `memcached` are looked up in
//! `PATH` (and /usr/bin); a missing one is skipped with a note naming the
//! Debian package (`apt-get install redis-server redis-tools memcached`).
//! The `nibble` binary is taken from the directory of the running memlab
//! (the same target directory; `cargo build --release -p server -p bench`
//! builds both), or `--nibble-bin PATH`. `--endpoint HOST:PORT` measures an
//! already-running server instead (system `external`; RSS only with
//! `--endpoint-pid`). Servers are stopped on every exit path (see
//! `server_sut.rs`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::ProgressBar;

pub(crate) mod load;
pub(crate) mod proto;
mod rows;
pub(crate) mod sut;
mod target;

use crate::error::{BenchError, Context, Result};
use crate::report::{Reporter, Row};
use crate::util::{self, Spread, Watchdog};
use crate::ycsb::{Dist, KeyChooser};
use crate::RunOpts;
use load::{ChurnSpec, Conn, Mix, KEY_LEN};
use proto::{Expect, Proto};
use rows::emit;
use sut::{Bins, ServerProc, Sys};
use target::run_target;

const BENCH: &str = "server";
const CHURN: &str = "server-churn";
const RB: &str = "redis-benchmark";
const RATIO: &str = "server-ratio";

/// Pipeline depth of the preload and the churn.
const BULK_PIPELINE: usize = 32;
/// Value sizes of the churn's two insert steps, bytes.
const CHURN_SIZES_A: (u32, u32) = (64, 256);
const CHURN_SIZES_B: (u32, u32) = (512, 1024);
/// Goals of issue 4's "Done when".
const GOAL_OPS: f64 = 1.0;
const GOAL_P99: f64 = 1.5;
const GOAL_BLOAT: f64 = 1.2;
const PEER_BLOAT: f64 = 1.5;

pub const ABOUT: &str = "The nibble server against redis-server and memcached over loopback (issue 4): a \
    closed-loop load generator with HDR latency histograms, and redis-benchmark.\n\n\
    Per repeat and system (nibble, nibble2, redis, memcached; each started by memlab on a free port with the \
    same memory limit --memory-mib, stopped afterwards): preload --keys keys of --value-size bytes, then GET, \
    SET and mixed (--read-ratio) phases of --seconds each over --connections connections with --pipeline \
    requests in flight per connection, keys uniform or zipfian (--dist); rows: ops_per_sec, p50/p99/p999_ns, \
    server RSS (VmRSS) against live bytes. Then redis-benchmark -t set,get -P 16 -c 50 (and SETBIT, GETBIT, \
    BITCOUNT on -r 100000 keys) against the RESP systems, and on a fresh server a churn phase (insert 64-256 B values to --churn-mib, delete 90%, insert \
    512-1024 B values back to it) after which RSS / live bytes is reported. server-ratio: nibble and nibble2 \
    relative to redis and memcached (throughput, p99, churn bloat) with issue 4's goals.\n\n\
    Peers: redis-server, redis-benchmark and memcached from PATH (Debian: apt-get install redis-server \
    redis-tools memcached); nibble next to memlab (cargo build --release -p server) or --nibble-bin. A missing \
    one is skipped with a note. --endpoint HOST:PORT measures a running server instead.\n\n\
    --threads are client threads (default 2; each drives connections/threads connections).\n\
    Defaults: 1M keys, 1024 MiB limit, 3 s phases, churn to 5/16 of the limit, redis-benchmark -n 1000000, \
    3 runs.\n\
    --quick: 100k keys, 256 MiB limit, 1 s phases, 48 MiB churn, redis-benchmark -n 100000, 1 run (unless \
    given).\n\
    Exit status 1 if a GET of a loaded key missed or returned a wrong value, a server failed, or replies were \
    errors.";

/// A measured phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    /// 100 % GET
    Get,
    /// 100 % SET
    Set,
    /// --read-ratio GET, the rest SET
    Mixed,
    /// Insert, delete 90 %, insert other sizes; then RSS / live bytes
    Churn,
    /// LPUSH / RPOP half and half on 1,000 lists (RESP only)
    Lpush,
    /// SADD / SISMEMBER half and half on 1,000 sets (RESP only)
    Sadd,
    /// ZADD / ZRANGE 0 9 half and half on 1,000 sorted sets (RESP only)
    Zadd,
    /// MULTI, SET, INCR, EXEC (RESP only)
    Multi,
    /// Producer-consumer queue: half the connections LPUSH one list, half BRPOP it (RESP only)
    Blpop,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Get => "get",
            Phase::Set => "set",
            Phase::Mixed => "mixed",
            Phase::Churn => "churn",
            Phase::Lpush => "lpush",
            Phase::Sadd => "sadd",
            Phase::Zadd => "zadd",
            Phase::Multi => "multi",
            Phase::Blpop => "blpop",
        }
    }

    /// What the phase sends: its request kind and share of reads.
    fn mix_kind(self, read_ratio: f64) -> (load::MixKind, f64) {
        use load::MixKind;
        match self {
            Phase::Get => (MixKind::Kv, 1.0),
            Phase::Set => (MixKind::Kv, 0.0),
            Phase::Mixed | Phase::Churn => (MixKind::Kv, read_ratio),
            Phase::Lpush => (MixKind::List, 0.5),
            Phase::Sadd => (MixKind::Set, 0.5),
            Phase::Zadd => (MixKind::ZSet, 0.5),
            Phase::Multi => (MixKind::Multi, 0.0),
            Phase::Blpop => (MixKind::Queue, 0.0),
        }
    }

    /// Needs a RESP server (collections, transactions).
    fn resp_only(self) -> bool {
        matches!(
            self,
            Phase::Lpush | Phase::Sadd | Phase::Zadd | Phase::Multi | Phase::Blpop
        )
    }
}

#[derive(Args)]
pub struct ServerArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Systems, comma-separated: nibble, nibble2, redis, memcached [default: all]
    #[arg(long, value_enum, value_delimiter = ',')]
    systems: Option<Vec<Sys>>,
    /// Measure the server already listening here instead (system "external")
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "systems")]
    endpoint: Option<String>,
    /// PID of the --endpoint server, to report its RSS
    #[arg(long, requires = "endpoint")]
    endpoint_pid: Option<u32>,
    /// Protocol spoken to nibble (and to --endpoint); redis is always RESP,
    /// memcached always its text protocol
    #[arg(long, value_enum, default_value = "resp")]
    protocol: Proto,
    /// Client connections (spread over the client threads)
    #[arg(long, default_value = "32", value_parser = clap::value_parser!(u32).range(1..=4096))]
    connections: u32,
    /// Requests in flight per connection
    #[arg(long, default_value = "1", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pipeline: u32,
    /// Key space, all loaded before measuring [default: 1000000; --quick: 100000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000_000))]
    keys: Option<u64>,
    /// Value bytes of the preload and of every SET
    #[arg(long, default_value = "128", value_parser = parse_value_size)]
    value_size: usize,
    /// Share of GETs in the mixed phase
    #[arg(long, default_value = "0.9", value_parser = parse_ratio)]
    read_ratio: f64,
    /// Key distribution
    #[arg(long, value_enum, default_value = "uniform")]
    dist: Dist,
    /// Measured seconds per phase (after a warm-up of a tenth, at most 0.25 s)
    /// [default: 3; --quick: 1]
    #[arg(long, value_parser = crate::parse_seconds)]
    seconds: Option<f64>,
    /// Phases, comma-separated: get, set, mixed, churn, lpush, sadd, zadd,
    /// multi [default: get, set, mixed, churn]
    #[arg(long, value_enum, value_delimiter = ',')]
    phases: Option<Vec<Phase>>,
    /// Memory limit of every system, MiB [default: 1024; --quick: 256]
    #[arg(long, value_parser = clap::value_parser!(u64).range(16..=1 << 20))]
    memory_mib: Option<u64>,
    /// Live data of the churn phase, MiB [default: 5/16 of --memory-mib; --quick: 48]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    churn_mib: Option<u64>,
    /// redis-benchmark requests per test (-n); 0 skips it [default: 1000000; --quick: 100000]
    #[arg(long)]
    rb_requests: Option<u64>,
    /// The nibble server binary [default: `nibble` next to this executable]
    #[arg(long, value_name = "PATH")]
    nibble_bin: Option<PathBuf>,
    /// Extra argument for nibble, repeatable (e.g. --nibble-arg=--threads=2)
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    nibble_arg: Vec<String>,
}

fn parse_value_size(s: &str) -> Result<usize> {
    let v: usize = crate::parse_number(s)?;
    if !(1..=load::MAX_VALUE).contains(&v) {
        return Err(crate::usage(format!("{v}: values must be 1 B to 1 MiB")));
    }
    Ok(v)
}

fn parse_ratio(s: &str) -> Result<f64> {
    let v: f64 = crate::parse_number(s)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(crate::usage(format!(
            "{v}: the read ratio is between 0 and 1"
        )));
    }
    Ok(v)
}

/// A system as this run knows it.
#[derive(Clone, Debug)]
enum Target {
    Start(Sys),
    External { addr: SocketAddr, pid: Option<u32> },
}

impl Target {
    fn name(&self) -> &'static str {
        match self {
            Target::Start(s) => s.name(),
            Target::External { .. } => "external",
        }
    }
}

/// `memlab server`, resolved.
struct Opts {
    targets: Vec<Target>,
    bins: Bins,
    protocol: Proto,
    threads: Vec<usize>,
    connections: usize,
    pipeline: usize,
    keys: u64,
    value_size: usize,
    read_ratio: f64,
    dist: Dist,
    warmup: Duration,
    measure: Duration,
    phases: Vec<Phase>,
    memory: u64,
    churn_bytes: u64,
    churn_settle: Duration,
    rb_requests: u64,
    repeat: usize,
}

/// One measured figure set: a phase of a system in one run.
#[derive(Clone, Debug, Default)]
struct Sample {
    system: &'static str,
    run: usize,
    /// load, get, set, mixed, churn, or a redis-benchmark test (SET, GET).
    phase: String,
    threads: usize,
    ops_per_sec: f64,
    p50: Option<f64>,
    p99: Option<f64>,
    p999: Option<f64>,
    rss: Option<u64>,
    hwm: Option<u64>,
    /// RSS of the fresh server before the churn.
    rss_start: Option<u64>,
    /// RSS after `MEMORY PURGE`, where the server has it.
    rss_purged: Option<u64>,
    /// How long the churn waited for RSS to settle.
    settle: Option<Duration>,
    live: Option<u64>,
    live_keys: Option<u64>,
    server_keys: Option<u64>,
    server_used: Option<u64>,
    /// Server CPU time (user + system, all threads) per request during the
    /// measured interval: what the server spends, whatever the client and
    /// other load on the machine do to the throughput.
    cpu_ns_per_op: Option<f64>,
    completed: bool,
    secs: f64,
}

impl Sample {
    fn bloat(&self) -> Option<f64> {
        Some(self.rss? as f64 / self.live?.max(1) as f64)
    }
}

/// Run from the command line.
pub fn run_cli(a: ServerArgs) -> crate::error::Result<i32> {
    let q = a.run.quick;
    let secs = a.seconds.unwrap_or(if q { 1.0 } else { 3.0 });
    let memory_mib = a.memory_mib.unwrap_or(if q { 256 } else { 1024 });
    let churn_mib = a
        .churn_mib
        .unwrap_or(if q {
            48.min(memory_mib / 4)
        } else {
            memory_mib * 5 / 16
        })
        .max(1);
    let targets = match &a.endpoint {
        Some(ep) => {
            let addr = ep
                .to_socket_addrs()
                .with_context(|| format!("--endpoint {ep}"))?
                .next()
                .ok_or_else(|| format!("--endpoint {ep}: no address"))?;
            vec![Target::External {
                addr,
                pid: a.endpoint_pid,
            }]
        }
        None => {
            let mut v = a.systems.clone().unwrap_or_else(|| Sys::ALL.to_vec());
            let mut seen = Vec::new();
            v.retain(|s| {
                let new = !seen.contains(s);
                seen.push(*s);
                new
            });
            v.into_iter().map(Target::Start).collect()
        }
    };
    let threads = match &a.run.threads {
        None => vec![2],
        Some(_) => a.run.threads(),
    };
    let connections = a.connections as usize;
    if let Some(&t) = threads.iter().find(|&&t| t > connections) {
        return Err(BenchError::Usage(format!(
            "--threads {t} needs at least as many --connections (have {connections})"
        )));
    }
    let mut phases = a
        .phases
        .clone()
        .unwrap_or_else(|| vec![Phase::Get, Phase::Set, Phase::Mixed, Phase::Churn]);
    phases.dedup();
    let o = Opts {
        targets,
        bins: {
            if a.endpoint.is_none() {
                sut::install_missing_peers();
            }
            Bins::find(a.nibble_bin.as_deref(), a.nibble_arg.clone())
        },
        protocol: a.protocol,
        threads,
        connections,
        pipeline: a.pipeline as usize,
        keys: a.keys.unwrap_or(if q { 100_000 } else { 1_000_000 }),
        value_size: a.value_size,
        read_ratio: a.read_ratio,
        dist: a.dist,
        warmup: crate::warmup_for(secs),
        measure: Duration::from_secs_f64(secs),
        phases,
        memory: memory_mib << 20,
        churn_bytes: churn_mib << 20,
        churn_settle: Duration::from_millis(if q { 1500 } else { 3000 }),
        rb_requests: a.rb_requests.unwrap_or(if q { 100_000 } else { 1_000_000 }),
        repeat: a.run.repeat(1),
    };
    let external = a.endpoint.is_some();
    let data = o.keys.saturating_mul((KEY_LEN + o.value_size) as u64);
    if !external && !measured(&o).is_empty() && data > o.memory / 4 * 3 {
        return Err(BenchError::Usage(format!(
            "--keys x (16 + --value-size) = {} MiB of live data is more than 3/4 of the {} MiB memory \
             limit; raise --memory-mib or lower --keys",
            data >> 20,
            o.memory >> 20
        )));
    }
    if !external && o.phases.contains(&Phase::Churn) && o.churn_bytes > o.memory / 5 * 2 {
        eprintln!(
            "memlab server: note: --churn-mib {} is over 2/5 of the {} MiB limit; servers that \
             bloat 2x or more may run out of memory (completed = NO)",
            o.churn_bytes >> 20,
            o.memory >> 20
        );
    }
    a.run.report(|rep| run(&o, rep))
}

fn measured(o: &Opts) -> Vec<Phase> {
    o.phases
        .iter()
        .copied()
        .filter(|p| *p != Phase::Churn)
        .collect()
}

/// Progress steps of one system in one run.
fn steps_per_system(o: &Opts) -> u64 {
    let m = measured(o).len() as u64;
    let load = u64::from(m > 0);
    let churn = u64::from(o.phases.contains(&Phase::Churn));
    load + m * o.threads.len() as u64 + 1 + churn
}

fn run(o: &Opts, rep: &mut Reporter) -> std::io::Result<()> {
    // Which systems can run.
    let mut targets = Vec::new();
    for t in &o.targets {
        match t {
            Target::Start(s) => match o.bins.for_sys(*s) {
                Ok(_) => targets.push(t.clone()),
                Err(e) => {
                    let mut n = format!("skipping {}: {e}", s.name());
                    if *s == Sys::Redis || *s == Sys::Memcached {
                        n.push_str(&format!("; all peers: {}", sut::APT_HINT));
                    }
                    rep.note(BENCH, &n);
                    eprintln!("memlab server: note: {n}");
                }
            },
            Target::External { .. } => targets.push(t.clone()),
        }
    }
    let rb_bin = match &o.bins.redis_benchmark {
        Ok(p) if o.rb_requests > 0 => Some(p.clone()),
        Ok(_) => None,
        Err(e) => {
            let n = format!("skipping redis-benchmark: {e}");
            rep.note(RB, &n);
            eprintln!("memlab server: note: {n}");
            None
        }
    };
    notes(o, rep, rb_bin.is_some());
    let total = (o.repeat * targets.len()) as u64 * steps_per_system(o);
    let pb = rep.start_progress(total, "memlab server");
    pb.enable_steady_tick(Duration::from_millis(250));
    let mut samples: Vec<Sample> = Vec::new();
    for r in 0..o.repeat {
        for t in &targets {
            let what = format!("{} run {}", t.name(), r + 1);
            // Everything planned for this system, plus two minutes.
            let plan = (o.warmup + o.measure).as_secs_f64() * 3.0 * o.threads.len() as f64 + 120.0;
            let _dog = Watchdog::arm(
                Duration::from_secs_f64(plan * 2.0),
                format!("memlab server {what}"),
            );
            let start = pb.position();
            if let Err(e) = run_target(o, t, r, rb_bin.as_deref(), &pb, rep, &mut samples) {
                rep.error(format!("{BENCH} {what}: {e}"));
            }
            pb.set_position(start + steps_per_system(o));
        }
    }
    rep.end_progress();
    emit(o, &targets, &samples, rep)?;
    rep.flush()
}

fn notes(o: &Opts, rep: &mut Reporter, rb: bool) {
    rep.note(
        BENCH,
        &format!(
            "Closed loop over loopback: {} connections x pipeline {} spread over the client threads; {} keys \
             (\"key:\"+12 digits, 16 B) of {} B values, preloaded; {} keys; {} ms warm-up + {} ms measured per \
             phase (get 100% GET, set 100% SET, mixed {:.0}% GET). Every system has a {} MiB memory limit; nibble \
             over {}. ops_per_sec: median of {} runs [min, max]; p50/p99/p999_ns: every request in the window, HDR \
             histogram, median over runs; rss_bytes: server VmRSS after the phase; live_bytes = keys x (16 + \
             value); bloat = rss / live; server_cpu_ns_per_op: the server process's user + system CPU time \
             (all threads, /proc/PID/stat) over the measured window divided by its requests, median over \
             runs: the server's cost per request, less sensitive than ops/s to the client and other load \
             sharing the cores; wire: the protocol the generator spoke.",
            o.connections,
            o.pipeline,
            o.keys,
            o.value_size,
            o.dist.name(),
            o.warmup.as_millis(),
            o.measure.as_millis(),
            o.read_ratio * 100.0,
            o.memory >> 20,
            o.protocol,
            o.repeat
        ),
    );
    let churn = format!(
        "Fresh server: insert {}-{} B values until live data = {} MiB, delete 90% at random, insert \
         {}-{} B values back to {} MiB, wait at least {} ms and until RSS falls by < 1% in 1 s \
         (settle_ms); rss_bytes (VmRSS), rss_peak_bytes (VmHWM), \
         rss_start_bytes (VmRSS of the fresh server before the churn), rss_purged_bytes (VmRSS \
         after MEMORY PURGE, where the server has it: Redis's best case), server_used_bytes \
         (used_memory / memcached bytes) against live_bytes (key + value bytes the generator stored \
         and did not delete); bloat = rss / live, median [min, max].",
        CHURN_SIZES_A.0,
        CHURN_SIZES_A.1,
        o.churn_bytes >> 20,
        CHURN_SIZES_B.0,
        CHURN_SIZES_B.1,
        o.churn_bytes >> 20,
        o.churn_settle.as_millis()
    );
    if o.phases.contains(&Phase::Churn) {
        rep.note(CHURN, &churn);
    }
    let rb_text = format!(
        "redis-benchmark -t set,get -P 16 -c 50 -n {} -q (3-byte values, one key), then with -r {} \
         SETBIT bit__rand_int__ 7 1, GETBIT bit__rand_int__ 7 and BITCOUNT bit__rand_int__, after the \
         measured phases on the same server; ops_per_sec is its requests per second, median [min, max].",
        o.rb_requests,
        sut::RB_BIT_KEYS
    );
    if rb {
        rep.note(RB, &rb_text);
    }
}

#[cfg(test)]
mod tests {
    use super::rows::ratio_row;
    use super::*;

    #[test]
    fn ratio_rows_check_the_goals() {
        let s = |m: f64| Spread {
            median: m,
            min: m,
            max: m,
        };
        let ok = ratio_row("nibble", "redis", "get", 2, s(1.2), Some(s(1.4)));
        assert_eq!(ok.get("goal_met"), Some(&serde_json::Value::from(true)));
        let slow = ratio_row("nibble", "redis", "get", 2, s(0.9), Some(s(1.0)));
        assert_eq!(slow.get("goal_met"), Some(&serde_json::Value::from(false)));
        let laggy = ratio_row("nibble", "redis", "set", 2, s(2.0), Some(s(1.6)));
        assert_eq!(laggy.get("goal_met"), Some(&serde_json::Value::from(false)));
        let rb = ratio_row("nibble", "redis", "redis-benchmark GET", 1, s(1.0), None);
        assert_eq!(rb.get("goal_met"), Some(&serde_json::Value::from(true)));
        assert!(rb.get("p99_ratio").is_none());
    }

    /// A fraction of a second of every phase against redis-server, when it
    /// is installed.
    #[test]
    fn generator_runs_against_redis_server() {
        let bins = Bins::find(None, Vec::new());
        let Ok(_) = &bins.redis else {
            eprintln!("skipping: redis-server not installed ({})", sut::APT_HINT);
            return;
        };
        let server = ServerProc::start(Sys::Redis, &bins, 64 << 20, Proto::Resp).unwrap();
        let pid = server.pid();
        let mut conns: Vec<Conn> = (0..4)
            .map(|_| Conn::connect(server.addr, server.proto).unwrap())
            .collect();
        let keys = 2000;
        let ops = load::preload_ops(keys, 100);
        let r = load::run_bulk(&mut conns, 2, &ops, 16).unwrap();
        assert!(r.failed.is_empty(), "{r:?}");
        let mut ctl = Conn::connect(server.addr, server.proto).unwrap();
        let (k, used) = sut::server_counts(&mut ctl);
        assert_eq!(k, Some(keys));
        assert!(used.unwrap() > keys * 100);
        for (read_ratio, dist) in [(1.0, Dist::Uniform), (0.5, Dist::Zipfian)] {
            let mix = Mix {
                kind: load::MixKind::Kv,
                read_ratio,
                value_size: 100,
                chooser: KeyChooser::new(dist, keys),
                pipeline: 4,
            };
            let out = load::run_phase(
                &mut conns,
                2,
                &mix,
                Duration::from_millis(20),
                Duration::from_millis(200),
                1,
            )
            .unwrap();
            assert!(out.ops > 100, "{} ops", out.ops);
            assert_eq!((out.misses, out.bad_values, out.errors), (0, 0, 0));
            assert!(out.p_ns(0.5) > 0 && out.p_ns(0.5) <= out.p_ns(0.999));
            if read_ratio < 1.0 {
                assert!(out.sets > 0 && out.gets > 0);
            }
        }
        let spec = ChurnSpec {
            target: 1 << 20,
            sizes_a: CHURN_SIZES_A,
            sizes_b: CHURN_SIZES_B,
            delete_permille: 900,
            pipeline: 16,
            seed: 1,
        };
        let c = load::churn(&mut conns, 2, &spec).unwrap();
        assert_eq!(c.failed, 0, "{c:?}");
        assert!(c.live_bytes >= 1 << 20);
        let (k, _) = sut::server_counts(&mut ctl);
        assert_eq!(k, Some(keys + c.live_keys));
        assert!(sut::proc_rss(pid).is_some());
        drop(server);
        // The guard stopped and reaped the server.
        assert!(sut::proc_rss(pid).is_none());
    }

    /// The collection and transaction phases, a fraction of a second each
    /// against redis-server: every reply has the expected shape.
    #[test]
    fn collection_phases_run_against_redis_server() {
        let bins = Bins::find(None, Vec::new());
        let Ok(_) = &bins.redis else {
            eprintln!("skipping: redis-server not installed ({})", sut::APT_HINT);
            return;
        };
        let server = ServerProc::start(Sys::Redis, &bins, 64 << 20, Proto::Resp).unwrap();
        let mut conns: Vec<Conn> = (0..4)
            .map(|_| Conn::connect(server.addr, server.proto).unwrap())
            .collect();
        for ph in [
            Phase::Lpush,
            Phase::Sadd,
            Phase::Zadd,
            Phase::Multi,
            Phase::Blpop,
        ] {
            let (kind, read_ratio) = ph.mix_kind(0.9);
            let mix = Mix {
                kind,
                read_ratio,
                value_size: 32,
                chooser: KeyChooser::new(Dist::Zipfian, 5000),
                pipeline: 4,
            };
            let out = load::run_phase(
                &mut conns,
                2,
                &mix,
                Duration::from_millis(20),
                Duration::from_millis(150),
                3,
            )
            .unwrap();
            assert!(out.ops > 100, "{}: {} ops", ph.name(), out.ops);
            assert_eq!(
                out.errors,
                0,
                "{}: first error {:?}",
                ph.name(),
                out.first_error
            );
            if read_ratio > 0.0 || ph == Phase::Blpop {
                assert!(out.gets > 0 && out.sets > 0, "{}", ph.name());
            }
        }
        let mut ctl = Conn::connect(server.addr, server.proto).unwrap();
        let n = ctl
            .call(
                Expect::Line,
                &[b"ZCARD", &load::coll_key(b"zset", 1)],
                |r| match r {
                    proto::Reply::Int(n) => n,
                    _ => -1,
                },
            )
            .unwrap();
        assert!(n > 0, "zset:1 has {n} members");
    }

    #[test]
    fn generator_runs_against_memcached() {
        let bins = Bins::find(None, Vec::new());
        let Ok(_) = &bins.memcached else {
            eprintln!("skipping: memcached not installed ({})", sut::APT_HINT);
            return;
        };
        let server = ServerProc::start(Sys::Memcached, &bins, 64 << 20, Proto::Resp).unwrap();
        assert_eq!(server.proto, Proto::Memcached);
        let mut conns: Vec<Conn> = (0..2)
            .map(|_| Conn::connect(server.addr, server.proto).unwrap())
            .collect();
        let ops = load::preload_ops(500, 50);
        assert!(load::run_bulk(&mut conns, 1, &ops, 8)
            .unwrap()
            .failed
            .is_empty());
        let mix = Mix {
            kind: load::MixKind::Kv,
            read_ratio: 0.9,
            value_size: 50,
            chooser: KeyChooser::new(Dist::Uniform, 500),
            pipeline: 2,
        };
        let out = load::run_phase(
            &mut conns,
            1,
            &mix,
            Duration::ZERO,
            Duration::from_millis(150),
            2,
        )
        .unwrap();
        assert!(out.ops > 10);
        assert_eq!((out.misses, out.bad_values, out.errors), (0, 0, 0));
        let (k, _) = sut::server_counts(&mut conns[0]);
        assert_eq!(k, Some(500));
    }
}
