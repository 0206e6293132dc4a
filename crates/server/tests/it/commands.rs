//! String and key commands through the `redis` client crate.

use std::thread::sleep;
use std::time::Duration;

use crate::common::{client, cmd, err, q, start};

#[test]
fn get_set_and_options() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(q::<Option<String>>(&mut c, &["GET", "nokey"]), None);
    assert_eq!(q::<String>(&mut c, &["SET", "k", "v"]), "OK");
    assert_eq!(q::<String>(&mut c, &["GET", "k"]), "v");
    // NX / XX
    assert_eq!(q::<Option<String>>(&mut c, &["SET", "k", "w", "NX"]), None);
    assert_eq!(q::<String>(&mut c, &["SET", "k", "w", "XX"]), "OK");
    assert_eq!(q::<Option<String>>(&mut c, &["SET", "k2", "w", "XX"]), None);
    // GET option
    assert_eq!(q::<String>(&mut c, &["SET", "k", "x", "GET"]), "w");
    assert_eq!(
        q::<Option<String>>(&mut c, &["SET", "new", "x", "GET"]),
        None
    );
    assert_eq!(q::<String>(&mut c, &["GET", "new"]), "x");
    // Expiry options
    assert_eq!(q::<String>(&mut c, &["SET", "e", "1", "EX", "100"]), "OK");
    let ttl: i64 = q(&mut c, &["TTL", "e"]);
    assert!((99..=100).contains(&ttl), "{ttl}");
    assert_eq!(q::<String>(&mut c, &["SET", "e", "2", "KEEPTTL"]), "OK");
    assert!(q::<i64>(&mut c, &["TTL", "e"]) > 90);
    assert_eq!(q::<String>(&mut c, &["SET", "e", "3"]), "OK");
    assert_eq!(q::<i64>(&mut c, &["TTL", "e"]), -1);
    assert_eq!(
        q::<String>(&mut c, &["SET", "p", "1", "PX", "100000"]),
        "OK"
    );
    assert!(q::<i64>(&mut c, &["PTTL", "p"]) > 90_000);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let at = (now_ms / 1000 + 200).to_string();
    assert_eq!(q::<String>(&mut c, &["SET", "x", "1", "EXAT", &at]), "OK");
    assert!(q::<i64>(&mut c, &["TTL", "x"]) > 150);
    let pat = (now_ms + 200_000).to_string();
    assert_eq!(q::<String>(&mut c, &["SET", "x", "1", "PXAT", &pat]), "OK");
    assert_eq!(
        q::<i64>(&mut c, &["PEXPIRETIME", "x"]),
        now_ms as i64 + 200_000
    );
    // Errors
    assert_eq!(
        err(&mut c, &["SET", "k", "v", "NX", "XX"]),
        "ERR syntax error"
    );
    assert_eq!(
        err(&mut c, &["SET", "k", "v", "EX", "0"]),
        "ERR invalid expire time in 'set' command"
    );
    assert_eq!(
        err(&mut c, &["SET", "k", "v", "EX", "abc"]),
        "ERR value is not an integer or out of range"
    );
    assert_eq!(
        err(&mut c, &["SET", "k", "v", "EX", "10", "PX", "10"]),
        "ERR syntax error"
    );
    assert_eq!(
        err(&mut c, &["SET", "k"]),
        "ERR wrong number of arguments for 'set' command"
    );
    assert_eq!(
        err(&mut c, &["GET"]),
        "ERR wrong number of arguments for 'get' command"
    );
    // The empty key is a key, as in Redis.
    assert_eq!(cmd(&mut c, &["SET", "", "v"]).unwrap(), redis::Value::Okay);
    assert_eq!(
        cmd(&mut c, &["GET", ""]).unwrap(),
        redis::Value::BulkString(b"v".to_vec())
    );
}

