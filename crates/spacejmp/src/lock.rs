//! Lockable segments: a reader/writer lock that lives in the segment header,
//! works across processes, and survives the death of a holder.
//!
//! SpaceJMP §3.1: "In order to switch into an address space, the OS must
//! acquire a reader/writer lock on each lockable segment in that address
//! space ... if the segment is mapped read-only, the lock will be acquired in
//! a shared mode ... if writable, exclusively." The kernel can release the
//! locks of a dying process; a user-space lock must notice the death itself.
//!
//! # Layout (in the header page, `MAP_SHARED`)
//!
//! ```text
//!  latch  u32   0 = free, else pid of the process editing the fields below
//!  seq    u32   bumped on every release; the futex word waiters sleep on
//!  waiters u32  number of sleepers (release skips FUTEX_WAKE when 0)
//!  flags  u32   bit 0: INCONSISTENT (a writer died holding the lock)
//!  writer pid u32, tid u32, start u64      0 = no writer
//!  readers[64]: { pid u32, count u32, start u64 }   LMDB-style reader slots
//! ```
//!
//! Every field is edited only under the *latch*, a tiny spin lock held for a
//! few dozen instructions. The reader count is not stored separately: it is
//! the sum of the slots, so a process that dies anywhere leaves a state that
//! the next latch holder can repair by clearing the dead entries.
//!
//! # Death of a holder
//!
//! Processes are named by `(pid, start time)` (see `sys`). An acquirer that
//! finds the lock held checks, at most every [`POLL`], whether the holder is
//! still alive:
//!
//! ```text
//!  P1: write_lock ── writer=P1 ── ... SIGKILL
//!  P2: write_lock ── held by P1 ── futex_wait(seq, 2ms) ── P1 dead? yes
//!                 ── clear writer, set INCONSISTENT ── writer=P2
//!                 ── returns Acquired { owner_died: true }   (like EOWNERDEAD)
//!  P2: ...repair data... mark_consistent()
//! ```
//!
//! Dead readers are reclaimed silently (readers do not modify data). A dead
//! latch holder (killed inside the few instructions) is detected the same
//! way and the latch is stolen; the state it guards is always repairable.
//!
//! The lock is reader-preferring: a stream of overlapping readers can starve
//! a writer (acquirers may pass a deadline). A thread that holds the read
//! lock and asks for the write lock on the same segment waits for itself;
//! the VAS layer never does this (it releases before it acquires).

use crate::error::{Error, Result};
use crate::sys::{self, ProcId};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Reader slots per lock.
pub const READER_SLOTS: usize = 64;
/// How long a waiter sleeps before re-checking holder liveness.
pub const POLL: Duration = Duration::from_millis(2);
/// Spins on the latch before checking whether its holder died.
const LATCH_SPINS: u32 = 1 << 12;

const INCONSISTENT: u32 = 1;

#[repr(C)]
struct ReaderSlot {
    pid: AtomicU32,
    count: AtomicU32,
    start: AtomicU64,
}

/// The shared lock state. Lives in mapped memory; all-zero is unlocked.
#[repr(C)]
pub struct RawRwLock {
    latch: AtomicU32,
    seq: AtomicU32,
    waiters: AtomicU32,
    flags: AtomicU32,
    writer_pid: AtomicU32,
    writer_tid: AtomicU32,
    writer_start: AtomicU64,
    readers: [ReaderSlot; READER_SLOTS],
}

/// What an acquisition found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired {
    /// A previous writer died holding the lock and nobody has called
    /// `mark_consistent` since: the protected data may be inconsistent
    /// (the analogue of `EOWNERDEAD`).
    pub owner_died: bool,
}

/// One holder as reported by [`RawRwLock::holders`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub tid: u32,
    pub writer: bool,
    pub count: u32,
    pub alive: bool,
}

/// Lock mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Shared,
    Exclusive,
}

struct Latch<'a>(&'a RawRwLock);

impl Drop for Latch<'_> {
    fn drop(&mut self) {
        self.0.latch.store(0, Ordering::Release);
    }
}

