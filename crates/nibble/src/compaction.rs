//! Compaction (dissertation §4.4 "Scalable Asynchronous Compaction", ch. 6).
//!
//! Each node has its own workers; a head that rolls hands its segment to one
//! of them round-robin, so each worker keeps a private candidate set and
//! sorts it alone. A worker sleeps until free space falls below the trigger
//! (default 2 % of the client budget, `DEFAULT_COMPACTION_TRIGGER_PERMILLE`;
//! the paper's 20 % is selectable as `PAPER_COMPACTION_TRIGGER_PERMILLE`) or
//! someone asks it to run; it wakes every `IDLE_TICK_MS` only to free
//! retired segments and to halve index subtables that deletes left
//! sparse (`index/shrink.rs`).
//!
//! Early reclaim: below the trigger's urgency, a worker still sweeps any
//! settled segment at most a sixteenth live
//! (`EARLY_RECLAIM_MAX_UTILISATION_PERMILLE`) on each tick. Rewrites of
//! a few hot keys (a queue's root, a counter) kill whole segments within
//! milliseconds; reclaiming them while their blocks are still resident
//! lets the heads reuse the same memory (the warm cache) instead of
//! faulting fresh pages in until the log reaches the trigger, which
//! costs a page fault and a zeroed page per 4 KiB (2 MiB per huge page)
//! of log written and leaves RSS at the capacity. This departs from the
//! paper, which compacts only under the trigger; the survivors it moves
//! are at most a fifteenth of the bytes it frees.
//!
//! Idle defragmentation: once no segment has closed for `Config::decay_ms`
//! (writes are quiet) and no operation at all was seen running for as long
//! (reads are quiet too: each step samples the epoch table), a worker also
//! compacts segments at most 95 % live even when free space is plentiful,
//! until a pass finds nothing, and releases every free block to the OS at
//! once (see `memory`). This keeps RSS near the live data after a burst of
//! deletes without competing with clients for CPU. Quiet writes alone are
//! not enough: under a read-only load it would take CPU from the readers,
//! and the next write burst would fault every released block back in.
//!
//! Bulk expiry (submodule `expire`, its own essay): each step first frees
//! the candidates whose latest expiry has passed, whole, and unlinks the
//! expired objects of mixed segments, so expired memory is reused within
//! about a second without waiting for free space to run short.
//!
//! Cache mode: under an evicting policy, a worker that finds free space
//! short compacts only segments at most half live and otherwise evicts
//! whole segments with the same sweep (submodule `evict`, which has its
//! own essay).
//!
//! One pass:
//! 1. Candidates are closed segments whose closing stamp the epoch table has
//!    passed (every append that wrote into the segment has published its
//!    object or given up), scored by the cost-benefit ratio
//!    `(1 - u) * age / (1 + u)` with `u = live / used`.
//! 2. The best candidates are taken while their live bytes fit one
//!    segment (at least `PASS_MIN_LIVE_BYTES`). Survivors go to the
//!    worker's destination segment, which stays open across passes and
//!    grows a block at a time (from the compaction reserve if need be)
//!    until it is full, then closes and becomes a candidate, so no pass
//!    leaves the rest of a last block unused: at high utilization a pass
//!    frees only a block or two, and half a block wasted per pass would be
//!    a large share of that.
//! 3. Each candidate is scanned object by object. An object is live if the
//!    index still points at exactly this location; under the bucket lock it
//!    is copied to the destination and the entry redirected (expired
//!    objects are dropped instead). Readers that raced retry on the bucket
//!    version.
//! 4. Scanned candidates are retired with the epoch clock's stamp and their
//!    blocks go back to the buddy allocator once no operation that started
//!    before the stamp is still running; the pass frees those it can after
//!    every candidate, so writers waiting for space need not wait for the
//!    whole pass. A writer that finds every worker busy in a pass waits
//!    without counting the round as one without progress.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use epoch::{EpochScheme, RetireList};

