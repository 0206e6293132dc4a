//! The index (dissertation §4.3): a key hash -> object location map that
//! every GET and PUT consults, built for many cores. It is an open-addressing
//! hash table split into independent subtables (spread over NUMA nodes);
//! the hash picks the subtable (bits 47.., just below the tag) and the home
//! bucket in it (the low 32 bits scaled to the subtable's size,
//! multiply-shift, so a subtable can have any number of buckets). A bucket is 128 bytes, two cache lines: a
//! version word and 15 entries, each a 16-bit tag (the hash's top bits) and
//! a 48-bit [`Loc`]. Keys live in the log, not here: a lookup offers every
//! tag-matching location to the caller, who checks the key in the object.
//!
//! Concurrency is optimistic (module [`bucket`]): writers lock a bucket by
//! making its version odd; readers take no lock, read the version, the
//! entries, the version again, and retry if it moved (Boehm's seqlock, with
//! relaxed entry loads and an acquire fence; the argument is in `bucket`).
//!
//! Overflow: an entry may sit in its home bucket or in one second bucket,
//! `(home + d) mod n` with `d` in `1..n` scaled from the tag (a two-bucket
//! neighbourhood, [`Neighbour`]).
//! Writers lock both, lower index first (one global order, shared with the
//! resizer, so no deadlock); readers validate both. Insert goes home
//! while home has [`HOME_SPARE_SLOTS`] free entries, else to the emptier,
//! so a full bucket spills instead of forcing a growth (only when both
//! are full must the subtable grow), yet most keys sit where a read looks
//! first. Why not unbounded linear
//! probing: a lookup stays 2 buckets, 4 cache lines, 2 versions to check,
//! and a miss costs what a hit costs, whatever the load. Why not the
//! adjacent bucket: adjacent neighbourhoods overlap, and at 4096 buckets
//! the first overflow comes at a load of ~0.6 (one bucket alone: ~0.35);
//! an independent second choice pushes it to ~0.83 (`tests/index.rs`).
//!
//! Growth, per subtable and in place: the subtable maps its largest bucket
//! array once (`MAP_NORESERVE`, module `reservation`) and uses the first `n`.
//! The dissertation doubles a subtable (§4.3: bucket `c` splits into `c`
//! and `c + n`); here a growth adds a quarter ([`GROWTH_DIVISOR`]),
//! because a table that doubles is under 60 % full half of its life and
//! the index is the largest overhead of a store of small objects (issue
//! 23: `memlab frag`'s 64→128 pair ended with 1.15 M keys in a 16 MiB
//! index 58 % full; growing by quarters keeps it 68-85 % full, 12 MiB
//! there). A growth locks all `n` buckets in ascending order (the global
//! order writers use, so no deadlock), rebuilds the entries into a
//! scratch array of the new size with the writers' two-choice rule
//! (`index/grow.rs`), writes it over the locked buckets and the new
//! ones, bumps the subtable's generation, publishes the new size with a
//! release store and unlocks. Every key moves, so SCAN cannot rely on
//! the paper's split order: its cursor carries the subtable's generation
//! and restarts a subtable that resized under it (`index/scan.rs`).
//! Everyone
//! reads `n` (acquire) before touching buckets and re-checks it after
//! locking or validating: a resize that finished in between is seen there
//! (its unlock happened after the store of `n`) and the operation retries.
//! The entry holds only 16 hash bits, so the resizer asks the store for the
//! hash of each object ([`Index::new`]'s `rehash`). Growth fails with
//! [`IndexError::Full`] beyond the reservation or the byte budget; it also
//! starts early once a subtable's load passes `grow_load_factor`. A store
//! told how many keys to expect (`Config::expected_keys`, [`initial_buckets_for`])
//! starts each subtable at the size that holds its share of them at
//! [`PRESIZE_LOAD`] (below the growth threshold and below the load where
//! the first neighbourhood fills), so a load of that many keys never stops its
//! writers for a growth (a growth locks a whole subtable, and with
//! eight subtables the other writers soon wait on it; it rehashes every
//! key of the subtable from the log). A growth's new buckets' pages are populated writable before the resizer
//! locks its buckets (`Reservation::populate`). The byte
//! budget (`max_bytes`) is the index's own share; with an
//! [`IndexOverflow`] set ([`Index::set_overflow`]) the index may grow past
//! it, each byte above it borrowed from the owner's budget (the store
//! lends it from the log's free blocks), so the split between index and
//! log follows the data instead of a fixed share. The index also shrinks:
//! once deletes leave a subtable under [`SHRINK_LOAD`], the store's
//! compaction worker rebuilds it smaller in place on its next step (every
//! 20 ms, while clients run as while they are quiet), to half full, and
//! releases the buckets above the new size once the epoch passes, so a
//! store's index follows its key count down as well as up
//! (`index/shrink.rs`).
//!
//! Files: this one holds the types, construction and the optimistic read;
//! `index/bucket.rs` the seqlocked bucket, `index/write.rs` the writers'
//! lock and guard, `index/grow.rs` the growth by a quarter and the
//! rebuild it shares with `index/shrink.rs`, the shrinking of sparse
//! subtables, `index/scan.rs`
//! the SCAN cursor, `index/reservation.rs` the never-moving bucket arrays.

