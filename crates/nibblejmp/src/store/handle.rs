//! The process-side handle, [`SharedStore`]: the public API over
//! [`Inner`], the optional compaction thread, statistics and close.
//!
//! Everything here is a thin layer: each operation takes an epoch slot and
//! runs the protocol in `ops.rs`; the handle adds what a caller of a store
//! expects (`get` as a copy into a fresh buffer, `flush`, `keys`) and owns
//! the attachment (dropping it detaches).

use super::*;

/// Statistics of a store (see [`SharedStore::stats`]).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub geometry: Option<Geometry>,
    pub segments_free: u64,
    pub segments_open: u64,
    pub segments_closed: u64,
    pub segments_compacting: u64,
    pub segments_retired: u64,
    /// Sum of the per-segment live-byte counters.
    pub live_bytes: u64,
    /// Index entries (keys), from the striped counters (see
    /// [`SharedStore::len`]).
    pub objects: u64,
    pub index_load: f64,
    pub attaches: u64,
    pub recoveries: u64,
    pub rebuilds: u64,
    pub broken_locks: u64,
    pub slots_reclaimed: u64,
    pub compactions: u64,
    pub lease_takeovers: u64,
    /// Expired objects removed by compaction.
    pub expired_reclaimed: u64,
    /// Objects found damaged (checksum mismatch) and not served, since
    /// creation.
    pub damaged_objects: u64,
    /// Closed segments compaction leaves alone because of a damaged region
    /// (counted in `segments_closed` too) until an index rebuild.
    pub segments_quarantined: u64,
    pub clean_flag: bool,
    /// Compaction lease holder: (pid, alive).
    pub lease_holder: Option<(u32, bool)>,
    /// Processes with epoch slots: (pid, slots, alive).
    pub processes: Vec<(u32, usize, bool)>,
}

/// A Nibble store in SpaceJMP segments, attached by this process.
pub struct SharedStore {
    pub(super) inner: Arc<Inner>,
    pub(super) thread: Option<JoinHandle<()>>,
    report: RecoveryReport,
}

impl SharedStore {
    pub(super) fn start(inner: Inner, report: RecoveryReport) -> SharedStore {
        let inner = Arc::new(inner);
        let thread = if inner.opts.compaction_thread {
            let i2 = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("nibblejmp-compact".into())
                .spawn(move || i2.compaction_loop())
                .ok()
        } else {
            None
        };
        SharedStore {
            inner,
            thread,
            report,
        }
    }

