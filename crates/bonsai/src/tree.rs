//! The tree: nodes, the writer's non-destructive balancing (Bonsai
//! Figures 5-7 with the §3.3 in-place commits), delete by successor with
//! path copying, and the lock-free readers (Figure 9). The algorithm is
//! described in the crate essay (`lib.rs`).
//!
//! The writer lock is `xsync`'s because on the per-core backend the tree
//! is shared between processes, where parking_lot's wake-ups are lost.

use std::borrow::Borrow;
use std::cmp::Ordering as Cmp;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use epoch::{EpochKind, EpochScheme, Epochs, Guard, RetireList};
use xsync::Mutex;

/// Balance weight: a subtree is rebalanced when one side has more than
/// `WEIGHT` times the nodes of the other (Bonsai §3.3 uses 4).
pub const WEIGHT: usize = 4;

/// Retired nodes a writer accumulates before it tries to free some.
pub const COLLECT_EVERY_RETIRED_NODES: usize = 128;

#[repr(C)]
struct Node<K, V> {
    key: K,
    value: V,
    left: AtomicPtr<Node<K, V>>,
    right: AtomicPtr<Node<K, V>>,
    /// Nodes in this subtree. Read and written by the writer only, and
    /// kept off the line readers use: every insert and delete rewrites the
    /// sizes on its whole path, which would otherwise invalidate, in every
    /// reader's cache, the lines of the nodes nearest the root.
    size: WriterLine,
}

/// The writer-only part of a node, on a cache line of its own.
#[repr(C, align(64))]
struct WriterLine(AtomicUsize);

impl std::ops::Deref for WriterLine {
    type Target = AtomicUsize;
    fn deref(&self) -> &AtomicUsize {
        &self.0
    }
}

type Link<K, V> = *mut Node<K, V>;

/// A retired node waiting for readers to leave.
struct Garbage<K, V>(Link<K, V>);

// SAFETY: a retired node is owned by the retire list alone (unlinked, and
// freed only after every reader that could see it has finished); moving
// that ownership between threads moves a `K` and a `V`.
unsafe impl<K: Send, V: Send> Send for Garbage<K, V> {}

/// Counters of the writer's work: what §3.3's "about 2 allocations and 1
/// free per insert" is measured by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Inserts of absent keys.
    pub inserts: u64,
    /// Inserts that replaced a present key's value.
    pub replaces: u64,
    /// Removes of present keys.
    pub removes: u64,
    /// Nodes allocated.
    pub allocated: u64,
    /// Nodes retired (freed after a grace period): the garbage.
    pub retired: u64,
    /// Nodes actually freed so far.
    pub freed: u64,
    /// Single rotations.
    pub single_rotations: u64,
    /// Double rotations.
    pub double_rotations: u64,
}

struct Writer<K, V> {
    retired: RetireList<Garbage<K, V>>,
    stats: Stats,
}

/// An RCU bounded-balance ordered map: lock-free readers, one writer at a
/// time.
///
/// Layout: `root` and `epochs` are what every lookup reads; the writer
/// lock, the retire list, the counters and `len` change on every write.
/// Each group sits on cache lines of its own (`CachePadded`), so a write
/// does not invalidate the line a reader needs to start its descent.
pub struct BonsaiTree<K, V, S: EpochScheme = Epochs> {
    root: CachePadded<AtomicPtr<Node<K, V>>>,
    epochs: S,
    writer: CachePadded<Mutex<Writer<K, V>>>,
    len: CachePadded<AtomicUsize>,
}

// SAFETY: readers on any thread get `&K`/`&V` (hence `Sync` bounds), and
// nodes move between threads when freed (hence `Send`). All shared
// mutation is through atomics or under the writer lock.
unsafe impl<K: Send + Sync, V: Send + Sync, S: EpochScheme> Sync for BonsaiTree<K, V, S> {}
// SAFETY: the raw node pointers are owned by the tree alone (no other
// handle to them outlives a borrow of the tree), so sending the tree sends
// its keys, values and scheme: hence the `Send` bounds on all three.
unsafe impl<K: Send, V: Send, S: EpochScheme + Send> Send for BonsaiTree<K, V, S> {}

