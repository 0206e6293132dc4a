//! Cache mode (module `compaction::evict`): a full store evicts instead of
//! refusing writes, loses no item it did not report evicted, never evicts
//! pinned items or (under `volatile_only`) persistent ones, never serves
//! a stale version, and keeps recently read items under merge eviction.
//! `NIBBLE_STRESS_MS` lengthens the concurrent run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nibble::{Config, Error, Eviction, EvictionPolicy, Expiry, Mode, PutOptions, Store};

const CAPACITY_BYTES: usize = 8 << 20;
const VALUE_BYTES: usize = 400;
/// Bound on waiting for the background workers to finish (a pass takes
/// milliseconds; this only turns a hang into a failure).
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(30);

const POLICIES: [EvictionPolicy; 4] = [
    EvictionPolicy::Fifo,
    EvictionPolicy::LeastLive,
    EvictionPolicy::Random,
    EvictionPolicy::Merge,
];

fn store(mode: Mode, policy: EvictionPolicy) -> Store {
    let mut cfg = Config::new(CAPACITY_BYTES);
    cfg.mode = mode;
    cfg.eviction = Eviction {
        policy,
        volatile_only: false,
    };
    Store::new(cfg).unwrap()
}

fn key(i: u64) -> Vec<u8> {
    format!("key:{i:010}").into_bytes()
}

/// A value that names its key and version, so a stale or torn read shows.
fn value(i: u64, ver: u64) -> Vec<u8> {
    let mut v = format!("{i}:{ver}:").into_bytes();
    v.resize(VALUE_BYTES, b'x' + (ver % 7) as u8);
    v
}

/// Keys whose data is about twice the capacity.
fn overfill_keys() -> u64 {
    (2 * CAPACITY_BYTES / VALUE_BYTES) as u64
}

/// Every policy on Nibble, merge on Nibble-2 (the eviction sweep is the
/// same code in both modes; this keeps `cargo test` fast).
fn cases() -> Vec<(Mode, EvictionPolicy)> {
    POLICIES
        .iter()
        .map(|&p| (Mode::Nibble, p))
        .chain([(Mode::Nibble2, EvictionPolicy::Merge)])
        .collect()
}

#[test]
fn noeviction_refuses_and_evicts_nothing() {
    let s = store(Mode::Nibble, EvictionPolicy::NoEviction);
    let mut refused = false;
    for i in 0..overfill_keys() {
        match s.put(&key(i), &value(i, 0)) {
            Ok(_) => {}
            Err(Error::OutOfMemory { what }) => {
                assert_eq!(what, "log");
                refused = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(refused, "a store without eviction fills up");
    assert_eq!(s.stats().evicted_items, 0);
}

/// The model: every key written once; at the end each is either present
/// with its value or missing, and the missing ones are exactly the items
/// the store reports evicted. Eviction is asynchronous (the last puts wake
/// a worker that evicts after they returned), so the store is quiesced
/// first: counting while that pass runs finds items it is about to count.
#[test]
fn model_no_item_lost_but_the_evicted() {
    {
        for (mode, policy) in cases() {
            let s = store(mode, policy);
            let n = overfill_keys();
            for i in 0..n {
                s.put(&key(i), &value(i, 0))
                    .unwrap_or_else(|e| panic!("{mode:?} {policy:?}: put {i}: {e}"));
            }
            assert!(s.quiesce(QUIESCE_TIMEOUT), "{mode:?} {policy:?}: quiesce");
            let mut missing = 0;
            for i in 0..n {
                match s.get(&key(i)).unwrap() {
                    Some(v) => assert_eq!(v, value(i, 0), "{mode:?} {policy:?}"),
                    None => missing += 1,
                }
            }
            let st = s.stats();
            assert!(
                missing > n / 2,
                "{mode:?} {policy:?}: the store holds less than half"
            );
            assert_eq!(
                missing, st.evicted_items,
                "{mode:?} {policy:?}: every missing item was reported evicted"
            );
            assert_eq!(s.len(), n - missing);
        }
    }
}

/// Overwrites and deletes mixed in: what is present is the latest version
/// (eviction never resurrects an old one), deleted keys stay deleted.
#[test]
fn model_with_overwrites_never_serves_stale() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        for policy in [EvictionPolicy::Fifo, EvictionPolicy::Merge] {
            let s = store(mode, policy);
            let mut model: HashMap<u64, Option<u64>> = HashMap::new();
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let keys = overfill_keys() / 2;
            for step in 0..overfill_keys() * 3 / 2 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = x % keys;
                if step % 10 == 9 {
                    s.delete(&key(i)).unwrap();
                    model.insert(i, None);
                } else {
                    s.put(&key(i), &value(i, step)).unwrap();
                    model.insert(i, Some(step));
                    if step % 3 == 0 {
                        let _ = s.get(&key(i)).unwrap();
                    }
                }
            }
            for (&i, &ver) in &model {
                let got = s.get(&key(i)).unwrap();
                match (ver, got) {
                    (None, Some(_)) => panic!("{mode:?} {policy:?}: deleted key {i} is back"),
                    (Some(v), Some(g)) => {
                        assert_eq!(g, value(i, v), "{mode:?} {policy:?}: stale key {i}")
                    }
                    _ => {}
                }
            }
            assert!(s.stats().evicted_items > 0);
        }
    }
}

