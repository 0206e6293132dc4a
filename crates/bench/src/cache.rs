//! `memlab cache`: the store as a cache against the caches people run
//! (issue 23): miss ratio against cache size on the same traces, and
//! throughput of a full cache under eviction over the memcached protocol.
//!
//! ```text
//!  miss ratio (one client, per trace x cache size x system):
//!    keys 0..N, V-byte values; cache size = a share of the data
//!    (N x (key + value) bytes) in whole MiB, the same for every system: nibble's
//!    capacity, Segcache's heap, memcached -m, redis-server maxmemory
//!    cache-aside: GET a batch of keys; SET each missed key (with its TTL)
//!    trace zipf<a>: N warm-up requests, then 2N measured, zipf(a) over a
//!                   scrambled rank
//!    trace scan:    N warm-up (zipf 1.0), a one-off scan of N keys never
//!                   seen again (not counted), then 2N measured zipf 1.0:
//!                   what the scan left of the popular set
//!    trace ttl:     zipf 1.0 with a TTL per key (30 % 1 s, 30 % 3 s, 40 %
//!                   none), paced at N/2 requests per second so that every
//!                   system sees the same clock: a GET of an expired key
//!                   misses and SETs again
//!  throughput (C client threads, per system, median of R runs):
//!    the cache filled at the smallest size >= 10 % (every key once,
//!    cache-aside, then its memory's worth of zipfian SETs, so that a log
//!    has wrapped and every page has been touched before the measured
//!    window: steady state, not first-touch faults), zipf 1.0, 90 % GET /
//!    10 % SET (a missed GET also SETs), pipelined batches of 16 over the
//!    memcached protocol; `vs_memcached` = over memcached's in the same
//!    run; `ratio` = over the same server with 4x the data and no
//!    eviction doing the same work (a GET that hits is followed by a SET
//!    as often as the cache's GETs missed); with `--pin-clients` client
//!    thread t runs on allowed CPU t mod CPUs (on a small VM where
//!    clients and server share the CPUs, an unpinned run falls into one of
//!    two placements 2x apart, see `server::steer`)
//! ```
//!
//! Systems: `nibble`/`nibble2` (the engine in process, `Merge` eviction),
//! `segcache` (Pelikan's Segcache storage engine, crate `segcache` 0.4, in
//! process, merge eviction with Pelikan's defaults: its heap is the cache
//! size rounded down to whole 1 MiB segments; its hash table, 2^(hash power + 3) bytes, comes on top, where
//! nibble's index is inside its capacity), `nibble-mc`/`nibble2-mc` (the
//! server over the memcached protocol, `maxmemory-policy allkeys-lru`,
//! which is the engine's `Merge`), `memcached` (`-t 2 -m`) and `redis`
//! (`maxmemory` with `allkeys-lru`). The server systems answer a batch of
//! GETs before the SETs of its misses are sent, so a key requested twice
//! in one batch (16 requests) misses twice there and once in process.
//!
//! Rows: `cache-miss` (`trace`, `size_pct`, `cache_bytes`, `miss_ratio`,
//! `items` held at the end where the system says, `rss_bytes` of a server
//! at the end) and `cache-tput` (`ops_per_sec`, `miss_ratio` of the run,
//! `vs_memcached`, `ratio`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nibble::{Config, Eviction, EvictionPolicy, Expiry, Mode, PutOptions, Store};

use crate::evict::Zipf;
use crate::report::{Reporter, Row};
use crate::server::load::Conn;
use crate::server::proto::{Expect, Proto, Reply};
use crate::server::sut::{self, Bins, ServerProc, Sys};
use crate::util::Rng;

mod bounds;

/// Requests per batch (a pipelined round trip for the servers).
const BATCH_REQUESTS: usize = 16;
/// Key bytes: `key:%012d`.
const KEY_BYTES: usize = 16;
/// Share of keys with a 1 s and with a 3 s TTL in the `ttl` trace, percent.
const TTL_SHORT_PCT: u64 = 30;
const TTL_MEDIUM_PCT: u64 = 30;
const TTL_SHORT_SECS: u32 = 1;
const TTL_MEDIUM_SECS: u32 = 3;
/// The throughput run's cache size: the smallest given size at least this
/// share of the data, percent.
const TPUT_MIN_SIZE_PCT: f64 = 10.0;
/// Segcache's segment size (its default).
const SEGCACHE_SEGMENT_BYTES: i32 = 1 << 20;

