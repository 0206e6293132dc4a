//! Every way a SpaceJMP operation can fail.
//!
//! The paper's API returns ids or `-1`; here each failure is a variant that
//! says what collided, which name, which address, and (in `Display`) what the
//! caller can do about it. Nothing in this crate panics on these paths.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Errors of the window, segment, registry, lock, VAS and heap layers.
#[derive(Debug)]
pub enum Error {
    /// The address window could not be reserved: something is already mapped
    /// in `[base, base + len)` (or the kernel refused the range).
    WindowTaken { base: u64, len: u64, errno: i32 },
    /// A segment's range is not inside the window.
    OutOfWindow {
        base: u64,
        size: u64,
        window_base: u64,
        window_len: u64,
    },
    /// A range inside the window is already used by another segment.
    AddressInUse { base: u64, size: u64, by: String },
    /// No free range of the requested size is left in the window.
    WindowFull { size: u64 },
    /// A segment or VAS with this name already exists.
    NameExists { kind: &'static str, name: String },
    /// No segment or VAS with this name.
    NotFound { kind: &'static str, name: String },
    /// A name is empty, too long or contains characters other than
    /// `[A-Za-z0-9._-]`.
    InvalidName(String),
    /// An argument is out of range (unaligned base, zero size, ...).
    InvalidArgument(String),
    /// The segment's header does not match what the registry or the caller
    /// expects (magic, version, base, size, name).
    HeaderMismatch { name: String, what: String },
    /// The caller may not access the segment in the requested mode (file
    /// permissions or the mode recorded in the header).
    PermissionDenied { name: String, detail: String },
    /// The backing store has no room for the segment (tmpfs or hugetlbfs
    /// full); reported at creation instead of a SIGBUS later.
    NoSpace { path: PathBuf, size: u64 },
    /// A segment file is shorter than the size its registry entry and
    /// header record (truncated): refused before it is mapped, since
    /// touching a mapped page past the end of a file raises SIGBUS.
    ShortFile {
        path: PathBuf,
        file_bytes: u64,
        expected_bytes: u64,
    },
    /// A segment could not be mapped at its fixed address.
    MapFailed { name: String, base: u64, errno: i32 },
    /// Switching needs to remap a range that another thread of this process
    /// is using through a different VAS.
    Busy {
        base: u64,
        size: u64,
        holder: String,
    },
    /// The calling thread is already inside a VAS; drop (or `switch_to`) the
    /// active guard first.
    AlreadyActive { vas: String },
    /// A lock could not be taken before the deadline.
    Timeout { what: String },
    /// The segment is lockable but its last writer died without marking it
    /// consistent, and the caller asked for strict behaviour.
    Inconsistent { name: String },
    /// A segment heap is out of memory.
    HeapFull { name: String, requested: u64 },
    /// A pointer does not lie in the active VAS (the checked cast failed).
    BadPointer { addr: u64 },
    /// A VAS process of the process-per-VAS backend ([`crate::procvas`])
    /// failed to start, died, or is gone.
    VasProcess { vas: String, detail: String },
    /// A process-per-VAS call was made outside the lane it belongs to (not
    /// on the lane's shared stack, or from another thread), or the lane was
    /// lost with a VAS process that died while running it.
    Lane(String),
    /// Code running in a VAS process returned an error or panicked; its
    /// message crosses back as text (the error value itself lives in that
    /// process's private heap).
    InVas { vas: String, detail: String },
    /// Any other operating-system failure.
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn last_os(op: &'static str, path: impl Into<PathBuf>) -> Self {
        Self::io(op, path, io::Error::last_os_error())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::WindowTaken { base, len, errno } => write!(
                f,
                "cannot reserve the address window [{base:#x}, {:#x}) ({}): something is already \
                 mapped there; choose another base with Config::window or SPACEJMP_WINDOW=BASE:LEN",
                base + len,
                io::Error::from_raw_os_error(*errno)
            ),
            Error::OutOfWindow {
                base,
                size,
                window_base,
                window_len,
            } => write!(
                f,
                "segment [{base:#x}, {:#x}) is outside the window [{window_base:#x}, {:#x})",
                base + size,
                window_base + window_len
            ),
            Error::AddressInUse { base, size, by } => write!(
                f,
                "address range [{base:#x}, {:#x}) is already used by {by}",
                base + size
            ),
            Error::WindowFull { size } => {
                write!(f, "no free range of {size} bytes left in the window")
            }
            Error::NameExists { kind, name } => write!(f, "{kind} `{name}` already exists"),
            Error::NotFound { kind, name } => write!(f, "no {kind} named `{name}`"),
            Error::InvalidName(n) => write!(
                f,
                "invalid name `{n}`: use 1-63 characters from [A-Za-z0-9._-]"
            ),
            Error::InvalidArgument(s) => write!(f, "invalid argument: {s}"),
            Error::HeaderMismatch { name, what } => {
                write!(f, "segment `{name}` header mismatch: {what}")
            }
            Error::PermissionDenied { name, detail } => {
                write!(f, "permission denied on `{name}`: {detail}")
            }
            Error::NoSpace { path, size } => write!(
                f,
                "no space for {size} bytes in {} (tmpfs/hugetlbfs full?)",
                path.display()
            ),
            Error::ShortFile {
                path,
                file_bytes,
                expected_bytes,
            } => write!(
                f,
                "segment file {} is {file_bytes} bytes but its registry entry needs \
                 {expected_bytes} bytes (truncated?); refusing to map it",
                path.display()
            ),
            Error::MapFailed { name, base, errno } => write!(
                f,
                "segment `{name}` cannot be mapped at {base:#x}: {}",
                io::Error::from_raw_os_error(*errno)
            ),
            Error::Busy { base, size, holder } => write!(
                f,
                "range [{base:#x}, {:#x}) is in use by another thread through {holder}; a switch \
                 between overlapping VASes is a process-wide remap and must wait",
                base + size
            ),
            Error::AlreadyActive { vas } => {
                write!(f, "this thread is already inside VAS `{vas}`")
            }
            Error::Timeout { what } => write!(f, "timed out waiting for {what}"),
            Error::Inconsistent { name } => write!(
                f,
                "segment `{name}` may be inconsistent: its lock holder died (run `jmp recover`)"
            ),
            Error::HeapFull { name, requested } => {
                write!(f, "heap in segment `{name}` cannot fit {requested} bytes")
            }
            Error::BadPointer { addr } => {
                write!(f, "pointer {addr:#x} does not lie in the active VAS")
            }
            Error::VasProcess { vas, detail } => {
                write!(f, "the process of VAS `{vas}` {detail}")
            }
            Error::Lane(what) => write!(f, "process-per-VAS lane: {what}"),
            Error::InVas { vas, detail } => write!(f, "in VAS `{vas}`: {detail}"),
            Error::Io { op, path, source } => {
                write!(f, "{op} {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
