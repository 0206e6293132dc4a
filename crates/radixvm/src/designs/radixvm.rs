//! RadixVM (Clements, Kaashoek, Zeldovich, EuroSys 2013, §3.3-3.4):
//! operations on non-overlapping ranges share no cache lines and send no
//! shootdowns to CPUs that never touched the pages.
//!
//! *Metadata.* The address space is the `radix` map from page number to
//! per-page metadata. An mmap'ed page that was never touched holds a
//! pointer to its mapping's descriptor (`Desc`: protection, backing,
//! first page; one descriptor per mmap, folded across the range, counted
//! by the pages that refer to it). The first fault replaces it with the
//! page's own `PageMeta`: protection, frame, and the set of CPUs that may
//! cache the translation (§3.3: "the radix tree records which CPUs have
//! the page mapped"). Values are tagged pointers (low bit 0: `Desc`,
//! 1: `PageMeta`).
//!
//! *Locking (§3.4).* Every operation locks exactly the radix slots of its
//! range, left to right ([`radix::RangeGuard`]): mmap and munmap their
//! range, a fault its one page, mprotect its pages one by one. Operations
//! on disjoint ranges touch disjoint slots; operations on overlapping
//! ranges serialize. Metadata is read and written only under the lock
//! covering it.
//!
//! *Per-CPU page tables (§3.3).* CPU `i` walks only table `i`, which the
//! fault handler on CPU `i` fills, adding `i` to the page's CPU set. So
//! the CPUs whose TLBs may hold a translation are exactly those in the
//! set, and munmap shoots down only them: a page touched by one CPU is
//! unmapped with no shootdown at all (its own TLB is flushed locally).
//!
//! *munmap* (and an mmap over existing pages):
//!
//! ```text
//!  lock range ─ collect: CPU sets ∪, frames, metadata ─ unset slots
//!             ─ clear entries in the tables of those CPUs
//!             ─ shootdown(∪ of the sets) ── every target acknowledged
//!             ─ free frames and metadata ─ unlock
//! ```
//!
//! Frames are released only after the shootdown completes, so no TLB can
//! still reach them. An anonymous page's metadata holds a Refcache'd
//! reference to its frame ([`crate::frameref`]); the munmap drops it and
//! Refcache frees the frame two epochs later. Segment frames belong to
//! their segment.
//!
//! The per-page `frame_ref` locks are `xsync`'s because on the per-core
//! backend this metadata is shared between processes, where parking_lot's
//! wake-ups are lost.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use buddy::FrameNo;
use radix::{Config, RadixMap, RangeGuard};
use xsync::Mutex;

use super::count;
use crate::frameref::{self, FrameRef};
use crate::mmu::sw::SoftMmu;
use crate::mmu::{Counter, Mmu, Pte};
use crate::shootdown::cpus_in;
use crate::space::{page_range, AddrAlloc, ANYWHERE_TRIES};
use crate::{Access, AddressSpace, Backing, Design, Frames, MapAt, Prot, VmError, PAGE_SIZE_BYTES};

/// Marks a frame slot as empty.
const NO_FRAME: u64 = u64::MAX;
/// Tag bit of a `PageMeta` value (a `Desc` value has it clear).
const TAG_PAGE: u64 = 1;

/// One mmap's descriptor, shared by its untouched pages.
struct Desc {
    prot: Prot,
    backing: Backing,
    /// First page of the mapping (the backing's offset applies there).
    start: u64,
    /// Pages whose value or metadata refers to this descriptor.
    refs: AtomicU64,
}

/// One touched (or mprotect'ed) page's metadata.
struct PageMeta {
    desc: *const Desc,
    prot: AtomicU8,
    frame: AtomicU64,
    /// The Refcache'd reference to an anonymous frame.
    frame_ref: Mutex<Option<FrameRef>>,
    /// CPUs whose page tables (and so TLBs) may hold the translation.
    cpus: AtomicU64,
}

enum Value {
    Desc(*const Desc),
    Page(*const PageMeta),
}

fn decode(v: u64) -> Value {
    if v & TAG_PAGE != 0 {
        Value::Page((v & !TAG_PAGE) as *const PageMeta)
    } else {
        Value::Desc(v as *const Desc)
    }
}

fn encode_desc(d: *const Desc) -> u64 {
    let v = d as u64;
    debug_assert!(v & TAG_PAGE == 0 && v <= radix::MAX_VALUE);
    v
}

