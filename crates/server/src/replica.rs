//! Replication from a Redis primary: `REPLICAOF host port`, as a Redis
//! 7.0 replica does it (`replication.c`: `syncWithMaster`,
//! `readSyncBulkPayload`, `replicationCron`).
//!
//! ## The link
//!
//! One thread, `nibble-replica`, started with the server, owns the link.
//! It sleeps until a primary is set (`replicaof` in the config file,
//! `--replicaof`, or the REPLICAOF / SLAVEOF command), then runs the
//! Redis handshake on a blocking socket:
//!
//! ```text
//!  PING                          ─▶ +PONG (or -NOAUTH: the primary wants AUTH)
//!  AUTH [masteruser] masterauth  ─▶ +OK               (when masterauth is set)
//!  REPLCONF listening-port P     ─▶ +OK
//!  REPLCONF capa eof capa psync2 ─▶ +OK
//!  PSYNC ? -1                    ─▶ +FULLRESYNC <replid> <offset>
//!     or PSYNC <replid> <off+1>  ─▶ +CONTINUE [<new replid>]  (partial resync)
//!  full sync: $<len>\r\n<len bytes>  or  $EOF:<40-byte mark>\r\n<bytes><mark>
//!  then the command stream, forever; REPLCONF ACK <offset> every second
//! ```
//!
//! Empty lines before the PSYNC reply and the payload are the primary's
//! keep-alives and are skipped, as Redis does.
//!
//! **Full sync.** The payload is read whole into memory (the `$<len>`
//! form and the diskless `$EOF:` form, whose end is the 40-byte mark).
//! It is not streamed into the decoder: the decoder checks the file's
//! CRC64 before it imports anything ([`crate::rdb::decode`]), which is
//! what makes a truncated or damaged payload harmless here — it is
//! refused before the dataset is touched. So the replica's memory peaks
//! at the dataset plus one RDB image during a full sync (Redis writes the
//! image to a temp file instead). Once the checksum holds, the dataset is
//! flushed and the RDB imported through the start-time importer
//! ([`crate::rdb::load`]); meanwhile the server answers
//! `-LOADING Redis is loading the dataset in memory` to data commands, as
//! Redis does. Then the replica sends `REPLCONF ACK` at once (a diskless
//! primary puts the replica online only on its first ACK).
//!
//! **Command stream.** The bytes after the payload are RESP commands.
//! Each is parsed with the clients' parser ([`crate::resp`]) and run
//! through the normal dispatch ([`crate::commands::execute`]: key
//! stripes, MULTI/EXEC queueing, every handler as for a client) in a
//! session flagged `primary`, which the read-only gate lets through; the
//! replies are discarded. An error reply to a command of the primary is
//! counted (`nibble_repl_command_errors`) and logged (rate-limited), as
//! Redis logs one. The replication offset grows by the bytes of each
//! command processed; `REPLCONF GETACK` is answered with
//! `REPLCONF ACK <offset>` (the offset before the GETACK itself, as Redis
//! answers), not executed. Inside a MULTI block the offset stands still
//! until EXEC (Redis's `commandProcessed` does the same), so a link lost
//! in the middle of a transaction resumes at its MULTI, never runs half
//! of one. SELECT changes the database the stream writes
//! to: this server has one database (0), so commands the primary runs in
//! another database are skipped (still counted in the offset), with one
//! log line per link and the count in `nibble_repl_other_db_commands`;
//! FLUSHALL is applied whatever the database, since it empties all.
//!
//! **Partial resync.** When the link drops after a sync (the primary
//! closed it, CLIENT KILL, a network error, no byte for `repl-timeout`
//! seconds), the replica keeps the primary's replid and its offset and
//! reconnects a second later with `PSYNC <replid> <offset+1>`, as Redis's
//! cached master does; `+CONTINUE` resumes the stream from the primary's
//! backlog without touching the dataset, `+FULLRESYNC` starts over. A
//! link that failed inside a full sync's import, or whose stream could
//! not be parsed, forgets the replid, so the next sync is full.
//!
//! **Bad input.** A payload that is truncated, fails its checksum or
//! cannot be parsed, an unparsable command stream, a reply that is not
//! what the handshake expects: each is one log line naming the primary
//! and what was wrong (also in INFO `nibble_repl_last_error`), the link
//! goes down, and the thread retries a second later. Nothing panics and
//! no byte read from the primary sizes an allocation before it arrived.
//!
//! ## Read-only replica, expiry
//!
//! With `replica-read-only yes` (the default) a replica refuses every
//! command flagged `write` from its clients with
//! `-READONLY You can't write against a read only replica.` — one relaxed
//! load of [`Replication::gate`] on the dispatch path, zero on a primary.
//! The memcached port is not gated (it is off unless configured).
//!
//! Expiry follows Redis as far as the engine allows: keys arrive with the
//! primary's absolute expiry times (the RDB's and the stream's PEXPIREAT /
//! SET PXAT), a read of a key whose time passed answers nil (the engine
//! hides an expired item), and the replica deletes nothing by itself that
//! a client could see — the primary's DEL of an expired key arrives in the
//! stream and is applied. The engine does reclaim the space of expired
//! items in the background, which Redis's replica does not do, but that is
//! invisible: the item is already hidden. With clocks that disagree, a key
//! may read as expired on one side a little before the other, as in Redis.
//!
//! ## State
//!
//! [`Replication`] (in [`Shared`]) holds the target primary, a generation
//! counter (each REPLICAOF bumps it; the thread drops a link whose
//! generation is old within [`POLL_MS`]), the link state INFO replication
//! and ROLE show, and the cached replid and offset. REPLICAOF NO ONE
//! stops the link, keeps the dataset and makes the server writable; the
//! next REPLICAOF then syncs in full.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::auth::LogLimiter;
use crate::commands::{self, Ctx, Session, Spec};
use crate::resp::{Limits, Parsed, Parser, Reply};
use crate::state::{unix_ms, ClientInfo, Shared};

