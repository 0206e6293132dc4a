//! `appendfsync` and power cuts (issue 25).
//!
//! The power-loss test layer (`nibblejmp`'s `store/durability.rs`): the
//! server runs with `NIBBLE_TEST_POWER_IMAGE` set, so it keeps a durable
//! image of its store that only completed flushes update. A power cut is
//! a SIGKILL at a random moment under write load, then the image's files
//! copied over the store's, then a restart: what the restart sees is
//! exactly what completed flushes wrote.
//!
//! * `always`: no acknowledged SET is lost; every key holds its last
//!   acknowledged value or a later one of the same writer, whole.
//! * `everysec`: only writes of about the last second are lost (we allow
//!   2.5 s: the flush period plus a slow flush), on a small store that
//!   compacts (so segment reuse and moved objects are covered).
//! * Never a corrupted value, never a failed restart.
//! * In odd rounds the cut also keeps a random half of the pages written
//!   since the last flush (the kernel's write-back, in any order): the
//!   same must hold.
//! * INFO persistence and CONFIG GET/SET report the policy and flushes.
//!
//! Each run's seed is printed; `POWER_CUT_SEED=N` replays one, and
//! `POWER_CUT_ROUNDS=N` cuts N times instead of 3.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{info_u64, q, ready_port, start_with, wait_ready};

const BIN: &str = env!("CARGO_BIN_EXE_nibble");
const IMAGE_ENV: &str = "NIBBLE_TEST_POWER_IMAGE";

/// A store directory and its image directory on tmpfs, removed when
/// dropped. (tmpfs keeps the test fast; the store's `flushed` marker
/// makes its recovery treat it as a store that may have lost power.)
struct Dirs {
    data: PathBuf,
    image: PathBuf,
}

impl Dirs {
    fn new(tag: &str) -> Dirs {
        let base = format!("/dev/shm/nibble-power-test-{}-{tag}", std::process::id());
        let d = Dirs {
            data: PathBuf::from(format!("{base}-data")),
            image: PathBuf::from(format!("{base}-image")),
        };
        let _ = std::fs::remove_dir_all(&d.data);
        let _ = std::fs::remove_dir_all(&d.image);
        d
    }

    /// The power cut, after the server is dead: the store's files become
    /// the image's last complete generation, plus, when `writeback` is
    /// given, a random subset of the 4 KiB pages that differ from it (the
    /// kernel may have written any dirty page back before the cut).
    /// Returns the number of such pages kept.
    fn cut(&self, mut writeback: Option<&mut Rng>) -> usize {
        nibblejmp::testing::apply_power_cut(&self.data, &self.image, || {
            writeback
                .as_deref_mut()
                .is_some_and(|rng| rng.below(2) == 0)
        })
        .unwrap()
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data);
        let _ = std::fs::remove_dir_all(&self.image);
    }
}

struct Proc {
    child: Child,
    port: u16,
    start: String,
}

fn spawn(d: &Dirs, maxmemory: &str, policy: &str) -> Proc {
    spawn_with(d, maxmemory, policy, &[])
}

