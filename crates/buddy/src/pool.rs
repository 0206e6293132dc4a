//! The frame pool: one large mapping cut into 4 KiB frames.
//!
//! "Physical memory" in this project is this mapping; a frame number is an
//! offset into it divided by 4 KiB. The mapping is anonymous by default
//! (private, `MAP_NORESERVE`, aligned to 2 MiB so transparent huge pages can
//! back it), or shared over a memfd, a file on hugetlbfs, or an ordinary
//! file, so that other processes can map the same frames.
//!
//! A shared pool can also be cut into several memfds ([`Backing::Memfds`]):
//! `n` files of `frames / n` frames each, mapped back to back, so the pool
//! is still one range of addresses and frame `f` lives in file
//! `f / (frames / n)` at page `f % (frames / n)` ([`FramePool::file_of`]).
//! When the parts coincide with the distributed allocator's ownership
//! ranges, each CPU's heap has a file of its own, and the kernel's per-file
//! state (the file's mapping tree and its lock) is not shared by processes
//! that map mostly their own heap's frames.
//!
//! [`PooledAllocator`] pairs a pool with any [`FrameAllocator`] and hands out
//! [`Block`]s that carry their address.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::ptr::NonNull;

use crate::{
    new_allocator, AllocError, AllocatorKind, BuddyConfig, FrameAllocator, FrameNo, FreeError,
    Stats, FRAME_SHIFT, FRAME_SIZE_BYTES,
};

/// Alignment of the anonymous mapping: one x86-64 huge page.
const ANON_ALIGN_BYTES: usize = 2 << 20;

/// What backs the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Backing {
    /// Private anonymous memory (the default).
    #[default]
    Anonymous,
    /// A memfd, shared; its fd can be passed to another process.
    Memfd,
    /// This many memfds, shared, each holding an equal part of the frames
    /// (the frame count must be a multiple of it): file `k` holds frames
    /// `[k * part, (k + 1) * part)`, mapped back to back.
    Memfds(usize),
    /// A file created at this path on a hugetlbfs mount (2 MiB pages).
    HugeTlbfs(PathBuf),
    /// A file at this path on any file system, mapped shared.
    File(PathBuf),
}

/// How to build a pool.
#[derive(Clone, Debug, Default)]
pub struct PoolConfig {
    /// Size in bytes; rounded down to whole frames.
    pub bytes: usize,
    /// What backs it.
    pub backing: Backing,
    /// Pre-fault every page at creation (`MAP_POPULATE`).
    pub populate: bool,
}

/// A mapping cut into frames. Unmapped on drop.
pub struct FramePool {
    base: NonNull<u8>,
    frames: u64,
    map_addr: *mut libc::c_void,
    map_len: usize,
    /// The files backing the pool, in frame order (none when anonymous).
    fds: Vec<OwnedFd>,
    /// Frames per file (the whole pool when there is one file).
    file_frames: u64,
    backing: Backing,
}

// SAFETY: the pool is a plain range of memory; it holds no thread-affine
// state, and concurrent access to frames is governed by whoever allocated them.
unsafe impl Send for FramePool {}
// SAFETY: as above; `&FramePool` only exposes addresses and sizes.
unsafe impl Sync for FramePool {}

