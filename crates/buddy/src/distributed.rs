//! The distributed buddy allocator (fos thesis §4.1), on shared memory.
//!
//! ## The algorithm
//! A *fleet* of heaps, one per CPU by default. The pool is cut into
//! *ownership ranges*: chunks of `2^max_order` frames, so any block that can
//! be allocated or freed lies inside one owner's range. Heap `i` owns a
//! contiguous run of chunks and runs a conventional [`DenseBuddy`] over it;
//! frames it holds but does not own ("foreign") sit in a [`SparseBuddy`].
//!
//! * **alloc(k)** goes to the caller's heap (current CPU): foreign blocks
//!   first (they are the ones that should leave), then owned ones. Heaps are
//!   private in the common case, so this is a serial buddy operation under a
//!   lock nobody else wants.
//! * **free(f, k)** also goes to the caller's heap. Owned frames coalesce in
//!   the dense buddy. A foreign block is kept locally, *unless the heap is at
//!   or above its high watermark*, in which case the free is forwarded to the
//!   owner asynchronously (§4.1.3): it joins a per-owner batch that goes to
//!   the owner's inbox as one message once it holds `FORWARD_BATCH_BLOCKS`
//!   (128, as §5.1 batches frees) or at the next maintenance point, and the
//!   caller returns at once.
//! * **Rebalancing (§4.1.2).** When an allocation leaves a heap below its low
//!   watermark, the heap posts a *borrow request* to the peer that advertises
//!   the most free frames ("ask peers with pages left first"). The peer
//!   answers on its next operation with a *grant*: first every block it holds
//!   that the requester owns (they go home), then large blocks of its own,
//!   never more than half of what it has. An empty grant doubles the
//!   requester's backoff before it may ask again (§5.1's exponential
//!   backoff); a full one resets it. Above the high watermark a heap sends
//!   foreign blocks home, largest first, until it is back under the mark, and
//!   every `MAINTENANCE_INTERVAL_OPS` operations it sends foreign blocks home
//!   down to the middle of its band, so that frames two heaps hold of each
//!   other's also drift home and coalesce.
//! * **Adaptive thresholds (§4.1.3).** Every grant carries the lender's free
//!   count and every request the requester's; each side folds the mean of
//!   the two into an estimate of the balanced share of free frames per heap,
//!   and the watermarks are fixed fractions of that estimate. No global
//!   counter exists anywhere.
//! * **Out of memory (§4.1.3)** is "no memory for a period of time": an
//!   allocation that its heap cannot serve borrows synchronously from every
//!   peer in turn (best first), then asks every heap to send its foreign
//!   frames home (undoing distributed fragmentation), backs off, and tries
//!   again, for `oom_rounds` rounds. Then it reports
//!   [`AllocError::OutOfMemory`]. The time is bounded; nobody spins forever.
//!
//! ## From messages to shared memory
//! fos servers own a core each and talk only by messages. Here a heap is a
//! `Mutex<HeapState>` that only threads on its CPU normally touch, plus a
//! lock-free MPSC inbox ([`crossbeam_queue::SegQueue`]) that peers push to.
//! Whoever next takes the heap's lock drains the inbox first, so messages
//! are handled by "the server" on its next operation, as in fos.
//!
//! One message is handled differently: the *synchronous* borrow of an empty
//! heap. A fos server has a core of its own to wait on; a thread here that
//! finds its heap empty has a client waiting, and the peer it would ask may
//! have no thread running on it at all. So the requester performs the
//! peer's side of the protocol itself, under the peer's lock (after dropping
//! its own: a thread never holds two heap locks, so there is no deadlock).
//! This is the shared-memory equivalent of an RPC: the same `lend` code runs,
//! on the peer's state, just on the caller's core. It is the slow path;
//! the fast path touches only the local heap.
//!
//! ```text
//!   CPU0 (heap 0)                      CPU1 (heap 1)
//!   alloc: free < low ──BorrowRequest──▶ inbox
//!                                       next op: drain → lend()
//!   inbox ◀──────────────Grant{blocks}──
//!   next op: drain → blocks join heap 0
//!   free(foreign f) at/above high → outbox[owner] ──Free{128 blocks}──▶ inbox
//! ```
//!
//! The heap locks are `xsync`'s because on the per-core backend the
//! allocator is shared between processes, where parking_lot's wake-ups are lost.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;
use xsync::Mutex;

