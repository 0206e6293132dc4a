//! `memlab mapbench` and `memlab faultbench`: the address-space designs of
//! `radixvm` (RadixVM, Bonsai VM, Linux-style) side by side, each over
//! both MMU backends, wrapping `radixvm::bench`.
//!
//! * mapbench — RadixVM §5 (Figs. 9-11): `local` (each thread maps,
//!   writes and unmaps its own region), `pipeline` (map and write, hand to
//!   the next thread, which writes and unmaps) and `global` (each thread
//!   maps a slice of one shared region, all write all of it in random
//!   order, each unmaps its slice), for every design × backend and for the
//!   process's own `mmap`/`munmap`/stores (`native-linux`) in the same run.
//! * faultbench — Bonsai §7.3 (Figs. 16-18): one thread spends a given
//!   fraction of its time in mmap/munmap while the others take soft page
//!   faults; the figure is the cost of one fault.
//!
//! Rows over the software MMU (`system` ending in `-sw`) carry `tlb:
//! "simulated"`: their TLBs, page tables and shootdowns are data
//! structures and messages between threads. Rows over the userfaultfd MMU
//! (`-uffd`) and `native-linux` carry `tlb: "real"`. Where the kernel has
//! no userfaultfd, the `-uffd` rows are left out with a note saying why.
//!
//! Rows over the per-core MMU (`-percore`: one pinned worker process per
//! core, each with its own real page table; shootdown messages between
//! workers are user-level) come from the sibling binary
//! `radixvm-percore`, which memlab runs with the cell's options and whose
//! JSON rows it relays; they carry `tlb: "real"` and `backend:
//! "percore"`. The binary must be built beside memlab (`cargo build
//! --release -p bench -p radixvm`); without it the rows are left out with
//! a note.

use std::io::{self, BufRead};
use std::process::{Command, Stdio};

use radixvm::bench::{self as vmbench, FaultRow, MapRow, Options, System, Workload};
use radixvm::Backend;

use crate::error::{BenchError, Result};
use crate::report::{Reporter, Row};

/// What `memlab mapbench` runs.
pub struct MapOpts {
    pub threads: Vec<usize>,
    pub secs: f64,
    pub runs: usize,
    pub region_pages: Vec<u64>,
    pub workloads: Vec<Workload>,
    pub systems: Vec<System>,
}

/// What `memlab faultbench` runs.
pub struct FaultOpts {
    pub threads: Vec<usize>,
    pub secs: f64,
    pub runs: usize,
    pub fractions: Vec<f64>,
    pub systems: Vec<System>,
}

/// Parses a comma-separated system list (`radixvm-sw`, `bonsai-uffd`,
/// `native-linux`, or a design alone for its software-MMU row).
pub fn parse_systems(list: &[String]) -> Result<Vec<System>> {
    list.iter()
        .map(|s| s.parse().map_err(BenchError::Usage))
        .collect()
}

fn tlb_note() -> String {
    "tlb = simulated: the software MMU (TLBs, page tables and shootdowns are data structures \
     and inter-thread handshakes in this process); tlb = real: the userfaultfd MMU (real faults \
     in a real arena, MADV_DONTNEED zaps, the kernel's page table and TLB shootdowns) or \
     native-linux (this process's own mmap/munmap) or the per-core MMU (one pinned worker \
     process per core with its own page table; the shootdown messages between workers are \
     user-level, the kernel's flushes and IPIs real)."
        .into()
}

/// Splits off the per-core systems (run by `radixvm-percore`).
fn split_percore(systems: &[System]) -> (Vec<System>, Vec<System>) {
    systems
        .iter()
        .partition(|s| s.backend() != Some(Backend::Percore))
}

