//! Transactions and pub/sub against redis-server: MULTI/EXEC/DISCARD/
//! WATCH edge cases, queued errors, and the exact shapes of subscribe
//! confirmations and messages in RESP2 and RESP3.

use super::harness::{agree, step, Cmp, Conn, Pair};

#[test]
fn transactions_match_redis() {
    let Some(mut p) = Pair::start("transactions_match_redis") else {
        return;
    };
    p.cases(&[
        &["MULTI", "SET a 1", "INCR a", "GET a", "EXEC", "GET a"],
        // Queue-time errors abort; runtime errors are per command.
        &["MULTI", "SET a 1", "FOO bar", "INCR a", "EXEC", "GET a"],
        &["MULTI", "SET a 1", "GET", "EXEC", "GET a"],
        &["MULTI", "SET a x", "INCR a", "GET a", "HGET a f", "EXEC"],
        // Misplaced commands.
        &["EXEC", "DISCARD", "MULTI", "MULTI", "SET a 1", "EXEC"],
        &["MULTI", "WATCH a", "SET a 1", "EXEC"],
        &["MULTI", "DISCARD", "EXEC", "GET a"],
        &["MULTI", "EXEC"],
        &["MULTI", "SET a 1", "EXEC x", "EXEC", "GET a", "EXEC x"],
        &["MULTI", "PING", "ECHO x", "UNWATCH", "EXEC"],
        // WATCH: own writes before MULTI dirty the transaction.
        &["WATCH a", "SET a 1", "MULTI", "GET a", "EXEC"],
        &["SET a 1", "WATCH a", "MULTI", "INCR a", "EXEC", "GET a"],
        &["WATCH a", "UNWATCH", "SET a 1", "MULTI", "GET a", "EXEC"],
        &[
            "WATCH a", "MULTI", "SET a 2", "DISCARD", "SET a 3", "MULTI", "GET a", "EXEC",
        ],
        &[
            "WATCH a", "MULTI", "SET a 2", "EXEC", "SET a 3", "MULTI", "GET a", "EXEC",
        ],
        &["WATCH", "WATCH a b c", "MULTI", "EXEC"],
        // FLUSHALL dirties watches of keys that existed only.
        &["SET a 1", "WATCH a", "FLUSHALL", "MULTI", "PING", "EXEC"],
        &["WATCH nokey", "FLUSHALL", "MULTI", "PING", "EXEC"],
        &["MULTI", "SET a 1", "FLUSHALL", "GET a", "EXEC", "DBSIZE"],
        // RESP3: EXEC's array, a dirty EXEC's null, a double inside.
        &[
            "? HELLO 3",
            "MULTI",
            "SET a 1",
            "INCRBYFLOAT a 1.5",
            "HSET h f v",
            "HGETALL h",
            "EXEC",
            "WATCH a",
            "SET a 2",
            "MULTI",
            "GET a",
            "EXEC",
            "? HELLO 2",
        ],
        // RESET discards.
        &["MULTI", "SET a 1", "RESET", "EXEC", "GET a"],
    ]);
}

/// A write by another client to a watched key, and a watched key's
/// expiry, dirty the transaction; a write to another key does not.
#[test]
fn watch_sees_other_clients_and_expiry_like_redis() {
    let Some(mut p) = Pair::start("watch_sees_other_clients_and_expiry_like_redis") else {
        return;
    };
    let mut o2 = Conn::new(p.ours_port());
    let mut t2 = Conn::new(p.theirs_port());
    let mut other = |line: &str| {
        let s = step(line);
        assert_eq!(o2.run(&s.args), t2.run(&s.args), "{line}");
    };
    for (before, exec_null) in [("SET a 9", true), ("SET b 9", false), ("DEL nokey", false)] {
        p.check(&step("FLUSHALL"), "flush");
        p.check(&step("SET a 1"), "set");
        p.check(&step("WATCH a"), "watch");
        other(before);
        p.check(&step("MULTI"), "multi");
        p.check(&step("INCR a"), "incr");
        let (ours, _) = p.check(&step("EXEC"), before);
        assert_eq!(ours == crate::common::V::Null, exec_null, "{before}");
    }
    // Expiry between WATCH and EXEC.
    p.check(&step("FLUSHALL"), "flush");
    p.check(&step("SET e 1 PX 100"), "set");
    p.check(&step("WATCH e"), "watch");
    std::thread::sleep(std::time::Duration::from_millis(200));
    p.check(&step("MULTI"), "multi");
    p.check(&step("GET e"), "get");
    p.check(&step("EXEC"), "exec after expiry");
}

