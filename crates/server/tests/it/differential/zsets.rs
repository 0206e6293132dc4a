//! Sorted sets against redis-server 7.0: every zset command with its
//! options and errors on small (listpack) and large (skiplist) zsets,
//! RESP3 replies, a 3,000-member zset, and random sequences.

use proptest::test_runner::TestCaseError;

use super::harness::{agree, sequence_runner, step, Cmp, Pair};

/// The hand-written cases, run on small zsets and then again with
/// `zset-max-listpack-entries 1` so the same lines hit the large form.
const CASES: &[&[&str]] = &[
    &[
        "ZADD z 1 a 2 b 3 c",
        "ZADD z 1.5 x -inf lo +inf hi",
        "ZCARD z",
        "TYPE z",
        "ZSCORE z a",
        "ZSCORE z x",
        "ZSCORE z lo",
        "ZSCORE z nope",
        "ZSCORE nokey a",
        "ZMSCORE z a nope hi",
        "ZMSCORE nokey a b",
        "ZRANGE z 0 -1",
        "ZRANGE z 0 -1 WITHSCORES",
        "ZRANGE z 1 2",
        "ZRANGE z -2 -1 withscores",
        "ZRANGE z 5 1",
        "ZRANGE z -100 100",
        "ZRANGE z 0 -1 REV",
        "ZRANGE z 0 1 REV WITHSCORES",
        "ZREVRANGE z 0 2 WITHSCORES",
        "ZREVRANGE z -1 -1",
        "ZRANGE z x 1",
        "ZRANGE z 0 1 LIMIT 0 1",
        "ZRANGE z 0 1 LIMIT 0 -1",
        "ZRANGE z 0 1 bogus",
        "ZRANGE nokey 0 -1",
        "ZRANK z a",
        "ZRANK z hi",
        "ZRANK z nope",
        "ZREVRANK z a",
        "ZREVRANK z lo",
        "ZRANK nokey a",
    ],
    &[
        "ZADD z 1 a 2 b 3 c 4 d 5 e",
        "ZRANGEBYSCORE z 2 4",
        "ZRANGEBYSCORE z (2 4 WITHSCORES",
        "ZRANGEBYSCORE z (2 (4",
        "ZRANGEBYSCORE z -inf +inf LIMIT 1 2",
        "ZRANGEBYSCORE z -inf +inf LIMIT 1 -1",
        "ZRANGEBYSCORE z -inf +inf LIMIT -1 2",
        "ZRANGEBYSCORE z -inf +inf LIMIT 9 2",
        "ZRANGEBYSCORE z -inf +inf LIMIT 0 0",
        "ZRANGEBYSCORE z 4 2",
        "ZRANGEBYSCORE z x 2",
        "ZRANGEBYSCORE z ( 2",
        "ZRANGEBYSCORE z 1 2 REV",
        "ZRANGEBYSCORE z 1 2 LIMIT 1",
        "ZREVRANGEBYSCORE z 4 2",
        "ZREVRANGEBYSCORE z +inf -inf WITHSCORES LIMIT 1 2",
        "ZREVRANGEBYSCORE z (4 (1",
        "ZRANGE z 2 4 BYSCORE",
        "ZRANGE z 4 2 BYSCORE REV",
        "ZRANGE z 4 2 BYSCORE REV LIMIT 1 1 WITHSCORES",
        "ZRANGE z (1 +inf BYSCORE LIMIT 1 10",
        "ZRANGE z 1 2 BYSCORE BYLEX",
        "ZCOUNT z 2 4",
        "ZCOUNT z (2 4",
        "ZCOUNT z -inf +inf",
        "ZCOUNT z 4 2",
        "ZCOUNT z a b",
        "ZCOUNT nokey 1 2",
    ],
    &[
        "ZADD l 0 a 0 b 0 c 0 d 0 e 0 f",
        "ZRANGEBYLEX l - +",
        "ZRANGEBYLEX l [b [d",
        "ZRANGEBYLEX l (b (d",
        "ZRANGEBYLEX l (b + LIMIT 1 2",
        "ZRANGEBYLEX l + -",
        "ZRANGEBYLEX l b d",
        "ZRANGEBYLEX l [b d",
        "ZRANGEBYLEX l -x +",
        "ZRANGEBYLEX l - + WITHSCORES",
        "ZREVRANGEBYLEX l + -",
        "ZREVRANGEBYLEX l [d (a LIMIT 1 5",
        "ZRANGE l [b [e BYLEX",
        "ZRANGE l [e [b BYLEX REV",
        "ZRANGE l - + BYLEX WITHSCORES",
        "ZLEXCOUNT l - +",
        "ZLEXCOUNT l [b (e",
        "ZLEXCOUNT l [z -",
        "ZLEXCOUNT l a b",
        "ZLEXCOUNT nokey - +",
        "ZREMRANGEBYLEX l [b (d",
        "ZRANGE l 0 -1",
        "ZREMRANGEBYLEX l x y",
        "ZREMRANGEBYLEX l - +",
        "EXISTS l",
    ],
    &[
        "ZADD z NX 1 a",
        "ZADD z NX 2 a 3 b",
        "ZADD z XX 5 a 6 c",
        "ZRANGE z 0 -1 WITHSCORES",
        "ZADD z CH 5 a 7 b 8 d",
        "ZADD z GT 4 a 9 b",
        "ZADD z LT CH 4 a 9 b 1 e",
        "ZADD z GT CH 100 a",
        "ZRANGE z 0 -1 WITHSCORES",
        "ZADD z INCR 2.5 a",
        "ZADD z INCR 2.5 new",
        "ZADD z NX INCR 2.5 a",
        "ZADD z XX INCR 1 nope",
        "ZADD z GT INCR -1 a",
        "ZADD z INCR 1 a 2 b",
        "ZADD z NX XX 1 a",
        "ZADD z GT LT 1 a",
        "ZADD z GT NX 1 a",
        "ZADD z 1",
        "ZADD z 1 a 2",
        "ZADD z x a",
        "ZADD z nan a",
        "ZADD z XX 1 a 2",
        "ZADD nokey XX 1 a",
        "ZADD nokey XX INCR 1 a",
        "EXISTS nokey",
        "ZADD z inf big",
        "ZADD z INCR -inf big",
        "ZINCRBY z 1.1 a",
        "ZINCRBY z 1e17 a",
        "ZINCRBY z -0.00001 b",
        "ZINCRBY z x a",
        "ZINCRBY z 1 brandnew",
        "ZINCRBY z +inf big",
        "ZINCRBY z -inf big",
        "ZRANGE z 0 -1 WITHSCORES",
        "ZADD z 0 zero -0 negzero 3.0000000000000001 near 0.1 tenth 1e-300 tiny 12345678901234567890 huge",
        "ZRANGE z 0 -1 WITHSCORES",
        "ZSCORE z negzero",
        "? ZSCAN z 0",
        "? ZSCAN z 0 MATCH t* COUNT 100",
        "ZSCAN z x",
    ],
    &[
        "ZADD z 1 a 2 b 3 c 4 d 5 e 6 f",
        "ZREM z a nope b",
        "ZREM z nope",
        "ZREM nokey a",
        "ZCARD z",
        "ZREMRANGEBYRANK z 0 0",
        "ZREMRANGEBYRANK z -1 -1",
        "ZREMRANGEBYRANK z 5 9",
        "ZREMRANGEBYRANK z x 1",
        "ZRANGE z 0 -1",
        "ZREMRANGEBYSCORE z (3 4",
        "ZREMRANGEBYSCORE z x 4",
        "ZRANGE z 0 -1",
        "ZREM z c e",
        "EXISTS z",
        "ZADD p 1 a 2 b 3 c 4 d",
        "ZPOPMIN p",
        "ZPOPMAX p",
        "ZPOPMIN p 0",
        "ZPOPMIN p -1",
        "ZPOPMIN p x",
        "ZPOPMIN p 1 2",
        "ZPOPMAX p 5",
        "ZPOPMAX p",
        "ZPOPMIN p 2",
        "EXISTS p",
        "ZCARD nokey",
        "ZRANDMEMBER nokey",
        "ZRANDMEMBER nokey 3",
        "ZADD r 1 a",
        "ZRANDMEMBER r",
        "ZRANDMEMBER r 5 WITHSCORES",
        "ZRANDMEMBER r -2",
        "ZRANDMEMBER r 0",
        "ZRANDMEMBER r 1 bogus",
        "ZADD r2 1 a 2 b 3 c 4 d",
        "? ZRANDMEMBER r2 2",
        "? ZRANDMEMBER r2 3 WITHSCORES",
        "@ ZRANDMEMBER r2 4",
        "@ ZRANDMEMBER r2 9",
        "? ZRANDMEMBER r2 -7",
    ],
    &[
        "ZADD a 1 x 2 y 3 z",
        "ZADD b 10 y 20 z 30 w",
        "SADD c x w q",
        "ZUNION 2 a b",
        "ZUNION 2 a b WITHSCORES",
        "ZUNION 3 a b c WITHSCORES",
        "ZUNION 2 a b WEIGHTS 2 0.5 WITHSCORES",
        "ZUNION 2 a b AGGREGATE MIN WITHSCORES",
        "ZUNION 2 a b AGGREGATE max WITHSCORES",
        "ZUNION 2 a b AGGREGATE avg",
        "ZUNION 2 a b WEIGHTS 1",
        "ZUNION 2 a b WEIGHTS 1 x",
        "ZUNION 0 a",
        "ZUNION 3 a b",
        "ZUNION x a",
        "ZUNION 2 a nokey WITHSCORES",
        "ZINTER 2 a b WITHSCORES",
        "ZINTER 3 a b c",
        "ZINTER 2 a nokey",
        "ZINTER 2 a b WEIGHTS 1 -1 AGGREGATE SUM WITHSCORES",
        "ZDIFF 2 a b WITHSCORES",
        "ZDIFF 3 b a c",
        "ZDIFF 2 a b WEIGHTS 1 1",
        "ZDIFF 1 nokey",
        "ZADD inf1 inf m",
        "ZADD inf2 -inf m",
        "ZUNION 2 inf1 inf2 WITHSCORES",
        "ZUNION 2 inf1 inf2 WEIGHTS 0 1 WITHSCORES",
        "ZUNIONSTORE d 2 a b",
        "ZRANGE d 0 -1 WITHSCORES",
        "ZINTERSTORE d 2 a b AGGREGATE MAX",
        "ZRANGE d 0 -1 WITHSCORES",
        "ZDIFFSTORE d 2 a b",
        "ZRANGE d 0 -1 WITHSCORES",
        "ZINTERSTORE d 2 a nokey",
        "EXISTS d",
        "ZUNIONSTORE d 2 a b WITHSCORES",
        "ZUNIONSTORE d 0 a",
        "SET str v",
        "ZUNION 2 a str",
        "ZUNIONSTORE str 1 a",
        "TYPE str",
    ],
    &[
        "SET s v",
        "ZADD s 1 a",
        "ZADD s x a",
        "ZSCORE s a",
        "ZRANGE s 0 -1",
        "ZRANGEBYSCORE s x y",
        "ZRANGEBYSCORE s 1 2",
        "ZREM s a",
        "ZCARD s",
        "ZINCRBY s 1 a",
        "ZPOPMIN s",
        "ZPOPMIN s 0",
        "ZRANK s a",
        "ZSCAN s 0",
        "ZADD z 1 a",
        "GET z",
        "LPUSH z a",
        "SADD z a",
        "HSET z a b",
        "TYPE z",
        "OBJECT ENCODING z",
        "EXPIRE z 100",
        "~2 TTL z",
        "RENAME z z2",
        "ZRANGE z2 0 -1 WITHSCORES",
        "COPY z2 z3",
        "ZRANGE z3 0 -1 WITHSCORES",
        "DEL z2 z3",
        "DBSIZE",
    ],
];

