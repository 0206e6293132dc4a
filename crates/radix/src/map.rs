//! The tree, its slot words, range locking with expansion, and lookups.
//! The module essay is the crate's (`lib.rs`); this file holds the code.
//!
//! Slot word layout (`usize`):
//!
//! ```text
//!  bit 0      LOCK     held by a range lock
//!  bit 1      NODE     the rest is a pointer to a child node (8-aligned)
//!  bit 2      PRESENT  bits 3.. hold a value for every page under the slot
//!  0                   empty (no mapping anywhere under the slot)
//! ```

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;
use core::ops::Range;

use crate::sync::{spin_wait, AtomicUsize, Ordering};

/// Bits of the page number consumed by each level (RadixVM: nine).
pub const BITS_PER_LEVEL: u32 = 9;
/// Slots in a node at [`BITS_PER_LEVEL`].
pub const SLOTS_PER_NODE: usize = 1 << BITS_PER_LEVEL;
/// Levels for 36-bit page numbers: 48-bit virtual addresses, 4 KiB pages.
pub const DEFAULT_LEVELS: u32 = 4;
/// The largest value a slot can hold (61 bits).
pub const MAX_VALUE: u64 = (usize::MAX >> VALUE_SHIFT) as u64;

const LOCK: usize = 1;
const NODE: usize = 2;
const PRESENT: usize = 4;
const VALUE_SHIFT: u32 = 3;
const EMPTY: usize = 0;

/// Shape of a [`RadixMap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Levels of the tree, root included.
    pub levels: u32,
    /// Bits of the key per level ([`BITS_PER_LEVEL`]; smaller only for
    /// model checking).
    pub bits_per_level: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            levels: DEFAULT_LEVELS,
            bits_per_level: BITS_PER_LEVEL,
        }
    }
}

impl Config {
    /// Bits of a key.
    pub fn key_bits(&self) -> u32 {
        self.levels * self.bits_per_level
    }

    /// Keys covered by one slot at `level` (0 is the root).
    fn span(&self, level: u32) -> u64 {
        1 << (self.bits_per_level * (self.levels - 1 - level))
    }

    fn fanout(&self) -> usize {
        1 << self.bits_per_level
    }
}

fn encode(value: Option<u64>) -> usize {
    match value {
        None => EMPTY,
        Some(v) => {
            assert!(v <= MAX_VALUE, "radix values are at most {MAX_VALUE}");
            ((v as usize) << VALUE_SHIFT) | PRESENT
        }
    }
}

fn decode(word: usize) -> Option<u64> {
    debug_assert_eq!(word & NODE, 0);
    (word & PRESENT != 0).then_some((word >> VALUE_SHIFT) as u64)
}

/// A node: `fanout` slot words, allocated as one boxed slice and named by
/// a thin pointer to its first slot (so the pointer fits in a slot word).
#[derive(Clone, Copy)]
struct NodePtr(*const AtomicUsize);

impl NodePtr {
    fn alloc(fanout: usize, init: impl Fn(usize) -> usize) -> NodePtr {
        let slots: Box<[AtomicUsize]> = (0..fanout).map(|i| AtomicUsize::new(init(i))).collect();
        NodePtr(Box::into_raw(slots).cast::<AtomicUsize>())
    }

    fn from_word(word: usize) -> NodePtr {
        debug_assert_ne!(word & NODE, 0);
        NodePtr((word & !(LOCK | NODE | PRESENT)) as *const AtomicUsize)
    }

    fn word(self) -> usize {
        self.0 as usize | NODE
    }

    fn slot<'a>(self, index: usize) -> &'a AtomicUsize {
        // SAFETY: a node, once published, lives until the map drops (nodes
        // are never freed earlier), and every caller holds `&RadixMap`;
        // `index` is below the fanout (callers index by masked key bits).
        unsafe { &*self.0.add(index) }
    }

    /// # Safety
    /// The node came from `alloc(fanout, ..)` and nothing can reach it.
    unsafe fn free(self, fanout: usize) {
        let slice = core::ptr::slice_from_raw_parts_mut(self.0.cast_mut(), fanout);
        // SAFETY: by the contract, `slice` is the boxed slice `alloc` leaked.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// The radix address map.
pub struct RadixMap {
    root: NodePtr,
    config: Config,
    nodes: AtomicUsize,
}

// SAFETY: the map's shared state is atomics (slot words) and nodes owned by
// the map; raw node pointers are only followed while the map is borrowed.
unsafe impl Send for RadixMap {}
// SAFETY: as above; every access through `&RadixMap` is atomic.
unsafe impl Sync for RadixMap {}

impl fmt::Debug for RadixMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RadixMap")
            .field("config", &self.config)
            .field("nodes", &self.node_count())
            .finish()
    }
}

