//! `memlab jmp`: the SpaceJMP benchmarks (issue 5), run by
//! `spacejmp::bench` — this module only maps the command line onto its
//! options and its rows onto [`Reporter`] rows.
//!
//! The workloads re-run this binary for their child processes (the
//! persistence readers and the GUPS MP workers) as the hidden subcommand
//! `memlab __jmp ROLE ARG N`, which lands in [`child`].

use std::path::PathBuf;

use clap::Args;
use spacejmp::bench::{self, HugePages, Options, Sink, Workload};

use crate::error::{BenchError, Result};
use crate::report::{Reporter, Row};
use crate::RunOpts;

pub const ABOUT: &str = "SpaceJMP on Linux (issue 5, crate spacejmp): first-class address spaces \
    and lockable segments.\n\n\
    switch: vas_switch latency between two disjoint VASes with lockable segments (lock hand-over) and \
    without, between two overlapping VASes (on Linux a process-wide remap, mmap MAP_FIXED, not a CR3 \
    write: labelled vas-overlap-remap), and mmap+touch+munmap of the same 1 MiB segment file. A size \
    sweep (2 MiB to 4 GiB; --quick to 1 GiB) sets the in-process remap against the process-per-VAS \
    backend (vas-process-overlap / -disjoint: one process per VAS keeps its page table, the switch is a \
    futex hand-off of the thread's execution between two processes pinned to one CPU: the page-table \
    load is the kernel's, the hand-off user-level), with faults per switch and the hand-off floor \
    (process-handoff, empty VASes).\n\
    attach: vas_attach + switch + touch of an existing 1 GiB segment, lazy and pre-faulted, 4 KiB pages \
    (tmpfs) and 2 MiB pages (hugetlbfs). With --huge auto (default) memlab uses a mounted hugetlbfs or \
    mounts one next to its scratch store, and raises /proc/sys/vm/nr_hugepages by the pages it lacks \
    (both need root; `echo 520 > /proc/sys/vm/nr_hugepages` does it by hand); it puts both back \
    afterwards. Without the pages a note says why and there are no 2 MiB rows.\n\
    gups: SpaceJMP §5.2, million updates/s over a table split into windows, one random window per batch \
    of 4096: MAP (mmap MAP_FIXED of the window per batch), MP (one process per window, updates over a \
    shared-memory ring), VAS-overlap (one base, switch = remap), VAS-disjoint (switch = lock hand-over) \
    and VAS-process (one base, one process per window's VAS and lane, one lane per CPU; counts the page \
    faults after the first pass).\n\
    persist: SpaceJMP §5.4, an index of string keys -> u64 whose nodes live in a segment; a fresh \
    process's time from spawn to its first answered query vs rebuilding a HashMap from a serde + bincode \
    file and vs an mmap'd file of offset pointers.\n\n\
    Scratch store: /dev/shm/sjmp-bench-PID (removed at the end). --repeat N: median, min, max of N runs \
    per cell.\n\
    --quick: 200k switch pairs, sizes to 1 GiB, 16 MiB GUPS windows with 1M updates at 1,2,4,8 windows, 1M records \
    (not 10M: building and serializing 10M records alone takes longer than the budget), 1 run; \
    the 1 GiB attach stays.\n\n\
    Plot GUPS with: memlab plot FILE.jsonl --bench jmp-gups --x windows --y mups -o gups.png";

