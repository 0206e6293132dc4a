//! Virtual address spaces: attach, switch, and what a "switch" is on Linux.
//!
//! SpaceJMP §3.2/§4.1: a VAS is a first-class object, a named set of
//! segments; a process attaches a VAS (`vas_attach` → a handle), and a
//! thread switches between attached VASes (`vas_switch`), which in DragonFly
//! BSD "simply overwrites CR3 with the physical address of the page table of
//! the new VAS" after taking the locks of its lockable segments.
//!
//! **Linux gives a process one page table.** A user-space library cannot load
//! CR3, so this module realizes the design this way, and says so:
//!
//! - *Attach* maps every segment of the VAS at its base, inside the window
//!   (optionally pre-faulted with `MAP_POPULATE`). Segments shared by several
//!   attached VASes share one mapping.
//! - *Switch between VASes whose segments do not overlap* changes no mapping
//!   at all: all their segments are mapped at once in the one page table.
//!   The switch takes the locks of the target's lockable segments (shared
//!   for read-only, exclusive for writable), after releasing those of the
//!   VAS the thread leaves, and records the active VAS for the thread. This
//!   is the part of SpaceJMP that is real here, and it is cheap.
//! - *Switch between VASes whose segments overlap* (two segments at the same
//!   address, e.g. a `seg_clone`) must replace one mapping by the other. That
//!   is a **process-wide remap** (`mmap MAP_FIXED` of the other file), not a
//!   per-thread CR3 write: every thread of the process sees the change. So
//!   it is serialized by the process mapping table's mutex, refused with
//!   [`Error::Busy`] while another thread is inside a VAS that uses the
//!   range, and counted in [`Stats::remaps`]. A kernel implementation would
//!   let two threads sit in the two overlapping VASes at once; we cannot.
//! - A thread that is in no VAS sees only the "common region" (its stack,
//!   code, globals, heap) — segment data may still be mapped, but the type
//!   system ([`SegPtr::get`](crate::SegPtr::get) needs an [`Active`]) keeps
//!   it from being used outside a switch.
//!
//! ```text
//!  thread:   switch(A) ──────── drop ── switch(B) ────── drop ── switch(A')
//!  locks:    lock A.segs        unlock   lock B.segs     unlock   lock A'.segs
//!  mappings: (A, B mapped at attach; nothing changes) ...  A' overlaps A: remap
//! ```
//!
//! Access modes are per VAS in the registry; the mapping of a segment shared
//! by several attached VASes is writable if any of them writes it (the
//! kernel would keep one page table per VAS). Writes through the API are
//! still only allowed where the active VAS attached the segment writable.

use crate::error::{Error, Result};
use crate::heap::{HeapState, SegPtr, SegSafe};
use crate::lock::{Acquired, Mode};
use crate::registry::VasInfo;
use crate::segment::{self, Access, Header, SegInfo};
use crate::Jmp;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Counters of this process's VAS activity.
#[derive(Debug, Default)]
pub struct Stats {
    /// Completed switches.
    pub switches: AtomicU64,
    /// Switches that had to remap an overlapping range (process-wide).
    pub remaps: AtomicU64,
    /// Bytes remapped by those switches.
    pub remapped_bytes: AtomicU64,
    /// Segment lock acquisitions made by switches.
    pub lock_acquisitions: AtomicU64,
    /// Acquisitions that found a dead previous writer.
    pub owner_died: AtomicU64,
}

/// A plain copy of [`Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub switches: u64,
    pub remaps: u64,
    pub remapped_bytes: u64,
    pub lock_acquisitions: u64,
    pub owner_died: u64,
}

impl Stats {
    /// Read all counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            switches: self.switches.load(Ordering::Relaxed),
            remaps: self.remaps.load(Ordering::Relaxed),
            remapped_bytes: self.remapped_bytes.load(Ordering::Relaxed),
            lock_acquisitions: self.lock_acquisitions.load(Ordering::Relaxed),
            owner_died: self.owner_died.load(Ordering::Relaxed),
        }
    }
}

/// One segment currently mapped in the window.
struct Mapped {
    name: String,
    size: u64,
    writable: bool,
    /// Attached handles that include this segment.
    handles: usize,
    /// Threads currently inside a VAS that includes it.
    active: usize,
}

/// The process mapping table: which segment occupies which range.
#[derive(Default)]
pub(crate) struct Space {
    mapped: BTreeMap<u64, Mapped>,
}

impl Space {
    /// Ranges overlapping `[base, base+size)`, by base.
    fn overlapping(&self, base: u64, size: u64) -> Vec<u64> {
        self.mapped
            .range(..base + size)
            .filter(|(b, m)| **b + m.size > base)
            .map(|(b, _)| *b)
            .collect()
    }
}

