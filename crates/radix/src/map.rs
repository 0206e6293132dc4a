//! The tree, its slot words, range locking with expansion, lookups, and
//! collapse. The algorithm is described in the crate essay (`lib.rs`).
//!
//! Slot word layout (`usize`):
//!
//! ```text
//!  bit 0      LOCK     held by a range lock
//!  bit 1      NODE     the rest is a pointer to a child node (8-aligned)
//!  bit 2      PRESENT  bits 3.. hold a value for every page under the slot
//!  0                   empty (no mapping anywhere under the slot)
//! ```
//!
//! A node is one allocation of `1 + fanout` words: a header word (a
//! pointer to the node's Refcache weak reference; 0 for the root and when
//! collapse is off) and the slots. Node pointers name the first slot.
//!
//! The retired-node list's lock is `xsync`'s because on the per-core
//! backend the map is shared between processes, where std's private-futex
//! wake-ups are lost.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;
use core::ops::Range;

use crossbeam_utils::CachePadded;
use epoch::{EpochKind, EpochScheme, Epochs, RetireList};
use refcache::{Counted, Local, Refcache, Weak};
use xsync::Mutex;

use crate::sync::{spin_wait, AtomicUsize, Ordering};

/// Bits of the page number consumed by each level (RadixVM: nine).
pub const BITS_PER_LEVEL: u32 = 9;
/// Slots in a node at [`BITS_PER_LEVEL`].
pub const SLOTS_PER_NODE: usize = 1 << BITS_PER_LEVEL;
/// Levels for 36-bit page numbers: 48-bit virtual addresses, 4 KiB pages.
pub const DEFAULT_LEVELS: u32 = 4;
/// The largest value a slot can hold (61 bits).
pub const MAX_VALUE: u64 = (usize::MAX >> VALUE_SHIFT) as u64;
/// Refcache delta-cache slots per thread for node counts: a writer touches
/// few nodes at a time.
pub const NODE_COUNT_CACHE_SLOTS: usize = 256;
/// Refcache operations per thread between epoch ticks it drives.
pub const NODE_COUNT_OPS_PER_TICK: u64 = 1024;

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
    /// Count used slots per node with Refcache and free nodes that stay
    /// empty (lookups then pin an epoch). Off: nodes live as long as the
    /// map, as in sv6.
    pub collapse: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            levels: DEFAULT_LEVELS,
            bits_per_level: BITS_PER_LEVEL,
            collapse: true,
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

/// Whether a slot word counts as a used slot of its node.
fn used(word: usize) -> bool {
    word & !LOCK != EMPTY
}

/// What a node's header word points at: its Refcache weak reference. The
/// Refcache object's count is the node's used slots plus one per range
/// lock working inside it.
struct NodeMeta {
    weak: Weak<()>,
}

/// A node, named by a thin pointer to its first slot (so the pointer fits
/// in a slot word); the header word precedes it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct NodePtr(*const AtomicUsize);

impl NodePtr {
    fn alloc(fanout: usize, meta: usize, init: impl Fn(usize) -> usize) -> NodePtr {
        let words: Box<[AtomicUsize]> = (0..=fanout)
            .map(|i| AtomicUsize::new(if i == 0 { meta } else { init(i - 1) }))
            .collect();
        let base = Box::into_raw(words).cast::<AtomicUsize>();
        // SAFETY: the allocation has `1 + fanout` words; one past the
        // header is in bounds.
        NodePtr(unsafe { base.add(1) })
    }

    fn from_word(word: usize) -> NodePtr {
        debug_assert_ne!(word & NODE, 0);
        NodePtr((word & !(LOCK | NODE | PRESENT)) as *const AtomicUsize)
    }

    fn word(self) -> usize {
        self.0 as usize | NODE
    }

    fn slot<'a>(self, index: usize) -> &'a AtomicUsize {
        // SAFETY: the caller reached this node from the root while holding
        // `&RadixMap` and, with collapse on, an epoch guard or a Refcache
        // reference to the node, so it is not freed meanwhile; `index` is
        // below the fanout (masked key bits).
        unsafe { &*self.0.add(index) }
    }