use crate::memory::{loc_of, Memory, SegId, SegMeta, SegState, BLOCK_BYTES};
use crate::object::{now_ms, Header};
use crate::store::Inner;

mod evict;
mod expire;

/// How often an idle worker wakes to free retired segments.
const IDLE_TICK_MS: u64 = 20;
/// Segments more utilised than this are not worth compacting.
const MAX_UTILISATION_PERMILLE: u64 = 980;
/// In cache mode, compaction takes only segments at most this utilised
/// (copying a byte frees at least one); fuller ones are evicted instead,
/// as Segcache does (module `evict`).
const EVICTING_MAX_UTILISATION_PERMILLE: u64 = 500;
/// While free space is plentiful, compaction still takes segments at most
/// this utilised (a sixteenth live: moving a byte frees fifteen), so
/// that the log reuses resident memory instead of growing into fresh
/// pages (see `step`).
const EARLY_RECLAIM_MAX_UTILISATION_PERMILLE: u64 = 62;
/// Idle defragmentation compacts only segments at most this utilised.
const IDLE_DEFRAG_MAX_UTILISATION_PERMILLE: u64 = 950;
/// Live bytes a pass moves at least (when segments are smaller than this).
const PASS_MIN_LIVE_BYTES: usize = 2 << 20;
/// Objects whose index buckets are prefetched together during compaction.
const PREFETCH_BATCH: usize = 16;
/// How far ahead of the header scan a victim's bytes are prefetched.
const VICTIM_PREFETCH_AHEAD_BYTES: usize = 32 << 10;
/// How far ahead of the next copy the destination is prefetched for writing.
const DEST_PREFETCH_AHEAD_BYTES: usize = 8 << 10;

/// Result of one pass.
#[derive(Debug, PartialEq, Eq)]
pub enum Pass {
    /// Segments were compacted.
    Progress,
    /// Nothing worth compacting (or no room for a destination).
    Nothing,
    /// Nothing yet: closed segments wait for the epoch to pass their
    /// closing stamp (appends into them may still be publishing).
    Waiting,
}

struct Candidate {
    seg: SegId,
    expiring: bool,
    cap_blocks: usize,
    used: u64,
    live: u64,
    score: f64,
}

/// A worker's private state: its candidates and the segments it retired.
/// Behind a mutex only so that a writer waiting for space can lend a hand
/// (see [`help`]); the worker itself never waits for it long.
#[derive(Default)]
pub struct WorkerState {
    cands: Vec<SegId>,
    retired: RetireList<SegId>,
    /// The segment this worker copies survivors into, open across passes.
    dest: Option<Dest>,
    /// Idle defragmentation found nothing more since the last activity.
    defrag_done: bool,
    /// The earliest expiry (Unix ms) among the candidates the last expiry
    /// pass left (module `expire`): the next pass is due then.
    next_expiry_ms: u64,
    /// When the last expiry pass ran (Unix ms).
    last_expiry_scan_ms: u64,
    /// Index subtables halved (deletes left them sparse), whose upper
    /// halves are released once the epoch passes (`index/shrink.rs`).
    shrunk: RetireList<crate::index::Shrunk>,
}

/// A compaction destination being filled: like a log head, it grows a
/// block at a time and closes (becoming a candidate) only when the next
/// object would not fit in a full-size segment, so passes do not each
/// leave the unused part of a last block behind (see the module docs).
struct Dest {
    seg: SegId,
    blocks: Vec<u32>,
    used: usize,
    /// Bytes from the start prefetched for writing.
    prefetched: usize,
}

