//! Space for writers: when compaction runs, and what a write does when
//! the log is full (dissertation §4.4, "Scalable Asynchronous
//! Compaction").
//!
//! Compaction workers sleep until the client's free blocks fall below the
//! trigger; an append that crosses it wakes them. A write whose append
//! finds no blocks drops its epoch guard (so the segments compaction
//! retires can be freed), runs an idle worker's step itself, and retries.
//! It gives up with `OutOfMemory` only when compaction has nothing left
//! to do, has made no progress for a while, or the configured wait
//! (`Config::max_write_wait_ms`) is over ([`Inner::wait_for_space`]).
//! In cache mode the worker step a waiting writer runs also evicts
//! (`compaction::evict`), so a write waits only for that step. A
//! round's wait ends as soon as a segment is freed after the writer
//! began the round (it reads the count of frees before it helps), so
//! space that its own help or a worker frees meanwhile is taken at once
//! instead of a round (`APPEND_WAIT_ROUND_MS`) later. Every wait is
//! counted (`Stats::write_waits`, `write_wait_us`; INFO
//! `nibble_write_waits`, `nibble_write_wait_us`).
//! Also here: the prefetches that start a write's cache misses early.
use super::*;

/// Rounds (of `APPEND_WAIT_ROUND_MS`) a write waits for compaction to free
/// space, with no compaction progress, before reporting out of memory.
const APPEND_WAIT_ROUNDS: u32 = 50;
const APPEND_WAIT_ROUND_MS: u64 = 1;

impl Inner {
    pub(crate) fn should_compact(&self) -> bool {
        if self.force_compaction.load(Ordering::Acquire) {
            return true;
        }
        self.mem.client_blocks_free() < self.compaction_trigger_blocks
    }

    /// Free space is really short (below the compaction trigger), not
    /// just forced by `compact_now`, counting the blocks of retired
    /// segments the epoch is about to free: what lets cache mode evict.
    /// Without them a worker would evict segment after segment while the
    /// first ones wait for the epoch, and the cache would run half empty.
    pub(crate) fn space_short(&self) -> bool {
        self.mem.client_blocks_free() + self.stats.retiring_blocks.load(Ordering::Acquire)
            < self.compaction_trigger_blocks
    }

    pub(crate) fn sleep_worker(&self, d: Duration) {
        let mut g = self.wake.0.lock();
        let seen = *g;
        if !self.shutdown.load(Ordering::Acquire) {
            self.wake.1.wait_while_for(&mut g, |v| *v == seen, d);
        }
    }

    pub(super) fn wake_workers(&self) {
        *self.wake.0.lock() += 1;
        self.wake.1.notify_all();
    }

    pub(crate) fn notify_space(&self) {
        *self.space.0.lock() += 1;
        self.space.1.notify_all();
    }

    pub(super) fn wait_space(&self, d: Duration) {
        self.wait_space_since(self.space_seen(), d);
    }

    /// How many times space was freed (`notify_space`) so far: what
    /// [`Inner::wait_space_since`] waits for a change of.
    pub(super) fn space_seen(&self) -> u64 {
        *self.space.0.lock()
    }

    /// Wait up to `d` for space to be freed after the moment `seen` was
    /// read ([`Inner::space_seen`]); at once if it already was. A writer
    /// reads `seen` before it looks for space, so a segment freed
    /// between its look and its wait (by its own help, or by a worker)
    /// ends the wait instead of being missed.
    pub(super) fn wait_space_since(&self, seen: u64, d: Duration) {
        let mut g = self.space.0.lock();
        self.space.1.wait_while_for(&mut g, |v| *v == seen, d);
    }

    /// Prefetch where this CPU's next append of `len` bytes will go.
    #[inline]
    pub(super) fn prefetch_append(&self, len: usize) {
        let cpu = topology::current_cpu();
        let (node, head) = self.cpu_slot.get(cpu).copied().unwrap_or((0, cpu));
        self.logs[node].prefetch(&self.mem, head, len);
    }

    /// Prefetch, for writing, the first `len` bytes (up to the end of its
    /// block) of the object `hash`'s index entry probably points at: a
    /// hint read without the bucket lock, see [`Index::peek`]. False when
    /// no entry of the neighbourhood has the key's tag, i.e. the key is
    /// probably new (a hint too: a racing writer or resize can hide it).
    #[inline]
    pub(super) fn prefetch_old(&self, hash: u64, len: usize) -> bool {
        match self.index.peek(hash) {
            Some(l) => {
                self.mem.prefetch_for_write(off_of(l), len);
                true
            }
            None => false,
        }
    }

