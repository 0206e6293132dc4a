//! The multi-head log (dissertation §4.4).
//!
//! One log per NUMA node; each log has one *head* per CPU of its node. An
//! append picks the head of the CPU the thread runs on (`rdpid`, about a
//! nanosecond), bumps the head's offset, and copies the object in. The head
//! is a mutex taken with `try_lock`: a thread that finds its head busy (two
//! threads on one CPU, or a migration) moves on to the next head of the node
//! instead of spinning, and only blocks after every head of the node was
//! busy once — appends are short, so it waits for one copy at most.
//!
//! "Write local, read global": appends go to the local node's log; reads go
//! wherever the index points.
//!
//! A head's segment starts with the blocks its first object needs and
//! grows a block at a time up to the segment size, so the budget never
//! counts empty blocks of open heads as used (at high utilization those
//! would be a large share of the free space compaction works with). When an object does not fit in a full-
//! size segment, the head *rolls*: the segment is closed
//! (stamped with the epoch clock, so compaction waits until every append
//! that might still be publishing into it has finished) and handed
//! round-robin to one of the node's compaction workers; a new segment is
//! allocated. An object larger than a segment gets a segment of its own size.
//!
//! TTL heads (Segcache, NSDI'21 §4.1, "TTL buckets"): a write with an
//! expiry goes to a head chosen by its TTL instead (when
//! `Config::ttl_placement` is on), so that objects expiring together share
//! segments and a segment whose objects have all expired can be freed
//! whole by the expiry pass (`compaction/expire.rs`) without relocating
//! anything. The TTL buckets have a width that grows with the TTL, 8 per
//! doubling (an eighth of the TTL: [`ttl_bucket`], [`ttl_width_ms`]), at
//! least [`TTL_BUCKET_MIN_WIDTH_MS`]; TTLs past [`TTL_MAX_BUCKETED_MS`]
//! share the last bucket. Each bucket has a few striped heads per node
//! ([`TTL_HEAD_STRIPES_MAX`], `try_lock` as for CPU heads). A TTL head
//! also rolls when an object would expire more than a bucket width after
//! the first object of its segment, so a segment's objects expire within
//! one width of each other even when the head fills slowly, and the
//! expiry pass closes a TTL head whose segment's latest expiry has
//! passed: memory held by expired objects waits for at most a width plus
//! a pass period. Objects without an expiry keep the CPU heads.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;
use epoch::EpochScheme;
use parking_lot::Mutex;

use crate::memory::{Memory, NoBlocks, SegId, SegState, BLOCK_BYTES};
use crate::object::now_ms;

/// `Log::next` of a head without a segment (or a full one).
const NO_HINT: u64 = u64::MAX;

/// Narrowest TTL bucket, ms: TTLs under 1,024 ms fall into 128 ms windows.
pub const TTL_BUCKET_MIN_WIDTH_MS: u64 = 128;
/// TTL buckets per doubling of the TTL (each an eighth of its TTL wide).
const TTL_BUCKETS_PER_DOUBLING: u64 = 8;
/// log2 of the first TTL whose bucket is wider than the minimum
/// (`TTL_BUCKET_MIN_WIDTH_MS * TTL_BUCKETS_PER_DOUBLING` = 1,024 ms).
const TTL_FIRST_WIDE_LOG2: u32 = 10;
/// TTLs from this on (2^35 ms, about 1.1 years) share the last bucket.
pub const TTL_MAX_BUCKETED_MS: u64 = 1 << 35;
/// Number of TTL buckets: 8 narrow ones below 1,024 ms, 8 per doubling
/// up to `TTL_MAX_BUCKETED_MS`, and the last one.
pub const TTL_BUCKETS: usize = (TTL_BUCKETS_PER_DOUBLING
    * (1 + (TTL_MAX_BUCKETED_MS.trailing_zeros() - TTL_FIRST_WIDE_LOG2) as u64)
    + 1) as usize;
/// Most heads per TTL bucket and node (fewer when the node has fewer CPUs).
pub const TTL_HEAD_STRIPES_MAX: usize = 4;

