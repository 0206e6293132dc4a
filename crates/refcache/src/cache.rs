//! Refcache (RadixVM §3.1, Figure 2): reference counts whose increments
//! and decrements touch only the calling thread's cache lines.
//!
//! Every object has a global count and a lock. Every thread (a core in the
//! paper) has a small direct-mapped *delta cache*: `inc`/`dec` add ±1 to
//! the entry for the object, evicting whatever other object hashed to that
//! slot first. Evicting applies the delta to the global count under the
//! object's lock. The global count is therefore never the true count; the
//! true count is the global count plus every cached delta. It is known to
//! be zero only after every cache has been flushed, which is what epochs
//! are for.
//!
//! An epoch ends when every thread has flushed its whole cache (zero
//! deltas too) at least once since it began: a flush barrier. When an
//! eviction brings an object's global count to zero, the object is put on
//! the evicting thread's *review queue*, stamped with the epoch. Two epoch
//! boundaries later every delta that was cached at that moment has reached
//! the global count, so the reviewer knows the true count, provided the
//! global count did not move in between. If it moved and came back to zero
//! (a *dirty zero*), the object goes round again:
//!
//! ```text
//!  epoch        4            5            6            7            8
//!  core 0   evict: 0 -> queue(4)     review: 0 but dirty -> queue(6)  review: 0, clean -> free
//!  core 1        inc (cached) ..flush: 1.. dec ..flush: 0 (dirty)
//!  global   0 ---------------1-----------0------------0------------0
//! ```
//!
//! Weak references: a word holding the object pointer and a *dying* bit.
//! The first time the global count reaches zero the bit is set; `try_get`
//! revives the object by clearing it (then increments as usual); a reviewer
//! frees the object only by swapping `<obj, dying>` for `<null>` in one
//! compare-and-swap, so whichever of `try_get` and the free clears the bit
//! first wins. A failed swap sends the object round again.
//!
//! What "preemption disabled" becomes here. In sv6 every function of
//! Figure 2 runs with preemption off, so a core cannot pass an epoch
//! boundary in the middle of one. Here each cache sits behind a lock that a
//! registered thread ([`Local`]) holds for as long as it is registered, so
//! its operations touch no shared line at all (one read of the global epoch
//! word, which changes once per epoch). A cache only this thread can flush,
//! and only between operations, cannot pass an epoch boundary in the middle
//! of one: while a thread is inside `try_get`, the global epoch advances at
//! most once, which is what makes reading the weak pointer and then
//! incrementing safe. The ticker flushes, on their behalf, the caches of
//! threads that have unregistered (their lock is free). The price: a thread
//! that stays registered but stops operating holds up the epochs (objects
//! are freed late, never early) until it calls [`Local::flush`] or drops
//! its `Local`; the kernel has the same rule ("each core calls flush
//! periodically"), enforced there by the timer interrupt.
//!
//! The fast path. An `inc` or `dec` whose object already owns its slot,
//! in a thread that has flushed since the current epoch began and whose
//! tick countdown has not run out, is: hash the address to a slot of the
//! thread's cache (a raw pointer and a mask kept in [`Local`], no lock
//! guard or `Vec` in between), compare the slot's object, read the global
//! epoch and compare it with a private copy of this cache's flush epoch,
//! add the delta, count down. About 20 instructions on memory no other
//! thread writes, inlined into the caller; everything else (a conflict, an
//! epoch to flush, a tick) goes to an out-of-line cold path.
//!
//! Epoch ticks come from [`Refcache::tick`], called by a background ticker
//! (`Ticker`, with `std`), by operations every
//! [`Config::ops_per_tick`] operations, or by hand.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::cell::{Cell, UnsafeCell};
use core::fmt;
use core::marker::PhantomData;
use core::ops::Deref;
use core::ptr::NonNull;

use crate::sync::{Arc, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};
use crate::CachePadded;

/// Delta-cache slots per thread. sv6 uses 4096 per core.
pub const DEFAULT_CACHE_SLOTS: usize = 4096;
/// Threads one domain can serve at once (registry capacity).
pub const DEFAULT_MAX_THREADS: usize = 64;
/// Operations by one thread between the epoch ticks it drives itself
/// (0: operations never tick; a [`Refcache::tick`] caller must).
pub const DEFAULT_OPS_PER_TICK: u64 = 1 << 16;
/// Passes over the registry `register` makes before deciding every core is
/// owned (a core may be held for a moment by a ticker).
pub const REGISTER_ATTEMPTS: usize = 1000;
/// Epoch boundaries between queueing an object and reviewing it (§3.1).
pub const REVIEW_DELAY_EPOCHS: u64 = 2;

