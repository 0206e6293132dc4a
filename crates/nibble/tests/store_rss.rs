//! Memory stays within the configured capacity under churn: the process's
//! RSS grows by at most the capacity plus a small constant, however many
//! times the data is overwritten. One test in its own binary (process), so
//! nothing else moves the RSS.

use std::time::Duration;

use nibble::{Config, Error, Mode, Store};

/// Allowance over capacity: thread stacks of the workers, the test's own
/// buffers and allocator slack (documented in docs/BENCHMARKS.md).
const RSS_SLACK_BYTES: u64 = 8 << 20;

mod common;
use common::rss_bytes;

#[test]
fn rss_within_capacity_under_churn() {
    for mode in [Mode::Nibble, Mode::Nibble2] {
        let capacity = 48usize << 20;
        let before = rss_bytes();
        let mut cfg = Config::new(capacity);
        cfg.mode = mode;
        let s = Store::new(cfg).unwrap();
        let keys = 6000u32;
        let mut peak = 0;
        for round in 0..12u32 {
            for k in 0..keys {
                let len = 1000 + ((k * 7 + round * 13) % 3000) as usize;
                let v = vec![round as u8; len];
                match s.put(format!("k{k}").as_bytes(), &v) {
                    Ok(_) | Err(Error::OutOfMemory { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            peak = peak.max(rss_bytes());
        }
        s.compact_now(Duration::from_secs(2));
        let st = s.stats();
        let grown = peak.saturating_sub(before);
        assert!(
            grown <= capacity as u64 + RSS_SLACK_BYTES,
            "{mode:?}: RSS grew {grown} bytes for a capacity of {capacity}: {st:?}"
        );
        assert!(st.live_bytes > 10 << 20, "store nearly empty: {st:?}");
        assert!(
            st.pool_bytes + st.index_budget_bytes + st.metadata_bytes <= capacity as u64,
            "{st:?}"
        );
        drop(s);
    }
}
