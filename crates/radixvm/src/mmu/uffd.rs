//! The userfaultfd MMU: the designs over real page faults in a real
//! arena; the kernel keeps the page table and does the TLB work.
//!
//! *Arena.* One anonymous private mapping of [`ARENA_BYTES`] (the whole
//! designs' address range, reserved with `MAP_NORESERVE`; nothing is
//! committed until touched) is registered with a userfaultfd in MISSING
//! mode. Design address `va` is arena address `arena + va`. A page not
//! present in the process's page table is a page the design has not
//! installed, so the first touch of it is a real hardware fault that the
//! kernel hands to userfaultfd.
//!
//! *Faults: SIGBUS mode, fixed up on the faulting thread.* The uffd is
//! opened with `UFFD_FEATURE_SIGBUS`: instead of queueing the fault for a
//! handler thread, the kernel raises SIGBUS on the faulting thread. User
//! accesses go through three one-instruction probes (load, store, atomic
//! or) written in assembly; the SIGBUS (missing page) and SIGSEGV
//! (protection) handlers check that the faulting instruction is one of
//! them and, if so, move the instruction pointer to a fixup that returns
//! "fault" — the kernel's exception-table technique (`copy_from_user`).
//! [`Mmu::access`] then reports [`Miss::Fault`], and the caller runs the
//! design's `pagefault` on the same thread, outside the signal handler;
//! the design installs the page (below) and the access is retried.
//!
//! ```text
//!  Cpu::touch ─ access: probe load [arena+va] ──▶ #PF ─ kernel: uffd MISSING, SIGBUS
//!                                                   handler: rip ∈ probes → rip = fixup
//!             ◀─ Miss::Fault ─ design.pagefault(cpu, va) ─ update_pte ─ UFFDIO_COPY(frame → arena+va)
//!             ─ access again: probe load ─ hit
//! ```
//!
//! Why this and not handler threads reading the uffd: the fault is
//! handled synchronously on the faulting thread, as a kernel handles a
//! page fault on the faulting CPU, so the design's per-CPU state (its CPU
//! id, per-CPU windows, Refcache's per-thread cache) is the faulting
//! thread's; there is no wake-up of a handler thread and back per fault
//! (two context switches on a 2-core machine); and an access the design
//! refuses (unmapped, protection) becomes an error return instead of a
//! thread stuck in the kernel waiting for a resolution that must never
//! come. Running `pagefault` inside the signal handler itself would also
//! be synchronous, but it takes locks and allocates, which is only sound
//! if the interrupted code holds none; with the fixup the handler does
//! nothing but read and write the saved registers, which is
//! async-signal-safe.
//!
//! *Installs, zaps, protection.* A shadow page table (the software MMU's
//! table type, one for the process, as the kernel keeps one) records what
//! the design installed; each change is made real under that entry's
//! page-table lock:
//! * install — `UFFDIO_COPY` of the frame's contents into the arena page
//!   (`UFFDIO_ZEROPAGE` for a read-only install of an all-zero frame),
//!   then `mprotect` if the protection is not read-write;
//! * clear — `madvise(MADV_DONTNEED)` over the range: the kernel removes
//!   the entries and flushes the TLBs of every CPU running the process
//!   before it returns, so [`Mmu::shootdown`] only counts what the design
//!   asked for. A page of a segment (a frame that outlives the mapping)
//!   that was writable is copied back to its frame first, with the range
//!   made read-only so no store can slip in between;
//! * protection change of a present page — `mprotect` of that page.
//!
//! Pages not present are always read-write in the arena (a clear
//! restores that), so an install only ever has to lower protection.
//!
//! *What is real and what is not.* The faults, the page-table entries,
//! the TLBs and their shootdowns are the kernel's. The frames are the
//! `buddy` pool's, but the arena page is a *copy* of its frame: two
//! mappings of one segment page present at the same time each have their
//! own copy until unmapped (the software MMU shares the frame itself).
//! With one real page table, a page installed by one CPU is visible to
//! all: other CPUs take no fault, so RadixVM's per-page CPU sets hold only
//! the CPUs that faulted, and the design-level shootdown figures on this
//! backend count the design's requests, not the kernel's IPIs.

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::sw::PageTable;
use super::{AttachedCpus, Backend, Counter, Counters, Miss, Mmu, Op, Pte, PTE_BACKEND_BITS};
use crate::{Access, Frames, ADDRESS_LIMIT_BYTES, PAGE_SIZE_BYTES};

