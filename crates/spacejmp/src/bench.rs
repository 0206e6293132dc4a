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
//!   one byte of the segment it enters.
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
//!   ring. Figure: millions of updates per second.
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
    /// the remapping cells).
    pub switch_iters: u64,
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

    /// Under a minute on 2 cores: 200 k switch pairs, 1 GiB attach, 16 MiB
    /// GUPS windows with 1 M updates at 1, 2, 4 windows, 1 M records
    /// (not 10 M: building and serializing 10 M records alone takes longer
    /// than the budget); 1 run per cell.
    pub fn quick(child: (PathBuf, Vec<OsString>)) -> Options {
        Options {
            repeat: 1,
            switch_iters: 200_000,
            gups_window_bytes: 16 << 20,
            gups_updates: 1 << 20,
            gups_windows: vec![1, 2, 4],
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

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

impl Row {
    /// Header line matching [`Row::to_table_line`].
    pub const TABLE_HEADER: &'static str = "bench        system                 figures";

    /// The row as one JSON object (`bench`, `system`, `threads`, labels,
    /// figures, `note`).
    pub fn to_json(&self) -> String {
        let mut s = format!(
            "{{\"bench\":{},\"system\":{},\"threads\":1",
            json_str(self.bench),
            json_str(&self.system)
        );
        for (k, v) in &self.labels {
            s += &format!(",{}:{}", json_str(k), json_str(v));
        }
        for f in &self.figures {
            if f.value.is_finite() {
                s += &format!(
                    ",{}:{:.*}",
                    json_str(f.name),
                    f.decimals.max(0) as usize,
                    f.value
                );
            } else {
                s += &format!(",{}:null", json_str(f.name));
            }
        }
        s + &format!(",\"note\":{}}}", json_str(&self.note))
    }

    /// The row as one aligned text line.
    pub fn to_table_line(&self) -> String {
        let mut f: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        f.extend(
            self.figures
                .iter()
                .map(|x| format!("{}={:.*}", x.name, x.decimals.clamp(0, 2) as usize, x.value)),
        );
        format!(
            "{:<12} {:<22} {}  ({})",
            self.bench,
            self.system,
            f.join(" "),
            self.note
        )
    }
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

const SWITCH_BENCH: &str = "jmp-switch";

fn bench_switch(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink) -> Res<()> {
    let mib = 1u64 << 20;
    seg(jmp, "sw-p", mib, true, None, false)?;
    seg(jmp, "sw-q", mib, true, None, false)?;
    seg(jmp, "sw-pn", mib, false, None, false)?;
    seg(jmp, "sw-qn", mib, false, None, false)?;
    let r = jmp.seg_alloc("sw-r", mib, &SegOptions::default())?;
    jmp.seg_clone("sw-r", "sw-r2")?;
    for (v, s) in [
        ("sw-vp", "sw-p"),
        ("sw-vq", "sw-q"),
        ("sw-vpn", "sw-pn"),
        ("sw-vqn", "sw-qn"),
        ("sw-vr", "sw-r"),
        ("sw-vr2", "sw-r2"),
    ] {
        vas(jmp, v, &[s])?;
    }
    let iters = opts.switch_iters.max(100);
    sink.note(
        SWITCH_BENCH,
        "1 MiB segments; each switch touches one byte of the segment it enters; \
         overlap-remap is a process-wide mmap MAP_FIXED on Linux, not a CR3 write",
    );
    for (label, a, b, sa, sb, n, note) in [
        (
            "vas-disjoint+locks",
            "sw-vp",
            "sw-vq",
            "sw-p",
            "sw-q",
            iters,
            "no mapping change; exclusive segment locks",
        ),
        (
            "vas-disjoint",
            "sw-vpn",
            "sw-vqn",
            "sw-pn",
            "sw-qn",
            iters,
            "no mapping change; no lockable segments",
        ),
        (
            "vas-overlap-remap",
            "sw-vr",
            "sw-vr2",
            "sw-r",
            "sw-r2",
            iters / 100,
            "process-wide remap (mmap MAP_FIXED), not a CR3 write",
        ),
    ] {
        let ha = jmp.vas_attach(a, AttachOptions::default())?;
        let hb = jmp.vas_attach(b, AttachOptions::default())?;
        let before = jmp.stats().snapshot();
        let mut samples = Vec::new();
        for _ in 0..opts.repeat {
            let t = Instant::now();
            for _ in 0..n {
                let x = ha.switch()?;
                black_box(x.bytes(sa)?[0]);
                drop(x);
                let y = hb.switch()?;
                black_box(y.bytes(sb)?[0]);
                drop(y);
            }
            samples.push(t.elapsed().as_nanos() as f64 / (2 * n) as f64);
        }
        let after = jmp.stats().snapshot();
        let mut figures = vec![fig("seg_mib", 1.0, 0)];
        figs3(
            &mut figures,
            ["ns_per_switch", "ns_per_switch_min", "ns_per_switch_max"],
            stat(samples),
            1,
        );
        figures.push(fig(
            "remaps_per_switch",
            (after.remaps - before.remaps) as f64
                / (after.switches - before.switches).max(1) as f64,
            2,
        ));
        sink.row(Row {
            bench: SWITCH_BENCH,
            system: label.into(),
            labels: Vec::new(),
            figures,
            note: note.into(),
        });
    }
    // Baseline: mmap + touch + munmap of the same segment file.
    let path = jmp.registry().dir().join("seg.sw-r");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let n = iters / 100;
    let mut samples = Vec::new();
    for _ in 0..opts.repeat {
        let t = Instant::now();
        for _ in 0..2 * n {
            // SAFETY: a fresh shared mapping of our own file at a
            // kernel-chosen address, read once, unmapped right after.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    r.size as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                );
                if p == libc::MAP_FAILED {
                    return Err("mmap of the switch segment failed".into());
                }
                black_box(*(p as *const u8).add(r.header_size as usize));
                libc::munmap(p, r.size as usize);
            }
        }
        samples.push(t.elapsed().as_nanos() as f64 / (2 * n) as f64);
    }
    let mut figures = vec![fig("seg_mib", 1.0, 0)];
    figs3(
        &mut figures,
        ["ns_per_switch", "ns_per_switch_min", "ns_per_switch_max"],
        stat(samples),
        1,
    );
    figures.push(fig("remaps_per_switch", 1.0, 2));
    sink.row(Row {
        bench: SWITCH_BENCH,
        system: "mmap+munmap".into(),
        labels: Vec::new(),
        figures,
        note: "baseline: map, touch one byte, unmap".into(),
    });
    for v in ["sw-vp", "sw-vq", "sw-vpn", "sw-vqn", "sw-vr", "sw-vr2"] {
        jmp.vas_remove(v)?;
    }
    for s in ["sw-p", "sw-q", "sw-pn", "sw-qn", "sw-r", "sw-r2"] {
        jmp.seg_remove(s)?;
    }
    Ok(())
}

const ATTACH_BENCH: &str = "jmp-attach";

fn bench_attach(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink, pages: &str) -> Res<()> {
    let size = opts.attach_bytes;
    let t = Instant::now();
    seg(jmp, "at-big", size, true, None, false)?;
    let create_ms = t.elapsed().as_secs_f64() * 1e3;
    vas(jmp, "at-v", &["at-big"])?;
    for prefault in [false, true] {
        let mut samples = Vec::new();
        for _ in 0..opts.repeat {
            let t = Instant::now();
            let h = jmp.vas_attach("at-v", AttachOptions { prefault })?;
            let a = h.switch()?;
            black_box(a.bytes("at-big")?[0]);
            samples.push(t.elapsed().as_secs_f64() * 1e6);
            drop(a);
            drop(h);
        }
        let mut figures = vec![fig("seg_mib", (size >> 20) as f64, 0)];
        figs3(
            &mut figures,
            ["attach_us", "attach_us_min", "attach_us_max"],
            stat(samples),
            1,
        );
        figures.push(fig("create_ms", create_ms, 2));
        sink.row(Row {
            bench: ATTACH_BENCH,
            system: if prefault {
                "vas_attach+populate"
            } else {
                "vas_attach"
            }
            .into(),
            labels: vec![("pages", pages.to_string())],
            figures,
            note: format!(
                "existing segment: open, validate header, mmap{}, switch, touch 1 byte",
                if prefault {
                    " + MADV_POPULATE (pre-fault every page)"
                } else {
                    ""
                }
            ),
        });
    }
    jmp.vas_remove("at-v")?;
    jmp.seg_remove("at-big")?;
    Ok(())
}

/// The 2 MiB-page attach rows, or a note saying why there are none.
fn attach_huge(opts: &Options, sink: &mut dyn Sink) -> Res<()> {
    // Header page + data pages, + 2 for the registry file and its
    // replacement (each is one huge page on hugetlbfs).
    let need = opts.attach_bytes.div_ceil(2 << 20) + 3;
    let setup = match &opts.huge {
        HugePages::Off => {
            sink.note(ATTACH_BENCH, "2 MiB pages: skipped (--huge off)");
            return Ok(());
        }
        HugePages::Store(dir) => HugeSetup::given(dir.clone()),
        HugePages::Auto => match HugeSetup::auto(&opts.scratch, need) {
            Ok(s) => s,
            Err(why) => {
                sink.note(ATTACH_BENCH, &format!("2 MiB pages: not measured: {why}"));
                return Ok(());
            }
        },
    };
    if let Some(what) = &setup.changed {
        sink.note(
            ATTACH_BENCH,
            &format!("2 MiB pages: {what} (restored afterwards)"),
        );
    }
    let store = setup
        .store
        .join(format!("sjmp-bench-{}", std::process::id()));
    let res = (|| -> Res<()> {
        let hj = Jmp::open(Config::with_store(&store).window(HUGE_WINDOW.0, HUGE_WINDOW.1))?;
        bench_attach(&hj, opts, sink, "2MiB")
    })();
    let _ = std::fs::remove_dir_all(&store);
    drop(setup);
    res
}

/// A hugetlbfs store for the attach benchmark, and what was changed on the
/// system to get it (undone on drop).
struct HugeSetup {
    store: PathBuf,
    changed: Option<String>,
    mounted: Option<PathBuf>,
    old_nr: Option<u64>,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

fn meminfo(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
}

impl HugeSetup {
    fn given(store: PathBuf) -> HugeSetup {
        HugeSetup {
            store,
            changed: None,
            mounted: None,
            old_nr: None,
        }
    }

    /// Find or mount a 2 MiB hugetlbfs and make sure `need` pages are free.
    fn auto(scratch: &Path, need: u64) -> Result<HugeSetup, String> {
        if meminfo("Hugepagesize:") != Some(2048) {
            return Err("the default huge page size is not 2 MiB (or no hugetlb support)".into());
        }
        let mut s = HugeSetup::given(PathBuf::new());
        let mut changed = Vec::new();
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let existing = mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"hugetlbfs") && f.get(3).is_some_and(|o| !o.contains("pagesize=1G")))
                .then(|| PathBuf::from(f[1]))
        });
        match existing {
            Some(dir) => s.store = dir,
            None => {
                let dir = scratch.with_extension("hugetlbfs");
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                let c = |x: &str| std::ffi::CString::new(x).unwrap_or_default();
                let (src, fs, data) = (c("none"), c("hugetlbfs"), c("pagesize=2M"));
                let target = c(&dir.display().to_string());
                // SAFETY: valid NUL-terminated strings that outlive the call.
                let r = unsafe {
                    libc::mount(
                        src.as_ptr(),
                        target.as_ptr(),
                        fs.as_ptr(),
                        0,
                        data.as_ptr().cast(),
                    )
                };
                if r != 0 {
                    let e = std::io::Error::last_os_error();
                    let _ = std::fs::remove_dir(&dir);
                    return Err(format!(
                        "no hugetlbfs mounted and mounting one at {} failed: {e} (needs root)",
                        dir.display()
                    ));
                }
                changed.push(format!("mounted hugetlbfs at {}", dir.display()));
                s.store = dir.clone();
                s.mounted = Some(dir);
            }
        }
        let free = meminfo("HugePages_Free:").unwrap_or(0);
        if free < need {
            let total = meminfo("HugePages_Total:").unwrap_or(0);
            let want = total + (need - free);
            let old: u64 = std::fs::read_to_string(NR_HUGEPAGES)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(total);
            if let Err(e) = std::fs::write(NR_HUGEPAGES, format!("{want}\n")) {
                return Err(format!(
                    "{free} free 2 MiB pages, {need} needed, and writing {want} to {NR_HUGEPAGES} \
                     failed: {e} (needs root: `echo {want} > {NR_HUGEPAGES}`)"
                ));
            }
            s.old_nr = Some(old);
            let got = meminfo("HugePages_Free:").unwrap_or(0);
            if got < need {
                return Err(format!(
                    "asked the kernel for {want} huge pages; only {got} free, {need} needed \
                     (memory too fragmented or too small)"
                ));
            }
            changed.push(format!("raised {NR_HUGEPAGES} from {old} to {want}"));
        }
        s.changed = (!changed.is_empty()).then(|| changed.join(", "));
        Ok(s)
    }
}

