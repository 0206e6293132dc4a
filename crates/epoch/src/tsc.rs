//! The epoch table of dissertation §4.5: one cache-line slot per thread
//! holding the timestamp at which that thread's current operation started,
//! or 0 when it is quiescent.
//!
//! ```text
//!   slot:   [ stamp | depth | in_use ]  one CachePadded line each
//!   pin:    stamp = clock.stamp(); fence(SeqCst)        (outermost pin only)
//!   unpin:  stamp = 0 (Release)                         (outermost unpin only)
//!   retire: T = fence(SeqCst); clock.stamp_ordered()
//!   reuse:  fence(SeqCst); every slot below the high-water mark is 0 or > T
//! ```
//!
//! Slots are claimed by a CAS on `in_use`, lowest index first, so the
//! high-water mark (how far a scan must look) tracks the peak number of
//! simultaneously registered threads rather than the capacity. A thread
//! claims its slot on its first [`pin`](crate::EpochScheme::pin) on a table
//! and keeps it in a thread-local registry, keyed by a table id that is
//! never reused, until it exits; the registry's destructor then frees the
//! slot for the next thread (at OS-thread exit: after `JoinHandle::join`,
//! but possibly not yet when `std::thread::scope` returns, since its
//! implicit join does not wait for thread-local destructors). A pin
//! looks up the registry only when the thread's last pin was on another
//! table: a one-entry thread-local cache (`LAST_SLOT`) holds the last
//! table id and slot, so the usual pin (one store per process) is a
//! compare of that id, a TSC read, a store and the fence (the registry's
//! borrow and search cost about 40 instructions, as much as the rest of
//! the pin).
//! [`TscEpochs::register`] is the explicit
//! alternative: a handle owning a slot, for callers that want no
//! thread-local lookup per operation (and for the loom model, whose threads
//! share one OS thread).
//!
//! The table has a fixed capacity, allocated up front (1024 slots of 128
//! bytes by default: 128 KiB); it never grows and never needs `unsafe`. When
//! every slot is owned, [`try_pin`](crate::EpochScheme::try_pin) returns
//! [`EpochError::TableFull`] and `pin` panics saying so.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

use crossbeam_utils::CachePadded;

use crate::clock::{Clock, TscClock};
use crate::sync::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use crate::{EpochError, EpochScheme, Guard};

/// Slots in a table built by [`TscEpochs::new`].
pub const DEFAULT_CAPACITY_SLOTS: usize = 1024;

/// A slot stamp meaning "no operation in progress".
pub const QUIESCENT_STAMP: u64 = 0;

/// Ids for tables, never reused, so a thread-local registration left behind
/// by a dropped table can never be mistaken for one of a new table.
static NEXT_TABLE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Configuration of a [`TscEpochs`] table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscConfig {
    /// Number of slots: the most threads (plus handles) that can be
    /// registered at once. Must be at least 1.
    pub capacity_slots: usize,
    /// Added to every retirement stamp ([`EpochScheme::now`]): the largest
    /// TSC difference between cores, for machines whose TSCs are not
    /// perfectly synchronised (§4.6 suggests measuring it and adding it at
    /// each comparison). 0 on a machine the kernel trusts.
    pub skew_margin_ticks: u64,
}

impl Default for TscConfig {
    fn default() -> Self {
        TscConfig {
            capacity_slots: DEFAULT_CAPACITY_SLOTS,
            skew_margin_ticks: 0,
        }
    }
}

