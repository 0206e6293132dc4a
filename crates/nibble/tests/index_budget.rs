//! The index past its own share: with small objects a store is limited by
//! its capacity, not by the index share, and index plus log stay within
//! the capacity.

use nibble::{Config, Error, Mode, Store};

const CAPACITY_BYTES: usize = 16 << 20;

/// Insert 8-byte values under 12-byte keys until the store refuses one;
/// returns (keys held, the refusal, stats).
fn fill(borrow: bool) -> (u64, Error, nibble::Stats) {
    let mut cfg = Config::new(CAPACITY_BYTES);
    cfg.mode = Mode::Nibble2;
    cfg.index_borrows_from_log = borrow;
    cfg.max_write_wait_ms = 200;
    let store = Store::new(cfg).unwrap();
    let mut n = 0u64;
    loop {
        let key = format!("k{n:011}");
        match store.put(key.as_bytes(), &n.to_le_bytes()) {
            Ok(_) => n += 1,
            Err(e) => {
                // Every acknowledged key is still there.
                for i in (0..n).step_by(997) {
                    let v = store.get(format!("k{i:011}").as_bytes()).unwrap();
                    assert_eq!(v.as_deref(), Some(&i.to_le_bytes()[..]), "key {i}");
                }
                return (n, e, store.stats());
            }
        }
    }
}

#[test]
fn small_objects_fill_the_capacity_not_the_index_share() {
    let (fixed, fixed_err, fixed_st) = fill(false);
    let (grown, grown_err, st) = fill(true);
    eprintln!(
        "fixed share: {fixed} keys ({fixed_err}), index {} B; borrowing: {grown} keys ({grown_err}), index {} B ({} borrowed), log blocks {}",
        fixed_st.index_bytes, st.index_bytes, st.index_borrowed_bytes, st.blocks_in_use
    );
    assert!(matches!(fixed_err, Error::OutOfMemory { what: "index" }));
    assert_eq!(fixed_st.index_borrowed_bytes, 0);
    assert!(
        grown as f64 >= 1.3 * fixed as f64,
        "borrowing held {grown} keys, the fixed share {fixed}"
    );
    assert!(st.index_borrowed_bytes > 0);
    // Everything stays inside the capacity: pool blocks in segments, the
    // index (its share and what it borrowed) and the metadata.
    let used = st.blocks_in_use * nibble::BLOCK_BYTES as u64 + st.index_bytes + st.metadata_bytes;
    assert!(
        used <= CAPACITY_BYTES as u64,
        "used {used} B of a {CAPACITY_BYTES} B capacity"
    );
    assert!(
        st.blocks_in_use * nibble::BLOCK_BYTES as u64 + st.index_borrowed_bytes <= st.pool_bytes,
        "log and borrowed index bytes exceed the pool"
    );
}