    fn meta<'a>(self) -> Option<&'a NodeMeta> {
        // SAFETY: the header word precedes the first slot in the same
        // allocation, live as for `slot`.
        let header = unsafe { &*self.0.sub(1) }.load(Ordering::Acquire);
        // SAFETY: a non-zero header is the node's `Box<NodeMeta>`, freed
        // with the node.
        (header != 0).then(|| unsafe { &*(header as *const NodeMeta) })
    }

    /// # Safety
    /// The node came from `alloc(fanout, ..)`, nothing can reach it any
    /// more, and it is freed once.
    unsafe fn free(self, fanout: usize) {
        // SAFETY: the header word precedes the first slot.
        let header = unsafe { &*self.0.sub(1) }.load(Ordering::Relaxed);
        if header != 0 {
            // SAFETY: the header holds the node's `Box<NodeMeta>`, owned
            // by the node.
            drop(unsafe { Box::from_raw(header as *mut NodeMeta) });
        }
        // SAFETY: `self.0 - 1` is the start of the allocation.
        let base = unsafe { self.0.sub(1) }.cast_mut();
        let slice = core::ptr::slice_from_raw_parts_mut(base, fanout + 1);
        // SAFETY: by the contract, `slice` is the boxed slice `alloc` leaked.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// An unlinked node waiting for lookups that may still be inside it.
struct Garbage(NodePtr);

// SAFETY: an unlinked node is owned by the retire list alone.
unsafe impl Send for Garbage {}

/// The radix address map.
///
/// Layout: `root`, `config` and `collapse` are read by every lookup; the
/// node counters change when writers expand or collapse nodes, so they sit
/// on a line of their own (`CachePadded`) and a write does not invalidate
/// the line a lookup starts from.
pub struct RadixMap {
    root: NodePtr,
    config: Config,
    counts: CachePadded<NodeCounts>,
    /// Present when `config.collapse` is on.
    collapse: Option<Box<Collapse>>,
}

/// What collapsing needs: per-node used-slot counts, and deferred frees
/// for unlinked nodes that lookups may still be reading.
struct Collapse {
    refs: Refcache,
    /// Pinned by every lookup: kept off the line of the writers' lock.
    epochs: CachePadded<Epochs>,
    retired: CachePadded<Mutex<RetireList<Garbage>>>,
}

/// Nodes allocated and nodes collapsed, counted by writers.
struct NodeCounts {
    nodes: AtomicUsize,
    collapsed: AtomicUsize,
}

// SAFETY: the map's shared state is atomics (slot words), nodes owned by
// the map, and thread-safe parts (Refcache, epochs, a mutex); raw node
// pointers are only followed under the rules of `NodePtr::slot`.
unsafe impl Send for RadixMap {}
// SAFETY: as above; every access through `&RadixMap` is atomic or locked.
unsafe impl Sync for RadixMap {}

impl fmt::Debug for RadixMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RadixMap")
            .field("config", &self.config)
            .field("nodes", &self.node_count())
            .field("collapsed", &self.collapsed_count())
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
            root: NodePtr::alloc(config.fanout(), 0, |_| EMPTY),
            config,
            counts: CachePadded::new(NodeCounts {
                nodes: AtomicUsize::new(1),
                collapsed: AtomicUsize::new(0),
            }),
            collapse: config.collapse.then(|| {
                Box::new(Collapse {
                    refs: Refcache::new(refcache::Config {
                        cache_slots: NODE_COUNT_CACHE_SLOTS,
                        ops_per_tick: NODE_COUNT_OPS_PER_TICK,
                        ..refcache::Config::default()
                    }),
                    epochs: CachePadded::new(Epochs::new(EpochKind::Tsc)),
                    retired: CachePadded::new(Mutex::new(RetireList::new())),
                })
            }),
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

    /// Nodes linked or awaiting free (root included).
    pub fn node_count(&self) -> usize {
        self.counts.nodes.load(Ordering::Relaxed)
    }

    /// Nodes collapsed (unlinked after staying empty) so far.
    pub fn collapsed_count(&self) -> usize {
        self.counts.collapsed.load(Ordering::Relaxed)
    }

    /// Bytes of node memory.
    pub fn node_bytes(&self) -> usize {
        self.node_count() * (self.config.fanout() + 1) * core::mem::size_of::<usize>()
    }

    /// The Refcache domain counting used slots, when collapse is on.
    pub fn refcache(&self) -> Option<&Refcache> {
        self.collapse.as_ref().map(|c| &c.refs)
    }

    /// A per-thread handle for writing (it owns the thread's Refcache
    /// cache). A handle held by an idle thread delays collapse until the
    /// thread calls [`Handle::flush`] or drops it.
    pub fn handle(&self) -> Handle<'_> {
        Handle {
            map: self,
            local: self.collapse.as_ref().map(|c| {
                c.refs
                    .register()
                    .expect("more threads than refcache::DEFAULT_MAX_THREADS")
            }),
        }
    }