impl Default for RadixMap {
    fn default() -> Self {
        RadixMap::new(Config::default())
    }
}

/// A maximal run of keys with one value, from [`RadixMap::runs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The keys.
    pub keys: Range<u64>,
    /// Their value.
    pub value: u64,
}

impl RadixMap {
    /// An empty map of the given shape.
    pub fn new(config: Config) -> RadixMap {
        assert!(config.levels >= 1 && config.bits_per_level >= 1);
        assert!(
            config.key_bits() <= 60,
            "keys are page numbers: at most 60 bits"
        );
        RadixMap {
            root: NodePtr::alloc(config.fanout(), |_| EMPTY),
            config,
            nodes: AtomicUsize::new(1),
        }
    }

    /// The shape.
    pub fn config(&self) -> Config {
        self.config
    }

    /// One past the largest key.
    pub fn key_limit(&self) -> u64 {
        1 << self.config.key_bits()
    }

    /// Nodes allocated (root included).
    pub fn node_count(&self) -> usize {
        self.nodes.load(Ordering::Relaxed)
    }

    /// Bytes of node memory.
    pub fn node_bytes(&self) -> usize {
        self.node_count() * self.config.fanout() * core::mem::size_of::<usize>()
    }

    fn index(&self, key: u64, level: u32) -> usize {
        let shift = self.config.bits_per_level * (self.config.levels - 1 - level);
        ((key >> shift) as usize) & (self.config.fanout() - 1)
    }

    /// The value at `key`. Lock-free: one load per level, no writes.
    pub fn lookup(&self, key: u64) -> Option<u64> {
        assert!(key < self.key_limit(), "key {key:#x} out of range");
        let mut node = self.root;
        let mut level = 0;
        loop {
            let word = node.slot(self.index(key, level)).load(Ordering::Acquire);
            if word & NODE == 0 {
                return decode(word & !LOCK);
            }
            node = NodePtr::from_word(word);
            level += 1;
        }
    }

