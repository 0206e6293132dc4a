//! `radixvm-percore`: the designs over the per-core MMU (one pinned
//! worker process per core, each with its own real page table; see
//! `radixvm::percore`). Its global allocator is the shared heap, so the
//! address space built before the fork is shared by every worker.
//!
//! ```text
//! radixvm-percore mapbench [bench flags] [--json]   rows, one JSON object per line with --json
//! radixvm-percore faultbench [bench flags] [--json]
//! radixvm-percore selftest NAME [--broken] [--pages N] stale | targets | stress | death | heap
//! ```
//!
//! `RADIXVM_FAULT_AROUND_PAGES=N` (a power of two up to 64) runs the
//! RadixVM rows with fault-around of N pages (see
//! `RadixVm::set_fault_around_pages`); unset, one page per fault.
//!
//! `memlab mapbench` runs the per-core cells through this binary; the
//! `native-linux` rows of the same invocation are the yardstick.

use std::process::ExitCode;

use radixvm::bench;
use radixvm::percore::heap::SharedHeap;

mod selftest;

#[global_allocator]
static HEAP: SharedHeap = SharedHeap::new();

fn opt(v: Option<f64>) -> String {
    v.map_or("null".into(), |v| format!("{v:.3}"))
}

/// One row as a JSON line: the row type's own serde form, which memlab
/// reads back into the same type.
fn json_line<R: serde::Serialize>(r: &R) -> String {
    serde_json::to_string(r).expect("a row has no map keys that are not strings")
}

fn faultbench(args: Vec<String>) -> Result<(), String> {
    let (options, json) = bench::parse_args(args)?;
    if !json {
        println!(
            "{:<22} {:>3} {:>6} {:>10} {:>12} {:>10} {:>8} {:>8} {:>7}",
            "system",
            "thr",
            "frac",
            "fault_ns",
            "faults/s",
            "maps/s",
            "msg/map",
            "kTLB/map",
            "spread"
        );
    }
    bench::faultbench(&options, |r| {
        if json {
            println!("{}", json_line(r));
        } else {
            println!(
                "{:<22} {:>3} {:>6.2} {:>10.1} {:>12.0} {:>10.0} {:>8.3} {:>8} {:>6.1}%",
                r.system.name(),
                r.threads,
                r.map_fraction,
                r.fault_ns,
                r.faults_per_sec,
                r.maps_per_sec,
                r.messages_per_map,
                opt(r.kernel_tlb_ipis_per_map),
                r.spread_pct
            );
        }
    });
    Ok(())
}

fn mapbench(args: Vec<String>) -> Result<(), String> {
    let (options, json) = bench::parse_args(args)?;
    if !json {
        println!(
            "{:<9} {:<22} {:>3} {:>12} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7}",
            "workload",
            "system",
            "thr",
            "iters/s",
            "cpu-us/it",
            "flt/it",
            "msg/it",
            "kTLB/it",
            "pt-pages",
            "spread"
        );
    }
    bench::mapbench(&options, |r| {
        if json {
            println!("{}", json_line(r));
        } else {
            println!(
                "{:<9} {:<22} {:>3} {:>12.0} {:>9} {:>8.2} {:>8} {:>8} {:>8} {:>6.1}%",
                r.workload.name(),
                r.system.name(),
                r.threads,
                r.iters_per_sec,
                r.cpu_us_per_iter.map_or("-".into(), |v| format!("{v:.2}")),
                r.faults_per_iter,
                opt(r.messages_per_iter),
                opt(r.kernel_tlb_ipis_per_iter),
                r.page_table_pages.map_or("-".into(), |p| p.to_string()),
                r.spread_pct
            );
        }
    });
    Ok(())
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!(
            "usage: radixvm-percore mapbench [flags] | faultbench [flags] | selftest NAME [--broken]"
        );
        return ExitCode::from(2);
    }
    let fault_around = match radixvm::designs::radixvm::fault_around_from_env() {
        Ok(pages) => pages,
        Err(e) => {
            eprintln!("radixvm-percore: {e}");
            return ExitCode::from(2);
        }
    };
    if fault_around > 1 {
        eprintln!(
            "radixvm-percore: radixvm rows with fault-around of {fault_around} pages ({})",
            radixvm::designs::radixvm::FAULT_AROUND_ENV
        );
    }
    let command = args.remove(0);
    let result = match command.as_str() {
        "mapbench" => mapbench(args),
        "faultbench" => faultbench(args),
        "selftest" => selftest::run(args),
        other => Err(format!("unknown command {other}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("radixvm-percore: {e}");
            ExitCode::FAILURE
        }
    }
}