/// Redis's error for a write sent to a read-only replica.
pub const READONLY: &str = "READONLY You can't write against a read only replica.";
/// Redis's error while a dataset loads.
pub const LOADING: &str = "LOADING Redis is loading the dataset in memory";
/// Gate bit: writes from clients are refused.
pub const GATE_READONLY: u8 = 1;
/// Gate bit: a full sync is loading; data commands are refused.
pub const GATE_LOADING: u8 = 2;
/// How often the link thread looks at its generation and at shutdown.
pub const POLL_MS: u64 = 100;
/// Wait between two connection attempts (Redis's replicationCron: 1 s).
pub const RETRY_MS: u64 = 1000;
/// Interval of `REPLCONF ACK` (Redis: every second).
pub const ACK_INTERVAL_MS: u64 = 1000;
/// Default `repl-timeout`, seconds.
pub const DEFAULT_REPL_TIMEOUT_SECS: u64 = 60;
/// Timeout of the TCP connect.
pub const CONNECT_TIMEOUT_MS: u64 = 5000;
/// Longest reply line accepted from the primary during the handshake.
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 64 << 10;
/// Largest first reservation for a `$<len>` payload (it grows as bytes
/// arrive, so a lying length allocates nothing it did not receive).
const MAX_RESERVE_BYTES: usize = 64 << 20;
/// Length of the diskless EOF mark.
pub const EOF_MARK_BYTES: usize = 40;
/// A replid of no primary.
pub const NO_REPLID: &str = "0000000000000000000000000000000000000000";

/// Commands a client may run while a full sync loads (besides those
/// flagged `loading`): what Redis's `CMD_LOADING` allows.
const LOADING_OK: &[&str] = &[
    "info",
    "ping",
    "role",
    "replicaof",
    "slaveof",
    "config",
    "client",
    "hello",
    "auth",
    "command",
    "quit",
    "shutdown",
    "select",
    "echo",
    "time",
    "lastsave",
];

static STREAM_ERR_LOG: LogLimiter = LogLimiter::new(5);

/// Replication settings fixed at start (`replicaof`, `masterauth`,
/// `masteruser`, `replica-read-only`, `repl-timeout`).
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// The primary to follow from the start.
    pub replicaof: Option<(String, u16)>,
    /// Password sent to the primary.
    pub masterauth: Option<String>,
    /// User sent to the primary with `masterauth` (ACL).
    pub masteruser: Option<String>,
    /// Refuse writes from clients while a replica.
    pub read_only: bool,
    /// Seconds without a byte from the primary before the link is dropped.
    pub repl_timeout_secs: u64,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            replicaof: None,
            masterauth: None,
            masteruser: None,
            read_only: true,
            repl_timeout_secs: DEFAULT_REPL_TIMEOUT_SECS,
        }
    }
}

/// The `--replicaof`, `--masterauth`, `--masteruser` and
/// `--replica-read-only` flags (flattened into [`Cli`](crate::config::Cli)).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ReplicaFlags {
    /// Replicate from this Redis primary: "HOST PORT".
    #[arg(long)]
    pub replicaof: Option<String>,
    /// Password for the primary (its requirepass or the ACL user's).
    #[arg(long)]
    pub masterauth: Option<String>,
    /// ACL user for the primary (with --masterauth).
    #[arg(long)]
    pub masteruser: Option<String>,
    /// Refuse client writes while a replica (yes, the default, or no).
    #[arg(long)]
    pub replica_read_only: Option<String>,
}

/// Parse "HOST PORT".
pub fn parse_host_port(v: &str) -> Result<(String, u16), String> {
    let w: Vec<&str> = v.split_whitespace().collect();
    match w.as_slice() {
        [h, p] => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .map(|p| (h.to_string(), p))
            .ok_or_else(|| format!("invalid port {p:?}")),
        _ => Err("expected \"HOST PORT\"".into()),
    }
}

impl ReplicaConfig {
    /// Whether `name` (config-file syntax) is a replication setting.
    pub fn owns(name: &str) -> bool {
        matches!(
            name,
            "replicaof"
                | "slaveof"
                | "masterauth"
                | "masteruser"
                | "replica-read-only"
                | "slave-read-only"
                | "repl-timeout"
        )
    }

    /// Apply one `name value` setting.
    pub fn apply(&mut self, name: &str, value: &str) -> Result<(), String> {
        match name {
            "replicaof" | "slaveof" => {
                self.replicaof = if value.eq_ignore_ascii_case("no one") || value.is_empty() {
                    None
                } else {
                    Some(parse_host_port(value)?)
                }
            }
            "masterauth" => self.masterauth = (!value.is_empty()).then(|| value.to_string()),
            "masteruser" => self.masteruser = (!value.is_empty()).then(|| value.to_string()),
            "replica-read-only" | "slave-read-only" => {
                self.read_only = crate::config::parse_yes_no(name, value)?
            }
            "repl-timeout" => {
                self.repl_timeout_secs = value
                    .parse::<u64>()
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or_else(|| format!("invalid repl-timeout {value:?}"))?
            }
            _ => return Err(format!("unknown setting {name:?}")),
        }
        Ok(())
    }

    /// Apply the flags (after the config file).
    pub fn apply_flags(&mut self, f: &ReplicaFlags) -> Result<(), String> {
        for (name, v) in [
            ("replicaof", &f.replicaof),
            ("masterauth", &f.masterauth),
            ("masteruser", &f.masteruser),
            ("replica-read-only", &f.replica_read_only),
        ] {
            if let Some(v) = v {
                self.apply(name, v).map_err(|e| format!("--{name}: {e}"))?;
            }
        }
        Ok(())
    }
}

