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
//!     │ Merge: the MERGE_SEGMENTS oldest, a destination passed over once
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
//! after a miss. A key counted once that was not read since it was
//! written here (the GET that missed it and nothing since, as a scan's
//! keys) ranks as never read, and those are not kept (`score`, at least
//! [`MERGE_MIN_READS`]). The sweep visits the victims' objects in
//! log order, not by count, so a pass first reads the victims' headers and
//! keys once to count the live bytes at each estimate (0 to 15) and cuts
//! from the top: the fewest reads `t` whose objects all fit the budget,
//! and of the level below, what is left of it in log order
//! (`merge_cut`):
//!
//! ```text
//!  bytes by reads:  15 ██  …  4 ███  3 █████  2 ████████  1 ████████████  0 ███
//!  budget (3/4):    ├──── all kept ─────────┤├ in log order ┤  evicted …
//! ```
//!
//! A key read more often than another in the same merge is never the one
//! evicted, wherever the two lie in the victims: a hot key that comes
//! after the budget is spent on lukewarm ones is kept all the same (at
//! zipf 1.2 the hot set is small and each such eviction costs a miss at
//! once). The extra
//! read costs a header, a key hash and a lock-free index probe per
//! object, against the locked probe and copy the sweep pays anyway; it
//! takes objects in batches whose index buckets and sketch counters are
//! prefetched together, and notes each object's score so that the sweep
//! does not read the counters again. Survivors go to the worker's
//! destination, a young segment. No per-object list, and no lock beyond the bucket locks
//! compaction takes anyway. A store without the sketch (never the case
//! once it may evict) falls back to the accessed bit: kept if read since
//! it was written here, CLOCK at the grain of segments.
//! `memlab cache` and `memlab evict` (docs/BENCHMARKS.md) measure both
//! against exact LRU, memcached, Segcache and two offline references.
//! Segcache keeps a merged segment in the chain's
//! place instead; here the survivors of a merge are simply younger, which
//! costs nothing extra since compaction destinations exist already, and
//! a destination that comes up for merging is passed over once, made
//! young again without a copy (`second_chance`): its objects were kept
//! for being read often and would mostly be copied again.
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

/// Fewest reads (`score`) for merge eviction to keep an object: one, so
/// that a key read once since the counters last halved, and read since
/// it was written here, is kept where hotter ones leave room (a floor of
/// two missed 3 % more at zipf 1.2 and a 10 % cache, `memlab cache`).
const MERGE_MIN_READS: u8 = 1;

/// How far past its cursor [`Keep::keeps`] looks for an object in the
/// scores the histogram pass noted (objects that died in between leave
/// entries nobody asks for).
const MEMO_LOOKAHEAD: usize = 8;

/// What an eviction sweep keeps (see [`Rule::Evict`]).
pub(super) struct Keep {
    volatile_only: bool,
    /// The histogram pass's score of each object it counted, in the order
    /// the sweep visits them (victims in order, objects in log order), so
    /// the sweep need not read each key's counters again; `cursor` is
    /// the next entry to look at.
    memo: Vec<(u64, u8)>,
    cursor: usize,
    /// Merge: objects read often enough are kept while their bytes fit this.
    retain_bytes: u64,
    /// Merge: kept if the sketch counts at least this many reads of the key.
    min_reads: u8,
    /// Merge: objects counted exactly `min_reads - 1` reads are kept too
    /// while their bytes fit this (the level the pass's cut falls in).
    edge_bytes: u64,
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
        let size = size as u64;
        let read_enough = match mem.sketch() {
            Some(s) => {
                let e = self.noted(off).unwrap_or_else(|| score(mem, s, off, hash));
                if e >= self.min_reads {
                    true
                } else if e + 1 == self.min_reads && self.edge_bytes >= size {
                    self.edge_bytes -= size;
                    true
                } else {
                    false
                }
            }
            None => mem.accessed(off),
        };
        if !read_enough || self.retain_bytes < size {
            return false;
        }
        self.retain_bytes -= size;
        true
    }

    /// The score the histogram pass noted for the object at `off`.
    #[inline]
    fn noted(&mut self, off: u64) -> Option<u8> {
        let end = self.memo.len().min(self.cursor + MEMO_LOOKAHEAD);
        let i = (self.cursor..end).find(|&i| self.memo[i].0 == off)?;
        self.cursor = i + 1;
        Some(self.memo[i].1)
    }
}

