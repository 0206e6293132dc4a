//! Workers: one thread per CPU, pinned, each with its own event loop.
//!
//! ```text
//!   CPU 0                         CPU 1
//!   ┌──────────────────────┐      ┌──────────────────────┐
//!   │ worker 0 (pinned)    │      │ worker 1 (pinned)    │
//!   │ current_thread tokio │      │ current_thread tokio │
//!   │  listener :6379 ─┐   │      │  listener :6379 ─┐   │   same port,
//!   │  conn, conn, ... ◄┘  │      │  conn, conn, ... ◄┘  │   SO_REUSEPORT
//!   └─────────┬────────────┘      └─────────┬────────────┘
//!             └──────── nibble::Store (per-CPU log heads) ┘
//! ```
//!
//! Each worker owns one `SO_REUSEPORT` listening socket per address, so the
//! kernel spreads new connections across workers and no accept lock
//! exists. A connection's requests run on its worker, and the engine's
//! writes go to the log head of that worker's CPU. A TCP connection stays
//! on the worker that accepted it unless key affinity moves it between two
//! batches to the worker that owns the stripe of the key it keeps
//! contending on ([`crate::migrate`]), or, for a loopback client, CPU
//! placement moves it to the worker pinned to the CPU its client runs on
//! ([`crate::steer`]): each worker has a lane (a channel)
//! that a task of its own drains, taking moved sockets into its runtime.
//! Workers share nothing on the request path but the engine and a few
//! relaxed atomics. (A Unix socket
//! cannot be shared with `SO_REUSEPORT`; every worker accepts on a
//! duplicate of the one listening descriptor instead.)
//!
//! The runtime is tokio's `current_thread` flavour driven inside a
//! `LocalSet`, i.e. an epoll loop per thread with tasks that never migrate.
//! We chose it over a hand-written mio loop for the readable async
//! connection code (`conn.rs`), at the cost of a task per connection.
//!
//! A loop turn runs every ready connection's batch and then writes all
//! their replies, one `send` each, from the runtime's `on_thread_park`
//! hook just before it polls epoll again (Redis's `beforeSleep`, see
//! [`crate::outq`]).
//!
//! Workers block in `epoll_wait` when they run out of ready connections;
//! by default they do not busy-poll (`idle-poll-us`, off by default, lets
//! a worker with a CPU to itself poll for a few µs first, see
//! [`crate::idlespin`]). Polling would save wake-ups: Redis reads ~32
//! sockets per `epoll_wait`, a nibble worker ~3, so a nibble worker sleeps
//! and is woken (context switch, IPI, VM exit) far more often, and a task
//! that keeps the `current_thread` scheduler polling epoll with a zero
//! timeout for a few µs after each request cuts voluntary context switches
//! from about 0.5 to 0.1 per request. But where clients share the server's
//! CPUs, the spinning CPU is a client's, and it costs more than the
//! wake-ups it saves: on 2 shared vCPUs with 32 connections a 50 µs spin
//! window raises the server's CPU per request from 8-9 µs to 11 µs and
//! worsens p99 latency, with throughput against Redis and memcached
//! unchanged within noise; shorter windows and `sched_yield` in the spin
//! do no better. A single worker takes the most ready sockets per wake-up
//! and spends the least CPU per request (about 7 µs, as Redis), but its
//! throughput is within the noise of two workers' and it caps a machine
//! whose clients are elsewhere, so the default is one worker per CPU.
//! tokio's knobs do not apply: `event_interval` and `global_queue_interval`
//! pace the runtime's own queue, and every task here lives in the
//! `LocalSet`, which runs up to 61 tasks per poll whatever they are set to;
//! the runtime parks as soon as the `LocalSet` has nothing ready (tokio
//! 1.54, `scheduler/current_thread` and `task/local.rs`).
//!
//! `maxclients` is checked at accept with one shared counter (an accept is
//! rare next to requests); a client over the limit gets
//! `-ERR max number of clients reached` (memcached: `SERVER_ERROR Too many
//! open connections`) and is closed. `maxclients` is kept below the
//! descriptor limit at start (`Server::start`), and should accept still
//! run out of descriptors (`EMFILE`, e.g. a shared store's files), the
//! worker frees the one spare descriptor it holds, accepts, answers the
//! same error, closes, and takes the spare again, so the client gets an
//! answer instead of a hang; accept errors are logged at most twice a
//! second. Protected mode (see [`crate::auth`]) is checked here too: a
//! non-loopback client of a port without authentication gets `DENIED`.
//!
//! A port has one owner. The workers' listeners share it through
//! `SO_REUSEPORT`, but so could another process of the same user, which
//! would then silently take a share of the connections; so before the
//! first listener of a port is bound, [`probe_exclusive`] binds the
//! address once without `SO_REUSEPORT`, which fails with `Address already
//! in use` if anything listens there. (The window between the probe and
//! the group's first bind is a few microseconds; two servers started in
//! that window could still share the port.)

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

