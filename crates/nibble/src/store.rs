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

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use epoch::{EpochError, EpochKind, EpochScheme, Epochs};
use parking_lot::{Condvar, Mutex};

use crate::index::{Index, IndexConfig, IndexStats, Loc};
use crate::log::Log;
use crate::memory::{loc_of, off_of, Memory, SegState, BLOCK_BYTES};
use crate::object::{next_version, now_ms, Header};

/// Most value bytes a GET prefetches ahead of reading the header.
const PREFETCH_VALUE_BYTES: usize = 4096;

/// Smallest capacity a store accepts.
pub const MIN_CAPACITY_BYTES: usize = 8 << 20;
/// Default largest segment (the paper's 32 MiB).
pub const DEFAULT_MAX_SEGMENT_BYTES: usize = 32 << 20;
/// A small store gets at least this many segments' worth of blocks. Many
/// small segments let compaction find emptier victims (the spread of
/// utilization between segments is what cost-benefit selection feeds on)
/// and keep the reserve, at least a segment per worker, small: at 256, a
/// 114 MiB store (15,249 blocks) has 59-block (3.7 MiB) segments and a
/// 0.8 % minimum reserve for two workers. (1,024 measured no better at
/// 90 % utilization: the best victims were 83-84 % live either way.)
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
/// cost grows as free space shrinks (`memlab fill`: 1.5 % -> 0.5 % took
/// relocations per write from ~6.1 to ~5.5).
pub const DEFAULT_RESERVE_PERMILLE: usize = 10;
/// Compaction starts when the client's free blocks fall below this share
/// of the client budget (and at least two segments per head: every head
/// can roll twice before a writer waits). The dissertation starts at 20 %
/// ([`PAPER_COMPACTION_TRIGGER_PERMILLE`], still selectable); free blocks
/// compaction makes ahead of need are free space its victims lack, so it
/// copies more: at 90 % utilization (`memlab fill`) 2 % took relocations per
/// write from ~5.8 to ~5.3, and YCSB-A zipfian (~43 % utilization) gained
/// ~10 %. Writers that find no space run compaction themselves, so a burst
/// waits at most for a pass.
pub const DEFAULT_COMPACTION_TRIGGER_PERMILLE: usize = 20;
/// The dissertation's compaction trigger: 20 % of the client budget free.
pub const PAPER_COMPACTION_TRIGGER_PERMILLE: usize = 200;
/// Default decay before unused free blocks are given back to the OS, ms.
pub const DEFAULT_DECAY_MS: u64 = 1000;
/// Default longest wait of a write for space while compaction progresses, ms.
pub const DEFAULT_MAX_WRITE_WAIT_MS: u64 = 2000;
/// Metadata bytes the store sets aside per 64 KiB block (tables, SegmentInfo,
/// buddy lists).
const METADATA_BYTES_PER_BLOCK: usize = 512;
/// Rounds (of `APPEND_WAIT_ROUND_MS`) a write waits for compaction to free
/// space, with no compaction progress, before reporting out of memory.
const APPEND_WAIT_ROUNDS: u32 = 50;
const APPEND_WAIT_ROUND_MS: u64 = 1;

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
    /// Index share of capacity, thousandths.
    pub index_permille: usize,
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
            reserve_permille: DEFAULT_RESERVE_PERMILLE,
            compaction_trigger_permille: DEFAULT_COMPACTION_TRIGGER_PERMILLE,
            decay_ms: DEFAULT_DECAY_MS,
            max_write_wait_ms: DEFAULT_MAX_WRITE_WAIT_MS,
        }
    }
}

/// Errors.
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

impl From<EpochError> for Error {
    fn from(e: EpochError) -> Self {
        Error::Epoch(e)
    }
}

/// What a write requires of the existing item.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Condition {
    /// Nothing.
    #[default]
    Always,
    /// The key must not exist (memcached `add`, Redis `SET NX`).
    IfAbsent,
    /// The key must exist (memcached `replace`, Redis `SET XX`).
    IfPresent,
    /// The key must exist with this version (memcached `cas`).
    IfVersion(u64),
}

