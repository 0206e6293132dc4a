//! One client connection: read, parse, execute, write — on one thread.
//!
//! A connection is a task on its worker's single-threaded runtime. Its loop
//! is the classic pipelined server loop:
//!
//! ```text
//!   read ──► parse every complete request in the buffer ──► execute each,
//!    ▲        appending replies to the output buffer          │
//!    │                                                        ▼
//!    └──────────────── write the output buffer ◄──── (or when it passes OUT_SOFT)
//! ```
//!
//! so a client that sends 100 pipelined GETs gets 100 replies in one
//! write. Requests run in order on the thread that read them, against the
//! engine directly; nothing is handed to another thread.
//!
//! Bounded buffers, and why a slow client cannot stall others: replies are
//! flushed whenever the output passes [`OUT_SOFT`] bytes, and the
//! connection does not read or execute anything more until the write
//! completes. A client that stops reading therefore stops its own task at
//! its own `write().await` with at most `OUT_SOFT` plus one reply buffered;
//! the worker's other tasks keep running. The input is bounded by
//! `client-query-buffer-limit`, and each request by the parser's limits.
//!
//! Fair turns within a batch: a batch of pipelined requests runs without
//! interruption only for [`EXEC_SLICE`]. Past that (checked every
//! `SLICE_CHECK_EVERY` requests) the replies so far are written, the
//! socket is polled once without waiting, and the task yields to the
//! worker's other connections. A client that has gone (a failed write or
//! read: its socket was reset) has its remaining requests dropped, as
//! redis-server drops the query buffer of a client it frees, so a pipeline
//! of slow requests from a vanished client does not hold its worker. A
//! client that only closed its sending side (`nc` piping a file) still gets
//! every request it sent executed and answered.
//!
//! Pub/sub: a subscribed connection also waits on its mailbox (see
//! [`crate::pubsub`]). Woken by a publisher on any worker, it drains the
//! messages into its output one [`OUT_SOFT`] chunk at a time and writes
//! them; it also drains after every batch. Its writes are abandoned, and
//! the connection closed, once a publisher finds its mailbox over the
//! pub/sub output buffer limit, so a subscriber that never reads cannot
//! keep its task (or the messages) alive. The idle timeout does not apply
//! to it, as in Redis.
//!
//! Blocked clients: a blocking command that found nothing leaves a
//! registered waiter in the session; the batch loop writes the replies so
//! far and awaits the waiter (served, timed out, CLIENT UNBLOCK), its
//! deadline and the socket (see [`crate::blocking`]), so only this task
//! waits; the worker's other connections run. Requests pipelined behind
//! the blocking one are read meanwhile and run after its reply; end of
//! file or a socket error while blocked means the client has gone, and
//! its waiter leaves the queues before anything could be popped for it.
//!
//! Output buffer limits: a subscriber's are its mailbox's (above); for a
//! normal client the hard limit of `client-output-buffer-limit normal`
//! (off by default, as in Redis) closes the connection when one batch's
//! unwritten replies pass it, which here means one reply larger than the
//! limit, since the output is written at every [`OUT_SOFT`] bytes.
//!
//! Moving: between two batches, a TCP connection may leave its worker for
//! the one that owns the key stripe it keeps contending on (see
//! [`crate::migrate`]): its replies so far are written at once, and
//! [`serve_movable`] returns its socket and its [`Carry`] (input buffer
//! with at most an incomplete request, parser, session with any MULTI
//! queue and WATCH records) to be resumed on the new worker. A blocking
//! command that waits on a key another worker owns ends its batch early
//! instead: the connection moves with its waiter and the requests
//! pipelined behind it, and the new worker waits, then runs them before
//! it reads again.
//!
//! A protocol error (RESP) or an unrecoverable one (memcached) is answered
//! with one error line, then this connection alone is closed. The idle
//! `timeout` closes a connection that sent nothing for that long; shutdown
//! closes every connection after its current batch.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::commands::{self, Ctx, Session};
use crate::memcache::{self, McParsed};
use crate::outq::Deferred;
use crate::pubsub::Mailbox;
use crate::resp::{Parsed, Parser, Reply};
use crate::state::{ClientInfo, Shared, WorkerStats};

/// Flush the output once it holds this many bytes.
pub const OUT_SOFT: usize = 64 << 10;
/// Read up to this much at a time once a client sends more than an idle
/// read holds.
const READ_CHUNK: usize = 16 << 10;
/// An idle connection's input buffer, and the read size a connection
/// starts with: a request-reply client never needs more, so 10,000 idle
/// connections hold 10 MB of input buffers, not 160.
const IDLE_READ_BYTES: usize = 1 << 10;
/// An idle connection keeps at most this much output capacity: after a
/// batch that read little and wrote at most this much, a larger output
/// buffer is freed. A batch that wrote more (small requests, large
/// replies: GETs of kilobyte values) keeps up to [`OUT_SOFT`], the size
/// at which output is flushed anyway, since its next batch needs it again
/// and growing it from nothing each batch costs a realloc and a copy per
/// doubling (16 memcached GETs of 1,000-byte values: 8 reallocs, about
/// 1,200 instructions a request, by callgrind). Such a connection holds
/// at most two buffers of `OUT_SOFT` between batches (its own and its
/// deferred-write slot's, see [`crate::outq`]), and frees both, with the
/// scratch buffer values are read into, once no input came for
/// [`SHED_OUT_MS`], as redis-server's `clientsCron` shrinks the buffers
/// of clients that stopped using them.
const IDLE_OUT_BYTES: usize = 4 << 10;
/// How long a connection holding output or scratch buffers larger than
/// [`IDLE_OUT_BYTES`] waits for input before it frees them.
const SHED_OUT_MS: u64 = 1000;
/// Longest stretch of one connection's batch before it yields the worker.
pub const EXEC_SLICE: std::time::Duration = std::time::Duration::from_millis(1);
/// Requests executed between two looks at the clock.
const SLICE_CHECK_EVERY: u32 = 16;