#[derive(Args)]
pub struct JmpArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Workloads, comma-separated
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "switch,attach,gups,persist",
        value_parser = parse_workload
    )]
    workloads: Vec<Workload>,
    /// Switch pairs per run between disjoint VASes (remapping cells: a hundredth)
    /// [default: 1000000; --quick: 200000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(100..))]
    switch_iters: Option<u64>,
    /// Segment sizes of the switch-cost sweep, MiB, comma-separated
    /// [default: 2,64,1024,4096; --quick: 2,64,1024]
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=65536))]
    switch_mib: Option<Vec<u64>>,
    /// Size of the attached segment, MiB
    #[arg(long, default_value = "1024", value_parser = clap::value_parser!(u64).range(1..=65536))]
    attach_mib: u64,
    /// 2 MiB pages for attach: auto (mount hugetlbfs / reserve pages as root), off,
    /// or a hugetlbfs directory with enough free pages
    #[arg(long, default_value = "auto", value_parser = parse_huge)]
    huge: HugePages,
    /// GUPS window size, KiB [default: 65536; --quick: 16384]
    #[arg(long, value_parser = clap::value_parser!(u64).range(64..=16 << 20))]
    window_kib: Option<u64>,
    /// GUPS updates per run [default: 8388608; --quick: 1048576]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    updates: Option<u64>,
    /// GUPS window counts, comma-separated [default: 1,2,4,8,16; --quick: 1,2,4,8]
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=256))]
    windows: Option<Vec<u64>>,
    /// Records of the persisted index [default: 10000000; --quick: 1000000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    records: Option<u64>,
}

fn parse_workload(s: &str) -> Result<Workload> {
    s.trim().parse().map_err(BenchError::Usage)
}

fn parse_huge(s: &str) -> Result<HugePages> {
    Ok(match s {
        "auto" => HugePages::Auto,
        "off" => HugePages::Off,
        dir => HugePages::Store(PathBuf::from(dir)),
    })
}

/// Rows of `spacejmp::bench` into the reporter.
struct ToReporter<'a> {
    rep: &'a mut Reporter,
    err: Option<std::io::Error>,
}

impl Sink for ToReporter<'_> {
    fn row(&mut self, r: bench::Row) {
        let mut row = Row::new(r.bench, &r.system, 1);
        for (k, v) in &r.labels {
            row = row.set(k, v.as_str());
        }
        for f in &r.figures {
            row = row.set_f(f.name, f.value, f.decimals);
        }
        row = row.set("note", r.note);
        if let Err(e) = self.rep.emit(row) {
            self.err.get_or_insert(e);
        }
    }

    fn note(&mut self, bench: &str, text: &str) {
        self.rep.note(bench, text);
    }
}

pub fn run(a: JmpArgs) -> Result<i32> {
    if a.run.threads.is_some() {
        eprintln!(
            "memlab jmp: note: --threads is ignored (one driver thread; MP uses processes, \
             VAS-process one lane per CPU)"
        );
    }
    let exe = std::env::current_exe()
        .map_err(|e| BenchError::io("cannot find the running executable", e))?;
    let child = (exe, vec![CHILD_SUBCOMMAND.into()]);
    let mut o = if a.run.quick {
        Options::quick(child)
    } else {
        Options::full(child)
    };
    let mut workloads = a.workloads;
    workloads.dedup();
    o.workloads = workloads;
    o.repeat = a.run.repeat(1);
    o.switch_iters = a.switch_iters.unwrap_or(o.switch_iters);
    if let Some(m) = a.switch_mib {
        o.switch_sizes = m.into_iter().map(|m| m << 20).collect();
    }
    o.attach_bytes = a.attach_mib << 20;
    o.huge = a.huge;
    o.gups_window_bytes = a.window_kib.map_or(o.gups_window_bytes, |k| k << 10);
    o.gups_updates = a.updates.unwrap_or(o.gups_updates);
    if let Some(w) = a.windows {
        o.gups_windows = w;
    }
    o.records = a.records.unwrap_or(o.records);
    let mut rep = a.run.reporter()?;
    let mut sink = ToReporter {
        rep: &mut rep,
        err: None,
    };
    let res = bench::run(&o, &mut sink);
    if let Some(e) = sink.err.take() {
        return Err(BenchError::Output(e));
    }
    if let Err(e) = res {
        rep.error(format!("jmp: {e}"));
    }
    rep.flush().map_err(BenchError::Output)?;
    Ok(rep.exit_code())
}

/// The hidden subcommand of the child processes.
pub const CHILD_SUBCOMMAND: &str = "__jmp";

/// `memlab __jmp ROLE ARG N`: exits the process when it succeeds.
pub fn child(args: &[String]) -> Result<i32> {
    bench::child_main(args).map_err(|source| BenchError::Context {
        what: "jmp child".into(),
        source,
    })?;
    Ok(0)
}
