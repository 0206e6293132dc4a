//! Many processes on one store. Children are this test binary re-run with
//! `NJ_ROLE` set (the `child` test is a no-op otherwise):
//!
//! * `linearizable_across_processes`: 2 writer and 2 reader processes on 6
//!   shared keys record timestamped histories (CLOCK_MONOTONIC, one clock
//!   for all processes); a per-key linearizability checker (Wing & Gong
//!   search over the sequential processes' histories, memoized) checks
//!   the merged history.
//! * `sigkill_during_mixed_workload`: 3 workers with their own key ranges
//!   log every operation before and after it; the parent SIGKILLs random
//!   workers at random times and restarts them; the survivors continue.
//!   The final contents must match the logs (an acknowledged operation is
//!   applied; the one in flight at the kill may or may not be), before and
//!   after an index rebuild from the log.
//! * `crash_then_reattach_recovers`: a child writes and dies without
//!   closing; the next attach runs recovery; then the index segment is
//!   wiped and attach rebuilds it from the log.
//! * `compaction_lease_taken_over_after_sigkill`: a child compacts under
//!   the lease and is killed mid-pass; another process takes the lease
//!   over and compacts; contents intact.
//!
//! `NJ_LONG=1` makes the kill and linearizability runs longer (30 s and
//! 10x the operations).

