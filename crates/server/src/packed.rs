//! Packed nodes: a large collection's bucket or tree node kept, while one
//! command works on it, as the very bytes of its engine item, patched in
//! place.
//!
//! # Why
//!
//! A write into a large hash, set or sorted set reads one or more node
//! items (a linear-hashing bucket, the leaves and inner nodes of the
//! counted B+tree of `crate::zset`), changes one entry of each and writes
//! them back. Decoding a node into one `Vec` per entry and re-encoding it
//! on write cost one allocation per entry read (64 per tree node, ~6
//! nodes per ZADD): a quarter of the server's CPU went to malloc/free.
//! Here a node is one byte buffer, the item's bytes unchanged, plus (for
//! tree nodes) an offset table; an entry is decoded only when compared,
//! an insert or a removal is one `copy_within` (memmove) of the tail and
//! one pass over the offsets, and the write sends the buffer as it is.
//! This is the "slotted page" of database systems (Gray & Reuter,
//! *Transaction Processing*, 13.3): variable-length records addressed by
//! a slot table, patched in place.
//!
//! # Formats (unchanged on disk, so RDB, DUMP and old stores read the same)
//!
//! ```text
//!  PairBuf (bucket):  n u32 | (len a u32 | a | [len b u32 | b])*      values optional (sets)
//!  NodeBuf leaf:      'L' | n u32 | (score f64 | len u32 | member)*
//!  NodeBuf inner:     'I' | n u32 | (child u32 | count u64 | score f64 | len u32 | member)*
//! ```
//!
//! Every constructor from bytes validates the whole buffer once (lengths
//! in range, counts matching), so the accessors afterwards index only
//! inside it; a corrupt item is reported as `None`, never a panic.
//!
//! # Room to grow: buckets and chunks overwritten in place
//!
//! A `PairBuf` item may end in zero bytes after its last pair: spare room
//! ([`PairBuf::write_with`]). Nibble-2 (dissertation §6.2) overwrites an
//! item in place when the new value has the size of the old one; without
//! room, every insert into a bucket (or push onto a list chunk) changes
//! its size, so the engine appends a whole new copy of the bucket to the
//! log and leaves the old one for compaction: about a kilobyte of log and
//! a kilobyte of compaction work per element written. With room, a
//! bucket written at a new size gets `len / NODE_ROOM_DIVISOR` spare
//! bytes (at least [`NODE_ROOM_MIN_BYTES`], at most
//! [`NODE_ROOM_MAX_BYTES`]), and later writes keep the item's size while
//! the pairs fit in it and fill at least half of it: the put is an
//! in-place overwrite (no append, no garbage, no index swap). This is
//! the free space Redis's listpacks and a slotted page keep for the same
//! reason. A small hash or set (`crate::coll`: type byte, then its
//! pairs) is written with room too, [`Room::Small`]: less of it (one
//! eighth, none under [`SMALL_ROOM_FROM_BYTES`]), since every such key
//! carries it, but enough that adding a field is an in-place overwrite
//! most of the time and the appends left amortize to about
//! `SMALL_ROOM_DIVISOR` times a pair's bytes per insert. Readers strip
//! the room, so DUMP, RDB and replication never see it, and items
//! written without room (older stores, RESTORE, the shared store, which
//! is append-only and gets none) read the same. The pair count leads the
//! pairs, so a run of zero bytes after the last one is never read as a
//! pair.
//!
//! The buffers that roots, buckets and chunks are read into come from a
//! small per-thread pool ([`take_buf`], [`give_buf`]): a collection write
//! then pays no malloc/free pair per item it reads.

use std::cmp::Ordering;

/// First byte of a tree leaf (an inner node's is `b'I'`).
pub const LEAF_TAG: u8 = b'L';
/// Bytes of a tree node's header: tag and entry count.
const NODE_HEADER_BYTES: usize = 5;
/// Bytes before an inner entry's (score, member): child number and count.
const INNER_PREFIX_BYTES: usize = 12;
/// Bytes of an entry's fixed part: score and member length.
const ENTRY_FIXED_BYTES: usize = 12;

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn f64_at(b: &[u8], at: usize) -> f64 {
    f64::from_bits(u64_at(b, at))
}

/// Open a gap of `n` bytes at `at` in `v` (one memmove of the tail).
fn open_gap(v: &mut Vec<u8>, at: usize, n: usize) {
    let old = v.len();
    v.resize(old + n, 0);
    v.copy_within(at..old, at + n);
}

/// Replace `v[range]` by `with`, moving the tail once if the length changes.
fn replace_range(v: &mut Vec<u8>, start: usize, end: usize, with: &[u8]) {
    let (old, new) = (end - start, with.len());
    if new > old {
        open_gap(v, end, new - old);
    } else if new < old {
        v.drain(start + new..end);
    }
    v[start..start + new].copy_from_slice(with);
}

/// True if every byte of `b` is zero (a word at a time: spare room is
/// checked on every read of a bucket or chunk).
fn all_zero(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(8);
    let acc = words.by_ref().fold(0u64, |a, w| {
        a | u64::from_le_bytes(w.try_into().unwrap_or([0xFF; 8]))
    });
    acc == 0 && words.remainder().iter().all(|&x| x == 0)
}

