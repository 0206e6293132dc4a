//! Sorted sets in the log: small ones one item, large ones a member table
//! plus a counted B+tree over (score, member), every node an engine item.
//!
//! # Layout
//!
//! ```text
//!  user key K ── flags ZSET_FLAGS (types.rs) ─────────────────────────────────────
//!   small: ZSET_MAGIC | n | (score f64 | len member)*     sorted by (score, member) ("listpack")
//!   large: ROOT_MAGIC | 'z' | id | count | nbuckets | 0 | tree u32 | height u32 | next u32  ("skiplist")
//!
//!  internal keys (coll's, engine.rs keeps them from user keys):
//!   0xFF 0x00 'i' id          ─▶ 'z' | K                     instance record (coll)
//!   0xFF 0x00 'n' id b        ─▶ n | (len member len score)*  member table bucket b < TREE_BASE
//!   0xFF 0x00 'n' id t        ─▶ 'L' | n | (score len member)*            tree leaf,  t >= TREE_BASE
//!                             ─▶ 'I' | n | (child count score len member)* inner node: child
//!                                 number, entries below it, largest (score, member) below it
//! ```
//!
//! A small zset has a tree leaf's layout behind another first byte, so
//! while a command works on it, it is a leaf ([`NodeBuf`], `crate::packed`)
//! over its item's bytes with the first byte swapped: a lookup reads the
//! entries in place, an insert or removal is one memmove, and the write
//! swaps the byte back; nothing is decoded into one `Vec` per member.
//!
//! The member table is coll's linear-hashing table (same buckets, same
//! split rule, value = the score's 8 bytes): ZSCORE, and the "is it there,
//! with which score" half of ZADD/ZREM, read one bucket. The order lives
//! in a B+tree counted like an order-statistics tree: an inner node keeps,
//! per child, the number of entries below it and the largest entry below
//! it, so finding an entry, its rank, or the entry of a given rank walks
//! one root-to-leaf path: `height` item reads. Leaves hold at most
//! [`LEAF_MAX_ENTRIES`], inner nodes [`INNER_MAX_CHILDREN`]; a 1 M-member
//! zset has height 3. A full node splits in two (the parent gains a
//! child; a split root makes a new root), a node left under a quarter full
//! by a removal merges with a neighbour when the two fit in one, an empty
//! one is dropped, and a root with one child hands the root to it.
//!
//! Costs on a large zset of n members, with h = log_64 n:
//!
//! * ZADD/ZREM/ZINCRBY of one member: the root, one bucket, one path
//!   (read h nodes, write them: the counts on the path change), the root.
//! * ZSCORE/ZMSCORE: the root and one bucket per member. ZRANK: plus one
//!   path. ZCARD: the root.
//! * ZRANGE by index, score or lex, ZCOUNT, ZLEXCOUNT: one or two paths
//!   to find the bounds' ranks, then the leaves of the result.
//! * ZPOPMIN/MAX, ZREM* ranges: one ZREM per member removed.
//!
//! Tree nodes are numbered from [`TREE_BASE`] upwards by the root's `next`
//! counter, never reused, so the bucket numbers (below it) and the node
//! numbers never meet. DEL walks the tree to find them all; the sweeper
//! needs no change (it reclaims every node of a dead id, whatever its
//! number). Atomicity is coll's: one command under its key's stripe,
//! nodes written before the root, the root written last with `IfVersion`.
//!
//! # Known limits
//!
//! A ZADD that changes a score on a 1 M-member zset rewrites the bucket,
//! two leaves and the inner nodes on both paths: ~12 KiB appended to the
//! log per command (nodes are patched in place as bytes, `crate::packed`,
//! so the CPU cost is the engine's reads and writes, not decoding); see
//! docs/BENCHMARKS.md for its cost against a 10-member zset. Range removals
//! (ZREMRANGEBY*, ZPOP with a large count) remove entry by entry and keep
//! every touched node in the command's cache until the commit. A crash
//! between node writes and the root write can leave the root's count off,
//! as for coll's collections. Lex ranges over members of different
//! scores follow the (score, member) order; Redis leaves them unspecified.

use std::collections::HashMap;

use nibble::{Condition, Expiry, PutOptions};

use crate::coll::{
    bucket_of, decode_root, encode_root, instance_key, new_id, node_key, Kind, Root, ROOT_BYTES,
};
use crate::commands::{is_race, CmdError, WRONGTYPE};
use crate::engine::Engine;
use crate::packed::{cmp_key, NodeBuf, PairBuf, LEAF_TAG};
use crate::state::Shared;
use crate::types::ZSET_FLAGS;

/// First byte of a small zset.
pub const ZSET_MAGIC: u8 = 0xB9;
/// Most entries of a leaf.
pub const LEAF_MAX_ENTRIES: usize = 64;
/// Most children of an inner node.
pub const INNER_MAX_CHILDREN: usize = 64;
/// First tree node number (bucket numbers stay below it).
pub const TREE_BASE: u32 = 1 << 31;
/// Average members per member-table bucket above which one bucket splits.
pub const ZBUCKET_SPLIT_ELEMS: u64 = 32;

