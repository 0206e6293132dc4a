//! The store: PUT, GET, DEL and friends over the index, the logs, the epoch
//! table and compaction (dissertation §4.1-4.5, §6.2).
//!
//! ```text
//!  PUT (Nibble)     pin ─ append to local head ─ lock bucket ─ swap entry ─ live± ─ unlock ─ unpin
//!  PUT (Nibble-2)   pin ─ lock bucket ─ fits old allocation? overwrite in place ─ unlock ─ unpin
//!                                      └ no: unlock, then as Nibble
//!  GET              pin ─ seqlock read of the bucket, copy value out, validate ─ unpin
//!  DEL              pin ─ lock bucket ─ remove entry ─ live− ─ unlock ─ unpin
//! ```
//!
//! Every operation holds an epoch guard from before it touches the index
//! until after its last access to log memory, which is what lets compaction
//! free a segment once the epoch table passes its retirement stamp.
//!
//! This file builds a store (sizing the index, the pool, the reserve, the
//! segments and the workers from the capacity) and holds the state its
//! handle and its workers share (`Inner`); the rest is one file per
//! concern:
//!
//! | file | concern |
//! |---|---|
//! | `store/config.rs` | [`Config`], [`Mode`], defaults, [`Error`] |
//! | `store/write.rs` | PUT (Nibble and Nibble-2 in-place update), DEL, expiry |
//! | `store/read.rs` | GET, metadata, SCAN |
//! | `store/space.rs` | compaction trigger, a full log's wait for space, prefetch |
//! | `store/admin.rs` | [`Stats`], `compact_now`, `release_memory` |

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use epoch::{EpochError, EpochKind, EpochScheme, Epochs};
use parking_lot::{Condvar, Mutex};

use crate::index::{Index, IndexConfig, IndexStats, Loc};
use crate::log::Log;
use crate::memory::{loc_of, off_of, Memory, SegState, BLOCK_BYTES};
use crate::object::{next_log_version, now_ms, Header};

mod admin;
mod config;
mod read;
mod space;
mod write;

pub(crate) use self::admin::CompactionCounters;
pub use self::admin::Stats;
pub use self::config::{
    Config, Error, Eviction, EvictionPolicy, Mode, DEFAULT_COMPACTION_TRIGGER_PERMILLE,
    DEFAULT_DECAY_MS, DEFAULT_INDEX_PERMILLE, DEFAULT_MAX_SEGMENT_BYTES, DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_MAX_WRITE_WAIT_MS, DEFAULT_RESERVE_PERMILLE, MAX_KEY_BYTES, MIN_CAPACITY_BYTES,
    MIN_SEGMENTS_PER_STORE, PAPER_COMPACTION_TRIGGER_PERMILLE,
};
use self::space::SpaceWait;
pub(crate) use self::write::note_expiry;
pub use crate::item::{check_condition, Condition, Expiry, ItemMeta, PutOptions, Rmw};

/// Metadata bytes the store sets aside per 64 KiB block (tables, SegmentInfo,
/// buddy lists).
const METADATA_BYTES_PER_BLOCK: usize = 512;

/// Bytes [`ObjectPrefix`] reads at once from an object: the largest
/// header and a key of up to 40 bytes (one cache line's worth).
const PREFIX_BYTES: usize = 64;

/// The first [`PREFIX_BYTES`] of an object, read with one copy: GET and a
/// resize's rehash need the header and the key, and for the usual object
/// (a key under 40 bytes) both are in here, so they cost one copy instead
/// of a header read, a slot read and a key read, each walking the
/// segment's blocks. The caller owns the bytes and decodes the header
/// from them in place ([`ObjectPrefix::header`]): a prefix returned by
/// value through the read path's inlined layers is copied at each layer
/// (about 100 instructions a GET).
pub(crate) struct ObjectPrefix {
    bytes: [u8; PREFIX_BYTES],
}

impl ObjectPrefix {
    /// An empty prefix to [`read`](ObjectPrefix::read) into.
    #[inline(always)]
    pub(crate) fn new() -> ObjectPrefix {
        ObjectPrefix {
            bytes: [0u8; PREFIX_BYTES],
        }
    }

    /// Read the prefix of the object at `off`; false when the read would
    /// leave the object's segment (an object near its end: read it apart).
    #[inline(always)]
    pub(crate) fn read(&mut self, mem: &Memory, off: u64) -> bool {
        mem.read(off, &mut self.bytes)
    }