/// One thread's entry in the table.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Start stamp of the owner's outermost active operation, or 0.
    stamp: AtomicU64,
    /// Nesting depth of the owner's guards. Written only by the owner
    /// thread; atomic only so the slot is `Sync`.
    depth: AtomicU32,
    /// Owned by some thread or handle.
    in_use: AtomicBool,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            stamp: AtomicU64::new(QUIESCENT_STAMP),
            depth: AtomicU32::new(0),
            in_use: AtomicBool::new(false),
        }
    }

    /// Starts an operation (outermost) or nests in the current one.
    #[inline]
    fn enter(&self, clock: &impl Clock) {
        let depth = self.depth.load(Ordering::Relaxed);
        if depth == 0 {
            // Release: a scanner that reads this stamp (with Acquire) also
            // sees everything the previous operation of this slot did, even
            // though it missed that operation's clearing store.
            self.stamp.store(clock.stamp(), Ordering::Release);
            // The store must be visible before this operation loads any
            // shared pointer: a store->load order, which only a SeqCst fence
            // gives (see the essay in lib.rs).
            fence(Ordering::SeqCst);
        }
        let deeper = depth
            .checked_add(1)
            .expect("epoch guard nesting depth overflowed u32");
        self.depth.store(deeper, Ordering::Relaxed);
    }

    /// Ends the innermost guard; clears the stamp when it was the outermost.
    #[inline]
    pub(crate) fn exit(&self) {
        let depth = self.depth.load(Ordering::Relaxed);
        debug_assert!(depth > 0, "epoch slot unpinned more often than pinned");
        let shallower = depth.saturating_sub(1);
        self.depth.store(shallower, Ordering::Relaxed);
        if shallower == 0 {
            // Release: the operation's reads happen before a reclaimer that
            // reads this 0 (with Acquire) frees anything.
            self.stamp.store(QUIESCENT_STAMP, Ordering::Release);
        }
    }

    /// Gives the slot back to the table.
    pub(crate) fn release(&self) {
        self.stamp.store(QUIESCENT_STAMP, Ordering::Release);
        self.depth.store(0, Ordering::Relaxed);
        self.in_use.store(false, Ordering::Release);
    }
}

/// The shared part of a [`TscEpochs`]: kept in an `Arc` so that exiting
/// threads can find it (through a `Weak`) to free their slots.
#[derive(Debug)]
struct Table<C> {
    id: u64,
    slots: Box<[CachePadded<Slot>]>,
    /// One past the highest slot index ever claimed; scans stop here.
    high_water: AtomicUsize,
    clock: C,
    skew_margin_ticks: u64,
}

impl<C: Clock> Table<C> {
    fn claim(&self) -> Result<usize, EpochError> {
        for (index, slot) in self.slots.iter().enumerate() {
            if slot.in_use.load(Ordering::Relaxed) {
                continue;
            }
            // Acquire: see the previous owner's release of the slot.
            if slot
                .in_use
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                // Sequenced before this thread's first pin fence, so a
                // scan that must see the pin also sees the new mark.
                self.high_water.fetch_max(index + 1, Ordering::Release);
                return Ok(index);
            }
        }
        Err(EpochError::TableFull {
            capacity_slots: self.slots.len(),
        })
    }

    #[inline]
    fn pin_slot(&self, index: usize, release_on_unpin: bool) -> Guard<'_> {
        let slot: &Slot = &self.slots[index];
        slot.enter(&self.clock);
        Guard::slot(slot, release_on_unpin)
    }

    /// Calls `visit` with every non-quiescent stamp until it returns false.
    /// Returns false if `visit` did.
    fn scan(&self, mut visit: impl FnMut(u64) -> bool) -> bool {
        // Pairs with the fence in `Slot::enter`: either this scan sees a
        // slot's stamp, or that operation sees what this thread unlinked.
        fence(Ordering::SeqCst);
        let end = self.high_water.load(Ordering::Acquire);
        self.slots[..end].iter().all(|slot| {
            let stamp = slot.stamp.load(Ordering::Acquire);
            stamp == QUIESCENT_STAMP || visit(stamp)
        })
    }

    fn min_active(&self) -> Option<u64> {
        let mut min = None;
        self.scan(|stamp| {
            min = Some(min.map_or(stamp, |m: u64| m.min(stamp)));
            true
        });
        min
    }
}

/// How an exiting thread frees its slot in a table of any clock type.
trait ReleaseOnExit: Send + Sync {
    fn release_on_exit(&self, index: usize);
}

impl<C: Clock> ReleaseOnExit for Table<C> {
    fn release_on_exit(&self, index: usize) {
        let slot = &self.slots[index];
        // A guard still alive at thread exit (one kept in another
        // thread-local) will clear its stamp when it drops; handing the slot
        // to a new thread now would let that drop clear the new owner's
        // stamp. Keep the slot (it is lost for reuse, not for correctness).
        if slot.depth.load(Ordering::Relaxed) == 0 {
            slot.release();
        }
    }
}

