//! What the smoke tests share: run the real `memlab` binary and read its
//! JSON rows.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::process::Command;

use serde_json::Value;

/// The `memlab` binary under test.
pub fn memlab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memlab"))
}

/// A run that succeeded: its JSON rows, and its stdout and stderr.
pub struct Run {
    pub rows: Vec<Value>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Rows of `bench` for `system`.
    pub fn count(&self, bench: &str, system: &str) -> usize {
        self.rows
            .iter()
            .filter(|r| r["bench"] == bench && r["system"] == system)
            .count()
    }
}

/// Run `cmd` (a `--json` memlab command line): it must succeed, and every
/// line of its stdout must be a JSON row.
pub fn run_json(cmd: &mut Command) -> Run {
    let out = cmd.output().expect("run memlab");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let rows = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON row"))
        .collect();
    Run {
        rows,
        stdout,
        stderr,
    }
}
