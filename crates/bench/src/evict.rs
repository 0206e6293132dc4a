//! `memlab evict`: Nibble's cache mode (issue 23; Segcache NSDI'21 §4.3)
//! in process: miss ratio of each eviction policy on a zipfian trace
//! against an exact LRU of the same number of items, and throughput of a
//! full cache under eviction against the same store large enough never
//! to evict.
//!
//! ```text
//!  hit ratio (1 thread, per mode x policy x cache size):
//!    keys 0..N, value V bytes, popularity zipf(alpha) over a scrambled rank
//!    cache-aside: GET; on a miss SET (the trace is 2 x N requests after a
//!    warm-up of N requests); miss ratio of the measured part
//!    LRU: an exact LRU holding the items that store held on average
//!  throughput (threads T, per mode x policy):
//!    the same trace with 90 % GET / 10 % SET (a miss also SETs) on a full
//!    cache at the smallest size, vs `noeviction` on a store 4x the data
//! ```
//!
//! Rows: `evict-miss` (`miss_ratio`, `lru_miss_ratio` of an LRU holding
//! as many items as that store did, `items`, `evicted`) and `evict-tput`
//! (`ops_per_sec`, the median of `--repeat` runs, `evicted`,
//! `write_waits` and `write_wait_ms`: writes that found the log full and
//! the time they waited, of the last run; `ratio` = over the
//! non-evicting store's median).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use nibble::{Config, Eviction, EvictionPolicy, Mode, Store};

use crate::report::{Reporter, Row};

/// What a run measures.
pub struct EvictOpts {
    pub keys: u64,
    pub value_bytes: usize,
    pub alpha: f64,
    /// Cache sizes as a share of the data (key + value bytes), percent.
    pub sizes_pct: Vec<u32>,
    pub threads: Vec<usize>,
    pub seconds: f64,
    /// Throughput runs per cell (the median is reported).
    pub repeat: usize,
}

const POLICIES: [EvictionPolicy; 4] = [
    EvictionPolicy::Fifo,
    EvictionPolicy::LeastLive,
    EvictionPolicy::Random,
    EvictionPolicy::Merge,
];

/// A zipfian sampler over ranks `0..n` (inverse CDF by binary search).
pub(crate) struct Zipf {
    cdf: Vec<f64>,
    /// Multiplier of the rank scramble, coprime with `n` so that the
    /// scramble is a permutation of `0..n`.
    scramble: u64,
}

