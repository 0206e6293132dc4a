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
use nibblejmp::{Options as StoreOptions, SharedStore};
use serde::{Deserialize, Serialize};

use crate::report::{Reporter, Row};
use crate::server::load::{self, Conn, KEY_LEN};
use crate::server::proto::{Expect, Proto, Reply};
use crate::server::sut::{self, Bins};
use crate::util::{self, Rng, Spread, Watchdog};
use crate::RunOpts;

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
/// Header bytes of a Nibble object (for capacity planning).
const OBJECT_HEADER_BYTES: u64 = 24;
/// Capacity given per key beyond its objects, for the index.
const INDEX_ROOM_PER_KEY_BYTES: u64 = 256;
/// Nibble's index buckets: 128 bytes, 15 entries.
const INDEX_BUCKET_BYTES: u64 = 128;
const INDEX_ENTRIES_PER_BUCKET: u64 = 15;
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

pub fn run_cli(a: SharedArgs) -> Result<i32, String> {
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
    let mut rep = a.run.reporter()?;
    let _scratch = Scratch::create(&o.dir)?;
    run(&o, &mut rep).map_err(|e| format!("output error: {e}"))?;
    Ok(rep.exit_code())
}

/// Default scratch directories: this prefix + the pid.
const SCRATCH_PREFIX: &str = "/dev/shm/memlab-shared-";

