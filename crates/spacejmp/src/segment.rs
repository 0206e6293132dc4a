//! Segments: named, fixed-base, fixed-size regions backed by files.
//!
//! SpaceJMP §3.1: "a segment is a single, contiguous area of virtual memory
//! containing code and data, with a fixed virtual start address and size,
//! together with meta-data to describe how to access it." In DragonFly BSD a
//! segment wraps a VM object of physical pages (§4.1). On Linux the closest
//! object that outlives a process and can be mapped by any process is a
//! file: by default on tmpfs (`/dev/shm`, memory only, gone at reboot), on
//! hugetlbfs for 2 MiB pages, or on a disk file system for persistence
//! across reboots.
//!
//! ```text
//!  file offset 0          header_size                               size
//!  | header (1 page) RW    | data (mode of the attach)                   |
//!  | magic version flags base size owner mode name root lock heap-state  |
//!  mapped at  base          base + header_size                  base + size
//! ```
//!
//! The header is a page of its own so it can stay writable (lock words,
//! heap state) while the data is mapped read-only. The whole size is
//! reserved at creation with `fallocate`, so a full tmpfs is an error at
//! creation ([`Error::NoSpace`]) rather than a SIGBUS on first touch.
//!
//! A file is checked against its registry entry before any page of it is
//! mapped (`check_file_size`): shorter than the recorded size is refused
//! ([`Error::ShortFile`], naming the file and both sizes) because a load
//! or store to a mapped page past the end of a file is a SIGBUS, not an
//! error; longer is accepted (only the recorded size is mapped, the rest
//! is ignored); a file with holes (copied sparse, or punched) gets its
//! blocks reserved again with `fallocate`, so a full file system is an
//! error at attach ([`Error::NoSpace`]) rather than a SIGBUS on a later
//! store.
//!
//! The header is the authority on what the file is: attaching validates
//! magic, version, base, size and name against the registry entry and
//! refuses a mismatch ([`Error::HeaderMismatch`]). Permissions are checked
//! twice: the kernel checks the file mode when we open it, and the library
//! checks the header's owner/mode bits (the paper's ACLs, §3.2) — also for
//! root, so a segment marked read-only is read-only for everybody.

use crate::error::{Error, Result};
use crate::heap::HeapState;
use crate::lock::RawRwLock;
use crate::sys;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// `b"SPACEJMP"` as a little-endian integer.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SPACEJMP");
/// On-disk format version.
pub const VERSION: u32 = 1;
/// Longest segment or VAS name.
pub const MAX_NAME: usize = 63;

/// Segment flag: switching into a VAS takes the segment's lock.
pub const FLAG_LOCKABLE: u32 = 1;
/// Segment flag: backed by hugetlbfs (2 MiB pages).
pub const FLAG_HUGE: u32 = 2;

/// The header at the start of every segment file.
#[repr(C)]
pub struct Header {
    pub magic: u64,
    pub version: u32,
    pub flags: u32,
    pub base: u64,
    pub size: u64,
    pub header_size: u64,
    pub owner_uid: u32,
    /// Permission bits (owner `0o600`, others `0o006`); changed by
    /// `seg_ctl`, hence atomic.
    pub mode: AtomicU32,
    pub name: [u8; 64],
    pub created_unix: u64,
    /// One root pointer per segment, for finding data again after restart.
    pub root: AtomicU64,
    /// The lockable segment's reader/writer lock.
    pub lock: RawRwLock,
    /// The segment heap's state (`m_space`).
    pub heap: HeapState,
}

const _: () = assert!(std::mem::size_of::<Header>() <= 4096);

/// Permission to ask for when attaching.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Read-only: mapped `PROT_READ`, lock taken shared.
    Read,
    /// Read-write: mapped `PROT_READ|PROT_WRITE`, lock taken exclusive.
    Write,
}

impl Access {
    pub(crate) fn letter(self) -> char {
        match self {
            Access::Read => 'r',
            Access::Write => 'w',
        }
    }
}

/// What the registry knows about a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegInfo {
    pub name: String,
    pub base: u64,
    pub size: u64,
    pub header_size: u64,
    pub flags: u32,
}

