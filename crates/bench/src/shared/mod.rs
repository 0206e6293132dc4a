//! `memlab shared`: the shared Nibble store (crate `nibblejmp`, issue 8)
//! used directly by client processes, against the same requests sent to a
//! server over a Unix socket (SpaceJMP §5.3, Fig. 10), and the time a
//! restarted process needs to serve a multi-GiB data set again.
//!
//! # The comparison (Fig. 10a/b/c)
//!
//! ```text
//!  direct:  client process ── attach DIR ──▶ nibblejmp store (SpaceJMP segments, /dev/shm)
//!           get/put are function calls on memory every process maps at the same address
//!  nibble:  client process ── RESP over a Unix socket ──▶ nibble server (its own engine)
//!  nibble-data-dir: the same ──▶ nibble --data-dir: the server on a nibblejmp store (direct's engine)
//!  redis:   client process ── RESP over a Unix socket ──▶ redis-server (unixsocket, no persistence)
//! ```
//!
//! Per repeat and system, in turn: create the store (or start the server),
//! preload `--keys` keys (`"key:"` + 12 digits) of `--value-size` bytes
//! (4 by default, the paper's payload), then run each cell — a number of
//! client processes and a SET percentage — and stop. A cell is P fresh
//! OS processes (this binary re-run as `memlab shared --child SPEC`), each
//! attaching the store or connecting to the socket, then waiting for one
//! common start time (CLOCK_MONOTONIC, handed out after every process said
//! it is ready) so all run the same window: a warm-up, then `--seconds`
//! measured. Each process sends one request at a time (no pipelining, as
//! redis-benchmark's clients in the paper): a uniformly random key, GET or
//! SET by the cell's SET percentage. Throughput is the sum over processes
//! of requests completed in the window / the window; latency is sampled on
//! every 8th request of every system (the clock read costs a tenth of a
//! direct GET; sampling keeps that out of the throughput), one HDR
//! histogram merged over processes, p50 and p99. Every value is a
//! pseudo-random byte string derived from its key, so every GET checks the
//! whole value it got against the key it asked for, and every SET writes
//! the value the key must have: a miss, a wrong or torn value fails the
//! run (exit status 1). Ratios are taken within a repeat (direct / redis,
//! direct / nibble for the same cell), then their median over repeats.
//!
//! The direct store's compaction runs in the parent (it holds the store
//! for the whole system run, as a server holds its engine); the client
//! processes attach without their own compaction thread.
//!
//! # Restart
//!
//! ```text
//!  direct-attach:  fill a store of --restart-mib in DIR, close it (clean)
//!                  spawn a process ─ exec ─ attach ─ get(k) ✓            time = answer - spawn
//!  direct-attach-after-kill: a process holding the store is SIGKILLed (it was the last one
//!                  attached), so the next attach runs recovery first
//!  redis-rdb:      fill redis over the socket, BGSAVE, stop; spawn redis-server with the same
//!                  --dir/--dbfilename and GET k every millisecond (-LOADING while it loads) ✓
//!  nibble-data-dir: nibble --data-dir DIR, fill, stop (SIGTERM: clean; SIGKILL: recovery),
//!                  spawn again with the same DIR, GET k every millisecond ✓
//! ```
//!
//! A system that cannot run is skipped with a note saying why: redis-server
//! not installed (memlab installs it with apt-get when it runs as root,
//! as `memlab server` does), the `nibble` binary not built, or a `nibble`
//! without `--data-dir`.
//!
//! The timer starts just before `spawn` in the parent and stops at the
//! first correct answer (the child process reports its CLOCK_MONOTONIC
//! time of the answer for the direct rows), so it includes exec and
//! loading the binary. The stores and the sockets live in one scratch
//! directory on tmpfs (`/dev/shm/memlab-shared-PID`, removed at the end).
//! The RDB file is written to a disk directory (`--rdb-dir`, the temp dir
//! by default) and read back at once, so it comes from the page cache and
//! neither side pays for a disk: Redis's load is its best case, bound by
//! parsing the RDB and building its dictionary. (On tmpfs the RDB would sit
//! beside Redis's heap as a second, unreclaimable copy of the data.)

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use nibblejmp::layout::{BUCKET_BYTES, ENTRIES_PER_BUCKET, OBJ_PREFIX_BYTES};
use nibblejmp::{Options as StoreOptions, SharedStore};
use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Context, Result};
use crate::report::{Reporter, Row};
use crate::server::load::{self, Conn, KEY_LEN};
use crate::server::proto::{Expect, Proto, Reply};
use crate::server::sut::{self, Bins};
use crate::util::{self, Rng, Spread, Watchdog};
use crate::RunOpts;

