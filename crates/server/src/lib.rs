//! # server — the `nibble` server
//!
//! Serves the Nibble engine over the Redis protocol (RESP2, RESP3 and the
//! inline form) and memcached's text protocol, on TCP and a Unix socket.
//!
//! The design in one paragraph: one worker thread per CPU, pinned, each
//! with its own event loop and its own `SO_REUSEPORT` listener
//! ([`worker`]); a connection stays on the worker that accepted it, and its
//! requests are parsed ([`resp`], [`memcache`]) and executed
//! ([`commands`], [`mc_exec`]) on that thread straight against the engine,
//! so writes use that CPU's log head and no lock of the server's own is
//! taken on the request path. Pipelined requests are executed in a batch
//! and answered with one write ([`conn`]). Redis types map onto engine
//! items as described in [`types`]; settings come from flags and a
//! redis.conf-style file ([`config`]); shared counters are per worker
//! ([`state`]).
//!
//! | module | concern |
//! |---|---|
//! | [`auth`] | passwords, memcached authfile, protected mode, pre-AUTH bounds |
//! | [`config`] | flags, config file, run-time settings |
//! | [`resp`] | RESP request parser (resumable), reply writer |
//! | [`memcache`] | memcached text parser |
//! | [`commands`] | Redis command table and handlers |
//! | [`mc_exec`] | memcached command execution |
//! | [`conn`] | one connection's read/execute/write loop |
//! | [`outq`] | replies written at the end of the worker's loop turn (Redis's `beforeSleep`) |
//! | [`idlespin`] | `idle-poll-us`: optional polling before a worker sleeps, off under contention |
//! | [`engine`] | the engine: private `nibble::Store` or shared `nibblejmp` store (`--data-dir`) |
//! | [`eviction`] | `maxmemory-policy`: Redis names over the engine's cache mode, defaults per port |
//! | [`worker`] | threads, pinning, listeners, maxclients |
//! | [`state`] | shared state, per-worker counters, client registry |
//! | [`types`] | string/hash typing and the hash encoding |
//! | [`glob`] | KEYS/SCAN pattern matching |
//! | [`tls`] | TLS on `tls-port` (rustls + ring), its settings and handshake |
//! | [`blocking`] | clients blocked on list/zset keys: per-key FIFO waiters, serving by the pusher |
//! | [`pubsub`] | pub/sub registry and subscriber mailboxes (output buffer limits) |
//! | [`rdb`] | RDB snapshots: SAVE/BGSAVE, import of a `dump.rdb` at start |
//! | [`replica`] | REPLICAOF: replica of a Redis primary (PSYNC, full and partial sync, read-only gate) |
//! | [`durability`] | `appendfsync` for a store on disk: group commit, the flusher thread |
//!
//! ```no_run
//! let cfg = server::config::ServerConfig { port: Some(0), ..Default::default() };
//! let srv = server::Server::start(cfg).unwrap();
//! println!("listening on {}", srv.resp_port().unwrap());
//! srv.shutdown();
//! ```

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod auth;
pub mod blocking;
pub mod coll;
pub mod commands;
pub mod config;
pub mod conn;
pub mod durability;
pub mod engine;
pub mod eviction;
pub mod glob;
pub mod idlespin;
pub mod keylock;
pub mod list;
pub mod longdouble;
pub mod mc_binary;
pub mod mc_exec;
pub mod mc_meta;
pub mod memcache;
pub mod migrate;
pub mod outq;
pub mod packed;
pub mod pubsub;
pub mod rdb;
pub mod replica;
pub mod resp;
pub mod state;
pub mod steer;
pub mod stop;
pub mod tls;
pub mod trim;
pub mod tunables;
pub mod types;
pub mod worker;
pub mod zset;

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::watch;

use crate::config::{ServerConfig, Settings};
use crate::conn::Protocol;
use crate::engine::Engine;
use crate::state::{Shared, WorkerClients, WorkerStats};
use crate::worker::{bind_reuseport, WorkerListeners};

/// Descriptors kept free beyond the clients (redis-server reserves 32):
/// the engine's files, logs, a client being refused.
const RESERVED_FDS: u64 = 32;
/// Descriptors each worker uses of its own (epoll, waker, spare).
const FDS_PER_WORKER: u64 = 4;

/// Open descriptors of this process now.
fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// Fit `maxclients` under the descriptor limit: raise the soft limit
/// towards what `want` clients need (up to the hard limit), and if that is
/// not enough lower the client limit, with a warning. Returns the number
/// of clients the limit allows.
fn fit_maxclients(want: usize, threads: usize) -> io::Result<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct, which `lim` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let overhead = open_fds() + RESERVED_FDS + FDS_PER_WORKER * threads as u64;
    let need = (want as u64).saturating_add(overhead);
    if lim.rlim_cur < need {
        let raised = libc::rlimit {
            rlim_cur: need.min(lim.rlim_max),
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit struct; raising the soft
        // limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = raised.rlim_cur;
        }
    }
    let allowed = lim.rlim_cur.saturating_sub(overhead);
    if allowed == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the open-file limit ({}, ulimit -n) leaves no descriptor for clients: the \
                 server needs {overhead} of its own",
                lim.rlim_cur
            ),
        ));
    }
    Ok(usize::try_from(allowed).unwrap_or(usize::MAX))
}