const DYING_BIT: usize = 1;

/// Tunables of a [`Refcache`] domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Delta-cache slots per thread; rounded up to a power of two.
    pub cache_slots: usize,
    /// Most threads registered at once.
    pub max_threads: usize,
    /// Each thread calls [`Refcache::tick`] after this many of its own
    /// operations; 0 leaves ticking to a ticker or to the caller.
    pub ops_per_tick: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cache_slots: DEFAULT_CACHE_SLOTS,
            max_threads: DEFAULT_MAX_THREADS,
            ops_per_tick: DEFAULT_OPS_PER_TICK,
        }
    }
}

/// The per-object part: global count, lock, weak back-reference, and the
/// type-erased destructor. First field of every [`Counted`] allocation.
#[repr(C)]
struct Header {
    state: Mutex<ObjState>,
    weak: Option<Arc<WeakSlot>>,
    free: unsafe fn(NonNull<Header>),
}

struct ObjState {
    refcnt: i64,
    dirty: bool,
    queued: bool,
}

#[repr(C)]
struct Obj<T> {
    header: Header,
    on_free: Option<fn(T)>,
    value: T,
}

/// # Safety
/// `header` heads an `Obj<T>` made by `Box::into_raw`, no longer reachable
/// by anyone; called once.
unsafe fn free_obj<T>(header: NonNull<Header>) {
    // SAFETY: by the contract, the allocation is a live `Box<Obj<T>>`
    // (`Header` is its first field, `repr(C)`) owned by nobody else.
    let obj = unsafe { Box::from_raw(header.as_ptr().cast::<Obj<T>>()) };
    let Obj { on_free, value, .. } = *obj;
    match on_free {
        Some(callback) => callback(value),
        None => drop(value),
    }
}

/// A pointer to an object header, movable between threads with the cache
/// that holds it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct HeaderPtr(NonNull<Header>);

// SAFETY: a `HeaderPtr` is only dereferenced under the rules of this
// module (the object is live while some reference or queue entry stands
// for it), whichever thread holds it; headers are `Sync` (a lock and an
// immutable destructor pointer).
unsafe impl Send for HeaderPtr {}

impl HeaderPtr {
    fn header(&self) -> &Header {
        // SAFETY: a cached or queued header is live: the object is freed
        // only by `review`, after removing it from the queue, once it has
        // been unreachable for two epochs, by which time every cache has
        // been flushed and cleared of it.
        unsafe { self.0.as_ref() }
    }

    #[inline(always)]
    fn slot_index(self, mask: usize) -> usize {
        // Objects are at least 8-aligned; mix the upper bits in.
        let address = self.0.as_ptr() as usize >> 4;
        (address ^ (address >> 12)) & mask
    }
}

#[derive(Clone, Copy)]
struct Entry {
    object: Option<HeaderPtr>,
    delta: i64,
}

const EMPTY_ENTRY: Entry = Entry {
    object: None,
    delta: 0,
};

/// A thread's direct-mapped delta cache: a power-of-two array of entries
/// reached through a raw pointer, so that the owning [`Local`] can keep a
/// copy of the pointer for its fast path without borrowing the cache's
/// lock guard on every operation. Entries are touched only by whoever holds
/// the core's lock (the registered `Local`, or a ticker flushing an
/// unregistered core), one short-lived `&mut Entry` at a time.
struct DeltaCache {
    /// `len` entries from `Box::into_raw`; dangling when `len == 0`.
    slots: NonNull<Entry>,
    len: usize,
}

// SAFETY: the cache owns its entries (like the `Box` it was made from);
// moving it to another thread moves them. `Entry` is `Send`.
unsafe impl Send for DeltaCache {}

impl DeltaCache {
    const EMPTY: DeltaCache = DeltaCache {
        slots: NonNull::dangling(),
        len: 0,
    };

