//! Hashes and sets against redis-server, on both representations: small
//! (one item, `listpack`/`intset`) and large (a table of bucket items),
//! with the thresholds lowered (CONFIG SET, on both servers) so that a
//! few elements cross them, and with the defaults over thousands.
//!
//! Normalized: member order of a large set or hash (`@`, compared as a
//! multiset: Redis's dict order and ours differ), random picks (`?`, by
//! kind), SCAN cursors (a full iteration is compared as a set instead).

use std::collections::BTreeSet;

use proptest::test_runner::TestCaseError;

use super::harness::{agree, sequence_runner, step, Cmp, Conn, Pair};
use crate::common::V;

#[test]
fn sets_match_redis() {
    let Some(mut p) = Pair::start("sets_match_redis") else {
        return;
    };
    p.cases(&[
        &[
            "SADD s 3 1 2 2",
            "SMEMBERS s",
            "OBJECT ENCODING s",
            "SCARD s",
            "SISMEMBER s 2",
            "SISMEMBER s 9",
            "SMISMEMBER s 1 9 3",
            "SMISMEMBER nokey 1",
            "SREM s 2 9",
            "SMEMBERS s",
            "TYPE s",
            "SADD s -5 100",
            "SMEMBERS s",
            "SADD s x",
            "@ SMEMBERS s",
            "SREM s 1 3 -5 100 x",
            "EXISTS s",
            "TYPE s",
            "SCARD nokey",
            "SMEMBERS nokey",
            "SET str v",
            "SADD str a",
            "SREM str a",
            "SISMEMBER str a",
            "SMISMEMBER str a",
            "SMEMBERS str",
            "SCARD str",
            "SPOP str",
            "SRANDMEMBER str",
            "SSCAN str 0",
            "HSET h f v",
            "SADD h a",
            "HGET str f",
            "HSET str f v",
            "SADD",
            "SADD s",
            "SISMEMBER s",
            "SMOVE s",
        ],
        &[
            "SADD a 1 2 3 4",
            "SADD b 3 4 5",
            "SADD c 4 x",
            "SINTER a b",
            "SINTER a b c",
            "SINTER a nokey",
            "@ SUNION a b c",
            "SUNION nokey",
            "SDIFF a b",
            "@ SDIFF a c",
            "SDIFF nokey a",
            "SINTERSTORE d a b",
            "SMEMBERS d",
            "SUNIONSTORE d a b",
            "SMEMBERS d",
            "SDIFFSTORE d a b",
            "SMEMBERS d",
            "SINTERSTORE d a nokey",
            "EXISTS d",
            "SET str v",
            "SINTER a str",
            "SINTER nokey str",
            "SUNION a str",
            "SDIFF a str",
            "SINTERSTORE str a b",
            "TYPE str",
            "SINTERCARD 2 a b",
            "SINTERCARD 2 a b LIMIT 1",
            "SINTERCARD 2 a b LIMIT 0",
            "SINTERCARD 1 nokey",
            "SINTERCARD 0 a",
            "SINTERCARD -1 a",
            "SINTERCARD 3 a b",
            "SINTERCARD 2 a b LIMIT -1",
            "SINTERCARD 2 a b FOO 1",
            "SINTERCARD 2 a b LIMIT",
            "SINTERCARD x a",
            "SET str2 v",
            "SINTERCARD 2 a str2",
            "SMOVE a b 1",
            "SMEMBERS a",
            "SMEMBERS b",
            "SMOVE a b 99",
            "SMOVE nokey b 1",
            "SMOVE a str2 2",
            "SMOVE str2 a 2",
            "SMOVE a a 2",
            "SMOVE a a 99",
            "SMOVE a new 2",
            "SMEMBERS new",
            "SMOVE new a 2",
            "EXISTS new",
        ],
        &[
            "SADD s 1 2 3",
            "? SPOP s",
            "SCARD s",
            "? SPOP s 5",
            "EXISTS s",
            "SPOP s",
            "SPOP s 2",
            "SPOP s 0",
            "SPOP s -1",
            "SPOP s x",
            "SPOP s 1 2",
            "SADD s 1 2 3",
            "SPOP s 0",
            "SRANDMEMBER s 0",
            "SRANDMEMBER s 3",
            "@ SRANDMEMBER s 10",
            "? SRANDMEMBER s -5",
            "? SRANDMEMBER s",
            "SRANDMEMBER nokey",
            "SRANDMEMBER nokey 3",
            "SRANDMEMBER nokey -3",
            "SRANDMEMBER s x",
            "SRANDMEMBER s -9223372036854775808",
            "SRANDMEMBER s 1 2",
            "SSCAN s 0",
            "SSCAN s 0 MATCH 2",
            "SSCAN s 0 COUNT 0",
            "SSCAN s 0 COUNT x",
            "SSCAN s x",
            "SSCAN s 0 TYPE string",
            "SSCAN nokey 0",
            "SSCAN s 0 MATCH",
        ],
    ]);
}

