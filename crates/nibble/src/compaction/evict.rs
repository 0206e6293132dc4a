//! Cache mode: evicting whole segments when free space runs short
//! (Segcache, Yang, Yue and Rashmi, NSDI'21, §4.3; the machinery is the
//! dissertation's compaction, §4.4).
//!
//! A log-structured store is the natural home of cheap eviction: the log
//! already keeps objects in age order, segment by segment, and knows each
//! segment's live bytes. Under an evicting policy a compaction worker that
//! finds free blocks below the trigger first compacts what is cheap to
//! compact (segments at most half live), and otherwise evicts:
//!
//! ```text
//!  closed, epoch-passed segments of this worker
//!     │ Fifo: oldest ── LeastLive: fewest live bytes ── Random: any one
//!     │ Merge: the MERGE_SEGMENTS oldest
//!     ▼
//!  sweep each victim (the compaction sweep): per object, under its bucket lock,
//!     dead/moved ─ skip   expired ─ drop   pinned / kept ─ relocate   else ─ evict
//!     ▼
//!  retire(now) ─ blocks freed once the epoch passes (readers copying an evicted
//!                object hold the epoch back, exactly as for compaction)
//! ```
//!
//! Merge eviction keeps the objects whose keys are read most, up to three
//! quarters of the merged bytes (`MERGE_RETAIN_PERMILLE`), so each merge
//! frees at least one segment's worth. How often a key is read comes from the
//! store's frequency sketch (module `sketch`, TinyLFU's: every GET counts,
//! found or not, and the counts halve after ten reads per key held), so a
//! key read often keeps its standing when it was evicted and set again
//! after a miss, and a key read once, however recently, does not. The
//! sweep visits the victims' objects in log order, not by count, so
//! "the most read" is a threshold (`Inner::merge_min_reads`, at least
//! [`MERGE_MIN_READS`]) that each pass adapts: up by one when more bytes
//! qualified than the pass could keep, down by one when less than half of
//! what it could keep did. Survivors go to the worker's destination, a
//! young segment. No per-object list, and no lock beyond the bucket locks
//! compaction takes anyway. A store without the sketch (never the case
//! once it may evict) falls back to the accessed bit: kept if read since
//! it was written here, CLOCK at the grain of segments.
//! `memlab cache` and `memlab evict` (docs/BENCHMARKS.md) measure both
//! against exact LRU, memcached, Segcache and two offline references.
//! Segcache keeps a merged segment in the chain's
//! place instead; here the survivors of a merge are simply younger, which
//! costs nothing extra since compaction destinations exist already.
//!
//! Pinned objects (`Store::put_never_evict`) and, under `volatile_only`,
//! objects without an expiry are always relocated. A pass that relocates
//! nearly everything it swept (a store of pinned objects) reports no
//! progress, so writers waiting for space give up with `OutOfMemory`
//! instead of waiting for eviction that frees nothing.

use super::*;
use crate::store::{Eviction, EvictionPolicy};

/// Segments merge eviction sweeps at once (Segcache merges 4).
const MERGE_SEGMENTS: usize = 4;
/// Share of the merged bytes merge eviction may keep, per mille. Three
/// quarters: with the frequency sketch, keeping up to half missed 2-5 %
/// more at a 10 % cache (`memlab cache`, zipf 0.8-1.2); each merge of four
/// segments still frees one segment's worth.
const MERGE_RETAIN_PERMILLE: u64 = 750;

/// Fewest reads (frequency sketch) for merge eviction to keep an object.
pub(crate) const MERGE_MIN_READS: u8 = 2;
/// Most reads the threshold rises to (the sketch's counters stop at 15).
const MERGE_MAX_MIN_READS: u8 = 15;

/// What an eviction sweep keeps (see [`Rule::Evict`]).
pub(super) struct Keep {
    volatile_only: bool,
    /// Merge: objects read often enough are kept while their bytes fit this.
    retain_bytes: u64,
    /// Merge: kept if the sketch counts at least this many reads of the key.
    min_reads: u8,
    /// Bytes of the objects that qualified, kept or not.
    wanted_bytes: u64,
}

