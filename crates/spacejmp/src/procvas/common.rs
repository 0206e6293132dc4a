//! Memory shared by the home process and every VAS process forked after
//! it: the lanes' stacks and control blocks, and whatever the application
//! passes between them.

use crate::error::{Error, Result};

/// Memory common to the home process and every VAS process of runtimes
/// started after it: a zeroed anonymous `MAP_SHARED` mapping, which a fork
/// inherits at the same address. Use it for what the lane and other threads
/// of the application share (flags, barriers, results); it is unmapped when
/// dropped, so drop it only after the runtimes that use it.
pub struct CommonMem {
    addr: usize,
    len: usize,
}

impl CommonMem {
    /// Map `len` bytes (rounded up to pages), zeroed.
    pub fn new(len: usize) -> Result<CommonMem> {
        let page = crate::sys::page_size() as usize;
        let len = len.max(1).div_ceil(page) * page;
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os("mmap (common memory)", "anonymous"));
        }
        Ok(CommonMem {
            addr: p as usize,
            len,
        })
    }

    /// Its address (the same in every process forked after `new`).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for CommonMem {
    fn drop(&mut self) {
        // SAFETY: our own mapping; the caller drops it after the runtimes
        // that use it.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}