/// Bytes of the live, unexpired, evictable objects of the victims, by the
/// sketch's estimate of their reads (0 to 15), and each such object's
/// score in visiting order (for [`Keep::keeps`]). Objects are taken in
/// batches, as the sweep takes them: the headers and keys of a batch are
/// read and their index buckets and sketch counters prefetched first, so
/// that the misses of a batch overlap instead of being paid one by one.
fn read_histogram(
    inner: &Inner,
    sketch: &crate::sketch::Sketch,
    victims: &[(u64, Candidate)],
    volatile_only: bool,
) -> ([u64; 16], Vec<(u64, u8)>) {
    let mem = &inner.mem;
    let now = now_ms();
    let mut hist = [0u64; 16];
    let mut memo = Vec::new();
    let mut key = Vec::new();
    let mut batch: Vec<(u64, usize, u64)> = Vec::with_capacity(PREFETCH_BATCH);
    for (_, c) in victims {
        let blocks = mem.seg(c.seg).meta.lock().blocks.clone();
        let mut scan = 0usize;
        let mut intact = true;
        while intact && scan < c.used as usize {
            batch.clear();
            while batch.len() < PREFETCH_BATCH && scan < c.used as usize {
                let off = Memory::seg_offset(&blocks, scan);
                let Some(h) = mem.header(off) else {
                    intact = false;
                    break;
                };
                scan += h.object_bytes();
                if h.is_dead()
                    || h.pinned
                    || (volatile_only && h.expiry_ms == 0)
                    || h.expired_at(now)
                {
                    continue;
                }
                key.resize(h.key_len as usize, 0);
                if !mem.read_part(off, h.header_bytes(), &mut key) {
                    intact = false;
                    break;
                }
                let hash = crate::store::hash_key(&key);
                inner.index.prefetch(hash);
                sketch.prefetch(hash);
                batch.push((off, h.object_bytes(), hash));
            }
            for &(off, size, hash) in &batch {
                let here = loc_of(off);
                if inner
                    .index
                    .read(hash, |l| (l == here).then_some(()))
                    .is_some()
                {
                    let e = score(mem, sketch, off, hash);
                    hist[usize::from(e)] += size as u64;
                    memo.push((off, e));
                }
            }
        }
    }
    (hist, memo)
}

/// The cut of a merge: the fewest reads `t` (at least `floor`) such that
/// the objects read `t` times or more fit `retain_bytes`, and the bytes
/// left over for objects read `t - 1` times (kept while they fit, when
/// `t - 1` is not below `floor`).
fn merge_cut(hist: &[u64; 16], retain_bytes: u64, floor: u8) -> (u8, u64) {
    let mut above = 0u64;
    let mut t = 16usize;
    while t > usize::from(floor) && above + hist[t - 1] <= retain_bytes {
        t -= 1;
        above += hist[t];
    }
    let edge = if t > usize::from(floor) {
        retain_bytes - above
    } else {
        0
    };
    (t as u8, edge)
}