impl Drop for HugeSetup {
    fn drop(&mut self) {
        if let Some(dir) = &self.mounted {
            if let Ok(t) = std::ffi::CString::new(dir.display().to_string()) {
                // SAFETY: a valid path string; unmounts what we mounted.
                unsafe { libc::umount(t.as_ptr()) };
            }
            let _ = std::fs::remove_dir(dir);
        }
        if let Some(old) = self.old_nr {
            let _ = std::fs::write(NR_HUGEPAGES, format!("{old}\n"));
        }
    }
}

const GUPS_BENCH: &str = "jmp-gups";

/// One GUPS cell's rows: its parameters and the median/min/max rate.
fn gups_row(system: &str, w: u64, opts: &Options, mups: Vec<f64>, note: &str) -> Row {
    let (win, batch, updates) = gups_sizes(opts);
    let mut figures = vec![
        fig("windows", w as f64, 0),
        fig("window_mib", win as f64 / (1 << 20) as f64, 2),
        fig("batch", batch as f64, 0),
        fig("updates", updates as f64, 0),
    ];
    figs3(
        &mut figures,
        ["mups", "mups_min", "mups_max"],
        stat(mups),
        2,
    );
    if system == "MP" {
        figures.push(fig("processes", (w + 1) as f64, 0));
    }
    Row {
        bench: GUPS_BENCH,
        system: system.into(),
        labels: Vec::new(),
        figures,
        note: note.into(),
    }
}