/// Options for `vas_attach`.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttachOptions {
    /// Pre-fault every page (`MAP_POPULATE`).
    pub prefault: bool,
}

struct HandleSeg {
    info: SegInfo,
    access: Access,
    file: File,
}

/// An attached VAS (`vas_attach` → `vh`). Detached on drop.
pub struct VasHandle<'j> {
    jmp: &'j Jmp,
    name: String,
    segs: Vec<HandleSeg>,
    prefault: bool,
}

thread_local! {
    static CURRENT: Cell<Option<*const ()>> = const { Cell::new(None) };
}

fn map_seg(jmp: &Jmp, sp: &mut Space, s: &HandleSeg, prefault: bool) -> Result<()> {
    let w = s.access == Access::Write;
    let fd = s.file.as_raw_fd();
    let hs = s.info.header_size;
    let named = |e: Error| match e {
        Error::MapFailed { base, errno, .. } => Error::MapFailed {
            name: s.info.name.clone(),
            base,
            errno,
        },
        e => e,
    };
    if w {
        // Header and data share one protection: one mmap.
        jmp.window()
            .map_fixed(fd, 0, s.info.base, s.info.size, true, prefault)
            .map_err(named)?;
    } else {
        jmp.window()
            .map_fixed(fd, 0, s.info.base, hs, true, prefault)
            .map_err(named)?;
    }
    if w {
        // Done above.
    } else if let Err(e) =
        jmp.window()
            .map_fixed(fd, hs, s.info.base + hs, s.info.size - hs, w, prefault)
    {
        let _ = jmp.window().unmap(s.info.base, hs);
        return Err(named(e));
    }
    sp.mapped.insert(
        s.info.base,
        Mapped {
            name: s.info.name.clone(),
            size: s.info.size,
            writable: w,
            handles: 0,
            active: 0,
        },
    );
    Ok(())
}

impl<'j> VasHandle<'j> {
    pub(crate) fn attach(jmp: &'j Jmp, vas: &VasInfo, opts: AttachOptions) -> Result<Self> {
        let snap = jmp.registry().snapshot()?;
        let mut segs = Vec::new();
        for (name, access) in &vas.segs {
            let info = snap.seg(name)?.clone();
            let file = segment::open_file(jmp.registry().dir(), &info, *access)?;
            segs.push(HandleSeg {
                info,
                access: *access,
                file,
            });
        }
        let h = VasHandle {
            jmp,
            name: vas.name.clone(),
            segs: Vec::new(),
            prefault: opts.prefault,
        };
        let mut h = h;
        for s in segs {
            h.add(s)?;
        }
        Ok(h)
    }

    /// Map (or share the mapping of) one segment for this handle.
    fn add(&mut self, s: HandleSeg) -> Result<()> {
        let mut sp = self.jmp.space();
        let ov = sp.overlapping(s.info.base, s.info.size);
        let same = ov.len() == 1
            && ov[0] == s.info.base
            && sp.mapped[&ov[0]].name == s.info.name
            && sp.mapped[&ov[0]].size == s.info.size;
        if same {
            let m = sp.mapped.get_mut(&s.info.base).ok_or_else(|| {
                Error::InvalidArgument("mapping table changed under its lock".into())
            })?;
            if s.access == Access::Write && !m.writable {
                let hs = s.info.header_size;
                // SAFETY: the range is our own mapping of this segment's
                // data; widening protection invalidates no reference.
                let r = unsafe {
                    libc::mprotect(
                        (s.info.base + hs) as *mut libc::c_void,
                        (s.info.size - hs) as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                    )
                };
                if r != 0 {
                    return Err(Error::MapFailed {
                        name: s.info.name.clone(),
                        base: s.info.base,
                        errno: crate::sys::errno(),
                    });
                }
                m.writable = true;
            }
            m.handles += 1;
        } else if ov.is_empty() {
            map_seg(self.jmp, &mut sp, &s, self.prefault)?;
            if let Some(m) = sp.mapped.get_mut(&s.info.base) {
                m.handles += 1;
            }
        }
        // Otherwise an overlapping segment of another VAS is mapped there:
        // this one is mapped by the first switch into this VAS (a remap).
        drop(sp);
        self.segs.push(s);
        Ok(())
    }