impl Dest {
    /// Make room for `size` more bytes: grow, or close this segment and
    /// open a new one. `None` when compaction has no blocks left either.
    fn room(
        dest: &mut Option<Dest>,
        inner: &Inner,
        cands: &mut Vec<SegId>,
        size: usize,
    ) -> Option<u64> {
        let mem = &inner.mem;
        let max_bytes = inner.segment_blocks * BLOCK_BYTES;
        if let Some(d) = dest.as_mut() {
            if d.used + size <= d.blocks.len() * BLOCK_BYTES {
                return Some(Memory::seg_offset(&d.blocks, d.used));
            }
            if d.used + size <= max_bytes {
                let more = (d.used + size).div_ceil(BLOCK_BYTES) - d.blocks.len();
                let added = mem.grow_segment(d.seg, more, true).ok()?;
                d.blocks.extend_from_slice(&added);
                return Some(Memory::seg_offset(&d.blocks, d.used));
            }
        }
        let seg = mem
            .new_segment(size.div_ceil(BLOCK_BYTES).max(1), true)
            .ok()?;
        let blocks = mem.seg(seg).meta.lock().blocks.clone();
        if let Some(old) = dest.replace(Dest {
            seg,
            blocks,
            used: 0,
            prefetched: 0,
        }) {
            Dest::close(old, inner, cands);
        }
        dest.as_ref().map(|d| Memory::seg_offset(&d.blocks, 0))
    }

    /// Close a destination: it becomes a candidate of this worker.
    fn close(d: Dest, inner: &Inner, cands: &mut Vec<SegId>) {
        let mut m = inner.mem.seg(d.seg).meta.lock();
        m.state = SegState::Closed;
        m.used = d.used;
        m.closed_at = inner.epochs.now();
        drop(m);
        cands.push(d.seg);
    }
}

/// What one step of a worker did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A pass made progress: run again at once.
    Progress,
    /// Nothing (more) to do now; segments may still wait for the epoch.
    Idle { retired_pending: bool },
}