mod client;
mod data;
mod process;
mod restart;
mod rows;

use client::*;
use data::*;
use process::*;
use restart::*;
use rows::*;

const BENCH: &str = "shared";
const MIX: &str = "shared-mix";
const RATIO: &str = "shared-ratio";
const RESTART: &str = "shared-restart";
const RESTART_RATIO: &str = "shared-restart-ratio";

/// Issue 8's goals: one direct client does at least this many times the
/// GET and SET throughput of redis-server over a Unix socket...
const GOAL_DIRECT_OVER_REDIS: f64 = 4.0;
/// ... and a restarted server serves a multi-GiB store "well under a
/// second": we read that as at most this.
const GOAL_RESTART_MS: f64 = 500.0;

/// Latency is sampled on every this-many-th request.
const SAMPLE_EVERY_OPS: u64 = 8;
/// The window clock is read every this-many requests.
const CHECK_EVERY_OPS: u64 = 16;
/// SETs per pipelined batch of the preload.
const LOAD_PIPELINE: usize = 64;
/// Longest wait for a server to answer, or a restarted one to serve.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Poll interval of the restart probe.
const PROBE_INTERVAL: Duration = Duration::from_millis(1);
/// Grace between SIGTERM and SIGKILL when stopping a process.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// Capacity given per key beyond its objects, for the index.
const INDEX_ROOM_PER_KEY_BYTES: u64 = 256;
/// Slack between the common start time and handing it out.
const START_SLACK: Duration = Duration::from_millis(20);

pub const ABOUT: &str = "The shared Nibble store of issue 8 (crate nibblejmp) used directly by client \
    processes, against the nibble server and redis-server over a Unix socket (SpaceJMP §5.3, Fig. 10), \
    and restart: time from process start to first served request for a multi-GiB store.\n\n\
    Systems: direct (the store attached by each client process), nibble (the server, its own engine, over a \
    Unix socket), nibble-data-dir (the server on a nibblejmp store, over a Unix socket), redis (redis-server \
    over a Unix socket).\n\
    ops (Fig. 10a/b): P client processes (--processes, default 1,2; each a fresh process attaching the store \
    or connecting to the socket), one request at a time, 100% GET then 100% SET on --keys preloaded keys of \
    --value-size bytes (default 4, the paper's payload); aggregate ops_per_sec, p50/p99 of every 8th request.\n\
    mix (Fig. 10c): the same at --mix-processes processes with --set-pcts percent SETs.\n\
    shared-ratio: direct / redis and direct / nibble per cell, within a repeat; issue 8 expects direct >= 4x \
    redis for GET and SET with one client.\n\
    restart: a store of --restart-mib MiB of --restart-value-size values: a direct client process attaching it \
    (clean, and after the last holder was SIGKILLed), nibble --data-dir restarted after SIGTERM and after \
    SIGKILL (when the nibble binary has --data-dir), redis-server loading an RDB of the same data; time from \
    spawn to the first correct GET answer. Issue 8 expects the server restart well under a second where Redis \
    needs seconds.\n\n\
    Stores and sockets live in --dir (default /dev/shm/memlab-shared-PID, removed at the end), the RDB in \
    --rdb-dir (default the temp dir; page-cached). \
    Defaults: 1M keys, 2 s measured per cell, restart 4096 MiB, 3 runs. --quick: 100k keys, 0.5 s per cell, \
    restart 256 MiB, 1 run (unless given).\n\
    Exit status 1 if a GET missed or returned a wrong value, a SET failed, or a process or server failed.";