/// Remove default scratch directories of memlab processes that no longer
/// exist (a run killed by a signal cannot remove its own).
fn remove_stale_scratch() {
    let (parent, stem) = SCRATCH_PREFIX.rsplit_once('/').unwrap_or(("/dev/shm", ""));
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(stem))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!(
                "memlab shared: note: removing {} (its memlab is gone)",
                e.path().display()
            );
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn create(dir: &Path) -> Result<Scratch, String> {
        if dir.exists() {
            return Err(format!(
                "{} exists; remove it or pass another --dir",
                dir.display()
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Scratch(dir.to_path_buf()))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------
// Keys and values

/// The key of number `n`.
fn key(n: u64) -> [u8; KEY_LEN] {
    load::key(n)
}

/// splitmix64: the word stream values are made of.
#[inline]
fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Word `i` of key `k`'s value.
#[inline]
fn value_word(k: u64, i: u64) -> [u8; 8] {
    mix64(k.wrapping_mul(0x1000_0000_01b3) ^ i.wrapping_mul(0x9e37_79b9)).to_le_bytes()
}

/// Write key `k`'s value (pseudo-random bytes, incompressible) into `buf`.
fn fill_value(k: u64, buf: &mut [u8]) {
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let w = value_word(k, i as u64);
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// Whether `v` is key `k`'s value of `len` bytes.
fn value_ok(k: u64, v: &[u8], len: usize) -> bool {
    v.len() == len
        && v.chunks(8)
            .enumerate()
            .all(|(i, c)| c == &value_word(k, i as u64)[..c.len()])
}

/// Bytes a store needs per object (header + key + value, 8-aligned).
fn object_bytes(value_size: usize) -> u64 {
    (OBJECT_HEADER_BYTES + KEY_LEN as u64 + value_size as u64).next_multiple_of(8)
}

/// CLOCK_MONOTONIC in ns (the clock of `Instant`, comparable across
/// processes).
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `Instant` of CLOCK_MONOTONIC time `ns`.
fn instant_at(ns: u64) -> Instant {
    let (now_i, now_ns) = (Instant::now(), mono_ns());
    if ns >= now_ns {
        now_i + Duration::from_nanos(ns - now_ns)
    } else {
        now_i
            .checked_sub(Duration::from_nanos(now_ns - ns))
            .unwrap_or(now_i)
    }
}

// ---------------------------------------------------------------------------
// Processes: servers and clients

/// A child process (server or client): PR_SET_PDEATHSIG so it dies with
/// memlab, registered with `memlab server`'s signal handler, stopped
/// (SIGTERM, then SIGKILL) and reaped on drop.
struct Proc {
    child: Child,
    what: String,
    log: Option<PathBuf>,
}

impl Proc {
    /// Spawn `cmd`; `log`: its stdout and stderr go there (else as set on
    /// `cmd`).
    fn spawn(mut cmd: Command, what: &str, log: Option<&Path>) -> Result<Proc, String> {
        let child = sut::spawn_tied(&mut cmd, log, what)?;
        Ok(Proc {
            child,
            what: what.to_string(),
            log: log.map(Path::to_path_buf),
        })
    }

    /// Exited already? Then why, with the log's tail.
    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(st)) => Some(format!("{} exited ({st}): {}", self.what, self.log_tail())),
            _ => None,
        }
    }

    fn log_tail(&self) -> String {
        let Some(l) = &self.log else {
            return String::new();
        };
        let s = std::fs::read_to_string(l).unwrap_or_default();
        let t: Vec<&str> = s.lines().rev().take(6).collect();
        t.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// SIGTERM, wait (up to STOP_GRACE), SIGKILL if needed.
    fn stop(&mut self) -> Result<ExitStatus, String> {
        sut::terminate(&mut self.child, STOP_GRACE).ok_or_else(|| {
            format!(
                "{} did not stop within {} s of SIGTERM (killed)",
                self.what,
                STOP_GRACE.as_secs()
            )
        })
    }

    /// SIGKILL and reap.
    fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL (std does nothing once reaped)
        let _ = self.child.wait();
        sut::unregister_child(self.child.id());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        sut::terminate(&mut self.child, STOP_GRACE);
    }
}

/// How a server is started.
#[derive(Clone, Debug)]
struct ServerSpec {
    sys: System,
    bin: PathBuf,
    sock: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// nibble's --data-dir.
    store_dir: Option<PathBuf>,
}

impl ServerSpec {
    /// `data_dir`: nibble's --data-dir, or redis's --dir for its RDB.
    fn new(
        o: &Opts,
        sys: System,
        tag: &str,
        capacity: u64,
        data_dir: Option<&Path>,
    ) -> Result<ServerSpec, String> {
        let sock = o.dir.join(format!("{}-{tag}.sock", sys.name()));
        let log = o.dir.join(format!("{}-{tag}.log", sys.name()));
        let s = |x: &str| x.to_string();
        let own_dir = o.dir.join(format!("{}-{tag}.store", sys.name()));
        let data_dir = match sys {
            System::NibbleDataDir => Some(data_dir.unwrap_or(&own_dir)),
            _ => data_dir,
        };
        let (bin, args) = match sys {
            System::Nibble | System::NibbleDataDir => {
                let mut v = vec![
                    s("--port=-1"),
                    s("--unixsocket"),
                    sock.display().to_string(),
                    s("--maxmemory"),
                    capacity.to_string(),
                ];
                if let Some(d) = data_dir {
                    v.extend([s("--data-dir"), d.display().to_string()]);
                }
                (o.bins.nibble.clone()?, v)
            }
            System::Redis => {
                let d = data_dir.unwrap_or(&o.dir);
                (
                    o.bins.redis.clone()?,
                    vec![
                        s("--port"),
                        s("0"),
                        s("--unixsocket"),
                        sock.display().to_string(),
                        s("--unixsocketperm"),
                        s("700"),
                        s("--save"),
                        s(""),
                        s("--appendonly"),
                        s("no"),
                        s("--dir"),
                        d.display().to_string(),
                        s("--dbfilename"),
                        format!("{tag}.rdb"),
                        s("--daemonize"),
                        s("no"),
                    ],
                )
            }
            System::Direct => return Err("direct has no server".into()),
        };
        Ok(ServerSpec {
            sys,
            bin,
            sock,
            args,
            log,
            store_dir: data_dir
                .filter(|_| sys != System::Redis)
                .map(Path::to_path_buf),
        })
    }

    fn spawn(&self) -> Result<Proc, String> {
        let _ = std::fs::remove_file(&self.sock);
        let mut cmd = Command::new(&self.bin);
        cmd.args(&self.args);
        Proc::spawn(cmd, self.sys.name(), Some(&self.log))
    }

    /// Spawn and wait until it answers PING.
    fn start(&self) -> Result<(Proc, Conn), String> {
        let mut p = self.spawn()?;
        let t0 = Instant::now();
        loop {
            if let Some(e) = p.exited() {
                return Err(e);
            }
            if let Ok(mut c) = Conn::connect_unix(&self.sock, Proto::Resp) {
                let pong = c.call(Expect::Line, &[b"PING"], |r| {
                    matches!(r, Reply::Status(b"PONG"))
                })?;
                if pong {
                    return Ok((p, c));
                }
            }
            if t0.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "{} did not answer on {} within {} s: {}",
                    self.sys.name(),
                    self.sock.display(),
                    START_TIMEOUT.as_secs(),
                    p.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// SET keys `lo..hi` to their values over `c`, pipelined.
fn load_socket(c: &mut Conn, lo: u64, hi: u64, value_size: usize) -> Result<(), String> {
    let mut val = vec![0u8; value_size];
    let mut k = lo;
    let mut bad: Option<String> = None;
    while k < hi {
        let n = (hi - k).min(LOAD_PIPELINE as u64);
        for j in k..k + n {
            fill_value(j, &mut val);
            c.queue(&[b"SET", &key(j), &val]);
        }
        c.send_queued(n as usize, Expect::Line, |r| {
            if !r.is_stored() && bad.is_none() {
                bad = Some(r.describe());
            }
        })?;
        if let Some(b) = bad {
            return Err(format!("preload SET refused: {b}"));
        }
        k += n;
    }
    Ok(())
}

/// Put keys `0..keys` into `s` with `threads` threads.
fn load_direct(s: &SharedStore, keys: u64, value_size: usize, threads: u64) -> Result<(), String> {
    let per = keys.div_ceil(threads.max(1));
    let res: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                sc.spawn(move || {
                    let mut val = vec![0u8; value_size];
                    for k in (t * per).min(keys)..((t + 1) * per).min(keys) {
                        fill_value(k, &mut val);
                        s.put(&key(k), &val)
                            .map_err(|e| format!("preload put of key {k}: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("loader panicked".into())))
            .collect()
    });
    res.into_iter().collect()
}

// ---------------------------------------------------------------------------
// Client processes

/// What a client process does.
#[derive(Serialize, Deserialize, Debug)]
enum Role {
    /// The closed loop of a cell.
    Load {
        keys: u64,
        value_size: usize,
        set_permille: u32,
        warm_ns: u64,
        measure_ns: u64,
        seed: u64,
    },
    /// Restart: attach, answer one GET, report the time of the answer.
    Attach { key: u64, value_size: usize },
    /// Attach, say ready, wait to be killed.
    Hold,
}

#[derive(Serialize, Deserialize, Debug)]
struct ChildSpec {
    system: System,
    /// The store directory (direct) or the Unix socket (servers).
    path: PathBuf,
    role: Role,
}

/// What a client process reports.
#[derive(Serialize, Deserialize, Debug, Default)]
struct ChildOut {
    ops: u64,
    gets: u64,
    sets: u64,
    secs: f64,
    /// Latency histogram: (ns, count) of every non-empty bucket.
    hist: Vec<(u64, u64)>,
    /// Wrong or missing values, failed SETs.
    bad: u64,
    first_bad: Option<String>,
    /// Attach: CLOCK_MONOTONIC of the answer, and of entering main.
    answer_ns: u64,
    main_ns: u64,
}

/// A client's handle on a system.
enum Client {
    Direct(SharedStore),
    Socket(Conn),
}

impl Client {
    fn open(system: System, path: &Path, compaction: bool) -> Result<Client, String> {
        Ok(match system {
            System::Direct => Client::Direct(
                SharedStore::attach(
                    path,
                    &StoreOptions {
                        compaction_thread: compaction,
                        ..StoreOptions::default()
                    },
                )
                .map_err(|e| format!("attach {}: {e}", path.display()))?,
            ),
            _ => Client::Socket(Conn::connect_unix(path, Proto::Resp)?),
        })
    }

    /// GET key `k`; `Ok(None)` if it came back right, else what was wrong.
    fn get_check(&mut self, k: u64, len: usize) -> Result<Option<String>, String> {
        let kb = key(k);
        let wrong = |v: Option<&[u8]>| match v {
            Some(v) if value_ok(k, v, len) => None,
            Some(v) => Some(format!(
                "GET key {k}: wrong value ({} bytes, expected {len})",
                v.len()
            )),
            None => Some(format!("GET key {k}: missing")),
        };
        match self {
            Client::Direct(s) => {
                let v = s.get(&kb).map_err(|e| format!("get: {e}"))?;
                Ok(wrong(v.as_deref()))
            }
            Client::Socket(c) => c.call(Expect::Get, &[b"GET", &kb], |r| match r {
                Reply::Value(v) => wrong(Some(v)),
                Reply::Nil => wrong(None),
                other => Some(format!("GET key {k}: {}", other.describe())),
            }),
        }
    }

    /// SET key `k` to `val`; `Ok(None)` if stored.
    fn set(&mut self, k: u64, val: &[u8]) -> Result<Option<String>, String> {
        let kb = key(k);
        match self {
            Client::Direct(s) => Ok(s.put(&kb, val).err().map(|e| format!("put key {k}: {e}"))),
            Client::Socket(c) => c.call(Expect::Line, &[b"SET", &kb, val], |r| {
                (!r.is_stored()).then(|| format!("SET key {k}: {}", r.describe()))
            }),
        }
    }

    fn close(self) -> Result<(), String> {
        match self {
            Client::Direct(s) => s.close().map_err(|e| format!("close: {e}")),
            Client::Socket(_) => Ok(()),
        }
    }
}

/// `memlab shared --child SPEC`: one client process.
fn child_main(spec: &str) -> Result<i32, String> {
    let main_ns = mono_ns();
    let spec: ChildSpec = serde_json::from_str(spec).map_err(|e| format!("child spec: {e}"))?;
    let mut so = std::io::stdout().lock();
    let out = match spec.role {
        Role::Attach { key: k, value_size } => {
            let mut c = Client::open(spec.system, &spec.path, true)?;
            let wrong = c.get_check(k, value_size)?;
            let answer_ns = mono_ns();
            let out = ChildOut {
                answer_ns,
                main_ns,
                bad: u64::from(wrong.is_some()),
                first_bad: wrong,
                ..ChildOut::default()
            };
            c.close()?;
            out
        }
        Role::Hold => {
            let _c = Client::open(spec.system, &spec.path, true)?;
            writeln!(so, "ready")
                .and_then(|_| so.flush())
                .map_err(|e| e.to_string())?;
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Role::Load { .. } => {
            let mut c = Client::open(spec.system, &spec.path, false)?;
            writeln!(so, "ready")
                .and_then(|_| so.flush())
                .map_err(|e| e.to_string())?;
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| format!("reading the start time: {e}"))?;
            let t0: u64 = line
                .trim()
                .strip_prefix("go ")
                .and_then(|x| x.parse().ok())
                .ok_or_else(|| format!("bad start line {line:?}"))?;
            let out = closed_loop(&mut c, &spec.role, t0)?;
            c.close()?;
            out
        }
    };
    let line = serde_json::to_string(&out).map_err(|e| e.to_string())?;
    writeln!(so, "{line}")
        .and_then(|_| so.flush())
        .map_err(|e| e.to_string())?;
    Ok(0)
}

/// One request at a time from CLOCK_MONOTONIC `t0` for the warm-up and
/// the measured window.
fn closed_loop(c: &mut Client, role: &Role, t0: u64) -> Result<ChildOut, String> {
    let Role::Load {
        keys,
        value_size,
        set_permille,
        warm_ns,
        measure_ns,
        seed,
    } = *role
    else {
        return Err("not a load role".into());
    };
    let start = instant_at(t0);
    let warm_end = instant_at(t0 + warm_ns);
    let end = instant_at(t0 + warm_ns + measure_ns);
    let mut hist = load::latency_hist()?;
    let mut rng = Rng::new(seed);
    let mut val = vec![0u8; value_size];
    let mut out = ChildOut::default();
    std::thread::sleep(start.saturating_duration_since(Instant::now()));
    let mut measuring = false;
    let mut window_start = Instant::now();
    let mut i: u64 = 0;
    loop {
        if i.is_multiple_of(CHECK_EVERY_OPS) {
            let now = Instant::now();
            if !measuring && now >= warm_end {
                measuring = true;
                window_start = now;
                out.ops = 0;
                out.gets = 0;
                out.sets = 0;
            } else if measuring && now >= end {
                out.secs = now.duration_since(window_start).as_secs_f64();
                break;
            }
        }
        let k = rng.range(0, keys);
        let is_set = rng.range(0, 1000) < set_permille as u64;
        let t = (measuring && i.is_multiple_of(SAMPLE_EVERY_OPS)).then(Instant::now);
        let wrong = if is_set {
            fill_value(k, &mut val);
            out.sets += 1;
            c.set(k, &val)?
        } else {
            out.gets += 1;
            c.get_check(k, value_size)?
        };
        if let Some(t) = t {
            let _ = hist.record(t.elapsed().as_nanos() as u64);
        }
        if let Some(w) = wrong {
            out.bad += 1;
            out.first_bad.get_or_insert(w);
        }
        out.ops += 1;
        i += 1;
    }
    out.hist = hist
        .iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect();
    Ok(out)
}

/// A client process as the parent sees it.
struct ClientProc {
    proc: Proc,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl ClientProc {
    fn spawn(spec: &ChildSpec) -> Result<ClientProc, String> {
        // /proc/self/exe, not current_exe(): it still runs this binary if
        // a build replaced the file since memlab started.
        let mut cmd = Command::new("/proc/self/exe");
        cmd.args(["shared", "--child"])
            .arg(serde_json::to_string(spec).map_err(|e| e.to_string())?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut proc = Proc::spawn(cmd, "client process", None)?;
        let stdin = proc.child.stdin.take();
        let stdout = BufReader::new(proc.child.stdout.take().ok_or("no child stdout")?);
        Ok(ClientProc {
            proc,
            stdin,
            stdout,
        })
    }

    fn read_line(&mut self) -> Result<String, String> {
        let mut l = String::new();
        match self.stdout.read_line(&mut l) {
            Ok(0) => {
                let why = self
                    .proc
                    .child
                    .wait()
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                Err(format!("client process ended without output ({why})"))
            }
            Ok(_) => Ok(l),
            Err(e) => Err(format!("reading a client process: {e}")),
        }
    }

    fn result(&mut self) -> Result<ChildOut, String> {
        let l = self.read_line()?;
        let out = serde_json::from_str(&l).map_err(|e| format!("client output {l:?}: {e}"))?;
        let st = self.proc.child.wait().map_err(|e| e.to_string())?;
        sut::unregister_child(self.proc.child.id());
        if !st.success() {
            return Err(format!("client process {st}"));
        }
        Ok(out)
    }
}

/// What a cell measured, over all its processes.
struct CellOut {
    ops_per_sec: f64,
    p50_ns: f64,
    p99_ns: f64,
    gets: u64,
    sets: u64,
}

/// Run one cell: `cell.processes` client processes on `path`.
fn run_cell(o: &Opts, sys: System, path: &Path, cell: &Cell, seed: u64) -> Result<CellOut, String> {
    let mut kids = Vec::new();
    for p in 0..cell.processes {
        let spec = ChildSpec {
            system: sys,
            path: path.to_path_buf(),
            role: Role::Load {
                keys: o.keys,
                value_size: o.value_size,
                set_permille: cell.set_pct * 10,
                warm_ns: o.warmup.as_nanos() as u64,
                measure_ns: o.measure.as_nanos() as u64,
                seed: mix64(seed ^ (p as u64) << 32),
            },
        };
        kids.push(ClientProc::spawn(&spec)?);
    }
    for k in &mut kids {
        let l = k.read_line()?;
        if l.trim() != "ready" {
            return Err(format!("client process said {l:?}, not ready"));
        }
    }
    let t0 = mono_ns() + START_SLACK.as_nanos() as u64;
    for k in &mut kids {
        let mut w = k.stdin.take().ok_or("no child stdin")?;
        writeln!(w, "go {t0}").map_err(|e| format!("starting a client: {e}"))?;
    }
    let mut hist: Histogram<u64> = load::latency_hist()?;
    let (mut ops_per_sec, mut gets, mut sets) = (0.0, 0, 0);
    let mut bad = Vec::new();
    for k in &mut kids {
        let r = k.result()?;
        if r.secs <= 0.0 {
            return Err("a client measured an empty window".into());
        }
        ops_per_sec += r.ops as f64 / r.secs;
        gets += r.gets;
        sets += r.sets;
        for (v, c) in r.hist {
            let _ = hist.record_n(v, c);
        }
        if r.bad > 0 {
            bad.push(format!(
                "{} bad replies, first: {}",
                r.bad,
                r.first_bad.unwrap_or_default()
            ));
        }
    }
    if !bad.is_empty() {
        return Err(format!("check failed: {}", bad.join("; ")));
    }
    let q = |x: f64| {
        if hist.is_empty() {
            f64::NAN
        } else {
            hist.value_at_quantile(x) as f64
        }
    };
    Ok(CellOut {
        ops_per_sec,
        p50_ns: q(0.5),
        p99_ns: q(0.99),
        gets,
        sets,
    })
}

// ---------------------------------------------------------------------------
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
            System::Nibble => o.bins.nibble.clone().map(|_| ()),
            System::NibbleDataDir => nibble_has_data_dir(&o.bins),
            System::Redis => o.bins.redis.clone().map(|_| ()),
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
    let pb = util::progress_bar(total, "memlab shared");
    pb.enable_steady_tick(Duration::from_millis(250));
    rep.set_progress(pb.clone());
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
    pb.finish_and_clear();
    rep.set_progress(ProgressBar::hidden());
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
fn nibble_has_data_dir(bins: &Bins) -> Result<(), String> {
    let bin = bins.nibble.clone()?;
    let out = Command::new(&bin)
        .arg("--help")
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    if String::from_utf8_lossy(&out.stdout).contains("--data-dir") {
        Ok(())
    } else {
        Err(format!(
            "{} has no --data-dir option (not landed in this build)",
            bin.display()
        ))
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
        (keys.div_ceil(INDEX_ENTRIES_PER_BUCKET * 2 / 5)).next_power_of_two() * INDEX_BUCKET_BYTES;
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
) -> Result<(), String> {
    pb.set_message(format!("{} run {}: preload", sys.name(), r + 1));
    let cap = ops_capacity(o);
    // Keep the store (direct) or the server alive for the whole run.
    let mut store = None;
    let mut server = None;
    let path = match sys {
        System::Direct => {
            let d = o.dir.join(format!("ops-store-{r}"));
            let s = SharedStore::create(&d, cap, &store_options(cap, o.keys))
                .map_err(|e| format!("create {}: {e}", d.display()))?;
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
        s.close().map_err(|e| format!("close: {e}"))?;
        SharedStore::remove(&path).map_err(|e| format!("remove: {e}"))?;
    }
    if let Some((mut p, store_dir)) = server {
        p.stop()?;
        if let Some(d) = store_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Restart

/// Keys of the restart data set.
fn restart_keys(o: &Opts) -> u64 {
    (o.restart_bytes / (KEY_LEN + o.restart_value_size) as u64).max(1)
}

/// Capacity for the restart data set (live data at about 70 %).
fn restart_capacity(o: &Opts) -> u64 {
    let live = restart_keys(o) * object_bytes(o.restart_value_size);
    (live / 7 * 10).max(64 << 20)
}

/// The key a restart probe asks for.
fn probe_key(o: &Opts, r: usize) -> u64 {
    mix64(0xabcd ^ r as u64) % restart_keys(o)
}

fn restart_direct(o: &Opts, r: usize, out: &mut Vec<RestartSample>) -> Result<(), String> {
    let keys = restart_keys(o);
    let d = o.dir.join(format!("restart-store-{r}"));
    let cap = restart_capacity(o);
    let s = SharedStore::create(&d, cap, &store_options(cap, keys))
        .map_err(|e| format!("create {}: {e}", d.display()))?;
    load_direct(&s, keys, o.restart_value_size, 2)?;
    s.close().map_err(|e| format!("close: {e}"))?;
    let attach = |out: &mut Vec<RestartSample>, name: &str| -> Result<(), String> {
        let spec = ChildSpec {
            system: System::Direct,
            path: d.clone(),
            role: Role::Attach {
                key: probe_key(o, r),
                value_size: o.restart_value_size,
            },
        };
        let t0 = mono_ns();
        let mut c = ClientProc::spawn(&spec)?;
        let res = c.result()?;
        if res.bad > 0 {
            return Err(format!(
                "check failed: {}",
                res.first_bad.unwrap_or_default()
            ));
        }
        out.push(RestartSample {
            repeat: r,
            system: name.into(),
            ms: res.answer_ns.saturating_sub(t0) as f64 / 1e6,
            keys,
            loading_replies: 0,
        });
        Ok(())
    };
    attach(out, "direct-attach")?;
    // The last process attached dies without closing: the next attach
    // must recover.
    let mut h = ClientProc::spawn(&ChildSpec {
        system: System::Direct,
        path: d.clone(),
        role: Role::Hold,
    })?;
    let l = h.read_line()?;
    if l.trim() != "ready" {
        return Err(format!("holder said {l:?}"));
    }
    h.proc.kill();
    attach(out, "direct-attach-after-kill")?;
    SharedStore::remove(&d).map_err(|e| format!("remove: {e}"))?;
    Ok(())
}

/// Spawn `spec`'s server and GET `k` every millisecond until the right
/// value comes back: (ms from spawn, -LOADING / error replies before).
fn time_to_first_get(
    spec: &ServerSpec,
    k: u64,
    value_size: usize,
) -> Result<(Proc, f64, u64), String> {
    let t0 = Instant::now();
    let mut p = spec.spawn()?;
    let mut loading = 0u64;
    loop {
        if let Some(e) = p.exited() {
            return Err(e);
        }
        if let Ok(mut c) = Conn::connect_unix(&spec.sock, Proto::Resp) {
            loop {
                let kb = key(k);
                let r = c.call(Expect::Get, &[b"GET", &kb], |r| match r {
                    Reply::Value(v) if value_ok(k, v, value_size) => Ok(true),
                    Reply::Error(e) if e.starts_with(b"LOADING") => Ok(false),
                    other => Err(other.describe()),
                })?;
                match r {
                    Ok(true) => {
                        let ms = t0.elapsed().as_secs_f64() * 1e3;
                        return Ok((p, ms, loading));
                    }
                    Ok(false) => loading += 1,
                    Err(e) => {
                        return Err(format!(
                            "check failed: {} restarted answered GET key {k} with {e}",
                            spec.sys.name()
                        ))
                    }
                }
                if t0.elapsed() > START_TIMEOUT {
                    break;
                }
                std::thread::sleep(PROBE_INTERVAL);
            }
        }
        if t0.elapsed() > START_TIMEOUT {
            return Err(format!(
                "{} did not serve within {} s: {}",
                spec.sys.name(),
                START_TIMEOUT.as_secs(),
                p.log_tail()
            ));
        }
        std::thread::sleep(PROBE_INTERVAL);
    }
}

fn restart_redis(o: &Opts, r: usize, out: &mut Vec<RestartSample>) -> Result<(), String> {
    // The RDB goes to a disk directory: just written, it is in the page
    // cache (so the load reads memory), but the kernel may drop it under
    // memory pressure, where a tmpfs copy beside Redis's own heap would
    // double the footprint.
    let tag = format!("restart-{}-{r}", std::process::id());
    let spec = ServerSpec::new(o, System::Redis, &tag, 0, Some(&o.rdb_dir))?;
    let rdb = o.rdb_dir.join(format!("{tag}.rdb"));
    let res = restart_redis_at(o, r, &spec, out);
    let _ = std::fs::remove_file(&rdb);
    res
}

fn restart_redis_at(
    o: &Opts,
    r: usize,
    spec: &ServerSpec,
    out: &mut Vec<RestartSample>,
) -> Result<(), String> {
    let keys = restart_keys(o);
    let (mut p, mut c) = spec.start()?;
    load_socket(&mut c, 0, keys, o.restart_value_size)?;
    bgsave(&mut c)?;
    drop(c);
    p.stop()?;
    drop(p);
    let (mut p, ms, loading) = time_to_first_get(spec, probe_key(o, r), o.restart_value_size)?;
    out.push(RestartSample {
        repeat: r,
        system: "redis-rdb".into(),
        ms,
        keys,
        loading_replies: loading,
    });
    p.stop()?;
    Ok(())
}

/// BGSAVE and wait for it to finish successfully.
fn bgsave(c: &mut Conn) -> Result<(), String> {
    let ok = c.call(
        Expect::Line,
        &[b"BGSAVE"],
        |r| matches!(r, Reply::Status(s) if s.starts_with(b"Background saving")),
    )?;
    if !ok {
        return Err("BGSAVE refused".into());
    }
    let t0 = Instant::now();
    loop {
        let info = c.call(Expect::Line, &[b"INFO", b"persistence"], |r| match r {
            Reply::Value(t) => String::from_utf8_lossy(t).into_owned(),
            _ => String::new(),
        })?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        };
        if field("rdb_bgsave_in_progress").as_deref() == Some("0") {
            return match field("rdb_last_bgsave_status").as_deref() {
                Some("ok") => Ok(()),
                s => Err(format!("BGSAVE failed: rdb_last_bgsave_status {s:?}")),
            };
        }
        if t0.elapsed() > START_TIMEOUT {
            return Err("BGSAVE did not finish".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn restart_nibble(o: &Opts, r: usize, out: &mut Vec<RestartSample>) -> Result<(), String> {
    let keys = restart_keys(o);
    let d = o.dir.join(format!("nibble-data-{r}"));
    let spec = ServerSpec::new(
        o,
        System::Nibble,
        &format!("restart-{r}"),
        restart_capacity(o),
        Some(&d),
    )?;
    let (mut p, mut c) = spec.start()?;
    load_socket(&mut c, 0, keys, o.restart_value_size)?;
    drop(c);
    p.stop()?;
    drop(p);
    let (mut p, ms, loading) = time_to_first_get(&spec, probe_key(o, r), o.restart_value_size)?;
    out.push(RestartSample {
        repeat: r,
        system: "nibble-data-dir".into(),
        ms,
        keys,
        loading_replies: loading,
    });
    p.kill();
    drop(p);
    let (mut p, ms, loading) = time_to_first_get(&spec, probe_key(o, r + 1), o.restart_value_size)?;
    out.push(RestartSample {
        repeat: r,
        system: "nibble-data-dir-after-kill".into(),
        ms,
        keys,
        loading_replies: loading,
    });
    p.stop()?;
    drop(p);
    let _ = std::fs::remove_dir_all(&d);
    Ok(())
}

// ---------------------------------------------------------------------------
// Rows

fn notes(o: &Opts, rep: &mut Reporter, data_dir: bool) {
    let common = format!(
        "{} keys (\"key:\"+12 digits) of {} B pseudo-random values, preloaded; each client process sends one \
         request at a time (uniform keys), {} ms warm-up + {} ms measured, all processes in the same window; \
         direct = the nibblejmp store attached by each client process (compaction in the parent); nibble, \
         nibble-data-dir and redis = RESP over a Unix socket (nibble: the server with its own process-private \
         engine; nibble-data-dir: the server on a nibblejmp store, `--data-dir`, the direct rows' engine; \
         redis-server --save '' --appendonly no). threads = client processes. ops_per_sec: sum over processes, median of {} runs \
         [min, max]; p50/p99_ns: every {}th request, all processes, median over runs. Every GET checks the \
         whole value.",
        o.keys,
        o.value_size,
        o.warmup.as_millis(),
        o.measure.as_millis(),
        o.repeat,
        SAMPLE_EVERY_OPS
    );
    let cells = !o.cells.is_empty();
    if o.cells.iter().any(|c| c.in_ops) {
        rep.note(BENCH, &format!("Fig. 10a/b: 100% GET, 100% SET. {common}"));
    }
    if o.cells.iter().any(|c| c.in_mix) {
        rep.note(MIX, &format!("Fig. 10c: rising SET share. {common}"));
    }
    if cells {
        rep.note(
        RATIO,
        &format!(
            "Throughput of direct over the server for the same cell, per run, median [min, max]; issue 8 \
             expects direct >= {GOAL_DIRECT_OVER_REDIS}x redis for GET and SET with 1 client process."
        ),
    );
    }
    if o.workloads.contains(&Workload::Restart) {
        rep.note(
        RESTART,
        &format!(
            "{} MiB of data ({} keys of {} B values); ms from spawn to the first correct GET answer (the probe \
             asks every {} ms; direct: the client process's own time of the answer). direct-attach: a fresh \
             process attaches the closed store; -after-kill: the last attached process was SIGKILLed, so \
             attach recovers. redis-rdb: redis-server loading its RDB (BGSAVE of the same data, on disk in {}, \
             just written so in the page cache). \
             nibble-data-dir{}: the server restarted on its --data-dir store after SIGTERM, -after-kill after \
             SIGKILL. Median of {} runs [min, max].",
            o.restart_bytes >> 20,
            restart_keys(o),
            o.restart_value_size,
            PROBE_INTERVAL.as_millis(),
            o.rdb_dir.display(),
            if data_dir { "" } else { " (not available)" },
            o.repeat
        ),
    );
    }
    if o.quick {
        rep.note(
            BENCH,
            "--quick: short cells, a small restart store; figures are rough.",
        );
    }
}

fn emit(
    o: &Opts,
    systems: &[System],
    samples: &[Sample],
    restarts: &[RestartSample],
    rep: &mut Reporter,
) -> std::io::Result<()> {
    for table in [BENCH, MIX] {
        for cell in &o.cells {
            if (table == BENCH && !cell.in_ops) || (table == MIX && !cell.in_mix) {
                continue;
            }
            for &sys in systems {
                let got: Vec<&Sample> = samples
                    .iter()
                    .filter(|s| s.sys == sys && s.cell == *cell)
                    .collect();
                if got.is_empty() {
                    continue;
                }
                let f = |g: &dyn Fn(&CellOut) -> f64| {
                    Spread::of(&got.iter().map(|s| g(&s.out)).collect::<Vec<_>>())
                };
                let row = Row::new(table, sys.name(), cell.processes)
                    .set("processes", cell.processes)
                    .set("op", cell.op())
                    .set("set_pct", cell.set_pct)
                    .set("value_size", o.value_size)
                    .set("keys", o.keys)
                    .set_spread("ops_per_sec", &f(&|c| c.ops_per_sec), 0)
                    .set_f("p50_ns", f(&|c| c.p50_ns).median, 0)
                    .set_f("p99_ns", f(&|c| c.p99_ns).median, 0)
                    .set_f("gets", f(&|c| c.gets as f64).median, 0)
                    .set_f("sets", f(&|c| c.sets as f64).median, 0)
                    .set("runs", got.len());
                rep.emit(row)?;
            }
        }
    }
    // Ratios: direct over each server, per repeat.
    for cell in &o.cells {
        for peer in [System::Redis, System::Nibble, System::NibbleDataDir] {
            if !systems.contains(&System::Direct) || !systems.contains(&peer) {
                continue;
            }
            let ratios: Vec<f64> = (0..o.repeat)
                .filter_map(|r| {
                    let get = |s: System| {
                        samples
                            .iter()
                            .find(|x| x.repeat == r && x.sys == s && x.cell == *cell)
                            .map(|x| x.out.ops_per_sec)
                    };
                    Some(get(System::Direct)? / get(peer)?)
                })
                .collect();
            if ratios.is_empty() {
                continue;
            }
            let sp = Spread::of(&ratios);
            let mut row = Row::new(RATIO, &format!("direct/{}", peer.name()), cell.processes)
                .set("processes", cell.processes)
                .set("op", cell.op())
                .set_spread("ratio", &sp, 2);
            if peer == System::Redis && cell.processes == 1 && matches!(cell.set_pct, 0 | 100) {
                row = row
                    .set("goal", format!(">= {GOAL_DIRECT_OVER_REDIS}x"))
                    .set("goal_met", sp.median >= GOAL_DIRECT_OVER_REDIS);
            }
            rep.emit(row)?;
        }
    }
    // Restart rows.
    let mut names: Vec<&str> = Vec::new();
    for s in restarts {
        if !names.contains(&s.system.as_str()) {
            names.push(&s.system);
        }
    }
    let med = |name: &str| -> Option<Spread> {
        let v: Vec<f64> = restarts
            .iter()
            .filter(|s| s.system == name)
            .map(|s| s.ms)
            .collect();
        (!v.is_empty()).then(|| Spread::of(&v))
    };
    for name in &names {
        let Some(sp) = med(name) else { continue };
        let of: Vec<&RestartSample> = restarts.iter().filter(|s| s.system == *name).collect();
        let mut row = Row::new(RESTART, name, 1)
            .set("data_bytes", o.restart_bytes)
            .set("keys", of[0].keys)
            .set("value_size", o.restart_value_size)
            .set_spread("first_reply_ms", &sp, 2)
            .set(
                "loading_replies",
                of.iter().map(|s| s.loading_replies).max().unwrap_or(0),
            )
            .set("runs", of.len());
        if name.starts_with("nibble-data-dir") {
            row = row
                .set("goal", format!("<= {GOAL_RESTART_MS} ms"))
                .set("goal_met", sp.median <= GOAL_RESTART_MS);
        }
        rep.emit(row)?;
    }
    // Restart ratios: redis's load over each other restart, per repeat.
    for name in &names {
        if *name == "redis-rdb" {
            continue;
        }
        let ratios: Vec<f64> = (0..o.repeat)
            .filter_map(|r| {
                let get = |n: &str| {
                    restarts
                        .iter()
                        .find(|s| s.repeat == r && s.system == n)
                        .map(|s| s.ms)
                };
                Some(get("redis-rdb")? / get(name)?)
            })
            .collect();
        if ratios.is_empty() {
            continue;
        }
        rep.emit(
            Row::new(RESTART_RATIO, &format!("redis-rdb/{name}"), 1)
                .set("data_bytes", o.restart_bytes)
                .set_spread("ratio", &Spread::of(&ratios), 1),
        )?;
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