pub mod bucket;
mod grow;
mod reservation;
mod scan;
mod shrink;
pub(crate) mod sync;
mod write;

use core::fmt;

use crossbeam_utils::CachePadded;

pub use self::grow::GROWTH_DIVISOR;
use self::reservation::{IndexBucket, Reservation};
pub use self::scan::GENERATION_BITS;
pub use self::shrink::{Shrunk, SHRINK_LOAD, SHRINK_TO_LOAD};
use self::sync::{AtomicU64, AtomicUsize, Ordering};
use self::write::free_slots;
pub use self::write::{Slot, WriteGuard};

/// A location: an opaque non-zero value below 2^[`LOC_BITS`] (the store's
/// byte offset of the object in its pool).
pub type Loc = u64;

/// Width of a [`Loc`] in bits; the entry's other 16 bits are the tag.
pub const LOC_BITS: u32 = 48;

/// Mask of the location bits of an entry.
const LOC_MASK: u64 = (1 << LOC_BITS) - 1;

/// Entries per bucket: 15 × 8 bytes + the 8-byte version = 128 bytes.
pub const ENTRIES_PER_BUCKET: usize = 15;

/// An insert goes to its home bucket while the home bucket has at least
/// this many free entries, else to the emptier bucket of its neighbourhood.
/// Always the emptier (balanced two-choice) leaves a third of the keys in
/// their second bucket, and a read of one of those pays a second dependent
/// miss; always home overflows at a load of ~0.5. With 5, most keys go
/// home at every load and the first overflow comes at ~0.83 instead of
/// ~0.87 (`tests/index.rs`). A table that grew keeps the spills of its
/// fuller phases (a resize does not move entries home, see the module
/// docs).
pub const HOME_SPARE_SLOTS: usize = 5;

/// Size and alignment of a bucket: two 64-byte cache lines.
pub const BUCKET_BYTES: usize = 128;

/// Buckets in a neighbourhood: home and the second bucket. Every lookup
/// reads exactly this many buckets (the maximum probe length).
pub const NEIGHBOURHOOD_BUCKETS: usize = 2;

/// Subtables per NUMA node in the default configuration: enough that
/// concurrent resizes (each locks a whole subtable, and happen only as the
/// key count doubles) rarely meet, and few enough that a subtable of a
/// store of a million keys passes 2 MiB and gets huge pages (see
/// `index/reservation.rs`).
pub const DEFAULT_SUBTABLES_PER_NODE: usize = 8;

/// Default initial buckets per subtable: 32 × 128 bytes = one 4 KiB page.
pub const DEFAULT_INITIAL_BUCKETS_PER_SUBTABLE: usize = 32;

/// Default reservation per subtable: 2^22 buckets = 512 MiB of address
/// space (63 M entries); only touched pages cost memory.
pub const DEFAULT_MAX_BUCKETS_PER_SUBTABLE: usize = 1 << 22;

/// How many buckets ahead of its rehash a resize prefetches the objects
/// of ([`Index::set_rehash_prefetch`]): two buckets, up to 30 objects in
/// flight, about what one core's miss queue holds.
pub const REHASH_PREFETCH_BUCKETS: usize = 2;

/// Default load (entries / slots) past which a subtable grows proactively.
pub const DEFAULT_GROW_LOAD_FACTOR: f64 = 0.85;