#[test]
fn setex_setnx_getset_getdel_getex() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(q::<String>(&mut c, &["SETEX", "a", "100", "v"]), "OK");
    assert!(q::<i64>(&mut c, &["TTL", "a"]) >= 99);
    assert_eq!(q::<String>(&mut c, &["PSETEX", "b", "100000", "v"]), "OK");
    assert!(q::<i64>(&mut c, &["PTTL", "b"]) > 99_000);
    assert_eq!(
        err(&mut c, &["SETEX", "a", "-1", "v"]),
        "ERR invalid expire time in 'setex' command"
    );
    assert_eq!(
        err(&mut c, &["PSETEX", "a", "0", "v"]),
        "ERR invalid expire time in 'psetex' command"
    );
    assert_eq!(q::<i64>(&mut c, &["SETNX", "n", "1"]), 1);
    assert_eq!(q::<i64>(&mut c, &["SETNX", "n", "2"]), 0);
    assert_eq!(q::<String>(&mut c, &["GET", "n"]), "1");
    assert_eq!(q::<Option<String>>(&mut c, &["GETSET", "g", "1"]), None);
    assert_eq!(q::<String>(&mut c, &["GETSET", "g", "2"]), "1");
    assert_eq!(q::<String>(&mut c, &["GETDEL", "g"]), "2");
    assert_eq!(q::<Option<String>>(&mut c, &["GETDEL", "g"]), None);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "g"]), 0);
    q::<String>(&mut c, &["SET", "x", "v"]);
    assert_eq!(q::<String>(&mut c, &["GETEX", "x", "EX", "100"]), "v");
    assert!(q::<i64>(&mut c, &["TTL", "x"]) >= 99);
    assert_eq!(q::<String>(&mut c, &["GETEX", "x", "PERSIST"]), "v");
    assert_eq!(q::<i64>(&mut c, &["TTL", "x"]), -1);
    assert_eq!(q::<String>(&mut c, &["GETEX", "x", "PX", "100000"]), "v");
    assert!(q::<i64>(&mut c, &["PTTL", "x"]) > 90_000);
    assert_eq!(
        q::<Option<String>>(&mut c, &["GETEX", "missing", "EX", "10"]),
        None
    );
    assert_eq!(err(&mut c, &["GETEX", "x", "BOGUS"]), "ERR syntax error");
}

#[test]
fn multi_key_strings() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(q::<String>(&mut c, &["MSET", "a", "1", "b", "2"]), "OK");
    assert_eq!(
        q::<Vec<Option<String>>>(&mut c, &["MGET", "a", "b", "c"]),
        vec![Some("1".into()), Some("2".into()), None]
    );
    assert_eq!(
        err(&mut c, &["MSET", "a", "1", "b"]),
        "ERR wrong number of arguments for 'mset' command"
    );
    assert_eq!(q::<i64>(&mut c, &["MSETNX", "a", "9", "z", "9"]), 0);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "z"]), 0);
    assert_eq!(q::<i64>(&mut c, &["MSETNX", "y", "9", "z", "9"]), 1);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "y", "z", "a", "nope"]), 3);
    q::<i64>(&mut c, &["HSET", "h", "f", "v"]);
    assert_eq!(
        q::<Vec<Option<String>>>(&mut c, &["MGET", "h", "a"]),
        vec![None, Some("1".into())]
    );
}

