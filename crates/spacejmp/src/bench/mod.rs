//! The SpaceJMP benchmarks of issue 5 as a library, for `memlab jmp` and
//! `examples/jmpbench.rs` (feature `bench`).
//!
//! Four workloads, each a function of one [`Jmp`] over a scratch store:
//!
//! - **switch**: latency of `vas_switch` between two disjoint VASes with
//!   lockable segments (a lock hand-over) and without (bookkeeping only),
//!   between two *overlapping* VASes (on Linux a process-wide remap,
//!   labelled as such and counted in `remaps_per_switch`), and the baseline
//!   `mmap` + touch + `munmap` of the same segment file. Every switch touches
//!   one byte of the segment it enters. A size sweep (2 MiB to 4 GiB) sets
//!   the in-process remap against the process-per-VAS backend
//!   ([`crate::procvas`]: one process per VAS keeps its page table; the
//!   switch is a hand-off between processes), for overlapping and disjoint
//!   VASes, with the faults each switch takes.
//! - **attach**: `vas_attach` + switch + touch of an existing segment
//!   (1 GiB), lazily and pre-faulted, with 4 KiB pages (tmpfs) and 2 MiB
//!   pages (hugetlbfs). For 2 MiB pages, [`HugePages::Auto`] uses a mounted
//!   hugetlbfs or mounts one, and reserves the pages by raising
//!   `/proc/sys/vm/nr_hugepages`; both need root. Everything it changed is
//!   put back afterwards. When the pages cannot be had, a note says why and
//!   no 2 MiB row is printed.
//! - **gups**: SpaceJMP §5.2. A table split into windows; each batch of
//!   updates goes to one random window. `MAP` remaps the window's file at one
//!   fixed address per batch (`mmap MAP_FIXED`); `VAS-overlap` switches
//!   between VASes whose segments share one base (the paper's setting: more
//!   data than address space) — on Linux a remap; `VAS-disjoint` gives every
//!   window its own base, so a switch is a lock hand-over; `MP` runs one
//!   process per window and sends the update values over a shared-memory
//!   ring; `VAS-process` gives each overlapping window's VAS its own process
//!   and moves one lane between them (page tables kept: it counts the
//!   faults after the first pass). Figure: millions of updates per second.
//! - **persist**: SpaceJMP §5.4 (SAMTools). An index of string keys → u64
//!   (a [`SegMap`] whose nodes live in a segment); a fresh process's time
//!   from spawn to its first answered query, against (a) rebuilding a
//!   `HashMap<String, u64>` from a file serialized with serde + bincode and
//!   (b) an `mmap`ed file holding an open-addressing table of offsets.
//!
//! Child processes (the persistence readers and the MP workers) re-run the
//! calling program: [`Options::child`] is the command that reaches
//! [`child_main`] (`memlab __jmp` or `jmpbench --child`). Each cell runs
//! [`Options::repeat`] times; rows carry the median and the min and max.

use crate::{Access, AttachOptions, Config, Jmp, SegMap, SegOptions};
use serde::ser::{Serialize, Serializer};
use std::collections::HashMap;
use std::ffi::OsString;
use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

mod attach;
mod gups;
mod lane;
mod persist;
mod switch;

use attach::{attach_huge, bench_attach};
use gups::{bench_gups, gups_mp_child, gups_row, gups_sizes, update_batch};
use persist::bench_persist;
pub use persist::child_main;
use switch::bench_switch;

/// Errors of a benchmark run.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BenchError>;

/// One of the four workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// VAS switch latency vs `mmap`+`munmap`.
    Switch,
    /// Attach cost of a 1 GiB segment, 4 KiB and 2 MiB pages.
    Attach,
    /// GUPS over windows: MAP, MP, VAS.
    Gups,
    /// Time to first query of a persisted index.
    Persist,
}

impl Workload {
    /// Every workload, in the order they run.
    pub const ALL: [Workload; 4] = [
        Workload::Switch,
        Workload::Attach,
        Workload::Gups,
        Workload::Persist,
    ];

