//! The memcached text protocol over a raw socket.

use std::thread::sleep;
use std::time::Duration;

use crate::common::{client, err, q, start, Mc};

#[test]
fn storage_and_retrieval() {
    let s = start();
    let mut m = Mc::new(s.memcached_port().unwrap());
    assert_eq!(m.req("set a 42 0 5\r\nhello\r\n"), "STORED");
    m.send(b"get a\r\n");
    assert_eq!(m.until_end(), vec!["VALUE a 42 5", "hello"]);
    m.send(b"get a nope a\r\n");
    assert_eq!(m.until_end().len(), 4);
    assert_eq!(m.req("add a 0 0 1\r\nx\r\n"), "NOT_STORED");
    assert_eq!(m.req("add b 7 0 1\r\nx\r\n"), "STORED");
    assert_eq!(m.req("replace nope 0 0 1\r\nx\r\n"), "NOT_STORED");
    assert_eq!(m.req("replace b 8 0 1\r\ny\r\n"), "STORED");
    assert_eq!(m.req("append a 0 0 3\r\n!!!\r\n"), "STORED");
    assert_eq!(m.req("prepend a 0 0 2\r\n<<\r\n"), "STORED");
    assert_eq!(m.req("append nope 0 0 1\r\nx\r\n"), "NOT_STORED");
    m.send(b"get a b\r\n");
    assert_eq!(
        m.until_end(),
        vec!["VALUE a 42 10", "<<hello!!!", "VALUE b 8 1", "y"]
    );
    // gets / cas
    m.send(b"gets b\r\n");
    let v = m.until_end();
    let cas: u64 = v[0].split(' ').nth(4).unwrap().parse().unwrap();
    assert_eq!(
        m.req(&format!("cas b 0 0 1 {}\r\nz\r\n", cas + 1)),
        "EXISTS"
    );
    assert_eq!(m.req(&format!("cas b 9 0 1 {cas}\r\nz\r\n")), "STORED");
    assert_eq!(m.req(&format!("cas b 9 0 1 {cas}\r\nw\r\n")), "EXISTS");
    assert_eq!(m.req("cas nope 0 0 1 1\r\nz\r\n"), "NOT_FOUND");
    // delete
    assert_eq!(m.req("delete b\r\n"), "DELETED");
    assert_eq!(m.req("delete b\r\n"), "NOT_FOUND");
    assert_eq!(m.req("delete a 0\r\n"), "DELETED");
    // Empty values and binary data.
    assert_eq!(m.req("set e 0 0 0\r\n\r\n"), "STORED");
    m.send(b"get e\r\n");
    assert_eq!(m.until_end(), vec!["VALUE e 0 0", ""]);
    assert_eq!(m.req("set bin 0 0 4\r\na\r\nb\r\n"), "STORED");
    // 32-bit flags survive, up to the sixteen reserved values.
    assert_eq!(m.req("set f 4294967279 0 1\r\nx\r\n"), "STORED");
    m.send(b"get f\r\n");
    assert_eq!(m.until_end()[0], "VALUE f 4294967279 1");
    // The reserved flags values (Redis types) are refused.
    for f in ["4294967295", "4294967294", "4294967280"] {
        assert!(m
            .req(&format!("set f {f} 0 1\r\nx\r\n"))
            .starts_with("CLIENT_ERROR"));
    }
}

#[test]
fn incr_decr_touch_gat() {
    let s = start();
    let mut m = Mc::new(s.memcached_port().unwrap());
    assert_eq!(m.req("incr n 1\r\n"), "NOT_FOUND");
    assert_eq!(m.req("set n 3 0 2\r\n10\r\n"), "STORED");
    assert_eq!(m.req("incr n 5\r\n"), "15");
    assert_eq!(m.req("decr n 100\r\n"), "0");
    assert_eq!(m.req("set n 3 0 20\r\n18446744073709551615\r\n"), "STORED");
    assert_eq!(m.req("incr n 2\r\n"), "1", "incr wraps at 2^64");
    m.send(b"get n\r\n");
    assert_eq!(m.until_end()[0], "VALUE n 3 1", "incr keeps flags");
    assert_eq!(m.req("set s 0 0 3\r\nabc\r\n"), "STORED");
    assert_eq!(
        m.req("incr s 1\r\n"),
        "CLIENT_ERROR cannot increment or decrement non-numeric value"
    );
    assert_eq!(
        m.req("incr s abc\r\n"),
        "CLIENT_ERROR invalid numeric delta argument"
    );
    assert_eq!(m.req("touch s 100\r\n"), "TOUCHED");
    assert_eq!(m.req("touch nope 100\r\n"), "NOT_FOUND");
    // gat / gats change the expiry and return the value.
    m.send(b"gat 1 s\r\n");
    assert_eq!(m.until_end(), vec!["VALUE s 0 3", "abc"]);
    sleep(Duration::from_millis(1100));
    m.send(b"gats 100 s\r\n");
    assert!(m.until_end().is_empty(), "gat 1 expired the item");
    // Relative, negative and absolute expiry.
    assert_eq!(m.req("set r 0 1 1\r\nx\r\n"), "STORED");
    assert_eq!(m.req("set neg 0 -1 1\r\nx\r\n"), "STORED");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(
        m.req(&format!("set abs 0 {} 1\r\nx\r\n", now + 1000)),
        "STORED"
    );
    assert_eq!(
        m.req(&format!("set past 0 {} 1\r\nx\r\n", now - 1000)),
        "STORED"
    );
    m.send(b"get neg past abs r\r\n");
    assert_eq!(
        m.until_end(),
        vec!["VALUE abs 0 1", "x", "VALUE r 0 1", "x"]
    );
    let mut c = client(&s);
    let ttl: i64 = q(&mut c, &["TTL", "abs"]);
    assert!((990..=1000).contains(&ttl), "absolute exptime: ttl {ttl}");
    sleep(Duration::from_millis(1100));
    m.send(b"get r\r\n");
    assert!(m.until_end().is_empty(), "relative exptime expired");
}

