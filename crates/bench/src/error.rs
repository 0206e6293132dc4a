//! The error type of memlab's own code.
//!
//! A benchmark either cannot start (bad options: [`BenchError::Usage`]),
//! cannot write its results ([`BenchError::Output`]), hits an operating
//! system error it names ([`BenchError::Io`]), or finds that a run could
//! not complete: a peer server would not start or answer, a child process
//! failed, a store refused an operation ([`BenchError::Run`], with the
//! reason in words). Correctness failures are not errors: they go to the
//! [`crate::report::Reporter`], which turns them into the exit status.

use std::fmt;
use std::io;

/// What went wrong, for `memlab: error: ...` on stderr and exit status 1.
#[derive(Debug)]
pub enum BenchError {
    /// A command-line value is out of range or unknown.
    Usage(String),
    /// Writing result rows (stdout or `--out`) failed.
    Output(io::Error),
    /// An operating-system call failed; `what` says on what.
    Io { what: String, source: io::Error },
    /// A run could not complete (a peer, a child process, a store).
    Run(String),
}

/// `Result` with [`BenchError`].
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

impl BenchError {
    /// An I/O error on `what` (a path, a process).
    pub fn io(what: impl fmt::Display, source: io::Error) -> BenchError {
        BenchError::Io {
            what: what.to_string(),
            source,
        }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Usage(s) | BenchError::Run(s) => f.write_str(s),
            BenchError::Output(e) => write!(f, "output error: {e}"),
            BenchError::Io { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for BenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BenchError::Output(e) | BenchError::Io { source: e, .. } => Some(e),
            _ => None,
        }
    }
}

/// Messages built with `format!` are run failures.
impl From<String> for BenchError {
    fn from(s: String) -> BenchError {
        BenchError::Run(s)
    }
}

impl From<&str> for BenchError {
    fn from(s: &str) -> BenchError {
        BenchError::Run(s.to_string())
    }
}

/// A bare I/O error (no better context at hand) is a run failure too.
impl From<io::Error> for BenchError {
    fn from(e: io::Error) -> BenchError {
        BenchError::Run(e.to_string())
    }
}
