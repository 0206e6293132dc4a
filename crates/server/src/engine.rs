//! The engine behind the commands: the process-private `nibble::Store`, or
//! a shared, restartable `nibblejmp::SharedStore` (issue 8, `--data-dir`).
//!
//! Command code is written once, against [`Engine`]. Each method is a
//! `match` on the variant that calls the engine's method of the same name
//! with the same types (`nibblejmp` takes nibble's own `PutOptions`,
//! `Condition`, `Expiry` and returns `ItemMeta`), and maps the shared
//! store's errors onto `nibble::Error`, so handlers match on one error
//! type. The `match` is one predictable branch: the local path takes no
//! lock and no indirection it did not take before.
//!
//! ```text
//!  nibble                    ─▶ Engine::Local(nibble::Store)        process-private, gone at exit
//!  nibble --data-dir DIR     ─▶ Engine::Shared(SharedStore in DIR)  segments in DIR (tmpfs or disk):
//!      DIR has no store      ─▶   create(DIR, maxmemory)            ─ serve
//!      clean shutdown before ─▶   attach: map the segments          ─ serve at once (no reload)
//!      crashed (SIGKILL)     ─▶   attach: recovery (repair, verify, rebuild the index if needed) ─ serve
//!      SHUTDOWN / SIGTERM    ─▶   close: the last process out marks the store clean
//! ```
//!
//! What differs between the two, and the server reports honestly: the
//! shared store is append-only (no Nibble-2 in-place overwrite; `mode`
//! does not apply), its capacity is fixed when it is created (a later
//! `--maxmemory` is ignored with a warning), and an item (key + value)
//! must fit one log segment, which the server sizes from the capacity
//! (1 to 16 MiB).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nibble::{Condition, Error, ItemMeta, PutOptions};

use crate::config::ServerConfig;

/// Largest log segment the server asks for (it bounds one item).
pub const SHARED_MAX_SEGMENT_BYTES: u64 = 16 << 20;
/// Smallest segment the server picks itself (smaller stores get the
/// crate's default plan).
pub const SHARED_MIN_SEGMENT_BYTES: u64 = 1 << 20;
/// The server wants at least this many log segments.
pub const SHARED_SEGMENTS_WANTED: u64 = 256;
/// How long a write waits for compaction before -OOM (as the local
/// engine's `max_write_wait_ms`).
const SHARED_OOM_WAIT_MS: u64 = 100;

/// The engine.
pub enum Engine {
    /// Process-private Nibble.
    Local(nibble::Store),
    /// A Nibble store in SpaceJMP segments, shared with other processes.
    Shared(SharedEngine),
}

/// A shared store and how it was opened.
pub struct SharedEngine {
    store: nibblejmp::SharedStore,
    /// The store directory.
    pub dir: PathBuf,
    /// What happened at start: created, reattached clean, or recovered.
    pub start: String,
    /// Time to create or attach (recovery included), ms.
    pub open_ms: f64,
}

impl SharedEngine {
    #[inline]
    fn s(&self) -> &nibblejmp::SharedStore {
        &self.store
    }

    /// The store handle (for tests and tools in this process).
    pub fn store(&self) -> &nibblejmp::SharedStore {
        &self.store
    }
}

impl Drop for SharedEngine {
    fn drop(&mut self) {
        // The last process out marks the store clean: the next start
        // attaches without recovery.
        match self.store.close_in_place() {
            Ok(()) => log::info!("shared store in {} closed cleanly", self.dir.display()),
            Err(e) => log::error!("closing the shared store in {}: {e}", self.dir.display()),
        }
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
    /// Blocks (64 KiB) of the log, and in use.
    pub blocks_total: u64,
    /// Blocks in use.
    pub blocks_in_use: u64,
    /// Closed segments (compaction candidates).
    pub segments_closed: u64,
    /// Compaction passes (segments compacted for the shared store).
    pub compaction_passes: u64,
    /// Bytes moved by compaction (local engine only).
    pub bytes_relocated: u64,
    /// Expired items reclaimed by compaction.
    pub expired_reclaimed: u64,
    /// Keys.
    pub items: u64,
    /// Processes attached to a shared store (this one included).
    pub processes: usize,
}

fn shared_err(e: nibblejmp::Error) -> Error {
    e.into()
}

impl Engine {
    /// The engine `cfg` asks for. For `--data-dir`, creates the store (with
    /// capacity `cfg.capacity`) or attaches it, and returns the capacity
    /// actually in force (fixed when the store was created).
    pub fn open(cfg: &ServerConfig, max_write_wait_ms: u64) -> Result<(Engine, u64), String> {
        let Some(dir) = &cfg.data_dir else {
            let mut ncfg = nibble::Config::new(cfg.capacity as usize);
            ncfg.mode = cfg.mode;
            ncfg.compaction_workers = cfg.compaction_workers;
            ncfg.max_write_wait_ms = max_write_wait_ms;
            let store = nibble::Store::new(ncfg).map_err(|e| format!("engine: {e}"))?;
            return Ok((Engine::Local(store), cfg.capacity));
        };
        let e = open_shared(dir, cfg)?;
        let cap = e.s().geometry().capacity_bytes;
        Ok((Engine::Shared(e), cap))
    }