use crate::check::AllocTable;
use crate::dense::DenseBuddy;
use crate::sparse::SparseBuddy;
use crate::stats::{summarize_blocks, HeapStats, Stats};
use crate::{
    validate_free, AllocError, BuddyConfig, ConfigError, FrameAllocator, FrameNo, FreeError,
};

/// Operations a heap waits for an answer to an asynchronous borrow request
/// before it may ask again (the peer may have no thread running on it).
const PENDING_TIMEOUT_OPS: u64 = 1024;
/// Backoff after the first empty grant, in operations of the heap.
const INITIAL_BACKOFF_OPS: u64 = 16;
/// Cap on the exponential borrow backoff.
const MAX_BACKOFF_OPS: u64 = 1 << 16;
/// Every this many operations a heap holding foreign frames sends some home.
const MAINTENANCE_INTERVAL_OPS: u64 = 256;
/// Upper bound on the passes `quiesce` makes over the fleet.
const QUIESCE_MAX_PASSES: usize = 16;
/// `pause` iterations before the second synchronous borrow round; doubles
/// each round (a `pause` is 10-140 cycles depending on the core). A spin,
/// not a sleep or a yield: Linux's 50 µs timer slack would make a 1 µs sleep
/// cost 50 µs, and a yield can hand the core away for a whole time slice.
const OOM_BACKOFF_BASE_SPINS: u32 = 16;
/// Blocks per forwarded-free message (fos thesis §5.1 batches up to 128
/// ranges per free request; more did not help there).
const FORWARD_BATCH_BLOCKS: usize = 128;

/// A message between heaps.
enum Msg {
    /// Frees forwarded to (or foreign blocks sent home to) this heap, batched.
    Free { blocks: Vec<(FrameNo, u32)> },
    /// Heap `from` is below its low watermark and asks for `want` frames.
    BorrowRequest {
        from: usize,
        want: u64,
        requester_free: u64,
    },
    /// The answer to a borrow request (possibly empty).
    Grant {
        blocks: Vec<(FrameNo, u32)>,
        lender_free: u64,
    },
}

/// One heap: private state under its own lock, and a lock-free inbox.
struct Heap {
    state: Mutex<HeapState>,
    inbox: SegQueue<Msg>,
    /// Frames inside messages queued on this inbox.
    in_flight_frames: AtomicU64,
    /// Free frames this heap last advertised; read by peers choosing whom to ask.
    free_hint: AtomicU64,
}

struct HeapState {
    id: usize,
    owned: DenseBuddy,
    foreign: SparseBuddy,
    est_share: u64,
    low: u64,
    high: u64,
    ops: u64,
    pending_since: Option<u64>,
    backoff_ops: u64,
    next_borrow_op: u64,
    /// Per destination heap, blocks waiting to be sent home in one message.
    outbox: Vec<Vec<(FrameNo, u32)>>,
    /// Frames in `outbox`.
    outbox_frames: u64,
    counters: HeapStats,
}

impl HeapState {
    #[inline]
    fn free_frames(&self) -> u64 {
        self.owned.free_frames() + self.foreign.free_frames()
    }

    #[inline]
    fn take(&mut self, order: u32) -> Option<FrameNo> {
        if self.foreign.free_frames() != 0 {
            if let Some(f) = self.foreign.alloc(order) {
                return Some(f);
            }
        }
        self.owned.alloc(order)
    }

    fn largest_free_order(&self) -> Option<u32> {
        self.owned
            .largest_free_order()
            .max(self.foreign.largest_free_order())
    }

