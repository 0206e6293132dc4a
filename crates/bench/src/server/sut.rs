//! The systems under test of `memlab server`: finding their binaries,
//! starting each on a free loopback port with a memory limit, waiting until
//! it answers, reading its RSS, and stopping it, always.
//!
//! Every server is a child process owned by a [`ServerProc`], whose `Drop`
//! stops it (SIGTERM, then SIGKILL after a grace period), so a failed run
//! or a panic that unwinds leaves nothing behind. On SIGINT (Ctrl-C),
//! SIGTERM and SIGHUP a handler kills and reaps the running servers before
//! memlab dies of the signal. And every child is started with
//! `PR_SET_PDEATHSIG = SIGKILL`, so if memlab dies any other way (SIGKILL,
//! an abort, the watchdog's exit) the kernel kills the servers too.
//!
//! `redis-benchmark` is run here as well ([`redis_benchmark`]): the issue
//! asks for its numbers against nibble and redis-server in the same run.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use super::load::Conn;
use super::proto::{Expect, Proto, Reply};
use crate::error::{BenchError, Context, Result};

/// The Debian packages that provide the peers.
pub const APT_HINT: &str = "apt-get install redis-server redis-tools memcached";

/// Longest wait for a server to accept connections and answer.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Grace between SIGTERM and SIGKILL when stopping a server.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// A system `memlab server` can start (or reach).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Sys {
    /// The nibble server (Nibble mode)
    Nibble,
    /// The nibble server in Nibble-2 mode
    Nibble2,
    /// redis-server (Debian package)
    Redis,
    /// memcached -t 2 (Debian package)
    Memcached,
}

impl Sys {
    pub const ALL: [Sys; 4] = [Sys::Nibble, Sys::Nibble2, Sys::Redis, Sys::Memcached];

    pub fn name(self) -> &'static str {
        match self {
            Sys::Nibble => "nibble",
            Sys::Nibble2 => "nibble2",
            Sys::Redis => "redis",
            Sys::Memcached => "memcached",
        }
    }

    /// The protocol the load generator uses: nibble speaks both (the
    /// `--protocol` option picks), the peers one each.
    pub fn proto(self, nibble_proto: Proto) -> Proto {
        match self {
            Sys::Nibble | Sys::Nibble2 => nibble_proto,
            Sys::Redis => Proto::Resp,
            Sys::Memcached => Proto::Memcached,
        }
    }
}

/// Why a binary is not at hand: a note when its rows are skipped, the
/// error of a run that needs it.
#[derive(Clone, Debug)]
pub struct Missing(pub String);

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Missing {}

impl From<Missing> for BenchError {
    fn from(m: Missing) -> BenchError {
        BenchError::Run(m.0)
    }
}

/// Where the binaries are and what extra flags nibble gets.
#[derive(Clone, Debug)]
pub struct Bins {
    pub nibble: Result<PathBuf, Missing>,
    pub redis: Result<PathBuf, Missing>,
    pub memcached: Result<PathBuf, Missing>,
    pub redis_benchmark: Result<PathBuf, Missing>,
    pub nibble_args: Vec<String>,
}

impl Bins {
    /// `nibble_bin`: the `--nibble-bin` option; otherwise `nibble` next to
    /// the running executable (the same target directory).
    pub fn find(nibble_bin: Option<&Path>, nibble_args: Vec<String>) -> Bins {
        let nibble = match nibble_bin {
            Some(p) if p.is_file() => Ok(p.to_path_buf()),
            Some(p) => Err(Missing(format!(
                "--nibble-bin {}: no such file",
                p.display()
            ))),
            None => crate::util::sibling_binary(
                "nibble",
                "cargo build --release -p server`, or pass `--nibble-bin PATH",
            )
            .map_err(|e| Missing(e.to_string())),
        };
        let pkg = |bin: &str, pkg: &str| {
            find_in_path(bin).ok_or_else(|| {
                Missing(format!(
                    "{bin} not found in PATH (Debian: apt-get install {pkg})"
                ))
            })
        };
        Bins {
            nibble,
            redis: pkg("redis-server", "redis-server"),
            memcached: pkg("memcached", "memcached"),
            redis_benchmark: pkg("redis-benchmark", "redis-tools"),
            nibble_args,
        }
    }