#[test]
fn pinned_items_are_never_evicted() {
    {
        for (mode, policy) in cases() {
            let s = store(mode, policy);
            let pinned = 1000;
            for i in 0..pinned {
                s.put_never_evict(&key(i), &value(i, 1), PutOptions::default())
                    .unwrap();
            }
            for i in pinned..overfill_keys() {
                s.put(&key(i), &value(i, 0)).unwrap();
            }
            for i in 0..pinned {
                assert_eq!(
                    s.get(&key(i)).unwrap(),
                    Some(value(i, 1)),
                    "{mode:?} {policy:?}: pinned key {i}"
                );
            }
            assert!(s.stats().evicted_items > 0);
        }
    }
}

#[test]
fn volatile_only_evicts_only_items_with_an_expiry() {
    let mut cfg = Config::new(CAPACITY_BYTES);
    cfg.eviction = Eviction {
        policy: EvictionPolicy::Merge,
        volatile_only: true,
    };
    cfg.max_write_wait_ms = 200;
    let s = Store::new(cfg).unwrap();
    let far = PutOptions {
        expiry: Expiry::At(nibble::object::now_ms() + 3_600_000),
        ..Default::default()
    };
    let persistent = 1500;
    for i in 0..persistent {
        s.put(&key(i), &value(i, 0)).unwrap();
    }
    for i in persistent..overfill_keys() {
        s.put_with(&key(i), &value(i, 0), far).unwrap();
    }
    for i in 0..persistent {
        assert!(s.get(&key(i)).unwrap().is_some(), "persistent key {i}");
    }
    assert!(s.stats().evicted_items > 0);
    // Only persistent items left to write: the store fills and refuses.
    let mut refused = false;
    for i in overfill_keys()..3 * overfill_keys() {
        if let Err(e) = s.put(&key(i), &value(i, 0)) {
            assert!(matches!(e, Error::OutOfMemory { what: "log" }), "{e}");
            refused = true;
            break;
        }
    }
    assert!(
        refused,
        "volatile-only eviction never evicts persistent items"
    );
}

#[test]
fn eviction_can_be_switched_on_while_running() {
    let mut cfg = Config::new(CAPACITY_BYTES);
    cfg.max_write_wait_ms = 200;
    let s = Store::new(cfg).unwrap();
    let mut i = 0;
    while s.put(&key(i), &value(i, 0)).is_ok() {
        i += 1;
    }
    assert_eq!(s.stats().evicted_items, 0);
    s.set_eviction(Eviction {
        policy: EvictionPolicy::Merge,
        volatile_only: false,
    });
    assert_eq!(s.eviction().policy, EvictionPolicy::Merge);
    for j in i..i + overfill_keys() {
        s.put(&key(j), &value(j, 0)).unwrap();
    }
    assert!(s.stats().evicted_items > 0);
}

