//! The Linux-style baseline: one read-write lock over a tree of regions.
//!
//! As Linux's `mmap_lock` (formerly `mmap_sem`) over its VMA tree: a page
//! fault takes the lock shared for the whole fault (find the region,
//! allocate a frame, install it under the page-table lock); `mmap`,
//! `munmap` and `mprotect` take it exclusive, edit the regions, clear the
//! shared page table and shoot down every CPU using the address space
//! (`mm_cpumask`) before freeing frames. Faults on one CPU therefore wait
//! for an mmap on any other, and every fault writes the lock's shared
//! reader count: the two costs the other designs remove (RadixVM §5,
//! Bonsai §7.3).
//!
//! ```text
//!  CPU 0  munmap: write-lock ─ remove regions ─ clear PTEs ─ shootdown all ─ free ─ unlock
//!  CPU 1  fault:        read-lock ........ waits ...................................─ lookup ─ install
//! ```
//!
//! The region lock is `xsync`'s because on the per-core backend this
//! metadata is shared between processes, where parking_lot's wake-ups are lost.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use xsync::RwLock;

use super::{count, fault_shared, protect_shared, zap_shared, Region};
use crate::mmu::sw::SoftMmu;
use crate::mmu::{Counter, Mmu};
use crate::space::{page_range, AddrAlloc, ANYWHERE_TRIES};
use crate::{Access, AddressSpace, Backing, Design, Frames, MapAt, Prot, VmError, PAGE_SIZE_BYTES};

/// Regions keyed by first page.
type Regions = BTreeMap<u64, Arc<Region>>;

/// The Linux-style address space.
pub struct LinuxVm {
    mmu: Box<dyn Mmu>,
    regions: RwLock<Regions>,
    addrs: AddrAlloc,
}

impl std::fmt::Debug for LinuxVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinuxVm").finish_non_exhaustive()
    }
}

/// Regions overlapping `vpns`, by first page.
fn overlapping(regions: &Regions, vpns: &Range<u64>) -> Vec<Arc<Region>> {
    let mut out: Vec<Arc<Region>> = Vec::new();
    if let Some((_, r)) = regions.range(..vpns.start).next_back() {
        if r.end > vpns.start {
            out.push(r.clone());
        }
    }
    out.extend(regions.range(vpns.start..vpns.end).map(|(_, r)| r.clone()));
    out
}

/// Removes `vpns` from the regions (splitting at the edges; with
/// `middle`, re-inserting the inside with that protection). Returns the
/// removed regions.
fn carve(regions: &mut Regions, vpns: &Range<u64>, middle: Option<Prot>) -> Vec<Arc<Region>> {
    let old = overlapping(regions, vpns);
    for r in &old {
        regions.remove(&r.start);
        r.set(super::DEAD);
        for piece in r.carve(vpns, middle) {
            regions.insert(piece.start, Arc::new(piece));
        }
    }
    old
}

/// Whether page `vpn`'s frame (per the removed regions) is anonymous.
fn owned_in(old: &[Arc<Region>], vpn: u64) -> bool {
    old.iter()
        .any(|r| (r.start..r.end).contains(&vpn) && matches!(r.backing, Backing::Anonymous))
}

impl LinuxVm {
    /// An empty address space with a shared page table.
    pub fn new(frames: &Arc<Frames>) -> LinuxVm {
        LinuxVm::with_mmu(Box::new(SoftMmu::new(frames, false)))
    }

    /// An empty address space over `mmu` (built with a shared page table where the
    /// backend has a choice).
    pub fn with_mmu(mmu: Box<dyn Mmu>) -> LinuxVm {
        LinuxVm {
            mmu,
            regions: RwLock::new(BTreeMap::new()),
            addrs: AddrAlloc::default(),
        }
    }
}

impl AddressSpace for LinuxVm {
    fn design(&self) -> Design {
        Design::Linux
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
        let mut regions = self.regions.write();
        // A free range in this CPU's window.
        let anywhere = || {
            for _ in 0..ANYWHERE_TRIES {
                let a = self.addrs.alloc(cpu, len_bytes)?;
                let vpns = page_range(a, len_bytes)?;
                if overlapping(&regions, &vpns).is_empty() {
                    return Ok(a);
                }
            }
            Err(VmError::OutOfMemory)
        };
        let addr = match at {
            MapAt::Fixed(a) => a,
            MapAt::Hint(a) => match page_range(a, len_bytes) {
                Ok(vpns) if overlapping(&regions, &vpns).is_empty() => a,
                _ => anywhere()?,
            },
            MapAt::Anywhere => anywhere()?,
        };
        let vpns = page_range(addr, len_bytes)?;
        if let Backing::Segment {
            segment,
            offset_pages,
        } = &backing
        {
            if offset_pages + (vpns.end - vpns.start) > segment.len_pages() {
                return Err(VmError::PastSegmentEnd);
            }
        }
        let old = carve(&mut regions, &vpns, None);
        regions.insert(
            vpns.start,
            Arc::new(Region::new(vpns.clone(), prot, backing)),
        );
        if !old.is_empty() {
            zap_shared(&*self.mmu, cpu, vpns, &|v| owned_in(&old, v));
        }
        Ok(addr)
    }

    fn munmap(&self, cpu: usize, addr: u64, len_bytes: u64) -> Result<(), VmError> {
        count(&*self.mmu, cpu, Counter::Munmaps);
        let vpns = page_range(addr, len_bytes)?;
        let mut regions = self.regions.write();
        let old = carve(&mut regions, &vpns, None);
        zap_shared(&*self.mmu, cpu, vpns, &|v| owned_in(&old, v));
        Ok(())
    }

    fn mprotect(&self, cpu: usize, addr: u64, len_bytes: u64, prot: Prot) -> Result<(), VmError> {
        count(&*self.mmu, cpu, Counter::Mprotects);
        let vpns = page_range(addr, len_bytes)?;
        let mut regions = self.regions.write();
        let covered: u64 = overlapping(&regions, &vpns)
            .iter()
            .map(|r| r.end.min(vpns.end) - r.start.max(vpns.start))
            .sum();
        if covered != vpns.end - vpns.start {
            return Err(VmError::Unmapped(addr));
        }
        carve(&mut regions, &vpns, Some(prot));
        protect_shared(&*self.mmu, cpu, vpns, prot);
        Ok(())
    }

    fn pagefault(&self, cpu: usize, addr: u64, access: Access) -> Result<(), VmError> {
        count(&*self.mmu, cpu, Counter::Faults);
        let vpn = addr / PAGE_SIZE_BYTES;
        let regions = self.regions.read();
        let region = regions
            .range(..=vpn)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| r.end > vpn)
            .ok_or(VmError::Unmapped(addr))?;
        // The read lock keeps the region alive and undead.
        fault_shared(&*self.mmu, cpu, region, vpn, access).map(|_| ())
    }
}