#[test]
fn noreply_admin_and_errors() {
    let s = start();
    let mut m = Mc::new(s.memcached_port().unwrap());
    m.send(b"set a 0 0 1 noreply\r\nx\r\nadd a 0 0 1 noreply\r\ny\r\nincr a 1 noreply\r\ndelete zz noreply\r\ntouch a 10 noreply\r\nverbosity 1 noreply\r\n");
    m.send(b"get a\r\n");
    assert_eq!(m.until_end(), vec!["VALUE a 0 1", "x"]);
    assert!(m.req("version\r\n").starts_with("VERSION "));
    assert_eq!(m.req("verbosity 1\r\n"), "OK");
    m.send(b"stats\r\n");
    let st = m.until_end();
    assert!(st.iter().any(|l| l.starts_with("STAT curr_items ")));
    assert!(st
        .iter()
        .any(|l| l.starts_with("STAT limit_maxbytes 33554432")));
    assert_eq!(m.req("bogus\r\n"), "ERROR");
    assert_eq!(m.req("\r\n"), "ERROR");
    assert_eq!(m.req("get\r\n"), "ERROR");
    assert_eq!(
        m.req("set k x 0 1\r\n"),
        "CLIENT_ERROR bad command line format"
    );
    let long_key = "k".repeat(251);
    assert_eq!(
        m.req(&format!("get {long_key}\r\n")),
        "CLIENT_ERROR bad command line format"
    );
    assert_eq!(m.req("flush_all\r\n"), "OK");
    m.send(b"get a\r\n");
    assert!(m.until_end().is_empty());
    m.send(b"flush_all noreply\r\n");
    assert_eq!(m.req("version\r\n").split(' ').next(), Some("VERSION"));
    m.send(b"quit\r\n");
    let mut l = String::new();
    use std::io::BufRead;
    assert_eq!(m.r.read_line(&mut l).unwrap_or(0), 0, "quit closes");
    // A bad data chunk closes the connection.
    let mut m2 = Mc::new(s.memcached_port().unwrap());
    assert_eq!(
        m2.req("set k 0 0 2\r\nabcd\r\n"),
        "CLIENT_ERROR bad data chunk"
    );
    let mut l = String::new();
    assert_eq!(m2.r.read_line(&mut l).unwrap_or(0), 0);
}

#[test]
fn shared_with_redis_and_hashes_are_safe() {
    let s = start();
    let mut m = Mc::new(s.memcached_port().unwrap());
    let mut c = client(&s);
    assert_eq!(m.req("set shared 5 0 2\r\nhi\r\n"), "STORED");
    assert_eq!(q::<String>(&mut c, &["GET", "shared"]), "hi");
    assert_eq!(q::<i64>(&mut c, &["APPEND", "shared", "!"]), 3);
    m.send(b"get shared\r\n");
    assert_eq!(
        m.until_end(),
        vec!["VALUE shared 5 3", "hi!"],
        "Redis APPEND keeps the flags"
    );
    q::<String>(&mut c, &["SET", "fromredis", "v"]);
    m.send(b"get fromredis\r\n");
    assert_eq!(m.until_end(), vec!["VALUE fromredis 0 1", "v"]);
    // A Redis hash cannot be corrupted through memcached.
    q::<i64>(&mut c, &["HSET", "h", "f", "v"]);
    assert!(m.req("append h 0 0 1\r\nx\r\n").starts_with("CLIENT_ERROR"));
    assert!(m.req("incr h 1\r\n").starts_with("CLIENT_ERROR"));
    assert_eq!(q::<String>(&mut c, &["HGET", "h", "f"]), "v");
    // A memcached item is a string to Redis.
    assert!(err(&mut c, &["HGET", "shared", "f"]).starts_with("WRONGTYPE"));
    assert_eq!(q::<String>(&mut c, &["TYPE", "shared"]), "string");
}

#[test]
fn too_large_value_is_skipped_like_memcached() {
    let s = crate::common::start_with(|c| c.proto_max_bulk_len = 1 << 20);
    let mut m = Mc::new(s.memcached_port().unwrap());
    let n = (1 << 20) + 10;
    m.send(format!("set big 0 0 {n}\r\n").as_bytes());
    let data = vec![b'q'; n];
    for piece in data.chunks(100_000) {
        m.send(piece);
    }
    m.send(b"\r\nset after 0 0 1\r\nz\r\nget big after\r\n");
    assert_eq!(m.line(), "SERVER_ERROR object too large for cache");
    assert_eq!(m.line(), "STORED");
    assert_eq!(m.until_end(), vec!["VALUE after 0 1", "z"]);
}