fn spawn_with(d: &Dirs, maxmemory: &str, policy: &str, extra: &[&str]) -> Proc {
    let mut child = Command::new(BIN)
        .args(["--port", "0", "--threads", "2", "--no-pin"])
        .args(["--maxmemory", maxmemory, "--appendfsync", policy])
        .args(extra)
        .arg("--data-dir")
        .arg(&d.data)
        .env(IMAGE_ENV, &d.image)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (line, mut err) = wait_ready(&mut child, Duration::from_secs(60));
    std::thread::spawn(move || {
        let mut sink = String::new();
        while err.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    let port = ready_port(&line, "resp").unwrap_or_else(|| panic!("no port in {line:?}"));
    let start = line
        .split("shared store in ")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    Proc { child, port, start }
}

impl Proc {
    fn con(&self) -> redis::Connection {
        let c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap();
        let con = c.get_connection().unwrap();
        con.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        con
    }

    /// SIGKILL and reap.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// xorshift64*: the test's only randomness, from a printed seed.
struct Rng(u64);

impl Rng {
    fn new(tag: &str) -> Rng {
        let seed = std::env::var("POWER_CUT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        println!("{tag}: POWER_CUT_SEED={seed}");
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn rounds() -> usize {
    std::env::var("POWER_CUT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

/// The value writer `w` writes as its `i`-th write: `w:i:` and a run of
/// `x` whose length follows from `i` (so a torn value is detected).
fn value(w: u64, i: u64, max_x: u64) -> String {
    format!(
        "{w}:{i}:{}",
        "x".repeat((i.wrapping_mul(7919) % max_x) as usize)
    )
}

/// `w:i:xxx` → (w, i), checking the run of `x`.
fn parse(v: &str, max_x: u64) -> (u64, u64) {
    let mut it = v.splitn(3, ':');
    let w: u64 = it.next().unwrap().parse().expect("corrupted value");
    let i: u64 = it.next().unwrap().parse().expect("corrupted value");
    let x = it.next().expect("corrupted value");
    assert!(x.bytes().all(|b| b == b'x'), "corrupted value {v:?}");
    assert_eq!(
        x.len() as u64,
        i.wrapping_mul(7919) % max_x,
        "torn value {v:?}"
    );
    (w, i)
}

/// One acknowledged write: key, writer, write number, when acknowledged.
type Ack = (String, u64, u64, Instant);

/// Writer threads under way (see [`start_writers`]).
struct Load {
    acked: Arc<Mutex<Vec<Ack>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// After the power cut: stop the writers; every acknowledged write.
    fn finish(self) -> Vec<Ack> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        std::mem::take(&mut *self.acked.lock().unwrap())
    }
}

/// `writers` threads SET keys `{tag}w{w}:{n}` (n < keys) with growing
/// write numbers, pipelining `depth` SETs per round trip, until the
/// server dies or they are stopped.
fn start_writers(p: &Proc, tag: &str, writers: u64, keys: u64, depth: u64, max_x: u64) -> Load {
    let acked: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let threads = (0..writers)
        .map(|w| {
            let mut c = p.con();
            let (acked, stop, tag) = (acked.clone(), stop.clone(), tag.to_string());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut pipe = redis::pipe();
                    let mut batch = Vec::new();
                    for _ in 0..depth {
                        let k = format!("{tag}w{w}:{}", i % keys);
                        pipe.cmd("SET").arg(&k).arg(value(w, i, max_x)).ignore();
                        batch.push((k, w, i));
                        i += 1;
                    }
                    let r: redis::RedisResult<()> = pipe.query(&mut c);
                    if r.is_err() {
                        return; // the power went
                    }
                    let t = Instant::now();
                    acked
                        .lock()
                        .unwrap()
                        .extend(batch.into_iter().map(|(k, w, i)| (k, w, i, t)));
                }
            })
        })
        .collect();
    Load {
        acked,
        stop,
        threads,
    }
}

/// Check the restarted store against this round's acknowledged writes
/// and what earlier rounds left (`seen`: key → write number found after
/// the previous restart; nothing writes those keys any more, so each must
/// be as it was). A key of this round whose last write acknowledged at or
/// before `durable_by` (every write when `None`) must hold it or a later
/// write of its writer; any value present must be whole. Adds this
/// round's keys to `seen`; returns (keys, keys of this round lost that
/// were allowed to be).
fn check(
    p: &Proc,
    acked: &[Ack],
    durable_by: Option<Instant>,
    max_x: u64,
    seen: &mut HashMap<String, u64>,
) -> (usize, usize) {
    let mut c = p.con();
    for (k, &was) in seen.iter() {
        let got: Option<String> = q(&mut c, &["GET", k]);
        let got = got.unwrap_or_else(|| panic!("{k}: write {was} of an earlier round lost"));
        assert_eq!(
            parse(&got, max_x).1,
            was,
            "{k}: changed since the last restart"
        );
    }
    // Per key: the last write that must have survived.
    let mut must: HashMap<&str, Option<u64>> = HashMap::new();
    for (k, _, i, t) in acked {
        let e = must.entry(k).or_default();
        if durable_by.is_none_or(|d| *t <= d) {
            *e = Some(e.unwrap_or(0).max(*i));
        }
    }
    let mut lost_allowed = 0;
    for (k, m) in &must {
        let got: Option<String> = q(&mut c, &["GET", k]);
        match (got, m) {
            (Some(g), m) => {
                let (_, gi) = parse(&g, max_x);
                if let Some(m) = m {
                    assert!(gi >= *m, "{k}: write {gi} is older than durable write {m}");
                }
                seen.insert(k.to_string(), gi);
            }
            (None, Some(m)) => panic!("{k}: durable write {m} lost"),
            (None, None) => lost_allowed += 1,
        }
    }
    (seen.len(), lost_allowed)
}

#[test]
fn always_loses_no_acknowledged_write_in_a_power_cut() {
    let d = Dirs::new("always");
    let mut rng = Rng::new("always");
    let mut p = spawn(&d, "32mb", "always");
    let mut seen = HashMap::new();
    for round in 0..rounds() {
        let load = start_writers(&p, &format!("r{round}"), 4, 300, 1 + rng.below(4), 400);
        std::thread::sleep(Duration::from_millis(200 + rng.below(600)));
        p.kill();
        let acked = load.finish();
        assert!(!acked.is_empty(), "round {round}: nothing acknowledged");
        // Odd rounds: some unflushed pages reached the disk too.
        let pages = d.cut((round % 2 == 1).then_some(&mut rng));
        p = spawn(&d, "32mb", "always");
        assert!(p.start.contains("recovered"), "{}", p.start);
        let (keys, lost) = check(&p, &acked, None, 400, &mut seen);
        assert_eq!(lost, 0);
        println!(
            "round {round}: {} acknowledged writes, {keys} keys, all there; {pages} unflushed pages kept; start: {}",
            acked.len(),
            p.start
        );
    }
}

/// As `always_loses_no_acknowledged_write_in_a_power_cut`, with an index
/// checkpoint every second (nibblejmp's `store/checkpoint.rs`): the cuts
/// come after one or more checkpoints, so the restarts recover from one
/// (walking only what was written since) and must lose nothing either.
#[test]
fn always_with_checkpoints_loses_no_acknowledged_write_in_a_power_cut() {
    let d = Dirs::new("ckpt");
    let mut rng = Rng::new("ckpt");
    let args = ["--checkpoint-interval", "1"];
    let mut p = spawn_with(&d, "32mb", "always", &args);
    let mut seen = HashMap::new();
    let mut from_checkpoint = 0;
    for round in 0..rounds() {
        let load = start_writers(&p, &format!("r{round}"), 4, 300, 1 + rng.below(4), 400);
        std::thread::sleep(Duration::from_millis(1300 + rng.below(1500)));
        p.kill();
        let acked = load.finish();
        assert!(!acked.is_empty(), "round {round}: nothing acknowledged");
        let pages = d.cut((round % 2 == 1).then_some(&mut rng));
        p = spawn_with(&d, "32mb", "always", &args);
        assert!(p.start.contains("recovered"), "{}", p.start);
        from_checkpoint += usize::from(p.start.contains("from_checkpoint="));
        let (keys, lost) = check(&p, &acked, None, 400, &mut seen);
        assert_eq!(lost, 0);
        println!(
            "round {round}: {} acknowledged writes, {keys} keys, all there; {pages} unflushed pages kept; start: {}",
            acked.len(),
            p.start
        );
    }
    assert!(from_checkpoint > 0, "no restart used a checkpoint");
}

#[test]
fn everysec_loses_at_most_the_last_seconds_in_a_power_cut() {
    let d = Dirs::new("everysec");
    let mut rng = Rng::new("everysec");
    // A small store with large values and few keys: compaction runs and
    // reuses segments while the writes go on.
    let mut p = spawn(&d, "24mb", "everysec");
    let mut seen = HashMap::new();
    for round in 0..rounds() {
        let load = start_writers(&p, &format!("r{round}"), 2, 400, 8, 6000);
        std::thread::sleep(Duration::from_millis(2500 + rng.below(1500)));
        let cut_at = Instant::now();
        p.kill();
        let acked = load.finish();
        let pages = d.cut((round % 2 == 1).then_some(&mut rng));
        p = spawn(&d, "24mb", "everysec");
        assert!(p.start.contains("recovered"), "{}", p.start);
        // Writes acknowledged more than 2.5 s before the cut must be there.
        let durable_by = cut_at.checked_sub(Duration::from_millis(2500));
        let (keys, lost) = check(&p, &acked, durable_by, 6000, &mut seen);
        let mut c = p.con();
        let info: String = q(&mut c, &["INFO", "persistence"]);
        println!(
            "round {round}: {} acknowledged writes, {keys} keys, {lost} recent keys lost; {pages} unflushed pages kept; start: {}; {}",
            acked.len(),
            p.start,
            info.lines().filter(|l| l.starts_with("aof_")).collect::<Vec<_>>().join(" ")
        );
    }
}

#[test]
fn info_and_config_report_the_policy_and_flushes() {
    let d = Dirs::new("info");
    let s = start_with(|c| {
        c.data_dir = Some(d.data.clone());
        c.appendfsync = server::durability::Appendfsync::Always;
    });
    let port = s.resp_port().unwrap();
    let con = || {
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection()
            .unwrap()
    };
    let mut c = con();
    let info: String = q(&mut c, &["INFO", "persistence"]);
    assert!(info.contains("appendfsync:always\r\n"), "{info}");
    assert!(info.contains("aof_enabled:1\r\n"), "{info}");
    assert!(info.contains("aof_last_write_status:ok\r\n"), "{info}");
    let flushes0 = info_u64(&info, "aof_flushes");
    // 16 clients writing at once: group commit answers them with fewer
    // flushes than writes.
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let mut c = con();
            std::thread::spawn(move || {
                for i in 0..40 {
                    let _: () = q(&mut c, &["SET", &format!("k{w}:{i}"), "v"]);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let info: String = q(&mut c, &["INFO", "persistence"]);
    let flushes = info_u64(&info, "aof_flushes") - flushes0;
    let waits = info_u64(&info, "aof_group_commit_waits");
    assert_eq!(waits, 640, "{info}");
    assert!(
        flushes > 0 && flushes < 640,
        "{flushes} flushes for 640 writes"
    );
    println!("640 writes by 16 clients: {flushes} flushes");
    // CONFIG GET / SET.
    let v: Vec<String> = q(&mut c, &["CONFIG", "GET", "appendfsync"]);
    assert_eq!(v, ["appendfsync", "always"]);
    let _: () = q(&mut c, &["CONFIG", "SET", "appendfsync", "everysec"]);
    let v: Vec<String> = q(&mut c, &["CONFIG", "GET", "appendfsync"]);
    assert_eq!(v, ["appendfsync", "everysec"]);
    let e = redis::cmd("CONFIG")
        .arg(&["SET", "appendfsync", "sometimes"])
        .query::<()>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("appendfsync"), "{e}");
    // everysec: no waits, the thread flushes once a second.
    let waits0 = info_u64(
        &q::<String>(&mut c, &["INFO", "persistence"]),
        "aof_group_commit_waits",
    );
    let _: () = q(&mut c, &["SET", "a", "b"]);
    let t = Instant::now();
    let before = info_u64(
        &q::<String>(&mut c, &["INFO", "persistence"]),
        "aof_flushes",
    );
    loop {
        let info: String = q(&mut c, &["INFO", "persistence"]);
        assert_eq!(info_u64(&info, "aof_group_commit_waits"), waits0);
        if info_u64(&info, "aof_flushes") > before {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(3), "no everysec flush");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _: () = q(&mut c, &["CONFIG", "SET", "appendfsync", "no"]);
    drop(s);
    // Without a data dir: the policy is shown, nothing is flushed.
    let s = start_with(|_| {});
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{}/", s.resp_port().unwrap()))
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = q(&mut c, &["INFO", "persistence"]);
    assert!(info.contains("appendfsync:everysec\r\n"), "{info}");
    assert!(info.contains("aof_enabled:0\r\n"), "{info}");
    assert_eq!(info_u64(&info, "aof_flushes"), 0);
}
