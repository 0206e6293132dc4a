//! Refcache'd frames (RadixVM §3.1, §3.4): the reference a page's
//! metadata holds on its frame is counted with Refcache, so mapping and
//! unmapping frames on many cores writes no shared counter, and a frame
//! returns to the buddy pool at least two Refcache epochs after its last
//! reference is dropped (after the munmap's shootdown, so no TLB can
//! reach it).
//!
//! One Refcache domain serves every address space, as a kernel has one
//! page-reference system; each thread registers with it on first use and
//! keeps its delta cache (a Refcache "core") in a thread-local. Threads
//! end epochs themselves every [`OPS_PER_TICK`] counting operations,
//! which bounds the frames waiting to be freed.
//!
//! A registered thread holds its core until it [`leave`]s: an epoch ends
//! only when every held core has been flushed in it, so a registered
//! thread that stops counting holds every free up (a core that stops
//! taking timer interrupts would do the same to the paper's kernel).
//! Threads therefore leave when they stop being a CPU: dropping a
//! [`crate::Cpu`] leaves, and so does a thread that released frames
//! outside any CPU (address-space teardown). Frames in flight are bounded
//! by the allocation rate times the epoch length; an allocation that
//! finds the pool empty [`reclaim`]s: it ends epochs itself and retries,
//! as a kernel's direct reclaim would.
//!
//! A frame's box keeps its pool alive until Refcache frees the frame,
//! through the creating thread's *pin* of the pool, not a
//! clone of the pool's `Arc`: that count would be one cache line written
//! at every fault on every core.
//!
//! ```text
//!  fault:   alloc frame ─ Counted<FrameBox> (count 1, in the page's metadata)
//!  munmap:  ... shootdown acked ─ release (count delta -1 in this thread's cache)
//!  epoch e: caches flushed, global count 0 → queued for review
//!  epoch e+2: still 0 → on_free: frame back to the buddy pool
//! ```

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use buddy::FrameNo;
use refcache::{Config, Counted, Local, Refcache};

use crate::{Frames, VmError};

/// Counting operations a thread performs between its attempts to end the
/// epoch.
pub const OPS_PER_TICK: u64 = 1024;
/// The same for the domain of a per-core run ([`init_domain_with`] from
/// [`crate::percore::run`]). Frames wait about three epochs between their
/// release and their return to the pool, so the epoch length sets how
/// many recently used frames are in flight: at 1024 operations (128
/// four-page iterations per worker) a worker cycles through ~6 MiB of
/// frames, far beyond its 1 MiB L2, and zeroing each frame and the
/// kernel's look at its `struct page` miss the cache, more so with a
/// second worker sharing the L3; at 128, ~0.75 MiB per worker stays
/// cached. docs/BENCHMARKS.md has the A/B.
pub const PERCORE_OPS_PER_TICK: u64 = 128;

/// Epoch length the domain is created with (see [`init_domain_with`]).
static DOMAIN_OPS_PER_TICK: AtomicU64 = AtomicU64::new(OPS_PER_TICK);
/// Epochs [`quiesce`] advances per attempt.
pub const QUIESCE_EPOCHS: u64 = 16;
/// How long [`quiesce`] keeps trying while other threads hold epochs up
/// (a registered thread that counts rarely, such as a thread that only
/// reads, holds them up until it counts again or leaves).
pub const QUIESCE_TIMEOUT_MS: u64 = 60_000;

/// How long an allocation that found the pool empty keeps ending epochs
/// (so released frames get freed) before it reports out of memory.
pub const RECLAIM_TIMEOUT_MS: u64 = 2_000;

/// The domain lives on the heap, not inline in the static: a process
/// that forks per-core workers over the shared heap ([`crate::percore`])
/// gives each worker a private copy of the static, and only what the
/// static points to is shared.
static DOMAIN: OnceLock<&'static Refcache> = OnceLock::new();

thread_local! {
    static LOCAL: RefCell<Option<Local<'static>>> = const { RefCell::new(None) };
    /// This thread's pin of the pool it last allocated frames from.
    static PIN: RefCell<Option<Arc<Pin>>> = const { RefCell::new(None) };
}

fn domain() -> &'static Refcache {
    DOMAIN.get_or_init(|| {
        Box::leak(Box::new(Refcache::new(Config {
            ops_per_tick: DOMAIN_OPS_PER_TICK.load(Ordering::Relaxed),
            ..Config::default()
        })))
    })
}

/// Creates the Refcache domain without registering this thread: a
/// process about to fork per-core workers calls it so that the domain
/// (in the shared heap) is the same object in every worker, while the
/// registration (a thread-local) is made by each worker itself.
pub fn init_domain() {
    domain();
}