    /// Locks `keys`, left to right, expanding folded slots the range only
    /// partly covers. Blocks while an overlapping range is locked.
    pub fn lock(&self, keys: Range<u64>) -> RangeGuard<'_> {
        assert!(keys.start <= keys.end && keys.end <= self.key_limit());
        let mut guard = RangeGuard {
            map: self,
            keys: keys.clone(),
            slots: Vec::new(),
        };
        if !keys.is_empty() {
            self.lock_in(self.root, 0, 0, keys, false, &mut guard.slots);
        }
        guard
    }

    /// Locks the slots of `node` (at `level`, first key `base`) that cover
    /// `keys`, appending them to `out`. With `held`, the node is fresh from
    /// an expansion by this thread and those slots are locked already.
    fn lock_in(
        &self,
        node: NodePtr,
        level: u32,
        base: u64,
        keys: Range<u64>,
        held: bool,
        out: &mut Vec<(NodePtr, usize)>,
    ) {
        let span = self.config.span(level);
        let leaf = level + 1 == self.config.levels;
        let first = ((keys.start - base) / span) as usize;
        let last = ((keys.end - 1 - base) / span) as usize;
        for index in first..=last {
            let slot_base = base + index as u64 * span;
            let part = keys.start.max(slot_base)..keys.end.min(slot_base + span);
            let whole = part.start == slot_base && part.end == slot_base + span;
            let slot = node.slot(index);
            loop {
                let word = slot.load(Ordering::Acquire);
                if word & NODE != 0 {
                    debug_assert!(!held, "a fresh node has no children");
                    self.lock_in(
                        NodePtr::from_word(word),
                        level + 1,
                        slot_base,
                        part,
                        false,
                        out,
                    );
                    break;
                }
                if !held {
                    if word & LOCK != 0 {
                        spin_wait();
                        continue;
                    }
                    if slot
                        .compare_exchange_weak(
                            word,
                            word | LOCK,
                            Ordering::Acquire,
                            Ordering::Relaxed,
                        )
                        .is_err()
                    {
                        continue;
                    }
                }
                // This thread holds `slot`.
                if whole || leaf {
                    out.push((node, index));
                } else {
                    let child = self.expand(slot, word & !LOCK, level + 1, slot_base, &part);
                    self.lock_in(child, level + 1, slot_base, part, true, out);
                }
                break;
            }
        }
    }

    /// Replaces the locked folded slot `slot` (value word `folded`) by a
    /// child node whose entries all hold `folded`, born locked where
    /// `part` covers them; publishing the child releases `slot`.
    fn expand(
        &self,
        slot: &AtomicUsize,
        folded: usize,
        level: u32,
        base: u64,
        part: &Range<u64>,
    ) -> NodePtr {
        let span = self.config.span(level);
        let first = ((part.start - base) / span) as usize;
        let last = ((part.end - 1 - base) / span) as usize;
        let child = NodePtr::alloc(self.config.fanout(), |i| {
            if (first..=last).contains(&i) {
                folded | LOCK
            } else {
                folded
            }
        });
        self.nodes.fetch_add(1, Ordering::Relaxed);
        // Release: the entries are initialised before a lookup can follow
        // the pointer.
        slot.store(child.word(), Ordering::Release);
        child
    }

    /// Sets every key in `keys` to `value` (locking the range meanwhile).
    pub fn set(&self, keys: Range<u64>, value: u64) {
        self.lock(keys).set(value);
    }

    /// Removes every key in `keys`.
    pub fn unset(&self, keys: Range<u64>) {
        self.lock(keys).unset();
    }

    /// Calls `f` for each maximal run of equal values within `keys`
    /// (without locking: runs changed meanwhile may be seen old or new).
    pub fn for_each_run(&self, keys: Range<u64>, mut f: impl FnMut(Run)) {
        assert!(keys.end <= self.key_limit());
        let mut pending: Option<Run> = None;
        if !keys.is_empty() {
            self.walk(
                self.root,
                0,
                0,
                &keys,
                &mut |range, value| match (&mut pending, value) {
                    (Some(run), Some(v)) if run.value == v && run.keys.end == range.start => {
                        run.keys.end = range.end;
                    }
                    (_, value) => {
                        if let Some(run) = pending.take() {
                            f(run);
                        }
                        pending = value.map(|value| Run { keys: range, value });
                    }
                },
            );
        }
        if let Some(run) = pending {
            f(run);
        }
    }

    /// The runs in `keys`, collected.
    pub fn runs(&self, keys: Range<u64>) -> Vec<Run> {
        let mut out = Vec::new();
        self.for_each_run(keys, |run| out.push(run));
        out
    }

    fn walk(
        &self,
        node: NodePtr,
        level: u32,
        base: u64,
        keys: &Range<u64>,
        f: &mut impl FnMut(Range<u64>, Option<u64>),
    ) {
        let span = self.config.span(level);
        let first = ((keys.start.max(base) - base) / span) as usize;
        let last = ((keys.end - 1 - base) / span).min(self.config.fanout() as u64 - 1) as usize;
        for index in first..=last {
            let slot_base = base + index as u64 * span;
            let word = node.slot(index).load(Ordering::Acquire);
            if word & NODE != 0 {
                self.walk(NodePtr::from_word(word), level + 1, slot_base, keys, f);
            } else {
                let part = keys.start.max(slot_base)..keys.end.min(slot_base + span);
                f(part, decode(word & !LOCK));
            }
        }
    }

    fn free_subtree(&mut self, node: NodePtr, level: u32) {
        if level + 1 < self.config.levels {
            for index in 0..self.config.fanout() {
                let word = node.slot(index).load(Ordering::Relaxed);
                if word & NODE != 0 {
                    self.free_subtree(NodePtr::from_word(word), level + 1);
                }
            }
        }
        // SAFETY: `&mut self`: no lookup or guard is live, and this node
        // was unlinked from nothing else (each node has one parent slot).
        unsafe { node.free(self.config.fanout()) };
    }
}

impl Drop for RadixMap {
    fn drop(&mut self) {
        let root = self.root;
        self.free_subtree(root, 0);
    }
}

/// A locked range. Dropping it unlocks exactly the slots it locked.
pub struct RangeGuard<'a> {
    map: &'a RadixMap,
    keys: Range<u64>,
    /// The locked slots, in key order; they tile `keys` exactly.
    slots: Vec<(NodePtr, usize)>,
}

impl fmt::Debug for RangeGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RangeGuard")
            .field("keys", &self.keys)
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl RangeGuard<'_> {
    /// The locked keys.
    pub fn keys(&self) -> Range<u64> {
        self.keys.clone()
    }

    /// Slots held (a folded slot covers many keys).
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Sets every locked key to `value`: one store per locked slot.
    pub fn set(&self, value: u64) {
        self.store(encode(Some(value)));
    }

    /// Removes every locked key.
    pub fn unset(&self) {
        self.store(EMPTY);
    }

    fn store(&self, word: usize) {
        for &(node, index) in &self.slots {
            // Release: a lookup that sees the new value sees what the
            // caller wrote before setting it.
            node.slot(index).store(word | LOCK, Ordering::Release);
        }
    }

    /// The value at `key` inside the locked range.
    pub fn get(&self, key: u64) -> Option<u64> {
        assert!(self.keys.contains(&key));
        self.map.lookup(key)
    }

    /// The map.
    pub fn map(&self) -> &RadixMap {
        self.map
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        for &(node, index) in &self.slots {
            // Release: the next locker sees this guard's stores.
            node.slot(index).fetch_and(!LOCK, Ordering::Release);
        }
    }
}
