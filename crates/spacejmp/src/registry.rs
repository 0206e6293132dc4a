//! The registry: names of segments and VASes, their bases and sizes, and
//! the allocator of non-overlapping bases inside the window.
//!
//! In SpaceJMP the kernel (DragonFly BSD, §4.1) or a user-level service
//! (Barrelfish, §4.2) tracks created VASes and segments. Here the registry is
//! a small text file in the store directory, next to the segment files:
//!
//! ```text
//!  /dev/shm/spacejmp-<uid>/
//!     registry.lock     flock(2) target; never renamed
//!     registry          "window BASE LEN" / "seg NAME BASE SIZE HDR FLAGS" /
//!                       "vas NAME MODE SEG:r SEG:w ..."   one per line
//!     seg.<name>        one file per segment (header + data)
//! ```
//!
//! Every operation takes the lock (exclusive to modify, shared to read),
//! reads the whole file, and a modification is written to `registry.tmp`
//! and renamed over `registry`, so a process killed mid-update leaves the
//! old or the new registry, never a torn one. `flock` excludes other
//! processes; a mutex excludes other threads of this process, which share
//! the lock file's open description. The registry is small (one line per
//! object) and off every fast path: switching never touches it.
//!
//! Automatic bases are first-fit over the sorted segment ranges, aligned to
//! 2 MiB, and never overlap any registered segment. An explicit base that
//! overlaps an existing segment is refused ([`Error::AddressInUse`]) unless
//! the caller asks for an overlapping segment (`allow_overlap`, or
//! `seg_clone`, which keeps the base): such segments can only be used in
//! different VASes, and switching between those VASes is a remap.

use crate::error::{Error, Result};
use crate::segment::{self, validate_name, Access, SegInfo, SegOptions, FLAG_HUGE, FLAG_LOCKABLE};
use crate::window::WINDOW_ALIGN;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A VAS as recorded in the registry: a named set of segments with
/// per-segment access modes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VasInfo {
    pub name: String,
    pub mode: u32,
    pub segs: Vec<(String, Access)>,
}

/// The parsed registry file.
#[derive(Clone, Debug, Default)]
pub struct RegState {
    pub window: (u64, u64),
    pub segs: Vec<SegInfo>,
    pub vases: Vec<VasInfo>,
}

impl RegState {
    pub fn seg(&self, name: &str) -> Result<&SegInfo> {
        self.segs
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| Error::NotFound {
                kind: "segment",
                name: name.to_string(),
            })
    }

    pub fn vas(&self, name: &str) -> Result<&VasInfo> {
        self.vases
            .iter()
            .find(|v| v.name == name)
            .ok_or_else(|| Error::NotFound {
                kind: "VAS",
                name: name.to_string(),
            })
    }

    fn vas_mut(&mut self, name: &str) -> Result<&mut VasInfo> {
        self.vases
            .iter_mut()
            .find(|v| v.name == name)
            .ok_or_else(|| Error::NotFound {
                kind: "VAS",
                name: name.to_string(),
            })
    }

    fn parse(text: &str) -> Option<RegState> {
        let mut st = RegState::default();
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.first().copied() {
                Some("window") => st.window = (hex(f.get(1)?)?, hex(f.get(2)?)?),
                Some("seg") => st.segs.push(SegInfo {
                    name: f.get(1)?.to_string(),
                    base: hex(f.get(2)?)?,
                    size: hex(f.get(3)?)?,
                    header_size: hex(f.get(4)?)?,
                    flags: f.get(5)?.parse().ok()?,
                }),
                Some("vas") => {
                    let mut segs = Vec::new();
                    for s in &f[3..] {
                        let (n, m) = s.rsplit_once(':')?;
                        let a = if m == "w" {
                            Access::Write
                        } else {
                            Access::Read
                        };
                        segs.push((n.to_string(), a));
                    }
                    st.vases.push(VasInfo {
                        name: f.get(1)?.to_string(),
                        mode: u32::from_str_radix(f.get(2)?, 8).ok()?,
                        segs,
                    });
                }
                None => {}
                Some(_) => return None,
            }
        }
        Some(st)
    }

    fn render(&self) -> String {
        let mut s = format!("window {:#x} {:#x}\n", self.window.0, self.window.1);
        for g in &self.segs {
            s += &format!(
                "seg {} {:#x} {:#x} {:#x} {}\n",
                g.name, g.base, g.size, g.header_size, g.flags
            );
        }
        for v in &self.vases {
            s += &format!("vas {} {:o}", v.name, v.mode);
            for (n, a) in &v.segs {
                s += &format!(" {n}:{}", a.letter());
            }
            s.push('\n');
        }
        s
    }

    /// First-fit free base for `size` bytes.
    fn find_free(&self, size: u64) -> Result<u64> {
        let mut ranges: Vec<(u64, u64)> = self.segs.iter().map(|s| (s.base, s.end())).collect();
        ranges.sort_unstable();
        let (wb, wl) = self.window;
        let mut cand = wb;
        for (b, e) in ranges {
            if cand + size <= b {
                break;
            }
            cand = cand.max(e.div_ceil(WINDOW_ALIGN) * WINDOW_ALIGN);
        }
        if cand + size <= wb + wl {
            Ok(cand)
        } else {
            Err(Error::WindowFull { size })
        }
    }
}

