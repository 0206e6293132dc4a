//! Scalable reference counting: Refcache (RadixVM, EuroSys 2013, §3.1)
//! and the two baselines it was measured against (§5.5, Figure 8).
//!
//! A reference count is usually one shared word, so every increment and
//! decrement from every core writes the same cache line. Refcache observes
//! that a reference count's true value matters only when it reaches zero,
//! and that zero may be noticed late. So each thread keeps a small cache of
//! count *deltas* and applies them to the objects' global counts only when
//! a slot is needed for another object or at the end of an epoch; an
//! object is freed once its count has stayed zero across two epoch
//! boundaries. The algorithm, its epochs and weak references are in
//! [`cache`] (module essay, with a timeline of the dirty-zero case).
//!
//! Layout:
//! * [`cache`] — [`Refcache`], [`Local`], [`Counted`], [`Weak`]: the
//!   algorithm of Figure 2. `no_std` + `alloc`.
//! * [`baseline`] — [`SharedCount`] and [`Snzi`]. `no_std` + `alloc`.
//! * [`scheme`] — one trait over all three, [`RefCounter`], and the
//!   parameter that picks one, [`CounterKind`]; what benchmarks vary.
//! * `ticker` (feature `std`) — a background thread that ends epochs.
//! * `bench` (feature `std`) — RadixVM Figure 8 as a library function,
//!   for `memlab refcache`.
//!
//! ```
//! use refcache::{Config, Refcache};
//!
//! let domain = Refcache::new(Config { ops_per_tick: 0, ..Config::default() });
//! let local = domain.register().unwrap();
//! let (page, weak) = local.alloc_with_weak(42_u64, None);
//! let again = local.clone_ref(&page);
//! assert_eq!(*again, 42);
//! local.release(again);
//! local.release(page);
//! // The count is zero, but only in this thread's cache: nothing is freed
//! // until two epochs have passed with the global count at zero.
//! local.flush();
//! assert!(!weak.is_freed());
//! // A weak reference can still revive it...
//! let revived = weak.try_get(&local).unwrap();
//! local.release(revived);
//! drop(local);
//! // ...until Refcache frees it.
//! assert!(domain.quiesce(16));
//! assert!(weak.is_freed());
//! assert_eq!(domain.objects_freed(), 1);
//! ```

#![no_std]
#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

extern crate alloc;
#[cfg(any(feature = "std", test))]
extern crate std;

pub mod baseline;
#[cfg(all(feature = "std", not(loom)))]
pub mod bench;
pub mod cache;
pub mod scheme;
mod sync;
#[cfg(all(feature = "std", not(loom)))]
pub mod ticker;

pub use baseline::{SharedCount, Snzi, DEFAULT_SNZI_LEAVES, SNZI_FANOUT};
pub use cache::{
    Config, Counted, Local, Refcache, Weak, DEFAULT_CACHE_SLOTS, DEFAULT_MAX_THREADS,
    DEFAULT_OPS_PER_TICK, REGISTER_ATTEMPTS, REVIEW_DELAY_EPOCHS,
};
pub use scheme::{CounterKind, ParseCounterKindError, RefCounter, ThreadCount};
#[cfg(all(feature = "std", not(loom)))]
pub use ticker::{Ticker, DEFAULT_TICK_PERIOD_MS};

/// Pads and aligns a value to 128 bytes (two cache lines: x86's adjacent
/// line prefetcher pulls pairs), so that per-thread state never shares a
/// line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct CachePadded<T>(T);

impl<T> CachePadded<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        CachePadded(value)
    }
}

impl<T> core::ops::Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> core::ops::DerefMut for CachePadded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}