/// Load (entries / slots) an index pre-sized by [`initial_buckets_for`]
/// reaches at its expected key count: below the growth threshold
/// ([`DEFAULT_GROW_LOAD_FACTOR`]) and below the load where the first
/// two-bucket neighbourhood fills (about 0.83-0.87, `tests/index.rs`), which
/// would grow a subtable as surely as the threshold.
pub const PRESIZE_LOAD: f64 = 0.75;

/// Buckets per subtable for an index of `subtables` subtables that should
/// hold `expected_keys` keys without growing (`Config::expected_keys`):
/// each subtable's share at [`PRESIZE_LOAD`] with four standard
/// deviations of headroom, rounded up to a power of two, at least
/// [`DEFAULT_INITIAL_BUCKETS_PER_SUBTABLE`] and at most
/// [`DEFAULT_MAX_BUCKETS_PER_SUBTABLE`]; halved while the buckets would
/// not fit `max_bytes` (the index's budget, of which a quarter is left for
/// its metadata and later growth). 0 keys gives the default.
pub fn initial_buckets_for(expected_keys: usize, subtables: usize, max_bytes: usize) -> usize {
    if expected_keys == 0 {
        return DEFAULT_INITIAL_BUCKETS_PER_SUBTABLE;
    }
    // Keys spread binomially over the subtables: leave four standard
    // deviations above the even share, so no subtable fills early.
    let even = expected_keys.div_ceil(subtables.max(1)) as f64;
    let per_subtable = even + 4.0 * even.sqrt();
    let slots = per_subtable / PRESIZE_LOAD;
    let wanted = (slots / ENTRIES_PER_BUCKET as f64).ceil() as usize;
    let mut buckets = wanted
        .clamp(
            DEFAULT_INITIAL_BUCKETS_PER_SUBTABLE,
            DEFAULT_MAX_BUCKETS_PER_SUBTABLE,
        )
        .next_power_of_two();
    let budget = max_bytes / 4 * 3;
    while buckets > DEFAULT_INITIAL_BUCKETS_PER_SUBTABLE
        && buckets
            .saturating_mul(subtables)
            .saturating_mul(BUCKET_BYTES)
            > budget
    {
        buckets /= 2;
    }
    buckets
}

#[cfg(not(loom))]
const _: () = {
    assert!(core::mem::size_of::<IndexBucket>() == BUCKET_BYTES);
    assert!(core::mem::align_of::<IndexBucket>() == BUCKET_BYTES);
};

/// Configuration of an [`Index`].
#[derive(Clone, Debug, PartialEq)]
pub struct IndexConfig {
    /// Number of subtables; a power of two.
    pub subtables: usize,
    /// Buckets each subtable starts with; a power of two, at least 2.
    pub initial_buckets_per_subtable: usize,
    /// Buckets each subtable may grow to (its address-space reservation,
    /// × 128 bytes); a power of two, at least the initial size.
    pub max_buckets_per_subtable: usize,
    /// Budget for [`Index::memory_bytes`]: a growth that would exceed it
    /// fails with [`IndexError::Full`]. The store sets it from its capacity;
    /// `usize::MAX` means "only the reservations limit growth".
    pub max_bytes: usize,
    /// Load factor (entries / slots of a subtable) past which the next
    /// writer to lock in that subtable grows it first; `>= 1.0` disables
    /// proactive growth (subtables then grow only when a neighbourhood is
    /// full).
    pub grow_load_factor: f64,
    /// Prefer subtable `i`'s memory on NUMA node `i mod nodes` (no effect on
    /// a single-node machine).
    pub numa_bind: bool,
    /// Where a key's second bucket is (an ablation; see [`Neighbour`]).
    pub neighbour: Neighbour,
}

/// Which bucket is the second of a key's two-bucket neighbourhood.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Neighbour {
    /// `(home + (tag | 1)) mod n`: an odd distance taken from the tag, so
    /// the two choices are nearly independent (the "power of two choices");
    /// the first overflow comes at a load of ~0.87.
    #[default]
    TagOffset,
    /// `(home + 1) mod n`, the adjacent bucket (linear probing cut at two
    /// buckets); neighbourhoods overlap, and the first overflow comes at a
    /// load of ~0.65 with 4096 buckets.
    Adjacent,
}