/// Where the link stands (ROLE's state word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkState {
    /// Waiting to connect.
    Connect = 0,
    /// TCP connect in progress.
    Connecting = 1,
    /// PING/AUTH/REPLCONF/PSYNC.
    Handshake = 2,
    /// Receiving or loading the RDB payload.
    Sync = 3,
    /// Streaming commands.
    Connected = 4,
}

impl LinkState {
    fn from_u8(v: u8) -> LinkState {
        match v {
            1 => LinkState::Connecting,
            2 => LinkState::Handshake,
            3 => LinkState::Sync,
            4 => LinkState::Connected,
            _ => LinkState::Connect,
        }
    }

    /// ROLE's word.
    pub fn word(self) -> &'static str {
        match self {
            LinkState::Connect => "connect",
            LinkState::Connecting => "connecting",
            LinkState::Handshake => "handshake",
            LinkState::Sync => "sync",
            LinkState::Connected => "connected",
        }
    }
}

/// The primary followed, and the generation of that choice.
#[derive(Default)]
struct Target {
    primary: Option<(String, u16)>,
    generation: u64,
}

/// Replication state shared by the link thread, dispatch and INFO.
pub struct Replication {
    /// [`GATE_READONLY`] | [`GATE_LOADING`]; 0 on a primary.
    gate: AtomicU8,
    read_only: AtomicBool,
    target: Mutex<Target>,
    wake: Condvar,
    generation: AtomicU64,
    state: AtomicU8,
    sync_in_progress: AtomicBool,
    /// Unix ms of the last byte from the primary (0: never).
    last_io_ms: AtomicU64,
    /// Unix ms the link went down (0: never up).
    down_since_ms: AtomicU64,
    /// Replication offset processed (-1: none).
    offset: AtomicI64,
    /// The primary's replid ("" = none cached: the next sync is full).
    replid: Mutex<String>,
    /// The database the stream writes to (SELECT), kept across a partial
    /// resync as Redis's cached master keeps it.
    stream_db: AtomicI64,
    last_error: Mutex<String>,
    full_syncs: AtomicU64,
    partial_syncs: AtomicU64,
    command_errors: AtomicU64,
    other_db_commands: AtomicU64,
    masterauth: RwLock<Option<String>>,
    masteruser: RwLock<Option<String>>,
    repl_timeout_secs: AtomicU64,
    /// This server's replid as a primary (INFO's `master_replid`).
    own_replid: String,
}

impl Replication {
    /// From the start configuration.
    pub fn new(c: &ReplicaConfig) -> Replication {
        let r = Replication {
            gate: AtomicU8::new(0),
            read_only: AtomicBool::new(c.read_only),
            target: Mutex::new(Target::default()),
            wake: Condvar::new(),
            generation: AtomicU64::new(0),
            state: AtomicU8::new(0),
            sync_in_progress: AtomicBool::new(false),
            last_io_ms: AtomicU64::new(0),
            down_since_ms: AtomicU64::new(0),
            offset: AtomicI64::new(-1),
            replid: Mutex::new(String::new()),
            stream_db: AtomicI64::new(0),
            last_error: Mutex::new(String::new()),
            full_syncs: AtomicU64::new(0),
            partial_syncs: AtomicU64::new(0),
            command_errors: AtomicU64::new(0),
            other_db_commands: AtomicU64::new(0),
            masterauth: RwLock::new(c.masterauth.clone()),
            masteruser: RwLock::new(c.masteruser.clone()),
            repl_timeout_secs: AtomicU64::new(c.repl_timeout_secs),
            own_replid: random_replid(),
        };
        if let Some((h, p)) = &c.replicaof {
            r.follow(Some((h.clone(), *p)));
        }
        r
    }

    /// The gate dispatch checks (one relaxed load).
    #[inline]
    pub fn gate(&self) -> u8 {
        self.gate.load(Ordering::Relaxed)
    }

    fn lock_target(&self) -> std::sync::MutexGuard<'_, Target> {
        self.target.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The primary followed, if any.
    pub fn primary(&self) -> Option<(String, u16)> {
        self.lock_target().primary.clone()
    }