    /// Add a free block, owned or foreign.
    #[inline]
    fn put(&mut self, frame: FrameNo, order: u32) {
        if self.owned.contains(frame) {
            self.owned.free(frame, order);
        } else {
            self.foreign.free(frame, order);
        }
    }

    fn borrow_want(&self, order: u32) -> u64 {
        let mid = (self.low + self.high) / 2;
        mid.saturating_sub(self.free_frames()).max(1u64 << order)
    }

    /// Fold a sample of "free frames per heap" into the estimate (EWMA, 1/4).
    fn observe_share(&mut self, sample: u64, low_pm: u64, high_pm: u64) {
        self.est_share = (3 * self.est_share + sample) / 4;
        self.set_thresholds(low_pm, high_pm);
    }

    fn set_thresholds(&mut self, low_pm: u64, high_pm: u64) {
        self.low = self.est_share * low_pm / 1000;
        self.high = (self.est_share * high_pm / 1000).max(self.low + 1);
        self.counters.low_watermark = self.low;
        self.counters.high_watermark = self.high;
        self.counters.est_share = self.est_share;
    }
}

/// The distributed buddy allocator.
pub struct DistributedBuddy {
    heaps: Box<[CachePadded<Heap>]>,
    frames: u64,
    max_order: u32,
    /// Owner heap of each `2^max_order` chunk.
    chunk_owner: Box<[u32]>,
    /// Owned range `[lo, hi)` of each heap.
    owned_range: Box<[(FrameNo, FrameNo)]>,
    check: Option<AllocTable>,
    low_pm: u64,
    high_pm: u64,
    oom_rounds: u32,
}

impl DistributedBuddy {
    /// Build a fleet over frames `0..frames`.
    pub fn new(frames: u64, config: &BuddyConfig) -> Result<Self, ConfigError> {
        let n = config.heaps_or_cpus();
        if n == 0 || n > u32::MAX as usize {
            return Err(ConfigError::Heaps(n));
        }
        let max_order = config.resolve_max_order(frames, n)?;
        let chunk = 1u64 << max_order;
        let chunks = frames.div_ceil(chunk);
        let mut chunk_owner = Vec::with_capacity(chunks as usize);
        let mut owned_range = Vec::with_capacity(n);
        for i in 0..n as u64 {
            let (c0, c1) = (i * chunks / n as u64, (i + 1) * chunks / n as u64);
            chunk_owner.extend((c0..c1).map(|_| i as u32));
            owned_range.push(((c0 * chunk).min(frames), (c1 * chunk).min(frames)));
        }
        let share = frames / n as u64;
        let heaps = owned_range
            .iter()
            .enumerate()
            .map(|(id, &(lo, hi))| {
                let owned = DenseBuddy::new_free(lo, hi - lo, max_order);
                let mut st = HeapState {
                    id,
                    foreign: SparseBuddy::new(max_order),
                    est_share: share,
                    low: 0,
                    high: 0,
                    ops: 0,
                    pending_since: None,
                    backoff_ops: INITIAL_BACKOFF_OPS,
                    next_borrow_op: 0,
                    outbox: (0..n).map(|_| Vec::new()).collect(),
                    outbox_frames: 0,
                    counters: HeapStats {
                        heap: id,
                        owned_frames: hi - lo,
                        ..Default::default()
                    },
                    owned,
                };
                st.set_thresholds(
                    config.low_watermark_permille,
                    config.high_watermark_permille,
                );
                CachePadded::new(Heap {
                    free_hint: AtomicU64::new(st.free_frames()),
                    state: Mutex::new(st),
                    inbox: SegQueue::new(),
                    in_flight_frames: AtomicU64::new(0),
                })
            })
            .collect();
        Ok(DistributedBuddy {
            heaps,
            frames,
            max_order,
            chunk_owner: chunk_owner.into_boxed_slice(),
            owned_range: owned_range.into_boxed_slice(),
            check: config
                .check_frees
                .then(|| AllocTable::new(frames, max_order)),
            low_pm: config.low_watermark_permille,
            high_pm: config.high_watermark_permille,
            oom_rounds: config.oom_rounds.max(1),
        })
    }

