//! Configuration: command-line flags, the config file, and the settings
//! that `CONFIG SET` may change while the server runs.
//!
//! The config file uses redis.conf's syntax, so a Redis user can read it:
//! one `name value` pair per line, `#` starts a comment, values may be
//! quoted, sizes take Redis's units (`64mb`, `1gb`, `512k`, also `4GiB`).
//! The names are the long flag names (`port`, `memcached-port`,
//! `maxmemory`, ...). Flags given on the command line override the file.
//!
//! Settings fall in two groups. Those fixed at start (addresses, threads,
//! capacity, mode) live in [`ServerConfig`]. Those `CONFIG SET` may change
//! live in [`Settings`] as atomics: connections read them with relaxed
//! loads, so the request path takes no lock. `requirepass` is the exception:
//! it is a string behind an `RwLock`, read only by AUTH/HELLO and when a
//! connection opens.
//!
//! Default capacity: a quarter of the machine's RAM (MemTotal in
//! /proc/meminfo), at most 4 GiB and at least the engine's 8 MiB minimum.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use clap::Parser;
use nibble::Mode;

use crate::auth::{self, McUsers};

/// Default TCP port for RESP.
pub const DEFAULT_PORT: u16 = 6379;
/// Port used by `--memcached` without a number.
pub const DEFAULT_MEMCACHED_PORT: u16 = 11211;
/// Default bulk length limit (Redis's `proto-max-bulk-len`); the effective
/// limit is never above the engine's largest value.
pub const DEFAULT_PROTO_MAX_BULK_LEN: u64 = 512 << 20;
/// Default `maxclients`.
pub const DEFAULT_MAXCLIENTS: usize = 10_000;
/// Default query buffer limit per client.
pub const DEFAULT_QUERY_BUFFER_LIMIT: u64 = 256 << 20;
/// Default most arguments per request.
pub const DEFAULT_MAX_MULTIBULK: u64 = 1024 * 1024;
/// Default longest inline request.
pub const DEFAULT_MAX_INLINE: u64 = 64 << 10;
/// Largest default capacity.
/// Default seconds between index checkpoints of a `--data-dir` store
/// (Redis's default RDB save points start at one per hour after one
/// change; a checkpoint here costs a copy of the index, not of the data,
/// so it is taken more often: the walk after a power cut covers at most
/// about a minute of writes).
pub const DEFAULT_CHECKPOINT_INTERVAL_S: u64 = 60;
pub const DEFAULT_CAPACITY_CAP: u64 = 4 << 30;
/// Least `memory-decay-ms`: below it freed log memory would go back to
/// the OS between two bursts of one busy second and fault in again.
pub const MIN_MEMORY_DECAY_MS: u64 = 10;
/// Most `memory-decay-ms` (one hour).
pub const MAX_MEMORY_DECAY_MS: u64 = 3_600_000;
/// Smallest `proto-max-bulk-len` (redis-server's floor).
pub const MIN_PROTO_MAX_BULK_LEN: u64 = 1 << 20;
/// Smallest `client-query-buffer-limit` (redis-server's floor).
pub const MIN_QUERY_BUFFER_LIMIT: u64 = 1 << 20;
/// Smallest `max-multibulk-len`: room for any command of the table with
/// a useful number of keys.
pub const MIN_MAX_MULTIBULK: u64 = 1024;
/// Smallest `max-inline-len`.
pub const MIN_MAX_INLINE: u64 = 4 << 10;
/// Smallest `maxclients`.
pub const MIN_MAXCLIENTS: u64 = 1;

