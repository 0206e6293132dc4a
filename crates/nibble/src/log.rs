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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;
use epoch::EpochScheme;
use parking_lot::Mutex;

use crate::memory::{Memory, NoBlocks, SegId, SegState, BLOCK_BYTES};

/// `Log::next` of a head without a segment (or a full one).
const NO_HINT: u64 = u64::MAX;

/// A head's current segment.
pub struct HeadSeg {
    /// Segment id.
    pub seg: SegId,
    /// Its blocks (a private copy: no lock needed to compute offsets).
    pub blocks: Vec<u32>,
    /// Next free byte.
    pub used: usize,
}

impl HeadSeg {
    fn capacity(&self) -> usize {
        self.blocks.len() * BLOCK_BYTES
    }
}

/// One node's log.
pub struct Log {
    heads: Box<[CachePadded<Mutex<Option<HeadSeg>>>]>,
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
    /// `segment_blocks` blocks.
    pub fn new(heads: usize, workers: usize, segment_blocks: usize) -> Log {
        Log {
            heads: (0..heads.max(1))
                .map(|_| CachePadded::new(Mutex::new(None)))
                .collect(),
            next: (0..heads.max(1))
                .map(|_| CachePadded::new(AtomicU64::new(NO_HINT)))
                .collect(),
            closed: (0..workers.max(1)).map(|_| SegQueue::new()).collect(),
            next_worker: AtomicUsize::new(0),
            segment_blocks,
        }
    }

    /// Append an object of `len` bytes written by `fill(mem, pool_offset)`.
    /// `hint` picks the first head to try (the CPU's index within its node).
    pub fn append(
        &self,
        mem: &Memory,
        epochs: &dyn EpochScheme,
        hint: usize,
        len: usize,
        fill: impl FnOnce(u64),
    ) -> Result<Appended, NoBlocks> {
        let n = self.heads.len();
        let first = hint % n;
        let mut guard = None;
        for i in 0..n {
            if let Some(g) = self.heads[(first + i) % n].try_lock() {
                guard = Some((g, (first + i) % n));
                break;
            }
        }
        let (mut head, idx) = guard.unwrap_or_else(|| (self.heads[first].lock(), first));
        let fits = head.as_ref().is_some_and(|h| h.used + len <= h.capacity());
        // A head grows a block at a time up to the segment size (see
        // `Memory::grow_segment`); it rolls when the object would not fit.
        let max_bytes = self.segment_blocks * BLOCK_BYTES;
        let grows = !fits && head.as_ref().is_some_and(|h| h.used + len <= max_bytes);
        if grows {
            let h = head.as_mut().expect("checked above");
            let more = (h.used + len).div_ceil(BLOCK_BYTES) - h.blocks.len();
            let added = mem.grow_segment(h.seg, more, false)?;
            h.blocks.extend_from_slice(&added);
        } else if !fits {
            let blocks = len.div_ceil(BLOCK_BYTES).max(1);
            let seg = mem.new_segment(blocks, false)?;
            let fresh = HeadSeg {
                seg,
                blocks: mem.seg(seg).meta.lock().blocks.clone(),
                used: 0,
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
        self.next[idx].store(next, Ordering::Relaxed);
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
        for head in self.heads.iter() {
            if let Some(h) = head.lock().take() {
                self.close(mem, epochs, h);
            }
        }
    }
}
