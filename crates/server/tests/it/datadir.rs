//! `--data-dir`: the server over a shared, restartable store (issue 8).
//!
//! * A representative subset of the command tests against the shared
//!   engine, in process (strings with SET's options, INCR/APPEND, expiry,
//!   hashes, memcached cas/add/replace, SCAN/KEYS, DBSIZE/FLUSHALL, OOM).
//! * The real binary: a clean restart (SHUTDOWN, then SIGTERM) serves every
//!   acknowledged write with its TTL, flags and type; a SIGKILL while a
//!   client writes, then a restart, serves every acknowledged write whole;
//!   and while the server runs, this test process attaches the same store
//!   directly (`nibblejmp::SharedStore::attach`) and the two see each
//!   other's writes.
//! * Damaged files of a stopped store (issue 25): a flipped value byte is
//!   an error for that key, never served; truncated files are refused with
//!   a message and an error status, never a SIGBUS; 1000 bit flips in the
//!   index are caught by the shutdown seal and the index rebuilt, every
//!   key served.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{client, cmd, err, q, ready_port, start_with, wait_ready, Mc};

const BIN: &str = env!("CARGO_BIN_EXE_nibble");

/// A store directory on tmpfs, removed when dropped.
struct DataDir(PathBuf);

impl DataDir {
    fn new(tag: &str) -> DataDir {
        use std::sync::atomic::AtomicU32;
        static N: AtomicU32 = AtomicU32::new(0);
        let p = PathBuf::from(format!(
            "/dev/shm/nibble-server-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        DataDir(p)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn info_field(c: &mut redis::Connection, section: &str, name: &str) -> String {
    let text: String = q(c, &["INFO", section]);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in INFO {section}:\n{text}"))
        .trim()
        .to_string()
}

/// This test process attaches the store directly, without a compaction
/// thread of its own (the server's does the compacting).
fn attach_quiet(dir: &Path) -> nibblejmp::SharedStore {
    nibblejmp::SharedStore::attach(
        dir,
        &nibblejmp::Options {
            compaction_thread: false,
            ..nibblejmp::Options::default()
        },
    )
    .unwrap()
}

#[test]
fn commands_on_the_shared_engine() {
    let d = DataDir::new("cmds");
    let s = start_with(|c| c.data_dir = Some(d.0.clone()));
    let mut c = client(&s);
    assert_eq!(info_field(&mut c, "server", "engine"), "shared");
    assert_eq!(info_field(&mut c, "server", "store_start"), "created");
    assert_eq!(
        info_field(&mut c, "server", "data_dir"),
        d.0.display().to_string()
    );
    // Strings and SET's options.
    assert_eq!(q::<String>(&mut c, &["SET", "s", "v1"]), "OK");
    assert_eq!(q::<Option<String>>(&mut c, &["SET", "s", "v2", "NX"]), None);
    assert_eq!(q::<Option<String>>(&mut c, &["SET", "nx", "a", "XX"]), None);
    assert_eq!(
        q::<Option<String>>(&mut c, &["SET", "s", "v3", "XX", "GET"]),
        Some("v1".into())
    );
    assert_eq!(q::<String>(&mut c, &["SET", "s", "v4", "EX", "100"]), "OK");
    assert_eq!(q::<String>(&mut c, &["SET", "s", "v5", "KEEPTTL"]), "OK");
    let ttl: i64 = q(&mut c, &["TTL", "s"]);
    assert!((90..=100).contains(&ttl), "{ttl}");
    assert_eq!(q::<String>(&mut c, &["GET", "s"]), "v5");
    assert_eq!(q::<i64>(&mut c, &["INCR", "n"]), 1);
    assert_eq!(q::<i64>(&mut c, &["INCRBY", "n", "41"]), 42);
    assert_eq!(q::<i64>(&mut c, &["APPEND", "n", "0"]), 3);
    assert_eq!(q::<String>(&mut c, &["GET", "n"]), "420");
    assert_eq!(q::<String>(&mut c, &["GETSET", "n", "x"]), "420");
    assert!(err(&mut c, &["INCR", "n"]).contains("not an integer"));
    assert_eq!(q::<i64>(&mut c, &["SETNX", "n", "y"]), 0);
    assert_eq!(q::<String>(&mut c, &["MSET", "m1", "1", "m2", "2"]), "OK");
    assert_eq!(
        q::<Vec<Option<String>>>(&mut c, &["MGET", "m1", "m2", "m3"]),
        vec![Some("1".into()), Some("2".into()), None]
    );
    assert_eq!(
        q::<Option<String>>(&mut c, &["GETDEL", "m2"]),
        Some("2".into())
    );
    // Expiry: invisible at once when it passes.
    assert_eq!(q::<String>(&mut c, &["SET", "e", "1", "PX", "150"]), "OK");
    assert_eq!(q::<i64>(&mut c, &["EXISTS", "e"]), 1);
    assert_eq!(q::<i64>(&mut c, &["PEXPIRE", "m1", "100000"]), 1);
    assert_eq!(q::<i64>(&mut c, &["PERSIST", "m1"]), 1);
    assert_eq!(q::<i64>(&mut c, &["TTL", "m1"]), -1);
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(q::<Option<String>>(&mut c, &["GET", "e"]), None);
    assert_eq!(q::<i64>(&mut c, &["TTL", "e"]), -2);
    // Hashes and types.
    assert_eq!(q::<i64>(&mut c, &["HSET", "h", "f1", "a", "f2", "b"]), 2);
    assert_eq!(q::<i64>(&mut c, &["HINCRBY", "h", "n", "5"]), 5);
    assert_eq!(q::<String>(&mut c, &["HGET", "h", "f2"]), "b");
    assert_eq!(q::<i64>(&mut c, &["HDEL", "h", "f1"]), 1);
    let all: HashMap<String, String> = q(&mut c, &["HGETALL", "h"]);
    assert_eq!(all.len(), 2);
    assert_eq!(q::<String>(&mut c, &["TYPE", "h"]), "hash");
    assert!(err(&mut c, &["GET", "h"]).starts_with("WRONGTYPE"));
    // Keys.
    let mut keys: Vec<String> = q(&mut c, &["KEYS", "*"]);
    keys.sort();
    assert_eq!(keys, vec!["h", "m1", "n", "s"]);
    let mut seen = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, ks): (String, Vec<String>) =
            q(&mut c, &["SCAN", &cursor, "MATCH", "m*", "COUNT", "2"]);
        seen.extend(ks);
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert_eq!(seen, vec!["m1"]);
    // The expired key stays indexed until compaction or a delete reclaims
    // it (as with the local engine); DEL removes it and reports 0.
    assert_eq!(q::<i64>(&mut c, &["DEL", "e"]), 0);
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 4);
    assert_eq!(q::<String>(&mut c, &["RENAME", "m1", "m9"]), "OK");
    assert_eq!(q::<String>(&mut c, &["GET", "m9"]), "1");
    // memcached over the same store.
    let mut m = Mc::new(s.memcached_port().unwrap());
    assert_eq!(m.req("set a 5 0 1\r\nx\r\n"), "STORED");
    assert_eq!(m.req("add a 0 0 1\r\ny\r\n"), "NOT_STORED");
    assert_eq!(m.req("replace zz 0 0 1\r\ny\r\n"), "NOT_STORED");
    assert_eq!(m.req("replace a 6 0 1\r\ny\r\n"), "STORED");
    m.send(b"gets a\r\n");
    let v = m.until_end();
    assert_eq!(v[1], "y");
    let cas: u64 = v[0].split(' ').nth(4).unwrap().parse().unwrap();
    assert!(v[0].starts_with("VALUE a 6 1 "), "{v:?}");
    assert_eq!(m.req("touch a 1000\r\n"), "TOUCHED");
    assert_eq!(
        m.req(&format!("cas a 7 0 1 {}\r\nz\r\n", cas + 1)),
        "EXISTS"
    );
    assert_eq!(m.req(&format!("cas a 7 0 1 {cas}\r\nz\r\n")), "STORED");
    assert_eq!(m.req(&format!("cas a 7 0 1 {cas}\r\nw\r\n")), "EXISTS");
    assert_eq!(m.req("incr n2 1\r\n"), "NOT_FOUND");
    assert_eq!(m.req("set n2 0 0 1\r\n9\r\n"), "STORED");
    assert_eq!(m.req("incr n2 1\r\n"), "10");
    assert_eq!(m.req("append n2 0 0 1\r\n0\r\n"), "STORED");
    m.send(b"get n2\r\n");
    assert_eq!(m.until_end()[1], "100");
    // Concurrent read-modify-writes lose nothing (compare-and-swap on the
    // shared item's version).
    std::thread::scope(|sc| {
        for _ in 0..3 {
            sc.spawn(|| {
                let mut c = client(&s);
                for _ in 0..200 {
                    let _: i64 = q(&mut c, &["INCR", "race"]);
                    let _: i64 = q(&mut c, &["HINCRBY", "hrace", "f", "1"]);
                }
            });
        }
    });
    assert_eq!(q::<i64>(&mut c, &["GET", "race"]), 600);
    assert_eq!(q::<i64>(&mut c, &["HGET", "hrace", "f"]), 600);
    // Bitmaps and DUMP/RESTORE on the shared engine.
    assert_eq!(q::<i64>(&mut c, &["SETBIT", "bits", "9", "1"]), 0);
    assert_eq!(q::<i64>(&mut c, &["BITCOUNT", "bits"]), 1);
    let dump: Vec<u8> = q(&mut c, &["DUMP", "bits"]);
    let mut r = redis::cmd("RESTORE");
    r.arg("bits2").arg(0).arg(dump);
    assert_eq!(r.query::<String>(&mut c).unwrap(), "OK");
    assert_eq!(q::<i64>(&mut c, &["GETBIT", "bits2", "9"]), 1);
    // An expired item is neither counted nor left behind by FLUSHALL.
    assert_eq!(q::<String>(&mut c, &["PSETEX", "gone", "1", "v"]), "OK");
    std::thread::sleep(Duration::from_millis(20));
    let live = q::<i64>(&mut c, &["DBSIZE"]);
    assert_eq!(
        live,
        q::<Vec<String>>(&mut c, &["KEYS", "*"]).len() as i64,
        "DBSIZE counts an expired key"
    );
    // FLUSHALL empties it.
    assert_eq!(q::<String>(&mut c, &["FLUSHALL"]), "OK");
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 0);
    assert_eq!(
        q::<Vec<String>>(&mut c, &["KEYS", "*"]),
        Vec::<String>::new()
    );
    // The expired item went too: nothing is left in the index.
    assert_eq!(s.shared().store.len(), 0);
    let keyspace: String = q(&mut c, &["INFO", "keyspace"]);
    assert!(!keyspace.contains("db0:"), "{keyspace}");
}