/// Command line of `nibble`.
#[derive(Parser, Debug, Clone, Default)]
#[command(
    name = "nibble",
    version,
    about = "Redis- and memcached-compatible server over the Nibble engine"
)]
pub struct Cli {
    /// `serve` (the default; accepted for symmetry with other tools).
    #[arg(value_parser = ["serve"])]
    pub command: Option<String>,
    /// Config file (redis.conf syntax: `name value` lines).
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Addresses to listen on, space- or comma-separated (default 127.0.0.1).
    #[arg(long)]
    pub bind: Option<String>,
    /// RESP TCP port (default 6379; 0 = pick one; -1 disables TCP RESP).
    #[arg(long, allow_hyphen_values = true)]
    pub port: Option<i32>,
    /// memcached port: text, meta and binary protocols (off unless given; 0 = pick one).
    #[arg(long)]
    pub memcached_port: Option<u16>,
    /// Serve memcached on its usual port 11211 (unless --memcached-port says otherwise).
    #[arg(long)]
    pub memcached: bool,
    /// Unix socket path for RESP.
    #[arg(long)]
    pub unixsocket: Option<PathBuf>,
    /// Engine capacity = maxmemory (e.g. 1gb, 512mb).
    #[arg(long, alias = "capacity")]
    pub maxmemory: Option<String>,
    /// Engine mode: nibble or nibble2.
    #[arg(long)]
    pub mode: Option<String>,
    /// What a full store does: noeviction, allkeys-lru, allkeys-lfu,
    /// allkeys-random, volatile-lru, volatile-lfu, volatile-random,
    /// volatile-ttl (default: noeviction, or allkeys-lru on a server that
    /// serves only memcached; see `eviction.rs`).
    #[arg(long)]
    pub maxmemory_policy: Option<String>,
    /// memcached's -M: a memcached-only server refuses writes when full
    /// instead of evicting.
    #[arg(long, short = 'M')]
    pub memcached_no_evict: bool,
    /// Serve a shared, restartable store (nibblejmp) in this directory:
    /// created with capacity --maxmemory if absent, else reattached and
    /// served at once (recovered first after a crash). Other processes
    /// may attach it while the server runs.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// When writes to a --data-dir store are durable: always (acknowledged
    /// after a flush; group commit), everysec (flushed once a second,
    /// default) or no (left to the kernel). See `durability.rs`.
    #[arg(long)]
    pub appendfsync: Option<String>,
    /// Seconds between fuzzy index checkpoints of a --data-dir store
    /// (default 60; 0 = off): a restart after a power cut then walks
    /// only the log written since the last one. Needs appendfsync always
    /// or everysec. See nibblejmp's `store/checkpoint.rs`.
    #[arg(long)]
    pub checkpoint_interval: Option<String>,
    /// Compaction workers per NUMA node (default: one per 8 CPUs).
    #[arg(long)]
    pub compaction_workers: Option<usize>,
    /// Milliseconds free log memory stays resident before it goes back to
    /// the OS, and of quiet after which all of it does (default 1000;
    /// larger keeps a server that pauses between bursts from faulting
    /// its memory in again; local store only).
    #[arg(long)]
    pub memory_decay_ms: Option<u64>,
    /// Worker threads (default: one per allowed CPU).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Do not pin worker threads to CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// Do not move loopback connections to the worker on their client's
    /// CPU. See `steer.rs`.
    #[arg(long)]
    pub no_steer: bool,
    /// Microseconds a worker keeps polling for events after a batch before
    /// it sleeps, while it has its CPU to itself (default 0: off). See
    /// `idlespin.rs`.
    #[arg(long)]
    pub idle_poll_us: Option<u64>,
    /// Password required before data commands.
    #[arg(long)]
    pub requirepass: Option<String>,
    /// memcached authfile (memcached's -Y: username:password lines); the
    /// memcached port then asks for a `set` of `username password` first.
    #[arg(long)]
    pub memcached_authfile: Option<PathBuf>,
    /// Serve the memcached port without authentication even though
    /// requirepass is set (`yes`); without it such a start is refused.
    #[arg(long)]
    pub memcached_unauthenticated: Option<String>,
    /// Redis's protected mode (`yes` default): with no password, only
    /// loopback clients are served.
    #[arg(long)]
    pub protected_mode: Option<String>,
    /// Most simultaneous clients.
    #[arg(long)]
    pub maxclients: Option<usize>,
    /// Close connections idle this many seconds (0 = never).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Longest bulk string accepted.
    #[arg(long)]
    pub proto_max_bulk_len: Option<String>,
    /// Largest query buffer per client.
    #[arg(long)]
    pub client_query_buffer_limit: Option<String>,
    /// Most arguments in one request.
    #[arg(long)]
    pub max_multibulk_len: Option<u64>,
    /// Longest inline request line.
    #[arg(long)]
    pub max_inline_len: Option<String>,
    /// Log level: error, warn, info (notice), debug (verbose), trace.
    #[arg(long)]
    pub loglevel: Option<String>,
    /// TLS (`--tls-port`, `--tls-cert-file`, ...; see `tls.rs`).
    #[command(flatten)]
    pub tls: crate::tls::TlsFlags,
    /// RDB snapshots (`--dir`, `--dbfilename`, `--load-rdb`, `--save`).
    #[command(flatten)]
    pub rdb: crate::rdb::RdbFlags,
    /// Replication (`--replicaof`, `--masterauth`, `--masteruser`,
    /// `--replica-read-only`).
    #[command(flatten)]
    pub replica: crate::replica::ReplicaFlags,
}