#[test]
fn append_strlen_ranges() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(q::<i64>(&mut c, &["APPEND", "s", "Hello"]), 5);
    assert_eq!(q::<i64>(&mut c, &["APPEND", "s", " World"]), 11);
    assert_eq!(q::<i64>(&mut c, &["STRLEN", "s"]), 11);
    assert_eq!(q::<i64>(&mut c, &["STRLEN", "none"]), 0);
    assert_eq!(q::<String>(&mut c, &["GETRANGE", "s", "0", "4"]), "Hello");
    assert_eq!(q::<String>(&mut c, &["GETRANGE", "s", "-5", "-1"]), "World");
    assert_eq!(
        q::<String>(&mut c, &["GETRANGE", "s", "0", "-1"]),
        "Hello World"
    );
    assert_eq!(q::<String>(&mut c, &["GETRANGE", "s", "20", "30"]), "");
    assert_eq!(q::<String>(&mut c, &["GETRANGE", "none", "0", "3"]), "");
    assert_eq!(q::<String>(&mut c, &["SUBSTR", "s", "1", "3"]), "ell");
    assert_eq!(
        err(&mut c, &["GETRANGE", "s", "a", "1"]),
        "ERR value is not an integer or out of range"
    );
    assert_eq!(q::<i64>(&mut c, &["SETRANGE", "s", "6", "Redis"]), 11);
    assert_eq!(q::<String>(&mut c, &["GET", "s"]), "Hello Redis");
    assert_eq!(q::<i64>(&mut c, &["SETRANGE", "pad", "3", "x"]), 4);
    assert_eq!(q::<Vec<u8>>(&mut c, &["GET", "pad"]), b"\0\0\0x".to_vec());
    assert_eq!(q::<i64>(&mut c, &["SETRANGE", "empty", "0", ""]), 0);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "empty"]), 0);
    assert_eq!(
        err(&mut c, &["SETRANGE", "s", "-1", "x"]),
        "ERR offset is out of range"
    );
    assert_eq!(
        err(&mut c, &["SETRANGE", "s", "536870912", "x"]),
        "ERR string exceeds maximum allowed size (proto-max-bulk-len)"
    );
}

#[test]
fn incr_family() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(q::<i64>(&mut c, &["INCR", "n"]), 1);
    assert_eq!(q::<i64>(&mut c, &["INCRBY", "n", "10"]), 11);
    assert_eq!(q::<i64>(&mut c, &["DECR", "n"]), 10);
    assert_eq!(q::<i64>(&mut c, &["DECRBY", "n", "20"]), -10);
    q::<String>(&mut c, &["SET", "t", "5", "EX", "100"]);
    assert_eq!(q::<i64>(&mut c, &["INCR", "t"]), 6);
    assert!(q::<i64>(&mut c, &["TTL", "t"]) > 90, "INCR keeps the TTL");
    q::<String>(&mut c, &["SET", "s", "abc"]);
    assert_eq!(
        err(&mut c, &["INCR", "s"]),
        "ERR value is not an integer or out of range"
    );
    q::<String>(&mut c, &["SET", "big", "9223372036854775807"]);
    assert_eq!(
        err(&mut c, &["INCR", "big"]),
        "ERR increment or decrement would overflow"
    );
    assert_eq!(
        err(&mut c, &["INCRBY", "n", "x"]),
        "ERR value is not an integer or out of range"
    );
    assert_eq!(
        err(&mut c, &["DECRBY", "n", "-9223372036854775808"]),
        "ERR decrement would overflow"
    );
    assert_eq!(q::<String>(&mut c, &["INCRBYFLOAT", "f", "10.5"]), "10.5");
    assert_eq!(q::<String>(&mut c, &["INCRBYFLOAT", "f", "0.1"]), "10.6");
    assert_eq!(q::<String>(&mut c, &["INCRBYFLOAT", "f", "-5.6"]), "5");
    assert_eq!(
        err(&mut c, &["INCRBYFLOAT", "s", "1"]),
        "ERR value is not a valid float"
    );
    assert_eq!(
        err(&mut c, &["INCRBYFLOAT", "f", "inf"]),
        "ERR increment would produce NaN or Infinity"
    );
    q::<i64>(&mut c, &["HSET", "h", "f", "1"]);
    assert!(err(&mut c, &["INCR", "h"]).starts_with("WRONGTYPE"));
    assert!(err(&mut c, &["GET", "h"]).starts_with("WRONGTYPE"));
    assert!(err(&mut c, &["APPEND", "h", "x"]).starts_with("WRONGTYPE"));
    assert!(err(&mut c, &["STRLEN", "h"]).starts_with("WRONGTYPE"));
}

#[test]
fn incr_is_atomic_under_concurrency() {
    concurrent_rmw(nibble::Mode::Nibble);
}