#[test]
fn zsets_match_redis() {
    let Some(mut p) = Pair::start("zsets_match_redis") else {
        return;
    };
    p.cases(CASES);
    for l in [
        "ZADD s 1 a 2.5 b 1e17 c -0 d",
        "ZSCAN s 0",
        "ZSCAN s 0 MATCH a* COUNT 1",
        "OBJECT ENCODING z",
        "ZADD z 1 a",
        "OBJECT ENCODING z",
    ] {
        p.check(&step(l), "encoding");
    }
    // The same lines on large zsets.
    p.check(&step("CONFIG SET zset-max-listpack-entries 1"), "config");
    p.cases(CASES);
    p.check(&step("FLUSHALL"), "flush");
    for l in [
        "ZADD z 1 a 2 b",
        "OBJECT ENCODING z",
        "CONFIG SET zset-max-listpack-entries 128",
        "ZADD y 1 a",
        "ZADD y 2 bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
        "OBJECT ENCODING y",
    ] {
        p.check(&step(l), "encoding");
    }
}

#[test]
fn zsets_resp3_match_redis() {
    let Some(mut p) = Pair::start("zsets_resp3_match_redis") else {
        return;
    };
    let hello = step("HELLO 3");
    p.ours.run(&hello.args);
    p.theirs.run(&hello.args);
    p.cases(&[&[
        "ZADD z 1.5 a 2 b inf c",
        "ZSCORE z a",
        "ZSCORE z c",
        "ZSCORE z nope",
        "ZMSCORE z a nope",
        "ZRANGE z 0 -1 WITHSCORES",
        "ZRANGEBYSCORE z -inf +inf WITHSCORES LIMIT 0 2",
        "ZINCRBY z 1 a",
        "ZADD z INCR 1 b",
        "ZADD z NX INCR 1 b",
        "ZPOPMIN z",
        "ZPOPMAX z 2",
        "ZPOPMIN z",
        "ZPOPMIN z 1",
        "ZADD r 1 a",
        "ZRANDMEMBER r 1 WITHSCORES",
    ]]);
}

