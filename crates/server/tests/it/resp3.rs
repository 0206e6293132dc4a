//! RESP3, the inline protocol, pipelining and the Unix socket, over raw sockets.

use std::io::{BufRead, BufReader, Write};

use crate::common::{bulk, client, q, start, start_with, Resp, V};

#[test]
fn hello_and_resp3_types() {
    let s = start();
    let mut r = Resp::new(s.resp_port().unwrap());
    assert_eq!(
        r.cmd(&["HELLO", "4"]),
        V::Err("NOPROTO unsupported protocol version".into())
    );
    assert_eq!(
        r.cmd(&["HELLO", "x"]),
        V::Err("ERR Protocol version is not an integer or out of range".into())
    );
    let V::Map(m) = r.cmd(&["HELLO", "3", "SETNAME", "r3"]) else {
        panic!("HELLO 3 replies with a map")
    };
    assert!(m.contains(&(bulk("proto"), V::Int(3))));
    assert!(m.contains(&(bulk("server"), bulk("redis"))));
    assert_eq!(r.cmd(&["GET", "missing"]), V::Null);
    r.cmd(&["HSET", "h", "f", "v"]);
    assert_eq!(
        r.cmd(&["HGETALL", "h"]),
        V::Map(vec![(bulk("f"), bulk("v"))])
    );
    assert!(matches!(r.cmd(&["CONFIG", "GET", "maxclients"]), V::Map(_)));
    assert!(matches!(r.cmd(&["INFO", "server"]), V::Verbatim(t) if t.contains("redis_version")));
    assert_eq!(
        r.cmd(&["MGET", "h", "nope"]),
        V::Array(vec![V::Null, V::Null])
    );
    assert_eq!(r.cmd(&["CLIENT", "GETNAME"]), bulk("r3"));
    // Back to RESP2.
    let V::Array(_) = r.cmd(&["HELLO", "2"]) else {
        panic!("HELLO 2 replies with an array")
    };
    assert_eq!(r.cmd(&["GET", "missing"]), V::Null);
    r.send(b"GET missing\r\n");
    let mut l = String::new();
    r.r.read_line(&mut l).unwrap();
    assert_eq!(l, "$-1\r\n");
    // HELLO without a version reports the current one.
    let V::Array(a) = r.cmd(&["HELLO"]) else {
        panic!()
    };
    assert!(a.contains(&V::Int(2)));
}

#[test]
fn inline_protocol() {
    let s = start();
    let mut r = Resp::new(s.resp_port().unwrap());
    r.send(b"PING\r\n");
    assert_eq!(r.read(), V::Simple("PONG".into()));
    r.send(b"SET greeting \"hello world\\n\"\r\n");
    assert_eq!(r.read(), V::Simple("OK".into()));
    r.send(b"GET greeting\n");
    assert_eq!(r.read(), bulk("hello world\n"));
    r.send(b"SET q 'it\\'s'\r\nGET q\r\n");
    assert_eq!(r.read(), V::Simple("OK".into()));
    assert_eq!(r.read(), bulk("it's"));
    r.send(b"\r\n\r\nECHO \"\\x41\\x42\"\r\n");
    assert_eq!(r.read(), bulk("AB"));
    r.send(b"QUIT\r\n");
    assert_eq!(r.read(), V::Simple("OK".into()));
    assert!(r.closed(), "QUIT closes the connection");
    let mut r = Resp::new(s.resp_port().unwrap());
    r.send(b"SET a \"unbalanced\r\n");
    assert_eq!(
        r.read(),
        V::Err("ERR Protocol error: unbalanced quotes in request".into())
    );
    assert!(r.closed());
}

#[test]
fn pipelining() {
    let s = start();
    let mut r = Resp::new(s.resp_port().unwrap());
    let mut batch = Vec::new();
    for i in 0..2000 {
        batch.extend_from_slice(
            format!("*3\r\n$3\r\nSET\r\n$5\r\nk{i:04}\r\n$4\r\n{i:04}\r\n").as_bytes(),
        );
        batch.extend_from_slice(format!("*2\r\n$3\r\nGET\r\n$5\r\nk{i:04}\r\n").as_bytes());
        batch.extend_from_slice(b"PING\r\n");
    }
    // Send in odd-sized pieces so requests straddle reads.
    for piece in batch.chunks(777) {
        r.send(piece);
    }
    for i in 0..2000 {
        assert_eq!(r.read(), V::Simple("OK".into()));
        assert_eq!(r.read(), bulk(&format!("{i:04}")));
        assert_eq!(r.read(), V::Simple("PONG".into()));
    }
    // Through the client crate's pipeline too.
    let mut c = client(&s);
    let mut p = redis::pipe();
    for i in 0..500 {
        p.cmd("INCR").arg("pc").ignore();
        p.cmd("GET").arg(format!("k{i:04}"));
    }
    let got: Vec<String> = p.query(&mut c).unwrap();
    assert_eq!(got.len(), 500);
    assert_eq!(got[499], "0499");
    assert_eq!(q::<i64>(&mut c, &["GET", "pc"]), 500);
}

#[test]
fn large_values_cross_reads() {
    let s = start();
    let mut c = client(&s);
    let big = vec![b'x'; 3 << 20];
    let _: () = redis::cmd("SET")
        .arg("big")
        .arg(&big[..])
        .query(&mut c)
        .unwrap();
    let got: Vec<u8> = redis::cmd("GET").arg("big").query(&mut c).unwrap();
    assert_eq!(got.len(), big.len());
    assert_eq!(q::<i64>(&mut c, &["STRLEN", "big"]), 3 << 20);
}

#[test]
fn unix_socket() {
    let path = std::env::temp_dir().join(format!("nibble-test-{}.sock", std::process::id()));
    let s = start_with(|c| c.unixsocket = Some(path.clone()));
    let mut u = std::os::unix::net::UnixStream::connect(&path).unwrap();
    u.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nu\r\n$1\r\n1\r\nGET u\r\n")
        .unwrap();
    let mut r = BufReader::new(u);
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    assert_eq!(l, "+OK\r\n");
    l.clear();
    r.read_line(&mut l).unwrap();
    assert_eq!(l, "$1\r\n");
    drop(s);
    assert!(!path.exists(), "the socket file is removed at shutdown");
}