/// A system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum System {
    /// The nibblejmp store, attached by every client process
    Direct,
    /// The nibble server over a Unix socket
    Nibble,
    /// The nibble server serving a nibblejmp store (`--data-dir`) over a Unix socket
    #[value(name = "nibble-data-dir")]
    #[serde(rename = "nibble-data-dir")]
    NibbleDataDir,
    /// redis-server over a Unix socket
    Redis,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Direct => "direct",
            System::Nibble => "nibble",
            System::NibbleDataDir => "nibble-data-dir",
            System::Redis => "redis",
        }
    }
}

/// A part of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Fig. 10a/b: 100% GET and 100% SET at each --processes
    Ops,
    /// Fig. 10c: rising SET percentage at --mix-processes
    Mix,
    /// Time to first served request after a restart
    Restart,
}

#[derive(Args)]
pub struct SharedArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Workloads, comma-separated
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ops,mix,restart"
    )]
    workloads: Vec<Workload>,
    /// Systems, comma-separated
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "direct,nibble,nibble-data-dir,redis"
    )]
    systems: Vec<System>,
    /// Client process counts of the ops workload, comma-separated [default: 1,2]
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=60))]
    processes: Option<Vec<u32>>,
    /// Client processes of the mix workload [default: the largest of --processes]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=60))]
    mix_processes: Option<u32>,
    /// SET percentages of the mix workload, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "0,10,50,90,100",
          value_parser = clap::value_parser!(u32).range(0..=100))]
    set_pcts: Vec<u32>,
    /// Keys preloaded [default: 1000000; --quick: 100000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    keys: Option<u64>,
    /// Value bytes of the ops and mix workloads
    #[arg(long, default_value = "4", value_parser = clap::value_parser!(u32).range(1..=65536))]
    value_size: u32,
    /// Measured seconds per cell, after a warm-up of a tenth (at most 0.25 s)
    /// [default: 2; --quick: 0.5]
    #[arg(long, value_parser = crate::parse_seconds)]
    seconds: Option<f64>,
    /// Data of the restart workload (keys x (16 + value bytes)), MiB
    /// [default: 4096; --quick: 256]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65536))]
    restart_mib: Option<u64>,
    /// Value bytes of the restart workload
    #[arg(long, default_value = "1024", value_parser = clap::value_parser!(u32).range(1..=65536))]
    restart_value_size: u32,
    /// Scratch directory for the stores, sockets and the RDB (removed at the end)
    /// [default: /dev/shm/memlab-shared-PID]
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Directory of redis-server's RDB in the restart workload (a disk
    /// directory: the file stays in the page cache) [default: the temp dir]
    #[arg(long)]
    rdb_dir: Option<PathBuf>,
    /// The nibble server binary [default: `nibble` next to memlab]
    #[arg(long)]
    nibble_bin: Option<PathBuf>,
    /// (internal) run as a client process with this spec
    #[arg(long, hide = true)]
    child: Option<String>,
}

/// Resolved options.
struct Opts {
    workloads: Vec<Workload>,
    systems: Vec<System>,
    cells: Vec<Cell>,
    keys: u64,
    value_size: usize,
    warmup: Duration,
    measure: Duration,
    restart_bytes: u64,
    restart_value_size: usize,
    repeat: usize,
    dir: PathBuf,
    rdb_dir: PathBuf,
    bins: Bins,
    quick: bool,
}

/// One measured configuration: client processes and SET share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cell {
    processes: usize,
    set_pct: u32,
    /// Reported in the ops table (Fig. 10a/b) and/or the mix table.
    in_ops: bool,
    in_mix: bool,
}