/// An entry: score and member, ordered by score then member bytes.
pub type Entry = (f64, Vec<u8>);

/// Ordering of entries (scores are never NaN).
pub fn cmp_entry(a: (f64, &[u8]), b: (f64, &[u8])) -> std::cmp::Ordering {
    cmp_key(a, b)
}

fn lt(a: (f64, &[u8]), b: (f64, &[u8])) -> bool {
    cmp_entry(a, b) == std::cmp::Ordering::Less
}

/// Node size limits (tiny in tests so splits and merges happen).
#[derive(Clone, Copy, Debug)]
pub struct TreeLimits {
    /// Most entries per leaf.
    pub leaf: usize,
    /// Most children per inner node.
    pub inner: usize,
}

/// The default node limits.
pub const TREE_LIMITS: TreeLimits = TreeLimits {
    leaf: LEAF_MAX_ENTRIES,
    inner: INNER_MAX_CHILDREN,
};

/// Thresholds below which a zset stays one item.
#[derive(Clone, Copy, Debug)]
pub struct ZLimits {
    /// zset-max-listpack-entries.
    pub entries: usize,
    /// zset-max-listpack-value.
    pub value: usize,
}

impl ZLimits {
    /// The current tunables.
    pub fn of(shared: &Shared) -> ZLimits {
        let t = &shared.settings.tunables;
        ZLimits {
            entries: t.get_usize("zset-max-listpack-entries"),
            value: t.get_usize("zset-max-listpack-value"),
        }
    }
}

/// The large form's root fields beyond coll's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tree {
    root: u32,
    height: u32,
    next: u32,
}

fn encode_zroot(r: &Root, t: &Tree) -> Vec<u8> {
    let mut v = encode_root(Kind::Zset, r);
    v.extend_from_slice(&t.root.to_le_bytes());
    v.extend_from_slice(&t.height.to_le_bytes());
    v.extend_from_slice(&t.next.to_le_bytes());
    v
}

fn decode_zroot(b: &[u8]) -> Option<(Root, Tree)> {
    let (k, r) = decode_root(b)?;
    if k != Kind::Zset || b.len() != ROOT_BYTES + 12 {
        return None;
    }
    let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
    Some((
        r,
        Tree {
            root: u(ROOT_BYTES),
            height: u(ROOT_BYTES + 4),
            next: u(ROOT_BYTES + 8),
        },
    ))
}

fn corrupt() -> CmdError {
    CmdError::from("ERR corrupt sorted set value")
}

/// A small zset's item bytes (`ZSET_MAGIC | n | (score len member)*`)
/// as a tree leaf (`'L' | n | (score len member)*`): the first byte
/// swapped, the entries validated once; `None` if they are not entries.
fn small_leaf(mut buf: Vec<u8>) -> Option<NodeBuf> {
    *buf.first_mut()? = LEAF_TAG;
    NodeBuf::from_bytes(buf).filter(NodeBuf::is_leaf)
}

/// Entries `lo..hi` of a leaf, owned.
fn leaf_entries(v: &NodeBuf, lo: usize, hi: usize) -> Vec<Entry> {
    (lo..hi.min(v.len()))
        .map(|i| {
            let (s, m) = v.key(i);
            (s, m.to_vec())
        })
        .collect()
}

/// A member-table bucket as cached: (member, score bytes) pairs, dirty.
type Bucket = (PairBuf, bool);

/// Capacity of a fresh node read buffer: most nodes fit, so neither the
/// read nor an insert into the node reallocates.
const NODE_READ_BYTES: usize = 4096;
/// Capacity of the buffer a zset's item is read into: a listpack-sized
/// zset of 128 short members (17 bytes each with an 8-byte score and a
/// 5-byte member) and one more fit.
const SMALL_READ_BYTES: usize = 2560;

struct Big {
    root: Root,
    tree: Tree,
    buckets: HashMap<u32, Bucket>,
    /// Tree nodes read or written by this command, and whether changed.
    nodes: HashMap<u32, (NodeBuf, bool)>,
    dropped: Vec<u32>,
    fresh: bool,
    /// A member copied out of one node on its way into its parent.
    scratch: Vec<u8>,
}

enum Repr {
    /// A listpack-sized zset: its item's entries in the bytes of a tree
    /// leaf (the same layout behind another first byte), patched in
    /// place, so a write neither decodes nor re-encodes the others.
    Small(NodeBuf),
    Big(Box<Big>),
}

/// One sorted set, opened by one command (under its key's stripe).
pub struct ZSet<'e> {
    store: &'e Engine,
    key: Vec<u8>,
    limits: ZLimits,
    tl: TreeLimits,
    version: Option<u64>,
    repr: Repr,
    dirty: bool,
}