#[test]
fn large_zset_matches_redis() {
    let Some(mut p) = Pair::start("large_zset_matches_redis") else {
        return;
    };
    for i in 0..1500 {
        p.check(
            &step(&format!(
                "ZADD z {} m{i} {} n{i}",
                i % 97,
                f64::from(i) / 8.0
            )),
            "fill",
        );
    }
    for l in [
        "ZCARD z",
        "OBJECT ENCODING z",
        "ZSCORE z m1234",
        "ZRANK z m1234",
        "ZREVRANK z n7",
        "ZRANGE z 1490 1510 WITHSCORES",
        "ZRANGE z -70 -60",
        "ZREVRANGE z 10 20 WITHSCORES",
        "ZRANGEBYSCORE z 50 (51 LIMIT 3 7",
        "ZREVRANGEBYSCORE z (60 50 WITHSCORES LIMIT 100 5",
        "ZCOUNT z 10 20",
        "ZCOUNT z (10 (20",
        "ZLEXCOUNT z - +",
        "ZINCRBY z 1000 m5",
        "ZRANK z m5",
        "ZADD z XX CH GT 0 m6 9999 m7",
        "ZREM z m1 m2 m3 n1 nope",
        "ZREMRANGEBYRANK z 100 199",
        "ZREMRANGEBYSCORE z 30 (40",
        "ZCARD z",
        "ZPOPMIN z 5",
        "ZPOPMAX z 5",
        "ZRANGE z 500 520 WITHSCORES",
        "COPY z z2",
        "ZRANGE z2 700 710 WITHSCORES",
        "RENAME z2 z3",
        "ZCARD z3",
        "ZREMRANGEBYRANK z3 0 -1",
        "EXISTS z3",
        "DEL z",
        "DBSIZE",
    ] {
        p.check(&step(l), "large");
    }
}