#[test]
fn incr_is_atomic_under_concurrency_nibble2() {
    concurrent_rmw(nibble::Mode::Nibble2);
}

fn concurrent_rmw(mode: nibble::Mode) {
    let s = crate::common::start_with(|c| c.mode = mode);
    let port = s.resp_port().unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
                let mut con = c.get_connection().unwrap();
                for _ in 0..250 {
                    let _: i64 = redis::cmd("INCR").arg("ctr").query(&mut con).unwrap();
                    let _: i64 = redis::cmd("HINCRBY")
                        .arg("hc")
                        .arg("f")
                        .arg(1)
                        .query(&mut con)
                        .unwrap();
                    let _: i64 = redis::cmd("APPEND")
                        .arg("ap")
                        .arg("x")
                        .query(&mut con)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut c = client(&s);
    assert_eq!(q::<i64>(&mut c, &["GET", "ctr"]), 1000);
    assert_eq!(q::<i64>(&mut c, &["HGET", "hc", "f"]), 1000);
    assert_eq!(q::<i64>(&mut c, &["STRLEN", "ap"]), 1000);
}

#[test]
fn del_exists_type_rename() {
    let s = start();
    let mut c = client(&s);
    q::<String>(&mut c, &["MSET", "a", "1", "b", "2", "c", "3"]);
    assert_eq!(q::<i64>(&mut c, &["DEL", "a", "b", "zz"]), 2);
    assert_eq!(q::<i64>(&mut c, &["UNLINK", "c"]), 1);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "a", "c"]), 0);
    q::<String>(&mut c, &["SET", "s", "v", "EX", "100"]);
    q::<i64>(&mut c, &["HSET", "h", "f", "v"]);
    assert_eq!(q::<String>(&mut c, &["TYPE", "s"]), "string");
    assert_eq!(q::<String>(&mut c, &["TYPE", "h"]), "hash");
    assert_eq!(q::<String>(&mut c, &["TYPE", "none"]), "none");
    assert_eq!(q::<String>(&mut c, &["RENAME", "s", "s2"]), "OK");
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "s"]), 0);
    assert_eq!(q::<String>(&mut c, &["GET", "s2"]), "v");
    assert!(
        q::<i64>(&mut c, &["TTL", "s2"]) > 90,
        "RENAME keeps the TTL"
    );
    assert_eq!(q::<String>(&mut c, &["RENAME", "h", "h2"]), "OK");
    assert_eq!(q::<String>(&mut c, &["HGET", "h2", "f"]), "v");
    assert_eq!(err(&mut c, &["RENAME", "nope", "x"]), "ERR no such key");
    q::<String>(&mut c, &["SET", "t", "1"]);
    assert_eq!(q::<i64>(&mut c, &["RENAMENX", "t", "s2"]), 0);
    assert_eq!(q::<i64>(&mut c, &["RENAMENX", "t", "t2"]), 1);
    assert_eq!(q::<String>(&mut c, &["RENAME", "t2", "t2"]), "OK");
}