/// The zset at `key`: `Ok(None)` if absent, WRONGTYPE for another type.
pub fn open<'e>(
    store: &'e Engine,
    key: &[u8],
    limits: ZLimits,
    tl: TreeLimits,
) -> Result<Option<ZSet<'e>>, CmdError> {
    // Room for a listpack-sized zset and an insert into it: neither the
    // read nor the insert reallocates (a root takes a few bytes of it).
    let mut buf = Vec::with_capacity(SMALL_READ_BYTES);
    let Some(m) = store.get_into(key, &mut buf)? else {
        return Ok(None);
    };
    if m.flags != ZSET_FLAGS {
        return Err(WRONGTYPE.into());
    }
    let repr = match buf.first() {
        Some(&ZSET_MAGIC) => Repr::Small(small_leaf(buf).ok_or_else(corrupt)?),
        _ => {
            let (root, tree) = decode_zroot(&buf).ok_or_else(corrupt)?;
            Repr::Big(Box::new(Big {
                root,
                tree,
                buckets: HashMap::new(),
                nodes: HashMap::new(),
                dropped: Vec::new(),
                fresh: false,
                scratch: Vec::new(),
            }))
        }
    };
    Ok(Some(ZSet {
        store,
        key: key.to_vec(),
        limits,
        tl,
        version: Some(m.version),
        repr,
        dirty: false,
    }))
}

/// [`open`], or a new empty zset.
pub fn open_or_new<'e>(
    store: &'e Engine,
    key: &[u8],
    limits: ZLimits,
    tl: TreeLimits,
) -> Result<ZSet<'e>, CmdError> {
    Ok(match open(store, key, limits, tl)? {
        Some(z) => z,
        None => ZSet {
            store,
            key: key.to_vec(),
            limits,
            tl,
            version: None,
            repr: Repr::Small(NodeBuf::new(true)),
            dirty: false,
        },
    })
}