mod common;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nibblejmp::{Options, SharedStore};
use rand::{Rng, SeedableRng};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = PathBuf::from(format!(
            "/dev/shm/nibblejmp-mp-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn store(&self) -> PathBuf {
        self.0.join("store")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn long() -> bool {
    std::env::var_os("NJ_LONG").is_some()
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn spawn(role: &str, env: &[(&str, String)]) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env("NJ_ROLE", role);
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

fn env_u64(k: &str) -> u64 {
    env(k).parse().unwrap_or(0)
}

fn kill9(c: &mut Child) {
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    let _ = c.wait();
}

fn child_opts() -> Options {
    Options {
        oom_wait: Duration::from_secs(2),
        ..Options::default()
    }
}

/// The entry point of every child role.
#[test]
fn child() {
    let Ok(role) = std::env::var("NJ_ROLE") else {
        return;
    };
    let dir = PathBuf::from(env("NJ_DIR"));
    match role.as_str() {
        "history" => role_history(&dir),
        "worker" => role_worker(&dir),
        "crasher" => role_crasher(&dir),
        "compactor" => role_compactor(&dir),
        r => panic!("unknown role {r}"),
    }
}

// ---------------------------------------------------------------------
// Linearizability.

/// One completed operation: start and end (ns), kind, key, value id
/// (0 = none). Kinds: 0 put, 1 get, 2 delete (value = 1 if it deleted).
#[derive(Clone, Copy, Debug)]
struct Rec {
    start: u64,
    end: u64,
    kind: u8,
    key: u8,
    val: u64,
}

const KEYS: u8 = 6;

fn role_history(dir: &Path) {
    let id = env_u64("NJ_ID");
    let ops = env_u64("NJ_OPS");
    let writer = env("NJ_WRITER") == "1";
    let s = SharedStore::attach(dir.join("store"), &child_opts()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(id * 7919 + now_ns());
    let mut out = Vec::new();
    for n in 0..ops {
        let key = rng.gen_range(0..KEYS);
        let k = [b'k', key];
        let r = rng.gen_range(0..10);
        let start = now_ns();
        let (kind, val) = if writer && r < 6 {
            // Unique value: writer id in the high bits.
            let v = (id << 32) | (n + 1);
            s.put(&k, &v.to_le_bytes()).unwrap();
            (0, v)
        } else if writer && r < 8 {
            (2, s.delete(&k).unwrap() as u64)
        } else {
            let v = s
                .get(&k)
                .unwrap()
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                .unwrap_or(0);
            (1, v)
        };
        let end = now_ns();
        out.push(Rec {
            start,
            end,
            kind,
            key,
            val,
        });
    }
    let mut f = std::fs::File::create(dir.join(format!("hist-{id}"))).unwrap();
    for r in out {
        writeln!(f, "{} {} {} {} {}", r.start, r.end, r.kind, r.key, r.val).unwrap();
    }
    s.close().unwrap();
}

/// Wing & Gong's search, specialized to sequential processes: the state is
/// one cursor per process plus the register's value; an operation may be
/// linearized next iff it started before every pending operation ended.
/// Returns the first key whose history is not linearizable.
fn check_register(procs: &[Vec<Rec>]) -> Result<(), String> {
    let n = procs.len();
    let mut seen: HashSet<(Vec<usize>, u64)> = HashSet::new();
    let mut stack = vec![(vec![0usize; n], 0u64)];
    while let Some((cur, val)) = stack.pop() {
        if (0..n).all(|p| cur[p] == procs[p].len()) {
            return Ok(());
        }
        if !seen.insert((cur.clone(), val)) {
            continue;
        }
        let min_end = (0..n)
            .filter(|&p| cur[p] < procs[p].len())
            .map(|p| procs[p][cur[p]].end)
            .min()
            .unwrap_or(u64::MAX);
        for p in 0..n {
            let Some(op) = procs[p].get(cur[p]) else {
                continue;
            };
            if op.start > min_end {
                continue;
            }
            let next = match op.kind {
                0 => Some(op.val),
                1 => (op.val == val).then_some(val),
                _ => ((op.val == 1) == (val != 0)).then_some(0),
            };
            if let Some(nv) = next {
                let mut c = cur.clone();
                c[p] += 1;
                stack.push((c, nv));
            }
        }
    }
    Err(format!("no linearization among {} states", seen.len()))
}

#[test]
fn linearizable_across_processes() {
    let d = TempDir::new("lin");
    SharedStore::create(d.store(), 16 << 20, &Options::default())
        .unwrap()
        .close()
        .unwrap();
    let ops = if long() { 20_000 } else { 1500 };
    let mut kids = Vec::new();
    for id in 0..4u64 {
        kids.push(spawn(
            "history",
            &[
                ("NJ_DIR", d.0.display().to_string()),
                ("NJ_ID", (id + 1).to_string()),
                ("NJ_OPS", ops.to_string()),
                ("NJ_WRITER", if id < 2 { "1" } else { "0" }.to_string()),
            ],
        ));
    }
    for mut k in kids {
        assert!(k.wait().unwrap().success());
    }
    let mut per_key: HashMap<u8, Vec<Vec<Rec>>> = HashMap::new();
    let mut total = 0;
    for id in 1..=4 {
        let text = std::fs::read_to_string(d.0.join(format!("hist-{id}"))).unwrap();
        let mut mine: HashMap<u8, Vec<Rec>> = HashMap::new();
        for line in text.lines() {
            let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
            let r = Rec {
                start: f[0],
                end: f[1],
                kind: f[2] as u8,
                key: f[3] as u8,
                val: f[4],
            };
            mine.entry(r.key).or_default().push(r);
            total += 1;
        }
        for (k, v) in mine {
            per_key.entry(k).or_default().push(v);
        }
    }
    assert_eq!(total, 4 * ops);
    for (k, procs) in &per_key {
        if let Err(e) = check_register(procs) {
            panic!("key {k}: history not linearizable: {e}");
        }
    }
}

#[test]
fn checker_rejects_a_stale_read() {
    // put(1) [0,10], put(2) [20,30], get -> 1 [40,50]: not linearizable.
    let w = vec![
        Rec {
            start: 0,
            end: 10,
            kind: 0,
            key: 0,
            val: 1,
        },
        Rec {
            start: 20,
            end: 30,
            kind: 0,
            key: 0,
            val: 2,
        },
    ];
    let r = vec![Rec {
        start: 40,
        end: 50,
        kind: 1,
        key: 0,
        val: 1,
    }];
    assert!(check_register(&[w.clone(), r]).is_err());
    // Overlapping with the second put, reading 1 is fine.
    let r = vec![Rec {
        start: 25,
        end: 50,
        kind: 1,
        key: 0,
        val: 1,
    }];
    assert!(check_register(&[w.clone(), r]).is_ok());
    // A delete that reports "absent" after an acknowledged put is wrong.
    let dl = vec![Rec {
        start: 40,
        end: 50,
        kind: 2,
        key: 0,
        val: 0,
    }];
    assert!(check_register(&[w, dl]).is_err());
}

// ---------------------------------------------------------------------
// SIGKILL during a mixed workload.

const WORKER_KEYS: u64 = 150;

fn role_worker(dir: &Path) {
    let w = env_u64("NJ_ID");
    let gen = env_u64("NJ_GEN");
    let s = SharedStore::attach(dir.join("store"), &child_opts()).unwrap();
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("log-{w}-{gen:04}")))
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(w * 1_000_003 + gen * 7 + now_ns());
    // What this incarnation knows for sure (keys it wrote itself).
    let mut known: HashMap<u64, Option<String>> = HashMap::new();
    let stop = dir.join("stop");
    let mut n = 0u64;
    loop {
        if n.is_multiple_of(64) && stop.exists() {
            break;
        }
        n += 1;
        let k = rng.gen_range(0..WORKER_KEYS);
        let key = format!("w{w}-k{k}");
        let r = rng.gen_range(0..10);
        if r < 6 {
            let pad = rng.gen_range(0..400);
            let v = format!("w{w}-g{gen}-n{n}-{}", "x".repeat(pad));
            log.write_all(format!("B {key} P {v}\n").as_bytes())
                .unwrap();
            s.put(key.as_bytes(), v.as_bytes()).unwrap();
            log.write_all(b"A\n").unwrap();
            known.insert(k, Some(v));
        } else if r < 8 {
            log.write_all(format!("B {key} D\n").as_bytes()).unwrap();
            s.delete(key.as_bytes()).unwrap();
            log.write_all(b"A\n").unwrap();
            known.insert(k, None);
        } else if let Some(want) = known.get(&k) {
            let got = s
                .get(key.as_bytes())
                .unwrap()
                .map(|b| String::from_utf8(b).unwrap());
            if &got != want {
                eprintln!("worker {w}: {key}: read {got:?}, wrote {want:?}");
                std::process::exit(3);
            }
        }
    }
    s.close().unwrap();
}

/// The values each key may hold according to the workers' logs.
fn allowed_from_logs(dir: &Path, workers: u64) -> HashMap<String, Vec<Option<String>>> {
    let mut allowed: HashMap<String, Vec<Option<String>>> = HashMap::new();
    for w in 0..workers {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().into_string().unwrap())
            .filter(|n| n.starts_with(&format!("log-{w}-")))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(dir.join(&f)).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            let mut i = 0;
            while i < lines.len() {
                let l = lines[i];
                let Some(rest) = l.strip_prefix("B ") else {
                    i += 1;
                    continue;
                };
                let mut parts = rest.splitn(3, ' ');
                let key = parts.next().unwrap().to_string();
                let result = match parts.next() {
                    Some("P") => Some(parts.next().unwrap_or("").to_string()),
                    _ => None,
                };
                let acked = lines.get(i + 1) == Some(&"A");
                let e = allowed.entry(key).or_insert_with(|| vec![None]);
                if acked {
                    *e = vec![result];
                    i += 2;
                } else {
                    // Killed in flight: applied or not.
                    e.push(result);
                    i += 1;
                }
            }
        }
    }
    allowed
}

