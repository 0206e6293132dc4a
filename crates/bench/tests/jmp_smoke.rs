//! Smoke test of `memlab jmp`: every workload at a tiny size, through the
//! real binary (clap options, the reporter, and the `__jmp` child
//! processes), in a few seconds. Figures are not checked, only that each
//! workload produced its rows and the persisted index answered.

mod common;

#[test]
fn jmp_every_workload_tiny() {
    let run = common::run_json(common::memlab().args([
        "jmp",
        "--json",
        "--repeat",
        "1",
        "--switch-iters",
        "200",
        "--switch-mib",
        "1,2",
        "--attach-mib",
        "4",
        "--huge",
        "off",
        "--window-kib",
        "256",
        "--updates",
        "16384",
        "--windows",
        "1,2",
        "--records",
        "2000",
    ]));
    let (rows, stdout) = (&run.rows, &run.stdout);
    let count = |bench: &str, system: &str| run.count(bench, system);
    for system in [
        "vas-disjoint+locks",
        "vas-disjoint",
        "mmap+munmap",
        "process-handoff",
    ] {
        assert_eq!(count("jmp-switch", system), 1, "switch {system}: {stdout}");
    }
    // The 1 MiB pair, then one per size of the sweep.
    assert_eq!(count("jmp-switch", "vas-overlap-remap"), 3, "{stdout}");
    for system in ["vas-process-overlap", "vas-process-disjoint"] {
        assert_eq!(count("jmp-switch", system), 2, "switch {system}: {stdout}");
    }
    // Process-per-VAS switches keep page tables: after the warm-up no
    // switch faults; the remap faults on every switch.
    for r in rows.iter().filter(|r| {
        r["bench"] == "jmp-switch"
            && r["system"]
                .as_str()
                .unwrap_or("")
                .starts_with("vas-process")
    }) {
        assert_eq!(r["faults_per_switch"].as_f64(), Some(0.0), "{r}");
    }
    assert_eq!(count("jmp-attach", "vas_attach"), 1, "{stdout}");
    assert_eq!(count("jmp-attach", "vas_attach+populate"), 1, "{stdout}");
    for system in ["VAS-overlap", "VAS-disjoint", "VAS-process", "MAP", "MP"] {
        assert_eq!(count("jmp-gups", system), 2, "gups {system}: {stdout}");
    }
    for system in [
        "process-spawn",
        "spacejmp-segment",
        "mmap-offset-pointers",
        "bincode-hashmap",
        "ratio",
    ] {
        assert_eq!(
            count("jmp-persist", system),
            1,
            "persist {system}: {stdout}"
        );
    }
    // Overlapping VASes switch by remapping, and say so (all but the first
    // switch remap: the first VAS is mapped at attach).
    let remap = rows
        .iter()
        .find(|r| r["system"] == "vas-overlap-remap")
        .expect("remap row");
    assert!(remap["remaps_per_switch"].as_f64().unwrap_or(0.0) >= 0.5);
    let disjoint = rows
        .iter()
        .find(|r| r["system"] == "vas-disjoint+locks")
        .expect("disjoint row");
    assert_eq!(disjoint["remaps_per_switch"].as_f64(), Some(0.0));
    for r in rows
        .iter()
        .filter(|r| r["bench"] == "jmp-gups" && r["system"] == "VAS-process")
    {
        assert_eq!(r["faults_after_first_pass"].as_f64(), Some(0.0), "{r}");
    }
    assert!(rows.iter().all(|r| r["threads"] == 1));
}
