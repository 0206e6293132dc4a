//! Shared test scaffolding: a private store directory and window per test,
//! removed on drop.

use spacejmp::{Config, Jmp};
use std::path::PathBuf;

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
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