/// Bytes of the arena: every address a design can hand out.
pub const ARENA_BYTES: u64 = ADDRESS_LIMIT_BYTES;
/// Description used in every output line.
pub const DESCRIPTION: &str = "uffd-mmu (real faults, kernel TLB)";

/// Shadow-entry bit (backend-private): the page was writable at some
/// point since it was installed, so a shared page must be written back.
const SHADOW_WRITTEN: u64 = 1 << 4;
const _: () = assert!(SHADOW_WRITTEN & PTE_BACKEND_BITS == SHADOW_WRITTEN);

// From linux/userfaultfd.h (libc 0.2 has only SYS_userfaultfd).
const UFFD_API: u64 = 0xAA;
const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
const UFFDIO_IOCTL_TYPE: u64 = 0xAA;
const UFFDIO_API_NR: u64 = 0x3F;
const UFFDIO_REGISTER_NR: u64 = 0x00;
const UFFDIO_COPY_NR: u64 = 0x03;
const UFFDIO_ZEROPAGE_NR: u64 = 0x04;

/// `_IOWR(UFFDIO, nr, size)` from asm-generic/ioctl.h.
const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (UFFDIO_IOCTL_TYPE << 8) | nr
}

/// `struct uffdio_api`.
#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `struct uffdio_copy`.
#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// `struct uffdio_zeropage`.
#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

const UFFDIO_API: u64 = iowr(UFFDIO_API_NR, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = iowr(UFFDIO_REGISTER_NR, std::mem::size_of::<UffdioRegister>());
const UFFDIO_COPY: u64 = iowr(UFFDIO_COPY_NR, std::mem::size_of::<UffdioCopy>());
const UFFDIO_ZEROPAGE: u64 = iowr(UFFDIO_ZEROPAGE_NR, std::mem::size_of::<UffdioZeropage>());
/// `_IO(USERFAULTFD_IOC, 0x00)` on /dev/userfaultfd.
const USERFAULTFD_IOC_NEW: u64 = UFFDIO_IOCTL_TYPE << 8;
const _: () = assert!(UFFDIO_API == 0xc018_aa3f && UFFDIO_COPY == 0xc028_aa03);
const _: () = assert!(UFFDIO_REGISTER == 0xc020_aa00 && UFFDIO_ZEROPAGE == 0xc020_aa04);

/// Why the userfaultfd MMU could not be built.
#[derive(Debug)]
pub enum UffdError {
    /// This kernel or its configuration offers no usable userfaultfd
    /// (missing syscall, not permitted, no SIGBUS feature, not x86-64).
    Unavailable(String),
    /// Some other system call failed.
    Os(&'static str, io::Error),
}

impl std::fmt::Display for UffdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UffdError::Unavailable(why) => write!(f, "userfaultfd unavailable: {why}"),
            UffdError::Os(what, e) => write!(f, "userfaultfd MMU: {what}: {e}"),
        }
    }
}

impl std::error::Error for UffdError {}

/// Opens a userfaultfd: the syscall (user-mode faults only, then any),
/// then /dev/userfaultfd.
fn open_uffd() -> Result<OwnedFd, UffdError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let mut why = Vec::new();
    for extra in [UFFD_USER_MODE_ONLY, 0] {
        // SAFETY: userfaultfd(2) takes one int of flags and returns a new
        // descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | extra) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor nobody else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        why.push(format!(
            "userfaultfd(flags {:#x}): {}",
            flags | extra,
            io::Error::last_os_error()
        ));
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
    {
        Ok(dev) => {
            // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its argument
            // and returns a new descriptor or -1.
            let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
            if fd >= 0 {
                // SAFETY: a fresh descriptor nobody else owns.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            why.push(format!(
                "/dev/userfaultfd USERFAULTFD_IOC_NEW: {}",
                io::Error::last_os_error()
            ));
        }
        Err(e) => why.push(format!("/dev/userfaultfd: {e}")),
    }
    Err(UffdError::Unavailable(why.join("; ")))
}