    fn set_gate_bit(&self, bit: u8, on: bool) {
        if on {
            self.gate.fetch_or(bit, Ordering::Relaxed);
        } else {
            self.gate.fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// Follow `primary` (`None`: REPLICAOF NO ONE). Returns false when it
    /// is already the primary followed.
    pub fn follow(&self, primary: Option<(String, u16)>) -> bool {
        let mut t = self.lock_target();
        if t.primary == primary && primary.is_some() {
            return false;
        }
        t.primary = primary.clone();
        t.generation += 1;
        self.generation.store(t.generation, Ordering::Release);
        // A new primary (or none) never continues the old stream.
        self.replid
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.offset.store(-1, Ordering::Relaxed);
        self.state
            .store(LinkState::Connect as u8, Ordering::Relaxed);
        self.set_gate_bit(
            GATE_READONLY,
            primary.is_some() && self.read_only.load(Ordering::Relaxed),
        );
        match &primary {
            Some((h, p)) => log::info!("replication: following primary {h}:{p}"),
            None => log::info!("replication: MASTER MODE enabled (REPLICAOF NO ONE)"),
        }
        self.wake.notify_all();
        true
    }

    /// `replica-read-only`.
    pub fn set_read_only(&self, on: bool) {
        let t = self.lock_target();
        self.read_only.store(on, Ordering::Relaxed);
        self.set_gate_bit(GATE_READONLY, on && t.primary.is_some());
    }

    fn stopped(&self, sh: &Shared, gen: u64) -> bool {
        sh.stopping.load(Ordering::Acquire) || self.generation.load(Ordering::Acquire) != gen
    }

    fn set_error(&self, e: &str) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = e.to_string();
    }

    fn replid(&self) -> String {
        self.replid
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_replid(&self, id: &str) {
        *self.replid.lock().unwrap_or_else(|e| e.into_inner()) = id.to_string();
    }

    /// The replication offset processed (-1: none).
    pub fn offset(&self) -> i64 {
        self.offset.load(Ordering::Relaxed)
    }

    fn link_up(&self) -> bool {
        self.state.load(Ordering::Relaxed) == LinkState::Connected as u8
    }

    fn down(&self) {
        if self.link_up() || self.down_since_ms.load(Ordering::Relaxed) == 0 {
            self.down_since_ms.store(unix_ms(), Ordering::Relaxed);
        }
        self.state
            .store(LinkState::Connect as u8, Ordering::Relaxed);
        self.sync_in_progress.store(false, Ordering::Relaxed);
    }
}

/// 40 hex digits from the clock and the process id (a replid needs to
/// differ between runs, not to be secret).
fn random_replid() -> String {
    let mut x = unix_ms() ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    let mut s = String::with_capacity(40);
    while s.len() < 40 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(&format!("{:016x}", x));
    }
    s.truncate(40);
    s
}

/// Why dispatch refuses `spec` from a client under `gate` (non-zero).
#[cold]
pub fn refused(gate: u8, spec: &Spec) -> Option<&'static str> {
    if gate & GATE_LOADING != 0
        && !spec.flags.contains(&"loading")
        && !LOADING_OK.contains(&spec.name)
    {
        return Some(LOADING);
    }
    if gate & GATE_READONLY != 0 && spec.flags.contains(&"write") {
        return Some(READONLY);
    }
    None
}

/// The INFO replication section.
pub fn info(sh: &Shared) -> String {
    let r = &sh.replica;
    let off = r.offset().max(0);
    let mut o = String::from("# Replication\r\n");
    match r.primary() {
        None => {
            o.push_str(&format!(
                "role:master\r\nconnected_slaves:0\r\nmaster_failover_state:no-failover\r\nmaster_replid:{}\r\nmaster_replid2:{NO_REPLID}\r\nmaster_repl_offset:0\r\nsecond_repl_offset:-1\r\nrepl_backlog_active:0\r\nrepl_backlog_size:0\r\nrepl_backlog_first_byte_offset:0\r\nrepl_backlog_histlen:0\r\n",
                r.own_replid
            ));
        }
        Some((h, p)) => {
            let now = unix_ms();
            let last = r.last_io_ms.load(Ordering::Relaxed);
            let ago = if last == 0 {
                -1
            } else {
                (now.saturating_sub(last) / 1000) as i64
            };
            let up = r.link_up();
            o.push_str(&format!(
                "role:slave\r\nmaster_host:{h}\r\nmaster_port:{p}\r\nmaster_link_status:{}\r\nmaster_last_io_seconds_ago:{ago}\r\nmaster_sync_in_progress:{}\r\n",
                if up { "up" } else { "down" },
                u8::from(r.sync_in_progress.load(Ordering::Relaxed)),
            ));
            if !up {
                let since = r.down_since_ms.load(Ordering::Relaxed);
                let secs = if since == 0 {
                    -1
                } else {
                    (now.saturating_sub(since) / 1000) as i64
                };
                o.push_str(&format!("master_link_down_since_seconds:{secs}\r\n"));
            }
            let id = r.replid();
            o.push_str(&format!(
                "slave_read_repl_offset:{off}\r\nslave_repl_offset:{off}\r\nslave_priority:100\r\nslave_read_only:{}\r\nreplica_announced:1\r\nconnected_slaves:0\r\nmaster_failover_state:no-failover\r\nmaster_replid:{}\r\nmaster_replid2:{NO_REPLID}\r\nmaster_repl_offset:{off}\r\nsecond_repl_offset:-1\r\nrepl_backlog_active:0\r\nrepl_backlog_size:0\r\nrepl_backlog_first_byte_offset:0\r\nrepl_backlog_histlen:0\r\n",
                u8::from(r.read_only.load(Ordering::Relaxed)),
                if id.is_empty() { NO_REPLID } else { &id },
            ));
        }
    }
    o.push_str(&format!(
        "nibble_repl_full_syncs:{}\r\nnibble_repl_partial_syncs:{}\r\nnibble_repl_command_errors:{}\r\nnibble_repl_other_db_commands:{}\r\nnibble_repl_last_error:{}\r\n\r\n",
        r.full_syncs.load(Ordering::Relaxed),
        r.partial_syncs.load(Ordering::Relaxed),
        r.command_errors.load(Ordering::Relaxed),
        r.other_db_commands.load(Ordering::Relaxed),
        r.last_error.lock().unwrap_or_else(|e| e.into_inner()),
    ));
    o
}

