//! RSS follows the data down: blocks freed by compaction are given back to
//! the OS after the decay time (or at once with `release_memory`). One test
//! in its own binary (process), so nothing else moves the RSS.

use std::time::Duration;

use nibble::{Config, Store};

mod common;
use common::rss_bytes;

/// After most of the data is deleted, compaction plus `release_memory`
/// (or the decay time on its own) gives the freed blocks back: RSS follows
/// the data down instead of staying at its high-water mark.
#[test]
fn rss_follows_data_down_after_deletes() {
    let capacity = 64usize << 20;
    let mut cfg = Config::new(capacity);
    cfg.decay_ms = 100;
    let s = Store::new(cfg).unwrap();
    let keys = 40_000u32;
    let v = vec![7u8; 1000];
    for k in 0..keys {
        s.put(format!("k{k}").as_bytes(), &v).unwrap();
    }
    let full = rss_bytes();
    for k in 0..keys {
        if k % 10 != 0 {
            assert!(s.delete(format!("k{k}").as_bytes()).unwrap());
        }
    }
    // No compact_now: once writes are quiet for `decay_ms` the workers
    // compact the sparse segments by themselves (idle defragmentation) and
    // release blocks unused for `decay_ms`.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let released = |st: &nibble::Stats| st.blocks_released * 65536 > 30 << 20;
    while !released(&s.stats()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = s.stats();
    assert!(released(&st), "idle defrag + decay did not release: {st:?}");
    s.compact_now(Duration::from_secs(5));
    s.release_memory();
    assert_eq!(s.stats().blocks_free_resident, 0);
    let after = rss_bytes();
    let data = 4_000u64 * 1000;
    assert!(
        full - after > 30 << 20,
        "RSS went from {full} to only {after} with {data} bytes of data left: {st:?}"
    );
    for k in (0..keys).step_by(10) {
        assert_eq!(
            s.get(format!("k{k}").as_bytes()).unwrap().as_deref(),
            Some(&v[..])
        );
    }
    // Released blocks are reused: the store fills up again.
    for k in keys..keys + 30_000 {
        s.put(format!("k{k}").as_bytes(), &v).unwrap();
    }
}