    fn index(&self, key: u64, level: u32) -> usize {
        let shift = self.config.bits_per_level * (self.config.levels - 1 - level);
        ((key >> shift) as usize) & (self.config.fanout() - 1)
    }

    /// The value at `key`. Lock-free: one load per level, no shared writes
    /// (with collapse on, an epoch pin: a store to this thread's own slot
    /// and a fence; [`reader`](RadixMap::reader) shares one pin among many
    /// lookups).
    pub fn lookup(&self, key: u64) -> Option<u64> {
        self.reader().lookup(key)
    }

    /// A read-side section: with collapse on, nodes it can reach are not
    /// freed until it drops.
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            map: self,
            _guard: self.collapse.as_ref().map(|c| c.epochs.pin()),
        }
    }

    fn lookup_pinned(&self, key: u64) -> Option<u64> {
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

    /// Sets every key in `keys` to `value` (through a temporary handle).
    pub fn set(&self, keys: Range<u64>, value: u64) {
        self.handle().set(keys, value);
    }

    /// Removes every key in `keys` (through a temporary handle).
    pub fn unset(&self, keys: Range<u64>) {
        self.handle().unset(keys);
    }

    /// Calls `f` for each maximal run of equal values within `keys`
    /// (without locking: runs changed meanwhile may be seen old or new).
    pub fn for_each_run(&self, keys: Range<u64>, mut f: impl FnMut(Run)) {
        assert!(keys.end <= self.key_limit());
        let _guard = self.collapse.as_ref().map(|c| c.epochs.pin());
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

    /// Unlinked `node`: frees it once no lookup can be inside it.
    fn retire(&self, node: NodePtr) {
        let Some(collapse) = &self.collapse else {
            unreachable!("only collapse unlinks nodes");
        };
        self.counts.collapsed.fetch_add(1, Ordering::Relaxed);
        let garbage = {
            let mut retired = collapse.retired.lock();
            retired.push(&*collapse.epochs, Garbage(node));
            retired.collect(&*collapse.epochs)
        };
        for Garbage(node) in garbage {
            // SAFETY: unlinked before it was retired, and every lookup that
            // started before that has finished; retired once.
            unsafe { node.free(self.config.fanout()) };
            self.counts.nodes.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Frees `node`'s subtree at teardown, giving back the Refcache counts
    /// of live nodes so Refcache frees their count objects.
    fn free_subtree(&self, local: Option<&Local<'_>>, node: NodePtr) {
        let fanout = self.config.fanout();
        let mut used_slots = 0;
        for index in 0..fanout {
            let word = node.slot(index).load(Ordering::Relaxed);
            if used(word) {
                used_slots += 1;
            }
            if word & NODE != 0 {
                self.free_subtree(local, NodePtr::from_word(word));
            }
        }
        if let (Some(local), Some(meta)) = (local, node.meta()) {
            if let Some(count) = meta.weak.try_get(local) {
                // SAFETY: the count is the used slots (no range lock is
                // left at teardown), each added once by `add`/`inc`.
                unsafe { local.sub(&count, used_slots) };
                local.release(count);
            }
        }
        // SAFETY: teardown (`&mut RadixMap`): nothing else can reach it.
        unsafe { node.free(fanout) };
    }
}

impl Drop for RadixMap {
    fn drop(&mut self) {
        let collapse = self.collapse.take();
        {
            let local = collapse.as_ref().and_then(|c| c.refs.register());
            self.free_subtree(local.as_ref(), self.root);
        }
        if let Some(mut collapse) = collapse {
            let retired = core::mem::take(collapse.retired.get_mut());
            for Garbage(node) in retired.into_items() {
                // SAFETY: unlinked, retired once, and no lookup is left.
                unsafe { node.free(self.config.fanout()) };
            }
        }
    }
}

/// A read-side section from [`RadixMap::reader`].
pub struct Reader<'m> {
    map: &'m RadixMap,
    _guard: Option<epoch::Guard<'m>>,
}

impl fmt::Debug for Reader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader<'_> {
    /// The value at `key` (see [`RadixMap::lookup`]).
    pub fn lookup(&self, key: u64) -> Option<u64> {
        self.map.lookup_pinned(key)
    }
}

/// A thread's writing handle: range locks and updates go through it, so
/// that node counts go to this thread's Refcache cache.
pub struct Handle<'m> {
    map: &'m RadixMap,
    local: Option<Local<'m>>,
}

