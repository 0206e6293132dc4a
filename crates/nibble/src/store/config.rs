//! A store's configuration ([`Config`], [`Mode`]), its sizing defaults,
//! and its error type ([`Error`]).
//!
//! The defaults are the dissertation's where it gives one (32 MiB
//! segments, §4.2; a 1-2 % compaction reserve, §5) and otherwise chosen
//! for small machines, each with its reason beside it. Nibble-2
//! (`Mode::Nibble2`, §6.2) is a mode of the same store, not another type:
//! it changes only the write path.
use super::*;

/// Smallest capacity a store accepts.
pub const MIN_CAPACITY_BYTES: usize = 8 << 20;
/// Default largest segment (the paper's 32 MiB).
pub const DEFAULT_MAX_SEGMENT_BYTES: usize = 32 << 20;
/// A small store gets at least this many segments' worth of blocks. Many
/// small segments let compaction find emptier victims (the spread of
/// utilization between segments is what cost-benefit selection feeds on)
/// and keep the reserve, at least a segment per worker, small: at 256, a
/// 114 MiB store (15,249 blocks) has 59-block (3.7 MiB) segments and a
/// 0.8 % minimum reserve for two workers. More segments would not help: at
/// 90 % utilization the best victims are equally live either way.
pub const MIN_SEGMENTS_PER_STORE: usize = 256;
/// Default largest value.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 16 << 20;
/// Largest key.
pub const MAX_KEY_BYTES: usize = u16::MAX as usize;
/// Default share of capacity for the index, in thousandths.
pub const DEFAULT_INDEX_PERMILLE: usize = 62;
/// Default share of the pool kept for compaction, in thousandths (at
/// least one segment per compaction worker). The dissertation reserves
/// 1-2 % (§5); compaction fills one open destination per worker and frees
/// each compacted segment as soon as the epoch allows, so it never needs
/// more than a segment of headroom per worker, and every block held back
/// is a block of free space compaction cannot use to find emptier victims:
/// hence the low end of the paper's range. At 90 % utilization the free
/// space the reserve holds back is a tenth of all free space, and cleaning
/// cost (relocations per write, `memlab fill`) grows as free space
/// shrinks.
pub const DEFAULT_RESERVE_PERMILLE: usize = 10;
/// Compaction starts when the client's free blocks fall below this share
/// of the client budget (and at least two segments per head: every head
/// can roll twice before a writer waits). The dissertation starts at 20 %
/// ([`PAPER_COMPACTION_TRIGGER_PERMILLE`], still selectable); free blocks
/// compaction makes ahead of need are free space its victims lack, so it
/// copies more (more relocations per write in `memlab fill`). Writers that
/// find no space run compaction themselves, so a burst waits at most for
/// a pass.
pub const DEFAULT_COMPACTION_TRIGGER_PERMILLE: usize = 20;
/// The dissertation's compaction trigger: 20 % of the client budget free.
pub const PAPER_COMPACTION_TRIGGER_PERMILLE: usize = 200;
/// Default decay before unused free blocks are given back to the OS, ms.
pub const DEFAULT_DECAY_MS: u64 = 1000;
/// Default longest wait of a write for space while compaction progresses, ms.
pub const DEFAULT_MAX_WRITE_WAIT_MS: u64 = 2000;

/// Nibble or Nibble-2.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Every PUT appends (§4).
    #[default]
    Nibble,
    /// A PUT to an existing key whose value fits overwrites in place (§6.2).
    Nibble2,
}

impl Mode {
    /// Name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Nibble => "nibble",
            Mode::Nibble2 => "nibble2",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "nibble" | "nibble1" => Ok(Mode::Nibble),
            "nibble2" | "nibble-2" => Ok(Mode::Nibble2),
            _ => Err(format!("unknown mode {s:?} (nibble, nibble2)")),
        }
    }
}

