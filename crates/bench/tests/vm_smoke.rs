//! Smoke test of `memlab mapbench` and `memlab faultbench` through the real
//! binary, at tiny durations: every workload × system produced its row,
//! software-MMU rows say the TLB is simulated, and the RadixVM rows of
//! `local` sent no shootdown. Figures are otherwise not checked.

mod common;

fn memlab(args: &[&str]) -> (Vec<serde_json::Value>, String) {
    let run = common::run_json(common::memlab().args(args));
    (run.rows, run.stderr)
}

/// The -uffd systems run unless the kernel has no userfaultfd, and the
/// -percore systems unless `radixvm-percore` is not built beside memlab;
/// a note says why.
fn expected_systems(stderr: &str) -> Vec<&'static str> {
    let mut systems = vec!["radixvm-sw", "bonsai-sw", "linux-sw"];
    if stderr.contains("userfaultfd unavailable") {
        println!("userfaultfd rows skipped: {stderr}");
    } else {
        systems.extend(["radixvm-uffd", "bonsai-uffd", "linux-uffd"]);
    }
    if stderr.contains("skipping the per-core rows") {
        println!("per-core rows skipped: {stderr}");
    } else {
        systems.extend(["radixvm-percore", "bonsai-percore", "linux-percore"]);
    }
    systems
}

#[test]
fn mapbench_every_workload_and_system() {
    let (rows, stderr) = memlab(&[
        "mapbench",
        "--json",
        "--repeat",
        "1",
        "--seconds",
        "0.02",
        "--threads",
        "1,2",
        "--pages",
        "2",
    ]);
    let mut systems = expected_systems(&stderr);
    systems.push("native-linux");
    for workload in ["local", "pipeline", "global"] {
        for system in &systems {
            for threads in [1, 2] {
                let row = rows
                    .iter()
                    .find(|r| {
                        r["workload"] == workload
                            && r["system"] == *system
                            && r["threads"] == threads
                    })
                    .unwrap_or_else(|| panic!("no row {workload} {system} x{threads}: {rows:?}"));
                assert_eq!(row["bench"], "mapbench");
                assert_eq!(row["region_pages"], 2);
                assert!(row["ops_per_sec"].as_f64().unwrap() > 0.0, "{row}");
                let tlb = if system.ends_with("-sw") {
                    "simulated"
                } else {
                    "real"
                };
                assert_eq!(row["tlb"], tlb, "{row}");
                if workload == "local" && system.starts_with("radixvm") {
                    assert_eq!(row["shootdowns_per_iter"], 0.0, "{row}");
                    assert_eq!(row["messages_per_iter"], 0.0, "{row}");
                }
                if system.ends_with("-percore") {
                    assert_eq!(row["backend"], "percore", "{row}");
                }
            }
        }
    }
    assert_eq!(rows.len(), 3 * 2 * systems.len());
}

#[test]
fn faultbench_every_design() {
    let (rows, stderr) = memlab(&[
        "faultbench",
        "--json",
        "--repeat",
        "1",
        "--seconds",
        "0.02",
        "--fractions",
        "0,0.5",
    ]);
    let systems = expected_systems(&stderr);
    assert_eq!(rows.len(), 2 * systems.len(), "{rows:?}");
    for r in &rows {
        assert_eq!(r["bench"], "faultbench");
        assert_eq!(r["threads"], 2);
        assert!(r["fault_ns"].as_f64().unwrap() > 0.0, "{r}");
        let sw = r["system"].as_str().unwrap().ends_with("-sw");
        assert_eq!(r["tlb"], if sw { "simulated" } else { "real" }, "{r}");
    }
}