/// Least spare room a bucket or chunk written at a new size gets.
pub const NODE_ROOM_MIN_BYTES: usize = 64;
/// Most spare room a bucket or chunk written at a new size gets.
pub const NODE_ROOM_MAX_BYTES: usize = 1024;
/// A bucket written at a new size gets `len / NODE_ROOM_DIVISOR` spare
/// bytes (within the bounds above).
pub const NODE_ROOM_DIVISOR: usize = 4;
/// A small collection's pairs (`crate::coll`) written at a new size
/// get `len / SMALL_ROOM_DIVISOR` spare bytes (at most
/// [`NODE_ROOM_MAX_BYTES`]) once they fill [`SMALL_ROOM_FROM_BYTES`]:
/// one such item per key, so less room than a bucket's, and none on
/// the smallest, which are cheap to rewrite.
pub const SMALL_ROOM_DIVISOR: usize = 8;
/// Pairs' length (bytes) below which a small collection gets no room.
pub const SMALL_ROOM_FROM_BYTES: usize = 256;

/// How much spare room a [`PairBuf`] is written with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// None: the pairs alone (append-only engine).
    None,
    /// A bucket's or list chunk's ([`NODE_ROOM_DIVISOR`]).
    Node,
    /// A small collection's ([`SMALL_ROOM_DIVISOR`]).
    Small,
}

impl Room {
    /// The spare bytes for pairs of `len` bytes written at a new size.
    fn bytes(self, len: usize) -> usize {
        match self {
            Room::None => 0,
            Room::Node => (len / NODE_ROOM_DIVISOR).clamp(NODE_ROOM_MIN_BYTES, NODE_ROOM_MAX_BYTES),
            Room::Small if len < SMALL_ROOM_FROM_BYTES => 0,
            Room::Small => (len / SMALL_ROOM_DIVISOR).min(NODE_ROOM_MAX_BYTES),
        }
    }
}

/// Read buffers a thread keeps for reuse (see [`take_buf`]).
const POOL_BUFFERS: usize = 8;
/// Larger buffers are freed, not kept.
const POOL_MAX_BYTES: usize = 64 << 10;

thread_local! {
    static POOL: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty buffer of at least `capacity` bytes for reading an item (a
/// root, a bucket, a chunk): one the thread used before if it kept one,
/// so a collection write does not pay a malloc and a free per item read.
pub fn take_buf(capacity: usize) -> Vec<u8> {
    let mut v = take_stale_buf();
    v.clear();
    v.reserve(capacity);
    v
}

/// A buffer as the thread last left it: its bytes initialized but
/// stale, for a read that overwrites them. The engine's
/// `read_modify_write` sizes its buffer to the item with
/// `Vec::resize`, which zeroes only the bytes past the old length: a
/// buffer that held an item of this size before costs no `memset` of
/// the item (a small hash's is kilobytes, read on every HSET).
pub fn take_stale_buf() -> Vec<u8> {
    POOL.with(|p| p.try_borrow_mut().ok().and_then(|mut p| p.pop()))
        .unwrap_or_default()
}

/// Hand a buffer from [`take_buf`] back for reuse (up to
/// `POOL_BUFFERS` per thread, none over `POOL_MAX_BYTES`).
pub fn give_buf(v: Vec<u8>) {
    if v.capacity() == 0 || v.capacity() > POOL_MAX_BYTES {
        return;
    }
    POOL.with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            if p.len() < POOL_BUFFERS {
                p.push(v);
            }
        }
    });
}

/// What [`PairBuf::upsert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upserted {
    /// The element was absent: added.
    New,
    /// The element was present with another value: replaced.
    Changed,
    /// The element was present with this value: nothing to write.
    Unchanged,
}

/// A bucket of (element, value) pairs in its item's encoding.
#[derive(Clone, Debug)]
pub struct PairBuf {
    /// The item's head bytes (`head` of them), then the pairs' bytes,
    /// without the item's spare room.
    data: Vec<u8>,
    /// Bytes before the pair count: none for a bucket, the type byte for
    /// a small collection (`crate::coll`), kept so that the item's bytes
    /// are read and written whole, never shifted by one.
    head: usize,
    values: bool,
    /// Length of the stored item, spare room included (0: not stored).
    stored_bytes: usize,
}

impl PairBuf {
    /// An empty bucket.
    pub fn new(values: bool) -> PairBuf {
        PairBuf::with_head(0, values)
    }

    /// An empty bucket after `head` head bytes (zero until set through
    /// [`head_mut`](PairBuf::head_mut)).
    pub fn with_head(head: usize, values: bool) -> PairBuf {
        PairBuf {
            data: vec![0; head + 4],
            head,
            values,
            stored_bytes: 0,
        }
    }

    /// The head bytes.
    pub fn head_mut(&mut self) -> &mut [u8] {
        &mut self.data[..self.head]
    }

    /// Take an item's bytes as a bucket (spare room, zero bytes after the
    /// last pair, allowed and stripped); `None` if they are not one.
    pub fn from_bytes(data: Vec<u8>, values: bool) -> Option<PairBuf> {
        PairBuf::from_bytes_after(data, 0, values)
    }