impl SegInfo {
    /// Whether switching takes this segment's lock.
    pub fn lockable(&self) -> bool {
        self.flags & FLAG_LOCKABLE != 0
    }
    /// First byte after the header.
    pub fn data_start(&self) -> u64 {
        self.base + self.header_size
    }
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.base + self.size
    }
    /// Whether two segments' ranges intersect.
    pub fn overlaps(&self, base: u64, size: u64) -> bool {
        self.base < base + size && base < self.end()
    }
}

/// Options for creating a segment.
#[derive(Clone, Debug)]
pub struct SegOptions {
    /// Fixed base; `None` lets the registry choose.
    pub base: Option<u64>,
    /// Take the segment lock on switch.
    pub lockable: bool,
    /// Permission bits recorded in the header (owner: 0o600, others: 0o006).
    pub mode: u32,
    /// Allow an explicit base to overlap existing segments (they can then
    /// only be used in different VASes).
    pub allow_overlap: bool,
}

impl Default for SegOptions {
    fn default() -> Self {
        SegOptions {
            base: None,
            lockable: true,
            mode: 0o660,
            allow_overlap: false,
        }
    }
}

pub(crate) fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidName(name.to_string()))
    }
}

/// Path of a segment's file in the store.
pub fn seg_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("seg.{name}"))
}

fn open_raw(path: &Path, flags: i32, mode: u32) -> std::io::Result<File> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        // SAFETY: `fd` was just returned by open and is owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}

/// A temporary, anywhere-placed mapping of a file's header page.
pub(crate) struct HeaderMap {
    ptr: *mut Header,
    len: usize,
}

impl HeaderMap {
    pub(crate) fn new(file: &File, len: u64, writable: bool) -> std::io::Result<HeaderMap> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping at a kernel-chosen address cannot
        // alias any existing Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(HeaderMap {
            ptr: p.cast(),
            len: len as usize,
        })
    }

    pub(crate) fn get(&self) -> &Header {
        // SAFETY: the mapping is at least one page (>= size_of::<Header>()),
        // page-aligned, and lives as long as `self`; concurrently modified
        // fields are atomics.
        unsafe { &*self.ptr }
    }

    fn get_mut(&mut self) -> &mut Header {
        // SAFETY: as in `get`; used only on a file we just created and that
        // no other process can yet reach (the registry lock is held and the
        // name is not yet registered).
        unsafe { &mut *self.ptr }
    }
}

impl Drop for HeaderMap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping `new` created; it is
        // unmapped only here, and every `&Header` borrowed from `self` has
        // ended because `drop` takes `&mut self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Create the backing file of a new segment and write its header. The
/// caller holds the registry lock and has checked the name and range.
pub(crate) fn create_file(dir: &Path, info: &SegInfo, mode: u32) -> Result<()> {
    let path = seg_path(dir, &info.name);
    let file = match open_raw(&path, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o666) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            return Err(Error::NameExists {
                kind: "segment",
                name: info.name.clone(),
            })
        }
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            return Err(Error::PermissionDenied {
                name: info.name.clone(),
                detail: format!("cannot create {}", path.display()),
            })
        }
        Err(e) => return Err(Error::io("create", &path, e)),
    };
    let cleanup = |e: Error| {
        let _ = std::fs::remove_file(&path);
        e
    };
    // SAFETY: valid fd; reserves blocks for the whole file.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, info.size as libc::off_t) };
    if r != 0 {
        let errno = sys::errno();
        if errno == libc::ENOSPC || errno == libc::EFBIG || errno == libc::ENOMEM {
            return Err(cleanup(Error::NoSpace {
                path: path.clone(),
                size: info.size,
            }));
        }
        // No fallocate on this file system: size it, accepting late SIGBUS.
        if errno != libc::EOPNOTSUPP
            // SAFETY: `file` is open for writing and outlives the call;
            // ftruncate only reads its arguments.
            || unsafe { libc::ftruncate(file.as_raw_fd(), info.size as libc::off_t) } != 0
        {
            return Err(cleanup(Error::last_os("fallocate", &path)));
        }
    }
    let mut hm = HeaderMap::new(&file, info.header_size, true)
        .map_err(|e| cleanup(Error::io("map header", &path, e)))?;
    let h = hm.get_mut();
    h.version = VERSION;
    h.flags = info.flags;
    h.base = info.base;
    h.size = info.size;
    h.header_size = info.header_size;
    h.owner_uid = sys::euid();
    *h.mode.get_mut() = mode & 0o777;
    let n = info.name.as_bytes();
    h.name[..n.len()].copy_from_slice(n);
    h.created_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    h.heap.init(info.data_start(), info.end());
    // Magic last: a half-written header never validates.
    std::sync::atomic::fence(Ordering::Release);
    h.magic = MAGIC;
    Ok(())
}