/// What a write does to the expiry time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Expiry {
    /// No expiry.
    #[default]
    Never,
    /// Expire at this Unix time in ms.
    At(u64),
    /// Keep the existing item's expiry (Redis `KEEPTTL`).
    Keep,
}

/// Options of a write.
#[derive(Clone, Copy, Debug, Default)]
pub struct PutOptions {
    /// Condition.
    pub condition: Condition,
    /// Expiry.
    pub expiry: Expiry,
    /// Opaque client flags (memcached).
    pub flags: u32,
}

/// Metadata of an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemMeta {
    /// Value length.
    pub value_len: usize,
    /// Version.
    pub version: u64,
    /// Client flags.
    pub flags: u32,
    /// Expiry (Unix ms), if any.
    pub expiry_ms: Option<u64>,
}

impl ItemMeta {
    fn of(h: &Header) -> ItemMeta {
        ItemMeta {
            value_len: h.value_len as usize,
            version: h.version,
            flags: h.flags,
            expiry_ms: (h.expiry_ms != 0).then_some(h.expiry_ms),
        }
    }
}

/// Compaction counters.
#[derive(Default)]
pub(crate) struct CompactionCounters {
    /// Passes run.
    pub passes: AtomicU64,
    /// Segments compacted away.
    pub segments_compacted: AtomicU64,
    /// Bytes copied.
    pub bytes_relocated: AtomicU64,
    /// Expired objects dropped.
    pub expired_reclaimed: AtomicU64,
    /// Dead objects passed over by their mark, without an index probe.
    pub dead_skipped: AtomicU64,
}

/// A statistics snapshot.
#[derive(Clone, Debug)]
pub struct Stats {
    /// Mode.
    pub mode: Mode,
    /// Epoch scheme name.
    pub epoch: &'static str,
    /// Configured capacity.
    pub capacity_bytes: u64,
    /// Bytes of the block pool.
    pub pool_bytes: u64,
    /// Index bytes in use (touched buckets).
    pub index_bytes: u64,
    /// Index budget.
    pub index_budget_bytes: u64,
    /// Metadata outside pool and index.
    pub metadata_bytes: u64,
    /// Live object bytes (headers, keys, values).
    pub live_bytes: u64,
    /// Items in the index.
    pub items: u64,
    /// Blocks in the pool / in use / reserved for compaction.
    pub blocks_total: u64,
    /// Blocks in segments.
    pub blocks_in_use: u64,
    /// Free blocks still resident (reused before any fresh block).
    pub blocks_free_resident: u64,
    /// Blocks given back to the OS so far.
    pub blocks_released: u64,
    /// Compaction reserve.
    pub reserve_blocks: u64,
    /// Segment size in bytes.
    pub segment_bytes: u64,
    /// Segments that are heads, closed, retired.
    pub segments_head: u64,
    /// Closed segments.
    pub segments_closed: u64,
    /// Retired segments waiting for the epoch.
    pub segments_retired: u64,
    /// Compaction passes.
    pub compaction_passes: u64,
    /// Segments compacted.
    pub segments_compacted: u64,
    /// Bytes relocated by compaction.
    pub bytes_relocated: u64,
    /// Expired objects reclaimed by compaction.
    pub expired_reclaimed: u64,
    /// Dead objects compaction passed over by their dead mark (no index
    /// probe).
    pub dead_skipped: u64,
    /// Index figures.
    pub index: IndexStats,
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
    force_compaction: AtomicBool,
    wake: (Mutex<u64>, Condvar),
    space: (Mutex<u64>, Condvar),
    pub(crate) stats: CompactionCounters,
    /// Per node, per compaction worker: its candidates and retire list.
    pub(crate) workers: Vec<Vec<Mutex<crate::compaction::WorkerState>>>,
}