/// The TTL bucket of a write that expires `ttl_ms` from now.
pub fn ttl_bucket(ttl_ms: u64) -> usize {
    let narrow = TTL_BUCKET_MIN_WIDTH_MS * TTL_BUCKETS_PER_DOUBLING;
    if ttl_ms < narrow {
        return (ttl_ms / TTL_BUCKET_MIN_WIDTH_MS) as usize;
    }
    if ttl_ms >= TTL_MAX_BUCKETED_MS {
        return TTL_BUCKETS - 1;
    }
    let e = 63 - ttl_ms.leading_zeros();
    let within = (ttl_ms - (1 << e)) / ttl_width_ms(ttl_ms);
    (TTL_BUCKETS_PER_DOUBLING * (1 + (e - TTL_FIRST_WIDE_LOG2) as u64) + within) as usize
}

/// The width (ms) of `ttl_ms`'s bucket: an eighth of the power of two at
/// or below it, at least [`TTL_BUCKET_MIN_WIDTH_MS`]. Also the most a TTL
/// head's segment spans between its first and its latest expiry.
pub fn ttl_width_ms(ttl_ms: u64) -> u64 {
    let e = 63 - ttl_ms.max(1).leading_zeros();
    ((1u64 << e) / TTL_BUCKETS_PER_DOUBLING).max(TTL_BUCKET_MIN_WIDTH_MS)
}

/// A head's current segment.
pub struct HeadSeg {
    /// Segment id.
    pub seg: SegId,
    /// Its blocks (a private copy: no lock needed to compute offsets).
    pub blocks: Vec<u32>,
    /// Next free byte.
    pub used: usize,
    /// TTL heads: the expiry of the segment's first object (Unix ms);
    /// 0 on CPU heads.
    pub first_expiry_ms: u64,
}

impl HeadSeg {
    fn capacity(&self) -> usize {
        self.blocks.len() * BLOCK_BYTES
    }
}

/// A head: its segment, if it has one.
type Head = CachePadded<Mutex<Option<HeadSeg>>>;

/// One node's log.
pub struct Log {
    heads: Box<[Head]>,
    /// TTL heads, bucket-major (`ttl_stripes` per bucket); empty when TTL
    /// placement is off.
    ttl_heads: Box<[Head]>,
    ttl_stripes: usize,
    /// Per head: the pool offset of its next free byte, or `NO_HINT`. A
    /// hint only (read without the head's lock), for [`Log::prefetch`].
    next: Box<[CachePadded<AtomicU64>]>,
    /// Closed segments, one queue per compaction worker.
    pub closed: Box<[SegQueue<SegId>]>,
    next_worker: AtomicUsize,
    segment_blocks: usize,
}

/// Where an append put an object.
#[derive(Clone, Copy, Debug)]
pub struct Appended {
    /// Pool offset of the object.
    pub off: u64,
    /// Its segment.
    pub seg: SegId,
}

impl Log {
    /// A log with `heads` heads, `workers` compaction queues and segments of
    /// `segment_blocks` blocks; with TTL heads if `ttl_placement`.
    pub fn new(heads: usize, workers: usize, segment_blocks: usize, ttl_placement: bool) -> Log {
        let ttl_stripes = if ttl_placement {
            heads.clamp(1, TTL_HEAD_STRIPES_MAX)
        } else {
            0
        };
        Log {
            heads: (0..heads.max(1))
                .map(|_| CachePadded::new(Mutex::new(None)))
                .collect(),
            ttl_heads: (0..TTL_BUCKETS * ttl_stripes)
                .map(|_| CachePadded::new(Mutex::new(None)))
                .collect(),
            ttl_stripes,
            next: (0..heads.max(1))
                .map(|_| CachePadded::new(AtomicU64::new(NO_HINT)))
                .collect(),
            closed: (0..workers.max(1)).map(|_| SegQueue::new()).collect(),
            next_worker: AtomicUsize::new(0),
            segment_blocks,
        }
    }