#[test]
fn oom_then_deletes_make_room_on_the_shared_engine() {
    let d = DataDir::new("oom");
    let s = start_with(|c| {
        c.data_dir = Some(d.0.clone());
        c.capacity = 16 << 20;
    });
    let mut c = client(&s);
    let value = "v".repeat(4000);
    let mut written = 0;
    let oom = loop {
        match cmd(&mut c, &["SET", &format!("k{written}"), &value]) {
            Ok(_) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 100_000, "never full");
    };
    assert_eq!(oom.code(), Some("OOM"), "{oom}");
    assert!(written > 1000, "only {written} writes before OOM");
    // Reads, expiry changes and deletes keep working.
    assert_eq!(q::<String>(&mut c, &["GET", "k0"]), value);
    assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k0", "1000"]), 1);
    assert!(q::<i64>(&mut c, &["TTL", "k0"]) > 900);
    assert_eq!(q::<i64>(&mut c, &["PERSIST", "k0"]), 1);
    for i in 0..written {
        let _: i64 = q(&mut c, &["DEL", &format!("k{i}")]);
    }
    // Compaction makes room again.
    let t = Instant::now();
    loop {
        match cmd(&mut c, &["SET", "after", &value]) {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(e.code(), Some("OOM"));
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "no room after deletes"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 1);
}

/// The real binary on `dir`, and its RESP port.
struct Proc {
    child: Child,
    port: u16,
}

fn spawn(dir: &Path, extra: &[&str]) -> Proc {
    let mut child = Command::new(BIN)
        .args(["--port", "0", "--memcached-port", "0", "--threads", "2"])
        .args(["--no-pin", "--maxmemory", "64mb", "--data-dir"])
        .arg(dir)
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (line, mut err) = wait_ready(&mut child, Duration::from_secs(30));
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while err.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    let port = ready_port(&line, "resp").unwrap_or_else(|| panic!("no port in {line:?}"));
    Proc { child, port }
}

impl Proc {
    fn con(&self) -> redis::Connection {
        let c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap();
        let con = c.get_connection().unwrap();
        con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        con
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is touched.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Wait for the process to exit; its status.
    fn wait(mut self) -> std::process::ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "server did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Write keys of every kind the server stores: strings with and without
/// TTL, a hash, a counter, a memcached item with flags.
fn write_kinds(p: &Proc) {
    let mut c = p.con();
    for i in 0..500 {
        let _: () = q(&mut c, &["SET", &format!("str:{i}"), &format!("value-{i}")]);
    }
    let _: () = q(&mut c, &["SET", "ttl", "soon-not", "EX", "1000"]);
    let _: () = q(&mut c, &["SET", "gone", "x", "PX", "1"]);
    let _: i64 = q(&mut c, &["HSET", "hash", "a", "1", "b", "2"]);
    let _: i64 = q(&mut c, &["INCRBY", "ctr", "7"]);
}

fn check_kinds(p: &Proc) {
    let mut c = p.con();
    for i in 0..500 {
        assert_eq!(
            q::<String>(&mut c, &["GET", &format!("str:{i}")]),
            format!("value-{i}")
        );
    }
    let ttl: i64 = q(&mut c, &["TTL", "ttl"]);
    assert!((900..=1000).contains(&ttl), "ttl {ttl}");
    assert_eq!(q::<Option<String>>(&mut c, &["GET", "gone"]), None);
    assert_eq!(q::<String>(&mut c, &["TYPE", "hash"]), "hash");
    assert_eq!(q::<String>(&mut c, &["HGET", "hash", "b"]), "2");
    assert_eq!(q::<i64>(&mut c, &["INCR", "ctr"]), 8);
    let _: i64 = q(&mut c, &["DECR", "ctr"]);
}

fn mc_port(c: &mut redis::Connection) -> u16 {
    info_field(c, "server", "memcached_port").parse().unwrap()
}

#[test]
fn restart_serves_every_acknowledged_write() {
    let d = DataDir::new("restart");
    let p = spawn(&d.0, &[]);
    write_kinds(&p);
    let mut c = p.con();
    let mut m = Mc::new(mc_port(&mut c));
    assert_eq!(m.req("set mc 1234 0 5\r\nhello\r\n"), "STORED");
    m.send(b"gets mc\r\n");
    let cas_before = m.until_end()[0].split(' ').nth(4).unwrap().to_string();
    // SHUTDOWN: a clean close.
    let _ = cmd(&mut c, &["SHUTDOWN"]);
    assert!(p.wait().success());
    let p = spawn(&d.0, &[]);
    let mut c = p.con();
    assert_eq!(
        info_field(&mut c, "server", "store_start"),
        "attached (clean shutdown)",
        "a clean shutdown needs no recovery"
    );
    check_kinds(&p);
    let mut m = Mc::new(mc_port(&mut c));
    m.send(b"gets mc\r\n");
    let v = m.until_end();
    assert_eq!(v[1], "hello");
    // Flags and the CAS version survive the restart.
    assert_eq!(v[0], format!("VALUE mc 1234 5 {cas_before}"));
    // SIGTERM: also clean.
    p.signal(libc::SIGTERM);
    assert!(p.wait().success());
    let p = spawn(&d.0, &[]);
    let mut c = p.con();
    assert!(info_field(&mut c, "server", "store_start").starts_with("attached"));
    check_kinds(&p);
}

#[test]
fn sigkill_while_writing_then_restart_serves_every_acknowledged_write() {
    let d = DataDir::new("crash");
    let p = spawn(&d.0, &[]);
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let mut c = p.con();
            let acked = acked.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("w{w}:{}", i % 3000);
                    // Overwrites of a key: the last acknowledged one counts.
                    let v = format!("{w}:{i}:{}", "x".repeat((i % 300) as usize));
                    let r: redis::RedisResult<()> = redis::cmd("SET").arg(&k).arg(&v).query(&mut c);
                    if r.is_err() {
                        return; // the server died
                    }
                    acked.lock().unwrap().push((k, v));
                    i += 1;
                }
            })
        })
        .collect();
    let t = Instant::now();
    while acked.lock().unwrap().len() < 5000 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    p.signal(libc::SIGKILL);
    let status = p.wait();
    assert!(!status.success());
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 1000,
        "only {} writes before the kill",
        acked.len()
    );
    // The last acknowledged value of each key (a write in flight at the
    // kill, unacknowledged, may or may not have happened: it is allowed to
    // be the value instead only if it was the next write of that key).
    let mut last: HashMap<String, String> = HashMap::new();
    for (k, v) in &acked {
        last.insert(k.clone(), v.clone());
    }
    let p = spawn(&d.0, &[]);
    let mut c = p.con();
    let start = info_field(&mut c, "server", "store_start");
    assert!(start.starts_with("recovered"), "{start}");
    let mut wrong = 0;
    for (k, v) in &last {
        let got: Option<String> = q(&mut c, &["GET", k]);
        match got {
            Some(g) if &g == v => {}
            Some(g) => {
                // Only a later, unacknowledged write of the same writer may
                // have landed; it must still be whole.
                let (gw, gi, gx) = parse_value(&g);
                let (vw, vi, _) = parse_value(v);
                assert_eq!(gw, vw, "{k}: {g:?} from another writer");
                assert!(gi > vi, "{k}: {g:?} older than acknowledged {v:?}");
                assert_eq!(gx, (gi % 300) as usize, "{k}: torn value {g:?}");
                wrong += 1;
            }
            None => panic!("{k}: acknowledged write lost"),
        }
    }
    assert!(
        wrong <= 2,
        "{wrong} keys newer than their last acknowledged write"
    );
    assert_eq!(
        q::<i64>(&mut c, &["DBSIZE"]),
        last.len() as i64 + wrong_extra(&mut c, &last)
    );
}