/// Which protocol a listener speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// RESP2/RESP3 and inline.
    Resp,
    /// memcached text.
    Memcached,
}

/// The input buffer: bytes `[start, filled)` are unconsumed. It starts at
/// [`IDLE_READ_BYTES`], reads up to `chunk` bytes at a time (doubling,
/// up to [`READ_CHUNK`], while reads fill what they are offered), and
/// shrinks back when the connection is idle after small reads
/// ([`InBuf::shrink_when_idle`]), as Redis's query buffer does.
struct InBuf {
    data: Vec<u8>,
    start: usize,
    filled: usize,
    /// How much the next read may take.
    chunk: usize,
    /// Bytes the last read returned.
    last_read: usize,
}

impl InBuf {
    fn new() -> InBuf {
        InBuf {
            data: vec![0; IDLE_READ_BYTES],
            start: 0,
            filled: 0,
            chunk: IDLE_READ_BYTES,
            last_read: 0,
        }
    }

    /// Record a read of `n` bytes out of `offered`: a read that took all
    /// it was offered doubles the next one.
    fn note_read(&mut self, n: usize, offered: usize) {
        self.filled += n;
        self.last_read = n;
        if n == offered && self.chunk < READ_CHUNK {
            self.chunk = (self.chunk * 2).min(READ_CHUNK);
        }
    }

    /// With nothing pending and small recent reads, give the buffer's
    /// memory back down to [`IDLE_READ_BYTES`].
    fn shrink_when_idle(&mut self) {
        if self.start == self.filled
            && self.data.len() > IDLE_READ_BYTES
            && self.last_read <= IDLE_READ_BYTES
        {
            self.start = 0;
            self.filled = 0;
            self.chunk = IDLE_READ_BYTES;
            self.data = vec![0; IDLE_READ_BYTES];
        }
    }

    fn pending(&self) -> &[u8] {
        &self.data[self.start..self.filled]
    }

    /// Make room for at least `want` bytes after `start`, moving the
    /// pending bytes to the front when that is cheaper than growing; room
    /// for a full read chunk only while the pending bytes stay within
    /// `cap` (the query buffer limit).
    fn reserve(&mut self, want: usize, cap: usize) {
        if self.start == self.filled {
            self.start = 0;
            self.filled = 0;
        } else if self.start > 0
            && (self.start >= self.data.len() / 2 || self.start + want > self.data.len())
        {
            self.data.copy_within(self.start..self.filled, 0);
            self.filled -= self.start;
            self.start = 0;
        }
        let chunk_end = (self.filled + self.chunk).min(self.start + cap);
        let need = (self.start + want).max(chunk_end).max(self.filled + 1);
        if self.data.len() < need {
            self.data.resize(need, 0);
        }
    }
}

/// Why a read returned nothing useful.
enum ReadEnd {
    Closed,
    Timeout,
    Shutdown,
}

/// What ended a wait for input that did not end the connection.
enum Woken {
    /// Input arrived.
    Input,
    /// Pub/sub messages for this connection (`mail`), or a deferred write
    /// that came up short (`dq`, see [`crate::outq`]): the caller writes.
    Write,
    /// Nothing for [`SHED_OUT_MS`] while the connection held output
    /// buffers of more than [`IDLE_OUT_BYTES`]: the caller frees them.
    Shed,
}

/// Read more input, or learn why the wait ended otherwise ([`Woken`]).
/// `since`: when this wait for input began, from which the idle timeout
/// runs; set here on the first wait that has a timeout (the clock is read
/// only then), kept by a wait resumed after [`Woken::Shed`], cleared by
/// the caller once input or a write ends the wait. `shed`: the connection
/// holds large output buffers, to be freed after [`SHED_OUT_MS`] without
/// input.
#[allow(clippy::too_many_arguments)]
async fn read_more<S: AsyncRead + Unpin>(
    s: &mut S,
    inb: &mut InBuf,
    want: usize,
    cap: usize,
    shared: &Shared,
    stats: &WorkerStats,
    stop: &crate::stop::Waiter,
    mail: Option<&Mailbox>,
    dq: Option<&Deferred>,
    since: &mut Option<tokio::time::Instant>,
    shed: bool,
) -> Result<Woken, ReadEnd> {
    inb.reserve(want, cap);
    // As in Redis, the idle timeout does not apply to subscribers.
    let timeout = match mail {
        Some(_) => None,
        None => shared.settings.idle_timeout(),
    };
    let deadline = timeout.map(|t| *since.get_or_insert_with(tokio::time::Instant::now) + t);
    let buf = &mut inb.data[inb.filled..];
    let offered = buf.len();
    let read = async {
        match deadline {
            Some(d) => tokio::time::timeout_at(d, s.read(buf))
                .await
                .unwrap_or(Err(std::io::ErrorKind::TimedOut.into())),
            None => s.read(buf).await,
        }
    };
    let mail_wake = async {
        match mail {
            Some(m) => m.wake.notified().await,
            None => std::future::pending().await,
        }
    };
    let stall = async {
        match dq {
            Some(d) => d.wait_stalled().await,
            None => std::future::pending().await,
        }
    };
    let idle = async {
        if shed {
            tokio::time::sleep(std::time::Duration::from_millis(SHED_OUT_MS)).await
        } else {
            std::future::pending().await
        }
    };
    // Fixed order: no random start per read, and none of the branches
    // can starve the read (each of the others completes once per event).
    let r = tokio::select! {
        biased;
        _ = stop.wait() => return Err(ReadEnd::Shutdown),
        _ = stall => return Ok(Woken::Write),
        _ = mail_wake => return Ok(Woken::Write),
        r = read => r,
        _ = idle => return Ok(Woken::Shed),
    };
    match r {
        Ok(0) => Err(ReadEnd::Closed),
        Ok(n) => {
            inb.note_read(n, offered);
            WorkerStats::bump(&stats.net_in, n as u64);
            Ok(Woken::Input)
        }
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(ReadEnd::Timeout),
        Err(_) => Err(ReadEnd::Closed),
    }
}

