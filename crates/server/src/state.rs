//! State shared by all workers, and the per-worker pieces of it.
//!
//! The request path touches only three shared things: the engine (whose
//! operations are themselves lock-free for readers and lock one bucket for
//! writers), the [`Settings`] atomics (relaxed loads), and the counters of
//! the connection's *own* worker. Counters are per worker ([`WorkerStats`])
//! so no cache line is written by two cores; INFO and memcached `stats`
//! add them up when asked.
//!
//! The client registry (for CLIENT LIST) is also per worker: a mutex that
//! only its worker takes on connect and disconnect, and that CLIENT LIST
//! takes briefly on every worker. Per-client fields that change while the
//! client runs (name, library, last command time) live in the client's own
//! [`ClientInfo`].

use std::collections::BTreeMap;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::config::{ServerConfig, Settings};
use crate::engine::Engine;

/// Counters of one worker (written by that worker only).
#[derive(Default)]
pub struct WorkerStats {
    /// Commands processed (both protocols).
    pub commands: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections refused by maxclients.
    pub rejected: AtomicU64,
    /// Reads that found the key.
    pub hits: AtomicU64,
    /// Reads that did not.
    pub misses: AtomicU64,
    /// Writes (memcached cmd_set).
    pub sets: AtomicU64,
    /// Bytes read from clients.
    pub net_in: AtomicU64,
    /// Bytes written to clients.
    pub net_out: AtomicU64,
    /// Connections closed for protocol errors.
    pub proto_errors: AtomicU64,
    /// Commands refused before they ran (unknown, wrong arity, NOAUTH).
    pub rejected_calls: AtomicU64,
    /// RESP write commands run (RDB's changes since the last save).
    pub writes: AtomicU64,
    /// Connections that moved to this worker (see [`crate::migrate`]).
    pub moved_in: AtomicU64,
}

impl WorkerStats {
    /// Add one to a counter (relaxed; only this worker writes it).
    #[inline]
    pub fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// Sums of all workers' counters.
#[derive(Default, Debug, Clone, Copy)]
pub struct StatTotals {
    /// Commands.
    pub commands: u64,
    /// Connections accepted.
    pub connections: u64,
    /// Rejected.
    pub rejected: u64,
    /// Hits.
    pub hits: u64,
    /// Misses.
    pub misses: u64,
    /// Sets.
    pub sets: u64,
    /// Bytes in.
    pub net_in: u64,
    /// Bytes out.
    pub net_out: u64,
    /// Protocol errors.
    pub proto_errors: u64,
    /// Commands refused before they ran.
    pub rejected_calls: u64,
    /// Connections moved between workers (see [`crate::migrate`]).
    pub moved_in: u64,
}

/// What CLIENT LIST shows about one client.
pub struct ClientInfo {
    /// Client id.
    pub id: u64,
    /// Peer address.
    pub addr: String,
    /// Local address.
    pub laddr: String,
    /// Accepted at.
    pub created: Instant,
    /// Last command, ms since `created`.
    pub last_ms: AtomicU64,
    /// RESP version (2 or 3); 0 for memcached.
    pub resp: AtomicU8,
    /// CLIENT SETNAME, SETINFO lib-name, lib-ver, last command.
    pub text: Mutex<ClientText>,
    /// Bytes in the query buffer not yet consumed (at the last read).
    pub qbuf: AtomicU64,
    /// Free bytes in the query buffer (at the last read).
    pub qbuf_free: AtomicU64,
    /// Commands queued in MULTI, -1 outside it.
    pub multi: AtomicI64,
    /// Keys WATCHed.
    pub watch: AtomicU32,
    /// Channels subscribed.
    pub sub: AtomicU32,
    /// Patterns subscribed.
    pub psub: AtomicU32,
    /// Shard channels subscribed.
    pub ssub: AtomicU32,
    /// Bytes of pub/sub messages waiting for it (CLIENT LIST `omem`).
    pub omem: AtomicU64,
    /// The command it is blocked in (CLIENT UNBLOCK).
    pub blocked: parking_lot::Mutex<Option<Arc<crate::blocking::Waiter>>>,
}

/// Mutable strings of a client.
#[derive(Default, Clone)]
pub struct ClientText {
    /// Name.
    pub name: String,
    /// Library name.
    pub lib_name: String,
    /// Library version.
    pub lib_ver: String,
}

impl ClientInfo {
    /// A client just accepted (or the replication link's session): RESP
    /// version `resp`, nothing named, queued, watched or subscribed.
    pub fn new(id: u64, addr: String, laddr: String, resp: u8) -> ClientInfo {
        ClientInfo {
            id,
            addr,
            laddr,
            created: Instant::now(),
            last_ms: Default::default(),
            resp: AtomicU8::new(resp),
            text: Default::default(),
            qbuf: Default::default(),
            qbuf_free: Default::default(),
            multi: AtomicI64::new(-1),
            watch: Default::default(),
            sub: Default::default(),
            psub: Default::default(),
            ssub: Default::default(),
            omem: Default::default(),
            blocked: Default::default(),
        }
    }

