//! The software MMU: page tables and TLBs as data structures in memory.
//! The TLB is simulated; every figure produced with it says so.
//!
//! Page tables have the x86-64 shape: four levels of 512 entries indexed
//! by 9 bits of the virtual page number each; directories and leaves are
//! allocated on first use and counted ("page-table pages", roots not
//! counted, so unused per-CPU tables cost nothing in the figure). Each leaf has
//! a lock word, the fine-grained page-table lock of Linux's split PTL and
//! of Bonsai §5: a fault checks and installs its entry under it, and an
//! unmap clears under it. Walks take no lock (atomic loads).
//!
//! With per-CPU tables (RadixVM §3.3), CPU `i` walks and fills table `i`
//! only, so the CPUs that may hold a translation are exactly those whose
//! table holds it; with a shared table every CPU walks table 0.
//!
//! Each CPU has a TLB of [`TLB_ENTRIES`] entries, direct-mapped by the
//! page number, behind a lock that only its owner takes on the fast path.
//! An access locks its own TLB, drains its shootdown mailbox if anything
//! is posted, looks up, on a miss walks the table and fills, and performs
//! the load or store *while still holding the TLB lock*: a shootdown of
//! that translation cannot be acknowledged until the touch is done, as an
//! interrupt cannot land in the middle of one instruction.
//!
//! ```text
//!  access(cpu, vpn):  lock TLB[cpu] ─ mailbox posted? drain+flush ─ hit? ──▶ touch frame
//!                                                         └ miss: walk table ─ present? fill ─▶ touch
//!                                                                           └ no: unlock, Miss::Fault
//! ```
//!
//! The TLB locks are `xsync`'s because other CPUs take them (shootdown
//! proxies), which on the per-core backend means other processes.

use std::ops::Range;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use xsync::Mutex;

use super::{AttachedCpus, Backend, Counter, Counters, Miss, Mmu, Op, Pte};
use crate::shootdown::{cpus_in, Mailbox, PROXY_AFTER_SPINS};
use crate::{Frames, MAX_CPUS};

/// Entries in each simulated TLB (direct-mapped).
pub const TLB_ENTRIES: usize = 64;
/// A flush of more pages than this empties the whole TLB.
pub const FLUSH_ALL_ABOVE_PAGES: u64 = TLB_ENTRIES as u64;
/// Entries per page-table page.
const ENTRIES_PER_TABLE: usize = 512;
/// Bits of the page number per level.
const BITS_PER_LEVEL: u32 = 9;
/// Directory levels above the leaves.
const DIR_LEVELS: u32 = 3;

/// Description used in every output line.
pub const DESCRIPTION: &str = "sw-mmu (TLB simulated)";

struct Leaf {
    lock: AtomicBool,
    ptes: [AtomicU64; ENTRIES_PER_TABLE],
}

struct Dir {
    entries: [AtomicPtr<()>; ENTRIES_PER_TABLE],
}

/// The lock of one leaf, held while the guard lives.
struct LeafGuard<'a>(&'a Leaf);

impl Leaf {
    fn lock(&self) -> LeafGuard<'_> {
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        LeafGuard(self)
    }
}

impl Drop for LeafGuard<'_> {
    fn drop(&mut self) {
        self.0.lock.store(false, Ordering::Release);
    }
}

/// One four-level page table (also the userfaultfd backend's shadow
/// table).
pub(crate) struct PageTable {
    root: Box<Dir>,
    pages: CachePadded<AtomicU64>,
}

fn new_dir() -> Box<Dir> {
    Box::new(Dir {
        entries: [const { AtomicPtr::new(ptr::null_mut()) }; ENTRIES_PER_TABLE],
    })
}

fn new_leaf() -> Box<Leaf> {
    Box::new(Leaf {
        lock: AtomicBool::new(false),
        ptes: [const { AtomicU64::new(0) }; ENTRIES_PER_TABLE],
    })
}

fn index(vpn: u64, level: u32) -> usize {
    ((vpn >> (BITS_PER_LEVEL * (DIR_LEVELS - level))) as usize) & (ENTRIES_PER_TABLE - 1)
}