impl Keep {
    /// Whether the live, unexpired object at `off` (header `h`, `size`
    /// bytes) is relocated rather than evicted.
    #[inline]
    pub(super) fn keeps(
        &mut self,
        mem: &Memory,
        off: u64,
        h: &Header,
        size: usize,
        hash: u64,
    ) -> bool {
        if h.pinned || (self.volatile_only && h.expiry_ms == 0) {
            return true;
        }
        let read_enough = match mem.sketch() {
            Some(s) => s.estimate(hash) >= self.min_reads,
            None => mem.accessed(off),
        };
        if !read_enough {
            return false;
        }
        self.wanted_bytes += size as u64;
        if self.retain_bytes >= size as u64 {
            self.retain_bytes -= size as u64;
            return true;
        }
        false
    }
}

/// One eviction pass of a worker, under the setting `e`.
pub(super) fn evict_once(inner: &Inner, st: &mut WorkerState, e: Eviction) -> Pass {
    let WorkerState {
        cands,
        retired,
        dest,
        ..
    } = st;
    let mem = &inner.mem;
    let (mut ready, idle) = closed_and_settled(inner, cands, |seg, m| {
        Some((
            m.created_tsc,
            Candidate {
                seg,
                expiring: false,
                cap_blocks: m.blocks.len(),
                used: m.used as u64,
                live: mem.live().get(seg),
                score: 0.0,
            },
        ))
    });
    if ready.is_empty() {
        return idle;
    }
    let n = match e.policy {
        EvictionPolicy::NoEviction => return Pass::Nothing,
        EvictionPolicy::Fifo => {
            ready.sort_by_key(|(age, _)| *age);
            1
        }
        EvictionPolicy::Merge => {
            ready.sort_by_key(|(age, _)| *age);
            MERGE_SEGMENTS
        }
        EvictionPolicy::LeastLive => {
            ready.sort_by_key(|(_, c)| c.live);
            1
        }
        EvictionPolicy::Random => {
            let i = (topology::rdtsc() >> 4) as usize % ready.len();
            ready.swap(0, i);
            1
        }
    };
    ready.truncate(n);
    let cap_bytes: u64 = ready
        .iter()
        .map(|(_, c)| (c.cap_blocks * BLOCK_BYTES) as u64)
        .sum();
    let retain_bytes = if e.policy == EvictionPolicy::Merge {
        cap_bytes * MERGE_RETAIN_PERMILLE / 1000
    } else {
        0
    };
    if let Some(s) = mem.sketch() {
        s.age_if_due(inner.index.len());
    }
    let min_reads = inner.merge_min_reads.load(Ordering::Relaxed);
    let mut rule = Rule::Evict(Keep {
        volatile_only: e.volatile_only,
        retain_bytes,
        min_reads,
        wanted_bytes: 0,
    });
    let mut swept = 0;
    let mut relocated = 0;
    for (_, c) in &ready {
        let (done, moved) = sweep(inner, cands, dest, retired, c, &mut rule);
        swept += done as usize;
        relocated += moved;
    }
    // Adapt the threshold: more qualified than fit, ask for more reads;
    // less than half of what fits, for fewer.
    if let Rule::Evict(k) = &rule {
        if retain_bytes > 0 && mem.sketch().is_some() {
            let t = if k.wanted_bytes > retain_bytes {
                (min_reads + 1).min(MERGE_MAX_MIN_READS)
            } else if k.wanted_bytes < retain_bytes / 2 {
                min_reads.saturating_sub(1).max(MERGE_MIN_READS)
            } else {
                min_reads
            };
            inner.merge_min_reads.store(t, Ordering::Relaxed);
        }
    }
    // Progress only if the pass freed at least a block net: relocating
    // a segment of pinned objects into another frees nothing.
    if swept > 0 && relocated + (BLOCK_BYTES as u64) <= cap_bytes {
        inner.stats.eviction_passes.fetch_add(1, Ordering::Relaxed);
        Pass::Progress
    } else {
        Pass::Nothing
    }
}
