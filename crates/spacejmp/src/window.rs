//! The address window: one large reservation of user address space inside
//! which every segment is mapped.
//!
//! SpaceJMP (ASPLOS'16 §4.1, "Inadvertent address collisions") avoids
//! collisions between global segments and a process's private mappings by
//! keeping them in disjoint parts of the address space. A kernel can promise
//! that; a Linux library cannot, because `mmap` without a hint may place a
//! library or a thread stack anywhere. So at initialization we *claim* a
//! range (default 16 TiB at `0x1000_0000_0000`) with
//!
//! ```text
//!   mmap(base, len, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE|MAP_FIXED_NOREPLACE)
//! ```
//!
//! which costs no memory and fails with `EEXIST` (→ [`Error::WindowTaken`])
//! instead of silently clobbering whatever is there (§2.4: "mmap does not
//! safely abort if a request is made to open a region of memory over an
//! existing region"). From then on the kernel never places anything else in
//! the window, and segments are mapped over our own placeholder with
//! `MAP_FIXED` — that replaces only pages we own. Unmapping a segment puts a
//! `PROT_NONE` placeholder back, so the hole stays reserved.
//!
//! ```text
//!  0x1000_0000_0000                                   0x2000_0000_0000
//!  |--PROT_NONE--|== seg a ==|--PROT_NONE--|== seg b ==|----PROT_NONE----|
//! ```

use crate::error::{Error, Result};
use crate::sys;
use std::os::fd::RawFd;

/// Default window base (16 TiB).
pub const DEFAULT_WINDOW_BASE: u64 = 0x1000_0000_0000;
/// Default window length (16 TiB).
pub const DEFAULT_WINDOW_LEN: u64 = 0x1000_0000_0000;
/// Alignment of window bounds and of automatically chosen segment bases
/// (2 MiB, so any segment can use huge pages).
pub const WINDOW_ALIGN: u64 = 2 << 20;

/// A reserved range of this process's address space. Unreserved on drop.
#[derive(Debug)]
pub struct Window {
    base: u64,
    len: u64,
}

impl Window {
    /// Reserve `[base, base + len)`. Fails with [`Error::WindowTaken`] if any
    /// part of the range is already mapped.
    pub fn reserve(base: u64, len: u64) -> Result<Window> {
        if !base.is_multiple_of(WINDOW_ALIGN) || !len.is_multiple_of(WINDOW_ALIGN) || len == 0 {
            return Err(Error::InvalidArgument(format!(
                "window [{base:#x}, +{len:#x}) must be non-empty and 2 MiB aligned"
            )));
        }
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping, so
        // this cannot invalidate any memory the program uses; the result is
        // checked below.
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::WindowTaken {
                base,
                len,
                errno: sys::errno(),
            });
        }
        if p as u64 != base {
            // A kernel older than 4.17 treats the flag as a hint. Give the
            // range back and report the collision.
            // SAFETY: `p` is the mapping we just created, of length `len`.
            unsafe { libc::munmap(p, len as usize) };
            return Err(Error::WindowTaken {
                base,
                len,
                errno: libc::EEXIST,
            });
        }
        Ok(Window { base, len })
    }

    /// First address of the window.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Length of the window in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the window is empty (never, once reserved).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[base, base + size)` lies inside the window.
    pub fn contains(&self, base: u64, size: u64) -> bool {
        base >= self.base
            && size <= self.len
            && base
                .checked_add(size)
                .is_some_and(|e| e <= self.base + self.len)
    }

    fn check(&self, base: u64, size: u64) -> Result<()> {
        if self.contains(base, size) {
            Ok(())
        } else {
            Err(Error::OutOfWindow {
                base,
                size,
                window_base: self.base,
                window_len: self.len,
            })
        }
    }

    /// Map `size` bytes of `fd` at `offset` to the fixed address `base`
    /// (a failure is `MapFailed` with an empty name, filled in by the caller),
    /// replacing the placeholder there. The caller (the process mapping
    /// table in `vas`) guarantees no live segment occupies the range.
    pub(crate) fn map_fixed(
        &self,
        fd: RawFd,
        offset: u64,
        base: u64,
        size: u64,
        writable: bool,
        populate: bool,
    ) -> Result<()> {
        self.check(base, size)?;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let flags = libc::MAP_SHARED | libc::MAP_FIXED;
        // SAFETY: the range is inside our reservation (checked above) and the
        // caller guarantees no segment is mapped there, so MAP_FIXED replaces
        // only our PROT_NONE placeholder and no live Rust reference points
        // into it.
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                size as usize,
                prot,
                flags,
                fd,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::MapFailed {
                name: String::new(),
                base,
                errno: sys::errno(),
            });
        }
        if populate {
            // Pre-fault with read faults (MADV_POPULATE_READ): shared memory
            // needs no write-notify, so the PTEs come out writable and later
            // writes take no fault. Kernels before 5.14 lack the advice:
            // fall back to MAP_POPULATE.
            // SAFETY: advice on our own fresh mapping; it only faults pages in.
            let r = unsafe { libc::madvise(p, size as usize, libc::MADV_POPULATE_READ) };
            if r != 0 {
                // SAFETY: as above, replacing our own mapping of the same file.
                let q = unsafe {
                    libc::mmap(
                        p,
                        size as usize,
                        prot,
                        flags | libc::MAP_POPULATE,
                        fd,
                        offset as libc::off_t,
                    )
                };
                if q == libc::MAP_FAILED {
                    return Err(Error::MapFailed {
                        name: String::new(),
                        base,
                        errno: sys::errno(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Put the placeholder back over `[base, base + size)`.
    pub(crate) fn unmap(&self, base: u64, size: u64) -> Result<()> {
        self.check(base, size)?;
        // SAFETY: the range is inside our reservation; the caller guarantees
        // that no reference into it survives (guards borrowing it are gone).
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                size as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os("unmap segment", format!("{base:#x}")));
        }
        Ok(())
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the whole range is ours; every segment mapped in it is
        // owned by the `Jmp` that owns this window and is dropped before it.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len as usize) };
    }
}