/// A system `memlab cache` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheSys {
    /// Nibble in process, merge eviction
    Nibble,
    /// Nibble-2 in process, merge eviction
    Nibble2,
    /// Pelikan's Segcache storage engine in process (crate segcache 0.4)
    Segcache,
    /// the nibble server over the memcached protocol, allkeys-lru (Nibble)
    NibbleMc,
    /// the nibble server over the memcached protocol, allkeys-lru (Nibble-2)
    Nibble2Mc,
    /// memcached -t 2 -m <size>
    Memcached,
    /// redis-server, maxmemory <size>, allkeys-lru
    Redis,
    /// offline bound: Belady's MIN with the cache's bytes in whole items (module `bounds`)
    Opt,
    /// offline reference: the most popular keys, kept from their first request (module `bounds`)
    TopC,
}

impl CacheSys {
    pub const ALL: [CacheSys; 9] = [
        CacheSys::Nibble,
        CacheSys::Nibble2,
        CacheSys::Segcache,
        CacheSys::NibbleMc,
        CacheSys::Nibble2Mc,
        CacheSys::Memcached,
        CacheSys::Redis,
        CacheSys::Opt,
        CacheSys::TopC,
    ];

    fn name(self) -> &'static str {
        match self {
            CacheSys::Nibble => "nibble",
            CacheSys::Nibble2 => "nibble2",
            CacheSys::Segcache => "segcache",
            CacheSys::NibbleMc => "nibble-mc",
            CacheSys::Nibble2Mc => "nibble2-mc",
            CacheSys::Memcached => "memcached",
            CacheSys::Redis => "redis",
            CacheSys::Opt => "opt",
            CacheSys::TopC => "top-c",
        }
    }

    /// The server it runs, if it is one.
    fn server(self) -> Option<Sys> {
        match self {
            CacheSys::NibbleMc => Some(Sys::Nibble),
            CacheSys::Nibble2Mc => Some(Sys::Nibble2),
            CacheSys::Memcached => Some(Sys::Memcached),
            CacheSys::Redis => Some(Sys::Redis),
            _ => None,
        }
    }
}

/// A trace `memlab cache` replays.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TraceKind {
    /// Zipfian popularity with this exponent.
    Zipf(f64),
    /// Zipf 1.0 with a one-off scan after the warm-up.
    Scan,
    /// Zipf 1.0 with mixed TTLs, paced.
    Ttl,
}

impl TraceKind {
    /// `zipf0.8`, `zipf1.0`, `scan`, `ttl`.
    pub fn parse(s: &str) -> Result<TraceKind, String> {
        match s {
            "scan" => Ok(TraceKind::Scan),
            "ttl" => Ok(TraceKind::Ttl),
            _ => match s.strip_prefix("zipf").map(str::parse::<f64>) {
                Some(Ok(a)) if a > 0.0 && a < 10.0 => Ok(TraceKind::Zipf(a)),
                _ => Err(format!(
                    "unknown trace {s:?}: zipf<alpha> (e.g. zipf0.8), scan or ttl"
                )),
            },
        }
    }

    fn name(self) -> String {
        match self {
            TraceKind::Zipf(a) => format!("zipf{a:.1}"),
            TraceKind::Scan => "scan".into(),
            TraceKind::Ttl => "ttl".into(),
        }
    }
}

/// What a run measures.
pub struct CacheOpts {
    pub keys: u64,
    pub value_bytes: usize,
    /// Cache sizes as a share of the data (key + value bytes), percent.
    pub sizes_pct: Vec<f64>,
    pub traces: Vec<TraceKind>,
    pub systems: Vec<CacheSys>,
    /// Client threads of the throughput runs (none: no throughput runs).
    pub tput_clients: Vec<usize>,
    pub tput_secs: f64,
    pub repeat: usize,
    /// Pin throughput client thread t to allowed CPU t mod CPUs.
    pub pin_clients: bool,
    pub nibble_bin: Option<PathBuf>,
}

/// One request of a trace.
#[derive(Clone, Copy)]
struct Req {
    key: u64,
    ttl_secs: u32,
    /// Counted in the miss ratio.
    counted: bool,
}