    fn new(len: usize) -> DeltaCache {
        let boxed: Box<[Entry]> = alloc::vec![EMPTY_ENTRY; len].into_boxed_slice();
        let slots = NonNull::from(Box::leak(boxed)).cast::<Entry>();
        DeltaCache { slots, len }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entry `index`, for as long as `self` is borrowed mutably.
    fn entry(&mut self, index: usize) -> &mut Entry {
        assert!(index < self.len);
        // SAFETY: in bounds (checked); `&mut self` means the caller holds
        // the core's lock and no other reference to the entry is live
        // (the fast path's references end before it returns).
        unsafe { &mut *self.slots.as_ptr().add(index) }
    }
}

impl Drop for DeltaCache {
    fn drop(&mut self) {
        if self.len != 0 {
            let slice = core::ptr::slice_from_raw_parts_mut(self.slots.as_ptr(), self.len);
            // SAFETY: `slots` and `len` came from `Box::leak` of a boxed
            // slice of exactly `len` entries in `new`, dropped only here.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

struct CoreState {
    cache: DeltaCache,
    review: Vec<(HeaderPtr, u64)>,
}

struct Core {
    /// Held by the registered thread's [`Local`] for its whole life.
    state: Mutex<CoreState>,
    /// The epoch of this cache's last complete flush.
    epoch: AtomicU64,
}

/// A Refcache domain: the epoch barrier and every thread's delta cache.
pub struct Refcache {
    global_epoch: CachePadded<AtomicU64>,
    /// Cores ever handed out: a prefix of `cores`.
    cores_in_use: CachePadded<AtomicUsize>,
    cores: Box<[CachePadded<Core>]>,
    config: Config,
    freed: CachePadded<AtomicU64>,
    /// Objects a review has taken off a queue to free but whose free has
    /// not finished (the free runs after the core's lock is dropped), so
    /// that `quiesce` does not report done in between.
    freeing: CachePadded<AtomicUsize>,
}

impl fmt::Debug for Refcache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refcache")
            .field("epoch", &self.epoch())
            .field("threads", &self.cores_in_use.load(Ordering::Relaxed))
            .field("freed", &self.objects_freed())
            .field("config", &self.config)
            .finish()
    }
}

impl Default for Refcache {
    fn default() -> Self {
        Refcache::new(Config::default())
    }
}

/// Objects whose review decided to free them, freed once no lock is held
/// (a destructor may itself drop references).
type FreeList = Vec<HeaderPtr>;

impl Refcache {
    /// A domain with `config`.
    pub fn new(config: Config) -> Refcache {
        let cache_slots = config.cache_slots.max(1).next_power_of_two();
        let max_threads = config.max_threads.max(1);
        let cores = (0..max_threads)
            .map(|_| {
                CachePadded::new(Core {
                    state: Mutex::new(CoreState {
                        cache: DeltaCache::EMPTY,
                        review: Vec::new(),
                    }),
                    epoch: AtomicU64::new(0),
                })
            })
            .collect();
        Refcache {
            global_epoch: CachePadded::new(AtomicU64::new(0)),
            cores_in_use: CachePadded::new(AtomicUsize::new(0)),
            cores,
            config: Config {
                cache_slots,
                max_threads,
                ..config
            },
            freed: CachePadded::new(AtomicU64::new(0)),
            freeing: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// The configuration in force (cache slots rounded up).
    pub fn config(&self) -> Config {
        self.config
    }

    /// The current global epoch.
    pub fn epoch(&self) -> u64 {
        self.global_epoch.load(Ordering::Acquire)
    }

    /// Objects freed so far.
    pub fn objects_freed(&self) -> u64 {
        self.freed.load(Ordering::Relaxed)
    }

    /// Bytes of Refcache state added to each object (the count, its lock,
    /// the review flags, the weak back-reference and the destructor).
    pub const BYTES_PER_OBJECT: usize = core::mem::size_of::<Header>();

    /// Registers the calling thread: its own delta cache and review queue.
    /// `None` when `max_threads` threads are registered already.
    pub fn register(&self) -> Option<Local<'_>> {
        for _ in 0..REGISTER_ATTEMPTS {
            if let Some(local) = self.try_register() {
                return Some(local);
            }
            // Every core was taken; one may only be held for a moment by
            // a ticker or a racing `register`.
            core::hint::spin_loop();
            #[cfg(loom)]
            loom::thread::yield_now();
        }
        None
    }

    fn try_register(&self) -> Option<Local<'_>> {
        // Reuse a released core first (its cache and queue carry over),
        // else claim a fresh one.
        let in_use = self.cores_in_use.load(Ordering::Acquire);
        for (index, core) in self.cores[..in_use].iter().enumerate() {
            if let Some(state) = core.state.try_lock() {
                // An empty cache is a fresh core a racing `register` has
                // claimed but not locked yet: leave it to that thread.
                if !state.cache.is_empty() {
                    return Some(self.local(index, state));
                }
            }
        }
        let mut index = self.cores_in_use.load(Ordering::Acquire);
        loop {
            if index >= self.cores.len() {
                return None;
            }
            match self.cores_in_use.compare_exchange(
                index,
                index + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => index = now,
            }
        }
        // A ticker may be flushing the (empty) fresh cache: wait for it.
        let mut state = self.cores[index].state.lock();
        if state.cache.is_empty() {
            state.cache = DeltaCache::new(self.config.cache_slots);
        }
        Some(self.local(index, state))
    }

