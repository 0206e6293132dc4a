//! Scaffolding shared by the single-process test files.

use std::path::PathBuf;

use nibblejmp::Options;

/// A store directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = PathBuf::from(format!(
            "/dev/shm/nibblejmp-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Options without the background compaction thread (tests compact by hand).
pub fn quiet() -> Options {
    Options {
        compaction_thread: false,
        ..Options::default()
    }
}
