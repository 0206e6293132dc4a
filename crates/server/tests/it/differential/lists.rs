//! Lists against redis-server 7.0: every list command with its errors,
//! lists of many chunks, and random sequences of pushes, pops, sets,
//! trims, removes and inserts on a few keys.

use proptest::test_runner::TestCaseError;

use super::harness::{agree, sequence_runner, step, Cmp, Pair};

#[test]
fn lists_match_redis() {
    let Some(mut p) = Pair::start("lists_match_redis") else {
        return;
    };
    p.cases(&[
        &[
            "RPUSH l a b c",
            "LPUSH l z y",
            "LRANGE l 0 -1",
            "LLEN l",
            "TYPE l",
            "OBJECT ENCODING l",
            "LINDEX l 0",
            "LINDEX l -1",
            "LINDEX l 9",
            "LINDEX l x",
            "LINDEX nokey x",
            "LRANGE l 1 2",
            "LRANGE l -2 -1",
            "LRANGE l 3 1",
            "LRANGE l -100 100",
            "LRANGE l x 1",
            "LRANGE nokey 0 -1",
            "LSET l 1 Y",
            "LSET l -1 C",
            "LSET l 9 q",
            "LSET nokey 0 a",
            "LSET l x a",
            "LRANGE l 0 -1",
            "LPOP l",
            "RPOP l",
            "LPOP l 0",
            "LPOP l 2",
            "RPOP l 9",
            "EXISTS l",
            "LPOP l",
            "LPOP l 2",
            "LPOP l -1",
            "LPOP l x",
            "LPOP l 1 2",
            "LPUSHX l a",
            "RPUSHX l a",
            "EXISTS l",
            "RPUSH l a",
            "LPUSHX l b c",
            "RPUSHX l d",
            "LRANGE l 0 -1",
            "SET s v",
            "LPUSH s a",
            "LPUSHX s a",
            "LPOP s",
            "LRANGE s 0 1",
            "LLEN s",
            "LINDEX s 0",
            "LSET s 0 a",
            "LREM s 0 a",
            "LTRIM s 0 1",
            "LINSERT s BEFORE a b",
            "LPOS s a",
            "LMOVE s l LEFT LEFT",
            "LMOVE l s LEFT LEFT",
            "RPOPLPUSH l s",
            "LMOVE nokey s LEFT LEFT",
            "RPOPLPUSH nokey s",
            "LMOVE s s LEFT LEFT",
            "LMOVE nokey nokey LEFT LEFT",
            "LRANGE l 0 -1",
            "LPUSH",
            "LPUSH l",
            "LINSERT l a",
        ],
        &[
            "RPUSH l a b a c a d",
            "LREM l 2 a",
            "LRANGE l 0 -1",
            "RPUSH l a a",
            "LREM l -1 a",
            "LRANGE l 0 -1",
            "LREM l 0 a",
            "LRANGE l 0 -1",
            "LREM l 0 zz",
            "LREM l x a",
            "LREM nokey 0 a",
            "LINSERT l BEFORE c X",
            "LINSERT l AFTER d Y",
            "LINSERT l after nope Y",
            "LINSERT l middle c Y",
            "LINSERT nokey before a b",
            "LRANGE l 0 -1",
            "LTRIM l 1 -2",
            "LRANGE l 0 -1",
            "LTRIM l 5 10",
            "EXISTS l",
            "LTRIM nokey 0 1",
            "LTRIM l x 1",
            "RPUSH l a b c a b c",
            "LPOS l a",
            "LPOS l a RANK 2",
            "LPOS l a RANK -1",
            "LPOS l a COUNT 0",
            "LPOS l a COUNT 1",
            "LPOS l c RANK -1 COUNT 2",
            "LPOS l c MAXLEN 2",
            "LPOS l c MAXLEN 3",
            "LPOS l z",
            "LPOS l z COUNT 0",
            "LPOS l a RANK 0",
            "LPOS l a COUNT -1",
            "LPOS l a MAXLEN -1",
            "LPOS l a FOO 1",
            "LPOS l a COUNT",
            "LPOS nokey a",
            "LPOS nokey a COUNT 2",
            "LMOVE l m LEFT RIGHT",
            "LMOVE l m RIGHT LEFT",
            "LMOVE l m up LEFT",
            "LRANGE m 0 -1",
            "LMOVE nokey m LEFT LEFT",
            "RPOPLPUSH l l",
            "LRANGE l 0 -1",
            "LMOVE l l LEFT RIGHT",
            "LRANGE l 0 -1",
            "RPOPLPUSH nokey m",
        ],
    ]);
}