    pub fn for_sys(&self, s: Sys) -> &Result<PathBuf, Missing> {
        match s {
            Sys::Nibble | Sys::Nibble2 => &self.nibble,
            Sys::Redis => &self.redis,
            Sys::Memcached => &self.memcached,
        }
    }
}

/// Installs the peers from Debian's packages when one is missing, memlab
/// runs as root and `apt-get` exists (the issue's "installed by the bench
/// script when missing"); `MEMLAB_NO_INSTALL=1` turns it off. Failure is
/// not an error: the missing peer is skipped with a note, as before.
pub fn install_missing_peers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let missing: Vec<&str> = [
            ("redis-server", "redis-server"),
            ("redis-benchmark", "redis-tools"),
            ("memcached", "memcached"),
        ]
        .into_iter()
        .filter(|(bin, _)| find_in_path(bin).is_none())
        .map(|(_, pkg)| pkg)
        .collect();
        if missing.is_empty()
            || std::env::var_os("MEMLAB_NO_INSTALL").is_some()
            || !running_as_root()
            || find_in_path("apt-get").is_none()
        {
            return;
        }
        eprintln!("memlab: installing {} (apt-get)", missing.join(" "));
        let quiet = |c: &mut Command| {
            c.env("DEBIAN_FRONTEND", "noninteractive")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let ok = quiet(Command::new("apt-get").args(["update", "-qq"]))
            && quiet(
                Command::new("apt-get")
                    .args(["install", "-y", "-qq"])
                    .args(&missing),
            );
        if !ok {
            eprintln!("memlab: apt-get could not install {}", missing.join(" "));
        }
    });
}

/// `name` in a directory of `$PATH`, or in /usr/bin, /usr/local/bin and /usr/sbin.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/local/bin", "/usr/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether this process runs as root (the owner of `/proc/self`).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A free TCP port on 127.0.0.1 (the kernel's pick; released again at
/// once, so another process could take it first: a start that fails is
/// retried on a new port).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("no free port")?;
    l.local_addr().map(|a| a.port()).context("no free port")
}

/// CPU time of process `pid` (user + system, every thread), seconds, from
/// `/proc/PID/stat` (clock-tick resolution, 10 ms at the usual 100 Hz).
pub fn proc_cpu_secs(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized command name: state is field 3, utime
    // field 14 and stime field 15 (proc(5)).
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks as f64 / hz as f64)
}

/// Samples a process's CPU time at the start and the end of a measured
/// interval, from a thread that sleeps in between (so the load generator's
/// own timing is untouched).
pub struct CpuWindow(std::thread::JoinHandle<Option<f64>>);

impl CpuWindow {
    /// Measure `pid` over `[start, start + len]`.
    pub fn spawn(pid: u32, start: Instant, len: Duration) -> CpuWindow {
        CpuWindow(std::thread::spawn(move || {
            std::thread::sleep(start.saturating_duration_since(Instant::now()));
            let a = proc_cpu_secs(pid)?;
            std::thread::sleep((start + len).saturating_duration_since(Instant::now()));
            let b = proc_cpu_secs(pid)?;
            Some(b - a)
        }))
    }

    /// The CPU seconds spent in the interval, if the process could be read.
    pub fn join(self) -> Option<f64> {
        self.0.join().ok().flatten()
    }
}

