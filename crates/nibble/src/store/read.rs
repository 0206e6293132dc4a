//! The read path: GET, metadata and SCAN (dissertation §4.1, §4.3).
//!
//! A read takes no lock: it pins the epoch, reads the key's buckets
//! optimistically ([`crate::index::Index::read`]), copies the object out
//! while it checks the key, and keeps the copy only if the bucket
//! versions did not move meanwhile. The header and the key come in one
//! copy of the object's first 64 bytes ([`ObjectPrefix`]) for the usual
//! object. Every length read from the log is bounded before use, since a
//! racing Nibble-2 overwrite can tear it.
use super::*;

/// Most value bytes a GET prefetches ahead of reading the header.
const PREFETCH_VALUE_BYTES: usize = 4096;

impl Store {
    /// The header of the live item `key`, read optimistically.
    pub(super) fn read_header(&self, hash: u64, key: &[u8]) -> Option<Header> {
        let mem = &self.inner.mem;
        self.inner
            .index
            .read(hash, |l| header_if_key(mem, off_of(l), key))
            .filter(|h| !h.expired())
    }

    /// Copy the value of `key` into `buf` (replacing its contents).
    pub fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<ItemMeta>, Error> {
        let inner = &*self.inner;
        let mem = &inner.mem;
        let max_value = inner.cfg.max_value_bytes;
        let _guard = inner.epochs.try_pin()?;
        let hash = hash_key(key);
        // The value's expected size: the caller's buffer capacity (a
        // reused buffer is as large as the values it has held).
        let expect =
            crate::object::HEADER_MIN_BYTES + key.len() + buf.capacity().min(PREFETCH_VALUE_BYTES);
        let found = inner.index.read(hash, |l| {
            let off = off_of(l);
            // Start the object's lines now, with the header's: the value's
            // loads otherwise wait for the header (its length) and miss.
            // Into every cache level: a popular value is read again soon
            // (non-temporal prefetches, which keep the value out of L2/L3
            // so as not to push index buckets out, cost 8-25 % of YCSB
            // throughput on an Intel Xeon VM, zipfian reads the most).
            mem.prefetch(off, expect);
            let h = header_if_key(mem, off, key)?;
            // Bound lengths read from racing memory before using them.
            let n = (h.value_len.min(h.value_cap) as usize).min(max_value);
            buf.resize(n, 0);
            let ok = mem.read_part(off, h.header_bytes() + key.len(), buf);
            // Cache mode: merge eviction keeps what was read (a no-op
            // until the store first evicts; a load, and a write only the
            // first time, after that).
            mem.note_access(off);
            ok.then_some(h)
        });
        // Cache mode: how often this key is read, stored or not.
        mem.note_read(hash);
        let found = found.filter(|h| !h.expired());
        if found.is_none() {
            buf.clear();
        }
        Ok(found.map(|h| ItemMeta::of(&h)))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let mut buf = Vec::new();
        Ok(self.get_into(key, &mut buf)?.map(|_| buf))
    }

    /// Metadata of `key` without copying the value.
    pub fn meta(&self, key: &[u8]) -> Result<Option<ItemMeta>, Error> {
        let _guard = self.inner.epochs.try_pin()?;
        Ok(self
            .read_header(hash_key(key), key)
            .map(|h| ItemMeta::of(&h)))
    }

    /// True if `key` is present.
    pub fn contains(&self, key: &[u8]) -> Result<bool, Error> {
        Ok(self.meta(key)?.is_some())
    }

    /// Number of items in the index, without taking any lock (items that
    /// expired but were not reclaimed yet are included).
    pub fn len(&self) -> u64 {
        self.inner.index.len()
    }

    /// True if the index holds no item.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One step of a cursor over the keys (Redis SCAN semantics: a key
    /// present for the whole iteration is returned at least once; it may be
    /// returned more than once). Start with cursor 0; 0 comes back at the end.
    pub fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>), Error> {
        self.scan_inner(cursor, count, false)
    }

    /// As [`scan`](Store::scan), but items that expired and were not
    /// reclaimed yet are returned too (FLUSHALL deletes them).
    pub fn scan_with_expired(
        &self,
        cursor: u64,
        count: usize,
    ) -> Result<(u64, Vec<Vec<u8>>), Error> {
        self.scan_inner(cursor, count, true)
    }

    fn scan_inner(
        &self,
        cursor: u64,
        count: usize,
        with_expired: bool,
    ) -> Result<(u64, Vec<Vec<u8>>), Error> {
        let inner = &*self.inner;
        let mem = &inner.mem;
        let _guard = inner.epochs.try_pin()?;
        let mut locs = Vec::new();
        let next = inner.index.scan(cursor, count, &mut locs);
        let now = now_ms();
        let mut keys = Vec::with_capacity(locs.len());
        for l in locs {
            let off = off_of(l);
            let Some(h) = mem.header(off) else { continue };
            if (!with_expired && h.expired_at(now)) || h.key_len as usize > MAX_KEY_BYTES {
                continue;
            }
            let mut k = vec![0u8; h.key_len as usize];
            if mem.read_part(off, h.header_bytes(), &mut k) {
                keys.push(k);
            }
        }
        Ok((next, keys))
    }
}
