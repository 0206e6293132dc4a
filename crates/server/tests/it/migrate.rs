//! Connections that move between workers (key affinity, see
//! `server::migrate`): a move between two batches loses, duplicates and
//! reorders no reply, carries MULTI, WATCH and a half-received request,
//! and leaves the client registries right; shutdown with connections on
//! the move neither hangs nor leaks a client.

use std::io::Write;
use std::sync::atomic::Ordering;

use crate::common::*;

fn resp_cmd(args: &[&str]) -> Vec<u8> {
    let mut b = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    b
}

/// The worker the connection runs on now (and a move to `to` after this
/// batch, if that is another).
fn hop(c: &mut Resp, to: usize) -> i64 {
    match c.cmd(&["DEBUG", "MIGRATE", &to.to_string()]) {
        V::Int(w) => w,
        v => panic!("DEBUG MIGRATE answered {v:?}"),
    }
}

#[test]
fn pipelined_requests_cross_a_move_in_order() {
    let s = start();
    let port = s.resp_port().unwrap();
    let mut c = Resp::new(port);
    hop(&mut c, 0);
    assert_eq!(hop(&mut c, 0), 0, "on worker 0");
    // One write: the move, a request, and half of the next one, which
    // travels in the input buffer.
    let mut b = resp_cmd(&["DEBUG", "MIGRATE", "1"]);
    b.extend(resp_cmd(&["RPUSH", "l", "1"]));
    let second = resp_cmd(&["RPUSH", "l", "2"]);
    let (head, tail) = second.split_at(9);
    b.extend_from_slice(head);
    c.send(&b);
    assert_eq!(c.read(), V::Int(0));
    assert_eq!(c.read(), V::Int(1));
    let mut b = tail.to_vec();
    b.extend(resp_cmd(&["RPUSH", "l", "3"]));
    c.send(&b);
    assert_eq!(c.read(), V::Int(2));
    assert_eq!(c.read(), V::Int(3));
    assert_eq!(hop(&mut c, 1), 1, "moved to worker 1");
    // 2,000 pipelined INCRs with moves back and forth among them.
    let mut b = Vec::new();
    for i in 0..2000 {
        if i % 500 == 250 {
            b.extend(resp_cmd(&[
                "DEBUG",
                "MIGRATE",
                &((i / 500) % 2).to_string(),
            ]));
        }
        b.extend(resp_cmd(&["INCR", "n"]));
    }
    c.send(&b);
    for i in 0..2000 {
        if i % 500 == 250 {
            assert!(matches!(c.read(), V::Int(0 | 1)));
        }
        assert_eq!(c.read(), V::Int(i + 1), "reply {i}");
    }
    assert_eq!(
        c.cmd(&["LRANGE", "l", "0", "-1"]),
        V::Array(vec![bulk("1"), bulk("2"), bulk("3")])
    );
    let info = match c.cmd(&["INFO", "stats"]) {
        V::Bulk(b) => String::from_utf8(b).unwrap(),
        v => panic!("{v:?}"),
    };
    assert!(info_u64(&info, "migrated_clients") >= 1, "{info}");
    // One client, registered once.
    match c.cmd(&["CLIENT", "LIST"]) {
        V::Bulk(b) => assert_eq!(String::from_utf8_lossy(&b).lines().count(), 1),
        v => panic!("{v:?}"),
    }
    assert_eq!(s.shared().connected.load(Ordering::Relaxed), 1);
}

#[test]
fn multi_and_watch_cross_a_move() {
    let s = start();
    let port = s.resp_port().unwrap();
    let mut c = Resp::new(port);
    let mut other = Resp::new(port);
    let w = hop(&mut c, 0);
    let here = if w == 0 { 0 } else { hop(&mut c, 0) };
    assert_eq!(here, 0);
    // MULTI opened in the batch that moves: the queue travels.
    let mut b = resp_cmd(&["DEBUG", "MIGRATE", "1"]);
    b.extend(resp_cmd(&["MULTI"]));
    b.extend(resp_cmd(&["INCR", "m"]));
    c.send(&b);
    assert_eq!(c.read(), V::Int(0));
    assert_eq!(c.read(), V::Simple("OK".into()));
    assert_eq!(c.read(), V::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["INCR", "m"]), V::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["EXEC"]), V::Array(vec![V::Int(1), V::Int(2)]));
    assert_eq!(hop(&mut c, 1), 1);
    // WATCH taken on worker 1, EXEC on worker 0 after another client's
    // write: aborted.
    let mut b = resp_cmd(&["WATCH", "wk"]);
    b.extend(resp_cmd(&["DEBUG", "MIGRATE", "0"]));
    c.send(&b);
    assert_eq!(c.read(), V::Simple("OK".into()));
    assert_eq!(c.read(), V::Int(1));
    assert_eq!(other.cmd(&["SET", "wk", "x"]), V::Simple("OK".into()));
    assert_eq!(c.cmd(&["MULTI"]), V::Simple("OK".into()));
    assert_eq!(c.cmd(&["SET", "wk", "mine"]), V::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["EXEC"]), V::Null);
    assert_eq!(hop(&mut c, 0), 0);
    assert_eq!(c.cmd(&["GET", "wk"]), bulk("x"));
}