    /// `seg_attach(vh, sid)`: add a segment to this attached VAS only (the
    /// registry's VAS is unchanged).
    pub fn seg_attach(&mut self, seg: &str, access: Access) -> Result<()> {
        let info = self.jmp.registry().seg_find(seg)?;
        if let Some(o) = self
            .segs
            .iter()
            .find(|o| o.info.name != seg && o.info.overlaps(info.base, info.size))
        {
            return Err(Error::AddressInUse {
                base: info.base,
                size: info.size,
                by: format!("segment `{}` of this VAS", o.info.name),
            });
        }
        if self.segs.iter().any(|o| o.info.name == seg) {
            return Err(Error::NameExists {
                kind: "segment in VAS",
                name: seg.to_string(),
            });
        }
        let file = segment::open_file(self.jmp.registry().dir(), &info, access)?;
        self.add(HandleSeg { info, access, file })
    }

    /// The VAS's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Segments with their access modes.
    pub fn segments(&self) -> impl Iterator<Item = (&SegInfo, Access)> {
        self.segs.iter().map(|s| (&s.info, s.access))
    }

    /// `vas_switch`: enter this VAS on the calling thread. Takes the locks of
    /// its lockable segments (blocking); the returned guard releases them.
    pub fn switch(&self) -> Result<Active<'_>> {
        self.switch_until(None)
    }

    /// `vas_switch` with a deadline for the segment locks.
    pub fn switch_until(&self, deadline: Option<Instant>) -> Result<Active<'_>> {
        if let Some(cur) = CURRENT.with(|c| c.get()) {
            let _ = cur;
            return Err(Error::AlreadyActive {
                vas: "(another VAS)".into(),
            });
        }
        let mut remapped = 0u64;
        {
            let mut sp = self.jmp.space();
            // Check every segment first so a refusal changes nothing.
            let mut to_map = Vec::new();
            for (i, s) in self.segs.iter().enumerate() {
                let ov = sp.overlapping(s.info.base, s.info.size);
                let same =
                    ov.len() == 1 && ov[0] == s.info.base && sp.mapped[&ov[0]].name == s.info.name;
                if same {
                    continue;
                }
                for b in &ov {
                    let m = &sp.mapped[b];
                    if m.active > 0 {
                        return Err(Error::Busy {
                            base: *b,
                            size: m.size,
                            holder: format!("segment `{}`", m.name),
                        });
                    }
                }
                to_map.push((i, ov));
            }
            for (i, ov) in to_map {
                let s = &self.segs[i];
                for b in ov {
                    if let Some(m) = sp.mapped.remove(&b) {
                        // A displaced mapping inside the new range is
                        // replaced by the MAP_FIXED below; only parts
                        // outside it need the placeholder back.
                        if b < s.info.base || b + m.size > s.info.end() {
                            self.jmp.window().unmap(b, m.size)?;
                        }
                    }
                }
                map_seg(self.jmp, &mut sp, s, self.prefault)?;
                if let Some(m) = sp.mapped.get_mut(&s.info.base) {
                    // Handles of the displaced segment keep their claim in
                    // their own lists; this mapping belongs to us now.
                    m.handles = 1;
                }
                remapped += s.info.size;
                self.jmp.stats().remaps.fetch_add(1, Ordering::Relaxed);
            }
            for s in &self.segs {
                if let Some(m) = sp.mapped.get_mut(&s.info.base) {
                    m.active += 1;
                }
            }
        }
        if remapped > 0 {
            self.jmp
                .stats()
                .remapped_bytes
                .fetch_add(remapped, Ordering::Relaxed);
        }
        let mut active = Active {
            h: self,
            held: Vec::new(),
            owner_died: Vec::new(),
            _not_send: PhantomData,
        };
        // Lock in a global order (base, name) so two processes switching into
        // VASes that share several lockable segments cannot deadlock.
        let mut order: Vec<usize> = (0..self.segs.len())
            .filter(|&i| self.segs[i].info.lockable())
            .collect();
        order.sort_by(|&a, &b| {
            (self.segs[a].info.base, &self.segs[a].info.name)
                .cmp(&(self.segs[b].info.base, &self.segs[b].info.name))
        });
        for i in order {
            let mode = match self.segs[i].access {
                Access::Read => Mode::Shared,
                Access::Write => Mode::Exclusive,
            };
            let acq: Acquired = active.header(i).lock.lock(mode, deadline)?;
            self.jmp
                .stats()
                .lock_acquisitions
                .fetch_add(1, Ordering::Relaxed);
            if acq.owner_died {
                self.jmp.stats().owner_died.fetch_add(1, Ordering::Relaxed);
                active.owner_died.push(i);
            }
            active.held.push((i, mode));
        }
        CURRENT.with(|c| c.set(Some(self as *const _ as *const ())));
        self.jmp.stats().switches.fetch_add(1, Ordering::Relaxed);
        Ok(active)
    }
}