/// Open a segment's file for mapping, validating its header against the
/// registry entry and the caller's access.
pub(crate) fn open_file(dir: &Path, info: &SegInfo, access: Access) -> Result<File> {
    let path = seg_path(dir, &info.name);
    // The header page is always mapped writable (lock words), so try O_RDWR
    // even for read access.
    let file = match open_raw(&path, libc::O_RDWR, 0) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            return Err(Error::NotFound {
                kind: "segment file",
                name: info.name.clone(),
            })
        }
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            return Err(Error::PermissionDenied {
                name: info.name.clone(),
                detail: format!(
                    "{} is not readable and writable by this user (the header's lock words need write access)",
                    path.display()
                ),
            })
        }
        Err(e) => return Err(Error::io("open", &path, e)),
    };
    check_file_size(&file, &path, info)?;
    let hm = HeaderMap::new(&file, info.header_size, false)
        .map_err(|e| Error::io("map header", &path, e))?;
    check_header(hm.get(), info)?;
    check_mode(hm.get(), &info.name, access)?;
    Ok(file)
}

/// Refuse a file shorter than `info.size` ([`Error::ShortFile`]) and
/// reserve the blocks of one with holes, before anything maps it (see the
/// module essay).
pub(crate) fn check_file_size(file: &File, path: &Path, info: &SegInfo) -> Result<()> {
    // SAFETY: `stat` is plain old data; zeroed is a valid initial value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `file` is an open descriptor and `st` a valid out-pointer.
    if unsafe { libc::fstat(file.as_raw_fd(), &mut st) } != 0 {
        return Err(Error::last_os("fstat", path));
    }
    let file_bytes = st.st_size.max(0) as u64;
    if file_bytes < info.size {
        return Err(Error::ShortFile {
            path: path.to_path_buf(),
            file_bytes,
            expected_bytes: info.size,
        });
    }
    // Fewer allocated blocks than bytes: a sparse file. Reserve its
    // blocks now (cheap when few are missing; skipped for a fully
    // allocated file, so a clean attach of a large store stays fast).
    let allocated_bytes = (st.st_blocks.max(0) as u64).saturating_mul(STAT_BLOCK_BYTES);
    if allocated_bytes < info.size && info.flags & FLAG_HUGE == 0 {
        // SAFETY: valid fd; reserves blocks for the recorded size.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, info.size as libc::off_t) };
        if r != 0 {
            let errno = sys::errno();
            if errno == libc::ENOSPC || errno == libc::EFBIG || errno == libc::ENOMEM {
                return Err(Error::NoSpace {
                    path: path.to_path_buf(),
                    size: info.size,
                });
            }
            if errno != libc::EOPNOTSUPP {
                return Err(Error::last_os("fallocate", path));
            }
        }
    }
    Ok(())
}

/// Unit of `st_blocks` (POSIX: 512 bytes, whatever the file system).
const STAT_BLOCK_BYTES: u64 = 512;

pub(crate) fn check_header(h: &Header, info: &SegInfo) -> Result<()> {
    let mismatch = |what: String| {
        Err(Error::HeaderMismatch {
            name: info.name.clone(),
            what,
        })
    };
    if h.magic != MAGIC {
        return mismatch(format!("bad magic {:#x}", h.magic));
    }
    if h.version != VERSION {
        return mismatch(format!("version {} (expected {VERSION})", h.version));
    }
    if h.base != info.base || h.size != info.size || h.header_size != info.header_size {
        return mismatch(format!(
            "header says base {:#x} size {:#x}, registry says base {:#x} size {:#x}",
            h.base, h.size, info.base, info.size
        ));
    }
    if header_name(h) != info.name {
        return mismatch(format!("header names `{}`", header_name(h)));
    }
    Ok(())
}