    /// The heap that owns `frame`.
    #[inline]
    pub fn owner_of(&self, frame: FrameNo) -> usize {
        self.chunk_owner[(frame >> self.max_order) as usize] as usize
    }

    /// The frames `[lo, hi)` heap `heap` owns.
    pub fn owned_range(&self, heap: usize) -> (FrameNo, FrameNo) {
        self.owned_range[heap]
    }

    fn send(&self, to: usize, msg: Msg) {
        let frames = match &msg {
            Msg::Free { blocks } | Msg::Grant { blocks, .. } => {
                blocks.iter().map(|&(_, k)| 1u64 << k).sum()
            }
            Msg::BorrowRequest { .. } => 0,
        };
        let heap = &self.heaps[to];
        heap.in_flight_frames.fetch_add(frames, Ordering::Relaxed);
        heap.inbox.push(msg);
    }

    /// Handle every queued message of heap `st.id` (its lock is held).
    fn drain(&self, st: &mut HeapState) {
        let heap = &self.heaps[st.id];
        while let Some(msg) = heap.inbox.pop() {
            match msg {
                Msg::Free { blocks } => {
                    let frames: u64 = blocks.iter().map(|&(_, k)| 1u64 << k).sum();
                    heap.in_flight_frames.fetch_sub(frames, Ordering::Relaxed);
                    for (f, k) in blocks {
                        st.put(f, k);
                    }
                }
                Msg::BorrowRequest {
                    from,
                    want,
                    requester_free,
                } => {
                    let blocks = self.lend(st, from, want, 0, false);
                    let sample = (st.free_frames() + requester_free) / 2;
                    st.observe_share(sample, self.low_pm, self.high_pm);
                    self.send(
                        from,
                        Msg::Grant {
                            blocks,
                            lender_free: st.free_frames(),
                        },
                    );
                }
                Msg::Grant {
                    blocks,
                    lender_free,
                } => {
                    let frames: u64 = blocks.iter().map(|&(_, k)| 1u64 << k).sum();
                    heap.in_flight_frames.fetch_sub(frames, Ordering::Relaxed);
                    st.pending_since = None;
                    self.accept_grant(st, blocks, lender_free);
                }
            }
        }
    }

    /// Add a grant's blocks to `st` and adapt backoff and thresholds.
    fn accept_grant(&self, st: &mut HeapState, blocks: Vec<(FrameNo, u32)>, lender_free: u64) {
        let frames: u64 = blocks.iter().map(|&(_, k)| 1u64 << k).sum();
        for (f, k) in blocks {
            st.put(f, k);
        }
        if frames == 0 {
            st.counters.borrow_failures += 1;
            st.backoff_ops = (st.backoff_ops * 2).min(MAX_BACKOFF_OPS);
            st.next_borrow_op = st.ops + st.backoff_ops;
        } else {
            st.counters.borrows += 1;
            st.counters.frames_borrowed += frames;
            st.backoff_ops = INITIAL_BACKOFF_OPS;
        }
        let sample = (st.free_frames() + lender_free) / 2;
        st.observe_share(sample, self.low_pm, self.high_pm);
    }

