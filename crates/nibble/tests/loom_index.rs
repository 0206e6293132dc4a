//! Loom models of the index's concurrency protocols, run against the real
//! code (the index's atomics come from a `std`/loom shim).
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!       cargo test -p nibble --test loom_index --release`
//!
//! * the bucket seqlock: a reader never accepts a torn pair of words that
//!   one writer changes together, and two writers exclude each other;
//! * the whole index (one subtable of 2 buckets): a lookup racing with a
//!   replace sees the old or the new location, and a lookup racing with a
//!   doubling that moves its entry still finds it (the re-check of `n`);
//!   an insert racing with a doubling is not lost.
//!
//! The index models are large (a resize touches ~130 atomics), so they
//! run with a preemption bound (default 2, or `LOOM_MAX_PREEMPTIONS`).
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};

use loom::sync::Arc;
use loom::thread;

use nibble::index::bucket::Bucket;
use nibble::index::{Index, IndexConfig, Loc, Neighbour, ENTRIES_PER_BUCKET};

/// Preemption bound for the index-level models when the environment sets
/// none.
const INDEX_PREEMPTION_BOUND: usize = 2;

/// Loom's limit on scheduling points in one execution: filling 2 buckets
/// and doubling them takes a few thousand atomic operations.
const INDEX_MAX_BRANCHES: usize = 50_000;

/// The two words a writer changes together: `(x, x + PAIR_DISTANCE)`.
const PAIR_DISTANCE: u64 = 100;

#[test]
fn seqlock_reader_never_sees_a_torn_pair() {
    loom::model(|| {
        let bucket = Arc::new(Bucket::<2>::new());
        {
            let mut g = bucket.lock();
            g.store(0, 1);
            g.store(1, 1 + PAIR_DISTANCE);
        }
        let writer = {
            let bucket = bucket.clone();
            thread::spawn(move || {
                let mut g = bucket.lock();
                g.store(0, 2);
                g.store(1, 2 + PAIR_DISTANCE);
            })
        };
        let (x, y) = loop {
            let v = bucket.read_begin();
            let (x, y) = (bucket.load(0), bucket.load(1));
            if bucket.read_validate(v) {
                break (x, y);
            }
        };
        assert_eq!(y, x + PAIR_DISTANCE, "torn read: ({x}, {y})");
        writer.join().unwrap();
    });
}

#[test]
fn seqlock_writers_exclude_each_other() {
    loom::model(|| {
        let bucket = Arc::new(Bucket::<2>::new());
        let add_one = |bucket: Arc<Bucket<2>>| {
            move || {
                let mut g = bucket.lock();
                let (x, y) = (g.load(0), g.load(1));
                g.store(0, x + 1);
                g.store(1, y + 1);
            }
        };
        let t = thread::spawn(add_one(bucket.clone()));
        add_one(bucket.clone())();
        t.join().unwrap();
        let v = bucket.read_begin();
        assert_eq!((bucket.load(0), bucket.load(1)), (2, 2));
        assert!(bucket.read_validate(v));
    });
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn loc_for(key: u64, version: u64) -> Loc {
    ((key << 16) | version) + 1
}

fn key_of(loc: Loc) -> u64 {
    (loc - 1) >> 16
}

fn get(index: &Index, key: u64) -> Option<Loc> {
    index.read(splitmix64(key), |l| (key_of(l) == key).then_some(l))
}

/// One subtable of 2 buckets that may double once, holding `keys`.
fn small_index(keys: impl Iterator<Item = u64>) -> Arc<Index> {
    let cfg = IndexConfig {
        subtables: 1,
        initial_buckets_per_subtable: 2,
        max_buckets_per_subtable: 4,
        max_bytes: usize::MAX,
        grow_load_factor: 1.0,
        numa_bind: false,
        neighbour: Neighbour::TagOffset,
    };
    let index = Index::new(&cfg, |loc| splitmix64(key_of(loc))).unwrap();
    for k in keys {
        index.lock(splitmix64(k)).insert(loc_for(k, 0)).unwrap();
    }
    Arc::new(index)
}

/// Runs `f` under loom and prints how many executions were explored.
fn index_model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    static EXECUTIONS: AtomicUsize = AtomicUsize::new(0);
    let before = EXECUTIONS.load(Ordering::Relaxed);
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(INDEX_PREEMPTION_BOUND);
    }
    builder.max_branches = builder.max_branches.max(INDEX_MAX_BRANCHES);
    builder.check(move || {
        EXECUTIONS.fetch_add(1, Ordering::Relaxed);
        f()
    });
    println!(
        "{name}: {} executions",
        EXECUTIONS.load(Ordering::Relaxed) - before
    );
}

#[test]
fn index_read_races_replace() {
    index_model("index_read_races_replace", || {
        let index = small_index(0..4);
        let writer = {
            let index = index.clone();
            thread::spawn(move || {
                let mut g = index.lock(splitmix64(1));
                let slot = g.find(|l| key_of(l) == 1).unwrap();
                g.replace(slot, loc_for(1, 1));
            })
        };
        let got = get(&index, 1);
        assert!(
            got == Some(loc_for(1, 0)) || got == Some(loc_for(1, 1)),
            "{got:?}"
        );
        writer.join().unwrap();
        assert_eq!(get(&index, 1), Some(loc_for(1, 1)));
    });
}

/// A key whose entry moves from bucket c to c + 2 when 2 buckets double.
fn moving_key() -> u64 {
    (0..).find(|&k| splitmix64(k) & 2 != 0).unwrap()
}

#[test]
fn index_read_races_doubling() {
    index_model("index_read_races_doubling", || {
        // Both buckets full, so `grow` really doubles.
        let keys = 0..2 * ENTRIES_PER_BUCKET as u64;
        let index = small_index(keys);
        let k = moving_key();
        assert!(k < 2 * ENTRIES_PER_BUCKET as u64);
        let resizer = {
            let index = index.clone();
            thread::spawn(move || index.grow(splitmix64(k)).unwrap())
        };
        assert_eq!(get(&index, k), Some(loc_for(k, 0)), "lost during resize");
        resizer.join().unwrap();
        assert_eq!(index.stats().buckets, 4);
        assert_eq!(get(&index, k), Some(loc_for(k, 0)));
    });
}

#[test]
fn index_insert_races_doubling() {
    index_model("index_insert_races_doubling", || {
        let full = 2 * ENTRIES_PER_BUCKET as u64;
        let index = small_index(0..full - 1);
        let resizer = {
            let index = index.clone();
            // Forces a doubling whether or not the insert got there first.
            thread::spawn(move || {
                let _ = index.grow(splitmix64(0));
            })
        };
        let new_key = full;
        {
            let mut g = index.lock(splitmix64(new_key));
            assert!(g.find(|l| key_of(l) == new_key).is_none());
            g.insert(loc_for(new_key, 0)).unwrap();
        }
        resizer.join().unwrap();
        assert_eq!(index.len(), full);
        assert_eq!(get(&index, new_key), Some(loc_for(new_key, 0)));
        assert_eq!(get(&index, 0), Some(loc_for(0, 0)));
    });
}