/// One step of worker `worker` of `node`: take newly closed segments, free
/// retired segments the epoch has passed, release cold free blocks, and run
/// one compaction pass if free space is short.
fn step(inner: &Inner, node: usize, worker: usize, st: &mut WorkerState) -> Step {
    let now = now_ms();
    take_closed(inner, node, worker, st, now);
    free_retired(inner, &mut st.retired);
    // Bulk expiry (module `expire`): when a candidate's earliest expiry
    // is due, and every `EXPIRY_RESCAN_MS` for the TTL heads and the
    // segments compaction closed meanwhile.
    if now >= st.next_expiry_ms || now >= st.last_expiry_scan_ms + expire::EXPIRY_RESCAN_MS {
        if worker == 0 {
            inner.logs[node].close_expired_heads(&inner.mem, &inner.epochs, now);
        }
        expire::expire_once(inner, st, now);
    }
    // Idle defragmentation: when no segment has closed and no operation
    // was seen for the decay time, segments left sparse by deletes are
    // compacted even though free space is plentiful, so that their blocks
    // can go back to the OS (like Redis's active defrag, but only while
    // clients are quiet, so it never competes with them). An operation in
    // progress holds the epoch back; the table is sampled on every step,
    // writes or not, so readers seen while writes still ran count when
    // the writes stop.
    if inner.epochs.reclaim_bound() != u64::MAX {
        inner.last_busy_ms.fetch_max(now, Ordering::Relaxed);
    }
    let idle = now.saturating_sub(inner.last_busy_ms.load(Ordering::Relaxed)) >= inner.cfg.decay_ms;
    // Free blocks unused for the decay time go back to the OS, a whole
    // huge page at a time (module `memory`); while the store is idle
    // nobody will reuse them soon, so all of them do, block by block.
    for s in st.shrunk.collect(&inner.epochs) {
        inner.index.release_shrunk(s);
    }
    // The index follows the key count down too (`index/shrink.rs`):
    // halve the subtables deletes left sparse, as soon as they are, so
    // that inserts after a bulk delete find the index the size of the
    // keys that remain (a halving costs what a doubling does, once per
    // halving of the key count).
    if worker == 0 {
        for s in inner.index.shrink_sparse() {
            st.shrunk.push(&inner.epochs, s);
        }
    }
    // A client's append found the warm cache low: map the next region
    // in ahead of the log (`memory::ahead`), before any compaction.
    if !idle && inner.cfg.map_ahead {
        inner.mem.map_ahead();
    }
    if idle {
        inner.mem.purge_all();
    } else {
        inner
            .mem
            .purge_cold_regions(now.saturating_sub(inner.cfg.decay_ms));
    }
    let defrag = idle && !st.defrag_done && !inner.should_compact();
    if defrag {
        let pass = inner.stats.passes.fetch_add(1, Ordering::AcqRel) + 1;
        match compact_once(inner, st, IDLE_DEFRAG_MAX_UTILISATION_PERMILLE) {
            Pass::Progress => {
                inner.last_progress_pass.fetch_max(pass, Ordering::AcqRel);
                return Step::Progress;
            }
            Pass::Waiting => {
                return Step::Idle {
                    retired_pending: true,
                }
            }
            Pass::Nothing => st.defrag_done = true,
        }
    }
    // Early reclaim: a segment whose objects are nearly all dead (a hot
    // key rewritten, a queue's elements pushed and popped) is swept as
    // soon as it is settled, even while free space is plentiful. Its few
    // survivors cost little to move, and its blocks go back to the warm
    // cache while they are still resident, so the next heads reuse them
    // instead of faulting in (and zeroing) fresh memory: without this a
    // store far below its capacity grows its RSS to the capacity under
    // any rewrite load before compaction first runs. Segments still
    // waiting for the epoch are left for a later tick (no 1 ms polling).
    if !idle
        && !inner.should_compact()
        && compact_once(inner, st, EARLY_RECLAIM_MAX_UTILISATION_PERMILLE) == Pass::Progress
    {
        let pass = inner.stats.passes.fetch_add(1, Ordering::AcqRel) + 1;
        inner.last_progress_pass.fetch_max(pass, Ordering::AcqRel);
        return Step::Progress;
    }
    if inner.should_compact() {
        let pass = inner.stats.passes.fetch_add(1, Ordering::AcqRel) + 1;
        // Cache mode: when free segments really run short (not when
        // `compact_now` forces a pass) and compaction cannot free enough
        // cheaply, evict.
        let e = inner.eviction();
        let short = e.evicts() && inner.space_short();
        let max_util = if e.evicts() {
            EVICTING_MAX_UTILISATION_PERMILLE
        } else {
            MAX_UTILISATION_PERMILLE
        };
        let mut outcome = compact_once(inner, st, max_util);
        if short && outcome != Pass::Progress {
            match evict::evict_once(inner, st, e) {
                Pass::Nothing if outcome == Pass::Waiting => {}
                o => outcome = o,
            }
        }
        if outcome == Pass::Progress {
            inner.last_progress_pass.fetch_max(pass, Ordering::AcqRel);
            return Step::Progress;
        }
        // Retired segments or candidates still waiting for the epoch are
        // progress to come.
        if outcome == Pass::Waiting {
            return Step::Idle {
                retired_pending: true,
            };
        }
        if st.retired.is_empty() {
            inner.last_nothing_pass.fetch_max(pass, Ordering::AcqRel);
        }
        inner.notify_space();
    }
    Step::Idle {
        retired_pending: !st.retired.is_empty(),
    }
}

/// Take the segments the log closed for worker `worker` of `node` as
/// candidates.
fn take_closed(inner: &Inner, node: usize, worker: usize, st: &mut WorkerState, now: u64) {
    while let Some(s) = inner.logs[node].closed[worker].pop() {
        st.cands.push(s);
        inner.last_busy_ms.fetch_max(now, Ordering::Relaxed);
        st.defrag_done = false;
        let earliest = inner.mem.seg(s).min_expiry_ms.load(Ordering::Acquire);
        st.next_expiry_ms = st.next_expiry_ms.min(earliest);
    }
}

