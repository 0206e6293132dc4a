//! [`RawFutexMutex`]: a futex mutex with a lock bit and a sleeper count in
//! one word, behind `lock_api::RawMutex`. A refinement of Drepper's
//! three-state mutex ("Futexes Are Tricky", take 3), whose "contended"
//! state sticks once set, so that under steady contention every unlock
//! makes a wake syscall and every arrival sleeps at once (a convoy);
//! counting sleepers lets the word return to "no sleepers" as soon as
//! they are in.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::futex;
use crate::Backoff;

/// Bit 0: someone holds the lock.
const LOCKED_BIT: u32 = 1;
/// Bits 1-31 count sleepers: threads (in any process) that registered
/// before `FUTEX_WAIT` and have not yet taken the lock. Unlock wakes one
/// exactly when this is non-zero.
const SLEEPER_UNIT: u32 = 2;
/// A mutex whose whole state is one `u32` futex word, so it works when the
/// word lives in memory shared between processes. See the crate docs for
/// the protocol.
#[derive(Debug)]
#[repr(transparent)]
pub struct RawFutexMutex {
    state: AtomicU32,
}

impl RawFutexMutex {
    /// Backs off up to [`crate::SPIN_LIMIT_ROUNDS`] for a holder about to leave, then
    /// registers as a sleeper and sleeps until it can take the lock.
    #[cold]
    fn lock_slow(&self) {
        let mut backoff = Backoff::new();
        loop {
            let state = self.state.load(Ordering::Relaxed);
            if state & LOCKED_BIT == 0
                && self
                    .state
                    .compare_exchange_weak(
                        state,
                        state | LOCKED_BIT,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                return;
            }
            if !backoff.spin() {
                break;
            }
        }
        // Register, so every unlock from now on wakes someone, then sleep
        // while the lock is held; taking it deregisters in the same CAS.
        let mut state = self.state.fetch_add(SLEEPER_UNIT, Ordering::Relaxed) + SLEEPER_UNIT;
        loop {
            if state & LOCKED_BIT == 0 {
                match self.state.compare_exchange_weak(
                    state,
                    (state | LOCKED_BIT) - SLEEPER_UNIT,
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
            // Sleeps only if the word still reads `state` (held, us
            // counted), atomically with respect to FUTEX_WAKE: an unlock
            // after our load either changes the word (we return at once)
            // or sees our count and wakes one sleeper.
            futex::wait(&self.state, state);
            state = self.state.load(Ordering::Relaxed);
        }
    }

    /// Wakes one sleeper; called when unlock found sleepers counted.
    #[cold]
    fn wake_one(&self) {
        futex::wake(&self.state, 1);
    }
}

// SAFETY: `lock`/`try_lock` return only after setting LOCKED_BIT with an
// Acquire RMW on a word where it was clear, and only `unlock` (a Release
// RMW) clears it, so at most one holder exists at a time and the holder
// sees everything the previous holder wrote.
unsafe impl lock_api::RawMutex for RawFutexMutex {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = RawFutexMutex {
        state: AtomicU32::new(0),
    };

    // Unlock is a store plus a wake keyed by the word's address: no
    // per-thread state, so a guard may be released by another thread.
    type GuardMarker = lock_api::GuardSend;

    #[inline]
    fn lock(&self) {
        if self
            .state
            .compare_exchange(0, LOCKED_BIT, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        crate::try_enter(&self.state, |s| s & LOCKED_BIT == 0, |s| s | LOCKED_BIT)
    }

    #[inline]
    unsafe fn unlock(&self) {
        if self.state.fetch_sub(LOCKED_BIT, Ordering::Release) != LOCKED_BIT {
            self.wake_one();
        }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.state.load(Ordering::Relaxed) & LOCKED_BIT != 0
    }
}