#[test]
fn zsets_random_sequences_match_redis() {
    let Some(p) = Pair::start("zsets_random_sequences_match_redis") else {
        return;
    };
    let keys = ["a", "b"];
    let cmd = (0usize..14, 0usize..2, -40i64..40, 0usize..5);
    let mut runner = sequence_runner();
    let p = std::cell::RefCell::new(p);
    runner
        .run(&proptest::collection::vec(cmd, 1..120), |seq| {
            let mut p = p.borrow_mut();
            p.check(&step("FLUSHALL"), "flush");
            for (op, k, n, e) in seq {
                let k = keys[k];
                let e = ["a", "b", "c", "d", "e"][e];
                let many: Vec<String> = (0..n.unsigned_abs() % 90 + 1)
                    .map(|i| format!("{} {e}{i}", (i as i64 * n) % 7))
                    .collect();
                let line = match op {
                    0..=2 => format!("ZADD {k} {}", many.join(" ")),
                    3 => format!("ZADD {k} GT CH {n} {e}1 {} {e}2", n / 2),
                    4 => format!("ZINCRBY {k} {n} {e}{}", n.abs() % 9),
                    5 => format!("ZREM {k} {e}{} {e}{}", n.abs(), n.abs() + 1),
                    6 => format!("ZRANGE {k} {n} {} WITHSCORES", n + 30),
                    7 => format!("ZRANGEBYSCORE {k} ({} {} LIMIT 2 20", n % 5, n % 5 + 3),
                    8 => format!("ZRANK {k} {e}{}", n.abs()),
                    9 => format!("ZPOPMIN {k} {}", n.abs() % 30),
                    10 => format!("ZREMRANGEBYRANK {k} {n} {}", n + 10),
                    11 => format!("ZCOUNT {k} {} (+inf", n % 6),
                    12 => format!("ZREVRANGEBYSCORE {k} {} -inf WITHSCORES LIMIT 1 9", n % 6),
                    _ => format!("ZREVRANGE {k} 0 {} WITHSCORES", n.abs()),
                };
                let s = step(&line);
                let (a, b) = (p.ours.run(&s.args), p.theirs.run(&s.args));
                if !agree(Cmp::Exact, &a, &b) {
                    return Err(TestCaseError::fail(format!(
                        "{line}\n  nibble: {a:?}\n  redis:  {b:?}"
                    )));
                }
            }
            for k in keys {
                let s = step(&format!("ZRANGE {k} 0 -1 WITHSCORES"));
                let (a, b) = (p.ours.run(&s.args), p.theirs.run(&s.args));
                if a != b {
                    return Err(TestCaseError::fail(format!("final {k} differs")));
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn zrangestore_and_zintercard_match_redis() {
    let Some(mut p) = Pair::start("zrangestore_and_zintercard_match_redis") else {
        return;
    };
    p.cases(&[
        &[
            "ZADD z 1 a 2 b 3 c 4 d",
            "ZADD y 2 b 3 c 4 d 5 e",
            "SADD s b c x",
            "SET str v",
            "ZINTERCARD 0 z",
            "ZINTERCARD -1 z",
            "ZINTERCARD x z",
            "ZINTERCARD 3 z y",
            "ZINTERCARD 2 z y",
            "ZINTERCARD 2 z s",
            "ZINTERCARD 3 z y s",
            "ZINTERCARD 2 z y LIMIT 1",
            "ZINTERCARD 2 z y limit 0",
            "ZINTERCARD 2 z y LIMIT 100",
            "ZINTERCARD 2 z y LIMIT -1",
            "ZINTERCARD 2 z y LIMIT x",
            "ZINTERCARD 2 z y LIMIT",
            "ZINTERCARD 2 z y WEIGHTS 1 2",
            "ZINTERCARD 1 str",
            "ZINTERCARD 1 str LIMIT x",
            "ZINTERCARD 2 z nokey",
            "ZINTERCARD 1 z",
            "ZINTERCARD",
        ],
        &[
            "ZADD z 1 a 2 b 3 c 4 d",
            "SADD s a",
            "SET str v",
            "ZRANGESTORE d z 0 -1",
            "ZRANGE d 0 -1 WITHSCORES",
            "ZRANGESTORE d z 0 -1 WITHSCORES",
            "ZRANGESTORE d z (1 +inf BYSCORE LIMIT 0 2",
            "ZRANGE d 0 -1 WITHSCORES",
            "ZRANGESTORE d z +inf -inf BYSCORE REV LIMIT 1 2",
            "ZRANGE d 0 -1 WITHSCORES",
            "ZRANGESTORE d z 0 1 LIMIT 0 1",
            "ZRANGESTORE d z [a [b BYLEX",
            "ZRANGE d 0 -1",
            "ZRANGESTORE d z 1 2 REV",
            "ZRANGE d 0 -1",
            "ZRANGESTORE d z x 1",
            "ZRANGESTORE d z 5 6",
            "EXISTS d",
            "ZRANGESTORE d nokey 0 -1",
            "ZRANGESTORE d s 0 -1",
            "ZRANGESTORE str z 0 -1",
            "TYPE str",
            "ZRANGESTORE z z 1 2",
            "ZRANGE z 0 -1 WITHSCORES",
            "ZRANGESTORE d z",
        ],
    ]);
}
