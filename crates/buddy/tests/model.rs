//! Property tests: every allocator against a simple model (the set of
//! allocated ranges). No frame is handed out twice; an allocation fails with
//! out-of-memory only when no free aligned block of that size exists; every
//! freed frame becomes allocatable again; everything coalesces at the end.

mod common;

use buddy::{AllocError, AllocatorKind, FrameAllocator};
use common::{assert_fully_coalesced, build, config};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Alloc { heap: usize, order: u32 },
    Free { pick: usize, heap: usize },
}

fn op(max_order: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4usize, 0..=max_order).prop_map(|(heap, order)| Op::Alloc { heap, order }),
        2 => (any::<usize>(), 0..4usize).prop_map(|(pick, heap)| Op::Free { pick, heap }),
    ]
}

/// True when some aligned run of `2^order` frames is entirely free in `used`.
fn model_has_free_block(used: &[bool], order: u32) -> bool {
    used.chunks(1 << order)
        .any(|c| c.len() == 1 << order && c.iter().all(|u| !u))
}

fn run(kind: AllocatorKind, frames: u64, heaps: usize, max_order: u32, ops: &[Op]) {
    let a = build(kind, frames, &config(heaps, Some(max_order)));
    let mut used = vec![false; frames as usize];
    let mut live: Vec<(u64, u32)> = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc { heap, order } => match a.alloc_on(heap, order) {
                Ok(f) => {
                    assert_eq!(f % (1 << order), 0, "misaligned block");
                    for u in &mut used[f as usize..(f + (1 << order)) as usize] {
                        assert!(!*u, "{kind}: frame handed out twice");
                        *u = true;
                    }
                    live.push((f, order));
                }
                Err(AllocError::OutOfMemory { .. }) => {
                    assert!(
                        !model_has_free_block(&used, order),
                        "{kind}: out of memory at order {order} while a free block exists"
                    );
                }
                Err(e) => panic!("{kind}: unexpected {e}"),
            },
            Op::Free { pick, heap } => {
                if live.is_empty() {
                    continue;
                }
                let (f, order) = live.swap_remove(pick % live.len());
                a.free_on(heap, f, order).unwrap();
                for u in &mut used[f as usize..(f + (1 << order)) as usize] {
                    *u = false;
                }
            }
        }
    }
    for (i, (f, order)) in live.drain(..).enumerate() {
        a.free_on(i, f, order).unwrap();
    }
    assert_fully_coalesced(&*a);
    // Every frame is allocatable again.
    let mut n = 0;
    while a.alloc_on(n as usize, 0).is_ok() {
        n += 1;
    }
    assert_eq!(
        n, frames,
        "{kind}: not every frame allocatable after full free"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn distributed_matches_model(ops in prop::collection::vec(op(4), 1..300),
                                 heaps in 1..4usize, tail in 0..16u64) {
        run(AllocatorKind::Distributed, 192 + tail, heaps, 4, &ops);
    }

    #[test]
    fn global_lock_matches_model(ops in prop::collection::vec(op(4), 1..300), tail in 0..16u64) {
        run(AllocatorKind::GlobalLock, 192 + tail, 2, 4, &ops);
    }

    #[test]
    fn linux_pcp_matches_model(ops in prop::collection::vec(op(4), 1..300), tail in 0..16u64) {
        run(AllocatorKind::LinuxPcp, 192 + tail, 3, 4, &ops);
    }
}

#[test]
fn rejects_order_above_maximum() {
    for kind in AllocatorKind::ALL {
        let a = build(kind, 1024, &config(2, Some(5)));
        assert_eq!(
            a.alloc_on(0, 6),
            Err(AllocError::OrderTooLarge {
                order: 6,
                max_order: 5
            })
        );
    }
}

#[test]
fn default_max_order_gives_every_heap_a_range() {
    let a = buddy::distributed::DistributedBuddy::new(1 << 20, &config(3, None)).unwrap();
    assert_eq!(a.max_order(), 18, "1 GiB blocks for a 4 GiB pool");
    let small = buddy::distributed::DistributedBuddy::new(1000, &config(3, None)).unwrap();
    for h in 0..3 {
        let (lo, hi) = small.owned_range(h);
        assert!(hi > lo, "heap {h} owns nothing");
    }
}