impl Cell {
    fn op(&self) -> String {
        match self.set_pct {
            0 => "get".into(),
            100 => "set".into(),
            p => format!("{p}% set"),
        }
    }
}

pub fn run_cli(a: SharedArgs) -> crate::error::Result<i32> {
    if let Some(spec) = &a.child {
        return child_main(spec);
    }
    let q = a.run.quick;
    if a.run.threads.is_some() {
        eprintln!("memlab shared: note: --threads is ignored (clients are processes: --processes)");
    }
    let secs = a.seconds.unwrap_or(if q { 0.5 } else { 2.0 });
    let mut procs: Vec<usize> = a
        .processes
        .clone()
        .unwrap_or_else(|| vec![1, 2])
        .into_iter()
        .map(|p| p as usize)
        .collect();
    procs.sort_unstable();
    procs.dedup();
    let mut workloads = a.workloads.clone();
    workloads.dedup();
    let mix_p = a
        .mix_processes
        .map_or_else(|| *procs.last().unwrap_or(&1), |p| p as usize);
    let mut cells: Vec<Cell> = Vec::new();
    let mut add = |processes: usize, set_pct: u32, ops: bool| {
        if let Some(c) = cells
            .iter_mut()
            .find(|c| c.processes == processes && c.set_pct == set_pct)
        {
            c.in_ops |= ops;
            c.in_mix |= !ops;
        } else {
            cells.push(Cell {
                processes,
                set_pct,
                in_ops: ops,
                in_mix: !ops,
            });
        }
    };
    if workloads.contains(&Workload::Ops) {
        for &p in &procs {
            add(p, 0, true);
            add(p, 100, true);
        }
    }
    if workloads.contains(&Workload::Mix) {
        let mut pcts = a.set_pcts.clone();
        pcts.sort_unstable();
        pcts.dedup();
        for p in pcts {
            add(mix_p, p, false);
        }
    }
    let mut systems = a.systems.clone();
    systems.dedup();
    sut::install_missing_peers();
    let dir = a.dir.clone().unwrap_or_else(|| {
        remove_stale_scratch();
        PathBuf::from(format!("{SCRATCH_PREFIX}{}", std::process::id()))
    });
    let o = Opts {
        workloads,
        systems,
        cells,
        keys: a.keys.unwrap_or(if q { 100_000 } else { 1_000_000 }),
        value_size: a.value_size as usize,
        warmup: if q {
            Duration::from_millis(100)
        } else {
            crate::warmup_for(secs)
        },
        measure: Duration::from_secs_f64(secs),
        restart_bytes: a.restart_mib.unwrap_or(if q { 256 } else { 4096 }) << 20,
        restart_value_size: a.restart_value_size as usize,
        repeat: a.run.repeat(1),
        dir,
        rdb_dir: a.rdb_dir.clone().unwrap_or_else(std::env::temp_dir),
        bins: Bins::find(a.nibble_bin.as_deref(), Vec::new()),
        quick: q,
    };
    let _scratch = Scratch::create(&o.dir)?;
    a.run.report(|rep| run(&o, rep))
}
// The driver

/// One measured cell of one repeat.
struct Sample {
    repeat: usize,
    sys: System,
    cell: Cell,
    out: CellOut,
}

/// One restart timing.
struct RestartSample {
    repeat: usize,
    system: String,
    ms: f64,
    keys: u64,
    /// Probe replies that were `-LOADING` (redis) or errors before the answer.
    loading_replies: u64,
}