fn last_os_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl FramePool {
    /// Map a new pool.
    pub fn new(config: &PoolConfig) -> io::Result<Self> {
        let frames = (config.bytes / FRAME_SIZE_BYTES) as u64;
        if frames == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pool of {} bytes holds no 4 KiB frame", config.bytes),
            ));
        }
        let len = frames as usize * FRAME_SIZE_BYTES;
        let populate = if config.populate {
            libc::MAP_POPULATE
        } else {
            0
        };
        match &config.backing {
            Backing::Anonymous => Self::map_anonymous(len, frames, populate),
            Backing::Memfd => Self::map_fd(new_memfd()?, len, frames, populate, Backing::Memfd),
            &Backing::Memfds(files) => Self::map_memfds(files, len, frames, populate),
            Backing::HugeTlbfs(path) | Backing::File(path) => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
                Self::map_fd(file.into(), len, frames, populate, config.backing.clone())
            }
        }
    }

    fn map_anonymous(len: usize, frames: u64, populate: i32) -> io::Result<Self> {
        // Reserve extra so the base can be aligned, then trim both ends.
        let reserve = len + ANON_ALIGN_BYTES;
        // SAFETY: a fresh private anonymous mapping at a kernel-chosen address
        // aliases nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_os_error("mmap(anonymous pool)"));
        }
        let start = p as usize;
        let aligned = (start + ANON_ALIGN_BYTES - 1) & !(ANON_ALIGN_BYTES - 1);
        let head = aligned - start;
        let tail = reserve - head - len;
        // SAFETY: both ranges lie inside the mapping made above and are not
        // used by anyone; unmapping them leaves `[aligned, aligned + len)`.
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            if populate != 0 {
                libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_WILLNEED);
            }
        }
        Ok(FramePool {
            base: NonNull::new(aligned as *mut u8).expect("mmap never returns null on success"),
            frames,
            map_addr: aligned as *mut libc::c_void,
            map_len: len,
            fds: Vec::new(),
            file_frames: frames,
            backing: Backing::Anonymous,
        })
    }

    fn map_fd(
        fd: OwnedFd,
        len: usize,
        frames: u64,
        populate: i32,
        backing: Backing,
    ) -> io::Result<Self> {
        // SAFETY: `fd` is a valid open descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(last_os_error("ftruncate(pool file)"));
        }
        // SAFETY: a fresh shared mapping of our own file at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | populate,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_os_error("mmap(pool file)"));
        }
        Ok(FramePool {
            base: NonNull::new(p as *mut u8).expect("mmap never returns null on success"),
            frames,
            map_addr: p,
            map_len: len,
            fds: vec![fd],
            file_frames: frames,
            backing,
        })
    }

    /// `files` memfds of `frames / files` frames each, mapped back to back
    /// into one reservation.
    fn map_memfds(files: usize, len: usize, frames: u64, populate: i32) -> io::Result<Self> {
        if files == 0 || !frames.is_multiple_of(files as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{frames} frames do not split into {files} equal memfds"),
            ));
        }
        let file_frames = frames / files as u64;
        let file_len = file_frames as usize * FRAME_SIZE_BYTES;
        let fds = (0..files)
            .map(|_| {
                let fd = new_memfd()?;
                // SAFETY: `fd` is a valid open descriptor we own.
                if unsafe { libc::ftruncate(fd.as_raw_fd(), file_len as libc::off_t) } != 0 {
                    return Err(last_os_error("ftruncate(pool memfd)"));
                }
                Ok(fd)
            })
            .collect::<io::Result<Vec<OwnedFd>>>()?;
        // SAFETY: a fresh private PROT_NONE reservation at a kernel-chosen
        // address aliases nothing; the files are mapped over it below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_os_error("mmap(pool reservation)"));
        }
        for (k, fd) in fds.iter().enumerate() {
            let at = (p as usize + k * file_len) as *mut libc::c_void;
            // SAFETY: `at..at + file_len` lies inside the reservation made
            // above, which nothing else uses; MAP_FIXED replaces that part
            // of it with a shared mapping of our own file.
            let q = unsafe {
                libc::mmap(
                    at,
                    file_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED | populate,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if q != at {
                let e = last_os_error("mmap(pool memfd)");
                // SAFETY: the reservation made above, used by nobody.
                unsafe { libc::munmap(p, len) };
                return Err(e);
            }
        }
        Ok(FramePool {
            base: NonNull::new(p as *mut u8).expect("mmap never returns null on success"),
            frames,
            map_addr: p,
            map_len: len,
            fds,
            file_frames,
            backing: Backing::Memfds(files),
        })
    }

    /// Number of frames.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.map_len
    }

    /// What backs the pool.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// The file descriptor of a shared pool held in one file (memfd or
    /// file), if any; `None` for an anonymous pool or one cut into several
    /// files ([`FramePool::file_of`] names the file of each frame).
    pub fn fd(&self) -> Option<i32> {
        match self.fds.as_slice() {
            [fd] => Some(fd.as_raw_fd()),
            _ => None,
        }
    }

    /// Frames per backing file (the whole pool when it has one file or
    /// none).
    pub fn file_frames(&self) -> u64 {
        self.file_frames
    }

    /// The file holding frame `f` and the byte offset of `f` in it, for a
    /// shared pool; `None` for an anonymous pool.
    ///
    /// # Panics
    /// If `f` is not a frame of this pool.
    pub fn file_of(&self, f: FrameNo) -> Option<(i32, u64)> {
        assert!(f < self.frames, "frame {f} outside pool of {}", self.frames);
        let fd = self.fds.get((f / self.file_frames) as usize)?;
        Some((fd.as_raw_fd(), (f % self.file_frames) << FRAME_SHIFT))
    }

    /// Address of frame `f`.
    ///
    /// # Panics
    /// If `f` is not a frame of this pool.
    pub fn frame_ptr(&self, f: FrameNo) -> NonNull<u8> {
        assert!(f < self.frames, "frame {f} outside pool of {}", self.frames);
        // SAFETY: `f < frames`, so the offset stays inside the mapping.
        unsafe { self.base.add((f as usize) << FRAME_SHIFT) }
    }

    /// The frame containing address `p`, if it lies in the pool.
    pub fn frame_of(&self, p: *const u8) -> Option<FrameNo> {
        let off = (p as usize).checked_sub(self.base.as_ptr() as usize)?;
        (off < self.map_len).then_some((off >> FRAME_SHIFT) as FrameNo)
    }
}

