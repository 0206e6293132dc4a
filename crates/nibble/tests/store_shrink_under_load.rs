//! The index follows a bulk delete down while clients keep running
//! (`index/shrink.rs`): the compaction worker halves sparse subtables on
//! its next step, not only once the store falls quiet, so inserts that
//! follow the delete find an index the size of the keys that remain.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nibble::{Config, Mode, Store};

#[test]
fn index_halves_under_load_after_bulk_delete() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let mut cfg = Config::new(64 << 20);
        // Never idle within the test: what halves the index here is the
        // worker's step under load.
        cfg.decay_ms = 600_000;
        cfg.mode = mode;
        let s = Arc::new(Store::new(cfg).unwrap());
        let keys = 100_000u32;
        for k in 0..keys {
            s.put(format!("key:{k}").as_bytes(), b"v").unwrap();
        }
        let peak = s.stats().index_bytes;
        // A reader runs throughout, so the store is busy.
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let reader = {
            let (s, stop, reads) = (s.clone(), stop.clone(), reads.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for k in (0..keys).step_by(50) {
                        let got = s.get(format!("key:{k}").as_bytes()).unwrap();
                        assert_eq!(got.as_deref(), Some(&b"v"[..]), "key {k}");
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        for k in 0..keys {
            if k % 50 != 0 {
                assert!(s.delete(format!("key:{k}").as_bytes()).unwrap());
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.stats().index_bytes * 4 > peak && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let small = s.stats().index_bytes;
        // New inserts meanwhile, of the size that remains.
        for k in keys..keys + 2_000 {
            s.put(format!("key:{k}").as_bytes(), b"w").unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert!(
            small * 4 <= peak,
            "{mode:?}: index {small} bytes after deletes under load, {peak} at its peak"
        );
        assert!(reads.load(Ordering::Relaxed) > 0);
        assert_eq!(s.len(), u64::from(keys / 50) + 2_000);
        for k in 0..keys + 2_000 {
            let want: Option<&[u8]> = if k >= keys {
                Some(b"w")
            } else if k % 50 == 0 {
                Some(b"v")
            } else {
                None
            };
            let got = s.get(format!("key:{k}").as_bytes()).unwrap();
            assert_eq!(got.as_deref(), want, "{mode:?}: key {k}");
        }
    }
}
