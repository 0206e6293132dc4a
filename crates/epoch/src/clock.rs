//! Where epoch timestamps come from: the processor's time-stamp counter, or
//! a logical counter for deterministic tests and the loom model.

use crate::sync::{fence, AtomicU64, Ordering};

/// A source of operation timestamps for [`TscEpochs`](crate::TscEpochs).
///
/// The table is correct for any clock with these properties:
///
/// * stamps are non-zero (zero means "quiescent" in a slot);
/// * stamps are globally consistent: if one read happens before another
///   in real time, on any cores, it is not larger. The TSC has this when
///   it is invariant and synchronised across cores (dissertation §4.6);
///   [`LogicalClock`] has it by construction (one shared counter).
pub trait Clock: Send + Sync + 'static {
    /// A timestamp for the start of an operation. It may be read early
    /// (before preceding instructions finish): an early, smaller stamp is
    /// only more conservative. It cannot be read late, because the table
    /// stores it and fences before the operation touches shared data.
    fn stamp(&self) -> u64;

    /// A timestamp read only after every earlier memory access of this
    /// thread is globally visible: the retirement time of something this
    /// thread has just unlinked. The default issues a `SeqCst` fence and
    /// then [`stamp`](Clock::stamp).
    fn stamp_ordered(&self) -> u64 {
        fence(Ordering::SeqCst);
        self.stamp()
    }
}

/// The processor's time-stamp counter, read with `RDTSC` from user space
/// ([`topology::rdtsc`]). Off x86-64 it is `CLOCK_MONOTONIC` nanoseconds.
///
/// Meaningful across cores only if the TSC is invariant and synchronised;
/// see [`TscClock::is_trustworthy`].
#[derive(Debug, Default, Clone, Copy)]
pub struct TscClock;

impl TscClock {
    /// Whether CPUID (or `/proc/cpuinfo`) reports an invariant TSC
    /// ([`topology::tsc_invariant`]). Synchronisation across cores is the
    /// kernel's finding, not checked here; on machines where it fails,
    /// raise [`TscConfig::skew_margin_ticks`](crate::TscConfig).
    pub fn is_trustworthy() -> bool {
        topology::tsc_invariant()
    }
}

impl Clock for TscClock {
    #[inline]
    fn stamp(&self) -> u64 {
        topology::rdtsc().max(1)
    }

    /// `MFENCE; LFENCE; RDTSC`, the sequence the Intel SDM gives for a TSC
    /// read that follows all earlier loads *and stores* becoming globally
    /// visible (RDTSC alone may execute before them, RDTSCP waits for loads
    /// only). `fence(SeqCst)` is the `MFENCE` and also the fence the
    /// language-level argument needs.
    #[inline]
    fn stamp_ordered(&self) -> u64 {
        fence(Ordering::SeqCst);
        lfence();
        topology::rdtsc().max(1)
    }
}

/// `LFENCE`: later instructions (here `RDTSC`) start only after earlier
/// ones have completed locally.
#[inline]
#[allow(unsafe_code)]
fn lfence() {
    // Miri runs no inline assembly, and its interpreter executes in order,
    // so there is nothing for the fence to order.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: LFENCE exists on every x86-64 processor (it is part of SSE2,
    // which x86-64 requires), reads and writes no memory or registers, and
    // leaves the flags alone.
    unsafe {
        core::arch::asm!("lfence", options(nostack, preserves_flags));
    }
}

/// A logical clock: one shared counter, incremented on every read. Stamps
/// are totally ordered and unique, which makes tests deterministic and
/// stands in for a synchronised TSC in the loom model (a `Relaxed`
/// read-modify-write: a consistent global order, but no happens-before, just
/// like `RDTSC`).
#[derive(Debug)]
pub struct LogicalClock {
    ticks: AtomicU64,
}

impl LogicalClock {
    /// A clock whose first stamp is 1.
    pub fn new() -> LogicalClock {
        LogicalClock {
            ticks: AtomicU64::new(0),
        }
    }

    /// The last stamp handed out (0 before the first).
    pub fn peek(&self) -> u64 {
        self.ticks.load(Ordering::Relaxed)
    }
}

impl Default for LogicalClock {
    fn default() -> Self {
        LogicalClock::new()
    }
}

impl Clock for LogicalClock {
    #[inline]
    fn stamp(&self) -> u64 {
        self.ticks.fetch_add(1, Ordering::Relaxed) + 1
    }
}
