//! [`RawFutexRwLock`]: a reader count, a writer bit and a waiters bit in
//! one futex word, behind `lock_api::RawRwLock`.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::futex;
use crate::Backoff;

/// Low 30 bits: how many readers hold the lock.
const READERS_MASK: u32 = (1 << 30) - 1;
/// Some thread in some process may sleep on the word; whoever makes the
/// lock free again must clear the bit and wake everyone.
const WAITERS: u32 = 1 << 30;
/// A writer holds the lock (the reader count is then 0).
const WRITER: u32 = 1 << 31;

/// A readers-writer lock whose whole state is one `u32` futex word, so it
/// works when the word lives in memory shared between processes. Writer-
/// preferring on entry: once anyone waits, new readers queue too, so a
/// stream of readers cannot starve a writer. Release wakes every sleeper
/// and they race (no FIFO hand-off). See the crate docs for the protocol.
///
/// Like parking_lot's, a thread that takes a read lock it already holds
/// may deadlock if a writer is waiting in between.
#[derive(Debug)]
#[repr(transparent)]
pub struct RawFutexRwLock {
    state: AtomicU32,
}

/// A reader may enter: no writer, nobody waiting, room in the count.
#[inline]
fn readable(state: u32) -> bool {
    state & (WRITER | WAITERS) == 0 && state & READERS_MASK < READERS_MASK
}

/// A writer may enter: no writer, no readers (waiters do not stop it; the
/// bit stays set for its unlock to act on).
#[inline]
fn writable(state: u32) -> bool {
    state & (WRITER | READERS_MASK) == 0
}

impl RawFutexRwLock {
    /// The shared slow and fast path: enter when `can_enter`, adding
    /// `entry` to the word; else spin a while, then record a waiter and
    /// sleep.
    #[inline]
    fn acquire(&self, can_enter: fn(u32) -> bool, entry: fn(u32) -> u32) {
        let mut backoff = Backoff::new();
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if can_enter(state) {
                match self.state.compare_exchange_weak(
                    state,
                    entry(state),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return,
                    Err(now) => {
                        state = now;
                        continue;
                    }
                }
            }
            if backoff.spin() {
                state = self.state.load(Ordering::Relaxed);
                continue;
            }
            if state & WAITERS == 0 {
                if let Err(now) = self.state.compare_exchange_weak(
                    state,
                    state | WAITERS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    state = now;
                    continue;
                }
            }
            // The kernel sleeps only if the word still reads exactly this,
            // atomically with respect to any FUTEX_WAKE, so a release that
            // lands after our load either changes the word (we return at
            // once) or finds WAITERS set and wakes us.
            futex::wait(&self.state, state | WAITERS);
            state = self.state.load(Ordering::Relaxed);
        }
    }

    /// Clears `WAITERS` if the word is exactly that (lock free, sleepers
    /// recorded) and wakes them all. If the clear fails, a writer took the
    /// lock with the bit still set, and its unlock will wake them.
    #[cold]
    fn wake_waiters_after_last_reader(&self) {
        if self
            .state
            .compare_exchange(WAITERS, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            futex::wake(&self.state, futex::WAKE_ALL_WAITERS);
        }
    }
}

// SAFETY: a reader enters only by an Acquire CAS from a word with no
// WRITER bit, adding 1 to the count; a writer only by an Acquire CAS from
// a word with no WRITER bit and a zero count, setting WRITER. So while a
// writer holds the lock the count is 0 and no other writer exists, and
// while readers hold it the count is non-zero and no writer can enter.
// Both unlocks are Release RMWs, pairing with the next entrant's Acquire.
unsafe impl lock_api::RawRwLock for RawFutexRwLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = RawFutexRwLock {
        state: AtomicU32::new(0),
    };

    // No per-thread state (see RawFutexMutex).
    type GuardMarker = lock_api::GuardSend;

    #[inline]
    fn lock_shared(&self) {
        let state = self.state.load(Ordering::Relaxed);
        if !(readable(state)
            && self
                .state
                .compare_exchange_weak(state, state + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok())
        {
            self.acquire(readable, |s| s + 1);
        }
    }

    #[inline]
    fn try_lock_shared(&self) -> bool {
        crate::try_enter(&self.state, readable, |s| s + 1)
    }

    #[inline]
    unsafe fn unlock_shared(&self) {
        let before = self.state.fetch_sub(1, Ordering::Release);
        // Last reader out while someone sleeps (readers cannot sleep on a
        // read-held lock unless WAITERS is set, and no writer holds it).
        if before == WAITERS + 1 {
            self.wake_waiters_after_last_reader();
        }
    }

    #[inline]
    fn lock_exclusive(&self) {
        if self
            .state
            .compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.acquire(writable, |s| s | WRITER);
        }
    }

    #[inline]
    fn try_lock_exclusive(&self) -> bool {
        crate::try_enter(&self.state, writable, |s| s | WRITER)
    }

    #[inline]
    unsafe fn unlock_exclusive(&self) {
        // The count is 0 while a writer holds, so 0 is "free, no waiters".
        if self.state.swap(0, Ordering::Release) & WAITERS != 0 {
            futex::wake(&self.state, futex::WAKE_ALL_WAITERS);
        }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.state.load(Ordering::Relaxed) & (WRITER | READERS_MASK) != 0
    }

    #[inline]
    fn is_locked_exclusive(&self) -> bool {
        self.state.load(Ordering::Relaxed) & WRITER != 0
    }
}