/// A running server. Dropping it shuts it down and waits for the workers.
pub struct Server {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    resp_port: Option<u16>,
    memcached_port: Option<u16>,
    tls_port: Option<u16>,
    unix: Option<PathBuf>,
}

fn resolve(host: &str, port: u16) -> io::Result<SocketAddr> {
    (host, port).to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot resolve {host}"),
        )
    })
}

/// Bind `threads` listeners per bind address on `port` (0 = the port the
/// first bind picks). Returns them per worker, and the port.
fn bind_all(
    cfg: &ServerConfig,
    port: u16,
    protocol: Protocol,
    per_worker: &mut [WorkerListeners],
) -> io::Result<u16> {
    let mut port = port;
    for host in &cfg.bind {
        if port != 0 {
            let addr = resolve(host, port)?;
            worker::probe_exclusive(addr)
                .map_err(|e| io::Error::new(e.kind(), format!("binding {addr}: {e}")))?;
        }
        for w in per_worker.iter_mut() {
            let addr = resolve(host, port)?;
            let l = bind_reuseport(addr)
                .map_err(|e| io::Error::new(e.kind(), format!("binding {addr}: {e}")))?;
            port = l.local_addr()?.port();
            w.tcp.push((l, protocol));
        }
    }
    Ok(port)
}

/// Bind the TLS listeners like [`bind_all`] binds the RESP ones (`port`
/// on every bind address, one `SO_REUSEPORT` socket per worker) and hand
/// them to the workers with the acceptor. Returns the port.
fn bind_tls(
    cfg: &ServerConfig,
    port: u16,
    accept: &tls::TlsAccept,
    per_worker: &mut [WorkerListeners],
) -> io::Result<u16> {
    let mut bound: Vec<WorkerListeners> = per_worker
        .iter()
        .map(|_| WorkerListeners::default())
        .collect();
    let port = bind_all(cfg, port, Protocol::Resp, &mut bound)?;
    for (w, b) in per_worker.iter_mut().zip(bound) {
        w.tls = Some(tls::TlsListeners {
            accept: accept.clone(),
            listeners: b.tcp.into_iter().map(|(l, _)| l).collect(),
        });
    }
    log::info!(
        "TLS on port {port} (tls-auth-clients {})",
        cfg.tls.auth_clients.name()
    );
    Ok(port)
}

/// Longest a write waits for the engine to free space, ms.
const SERVER_MAX_WRITE_WAIT_MS: u64 = 100;