fn check_contents(
    s: &SharedStore,
    allowed: &HashMap<String, Vec<Option<String>>>,
) -> HashMap<String, Option<String>> {
    let mut seen = HashMap::new();
    for (k, opts) in allowed {
        let got = s
            .get(k.as_bytes())
            .unwrap()
            .map(|b| String::from_utf8(b).unwrap());
        assert!(opts.contains(&got), "{k}: found {got:?}, allowed {opts:?}");
        seen.insert(k.clone(), got);
    }
    let present = seen.values().filter(|v| v.is_some()).count();
    assert_eq!(s.keys().unwrap().len(), present, "stray keys in the store");
    seen
}

#[test]
fn sigkill_during_mixed_workload() {
    let d = TempDir::new("kill");
    SharedStore::create(d.store(), 6 << 20, &Options::default())
        .unwrap()
        .close()
        .unwrap();
    const WORKERS: u64 = 3;
    let run_for = if long() {
        Duration::from_secs(30)
    } else {
        Duration::from_millis(2500)
    };
    let start_worker = |w: u64, gen: u64| {
        spawn(
            "worker",
            &[
                ("NJ_DIR", d.0.display().to_string()),
                ("NJ_ID", w.to_string()),
                ("NJ_GEN", gen.to_string()),
            ],
        )
    };
    let mut gens = vec![0u64; WORKERS as usize];
    let mut kids: Vec<Child> = (0..WORKERS).map(|w| start_worker(w, 0)).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(now_ns());
    let t0 = Instant::now();
    let mut kills = 0;
    while t0.elapsed() < run_for {
        std::thread::sleep(Duration::from_millis(rng.gen_range(30..250)));
        let w = rng.gen_range(0..WORKERS) as usize;
        if let Ok(Some(st)) = kids[w].try_wait() {
            panic!("worker {w} exited early: {st}");
        }
        kill9(&mut kids[w]);
        kills += 1;
        gens[w] += 1;
        kids[w] = start_worker(w as u64, gens[w]);
    }
    std::fs::write(d.0.join("stop"), b"").unwrap();
    for (w, k) in kids.iter_mut().enumerate() {
        let st = k.wait().unwrap();
        assert!(st.success(), "worker {w} failed: {st}");
    }
    assert!(kills >= 5);
    let allowed = allowed_from_logs(&d.0, WORKERS);
    assert!(allowed.len() as u64 > WORKERS * WORKER_KEYS / 2);
    let s = SharedStore::attach(d.store(), &Options::default()).unwrap();
    let st = s.stats();
    eprintln!("after {kills} kills: {st:?}");
    let before = check_contents(&s, &allowed);
    s.close().unwrap();
    // The log alone gives the same contents.
    let s = common::attach_rebuilt(d.store(), Options::default());
    let after = check_contents(&s, &allowed);
    assert_eq!(before, after, "rebuild from the log changed the contents");
    s.close().unwrap();
}