/// Store configuration. `Config::new(capacity)` gives the defaults.
#[derive(Clone, Debug)]
pub struct Config {
    /// Total bytes: log, index and metadata.
    pub capacity_bytes: usize,
    /// Nibble or Nibble-2.
    pub mode: Mode,
    /// Segment size; `None` = 32 MiB or smaller for a small store.
    pub segment_bytes: Option<usize>,
    /// Heads per node; `None` = one per CPU of the node.
    pub heads_per_node: Option<usize>,
    /// Compaction workers per node; `None` = one per 8 CPUs of the node,
    /// at least two when the node has two CPUs or more.
    pub compaction_workers: Option<usize>,
    /// Epoch scheme.
    pub epoch: EpochKind,
    /// Largest value accepted (at most
    /// [`crate::object::MAX_VALUE_BYTES`], just under 1 GiB).
    pub max_value_bytes: usize,
    /// Index share of capacity, thousandths: the index's own budget, which
    /// the log never uses.
    pub index_permille: usize,
    /// Past its own share, the index may borrow the log's free blocks, so
    /// a store of small objects is limited by its capacity rather than by
    /// the index share (default). False: the index stops at its share
    /// (the fixed split, for comparison).
    pub index_borrows_from_log: bool,
    /// Compaction reserve share of the pool, thousandths.
    pub reserve_permille: usize,
    /// Compaction trigger, thousandths of the client budget left free.
    pub compaction_trigger_permille: usize,
    /// Free blocks not reused for this long (ms) are given back to the OS.
    pub decay_ms: u64,
    /// Longest a write waits (ms) for compaction to free space while
    /// compaction is making progress, before it reports out of memory. A
    /// server with one thread per CPU wants this short.
    pub max_write_wait_ms: u64,
    /// What a full store does: refuse writes (`NoEviction`, the default)
    /// or evict (cache mode, module `compaction::evict`). Can be changed
    /// while the store runs ([`crate::Store::set_eviction`]).
    pub eviction: Eviction,
    /// TTL-aware placement (Segcache's TTL buckets, module `log`): writes
    /// with an expiry go to heads chosen by their TTL, so that segments
    /// expire whole and the expiry pass frees them without relocating
    /// live data (default). False: every write goes to its CPU's head,
    /// and expired objects are unlinked by reading the mixed segments
    /// that hold them (for comparison, `memlab expire`).
    pub ttl_placement: bool,
    /// Map the whole log in at creation (`MADV_POPULATE_WRITE` over the
    /// pool, in 2 MiB pages), as the original Nibble prototype does, so
    /// no write ever waits for a page fault; RSS is then the capacity
    /// from the start. Off by default: a store's memory follows its data
    /// (module `memory`, "Giving memory back"), and the faults cost a
    /// load about an eighth of its time (docs/BENCHMARKS.md, `memlab
    /// ycsb`). The first decay-time release gives unused blocks back.
    pub prefault: bool,
    /// Map the next 2 MiB region in ahead of the log (module
    /// `memory::ahead`): when a client's append takes blocks while fewer
    /// than 1 MiB of free memory is resident, a compaction worker faults
    /// a fresh region in and hands it to the next heads, so clients do not
    /// wait for the huge-page faults of a growing log. Costs at most one
    /// region of resident memory beyond what the log itself would fault
    /// in, and nothing on a quiet store. On by default.
    pub map_ahead: bool,
    /// How many keys the store expects to hold (0: no hint), the analogue
    /// of a map's `with_capacity`. The index starts with room for that
    /// many below its growth threshold (each subtable's bucket count
    /// rounded up to a power of two, within the index's byte budget), so a
    /// load of that many keys never stops to double a subtable; the
    /// buckets are mapped in at creation and count against the capacity
    /// as the index always does (about 16-25 bytes a key). The index never
    /// shrinks below that size. Without a hint it starts at one page per
    /// subtable and grows with the keys.
    pub expected_keys: usize,
}

impl Config {
    /// Defaults for `capacity_bytes`.
    pub fn new(capacity_bytes: usize) -> Config {
        Config {
            capacity_bytes,
            mode: Mode::Nibble,
            segment_bytes: None,
            heads_per_node: None,
            compaction_workers: None,
            epoch: EpochKind::Tsc,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            index_permille: DEFAULT_INDEX_PERMILLE,
            index_borrows_from_log: true,
            reserve_permille: DEFAULT_RESERVE_PERMILLE,
            compaction_trigger_permille: DEFAULT_COMPACTION_TRIGGER_PERMILLE,
            decay_ms: DEFAULT_DECAY_MS,
            max_write_wait_ms: DEFAULT_MAX_WRITE_WAIT_MS,
            eviction: Eviction::default(),
            ttl_placement: true,
            prefault: false,
            map_ahead: true,
            expected_keys: 0,
        }
    }
}

/// Errors.
/// Which objects cache mode evicts when free segments run short and
/// compaction cannot free enough (module `compaction::evict`). Every
/// policy evicts whole segments; they differ in which segments and in
/// what survives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EvictionPolicy {
    /// Never evict: a write that finds no space fails with
    /// `OutOfMemory` (Redis's default).
    #[default]
    NoEviction,
    /// The oldest segment, whole (age order: FIFO at segment grain).
    Fifo,
    /// The segment with the fewest live bytes (the least data lost per
    /// segment freed).
    LeastLive,
    /// A segment picked at random.
    Random,
    /// Segcache's merge eviction (NSDI'21 §4.3): the oldest few segments
    /// at once, keeping the objects read since they were written (their
    /// accessed bit), up to half of the merged bytes; the survivors
    /// move to a new segment, at the young end of the age order (a
    /// CLOCK-like second chance, at no per-object list cost).
    Merge,
}

