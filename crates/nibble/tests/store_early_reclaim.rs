//! A rewrite load on a store far below its capacity recycles the log's
//! memory: segments that die almost whole are reclaimed while free space
//! is still plentiful, so the blocks in use (and the RSS) stay near the
//! live data instead of growing to the capacity before compaction first
//! runs. One test in its own binary (process), so nothing else moves the
//! RSS.

use std::time::{Duration, Instant};

use nibble::{Config, Mode, Store, BLOCK_BYTES};

mod common;
use common::rss_bytes;

const MIB: u64 = 1 << 20;
const BLOCK: u64 = BLOCK_BYTES as u64;

fn rewrite_stays_small(mode: Mode) {
    let capacity = 256usize << 20;
    let mut cfg = Config::new(capacity);
    cfg.mode = mode;
    cfg.segment_bytes = Some(1 << 20);
    // Far longer than the test: idle defragmentation (which would also
    // compact the dead segments, after the writes stop) never runs.
    cfg.decay_ms = 600_000;
    let s = Store::new(cfg).unwrap();
    let rss_before = rss_bytes();
    // 1,000 keys rewritten with values of alternating sizes (so that
    // Nibble-2 appends too): 200 MiB of appends, 78 % of the capacity,
    // over about 1 MiB of live data.
    let keys = 1_000u32;
    let small = vec![1u8; 900];
    let large = vec![2u8; 1100];
    let mut peak_blocks = 0;
    let rounds = 200u32;
    for r in 0..rounds {
        let v = if r.is_multiple_of(2) { &small } else { &large };
        for k in 0..keys {
            s.put(format!("key:{k}").as_bytes(), v).unwrap();
        }
        peak_blocks = peak_blocks.max(s.stats().blocks_in_use);
        // Give the compaction worker its ticks, as a server's idle moments
        // do (a 2-CPU machine runs this test beside other tests).
        if r % 10 == 9 {
            std::thread::sleep(Duration::from_millis(30));
        }
    }
    // The last segments still wait for their ticks: give them a moment
    // (well under the decay time).
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.stats().blocks_in_use * BLOCK > 16 * MIB && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = s.stats();
    assert!(
        st.blocks_in_use * BLOCK <= 16 * MIB,
        "{mode:?}: {} MiB of blocks in use for about 1 MiB of data: {st:?}",
        st.blocks_in_use * BLOCK / MIB
    );
    assert!(
        peak_blocks * BLOCK <= 128 * MIB,
        "{mode:?}: the log grew to {} MiB before it was reclaimed: {st:?}",
        peak_blocks * BLOCK / MIB
    );
    assert_eq!(st.blocks_released, 0, "{st:?}");
    assert!(
        rss_bytes() < rss_before + 128 * MIB,
        "{mode:?}: RSS grew from {rss_before} to {}",
        rss_bytes()
    );
    let last = if (rounds - 1).is_multiple_of(2) {
        &small
    } else {
        &large
    };
    for k in 0..keys {
        assert_eq!(
            s.get(format!("key:{k}").as_bytes()).unwrap().as_deref(),
            Some(&last[..])
        );
    }
}

#[test]
fn rewrites_recycle_the_log_in_both_modes() {
    rewrite_stays_small(Mode::Nibble);
    rewrite_stays_small(Mode::Nibble2);
}
