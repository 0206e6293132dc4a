//! Lists in the log: a root item at the key and a run of chunk items.
//!
//! ```text
//!  user key K ── flags LIST_FLAGS ── ROOT_MAGIC | 'l' | id | len | nchunks | first   (coll's root)
//!  0xFF 0x00 'i' id                ── 'l' | K                    (instance record, as coll's)
//!  0xFF 0x00 'n' id first          ── chunk: n | (len elem)*     the head of the list
//!  0xFF 0x00 'n' id first+1        ── chunk                      ...
//!  0xFF 0x00 'n' id first+nchunks-1 ─ chunk                      the tail
//! ```
//!
//! Redis's quicklist, with engine items for nodes: chunks are numbered
//! consecutively, the first of a new list in the middle of the u32 range
//! ([`FIRST_CHUNK`]), so the list grows either way by a new number. Every
//! chunk holds at least one element and at most [`CHUNK_MAX_ELEMS`]
//! elements (or [`CHUNK_MAX_BYTES`] bytes) when it is filled by a push.
//!
//! Costs, with c = [`CHUNK_MAX_ELEMS`]:
//!
//! * LPUSH/RPUSH/LPOP/RPOP: the root and the end chunk: O(1) items. A
//!   chunk is stored with spare room (`crate::packed`), so under Nibble-2
//!   most pushes and pops overwrite it in place rather than append a new
//!   copy for compaction to clean (as the fixed-size root always is).
//! * LINDEX/LSET/LRANGE: walk chunks from the nearer end, O(i / c) item
//!   reads (Redis: O(i) node hops).
//! * LTRIM: pops from both ends, O(removed).
//! * LREM, LINSERT: read the list, change it, write it back as full chunks:
//!   O(n), as in Redis (which is O(n) to find the element).
//!
//! A list never stored empty: the last pop deletes the root, the chunks
//! and the instance record. Reclaiming, atomicity and the sweeper are
//! `coll`'s (same root layout, same node keys): a list command runs under
//! its key's stripe; the root is written last with `IfVersion`.

use std::collections::HashMap;

use nibble::{Condition, Expiry, PutOptions};

use crate::coll::{
    decode_root, drop_nodes, encode_root, instance_key, new_id, node_key, put_node, Kind, Root,
    ROOT_READ_BYTES,
};
use crate::commands::{is_race, CmdError, WRONGTYPE};
use crate::engine::Engine;
use crate::packed::{give_buf, take_buf, PairBuf};
use crate::types::LIST_FLAGS;

/// Most elements a push puts in one chunk.
pub const CHUNK_MAX_ELEMS: usize = 64;
/// Most bytes a push puts in one chunk (one larger element gets a chunk
/// of its own).
pub const CHUNK_MAX_BYTES: usize = 8 << 10;
/// Number of the first chunk of a new list.
pub const FIRST_CHUNK: u32 = 1 << 31;
/// Capacity of a fresh chunk read buffer: a chunk of short elements fits,
/// so neither the read nor a push reallocates.
const CHUNK_READ_BYTES: usize = 2048;

/// One list, opened by one command (under its key's stripe).
pub struct List<'e> {
    store: &'e Engine,
    key: Vec<u8>,
    version: Option<u64>,
    root: Root,
    /// The instance record is still to be written.
    fresh: bool,
    /// Chunks read or written (their items' bytes, patched in place:
    /// `crate::packed`), and whether changed.
    cache: HashMap<u32, (PairBuf, bool)>,
    /// Chunk numbers to delete at commit.
    dropped: Vec<u32>,
    dirty: bool,
}

fn corrupt() -> CmdError {
    CmdError::from("ERR corrupt list value")
}

/// The list at `key`: `Ok(None)` if absent, WRONGTYPE for another type.
pub fn open<'e>(store: &'e Engine, key: &[u8]) -> Result<Option<List<'e>>, CmdError> {
    let mut buf = take_buf(ROOT_READ_BYTES);
    let Some(m) = store.get_into(key, &mut buf)? else {
        give_buf(buf);
        return Ok(None);
    };
    if m.flags != LIST_FLAGS {
        return Err(WRONGTYPE.into());
    }
    let (kind, root) = decode_root(&buf).ok_or_else(corrupt)?;
    give_buf(buf);
    if kind != Kind::List {
        return Err(corrupt());
    }
    Ok(Some(List {
        store,
        key: key.to_vec(),
        version: Some(m.version),
        root,
        fresh: false,
        cache: HashMap::new(),
        dropped: Vec::new(),
        dirty: false,
    }))
}

