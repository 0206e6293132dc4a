//! The three designs and what the two region-based ones share.
//!
//! Bonsai VM and the Linux-style design keep *regions* (VMAs: a start, an
//! end, a protection, a backing) in a search structure and a *shared*
//! page table holding the frames of anonymous pages, as Linux does; they
//! differ only in how the region structure is synchronized. RadixVM keeps
//! per-page metadata in the radix map and per-CPU page tables. The
//! helpers here are the shared-table half: fault in one page, zap a range.

pub mod bonsai;
pub mod linux;
pub mod radixvm;

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::mmu::{Counter, Mmu, Pte};
use crate::{Access, Backing, Prot, VmError};

/// A region of a region-based design (a VMA).
#[derive(Debug)]
pub struct Region {
    /// First page.
    pub start: u64,
    /// One past the last page.
    pub end: u64,
    /// Protection.
    pub prot: Prot,
    /// What the pages hold (offset of page `start`).
    pub backing: Backing,
    /// [`BORN`], [`LIVE`] or [`DEAD`]. Set to dead (before any page-table
    /// entry is cleared) when the region is removed or replaced; a fault
    /// that finds it not live under the page-table lock retries (Bonsai
    /// §5.3). A region published by an `mmap` still clearing what it
    /// replaces is born: faults on it wait for the mmap.
    pub state: AtomicU8,
}

/// Region state: inserted by an mmap that has not finished.
pub const BORN: u8 = 0;
/// Region state: in force.
pub const LIVE: u8 = 1;
/// Region state: removed or replaced.
pub const DEAD: u8 = 2;

impl Region {
    /// A live region.
    pub fn new(pages: Range<u64>, prot: Prot, backing: Backing) -> Region {
        Region {
            start: pages.start,
            end: pages.end,
            prot,
            backing,
            state: AtomicU8::new(LIVE),
        }
    }

    /// A region faults must wait for until [`Region::set`]`(LIVE)`.
    pub fn born(pages: Range<u64>, prot: Prot, backing: Backing) -> Region {
        let r = Region::new(pages, prot, backing);
        r.set(BORN);
        r
    }

    /// Changes the state (Release: PTE clears happen after).
    pub fn set(&self, state: u8) {
        self.state.store(state, Ordering::Release);
    }

    /// Whether faults may install pages of it.
    pub fn live(&self) -> bool {
        self.state.load(Ordering::Acquire) == LIVE
    }

    /// The parts of this region outside `cut`, and (with `middle`) the
    /// part inside it with protection `middle`.
    pub fn carve(&self, cut: &Range<u64>, middle: Option<Prot>) -> Vec<Region> {
        let mut out = Vec::new();
        if self.start < cut.start {
            out.push(Region::new(
                self.start..cut.start,
                self.prot,
                self.backing.clone(),
            ));
        }
        if let Some(prot) = middle {
            let (s, e) = (self.start.max(cut.start), self.end.min(cut.end));
            if s < e {
                out.push(Region::new(
                    s..e,
                    prot,
                    self.backing.advanced(s - self.start),
                ));
            }
        }
        if cut.end < self.end {
            out.push(Region::new(
                cut.end..self.end,
                self.prot,
                self.backing.advanced(cut.end - self.start),
            ));
        }
        out
    }
}

/// Whether a page-table entry came from the region's own anonymous frame
/// (so unmapping frees it) — segment frames belong to the segment.
fn owns_frames(backing: &Backing) -> bool {
    matches!(backing, Backing::Anonymous)
}

/// Faults page `vpn` of `region` into the shared page table (table 0)
/// under the page-table lock: an entry already holding a frame gets the
/// region's protection; otherwise a frame is allocated (outside the lock)
/// and installed unless another CPU did first. If the region is not live
/// (dead, or born to an mmap still running) nothing is installed and the
/// caller looks it up again (`Ok(false)`).
pub fn fault_shared(
    mmu: &dyn Mmu,
    cpu: usize,
    region: &Region,
    vpn: u64,
    access: Access,
) -> Result<bool, VmError> {
    if !region.prot.allows(access) {
        return Err(VmError::Protection(vpn * crate::PAGE_SIZE_BYTES));
    }
    let mut dead = false;
    let pte = mmu.update_pte(0, vpn, &mut |old| {
        if !region.live() {
            dead = true;
            return old;
        }
        if old.present() {
            return old.with_prot(region.prot);
        }
        old
    });
    if dead {
        return Ok(false);
    }
    if pte.present() {
        return Ok(true);
    }
    let frame = match &region.backing {
        Backing::Anonymous => mmu.frames().alloc_zeroed(cpu)?,
        Backing::Segment {
            segment,
            offset_pages,
        } => segment.frame(cpu, offset_pages + (vpn - region.start))?,
    };
    let mut used = false;
    mmu.update_pte(0, vpn, &mut |old| {
        if !region.live() {
            dead = true;
            return old;
        }
        if old.present() {
            return old;
        }
        used = true;
        let pte = Pte::new(frame, region.prot);
        if owns_frames(&region.backing) {
            pte
        } else {
            pte.shared()
        }
    });
    if !used && owns_frames(&region.backing) {
        mmu.frames().free(cpu, frame);
    }
    Ok(!dead)
}

/// Removes the translations of `vpns` from the shared table, shoots down
/// every other CPU using the address space if any were present, then frees
/// the anonymous frames. `owned` says, for a page, whether its frame is
/// the mapping's own. The caller holds the lock that keeps new faults out
/// of `vpns` (or has marked their regions dead).
pub fn zap_shared(mmu: &dyn Mmu, cpu: usize, vpns: Range<u64>, owned: &dyn Fn(u64) -> bool) {
    let mut cleared = Vec::new();
    mmu.clear(0, vpns.clone(), &mut cleared);
    if cleared.is_empty() {
        return;
    }
    mmu.shootdown(cpu, mmu.attached() | (1 << cpu), vpns);
    for (vpn, pte) in cleared {
        if owned(vpn) {
            mmu.frames().free(cpu, pte.frame());
        }
    }
}

/// Counts one event.
pub fn count(mmu: &dyn Mmu, cpu: usize, counter: Counter) {
    mmu.counters().add(cpu, counter, 1);
}

/// Sets the shared-table entries of `vpns` to `prot` (frames stay with
/// their pages) and shoots down every CPU using the address space if any
/// entry changed.
pub fn protect_shared(mmu: &dyn Mmu, cpu: usize, vpns: Range<u64>, prot: Prot) {
    let mut changed = false;
    for vpn in vpns.clone() {
        mmu.update_pte(0, vpn, &mut |old| {
            if !old.present() {
                return old;
            }
            let new = old.with_prot(prot);
            changed |= new != old;
            new
        });
    }
    if changed {
        mmu.shootdown(cpu, mmu.attached() | (1 << cpu), vpns);
    }
}