/// Keys present that no acknowledged write created (a first write of a
/// key in flight at the kill): at most one per writer.
fn wrong_extra(c: &mut redis::Connection, last: &HashMap<String, String>) -> i64 {
    let keys: Vec<String> = q(c, &["KEYS", "*"]);
    let extra = keys.iter().filter(|k| !last.contains_key(*k)).count() as i64;
    assert!(extra <= 2, "{extra} keys nobody acknowledged");
    extra
}

/// `w:i:xxx` → (w, i, number of x).
fn parse_value(v: &str) -> (u64, u64, usize) {
    let mut it = v.splitn(3, ':');
    let w = it.next().unwrap().parse().unwrap();
    let i = it.next().unwrap().parse().unwrap();
    let x = it.next().unwrap();
    assert!(x.bytes().all(|b| b == b'x'), "torn value {v:?}");
    (w, i, x.len())
}

#[test]
fn another_process_attaches_the_store_while_the_server_runs() {
    let d = DataDir::new("attach");
    let p = spawn(&d.0, &[]);
    let mut c = p.con();
    let _: () = q(&mut c, &["SET", "from-server", "s1", "EX", "500"]);
    let _: i64 = q(&mut c, &["HSET", "h", "f", "v"]);
    // This test process is one more attached process.
    let s = attach_quiet(&d.0);
    assert!(!s.recovery_report().ran, "the server is alive: no recovery");
    let mut buf = Vec::new();
    let m = s.get_into(b"from-server", &mut buf).unwrap().unwrap();
    assert_eq!(buf, b"s1");
    assert!(m.expiry_ms.is_some(), "the TTL is in the shared item");
    assert_eq!(s.meta(b"h").unwrap().unwrap().flags, u32::MAX, "a hash");
    // Direct writes are served by the server at once.
    s.put(b"from-process", b"p1").unwrap();
    s.put_with(
        b"counter",
        b"41",
        nibblejmp::PutOptions {
            expiry: nibblejmp::Expiry::At(nibble::object::now_ms() + 100_000),
            ..nibblejmp::PutOptions::default()
        },
    )
    .unwrap();
    assert_eq!(q::<String>(&mut c, &["GET", "from-process"]), "p1");
    assert_eq!(q::<i64>(&mut c, &["INCR", "counter"]), 42);
    assert!(q::<i64>(&mut c, &["TTL", "counter"]) > 90);
    assert_eq!(s.get(b"counter").unwrap().as_deref(), Some(&b"42"[..]));
    assert!(s.delete(b"from-server").unwrap());
    assert_eq!(q::<Option<String>>(&mut c, &["GET", "from-server"]), None);
    assert_eq!(
        info_field(&mut c, "server", "store_processes"),
        "2",
        "server and this test"
    );
    // Concurrent writers on both sides of the socket.
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for i in 0..2000 {
                s.put(format!("p:{i}").as_bytes(), b"direct").unwrap();
            }
        });
        let mut c2 = p.con();
        for i in 0..2000 {
            let _: () = q(&mut c2, &["SET", &format!("s:{i}"), "served"]);
        }
    });
    assert_eq!(q::<String>(&mut c, &["GET", "p:1999"]), "direct");
    assert_eq!(s.get(b"s:1999").unwrap().as_deref(), Some(&b"served"[..]));
    s.close().unwrap();
    // The server keeps serving after the other process detaches, and a
    // clean shutdown afterwards leaves the store clean.
    assert_eq!(q::<String>(&mut c, &["GET", "p:0"]), "direct");
    // A second server on the same directory is one more process.
    let p2 = spawn(&d.0, &[]);
    let mut c2 = p2.con();
    assert_eq!(
        info_field(&mut c2, "server", "store_start"),
        "attached (1 other process attached)"
    );
    assert_eq!(q::<String>(&mut c2, &["GET", "s:7"]), "served");
    let _: () = q(&mut c2, &["SET", "from-second", "2"]);
    assert_eq!(q::<String>(&mut c, &["GET", "from-second"]), "2");
    p2.signal(libc::SIGTERM);
    let st = p2.wait();
    assert!(st.success(), "second server: {st:?}");
    assert_eq!(q::<String>(&mut c, &["GET", "from-second"]), "2");
    let _ = cmd(&mut c, &["SHUTDOWN"]);
    assert!(p.wait().success());
    let s = nibblejmp::SharedStore::attach(&d.0, &nibblejmp::Options::default()).unwrap();
    assert!(!s.recovery_report().ran);
    assert_eq!(s.get(b"s:0").unwrap().as_deref(), Some(&b"served"[..]));
    s.close().unwrap();
}

