//! The bucket seqlock of §4.3, on its own so that `tests/loom_index.rs` can
//! model-check exactly the code the index runs.
//!
//! A [`Bucket`] is one 64-bit version word and `N` 64-bit entries, aligned
//! to 128 bytes (two cache lines; `N = 15` fills them exactly). The version
//! is even when the bucket is free and odd while a writer holds it:
//!
//! ```text
//!  writer   CAS v->v+1 (Acq)  fence(Rel)  store e0, e1 (Rlx)  store v+2 (Rel)
//!  reader   v = load (Acq)    load e0, e1 (Rlx)  fence(Acq)   load (Rlx) == v ?
//! ```
//!
//! Why this is enough (Boehm, "Can seqlocks get along with programming
//! language memory models?", MSPC 2012): if a reader's relaxed entry load
//! returns a value some writer stored, the writer's release fence (after its
//! locking CAS) and the reader's acquire fence (before its second version
//! load) synchronise, so the CAS happens-before the second version load,
//! which therefore sees an odd or larger version and the read is retried.
//! If instead the first version load returned a writer's unlocking store,
//! that acquire load makes all of the writer's entry stores visible. So a
//! reader that validates saw every entry from one quiescent state. The
//! entries are atomics, so even the reads that are thrown away are not data
//! races. On x86-64 every one of these orderings is a plain `mov`; only the
//! locking CAS is a locked instruction.

use super::sync::{fence, AtomicU64, Ordering};
use crate::backoff::Backoff;

/// One seqlock-protected bucket: a version word and `N` entry words.
///
/// An all-zero bucket (version 0, every entry 0) is valid and free, so the
/// index can use untouched anonymous memory as empty buckets. Entries are
/// opaque `u64`s here; the index gives 0 the meaning "empty".
#[repr(C, align(128))]
pub struct Bucket<const N: usize> {
    version: AtomicU64,
    entries: [AtomicU64; N],
}

impl<const N: usize> Default for Bucket<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Bucket<N> {
    /// A free bucket with every entry 0 (the index itself uses zero pages).
    pub fn new() -> Self {
        Bucket {
            version: AtomicU64::new(0),
            entries: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Number of entry words.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Starts an optimistic read: waits until no writer holds the bucket
    /// and returns the (even) version to hand to [`Bucket::read_validate`].
    #[inline]
    pub fn read_begin(&self) -> u64 {
        let mut backoff = Backoff::new();
        loop {
            // Acquire: if this returns a writer's unlocking store, all its
            // entry stores are visible to the loads that follow.
            let version = self.version.load(Ordering::Acquire);
            if version & 1 == 0 {
                return version;
            }
            backoff.snooze();
        }
    }

    /// Loads entry `i` (relaxed). Inside a read section the value is only
    /// meaningful once [`Bucket::read_validate`] has returned true.
    ///
    /// # Panics
    /// If `i >= N`.
    #[inline]
    pub fn load(&self, i: usize) -> u64 {
        self.entries[i].load(Ordering::Relaxed)
    }

    /// Ends an optimistic read: true if no writer locked the bucket since
    /// the [`Bucket::read_begin`] that returned `version`, i.e. every entry
    /// loaded in between belongs to one consistent state.
    #[inline]
    pub fn read_validate(&self, version: u64) -> bool {
        // Orders the entry loads before the version reload; pairs with the
        // writer's release fence (see the module comment).
        fence(Ordering::Acquire);
        self.version.load(Ordering::Relaxed) == version
    }

    /// Locks the bucket for writing (makes the version odd), waiting while
    /// another writer holds it. Readers retry until the guard is dropped.
    pub fn lock(&self) -> BucketGuard<'_, N> {
        // Under loom, open with a read-modify-write (a CAS that expects a
        // fresh bucket; it fails harmlessly otherwise). Loom's partial-order
        // reduction compares an operation only with the object's latest
        // access, so with the load-then-CAS below alone the CAS's conflict
        // with a reader's earlier version load hides behind our own load
        // and loom never tries the lock before that read. A no-op RMW such
        // as `fetch_or(1)` on a held lock would not do either: loom leaves
        // it unordered with the holder's unlocking store and lets the
        // waiter read its own stale odd value forever.
        #[cfg(loom)]
        if self
            .version
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            fence(Ordering::Release);
            return BucketGuard {
                bucket: self,
                locked_version: 1,
            };
        }
        let mut backoff = Backoff::new();
        loop {
            let version = self.version.load(Ordering::Relaxed);
            if version & 1 == 0
                && self
                    .version
                    .compare_exchange_weak(
                        version,
                        version + 1,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                // Keeps the entry stores of this critical section after
                // the odd version in every reader's view (Boehm's writer).
                fence(Ordering::Release);
                return BucketGuard {
                    bucket: self,
                    locked_version: version + 1,
                };
            }
            backoff.snooze();
        }
    }

    /// True while a writer holds the bucket (a snapshot; for statistics).
    pub fn is_locked(&self) -> bool {
        self.version.load(Ordering::Relaxed) & 1 == 1
    }
}

/// Exclusive write access to one [`Bucket`]; dropping it unlocks the bucket
/// (version + 1, release), which publishes every store made through it.
pub struct BucketGuard<'a, const N: usize> {
    bucket: &'a Bucket<N>,
    /// The odd version this guard installed.
    locked_version: u64,
}

impl<const N: usize> BucketGuard<'_, N> {
    /// Loads entry `i`; exact, since no one else writes while we hold it.
    ///
    /// # Panics
    /// If `i >= N`.
    #[inline]
    pub fn load(&self, i: usize) -> u64 {
        self.bucket.entries[i].load(Ordering::Relaxed)
    }

    /// Stores entry `i`. Relaxed: concurrent readers either retry (they see
    /// the odd version via the fences) or see the store after the unlock.
    ///
    /// # Panics
    /// If `i >= N`.
    #[inline]
    pub fn store(&mut self, i: usize, value: u64) {
        self.bucket.entries[i].store(value, Ordering::Relaxed);
    }
}

impl<const N: usize> Drop for BucketGuard<'_, N> {
    fn drop(&mut self) {
        // Release: publishes the entry stores to readers whose acquire
        // `read_begin` returns this version, and the whole critical
        // section to the next writer's acquiring CAS.
        self.bucket
            .version
            .store(self.locked_version + 1, Ordering::Release);
    }
}