    /// [`from_bytes`](PairBuf::from_bytes) of an item whose pairs follow
    /// `head` head bytes (kept in the buffer, not shifted off).
    pub fn from_bytes_after(mut data: Vec<u8>, head: usize, values: bool) -> Option<PairBuf> {
        let n = data.get(head..head + 4).map(|_| u32_at(&data, head))?;
        let mut at = head + 4;
        for _ in 0..n {
            let l = u32_at(&data, at) as usize;
            at = at.checked_add(4 + l).filter(|&e| e <= data.len())?;
            if values {
                let l = u32_at(&data, at) as usize;
                at = at
                    .checked_add(4 + l)
                    .filter(|&e| e <= data.len() && at + 4 <= data.len())?;
            }
        }
        if !all_zero(&data[at..]) {
            return None;
        }
        let stored_bytes = data.len();
        data.truncate(at);
        Some(PairBuf {
            data,
            head,
            values,
            stored_bytes,
        })
    }

    /// Take pairs stored without spare room (a list root's ends,
    /// `crate::list`): as [`from_bytes`](PairBuf::from_bytes), but
    /// nothing may follow the last pair.
    pub fn from_exact_bytes(data: Vec<u8>, values: bool) -> Option<PairBuf> {
        let len = data.len();
        PairBuf::from_bytes(data, values).filter(|p| p.data.len() == len)
    }

    /// The pairs' bytes (without head bytes and spare room).
    pub fn bytes(&self) -> &[u8] {
        &self.data[self.head..]
    }

    /// The buffer, for [`give_buf`].
    pub fn into_bytes(self) -> Vec<u8> {
        self.data
    }

    /// The buffer, for [`give_buf`], from a bucket about to be dropped
    /// (an owner's `Drop`): what is left is hollow, owns no memory, reads
    /// as empty and must not be written.
    pub fn take_bytes(&mut self) -> Vec<u8> {
        self.stored_bytes = 0;
        std::mem::take(&mut self.data)
    }

    /// The length to store the pairs with: the stored item's length while
    /// they fit it and fill at least half of it, else their length plus
    /// fresh room; just their length without `room` or when that would
    /// pass `max_bytes`.
    fn stored_len(&self, room: Room, max_bytes: usize) -> usize {
        let len = self.data.len();
        if room == Room::None {
            return len;
        }
        if len <= self.stored_bytes && len >= self.stored_bytes / 2 {
            return self.stored_bytes;
        }
        let with_room = len + room.bytes(len);
        if with_room > max_bytes {
            len
        } else {
            with_room
        }
    }

    /// Call `write` with the bytes to store: the pairs, then (with `room`)
    /// zero bytes up to `stored_len`, so that a
    /// write that keeps the item's size is an in-place overwrite. The
    /// buffer is the pairs alone again afterwards.
    pub fn write_with<R>(
        &mut self,
        room: Room,
        max_bytes: usize,
        write: impl FnOnce(&[u8]) -> R,
    ) -> R {
        let len = self.data.len();
        let stored = self.stored_len(room, max_bytes);
        self.data.resize(stored, 0);
        let r = write(&self.data);
        self.data.truncate(len);
        self.stored_bytes = stored;
        r
    }

    /// The bytes to store (head bytes, pairs, the room of `room`, as
    /// [`write_with`](PairBuf::write_with) writes them), as
    /// the buffer itself: nothing is copied.
    pub fn into_stored(mut self, room: Room, max_bytes: usize) -> Vec<u8> {
        let stored = self.stored_len(room, max_bytes);
        self.data.resize(stored, 0);
        self.data
    }

    /// Length of the head bytes and pairs (what is stored, without
    /// spare room).
    pub fn item_len(&self) -> usize {
        self.data.len()
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        u32_at(&self.data, self.head) as usize
    }

