//! [`RawFutexMutex`]: the three-state futex mutex of Drepper, "Futexes Are
//! Tricky" (2011), §6 "Mutex, Take 3", behind `lock_api::RawMutex`.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::futex;
use crate::SPIN_LIMIT_TRIES;

/// Nobody holds the lock.
const UNLOCKED: u32 = 0;
/// Held; nobody has recorded that they sleep on it.
const LOCKED: u32 = 1;
/// Held, and some thread in some process may be asleep in `FUTEX_WAIT`
/// on the word: the unlocker must `FUTEX_WAKE` one.
const CONTENDED: u32 = 2;

/// A mutex whose whole state is one `u32` futex word, so it works when the
/// word lives in memory shared between processes. See the crate docs for
/// the protocol.
#[derive(Debug)]
#[repr(transparent)]
pub struct RawFutexMutex {
    state: AtomicU32,
}

impl RawFutexMutex {
    /// Spins up to [`SPIN_LIMIT_TRIES`] for a holder about to leave, then
    /// marks the word contended and sleeps until it can take it.
    #[cold]
    fn lock_slow(&self) {
        for _ in 0..SPIN_LIMIT_TRIES {
            let state = self.state.load(Ordering::Relaxed);
            if state == UNLOCKED
                && self
                    .state
                    .compare_exchange_weak(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            if state == CONTENDED {
                // Others already sleep; spinning only delays joining them.
                break;
            }
            core::hint::spin_loop();
        }
        // From here on we may sleep, so we take the lock as CONTENDED: we
        // cannot know whether other sleepers remain, and a spurious wake on
        // unlock is cheaper than a lost one.
        while self.state.swap(CONTENDED, Ordering::Acquire) != UNLOCKED {
            futex::wait(&self.state, CONTENDED);
        }
    }

    /// Wakes one sleeper; called when unlock found the word `CONTENDED`.
    #[cold]
    fn wake_one(&self) {
        futex::wake(&self.state, 1);
    }
}

// SAFETY: `lock`/`try_lock` return only after moving the word from
// UNLOCKED to LOCKED or CONTENDED with an Acquire RMW, and only `unlock`
// (Release) moves it back to UNLOCKED, so at most one holder exists at a
// time and the holder sees everything the previous holder wrote.
unsafe impl lock_api::RawMutex for RawFutexMutex {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = RawFutexMutex {
        state: AtomicU32::new(UNLOCKED),
    };

    // Unlock is a store plus a wake keyed by the word's address: no
    // per-thread state, so a guard may be released by another thread.
    type GuardMarker = lock_api::GuardSend;

    #[inline]
    fn lock(&self) {
        if self
            .state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[inline]
    unsafe fn unlock(&self) {
        if self.state.swap(UNLOCKED, Ordering::Release) == CONTENDED {
            self.wake_one();
        }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.state.load(Ordering::Relaxed) != UNLOCKED
    }
}
