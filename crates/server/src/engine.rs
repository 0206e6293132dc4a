//! The engine behind the commands: the process-private `nibble::Store`, or
//! a shared, restartable `nibblejmp::SharedStore` (`--data-dir`).
//!
//! Command code is written once, against [`Engine`]. Both stores implement
//! `nibble::KvEngine` (one API, nibble's item types and error type), so
//! each method here is dispatch only: a `match` on the variant whose arms
//! call the same trait method on the concrete store (the `dispatch!`
//! macro). That is static dispatch: one predictable branch, each arm an
//! inlined forwarder to the store's own method, no `dyn` call and no lock
//! on the request path.
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
//! On a disk directory, when writes reach the disk is `appendfsync`'s
//! business (`crate::durability`).
//!
//! # User keys and internal keys
//!
//! Large collections (see `coll`) keep their elements in engine items of
//! their own, under keys no client can name. This file is the one place
//! that keeps the two key spaces apart: every method below takes a *user*
//! key and maps it, the `raw_*` methods take engine keys as they are.
//!
//! ```text
//!  user key k, k[0] != 0xFF   ─▶ k                      (no copy: one compare per call)
//!  user key 0xFF ‖ rest       ─▶ 0xFF 0x01 ‖ rest       (escaped: one byte longer)
//!  internal key               ─▶ 0xFF 0x00 ‖ ...        (`coll` node and instance items)
//! ```
//!
//! The map is injective and its image never starts with `0xFF 0x00`, so
//! no user key reaches an internal item. [`Engine::scan`] drops internal
//! keys and unescapes the rest, so SCAN, KEYS, DBSIZE and RANDOMKEY never
//! show an internal key. The price: one byte compare per call, and a user
//! key that starts with `0xFF` may be one byte shorter than
//! `nibble::MAX_KEY_BYTES`.
//!
//! What differs between the two, and the server reports honestly: the
//! shared store is append-only (no Nibble-2 in-place overwrite; `mode`
//! does not apply), its capacity is fixed when it is created (a later
//! `--maxmemory` is ignored with a warning), and an item (key + value)
//! must fit one log segment, which the server sizes from the capacity
//! (1 to 16 MiB).

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use nibble::EngineStats;
use nibble::{Condition, Error, ItemMeta, KvEngine, PutOptions, Rmw};

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

/// Environment variable naming a directory for the power-loss test
/// layer's durable image (tests only; see `crate::durability`).
pub const POWER_IMAGE_ENV: &str = "NIBBLE_TEST_POWER_IMAGE";

/// First byte of every internal key and of every escaped user key.
pub const KEY_ESCAPE_BYTE: u8 = 0xFF;
/// Second byte of an internal key.
pub const INTERNAL_KEY_TAG: u8 = 0x00;
/// Second byte of an escaped user key.
const ESCAPED_KEY_TAG: u8 = 0x01;

/// The engine key of user key `k`.
#[inline]
pub fn user_key(k: &[u8]) -> Cow<'_, [u8]> {
    if k.first() != Some(&KEY_ESCAPE_BYTE) {
        return Cow::Borrowed(k);
    }
    let mut v = Vec::with_capacity(k.len() + 1);
    v.push(KEY_ESCAPE_BYTE);
    v.push(ESCAPED_KEY_TAG);
    v.extend_from_slice(&k[1..]);
    Cow::Owned(v)
}

/// The user key of engine key `raw`; `None` for an internal key.
pub fn from_engine_key(mut raw: Vec<u8>) -> Option<Vec<u8>> {
    if raw.first() != Some(&KEY_ESCAPE_BYTE) {
        return Some(raw);
    }
    if raw.get(1) != Some(&ESCAPED_KEY_TAG) {
        return None;
    }
    raw.remove(1);
    Some(raw)
}

/// True if `raw` is an internal key.
pub fn is_internal_key(raw: &[u8]) -> bool {
    raw.len() >= 2 && raw[0] == KEY_ESCAPE_BYTE && raw[1] == INTERNAL_KEY_TAG
}

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

