//! memlab: every benchmark of the project as one binary.
//!
//! Each benchmark is a subcommand. The shared conventions (see the design
//! brief, "The memlab convention"):
//!
//! * a readable, aligned table on stdout by default; `--json` prints one
//!   JSON object per result row instead (always with `bench`, `system`,
//!   `threads`, then the figures), and `--out FILE.jsonl` also writes the
//!   rows to a file;
//! * `--repeat N` runs every configuration N times (default 3) and reports
//!   the median with min and max; systems are compared as ratios of runs
//!   made in the same invocation;
//! * `--threads 1,2,...` picks the thread counts (default 1, 2 and powers of
//!   two up to the online CPUs);
//! * `--quick` finishes in under a minute on 2 cores;
//! * a progress bar on stderr while it runs; notes and errors on stderr;
//! * exit status 1 when a run failed or a correctness check failed, 3 when a
//!   run hung (a watchdog aborts it).
//!
//! `memlab plot FILE.jsonl -o FIG.png` draws any of the outputs.
//!
//! To add a benchmark: a module with the workload that takes resolved
//! options and a [`report::Reporter`], a variant of [`Command`] with a
//! `#[command(flatten)] run: RunOpts`, and a match arm in `main`.

mod buddy;
mod plot;
mod report;
mod util;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use ::buddy::AllocatorKind;
use clap::{Args, Parser, Subcommand};

use crate::report::Reporter;

#[derive(Parser)]
#[command(
    name = "memlab",
    version,
    about = "memlab: the memory-management stack's benchmarks, one subcommand each",
    long_about = "memlab: the memory-management stack's benchmarks, one subcommand each.\n\n\
        Every benchmark prints an aligned table by default, or one JSON object per result row \
        with --json (fields bench, system, threads and the figures). --quick finishes in under \
        a minute on 2 cores; --repeat N reports the median and min/max of N runs.",
    after_help = "Examples:\n  \
        memlab buddy --quick\n  \
        memlab buddy --json --out results/buddy.jsonl\n  \
        memlab plot results/buddy.jsonl -o results/buddy.png",
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Physical-frame allocators (distributed buddy vs global-lock vs linux-pcp):
    /// per-CPU throughput and latency, cross-CPU imbalance, exhaustion
    #[command(
        long_about = "Physical-frame allocators of the buddy crate side by side: distributed (per-CPU heaps \
    that borrow and return frames), global-lock (one buddy, one lock) and linux-pcp (zone buddy plus \
    per-CPU single-frame caches).\n\n\
    local: threads pinned one per CPU allocate and free batches of 64 blocks on their own heap; \
    ops = allocs + frees; p50/p99 latency of single calls.\n\
    imbalance: producer/consumer pairs; frames allocated on one CPU's heap are freed on another's; \
    time series of stats() every 100 ms, then a full-coalescing check.\n\
    exhaustion: allocate until OutOfMemory; every frame must be handed out exactly once; \
    free everything cross-thread; the pool must be whole again.\n\n\
    Exit status 1 if a run failed or a check (frames lost, not coalesced) failed."
    )]
    Buddy(BuddyArgs),
    /// Draw a JSON-lines result file (PNG or SVG): panels per bench, lines per system
    Plot(PlotArgs),
}

/// Options every benchmark subcommand takes.
#[derive(Args, Clone)]
struct RunOpts {
    /// One JSON object per result row on stdout instead of tables
    #[arg(long)]
    json: bool,
    /// Short runs: the whole subcommand finishes in under 60 s on 2 cores
    #[arg(long)]
    quick: bool,
    /// Runs per configuration; the median and min/max are reported
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Thread counts, comma-separated [default: 1,2 and powers of two up to the online CPUs]
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..4097))]
    threads: Option<Vec<u32>>,
    /// Also write the JSON lines to this file (truncated)
    #[arg(long, value_name = "FILE.jsonl")]
    out: Option<PathBuf>,
}