/// Merge eviction's second chance, at the grain of segments: among the
/// oldest candidates (`ready`, oldest first), a compaction destination
/// not passed over before is made young again instead of merged, as long
/// as [`MERGE_SEGMENTS`] others remain to merge (so every pass still
/// merges). Its objects survived a merge because they are read often, so
/// a merge one log wrap later would mostly copy them again; passing over
/// it once lets the hot set wrap twice per copy, and the merges fall more
/// often on the segments of new writes, most of whose objects go. On the
/// 10 % cache cell of `memlab cache` (zipf 1.0) this cut the bytes merges
/// relocate per byte they evict from 2.28 to 1.83, with the miss ratio
/// level or lower on the zipfian traces (docs/BENCHMARKS.md). Passing a
/// segment over more than once cut copies further (1.59 for three times)
/// but missed more on the one-off scan trace.
fn second_chance(mem: &Memory, ready: &mut Vec<(u64, Candidate)>) {
    let mut i = 0;
    while i < MERGE_SEGMENTS && ready.len() > MERGE_SEGMENTS {
        let mut m = mem.seg(ready[i].1.seg).meta.lock();
        if m.state == SegState::Closed && m.second_chance {
            m.second_chance = false;
            m.created_tsc = topology::rdtsc();
            drop(m);
            ready.remove(i);
        } else {
            i += 1;
        }
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
            second_chance(mem, &mut ready);
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
    // The cut: keep the most read objects of the victims, up to
    // `retain_bytes`, whatever their place in the log.
    if let Some(s) = mem.sketch() {
        s.age_if_due(inner.index.len());
    }
    let (min_reads, edge_bytes, memo) = match mem.sketch() {
        Some(s) if retain_bytes > 0 => {
            let (hist, memo) = read_histogram(inner, s, &ready, e.volatile_only);
            let (t, edge) = merge_cut(&hist, retain_bytes, MERGE_MIN_READS);
            (t, edge, memo)
        }
        _ => (MERGE_MIN_READS, 0, Vec::new()),
    };
    let mut rule = Rule::Evict(Keep {
        volatile_only: e.volatile_only,
        memo,
        cursor: 0,
        retain_bytes,
        min_reads,
        edge_bytes,
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

/// The reads merge eviction ranks the object at `off` by: the sketch's
/// estimate, except that a key counted fewer than two reads that was not
/// read since it was written here counts none (the GET that missed it and
/// nothing since: a one-off, as a scan's keys are).
#[inline]
fn score(mem: &Memory, s: &crate::sketch::Sketch, off: u64, hash: u64) -> u8 {
    let e = s.estimate(hash).min(15);
    if e < 2 && !mem.accessed(off) {
        0
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Second chance: a closed compaction destination among the oldest
    /// candidates is passed over once (made young, left out of this
    /// merge), a segment of new writes never, and nothing is passed over
    /// unless `MERGE_SEGMENTS` others remain to merge.
    #[test]
    fn second_chance_passes_over_a_destination_once() {
        let mem = Memory::new(32 << 20, 0, 1).unwrap();
        let seg = |for_compaction: bool| {
            let s = mem.new_segment(1, for_compaction).unwrap();
            mem.seg(s).meta.lock().state = SegState::Closed;
            s
        };
        let cand = |s: SegId| {
            let m = mem.seg(s).meta.lock();
            (
                m.created_tsc,
                Candidate {
                    seg: s,
                    expiring: false,
                    cap_blocks: 1,
                    used: 0,
                    live: 0,
                    score: 0.0,
                },
            )
        };
        // Oldest first: a destination, then six segments of new writes.
        let dest = seg(true);
        let writes: Vec<SegId> = (0..6).map(|_| seg(false)).collect();
        let all = || -> Vec<(u64, Candidate)> {
            let mut v: Vec<_> = std::iter::once(dest)
                .chain(writes.iter().copied())
                .map(cand)
                .collect();
            v.sort_by_key(|(age, _)| *age);
            v
        };
        let before = mem.seg(dest).meta.lock().created_tsc;
        let mut ready = all();
        assert_eq!(ready[0].1.seg, dest);
        second_chance(&mem, &mut ready);
        let segs: Vec<SegId> = ready.iter().map(|(_, c)| c.seg).collect();
        assert_eq!(segs, writes, "the destination was merged");
        let m = mem.seg(dest).meta.lock();
        assert!(!m.second_chance && m.created_tsc > before, "not made young");
        drop(m);
        // Now the youngest, and no chance left: merged when its turn comes.
        assert_eq!(all().last().unwrap().1.seg, dest);
        mem.seg(dest).meta.lock().created_tsc = 0;
        let mut ready = all();
        second_chance(&mem, &mut ready);
        assert_eq!(ready[0].1.seg, dest, "passed over twice");
        // With only MERGE_SEGMENTS candidates nothing is passed over.
        let d2 = seg(true);
        let mut few: Vec<_> = std::iter::once(d2)
            .chain(writes.iter().copied().take(MERGE_SEGMENTS - 1))
            .map(cand)
            .collect();
        second_chance(&mem, &mut few);
        assert_eq!(few.len(), MERGE_SEGMENTS);
        assert!(mem.seg(d2).meta.lock().second_chance);
    }

    /// The sweep finds the histogram pass's scores in visiting order,
    /// skipping entries of objects that died in between, and computes
    /// the score itself for an object the pass did not note.
    #[test]
    fn noted_scores_follow_the_visiting_order() {
        let mut k = Keep {
            volatile_only: false,
            memo: vec![(10, 3), (20, 0), (30, 5), (40, 7)],
            cursor: 0,
            retain_bytes: 0,
            min_reads: 1,
            edge_bytes: 0,
        };
        assert_eq!(k.noted(20), Some(0));
        assert_eq!(k.noted(10), None, "behind the cursor");
        assert_eq!(k.noted(99), None, "never noted");
        assert_eq!(k.cursor, 2);
        assert_eq!(k.noted(40), Some(7));
        assert_eq!(k.noted(30), None);
        let far: Vec<(u64, u8)> = (0..20).map(|i| (i, 1)).collect();
        let mut k = Keep {
            memo: far,
            cursor: 0,
            ..k
        };
        assert_eq!(k.noted(MEMO_LOOKAHEAD as u64), None, "past the lookahead");
        assert_eq!(k.noted(3), Some(1));
    }

    /// The model: objects sorted by reads, most first, kept while each
    /// fits what is left of the budget and is read at least `floor` times.
    fn model(objs: &[(u8, u64)], budget: u64, floor: u8) -> u64 {
        let mut v = objs.to_vec();
        v.sort_by_key(|o| std::cmp::Reverse(o.0));
        let mut left = budget;
        let mut kept = 0;
        for (e, size) in v {
            if e < floor {
                break;
            }
            if size <= left {
                left -= size;
                kept += size;
            } else {
                break;
            }
        }
        kept
    }

    /// What the cut keeps of `objs` in log order, as `Keep::keeps` does.
    fn cut_keeps(objs: &[(u8, u64)], budget: u64, floor: u8) -> (u64, Vec<bool>) {
        let mut hist = [0u64; 16];
        for &(e, size) in objs {
            hist[usize::from(e)] += size;
        }
        let (t, mut edge) = merge_cut(&hist, budget, floor);
        let mut left = budget;
        let mut kept = 0;
        let mut which = Vec::new();
        for &(e, size) in objs {
            let k = (e >= t
                || (e + 1 == t && edge >= size && {
                    edge -= size;
                    true
                }))
                && left >= size;
            if k {
                left -= size;
                kept += size;
            }
            which.push(k);
        }
        (kept, which)
    }

    #[test]
    fn cut_keeps_the_most_read_wherever_they_lie() {
        // Lukewarm objects first in log order, the hottest last: a budget
        // spent in log order would evict the hottest.
        let mut objs: Vec<(u8, u64)> = (0..30).map(|_| (2u8, 1000u64)).collect();
        objs.extend((0..10).map(|_| (15u8, 1000u64)));
        let (kept, which) = cut_keeps(&objs, 30_000, 1);
        assert_eq!(kept, 30_000);
        assert!(which[30..].iter().all(|&k| k), "every hottest object kept");
        assert_eq!(which[..30].iter().filter(|&&k| k).count(), 20);
        // Below the floor nothing is kept, room or not.
        let (kept, _) = cut_keeps(&[(0, 1000), (0, 1000)], 10_000, 1);
        assert_eq!(kept, 0);
        // The top level alone overflows: kept in log order up to the budget.
        let (kept, which) = cut_keeps(&[(15, 600), (15, 600), (3, 10)], 1000, 1);
        assert_eq!((kept, which), (600, vec![true, false, false]));
    }

    /// Against the model on random victims of equal-sized objects (where
    /// keeping by level in log order is exactly the model's greedy).
    #[test]
    fn cut_matches_the_model() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2_000 {
            let n = (next() % 60) as usize;
            let objs: Vec<(u8, u64)> = (0..n).map(|_| ((next() % 16) as u8, 1024)).collect();
            let budget = next() % 70_000;
            let floor = (next() % 4) as u8;
            let (kept, which) = cut_keeps(&objs, budget, floor);
            assert_eq!(
                kept,
                model(&objs, budget, floor),
                "{objs:?} {budget} {floor}"
            );
            // No kept object is read less than an evicted one at or above the floor.
            let min_kept = objs
                .iter()
                .zip(&which)
                .filter(|(_, &k)| k)
                .map(|(o, _)| o.0)
                .min();
            let max_evicted = objs
                .iter()
                .zip(&which)
                .filter(|(o, &k)| !k && o.0 >= floor)
                .map(|(o, _)| o.0)
                .max();
            if let (Some(a), Some(b)) = (min_kept, max_evicted) {
                assert!(a >= b, "kept {a} reads, evicted {b}");
            }
        }
    }
}
