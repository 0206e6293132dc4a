//! Bounded exponential backoff for lock waiters, shared by the
//! in-process seqlock buckets (`index::bucket`) and `nibblejmp`'s
//! cross-process breakable locks.
//!
//! A waiter spins a little, doubling the `spin_loop` hints each round up
//! to 64 (the common critical section is a few stores, and yielding costs
//! a system call), then calls `yield_now` on every further round, so it
//! does not burn its core while a holder keeps the lock longer (a resize
//! in `nibble`, a preempted or dead process in `nibblejmp`).

#[cfg(not(loom))]
use crate::index::sync::spin_loop;
use crate::index::sync::yield_now;

/// `log2` of the most `spin_loop` hints in one round (2^6 = 64).
#[cfg(not(loom))]
const MAX_SPINS_LOG2: u32 = 6;

/// Rounds a [`Backoff::new`] waiter spins before it yields: one per
/// doubling, 1 to 64 hints.
pub const DEFAULT_SPIN_ROUNDS: u32 = 7;

/// One waiter's backoff state: [`Backoff::snooze`] once per failed try.
#[derive(Debug)]
pub struct Backoff {
    #[cfg(not(loom))]
    round: u32,
    #[cfg(not(loom))]
    spin_rounds: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

impl Backoff {
    /// Spin [`DEFAULT_SPIN_ROUNDS`] rounds, then yield.
    pub fn new() -> Self {
        Backoff::with_spin_rounds(DEFAULT_SPIN_ROUNDS)
    }

    /// Spin `spin_rounds` rounds (the hints doubling up to 64 a round),
    /// then yield. A waiter that may wait for another process, which can
    /// be descheduled inside its critical section, spins longer before
    /// paying for the first `yield_now`.
    pub fn with_spin_rounds(spin_rounds: u32) -> Self {
        #[cfg(loom)]
        let _ = spin_rounds;
        Backoff {
            #[cfg(not(loom))]
            round: 0,
            #[cfg(not(loom))]
            spin_rounds,
        }
    }

    /// Wait a little before the next try.
    #[cfg(not(loom))]
    pub fn snooze(&mut self) {
        if self.round < self.spin_rounds {
            for _ in 0..(1u32 << self.round.min(MAX_SPINS_LOG2)) {
                spin_loop();
            }
            self.round += 1;
        } else {
            yield_now();
        }
    }

    /// Under loom a wait is one yield: loom needs to see the thread give
    /// way, and extra spins would only multiply the explored schedules.
    #[cfg(loom)]
    pub fn snooze(&mut self) {
        yield_now();
    }
}
