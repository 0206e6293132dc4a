//! `core`'s atomics normally, loom's under `cfg(loom)` so `tests/loom.rs`
//! can explore the slot lock / expand step.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicUsize, Ordering};

/// Waits politely for another thread's lock bit.
pub(crate) fn spin_wait() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