use crate::conn::{serve_movable, Carry, Protocol};
use crate::state::{ClientInfo, Shared, WorkerStats};

/// The listening sockets one worker owns.
#[derive(Default)]
pub struct WorkerListeners {
    /// TCP listeners and their protocol.
    pub tcp: Vec<(std::net::TcpListener, Protocol)>,
    /// The Unix listener (a duplicate per worker), RESP.
    pub unix: Option<std::os::unix::net::UnixListener>,
    /// TLS listeners (RESP inside TLS) and their acceptor.
    pub tls: Option<crate::tls::TlsListeners>,
}

/// Fail with `AddrInUse` if anything listens on `addr` (a probe bound
/// without `SO_REUSEPORT`, closed at once).
pub fn probe_exclusive(addr: SocketAddr) -> std::io::Result<()> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.bind(&addr.into())
}

/// Bind a non-blocking `SO_REUSEPORT` TCP listener.
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// Unregisters a client when its connection ends.
pub struct ClientGuard {
    shared: Arc<Shared>,
    worker: usize,
    id: u64,
}

impl ClientGuard {
    /// Move the client's registry entry to worker `to` (a connection
    /// that moves, see [`crate::migrate`]).
    fn rehome(&mut self, to: usize, info: &Arc<ClientInfo>) {
        let map = |w: usize| {
            self.shared.clients[w]
                .map
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        };
        map(self.worker).remove(&self.id);
        map(to).insert(self.id, info.clone());
        self.worker = to;
    }
}

/// A connection on its way to another worker's lane (see
/// [`crate::migrate`]).
pub struct Migrant {
    stream: std::net::TcpStream,
    protocol: Protocol,
    carry: Box<Carry>,
    /// Registered on the new worker already.
    guard: ClientGuard,
}

/// A plain stream that can or cannot leave its worker's runtime.
trait Portable: Sized {
    /// Whether [`Portable::portable`] can succeed.
    const MOVABLE: bool;
    /// The socket, out of this runtime's reactor.
    fn portable(self) -> Option<std::net::TcpStream>;
}

impl Portable for tokio::net::TcpStream {
    const MOVABLE: bool = true;
    fn portable(self) -> Option<std::net::TcpStream> {
        self.into_std().ok()
    }
}