#[test]
fn bad_data_dir_is_a_clear_error() {
    let out = Command::new(BIN)
        .args(["--port", "0", "--data-dir", "/proc/version"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("shared store"), "{e}");
    let out = Command::new(BIN)
        .args(["--port", "0", "--data-dir", ""])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn server_sigkilled_while_another_process_stays_attached() {
    let d = DataDir::new("survivor");
    let p = spawn(&d.0, &[]);
    let mut c = p.con();
    for i in 0..300 {
        let _: () = q(&mut c, &["SET", &format!("k{i}"), &format!("v{i}")]);
    }
    let s = attach_quiet(&d.0);
    // The server dies; this process carries on with the store.
    p.signal(libc::SIGKILL);
    assert!(!p.wait().success());
    s.put(b"while-down", b"x").unwrap();
    assert_eq!(s.get(b"k7").unwrap().as_deref(), Some(&b"v7"[..]));
    s.reclaim_dead();
    assert!(
        s.stats().slots_reclaimed >= 1,
        "the dead server's epoch slots are reclaimed"
    );
    // A new server attaches next to the survivor: no recovery needed (the
    // survivor's attach keeps the store in use), everything served.
    let p = spawn(&d.0, &[]);
    let mut c = p.con();
    assert_eq!(
        info_field(&mut c, "server", "store_start"),
        "attached (1 other process attached)"
    );
    for i in 0..300 {
        assert_eq!(
            q::<String>(&mut c, &["GET", &format!("k{i}")]),
            format!("v{i}")
        );
    }
    assert_eq!(q::<String>(&mut c, &["GET", "while-down"]), "x");
    assert_eq!(q::<i64>(&mut c, &["DBSIZE"]), 301);
    s.close().unwrap();
    let _ = cmd(&mut c, &["SHUTDOWN"]);
    assert!(p.wait().success());
}

/// Run the binary on `dir` expecting it to refuse the store: it exits by
/// itself with an error status (not a signal such as SIGBUS) and says why
/// on stderr, which is returned.
fn refused(dir: &Path) -> String {
    let mut child = Command::new(BIN)
        .args(["--port", "0", "--memcached-port", "0", "--threads", "2"])
        .args(["--no-pin", "--maxmemory", "64mb", "--data-dir"])
        .arg(dir)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("the server served a damaged store instead of refusing it");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        None,
        "killed by a signal: {status:?}\n{err}"
    );
    assert!(!status.success(), "{err}");
    err
}

/// Issue 25's adversarial run against the binary: a store stopped cleanly,
/// then its files damaged. A flipped byte in a value is never served (that
/// key answers an error, INFO counts it, the others are served); a file
/// truncated to any size is refused with a message, never a SIGBUS.
#[test]
fn damaged_files_are_detected_never_served_never_a_crash() {
    let d = DataDir::new("damage");
    let p = spawn(&d.0, &[]);
    write_kinds(&p);
    let mut c = p.con();
    let _ = cmd(&mut c, &["SHUTDOWN"]);
    assert!(p.wait().success());
    let log = d.0.join("seg.log");
    let mut b = std::fs::read(&log).unwrap();
    let at = b
        .windows(9)
        .position(|w| w == b"value-123")
        .expect("value-123 is in the log");
    b[at + 6] ^= 0x01;
    std::fs::write(&log, &b).unwrap();
    let p = spawn(&d.0, &[]);
    let mut c = p.con();
    assert_eq!(
        info_field(&mut c, "server", "store_start"),
        "attached (clean shutdown)"
    );
    let e = err(&mut c, &["GET", "str:123"]);
    assert!(e.contains("damaged"), "{e}");
    assert_eq!(q::<String>(&mut c, &["GET", "str:124"]), "value-124");
    assert_eq!(q::<String>(&mut c, &["HGET", "hash", "b"]), "2");
    assert!(
        info_field(&mut c, "stats", "damaged_objects")
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    let _ = cmd(&mut c, &["SHUTDOWN"]);
    assert!(p.wait().success());

    for name in ["seg.log", "seg.index", "seg.meta"] {
        let path = d.0.join(name);
        let full = std::fs::read(&path).unwrap();
        for size in [0, 100, 4096, full.len() as u64 / 2] {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len(size).unwrap();
            drop(f);
            let e = refused(&d.0);
            assert!(
                e.contains(name) && e.contains(&format!("is {size} bytes")),
                "{name} at {size}: {e}"
            );
            // Twice: a restart does not crash either.
            refused(&d.0);
            std::fs::write(&path, &full).unwrap();
        }
    }
    // Restored: served again.
    let p = spawn(&d.0, &[]);
    let mut c = p.con();
    assert_eq!(q::<String>(&mut c, &["GET", "str:124"]), "value-124");
}

/// 1000 random bit flips in the index of a cleanly stopped store: the
/// server's attach finds the shutdown seal broken, rebuilds the index from
/// the log and serves every key.
#[test]
fn index_bit_flips_are_rebuilt_by_the_binary() {
    let d = DataDir::new("idxflip");
    let p = spawn(&d.0, &[]);
    write_kinds(&p);
    let mut c = p.con();
    let _ = cmd(&mut c, &["SHUTDOWN"]);
    assert!(p.wait().success());
    let idx = d.0.join("seg.index");
    let mut b = std::fs::read(&idx).unwrap();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = 4096 + (x % (b.len() as u64 - 4096)) as usize;
        b[at] ^= 1 << (x >> 61);
    }
    std::fs::write(&idx, b).unwrap();
    let p = spawn(&d.0, &[]);
    let mut c = p.con();
    let start = info_field(&mut c, "server", "store_start");
    assert!(
        start.starts_with("recovered (clean shutdown, but the index fails its checksum"),
        "{start}"
    );
    check_kinds(&p);
}
