//! `client-output-buffer-limit`: CONFIG SET/GET against redis-server,
//! the pubsub class applied at run time (a subscriber that never reads
//! is closed at the configured limit, `omem` shows its backlog, memory
//! stays bounded), and the normal class's hard limit.

use std::time::{Duration, Instant};

use crate::common::{client, drain_until_closed, q, stalled_subscriber, start, Resp, V};
use crate::differential::harness::{Cmp, Pair, Step};

fn config_set(v: &str) -> Step {
    Step {
        args: vec![
            b"CONFIG".to_vec(),
            b"SET".to_vec(),
            b"client-output-buffer-limit".to_vec(),
            v.as_bytes().to_vec(),
        ],
        cmp: Cmp::Exact,
    }
}

#[test]
fn output_buffer_limit_config_matches_redis() {
    let Some(mut p) = Pair::start("output_buffer_limit_config_matches_redis") else {
        return;
    };
    let get = Step {
        args: vec![
            b"CONFIG".to_vec(),
            b"GET".to_vec(),
            b"client-output-buffer-limit".to_vec(),
        ],
        cmp: Cmp::Exact,
    };
    p.check(&get, "defaults");
    for v in [
        "normal 1mb 512kb 10",
        "pubsub 1 2",
        "pubsub x 1 1",
        "foo 1 1 1",
        "pubsub 1 1 -1",
        "pubsub 2 1 1",
        "replica 1 1 1 normal 2 2 2",
        "slave 3 3 3",
        "",
        "PUBSUB 4kb 1kb 0",
    ] {
        p.check(&config_set(v), v);
        p.check(&get, v);
    }
    p.check(
        &config_set("normal 0 0 0 slave 256mb 64mb 60 pubsub 32mb 8mb 60"),
        "restore",
    );
    p.check(&get, "restored");
}

#[test]
fn a_configured_pubsub_limit_closes_a_slow_subscriber() {
    let s = start();
    let port = s.resp_port().unwrap();
    let mut c = client(&s);
    let _: () = q(
        &mut c,
        &[
            "CONFIG",
            "SET",
            "client-output-buffer-limit",
            "pubsub 2mb 1mb 60",
        ],
    );
    let mut slow = stalled_subscriber(port, "feed");
    let rss0 = server::state::rss_bytes();
    let payload = "x".repeat(16 << 10);
    let mut p = Resp::new(port);
    let mut max_omem = 0u64;
    let t = Instant::now();
    let mut max_rss = 0;
    loop {
        let n = match p.cmd(&["PUBLISH", "feed", &payload]) {
            V::Int(n) => n,
            v => panic!("{v:?}"),
        };
        if n == 0 {
            break;
        }
        let list: String = q(&mut c, &["CLIENT", "LIST"]);
        for l in list.lines().filter(|l| l.contains("sub=1")) {
            let omem = l
                .split(' ')
                .find_map(|f| f.strip_prefix("omem="))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            max_omem = max_omem.max(omem);
        }
        max_rss = max_rss.max(server::state::rss_bytes());
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "slow subscriber never disconnected"
        );
    }
    // The backlog was visible as omem and never passed the 2 MB limit
    // by more than one message.
    assert!(max_omem > 0, "CLIENT LIST never showed the backlog as omem");
    assert!(
        max_omem <= (2 << 20) + (17 << 10),
        "omem reached {max_omem}"
    );
    // Other tests' servers share this process: a loose bound.
    assert!(
        max_rss.saturating_sub(rss0) < 160 << 20,
        "RSS grew by {} MB",
        (max_rss.saturating_sub(rss0)) >> 20
    );
    let got = drain_until_closed(&mut slow);
    assert!(got < 32 << 20, "the subscriber received {got} bytes");
}

#[test]
fn the_normal_hard_limit_closes_a_client_with_a_huge_reply() {
    let s = start();
    let port = s.resp_port().unwrap();
    let mut c = client(&s);
    let _: () = q(&mut c, &["SET", "big", &"v".repeat(300 << 10)]);
    let _: () = q(
        &mut c,
        &[
            "CONFIG",
            "SET",
            "client-output-buffer-limit",
            "normal 256kb 0 0",
        ],
    );
    let mut r = Resp::new(port);
    assert_eq!(r.cmd(&["SET", "small", "x"]), V::Simple("OK".into()));
    r.send(b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n");
    assert!(r.closed(), "a 300 KB reply passed a 256 KB hard limit");
    let _: () = q(
        &mut c,
        &[
            "CONFIG",
            "SET",
            "client-output-buffer-limit",
            "normal 0 0 0",
        ],
    );
    let v: String = q(&mut c, &["GET", "big"]);
    assert_eq!(v.len(), 300 << 10);
}