    /// Insert or replace `key` (no expiry, flags 0).
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.inner.put_with(key, value, PutOptions::default())?;
        Ok(())
    }

    /// The general write, with `nibble::Store::put_with`'s semantics: the
    /// condition (`Always`, `IfAbsent` → `KeyExists`, `IfPresent` /
    /// `IfVersion(v)` → `KeyNotFound` or `VersionMismatch`) is decided
    /// under the key's bucket locks, an expired item counts as absent, and
    /// `Expiry::Keep` keeps the live item's expiry. Returns the new
    /// version: larger than every earlier version of the key (48 bits, from
    /// the TSC as in Nibble, so also across processes and restarts).
    pub fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64> {
        self.inner.put_with(key, value, opts)
    }

    /// The value of `key` (`None` if absent or expired).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut buf = Vec::new();
        Ok(self.inner.get_into(key, &mut buf)?.map(|_| buf))
    }

    /// Copy the value of `key` into `buf` (replacing its contents) and
    /// return its metadata; `None` (and `buf` empty) if absent or expired.
    pub fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<ItemMeta>> {
        self.inner.get_into(key, buf)
    }

    /// Metadata of `key` without copying the value.
    pub fn meta(&self, key: &[u8]) -> Result<Option<ItemMeta>> {
        self.inner.meta_of(key)
    }

    /// Whether `key` is present (and not expired).
    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        Ok(self.inner.meta_of(key)?.is_some())
    }

    /// Remove `key`; true if a live item was removed.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.inner.delete(key)
    }

    /// Delete `key` if `cond` holds, atomically under its bucket locks
    /// (`nibble::Store::delete_if`): `KeyNotFound` if absent or expired
    /// (an expired item is removed either way), `VersionMismatch` if
    /// `IfVersion` names another version, `KeyExists` for `IfAbsent` on a
    /// live item.
    pub fn delete_if(&self, key: &[u8], cond: Condition) -> Result<()> {
        self.inner.delete_if(key, cond)
    }

    /// Set (`Some(unix_ms)`) or clear (`None`) the expiry of `key`; false
    /// if it is absent or expired. The version is kept.
    pub fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> Result<bool> {
        self.inner.set_expiry(key, expiry_ms)
    }

    /// One step of a cursor over the keys: start with 0, 0 comes back at
    /// the end. Tolerates concurrent writes (Redis SCAN's guarantee: a key
    /// present during the whole walk is returned; a key written meanwhile
    /// may or may not be). Expired keys are skipped.
    pub fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>)> {
        self.inner.scan(cursor, count, false)
    }

    /// As [`scan`](SharedStore::scan), with expired keys not yet reclaimed.
    pub fn scan_with_expired(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>)> {
        self.inner.scan(cursor, count, true)
    }

    /// Number of keys in the index, from striped counters (no scan).
    /// Items that expired but were not reclaimed yet are included, as in
    /// `nibble::Store::len`.
    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    /// True if no key is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Delete every key, expired ones included (a scan and a delete per
    /// key; keys written concurrently may survive), then every entry whose
    /// object is damaged (which no scan lists). Returns the number of live
    /// keys deleted.
    pub fn flush(&self) -> Result<u64> {
        let mut n = 0;
        let mut cursor = 0;
        loop {
            let (next, keys) = self.inner.scan(cursor, 1024, true)?;
            for k in keys {
                n += u64::from(self.inner.delete(&k)?);
            }
            if next == 0 {
                self.inner.drop_damaged_entries()?;
                return Ok(n);
            }
            cursor = next;
        }
    }

    /// Largest key + value bytes one item may have (an object fits one
    /// log segment).
    pub fn max_item_bytes(&self) -> u64 {
        self.inner.geo.seg_bytes - OBJ_PREFIX_BYTES
    }

    /// Every key (for the CLI; tolerates concurrent writes).
    pub fn keys(&self) -> Result<Vec<Vec<u8>>> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let mut v = Vec::new();
        let now = nibble::object::now_ms();
        self.inner.for_each_key(|k, h| {
            if !h.expired_at(now) {
                v.push(k.to_vec())
            }
        });
        Ok(v)
    }

    /// The fixed geometry.
    pub fn geometry(&self) -> Geometry {
        self.inner.geo
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// What recovery did at this attach.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Run compaction passes now (under the lease; for tests and the CLI):
    /// the number of segments compacted, or `Busy` if another process
    /// holds the lease.
    pub fn compact_now(&self) -> Result<u64> {
        self.inner.compact_forced()
    }

    /// Reclaim the epoch slots of dead processes now (resolving their
    /// in-flight bucket updates and releasing their locks); otherwise this
    /// happens when someone waits on such a lock or needs the epoch to
    /// advance. Returns the number of slots reclaimed.
    pub fn reclaim_dead(&self) -> u64 {
        self.inner.reclaim_dead_slots()
    }

    /// Statistics.
    pub fn stats(&self) -> Stats {
        let i = &self.inner;
        let h = i.hdr();
        let mut st = Stats {
            geometry: Some(i.geo),
            ..Stats::default()
        };
        for s in 0..i.geo.log_segments as usize {
            let state = i.seg(s).state.load(Ordering::Relaxed);
            if state == seg_state(SEG_CLOSED, TAG_QUARANTINED) {
                st.segments_quarantined += 1;
            }
            match state & 0xFF {
                SEG_FREE => st.segments_free += 1,
                SEG_OPEN => st.segments_open += 1,
                SEG_CLOSED => st.segments_closed += 1,
                SEG_COMPACTING => st.segments_compacting += 1,
                _ => st.segments_retired += 1,
            }
        }
        st.live_bytes = i.live_bytes();
        st.objects = i.len();
        st.index_load =
            st.objects as f64 / (i.geo.index_buckets as f64 * ENTRIES_PER_BUCKET as f64);
        st.attaches = h.attaches.load(Ordering::Relaxed);
        st.recoveries = h.recoveries.load(Ordering::Relaxed);
        st.rebuilds = h.rebuilds.load(Ordering::Relaxed);
        st.broken_locks = h.broken_locks.load(Ordering::Relaxed);
        st.slots_reclaimed = h.slots_reclaimed.load(Ordering::Relaxed);
        st.compactions = h.compactions.load(Ordering::Relaxed);
        st.lease_takeovers = h.lease_takeovers.load(Ordering::Relaxed);
        st.expired_reclaimed = h.expired_reclaimed.load(Ordering::Relaxed);
        st.damaged_objects = h.damaged_objects.load(Ordering::Relaxed);
        st.clean_flag = h.clean.load(Ordering::Relaxed) != 0;
        let lo = i.meta().lease.owner.load(Ordering::Relaxed);
        if lo != 0 {
            st.lease_holder = Some((proc_id::pid_of(lo), proc_id::alive(lo)));
        }
        let mut procs: Vec<(u64, usize)> = Vec::new();
        for s in 0..EPOCH_SLOTS {
            let o = i.slot(s).owner.load(Ordering::Relaxed) & !RECLAIM_BIT;
            if o == 0 {
                continue;
            }
            match procs.iter_mut().find(|p| p.0 == o) {
                Some(p) => p.1 += 1,
                None => procs.push((o, 1)),
            }
        }
        st.processes = procs
            .into_iter()
            .map(|(o, n)| (proc_id::pid_of(o), n, proc_id::alive(o)))
            .collect();
        st
    }

    /// Make every write that finished before this call durable on a disk
    /// directory: `msync` of the meta segment and the log, then the kills
    /// deferred until their replacements were durable (see
    /// `store/durability.rs`). Flushes are serialized; a no-op cost on
    /// tmpfs.
    pub fn flush_to_disk(&self) -> Result<()> {
        self.inner.flush_to_disk()
    }

    /// Turn durability's two rules (deferred kills, no segment reuse
    /// before a flush) on or off for this process; on also flushes once.
    /// Off applies the pending kills. A process that flushes should turn
    /// this on, or a flush does not protect replaced values.
    pub fn set_durable(&self, on: bool) -> Result<()> {
        self.inner.set_durable(on)
    }

    /// Flush counters of this process.
    pub fn flush_stats(&self) -> FlushStats {
        self.inner.flush_stats()
    }

    /// The power-loss test layer: keep a durable image of the store in
    /// `dir` that only completed flushes update (see
    /// `store/durability.rs`). For tests; costs a copy of the log per
    /// flush.
    pub fn keep_power_image(&self, dir: &Path) -> Result<()> {
        self.inner.keep_power_image(dir)
    }

    /// Take fuzzy index checkpoints every `every` on a thread of this
    /// process (`None`: stop, and remove the checkpoint file), so that a
    /// restart after a power cut walks only the log written since the
    /// last one (see `store/checkpoint.rs`). While on, deletes also
    /// append a small tombstone to the log and every new segment starts
    /// with a stamp. Meant for a store on a disk directory with
    /// [`set_durable`](Self::set_durable) on.
    pub fn set_checkpoint_interval(&self, every: Option<Duration>) -> Result<()> {
        self.inner.set_checkpoint_interval(every)
    }

    /// Whether the checkpoint thread also starts a checkpoint before its
    /// interval is up once the segments opened since the last one hold an
    /// eighth of the log (default: on; it bounds the walk after a power
    /// cut whatever the write rate). Off, checkpoints follow the interval
    /// alone.
    pub fn set_checkpoint_on_log_written(&self, on: bool) {
        self.inner.set_checkpoint_on_log_written(on);
    }

    /// Take a checkpoint now (stamps and tombstones must be on: see
    /// [`set_checkpoint_interval`](Self::set_checkpoint_interval));
    /// returns its epoch.
    pub fn checkpoint_now(&self) -> Result<u64> {
        self.inner.checkpoint_now()
    }

    /// Checkpoint counters of this process.
    pub fn checkpoint_stats(&self) -> CheckpointStats {
        self.inner.checkpoint_stats()
    }

    /// Detach cleanly: stop compaction, give back the lease and this
    /// process's slots, and mark the store clean if no other live process
    /// is attached.
    pub fn close(mut self) -> Result<()> {
        self.detach()
    }

    /// [`close`](Self::close) for an owner that cannot give the handle up
    /// (a field of a struct being dropped): every later operation on this
    /// handle returns `Closed`; a second call does nothing.
    pub fn close_in_place(&mut self) -> Result<()> {
        self.detach()
    }
}