    /// The workload's name (also its `bench` field after `jmp-`).
    pub fn name(self) -> &'static str {
        match self {
            Workload::Switch => "switch",
            Workload::Attach => "attach",
            Workload::Gups => "gups",
            Workload::Persist => "persist",
        }
    }
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Workload, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| format!("unknown workload {s:?}: switch, attach, gups or persist"))
    }
}

/// Where the 2 MiB-page attach benchmark gets its pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Use a mounted hugetlbfs or mount one; reserve pages if too few are
    /// free (root only). Restores what it changed.
    Auto,
    /// Skip the 2 MiB rows.
    Off,
    /// A hugetlbfs directory with enough free pages, used as it is.
    Store(PathBuf),
}

/// What to run, and how big.
#[derive(Clone, Debug)]
pub struct Options {
    /// Workloads, in order.
    pub workloads: Vec<Workload>,
    /// Runs per cell (median, min, max).
    pub repeat: usize,
    /// Switch pairs per run between disjoint VASes (a hundredth of it for
    /// the remapping cells, a twentieth for the process-per-VAS cells).
    pub switch_iters: u64,
    /// Segment sizes of the switch-cost sweep (in-process remap against
    /// process-per-VAS).
    pub switch_sizes: Vec<u64>,
    /// Size of the attached segment.
    pub attach_bytes: u64,
    /// 2 MiB pages for the attach benchmark.
    pub huge: HugePages,
    /// Bytes per GUPS window.
    pub gups_window_bytes: u64,
    /// Updates per GUPS run.
    pub gups_updates: u64,
    /// Updates per batch (one switch or remap per batch).
    pub gups_batch: u64,
    /// Window counts.
    pub gups_windows: Vec<u64>,
    /// Records of the persisted index.
    pub records: u64,
    /// Scratch store directory (tmpfs; removed at the end).
    pub scratch: PathBuf,
    /// The command that runs [`child_main`] with the arguments appended:
    /// program, then its leading arguments.
    pub child: (PathBuf, Vec<OsString>),
}

impl Options {
    /// The full sizes of issue 5: 1 GiB attach, 64 MiB GUPS windows with
    /// 8 M updates at 1..16 windows, 10 M records; 3 runs per cell.
    pub fn full(child: (PathBuf, Vec<OsString>)) -> Options {
        Options {
            workloads: Workload::ALL.to_vec(),
            repeat: 3,
            switch_iters: 1_000_000,
            switch_sizes: vec![2 << 20, 64 << 20, 1 << 30, 4 << 30],
            attach_bytes: 1 << 30,
            huge: HugePages::Auto,
            gups_window_bytes: 64 << 20,
            gups_updates: 1 << 23,
            gups_batch: 4096,
            gups_windows: vec![1, 2, 4, 8, 16],
            records: 10_000_000,
            scratch: PathBuf::from(format!("/dev/shm/sjmp-bench-{}", std::process::id())),
            child,
        }
    }

    /// Under a minute on 2 cores: 200 k switch pairs, sizes 2 MiB to 1 GiB,
    /// 1 GiB attach, 16 MiB GUPS windows with 1 M updates at 1, 2, 4, 8
    /// windows, 1 M records
    /// (not 10 M: building and serializing 10 M records alone takes longer
    /// than the budget); 1 run per cell.
    pub fn quick(child: (PathBuf, Vec<OsString>)) -> Options {
        Options {
            repeat: 1,
            switch_iters: 200_000,
            switch_sizes: vec![2 << 20, 64 << 20, 1 << 30],
            gups_window_bytes: 16 << 20,
            gups_updates: 1 << 20,
            gups_windows: vec![1, 2, 4, 8],
            records: 1_000_000,
            ..Options::full(child)
        }
    }
}