    fn local<'d>(&'d self, index: usize, state: MutexGuard<'d, CoreState>) -> Local<'d> {
        let core = &self.cores[index];
        let slots = state.cache.slots;
        let mask = state.cache.len - 1;
        Local {
            domain: self,
            core,
            index,
            slots,
            mask,
            // Only this thread flushes its cache while it is registered,
            // so a private copy of the core's epoch stays exact.
            flushed_epoch: Cell::new(core.epoch.load(Ordering::Acquire)),
            until_tick: Cell::new(self.ops_until_tick()),
            guard: UnsafeCell::new(state),
            _not_send: PhantomData,
        }
    }

    /// A thread's operation count between ticks; `u64::MAX` (never, in
    /// practice) when operations do not tick.
    fn ops_until_tick(&self) -> u64 {
        match self.config.ops_per_tick {
            0 => u64::MAX,
            ops => ops,
        }
    }

    /// Tries to end the current epoch: flushes (and reviews) every
    /// unregistered cache that has not been flushed since the epoch began,
    /// then advances the global epoch if every cache has been. Returns
    /// whether it advanced; it does not while a registered thread has not
    /// flushed yet (it does on its next operation).
    pub fn tick(&self) -> bool {
        let epoch = self.global_epoch.load(Ordering::Acquire);
        let in_use = self.cores_in_use.load(Ordering::Acquire);
        let mut frees = FreeList::new();
        let mut all_flushed = true;
        for core in &self.cores[..in_use] {
            if core.epoch.load(Ordering::Acquire) >= epoch {
                continue;
            }
            match core.state.try_lock() {
                Some(mut state) => {
                    self.flush_locked(core, &mut state, epoch);
                    self.review_locked(&mut state, &mut frees);
                }
                None => {
                    all_flushed = false;
                    break;
                }
            }
        }
        self.free_all(frees);
        all_flushed
            && self
                .global_epoch
                .compare_exchange(epoch, epoch + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Flushes and reviews until no object waits for review, advancing
    /// epochs as needed; gives up after `max_epochs` epochs. Returns whether
    /// every review queue is empty. For tests and teardown: objects still
    /// referenced stay queued until their references are dropped.
    pub fn quiesce(&self, max_epochs: u64) -> bool {
        let start = self.epoch();
        loop {
            self.tick();
            // A registered thread's queue cannot be seen: count it pending.
            let pending = self.cores[..self.cores_in_use.load(Ordering::Acquire)]
                .iter()
                .any(|core| core.state.try_lock().is_none_or(|s| !s.review.is_empty()))
                // Taken off a queue by another thread's review, not freed yet.
                || self.freeing.load(Ordering::Acquire) != 0;
            if !pending {
                return true;
            }
            if self.epoch() >= start + max_epochs {
                return false;
            }
            #[cfg(loom)]
            loom::thread::yield_now();
        }
    }

    /// `flush()` of Figure 2: evicts every entry (zero deltas too: a zero
    /// that hides an inc and a dec must still mark a queued object dirty),
    /// clears the cache, and records that this cache was flushed in
    /// `epoch`, read before the first eviction.
    fn flush_locked(&self, core: &Core, state: &mut CoreState, epoch: u64) {
        let CoreState { cache, review, .. } = state;
        for index in 0..cache.len {
            let entry = cache.entry(index);
            if let Some(object) = entry.object.take() {
                let delta = core::mem::take(&mut entry.delta);
                self.evict(object, delta, review);
            }
        }
        core.epoch.store(epoch, Ordering::Release);
    }

    /// `evict()` of Figure 2.
    fn evict(&self, object: HeaderPtr, delta: i64, review: &mut Vec<(HeaderPtr, u64)>) {
        let header = object.header();
        let mut state = header.state.lock();
        state.refcnt += delta;
        if state.refcnt == 0 {
            if !state.queued {
                state.dirty = false;
                state.queued = true;
                if let Some(weak) = &header.weak {
                    weak.set_dying();
                }
                // Read under the object lock: every flush of the next epoch
                // starts after this read.
                review.push((object, self.global_epoch.load(Ordering::Acquire)));
            } else {
                state.dirty = true;
            }
        }
    }

    /// `review()` of Figure 2: objects queued two epochs ago are freed if
    /// their count stayed zero (and no `try_get` revived them), requeued if
    /// it was a dirty zero, and dropped from the queue if it is not zero.
    fn review_locked(&self, state: &mut CoreState, frees: &mut FreeList) {
        let epoch = self.global_epoch.load(Ordering::Acquire);
        let taken_before = frees.len();
        let mut index = 0;
        while index < state.review.len() {
            let (object, queued_at) = state.review[index];
            if epoch < queued_at + REVIEW_DELAY_EPOCHS {
                index += 1;
                continue;
            }
            let header = object.header();
            let mut obj = header.state.lock();
            obj.queued = false;
            if obj.refcnt != 0 {
                if let Some(weak) = &header.weak {
                    weak.clear_dying();
                }
                state.review.swap_remove(index);
            } else if obj.dirty || !header.weak.as_ref().is_none_or(|w| w.try_kill(object)) {
                obj.dirty = false;
                obj.queued = true;
                if let Some(weak) = &header.weak {
                    weak.set_dying();
                }
                state.review[index] = (object, epoch);
                index += 1;
            } else {
                state.review.swap_remove(index);
                drop(obj);
                frees.push(object);
            }
        }
        // Counted while the core's lock is still held: whoever next sees
        // this queue without the objects sees the count too. One add per
        // review, not per object: `freeing` is one cache line for every
        // core.
        let taken = frees.len() - taken_before;
        if taken != 0 {
            self.freeing.fetch_add(taken, Ordering::AcqRel);
        }
    }

    fn free_all(&self, frees: FreeList) {
        let n = frees.len();
        if n == 0 {
            return;
        }
        for object in frees {
            // SAFETY: `review_locked` put it here after seeing its count
            // zero and clean for two epochs and (if it has a weak
            // reference) swapping that reference to null: nothing can reach
            // it, and it left the only queue that held it.
            unsafe { (object.header().free)(object.0) };
        }
        // Once for the batch (shared cache lines, see `review_locked`);
        // `freeing` drops only after every object of it is freed.
        self.freed.fetch_add(n as u64, Ordering::Relaxed);
        self.freeing.fetch_sub(n, Ordering::AcqRel);
    }
}

impl Drop for Refcache {
    fn drop(&mut self) {
        // No `Local` is left (they borrow the domain). Free whatever has
        // reached zero; objects still referenced by a `Counted` leak.
        self.quiesce(8 * REVIEW_DELAY_EPOCHS);
    }
}

/// A registered thread: it holds its delta cache and review queue for as
/// long as it lives. Not `Send`: it stands for the thread (a core in the
/// paper). Dropping it flushes the cache and releases it for the next
/// thread that registers.
pub struct Local<'d> {
    domain: &'d Refcache,
    core: &'d Core,
    index: usize,
    /// This thread's delta cache (the entries of `guard`'s `DeltaCache`,
    /// which never moves or changes size while the guard is held) and its
    /// index mask: the fast path reads them without touching the guard.
    slots: NonNull<Entry>,
    mask: usize,
    /// The epoch of this cache's last flush: an exact copy of
    /// `core.epoch`, which nobody else writes while this thread holds the
    /// cache.
    flushed_epoch: Cell<u64>,
    /// Operations left before this thread calls `tick`.
    until_tick: Cell<u64>,
    /// The core's lock, held for the whole registration. Touched only
    /// through [`Local::with_state`].
    guard: UnsafeCell<MutexGuard<'d, CoreState>>,
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for Local<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Local").field("index", &self.index).finish()
    }
}

impl<'d> Local<'d> {
    /// The domain this thread is registered with.
    pub fn domain(&self) -> &'d Refcache {
        self.domain
    }