/// Hit ratio of a hot set read between writes of cold keys: merge
/// eviction keeps what is read, FIFO does not.
fn hot_set_survival(policy: EvictionPolicy) -> f64 {
    let s = store(Mode::Nibble, policy);
    let hot = 1000u64;
    for i in 0..hot {
        s.put(&key(i), &value(i, 0)).unwrap();
    }
    let (mut hits, mut reads) = (0u64, 0u64);
    for i in hot..overfill_keys() {
        s.put(&key(i), &value(i, 0)).unwrap();
        let h = i % hot;
        reads += 1;
        if s.get(&key(h)).unwrap().is_some() {
            hits += 1;
        } else {
            // A cache refills what missed.
            s.put(&key(h), &value(h, 0)).unwrap();
        }
    }
    hits as f64 / reads as f64
}

#[test]
fn merge_keeps_recently_read_items() {
    let merge = hot_set_survival(EvictionPolicy::Merge);
    let fifo = hot_set_survival(EvictionPolicy::Fifo);
    assert!(merge > 0.95, "merge hit ratio {merge:.3}");
    assert!(merge > fifo, "merge {merge:.3} vs fifo {fifo:.3}");
}

/// Hit ratio of a hot set read a few times per round while cold keys
/// stream through, each set and then read once (so each cold object was
/// read since it was written, as a hot one was): merge eviction keeps the
/// keys read most (the frequency sketch), not merely the ones read since
/// they were written.
fn frequent_beats_recent(mode: Mode) -> f64 {
    let s = store(mode, EvictionPolicy::Merge);
    // A hot set of a third of what the store holds.
    let hot = (CAPACITY_BYTES / VALUE_BYTES / 3) as u64;
    let (mut hits, mut reads) = (0u64, 0u64);
    let mut cold = 1_000_000u64;
    for round in 0..3 * hot {
        let h = round % hot;
        for _ in 0..3 {
            reads += u64::from(round >= hot);
            if s.get(&key(h)).unwrap().is_some() {
                hits += u64::from(round >= hot);
            } else {
                s.put(&key(h), &value(h, 0)).unwrap();
            }
        }
        for _ in 0..4 {
            s.put(&key(cold), &value(cold, 0)).unwrap();
            assert!(s.get(&key(cold)).unwrap().is_some());
            cold += 1;
        }
    }
    hits as f64 / reads.max(1) as f64
}

#[test]
fn merge_keeps_frequently_read_items_over_once_read_ones() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let r = frequent_beats_recent(mode);
        // With the accessed bit alone (every cold object was read too) the
        // hot set's hit ratio here is about 0.67; with the sketch 0.89-0.95
        // (the low end when the machine is loaded: compaction runs behind
        // the writers and each merge sees fewer of the hot set's reads).
        assert!(r > 0.8, "{mode:?}: hot hit ratio {r:.3}");
    }
}