    /// The shared store, if this is one.
    pub fn shared(&self) -> Option<&SharedEngine> {
        match self {
            Engine::Local(_) => None,
            Engine::Shared(s) => Some(s),
        }
    }

    /// Largest value the engine accepts.
    pub fn max_value_bytes(&self) -> u64 {
        match self {
            Engine::Local(s) => s.config().max_value_bytes as u64,
            Engine::Shared(s) => s.s().max_item_bytes(),
        }
    }

    /// Store `value` under `key` (no conditions); the new version.
    #[inline]
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<u64, Error> {
        self.put_with(key, value, PutOptions::default())
    }

    /// The general write (`nibble::Store::put_with`).
    #[inline]
    pub fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64, Error> {
        match self {
            Engine::Local(s) => s.put_with(key, value, opts),
            Engine::Shared(s) => s.s().put_with(key, value, opts).map_err(shared_err),
        }
    }

    /// Copy the value into `buf`; its metadata, `None` if absent or expired.
    #[inline]
    pub fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<ItemMeta>, Error> {
        match self {
            Engine::Local(s) => s.get_into(key, buf),
            Engine::Shared(s) => s.s().get_into(key, buf).map_err(shared_err),
        }
    }

    /// Metadata without the value.
    #[inline]
    pub fn meta(&self, key: &[u8]) -> Result<Option<ItemMeta>, Error> {
        match self {
            Engine::Local(s) => s.meta(key),
            Engine::Shared(s) => s.s().meta(key).map_err(shared_err),
        }
    }

    /// True if present.
    #[inline]
    pub fn contains(&self, key: &[u8]) -> Result<bool, Error> {
        Ok(self.meta(key)?.is_some())
    }

    /// Remove; whether a live item was removed.
    #[inline]
    pub fn delete(&self, key: &[u8]) -> Result<bool, Error> {
        match self {
            Engine::Local(s) => s.delete(key),
            Engine::Shared(s) => s.s().delete(key).map_err(shared_err),
        }
    }

    /// Conditional delete (`nibble::Store::delete_if`).
    #[inline]
    pub fn delete_if(&self, key: &[u8], cond: Condition) -> Result<(), Error> {
        match self {
            Engine::Local(s) => s.delete_if(key, cond),
            Engine::Shared(s) => s.s().delete_if(key, cond).map_err(shared_err),
        }
    }

    /// Set or clear the expiry; whether the key exists.
    #[inline]
    pub fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> Result<bool, Error> {
        match self {
            Engine::Local(s) => s.set_expiry(key, expiry_ms),
            Engine::Shared(s) => s.s().set_expiry(key, expiry_ms).map_err(shared_err),
        }
    }

    /// One cursor step over the keys (start with 0; 0 at the end).
    pub fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>), Error> {
        match self {
            Engine::Local(s) => s.scan(cursor, count),
            Engine::Shared(s) => s.s().scan(cursor, count).map_err(shared_err),
        }
    }

    /// Keys in the index (expired ones not yet reclaimed included).
    pub fn len(&self) -> u64 {
        match self {
            Engine::Local(s) => s.len(),
            Engine::Shared(s) => s.s().len(),
        }
    }

