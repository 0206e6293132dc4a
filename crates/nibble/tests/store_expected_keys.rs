//! `Config::expected_keys` (issue 26): a store told how many keys to
//! expect starts with an index that holds them without a resize, costs
//! at most twice what the grown index costs, keeps working past the hint, and a store
//! without the hint grows as before. Loaded from two threads, as the YCSB
//! load is, and checked against the keys written.

use nibble::{Config, Mode, Store};

fn key(i: u64) -> String {
    format!("user{}", i.wrapping_mul(0x100000001b3) ^ 0xcbf29ce484222325)
}

/// Puts keys `0..n` from two threads (even and odd), 64-byte values that
/// name their key.
fn load(s: &Store, from: u64, to: u64) {
    std::thread::scope(|sc| {
        for t in 0..2u64 {
            sc.spawn(move || {
                for i in (from + t..to).step_by(2) {
                    let v = format!("{i:064}");
                    s.put(key(i).as_bytes(), v.as_bytes()).unwrap();
                }
            });
        }
    });
}

fn check(s: &Store, n: u64) {
    for i in 0..n {
        let got = s.get(key(i).as_bytes()).unwrap();
        assert_eq!(
            got.as_deref(),
            Some(format!("{i:064}").as_bytes()),
            "key {i}"
        );
    }
    assert_eq!(s.len(), n);
}

#[test]
fn a_hinted_store_loads_its_keys_without_resizing() {
    let n = 60_000u64;
    let capacity = 64usize << 20;

    let mut plain = Config::new(capacity);
    plain.mode = Mode::Nibble2;
    let s = Store::new(plain.clone()).unwrap();
    load(&s, 0, n);
    check(&s, n);
    let grown = s.stats();
    assert!(grown.index.resizes > 0, "{grown:?}");
    drop(s);

    let mut hinted = plain;
    hinted.expected_keys = n as usize;
    let s = Store::new(hinted).unwrap();
    let empty = s.stats();
    assert!(
        empty.index_bytes <= empty.index_budget_bytes,
        "pre-sized index {} bytes over its budget {}",
        empty.index_bytes,
        empty.index_budget_bytes
    );
    load(&s, 0, n);
    check(&s, n);
    let st = s.stats();
    assert_eq!(st.index.resizes, 0, "{st:?}");
    assert_eq!(st.index_bytes, empty.index_bytes, "{st:?}");
    // At most twice the index the unhinted store grew to (it is sized
    // for a lower load than growth stops at, then rounded up).
    assert!(
        st.index_bytes <= 2 * grown.index_bytes,
        "pre-sized {} bytes, grown {}",
        st.index_bytes,
        grown.index_bytes
    );
    // Past the hint it grows as usual.
    load(&s, n, 4 * n);
    check(&s, 4 * n);
    assert!(s.stats().index.resizes > 0);
}

#[test]
fn a_hint_beyond_the_budget_is_cut_to_it() {
    // A billion keys cannot fit a 16 MiB store's index: the store is
    // still made, within its budget, and works.
    let mut cfg = Config::new(16 << 20);
    cfg.expected_keys = 1 << 30;
    let s = Store::new(cfg).unwrap();
    let st = s.stats();
    assert!(
        st.index_bytes <= st.index_budget_bytes,
        "index {} bytes, budget {}",
        st.index_bytes,
        st.index_budget_bytes
    );
    s.put(b"k", b"v").unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
}