impl fmt::Debug for Handle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle").field("map", self.map).finish()
    }
}

/// Where `lock_in` works: a node, the guard's reference to it, its level
/// (0 is the root) and its first key.
struct Place {
    node: NodePtr,
    count: Option<usize>,
    level: u32,
    base: u64,
}

/// A slot held by a range lock: its node, its index, and the guard's
/// Refcache reference to that node (`None` for the root or without
/// collapse).
struct Locked {
    node: NodePtr,
    index: usize,
    count: Option<usize>,
}

impl<'m> Handle<'m> {
    /// The map.
    pub fn map(&self) -> &'m RadixMap {
        self.map
    }

    /// [`RadixMap::lookup`].
    pub fn lookup(&self, key: u64) -> Option<u64> {
        self.map.lookup(key)
    }

    /// Flushes this thread's Refcache cache (lets epochs advance).
    pub fn flush(&self) {
        if let Some(local) = &self.local {
            local.flush();
        }
    }

    /// Sets every key in `keys` to `value`.
    pub fn set(&self, keys: Range<u64>, value: u64) {
        self.lock(keys).set(value);
    }

    /// Removes every key in `keys`.
    pub fn unset(&self, keys: Range<u64>) {
        self.lock(keys).unset();
    }

    /// Locks `keys`, left to right, expanding folded slots the range only
    /// partly covers. Blocks while an overlapping range is locked.
    pub fn lock(&self, keys: Range<u64>) -> RangeGuard<'_, 'm> {
        let map = self.map;
        assert!(keys.start <= keys.end && keys.end <= map.key_limit());
        let mut guard = RangeGuard {
            handle: self,
            keys: keys.clone(),
            slots: Vec::new(),
            counts: Vec::new(),
        };
        if !keys.is_empty() {
            let root = Place {
                node: map.root,
                count: None,
                level: 0,
                base: 0,
            };
            self.lock_in(root, keys, false, &mut guard);
        }
        guard
    }

    /// Enters child `child` of a slot: a Refcache reference to it, or
    /// `None` if Refcache has freed its count (it stayed empty for two
    /// epochs and no `try_get` revived it): then it must be unlinked.
    fn enter(&self, child: NodePtr) -> Result<Option<Counted<()>>, ()> {
        match (&self.local, child.meta()) {
            (Some(local), Some(meta)) => meta.weak.try_get(local).map(Some).ok_or(()),
            _ => Ok(None),
        }
    }

    /// Locks the slots of `node` (at `level`, first key `base`) that cover
    /// `keys`, appending them to the guard. With `held`, the node is fresh
    /// from an expansion by this thread and those slots are locked already.
    fn lock_in(&self, at: Place, keys: Range<u64>, held: bool, guard: &mut RangeGuard<'_, 'm>) {
        let Place {
            node,
            count,
            level,
            base,
        } = at;
        let map = self.map;
        let span = map.config.span(level);
        let leaf = level + 1 == map.config.levels;
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
                    let child = NodePtr::from_word(word);
                    let child_count = match self.enter(child) {
                        Ok(Some(c)) => {
                            guard.counts.push(c);
                            Some(guard.counts.len() - 1)
                        }
                        Ok(None) => None,
                        Err(()) => {
                            // A dead node (all slots empty): unlink it. Node
                            // slots are never locked, so a CAS suffices; the
                            // loser of a race finds the slot changed.
                            if slot
                                .compare_exchange(word, EMPTY, Ordering::AcqRel, Ordering::Acquire)
                                .is_ok()
                            {
                                self.slot_used_changed(guard, count, false);
                                map.retire(child);
                            }
                            continue;
                        }
                    };
                    let at = Place {
                        node: child,
                        count: child_count,
                        level: level + 1,
                        base: slot_base,
                    };
                    self.lock_in(at, part, false, guard);
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
                    guard.slots.push(Locked { node, index, count });
                } else {
                    let folded = word & !LOCK;
                    let (child, child_count) =
                        self.expand(slot, folded, level + 1, slot_base, &part, guard);
                    if !used(folded) {
                        // EMPTY became NODE.
                        self.slot_used_changed(guard, count, true);
                    }
                    let at = Place {
                        node: child,
                        count: child_count,
                        level: level + 1,
                        base: slot_base,
                    };
                    self.lock_in(at, part, true, guard);
                }
                break;
            }
        }
    }

    /// Replaces the locked folded slot `slot` (value word `folded`) by a
    /// child node whose entries all hold `folded`, born locked where
    /// `part` covers them; publishing the child releases `slot`. With
    /// collapse, the child's count starts at its used slots plus the
    /// guard's reference.
    fn expand(
        &self,
        slot: &AtomicUsize,
        folded: usize,
        level: u32,
        base: u64,
        part: &Range<u64>,
        guard: &mut RangeGuard<'_, 'm>,
    ) -> (NodePtr, Option<usize>) {
        let map = self.map;
        let fanout = map.config.fanout();
        let span = map.config.span(level);
        let first = ((part.start - base) / span) as usize;
        let last = ((part.end - 1 - base) / span) as usize;
        let (meta, count) = match &self.local {
            Some(local) => {
                let (count, weak) = local.alloc_with_weak((), None);
                if used(folded) {
                    local.add(&count, fanout as u32);
                }
                guard.counts.push(count);
                let meta = Box::into_raw(Box::new(NodeMeta { weak })) as usize;
                (meta, Some(guard.counts.len() - 1))
            }
            None => (0, None),
        };
        let child = NodePtr::alloc(fanout, meta, |i| {
            if (first..=last).contains(&i) {
                folded | LOCK
            } else {
                folded
            }
        });
        map.counts.nodes.fetch_add(1, Ordering::Relaxed);
        // Release: the entries are initialised before a lookup can follow
        // the pointer.
        slot.store(child.word(), Ordering::Release);
        (child, count)
    }

    /// A slot of the node counted by `guard.counts[count]` became used
    /// (`true`) or empty.
    fn slot_used_changed(&self, guard: &RangeGuard<'_, 'm>, count: Option<usize>, now_used: bool) {
        if let (Some(local), Some(count)) = (&self.local, count) {
            let object = &guard.counts[count];
            if now_used {
                local.inc(object);
            } else {
                // SAFETY: the slot was used, so the node's count holds one
                // reference for it, added by `inc` or `add`.
                unsafe { local.dec(object) };
            }
        }
    }
}

