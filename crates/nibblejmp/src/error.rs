//! Every way a shared-store operation can fail.
//!
//! One enum, `std::error::Error`, with the facts a caller needs in the
//! variant (which path, which limit). Nothing in this crate panics on these
//! paths: a directory that is not a store, a store of another layout
//! version, a full log and a stuck lock holder are all errors.

use std::fmt;
use std::path::PathBuf;

/// Result alias of the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Errors of [`SharedStore`](crate::SharedStore) and its CLI.
#[derive(Debug)]
pub enum Error {
    /// The capacity is below the minimum the geometry needs.
    CapacityTooSmall { capacity_bytes: u64, min_bytes: u64 },
    /// An option is out of range.
    InvalidArgument(String),
    /// `create` found a store already there.
    Exists(PathBuf),
    /// `attach` found no store there.
    NotFound(PathBuf),
    /// The segments exist but do not hold a nibblejmp store (bad magic, a
    /// geometry that does not match the segment sizes, an incomplete
    /// creation).
    NotAStore { path: PathBuf, what: String },
    /// The store was written by another layout version of this crate.
    WrongVersion {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    /// The key is longer than the object header can record.
    KeyTooLarge { len: usize, max: usize },
    /// The object does not fit in one log segment.
    ValueTooLarge { len: usize, max: usize },
    /// The log is full and compaction cannot free a segment in time; reads
    /// and deletes still work, and writes succeed again after deletes.
    OutOfMemory {
        live_bytes: u64,
        capacity_bytes: u64,
    },
    /// Conditional write (`IfAbsent`): the key exists.
    KeyExists,
    /// Conditional write or delete (`IfPresent`, `IfVersion`): the key does
    /// not exist (or has expired).
    KeyNotFound,
    /// Compare-and-swap (`IfVersion`): the key has another version.
    VersionMismatch { current: u64 },
    /// Both buckets of the key's neighbourhood are full (the index has a
    /// fixed capacity chosen at creation).
    IndexFull,
    /// A lock stayed held by a live process beyond the wait bound, or an
    /// exclusive operation (rebuild, remove) found other live processes.
    Busy(String),
    /// The store was closed.
    Closed,
    /// Recovery found damage it could not repair.
    Corrupt(String),
    /// The stored object of this key fails its checksum (the store's files
    /// were damaged): it is not served. The key (lossy UTF-8, at most 64
    /// bytes) is named; other keys are unaffected.
    Damaged { key: String },
    /// An error from the SpaceJMP layer (segments, registry, window).
    Jmp(spacejmp::Error),
    /// An I/O error with context.
    Io {
        what: String,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::CapacityTooSmall {
                capacity_bytes,
                min_bytes,
            } => write!(
                f,
                "capacity of {capacity_bytes} bytes is too small: at least {min_bytes} bytes"
            ),
            Error::InvalidArgument(s) => write!(f, "invalid argument: {s}"),
            Error::Exists(p) => write!(f, "a store already exists in {}", p.display()),
            Error::NotFound(p) => write!(f, "no store in {}", p.display()),
            Error::NotAStore { path, what } => {
                write!(f, "{} does not hold a nibblejmp store: {what}", path.display())
            }
            Error::WrongVersion {
                path,
                found,
                expected,
            } => write!(
                f,
                "store in {} has layout version {found}, this build reads {expected}",
                path.display()
            ),
            Error::KeyTooLarge { len, max } => {
                write!(f, "key of {len} bytes: keys are at most {max} bytes")
            }
            Error::ValueTooLarge { len, max } => write!(
                f,
                "object of {len} bytes does not fit a log segment (at most {max} bytes of key and value)"
            ),
            Error::OutOfMemory {
                live_bytes,
                capacity_bytes,
            } => write!(
                f,
                "out of memory: {live_bytes} live bytes in a store of {capacity_bytes} bytes and compaction freed nothing in time; delete keys to make room"
            ),
            Error::KeyExists => write!(f, "key exists"),
            Error::KeyNotFound => write!(f, "key not found"),
            Error::VersionMismatch { current } => {
                write!(f, "version mismatch (current version {current})")
            }
            Error::IndexFull => write!(f, "the index neighbourhood of this key is full"),
            Error::Busy(s) => write!(f, "busy: {s}"),
            Error::Closed => write!(f, "the store is closed"),
            Error::Corrupt(s) => write!(f, "store damaged: {s}"),
            Error::Damaged { key } => write!(
                f,
                "the stored object of key `{key}` is damaged (checksum mismatch); not served"
            ),
            Error::Jmp(e) => write!(f, "spacejmp: {e}"),
            Error::Io { what, path, source } => {
                write!(f, "{what} {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Jmp(e) => Some(e),
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<spacejmp::Error> for Error {
    fn from(e: spacejmp::Error) -> Self {
        Error::Jmp(e)
    }
}

impl From<nibble::ConditionFailed> for Error {
    fn from(e: nibble::ConditionFailed) -> Self {
        match e {
            nibble::ConditionFailed::Exists => Error::KeyExists,
            nibble::ConditionFailed::NotFound => Error::KeyNotFound,
            nibble::ConditionFailed::VersionMismatch { current } => {
                Error::VersionMismatch { current }
            }
        }
    }
}

/// The engine-neutral view for code written against `nibble::Store` (the
/// server): conditional-write outcomes and limits map onto nibble's
/// variants of the same meaning; the rest (lock waits, damage, I/O) has no
/// counterpart there and becomes `nibble::Error::Io` with the message.
impl From<Error> for nibble::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::KeyExists => nibble::Error::Exists,
            Error::KeyNotFound => nibble::Error::NotFound,
            Error::VersionMismatch { current } => nibble::Error::VersionMismatch { current },
            Error::KeyTooLarge { len, .. } => nibble::Error::BadKey { len },
            Error::ValueTooLarge { len, max } => nibble::Error::ValueTooLarge { len, max },
            Error::OutOfMemory { .. } => nibble::Error::OutOfMemory { what: "log" },
            Error::IndexFull => nibble::Error::OutOfMemory { what: "index" },
            e => nibble::Error::Io(std::io::Error::other(e.to_string())),
        }
    }
}
