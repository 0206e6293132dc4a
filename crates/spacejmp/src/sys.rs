//! Thin wrappers over the few Linux facilities the crate needs beyond
//! `mmap`: thread ids and process identity (futexes come from `xsync`).
//!
//! A process is identified by `(pid, start time)`: the start time (field 22
//! of `/proc/PID/stat`, in clock ticks since boot) distinguishes a live
//! process from a later one that reused the pid, as LMDB's reader table does
//! with its pid checks. A zombie (killed, not yet reaped) counts as dead.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Identity of a process that may hold a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcId {
    pub pid: u32,
    pub start: u64,
}

// Identity caches: `getpid`/`gettid` are system calls (~100 ns each with
// today's mitigations) and the lock path needs them several times. The
// caches are invalidated in the child of a `fork` by an atfork handler that
// bumps FORK_GEN.
static CACHED_ID: AtomicU64 = AtomicU64::new(0);
static CACHED_PID: AtomicU32 = AtomicU32::new(0);
static FORK_GEN: AtomicU32 = AtomicU32::new(1);
static ATFORK: std::sync::Once = std::sync::Once::new();

extern "C" fn after_fork_child() {
    CACHED_PID.store(0, Ordering::Relaxed);
    FORK_GEN.fetch_add(1, Ordering::Relaxed);
}

/// This process's identity (cached; recomputed after `fork`).
pub fn self_id() -> ProcId {
    let cached = CACHED_PID.load(Ordering::Acquire);
    if cached != 0 {
        return ProcId {
            pid: cached,
            start: CACHED_ID.load(Ordering::Relaxed),
        };
    }
    ATFORK.call_once(|| {
        // SAFETY: registers a handler that only stores to atomics, which is
        // async-signal-safe as a fork child handler must be.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    });
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let start = proc_start(pid).map(|(s, _)| s).unwrap_or(0);
    CACHED_ID.store(start, Ordering::Relaxed);
    CACHED_PID.store(pid, Ordering::Release);
    ProcId { pid, start }
}

thread_local! {
    static TID: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
}

/// Kernel thread id of the caller (cached per thread and fork generation).
pub fn tid() -> u32 {
    let gen = FORK_GEN.load(Ordering::Relaxed);
    TID.with(|c| {
        let (g, t) = c.get();
        if g == gen {
            return t;
        }
        // SAFETY: gettid has no preconditions.
        let t = unsafe { libc::syscall(libc::SYS_gettid) as u32 };
        c.set((gen, t));
        t
    })
}

/// `(start time, state char)` of `pid` from `/proc/PID/stat`, or `None`
/// when no such process exists.
fn proc_start(pid: u32) -> Option<(u64, u8)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; the
    // fields after the last ')' are space-separated.
    let rest = &s[s.rfind(')')? + 2..];
    let mut it = rest.split(' ');
    let state = it.next()?.bytes().next()?;
    // `rest` starts at field 3; the start time is field 22.
    let start = it.nth(18)?.parse().ok()?;
    Some((start, state))
}

/// Whether the process recorded as `id` is still running (not a zombie, not
/// replaced by a process that reused its pid).
pub fn alive(id: ProcId) -> bool {
    if id.pid == 0 {
        return false;
    }
    match proc_start(id.pid) {
        None => false,
        Some((start, state)) => {
            state != b'Z' && state != b'X' && (id.start == 0 || start == id.start)
        }
    }
}

/// The base page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// `errno` of the last failed call.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