#[test]
fn hashes_scan_and_randfield_match_redis() {
    let Some(mut p) = Pair::start("hashes_scan_and_randfield_match_redis") else {
        return;
    };
    p.cases(&[&[
        "HSET h a 1 b 2 c 3",
        "HSCAN h 0",
        "HSCAN h 0 MATCH b",
        "HSCAN h 0 COUNT 1",
        "HSCAN h 0 COUNT 0",
        "HSCAN h x",
        "HSCAN nokey 0",
        "HRANDFIELD nokey",
        "HRANDFIELD nokey 2",
        "HRANDFIELD h 0",
        "HRANDFIELD h 3",
        "HRANDFIELD h 3 WITHVALUES",
        "@ HRANDFIELD h 5",
        "? HRANDFIELD h",
        "? HRANDFIELD h -5",
        "? HRANDFIELD h -5 WITHVALUES",
        "HRANDFIELD h 1 FOO",
        "HRANDFIELD h x",
        "HRANDFIELD h 1 WITHVALUES x",
        "HRANDFIELD h -9223372036854775808",
        "SET str v",
        "HSCAN str 0",
        "HRANDFIELD str",
        "OBJECT ENCODING h",
    ]]);
}

/// Every element a full SCAN-family iteration returns (cursor to 0).
fn full_scan(c: &mut Conn, cmd: &str, key: &str) -> BTreeSet<Vec<u8>> {
    let mut out = BTreeSet::new();
    let mut cursor = b"0".to_vec();
    loop {
        let args = vec![
            cmd.as_bytes().to_vec(),
            key.as_bytes().to_vec(),
            cursor.clone(),
            b"COUNT".to_vec(),
            b"50".to_vec(),
        ];
        let V::Array(r) = c.run(&args) else {
            panic!("{cmd} failed")
        };
        let V::Bulk(next) = &r[0] else { panic!() };
        let V::Array(items) = &r[1] else { panic!() };
        for i in items {
            if let V::Bulk(b) = i {
                out.insert(b.clone());
            }
        }
        if next == b"0" {
            return out;
        }
        cursor = next.clone();
    }
}

#[test]
fn large_collections_match_redis() {
    let Some(mut p) = Pair::start("large_collections_match_redis") else {
        return;
    };
    for i in 0..3000 {
        p.check(&step(&format!("HSET h f{i} v{i}")), "fill h");
        p.check(&step(&format!("SADD s m{i}")), "fill s");
        p.check(&step(&format!("SADD n {i}")), "fill n");
    }
    let lines = [
        "HLEN h",
        "OBJECT ENCODING h",
        "HGET h f2999",
        "HGET h f3000",
        "HMGET h f1 f2 nope",
        "HEXISTS h f17",
        "HSTRLEN h f1000",
        "HINCRBY h f1 1",
        "HSET h cnt 5",
        "HINCRBY h cnt 10",
        "HINCRBYFLOAT h cnt 0.5",
        "HSETNX h cnt 1",
        "HSETNX h new 1",
        "HDEL h f1 f2 nope",
        "HLEN h",
        "@ HKEYS h",
        "@ HVALS h",
        "SCARD s",
        "OBJECT ENCODING s",
        "OBJECT ENCODING n",
        "SISMEMBER s m2999",
        "SISMEMBER s m3000",
        "SREM s m1 m2 nope",
        "SCARD s",
        "@ SMEMBERS s",
        "SINTERCARD 2 s n",
        "SADD n m5",
        "SINTER s n",
        "SINTERSTORE d s n",
        "@ SDIFF s n",
        "SDIFFSTORE d s n",
        "SCARD d",
        "SUNIONSTORE d s n",
        "SCARD d",
        "TYPE d",
        "SMOVE s n m7",
        "SCARD s",
        "SCARD n",
        "? SPOP s",
        "SCARD s",
        "? SPOP s 10",
        "SCARD s",
        "SRANDMEMBER s 0",
        "? SRANDMEMBER s 5",
        "? HRANDFIELD h 5 WITHVALUES",
        "RENAME h h2",
        "HLEN h2",
        "EXISTS h",
        "COPY h2 h3",
        "HLEN h3",
        "HGET h3 f2999",
        "DEL h2",
        "HLEN h3",
        "EXPIRE h3 100",
        "~1 TTL h3",
        "DBSIZE",
        "@ KEYS *",
    ];
    for l in lines {
        p.check(&step(l), "large");
    }
    // `s` lost random members to SPOP: its scan is checked against its
    // own SMEMBERS; the others against redis-server's.
    for (cmd, key) in [("HSCAN", "h3"), ("SSCAN", "n")] {
        let a = full_scan(&mut p.ours, cmd, key);
        let b = full_scan(&mut p.theirs, cmd, key);
        assert!(a == b, "{cmd} {key}: {} vs {} elements", a.len(), b.len());
    }
    let scanned = full_scan(&mut p.ours, "SSCAN", "s");
    let V::Array(ms) = p.ours.run(&step("SMEMBERS s").args) else {
        panic!("SMEMBERS")
    };
    let ms: BTreeSet<Vec<u8>> = ms
        .into_iter()
        .map(|m| match m {
            V::Bulk(b) => b,
            _ => panic!("member"),
        })
        .collect();
    assert!(
        scanned == ms,
        "SSCAN s: {} vs SMEMBERS {}",
        scanned.len(),
        ms.len()
    );
    for l in ["DEL h3 s n d", "DBSIZE"] {
        p.check(&step(l), "large");
    }
}