#[test]
fn blocked_pop_is_served_across_moves() {
    let s = start();
    let port = s.resp_port().unwrap();
    let mut consumer = Resp::new(port);
    let mut producer = Resp::new(port);
    let w = hop(&mut consumer, 0);
    if w != 0 {
        assert_eq!(hop(&mut consumer, 0), 0);
    }
    // The move waits for the blocked pop to be served: it is part of the
    // batch.
    let mut b = resp_cmd(&["DEBUG", "MIGRATE", "1"]);
    b.extend(resp_cmd(&["BLPOP", "bq", "10"]));
    consumer.send(&b);
    assert_eq!(consumer.read(), V::Int(0));
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(producer.cmd(&["LPUSH", "bq", "a"]), V::Int(1));
    assert_eq!(consumer.read(), V::Array(vec![bulk("bq"), bulk("a")]));
    assert_eq!(hop(&mut consumer, 1), 1, "moved after the pop");
    // Blocked on worker 1, the producer moving meanwhile.
    consumer.send(&resp_cmd(&["BLPOP", "bq", "10"]));
    std::thread::sleep(std::time::Duration::from_millis(50));
    hop(&mut producer, 1);
    hop(&mut producer, 0);
    assert_eq!(producer.cmd(&["RPUSH", "bq", "b"]), V::Int(1));
    assert_eq!(consumer.read(), V::Array(vec![bulk("bq"), bulk("b")]));
}

/// Many clients writing one key on two workers: whether or not key
/// affinity moves them (that depends on timing), every client gets each
/// reply once, in order, and the registries count every client once.
#[test]
fn one_key_clients_lose_no_reply() {
    let s = start();
    let port = s.resp_port().unwrap();
    const CLIENTS: usize = 12;
    const ROUNDS: usize = 300;
    let threads: Vec<_> = (0..CLIENTS)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Resp::new(port);
                for i in 0..ROUNDS {
                    // Pipelined pairs: the push and the client's own counter.
                    let mut b = resp_cmd(&["LPUSH", "hot", "x"]);
                    b.extend(resp_cmd(&["INCR", &format!("c{t}")]));
                    c.send(&b);
                    assert!(matches!(c.read(), V::Int(_)));
                    assert_eq!(c.read(), V::Int(i as i64 + 1));
                }
                c
            })
        })
        .collect();
    let conns: Vec<Resp> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let mut c = Resp::new(port);
    assert_eq!(c.cmd(&["LLEN", "hot"]), V::Int((CLIENTS * ROUNDS) as i64));
    assert_eq!(s.shared().client_list().len(), CLIENTS + 1);
    assert_eq!(s.shared().connected.load(Ordering::Relaxed), CLIENTS + 1);
    drop(conns);
}