    /// This thread's cache index in the domain.
    pub fn index(&self) -> usize {
        self.index
    }

    /// A new object holding `value`, with one reference (returned).
    pub fn alloc<T: Send + Sync>(&self, value: T) -> Counted<T> {
        alloc_inner(value, None, None)
    }

    /// Like [`alloc`](Local::alloc), calling `on_free(value)` instead of
    /// dropping `value` when the object is finally freed.
    pub fn alloc_with_callback<T: Send + Sync>(&self, value: T, on_free: fn(T)) -> Counted<T> {
        alloc_inner(value, Some(on_free), None)
    }

    /// A new object with one reference, and a weak reference to it.
    pub fn alloc_with_weak<T: Send + Sync>(
        &self,
        value: T,
        on_free: Option<fn(T)>,
    ) -> (Counted<T>, Weak<T>) {
        let slot = Arc::new(WeakSlot {
            word: AtomicUsize::new(0),
        });
        let strong = alloc_inner(value, on_free, Some(slot.clone()));
        slot.word
            .store(strong.object.as_ptr() as usize, Ordering::Release);
        (
            strong,
            Weak {
                slot,
                _type: PhantomData,
            },
        )
    }

    /// Another reference to `object` (`inc` of Figure 2).
    pub fn clone_ref<T>(&self, object: &Counted<T>) -> Counted<T> {
        self.apply(object.header_ptr(), 1);
        Counted {
            object: object.object,
            _owns: PhantomData,
        }
    }

