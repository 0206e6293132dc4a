//! Durability's two rules in process (`store/durability.rs`): a replaced
//! object is killed only after a flush; a compacted segment is reused only
//! after a flush, and a writer out of space flushes itself rather than
//! failing. (Power cuts of a whole server are in the server's
//! `tests/it/power.rs`.)

use nibblejmp::{Options, SharedStore};

mod common;

use common::{quiet, TempDir};

#[test]
fn replaced_objects_die_after_the_flush() {
    let d = TempDir::new("dur-kill");
    let s = SharedStore::create(&d.0, 16 << 20, &quiet()).unwrap();
    s.set_durable(true).unwrap();
    let f0 = s.flush_stats();
    s.put(b"k", b"v1").unwrap();
    s.put(b"k", b"v2").unwrap();
    s.put(b"k", b"v3").unwrap();
    // Reads see the newest value at once; the kills wait.
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v3"[..]));
    assert_eq!(s.flush_stats().deferred_kills, f0.deferred_kills);
    s.flush_to_disk().unwrap();
    let f1 = s.flush_stats();
    assert_eq!(f1.deferred_kills - f0.deferred_kills, 2);
    assert_eq!(f1.flushes - f0.flushes, 1);
    // Pending kills at close are applied: the clean store verifies.
    s.put(b"k", b"v4").unwrap();
    s.close().unwrap();
    let s = common::attach_rebuilt(&d.0, quiet());
    assert_eq!(
        s.recovery_report().duplicates,
        0,
        "{:?}",
        s.recovery_report()
    );
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v4"[..]));
    // Off: kills at once again.
    s.set_durable(false).unwrap();
    let k0 = s.flush_stats().deferred_kills;
    s.put(b"k", b"v5").unwrap();
    s.flush_to_disk().unwrap();
    assert_eq!(s.flush_stats().deferred_kills, k0);
    s.close().unwrap();
}

#[test]
fn overwrites_of_a_full_store_never_run_out_of_space() {
    let d = TempDir::new("dur-reuse");
    // The compaction thread on, no flusher: every segment reuse needs an
    // inline flush (rule 2).
    let s = SharedStore::create(&d.0, 16 << 20, &Options::default()).unwrap();
    s.set_durable(true).unwrap();
    let value = vec![7u8; 2000];
    // About 4x the log's size in overwrites of 2000 keys.
    for i in 0..32_000u32 {
        let k = format!("key:{}", i % 2000);
        s.put(k.as_bytes(), &value)
            .unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    let st = s.flush_stats();
    assert!(st.inline_flushes > 0, "{st:?}");
    assert!(st.deferred_kills > 0, "{st:?}");
    assert_eq!(s.len(), 2000);
    s.close().unwrap();
    let s = common::attach_rebuilt(&d.0, quiet());
    assert_eq!(s.len(), 2000);
    assert_eq!(s.recovery_report().duplicates, 0);
    s.close().unwrap();
}
