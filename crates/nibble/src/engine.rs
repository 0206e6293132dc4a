//! One engine API: [`KvEngine`], the operations a key-value server needs,
//! implemented by `nibble::Store` (here) and `nibblejmp::SharedStore`.
//!
//! The server's command code is written once against it. The two engines
//! share the item types ([`crate::item`]: options, conditions, metadata)
//! and one error type: this crate's [`Error`]; `nibblejmp` converts its
//! own (`From<nibblejmp::Error> for nibble::Error`), so a handler matches
//! on `Exists`, `NotFound`, `VersionMismatch` and `OutOfMemory` whichever
//! engine runs.
//!
//! The trait unifies the *interface*, not the engines. They stay two
//! implementations on purpose: `Store` is process-private (its locks wait
//! forever, its memory comes from a buddy allocator with heap state, its
//! compaction workers are threads of this process), while
//! `nibblejmp::SharedStore` lives in shared segments where any process may
//! die at any instruction: its locks name their holder and can be broken,
//! every update carries an intent a survivor can finish or roll back, and
//! its memory is a fixed segment table. Those dead-process rules are a
//! different concurrency domain (the `nibblejmp` crate essay), and sharing
//! code below this interface would put one engine's assumptions into the
//! other.
//!
//! Callers that know their engine use static dispatch (generics, or an
//! enum whose arms each call one implementation); every method here is a
//! thin forwarder marked `#[inline]`, so it costs nothing over calling the
//! store directly.

use crate::item::{Condition, ItemMeta, PutOptions, Rmw};
use crate::store::{Error, Store};
use crate::BLOCK_BYTES;

/// The operations of a key-value engine, with `nibble`'s semantics (see
/// [`Store`] for each one's contract). Keys and values are byte strings;
/// versions are 48-bit, larger than every earlier version of the key.
pub trait KvEngine {
    /// The general write: store `value` under `key` if `opts.condition`
    /// holds, with `opts.expiry` and `opts.flags`; the new version.
    fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64, Error>;

    /// Copy the value of `key` into `buf` (replacing its contents); its
    /// metadata, or `None` (and `buf` empty) if absent or expired.
    fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<ItemMeta>, Error>;

    /// Metadata of `key` without copying the value.
    fn meta(&self, key: &[u8]) -> Result<Option<ItemMeta>, Error>;

    /// Remove `key`; whether a live item was removed.
    fn delete(&self, key: &[u8]) -> Result<bool, Error>;

    /// Delete `key` if `cond` holds, atomically: `Err(NotFound)` if absent
    /// or expired, `Err(VersionMismatch)`, `Err(Exists)` for `IfAbsent`.
    fn delete_if(&self, key: &[u8], cond: Condition) -> Result<(), Error>;

    /// Set (`Some(unix_ms)`) or clear the expiry of `key`, keeping its
    /// version; whether the key exists.
    fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> Result<bool, Error>;

