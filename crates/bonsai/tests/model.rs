//! The Bonsai tree against `BTreeMap`: random inserts, replaces and
//! removes, then every query (get, lower/upper bound, ranges) compared,
//! and the structural invariants (order, sizes, logarithmic height)
//! checked.

use std::collections::BTreeMap;
use std::ops::Bound;

use bonsai::BonsaiTree;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(u16, u32),
    Remove(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..512u16, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        2 => (0..512u16).prop_map(Op::Remove),
    ]
}

/// Weight-balanced trees with weight 4 have height below ~2.4 log2(n+1);
/// allow slack for Adams's delete.
fn height_bound(n: usize) -> usize {
    3 * (usize::BITS - n.leading_zeros()) as usize + 2
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn matches_btreemap(ops in proptest::collection::vec(op(), 0..400), probes in proptest::collection::vec(0..520u16, 8)) {
        let tree = BonsaiTree::new();
        let mut model = BTreeMap::new();
        for op in ops {
            match op {
                Op::Insert(k, v) => prop_assert_eq!(tree.insert(k, v), model.insert(k, v)),
                Op::Remove(k) => prop_assert_eq!(tree.remove(&k), model.remove(&k)),
            }
        }
        tree.check_invariants();
        prop_assert_eq!(tree.len(), model.len());
        prop_assert!(tree.height() <= height_bound(tree.len()), "height {} for {}", tree.height(), tree.len());
        let reader = tree.reader();
        let all: Vec<(u16, u32)> = reader.iter().map(|(k, v)| (*k, *v)).collect();
        let expect: Vec<(u16, u32)> = model.iter().map(|(k, v)| (*k, *v)).collect();
        prop_assert_eq!(all, expect);
        for &p in &probes {
            prop_assert_eq!(reader.get(&p), model.get(&p));
            prop_assert_eq!(reader.lower_bound(&p), model.range(p..).next());
            prop_assert_eq!(
                reader.upper_bound(&p),
                model.range((Bound::Excluded(p), Bound::Unbounded)).next()
            );
        }
        let (a, b) = (probes[0].min(probes[1]), probes[0].max(probes[1]));
        let got: Vec<_> = reader.range(a..b).collect();
        let want: Vec<_> = model.range(a..b).collect();
        prop_assert_eq!(got, want);
        let got: Vec<_> = reader.range(a..=b).collect();
        let want: Vec<_> = model.range(a..=b).collect();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn sorted_inserts_stay_balanced() {
    let tree = BonsaiTree::new();
    for k in 0..10_000u32 {
        tree.insert(k, ());
    }
    tree.check_invariants();
    assert!(
        tree.height() <= height_bound(10_000),
        "height {}",
        tree.height()
    );
    for k in (0..10_000u32).step_by(2) {
        tree.remove(&k);
    }
    tree.check_invariants();
    assert!(tree.height() <= height_bound(5_000));
}

/// §3.3: "about 2 allocations and 1 free per insert on average,
/// regardless of tree size" (random keys, weight 4, in-place commits).
#[test]
fn about_two_allocations_and_one_free_per_insert() {
    let tree = BonsaiTree::new();
    let mut x: u64 = 1;
    for _ in 0..20_000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        tree.insert(x >> 16, ());
    }
    let s = tree.stats();
    let inserts = s.inserts as f64;
    let allocs = s.allocated as f64 / inserts;
    let frees = s.retired as f64 / inserts;
    let rotations = (s.single_rotations + s.double_rotations) as f64 / inserts;
    println!("per insert: {allocs:.2} allocations, {frees:.2} frees, {rotations:.2} rotations");
    assert!((1.5..2.6).contains(&allocs), "{allocs}");
    assert!((0.5..1.6).contains(&frees), "{frees}");
    assert!(rotations < 0.6, "{rotations}");
    assert!(tree.collect() > 0 || s.freed > 0);
}
