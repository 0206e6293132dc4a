//! The benchmarks run end to end (tiny durations) on every system.

use radixvm::bench::{self, Options, System};
use radixvm::Backend;

#[test]
fn mapbench_and_faultbench_complete() {
    let options = Options {
        secs: 0.02,
        runs: 1,
        map_fractions: vec![0.5],
        ..Options::default()
    };
    let uffd = bench::uffd_available();
    if let Err(why) = &uffd {
        println!("userfaultfd rows skipped: {why}");
    }
    let systems = if uffd.is_ok() { 7 } else { 4 };
    let rows = bench::mapbench(&options, |_| {});
    assert_eq!(rows.len(), 3 * 2 * systems);
    for r in &rows {
        assert!(r.iters_per_sec > 0.0, "{r:?}");
        let expected_tlb = match r.system {
            System::Design(_, Backend::Software) => "simulated",
            _ => "real",
        };
        assert_eq!(r.system.tlb(), expected_tlb, "{r:?}");
        if matches!(r.system, System::Design(radixvm::Design::RadixVm, _))
            && r.workload == bench::Workload::Local
        {
            assert_eq!(
                r.shootdowns_per_iter,
                Some(0.0),
                "RadixVM local needs no shootdown"
            );
        }
    }
    let rows = bench::faultbench(&options, |_| {});
    assert_eq!(
        rows.len(),
        systems - 1,
        "one thread count (2), one fraction"
    );
    for r in &rows {
        assert!(r.fault_ns > 0.0, "{r:?}");
        let tlb = if r.system.backend() == Some(Backend::Software) {
            "simulated"
        } else {
            "real"
        };
        assert_eq!(r.system.tlb(), tlb, "{r:?}");
    }
}