// ---------------------------------------------------------------------
// Crash, then re-attach.

fn role_crasher(dir: &Path) {
    let s = SharedStore::attach(dir.join("store"), &child_opts()).unwrap();
    for i in 0..3000u32 {
        s.put(
            format!("c{}", i % 1000).as_bytes(),
            format!("v{i}").as_bytes(),
        )
        .unwrap();
        if i % 7 == 0 {
            s.delete(format!("c{}", (i * 13) % 1000).as_bytes())
                .unwrap();
        }
    }
    std::fs::write(dir.join("done"), b"").unwrap();
    // Die without closing.
    // SAFETY: kill of our own pid.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
}

fn crasher_model() -> HashMap<String, String> {
    let mut m = HashMap::new();
    for i in 0..3000u32 {
        m.insert(format!("c{}", i % 1000), format!("v{i}"));
        if i % 7 == 0 {
            m.remove(&format!("c{}", (i * 13) % 1000));
        }
    }
    m
}

fn check_model(s: &SharedStore, m: &HashMap<String, String>) {
    for i in 0..1000 {
        let k = format!("c{i}");
        let got = s.get(k.as_bytes()).unwrap();
        assert_eq!(got.as_deref(), m.get(&k).map(|v| v.as_bytes()), "{k}");
    }
    assert_eq!(s.keys().unwrap().len(), m.len());
}