    /// True if no pairs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn set_len(&mut self, n: usize) {
        let h = self.head;
        self.data[h..h + 4].copy_from_slice(&(n as u32).to_le_bytes());
    }

    /// The pairs with their byte spans: (start, value start, end).
    pub fn iter(&self) -> PairIter<'_> {
        PairIter {
            buf: self,
            at: self.head + 4,
            left: self.len(),
        }
    }

    /// The span (start, value start, end) of `e`'s pair. The hot loop of
    /// every lookup: it walks the length fields and compares only pairs
    /// of `e`'s length whose last byte matches (elements often share a
    /// prefix, `element:0000…`), so most pairs cost no `memcmp` call.
    fn find(&self, e: &[u8]) -> Option<(usize, usize, usize)> {
        let d = &self.data[..];
        let mut at = self.head + 4;
        for _ in 0..self.len() {
            let l = u32_at(d, at) as usize;
            let vstart = at + 4 + l;
            let end = if self.values {
                vstart + 4 + u32_at(d, vstart) as usize
            } else {
                vstart
            };
            if l == e.len()
                && (l == 0 || d.get(vstart - 1) == e.last())
                && d.get(at + 4..vstart) == Some(e)
            {
                return Some((at, vstart, end));
            }
            at = end;
        }
        None
    }

    /// The value of `e`, if present.
    pub fn get(&self, e: &[u8]) -> Option<&[u8]> {
        let (_, vstart, end) = self.find(e)?;
        if self.values {
            self.data.get(vstart + 4..end)
        } else {
            Some(&[])
        }
    }

    /// Set `e` to `v` (a value of the same length is patched in place).
    pub fn upsert(&mut self, e: &[u8], v: &[u8]) -> Upserted {
        match self.find(e) {
            Some((_, vstart, end)) => {
                if !self.values || &self.data[vstart + 4..end] == v {
                    return Upserted::Unchanged;
                }
                if end - vstart - 4 == v.len() {
                    self.data[vstart + 4..end].copy_from_slice(v);
                } else {
                    let mut enc = Vec::with_capacity(4 + v.len());
                    enc.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    enc.extend_from_slice(v);
                    replace_range(&mut self.data, vstart, end, &enc);
                }
                Upserted::Changed
            }
            None => {
                self.push(e, v);
                Upserted::New
            }
        }
    }

    /// Append a pair (the caller knows `e` is absent).
    pub fn push(&mut self, e: &[u8], v: &[u8]) {
        self.data.extend_from_slice(&(e.len() as u32).to_le_bytes());
        self.data.extend_from_slice(e);
        if self.values {
            self.data.extend_from_slice(&(v.len() as u32).to_le_bytes());
            self.data.extend_from_slice(v);
        }
        self.set_len(self.len() + 1);
    }

    /// Bytes of the elements and values alone (without length fields).
    pub fn payload_bytes(&self) -> usize {
        let per = if self.values { 8 } else { 4 };
        self.data.len() - self.head - 4 - per * self.len()
    }

    /// Pair `j`'s span (start, end), if `j < len`.
    fn span(&self, j: usize) -> Option<(usize, usize)> {
        let mut it = self.iter();
        for _ in 0..j {
            it.next_span()?;
        }
        let (start, _, _) = it.next_span()?;
        Some((start, it.at))
    }

    /// Element `j`, if `j < len`.
    pub fn nth(&self, j: usize) -> Option<&[u8]> {
        self.iter().nth(j).map(|(a, _)| a)
    }

    /// Insert `e` (with value `v`) before every other pair.
    pub fn push_front(&mut self, e: &[u8], v: &[u8]) {
        let n = 4 + e.len() + if self.values { 4 + v.len() } else { 0 };
        let h = self.head;
        open_gap(&mut self.data, h + 4, n);
        self.data[h + 4..h + 8].copy_from_slice(&(e.len() as u32).to_le_bytes());
        self.data[h + 8..h + 8 + e.len()].copy_from_slice(e);
        if self.values {
            let at = h + 8 + e.len();
            self.data[at..at + 4].copy_from_slice(&(v.len() as u32).to_le_bytes());
            self.data[at + 4..at + 4 + v.len()].copy_from_slice(v);
        }
        self.set_len(self.len() + 1);
    }

    /// Insert `e` (with value `v`) before pair `j`, or after the last
    /// pair if `j >= len` (an intset's ordered insert).
    pub fn insert_nth(&mut self, j: usize, e: &[u8], v: &[u8]) {
        let at = self.span(j).map_or(self.data.len(), |(start, _)| start);
        let mut enc = Vec::with_capacity(8 + e.len() + v.len());
        enc.extend_from_slice(&(e.len() as u32).to_le_bytes());
        enc.extend_from_slice(e);
        if self.values {
            enc.extend_from_slice(&(v.len() as u32).to_le_bytes());
            enc.extend_from_slice(v);
        }
        replace_range(&mut self.data, at, at, &enc);
        self.set_len(self.len() + 1);
    }

    /// Remove pair `j` and return its element, if `j < len`.
    pub fn take_nth(&mut self, j: usize) -> Option<Vec<u8>> {
        let (start, end) = self.span(j)?;
        let l = u32_at(&self.data, start) as usize;
        let e = self.data.get(start + 4..start + 4 + l)?.to_vec();
        self.data.drain(start..end);
        self.set_len(self.len() - 1);
        Some(e)
    }

    /// Replace element `j` (a set's or a list's: no value), if `j < len`.
    pub fn set_nth(&mut self, j: usize, e: &[u8]) -> Option<()> {
        if self.values {
            return None;
        }
        let (start, end) = self.span(j)?;
        let mut enc = Vec::with_capacity(4 + e.len());
        enc.extend_from_slice(&(e.len() as u32).to_le_bytes());
        enc.extend_from_slice(e);
        replace_range(&mut self.data, start, end, &enc);
        Some(())
    }

    /// Remove `e`; true if it was present.
    pub fn remove(&mut self, e: &[u8]) -> bool {
        let Some((start, _, end)) = self.find(e) else {
            return false;
        };
        self.data.drain(start..end);
        self.set_len(self.len() - 1);
        true
    }
}

/// The pairs of a [`PairBuf`] in stored order.
pub struct PairIter<'a> {
    buf: &'a PairBuf,
    at: usize,
    left: usize,
}