impl Default for IndexConfig {
    fn default() -> Self {
        let nodes = topology::topology().num_nodes().max(1);
        IndexConfig {
            subtables: (DEFAULT_SUBTABLES_PER_NODE * nodes).next_power_of_two(),
            initial_buckets_per_subtable: DEFAULT_INITIAL_BUCKETS_PER_SUBTABLE,
            max_buckets_per_subtable: DEFAULT_MAX_BUCKETS_PER_SUBTABLE,
            max_bytes: usize::MAX,
            grow_load_factor: DEFAULT_GROW_LOAD_FACTOR,
            numa_bind: true,
            neighbour: Neighbour::default(),
        }
    }
}

/// Why an index operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexError {
    /// No room: a neighbourhood is full and its subtable cannot grow (the
    /// reservation or the byte budget is exhausted). The store reports
    /// out-of-memory for the insert; existing entries are unaffected.
    Full,
    /// The configuration is invalid, or its reservation cannot be mapped.
    Config(String),
}

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexError::Full => f.write_str("index full"),
            IndexError::Config(why) => write!(f, "invalid index configuration: {why}"),
        }
    }
}

impl std::error::Error for IndexError {}

/// A snapshot of an index's shape and counters (see [`Index::stats`]).
/// Counters are cumulative since creation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IndexStats {
    /// Number of subtables.
    pub subtables: usize,
    /// Buckets in use, all subtables.
    pub buckets: u64,
    /// Smallest subtable, in buckets.
    pub min_subtable_buckets: usize,
    /// Largest subtable, in buckets.
    pub max_subtable_buckets: usize,
    /// Live entries.
    pub entries: u64,
    /// Entry slots in use buckets (`buckets × 15`).
    pub slots: u64,
    /// `entries / slots`.
    pub load_factor: f64,
    /// Buckets read by every lookup (the probe length; constant).
    pub max_probe_buckets: usize,
    /// [`Index::memory_bytes`].
    pub memory_bytes: u64,
    /// Address space reserved for buckets, all subtables.
    pub reserved_bytes: u64,
    /// Completed growths.
    pub resizes: u64,
    /// Completed shrinks (`index/shrink.rs`).
    pub shrinks: u64,
    /// Shrinks cancelled because a neighbourhood of the smaller table would overflow.
    pub shrinks_cancelled: u64,
    /// Growths refused for lack of reservation or budget.
    pub failed_resizes: u64,
    /// Inserts that went to the neighbour bucket rather than home.
    pub neighbour_inserts: u64,
    /// Inserts refused because both buckets were full.
    pub full_inserts: u64,
    /// Entries a resize left in place because `rehash` gave a hash that
    /// does not match their tag or position (a store bug; 0 expected).
    pub rehash_mismatches: u64,
}

/// Per-subtable counters, written by writers under their bucket locks
/// (relaxed: they are statistics and a growth heuristic, not protocol).
#[derive(Default)]
struct Counters {
    entries: AtomicU64,
    neighbour_inserts: AtomicU64,
    full_inserts: AtomicU64,
    resizes: AtomicU64,
    shrinks: AtomicU64,
    shrinks_cancelled: AtomicU64,
    failed_resizes: AtomicU64,
    rehash_mismatches: AtomicU64,
}

/// One subtable: a reservation of which the first `n` buckets are in use.
struct Subtable {
    buckets: Reservation,
    /// Buckets in use (any count from 2 up to the reservation). Stored
    /// (release) only by a resizer holding every bucket lock; read
    /// (acquire) before every access.
    n: AtomicUsize,
    /// Completed resizes (growths and shrinks), bumped before `n` is
    /// published: a SCAN cursor carries the low bits and restarts the
    /// subtable when they changed (`index/scan.rs`).
    generation: AtomicU64,
    /// Entry count past which the next `lock` grows the subtable first.
    grow_at: AtomicU64,
    /// A shrink is tried only while the entry count is below this
    /// (`u64::MAX`: no limit): a shrink that a full neighbourhood cancelled
    /// sets it to 3/4 of the count it saw, so a subtable that cannot shrink
    /// is not locked whole again on every compaction step until deletes
    /// have thinned it further; a completed resize lifts it.
    shrink_below: AtomicU64,
    counters: CachePadded<Counters>,
}

impl Subtable {
    #[inline]
    fn bucket(&self, i: usize) -> &IndexBucket {
        self.buckets.bucket(i)
    }
}

