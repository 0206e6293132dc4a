//! The load generator of `memlab server`: connections, the closed loop,
//! bulk loading and the churn pattern. See the methodology in `server.rs`.
//!
//! A client thread owns several connections and serves them round-robin
//! with blocking sockets: it sends a batch of `pipeline` requests on every
//! connection, then, connection after connection, reads that connection's
//! whole batch of replies and at once sends its next batch. So every
//! connection always has one batch in flight (a closed loop per connection)
//! and the server sees `connections x pipeline` outstanding requests, while
//! the client needs no event loop. A request's latency is from the moment
//! its batch was written to the moment its reply was parsed, so it includes
//! the wait behind the earlier replies of its batch and, with several
//! connections per thread, the time the thread spent on other connections
//! first: the latency a pipelining client application would see.
//!
//! The next batch on a connection is written only after all replies of the
//! previous one were read, so the server never holds replies the client is
//! not reading while the client blocks writing: no deadlock with blocking
//! sockets, however large the values.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::proto::{self, Expect, Proto, Reply};
use crate::error::{BenchError, Context, Result};
use crate::util::{join_all, Rng};
use crate::ycsb::KeyChooser;

/// Bytes of every key: `"key:"` + 12 decimal digits.
pub const KEY_LEN: usize = 16;
/// Key numbers of the churn phase start here (keys of the throughput
/// phases are below).
pub const CHURN_BASE: u64 = 500_000_000_000;
/// Largest value the generator writes.
pub const MAX_VALUE: usize = 1 << 20;
/// A server silent this long on a connection fails the run.
const IO_TIMEOUT: Duration = Duration::from_secs(15);

/// The key of number `n` (< 10^12).
#[inline]
pub fn key(n: u64) -> [u8; KEY_LEN] {
    let mut k = *b"key:000000000000";
    let mut x = n;
    let mut i = KEY_LEN;
    while x > 0 && i > 4 {
        i -= 1;
        k[i] = b'0' + (x % 10) as u8;
        x /= 10;
    }
    k
}

/// `size` bytes of printable filler (the same bytes for every value).
pub fn filler(size: usize) -> &'static [u8] {
    static F: OnceLock<Vec<u8>> = OnceLock::new();
    let f = F.get_or_init(|| (0..MAX_VALUE).map(|i| b'a' + (i % 26) as u8).collect());
    &f[..size.min(MAX_VALUE)]
}

/// Collections of the collection phases: `COLLECTIONS` keys per type,
/// named by type (`list:`, `set:`, `zset:`, `ctr:`) + 12 digits, apart
/// from the string keys.
pub const COLLECTIONS: u64 = 1000;

/// The key of collection `n` with prefix `p` (4 bytes).
#[inline]
pub fn coll_key(p: &[u8; 4], n: u64) -> [u8; KEY_LEN] {
    let mut k = key(n);
    k[..4].copy_from_slice(p);
    k
}

/// `n` in decimal, written at the end of `buf`.
fn decimal(n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    let mut x = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (x % 10) as u8;
        x /= 10;
        if x == 0 {
            return &buf[i..];
        }
    }
}

/// One request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get(u64),
    /// Key number, value bytes.
    Set(u64, u32),
    /// Key number, value bytes it had (for the live-bytes account).
    Del(u64, u32),
    /// LPUSH list:n, an element of this many bytes.
    LPush(u64, u32),
    /// RPOP list:n (a queue: pushed at the head, popped at the tail).
    RPop(u64),
    /// SADD set:n member.
    SAdd(u64, u64),
    /// SISMEMBER set:n member.
    SIsMember(u64, u64),
    /// ZADD zset:n score member (the score is the member number).
    ZAdd(u64, u64),
    /// ZRANGE zset:n 0 9 (the ten lowest scores).
    ZRange(u64),
    /// MULTI, SET key:k, INCR ctr:(k mod COLLECTIONS), EXEC: four
    /// requests, four replies; its latency is the EXEC's.
    Multi(u64, u32),
    /// LPUSH queue, an element of this many bytes (a producer).
    QPush(u32),
    /// BRPOP queue 1 (a consumer; blocks while the queue is empty).
    QPop,
}

