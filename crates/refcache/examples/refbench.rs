//! RadixVM Figure 8 as a micro-benchmark (see `refcache::bench`).
//!
//! ```text
//! cargo run --release -p refcache --example refbench -- [--threads 1,2] [--secs 1] [--runs 3] [--json] [--quick]
//! ```
//! Prints a table, or with `--json` one object per row:
//! `{"bench":"refcache","system":"refcache","threads":2,"ops_per_sec":...,...}`
//! (`ops_per_sec` counts inc+dec pairs, summed over threads).

use refcache::bench::{self, Options, Row};

fn main() {
    let mut options = Options::default();
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--threads" => {
                options.threads = args
                    .next()
                    .expect("--threads LIST")
                    .split(',')
                    .map(|t| t.parse().expect("thread count"))
                    .collect()
            }
            "--secs" => options.secs = args.next().expect("--secs S").parse().expect("seconds"),
            "--runs" => options.runs = args.next().expect("--runs N").parse().expect("runs"),
            "--json" => json = true,
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
