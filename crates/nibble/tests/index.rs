//! Tests of the index (§4.3): a model check, concurrency stress with growth,
//! scans across growth, the byte budget, and the load factor at which a
//! neighbourhood first overflows.
//!
//! Keys are integers; a location encodes its key id and a version,
//! `loc = (key << 16 | version) + 1`, so the "read the key from the object"
//! closure the store would pass is `key_of(loc) == key`, and the resizer's
//! `rehash` is `hash(key_of(loc))`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use nibble::index::{
    Index, IndexConfig, IndexError, Loc, Neighbour, BUCKET_BYTES, ENTRIES_PER_BUCKET, LOC_BITS,
};
use proptest::prelude::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

const VERSION_BITS: u32 = 16;
const VERSION_MASK: u64 = (1 << VERSION_BITS) - 1;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A hash whose low 32 bits take only 4 values: every key lands in one of
/// 4 home buckets whatever the table size, so neighbourhoods overflow and
/// growth cannot help; tags and subtable bits stay random.
fn clustered_hash(key: u64) -> u64 {
    let h = splitmix64(key);
    (h & !0xffff_ffff) | (h & 0x3)
}

fn loc_for(key: u64, version: u64) -> Loc {
    ((key << VERSION_BITS) | (version & VERSION_MASK)) + 1
}

fn key_of(loc: Loc) -> u64 {
    (loc - 1) >> VERSION_BITS
}

/// An index over integer keys hashed with `hash`.
struct Table {
    index: Index,
    hash: fn(u64) -> u64,
}

impl Table {
    fn new(cfg: &IndexConfig, hash: fn(u64) -> u64) -> Table {
        let index = Index::new(cfg, move |loc| hash(key_of(loc))).unwrap();
        Table { index, hash }
    }

    fn get(&self, key: u64) -> Option<Loc> {
        self.index
            .read((self.hash)(key), |loc| (key_of(loc) == key).then_some(loc))
    }

