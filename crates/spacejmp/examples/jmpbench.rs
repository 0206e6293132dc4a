//! `jmpbench`: the SpaceJMP benchmarks of issue 5 (see `spacejmp::bench`;
//! the same code runs as `memlab jmp`).
//!
//! ```text
//! cargo run --release -p spacejmp --features bench --example jmpbench -- \
//!     [--quick] [--json] [--huge-off] [switch|attach|gups|persist]...
//! ```
//!
//! Prints a table; with `--json`, one JSON object per row. Child processes
//! re-run this program as `jmpbench --child ROLE ARG N`.

use spacejmp::bench::{self, HugePages, Options, Row, Sink, Workload};

struct Out {
    json: bool,
}

impl Sink for Out {
    fn row(&mut self, row: Row) {
        if self.json {
            println!("{}", row.to_json());
        } else {
            println!("{}", row.to_table_line());
        }
    }
    fn note(&mut self, bench: &str, text: &str) {
        eprintln!("# {bench}: {text}");
    }
}

fn main() -> Result<(), bench::BenchError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return bench::child_main(&args[1..]);
    }
    let child = (std::env::current_exe()?, vec!["--child".into()]);
    let mut opts = if args.iter().any(|a| a == "--quick") {
        Options::quick(child)
    } else {
        Options::full(child)
    };
    if args.iter().any(|a| a == "--huge-off") {
        opts.huge = HugePages::Off;
    }
    let json = args.iter().any(|a| a == "--json");
    let which: Vec<Workload> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    if !which.is_empty() {
        opts.workloads = which;
    }
    if !json {
        println!("{}", Row::TABLE_HEADER);
    }
    bench::run(&opts, &mut Out { json })
}
