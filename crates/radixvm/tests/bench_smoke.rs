//! The benchmarks run end to end (tiny durations) on every system.

use radixvm::bench::{self, Options, System};

#[test]
fn mapbench_and_faultbench_complete() {
    let options = Options {
        secs: 0.02,
        runs: 1,
        map_fractions: vec![0.5],
        ..Options::default()
    };
    let rows = bench::mapbench(&options, |_| {});
    assert_eq!(rows.len(), 3 * 2 * 4);
    for r in &rows {
        assert!(r.iters_per_sec > 0.0, "{}", r.to_table_line());
        let json = r.to_json();
        assert!(json.contains("\"bench\":\"mapbench\""));
        let expected_tlb = if r.system == System::Native {
            "real"
        } else {
            "simulated"
        };
        assert!(json.contains(&format!("\"tlb\":\"{expected_tlb}\"")));
        if r.system == System::Design(radixvm::Design::RadixVm)
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
    assert_eq!(rows.len(), 2 * 3);
    assert!(rows
        .iter()
        .all(|r| r.fault_ns > 0.0 && r.to_json().contains("simulated")));
}
