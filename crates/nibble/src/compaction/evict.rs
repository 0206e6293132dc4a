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
//! Merge eviction keeps the objects a GET read since they were written
//! (their accessed bit, module `memory`), up to half of the merged bytes
//! (`MERGE_RETAIN_PERMILLE`), so each merge frees at least two segments'
//! worth.
//! Survivors go to the worker's destination, a young segment, and lose
//! their bit: an object read once per round of the log survives, one not
//! read since its last move goes. That is CLOCK (second chance) at the
//! grain of segments, with no per-object list and no lock beyond the
//! bucket locks compaction takes anyway. On a zipf 1.0 trace it misses
//! about as often as an exact LRU holding the same items (2-3 % less at a
//! 10 % cache, up to 5 % more at 20 %) and 10-15 % less than segment FIFO
//! (`memlab evict`, docs/BENCHMARKS.md).
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
/// Share of the merged bytes merge eviction may keep, per mille. Half:
/// on a zipf 1.0 trace (`memlab evict`) keeping up to a quarter missed
/// 5-10 % more than an exact LRU of the same items, keeping up to half
/// misses 1-3 % less; each merge still frees two segments' worth.
const MERGE_RETAIN_PERMILLE: u64 = 500;

/// What an eviction sweep keeps (see [`Rule::Evict`]).
pub(super) struct Keep {
    volatile_only: bool,
    /// Merge: accessed objects are kept while their bytes fit this.
    retain_bytes: u64,
}

impl Keep {
    /// Whether the live, unexpired object at `off` (header `h`, `size`
    /// bytes) is relocated rather than evicted.
    #[inline]
    pub(super) fn keeps(&mut self, mem: &Memory, off: u64, h: &Header, size: usize) -> bool {
        if h.pinned || (self.volatile_only && h.expiry_ms == 0) {
            return true;
        }
        if self.retain_bytes >= size as u64 && mem.accessed(off) {
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
    let mut rule = Rule::Evict(Keep {
        volatile_only: e.volatile_only,
        retain_bytes,
    });
    let mut swept = 0;
    let mut relocated = 0;
    for (_, c) in &ready {
        let (done, moved) = sweep(inner, cands, dest, retired, c, &mut rule);
        swept += done as usize;
        relocated += moved;
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