/// Why a resize was requested; re-checked once every bucket is locked, so
/// that a resize that lost the race to another does not grow again.
#[derive(Clone, Copy)]
enum Trigger {
    /// The neighbourhood of this hash was full.
    Full(u64),
    /// The subtable's load passed `grow_load_factor`.
    Load,
}

/// The function the resizer uses to learn the full hash of an entry's key:
/// given a location, hash the key stored there (see [`Index::new`]).
pub type RehashFn = Box<dyn Fn(Loc) -> u64 + Send + Sync>;

/// The owner's hint that a resize will soon [`RehashFn`] the object at a
/// location: start loading its header and key (see
/// [`Index::set_rehash_prefetch`]).
pub type RehashPrefetchFn = Box<dyn Fn(Loc) + Send + Sync>;

/// Where an index that outgrew its own byte budget borrows more (the
/// store: its log's free blocks).
pub trait IndexOverflow: Send + Sync {
    /// Take `bytes` more; false if they are not there.
    fn take(&self, bytes: u64) -> bool;
    /// Give back `bytes` taken earlier.
    fn give_back(&self, bytes: u64);
}

/// The concurrent hash index of §4.3. See the module documentation.
pub struct Index {
    subtables: Box<[CachePadded<Subtable>]>,
    /// `log2(subtables)`.
    subtable_bits: u32,
    /// `log2(max_buckets_per_subtable)`: the per-subtable part of a scan
    /// cursor.
    cursor_bucket_bits: u32,
    max_buckets: usize,
    /// Buckets a subtable starts with; a shrink stops there.
    initial_buckets: usize,
    grow_load_factor: f64,
    neighbour: Neighbour,
    max_bytes: u64,
    /// Fixed bytes (this struct and the subtable descriptors).
    metadata_bytes: u64,
    /// Bytes of buckets in use, all subtables; a growth reserves its share
    /// here (compare-and-swap against `max_bytes`) before touching memory.
    bucket_bytes: CachePadded<AtomicU64>,
    /// Bytes of `bucket_bytes` above `max_bytes`, borrowed from `overflow`.
    borrowed_bytes: AtomicU64,
    overflow: std::sync::OnceLock<Box<dyn IndexOverflow>>,
    rehash: RehashFn,
    /// Called on entries a few buckets ahead of the resize's rehash
    /// ([`Index::set_rehash_prefetch`]).
    rehash_prefetch: std::sync::OnceLock<RehashPrefetchFn>,
}

impl fmt::Debug for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Index")
            .field("subtables", &self.subtables.len())
            .field("len", &self.len())
            .field("memory_bytes", &self.memory_bytes())
            .finish_non_exhaustive()
    }
}

/// The tag of a hash (its top 16 bits), in entry position.
#[inline]
fn tag_bits(hash: u64) -> u64 {
    hash & !LOC_MASK
}

/// Entry count past which a subtable of `n` buckets grows proactively.
fn grow_threshold(load_factor: f64, n: usize) -> u64 {
    if load_factor >= 1.0 {
        u64::MAX
    } else {
        (load_factor * (n * ENTRIES_PER_BUCKET) as f64) as u64
    }
}