    /// The header decoded from the prefix.
    #[inline(always)]
    pub(crate) fn header(&self) -> Header {
        let base = self.bytes[..crate::object::HEADER_MIN_BYTES]
            .try_into()
            .expect("a header-sized prefix");
        let (mut h, slots) = Header::decode_base(base);
        if slots > 0 {
            h.decode_slots(&self.bytes[crate::object::HEADER_MIN_BYTES..][..slots]);
        }
        h
    }

    /// The key of the object whose header is `h`, when it lies within
    /// the prefix.
    #[inline(always)]
    pub(crate) fn key(&self, h: &Header) -> Option<&[u8]> {
        let start = h.header_bytes();
        self.bytes.get(start..start + h.key_len as usize)
    }
}

/// The header of the object at `off` if the object holds `key` (one copy
/// for the usual object, see [`ObjectPrefix`]). Its bytes may be racing
/// a writer: the caller validates (a seqlock read) or holds the bucket
/// lock.
#[inline(always)]
pub(crate) fn header_if_key(mem: &Memory, off: u64, key: &[u8]) -> Option<Header> {
    let mut p = ObjectPrefix::new();
    let h = if p.read(mem, off) {
        let h = p.header();
        if let Some(k) = p.key(&h) {
            return short_eq(k, key).then_some(h);
        }
        h
    } else {
        mem.header(off)?
    };
    (h.key_len as usize == key.len() && mem.key_bytes_equal(off, &h, key)).then_some(h)
}

/// `a == b` for keys short enough to sit in an [`ObjectPrefix`], compared
/// in 8-byte words (the last one overlapping the one before) instead of
/// through a call to `memcmp`: a GET compares one key, of about 20 bytes.
#[inline(always)]
fn short_eq(a: &[u8], b: &[u8]) -> bool {
    const WORD_BYTES: usize = 8;
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < WORD_BYTES {
        return a == b;
    }
    let word =
        |s: &[u8], i: usize| u64::from_ne_bytes(s[i..i + WORD_BYTES].try_into().expect("a word"));
    let mut i = 0;
    while i + WORD_BYTES < n {
        if word(a, i) != word(b, i) {
            return false;
        }
        i += WORD_BYTES;
    }
    word(a, n - WORD_BYTES) == word(b, n - WORD_BYTES)
}

/// Shared state (the store handle and its workers hold it).
pub(crate) struct Inner {
    pub(crate) cfg: Config,
    pub(crate) mem: Arc<Memory>,
    pub(crate) index: Index,
    pub(crate) epochs: Epochs,
    pub(crate) logs: Vec<Log>,
    /// Per CPU id: (node index, head index within the node).
    cpu_slot: Vec<(usize, usize)>,
    pub(crate) segment_blocks: usize,
    /// Compaction runs while the client's free blocks are below this.
    compaction_trigger_blocks: u64,
    index_budget: usize,
    pub(crate) shutdown: AtomicBool,
    /// Number of the last compaction pass that found nothing to do.
    pub(crate) last_nothing_pass: AtomicU64,
    /// Number of the last compaction pass that made progress.
    pub(crate) last_progress_pass: AtomicU64,
    /// Blocks of the compaction reserve that expiry relocations
    /// (`Store::set_expiry`) may have taken since the clients' budget was
    /// last within its limit ([`Inner::expiry_may_use_reserve`]).
    expiry_reserve_blocks: AtomicU64,
    force_compaction: AtomicBool,
    /// When a compaction worker last saw the store busy (Unix ms): a
    /// segment closed or an operation running. Store-wide, so that a
    /// worker with no segments of its own does not take a busy store for
    /// an idle one; starts at the store's creation.
    pub(crate) last_busy_ms: AtomicU64,
    /// The eviction setting ([`Eviction::encode`]); starts as
    /// `cfg.eviction`, changed by [`Store::set_eviction`].
    eviction: AtomicU8,
    wake: (Mutex<u64>, Condvar),
    space: (Mutex<u64>, Condvar),
    pub(crate) stats: CompactionCounters,
    /// Per node, per compaction worker: its candidates and retire list.
    pub(crate) workers: Vec<Vec<Mutex<crate::compaction::WorkerState>>>,
}

/// The index's overflow budget: past its own share it borrows the log's
/// free blocks (see `Memory::borrow_for_index`).
struct LogLendsToIndex(Arc<Memory>);

impl crate::index::IndexOverflow for LogLendsToIndex {
    fn take(&self, bytes: u64) -> bool {
        self.0.borrow_for_index(bytes)
    }

    fn give_back(&self, bytes: u64) {
        self.0.return_from_index(bytes)
    }
}