    /// The lender's side of a borrow: what heap `st.id` gives heap `to`.
    ///
    /// Blocks `to` owns always go (they are going home). Beyond that the
    /// lender gives up to `want` frames in large blocks, keeping at least
    /// half of its free frames and its low watermark. An `urgent` request
    /// (the requester is empty and a caller waits) gets one block of at least
    /// `min_order` even past those limits, if the lender has one.
    fn lend(
        &self,
        st: &mut HeapState,
        to: usize,
        want: u64,
        min_order: u32,
        urgent: bool,
    ) -> Vec<(FrameNo, u32)> {
        let (lo, hi) = self.owned_range[to];
        let mut out = if st.foreign.free_frames() != 0 {
            st.foreign.take_range(lo, hi)
        } else {
            Vec::new()
        };
        // Frees waiting to be forwarded to `to` go with the grant.
        let waiting = core::mem::take(&mut st.outbox[to]);
        st.outbox_frames -= waiting.iter().map(|&(_, k)| 1u64 << k).sum::<u64>();
        out.extend(waiting);
        // An urgent request gets its block first, before budget-sized
        // lending could split the only block large enough.
        if urgent && !out.iter().any(|&(_, k)| k >= min_order) {
            if let Some(f) = st.take(min_order) {
                out.push((f, min_order));
            }
        }
        let mut given: u64 = out.iter().map(|&(_, k)| 1u64 << k).sum();
        let free = st.free_frames();
        let budget = want
            .saturating_sub(given)
            .min(free / 2)
            .min(free.saturating_sub(st.low));
        let mut lent = 0u64;
        while lent < budget {
            let room = budget - lent;
            let Some(largest) = st.largest_free_order() else {
                break;
            };
            let order = (63 - room.leading_zeros()).min(self.max_order).min(largest);
            let Some(f) = st.take(order) else { break };
            out.push((f, order));
            lent += 1u64 << order;
        }
        given += lent;
        st.counters.frames_lent += given;
        self.heaps[st.id]
            .free_hint
            .store(st.free_frames(), Ordering::Relaxed);
        out
    }

    /// Send foreign blocks home, largest first, until `st` holds at most `floor` free frames.
    fn return_foreign(&self, st: &mut HeapState, floor: u64) {
        while st.free_frames() > floor {
            let Some((f, k)) = st.foreign.pop_largest() else {
                break;
            };
            st.counters.frames_returned += 1u64 << k;
            self.queue_home(st, f, k);
        }
        self.flush_outbox(st);
    }

    /// Queue a block for its owner; send the batch once it is full.
    #[inline]
    fn queue_home(&self, st: &mut HeapState, frame: FrameNo, order: u32) {
        let owner = self.owner_of(frame);
        st.outbox[owner].push((frame, order));
        st.outbox_frames += 1u64 << order;
        if st.outbox[owner].len() >= FORWARD_BATCH_BLOCKS {
            self.flush_to(st, owner);
        }
    }

    fn flush_to(&self, st: &mut HeapState, owner: usize) {
        let blocks = core::mem::replace(
            &mut st.outbox[owner],
            Vec::with_capacity(FORWARD_BATCH_BLOCKS),
        );
        st.outbox_frames -= blocks.iter().map(|&(_, k)| 1u64 << k).sum::<u64>();
        self.send(owner, Msg::Free { blocks });
    }

    /// Send every non-empty outbox batch.
    fn flush_outbox(&self, st: &mut HeapState) {
        if st.outbox_frames == 0 {
            return;
        }
        for owner in 0..self.heaps.len() {
            if !st.outbox[owner].is_empty() {
                self.flush_to(st, owner);
            }
        }
    }