impl<K, V> Default for BonsaiTree<K, V> {
    fn default() -> Self {
        BonsaiTree::new()
    }
}

impl<K, V> BonsaiTree<K, V> {
    /// An empty tree with TSC epochs.
    pub fn new() -> Self {
        BonsaiTree::with_epochs(Epochs::new(EpochKind::Tsc))
    }
}

/// `nodeSize` of the paper.
fn size<K, V>(link: Link<K, V>) -> usize {
    if link.is_null() {
        0
    } else {
        // SAFETY: non-null links the writer holds point at live nodes
        // (reachable from the root, or fresh): retired nodes are freed only
        // after readers and the writer have moved on.
        unsafe { (*link).size.load(Ordering::Relaxed) }
    }
}

/// Dereferences a link the caller knows to be live.
///
/// # Safety
/// `link` is non-null and points at a node that is reachable from the
/// root, fresh, or retired after the caller's epoch guard was taken.
unsafe fn node<'a, K, V>(link: Link<K, V>) -> &'a Node<K, V> {
    // SAFETY: the caller guarantees `link` is non-null and live (see
    // `# Safety`); a live node is never mutated except through atomics.
    unsafe { &*link }
}

impl<K, V, S: EpochScheme> BonsaiTree<K, V, S> {
    /// An empty tree using `epochs` to defer frees.
    pub fn with_epochs(epochs: S) -> Self {
        BonsaiTree {
            root: CachePadded::new(AtomicPtr::new(ptr::null_mut())),
            epochs,
            writer: CachePadded::new(Mutex::new(Writer {
                retired: RetireList::new(),
                stats: Stats::default(),
            })),
            len: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Keys present.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether no key is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The writer's counters.
    pub fn stats(&self) -> Stats {
        self.writer.lock().stats
    }

    /// The epoch scheme.
    pub fn epochs(&self) -> &S {
        &self.epochs
    }

    /// A read-side critical section: lookups and iteration through it see
    /// nodes that stay valid until it drops.
    pub fn reader(&self) -> Reader<'_, K, V, S> {
        Reader {
            tree: self,
            _guard: self.epochs.pin(),
        }
    }
}

impl<K: Ord + Clone, V: Clone, S: EpochScheme> BonsaiTree<K, V, S> {
    /// The value for `key`, cloned. Lock-free (Figure 9).
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.reader().get(key).cloned()
    }