impl Index {
    /// Creates an index, reserving every subtable's address space.
    ///
    /// `rehash(loc)` must return the full 64-bit hash of the key of the
    /// object at `loc` (the same hash the store passes to [`Index::read`]
    /// and [`Index::lock`]): entries keep only 16 hash bits, so a resize
    /// asks for the rest. It is called only by a resize, with the entry's
    /// bucket locked, so the object is the live copy; it must not call back
    /// into the index.
    pub fn new(
        cfg: &IndexConfig,
        rehash: impl Fn(Loc) -> u64 + Send + Sync + 'static,
    ) -> Result<Index, IndexError> {
        let bad = |why: String| Err(IndexError::Config(why));
        if cfg.subtables == 0 || !cfg.subtables.is_power_of_two() {
            return bad(format!(
                "subtables = {} is not a power of two",
                cfg.subtables
            ));
        }
        let initial = cfg.initial_buckets_per_subtable;
        if initial < 2 || !initial.is_power_of_two() {
            return bad(format!(
                "initial_buckets_per_subtable = {initial} is not a power of two >= 2"
            ));
        }
        let max = cfg.max_buckets_per_subtable;
        if max < initial || !max.is_power_of_two() {
            return bad(format!(
                "max_buckets_per_subtable = {max} is not a power of two >= {initial}"
            ));
        }
        let subtable_bits = cfg.subtables.trailing_zeros();
        let cursor_bucket_bits = max.trailing_zeros();
        // Subtable bits sit just below the tag, bucket bits at the bottom:
        // they must not overlap each other or the tag.
        if subtable_bits + cursor_bucket_bits > LOC_BITS {
            return bad(format!(
                "{} subtables × {max} buckets needs more than {LOC_BITS} hash bits",
                cfg.subtables
            ));
        }
        // A scan cursor holds the subtable, a generation and the bucket.
        if subtable_bits + cursor_bucket_bits + GENERATION_BITS >= 64 {
            return bad(format!(
                "{} subtables × {max} buckets leave no room for a scan cursor",
                cfg.subtables
            ));
        }
        if cfg.grow_load_factor.is_nan() || cfg.grow_load_factor <= 0.0 {
            return bad(format!("grow_load_factor = {}", cfg.grow_load_factor));
        }

        let metadata_bytes = (core::mem::size_of::<Index>()
            + cfg.subtables * core::mem::size_of::<CachePadded<Subtable>>())
            as u64;
        let Some(initial_bytes) = cfg
            .subtables
            .checked_mul(initial)
            .and_then(|b| b.checked_mul(BUCKET_BYTES))
        else {
            return bad(format!(
                "{} subtables × {initial} buckets overflow",
                cfg.subtables
            ));
        };
        let initial_bytes = initial_bytes as u64;
        let max_bytes = cfg.max_bytes as u64;
        if metadata_bytes + initial_bytes > max_bytes {
            return bad(format!(
                "the initial index needs {} bytes, over max_bytes = {max_bytes}",
                metadata_bytes + initial_bytes
            ));
        }

        let nodes = if cfg.numa_bind {
            topology::topology().nodes()
        } else {
            &[]
        };
        let bind = nodes.len() > 1;
        let mut subtables = Vec::with_capacity(cfg.subtables);
        for i in 0..cfg.subtables {
            let node = bind.then(|| nodes[i % nodes.len()].id);
            subtables.push(CachePadded::new(Subtable {
                buckets: Reservation::new(max, node)?,
                n: AtomicUsize::new(initial),
                grow_at: AtomicU64::new(grow_threshold(cfg.grow_load_factor, initial)),
                generation: AtomicU64::new(0),
                shrink_below: AtomicU64::new(u64::MAX),
                counters: CachePadded::new(Counters::default()),
            }));
        }
        for st in &subtables {
            st.buckets.in_use(initial);
            st.buckets.populate(0, initial);
        }
        Ok(Index {
            subtables: subtables.into_boxed_slice(),
            subtable_bits,
            cursor_bucket_bits,
            max_buckets: max,
            initial_buckets: initial,
            grow_load_factor: cfg.grow_load_factor,
            neighbour: cfg.neighbour,
            max_bytes,
            metadata_bytes,
            bucket_bytes: CachePadded::new(AtomicU64::new(initial_bytes)),
            borrowed_bytes: AtomicU64::new(0),
            overflow: std::sync::OnceLock::new(),
            rehash: Box::new(rehash),
            rehash_prefetch: std::sync::OnceLock::new(),
        })
    }

    /// Home and second bucket of `hash` in a subtable of `n` buckets
    /// (`n >= 2`, any count). Home is the low 32 hash bits scaled to `n`
    /// (multiply-shift, Lemire's "fast alternative to the modulo
    /// reduction"); the second is `home + d mod n` with `d` in `1..n`
    /// taken from the tag by the same scaling, so the two differ and are
    /// chosen by independent bits. Two multiplications replace two masks;
    /// the table can then have any size, which is what lets it grow by a
    /// quarter instead of doubling.
    #[inline]
    fn neighbourhood(&self, hash: u64, n: usize) -> (usize, usize) {
        let n64 = n as u64;
        let home = (((hash & 0xffff_ffff) * n64) >> 32) as usize;
        let distance = match self.neighbour {
            Neighbour::TagOffset => 1 + (((hash >> LOC_BITS) * (n64 - 1)) >> 16) as usize,
            Neighbour::Adjacent => 1,
        };
        let second = home + distance;
        (home, if second >= n { second - n } else { second })
    }