impl Drop for VasHandle<'_> {
    fn drop(&mut self) {
        let mut sp = self.jmp.space();
        for s in &self.segs {
            let gone = match sp.mapped.get_mut(&s.info.base) {
                Some(m) if m.name == s.info.name => {
                    m.handles = m.handles.saturating_sub(1);
                    m.handles == 0 && m.active == 0
                }
                _ => false,
            };
            if gone {
                sp.mapped.remove(&s.info.base);
                let _ = self.jmp.window().unmap(s.info.base, s.info.size);
            }
        }
    }
}

/// The calling thread is inside a VAS: the guard returned by
/// [`VasHandle::switch`]. References into segments borrow it, so they cannot
/// outlive the switch. Dropping it releases the segment locks and leaves the
/// VAS. Not `Send`: a VAS is entered by a thread.
pub struct Active<'h> {
    h: &'h VasHandle<'h>,
    held: Vec<(usize, Mode)>,
    owner_died: Vec<usize>,
    _not_send: PhantomData<*const ()>,
}

impl<'h> Active<'h> {
    fn header(&self, i: usize) -> &Header {
        // SAFETY: segment `i` of the handle is mapped at its base (the switch
        // mapped it and no remap can displace it while `active > 0`), and the
        // header page is mapped readable and writable.
        unsafe { &*(self.h.segs[i].info.base as *const Header) }
    }

    fn index(&self, seg: &str) -> Result<usize> {
        self.h
            .segs
            .iter()
            .position(|s| s.info.name == seg)
            .ok_or_else(|| Error::NotFound {
                kind: "segment in active VAS",
                name: seg.to_string(),
            })
    }

    /// The active VAS's name.
    pub fn vas_name(&self) -> &str {
        &self.h.name
    }

    /// Leave this VAS and enter `other` (`vas_switch` from one to the other).
    pub fn switch_to<'o>(self, other: &'o VasHandle<'o>) -> Result<Active<'o>> {
        drop(self);
        other.switch()
    }

    /// Whether the lock of `seg` was taken from a writer that died (its data
    /// may be inconsistent; repair it and call [`Active::mark_consistent`]).
    pub fn owner_died(&self, seg: &str) -> Result<bool> {
        let i = self.index(seg)?;
        Ok(self.owner_died.contains(&i))
    }

    /// Whether any segment's previous writer died.
    pub fn any_owner_died(&self) -> bool {
        !self.owner_died.is_empty()
    }

    /// Declare `seg` consistent again (requires holding it for writing).
    pub fn mark_consistent(&mut self, seg: &str) -> Result<()> {
        let i = self.index(seg)?;
        if !self.held.contains(&(i, Mode::Exclusive)) {
            return Err(Error::PermissionDenied {
                name: seg.to_string(),
                detail: "mark_consistent needs the segment attached writable and lockable".into(),
            });
        }
        self.header(i).lock.mark_consistent();
        self.owner_died.retain(|&j| j != i);
        Ok(())
    }

    /// Check that `[addr, addr+len)` lies in one segment's data area of this
    /// VAS, is aligned to `align`, and (if `write`) is attached writable.
    pub fn check(&self, addr: u64, len: u64, align: u64, write: bool) -> Result<()> {
        if align > 1 && !addr.is_multiple_of(align) {
            return Err(Error::BadPointer { addr });
        }
        for s in &self.h.segs {
            let i = &s.info;
            if addr >= i.data_start() && addr.checked_add(len).is_some_and(|e| e <= i.end()) {
                if write && s.access != Access::Write {
                    return Err(Error::PermissionDenied {
                        name: i.name.clone(),
                        detail: "segment is attached read-only in this VAS".into(),
                    });
                }
                return Ok(());
            }
        }
        Err(Error::BadPointer { addr })
    }

    /// The paper's `vcast`: a raw pointer checked to lie in this VAS, as a
    /// reference valid while the guard lives.
    pub fn vcast<T: SegSafe>(&self, p: *const T) -> Result<&T> {
        SegPtr::<T>::from_addr(p as u64).get(self)
    }

    fn heap_of(&self, i: usize) -> Result<&HeapState> {
        if self.h.segs[i].access != Access::Write {
            return Err(Error::PermissionDenied {
                name: self.h.segs[i].info.name.clone(),
                detail: "allocation needs the segment attached writable".into(),
            });
        }
        Ok(&self.header(i).heap)
    }

    pub(crate) fn seg_base(&self, seg: &str) -> Result<u64> {
        Ok(self.h.segs[self.index(seg)?].info.base)
    }