/// Shutdown while connections hop between the workers: it completes,
/// every client sees its connection end, and no client stays registered.
#[test]
fn shutdown_with_moving_connections() {
    let s = start();
    let port = s.resp_port().unwrap();
    let shared = s.shared().clone();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = raw(port);
                let mut buf = [0u8; 4096];
                for i in 0usize.. {
                    let req = resp_cmd(&["DEBUG", "MIGRATE", &((i + t) % 2).to_string()]);
                    if c.write_all(&req).is_err() {
                        return;
                    }
                    match std::io::Read::read(&mut c, &mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(shared.totals().moved_in > 0);
    s.join();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(shared.connected.load(Ordering::Relaxed), 0);
    assert!(shared.client_list().is_empty());
}

/// memcached clients incrementing one key on two workers (moved or not,
/// by timing): every reply is one more than the client's last view
/// allows, none is lost, and the total is exact.
#[test]
fn one_key_memcached_clients_lose_no_reply() {
    let s = start();
    let port = s.memcached_port().unwrap();
    const CLIENTS: usize = 8;
    const ROUNDS: u64 = 300;
    let mut m = Mc::new(port);
    assert_eq!(m.req("set hot 0 0 1\r\n0\r\n"), "STORED");
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Mc::new(port);
                let mut last = 0u64;
                for _ in 0..ROUNDS {
                    let v: u64 = c.req("incr hot 1\r\n").parse().expect("a number");
                    assert!(v > last, "incr went from {last} to {v}");
                    last = v;
                }
                c
            })
        })
        .collect();
    let conns: Vec<Mc> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(
        m.req("incr hot 0\r\n"),
        (CLIENTS as u64 * ROUNDS).to_string()
    );
    assert_eq!(s.shared().connected.load(Ordering::Relaxed), CLIENTS + 1);
    drop(conns);
}

/// A connection on worker 0 that may move at once (its last move, if
/// any, is older than the least stay).
fn settled_on_0(port: u16) -> Resp {
    let mut c = Resp::new(port);
    if hop(&mut c, 0) != 0 {
        assert_eq!(hop(&mut c, 0), 0);
        std::thread::sleep(std::time::Duration::from_millis(
            server::migrate::MIN_STAY_MS + 50,
        ));
    }
    c
}

/// A client that blocks on a key owned by the other worker waits there:
/// it is served on the owner, and the request it pipelined behind the
/// blocking one runs after the reply, in order.
#[test]
fn a_blocked_client_waits_on_its_keys_owner() {
    let s = start();
    let port = s.resp_port().unwrap();
    let k = key_owned_by(1, "bq");
    let mut consumer = settled_on_0(port);
    let mut producer = Resp::new(port);
    let mut b = resp_cmd(&["BLPOP", &k, "10"]);
    b.extend(resp_cmd(&["RPUSH", "after", "x"]));
    consumer.send(&b);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let moved = s.shared().totals().moved_in;
    assert!(moved >= 1, "the blocked client moved");
    assert_eq!(producer.cmd(&["LPUSH", &k, "a"]), V::Int(1));
    assert_eq!(consumer.read(), V::Array(vec![bulk(&k), bulk("a")]));
    assert_eq!(consumer.read(), V::Int(1));
    assert_eq!(hop(&mut consumer, 1), 1, "on the key's owner");
    // A key its worker owns: it waits where it is.
    let own = key_owned_by(1, "own");
    consumer.send(&resp_cmd(&["BLPOP", &own, "10"]));
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(producer.cmd(&["RPUSH", &own, "b"]), V::Int(1));
    assert_eq!(consumer.read(), V::Array(vec![bulk(&own), bulk("b")]));
    assert_eq!(s.shared().totals().moved_in, moved);
    assert_eq!(s.shared().connected.load(Ordering::Relaxed), 2);
}

/// A blocked client that moved to its key's owner times out there, can
/// be unblocked there, and one that disconnects while it waits leaves
/// no waiter behind: a later push stays in the list.
#[test]
fn a_moved_blocked_client_times_out_unblocks_and_leaves() {
    let s = start();
    let port = s.resp_port().unwrap();
    let k = key_owned_by(1, "tq");
    let mut c = settled_on_0(port);
    assert_eq!(c.cmd(&["BLPOP", &k, "0.2"]), V::Null);
    assert_eq!(hop(&mut c, 1), 1);
    let mut d = settled_on_0(port);
    let id = match d.cmd(&["CLIENT", "ID"]) {
        V::Int(i) => i,
        v => panic!("{v:?}"),
    };
    d.send(&resp_cmd(&["BLPOP", &k, "0"]));
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut ctl = Resp::new(port);
    assert_eq!(
        ctl.cmd(&["CLIENT", "UNBLOCK", &id.to_string(), "ERROR"]),
        V::Int(1)
    );
    assert!(matches!(d.read(), V::Err(e) if e.starts_with("UNBLOCKED")));
    let mut e = settled_on_0(port);
    e.send(&resp_cmd(&["BLPOP", &k, "0"]));
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(e);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(ctl.cmd(&["RPUSH", &k, "kept"]), V::Int(1));
    assert_eq!(ctl.cmd(&["LLEN", &k]), V::Int(1));
}