/// Runs `radixvm-percore BENCH ARGS --json --systems SYSTEMS`, reads
/// its rows back into the row type `R` and emits them as `to_row` makes
/// this process's own rows; a failing child or an unreadable row fails
/// the run.
fn relay_percore<R: serde::de::DeserializeOwned>(
    bench: &str,
    args: Vec<String>,
    systems: &[System],
    rep: &mut Reporter,
    to_row: fn(&R) -> Row,
    mut each: impl FnMut(),
) -> io::Result<()> {
    let bin =
        match crate::util::sibling_binary("radixvm-percore", "cargo build --release -p radixvm") {
            Ok(b) => b,
            Err(why) => {
                rep.note(bench, &format!("skipping the per-core rows: {why}"));
                return Ok(());
            }
        };
    let names: Vec<String> = systems.iter().map(|s| s.name()).collect();
    let mut child = Command::new(&bin)
        .arg(bench)
        .args(&args)
        .arg("--json")
        .arg("--systems")
        .arg(names.join(","))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", bin.display())))?;
    let stdout = child.stdout.take().expect("piped");
    for line in io::BufReader::new(stdout).lines() {
        let line = line?;
        match serde_json::from_str::<R>(&line) {
            Ok(r) => {
                each();
                rep.emit(to_row(&r))?;
            }
            Err(e) => rep.fail(format!(
                "{} {bench}: unreadable row {line:?}: {e}",
                bin.display()
            )),
        }
    }
    let status = child.wait()?;
    if !status.success() {
        rep.fail(format!("{} {bench} failed: {status}", bin.display()));
    }
    Ok(())
}

fn skipped_uffd(systems: &[System], rep: &mut Reporter, bench: &str) -> Vec<System> {
    let mut note = None;
    let usable = vmbench::usable_systems(systems, |why| note = Some(why.to_string()));
    if let Some(why) = note {
        rep.note(bench, &why);
    }
    usable
}

/// Runs `memlab mapbench`.
pub fn run_mapbench(o: &MapOpts, rep: &mut Reporter) -> io::Result<()> {
    const BENCH: &str = "mapbench";
    let (in_process, percore) = split_percore(&o.systems);
    let systems = skipped_uffd(&in_process, rep, BENCH);
    rep.note(
        BENCH,
        &format!(
            "RadixVM §5: ops_per_sec = iterations per second, all threads (local: map+write+unmap \
             of the thread's region; pipeline: one region through two threads; global: one \
             thread's share of a round); median of {} runs of {:.2} s, spread_pct = (max - min) / \
             median. faults_per_iter: page faults the design handled (native: minor faults). \
             shoot/it and tgt/shoot: shootdowns the design sent and remote CPUs per shootdown \
             (uffd: the design's requests; the kernel does its own). kTLB/it: TLB-shootdown \
             interrupts per iteration from /proc/interrupts, system-wide, real TLBs only. \
             pt-pages: page-table pages at the end (uffd: its shadow table). \
             messages_per_iter: the design's shootdown messages (one per remote target) per \
             iteration; -percore rows come from the radixvm-percore binary.",
            o.runs, o.secs
        ),
    );
    rep.note(BENCH, &tlb_note());
    let cells = o.region_pages.len()
        * o.workloads.len()
        * o.threads.len()
        * (systems.len() + percore.len());
    let pb = rep.start_progress(cells as u64, "memlab mapbench");
    let mut result = Ok(());
    for &pages in &o.region_pages {
        let opts = Options {
            threads: o.threads.clone(),
            secs: o.secs,
            runs: o.runs,
            pages,
            workloads: o.workloads.clone(),
            systems: systems.clone(),
            ..Options::default()
        };
        vmbench::mapbench(&opts, |r| {
            pb.inc(1);
            pb.set_message(format!(
                "{} {} x{}",
                r.workload.name(),
                r.system.name(),
                r.threads
            ));
            if result.is_ok() {
                result = rep.emit(map_row(r));
            }
        });
        if !percore.is_empty() && result.is_ok() {
            let join = |v: Vec<String>| v.join(",");
            let args = vec![
                "--threads".into(),
                join(o.threads.iter().map(|t| t.to_string()).collect()),
                "--secs".into(),
                o.secs.to_string(),
                "--runs".into(),
                o.runs.to_string(),
                "--pages".into(),
                pages.to_string(),
                "--workloads".into(),
                join(o.workloads.iter().map(|w| w.name().to_string()).collect()),
            ];
            result = relay_percore(BENCH, args, &percore, rep, map_row, || pb.inc(1));
        }
    }
    rep.end_progress();
    result?;
    rep.flush()
}

fn opt_f(row: Row, key: &str, v: Option<f64>, decimals: i32) -> Row {
    match v {
        Some(v) => row.set_f(key, v, decimals),
        None => row.set(key, serde_json::Value::Null),
    }
}

