//! Blocking pops: clients that wait on empty keys and are served by
//! pushes from other clients (FIFO per key, pushes from MULTI/EXEC,
//! BLMOVE chains), timeouts, disconnects while blocked, CLIENT UNBLOCK,
//! a blocked client not holding up its worker's other connections, and
//! a queue under stress (hand-offs, timeouts, reconnects) checked for
//! lost and duplicated elements.
//! The replies' shapes and errors are compared with redis-server in
//! `differential/blocking.rs`.

use std::io::Read;
use std::time::{Duration, Instant};

use crate::common::{bulk, start, start_with, Resp, V};
use server::Server;

/// Send a command without reading its reply.
fn send(c: &mut Resp, args: &[&str]) {
    let mut b = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    c.send(&b);
}

/// Wait until the server counts `n` blocked clients.
fn wait_blocked(s: &Server, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.shared().blocking.blocked() != n {
        assert!(Instant::now() < deadline, "never {n} blocked clients");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn arr(items: &[&str]) -> V {
    V::Array(items.iter().map(|s| bulk(s)).collect())
}

#[test]
fn two_waiters_are_served_in_fifo_order() {
    let s = start();
    let port = s.resp_port().unwrap();
    let (mut w1, mut w2, mut p) = (Resp::new(port), Resp::new(port), Resp::new(port));
    send(&mut w1, &["BLPOP", "q", "0"]);
    wait_blocked(&s, 1);
    send(&mut w2, &["BLPOP", "other", "q", "0"]);
    wait_blocked(&s, 2);
    match p.cmd(&["INFO", "clients"]) {
        V::Bulk(b) => assert!(String::from_utf8(b).unwrap().contains("blocked_clients:2")),
        v => panic!("{v:?}"),
    }
    // One element: the first waiter only.
    assert_eq!(p.cmd(&["RPUSH", "q", "a"]), V::Int(1));
    assert_eq!(w1.read(), arr(&["q", "a"]));
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["LLEN", "q"]), V::Int(0));
    assert_eq!(p.cmd(&["RPUSH", "q", "b", "c"]), V::Int(2));
    assert_eq!(w2.read(), arr(&["q", "b"]));
    assert_eq!(p.cmd(&["LRANGE", "q", "0", "-1"]), arr(&["c"]));
    // A pipelined command after the BLPOP runs once it is served.
    send(&mut w1, &["BLPOP", "q2", "0"]);
    send(&mut w1, &["PING"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["LPUSH", "q2", "x"]), V::Int(1));
    assert_eq!(w1.read(), arr(&["q2", "x"]));
    assert_eq!(w1.read(), V::Simple("PONG".into()));
}

#[test]
fn a_push_inside_exec_wakes_a_waiter() {
    let s = start();
    let port = s.resp_port().unwrap();
    let (mut w, mut p) = (Resp::new(port), Resp::new(port));
    send(&mut w, &["BRPOP", "q", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["MULTI"]), V::Simple("OK".into()));
    assert_eq!(p.cmd(&["RPUSH", "q", "a", "b"]), V::Simple("QUEUED".into()));
    assert_eq!(p.cmd(&["LLEN", "q"]), V::Simple("QUEUED".into()));
    // The waiter is served after the transaction, which saw both.
    assert_eq!(p.cmd(&["EXEC"]), V::Array(vec![V::Int(2), V::Int(2)]));
    assert_eq!(w.read(), arr(&["q", "b"]));
    assert_eq!(p.cmd(&["LRANGE", "q", "0", "-1"]), arr(&["a"]));
}

#[test]
fn a_timeout_replies_a_null_array() {
    let s = start();
    let port = s.resp_port().unwrap();
    for (hello, null) in [(false, &b"*-1\r\n"[..]), (true, &b"_\r\n"[..])] {
        let mut c = Resp::new(port);
        if hello {
            c.cmd(&["HELLO", "3"]);
        }
        for cmd in [
            &["BLPOP", "q", "0.05"][..],
            &["BLMOVE", "q", "d", "LEFT", "LEFT", "0.05"],
            &["BZMPOP", "0.05", "1", "q", "MIN"],
        ] {
            let t = Instant::now();
            send(&mut c, cmd);
            let mut got = vec![0u8; null.len()];
            c.r.read_exact(&mut got).unwrap();
            assert_eq!(got, null, "{cmd:?}");
            let took = t.elapsed();
            assert!(took >= Duration::from_millis(45), "{cmd:?} took {took:?}");
            assert!(took < Duration::from_secs(5), "{cmd:?} took {took:?}");
        }
    }
    wait_blocked(&s, 0);
}