/// ROLE.
pub fn role(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> commands::CmdResult {
    let rep = &ctx.shared.replica;
    match rep.primary() {
        None => {
            r.array(3);
            r.bulk(b"master");
            r.int(0);
            r.array(0);
        }
        Some((h, p)) => {
            r.array(5);
            r.bulk(b"slave");
            r.bulk(h.as_bytes());
            r.int(i64::from(p));
            r.bulk(
                LinkState::from_u8(rep.state.load(Ordering::Relaxed))
                    .word()
                    .as_bytes(),
            );
            r.int(rep.offset());
        }
    }
    Ok(())
}

/// REPLICAOF host port | NO ONE (and SLAVEOF).
pub fn replicaof(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> commands::CmdResult {
    let rep = &ctx.shared.replica;
    if commands::eq(a[1], "no") && commands::eq(a[2], "one") {
        if rep.primary().is_some() {
            rep.follow(None);
        }
        r.ok();
        return Ok(());
    }
    let port = commands::int_arg(a[2])?;
    let port = u16::try_from(port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or(commands::CmdError::from("ERR Invalid master port"))?;
    let host = String::from_utf8_lossy(a[1]).into_owned();
    if rep.follow(Some((host, port))) {
        r.ok();
    } else {
        r.simple("OK Already connected to specified master");
    }
    Ok(())
}

/// CONFIG GET's replication settings (masterauth only by exact name, as
/// requirepass).
pub fn config_get(sh: &Shared) -> Vec<(&'static str, String)> {
    let r = &sh.replica;
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let of = r
        .primary()
        .map_or(String::new(), |(h, p)| format!("{h} {p}"));
    vec![
        ("replicaof", of.clone()),
        ("slaveof", of),
        (
            "masteruser",
            r.masteruser
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_default(),
        ),
        (
            "replica-read-only",
            yes_no(r.read_only.load(Ordering::Relaxed)),
        ),
        (
            "slave-read-only",
            yes_no(r.read_only.load(Ordering::Relaxed)),
        ),
        (
            "repl-timeout",
            r.repl_timeout_secs.load(Ordering::Relaxed).to_string(),
        ),
    ]
}

/// CONFIG SET of a replication setting: `None` if `name` is not one.
pub fn config_set(sh: &Shared, name: &str, value: &str) -> Option<Result<(), String>> {
    let failed = |why: String| {
        format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {why}")
    };
    let r = &sh.replica;
    Some(match name {
        "masterauth" => {
            *r.masterauth.write().unwrap_or_else(|e| e.into_inner()) =
                (!value.is_empty()).then(|| value.to_string());
            Ok(())
        }
        "masteruser" => {
            *r.masteruser.write().unwrap_or_else(|e| e.into_inner()) =
                (!value.is_empty()).then(|| value.to_string());
            Ok(())
        }
        "replica-read-only" | "slave-read-only" => crate::config::parse_yes_no(name, value)
            .map(|on| r.set_read_only(on))
            .map_err(failed),
        "repl-timeout" => {
            let mut c = ReplicaConfig::default();
            c.apply(name, value)
                .map(|_| {
                    r.repl_timeout_secs
                        .store(c.repl_timeout_secs, Ordering::Relaxed)
                })
                .map_err(failed)
        }
        "replicaof" | "slaveof" => Err(failed("use the REPLICAOF command".into())),
        _ => return None,
    })
}

/// How a link ended.
enum End {
    /// REPLICAOF changed the target, or the server is stopping.
    Stopped,
    /// The link failed; `forget` drops the cached replid (next sync full).
    Failed { why: String, forget: bool },
}

fn fail(why: impl Into<String>) -> End {
    End::Failed {
        why: why.into(),
        forget: false,
    }
}

/// The thread body: follow the target until the server stops.
pub fn run(sh: Arc<Shared>) {
    let r = &sh.replica;
    loop {
        let (primary, gen) = {
            let mut t = r.lock_target();
            loop {
                if sh.stopping.load(Ordering::Acquire) {
                    return;
                }
                if t.primary.is_some() {
                    break;
                }
                t = r
                    .wake
                    .wait_timeout(t, Duration::from_millis(POLL_MS))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            (t.primary.clone().unwrap_or_default(), t.generation)
        };
        let (host, port) = primary;
        match link(&sh, &host, port, gen) {
            End::Stopped => {}
            End::Failed { why, forget } => {
                log::warn!(
                    "replication: link with primary {host}:{port} down: {why}; retrying in {} s",
                    RETRY_MS / 1000
                );
                r.set_error(&why);
                if forget {
                    r.set_replid("");
                }
            }
        }
        r.down();
        let until = Instant::now() + Duration::from_millis(RETRY_MS);
        while Instant::now() < until && !r.stopped(&sh, gen) {
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
    }
}

/// One connection to the primary.
struct Link<'a> {
    sh: &'a Shared,
    sock: TcpStream,
    buf: Vec<u8>,
    /// Scratch for one read (READ_CHUNK_BYTES).
    chunk: Vec<u8>,
    pos: usize,
    gen: u64,
    last_io: Instant,
}

impl Link<'_> {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.sh.replica.repl_timeout_secs.load(Ordering::Relaxed))
    }

    fn send(&mut self, args: &[&[u8]]) -> Result<(), End> {
        let mut m = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            m.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            m.extend_from_slice(a);
            m.extend_from_slice(b"\r\n");
        }
        self.sock
            .write_all(&m)
            .map_err(|e| fail(format!("writing to the primary: {e}")))
    }

    /// Read more bytes (Ok(false): none within [`POLL_MS`]).
    fn fill(&mut self) -> Result<bool, End> {
        if self.sh.replica.stopped(self.sh, self.gen) {
            return Err(End::Stopped);
        }
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > READ_CHUNK_BYTES && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        // Read into the fixed chunk and append only what arrived: no
        // zeroing of a fresh 64 KiB per read.
        match self.sock.read(&mut self.chunk) {
            Ok(0) => Err(fail("connection closed by the primary")),
            Ok(n) => {
                self.buf.extend_from_slice(&self.chunk[..n]);
                self.last_io = Instant::now();
                self.sh
                    .replica
                    .last_io_ms
                    .store(unix_ms(), Ordering::Relaxed);
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if self.last_io.elapsed() > self.timeout() {
                    return Err(fail(format!(
                        "timeout: no data from the primary for {} s (repl-timeout)",
                        self.timeout().as_secs()
                    )));
                }
                Ok(false)
            }
            Err(e) => Err(fail(format!("reading from the primary: {e}"))),
        }
    }

    /// The next line (without CRLF), empty keep-alive lines included.
    fn line(&mut self) -> Result<String, End> {
        loop {
            if let Some(i) = self.buf[self.pos..].iter().position(|&b| b == b'\n') {
                let raw = &self.buf[self.pos..self.pos + i];
                let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
                let s = String::from_utf8_lossy(raw).into_owned();
                self.pos += i + 1;
                return Ok(s);
            }
            if self.buf.len() - self.pos > MAX_LINE_BYTES {
                return Err(fail(format!(
                    "protocol error: a reply line longer than {MAX_LINE_BYTES} bytes"
                )));
            }
            self.fill()?;
        }
    }

    /// The next non-empty line.
    fn reply(&mut self) -> Result<String, End> {
        loop {
            let l = self.line()?;
            if !l.is_empty() {
                return Ok(l);
            }
        }
    }

    /// Send a command and read its one-line reply.
    fn call(&mut self, args: &[&[u8]]) -> Result<String, End> {
        self.send(args)?;
        self.reply()
    }

    /// The RDB payload of a full sync.
    fn payload(&mut self) -> Result<Vec<u8>, End> {
        let head = self.reply()?;
        let Some(spec) = head.strip_prefix('$') else {
            return Err(fail(format!(
                "protocol error: expected the RDB payload ($<len> or $EOF:<mark>), got {:?}",
                shown_line(&head)
            )));
        };
        if let Some(mark) = spec.strip_prefix("EOF:") {
            let mark = mark.as_bytes().to_vec();
            if mark.len() != EOF_MARK_BYTES {
                return Err(fail(format!(
                    "protocol error: EOF mark of {} bytes (expected {EOF_MARK_BYTES})",
                    mark.len()
                )));
            }
            let mut data: Vec<u8> = Vec::new();
            loop {
                let from = data.len().saturating_sub(EOF_MARK_BYTES - 1);
                data.extend_from_slice(&self.buf[self.pos..]);
                self.pos = self.buf.len();
                if let Some(i) = data[from..]
                    .windows(EOF_MARK_BYTES)
                    .position(|w| w == mark.as_slice())
                {
                    let end = from + i;
                    // Bytes after the mark belong to the stream.
                    let rest = data.split_off(end + EOF_MARK_BYTES);
                    data.truncate(end);
                    self.buf.splice(self.pos..self.pos, rest);
                    return Ok(data);
                }
                while !self.fill()? {}
            }
        }
        let len: usize = spec.parse().map_err(|_| {
            fail(format!(
                "protocol error: bad RDB payload length {:?}",
                shown_line(spec)
            ))
        })?;
        let mut data = Vec::with_capacity(len.min(MAX_RESERVE_BYTES));
        loop {
            let take = (len - data.len()).min(self.buf.len() - self.pos);
            data.extend_from_slice(&self.buf[self.pos..self.pos + take]);
            self.pos += take;
            if data.len() == len {
                return Ok(data);
            }
            self.fill().map_err(|e| match e {
                End::Failed { why, forget } => End::Failed {
                    why: format!(
                        "RDB payload truncated: {} of {len} bytes received ({why})",
                        data.len()
                    ),
                    forget,
                },
                e => e,
            })?;
        }
    }
}

/// A line from the primary as a log shows it.
fn shown_line(s: &str) -> String {
    s.chars().take(128).collect()
}

/// Connect, sync, stream; returns how the link ended.
fn link(sh: &Shared, host: &str, port: u16, gen: u64) -> End {
    let r = &sh.replica;
    r.state
        .store(LinkState::Connecting as u8, Ordering::Relaxed);
    let addr = match (host, port).to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => return fail(format!("{host}: no address")),
        Err(e) => return fail(format!("resolving {host}: {e}")),
    };
    let sock = match TcpStream::connect_timeout(&addr, Duration::from_millis(CONNECT_TIMEOUT_MS)) {
        Ok(s) => s,
        Err(e) => return fail(format!("connecting to {addr}: {e}")),
    };
    let _ = sock.set_nodelay(true);
    if let Err(e) = sock
        .set_read_timeout(Some(Duration::from_millis(POLL_MS)))
        .and_then(|_| sock.set_write_timeout(Some(Duration::from_secs(10))))
    {
        return fail(format!("socket options: {e}"));
    }
    log::info!("replication: connected to primary {host}:{port}, handshake");
    let mut l = Link {
        sh,
        sock,
        buf: Vec::new(),
        chunk: vec![0; READ_CHUNK_BYTES],
        pos: 0,
        gen,
        last_io: Instant::now(),
    };
    match handshake(&mut l, host, port) {
        Ok(()) => {}
        Err(e) => return e,
    }
    stream(&mut l, host, port)
}

