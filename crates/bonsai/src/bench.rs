//! RadixVM Figures 6-7 and the Bonsai claim as a library function, for
//! `memlab tree` (which reports the rows): [`PRESENT_KEYS`] present
//! keys; readers look up random present keys while writers insert and then
//! delete random absent keys. Systems: the Bonsai tree, the radix map,
//! `RwLock<BTreeMap>` (the Linux-style baseline) and `crossbeam-skiplist`
//! (the lock-free skip list of RadixVM §5.5).
//!
//! `bonsai-pin64` and `radix-pin64` share one read-side section (epoch
//! pin) among [`LOOKUP_BATCH`] lookups; `radix-nocollapse` is the map
//! without collapse (sv6: no counts, no pins, nodes never freed). Threads
//! are pinned to CPUs; cells with a `busy` thread add a thread spinning on
//! private work, the control for a reader slowed by sharing the machine
//! rather than by a writer. Keys are page numbers below
//! [`KEY_SPACE_PAGES`], so the radix map's node count stays bounded.
//! `lookups_per_sec_per_reader` and `writes_per_sec_per_writer` (one write
//! = one insert + one delete) are medians over runs; `spread_pct` is
//! (max - min) / median of lookups.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::BonsaiTree;
use crossbeam_skiplist::SkipMap;
use parking_lot::RwLock;
use radix::RadixMap;

/// Keys present in every map (RadixVM §5.5: "1,000 regions").
pub const PRESENT_KEYS: usize = 1000;
/// Keys are page numbers below this (4 GiB of address space).
pub const KEY_SPACE_PAGES: u64 = 1 << 20;
/// Lookups per read-side batch.
pub const LOOKUP_BATCH: usize = 64;
/// Every system [`run`] knows.
pub const SYSTEMS: [&str; 7] = [
    "bonsai",
    "bonsai-pin64",
    "radix",
    "radix-pin64",
    "radix-nocollapse",
    "rwlock-btree",
    "skiplist",
];

trait BenchMap: Sync {
    fn lookup(&self, key: u64) -> bool;
    /// A writer thread's view (per-thread state, if the system has any).
    fn writer(&self) -> Box<dyn BenchWriter + '_>;
    /// Looks up every key; returns how many were present. A system may
    /// share one read-side section among them.
    fn lookup_batch(&self, keys: &[u64]) -> usize {
        keys.iter().filter(|&&k| self.lookup(k)).count()
    }
    fn insert(&self, key: u64);
    fn remove(&self, key: u64);
}

trait BenchWriter {
    fn insert(&self, key: u64);
    fn remove(&self, key: u64);
}

/// A writer for systems without per-thread state.
struct Shared<'a, M: BenchMap + ?Sized>(&'a M);

impl<M: BenchMap + ?Sized> BenchWriter for Shared<'_, M> {
    fn insert(&self, key: u64) {
        self.0.insert(key);
    }
    fn remove(&self, key: u64) {
        self.0.remove(key);
    }
}

impl BenchWriter for radix::Handle<'_> {
    fn insert(&self, key: u64) {
        self.set(key..key + 1, key);
    }
    fn remove(&self, key: u64) {
        self.unset(key..key + 1);
    }
}

impl BenchMap for BonsaiTree<u64, u64> {
    fn writer(&self) -> Box<dyn BenchWriter + '_> {
        Box::new(Shared(self))
    }
    fn lookup(&self, key: u64) -> bool {
        self.reader().get(&key).is_some()
    }
    fn insert(&self, key: u64) {
        BonsaiTree::insert(self, key, key);
    }
    fn remove(&self, key: u64) {
        BonsaiTree::remove(self, &key);
    }
}

/// The Bonsai tree with one read-side section (epoch pin) per 64 lookups:
/// what the pin costs per lookup, and what a kernel's free
/// `rcu_read_lock` would give.
struct BonsaiPinned(BonsaiTree<u64, u64>);

impl BenchMap for BonsaiPinned {
    fn writer(&self) -> Box<dyn BenchWriter + '_> {
        Box::new(Shared(self))
    }
    fn lookup(&self, key: u64) -> bool {
        self.0.reader().get(&key).is_some()
    }
    fn lookup_batch(&self, keys: &[u64]) -> usize {
        let reader = self.0.reader();
        keys.iter().filter(|&&k| reader.get(&k).is_some()).count()
    }
    fn insert(&self, key: u64) {
        self.0.insert(key, key);
    }
    fn remove(&self, key: u64) {
        self.0.remove(&key);
    }
}