/// The key hash used by the index.
#[inline]
pub fn hash_key(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

impl Inner {
    pub(crate) fn should_compact(&self) -> bool {
        if self.force_compaction.load(Ordering::Acquire) {
            return true;
        }
        self.mem.client_blocks_free() < self.compaction_trigger_blocks
    }

    pub(crate) fn sleep_worker(&self, d: Duration) {
        let mut g = self.wake.0.lock();
        let seen = *g;
        if !self.shutdown.load(Ordering::Acquire) {
            self.wake.1.wait_while_for(&mut g, |v| *v == seen, d);
        }
    }

    fn wake_workers(&self) {
        *self.wake.0.lock() += 1;
        self.wake.1.notify_all();
    }

    pub(crate) fn notify_space(&self) {
        *self.space.0.lock() += 1;
        self.space.1.notify_all();
    }

    fn wait_space(&self, d: Duration) {
        let mut g = self.space.0.lock();
        let seen = *g;
        self.space.1.wait_while_for(&mut g, |v| *v == seen, d);
    }

    /// Prefetch where this CPU's next append of `len` bytes will go.
    #[inline]
    fn prefetch_append(&self, len: usize) {
        let cpu = topology::current_cpu();
        let (node, head) = self.cpu_slot.get(cpu).copied().unwrap_or((0, cpu));
        self.logs[node].prefetch(&self.mem, head, len);
    }

    /// Prefetch, for writing, the first `len` bytes (up to the end of its
    /// block) of the object `hash`'s index entry probably points at: a
    /// hint read without the bucket lock, see [`Index::peek`].
    #[inline]
    fn prefetch_old(&self, hash: u64, len: usize) {
        if let Some(l) = self.index.peek(hash) {
            self.mem.prefetch_for_write(off_of(l), len);
        }
    }

    /// Append an object to the local node's log (one attempt).
    fn try_append(
        &self,
        len: usize,
        fill: &dyn Fn(u64),
    ) -> Result<crate::log::Appended, crate::memory::NoBlocks> {
        let cpu = topology::current_cpu();
        let (node, head) = self.cpu_slot.get(cpu).copied().unwrap_or((0, cpu));
        let before = self.mem.client_blocks_free();
        let a = self.logs[node].append(&self.mem, &self.epochs, head, len, fill)?;
        if before != self.mem.client_blocks_free() && self.should_compact() {
            self.wake_workers();
        }
        Ok(a)
    }

    /// Wait for compaction to free space after a failed append. The caller
    /// must not hold an epoch guard: segments retired by compaction are
    /// freed only once every guard older than `w`'s start is gone.
    /// `Err` once compaction has finished a pass, begun after the wait
    /// started, that found nothing to do, after `APPEND_WAIT_ROUNDS` rounds
    /// in which compaction neither progressed nor was busy, or after the
    /// bounded wait.
    fn wait_for_space(&self, w: &mut SpaceWait) -> Result<(), Error> {
        let round = w.rounds;
        w.rounds += 1;
        let gave_up = self.last_nothing_pass.load(Ordering::Acquire) > w.since_pass
            && self.last_nothing_pass.load(Ordering::Acquire)
                > self.last_progress_pass.load(Ordering::Acquire);
        // Compaction that frees segments while we wait is worth waiting
        // for (at high utilization it is slow but steady); a pass that found
        // nothing, or no progress at all for APPEND_WAIT_ROUNDS, is not.
        // Segments compacted by a pass still running count: a pass frees
        // each segment as soon as the epoch allows.
        let progressed = self.last_progress_pass.load(Ordering::Acquire) > w.since_pass
            || self.stats.segments_compacted.load(Ordering::Acquire) > w.since_compacted;
        // The budget says a whole segment is free: the failure was transient
        // (blocks in flight between buddy heaps, or taken by a racing
        // writer), not a full store.
        let space_exists = self.mem.client_blocks_free() > self.segment_blocks as u64;
        let progressed = progressed || space_exists;
        // With several workers, one finding nothing while another compacts
        // is no reason to give up: only after a round in which this writer
        // ran every idle worker's step and none had anything to do (below).
        let gave_up = gave_up && !progressed && w.last_idle;
        let max_rounds = (self.cfg.max_write_wait_ms / APPEND_WAIT_ROUND_MS) as u32;
        // The bound is time, not rounds: a round in which this writer's
        // help made progress does not sleep, and the space it freed may go
        // to another writer.
        if w.start.elapsed() >= Duration::from_millis(self.cfg.max_write_wait_ms)
            || (w.stalled >= APPEND_WAIT_ROUNDS.min(max_rounds) && !progressed)
            || (round > 1 && gave_up)
        {
            return Err(Error::OutOfMemory { what: "log" });
        }
        self.wake_workers();
        let cpu = topology::current_cpu();
        let node = self.cpu_slot.get(cpu).map_or(0, |&(n, _)| n);
        let helped = crate::compaction::help(self, node);
        w.last_idle = helped == crate::compaction::Help::Idle;
        match helped {
            crate::compaction::Help::Progress => {}
            crate::compaction::Help::Idle => {
                w.stalled += 1;
                self.wait_space(Duration::from_millis(APPEND_WAIT_ROUND_MS));
            }
            crate::compaction::Help::Busy => {
                // Every worker is inside a pass (a pass over sparse
                // segments takes tens of milliseconds at 10 %
                // utilization): space is coming, so this round does not
                // count as one without progress.
                self.wait_space(Duration::from_millis(APPEND_WAIT_ROUND_MS));
            }
        }
        Ok(())
    }
}

/// A write's wait for space (see `Inner::wait_for_space`).
struct SpaceWait {
    /// Rounds waited.
    rounds: u32,
    /// When the wait began.
    start: std::time::Instant,
    /// Rounds in which no compaction worker was busy and none progressed.
    stalled: u32,
    /// The last round's help found every worker idle with nothing to do.
    last_idle: bool,
    /// Compaction passes begun before the wait.
    since_pass: u64,
    /// Segments compacted before the wait.
    since_compacted: u64,
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
        // at a time can compact, however many cores wait. At 90 %
        // utilization on 2 CPUs a second worker doubled YCSB-A throughput.
        let cpus_per_node = topo.num_cpus().div_ceil(nodes);
        let workers_per_node = cfg
            .compaction_workers
            .unwrap_or_else(|| cpus_per_node.div_ceil(8).max(cpus_per_node.min(2)))
            .max(1);
        // Each worker fills one open destination at a time.
        let reserve = ((blocks * cfg.reserve_permille / 1000)
            .max(segment_blocks * workers_per_node * nodes)) as u64;
        let mem = Arc::new(Memory::new(pool_bytes, reserve, topo.num_cpus()).map_err(Error::Io)?);
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
            let h = rehash_mem.header(off).unwrap_or_default();
            let mut key = vec![0u8; (h.key_len as usize).min(MAX_KEY_BYTES)];
            rehash_mem.read_part(off, h.header_bytes(), &mut key);
            hash_key(&key)
        };
        let index = Index::new(
            &IndexConfig {
                subtables: index_subtables,
                max_bytes: index_budget,
                ..IndexConfig::default()
            },
            rehash,
        )
        .map_err(|e| Error::Config(format!("index: {e}")))?;
        let logs = (0..nodes)
            .map(|_| Log::new(heads_per_node, workers_per_node, segment_blocks))
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
            force_compaction: AtomicBool::new(false),
            wake: (Mutex::new(0), Condvar::new()),
            space: (Mutex::new(0), Condvar::new()),
            stats: CompactionCounters::default(),
            workers: (0..nodes)
                .map(|_| (0..workers_per_node).map(|_| Mutex::default()).collect())
                .collect(),
        });
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

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    fn check(&self, key: &[u8], value_len: usize) -> Result<(), Error> {
        if key.len() > MAX_KEY_BYTES {
            return Err(Error::BadKey { len: key.len() });
        }
        if value_len > self.inner.cfg.max_value_bytes {
            return Err(Error::ValueTooLarge {
                len: value_len,
                max: self.inner.cfg.max_value_bytes,
            });
        }
        Ok(())
    }

    /// Store `value` under `key`. Returns the new version.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<u64, Error> {
        self.put_with(key, value, PutOptions::default())
    }

    /// Store only if absent (memcached `add`).
    pub fn put_if_absent(&self, key: &[u8], value: &[u8]) -> Result<u64, Error> {
        self.put_with(
            key,
            value,
            PutOptions {
                condition: Condition::IfAbsent,
                ..Default::default()
            },
        )
    }

    /// Store only if present (memcached `replace`).
    pub fn replace(&self, key: &[u8], value: &[u8]) -> Result<u64, Error> {
        self.put_with(
            key,
            value,
            PutOptions {
                condition: Condition::IfPresent,
                ..Default::default()
            },
        )
    }

    /// Store only if the current version is `version` (memcached `cas`).
    pub fn compare_and_swap(&self, key: &[u8], value: &[u8], version: u64) -> Result<u64, Error> {
        self.put_with(
            key,
            value,
            PutOptions {
                condition: Condition::IfVersion(version),
                ..Default::default()
            },
        )
    }

    /// Check a condition against the current item (`None` = absent or expired).
    fn check_condition(cond: Condition, cur: Option<&Header>) -> Result<(), Error> {
        match (cond, cur) {
            (Condition::Always, _) => Ok(()),
            (Condition::IfAbsent, Some(_)) => Err(Error::Exists),
            (Condition::IfAbsent, None) => Ok(()),
            (Condition::IfPresent, None) | (Condition::IfVersion(_), None) => Err(Error::NotFound),
            (Condition::IfPresent, Some(_)) => Ok(()),
            (Condition::IfVersion(v), Some(h)) if h.version == v => Ok(()),
            (Condition::IfVersion(_), Some(h)) => {
                Err(Error::VersionMismatch { current: h.version })
            }
        }
    }

    /// The general write.
    pub fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64, Error> {
        self.check(key, value.len())?;
        let inner = &*self.inner;
        let mem = &inner.mem;
        let hash = hash_key(key);
        inner.index.prefetch_for_lock(hash);
        let mut h = Header::new(
            key.len(),
            value.len(),
            opts.flags,
            next_version(0),
            match opts.expiry {
                Expiry::At(t) => t.clamp(1, crate::object::FIELD48_MASK),
                _ => 0,
            },
            false,
        );
        if inner.cfg.mode == Mode::Nibble {
            // Before the index work, so the append's misses overlap it.
            inner.prefetch_append(h.object_bytes());
        }
        let mut guard = inner.epochs.try_pin()?;
        // Start the old version's lines too: the bucket lock below reads
        // its header and key (and Nibble-2 overwrites its value), a miss
        // that otherwise waits for the lock and then stalls the write.
        let old_bytes = match inner.cfg.mode {
            Mode::Nibble2 => crate::object::HEADER_MIN_BYTES + key.len() + value.len(),
            Mode::Nibble => crate::object::HEADER_MIN_BYTES + key.len(),
        };
        inner.prefetch_old(hash, old_bytes);
        if opts.condition != Condition::Always {
            // Cheap optimistic check first, so a failing condition does not
            // leave a dead object in the log.
            let cur = self.read_header(hash, key);
            Self::check_condition(opts.condition, cur.as_ref())?;
        }
        if inner.cfg.mode == Mode::Nibble2 {
            let g = inner.index.lock(hash);
            if let Some(slot) = g.find(|l| mem.key_equals(off_of(l), key)) {
                let off = off_of(g.loc(slot));
                if let Some(old) = mem.header(off) {
                    let live = !old.expired();
                    Self::check_condition(opts.condition, live.then_some(&old))?;
                    if old.can_hold(value.len()) && old.fits_flags(opts.flags) {
                        let h = Header {
                            value_len: value.len() as u32,
                            flags: opts.flags,
                            version: next_version(old.version),
                            expiry_ms: expiry_for(opts.expiry, live.then_some(&old)),
                            ..old
                        };
                        // SAFETY: we hold the key's bucket locks and an
                        // epoch guard: the object is live and we are its
                        // only writer; `can_hold` checked that the value
                        // fits its allocation. Readers validate their
                        // copy against the bucket version.
                        unsafe {
                            mem.write_part(off, old.header_bytes() + old.key_len as usize, value);
                            mem.write_header(off, &h);
                        }
                        note_expiry(mem, off, h.expiry_ms);
                        return Ok(h.version);
                    }
                    // It replaces a value of another size: a slack slot, so
                    // that a later, shorter value can be written in place.
                    h.slack_slot = old.value_cap as usize != value.len();
                }
            }
        }
        let len = h.object_bytes();
        let head_bytes = h.header_bytes();
        let first = h;
        let fill = |off| {
            // SAFETY: `Log::append` calls `fill` with `len` bytes it just
            // reserved under the head's lock and has not published: this
            // thread is their only writer.
            unsafe {
                mem.write_header(off, &first);
                mem.write_part(off, head_bytes, key);
                mem.write_part(off, head_bytes + key.len(), value);
            }
        };
        // Made at the first failed append only (it reads the clock).
        let mut wait = None;
        let app = loop {
            match inner.try_append(len, &fill) {
                Ok(a) => break a,
                Err(_) => {
                    drop(guard);
                    let w = wait.get_or_insert_with(|| SpaceWait {
                        rounds: 0,
                        start: std::time::Instant::now(),
                        stalled: 0,
                        last_idle: false,
                        since_pass: inner.stats.passes.load(Ordering::Acquire),
                        since_compacted: inner.stats.segments_compacted.load(Ordering::Acquire),
                    });
                    inner.wait_for_space(w)?;
                    guard = inner.epochs.try_pin()?;
                }
            }
        };
        let new_loc = loc_of(app.off);
        loop {
            let mut g = inner.index.lock(hash);
            match g.find(|l| mem.key_equals(off_of(l), key)) {
                Some(slot) => {
                    let old_off = off_of(g.loc(slot));
                    let old = mem.header(old_off).unwrap_or_default();
                    let live = !old.expired();
                    Self::check_condition(opts.condition, live.then_some(&old))?;
                    let version = crate::object::live_version(h.version.max(old.version + 1));
                    let expiry = expiry_for(opts.expiry, live.then_some(&old));
                    if version != h.version || expiry != h.expiry_ms {
                        h.version = version;
                        h.expiry_ms = expiry;
                        // SAFETY: the object is ours, appended above and
                        // not yet published (the index store is below).
                        unsafe { mem.write_header(app.off, &h) };
                    }
                    g.replace(slot, new_loc);
                    note_expiry(mem, app.off, h.expiry_ms);
                    mem.live().add(app.seg, len as i64);
                    // Under the bucket lock, like every in-place write:
                    // a reader that sees the mark fails its validation.
                    // SAFETY: the bucket is locked and the old object just
                    // unlinked; we hold an epoch guard.
                    unsafe { mem.mark_dead(old_off) };
                    drop(g);
                    mem.live()
                        .add(mem.seg_of(old_off), -(old.object_bytes() as i64));
                    return Ok(version);
                }
                None => {
                    Self::check_condition(opts.condition, None)?;
                    match g.insert(new_loc) {
                        Ok(_) => {
                            note_expiry(mem, app.off, h.expiry_ms);
                            mem.live().add(app.seg, len as i64);
                            return Ok(h.version);
                        }
                        Err(_) => {
                            drop(g);
                            if inner.index.grow(hash).is_err() {
                                return Err(Error::OutOfMemory { what: "index" });
                            }
                        }
                    }
                }
            }
        }
    }

    /// The header of the live item `key`, read optimistically.
    fn read_header(&self, hash: u64, key: &[u8]) -> Option<Header> {
        let mem = &self.inner.mem;
        self.inner
            .index
            .read(hash, |l| {
                let off = off_of(l);
                let h = mem.header(off)?;
                (h.key_len as usize == key.len() && mem.key_bytes_equal(off, &h, key)).then_some(h)
            })
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
            // Non-temporally: the value is copied out once, and pulled
            // through L2/L3 it would evict index buckets that later reads
            // need (YCSB-C at 1 M keys: +9-16 %).
            mem.prefetch_once(off, expect);
            let h = mem.header(off)?;
            if h.key_len as usize != key.len() || !mem.key_bytes_equal(off, &h, key) {
                return None;
            }
            // Bound lengths read from racing memory before using them.
            let n = (h.value_len.min(h.value_cap) as usize).min(max_value);
            buf.resize(n, 0);
            mem.read_part(off, h.header_bytes() + key.len(), buf)
                .then_some(h)
        });
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

    /// Remove `key`. Returns whether a live item was removed.
    pub fn delete(&self, key: &[u8]) -> Result<bool, Error> {
        match self.delete_if(key, Condition::Always) {
            Ok(()) => Ok(true),
            Err(Error::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Delete `key` if `cond` holds for it, atomically (under the bucket
    /// lock): `IfVersion(v)` deletes only the version a client read (Redis
    /// GETDEL, RENAME). `Err(NotFound)` if absent (or expired; an expired
    /// item is removed either way), `Err(VersionMismatch)` if the version
    /// differs, `Err(Exists)` for `IfAbsent` on a live item.
    pub fn delete_if(&self, key: &[u8], cond: Condition) -> Result<(), Error> {
        let inner = &*self.inner;
        let mem = &inner.mem;
        let _guard = inner.epochs.try_pin()?;
        let hash = hash_key(key);
        let mut g = inner.index.lock(hash);
        let Some(slot) = g.find(|l| mem.key_equals(off_of(l), key)) else {
            return Err(Error::NotFound);
        };
        let h = mem.header(off_of(g.loc(slot))).unwrap_or_default();
        let live = !h.expired();
        if live {
            Self::check_condition(cond, Some(&h))?;
        }
        let off = off_of(g.remove(slot));
        // SAFETY: the bucket is locked and the object just unlinked; we
        // hold an epoch guard.
        unsafe { mem.mark_dead(off) };
        drop(g);
        mem.live().add(mem.seg_of(off), -(h.object_bytes() as i64));
        if live {
            Ok(())
        } else {
            Err(Error::NotFound)
        }
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

    /// Set (or clear, with `None`) the expiry of `key`. Returns whether the
    /// key exists. The header is updated in place under the bucket lock in
    /// both modes (every object has an expiry field, so this needs no space
    /// and works on a full store): it is metadata, not a new version of the
    /// value.
    pub fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> Result<bool, Error> {
        let inner = &*self.inner;
        let mem = &inner.mem;
        let _guard = inner.epochs.try_pin()?;
        let hash = hash_key(key);
        let g = inner.index.lock(hash);
        let Some(slot) = g.find(|l| mem.key_equals(off_of(l), key)) else {
            return Ok(false);
        };
        let off = off_of(g.loc(slot));
        let Some(h) = mem.header(off) else {
            return Ok(false);
        };
        if h.expired() {
            return Ok(false);
        }
        let h = Header {
            expiry_ms: expiry_ms.unwrap_or(0),
            ..h
        };
        // SAFETY: the key's buckets are locked and we hold an epoch guard:
        // we are the object's only writer; readers validate their copy.
        unsafe { mem.write_header(off, &h) };
        note_expiry(mem, off, h.expiry_ms);
        Ok(true)
    }

    /// One step of a cursor over the keys (Redis SCAN semantics: a key
    /// present for the whole iteration is returned at least once; it may be
    /// returned more than once). Start with cursor 0; 0 comes back at the end.
    pub fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>), Error> {
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
            if h.expired_at(now) || h.key_len as usize > MAX_KEY_BYTES {
                continue;
            }
            let mut k = vec![0u8; h.key_len as usize];
            if mem.read_part(off, h.header_bytes(), &mut k) {
                keys.push(k);
            }
        }
        Ok((next, keys))
    }

    /// Run compaction now, regardless of free space, until a pass makes no
    /// progress or `timeout` passes. Closes all heads first so everything
    /// is a candidate. For tests and tools.
    pub fn compact_now(&self, timeout: Duration) {
        let inner = &*self.inner;
        for log in &inner.logs {
            log.close_all(&inner.mem, &inner.epochs);
        }
        inner.force_compaction.store(true, Ordering::Release);
        let start = std::time::Instant::now();
        // Run every worker's steps here until none of them has anything
        // left: with several workers, one finding nothing says nothing
        // about the others' candidates.
        while start.elapsed() < timeout {
            let mut busy = false;
            for (node, workers) in inner.workers.iter().enumerate() {
                for worker in 0..workers.len() {
                    busy |= crate::compaction::step_now(inner, node, worker);
                }
            }
            if !busy && self.stats().segments_retired == 0 {
                break;
            }
            if !busy {
                inner.wait_space(Duration::from_millis(1));
            }
        }
        inner.force_compaction.store(false, Ordering::Release);
    }

    /// Give every free block back to the OS now (`MADV_DONTNEED`), instead
    /// of after the decay time; returns the bytes released. Combined with
    /// [`Store::compact_now`] this is the store's `malloc_trim`.
    pub fn release_memory(&self) -> u64 {
        self.inner.mem.purge_all() * BLOCK_BYTES as u64
    }

    /// A statistics snapshot.
    pub fn stats(&self) -> Stats {
        let inner = &*self.inner;
        let mem = &inner.mem;
        let (mut head, mut closed, mut retired, mut live) = (0, 0, 0, 0);
        for i in 0..mem.seg_slots() as u32 {
            let s = mem.seg(i);
            let st = s.meta.lock().state;
            match st {
                SegState::Head => head += 1,
                SegState::Closed => closed += 1,
                SegState::Retired => retired += 1,
                SegState::Free => continue,
            }
            live += mem.live().get(i);
        }
        let c = &inner.stats;
        Stats {
            mode: inner.cfg.mode,
            epoch: inner.epochs.name(),
            capacity_bytes: inner.cfg.capacity_bytes as u64,
            pool_bytes: mem.pool().bytes() as u64,
            index_bytes: inner.index.memory_bytes(),
            index_budget_bytes: inner.index_budget as u64,
            metadata_bytes: mem.metadata_bytes(),
            live_bytes: live,
            items: inner.index.len(),
            blocks_total: mem.blocks_total(),
            blocks_in_use: mem.blocks_in_use(),
            blocks_free_resident: mem.warm_blocks(),
            blocks_released: mem.blocks_purged(),
            reserve_blocks: mem.reserve_blocks(),
            segment_bytes: (inner.segment_blocks * BLOCK_BYTES) as u64,
            segments_head: head,
            segments_closed: closed,
            segments_retired: retired,
            compaction_passes: c.passes.load(Ordering::Relaxed),
            segments_compacted: c.segments_compacted.load(Ordering::Relaxed),
            bytes_relocated: c.bytes_relocated.load(Ordering::Relaxed),
            expired_reclaimed: c.expired_reclaimed.load(Ordering::Relaxed),
            dead_skipped: c.dead_skipped.load(Ordering::Relaxed),
            index: inner.index.stats(),
        }
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

/// Record that the object at `off` expires at `expiry_ms` (0 = never).
pub(crate) fn note_expiry(mem: &Memory, off: u64, expiry_ms: u64) {
    if expiry_ms != 0 {
        mem.seg(mem.seg_of(off))
            .min_expiry_ms
            .fetch_min(expiry_ms, Ordering::AcqRel);
    }
}

fn expiry_for(e: Expiry, old: Option<&Header>) -> u64 {
    match e {
        Expiry::Never => 0,
        Expiry::At(t) => t.clamp(1, crate::object::FIELD48_MASK),
        Expiry::Keep => old.map_or(0, |h| h.expiry_ms),
    }
}
