//! Shared test scaffolding: a private store directory and window per test,
//! removed on drop, and child processes that re-run this test binary with a
//! role in the environment.

#![allow(dead_code)] // each test binary uses a different subset

use spacejmp::{Config, Jmp};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A store private to one test (pid + tag), removed on drop.
pub struct Store {
    pub dir: PathBuf,
    pub window: (u64, u64),
}

impl Store {
    /// `slot` picks a 1 TiB window so tests in one process never collide.
    pub fn new(tag: &str, slot: u64) -> Store {
        let dir = PathBuf::from(format!("/dev/shm/sjmp-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Store {
            dir,
            window: (0x2000_0000_0000 + slot * 0x100_0000_0000, 0x100_0000_0000),
        }
    }

    pub fn config(&self) -> Config {
        Config::with_store(&self.dir).window(self.window.0, self.window.1)
    }

    pub fn open(&self) -> Jmp {
        Jmp::open(self.config()).expect("open store")
    }

    /// Spawn this test binary as a child running `role`.
    pub fn child(&self, role: &str, args: &[(&str, String)]) -> Child {
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
    pub fn run_child(&self, role: &str, args: &[(&str, String)]) -> String {
        let out = self
            .child(role, args)
            .wait_with_output()
            .expect("wait child");
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "child {role} failed: {s}");
        s
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
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