/// The radix map with one read-side section per 64 lookups (collapse on).
struct RadixPinned(RadixMap);

impl BenchMap for RadixPinned {
    fn writer(&self) -> Box<dyn BenchWriter + '_> {
        Box::new(self.0.handle())
    }
    fn lookup(&self, key: u64) -> bool {
        self.0.lookup(key).is_some()
    }
    fn lookup_batch(&self, keys: &[u64]) -> usize {
        let reader = self.0.reader();
        keys.iter().filter(|&&k| reader.lookup(k).is_some()).count()
    }
    fn insert(&self, key: u64) {
        self.0.set(key..key + 1, key);
    }
    fn remove(&self, key: u64) {
        self.0.unset(key..key + 1);
    }
}

impl BenchMap for RadixMap {
    fn writer(&self) -> Box<dyn BenchWriter + '_> {
        Box::new(self.handle())
    }
    fn lookup(&self, key: u64) -> bool {
        RadixMap::lookup(self, key).is_some()
    }
    fn insert(&self, key: u64) {
        self.set(key..key + 1, key);
    }
    fn remove(&self, key: u64) {
        self.unset(key..key + 1);
    }
}

impl BenchMap for RwLock<BTreeMap<u64, u64>> {
    fn writer(&self) -> Box<dyn BenchWriter + '_> {
        Box::new(Shared(self))
    }
    fn lookup(&self, key: u64) -> bool {
        self.read().contains_key(&key)
    }
    fn insert(&self, key: u64) {
        self.write().insert(key, key);
    }
    fn remove(&self, key: u64) {
        self.write().remove(&key);
    }
}

impl BenchMap for SkipMap<u64, u64> {
    fn writer(&self) -> Box<dyn BenchWriter + '_> {
        Box::new(Shared(self))
    }
    fn lookup(&self, key: u64) -> bool {
        self.get(&key).is_some()
    }
    fn insert(&self, key: u64) {
        SkipMap::insert(self, key, key);
    }
    fn remove(&self, key: u64) {
        SkipMap::remove(self, &key);
    }
}

fn rng(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 20
}

struct Cell {
    lookups_per_reader: f64,
    writes_per_writer: f64,
}

fn pin(thread: usize) {
    let cpus = topology::allowed_cpus();
    if !cpus.is_empty() {
        let _ = topology::pin_current_thread(cpus[thread % cpus.len()]);
    }
}