/// Resident set size (`VmRSS`) and peak (`VmHWM`) of process `pid`, bytes.
pub fn proc_rss(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = s.lines().find(|l| l.starts_with(name))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// A running server: stopped and reaped on drop.
pub struct ServerProc {
    pub sys: Sys,
    child: Child,
    /// Where the load generator connects (the memcached port of nibble
    /// under `--protocol memcached`).
    pub addr: SocketAddr,
    pub proto: Proto,
    /// The RESP port, for redis-benchmark (none for memcached).
    pub resp_port: Option<u16>,
    log: PathBuf,
}

static LOG_SEQ: AtomicU64 = AtomicU64::new(0);

/// Pids of the running servers, for the signal handler (a fixed array of
/// atomics: the handler may neither lock nor allocate).
static CHILDREN: [AtomicI32; 16] = [const { AtomicI32::new(0) }; 16];

/// On SIGINT, SIGTERM or SIGHUP: kill and reap every running server, then
/// die of the signal as if there were no handler.
extern "C" fn on_signal(sig: libc::c_int) {
    for slot in &CHILDREN {
        let pid = slot.swap(0, Ordering::SeqCst);
        if pid > 0 {
            // SAFETY: kill and waitpid are async-signal-safe; `pid` is a
            // child of this process that Drop has not reaped (Drop clears
            // the slot first).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
    // SAFETY: async-signal-safe calls restoring the default action and
    // re-raising the signal, so the process ends with the usual status.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

pub(crate) fn register_child(pid: u32) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: `on_signal` only uses async-signal-safe functions and
            // lock-free atomics.
            unsafe {
                libc::signal(sig, on_signal as *const () as libc::sighandler_t);
            }
        }
    });
    for slot in &CHILDREN {
        if slot
            .compare_exchange(0, pid as i32, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
    // More than 16 at once: these rely on PR_SET_PDEATHSIG alone.
}

pub(crate) fn unregister_child(pid: u32) {
    for slot in &CHILDREN {
        let _ = slot.compare_exchange(pid as i32, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

impl ServerProc {
    /// Start `sys` with `memory` bytes as its limit, speaking `nibble_proto`
    /// if it is nibble. Tries three ports before giving up.
    pub fn start(sys: Sys, bins: &Bins, memory: u64, nibble_proto: Proto) -> Result<ServerProc> {
        let bin = bins.for_sys(sys).clone()?;
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once(sys, &bin, bins, memory, nibble_proto) {
                Ok(p) => return Ok(p),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("three tries"))
    }

    fn start_once(
        sys: Sys,
        bin: &Path,
        bins: &Bins,
        memory: u64,
        nibble_proto: Proto,
    ) -> Result<ServerProc> {
        let port = free_port()?;
        let proto = sys.proto(nibble_proto);
        let mut cmd = Command::new(bin);
        let mut conn_port = port;
        let mut resp_port = Some(port);
        match sys {
            Sys::Nibble | Sys::Nibble2 => {
                cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                    .args(["--maxmemory", &memory.to_string()])
                    .args(["--mode", sys.name()]);
                if proto == Proto::Memcached {
                    let mc = loop {
                        let p = free_port()?;
                        if p != port {
                            break p;
                        }
                    };
                    cmd.args(["--memcached-port", &mc.to_string()]);
                    conn_port = mc;
                }
                cmd.args(&bins.nibble_args);
            }
            Sys::Redis => {
                cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .args(["--maxmemory", &memory.to_string()])
                    .args(["--maxmemory-policy", "noeviction"])
                    .args(["--dir", &std::env::temp_dir().to_string_lossy()]);
            }
            Sys::Memcached => {
                let mib = memory.div_ceil(1 << 20).max(1);
                cmd.args(["-t", "2", "-p", &port.to_string(), "-U", "0"])
                    .args(["-l", "127.0.0.1", "-m", &mib.to_string()]);
                if running_as_root() {
                    // memcached refuses to run as root without -u.
                    cmd.args(["-u", "root"]);
                }
                resp_port = None;
            }
        }
        let log = std::env::temp_dir().join(format!(
            "memlab-server-{}-{}-{}.log",
            sys.name(),
            std::process::id(),
            LOG_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let child = spawn_tied(&mut cmd, Some(&log), &bin.display().to_string())?;
        let mut p = ServerProc {
            sys,
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], conn_port)),
            proto,
            resp_port,
            log,
        };
        p.wait_ready()?;
        Ok(p)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// VmRSS and VmHWM of the server process.
    pub fn rss(&self) -> Option<(u64, u64)> {
        proc_rss(self.pid())
    }

    /// The server's log so far (last `n` bytes).
    pub fn log_tail(&self, n: usize) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        let mut i = s.len().saturating_sub(n);
        while !s.is_char_boundary(i) {
            i += 1;
        }
        s[i..].trim().to_string()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let t0 = Instant::now();
        let mut delay = Duration::from_millis(5);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "{} exited at startup ({status}): {}",
                    self.sys.name(),
                    self.log_tail(1500)
                )
                .into());
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                let mut c = Conn::connect(self.addr, self.proto)?;
                let ok = match self.proto {
                    Proto::Resp => c.call(Expect::Line, &[b"PING"], |r| {
                        matches!(r, Reply::Status(b"PONG"))
                    })?,
                    Proto::Memcached => c.call(
                        Expect::Line,
                        &[b"version"],
                        |r| matches!(r, Reply::Status(s) if s.starts_with(b"VERSION")),
                    )?,
                };
                if !ok {
                    return Err(format!(
                        "{} does not answer PING/version on {}",
                        self.sys.name(),
                        self.addr
                    )
                    .into());
                }
                return Ok(());
            }
            if t0.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "{} did not accept connections on {} within {} s: {}",
                    self.sys.name(),
                    self.addr,
                    START_TIMEOUT.as_secs(),
                    self.log_tail(1500)
                )
                .into());
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_millis(100));
        }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        terminate(&mut self.child, STOP_GRACE);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Spawns `cmd` tied to memlab: with `log`, its stdout and stderr go