#[test]
fn a_client_gone_while_blocked_loses_nothing() {
    let s = start();
    let port = s.resp_port().unwrap();
    let mut w = Resp::new(port);
    send(&mut w, &["BLPOP", "q", "0"]);
    wait_blocked(&s, 1);
    drop(w);
    wait_blocked(&s, 0);
    let mut p = Resp::new(port);
    assert_eq!(p.cmd(&["RPUSH", "q", "a"]), V::Int(1));
    assert_eq!(p.cmd(&["LRANGE", "q", "0", "-1"]), arr(&["a"]));
    // And a gone client in front of a live one: the live one is served.
    let (mut gone, mut live) = (Resp::new(port), Resp::new(port));
    send(&mut gone, &["BLPOP", "k", "0"]);
    wait_blocked(&s, 1);
    send(&mut live, &["BLPOP", "k", "0"]);
    wait_blocked(&s, 2);
    drop(gone);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["RPUSH", "k", "x", "y"]), V::Int(2));
    assert_eq!(live.read(), arr(&["k", "x"]));
    assert_eq!(p.cmd(&["LRANGE", "k", "0", "-1"]), arr(&["y"]));
}

#[test]
fn blmove_wakes_a_waiter_of_its_destination() {
    let s = start();
    let port = s.resp_port().unwrap();
    let (mut mover, mut w, mut p) = (Resp::new(port), Resp::new(port), Resp::new(port));
    send(&mut mover, &["BLMOVE", "src", "dst", "RIGHT", "LEFT", "0"]);
    wait_blocked(&s, 1);
    send(&mut w, &["BLPOP", "dst", "0"]);
    wait_blocked(&s, 2);
    assert_eq!(p.cmd(&["RPUSH", "src", "a", "b"]), V::Int(2));
    assert_eq!(mover.read(), bulk("b"));
    assert_eq!(w.read(), arr(&["dst", "b"]));
    assert_eq!(p.cmd(&["LRANGE", "src", "0", "-1"]), arr(&["a"]));
    assert_eq!(p.cmd(&["EXISTS", "dst"]), V::Int(0));
    // An LMOVE onto a waited key serves too, and BZPOPMIN waits on ZADD.
    send(&mut w, &["BLPOP", "dst", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["LMOVE", "src", "dst", "LEFT", "LEFT"]), bulk("a"));
    assert_eq!(w.read(), arr(&["dst", "a"]));
    send(&mut w, &["BZPOPMIN", "z", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["ZADD", "z", "2", "m", "1", "n"]), V::Int(2));
    assert_eq!(w.read(), V::Array(vec![bulk("z"), bulk("n"), bulk("1")]));
}

#[test]
fn client_unblock_ends_a_wait() {
    let s = start();
    let port = s.resp_port().unwrap();
    let (mut w, mut p) = (Resp::new(port), Resp::new(port));
    let id = match w.cmd(&["CLIENT", "ID"]) {
        V::Int(i) => i.to_string(),
        v => panic!("{v:?}"),
    };
    send(&mut w, &["BLPOP", "q", "0"]);
    wait_blocked(&s, 1);
    let list = match p.cmd(&["CLIENT", "LIST"]) {
        V::Verbatim(t) => t,
        V::Bulk(b) => String::from_utf8(b).unwrap(),
        v => panic!("{v:?}"),
    };
    assert!(list.contains("flags=b"), "{list}");
    assert_eq!(p.cmd(&["CLIENT", "UNBLOCK", &id]), V::Int(1));
    assert_eq!(w.read(), V::Null);
    assert_eq!(p.cmd(&["CLIENT", "UNBLOCK", &id]), V::Int(0));
    send(&mut w, &["BLPOP", "q", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["CLIENT", "UNBLOCK", &id, "ERROR"]), V::Int(1));
    assert_eq!(
        w.read(),
        V::Err("UNBLOCKED client unblocked via CLIENT UNBLOCK".into())
    );
    assert_eq!(p.cmd(&["RPUSH", "q", "a"]), V::Int(1));
    assert_eq!(w.cmd(&["LLEN", "q"]), V::Int(1));
}