fn encode_page(m: *const PageMeta) -> u64 {
    let v = m as u64;
    debug_assert!(v & TAG_PAGE == 0 && v <= radix::MAX_VALUE);
    v | TAG_PAGE
}

/// What an unmap took out of the map, to release after the shootdown.
#[derive(Default)]
struct Taken {
    targets: u64,
    frames: Vec<FrameRef>,
    metas: Vec<*mut PageMeta>,
    descs: Vec<(*const Desc, u64)>,
}

/// Environment variable that turns on fault-around
/// ([`RadixVm::set_fault_around_pages`]) for spaces built by
/// [`crate::new_space_on`]: a power of two, at most
/// [`MAX_FAULT_AROUND_PAGES`]; 1 (the default) is one page per fault.
pub const FAULT_AROUND_ENV: &str = "RADIXVM_FAULT_AROUND_PAGES";
/// Largest fault-around block, in pages.
pub const MAX_FAULT_AROUND_PAGES: u64 = 64;

/// The fault-around block size [`FAULT_AROUND_ENV`] asks for (1 when
/// unset); `Err` says what is wrong with the value.
pub fn fault_around_from_env() -> Result<u64, String> {
    let Ok(v) = std::env::var(FAULT_AROUND_ENV) else {
        return Ok(1);
    };
    match v.trim().parse::<u64>() {
        Ok(n) if n.is_power_of_two() && n <= MAX_FAULT_AROUND_PAGES => Ok(n),
        _ => Err(format!(
            "{FAULT_AROUND_ENV}={v:?}: expected a power of two from 1 to {MAX_FAULT_AROUND_PAGES}"
        )),
    }
}

/// The RadixVM address space.
pub struct RadixVm {
    mmu: Box<dyn Mmu>,
    map: RadixMap,
    addrs: AddrAlloc,
    /// Pages a fault on an untouched anonymous page may fill at once (a
    /// power of two; 1: none around).
    fault_around_pages: u64,
}

// SAFETY: the raw pointers in the map are owned by the map's entries and
// only dereferenced under the range lock covering them (module essay);
// the descriptors' and metadata's contents are Send + Sync.
unsafe impl Send for RadixVm {}
// SAFETY: every method takes `&self` and reaches the pointed-to
// descriptors and metadata only under the range lock of their pages, whose
// shared fields are atomics or mutexes; hence shared use from many threads.
unsafe impl Sync for RadixVm {}

impl std::fmt::Debug for RadixVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RadixVm").finish_non_exhaustive()
    }
}

impl RadixVm {
    /// An empty address space with per-CPU page tables.
    pub fn new(frames: &Arc<Frames>) -> RadixVm {
        RadixVm::with_mmu(Box::new(SoftMmu::new(frames, true)))
    }

    /// An empty address space over `mmu` (built with per-CPU page tables where the
    /// backend has a choice).
    pub fn with_mmu(mmu: Box<dyn Mmu>) -> RadixVm {
        RadixVm {
            mmu,
            // sv6 never frees radix nodes; collapse would add an epoch pin
            // and a Refcache registration to every operation.
            map: RadixMap::new(Config {
                collapse: false,
                ..Config::default()
            }),
            addrs: AddrAlloc::default(),
            fault_around_pages: 1,
        }
    }

    /// Fault-around (a variant; off by default): a fault on an untouched
    /// anonymous page allocates one buddy block of consecutive frames for
    /// the largest aligned block of up to `pages` pages around it that
    /// is still untouched in the same mapping, and installs all of it in
    /// the faulting CPU's table at once, as Linux's anonymous multi-size
    /// THP does (one fault, one folio, many entries). The pages join the
    /// faulting CPU's set only. A fault on a page another CPU touched
    /// first installs, with one call, the aligned block around it whose
    /// frames the design already chose consecutively (Linux's
    /// fault-around of file pages already in the page cache). `pages` is
    /// rounded down to a power of two and capped at
    /// [`MAX_FAULT_AROUND_PAGES`].
    pub fn set_fault_around_pages(&mut self, pages: u64) {
        let pages = pages.clamp(1, MAX_FAULT_AROUND_PAGES);
        self.fault_around_pages = 1 << pages.ilog2();
    }