/// Write the output buffer, after the replies still deferred in `dq`
/// (see [`crate::outq`]). A subscriber's write (`mail`) is abandoned,
/// with an error, when its mailbox is killed for passing the output
/// buffer limit (see [`crate::pubsub`]): a client that does not read would
/// otherwise hold its task in this write forever.
async fn flush<S: AsyncWrite + Unpin>(
    s: &mut S,
    out: &mut Vec<u8>,
    stats: &WorkerStats,
    mail: Option<&Mailbox>,
    dq: Option<&Deferred>,
) -> std::io::Result<()> {
    if let Some(d) = dq {
        d.reclaim(out);
    }
    if out.is_empty() {
        return Ok(());
    }
    let write = async {
        s.write_all(out).await?;
        // A no-op on TCP and Unix sockets; TLS may still hold records that
        // the socket did not take (tokio-rustls sends them on flush).
        s.flush().await
    };
    match mail {
        None => write.await?,
        Some(m) => {
            let killed = std::io::Error::other("output buffer limit");
            if m.is_killed() {
                return Err(killed);
            }
            tokio::select! {
                r = write => r?,
                _ = m.kill.notified() => return Err(killed),
            }
        }
    }
    WorkerStats::bump(&stats.net_out, out.len() as u64);
    out.clear();
    if out.capacity() > 4 * OUT_SOFT {
        out.shrink_to(OUT_SOFT);
    }
    Ok(())
}

/// Move a subscriber's waiting messages to the client, one output chunk
/// at a time; `Err` if the connection must close (killed by the output
/// buffer limit, or the write failed).
async fn deliver<S: AsyncWrite + Unpin>(
    s: &mut S,
    out: &mut Vec<u8>,
    stats: &WorkerStats,
    sess: &Session,
    dq: Option<&Deferred>,
) -> std::io::Result<()> {
    let Some(m) = sess.subs.as_ref().map(|x| x.mailbox.clone()) else {
        return flush(s, out, stats, None, dq).await;
    };
    loop {
        if m.is_killed() {
            return Err(std::io::Error::other("output buffer limit"));
        }
        if let Some(d) = dq {
            // Replies deferred before the subscription go first.
            d.reclaim(out);
        }
        let more = m.drain(out, sess.proto, OUT_SOFT);
        flush(s, out, stats, Some(&m), None).await?;
        if !more && !m.has_mail() {
            return Ok(());
        }
    }
}

/// Under `appendfsync always`, wait until a flush covers the writes this
/// connection ran (`dirty`) before their replies go out (group commit,
/// see [`crate::durability`]).
async fn durable(shared: &Shared, dirty: &mut bool) {
    if std::mem::take(dirty) && shared.durability.waits_for_flush() {
        shared.durability.wait_durable().await;
    }
}

/// The mailbox of a subscribed session.
fn mailbox(sess: &Session) -> Option<Arc<Mailbox>> {
    sess.subs.as_ref().map(|x| x.mailbox.clone())
}

/// What one look at the socket, without waiting, found.
enum Peek {
    /// Nothing to read now (or no room under the query buffer limit).
    Nothing,
    /// More request bytes, appended to the input buffer.
    Data,
    /// The socket failed (reset by a client that has gone).
    Gone,
}

/// Poll the socket once, without waiting, for more input or a failure.
async fn peek_input<S: AsyncRead + Unpin>(
    s: &mut S,
    inb: &mut InBuf,
    cap: usize,
    stats: &WorkerStats,
) -> Peek {
    if inb.filled - inb.start >= cap {
        return Peek::Nothing;
    }
    inb.reserve(1, cap);
    let buf = &mut inb.data[inb.filled..];
    let r = std::future::poll_fn(|cx| {
        let mut rb = tokio::io::ReadBuf::new(&mut *buf);
        match std::pin::Pin::new(&mut *s).poll_read(cx, &mut rb) {
            std::task::Poll::Ready(Ok(())) => std::task::Poll::Ready(Some(Ok(rb.filled().len()))),
            std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Some(Err(e))),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        }
    })
    .await;
    match r {
        // End of stream: the client closed its sending side and may still
        // read; its buffered requests run.
        None | Some(Ok(0)) => Peek::Nothing,
        Some(Err(_)) => Peek::Gone,
        Some(Ok(n)) => {
            inb.filled += n;
            WorkerStats::bump(&stats.net_in, n as u64);
            Peek::Data
        }
    }
}

