//! Distributed hardware epochs (dissertation §4.5): when may compaction
//! reuse a segment that client operations might still be reading?
//!
//! Every thread owns one cache-line slot in an epoch table. Starting a GET
//! or PUT, it writes the time-stamp counter into its slot; finishing, it
//! writes 0 ("quiescent"). After compaction unlinks a segment it reads the
//! TSC, `T`. An operation that starts after `T` cannot find the segment;
//! one that started before `T` might hold a reference into it. So the
//! segment may be reused once every non-zero slot is greater than `T`,
//! i.e. the minimum over the table exceeds `T`. Threads write only their
//! own line; only the reclaimer reads them all, one miss per slot.
//!
//! ```text
//!  reader A   [pin: t_a]--- reads S -------------[unpin: 0]
//!  reader B                      [pin: t_b]--- reads S' (new) ------[unpin]
//!  compactor      unlink S; T = now()   scan: t_a <= T    scan: min = t_b > T
//!  time      ---t_a-------------T---------t_b-----------------------^ reuse S
//! ```
//!
//! Real: `RDTSC` from user space ([`TscClock`]). Assumed (§4.6): the TSC is
//! invariant and synchronised across cores; [`TscConfig::skew_margin_ticks`]
//! adds a measured skew to retirement stamps where that is doubtful.
//! Ordering: the slot store must be visible before the operation loads the
//! index, a store-then-load order x86's store buffer does not keep. Pin does
//! a Release store plus `fence(SeqCst)` (`MFENCE`), not a `SeqCst` store: in
//! the language model a `SeqCst` store is ordered only against other `SeqCst`
//! accesses, not the caller's Acquire load, whereas the fence orders every
//! later load and pairs with the reclaimer's fence before its scan (either
//! the scan sees the stamp or the operation sees the unlink). `now()` reads
//! the TSC after `MFENCE; LFENCE`, so `T` follows the unlink. Loom checks it.
//!
//! The baseline the dissertation compares against, a global atomic epoch
//! whose every operation writes one shared line, is [`AtomicEpochs`]; one
//! parameter, [`EpochKind`], selects either. [`RetireList`] holds retired
//! items until [`EpochScheme::safe_to_reclaim`] lets them go.
//!
//! ```
//! use std::sync::atomic::{AtomicPtr, Ordering};
//! use epoch::{EpochKind, EpochScheme, Epochs, RetireList};
//!
//! let epochs = Epochs::new("tsc".parse::<EpochKind>().unwrap());
//! let current = AtomicPtr::new(Box::into_raw(Box::new(1_u64)));
//!
//! // A client operation: everything it reads stays valid while pinned.
//! {
//!     let _guard = epochs.pin();
//!     let object = current.load(Ordering::Acquire);
//!     // SAFETY: objects are freed only after `collect` has seen every
//!     // guard older than their retirement drop.
//!     assert_eq!(unsafe { *object }, 1);
//! }
//!
//! // Compaction: unlink, retire, and later free what has become safe.
//! let mut retired = RetireList::new();
//! let old = current.swap(Box::into_raw(Box::new(2_u64)), Ordering::AcqRel);
//! retired.push(&epochs, old);
//! for object in retired.collect(&epochs) {
//!     // SAFETY: unlinked before `push`, and no operation from before that
//!     // is still running; each pointer is retired once.
//!     drop(unsafe { Box::from_raw(object) });
//! }
//! assert!(retired.is_empty());
//! # // SAFETY: the last live object, from `Box::into_raw`, freed once.
//! # drop(unsafe { Box::from_raw(current.into_inner()) });
//! ```

#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_code)]

mod clock;
mod global;
mod retire;
mod sync;
mod tsc;

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

pub use clock::{Clock, LogicalClock, TscClock};
pub use global::{
    AtomicEpochs, ACTIVE_COUNT_BITS, EPOCH_BITS, MAX_ACTIVE_GUARDS_PER_EPOCH, MAX_EPOCH,
};
pub use retire::{RetireList, Retired};
pub use tsc::{LocalHandle, TscConfig, TscEpochs, DEFAULT_CAPACITY_SLOTS, QUIESCENT_STAMP};

use sync::{AtomicU64, Ordering};
use tsc::Slot;