    /// Fault-around for `vpn` (see [`RadixVm::set_fault_around_pages`]).
    /// `None`: not applicable (not anonymous, or no block of two or more
    /// untouched pages of its mapping, or of touched pages with
    /// consecutive frames, surrounds it, or no such block of frames is
    /// free); the caller takes the one-page path.
    fn fault_around(
        &self,
        handle: &radix::Handle<'_>,
        cpu: usize,
        addr: u64,
        access: Access,
    ) -> Option<Result<(), VmError>> {
        let vpn = addr / PAGE_SIZE_BYTES;
        let mut pages = self.fault_around_pages;
        let mut block = vpn & !(pages - 1)..(vpn & !(pages - 1)) + pages;
        while block.end > self.map.key_limit() && pages > 1 {
            pages /= 2;
            block = vpn & !(pages - 1)..(vpn & !(pages - 1)) + pages;
        }
        if pages < 2 {
            return None;
        }
        // One guard per page, left to right (the order every range lock
        // takes), so each page can take its own value.
        let guards: Vec<RangeGuard<'_, '_>> =
            block.clone().map(|p| handle.lock(p..p + 1)).collect();
        let at = |p: u64| (p - block.start) as usize;
        let value = guards[at(vpn)].get(vpn)?;
        let d = match decode(value) {
            Value::Desc(d) => d,
            Value::Page(m) => {
                return self.fault_around_touched(
                    &guards,
                    block.start,
                    (cpu, addr, access),
                    m,
                    pages,
                )
            }
        };
        // SAFETY: the slot refers to `d` and we hold its lock.
        let desc = unsafe { &*d };
        if !desc.prot.allows(access) {
            return Some(Err(VmError::Protection(addr)));
        }
        if !matches!(desc.backing, Backing::Anonymous) {
            return None;
        }
        // The largest aligned sub-block around `vpn` whose every page
        // still holds this mapping's descriptor.
        let run = loop {
            let start = vpn & !(pages - 1);
            let run = start..start + pages;
            if run.clone().all(|p| guards[at(p)].get(p) == Some(value)) {
                break run;
            }
            pages /= 2;
            if pages < 2 {
                return None;
            }
        };
        let frames = self.mmu.frames();
        let order = pages.ilog2();
        let first = match frames.alloc_zeroed_block(cpu, order) {
            Err(VmError::OutOfMemory) => {
                frameref::reclaim(|| frames.alloc_zeroed_block(cpu, order)).ok()?
            }
            other => other.ok()?,
        };
        let mut ptes = Vec::with_capacity(pages as usize);
        for (frame, p) in (first..).zip(run.clone()) {
            let meta = Box::into_raw(Box::new(PageMeta {
                desc: d,
                prot: AtomicU8::new(desc.prot.bits()),
                frame: AtomicU64::new(frame),
                frame_ref: Mutex::new(Some(FrameRef::new(frames, cpu, frame))),
                cpus: AtomicU64::new(1 << cpu),
            }));
            guards[at(p)].set(encode_page(meta));
            ptes.push(Pte::new(frame, desc.prot));
        }
        self.mmu
            .install_run(self.mmu.table_of(cpu), run.start, &ptes);
        Some(Ok(()))
    }

    /// Fault-around on a page another CPU touched already (`m`): the
    /// largest aligned block of up to `pages` pages around it whose pages
    /// all have frames, consecutive in page order, from the same mapping
    /// with the same rights, and are not in this CPU's set, joins this
    /// CPU's set and goes into its table with one install. `None`: no
    /// such block of two or more pages.
    fn fault_around_touched(
        &self,
        guards: &[RangeGuard<'_, '_>],
        first_locked: u64,
        (cpu, addr, access): (usize, u64, Access),
        m: *const PageMeta,
        mut pages: u64,
    ) -> Option<Result<(), VmError>> {
        let vpn = addr / PAGE_SIZE_BYTES;
        // SAFETY: the slot refers to `m` and we hold its lock.
        let meta = unsafe { &*m };
        let prot = Prot::from_bits(meta.prot.load(Ordering::Relaxed));
        if !prot.allows(access) {
            return Some(Err(VmError::Protection(addr)));
        }
        let frame = meta.frame.load(Ordering::Relaxed);
        if frame == NO_FRAME {
            return None;
        }
        // The metadata of page `p`, if it continues `m`'s run.
        let fits = |p: u64| -> Option<&PageMeta> {
            let v = guards[(p - first_locked) as usize].get(p)?;
            let Value::Page(mp) = decode(v) else {
                return None;
            };
            // SAFETY: the slot refers to `mp` and we hold its lock.
            let other = unsafe { &*mp };
            let same = other.desc == meta.desc
                && other.prot.load(Ordering::Relaxed) == meta.prot.load(Ordering::Relaxed)
                && other.frame.load(Ordering::Relaxed) == frame.wrapping_add(p).wrapping_sub(vpn)
                && other.cpus.load(Ordering::Relaxed) & (1 << cpu) == 0;
            same.then_some(other)
        };
        let run = loop {
            let start = vpn & !(pages - 1);
            let run = start..start + pages;
            if run.clone().all(|p| fits(p).is_some()) {
                break run;
            }
            pages /= 2;
            if pages < 2 {
                return None;
            }
        };
        // SAFETY: metadata holds a reference to its descriptor.
        let shared = matches!(unsafe { &*meta.desc }.backing, Backing::Segment { .. });
        let mut ptes = Vec::with_capacity(pages as usize);
        for p in run.clone() {
            let other = fits(p).expect("checked above under the same locks");
            other.cpus.fetch_or(1 << cpu, Ordering::Relaxed);
            let pte = Pte::new(other.frame.load(Ordering::Relaxed), prot);
            ptes.push(if shared { pte.shared() } else { pte });
        }
        self.mmu
            .install_run(self.mmu.table_of(cpu), run.start, &ptes);
        Some(Ok(()))
    }