impl PageTable {
    pub(crate) fn new() -> PageTable {
        PageTable {
            root: new_dir(),
            pages: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// The leaf covering `vpn`, allocating the path when `create`.
    fn leaf(&self, vpn: u64, create: bool) -> Option<&Leaf> {
        let mut dir: &Dir = &self.root;
        for level in 0..DIR_LEVELS {
            let slot = &dir.entries[index(vpn, level)];
            let mut child = slot.load(Ordering::Acquire);
            if child.is_null() {
                if !create {
                    return None;
                }
                let fresh: *mut () = if level + 1 == DIR_LEVELS {
                    Box::into_raw(new_leaf()).cast()
                } else {
                    Box::into_raw(new_dir()).cast()
                };
                match slot.compare_exchange(
                    ptr::null_mut(),
                    fresh,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        self.pages.fetch_add(1, Ordering::Relaxed);
                        child = fresh;
                    }
                    Err(won) => {
                        // SAFETY: `fresh` came from Box::into_raw above and
                        // was never published.
                        unsafe { free_node(fresh, level + 1) };
                        child = won;
                    }
                }
            }
            if level + 1 == DIR_LEVELS {
                // SAFETY: entries at the last directory level point to
                // leaves, which live as long as the table.
                return Some(unsafe { &*child.cast::<Leaf>() });
            }
            // SAFETY: entries above the last level point to directories,
            // which live as long as the table.
            dir = unsafe { &*child.cast::<Dir>() };
        }
        unreachable!("the loop returns at the last directory level")
    }

    pub(crate) fn get(&self, vpn: u64) -> Pte {
        match self.leaf(vpn, false) {
            Some(leaf) => Pte::from_bits(leaf.ptes[index(vpn, DIR_LEVELS)].load(Ordering::Acquire)),
            None => Pte::EMPTY,
        }
    }

    /// Runs `f` on the entry for `vpn` under its leaf's lock (allocating
    /// the path).
    pub(crate) fn with_entry<R>(&self, vpn: u64, f: impl FnOnce(&AtomicU64) -> R) -> R {
        let leaf = self.leaf(vpn, true).expect("create gives a leaf");
        let _guard = leaf.lock();
        f(&leaf.ptes[index(vpn, DIR_LEVELS)])
    }

    /// For each existing leaf overlapping `vpns`, runs `f` on the pages
    /// of `vpns` it covers and their entries, under that leaf's lock.
    pub(crate) fn with_leaves(
        &self,
        vpns: Range<u64>,
        mut f: impl FnMut(Range<u64>, &[AtomicU64]),
    ) {
        let mut vpn = vpns.start;
        while vpn < vpns.end {
            let leaf_end = ((vpn / ENTRIES_PER_TABLE as u64) + 1) * ENTRIES_PER_TABLE as u64;
            let end = leaf_end.min(vpns.end);
            if let Some(leaf) = self.leaf(vpn, false) {
                let _guard = leaf.lock();
                let first = index(vpn, DIR_LEVELS);
                f(vpn..end, &leaf.ptes[first..first + (end - vpn) as usize]);
            }
            vpn = end;
        }
    }

    /// Page-table pages allocated (root not counted).
    pub(crate) fn pages(&self) -> u64 {
        self.pages.load(Ordering::Relaxed)
    }
}

/// Frees a node at `level` (1..=DIR_LEVELS; DIR_LEVELS is a leaf) and
/// everything below it.
///
/// # Safety
/// `node` came from `Box::into_raw` of a node of that level and nothing
/// else refers to it.
unsafe fn free_node(node: *mut (), level: u32) {
    if level == DIR_LEVELS {
        // SAFETY: per the contract, a leaf from Box::into_raw.
        drop(unsafe { Box::from_raw(node.cast::<Leaf>()) });
        return;
    }
    // SAFETY: per the contract, a directory from Box::into_raw.
    let dir = unsafe { Box::from_raw(node.cast::<Dir>()) };
    for entry in dir.entries.iter() {
        let child = entry.load(Ordering::Relaxed);
        if !child.is_null() {
            // SAFETY: children of a directory at `level` are nodes of
            // `level + 1`, owned by it alone.
            unsafe { free_node(child, level + 1) };
        }
    }
}

impl Drop for PageTable {
    fn drop(&mut self) {
        for entry in self.root.entries.iter() {
            let child = entry.load(Ordering::Relaxed);
            if !child.is_null() {
                // SAFETY: root children are level-1 nodes owned by the table;
                // `&mut self` means no walker remains.
                unsafe { free_node(child, 1) };
            }
        }
    }
}

#[derive(Clone, Copy)]
struct TlbEntry {
    vpn: u64,
    pte: Pte,
}

const TLB_INVALID_VPN: u64 = u64::MAX;

struct Tlb {
    entries: [TlbEntry; TLB_ENTRIES],
}

impl Tlb {
    fn new() -> Tlb {
        Tlb {
            entries: [TlbEntry {
                vpn: TLB_INVALID_VPN,
                pte: Pte::EMPTY,
            }; TLB_ENTRIES],
        }
    }

