//! The race of Bonsai Figure 3: readers look up keys that are present the
//! whole time while a writer inserts and deletes other keys, rotating the
//! tree under them. A lookup must never miss, and range scans must see
//! every stable key once, in order. `BONSAI_STRESS_SECS` lengthens it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bonsai::BonsaiTree;

fn budget() -> Duration {
    std::env::var("BONSAI_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_millis(300))
}

fn rng(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

#[test]
fn readers_never_miss_present_keys_during_rotations() {
    const STABLE: u64 = 1000;
    let tree = BonsaiTree::new();
    // Stable keys are even; the writer churns odd keys between them.
    for k in 0..STABLE {
        tree.insert(k * 2, k);
    }
    let stop = AtomicBool::new(false);
    let lookups = AtomicU64::new(0);
    std::thread::scope(|s| {
        let (tree, stop, lookups) = (&tree, &stop, &lookups);
        s.spawn(move || {
            let mut state = 3;
            let mut live = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let k = (rng(&mut state) % (STABLE * 2)) | 1;
                if tree.insert(k, u64::MAX).is_none() {
                    live.push(k);
                }
                if live.len() > 200 {
                    let i = rng(&mut state) as usize % live.len();
                    let k = live.swap_remove(i);
                    assert_eq!(tree.remove(&k), Some(u64::MAX));
                }
            }
        });
        s.spawn(move || {
            let mut state = 11;
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let k = rng(&mut state) % STABLE;
                assert_eq!(tree.get(&(k * 2)), Some(k), "missed a present key");
                n += 1;
                if n % 64 == 0 {
                    let reader = tree.reader();
                    let evens: Vec<u64> = reader
                        .iter()
                        .map(|(k, _)| *k)
                        .filter(|k| k % 2 == 0)
                        .collect();
                    assert_eq!(evens.len() as u64, STABLE, "scan missed a stable key");
                    assert!(evens.windows(2).all(|w| w[0] < w[1]));
                }
            }
            lookups.fetch_add(n, Ordering::Relaxed);
        });
        std::thread::sleep(budget());
        stop.store(true, Ordering::Relaxed);
    });
    assert!(lookups.load(Ordering::Relaxed) > 0);
    tree.check_invariants();
    let s = tree.stats();
    assert!(s.single_rotations + s.double_rotations > 0);
}
