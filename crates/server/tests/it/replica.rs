//! Replication from a redis-server 7.0 primary (issue 25): full sync of
//! every type with TTLs (diskless `$EOF:` and disk `$<len>` payloads),
//! the command stream under concurrent mixed writes and MULTI/EXEC, a
//! partial resync after CLIENT KILL, READONLY, REPLICAOF NO ONE; and a
//! fake primary that sends a truncated payload, a damaged one and a
//! garbage stream.
//!
//! The tests that need redis-server print a SKIPPED line and pass where
//! it is not installed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::common::{client, cmd, err, info_u64, start_with};
use crate::rdb::{
    assert_same, populate_collections, populate_strings_hashes, redis_conn, redis_with, Dir,
};

/// INFO replication of a connection.
fn info_repl(con: &mut redis::Connection) -> String {
    redis::cmd("INFO").arg("replication").query(con).unwrap()
}

fn field(info: &str, f: &str) -> String {
    info.lines()
        .find_map(|l| l.strip_prefix(f)?.strip_prefix(':'))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// Wait until `cond` holds (panics after `secs` with `what`).
fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A reply, or `None` while the replica answers `-LOADING` (a full
/// resync in progress refuses data commands, as Redis does).
fn unless_loading<T>(r: redis::RedisResult<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if e.kind() == redis::ErrorKind::BusyLoadingError => None,
        Err(e) => panic!("{e}"),
    }
}

/// Wait until the replica's link is up and its offset is the primary's.
fn caught_up(primary: &mut redis::Connection, replica: &mut redis::Connection) {
    wait_for(30, "the replica to catch up", || {
        let r = info_repl(replica);
        let want = info_u64(&info_repl(primary), "master_repl_offset");
        field(&r, "master_link_status") == "up"
            && field(&r, "slave_repl_offset").parse::<u64>().ok() == Some(want)
    });
}

/// A few thousand mixed writes from `threads` connections, with
/// MULTI/EXEC blocks.
fn mixed_writes(port: u16, threads: usize, rounds: usize) {
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = redis_conn(port).unwrap();
                for i in 0..rounds {
                    let mut p = redis::pipe();
                    let k = i % 50;
                    p.cmd("INCR").arg(format!("ctr:{k}"));
                    p.cmd("LPUSH")
                        .arg(format!("list:{}", k % 7))
                        .arg(format!("{t}-{i}"));
                    p.cmd("ZADD")
                        .arg(format!("z:{}", k % 5))
                        .arg(i as f64 / 7.0)
                        .arg(format!("m{}", i % 90));
                    p.cmd("HSET")
                        .arg(format!("h:{}", k % 9))
                        .arg(format!("f{}", i % 40))
                        .arg(i);
                    p.cmd("SADD").arg(format!("s:{}", k % 4)).arg(i % 300);
                    p.cmd("SET")
                        .arg(format!("str:{t}:{k}"))
                        .arg(i)
                        .arg("EX")
                        .arg(3000);
                    if i % 5 == 0 {
                        p.cmd("DEL").arg(format!("ctr:{}", (k + 1) % 50));
                        p.cmd("SREM").arg(format!("s:{}", k % 4)).arg((i + 7) % 300);
                        p.cmd("RPOP").arg(format!("list:{}", k % 7));
                        p.cmd("HINCRBY").arg(format!("h:{}", k % 9)).arg("n").arg(3);
                        p.cmd("INCRBYFLOAT").arg("float").arg("0.5");
                        p.cmd("ZINCRBY")
                            .arg(format!("z:{}", k % 5))
                            .arg(2)
                            .arg("m1");
                    }
                    if i % 7 == 0 {
                        p.cmd("EXPIRE").arg(format!("h:{}", k % 9)).arg(9000);
                        p.cmd("PEXPIRE").arg(format!("list:{}", k % 7)).arg(800_000);
                    }
                    p.query::<()>(&mut c).unwrap();
                    if i % 10 == 0 {
                        let _: () = redis::pipe()
                            .atomic()
                            .cmd("INCRBY")
                            .arg("tx:a")
                            .arg(5)
                            .cmd("DECRBY")
                            .arg("tx:b")
                            .arg(5)
                            .cmd("RPUSH")
                            .arg("tx:log")
                            .arg(format!("{t}:{i}"))
                            .cmd("HSET")
                            .arg("tx:h")
                            .arg(format!("t{t}"))
                            .arg(i)
                            .query(&mut c)
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn replica_follows_redis_primary() {
    let dir = Dir::new("replica");
    let Some(primary) = redis_with(
        "replica_follows_redis_primary",
        &dir.0,
        &["--repl-diskless-sync-delay", "0"],
    ) else {
        return;
    };
    let mut pc = redis_conn(primary.port).unwrap();
    populate_strings_hashes(&mut pc);
    populate_collections(&mut pc);
    let s = start_with(|c| {
        c.capacity = 64 << 20;
        c.replica.replicaof = Some(("127.0.0.1".into(), primary.port));
    });
    let mut rc = client(&s);
    // Full sync (Redis 7.0's default is diskless: the `$EOF:` form).
    caught_up(&mut pc, &mut rc);
    let n = assert_same(&mut pc, &mut rc);
    assert!(n > 900, "{n} keys");
    let role: redis::Value = cmd(&mut rc, &["ROLE"]).unwrap();
    assert!(format!("{role:?}").contains("slave"), "{role:?}");
    let ri = info_repl(&mut rc);
    assert_eq!(field(&ri, "role"), "slave");
    assert_eq!(field(&ri, "master_port"), primary.port.to_string());
    assert_eq!(field(&ri, "master_sync_in_progress"), "0");
    assert_eq!(
        field(&ri, "master_replid"),
        field(&info_repl(&mut pc), "master_replid")
    );

    // A read-only replica refuses writes with Redis's error, reads work.
    assert_eq!(
        err(&mut rc, &["SET", "x", "1"]),
        "READONLY You can't write against a read only replica."
    );
    assert_eq!(
        err(&mut rc, &["DEL", "str:1"]),
        "READONLY You can't write against a read only replica."
    );
    let v: String = redis::cmd("GET").arg("str:1").query(&mut rc).unwrap();
    assert_eq!(v, "v1");
    // Inside MULTI the write is refused when queued, and EXEC aborts.
    let _: () = redis::cmd("MULTI").query(&mut rc).unwrap();
    assert_eq!(
        err(&mut rc, &["INCR", "ctr"]),
        "READONLY You can't write against a read only replica."
    );
    assert!(err(&mut rc, &["EXEC"]).starts_with("EXECABORT"));

    // The command stream under concurrent mixed writes and MULTI/EXEC.
    mixed_writes(primary.port, 3, 700);
    caught_up(&mut pc, &mut rc);
    assert_same(&mut pc, &mut rc);
    assert_eq!(
        info_u64(&info_repl(&mut rc), "nibble_repl_command_errors"),
        0
    );

    // Kill the link: the replica resyncs partially (+CONTINUE).
    let pinfo = |pc: &mut redis::Connection| -> String {
        redis::cmd("INFO").arg("stats").query(pc).unwrap()
    };
    let partial0 = info_u64(&pinfo(&mut pc), "sync_partial_ok");
    let full0 = info_u64(&pinfo(&mut pc), "sync_full");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut pc)
        .unwrap();
    assert_eq!(killed, 1);
    mixed_writes(primary.port, 2, 200);
    caught_up(&mut pc, &mut rc);
    assert_same(&mut pc, &mut rc);
    assert_eq!(info_u64(&pinfo(&mut pc), "sync_partial_ok"), partial0 + 1);
    assert_eq!(info_u64(&pinfo(&mut pc), "sync_full"), full0);
    assert_eq!(
        info_u64(&info_repl(&mut rc), "nibble_repl_partial_syncs"),
        1
    );

    // REPLICAOF NO ONE: writable, data kept.
    assert_eq!(
        redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query::<String>(&mut rc)
            .unwrap(),
        "OK"
    );
    assert_eq!(field(&info_repl(&mut rc), "role"), "master");
    let _: () = redis::cmd("SET")
        .arg("mine")
        .arg("1")
        .query(&mut rc)
        .unwrap();
    let v: String = redis::cmd("GET").arg("str:1").query(&mut rc).unwrap();
    assert_eq!(v, "v1");

    // Follow again with disk-based sync (the `$<len>` form): a full sync
    // that drops what the replica wrote on its own.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync")
        .arg("no")
        .query(&mut pc)
        .unwrap();
    let ok: String = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut rc)
        .unwrap();
    assert_eq!(ok, "OK");
    mixed_writes(primary.port, 1, 100);
    caught_up(&mut pc, &mut rc);
    assert_same(&mut pc, &mut rc);
    assert_eq!(info_u64(&info_repl(&mut rc), "nibble_repl_full_syncs"), 2);
    let ok: String = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut rc)
        .unwrap();
    assert_eq!(ok, "OK Already connected to specified master");
}

#[test]
fn replica_with_primary_password() {
    let dir = Dir::new("replica-auth");
    let Some(primary) = redis_with(
        "replica_with_primary_password",
        &dir.0,
        &["--repl-diskless-sync-delay", "0", "--requirepass", "s3cret"],
    ) else {
        return;
    };
    let url = format!("redis://:s3cret@127.0.0.1:{}/", primary.port);
    let mut pc = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut pc).unwrap();
    // No masterauth: the link stays down with the primary's refusal.
    let s = start_with(|c| {
        c.replica.replicaof = Some(("127.0.0.1".into(), primary.port));
        c.replica.read_only = false;
    });
    let mut rc = client(&s);
    wait_for(10, "the refusal", || {
        field(&info_repl(&mut rc), "nibble_repl_last_error").contains("NOAUTH")
    });
    // A writable replica (replica-read-only no) takes writes.
    let _: () = redis::cmd("SET")
        .arg("local")
        .arg("1")
        .query(&mut rc)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("masterauth")
        .arg("s3cret")
        .query(&mut rc)
        .unwrap();
    caught_up(&mut pc, &mut rc);
    assert_same(&mut pc, &mut rc);
    // An ACL user (masteruser): the next connection authenticates as it.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("repl")
        .arg("on")
        .arg(">pw2")
        .arg("~*")
        .arg("+@all")
        .query(&mut pc)
        .unwrap();
    for (k, v) in [("masteruser", "repl"), ("masterauth", "pw2")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(k)
            .arg(v)
            .query(&mut rc)
            .unwrap();
    }
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut pc)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("k2")
        .arg("v2")
        .query(&mut pc)
        .unwrap();
    wait_for(10, "the replica to come back as user repl", || {
        let l: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("replica")
            .query(&mut pc)
            .unwrap();
        l.contains("user=repl")
    });
    caught_up(&mut pc, &mut rc);
    assert_same(&mut pc, &mut rc);
}

