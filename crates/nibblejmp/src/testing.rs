//! Deterministic crash injection, for the crash-guarantee tests.
//!
//! Random SIGKILLs rarely land inside a critical section that lasts a few
//! hundred nanoseconds, so every row of the crash table in the crate essay
//! also has a named point at which a test can make the process kill itself
//! (`SIGKILL`, so no destructor or unlock runs, exactly as an external
//! kill). Unset, a point costs one relaxed load of a process-local byte.

use std::sync::atomic::{AtomicU8, Ordering};

/// The power-loss test layer's cut (see `store/durability.rs`).
pub use crate::store::apply_power_cut;

/// Where [`crash_at`] makes the process die.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CrashPoint {
    /// No crash (the default).
    Never = 0,
    /// Holding a head lock, object written, `head.off` not advanced.
    AppendMidCopy,
    /// Holding a head lock, a segment claimed (OPEN) but not linked.
    SegmentClaimed,
    /// Object appended, intent recorded, before the bucket locks.
    PutAppended,
    /// Holding the bucket locks, entry stored (a), before commit (b).
    PutEntryStored,
    /// Holding the bucket locks, committed (b), before the old copy is
    /// marked dead (c).
    PutCommitted,
    /// Holding the bucket locks, entry cleared, before the old copy is
    /// marked dead.
    DeleteEntryCleared,
    /// Compaction: holding the bucket locks, object copied, before (a).
    MoveCopied,
    /// Compaction: holding the bucket locks, entry moved (a), before (b).
    MoveEntryStored,
    /// `set_expiry`: holding the bucket locks, the expiry word stored.
    ExpiryStored,
}

static CRASH_AT: AtomicU8 = AtomicU8::new(CrashPoint::Never as u8);

/// Make this process SIGKILL itself when it next reaches `p`.
pub fn crash_at(p: CrashPoint) {
    CRASH_AT.store(p as u8, Ordering::Relaxed);
}

/// Die here if a test asked for it.
#[inline]
pub(crate) fn point(p: CrashPoint) {
    if CRASH_AT.load(Ordering::Relaxed) == p as u8 && p != CrashPoint::Never {
        // SAFETY: kill of our own pid with SIGKILL; it does not return.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        loop {
            std::thread::park();
        }
    }
}
