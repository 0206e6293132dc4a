//! Cross-process locks: a mutex and a readers-writer lock whose entire
//! state is one `u32` futex word, for metadata that lives in memory shared
//! between processes.
//!
//! # Why
//!
//! On the per-core MMU backend (issue 20) the address-space designs of
//! `radixvm` run in several processes, one per core, each with its own mm,
//! forked from one parent and sharing the designs' metadata through a
//! `MAP_SHARED` heap mapped at the same address everywhere. A lock in that
//! metadata is taken by threads of different processes. `parking_lot`
//! parks waiters in a process-global hash table keyed by address, with
//! per-thread `ThreadData` in TLS; `std::sync::Mutex` sleeps on a
//! `FUTEX_PRIVATE_FLAG` futex, which the kernel keys by (mm, address).
//! Either way the waiter's record lives in its own process: a waiter in
//! process A sleeps until something in A wakes it, and an unlock in
//! process B never does. The lock word itself is shared, so the *mutual
//! exclusion* holds, but the wake-up is lost: a hang.
//!
//! Here the word is the whole state and the futex is shared (plain
//! `FUTEX_WAIT`/`FUTEX_WAKE`, no private flag): the kernel keys a futex on
//! a shared page by (backing object, offset), identical in every process
//! mapping it, so a wake in B finds the sleeper from A. Nothing else is
//! kept anywhere (no queue, no TLS, no statics), so any process that maps
//! the word can lock and unlock it, and the lock works unchanged within a
//! single process too.
//!
//! # Protocol
//!
//! Both locks spin first, [`SPIN_LIMIT_ROUNDS`] re-reads of the word with
//! a growing wait between (2, 4, 8 `core::hint::spin_loop`s, then
//! `sched_yield`s), because most critical sections here are tens to
//! hundreds of nanoseconds and a futex sleep and wake cost microseconds.
//! Only then do they record themselves as a waiter in the word and
//! `FUTEX_WAIT` on the value they saw; the kernel sleeps only if the word
//! still holds that value, checked atomically against `FUTEX_WAKE`, which
//! is what makes a release racing with the sleep safe. An unlock makes the
//! wake syscall only when a waiter is recorded, so uncontended lock/unlock
//! is one atomic RMW each and no syscall.
//!
//! [`RawFutexMutex`]: bit 0 "held", bits 1-31 count sleepers. Lock: CAS
//! setting bit 0 while clear; failing that, spin; then add 1 to the sleeper
//! count and loop: if bit 0 is clear, CAS it set *and* drop the count in
//! one step, else `FUTEX_WAIT` on the value seen. Unlock: `fetch_sub` bit
//! 0; if sleepers were counted, wake one. This refines Drepper's 0/1/2
//! mutex ("Futexes Are Tricky", take 3), whose "2" sticks while contention
//! lasts (each woken thread must assume others sleep), so every unlock
//! syscalls and every arrival sleeps: a convoy. That first version (with a
//! tight 100-`PAUSE` spin) ran the buddy allocator's contended zone lock
//! at 0.15-0.5x of parking_lot here; counting sleepers and backing off
//! brought it to parity.
//!
//! [`RawFutexRwLock`]: bits 0-29 count readers, bit 30 is "waiters", bit 31
//! "writer". A reader enters by CAS +1 when neither writer nor waiters is
//! set (writer-preferring: once anyone waits, new readers queue, so readers
//! cannot starve a writer); a writer by CAS setting the writer bit when
//! count and writer are 0 (keeping the waiters bit). Blocked, either sets
//! the waiters bit and sleeps on the word. The writer's unlock `swap(0)`s
//! and, if waiters was set, wakes all; the last reader out, seeing the word
//! become exactly "waiters", CASes it to 0 and wakes all. Woken threads race
//! again (no FIFO hand-off), which is simple and lock-word-only; a single
//! word cannot tell the kernel to wake only writers.
//!
//! The types below are `lock_api` wrappers, so call sites read as with
//! `parking_lot`: `.lock()`, `.read()`, `.write()` return guards, no
//! `Result`, no poisoning. Guards are `Send` (unlocking needs no per-thread
//! state).
//!
//! Not here: timeouts, fairness guarantees, priority inheritance, and
//! robustness: a process that dies holding a lock leaves it held, and
//! its waiters wait for ever.
//!
//! ```
//! let m = xsync::Mutex::new(0u64);
//! *m.lock() += 1;
//! let rw = xsync::RwLock::new(vec![1, 2]);
//! assert_eq!(rw.read().len(), 2);
//! rw.write().push(3);
//! assert_eq!(*m.lock(), 1);
//! ```

#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

pub mod futex;
mod mutex;
mod rwlock;

pub use mutex::RawFutexMutex;
pub use rwlock::RawFutexRwLock;

/// One attempt to enter a lock without waiting: while `can_enter(word)`,
/// CAS the word to `entry(word)` (Acquire on success); `false` once the
/// word says the lock cannot be entered. The `try_lock*` of both locks.
#[inline]
fn try_enter(
    word: &core::sync::atomic::AtomicU32,
    can_enter: fn(u32) -> bool,
    entry: fn(u32) -> u32,
) -> bool {
    use core::sync::atomic::Ordering;
    let mut state = word.load(Ordering::Relaxed);
    while can_enter(state) {
        match word.compare_exchange_weak(state, entry(state), Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => return true,
            Err(now) => state = now,
        }
    }
    false
}