/// Handshake and (full or partial) sync.
fn handshake(l: &mut Link, host: &str, port: u16) -> Result<(), End> {
    let r = &l.sh.replica;
    r.state.store(LinkState::Handshake as u8, Ordering::Relaxed);
    let pong = l.call(&[b"PING"])?;
    if !pong.starts_with('+') && !pong.starts_with("-NOAUTH") && !pong.starts_with("-NOPERM") {
        return Err(fail(format!(
            "the primary answered PING with {:?}",
            shown_line(&pong)
        )));
    }
    let pass = r
        .masterauth
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let user = r
        .masteruser
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(pass) = pass {
        let ok = match &user {
            Some(u) => l.call(&[b"AUTH", u.as_bytes(), pass.as_bytes()])?,
            None => l.call(&[b"AUTH", pass.as_bytes()])?,
        };
        if !ok.starts_with('+') {
            return Err(fail(format!(
                "the primary refused AUTH (masterauth/masteruser): {}",
                shown_line(&ok)
            )));
        }
    }
    let my_port =
        l.sh.ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .to_string();
    // Errors here are not fatal (Redis goes on too).
    let _ = l.call(&[b"REPLCONF", b"listening-port", my_port.as_bytes()])?;
    let _ = l.call(&[b"REPLCONF", b"capa", b"eof", b"capa", b"psync2"])?;
    let cached = r.replid();
    let off = r.offset();
    let (id, next) = if cached.is_empty() || off < 0 {
        ("?".to_string(), "-1".to_string())
    } else {
        (cached.clone(), (off + 1).to_string())
    };
    let rep = l.call(&[b"PSYNC", id.as_bytes(), next.as_bytes()])?;
    if let Some(rest) = rep.strip_prefix("+FULLRESYNC") {
        let w: Vec<&str> = rest.split_whitespace().collect();
        let (Some(id), Some(off)) = (w.first(), w.get(1).and_then(|o| o.parse::<i64>().ok()))
        else {
            return Err(fail(format!(
                "protocol error: bad FULLRESYNC reply {:?}",
                shown_line(&rep)
            )));
        };
        log::info!("replication: full resync from {host}:{port} (replid {id}, offset {off})");
        full_sync(l, host, port, id, off)?;
    } else if let Some(rest) = rep.strip_prefix("+CONTINUE") {
        if let Some(new_id) = rest.split_whitespace().next() {
            r.set_replid(new_id);
        }
        r.partial_syncs.fetch_add(1, Ordering::Relaxed);
        log::info!(
            "replication: partial resync with {host}:{port} accepted (+CONTINUE), from offset {}",
            off + 1
        );
    } else {
        return Err(fail(format!(
            "the primary answered PSYNC with {:?}",
            shown_line(&rep)
        )));
    }
    Ok(())
}