    /// Whether `key` is present.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.reader().get(key).is_some()
    }

    /// Inserts or replaces; returns the old value.
    pub fn insert(&self, key: K, value: V) -> Option<V> {
        let mut writer = self.writer.lock();
        let root = self.root.load(Ordering::Relaxed);
        let mut old = None;
        let new_root = self.do_insert(&mut writer, root, key, value, &mut old);
        if new_root != root {
            // Release: the new nodes are initialised before readers see them.
            self.root.store(new_root, Ordering::Release);
        }
        if old.is_some() {
            writer.stats.replaces += 1;
        } else {
            writer.stats.inserts += 1;
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        self.maybe_collect(&mut writer);
        old
    }

    /// Removes `key`; returns its value.
    pub fn remove<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let mut writer = self.writer.lock();
        let root = self.root.load(Ordering::Relaxed);
        let mut old = None;
        let new_root = self.do_remove(&mut writer, root, key, &mut old);
        if new_root != root {
            self.root.store(new_root, Ordering::Release);
        }
        if old.is_some() {
            writer.stats.removes += 1;
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        self.maybe_collect(&mut writer);
        old
    }

    /// Frees every retired node no reader can still see; returns how many.
    pub fn collect(&self) -> usize {
        let mut writer = self.writer.lock();
        self.collect_locked(&mut writer)
    }

    fn maybe_collect(&self, writer: &mut Writer<K, V>) {
        if writer.retired.len() >= COLLECT_EVERY_RETIRED_NODES {
            self.collect_locked(writer);
        }
    }

    fn collect_locked(&self, writer: &mut Writer<K, V>) -> usize {
        let garbage = writer.retired.collect(&self.epochs);
        let count = garbage.len();
        for Garbage(link) in garbage {
            // SAFETY: retired after being unlinked (no reader starting later
            // can reach it) and collected only once every reader pinned
            // before that has finished; each node is retired once.
            drop(unsafe { Box::from_raw(link) });
        }
        writer.stats.freed += count as u64;
        count
    }

    /// `mkNode`.
    fn mk_node(
        &self,
        w: &mut Writer<K, V>,
        left: Link<K, V>,
        right: Link<K, V>,
        key: K,
        value: V,
    ) -> Link<K, V> {
        w.stats.allocated += 1;
        Box::into_raw(Box::new(Node {
            key,
            value,
            left: AtomicPtr::new(left),
            right: AtomicPtr::new(right),
            size: WriterLine(AtomicUsize::new(1 + size(left) + size(right))),
        }))
    }

    /// `rcu_free`: `link` has been (or is about to be, by the caller's
    /// next store) unlinked.
    fn retire(&self, w: &mut Writer<K, V>, link: Link<K, V>) {
        w.stats.retired += 1;
        w.retired.push(&self.epochs, Garbage(link));
    }

    /// A copy of `cur`'s key and value over `left` and `right`.
    fn copy_of(
        &self,
        w: &mut Writer<K, V>,
        cur: Link<K, V>,
        left: Link<K, V>,
        right: Link<K, V>,
    ) -> Link<K, V> {
        // SAFETY: `cur` is live: the writer reached it from the root.
        let n = unsafe { node(cur) };
        self.mk_node(w, left, right, n.key.clone(), n.value.clone())
    }

    /// `mkBalanced` (Figure 6). With `in_place`, a subtree that needs no
    /// rotation keeps `cur` and stores the new children into it (a no-op
    /// store is skipped): that store commits whatever changed below. Without
    /// it (delete's path copy), `cur` is replaced by a new node.
    fn mk_balanced(
        &self,
        w: &mut Writer<K, V>,
        cur: Link<K, V>,
        left: Link<K, V>,
        right: Link<K, V>,
        in_place: bool,
    ) -> Link<K, V> {
        let (ln, rn) = (size(left), size(right));
        // Adams's test: the paper's figure guards with `ln && rn`, which
        // would let a node with one empty side grow a chain; Adams
        // rebalances whenever the two sides hold two or more nodes.
        let out = if ln + rn >= 2 && rn > WEIGHT * ln {
            self.mk_balanced_l(w, cur, left, right)
        } else if ln + rn >= 2 && ln > WEIGHT * rn {
            self.mk_balanced_r(w, cur, left, right)
        } else if !in_place {
            self.copy_of(w, cur, left, right)
        } else {
            // SAFETY: `cur` is live (see `copy_of`).
            let n = unsafe { node(cur) };
            if n.left.load(Ordering::Relaxed) != left {
                // Release: the subtree below is complete before readers
                // can follow the pointer.
                n.left.store(left, Ordering::Release);
            }
            if n.right.load(Ordering::Relaxed) != right {
                n.right.store(right, Ordering::Release);
            }
            n.size.store(1 + ln + rn, Ordering::Relaxed);
            return cur;
        };
        self.retire(w, cur);
        out
    }

    /// `mkBalancedL` (Figure 7): rotate left, single or double.
    fn mk_balanced_l(
        &self,
        w: &mut Writer<K, V>,
        cur: Link<K, V>,
        left: Link<K, V>,
        right: Link<K, V>,
    ) -> Link<K, V> {
        // SAFETY: `right` is live and non-null (it outweighs `left`).
        let r = unsafe { node(right) };
        let (rl, rr) = (
            r.left.load(Ordering::Relaxed),
            r.right.load(Ordering::Relaxed),
        );
        if size(rl) < size(rr) {
            // singleL: new a' = (left, a, rl), new b' = (a', b, rr).
            w.stats.single_rotations += 1;
            let a = self.copy_of(w, cur, left, rl);
            let out = self.copy_of(w, right, a, rr);
            self.retire(w, right);
            out
        } else {
            // doubleL: the middle grandchild c = rl becomes the root.
            w.stats.double_rotations += 1;
            // SAFETY: `rl` is non-null: it outweighs `rr`.
            let c = unsafe { node(rl) };
            let (cl, cr) = (
                c.left.load(Ordering::Relaxed),
                c.right.load(Ordering::Relaxed),
            );
            let a = self.copy_of(w, cur, left, cl);
            let b = self.copy_of(w, right, cr, rr);
            let out = self.copy_of(w, rl, a, b);
            self.retire(w, rl);
            self.retire(w, right);
            out
        }
    }

    /// `mkBalancedR`: the mirror image.
    fn mk_balanced_r(
        &self,
        w: &mut Writer<K, V>,
        cur: Link<K, V>,
        left: Link<K, V>,
        right: Link<K, V>,
    ) -> Link<K, V> {
        // SAFETY: `left` is live and non-null (it outweighs `right`).
        let l = unsafe { node(left) };
        let (ll, lr) = (
            l.left.load(Ordering::Relaxed),
            l.right.load(Ordering::Relaxed),
        );
        if size(lr) < size(ll) {
            w.stats.single_rotations += 1;
            let a = self.copy_of(w, cur, lr, right);
            let out = self.copy_of(w, left, ll, a);
            self.retire(w, left);
            out
        } else {
            w.stats.double_rotations += 1;
            // SAFETY: `lr` is non-null: it outweighs `ll`.
            let c = unsafe { node(lr) };
            let (cl, cr) = (
                c.left.load(Ordering::Relaxed),
                c.right.load(Ordering::Relaxed),
            );
            let b = self.copy_of(w, left, ll, cl);
            let a = self.copy_of(w, cur, cr, right);
            let out = self.copy_of(w, lr, b, a);
            self.retire(w, lr);
            self.retire(w, left);
            out
        }
    }

    /// `doInsert` (Figure 5), committing in place where it can.
    fn do_insert(
        &self,
        w: &mut Writer<K, V>,
        cur: Link<K, V>,
        key: K,
        value: V,
        old: &mut Option<V>,
    ) -> Link<K, V> {
        if cur.is_null() {
            return self.mk_node(w, ptr::null_mut(), ptr::null_mut(), key, value);
        }
        // SAFETY: reached from the root by the writer: live.
        let n = unsafe { node(cur) };
        let (l, r) = (
            n.left.load(Ordering::Relaxed),
            n.right.load(Ordering::Relaxed),
        );
        match key.cmp(&n.key) {
            Cmp::Less => {
                let nl = self.do_insert(w, l, key, value, old);
                self.mk_balanced(w, cur, nl, r, true)
            }
            Cmp::Greater => {
                let nr = self.do_insert(w, r, key, value, old);
                self.mk_balanced(w, cur, l, nr, true)
            }
            Cmp::Equal => {
                // Readers may be reading the value: replace the node.
                *old = Some(n.value.clone());
                let out = self.mk_node(w, l, r, key, value);
                self.retire(w, cur);
                out
            }
        }
    }

    /// Delete: in place above the deleted node, path copying below it.
    fn do_remove<Q>(
        &self,
        w: &mut Writer<K, V>,
        cur: Link<K, V>,
        key: &Q,
        old: &mut Option<V>,
    ) -> Link<K, V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        if cur.is_null() {
            return cur;
        }
        // SAFETY: reached from the root by the writer: live.
        let n = unsafe { node(cur) };
        let (l, r) = (
            n.left.load(Ordering::Relaxed),
            n.right.load(Ordering::Relaxed),
        );
        match key.cmp(n.key.borrow()) {
            Cmp::Less => {
                let nl = self.do_remove(w, l, key, old);
                if old.is_none() {
                    return cur; // absent: nothing changed
                }
                self.mk_balanced(w, cur, nl, r, true)
            }
            Cmp::Greater => {
                let nr = self.do_remove(w, r, key, old);
                if old.is_none() {
                    return cur;
                }
                self.mk_balanced(w, cur, l, nr, true)
            }
            Cmp::Equal => {
                *old = Some(n.value.clone());
                let out = if l.is_null() {
                    r
                } else if r.is_null() {
                    l
                } else {
                    // Remove the successor from a copy of the path down to
                    // it, and put it in this node's place: one store by the
                    // caller publishes both changes.
                    let (nr, successor) = self.remove_min_copying(w, r);
                    let replacement = self.copy_of(w, successor, l, nr);
                    self.retire(w, successor);
                    let (rl, rr) = (l, nr);
                    self.mk_balanced(w, replacement, rl, rr, true)
                };
                self.retire(w, cur);
                out
            }
        }
    }

    /// Removes the leftmost node of `cur`'s subtree without touching any
    /// existing node: returns the new subtree and the (unretired) leftmost
    /// node.
    fn remove_min_copying(
        &self,
        w: &mut Writer<K, V>,
        cur: Link<K, V>,
    ) -> (Link<K, V>, Link<K, V>) {
        // SAFETY: reached from the root by the writer: live.
        let n = unsafe { node(cur) };
        let (l, r) = (
            n.left.load(Ordering::Relaxed),
            n.right.load(Ordering::Relaxed),
        );
        if l.is_null() {
            return (r, cur);
        }
        let (nl, min) = self.remove_min_copying(w, l);
        (self.mk_balanced(w, cur, nl, r, false), min)
    }

    /// Height of the tree (writer-side walk; for tests and diagnostics).
    pub fn height(&self) -> usize {
        let _writer = self.writer.lock();
        fn h<K, V>(link: Link<K, V>) -> usize {
            if link.is_null() {
                return 0;
            }
            // SAFETY: under the writer lock, links from the root are live.
            let n = unsafe { node(link) };
            1 + h(n.left.load(Ordering::Relaxed)).max(h(n.right.load(Ordering::Relaxed)))
        }
        h(self.root.load(Ordering::Relaxed))
    }

    /// Checks the structural invariants (order, sizes, balance within
    /// the bound Adams's algorithm keeps); panics on a violation.
    pub fn check_invariants(&self) {
        let _writer = self.writer.lock();
        fn walk<K: Ord, V>(link: Link<K, V>, lo: Option<&K>, hi: Option<&K>) -> usize {
            if link.is_null() {
                return 0;
            }
            // SAFETY: under the writer lock, links from the root are live.
            let n = unsafe { node(link) };
            assert!(
                lo.is_none_or(|lo| *lo < n.key) && hi.is_none_or(|hi| n.key < *hi),
                "order"
            );
            let l = walk(n.left.load(Ordering::Relaxed), lo, Some(&n.key));
            let r = walk(n.right.load(Ordering::Relaxed), Some(&n.key), hi);
            assert_eq!(n.size.load(Ordering::Relaxed), 1 + l + r, "size");
            1 + l + r
        }
        let n = walk(self.root.load(Ordering::Relaxed), None, None);
        assert_eq!(n, self.len());
    }
}

