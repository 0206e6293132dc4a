//! Loom models of the index's concurrency protocols, run against the real
//! code (the index's atomics come from a `std`/loom shim).
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!       cargo test -p nibble --test loom_index --release`
//!
//! * the bucket seqlock: a reader never accepts a torn pair of words that
//!   one writer changes together, and two writers exclude each other;
//! * the whole index (one subtable of 2 buckets): a lookup racing with a
//!   replace (and the growth that writer's `lock` does first) sees the
//!   old or the new location; lookups racing with a growth that moves
//!   their entries still find them (the re-check of `n`); an insert racing
//!   with a growth is not lost.
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
/// and growing them takes a few thousand atomic operations.
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
/// (3), so the next `lock` grows it first (to 3 buckets, threshold 4).
const SETUP_KEYS: u64 = 4;

/// One subtable of 2 buckets that may grow to 3 or 4, holding keys
/// `0..keys`; with `SETUP_KEYS` keys the next `lock` grows it.
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
                // (This lock grows the table first; the read races both.)
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

/// True if `key`'s home bucket changes when 2 buckets become 3 (home is
/// the low 32 hash bits scaled to the size): the growth's rebuild must
/// move its entry, or its second bucket holds it.
fn home_moves(key: u64) -> bool {
    let x = splitmix64(key) & 0xffff_ffff;
    (x * 2) >> 32 != (x * 3) >> 32
}

#[test]
fn index_read_races_growth() {
    index_model("index_read_races_growth", || {
        let index = small_index(SETUP_KEYS);
        let resizer = {
            let index = index.clone();
            thread::spawn(move || drop(index.lock(splitmix64(0))))
        };
        // A key whose home moves (if one does) and another.
        let mover = (0..SETUP_KEYS).find(|&k| home_moves(k)).unwrap_or(0);
        let other = (mover + 1) % SETUP_KEYS;
        for k in [mover, other] {
            assert_eq!(
                get(&index, k),
                Some(loc_for(k, 0)),
                "key {k} lost during resize"
            );
        }
        resizer.join().unwrap();
        assert_eq!(index.stats().buckets, 3);
    });
}

/// An insert racing with a growth. The other thread first inserts the
/// entry that puts the subtable over its threshold and then locks again,
/// which grows it, so the insert here may run entirely on the old size,
/// or lock with a stale size (and must retry: the re-check of `n`), or
/// find the subtable over its threshold and grow it itself.
#[test]
fn index_insert_races_growth() {
    index_model("index_insert_races_growth", || {
        let last = SETUP_KEYS - 1;
        let index = small_index(last);
        let resizer = {
            let index = index.clone();
            thread::spawn(move || {
                let _ = index.lock(splitmix64(last)).insert(loc_for(last, 0));
                drop(index.lock(splitmix64(0)));
            })
        };
        // A key whose home moves in the growth: an insert into its stale
        // home would be lost by the rebuild.
        let new_key = (SETUP_KEYS..).find(|&k| home_moves(k)).unwrap();
        {
            let mut g = index.lock(splitmix64(new_key));
            assert!(g.find(|l| key_of(l) == new_key).is_none());
            g.insert(loc_for(new_key, 0)).unwrap();
        }
        resizer.join().unwrap();
        // 3 after one growth; 4 if both threads found it over a threshold.
        assert!((3..=4).contains(&index.stats().buckets));
        assert_eq!(index.len(), SETUP_KEYS + 1);
        for k in (0..SETUP_KEYS).chain([new_key]) {
            assert_eq!(get(&index, k), Some(loc_for(k, 0)), "key {k}");
        }
    });
}
