//! Hash commands and the connection/server commands.

use std::collections::HashMap;

use crate::common::{client, err, info_u64, q, start, start_with};

#[test]
fn hashes() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(q::<i64>(&mut c, &["HSET", "h", "a", "1", "b", "2"]), 2);
    assert_eq!(q::<i64>(&mut c, &["HSET", "h", "a", "10", "c", "3"]), 1);
    assert_eq!(q::<String>(&mut c, &["HGET", "h", "a"]), "10");
    assert_eq!(q::<Option<String>>(&mut c, &["HGET", "h", "zz"]), None);
    assert_eq!(q::<Option<String>>(&mut c, &["HGET", "nokey", "a"]), None);
    assert_eq!(q::<String>(&mut c, &["HMSET", "h", "d", "4"]), "OK");
    assert_eq!(
        q::<Vec<Option<String>>>(&mut c, &["HMGET", "h", "a", "x", "d"]),
        vec![Some("10".into()), None, Some("4".into())]
    );
    let all: HashMap<String, String> = q(&mut c, &["HGETALL", "h"]);
    assert_eq!(all.len(), 4);
    assert_eq!(all["c"], "3");
    assert_eq!(q::<i64>(&mut c, &["HLEN", "h"]), 4);
    assert_eq!(
        q::<Vec<String>>(&mut c, &["HKEYS", "h"]),
        vec!["a", "b", "c", "d"]
    );
    assert_eq!(
        q::<Vec<String>>(&mut c, &["HVALS", "h"]),
        vec!["10", "2", "3", "4"]
    );
    assert_eq!(q::<i64>(&mut c, &["HEXISTS", "h", "a"]), 1);
    assert_eq!(q::<i64>(&mut c, &["HEXISTS", "h", "q"]), 0);
    assert_eq!(q::<i64>(&mut c, &["HSTRLEN", "h", "a"]), 2);
    assert_eq!(q::<i64>(&mut c, &["HSETNX", "h", "a", "x"]), 0);
    assert_eq!(q::<i64>(&mut c, &["HSETNX", "h", "e", "5"]), 1);
    assert_eq!(q::<i64>(&mut c, &["HINCRBY", "h", "a", "5"]), 15);
    assert_eq!(q::<i64>(&mut c, &["HINCRBY", "h", "new", "-3"]), -3);
    assert_eq!(
        q::<String>(&mut c, &["HINCRBYFLOAT", "h", "fl", "1.5"]),
        "1.5"
    );
    q::<i64>(&mut c, &["HSET", "h", "txt", "abc"]);
    assert_eq!(
        err(&mut c, &["HINCRBY", "h", "txt", "1"]),
        "ERR hash value is not an integer"
    );
    assert_eq!(
        err(&mut c, &["HINCRBY", "h", "a", "x"]),
        "ERR value is not an integer or out of range"
    );
    assert_eq!(q::<i64>(&mut c, &["HDEL", "h", "a", "b", "nope"]), 2);
    assert_eq!(
        err(&mut c, &["HSET", "h", "a"]),
        "ERR wrong number of arguments for 'hset' command"
    );
    // Deleting every field deletes the key.
    q::<i64>(&mut c, &["HSET", "small", "f", "v"]);
    assert_eq!(q::<i64>(&mut c, &["HDEL", "small", "f"]), 1);
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "small"]), 0);
    assert_eq!(q::<i64>(&mut c, &["HLEN", "small"]), 0);
    assert!(q::<HashMap<String, String>>(&mut c, &["HGETALL", "small"]).is_empty());
    // Wrong type both ways.
    q::<String>(&mut c, &["SET", "str", "v"]);
    for args in [
        &["HSET", "str", "f", "v"][..],
        &["HGET", "str", "f"],
        &["HGETALL", "str"],
        &["HDEL", "str", "f"],
        &["HLEN", "str"],
        &["HINCRBY", "str", "f", "1"],
    ] {
        assert_eq!(
            err(&mut c, args),
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "{args:?}"
        );
    }
    // SET overwrites a hash, like Redis.
    assert_eq!(q::<String>(&mut c, &["SET", "h", "now-a-string"]), "OK");
    assert_eq!(q::<String>(&mut c, &["TYPE", "h"]), "string");
}