/// Read one RESP command (array of bulks) from a fake primary's client.
fn read_cmd(r: &mut BufReader<TcpStream>) -> Option<Vec<String>> {
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::new();
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut b = vec![0; len + 2];
        r.read_exact(&mut b).ok()?;
        b.truncate(len);
        args.push(String::from_utf8_lossy(&b).into_owned());
    }
    Some(args)
}

/// Answer the handshake up to PSYNC; returns the PSYNC arguments.
fn fake_handshake(r: &mut BufReader<TcpStream>, w: &mut TcpStream) -> Vec<String> {
    loop {
        let c = read_cmd(r).expect("handshake command");
        match c[0].to_ascii_uppercase().as_str() {
            "PING" => w.write_all(b"+PONG\r\n").unwrap(),
            "PSYNC" => return c,
            _ => w.write_all(b"+OK\r\n").unwrap(),
        }
    }
}

/// A valid RDB (checksum 0 = not checked, as `rdbchecksum no` writes)
/// holding string `k` = `v`.
fn tiny_rdb(k: &str, v: &str) -> Vec<u8> {
    let mut b = b"REDIS0010".to_vec();
    b.push(0);
    b.push(k.len() as u8);
    b.extend_from_slice(k.as_bytes());
    b.push(v.len() as u8);
    b.extend_from_slice(v.as_bytes());
    b.push(0xFF);
    b.extend_from_slice(&[0; 8]);
    b
}