fn run(o: &Opts, rep: &mut Reporter) -> std::io::Result<()> {
    let mut systems = Vec::new();
    for &s in &o.systems {
        let avail = match s {
            System::Direct => Ok(()),
            System::Nibble => o.bins.nibble.clone().map(|_| ()).map_err(Into::into),
            System::NibbleDataDir => nibble_has_data_dir(&o.bins),
            System::Redis => o.bins.redis.clone().map(|_| ()).map_err(Into::into),
        };
        match avail {
            Ok(()) => systems.push(s),
            Err(e) => {
                let n = format!("skipping {}: {e}", s.name());
                rep.note(BENCH, &n);
                eprintln!("memlab shared: note: {n}");
            }
        }
    }
    let data_dir = nibble_has_data_dir(&o.bins);
    notes(o, rep, data_dir.is_ok());
    if let Err(e) = &data_dir {
        if o.workloads.contains(&Workload::Restart)
            && o.systems
                .iter()
                .any(|s| matches!(s, System::Nibble | System::NibbleDataDir))
        {
            let n = format!("no nibble --data-dir rows: {e}");
            rep.note(RESTART, &n);
            eprintln!("memlab shared: note: {n}");
        }
    }
    let restart = o.workloads.contains(&Workload::Restart);
    let load_start = loadavg();
    let cells_steps = if o.cells.is_empty() {
        0
    } else {
        (systems.len() * (o.cells.len() + 1)) as u64
    };
    let restart_steps = if restart { systems.len() as u64 } else { 0 };
    let total = o.repeat as u64 * (cells_steps + restart_steps);
    let pb = rep.start_progress(total, "memlab shared");
    pb.enable_steady_tick(Duration::from_millis(250));
    let mut samples = Vec::new();
    let mut restarts = Vec::new();
    let cell_secs = (o.warmup + o.measure).as_secs_f64() + 1.0;
    for r in 0..o.repeat {
        if !o.cells.is_empty() {
            for &sys in &systems {
                let plan = cell_secs * o.cells.len() as f64 + 300.0;
                let _dog = Watchdog::arm(
                    Duration::from_secs_f64(plan),
                    format!("memlab shared {} run {}", sys.name(), r + 1),
                );
                let at = pb.position();
                if let Err(e) = run_system(o, sys, r, &pb, &mut samples) {
                    report_err(rep, format!("{BENCH} {} run {}: {e}", sys.name(), r + 1));
                }
                pb.set_position(at + o.cells.len() as u64 + 1);
            }
        }
        if restart {
            let _dog = Watchdog::arm(
                Duration::from_secs(1800),
                format!("memlab shared restart run {}", r + 1),
            );
            for &sys in &systems {
                pb.set_message(format!("restart {} run {}", sys.name(), r + 1));
                let res = match sys {
                    System::Direct => restart_direct(o, r, &mut restarts),
                    System::Redis => restart_redis(o, r, &mut restarts),
                    // Once, under nibble-data-dir when that runs.
                    System::Nibble if systems.contains(&System::NibbleDataDir) => Ok(()),
                    System::Nibble | System::NibbleDataDir => match &data_dir {
                        Ok(()) => restart_nibble(o, r, &mut restarts),
                        Err(_) => Ok(()),
                    },
                };
                if let Err(e) = res {
                    report_err(rep, format!("{RESTART} {} run {}: {e}", sys.name(), r + 1));
                }
                pb.inc(1);
            }
        }
    }
    rep.end_progress();
    let load = format!(
        "Machine load (/proc/loadavg 1-min) at start {load_start}, at end {}; {} online CPUs.",
        loadavg(),
        util::online_cpus().len()
    );
    if !o.cells.is_empty() {
        rep.note(BENCH, &load);
    }
    if restart {
        rep.note(RESTART, &load);
    }
    emit(o, &systems, &samples, &restarts, rep)?;
    rep.flush()
}

/// The 1-minute load average.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Correctness failures fail a check; anything else is a run error.
fn report_err(rep: &mut Reporter, e: String) {
    if e.contains("check failed") {
        rep.fail(e);
    } else {
        rep.error(e);
    }
}

/// Whether the nibble binary takes `--data-dir` (issue 8's server restart).
fn nibble_has_data_dir(bins: &Bins) -> Result<()> {
    let bin = bins.nibble.clone()?;
    let out = Command::new(&bin)
        .arg("--help")
        .output()
        .with_context(|| bin.display())?;
    if String::from_utf8_lossy(&out.stdout).contains("--data-dir") {
        Ok(())
    } else {
        Err(format!(
            "{} has no --data-dir option (not landed in this build)",
            bin.display()
        )
        .into())
    }
}