fn map_row(r: &MapRow) -> Row {
    let row = Row::new("mapbench", &r.system.name(), r.threads)
        .set("tlb", r.system.tlb())
        .set(
            "backend",
            r.system.backend().map_or("native", Backend::name),
        )
        .set("workload", r.workload.name())
        .set("region_pages", r.pages)
        .set_f("ops_per_sec", r.iters_per_sec, 0)
        .set_f("touches_per_sec", r.touches_per_sec, 0)
        .set_f("faults_per_iter", r.faults_per_iter, 2)
        .set("fault_around_pages", r.fault_around_pages);
    let row = opt_f(row, "shootdowns_per_iter", r.shootdowns_per_iter, 3);
    let row = opt_f(row, "targets_per_shootdown", r.targets_per_shootdown, 2);
    let row = opt_f(row, "messages_per_iter", r.messages_per_iter, 3);
    let row = match r.page_table_pages {
        Some(p) => row.set("page_table_pages", p),
        None => row.set("page_table_pages", serde_json::Value::Null),
    };
    let row = opt_f(
        row,
        "kernel_tlb_ipis_per_iter",
        r.kernel_tlb_ipis_per_iter,
        3,
    );
    let row = opt_f(row, "cpu_us_per_iter", r.cpu_us_per_iter, 2);
    row.set_f("spread_pct", r.spread_pct, 1).set("runs", r.runs)
}

/// Runs `memlab faultbench`.
pub fn run_faultbench(o: &FaultOpts, rep: &mut Reporter) -> io::Result<()> {
    const BENCH: &str = "faultbench";
    let (in_process, percore) = split_percore(&o.systems);
    let systems = skipped_uffd(&in_process, rep, BENCH);
    rep.note(
        BENCH,
        &format!(
            "Bonsai §7.3 (Figs. 16-18): thread 0 spends map_fraction of every {} µs in \
             mmap/munmap of one page; the other threads read {} pages of a segment mapping, drop \
             their own translations (no address-space lock) and read them again. fault_ns = mean \
             cost of one faulting read; median of {} runs of {:.2} s, spread_pct of fault_ns. \
             messages_per_map / kernel_tlb_ipis_per_map: the design's shootdown messages and \
             the kernel's TLB-shootdown interrupts (system-wide) per mapper mmap+munmap.",
            vmbench::FAULT_PERIOD_US,
            vmbench::FAULT_REGION_PAGES,
            o.runs,
            o.secs
        ),
    );
    rep.note(BENCH, &tlb_note());
    let designs = systems
        .iter()
        .filter(|s| matches!(s, System::Design(..)))
        .count();
    let mut thread_counts: Vec<usize> = o.threads.iter().map(|&t| t.max(2)).collect();
    thread_counts.dedup();
    let cells = thread_counts.len() * o.fractions.len() * (designs + percore.len());
    let pb = rep.start_progress(cells as u64, "memlab faultbench");
    let join = |v: Vec<String>| v.join(",");
    let args = vec![
        "--threads".into(),
        join(thread_counts.iter().map(|t| t.to_string()).collect()),
        "--secs".into(),
        o.secs.to_string(),
        "--runs".into(),
        o.runs.to_string(),
        "--fractions".into(),
        join(o.fractions.iter().map(|f| f.to_string()).collect()),
    ];
    let opts = Options {
        threads: thread_counts,
        secs: o.secs,
        runs: o.runs,
        systems,
        map_fractions: o.fractions.clone(),
        ..Options::default()
    };
    let mut result = Ok(());
    vmbench::faultbench(&opts, |r| {
        pb.inc(1);
        pb.set_message(format!("{} frac {:.2}", r.system.name(), r.map_fraction));
        if result.is_ok() {
            result = rep.emit(fault_row(r));
        }
    });
    if !percore.is_empty() && result.is_ok() {
        result = relay_percore(BENCH, args, &percore, rep, fault_row, || pb.inc(1));
    }
    rep.end_progress();
    result?;
    rep.flush()
}

fn fault_row(r: &FaultRow) -> Row {
    let row = Row::new("faultbench", &r.system.name(), r.threads)
        .set("tlb", r.system.tlb())
        .set(
            "backend",
            r.system.backend().map_or("native", Backend::name),
        )
        .set_f("map_fraction", r.map_fraction, 2)
        .set_f("fault_ns", r.fault_ns, 1)
        .set_f("faults_per_sec", r.faults_per_sec, 0)
        .set_f("maps_per_sec", r.maps_per_sec, 0)
        .set_f("messages_per_map", r.messages_per_map, 3)
        .set("fault_around_pages", r.fault_around_pages);
    opt_f(row, "kernel_tlb_ipis_per_map", r.kernel_tlb_ipis_per_map, 3)
        .set_f("spread_pct", r.spread_pct, 1)
        .set("runs", r.runs)
}