#[test]
fn long_lists_match_redis() {
    let Some(mut p) = Pair::start("long_lists_match_redis") else {
        return;
    };
    for i in 0..1500 {
        p.check(&step(&format!("RPUSH l r{i}")), "fill");
        p.check(&step(&format!("LPUSH l l{i}")), "fill");
    }
    for l in [
        "LLEN l",
        "LINDEX l 0",
        "LINDEX l 1499",
        "LINDEX l 1500",
        "LINDEX l -1",
        "LINDEX l 2222",
        "LRANGE l 1490 1510",
        "LRANGE l -70 -60",
        "LSET l 1777 x",
        "LINDEX l 1777",
        "LPOS l r100",
        "LINSERT l BEFORE r700 ins",
        "LINDEX l 2200",
        "LREM l 0 ins",
        "LTRIM l 100 -100",
        "LLEN l",
        "LINDEX l 0",
        "LPOP l 70",
        "RPOP l 70",
        "LLEN l",
        "COPY l l2",
        "LRANGE l2 1000 1010",
        "RENAME l2 l3",
        "LLEN l3",
        "DEL l l3",
        "DBSIZE",
    ] {
        p.check(&step(l), "long");
    }
}

#[test]
fn lists_random_sequences_match_redis() {
    let Some(p) = Pair::start("lists_random_sequences_match_redis") else {
        return;
    };
    let keys = ["a", "b"];
    let cmd = (0usize..12, 0usize..2, -90i64..90, 0usize..5);
    let mut runner = sequence_runner();
    let p = std::cell::RefCell::new(p);
    runner
        .run(&proptest::collection::vec(cmd, 1..120), |seq| {
            let mut p = p.borrow_mut();
            p.check(&step("FLUSHALL"), "flush");
            for (op, k, n, e) in seq {
                let k2 = keys[1 - k];
                let k = keys[k];
                let e = ["a", "b", "c", "d", "e"][e];
                let many: Vec<String> = (0..n.unsigned_abs() % 70 + 1)
                    .map(|i| format!("{e}{i}"))
                    .collect();
                let line = match op {
                    0 | 1 => format!("RPUSH {k} {}", many.join(" ")),
                    2 => format!("LPUSH {k} {}", many.join(" ")),
                    3 => format!("LPOP {k} {}", n.abs() % 40),
                    4 => format!("RPOP {k}"),
                    5 => format!("LINDEX {k} {n}"),
                    6 => format!("LSET {k} {n} {e}"),
                    7 => format!("LRANGE {k} {n} {}", n + 50),
                    8 => format!("LTRIM {k} {} {}", n.abs() % 10, -(n.abs() % 10) - 1),
                    9 => format!("LREM {k} {} {e}0", n % 3),
                    10 => format!("LINSERT {k} BEFORE {e}1 x"),
                    _ => format!("LMOVE {k} {k2} LEFT RIGHT"),
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
                let s = step(&format!("LRANGE {k} 0 -1"));
                let (a, b) = (p.ours.run(&s.args), p.theirs.run(&s.args));
                if a != b {
                    return Err(TestCaseError::fail(format!("final {k} differs")));
                }
            }
            Ok(())
        })
        .unwrap();
}