impl Drop for FramePool {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `new` with this address and length
        // and nothing borrows from the pool past its lifetime.
        unsafe {
            libc::munmap(self.map_addr, self.map_len);
        }
    }
}

/// A new memfd, closed on exec.
fn new_memfd() -> io::Result<OwnedFd> {
    let name = CString::new("buddy-pool").expect("static name has no NUL");
    // SAFETY: `name` is a valid NUL-terminated string for the call.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(last_os_error("memfd_create"));
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A block handed out by a [`PooledAllocator`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// First frame.
    pub frame: FrameNo,
    /// log2 of the number of frames.
    pub order: u32,
    /// Address of the first byte.
    pub ptr: NonNull<u8>,
}

// SAFETY: a block is an address and a size; ownership of the memory is the
// holder's concern, exactly as for a Box<[u8]> handed across threads.
unsafe impl Send for Block {}
// SAFETY: `Block` has no interior mutability; `&Block` exposes only the
// `Copy` fields, so sharing it is no more than sending a copy.
unsafe impl Sync for Block {}

impl Block {
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        FRAME_SIZE_BYTES << self.order
    }
}

/// A pool and an allocator over its frames.
pub struct PooledAllocator {
    pool: FramePool,
    alloc: Box<dyn FrameAllocator>,
}

impl PooledAllocator {
    /// Map a pool and build an allocator of `kind` over it.
    pub fn new(pool: &PoolConfig, kind: AllocatorKind, config: &BuddyConfig) -> io::Result<Self> {
        let pool = FramePool::new(pool)?;
        let alloc = new_allocator(kind, pool.frames(), config)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        Ok(PooledAllocator { pool, alloc })
    }

    /// The pool.
    pub fn pool(&self) -> &FramePool {
        &self.pool
    }

    /// The allocator.
    pub fn allocator(&self) -> &dyn FrameAllocator {
        &*self.alloc
    }

    /// Allocate `2^order` frames on the caller's CPU-local heap.
    pub fn alloc_block(&self, order: u32) -> Result<Block, AllocError> {
        let frame = self.alloc.alloc(order)?;
        Ok(Block {
            frame,
            order,
            ptr: self.pool.frame_ptr(frame),
        })
    }

    /// Free a block on the caller's CPU-local heap.
    pub fn free_block(&self, block: Block) -> Result<(), FreeError> {
        self.alloc.free(block.frame, block.order)
    }

    /// Allocator statistics.
    pub fn stats(&self) -> Stats {
        self.alloc.stats()
    }
}