    /// True if no key is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Statistics.
    pub fn stats(&self) -> EngineStats {
        match self {
            Engine::Local(s) => {
                let st = s.stats();
                let block = nibble::BLOCK_BYTES as u64;
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
                    segments_closed: st.segments_closed,
                    compaction_passes: st.compaction_passes,
                    bytes_relocated: st.bytes_relocated,
                    expired_reclaimed: st.expired_reclaimed,
                    items: st.items,
                    processes: 1,
                }
            }
            Engine::Shared(s) => {
                let st = s.s().stats();
                let g = s.s().geometry();
                let in_use = g.log_segments - st.segments_free;
                let blocks_per_seg = g.seg_bytes / nibblejmp::layout::BLOCK_BYTES;
                let index_bytes = g.index_buckets * nibblejmp::layout::BUCKET_BYTES;
                EngineStats {
                    engine: "shared",
                    mode: "nibblejmp",
                    epoch: "tsc-shared",
                    capacity_bytes: g.capacity_bytes,
                    used_bytes: in_use * g.seg_bytes
                        + index_bytes
                        + nibblejmp::layout::meta_bytes(g.log_segments),
                    live_bytes: st.live_bytes,
                    index_bytes,
                    pool_bytes: g.log_segments * g.seg_bytes,
                    blocks_total: g.log_segments * blocks_per_seg,
                    blocks_in_use: in_use * blocks_per_seg,
                    segments_closed: st.segments_closed,
                    compaction_passes: st.compactions,
                    bytes_relocated: 0,
                    expired_reclaimed: st.expired_reclaimed,
                    items: st.objects,
                    processes: st.processes.iter().filter(|p| p.2).count(),
                }
            }
        }
    }
}

/// Log segment size the server asks for at creation: capacity / 256,
/// rounded down to a power of two, in 1..=16 MiB; `None` (the crate's own
/// plan) for stores too small for 1 MiB segments.
fn segment_bytes_for(capacity: u64) -> Option<u64> {
    let target = capacity / SHARED_SEGMENTS_WANTED;
    if target < SHARED_MIN_SEGMENT_BYTES {
        return None;
    }
    let p = 1u64 << (63 - target.leading_zeros());
    Some(p.min(SHARED_MAX_SEGMENT_BYTES))
}

fn open_shared(dir: &Path, cfg: &ServerConfig) -> Result<SharedEngine, String> {
    let opts = nibblejmp::Options {
        seg_bytes: segment_bytes_for(cfg.capacity),
        oom_wait: Duration::from_millis(SHARED_OOM_WAIT_MS),
        // One slot per worker and one for the compaction thread, so a
        // worker never waits for a slot.
        epoch_slots: Some((cfg.threads + 1).clamp(2, nibblejmp::store::MAX_PROCESS_SLOTS)),
        ..nibblejmp::Options::default()
    };
    let t = Instant::now();
    let exists = dir.join("registry").exists();
    let (store, start) = if exists {
        let s = nibblejmp::SharedStore::attach(dir, &opts)
            .map_err(|e| format!("attaching the shared store in {}: {e}", dir.display()))?;
        let r = s.recovery_report().clone();
        let start = if r.ran {
            format!(
                "recovered (unclean shutdown; segments_repaired={} bad_entries={} unindexed={} rebuilt={} objects_indexed={} damaged_segments={})",
                r.segments_repaired,
                r.bad_entries,
                r.unindexed_objects,
                if r.rebuilt { "yes" } else { "no" },
                r.objects_indexed,
                r.damaged_segments
            )
        } else {
            // Recovery is skipped when the last process closed cleanly, or
            // when other processes are still attached (they repair what a
            // dead one left, lazily).
            let others = s.stats().processes.iter().filter(|p| p.2).count();
            match others.saturating_sub(1) {
                0 => "attached (clean shutdown)".to_string(),
                1 => "attached (1 other process attached)".to_string(),
                n => format!("attached ({n} other processes attached)"),
            }
        };
        let cap = s.geometry().capacity_bytes;
        if cap != cfg.capacity {
            log::warn!(
                "the store in {} was created with capacity {cap} bytes; maxmemory {} is ignored",
                dir.display(),
                cfg.capacity
            );
        }
        (s, start)
    } else {
        let s = nibblejmp::SharedStore::create(dir, cfg.capacity, &opts)
            .map_err(|e| format!("creating a shared store in {}: {e}", dir.display()))?;
        (s, "created".to_string())
    };
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    log::info!(
        "shared store in {}: {start} in {open_ms:.1} ms, {} keys",
        dir.display(),
        store.len()
    );
    Ok(SharedEngine {
        store,
        dir: dir.to_path_buf(),
        start,
        open_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_size_follows_capacity() {
        assert_eq!(segment_bytes_for(32 << 20), None);
        assert_eq!(segment_bytes_for(256 << 20), Some(1 << 20));
        assert_eq!(segment_bytes_for(1 << 30), Some(4 << 20));
        assert_eq!(segment_bytes_for(64 << 30), Some(16 << 20));
    }
}