    /// Append an object of `len` bytes, expiring at `expiry_ms` (0 =
    /// never), written by `fill(mem, pool_offset)`. `hint` picks the
    /// first head to try (the CPU's index within its node); an object
    /// with an expiry goes to its TTL bucket's heads when TTL placement is
    /// on (module docs). `reserve`: the head may grow into the compaction
    /// reserve (the store's bounded use of it, `Store::set_expiry`).
    #[allow(clippy::too_many_arguments)]
    pub fn append(
        &self,
        mem: &Memory,
        epochs: &dyn EpochScheme,
        hint: usize,
        len: usize,
        expiry_ms: u64,
        reserve: bool,
        fill: impl FnOnce(u64),
    ) -> Result<Appended, NoBlocks> {
        if expiry_ms != 0 && self.ttl_stripes != 0 {
            let ttl_ms = expiry_ms.saturating_sub(now_ms());
            let b = ttl_bucket(ttl_ms);
            let heads = &self.ttl_heads[b * self.ttl_stripes..(b + 1) * self.ttl_stripes];
            let span = Some((expiry_ms, ttl_width_ms(ttl_ms)));
            return self.append_to(heads, false, mem, epochs, hint, len, span, reserve, fill);
        }
        self.append_to(
            &self.heads,
            true,
            mem,
            epochs,
            hint,
            len,
            None,
            reserve,
            fill,
        )
    }

    /// Append to one of `heads` (see [`Log::append`]); `hints`: keep
    /// `Log::next` (CPU heads); `span`: the object's expiry and the most
    /// its TTL head's segment may span (TTL heads); `reserve`: as
    /// [`Log::append`].
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn append_to(
        &self,
        heads: &[Head],
        hints: bool,
        mem: &Memory,
        epochs: &dyn EpochScheme,
        hint: usize,
        len: usize,
        span: Option<(u64, u64)>,
        reserve: bool,
        fill: impl FnOnce(u64),
    ) -> Result<Appended, NoBlocks> {
        let n = heads.len();
        let first = hint % n;
        let mut guard = None;
        for i in 0..n {
            if let Some(g) = heads[(first + i) % n].try_lock() {
                guard = Some((g, (first + i) % n));
                break;
            }
        }
        let (mut head, idx) = guard.unwrap_or_else(|| (heads[first].lock(), first));
        // A TTL head rolls when this object would expire more than a
        // bucket width after the segment's first one.
        let too_late = |h: &HeadSeg| {
            span.is_some_and(|(expiry, width)| expiry > h.first_expiry_ms.saturating_add(width))
        };
        let fits = head
            .as_ref()
            .is_some_and(|h| h.used + len <= h.capacity() && !too_late(h));
        // A head grows a block at a time up to the segment size (see
        // `Memory::grow_segment`); it rolls when the object would not fit.
        let max_bytes = self.segment_blocks * BLOCK_BYTES;
        let grows = !fits
            && head
                .as_ref()
                .is_some_and(|h| h.used + len <= max_bytes && !too_late(h));
        if grows {
            let h = head.as_mut().expect("checked above");
            let more = (h.used + len).div_ceil(BLOCK_BYTES) - h.blocks.len();
            let added = mem.grow_segment(h.seg, more, reserve)?;
            h.blocks.extend_from_slice(&added);
        } else if !fits {
            let blocks = len.div_ceil(BLOCK_BYTES).max(1);
            let seg = mem.new_segment(blocks, reserve)?;
            let blocks = {
                let mut m = mem.seg(seg).meta.lock();
                if let Some((expiry, width)) = span {
                    m.ttl_span_end_ms = expiry.saturating_add(width);
                }
                m.blocks.clone()
            };
            let fresh = HeadSeg {
                seg,
                blocks,
                used: 0,
                first_expiry_ms: span.map_or(0, |(expiry, _)| expiry),
            };
            if let Some(old) = head.replace(fresh) {
                self.close(mem, epochs, old);
            }
        }
        let h = head.as_mut().expect("a head segment was just installed");
        let off = Memory::seg_offset(&h.blocks, h.used);
        h.used += len;
        let next = if h.used < h.capacity() {
            Memory::seg_offset(&h.blocks, h.used)
        } else {
            NO_HINT
        };
        if hints {
            self.next[idx].store(next, Ordering::Relaxed);
        }
        let seg = h.seg;
        fill(off);
        drop(head);
        // Start this head's next object, guessed the size of this one: its
        // read-for-ownership then has a whole operation to finish before
        // the next append's stores must drain (at the bucket lock that
        // follows them), not just the index work [`Log::prefetch`] at the
        // start of that put overlaps it with.
        if next != NO_HINT {
            mem.prefetch_for_write(next, len);
        }
        Ok(Appended { off, seg })
    }