    /// Append an object to the local node's log (one attempt), within
    /// the clients' budget.
    pub(super) fn try_append(
        &self,
        len: usize,
        expiry_ms: u64,
        fill: &dyn Fn(u64),
    ) -> Result<crate::log::Appended, crate::memory::NoBlocks> {
        self.try_append_in(len, expiry_ms, false, fill)
    }

    /// Append as [`Inner::try_append`]; with `reserve`, the head may take
    /// blocks of the compaction reserve.
    pub(super) fn try_append_in(
        &self,
        len: usize,
        expiry_ms: u64,
        reserve: bool,
        fill: &dyn Fn(u64),
    ) -> Result<crate::log::Appended, crate::memory::NoBlocks> {
        let cpu = topology::current_cpu();
        let (node, head) = self.cpu_slot.get(cpu).copied().unwrap_or((0, cpu));
        let before = self.mem.client_blocks_free();
        let a =
            self.logs[node].append(&self.mem, &self.epochs, head, len, expiry_ms, reserve, fill)?;
        // An append that took blocks may make compaction due; the warm
        // cache may need the next region mapped in (`memory::ahead`).
        let took = before != self.mem.client_blocks_free();
        let compact = took && self.should_compact();
        let map = self.cfg.map_ahead && self.mem.request_map_ahead(took);
        if map {
            // Busy again: the woken worker must not take the store for
            // idle (and release what it maps) before it sees an operation.
            self.last_busy_ms
                .fetch_max(crate::object::now_ms(), Ordering::Relaxed);
        }
        if compact || map {
            self.wake_workers();
        }
        Ok(a)
    }

    /// Whether a relocation that only adds an expiry slot
    /// (`Store::set_expiry`) may take `len` more bytes from the compaction
    /// reserve, and if so, count them. Such relocations together take at
    /// most half the reserve (rounded up, so at least one block) between
    /// two moments at which the clients' budget is within its limit
    /// (compaction freed what they borrowed): the rest stays for
    /// compaction, which frees the dead originals they leave behind. Each
    /// relocation counts the blocks its object spans, whether or not its
    /// head needed new ones.
    pub(super) fn expiry_may_use_reserve(&self, len: usize) -> bool {
        let mem = &self.mem;
        if mem.blocks_in_use() <= mem.blocks_total() - mem.reserve_blocks() {
            self.expiry_reserve_blocks.store(0, Ordering::Relaxed);
        }
        let need = (len as u64).div_ceil(crate::memory::BLOCK_BYTES as u64);
        let share = mem.reserve_blocks().div_ceil(2);
        self.expiry_reserve_blocks
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |taken| {
                (taken + need <= share).then_some(taken + need)
            })
            .is_ok()
    }

    /// The store is known to be full: a write was refused for want of log
    /// space, no segment has been freed since, free blocks are short of a
    /// segment, and the store does not evict. Then a write is refused at
    /// once, at the cost of an ordinary one, instead of waiting for the
    /// compaction that just found nothing to do (a refusal used to cost a
    /// millisecond or more of helping and waiting). Any freed segment
    /// (compaction, an expiry), a delete or an overwrite ends it.
    pub(super) fn known_full(&self) -> bool {
        let r = self.stats.refused_at.load(Ordering::Acquire);
        r != 0
            && r == self.stats.segments_freed.load(Ordering::Acquire) + 1
            && self.mem.client_blocks_free() <= self.segment_blocks as u64
            && !self.eviction().evicts()
    }

    /// Space became reclaimable (a delete, or an overwrite that left a
    /// dead version): the next full write helps compaction again instead
    /// of being refused at once. A load of a read-mostly line; the store
    /// only when the store was known full.
    #[inline]
    pub(crate) fn note_reclaimable(&self) {
        if self.stats.refused_at.load(Ordering::Relaxed) != 0 {
            self.stats.refused_at.store(0, Ordering::Release);
        }
    }

    /// Wait for compaction to free space after a failed append. The caller
    /// must not hold an epoch guard: segments retired by compaction are
    /// freed only once every guard older than `w`'s start is gone.
    /// `Err` once compaction has finished a pass, begun after the wait
    /// started, that found nothing to do, after `APPEND_WAIT_ROUNDS` rounds
    /// in which compaction neither progressed nor was busy, or after the
    /// bounded wait.
    pub(super) fn wait_for_space(&self, w: &mut SpaceWait) -> Result<(), Error> {
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
        // A store that may evict any item always can make room: only the
        // time bound ends its wait (a pass that found nothing, or rounds
        // without progress, are victims still waiting for the epoch or
        // workers starved of CPU, not a full store).
        let e = self.eviction();
        let can_always_evict = e.evicts() && !e.volatile_only;
        if w.start.elapsed() >= Duration::from_millis(self.cfg.max_write_wait_ms)
            || (!can_always_evict
                && ((w.stalled >= APPEND_WAIT_ROUNDS.min(max_rounds) && !progressed)
                    || (round > 1 && gave_up)))
        {
            let freed = self.stats.segments_freed.load(Ordering::Acquire);
            self.stats.refused_at.store(freed + 1, Ordering::Release);
            return Err(Error::OutOfMemory { what: "log" });
        }
        // Read before helping: a segment freed from here on (by this
        // writer's own help, which frees the retired segments the epoch
        // has passed, or by a worker's pass meanwhile) ends the wait
        // below at once instead of a round later.
        let seen = self.space_seen();
        self.wake_workers();
        let cpu = topology::current_cpu();
        let node = self.cpu_slot.get(cpu).map_or(0, |&(n, _)| n);
        let helped = crate::compaction::help(self, node);
        w.last_idle = helped == crate::compaction::Help::Idle;
        match helped {
            crate::compaction::Help::Progress => {}
            crate::compaction::Help::Idle => {
                w.stalled += 1;
                self.wait_space_since(seen, Duration::from_millis(APPEND_WAIT_ROUND_MS));
            }
            crate::compaction::Help::Busy => {
                // Every worker is inside a pass (a pass over sparse
                // segments takes tens of milliseconds at 10 %
                // utilization): space is coming, so this round does not
                // count as one without progress.
                self.wait_space_since(seen, Duration::from_millis(APPEND_WAIT_ROUND_MS));
            }
        }
        Ok(())
    }
}

