//! Loom models of the index's concurrency protocols, run against the real
//! code (the index's atomics come from a `std`/loom shim).
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!       cargo test -p nibble --test loom_index --release`
//!
//! * the bucket seqlock: a reader never accepts a torn pair of words that
//!   one writer changes together, and two writers exclude each other;
//! * the whole index (one subtable of 2 buckets): a lookup racing with a
//!   replace (and the doubling that writer's `lock` does first) sees the
//!   old or the new location; lookups racing with a doubling that moves
//!   their entries still find them (the re-check of `n`); an insert racing
//!   with a doubling is not lost.
//!
//! The index models are large (a resize touches ~130 atomics), so they
//! run with a preemption bound (default below, or `LOOM_MAX_PREEMPTIONS`).
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};

use loom::sync::Arc;
use loom::thread;

use nibble::index::bucket::Bucket;
use nibble::index::{Index, IndexConfig, Loc, Neighbour};

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

/// Keys in the index models' setup. With `grow_load_factor` 0.1, a
/// 2-bucket subtable (30 slots) holding 4 entries is past its threshold
/// (3), so the next `lock` doubles it first; at 4 buckets the threshold is 6.
const SETUP_KEYS: u64 = 4;

/// One subtable of 2 buckets that may double once, holding keys
/// `0..keys`; with `SETUP_KEYS` keys the next `lock` doubles it.
fn small_index(keys: u64) -> Arc<Index> {
    let cfg = IndexConfig {
        subtables: 1,
        initial_buckets_per_subtable: 2,
        max_buckets_per_subtable: 4,
        max_bytes: usize::MAX,
        grow_load_factor: 0.1,
        numa_bind: false,
        neighbour: Neighbour::TagOffset,
    };
    let index = Index::new(&cfg, |loc| splitmix64(key_of(loc))).unwrap();
    for k in 0..keys {
        index.lock(splitmix64(k)).insert(loc_for(k, 0)).unwrap();
    }
    assert_eq!(index.stats().buckets, 2);
    Arc::new(index)
}

/// Runs `f` under loom and prints how many executions were explored.
fn index_model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    let executions = std::sync::Arc::new(AtomicUsize::new(0));
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(INDEX_PREEMPTION_BOUND);
    }
    builder.max_branches = builder.max_branches.max(INDEX_MAX_BRANCHES);
    let counter = executions.clone();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f()
    });
    println!("{name}: {} executions", executions.load(Ordering::Relaxed));
}

#[test]
fn index_read_races_replace() {
    index_model("index_read_races_replace", || {
        let index = small_index(SETUP_KEYS);
        let writer = {
            let index = index.clone();
            thread::spawn(move || {
                // (This lock doubles the table first; the read races both.)
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

/// True if `key`'s entry must move when 2 buckets become 4: both its home
/// and its second bucket are in the new upper half.
fn surely_moves(key: u64) -> bool {
    let h = splitmix64(key);
    let home = h & 3;
    let second = (home + ((h >> 48) | 1)) & 3;
    home >= 2 && second >= 2
}

#[test]
fn index_read_races_doubling() {
    index_model("index_read_races_doubling", || {
        let index = small_index(SETUP_KEYS);
        let resizer = {
            let index = index.clone();
            thread::spawn(move || drop(index.lock(splitmix64(0))))
        };
        // A key that must move and one that may stay.
        let mover = (0..SETUP_KEYS).find(|&k| surely_moves(k)).unwrap();
        let other = (mover + 1) % SETUP_KEYS;
        for k in [mover, other] {
            assert_eq!(
                get(&index, k),
                Some(loc_for(k, 0)),
                "key {k} lost during resize"
            );
        }
        resizer.join().unwrap();
        assert_eq!(index.stats().buckets, 4);
    });
}

/// An insert racing with a doubling. The other thread first inserts the
/// entry that puts the subtable over its threshold and then locks again,
/// which doubles it, so the insert here may run entirely on the old size,
/// or lock with a stale size (and must retry: the re-check of `n`), or
/// find the subtable over its threshold and double it itself.
#[test]
fn index_insert_races_doubling() {
    index_model("index_insert_races_doubling", || {
        let last = SETUP_KEYS - 1;
        let index = small_index(last);
        let resizer = {
            let index = index.clone();
            thread::spawn(move || {
                let _ = index.lock(splitmix64(last)).insert(loc_for(last, 0));
                drop(index.lock(splitmix64(0)));
            })
        };
        // A key whose neighbourhood is in the upper half after the
        // doubling: an insert into the stale lower half would be lost.
        let new_key = (SETUP_KEYS..).find(|&k| surely_moves(k)).unwrap();
        {
            let mut g = index.lock(splitmix64(new_key));
            assert!(g.find(|l| key_of(l) == new_key).is_none());
            g.insert(loc_for(new_key, 0)).unwrap();
        }
        resizer.join().unwrap();
        assert_eq!(index.stats().buckets, 4);
        assert_eq!(index.len(), SETUP_KEYS + 1);
        for k in (0..SETUP_KEYS).chain([new_key]) {
            assert_eq!(get(&index, k), Some(loc_for(k, 0)), "key {k}");
        }
    });
}