#[test]
fn expiry_commands() {
    let s = start();
    let mut c = client(&s);
    q::<String>(&mut c, &["SET", "k", "v"]);
    assert_eq!(q::<i64>(&mut c, &["TTL", "k"]), -1);
    assert_eq!(q::<i64>(&mut c, &["TTL", "nokey"]), -2);
    assert_eq!(q::<i64>(&mut c, &["PTTL", "nokey"]), -2);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "100"]), 1);
    assert!(q::<i64>(&mut c, &["TTL", "k"]) >= 99);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "nokey", "100"]), 0);
    assert_eq!(q::<i64>(&mut c, &["PEXPIRE", "k", "200000"]), 1);
    assert!(q::<i64>(&mut c, &["TTL", "k"]) > 150);
    // NX/XX/GT/LT
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "10", "NX"]), 0);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "10", "GT"]), 0);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "10", "LT"]), 1);
    assert_eq!(q::<i64>(&mut c, &["PERSIST", "k"]), 1);
    assert_eq!(q::<i64>(&mut c, &["PERSIST", "k"]), 0);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "10", "XX"]), 0);
    assert_eq!(q::<i64>(&mut c, &["EXPIRETIME", "k"]), -1);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(
        q::<i64>(&mut c, &["EXPIREAT", "k", &(now + 500).to_string()]),
        1
    );
    assert_eq!(q::<i64>(&mut c, &["EXPIRETIME", "k"]), now as i64 + 500);
    assert_eq!(
        q::<i64>(
            &mut c,
            &["PEXPIREAT", "k", &((now + 600) * 1000).to_string()]
        ),
        1
    );
    assert_eq!(
        q::<i64>(&mut c, &["PEXPIRETIME", "k"]),
        (now as i64 + 600) * 1000
    );
    assert_eq!(
        err(&mut c, &["EXPIRE", "k", "10", "NX", "XX"]),
        "ERR NX and XX, GT or LT options at the same time are not compatible"
    );
    assert_eq!(
        err(&mut c, &["EXPIRE", "k", "x"]),
        "ERR value is not an integer or out of range"
    );
    // A deadline in the past deletes.
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "-1"]), 1);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "k"]), 0);
    // Keys really expire.
    q::<String>(&mut c, &["SET", "short", "v", "PX", "50"]);
    q::<String>(&mut c, &["PSETEX", "short2", "50", "v"]);
    sleep(Duration::from_millis(120));
    assert_eq!(q::<Option<String>>(&mut c, &["GET", "short"]), None);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "short", "short2"]), 0);
    assert_eq!(q::<i64>(&mut c, &["TTL", "short"]), -2);
}

#[test]
fn keys_scan_randomkey() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(q::<Option<String>>(&mut c, &["RANDOMKEY"]), None);
    for i in 0..200 {
        q::<String>(&mut c, &["SET", &format!("user:{i}"), "v"]);
    }
    for i in 0..50 {
        q::<String>(&mut c, &["SET", &format!("other:{i}"), "v"]);
    }
    let mut ks: Vec<String> = q(&mut c, &["KEYS", "user:*"]);
    ks.sort();
    assert_eq!(ks.len(), 200);
    assert_eq!(q::<Vec<String>>(&mut c, &["KEYS", "user:1?"]).len(), 10);
    assert_eq!(q::<Vec<String>>(&mut c, &["KEYS", "*"]).len(), 250);
    // Full SCAN with MATCH and COUNT returns every matching key.
    let mut seen = std::collections::HashSet::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, keys): (String, Vec<String>) = q(
            &mut c,
            &["SCAN", &cursor, "MATCH", "other:*", "COUNT", "20"],
        );
        for k in keys {
            assert!(k.starts_with("other:"));
            seen.insert(k);
        }
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert_eq!(seen.len(), 50);
    let (_, t): (String, Vec<String>) = q(&mut c, &["SCAN", "0", "TYPE", "hash", "COUNT", "1000"]);
    assert!(t.is_empty());
    assert_eq!(err(&mut c, &["SCAN", "x"]), "ERR invalid cursor");
    assert_eq!(
        err(&mut c, &["SCAN", "0", "COUNT", "0"]),
        "ERR syntax error"
    );
    let rk: String = q(&mut c, &["RANDOMKEY"]);
    assert!(rk.starts_with("user:") || rk.starts_with("other:"));
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 250);
}

#[test]
fn unknown_command_and_select() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(
        err(&mut c, &["FOO", "a", "b"]),
        "ERR unknown command 'FOO', with args beginning with: 'a' 'b' "
    );
    assert_eq!(q::<String>(&mut c, &["SELECT", "0"]), "OK");
    assert_eq!(
        err(&mut c, &["SELECT", "1"]),
        "ERR DB index is out of range"
    );
    assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
    assert_eq!(q::<String>(&mut c, &["PING", "hi"]), "hi");
    assert_eq!(q::<String>(&mut c, &["ECHO", "hey"]), "hey");
    assert!(cmd(&mut c, &["TIME"]).is_ok());
}
