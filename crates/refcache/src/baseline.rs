//! The two baselines of RadixVM Figure 8, for comparison with Refcache.
//!
//! * [`SharedCount`]: one atomic word per object; every `inc` and `dec` is
//!   a locked read-modify-write of the same cache line, so the line bounces
//!   between every core that touches the object. Zero is detected at once.
//! * [`Snzi`]: a Scalable NonZero Indicator (Ellen, Lev, Luchangco, Moir,
//!   PODC 2007) used as a count, as RadixVM's comparison does. Threads
//!   arrive at and depart from leaves of a tree; a node tells its parent
//!   only when its own surplus goes from 0 to 1 or from 1 to 0, so the root
//!   sees only the leaves' transitions. The root is an exact counter whose
//!   zero is the object's zero. Each node is a `(count, version)` word; the
//!   count is in halves, and the intermediate `1/2` value is what makes a
//!   0 -> 1 transition and its arrival at the parent look atomic:
//!
//! ```text
//!  arrive(leaf):  c == 0   -> CAS (1/2, v+1); arrive(parent); CAS (1, v+1)
//!                            (a failed second CAS means a helper finished
//!                             it: undo our extra parent arrival)
//!                 c == 1/2 -> help: arrive(parent); CAS (1, v)
//!                 c >= 1   -> CAS (c+1, v)
//!  depart(leaf):  CAS (c-1, v); if c was 1, depart(parent)
//! ```
//!
//! Space is the point of the comparison: SNZI needs a node per leaf per
//! object (one cache line each, to avoid false sharing), Refcache needs one
//! count and lock per object and a fixed cache per thread.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::sync::{AtomicI64, AtomicU64, Ordering};
use crate::CachePadded;

/// One shared atomic counter.
#[derive(Debug)]
pub struct SharedCount {
    count: CachePadded<AtomicI64>,
}

impl SharedCount {
    /// A count starting at `initial`.
    pub fn new(initial: i64) -> SharedCount {
        SharedCount {
            count: CachePadded::new(AtomicI64::new(initial)),
        }
    }

    /// Adds one reference.
    pub fn inc(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops one reference; true when it was the last.
    pub fn dec(&self) -> bool {
        self.count.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// The count now.
    pub fn get(&self) -> i64 {
        self.count.load(Ordering::Acquire)
    }

    /// Bytes per object: one padded word.
    pub const BYTES_PER_OBJECT: usize = core::mem::size_of::<CachePadded<AtomicI64>>();
}

/// Default leaves of a SNZI tree: one per thread up to this many.
pub const DEFAULT_SNZI_LEAVES: usize = 16;
/// Children per SNZI interior node.
pub const SNZI_FANOUT: usize = 2;

/// Half-units: a node's count is stored doubled so `1/2` is `1`.
const HALF: u64 = 1;
const ONE: u64 = 2;

fn pack(count_halves: u64, version: u64) -> u64 {
    (version << 32) | count_halves
}

fn unpack(word: u64) -> (u64, u64) {
    (word & 0xffff_ffff, word >> 32)
}

/// A SNZI tree used as a reference count. Nodes `0..leaves` are leaves;
/// interior nodes follow; the root is a plain counter.
#[derive(Debug)]
pub struct Snzi {
    nodes: Box<[CachePadded<SnziNode>]>,
    root: CachePadded<AtomicI64>,
    leaves: usize,
}

#[derive(Debug)]
struct SnziNode {
    word: AtomicU64,
    /// Index of the parent node, or `None` for the root counter.
    parent: Option<usize>,
}

impl Snzi {
    /// A tree with `leaves` leaves (at least 1) and `initial` references
    /// counted at the root.
    pub fn new(leaves: usize, initial: i64) -> Snzi {
        let leaves = leaves.max(1);
        let mut nodes: Vec<CachePadded<SnziNode>> = Vec::new();
        // Build level by level: each level's nodes have parents in the next.
        let mut level: Vec<usize> = (0..leaves).collect();
        for _ in 0..leaves {
            nodes.push(CachePadded::new(SnziNode {
                word: AtomicU64::new(0),
                parent: None,
            }));
        }
        while level.len() > 1 {
            let mut next = Vec::new();
            for group in level.chunks(SNZI_FANOUT) {
                let parent = nodes.len();
                nodes.push(CachePadded::new(SnziNode {
                    word: AtomicU64::new(0),
                    parent: None,
                }));
                for &child in group {
                    nodes[child].parent = Some(parent);
                }
                next.push(parent);
            }
            level = next;
        }
        // The last level's single node reports to the root counter; a
        // one-leaf tree's leaf does too.
        Snzi {
            nodes: nodes.into_boxed_slice(),
            root: CachePadded::new(AtomicI64::new(initial)),
            leaves,
        }
    }

    /// Leaves in the tree.
    pub fn leaves(&self) -> usize {
        self.leaves
    }

    /// Bytes per object: every node plus the root.
    pub fn bytes_per_object(&self) -> usize {
        self.nodes.len() * core::mem::size_of::<CachePadded<SnziNode>>()
            + core::mem::size_of::<CachePadded<AtomicI64>>()
    }

    /// Adds one reference through leaf `thread % leaves`.
    pub fn inc(&self, thread: usize) {
        self.arrive(Some(thread % self.leaves));
    }

    /// Drops one reference through leaf `thread % leaves` (the leaf the
    /// matching `inc` used); true when the whole count reached zero.
    pub fn dec(&self, thread: usize) -> bool {
        self.depart(Some(thread % self.leaves))
    }

    /// The root count: references outside the leaves plus one per leaf
    /// subtree with a surplus. Zero exactly when the true count is zero.
    pub fn root(&self) -> i64 {
        self.root.load(Ordering::Acquire)
    }

    fn arrive(&self, node: Option<usize>) {
        let Some(index) = node else {
            self.root.fetch_add(1, Ordering::AcqRel);
            return;
        };
        let node = &self.nodes[index];
        let mut done = false;
        let mut undo = 0;
        while !done {
            let mut word = node.word.load(Ordering::Acquire);
            let (count, version) = unpack(word);
            if count >= ONE {
                if node
                    .word
                    .compare_exchange(
                        word,
                        pack(count + ONE, version),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
                {
                    done = true;
                }
                continue;
            }
            if count == 0 {
                let half = pack(HALF, version + 1);
                if node
                    .word
                    .compare_exchange(word, half, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
                done = true;
                word = half;
            }
            // count is 1/2: finish the transition, ours or another's.
            self.arrive(node.parent);
            let (_, version) = unpack(word);
            if node
                .word
                .compare_exchange(
                    word,
                    pack(ONE, version),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
            {
                undo += 1;
            }
        }
        for _ in 0..undo {
            self.depart(node.parent);
        }
    }

    fn depart(&self, node: Option<usize>) -> bool {
        let Some(index) = node else {
            return self.root.fetch_sub(1, Ordering::AcqRel) == 1;
        };
        let node = &self.nodes[index];
        loop {
            let word = node.word.load(Ordering::Acquire);
            let (count, version) = unpack(word);
            debug_assert!(count >= ONE, "SNZI depart without arrive");
            if node
                .word
                .compare_exchange(
                    word,
                    pack(count - ONE, version),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                return count == ONE && self.depart(node.parent);
            }
        }
    }
}