struct Registration {
    table_id: u64,
    table: Weak<dyn ReleaseOnExit>,
    slot: usize,
}

/// This thread's slots, one per table it has pinned on.
struct Registry {
    entries: Vec<Registration>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        // The slots go back to their tables: forget the cached one first,
        // so that a pin from a later thread-local destructor borrows a slot
        // instead of using one that another thread may now own.
        // `try_with`: the cache may already be gone on some platforms.
        let _ = LAST_SLOT.try_with(|last| last.set(NO_CACHED_SLOT));
        for entry in self.entries.drain(..) {
            if let Some(table) = entry.table.upgrade() {
                table.release_on_exit(entry.slot);
            }
        }
    }
}

thread_local! {
    static REGISTRY: RefCell<Registry> = const { RefCell::new(Registry { entries: Vec::new() }) };
    /// The (table id, slot) of this thread's latest registry lookup: a pin
    /// on the same table (the usual case: one store per process) reads this
    /// one cell instead of borrowing the registry and searching it. Valid
    /// while the registry entry lives, i.e. until the registry's destructor,
    /// which resets it; table ids are never reused, so an entry of a
    /// dropped table never matches a live one.
    static LAST_SLOT: Cell<(u64, usize)> = const { Cell::new(NO_CACHED_SLOT) };
}

/// [`LAST_SLOT`] when it caches nothing (table ids start at 1).
const NO_CACHED_SLOT: (u64, usize) = (0, 0);

/// The distributed hardware epoch table (dissertation §4.5).
///
/// Each registered thread owns one cache-line slot; `pin` writes the clock
/// (by default the TSC) into it, unpin writes 0, and a retirement at `T` is
/// safe to reuse once every non-zero slot is greater than `T`. Operations
/// touch only their own line; only reclamation reads everybody's.
///
/// `C` is the timestamp source, [`TscClock`] unless a test injects a
/// [`LogicalClock`](crate::LogicalClock).
#[derive(Debug)]
pub struct TscEpochs<C: Clock = TscClock> {
    table: Arc<Table<C>>,
}

impl TscEpochs<TscClock> {
    /// A table of [`DEFAULT_CAPACITY_SLOTS`] slots on the TSC.
    pub fn new() -> Self {
        TscEpochs::with_config(TscConfig::default())
    }

    /// A table of `capacity_slots` slots on the TSC.
    pub fn with_capacity(capacity_slots: usize) -> Self {
        TscEpochs::with_config(TscConfig {
            capacity_slots,
            ..TscConfig::default()
        })
    }

    /// A table on the TSC with the given configuration.
    pub fn with_config(config: TscConfig) -> Self {
        TscEpochs::with_clock(config, TscClock)
    }
}

impl Default for TscEpochs<TscClock> {
    fn default() -> Self {
        TscEpochs::new()
    }
}

impl<C: Clock> TscEpochs<C> {
    /// A table reading timestamps from `clock`.
    ///
    /// # Panics
    /// If `config.capacity_slots` is 0.
    pub fn with_clock(config: TscConfig, clock: C) -> Self {
        assert!(
            config.capacity_slots > 0,
            "an epoch table needs at least one slot"
        );
        let slots = (0..config.capacity_slots)
            .map(|_| CachePadded::new(Slot::new()))
            .collect();
        TscEpochs {
            table: Arc::new(Table {
                id: NEXT_TABLE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                slots,
                high_water: AtomicUsize::new(0),
                clock,
                skew_margin_ticks: config.skew_margin_ticks,
            }),
        }
    }

    /// The timestamp source.
    pub fn clock(&self) -> &C {
        &self.table.clock
    }

    /// Number of slots.
    pub fn capacity_slots(&self) -> usize {
        self.table.slots.len()
    }

    /// One past the highest slot index ever claimed: how far scans look.
    pub fn high_water_slots(&self) -> usize {
        self.table.high_water.load(Ordering::Acquire)
    }