fn stress_ms() -> u64 {
    std::env::var("NIBBLE_STRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(700)
}

/// Readers check every value they get against its key while writers
/// overfill the store and eviction runs: an evicted item is a miss, never
/// a torn or foreign value (epochs protect the copy, the seqlock
/// validates it).
#[test]
fn readers_during_eviction() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let s = store(mode, EvictionPolicy::Merge);
        let stop = AtomicBool::new(false);
        let written = AtomicU64::new(0);
        let hits = AtomicU64::new(0);
        let keys = overfill_keys();
        std::thread::scope(|sc| {
            for w in 0..2u64 {
                let (s, stop, written) = (&s, &stop, &written);
                sc.spawn(move || {
                    let mut i = w;
                    while !stop.load(Ordering::Relaxed) {
                        let k = i % keys;
                        s.put(&key(k), &value(k, k)).unwrap();
                        written.fetch_max(i, Ordering::Relaxed);
                        i += 2;
                    }
                });
            }
            for r in 0..2u64 {
                let (s, stop, written, hits) = (&s, &stop, &written, &hits);
                sc.spawn(move || {
                    let mut buf = Vec::new();
                    let mut x = r + 1;
                    while !stop.load(Ordering::Relaxed) {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        let top = written.load(Ordering::Relaxed).max(1);
                        let k = ((x >> 33) % top) % keys;
                        if s.get_into(&key(k), &mut buf).unwrap().is_some() {
                            assert_eq!(buf, value(k, k), "{mode:?}: key {k}");
                            hits.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            let start = Instant::now();
            // At least the stress time, and on until eviction has run
            // under the readers (bounded).
            while start.elapsed() < Duration::from_millis(stress_ms())
                || (s.stats().evicted_items < 1000 && start.elapsed() < Duration::from_secs(30))
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            stop.store(true, Ordering::Relaxed);
        });
        let st = s.stats();
        assert!(hits.load(Ordering::Relaxed) > 0);
        assert!(
            st.evicted_items >= 1000,
            "{mode:?}: no eviction under readers"
        );
    }
}

/// Small objects run out of index entries before log space when the
/// index keeps to its own share (`index_borrows_from_log = false`; by
/// default it borrows log blocks, `tests/index_budget.rs`): under
/// `NoEviction` the error says so; in cache mode an entry of the full
/// neighbourhood is evicted instead, and the model still holds.
#[test]
fn small_objects_evict_index_entries() {
    let tiny = |i: u64| i.to_le_bytes();
    let mut cfg = Config::new(CAPACITY_BYTES);
    cfg.max_write_wait_ms = 200;
    cfg.index_borrows_from_log = false;
    let s = Store::new(cfg.clone()).unwrap();
    let mut i = 0u64;
    let e = loop {
        match s.put(&key(i), &tiny(i)) {
            Ok(_) => i += 1,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(e, Error::OutOfMemory { what: "index" }),
        "{e} after {i} keys"
    );
    drop(s);
    cfg.eviction = Eviction {
        policy: EvictionPolicy::Merge,
        volatile_only: false,
    };
    let s = Store::new(cfg).unwrap();
    let n = 2 * i;
    for j in 0..n {
        s.put(&key(j), &tiny(j))
            .unwrap_or_else(|e| panic!("put {j}: {e}"));
    }
    assert!(s.quiesce(QUIESCE_TIMEOUT));
    let missing = (0..n)
        .filter(|&j| match s.get(&key(j)).unwrap() {
            Some(v) => {
                assert_eq!(v, tiny(j));
                false
            }
            None => true,
        })
        .count() as u64;
    assert_eq!(missing, s.stats().evicted_items);
    // Evicting only where a neighbourhood is full fills the index past
    // the load of the first refusal without eviction.
    assert!(missing > 0 && n - missing >= i, "{missing} of {n}, {i}");
}

/// Under `NoEviction`, once a write was refused and nothing was freed
/// since, a refusal costs no more than a write; deletes and compaction
/// end it.
#[test]
fn a_known_full_store_refuses_at_once() {
    let mut cfg = Config::new(CAPACITY_BYTES);
    cfg.max_write_wait_ms = 500;
    let s = Store::new(cfg).unwrap();
    let mut i = 0;
    while s.put(&key(i), &value(i, 0)).is_ok() {
        i += 1;
    }
    let refusals = 200;
    let t = Instant::now();
    for j in 0..refusals {
        let e = s.put(&key(i + j), &value(i + j, 0)).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { what: "log" }), "{e}");
    }
    let per = t.elapsed() / refusals as u32;
    assert!(per < Duration::from_micros(500), "{per:?} per refusal");
    for j in 0..i / 2 {
        s.delete(&key(j)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.put(&key(i), &value(i, 0)).is_err() {
        assert!(Instant::now() < deadline, "writes never resumed");
        std::thread::sleep(Duration::from_millis(5));
    }
}