/// [`init_domain`] with epochs of `ops_per_tick` counting operations
/// per thread, unless the domain exists already (then its length stays).
/// Returns the domain's epoch length.
pub fn init_domain_with(ops_per_tick: u64) -> u64 {
    if DOMAIN.get().is_none() {
        DOMAIN_OPS_PER_TICK.store(ops_per_tick.max(1), Ordering::Relaxed);
    }
    domain().config().ops_per_tick
}

fn with_local<R>(f: impl FnOnce(&Local<'static>) -> R) -> R {
    LOCAL.with(|cell| {
        let mut local = cell.borrow_mut();
        let local = local.get_or_insert_with(|| {
            domain()
                .register()
                .expect("more threads than refcache::DEFAULT_MAX_THREADS")
        });
        f(local)
    })
}

/// A thread's hold on a pool: every frame box the thread creates for
/// that pool holds the thread's pin, and the pin holds the pool, so the
/// pool outlives the frames Refcache has yet to free. Boxes clone the
/// pin, not the pool's `Arc`: the pool's reference count is one word
/// that every core's faults would write (a cache-line transfer per fault
/// between cores), while a pin's count is written by the core that made
/// it and by the cores that free its frames.
struct Pin {
    frames: Arc<Frames>,
}

/// This thread's pin of `frames` (a new one when the thread last
/// allocated from another pool).
fn pin_of(frames: &Arc<Frames>) -> Arc<Pin> {
    PIN.with(|cell| {
        let mut pin = cell.borrow_mut();
        match &*pin {
            Some(p) if Arc::ptr_eq(&p.frames, frames) => p.clone(),
            _ => {
                let p = Arc::new(Pin {
                    frames: frames.clone(),
                });
                *pin = Some(p.clone());
                p
            }
        }
    })
}

/// What Refcache frees: a frame and (through a pin) the pool it goes
/// back to.
struct FrameBox {
    pin: Arc<Pin>,
    frame: FrameNo,
    cpu: usize,
}

fn free_frame(b: FrameBox) {
    b.pin.frames.free(b.cpu, b.frame);
}

/// One counted reference to a frame.
pub struct FrameRef(Counted<FrameBox>);

impl std::fmt::Debug for FrameRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FrameRef({})", self.frame())
    }
}

impl FrameRef {
    /// Takes ownership of `frame` (allocated by `cpu` from `frames`): the
    /// first reference.
    pub fn new(frames: &Arc<Frames>, cpu: usize, frame: FrameNo) -> FrameRef {
        let value = FrameBox {
            pin: pin_of(frames),
            frame,
            cpu,
        };
        FrameRef(with_local(|l| l.alloc_with_callback(value, free_frame)))
    }

    /// The frame.
    pub fn frame(&self) -> FrameNo {
        self.0.frame
    }

    /// Drops the reference; the frame is freed once no reference is left,
    /// two epochs later.
    pub fn release(self) {
        with_local(|l| l.release(self.0));
    }
}

/// Drops every reference in `refs`.
pub fn release_all(refs: Vec<FrameRef>) {
    if refs.is_empty() {
        return;
    }
    with_local(|l| {
        for r in refs {
            l.release(r.0);
        }
    });
}

/// Direct reclaim: the pool may be empty only because released frames
/// wait for their epochs. Retries `alloc` after flushing this thread's
/// cache and trying to end the epoch (yielding to threads that hold it
/// up), until it succeeds or [`RECLAIM_TIMEOUT_MS`] passes.
pub fn reclaim<T>(mut alloc: impl FnMut() -> Result<T, VmError>) -> Result<T, VmError> {
    let deadline = Instant::now() + Duration::from_millis(RECLAIM_TIMEOUT_MS);
    loop {
        with_local(|l| l.flush());
        match alloc() {
            Err(VmError::OutOfMemory) if Instant::now() < deadline => std::thread::yield_now(),
            other => return other,
        }
    }
}

/// Flushes this thread's cache and gives its core back (it registers
/// again on its next counting operation). Cheap when not registered.
pub fn leave() {
    // `try_with`: during thread exit the thread-local may be gone (its
    // destructor flushed already).
    let _ = LOCAL.try_with(|cell| drop(cell.borrow_mut().take()));
    // The pool is no longer this thread's to hold (frames not yet freed
    // hold their own pins).
    let _ = PIN.try_with(|cell| drop(cell.borrow_mut().take()));
}

/// Leaves, then advances epochs until every released frame is freed (for
/// tests and teardown). Returns false if other registered threads kept
/// epochs from advancing past [`QUIESCE_TIMEOUT_MS`] (a thread holding
/// its core without counting can keep a single attempt waiting until it
/// counts or leaves).
pub fn quiesce() -> bool {
    leave();
    let deadline = Instant::now() + Duration::from_millis(QUIESCE_TIMEOUT_MS);
    loop {
        if domain().quiesce(QUIESCE_EPOCHS) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
