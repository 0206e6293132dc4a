//! The per-core MMU: one worker *process* per core, pinned, each with its
//! own real page table (RadixVM §3.3, "per-core page tables"), and
//! targeted TLB shootdown as acknowledged messages to exactly the cores
//! that may hold a translation (§3.4, §4).
//!
//! *Why processes.* Linux keeps one page table per address space (mm)
//! and, when a translation is removed, sends a TLB-shootdown IPI to every
//! CPU that has run the mm recently. A process pinned to one CPU is an mm
//! that only that CPU runs: its page table is that core's own, and its
//! `munmap` flushes the local TLB only, with no IPI. So a worker process
//! per core gives the designs real per-core page tables and TLBs.
//!
//! *Sharing the design.* The designs' metadata must be the same objects
//! in every worker. The binary that runs this backend (`radixvm-percore`)
//! allocates everything from [`heap::SharedHeap`], one `MAP_SHARED` region
//! at a fixed address; the parent builds the address space (design, frame
//! pool, this MMU) and then forks the workers ([`run`]), which follow the
//! same pointers. Frames come from the `buddy` pool over one memfd per
//! buddy heap, that is per core ([`Frames::new_memfd`]), mapped shared in
//! every process: frame `f` is page `f % part` of memfd `f / part`
//! ([`Frames::file_of`]), and a worker maps it into its own table from
//! that file, whichever core allocated it (the same page either way).
//! A core allocates from its own heap, so the frames it maps are mostly
//! in its own memfd.
//!
//! *Arena.* The designs' address range ([`ARENA_BYTES`]) is reserved
//! `PROT_NONE` (private, `MAP_NORESERVE`) in the parent before the fork,
//! at [`ARENA_HINT_ADDR`], so it lies at the same address in every worker
//! and each worker's copy is its own. User accesses are the
//! one-instruction probes of [`crate::mmu::probe`]; an access to a page
//! not installed in this worker's table faults (SIGSEGV on the
//! reservation or on a hole in it), the probe's fixup reports
//! [`Miss::Fault`], and the design's `pagefault` runs on the faulting
//! worker, as a kernel handles a fault on the faulting CPU.
//!
//! * install (the owner's table only): `mmap(va, 4096, prot,
//!   MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, offset)` with the frame's
//!   memfd and offset; a fault-around run of consecutive frames (below)
//!   is one `mmap` of the run (a buddy block never crosses two memfds);
//! * clear: `munmap(va, len)`: the kernel removes the entries and
//!   flushes the TLB of the one CPU that runs this mm, leaving a hole in
//!   the reservation that the next install fills without splitting it.
//!   The arena lies far below where the kernel places mappings itself
//!   (top-down into the highest gap that fits), so no other mapping
//!   lands in a hole;
//! * protection change of a present page: `mprotect`.
//!
//! *Cost of a fault* (docs/BENCHMARKS.md has the figures): the fault
//! exception and the signal delivery and return (~3.5 µs on this
//! machine), the install `mmap` (~5-6 µs: a VMA, its merge, and the
//! populate), against ~1 µs for a native anonymous fault. RadixVM's
//! fault-around variant ([`crate::designs::radixvm::RadixVm::set_fault_around_pages`],
//! off by default) cuts the number of faults: the design gives an aligned
//! block of untouched pages of one mapping consecutive frames (one buddy
//! block), and [`Mmu::install_run`] maps the block with one `mmap`; a
//! fault on a page another core touched first maps the block of
//! consecutive frames the design already chose around it the same way. It
//! changes what the design does (frames for pages not yet touched, all in
//! the faulting core's set, as Linux's anonymous multi-size THP does), not
//! the mechanism: the frames are the design's, the translations are in the
//! faulting core's real table only, and munmap shoots down exactly the
//! cores in each page's set.
//!
//! A shadow table per worker (the software MMU's table type, in shared
//! memory) records what the design installed, so the designs' per-CPU
//! table semantics hold: a design may clear or downgrade entries of
//! *another* worker's table (RadixVM's munmap clears every table in the
//! page's CPU set). Only the owner can change its real table, so such a
//! change is made in the shadow, and the owner makes its real table
//! match the shadow for that range when it processes the shootdown that
//! the design always sends next (below), before it acknowledges.
//!
//! *Shared-table designs* (Bonsai, Linux-style) keep one page table for
//! the address space (table 0). On this backend that table is a shadow
//! in shared memory, and each worker's real table *caches* it: a fault
//! that finds (or puts) an entry in the shared table installs it in the
//! faulting worker's real table (and its per-worker shadow); clearing or
//! downgrading a shared entry clears or downgrades every worker's
//! per-worker shadow, and the design's shootdown, sent to every attached
//! core as those designs do, makes each real table match.
//!
//! *Targeted shootdown.* Each worker has a ring (`Ring`) in shared memory:
//! one slot per possible initiator (an initiator has at most one request
//! outstanding, so a slot never overflows), a bit mask of initiators with
//! a request pending, and a futex word for wake-ups.
//!
//! ```text
//!  initiator (worker 0, holds the range lock)    target (worker 1)
//!  shadow: clear entries of tables {0,1}
//!  real:   clear own range (local flush)
//!  slot[1][0] = {range, seq}; pending[1] |= 1<<0
//!  (futex-wake if 1 sleeps)
//!  spin: acked >= seq?  servicing own ring       access()/wait: pending? → drain:
//!    every IPI_EVERY_SPINS: kill(1, SIGUSR1)       real table := shadow over range
//!                                                  acked = seq
//!  sees ack → frees frames, unlocks
//! ```
//!
//! A target polls its ring at every [`Mmu::access`] and in every wait (the
//! benchmarks' barriers and queues, and after it finished its loop until
//! every worker has). A target that is spinning where it cannot poll (on
//! a radix range lock the initiator holds) gets the user-level IPI:
//! `SIGUSR1`, whose handler drains the ring unless the worker is inside a
//! page-table section, a drain already, or on the alternate signal stack
//! (then the initiator signals again later; the probes' SIGSEGV handler,
//! which runs there, blocks the IPI until it returns, since a second
//! signal frame would overflow that stack). Pages only the local core mapped need no message at
//! all. A target that does not acknowledge within [`ACK_TIMEOUT_MS`] ends
//! the initiator with an error naming it; [`run`] reports a worker that
//! dies (by index, pid and signal) or hangs, and kills the others.
//!
//! *What is real and what is not.* Real: the page tables (one per worker
//! process), the page faults, the TLBs, the kernel's flushes and IPIs
//! (counted system-wide from /proc/interrupts). User-level: the
//! shootdown messages between workers (a shared-memory ring, a futex
//! wake-up, a signal for a target that does not poll); they are counted
//! as the design's shootdown targets.
//!
//! *What two workers share* (why 2 workers are not quite 2x one; the
//! figures are in docs/BENCHMARKS.md). A worker's CPU time per
//! iteration of the local workload is higher at 2 workers than at 1.
//! The causes found, and what the backend does about each:
//! * cache lines both workers write. The shared heap's free-list heads
//!   (a CAS per allocation and per free of the designs' metadata): each
//!   worker allocates from its own cache ([`heap::enable_thread_cache`]),
//!   large enough ([`heap::CACHE_CLASS_BYTES`] per class) for the bursts
//!   Refcache frees at the end of an epoch. Refcache's domain-wide
//!   `freed` and `freeing` counters: written once per review batch. The
//!   pool's reference count: a frame's Refcache'd box holds its creating
//!   thread's pin of the pool, not a clone of the pool's `Arc`
//!   ([`crate::frameref`]), and [`Frames`] is 128-byte aligned so that
//!   its own fields share no line with a count. A memory-access trace of
//!   two workers (valgrind's lackey, lines of the shared heap touched by
//!   both) finds no other line that both write in every iteration;
//! * cold frames: a frame returns to the pool about three Refcache epochs
//!   after its release, and the epoch length decides how many frames are
//!   in flight; a per-core run uses short epochs
//!   ([`crate::frameref::PERCORE_OPS_PER_TICK`]) so that a worker reuses
//!   frames still in its L2 (zeroing them, and the kernel's look at their
//!   `struct page` in the install, miss the cache otherwise);
//! * epochs held up by a worker that is not running: an epoch ends only
//!   when every registered worker has flushed in it, and a worker flushes
//!   only when it runs. On a loaded machine the scheduler preempts a
//!   worker for other jobs, the other worker's epoch ticks fail
//!   meanwhile, and frames in flight grow with the preemptions (a 2 s
//!   run counted ~300 live frames at 1 worker and 1700-2500 at 2 workers
//!   at load 7-12, 60-75% of the ticks failing), so frames go cold again.
//!   In sv6 a core's timer interrupt flushes its cache whatever process
//!   it runs; a preempted worker process cannot, so this cost comes with
//!   the load;
//! * the kernel's view of the frames' file: its reference count (every
//!   `mmap` and `munmap`), its `i_mmap_rwsem` and the interval tree of
//!   its mappings (every install and unmap). With one memfd for the whole
//!   pool these are shared by all workers: about 1 µs per 4-page
//!   iteration at 2 workers in a profile, more at one page per fault,
//!   with `rwsem_spin_on_owner` at 2 workers only. A memfd per buddy
//!   heap makes them per core: their share of the workers' time at 2
//!   workers is then that at 1 (~3%, against ~8% with one memfd; a plain
//!   C loop of the same system calls, `results/percore-scale.c`, scales
//!   1.9-2.2x from 1 to 2 processes).
//!
//! What is left is the kernel's and the machine's: the fault, the signal
//! delivery, the install and the unmap.
//! `results/percore-signal.c` runs exactly the worker's system calls (a
//! probe's fault, SIGSEGV on the alternate stack, `mmap` of a page of
//! its own memfd with `MAP_POPULATE`, the store again, `munmap`) in 1 or
//! 2 pinned processes: it is the ceiling of 2 ÷ 1 on a machine.
//!
//! *Hazards of fork* (see also [`heap`]): statics are per-process copies.
//! The parent must not register with Refcache before forking (a
//! registration lives in a thread-local); it only creates the shared
//! Refcache domain ([`crate::frameref::init_domain_with`]) so that every
//! worker uses the same one. Locks that park waiters in a process-private table
//! (`parking_lot`, `std`) work across processes only uncontended; the
//! radix range locks, page-table leaf locks and Refcache's locks spin.
//! No thread is started before a fork; workers leave with `_exit`
//! without dropping anything built before the fork.