    /// Radix-map node bytes (the metadata structure's size).
    pub fn map_bytes(&self) -> usize {
        self.map.node_bytes()
    }

    /// The frame for page `vpn` of descriptor `d`, and for an anonymous
    /// page the first reference to it.
    fn obtain(
        &self,
        cpu: usize,
        d: &Desc,
        vpn: u64,
    ) -> Result<(FrameNo, Option<FrameRef>), VmError> {
        match &d.backing {
            Backing::Anonymous => {
                let frames = self.mmu.frames();
                let frame = match frames.alloc_zeroed(cpu) {
                    // Released frames may still wait for their epochs.
                    Err(VmError::OutOfMemory) => frameref::reclaim(|| frames.alloc_zeroed(cpu))?,
                    other => other?,
                };
                Ok((frame, Some(FrameRef::new(self.mmu.frames(), cpu, frame))))
            }
            Backing::Segment {
                segment,
                offset_pages,
            } => Ok((segment.frame(cpu, offset_pages + (vpn - d.start))?, None)),
        }
    }

    /// Collects what `vpns` maps and clears its page-table entries;
    /// the caller holds the range lock of `vpns` and replaces the values next.
    fn take(&self, vpns: &Range<u64>) -> Taken {
        let mut taken = Taken::default();
        let mut scratch = Vec::new();
        // Touched pages, batched into runs of consecutive pages held by
        // the same tables, so a run is cleared with one call per table
        // (one madvise on the userfaultfd backend).
        let mut run: Option<(Range<u64>, u64)> = None;
        let flush = |run: &mut Option<(Range<u64>, u64)>, scratch: &mut Vec<_>| {
            if let Some((pages, tables)) = run.take() {
                for table in cpus_in(tables) {
                    self.mmu.clear(table, pages.clone(), scratch);
                }
                scratch.clear();
            }
        };
        self.map
            .for_each_run(vpns.clone(), |r| match decode(r.value) {
                Value::Desc(d) => taken.descs.push((d, r.keys.end - r.keys.start)),
                Value::Page(m) => {
                    for vpn in r.keys.clone() {
                        // SAFETY: the caller holds the lock of `vpn`, so the
                        // metadata its slot points to is alive and ours.
                        let meta = unsafe { &*m };
                        let cpus = meta.cpus.load(Ordering::Relaxed);
                        let tables = self.tables_of(cpus);
                        match &mut run {
                            Some((pages, t)) if pages.end == vpn && *t == tables => pages.end += 1,
                            _ => {
                                flush(&mut run, &mut scratch);
                                run = Some((vpn..vpn + 1, tables));
                            }
                        }
                        taken.targets |= cpus;
                        if let Some(r) = meta.frame_ref.lock().take() {
                            taken.frames.push(r);
                        }
                        taken.metas.push(m.cast_mut());
                        taken.descs.push((meta.desc, 1));
                    }
                }
            });
        flush(&mut run, &mut scratch);
        taken
    }

    /// The page tables the CPUs in `cpus` walk, as a set.
    fn tables_of(&self, cpus: u64) -> u64 {
        cpus_in(cpus).fold(0, |set, cpu| set | 1 << self.mmu.table_of(cpu))
    }

