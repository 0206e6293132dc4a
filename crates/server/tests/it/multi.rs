//! Transactions and pub/sub under concurrency: no lost update with the
//! WATCH/MULTI/EXEC optimistic counter, WATCH invalidated by memcached
//! writes, EXEC atomic against readers on other workers, a slow
//! subscriber disconnected with the server's memory bounded.

use std::time::{Duration, Instant};

use crate::common::{
    bulk, client, cmd, drain_until_closed, q, stalled_subscriber, start, Mc, Resp, V,
};

/// Two clients (on the two workers) increment one key by GET, then
/// WATCH/MULTI/SET/EXEC, retrying on a null EXEC: every increment lands.
#[test]
fn optimistic_counter_loses_no_update() {
    let s = start();
    let port = s.resp_port().unwrap();
    const PER_CLIENT: i64 = 500;
    let hs: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Resp::new(port);
                let mut retries = 0;
                for _ in 0..PER_CLIENT {
                    loop {
                        assert_eq!(c.cmd(&["WATCH", "ctr"]), V::Simple("OK".into()));
                        let v = match c.cmd(&["GET", "ctr"]) {
                            V::Bulk(b) => String::from_utf8(b).unwrap().parse::<i64>().unwrap(),
                            _ => 0,
                        };
                        c.cmd(&["MULTI"]);
                        let n = (v + 1).to_string();
                        assert_eq!(c.cmd(&["SET", "ctr", &n]), V::Simple("QUEUED".into()));
                        match c.cmd(&["EXEC"]) {
                            V::Array(_) => break,
                            V::Null => retries += 1,
                            other => panic!("EXEC: {other:?}"),
                        }
                    }
                }
                retries
            })
        })
        .collect();
    let retries: i32 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    let mut c = client(&s);
    let total: i64 = q(&mut c, &["GET", "ctr"]);
    assert_eq!(total, 2 * PER_CLIENT, "{retries} retries");
}

/// MULTI INCR a INCR b against MGET a b on the other worker: a reader
/// never sees one increment without the other.
#[test]
fn exec_is_atomic_for_readers() {
    let s = start();
    let port = s.resp_port().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = Resp::new(port);
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.send(b"*1\r\n$5\r\nMULTI\r\n*2\r\n$4\r\nINCR\r\n$1\r\na\r\n*2\r\n$4\r\nINCR\r\n$1\r\nb\r\n*1\r\n$4\r\nEXEC\r\n");
                for _ in 0..3 {
                    c.read();
                }
                assert!(matches!(c.read(), V::Array(_)));
                n += 1;
            }
            n
        })
    };
    let mut r = Resp::new(port);
    let t = Instant::now();
    let mut reads = 0;
    while t.elapsed() < Duration::from_millis(500) {
        if let V::Array(v) = r.cmd(&["MGET", "a", "b"]) {
            assert_eq!(v[0], v[1], "torn transaction seen");
        }
        reads += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let n = writer.join().unwrap();
    assert!(n > 0 && reads > 0);
}

/// Writes through every memcached path dirty a WATCH on the key.
#[test]
fn memcached_writes_invalidate_watch() {
    let s = start();
    let port = s.resp_port().unwrap();
    let mut mc = Mc::new(s.memcached_port().unwrap());
    let mut c = Resp::new(port);
    for (i, write) in [
        "set k 0 0 1\r\n5\r\n",
        "delete k\r\n",
        "incr k 1\r\n",
        "touch k 100\r\n",
        "ms k 1\r\n7\r\n",
        "md k\r\n",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(c.cmd(&["SET", "k", "1"]), V::Simple("OK".into()));
        c.cmd(&["WATCH", "k"]);
        mc.req(write);
        c.cmd(&["MULTI"]);
        c.cmd(&["GET", "k"]);
        assert_eq!(c.cmd(&["EXEC"]), V::Null, "case {i}: {write:?}");
    }
    // A memcached read does not.
    c.cmd(&["SET", "k", "1"]);
    c.cmd(&["WATCH", "k"]);
    mc.send(b"get k\r\n");
    mc.until_end();
    c.cmd(&["MULTI"]);
    c.cmd(&["GET", "k"]);
    assert_eq!(c.cmd(&["EXEC"]), V::Array(vec![bulk("1")]));
}

