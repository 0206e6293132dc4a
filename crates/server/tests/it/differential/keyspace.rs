//! Keyspace, hash and server commands against redis-server: DEL, EXISTS,
//! the EXPIRE family, TTL and EXPIRETIME, TYPE, RENAME, KEYS, SCAN,
//! RANDOMKEY, TOUCH, COPY, OBJECT, DBSIZE, FLUSHALL, the hash commands,
//! CONFIG's encoding tunables, errors included.

use super::harness::Pair;

#[test]
fn keyspace_matches_redis() {
    let Some(mut p) = Pair::start("keyspace_matches_redis") else {
        return;
    };
    p.cases(&[
        &[
            "MSET a 1 b 2 c 3",
            "DEL a nokey a",
            "UNLINK b",
            "EXISTS a b c c nokey",
            "TOUCH a b c c nokey",
            "DBSIZE",
            "DEL",
            "EXISTS",
            "TOUCH",
            "TYPE c",
            "TYPE nokey",
            "HSET h f v",
            "TYPE h",
            "@ KEYS *",
            "@ KEYS [a-",
            "@ KEYS [a-h]",
            "@ KEYS h?",
            "@ KEYS \\h",
            "KEYS",
            "DBSIZE 1",
            "RANDOMKEY x",
            "FLUSHALL",
            "RANDOMKEY",
            "DBSIZE",
            "SET one 1",
            "RANDOMKEY",
            "FLUSHALL ASYNC",
            "FLUSHALL SYNC",
            "FLUSHALL FOO",
            "FLUSHDB",
            "FLUSHDB x y",
            "KEYS *",
            "SCAN 0",
            "SCAN x",
            "SCAN 0 COUNT 0",
            "SCAN 0 COUNT x",
            "SCAN 0 MATCH",
            "SCAN 0 FOO bar",
        ],
        &[
            "SET k v",
            "EXPIRE k 100",
            "~1 TTL k",
            "~1000 PTTL k",
            "EXPIRE k 200 NX",
            "EXPIRE k 200 XX",
            "EXPIRE k 100 GT",
            "EXPIRE k 300 GT",
            "EXPIRE k 400 LT",
            "EXPIRE k 100 LT",
            "~1 TTL k",
            "EXPIRE k 100 NX XX",
            "EXPIRE k 100 GT LT",
            "EXPIRE k 100 FOO",
            "EXPIRE k x",
            "EXPIRE k 9223372036854775807",
            "EXPIRE k -9223372036854775808",
            "PEXPIRE k 9223372036854775807",
            "PERSIST k",
            "PERSIST k",
            "TTL k",
            "EXPIRE k 100 XX",
            "EXPIRE k 100 GT",
            "EXPIRE k 100 LT",
            "PERSIST k",
            "EXPIREAT k 4102444800",
            "EXPIRETIME k",
            "PEXPIRETIME k",
            "PEXPIREAT k 4102444800123",
            "PEXPIRETIME k",
            "EXPIRETIME k",
            "PEXPIREAT k 4102444800999",
            "EXPIRETIME k",
            "EXPIRETIME nokey",
            "PEXPIRETIME nokey",
            "TTL nokey",
            "PTTL nokey",
            "SET p v",
            "EXPIRETIME p",
            "PEXPIRETIME p",
            "EXPIRE nokey 10",
            "EXPIRE k 0",
            "EXISTS k",
            "SET k v",
            "EXPIRE k -5",
            "EXISTS k",
            "SET k v",
            "PEXPIREAT k 1",
            "GET k",
            "SET k v",
            "EXPIREAT k 0",
            "SET k v",
            "PEXPIRE k 0",
            "TTL k",
            "SET m v PXAT 9223372036854775807",
            "PEXPIRETIME m",
            "EXPIRETIME m",
            "~1 TTL m",
            "~1000 PTTL m",
            "EXPIRE m 100 GT",
            "PERSIST m",
            "PEXPIREAT m 9223372036854775807",
            "PEXPIRETIME m",
            "PEXPIREAT m 9223372036854775807 LT",
            "EXPIRE",
            "EXPIRE k",
            "TTL",
            "EXPIRETIME",
        ],
        &[
            "SET a 1",
            "EXPIRE a 100",
            "RENAME a b",
            "GET b",
            "~1 TTL b",
            "EXISTS a",
            "RENAME a b",
            "RENAME b b",
            "RENAMENX b b",
            "SET c 3",
            "RENAMENX b c",
            "RENAMENX b d",
            "GET d",
            "RENAMENX nokey x",
            "HSET h f v",
            "RENAME h hh",
            "HGET hh f",
            "RENAME",
        ],
        &[
            "SET a hello",
            "EXPIRE a 100",
            "COPY a b",
            "GET b",
            "~1 TTL b",
            "COPY a b",
            "COPY a b REPLACE",
            "COPY a a",
            "COPY nokey b",
            "COPY a b DB 0 REPLACE",
            "COPY a b DB x",
            "COPY a b DB 99999999999",
            "COPY a b DB -1",
            "COPY a b DB",
            "COPY a b FOO",
            "HSET h f v",
            "COPY h h2",
            "HGETALL h2",
            "TYPE h2",
            "COPY",
            "COPY a",
        ],
        &[
            "SET i 123",
            "SET n -5",
            "SET big 12345678901234567890",
            "SET e embedded",
            "SET r 123456789012345678901234567890123456789012345",
            "SET z 00",
            "OBJECT ENCODING i",
            "OBJECT ENCODING n",
            "OBJECT ENCODING big",
            "OBJECT ENCODING e",
            "OBJECT ENCODING r",
            "OBJECT ENCODING z",
            "OBJECT ENCODING nokey",
            "OBJECT REFCOUNT i",
            "OBJECT REFCOUNT n",
            "OBJECT REFCOUNT e",
            "OBJECT REFCOUNT nokey",
            "SET i 9999",
            "OBJECT REFCOUNT i",
            "SET i 10000",
            "OBJECT REFCOUNT i",
            "~2 OBJECT IDLETIME i",
            "OBJECT IDLETIME nokey",
            "OBJECT FREQ i",
            "OBJECT FREQ nokey",
            "OBJECT HELP",
            "OBJECT HELP x",
            "OBJECT",
            "OBJECT FOO",
            "OBJECT FOO k",
            "OBJECT ENCODING",
            "OBJECT ENCODING a b",
            "HSET h f v",
            "OBJECT ENCODING h",
            "OBJECT REFCOUNT h",
            "CONFIG SET hash-max-listpack-entries 1",
            "HSET h2 a 1 b 2",
            "OBJECT ENCODING h2",
            "CONFIG SET hash-max-listpack-entries 512",
        ],
        &[
            "HSET h a 1 b 2",
            "HSET h a 3",
            "HMSET h c 4",
            "HSETNX h c 5",
            "HSETNX h d 5",
            "HGET h a",
            "HGET h nofield",
            "HGET nokey a",
            "HMGET h a b nofield",
            "HMGET nokey a",
            "HGETALL h",
            "HKEYS h",
            "HVALS h",
            "HLEN h",
            "HLEN nokey",
            "HEXISTS h a",
            "HEXISTS h z",
            "HSTRLEN h a",
            "HSTRLEN h z",
            "HDEL h a z",
            "HDEL h b c d",
            "EXISTS h",
            "HINCRBY h n 5",
            "HINCRBY h n -10",
            "HINCRBY h n x",
            "HINCRBY h n 9223372036854775807",
            "HSET h s abc",
            "HINCRBY h s 1",
            "HINCRBYFLOAT h s 1",
            "HINCRBYFLOAT h f 0.1",
            "HINCRBYFLOAT h f 0.2",
            "HINCRBYFLOAT h f +inf",
            "HINCRBYFLOAT h f nan",
            "HINCRBYFLOAT h f x",
            "HINCRBYFLOAT h f 1e308",
            "HINCRBYFLOAT h f 1e308",
            "HINCRBYFLOAT h n 1.5",
            "SET str v",
            "HSET str f v",
            "HGET str f",
            "HGETALL str",
            "HINCRBYFLOAT str f 1",
            "HINCRBYFLOAT str f +inf",
            "HSET h a",
            "HMSET h a",
            "HSET h",
            "HGETALL",
        ],
        &[
            "PING",
            "PING hello",
            "PING a b",
            "ECHO hi",
            "ECHO",
            "SELECT 0",
            "SELECT x",
            "? TIME",
            "NOSUCHCOMMAND a b",
            "CONFIG SET hash-max-ziplist-entries 100",
            "@ CONFIG GET hash-max-*",
            "CONFIG SET hash-max-ziplist-value x",
            "CONFIG SET list-compress-depth -1",
            "CONFIG SET list-max-ziplist-size -5",
            "@ CONFIG GET list-max-*",
            "CONFIG SET zset-max-ziplist-entries 64",
            "@ CONFIG GET zset-max-*",
            "CONFIG SET set-max-intset-entries 100",
            "@ CONFIG GET set-max-intset-entries",
            "CONFIG GET appendonly",
            "CONFIG SET appendonly maybe",
            "CONFIG SET hash-max-listpack-entries 512",
            "CONFIG SET hash-max-listpack-value 64",
            "CONFIG SET list-max-listpack-size -2",
            "CONFIG SET list-compress-depth 0",
            "CONFIG SET zset-max-listpack-entries 128",
            "CONFIG SET set-max-intset-entries 512",
            "CLIENT LIST ID -1",
            "CLIENT LIST ID 0 99999",
            "CLIENT LIST ID abc",
            "CLIENT LIST ID 18446744073709551615",
            "CLIENT LIST ID",
            "CLIENT LIST TYPE pubsub",
            "CLIENT LIST TYPE master",
            "CLIENT LIST TYPE foo",
            "CLIENT LIST foo",
            "CLIENT LIST TYPE",
        ],
    ]);
}