    /// The subtable of `hash`: the bits just below the tag.
    #[inline]
    fn subtable(&self, hash: u64) -> &Subtable {
        let i = if self.subtable_bits == 0 {
            0
        } else {
            ((hash >> (LOC_BITS - self.subtable_bits)) as usize) & (self.subtables.len() - 1)
        };
        &self.subtables[i]
    }

    /// Optimistic read: calls `f` on every entry of `hash`'s neighbourhood
    /// whose tag matches; `f` returns `Some(r)` if this is the key. Takes no
    /// lock and retries transparently when a writer or a resize changed the
    /// buckets meanwhile, so `f` may run several times and see locations
    /// that are being replaced: it must be idempotent and must tolerate
    /// reading an object that is no longer live (the store keeps such
    /// memory mapped through its epochs). Returns the validated result.
    pub fn read<R>(&self, hash: u64, mut f: impl FnMut(Loc) -> Option<R>) -> Option<R> {
        let st = self.subtable(hash);
        let tag = tag_bits(hash);
        loop {
            let n = st.n.load(Ordering::Acquire);
            let (home, second) = self.neighbourhood(hash, n);
            let (a, b) = (st.bucket(home), st.bucket(second));
            // Start the second bucket's lines now: a key that spilled
            // there (a quarter of the keys of an index grown from small
            // tables) then costs a parallel miss, not a dependent one.
            Self::prefetch_bucket(b, crate::prefetch::line);
            // The home bucket alone first: most keys live there, and a
            // writer of any key of this neighbourhood locks (and so bumps)
            // both buckets, so a hit validated against the home bucket's
            // version alone saw one quiescent state of the key's entry
            // (a key has one entry). Only a miss there reads the second
            // bucket; a hit never waits for its lines.
            let va = a.read_begin();
            let mut found = Self::search(a, tag, &mut f);
            let mut valid = true;
            if found.is_none() {
                let vb = b.read_begin();
                found = Self::search(b, tag, &mut f);
                valid = b.read_validate(vb);
            }
            // Validate the buckets read, then `n`: a resize that completed
            // before our `read_begin` stored `n` before its unlocking
            // release store, which our acquire load read, so the re-check
            // sees the new size and we retry in the right buckets.
            let valid = a.read_validate(va) & valid;
            if valid && st.n.load(Ordering::Relaxed) == n {
                return found;
            }
        }
    }

    /// The first entry of `bucket` with `tag` for which `f` says yes.
    #[inline(always)]
    fn search<R>(
        bucket: &IndexBucket,
        tag: u64,
        f: &mut impl FnMut(Loc) -> Option<R>,
    ) -> Option<R> {
        for i in 0..ENTRIES_PER_BUCKET {
            let e = bucket.load(i);
            // The tags are equal when `e ^ tag` has none of the top 16
            // bits set, and the entry is not empty when its location is
            // not 0 (a location never is): `e ^ tag` is then in
            // `1..=LOC_MASK`, one subtract and one compare an entry.
            if (e ^ tag).wrapping_sub(1) < LOC_MASK {
                if let Some(r) = f(e & LOC_MASK) {
                    return Some(r);
                }
            }
        }
        None
    }

    /// A hint: the location of the first entry of `hash`'s neighbourhood
    /// whose tag matches, read without lock or validation (a writer or a
    /// resize may be changing the buckets; a tag match may be another key).
    /// For prefetching the object a write is about to lock and read; never
    /// for deciding anything.
    #[inline]
    pub fn peek(&self, hash: u64) -> Option<Loc> {
        let st = self.subtable(hash);
        let tag = tag_bits(hash);
        let (home, second) = self.neighbourhood(hash, st.n.load(Ordering::Relaxed));
        let mut first = |l| Some(l);
        Self::search(st.bucket(home), tag, &mut first)
            .or_else(|| Self::search(st.bucket(second), tag, &mut first))
    }