    /// Decide (under `st`'s lock) whether to post an asynchronous borrow
    /// request, and to whom. Records the request as pending.
    fn plan_borrow(&self, st: &mut HeapState) -> Option<(usize, u64, u64)> {
        if let Some(t) = st.pending_since {
            if st.ops.wrapping_sub(t) < PENDING_TIMEOUT_OPS {
                return None;
            }
        }
        if st.ops < st.next_borrow_op || self.heaps.len() < 2 {
            return None;
        }
        let (peer, hint) = self
            .heaps
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != st.id)
            .map(|(i, h)| (i, h.free_hint.load(Ordering::Relaxed)))
            .max_by_key(|&(_, hint)| hint)?;
        if hint == 0 {
            // Nobody advertises pages: count it as an empty grant.
            self.accept_grant(st, Vec::new(), 0);
            return None;
        }
        st.pending_since = Some(st.ops);
        Some((peer, st.borrow_want(0), st.free_frames()))
    }

    fn record_alloc(&self, f: FrameNo, order: u32) -> Result<FrameNo, AllocError> {
        if let Some(t) = &self.check {
            t.on_alloc(f, order)
                .expect("allocator handed out a live frame");
        }
        Ok(f)
    }

    /// Peers of `h`, most advertised free frames first.
    fn peers_by_hint(&self, h: usize) -> Vec<(usize, u64)> {
        let mut peers: Vec<(usize, u64)> = (0..self.heaps.len())
            .filter(|&i| i != h)
            .map(|i| (i, self.heaps[i].free_hint.load(Ordering::Relaxed)))
            .collect();
        peers.sort_by_key(|&(_, hint)| core::cmp::Reverse(hint));
        peers
    }

    /// The slow path: heap `h` cannot serve `order` from what it holds.
    fn alloc_slow(&self, h: usize, order: u32) -> Result<FrameNo, AllocError> {
        for round in 0..self.oom_rounds {
            let (want, my_free) = {
                let mut st = self.heaps[h].state.lock();
                self.drain(&mut st);
                self.flush_outbox(&mut st);
                if let Some(f) = st.take(order) {
                    st.counters.allocs += 1;
                    self.heaps[h]
                        .free_hint
                        .store(st.free_frames(), Ordering::Relaxed);
                    drop(st);
                    return self.record_alloc(f, order);
                }
                (st.borrow_want(order), st.free_frames())
            };
            for (peer, hint) in self.peers_by_hint(h) {
                if round == 0 && hint == 0 {
                    continue;
                }
                let (blocks, lender_free) = {
                    let mut ps = self.heaps[peer].state.lock();
                    self.drain(&mut ps);
                    let blocks = self.lend(&mut ps, h, want, order, true);
                    let sample = (ps.free_frames() + my_free) / 2;
                    ps.observe_share(sample, self.low_pm, self.high_pm);
                    (blocks, ps.free_frames())
                };
                // Draining the peer may have answered an earlier
                // asynchronous request of ours: drain our inbox too.
                if blocks.is_empty() && self.heaps[h].inbox.is_empty() {
                    continue;
                }
                let mut st = self.heaps[h].state.lock();
                self.drain(&mut st);
                if !blocks.is_empty() {
                    self.accept_grant(&mut st, blocks, lender_free);
                }
                if let Some(f) = st.take(order) {
                    st.counters.allocs += 1;
                    self.heaps[h]
                        .free_hint
                        .store(st.free_frames(), Ordering::Relaxed);
                    drop(st);
                    return self.record_alloc(f, order);
                }
            }
            if round + 1 < self.oom_rounds {
                // Free memory may exist only as pieces split across heaps:
                // send every foreign block home so owners can coalesce it.
                self.send_all_home();
                for _ in 0..OOM_BACKOFF_BASE_SPINS << round {
                    core::hint::spin_loop();
                }
            }
        }
        let mut st = self.heaps[h].state.lock();
        self.accept_grant(&mut st, Vec::new(), 0);
        Err(AllocError::OutOfMemory { order })
    }

    /// Every heap drains its inbox and sends all its foreign blocks home.
    /// Returns true if anything moved.
    fn send_all_home(&self) -> bool {
        let mut moved = false;
        for heap in self.heaps.iter() {
            let mut st = heap.state.lock();
            self.drain(&mut st);
            if st.foreign.free_frames() != 0 || st.outbox_frames != 0 {
                moved = true;
                self.return_foreign(&mut st, 0);
            }
            heap.free_hint.store(st.free_frames(), Ordering::Relaxed);
        }
        moved
    }
}

