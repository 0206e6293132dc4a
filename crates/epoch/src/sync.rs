//! The atomics the reclamation protocol is written against: `std`'s
//! normally, loom's when built with `RUSTFLAGS="--cfg loom"` so that
//! `tests/loom.rs` can explore every interleaving and every value a weak
//! memory model lets a load return.
//!
//! Only the protocol state (slot stamps, ownership flags, the global epoch
//! word, the logical clock) goes through this shim. The thread-local
//! registry and the table id counter use `std` directly: they are not part
//! of the rule being checked, and loom runs its threads as coroutines on
//! one OS thread, so `std::thread_local!` could not be modelled anyway.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::*;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::*;
