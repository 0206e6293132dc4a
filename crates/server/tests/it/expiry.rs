//! Expiry over both protocols: keys set with a short TTL stop counting in
//! DBSIZE and INFO keyspace within about a second (the engine's bulk
//! expiry frees their segments whole, `INFO stats` `expired_segments`,
//! `expiry_bytes_read`), and memcached's exptime corners (0, negative,
//! absolute times in the past, the 30-day relative limit, touch and gat)
//! answer as `/usr/bin/memcached` does (SKIPPED when it is absent). The
//! RESP corners (EX 0, negative, past EXAT/PXAT, overflow) are compared
//! with redis-server in `differential/strings.rs` and `keyspace.rs`.

use std::thread::sleep;
use std::time::Duration;

use crate::common::{client, info_u64, q, start, Mc};
use crate::mc_meta::{exchange, real_memcached};

/// 10,000 keys with PX 200 beside 100 without a TTL: 1.5 s later DBSIZE
/// and INFO keyspace count only the 100, and the expired keys' memory
/// went back whole segments at a time, reading only those segments.
#[test]
fn dbsize_stops_counting_expired_keys_within_a_second() {
    let s = start();
    let mut c = client(&s);
    let mut pipe = redis::pipe();
    for i in 0..10_000 {
        pipe.cmd("SET")
            .arg(format!("ttl:{i:06}"))
            .arg("v".repeat(100))
            .arg("PX")
            .arg(200)
            .ignore();
    }
    for i in 0..100 {
        pipe.cmd("SET")
            .arg(format!("keep:{i:03}"))
            .arg("v".repeat(100))
            .ignore();
    }
    pipe.query::<()>(&mut c).unwrap();
    let set_done = std::time::Instant::now();
    sleep(Duration::from_millis(1500).saturating_sub(set_done.elapsed()));
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 100);
    let ks: String = q(&mut c, &["INFO", "keyspace"]);
    assert!(ks.contains("db0:keys=100,expires=0"), "{ks}");
    let stats: String = q(&mut c, &["INFO", "stats"]);
    let whole = info_u64(&stats, "expired_segments");
    let read = info_u64(&stats, "expiry_bytes_read");
    let expired = info_u64(&stats, "expired_keys");
    assert!(whole > 0, "no segment freed whole: {stats}");
    assert!(expired >= 9_000, "expired_keys {expired}");
    // Each expired object is 128 bytes (header, key, value); the pass
    // read those segments once, not the persistent keys' segments, nor a
    // TTL segment before it expired whole.
    assert!(
        read <= 10_000 * 150 + 4 * 65536,
        "expiry read {read} bytes for 10,000 expired keys"
    );
}

/// memcached exptime corners, replies compared with memcached 1.6.
#[test]
fn memcached_exptime_corners_match_memcached() {
    let s = start();
    let port = s.memcached_port().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let script = format!(
        "set zero 0 0 1\r\nz\r\n\
         set neg 0 -1 1\r\nn\r\n\
         set neg2 0 -1000000 1\r\nn\r\n\
         set past 0 {past} 1\r\np\r\n\
         set future 0 {future} 1\r\nf\r\n\
         set month 0 2592000 1\r\nm\r\n\
         set overmonth 0 2592001 1\r\no\r\n\
         set rel 0 100 1\r\nr\r\n\
         get zero neg neg2 past future month overmonth rel\r\n\
         touch zero -1\r\n\
         touch rel 0\r\n\
         touch nokey 10\r\n\
         touch future {past}\r\n\
         get zero rel future\r\n\
         set g 0 100 1\r\ng\r\n\
         gat 0 g\r\n\
         gat -1 g\r\n\
         gat 100 g\r\n\
         add neg 0 0 1\r\nA\r\n\
         get neg\r\n\
         set x 0 bogus 1\r\nx\r\n",
        past = now - 1000,
        future = now + 1000,
    );
    let Some(real) = real_memcached("memcached_exptime_corners_match_memcached") else {
        return;
    };
    let sentinel: &[u8] = b"verbosity 1\r\n";
    let ours = exchange(port, script.as_bytes(), sentinel, b"OK\r\n");
    let theirs = exchange(real.port, script.as_bytes(), sentinel, b"OK\r\n");
    assert_eq!(
        String::from_utf8_lossy(&ours),
        String::from_utf8_lossy(&theirs)
    );
    // And the relative/absolute split is what the TTLs say.
    let mut m = Mc::new(port);
    assert_eq!(m.req("set month 0 2592000 1\r\nm\r\n"), "STORED");
    let mut c = client(&s);
    let ttl: i64 = q(&mut c, &["TTL", "month"]);
    assert!((2_591_990..=2_592_000).contains(&ttl), "30 days: ttl {ttl}");
}