/// The one list of the producer-consumer phase.
const QUEUE_KEY: &[u8] = b"queue";

impl Op {
    fn expect(self) -> Expect {
        match self {
            Op::Get(_) => Expect::Get,
            _ => Expect::Line,
        }
    }

    /// Replies the op's requests get.
    fn replies(self) -> usize {
        match self {
            Op::Multi(..) => 4,
            _ => 1,
        }
    }
}

/// A connection's socket: TCP, or a Unix socket (`memlab shared`).
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// One connection with its buffers and the batch in flight.
pub struct Conn {
    s: Stream,
    proto: Proto,
    rbuf: Vec<u8>,
    rpos: usize,
    rlen: usize,
    wbuf: Vec<u8>,
    /// (op index, op) of the batch in flight, in order.
    inflight: Vec<(usize, Op)>,
    sent_at: Instant,
    /// In the producer-consumer phase: this connection pops (BRPOP)
    /// where the phase asks for pushes.
    consumer: bool,
}

impl Conn {
    pub fn connect(addr: SocketAddr, proto: Proto) -> Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .with_context(|| format!("connect to {addr}"))?;
        s.set_nodelay(true)
            .and_then(|_| s.set_read_timeout(Some(IO_TIMEOUT)))
            .and_then(|_| s.set_write_timeout(Some(IO_TIMEOUT)))
            .context("socket options")?;
        Ok(Conn::with(Stream::Tcp(s), proto))
    }

    /// Connect to a Unix socket (RESP or memcached over `path`).
    pub fn connect_unix(path: &Path, proto: Proto) -> Result<Conn> {
        let s =
            UnixStream::connect(path).with_context(|| format!("connect to {}", path.display()))?;
        s.set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|_| s.set_write_timeout(Some(IO_TIMEOUT)))
            .context("socket options")?;
        Ok(Conn::with(Stream::Unix(s), proto))
    }

    fn with(s: Stream, proto: Proto) -> Conn {
        Conn {
            s,
            proto,
            rbuf: vec![0; 64 << 10],
            rpos: 0,
            rlen: 0,
            wbuf: Vec::with_capacity(64 << 10),
            inflight: Vec::new(),
            sent_at: Instant::now(),
            consumer: false,
        }
    }

    pub fn proto(&self) -> Proto {
        self.proto
    }

    fn flush(&mut self) -> Result<()> {
        let r = self.s.write_all(&self.wbuf);
        self.wbuf.clear();
        r.context("send")
    }

    /// Read more bytes into the receive buffer.
    fn fill(&mut self) -> Result<()> {
        if self.rpos == self.rlen {
            self.rpos = 0;
            self.rlen = 0;
        } else if self.rpos > 0 && self.rlen + 4096 > self.rbuf.len() {
            self.rbuf.copy_within(self.rpos..self.rlen, 0);
            self.rlen -= self.rpos;
            self.rpos = 0;
        }
        if self.rbuf.len() - self.rlen < 4096 {
            let n = self.rbuf.len() * 2;
            self.rbuf.resize(n, 0);
        }
        match self.s.read(&mut self.rbuf[self.rlen..]) {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(n) => {
                self.rlen += n;
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(format!("no reply within {} s", IO_TIMEOUT.as_secs()).into())
            }
            Err(e) => Err(BenchError::io("receive", e)),
        }
    }

    /// Parse the next reply (reading as needed) and hand it to `f`.
    fn reply<R>(&mut self, expect: Expect, f: impl FnOnce(Reply<'_>) -> R) -> Result<R> {
        loop {
            match proto::parse(self.proto, expect, &self.rbuf[self.rpos..self.rlen])? {
                Some((r, used)) => {
                    let out = f(r);
                    self.rpos += used;
                    return Ok(out);
                }
                None => self.fill()?,
            }
        }
    }

    /// Send one command and wait for its reply (for control commands:
    /// PING, DBSIZE, INFO, stats, FLUSHALL).
    pub fn call<R>(
        &mut self,
        expect: Expect,
        args: &[&[u8]],
        f: impl FnOnce(Reply<'_>) -> R,
    ) -> Result<R> {
        debug_assert!(self.inflight.is_empty());
        proto::enc_cmd(self.proto, &mut self.wbuf, args);
        self.flush()?;
        self.reply(expect, f)
    }

    /// Queue one command without sending it; [`Conn::send_queued`] sends
    /// the queue and reads the replies (a pipelined batch of arbitrary
    /// commands, for bulk loads with values the generator's ops cannot
    /// describe).
    pub fn queue(&mut self, args: &[&[u8]]) {
        debug_assert!(self.inflight.is_empty());
        proto::enc_cmd(self.proto, &mut self.wbuf, args);
    }

    /// Queue a SET of `key` with a time to live (seconds; 0 = none).
    pub fn queue_set_ttl(&mut self, key: &[u8], value: &[u8], ttl_secs: u32) {
        debug_assert!(self.inflight.is_empty());
        proto::enc_set_ttl(self.proto, &mut self.wbuf, key, value, ttl_secs);
    }

    /// Queue a GET of `key`.
    pub fn queue_get(&mut self, key: &[u8]) {
        debug_assert!(self.inflight.is_empty());
        proto::enc_get(self.proto, &mut self.wbuf, key);
    }

    /// Send the queued commands and read `n` replies (one per queued
    /// command), handing each to `f` in order.
    pub fn send_queued(
        &mut self,
        n: usize,
        expect: Expect,
        mut f: impl FnMut(Reply<'_>),
    ) -> Result<()> {
        self.flush()?;
        for _ in 0..n {
            self.reply(expect, &mut f)?;
        }
        Ok(())
    }

    fn encode(&mut self, op: Op) {
        let p = self.proto;
        let w = &mut self.wbuf;
        let mut num = [0u8; 20];
        match op {
            Op::Get(k) => proto::enc_get(p, w, &key(k)),
            Op::Set(k, n) => proto::enc_set(p, w, &key(k), filler(n as usize)),
            Op::Del(k, _) => proto::enc_del(p, w, &key(k)),
            Op::LPush(l, n) => {
                proto::enc_cmd(p, w, &[b"LPUSH", &coll_key(b"list", l), filler(n as usize)])
            }
            Op::RPop(l) => proto::enc_cmd(p, w, &[b"RPOP", &coll_key(b"list", l)]),
            Op::SAdd(c, m) => proto::enc_cmd(
                p,
                w,
                &[b"SADD", &coll_key(b"set:", c), decimal(m, &mut num)],
            ),
            Op::SIsMember(c, m) => proto::enc_cmd(
                p,
                w,
                &[b"SISMEMBER", &coll_key(b"set:", c), decimal(m, &mut num)],
            ),
            Op::ZAdd(c, m) => {
                let m = decimal(m, &mut num);
                proto::enc_cmd(p, w, &[b"ZADD", &coll_key(b"zset", c), m, m])
            }
            Op::ZRange(c) => proto::enc_cmd(p, w, &[b"ZRANGE", &coll_key(b"zset", c), b"0", b"9"]),
            Op::QPush(n) => proto::enc_cmd(p, w, &[b"LPUSH", QUEUE_KEY, filler(n as usize)]),
            Op::QPop => proto::enc_cmd(p, w, &[b"BRPOP", QUEUE_KEY, b"1"]),
            Op::Multi(k, n) => {
                proto::enc_cmd(p, w, &[b"MULTI"]);
                proto::enc_set(p, w, &key(k), filler(n as usize));
                proto::enc_cmd(p, w, &[b"INCR", &coll_key(b"ctr:", k % COLLECTIONS)]);
                proto::enc_cmd(p, w, &[b"EXEC"]);
            }
        }
    }

    /// Ask `next` for the next batch, send it; false when there is none.
    fn refill(&mut self, next: &mut impl FnMut(&mut Vec<(usize, Op)>)) -> Result<bool> {
        self.inflight.clear();
        next(&mut self.inflight);
        if self.inflight.is_empty() {
            return Ok(false);
        }
        if self.consumer {
            for x in &mut self.inflight {
                if let Op::QPush(_) = x.1 {
                    x.1 = Op::QPop;
                }
            }
        }
        for i in 0..self.inflight.len() {
            let op = self.inflight[i].1;
            self.encode(op);
        }
        self.sent_at = Instant::now();
        self.flush()?;
        Ok(true)
    }
}

/// Drive `conns` until `next` has no more batches: every connection keeps
/// one batch in flight; `on_reply(op index, op, part, reply, latency,
/// now)` sees every reply (`part` counts the replies of a multi-request
/// op from 0).
fn drive(
    conns: &mut [Conn],
    mut next: impl FnMut(&mut Vec<(usize, Op)>),
    mut on_reply: impl FnMut(usize, Op, usize, &Reply<'_>, Duration, Instant),
) -> Result<()> {
    let mut active = 0;
    for c in conns.iter_mut() {
        if c.refill(&mut next)? {
            active += 1;
        }
    }
    while active > 0 {
        for c in conns.iter_mut() {
            if c.inflight.is_empty() {
                continue;
            }
            let batch = std::mem::take(&mut c.inflight);
            let sent = c.sent_at;
            for &(i, op) in &batch {
                for part in 0..op.replies() {
                    c.reply(op.expect(), |r| {
                        let now = Instant::now();
                        let lat = now.saturating_duration_since(sent);
                        on_reply(i, op, part, &r, lat, now);
                    })?;
                }
            }
            c.inflight = batch;
            if !c.refill(&mut next)? {
                active -= 1;
            }
        }
    }
    Ok(())
}

/// Split `conns` into at most `threads` groups of nearly equal size.
fn groups(conns: &mut [Conn], threads: usize) -> Vec<&mut [Conn]> {
    let t = threads.clamp(1, conns.len().max(1));
    let per = conns.len().div_ceil(t).max(1);
    conns.chunks_mut(per).collect()
}

// ---------------------------------------------------------------------------
// The closed loop

/// Which requests a measured phase sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixKind {
    /// GET (read) and SET (write) on the string keys.
    Kv,
    /// RPOP (read) and LPUSH (write) on `COLLECTIONS` lists.
    List,
    /// SISMEMBER (read) and SADD (write) on `COLLECTIONS` sets.
    Set,
    /// ZRANGE 0 9 (read) and ZADD (write) on `COLLECTIONS` sorted sets.
    ZSet,
    /// MULTI, SET, INCR, EXEC (no reads).
    Multi,
    /// Producer-consumer on one list: even connections LPUSH, odd ones
    /// BRPOP with a 1 s timeout (blocked while the list is empty).
    Queue,
}

/// What a measured phase sends.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    pub kind: MixKind,
    /// Share of reads (GET, RPOP, SISMEMBER, ZRANGE); the rest are writes
    /// of `value_size` bytes.
    pub read_ratio: f64,
    pub value_size: usize,
    pub chooser: KeyChooser,
    pub pipeline: usize,
}

/// What a measured phase saw, summed over threads.
pub struct PhaseOut {
    /// Requests answered inside the measured window.
    pub ops: u64,
    pub gets: u64,
    pub sets: u64,
    /// GETs of a loaded key that found nothing.
    pub misses: u64,
    /// GETs that returned a value of the wrong length.
    pub bad_values: u64,
    /// Error replies (`-ERR`, `-OOM`, `SERVER_ERROR`, ...) and SETs that
    /// were not stored.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Latency of every answered request in the window, ns.
    pub hist: Histogram<u64>,
    pub secs: f64,
}

impl PhaseOut {
    fn new(secs: f64) -> Result<PhaseOut> {
        Ok(PhaseOut {
            ops: 0,
            gets: 0,
            sets: 0,
            misses: 0,
            bad_values: 0,
            errors: 0,
            first_error: None,
            hist: latency_hist()?,
            secs,
        })
    }

    fn add(&mut self, o: PhaseOut) -> Result<()> {
        self.ops += o.ops;
        self.gets += o.gets;
        self.sets += o.sets;
        self.misses += o.misses;
        self.bad_values += o.bad_values;
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        self.hist.add(&o.hist).context("histogram")
    }

    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.secs
    }

    /// Latency at quantile `q`, ns (0 when nothing was measured).
    pub fn p_ns(&self, q: f64) -> u64 {
        if self.hist.is_empty() {
            0
        } else {
            self.hist.value_at_quantile(q)
        }
    }
}