    /// Drops a reference (`dec` of Figure 2). The object is freed at least
    /// two epochs after its true count reaches zero.
    pub fn release<T>(&self, object: Counted<T>) {
        // `Counted` has no destructor: consuming it is the release.
        self.apply(object.header_ptr(), -1);
    }

    /// `inc` of Figure 2 on an object this thread can reach through
    /// `object`: adds a reference that no handle stands for. Match it with
    /// [`dec`](Local::dec), or the object leaks.
    pub fn inc<T>(&self, object: &Counted<T>) {
        self.apply(object.header_ptr(), 1);
    }

    /// `dec` of Figure 2: drops a reference added by [`inc`](Local::inc).
    ///
    /// # Safety
    /// A reference added by `inc` (on any thread of this domain) and not
    /// yet dropped must exist; otherwise the count could reach zero while
    /// `Counted` handles still point at the object.
    pub unsafe fn dec<T>(&self, object: &Counted<T>) {
        self.apply(object.header_ptr(), -1);
    }

    /// Adds `count` references no handle stands for (`count` calls of
    /// [`inc`](Local::inc) in one cache update).
    pub fn add<T>(&self, object: &Counted<T>, count: u32) {
        self.apply(object.header_ptr(), i64::from(count));
    }

    /// Drops `count` references added by [`inc`](Local::inc) or
    /// [`add`](Local::add).
    ///
    /// # Safety
    /// As for [`dec`](Local::dec), `count` times.
    pub unsafe fn sub<T>(&self, object: &Counted<T>, count: u32) {
        self.apply(object.header_ptr(), -i64::from(count));
    }

    /// `flush()` and `review()` of Figure 2 for this thread, now; then an
    /// attempt to end the epoch. A thread that stays registered while idle
    /// should call this now and then, or it holds up every free.
    pub fn flush(&self) {
        let epoch = self.domain.global_epoch.load(Ordering::Acquire);
        let mut frees = FreeList::new();
        self.with_state(|state| {
            self.domain.flush_locked(self.core, state, epoch);
            self.flushed_epoch.set(epoch);
            self.domain.review_locked(state, &mut frees);
        });
        self.domain.free_all(frees);
        self.domain.tick();
    }

    /// Runs `body` on this thread's cache state. `body` must not call back
    /// into `with_state` (nothing in this module does: user code, the
    /// destructors of freed objects, runs only after it returns).
    #[inline]
    fn with_state<R>(&self, body: impl FnOnce(&mut CoreState) -> R) -> R {
        // SAFETY: `Local` is neither `Send` nor `Sync`, so only the thread
        // that registered it gets here, and `body` does not re-enter: this
        // is the only reference to the guard while it runs.
        body(unsafe { &mut *self.guard.get() })
    }