#[test]
fn a_blocked_client_does_not_hold_its_worker() {
    // One worker: the blocked connection and the other share it.
    let s = start_with(|c| c.threads = 1);
    let port = s.resp_port().unwrap();
    let (mut w, mut other) = (Resp::new(port), Resp::new(port));
    send(&mut w, &["BLPOP", "q", "0"]);
    wait_blocked(&s, 1);
    for i in 0..100 {
        assert_eq!(
            other.cmd(&["SET", "k", &i.to_string()]),
            V::Simple("OK".into())
        );
        assert_eq!(other.cmd(&["GET", "k"]), bulk(&i.to_string()));
    }
    assert_eq!(other.cmd(&["LPUSH", "q", "v"]), V::Int(1));
    assert_eq!(w.read(), arr(&["q", "v"]));
}

#[test]
fn a_push_onto_a_missing_key_goes_straight_to_its_waiter() {
    let s = start();
    let port = s.resp_port().unwrap();
    let (mut w, mut p, mut watcher) = (Resp::new(port), Resp::new(port), Resp::new(port));
    // The element is handed over: the waiter has it, the key stays missing,
    // and a watcher of the key sees a write.
    assert_eq!(watcher.cmd(&["WATCH", "q"]), V::Simple("OK".into()));
    send(&mut w, &["BRPOP", "q", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["LPUSH", "q", "a"]), V::Int(1));
    assert_eq!(w.read(), arr(&["q", "a"]));
    assert_eq!(p.cmd(&["EXISTS", "q"]), V::Int(0));
    assert_eq!(watcher.cmd(&["MULTI"]), V::Simple("OK".into()));
    assert_eq!(watcher.cmd(&["PING"]), V::Simple("QUEUED".into()));
    assert_eq!(watcher.cmd(&["EXEC"]), V::Null);
    // Nobody waiting: the push stores the list.
    assert_eq!(p.cmd(&["RPUSH", "q", "b"]), V::Int(1));
    assert_eq!(p.cmd(&["LRANGE", "q", "0", "-1"]), arr(&["b"]));
    assert_eq!(p.cmd(&["DEL", "q"]), V::Int(1));
    // A waiter on several keys, or a mover, is served by the general path,
    // with the same result.
    send(&mut w, &["BLPOP", "other", "q", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["RPUSH", "q", "c"]), V::Int(1));
    assert_eq!(w.read(), arr(&["q", "c"]));
    send(&mut w, &["BLMOVE", "q", "d", "LEFT", "LEFT", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["LPUSH", "q", "e"]), V::Int(1));
    assert_eq!(w.read(), bulk("e"));
    assert_eq!(p.cmd(&["LRANGE", "d", "0", "-1"]), arr(&["e"]));
    assert_eq!(p.cmd(&["EXISTS", "q"]), V::Int(0));
    // A key that became another type while the waiter waits is not
    // missing: WRONGTYPE, and the waiter keeps waiting until it is a list.
    send(&mut w, &["BLPOP", "s", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["SET", "s", "x"]), V::Simple("OK".into()));
    assert!(matches!(p.cmd(&["LPUSH", "s", "f"]), V::Err(e) if e.starts_with("WRONGTYPE")));
    assert_eq!(p.cmd(&["DEL", "s"]), V::Int(1));
    assert_eq!(p.cmd(&["LPUSH", "s", "g"]), V::Int(1));
    assert_eq!(w.read(), arr(&["s", "g"]));
    // Inside EXEC the list exists until the transaction ends, as in Redis.
    send(&mut w, &["BLPOP", "t", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["MULTI"]), V::Simple("OK".into()));
    assert_eq!(p.cmd(&["LPUSH", "t", "h"]), V::Simple("QUEUED".into()));
    assert_eq!(p.cmd(&["LLEN", "t"]), V::Simple("QUEUED".into()));
    assert_eq!(p.cmd(&["EXEC"]), V::Array(vec![V::Int(1), V::Int(1)]));
    assert_eq!(w.read(), arr(&["t", "h"]));
    assert_eq!(p.cmd(&["EXISTS", "t"]), V::Int(0));
    // A RESP3 waiter gets its reply in RESP3, and several elements pushed
    // at once take the general path (one served, the rest stored).
    let mut w3 = Resp::new(port);
    assert!(matches!(w3.cmd(&["HELLO", "3"]), V::Map(_)));
    send(&mut w3, &["BLPOP", "u", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["RPUSH", "u", "i"]), V::Int(1));
    assert_eq!(w3.read(), arr(&["u", "i"]));
    send(&mut w3, &["BLPOP", "u", "0"]);
    wait_blocked(&s, 1);
    assert_eq!(p.cmd(&["RPUSH", "u", "j", "k"]), V::Int(2));
    assert_eq!(w3.read(), arr(&["u", "j"]));
    assert_eq!(p.cmd(&["LRANGE", "u", "0", "-1"]), arr(&["k"]));
}