impl Drop for SharedStore {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}

/// The shared store behind `nibble`'s engine API, so a server drives it
/// as it drives a `nibble::Store`. Each method forwards to the inherent
/// one of the same name and converts the error
/// (`From<Error> for nibble::Error`). The engines stay separate below this
/// interface: see `nibble::engine` for why.
impl nibble::KvEngine for SharedStore {
    #[inline]
    fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> nibble::Result<u64> {
        Ok(SharedStore::put_with(self, key, value, opts)?)
    }

    #[inline]
    fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> nibble::Result<Option<ItemMeta>> {
        Ok(SharedStore::get_into(self, key, buf)?)
    }

    #[inline]
    fn meta(&self, key: &[u8]) -> nibble::Result<Option<ItemMeta>> {
        Ok(SharedStore::meta(self, key)?)
    }

    #[inline]
    fn delete(&self, key: &[u8]) -> nibble::Result<bool> {
        Ok(SharedStore::delete(self, key)?)
    }

    #[inline]
    fn delete_if(&self, key: &[u8], cond: Condition) -> nibble::Result<()> {
        Ok(SharedStore::delete_if(self, key, cond)?)
    }

    #[inline]
    fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> nibble::Result<bool> {
        Ok(SharedStore::set_expiry(self, key, expiry_ms)?)
    }