/// Latencies of 1 ns to 100 s, 3 significant digits.
pub fn latency_hist() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).context("histogram")
}

/// Run `mix` on `conns` with `threads` client threads: `warmup`
/// unmeasured, then `measure` measured; then drain.
pub fn run_phase(
    conns: &mut [Conn],
    threads: usize,
    mix: &Mix,
    warmup: Duration,
    measure: Duration,
    seed: u64,
) -> Result<PhaseOut> {
    let start = Instant::now() + warmup;
    let end = start + measure;
    let secs = measure.as_secs_f64();
    for (i, c) in conns.iter_mut().enumerate() {
        c.consumer = mix.kind == MixKind::Queue && i % 2 == 1;
    }
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = groups(conns, threads)
            .into_iter()
            .enumerate()
            .map(|(t, g)| {
                s.spawn(move || phase_worker(g, mix, start, end, secs, seed * 1000 + t as u64))
            })
            .collect();
        join_all(handles)
    })?;
    let mut total = PhaseOut::new(secs)?;
    for r in results {
        total.add(r)?;
    }
    Ok(total)
}

fn phase_worker(
    conns: &mut [Conn],
    mix: &Mix,
    start: Instant,
    end: Instant,
    secs: f64,
    seed: u64,
) -> Result<PhaseOut> {
    let mut out = PhaseOut::new(secs)?;
    let mut rng = Rng::new(seed);
    let size = mix.value_size as u32;
    let next = |batch: &mut Vec<(usize, Op)>| {
        if Instant::now() >= end {
            return;
        }
        for _ in 0..mix.pipeline {
            let k = mix.chooser.next(&mut rng);
            let read = mix.read_ratio >= 1.0 || rng.next_f64() < mix.read_ratio;
            let c = k % COLLECTIONS;
            let op = match (mix.kind, read) {
                (MixKind::Kv, true) => Op::Get(k),
                (MixKind::Kv, false) => Op::Set(k, size),
                (MixKind::List, true) => Op::RPop(c),
                (MixKind::List, false) => Op::LPush(c, size),
                (MixKind::Set, true) => Op::SIsMember(c, k),
                (MixKind::Set, false) => Op::SAdd(c, k),
                (MixKind::ZSet, true) => Op::ZRange(c),
                (MixKind::ZSet, false) => Op::ZAdd(c, k),
                (MixKind::Multi, _) => Op::Multi(k, size),
                (MixKind::Queue, _) => Op::QPush(size),
            };
            batch.push((0, op));
        }
    };
    let err = |out: &mut PhaseOut, r: &Reply<'_>| {
        out.errors += 1;
        if out.first_error.is_none() {
            out.first_error = Some(r.describe());
        }
    };
    let on_reply = |_: usize, op: Op, part: usize, r: &Reply<'_>, lat: Duration, now: Instant| {
        let ok = match (op, part) {
            (Op::Get(_), _) => match r {
                Reply::Value(v) if v.len() == mix.value_size => true,
                Reply::Value(_) => {
                    out.bad_values += 1;
                    true
                }
                Reply::Nil => {
                    out.misses += 1;
                    true
                }
                _ => false,
            },
            (Op::Set(..) | Op::Del(..), _) => r.is_stored(),
            (Op::RPop(_), _) => matches!(r, Reply::Value(_) | Reply::Nil),
            (Op::LPush(..) | Op::SAdd(..) | Op::SIsMember(..) | Op::ZAdd(..), _) => {
                matches!(r, Reply::Int(_))
            }
            (Op::ZRange(_), _) => matches!(r, Reply::Array(_)),
            (Op::QPush(_), _) => matches!(r, Reply::Int(_)),
            (Op::QPop, _) => match r {
                // An element, or the 1 s timeout (at the phase's end).
                Reply::Array(2) | Reply::Nil => true,
                _ => false,
            },
            (Op::Multi(..), 0) => r.is_stored(),
            (Op::Multi(..), 1 | 2) => matches!(r, Reply::Status(b"QUEUED")),
            (Op::Multi(..), _) => matches!(r, Reply::Array(2)),
        };
        if !ok {
            err(&mut out, r);
        }
        // A multi-request op counts once, at its last reply.
        if part + 1 == op.replies() && now >= start && now < end {
            out.ops += 1;
            match op {
                Op::Get(_) | Op::RPop(_) | Op::SIsMember(..) | Op::ZRange(_) | Op::QPop => {
                    out.gets += 1
                }
                _ => out.sets += 1,
            }
            // Saturates at the histogram's top (100 s).
            let ns = (lat.as_nanos() as u64).clamp(1, 100_000_000_000);
            let _ = out.hist.record(ns);
        }
    };
    drive(conns, next, on_reply)?;
    Ok(out)
}