/// there; it gets SIGKILL if memlab dies (`PR_SET_PDEATHSIG`), and it is
/// registered so memlab's signal handler kills it. `what` names it in
/// errors.
pub(crate) fn spawn_tied(cmd: &mut Command, log: Option<&Path>, what: &str) -> Result<Child> {
    if let Some(l) = log {
        let out = File::create(l).with_context(|| l.display())?;
        let err = out.try_clone().with_context(|| l.display())?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (prctl, getppid); it touches no
    // memory of the parent's other threads.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 || libc::getppid() != parent
            {
                return Err(std::io::Error::other("parent gone"));
            }
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("cannot run {what}"))?;
    register_child(child.id());
    Ok(child)
}

/// Stops a child spawned with [`spawn_tied`]: SIGTERM, up to `grace` for
/// it to exit, then SIGKILL; reaps and unregisters it. Its exit status if
/// it exited by itself within the grace (or had already).
pub(crate) fn terminate(child: &mut Child, grace: Duration) -> Option<std::process::ExitStatus> {
    let status = match child.try_wait() {
        Ok(None) => {
            // SAFETY: our own child, not yet reaped (try_wait said it
            // runs), so its pid cannot have been reused.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let t0 = Instant::now();
            let mut exited = None;
            while exited.is_none() && t0.elapsed() < grace {
                exited = child.try_wait().ok().flatten();
                if exited.is_none() {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            if exited.is_none() {
                let _ = child.kill();
            }
            exited
        }
        Ok(Some(st)) => Some(st),
        Err(_) => None,
    };
    let _ = child.wait();
    unregister_child(child.id());
    status
}

/// Server-side figures: keys stored and the memory the server says it
/// uses (Redis/nibble `used_memory`, memcached `bytes`).
pub fn server_counts(c: &mut Conn) -> (Option<u64>, Option<u64>) {
    match c.proto() {
        Proto::Resp => {
            let keys = c
                .call(Expect::Line, &[b"DBSIZE"], |r| match r {
                    Reply::Int(n) => u64::try_from(n).ok(),
                    _ => None,
                })
                .ok()
                .flatten();
            let used = c
                .call(Expect::Line, &[b"INFO", b"memory"], |r| match r {
                    Reply::Value(t) => super::proto::stat_field(t, "used_memory"),
                    _ => None,
                })
                .ok()
                .flatten();
            (keys, used)
        }
        Proto::Memcached => c
            .call(Expect::Stats, &[b"stats"], |r| match r {
                Reply::Stats(t) => (
                    super::proto::stat_field(t, "curr_items"),
                    super::proto::stat_field(t, "bytes"),
                ),
                _ => (None, None),
            })
            .unwrap_or((None, None)),
    }
}

/// One `redis-benchmark` result line.
#[derive(Clone, Debug, PartialEq)]
pub struct RbResult {
    /// `SET`, `GET`.
    pub test: String,
    pub rps: f64,
    /// The p50 redis-benchmark prints (Redis 7), ms.
    pub p50_ms: Option<f64>,
}

/// Parse `redis-benchmark -q` output: lines `NAME: 123.45 requests per
/// second[, p50=0.1 msec]`, with `\r`-separated progress in between.
pub fn parse_redis_benchmark(text: &str) -> Vec<RbResult> {
    let mut v = Vec::new();
    for line in text.split(['\r', '\n']) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let Some((num, _)) = rest.split_once("requests per second") else {
            continue;
        };
        let Ok(rps) = num.trim().parse::<f64>() else {
            continue;
        };
        let p50_ms = rest
            .split_once("p50=")
            .and_then(|(_, b)| b.split_whitespace().next())
            .and_then(|x| x.parse().ok());
        v.push(RbResult {
            test: name.trim().to_string(),
            rps,
            p50_ms,
        });
    }
    v
}

/// Key space of the bitmap tests (`-r`).
pub const RB_BIT_KEYS: u64 = 100_000;

/// The bitmap tests, run after SET and GET (SETBIT first, so the keys
/// GETBIT and BITCOUNT read exist): (test name, command line).
pub const RB_BIT_TESTS: &[(&str, &str)] = &[
    ("SETBIT", "SETBIT bit__rand_int__ 7 1"),
    ("GETBIT", "GETBIT bit__rand_int__ 7"),
    ("BITCOUNT", "BITCOUNT bit__rand_int__"),
];

/// Every redis-benchmark test, in the order run.
pub const RB_TESTS: &[&str] = &["SET", "GET", "SETBIT", "GETBIT", "BITCOUNT"];

/// `redis-benchmark -t set,get -P 16 -c 50 -n N -q` against 127.0.0.1:`port`,
/// then each of [`RB_BIT_TESTS`] with `-r` [`RB_BIT_KEYS`].
pub fn redis_benchmark(
    bin: &Path,
    port: u16,
    requests: u64,
    timeout: Duration,
) -> Result<Vec<RbResult>> {
    let mut all = redis_benchmark_args(bin, port, requests, timeout, &["-t", "set,get"])?;
    for (name, line) in RB_BIT_TESTS {
        let keys = RB_BIT_KEYS.to_string();
        let mut args = vec!["-r", keys.as_str()];
        args.extend(line.split(' '));
        let mut v = redis_benchmark_args(bin, port, requests, timeout, &args)?;
        for x in &mut v {
            x.test = name.to_string();
        }
        all.extend(v);
    }
    Ok(all)
}

/// `redis-benchmark ARGS -P 16 -c 50 -n N -q` against 127.0.0.1:`port`.
fn redis_benchmark_args(
    bin: &Path,
    port: u16,
    requests: u64,
    timeout: Duration,
    args: &[&str],
) -> Result<Vec<RbResult>> {
    let mut child = Command::new(bin)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-P", "16", "-c", "50"])
        .args(["-n", &requests.to_string(), "-q"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let r_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let r_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t0.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(BenchError::io("waiting for redis-benchmark", e)),
        }
    };
    let out = r_out.join().unwrap_or_default();
    let err = r_err.join().unwrap_or_default();
    let tail = |s: &str| -> String {
        let s = s.replace('\r', "\n");
        let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(4)..].join(" | ")
    };
    let Some(status) = status else {
        return Err(format!(
            "redis-benchmark did not finish within {} s",
            timeout.as_secs()
        )
        .into());
    };
    let res = parse_redis_benchmark(&out);
    if !status.success() || res.is_empty() {
        return Err(format!("redis-benchmark {status}: {} {}", tail(&out), tail(&err)).into());
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_benchmark_lines_parse() {
        let text = "SET: rps=0.0 (overall: nan) avg_msec=nan (overall: nan)\r\
                    SET: 552486.19 requests per second, p50=1.087 msec                    \n\
                    GET: rps=12.0 (overall: 3.0)\rGET: 649350.62 requests per second, p50=0.911 msec\n";
        let r = parse_redis_benchmark(text);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].test, "SET");
        assert_eq!(r[0].rps, 552486.19);
        assert_eq!(r[0].p50_ms, Some(1.087));
        assert_eq!(r[1].test, "GET");
        // Redis 6 prints no percentile.
        let r = parse_redis_benchmark("PING_INLINE: 1000.00 requests per second\n");
        assert_eq!(r[0].rps, 1000.0);
        assert_eq!(r[0].p50_ms, None);
    }

    #[test]
    fn missing_binaries_say_how_to_install() {
        let b = Bins::find(Some(Path::new("/nonexistent/nibble")), Vec::new());
        assert!(b.nibble.unwrap_err().0.contains("--nibble-bin"));
        assert!(free_port().unwrap() > 0);
        assert!(proc_rss(std::process::id()).unwrap().0 > 0);
    }
}
