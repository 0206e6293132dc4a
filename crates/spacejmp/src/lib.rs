//! SpaceJMP on Linux: first-class address spaces and lockable segments.
//!
//! This crate realizes the design of *SpaceJMP: Programming with Multiple
//! Virtual Address Spaces* (El Hajj, Merritt, Zellweger et al., ASPLOS'16;
//! dissertation chapters 7-10) as a library on stock Linux:
//!
//! | paper | here | real or emulated |
//! |---|---|---|
//! | segment (VM object, §4.1) | a file on tmpfs / hugetlbfs / disk, mapped `MAP_FIXED` at its base inside a reserved [`window`] | real |
//! | global names (kernel / Barrelfish service) | a flock-protected [`registry`] file in the store directory | real |
//! | lockable segment (§3.1) | a robust cross-process reader/writer [`lock`] in the segment header; a dead holder is detected by pid + start time | real |
//! | `vas_switch` = CR3 load (§4.1) | in-process ([`vas`]): per-thread lock hand-over; **a switch between overlapping VASes is a process-wide remap**, not a CR3 write | disjoint switch real; overlap emulated by remapping |
//! | `vas_switch` keeping page tables (§4.1) | process-per-VAS ([`procvas`]): each VAS a process that keeps its page table; the thread's execution moves there on the same CPU | page-table load real (the kernel's process switch); the thread's move is a user-level hand-off |
//! | `m_malloc` / `m_space` (§4.1) | a [`heap`] whose state is in the segment header | real |
//! | compiler safety pass (§3.3, §4.3) | Rust types: [`SegSafe`], [`SegPtr`] dereferenced only through an [`Active`] guard, [`Active::vcast`] | checked at compile time and by range checks at run time |
//!
//! ```no_run
//! use spacejmp::{Access, Config, Jmp, SegOptions};
//! # fn main() -> Result<(), spacejmp::Error> {
//! let jmp = Jmp::open(Config::default())?;
//! jmp.seg_alloc("s0", 1 << 30, &SegOptions::default())?;   // seg_alloc
//! jmp.vas_create("v0", 0o660)?;                             // vas_create
//! jmp.seg_attach("v0", "s0", Access::Write)?;               // seg_attach(vid, sid)
//! let vh = jmp.vas_attach("v0", Default::default())?;       // vas_attach
//! let mut a = vh.switch()?;                                 // vas_switch (+ lock)
//! let t = a.alloc("s0", 42u64)?;                            // m_malloc
//! a.set_root("s0", t)?;
//! # Ok(()) }
//! ```
//!
//! A reference into a segment cannot outlive the switch that made it valid
//! (the paper's rule "dereferencing p is safe in v and unsafe otherwise"):
//!
//! ```compile_fail
//! # use spacejmp::{Jmp, Config, SegPtr};
//! # fn f(jmp: &Jmp, p: SegPtr<u64>) -> Result<(), spacejmp::Error> {
//! let vh = jmp.vas_attach("v0", Default::default())?;
//! let r: &u64 = {
//!     let a = vh.switch()?;
//!     p.get(&a)?          // borrows the guard `a` ...
//! };                      // ... which is dropped here: does not compile
//! println!("{r}");
//! # Ok(()) }
//! ```
//!
//! and a struct holding process-private pointers cannot be stored:
//!
//! ```compile_fail
//! spacejmp::seg_struct! { struct Bad { s: *const u64 } }   // a private pointer: not SegSafe
//! ```

#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "bench")]
pub mod bench;
pub mod error;
pub mod heap;
pub mod lock;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub mod procvas;
pub mod registry;
pub mod segment;
mod sys;
pub mod vas;
pub mod window;

pub use error::{Error, Result};
pub use heap::{SegBox, SegMap, SegPtr, SegSafe, SegStr, SegVec};
pub use lock::{Acquired, Holder, Mode, RawRwLock};
pub use registry::{RegState, Registry, VasInfo};
pub use segment::{Access, Header, HeaderView, SegInfo, SegOptions};
pub use vas::{Active, AttachOptions, Stats, StatsSnapshot, VasHandle};
pub use window::{Window, DEFAULT_WINDOW_BASE, DEFAULT_WINDOW_LEN};

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// Where segments live and which address range they use.
#[derive(Clone, Debug)]
pub struct Config {
    /// Store directory (default `/dev/shm/spacejmp-<uid>`, or
    /// `$SPACEJMP_STORE`). A hugetlbfs directory gives 2 MiB pages; a disk
    /// directory gives persistence across reboots.
    pub store: PathBuf,
    /// Window for a new store (default 16 TiB at `0x1000_0000_0000`, or
    /// `$SPACEJMP_WINDOW=BASE:LEN` in hex). An existing store keeps the
    /// window recorded in its registry.
    pub window: (u64, u64),
}