/// The userfaultfd MMU of one address space.
pub struct UffdMmu {
    frames: Arc<Frames>,
    uffd: OwnedFd,
    arena: usize,
    /// What the design installed (one table: the process has one).
    shadow: PageTable,
    attached: AttachedCpus,
    counters: Counters,
}

impl std::fmt::Debug for UffdMmu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UffdMmu")
            .field("arena", &format_args!("{:#x}", self.arena))
            .finish_non_exhaustive()
    }
}

fn last_error(what: &'static str) -> UffdError {
    UffdError::Os(what, io::Error::last_os_error())
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

const PROT_RW: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;
const PAGE_WORDS: usize = PAGE_SIZE_BYTES as usize / 8;

impl UffdMmu {
    /// A userfaultfd MMU over a fresh arena, drawing frames from
    /// `frames`. Fails with [`UffdError::Unavailable`] where the kernel
    /// offers no userfaultfd with SIGBUS mode.
    pub fn new(frames: &Arc<Frames>) -> Result<UffdMmu, UffdError> {
        if !cfg!(target_arch = "x86_64") {
            return Err(UffdError::Unavailable(
                "the fault fixup is written for x86-64 only".into(),
            ));
        }
        let uffd = open_uffd()?;
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_SIGBUS,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes the struct we pass.
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
            return Err(UffdError::Unavailable(format!(
                "UFFDIO_API with UFFD_FEATURE_SIGBUS: {}",
                io::Error::last_os_error()
            )));
        }
        #[cfg(target_arch = "x86_64")]
        super::probe::install_handlers().map_err(|e| UffdError::Os("sigaction", e))?;
        // SAFETY: a fresh private anonymous reservation; nothing else
        // refers to it.
        let arena = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ARENA_BYTES as usize,
                PROT_RW,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if arena == libc::MAP_FAILED {
            return Err(last_error("mmap of the arena"));
        }
        let mmu = UffdMmu {
            frames: frames.clone(),
            uffd,
            arena: arena as usize,
            shadow: PageTable::new(),
            attached: AttachedCpus::default(),
            counters: Counters::default(),
        };
        let mut register = UffdioRegister {
            range: UffdioRange {
                start: mmu.arena as u64,
                len: ARENA_BYTES,
            },
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes the struct we pass; the
        // range is our arena.
        if unsafe { libc::ioctl(mmu.uffd.as_raw_fd(), UFFDIO_REGISTER as _, &mut register) } != 0 {
            return Err(UffdError::Unavailable(format!(
                "UFFDIO_REGISTER (MISSING) of an anonymous arena: {}",
                io::Error::last_os_error()
            )));
        }
        let needed = (1 << UFFDIO_COPY_NR) | (1 << UFFDIO_ZEROPAGE_NR);
        if register.ioctls & needed != needed {
            return Err(UffdError::Unavailable(
                "the arena does not support UFFDIO_COPY and UFFDIO_ZEROPAGE".into(),
            ));
        }
        Ok(mmu)
    }

    fn page_addr(&self, vpn: u64) -> usize {
        self.arena + (vpn * PAGE_SIZE_BYTES) as usize
    }

    fn mprotect(&self, vpns: &Range<u64>, prot: libc::c_int) {
        let len = ((vpns.end - vpns.start) * PAGE_SIZE_BYTES) as usize;
        // SAFETY: callers pass a page, or pages of a shadow leaf holding a
        // page, that `update_pte` installed after checking it against
        // `ARENA_BYTES`: the range lies in the arena mapping `self` owns.
        // mprotect neither frees nor moves memory, so no reference
        // into the arena can dangle (a later access faults, which the
        // probes of `Op::perform` expect).
        let rc = unsafe { libc::mprotect(self.page_addr(vpns.start) as *mut _, len, prot) };
        assert_eq!(rc, 0, "mprotect: {}", io::Error::last_os_error());
    }

    fn frame_words(&self, pte: Pte) -> &[AtomicU64] {
        // SAFETY: an installed entry's frame is live (the design frees it
        // only after clearing the entry, which takes the lock we hold);
        // frames are page-aligned and other threads access them only
        // atomically or from the kernel (UFFDIO_COPY).
        unsafe {
            std::slice::from_raw_parts(self.frames.ptr(pte.frame()).cast::<AtomicU64>(), PAGE_WORDS)
        }
    }

    /// Makes `pte` real at `vpn` (not present there now); the caller holds
    /// the entry's page-table lock.
    fn install(&self, vpn: u64, pte: Pte) {
        let dst = self.page_addr(vpn) as u64;
        let frame = self.frame_words(pte);
        let zero = !pte.writable() && frame.iter().all(|w| w.load(Ordering::Relaxed) == 0);
        loop {
            // SAFETY: the ioctls read the structs we pass; `dst` is a page
            // of our registered arena, `src` a live frame.
            let rc = unsafe {
                if zero {
                    let mut z = UffdioZeropage {
                        range: UffdioRange {
                            start: dst,
                            len: PAGE_SIZE_BYTES,
                        },
                        mode: 0,
                        zeropage: 0,
                    };
                    libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_ZEROPAGE as _, &mut z)
                } else {
                    let mut c = UffdioCopy {
                        dst,
                        src: frame.as_ptr() as u64,
                        len: PAGE_SIZE_BYTES,
                        mode: 0,
                        copy: 0,
                    };
                    libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_COPY as _, &mut c)
                }
            };
            if rc == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            // EAGAIN: the mm changed under the copy; try again.
            assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "UFFDIO_COPY: {e}");
        }
        let prot = prot_of(pte);
        if prot != PROT_RW {
            self.mprotect(&(vpn..vpn + 1), prot);
        }
    }

    /// Makes the removal of `olds` (shadow words of present entries in
    /// `vpns`, all under one held leaf lock) real.
    fn zap(&self, vpns: Range<u64>, olds: &[(u64, u64)]) {
        if olds.is_empty() {
            return;
        }
        let pte = |w: u64| Pte::from_bits(w & !PTE_BACKEND_BITS);
        let write_back: Vec<&(u64, u64)> = olds
            .iter()
            .filter(|(_, w)| pte(*w).is_shared() && w & SHADOW_WRITTEN != 0)
            .collect();
        let mut restore = olds.iter().any(|(_, w)| prot_of(pte(*w)) != PROT_RW);
        if !write_back.is_empty() {
            // Readable (PROT_NONE pages too), and no store gets in after
            // the copy.
            self.mprotect(&vpns, libc::PROT_READ);
            restore = true;
            for &&(vpn, w) in &write_back {
                let frame = self.frame_words(pte(w));
                // SAFETY: the page is present and now readable; other
                // threads only load from it (atomically or by probe).
                let page = unsafe {
                    std::slice::from_raw_parts(self.page_addr(vpn) as *const AtomicU64, PAGE_WORDS)
                };
                for (f, p) in frame.iter().zip(page) {
                    f.store(p.load(Ordering::Relaxed), Ordering::Relaxed);
                }
            }
        }
        let len = ((vpns.end - vpns.start) * PAGE_SIZE_BYTES) as usize;
        // SAFETY: a range of our arena; its contents are discarded, which
        // is the point (the kernel flushes every TLB before returning).
        let rc = unsafe {
            libc::madvise(
                self.page_addr(vpns.start) as *mut _,
                len,
                libc::MADV_DONTNEED,
            )
        };
        assert_eq!(rc, 0, "madvise: {}", io::Error::last_os_error());
        if restore {
            self.mprotect(&vpns, PROT_RW);
        }
    }
}

