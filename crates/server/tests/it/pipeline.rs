//! Pipelined replies written at the end of the worker's loop turn
//! (`outq`), with and without idle polling (`idlespin`): every reply
//! arrives, in order, whatever the number of connections, the size of the
//! replies, or how late the client reads.

use std::io::{Read, Write};
use std::thread;

use server::config::ServerConfig;

use crate::common::{bulk, start_with, Resp, V};

fn one_worker(poll_us: u64) -> impl FnOnce(&mut ServerConfig) {
    move |c| {
        c.threads = 1;
        c.idle_poll_us = poll_us;
    }
}

fn resp_cmd(args: &[&str]) -> Vec<u8> {
    let mut b = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    b
}

/// 16 connections at once, each sending 300 pipelined INCR / GET in
/// pieces: each reply is the one its request asked for, in order.
fn many_pipelines(poll_us: u64) {
    let s = start_with(one_worker(poll_us));
    let port = s.resp_port().unwrap();
    let clients: Vec<_> = (0..16)
        .map(|c| {
            thread::spawn(move || {
                let mut r = Resp::new(port);
                let key = format!("ctr:{c}");
                let mut batch = Vec::new();
                for _ in 0..150 {
                    batch.extend(resp_cmd(&["INCR", &key]));
                    batch.extend(resp_cmd(&["GET", &key]));
                }
                // In three writes, cut mid-request.
                let (a, rest) = batch.split_at(batch.len() / 3 + 1);
                let (b, c2) = rest.split_at(rest.len() / 2 + 3);
                for part in [a, b, c2] {
                    r.send(part);
                }
                for i in 1..=150i64 {
                    assert_eq!(r.read(), V::Int(i));
                    assert_eq!(r.read(), bulk(&i.to_string()));
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
}

#[test]
fn many_pipelined_connections_get_every_reply_in_order() {
    many_pipelines(0);
}

#[test]
fn many_pipelined_connections_with_idle_polling() {
    many_pipelines(50);
}

/// Replies larger than the socket takes (the deferred write comes up
/// short) reach a client that starts reading late, in order, and another
/// client is served meanwhile.
fn late_reader(poll_us: u64) {
    let s = start_with(one_worker(poll_us));
    let port = s.resp_port().unwrap();
    let value = "v".repeat(256 << 10);
    let mut w = Resp::new(port);
    assert_eq!(w.cmd(&["SET", "big", &value]), V::Simple("OK".into()));
    let mut late = crate::common::raw(port);
    let mut req = Vec::new();
    for i in 0..40 {
        req.extend(resp_cmd(&["GET", "big"]));
        req.extend(resp_cmd(&["ECHO", &i.to_string()]));
    }
    late.write_all(&req).unwrap();
    // The server is stuck on `late`'s full socket; others still run.
    thread::sleep(std::time::Duration::from_millis(200));
    let mut other = Resp::new(port);
    assert_eq!(other.cmd(&["PING"]), V::Simple("PONG".into()));
    let mut r = Resp {
        r: std::io::BufReader::new(late),
    };
    for i in 0..40 {
        match r.read() {
            V::Bulk(b) => assert_eq!(b.len(), value.len()),
            v => panic!("reply {i}: {v:?}"),
        }
        assert_eq!(r.read(), bulk(&i.to_string()));
    }
    // Nothing more than the replies.
    r.r.get_mut()
        .set_read_timeout(Some(std::time::Duration::from_millis(100)))
        .unwrap();
    let mut one = [0u8; 1];
    assert!(r.r.read(&mut one).is_err());
}

#[test]
fn a_late_reader_gets_large_replies_whole_and_in_order() {
    late_reader(0);
}

#[test]
fn a_late_reader_with_idle_polling() {
    late_reader(50);
}

/// A client that sends a pipeline and closes at once still gets nothing
/// written to a reused descriptor: the next client sees only its replies.
#[test]
fn a_client_that_closes_before_its_replies_does_not_disturb_the_next() {
    let s = start_with(one_worker(0));
    let port = s.resp_port().unwrap();
    for round in 0..20 {
        let mut gone = crate::common::raw(port);
        let mut req = Vec::new();
        for _ in 0..50 {
            req.extend(resp_cmd(&["ECHO", "for-the-closed-client"]));
        }
        gone.write_all(&req).unwrap();
        drop(gone);
        let mut r = Resp::new(port);
        let tag = format!("round-{round}");
        assert_eq!(r.cmd(&["ECHO", &tag]), bulk(&tag));
    }
}

#[test]
fn idle_poll_us_is_a_start_setting_with_a_bound() {
    let s = start_with(one_worker(20));
    let mut r = Resp::new(s.resp_port().unwrap());
    assert_eq!(
        r.cmd(&["CONFIG", "GET", "idle-poll-us"]),
        V::Array(vec![bulk("idle-poll-us"), bulk("20")])
    );
    let mut c = ServerConfig::default();
    assert!(c.apply("idle-poll-us", "50").is_ok());
    assert_eq!(c.idle_poll_us, 50);
    let e = c.apply("idle-poll-us", "1000000").unwrap_err();
    assert!(e.contains("at most"), "{e}");
    assert!(c.apply("idle-poll-us", "-1").is_err());
}