/// Capacity of a store for `keys` objects of `value_size` bytes plus
/// room for overwrites.
/// (Index sizing: the stores give the index a fixed share of the
/// capacity, so a store of many small objects needs capacity for its index
/// as much as for its log.)
fn ops_capacity(o: &Opts) -> u64 {
    (o.keys * (object_bytes(o.value_size) * 4 + INDEX_ROOM_PER_KEY_BYTES)).max(64 << 20)
}

/// Options of a direct store of `capacity` for `keys` keys: the index
/// share raised (if need be) so its buckets hold the keys at a load of at
/// most 40 %.
fn store_options(capacity: u64, keys: u64) -> StoreOptions {
    let want_bytes =
        (keys.div_ceil(ENTRIES_PER_BUCKET as u64 * 2 / 5)).next_power_of_two() * BUCKET_BYTES;
    let permille = (want_bytes * 1000).div_ceil(capacity) + 1;
    let d = StoreOptions::default();
    StoreOptions {
        index_permille: (permille as u32).clamp(d.index_permille, 500),
        ..d
    }
}

/// All cells of one system in one repeat.
fn run_system(
    o: &Opts,
    sys: System,
    r: usize,
    pb: &ProgressBar,
    samples: &mut Vec<Sample>,
) -> Result<()> {
    pb.set_message(format!("{} run {}: preload", sys.name(), r + 1));
    let cap = ops_capacity(o);
    // Keep the store (direct) or the server alive for the whole run.
    let mut store = None;
    let mut server = None;
    let path = match sys {
        System::Direct => {
            let d = o.dir.join(format!("ops-store-{r}"));
            let s = SharedStore::create(&d, cap, &store_options(cap, o.keys))
                .with_context(|| format!("create {}", d.display()))?;
            load_direct(&s, o.keys, o.value_size, 1)?;
            store = Some(s);
            d
        }
        _ => {
            let spec = ServerSpec::new(o, sys, &format!("ops-{r}"), cap, None)?;
            let (p, mut c) = spec.start()?;
            load_socket(&mut c, 0, o.keys, o.value_size)?;
            server = Some((p, spec.store_dir.clone()));
            spec.sock
        }
    };
    pb.inc(1);
    for (ci, cell) in o.cells.iter().enumerate() {
        pb.set_message(format!(
            "{} run {}: {} processes, {}",
            sys.name(),
            r + 1,
            cell.processes,
            cell.op()
        ));
        let seed = ((r as u64) << 40) ^ ((ci as u64) << 20) ^ sys as u64;
        let out = run_cell(o, sys, &path, cell, seed)?;
        if let Some((p, _)) = server.as_mut() {
            if let Some(e) = p.exited() {
                return Err(e);
            }
        }
        samples.push(Sample {
            repeat: r,
            sys,
            cell: *cell,
            out,
        });
        pb.inc(1);
    }
    if let Some(s) = store {
        s.close().context("close")?;
        SharedStore::remove(&path).context("remove")?;
    }
    if let Some((mut p, store_dir)) = server {
        p.stop()?;
        if let Some(d) = store_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_per_key_and_checked() {
        for len in [1, 4, 8, 13, 1024] {
            let mut v = vec![0u8; len];
            fill_value(7, &mut v);
            assert!(value_ok(7, &v, len));
            assert!(!value_ok(7, &v[..len - 1], len));
            let mut w = vec![0u8; len];
            fill_value(8, &mut w);
            if len >= 4 {
                assert!(!value_ok(7, &w, len), "len {len}");
            }
        }
    }

    #[test]
    fn instants_follow_the_monotonic_clock() {
        let ns = mono_ns();
        let i = instant_at(ns + 50_000_000);
        let d = i.saturating_duration_since(Instant::now());
        assert!(d > Duration::from_millis(30) && d <= Duration::from_millis(50));
    }
}