/// Everything fixed at start, plus the initial values of [`Settings`].
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Addresses to listen on.
    pub bind: Vec<String>,
    /// RESP port (`None` = no TCP RESP listener).
    pub port: Option<u16>,
    /// memcached port.
    pub memcached_port: Option<u16>,
    /// Unix socket.
    pub unixsocket: Option<PathBuf>,
    /// Engine capacity.
    pub capacity: u64,
    /// Engine mode.
    pub mode: Mode,
    /// maxmemory-policy, if given (else the default of `eviction.rs`).
    pub maxmemory_policy: Option<crate::eviction::MaxmemoryPolicy>,
    /// memcached's -M (see `eviction.rs`).
    pub memcached_no_evict: bool,
    /// Shared-store directory (`None` = the process-private engine).
    pub data_dir: Option<PathBuf>,
    /// `appendfsync` at start (applies to a data-dir store).
    pub appendfsync: crate::durability::Appendfsync,
    /// Seconds between index checkpoints of a data-dir store (0 = off).
    pub checkpoint_interval_s: u64,
    /// Compaction workers per node.
    pub compaction_workers: Option<usize>,
    /// memory-decay-ms: how long free log memory stays resident (the
    /// engine's `Config::decay_ms`).
    pub memory_decay_ms: u64,
    /// Worker threads.
    pub threads: usize,
    /// Pin workers.
    pub pin: bool,
    /// Move loopback connections to the worker on their client's CPU
    /// (`steer`, see [`crate::steer`]).
    pub steer: bool,
    /// idle-poll-us: a worker's polling window after a batch (µs, 0 = off).
    pub idle_poll_us: u64,
    /// requirepass.
    pub requirepass: Option<String>,
    /// memcached-authfile.
    pub memcached_authfile: Option<PathBuf>,
    /// memcached-unauthenticated: serve memcached without authentication
    /// although requirepass is set.
    pub memcached_unauthenticated: bool,
    /// protected-mode (initial value).
    pub protected_mode: bool,
    /// maxclients.
    pub maxclients: usize,
    /// Idle timeout in seconds (0 = none).
    pub timeout: u64,
    /// proto-max-bulk-len.
    pub proto_max_bulk_len: u64,
    /// client-query-buffer-limit.
    pub query_buffer_limit: u64,
    /// max-multibulk-len.
    pub max_multibulk_len: u64,
    /// max-inline-len.
    pub max_inline_len: u64,
    /// Log level name.
    pub loglevel: String,
    /// TLS settings (`tls-*`).
    pub tls: crate::tls::TlsConfig,
    /// RDB settings (`dir`, `dbfilename`, `save`, `load-rdb`).
    pub rdb: crate::rdb::RdbConfig,
    /// Replication settings (`replicaof`, `masterauth`, ...).
    pub replica: crate::replica::ReplicaConfig,
    /// client-output-buffer-limit: (hard bytes, soft bytes, soft seconds)
    /// per class, in [`OBUF_CLASSES`] order.
    pub output_buffer_limits: [[u64; 3]; 3],
}

/// The client classes of `client-output-buffer-limit`, in Redis's order
/// (CONFIG GET names the replica class `slave`, as redis-server 7.0 does).
pub const OBUF_CLASSES: [&str; 3] = ["normal", "slave", "pubsub"];
/// Index of the normal class.
pub const OBUF_NORMAL: usize = 0;
/// Index of the pubsub class.
pub const OBUF_PUBSUB: usize = 2;
/// Redis's defaults: `normal 0 0 0 replica 256mb 64mb 60 pubsub 32mb 8mb 60`.
pub const DEFAULT_OUTPUT_BUFFER_LIMITS: [[u64; 3]; 3] = [
    [0, 0, 0],
    [256 << 20, 64 << 20, 60],
    [
        crate::pubsub::PUBSUB_HARD_LIMIT_BYTES as u64,
        crate::pubsub::PUBSUB_SOFT_LIMIT_BYTES as u64,
        crate::pubsub::PUBSUB_SOFT_LIMIT_SECS,
    ],
];

/// Parse a `client-output-buffer-limit` value (`class hard soft seconds`,
/// repeated) into `limits`, all or nothing, with redis-server's errors.
pub fn parse_output_limits(value: &str, limits: &mut [[u64; 3]; 3]) -> Result<(), &'static str> {
    let words: Vec<&str> = value.split_whitespace().collect();
    if !words.len().is_multiple_of(4) {
        return Err("Wrong number of arguments in buffer limit configuration.");
    }
    let mut next = *limits;
    for w in words.chunks(4) {
        let class = match w[0].to_ascii_lowercase().as_str() {
            "normal" => 0,
            "replica" | "slave" => 1,
            "pubsub" => 2,
            _ => return Err("Invalid client class specified in buffer limit configuration."),
        };
        let bad = "Error in hard, soft or soft_seconds setting in buffer limit configuration.";
        let hard = parse_size(w[1]).map_err(|_| bad)?;
        let soft = parse_size(w[2]).map_err(|_| bad)?;
        let secs: u64 = w[3].parse().map_err(|_| bad)?;
        next[class] = [hard, soft, secs];
    }
    *limits = next;
    Ok(())
}

/// The output buffer limits in force (CONFIG SET changes them).
pub struct OutputLimits {
    classes: [[AtomicU64; 3]; 3],
}

impl Default for OutputLimits {
    fn default() -> Self {
        OutputLimits::new(DEFAULT_OUTPUT_BUFFER_LIMITS)
    }
}

impl OutputLimits {
    /// These limits.
    pub fn new(v: [[u64; 3]; 3]) -> OutputLimits {
        OutputLimits {
            classes: v.map(|c| c.map(AtomicU64::new)),
        }
    }

    /// (hard bytes, soft bytes, soft seconds) of `class`; 0 = no limit.
    #[inline]
    pub fn get(&self, class: usize) -> (u64, u64, u64) {
        let c = &self.classes[class];
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (l(&c[0]), l(&c[1]), l(&c[2]))
    }

    /// The hard limit of `class` (bytes; 0 = none).
    #[inline]
    pub fn hard(&self, class: usize) -> u64 {
        self.classes[class][0].load(Ordering::Relaxed)
    }

    /// All classes now.
    pub fn all(&self) -> [[u64; 3]; 3] {
        [0, 1, 2].map(|c| {
            let (h, s, t) = self.get(c);
            [h, s, t]
        })
    }