    fn slot(vpn: u64) -> usize {
        (vpn as usize) % TLB_ENTRIES
    }

    fn flush(&mut self, vpns: &Range<u64>) {
        if vpns.end - vpns.start > FLUSH_ALL_ABOVE_PAGES {
            for e in self.entries.iter_mut() {
                e.vpn = TLB_INVALID_VPN;
            }
        } else {
            for vpn in vpns.clone() {
                let e = &mut self.entries[Tlb::slot(vpn)];
                if e.vpn == vpn {
                    e.vpn = TLB_INVALID_VPN;
                }
            }
        }
    }
}

struct CpuSlot {
    tlb: Mutex<Tlb>,
    mailbox: Mailbox,
}

/// The software MMU of one address space.
pub struct SoftMmu {
    frames: Arc<Frames>,
    tables: Box<[PageTable]>,
    per_cpu_tables: bool,
    cpus: Box<[CachePadded<CpuSlot>]>,
    attached: AttachedCpus,
    counters: Counters,
}

impl std::fmt::Debug for SoftMmu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftMmu")
            .field("per_cpu_tables", &self.per_cpu_tables)
            .finish_non_exhaustive()
    }
}

impl SoftMmu {
    /// A software MMU with one table per CPU (`per_cpu_tables`) or one
    /// shared table.
    pub fn new(frames: &Arc<Frames>, per_cpu_tables: bool) -> SoftMmu {
        let tables = if per_cpu_tables { MAX_CPUS } else { 1 };
        SoftMmu {
            frames: frames.clone(),
            tables: (0..tables).map(|_| PageTable::new()).collect(),
            per_cpu_tables,
            cpus: (0..MAX_CPUS)
                .map(|_| {
                    CachePadded::new(CpuSlot {
                        tlb: Mutex::new(Tlb::new()),
                        mailbox: Mailbox::default(),
                    })
                })
                .collect(),
            attached: AttachedCpus::default(),
            counters: Counters::default(),
        }
    }

    /// Processes `cpu`'s mailbox if anything waits; the caller holds its
    /// TLB lock.
    fn drain(slot: &CpuSlot, tlb: &mut Tlb) {
        if slot.mailbox.pending() {
            slot.mailbox.drain(|vpns| tlb.flush(vpns));
        }
    }

    /// Lets `cpu` answer shootdowns while it waits for something.
    fn poll(&self, cpu: usize) {
        let slot = &self.cpus[cpu];
        if slot.mailbox.pending() {
            if let Some(mut tlb) = slot.tlb.try_lock() {
                SoftMmu::drain(slot, &mut tlb);
            }
        }
    }
}

