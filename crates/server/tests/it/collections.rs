//! Large collections as engine items (`server::coll`, `server::list`):
//! hashes, sets and lists survive a
//! restart of a `--data-dir` store, their nodes never show as keys, the
//! nodes of a collection that dies without a command seeing it (SET over
//! it, expiry, memcached `delete`) are reclaimed by the sweeper, and their
//! memory counts against the capacity (OOM, then DEL gives it back).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::{client, q, start_with, Mc};

fn internal_keys(s: &server::Server) -> usize {
    let store = &s.shared().store;
    let mut n = 0;
    let mut cursor = 0;
    loop {
        let (next, keys) = store.raw_scan(cursor, 1024).unwrap();
        n += keys
            .iter()
            .filter(|k| server::engine::is_internal_key(k))
            .count();
        if next == 0 {
            return n;
        }
        cursor = next;
    }
}

fn fill(c: &mut redis::Connection, n: usize) {
    let mut p = redis::pipe();
    for i in 0..n {
        p.cmd("HSET")
            .arg("h")
            .arg(format!("f{i}"))
            .arg(format!("v{i}"))
            .ignore();
        p.cmd("SADD").arg("s").arg(format!("m{i}")).ignore();
        p.cmd("RPUSH").arg("l").arg(format!("e{i}")).ignore();
    }
    p.query::<()>(c).unwrap();
}