    /// Slots currently owned by a thread or a handle (a snapshot).
    pub fn slots_in_use(&self) -> usize {
        self.table
            .slots
            .iter()
            .filter(|slot| slot.in_use.load(Ordering::Acquire))
            .count()
    }

    /// The oldest start stamp among operations in progress, or `None` if
    /// every thread is quiescent. Anything retired before it is reusable.
    pub fn min_active(&self) -> Option<u64> {
        self.table.min_active()
    }

    /// Claims a slot for the caller, outside the thread-local registry.
    /// Pins through the handle skip the registry lookup; dropping it frees
    /// the slot.
    pub fn register(&self) -> Result<LocalHandle<'_, C>, EpochError> {
        let index = self.table.claim()?;
        Ok(LocalHandle {
            table: &self.table,
            index,
            _not_send: PhantomData,
        })
    }

    /// This thread's registered slot in this table, claiming one on first
    /// use. `Ok(None)` when the registry is unavailable (the thread is
    /// running thread-local destructors).
    #[inline]
    fn registered_slot(&self) -> Result<Option<usize>, EpochError> {
        let table_id = self.table.id;
        if let Ok((id, slot)) = LAST_SLOT.try_with(Cell::get) {
            if id == table_id {
                return Ok(Some(slot));
            }
        }
        self.registered_slot_slow(table_id)
    }

    /// [`registered_slot`](Self::registered_slot) through the registry,
    /// claiming a slot on first use; caches the answer in [`LAST_SLOT`].
    #[inline(never)]
    fn registered_slot_slow(&self, table_id: u64) -> Result<Option<usize>, EpochError> {
        let lookup = REGISTRY.try_with(|registry| {
            let Ok(mut registry) = registry.try_borrow_mut() else {
                return Ok(None);
            };
            if let Some(entry) = registry.entries.iter().find(|e| e.table_id == table_id) {
                let _ = LAST_SLOT.try_with(|last| last.set((table_id, entry.slot)));
                return Ok(Some(entry.slot));
            }
            let slot = self.table.claim()?;
            // Forget tables that no longer exist before adding one.
            registry.entries.retain(|e| e.table.strong_count() > 0);
            let table: Arc<dyn ReleaseOnExit> = self.table.clone();
            registry.entries.push(Registration {
                table_id,
                table: Arc::downgrade(&table),
                slot,
            });
            let _ = LAST_SLOT.try_with(|last| last.set((table_id, slot)));
            Ok(Some(slot))
        });
        lookup.unwrap_or(Ok(None))
    }
}

impl<C: Clock> EpochScheme for TscEpochs<C> {
    fn name(&self) -> &'static str {
        crate::EpochKind::Tsc.name()
    }

    #[inline]
    fn try_pin(&self) -> Result<Guard<'_>, EpochError> {
        match self.registered_slot()? {
            Some(index) => Ok(self.table.pin_slot(index, false)),
            // No registry (thread-local destructors are running): borrow a
            // slot for just this guard.
            None => {
                let index = self.table.claim()?;
                Ok(self.table.pin_slot(index, true))
            }
        }
    }

    fn now(&self) -> u64 {
        self.table
            .clock
            .stamp_ordered()
            .saturating_add(self.table.skew_margin_ticks)
    }

    fn reclaim_bound(&self) -> u64 {
        self.table.min_active().unwrap_or(u64::MAX)
    }

    fn safe_to_reclaim(&self, retired_at: u64) -> bool {
        self.table.scan(|stamp| stamp > retired_at)
    }
}

/// A slot owned by one thread without the thread-local registry, from
/// [`TscEpochs::register`]. Not `Send`: the slot's nesting depth belongs to
/// one thread.
#[derive(Debug)]
pub struct LocalHandle<'a, C: Clock = TscClock> {
    table: &'a Table<C>,
    index: usize,
    _not_send: PhantomData<*const ()>,
}

impl<C: Clock> LocalHandle<'_, C> {
    /// Starts (or nests in) an operation on this handle's slot.
    pub fn pin(&self) -> Guard<'_> {
        self.table.pin_slot(self.index, false)
    }

    /// Index of the owned slot.
    pub fn slot_index(&self) -> usize {
        self.index
    }
}