fn measure(
    map: &dyn BenchMap,
    present: &[u64],
    readers: usize,
    writers: usize,
    busy: usize,
    secs: f64,
) -> Cell {
    let stop = AtomicBool::new(false);
    let lookups = AtomicU64::new(0);
    let writes = AtomicU64::new(0);
    let barrier = Barrier::new(readers + writers + busy + 1);
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|s| {
        for r in 0..readers {
            let (stop, lookups, barrier) = (&stop, &lookups, &barrier);
            s.spawn(move || {
                pin(r);
                let mut state = 17 + r as u64;
                barrier.wait();
                let mut n = 0u64;
                let mut keys = [0u64; LOOKUP_BATCH];
                while !stop.load(Ordering::Relaxed) {
                    for key in &mut keys {
                        *key = present[rng(&mut state) as usize % present.len()];
                    }
                    assert_eq!(map.lookup_batch(&keys), keys.len(), "a present key missed");
                    n += LOOKUP_BATCH as u64;
                }
                lookups.fetch_add(n, Ordering::Relaxed);
            });
        }
        for w in 0..writers {
            let (stop, writes, barrier) = (&stop, &writes, &barrier);
            s.spawn(move || {
                pin(readers + w);
                let mut state = 1000 + w as u64;
                let writer = map.writer();
                barrier.wait();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Present keys are even; absent ones odd.
                    let key = (rng(&mut state) % KEY_SPACE_PAGES) | 1;
                    writer.insert(key);
                    writer.remove(key);
                    n += 1;
                }
                writes.fetch_add(n, Ordering::Relaxed);
            });
        }
        for b in 0..busy {
            // A control: a thread that keeps a core busy with private work
            // (no access to the map), so a reader's slowdown from sharing a
            // machine can be told apart from its slowdown from a writer.
            let (stop, barrier) = (&stop, &barrier);
            s.spawn(move || {
                pin(readers + writers + b);
                let mut state = 7 + b as u64;
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1024 {
                        std::hint::black_box(rng(&mut state));
                    }
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        elapsed = start.elapsed();
    });
    let secs = elapsed.as_secs_f64();
    Cell {
        lookups_per_reader: lookups.load(Ordering::Relaxed) as f64 / secs / readers.max(1) as f64,
        writes_per_writer: writes.load(Ordering::Relaxed) as f64 / secs / writers.max(1) as f64,
    }
}

fn build(system: &str, present: &[u64]) -> Box<dyn BenchMap> {
    let map: Box<dyn BenchMap> = match system {
        "bonsai" => Box::new(BonsaiTree::<u64, u64>::new()),
        "bonsai-pin64" => Box::new(BonsaiPinned(BonsaiTree::new())),
        "radix" => Box::new(RadixMap::default()),
        "radix-pin64" => Box::new(RadixPinned(RadixMap::default())),
        "radix-nocollapse" => Box::new(RadixMap::new(radix::Config {
            collapse: false,
            ..radix::Config::default()
        })),
        "rwlock-btree" => Box::new(RwLock::new(BTreeMap::new())),
        "skiplist" => Box::new(SkipMap::new()),
        other => panic!("unknown system {other}"),
    };
    for &k in present {
        map.insert(k);
    }
    map
}

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Reader counts.
    pub readers: Vec<usize>,
    /// Writer counts.
    pub writers: Vec<usize>,
    /// Also run, for each writer count above 0, that many busy threads
    /// instead of writers (the control).
    pub busy_control: bool,
    /// Seconds per run.
    pub secs: f64,
    /// Runs per cell.
    pub runs: usize,
    /// Systems, from [`SYSTEMS`].
    pub systems: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            readers: vec![1],
            writers: vec![0, 1],
            busy_control: true,
            secs: 1.0,
            runs: 3,
            systems: SYSTEMS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl Options {
    /// `--quick`: about 20 seconds for every system on 2 cores.
    pub fn quick() -> Options {
        Options {
            secs: 0.3,
            ..Options::default()
        }
    }
}

/// One result row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The system.
    pub system: String,
    /// Reader threads.
    pub readers: usize,
    /// Writer threads.
    pub writers: usize,
    /// Busy (control) threads.
    pub busy: usize,
    /// Median lookups per second per reader.
    pub lookups_per_sec_per_reader: f64,
    /// Median insert+delete pairs per second per writer (0 without
    /// writers).
    pub writes_per_sec_per_writer: f64,
    /// (max - min) / median of lookups over runs, in percent.
    pub spread_pct: f64,
    /// Runs measured.
    pub runs: usize,
}

/// The present keys: [`PRESENT_KEYS`] distinct even page numbers (writers
/// use odd ones).
pub fn present_keys() -> Vec<u64> {
    let mut state = 5;
    let mut present: Vec<u64> = Vec::new();
    while present.len() < PRESENT_KEYS {
        let k = (rng(&mut state) % KEY_SPACE_PAGES) & !1;
        if !present.contains(&k) {
            present.push(k);
        }
    }
    present
}

/// Runs every cell, calling `row` as each finishes. Panics on an unknown
/// system name.
pub fn run(options: &Options, mut row: impl FnMut(&Row)) -> Vec<Row> {
    let present = present_keys();
    let mut rows = Vec::new();
    for system in &options.systems {
        for &r in &options.readers {
            let mut configs: Vec<(usize, usize)> =
                options.writers.iter().map(|&w| (w, 0)).collect();
            if options.busy_control {
                for &w in &options.writers {
                    if w > 0 {
                        configs.push((0, w));
                    }
                }
                configs.sort_unstable();
            }
            for (w, busy) in configs {
                let mut cells = Vec::new();
                for _ in 0..options.runs.max(1) {
                    let map = build(system, &present);
                    cells.push(measure(&*map, &present, r, w, busy, options.secs));
                }
                let mut l: Vec<f64> = cells.iter().map(|c| c.lookups_per_reader).collect();
                let mut wr: Vec<f64> = cells.iter().map(|c| c.writes_per_writer).collect();
                l.sort_by(f64::total_cmp);
                wr.sort_by(f64::total_cmp);
                let lm = l[l.len() / 2];
                let result = Row {
                    system: system.clone(),
                    readers: r,
                    writers: w,
                    busy,
                    lookups_per_sec_per_reader: lm,
                    writes_per_sec_per_writer: if w == 0 { 0.0 } else { wr[wr.len() / 2] },
                    spread_pct: if lm > 0.0 {
                        (l[l.len() - 1] - l[0]) / lm * 100.0
                    } else {
                        0.0
                    },
                    runs: l.len(),
                };
                row(&result);
                rows.push(result);
            }
        }
    }
    rows
}