/// What woke a blocked connection.
enum BlockWake {
    /// The waiter's state may have changed.
    Notified,
    /// The timeout passed.
    Deadline,
    /// Read this many bytes (0: the client closed; `None`: failed).
    Read(Option<usize>),
    Shutdown,
}

/// Wait for a blocked command's end (see [`crate::blocking`]): served,
/// timed out, or unblocked, whose reply goes to `out`; false if the
/// client went away (or the server stops) while it waited. Requests the
/// client pipelines meanwhile are read (up to the query buffer limit)
/// and run afterwards, as redis-server does; a read of end-of-file or an
/// error means the client has gone: the waiter leaves every queue before
/// anything could be popped for it.
async fn wait_blocked<S: AsyncRead + Unpin>(
    s: &mut S,
    inb: &mut InBuf,
    cap: usize,
    stats: &WorkerStats,
    shutdown: &mut watch::Receiver<bool>,
    b: &crate::blocking::Blocked,
    out: &mut Vec<u8>,
) -> bool {
    use crate::blocking::Outcome;
    let w = &b.waiter;
    let mut reading = true;
    // The deadline passed while a serve was under way: wait for its end.
    let mut deadline_seen = false;
    loop {
        match w.outcome() {
            Outcome::Served => {
                out.extend_from_slice(&w.take_reply());
                return true;
            }
            Outcome::TimedOut => {
                commands::blocking::timed_out_reply(out, w.proto);
                return true;
            }
            Outcome::Unblocked => {
                crate::resp::Reply {
                    out,
                    proto: w.proto,
                }
                .error(commands::blocking::UNBLOCKED);
                return true;
            }
            Outcome::Pending => {}
        }
        let room = reading && inb.filled - inb.start < cap;
        if room {
            inb.reserve(1, cap);
        }
        let buf = &mut inb.data[inb.filled..];
        let read = async {
            if room {
                s.read(buf).await.ok()
            } else {
                std::future::pending().await
            }
        };
        let deadline = async {
            match b.deadline {
                Some(d) if !deadline_seen => tokio::time::sleep_until(d.into()).await,
                _ => std::future::pending().await,
            }
        };
        let wake = tokio::select! {
            _ = w.wake.notified() => BlockWake::Notified,
            _ = deadline => BlockWake::Deadline,
            n = read => BlockWake::Read(n),
            _ = shutdown.wait_for(|v| *v) => BlockWake::Shutdown,
        };
        match wake {
            BlockWake::Notified => deadline_seen = false,
            BlockWake::Deadline => {
                if !w.time_out() {
                    deadline_seen = true;
                }
            }
            BlockWake::Read(Some(n)) if n > 0 => {
                inb.filled += n;
                WorkerStats::bump(&stats.net_in, n as u64);
            }
            BlockWake::Read(_) | BlockWake::Shutdown => {
                if w.client_gone() {
                    return false;
                }
                // Being served: take the reply, then close.
                reading = false;
            }
        }
    }
}

/// The stripe of a batch's first key, looked up only for the batches
/// that need it: a new connection's first ones, which key affinity places
/// by it ([`crate::migrate`]), and those after which CPU steering checks
/// its client ([`crate::steer`]).
struct FirstKey {
    placing: bool,
    steering: bool,
    /// For key affinity's placement.
    placed: Option<usize>,
    /// For steering's check.
    steered: Option<usize>,
}

impl FirstKey {
    fn new(placing: bool, steering: bool) -> FirstKey {
        FirstKey {
            placing,
            steering,
            placed: None,
            steered: None,
        }
    }

    /// A request ran: if it is the batch's first and a stripe is wanted,
    /// record `stripe()`.
    #[inline]
    fn note(&mut self, stripe: impl FnOnce() -> Option<usize>) {
        if !(self.placing || self.steering) {
            return;
        }
        let st = stripe();
        if std::mem::take(&mut self.placing) {
            self.placed = st;
        }
        if std::mem::take(&mut self.steering) {
            self.steered = st;
        }
    }
}

/// The key stripe of a request's first key (none for a command without
/// keys).
fn first_key_stripe(args: &[&[u8]]) -> Option<usize> {
    let spec = commands::lookup(args.first()?)?;
    let key = commands::key_args(spec, args).next()?;
    Some(crate::keylock::KeyLocks::stripe_of(key))
}

/// redis-server's per-client static reply buffer, which its output
/// buffer limits do not count.
const REDIS_STATIC_REPLY_BYTES: usize = 16 << 10;

/// Is the output past `client-output-buffer-limit normal`'s hard limit
/// (not counting the first [`REDIS_STATIC_REPLY_BYTES`], as Redis)?
/// The output is written whenever it passes [`OUT_SOFT`], so with a
/// limit above that only one reply larger than the limit can take it
/// there; redis-server then closes the client without sending it.
#[inline]
fn over_normal_limit(shared: &Shared, out: &[u8]) -> bool {
    let hard = shared
        .settings
        .output_limits
        .hard(crate::config::OBUF_NORMAL);
    hard > 0 && out.len().saturating_sub(REDIS_STATIC_REPLY_BYTES) as u64 > hard
}

