//! Lists in the log: a root item at the key that holds both ends of the
//! list inline, and a run of chunk items for the middle.
//!
//! ```text
//!  user key K ── flags LIST_FLAGS ── ROOT_MAGIC | 'l' | id | len | nchunks | first   (coll's root)
//!                                    | head bytes u32 | head: n | (len elem)*         the first elements
//!                                    | tail: n | (len elem)* | spare room (zeros)    the last elements
//!  0xFF 0x00 'i' id                ── 'l' | K     instance record (coll's), written with the first chunk
//!  0xFF 0x00 'n' id first          ── chunk: n | (len elem)*     the elements after the head
//!  0xFF 0x00 'n' id first+1        ── chunk                      ...
//!  0xFF 0x00 'n' id first+nchunks-1 ─ chunk                      the elements before the tail
//! ```
//!
//! Redis's quicklist, with engine items for nodes and the two end nodes
//! kept in the root: the list is head ++ chunks ++ tail. Chunks are
//! numbered consecutively, the first of a new list in the middle of the
//! u32 range ([`FIRST_CHUNK`]), so the middle grows either way by a new
//! number. An end holds at most [`INLINE_MAX_ELEMS`] elements and
//! [`INLINE_MAX_BYTES`] bytes; when a push finds its end full, the end
//! becomes a chunk (at `first - 1` or `first + nchunks`) and the element
//! starts a new one; when a pop finds its end empty, the nearest chunk
//! becomes the end (its item is deleted). An element larger than an end
//! may hold gets a chunk of its own, and a chunk that does not fit an end
//! (one such element, or a chunk of a store written with larger chunks)
//! is popped from in place. A root of coll's 26 bytes alone is a list
//! with empty ends.
//!
//! Costs, with c = [`INLINE_MAX_ELEMS`]:
//!
//! * LPUSH/RPUSH/LPOP/RPOP: one root read and one root write, plus one
//!   chunk write (push) or one chunk read and delete (pop) per c
//!   operations at that end. Under Nibble-2 the root's read and write
//!   are one engine read-modify-write (`modify_in_place`: one index
//!   lookup, the write in place under the root's bucket lock) whenever
//!   the operation touches the ends alone; the others run unlocked. The root is stored with spare room (in
//!   powers of two: `List::encode_root_into`), so under
//!   Nibble-2 most writes overwrite it in place (same size) rather than
//!   append a new copy for compaction to clean. A list of up to 2c short
//!   elements is the root alone, as Redis's listpack-encoded list is one
//!   allocation.
//! * LINDEX/LSET/LRANGE: walk chunks from the nearer end, O(i / c) item
//!   reads (Redis: O(i) node hops).
//! * LTRIM: pops from both ends, O(removed).
//! * LREM, LINSERT: read the list, change it, write it back as full chunks:
//!   O(n), as in Redis (which is O(n) to find the element).
//!
//! A list never stored empty: the last pop deletes the root, the chunks
//! and the instance record. Reclaiming, atomicity and the sweeper are
//! `coll`'s (same root fields, same node keys): a list command runs under
//! its key's stripe; the chunks are written first, the root last with
//! `IfVersion`, and the instance record before the first chunk.

use std::collections::HashMap;

use nibble::{Condition, Expiry, PutOptions};

use crate::coll::{
    decode_root, drop_nodes, encode_root_into, instance_key, new_id, node_key, put_node, Kind,
    Root, ROOT_BYTES,
};
use crate::commands::{is_race, CmdError, WRONGTYPE};
use crate::engine::Engine;
use crate::packed::{
    give_buf, take_buf, PairBuf, NODE_ROOM_DIVISOR, NODE_ROOM_MAX_BYTES, NODE_ROOM_MIN_BYTES,
};
use crate::types::LIST_FLAGS;

/// Most elements an end of the list (and a chunk filled by pushes) holds.
pub const INLINE_MAX_ELEMS: usize = 64;
/// Most element bytes an end of the list (and a chunk filled by pushes)
/// holds; a larger element gets a chunk of its own. Every push and pop
/// copies the root, both ends included, in and out of the engine: this
/// bounds that copy.
pub const INLINE_MAX_BYTES: usize = 2 << 10;
/// Number of the first chunk of a new list.
pub const FIRST_CHUNK: u32 = 1 << 31;
/// Capacity of a fresh chunk read buffer: a chunk of short elements fits,
/// so neither the read nor a push reallocates.
const CHUNK_READ_BYTES: usize = 2048;
/// Capacity of a fresh root read buffer: a root with two ends of short
/// elements fits.
const LIST_ROOT_READ_BYTES: usize = 1024;
/// Bytes of the head's length field after coll's root fields.
const HEAD_LEN_BYTES: usize = 4;

/// A part of the list: an inline end or a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seg {
    Head,
    Chunk(u32),
    Tail,
}

/// One list, opened by one command (under its key's stripe).
pub struct List<'e> {
    store: &'e Engine,
    key: &'e [u8],
    version: Option<u64>,
    root: Root,
    /// The first elements, stored in the root.
    head: PairBuf,
    /// The last elements, stored in the root.
    tail: PairBuf,
    /// Length of the stored root item, spare room included (0: none).
    root_stored_bytes: usize,
    /// The instance record is known to be written.
    has_instance: bool,
    /// Chunks read or written (their items' bytes, patched in place:
    /// `crate::packed`), and whether changed.
    cache: HashMap<u32, (PairBuf, bool)>,
    /// Chunk numbers to delete at commit.
    dropped: Vec<u32>,
    dirty: bool,
    /// Opened under the root's bucket lock ([`modify_in_place`]): no
    /// chunk may be read from the engine.
    locked: bool,
    /// A chunk read was refused because of `locked`: the command reruns
    /// on the unlocked path.
    needs_engine: bool,
}

