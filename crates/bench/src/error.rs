//! The error type of memlab's own code.
//!
//! A benchmark either cannot start (bad options: [`BenchError::Usage`]),
//! cannot write its results ([`BenchError::Output`]), hits an operating
//! system error it names ([`BenchError::Io`]), or finds that a run could
//! not complete: a peer server would not start or answer, a child process
//! failed, a store refused an operation ([`BenchError::Run`], with the
//! reason in words; [`BenchError::Context`], a library's or an inner
//! step's error with what was being done). Correctness failures are not
//! errors: they go to the [`crate::report::Reporter`], which turns them
//! into the exit status.
//!
//! [`Context`] adds the "what" to any error, so that `?` carries it:
//! `File::create(p).with_context(|| p.display())?` fails with
//! `/the/path: Permission denied`.

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
    /// A step failed; `what` says which, `source` why (a library's error,
    /// or the error of an inner step).
    Context {
        what: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
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
            BenchError::Context { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for BenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BenchError::Output(e) | BenchError::Io { source: e, .. } => Some(e),
            BenchError::Context { source, .. } => Some(&**source),
            BenchError::Usage(_) | BenchError::Run(_) => None,
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

/// Say what was being done when an error happened: the error becomes
/// `what: error` ([`BenchError::Io`] for an I/O error, else
/// [`BenchError::Context`]), its source kept.
pub trait Context<T> {
    fn context(self, what: impl fmt::Display) -> Result<T>;
    fn with_context<W: fmt::Display>(self, what: impl FnOnce() -> W) -> Result<T>;
}

impl<T, E> Context<T> for std::result::Result<T, E>
where
    E: std::error::Error + Send + Sync + 'static,
{
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| wrap(what.to_string(), e))
    }

    fn with_context<W: fmt::Display>(self, what: impl FnOnce() -> W) -> Result<T> {
        self.map_err(|e| wrap(what().to_string(), e))
    }
}

fn wrap<E: std::error::Error + Send + Sync + 'static>(what: String, e: E) -> BenchError {
    let source: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
    match source.downcast::<io::Error>() {
        Ok(e) => BenchError::Io { what, source: *e },
        Err(source) => BenchError::Context { what, source },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_the_message_and_the_source() {
        let e = Err::<(), _>(io::Error::from(io::ErrorKind::NotFound))
            .context("open /x")
            .unwrap_err();
        assert!(matches!(e, BenchError::Io { .. }));
        assert_eq!(e.to_string(), "open /x: entity not found");
        let inner: Result<()> = Err("no reply".into());
        let e = inner
            .with_context(|| "peer 1")
            .context("run 2")
            .unwrap_err();
        assert_eq!(e.to_string(), "run 2: peer 1: no reply");
        assert!(std::error::Error::source(&e).is_some());
    }
}