/// Producers and consumers on one queue, with hand-offs, pushes of two
/// elements (the general path), short timeouts and consumers that
/// reconnect: every element pushed is received exactly once or is still
/// in the list at the end.
#[test]
fn a_queue_under_stress_loses_and_duplicates_nothing() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = start();
    let port = s.resp_port().unwrap();
    const PRODUCERS: usize = 3;
    const PER_PRODUCER: usize = 2000;
    let done = AtomicBool::new(false);
    let received: Vec<Vec<String>> = std::thread::scope(|sc| {
        let consumers: Vec<_> = (0..4)
            .map(|c| {
                let done = &done;
                sc.spawn(move || {
                    let mut got = Vec::new();
                    let mut con = Resp::new(port);
                    let mut n = 0u32;
                    loop {
                        let finished = done.load(Ordering::Acquire);
                        // BLPOP and BRPOP, 20 ms timeouts; after the
                        // producers end, drain until a timeout.
                        let cmd = if (n + c).is_multiple_of(2) {
                            "BLPOP"
                        } else {
                            "BRPOP"
                        };
                        match con.cmd(&[cmd, "q", "0.02"]) {
                            V::Array(v) => match &v[..] {
                                [_, V::Bulk(e)] => got.push(String::from_utf8(e.clone()).unwrap()),
                                other => panic!("{other:?}"),
                            },
                            V::Null if finished => break,
                            V::Null => {}
                            other => panic!("{other:?}"),
                        }
                        n += 1;
                        // A consumer that reconnects now and then.
                        if n.is_multiple_of(97) {
                            con = Resp::new(port);
                        }
                    }
                    got
                })
            })
            .collect();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                sc.spawn(move || {
                    let mut con = Resp::new(port);
                    let mut i = 0;
                    while i < PER_PRODUCER {
                        if i % 5 == 4 && i + 1 < PER_PRODUCER {
                            let (a, b) = (format!("p{p}-{i}"), format!("p{p}-{}", i + 1));
                            assert!(matches!(con.cmd(&["RPUSH", "q", &a, &b]), V::Int(_)));
                            i += 2;
                        } else {
                            let e = format!("p{p}-{i}");
                            assert!(matches!(con.cmd(&["LPUSH", "q", &e]), V::Int(_)));
                            i += 1;
                        }
                    }
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        done.store(true, Ordering::Release);
        consumers.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let mut p = Resp::new(port);
    let left = match p.cmd(&["LRANGE", "q", "0", "-1"]) {
        V::Array(v) => v,
        other => panic!("{other:?}"),
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    for e in received.into_iter().flatten() {
        *seen.entry(e).or_default() += 1;
    }
    for e in left {
        let V::Bulk(b) = e else { panic!() };
        *seen.entry(String::from_utf8(b).unwrap()).or_default() += 1;
    }
    for p in 0..PRODUCERS {
        for i in 0..PER_PRODUCER {
            let k = format!("p{p}-{i}");
            assert_eq!(seen.remove(&k), Some(1), "{k}");
        }
    }
    assert!(seen.is_empty(), "never pushed: {seen:?}");
    wait_blocked(&s, 0);
}