    /// Start loading the cache lines the next append of `len` bytes to
    /// head `hint` will probably write (up to the end of its block).
    ///
    /// An append writes into memory nobody touched since the segment was
    /// last compacted: every line is a miss, and the copy's stores must
    /// drain before the head's lock is released. Issuing those misses
    /// before the hash and index work overlaps them with it. Only a hint:
    /// another thread may take the space first.
    #[inline]
    pub fn prefetch(&self, mem: &Memory, hint: usize, len: usize) {
        let next = self.next[hint % self.heads.len()].load(Ordering::Relaxed);
        if next != NO_HINT {
            mem.prefetch_for_write(next, len);
        }
    }

    /// Close a head segment and queue it for compaction.
    pub fn close(&self, mem: &Memory, epochs: &dyn EpochScheme, h: HeadSeg) {
        {
            let mut m = mem.seg(h.seg).meta.lock();
            m.state = SegState::Closed;
            m.used = h.used;
            m.closed_at = epochs.now();
        }
        let w = self.next_worker.fetch_add(1, Ordering::Relaxed) % self.closed.len();
        self.closed[w].push(h.seg);
    }

    /// Close every head (for tests and shutdown-time statistics).
    pub fn close_all(&self, mem: &Memory, epochs: &dyn EpochScheme) {
        for head in self.heads.iter().chain(self.ttl_heads.iter()) {
            if let Some(h) = head.lock().take() {
                self.close(mem, epochs, h);
            }
        }
    }

    /// Close every TTL head whose segment's latest expiry is at or before
    /// `now_ms` (the expiry pass then frees it whole once the epoch passes
    /// its closing stamp). A head busy appending is left for the next
    /// pass. Returns how many closed.
    pub fn close_expired_heads(
        &self,
        mem: &Memory,
        epochs: &dyn EpochScheme,
        now_ms: u64,
    ) -> usize {
        let mut closed = 0;
        for head in self.ttl_heads.iter() {
            let Some(mut g) = head.try_lock() else {
                continue;
            };
            let expired = g
                .as_ref()
                .is_some_and(|h| mem.seg(h.seg).max_expiry_ms.load(Ordering::Acquire) <= now_ms);
            if let Some(h) = g.take_if(|_| expired) {
                drop(g);
                self.close(mem, epochs, h);
                closed += 1;
            }
        }
        closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_buckets_grow_with_the_ttl_and_stay_in_range() {
        assert_eq!(ttl_bucket(0), 0);
        assert_eq!(ttl_bucket(127), 0);
        assert_eq!(ttl_bucket(128), 1);
        assert_eq!(ttl_bucket(1023), 7);
        assert_eq!(ttl_bucket(1024), 8);
        assert_eq!(ttl_width_ms(200), TTL_BUCKET_MIN_WIDTH_MS);
        assert_eq!(ttl_width_ms(1000), TTL_BUCKET_MIN_WIDTH_MS);
        assert_eq!(ttl_width_ms(5000), 512);
        assert_eq!(ttl_bucket(TTL_MAX_BUCKETED_MS - 1), TTL_BUCKETS - 2);
        assert_eq!(ttl_bucket(u64::MAX), TTL_BUCKETS - 1);
        // Monotonic, and every bucket's TTLs lie within one width.
        let mut last = 0;
        let mut ttl = 1u64;
        while ttl < TTL_MAX_BUCKETED_MS {
            let b = ttl_bucket(ttl);
            assert!(b >= last && b < TTL_BUCKETS, "ttl {ttl}: bucket {b}");
            assert!(ttl_bucket(ttl + ttl_width_ms(ttl)) > b, "ttl {ttl}");
            last = b;
            ttl += ttl / 7 + 1;
        }
    }
}
