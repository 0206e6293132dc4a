//! Bonsai §7.3 (Figures 16-18): page-fault cost while one thread spends a
//! fraction of its time in mmap/munmap (see `radixvm::bench`).
//!
//! ```text
//! cargo run --release -p radixvm --example faultbench -- [--threads 2] [--fractions 0,0.25,0.5,0.9]
//!     [--systems radixvm-sw,bonsai-uffd,...] [--secs 1] [--runs 3] [--quick] [--json]
//! ```
//! Rows over the software MMU say `tlb simulated`; over userfaultfd, `tlb real`.

use radixvm::bench::{self, FaultRow};

fn main() {
    let (mut options, json) = bench::parse_args(std::env::args().skip(1)).unwrap_or_else(|e| {
        eprintln!("faultbench: {e}");
        std::process::exit(2)
    });
    if options.threads == [1, 2] {
        options.threads = vec![2];
    }
    if !json {
        println!("{}", FaultRow::TABLE_HEADER);
    }
    bench::faultbench(&options, |row| {
        if json {
            println!("{}", row.to_json());
        } else {
            println!("{}", row.to_table_line());
        }
    });
}