#[test]
fn large_collections_survive_a_data_dir_restart() {
    let dir = PathBuf::from(format!(
        "/dev/shm/nibble-server-test-{}-colls",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    {
        let s = start_with(|c| c.data_dir = Some(dir.clone()));
        let mut c = client(&s);
        fill(&mut c, 3000);
        let _: () = q(&mut c, &["HSET", "small", "a", "1"]);
        let _: () = q(&mut c, &["SADD", "ints", "3", "1", "2"]);
        assert_eq!(
            q::<String>(&mut c, &["OBJECT", "ENCODING", "h"]),
            "hashtable"
        );
        assert!(internal_keys(&s) > 100);
    }
    let s = start_with(|c| c.data_dir = Some(dir.clone()));
    let mut c = client(&s);
    assert_eq!(q::<i64>(&mut c, &["HLEN", "h"]), 3000);
    assert_eq!(q::<String>(&mut c, &["HGET", "h", "f2999"]), "v2999");
    assert_eq!(q::<i64>(&mut c, &["SCARD", "s"]), 3000);
    assert_eq!(q::<i64>(&mut c, &["SISMEMBER", "s", "m17"]), 1);
    assert_eq!(
        q::<String>(&mut c, &["OBJECT", "ENCODING", "s"]),
        "hashtable"
    );
    assert_eq!(
        q::<Vec<String>>(&mut c, &["SMEMBERS", "ints"]),
        ["1", "2", "3"]
    );
    assert_eq!(q::<String>(&mut c, &["HGET", "small", "a"]), "1");
    assert_eq!(q::<i64>(&mut c, &["LLEN", "l"]), 3000);
    assert_eq!(q::<String>(&mut c, &["LINDEX", "l", "1234"]), "e1234");
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 5);
    let mut keys: Vec<String> = q(&mut c, &["KEYS", "*"]);
    keys.sort();
    assert_eq!(keys, ["h", "ints", "l", "s", "small"]);
    // Updates after the restart keep working, and DEL takes the nodes.
    assert_eq!(q::<i64>(&mut c, &["HSET", "h", "new", "x"]), 1);
    assert_eq!(q::<i64>(&mut c, &["DEL", "h", "s", "l"]), 3);
    assert_eq!(internal_keys(&s), 0);
    drop(c);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn internal_keys_are_hidden_and_orphans_are_swept() {
    let s = start_with(|_| {});
    let mut c = client(&s);
    let mut mc = Mc::new(s.memcached_port().unwrap());
    fill(&mut c, 2000);
    let mut p = redis::pipe();
    for i in 0..2000 {
        p.cmd("SADD").arg("dies").arg(i).ignore();
        p.cmd("SADD").arg("mc").arg(format!("x{i}")).ignore();
    }
    p.query::<()>(&mut c).unwrap();
    // A key that starts with 0xFF, the escape byte, stays a plain key.
    let _: () = redis::cmd("SET")
        .arg(&b"\xff\x00n-looks-internal"[..])
        .arg("v")
        .query(&mut c)
        .unwrap();
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 6);
    assert_eq!(q::<Vec<Vec<u8>>>(&mut c, &["KEYS", "*"]).len(), 6);
    let scanned: (String, Vec<Vec<u8>>) = q(&mut c, &["SCAN", "0", "COUNT", "100000"]);
    assert!(scanned.1.len() <= 6);
    assert_eq!(q::<i64>(&mut c, &["HLEN", "h"]), 2000);
    let before = internal_keys(&s);
    assert!(before > 200, "{before}");
    // Three deaths no collection command sees: SET over it, expiry, and a
    // memcached delete.
    let _: () = q(&mut c, &["SET", "h", "now a string"]);
    let _: () = q(&mut c, &["PEXPIRE", "dies", "1"]);
    assert_eq!(mc.req("delete mc\r\n"), "DELETED");
    std::thread::sleep(Duration::from_millis(20));
    // Only `s` and `l` keep nodes (about a third of them); the sweeper
    // thread reclaims the rest within a pass or two.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = internal_keys(&s);
        if left < before / 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "orphans not swept: {left} of {before}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(q::<i64>(&mut c, &["SCARD", "s"]), 2000);
    assert_eq!(q::<String>(&mut c, &["GET", "h"]), "now a string");
    assert_eq!(q::<i64>(&mut c, &["DEL", "s", "l"]), 2);
    assert_eq!(internal_keys(&s), 0);
}

#[test]
fn large_collections_count_against_the_capacity() {
    let s = start_with(|c| c.capacity = 16 << 20);
    let mut c = client(&s);
    let v = "x".repeat(1000);
    let mut oom = None;
    for i in 0..40_000 {
        match redis::cmd("HSET")
            .arg("h")
            .arg(i)
            .arg(&v)
            .query::<i64>(&mut c)
        {
            Ok(_) => {}
            Err(e) => {
                oom = Some((i, e.to_string()));
                break;
            }
        }
    }
    let (n, e) = oom.expect("16 MiB cannot hold 40 MB of fields");
    assert!(e.contains("OOM"), "{e}");
    assert!(n > 2000, "OOM after only {n} fields");
    assert_eq!(q::<i64>(&mut c, &["DEL", "h"]), 1);
    // The space comes back (compaction reclaims it): writes succeed again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if redis::cmd("HSET")
            .arg("h2")
            .arg("f")
            .arg(&v)
            .query::<i64>(&mut c)
            .is_ok()
        {
            break;
        }
        assert!(Instant::now() < deadline, "space never came back");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A large zset (`server::zset`): survives a `--data-dir` restart with
/// its order, ranks and scores; DEL takes every tree node and bucket;
/// one that dies by SET or expiry is reclaimed by the sweeper.
#[test]
fn large_zsets_survive_a_restart_and_are_swept() {
    let dir = PathBuf::from(format!(
        "/dev/shm/nibble-server-test-{}-zsets",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let zfill = |c: &mut redis::Connection, key: &str, n: usize| {
        let mut p = redis::pipe();
        for i in 0..n {
            p.cmd("ZADD")
                .arg(key)
                .arg(i % 101)
                .arg(format!("m{i}"))
                .ignore();
        }
        p.query::<()>(c).unwrap();
    };
    {
        let s = start_with(|c| c.data_dir = Some(dir.clone()));
        let mut c = client(&s);
        zfill(&mut c, "z", 5000);
        assert_eq!(
            q::<String>(&mut c, &["OBJECT", "ENCODING", "z"]),
            "skiplist"
        );
        assert!(internal_keys(&s) > 100);
    }
    let s = start_with(|c| c.data_dir = Some(dir.clone()));
    let mut c = client(&s);
    assert_eq!(q::<i64>(&mut c, &["ZCARD", "z"]), 5000);
    assert_eq!(q::<String>(&mut c, &["ZSCORE", "z", "m4999"]), "50");
    // Score 0 holds m0, m101, m202, ... (50 of them), in member order.
    assert_eq!(q::<i64>(&mut c, &["ZRANK", "z", "m0"]), 0);
    assert_eq!(q::<i64>(&mut c, &["ZCOUNT", "z", "0", "0"]), 50);
    assert_eq!(
        q::<Vec<String>>(&mut c, &["ZRANGE", "z", "0", "1"]),
        ["m0", "m101"]
    );
    assert_eq!(q::<i64>(&mut c, &["ZADD", "z", "-1", "new"]), 1);
    assert_eq!(q::<i64>(&mut c, &["ZRANK", "z", "new"]), 0);
    assert_eq!(q::<i64>(&mut c, &["DEL", "z"]), 1);
    assert_eq!(internal_keys(&s), 0);
    // Deaths no zset command sees: SET over one, expiry of another.
    zfill(&mut c, "a", 3000);
    zfill(&mut c, "b", 3000);
    zfill(&mut c, "keep", 3000);
    let before = internal_keys(&s);
    let _: () = q(&mut c, &["SET", "a", "now a string"]);
    let _: () = q(&mut c, &["PEXPIRE", "b", "1"]);
    std::thread::sleep(Duration::from_millis(20));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = internal_keys(&s);
        if left < before / 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "orphans not swept: {left} of {before}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(q::<i64>(&mut c, &["ZCARD", "keep"]), 3000);
    assert_eq!(q::<i64>(&mut c, &["DEL", "keep"]), 1);
    assert_eq!(internal_keys(&s), 0);
    drop(c);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A small hash and sets written one element at a time carry spare room
/// after their pairs (Nibble-2, `server::packed`); every reader strips
/// it: HGETALL and SMEMBERS in order, OBJECT ENCODING, DUMP and RESTORE,
/// an RDB snapshot loaded by a second server. A RESTOREd hash (written
/// without room) takes one-field HSETs and HDELs the same.
#[test]
fn small_collections_with_room_read_everywhere() {
    let dir = crate::rdb::Dir::new("room");
    let s = start_with(|c| c.rdb.dir = Some(dir.0.clone()));
    let mut c = client(&s);
    let mut want: Vec<(String, String)> = Vec::new();
    for i in 0..100 {
        let (f, v) = (format!("field:{i:04}"), format!("value-{i}"));
        assert_eq!(q::<i64>(&mut c, &["HSET", "h", &f, &v]), 1);
        want.push((f, v));
    }
    assert_eq!(q::<i64>(&mut c, &["HDEL", "h", "field:0050"]), 1);
    want.remove(50);
    let mut members: Vec<String> = (0..100).map(|i| format!("member:{i:04}")).collect();
    for m in &members {
        assert_eq!(q::<i64>(&mut c, &["SADD", "s", m]), 1);
    }
    for i in (0..100).rev() {
        assert_eq!(q::<i64>(&mut c, &["SADD", "ints", &i.to_string()]), 1);
    }
    assert_eq!(q::<i64>(&mut c, &["SREM", "ints", "7"]), 1);
    let ints: Vec<String> = (0..100)
        .filter(|&i| i != 7)
        .map(|i| i.to_string())
        .collect();
    // The items carry room: zero bytes after the pairs.
    let mut buf = Vec::new();
    s.shared().store.get_into(b"h", &mut buf).unwrap().unwrap();
    let exact = 5 + want
        .iter()
        .map(|(f, v)| 8 + f.len() + v.len())
        .sum::<usize>();
    assert!(buf.len() > exact, "{} bytes for {exact}", buf.len());
    assert!(buf[exact..].iter().all(|&b| b == 0));
    let check = |c: &mut redis::Connection, h: &str, want: &[(String, String)]| {
        let got: Vec<(String, String)> = q(c, &["HGETALL", h]);
        assert_eq!(got, want);
        assert_eq!(q::<String>(c, &["OBJECT", "ENCODING", h]), "listpack");
        assert_eq!(q::<i64>(c, &["HLEN", h]), want.len() as i64);
    };
    check(&mut c, "h", &want);
    let got: Vec<String> = q(&mut c, &["SMEMBERS", "s"]);
    assert_eq!(got, members);
    let got: Vec<String> = q(&mut c, &["SMEMBERS", "ints"]);
    assert_eq!(got, ints);
    assert_eq!(
        q::<String>(&mut c, &["OBJECT", "ENCODING", "ints"]),
        "intset"
    );
    // DUMP and RESTORE (written back without room).
    let d: Vec<u8> = redis::cmd("DUMP").arg("h").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("h2")
        .arg(0)
        .arg(d)
        .query(&mut c)
        .unwrap();
    check(&mut c, "h2", &want);
    let mut want2 = want.clone();
    assert_eq!(q::<i64>(&mut c, &["HSET", "h2", "extra", "1"]), 1);
    want2.push(("extra".into(), "1".into()));
    assert_eq!(q::<i64>(&mut c, &["HDEL", "h2", "field:0000"]), 1);
    want2.remove(0);
    check(&mut c, "h2", &want2);
    // An RDB snapshot, loaded by a second server.
    let _: () = q(&mut c, &["SAVE"]);
    drop(c);
    drop(s);
    let s = start_with(|c| c.rdb.dir = Some(dir.0.clone()));
    let mut c = client(&s);
    check(&mut c, "h", &want);
    check(&mut c, "h2", &want2);
    let mut got: Vec<String> = q(&mut c, &["SMEMBERS", "s"]);
    got.sort();
    members.sort();
    assert_eq!(got, members);
    let got: Vec<String> = q(&mut c, &["SMEMBERS", "ints"]);
    assert_eq!(got, ints);
}
