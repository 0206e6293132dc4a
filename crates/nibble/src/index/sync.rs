//! The synchronisation primitives the index is written against: `std`'s
//! normally, loom's when built with `RUSTFLAGS="--cfg loom"`, so that
//! `tests/loom_index.rs` explores every interleaving (and every value the
//! C++/Rust memory model lets a relaxed load return) of the real code.

#[cfg(not(loom))]
pub(crate) use std::hint::spin_loop;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::thread::yield_now;