impl RunOpts {
    fn threads(&self) -> Vec<usize> {
        match &self.threads {
            Some(v) => {
                let mut t: Vec<usize> = v.iter().map(|&x| x as usize).collect();
                t.dedup();
                t
            }
            None => util::default_threads(util::online_cpus().len()),
        }
    }

    fn reporter(&self) -> Result<Reporter, String> {
        Reporter::new(self.json, self.out.as_deref()).map_err(|e| e.to_string())
    }
}

#[derive(Args)]
struct BuddyArgs {
    #[command(flatten)]
    run: RunOpts,
    /// Workloads to run, comma-separated
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "local,imbalance,exhaustion"
    )]
    workload: Vec<buddy::Workload>,
    /// Allocators, comma-separated: distributed, global-lock, linux-pcp [default: all]
    #[arg(long, value_delimiter = ',')]
    allocator: Option<Vec<AllocatorKind>>,
    /// Block sizes of the local workload in frames (powers of two), comma-separated
    #[arg(long, value_delimiter = ',', default_value = "1,8,512", value_parser = parse_pow2)]
    sizes: Vec<u64>,
    /// Measured time per local run and per imbalance run, ms
    /// [default: local 1000, imbalance 2000; --quick: 250 and 1000]
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..))]
    duration_ms: Option<u64>,
}

fn parse_pow2(s: &str) -> Result<u64, String> {
    let v: u64 = s.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    // Larger blocks would need pools (and metadata) of many GiB per thread.
    if v == 0 || !v.is_power_of_two() || v > 1 << 10 {
        return Err(format!(
            "{v} is not a power of two between 1 and 1024 frames"
        ));
    }
    Ok(v)
}

#[derive(Args)]
struct PlotArgs {
    /// JSON-lines result files (as written by --json or --out)
    #[arg(required = true, value_name = "FILE.jsonl")]
    inputs: Vec<PathBuf>,
    /// Output image; the format follows the extension (.png or .svg)
    #[arg(short, long, value_name = "FIG.png")]
    output: PathBuf,
    /// Field on the y axis
    #[arg(long, default_value = "ops_per_sec")]
    y: String,
    /// Field on the x axis [default: t_ms for time series, else threads]
    #[arg(long)]
    x: Option<String>,
    /// Fields that split a bench into panels, comma-separated
    /// [default: size_frames,order,queue_frames,phase,workload,mix,key_bytes,value_bytes,protocol]
    #[arg(long, value_delimiter = ',')]
    by: Option<Vec<String>>,
    /// Only benches whose name contains this text
    #[arg(long)]
    bench: Option<String>,
    /// Figure title [default: file names and the y field]
    #[arg(long)]
    title: Option<String>,
}

fn run_buddy(a: BuddyArgs) -> Result<i32, String> {
    let mut allocators = a.allocator.unwrap_or_else(|| AllocatorKind::ALL.to_vec());
    allocators.dedup();
    let opts = buddy::BuddyOpts {
        workloads: a.workload,
        allocators,
        threads: a.run.threads(),
        sizes: a.sizes,
        repeat: a.run.repeat as usize,
        quick: a.run.quick,
        duration: a.duration_ms.map(Duration::from_millis),
    };
    let mut rep = a.run.reporter()?;
    buddy::run(&opts, &mut rep).map_err(|e| format!("output error: {e}"))?;
    Ok(rep.exit_code())
}

fn run_plot(a: PlotArgs) -> Result<i32, String> {
    let output = a.output.clone();
    plot::plot(&plot::PlotOpts {
        inputs: a.inputs,
        output: a.output,
        x: a.x,
        y: a.y,
        by: a.by,
        bench: a.bench,
        title: a.title,
    })?;
    eprintln!("memlab plot: wrote {}", output.display());
    Ok(0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Buddy(a) => run_buddy(a),
        Command::Plot(a) => run_plot(a),
    };
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("memlab: error: {e}");
            ExitCode::from(1)
        }
    }
}