// ---------------------------------------------------------------------------
// Bulk work: the preload and the churn

/// What a list of bulk ops did.
#[derive(Default, Debug)]
pub struct BulkOut {
    /// Indices (into the op list) of SETs not stored and DELs that found
    /// no key.
    pub failed: Vec<usize>,
    pub errors: u64,
    pub first_error: Option<String>,
    pub secs: f64,
}

/// Send `ops` as fast as the server takes them: `pipeline` per batch on
/// every connection, `threads` client threads, each with a contiguous
/// share of `ops`.
pub fn run_bulk(
    conns: &mut [Conn],
    threads: usize,
    ops: &[Op],
    pipeline: usize,
) -> Result<BulkOut> {
    let t0 = Instant::now();
    let gs = groups(conns, threads);
    let per = ops.len().div_ceil(gs.len()).max(1);
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = gs
            .into_iter()
            .enumerate()
            .map(|(t, g)| {
                let lo = (t * per).min(ops.len());
                let hi = ((t + 1) * per).min(ops.len());
                s.spawn(move || bulk_worker(g, &ops[lo..hi], lo, pipeline))
            })
            .collect();
        join_all(handles)
    })?;
    let mut total = BulkOut {
        secs: t0.elapsed().as_secs_f64(),
        ..BulkOut::default()
    };
    for r in results {
        total.failed.extend(r.failed);
        total.errors += r.errors;
        if total.first_error.is_none() {
            total.first_error = r.first_error;
        }
    }
    total.failed.sort_unstable();
    Ok(total)
}