/// Run an expiry pass of every worker now, on the calling thread (for
/// `Store::expire_now`): close the TTL heads whose objects have all
/// expired, then let each worker free its expired segments and unlink the
/// expired objects of its mixed ones. Segments a running operation may
/// still be appending to wait for a later pass.
pub fn expire_now(inner: &Inner) {
    let now = now_ms();
    for log in &inner.logs {
        log.close_expired_heads(&inner.mem, &inner.epochs, now);
    }
    for (node, workers) in inner.workers.iter().enumerate() {
        for (w, state) in workers.iter().enumerate() {
            let mut st = state.lock();
            take_closed(inner, node, w, &mut st, now);
            expire::expire_once(inner, &mut st, now);
            free_retired(inner, &mut st.retired);
        }
    }
}

/// Free the retired segments no running operation can still see, and tell
/// waiting writers.
fn free_retired(inner: &Inner, retired: &mut RetireList<SegId>) {
    let freed = retired.collect(&inner.epochs);
    if !freed.is_empty() {
        inner
            .stats
            .segments_freed
            .fetch_add(freed.len() as u64, Ordering::AcqRel);
        for s in freed {
            let blocks = inner.mem.seg(s).meta.lock().blocks.len() as u64;
            inner
                .stats
                .retiring_blocks
                .fetch_sub(blocks, Ordering::AcqRel);
            inner.mem.free_segment(s);
        }
        inner.notify_space();
    }
}

/// The worker loop; runs until the store shuts down.
pub fn run(inner: Arc<Inner>, node: usize, worker: usize) {
    loop {
        if inner.shutdown.load(Ordering::Acquire) {
            break;
        }
        let r = step(
            &inner,
            node,
            worker,
            &mut inner.workers[node][worker].lock(),
        );
        let wait = match r {
            Step::Progress => continue,
            Step::Idle {
                retired_pending: true,
            } => 1,
            Step::Idle {
                retired_pending: false,
            } => IDLE_TICK_MS,
        };
        inner.sleep_worker(Duration::from_millis(wait));
    }
    // Shutdown: no operation is running any more (the store is being
    // dropped), so every retired segment is safe; the pool goes away anyway.
    drop(std::mem::take(&mut inner.workers[node][worker].lock().retired).into_items());
}

/// Run one step of worker `worker` of `node` on the calling thread
/// (waiting for the worker if it is in the middle of one), for
/// `Store::compact_now` and `Store::quiesce`. Returns true if the step made progress or retired
/// segments still wait for the epoch.
pub fn step_now(inner: &Inner, node: usize, worker: usize) -> bool {
    let mut st = inner.workers[node][worker].lock();
    step(inner, node, worker, &mut st)
        != Step::Idle {
            retired_pending: false,
        }
}

/// What a writer waiting for space got from [`help`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Help {
    /// It ran a step of an idle worker, which made progress.
    Progress,
    /// It ran a step of every worker, and none had anything to do now.
    Idle,
    /// The idle workers' steps found nothing to do now, but space is
    /// coming: some worker is in the middle of a step (a pass over sparse
    /// segments can take tens of milliseconds), or has compacted segments
    /// (or candidates) waiting for the epoch to pass them. The epoch
    /// waits for operations that began earlier; on a loaded machine one of
    /// them may sit preempted for a scheduler tick or more, so these rounds
    /// must not count as rounds without progress, or a writer would report
    /// out of memory while space is about to be freed.
    Busy,
}

/// A writer that found no space (and holds no epoch guard) runs a step of
/// each idle worker of `node` in turn, until one makes progress, instead
/// of sleeping: at high utilization compaction is the bottleneck and the
/// writer's core would idle anyway. Never blocks on a busy worker.
pub fn help(inner: &Inner, node: usize) -> Help {
    let mut busy = false;
    for (w, state) in inner.workers[node].iter().enumerate() {
        match state.try_lock() {
            Some(mut st) => match step(inner, node, w, &mut st) {
                Step::Progress => return Help::Progress,
                Step::Idle { retired_pending } => busy |= retired_pending,
            },
            None => busy = true,
        }
    }
    if busy {
        Help::Busy
    } else {
        Help::Idle
    }
}