impl<K, V, S: EpochScheme> Drop for BonsaiTree<K, V, S> {
    fn drop(&mut self) {
        fn free<K, V>(link: Link<K, V>) {
            if link.is_null() {
                return;
            }
            // SAFETY: `&mut self`: no reader or writer is left; each live
            // node has one parent, so this frees each once.
            let n = unsafe { Box::from_raw(link) };
            free(n.left.load(Ordering::Relaxed));
            free(n.right.load(Ordering::Relaxed));
        }
        free(*self.root.get_mut());
        let writer = self.writer.get_mut();
        let retired = std::mem::take(&mut writer.retired);
        for Garbage(link) in retired.into_items() {
            // SAFETY: unlinked, retired once, and no reader is left.
            drop(unsafe { Box::from_raw(link) });
        }
    }
}

impl<K, V, S: EpochScheme> fmt::Debug for BonsaiTree<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BonsaiTree")
            .field("len", &self.len())
            .field("epochs", &self.epochs.name())
            .finish()
    }
}

/// A read-side critical section (`rcu_read_begin` .. `rcu_read_end`):
/// references it hands out live as long as it does.
pub struct Reader<'t, K, V, S: EpochScheme = Epochs> {
    tree: &'t BonsaiTree<K, V, S>,
    _guard: Guard<'t>,
}