impl ZSet<'_> {
    /// Number of members.
    pub fn len(&self) -> u64 {
        match &self.repr {
            Repr::Small(v) => v.len() as u64,
            Repr::Big(b) => b.root.count,
        }
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// OBJECT ENCODING.
    pub fn encoding(&self) -> &'static str {
        match &self.repr {
            Repr::Small(_) => "listpack",
            Repr::Big(_) => "skiplist",
        }
    }

    fn big(&mut self) -> &mut Big {
        match &mut self.repr {
            Repr::Big(b) => b,
            Repr::Small(_) => unreachable!("tree operation on a small zset"),
        }
    }

    fn bucket(&mut self, i: u32) -> Result<&mut Bucket, CmdError> {
        let Repr::Big(b) = &mut self.repr else {
            unreachable!("bucket of a small zset")
        };
        if !b.buckets.contains_key(&i) {
            let mut data = Vec::with_capacity(NODE_READ_BYTES);
            let items = match self
                .store
                .raw_get_into(&node_key(b.root.id, i), &mut data)?
            {
                Some(_) => PairBuf::from_bytes(data, true).ok_or_else(corrupt)?,
                None => PairBuf::new(true),
            };
            b.buckets.insert(i, (items, false));
        }
        Ok(b.buckets.get_mut(&i).expect("just loaded"))
    }

    fn node(&mut self, n: u32) -> Result<&mut (NodeBuf, bool), CmdError> {
        let Repr::Big(b) = &mut self.repr else {
            unreachable!("node of a small zset")
        };
        if !b.nodes.contains_key(&n) {
            let mut data = Vec::with_capacity(NODE_READ_BYTES);
            let node = match self
                .store
                .raw_get_into(&node_key(b.root.id, n), &mut data)?
            {
                Some(_) => NodeBuf::from_bytes(data).ok_or_else(corrupt)?,
                None => return Err(corrupt()),
            };
            b.nodes.insert(n, (node, false));
        }
        Ok(b.nodes.get_mut(&n).expect("just loaded"))
    }

    /// Inner node `parent`'s child `i` := node `child`: its count and its
    /// largest entry, patched in place (`insert`: as a new child at `i`).
    fn link(&mut self, parent: u32, i: usize, child: u32, insert: bool) -> Result<(), CmdError> {
        let mut key = std::mem::take(&mut self.big().scratch);
        key.clear();
        let (count, score) = {
            let c = &self.node(child)?.0;
            let (s, m) = c.last_key().ok_or_else(corrupt)?;
            key.extend_from_slice(m);
            (c.total(), s)
        };
        let (p, dirty) = self.node(parent)?;
        if p.is_leaf() || (!insert && i >= p.len()) || i > p.len() {
            return Err(corrupt());
        }
        *dirty = true;
        if insert {
            p.insert_child(i, child, count, (score, &key));
        } else {
            p.set_count(i, count);
            p.set_max(i, (score, &key));
        }
        self.big().scratch = key;
        Ok(())
    }

    fn new_node(&mut self, node: NodeBuf) -> u32 {
        let b = self.big();
        let n = b.tree.next;
        b.tree.next = n.wrapping_add(1);
        b.nodes.insert(n, (node, true));
        n
    }

    fn drop_node(&mut self, n: u32) {
        let b = self.big();
        b.nodes.remove(&n);
        b.dropped.push(n);
    }

    /// The score of `m`, if a member.
    pub fn score(&mut self, m: &[u8]) -> Result<Option<f64>, CmdError> {
        match &self.repr {
            Repr::Small(v) => Ok((0..v.len())
                .map(|i| v.key(i))
                .find(|e| e.1 == m)
                .map(|e| e.0)),
            Repr::Big(b) => {
                let i = bucket_of(nibble::hash_key(m), b.root.nbuckets);
                let (items, _) = self.bucket(i)?;
                Ok(items
                    .get(m)
                    .and_then(|v| Some(f64::from_le_bytes(v.try_into().ok()?))))
            }
        }
    }

    /// Set `m`'s score to `s`; its previous score, if it was a member.
    pub fn insert(&mut self, m: &[u8], s: f64) -> Result<Option<f64>, CmdError> {
        self.dirty = true;
        // A listpack keeps scores as d2string text, which writes -0 as 0.
        let s = match self.repr {
            Repr::Small(_) if s == 0.0 => 0.0,
            _ => s,
        };
        let old = self.score(m)?;
        if old == Some(s) && old.map(f64::to_bits) == Some(s.to_bits()) {
            return Ok(old);
        }
        match &mut self.repr {
            Repr::Small(v) => {
                if let Some(o) = old {
                    let i = v.find((o, m)).ok_or_else(corrupt)?;
                    v.remove(i);
                }
                let at = v.partition_point(|es, em| lt((es, em), (s, m)));
                v.insert_entry(at, s, m);
                self.grow_if_needed()?;
            }
            Repr::Big(b) => {
                let i = bucket_of(nibble::hash_key(m), b.root.nbuckets);
                let (items, dirty) = self.bucket(i)?;
                *dirty = true;
                items.upsert(m, &s.to_le_bytes());
                if let Some(o) = old {
                    self.tree_remove((o, m))?;
                } else {
                    self.big().root.count += 1;
                }
                self.tree_insert((s, m))?;
                if old.is_none() {
                    self.split_if_needed()?;
                }
            }
        }
        Ok(old)
    }

    /// Remove `m`; its score if it was a member.
    pub fn remove(&mut self, m: &[u8]) -> Result<Option<f64>, CmdError> {
        let Some(old) = self.score(m)? else {
            return Ok(None);
        };
        self.dirty = true;
        match &mut self.repr {
            Repr::Small(v) => {
                let i = v.find((old, m)).ok_or_else(corrupt)?;
                v.remove(i);
            }
            Repr::Big(b) => {
                let i = bucket_of(nibble::hash_key(m), b.root.nbuckets);
                let (items, dirty) = self.bucket(i)?;
                items.remove(m);
                *dirty = true;
                self.big().root.count -= 1;
                self.tree_remove((old, m))?;
            }
        }
        Ok(Some(old))
    }

    /// The number of entries `e` for which `before(e)` holds; `before`
    /// must hold on a prefix of the order (a rank or a bound's position).
    pub fn rank_by(&mut self, before: impl Fn(f64, &[u8]) -> bool) -> Result<u64, CmdError> {
        let (mut n, mut h) = match &self.repr {
            Repr::Small(v) => return Ok(v.partition_point(&before) as u64),
            Repr::Big(b) if b.root.count == 0 => return Ok(0),
            Repr::Big(b) => (b.tree.root, b.tree.height),
        };
        let mut acc = 0;
        loop {
            let node = &self.node(n)?.0;
            if node.is_leaf() {
                return Ok(acc + node.partition_point(&before) as u64);
            }
            let mut next = None;
            for i in 0..node.len() {
                let (s, m) = node.key(i);
                if before(s, m) {
                    acc += node.count(i);
                } else {
                    next = Some(node.child(i));
                    break;
                }
            }
            match next {
                Some(c) => n = c,
                None => return Ok(acc),
            }
            h = h.checked_sub(1).ok_or_else(corrupt)?;
        }
    }

    /// The rank of member `m` (0-based, ascending), if a member.
    pub fn rank(&mut self, m: &[u8]) -> Result<Option<u64>, CmdError> {
        let Some(s) = self.score(m)? else {
            return Ok(None);
        };
        Ok(Some(self.rank_by(|es, em| lt((es, em), (s, m)))?))
    }

    /// Entries of ranks `lo..hi` (ascending).
    pub fn range(&mut self, lo: u64, hi: u64) -> Result<Vec<Entry>, CmdError> {
        let hi = hi.min(self.len());
        if lo >= hi {
            return Ok(Vec::new());
        }
        let (root, height) = match &self.repr {
            Repr::Small(v) => return Ok(leaf_entries(v, lo as usize, hi as usize)),
            Repr::Big(b) => (b.tree.root, b.tree.height),
        };
        let mut out = Vec::with_capacity((hi - lo).min(1 << 16) as usize);
        self.collect(root, height, lo, hi - lo, &mut out)?;
        Ok(out)
    }

    /// Hand the entries of ranks `lo..hi` to `f` in order (`rev`: from
    /// the highest rank down): a small zset's in place, a large one's
    /// through [`ZSet::range`].
    pub fn visit_range(
        &mut self,
        lo: u64,
        hi: u64,
        rev: bool,
        mut f: impl FnMut(f64, &[u8]),
    ) -> Result<(), CmdError> {
        let hi = hi.min(self.len());
        if lo >= hi {
            return Ok(());
        }
        if let Repr::Small(v) = &self.repr {
            let (lo, hi) = (lo as usize, hi as usize);
            for k in 0..hi - lo {
                let (s, m) = v.key(if rev { hi - 1 - k } else { lo + k });
                f(s, m);
            }
            return Ok(());
        }
        let mut es = self.range(lo, hi)?;
        if rev {
            es.reverse();
        }
        es.iter().for_each(|(s, m)| f(*s, m));
        Ok(())
    }

    fn collect(
        &mut self,
        n: u32,
        h: u32,
        mut skip: u64,
        mut want: u64,
        out: &mut Vec<Entry>,
    ) -> Result<(), CmdError> {
        let kids = {
            let node = &self.node(n)?.0;
            if node.is_leaf() {
                let s = (skip as usize).min(node.len());
                let e = (s + want as usize).min(node.len());
                out.extend((s..e).map(|i| {
                    let (sc, m) = node.key(i);
                    (sc, m.to_vec())
                }));
                return Ok(());
            }
            (0..node.len())
                .map(|i| (node.child(i), node.count(i)))
                .collect::<Vec<_>>()
        };
        let h = h.checked_sub(1).ok_or_else(corrupt)?;
        for (num, count) in kids {
            if want == 0 {
                break;
            }
            if skip >= count {
                skip -= count;
                continue;
            }
            let take = (count - skip).min(want);
            self.collect(num, h, skip, take, out)?;
            skip = 0;
            want -= take;
        }
        Ok(())
    }

    /// Every entry, ascending.
    pub fn all(&mut self) -> Result<Vec<Entry>, CmdError> {
        self.range(0, self.len())
    }

    /// One ZSCAN step: small, everything with cursor 0; large, member
    /// table buckets from `cursor` until at least `count` members.
    pub fn scan(&mut self, cursor: u64, count: usize) -> Result<(u64, Vec<Entry>), CmdError> {
        let n = match &self.repr {
            Repr::Small(v) => return Ok((0, leaf_entries(v, 0, v.len()))),
            Repr::Big(b) => b.root.nbuckets,
        };
        let mut out = Vec::new();
        let mut b = cursor;
        while b < u64::from(n) && out.len() < count {
            for (m, s) in self.bucket(b as u32)?.0.iter() {
                let s = f64::from_le_bytes(s.try_into().map_err(|_| corrupt())?);
                out.push((s, m.to_vec()));
            }
            b += 1;
        }
        Ok((if b >= u64::from(n) { 0 } else { b }, out))
    }

    fn grow_if_needed(&mut self) -> Result<(), CmdError> {
        let Repr::Small(v) = &mut self.repr else {
            return Ok(());
        };
        let l = self.limits;
        if v.len() <= l.entries && (0..v.len()).all(|i| v.key(i).1.len() <= l.value) {
            return Ok(());
        }
        let entries = leaf_entries(v, 0, v.len());
        self.repr = Repr::Big(Box::new(Big {
            root: Root {
                id: new_id(),
                count: 0,
                nbuckets: 1,
                first: 0,
            },
            tree: Tree {
                root: TREE_BASE,
                height: 0,
                next: TREE_BASE + 1,
            },
            buckets: HashMap::from([(0, (PairBuf::new(true), true))]),
            nodes: HashMap::from([(TREE_BASE, (NodeBuf::new(true), true))]),
            dropped: Vec::new(),
            fresh: true,
            scratch: Vec::new(),
        }));
        for (s, m) in entries {
            self.insert(&m, s)?;
        }
        Ok(())
    }

    /// Split one member-table bucket if the table is over its load.
    fn split_if_needed(&mut self) -> Result<(), CmdError> {
        let r = self.big().root;
        let n = r.nbuckets;
        if r.count <= u64::from(n) * ZBUCKET_SPLIT_ELEMS || n >= TREE_BASE - 1 {
            return Ok(());
        }
        let p = 1u32 << (31 - n.leading_zeros());
        let s = n - p;
        let (items, _) = self.bucket(s)?;
        let (mut stay, mut go) = (PairBuf::new(true), PairBuf::new(true));
        for (m, v) in items.iter() {
            if bucket_of(nibble::hash_key(m), n + 1) == s {
                stay.push(m, v);
            } else {
                go.push(m, v);
            }
        }
        let b = self.big();
        b.buckets.insert(s, (stay, true));
        b.buckets.insert(n, (go, true));
        b.root.nbuckets = n + 1;
        Ok(())
    }

    fn tree_insert(&mut self, e: (f64, &[u8])) -> Result<(), CmdError> {
        let Tree { root, height, .. } = self.big().tree;
        if let Some(right) = self.insert_at(root, height, e)? {
            let new = self.new_node(NodeBuf::new(false));
            self.link(new, 0, root, true)?;
            self.link(new, 1, right, true)?;
            let t = &mut self.big().tree;
            t.root = new;
            t.height += 1;
        }
        Ok(())
    }

    /// Insert `e` under node `n` (height `h`); the new right sibling if
    /// `n` split.
    fn insert_at(&mut self, n: u32, h: u32, e: (f64, &[u8])) -> Result<Option<u32>, CmdError> {
        let tl = self.tl;
        if h == 0 {
            let (node, dirty) = self.node(n)?;
            if !node.is_leaf() {
                return Err(corrupt());
            }
            let at = node.partition_point(|s, m| lt((s, m), e));
            node.insert_entry(at, e.0, e.1);
            *dirty = true;
            if node.len() <= tl.leaf {
                return Ok(None);
            }
            // An append (ascending scores: timestamps, counters) leaves the
            // left node full, so a sequential load packs its leaves.
            let cut = if at + 1 == node.len() {
                node.len() - 1
            } else {
                node.len() / 2
            };
            let right = node.split_off(cut);
            return Ok(Some(self.new_node(right)));
        }
        let (i, c, last) = {
            let node = &self.node(n)?.0;
            if node.is_leaf() || node.is_empty() {
                return Err(corrupt());
            }
            let i = node
                .partition_point(|s, m| lt((s, m), e))
                .min(node.len() - 1);
            (i, node.child(i), i + 1 == node.len())
        };
        let split = self.insert_at(c, h - 1, e)?;
        self.link(n, i, c, false)?;
        if let Some(right) = split {
            self.link(n, i + 1, right, true)?;
        }
        let node = &mut self.node(n)?.0;
        if node.len() <= tl.inner {
            return Ok(None);
        }
        let cut = if split.is_some() && last {
            node.len() - 1
        } else {
            node.len() / 2
        };
        let right = node.split_off(cut);
        Ok(Some(self.new_node(right)))
    }

    fn tree_remove(&mut self, e: (f64, &[u8])) -> Result<(), CmdError> {
        let Tree { root, height, .. } = self.big().tree;
        self.remove_at(root, height, e)?;
        // Shrink: a root inner node with one child hands over the root.
        loop {
            let t = self.big().tree;
            if t.height == 0 {
                break;
            }
            let only = {
                let node = &self.node(t.root)?.0;
                if node.is_leaf() || node.len() != 1 {
                    break;
                }
                node.child(0)
            };
            self.drop_node(t.root);
            let t = &mut self.big().tree;
            t.root = only;
            t.height -= 1;
        }
        Ok(())
    }

    fn remove_at(&mut self, n: u32, h: u32, e: (f64, &[u8])) -> Result<(), CmdError> {
        let tl = self.tl;
        if h == 0 {
            let (node, dirty) = self.node(n)?;
            if !node.is_leaf() {
                return Err(corrupt());
            }
            let i = node.find(e).ok_or_else(corrupt)?;
            node.remove(i);
            *dirty = true;
            return Ok(());
        }
        let (i, c) = {
            let node = &self.node(n)?.0;
            if node.is_leaf() {
                return Err(corrupt());
            }
            let i = node.partition_point(|s, m| lt((s, m), e));
            if i >= node.len() {
                return Err(corrupt());
            }
            (i, node.child(i))
        };
        self.remove_at(c, h - 1, e)?;
        let clen = self.node(c)?.0.len();
        if clen == 0 {
            self.drop_node(c);
            let (node, dirty) = self.node(n)?;
            node.remove(i);
            *dirty = true;
            return Ok(());
        }
        self.link(n, i, c, false)?;
        let (l, r, ln, rn, max) = {
            let node = &self.node(n)?.0;
            let max = if h == 1 { tl.leaf } else { tl.inner };
            if clen > max / 4 || node.len() < 2 {
                return Ok(());
            }
            // Merge the small child with a neighbour when both fit one node.
            let (l, r) = if i + 1 < node.len() {
                (i, i + 1)
            } else {
                (i - 1, i)
            };
            (l, r, node.child(l), node.child(r), max)
        };
        if self.node(ln)?.0.len() + self.node(rn)?.0.len() > max {
            return Ok(());
        }
        let right = {
            let b = self.big();
            let (right, _) = b.nodes.remove(&rn).ok_or_else(corrupt)?;
            b.dropped.push(rn);
            right
        };
        {
            let (left, dirty) = self.node(ln)?;
            if left.is_leaf() != right.is_leaf() {
                return Err(corrupt());
            }
            left.append(&right);
            *dirty = true;
        }
        self.link(n, l, ln, false)?;
        self.node(n)?.0.remove(r);
        Ok(())
    }

    /// Write what changed: nodes, then the root last (or delete it all if
    /// empty). `Ok(false)`: the root changed under us; rerun.
    pub fn commit(&mut self) -> Result<bool, CmdError> {
        if !self.dirty {
            return Ok(true);
        }
        let store = self.store;
        let opts = PutOptions {
            condition: self
                .version
                .map_or(Condition::IfAbsent, Condition::IfVersion),
            expiry: Expiry::Keep,
            flags: ZSET_FLAGS,
        };
        if self.is_empty() {
            if let Some(v) = self.version {
                match store.delete_if(&self.key, Condition::IfVersion(v)) {
                    Ok(()) => {}
                    Err(e) if is_race(&e) => return Ok(false),
                    Err(e) => return Err(e.into()),
                }
            }
            if let Repr::Big(b) = &self.repr {
                let (root, tree) = (b.root, b.tree);
                for n in b.dropped.clone() {
                    store.raw_delete(&node_key(root.id, n))?;
                }
                let cached: Vec<u32> = b.nodes.keys().copied().collect();
                for n in cached {
                    store.raw_delete(&node_key(root.id, n))?;
                }
                drop_all(store, &root, &tree)?;
            }
            self.dirty = false;
            return Ok(true);
        }
        let bytes = match &mut self.repr {
            Repr::Small(v) => {
                if v.bytes().len() as u64 > store.max_value_bytes() {
                    return Err("ERR collection exceeds the largest value the engine stores".into());
                }
                // The leaf's bytes are the item's behind another first
                // byte: written from the buffer itself, no copy.
                let put = v.with_tag(ZSET_MAGIC, |b| store.put_with(&self.key, b, opts));
                return self.committed(put);
            }
            Repr::Big(b) => {
                let id = b.root.id;
                if b.fresh {
                    let mut rec = vec![Kind::Zset.tag()];
                    rec.extend_from_slice(&self.key);
                    store.raw_put_with(&instance_key(id), &rec, PutOptions::default())?;
                    crate::coll::note_large_created();
                    b.fresh = false;
                }
                for n in b.dropped.drain(..) {
                    store.raw_delete(&node_key(id, n))?;
                }
                for (i, (items, dirty)) in b.buckets.iter_mut() {
                    if !*dirty {
                        continue;
                    }
                    let k = node_key(id, *i);
                    if items.is_empty() {
                        store.raw_delete(&k)?;
                    } else {
                        crate::coll::put_node(store, &k, items)?;
                    }
                    *dirty = false;
                }
                for (n, (node, dirty)) in b.nodes.iter_mut() {
                    if !*dirty {
                        continue;
                    }
                    store.raw_put_with(&node_key(id, *n), node.bytes(), PutOptions::default())?;
                    *dirty = false;
                }
                encode_zroot(&b.root, &b.tree)
            }
        };
        let put = store.put_with(&self.key, &bytes, opts);
        self.committed(put)
    }

    /// The outcome of the root's (or small zset's) conditional write.
    fn committed(&mut self, put: Result<u64, nibble::Error>) -> Result<bool, CmdError> {
        match put {
            Ok(ver) => {
                self.version = Some(ver);
                self.dirty = false;
                Ok(true)
            }
            Err(e) if is_race(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// Delete every node of a large zset whose root is `root`/`tree` (walks
/// the tree), its member table and its instance record.
fn drop_all(store: &Engine, root: &Root, tree: &Tree) -> Result<(), CmdError> {
    for b in 0..root.nbuckets {
        store.raw_delete(&node_key(root.id, b))?;
    }
    let mut stack = vec![(tree.root, tree.height)];
    while let Some((n, h)) = stack.pop() {
        let k = node_key(root.id, n);
        let mut buf = Vec::new();
        if h > 0 && store.raw_get_into(&k, &mut buf)?.is_some() {
            if let Some(node) = NodeBuf::from_bytes(buf).filter(|n| !n.is_leaf()) {
                stack.extend((0..node.len()).map(|i| (node.child(i), h - 1)));
            }
        }
        store.raw_delete(&k)?;
    }
    store.raw_delete(&instance_key(root.id))?;
    Ok(())
}

/// If `v` is a large zset's root, delete its nodes (DEL, overwrite).
pub fn drop_if_big(store: &Engine, v: &[u8]) -> Result<(), CmdError> {
    if let Some((root, tree)) = decode_zroot(v) {
        drop_all(store, &root, &tree)?;
    }
    Ok(())
}

/// Run `f` over the zset at `key` (new if absent), commit, rerun on a lost
/// race with a writer outside the stripe.
pub fn modify<T>(
    shared: &Shared,
    key: &[u8],
    mut f: impl FnMut(&mut ZSet) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    let limits = ZLimits::of(shared);
    loop {
        let mut z = open_or_new(&shared.store, key, limits, TREE_LIMITS)?;
        let out = f(&mut z)?;
        if z.commit()? {
            return Ok(out);
        }
    }
}

/// Run `f` over the zset at `key` if present.
pub fn read<T>(
    shared: &Shared,
    key: &[u8],
    f: impl FnOnce(&mut ZSet) -> Result<T, CmdError>,
) -> Result<Option<T>, CmdError> {
    match open(&shared.store, key, ZLimits::of(shared), TREE_LIMITS)? {
        Some(mut z) => Ok(Some(f(&mut z)?)),
        None => Ok(None),
    }
}

/// Build a new zset at the free key `key` (COPY, the STORE forms).
pub fn create(shared: &Shared, key: &[u8], entries: &[Entry]) -> Result<(), CmdError> {
    let mut z = open_or_new(&shared.store, key, ZLimits::of(shared), TREE_LIMITS)?;
    for (s, m) in entries {
        z.insert(m, *s)?;
    }
    if !z.commit()? {
        return Err("ERR the key changed while it was written".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Random adds, score changes and removes with tiny node limits (so
    /// leaves and inner nodes split and merge, the tree grows and
    /// shrinks) against a `BTreeMap` model: length, scores, ranks, full
    /// and partial ranges and bound ranks agree after every command, and
    /// deleting the key leaves no internal item behind.
    #[test]
    fn zsets_match_a_model() {
        use proptest::prelude::*;
        let store =
            Engine::Local(nibble::Store::new(nibble::Config::new(64 << 20)).expect("engine"));
        let limits = ZLimits {
            entries: 4,
            value: 16,
        };
        let tl = TreeLimits { leaf: 4, inner: 4 };
        let op = (0u8..4, 0u32..200, -20i32..20);
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 24,
            failure_persistence: None,
            ..Default::default()
        });
        let round = std::cell::Cell::new(0u32);
        runner
            .run(&proptest::collection::vec(op, 1..500), |ops| {
                round.set(round.get() + 1);
                let key = format!("z{}", round.get()).into_bytes();
                let mut model: BTreeMap<Vec<u8>, f64> = BTreeMap::new();
                for &(o, x, s) in &ops {
                    let m = format!("m{x}").into_bytes();
                    let s = f64::from(s) / 2.0;
                    let mut z = open_or_new(&store, &key, limits, tl).unwrap();
                    match o {
                        0 | 1 => {
                            let old = z.insert(&m, s).unwrap();
                            prop_assert_eq!(old, model.insert(m.clone(), s));
                        }
                        2 => prop_assert_eq!(z.remove(&m).unwrap(), model.remove(&m)),
                        _ => prop_assert_eq!(z.score(&m).unwrap(), model.get(&m).copied()),
                    }
                    prop_assert!(z.commit().unwrap());
                    let Some(mut z) = open(&store, &key, limits, tl).unwrap() else {
                        prop_assert!(model.is_empty());
                        continue;
                    };
                    let mut want: Vec<Entry> = model.iter().map(|(m, s)| (*s, m.clone())).collect();
                    want.sort_by(|a, b| cmp_entry((a.0, &a.1), (b.0, &b.1)));
                    prop_assert_eq!(z.len(), want.len() as u64);
                    prop_assert_eq!(&z.all().unwrap(), &want);
                    let n = want.len() as u64;
                    let (lo, hi) = (u64::from(x) % n, u64::from(x) % n + 3);
                    let hi_c = hi.min(n) as usize;
                    prop_assert_eq!(z.range(lo, hi).unwrap(), want[lo as usize..hi_c].to_vec());
                    let r = z.rank(&want[lo as usize].1).unwrap();
                    prop_assert_eq!(r, Some(lo));
                    let below = want.iter().filter(|e| e.0 < s).count() as u64;
                    prop_assert_eq!(z.rank_by(|es, _| es < s).unwrap(), below);
                    let mut scanned = Vec::new();
                    let mut cursor = 0;
                    loop {
                        let (next, items) = z.scan(cursor, 3).unwrap();
                        scanned.extend(items);
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                    scanned.sort_by(|a, b| cmp_entry((a.0, &a.1), (b.0, &b.1)));
                    prop_assert_eq!(&scanned, &want);
                }
                crate::coll::delete_key(&store, &key).unwrap();
                let (_, keys) = store.raw_scan(0, 1 << 16).unwrap();
                prop_assert!(keys.iter().all(|k| !crate::engine::is_internal_key(k)));
                Ok(())
            })
            .unwrap();
    }
}