    /// Shoots down what `take` collected, then frees it. The caller still
    /// holds the range lock (§3.4: the shootdown happens under it).
    fn release(&self, cpu: usize, vpns: Range<u64>, taken: Taken) {
        self.mmu.shootdown(cpu, taken.targets, vpns);
        frameref::release_all(taken.frames);
        for m in taken.metas {
            // SAFETY: `take` collected it from a slot since replaced under
            // the lock we hold; nothing else can reach it.
            drop(unsafe { Box::from_raw(m) });
        }
        for (d, pages) in taken.descs {
            // SAFETY: the descriptor is alive while its count is non-zero;
            // these pages' references are being given back now.
            let last = unsafe { &*d }.refs.fetch_sub(pages, Ordering::AcqRel) == pages;
            if last {
                // SAFETY: the count reached zero: no slot or metadata
                // refers to it any more.
                drop(unsafe { Box::from_raw(d.cast_mut()) });
            }
        }
    }

    fn install(&self, cpu: usize, vpn: u64, frame: FrameNo, prot: Prot, desc: &Desc) {
        let mut pte = Pte::new(frame, prot);
        if matches!(desc.backing, Backing::Segment { .. }) {
            pte = pte.shared();
        }
        self.mmu
            .update_pte(self.mmu.table_of(cpu), vpn, &mut |_| pte);
    }

    /// Whether every page of the locked range is unmapped.
    fn is_free(&self, guard: &RangeGuard<'_, '_>) -> bool {
        let mut free = true;
        self.map.for_each_run(guard.keys(), |_| free = false);
        free
    }
}

impl AddressSpace for RadixVm {
    fn design(&self) -> Design {
        Design::RadixVm
    }

    fn mmu(&self) -> &dyn Mmu {
        &*self.mmu
    }

    fn mmap(
        &self,
        cpu: usize,
        at: MapAt,
        len_bytes: u64,
        prot: Prot,
        backing: Backing,
    ) -> Result<u64, VmError> {
        count(&*self.mmu, cpu, Counter::Mmaps);
        page_range(0, len_bytes)?;
        let handle = self.map.handle();
        // A free range in this CPU's window (locked).
        let anywhere = || {
            for _ in 0..ANYWHERE_TRIES {
                let a = self.addrs.alloc(cpu, len_bytes)?;
                let g = handle.lock(page_range(a, len_bytes)?);
                if self.is_free(&g) {
                    return Ok((a, g));
                }
            }
            Err(VmError::OutOfMemory)
        };
        let (addr, guard) = match at {
            MapAt::Fixed(a) => (a, handle.lock(page_range(a, len_bytes)?)),
            MapAt::Hint(a) => {
                let hinted = page_range(a, len_bytes)
                    .ok()
                    .map(|vpns| handle.lock(vpns))
                    .filter(|g| self.is_free(g));
                match hinted {
                    Some(g) => (a, g),
                    None => anywhere()?,
                }
            }
            MapAt::Anywhere => anywhere()?,
        };
        let vpns = guard.keys();
        let pages = vpns.end - vpns.start;
        if let Backing::Segment {
            segment,
            offset_pages,
        } = &backing
        {
            if offset_pages + pages > segment.len_pages() {
                return Err(VmError::PastSegmentEnd);
            }
        }
        let desc = Box::into_raw(Box::new(Desc {
            prot,
            backing,
            start: vpns.start,
            refs: AtomicU64::new(pages),
        }));
        let taken = self.take(&vpns);
        guard.set(encode_desc(desc));
        self.release(cpu, vpns, taken);
        drop(guard);
        Ok(addr)
    }

    fn munmap(&self, cpu: usize, addr: u64, len_bytes: u64) -> Result<(), VmError> {
        count(&*self.mmu, cpu, Counter::Munmaps);
        let vpns = page_range(addr, len_bytes)?;
        let handle = self.map.handle();
        let guard = handle.lock(vpns.clone());
        let taken = self.take(&vpns);
        guard.unset();
        self.release(cpu, vpns, taken);
        drop(guard);
        Ok(())
    }