/// Prefetch a segment's bytes `from .. to` (segment offsets; for writing
/// if `write`) and return `to` (or `from` if there is nothing to do). A
/// victim's header scan is a chain of dependent loads (each object's length
/// gives the next one's place), so without this every header is a cache
/// miss paid alone, and the copy of each object then misses again on its
/// remaining lines; the destination's lines are cold blocks whose
/// read-for-ownership each store would otherwise wait for.
fn prefetch_seg(mem: &Memory, blocks: &[u32], from: usize, to: usize, write: bool) -> usize {
    let mut at = from;
    while at < to {
        let block_end = (at | (BLOCK_BYTES - 1)) + 1;
        let n = to.min(block_end) - at;
        let off = Memory::seg_offset(blocks, at);
        if write {
            mem.prefetch_for_write(off, n);
        } else {
            mem.prefetch(off, n);
        }
        at += n;
    }
    at.max(from)
}

/// What `f` makes of each of `cands` that is closed and whose closing
/// stamp the epoch has passed (no append into it may still be
/// publishing), in order; `f` sees the segment's metadata under its
/// lock and returns `None` to skip it. With them, the pass's outcome if
/// nothing comes of it: `Waiting` if some closed segment still waits for
/// the epoch, else `Nothing`.
fn closed_and_settled<T>(
    inner: &Inner,
    cands: &[SegId],
    mut f: impl FnMut(SegId, &SegMeta) -> Option<T>,
) -> (Vec<T>, Pass) {
    let mem = &inner.mem;
    let mut out = Vec::new();
    let mut waiting = false;
    for &seg in cands {
        let m = mem.seg(seg).meta.lock();
        if m.state != SegState::Closed {
            continue;
        }
        if !inner.epochs.safe_to_reclaim(m.closed_at) {
            waiting = true;
            continue;
        }
        out.extend(f(seg, &m));
    }
    (
        out,
        if waiting {
            Pass::Waiting
        } else {
            Pass::Nothing
        },
    )
}

/// One compaction pass over `cands`.
fn compact_once(inner: &Inner, st: &mut WorkerState, max_util_permille: u64) -> Pass {
    let WorkerState {
        cands,
        retired,
        dest,
        ..
    } = st;
    let mem = &inner.mem;
    let now_tsc = topology::rdtsc();
    let now = now_ms();
    let (mut scored, idle) = closed_and_settled(inner, cands, |seg, m| {
        let used = m.used as u64;
        let live = mem.live().get(seg);
        let cap = (m.blocks.len() * BLOCK_BYTES) as u64;
        let expiring = mem.seg(seg).min_expiry_ms.load(Ordering::Acquire) <= now;
        // The unused tail of a segment is reclaimable too.
        if !expiring && live * 1000 > cap * max_util_permille {
            return None;
        }
        // An expiring segment's live bytes overstate it: score it as empty.
        let u = if cap == 0 || expiring {
            0.0
        } else {
            live as f64 / cap as f64
        };
        let age = now_tsc.saturating_sub(m.created_tsc) as f64;
        Some(Candidate {
            seg,
            expiring,
            cap_blocks: m.blocks.len(),
            used,
            live,
            score: (1.0 - u) * age / (1.0 + u),
        })
    });
    if scored.is_empty() {
        return idle;
    }
    scored.sort_by(|a, b| b.score.total_cmp(&a.score));
    // Live bytes one pass moves: a segment's worth, and at least
    // PASS_MIN_LIVE_BYTES, so that a store of small segments does not pay
    // the scoring and sorting of every candidate per victim.
    let budget = (inner.segment_blocks * BLOCK_BYTES).max(PASS_MIN_LIVE_BYTES) as u64;
    let mut picked = Vec::new();
    let mut sum_live = 0u64;
    for c in scored {
        if !picked.is_empty() && sum_live + c.live > budget {
            continue;
        }
        sum_live += c.live;
        picked.push(c);
    }
    // Worth it only if the pass frees something: survivors go to a
    // destination that stays open across passes, so every dead byte of the
    // picked segments (and their unused tails) is reclaimed.
    let cap_bytes: u64 = picked
        .iter()
        .map(|c| (c.cap_blocks * BLOCK_BYTES) as u64)
        .sum();
    let expiring = picked.iter().any(|c| c.expiring);
    if !expiring && cap_bytes <= sum_live {
        return idle;
    }
    let mut progress = false;
    for c in &picked {
        progress |= sweep(inner, cands, dest, retired, c, &mut Rule::Compact).0;
    }
    if progress {
        Pass::Progress
    } else {
        Pass::Nothing
    }
}