impl<K, V, S: EpochScheme> fmt::Debug for Reader<'_, K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl<'t, K: Ord, V, S: EpochScheme> Reader<'t, K, V, S> {
    fn load<'r>(&'r self, link: &AtomicPtr<Node<K, V>>) -> Option<&'r Node<K, V>> {
        // Acquire: pairs with the writer's Release publication.
        let p = link.load(Ordering::Acquire);
        // SAFETY: `p` was reachable while this reader's guard is held: it
        // is retired, if ever, after the guard's start, so it is not freed
        // before the guard (and every reference bound to `'r`) drops.
        (!p.is_null()).then(|| unsafe { node(p) })
    }

    fn root(&self) -> Option<&Node<K, V>> {
        self.load(&self.tree.root)
    }

    /// The value for `key` (Figure 9: an ordinary sequential lookup).
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let mut cur = self.root();
        while let Some(n) = cur {
            cur = match key.cmp(n.key.borrow()) {
                Cmp::Less => self.load(&n.left),
                Cmp::Greater => self.load(&n.right),
                Cmp::Equal => return Some(&n.value),
            };
        }
        None
    }

    /// The first entry with a key `>= key` (`inclusive`) or `> key`.
    fn bound<Q>(&self, key: &Q, inclusive: bool) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let mut best = None;
        let mut cur = self.root();
        while let Some(n) = cur {
            let go_left = match key.cmp(n.key.borrow()) {
                Cmp::Less => true,
                Cmp::Equal => {
                    if inclusive {
                        return Some((&n.key, &n.value));
                    }
                    false
                }
                Cmp::Greater => false,
            };
            if go_left {
                best = Some((&n.key, &n.value));
                cur = self.load(&n.left);
            } else {
                cur = self.load(&n.right);
            }
        }
        best
    }

    /// The first entry whose key is `>= key`.
    pub fn lower_bound<Q>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.bound(key, true)
    }

    /// The first entry whose key is `> key`.
    pub fn upper_bound<Q>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.bound(key, false)
    }

    /// Entries with keys in `range`, in order. Concurrent writes may or may
    /// not be seen; keys present throughout are seen once each, in order.
    pub fn range<Q, R>(&self, range: R) -> Range<'_, 't, K, V, S, Q, R>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
        R: RangeBounds<Q>,
    {
        let mut iter = Range {
            reader: self,
            stack: Vec::new(),
            last: None,
            range,
            _q: PhantomData,
        };
        iter.descend(self.root());
        iter
    }

    /// Every entry, in order.
    pub fn iter(&self) -> Range<'_, 't, K, V, S, K, std::ops::RangeFull> {
        self.range::<K, _>(..)
    }
}

