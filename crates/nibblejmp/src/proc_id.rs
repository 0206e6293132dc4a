//! Process identity that survives pid reuse, packed in one word.
//!
//! Everything in the shared segments that names a process (an epoch slot's
//! owner, the compaction lease) stores `start << 22 | pid`: the pid (Linux's
//! `pid_max` is at most 2^22) and the process start time in clock ticks
//! since boot (field 22 of `/proc/PID/stat`; 41 bits are 697 years at 100
//! Hz). One word means one atomic compare-and-swap claims or steals it, and
//! a later process that reuses the pid has another start time, so a dead
//! owner is never mistaken for a live one (LMDB's reader table and
//! `spacejmp::lock` do the same with two words). A zombie counts as dead.
//! Bit 63 is free for callers' markers ([`RECLAIM_BIT`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// Bits of the pid in a packed id.
pub const PID_BITS: u32 = 22;
/// Bits of the start time in a packed id.
pub const START_BITS: u32 = 41;
/// Marker bit: the slot is being reclaimed by the process named in the
/// other bits.
pub const RECLAIM_BIT: u64 = 1 << 63;

const PID_MASK: u64 = (1 << PID_BITS) - 1;
const START_MASK: u64 = (1 << START_BITS) - 1;

static SELF_ID: AtomicU64 = AtomicU64::new(0);
static SELF_PID: AtomicU64 = AtomicU64::new(0);

/// Pack a pid and start time.
pub fn pack(pid: u32, start_ticks: u64) -> u64 {
    ((start_ticks & START_MASK) << PID_BITS) | (pid as u64 & PID_MASK)
}

/// The pid of a packed id (marker bits ignored).
pub fn pid_of(id: u64) -> u32 {
    (id & PID_MASK) as u32
}

/// The start time of a packed id (marker bits ignored).
pub fn start_of(id: u64) -> u64 {
    (id >> PID_BITS) & START_MASK
}

/// `(start ticks, state char)` of `pid`, or `None` if there is no such
/// process.
fn proc_stat(pid: u32) -> Option<(u64, u8)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command (field 2) may hold spaces and parentheses: split after
    // the last ')'. `rest` starts at field 3 (state); start time is 22.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let mut it = rest.split(' ');
    let state = it.next()?.bytes().next()?;
    let start = it.nth(18)?.parse().ok()?;
    Some((start, state))
}

/// This process's packed id (cached per pid, so a forked child recomputes).
pub fn self_id() -> u64 {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    if SELF_PID.load(Ordering::Acquire) == pid as u64 {
        return SELF_ID.load(Ordering::Relaxed);
    }
    let start = proc_stat(pid).map(|(s, _)| s).unwrap_or(0);
    let id = pack(pid, start);
    SELF_ID.store(id, Ordering::Relaxed);
    SELF_PID.store(pid as u64, Ordering::Release);
    id
}

/// Whether the process named by `id` is running (not a zombie, not a later
/// process that reused the pid).
pub fn alive(id: u64) -> bool {
    let pid = pid_of(id);
    if pid == 0 {
        return false;
    }
    match proc_stat(pid) {
        None => false,
        Some((start, state)) => {
            state != b'Z' && state != b'X' && (start & START_MASK) == start_of(id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_is_alive_and_packing_round_trips() {
        let me = self_id();
        assert!(alive(me));
        assert_eq!(pid_of(me), std::process::id());
        assert_eq!(pack(pid_of(me), start_of(me)), me);
        // Same pid, another start time: a different (dead) process.
        assert!(!alive(pack(pid_of(me), start_of(me) + 1)));
        assert!(!alive(0));
    }
}
