//! Random command sequences, the same on both servers, replies compared
//! exactly: strings and hashes on a handful of keys, overwrites, type
//! changes (a string key becomes a hash and back through DEL, SET,
//! RENAME, COPY), TTLs set, kept, changed and removed.
//!
//! Normalized: TTL and EXPIRETIME replies within 1 s, PTTL within 1000 ms
//! (the two servers read the clock at different instants, and a loaded
//! machine can stall one of them). Expiries are long (tens of seconds) or already
//! past (a non-positive EXPIRE deletes at once), so no key expires while
//! a sequence runs and both servers see the same keys. OBJECT ENCODING
//! and OBJECT REFCOUNT are left out: they depend on how Redis made the
//! value (a short string changed by APPEND is `raw` there and `embstr`
//! here; the `1` INCRBYFLOAT writes is not Redis's shared integer, the
//! `1` SET writes is). DUMP is compared byte for byte.
//!
//! `NIBBLE_DIFF_CASES` sets the number of sequences (default 24, so the
//! default `cargo test` stays fast); each has up to 60 commands.

use std::cell::RefCell;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::harness::{agree, sequence_runner, Cmp, Pair};

const KEYS: &[&str] = &["k0", "k1", "k2", "k3"];
const VALUES: &[&str] = &["", "a", "ab", "abc", "1", "-3", "10", "07", "0.5", "x y"];
const FIELDS: &[&str] = &["f", "g", "h"];

fn key() -> impl Strategy<Value = String> {
    proptest::sample::select(KEYS).prop_map(String::from)
}

fn val() -> impl Strategy<Value = String> {
    proptest::sample::select(VALUES).prop_map(String::from)
}

fn field() -> impl Strategy<Value = String> {
    proptest::sample::select(FIELDS).prop_map(String::from)
}

fn small_int() -> impl Strategy<Value = String> {
    (-20i64..40).prop_map(|n| n.to_string())
}

