//! Scaffolding shared by the test files (each uses part of it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use nibblejmp::{Options, SharedStore};

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

/// Attach the store in `dir` with `opts`, rebuilding its index from the
/// log (the check that the log alone holds the contents).
pub fn attach_rebuilt(dir: impl AsRef<Path>, opts: Options) -> SharedStore {
    let s = SharedStore::attach(
        dir,
        &Options {
            rebuild: true,
            ..opts
        },
    )
    .unwrap();
    assert!(s.recovery_report().rebuilt);
    s
}