    /// `inc`/`dec` of Figure 2: the fast path. When the object already
    /// owns its slot, no epoch has ended since this cache was flushed and
    /// it is not this thread's turn to tick, the whole operation is one
    /// add to a thread-private word; everything else is
    /// [`apply_slow`](Local::apply_slow).
    #[inline(always)]
    fn apply(&self, object: HeaderPtr, delta: i64) {
        let entry = self.slot(object);
        let until_tick = self.until_tick.get();
        let epoch = self.domain.global_epoch.load(Ordering::Acquire);
        // SAFETY: `slot` is in bounds of this thread's cache, which it
        // holds the lock of; no other reference to the entry is live (the
        // slow path's end before it returns, and nothing here re-enters).
        let hit = unsafe { (*entry).object } == Some(object);
        if hit && until_tick > 1 && epoch == self.flushed_epoch.get() {
            // SAFETY: the same entry under the same lock; the read above
            // has ended, so this write is the only access.
            unsafe { (*entry).delta += delta };
            self.until_tick.set(until_tick - 1);
            return;
        }
        self.apply_slow(object, delta);
    }

    /// The entry `object` maps to in this thread's cache.
    #[inline(always)]
    fn slot(&self, object: HeaderPtr) -> *mut Entry {
        // SAFETY: `slot_index` is masked by `mask = len - 1`, so the
        // offset is within the `len` entries `slots` points to.
        unsafe { self.slots.as_ptr().add(object.slot_index(self.mask)) }
    }

    #[cold]
    #[inline(never)]
    fn apply_slow(&self, object: HeaderPtr, delta: i64) {
        let (tick, frees) = self.with_state(|state| self.apply_locked(state, object, delta));
        if let Some(frees) = frees {
            self.domain.free_all(frees);
        }
        if tick {
            self.domain.tick();
        }
    }

    /// Adds `delta` to this thread's cache entry for `object`, evicting a
    /// conflicting entry first; flushes and reviews if an epoch ended since
    /// this cache was last flushed. Returns whether to tick and what to
    /// free, both for after the state borrow ends (a destructor may drop
    /// references through this same `Local`).
    fn apply_locked(
        &self,
        state: &mut CoreState,
        object: HeaderPtr,
        delta: i64,
    ) -> (bool, Option<FreeList>) {
        let index = object.slot_index(self.mask);
        let entry = state.cache.entry(index);
        if entry.object != Some(object) {
            if let Some(victim) = entry.object {
                let victim_delta = entry.delta;
                self.domain.evict(victim, victim_delta, &mut state.review);
            }
            *state.cache.entry(index) = Entry {
                object: Some(object),
                delta: 0,
            };
        }
        state.cache.entry(index).delta += delta;
        let mut tick = false;
        if self.domain.config.ops_per_tick != 0 {
            let until_tick = self.until_tick.get() - 1;
            if until_tick == 0 {
                self.until_tick.set(self.domain.ops_until_tick());
                tick = true;
            } else {
                self.until_tick.set(until_tick);
            }
        }
        let epoch = self.domain.global_epoch.load(Ordering::Acquire);
        if self.flushed_epoch.get() >= epoch {
            return (tick, None);
        }
        let mut frees = FreeList::new();
        self.domain.flush_locked(self.core, state, epoch);
        self.flushed_epoch.set(epoch);
        self.domain.review_locked(state, &mut frees);
        (tick, Some(frees))
    }
}

fn alloc_inner<T>(value: T, on_free: Option<fn(T)>, weak: Option<Arc<WeakSlot>>) -> Counted<T> {
    let object = Box::new(Obj {
        header: Header {
            state: Mutex::new(ObjState {
                refcnt: 1,
                dirty: false,
                queued: false,
            }),
            weak,
            free: free_obj::<T>,
        },
        on_free,
        value,
    });
    Counted {
        object: NonNull::from(Box::leak(object)),
        _owns: PhantomData,
    }
}

impl Drop for Local<'_> {
    fn drop(&mut self) {
        // Flush so nothing this thread did waits on the next owner; the
        // guard drops after this, releasing the cache.
        self.flush();
    }
}