/// [`open`], or a new empty list.
pub fn open_or_new<'e>(store: &'e Engine, key: &[u8]) -> Result<List<'e>, CmdError> {
    Ok(match open(store, key)? {
        Some(l) => l,
        None => List {
            store,
            key: key.to_vec(),
            version: None,
            root: Root {
                id: new_id(),
                count: 0,
                nbuckets: 0,
                first: FIRST_CHUNK,
            },
            fresh: true,
            cache: HashMap::new(),
            dropped: Vec::new(),
            dirty: false,
        },
    })
}

impl Drop for List<'_> {
    /// The chunks' buffers go back to the thread's pool.
    fn drop(&mut self) {
        for (_, (items, _)) in self.cache.drain() {
            give_buf(items.into_bytes());
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
        self.root.first.wrapping_add(self.root.nbuckets - 1)
    }

    /// Chunk `c`, loaded into the cache.
    fn chunk(&mut self, c: u32) -> Result<&mut (PairBuf, bool), CmdError> {
        use std::collections::hash_map::Entry;
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

    fn room(items: &PairBuf, e: &[u8]) -> bool {
        items.len() < CHUNK_MAX_ELEMS && items.payload_bytes() + e.len() <= CHUNK_MAX_BYTES
    }

    fn chunk_of(e: &[u8]) -> PairBuf {
        let mut c = PairBuf::new(false);
        c.push(e, &[]);
        c
    }

    /// LPUSH one element.
    pub fn push_front(&mut self, e: &[u8]) -> Result<(), CmdError> {
        self.dirty = true;
        self.root.count += 1;
        if self.root.nbuckets > 0 {
            let first = self.root.first;
            let (items, dirty) = self.chunk(first)?;
            if Self::room(items, e) {
                items.push_front(e, &[]);
                *dirty = true;
                return Ok(());
            }
            self.root.first = first.wrapping_sub(1);
        }
        self.root.nbuckets += 1;
        self.cache
            .insert(self.root.first, (Self::chunk_of(e), true));
        Ok(())
    }

    /// RPUSH one element.
    pub fn push_back(&mut self, e: &[u8]) -> Result<(), CmdError> {
        self.dirty = true;
        self.root.count += 1;
        if self.root.nbuckets > 0 {
            let last = self.last();
            let (items, dirty) = self.chunk(last)?;
            if Self::room(items, e) {
                items.push(e, &[]);
                *dirty = true;
                return Ok(());
            }
        }
        self.root.nbuckets += 1;
        let last = self.last();
        self.cache.insert(last, (Self::chunk_of(e), true));
        Ok(())
    }

    /// LPOP one element.
    pub fn pop_front(&mut self) -> Result<Option<Vec<u8>>, CmdError> {
        if self.is_empty() {
            return Ok(None);
        }
        self.dirty = true;
        self.root.count -= 1;
        let first = self.root.first;
        let (items, dirty) = self.chunk(first)?;
        let e = items.take_nth(0).ok_or_else(corrupt)?;
        *dirty = true;
        if items.is_empty() {
            self.cache.remove(&first);
            self.dropped.push(first);
            self.root.first = first.wrapping_add(1);
            self.root.nbuckets -= 1;
        }
        Ok(Some(e))
    }

    /// RPOP one element.
    pub fn pop_back(&mut self) -> Result<Option<Vec<u8>>, CmdError> {
        if self.is_empty() {
            return Ok(None);
        }
        self.dirty = true;
        self.root.count -= 1;
        let last = self.last();
        let (items, dirty) = self.chunk(last)?;
        let e = items
            .take_nth(items.len().wrapping_sub(1))
            .ok_or_else(corrupt)?;
        *dirty = true;
        if items.is_empty() {
            self.cache.remove(&last);
            self.dropped.push(last);
            self.root.nbuckets -= 1;
        }
        Ok(Some(e))
    }

    /// The chunk and offset of element `i` (< len), walking from the
    /// nearer end.
    fn locate(&mut self, i: u64) -> Result<(u32, usize), CmdError> {
        let n = self.root.nbuckets;
        if i < self.root.count / 2 {
            let mut left = i;
            for k in 0..n {
                let c = self.root.first.wrapping_add(k);
                let len = self.chunk(c)?.0.len() as u64;
                if left < len {
                    return Ok((c, left as usize));
                }
                left -= len;
            }
        } else {
            let mut right = self.root.count - 1 - i;
            for k in (0..n).rev() {
                let c = self.root.first.wrapping_add(k);
                let len = self.chunk(c)?.0.len() as u64;
                if right < len {
                    return Ok((c, (len - 1 - right) as usize));
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
        let (c, o) = self.locate(i)?;
        Ok(Some(self.chunk(c)?.0.nth(o).ok_or_else(corrupt)?.to_vec()))
    }

    /// Replace element `i` (< len).
    pub fn set(&mut self, i: u64, e: &[u8]) -> Result<(), CmdError> {
        let (c, o) = self.locate(i)?;
        let (items, dirty) = self.chunk(c)?;
        items.set_nth(o, e).ok_or_else(corrupt)?;
        *dirty = true;
        self.dirty = true;
        Ok(())
    }

    /// Elements `start..=stop` (both < len, start <= stop).
    pub fn range(&mut self, start: u64, stop: u64) -> Result<Vec<Vec<u8>>, CmdError> {
        let mut out = Vec::with_capacity((stop - start + 1).min(1 << 20) as usize);
        let (mut c, mut o) = self.locate(start)?;
        let mut left = stop - start + 1;
        while left > 0 {
            let items = &self.chunk(c)?.0;
            let take = (items.len().saturating_sub(o) as u64).min(left) as usize;
            if take == 0 {
                return Err(corrupt());
            }
            out.extend(items.iter().skip(o).take(take).map(|(a, _)| a.to_vec()));
            left -= take as u64;
            c = c.wrapping_add(1);
            o = 0;
        }
        Ok(out)
    }

    /// Every element, head first.
    pub fn all(&mut self) -> Result<Vec<Vec<u8>>, CmdError> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        self.range(0, self.root.count - 1)
    }

    /// Make the list `elems` (full chunks from [`FIRST_CHUNK`]).
    pub fn replace_all(&mut self, elems: Vec<Vec<u8>>) {
        for k in 0..self.root.nbuckets {
            self.dropped.push(self.root.first.wrapping_add(k));
        }
        self.cache.clear();
        self.dirty = true;
        self.root.first = FIRST_CHUNK;
        self.root.count = elems.len() as u64;
        self.root.nbuckets = 0;
        let mut cur = PairBuf::new(false);
        for e in elems {
            if !cur.is_empty() && !Self::room(&cur, &e) {
                let c = FIRST_CHUNK.wrapping_add(self.root.nbuckets);
                let full = std::mem::replace(&mut cur, PairBuf::new(false));
                self.cache.insert(c, (full, true));
                self.root.nbuckets += 1;
            }
            cur.push(&e, &[]);
        }
        if !cur.is_empty() {
            let c = FIRST_CHUNK.wrapping_add(self.root.nbuckets);
            self.cache.insert(c, (cur, true));
            self.root.nbuckets += 1;
        }
    }

    /// Write what changed: chunks, then the root last (or delete it all if
    /// empty). `Ok(false)`: the root changed under us; rerun.
    pub fn commit(&mut self) -> Result<bool, CmdError> {
        if !self.dirty {
            return Ok(true);
        }
        let store = self.store;
        if self.root.count == 0 {
            if let Some(v) = self.version {
                match store.delete_if(&self.key, Condition::IfVersion(v)) {
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
        if self.fresh {
            let mut rec = vec![Kind::List.tag()];
            rec.extend_from_slice(&self.key);
            store.raw_put_with(&instance_key(self.root.id), &rec, PutOptions::default())?;
            self.fresh = false;
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
        let opts = PutOptions {
            condition: self
                .version
                .map_or(Condition::IfAbsent, Condition::IfVersion),
            expiry: Expiry::Keep,
            flags: LIST_FLAGS,
        };
        match store.put_with(&self.key, &encode_root(Kind::List, &self.root), opts) {
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

/// Run `f` over the list at `key` (new if absent), commit, rerun on a
/// lost race with a writer outside the stripe.
pub fn modify<T>(
    store: &Engine,
    key: &[u8],
    mut f: impl FnMut(&mut List) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    loop {
        let mut l = open_or_new(store, key)?;
        let out = f(&mut l)?;
        if l.commit()? {
            return Ok(out);
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
}