/// Expired keys are never counted or returned, and FLUSHALL removes them.
#[test]
fn expired_keys_are_gone_everywhere() {
    let Some(mut p) = Pair::start("expired_keys_are_gone_everywhere") else {
        return;
    };
    for line in ["PSETEX a 30 v", "PSETEX b 30 v", "SET c v"] {
        p.check(&super::harness::step(line), "setup");
    }
    std::thread::sleep(std::time::Duration::from_millis(80));
    // Redis deletes an expired key when a command touches it; these
    // commands touch each key, so both servers agree from here on.
    p.cases(&[&["PSETEX a 30 v", "PSETEX b 30 v", "SET c v"]]);
    std::thread::sleep(std::time::Duration::from_millis(80));
    let ours = &mut p.ours;
    for (cmd, want) in [
        (vec!["DBSIZE"], crate::common::V::Int(1)),
        (vec!["EXISTS", "a", "b", "c"], crate::common::V::Int(1)),
        (vec!["RANDOMKEY"], crate::common::bulk("c")),
        (
            vec!["KEYS", "*"],
            crate::common::V::Array(vec![crate::common::bulk("c")]),
        ),
        (vec!["FLUSHALL"], crate::common::V::Simple("OK".into())),
        (vec!["DBSIZE"], crate::common::V::Int(0)),
    ] {
        let args: Vec<Vec<u8>> = cmd.iter().map(|s| s.as_bytes().to_vec()).collect();
        assert_eq!(ours.run(&args), want, "{cmd:?}");
    }
    assert_eq!(p.ours_indexed(), 0, "FLUSHALL left expired items indexed");
    let ours = &mut p.ours;
    let info = ours.run(&[b"INFO".to_vec(), b"keyspace".to_vec()]);
    assert_eq!(
        info,
        crate::common::V::Bulk(b"# Keyspace\r\n\r\n".to_vec()),
        "INFO keyspace after FLUSHALL"
    );
}