fn bulk_worker(conns: &mut [Conn], ops: &[Op], base: usize, pipeline: usize) -> Result<BulkOut> {
    let mut out = BulkOut::default();
    let mut at = 0;
    let next = |batch: &mut Vec<(usize, Op)>| {
        let hi = (at + pipeline.max(1)).min(ops.len());
        batch.extend((at..hi).map(|i| (base + i, ops[i])));
        at = hi;
    };
    let on_reply = |i: usize, op: Op, _: usize, r: &Reply<'_>, _: Duration, _: Instant| {
        let ok = match op {
            Op::Set(..) => r.is_stored(),
            Op::Del(..) => r.is_deleted(),
            Op::Get(_) => matches!(r, Reply::Value(_)),
            // Bulk lists hold string ops only.
            _ => !matches!(r, Reply::Error(_)),
        };
        if !ok {
            out.failed.push(i);
            if matches!(r, Reply::Error(_)) || matches!(op, Op::Set(..)) {
                out.errors += 1;
                if out.first_error.is_none() {
                    out.first_error = Some(r.describe());
                }
            }
        }
    };
    drive(conns, next, on_reply)?;
    Ok(out)
}

/// The preload: SET every key `0..keys` to `value_size` bytes.
pub fn preload_ops(keys: u64, value_size: usize) -> Vec<Op> {
    (0..keys).map(|k| Op::Set(k, value_size as u32)).collect()
}