pub mod heap;
mod run;

pub use run::{run, run_after_setup, RunResult, Worker};

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::mmu::sw::PageTable;
use crate::mmu::{AttachedCpus, Backend, Counter, Counters, Miss, Mmu, Op, Pte};
use crate::shootdown::cpus_in;
use crate::{Access, Frames, ADDRESS_LIMIT_BYTES, MAX_CPUS, PAGE_SIZE_BYTES};

/// Bytes of each worker's arena: every address a design can hand out.
pub const ARENA_BYTES: u64 = ADDRESS_LIMIT_BYTES;
/// Where the arena is asked to lie: far below where the kernel places
/// mappings itself (top-down from just under the stack, into the highest
/// gap that fits), so the holes that unmapped pages leave in the arena
/// are never chosen for another mapping while the space above it is
/// free. The shared heap is at [`heap::HEAP_BASE_ADDR`], above it.
pub const ARENA_HINT_ADDR: usize = 0x1000_0000_0000;
/// Description used in every output line.
pub const DESCRIPTION: &str =
    "percore-mmu (real per-core page tables and TLBs; shootdown messages user-level)";
/// How long an initiator waits for a target's acknowledgement before it
/// ends the run with an error naming the target.
pub const ACK_TIMEOUT_MS: u64 = 5_000;
/// Polls of an acknowledgement between user-level IPIs (`SIGUSR1`) to a
/// target that has not answered.
pub const IPI_EVERY_SPINS: u64 = 4_096;
/// How long an idle worker sleeps on its futex before it looks again.
pub const IDLE_SLEEP_US: u64 = 500;
/// How long [`run`] waits, beyond the timed part, for workers to finish
/// before it declares them hung.
pub const HANG_TIMEOUT_MS: u64 = 20_000;
/// Words of per-worker results [`run`] returns.
pub const RESULT_WORDS: usize = 4;
/// Bytes of the shared error message.
const ERROR_BYTES: usize = 512;
/// The user-level IPI.
const IPI_SIGNAL: libc::c_int = libc::SIGUSR1;