/// The key hash used by the index.
#[inline]
pub fn hash_key(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// A Nibble store. Cheap to share by reference across threads.
pub struct Store {
    inner: Arc<Inner>,
    workers: Vec<JoinHandle<()>>,
}

impl Store {
    /// Create a store.
    pub fn new(cfg: Config) -> Result<Store, Error> {
        if cfg.capacity_bytes < MIN_CAPACITY_BYTES {
            return Err(Error::CapacityTooSmall {
                requested: cfg.capacity_bytes,
                minimum: MIN_CAPACITY_BYTES,
            });
        }
        if cfg.max_value_bytes > crate::object::MAX_VALUE_BYTES {
            return Err(Error::Config(format!(
                "max_value_bytes {} is above the largest value an object header can describe ({} bytes)",
                cfg.max_value_bytes,
                crate::object::MAX_VALUE_BYTES
            )));
        }
        if cfg.index_permille == 0 || cfg.index_permille >= 500 || cfg.reserve_permille >= 500 {
            return Err(Error::Config(
                "index and reserve shares must be below 50%".into(),
            ));
        }
        let topo = topology::topology();
        let nodes = topo.num_nodes().max(1);
        let index_budget = (cfg.capacity_bytes / 1000 * cfg.index_permille).max(256 << 10);
        let rest = cfg.capacity_bytes - index_budget;
        let pool_bytes = rest / (BLOCK_BYTES + METADATA_BYTES_PER_BLOCK) * BLOCK_BYTES;
        let blocks = pool_bytes / BLOCK_BYTES;
        let heads_per_node = cfg
            .heads_per_node
            .unwrap_or_else(|| topo.num_cpus().div_ceil(nodes))
            .max(1);
        let mut segment_blocks = match cfg.segment_bytes {
            Some(b) if b < BLOCK_BYTES => {
                return Err(Error::Config(format!(
                    "segment of {b} bytes is smaller than a {BLOCK_BYTES}-byte block"
                )))
            }
            Some(b) => b / BLOCK_BYTES,
            None => (DEFAULT_MAX_SEGMENT_BYTES / BLOCK_BYTES)
                .min(blocks / MIN_SEGMENTS_PER_STORE)
                .max(1),
        };
        // All heads together may hold at most a quarter of the pool.
        segment_blocks = segment_blocks
            .min(blocks / (4 * heads_per_node * nodes))
            .max(1);
        // A worker per 8 CPUs (the paper runs 8 per socket), and at least
        // two where there are two CPUs: a writer that finds no space runs
        // an idle worker's step, so with one worker state only one thread
        // at a time can compact, however many cores wait: at high
        // utilization that thread is the writers' bottleneck.
        let cpus_per_node = topo.num_cpus().div_ceil(nodes);
        let workers_per_node = cfg
            .compaction_workers
            .unwrap_or_else(|| cpus_per_node.div_ceil(8).max(cpus_per_node.min(2)))
            .max(1);
        // Each worker fills one open destination at a time.
        let reserve = ((blocks * cfg.reserve_permille / 1000)
            .max(segment_blocks * workers_per_node * nodes)) as u64;
        let mem = Arc::new(Memory::new(pool_bytes, reserve, topo.num_cpus()).map_err(Error::Io)?);
        if cfg.prefault {
            mem.prefault();
        }
        let client_budget = mem.blocks_total() - mem.reserve_blocks();
        let compaction_trigger_blocks = (client_budget * cfg.compaction_trigger_permille as u64
            / 1000)
            .max((2 * segment_blocks * heads_per_node * nodes) as u64)
            .min(client_budget);
        let index_subtables =
            (crate::index::DEFAULT_SUBTABLES_PER_NODE * nodes).next_power_of_two();
        // A resize needs each entry's full hash; entries keep 16 bits of it,
        // so it rehashes the key stored in the log (the entry's bucket is
        // locked and the caller holds an epoch guard, so the object is live).
        let rehash_mem = mem.clone();
        let rehash = move |l: Loc| {
            let off = off_of(l);
            // The usual object in one read (header and key): a resize
            // rehashes every key of the subtable (in callgrind's count of
            // the YCSB load, 263 instructions a key with a header read and
            // then a key read, 210 with the one).
            let mut p = ObjectPrefix::new();
            if p.read(&rehash_mem, off) {
                if let Some(key) = p.key(&p.header()) {
                    return hash_key(key);
                }
            }
            // A longer key, or an object that ends its segment (the prefix
            // read left it): header, then the key alone, on the stack when
            // short (a heap allocation per key was a third of a growth's
            // time in a profile of the YCSB load).
            const SHORT_KEY_BYTES: usize = 256;
            let h = rehash_mem.header(off).unwrap_or_default();
            let len = (h.key_len as usize).min(MAX_KEY_BYTES);
            if len <= SHORT_KEY_BYTES {
                let mut key = [0u8; SHORT_KEY_BYTES];
                rehash_mem.read_part(off, h.header_bytes(), &mut key[..len]);
                hash_key(&key[..len])
            } else {
                let mut key = vec![0u8; len];
                rehash_mem.read_part(off, h.header_bytes(), &mut key);
                hash_key(&key)
            }
        };
        let index = Index::new(
            &IndexConfig {
                subtables: index_subtables,
                initial_buckets_per_subtable: crate::index::initial_buckets_for(
                    cfg.expected_keys,
                    index_subtables,
                    index_budget,
                ),
                max_bytes: index_budget,
                ..IndexConfig::default()
            },
            rehash,
        )
        .map_err(|e| Error::Config(format!("index: {e}")))?;
        if cfg.index_borrows_from_log {
            index.set_overflow(Box::new(LogLendsToIndex(mem.clone())));
        }
        // What `rehash` reads first.
        let prefetch_mem = mem.clone();
        index.set_rehash_prefetch(move |l: Loc| prefetch_mem.prefetch(off_of(l), PREFIX_BYTES));
        let logs = (0..nodes)
            .map(|_| {
                Log::new(
                    heads_per_node,
                    workers_per_node,
                    segment_blocks,
                    cfg.ttl_placement,
                )
            })
            .collect();
        let mut cpu_slot = vec![(0, 0); topo.max_cpu_id() + 1];
        for (n, node) in topo.nodes().iter().enumerate() {
            for (i, &cpu) in node.cpus.iter().enumerate() {
                if cpu < cpu_slot.len() {
                    cpu_slot[cpu] = (n, i);
                }
            }
        }
        let inner = Arc::new(Inner {
            epochs: Epochs::new(cfg.epoch),
            cfg,
            mem,
            index,
            logs,
            cpu_slot,
            segment_blocks,
            compaction_trigger_blocks,
            index_budget,
            shutdown: AtomicBool::new(false),
            last_nothing_pass: AtomicU64::new(0),
            last_progress_pass: AtomicU64::new(0),
            expiry_reserve_blocks: AtomicU64::new(0),
            force_compaction: AtomicBool::new(false),
            last_busy_ms: AtomicU64::new(crate::object::now_ms()),
            eviction: AtomicU8::new(Eviction::default().encode()),
            wake: (Mutex::new(0), Condvar::new()),
            space: (Mutex::new(0), Condvar::new()),
            stats: CompactionCounters::default(),
            workers: (0..nodes)
                .map(|_| (0..workers_per_node).map(|_| Mutex::default()).collect())
                .collect(),
        });
        inner.set_eviction(inner.cfg.eviction);
        let mut workers = Vec::new();
        for node in 0..nodes {
            for w in 0..workers_per_node {
                let inner = inner.clone();
                let h = std::thread::Builder::new()
                    .name(format!("nibble-compact-{node}.{w}"))
                    .spawn(move || crate::compaction::run(inner, node, w))
                    .map_err(Error::Io)?;
                workers.push(h);
            }
        }
        Ok(Store { inner, workers })
    }

    /// The configuration (as the store was built: the eviction setting
    /// in force is [`Store::eviction`]).
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Change what a full store does, while it runs (Redis's `CONFIG SET
    /// maxmemory-policy`). The first evicting policy allocates the
    /// accessed bits (0.8 % of the pool, outside the capacity budget when
    /// the store was built without eviction).
    pub fn set_eviction(&self, e: Eviction) {
        self.inner.set_eviction(e);
    }

    /// The eviction setting in force.
    pub fn eviction(&self) -> Eviction {
        self.inner.eviction()
    }
}

impl Inner {
    pub(crate) fn set_eviction(&self, e: Eviction) {
        if e.evicts() {
            self.mem.track_access();
        }
        self.eviction.store(e.encode(), Ordering::Release);
    }

    #[inline]
    pub(crate) fn eviction(&self) -> Eviction {
        Eviction::decode(self.eviction.load(Ordering::Acquire))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        self.inner.wake_workers();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::short_eq;

    #[test]
    fn short_eq_agrees_with_slice_equality() {
        let base: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
        for n in 0..=64 {
            let a = &base[..n];
            assert!(short_eq(a, a));
            for m in 0..=64 {
                assert_eq!(short_eq(a, &base[..m]), n == m);
            }
            // One byte changed anywhere is a different key.
            for i in 0..n {
                let mut b = a.to_vec();
                b[i] ^= 1;
                assert!(!short_eq(a, &b), "len {n}, byte {i}");
            }
        }
    }
}