/// A way to learn when no operation can still reference a retired item.
///
/// Protocol: an operation runs inside a [`Guard`] from [`pin`]; a writer
/// first unlinks an item (so operations starting afterwards cannot reach
/// it), then stamps it with [`now`]; the item may be reused once
/// [`safe_to_reclaim`] says so for that stamp. Stamps are comparable only
/// within one scheme instance.
///
/// [`pin`]: EpochScheme::pin
/// [`now`]: EpochScheme::now
/// [`safe_to_reclaim`]: EpochScheme::safe_to_reclaim
pub trait EpochScheme: Send + Sync {
    /// Short name: `"tsc"` or `"atomic"`, as [`EpochKind`] parses it.
    fn name(&self) -> &'static str;

    /// Starts an operation, or nests inside the calling thread's current
    /// one (a nested guard keeps the outer start time). The operation ends
    /// when the guard drops.
    fn try_pin(&self) -> Result<Guard<'_>, EpochError>;

    /// [`try_pin`](EpochScheme::try_pin), panicking with the error's
    /// explanation if the scheme has no room for this guard.
    fn pin(&self) -> Guard<'_> {
        match self.try_pin() {
            Ok(guard) => guard,
            Err(error) => panic!("epoch scheme `{}`: {error}", self.name()),
        }
    }

    /// The stamp to record when retiring something this thread has just
    /// unlinked.
    fn now(&self) -> u64;

    /// A bound such that anything retired with a stamp below it is safe to
    /// reuse now (`u64::MAX` when no operation is running).
    fn reclaim_bound(&self) -> u64;

    /// Whether something retired at `retired_at` is safe to reuse now.
    fn safe_to_reclaim(&self, retired_at: u64) -> bool {
        retired_at < self.reclaim_bound()
    }
}

/// An operation in progress; dropping it ends the operation.
///
/// Not `Send`: it stands for the pinning thread's activity.
#[must_use = "dropping a guard immediately ends the operation"]
pub struct Guard<'a> {
    inner: GuardInner<'a>,
    _not_send: PhantomData<*const ()>,
}

enum GuardInner<'a> {
    /// A [`TscEpochs`] slot; a temporary slot is also given back on drop.
    Slot { slot: &'a Slot, temporary: bool },
    /// One unit of an [`AtomicEpochs`] active count.
    Counter { word: &'a AtomicU64, unit: u64 },
}

impl<'a> Guard<'a> {
    fn slot(slot: &'a Slot, temporary: bool) -> Guard<'a> {
        Guard {
            inner: GuardInner::Slot { slot, temporary },
            _not_send: PhantomData,
        }
    }

    fn counter(word: &'a AtomicU64, unit: u64) -> Guard<'a> {
        Guard {
            inner: GuardInner::Counter { word, unit },
            _not_send: PhantomData,
        }
    }
}

impl Drop for Guard<'_> {
    #[inline]
    fn drop(&mut self) {
        match self.inner {
            GuardInner::Slot { slot, temporary } => {
                slot.exit();
                if temporary {
                    slot.release();
                }
            }
            GuardInner::Counter { word, unit } => {
                // Release: the operation's reads happen before the epoch
                // advance that sees this count drained.
                word.fetch_sub(unit, Ordering::Release);
            }
        }
    }
}

impl fmt::Debug for Guard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.inner {
            GuardInner::Slot { .. } => EpochKind::Tsc,
            GuardInner::Counter { .. } => EpochKind::GlobalAtomic,
        };
        f.debug_struct("Guard").field("kind", &kind).finish()
    }
}

/// Why a guard could not be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochError {
    /// Every slot of a [`TscEpochs`] table is owned by a live thread.
    TableFull {
        /// The table's capacity.
        capacity_slots: usize,
    },
    /// An [`AtomicEpochs`] count is saturated.
    TooManyGuards {
        /// Most guards per epoch parity.
        limit: u64,
    },
}

impl fmt::Display for EpochError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EpochError::TableFull { capacity_slots } => write!(
                f,
                "epoch table full: all {capacity_slots} slots are owned by live threads \
                 (raise TscConfig::capacity_slots)"
            ),
            EpochError::TooManyGuards { limit } => write!(
                f,
                "more than {limit} guards active at once in one epoch of the global counter"
            ),
        }
    }
}

impl std::error::Error for EpochError {}

/// Which epoch scheme to use: the parameter benchmarks vary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EpochKind {
    /// Per-thread TSC slots ([`TscEpochs`]), Nibble's design. Name `tsc`.
    Tsc,
    /// One shared epoch word ([`AtomicEpochs`]), the baseline. Name `atomic`.
    GlobalAtomic,
}

impl EpochKind {
    /// Every kind, for benchmarks that compare them.
    pub const ALL: [EpochKind; 2] = [EpochKind::Tsc, EpochKind::GlobalAtomic];