impl Portable for tokio::net::UnixStream {
    const MOVABLE: bool = false;
    fn portable(self) -> Option<std::net::TcpStream> {
        None
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.shared.connected.fetch_sub(1, Ordering::AcqRel);
        self.shared
            .closed_since_trim
            .fetch_add(1, Ordering::Relaxed);
        self.shared.clients[self.worker]
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Admit a client (maxclients) and register it; `None` = refused.
fn admit(
    shared: &Arc<Shared>,
    worker: usize,
    addr: String,
    laddr: String,
) -> Option<(Arc<ClientInfo>, ClientGuard)> {
    let max = shared.settings.maxclients.load(Ordering::Relaxed);
    let n = shared.connected.fetch_add(1, Ordering::AcqRel);
    if n >= max {
        shared.connected.fetch_sub(1, Ordering::AcqRel);
        WorkerStats::bump(&shared.stats[worker].rejected, 1);
        return None;
    }
    WorkerStats::bump(&shared.stats[worker].connections, 1);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let info = Arc::new(ClientInfo::new(id, addr, laddr, 0));
    shared.clients[worker]
        .map
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, info.clone());
    let guard = ClientGuard {
        shared: shared.clone(),
        worker,
        id,
    };
    Some((info, guard))
}

/// A descriptor held back so that an accept that hits `EMFILE` can still
/// answer the client (see the module doc).
struct Spare(Option<std::fs::File>);

impl Spare {
    fn new() -> Spare {
        Spare(std::fs::File::open("/dev/null").ok())
    }
}

fn out_of_fds(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

fn refusal(p: Protocol) -> &'static [u8] {
    match p {
        Protocol::Resp => b"-ERR max number of clients reached\r\n",
        Protocol::Memcached => b"SERVER_ERROR Too many open connections\r\n",
    }
}

/// The result of `accept`, or `None` once shutdown is signalled.
async fn accept_or_stop<T>(
    accept: impl std::future::Future<Output = std::io::Result<T>>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<std::io::Result<T>> {
    tokio::select! {
        r = accept => Some(r),
        _ = shutdown.wait_for(|v| *v) => None,
    }
}

/// A failed accept (`what` says on which listener): logged, then a short
/// pause so a persistent error does not spin.
async fn accept_failed(what: &str, e: &std::io::Error) {
    crate::warn_limited!(crate::auth::ACCEPT_ERR_LOG, "{what}: {e}");
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
}

/// The next connection, or `None` once shutdown is signalled; failed
/// accepts are logged and retried ([`accept_failed`]).
async fn next_conn<T, F>(
    mut accept: impl FnMut() -> F,
    shutdown: &mut watch::Receiver<bool>,
    what: &str,
) -> Option<T>
where
    F: std::future::Future<Output = std::io::Result<T>>,
{
    loop {
        match accept_or_stop(accept(), shutdown).await? {
            Ok(x) => return Some(x),
            Err(e) => accept_failed(what, &e).await,
        }
    }
}

/// Serve an admitted plain (TCP or Unix) connection in a task of its own;
/// its replies are written at the end of the loop turn ([`crate::outq`]).
fn spawn_serve<S>(
    s: S,
    protocol: Protocol,
    shared: &Arc<Shared>,
    worker: usize,
    (info, guard): (Arc<ClientInfo>, ClientGuard),
    shutdown: &watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + AsRawFd + Portable + Unpin + 'static,
{
    let carry = Carry::new(info, shared);
    spawn_conn(s, protocol, shared, worker, carry, None, guard, shutdown);
}

/// Serve a plain connection from `carry` in a task of this worker; if it
/// asks to move (see [`crate::migrate`]), hand it to its new worker's
/// lane, registered there. `moved_at`: when it arrived by a move.
#[allow(clippy::too_many_arguments)]
fn spawn_conn<S>(
    s: S,
    protocol: Protocol,
    shared: &Arc<Shared>,
    worker: usize,
    carry: Box<Carry>,
    moved_at: Option<std::time::Instant>,
    mut guard: ClientGuard,
    shutdown: &watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + AsRawFd + Portable + Unpin + 'static,
{
    let (sh, rx) = (shared.clone(), shutdown.clone());
    tokio::task::spawn_local(async move {
        let fd = s.as_raw_fd();
        let moved = serve_movable(
            s,
            Some(fd),
            protocol,
            sh.clone(),
            worker,
            carry,
            moved_at,
            S::MOVABLE,
            rx,
        )
        .await;
        // Closed, or failed to leave: the guard unregisters the client.
        let Some(m) = moved else { return };
        let Some(stream) = m.stream.portable() else {
            return;
        };
        guard.rehome(m.to, m.carry.info());
        let migrant = Migrant {
            stream,
            protocol,
            carry: m.carry,
            guard,
        };
        // Refused only once the new worker has stopped: the migrant is
        // dropped, which closes the socket and unregisters the client.
        let _ = sh.lanes.send(m.to, migrant);
    });
}

/// Take in the connections that move to this worker (see
/// [`crate::migrate`]) until shutdown; those still in the lane then are
/// dropped with it (closed, unregistered).
async fn receive_moves(
    mut lane: tokio::sync::mpsc::UnboundedReceiver<Migrant>,
    shared: Arc<Shared>,
    worker: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let m = tokio::select! {
            m = lane.recv() => m,
            _ = shutdown.wait_for(|v| *v) => None,
        };
        let Some(m) = m else { return };
        match tokio::net::TcpStream::from_std(m.stream) {
            Ok(s) => {
                WorkerStats::bump(&shared.stats[worker].moved_in, 1);
                let now = Some(std::time::Instant::now());
                spawn_conn(
                    s, m.protocol, &shared, worker, m.carry, now, m.guard, &shutdown,
                );
            }
            Err(e) => log::warn!("worker {worker}: a moving connection could not join: {e}"),
        }
    }
}

async fn accept_tcp(
    l: tokio::net::TcpListener,
    protocol: Protocol,
    shared: Arc<Shared>,
    worker: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut spare = Spare::new();
    loop {
        let Some(r) = accept_or_stop(l.accept(), &mut shutdown).await else {
            return;
        };
        let (mut s, peer) = match r {
            Ok(x) => x,
            Err(e) if out_of_fds(&e) && spare.0.is_some() => {
                crate::warn_limited!(crate::auth::ACCEPT_ERR_LOG, "accept: {e}");
                // Free the spare descriptor to accept and refuse one.
                spare.0 = None;
                if let Ok((mut s, peer)) = l.accept().await {
                    WorkerStats::bump(&shared.stats[worker].rejected, 1);
                    crate::warn_limited!(
                        crate::auth::ACCEPT_ERR_LOG,
                        "refused {peer}: out of file descriptors"
                    );
                    let _ = s.write_all(refusal(protocol)).await;
                    let _ = s.shutdown().await;
                }
                spare = Spare::new();
                continue;
            }
            Err(e) => {
                accept_failed("accept", &e).await;
                continue;
            }
        };
        if shared.settings.denies(protocol, &peer) {
            crate::warn_limited!(
                crate::auth::DENIED_LOG,
                "refused {peer}: protected mode (no authentication on this port, client not on loopback)"
            );
            tokio::task::spawn_local(async move {
                let msg = match protocol {
                    Protocol::Resp => crate::auth::DENIED,
                    Protocol::Memcached => crate::auth::MC_DENIED,
                };
                let _ = s.write_all(msg.as_bytes()).await;
                let _ = s.shutdown().await;
            });
            continue;
        }
        let _ = s.set_nodelay(true);
        let laddr = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
        match admit(&shared, worker, peer.to_string(), laddr) {
            None => {
                crate::warn_limited!(
                    crate::auth::REFUSED_LOG,
                    "refused {peer}: maxclients reached"
                );
                tokio::task::spawn_local(async move {
                    let _ = s.write_all(refusal(protocol)).await;
                    let _ = s.shutdown().await;
                });
            }
            Some(admitted) => spawn_serve(s, protocol, &shared, worker, admitted, &shutdown),
        }
    }
}

/// Accept on a TLS listener: admit at once (maxclients), then the
/// handshake (under its timeout) and the connection run in the
/// connection's own task ([`crate::tls::serve_tls`]).
async fn accept_tls(
    l: tokio::net::TcpListener,
    accept: crate::tls::TlsAccept,
    shared: Arc<Shared>,
    worker: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    while let Some((s, peer)) = next_conn(|| l.accept(), &mut shutdown, "accept (tls)").await {
        let denied = shared.settings.denies(Protocol::Resp, &peer);
        if denied {
            crate::warn_limited!(
                crate::auth::DENIED_LOG,
                "refused {peer} (TLS): protected mode (no password, client not on loopback)"
            );
        }
        let _ = s.set_nodelay(true);
        let laddr = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
        match admit(&shared, worker, peer.to_string(), laddr) {
            // As in Redis: before the handshake no error reply can be
            // sent, so the connection is just closed.
            None => crate::warn_limited!(
                crate::auth::REFUSED_LOG,
                "refused {peer} (TLS): maxclients reached"
            ),
            Some((info, guard)) => {
                let (a, sh, rx) = (accept.clone(), shared.clone(), shutdown.clone());
                tokio::task::spawn_local(async move {
                    crate::tls::serve_tls(a, s, sh, worker, info, denied, rx).await;
                    drop(guard);
                });
            }
        }
    }
}

async fn accept_unix(
    l: tokio::net::UnixListener,
    shared: Arc<Shared>,
    worker: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    while let Some((mut s, _)) = next_conn(|| l.accept(), &mut shutdown, "accept (unix)").await {
        match admit(&shared, worker, "unix".into(), "unix".into()) {
            None => {
                tokio::task::spawn_local(async move {
                    let _ = s.write_all(refusal(Protocol::Resp)).await;
                });
            }
            Some(admitted) => spawn_serve(s, Protocol::Resp, &shared, worker, admitted, &shutdown),
        }
    }
}

/// Run `accept(l)` as a task of this worker if the listener could join
/// its runtime; log why not otherwise.
fn spawn_accept<L, F>(worker: usize, what: &str, l: std::io::Result<L>, accept: impl FnOnce(L) -> F)
where
    F: std::future::Future<Output = ()> + 'static,
{
    match l {
        Ok(l) => {
            tokio::task::spawn_local(accept(l));
        }
        Err(e) => log::error!("worker {worker}: {what} listener: {e}"),
    }
}

/// Body of worker thread `worker`: pin, build the runtime, accept and serve
/// until shutdown. `idle_poll`: how long the worker polls for events after
/// a batch before it sleeps (zero: it does not; see `idlespin`).
pub fn run(
    worker: usize,
    cpu: Option<usize>,
    idle_poll: std::time::Duration,
    shared: Arc<Shared>,
    listeners: WorkerListeners,
) {
    if let Some(cpu) = cpu {
        if let Err(e) = topology::pin_current_thread(cpu) {
            log::warn!("worker {worker}: pinning to CPU {cpu} failed: {e}");
        }
    }
    // Replies deferred in this loop turn go out just before the runtime
    // waits for events again (Redis's `beforeSleep`, see `outq`).
    let park_shared = shared.clone();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .on_thread_park(move || {
            crate::outq::write_pending(&park_shared.stats[worker]);
            crate::idlespin::before_park();
        })
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("worker {worker}: runtime: {e}");
            shared.shutdown();
            return;
        }
    };
    crate::outq::enable_on_this_thread();
    crate::idlespin::enable_on_this_thread(idle_poll);
    let local = tokio::task::LocalSet::new();
    let mut shutdown = shared.shutdown_tx.subscribe();
    local.block_on(&rt, async {
        tokio::task::spawn_local(crate::idlespin::spinner());
        if let Some(lane) = shared.lanes.take_receiver(worker) {
            tokio::task::spawn_local(receive_moves(
                lane,
                shared.clone(),
                worker,
                shutdown.clone(),
            ));
        }
        for (l, p) in listeners.tcp {
            spawn_accept(worker, "TCP", TcpListener::from_std(l), |l| {
                accept_tcp(l, p, shared.clone(), worker, shutdown.clone())
            });
        }
        if let Some(t) = listeners.tls {
            for l in t.listeners {
                spawn_accept(worker, "TLS", TcpListener::from_std(l), |l| {
                    accept_tls(
                        l,
                        t.accept.clone(),
                        shared.clone(),
                        worker,
                        shutdown.clone(),
                    )
                });
            }
        }
        if let Some(u) = listeners.unix {
            spawn_accept(worker, "unix", UnixListener::from_std(u), |l| {
                accept_unix(l, shared.clone(), worker, shutdown.clone())
            });
        }
        let _ = shutdown.wait_for(|v| *v).await;
        crate::stop::trigger();
        // Let connections see the signal and finish their current batch.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    });
    log::debug!("worker {worker} stopped");
}
