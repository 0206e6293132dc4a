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
    let limit = map.key_limit();
    let mut model = BTreeMap::new();
    for op in ops {
        match op {
            Op::Set(r, v) => {
                map.set(r.clone(), v);
                for k in r {
                    model.insert(k, v);
                }
            }
            Op::Unset(r) => {
                map.unset(r.clone());
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
    drop(map.lock(0..limit));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// 3 levels of 3 bits: 512 keys, deep enough for two expansions.
    #[test]
    fn small_tree_matches_model(ops in proptest::collection::vec(op(512), 0..40)) {
        check(Config { levels: 3, bits_per_level: 3 }, ops);
    }

    /// Two levels of the real fanout (512 x 512 keys), small ranges.
    #[test]
    fn real_fanout_matches_model(ops in proptest::collection::vec(op(4096), 0..20)) {
        check(Config { levels: 2, bits_per_level: 9 }, ops);
    }
}

#[test]
fn folding_writes_one_slot_per_aligned_block() {
    let map = RadixMap::default();
    // A root slot covers 2^27 pages: one store maps them all.
    let guard = map.lock(0..(1 << 27));
    assert_eq!(guard.slot_count(), 1);
    guard.set(7);
    drop(guard);
    assert_eq!(map.node_count(), 1, "nothing expanded");
    // Three level-1 slots (2^18 pages each): root slot 0 expands once.
    map.set(0..3 << 18, 7);
    assert_eq!(map.node_count(), 2);
    assert_eq!(map.lookup(12345), Some(7));
    // Unaligned: 1 expansion per level on each edge.
    map.set(3..5, 9);
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
