//! Multi-process tests: processes share segments at fixed addresses and
//! follow each other's pointers; lock contention; owner death; registry
//! races. Children are this binary re-run with `SJMP_ROLE` set.

mod common;

use common::Store;
use spacejmp::{seg_struct, Access, Config, Jmp, SegMap, SegOptions, SegPtr, SegStr};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

seg_struct! {
    pub struct Node { pub val: u64, pub name: SegStr, pub next: SegPtr<Node> }
}

seg_struct! {
    pub struct Root { pub list: SegPtr<Node>, pub map: SegMap<u64>, pub count: u64 }
}

const LIST_LEN: u64 = 1000;

/// Children re-run this test binary with a role in the environment.
trait Spawn {
    fn child(&self, role: &str, args: &[(&str, String)]) -> Child;
    fn run_child(&self, role: &str, args: &[(&str, String)]) -> String;
}

impl Spawn for Store {
    /// Spawn this test binary as a child running `role`.
    fn child(&self, role: &str, args: &[(&str, String)]) -> Child {
        let mut c = Command::new(std::env::current_exe().expect("current exe"));
        c.args([
            "child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("SJMP_ROLE", role)
        .env("SJMP_STORE", &self.dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        for (k, v) in args {
            c.env(k, v);
        }
        c.spawn().expect("spawn child")
    }

    /// Run a child to completion; assert success; return its stdout.
    fn run_child(&self, role: &str, args: &[(&str, String)]) -> String {
        let out = self
            .child(role, args)
            .wait_with_output()
            .expect("wait child");
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "child {role} failed: {s}");
        s
    }
}

/// In a child: open the store named by the environment.
pub fn child_jmp() -> Jmp {
    let dir = std::env::var("SJMP_STORE").expect("SJMP_STORE");
    Jmp::open(Config::with_store(dir)).expect("child open")
}

pub fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// Child roles. Does nothing when run as an ordinary test.
#[test]
fn child_entry() {
    let role = env("SJMP_ROLE");
    match role.as_str() {
        "" => {}
        "build" => build(),
        "read" => read(),
        "incr" => incr(env("N").parse().unwrap()),
        "hold" => hold(env("ACCESS") == "w"),
        "create" => create(&env("PREFIX"), env("N").parse().unwrap()),
        "vas-race" => {
            let ok = child_jmp().vas_create("same", 0o660).is_ok();
            println!("{}", if ok { "won" } else { "lost" });
        }
        r => panic!("unknown role {r}"),
    }
}

fn build() {
    let jmp = child_jmp();
    let vh = jmp.vas_attach("v", Default::default()).unwrap();
    let mut a = vh.switch().unwrap();
    let mut head = SegPtr::<Node>::null();
    for i in 0..LIST_LEN {
        let name = SegStr::new(&mut a, "s", &format!("node-{i}")).unwrap();
        head = a
            .alloc(
                "s",
                Node {
                    val: i,
                    name,
                    next: head,
                },
            )
            .unwrap();
    }
    let mut map = SegMap::<u64>::new(&mut a, "s", 16).unwrap();
    for i in 0..LIST_LEN {
        map.insert(&mut a, format!("key-{i}").as_bytes(), i * 7)
            .unwrap();
    }
    let root = a
        .alloc(
            "s",
            Root {
                list: head,
                map,
                count: LIST_LEN,
            },
        )
        .unwrap();
    a.set_root("s", root).unwrap();
    // Updating a map stored in the segment: copy the header out, write back.
    let mut m = root.get(&a).unwrap().map;
    m.insert(&mut a, b"late", 99).unwrap();
    root.get_mut(&mut a).unwrap().map = m;
    println!("built {:#x}", root.addr());
}

fn check_structure(a: &spacejmp::Active<'_>) {
    let root: SegPtr<Root> = a.root("s").unwrap();
    assert!(!root.is_null());
    let r = root.get(a).unwrap();
    assert_eq!(r.count, LIST_LEN);
    let mut p = r.list;
    let mut expect = LIST_LEN;
    while !p.is_null() {
        let n = p.get(a).unwrap();
        expect -= 1;
        assert_eq!(n.val, expect);
        assert_eq!(n.name.as_str(a).unwrap(), format!("node-{expect}"));
        p = n.next;
    }
    assert_eq!(expect, 0);
    assert_eq!(r.map.len() as u64, LIST_LEN + 1);
    assert_eq!(r.map.get(a, b"late").unwrap(), Some(&99));
    for i in 0..LIST_LEN {
        assert_eq!(
            r.map.get(a, format!("key-{i}").as_bytes()).unwrap(),
            Some(&(i * 7))
        );
    }
    assert_eq!(r.map.get(a, b"missing").unwrap(), None);
}

fn read() {
    let jmp = child_jmp();
    let vh = jmp.vas_attach("vr", Default::default()).unwrap();
    let a = vh.switch().unwrap();
    check_structure(&a);
    println!("read ok");
}

fn incr(n: u64) {
    let jmp = child_jmp();
    let vh = jmp.vas_attach("v", Default::default()).unwrap();
    for _ in 0..n {
        let mut a = vh.switch().unwrap();
        let b = a.bytes_mut("s").unwrap();
        // A deliberately non-atomic read-modify-write: only the segment lock
        // makes it correct.
        let mut x = u64::from_le_bytes(b[..8].try_into().unwrap());
        std::thread::yield_now();
        x += 1;
        b[..8].copy_from_slice(&x.to_le_bytes());
    }
}

fn hold(write: bool) {
    let jmp = child_jmp();
    let vh = jmp
        .vas_attach(if write { "v" } else { "vr" }, Default::default())
        .unwrap();
    let mut a = vh.switch().unwrap();
    if write {
        a.bytes_mut("s").unwrap()[..8].copy_from_slice(&0xdead_u64.to_le_bytes());
    }
    println!("ready");
    std::thread::sleep(Duration::from_secs(60));
}

fn create(prefix: &str, n: u32) {
    let jmp = child_jmp();
    for i in 0..n {
        jmp.seg_alloc(&format!("{prefix}-{i}"), 1 << 20, &SegOptions::default())
            .unwrap();
    }
}

/// A store with segment `s`, VAS `v` (s writable) and `vr` (s read-only).
fn setup(tag: &str, slot: u64, size: u64) -> Store {
    let st = Store::new(tag, slot);
    let jmp = st.open();
    jmp.seg_alloc("s", size, &SegOptions::default()).unwrap();
    jmp.vas_create("v", 0o660).unwrap();
    jmp.seg_attach("v", "s", Access::Write).unwrap();
    jmp.vas_create("vr", 0o660).unwrap();
    jmp.seg_attach("vr", "s", Access::Read).unwrap();
    st
}

#[test]
fn pointer_rich_structure_outlives_its_builder() {
    let st = setup("persist", 1, 16 << 20);
    st.run_child("build", &[]);
    // A second process follows the first one's raw pointers in place.
    assert!(st.run_child("read", &[]).contains("read ok"));
    // And so does this one.
    let jmp = st.open();
    let vh = jmp.vas_attach("vr", Default::default()).unwrap();
    let a = vh.switch().unwrap();
    check_structure(&a);
}

#[test]
fn two_processes_share_a_segment_under_the_lock() {
    let st = setup("contend", 2, 1 << 20);
    let n = 300u64;
    let kids: Vec<_> = (0..2)
        .map(|_| st.child("incr", &[("N", n.to_string())]))
        .collect();
    for k in kids {
        let out = k.wait_with_output().unwrap();
        assert!(out.status.success());
    }
    let jmp = st.open();
    let vh = jmp.vas_attach("vr", Default::default()).unwrap();
    let a = vh.switch().unwrap();
    let x = u64::from_le_bytes(a.bytes("s").unwrap()[..8].try_into().unwrap());
    assert_eq!(x, 2 * n);
}

fn spawn_and_kill(st: &Store, write: bool) {
    let mut c = st.child("hold", &[("ACCESS", if write { "w" } else { "r" }.into())]);
    let mut rd = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "ready" {
        line.clear();
        assert!(
            rd.read_line(&mut line).unwrap() > 0,
            "child exited before ready"
        );
    }
    c.kill().unwrap(); // SIGKILL
                       // Deliberately not reaped yet: a zombie must count as dead.
    std::thread::sleep(Duration::from_millis(20));
    let jmp = st.open();
    let vh = jmp.vas_attach("v", Default::default()).unwrap();
    {
        let mut a = vh
            .switch_until(Some(std::time::Instant::now() + Duration::from_secs(5)))
            .unwrap();
        assert_eq!(a.owner_died("s").unwrap(), write);
        if write {
            let x = u64::from_le_bytes(a.bytes("s").unwrap()[..8].try_into().unwrap());
            assert_eq!(x, 0xdead);
            a.mark_consistent("s").unwrap();
        }
    }
    let a = vh.switch().unwrap();
    assert!(!a.owner_died("s").unwrap());
    drop(a);
    c.wait().unwrap();
    drop(rd);
}

#[test]
fn killed_writer_is_recovered_by_the_next_process() {
    let st = setup("death-w", 3, 1 << 20);
    spawn_and_kill(&st, true);
}

#[test]
fn killed_reader_is_reclaimed() {
    let st = setup("death-r", 4, 1 << 20);
    spawn_and_kill(&st, false);
}

#[test]
fn concurrent_creators_do_not_corrupt_the_registry() {
    let st = Store::new("race", 5);
    drop(st.open());
    let kids: Vec<_> = (0..4)
        .map(|i| st.child("create", &[("PREFIX", format!("p{i}")), ("N", "8".into())]))
        .collect();
    for k in kids {
        assert!(k.wait_with_output().unwrap().status.success());
    }
    let jmp = st.open();
    let reg = jmp.registry().snapshot().unwrap();
    assert_eq!(reg.segs.len(), 32);
    let mut r: Vec<_> = reg.segs.iter().map(|s| (s.base, s.end())).collect();
    r.sort_unstable();
    for w in r.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlap {w:?}");
    }
    for s in &reg.segs {
        jmp.seg_header(&s.name).unwrap();
    }
}

#[test]
fn only_one_process_creates_a_name() {
    let st = Store::new("vasrace", 6);
    drop(st.open());
    let kids: Vec<_> = (0..4).map(|_| st.child("vas-race", &[])).collect();
    let mut won = 0;
    for k in kids {
        let out = k.wait_with_output().unwrap();
        assert!(out.status.success());
        won += String::from_utf8_lossy(&out.stdout).matches("won").count();
    }
    assert_eq!(won, 1);
    assert!(st.open().vas_find("same").is_ok());
}

/// Runs the `jmp` CLI on this test's store; returns (success, stdout + stderr).
fn jmp_cli(st: &Store, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_jmp"))
        .arg("--store")
        .arg(&st.dir)
        .args(args)
        .output()
        .expect("run jmp");
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), s)
}