#[test]
fn pubsub_shapes_match_redis() {
    let Some(mut p) = Pair::start("pubsub_shapes_match_redis") else {
        return;
    };
    // Not subscribed.
    p.cases(&[&[
        "PUBLISH nobody hi",
        "PUBSUB NUMPAT",
        "PUBSUB NUMSUB a b",
        "PUBSUB CHANNELS",
        "PUBSUB FOO",
        "PUBSUB NUMPAT x",
        "UNSUBSCRIBE",
        "PUNSUBSCRIBE",
        "UNSUBSCRIBE x",
    ]]);
    for proto in ["2", "3"] {
        p.check(&step(&format!("? HELLO {proto}")), "hello");
        let mut opub = Conn::new(p.ours_port());
        let mut tpub = Conn::new(p.theirs_port());
        p.check(&step("SUBSCRIBE ch1"), "subscribe");
        p.check(&step("PSUBSCRIBE c*"), "psubscribe");
        p.check(&step("PING"), "ping subscribed");
        p.check(&step("PING hey"), "ping subscribed");
        if proto == "2" {
            p.check(&step("GET a"), "refused in RESP2");
        } else {
            p.check(&step("SET a 1"), "allowed in RESP3");
        }
        let pubs = step("PUBLISH ch1 hello");
        assert_eq!(opub.run(&pubs.args), tpub.run(&pubs.args));
        // message then pmessage.
        let a = p.ours.0.read();
        let b = p.theirs.0.read();
        assert_eq!(a, b, "message RESP{proto}");
        let a = p.ours.0.read();
        let b = p.theirs.0.read();
        assert_eq!(a, b, "pmessage RESP{proto}");
        for l in [
            "PUBSUB NUMSUB ch1",
            "PUBSUB NUMPAT",
            "PUBSUB CHANNELS",
            "PUBSUB CHANNELS x*",
        ] {
            let s = step(l);
            assert_eq!(opub.run(&s.args), tpub.run(&s.args), "{l}");
        }
        p.check(&step("UNSUBSCRIBE ch1"), "unsubscribe");
        p.check(&step("PUNSUBSCRIBE"), "punsubscribe all");
        p.check(&step("UNSUBSCRIBE"), "unsubscribe none");
        p.check(&step("GET a"), "plain again");
        // RESET leaves everything and returns to RESP2.
        p.check(&step("SUBSCRIBE x y"), "subscribe 2");
        let (a, b) = (p.ours.0.read(), p.theirs.0.read());
        assert_eq!(a, b, "second confirmation");
        p.check(&step("RESET"), "reset");
        p.check(&step("GET a"), "after reset");
        let s = step("PUBSUB NUMSUB x");
        assert_eq!(opub.run(&s.args), tpub.run(&s.args));
    }
    // A RESP3 client receives its own PUBLISH before the count.
    p.check(&step("? HELLO 3"), "hello");
    p.check(&step("SUBSCRIBE me"), "subscribe");
    p.check(&step("PUBLISH me x"), "self publish: push first");
    let a = p.ours.0.read();
    let b = p.theirs.0.read();
    assert_eq!(a, b, "count after the push");
}

#[test]
fn sharded_pubsub_matches_redis() {
    let Some(mut p) = Pair::start("sharded_pubsub_matches_redis") else {
        return;
    };
    p.cases(&[&[
        "SPUBLISH nobody hi",
        "SPUBLISH a",
        "SSUBSCRIBE",
        "PUBSUB SHARDCHANNELS",
        "PUBSUB SHARDCHANNELS a b",
        "PUBSUB CHANNELS a b",
        "PUBSUB SHARDNUMSUB",
        "PUBSUB SHARDNUMSUB a b",
        "SUNSUBSCRIBE",
        "SUNSUBSCRIBE x",
        "MULTI",
        "SSUBSCRIBE x",
        "SPUBLISH x y",
        "EXEC",
    ]]);
    for proto in ["2", "3"] {
        p.check(&step(&format!("? HELLO {proto}")), "hello");
        let mut opub = Conn::new(p.ours_port());
        let mut tpub = Conn::new(p.theirs_port());
        p.check(&step("SSUBSCRIBE a b"), "ssubscribe");
        let (x, y) = (p.ours.0.read(), p.theirs.0.read());
        assert_eq!(x, y, "second confirmation");
        p.check(&step("SUBSCRIBE c"), "subscribe: its own count");
        p.check(&step("SSUBSCRIBE a"), "again");
        p.check(&step("PING"), "ping subscribed");
        if proto == "2" {
            p.check(&step("GET k"), "refused in RESP2");
        }
        for l in [
            "SPUBLISH a hello",
            "PUBLISH a not-for-shard",
            "PUBSUB SHARDCHANNELS",
            "PUBSUB SHARDCHANNELS a*",
            "PUBSUB SHARDNUMSUB a b z",
            "PUBSUB CHANNELS",
        ] {
            let s = step(l);
            let (x, y) = (opub.run(&s.args), tpub.run(&s.args));
            assert!(
                agree(Cmp::Unordered, &x, &y),
                "{l} RESP{proto}: {x:?} {y:?}"
            );
        }
        let (x, y) = (p.ours.0.read(), p.theirs.0.read());
        assert_eq!(x, y, "smessage RESP{proto}");
        p.check(&step("SUNSUBSCRIBE a"), "sunsubscribe a");
        p.check(&step("SUNSUBSCRIBE"), "sunsubscribe all");
        p.check(&step("SUNSUBSCRIBE"), "sunsubscribe none");
        if proto == "2" {
            p.check(&step("GET k"), "still subscribed to c");
        }
        p.check(&step("UNSUBSCRIBE"), "unsubscribe");
        p.check(&step("GET k"), "plain again");
        p.check(&step("SSUBSCRIBE q"), "ssubscribe q");
        p.check(&step("RESET"), "reset");
        let s = step("PUBSUB SHARDNUMSUB q");
        assert_eq!(opub.run(&s.args), tpub.run(&s.args));
    }
}
