//! Concurrency: overlapping range locks serialize (a non-atomic
//! read-modify-write of a per-key counter under the lock never loses an
//! update) and never deadlock (the test finishes); lookups of keys no
//! writer touches always see their value while writers expand the tree
//! around them. `RADIX_STRESS_SECS` lengthens the run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use radix::{Config, RadixMap};

fn budget() -> Duration {
    std::env::var("RADIX_STRESS_SECS")
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
fn overlapping_locks_serialize_and_never_deadlock() {
    const KEYS: u64 = 4096;
    let map = RadixMap::new(Config {
        levels: 2,
        bits_per_level: 9,
        collapse: true,
    });
    let counters: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let done: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (map, counters, stop, done) = (&map, &counters, &stop, &done);
            s.spawn(move || {
                let mut state = t + 1;
                let handle = map.handle();
                while !stop.load(Ordering::Relaxed) {
                    let a = rng(&mut state) % KEYS;
                    let len = 1 + rng(&mut state) % 700;
                    let range = a..(a + len).min(KEYS);
                    let guard = handle.lock(range.clone());
                    guard.set(t);
                    for k in range.clone() {
                        // Not an atomic increment: lost updates would show
                        // two holders of one key.
                        let c = &counters[k as usize];
                        let v = c.load(Ordering::Relaxed);
                        std::hint::spin_loop();
                        c.store(v + 1, Ordering::Relaxed);
                        assert_eq!(guard.get(k), Some(t));
                    }
                    done[t as usize].fetch_add(range.end - range.start, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(budget());
        stop.store(true, Ordering::Relaxed);
    });
    let total: u64 = counters.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    let expected: u64 = done.iter().map(|d| d.load(Ordering::Relaxed)).sum();
    assert_eq!(total, expected, "a lost update: two threads held one key");
}

#[test]
fn lookups_see_stable_keys_while_writers_expand() {
    let map = RadixMap::default();
    // Stable keys: every 1000th page of the first 2^20 carries its index.
    let stable: Vec<u64> = (0..1000).map(|i| i * 1000 + 1).collect();
    for &k in &stable {
        map.set(k..k + 1, k);
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (map, stable, stop) = (&map, &stable, &stop);
        s.spawn(move || {
            let mut state = 99;
            let handle = map.handle();
            while !stop.load(Ordering::Relaxed) {
                // Absent keys between stable ones: leaves come and go, and
                // with collapse on, empty ones are unlinked and freed.
                let k = (rng(&mut state) % 4096) * 1000 + 500;
                handle.set(k..k + 3, 1);
                handle.unset(k..k + 3);
            }
        });
        s.spawn(move || {
            let mut state = 7;
            let mut checked = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = stable[(rng(&mut state) % 1000) as usize];
                assert_eq!(map.lookup(k), Some(k), "lookup missed a present key");
                checked += 1;
            }
            assert!(checked > 0);
        });
        std::thread::sleep(budget());
        stop.store(true, Ordering::Relaxed);
    });
    // The churned leaves empty out and are revisited later: some of them
    // were collapsed (unlinked and freed) under the readers' feet.
    assert!(map.collapsed_count() > 0, "{map:?}");
}