#[test]
fn cli_manages_segments_and_recovers_a_dead_holder() {
    let st = setup("cli", 6, 1 << 20);
    // Create, list, inspect, refuse a duplicate, VAS, remove.
    let (ok, out) = jmp_cli(&st, &["create", "extra", "2M"]);
    assert!(ok, "{out}");
    let (ok, out) = jmp_cli(&st, &["list"]);
    assert!(
        ok && out.contains("extra") && out.contains("vas v"),
        "{out}"
    );
    let (ok, out) = jmp_cli(&st, &["inspect", "extra"]);
    assert!(
        ok && out.contains("magic") && out.contains("holders   -"),
        "{out}"
    );
    let (ok, out) = jmp_cli(&st, &["create", "extra", "2M"]);
    assert!(!ok && out.contains("jmp:"), "duplicate accepted: {out}");
    let (ok, out) = jmp_cli(&st, &["create", "bad", "lots"]);
    assert!(!ok && out.contains("usage"), "{out}");
    let (ok, out) = jmp_cli(&st, &["vas", "vx", "extra:w"]);
    assert!(ok, "{out}");
    assert!(jmp_cli(&st, &["rm-vas", "vx"]).0);
    assert!(jmp_cli(&st, &["rm", "extra"]).0);
    let (_, out) = jmp_cli(&st, &["list"]);
    assert!(!out.contains("extra"), "{out}");

    // A writer dies holding the lock: list shows it dead, recover clears it.
    let mut c = st.child("hold", &[("ACCESS", "w".into())]);
    let mut rd = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "ready" {
        line.clear();
        assert!(rd.read_line(&mut line).unwrap() > 0, "child exited early");
    }
    c.kill().unwrap();
    c.wait().unwrap();
    let (ok, out) = jmp_cli(&st, &["list"]);
    assert!(ok && out.contains("(dead)"), "{out}");
    let (ok, out) = jmp_cli(&st, &["recover", "s"]);
    assert!(ok && out.contains("removed 1 dead holder"), "{out}");
    let (_, out) = jmp_cli(&st, &["list"]);
    assert!(
        !out.contains("(dead)") && !out.contains("INCONSISTENT"),
        "{out}"
    );
}
