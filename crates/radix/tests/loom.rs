//! Loom model of the slot lock / expand step: two threads lock
//! overlapping and neighbouring ranges inside one folded slot, so one of
//! them expands it under its lock while the other waits on it or on the
//! new node's entries; a lookup runs meanwhile. Checks mutual exclusion,
//! no lost value, and that lookups never see a half-built node.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p radix --test loom --release`
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use radix::{Config, RadixMap};

fn tiny() -> RadixMap {
    // Two levels of one bit: 4 keys, root slots cover 2 keys each.
    RadixMap::new(Config {
        levels: 2,
        bits_per_level: 1,
        collapse: false,
    })
}

#[test]
fn expand_under_lock() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let map = Arc::new(tiny());
        map.set(0..4, 5); // folded: two root slots with value 5
        let holders = Arc::new(AtomicUsize::new(0));
        let spawn = |keys: std::ops::Range<u64>, value: u64| {
            let (map, holders) = (map.clone(), holders.clone());
            thread::spawn(move || {
                let handle = map.handle();
                let guard = handle.lock(keys.clone());
                if keys.contains(&1) {
                    assert_eq!(
                        holders.fetch_add(1, Ordering::SeqCst),
                        0,
                        "key 1 held twice"
                    );
                }
                guard.set(value);
                if keys.contains(&1) {
                    holders.fetch_sub(1, Ordering::SeqCst);
                }
            })
        };
        let a = spawn(1..2, 7); // expands root slot 0
        let b = spawn(0..3, 9); // overlaps at key 1
        let v = map.lookup(0);
        assert!(v == Some(5) || v == Some(9), "lookup saw {v:?}");
        a.join().unwrap();
        b.join().unwrap();
        let one = map.lookup(1);
        assert!(one == Some(7) || one == Some(9));
        assert_eq!(map.lookup(0), Some(9));
        assert_eq!(map.lookup(2), Some(9));
        assert_eq!(map.lookup(3), Some(5));
        drop(map.handle().lock(0..4)); // nothing left locked
    });
}