/// Greatest common divisor.
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Zipf {
    pub(crate) fn new(n: u64, alpha: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0;
        for r in 1..=n {
            sum += 1.0 / (r as f64).powf(alpha);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        let n = n.max(1);
        let mut scramble = 0x9E37_79B9_7F4A_7C15 % n;
        while gcd(scramble, n) != 1 {
            scramble += 1;
        }
        Zipf { cdf, scramble }
    }

    /// The key of rank `r` (0 = the most popular): the rank scrambled by
    /// a permutation of `0..n`, so that popular keys are not written
    /// next to each other and every rank is its own key.
    pub(crate) fn key_of_rank(&self, r: u64) -> u64 {
        let n = self.cdf.len().max(1) as u64;
        ((r as u128 * self.scramble as u128) % n as u128) as u64
    }

    /// The key of a uniform `u` in [0, 1).
    pub(crate) fn key(&self, u: f64) -> u64 {
        let r = self.cdf.partition_point(|&c| c < u) as u64;
        self.key_of_rank(r.min(self.cdf.len().saturating_sub(1) as u64))
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn key_bytes(k: u64, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(format!("key:{k:012}").as_bytes());
}

const KEY_BYTES: usize = 16;

fn store(mode: Mode, capacity: usize, policy: EvictionPolicy) -> Store {
    let mut cfg = Config::new(capacity.max(nibble::MIN_CAPACITY_BYTES));
    cfg.mode = mode;
    cfg.eviction = Eviction {
        policy,
        volatile_only: false,
    };
    Store::new(cfg).expect("store")
}

/// Miss ratio of an exact LRU holding `items` on the same trace.
fn lru_miss_ratio(trace: &[u64], warm: usize, items: usize) -> f64 {
    let mut at: HashMap<u64, u64> = HashMap::new();
    let mut order: BTreeMap<u64, u64> = BTreeMap::new();
    let mut misses = 0u64;
    for (t, &k) in trace.iter().enumerate() {
        let t = t as u64;
        match at.insert(k, t) {
            Some(old) => {
                order.remove(&old);
            }
            None => {
                if t as usize >= warm {
                    misses += 1;
                }
                if order.len() >= items {
                    if let Some((_, victim)) = order.pop_first() {
                        at.remove(&victim);
                    }
                }
            }
        }
        order.insert(t, k);
    }
    misses as f64 / (trace.len() - warm) as f64
}

/// Run the trace cache-aside on `s`; the miss ratio after `warm`
/// requests and the average items held.
fn replay(s: &Store, trace: &[u64], warm: usize, value: &[u8]) -> (f64, f64) {
    let (mut misses, mut buf, mut key) = (0u64, Vec::new(), Vec::new());
    let (mut items_sum, mut samples) = (0f64, 0f64);
    for (i, &k) in trace.iter().enumerate() {
        key_bytes(k, &mut key);
        if s.get_into(&key, &mut buf).expect("get").is_none() {
            if i >= warm {
                misses += 1;
            }
            s.put(&key, value).expect("a cache never refuses");
        }
        if i >= warm && i.is_multiple_of(1024) {
            items_sum += s.len() as f64;
            samples += 1.0;
        }
    }
    (
        misses as f64 / (trace.len() - warm) as f64,
        items_sum / samples.max(1.0),
    )
}

/// Throughput of `threads` clients on `s` for `secs`: 90 % GET, 10 % SET,
/// a missed GET SETs.
fn throughput(s: &Store, zipf: &Zipf, threads: usize, secs: f64, value: &[u8]) -> f64 {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let ops = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|sc| {
        for t in 0..threads {
            let (stop, ops) = (&stop, &ops);
            sc.spawn(move || {
                let mut rng = Rng(0x2545_F491_4F6C_DD1D ^ (t as u64 + 1));
                let (mut buf, mut key, mut n) = (Vec::new(), Vec::new(), 0u64);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for _ in 0..256 {
                        key_bytes(zipf.key(rng.unit()), &mut key);
                        if rng.next().is_multiple_of(10)
                            || s.get_into(&key, &mut buf).unwrap().is_none()
                        {
                            if let Err(e) = s.put(&key, value) {
                                panic!("a cache never refuses: {e} ({:?})", s.eviction());
                            }
                        }
                        n += 1;
                    }
                }
                ops.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    ops.into_inner() as f64 / secs
}

/// The median of `n` runs of `f`.
fn median(n: usize, mut f: impl FnMut() -> f64) -> f64 {
    let mut v: Vec<f64> = (0..n.max(1)).map(|_| f()).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Run it all.
pub fn run(o: &EvictOpts, rep: &mut Reporter) -> std::io::Result<()> {
    let zipf = Zipf::new(o.keys, o.alpha);
    let value = vec![b'v'; o.value_bytes];
    let data_bytes = o.keys as usize * (KEY_BYTES + o.value_bytes);
    let warm = o.keys as usize;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let trace: Vec<u64> = (0..3 * o.keys).map(|_| zipf.key(rng.unit())).collect();
    for &pct in &o.sizes_pct {
        let cap = data_bytes * pct as usize / 100;
        for mode in [Mode::Nibble, Mode::Nibble2] {
            for policy in POLICIES {
                let s = store(mode, cap, policy);
                let (miss, items) = replay(&s, &trace, warm, &value);
                // LRU holding as many items as this store did.
                let lru_miss = lru_miss_ratio(&trace, warm, items.round() as usize);
                let st = s.stats();
                rep.emit(
                    Row::new("evict-miss", mode.name(), 1)
                        .set("policy", policy.name())
                        .set("alpha", o.alpha)
                        .set("size_pct", pct as u64)
                        .set("capacity_bytes", st.capacity_bytes)
                        .set_f("miss_ratio", miss, 4)
                        .set_f("lru_miss_ratio", lru_miss, 4)
                        .set("items", items.round() as u64)
                        .set("evicted", st.evicted_items),
                )?;
            }
        }
    }
    let cap = data_bytes * o.sizes_pct.first().copied().unwrap_or(10) as usize / 100;
    for &threads in &o.threads {
        for mode in [Mode::Nibble, Mode::Nibble2] {
            let base = median(o.repeat, || {
                let s = store(mode, 4 * data_bytes, EvictionPolicy::NoEviction);
                replay(&s, &trace[..warm], 0, &value);
                throughput(&s, &zipf, threads, o.seconds, &value)
            });
            rep.emit(
                Row::new("evict-tput", mode.name(), threads)
                    .set("policy", "noeviction (4x data)")
                    .set_f("ops_per_sec", base, 0)
                    .set_f("ratio", 1.0, 3),
            )?;
            for policy in POLICIES {
                let (mut evicted, mut waits, mut wait_us) = (0, 0, 0);
                let ops = median(o.repeat, || {
                    let s = store(mode, cap, policy);
                    replay(&s, &trace[..warm], 0, &value);
                    let before = s.stats();
                    let ops = throughput(&s, &zipf, threads, o.seconds, &value);
                    let after = s.stats();
                    evicted = after.evicted_items - before.evicted_items;
                    waits = after.write_waits - before.write_waits;
                    wait_us = after.write_wait_us - before.write_wait_us;
                    ops
                });
                rep.emit(
                    Row::new("evict-tput", mode.name(), threads)
                        .set("policy", policy.name())
                        .set_f("ops_per_sec", ops, 0)
                        .set("evicted", evicted)
                        .set("write_waits", waits)
                        .set_f("write_wait_ms", wait_us as f64 / 1000.0, 1)
                        .set_f("ratio", ops / base, 3),
                )?;
            }
        }
    }
    rep.finish()
}