/// Clears a gate bit when dropped.
struct GateGuard<'a>(&'a Replication, u8);

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        self.0.set_gate_bit(self.1, false);
    }
}

/// Clears `sync_in_progress` when dropped.
struct SyncGuard<'a>(&'a Replication);

impl Drop for SyncGuard<'_> {
    fn drop(&mut self) {
        self.0.sync_in_progress.store(false, Ordering::Relaxed);
    }
}

/// Receive the RDB, check it, flush the dataset and import it.
fn full_sync(l: &mut Link, host: &str, port: u16, id: &str, off: i64) -> Result<(), End> {
    let r = &l.sh.replica;
    r.state.store(LinkState::Sync as u8, Ordering::Relaxed);
    r.sync_in_progress.store(true, Ordering::Relaxed);
    let _sync = SyncGuard(r);
    let t = Instant::now();
    let data = l.payload()?;
    // The checksum first: a damaged payload never touches the dataset.
    if let Err(e) = crate::rdb::decode::check_file(&data) {
        return Err(fail(format!(
            "bad RDB payload from the primary ({} bytes): {e}",
            data.len()
        )));
    }
    if l.sh.replica.stopped(l.sh, l.gen) {
        return Err(End::Stopped);
    }
    r.set_gate_bit(GATE_LOADING, true);
    let _loading = GateGuard(r, GATE_LOADING);
    // From here a failure leaves a partial dataset: the next sync is full.
    r.set_replid("");
    r.offset.store(-1, Ordering::Relaxed);
    let forget = |why: String| End::Failed { why, forget: true };
    crate::commands::admin::flush(l.sh)
        .map_err(|e| forget(format!("flushing the dataset: {e}")))?;
    let source = format!("from primary {host}:{port}");
    let rep = crate::rdb::load::load_bytes(l.sh, &data, &source).map_err(forget)?;
    {
        // Under the target's lock: a REPLICAOF that came during the load
        // has cleared the replid, and must not see this one come back.
        let t = r.lock_target();
        if t.generation != l.gen {
            return Err(End::Stopped);
        }
        r.set_replid(id);
        r.offset.store(off, Ordering::Relaxed);
        r.stream_db.store(0, Ordering::Relaxed);
    }
    r.full_syncs.fetch_add(1, Ordering::Relaxed);
    log::info!(
        "replication: full sync from {host}:{port} done in {:.3} s: {} bytes, {} keys",
        t.elapsed().as_secs_f64(),
        data.len(),
        rep.loaded
    );
    Ok(())
}

/// REPLCONF ACK <offset>.
fn ack(l: &mut Link) -> Result<(), End> {
    let off = l.sh.replica.offset().max(0).to_string();
    l.send(&[b"REPLCONF", b"ACK", off.as_bytes()])
}