/// Drop up to `skip` pending bytes; true if more remain to be dropped.
fn discard(inb: &mut InBuf, skip: &mut u64) -> bool {
    let n = (inb.filled - inb.start).min(usize::try_from(*skip).unwrap_or(usize::MAX));
    inb.start += n;
    *skip -= n as u64;
    *skip > 0
}

/// A memcached command before the connection authenticated: only the
/// auth `set` (data `username password`) and `quit` are served; returns
/// true if the connection should close.
fn mc_unauthenticated(
    shared: &Shared,
    sess: &mut Session,
    mc_authed: &mut bool,
    cmd: memcache::McCommand<'_>,
    out: &mut Vec<u8>,
) -> bool {
    use memcache::{McCommand, Store, StoreVerb};
    let (reply, close): (&[u8], bool) = match cmd {
        McCommand::Store(Store {
            verb: StoreVerb::Set,
            data,
            ..
        }) => {
            let ok = shared
                .settings
                .mc_users
                .as_ref()
                .is_some_and(|u| u.check(data));
            if ok {
                *mc_authed = true;
                (b"STORED\r\n", false)
            } else {
                sess.auth_failed("memcached authentication");
                (b"CLIENT_ERROR authentication failure\r\n", false)
            }
        }
        McCommand::Quit => (b"", true),
        // An auth `set` over MC_AUTH_MAX_BYTES: its data is not read.
        McCommand::TooLarge { .. } => (b"CLIENT_ERROR unauthenticated bulk length\r\n", true),
        _ => (b"CLIENT_ERROR unauthenticated\r\n", false),
    };
    out.extend_from_slice(reply);
    close
}

/// Wait out a failed authentication's delay (or until shutdown).
#[cold]
async fn penalty(d: std::time::Duration, shutdown: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shutdown.wait_for(|v| *v) => {}
    }
}

/// A connection's state between two batches: what travels with it when
/// it moves to another worker (see [`crate::migrate`]).
pub struct Carry {
    inb: InBuf,
    out: Vec<u8>,
    scratch: Vec<u8>,
    sess: Session,
    /// The memcached side's authentication (its authfile), see `auth`.
    mc_authed: bool,
    parser: Parser,
    /// Input bytes the next request needs at least.
    want: usize,
    /// memcached: bytes of a too-large data block still to discard.
    skip: u64,
    /// memcached: binary protocol (decided by the connection's first byte).
    mc_bin: Option<bool>,
    /// A blocking command that waits, moving to its key's owner to wait
    /// there; the requests pipelined behind it are in `inb`.
    blocked: Option<crate::blocking::Blocked>,
}

impl Carry {
    /// The state of a new connection of client `info`.
    pub fn new(info: Arc<ClientInfo>, shared: &Shared) -> Box<Carry> {
        Box::new(Carry {
            inb: InBuf::new(),
            out: Vec::new(),
            scratch: Vec::new(),
            sess: Session::new(info, shared.settings.password().is_none()),
            mc_authed: shared.settings.mc_users.is_none(),
            parser: Parser::new(),
            want: 1,
            skip: 0,
            mc_bin: None,
            blocked: None,
        })
    }

    /// The client.
    pub fn info(&self) -> &Arc<ClientInfo> {
        &self.sess.info
    }
}

/// A connection that left its worker between two batches: its socket,
/// deregistered from nothing yet, and its state; `to` is its new worker.
pub struct Moved<S> {
    /// The socket (still registered with the old worker's runtime).
    pub stream: S,
    /// The worker to move to.
    pub to: usize,
    /// Everything else.
    pub carry: Box<Carry>,
}

/// Serve one connection until it closes, on this worker. `fd`: the
/// socket of a plain (TCP or Unix) connection, whose replies are then
/// written at the end of the worker's loop turn ([`crate::outq`]); `None`
/// (TLS) writes them at the end of each batch.
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    s: S,
    fd: Option<std::os::fd::RawFd>,
    protocol: Protocol,
    shared: Arc<Shared>,
    worker: usize,
    info: Arc<ClientInfo>,
    shutdown: watch::Receiver<bool>,
) {
    let carry = Carry::new(info, &shared);
    let _ = serve_movable(
        s, fd, protocol, shared, worker, carry, None, false, shutdown,
    )
    .await;
}

