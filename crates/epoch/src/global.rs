//! The baseline Nibble is compared against (dissertation §4.5, evaluated in
//! §5.1): a global epoch counter plus a shared count of participants, so
//! that every operation writes one cache line that all cores share.
//!
//! The whole state is one `AtomicU64` on its own cache line:
//!
//! ```text
//!   63                          24 23          12 11           0
//!  +------------------------------+--------------+--------------+
//!  |  epoch E (40 bits)           | active, odd  | active, even |
//!  +------------------------------+--------------+--------------+
//! ```
//!
//! * pin: CAS the word to add 1 to the count of E's parity; the guard
//!   remembers which count it joined. (A CAS rather than `fetch_add`,
//!   because the count to bump depends on the epoch read in the same atomic
//!   step.)
//! * unpin: `fetch_sub` 1 from that count.
//! * advance E -> E+1: allowed only when the count of the *other* parity,
//!   i.e. of epoch E-1, is zero. So every active guard joined at E or E-1,
//!   and a guard that joined at E blocks the step from E+1 to E+2.
//! * now(): one CAS that advances E if allowed (else rewrites the word
//!   unchanged, still a read-modify-write) and returns the epoch `s` it
//!   found *before* advancing: every guard that joined earlier joined at an
//!   epoch <= s, and when the CAS advanced, every later guard joins > s.
//! * a retirement stamped `s` is reusable once E >= s + 2;
//!   `safe_to_reclaim` and `reclaim_bound` try to advance E first.
//!
//! Why it is correct: a reader's pin and the retirer's `now()` are both
//! read-modify-writes of the one word, so one precedes the other. If the
//! pin comes later, it reads (through the chain of RMWs, all in one release
//! sequence) the value `now()` wrote, so the unlink before `now()` happens
//! before the reader's load: the reader cannot find the retired object. If
//! the pin comes first, the reader joined at an epoch e <= s, and E can
//! reach s + 2 only through the step e+1 -> e+2, which saw the reader's
//! count at zero, i.e. came after its unpin, which the step acquires.
//! (Epochs e' < e drained even earlier.) Reclamation can never starve:
//! new guards join the current epoch's count, so the old count drains
//! within one operation's length.
//!
//! Cost: every pin, unpin and `now()` is an atomic RMW on the same line.
//! That contention is the point of the comparison with [`TscEpochs`](crate::TscEpochs).

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering};
use crate::{EpochError, EpochScheme, Guard};

/// Bits of each of the two active-guard counts.
pub const ACTIVE_COUNT_BITS: u32 = 12;
/// Most guards that can be active in one epoch parity at once.
pub const MAX_ACTIVE_GUARDS_PER_EPOCH: u64 = (1 << ACTIVE_COUNT_BITS) - 1;
/// Bits of the epoch number; advancing past its maximum panics.
pub const EPOCH_BITS: u32 = 64 - 2 * ACTIVE_COUNT_BITS;
/// Largest epoch number the word can hold.
pub const MAX_EPOCH: u64 = (1 << EPOCH_BITS) - 1;

const EPOCH_SHIFT: u32 = 2 * ACTIVE_COUNT_BITS;
const EPOCH_UNIT: u64 = 1 << EPOCH_SHIFT;
/// Advances a retirement needs before reuse.
const REUSE_DISTANCE_EPOCHS: u64 = 2;

fn epoch_of(word: u64) -> u64 {
    word >> EPOCH_SHIFT
}

fn count_shift(parity: u64) -> u32 {
    (parity as u32) * ACTIVE_COUNT_BITS
}

fn count_of(word: u64, parity: u64) -> u64 {
    (word >> count_shift(parity)) & MAX_ACTIVE_GUARDS_PER_EPOCH
}

/// The word after one advance, if the previous epoch's count is drained.
fn advanced(word: u64) -> Option<u64> {
    let epoch = epoch_of(word);
    if count_of(word, (epoch + 1) & 1) != 0 {
        return None;
    }
    assert!(
        epoch < MAX_EPOCH,
        "global epoch exhausted its {EPOCH_BITS} bits"
    );
    Some(word + EPOCH_UNIT)
}

/// Global-atomic epochs: one shared word holding the epoch and the counts
/// of active guards (see the module documentation for the protocol).
///
/// Stamps from [`now`](EpochScheme::now) are epoch numbers, not times;
/// they mean nothing to a [`TscEpochs`](crate::TscEpochs).
#[derive(Debug)]
pub struct AtomicEpochs {
    word: CachePadded<AtomicU64>,
}

impl AtomicEpochs {
    /// Epoch 0, no guards.
    pub fn new() -> Self {
        AtomicEpochs {
            word: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// The current global epoch.
    pub fn epoch(&self) -> u64 {
        epoch_of(self.word.load(Ordering::Acquire))
    }

    /// Guards currently active (both parities; a snapshot).
    pub fn active_guards(&self) -> u64 {
        let word = self.word.load(Ordering::Acquire);
        count_of(word, 0) + count_of(word, 1)
    }

    /// Advances the epoch if the older count is drained; returns the epoch
    /// afterwards (read with Acquire, or written by our RMW).
    fn try_advance(&self) -> u64 {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let Some(next) = advanced(word) else {
                return epoch_of(word);
            };
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return epoch_of(next),
                Err(actual) => word = actual,
            }
        }
    }
}

impl Default for AtomicEpochs {
    fn default() -> Self {
        AtomicEpochs::new()
    }
}