/// Random set and hash commands on a few keys, with thresholds of 4 so
/// that sequences cross between the representations both ways.
#[test]
fn collections_random_sequences_match_redis() {
    let Some(mut p) = Pair::start("collections_random_sequences_match_redis") else {
        return;
    };
    for l in [
        "CONFIG SET hash-max-listpack-entries 4",
        "CONFIG SET set-max-intset-entries 4",
    ] {
        p.check(&step(l), "config");
    }
    let keys = ["a", "b", "c"];
    let elems = ["1", "2", "3", "4", "5", "6", "x", "y", "z", "-7"];
    let cmd = (
        0usize..15,
        0usize..3,
        0usize..3,
        proptest::collection::vec(0usize..10, 1..4),
    );
    let mut runner = sequence_runner();
    let p = std::cell::RefCell::new(p);
    runner
        .run(&proptest::collection::vec(cmd, 1..60), |seq| {
            let mut p = p.borrow_mut();
            p.check(&step("FLUSHALL"), "flush");
            for (op, k, k2, es) in seq {
                let (k, k2) = (keys[k], keys[k2]);
                let es: Vec<&str> = es.iter().map(|&i| elems[i]).collect();
                let e = es[0];
                let pairs: Vec<String> = es.iter().map(|e| format!("{e} v{e}")).collect();
                let (line, cmp) = match op {
                    0 => (format!("SADD {k} {}", es.join(" ")), Cmp::Exact),
                    1 => (format!("SREM {k} {}", es.join(" ")), Cmp::Exact),
                    2 => (format!("SISMEMBER {k} {e}"), Cmp::Exact),
                    3 => (format!("SMEMBERS {k}"), Cmp::Unordered),
                    4 => (format!("SCARD {k}"), Cmp::Exact),
                    5 => (format!("SMOVE {k} {k2} {e}"), Cmp::Exact),
                    6 => (format!("SINTERSTORE {k} {k} {k2}"), Cmp::Exact),
                    7 => (format!("SUNION {k} {k2}"), Cmp::Unordered),
                    8 => (format!("HSET {k} {}", pairs.join(" ")), Cmp::Exact),
                    9 => (format!("HDEL {k} {}", es.join(" ")), Cmp::Exact),
                    10 => (format!("HGET {k} {e}"), Cmp::Exact),
                    11 => (format!("HLEN {k}"), Cmp::Exact),
                    12 => (format!("HGETALL {k}"), Cmp::Kind),
                    13 => (format!("TYPE {k}"), Cmp::Exact),
                    _ => (format!("HINCRBY {k} {e} 3"), Cmp::Exact),
                };
                let mut s = step(&line);
                s.cmp = cmp;
                let a = p.ours.run(&s.args);
                let b = p.theirs.run(&s.args);
                if !agree(s.cmp, &a, &b) {
                    return Err(TestCaseError::fail(format!(
                        "{line}\n  nibble: {a:?}\n  redis:  {b:?}"
                    )));
                }
            }
            // The whole state, order aside.
            for k in keys {
                for c in [
                    format!("TYPE {k}"),
                    format!("SCARD {k}"),
                    format!("HLEN {k}"),
                ] {
                    let s = step(&c);
                    let (a, b) = (p.ours.run(&s.args), p.theirs.run(&s.args));
                    if a != b {
                        return Err(TestCaseError::fail(format!("{c}: {a:?} vs {b:?}")));
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}