struct Trace {
    kind: TraceKind,
    reqs: Vec<Req>,
    /// The keys of the distribution the requests are drawn from, the most
    /// popular first (for the `top-c` bound).
    popular: Vec<u64>,
    /// Requests per second, for a paced trace.
    rate: Option<f64>,
}

fn key_bytes(k: u64) -> [u8; KEY_BYTES] {
    let mut out = *b"key:000000000000";
    let mut n = k;
    for b in out[4..].iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out
}

/// The TTL of key `k` in the `ttl` trace (0 = none).
fn ttl_of(k: u64) -> u32 {
    match k.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 32 & 0xFFFF {
        h if h * 100 < TTL_SHORT_PCT << 16 => TTL_SHORT_SECS,
        h if h * 100 < (TTL_SHORT_PCT + TTL_MEDIUM_PCT) << 16 => TTL_MEDIUM_SECS,
        _ => 0,
    }
}

fn make_trace(kind: TraceKind, n: u64) -> Trace {
    let alpha = match kind {
        TraceKind::Zipf(a) => a,
        _ => 1.0,
    };
    let zipf = Zipf::new(n, alpha);
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    let mut reqs = Vec::with_capacity(4 * n as usize);
    let mut zipf_reqs = |count: u64, counted: bool, reqs: &mut Vec<Req>| {
        for _ in 0..count {
            let key = zipf.key(rng.next_f64());
            let ttl_secs = if kind == TraceKind::Ttl {
                ttl_of(key)
            } else {
                0
            };
            reqs.push(Req {
                key,
                ttl_secs,
                counted,
            });
        }
    };
    zipf_reqs(n, false, &mut reqs);
    if kind == TraceKind::Scan {
        reqs.extend((n..2 * n).map(|key| Req {
            key,
            ttl_secs: 0,
            counted: false,
        }));
    }
    zipf_reqs(2 * n, true, &mut reqs);
    Trace {
        kind,
        reqs,
        popular: (0..n).map(|r| zipf.key_of_rank(r)).collect(),
        rate: (kind == TraceKind::Ttl).then_some(n as f64 / 2.0),
    }
}

/// A cache under test, seen by one client.
trait Client {
    /// Look up `reqs`; SET each missed key. Sets `hit[i]` per request.
    fn batch(&mut self, reqs: &[Req], value: &[u8], hit: &mut Vec<bool>) -> Result<(), String>;
    /// Items held, where the system says cheaply.
    fn items(&mut self) -> Option<u64>;
}

impl Client for Store {
    fn batch(&mut self, reqs: &[Req], value: &[u8], hit: &mut Vec<bool>) -> Result<(), String> {
        let mut buf = Vec::new();
        for r in reqs {
            let key = key_bytes(r.key);
            let found = self.get_into(&key, &mut buf).map_err(|e| e.to_string())?;
            hit.push(found.is_some());
            if found.is_none() {
                let expiry = match r.ttl_secs {
                    0 => Expiry::Never,
                    s => Expiry::At(now_unix_ms() + s as u64 * 1000),
                };
                let opts = PutOptions {
                    expiry,
                    ..PutOptions::default()
                };
                self.put_with(&key, value, opts)
                    .map_err(|e| format!("put: {e}"))?;
            }
        }
        Ok(())
    }

    fn items(&mut self) -> Option<u64> {
        Some(self.len())
    }
}

impl Client for segcache::Segcache {
    fn batch(&mut self, reqs: &[Req], value: &[u8], hit: &mut Vec<bool>) -> Result<(), String> {
        for r in reqs {
            let key = key_bytes(r.key);
            let found = self.get(&key).is_some();
            hit.push(found);
            if !found {
                let ttl = Duration::from_secs(r.ttl_secs as u64);
                self.insert(&key, value, None, ttl)
                    .map_err(|e| format!("segcache insert: {e}"))?;
            }
        }
        Ok(())
    }

    fn items(&mut self) -> Option<u64> {
        None
    }
}

