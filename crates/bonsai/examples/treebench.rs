//! RadixVM Figures 6-7 and the Bonsai claim as a micro-benchmark (see
//! `bonsai::bench`).
//!
//! ```text
//! cargo run --release -p bonsai --features bench --example treebench -- \
//!     [--readers 1] [--writers 0,1] [--systems bonsai,radix,...] [--no-control] \
//!     [--secs 1] [--runs 3] [--json] [--quick]
//! ```

use bonsai::bench::{self, Options, Row};

fn list(arg: Option<String>) -> Vec<usize> {
    arg.expect("a comma-separated list")
        .split(',')
        .map(|t| t.parse().expect("a number"))
        .collect()
}

fn main() {
    let mut options = Options::default();
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--readers" => options.readers = list(args.next()),
            "--writers" => options.writers = list(args.next()),
            "--secs" => options.secs = args.next().and_then(|s| s.parse().ok()).expect("--secs S"),
            "--runs" => options.runs = args.next().and_then(|s| s.parse().ok()).expect("--runs N"),
            "--systems" => {
                let s = args.next().expect("--systems LIST");
                options.systems = s.split(',').map(str::to_owned).collect();
            }
            "--json" => json = true,
            "--no-control" => options.busy_control = false,
            "--quick" => options.secs = Options::quick().secs,
            other => panic!("unknown argument {other}"),
        }
    }
    if !json {
        println!("{}", Row::TABLE_HEADER);
    }
    bench::run(&options, |row| {
        if json {
            println!("{}", row.to_json());
        } else {
            println!("{}", row.to_table_line());
        }
    });
}