impl<'a> PairIter<'a> {
    fn next_span(&mut self) -> Option<(usize, &'a [u8], &'a [u8])> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let d = &self.buf.data;
        let start = self.at;
        let l = u32_at(d, start) as usize;
        let a = d.get(start + 4..start + 4 + l)?;
        self.at = start + 4 + l;
        let v: &[u8] = if self.buf.values {
            let l = u32_at(d, self.at) as usize;
            let v = d.get(self.at + 4..self.at + 4 + l)?;
            self.at += 4 + l;
            v
        } else {
            &[]
        };
        Some((start, a, v))
    }
}

impl<'a> Iterator for PairIter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        self.next_span().map(|(_, a, v)| (a, v))
    }
}

/// Ordering of (score, member) entries (scores are never NaN).
pub fn cmp_key(a: (f64, &[u8]), b: (f64, &[u8])) -> Ordering {
    a.0.partial_cmp(&b.0)
        .unwrap_or(Ordering::Equal)
        .then_with(|| a.1.cmp(b.1))
}

/// A counted B+tree node (`crate::zset`) in its item's encoding, with the
/// start of every entry in `offs`.
#[derive(Clone, Debug)]
pub struct NodeBuf {
    data: Vec<u8>,
    offs: Vec<u32>,
}

impl NodeBuf {
    /// An empty leaf (`true`) or inner node.
    pub fn new(leaf: bool) -> NodeBuf {
        let mut data = Vec::with_capacity(NODE_HEADER_BYTES);
        data.push(if leaf { LEAF_TAG } else { b'I' });
        data.extend_from_slice(&0u32.to_le_bytes());
        NodeBuf {
            data,
            offs: Vec::new(),
        }
    }

    /// Take an item's bytes as a node; `None` if they are not one.
    pub fn from_bytes(data: Vec<u8>) -> Option<NodeBuf> {
        let prefix = match data.first()? {
            &LEAF_TAG => 0,
            b'I' => INNER_PREFIX_BYTES,
            _ => return None,
        };
        let n = data.get(1..NODE_HEADER_BYTES).map(|_| u32_at(&data, 1))? as usize;
        // One spare slot: an insert into the node does not reallocate.
        let mut offs = Vec::with_capacity(n.min(data.len() / ENTRY_FIXED_BYTES) + 1);
        let mut at = NODE_HEADER_BYTES;
        for _ in 0..n {
            let fixed = at + prefix + ENTRY_FIXED_BYTES;
            if fixed > data.len() {
                return None;
            }
            let l = u32_at(&data, fixed - 4) as usize;
            offs.push(u32::try_from(at).ok()?);
            at = fixed.checked_add(l).filter(|&e| e <= data.len())?;
        }
        (at == data.len()).then_some(NodeBuf { data, offs })
    }

    /// The item's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Run `f` over the item's bytes with `tag` as their first byte (a
    /// small zset's magic in place of the leaf tag), then restore it.
    pub fn with_tag<R>(&mut self, tag: u8, f: impl FnOnce(&[u8]) -> R) -> R {
        let own = std::mem::replace(&mut self.data[0], tag);
        let r = f(&self.data);
        self.data[0] = own;
        r
    }

    /// True for a leaf.
    pub fn is_leaf(&self) -> bool {
        self.data[0] == LEAF_TAG
    }

    /// Number of entries (leaf) or children (inner).
    pub fn len(&self) -> usize {
        self.offs.len()
    }

    /// True if no entries.
    pub fn is_empty(&self) -> bool {
        self.offs.is_empty()
    }

    fn prefix(&self) -> usize {
        if self.is_leaf() {
            0
        } else {
            INNER_PREFIX_BYTES
        }
    }

    fn start(&self, i: usize) -> usize {
        self.offs[i] as usize
    }

    fn end(&self, i: usize) -> usize {
        self.offs
            .get(i + 1)
            .map_or(self.data.len(), |&o| o as usize)
    }

    fn sync_len(&mut self) {
        let n = self.offs.len() as u32;
        self.data[1..NODE_HEADER_BYTES].copy_from_slice(&n.to_le_bytes());
    }

    /// Entry `i`'s (score, member): a leaf's entry, an inner node's
    /// child's largest entry.
    pub fn key(&self, i: usize) -> (f64, &[u8]) {
        let at = self.start(i) + self.prefix();
        (
            f64_at(&self.data, at),
            &self.data[at + ENTRY_FIXED_BYTES..self.end(i)],
        )
    }

    /// The last key, if any.
    pub fn last_key(&self) -> Option<(f64, &[u8])> {
        (!self.is_empty()).then(|| self.key(self.len() - 1))
    }

