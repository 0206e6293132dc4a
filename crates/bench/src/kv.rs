//! The key-value systems the `ycsb`, `frag`, `churn` and `fill` benchmarks
//! compare, behind one small trait.
//!
//! * **Nibble variants** — the `nibble` crate's store: `nibble` (Nibble,
//!   one log head per CPU, TSC epochs), `nibble2` (Nibble-2: in-place
//!   overwrites, §6.2), `nibble-1head` (one log head per node, the
//!   RAMCloud-like baseline of §5.1) and `nibble-atomic-epoch` (one shared
//!   epoch word instead of the per-thread TSC table, §4.5). Their memory is
//!   the store's own pool, so they run in the `memlab` (glibc) binary.
//! * **In-process baselines** — `hashmap-*`: 64 shards of
//!   `parking_lot::Mutex<HashMap<Vec<u8>, Vec<u8>>>`; `dashmap-*`:
//!   `DashMap<Vec<u8>, Vec<u8>>` (RwLock shards). Each with glibc malloc,
//!   jemalloc and mimalloc: a process has one global allocator, so the
//!   `-jemalloc` and `-mimalloc` systems run in the sibling binaries
//!   `memlab-jemalloc` and `memlab-mimalloc` (module `child`).
//!
//! The baselines behave like a simple in-memory store would: a PUT copies
//! the value into a fresh heap allocation (made before the shard lock is
//! taken) and frees the old one (after it is released), so every update
//! exercises the allocator, as an append does in Nibble; a GET copies the
//! value out under the lock, as Nibble's GET copies it out of the log. Both
//! maps hash keys with xxh3 ([`nibble::hash_key`], the hash Nibble's index
//! uses), so the comparison is of data structures and allocators, not of
//! hash functions.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::str::FromStr;

use dashmap::DashMap;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::child::Alloc;
use crate::error::{BenchError, Context, Result};

/// Why an operation failed.
#[derive(Debug, Clone)]
pub enum KvError {
    /// The store is full (Nibble's `Error::OutOfMemory`).
    OutOfMemory(String),
    /// Anything else.
    Other(String),
}

impl std::fmt::Display for KvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvError::OutOfMemory(m) | KvError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for KvError {}

/// What the workloads need of a store. Shared by reference across threads.
pub trait Kv: Sync {
    /// Insert or overwrite.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError>;
    /// Copy the value into `buf` (replacing its contents); false if absent.
    fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<bool, KvError>;
    /// Remove; false if absent.
    fn delete(&self, key: &[u8]) -> Result<bool, KvError>;
    /// The Nibble store underneath, if this is one.
    fn nibble(&self) -> Option<&nibble::Store> {
        None
    }
    /// Give free memory back to the OS, as a long-running service does when
    /// idle: the process's allocator is purged (glibc `malloc_trim`,
    /// jemalloc `arena.<all>.purge`, mimalloc `mi_collect`); Nibble
    /// compacts and releases its free blocks.
    fn trim(&self) {
        crate::child::trim_allocator();
    }
}

/// Which Nibble configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NibbleVariant {
    /// Defaults: Nibble mode, a head per CPU, TSC epochs.
    Nibble,
    /// Nibble-2 (in-place overwrite).
    Nibble2,
    /// One log head per node.
    OneHead,
    /// The global-atomic epoch.
    AtomicEpoch,
    /// Nibble-2 with its log mapped in at creation (`Config::prefault`),
    /// as the original prototype does: the load then takes no page fault.
    /// Opt-in (not in [`ALL_SYSTEMS`]): it costs the whole capacity in RSS.
    Nibble2Prefault,
}

/// A system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    Nibble(NibbleVariant),
    HashMap(Alloc),
    DashMap(Alloc),
}

/// Every system, in the order tables and plots list them.
pub const ALL_SYSTEMS: [System; 10] = [
    System::Nibble(NibbleVariant::Nibble),
    System::Nibble(NibbleVariant::Nibble2),
    System::Nibble(NibbleVariant::OneHead),
    System::Nibble(NibbleVariant::AtomicEpoch),
    System::HashMap(Alloc::Glibc),
    System::HashMap(Alloc::Jemalloc),
    System::HashMap(Alloc::Mimalloc),
    System::DashMap(Alloc::Glibc),
    System::DashMap(Alloc::Jemalloc),
    System::DashMap(Alloc::Mimalloc),
];

/// Systems a run includes only when named (`--systems`).
pub const OPT_IN_SYSTEMS: [System; 1] = [System::Nibble(NibbleVariant::Nibble2Prefault)];

