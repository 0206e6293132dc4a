//! TTLs with a fake clock (`object::skew_clock_ms`), alone in this test
//! binary because the skew is process-wide: items expire when the clock
//! passes their expiry, and a full cache reclaims expired items as
//! expired (and unread ones as `expired_unfetched`), not as evictions.

use std::time::Duration;

use nibble::object::{now_ms, skew_clock_ms};
use nibble::{Config, Eviction, EvictionPolicy, Expiry, PutOptions, Store};

const VALUE_BYTES: usize = 400;
const CAPACITY_BYTES: usize = 8 << 20;

fn key(i: u64) -> Vec<u8> {
    format!("key:{i:010}").into_bytes()
}

#[test]
fn expiry_follows_the_fake_clock_and_is_not_eviction() {
    let mut cfg = Config::new(CAPACITY_BYTES);
    cfg.eviction = Eviction {
        policy: EvictionPolicy::Merge,
        volatile_only: false,
    };
    let s = Store::new(cfg).unwrap();
    let v = vec![b'v'; VALUE_BYTES];
    let hour_ms = 3_600_000;
    let ttl = PutOptions {
        expiry: Expiry::At(now_ms() + hour_ms),
        ..Default::default()
    };
    // Half the capacity expires in an hour; a few of those are read.
    let n = (CAPACITY_BYTES / 2 / VALUE_BYTES) as u64;
    for i in 0..n {
        s.put_with(&key(i), &v, ttl).unwrap();
    }
    for i in 0..10 {
        assert!(s.get(&key(i)).unwrap().is_some());
    }
    s.put(b"forever", &v).unwrap();
    skew_clock_ms(hour_ms - 1000);
    assert!(s.get(&key(0)).unwrap().is_some(), "not yet");
    skew_clock_ms(2000);
    assert!(s.get(&key(0)).unwrap().is_none(), "expired");
    assert!(!s.contains(&key(n - 1)).unwrap());
    assert!(s.get(b"forever").unwrap().is_some());
    // Fill past capacity: the expired half goes first, as expired.
    for i in n..n + 2 * n {
        s.put(&key(i), &v).unwrap();
    }
    // Eviction and reclaiming are asynchronous: let the pass the last
    // puts woke finish before comparing the statistics with the contents.
    assert!(s.quiesce(Duration::from_secs(30)));
    let st = s.stats();
    assert!(
        st.expired_reclaimed > n / 2,
        "expired reclaimed {} of {n}",
        st.expired_reclaimed
    );
    // All but the ten read ones were never fetched.
    assert!(
        st.expired_unfetched <= st.expired_reclaimed
            && st.expired_unfetched + 10 >= st.expired_reclaimed,
        "unfetched {} of {}",
        st.expired_unfetched,
        st.expired_reclaimed
    );
    // Only items that had not expired count as evicted.
    let live_lost = (n..n + 2 * n)
        .filter(|&i| !s.contains(&key(i)).unwrap())
        .count() as u64
        + u64::from(!s.contains(b"forever").unwrap());
    assert_eq!(live_lost, st.evicted_items);
}