/// Not a worker (the parent, or a process that never forked).
const NOT_A_WORKER: usize = usize::MAX;

// Process-private (each process has its own copy): which worker this
// process is, its MMU, and whether it is inside a page-table section or
// a drain (the IPI handler must not reenter either).
static ME: AtomicUsize = AtomicUsize::new(NOT_A_WORKER);
static CURRENT: AtomicPtr<PercoreMmu> = AtomicPtr::new(std::ptr::null_mut());
static IN_PT: AtomicBool = AtomicBool::new(false);
static DRAINING: AtomicBool = AtomicBool::new(false);

/// The worker this process is, if it is one.
pub fn me() -> Option<usize> {
    let me = ME.load(Ordering::Relaxed);
    (me != NOT_A_WORKER).then_some(me)
}

/// Whether this process allocates from the shared heap (the global
/// allocator of `radixvm-percore`): the backend works only there. `Err`
/// holds the reason.
pub fn available() -> Result<(), String> {
    if !cfg!(target_arch = "x86_64") {
        return Err("the access probes are written for x86-64 only".into());
    }
    let probe = Box::new(0u8);
    if heap::SharedHeap::contains(&*probe) {
        Ok(())
    } else {
        Err(
            "the per-core backend runs only in the radixvm-percore binary \
             (its global allocator is the shared heap)"
                .into(),
        )
    }
}

/// One initiator's request slot in a target's ring.
#[derive(Default)]
struct Slot {
    seq: AtomicU64,
    start: AtomicU64,
    end: AtomicU64,
    acked: AtomicU64,
}

/// A worker's shootdown ring (module essay).
struct Ring {
    /// Initiators with a request posted and not yet taken.
    pending: CachePadded<AtomicU64>,
    /// Futex word: bumped on every post.
    wake: CachePadded<AtomicU32>,
    /// 1 while the owner sleeps on `wake`.
    sleeping: CachePadded<AtomicU32>,
    /// Per initiator.
    slots: Box<[CachePadded<Slot>]>,
}

impl Default for Ring {
    fn default() -> Self {
        Ring {
            pending: CachePadded::new(AtomicU64::new(0)),
            wake: CachePadded::new(AtomicU32::new(0)),
            sleeping: CachePadded::new(AtomicU32::new(0)),
            slots: (0..MAX_CPUS).map(|_| CachePadded::default()).collect(),
        }
    }
}