/// `batch` random updates into `t64`.
fn update_batch(t64: &mut [u64], rng: &mut Rng, batch: u64) {
    let words = t64.len();
    for _ in 0..batch {
        let r = rng.next();
        t64[(r as usize) % words] ^= r;
    }
}

/// Window bytes, batch and updates of a GUPS run, within sane bounds.
fn gups_sizes(opts: &Options) -> (u64, u64, u64) {
    let batch = opts.gups_batch.clamp(1, RING / 2);
    (
        opts.gups_window_bytes.max(1 << 16),
        batch,
        opts.gups_updates.max(batch),
    )
}

fn bench_gups(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink) -> Res<()> {
    let (win, batch, updates) = gups_sizes(opts);
    let wbase = jmp.window().base() + (jmp.window().len() / 2);
    sink.note(
        GUPS_BENCH,
        "SpaceJMP §5.2: million updates/s; one random window per batch. VAS-overlap \
         switches by a process-wide remap on Linux; MP shares the machine's cores",
    );
    for &w in &opts.gups_windows {
        let mut ov = Vec::new();
        let mut dj = Vec::new();
        for i in 0..w {
            // Overlapping windows: all at one base (the paper's setting).
            let o = format!("g{w}-o{i}");
            seg(jmp, &o, win, false, Some(wbase), true)?;
            vas(jmp, &format!("gv{w}-o{i}"), &[&o])?;
            let d = format!("g{w}-d{i}");
            seg(jmp, &d, win, false, None, false)?;
            vas(jmp, &format!("gv{w}-d{i}"), &[&d])?;
            ov.push(o);
            dj.push(d);
        }
        for (label, names, tag, note) in [
            (
                "VAS-overlap",
                &ov,
                "o",
                "one base for all windows; switch = process-wide remap on Linux",
            ),
            (
                "VAS-disjoint",
                &dj,
                "d",
                "windows at distinct bases; switch changes no mapping",
            ),
        ] {
            let hs: Vec<_> = (0..w)
                .map(|i| jmp.vas_attach(&format!("gv{w}-{tag}{i}"), AttachOptions::default()))
                .collect::<Result<_, _>>()?;
            // Warm up: fault every page of every window once (the paper's
            // table is resident).
            for (h, n) in hs.iter().zip(names.iter()) {
                let mut a = h.switch()?;
                for b in a.bytes_mut(n)?.iter_mut().step_by(4096) {
                    *b = 0;
                }
            }
            let mut mups = Vec::new();
            for _ in 0..opts.repeat {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
                let t = Instant::now();
                let mut done = 0;
                while done < updates {
                    let i = (rng.next() % w) as usize;
                    let mut a = hs[i].switch()?;
                    let b = a.bytes_mut(&names[i])?;
                    let words = b.len().min(win as usize) / 8;
                    // SAFETY: the data area is at least `words * 8` bytes
                    // and 8-aligned (it starts one page after the base);
                    // the slice does not outlive the guard `a`.
                    let t64 = unsafe {
                        std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut u64, words)
                    };
                    update_batch(t64, &mut rng, batch);
                    done += batch;
                }
                mups.push(updates as f64 / t.elapsed().as_secs_f64() / 1e6);
            }
            sink.row(gups_row(label, w, opts, mups, note));
        }
        gups_map(jmp, opts, sink, w, &ov)?;
        gups_mp(jmp, opts, sink, w, &dj)?;
        for i in 0..w {
            jmp.vas_remove(&format!("gv{w}-o{i}"))?;
            jmp.vas_remove(&format!("gv{w}-d{i}"))?;
            jmp.seg_remove(&ov[i as usize])?;
            jmp.seg_remove(&dj[i as usize])?;
        }
    }
    Ok(())
}