#[test]
fn bad_primary_input_is_refused_and_retried() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let s = start_with(|c| {
        c.replica.replicaof = Some(("127.0.0.1".into(), port));
    });
    let mut rc = client(&s);
    let id = "a".repeat(40);
    let last_error = |rc: &mut redis::Connection, want: &str| {
        wait_for(10, want, || {
            field(&info_repl(rc), "nibble_repl_last_error").contains(want)
        });
        // Down, and the server still answers.
        assert_eq!(field(&info_repl(rc), "master_link_status"), "down");
        let pong: String = redis::cmd("PING").query(rc).unwrap();
        assert_eq!(pong, "PONG");
    };
    let accept = || {
        let (w, _) = l.accept().unwrap();
        w.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = BufReader::new(w.try_clone().unwrap());
        let mut w = w;
        let psync = fake_handshake(&mut r, &mut w);
        (r, w, psync)
    };
    // 1. A truncated payload: 100 of 1000 bytes, then close.
    {
        let (_r, mut w, psync) = accept();
        assert_eq!(psync[1..], ["?".to_string(), "-1".to_string()]);
        w.write_all(format!("+FULLRESYNC {id} 0\r\n\n\n$1000\r\n").as_bytes())
            .unwrap();
        w.write_all(&tiny_rdb("k", "v")[..10]).unwrap();
    }
    last_error(&mut rc, "RDB payload truncated");
    // 2. A damaged payload of the announced length (diskless form).
    {
        let (_r, mut w, _) = accept();
        let mark = "m".repeat(40);
        w.write_all(
            format!("+FULLRESYNC {id} 0\r\n$EOF:{mark}\r\nREDIS0010garbage{mark}").as_bytes(),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    last_error(&mut rc, "bad RDB payload");
    // 3. A good payload, then garbage in the command stream.
    {
        let (_r, mut w, _) = accept();
        let rdb = tiny_rdb("k", "v");
        w.write_all(format!("+FULLRESYNC {id} 0\r\n${}\r\n", rdb.len()).as_bytes())
            .unwrap();
        w.write_all(&rdb).unwrap();
        w.write_all(b"*2\r\n$3\r\nDEL\r\n$1\r\nzz\r\n*1x\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    last_error(&mut rc, "protocol error in the command stream");
    let v: String = redis::cmd("GET").arg("k").query(&mut rc).unwrap();
    assert_eq!(v, "v");
    // 4. A good sync and stream; then a dropped link resumes with
    //    PSYNC <replid> <offset+1>.
    let stream = b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\nb\r\n";
    {
        let (_r, mut w, psync) = accept();
        assert_eq!(psync[1], "?", "a failed stream forgets the replid");
        let rdb = tiny_rdb("k", "v2");
        w.write_all(format!("+FULLRESYNC {id} 100\r\n${}\r\n", rdb.len()).as_bytes())
            .unwrap();
        w.write_all(&rdb).unwrap();
        w.write_all(stream).unwrap();
        wait_for(10, "the stream", || {
            unless_loading(redis::cmd("GET").arg("a").query::<Option<String>>(&mut rc))
                .flatten()
                .is_some()
        });
        let ri = info_repl(&mut rc);
        assert_eq!(field(&ri, "master_link_status"), "up");
        assert_eq!(
            field(&ri, "slave_repl_offset"),
            (100 + stream.len()).to_string()
        );
        // The link drops inside a MULTI block: not counted.
        w.write_all(b"*1\r\n$5\r\nMULTI\r\n*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$1\r\n1\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    let (_r, mut w, psync) = accept();
    assert_eq!(
        psync[1..],
        [id.clone(), (100 + stream.len() + 1).to_string()]
    );
    w.write_all(b"+CONTINUE\r\n*1\r\n$5\r\nMULTI\r\n*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$1\r\n1\r\n*1\r\n$4\r\nEXEC\r\n*2\r\n$3\r\nDEL\r\n$1\r\nk\r\n")
        .unwrap();
    wait_for(10, "the partial resync", || {
        unless_loading(redis::cmd("EXISTS").arg("k").query::<i64>(&mut rc)) == Some(0)
    });
    let x: String = redis::cmd("GET").arg("x").query(&mut rc).unwrap();
    assert_eq!(x, "1");
    assert_eq!(
        info_u64(&info_repl(&mut rc), "nibble_repl_partial_syncs"),
        1
    );
    assert_eq!(info_u64(&info_repl(&mut rc), "nibble_repl_full_syncs"), 2);
}
