//! The primitives the protocol is written against: `core`'s atomics and a
//! small spin lock normally; loom's atomics and mutex when built with
//! `RUSTFLAGS="--cfg loom"`, so that `tests/loom.rs` explores every
//! interleaving of the review / dirty-zero protocol.
//!
//! The spin lock stands for sv6's per-object spin lock and for "preemption
//! disabled" on a core: a thread's own cache lock is uncontended except
//! when an epoch ticker flushes the cache of an idle thread on its behalf.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::Arc;

#[cfg(not(loom))]
pub(crate) use alloc::sync::Arc;

/// Mutual exclusion with an RAII guard; loom's mutex under `cfg(loom)`.
#[cfg(loom)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

#[cfg(loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap()
    }

    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.0.try_lock().ok()
    }
}

#[cfg(not(loom))]
pub(crate) use spin::{Mutex, MutexGuard};

#[cfg(not(loom))]
mod spin {
    use core::cell::UnsafeCell;
    use core::ops::{Deref, DerefMut};
    use core::sync::atomic::{AtomicBool, Ordering};

    /// A test-and-test-and-set spin lock: one byte of state, `no_std`.
    pub(crate) struct Mutex<T> {
        locked: AtomicBool,
        value: UnsafeCell<T>,
    }

    // SAFETY: the lock hands out at most one `&mut T` at a time (the
    // `locked` flag, taken with Acquire and released with Release), so
    // sharing the lock between threads is sharing `T` by moving it.
    unsafe impl<T: Send> Sync for Mutex<T> {}
    // SAFETY: owning the lock is owning `T`.
    unsafe impl<T: Send> Send for Mutex<T> {}

    /// Holds the lock; dropping it unlocks.
    pub(crate) struct MutexGuard<'a, T> {
        lock: &'a Mutex<T>,
    }

    impl<T> Mutex<T> {
        pub(crate) const fn new(value: T) -> Self {
            Mutex {
                locked: AtomicBool::new(false),
                value: UnsafeCell::new(value),
            }
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .ok()
                .map(|_| MutexGuard { lock: self })
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            loop {
                if let Some(guard) = self.try_lock() {
                    return guard;
                }
                while self.locked.load(Ordering::Relaxed) {
                    core::hint::spin_loop();
                }
            }
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            // SAFETY: the guard exists only while `locked` is held by it,
            // so no other reference to the value exists.
            unsafe { &*self.lock.value.get() }
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: as in `deref`, and `&mut self` makes this the only
            // borrow through this guard.
            unsafe { &mut *self.lock.value.get() }
        }
    }

    impl<T> Drop for MutexGuard<'_, T> {
        fn drop(&mut self) {
            self.lock.locked.store(false, Ordering::Release);
        }
    }
}