fn corrupt() -> CmdError {
    CmdError::from("ERR corrupt list value")
}

/// `b` as a pooled [`PairBuf`] (nothing may follow the last element).
fn pairs_of(b: &[u8]) -> Option<PairBuf> {
    let mut v = take_buf(b.len());
    v.extend_from_slice(b);
    PairBuf::from_exact_bytes(v, false)
}

/// A list root's fields and ends, from the root item's bytes `b` (a
/// pooled buffer, which becomes the tail's: the tail is moved to its
/// front, so an open copies the head alone); `None` if `b` is not a list
/// root or its counts disagree (every chunk holds at least one element).
fn decode_list_root(mut b: Vec<u8>) -> Option<(Root, PairBuf, PairBuf)> {
    let (_, root) = decode_root(&b).filter(|(k, _)| *k == Kind::List)?;
    let (head, tail) = if b.len() <= ROOT_BYTES {
        give_buf(b);
        (PairBuf::new(false), PairBuf::new(false))
    } else {
        let (head, split) = decode_head(&b)?;
        b.copy_within(split.., 0);
        b.truncate(b.len() - split);
        (head, PairBuf::from_bytes(b, false)?)
    };
    let ends = (head.len() + tail.len()) as u64;
    let ok = if root.nbuckets == 0 {
        root.count == ends
    } else {
        root.count >= ends + u64::from(root.nbuckets)
    };
    ok.then_some((root, head, tail))
}

/// The head of a list root with ends (`b` longer than coll's fields), as
/// a pooled copy, and the offset in `b` where the tail starts.
fn decode_head(b: &[u8]) -> Option<(PairBuf, usize)> {
    let rest = b.get(ROOT_BYTES..)?;
    let hl = u32::from_le_bytes(rest.get(..HEAD_LEN_BYTES)?.try_into().ok()?) as usize;
    let split = HEAD_LEN_BYTES.checked_add(hl)?;
    let head = pairs_of(rest.get(HEAD_LEN_BYTES..split)?)?;
    Some((head, ROOT_BYTES + split))
}

/// The list at `key`: `Ok(None)` if absent, WRONGTYPE for another type.
pub fn open<'e>(store: &'e Engine, key: &'e [u8]) -> Result<Option<List<'e>>, CmdError> {
    let mut buf = take_buf(LIST_ROOT_READ_BYTES);
    let Some(m) = store.get_into(key, &mut buf)? else {
        give_buf(buf);
        return Ok(None);
    };
    if m.flags != LIST_FLAGS {
        give_buf(buf);
        return Err(WRONGTYPE.into());
    }
    Ok(Some(List::of_root(store, key, m.version, buf)?))
}

/// [`open`], or a new empty list.
pub fn open_or_new<'e>(store: &'e Engine, key: &'e [u8]) -> Result<List<'e>, CmdError> {
    Ok(match open(store, key)? {
        Some(l) => l,
        None => List::new(store, key),
    })
}

impl Drop for List<'_> {
    /// The ends' and chunks' buffers go back to the thread's pool.
    fn drop(&mut self) {
        for (_, (items, _)) in self.cache.drain() {
            give_buf(items.into_bytes());
        }
        give_buf(self.head.take_bytes());
        give_buf(self.tail.take_bytes());
    }
}

impl<'e> List<'e> {
    /// The list whose root item (version `version`) is `buf`, a pooled
    /// buffer the list keeps.
    fn of_root(
        store: &'e Engine,
        key: &'e [u8],
        version: u64,
        buf: Vec<u8>,
    ) -> Result<List<'e>, CmdError> {
        let root_stored_bytes = buf.len();
        let (root, head, tail) = decode_list_root(buf).ok_or_else(corrupt)?;
        Ok(List {
            store,
            key,
            version: Some(version),
            root,
            head,
            tail,
            root_stored_bytes,
            has_instance: root.nbuckets > 0,
            cache: HashMap::new(),
            dropped: Vec::new(),
            dirty: false,
            locked: false,
            needs_engine: false,
        })
    }

    /// A new empty list at `key`, not stored yet.
    fn new(store: &'e Engine, key: &'e [u8]) -> List<'e> {
        List {
            store,
            key,
            version: None,
            root: Root {
                id: new_id(),
                count: 0,
                nbuckets: 0,
                first: FIRST_CHUNK,
            },
            head: PairBuf::new(false),
            tail: PairBuf::new(false),
            root_stored_bytes: 0,
            has_instance: false,
            cache: HashMap::new(),
            dropped: Vec::new(),
            dirty: false,
            locked: false,
            needs_engine: false,
        }
    }
}

