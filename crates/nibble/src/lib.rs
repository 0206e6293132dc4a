//! # nibble — a concurrent log-structured key-value store
//!
//! Nibble (dissertation ch. 3-5) keeps objects in per-NUMA-node logs with
//! one head per CPU, finds them through a partitioned hash table read under
//! optimistic concurrency, coordinates readers and compaction with a
//! TSC-stamped epoch table, and reclaims space by compacting segments
//! chosen by a cost-benefit score. Nibble-2 (ch. 6.2) overwrites an
//! existing object in place when the new value fits, which removes most of
//! compaction's work under update-heavy workloads; it is `Mode::Nibble2`.
//!
//! | module | paper | concern |
//! |---|---|---|
//! | [`index`] | §4.3 | subtables of 128-byte seqlocked buckets, neighbour overflow, in-place growth |
//! | `memory` | §4.2, §4.5 | 64 KiB blocks from the buddy allocator, segments, SegmentInfo; the only raw pool accessors |
//! | `live` | §4.5 | live bytes per segment, CPU-striped |
//! | `log` | §4.4 | multi-head logs, head choice by CPU id, rolling |
//! | `compaction` | §4.4, ch. 6 | per-node workers, cost-benefit selection, relocation, epoch retirement |
//! | [`store`] | §4.1, §6.2 | the API, Nibble-2's in-place update, sizing, the error type |
//! | [`object`] | §4.2 | the object header |
//! | [`item`] | — | write options, conditions, item metadata (shared with `nibblejmp`) |
//! | [`engine`] | — | [`KvEngine`], the engine API both stores implement |
//! | [`backoff`] | — | lock-waiter backoff (shared with `nibblejmp`) |
//!
//! `memory`, `live`, `log` and `compaction` are crate-private: they hand
//! out raw pool memory under contracts only this crate can keep. Outside
//! code needs only [`BLOCK_BYTES`] from them.
//!
//! Capacity: a store is created with a capacity in bytes. The index gets a
//! budget (6.2 % by default), per-block metadata is set aside, and the rest
//! is the block pool, of which a share (1 %, at least a segment per
//! compaction worker) is reserved for compaction.
//! RSS stays within the capacity plus the threads' stacks and a few
//! fixed-size tables.
//!
//! ```
//! use nibble::{Config, Store};
//! let store = Store::new(Config::new(64 << 20)).unwrap();
//! store.put(b"hello", b"world").unwrap();
//! assert_eq!(store.get(b"hello").unwrap().as_deref(), Some(&b"world"[..]));
//! assert!(store.delete(b"hello").unwrap());
//! ```

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

pub mod backoff;
pub(crate) mod compaction;
pub mod engine;
pub mod index;
pub mod item;
pub(crate) mod live;
pub(crate) mod log;
pub mod memory;
pub mod object;
pub mod prefetch;
pub(crate) mod sketch;
pub mod store;

pub use engine::{EngineStats, KvEngine};
pub use item::{check_condition, ConditionFailed};
pub use memory::BLOCK_BYTES;
/// The result type of the engine API.
pub type Result<T> = std::result::Result<T, Error>;
pub use store::{
    hash_key, Condition, Config, Error, Eviction, EvictionPolicy, Expiry, ItemMeta, Mode,
    PutOptions, Rmw, Stats, Store, MAX_KEY_BYTES, MIN_CAPACITY_BYTES,
};