    /// The number of leading entries whose key satisfies `pred` (which
    /// must hold on a prefix of the order): a binary search.
    pub fn partition_point(&self, pred: impl Fn(f64, &[u8]) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (s, m) = self.key(mid);
            if pred(s, m) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The position of key `k`, if present.
    pub fn find(&self, k: (f64, &[u8])) -> Option<usize> {
        let i = self.partition_point(|s, m| cmp_key((s, m), k) == Ordering::Less);
        (i < self.len() && cmp_key(self.key(i), k) == Ordering::Equal).then_some(i)
    }

    /// Inner node: child `i`'s node number.
    pub fn child(&self, i: usize) -> u32 {
        u32_at(&self.data, self.start(i))
    }

    /// Inner node: entries below child `i`.
    pub fn count(&self, i: usize) -> u64 {
        u64_at(&self.data, self.start(i) + 4)
    }

    /// Inner node: set the entries below child `i`.
    pub fn set_count(&mut self, i: usize, c: u64) {
        let at = self.start(i) + 4;
        self.data[at..at + 8].copy_from_slice(&c.to_le_bytes());
    }

    /// Entries below this node: a leaf's length, an inner node's counts.
    pub fn total(&self) -> u64 {
        if self.is_leaf() {
            self.len() as u64
        } else {
            (0..self.len()).map(|i| self.count(i)).sum()
        }
    }

    /// Insert the encoded entry `enc` at position `i`.
    fn insert_raw(&mut self, i: usize, enc: &[&[u8]]) {
        let at = if i < self.len() {
            self.start(i)
        } else {
            self.data.len()
        };
        let n: usize = enc.iter().map(|p| p.len()).sum();
        open_gap(&mut self.data, at, n);
        let mut w = at;
        for p in enc {
            self.data[w..w + p.len()].copy_from_slice(p);
            w += p.len();
        }
        for o in &mut self.offs[i..] {
            *o += n as u32;
        }
        self.offs.insert(i, at as u32);
        self.sync_len();
    }

    /// Leaf: insert (s, m) at position `i`.
    pub fn insert_entry(&mut self, i: usize, s: f64, m: &[u8]) {
        self.insert_raw(i, &[&s.to_le_bytes(), &(m.len() as u32).to_le_bytes(), m]);
    }

    /// Inner node: insert child `num` (`count` entries, largest `max`) at
    /// position `i`.
    pub fn insert_child(&mut self, i: usize, num: u32, count: u64, max: (f64, &[u8])) {
        self.insert_raw(
            i,
            &[
                &num.to_le_bytes(),
                &count.to_le_bytes(),
                &max.0.to_le_bytes(),
                &(max.1.len() as u32).to_le_bytes(),
                max.1,
            ],
        );
    }

    /// Inner node: set child `i`'s largest entry (patched in place when
    /// the member's length is unchanged).
    pub fn set_max(&mut self, i: usize, max: (f64, &[u8])) {
        let at = self.start(i) + INNER_PREFIX_BYTES;
        let end = self.end(i);
        let old = end - at - ENTRY_FIXED_BYTES;
        self.data[at..at + 8].copy_from_slice(&max.0.to_le_bytes());
        if old == max.1.len() {
            self.data[at + ENTRY_FIXED_BYTES..end].copy_from_slice(max.1);
            return;
        }
        self.data[at + 8..at + 12].copy_from_slice(&(max.1.len() as u32).to_le_bytes());
        replace_range(&mut self.data, at + ENTRY_FIXED_BYTES, end, max.1);
        let delta = max.1.len() as i64 - old as i64;
        for o in &mut self.offs[i + 1..] {
            *o = (i64::from(*o) + delta) as u32;
        }
    }

    /// Remove entry (or child) `i`.
    pub fn remove(&mut self, i: usize) {
        let (start, end) = (self.start(i), self.end(i));
        self.data.drain(start..end);
        self.offs.remove(i);
        let n = (end - start) as u32;
        for o in &mut self.offs[i..] {
            *o -= n;
        }
        self.sync_len();
    }

    /// Move entries `cut..` into a new node of the same kind.
    pub fn split_off(&mut self, cut: usize) -> NodeBuf {
        let mut right = NodeBuf::new(self.is_leaf());
        if cut >= self.len() {
            return right;
        }
        let from = self.start(cut);
        let base = NODE_HEADER_BYTES as u32;
        right.data.extend_from_slice(&self.data[from..]);
        right.offs = self.offs[cut..]
            .iter()
            .map(|&o| o - from as u32 + base)
            .collect();
        right.sync_len();
        self.data.truncate(from);
        self.offs.truncate(cut);
        self.sync_len();
        right
    }

    /// Append every entry of `other` (same kind).
    pub fn append(&mut self, other: &NodeBuf) {
        let base = self.data.len() as u32;
        self.data
            .extend_from_slice(&other.data[NODE_HEADER_BYTES.min(other.data.len())..]);
        self.offs.extend(
            other
                .offs
                .iter()
                .map(|&o| o - NODE_HEADER_BYTES as u32 + base),
        );
        self.sync_len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn member(x: u16) -> Vec<u8> {
        // Lengths vary (1 to 5 digits) so in-place patches change sizes.
        x.to_string().into_bytes()
    }

    #[derive(Clone, Debug)]
    enum Op {
        Upsert(u16, u16),
        Remove(u16),
        Split(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u16..300, 0u16..3000).prop_map(|(e, v)| Op::Upsert(e, v)),
            2 => (0u16..300).prop_map(Op::Remove),
            1 => (0usize..80).prop_map(Op::Split),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        /// A bucket patched in place holds what a map holds, and its bytes
        /// read back as the same bucket.
        #[test]
        fn pairbuf_matches_a_map(ops in proptest::collection::vec(op(), 1..300), values in any::<bool>()) {
            let mut b = PairBuf::new(values);
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Upsert(e, v) => {
                        let v = if values { member(v) } else { Vec::new() };
                        let did = b.upsert(&member(e), &v);
                        let want = match model.insert(member(e), v.clone()) {
                            None => Upserted::New,
                            Some(old) if old == v => Upserted::Unchanged,
                            Some(_) => Upserted::Changed,
                        };
                        prop_assert_eq!(did, want);
                    }
                    Op::Remove(e) => prop_assert_eq!(b.remove(&member(e)), model.remove(&member(e)).is_some()),
                    Op::Split(e) => {
                        let e = member(e as u16);
                        prop_assert_eq!(b.get(&e), model.get(&e).map(|v| &v[..]));
                    }
                }
                prop_assert_eq!(b.len(), model.len());
            }
            let back = PairBuf::from_bytes(b.bytes().to_vec(), values).expect("valid");
            let mut got: Vec<(Vec<u8>, Vec<u8>)> = back.iter().map(|(a, v)| (a.to_vec(), v.to_vec())).collect();
            got.sort();
            let want: Vec<(Vec<u8>, Vec<u8>)> = model.into_iter().collect();
            prop_assert_eq!(got, want);
        }

        /// Leaf and inner nodes patched in place (inserts at the sorted
        /// position, removals, max and count patches of different lengths,
        /// splits and appends) hold what a `BTreeMap` holds, in order, and
        /// their bytes read back as the same node.
        #[test]
        fn nodebuf_matches_a_btreemap(ops in proptest::collection::vec(op(), 1..300), leaf in any::<bool>()) {
            let mut n = NodeBuf::new(leaf);
            // key (score, member) -> (child, count) for inner nodes
            let mut model: BTreeMap<(i64, Vec<u8>), (u32, u64)> = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Upsert(e, v) => {
                        let k = (i64::from(v % 50), member(e));
                        let key = (k.0 as f64, &k.1[..]);
                        match n.find(key) {
                            Some(i) if !leaf => {
                                // Patch: a new count, and the same position's
                                // max rewritten with a longer or shorter member.
                                n.set_count(i, u64::from(v));
                                model.get_mut(&k).expect("present").1 = u64::from(v);
                                n.set_max(i, (key.0, b"a much longer member than any"));
                                n.set_max(i, key);
                            }
                            Some(_) => {}
                            None => {
                                let i = n.partition_point(|s, m| cmp_key((s, m), key) == Ordering::Less);
                                if leaf {
                                    n.insert_entry(i, key.0, key.1);
                                } else {
                                    n.insert_child(i, u32::from(e), u64::from(v), key);
                                }
                                model.insert(k, (u32::from(e), u64::from(v)));
                            }
                        }
                    }
                    Op::Remove(e) => {
                        let victim = model.keys().find(|k| k.1 == member(e)).cloned();
                        if let Some(k) = victim {
                            let i = n.find((k.0 as f64, &k.1)).expect("present");
                            n.remove(i);
                            model.remove(&k);
                        }
                    }
                    Op::Split(c) => {
                        let right = n.split_off(c.min(n.len()));
                        prop_assert_eq!(n.len(), c.min(model.len()));
                        n.append(&right);
                    }
                }
                prop_assert_eq!(n.len(), model.len());
            }
            let back = NodeBuf::from_bytes(n.bytes().to_vec()).expect("valid");
            prop_assert_eq!(back.len(), model.len());
            for (i, (k, (c, cnt))) in model.iter().enumerate() {
                let (s, m) = back.key(i);
                prop_assert_eq!((s, m), (k.0 as f64, &k.1[..]));
                if !leaf {
                    prop_assert_eq!(back.child(i), *c);
                    prop_assert_eq!(back.count(i), *cnt);
                }
            }
            if !leaf {
                prop_assert_eq!(back.total(), model.values().map(|v| v.1).sum::<u64>());
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        /// A chunk used as a list (pushes and pops at both ends, element
        /// replacement) holds what a `VecDeque` holds.
        #[test]
        fn pairbuf_as_a_deque(ops in proptest::collection::vec((0u8..6, 0u16..2000), 1..300)) {
            let mut b = PairBuf::new(false);
            let mut model: std::collections::VecDeque<Vec<u8>> = Default::default();
            for (o, x) in ops {
                match o {
                    0 => { b.push_front(&member(x), &[]); model.push_front(member(x)); }
                    1 => { b.push(&member(x), &[]); model.push_back(member(x)); }
                    2 => prop_assert_eq!(b.take_nth(0), model.pop_front()),
                    3 => prop_assert_eq!(b.take_nth(b.len().wrapping_sub(1)), model.pop_back()),
                    4 => {
                        let j = usize::from(x) % (model.len() + 1);
                        let r = b.set_nth(j, &member(x));
                        prop_assert_eq!(r.is_some(), j < model.len());
                        if let Some(m) = model.get_mut(j) { *m = member(x); }
                    }
                    _ => {
                        let j = usize::from(x) % (model.len() + 1);
                        prop_assert_eq!(b.nth(j), model.get(j).map(|v| &v[..]));
                    }
                }
                prop_assert_eq!(b.len(), model.len());
                prop_assert_eq!(b.payload_bytes(), model.iter().map(Vec::len).sum::<usize>());
            }
            let back = PairBuf::from_bytes(b.bytes().to_vec(), false).expect("valid");
            let got: Vec<Vec<u8>> = back.iter().map(|(a, _)| a.to_vec()).collect();
            prop_assert_eq!(got, model.into_iter().collect::<Vec<_>>());
        }
    }