    pub(crate) fn seg_name_at(&self, base: u64) -> Result<String> {
        self.h
            .segs
            .iter()
            .find(|s| s.info.base == base)
            .map(|s| s.info.name.clone())
            .ok_or(Error::BadPointer { addr: base })
    }

    pub(crate) fn seg_end_at(&self, base: u64) -> Result<u64> {
        self.h
            .segs
            .iter()
            .find(|s| s.info.base == base)
            .map(|s| s.info.end())
            .ok_or(Error::BadPointer { addr: base })
    }

    /// `m_malloc`: `size` bytes (16-aligned) in `seg`'s heap.
    pub fn alloc_raw(&mut self, seg: &str, size: u64) -> Result<u64> {
        let i = self.index(seg)?;
        self.heap_of(i)?.alloc(size).ok_or_else(|| Error::HeapFull {
            name: seg.to_string(),
            requested: size,
        })
    }

    /// `m_free`: free a block from whichever segment of this VAS holds it
    /// (allocated by any process).
    pub fn free_raw(&mut self, addr: u64) -> Result<()> {
        self.check(addr, 1, 16, true)?;
        let i = self
            .h
            .segs
            .iter()
            .position(|s| addr >= s.info.data_start() && addr < s.info.end())
            .ok_or(Error::BadPointer { addr })?;
        self.heap_of(i)?.free(addr)
    }

    /// Allocate a `T` in `seg` and move `v` there.
    pub fn alloc<T: SegSafe>(&mut self, seg: &str, v: T) -> Result<SegPtr<T>> {
        if std::mem::align_of::<T>() > 16 {
            return Err(Error::InvalidArgument("alignment above 16".into()));
        }
        let a = self.alloc_raw(seg, (std::mem::size_of::<T>() as u64).max(1))?;
        // SAFETY: a fresh, 16-aligned, writable block of size_of::<T>().
        unsafe { (a as *mut T).write(v) };
        Ok(SegPtr::from_addr(a))
    }

    /// Free a `T` allocated with [`Active::alloc`].
    pub fn free<T: SegSafe>(&mut self, p: SegPtr<T>) -> Result<()> {
        self.free_raw(p.addr())
    }

    /// The segment's root pointer (0 / null if never set).
    pub fn root<T>(&self, seg: &str) -> Result<SegPtr<T>> {
        let i = self.index(seg)?;
        Ok(SegPtr::from_addr(
            self.header(i).root.load(Ordering::Acquire),
        ))
    }

    /// Set the segment's root pointer (segment attached writable).
    pub fn set_root<T>(&mut self, seg: &str, p: SegPtr<T>) -> Result<()> {
        let i = self.index(seg)?;
        self.heap_of(i)?;
        self.header(i).root.store(p.addr(), Ordering::Release);
        Ok(())
    }

    /// Heap usage of `seg`: (live bytes, never-used bytes).
    pub fn heap_usage(&self, seg: &str) -> Result<(u64, u64)> {
        let i = self.index(seg)?;
        let h = &self.header(i).heap;
        Ok((h.live_bytes(), h.unused_bytes()))
    }

    /// The data area of `seg` as bytes (read). For a lockable segment the
    /// switch's lock excludes writers; a non-lockable segment is plain shared
    /// memory that other processes may write at any time (use atomics there).
    pub fn bytes(&self, seg: &str) -> Result<&[u8]> {
        let s = &self.h.segs[self.index(seg)?].info;
        // SAFETY: the data area is mapped readable while the guard lives.
        Ok(unsafe {
            std::slice::from_raw_parts(
                s.data_start() as *const u8,
                (s.size - s.header_size) as usize,
            )
        })
    }

    /// The data area of `seg` as bytes (write; attached writable).
    pub fn bytes_mut(&mut self, seg: &str) -> Result<&mut [u8]> {
        let i = self.index(seg)?;
        self.heap_of(i)?;
        let s = &self.h.segs[i].info;
        // SAFETY: mapped writable (access Write) while the guard lives;
        // `&mut self` makes this the only reference from this thread.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(
                s.data_start() as *mut u8,
                (s.size - s.header_size) as usize,
            )
        })
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        for &(i, mode) in self.held.iter().rev() {
            self.header(i).lock.unlock(mode);
        }
        let mut sp = self.h.jmp.space();
        for s in &self.h.segs {
            if let Some(m) = sp.mapped.get_mut(&s.info.base) {
                if m.name == s.info.name {
                    m.active = m.active.saturating_sub(1);
                }
            }
        }
        drop(sp);
        CURRENT.with(|c| c.set(None));
    }
}