/// Handle to a store directory's registry.
pub struct Registry {
    dir: PathBuf,
    lock: Mutex<File>,
    page: u64,
    huge: bool,
}

/// `statfs` magic of hugetlbfs.
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

impl Registry {
    /// Open (creating if needed) the registry in `dir`. A new registry
    /// records `window`; an existing one keeps its own.
    pub fn open(dir: &Path, window: (u64, u64)) -> Result<Registry> {
        if let Err(e) = std::fs::create_dir_all(dir) {
            return Err(match e.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EPERM) => Error::PermissionDenied {
                    name: dir.display().to_string(),
                    detail: "cannot create the store directory".into(),
                },
                _ => Error::io("create store", dir, e),
            });
        }
        let lp = dir.join("registry.lock");
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lp)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EACCES) => Error::PermissionDenied {
                    name: lp.display().to_string(),
                    detail: "cannot open the registry lock".into(),
                },
                _ => Error::io("open", &lp, e),
            })?;
        let (page, huge) = fs_page(dir)?;
        let reg = Registry {
            dir: dir.to_path_buf(),
            lock: Mutex::new(lock),
            page,
            huge,
        };
        reg.update(|st| {
            if st.window == (0, 0) {
                st.window = window;
            }
            Ok(())
        })?;
        Ok(reg)
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Page size of the store (2 MiB on hugetlbfs).
    pub fn page_size(&self) -> u64 {
        self.page
    }

    fn with<R>(
        &self,
        exclusive: bool,
        f: impl FnOnce(&mut RegState) -> Result<(R, bool)>,
    ) -> Result<R> {
        let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let op = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        // SAFETY: `guard` keeps the lock file open for the whole call, so
        // the fd is valid; flock takes no pointers.
        if unsafe { libc::flock(guard.as_raw_fd(), op) } != 0 {
            return Err(Error::last_os("flock", self.dir.join("registry.lock")));
        }
        let res = (|| {
            let path = self.dir.join("registry");
            let mut st = match std::fs::read_to_string(&path) {
                // (On hugetlbfs the file is padded with NULs to a page.)
                Ok(t) => RegState::parse(t.trim_end_matches('\0')).ok_or_else(|| {
                    Error::HeaderMismatch {
                        name: path.display().to_string(),
                        what: "unparsable registry".into(),
                    }
                })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => RegState::default(),
                Err(e) => return Err(Error::io("read", &path, e)),
            };
            let (r, dirty) = f(&mut st)?;
            if dirty {
                let tmp = self
                    .dir
                    .join(format!("registry.tmp.{}", std::process::id()));
                let text = st.render();
                if self.huge {
                    write_mapped(&tmp, text.as_bytes(), self.page)
                } else {
                    std::fs::write(&tmp, text)
                }
                .map_err(|e| Error::io("write", &tmp, e))?;
                std::fs::rename(&tmp, &path).map_err(|e| Error::io("rename", &path, e))?;
            }
            Ok(r)
        })();
        // SAFETY: `guard` is still alive, so its fd is the one locked above;
        // flock takes no pointers.
        unsafe { libc::flock(guard.as_raw_fd(), libc::LOCK_UN) };
        res
    }

    /// Run `f` on the registry under the exclusive lock and write it back.
    pub fn update<R>(&self, f: impl FnOnce(&mut RegState) -> Result<R>) -> Result<R> {
        self.with(true, |st| f(st).map(|r| (r, true)))
    }

    /// A consistent snapshot of the registry.
    pub fn snapshot(&self) -> Result<RegState> {
        self.with(false, |st| Ok((st.clone(), false)))
    }

    /// `seg_alloc`: register a segment and create its file.
    pub fn seg_alloc(&self, name: &str, size: u64, opts: &SegOptions) -> Result<SegInfo> {
        validate_name(name)?;
        if size == 0 {
            return Err(Error::InvalidArgument("segment size 0".into()));
        }
        let hdr = self.page;
        let total = (size + hdr).div_ceil(hdr) * hdr;
        let mut flags = if opts.lockable { FLAG_LOCKABLE } else { 0 };
        if self.huge {
            flags |= FLAG_HUGE;
        }
        self.update(|st| {
            if st.segs.iter().any(|s| s.name == name) {
                return Err(Error::NameExists {
                    kind: "segment",
                    name: name.to_string(),
                });
            }
            let base = match opts.base {
                Some(b) => {
                    if b % hdr != 0 {
                        return Err(Error::InvalidArgument(format!(
                            "base {b:#x} is not aligned to the store's page size {hdr:#x}"
                        )));
                    }
                    let (wb, wl) = st.window;
                    if b < wb || b + total > wb + wl {
                        return Err(Error::OutOfWindow {
                            base: b,
                            size: total,
                            window_base: wb,
                            window_len: wl,
                        });
                    }
                    if !opts.allow_overlap {
                        if let Some(o) = st.segs.iter().find(|s| s.overlaps(b, total)) {
                            return Err(Error::AddressInUse {
                                base: b,
                                size: total,
                                by: format!("segment `{}`", o.name),
                            });
                        }
                    }
                    b
                }
                None => st.find_free(total)?,
            };
            let info = SegInfo {
                name: name.to_string(),
                base,
                size: total,
                header_size: hdr,
                flags,
            };
            segment::create_file(&self.dir, &info, opts.mode)?;
            st.segs.push(info.clone());
            Ok(info)
        })
    }

    /// `seg_find`.
    pub fn seg_find(&self, name: &str) -> Result<SegInfo> {
        self.snapshot()?.seg(name).cloned()
    }

    /// `seg_clone`: a copy of `from` at the same base (it overlaps `from`, so
    /// the two can only live in different VASes).
    pub fn seg_clone(&self, from: &str, to: &str) -> Result<SegInfo> {
        validate_name(to)?;
        self.update(|st| {
            if st.segs.iter().any(|s| s.name == to) {
                return Err(Error::NameExists {
                    kind: "segment",
                    name: to.to_string(),
                });
            }
            let src = st.seg(from)?.clone();
            let info = SegInfo {
                name: to.to_string(),
                ..src.clone()
            };
            segment::clone_file(&self.dir, &src, &info)?;
            st.segs.push(info.clone());
            Ok(info)
        })
    }

    /// Remove a segment: its file, its registry entry, and its membership
    /// in every VAS. Processes that have it mapped keep their mapping.
    pub fn seg_remove(&self, name: &str) -> Result<()> {
        self.update(|st| {
            st.seg(name)?;
            st.segs.retain(|s| s.name != name);
            for v in &mut st.vases {
                v.segs.retain(|(n, _)| n != name);
            }
            let p = segment::seg_path(&self.dir, name);
            match std::fs::remove_file(&p) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(Error::io("remove", &p, e)),
            }
        })
    }

    /// `vas_create`.
    pub fn vas_create(&self, name: &str, mode: u32) -> Result<VasInfo> {
        validate_name(name)?;
        self.update(|st| {
            if st.vases.iter().any(|v| v.name == name) {
                return Err(Error::NameExists {
                    kind: "VAS",
                    name: name.to_string(),
                });
            }
            let v = VasInfo {
                name: name.to_string(),
                mode,
                segs: Vec::new(),
            };
            st.vases.push(v.clone());
            Ok(v)
        })
    }

    /// `vas_find`.
    pub fn vas_find(&self, name: &str) -> Result<VasInfo> {
        self.snapshot()?.vas(name).cloned()
    }

    /// `vas_clone`: a new VAS with the same segments and modes.
    pub fn vas_clone(&self, from: &str, to: &str) -> Result<VasInfo> {
        validate_name(to)?;
        self.update(|st| {
            if st.vases.iter().any(|v| v.name == to) {
                return Err(Error::NameExists {
                    kind: "VAS",
                    name: to.to_string(),
                });
            }
            let v = VasInfo {
                name: to.to_string(),
                ..st.vas(from)?.clone()
            };
            st.vases.push(v.clone());
            Ok(v)
        })
    }

    /// Remove a VAS (its segments stay).
    pub fn vas_remove(&self, name: &str) -> Result<()> {
        self.update(|st| {
            st.vas(name)?;
            st.vases.retain(|v| v.name != name);
            Ok(())
        })
    }

    /// `seg_attach(vid, sid)`: add a segment to a VAS with an access mode.
    /// Segments inside one VAS never overlap.
    pub fn vas_add_seg(&self, vas: &str, seg: &str, access: Access) -> Result<()> {
        self.update(|st| {
            let s = st.seg(seg)?.clone();
            let mut others = Vec::new();
            for (n, _) in &st.vas(vas)?.segs {
                if n != seg {
                    others.push(st.seg(n)?.clone());
                }
            }
            if let Some(o) = others.iter().find(|o| o.overlaps(s.base, s.size)) {
                return Err(Error::AddressInUse {
                    base: s.base,
                    size: s.size,
                    by: format!("segment `{}` of VAS `{vas}`", o.name),
                });
            }
            let v = st.vas_mut(vas)?;
            v.segs.retain(|(n, _)| n != seg);
            v.segs.push((seg.to_string(), access));
            Ok(())
        })
    }

    /// `seg_detach(vid, sid)`.
    pub fn vas_remove_seg(&self, vas: &str, seg: &str) -> Result<()> {
        self.update(|st| {
            let v = st.vas_mut(vas)?;
            let before = v.segs.len();
            v.segs.retain(|(n, _)| n != seg);
            if v.segs.len() == before {
                return Err(Error::NotFound {
                    kind: "segment in VAS",
                    name: seg.to_string(),
                });
            }
            Ok(())
        })
    }
}

/// Write `data` to a new file at `path` through a shared mapping, padded
/// with NULs to whole pages of `page` bytes: hugetlbfs has no `write(2)`.
fn write_mapped(path: &Path, data: &[u8], page: u64) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let len = (data.len() as u64).div_ceil(page).max(1) * page;
    f.set_len(len)?;
    // SAFETY: a fresh shared mapping of the file we just sized to `len`.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the mapping is `len >= data.len()` bytes, writable, and not
    // aliased; it is unmapped right after.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), p.cast::<u8>(), data.len());
        libc::munmap(p, len as usize);
    }
    Ok(())
}

fn fs_page(dir: &Path) -> Result<(u64, bool)> {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
        .map_err(|_| Error::InvalidArgument("store path contains NUL".into()))?;
    // SAFETY: statfs is plain old data; zeroed is a valid initial value.
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `sf` is a valid out-pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut sf) } != 0 {
        return Err(Error::last_os("statfs", dir));
    }
    if sf.f_type as i64 == HUGETLBFS_MAGIC {
        Ok((sf.f_bsize as u64, true))
    } else {
        Ok((crate::sys::page_size(), false))
    }
}