/// Busy rounds of a blocked locker's backoff: round `i` (1-based) runs
/// `2^i` `core::hint::spin_loop`s before re-reading the word (2+4+8).
pub const BUSY_SPIN_ROUNDS: u32 = 3;
/// All rounds of the backoff before a blocked locker records itself as a
/// waiter and sleeps in the kernel; rounds after [`BUSY_SPIN_ROUNDS`] call
/// `sched_yield` instead, so a holder preempted on a busy core can run.
/// The same schedule as parking_lot's `SpinWait`: re-reading the word less
/// often keeps its cache line with the holder, which is what keeps a hot
/// lock fast (a re-read every `PAUSE` for 100 tries made two threads on
/// the buddy zone lock 2x slower than parking_lot here).
pub const SPIN_LIMIT_ROUNDS: u32 = 10;

/// A blocked locker's bounded spin before it sleeps.
pub(crate) struct Backoff {
    round: u32,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff { round: 0 }
    }

    /// Waits one round, longer each time; `false` once the rounds are
    /// spent (the caller should sleep in the kernel instead).
    #[inline]
    pub(crate) fn spin(&mut self) -> bool {
        if self.round >= SPIN_LIMIT_ROUNDS {
            return false;
        }
        self.round += 1;
        if self.round <= BUSY_SPIN_ROUNDS {
            for _ in 0..(1u32 << self.round) {
                core::hint::spin_loop();
            }
        } else {
            std::thread::yield_now();
        }
        true
    }
}

/// A mutex usable across processes when it lives in shared memory.
pub type Mutex<T> = lock_api::Mutex<RawFutexMutex, T>;
/// Guard for [`Mutex`].
pub type MutexGuard<'a, T> = lock_api::MutexGuard<'a, RawFutexMutex, T>;
/// A readers-writer lock usable across processes when it lives in shared
/// memory.
pub type RwLock<T> = lock_api::RwLock<RawFutexRwLock, T>;
/// Shared guard for [`RwLock`].
pub type RwLockReadGuard<'a, T> = lock_api::RwLockReadGuard<'a, RawFutexRwLock, T>;
/// Exclusive guard for [`RwLock`].
pub type RwLockWriteGuard<'a, T> = lock_api::RwLockWriteGuard<'a, RawFutexRwLock, T>;

#[cfg(test)]
mod tests {
    use super::*;
    use lock_api::RawMutex as _;

    static STATIC_MUTEX: Mutex<u32> = Mutex::new(7);
    static STATIC_RWLOCK: RwLock<u32> = RwLock::new(9);

    #[test]
    fn mutex_basic() {
        let m = Mutex::new(1u32);
        assert!(!m.is_locked());
        {
            let mut g = m.lock();
            *g += 1;
            assert!(m.is_locked());
            assert!(m.try_lock().is_none());
        }
        assert!(!m.is_locked());
        assert_eq!(*m.try_lock().expect("free"), 2);
        assert_eq!(m.into_inner(), 2);
        assert_eq!(*STATIC_MUTEX.lock(), 7);
    }

    #[test]
    fn raw_mutex_states() {
        let raw = RawFutexMutex::INIT;
        raw.lock();
        assert!(!raw.try_lock());
        // SAFETY: locked just above by this thread.
        unsafe { raw.unlock() };
        assert!(raw.try_lock());
        // SAFETY: locked by the try_lock above.
        unsafe { raw.unlock() };
    }

    #[test]
    fn rwlock_basic() {
        let rw = RwLock::new(5u32);
        {
            let a = rw.read();
            let b = rw.read();
            assert_eq!(*a + *b, 10);
            assert!(rw.try_write().is_none());
            assert!(rw.is_locked());
            assert!(!rw.is_locked_exclusive());
        }
        {
            let mut w = rw.write();
            *w = 6;
            assert!(rw.try_read().is_none());
            assert!(rw.try_write().is_none());
            assert!(rw.is_locked_exclusive());
        }
        assert!(!rw.is_locked());
        assert_eq!(*rw.try_read().expect("free"), 6);
        assert_eq!(*STATIC_RWLOCK.read(), 9);
    }

    #[test]
    fn guard_sent_to_another_thread() {
        let m = Mutex::new(0u32);
        let g = m.lock();
        std::thread::scope(|s| {
            s.spawn(move || drop(g));
        });
        assert!(m.try_lock().is_some());
    }

    #[test]
    fn waiter_woken_by_unlock() {
        // Hold the lock long enough that the other thread exhausts its spin
        // and sleeps in FUTEX_WAIT; the unlock must wake it.
        let m = Mutex::new(0u32);
        let rw = RwLock::new(0u32);
        std::thread::scope(|s| {
            let g = m.lock();
            let w = rw.write();
            let t = s.spawn(|| {
                *m.lock() += 1;
                *rw.read() + 1
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(g);
            drop(w);
            assert_eq!(t.join().expect("waiter"), 1);
        });
        assert_eq!(*m.lock(), 1);
    }
}