impl Client for Conn {
    fn batch(&mut self, reqs: &[Req], value: &[u8], hit: &mut Vec<bool>) -> Result<(), String> {
        let first = hit.len();
        for r in reqs {
            self.queue_get(&key_bytes(r.key));
        }
        self.send_queued(reqs.len(), Expect::Get, |rep| {
            hit.push(matches!(rep, Reply::Value(_)))
        })
        .map_err(|e| e.to_string())?;
        let mut sets = 0;
        for (r, &h) in reqs.iter().zip(&hit[first..]) {
            if !h {
                self.queue_set_ttl(&key_bytes(r.key), value, r.ttl_secs);
                sets += 1;
            }
        }
        let mut refused = None;
        self.send_queued(sets, Expect::Line, |rep| {
            if !rep.is_stored() && refused.is_none() {
                refused = Some(rep.describe());
            }
        })
        .map_err(|e| e.to_string())?;
        match refused {
            Some(r) => Err(format!("a cache refused a SET: {r}")),
            None => Ok(()),
        }
    }

    fn items(&mut self) -> Option<u64> {
        sut::server_counts(self).0
    }
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Replay `t` through `c`: the miss ratio of its counted requests.
fn replay(c: &mut dyn Client, t: &Trace, value: &[u8]) -> Result<f64, String> {
    let (mut misses, mut counted) = (0u64, 0u64);
    let mut hit = Vec::with_capacity(BATCH_REQUESTS);
    let t0 = Instant::now();
    for (i, chunk) in t.reqs.chunks(BATCH_REQUESTS).enumerate() {
        if let Some(rate) = t.rate {
            let due = Duration::from_secs_f64((i * BATCH_REQUESTS) as f64 / rate);
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        hit.clear();
        c.batch(chunk, value, &mut hit)?;
        for (r, &h) in chunk.iter().zip(&hit) {
            if r.counted {
                counted += 1;
                misses += u64::from(!h);
            }
        }
    }
    Ok(misses as f64 / counted.max(1) as f64)
}

fn nibble_store(mode: Mode, bytes: usize, policy: EvictionPolicy) -> Result<Store, String> {
    let mut cfg = Config::new(bytes);
    cfg.mode = mode;
    cfg.eviction = Eviction {
        policy,
        volatile_only: false,
    };
    Store::new(cfg).map_err(|e| e.to_string())
}

fn segcache(bytes: usize, keys: u64) -> Result<segcache::Segcache, String> {
    // 7/8 of 2^power slots hold items; room for twice the trace's keys
    // (a bucket holds 7: with exactly enough slots, full buckets overflow
    // even with the overflow factor, and Segcache refuses the insert).
    let mut power = 7u8;
    while (7u64 << power) / 8 < 2 * keys && power < 30 {
        power += 1;
    }
    // Its heap is whole segments: the largest multiple within the limit.
    let heap = bytes / SEGCACHE_SEGMENT_BYTES as usize * SEGCACHE_SEGMENT_BYTES as usize;
    segcache::Segcache::builder()
        .heap_size(heap.max(SEGCACHE_SEGMENT_BYTES as usize))
        .segment_size(SEGCACHE_SEGMENT_BYTES)
        .hash_power(power)
        .overflow_factor(1.0)
        .eviction(segcache::Policy::Merge {
            max: 8,
            merge: 4,
            compact: 2,
        })
        .build()
        .map_err(|e| format!("segcache: {e}"))
}

/// A server started for one cell, with its eviction policy set.
fn start_server(sys: CacheSys, bins: &Bins, bytes: u64) -> Result<ServerProc, String> {
    let s = sys.server().expect("a server system");
    let proto = match sys {
        CacheSys::Redis => Proto::Resp,
        _ => Proto::Memcached,
    };
    let p = ServerProc::start(s, bins, bytes, proto).map_err(|e| e.to_string())?;
    if let Some(port) = p.resp_port {
        // redis-server and the nibble server start as `noeviction`.
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut c = Conn::connect(addr, Proto::Resp).map_err(|e| e.to_string())?;
        let ok = c
            .call(
                Expect::Line,
                &[b"CONFIG", b"SET", b"maxmemory-policy", b"allkeys-lru"],
                |r| r.is_stored(),
            )
            .map_err(|e| e.to_string())?;
        if !ok {
            return Err(format!(
                "{}: CONFIG SET maxmemory-policy failed",
                sys.name()
            ));
        }
    }
    Ok(p)
}

/// One miss-ratio cell: (miss ratio, items held, server RSS).
fn miss_cell(
    sys: CacheSys,
    bins: &Bins,
    bytes: u64,
    keys: u64,
    t: &Trace,
    value: &[u8],
) -> Result<(f64, Option<u64>, Option<u64>), String> {
    match sys {
        CacheSys::Nibble | CacheSys::Nibble2 => {
            let mode = if sys == CacheSys::Nibble {
                Mode::Nibble
            } else {
                Mode::Nibble2
            };
            let mut s = nibble_store(mode, bytes as usize, EvictionPolicy::Merge)?;
            let miss = replay(&mut s, t, value)?;
            Ok((miss, s.items(), None))
        }
        CacheSys::Segcache => {
            let mut s = segcache(bytes as usize, keys)?;
            let miss = replay(&mut s, t, value)?;
            Ok((miss, None, None))
        }
        CacheSys::Opt | CacheSys::TopC => {
            // (`run` skips them on a paced trace with TTLs.)
            let items = (bytes / (KEY_BYTES + value.len()) as u64) as usize;
            let miss = if sys == CacheSys::Opt {
                bounds::opt_miss_ratio(&t.reqs, items)
            } else {
                bounds::top_c_miss_ratio(&t.reqs, &t.popular, items)
            };
            Ok((miss, Some(items as u64), None))
        }
        _ => {
            let p = start_server(sys, bins, bytes)?;
            let mut c = Conn::connect(p.addr, p.proto).map_err(|e| e.to_string())?;
            let miss = replay(&mut c, t, value)
                .map_err(|e| format!("{e}; server log: {}", p.log_tail(400)))?;
            let items = c.items();
            Ok((miss, items, p.rss().map(|r| r.0)))
        }
    }
}

/// Throughput of `clients` threads on the server at `addr` for `secs`:
/// (ops/s, miss ratio of the GETs).
fn tput_run(
    addr: std::net::SocketAddr,
    proto: Proto,
    clients: usize,
    extra_set_pct: f64,
    env: &TputEnv<'_>,
) -> Result<(f64, f64), String> {
    let (zipf, value, pin, secs) = (env.zipf, env.value, env.o.pin_clients, env.o.tput_secs);
    let stop = AtomicBool::new(false);
    let (ops, gets, misses) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let failed = std::sync::Mutex::new(None::<String>);
    std::thread::scope(|sc| {
        for t in 0..clients {
            let (stop, ops, gets, misses, failed) = (&stop, &ops, &gets, &misses, &failed);
            sc.spawn(move || {
                let run = || -> Result<(), String> {
                    if pin {
                        let cpus = topology::allowed_cpus();
                        if let Some(&cpu) = cpus.get(t % cpus.len().max(1)) {
                            topology::pin_current_thread(cpu)
                                .map_err(|e| format!("pin client {t} to CPU {cpu}: {e}"))?;
                        }
                    }
                    let mut c = Conn::connect(addr, proto).map_err(|e| e.to_string())?;
                    let mut rng = Rng::new(0x2545_F491_4F6C_DD1D ^ (t as u64 + 1));
                    let mut hit = Vec::with_capacity(BATCH_REQUESTS);
                    let (mut n, mut g, mut m) = (0u64, 0u64, 0u64);
                    let mut reqs = Vec::with_capacity(BATCH_REQUESTS);
                    let mut sets = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        reqs.clear();
                        sets.clear();
                        for _ in 0..BATCH_REQUESTS {
                            let key = zipf.key(rng.next_f64());
                            let r = Req {
                                key,
                                ttl_secs: 0,
                                counted: true,
                            };
                            if rng.range(0, 10) == 0 {
                                sets.push(r);
                            } else {
                                reqs.push(r);
                            }
                        }
                        hit.clear();
                        c.batch(&reqs, value, &mut hit)?;
                        // The reference store's stand-in for the misses it
                        // does not have: a SET after a hit, as often.
                        for (r, &h) in reqs.iter().zip(&hit) {
                            if h && rng.next_f64() * 100.0 < extra_set_pct {
                                sets.push(*r);
                            }
                        }
                        for r in &sets {
                            c.queue_set_ttl(&key_bytes(r.key), value, 0);
                        }
                        c.send_queued(sets.len(), Expect::Line, |_| {})
                            .map_err(|e| e.to_string())?;
                        g += reqs.len() as u64;
                        m += hit.iter().filter(|&&h| !h).count() as u64;
                        n += BATCH_REQUESTS as u64;
                    }
                    ops.fetch_add(n, Ordering::Relaxed);
                    gets.fetch_add(g, Ordering::Relaxed);
                    misses.fetch_add(m, Ordering::Relaxed);
                    Ok(())
                };
                if let Err(e) = run() {
                    stop.store(true, Ordering::Relaxed);
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok((
        ops.into_inner() as f64 / secs,
        misses.into_inner() as f64 / gets.into_inner().max(1) as f64,
    ))
}

/// Fill the cache: every key once, cache-aside; then SET keys drawn
/// from the run's zipf distribution until `capacity_bytes` more have
/// been written. The second part puts the measured window in steady
/// state: a log-structured store writes through its whole capacity
/// before it reuses memory, and the first touch of every page costs a
/// fault (in a VM with free-page reporting, a host fault and zeroing as
/// well). The keys follow the run's distribution because the log's
/// shape does: SETs of every key in turn leave whole segments dead, which
/// compaction frees at once, so the non-evicting Nibble-mode reference
/// (4x the data) filled that way stays at a third of its capacity and
/// spends the measured window growing into pages never touched before
/// (a fifth of its CPU zeroing them), while zipfian SETs leave dead bytes
/// spread over every segment and fill the log to where compaction runs,
/// as it does in the window. Nibble-2 overwrites in place and the caches
/// have wrapped long before.
fn fill(
    c: &mut Conn,
    keys: u64,
    zipf: &Zipf,
    value: &[u8],
    capacity_bytes: u64,
) -> Result<(), String> {
    let reqs: Vec<Req> = (0..keys)
        .map(|key| Req {
            key,
            ttl_secs: 0,
            counted: false,
        })
        .collect();
    let mut hit = Vec::new();
    for chunk in reqs.chunks(BATCH_REQUESTS * 8) {
        hit.clear();
        c.batch(chunk, value, &mut hit)?;
    }
    let set_bytes = (KEY_BYTES + value.len()) as u64;
    let sets = capacity_bytes / set_bytes;
    let batch = (BATCH_REQUESTS * 8) as u64;
    let mut done = 0u64;
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    while done < sets {
        let n = batch.min(sets - done);
        for _ in 0..n {
            c.queue_set_ttl(&key_bytes(zipf.key(rng.next_f64())), value, 0);
        }
        let mut refused = None;
        c.send_queued(n as usize, Expect::Line, |r| {
            if !r.is_stored() && refused.is_none() {
                refused = Some(r.describe());
            }
        })
        .map_err(|e| e.to_string())?;
        if let Some(r) = refused {
            return Err(format!("a warm-up SET was refused: {r}"));
        }
        done += n;
    }
    Ok(())
}

/// What every throughput cell shares.
struct TputEnv<'a> {
    bins: &'a Bins,
    o: &'a CacheOpts,
    zipf: &'a Zipf,
    value: &'a [u8],
}

/// The median throughput (and its miss ratio) of `repeat` runs, each on a
/// freshly started and filled server.
fn tput_cell(
    sys: CacheSys,
    bytes: u64,
    evicting: bool,
    extra_set_pct: f64,
    clients: usize,
    env: &TputEnv<'_>,
) -> Result<(f64, f64), String> {
    let (bins, o, value) = (env.bins, env.o, env.value);
    let mut runs = Vec::new();
    for _ in 0..o.repeat.max(1) {
        let p = if evicting {
            start_server(sys, bins, bytes)?
        } else {
            let s = sys.server().expect("a server system");
            ServerProc::start(s, bins, bytes, Proto::Memcached).map_err(|e| e.to_string())?
        };
        let mut c = Conn::connect(p.addr, p.proto).map_err(|e| e.to_string())?;
        fill(&mut c, o.keys, env.zipf, value, bytes)?;
        runs.push(tput_run(p.addr, p.proto, clients, extra_set_pct, env)?);
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(runs[runs.len() / 2])
}

/// The cache size of `pct` % of `data_bytes`: whole MiB (rounded down),
/// so memcached's `-m` (MiB) and Segcache's heap (1 MiB segments) get the
/// same bytes as the others.
fn cache_bytes(data_bytes: u64, pct: f64) -> u64 {
    let b = (data_bytes as f64 * pct / 100.0) as u64;
    (b >> 20 << 20).max(1 << 20)
}

/// Run it all.
pub fn run(o: &CacheOpts, rep: &mut Reporter) -> std::io::Result<()> {
    sut::install_missing_peers();
    let bins = Bins::find(o.nibble_bin.as_deref(), Vec::new());
    let value = vec![b'v'; o.value_bytes];
    let data_bytes = o.keys * (KEY_BYTES + o.value_bytes) as u64;
    let mut systems = Vec::new();
    for &s in &o.systems {
        match s.server().map(|sys| bins.for_sys(sys)) {
            Some(Err(missing)) => {
                println!("SKIPPED: {}: {}", s.name(), missing.0);
                rep.note(
                    "cache-miss",
                    &format!("{} skipped: {}", s.name(), missing.0),
                );
            }
            _ => systems.push(s),
        }
    }
    let cells = (o.traces.len() * o.sizes_pct.len() * systems.len()) as u64;
    let bar = rep.start_progress(cells, "cache");
    for &kind in &o.traces {
        let t = make_trace(kind, o.keys);
        for &pct in &o.sizes_pct {
            let bytes = cache_bytes(data_bytes, pct);
            for &sys in &systems {
                bar.inc(1);
                if matches!(
                    sys,
                    CacheSys::Nibble | CacheSys::Nibble2 | CacheSys::NibbleMc | CacheSys::Nibble2Mc
                ) && (bytes as usize) < nibble::MIN_CAPACITY_BYTES
                {
                    rep.note(
                        "cache-miss",
                        &format!(
                            "{} at {pct} %: {bytes} bytes is below the store's minimum ({} bytes); skipped",
                            sys.name(),
                            nibble::MIN_CAPACITY_BYTES
                        ),
                    );
                    continue;
                }
                if matches!(sys, CacheSys::Opt | CacheSys::TopC) && t.rate.is_some() {
                    rep.note(
                        "cache-miss",
                        &format!(
                            "{} on {}: no offline reference for a paced trace with TTLs; skipped",
                            sys.name(),
                            t.kind.name()
                        ),
                    );
                    continue;
                }
                match miss_cell(sys, &bins, bytes, o.keys, &t, &value) {
                    Ok((miss, items, rss)) => {
                        let mut row = Row::new("cache-miss", sys.name(), 1)
                            .set("trace", t.kind.name())
                            .set("size_pct", pct)
                            .set("cache_bytes", bytes)
                            .set_f("miss_ratio", miss, 4);
                        if let Some(i) = items {
                            row = row.set("items", i);
                        }
                        if let Some(r) = rss {
                            row = row.set("rss_bytes", r);
                        }
                        rep.emit(row)?;
                    }
                    Err(e) => rep.error(format!(
                        "cache {} {} {pct} %: {e}",
                        sys.name(),
                        t.kind.name()
                    )),
                }
            }
        }
    }
    rep.end_progress();
    if o.tput_clients.is_empty() {
        return rep.finish();
    }
    let pct = o
        .sizes_pct
        .iter()
        .copied()
        .filter(|&p| p >= TPUT_MIN_SIZE_PCT)
        .fold(f64::INFINITY, f64::min);
    let pct = if pct.is_finite() {
        pct
    } else {
        TPUT_MIN_SIZE_PCT
    };
    let bytes = cache_bytes(data_bytes, pct).max(nibble::MIN_CAPACITY_BYTES as u64);
    let zipf = Zipf::new(o.keys, 1.0);
    // memcached first: the nibble rows give their ratio to it.
    let mut servers: Vec<CacheSys> = systems
        .iter()
        .copied()
        .filter(|s| s.server().is_some() && *s != CacheSys::Redis)
        .collect();
    servers.sort_by_key(|&s| s != CacheSys::Memcached);
    let env = TputEnv {
        bins: &bins,
        o,
        zipf: &zipf,
        value: &value,
    };
    for &clients in &o.tput_clients {
        let mut memcached_ops = None;
        for &sys in &servers {
            let (ops, miss) = match tput_cell(sys, bytes, true, 0.0, clients, &env) {
                Ok(r) => r,
                Err(e) => {
                    rep.error(format!("cache throughput {}: {e}", sys.name()));
                    continue;
                }
            };
            let mut row = Row::new("cache-tput", sys.name(), clients)
                .set("size_pct", pct)
                .set("cache_bytes", bytes)
                .set_f("ops_per_sec", ops, 0)
                .set_f("miss_ratio", miss, 4);
            if sys == CacheSys::Memcached {
                memcached_ops = Some(ops);
            } else if let Some(m) = memcached_ops {
                row = row.set_f("vs_memcached", ops / m, 3);
            }
            if sys != CacheSys::Memcached {
                // The same store, 4x the data, never evicting, doing the
                // same work: as many SETs as the cache's misses caused.
                let reference = tput_cell(sys, 4 * data_bytes, false, miss * 100.0, clients, &env);
                match reference {
                    Ok((base, _)) => {
                        rep.emit(
                            Row::new("cache-tput", &format!("{} noeviction", sys.name()), clients)
                                .set("size_pct", 400.0)
                                .set("cache_bytes", 4 * data_bytes)
                                .set_f("ops_per_sec", base, 0)
                                .set_f("miss_ratio", 0.0, 4),
                        )?;
                        row = row.set_f("ratio", ops / base, 3);
                    }
                    Err(e) => rep.error(format!(
                        "cache throughput, non-evicting {}: {e}",
                        sys.name()
                    )),
                }
            }
            rep.emit(row)?;
        }
    }
    rep.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fixed_width() {
        assert_eq!(&key_bytes(42), b"key:000000000042");
        assert_eq!(&key_bytes(999_999_999_999), b"key:999999999999");
    }

    #[test]
    fn zipf_keys_are_a_permutation_of_the_ranks() {
        for n in [1u64, 2, 10, 1000, 100_000, 1 << 20] {
            let z = Zipf::new(n, 1.0);
            let keys: std::collections::HashSet<u64> = (0..n).map(|r| z.key_of_rank(r)).collect();
            assert_eq!(keys.len() as u64, n, "n = {n}");
            assert!(keys.iter().all(|&k| k < n));
        }
    }

    #[test]
    fn ttl_classes_have_their_shares() {
        let n = 100_000u64;
        let short = (0..n).filter(|&k| ttl_of(k) == TTL_SHORT_SECS).count() as f64 / n as f64;
        let medium = (0..n).filter(|&k| ttl_of(k) == TTL_MEDIUM_SECS).count() as f64 / n as f64;
        assert!((short - 0.30).abs() < 0.02, "{short}");
        assert!((medium - 0.30).abs() < 0.02, "{medium}");
    }

    #[test]
    fn traces_count_what_they_say() {
        let t = make_trace(TraceKind::Scan, 1000);
        assert_eq!(t.reqs.len(), 4000);
        assert_eq!(t.reqs.iter().filter(|r| r.counted).count(), 2000);
        assert!(t.reqs[1000..2000]
            .iter()
            .all(|r| r.key >= 1000 && !r.counted));
        let z = make_trace(TraceKind::Zipf(1.2), 1000);
        assert_eq!(z.reqs.len(), 3000);
        assert!(z.rate.is_none() && make_trace(TraceKind::Ttl, 1000).rate.is_some());
        assert!(TraceKind::parse("zipf0.8") == Ok(TraceKind::Zipf(0.8)));
        assert!(TraceKind::parse("zipf").is_err() && TraceKind::parse("lru").is_err());
    }

    /// A cache large enough to hold every key misses only on first use,
    /// and a small one misses more: the replay counts what it should.
    #[test]
    fn replay_in_process_counts_misses() {
        let value = vec![b'v'; 100];
        let t = make_trace(TraceKind::Zipf(1.0), 20_000);
        let mut big = nibble_store(Mode::Nibble2, 64 << 20, EvictionPolicy::Merge).unwrap();
        let big_miss = replay(&mut big, &t, &value).unwrap();
        let distinct_after_warm = {
            let mut seen = std::collections::HashSet::new();
            let mut first = 0;
            for r in &t.reqs {
                if seen.insert(r.key) && r.counted {
                    first += 1;
                }
            }
            first as f64 / 40_000.0
        };
        assert!(
            (big_miss - distinct_after_warm).abs() < 1e-9,
            "{big_miss} vs {distinct_after_warm}"
        );
        let mut seg = segcache(64 << 20, 20_000).unwrap();
        let seg_miss = replay(&mut seg, &t, &value).unwrap();
        assert!((seg_miss - distinct_after_warm).abs() < 0.01, "{seg_miss}");
    }
}