impl List<'_> {
    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.root.count
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.root.count == 0
    }

    fn last(&self) -> u32 {
        self.root
            .first
            .wrapping_add(self.root.nbuckets.wrapping_sub(1))
    }

    /// Chunk `c`, loaded into the cache.
    fn chunk(&mut self, c: u32) -> Result<&mut (PairBuf, bool), CmdError> {
        use std::collections::hash_map::Entry;
        if self.locked && !self.cache.contains_key(&c) {
            self.needs_engine = true;
            return Err(corrupt());
        }
        match self.cache.entry(c) {
            Entry::Occupied(o) => Ok(o.into_mut()),
            Entry::Vacant(v) => {
                let mut data = take_buf(CHUNK_READ_BYTES);
                let items = match self
                    .store
                    .raw_get_into(&node_key(self.root.id, c), &mut data)?
                {
                    Some(_) => PairBuf::from_bytes(data, false).ok_or_else(corrupt)?,
                    None => return Err(corrupt()),
                };
                Ok(v.insert((items, false)))
            }
        }
    }

    /// The elements of part `s`; a chunk is marked changed if `write`.
    fn seg(&mut self, s: Seg, write: bool) -> Result<&mut PairBuf, CmdError> {
        Ok(match s {
            Seg::Head => &mut self.head,
            Seg::Tail => &mut self.tail,
            Seg::Chunk(c) => {
                let (items, dirty) = self.chunk(c)?;
                *dirty |= write;
                items
            }
        })
    }

    /// The part after `s`, head to tail.
    fn next_seg(&self, s: Seg) -> Option<Seg> {
        match s {
            Seg::Head if self.root.nbuckets > 0 => Some(Seg::Chunk(self.root.first)),
            Seg::Head => Some(Seg::Tail),
            Seg::Chunk(c) if c == self.last() => Some(Seg::Tail),
            Seg::Chunk(c) => Some(Seg::Chunk(c.wrapping_add(1))),
            Seg::Tail => None,
        }
    }

    /// Whether `e` joins an end holding `items`.
    fn fits(items: &PairBuf, e: &[u8]) -> bool {
        e.len() <= INLINE_MAX_BYTES
            && items.len() < INLINE_MAX_ELEMS
            && items.payload_bytes() + e.len() <= INLINE_MAX_BYTES
    }

    /// Whether a chunk holding `items` may become an end.
    fn inlinable(items: &PairBuf) -> bool {
        items.len() <= INLINE_MAX_ELEMS && items.payload_bytes() <= INLINE_MAX_BYTES
    }

    fn chunk_of(e: &[u8]) -> PairBuf {
        let mut c = PairBuf::new(false);
        c.push(e, &[]);
        c
    }

    /// A new chunk before the first one.
    fn add_front_chunk(&mut self, items: PairBuf) {
        self.root.first = self.root.first.wrapping_sub(1);
        self.root.nbuckets += 1;
        self.cache.insert(self.root.first, (items, true));
    }

    /// A new chunk after the last one.
    fn add_back_chunk(&mut self, items: PairBuf) {
        self.root.nbuckets += 1;
        let last = self.last();
        self.cache.insert(last, (items, true));
    }

    /// Forget chunk `c` (emptied or moved into an end): its item is
    /// deleted at commit.
    fn drop_chunk(&mut self, c: u32) -> Option<PairBuf> {
        self.dropped.push(c);
        self.root.nbuckets -= 1;
        self.cache.remove(&c).map(|(items, _)| items)
    }

    /// LPUSH one element.
    pub fn push_front(&mut self, e: &[u8]) -> Result<(), CmdError> {
        self.dirty = true;
        self.root.count += 1;
        if Self::fits(&self.head, e) {
            self.head.push_front(e, &[]);
            return Ok(());
        }
        if !self.head.is_empty() {
            let full = std::mem::replace(&mut self.head, PairBuf::new(false));
            self.add_front_chunk(full);
        }
        if e.len() > INLINE_MAX_BYTES {
            self.add_front_chunk(Self::chunk_of(e));
        } else {
            self.head.push_front(e, &[]);
        }
        Ok(())
    }

    /// RPUSH one element.
    pub fn push_back(&mut self, e: &[u8]) -> Result<(), CmdError> {
        self.dirty = true;
        self.root.count += 1;
        if Self::fits(&self.tail, e) {
            self.tail.push(e, &[]);
            return Ok(());
        }
        if !self.tail.is_empty() {
            let full = std::mem::replace(&mut self.tail, PairBuf::new(false));
            self.add_back_chunk(full);
        }
        if e.len() > INLINE_MAX_BYTES {
            self.add_back_chunk(Self::chunk_of(e));
        } else {
            self.tail.push(e, &[]);
        }
        Ok(())
    }

    /// LPOP one element.
    pub fn pop_front(&mut self) -> Result<Option<Vec<u8>>, CmdError> {
        if self.is_empty() {
            return Ok(None);
        }
        self.dirty = true;
        self.root.count -= 1;
        if self.head.is_empty() && self.root.nbuckets > 0 {
            let first = self.root.first;
            let (items, dirty) = self.chunk(first)?;
            if !Self::inlinable(items) {
                let e = items.take_nth(0).ok_or_else(corrupt)?;
                *dirty = true;
                if items.is_empty() {
                    self.root.first = first.wrapping_add(1);
                    if let Some(b) = self.drop_chunk(first) {
                        give_buf(b.into_bytes());
                    }
                }
                return Ok(Some(e));
            }
            self.root.first = first.wrapping_add(1);
            let items = self.drop_chunk(first).ok_or_else(corrupt)?;
            give_buf(std::mem::replace(&mut self.head, items).into_bytes());
        }
        let end = if self.head.is_empty() {
            &mut self.tail
        } else {
            &mut self.head
        };
        end.take_nth(0).ok_or_else(corrupt).map(Some)
    }

    /// RPOP one element.
    pub fn pop_back(&mut self) -> Result<Option<Vec<u8>>, CmdError> {
        if self.is_empty() {
            return Ok(None);
        }
        self.dirty = true;
        self.root.count -= 1;
        if self.tail.is_empty() && self.root.nbuckets > 0 {
            let last = self.last();
            let (items, dirty) = self.chunk(last)?;
            if !Self::inlinable(items) {
                let e = items
                    .take_nth(items.len().wrapping_sub(1))
                    .ok_or_else(corrupt)?;
                *dirty = true;
                if items.is_empty() {
                    if let Some(b) = self.drop_chunk(last) {
                        give_buf(b.into_bytes());
                    }
                }
                return Ok(Some(e));
            }
            let items = self.drop_chunk(last).ok_or_else(corrupt)?;
            give_buf(std::mem::replace(&mut self.tail, items).into_bytes());
        }
        let end = if self.tail.is_empty() {
            &mut self.head
        } else {
            &mut self.tail
        };
        end.take_nth(end.len().wrapping_sub(1))
            .ok_or_else(corrupt)
            .map(Some)
    }

    /// The part and offset of element `i` (< len); the chunks are walked
    /// from the nearer end.
    fn locate(&mut self, i: u64) -> Result<(Seg, usize), CmdError> {
        if i >= self.root.count {
            return Err(corrupt());
        }
        let (h, t) = (self.head.len() as u64, self.tail.len() as u64);
        if i < h {
            return Ok((Seg::Head, i as usize));
        }
        let mid = self.root.count.checked_sub(h + t).ok_or_else(corrupt)?;
        if i >= h + mid {
            return Ok((Seg::Tail, (i - h - mid) as usize));
        }
        let j = i - h;
        let n = self.root.nbuckets;
        if j < mid / 2 {
            let mut left = j;
            for k in 0..n {
                let c = self.root.first.wrapping_add(k);
                let len = self.chunk(c)?.0.len() as u64;
                if left < len {
                    return Ok((Seg::Chunk(c), left as usize));
                }
                left -= len;
            }
        } else {
            let mut right = mid - 1 - j;
            for k in (0..n).rev() {
                let c = self.root.first.wrapping_add(k);
                let len = self.chunk(c)?.0.len() as u64;
                if right < len {
                    return Ok((Seg::Chunk(c), (len - 1 - right) as usize));
                }
                right -= len;
            }
        }
        Err(corrupt())
    }

    /// Element `i` (0-based from the head), if `i < len`.
    pub fn get(&mut self, i: u64) -> Result<Option<Vec<u8>>, CmdError> {
        if i >= self.root.count {
            return Ok(None);
        }
        let (s, o) = self.locate(i)?;
        Ok(Some(
            self.seg(s, false)?.nth(o).ok_or_else(corrupt)?.to_vec(),
        ))
    }

    /// Replace element `i` (< len).
    pub fn set(&mut self, i: u64, e: &[u8]) -> Result<(), CmdError> {
        let (s, o) = self.locate(i)?;
        self.seg(s, true)?.set_nth(o, e).ok_or_else(corrupt)?;
        self.dirty = true;
        Ok(())
    }

    /// Elements `start..=stop` (both < len, start <= stop).
    pub fn range(&mut self, start: u64, stop: u64) -> Result<Vec<Vec<u8>>, CmdError> {
        let mut out = Vec::with_capacity((stop - start + 1).min(1 << 20) as usize);
        let (mut s, mut o) = self.locate(start)?;
        let mut left = stop - start + 1;
        loop {
            let items = self.seg(s, false)?;
            let take = (items.len().saturating_sub(o) as u64).min(left) as usize;
            out.extend(items.iter().skip(o).take(take).map(|(a, _)| a.to_vec()));
            left -= take as u64;
            if left == 0 {
                return Ok(out);
            }
            s = self.next_seg(s).ok_or_else(corrupt)?;
            o = 0;
        }
    }

    /// Every element, head first.
    pub fn all(&mut self) -> Result<Vec<Vec<u8>>, CmdError> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        self.range(0, self.root.count - 1)
    }

    /// Make the list `elems`: the root alone if they fit one end, else
    /// full chunks from [`FIRST_CHUNK`] and empty ends.
    pub fn replace_all(&mut self, elems: Vec<Vec<u8>>) {
        for k in 0..self.root.nbuckets {
            self.dropped.push(self.root.first.wrapping_add(k));
        }
        for (_, (items, _)) in self.cache.drain() {
            give_buf(items.into_bytes());
        }
        self.dirty = true;
        self.root.first = FIRST_CHUNK;
        self.root.count = elems.len() as u64;
        self.root.nbuckets = 0;
        let mut parts: Vec<PairBuf> = Vec::new();
        let mut cur = PairBuf::new(false);
        for e in elems {
            if !cur.is_empty() && !Self::fits(&cur, &e) {
                parts.push(std::mem::replace(&mut cur, PairBuf::new(false)));
            }
            cur.push(&e, &[]);
        }
        if !cur.is_empty() {
            parts.push(cur);
        }
        self.head = PairBuf::new(false);
        self.tail = PairBuf::new(false);
        if parts.len() == 1 && Self::inlinable(&parts[0]) {
            self.head = parts.remove(0);
        }
        for p in parts {
            self.add_back_chunk(p);
        }
    }

    /// The root's bytes into `out`: coll's fields, the head's length, the
    /// head, the tail, then (where the engine overwrites in place) spare
    /// room, so that most pushes and pops keep the item's size: the
    /// stored length while the root fits it and fills at least half of
    /// it, else the root's length plus a node's room (`crate::packed`)
    /// rounded up to a power of two. The rounding is for elements of a
    /// hundred bytes and more, where a node's room (a quarter, at least
    /// 64 bytes) holds no second element and every push would append a
    /// new copy of the root: in powers of two, a list growing from one
    /// element appends its root about log2(n) times, and one going up and
    /// down by an element at a time (a queue) almost never.
    fn encode_root_into(&self, out: &mut Vec<u8>) {
        encode_root_into(Kind::List, &self.root, out);
        out.extend_from_slice(&(self.head.bytes().len() as u32).to_le_bytes());
        out.extend_from_slice(self.head.bytes());
        out.extend_from_slice(self.tail.bytes());
        if !self.store.overwrites_in_place() {
            return;
        }
        let len = out.len();
        let stored = self.root_stored_bytes;
        let want = if len <= stored && len >= stored / 2 {
            stored
        } else {
            (len + (len / NODE_ROOM_DIVISOR).clamp(NODE_ROOM_MIN_BYTES, NODE_ROOM_MAX_BYTES))
                .next_power_of_two()
        };
        let max = usize::try_from(self.store.max_value_bytes()).unwrap_or(usize::MAX);
        if want <= max {
            out.resize(want, 0);
        }
    }

    /// Write what changed: the instance record (with the first chunk),
    /// chunks, then the root last (or delete it all if empty).
    /// `Ok(false)`: the root changed under us; rerun.
    pub fn commit(&mut self) -> Result<bool, CmdError> {
        if !self.dirty {
            return Ok(true);
        }
        let store = self.store;
        if self.root.count == 0 {
            if let Some(v) = self.version {
                match store.delete_if(self.key, Condition::IfVersion(v)) {
                    Ok(()) => {}
                    Err(e) if is_race(&e) => return Ok(false),
                    Err(e) => return Err(e.into()),
                }
            }
            for c in self.dropped.drain(..) {
                store.raw_delete(&node_key(self.root.id, c))?;
            }
            drop_nodes(store, &self.root)?;
            self.dirty = false;
            return Ok(true);
        }
        if self.root.nbuckets > 0 && !self.has_instance {
            let mut rec = vec![Kind::List.tag()];
            rec.extend_from_slice(self.key);
            store.raw_put_with(&instance_key(self.root.id), &rec, PutOptions::default())?;
            crate::coll::note_large_created();
            self.has_instance = true;
        }
        for c in self.dropped.drain(..) {
            if !self.cache.contains_key(&c) {
                store.raw_delete(&node_key(self.root.id, c))?;
            }
        }
        for (c, (items, dirty)) in self.cache.iter_mut() {
            if !*dirty {
                continue;
            }
            put_node(store, &node_key(self.root.id, *c), items)?;
            *dirty = false;
        }
        let opts = root_put_options(self.version);
        let mut buf = take_buf(LIST_ROOT_READ_BYTES);
        self.encode_root_into(&mut buf);
        let put = store.put_with(self.key, &buf, opts);
        let stored = buf.len();
        give_buf(buf);
        match put {
            Ok(ver) => {
                self.version = Some(ver);
                self.root_stored_bytes = stored;
                self.dirty = false;
                Ok(true)
            }
            Err(e) if is_race(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// How a list root is written: over the version it was read at (new if
/// `None`), keeping the key's TTL.
fn root_put_options(version: Option<u64>) -> PutOptions {
    PutOptions {
        condition: version.map_or(Condition::IfAbsent, Condition::IfVersion),
        expiry: Expiry::Keep,
        flags: LIST_FLAGS,
    }
}

/// What `f` left inside [`modify_in_place`]'s read-modify-write.
enum Ran<T> {
    /// The new root is in the buffer: stored in place, or still to
    /// append.
    Encoded(T),
    /// Nothing to write.
    Finished(InPlace<T>),
}

/// What [`modify_in_place`] did.
enum InPlace<T> {
    /// `f` ran and its changes are stored (or it changed nothing).
    Done(T),
    /// No list at the key (and none to create).
    Absent,
    /// `f` needs more than the root (a chunk, a delete): run it again on
    /// the unlocked path.
    Unlocked,
    /// `f` or the open failed; nothing was written.
    Failed(CmdError),
}

/// Run `f` over the list at `key` (new if absent and `create`) inside
/// one engine read-modify-write of the root (`Engine::read_modify_write`):
/// a push or pop that touches only the ends in the root is one index
/// lookup and one write in place, with no version check to lose. `f`
/// runs under the root's bucket lock, so a chunk read makes it give up
/// (`InPlace::Unlocked`), as does a change that would write or delete
/// other items (a new or emptied chunk, an empty list). A root that no
/// longer fits its item is appended with `put_with` conditioned on the
/// version read; a lost race there is `Unlocked` as well.
fn modify_in_place<T>(
    store: &Engine,
    key: &[u8],
    create: bool,
    f: &mut impl FnMut(&mut List) -> Result<T, CmdError>,
) -> Result<InPlace<T>, CmdError> {
    let mut buf = take_buf(LIST_ROOT_READ_BYTES);
    let rmw = store.read_modify_write(key, &mut buf, |old, buf| {
        let opened = match old {
            None if !create => return (Ran::Finished(InPlace::Absent), false),
            None => Ok(List::new(store, key)),
            Some(m) if m.flags != LIST_FLAGS => Err(CmdError::from(WRONGTYPE)),
            Some(m) => {
                let root = std::mem::replace(buf, take_buf(LIST_ROOT_READ_BYTES));
                List::of_root(store, key, m.version, root)
            }
        };
        let mut l = match opened {
            Ok(l) => l,
            Err(e) => return (Ran::Finished(InPlace::Failed(e)), false),
        };
        l.locked = true;
        let r = f(&mut l);
        if l.needs_engine {
            return (Ran::Finished(InPlace::Unlocked), false);
        }
        match r {
            Err(e) => (Ran::Finished(InPlace::Failed(e)), false),
            Ok(out) if !l.dirty => (Ran::Finished(InPlace::Done(out)), false),
            Ok(_) if l.root.count == 0 || !l.cache.is_empty() || !l.dropped.is_empty() => {
                (Ran::Finished(InPlace::Unlocked), false)
            }
            Ok(out) => {
                buf.clear();
                l.encode_root_into(buf);
                (Ran::Encoded(out), true)
            }
        }
    });
    let out = match rmw {
        Ok(r) => match r.out {
            Ran::Encoded(out) if r.written.is_none() => {
                match store.put_with(key, &buf, root_put_options(r.old.map(|m| m.version))) {
                    Ok(_) => Ok(InPlace::Done(out)),
                    Err(e) if is_race(&e) => Ok(InPlace::Unlocked),
                    Err(e) => Err(e.into()),
                }
            }
            Ran::Encoded(out) => Ok(InPlace::Done(out)),
            Ran::Finished(out) => Ok(out),
        },
        Err(e) => Err(e.into()),
    };
    give_buf(buf);
    out
}

/// Run `f` over the list at `key` (new if absent), commit, rerun on a
/// lost race with a writer outside the stripe. Where the engine
/// overwrites in place, a change to the ends alone is one
/// `modify_in_place`.
pub fn modify<T>(
    store: &Engine,
    key: &[u8],
    mut f: impl FnMut(&mut List) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    if store.overwrites_in_place() {
        match modify_in_place(store, key, true, &mut f)? {
            InPlace::Done(out) => return Ok(out),
            InPlace::Failed(e) => return Err(e),
            InPlace::Absent | InPlace::Unlocked => {}
        }
    }
    loop {
        let mut l = open_or_new(store, key)?;
        let out = f(&mut l)?;
        if l.commit()? {
            return Ok(out);
        }
    }
}

/// [`modify`] of the list at `key` if present (`Ok(None)` if absent):
/// one root read for a command that creates nothing (a pop).
pub fn modify_existing<T>(
    store: &Engine,
    key: &[u8],
    mut f: impl FnMut(&mut List) -> Result<T, CmdError>,
) -> Result<Option<T>, CmdError> {
    if store.overwrites_in_place() {
        match modify_in_place(store, key, false, &mut f)? {
            InPlace::Done(out) => return Ok(Some(out)),
            InPlace::Absent => return Ok(None),
            InPlace::Failed(e) => return Err(e),
            InPlace::Unlocked => {}
        }
    }
    loop {
        let Some(mut l) = open(store, key)? else {
            return Ok(None);
        };
        let out = f(&mut l)?;
        if l.commit()? {
            return Ok(Some(out));
        }
    }
}

/// Run `f` over the list at `key` if present.
pub fn read<T>(
    store: &Engine,
    key: &[u8],
    f: impl FnOnce(&mut List) -> Result<T, CmdError>,
) -> Result<Option<T>, CmdError> {
    match open(store, key)? {
        Some(mut l) => Ok(Some(f(&mut l)?)),
        None => Ok(None),
    }
}

/// Every element of the list at `key` (DUMP-like callers, COPY).
pub fn load_all(store: &Engine, key: &[u8]) -> Result<Option<Vec<Vec<u8>>>, CmdError> {
    read(store, key, |l| l.all())
}

/// A new list at the free key `key` holding `elems` (COPY).
pub fn create(store: &Engine, key: &[u8], elems: &[Vec<u8>]) -> Result<(), CmdError> {
    let mut l = open_or_new(store, key)?;
    l.replace_all(elems.to_vec());
    if !l.commit()? {
        return Err("ERR the key changed while it was written".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::encode_root;
    use std::collections::VecDeque;

    /// Random pushes, pops, sets, rewrites against a `VecDeque` model,
    /// long enough to span many chunks in both directions; every other
    /// round on a Nibble-2 store, where chunks carry spare room and are
    /// overwritten in place.
    #[test]
    fn lists_match_a_model() {
        use proptest::prelude::*;
        let stores = crate::coll::tests::both_modes();
        let op = (0u8..7, 0u32..1000, 0usize..200);
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 16,
            failure_persistence: None,
            ..Default::default()
        });
        let round = std::cell::Cell::new(0u32);
        runner
            .run(&proptest::collection::vec(op, 1..600), |ops| {
                round.set(round.get() + 1);
                let store = &stores[round.get() as usize % 2];
                let key = format!("l{}", round.get()).into_bytes();
                let mut model: VecDeque<Vec<u8>> = VecDeque::new();
                for &(o, x, size) in &ops {
                    // Now and then an element larger than an end holds.
                    let size = if x % 17 == 0 { size * 15 } else { size };
                    let e = vec![b'a' + (x % 26) as u8; size];
                    let mut l = open_or_new(store, &key).unwrap();
                    match o {
                        0 | 1 => {
                            l.push_front(&e).unwrap();
                            model.push_front(e);
                        }
                        2 => {
                            l.push_back(&e).unwrap();
                            model.push_back(e);
                        }
                        3 => prop_assert_eq!(l.pop_front().unwrap(), model.pop_front()),
                        4 => prop_assert_eq!(l.pop_back().unwrap(), model.pop_back()),
                        5 if !model.is_empty() => {
                            let i = x as usize % model.len();
                            l.set(i as u64, &e).unwrap();
                            model[i] = e;
                        }
                        _ => {
                            if x % 10 == 0 {
                                let v: Vec<_> = model.iter().cloned().collect();
                                l.replace_all(v);
                            }
                        }
                    }
                    prop_assert!(l.commit().unwrap());
                    match open(store, &key).unwrap() {
                        None => prop_assert!(model.is_empty()),
                        Some(mut l) => {
                            prop_assert_eq!(l.len(), model.len() as u64);
                            let want: Vec<_> = model.iter().cloned().collect();
                            prop_assert_eq!(l.all().unwrap(), want);
                            let i = x as u64 % l.len();
                            prop_assert_eq!(l.get(i).unwrap(), Some(model[i as usize].clone()));
                        }
                    }
                }
                crate::coll::delete_key(store, &key).unwrap();
                let (_, keys) = store.raw_scan(0, 1 << 16).unwrap();
                prop_assert!(keys.iter().all(|k| !crate::engine::is_internal_key(k)));
                Ok(())
            })
            .unwrap();
    }

    /// Internal keys in `store` (chunks and instance records).
    fn internal_keys(store: &Engine) -> usize {
        let (_, keys) = store.raw_scan(0, 1 << 16).unwrap();
        keys.iter()
            .filter(|k| crate::engine::is_internal_key(k))
            .count()
    }

    /// A short list is its root alone; pushes past both ends' room spill
    /// chunks, pops take them back, and popping everything leaves no
    /// internal item.
    #[test]
    fn ends_live_in_the_root_and_spill_into_chunks() {
        for store in &crate::coll::tests::both_modes() {
            let key = b"ends".to_vec();
            let mut model: VecDeque<Vec<u8>> = VecDeque::new();
            for i in 0..2 * INLINE_MAX_ELEMS {
                let e = format!("e{i}").into_bytes();
                modify(store, &key, |l| {
                    if i % 2 == 0 {
                        l.push_front(&e)
                    } else {
                        l.push_back(&e)
                    }
                })
                .unwrap();
                if i % 2 == 0 {
                    model.push_front(e);
                } else {
                    model.push_back(e);
                }
            }
            assert_eq!(internal_keys(store), 0, "two ends' worth is the root alone");
            for i in 0..10 * INLINE_MAX_ELEMS {
                let e = format!("f{i}").into_bytes();
                modify(store, &key, |l| l.push_front(&e)).unwrap();
                model.push_front(e);
            }
            // Chunks and the instance record.
            assert!(internal_keys(store) > 10);
            let want: Vec<_> = model.iter().cloned().collect();
            assert_eq!(load_all(store, &key).unwrap().unwrap(), want);
            let mut n = 0;
            while let Some(e) = modify_existing(store, &key, |l| {
                if n % 3 == 0 {
                    l.pop_front()
                } else {
                    l.pop_back()
                }
            })
            .unwrap()
            .flatten()
            {
                let m = if n % 3 == 0 {
                    model.pop_front()
                } else {
                    model.pop_back()
                };
                assert_eq!(Some(e), m);
                n += 1;
            }
            assert!(model.is_empty());
            assert!(open(store, &key).unwrap().is_none());
            assert_eq!(internal_keys(store), 0);
            assert_eq!(
                modify_existing(store, &key, |l| l.pop_front()).unwrap(),
                None
            );
        }
    }

    /// Pushes and pops through `modify`/`modify_existing` (on Nibble-2 a
    /// read-modify-write of the root in place where the ends suffice, the
    /// unlocked path where a chunk is read, written or dropped, or the
    /// root outgrows its item) against a model; the key's TTL survives
    /// every write, a push onto another type is WRONGTYPE and changes
    /// nothing, and the last pop leaves no item.
    #[test]
    fn pushes_and_pops_in_place_match_a_model() {
        for store in &crate::coll::tests::both_modes() {
            let key = b"rmw".to_vec();
            let ttl_ms = nibble_now_ms() + 3_600_000;
            let mut model: VecDeque<Vec<u8>> = VecDeque::new();
            let mut x = 0x2545_f491_u64;
            for i in 0..6000u32 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = x >> 33;
                let size = match r % 23 {
                    0 => 3000,
                    1..=8 => 128,
                    _ => (r >> 8) as usize % 40,
                };
                let e = vec![b'a' + (i % 26) as u8; size];
                // Pops a little more often than pushes once the list is
                // long, so it empties and fills again.
                let push = model.len() < 50 || (r >> 20) % 9 < 4;
                if push {
                    let left = (r >> 24).is_multiple_of(2);
                    let n = modify(store, &key, |l| {
                        if left {
                            l.push_front(&e)?;
                        } else {
                            l.push_back(&e)?;
                        }
                        Ok(l.len())
                    })
                    .unwrap();
                    if left {
                        model.push_front(e);
                    } else {
                        model.push_back(e);
                    }
                    assert_eq!(n, model.len() as u64);
                    if model.len() == 1 {
                        assert!(store.set_expiry(&key, Some(ttl_ms)).unwrap());
                    }
                } else {
                    let left = (r >> 24).is_multiple_of(2);
                    let got = modify_existing(store, &key, |l| {
                        if left {
                            l.pop_front()
                        } else {
                            l.pop_back()
                        }
                    })
                    .unwrap()
                    .flatten();
                    let want = if left {
                        model.pop_front()
                    } else {
                        model.pop_back()
                    };
                    assert_eq!(got, want, "pop {i}");
                }
                let meta = store.meta(&key).unwrap();
                assert_eq!(meta.is_some(), !model.is_empty());
                if let Some(m) = meta {
                    assert_eq!(m.expiry_ms, Some(ttl_ms), "TTL kept at {i}");
                }
                if i % 500 == 0 {
                    let want: Vec<_> = model.iter().cloned().collect();
                    assert_eq!(load_all(store, &key).unwrap().unwrap_or_default(), want);
                }
            }
            let want: Vec<_> = model.iter().cloned().collect();
            assert_eq!(load_all(store, &key).unwrap().unwrap_or_default(), want);
            store.put(b"str", b"v").unwrap();
            let e = modify(store, b"str", |l| l.push_front(b"x")).unwrap_err();
            assert_eq!(e, CmdError::from(WRONGTYPE));
            assert!(modify_existing(store, b"str", |l| l.pop_front()).is_err());
            let mut v = Vec::new();
            assert!(store.get_into(b"str", &mut v).unwrap().is_some());
            assert_eq!(v, b"v");
        }
    }

    fn nibble_now_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    }

    /// A root of coll's fields alone over chunks larger than an end (as
    /// a store written with 64-element chunks of up to 8 KiB holds) reads
    /// as a list with empty ends, and pops from both ends match a model.
    #[test]
    fn a_root_without_ends_reads_and_pops_in_place() {
        for store in &crate::coll::tests::both_modes() {
            let key = b"old".to_vec();
            let id = new_id();
            let mut model: VecDeque<Vec<u8>> = VecDeque::new();
            let mut rec = vec![Kind::List.tag()];
            rec.extend_from_slice(&key);
            store
                .raw_put_with(&instance_key(id), &rec, PutOptions::default())
                .unwrap();
            let chunks = 3u32;
            for c in 0..chunks {
                let mut items = PairBuf::new(false);
                for j in 0..INLINE_MAX_ELEMS + 10 {
                    let e = format!("c{c}-{j}-{}", "x".repeat(40)).into_bytes();
                    items.push(&e, &[]);
                    model.push_back(e);
                }
                put_node(store, &node_key(id, FIRST_CHUNK + c), &mut items).unwrap();
            }
            let root = Root {
                id,
                count: model.len() as u64,
                nbuckets: chunks,
                first: FIRST_CHUNK,
            };
            let opts = PutOptions {
                flags: LIST_FLAGS,
                ..PutOptions::default()
            };
            store
                .put_with(&key, &encode_root(Kind::List, &root), opts)
                .unwrap();
            let want: Vec<_> = model.iter().cloned().collect();
            assert_eq!(load_all(store, &key).unwrap().unwrap(), want);
            let mut n = 0u32;
            while !model.is_empty() {
                let front = n.is_multiple_of(2);
                let got = modify_existing(store, &key, |l| {
                    if front {
                        l.pop_front()
                    } else {
                        l.pop_back()
                    }
                })
                .unwrap()
                .flatten();
                let m = if front {
                    model.pop_front()
                } else {
                    model.pop_back()
                };
                assert_eq!(got, m);
                if n.is_multiple_of(25) && !model.is_empty() {
                    let want: Vec<_> = model.iter().cloned().collect();
                    assert_eq!(load_all(store, &key).unwrap().unwrap(), want);
                }
                n += 1;
            }
            assert!(open(store, &key).unwrap().is_none());
            assert_eq!(internal_keys(store), 0);
        }
    }

    /// Roots that are not lists, or whose counts disagree, are refused.
    #[test]
    fn bad_roots_are_corrupt_not_panics() {
        let r = Root {
            id: 1,
            count: 3,
            nbuckets: 0,
            first: FIRST_CHUNK,
        };
        let mut b = encode_root(Kind::List, &r);
        assert!(
            decode_list_root(b.clone()).is_none(),
            "3 elements, none stored"
        );
        let mut head = PairBuf::new(false);
        head.push(b"a", &[]);
        b.extend_from_slice(&(head.bytes().len() as u32).to_le_bytes());
        b.extend_from_slice(head.bytes());
        let mut tail = PairBuf::new(false);
        tail.push(b"b", &[]);
        tail.push(b"c", &[]);
        b.extend_from_slice(tail.bytes());
        b.extend_from_slice(&[0; 40]);
        let (root, h, t) = decode_list_root(b.clone()).unwrap();
        assert_eq!((root.count, h.len(), t.len()), (3, 1, 2));
        for cut in 0..b.len() - 40 {
            let _ = decode_list_root(b[..cut].to_vec());
        }
        let mut bad = b.clone();
        bad[ROOT_BYTES] = 200;
        assert!(decode_list_root(bad).is_none());
        assert!(decode_list_root(encode_root(Kind::Set, &r)).is_none());
    }
}