#[test]
fn info_sections() {
    let s = start();
    let mut c = client(&s);
    q::<String>(&mut c, &["SET", "a", "1"]);
    q::<String>(&mut c, &["GET", "a"]);
    let info: String = q(&mut c, &["INFO"]);
    for f in [
        "# Server",
        "redis_version:",
        "tcp_port:",
        "# Clients",
        "connected_clients:",
        "# Memory",
        "used_memory:",
        "used_memory_rss:",
        "mem_fragmentation_ratio:",
        "maxmemory:33554432",
        "# Stats",
        "total_commands_processed:",
        "keyspace_hits:",
        "# Keyspace",
        "db0:keys=1",
    ] {
        assert!(info.contains(f), "INFO lacks {f}:\n{info}");
    }
    let rss = info_u64(&info, "used_memory_rss");
    assert!(rss > 1 << 20, "RSS {rss} is real");
    let mem: String = q(&mut c, &["INFO", "memory"]);
    assert!(mem.contains("used_memory:") && !mem.contains("# Server"));
    let ks: String = q(&mut c, &["INFO", "keyspace"]);
    assert!(ks.contains("db0:keys=1"));
}

/// INFO memory shows how much free log memory is resident, how much went
/// back to the OS, and what a compaction worker mapped in ahead of the
/// log: after a quiet moment the idle release gives the free blocks back,
/// and the writes that follow ask for a region mapped ahead.
#[test]
fn info_memory_reports_resident_released_and_mapped_ahead_blocks() {
    let s = start_with(|c| c.memory_decay_ms = 50);
    let mut c = client(&s);
    let field = |c: &mut redis::Connection, f: &str| {
        let mem: String = q(c, &["INFO", "memory"]);
        assert!(mem.contains(&format!("{f}:")), "INFO lacks {f}:\n{mem}");
        info_u64(&mem, f)
    };
    let wait_for = |c: &mut redis::Connection, what: &str, f: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while field(c, f) == 0 {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    q::<String>(&mut c, &["SET", "a", "1"]);
    field(&mut c, "nibble_blocks_free_resident");
    wait_for(&mut c, "no idle release", "nibble_blocks_released");
    // 3 MiB of writes after the release: whichever CPU's log head takes
    // them, its warm cache runs below half a region on the way.
    let value = "v".repeat(64 << 10);
    for k in 0..48 {
        q::<String>(&mut c, &["SET", &format!("big:{k}"), &value]);
    }
    wait_for(
        &mut c,
        "nothing mapped ahead after the idle release",
        "nibble_blocks_mapped_ahead",
    );
}

#[test]
fn config_get_set() {
    let s = start();
    let mut c = client(&s);
    let m: HashMap<String, String> = q(&mut c, &["CONFIG", "GET", "maxmemory"]);
    assert_eq!(m["maxmemory"], (32u64 << 20).to_string());
    let m: HashMap<String, String> = q(&mut c, &["CONFIG", "GET", "max*"]);
    assert!(m.contains_key("maxclients") && m.contains_key("maxmemory"));
    let m: HashMap<String, String> = q(&mut c, &["CONFIG", "GET", "save", "appendonly"]);
    assert_eq!(m.len(), 2);
    assert_eq!(
        q::<String>(&mut c, &["CONFIG", "SET", "maxclients", "50"]),
        "OK"
    );
    let m: HashMap<String, String> = q(&mut c, &["CONFIG", "GET", "maxclients"]);
    assert_eq!(m["maxclients"], "50");
    assert_eq!(
        q::<String>(
            &mut c,
            &["CONFIG", "SET", "timeout", "0", "proto-max-bulk-len", "2mb"]
        ),
        "OK"
    );
    let m: HashMap<String, String> = q(&mut c, &["CONFIG", "GET", "proto-max-bulk-len"]);
    assert_eq!(m["proto-max-bulk-len"], (2u64 << 20).to_string());
    assert!(err(&mut c, &["CONFIG", "SET", "nosuch", "1"]).starts_with("ERR Unknown option"));
    assert!(err(&mut c, &["CONFIG", "SET", "maxclients", "x"]).starts_with("ERR CONFIG SET failed"));
    assert_eq!(q::<String>(&mut c, &["CONFIG", "RESETSTAT"]), "OK");
    assert!(err(&mut c, &["CONFIG", "BOGUS"]).starts_with("ERR unknown subcommand"));
}

#[test]
fn client_and_command() {
    let s = start();
    let mut c = client(&s);
    let id: i64 = q(&mut c, &["CLIENT", "ID"]);
    assert!(id > 0);
    assert_eq!(q::<Option<String>>(&mut c, &["CLIENT", "GETNAME"]), None);
    assert_eq!(q::<String>(&mut c, &["CLIENT", "SETNAME", "tester"]), "OK");
    assert_eq!(q::<String>(&mut c, &["CLIENT", "GETNAME"]), "tester");
    assert!(err(&mut c, &["CLIENT", "SETNAME", "a b"]).starts_with("ERR Client names"));
    assert_eq!(
        q::<String>(&mut c, &["CLIENT", "SETINFO", "lib-name", "mylib"]),
        "OK"
    );
    assert_eq!(
        q::<String>(&mut c, &["CLIENT", "SETINFO", "lib-ver", "1.0"]),
        "OK"
    );
    let list: String = q(&mut c, &["CLIENT", "LIST"]);
    let mine = list
        .lines()
        .find(|l| l.starts_with(&format!("id={id} ")))
        .unwrap();
    assert!(
        mine.contains("name=tester")
            && mine.contains("lib-name=mylib")
            && mine.contains("lib-ver=1.0")
    );
    let me: String = q(&mut c, &["CLIENT", "INFO"]);
    assert!(me.contains("name=tester"));
    assert!(err(&mut c, &["CLIENT", "KILL", "x"]).starts_with("ERR unknown subcommand"));
    let n: i64 = q(&mut c, &["COMMAND", "COUNT"]);
    assert_eq!(n as usize, server::commands::COMMANDS.len());
    let info: redis::Value = q(&mut c, &["COMMAND", "INFO", "get", "nosuch"]);
    let redis::Value::Array(items) = info else {
        panic!("{info:?}")
    };
    assert_eq!(items.len(), 2);
    assert_eq!(items[1], redis::Value::Nil);
    let redis::Value::Array(get) = &items[0] else {
        panic!()
    };
    assert_eq!(get[1], redis::Value::Int(2));
    let docs: redis::Value = q(&mut c, &["COMMAND", "DOCS", "set"]);
    assert!(format!("{docs:?}").contains("summary"));
    let all: Vec<redis::Value> = q(&mut c, &["COMMAND"]);
    assert_eq!(all.len(), n as usize);
    let list: Vec<String> = q(&mut c, &["COMMAND", "LIST"]);
    assert!(list.contains(&"hincrby".to_string()));
}

#[test]
fn auth_required() {
    let s = start_with(|c| {
        c.requirepass = Some("sekret".into());
        c.memcached_port = None;
    });
    let mut r = crate::common::Resp::new(s.resp_port().unwrap());
    use crate::common::V;
    assert_eq!(
        r.cmd(&["GET", "a"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    assert_eq!(
        r.cmd(&["PING"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    assert!(
        matches!(r.cmd(&["HELLO", "3"]), V::Err(e) if e.starts_with("NOAUTH HELLO must be called"))
    );
    assert_eq!(
        r.cmd(&["AUTH", "wrong"]),
        V::Err("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    assert_eq!(
        r.cmd(&["AUTH", "default", "sekret"]),
        V::Simple("OK".into())
    );
    assert_eq!(r.cmd(&["SET", "a", "1"]), V::Simple("OK".into()));
    // HELLO with AUTH authenticates in one step.
    let mut r2 = crate::common::Resp::new(s.resp_port().unwrap());
    assert!(matches!(
        r2.cmd(&["HELLO", "2", "AUTH", "default", "sekret"]),
        V::Array(_)
    ));
    assert_eq!(r2.cmd(&["GET", "a"]), crate::common::bulk("1"));
    // A password in the URL, through the client crate.
    let url = format!("redis://:sekret@127.0.0.1:{}/", s.resp_port().unwrap());
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    assert_eq!(q::<String>(&mut c, &["GET", "a"]), "1");
    // Without a password configured, AUTH is an error.
    let s2 = start();
    let mut c2 = client(&s2);
    assert!(err(&mut c2, &["AUTH", "x"]).contains("without any password configured"));
}

#[test]
fn flush_populate_dbsize() {
    let s = start();
    let mut c = client(&s);
    assert_eq!(q::<String>(&mut c, &["DEBUG", "POPULATE", "100"]), "OK");
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 100);
    assert_eq!(q::<String>(&mut c, &["GET", "key:7"]), "value:7");
    assert_eq!(
        q::<String>(&mut c, &["DEBUG", "POPULATE", "10", "p", "32"]),
        "OK"
    );
    assert_eq!(q::<i64>(&mut c, &["STRLEN", "p:3"]), 32);
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 110);
    assert!(err(&mut c, &["DEBUG", "SEGFAULT"]).starts_with("ERR DEBUG supports only"));
    assert_eq!(q::<String>(&mut c, &["FLUSHDB"]), "OK");
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 0);
    q::<String>(&mut c, &["SET", "x", "1"]);
    assert_eq!(q::<String>(&mut c, &["FLUSHALL", "ASYNC"]), "OK");
    assert_eq!(q::<Vec<String>>(&mut c, &["KEYS", "*"]).len(), 0);
    assert_eq!(err(&mut c, &["FLUSHALL", "BAD"]), "ERR syntax error");
}

#[test]
fn shutdown_command_stops_the_server() {
    let s = start();
    let port = s.resp_port().unwrap();
    let mut r = crate::common::Resp::new(port);
    r.send(b"SHUTDOWN NOSAVE\r\n");
    assert!(r.closed(), "SHUTDOWN closes the connection");
    let mut rx = s.shutdown_signal();
    assert!(*rx.borrow_and_update());
    s.join();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}