#[test]
fn crash_then_reattach_recovers() {
    let d = TempDir::new("crash");
    SharedStore::create(d.store(), 8 << 20, &Options::default())
        .unwrap()
        .close()
        .unwrap();
    let mut c = spawn("crasher", &[("NJ_DIR", d.0.display().to_string())]);
    let st = c.wait().unwrap();
    assert!(!st.success());
    assert!(
        d.0.join("done").exists(),
        "the crasher did not finish its writes"
    );
    let m = crasher_model();
    let s = SharedStore::attach(d.store(), &Options::default()).unwrap();
    let r = s.recovery_report().clone();
    assert!(r.ran && r.unclean, "{r:?}");
    assert_eq!(r.bad_entries, 0, "{r:?}");
    check_model(&s, &m);
    assert!(s.stats().slots_reclaimed >= 1);
    s.close().unwrap();
    // Lose the index entirely (zero its segment's data): attach after an
    // unclean shutdown notices the log holds objects the index does not,
    // and rebuilds it.
    let s = SharedStore::attach(d.store(), &Options::default()).unwrap();
    s.put(b"c-extra", b"x").unwrap();
    drop(s); // clean
    let idx = spacejmp::segment::seg_path(&d.store(), "index");
    let mut bytes = std::fs::read(&idx).unwrap();
    for b in &mut bytes[4096..] {
        *b = 0;
    }
    std::fs::write(&idx, &bytes).unwrap();
    // Mark unclean, as a crash would have left it.
    let meta = spacejmp::segment::seg_path(&d.store(), "meta");
    let mut mb = std::fs::read(&meta).unwrap();
    let clean_off = 4096 + 8 * 8; // MetaHeader::clean
    mb[clean_off..clean_off + 8].copy_from_slice(&0u64.to_le_bytes());
    std::fs::write(&meta, &mb).unwrap();
    let s = SharedStore::attach(d.store(), &Options::default()).unwrap();
    let r = s.recovery_report().clone();
    assert!(r.rebuilt, "{r:?}");
    let mut m2 = m.clone();
    m2.insert("c-extra".into(), "x".into());
    for (k, v) in &m2 {
        assert_eq!(
            s.get(k.as_bytes()).unwrap().as_deref(),
            Some(v.as_bytes()),
            "{k}"
        );
    }
    assert_eq!(s.keys().unwrap().len(), m2.len());
    s.close().unwrap();
}

// ---------------------------------------------------------------------
// Compaction lease takeover.

fn role_compactor(dir: &Path) {
    // With a compaction thread, the process keeps the lease once it has it.
    let s = SharedStore::attach(dir.join("store"), &child_opts()).unwrap();
    // Churn and compact forever (until killed).
    let mut i = 0u64;
    let t0 = Instant::now();
    while s.stats().lease_holder != Some((std::process::id(), true)) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "never got the lease"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    loop {
        for _ in 0..200 {
            i += 1;
            let k = format!("churn{}", i % 100);
            s.put(k.as_bytes(), &vec![(i % 256) as u8; 300]).unwrap();
        }
        std::fs::write(dir.join("compacting"), b"").unwrap();
        let _ = s.compact_now();
    }
}

#[test]
fn compaction_lease_taken_over_after_sigkill() {
    let d = TempDir::new("lease");
    let s = SharedStore::create(
        d.store(),
        8 << 20,
        &Options {
            compaction_thread: false,
            ..Options::default()
        },
    )
    .unwrap();
    let mut model = HashMap::new();
    for i in 0..2000u32 {
        let k = format!("fixed{}", i % 400);
        let v = format!("v{i}-{}", "y".repeat((i % 300) as usize));
        s.put(k.as_bytes(), v.as_bytes()).unwrap();
        model.insert(k, v);
    }
    s.close().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(now_ns());
    // The parent stays attached throughout, so a kill is survived by a
    // running process (no recovery at attach): the lease must be taken over.
    let s = SharedStore::attach(
        d.store(),
        &Options {
            compaction_thread: false,
            ..Options::default()
        },
    )
    .unwrap();
    for round in 0..4 {
        let _ = std::fs::remove_file(d.0.join("compacting"));
        let mut c = spawn("compactor", &[("NJ_DIR", d.0.display().to_string())]);
        let t0 = Instant::now();
        while !d.0.join("compacting").exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "compactor never started"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..40)));
        let holder = s.stats().lease_holder;
        assert_eq!(
            holder,
            Some((c.id(), true)),
            "the compactor holds the lease"
        );
        kill9(&mut c);
        let before = s.stats().lease_takeovers;
        // Another process takes over the lease and compacts.
        let n = s.compact_now().unwrap();
        let st = s.stats();
        assert!(st.lease_holder.is_none(), "lease not released: {st:?}");
        assert_eq!(st.lease_takeovers, before + 1, "{st:?}");
        for (k, v) in &model {
            assert_eq!(
                s.get(k.as_bytes()).unwrap().as_deref(),
                Some(v.as_bytes()),
                "round {round}: {k} (compacted {n})"
            );
        }
    }
    s.close().unwrap();
}