impl System {
    /// Name on the command line and in result rows.
    pub fn name(self) -> &'static str {
        match self {
            System::Nibble(NibbleVariant::Nibble) => "nibble",
            System::Nibble(NibbleVariant::Nibble2) => "nibble2",
            System::Nibble(NibbleVariant::OneHead) => "nibble-1head",
            System::Nibble(NibbleVariant::AtomicEpoch) => "nibble-atomic-epoch",
            System::Nibble(NibbleVariant::Nibble2Prefault) => "nibble2-prefault",
            System::HashMap(Alloc::Glibc) => "hashmap-glibc",
            System::HashMap(Alloc::Jemalloc) => "hashmap-jemalloc",
            System::HashMap(Alloc::Mimalloc) => "hashmap-mimalloc",
            System::DashMap(Alloc::Glibc) => "dashmap-glibc",
            System::DashMap(Alloc::Jemalloc) => "dashmap-jemalloc",
            System::DashMap(Alloc::Mimalloc) => "dashmap-mimalloc",
        }
    }

    /// The global allocator of the process that must run it.
    pub fn alloc(self) -> Alloc {
        match self {
            System::Nibble(_) => Alloc::Glibc,
            System::HashMap(a) | System::DashMap(a) => a,
        }
    }

    /// An in-process baseline (not a Nibble variant).
    pub fn is_baseline(self) -> bool {
        !matches!(self, System::Nibble(_))
    }

    /// Nibble's configuration for this variant with `capacity` bytes.
    pub fn nibble_config(self, capacity: usize) -> Option<nibble::Config> {
        let System::Nibble(v) = self else { return None };
        let mut cfg = nibble::Config::new(capacity.max(nibble::MIN_CAPACITY_BYTES));
        match v {
            NibbleVariant::Nibble => {}
            NibbleVariant::Nibble2 => cfg.mode = nibble::Mode::Nibble2,
            NibbleVariant::OneHead => cfg.heads_per_node = Some(1),
            NibbleVariant::AtomicEpoch => cfg.epoch = epoch::EpochKind::GlobalAtomic,
            NibbleVariant::Nibble2Prefault => {
                cfg.mode = nibble::Mode::Nibble2;
                cfg.prefault = true;
            }
        }
        Some(cfg)
    }

    /// Build an empty store. `capacity` is used by the Nibble variants only
    /// (the maps grow as they need).
    pub fn build(self, capacity: usize) -> Result<Box<dyn Kv>> {
        self.build_for(capacity, 0)
    }

    /// As [`build`](System::build), told to expect `expected_keys` keys
    /// (0: no hint): every system gets the same hint, a map as its
    /// `with_capacity`, Nibble as `Config::expected_keys` (its index
    /// pre-sized); the maps still allocate their values as they come, as
    /// Nibble's log fills as they come.
    pub fn build_for(self, capacity: usize, expected_keys: usize) -> Result<Box<dyn Kv>> {
        match self {
            System::Nibble(_) => {
                let mut cfg = self.nibble_config(capacity).expect("a nibble variant");
                cfg.expected_keys = expected_keys;
                let store = nibble::Store::new(cfg).with_context(|| {
                    format!("{}: cannot create a store of {capacity} bytes", self.name())
                })?;
                Ok(Box::new(NibbleKv(store)))
            }
            System::HashMap(_) => Ok(Box::new(ShardedMap::with_capacity(expected_keys))),
            System::DashMap(_) => Ok(Box::new(DashKv(DashMap::with_capacity_and_hasher(
                expected_keys,
                XxBuild,
            )))),
        }
    }
}

impl std::fmt::Display for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for System {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let every = || ALL_SYSTEMS.iter().chain(OPT_IN_SYSTEMS.iter()).copied();
        every().find(|x| x.name() == s).ok_or_else(|| {
            let names: Vec<&str> = every().map(|x| x.name()).collect();
            crate::usage(format!(
                "unknown system {s:?} (one of: {})",
                names.join(", ")
            ))
        })
    }
}

impl Serialize for System {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for System {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

// ---------------------------------------------------------------------------
// Nibble

/// A Nibble store.
pub struct NibbleKv(pub nibble::Store);

fn nibble_err(e: nibble::Error) -> KvError {
    match e {
        nibble::Error::OutOfMemory { .. } => KvError::OutOfMemory(e.to_string()),
        other => KvError::Other(other.to_string()),
    }
}

impl Kv for NibbleKv {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        self.0.put(key, value).map(|_| ()).map_err(nibble_err)
    }
    fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<bool, KvError> {
        self.0
            .get_into(key, buf)
            .map(|m| m.is_some())
            .map_err(nibble_err)
    }
    fn delete(&self, key: &[u8]) -> Result<bool, KvError> {
        self.0.delete(key).map_err(nibble_err)
    }
    fn nibble(&self) -> Option<&nibble::Store> {
        Some(&self.0)
    }
    fn trim(&self) {
        self.0.compact_now(std::time::Duration::from_secs(20));
        self.0.release_memory();
        crate::child::trim_allocator();
    }
}

// ---------------------------------------------------------------------------
// The maps' hash: xxh3 of the key bytes, as Nibble's index.

/// Builds [`XxHasher`]s.
#[derive(Clone, Copy, Default)]
pub struct XxBuild;

/// Hashes byte strings with xxh3. `Vec<u8>` and `[u8]` hash as a length,
/// then the bytes (one `write`); the length is folded in cheaply.
pub struct XxHasher(u64);

impl Hasher for XxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.0 = nibble::hash_key(bytes) ^ self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.0 = self.0.rotate_left(17) ^ n as u64;
    }
    #[inline]
    fn finish(&self) -> u64 {
        // The hashmap baseline picks its shard with the top bits of the same
        // xxh3 hash, and hashbrown takes its 7-bit tag from the top bits:
        // rotate so that the tag comes from bits the shard did not use (else
        // every key of a shard has nearly the same tag and lookups compare
        // many keys).
        self.0.rotate_left(32)
    }
}