/// Every command of the table, called with too few or too many
/// arguments, answers redis-server's arity error.
#[test]
fn every_command_checks_arity_as_redis() {
    let Some(mut p) = Pair::start("every_command_checks_arity_as_redis") else {
        return;
    };
    let mut checked = 0;
    for s in server::commands::COMMANDS {
        // Not sent: SHUTDOWN and QUIT end the session; DEBUG's subcommands
        // are this server's own.
        if matches!(s.name, "shutdown" | "quit" | "debug") {
            continue;
        }
        let name = s.name.to_ascii_uppercase();
        if s.arity > 1 || s.arity < -1 {
            p.check(&super::harness::step(&name), s.name);
            checked += 1;
        }
        if s.arity > 0 {
            let mut line = name.clone();
            for _ in 0..s.arity {
                line.push_str(" x");
            }
            p.check(&super::harness::step(&line), s.name);
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} arity checks");
}

/// Malformed lengths get redis-server's protocol error (then the
/// connection closes on both).
#[test]
fn protocol_errors_match_redis() {
    let Some(mut p) = Pair::start("protocol_errors_match_redis") else {
        return;
    };
    for input in [
        &b"*1\r\n$04\r\nPING\r\n"[..],
        b"*1\r\n$-0\r\nPING\r\n",
        b"*1\r\n$+4\r\nPING\r\n",
        b"*01\r\n$4\r\nPING\r\n",
        b"*1\r\n$x\r\nPING\r\n",
    ] {
        let mut ours = super::harness::Conn::new(p.ours_port());
        let mut theirs = super::harness::Conn::new(p.theirs_port());
        ours.0.send(input);
        theirs.0.send(input);
        assert_eq!(
            ours.0.read(),
            theirs.0.read(),
            "{}",
            String::from_utf8_lossy(input)
        );
    }
    // The pair's own connections still work.
    p.check(&super::harness::step("PING"), "after");
}

/// INFO carries the CPU section (getrusage) and `rejected_calls`, and
/// CLIENT LIST reports the query buffer of the connection.
#[test]
fn info_cpu_rejected_calls_and_qbuf() {
    let s = crate::common::start();
    let mut r = crate::common::Resp::new(s.resp_port().unwrap());
    let text = |v: crate::common::V| match v {
        crate::common::V::Bulk(b) => String::from_utf8(b).unwrap(),
        v => panic!("{v:?}"),
    };
    for section in ["all", "everything", "cpu"] {
        let info = text(r.cmd(&["INFO", section]));
        for f in [
            "used_cpu_sys",
            "used_cpu_user",
            "used_cpu_sys_children",
            "used_cpu_user_children",
        ] {
            let v: f64 = info
                .lines()
                .find_map(|l| l.strip_prefix(f)?.strip_prefix(':'))
                .unwrap_or_else(|| panic!("no {f} in INFO {section}"))
                .parse()
                .unwrap();
            assert!(v >= 0.0);
        }
    }
    let before = crate::common::info_u64(&text(r.cmd(&["INFO", "stats"])), "rejected_calls");
    r.cmd(&["NOSUCHCOMMAND"]);
    r.cmd(&["GET"]);
    let after = crate::common::info_u64(&text(r.cmd(&["INFO", "stats"])), "rejected_calls");
    assert_eq!(after, before + 2);
    let list = text(r.cmd(&["CLIENT", "LIST"]));
    let field = |name: &str| -> u64 {
        list.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .unwrap()
            .parse()
            .unwrap()
    };
    // The request being served is still in the buffer when it runs.
    assert!(field("qbuf") > 0, "{list}");
    assert!(field("qbuf-free") > 0, "{list}");
}