/// In-order iterator over a key range, from [`Reader::range`].
pub struct Range<'r, 't, K, V, S: EpochScheme, Q: ?Sized, R> {
    reader: &'r Reader<'t, K, V, S>,
    stack: Vec<&'r Node<K, V>>,
    last: Option<&'r K>,
    range: R,
    _q: PhantomData<fn(&Q)>,
}

impl<'r, K, V, S, Q, R> Range<'r, '_, K, V, S, Q, R>
where
    K: Ord + Borrow<Q>,
    S: EpochScheme,
    Q: Ord + ?Sized,
    R: RangeBounds<Q>,
{
    /// Pushes the left spine of `cur`, skipping subtrees below the range.
    fn descend(&mut self, mut cur: Option<&'r Node<K, V>>) {
        while let Some(n) = cur {
            let below = match self.range.start_bound() {
                Bound::Included(s) => n.key.borrow() < s,
                Bound::Excluded(s) => n.key.borrow() <= s,
                Bound::Unbounded => false,
            };
            if below {
                cur = self.reader.load(&n.right);
            } else {
                self.stack.push(n);
                cur = self.reader.load(&n.left);
            }
        }
    }
}

impl<'r, K, V, S, Q, R> Iterator for Range<'r, '_, K, V, S, Q, R>
where
    K: Ord + Borrow<Q>,
    S: EpochScheme,
    Q: Ord + ?Sized,
    R: RangeBounds<Q>,
{
    type Item = (&'r K, &'r V);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let n = self.stack.pop()?;
            let right = self.reader.load(&n.right);
            self.descend(right);
            let above = match self.range.end_bound() {
                Bound::Included(e) => n.key.borrow() > e,
                Bound::Excluded(e) => n.key.borrow() >= e,
                Bound::Unbounded => false,
            };
            if above {
                self.stack.clear();
                return None;
            }
            // Mixed versions could show a key again: keep output strictly
            // increasing.
            if self.last.is_some_and(|last| n.key <= *last) {
                continue;
            }
            self.last = Some(&n.key);
            return Some((&n.key, &n.value));
        }
    }
}