/// Apply the command stream until the link ends.
fn stream(l: &mut Link, host: &str, port: u16) -> End {
    let sh = l.sh;
    let r = &sh.replica;
    r.state.store(LinkState::Connected as u8, Ordering::Relaxed);
    r.set_error("");
    log::info!("replication: link with primary {host}:{port} up");
    let info = Arc::new(primary_client(sh, host, port));
    let mut sess = Session::new(info, true);
    sess.primary = true;
    // The link's own counters (the last slot: see `Shared::stats`).
    let Some(stats) = sh.stats.last() else {
        return fail("no counters");
    };
    let mut scratch = Vec::new();
    let mut out = Vec::new();
    let mut parser = Parser::new();
    // Redis's own bounds (512 MiB bulks, 1M arguments): what a 7.0
    // primary can send.
    let limits = Limits::default();
    let mut db = r.stream_db.load(Ordering::Relaxed);
    let mut db_logged = false;
    // Bytes of a MULTI block not yet counted: as Redis, the offset moves
    // past a transaction only at its EXEC, so a link lost inside one
    // resumes at its MULTI (the queue dies with the session).
    let mut in_multi: i64 = 0;
    // The first ACK at once: a diskless primary waits for it.
    if let Err(e) = ack(l) {
        return e;
    }
    let mut last_ack = Instant::now();
    loop {
        loop {
            let pending = &l.buf[l.pos..];
            let req = match parser.parse(pending, &limits) {
                Ok(Parsed::Request(req)) => req,
                Ok(Parsed::Incomplete(_)) => break,
                Err(e) => {
                    return End::Failed {
                        why: format!("protocol error in the command stream: {e}"),
                        forget: true,
                    }
                }
            };
            let args = req.slices(pending);
            let name = args.first().copied().unwrap_or_default();
            let used = req.consumed as i64;
            if commands::eq(name, "replconf")
                && args.get(1).is_some_and(|a| commands::eq(a, "getack"))
            {
                let off = r.offset().max(0).to_string();
                let m = format!(
                    "*3\r\n$8\r\nREPLCONF\r\n$3\r\nACK\r\n${}\r\n{off}\r\n",
                    off.len()
                );
                if let Err(e) = l.sock.write_all(m.as_bytes()) {
                    return fail(format!("writing to the primary: {e}"));
                }
            } else if commands::eq(name, "select") {
                db = args
                    .get(1)
                    .and_then(|a| commands::parse_i64(a))
                    .unwrap_or(0);
                r.stream_db.store(db, Ordering::Relaxed);
                if db != 0 && !db_logged {
                    db_logged = true;
                    log::warn!(
                        "replication: the primary {host}:{port} writes to database {db}; this server has only database 0, so its commands there are skipped"
                    );
                }
            } else if db != 0 && !commands::eq(name, "flushall") {
                r.other_db_commands.fetch_add(1, Ordering::Relaxed);
            } else if !name.is_empty() {
                let mut ctx = Ctx {
                    shared: sh,
                    stats,
                    sess: &mut sess,
                    buf: &mut scratch,
                };
                let mut rep = Reply {
                    out: &mut out,
                    proto: crate::resp::Proto::Resp2,
                };
                commands::execute(&mut ctx, &args, &mut rep);
                if out.first() == Some(&b'-') {
                    r.command_errors.fetch_add(1, Ordering::Relaxed);
                    let end = out.iter().position(|&b| b == b'\r').unwrap_or(out.len());
                    crate::warn_limited!(
                        STREAM_ERR_LOG,
                        "replication: command {} from the primary failed here: {}",
                        commands::shown(name),
                        String::from_utf8_lossy(&out[1..end.min(200)])
                    );
                }
                out.clear();
            }
            drop(args);
            l.pos += req.consumed;
            parser.recycle(req.args);
            if sess.multi.is_some() {
                in_multi += used;
            } else {
                r.offset.fetch_add(in_multi + used, Ordering::Relaxed);
                in_multi = 0;
            }
        }
        if last_ack.elapsed() >= Duration::from_millis(ACK_INTERVAL_MS) {
            if let Err(e) = ack(l) {
                return e;
            }
            last_ack = Instant::now();
        }
        match l.fill() {
            Ok(_) => {}
            Err(e) => return e,
        }
    }
}

/// The primary's client entry (not listed in CLIENT LIST).
fn primary_client(sh: &Shared, host: &str, port: u16) -> ClientInfo {
    ClientInfo::new(
        sh.next_id.fetch_add(1, Ordering::Relaxed),
        format!("{host}:{port}"),
        String::new(),
        2,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings() {
        let mut c = ReplicaConfig::default();
        assert!(c.read_only);
        c.apply("replicaof", "127.0.0.1 6380").unwrap();
        assert_eq!(c.replicaof, Some(("127.0.0.1".into(), 6380)));
        c.apply("slaveof", "no one").unwrap();
        assert_eq!(c.replicaof, None);
        assert!(c.apply("replicaof", "host").is_err());
        assert!(c.apply("replicaof", "host 0").is_err());
        assert!(c.apply("replicaof", "host x").is_err());
        c.apply("replica-read-only", "no").unwrap();
        assert!(!c.read_only);
        assert!(c.apply("repl-timeout", "0").is_err());
        assert_eq!(random_replid().len(), 40);
        // The config file and the flags.
        let mut sc = crate::config::ServerConfig::default();
        sc.apply_file_text("replicaof 10.0.0.1 6390\nmasterauth pw\nslave-read-only no\n")
            .unwrap();
        assert_eq!(sc.replica.replicaof, Some(("10.0.0.1".into(), 6390)));
        assert_eq!(sc.replica.masterauth.as_deref(), Some("pw"));
        assert!(!sc.replica.read_only);
        use clap::Parser as _;
        let cli = crate::config::Cli::parse_from([
            "nibble",
            "--replicaof",
            "h 7000",
            "--masteruser",
            "u",
        ]);
        let sc = crate::config::ServerConfig::from_cli(&cli).unwrap();
        assert_eq!(sc.replica.replicaof, Some(("h".into(), 7000)));
        assert_eq!(sc.replica.masteruser.as_deref(), Some("u"));
    }

    #[test]
    fn gate() {
        let r = Replication::new(&ReplicaConfig::default());
        assert_eq!(r.gate(), 0);
        assert!(r.follow(Some(("h".into(), 1))));
        assert!(!r.follow(Some(("h".into(), 1))));
        assert_eq!(r.gate(), GATE_READONLY);
        r.set_read_only(false);
        assert_eq!(r.gate(), 0);
        r.set_read_only(true);
        assert!(r.follow(None));
        assert_eq!(r.gate(), 0);
        let set = commands::lookup(b"set").unwrap();
        let get = commands::lookup(b"get").unwrap();
        assert_eq!(refused(GATE_READONLY, set), Some(READONLY));
        assert_eq!(refused(GATE_READONLY, get), None);
        assert_eq!(refused(GATE_LOADING, get), Some(LOADING));
        assert_eq!(
            refused(GATE_LOADING, commands::lookup(b"info").unwrap()),
            None
        );
    }
}