/// A watched key that expires between WATCH and EXEC dirties it; one
/// whose TTL is still running does not.
#[test]
fn watched_key_expiry_dirties_exec() {
    let s = start();
    let mut c = Resp::new(s.resp_port().unwrap());
    c.cmd(&["SET", "e", "1", "PX", "100"]);
    c.cmd(&["WATCH", "e"]);
    std::thread::sleep(Duration::from_millis(250));
    c.cmd(&["MULTI"]);
    c.cmd(&["SET", "e", "2"]);
    assert_eq!(c.cmd(&["EXEC"]), V::Null);
    c.cmd(&["SET", "f", "1", "EX", "100"]);
    c.cmd(&["WATCH", "f"]);
    c.cmd(&["MULTI"]);
    c.cmd(&["GET", "f"]);
    assert_eq!(c.cmd(&["EXEC"]), V::Array(vec![bulk("1")]));
}

/// PUBLISH counts receivers on both workers; a subscriber's disconnect
/// removes it; CLIENT LIST shows the subscription.
#[test]
fn publish_reaches_subscribers_on_every_worker() {
    let s = start();
    let port = s.resp_port().unwrap();
    let mut subs: Vec<Resp> = (0..4).map(|_| Resp::new(port)).collect();
    for (i, sub) in subs.iter_mut().enumerate() {
        let r = sub.cmd(&["SUBSCRIBE", "news"]);
        assert_eq!(
            r,
            V::Array(vec![bulk("subscribe"), bulk("news"), V::Int(1)]),
            "{i}"
        );
    }
    let mut c = client(&s);
    let n: i64 = q(&mut c, &["PUBLISH", "news", "hello"]);
    assert_eq!(n, 4);
    for sub in &mut subs {
        assert_eq!(
            sub.read(),
            V::Array(vec![bulk("message"), bulk("news"), bulk("hello")])
        );
    }
    let list: String = q(&mut c, &["CLIENT", "LIST"]);
    assert!(list.contains("flags=P db=0 sub=1 psub=0"), "{list}");
    drop(subs);
    let t = Instant::now();
    loop {
        let n: i64 = q(&mut c, &["PUBLISH", "news", "x"]);
        if n == 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "subscribers not removed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = cmd(&mut c, &["PING"]);
}

/// A subscriber that never reads while a publisher floods: it is closed
/// at the output buffer limit, unsubscribed, and the server's RSS stays
/// within the limit plus slack.
#[test]
fn slow_subscriber_is_disconnected_and_memory_bounded() {
    let s = start();
    let port = s.resp_port().unwrap();
    let mut slow = stalled_subscriber(port, "feed");
    let rss0 = server::state::rss_bytes();
    let payload = "x".repeat(16 << 10);
    let mut p = Resp::new(port);
    let mut c = client(&s);
    // 200 MB offered, far past the 32 MB hard limit.
    let mut max_rss = 0;
    for round in 0..100 {
        let mut batch = Vec::new();
        for _ in 0..800 {
            batch.extend_from_slice(
                format!(
                    "*3\r\n$7\r\nPUBLISH\r\n$4\r\nfeed\r\n${}\r\n{payload}\r\n",
                    payload.len()
                )
                .as_bytes(),
            );
        }
        p.send(&batch);
        for _ in 0..800 {
            p.read();
        }
        max_rss = max_rss.max(server::state::rss_bytes());
        let (_, n): (String, i64) = q(&mut c, &["PUBSUB", "NUMSUB", "feed"]);
        if n == 0 {
            eprintln!(
                "subscriber dropped after round {round}, RSS growth {} MB",
                (max_rss.saturating_sub(rss0)) >> 20
            );
            break;
        }
        assert!(round < 99, "slow subscriber never disconnected");
    }
    assert!(
        max_rss.saturating_sub(rss0) < 160 << 20,
        "RSS grew by {} MB",
        (max_rss - rss0) >> 20
    );
    // The subscriber's socket reaches its end after what was sent.
    drain_until_closed(&mut slow);
}