    /// Spare room: inserts keep the stored size until the pairs outgrow
    /// it, a bucket that shrinks below half of it is stored smaller, the
    /// padded bytes read back as the same pairs, and without room (or
    /// past the engine's largest value) the pairs are stored as they are.
    #[test]
    fn spare_room_keeps_the_stored_size() {
        let mut b = PairBuf::new(true);
        b.push(b"first", b"1");
        let stored = |b: &mut PairBuf, room: bool, max: usize| {
            let room = if room { Room::Node } else { Room::None };
            b.write_with(room, max, |bytes: &[u8]| bytes.to_vec())
        };
        let first = stored(&mut b, true, usize::MAX);
        assert_eq!(first.len(), b.bytes().len() + NODE_ROOM_MIN_BYTES);
        assert!(first[b.bytes().len()..].iter().all(|&x| x == 0));
        let mut sizes = vec![first.len()];
        for i in 0..40u32 {
            b.push(format!("element:{i:012}").as_bytes(), b"xxx");
            let s = stored(&mut b, true, usize::MAX);
            assert!(s.len() >= b.bytes().len());
            let back = PairBuf::from_bytes(s.clone(), true).expect("valid");
            assert_eq!(back.bytes(), b.bytes());
            sizes.push(s.len());
        }
        // Most inserts kept the stored size (in-place overwrites).
        let same = sizes.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(same >= 30, "sizes {sizes:?}");
        let big = *sizes.last().expect("sizes");
        for i in 0..35u32 {
            b.remove(format!("element:{i:012}").as_bytes());
        }
        let small = stored(&mut b, true, usize::MAX).len();
        assert!(small < big / 2 + NODE_ROOM_MAX_BYTES && small < big);
        assert_eq!(stored(&mut b, false, usize::MAX).len(), b.bytes().len());
        let exact = b.bytes().len();
        b.push(b"one more", b"v");
        assert_eq!(stored(&mut b, true, exact + 20).len(), b.bytes().len());
        // Room that is not zeros is corruption.
        let mut fresh = PairBuf::new(true);
        fresh.push(b"k", b"v");
        let mut bad = stored(&mut fresh, true, usize::MAX);
        *bad.last_mut().expect("room") = 1;
        assert!(PairBuf::from_bytes(bad, true).is_none());
    }