    /// Hint the CPU to start loading `hash`'s two buckets (a read of them
    /// follows soon). Racy by design: a resize in between only makes the
    /// hint useless.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        self.prefetch_with(hash, crate::prefetch::line);
    }

    /// Like [`Index::prefetch`], when a lock of the buckets follows: the
    /// lines come in the exclusive state the lock's compare-and-swap needs,
    /// instead of shared and then upgraded.
    #[inline]
    pub fn prefetch_for_lock(&self, hash: u64) {
        self.prefetch_with(hash, crate::prefetch::line_for_write);
    }

    /// Prefetch both buckets' lines with `each` (a read starts the second
    /// bucket's lines anyway, see [`Index::read`]).
    #[inline(always)]
    fn prefetch_with(&self, hash: u64, each: fn(*const u8)) {
        #[cfg(not(loom))]
        {
            let st = self.subtable(hash);
            let (home, second) = self.neighbourhood(hash, st.n.load(Ordering::Relaxed));
            for b in [home, second] {
                Self::prefetch_bucket(st.bucket(b), each);
            }
        }
        #[cfg(loom)]
        let _ = (hash, each);
    }

    /// Both lines of one bucket with `each` (a no-op under loom, whose
    /// buckets are not plain memory).
    #[inline(always)]
    fn prefetch_bucket(bucket: &IndexBucket, each: fn(*const u8)) {
        #[cfg(not(loom))]
        {
            let p = bucket as *const IndexBucket as *const u8;
            each(p);
            each(p.wrapping_add(64));
        }
        #[cfg(loom)]
        let _ = (bucket, each);
    }

    /// Live entries (a sum of per-subtable counters; exact when quiescent).
    pub fn len(&self) -> u64 {
        self.subtables
            .iter()
            .map(|st| st.counters.entries.load(Ordering::Relaxed))
            .sum()
    }

    /// True if the index holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Memory the index accounts for: the buckets in use (`n × 128` per
    /// subtable, all touched or about to be) plus fixed metadata. The store
    /// charges this against its capacity; it exceeds `max_bytes` only by
    /// what it borrowed ([`Index::borrowed_bytes`]).
    pub fn memory_bytes(&self) -> u64 {
        self.metadata_bytes + self.bucket_bytes.load(Ordering::Relaxed)
    }

    /// Bytes borrowed beyond `max_bytes` from the [`IndexOverflow`].
    pub fn borrowed_bytes(&self) -> u64 {
        self.borrowed_bytes.load(Ordering::Relaxed)
    }

    /// Set the resize's prefetch hint: `prefetch(loc)` starts loading
    /// what `rehash(loc)` will read, and a resize calls it on the entries
    /// of the bucket [`REHASH_PREFETCH_BUCKETS`] ahead of the one it
    /// rehashes, so the rehash's reads of objects scattered over the log
    /// overlap instead of missing one after another. Only a hint: it must
    /// not fault or touch the index. False if one was set already.
    pub fn set_rehash_prefetch(&self, prefetch: impl Fn(Loc) + Send + Sync + 'static) -> bool {
        self.rehash_prefetch.set(Box::new(prefetch)).is_ok()
    }

    /// Let the index grow past `max_bytes` by borrowing from `overflow`.
    /// Set once; later calls are ignored (returns false).
    pub fn set_overflow(&self, overflow: Box<dyn IndexOverflow>) -> bool {
        self.overflow.set(overflow).is_ok()
    }

    /// Shape and counters (a racy but cheap snapshot).
    pub fn stats(&self) -> IndexStats {
        let mut s = IndexStats {
            subtables: self.subtables.len(),
            min_subtable_buckets: usize::MAX,
            max_probe_buckets: NEIGHBOURHOOD_BUCKETS,
            memory_bytes: self.memory_bytes(),
            ..IndexStats::default()
        };
        for st in self.subtables.iter() {
            let n = st.n.load(Ordering::Relaxed);
            let c = &st.counters;
            s.buckets += n as u64;
            s.min_subtable_buckets = s.min_subtable_buckets.min(n);
            s.max_subtable_buckets = s.max_subtable_buckets.max(n);
            s.entries += c.entries.load(Ordering::Relaxed);
            s.reserved_bytes += st.buckets.bytes() as u64;
            s.resizes += c.resizes.load(Ordering::Relaxed);
            s.shrinks += c.shrinks.load(Ordering::Relaxed);
            s.shrinks_cancelled += c.shrinks_cancelled.load(Ordering::Relaxed);
            s.failed_resizes += c.failed_resizes.load(Ordering::Relaxed);
            s.neighbour_inserts += c.neighbour_inserts.load(Ordering::Relaxed);
            s.full_inserts += c.full_inserts.load(Ordering::Relaxed);
            s.rehash_mismatches += c.rehash_mismatches.load(Ordering::Relaxed);
        }
        s.slots = s.buckets * ENTRIES_PER_BUCKET as u64;
        s.load_factor = s.entries as f64 / s.slots as f64;
        s
    }
}