impl<C: Clock> Drop for LocalHandle<'_, C> {
    fn drop(&mut self) {
        // Guards borrow the handle, so none is alive (a forgotten one never
        // unpins, and clearing its stamp here is what it would have done).
        self.table.slots[self.index].release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LogicalClock;
    use std::sync::Barrier;
    use std::thread;

    fn logical(capacity_slots: usize) -> TscEpochs<LogicalClock> {
        TscEpochs::with_clock(
            TscConfig {
                capacity_slots,
                ..TscConfig::default()
            },
            LogicalClock::new(),
        )
    }

    #[test]
    fn nested_pin_keeps_outer_stamp() {
        let epochs = logical(4);
        assert_eq!(epochs.min_active(), None);
        let outer = epochs.pin();
        let outer_stamp = epochs.min_active().expect("pinned");
        let _ = epochs.now(); // advance the logical clock
        {
            let _inner = epochs.pin();
            assert_eq!(epochs.min_active(), Some(outer_stamp));
            let _innermost = epochs.pin();
            assert_eq!(epochs.min_active(), Some(outer_stamp));
        }
        assert_eq!(epochs.min_active(), Some(outer_stamp), "outer still open");
        drop(outer);
        assert_eq!(epochs.min_active(), None);
        assert_eq!(epochs.slots_in_use(), 1, "slot stays registered");
    }

    #[test]
    fn retirement_waits_for_older_guard_only() {
        let epochs = logical(4);
        let guard = epochs.pin();
        let retired_at = epochs.now();
        assert!(!epochs.safe_to_reclaim(retired_at));
        assert!(epochs.reclaim_bound() <= retired_at);
        // An operation that starts after the retirement does not hold it up.
        let later = thread::scope(|s| {
            s.spawn(|| {
                let _g = epochs.pin();
                epochs.min_active()
            })
            .join()
            .unwrap()
        });
        assert!(later.is_some());
        drop(guard);
        assert!(epochs.safe_to_reclaim(retired_at));
        assert_eq!(epochs.reclaim_bound(), u64::MAX);
        let young = epochs.pin();
        assert!(epochs.safe_to_reclaim(retired_at), "young guard is later");
        assert!(!epochs.safe_to_reclaim(epochs.now()));
        drop(young);
    }

    #[test]
    fn tsc_clock_orders_pin_and_retire() {
        let epochs = TscEpochs::with_capacity(4);
        let guard = epochs.pin();
        let retired_at = epochs.now();
        assert!(!epochs.safe_to_reclaim(retired_at));
        drop(guard);
        assert!(epochs.safe_to_reclaim(retired_at));
        assert_eq!(epochs.name(), "tsc");
    }

    #[test]
    fn pins_alternating_between_tables_use_each_tables_slot() {
        // The thread-local cache holds one table's slot: pins that
        // alternate between tables (and a table dropped and replaced)
        // must each land in their own table's slot, never another's.
        let a = logical(4);
        let b = logical(4);
        for _ in 0..3 {
            let ga = a.pin();
            assert!(a.min_active().is_some());
            assert_eq!(b.min_active(), None, "a pin on a leaked into b");
            let gb = b.pin();
            drop(ga);
            assert_eq!(a.min_active(), None);
            assert!(b.min_active().is_some());
            drop(gb);
            assert_eq!(b.min_active(), None);
        }
        assert_eq!((a.slots_in_use(), b.slots_in_use()), (1, 1));
        drop(a);
        let c = logical(4);
        let gc = c.pin();
        assert!(c.min_active().is_some());
        assert_eq!(b.min_active(), None);
        drop(gc);
        assert_eq!(c.min_active(), None);
    }

    #[test]
    fn slots_are_released_at_thread_exit_and_reused() {
        const CAPACITY_SLOTS: usize = 4;
        let epochs = logical(CAPACITY_SLOTS);
        for _ in 0..3 * CAPACITY_SLOTS {
            thread::scope(|s| {
                // An explicit join waits for thread-local destructors; the
                // implicit join at the end of a scope does not.
                s.spawn(|| {
                    let guard = epochs.try_pin().expect("a free slot");
                    assert!(epochs.min_active().is_some());
                    drop(guard);
                })
                .join()
                .unwrap();
            });
            assert_eq!(epochs.slots_in_use(), 0, "exit released the slot");
        }
        assert_eq!(
            epochs.high_water_slots(),
            1,
            "sequential threads share slot 0"
        );
    }

    #[test]
    fn full_table_is_an_error_not_ub() {
        const CAPACITY_SLOTS: usize = 2;
        let epochs = logical(CAPACITY_SLOTS);
        let holding = Barrier::new(CAPACITY_SLOTS + 1);
        let done = Barrier::new(CAPACITY_SLOTS + 1);
        thread::scope(|s| {
            let holders: Vec<_> = (0..CAPACITY_SLOTS)
                .map(|_| {
                    s.spawn(|| {
                        let _g = epochs.pin();
                        holding.wait();
                        done.wait();
                    })
                })
                .collect();
            holding.wait();
            let overflow = s.spawn(|| epochs.try_pin().map(drop)).join().unwrap();
            assert_eq!(overflow, Err(EpochError::TableFull { capacity_slots: 2 }));
            let panic = s
                .spawn(|| drop(epochs.pin()))
                .join()
                .expect_err("pin must panic when full");
            let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(message.contains("full"), "unclear panic: {message}");
            assert!(epochs.register().is_err());
            done.wait();
            for holder in holders {
                holder.join().unwrap();
            }
        });
        assert_eq!(epochs.slots_in_use(), 0);
        assert!(epochs.try_pin().is_ok());
    }

    #[test]
    fn handle_owns_and_frees_a_slot() {
        let epochs = logical(2);
        let handle = epochs.register().unwrap();
        assert_eq!(epochs.slots_in_use(), 1);
        let g = handle.pin();
        let retired_at = epochs.now();
        {
            let _nested = handle.pin();
        }
        assert!(!epochs.safe_to_reclaim(retired_at));
        drop(g);
        assert!(epochs.safe_to_reclaim(retired_at));
        let index = handle.slot_index();
        drop(handle);
        assert_eq!(epochs.slots_in_use(), 0);
        assert_eq!(epochs.register().unwrap().slot_index(), index);
    }

    #[test]
    fn thread_outlives_a_table() {
        let first = logical(2);
        let second = logical(2);
        let _a = first.pin();
        drop(_a);
        drop(first);
        // The stale registration is pruned and does not confuse the new table.
        let _b = second.pin();
        assert!(second.min_active().is_some());
        REGISTRY.with(|r| assert_eq!(r.borrow().entries.len(), 1));
    }

    #[test]
    fn pin_inside_a_thread_local_destructor() {
        use std::sync::atomic::AtomicBool as StdBool;
        static PINNED_IN_DTOR: StdBool = StdBool::new(false);
        static EPOCHS: std::sync::LazyLock<TscEpochs<LogicalClock>> =
            std::sync::LazyLock::new(|| logical(2));
        struct PinOnDrop;
        impl Drop for PinOnDrop {
            fn drop(&mut self) {
                let ok = EPOCHS.try_pin().is_ok();
                PINNED_IN_DTOR.store(ok, std::sync::atomic::Ordering::SeqCst);
            }
        }
        thread_local! { static LATE: PinOnDrop = const { PinOnDrop }; }
        thread::spawn(|| {
            // Registered before the registry, so destroyed after it (LIFO):
            // the pin in its destructor takes the temporary-slot path.
            LATE.with(|_| ());
            drop(EPOCHS.pin());
        })
        .join()
        .unwrap();
        assert!(PINNED_IN_DTOR.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(EPOCHS.slots_in_use(), 0, "no slot leaked");
    }

    #[test]
    fn skew_margin_delays_reuse() {
        let epochs = TscEpochs::with_clock(
            TscConfig {
                capacity_slots: 2,
                skew_margin_ticks: 10,
            },
            LogicalClock::new(),
        );
        let retired_at = epochs.now();
        let _young = epochs.pin(); // stamp = retired_at - 10 + 1
        assert!(!epochs.safe_to_reclaim(retired_at));
    }
}