impl Drop for UffdMmu {
    fn drop(&mut self) {
        // SAFETY: our arena; the address space that used it is gone (it
        // owns this MMU), so nothing refers to it.
        unsafe { libc::munmap(self.arena as *mut _, ARENA_BYTES as usize) };
    }
}

impl Mmu for UffdMmu {
    fn describe(&self) -> &'static str {
        DESCRIPTION
    }

    fn backend(&self) -> Backend {
        Backend::Userfaultfd
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
        self.attached.detach(cpu);
    }

    fn attached(&self) -> u64 {
        self.attached.get()
    }

    fn table_of(&self, _cpu: usize) -> usize {
        0
    }

    fn update_pte(&self, _table: usize, vpn: u64, update: &mut dyn FnMut(Pte) -> Pte) -> Pte {
        assert!(
            vpn < ARENA_BYTES / PAGE_SIZE_BYTES,
            "page {vpn:#x} outside the arena"
        );
        self.shadow.with_entry(vpn, |entry| {
            let word = entry.load(Ordering::Relaxed);
            let old = Pte::from_bits(word & !PTE_BACKEND_BITS);
            let new = update(old);
            let mut written = word & SHADOW_WRITTEN;
            match (old.present(), new.present()) {
                (false, false) => {}
                (false, true) => {
                    self.install(vpn, new);
                    written = 0;
                }
                (true, false) => self.zap(vpn..vpn + 1, &[(vpn, word)]),
                (true, true) if old.frame() != new.frame() => {
                    self.zap(vpn..vpn + 1, &[(vpn, word)]);
                    self.install(vpn, new);
                    written = 0;
                }
                (true, true) => {
                    if prot_of(old) != prot_of(new) {
                        self.mprotect(&(vpn..vpn + 1), prot_of(new));
                    }
                }
            }
            if new.writable() {
                written = SHADOW_WRITTEN;
            }
            let stored = if new.present() {
                new.bits() | written
            } else {
                new.bits()
            };
            entry.store(stored, Ordering::Release);
            new
        })
    }

    fn clear(&self, _table: usize, vpns: Range<u64>, out: &mut Vec<(u64, Pte)>) {
        let mut olds = Vec::new();
        self.shadow.with_leaves(vpns, |pages, entries| {
            olds.clear();
            for (v, e) in pages.clone().zip(entries) {
                let word = e.swap(0, Ordering::AcqRel);
                let old = Pte::from_bits(word & !PTE_BACKEND_BITS);
                if old.present() {
                    out.push((v, old));
                    olds.push((v, word));
                }
            }
            // Still under this leaf's lock: no fault can reinstall a page
            // of it before the kernel has removed it.
            self.zap(pages, &olds);
        });
    }

    fn shootdown(&self, initiator: usize, targets: u64, _vpns: Range<u64>) {
        // The kernel flushed every TLB in `clear`/`mprotect` already;
        // count what the design asked for.
        let remote = targets & !(1 << initiator);
        if remote != 0 {
            self.counters.add(initiator, Counter::Shootdowns, 1);
            self.counters.add(
                initiator,
                Counter::ShootdownTargets,
                remote.count_ones() as u64,
            );
        }
    }

    fn access(&self, cpu: usize, vpn: u64, offset: usize, op: Op) -> Result<u8, Miss> {
        if vpn >= ARENA_BYTES / PAGE_SIZE_BYTES || offset >= PAGE_SIZE_BYTES as usize {
            return Err(Miss::Fault);
        }
        #[cfg(target_arch = "x86_64")]
        {
            let p = (self.page_addr(vpn) + offset) as *mut u8;
            // SAFETY: `p` is inside the arena, mapped while `self` lives;
            // `new` installed the fault handler.
            match unsafe { super::probe::perform(p, op) } {
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
            unreachable!("UffdMmu::new refuses to build off x86-64")
        }
    }

    fn page_table_pages(&self) -> u64 {
        self.shadow.pages()
    }
}
