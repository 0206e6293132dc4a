//! The radix address map of RadixVM (EuroSys 2013, §3.2): virtual page
//! number -> mapping metadata, with operations on disjoint ranges that
//! share no cache lines.
//!
//! An address space is a map from page numbers to metadata. RadixVM keeps
//! it in a fixed-depth radix tree shaped like a hardware page table: each
//! level is indexed by 9 bits of the page number (512 slots per node), so
//! four levels cover a 36-bit page number (48-bit addresses, 4 KiB
//! pages). Point queries and iteration only; no balancing, so an update
//! writes only the slots of its own pages and never an interior node a
//! concurrent operation on other pages reads.
//!
//! Folding keeps it small: a slot at an interior level may hold a value
//! instead of a child pointer, meaning "every page under this slot has
//! this value". Setting a range to one value writes the largest aligned
//! slots the range covers; a write to part of a folded slot first
//! *expands* it into a child node whose 512 entries all hold the folded
//! value. Empty address space is a handful of empty slots near the root.
//!
//! Every slot has a lock bit. Range operations lock the slots covering
//! their range, left to right (so they cannot deadlock), and a range lock
//! is an RAII [`RangeGuard`] that unlocks exactly the slots it locked.
//! Expansion happens under the lock of the slot being expanded, and the
//! new node is born with the lock bit set in the entries the locker's
//! range covers: publishing the node pointer hands the lock down a level
//! in one store.
//!
//! ```text
//!  thread A: lock [0x200, 0x280)      thread B: lock [0x300, 0x400)
//!   root[0] = value V (folded) ───────────── both need root[0]'s subtree
//!   CAS root[0]: V -> V|L                B spins on root[0]
//!   child = [V|L x 0x80 at 0x200.., V elsewhere]  (unpublished)
//!   store root[0] = NODE(child)          B sees NODE, descends,
//!                                        locks child[0x300..0x400): free
//!   ... A and B now share nothing ...
//! ```
//!
//! Lookups take no locks and write no shared cache line: they follow node
//! pointers and read the slot, ignoring its lock bit (a locked slot still
//! holds the value in force until the locker replaces it). With collapse
//! on they also pin an epoch, a store to the thread's own slot.
//!
//! Values are 61-bit integers ([`MAX_VALUE`]) stored in the slot word
//! itself, so a lookup is one load per level and a set is one store per
//! slot; callers keep richer metadata elsewhere and store an index or a
//! packed descriptor.
//!
//! Collapse (the paper's design, beyond sv6, which never frees nodes):
//! every node's used slots are counted with [`refcache`], so the count
//! costs a writer no shared cache line; a writer's range lock also holds a
//! reference to each node it works in. Parents reach children through
//! Refcache weak references (the node's header word). When a node's count
//! has stayed zero for two Refcache epochs, Refcache frees the count and
//! kills the weak reference; a writer that later descends through the
//! parent slot finds `try_get` failing, unlinks the node with one CAS (node
//! slots are never locked) and retires its memory through the `epoch`
//! crate, since lookups take no references. A writer that reaches an empty
//! node before that revives it instead, so nodes whose pages churn are not
//! freed and re-made at the churn's rate: each costs at least two epochs
//! of disuse.
//!
//! ```text
//!  epoch e     unset: leaf count -> 0 (cached)     .. flushed: global 0, queued
//!  epoch e+2   review: still 0, weak killed -> Refcache frees the count
//!  later       writer descends root[i]: try_get fails -> CAS root[i]: NODE -> EMPTY,
//!              parent count -1, leaf memory retired; lookups already inside it
//!              read EMPTY slots (a dead node is empty) until they unpin
//! ```
//!
//! Writers go through a per-thread [`Handle`] (its Refcache cache); a
//! handle held by an idle thread holds up collapse (never correctness)
//! until the thread calls [`Handle::flush`] or drops it. With
//! [`Config::collapse`] off, no counting and no epoch pin happen, as in
//! sv6.
//!
//! The slot protocol is `no_std`-clean (`core` atomics, `alloc`); collapse
//! brings `std` in through the `epoch` crate's per-thread table and a
//! mutex around the retire list.

#![no_std]
#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

extern crate alloc;
extern crate std;

mod map;
mod sync;

pub use map::{
    Config, Handle, RadixMap, RangeGuard, Reader, Run, BITS_PER_LEVEL, DEFAULT_LEVELS, MAX_VALUE,
    NODE_COUNT_CACHE_SLOTS, NODE_COUNT_OPS_PER_TICK, SLOTS_PER_NODE,
};