/// A figure of a row.
#[derive(Clone, Debug, PartialEq)]
pub struct Fig {
    /// Field name.
    pub name: &'static str,
    /// Value.
    pub value: f64,
    /// Decimals worth printing.
    pub decimals: i32,
}

/// One result row.
#[derive(Clone, Debug)]
pub struct Row {
    /// `jmp-switch`, `jmp-attach`, `jmp-gups` or `jmp-persist`.
    pub bench: &'static str,
    /// What was measured.
    pub system: String,
    /// Text parameters (`pages`).
    pub labels: Vec<(&'static str, String)>,
    /// Numeric parameters and figures.
    pub figures: Vec<Fig>,
    /// What the system does, in words.
    pub note: String,
}

/// Where rows and notes go.
pub trait Sink {
    /// A result row.
    fn row(&mut self, row: Row);
    /// A caption or a skipped measurement, for `bench`.
    fn note(&mut self, bench: &str, text: &str);
}

/// Median, min and max of samples.
#[derive(Clone, Copy, Debug)]
struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

fn stat(mut v: Vec<f64>) -> Stat {
    v.sort_by(|a, b| a.total_cmp(b));
    Stat {
        median: v.get(v.len() / 2).copied().unwrap_or(f64::NAN),
        min: v.first().copied().unwrap_or(f64::NAN),
        max: v.last().copied().unwrap_or(f64::NAN),
    }
}

fn fig(name: &'static str, value: f64, decimals: i32) -> Fig {
    Fig {
        name,
        value,
        decimals,
    }
}

/// `name`, `name_min`, `name_max`.
fn figs3(out: &mut Vec<Fig>, names: [&'static str; 3], s: Stat, decimals: i32) {
    out.push(fig(names[0], s.median, decimals));
    out.push(fig(names[1], s.min, decimals));
    out.push(fig(names[2], s.max, decimals));
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Window of the scratch store (4 TiB), away from the default window so a
/// benchmark and a user's store can share a process.
const BENCH_WINDOW: (u64, u64) = (0x3000_0000_0000, 0x400_0000_0000);
/// Window of the hugetlbfs store (1 TiB), after [`BENCH_WINDOW`].
const HUGE_WINDOW: (u64, u64) = (0x3800_0000_0000, 0x100_0000_0000);

/// Run the selected workloads; rows and notes go to `sink`. The scratch
/// store is removed at the end, also after an error.
pub fn run(opts: &Options, sink: &mut dyn Sink) -> Result<(), BenchError> {
    let _ = std::fs::remove_dir_all(&opts.scratch);
    let res = (|| -> Res<()> {
        let jmp =
            Jmp::open(Config::with_store(&opts.scratch).window(BENCH_WINDOW.0, BENCH_WINDOW.1))?;
        for w in &opts.workloads {
            match w {
                Workload::Switch => bench_switch(&jmp, opts, sink)?,
                Workload::Attach => {
                    bench_attach(&jmp, opts, sink, "4KiB")?;
                    attach_huge(opts, sink)?;
                }
                Workload::Gups => bench_gups(&jmp, opts, sink)?,
                Workload::Persist => bench_persist(&jmp, opts, sink)?,
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&opts.scratch);
    res
}

fn seg(
    jmp: &Jmp,
    name: &str,
    size: u64,
    lockable: bool,
    base: Option<u64>,
    overlap: bool,
) -> Res<()> {
    let opts = SegOptions {
        base,
        lockable,
        allow_overlap: overlap,
        ..SegOptions::default()
    };
    jmp.seg_alloc(name, size, &opts)?;
    Ok(())
}

fn vas(jmp: &Jmp, name: &str, segs: &[&str]) -> Res<()> {
    jmp.vas_create(name, 0o660)?;
    for s in segs {
        jmp.seg_attach(name, s, Access::Write)?;
    }
    Ok(())
}

fn child_command(opts: &Options) -> Command {
    let mut c = Command::new(&opts.child.0);
    c.args(&opts.child.1);
    c
}
