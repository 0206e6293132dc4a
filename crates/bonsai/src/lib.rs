//! The Bonsai tree (Clements, Kaashoek, Zeldovich, "Scalable Address
//! Spaces Using RCU Balanced Trees", ASPLOS 2012, §3): an ordered map
//! whose lookups take no locks and execute no atomic read-modify-writes
//! while a writer inserts, deletes and rebalances.
//!
//! The tree is a bounded-balance (weight-balanced) binary tree after
//! Adams: every node records the size of its subtree, and a subtree is
//! rebalanced when one side holds more than [`WEIGHT`] (4) times the other.
//! Writers serialize on one lock. The danger for lock-free readers is a
//! rotation (Bonsai Figure 3): rotating in place moves subtree Y from under
//! `b` to under `a`, and a reader that was at `a` heading for Z can end up
//! in Y and miss its key.
//!
//! ```text
//!        a                 b           a reader at `a` bound for Z,
//!       / \               / \          racing an in-place rotation,
//!      X   b     =>      a   Z         follows a.right = Y (new) and
//!         / \           / \            misses Z's key.
//!        Y   Z         X   Y
//! ```
//!
//! Bonsai never rotates in place. Rotations build *new* nodes (`a'`, `b'`)
//! over the old, unchanged subtrees X, Y, Z, and the old `a` and `b` are
//! retired through RCU: a reader already inside the old nodes finishes in a
//! consistent old version. §3.3 then makes this cheap: instead of copying
//! the whole path to the root and swinging the root pointer, a rotation is
//! committed by storing one pointer in the parent, because the rotated
//! subtree holds exactly the keys of the old one; a plain insert links its
//! new leaf with one store, and the sizes on the path are updated in place
//! (only writers read them). About 2 allocations and 1 free per insert
//! result (the paper's figure; [`Stats`] counts ours). Delete by successor
//! is the exception: the successor vanishes from one place and appears in
//! another, two changes one store must publish together, so the path from
//! the successor up to the deleted node is copied and the copy is linked
//! in with one store.
//!
//! Deferred freeing uses the project's [`epoch`] crate (per-thread
//! TSC-stamped slots, dissertation §4.5): a lookup pins its thread (one
//! store to its own cache line and a fence, no read-modify-write of shared
//! data) and retired nodes are freed once every pin older than their
//! retirement is gone. It is this workspace's reclamation scheme, already
//! loom-checked, and its read side touches only the reader's own line,
//! which is what the Bonsai experiment measures; crossbeam-epoch would do
//! as well but would add a second scheme to reason about.
//!
//! The algorithm core needs `std` only through `epoch` and the writer's
//! lock. Feature `bench` adds the `bench` module: RadixVM Figures 6-7 (this tree,
//! the radix map, `RwLock<BTreeMap>`, crossbeam-skiplist) as a library
//! function for `memlab tree`.

#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(feature = "bench")]
pub mod bench;
mod tree;

pub use tree::{BonsaiTree, Range, Reader, Stats, COLLECT_EVERY_RETIRED_NODES, WEIGHT};
