//! Limits, malformed input, maxclients, timeouts, slow clients, and a full
//! store (OOM) with recovery after deletes.

use std::io::{Read, Write};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::common::{bulk, client, err, info_u64, q, raw, start, start_with, Mc, Resp, V};

fn proto_error(port: u16, input: &[u8], want: &str) {
    let mut r = Resp::new(port);
    r.send(input);
    assert_eq!(
        r.read(),
        V::Err(format!("ERR Protocol error: {want}")),
        "{input:?}"
    );
    assert!(r.closed(), "{input:?} closes the connection");
}

#[test]
fn malformed_input_closes_only_that_connection() {
    let s = start_with(|c| {
        c.proto_max_bulk_len = 1 << 20;
        c.max_multibulk_len = 100;
        c.max_inline_len = 1024;
    });
    let port = s.resp_port().unwrap();
    let mut good = Resp::new(port);
    assert_eq!(good.cmd(&["SET", "keep", "me"]), V::Simple("OK".into()));
    proto_error(port, b"*abc\r\n", "invalid multibulk length");
    proto_error(port, b"*101\r\n", "invalid multibulk length");
    proto_error(port, b"*1\r\n$-2\r\n", "invalid bulk length");
    proto_error(port, b"*1\r\n$x\r\n", "invalid bulk length");
    proto_error(
        port,
        b"*2\r\n$3\r\nGET\r\n$1048577\r\n",
        "invalid bulk length",
    );
    proto_error(port, b"*1\r\n:5\r\n", "expected '$', got ':'");
    proto_error(port, b"*1\r\n$3\r\nGETxx", "expected CRLF after bulk");
    proto_error(port, &[b'a'; 2000], "too big inline request");
    // Empty multibulks are skipped, as Redis does.
    good.send(b"*0\r\n*-1\r\n");
    assert_eq!(good.cmd(&["GET", "keep"]), bulk("me"));
    // Random garbage never takes the server down.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20 {
        let mut junk = vec![0u8; 4096];
        for b in junk.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *b = seed as u8;
        }
        let mut t = raw(port);
        let _ = t.write_all(&junk);
        let mut m = raw(s.memcached_port().unwrap());
        let _ = m.write_all(&junk);
    }
    assert_eq!(good.cmd(&["GET", "keep"]), bulk("me"));
    assert_eq!(good.cmd(&["PING"]), V::Simple("PONG".into()));
}

#[test]
fn bulk_limit_is_the_engine_value_limit() {
    let s = start();
    let mut c = client(&s);
    let m: std::collections::HashMap<String, String> =
        q(&mut c, &["CONFIG", "GET", "proto-max-bulk-len"]);
    assert_eq!(m["proto-max-bulk-len"], (512u64 << 20).to_string());
    // The engine's largest value is 16 MiB: a longer bulk is refused up front.
    let engine_max = s.shared().store.max_value_bytes() as usize;
    let mut r = Resp::new(s.resp_port().unwrap());
    r.send(format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n", engine_max + 1).as_bytes());
    assert_eq!(
        r.read(),
        V::Err("ERR Protocol error: invalid bulk length".into())
    );
    assert!(r.closed());
    // APPEND cannot grow a value past it either.
    let big = vec![b'a'; engine_max];
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg(&big[..])
        .query(&mut c)
        .unwrap();
    assert_eq!(
        err(&mut c, &["APPEND", "k", "x"]),
        "ERR string exceeds maximum allowed size (proto-max-bulk-len)"
    );
}

#[test]
fn query_buffer_limit() {
    let s = start_with(|c| c.query_buffer_limit = 256 << 10);
    let mut r = Resp::new(s.resp_port().unwrap());
    r.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1000000\r\n");
    let chunk = vec![b'z'; 64 << 10];
    for _ in 0..8 {
        if r.r.get_mut().write_all(&chunk).is_err() {
            break;
        }
    }
    assert_eq!(r.read(), V::Err("ERR query buffer limit exceeded".into()));
    assert!(r.closed());
}

#[test]
fn maxclients_enforced() {
    let s = start_with(|c| c.maxclients = 2);
    let port = s.resp_port().unwrap();
    let mut a = Resp::new(port);
    let mut b = Resp::new(port);
    assert_eq!(a.cmd(&["PING"]), V::Simple("PONG".into()));
    assert_eq!(b.cmd(&["PING"]), V::Simple("PONG".into()));
    let mut third = Resp::new(port);
    assert_eq!(
        third.read(),
        V::Err("ERR max number of clients reached".into())
    );
    let mut mc = Mc::new(s.memcached_port().unwrap());
    assert_eq!(mc.line(), "SERVER_ERROR Too many open connections");
    drop(a);
    // The slot frees once the server sees the close.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = Resp::new(port);
        c.send(b"PING\r\n");
        match c.read() {
            V::Simple(p) if p == "PONG" => break,
            other => assert!(Instant::now() < deadline, "still refused: {other:?}"),
        }
        sleep(Duration::from_millis(20));
    }
    assert_eq!(b.cmd(&["PING"]), V::Simple("PONG".into()));
}