    /// The name [`FromStr`] accepts and [`fmt::Display`] prints.
    pub fn name(self) -> &'static str {
        match self {
            EpochKind::Tsc => "tsc",
            EpochKind::GlobalAtomic => "atomic",
        }
    }

    /// A fresh scheme of this kind with default settings, boxed.
    pub fn build(self) -> Box<dyn EpochScheme> {
        match self {
            EpochKind::Tsc => Box::new(TscEpochs::new()),
            EpochKind::GlobalAtomic => Box::new(AtomicEpochs::new()),
        }
    }
}

impl fmt::Display for EpochKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not an [`EpochKind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseEpochKindError(String);

impl fmt::Display for ParseEpochKindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown epoch scheme `{}` (expected `tsc` or `atomic`)",
            self.0
        )
    }
}

impl std::error::Error for ParseEpochKindError {}

impl FromStr for EpochKind {
    type Err = ParseEpochKindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EpochKind::ALL
            .into_iter()
            .find(|kind| kind.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| ParseEpochKindError(s.to_owned()))
    }
}

/// Either scheme, chosen at run time by [`EpochKind`], with static dispatch.
#[derive(Debug)]
pub enum Epochs {
    /// [`EpochKind::Tsc`].
    Tsc(TscEpochs),
    /// [`EpochKind::GlobalAtomic`].
    GlobalAtomic(AtomicEpochs),
}

impl Epochs {
    /// A scheme of `kind` with default settings.
    pub fn new(kind: EpochKind) -> Epochs {
        match kind {
            EpochKind::Tsc => Epochs::Tsc(TscEpochs::new()),
            EpochKind::GlobalAtomic => Epochs::GlobalAtomic(AtomicEpochs::new()),
        }
    }

    /// Which kind this is.
    pub fn kind(&self) -> EpochKind {
        match self {
            Epochs::Tsc(_) => EpochKind::Tsc,
            Epochs::GlobalAtomic(_) => EpochKind::GlobalAtomic,
        }
    }
}

impl EpochScheme for Epochs {
    fn name(&self) -> &'static str {
        self.kind().name()
    }

    #[inline]
    fn try_pin(&self) -> Result<Guard<'_>, EpochError> {
        match self {
            Epochs::Tsc(s) => s.try_pin(),
            Epochs::GlobalAtomic(s) => s.try_pin(),
        }
    }

    fn now(&self) -> u64 {
        match self {
            Epochs::Tsc(s) => s.now(),
            Epochs::GlobalAtomic(s) => s.now(),
        }
    }

    fn reclaim_bound(&self) -> u64 {
        match self {
            Epochs::Tsc(s) => s.reclaim_bound(),
            Epochs::GlobalAtomic(s) => s.reclaim_bound(),
        }
    }

    fn safe_to_reclaim(&self, retired_at: u64) -> bool {
        match self {
            Epochs::Tsc(s) => s.safe_to_reclaim(retired_at),
            Epochs::GlobalAtomic(s) => s.safe_to_reclaim(retired_at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip() {
        for kind in EpochKind::ALL {
            assert_eq!(kind.to_string().parse::<EpochKind>(), Ok(kind));
            assert_eq!(Epochs::new(kind).name(), kind.name());
            assert_eq!(kind.build().name(), kind.name());
        }
        assert_eq!("TSC".parse(), Ok(EpochKind::Tsc));
        assert_eq!("atomic".parse(), Ok(EpochKind::GlobalAtomic));
        let err = "rcu".parse::<EpochKind>().unwrap_err();
        assert!(err.to_string().contains("rcu"));
    }

    #[test]
    fn both_kinds_follow_the_rule() {
        for kind in EpochKind::ALL {
            let epochs = Epochs::new(kind);
            let old = epochs.pin();
            let retired_at = epochs.now();
            assert!(!epochs.safe_to_reclaim(retired_at), "{kind}");
            assert!(epochs.reclaim_bound() <= retired_at, "{kind}");
            drop(old);
            assert!(epochs.safe_to_reclaim(retired_at), "{kind}");
            assert!(format!("{:?}", epochs.pin()).contains("Guard"));
        }
    }

    #[test]
    fn errors_explain_themselves() {
        let full = EpochError::TableFull { capacity_slots: 8 }.to_string();
        assert!(full.contains("8 slots") && full.contains("capacity_slots"));
        let many = EpochError::TooManyGuards { limit: 4095 }.to_string();
        assert!(many.contains("4095"));
    }
}