/// The churn pattern (the destructive pattern of `memlab frag`, over the
/// network): insert values of `sizes_a` until live data reaches `target`
/// bytes, delete `delete_permille` of them at random, insert values of
/// `sizes_b` until live data is back at `target`.
#[derive(Clone, Copy, Debug)]
pub struct ChurnSpec {
    pub target: u64,
    pub sizes_a: (u32, u32),
    pub sizes_b: (u32, u32),
    pub delete_permille: u64,
    pub pipeline: usize,
    pub seed: u64,
}

/// What the churn left.
#[derive(Debug, Default)]
pub struct ChurnOut {
    /// Key + value bytes of the keys the generator knows are live.
    pub live_bytes: u64,
    pub live_keys: u64,
    /// Ops sent in all three steps.
    pub ops: u64,
    /// SETs the server refused (OOM) and DELs of keys that were gone.
    pub failed: u64,
    pub first_error: Option<String>,
    pub secs: f64,
}

pub fn churn(conns: &mut [Conn], threads: usize, spec: &ChurnSpec) -> Result<ChurnOut> {
    let t0 = Instant::now();
    let mut c = Churner {
        conns,
        threads,
        spec,
        rng: Rng::new(spec.seed),
        next_key: CHURN_BASE,
        live: Vec::new(),
        out: ChurnOut::default(),
    };
    // Step 1: fill with sizes A.
    c.insert_to_target(spec.sizes_a)?;
    // Step 2: delete most of them, at random.
    for i in (1..c.live.len()).rev() {
        let j = c.rng.range(0, i as u64 + 1) as usize;
        c.live.swap(i, j);
    }
    let ndel = (c.live.len() as u64 * spec.delete_permille / 1000) as usize;
    let ops: Vec<Op> = c.live[..ndel].iter().map(|&(k, n)| Op::Del(k, n)).collect();
    c.bulk(&ops)?;
    // A failed DEL found no key: it is not live either way.
    c.live.drain(..ndel);
    // Step 3: back to the target with sizes B.
    c.insert_to_target(spec.sizes_b)?;
    let mut out = c.out;
    out.live_keys = c.live.len() as u64;
    out.live_bytes = live_bytes(&c.live);
    out.secs = t0.elapsed().as_secs_f64();
    Ok(out)
}

