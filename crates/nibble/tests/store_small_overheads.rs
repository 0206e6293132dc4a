//! Fixed overheads follow the store's size (issue 26): the index gives
//! its memory back once deletes leave it sparse (`index/shrink.rs`), and
//! `Config::prefault` maps the log in at creation while the default maps
//! nothing ahead of the data. One test per binary concern: RSS is read,
//! so everything runs in one test, one step after the other.

use std::time::{Duration, Instant};

use nibble::{Config, Mode, Store};

mod common;
use common::rss_bytes;

#[test]
fn index_shrinks_after_deletes_and_prefault_is_opt_in() {
    // The default maps nothing ahead of the data.
    let capacity = 64usize << 20;
    let before = rss_bytes();
    let s = Store::new(Config::new(capacity)).unwrap();
    let grew = rss_bytes().saturating_sub(before);
    assert!(
        grew < 8 << 20,
        "an empty default store took {grew} bytes of RSS"
    );

    // Many small keys grow the index; deleting 98 % of them lets the
    // compaction workers halve it back, and every key left stays readable.
    let mut cfg = Config::new(capacity);
    cfg.decay_ms = 50;
    cfg.mode = Mode::Nibble2;
    drop(s);
    let s = Store::new(cfg).unwrap();
    let keys = 100_000u32;
    for k in 0..keys {
        s.put(format!("key:{k}").as_bytes(), b"v").unwrap();
    }
    let peak = s.stats().index_bytes;
    for k in 0..keys {
        if k % 50 != 0 {
            assert!(s.delete(format!("key:{k}").as_bytes()).unwrap());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.stats().index_bytes * 4 > peak && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = s.stats();
    assert!(
        st.index_bytes * 4 <= peak,
        "index {} bytes after deletes, {peak} at its peak: {st:?}",
        st.index_bytes
    );
    assert_eq!(st.items, u64::from(keys / 50));
    for k in 0..keys {
        let got = s.get(format!("key:{k}").as_bytes()).unwrap();
        assert_eq!(
            got.as_deref(),
            (k % 50 == 0).then_some(&b"v"[..]),
            "key {k}"
        );
    }
    // It grows again as keys come back.
    for k in keys..keys + 50_000 {
        s.put(format!("key:{k}").as_bytes(), b"w").unwrap();
    }
    assert!(s.stats().index_bytes > st.index_bytes);
    assert_eq!(s.len(), u64::from(keys / 50) + 50_000);
    drop(s);

    // Prefault: the pool is resident from the start, and the store works.
    let mut cfg = Config::new(capacity);
    cfg.prefault = true;
    let before = rss_bytes();
    let s = Store::new(cfg).unwrap();
    let grew = rss_bytes().saturating_sub(before);
    let pool = s.stats().pool_bytes;
    assert!(
        grew >= pool * 9 / 10,
        "prefault mapped {grew} of {pool} pool bytes"
    );
    s.put(b"k", b"v").unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
}