/// One command as its arguments (and how its reply is compared).
fn command() -> impl Strategy<Value = (Vec<String>, Cmp)> {
    let exact = |v: Vec<String>| (v, Cmp::Exact);
    let set_opt = proptest::sample::select(
        &[
            "", "NX", "XX", "GET", "KEEPTTL", "EX 50", "PX 60000", "EX 0", "XX GET",
        ][..],
    );
    prop_oneof![
        (key(), val(), set_opt).prop_map(move |(k, v, o)| {
            let mut a = vec!["SET".into(), k, v];
            a.extend(o.split_whitespace().map(String::from));
            exact(a)
        }),
        key().prop_map(move |k| exact(vec!["GET".into(), k])),
        (key(), key()).prop_map(move |(a, b)| exact(vec!["DEL".into(), a, b])),
        (key(), key()).prop_map(move |(a, b)| exact(vec!["EXISTS".into(), a, b])),
        (key(), val()).prop_map(move |(k, v)| exact(vec!["APPEND".into(), k, v])),
        key().prop_map(move |k| exact(vec!["INCR".into(), k])),
        (key(), small_int()).prop_map(move |(k, n)| exact(vec!["INCRBY".into(), k, n])),
        (key(), val()).prop_map(move |(k, v)| exact(vec!["INCRBYFLOAT".into(), k, v])),
        (key(), 0i64..6, val()).prop_map(move |(k, o, v)| exact(vec![
            "SETRANGE".into(),
            k,
            o.to_string(),
            v
        ])),
        (key(), small_int(), small_int()).prop_map(move |(k, s, e)| exact(vec![
            "GETRANGE".into(),
            k,
            s,
            e
        ])),
        key().prop_map(move |k| exact(vec!["STRLEN".into(), k])),
        (key(), 0i64..40, 0i64..2).prop_map(move |(k, o, b)| exact(vec![
            "SETBIT".into(),
            k,
            o.to_string(),
            b.to_string()
        ])),
        (key(), 0i64..40).prop_map(move |(k, o)| exact(vec!["GETBIT".into(), k, o.to_string()])),
        (key(), small_int(), small_int(), proptest::bool::ANY).prop_map(move |(k, s, e, bit)| {
            let mut a = vec!["BITCOUNT".into(), k, s, e];
            if bit {
                a.push("BIT".into());
            }
            exact(a)
        }),
        (key(), 0i64..2, small_int()).prop_map(move |(k, b, s)| exact(vec![
            "BITPOS".into(),
            k,
            b.to_string(),
            s
        ])),
        (key(), 0i64..30, small_int()).prop_map(move |(k, o, n)| exact(vec![
            "BITFIELD".into(),
            k,
            "OVERFLOW".into(),
            "SAT".into(),
            "INCRBY".into(),
            "i5".into(),
            o.to_string(),
            n,
            "GET".into(),
            "u4".into(),
            "0".into()
        ])),
        (
            proptest::sample::select(&["AND", "OR", "XOR"][..]),
            key(),
            key(),
            key()
        )
            .prop_map(move |(op, d, a, b)| exact(vec!["BITOP".into(), op.into(), d, a, b])),
        (key(), field(), val()).prop_map(move |(k, f, v)| exact(vec!["HSET".into(), k, f, v])),
        (key(), field()).prop_map(move |(k, f)| exact(vec!["HGET".into(), k, f])),
        (key(), field()).prop_map(move |(k, f)| exact(vec!["HDEL".into(), k, f])),
        (key(), field(), small_int()).prop_map(move |(k, f, n)| exact(vec![
            "HINCRBY".into(),
            k,
            f,
            n
        ])),
        (key(), field(), val()).prop_map(move |(k, f, v)| exact(vec![
            "HINCRBYFLOAT".into(),
            k,
            f,
            v
        ])),
        key().prop_map(move |k| exact(vec!["HGETALL".into(), k])),
        key().prop_map(move |k| exact(vec!["HLEN".into(), k])),
        key().prop_map(move |k| exact(vec!["TYPE".into(), k])),
        (
            key(),
            proptest::sample::select(&["50", "0", "-1", "100"][..]),
            proptest::sample::select(&["", "NX", "XX", "GT", "LT"][..])
        )
            .prop_map(move |(k, s, o)| {
                let mut a = vec!["EXPIRE".into(), k, s.into()];
                if !o.is_empty() {
                    a.push(o.into());
                }
                exact(a)
            }),
        key().prop_map(move |k| exact(vec!["PERSIST".into(), k])),
        key().prop_map(move |k| (vec!["TTL".into(), k], Cmp::Near(1))),
        (key(), key()).prop_map(move |(a, b)| exact(vec!["RENAME".into(), a, b])),
        (key(), key()).prop_map(move |(a, b)| exact(vec!["RENAMENX".into(), a, b])),
        (key(), key(), proptest::bool::ANY).prop_map(move |(a, b, r)| {
            let mut v = vec!["COPY".into(), a, b];
            if r {
                v.push("REPLACE".into());
            }
            exact(v)
        }),
        key().prop_map(move |k| exact(vec!["GETDEL".into(), k])),
        (
            key(),
            proptest::sample::select(&["", "PERSIST", "EX 70"][..])
        )
            .prop_map(move |(k, o)| {
                let mut a = vec!["GETEX".into(), k];
                a.extend(o.split_whitespace().map(String::from));
                exact(a)
            }),
        (key(), val(), key(), val()).prop_map(move |(a, x, b, y)| exact(vec![
            "MSETNX".into(),
            a,
            x,
            b,
            y
        ])),
        (key(), key()).prop_map(move |(a, b)| exact(vec!["MGET".into(), a, b])),
        (key(), key()).prop_map(move |(a, b)| exact(vec![
            "LCS".into(),
            a,
            b,
            "IDX".into(),
            "WITHMATCHLEN".into()
        ])),
        Just(exact(vec!["DBSIZE".into()])),
        Just((vec!["KEYS".into(), "*".into()], Cmp::Unordered)),
        (key(), val()).prop_map(move |(k, v)| exact(vec!["SETNX".into(), k, v])),
        (key(), val()).prop_map(move |(k, v)| exact(vec!["GETSET".into(), k, v])),
        (key(), val()).prop_map(move |(k, v)| exact(vec!["SETEX".into(), k, "80".into(), v])),
        (key(), small_int()).prop_map(move |(k, n)| exact(vec!["DECRBY".into(), k, n])),
        (key(), field(), val()).prop_map(move |(k, f, v)| exact(vec!["HSETNX".into(), k, f, v])),
        (key(), field(), field()).prop_map(move |(k, f, g)| exact(vec!["HMGET".into(), k, f, g])),
        (key(), field()).prop_map(move |(k, f)| exact(vec!["HEXISTS".into(), k, f])),
        (key(), field()).prop_map(move |(k, f)| exact(vec!["HSTRLEN".into(), k, f])),
        key().prop_map(move |k| exact(vec!["HKEYS".into(), k])),
        key().prop_map(move |k| exact(vec!["HVALS".into(), k])),
        key().prop_map(move |k| (vec!["EXPIRETIME".into(), k], Cmp::Near(1))),
        key().prop_map(move |k| (vec!["PTTL".into(), k], Cmp::Near(1000))),
        (key(), key()).prop_map(move |(a, b)| exact(vec!["TOUCH".into(), a, b])),
        key().prop_map(move |k| exact(vec!["DUMP".into(), k])),
    ]
}

#[test]
fn random_sequences_match_redis() {
    let Some(p) = Pair::start("random_sequences_match_redis") else {
        return;
    };
    let p = RefCell::new(p);
    let sequences = RefCell::new(0usize);
    let mut runner = sequence_runner();
    let seq = proptest::collection::vec(command(), 1..60);
    let result = runner.run(&seq, |cmds| {
        let mut p = p.borrow_mut();
        *sequences.borrow_mut() += 1;
        let flush = vec![b"FLUSHALL".to_vec()];
        p.ours.run(&flush);
        p.theirs.run(&flush);
        for (i, (args, cmp)) in cmds.iter().enumerate() {
            let bytes: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
            let a = p.ours.run(&bytes);
            let b = p.theirs.run(&bytes);
            p.compared += 1;
            if !agree(*cmp, &a, &b) {
                return Err(TestCaseError::fail(format!(
                    "step {i} {args:?}\n  nibble: {a:?}\n  redis:  {b:?}\nsequence: {cmds:?}"
                )));
            }
        }
        Ok(())
    });
    let p = p.borrow();
    println!(
        "differential: {} random sequences, {} commands compared with redis-server",
        sequences.borrow(),
        p.compared
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