    /// One step of a cursor over the keys: start with 0; 0 comes back at
    /// the end. A key present for the whole walk is returned.
    fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>), Error>;

    /// As [`scan`](KvEngine::scan), but also returns items that expired
    /// and were not reclaimed yet (so FLUSHALL can remove them).
    fn scan_with_expired(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>), Error>;

    /// Keys in the index (expired ones not yet reclaimed included).
    fn len(&self) -> u64;

    /// Largest value the engine accepts.
    fn max_value_bytes(&self) -> u64;

    /// Statistics in the shape both engines share.
    fn engine_stats(&self) -> EngineStats;

    /// Read `key` into `buf`, let `f` change it and, where the engine can,
    /// write it back in place under the key's lock
    /// (`Store::read_modify_write`: one lookup, no writer in between).
    /// `f` must not call into the engine. This default, for an engine
    /// without in-place overwrites, is a read and `f`, writing nothing:
    /// the caller appends `buf` with `put_with` conditioned on
    /// `Rmw::old`.
    #[inline]
    fn read_modify_write<T>(
        &self,
        key: &[u8],
        buf: &mut Vec<u8>,
        f: impl FnOnce(Option<ItemMeta>, &mut Vec<u8>) -> (T, bool),
    ) -> Result<Rmw<T>, Error> {
        let old = self.get_into(key, buf)?;
        Ok(Rmw::unwritten(old, buf, f))
    }

    /// Store `value` under `key`, unconditionally; the new version.
    /// As [`put_with`](KvEngine::put_with), and an evicting store must
    /// never evict the item (`Store::put_never_evict`): for the internal
    /// pieces of big collections. An engine that never evicts (the shared
    /// store) just writes it.
    #[inline]
    fn put_never_evict(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64, Error> {
        self.put_with(key, value, opts)
    }

    #[inline]
    fn put(&self, key: &[u8], value: &[u8]) -> Result<u64, Error> {
        self.put_with(key, value, PutOptions::default())
    }

    /// Whether `key` is present (and not expired).
    #[inline]
    fn contains(&self, key: &[u8]) -> Result<bool, Error> {
        Ok(self.meta(key)?.is_some())
    }

    /// True if no key is indexed.
    #[inline]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Engine statistics for INFO and memcached `stats`, in one shape for both
/// engines.
#[derive(Clone, Debug, Default)]
pub struct EngineStats {
    /// `local` or `shared`.
    pub engine: &'static str,
    /// Engine mode (nibble, nibble2, or nibblejmp for the shared store).
    pub mode: &'static str,
    /// Epoch scheme.
    pub epoch: &'static str,
    /// Capacity (maxmemory).
    pub capacity_bytes: u64,
    /// Memory the engine uses: blocks or segments in use, index, metadata.
    pub used_bytes: u64,
    /// Live key + value + header bytes.
    pub live_bytes: u64,
    /// Index bytes.
    pub index_bytes: u64,
    /// Log (pool) bytes.
    pub pool_bytes: u64,
    /// Blocks (64 KiB) of the log.
    pub blocks_total: u64,
    /// Blocks in use.
    pub blocks_in_use: u64,
    /// Free blocks still resident (the warm cache; 0 for the shared
    /// store, whose segments stay mapped).
    pub blocks_free_resident: u64,
    /// Blocks given back to the OS so far (local engine only).
    pub blocks_released: u64,
    /// Blocks mapped in ahead of the log so far (local engine only,
    /// `Config::map_ahead`).
    pub blocks_mapped_ahead: u64,
    /// Closed segments (compaction candidates).
    pub segments_closed: u64,
    /// Compaction passes (segments compacted for the shared store).
    pub compaction_passes: u64,
    /// Bytes moved by compaction (local engine only).
    pub bytes_relocated: u64,
    /// Expired items reclaimed by compaction.
    pub expired_reclaimed: u64,
    /// Items found damaged (checksum mismatch) and not served (shared
    /// store only).
    pub damaged_objects: u64,
    /// Live items evicted (cache mode; 0 for an engine that never evicts).
    pub evicted_items: u64,
    /// Bytes of the evicted items.
    pub evicted_bytes: u64,
    /// Eviction passes that freed segments.
    pub eviction_passes: u64,
    /// Writes that found the log full and waited for compaction or
    /// eviction to free space.
    pub write_waits: u64,
    /// Time those writes waited, microseconds in all.
    pub write_wait_us: u64,
    /// Expired items reclaimed unread (memcached `expired_unfetched`;
    /// counted only while the engine keeps accessed bits, i.e. in cache
    /// mode).
    pub expired_unfetched: u64,
    /// Segments freed whole by the expiry pass, every object expired (0
    /// for an engine without one).
    pub expired_segments: u64,
    /// Bytes of segments the expiry pass read to unlink expired items.
    pub expiry_bytes_read: u64,
    /// Keys.
    pub items: u64,
    /// Processes attached to a shared store (this one included).
    pub processes: usize,
}

impl KvEngine for Store {
    #[inline]
    fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64, Error> {
        Store::put_with(self, key, value, opts)
    }

    #[inline]
    fn put_never_evict(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64, Error> {
        Store::put_never_evict(self, key, value, opts)
    }

    #[inline]
    fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<ItemMeta>, Error> {
        Store::get_into(self, key, buf)
    }

    #[inline]
    fn read_modify_write<T>(
        &self,
        key: &[u8],
        buf: &mut Vec<u8>,
        f: impl FnOnce(Option<ItemMeta>, &mut Vec<u8>) -> (T, bool),
    ) -> Result<Rmw<T>, Error> {
        Store::read_modify_write(self, key, buf, f)
    }

    #[inline]
    fn meta(&self, key: &[u8]) -> Result<Option<ItemMeta>, Error> {
        Store::meta(self, key)
    }

    #[inline]
    fn delete(&self, key: &[u8]) -> Result<bool, Error> {
        Store::delete(self, key)
    }

    #[inline]
    fn delete_if(&self, key: &[u8], cond: Condition) -> Result<(), Error> {
        Store::delete_if(self, key, cond)
    }

    #[inline]
    fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> Result<bool, Error> {
        Store::set_expiry(self, key, expiry_ms)
    }

    #[inline]
    fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>), Error> {
        Store::scan(self, cursor, count)
    }

    #[inline]
    fn scan_with_expired(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>), Error> {
        Store::scan_with_expired(self, cursor, count)
    }

    #[inline]
    fn len(&self) -> u64 {
        Store::len(self)
    }

    #[inline]
    fn max_value_bytes(&self) -> u64 {
        self.config().max_value_bytes as u64
    }

    fn engine_stats(&self) -> EngineStats {
        let st = self.stats();
        let block = BLOCK_BYTES as u64;
        EngineStats {
            engine: "local",
            mode: st.mode.name(),
            epoch: st.epoch,
            capacity_bytes: st.capacity_bytes,
            used_bytes: st.blocks_in_use * block + st.index_bytes + st.metadata_bytes,
            live_bytes: st.live_bytes,
            index_bytes: st.index_bytes,
            pool_bytes: st.pool_bytes,
            blocks_total: st.blocks_total,
            blocks_in_use: st.blocks_in_use,
            blocks_free_resident: st.blocks_free_resident,
            blocks_released: st.blocks_released,
            blocks_mapped_ahead: st.blocks_mapped_ahead,
            segments_closed: st.segments_closed,
            compaction_passes: st.compaction_passes,
            bytes_relocated: st.bytes_relocated,
            expired_reclaimed: st.expired_reclaimed,
            damaged_objects: 0,
            evicted_items: st.evicted_items,
            evicted_bytes: st.evicted_bytes,
            eviction_passes: st.eviction_passes,
            write_waits: st.write_waits,
            write_wait_us: st.write_wait_us,
            expired_unfetched: st.expired_unfetched,
            expired_segments: st.expired_segments,
            expiry_bytes_read: st.expiry_bytes_read,
            items: st.items,
            processes: 1,
        }
    }
}