pub(crate) fn check_mode(h: &Header, name: &str, access: Access) -> Result<()> {
    let mode = h.mode.load(Ordering::Acquire);
    let bits = if h.owner_uid == sys::euid() {
        (mode >> 6) & 7
    } else {
        mode & 7
    };
    let need = match access {
        Access::Read => 4,
        Access::Write => 6,
    };
    if bits & need != need {
        return Err(Error::PermissionDenied {
            name: name.to_string(),
            detail: format!(
                "header mode {:o} (owner uid {}) does not allow {access:?}",
                mode, h.owner_uid
            ),
        });
    }
    Ok(())
}

/// The name stored in a header.
pub fn header_name(h: &Header) -> String {
    let end = h.name.iter().position(|&b| b == 0).unwrap_or(h.name.len());
    String::from_utf8_lossy(&h.name[..end]).into_owned()
}

/// Read-only view of a segment file's header, for inspection tools.
pub struct HeaderView {
    map: HeaderMap,
    _file: File,
}

impl HeaderView {
    /// Map the header of the segment file `path` (header size `header_size`).
    pub fn open_path(path: &Path, header_size: u64) -> Result<HeaderView> {
        let file = open_raw(path, libc::O_RDWR, 0).map_err(|e| Error::io("open", path, e))?;
        let file_bytes = file
            .metadata()
            .map_err(|e| Error::io("stat", path, e))?
            .len();
        if file_bytes < header_size {
            // Reading a mapped header page past the end would be a SIGBUS.
            return Err(Error::ShortFile {
                path: path.to_path_buf(),
                file_bytes,
                expected_bytes: header_size,
            });
        }
        let map = HeaderMap::new(&file, header_size, true)
            .map_err(|e| Error::io("map header", path, e))?;
        Ok(HeaderView { map, _file: file })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        self.map.get()
    }
}

/// Copy a segment file's contents into a new file for `seg_clone`.
pub(crate) fn clone_file(dir: &Path, from: &SegInfo, to: &SegInfo) -> Result<()> {
    let src = seg_path(dir, &from.name);
    let dst = seg_path(dir, &to.name);
    let mut inp = open_raw(&src, libc::O_RDONLY, 0).map_err(|e| Error::io("open", &src, e))?;
    let src_bytes = inp
        .metadata()
        .map_err(|e| Error::io("stat", &src, e))?
        .len();
    if src_bytes < from.size {
        return Err(Error::ShortFile {
            path: src,
            file_bytes: src_bytes,
            expected_bytes: from.size,
        });
    }
    create_file(dir, to, 0o660)?;
    // Copy data after the header; the header of the clone stays fresh
    // (unlocked, own name) except for the root pointer and heap state.
    let out = open_raw(&dst, libc::O_RDWR, 0).map_err(|e| Error::io("open", &dst, e))?;
    let src_h = HeaderMap::new(&inp, from.header_size, false)
        .map_err(|e| Error::io("map header", &src, e))?;
    let mut dst_h =
        HeaderMap::new(&out, to.header_size, true).map_err(|e| Error::io("map header", &dst, e))?;
    dst_h.get_mut().heap.copy_from(&src_h.get().heap);
    *dst_h.get_mut().mode.get_mut() = src_h.get().mode.load(Ordering::Acquire);
    dst_h
        .get()
        .root
        .store(src_h.get().root.load(Ordering::Acquire), Ordering::Release);
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut out = out;
    inp.seek(SeekFrom::Start(from.header_size))
        .and_then(|_| out.seek(SeekFrom::Start(to.header_size)))
        .and_then(|_| {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = inp.read(&mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                out.write_all(&buf[..n])?;
            }
        })
        .map_err(|e| Error::io("copy", &dst, e))
}