/// The churn between its steps.
struct Churner<'a> {
    conns: &'a mut [Conn],
    threads: usize,
    spec: &'a ChurnSpec,
    rng: Rng,
    next_key: u64,
    /// (key, value bytes) of the keys the server holds.
    live: Vec<(u64, u32)>,
    out: ChurnOut,
}

impl Churner<'_> {
    /// Send `ops`; count them and their failures.
    fn bulk(&mut self, ops: &[Op]) -> Result<BulkOut> {
        let r = run_bulk(self.conns, self.threads, ops, self.spec.pipeline)?;
        self.out.ops += ops.len() as u64;
        self.out.failed += r.failed.len() as u64;
        if self.out.first_error.is_none() {
            self.out.first_error.clone_from(&r.first_error);
        }
        Ok(r)
    }

    /// SET new keys with values of `sizes` bytes until live data reaches
    /// the target; the stored ones are live.
    fn insert_to_target(&mut self, sizes: (u32, u32)) -> Result<()> {
        let mut bytes = live_bytes(&self.live);
        let mut ops = Vec::new();
        while bytes < self.spec.target {
            let n = self.rng.range(sizes.0 as u64, sizes.1 as u64 + 1) as u32;
            ops.push(Op::Set(self.next_key, n));
            self.next_key += 1;
            bytes += KEY_LEN as u64 + n as u64;
        }
        let r = self.bulk(&ops)?;
        let mut failed = r.failed.iter().peekable();
        for (i, op) in ops.iter().enumerate() {
            if failed.next_if_eq(&&i).is_some() {
                continue;
            }
            if let Op::Set(k, n) = *op {
                self.live.push((k, n));
            }
        }
        Ok(())
    }
}

/// Key + value bytes of `live`.
fn live_bytes(live: &[(u64, u32)]) -> u64 {
    live.iter().map(|&(_, n)| KEY_LEN as u64 + n as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fixed_width() {
        assert_eq!(&key(0), b"key:000000000000");
        assert_eq!(&key(42), b"key:000000000042");
        assert_eq!(&key(CHURN_BASE + 7), b"key:500000000007");
        assert_eq!(filler(5), b"abcde");
    }
}
