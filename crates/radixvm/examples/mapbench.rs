//! RadixVM §5 map/touch/unmap microbenchmarks (see `radixvm::bench`).
//!
//! ```text
//! cargo run --release -p radixvm --example mapbench -- [--threads 1,2] [--pages 4]
//!     [--workloads local,pipeline,global] [--systems radixvm-sw,radixvm-uffd,...,native-linux]
//!     [--secs 1] [--runs 3] [--quick] [--json]
//! ```
//! Designs run over the software MMU (`design-sw`, `tlb simulated`) and
//! the userfaultfd MMU (`design-uffd`, `tlb real`).

use radixvm::bench::{self, MapRow};

fn main() {
    let (options, json) = bench::parse_args(std::env::args().skip(1)).unwrap_or_else(|e| {
        eprintln!("mapbench: {e}");
        std::process::exit(2)
    });
    if !json {
        println!("{}", MapRow::TABLE_HEADER);
    }
    bench::mapbench(&options, |row| {
        if json {
            println!("{}", row.to_json());
        } else {
            println!("{}", row.to_table_line());
        }
    });
}