    fn mprotect(&self, cpu: usize, addr: u64, len_bytes: u64, prot: Prot) -> Result<(), VmError> {
        count(&*self.mmu, cpu, Counter::Mprotects);
        let vpns = page_range(addr, len_bytes)?;
        let handle = self.map.handle();
        // Page by page, left to right (each page's value changes on its
        // own); the guards together lock the range.
        let guards: Vec<_> = vpns.clone().map(|v| handle.lock(v..v + 1)).collect();
        if let Some(g) = guards.iter().find(|g| g.get(g.keys().start).is_none()) {
            return Err(VmError::Unmapped(g.keys().start * PAGE_SIZE_BYTES));
        }
        let mut targets = 0;
        for guard in &guards {
            let vpn = guard.keys().start;
            match decode(guard.get(vpn).expect("checked above")) {
                Value::Desc(d) => {
                    // The page's reference to `d` moves into its metadata.
                    let meta = Box::into_raw(Box::new(PageMeta {
                        desc: d,
                        prot: AtomicU8::new(prot.bits()),
                        frame: AtomicU64::new(NO_FRAME),
                        frame_ref: Mutex::new(None),
                        cpus: AtomicU64::new(0),
                    }));
                    guard.set(encode_page(meta));
                }
                Value::Page(m) => {
                    // SAFETY: `m` was read from the entry under `guard`,
                    // this page's range lock; metadata is freed only after
                    // an unmap takes it out of the entry under that lock,
                    // so it is live while `guard` is held.
                    let meta = unsafe { &*m };
                    meta.prot.store(prot.bits(), Ordering::Relaxed);
                    // Change the entries in place; the CPUs stay in the
                    // set (their tables still hold the page).
                    let cpus = meta.cpus.load(Ordering::Relaxed);
                    for table in cpus_in(self.tables_of(cpus)) {
                        self.mmu.update_pte(table, vpn, &mut |old| {
                            if old.present() {
                                old.with_prot(prot)
                            } else {
                                old
                            }
                        });
                    }
                    targets |= cpus;
                }
            }
        }
        self.mmu.shootdown(cpu, targets, vpns);
        drop(guards);
        Ok(())
    }

    fn pagefault(&self, cpu: usize, addr: u64, access: Access) -> Result<(), VmError> {
        count(&*self.mmu, cpu, Counter::Faults);
        let vpn = addr / PAGE_SIZE_BYTES;
        if vpn >= self.map.key_limit() {
            return Err(VmError::Unmapped(addr));
        }
        let handle = self.map.handle();
        if self.fault_around_pages > 1 {
            if let Some(done) = self.fault_around(&handle, cpu, addr, access) {
                return done;
            }
        }
        let guard = handle.lock(vpn..vpn + 1);
        let value = guard.get(vpn).ok_or(VmError::Unmapped(addr))?;
        match decode(value) {
            Value::Desc(d) => {
                // SAFETY: the slot refers to `d` and we hold its lock.
                let desc = unsafe { &*d };
                if !desc.prot.allows(access) {
                    return Err(VmError::Protection(addr));
                }
                let (frame, frame_ref) = self.obtain(cpu, desc, vpn)?;
                let meta = Box::into_raw(Box::new(PageMeta {
                    desc: d,
                    prot: AtomicU8::new(desc.prot.bits()),
                    frame: AtomicU64::new(frame),
                    frame_ref: Mutex::new(frame_ref),
                    cpus: AtomicU64::new(1 << cpu),
                }));
                guard.set(encode_page(meta));
                self.install(cpu, vpn, frame, desc.prot, desc);
            }
            Value::Page(m) => {
                // SAFETY: the slot refers to `m` and we hold its lock.
                let meta = unsafe { &*m };
                let prot = Prot::from_bits(meta.prot.load(Ordering::Relaxed));
                if !prot.allows(access) {
                    return Err(VmError::Protection(addr));
                }
                // SAFETY: metadata holds a reference to its descriptor.
                let desc = unsafe { &*meta.desc };
                let mut frame = meta.frame.load(Ordering::Relaxed);
                if frame == NO_FRAME {
                    let (f, r) = self.obtain(cpu, desc, vpn)?;
                    frame = f;
                    meta.frame.store(frame, Ordering::Relaxed);
                    *meta.frame_ref.lock() = r;
                }
                meta.cpus.fetch_or(1 << cpu, Ordering::Relaxed);
                self.install(cpu, vpn, frame, prot, desc);
            }
        }
        Ok(())
    }
}

impl Drop for RadixVm {
    fn drop(&mut self) {
        // No CPU is attached any more (every `Cpu` borrows the space), so
        // no shootdown is needed: free what is still mapped.
        let all = 0..self.map.key_limit();
        let taken = self.take(&all);
        self.map.unset(all.clone());
        let cpu = 0;
        let taken = Taken {
            targets: 0,
            ..taken
        };
        self.release(cpu, all, taken);
        // This thread may be no CPU at all: give its Refcache core back.
        frameref::leave();
    }
}