#[test]
fn idle_timeout() {
    let s = start_with(|c| c.timeout = 1);
    let mut r = Resp::new(s.resp_port().unwrap());
    assert_eq!(r.cmd(&["PING"]), V::Simple("PONG".into()));
    let t = Instant::now();
    assert!(r.closed());
    assert!(t.elapsed() >= Duration::from_millis(900));
}

/// A connection that read a large value holds large buffers, which it
/// frees after a second without input; that wake-up does not restart the
/// idle timeout.
#[test]
fn idle_timeout_counts_from_the_last_request_after_large_replies() {
    let s = start_with(|c| c.timeout = 2);
    let v = "v".repeat(48 << 10);
    let mut r = Resp::new(s.resp_port().unwrap());
    assert_eq!(r.cmd(&["SET", "big", &v]), V::Simple("OK".into()));
    assert_eq!(r.cmd(&["GET", "big"]), V::Bulk(v.into_bytes()));
    let t = Instant::now();
    assert!(r.closed());
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_millis(2800),
        "closed after {waited:?} idle, timeout 2 s"
    );
}

#[test]
fn slow_reader_does_not_stall_others() {
    let s = start_with(|c| c.threads = 1);
    let port = s.resp_port().unwrap();
    let mut c = client(&s);
    let v = vec![b'v'; 64 << 10];
    let _: () = redis::cmd("SET")
        .arg("big")
        .arg(&v[..])
        .query(&mut c)
        .unwrap();
    // A client that asks for 128 MiB of replies and never reads them.
    let mut slow = raw(port);
    let mut reqs = Vec::new();
    for _ in 0..2000 {
        reqs.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n");
    }
    slow.write_all(&reqs).unwrap();
    sleep(Duration::from_millis(100));
    // Others on the same (single) worker are still served promptly.
    let t = Instant::now();
    for _ in 0..50 {
        assert_eq!(q::<String>(&mut c, &["PING"]), "PONG");
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    // The slow client's replies were bounded: it can still read some.
    let mut buf = vec![0u8; 1 << 16];
    assert!(slow.read(&mut buf).unwrap() > 0);
}

#[test]
fn oom_then_recovery() {
    let s = start_with(|c| c.capacity = nibble::MIN_CAPACITY_BYTES as u64);
    let mut c = client(&s);
    let v = vec![b'x'; 32 << 10];
    let mut stored = 0;
    let oom = loop {
        match redis::cmd("SET")
            .arg(format!("k{stored}"))
            .arg(&v[..])
            .query::<()>(&mut c)
        {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
        assert!(stored < 10_000, "never ran out of memory");
    };
    assert_eq!(oom.code(), Some("OOM"), "{oom}");
    assert!(oom
        .to_string()
        .contains("command not allowed when used memory > 'maxmemory'"));
    assert!(stored > 50, "stored only {stored}");
    // Reads, TTL and deletes keep working; other writes get OOM too.
    assert_eq!(q::<Vec<u8>>(&mut c, &["GET", "k0"]).len(), v.len());
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k1", "100"]), 1);
    let e = redis::cmd("APPEND")
        .arg("k2")
        .arg(&v[..])
        .query::<i64>(&mut c)
        .unwrap_err();
    assert_eq!(e.code(), Some("OOM"));
    let mut m = Mc::new(s.memcached_port().unwrap());
    let big = "y".repeat(32 << 10);
    assert_eq!(
        m.req(&format!("set mc 0 0 {}\r\n{big}\r\n", big.len())),
        "SERVER_ERROR out of memory storing object"
    );
    m.send(b"get k0\r\n");
    assert_eq!(m.until_end().len(), 2);
    // Free most of it; compaction makes room and writes succeed again.
    for i in 0..stored {
        if i % 4 != 0 {
            assert_eq!(q::<i64>(&mut c, &["DEL", &format!("k{i}")]), 1);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ok = 0;
    let mut i = 0;
    while ok < stored / 2 {
        match redis::cmd("SET")
            .arg(format!("n{i}"))
            .arg(&v[..])
            .query::<()>(&mut c)
        {
            Ok(()) => ok += 1,
            Err(e) => {
                assert_eq!(e.code(), Some("OOM"));
                assert!(
                    Instant::now() < deadline,
                    "no recovery after deletes: {ok} writes"
                );
                sleep(Duration::from_millis(20));
            }
        }
        i += 1;
    }
    assert_eq!(m.req("set mc 0 0 1\r\nz\r\n"), "STORED");
    let info: String = q(&mut c, &["INFO", "memory"]);
    assert!(info_u64(&info, "used_memory_rss") > 0);
}

/// A pipeline of slow requests (HGET on a large hash reads the whole
/// encoded hash) neither starves the worker's other connections nor
/// outlives its client: the batch yields every `EXEC_SLICE`, and once the
/// client is gone (its socket reset) the rest of its requests are dropped.
#[test]
fn slow_pipeline_yields_the_worker_and_stops_with_its_client() {
    let s = start_with(|c| {
        c.threads = 1;
        c.capacity = 256 << 20;
    });
    let port = s.resp_port().unwrap();
    let mut con = client(&s);
    let fields: Vec<String> = (0..8000)
        .flat_map(|i| [format!("field:{i:06}"), "v".repeat(16)])
        .collect();
    let mut c = redis::cmd("HSET");
    c.arg("h");
    for f in &fields {
        c.arg(f.as_str());
    }
    let _: i64 = c.query(&mut con).unwrap();
    let t = Instant::now();
    let _: String = q(&mut con, &["HGET", "h", "field:007999"]);
    let one = t.elapsed();
    // Enough requests for seconds of work, within what the socket buffers
    // take at once (the writer never blocks).
    let n = ((3.0 / one.as_secs_f64().max(1e-6)) as usize).clamp(500, 6000);
    let req = "*3\r\n$4\r\nHGET\r\n$1\r\nh\r\n$12\r\nfield:007999\r\n".repeat(n);
    let mut a = raw(port);
    a.write_all(req.as_bytes()).unwrap();
    sleep(Duration::from_millis(100));
    let t = Instant::now();
    let _: String = q(&mut con, &["PING"]);
    let ping = t.elapsed();
    let work = one * n as u32;
    assert!(
        ping < Duration::from_millis(500).max(one * 40),
        "PING waited {ping:?} behind a pipeline of {n} HGETs of {one:?} each ({work:?} of work)"
    );
    // The client vanishes with replies unread: closing resets the socket.
    drop(a);
    sleep(Duration::from_millis(300).max(one * 40));
    let info = |con: &mut redis::Connection| {
        let i: String = q(con, &["INFO", "stats"]);
        info_u64(&i, "total_commands_processed")
    };
    let c0 = info(&mut con);
    sleep(Duration::from_millis(300).max(one * 20));
    let c1 = info(&mut con);
    assert!(
        c1 - c0 <= 2,
        "the vanished client's requests still run: {} commands in the pause",
        c1 - c0
    );
}