impl Default for Config {
    fn default() -> Self {
        let store = std::env::var_os("SPACEJMP_STORE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!("/dev/shm/spacejmp-{}", sys::euid())));
        let window = std::env::var("SPACEJMP_WINDOW")
            .ok()
            .and_then(|s| {
                let (b, l) = s.split_once(':')?;
                let h = |x: &str| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok();
                Some((h(b)?, h(l)?))
            })
            .unwrap_or((DEFAULT_WINDOW_BASE, DEFAULT_WINDOW_LEN));
        Config { store, window }
    }
}

impl Config {
    /// A config for `store` with the default window.
    pub fn with_store(store: impl Into<PathBuf>) -> Self {
        Config {
            store: store.into(),
            ..Config::default()
        }
    }

    /// Set the window for a new store.
    pub fn window(mut self, base: u64, len: u64) -> Self {
        self.window = (base, len);
        self
    }
}

/// A process's SpaceJMP context: the store's registry, the reserved window,
/// and the table of segments mapped in it. One per store per process (two
/// contexts with overlapping windows collide: [`Error::WindowTaken`]).
pub struct Jmp {
    registry: Registry,
    window: Window,
    space: Mutex<vas::Space>,
    stats: Stats,
}

impl Jmp {
    /// Open (or create) the store and reserve its window.
    pub fn open(cfg: Config) -> Result<Jmp> {
        let registry = Registry::open(&cfg.store, cfg.window)?;
        let (base, len) = registry.snapshot()?.window;
        let window = Window::reserve(base, len)?;
        Ok(Jmp {
            registry,
            window,
            space: Mutex::new(vas::Space::default()),
            stats: Stats::default(),
        })
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The reserved window.
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// VAS counters of this process.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub(crate) fn space(&self) -> MutexGuard<'_, vas::Space> {
        self.space.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `seg_alloc(name, base, size, perms)`: create a segment of at least
    /// `size` usable bytes (plus one header page).
    pub fn seg_alloc(&self, name: &str, size: u64, opts: &SegOptions) -> Result<SegInfo> {
        self.registry.seg_alloc(name, size, opts)
    }

    /// `seg_find(name)`.
    pub fn seg_find(&self, name: &str) -> Result<SegInfo> {
        self.registry.seg_find(name)
    }

    /// `seg_clone(sid)`: a copy at the same base (so it overlaps the
    /// original and belongs in a different VAS).
    pub fn seg_clone(&self, from: &str, to: &str) -> Result<SegInfo> {
        self.registry.seg_clone(from, to)
    }

    /// Remove a segment (explicitly; segments otherwise persist).
    pub fn seg_remove(&self, name: &str) -> Result<()> {
        self.registry.seg_remove(name)
    }

    /// `seg_ctl(sid, SET_MODE, mode)`: change the header's permission bits
    /// (owner only).
    pub fn seg_set_mode(&self, name: &str, mode: u32) -> Result<()> {
        let v = self.seg_header(name)?;
        let h = v.header();
        if h.owner_uid != sys::euid() {
            return Err(Error::PermissionDenied {
                name: name.to_string(),
                detail: "only the owner may change the mode".into(),
            });
        }
        h.mode
            .store(mode & 0o777, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Map the header of `name` for inspection (`seg_ctl(sid, STAT)`).
    pub fn seg_header(&self, name: &str) -> Result<HeaderView> {
        let info = self.seg_find(name)?;
        let v = HeaderView::open_path(
            &segment::seg_path(self.registry.dir(), name),
            info.header_size,
        )?;
        segment::check_header(v.header(), &info)?;
        Ok(v)
    }

    /// `vas_create(name, perms)`.
    pub fn vas_create(&self, name: &str, mode: u32) -> Result<VasInfo> {
        self.registry.vas_create(name, mode)
    }

    /// `vas_find(name)`.
    pub fn vas_find(&self, name: &str) -> Result<VasInfo> {
        self.registry.vas_find(name)
    }

    /// `vas_clone(vid)`.
    pub fn vas_clone(&self, from: &str, to: &str) -> Result<VasInfo> {
        self.registry.vas_clone(from, to)
    }

    /// Remove a VAS from the registry.
    pub fn vas_remove(&self, name: &str) -> Result<()> {
        self.registry.vas_remove(name)
    }

    /// `seg_attach(vid, sid)`: add a segment to a VAS with an access mode.
    pub fn seg_attach(&self, vas: &str, seg: &str, access: Access) -> Result<()> {
        self.registry.vas_add_seg(vas, seg, access)
    }

    /// `seg_detach(vid, sid)`.
    pub fn seg_detach(&self, vas: &str, seg: &str) -> Result<()> {
        self.registry.vas_remove_seg(vas, seg)
    }

    /// `vas_attach(vid)`: map the VAS's segments into this process.
    pub fn vas_attach(&self, vas: &str, opts: AttachOptions) -> Result<VasHandle<'_>> {
        let info = self.registry.vas_find(vas)?;
        VasHandle::attach(self, &info, opts)
    }
}