/// What a sweep does with a live, unexpired object of its victim.
enum Rule {
    /// Compaction: relocate every one.
    Compact,
    /// Eviction: relocate what the rule keeps, evict the rest.
    Evict(evict::Keep),
}

impl Rule {
    #[inline]
    fn keeps(&mut self, mem: &Memory, off: u64, h: &Header, size: usize, hash: u64) -> bool {
        match self {
            Rule::Compact => true,
            Rule::Evict(k) => k.keeps(mem, off, h, size, hash),
        }
    }
}

/// Sweep one victim segment `c`: drop its expired objects, relocate the
/// live ones `rule` keeps into the worker's destination (evicting the
/// others), and retire it if the whole segment was scanned. Returns
/// whether it was retired, and the bytes relocated.
fn sweep(
    inner: &Inner,
    cands: &mut Vec<SegId>,
    dest: &mut Option<Dest>,
    retired: &mut RetireList<SegId>,
    c: &Candidate,
    rule: &mut Rule,
) -> (bool, u64) {
    let mem = &inner.mem;
    let now = now_ms();
    let mut progress = false;
    let mut key = Vec::new();
    let mut evicted = 0u64;
    let mut evicted_bytes = 0u64;
    let blocks = mem.seg(c.seg).meta.lock().blocks.clone();
    let complete;
    let mut relocated = 0u64;
    let mut dead_skipped = 0u64;
    // Objects are visited in batches: first every header and key of
    // the batch is read and its index buckets prefetched, then each
    // object is checked. The bucket misses of a batch overlap instead
    // of being paid one after another.
    let mut batch: Vec<(u64, Header, u64)> = Vec::with_capacity(PREFETCH_BATCH);
    // In a mostly live segment (what compaction gets at high
    // utilization) the lock-free liveness check below finds most
    // objects live and is only a second bucket scan before the locked
    // one: skip it there.
    let precheck = c.live * 2 < c.used;
    let mut scan = 0usize;
    let mut prefetched = 0usize;
    'objects: loop {
        if batch.is_empty() {
            while batch.len() < PREFETCH_BATCH && scan < c.used as usize {
                prefetched = prefetch_seg(
                    mem,
                    &blocks,
                    prefetched,
                    (scan + VICTIM_PREFETCH_AHEAD_BYTES).min(c.used as usize),
                    false,
                );
                let off = Memory::seg_offset(&blocks, scan);
                let Some(h) = mem.header(off) else { break };
                if h.is_dead() {
                    // Unlinked and marked by its writer: no key, hash
                    // or index probe needed, and no place in the batch
                    // (whose bucket prefetches are for objects that
                    // may be live).
                    dead_skipped += 1;
                    scan += h.object_bytes();
                    continue;
                }
                key.resize(h.key_len as usize, 0);
                if !mem.read_part(off, h.header_bytes(), &mut key) {
                    break;
                }
                let hash = crate::store::hash_key(&key);
                if precheck {
                    inner.index.prefetch(hash);
                } else {
                    inner.index.prefetch_for_lock(hash);
                }
                batch.push((off, h, hash));
                scan += h.object_bytes();
            }
            if batch.is_empty() {
                // Scanned to the end; or a header that cannot be read:
                // the segment's tail is not intact, keep the segment.
                complete = scan >= c.used as usize;
                break 'objects;
            }
            batch.reverse();
        }
        let (off, h, hash) = batch.pop().expect("a non-empty batch");
        let size = h.object_bytes();
        // Dead objects (most of a sparse segment) are skipped with a
        // lock-free seqlock read: once the index stops pointing at an
        // offset it never points there again, so "not found" is final
        // and needs no bucket lock.
        let here = loc_of(off);
        if precheck
            && inner
                .index
                .read(hash, |l| (l == here).then_some(()))
                .is_none()
        {
            continue;
        }
        let mut g = inner.index.lock(hash);
        if let Some(slot) = g.find(|l| l == loc_of(off)) {
            let h = mem.header(off).unwrap_or(h);
            if h.expired_at(now) {
                g.remove(slot);
                mem.live().add(c.seg, -(size as i64));
                inner
                    .stats
                    .expired_reclaimed
                    .fetch_add(1, Ordering::Relaxed);
                if mem.tracks_access() && !mem.accessed(off) {
                    inner
                        .stats
                        .expired_unfetched
                        .fetch_add(1, Ordering::Relaxed);
                }
            } else if !rule.keeps(mem, off, &h, size, hash) {
                // Evicted: unlinked under the bucket lock like a delete; a
                // reader copying it fails its validation and retries (and
                // then misses), and its bytes stay until the epoch passes
                // the segment's retirement.
                g.remove(slot);
                mem.live().add(c.seg, -(size as i64));
                evicted += 1;
                evicted_bytes += size as u64;
            } else {
                let Some(new_off) = Dest::room(dest, inner, cands, size) else {
                    complete = false;
                    break;
                };
                // SAFETY: `new_off` is room `Dest::room` just made in
                // this worker's own destination segment (only this
                // worker writes it); the source object's bucket is
                // locked, in a victim segment, so they do not overlap.
                if !unsafe { mem.copy(off, new_off, size) } {
                    complete = false;
                    break;
                }
                g.replace(slot, loc_of(new_off));
                crate::store::note_expiry(mem, new_off, h.expiry_ms);
                let d = dest.as_mut().expect("room() opened a destination");
                mem.live().add(d.seg, size as i64);
                d.used += size;
                d.prefetched = prefetch_seg(
                    mem,
                    &d.blocks,
                    d.prefetched.max(d.used),
                    (d.used + DEST_PREFETCH_AHEAD_BYTES).min(d.blocks.len() * BLOCK_BYTES),
                    true,
                );
                // The source's live bytes and the statistics are
                // settled once per segment (below); until then the
                // source overstates its live bytes, which no reader of
                // a segment being compacted looks at.
                relocated += size as u64;
            }
        }
        drop(g);
    }
    if dead_skipped > 0 {
        inner
            .stats
            .dead_skipped
            .fetch_add(dead_skipped, Ordering::Relaxed);
    }
    if relocated > 0 {
        mem.live().add(c.seg, -(relocated as i64));
        inner
            .stats
            .bytes_relocated
            .fetch_add(relocated, Ordering::Relaxed);
    }
    if complete {
        inner
            .stats
            .retiring_blocks
            .fetch_add(c.cap_blocks as u64, Ordering::AcqRel);
        mem.seg(c.seg).meta.lock().state = SegState::Retired;
        retired.push(&inner.epochs, c.seg);
        cands.retain(|&s| s != c.seg);
        inner
            .stats
            .segments_compacted
            .fetch_add(1, Ordering::Relaxed);
        progress = true;
        // Free what the epoch has passed now, not after the pass: a
        // pass over sparse segments scans many of them, and writers
        // waiting for space should get each one's blocks as soon as
        // they are safe.
        free_retired(inner, retired);
    }
    if evicted > 0 {
        inner.stats.evicted.fetch_add(evicted, Ordering::Relaxed);
        inner
            .stats
            .evicted_bytes
            .fetch_add(evicted_bytes, Ordering::Relaxed);
    }
    (progress, relocated)
}