impl Server {
    /// Create the engine, bind every listener, start the workers.
    pub fn start(cfg: ServerConfig) -> io::Result<Server> {
        let mut cfg = cfg;
        // TLS settings and files are checked before anything is created.
        let tls_accept =
            tls::setup(&cfg).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // A worker thread serves many connections: a write that finds the
        // store full may wait for compaction (helping it) only briefly, or
        // every client of that worker stalls; then it gets -OOM.
        let (store, capacity) = Engine::open(&cfg, SERVER_MAX_WRITE_WAIT_MS)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // A shared store's capacity was fixed when it was created.
        cfg.capacity = capacity;
        // A dump.rdb (or --load-rdb) is imported before any client is
        // served; a bad file stops the start, as in Redis.
        auth::check_ports(&cfg).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut settings = Settings::new(&cfg, store.max_value_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let policy = settings.policy();
        store
            .set_eviction(policy.engine())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if cfg.memcached_port.is_some()
            && !policy.engine().evicts()
            && cfg.maxmemory_policy.is_none()
            && !cfg.memcached_no_evict
        {
            log::info!(
                "maxmemory-policy noeviction (Redis's default, as RESP is served too): memcached                  clients get SERVER_ERROR out of memory when the store is full; set                  --maxmemory-policy allkeys-lru to evict as memcached does"
            );
        }
        let threads = cfg.threads.max(1);
        // The CPU each worker is pinned to (none: not pinned).
        let cpus = topology::allowed_cpus();
        let worker_cpus: Vec<Option<usize>> = (0..threads)
            .map(|i| (cfg.pin && !cpus.is_empty()).then(|| cpus[i % cpus.len()]))
            .collect();
        let mut per_worker: Vec<WorkerListeners> =
            (0..threads).map(|_| WorkerListeners::default()).collect();
        let resp_port = match cfg.port {
            Some(p) => Some(bind_all(&cfg, p, Protocol::Resp, &mut per_worker)?),
            None => None,
        };
        let memcached_port = match cfg.memcached_port {
            Some(p) => Some(bind_all(&cfg, p, Protocol::Memcached, &mut per_worker)?),
            None => None,
        };
        let tls_port = match (&tls_accept, cfg.tls.port) {
            (Some(a), Some(p)) => Some(bind_tls(&cfg, p, a, &mut per_worker)?),
            _ => None,
        };
        // CONFIG GET shows the port bound (the tests' `Some(0)` picks one).
        cfg.tls.port = tls_port;
        if let Some(path) = &cfg.unixsocket {
            let _ = std::fs::remove_file(path);
            let l = std::os::unix::net::UnixListener::bind(path).map_err(|e| {
                io::Error::new(e.kind(), format!("binding {}: {e}", path.display()))
            })?;
            l.set_nonblocking(true)?;
            for w in per_worker.iter_mut() {
                w.unix = Some(l.try_clone()?);
            }
        }
        let ceiling = fit_maxclients(cfg.maxclients, threads)?;
        if ceiling < cfg.maxclients {
            log::warn!(
                "maxclients lowered from {} to {ceiling}: that is what the open-file limit \
                 (ulimit -n) allows; raise it to serve more clients",
                cfg.maxclients
            );
            cfg.maxclients = ceiling;
            settings
                .maxclients
                .store(ceiling, std::sync::atomic::Ordering::Relaxed);
        }
        settings.maxclients_ceiling = ceiling;
        let (tx, _) = watch::channel(false);
        let output_limits = settings.output_limits.clone();
        let shared = Arc::new(Shared {
            store,
            settings,
            // One per worker, and the last for the replication link.
            stats: (0..=threads).map(|_| WorkerStats::default()).collect(),
            clients: (0..threads).map(|_| WorkerClients::default()).collect(),
            connected: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            started: Instant::now(),
            shutdown_tx: tx,
            stopping: AtomicBool::new(false),
            ports: Mutex::new((resp_port.unwrap_or(0), memcached_port.unwrap_or(0))),
            closed_since_trim: AtomicU64::new(0),
            keylocks: keylock::KeyLocks::new(),
            pubsub: Arc::new(pubsub::Hub::with_limits(output_limits)),
            blocking: Arc::new(blocking::Registry::new()),
            persist: rdb::Persistence::new(&cfg),
            replica: replica::Replication::new(&cfg.replica),
            durability: durability::Durability::new(cfg.appendfsync, cfg.data_dir.is_some()),
            config: cfg.clone(),
            lanes: migrate::Lanes::new(threads),
            heat: migrate::Heat::new(),
            cpu_worker: if cfg.steer {
                steer::cpu_to_worker(&worker_cpus)
            } else {
                Vec::new()
            },
        });
        // A dump.rdb (or --load-rdb) is imported before any client is
        // served; a bad file stops the start, as in Redis.
        let loaded = rdb::load::load_at_start(&shared)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let _ = shared.persist.load.set(loaded);
        rdb::persist::start(&shared)?;
        trim::start(&shared)?;
        let mut handles = Vec::with_capacity(threads + 2);
        // The flusher of a store on disk (see `durability`).
        handles.extend(durability::start(&shared)?);
        // The sweeper of dead large collections' nodes (see `coll`).
        let sh = shared.clone();
        handles.push(
            std::thread::Builder::new()
                .name("nibble-sweeper".into())
                .spawn(move || coll::sweeper(sh))?,
        );
        // The replication link (idle until a primary is set).
        let sh = shared.clone();
        handles.push(
            std::thread::Builder::new()
                .name("nibble-replica".into())
                .spawn(move || replica::run(sh))?,
        );
        for (i, l) in per_worker.into_iter().enumerate() {
            let cpu = worker_cpus[i];
            let idle_poll = std::time::Duration::from_micros(cfg.idle_poll_us);
            let sh = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("nibble-worker-{i}"))
                .spawn(move || worker::run(i, cpu, idle_poll, sh, l))?;
            handles.push(h);
        }
        log::info!(
            "nibble {} ready: resp {:?}, memcached {:?}, unix {:?}, {} workers, capacity {} bytes, engine {}",
            env!("CARGO_PKG_VERSION"),
            resp_port,
            memcached_port,
            cfg.unixsocket,
            threads,
            cfg.capacity,
            match shared.store.shared() {
                Some(s) => format!("shared store in {} ({})", s.dir.display(), s.start),
                None => cfg.mode.name().to_string(),
            }
        );
        Ok(Server {
            shared,
            threads: handles,
            resp_port,
            memcached_port,
            tls_port,
            unix: cfg.unixsocket.clone(),
        })
    }

    /// The RESP TCP port.
    pub fn resp_port(&self) -> Option<u16> {
        self.resp_port
    }

    /// The memcached port.
    pub fn memcached_port(&self) -> Option<u16> {
        self.memcached_port
    }

    /// The TLS (RESP) port.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The shared state (engine, settings, counters).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// A receiver that turns true when shutdown begins (SHUTDOWN command
    /// or [`Server::shutdown`]).
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shared.shutdown_tx.subscribe()
    }

    /// Begin shutdown (returns at once).
    pub fn shutdown(&self) {
        self.shared.shutdown();
    }

    /// Shut down and wait for the workers.
    pub fn join(self) {
        drop(self);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.shutdown();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        rdb::persist::at_shutdown(&self.shared);
        if let Some(p) = &self.unix {
            let _ = std::fs::remove_file(p);
        }
        log::info!("nibble stopped");
    }
}