    /// One CLIENT LIST line.
    pub fn line(&self) -> String {
        let t = self.text.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let age = self.created.elapsed();
        let idle = age.as_millis() as u64
            - self
                .last_ms
                .load(Ordering::Relaxed)
                .min(age.as_millis() as u64);
        let multi = self.multi.load(Ordering::Relaxed);
        let (sub, psub, ssub) = (
            self.sub.load(Ordering::Relaxed),
            self.psub.load(Ordering::Relaxed),
            self.ssub.load(Ordering::Relaxed),
        );
        // Redis's flags letters: x in MULTI, P subscribed, N for neither.
        let mut flags = String::new();
        if multi >= 0 {
            flags.push('x');
        }
        if sub + psub + ssub > 0 {
            flags.push('P');
        }
        if self.blocked.lock().is_some() {
            flags.push('b');
        }
        if flags.is_empty() {
            flags.push('N');
        }
        format!(
            "id={} addr={} laddr={} fd=-1 name={} age={} idle={} flags={} db=0 sub={} psub={} ssub={} multi={} watch={} qbuf={} qbuf-free={} argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem={} tot-mem=0 events=r cmd=NULL user=default redir=-1 resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            t.name,
            age.as_secs(),
            idle / 1000,
            flags,
            sub,
            psub,
            ssub,
            multi,
            self.watch.load(Ordering::Relaxed),
            self.qbuf.load(Ordering::Relaxed),
            self.qbuf_free.load(Ordering::Relaxed),
            self.omem.load(Ordering::Relaxed),
            self.resp.load(Ordering::Relaxed),
            t.lib_name,
            t.lib_ver
        )
    }
}

/// One worker's registry of clients.
#[derive(Default)]
pub struct WorkerClients {
    /// By id.
    pub map: Mutex<BTreeMap<u64, Arc<ClientInfo>>>,
}

/// Everything the workers share.
pub struct Shared {
    /// The engine (process-private or shared, see [`crate::engine`]).
    pub store: Engine,
    /// Start configuration.
    pub config: ServerConfig,
    /// Run-time settings.
    pub settings: Settings,
    /// Per-worker counters, plus a last one for the replication link's
    /// thread (see [`crate::replica`]).
    pub stats: Vec<WorkerStats>,
    /// Per-worker client registries.
    pub clients: Vec<WorkerClients>,
    /// Connected clients (for maxclients).
    pub connected: AtomicUsize,
    /// Next client id.
    pub next_id: AtomicU64,
    /// Started at.
    pub started: Instant,
    /// Shutdown signal (true = stop).
    pub shutdown_tx: watch::Sender<bool>,
    /// Set once shutdown began.
    pub stopping: AtomicBool,
    /// Ports actually bound (RESP, memcached).
    pub ports: Mutex<(u16, u16)>,
    /// Connections closed since the heap was last trimmed (see
    /// [`crate::trim`]).
    pub closed_since_trim: AtomicU64,
    /// Striped key locks (see [`crate::keylock`]).
    pub keylocks: crate::keylock::KeyLocks,
    /// Clients blocked on keys (see [`crate::blocking`]).
    pub blocking: Arc<crate::blocking::Registry>,
    /// Pub/sub channel registry (see [`crate::pubsub`]).
    pub pubsub: Arc<crate::pubsub::Hub>,
    /// RDB snapshots (see [`crate::rdb`]).
    pub persist: crate::rdb::Persistence,
    /// Replication from a Redis primary (see [`crate::replica`]).
    pub replica: crate::replica::Replication,
    /// `appendfsync` and the flusher (see [`crate::durability`]).
    pub durability: crate::durability::Durability,
    /// The workers' lanes for connections that move (see
    /// [`crate::migrate`]).
    pub lanes: crate::migrate::Lanes<crate::worker::Migrant>,
    /// How hot each key stripe is (see [`crate::migrate::Heat`]).
    pub heat: crate::migrate::Heat,
    /// The worker pinned to each CPU, `usize::MAX` where none; empty when
    /// loopback connections are not steered (see [`crate::steer`]).
    pub cpu_worker: Vec<usize>,
}

impl Shared {
    /// Ask every worker to stop.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        self.shutdown_tx.send_replace(true);
    }

    /// Sum of the workers' counters.
    pub fn totals(&self) -> StatTotals {
        let mut t = StatTotals::default();
        for s in &self.stats {
            let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
            t.commands += l(&s.commands);
            t.connections += l(&s.connections);
            t.rejected += l(&s.rejected);
            t.hits += l(&s.hits);
            t.misses += l(&s.misses);
            t.sets += l(&s.sets);
            t.net_in += l(&s.net_in);
            t.net_out += l(&s.net_out);
            t.proto_errors += l(&s.proto_errors);
            t.rejected_calls += l(&s.rejected_calls);
            t.moved_in += l(&s.moved_in);
        }
        t
    }

    /// All clients, ordered by id.
    pub fn client_list(&self) -> Vec<Arc<ClientInfo>> {
        let mut v: Vec<Arc<ClientInfo>> = self
            .clients
            .iter()
            .flat_map(|w| {
                w.map
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        v.sort_by_key(|c| c.id);
        v
    }
}

/// Unix time in milliseconds.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// VmRSS of this process in bytes, from /proc/self/status.
pub fn rss_bytes() -> u64 {
    vm_rss("/proc/self/status")
}

/// VmRSS in bytes from a `/proc/PID/status` file (0 if unreadable).
pub fn vm_rss(status_path: &str) -> u64 {
    std::fs::read_to_string(status_path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