impl EvictionPolicy {
    /// The policy's name (as `FromStr` takes it).
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::NoEviction => "noeviction",
            EvictionPolicy::Fifo => "fifo",
            EvictionPolicy::LeastLive => "least-live",
            EvictionPolicy::Random => "random",
            EvictionPolicy::Merge => "merge",
        }
    }
}

impl std::str::FromStr for EvictionPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            EvictionPolicy::NoEviction,
            EvictionPolicy::Fifo,
            EvictionPolicy::LeastLive,
            EvictionPolicy::Random,
            EvictionPolicy::Merge,
        ]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| {
            format!("unknown eviction policy {s:?} (noeviction, fifo, least-live, random, merge)")
        })
    }
}

/// A store's eviction setting: the policy, and whether only items with
/// an expiry may go (Redis's `volatile-*`; items without one are
/// relocated like pinned ones, and a store of only those refuses writes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Eviction {
    /// Which segments go, and what survives.
    pub policy: EvictionPolicy,
    /// Evict only items that have an expiry.
    pub volatile_only: bool,
}

impl Eviction {
    /// The setting as one byte (for an atomic).
    pub(crate) fn encode(self) -> u8 {
        self.policy as u8 | if self.volatile_only { 0x80 } else { 0 }
    }

    /// The setting from [`Eviction::encode`]'s byte.
    pub(crate) fn decode(b: u8) -> Eviction {
        let policy = match b & 0x7F {
            1 => EvictionPolicy::Fifo,
            2 => EvictionPolicy::LeastLive,
            3 => EvictionPolicy::Random,
            4 => EvictionPolicy::Merge,
            _ => EvictionPolicy::NoEviction,
        };
        Eviction {
            policy,
            volatile_only: b & 0x80 != 0,
        }
    }

    /// Whether the store evicts at all.
    pub fn evicts(self) -> bool {
        self.policy != EvictionPolicy::NoEviction
    }
}

#[derive(Debug)]
pub enum Error {
    /// Capacity below [`MIN_CAPACITY_BYTES`].
    CapacityTooSmall {
        /// Asked for.
        requested: usize,
        /// The minimum.
        minimum: usize,
    },
    /// Bad configuration.
    Config(String),
    /// Mapping memory failed.
    Io(io::Error),
    /// Empty or too long key.
    BadKey {
        /// Its length.
        len: usize,
    },
    /// Value longer than the configured limit.
    ValueTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// No space: live data plus reserve fill the capacity and compaction
    /// cannot free more, or the index is full.
    OutOfMemory {
        /// What ran out.
        what: &'static str,
    },
    /// Conditional write: the key exists.
    Exists,
    /// Conditional write: the key does not exist.
    NotFound,
    /// Compare-and-swap: the version differs.
    VersionMismatch {
        /// The current version.
        current: u64,
    },
    /// The epoch table has no free slot for this thread.
    Epoch(EpochError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::CapacityTooSmall { requested, minimum } => write!(
                f,
                "capacity {requested} bytes is below the minimum of {minimum} bytes"
            ),
            Error::Config(s) => write!(f, "invalid configuration: {s}"),
            Error::Io(e) => write!(f, "mapping store memory: {e}"),
            Error::BadKey { len } => {
                write!(
                    f,
                    "key of {len} bytes: keys are at most {MAX_KEY_BYTES} bytes"
                )
            }
            Error::ValueTooLarge { len, max } => {
                write!(f, "value of {len} bytes exceeds the limit of {max} bytes")
            }
            Error::OutOfMemory { what } => write!(f, "out of memory ({what})"),
            Error::Exists => write!(f, "key exists"),
            Error::NotFound => write!(f, "key not found"),
            Error::VersionMismatch { current } => {
                write!(f, "version mismatch (current version {current})")
            }
            Error::Epoch(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<crate::item::ConditionFailed> for Error {
    fn from(e: crate::item::ConditionFailed) -> Self {
        use crate::item::ConditionFailed;
        match e {
            ConditionFailed::Exists => Error::Exists,
            ConditionFailed::NotFound => Error::NotFound,
            ConditionFailed::VersionMismatch { current } => Error::VersionMismatch { current },
        }
    }
}

impl From<EpochError> for Error {
    fn from(e: EpochError) -> Self {
        Error::Epoch(e)
    }
}