    /// Insert or replace, growing as the store does; returns the old loc.
    fn put(&self, key: u64, loc: Loc) -> Result<Option<Loc>, IndexError> {
        let hash = (self.hash)(key);
        loop {
            let mut g = self.index.lock(hash);
            if let Some(slot) = g.find(|l| key_of(l) == key) {
                let old = g.loc(slot);
                g.replace(slot, loc);
                return Ok(Some(old));
            }
            match g.insert(loc) {
                Ok(slot) => {
                    assert_eq!(g.loc(slot), loc);
                    return Ok(None);
                }
                Err(IndexError::Full) => {
                    drop(g);
                    self.index.grow(hash)?;
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
    }

    fn del(&self, key: u64) -> Option<Loc> {
        let mut g = self.index.lock((self.hash)(key));
        let slot = g.find(|l| key_of(l) == key)?;
        Some(g.remove(slot))
    }

    /// A whole scan, `count` per call.
    fn scan_all(&self, count: usize) -> Vec<Loc> {
        let mut out = Vec::new();
        let mut cursor = 0;
        loop {
            cursor = self.index.scan(cursor, count, &mut out);
            if cursor == 0 {
                return out;
            }
        }
    }
}

fn cfg(subtables: usize, initial: usize, max: usize) -> IndexConfig {
    IndexConfig {
        subtables,
        initial_buckets_per_subtable: initial,
        max_buckets_per_subtable: max,
        max_bytes: usize::MAX,
        grow_load_factor: 0.85,
        numa_bind: false,
        neighbour: Neighbour::TagOffset,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Put(u64),
    Del(u64),
    Get(u64),
}

fn ops(keys: u64) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => (0..keys).prop_map(Op::Put),
            2 => (0..keys).prop_map(Op::Del),
            2 => (0..keys).prop_map(Op::Get),
        ],
        1..600,
    )
}

/// Runs `ops` against the index and a `HashMap`; puts refused with `Full`
/// leave the model unchanged (the store would report out-of-memory).
fn run_model(t: &Table, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut model: HashMap<u64, Loc> = HashMap::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Put(k) => {
                let loc = loc_for(k, step as u64);
                match t.put(k, loc) {
                    Ok(old) => prop_assert_eq!(old, model.insert(k, loc)),
                    Err(IndexError::Full) => prop_assert!(!model.contains_key(&k)),
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Op::Del(k) => prop_assert_eq!(t.del(k), model.remove(&k)),
            Op::Get(k) => prop_assert_eq!(t.get(k), model.get(&k).copied()),
        }
    }
    prop_assert_eq!(t.index.len(), model.len() as u64);
    for (&k, &loc) in &model {
        prop_assert_eq!(t.get(k), Some(loc));
        // The write path's prefetch hint: the entry of a key with k's tag
        // (k's own unless two keys of the neighbourhood share a tag).
        let peeked = t.index.peek((t.hash)(k));
        prop_assert!(peeked.is_some_and(|l| (t.hash)(key_of(l)) >> LOC_BITS
            == (t.hash)(k) >> LOC_BITS
            && model.get(&key_of(l)) == Some(&l)));
    }
    // With no concurrent change, a scan returns every entry exactly once.
    let mut scanned = t.scan_all(7);
    scanned.sort_unstable();
    let mut expected: Vec<Loc> = model.values().copied().collect();
    expected.sort_unstable();
    prop_assert_eq!(scanned, expected);
    prop_assert_eq!(t.index.stats().rehash_mismatches, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Well-mixed hashes, a table that starts at 2 buckets per subtable
    /// and doubles several times.
    #[test]
    fn model_mixed_hash(ops in ops(400)) {
        let t = Table::new(&cfg(2, 2, 1024), splitmix64);
        run_model(&t, &ops)?;
    }

    /// Every key in 4 home buckets: neighbour spills, wrap-around pairs,
    /// doublings that do not help, and `Full` at the reservation.
    #[test]
    fn model_clustered_hash(ops in ops(200)) {
        let t = Table::new(&cfg(2, 2, 64), clustered_hash);
        run_model(&t, &ops)?;
    }

    /// Every key's tag 0, the tag an empty entry (0) shares: a lookup
    /// must pass over the empty entries and still find every key.
    #[test]
    fn model_tag_zero_hash(ops in ops(300)) {
        let t = Table::new(&cfg(2, 2, 1024), tag_zero_hash);
        run_model(&t, &ops)?;
    }
}

/// A well-mixed hash with the top 16 bits (the tag) cleared.
fn tag_zero_hash(key: u64) -> u64 {
    splitmix64(key) & ((1 << LOC_BITS) - 1)
}

#[test]
fn clustered_keys_fill_both_buckets_then_report_full() {
    // One subtable, 2 buckets, no growth: exactly 2 × 15 keys fit.
    let t = Table::new(&cfg(1, 2, 2), clustered_hash);
    let mut stored = Vec::new();
    for k in 0.. {
        match t.put(k, loc_for(k, 0)) {
            Ok(None) => stored.push(k),
            Ok(Some(_)) => unreachable!(),
            Err(IndexError::Full) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(stored.len(), 2 * ENTRIES_PER_BUCKET);
    for &k in &stored {
        assert_eq!(t.get(k), Some(loc_for(k, 0)));
    }
    let s = t.index.stats();
    assert!(s.neighbour_inserts > 0 && s.failed_resizes > 0 && s.full_inserts > 0);
    assert_eq!(s.load_factor, 1.0);
}

#[test]
fn config_is_validated() {
    let bad = [
        IndexConfig {
            subtables: 3,
            ..cfg(1, 2, 4)
        },
        cfg(1, 1, 4),
        cfg(1, 4, 2),
        cfg(1, 4, 12),
        cfg(1 << 30, 2, 1 << 20),
        IndexConfig {
            grow_load_factor: f64::NAN,
            ..cfg(1, 2, 4)
        },
        IndexConfig {
            max_bytes: 100,
            ..cfg(1, 2, 4)
        },
    ];
    for c in &bad {
        assert!(
            matches!(Index::new(c, |_| 0), Err(IndexError::Config(_))),
            "{c:?} accepted"
        );
    }
    let ok = Index::new(&IndexConfig::default(), |_| 0).unwrap();
    assert!(ok.is_empty());
    let s = ok.stats();
    assert_eq!(s.slots, s.buckets * ENTRIES_PER_BUCKET as u64);
    assert!(ok.memory_bytes() >= s.buckets * BUCKET_BYTES as u64);
}

#[test]
fn index_is_shareable() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Index>();
}

#[test]
#[should_panic(expected = "not in 1..2^48")]
fn location_must_fit_48_bits() {
    let t = Table::new(&cfg(1, 2, 2), splitmix64);
    let _ = t.index.lock(1).insert(1 << LOC_BITS);
}

/// The byte budget: growth stops at `max_bytes`, the insert that needed it
/// fails with `Full`, and everything already stored stays readable and
/// replaceable.
#[test]
fn byte_budget_exhaustion_reports_full() {
    let base = Index::new(&cfg(4, 2, 1 << 12), |_| 0)
        .unwrap()
        .memory_bytes();
    let budget = base + 24 * BUCKET_BYTES as u64;
    let t = Table::new(
        &IndexConfig {
            max_bytes: budget as usize,
            ..cfg(4, 2, 1 << 12)
        },
        splitmix64,
    );
    let mut stored = Vec::new();
    let mut refused = 0;
    for k in 0..2000 {
        match t.put(k, loc_for(k, 0)) {
            Ok(_) => stored.push(k),
            Err(IndexError::Full) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(refused > 0, "the budget never ran out");
    assert!(t.index.memory_bytes() <= budget);
    let s = t.index.stats();
    assert!(s.failed_resizes > 0);
    assert_eq!(s.entries, stored.len() as u64);
    for &k in &stored {
        assert_eq!(t.get(k), Some(loc_for(k, 0)));
        assert_eq!(t.put(k, loc_for(k, 1)), Ok(Some(loc_for(k, 0))));
    }
    // Room made by a removal is usable again.
    let gone = stored[0];
    assert!(t.del(gone).is_some());
    let _ = t.put(gone, loc_for(gone, 2)).unwrap();
}

/// A `rehash` that panics in the middle of a resize must leave the index
/// intact and growable (the half-copied upper half is discarded).
#[test]
fn panicking_rehash_aborts_the_resize_cleanly() {
    let fail = Arc::new(AtomicBool::new(false));
    let fail2 = fail.clone();
    let index = Index::new(&cfg(1, 2, 64), move |loc| {
        assert!(!fail2.load(Ordering::Relaxed), "rehash failed");
        splitmix64(key_of(loc))
    })
    .unwrap();
    let t = Table {
        index,
        hash: splitmix64,
    };
    for k in 0..20 {
        t.put(k, loc_for(k, 0)).unwrap();
    }
    let before = t.index.memory_bytes();
    fail.store(true, Ordering::Relaxed);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for k in 20..400 {
            t.put(k, loc_for(k, 0)).unwrap();
        }
    }));
    assert!(r.is_err());
    assert_eq!(t.index.memory_bytes(), before, "budget leaked");
    fail.store(false, Ordering::Relaxed);
    let present: Vec<u64> = (0..400).filter(|&k| t.get(k).is_some()).collect();
    assert_eq!(present.len() as u64, t.index.len());
    for k in 0..400 {
        t.put(k, loc_for(k, 1)).unwrap();
    }
    for k in 0..400 {
        assert_eq!(t.get(k), Some(loc_for(k, 1)));
    }
    let mut scanned = t.scan_all(16);
    scanned.sort_unstable();
    scanned.dedup();
    assert_eq!(scanned.len(), 400);
}

/// The load at which the first insert finds both buckets of its
/// neighbourhood full, for both neighbour policies (tables that may not
/// grow, random keys), and for one bucket per key (simulated) as the
/// baseline. The default policy must get past 0.8.
#[test]
fn load_factor_at_first_overflow() {
    const SEEDS: u64 = 5;
    let fill_until_full = |buckets: usize, neighbour: Neighbour, seed: u64| {
        let t = Table::new(
            &IndexConfig {
                grow_load_factor: 1.0,
                neighbour,
                ..cfg(1, buckets, buckets)
            },
            splitmix64,
        );
        let mut rng = StdRng::seed_from_u64(seed);
        loop {
            let k = rng.gen_range(0..1u64 << 31);
            match t.put(k, loc_for(k, 0)) {
                Ok(_) => {}
                Err(IndexError::Full) => return t.index.stats().load_factor,
                Err(e) => panic!("{e}"),
            }
        }
    };
    let single_bucket = |buckets: usize, seed: u64| {
        let mut fill = vec![0usize; buckets];
        let mut rng = StdRng::seed_from_u64(seed);
        for n in 0.. {
            let b = splitmix64(rng.gen_range(0..1u64 << 31)) as usize & (buckets - 1);
            if fill[b] == ENTRIES_PER_BUCKET {
                return n as f64 / (buckets * ENTRIES_PER_BUCKET) as f64;
            }
            fill[b] += 1;
        }
        unreachable!()
    };
    let summary = |v: Vec<f64>| {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        (min, v.iter().sum::<f64>() / v.len() as f64)
    };
    for buckets in [64usize, 1024, 4096] {
        let (tmin, tmean) = summary(
            (0..SEEDS)
                .map(|s| fill_until_full(buckets, Neighbour::TagOffset, s))
                .collect(),
        );
        let (amin, amean) = summary(
            (0..SEEDS)
                .map(|s| fill_until_full(buckets, Neighbour::Adjacent, s))
                .collect(),
        );
        let (smin, smean) = summary((0..SEEDS).map(|s| single_bucket(buckets, s)).collect());
        println!(
            "load at first overflow, {buckets} buckets x {ENTRIES_PER_BUCKET}, min/mean of \
             {SEEDS}: tag-offset {tmin:.3}/{tmean:.3}, adjacent {amin:.3}/{amean:.3}, \
             one bucket {smin:.3}/{smean:.3}"
        );
        assert!(tmin > 0.8, "first overflow at load {tmin}");
        assert!(tmean > amean && amean > smean);
    }
}

/// Scans interleaved with growth in one thread: a deterministic check of
/// the reverse-binary cursor across doublings.
#[test]
fn scan_across_doublings_returns_every_stable_entry() {
    let t = Table::new(&cfg(2, 2, 1 << 12), splitmix64);
    for k in 0..100 {
        t.put(k, loc_for(k, 0)).unwrap();
    }
    let mut out = Vec::new();
    let mut cursor = 0;
    let mut next_key = 1000;
    let mut calls = 0;
    loop {
        cursor = t.index.scan(cursor, 3, &mut out);
        calls += 1;
        // Grow the table between calls for the first half of the scan.
        if calls < 40 {
            for _ in 0..40 {
                t.put(next_key, loc_for(next_key, 0)).unwrap();
                next_key += 1;
            }
        }
        if cursor == 0 {
            break;
        }
    }
    assert!(t.index.stats().resizes > 5);
    let seen: HashSet<u64> = out.iter().map(|&l| key_of(l)).collect();
    for k in 0..100 {
        assert!(seen.contains(&k), "scan lost key {k}");
    }
}

/// Scans from one thread while another grows the table and churns keys:
/// every key present throughout is returned.
#[test]
fn concurrent_scan_during_growth() {
    let t = Arc::new(Table::new(&cfg(2, 2, 1 << 14), splitmix64));
    const STABLE: u64 = 1000;
    for k in 0..STABLE {
        t.put(k, loc_for(k, 0)).unwrap();
    }
    let done = Arc::new(AtomicBool::new(false));
    let grower = {
        let (t, done) = (t.clone(), done.clone());
        thread::spawn(move || {
            for k in STABLE..STABLE + 12_000 {
                t.put(k, loc_for(k, 0)).unwrap();
                if k % 3 == 0 {
                    t.del(k - 1);
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let mut scans = 0;
    while !done.load(Ordering::Acquire) || scans == 0 {
        let seen: HashSet<u64> = t.scan_all(4).into_iter().map(key_of).collect();
        for k in 0..STABLE {
            assert!(seen.contains(&k), "scan {scans} lost key {k}");
        }
        scans += 1;
    }
    grower.join().unwrap();
    let s = t.index.stats();
    println!("{scans} scans during {} resizes", s.resizes);
    assert!(s.resizes > 10);
}

/// Writers insert, replace and remove disjoint and shared keys while
/// readers check every answer, and subtables grow from 2 buckets.
#[test]
fn concurrent_writers_and_readers_with_growth() {
    const WRITERS: u64 = 4;
    const READERS: usize = 2;
    const STABLE: u64 = 400; // present throughout; replaced by writer k % W
    const OWN: u64 = 1500; // per writer, only it touches them
    const SHARED: u64 = 200; // every writer puts and removes these
    const OPS: usize = 15_000;
    const OWN_BASE: u64 = 10_000;
    const SHARED_BASE: u64 = 1_000_000;
    const KEYS: u64 = SHARED_BASE + SHARED;

    let t = Arc::new(Table::new(&cfg(4, 2, 1 << 12), splitmix64));
    // Highest version written per key (versions start at 1).
    let written: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let new_loc = |written: &[AtomicU64], k: u64| {
        let v = written[k as usize].fetch_add(1, Ordering::SeqCst) + 1;
        assert!(v < VERSION_MASK);
        loc_for(k, v)
    };
    for k in 0..STABLE {
        t.put(k, new_loc(&written, k)).unwrap();
    }
    let done = Arc::new(AtomicBool::new(false));

    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (t, written, done) = (t.clone(), written.clone(), done.clone());
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(100 + r as u64);
                let mut reads = 0u64;
                while !done.load(Ordering::Acquire) || reads == 0 {
                    let k = match rng.gen_range(0..3) {
                        0 => rng.gen_range(0..STABLE),
                        1 => OWN_BASE + rng.gen_range(0..WRITERS * OWN),
                        _ => SHARED_BASE + rng.gen_range(0..SHARED),
                    };
                    let got = t.get(k);
                    if k < STABLE {
                        assert!(got.is_some(), "stable key {k} not found");
                    }
                    if let Some(loc) = got {
                        let v = (loc - 1) & VERSION_MASK;
                        let max = written[k as usize].load(Ordering::SeqCst);
                        assert!(v >= 1 && v <= max, "key {k}: version {v} never written");
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (t, written) = (t.clone(), written.clone());
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(w);
                let mut expect: HashMap<u64, Option<Loc>> = HashMap::new();
                for _ in 0..OPS {
                    match rng.gen_range(0..10) {
                        0..=1 => {
                            let k = rng.gen_range(0..STABLE / WRITERS) * WRITERS + w;
                            let loc = new_loc(&written, k);
                            assert!(t.put(k, loc).unwrap().is_some());
                            expect.insert(k, Some(loc));
                        }
                        2..=6 => {
                            let k = OWN_BASE + w * OWN + rng.gen_range(0..OWN);
                            if rng.gen_bool(0.7) {
                                let loc = new_loc(&written, k);
                                let old = t.put(k, loc).unwrap();
                                assert_eq!(old, expect.get(&k).copied().flatten());
                                expect.insert(k, Some(loc));
                            } else {
                                let old = t.del(k);
                                assert_eq!(old, expect.get(&k).copied().flatten());
                                expect.insert(k, None);
                            }
                        }
                        _ => {
                            let k = SHARED_BASE + rng.gen_range(0..SHARED);
                            if rng.gen_bool(0.6) {
                                t.put(k, new_loc(&written, k)).unwrap();
                            } else {
                                t.del(k);
                            }
                        }
                    }
                }
                expect
            })
        })
        .collect();

    let mut expect = HashMap::new();
    for w in writers {
        expect.extend(w.join().unwrap());
    }
    done.store(true, Ordering::Release);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();

    for (&k, &loc) in &expect {
        assert_eq!(t.get(k), loc, "key {k}");
    }
    for k in 0..STABLE {
        assert!(t.get(k).is_some());
    }
    // No key may have two entries (concurrent puts of a shared key must
    // not both insert), and the counters agree with the contents.
    let scanned = t.scan_all(64);
    let mut per_key: HashMap<u64, usize> = HashMap::new();
    for &loc in &scanned {
        *per_key.entry(key_of(loc)).or_default() += 1;
    }
    assert!(per_key.values().all(|&c| c == 1), "duplicate entries");
    assert_eq!(scanned.len() as u64, t.index.len());
    for k in SHARED_BASE..SHARED_BASE + SHARED {
        assert_eq!(t.get(k).is_some(), per_key.contains_key(&k));
    }
    let s = t.index.stats();
    println!(
        "{reads} reads; {} entries in {} buckets (load {:.2}), {} resizes",
        s.entries, s.buckets, s.load_factor, s.resizes
    );
    assert!(s.resizes >= 4 * 5, "too little growth: {s:?}");
    assert_eq!(s.rehash_mismatches, 0);
}

/// Most keys sit in their home bucket, the one a read looks in first (a
/// key in its second bucket costs a read a second dependent miss): below
/// the growth threshold at most 15 % of the inserts spill. Balanced
/// two-choice insertion spills a third.
#[test]
fn most_keys_sit_in_their_home_bucket() {
    for load in [0.45, 0.6, 0.75] {
        let buckets = 4096usize;
        let t = Table::new(
            &IndexConfig {
                grow_load_factor: 1.0,
                ..cfg(1, buckets, buckets)
            },
            splitmix64,
        );
        let mut rng = StdRng::seed_from_u64(7);
        let n = (buckets as f64 * ENTRIES_PER_BUCKET as f64 * load) as u64;
        let mut keys = std::collections::HashSet::new();
        while (keys.len() as u64) < n {
            let k = rng.gen_range(0..1u64 << 31);
            if keys.insert(k) {
                t.put(k, loc_for(k, 0)).unwrap();
            }
        }
        let s = t.index.stats();
        let spilled = s.neighbour_inserts as f64 / n as f64;
        println!(
            "load {load}: {:.1} % of the keys in their second bucket",
            spilled * 100.0
        );
        assert!(
            spilled < 0.15,
            "load {load}: {spilled} of the inserts spilled"
        );
    }
}

/// Deleting most keys lets the shrink halve subtables back towards
/// their initial size; every key left is still found, by reads, writes
/// and a scan, the budget follows, and the index grows again after.
#[test]
fn shrink_rebuilds_sparse_subtables_and_keeps_every_key() {
    let t = Table::new(&cfg(4, 2, 1 << 14), splitmix64);
    const KEYS: u64 = 20_000;
    for k in 0..KEYS {
        t.put(k, loc_for(k, 0)).unwrap();
    }
    let grown = t.index.stats();
    for k in 0..KEYS {
        if k % 50 != 0 {
            t.del(k);
        }
    }
    let mut halvings = 0;
    loop {
        let done = t.index.shrink_sparse();
        if done.is_empty() {
            break;
        }
        halvings += done.len();
        for s in done {
            t.index.release_shrunk(s);
        }
    }
    let small = t.index.stats();
    assert_eq!(small.shrinks as usize, halvings);
    // One rebuild a subtable takes it to `SHRINK_TO_LOAD` at once.
    assert!(halvings >= 4, "only {halvings} shrinks");
    assert!(small.memory_bytes * 4 < grown.memory_bytes, "{small:?}");
    assert!(small.load_factor < 0.85 && small.load_factor >= nibble::index::SHRINK_LOAD / 2.0);
    for k in 0..KEYS {
        let want = (k % 50 == 0).then(|| loc_for(k, 0));
        assert_eq!(t.get(k), want, "key {k}");
    }
    let seen: HashSet<u64> = t.scan_all(16).into_iter().map(key_of).collect();
    assert_eq!(seen.len() as u64, KEYS / 50);
    // Growth reuses the released halves, which read as free buckets.
    for k in KEYS..2 * KEYS {
        t.put(k, loc_for(k, 1)).unwrap();
    }
    for k in (0..KEYS).step_by(50).chain(KEYS..2 * KEYS) {
        assert!(t.get(k).is_some(), "key {k} after regrowth");
    }
    assert_eq!(t.index.len(), KEYS / 50 + KEYS);
}

/// Keys below 2^30 are their own hash (tag 0, so the second bucket is
/// home + 1; home is the low 32 bits scaled to the table size), larger
/// ones are mixed: a test places the small keys where it wants them.
fn placed_hash(key: u64) -> u64 {
    if key < 1 << 30 {
        key
    } else {
        splitmix64(key)
    }
}

/// A shrink that a full neighbourhood of the smaller table cancels is
/// not tried again at every step: only once deletes take the subtable's
/// count below 3/4 of what it was; then it shrinks, and every key stays
/// found.
#[test]
fn cancelled_shrink_waits_for_more_deletes() {
    let t = Table::new(&cfg(1, 2, 1 << 10), placed_hash);
    // Grow with fillers spread evenly, then delete them.
    const FILLER: u64 = 1 << 31;
    for i in 0..900 {
        t.put(FILLER + i, loc_for(FILLER + i, 0)).unwrap();
    }
    let grown = t.index.stats().buckets;
    assert!(grown >= 64, "{grown} buckets");
    for i in 0..900 {
        assert!(t.del(FILLER + i).is_some());
    }
    // 35 keys in the first 64th of the hash space: a few buckets of the
    // grown table (their inserts may grow it further), but one home bucket (and its neighbour, 30 entries) of the
    // 5-bucket table a shrink would build, though the subtable is 3 % full.
    let keys: Vec<u64> = (1..=35).map(|j| j * ((1 << 32) / 64 / 40)).collect();
    for &k in &keys {
        t.put(k, loc_for(k, 0)).unwrap();
    }
    let grown = t.index.stats().buckets;
    assert!(t.index.shrink_sparse().is_empty());
    let st = t.index.stats();
    assert_eq!(
        (st.shrinks, st.shrinks_cancelled, st.buckets),
        (0, 1, grown)
    );
    // 31 would not fit either, and is not below 3/4 of 35: no retry.
    for &k in &keys[..4] {
        assert!(t.del(k).is_some());
    }
    assert!(t.index.shrink_sparse().is_empty());
    assert_eq!(t.index.stats().shrinks_cancelled, 1);
    // 23 keys are, and fit: it shrinks.
    for &k in &keys[4..12] {
        assert!(t.del(k).is_some());
    }
    let done = t.index.shrink_sparse();
    assert_eq!(done.len(), 1);
    for s in done {
        t.index.release_shrunk(s);
    }
    let st = t.index.stats();
    assert_eq!((st.shrinks, st.shrinks_cancelled), (1, 1));
    assert!(st.buckets < 8, "{st:?}");
    for &k in &keys[12..] {
        assert_eq!(t.get(k), Some(loc_for(k, 0)), "key {k}");
    }
    for &k in &keys[..12] {
        assert_eq!(t.get(k), None, "deleted key {k}");
    }
}

/// Readers and a writer run while another thread keeps shrinking (and
/// the writer's inserts keep growing) the same subtables: no reader ever
/// misses a key that is present throughout.
#[test]
fn concurrent_readers_during_shrink_and_growth() {
    let t = Arc::new(Table::new(&cfg(2, 2, 1 << 14), splitmix64));
    const STABLE: u64 = 500;
    for k in 0..STABLE {
        t.put(k, loc_for(k, 0)).unwrap();
    }
    let done = Arc::new(AtomicBool::new(false));
    let churn = {
        let (t, done) = (t.clone(), done.clone());
        thread::spawn(move || {
            for round in 0..30u64 {
                let base = 1_000_000 + round * 10_000;
                for k in base..base + 4_000 {
                    t.put(k, loc_for(k, 0)).unwrap();
                }
                for k in base..base + 4_000 {
                    t.del(k);
                }
                // A sparse moment for the shrinker to find.
                thread::sleep(std::time::Duration::from_millis(2));
            }
            done.store(true, Ordering::Release);
        })
    };
    let shrinker = {
        let (t, done) = (t.clone(), done.clone());
        thread::spawn(move || {
            let mut n = 0;
            while !done.load(Ordering::Acquire) {
                for s in t.index.shrink_sparse() {
                    n += 1;
                    // No epochs here: release only what no reader uses,
                    // i.e. never (readers run throughout); the halving
                    // alone is what is under test.
                    let _ = s;
                }
                thread::yield_now();
            }
            n
        })
    };
    let mut reads = 0u64;
    while !done.load(Ordering::Acquire) {
        for k in 0..STABLE {
            assert_eq!(t.get(k), Some(loc_for(k, 0)), "read {reads}: key {k}");
            reads += 1;
        }
    }
    churn.join().unwrap();
    let halvings = shrinker.join().unwrap();
    println!("{reads} reads, {halvings} shrinks");
    assert!(halvings > 0);
    for k in 0..STABLE {
        assert_eq!(t.get(k), Some(loc_for(k, 0)));
    }
}

/// Inserts after a miss pick their slots from the free slots the miss
/// recorded: through one guard, 30 inserts fill both buckets with distinct
/// entries, the 31st is refused, and an insert after a removal takes the
/// freed slot; every entry is then found by an optimistic read.
#[test]
fn inserts_through_one_guard_after_a_miss() {
    const HASH: u64 = 0xabcd_0000_0000_0005;
    let index = Index::new(
        &IndexConfig {
            grow_load_factor: 1.0,
            ..cfg(1, 2, 2)
        },
        |_| HASH,
    )
    .unwrap();
    let mut g = index.lock(HASH);
    assert!(g.find(|_| false).is_none());
    let mut slots = Vec::new();
    for key in 0..2 * ENTRIES_PER_BUCKET as u64 {
        let slot = g.insert(loc_for(key, 0)).expect("room for 30 entries");
        assert!(!slots.contains(&slot), "slot {slot:?} handed out twice");
        slots.push(slot);
    }
    assert!(matches!(g.insert(loc_for(99, 0)), Err(IndexError::Full)));
    let gone = g.find_any(|l| l == loc_for(5, 0)).expect("key 5 is there");
    assert_eq!(g.remove(gone), loc_for(5, 0));
    assert_eq!(g.insert(loc_for(100, 0)).unwrap(), gone);
    drop(g);
    for key in (0..2 * ENTRIES_PER_BUCKET as u64).chain([100]) {
        let found = index.read(HASH, |l| (key_of(l) == key).then_some(l));
        assert_eq!(found, (key != 5).then(|| loc_for(key, 0)), "key {key}");
    }
}

/// `initial_buckets_for` (the store's `expected_keys`): enough buckets that
/// the expected keys stay under every subtable's growth threshold, a power
/// of two, the default without a hint, and never over the byte budget.
#[test]
fn initial_buckets_hold_the_expected_keys_within_the_budget() {
    use nibble::index::{
        initial_buckets_for, DEFAULT_GROW_LOAD_FACTOR, DEFAULT_INITIAL_BUCKETS_PER_SUBTABLE,
    };
    assert_eq!(
        initial_buckets_for(0, 8, usize::MAX),
        DEFAULT_INITIAL_BUCKETS_PER_SUBTABLE
    );
    for keys in [1usize, 1_000, 200_000, 1_000_000, 12_345_678] {
        for subtables in [1usize, 8, 64] {
            let b = initial_buckets_for(keys, subtables, usize::MAX);
            assert!(b.is_power_of_two() && b >= DEFAULT_INITIAL_BUCKETS_PER_SUBTABLE);
            let threshold = DEFAULT_GROW_LOAD_FACTOR * (b * ENTRIES_PER_BUCKET) as f64;
            assert!(
                threshold >= keys.div_ceil(subtables) as f64,
                "{keys} keys, {subtables} subtables: {b} buckets"
            );
            // No more than twice what the keys need (one rounding up).
            let budget = 2 * keys.div_ceil(subtables) + 200 * (keys as f64).sqrt() as usize;
            assert!(
                b <= (budget / ENTRIES_PER_BUCKET).next_power_of_two().max(32),
                "{keys} keys, {subtables} subtables: {b} buckets"
            );
            // The budget caps it.
            let max_bytes = 1 << 20;
            let capped = initial_buckets_for(keys, subtables, max_bytes);
            assert!(
                capped == DEFAULT_INITIAL_BUCKETS_PER_SUBTABLE
                    || capped * subtables * BUCKET_BYTES <= max_bytes / 4 * 3,
                "{keys} keys, {subtables} subtables: {capped} buckets"
            );
        }
    }
}

/// A store-sized key count in a pre-sized index: two threads insert them
/// all without one resize, and every key is found.
#[test]
fn a_pre_sized_index_takes_its_keys_without_growing() {
    use nibble::index::initial_buckets_for;
    let keys = 100_000u64;
    let subtables = 8;
    let initial = initial_buckets_for(keys as usize, subtables, usize::MAX);
    let t = Table::new(&cfg(subtables, initial, 1 << 16), splitmix64);
    thread::scope(|s| {
        for w in 0..2u64 {
            let t = &t;
            s.spawn(move || {
                for k in (w..keys).step_by(2) {
                    assert_eq!(t.put(k, loc_for(k, 1)).unwrap(), None);
                }
            });
        }
    });
    assert_eq!(t.index.stats().resizes, 0);
    for k in 0..keys {
        assert_eq!(t.get(k), Some(loc_for(k, 1)), "key {k}");
    }
}

/// Growth by a quarter: as keys arrive the load never falls under 0.6
/// (a doubling would leave 0.425), every growth adds a quarter of the
/// buckets, and every key inserted so far is found after each growth.
#[test]
fn growth_by_quarters_keeps_the_load_high_and_every_key() {
    let t = Table::new(&cfg(1, 2, 1 << 16), splitmix64);
    let mut buckets = t.index.stats().buckets;
    let mut growths = 0;
    for k in 0..60_000u64 {
        t.put(k, loc_for(k, 0)).unwrap();
        let s = t.index.stats();
        if s.buckets != buckets {
            growths += 1;
            let added = s.buckets - buckets;
            assert!(added <= buckets / 4 + 1, "{buckets} -> {}", s.buckets);
            if k > 1_000 {
                assert!(s.load_factor > 0.6, "load {} after a growth", s.load_factor);
                for j in (0..=k).step_by(7) {
                    assert_eq!(t.get(j), Some(loc_for(j, 0)), "key {j}");
                }
            }
            buckets = s.buckets;
        }
    }
    assert!(growths > 20, "{growths} growths");
    for k in 0..60_000u64 {
        assert_eq!(t.get(k), Some(loc_for(k, 0)), "key {k}");
    }
    let seen: HashSet<u64> = t.scan_all(64).into_iter().map(key_of).collect();
    assert_eq!(seen.len(), 60_000);
}