impl EpochScheme for AtomicEpochs {
    fn name(&self) -> &'static str {
        crate::EpochKind::GlobalAtomic.name()
    }

    fn try_pin(&self) -> Result<Guard<'_>, EpochError> {
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            let parity = epoch_of(word) & 1;
            if count_of(word, parity) == MAX_ACTIVE_GUARDS_PER_EPOCH {
                return Err(EpochError::TooManyGuards {
                    limit: MAX_ACTIVE_GUARDS_PER_EPOCH,
                });
            }
            let unit = 1 << count_shift(parity);
            // Acquire: a pin ordered after a retirer's `now()` sees the
            // retirer's unlink. Release is not needed for correctness but
            // keeps every RMW on the word AcqRel, which is easy to audit.
            match self.word.compare_exchange_weak(
                word,
                word + unit,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(Guard::counter(&self.word, unit)),
                Err(actual) => word = actual,
            }
        }
    }

    fn now(&self) -> u64 {
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            let next = advanced(word).unwrap_or(word);
            // An RMW even when nothing changes: it orders the caller's
            // unlink before every later pin (see the module essay).
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return epoch_of(word),
                Err(actual) => word = actual,
            }
        }
    }

    fn reclaim_bound(&self) -> u64 {
        self.try_advance();
        // Safe iff retired_at + 2 <= E, i.e. retired_at < E - 1.
        (self.try_advance() + 1).saturating_sub(REUSE_DISTANCE_EPOCHS)
    }

    fn safe_to_reclaim(&self, retired_at: u64) -> bool {
        let needed = retired_at.saturating_add(REUSE_DISTANCE_EPOCHS);
        let mut epoch = self.epoch();
        for _ in 0..REUSE_DISTANCE_EPOCHS {
            if epoch >= needed {
                return true;
            }
            let next = self.try_advance();
            if next == epoch {
                return false;
            }
            epoch = next;
        }
        epoch >= needed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn layout_constants_agree() {
        assert_eq!(EPOCH_BITS, 40);
        assert_eq!(MAX_ACTIVE_GUARDS_PER_EPOCH, 4095);
        assert_eq!(epoch_of(MAX_EPOCH << EPOCH_SHIFT), MAX_EPOCH);
    }

    #[test]
    fn guard_blocks_reuse_until_dropped() {
        let epochs = AtomicEpochs::new();
        let guard = epochs.pin();
        let retired_at = epochs.now();
        for _ in 0..10 {
            assert!(!epochs.safe_to_reclaim(retired_at));
        }
        assert!(epochs.reclaim_bound() <= retired_at);
        assert!(epochs.epoch() <= retired_at + 1, "held back by the guard");
        drop(guard);
        assert!(epochs.safe_to_reclaim(retired_at));
        assert!(epochs.reclaim_bound() > retired_at);
        assert_eq!(epochs.active_guards(), 0);
    }

    #[test]
    fn nested_guards_count_until_outermost_drops() {
        let epochs = AtomicEpochs::new();
        let outer = epochs.pin();
        let retired_at = epochs.now();
        {
            let _inner = epochs.pin();
            assert_eq!(epochs.active_guards(), 2);
            assert!(!epochs.safe_to_reclaim(retired_at));
        }
        assert!(!epochs.safe_to_reclaim(retired_at), "outer still open");
        drop(outer);
        assert!(epochs.safe_to_reclaim(retired_at));
    }

    #[test]
    fn guard_younger_than_retirement_does_not_block_it() {
        let epochs = AtomicEpochs::new();
        let retired_at = epochs.now();
        let _young = epochs.pin();
        assert!(epochs.epoch() > retired_at, "now() advanced past its stamp");
        assert!(epochs.safe_to_reclaim(retired_at));
    }

    #[test]
    fn overlapping_guards_do_not_starve_reclamation() {
        // The active count never reaches zero (a new guard opens before the
        // old one closes), which would starve a single-counter scheme.
        let epochs = AtomicEpochs::new();
        let mut open = epochs.pin();
        let retired_at = epochs.now();
        let mut rounds = 0;
        while !epochs.safe_to_reclaim(retired_at) {
            let next = epochs.pin();
            drop(std::mem::replace(&mut open, next));
            rounds += 1;
            assert!(rounds <= 3, "epoch stuck behind overlapping guards");
            assert!(epochs.active_guards() >= 1);
        }
        drop(open);
    }

    #[test]
    fn threads_contending_on_the_word() {
        let epochs = AtomicEpochs::new();
        thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        let _g = epochs.pin();
                        let _inner = epochs.pin();
                    }
                });
            }
            for _ in 0..1000 {
                let retired_at = epochs.now();
                let _ = epochs.safe_to_reclaim(retired_at);
            }
        });
        assert_eq!(epochs.active_guards(), 0);
        let retired_at = epochs.now();
        assert!(epochs.safe_to_reclaim(retired_at));
    }

    #[test]
    fn too_many_guards_is_an_error() {
        let epochs = AtomicEpochs::new();
        let guards: Vec<_> = (0..MAX_ACTIVE_GUARDS_PER_EPOCH)
            .map(|_| epochs.pin())
            .collect();
        assert_eq!(
            epochs.try_pin().map(drop),
            Err(EpochError::TooManyGuards {
                limit: MAX_ACTIVE_GUARDS_PER_EPOCH
            })
        );
        drop(guards);
        assert!(epochs.try_pin().is_ok());
    }
}