/// MAP: remap the window's file at one fixed address per batch.
fn gups_map(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink, w: u64, windows: &[String]) -> Res<()> {
    let (win, batch, updates) = gups_sizes(opts);
    let files: Vec<std::fs::File> = windows
        .iter()
        .map(|n| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(jmp.registry().dir().join(format!("seg.{n}")))
        })
        .collect::<Result<_, _>>()?;
    let hdr = jmp.registry().page_size();
    // SAFETY: a private reservation for the MAP variant, replaced with
    // MAP_FIXED below only within itself, unmapped at the end.
    let region = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            win as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if region == libc::MAP_FAILED {
        return Err("cannot reserve the MAP region".into());
    }
    let words = (win / 8) as usize;
    let mut mups = Vec::new();
    let mut res: Res<()> = Ok(());
    'runs: for _ in 0..opts.repeat {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let t = Instant::now();
        let mut done = 0;
        while done < updates {
            let i = (rng.next() % w) as usize;
            // SAFETY: MAP_FIXED over our own reservation `region`, `win`
            // bytes of the window file after its header page.
            let p = unsafe {
                libc::mmap(
                    region,
                    win as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    files[i].as_raw_fd(),
                    hdr as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                res = Err("mmap of a GUPS window failed".into());
                break 'runs;
            }
            // SAFETY: `p` maps `win` bytes read-write until the next remap,
            // and the slice is dropped before it.
            let t64 = unsafe { std::slice::from_raw_parts_mut(p as *mut u64, words) };
            update_batch(t64, &mut rng, batch);
            done += batch;
        }
        mups.push(updates as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    // SAFETY: our reservation (possibly remapped over), no longer used.
    unsafe { libc::munmap(region, win as usize) };
    res?;
    sink.row(gups_row(
        "MAP",
        w,
        opts,
        mups,
        "mmap MAP_FIXED of the window file per batch",
    ));
    Ok(())
}

/// Ring of update values in a shared segment (SPSC): head, tail and done
/// words on their own cache lines, then `RING` slots.
const RING: u64 = 1 << 16;

struct Ring {
    base: u64,
}

impl Ring {
    fn word(&self, i: u64) -> &AtomicU64 {
        // SAFETY: the ring segment's data area is mapped (both processes
        // keep their VAS attached while they use the ring) and 64-aligned;
        // the words at byte offsets 0, 64 and 128 are the head, tail and
        // done counters, accessed only atomically.
        unsafe { &*((self.base + i * 64) as *const AtomicU64) }
    }
    fn head(&self) -> &AtomicU64 {
        self.word(0)
    }
    fn tail(&self) -> &AtomicU64 {
        self.word(1)
    }
    fn done(&self) -> &AtomicU64 {
        self.word(2)
    }
    fn slot(&self, k: u64) -> *mut u64 {
        (self.base + 256 + (k % RING) * 8) as *mut u64
    }
}

fn child_command(opts: &Options) -> Command {
    let mut c = Command::new(&opts.child.0);
    c.args(&opts.child.1);
    c
}

/// MP: one process per window; the driver sends update values over a
/// shared-memory ring per process.
fn gups_mp(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink, w: u64, windows: &[String]) -> Res<()> {
    let (_, batch, updates) = gups_sizes(opts);
    let mut rings = Vec::new();
    let mut handles = Vec::new();
    for i in 0..w {
        let r = format!("gr{w}-{i}");
        seg(jmp, &r, 256 + RING * 8, false, None, false)?;
        let v = format!("gm{w}-{i}");
        vas(jmp, &v, &[&windows[i as usize], &r])?;
        let h = jmp.vas_attach(&v, AttachOptions::default())?;
        let base = h
            .segments()
            .find(|(s, _)| s.name == r)
            .map(|(s, _)| s.data_start())
            .ok_or("ring segment missing from its VAS")?;
        rings.push(Ring { base });
        handles.push(h);
    }
    let store = jmp.registry().dir().display().to_string();
    let mut mups = Vec::new();
    for _ in 0..opts.repeat {
        for r in &rings {
            r.head().store(0, Ordering::Relaxed);
            r.tail().store(0, Ordering::Relaxed);
            r.done().store(0, Ordering::Release);
        }
        let mut kids = Vec::new();
        for i in 0..w {
            let mut c = child_command(opts)
                .args([
                    &format!("gups-mp:{w}:{}", windows[i as usize]),
                    &store,
                    &i.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()?;
            let mut rd = BufReader::new(c.stdout.take().ok_or("child stdout")?);
            let mut line = String::new();
            rd.read_line(&mut line)?;
            if line.trim() != "ready" {
                let _ = c.kill();
                let _ = c.wait();
                return Err(format!("gups child: {line:?}").into());
            }
            kids.push(c);
        }
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let t = Instant::now();
        let mut done = 0;
        while done < updates {
            let r = &rings[(rng.next() % w) as usize];
            let head = r.head().load(Ordering::Relaxed);
            while head + batch - r.tail().load(Ordering::Acquire) > RING {
                std::thread::yield_now();
            }
            for k in 0..batch {
                // SAFETY: slot `head + k` is free (the consumer's tail is at
                // most RING - batch behind) and written only by this producer.
                unsafe { *r.slot(head + k) = rng.next() };
            }
            r.head().store(head + batch, Ordering::Release);
            done += batch;
        }
        for r in &rings {
            while r.tail().load(Ordering::Acquire) != r.head().load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
        }
        mups.push(updates as f64 / t.elapsed().as_secs_f64() / 1e6);
        for r in &rings {
            r.done().store(1, Ordering::Release);
        }
        for mut c in kids {
            c.wait()?;
        }
    }
    drop(handles);
    sink.row(gups_row(
        "MP",
        w,
        opts,
        mups,
        "one process per window, updates over a shared-memory ring",
    ));
    for i in 0..w {
        jmp.vas_remove(&format!("gm{w}-{i}"))?;
        jmp.seg_remove(&format!("gr{w}-{i}"))?;
    }
    Ok(())
}

fn gups_mp_child(w: &str, window: &str, store: &str, i: u64) -> Res<()> {
    let jmp = Jmp::open(Config::with_store(store))?;
    let vh = jmp.vas_attach(&format!("gm{w}-{i}"), AttachOptions::default())?;
    let mut a = vh.switch()?;
    let ring = Ring {
        base: a.bytes(&format!("gr{w}-{i}"))?.as_ptr() as u64,
    };
    let b = a.bytes_mut(window)?;
    let words = b.len() / 8;
    // SAFETY: the window's data area is 8-aligned and `words * 8` bytes,
    // and `a` lives until the process exits.
    let t64 = unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut u64, words) };
    for x in t64.iter_mut().step_by(512) {
        *x = 0;
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut tail = ring.tail().load(Ordering::Relaxed);
    let mut idle = 0u32;
    loop {
        let head = ring.head().load(Ordering::Acquire);
        if head != tail {
            for k in tail..head {
                // SAFETY: slots in [tail, head) were published by the
                // producer's Release store of head.
                let r = unsafe { *ring.slot(k) };
                t64[(r as usize) % words] ^= r;
            }
            tail = head;
            ring.tail().store(tail, Ordering::Release);
            idle = 0;
        } else if ring.done().load(Ordering::Acquire) != 0 {
            break;
        } else {
            idle += 1;
            if idle > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
    std::process::exit(0);
}

const PERSIST_BENCH: &str = "jmp-persist";

fn key(i: u64) -> String {
    format!("record-{i:010}")
}

fn fnv(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The records `key(i) → i` for `i < n`, serialized as a map without
/// building one: bincode writes a map as its length and the pairs, which a
/// reader deserializes straight into a `HashMap<String, u64>`.
struct Records(u64);

impl Serialize for Records {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // (`Range::map` has an exact size hint, so bincode gets the length.)
        s.collect_map((0..self.0).map(|i| (key(i), i)))
    }
}

/// Offset-pointer file: `[nslots u64][slots: (key_off, key_len, val) u64 x 3...][keys...]`.
fn write_offset_file(path: &Path, n: u64) -> Res<()> {
    let slots = (n * 2).next_power_of_two();
    let mut table = vec![(0u64, 0u64, 0u64); slots as usize];
    let mut keys = Vec::with_capacity((n * 17) as usize);
    let keys_at = 8 + slots * 24;
    for i in 0..n {
        let k = key(i);
        let mut s = fnv(k.as_bytes()) & (slots - 1);
        while table[s as usize].1 != 0 {
            s = (s + 1) & (slots - 1);
        }
        table[s as usize] = (keys_at + keys.len() as u64, k.len() as u64, i);
        keys.extend_from_slice(k.as_bytes());
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(&slots.to_le_bytes())?;
    for (o, l, v) in table {
        f.write_all(&o.to_le_bytes())?;
        f.write_all(&l.to_le_bytes())?;
        f.write_all(&v.to_le_bytes())?;
    }
    f.write_all(&keys)?;
    f.flush()?;
    Ok(())
}

/// Entry point of the child processes: `args` are `ROLE ARG N` as passed
/// by this module (persistence readers print the answer for record `N` and
/// exit; `gups-mp:W:WINDOW STORE I` is GUPS worker `I`). Exits the process
/// on success.
pub fn child_main(args: &[String]) -> Result<(), BenchError> {
    let [role, arg, q] = args else {
        return Err(format!("child: expected ROLE ARG N, got {args:?}").into());
    };
    let q: u64 = q.parse().map_err(|e| format!("child: N {q:?}: {e}"))?;
    if let Some(rest) = role.strip_prefix("gups-mp:") {
        let (w, window) = rest.split_once(':').ok_or("child: gups-mp:W:WINDOW")?;
        return gups_mp_child(w, window, arg, q);
    }
    let k = key(q);
    let ans: u64 = match role.as_str() {
        "spawn" => q,
        "jmp" => {
            let jmp = Jmp::open(Config::with_store(arg))?;
            let vh = jmp.vas_attach("pv", AttachOptions::default())?;
            let a = vh.switch()?;
            let root = a.root::<SegMap<u64>>("ps")?;
            let m = root.get(&a)?;
            *m.get(&a, k.as_bytes())?.ok_or("missing record")?
        }
        "bincode" => {
            let mut buf = Vec::new();
            std::fs::File::open(arg)?.read_to_end(&mut buf)?;
            let m: HashMap<String, u64> = bincode::deserialize(&buf)?;
            *m.get(&k).ok_or("missing record")?
        }
        "offset" => {
            let f = std::fs::File::open(arg)?;
            let len = f.metadata()?.len() as usize;
            // SAFETY: a shared read-only mapping of a file nobody modifies
            // while the child runs.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err("mmap of the offset file failed".into());
            }
            // SAFETY: the mapping is `len` bytes and lives until exit.
            let b = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
            let rd = |o: usize| {
                b.get(o..o + 8)
                    .and_then(|x| x.try_into().ok())
                    .map_or(0, u64::from_le_bytes)
            };
            let slots = rd(0).max(1);
            let mut s = fnv(k.as_bytes()) & (slots - 1);
            loop {
                let e = 8 + s as usize * 24;
                let (o, l) = (rd(e) as usize, rd(e + 8) as usize);
                if l == 0 {
                    return Err("missing record".into());
                }
                if b.get(o..o + l) == Some(k.as_bytes()) {
                    break rd(e + 16);
                }
                s = (s + 1) & (slots - 1);
            }
        }
        _ => return Err(format!("child: unknown role {role:?}").into()),
    };
    println!("{ans}");
    std::io::stdout().flush()?;
    // Skip teardown of what we built: the measurement ends at the answer.
    std::process::exit(0);
}

fn time_child(opts: &Options, role: &str, arg: &Path, q: u64) -> Res<f64> {
    let t = Instant::now();
    let mut c = child_command(opts)
        .args([role, &arg.display().to_string(), &q.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(c.stdout.take().ok_or("child stdout")?).read_line(&mut line)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let status = c.wait()?;
    if line.trim() != q.to_string() {
        return Err(format!("child {role} answered {:?} ({status})", line.trim()).into());
    }
    Ok(ms)
}

fn bench_persist(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink) -> Res<()> {
    let n = opts.records.max(1);
    let dir = jmp.registry().dir().to_path_buf();
    // SegMap: a bucket array of 2n slots plus ~64 B per node and key.
    let seg_size = (n * 160).next_power_of_two().max(1 << 20);
    let t = Instant::now();
    jmp.seg_alloc("ps", seg_size, &SegOptions::default())?;
    vas(jmp, "pv", &["ps"])?;
    {
        let vh = jmp.vas_attach("pv", AttachOptions::default())?;
        let mut a = vh.switch()?;
        let mut m = SegMap::<u64>::new(&mut a, "ps", n)?;
        for i in 0..n {
            m.insert(&mut a, key(i).as_bytes(), i)?;
        }
        let root = a.alloc("ps", m)?;
        a.set_root("ps", root)?;
    }
    let build_jmp = t.elapsed().as_secs_f64();
    let ser = dir.join("records.bincode");
    let t = Instant::now();
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&ser)?);
        bincode::serialize_into(&mut f, &Records(n))?;
        f.flush()?;
    }
    let build_ser = t.elapsed().as_secs_f64();
    let off = dir.join("records.off");
    let t = Instant::now();
    write_offset_file(&off, n)?;
    let build_off = t.elapsed().as_secs_f64();
    sink.note(
        PERSIST_BENCH,
        &format!(
            "SpaceJMP §5.4: {n} records (\"record-NNNNNNNNNN\" -> u64); a fresh process's time \
             from spawn to its first answer; built in {build_jmp:.2} s (segment), \
             {build_ser:.2} s (bincode file), {build_off:.2} s (offset file)"
        ),
    );
    let q = n / 2 + n.min(7) / 2;
    let mut medians = Vec::new();
    for (role, arg, system, note, build) in [
        (
            "spawn",
            dir.clone(),
            "process-spawn",
            "fork+exec+print, no data",
            0.0,
        ),
        (
            "jmp",
            dir.clone(),
            "spacejmp-segment",
            "attach VAS, follow the root pointer, query in place",
            build_jmp,
        ),
        (
            "offset",
            off.clone(),
            "mmap-offset-pointers",
            "mmap the file, probe an open-addressing table of offsets",
            build_off,
        ),
        (
            "bincode",
            ser.clone(),
            "bincode-hashmap",
            "read the file, deserialize HashMap<String,u64> with serde + bincode",
            build_ser,
        ),
    ] {
        let mut s = Vec::new();
        for _ in 0..opts.repeat {
            s.push(time_child(opts, role, &arg, q)?);
        }
        let st = stat(s);
        medians.push((system, st.median));
        let mut figures = vec![fig("records", n as f64, 0)];
        figs3(
            &mut figures,
            ["first_query_ms", "first_query_ms_min", "first_query_ms_max"],
            st,
            2,
        );
        figures.push(fig("build_s", build, 3));
        sink.row(Row {
            bench: PERSIST_BENCH,
            system: system.into(),
            labels: Vec::new(),
            figures,
            note: note.into(),
        });
    }
    let get = |s: &str| {
        medians
            .iter()
            .find(|(x, _)| *x == s)
            .map_or(f64::NAN, |(_, m)| *m)
    };
    sink.row(Row {
        bench: PERSIST_BENCH,
        system: "ratio".into(),
        labels: Vec::new(),
        figures: vec![
            fig("records", n as f64, 0),
            fig(
                "bincode_over_jmp",
                get("bincode-hashmap") / get("spacejmp-segment"),
                2,
            ),
            fig(
                "offset_over_jmp",
                get("mmap-offset-pointers") / get("spacejmp-segment"),
                2,
            ),
        ],
        note: "time to first answer, ratios of medians (issue 5 expects bincode_over_jmp >= 20)"
            .into(),
    });
    jmp.vas_remove("pv")?;
    jmp.seg_remove("ps")?;
    let _ = std::fs::remove_file(&ser);
    let _ = std::fs::remove_file(&off);
    Ok(())
}