    /// CONFIG SET.
    pub fn set(&self, value: &str) -> Result<(), &'static str> {
        let mut v = self.all();
        parse_output_limits(value, &mut v)?;
        for (c, vals) in self.classes.iter().zip(v) {
            for (a, x) in c.iter().zip(vals) {
                a.store(x, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// CONFIG GET's text.
    pub fn render(&self) -> String {
        let v = self.all();
        OBUF_CLASSES
            .iter()
            .zip(v)
            .map(|(n, [h, s, t])| format!("{n} {h} {s} {t}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: vec!["127.0.0.1".into()],
            port: Some(DEFAULT_PORT),
            memcached_port: None,
            unixsocket: None,
            capacity: default_capacity(),
            // Nibble-2 (dissertation ch. 6): overwrites in place when the
            // value fits, so SET-heavy traffic makes no compaction work.
            // `--mode nibble` selects the original append-only design.
            mode: Mode::Nibble2,
            maxmemory_policy: None,
            memcached_no_evict: false,
            data_dir: None,
            appendfsync: crate::durability::Appendfsync::Everysec,
            checkpoint_interval_s: DEFAULT_CHECKPOINT_INTERVAL_S,
            compaction_workers: None,
            memory_decay_ms: nibble::store::DEFAULT_DECAY_MS,
            threads: topology::allowed_cpus().len().max(1),
            pin: true,
            steer: true,
            idle_poll_us: 0,
            requirepass: None,
            memcached_authfile: None,
            memcached_unauthenticated: false,
            protected_mode: true,
            maxclients: DEFAULT_MAXCLIENTS,
            timeout: 0,
            proto_max_bulk_len: DEFAULT_PROTO_MAX_BULK_LEN,
            query_buffer_limit: DEFAULT_QUERY_BUFFER_LIMIT,
            max_multibulk_len: DEFAULT_MAX_MULTIBULK,
            max_inline_len: DEFAULT_MAX_INLINE,
            loglevel: "info".into(),
            tls: Default::default(),
            rdb: Default::default(),
            replica: Default::default(),
            output_buffer_limits: DEFAULT_OUTPUT_BUFFER_LIMITS,
        }
    }
}

/// min(RAM / 4, 4 GiB), at least the engine minimum.
pub fn default_capacity() -> u64 {
    let ram = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(4 << 30);
    (ram / 4)
        .min(DEFAULT_CAPACITY_CAP)
        .max(nibble::MIN_CAPACITY_BYTES as u64)
}

/// Parse a size: plain bytes, or with k/kb/m/mb/g/gb (powers of 1024, as
/// Redis's `kb`/`mb`/`gb`; Redis's `k`/`m`/`g` are powers of 1000 and so
/// are ours), or KiB/MiB/GiB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit {
        "" | "b" => 1,
        "k" => 1000,
        "kb" | "kib" => 1 << 10,
        "m" => 1_000_000,
        "mb" | "mib" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" | "gib" => 1 << 30,
        _ => return Err(format!("invalid size unit in {s:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

fn parse_bool_ok<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("invalid value {v:?} for {name}"))
}

/// A redis.conf boolean: yes/no (also true/false, 1/0).
pub fn parse_yes_no(name: &str, v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" => Ok(true),
        "no" | "false" | "0" => Ok(false),
        _ => Err(format!(
            "invalid value {v:?} for {name}: expected yes or no"
        )),
    }
}

/// `v` if it is at least `min`, else the reason (redis-server's wording).
pub fn at_least(name: &str, v: u64, min: u64) -> Result<u64, String> {
    if v < min {
        return Err(format!(
            "argument must be between {min} and {} inclusive (a smaller {name} would make the \
             server refuse ordinary requests)",
            i64::MAX
        ));
    }
    Ok(v)
}

impl ServerConfig {
    /// Apply one `name value` setting (config file syntax).
    pub fn apply(&mut self, name: &str, value: &str) -> Result<(), String> {
        let name = name.to_ascii_lowercase().replace('_', "-");
        match name.as_str() {
            "bind" => {
                self.bind = value
                    .split([' ', ','])
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
            }
            "port" => {
                let p: i32 = parse_bool_ok(&name, value)?;
                self.port = if p < 0 {
                    None
                } else {
                    Some(u16::try_from(p).map_err(|_| format!("invalid port {p}"))?)
                };
            }
            "memcached-port" => self.memcached_port = Some(parse_bool_ok(&name, value)?),
            "unixsocket" => self.unixsocket = Some(PathBuf::from(value)),
            "maxmemory" | "capacity" => self.capacity = parse_size(value)?,
            "mode" => self.mode = value.parse()?,
            "maxmemory-policy" => self.maxmemory_policy = Some(value.parse()?),
            "memcached-no-evict" => self.memcached_no_evict = parse_yes_no(&name, value)?,
            "data-dir" => {
                if value.is_empty() {
                    return Err("data-dir needs a directory".into());
                }
                self.data_dir = Some(PathBuf::from(value));
            }
            "appendfsync" => self.appendfsync = value.parse()?,
            "checkpoint-interval" => self.checkpoint_interval_s = parse_bool_ok(&name, value)?,
            "compaction-workers" => self.compaction_workers = Some(parse_bool_ok(&name, value)?),
            "memory-decay-ms" => {
                let ms = parse_bool_ok::<u64>(&name, value)?;
                if !(MIN_MEMORY_DECAY_MS..=MAX_MEMORY_DECAY_MS).contains(&ms) {
                    return Err(format!(
                        "memory-decay-ms must be between {MIN_MEMORY_DECAY_MS} and {MAX_MEMORY_DECAY_MS}"
                    ));
                }
                self.memory_decay_ms = ms;
            }
            "threads" | "io-threads" => self.threads = parse_bool_ok::<usize>(&name, value)?.max(1),
            "idle-poll-us" => {
                let us = parse_bool_ok::<u64>(&name, value)?;
                if us > crate::idlespin::MAX_POLL_US {
                    return Err(format!(
                        "idle-poll-us must be at most {}",
                        crate::idlespin::MAX_POLL_US
                    ));
                }
                self.idle_poll_us = us;
            }
            "requirepass" => self.requirepass = (!value.is_empty()).then(|| value.to_string()),
            "memcached-authfile" => {
                self.memcached_authfile = (!value.is_empty()).then(|| PathBuf::from(value))
            }
            "memcached-unauthenticated" => {
                self.memcached_unauthenticated = parse_yes_no(&name, value)?
            }
            "protected-mode" => self.protected_mode = parse_yes_no(&name, value)?,
            "maxclients" => {
                let v = parse_bool_ok(&name, value)?;
                self.maxclients = at_least(&name, v, MIN_MAXCLIENTS)? as usize
            }
            "timeout" => self.timeout = parse_bool_ok(&name, value)?,
            "proto-max-bulk-len" => {
                self.proto_max_bulk_len =
                    at_least(&name, parse_size(value)?, MIN_PROTO_MAX_BULK_LEN)?
            }
            "client-query-buffer-limit" => {
                self.query_buffer_limit =
                    at_least(&name, parse_size(value)?, MIN_QUERY_BUFFER_LIMIT)?
            }
            "max-multibulk-len" => {
                let v = parse_bool_ok(&name, value)?;
                self.max_multibulk_len = at_least(&name, v, MIN_MAX_MULTIBULK)?
            }
            "max-inline-len" => {
                self.max_inline_len = at_least(&name, parse_size(value)?, MIN_MAX_INLINE)?
            }
            "loglevel" => self.loglevel = value.to_string(),
            "client-output-buffer-limit" => {
                parse_output_limits(value, &mut self.output_buffer_limits)?
            }
            "pin" => self.pin = matches!(value, "yes" | "true" | "1"),
            "steer" => self.steer = matches!(value, "yes" | "true" | "1"),
            n if n.starts_with("tls-") => self.tls.apply(n, value)?,
            n if crate::rdb::RdbConfig::owns(n) => self.rdb.apply(n, value)?,
            n if crate::replica::ReplicaConfig::owns(n) => self.replica.apply(n, value)?,
            _ => return Err(format!("unknown setting {name:?}")),
        }
        Ok(())
    }

    /// Parse a config file's text.
    pub fn apply_file_text(&mut self, text: &str) -> Result<(), String> {
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let mut value = rest.trim();
            if value.len() >= 2
                && ((value.starts_with('"') && value.ends_with('"'))
                    || (value.starts_with('\'') && value.ends_with('\'')))
            {
                value = &value[1..value.len() - 1];
            }
            self.apply(name, value)
                .map_err(|e| format!("config line {} ({name}): {e}", i + 1))?;
        }
        Ok(())
    }

    /// Build from the command line (file first, then flags).
    pub fn from_cli(cli: &Cli) -> Result<ServerConfig, String> {
        let mut c = ServerConfig::default();
        if let Some(path) = &cli.config {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            c.apply_file_text(&text)?;
        }
        let mut set = |name: &str, v: Option<String>| -> Result<(), String> {
            match v {
                Some(v) => c.apply(name, &v).map_err(|e| format!("--{name}: {e}")),
                None => Ok(()),
            }
        };
        set("bind", cli.bind.clone())?;
        set("port", cli.port.map(|p| p.to_string()))?;
        set("memcached-port", cli.memcached_port.map(|p| p.to_string()))?;
        set(
            "unixsocket",
            cli.unixsocket.as_ref().map(|p| p.display().to_string()),
        )?;
        set("maxmemory", cli.maxmemory.clone())?;
        set("mode", cli.mode.clone())?;
        set("maxmemory-policy", cli.maxmemory_policy.clone())?;
        set(
            "data-dir",
            cli.data_dir.as_ref().map(|p| p.display().to_string()),
        )?;
        set("appendfsync", cli.appendfsync.clone())?;
        set("checkpoint-interval", cli.checkpoint_interval.clone())?;
        set(
            "compaction-workers",
            cli.compaction_workers.map(|v| v.to_string()),
        )?;
        set(
            "memory-decay-ms",
            cli.memory_decay_ms.map(|v| v.to_string()),
        )?;
        set("threads", cli.threads.map(|v| v.to_string()))?;
        set("idle-poll-us", cli.idle_poll_us.map(|v| v.to_string()))?;
        set("requirepass", cli.requirepass.clone())?;
        set(
            "memcached-authfile",
            cli.memcached_authfile
                .as_ref()
                .map(|p| p.display().to_string()),
        )?;
        set(
            "memcached-unauthenticated",
            cli.memcached_unauthenticated.clone(),
        )?;
        set("protected-mode", cli.protected_mode.clone())?;
        set("maxclients", cli.maxclients.map(|v| v.to_string()))?;
        set("timeout", cli.timeout.map(|v| v.to_string()))?;
        set("proto-max-bulk-len", cli.proto_max_bulk_len.clone())?;
        set(
            "client-query-buffer-limit",
            cli.client_query_buffer_limit.clone(),
        )?;
        set(
            "max-multibulk-len",
            cli.max_multibulk_len.map(|v| v.to_string()),
        )?;
        set("max-inline-len", cli.max_inline_len.clone())?;
        set("loglevel", cli.loglevel.clone())?;
        c.tls.apply_flags(&cli.tls)?;
        c.rdb.apply_flags(&cli.rdb)?;
        c.replica.apply_flags(&cli.replica)?;
        if cli.memcached && c.memcached_port.is_none() {
            c.memcached_port = Some(DEFAULT_MEMCACHED_PORT);
        }
        if cli.no_pin {
            c.pin = false;
        }
        if cli.no_steer {
            c.steer = false;
        }
        if cli.memcached_no_evict {
            c.memcached_no_evict = true;
        }
        Ok(c)
    }
}

/// Settings `CONFIG SET` may change at run time.
pub struct Settings {
    /// maxclients.
    pub maxclients: AtomicUsize,
    /// The most clients the descriptor limit allows (fixed at start).
    pub maxclients_ceiling: usize,
    /// Idle timeout, seconds.
    pub timeout: AtomicU64,
    /// proto-max-bulk-len as configured (clamped when read).
    pub proto_max_bulk_len: AtomicU64,
    /// client-query-buffer-limit.
    pub query_buffer_limit: AtomicU64,
    /// max-multibulk-len.
    pub max_multibulk_len: AtomicU64,
    /// max-inline-len.
    pub max_inline_len: AtomicU64,
    /// protected-mode.
    pub protected_mode: AtomicBool,
    /// requirepass.
    pub requirepass: RwLock<Option<String>>,
    /// The memcached authfile's users (`None` = the memcached port is
    /// unauthenticated). Fixed at start.
    pub mc_users: Option<McUsers>,
    /// The engine's largest value (fixed).
    pub engine_max_value: u64,
    /// Redis's encoding tunables and `appendonly` (stored, no effect).
    pub tunables: crate::tunables::Tunables,
    /// maxmemory-policy in force (`MaxmemoryPolicy::to_byte`); the engine
    /// follows it (`Engine::set_eviction`).
    pub maxmemory_policy: std::sync::atomic::AtomicU8,
    /// client-output-buffer-limit (shared with the pub/sub hub).
    pub output_limits: std::sync::Arc<OutputLimits>,
}

impl Settings {
    /// From the start configuration; reads the memcached authfile.
    pub fn new(c: &ServerConfig, engine_max_value: u64) -> Result<Settings, String> {
        let mc_users = match &c.memcached_authfile {
            Some(p) => Some(McUsers::load(p)?),
            None => None,
        };
        Ok(Settings {
            maxclients: AtomicUsize::new(c.maxclients),
            maxclients_ceiling: usize::MAX,
            timeout: AtomicU64::new(c.timeout),
            proto_max_bulk_len: AtomicU64::new(c.proto_max_bulk_len),
            query_buffer_limit: AtomicU64::new(c.query_buffer_limit),
            max_multibulk_len: AtomicU64::new(c.max_multibulk_len),
            max_inline_len: AtomicU64::new(c.max_inline_len),
            protected_mode: AtomicBool::new(c.protected_mode),
            requirepass: RwLock::new(c.requirepass.clone()),
            mc_users,
            engine_max_value,
            tunables: Default::default(),
            maxmemory_policy: std::sync::atomic::AtomicU8::new(
                crate::eviction::MaxmemoryPolicy::at_start(c).to_byte(),
            ),
            output_limits: std::sync::Arc::new(OutputLimits::new(c.output_buffer_limits)),
        })
    }

    /// The maxmemory-policy in force.
    pub fn policy(&self) -> crate::eviction::MaxmemoryPolicy {
        crate::eviction::MaxmemoryPolicy::from_byte(self.maxmemory_policy.load(Ordering::Relaxed))
    }

    /// The effective bulk limit: the configured one, never above the
    /// engine's largest value.
    pub fn max_bulk(&self) -> usize {
        self.proto_max_bulk_len
            .load(Ordering::Relaxed)
            .min(self.engine_max_value) as usize
    }

    /// Parser limits now, for a connection that has (`authed`) or has not
    /// authenticated (then redis-server's pre-AUTH bounds apply).
    pub fn limits(&self, authed: bool) -> crate::resp::Limits {
        let l = crate::resp::Limits {
            max_multibulk: self.max_multibulk_len.load(Ordering::Relaxed) as usize,
            max_bulk: self.max_bulk(),
            max_inline: self.max_inline_len.load(Ordering::Relaxed) as usize,
            unauthenticated: false,
        };
        if authed {
            return l;
        }
        crate::resp::Limits {
            max_multibulk: l.max_multibulk.min(auth::UNAUTH_MAX_MULTIBULK),
            max_bulk: l.max_bulk.min(auth::UNAUTH_MAX_BULK_BYTES),
            max_inline: l.max_inline.min(auth::UNAUTH_MAX_BULK_BYTES),
            unauthenticated: true,
        }
    }

    /// The input buffer limit of a connection (smaller before AUTH).
    pub fn query_buffer_limit(&self, authed: bool) -> u64 {
        let l = self.query_buffer_limit.load(Ordering::Relaxed);
        if authed {
            l
        } else {
            l.min(auth::UNAUTH_QUERY_BUFFER_BYTES)
        }
    }

    /// Idle timeout.
    pub fn idle_timeout(&self) -> Option<Duration> {
        match self.timeout.load(Ordering::Relaxed) {
            0 => None,
            s => Some(Duration::from_secs(s)),
        }
    }

    /// The password, if one is required.
    pub fn password(&self) -> Option<String> {
        self.requirepass
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Is a client of `protocol` from `peer` refused by protected mode?
    /// (Protected mode on, the port has no authentication, the peer is not
    /// loopback.)
    pub fn denies(&self, protocol: crate::conn::Protocol, peer: &std::net::SocketAddr) -> bool {
        if !self.protected_mode.load(Ordering::Relaxed) || auth::is_loopback(peer) {
            return false;
        }
        match protocol {
            crate::conn::Protocol::Resp => self
                .requirepass
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_none(),
            crate::conn::Protocol::Memcached => self.mc_users.is_none(),
        }
    }

    /// `CONFIG GET` names and current values. `requirepass` is left out:
    /// it is answered only when asked for by its exact name (see
    /// `commands::admin::config`), so a `CONFIG GET *` dump carries no
    /// password.
    pub fn get_all(&self, fixed: &ServerConfig) -> Vec<(&'static str, String)> {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
        vec![
            ("bind", fixed.bind.join(" ")),
            ("port", fixed.port.map_or("-1".into(), |p| p.to_string())),
            (
                "memcached-port",
                fixed.memcached_port.map_or("0".into(), |p| p.to_string()),
            ),
            (
                "memcached-authfile",
                fixed
                    .memcached_authfile
                    .as_ref()
                    .map_or(String::new(), |p| p.display().to_string()),
            ),
            (
                "memcached-unauthenticated",
                yes_no(fixed.memcached_unauthenticated),
            ),
            (
                "protected-mode",
                yes_no(self.protected_mode.load(Ordering::Relaxed)),
            ),
            (
                "unixsocket",
                fixed
                    .unixsocket
                    .as_ref()
                    .map_or(String::new(), |p| p.display().to_string()),
            ),
            ("maxmemory", fixed.capacity.to_string()),
            ("maxmemory-policy", self.policy().name().into()),
            ("mode", fixed.mode.name().into()),
            (
                "data-dir",
                fixed
                    .data_dir
                    .as_ref()
                    .map_or(String::new(), |p| p.display().to_string()),
            ),
            ("threads", fixed.threads.to_string()),
            ("io-threads", fixed.threads.to_string()),
            ("idle-poll-us", fixed.idle_poll_us.to_string()),
            ("memory-decay-ms", fixed.memory_decay_ms.to_string()),
            ("databases", "1".into()),
            (
                "maxclients",
                self.maxclients.load(Ordering::Relaxed).to_string(),
            ),
            ("timeout", r(&self.timeout)),
            ("proto-max-bulk-len", r(&self.proto_max_bulk_len)),
            ("client-query-buffer-limit", r(&self.query_buffer_limit)),
            ("max-multibulk-len", r(&self.max_multibulk_len)),
            ("max-inline-len", r(&self.max_inline_len)),
            ("client-output-buffer-limit", self.output_limits.render()),
        ]
        .into_iter()
        .chain(fixed.tls.config_get())
        .chain(self.tunables.get_all())
        .collect()
    }

    /// `CONFIG SET name value`; `Err` is the reply text. Every limit has
    /// a floor that keeps the server usable; a value below it is refused.
    pub fn set(&self, fixed: &ServerConfig, name: &str, value: &str) -> Result<(), String> {
        let failed = |why: &str| {
            format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {why}")
        };
        let int = |v: &str| -> Result<u64, String> {
            v.parse()
                .map_err(|_| failed("argument couldn't be parsed into an integer"))
        };
        let size = |v: &str| -> Result<u64, String> {
            parse_size(v).map_err(|_| failed("argument couldn't be parsed into an integer"))
        };
        let floor = |v: u64, min: u64| at_least(name, v, min).map_err(|e| failed(&e));
        if let Some(done) = self.tunables.set(name, value) {
            return done;
        }
        match name {
            "maxclients" => {
                let v = floor(int(value)?, MIN_MAXCLIENTS)? as usize;
                if v > self.maxclients_ceiling {
                    return Err(failed(&format!(
                        "The operating system is not able to handle the specified number of \
                         clients, try with {}",
                        self.maxclients_ceiling
                    )));
                }
                self.maxclients.store(v, Ordering::Relaxed)
            }
            "timeout" => self.timeout.store(int(value)?, Ordering::Relaxed),
            "proto-max-bulk-len" => self.proto_max_bulk_len.store(
                floor(size(value)?, MIN_PROTO_MAX_BULK_LEN)?,
                Ordering::Relaxed,
            ),
            "client-query-buffer-limit" => self.query_buffer_limit.store(
                floor(size(value)?, MIN_QUERY_BUFFER_LIMIT)?,
                Ordering::Relaxed,
            ),
            "max-multibulk-len" => self
                .max_multibulk_len
                .store(floor(int(value)?, MIN_MAX_MULTIBULK)?, Ordering::Relaxed),
            "max-inline-len" => self
                .max_inline_len
                .store(floor(size(value)?, MIN_MAX_INLINE)?, Ordering::Relaxed),
            "client-output-buffer-limit" => self
                .output_limits
                .set(value)
                .map_err(&failed)?,
            "protected-mode" => self.protected_mode.store(
                parse_yes_no(name, value).map_err(|e| failed(&e))?,
                Ordering::Relaxed,
            ),
            "requirepass" => {
                // The same rule as at start: both protocols ask for
                // credentials, or neither does.
                let mut probe = fixed.clone();
                probe.requirepass = (!value.is_empty()).then(|| value.to_string());
                auth::check_ports(&probe).map_err(|e| failed(&e))?;
                *self.requirepass.write().unwrap_or_else(|e| e.into_inner()) = probe.requirepass;
            }
            "maxmemory-policy" => {
                let p: crate::eviction::MaxmemoryPolicy = value.parse().map_err(|e: String| failed(&e))?;
                if fixed.data_dir.is_some() && p.engine().evicts() {
                    return Err(failed(
                        "the shared store (data-dir) does not evict; only noeviction is accepted",
                    ));
                }
                self.maxmemory_policy.store(p.to_byte(), Ordering::Relaxed);
            }
            n if n.starts_with("tls-") => {
                return Err(format!(
                    "ERR CONFIG SET failed (possibly related to argument '{n}') - can't set immutable config"
                ))
            }
            _ => {
                return Err(format!(
                    "ERR Unknown option or number of arguments for CONFIG SET - '{name}'"
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64mb").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn file() {
        let mut c = ServerConfig::default();
        c.apply_file_text(
            "# comment\nport 7000\nmaxmemory 64mb\nrequirepass \"s p\"\nmode nibble2\n",
        )
        .unwrap();
        assert_eq!(c.port, Some(7000));
        assert_eq!(c.capacity, 64 << 20);
        assert_eq!(c.requirepass.as_deref(), Some("s p"));
        assert_eq!(c.mode, Mode::Nibble2);
        assert_eq!(c.data_dir, None);
        c.apply_file_text("data-dir \"/dev/shm/my store\"\n")
            .unwrap();
        assert_eq!(c.data_dir, Some(PathBuf::from("/dev/shm/my store")));
        assert!(c.apply_file_text("data-dir \"\"").is_err());
        assert!(c.apply_file_text("bogus 1").is_err());
        assert_eq!(c.memory_decay_ms, nibble::store::DEFAULT_DECAY_MS);
        c.apply_file_text("memory-decay-ms 10000\n").unwrap();
        assert_eq!(c.memory_decay_ms, 10_000);
        for bad in ["0", "9", "3600001", "-1", "x"] {
            assert!(
                c.apply_file_text(&format!("memory-decay-ms {bad}"))
                    .is_err(),
                "{bad}"
            );
        }
        assert_eq!(c.memory_decay_ms, 10_000);
        c.apply_file_text(
            "client-output-buffer-limit pubsub 1mb 512kb 5\nclient-output-buffer-limit normal 0 0 0\n",
        )
        .unwrap();
        assert_eq!(c.output_buffer_limits[OBUF_PUBSUB], [1 << 20, 512 << 10, 5]);
        let l = OutputLimits::new(c.output_buffer_limits);
        assert_eq!(
            l.render(),
            "normal 0 0 0 slave 268435456 67108864 60 pubsub 1048576 524288 5"
        );
        assert!(l.set("pubsub 1 2").is_err());
        assert!(l.set("foo 1 1 1").is_err());
        assert!(l.set("pubsub 1 1 -1").is_err());
        l.set("replica 1 1 1 normal 2 2 2").unwrap();
        assert_eq!(l.get(1), (1, 1, 1));
        assert_eq!(l.get(OBUF_NORMAL), (2, 2, 2));
    }

    #[test]
    fn flags_override() {
        let cli = Cli::parse_from([
            "nibble",
            "serve",
            "--memcached",
            "--port",
            "-1",
            "--maxmemory",
            "1gb",
        ]);
        let c = ServerConfig::from_cli(&cli).unwrap();
        assert_eq!(c.memcached_port, Some(DEFAULT_MEMCACHED_PORT));
        assert_eq!(c.port, None);
        assert_eq!(c.capacity, 1 << 30);
        let c =
            ServerConfig::from_cli(&Cli::parse_from(["nibble", "--data-dir", "/tmp/x"])).unwrap();
        assert_eq!(c.data_dir, Some(PathBuf::from("/tmp/x")));
        let d = ServerConfig::from_cli(&Cli::parse_from(["nibble"])).unwrap();
        assert_eq!(
            (d.bind.clone(), d.port, d.memcached_port),
            (vec!["127.0.0.1".to_string()], Some(6379), None)
        );
        assert!(
            d.capacity <= DEFAULT_CAPACITY_CAP && d.capacity >= nibble::MIN_CAPACITY_BYTES as u64
        );
    }
}