impl FrameAllocator for DistributedBuddy {
    fn name(&self) -> &'static str {
        "distributed"
    }
    fn total_frames(&self) -> u64 {
        self.frames
    }
    fn max_order(&self) -> u32 {
        self.max_order
    }
    fn num_heaps(&self) -> usize {
        self.heaps.len()
    }

    fn alloc_on(&self, heap: usize, order: u32) -> Result<FrameNo, AllocError> {
        if order > self.max_order {
            return Err(AllocError::OrderTooLarge {
                order,
                max_order: self.max_order,
            });
        }
        let h = crate::heap_index(heap, self.heaps.len());
        let hp = &self.heaps[h];
        let mut st = hp.state.lock();
        st.ops += 1;
        if !hp.inbox.is_empty() {
            self.drain(&mut st);
        }
        let Some(f) = st.take(order) else {
            drop(st);
            return self.alloc_slow(h, order);
        };
        st.counters.allocs += 1;
        let free = st.free_frames();
        let plan = if free < st.low {
            self.plan_borrow(&mut st)
        } else {
            None
        };
        hp.free_hint.store(free, Ordering::Relaxed);
        drop(st);
        if let Some((peer, want, requester_free)) = plan {
            self.send(
                peer,
                Msg::BorrowRequest {
                    from: h,
                    want,
                    requester_free,
                },
            );
        }
        self.record_alloc(f, order)
    }

    fn free_on(&self, heap: usize, frame: FrameNo, order: u32) -> Result<(), FreeError> {
        validate_free(frame, order, self.frames, self.max_order)?;
        if let Some(t) = &self.check {
            t.on_free(frame, order)?;
        }
        let h = crate::heap_index(heap, self.heaps.len());
        let owner = self.owner_of(frame);
        let hp = &self.heaps[h];
        let mut st = hp.state.lock();
        st.ops += 1;
        st.counters.frees += 1;
        if !hp.inbox.is_empty() {
            self.drain(&mut st);
        }
        if owner == h {
            st.owned.free(frame, order);
        } else if st.free_frames() >= st.high {
            // Forward to the owner, batched: the caller does not wait.
            st.counters.forwarded_frees += 1;
            self.queue_home(&mut st, frame, order);
            return Ok(());
        } else {
            st.foreign.free(frame, order);
        }
        if st.foreign.free_frames() != 0 {
            if st.free_frames() > st.high {
                let high = st.high;
                self.return_foreign(&mut st, high);
            } else if st.ops.is_multiple_of(MAINTENANCE_INTERVAL_OPS) {
                let mid = (st.low + st.high) / 2;
                self.return_foreign(&mut st, mid);
            }
        }
        if st.outbox_frames != 0 && st.ops.is_multiple_of(MAINTENANCE_INTERVAL_OPS) {
            self.flush_outbox(&mut st);
        }
        hp.free_hint.store(st.free_frames(), Ordering::Relaxed);
        Ok(())
    }

    fn split(&self, frame: FrameNo, order: u32, into_order: u32) -> Result<(), FreeError> {
        crate::split_checked(
            self.check.as_ref(),
            (frame, order, into_order),
            self.frames,
            self.max_order,
        )
    }

    fn stats(&self) -> Stats {
        let mut s = Stats {
            allocator: self.name(),
            total_frames: self.frames,
            max_order: self.max_order,
            metadata_bytes: self.check.as_ref().map_or(0, |t| t.metadata_bytes())
                + self.chunk_owner.len() as u64 * 4,
            ..Default::default()
        };
        let mut holders = Vec::with_capacity(self.heaps.len());
        for heap in self.heaps.iter() {
            let st = heap.state.lock();
            let mut hs = st.counters.clone();
            hs.free_owned_frames = st.owned.free_frames();
            hs.free_foreign_frames = st.foreign.free_frames();
            hs.largest_free_order = st.largest_free_order();
            s.free_frames += st.free_frames();
            s.in_flight_frames += st.outbox_frames;
            s.metadata_bytes += st.owned.metadata_bytes() + st.foreign.metadata_bytes();
            holders.push(
                st.owned
                    .free_blocks()
                    .chain(st.foreign.free_blocks())
                    .collect(),
            );
            drop(st);
            s.in_flight_frames += heap.in_flight_frames.load(Ordering::Relaxed);
            s.heaps.push(hs);
        }
        summarize_blocks(&mut s, &holders);
        s
    }

    fn quiesce(&self) {
        for _ in 0..QUIESCE_MAX_PASSES {
            let moved = self.send_all_home();
            if !moved && self.heaps.iter().all(|h| h.inbox.is_empty()) {
                break;
            }
        }
    }
}