/// One counted reference to an object in a [`Refcache`] domain. Give it
/// back with [`Local::release`]; dropping it without that leaks the object
/// (safe, like `mem::forget`). Use it only with `Local`s of the domain that
/// made it.
#[must_use = "a dropped Counted leaks its object; use Local::release"]
pub struct Counted<T> {
    object: NonNull<Obj<T>>,
    _owns: PhantomData<Obj<T>>,
}

// SAFETY: a `Counted` only gives out `&T`; moving it moves a reference.
unsafe impl<T: Send + Sync> Send for Counted<T> {}
// SAFETY: as above: shared access is `&T`.
unsafe impl<T: Send + Sync> Sync for Counted<T> {}

impl<T> Counted<T> {
    fn header_ptr(&self) -> HeaderPtr {
        HeaderPtr(self.object.cast())
    }

    /// Whether two references name the same object.
    pub fn ptr_eq(a: &Counted<T>, b: &Counted<T>) -> bool {
        a.object == b.object
    }

    /// The object's address (for diagnostics and hashing).
    pub fn as_ptr(&self) -> *const T {
        // SAFETY: the object is live (see `Deref`); only the address of
        // the field is taken.
        unsafe { &raw const (*self.object.as_ptr()).value }
    }
}

impl<T> Deref for Counted<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this handle stands for one reference in the object's true
        // count, so the true count is not zero while it exists and the
        // object is not freed (freeing needs a zero that lasted two
        // epochs).
        unsafe { &self.object.as_ref().value }
    }
}

impl<T: fmt::Debug> fmt::Debug for Counted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Counted").field(&**self).finish()
    }
}

/// The weak-reference word: the object pointer and the dying bit.
struct WeakSlot {
    word: AtomicUsize,
}

impl WeakSlot {
    fn set_dying(&self) {
        self.word.fetch_or(DYING_BIT, Ordering::AcqRel);
    }

    fn clear_dying(&self) {
        self.word.fetch_and(!DYING_BIT, Ordering::AcqRel);
    }

    /// `cmpxchg(<obj, true>, <null, false>)`: succeeds only if no `try_get`
    /// cleared the dying bit since it was set.
    fn try_kill(&self, object: HeaderPtr) -> bool {
        let dying = object.0.as_ptr() as usize | DYING_BIT;
        self.word
            .compare_exchange(dying, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A weak reference: does not keep the object alive, but can revive it
/// with [`try_get`](Weak::try_get) until Refcache frees it.
pub struct Weak<T> {
    slot: Arc<WeakSlot>,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for Weak<T> {
    fn clone(&self) -> Self {
        Weak {
            slot: self.slot.clone(),
            _type: PhantomData,
        }
    }
}

impl<T> fmt::Debug for Weak<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = self.slot.word.load(Ordering::Relaxed);
        f.debug_struct("Weak")
            .field("freed", &(word == 0))
            .field("dying", &(word & DYING_BIT != 0))
            .finish()
    }
}

impl<T> Weak<T> {
    /// `tryget()` of Figure 2: a new reference if the object has not been
    /// freed (reviving it if its count had reached zero), else `None`.
    pub fn try_get(&self, local: &Local<'_>) -> Option<Counted<T>> {
        // From reading the pointer until the increment is in the cache this
        // thread does not flush, so the epoch advances at most once and
        // the object (freed only two epochs after its dying bit is set
        // again) stays live meanwhile.
        let (object, tick, frees) = local.with_state(|state| {
            let word = loop {
                let word = self.slot.word.load(Ordering::Acquire);
                if word == 0 {
                    return None;
                }
                if self
                    .slot
                    .word
                    .compare_exchange(word, word & !DYING_BIT, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    break word & !DYING_BIT;
                }
            };
            let Some(object) = NonNull::new(word as *mut Header) else {
                unreachable!("a non-zero weak word holds a pointer");
            };
            let (tick, frees) = local.apply_locked(state, HeaderPtr(object), 1);
            Some((object, tick, frees))
        })?;
        if let Some(frees) = frees {
            local.domain.free_all(frees);
        }
        if tick {
            local.domain.tick();
        }
        Some(Counted {
            object: object.cast(),
            _owns: PhantomData,
        })
    }

    /// Whether the object has been freed (a `try_get` would fail).
    pub fn is_freed(&self) -> bool {
        self.slot.word.load(Ordering::Acquire) == 0
    }
}
