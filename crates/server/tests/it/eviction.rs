//! `maxmemory-policy` (module `eviction`): CONFIG GET/SET with Redis
//! names, a store filled far past maxmemory under allkeys-lru (writes keep
//! succeeding, evicted_keys grows, read keys outlive unread ones), and the
//! memcached-only default (evicts, or refuses with -M).

use crate::common::*;

const VALUE_BYTES: usize = 4 << 10;

fn fill_capacity() -> u64 {
    nibble::MIN_CAPACITY_BYTES as u64
}

#[test]
fn config_get_and_set_use_redis_names() {
    let s = start();
    let mut c = client(&s);
    let get = |c: &mut redis::Connection| -> String {
        let v: Vec<String> = q(c, &["CONFIG", "GET", "maxmemory-policy"]);
        v[1].clone()
    };
    assert_eq!(get(&mut c), "noeviction", "RESP is served: Redis's default");
    for p in [
        "allkeys-lru",
        "allkeys-lfu",
        "allkeys-random",
        "volatile-lru",
        "volatile-lfu",
        "volatile-random",
        "volatile-ttl",
        "noeviction",
    ] {
        let _: () = q(&mut c, &["CONFIG", "SET", "maxmemory-policy", p]);
        assert_eq!(get(&mut c), p);
        let info: String = q(&mut c, &["INFO", "memory"]);
        assert!(
            info.contains(&format!("maxmemory_policy:{p}\r\n")),
            "{info}"
        );
    }
    let e = err(&mut c, &["CONFIG", "SET", "maxmemory-policy", "lru"]);
    assert!(e.contains("invalid maxmemory-policy"), "{e}");
    let info: String = q(&mut c, &["INFO", "stats"]);
    assert_eq!(info_u64(&info, "evicted_keys"), 0);
    assert_eq!(info_u64(&info, "expired_keys"), 0);
}

#[test]
fn allkeys_lru_keeps_writing_and_keeps_read_keys() {
    let s = start_with(|c| {
        c.capacity = fill_capacity();
        c.maxmemory_policy = Some(server::eviction::MaxmemoryPolicy::AllkeysLru);
    });
    let mut c = client(&s);
    let v = vec![b'v'; VALUE_BYTES];
    let hot = 100;
    let total = 3 * fill_capacity() as usize / VALUE_BYTES;
    for i in 0..total {
        let _: () = redis::cmd("SET")
            .arg(format!("k{i}"))
            .arg(&v[..])
            .query(&mut c)
            .unwrap_or_else(|e| panic!("SET k{i} of {total}: {e}"));
        if i > hot && i % 4 == 0 {
            // The hot set is read all along; a cache refills a miss.
            let h = format!("k{}", (i / 4) % hot);
            let got: Option<Vec<u8>> = q(&mut c, &["GET", &h]);
            if got.is_none() {
                let _: () = redis::cmd("SET").arg(&h).arg(&v[..]).query(&mut c).unwrap();
            }
        }
    }
    let info: String = q(&mut c, &["INFO", "stats"]);
    let evicted = info_u64(&info, "evicted_keys");
    assert!(
        evicted > total as u64 / 2,
        "evicted_keys {evicted} of {total}"
    );
    let present = |c: &mut redis::Connection, from: usize, to: usize| -> usize {
        (from..to)
            .filter(|i| q::<i64>(c, &["EXISTS", &format!("k{i}")]) == 1)
            .count()
    };
    let hot_kept = present(&mut c, 0, hot);
    // Cold keys written in the same early stretch as the hot ones.
    let cold_kept = present(&mut c, hot, 2 * hot);
    assert!(
        hot_kept > 90 && hot_kept > cold_kept,
        "hot {hot_kept}/100 vs cold {cold_kept}/100"
    );
    let dbsize: u64 = q(&mut c, &["DBSIZE"]);
    assert!(dbsize < total as u64, "dbsize {dbsize}");
    // The memcached port reports the same evictions.
    let mut m = Mc::new(s.memcached_port().unwrap());
    m.send(b"stats\r\n");
    let stats = m.until_end();
    let ev = stats
        .iter()
        .find_map(|l| l.strip_prefix("STAT evictions "))
        .expect("evictions stat");
    assert_eq!(ev.parse::<u64>().unwrap(), evicted);
    assert!(stats
        .iter()
        .any(|l| l.starts_with("STAT expired_unfetched ")));
}

fn mc_fill(port: u16) -> (usize, Option<String>) {
    let mut m = Mc::new(port);
    let v = "m".repeat(VALUE_BYTES);
    let total = 3 * fill_capacity() as usize / VALUE_BYTES;
    for i in 0..total {
        let r = m.req(&format!("set k{i} 0 0 {}\r\n{v}\r\n", v.len()));
        if r != "STORED" {
            return (i, Some(r));
        }
    }
    (total, None)
}

#[test]
fn memcached_only_server_evicts_by_default_and_refuses_with_m() {
    let s = start_with(|c| {
        c.port = None;
        c.capacity = fill_capacity();
    });
    let (stored, refused) = mc_fill(s.memcached_port().unwrap());
    assert_eq!(refused, None, "memcached evicts: refused after {stored}");
    let mut m = Mc::new(s.memcached_port().unwrap());
    m.send(b"stats\r\n");
    let stats = m.until_end();
    assert!(
        stats
            .iter()
            .any(|l| l.starts_with("STAT evictions ") && l != "STAT evictions 0"),
        "{stats:?}"
    );
    drop(s);
    let s = start_with(|c| {
        c.port = None;
        c.capacity = fill_capacity();
        c.memcached_no_evict = true;
    });
    let (_, refused) = mc_fill(s.memcached_port().unwrap());
    assert_eq!(
        refused.as_deref(),
        Some("SERVER_ERROR out of memory storing object")
    );
}