impl Mmu for SoftMmu {
    fn describe(&self) -> &'static str {
        DESCRIPTION
    }

    fn backend(&self) -> Backend {
        Backend::Software
    }

    fn frames(&self) -> &Arc<Frames> {
        &self.frames
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn attach(&self, cpu: usize) {
        self.attached.attach(cpu);
    }

    fn detach(&self, cpu: usize) {
        let slot = &self.cpus[cpu];
        let mut tlb = slot.tlb.lock();
        SoftMmu::drain(slot, &mut tlb);
        tlb.flush(&(0..u64::MAX));
        self.attached.detach(cpu);
    }

    fn attached(&self) -> u64 {
        self.attached.get()
    }

    fn table_of(&self, cpu: usize) -> usize {
        if self.per_cpu_tables {
            cpu
        } else {
            0
        }
    }

    fn update_pte(&self, table: usize, vpn: u64, update: &mut dyn FnMut(Pte) -> Pte) -> Pte {
        self.tables[table].with_entry(vpn, |entry| {
            let new = update(Pte::from_bits(entry.load(Ordering::Relaxed)));
            // Release: a walker that sees the entry sees the zeroed frame.
            entry.store(new.bits(), Ordering::Release);
            new
        })
    }

    fn clear(&self, table: usize, vpns: Range<u64>, out: &mut Vec<(u64, Pte)>) {
        self.tables[table].with_leaves(vpns, |pages, entries| {
            for (v, e) in pages.zip(entries) {
                let old = Pte::from_bits(e.swap(0, Ordering::AcqRel));
                if old.present() {
                    out.push((v, old));
                }
            }
        });
    }

    fn shootdown(&self, initiator: usize, targets: u64, vpns: Range<u64>) {
        if targets & (1 << initiator) != 0 {
            self.cpus[initiator].tlb.lock().flush(&vpns);
        }
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
        let mut waiting: Vec<(usize, u64)> = cpus_in(remote)
            .map(|cpu| (cpu, self.cpus[cpu].mailbox.post(vpns.clone())))
            .collect();
        let mut spins = 0u32;
        while !waiting.is_empty() {
            waiting.retain(|&(cpu, seq)| {
                if self.cpus[cpu].mailbox.acked(seq) {
                    self.counters.add(initiator, Counter::AcksSelf, 1);
                    return false;
                }
                if spins >= PROXY_AFTER_SPINS {
                    // The target is in the kernel or descheduled: take its
                    // "interrupt" for it.
                    let slot = &self.cpus[cpu];
                    let mut tlb = slot.tlb.lock();
                    SoftMmu::drain(slot, &mut tlb);
                    self.counters.add(initiator, Counter::AcksProxy, 1);
                    return false;
                }
                true
            });
            self.poll(initiator);
            spins += 1;
            std::hint::spin_loop();
        }
    }

    fn access(&self, cpu: usize, vpn: u64, offset: usize, op: Op) -> Result<u8, Miss> {
        let access = op.access();
        let slot = &self.cpus[cpu];
        let mut tlb = slot.tlb.lock();
        SoftMmu::drain(slot, &mut tlb);
        let entry = tlb.entries[Tlb::slot(vpn)];
        let pte = if entry.vpn == vpn && entry.pte.permits(access) {
            entry.pte
        } else {
            self.counters.add(cpu, Counter::TlbMisses, 1);
            let pte = self.tables[self.table_of(cpu)].get(vpn);
            if !pte.permits(access) {
                return Err(Miss::Fault);
            }
            tlb.entries[Tlb::slot(vpn)] = TlbEntry { vpn, pte };
            pte
        };
        if !self.frames.is_live(pte.frame()) {
            self.counters.add(cpu, Counter::StaleTouches, 1);
            return Ok(0);
        }
        // SAFETY: offset < PAGE_SIZE_BYTES (the caller splits addresses)
        // and the frame is live and mapped: it cannot be freed until this
        // CPU's TLB lock is released and the shootdown acknowledged.
        Ok(unsafe { op.perform(self.frames.ptr(pte.frame()).add(offset)) })
    }

    fn page_table_pages(&self) -> u64 {
        self.tables.iter().map(PageTable::pages).sum()
    }
}