    #[test]
    fn corrupt_bytes_are_refused() {
        assert!(NodeBuf::from_bytes(vec![]).is_none());
        assert!(NodeBuf::from_bytes(vec![b'L', 1, 0, 0, 0]).is_none());
        assert!(NodeBuf::from_bytes(vec![b'X', 0, 0, 0, 0]).is_none());
        let mut ok = NodeBuf::new(true);
        ok.insert_entry(0, 1.0, b"abc");
        let mut b = ok.bytes().to_vec();
        b.pop();
        assert!(NodeBuf::from_bytes(b).is_none());
        assert!(PairBuf::from_bytes(vec![1, 0, 0, 0, 9, 0, 0, 0], true).is_none());
        assert!(PairBuf::from_bytes(vec![0, 0], false).is_none());
        // Spare room must be zero bytes, at every length and position.
        for room in 0..40usize {
            let mut b = PairBuf::new(false);
            b.push(b"abc", &[]);
            let mut bytes = b.bytes().to_vec();
            bytes.resize(bytes.len() + room, 0);
            assert!(PairBuf::from_bytes(bytes.clone(), false).is_some());
            assert_eq!(
                PairBuf::from_exact_bytes(bytes.clone(), false).is_some(),
                room == 0
            );
            if room > 0 {
                let at = bytes.len() - 1 - room / 2;
                bytes[at] = 1;
                assert!(PairBuf::from_bytes(bytes, false).is_none(), "room {room}");
            }
        }
    }

    /// `insert_nth` puts a pair before pair j (after the last for j >=
    /// len), as `Vec::insert` does, with and without values.
    #[test]
    fn insert_nth_matches_a_vec() {
        for values in [false, true] {
            let mut b = PairBuf::new(values);
            let mut model: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            for i in 0..50u32 {
                let j = (i as usize * 7) % (model.len() + 2);
                let e = format!("m{i}").into_bytes();
                let v = if values {
                    vec![b'v'; i as usize % 5]
                } else {
                    Vec::new()
                };
                b.insert_nth(j, &e, &v);
                model.insert(j.min(model.len()), (e, v));
                let got: Vec<(Vec<u8>, Vec<u8>)> =
                    b.iter().map(|(a, v)| (a.to_vec(), v.to_vec())).collect();
                assert_eq!(got, model);
            }
            assert!(PairBuf::from_exact_bytes(b.bytes().to_vec(), values).is_some());
        }
    }
}
