//! The radix map against a model: a `BTreeMap` from key to value. Random
//! set/unset ranges (with folding and expansion at every level), then every
//! key is compared, and the runs against the model's runs.

use std::collections::BTreeMap;
use std::ops::Range;

use proptest::prelude::*;
use radix::{Config, RadixMap, Run};

#[derive(Debug, Clone)]
enum Op {
    Set(Range<u64>, u64),
    Unset(Range<u64>),
}

fn op(limit: u64) -> impl Strategy<Value = Op> {
    let range = (0..limit, 0..limit).prop_map(|(a, b)| a.min(b)..a.max(b) + 1);
    prop_oneof![
        3 => (range.clone(), 0..4u64).prop_map(|(r, v)| Op::Set(r, v)),
        1 => range.prop_map(Op::Unset),
    ]
}

fn model_runs(model: &BTreeMap<u64, u64>) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (&k, &v) in model {
        match runs.last_mut() {
            Some(run) if run.keys.end == k && run.value == v => run.keys.end = k + 1,
            _ => runs.push(Run {
                keys: k..k + 1,
                value: v,
            }),
        }
    }
    runs
}

fn check(config: Config, ops: Vec<Op>) {
    let map = RadixMap::new(config);
    let writer = map.handle();
    let limit = map.key_limit();
    let mut model = BTreeMap::new();
    for op in ops {
        match op {
            Op::Set(r, v) => {
                writer.set(r.clone(), v);
                for k in r {
                    model.insert(k, v);
                }
            }
            Op::Unset(r) => {
                writer.unset(r.clone());
                for k in r {
                    model.remove(&k);
                }
            }
        }
    }
    // Ops stay below 4096; check a margin past it too.
    for k in 0..limit.min(5000) {
        assert_eq!(map.lookup(k), model.get(&k).copied(), "key {k}");
    }
    assert_eq!(map.runs(0..limit), model_runs(&model));
    // Nothing is left locked: locking everything does not block.
    // (One handle per thread: an idle second one would hold up epochs.)
    let handle = writer;
    drop(handle.lock(0..limit));
    if config.collapse {
        // Empty the map. A node that stays empty and unvisited for two
        // Refcache epochs is freed by Refcache; the next writer passing
        // through its parent unlinks it (a visit before that revives it).
        // Parents empty out once their children are unlinked: one round
        // per level.
        handle.unset(0..limit);
        for _ in 0..8 {
            for _ in 0..4 {
                handle.flush();
            }
            drop(handle.lock(0..limit));
            if map.node_count() == 1 {
                break;
            }
        }
        assert_eq!(map.node_count(), 1, "empty nodes were not collapsed");
        assert_eq!(map.runs(0..limit), vec![]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// 3 levels of 3 bits: 512 keys, deep enough for two expansions.
    #[test]
    fn small_tree_matches_model(ops in proptest::collection::vec(op(512), 0..40)) {
        check(Config { levels: 3, bits_per_level: 3, collapse: false }, ops.clone());
        check(Config { levels: 3, bits_per_level: 3, collapse: true }, ops);
    }

    /// Two levels of the real fanout (512 x 512 keys), small ranges.
    #[test]
    fn real_fanout_matches_model(ops in proptest::collection::vec(op(4096), 0..20)) {
        check(Config { levels: 2, bits_per_level: 9, collapse: true }, ops);
    }
}

#[test]
fn folding_writes_one_slot_per_aligned_block() {
    let map = RadixMap::default();
    let handle = map.handle();
    // A root slot covers 2^27 pages: one store maps them all.
    let guard = handle.lock(0..(1 << 27));
    assert_eq!(guard.slot_count(), 1);
    guard.set(7);
    drop(guard);
    assert_eq!(map.node_count(), 1, "nothing expanded");
    // Three level-1 slots (2^18 pages each): root slot 0 expands once.
    handle.set(0..3 << 18, 7);
    assert_eq!(map.node_count(), 2);
    assert_eq!(map.lookup(12345), Some(7));
    // Unaligned: 1 expansion per level on each edge.
    handle.set(3..5, 9);
    assert_eq!(map.lookup(2), Some(7));
    assert_eq!(map.lookup(3), Some(9));
    assert_eq!(map.lookup(5), Some(7));
    assert_eq!(map.node_count(), 4);
    assert_eq!(
        map.runs(0..10),
        vec![
            Run {
                keys: 0..3,
                value: 7
            },
            Run {
                keys: 3..5,
                value: 9
            },
            Run {
                keys: 5..10,
                value: 7
            }
        ]
    );
}

#[test]
fn a_node_revived_before_review_is_not_freed() {
    let map = RadixMap::new(Config {
        levels: 2,
        bits_per_level: 9,
        collapse: true,
    });
    let handle = map.handle();
    handle.set(5..6, 1); // expands root slot 0
    assert_eq!(map.node_count(), 2);
    handle.unset(5..6); // the leaf is empty: its count drops to zero
    handle.flush();
    handle.set(7..8, 2); // used again before Refcache's review
    for _ in 0..8 {
        handle.flush();
    }
    drop(handle.lock(0..1 << 18));
    assert_eq!(map.node_count(), 2);
    assert_eq!(map.lookup(7), Some(2));
    assert_eq!(map.collapsed_count(), 0);
}

#[test]
fn an_empty_unvisited_node_is_freed_and_unlinked() {
    let map = RadixMap::new(Config {
        levels: 2,
        bits_per_level: 9,
        collapse: true,
    });
    let handle = map.handle();
    handle.set(5..6, 1);
    handle.unset(5..6);
    assert_eq!(map.node_count(), 2);
    for _ in 0..4 {
        handle.flush();
    }
    assert_eq!(
        map.refcache().unwrap().objects_freed(),
        1,
        "Refcache freed the count"
    );
    assert_eq!(map.lookup(5), None, "a dead node still reads as empty");
    handle.set(9..10, 3); // passes root slot 0: unlinks, then re-expands
    assert_eq!(map.collapsed_count(), 1);
    assert_eq!(map.node_count(), 2);
    assert_eq!(map.lookup(9), Some(3));
}