/// A locked range. Dropping it unlocks exactly the slots it locked, then
/// gives back its references to the nodes it worked in.
pub struct RangeGuard<'h, 'm> {
    handle: &'h Handle<'m>,
    keys: Range<u64>,
    /// The locked slots, in key order; they tile `keys` exactly.
    slots: Vec<Locked>,
    /// References to the nodes the guard entered or created.
    counts: Vec<Counted<()>>,
}

impl fmt::Debug for RangeGuard<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RangeGuard")
            .field("keys", &self.keys)
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl RangeGuard<'_, '_> {
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
        for locked in &self.slots {
            let slot = locked.node.slot(locked.index);
            let old = slot.load(Ordering::Relaxed);
            // Release: a lookup that sees the new value sees what the
            // caller wrote before setting it.
            slot.store(word | LOCK, Ordering::Release);
            if used(old) != used(word) {
                self.handle
                    .slot_used_changed(self, locked.count, used(word));
            }
        }
    }

    /// The value at `key` inside the locked range.
    pub fn get(&self, key: u64) -> Option<u64> {
        assert!(self.keys.contains(&key));
        self.handle.map.lookup(key)
    }
}

impl Drop for RangeGuard<'_, '_> {
    fn drop(&mut self) {
        for locked in &self.slots {
            // Release: the next locker sees this guard's stores.
            locked
                .node
                .slot(locked.index)
                .fetch_and(!LOCK, Ordering::Release);
        }
        if let Some(local) = &self.handle.local {
            for count in self.counts.drain(..) {
                local.release(count);
            }
        }
    }
}