/// A write's wait for space (see `Inner::wait_for_space`). Counted in
/// the statistics (`write_waits`, `write_wait_us`) when dropped.
pub(super) struct SpaceWait<'s> {
    inner: &'s Inner,
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

impl<'s> SpaceWait<'s> {
    /// A wait that starts now.
    pub(super) fn new(inner: &'s Inner) -> SpaceWait<'s> {
        SpaceWait {
            inner,
            rounds: 0,
            start: std::time::Instant::now(),
            stalled: 0,
            last_idle: false,
            since_pass: inner.stats.passes.load(Ordering::Acquire),
            since_compacted: inner.stats.segments_compacted.load(Ordering::Acquire),
        }
    }
}

impl Drop for SpaceWait<'_> {
    fn drop(&mut self) {
        let c = &self.inner.stats;
        c.write_waits.fetch_add(1, Ordering::Relaxed);
        c.write_wait_us
            .fetch_add(self.start.elapsed().as_micros() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use crate::store::{Config, Store};
    use std::time::{Duration, Instant};

    /// A segment freed after a writer looked for space, but before it
    /// began to wait, ends the wait at once: the writer reads the count
    /// before it looks (and helps), so the notice is not lost and the
    /// writer does not sleep a whole round with space free.
    #[test]
    fn space_freed_before_the_wait_ends_it_at_once() {
        let s = Store::new(Config::new(crate::MIN_CAPACITY_BYTES)).expect("store");
        let inner = &*s.inner;
        let seen = inner.space_seen();
        inner.notify_space();
        let t = Instant::now();
        inner.wait_space_since(seen, Duration::from_secs(10));
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "waited {:?} for space freed before the wait",
            t.elapsed()
        );
        // Nothing freed since `seen`: the wait runs to its bound (or an
        // unrelated notice from a worker).
        let seen = inner.space_seen();
        let t = Instant::now();
        inner.wait_space_since(seen, Duration::from_millis(20));
        assert!(
            t.elapsed() >= Duration::from_millis(20) || inner.space_seen() != seen,
            "returned after {:?} with nothing freed",
            t.elapsed()
        );
    }
}