/// Serve one connection from state `carry` until it closes, or, if
/// `movable` and more than one worker runs, until key affinity (or DEBUG
/// MIGRATE) asks it to move to another worker between two batches: then
/// its replies so far are written and it is returned (see
/// [`crate::migrate`]). `moved_at`: when it arrived here by a move.
#[allow(clippy::too_many_arguments)]
pub async fn serve_movable<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    fd: Option<std::os::fd::RawFd>,
    protocol: Protocol,
    shared: Arc<Shared>,
    worker: usize,
    carry: Box<Carry>,
    moved_at: Option<std::time::Instant>,
    movable: bool,
    mut shutdown: watch::Receiver<bool>,
) -> Option<Moved<S>> {
    let stats = &shared.stats[worker];
    // Declared after `s`, so dropped (detaching the slot from the socket)
    // before it.
    let deferred = fd.and_then(Deferred::new);
    let dq = deferred.as_ref();
    let Carry {
        mut inb,
        mut out,
        mut scratch,
        mut sess,
        mut mc_authed,
        mut parser,
        mut want,
        mut skip,
        mut mc_bin,
        blocked,
    } = *carry;
    sess.worker = worker;
    let info = sess.info.clone();
    let workers = shared.clients.len();
    let movable = movable && workers > 1;
    let mut affinity = crate::migrate::Affinity::new(moved_at);
    // CPU placement (see `crate::steer`): loopback TCP peers only.
    let steer_fd = fd.filter(|_| {
        movable && !shared.cpu_worker.is_empty() && crate::steer::is_loopback(&info.addr)
    });
    let mut steer = crate::steer::Steer::new();
    // Shutdown as the reads wait for it (see `crate::stop`).
    let stop = crate::stop::Waiter::new();
    // Writes whose replies are not out yet (see `durable`).
    let mut dirty = false;
    // The memcached request just run may have written (reads wait for no
    // flush under `appendfsync always`).
    let mut mc_wrote = false;
    // A blocked client that moved here to wait: wait, then run the rest
    // of its batch before reading more.
    let mut resume = false;
    if let Some(b) = blocked {
        let cap = usize::try_from(shared.settings.query_buffer_limit(sess.authed))
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        let ok = wait_blocked(&mut s, &mut inb, cap, stats, &mut shutdown, &b, &mut out).await;
        *info.blocked.lock() = None;
        drop(b);
        if !ok {
            return None;
        }
        resume = true;
    }
    // When the current wait for input began, if an idle timeout applies
    // (see `read_more`); `None` otherwise and while not waiting.
    let mut idle_since: Option<tokio::time::Instant> = None;
    loop {
        let authed = match protocol {
            Protocol::Resp => sess.authed,
            Protocol::Memcached => mc_authed,
        };
        let qlimit = shared.settings.query_buffer_limit(authed);
        // Never reserve more than the limit allows: a request that needs
        // more fails the check below once the buffer passes the limit.
        let cap = usize::try_from(qlimit)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        let want_now = want.min(cap);
        // Not after a resumed wait: its batch runs on what is buffered.
        if !std::mem::take(&mut resume) {
            let mail = mailbox(&sess);
            let shed = out.capacity() > IDLE_OUT_BYTES
                || scratch.capacity() > IDLE_OUT_BYTES
                || dq.is_some_and(|d| d.spare_capacity() > IDLE_OUT_BYTES);
            match read_more(
                &mut s,
                &mut inb,
                want_now,
                cap,
                &shared,
                stats,
                &stop,
                mail.as_deref(),
                dq,
                &mut idle_since,
                shed,
            )
            .await
            {
                Ok(Woken::Input) => idle_since = None,
                // Pub/sub messages arrived: write them, then wait again.
                Ok(Woken::Write) => {
                    idle_since = None;
                    if deliver(&mut s, &mut out, stats, &sess, dq).await.is_err() {
                        return None;
                    }
                    continue;
                }
                Ok(Woken::Shed) => {
                    if out.is_empty() {
                        out = Vec::new();
                    }
                    scratch = Vec::new();
                    if let Some(d) = dq {
                        d.shed();
                    }
                    continue;
                }
                Err(end) => {
                    if let ReadEnd::Timeout = end {
                        log::debug!("client {} idle timeout", info.id);
                    }
                    let _ = flush(&mut s, &mut out, stats, mail.as_deref(), dq).await;
                    return None;
                }
            }
            if skip > 0 && discard(&mut inb, &mut skip) {
                continue;
            }
            if (inb.filled - inb.start) as u64 > qlimit {
                log::warn!("client {} closed: query buffer limit exceeded", info.id);
                WorkerStats::bump(&stats.proto_errors, 1);
                let msg: &[u8] = match protocol {
                    Protocol::Resp => b"-ERR query buffer limit exceeded\r\n",
                    Protocol::Memcached => b"SERVER_ERROR query buffer limit exceeded\r\n",
                };
                out.extend_from_slice(msg);
                let _ = flush(&mut s, &mut out, stats, mailbox(&sess).as_deref(), dq).await;
                return None;
            }
            if inb.filled - inb.start < want {
                continue;
            }
        }
        info.last_ms
            .store(info.created.elapsed().as_millis() as u64, Ordering::Relaxed);
        info.qbuf
            .store((inb.filled - inb.start) as u64, Ordering::Relaxed);
        info.qbuf_free
            .store((inb.data.len() - inb.filled) as u64, Ordering::Relaxed);
        let mut close = false;
        // Execute every complete request in the buffer. The parser's
        // limits are read once per batch (a CONFIG SET applies from the
        // next one) and again when AUTH lifts the pre-AUTH bounds.
        let mut limits = shared.settings.limits(sess.authed);
        let mut slice_start = std::time::Instant::now();
        crate::idlespin::note_work(slice_start);
        let mut since_check = 0u32;
        if movable {
            // Count only this batch's contended stripes (see `migrate`).
            let _ = crate::keylock::take_contended();
        }
        // The stripe of the batch's first key, when key affinity (a new
        // connection being placed) or steering (a check after this
        // batch) needs it.
        let mut probe = FirstKey::new(
            movable && affinity.placing(),
            movable && steer_fd.is_some() && steer.due(),
        );
        // A blocked command that waits on its key's owner: the batch
        // stops, the connection moves there with it.
        let mut parked: Option<(crate::blocking::Blocked, usize, usize)> = None;
        loop {
            let step = match protocol {
                Protocol::Resp => {
                    if limits.unauthenticated == sess.authed {
                        limits = shared.settings.limits(sess.authed);
                    }
                    match parser.parse(inb.pending(), &limits) {
                        Ok(Parsed::Request(req)) => {
                            let mut ctx = Ctx {
                                shared: &shared,
                                stats,
                                sess: &mut sess,
                                buf: &mut scratch,
                            };
                            let mut r = Reply {
                                out: &mut out,
                                proto: ctx.sess.proto,
                            };
                            req.with_slices(inb.pending(), |args| {
                                probe.note(|| first_key_stripe(args));
                                commands::execute(&mut ctx, args, &mut r)
                            });
                            close = sess.close;
                            if over_normal_limit(&shared, &out) {
                                log::warn!(
                                    "client {} closed for overcoming of output buffer limits ({} bytes pending)",
                                    info.id,
                                    out.len()
                                );
                                return None;
                            }
                            let used = req.consumed;
                            parser.recycle(req.args);
                            Ok(used)
                        }
                        Ok(Parsed::Incomplete(n)) => Err(Some(n)),
                        Err(e) => {
                            log::debug!("client {} protocol error: {e}", info.id);
                            WorkerStats::bump(&stats.proto_errors, 1);
                            out.extend_from_slice(
                                format!("-ERR Protocol error: {e}\r\n").as_bytes(),
                            );
                            close = true;
                            Err(None)
                        }
                    }
                }
                Protocol::Memcached
                    if *mc_bin.get_or_insert_with(|| {
                        inb.pending().first() == Some(&crate::mc_binary::REQ_MAGIC)
                    }) =>
                {
                    use crate::mc_binary::{self, BinConn, BinParsed};
                    // A body holds extras and the key besides the value.
                    let max_body = if mc_authed {
                        shared.settings.max_bulk().saturating_add(512)
                    } else {
                        crate::auth::MC_AUTH_MAX_BYTES
                    };
                    match mc_binary::parse(inb.pending(), max_body, &mut out) {
                        BinParsed::Request(h, used) => {
                            let mut bc = BinConn {
                                authed: &mut mc_authed,
                                auth_failed: false,
                            };
                            // Binary requests are not told apart: a flush covers each.
                            mc_wrote = true;
                            close = mc_binary::execute(
                                &shared,
                                stats,
                                &mut bc,
                                &h,
                                &inb.pending()[..used],
                                &mut out,
                                &mut scratch,
                            );
                            if bc.auth_failed {
                                sess.auth_failed("memcached SASL authentication");
                            }
                            Ok(used)
                        }
                        BinParsed::Incomplete(n) => Err(Some(n)),
                        // Before authentication an oversized body is not
                        // read at all (as the text protocol's auth `set`).
                        BinParsed::Skip(_) if !mc_authed => {
                            close = true;
                            Err(None)
                        }
                        BinParsed::Skip(n) => {
                            skip = n as u64;
                            Ok(mc_binary::HEADER_BYTES)
                        }
                        BinParsed::Fatal => {
                            WorkerStats::bump(&stats.proto_errors, 1);
                            close = true;
                            Err(None)
                        }
                    }
                }
                Protocol::Memcached => {
                    let max_value = if mc_authed {
                        shared.settings.max_bulk()
                    } else {
                        crate::auth::MC_AUTH_MAX_BYTES
                    };
                    match memcache::parse(inb.pending(), max_value) {
                        Ok(McParsed::Command(cmd, used)) if !mc_authed => {
                            close = mc_unauthenticated(
                                &shared,
                                &mut sess,
                                &mut mc_authed,
                                cmd,
                                &mut out,
                            );
                            Ok(used)
                        }
                        Ok(McParsed::Command(cmd, used)) => {
                            if let memcache::McCommand::TooLarge { skip: n } = cmd {
                                skip = n;
                            }
                            probe.note(|| cmd.first_key().map(crate::keylock::KeyLocks::stripe_of));
                            mc_wrote |= cmd.may_write();
                            close = crate::mc_exec::execute(
                                &shared,
                                stats,
                                cmd,
                                &mut out,
                                &mut scratch,
                            );
                            Ok(used)
                        }
                        Ok(McParsed::Incomplete(n)) => Err(Some(n)),
                        Err(e) => {
                            WorkerStats::bump(&stats.proto_errors, 1);
                            out.extend_from_slice(e.0.as_bytes());
                            out.extend_from_slice(b"\r\n");
                            close = true;
                            Err(None)
                        }
                    }
                }
            };
            match step {
                Ok(used) => {
                    inb.start += used;
                    want = 1;
                    if close {
                        break;
                    }
                    if let Some(b) = sess.blocked.take() {
                        let to = movable
                            .then(|| b.waiter.keys.first())
                            .flatten()
                            .filter(|_| skip == 0 && sess.subs.is_none())
                            .and_then(|k| {
                                let stripe = crate::keylock::KeyLocks::stripe_of(k);
                                Some((affinity.on_block(stripe, worker, workers)?, stripe))
                            });
                        if let Some((to, stripe)) = to {
                            // Wait on the key's owner: the move follows.
                            parked = Some((b, to, stripe));
                            break;
                        }
                        // A blocking command found nothing: send what
                        // is answered so far, then wait (this task only).
                        let ok = flush(&mut s, &mut out, stats, mailbox(&sess).as_deref(), dq)
                            .await
                            .is_ok()
                            && wait_blocked(
                                &mut s,
                                &mut inb,
                                cap,
                                stats,
                                &mut shutdown,
                                &b,
                                &mut out,
                            )
                            .await;
                        *info.blocked.lock() = None;
                        drop(b);
                        if !ok {
                            return None;
                        }
                        slice_start = std::time::Instant::now();
                    }
                    if let Some(d) = sess.penalty.take() {
                        // A failed authentication: the reply and the next
                        // request wait (other connections do not).
                        penalty(d, &mut shutdown).await;
                    }
                    if skip > 0 && discard(&mut inb, &mut skip) {
                        break;
                    }
                    dirty |= std::mem::take(&mut sess.dirty) | std::mem::take(&mut mc_wrote);
                    if out.len() >= OUT_SOFT {
                        durable(&shared, &mut dirty).await;
                    }
                    if out.len() >= OUT_SOFT
                        && flush(&mut s, &mut out, stats, mailbox(&sess).as_deref(), dq)
                            .await
                            .is_err()
                    {
                        return None;
                    }
                    since_check += 1;
                    if since_check >= SLICE_CHECK_EVERY {
                        since_check = 0;
                        if slice_start.elapsed() >= EXEC_SLICE {
                            durable(&shared, &mut dirty).await;
                            if deliver(&mut s, &mut out, stats, &sess, dq).await.is_err() {
                                return None;
                            }
                            if let Peek::Gone = peek_input(&mut s, &mut inb, cap, stats).await {
                                log::debug!(
                                    "client {} gone with requests pending; dropped",
                                    info.id
                                );
                                return None;
                            }
                            // tokio skips its park hook while a yielded
                            // task waits: write the other connections'
                            // deferred replies now.
                            crate::outq::write_pending(stats);
                            tokio::task::yield_now().await;
                            slice_start = std::time::Instant::now();
                        }
                    }
                }
                Err(Some(n)) => {
                    want = n;
                    break;
                }
                Err(None) => break,
            }
        }
        if scratch.capacity() > 4 * OUT_SOFT {
            scratch = Vec::new();
        }
        dirty |= std::mem::take(&mut sess.dirty);
        durable(&shared, &mut dirty).await;
        // Where this connection goes between two batches, if anywhere: a
        // blocked wait to its key's owner (chosen in a plain state, see the
        // block above), else the key's worker, else the client's CPU's.
        let moving = if let Some((b, to, stripe)) = parked {
            sess.bound = Some(stripe);
            Some((to, Some(b)))
        } else if movable {
            let contended = crate::keylock::take_contended();
            let to = match sess.move_to.take() {
                Some(t) => Some((t, crate::steer::BOUND_FIXED)),
                None => {
                    affinity.after_batch(contended, probe.placed, worker, workers, &shared.heat)
                }
            };
            // A key's worker wins over the client's CPU while the
            // connection keeps to the key.
            let to = to.map(|(t, stripe)| {
                sess.bound = Some(stripe);
                t
            });
            let to = to.or_else(|| {
                let fd = steer_fd?;
                let t = steer.after_batch(
                    worker,
                    &mut sess.bound,
                    probe.steered,
                    || crate::steer::incoming_cpu(fd),
                    &shared.cpu_worker,
                    moved_at,
                )?;
                // The key's worker wins here too: bound to it from now on.
                let home = probe.steered.filter(|&s| {
                    crate::migrate::owner_of(s, workers) == worker && shared.heat.gathered(s)
                });
                if home.is_some() {
                    sess.bound = home;
                }
                home.is_none().then_some(t)
            });
            // Only in a plain state: nothing to close, skip or deliver.
            let plain = !close && skip == 0 && sess.subs.is_none() && sess.ready.is_empty();
            to.filter(|&t| plain && t != worker).map(|t| (t, None))
        } else {
            None
        };
        if let Some((to, blocked)) = moving {
            // Every reply so far goes out here: nothing stays behind.
            if flush(&mut s, &mut out, stats, None, dq).await.is_err() {
                return None;
            }
            let carry = Box::new(Carry {
                inb,
                out,
                scratch,
                sess,
                mc_authed,
                parser,
                want,
                skip,
                mc_bin,
                blocked,
            });
            return Some(Moved {
                stream: s,
                to,
                carry,
            });
        }
        let wrote = out.len();
        match dq {
            // Written before the worker next waits for events, with the
            // replies of every other connection run in this loop turn.
            Some(d) if !close && sess.subs.is_none() && !d.stalled() => d.defer(&mut out),
            _ => {
                if deliver(&mut s, &mut out, stats, &sess, dq).await.is_err() || close {
                    let _ = s.shutdown().await;
                    return None;
                }
            }
        }
        if inb.start == inb.filled {
            parser.reset();
            inb.shrink_when_idle();
            if out.capacity() > IDLE_OUT_BYTES
                && inb.last_read <= IDLE_READ_BYTES
                && (wrote <= IDLE_OUT_BYTES || out.capacity() > OUT_SOFT)
            {
                out = Vec::new();
            }
        }
    }
}