/// Call the `KvEngine` method `$m` on whichever store `$e` holds.
macro_rules! dispatch {
    ($e:expr, $m:ident($($arg:expr),*)) => {
        match $e {
            Engine::Local(s) => KvEngine::$m(s, $($arg),*),
            Engine::Shared(s) => KvEngine::$m(&s.store, $($arg),*),
        }
    };
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
            ncfg.decay_ms = cfg.memory_decay_ms;
            ncfg.max_write_wait_ms = max_write_wait_ms;
            let store = nibble::Store::new(ncfg).map_err(|e| format!("engine: {e}"))?;
            return Ok((Engine::Local(store), cfg.capacity));
        };
        let e = open_shared(dir, cfg)?;
        let cap = e.store.geometry().capacity_bytes;
        Ok((Engine::Shared(e), cap))
    }

    /// The shared store, if this is one.
    pub fn shared(&self) -> Option<&SharedEngine> {
        match self {
            Engine::Local(_) => None,
            Engine::Shared(s) => Some(s),
        }
    }

    /// Set what a full store does (`maxmemory-policy`); the shared store
    /// never evicts, so it accepts only `NoEviction`.
    pub fn set_eviction(&self, e: nibble::Eviction) -> Result<(), String> {
        match self {
            Engine::Local(s) => {
                s.set_eviction(e);
                Ok(())
            }
            Engine::Shared(_) if !e.evicts() => Ok(()),
            Engine::Shared(_) => Err(
                "the shared store (--data-dir) does not evict: maxmemory-policy must be noeviction"
                    .into(),
            ),
        }
    }

    /// Largest value the engine accepts.
    pub fn max_value_bytes(&self) -> u64 {
        dispatch!(self, max_value_bytes())
    }

    /// Whether a put of a value the size of the live one overwrites it in
    /// place (the local store in Nibble-2 mode; the shared store is
    /// append-only): then large collections' nodes are stored with spare
    /// room (`crate::packed`), so most writes keep their size.
    #[inline]
    pub fn overwrites_in_place(&self) -> bool {
        match self {
            Engine::Local(s) => s.config().mode == nibble::Mode::Nibble2,
            Engine::Shared(_) => false,
        }
    }

    /// Store `value` under `key` (no conditions); the new version.
    #[inline]
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<u64, Error> {
        dispatch!(self, put(&user_key(key), value))
    }

    /// The general write (`nibble::Store::put_with`).
    #[inline]
    pub fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64, Error> {
        dispatch!(self, put_with(&user_key(key), value, opts))
    }

    /// Copy the value into `buf`; its metadata, `None` if absent or expired.
    #[inline]
    pub fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<ItemMeta>, Error> {
        dispatch!(self, get_into(&user_key(key), buf))
    }

    /// Read, change and (Nibble-2, when it fits) write back the value in
    /// place under the key's lock (`nibble::Store::read_modify_write`);
    /// `f` must not call into the engine.
    #[inline]
    pub fn read_modify_write<T>(
        &self,
        key: &[u8],
        buf: &mut Vec<u8>,
        f: impl FnOnce(Option<ItemMeta>, &mut Vec<u8>) -> (T, bool),
    ) -> Result<Rmw<T>, Error> {
        dispatch!(self, read_modify_write(&user_key(key), buf, f))
    }

    /// Metadata without the value.
    #[inline]
    pub fn meta(&self, key: &[u8]) -> Result<Option<ItemMeta>, Error> {
        dispatch!(self, meta(&user_key(key)))
    }

    /// True if present.
    #[inline]
    pub fn contains(&self, key: &[u8]) -> Result<bool, Error> {
        dispatch!(self, contains(&user_key(key)))
    }

    /// Remove; whether a live item was removed.
    #[inline]
    pub fn delete(&self, key: &[u8]) -> Result<bool, Error> {
        dispatch!(self, delete(&user_key(key)))
    }

    /// Conditional delete (`nibble::Store::delete_if`).
    #[inline]
    pub fn delete_if(&self, key: &[u8], cond: Condition) -> Result<(), Error> {
        dispatch!(self, delete_if(&user_key(key), cond))
    }

    /// Set or clear the expiry; whether the key exists.
    #[inline]
    pub fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> Result<bool, Error> {
        dispatch!(self, set_expiry(&user_key(key), expiry_ms))
    }

    /// One cursor step over the user keys (start with 0; 0 at the end).
    pub fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>), Error> {
        let (next, keys) = dispatch!(self, scan(cursor, count))?;
        Ok((next, keys.into_iter().filter_map(from_engine_key).collect()))
    }

    /// One cursor step over every engine key, internal ones included,
    /// expired ones not reclaimed yet included (FLUSHALL, the sweeper).
    pub fn raw_scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>), Error> {
        dispatch!(self, scan_with_expired(cursor, count))
    }

    /// `get_into` of an engine key as it is.
    #[inline]
    pub fn raw_get_into(&self, raw: &[u8], buf: &mut Vec<u8>) -> Result<Option<ItemMeta>, Error> {
        dispatch!(self, get_into(raw, buf))
    }

    /// `put_with` of an engine key as it is.
    #[inline]
    pub fn raw_put_with(&self, raw: &[u8], value: &[u8], opts: PutOptions) -> Result<u64, Error> {
        dispatch!(self, put_with(raw, value, opts))
    }

    /// `read_modify_write` of an engine key as it is.
    #[inline]
    pub fn raw_read_modify_write<T>(
        &self,
        raw: &[u8],
        buf: &mut Vec<u8>,
        f: impl FnOnce(Option<ItemMeta>, &mut Vec<u8>) -> (T, bool),
    ) -> Result<Rmw<T>, Error> {
        dispatch!(self, read_modify_write(raw, buf, f))
    }

    /// `delete` of an engine key as it is.
    #[inline]
    pub fn raw_delete(&self, raw: &[u8]) -> Result<bool, Error> {
        dispatch!(self, delete(raw))
    }

    /// [`scan`](Engine::scan) with expired keys not reclaimed yet.
    pub fn scan_with_expired(
        &self,
        cursor: u64,
        count: usize,
    ) -> Result<(u64, Vec<Vec<u8>>), Error> {
        let (next, keys) = dispatch!(self, scan_with_expired(cursor, count))?;
        Ok((next, keys.into_iter().filter_map(from_engine_key).collect()))
    }

    /// Engine keys in the index (expired ones not yet reclaimed and the
    /// internal keys of large collections included).
    pub fn len(&self) -> u64 {
        dispatch!(self, len())
    }

    /// True if no key is indexed.
    pub fn is_empty(&self) -> bool {
        dispatch!(self, is_empty())
    }

    /// Statistics.
    pub fn stats(&self) -> EngineStats {
        dispatch!(self, engine_stats())
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
        // One slot per worker, one for the compaction thread and one for
        // the collection sweeper, so a worker never waits for a slot.
        epoch_slots: Some((cfg.threads + 2).clamp(2, nibblejmp::store::MAX_PROCESS_SLOTS)),
        ..nibblejmp::Options::default()
    };
    let t = Instant::now();
    let exists = dir.join("registry").exists();
    let (store, start) = if exists {
        let s = nibblejmp::SharedStore::attach(dir, &opts)
            .map_err(|e| format!("attaching the shared store in {}: {e}", dir.display()))?;
        let r = s.recovery_report().clone();
        let start = if r.ran {
            let why = if r.unclean {
                "unclean shutdown"
            } else if r.meta_seal_bad {
                "clean shutdown, but the meta segment fails its checksum"
            } else if r.index_seal_bad {
                "clean shutdown, but the index fails its checksum"
            } else {
                "rebuild requested"
            };
            let ckpt = if r.checkpoint_epoch > 0 {
                format!(
                    " from_checkpoint={} checkpoint_keys={} segments_walked={} tombstones_applied={}",
                    r.checkpoint_epoch, r.checkpoint_keys, r.segments_walked, r.tombstones_applied
                )
            } else {
                r.checkpoint_fallback
                    .as_deref()
                    .map(|w| format!(" checkpoint_not_used=({w})"))
                    .unwrap_or_default()
            };
            format!(
                "recovered ({why}; segments_repaired={} segments_rederived={} bad_entries={} unindexed={} rebuilt={} objects_indexed={} damaged_segments={} damaged_objects={}{ckpt})",
                r.segments_repaired,
                if r.meta_rederived { "yes" } else { "no" },
                r.bad_entries,
                r.unindexed_objects,
                if r.rebuilt { "yes" } else { "no" },
                r.objects_indexed,
                r.damaged_segments,
                r.damaged_objects
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
    // The power-loss test layer (`nibblejmp`'s `store/durability.rs`):
    // a durable image that only completed flushes update, for tests that
    // cut the power by restarting from it.
    if let Some(img) = std::env::var_os(POWER_IMAGE_ENV) {
        store
            .keep_power_image(Path::new(&img))
            .map_err(|e| format!("the power-loss image in {}: {e}", Path::new(&img).display()))?;
        log::warn!(
            "{POWER_IMAGE_ENV} is set: keeping a power-loss test image in {} (a copy of the log per flush)",
            Path::new(&img).display()
        );
    }
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
    fn user_keys_never_reach_internal_keys() {
        for k in [&b""[..], b"a", b"\xff", b"\xff\x00x", b"\xff\x01", b"\x00"] {
            let e = user_key(k).into_owned();
            assert!(!is_internal_key(&e));
            assert_eq!(from_engine_key(e).as_deref(), Some(k));
        }
        assert_eq!(from_engine_key(vec![0xFF, 0x00, 7]), None);
        assert_ne!(user_key(b"\xff"), user_key(b"\xff\x01"));
    }

    #[test]
    fn segment_size_follows_capacity() {
        assert_eq!(segment_bytes_for(32 << 20), None);
        assert_eq!(segment_bytes_for(256 << 20), Some(1 << 20));
        assert_eq!(segment_bytes_for(1 << 30), Some(4 << 20));
        assert_eq!(segment_bytes_for(64 << 30), Some(16 << 20));
    }
}