    #[inline]
    fn scan(&self, cursor: u64, count: usize) -> nibble::Result<(u64, Vec<Vec<u8>>)> {
        Ok(SharedStore::scan(self, cursor, count)?)
    }

    #[inline]
    fn scan_with_expired(&self, cursor: u64, count: usize) -> nibble::Result<(u64, Vec<Vec<u8>>)> {
        Ok(SharedStore::scan_with_expired(self, cursor, count)?)
    }

    #[inline]
    fn len(&self) -> u64 {
        SharedStore::len(self)
    }

    #[inline]
    fn max_value_bytes(&self) -> u64 {
        self.max_item_bytes()
    }

    fn engine_stats(&self) -> nibble::EngineStats {
        let st = self.stats();
        let g = self.geometry();
        let in_use = g.log_segments - st.segments_free;
        let blocks_per_seg = g.seg_bytes / BLOCK_BYTES;
        let index_bytes = g.index_buckets * BUCKET_BYTES;
        nibble::EngineStats {
            engine: "shared",
            mode: "nibblejmp",
            epoch: "tsc-shared",
            capacity_bytes: g.capacity_bytes,
            used_bytes: in_use * g.seg_bytes + index_bytes + meta_bytes(g.log_segments),
            live_bytes: st.live_bytes,
            index_bytes,
            pool_bytes: g.log_segments * g.seg_bytes,
            blocks_total: g.log_segments * blocks_per_seg,
            blocks_in_use: in_use * blocks_per_seg,
            // Segments live in shared files and stay mapped: nothing is
            // released to the OS or mapped ahead.
            blocks_free_resident: 0,
            blocks_released: 0,
            blocks_mapped_ahead: 0,
            segments_closed: st.segments_closed,
            compaction_passes: st.compactions,
            bytes_relocated: 0,
            expired_reclaimed: st.expired_reclaimed,
            damaged_objects: st.damaged_objects,
            // The shared store never evicts (its segment table is fixed and
            // shared between processes; see the nibble engine essay).
            evicted_items: 0,
            evicted_bytes: 0,
            eviction_passes: 0,
            // Not counted by the shared store.
            write_waits: 0,
            write_wait_us: 0,
            expired_unfetched: 0,
            // Expired objects are reclaimed by its compaction only.
            expired_segments: 0,
            expiry_bytes_read: 0,
            items: st.objects,
            processes: st.processes.iter().filter(|p| p.2).count(),
        }
    }
}