impl BuildHasher for XxBuild {
    type Hasher = XxHasher;
    #[inline]
    fn build_hasher(&self) -> XxHasher {
        XxHasher(0)
    }
}

// ---------------------------------------------------------------------------
// Sharded Mutex<HashMap>

/// Shards of the `hashmap-*` baseline.
pub const MAP_SHARDS: usize = 64;

/// A shard on its own cache lines (two, against adjacent-line prefetch).
#[repr(align(128))]
struct Shard(Mutex<HashMap<Vec<u8>, Vec<u8>, XxBuild>>);

/// 64 shards of `Mutex<HashMap>`, picked by the top bits of the key's hash.
pub struct ShardedMap {
    shards: Box<[Shard]>,
}

impl ShardedMap {
    pub fn new() -> ShardedMap {
        ShardedMap::with_capacity(0)
    }

    /// Room for `keys` keys without rehashing: each shard's even share
    /// with four standard deviations of headroom (keys spread binomially
    /// over the shards), as Nibble's pre-sized index leaves.
    pub fn with_capacity(keys: usize) -> ShardedMap {
        let even = keys.div_ceil(MAP_SHARDS) as f64;
        let per_shard = if keys == 0 {
            0
        } else {
            (even + 4.0 * even.sqrt()).ceil() as usize
        };
        ShardedMap {
            shards: (0..MAP_SHARDS)
                .map(|_| {
                    Shard(Mutex::new(HashMap::with_capacity_and_hasher(
                        per_shard, XxBuild,
                    )))
                })
                .collect(),
        }
    }

    #[inline]
    fn shard(&self, key: &[u8]) -> &Mutex<HashMap<Vec<u8>, Vec<u8>, XxBuild>> {
        let h = nibble::hash_key(key);
        &self.shards[(h >> (64 - MAP_SHARDS.trailing_zeros())) as usize].0
    }
}

impl Default for ShardedMap {
    fn default() -> Self {
        ShardedMap::new()
    }
}

impl Kv for ShardedMap {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        let v = value.to_vec();
        let mut m = self.shard(key).lock();
        let old = match m.get_mut(key) {
            Some(slot) => Some(std::mem::replace(slot, v)),
            None => {
                m.insert(key.to_vec(), v);
                None
            }
        };
        drop(m);
        drop(old);
        Ok(())
    }
    fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<bool, KvError> {
        let m = self.shard(key).lock();
        match m.get(key) {
            Some(v) => {
                buf.clear();
                buf.extend_from_slice(v);
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn delete(&self, key: &[u8]) -> Result<bool, KvError> {
        let old = self.shard(key).lock().remove(key);
        Ok(old.is_some())
    }
}

// ---------------------------------------------------------------------------
// DashMap

/// `DashMap<Vec<u8>, Vec<u8>>` with the xxh3 hasher and its default shards.
pub struct DashKv(DashMap<Vec<u8>, Vec<u8>, XxBuild>);

impl Kv for DashKv {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        let v = value.to_vec();
        let old = match self.0.get_mut(key) {
            Some(mut slot) => Some(std::mem::replace(&mut *slot, v)),
            None => self.0.insert(key.to_vec(), v),
        };
        drop(old);
        Ok(())
    }
    fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<bool, KvError> {
        match self.0.get(key) {
            Some(v) => {
                buf.clear();
                buf.extend_from_slice(&v);
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn delete(&self, key: &[u8]) -> Result<bool, KvError> {
        Ok(self.0.remove(key).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in ALL_SYSTEMS.into_iter().chain(OPT_IN_SYSTEMS) {
            assert_eq!(s.name().parse::<System>().unwrap(), s);
            let j = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<System>(&j).unwrap(), s);
        }
        assert!("redis".parse::<System>().is_err());
    }

    #[test]
    fn every_system_puts_gets_deletes() {
        for s in ALL_SYSTEMS {
            let kv = s.build(16 << 20).unwrap();
            let mut buf = Vec::new();
            assert!(!kv.get_into(b"k", &mut buf).unwrap(), "{s}");
            kv.put(b"k", b"one").unwrap();
            kv.put(b"k", b"two!").unwrap();
            assert!(kv.get_into(b"k", &mut buf).unwrap());
            assert_eq!(buf, b"two!", "{s}");
            assert!(kv.delete(b"k").unwrap());
            assert!(!kv.delete(b"k").unwrap());
            assert_eq!(kv.nibble().is_some(), !s.is_baseline());
        }
    }
}