/// The first error of a run, in shared memory.
struct ErrorSlot {
    claimed: AtomicBool,
    len: AtomicUsize,
    bytes: Box<[AtomicU8]>,
}

impl Default for ErrorSlot {
    fn default() -> Self {
        ErrorSlot {
            claimed: AtomicBool::new(false),
            len: AtomicUsize::new(0),
            bytes: (0..ERROR_BYTES).map(|_| AtomicU8::new(0)).collect(),
        }
    }
}

impl ErrorSlot {
    fn set(&self, message: &str) {
        if self.claimed.swap(true, Ordering::AcqRel) {
            return;
        }
        let b = message.as_bytes();
        let n = b.len().min(ERROR_BYTES);
        for (slot, &v) in self.bytes.iter().zip(&b[..n]) {
            slot.store(v, Ordering::Relaxed);
        }
        self.len.store(n, Ordering::Release);
    }

    fn get(&self) -> Option<String> {
        let n = self.len.load(Ordering::Acquire);
        (n > 0).then(|| {
            let v: Vec<u8> = self.bytes[..n]
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect();
            String::from_utf8_lossy(&v).into_owned()
        })
    }
}

/// The per-core MMU of one address space (module essay).
pub struct PercoreMmu {
    frames: Arc<Frames>,
    arena: usize,
    /// Shadow of each worker's real table.
    tables: Box<[PageTable]>,
    /// The design's one shared table (shared-table designs), which the
    /// workers' real tables cache.
    shared: Option<PageTable>,
    attached: AttachedCpus,
    counters: Counters,
    rings: Box<[Ring]>,
    /// Each attached worker's pid (for the IPI).
    pids: Box<[AtomicI32]>,
    error: ErrorSlot,
    /// Per worker: bumped at every poll of its ring (its accesses and
    /// waits), so the parent can tell a hung worker from a busy one.
    beats: Box<[CachePadded<AtomicU64>]>,
    /// Test knob: targets acknowledge without dropping their
    /// translations (a broken shootdown, which the stale-translation test
    /// must catch).
    broken_shootdown: AtomicBool,
}

impl std::fmt::Debug for PercoreMmu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PercoreMmu")
            .field("arena", &format_args!("{:#x}", self.arena))
            .finish_non_exhaustive()
    }
}

/// The real protection for an entry.
fn prot_of(pte: Pte) -> libc::c_int {
    if pte.writable() {
        libc::PROT_READ | libc::PROT_WRITE
    } else if pte.permits(Access::Read) {
        libc::PROT_READ
    } else {
        libc::PROT_NONE
    }
}

/// Marks this process inside a page-table section (the IPI handler then
/// leaves the ring for later) while it lives.
struct PtSection(bool);

impl PtSection {
    fn enter() -> PtSection {
        PtSection(IN_PT.swap(true, Ordering::Relaxed))
    }
}

impl Drop for PtSection {
    fn drop(&mut self) {
        IN_PT.store(self.0, Ordering::Relaxed);
    }
}