impl RawRwLock {
    fn latch(&self) -> Latch<'_> {
        let me = sys::self_id().pid;
        let mut spins = 0u32;
        loop {
            let cur = self.latch.load(Ordering::Relaxed);
            if cur == 0 {
                if self
                    .latch
                    .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return Latch(self);
                }
                continue;
            }
            spins += 1;
            if spins.is_multiple_of(LATCH_SPINS) {
                // The holder may have been killed inside its critical section.
                if cur != me
                    && !sys::alive(ProcId { pid: cur, start: 0 })
                    && self
                        .latch
                        .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    return Latch(self);
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Under the latch: clear a dead writer (setting INCONSISTENT).
    fn reap_writer(&self) {
        let pid = self.writer_pid.load(Ordering::Relaxed);
        if pid == 0 {
            return;
        }
        let id = ProcId {
            pid,
            start: self.writer_start.load(Ordering::Relaxed),
        };
        if id != sys::self_id() && !sys::alive(id) {
            self.flags.fetch_or(INCONSISTENT, Ordering::Relaxed);
            self.writer_pid.store(0, Ordering::Relaxed);
            self.writer_tid.store(0, Ordering::Relaxed);
            self.writer_start.store(0, Ordering::Relaxed);
        }
    }

    /// Under the latch: whether any reader other than a dead one remains
    /// (dead slots are cleared on the way).
    fn reap_readers(&self) -> bool {
        let me = sys::self_id();
        let mut any = false;
        for s in &self.readers {
            let pid = s.pid.load(Ordering::Relaxed);
            if pid == 0 {
                continue;
            }
            let id = ProcId {
                pid,
                start: s.start.load(Ordering::Relaxed),
            };
            if id == me || sys::alive(id) {
                any = true;
            } else {
                s.count.store(0, Ordering::Relaxed);
                s.pid.store(0, Ordering::Relaxed);
            }
        }
        any
    }

    /// Under the latch: count one more reader for this process.
    fn add_reader(&self) -> Result<()> {
        let me = sys::self_id();
        let mut free = None;
        for s in &self.readers {
            let pid = s.pid.load(Ordering::Relaxed);
            if pid == me.pid && s.start.load(Ordering::Relaxed) == me.start {
                s.count.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            if pid == 0 && free.is_none() {
                free = Some(s);
            }
        }
        if free.is_none() {
            self.reap_readers();
            free = self
                .readers
                .iter()
                .find(|s| s.pid.load(Ordering::Relaxed) == 0);
        }
        match free {
            Some(s) => {
                s.start.store(me.start, Ordering::Relaxed);
                s.count.store(1, Ordering::Relaxed);
                s.pid.store(me.pid, Ordering::Relaxed);
                Ok(())
            }
            None => Err(Error::Timeout {
                what: format!("a free reader slot ({READER_SLOTS} processes hold the lock)"),
            }),
        }
    }

    /// Acquire in `mode`, waiting until `deadline` (forever if `None`).
    pub fn lock(&self, mode: Mode, deadline: Option<Instant>) -> Result<Acquired> {
        loop {
            let seq = self.seq.load(Ordering::SeqCst);
            {
                let _l = self.latch();
                if self.writer_pid.load(Ordering::Relaxed) != 0 {
                    self.reap_writer();
                }
                let free = self.writer_pid.load(Ordering::Relaxed) == 0
                    && (mode == Mode::Shared || !self.reap_readers());
                if free {
                    match mode {
                        Mode::Shared => self.add_reader()?,
                        Mode::Exclusive => {
                            let me = sys::self_id();
                            self.writer_start.store(me.start, Ordering::Relaxed);
                            self.writer_tid.store(sys::tid(), Ordering::Relaxed);
                            self.writer_pid.store(me.pid, Ordering::Relaxed);
                        }
                    }
                    return Ok(Acquired {
                        owner_died: self.flags.load(Ordering::Relaxed) & INCONSISTENT != 0,
                    });
                }
            }
            let mut wait = POLL;
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return Err(Error::Timeout {
                        what: format!("{mode:?} segment lock"),
                    });
                }
                wait = wait.min(d - now);
            }
            self.waiters.fetch_add(1, Ordering::SeqCst);
            xsync::futex::wait_timeout(&self.seq, seq, wait);
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Release one acquisition in `mode` made by this process.
    pub fn unlock(&self, mode: Mode) {
        {
            let _l = self.latch();
            match mode {
                Mode::Exclusive => {
                    self.writer_pid.store(0, Ordering::Relaxed);
                    self.writer_tid.store(0, Ordering::Relaxed);
                    self.writer_start.store(0, Ordering::Relaxed);
                }
                Mode::Shared => {
                    let me = sys::self_id();
                    for s in &self.readers {
                        if s.pid.load(Ordering::Relaxed) == me.pid
                            && s.start.load(Ordering::Relaxed) == me.start
                        {
                            if s.count.fetch_sub(1, Ordering::Relaxed) <= 1 {
                                s.count.store(0, Ordering::Relaxed);
                                s.pid.store(0, Ordering::Relaxed);
                            }
                            break;
                        }
                    }
                }
            }
            self.seq.fetch_add(1, Ordering::SeqCst);
        }
        if self.waiters.load(Ordering::SeqCst) != 0 {
            xsync::futex::wake(&self.seq, xsync::futex::WAKE_ALL_WAITERS);
        }
    }

    /// Clear the INCONSISTENT flag. Only meaningful while holding the lock
    /// exclusively, after repairing the data.
    pub fn mark_consistent(&self) {
        let _l = self.latch();
        self.flags.fetch_and(!INCONSISTENT, Ordering::Relaxed);
    }

    /// Whether a writer died holding the lock since the last
    /// `mark_consistent`.
    pub fn is_inconsistent(&self) -> bool {
        self.flags.load(Ordering::Acquire) & INCONSISTENT != 0
    }

    /// Snapshot of the current holders, with liveness.
    pub fn holders(&self) -> Vec<Holder> {
        let mut out = Vec::new();
        let _l = self.latch();
        let pid = self.writer_pid.load(Ordering::Relaxed);
        if pid != 0 {
            let start = self.writer_start.load(Ordering::Relaxed);
            out.push(Holder {
                pid,
                tid: self.writer_tid.load(Ordering::Relaxed),
                writer: true,
                count: 1,
                alive: sys::alive(ProcId { pid, start }),
            });
        }
        for s in &self.readers {
            let pid = s.pid.load(Ordering::Relaxed);
            if pid != 0 {
                let start = s.start.load(Ordering::Relaxed);
                out.push(Holder {
                    pid,
                    tid: 0,
                    writer: false,
                    count: s.count.load(Ordering::Relaxed),
                    alive: sys::alive(ProcId { pid, start }),
                });
            }
        }
        out
    }

    /// Operator recovery: drop every dead holder (a dead writer sets
    /// INCONSISTENT); with `mark_consistent`, clear the flag too. Returns the
    /// number of entries removed.
    pub fn recover(&self, mark_consistent: bool) -> usize {
        let before = self.holders().iter().filter(|h| !h.alive).count();
        {
            let _l = self.latch();
            self.reap_writer();
            self.reap_readers();
            if mark_consistent {
                self.flags.fetch_and(!INCONSISTENT, Ordering::Relaxed);
            }
            self.seq.fetch_add(1, Ordering::SeqCst);
        }
        xsync::futex::wake(&self.seq, xsync::futex::WAKE_ALL_WAITERS);
        before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zeroed() -> Box<RawRwLock> {
        // SAFETY: RawRwLock is all atomics of integer type; all-zero is a
        // valid (unlocked) value.
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn shared_then_exclusive() {
        let l = zeroed();
        assert!(!l.lock(Mode::Shared, None).unwrap().owner_died);
        l.lock(Mode::Shared, None).unwrap();
        let d = Some(Instant::now() + Duration::from_millis(5));
        assert!(matches!(
            l.lock(Mode::Exclusive, d),
            Err(Error::Timeout { .. })
        ));
        l.unlock(Mode::Shared);
        l.unlock(Mode::Shared);
        l.lock(Mode::Exclusive, None).unwrap();
        assert!(matches!(
            l.lock(Mode::Shared, d.map(|_| Instant::now())),
            Err(Error::Timeout { .. })
        ));
        assert_eq!(l.holders().len(), 1);
        l.unlock(Mode::Exclusive);
        assert!(l.holders().is_empty());
    }

    #[test]
    fn dead_writer_is_reaped() {
        let l = zeroed();
        // A pid that cannot exist (above pid_max).
        l.writer_pid.store(u32::MAX - 1, Ordering::Relaxed);
        let a = l.lock(Mode::Exclusive, None).unwrap();
        assert!(a.owner_died);
        l.mark_consistent();
        l.unlock(Mode::Exclusive);
        assert!(!l.lock(Mode::Shared, None).unwrap().owner_died);
    }
}