impl PercoreMmu {
    /// A per-core MMU over `frames`, which must be a memfd pool
    /// ([`Frames::new_memfd`]), with a table per CPU (`per_cpu_tables`,
    /// RadixVM) or one shared table that every worker's real table
    /// caches; reserves the arena in this process (the workers forked
    /// later inherit it).
    pub fn new(frames: &Arc<Frames>, per_cpu_tables: bool) -> io::Result<PercoreMmu> {
        if frames.file_of(0).is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the per-core MMU needs a memfd frame pool (Frames::new_memfd)",
            ));
        }
        crate::mmu::probe::install_handlers()?;
        install_ipi_handler()?;
        // SAFETY: a fresh private PROT_NONE reservation (at the hint, or
        // wherever the kernel puts it); nothing else refers to it.
        let arena = unsafe {
            libc::mmap(
                ARENA_HINT_ADDR as *mut libc::c_void,
                ARENA_BYTES as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if arena == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(PercoreMmu {
            frames: frames.clone(),
            arena: arena as usize,
            tables: (0..MAX_CPUS).map(|_| PageTable::new()).collect(),
            shared: (!per_cpu_tables).then(PageTable::new),
            attached: AttachedCpus::default(),
            counters: Counters::default(),
            rings: (0..MAX_CPUS).map(|_| Ring::default()).collect(),
            pids: (0..MAX_CPUS).map(|_| AtomicI32::new(0)).collect(),
            error: ErrorSlot::default(),
            beats: (0..MAX_CPUS)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            broken_shootdown: AtomicBool::new(false),
        })
    }

    /// Test knob: when set, targets acknowledge shootdowns without
    /// dropping their translations.
    pub fn break_shootdowns(&self, broken: bool) {
        self.broken_shootdown.store(broken, Ordering::Relaxed);
    }

    /// Address of page `vpn` in every worker's arena.
    pub fn page_addr(&self, vpn: u64) -> usize {
        self.arena + (vpn * PAGE_SIZE_BYTES) as usize
    }

    /// Whether `vpn` is present in `cpu`'s shadow table.
    pub fn present_in(&self, cpu: usize, vpn: u64) -> bool {
        self.shadow(cpu, vpn).present()
    }

    /// The entry for `vpn` in `cpu`'s shadow table (what the design
    /// installed there).
    pub fn shadow(&self, cpu: usize, vpn: u64) -> Pte {
        self.tables[cpu].get(vpn)
    }

    /// Installs `pte` at `vpn` in this process's real table.
    fn install(&self, vpn: u64, pte: Pte) {
        self.install_frames(vpn, 1, pte);
    }

    /// Installs `pages` pages from `vpn` in this process's real table,
    /// mapping consecutive frames from `first.frame()` with `first`'s
    /// rights: one `mmap` of the range of the memfd that holds them (the
    /// callers keep a run inside one file), into a hole that
    /// [`PercoreMmu::zap`] left or over the arena's reservation,
    /// populated at once (`MAP_POPULATE` measured cheaper than a minor
    /// fault at the retried access).
    fn install_frames(&self, vpn: u64, pages: u64, first: Pte) {
        let at = self.page_addr(vpn) as *mut libc::c_void;
        let Some((fd, offset)) = self.frames.file_of(first.frame()) else {
            self.fail("the frame pool has no memfd");
        };
        // SAFETY: pages of our arena (checked by the callers against
        // ARENA_BYTES; no other mapping lies in its holes, see
        // ARENA_HINT_ADDR) replaced by a shared mapping of live frames of
        // the memfd; nothing in this process holds a reference into the
        // arena (user accesses go through the probes).
        let p = unsafe {
            libc::mmap(
                at,
                (pages * PAGE_SIZE_BYTES) as usize,
                prot_of(first),
                libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE,
                fd,
                offset as libc::off_t,
            )
        };
        if p != at {
            let e = io::Error::last_os_error();
            self.fail(&format!(
                "mmap of frames {}+{pages} at page {vpn:#x}: {e}",
                first.frame()
            ));
        }
    }

    /// Removes `vpns` from this process's real table (a local flush),
    /// leaving a hole in the arena's reservation: one `munmap`, cheaper
    /// than putting the reservation back (`mmap(PROT_NONE)` over the
    /// range: a new mapping and a merge), and the next install there
    /// needs no split. The arena lies where the kernel places nothing
    /// itself ([`ARENA_HINT_ADDR`]), so no other mapping fills the hole,
    /// and an access there faults as the reservation does.
    fn zap(&self, vpns: Range<u64>) -> bool {
        // SAFETY: a range of our arena; nothing in this process holds a
        // reference into it (user accesses go through the probes).
        unsafe {
            libc::munmap(
                self.page_addr(vpns.start) as *mut libc::c_void,
                ((vpns.end - vpns.start) * PAGE_SIZE_BYTES) as usize,
            ) == 0
        }
    }

    fn mprotect(&self, vpn: u64, prot: libc::c_int) -> bool {
        // SAFETY: a page of our arena holding an installed frame;
        // mprotect neither frees nor moves memory.
        unsafe {
            libc::mprotect(
                self.page_addr(vpn) as *mut libc::c_void,
                PAGE_SIZE_BYTES as usize,
                prot,
            ) == 0
        }
    }

    /// Makes this process's real table match its shadow over `vpns`
    /// (the shadow only ever loses entries or rights remotely). Returns
    /// false if a system call failed. Async-signal-safe: no allocation,
    /// no lock other than the shadow's spinning leaf locks.
    fn resync(&self, me: usize, vpns: Range<u64>) -> bool {
        let mut ok = true;
        let _section = PtSection::enter();
        self.tables[me].with_leaves(vpns, |pages, entries| {
            let mut run: Option<u64> = None;
            for (vpn, e) in pages.clone().zip(entries) {
                let pte = Pte::from_bits(e.load(Ordering::Acquire));
                if pte.present() {
                    if let Some(start) = run.take() {
                        ok &= self.zap(start..vpn);
                    }
                    ok &= self.mprotect(vpn, prot_of(pte));
                } else if run.is_none() {
                    run = Some(vpn);
                }
            }
            if let Some(start) = run {
                ok &= self.zap(start..pages.end);
            }
        });
        ok
    }

    /// Processes every request pending for worker `me`. Returns without
    /// doing anything if this process is already draining.
    fn drain(&self, me: usize, counter: Counter) {
        if DRAINING.swap(true, Ordering::Acquire) {
            return;
        }
        let ring = &self.rings[me];
        let mask = ring.pending.swap(0, Ordering::Acquire);
        for from in cpus_in(mask) {
            let slot = &ring.slots[from];
            let seq = slot.seq.load(Ordering::Acquire);
            let vpns = slot.start.load(Ordering::Relaxed)..slot.end.load(Ordering::Relaxed);
            if !self.broken_shootdown.load(Ordering::Relaxed) && !self.resync(me, vpns) {
                // Cannot allocate or format here (maybe in a signal
                // handler): a fixed message, then die; the parent names
                // the worker.
                self.error
                    .set("a worker could not clear its page table (munmap failed)");
                // SAFETY: _exit is async-signal-safe.
                unsafe { libc::_exit(4) };
            }
            slot.acked.store(seq, Ordering::Release);
            self.counters.add(me, counter, 1);
        }
        DRAINING.store(false, Ordering::Release);
    }

    /// Polls worker `me`'s ring (one load when nothing is pending).
    pub fn service(&self, me: usize) {
        let beat = &self.beats[me];
        beat.store(beat.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if self.rings[me].pending.load(Ordering::Acquire) != 0 {
            self.drain(me, Counter::AcksSelf);
        }
    }

    /// Services `me`'s ring, then sleeps on its futex for up to
    /// [`IDLE_SLEEP_US`] unless a request arrives (for waits that may be
    /// long: a finished worker waiting for the others).
    pub fn idle(&self, me: usize) {
        let ring = &self.rings[me];
        let seen = ring.wake.load(Ordering::SeqCst);
        ring.sleeping.store(1, Ordering::SeqCst);
        if ring.pending.load(Ordering::SeqCst) == 0 {
            xsync::futex::wait_timeout(&ring.wake, seen, Duration::from_micros(IDLE_SLEEP_US));
        }
        ring.sleeping.store(0, Ordering::SeqCst);
        self.service(me);
    }

    /// Runs `update` on worker `table`'s entry for `vpn` and, for this
    /// worker's own table, makes the change real.
    fn set_entry(&self, table: usize, vpn: u64, update: &mut dyn FnMut(Pte) -> Pte) -> Pte {
        let local = me() == Some(table);
        self.tables[table].with_entry(vpn, |entry| {
            let old = Pte::from_bits(entry.load(Ordering::Relaxed));
            let new = update(old);
            if local {
                match (old.present(), new.present()) {
                    (false, false) => {}
                    (false, true) => self.install(vpn, new),
                    (true, false) => {
                        if !self.zap(vpn..vpn + 1) {
                            self.fail("munmap of an installed page failed");
                        }
                    }
                    (true, true) if old.frame() != new.frame() => self.install(vpn, new),
                    (true, true) => {
                        if prot_of(old) != prot_of(new) && !self.mprotect(vpn, prot_of(new)) {
                            self.fail("mprotect of an installed page failed");
                        }
                    }
                }
            } else {
                // Another worker's table: only removals and downgrades
                // happen here; the owner makes them real when it
                // processes the shootdown that follows (module essay).
                assert!(
                    !new.present() || (old.present() && old.frame() == new.frame()),
                    "a design installed a page into another core's table"
                );
            }
            entry.store(new.bits(), Ordering::Release);
            new
        })
    }
    /// Clears `vpns` in worker `table`'s shadow (and, for this worker, in
    /// its real table), appending what was present to `out`.
    fn clear_table(&self, table: usize, vpns: Range<u64>, out: &mut Vec<(u64, Pte)>) {
        let local = me() == Some(table);
        self.tables[table].with_leaves(vpns, |pages, entries| {
            let mut any = false;
            for (v, e) in pages.clone().zip(entries) {
                let old = Pte::from_bits(e.swap(0, Ordering::AcqRel));
                if old.present() {
                    out.push((v, old));
                    any = true;
                }
            }
            // Still under the leaf's lock: no fault reinstalls a page of
            // it before the kernel has removed it.
            if local && any && !self.zap(pages) {
                self.fail("munmap of installed pages failed");
            }
        });
    }

    /// The workers whose tables may cache the shared table: the attached
    /// ones and this one.
    fn users(&self) -> u64 {
        self.attached.get() | me().map_or(0, |m| 1 << m)
    }

    /// Shared-table designs: the shared entry for `vpn` became `new`
    /// (under its lock). This worker's real table takes it; another
    /// worker's cached copy is dropped or downgraded in its shadow (made
    /// real by the shootdown the design sends next).
    fn propagate(&self, vpn: u64, new: Pte) {
        let me = me();
        for w in cpus_in(self.users()) {
            if Some(w) == me && new.present() {
                self.set_entry(w, vpn, &mut |_| new);
                continue;
            }
            let cached = self.tables[w].get(vpn);
            if !cached.present() || cached == new {
                continue;
            }
            self.set_entry(w, vpn, &mut |old| {
                if !old.present() || !new.present() || old.frame() != new.frame() {
                    Pte::EMPTY
                } else {
                    new
                }
            });
        }
    }

    /// Records `message` as the run's error (prefixed by the worker) and
    /// ends this worker.
    fn fail(&self, message: &str) -> ! {
        let who = me().map_or("parent".to_string(), |i| format!("worker {i}"));
        self.error.set(&format!("{who}: {message}"));
        eprintln!("radixvm percore: {who}: {message}");
        // SAFETY: ends this process without running destructors of
        // objects shared with the others (module essay).
        unsafe { libc::_exit(3) }
    }

    /// Worker `cpu`'s heartbeat (polls of its ring so far).
    pub fn beats(&self, cpu: usize) -> u64 {
        self.beats[cpu].load(Ordering::Relaxed)
    }

    /// The run's first error, if any.
    pub fn error(&self) -> Option<String> {
        self.error.get()
    }
}

impl Drop for PercoreMmu {
    fn drop(&mut self) {
        // SAFETY: our arena in this process; the address space owning this
        // MMU is gone, so nothing refers to it.
        unsafe { libc::munmap(self.arena as *mut libc::c_void, ARENA_BYTES as usize) };
    }
}

impl Mmu for PercoreMmu {
    fn describe(&self) -> &'static str {
        DESCRIPTION
    }

    fn backend(&self) -> Backend {
        Backend::Percore
    }

    fn frames(&self) -> &Arc<Frames> {
        &self.frames
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn attach(&self, cpu: usize) {
        self.attached.attach(cpu);
        // SAFETY: getpid has no preconditions.
        self.pids[cpu].store(unsafe { libc::getpid() }, Ordering::Release);
    }

    fn detach(&self, cpu: usize) {
        self.attached.detach(cpu);
    }

    fn attached(&self) -> u64 {
        self.attached.get()
    }

    fn table_of(&self, cpu: usize) -> usize {
        cpu
    }

    fn update_pte(&self, table: usize, vpn: u64, update: &mut dyn FnMut(Pte) -> Pte) -> Pte {
        assert!(
            vpn < ARENA_BYTES / PAGE_SIZE_BYTES,
            "page {vpn:#x} outside the arena"
        );
        let _section = PtSection::enter();
        if let Some(shared) = &self.shared {
            return shared.with_entry(vpn, |entry| {
                let old = Pte::from_bits(entry.load(Ordering::Relaxed));
                let new = update(old);
                entry.store(new.bits(), Ordering::Release);
                self.propagate(vpn, new);
                new
            });
        }
        self.set_entry(table, vpn, update)
    }

    fn install_run(&self, table: usize, first_vpn: u64, ptes: &[Pte]) {
        let pages = ptes.len() as u64;
        let file_frames = self.frames.file_frames();
        let one_mapping = !ptes.is_empty()
            && self.shared.is_none()
            && me() == Some(table)
            && first_vpn + pages <= ARENA_BYTES / PAGE_SIZE_BYTES
            && ptes.iter().all(|p| p.present())
            && ptes
                .windows(2)
                .all(|w| w[1].frame() == w[0].frame() + 1 && prot_of(w[1]) == prot_of(w[0]))
            // Consecutive frames in one memfd (a buddy block always is).
            && ptes[0].frame() / file_frames == (ptes[0].frame() + pages - 1) / file_frames;
        if !one_mapping {
            for (vpn, &pte) in (first_vpn..).zip(ptes) {
                self.update_pte(table, vpn, &mut |_| pte);
            }
            return;
        }
        let _section = PtSection::enter();
        for (vpn, &pte) in (first_vpn..).zip(ptes) {
            self.tables[table].with_entry(vpn, |entry| {
                let old = Pte::from_bits(entry.load(Ordering::Relaxed));
                assert!(!old.present(), "fault-around over a present page {vpn:#x}");
                entry.store(pte.bits(), Ordering::Release);
            });
        }
        // The design holds its locks of the whole run: no other core
        // changes these entries before the mapping is real.
        self.install_frames(first_vpn, pages, ptes[0]);
    }

    fn clear(&self, table: usize, vpns: Range<u64>, out: &mut Vec<(u64, Pte)>) {
        let _section = PtSection::enter();
        if let Some(shared) = &self.shared {
            shared.with_leaves(vpns, |pages, entries| {
                let mut any = false;
                for (v, e) in pages.clone().zip(entries) {
                    let old = Pte::from_bits(e.swap(0, Ordering::AcqRel));
                    if old.present() {
                        out.push((v, old));
                        any = true;
                    }
                }
                if any {
                    // Every cache of these pages goes (still under the
                    // shared leaf's lock; order: shared, then per-worker).
                    for w in cpus_in(self.users()) {
                        self.clear_table(w, pages.clone(), &mut Vec::new());
                    }
                }
            });
            return;
        }
        self.clear_table(table, vpns, out);
    }

    fn shootdown(&self, initiator: usize, targets: u64, vpns: Range<u64>) {
        // The initiator's own table was changed for real already
        // (`clear`/`update_pte` on the local table).
        let remote = targets & !(1 << initiator);
        if remote == 0 {
            return;
        }
        self.counters.add(initiator, Counter::Shootdowns, 1);
        self.counters.add(
            initiator,
            Counter::ShootdownTargets,
            remote.count_ones() as u64,
        );
        let mut waits = [0u64; MAX_CPUS];
        for t in cpus_in(remote) {
            let ring = &self.rings[t];
            let slot = &ring.slots[initiator];
            slot.start.store(vpns.start, Ordering::Relaxed);
            slot.end.store(vpns.end, Ordering::Relaxed);
            let seq = slot.seq.load(Ordering::Relaxed) + 1;
            slot.seq.store(seq, Ordering::Release);
            ring.pending.fetch_or(1 << initiator, Ordering::SeqCst);
            ring.wake.fetch_add(1, Ordering::SeqCst);
            if ring.sleeping.load(Ordering::SeqCst) != 0 {
                xsync::futex::wake(&ring.wake, xsync::futex::WAKE_ALL_WAITERS);
            }
            waits[t] = seq;
        }
        let deadline = Instant::now() + Duration::from_millis(ACK_TIMEOUT_MS);
        for t in cpus_in(remote) {
            let slot = &self.rings[t].slots[initiator];
            let mut spins = 0u64;
            while slot.acked.load(Ordering::Acquire) < waits[t] {
                // Never wait without answering: two workers may be
                // shooting each other down.
                if let Some(me) = me() {
                    self.service(me);
                }
                spins += 1;
                if spins.is_multiple_of(run::YIELD_EVERY_SPINS as u64) {
                    // The target may share this CPU (more workers than
                    // cores): let it run.
                    std::thread::yield_now();
                }
                if spins.is_multiple_of(IPI_EVERY_SPINS) {
                    let pid = self.pids[t].load(Ordering::Acquire);
                    if pid > 0 {
                        // SAFETY: kill(2) of a worker process of this run.
                        unsafe { libc::kill(pid, IPI_SIGNAL) };
                    }
                    if Instant::now() > deadline {
                        self.fail(&format!(
                            "worker {t} did not acknowledge a shootdown of pages \
                             {:#x}..{:#x} within {ACK_TIMEOUT_MS} ms",
                            vpns.start, vpns.end
                        ));
                    }
                }
                std::hint::spin_loop();
            }
        }
    }

    fn access(&self, cpu: usize, vpn: u64, offset: usize, op: Op) -> Result<u8, Miss> {
        self.service(cpu);
        if vpn >= ARENA_BYTES / PAGE_SIZE_BYTES || offset >= PAGE_SIZE_BYTES as usize {
            return Err(Miss::Fault);
        }
        #[cfg(target_arch = "x86_64")]
        {
            let p = (self.page_addr(vpn) + offset) as *mut u8;
            // SAFETY: `p` is inside the arena, mapped (possibly PROT_NONE)
            // while `self` lives; `new` installed the fault handlers.
            match unsafe { crate::mmu::probe::perform(p, op) } {
                Some(v) => Ok(v),
                None => {
                    self.counters.add(cpu, Counter::TlbMisses, 1);
                    Err(Miss::Fault)
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (cpu, op);
            unreachable!("`available` refuses off x86-64")
        }
    }

    fn page_table_pages(&self) -> u64 {
        self.tables
            .iter()
            .chain(&self.shared)
            .map(PageTable::pages)
            .sum()
    }

    fn percore(&self) -> Option<&PercoreMmu> {
        Some(self)
    }
}

extern "C" fn on_ipi(_sig: libc::c_int) {
    // SAFETY: errno is thread-local; saved and restored around the
    // system calls the drain may make.
    let errno = unsafe { *libc::__errno_location() };
    let mmu = CURRENT.load(Ordering::Acquire);
    if let Some(me) = me() {
        if !mmu.is_null() && !IN_PT.load(Ordering::Relaxed) && !on_alternate_stack() {
            // SAFETY: CURRENT is set by the worker before it attaches and
            // points at the MMU of the space the worker runs, which
            // outlives the worker (workers end with _exit).
            unsafe { &*mmu }.drain(me, Counter::AcksProxy);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Whether this signal handler runs on the alternate signal stack, i.e.
/// it interrupted another handler running there (not the probes' SIGSEGV
/// handler, which blocks every signal while it runs). A drain there could
/// overflow that small stack, and its fault would find SIGSEGV blocked
/// and kill the worker; the initiator signals again later instead.
fn on_alternate_stack() -> bool {
    // SAFETY: sigaltstack with a null new stack only reads the current
    // one into a fully initialized struct; async-signal-safe.
    unsafe {
        let mut now: libc::stack_t = std::mem::zeroed();
        libc::sigaltstack(std::ptr::null(), &mut now) == 0 && now.ss_flags & libc::SS_ONSTACK != 0
    }
}

fn install_ipi_handler() -> io::Result<()> {
    // SAFETY: sigaction with a fully initialized struct; the handler only
    // drains the ring (atomics, mmap/mprotect, spinning leaf locks).
    let rc = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_ipi as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(IPI_SIGNAL, &action, std::ptr::null_mut())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
