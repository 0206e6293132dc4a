//! The per-core backend's multi-process checks. Each runs the
//! `radixvm-percore` binary (its global allocator is the shared heap, and
//! it forks workers, which this harness's threads forbid) and judges its
//! exit status and report. Set `RADIXVM_LONG_STRESS=1` for a long stress
//! run.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use radixvm::bench::{FaultRow, MapRow, System, Workload};
use radixvm::{Backend, Design};

fn selftest(args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_radixvm-percore"))
        .arg("selftest")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run radixvm-percore");
    (out, t0.elapsed())
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn unavailable(out: &Output) -> bool {
    let t = text(out);
    let skip = t.contains("unavailable") || t.contains("cannot map the region");
    if skip {
        eprintln!("skipped: {t}");
    }
    skip
}

fn passes(args: &[&str]) -> String {
    let (out, _) = selftest(args, &[]);
    let t = text(&out);
    assert!(out.status.success() || unavailable(&out), "{args:?}: {t}");
    t
}

#[test]
fn store_after_munmap_faults_on_the_other_core() {
    for design in ["radixvm", "bonsai", "linux"] {
        for pages in ["1", "3"] {
            let t = passes(&["stale", "--design", design, "--pages", pages]);
            assert!(t.contains("0 reached"), "{design}: {t}");
        }
    }
}

#[test]
fn a_broken_shootdown_is_caught() {
    let (out, _) = selftest(&["stale", "--broken"], &[]);
    if unavailable(&out) {
        return;
    }
    let t = text(&out);
    assert!(
        !out.status.success(),
        "a broken shootdown went unnoticed: {t}"
    );
    assert!(t.contains("STALE"), "{t}");
}

#[test]
fn messages_go_to_exactly_the_cores_holding_the_page() {
    for workers in ["2", "3"] {
        let t = passes(&["targets", "--workers", workers]);
        assert!(t.contains("tables 0, acks 0, messages 0"), "{t}");
    }
}

#[test]
fn map_touch_unmap_stress_keeps_real_tables_equal_to_shadows() {
    let long = std::env::var_os("RADIXVM_LONG_STRESS").is_some();
    let rounds = if long { "2000" } else { "20" };
    for design in ["radixvm", "bonsai", "linux"] {
        let (out, _) = selftest(
            &["stress", "--workers", "2", "--design", design],
            &[("RADIXVM_STRESS_ROUNDS", rounds)],
        );
        let t = text(&out);
        assert!(out.status.success() || unavailable(&out), "{design}: {t}");
    }
}

#[test]
fn a_frame_of_one_cores_memfd_is_one_page_for_every_core() {
    for design in ["radixvm", "bonsai", "linux"] {
        for workers in ["2", "3"] {
            let t = passes(&["cross", "--design", design, "--workers", workers]);
            assert!(
                t.contains(" 0 wrong values, 0 frames the tables"),
                "{design}: {t}"
            );
        }
    }
}

#[test]
fn a_dead_worker_ends_the_run_with_its_name() {
    let (out, took) = selftest(&["death"], &[]);
    if unavailable(&out) {
        return;
    }
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("worker 1") && t.contains("signal 9"), "{t}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn a_hung_worker_ends_the_run_with_its_name() {
    let (out, took) = selftest(&["death", "--hang"], &[]);
    if unavailable(&out) {
        return;
    }
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("worker 1 did not acknowledge"), "{t}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn the_shared_heap_never_hands_one_block_to_two_processes() {
    let t = passes(&["heap", "--workers", "3"]);
    assert!(t.contains(" 0 corrupted"), "{t}");
    assert!(t.contains(" 0 after the flush"), "{t}");
}

/// The binary's `--json` rows, read back into the row type as memlab
/// reads them.
fn bench_rows<R: serde::de::DeserializeOwned>(args: &[&str]) -> Vec<R> {
    let out = Command::new(env!("CARGO_BIN_EXE_radixvm-percore"))
        .args(args)
        .arg("--json")
        .output()
        .expect("run radixvm-percore");
    let t = text(&out);
    assert!(out.status.success(), "{args:?}: {t}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

#[test]
fn mapbench_rows_carry_backend_messages_and_kernel_ipis() {
    let rows: Vec<MapRow> = bench_rows(&[
        "mapbench",
        "--secs",
        "0.05",
        "--runs",
        "1",
        "--threads",
        "1,2",
        "--systems",
        "radixvm-percore,bonsai-percore,linux-percore,native-linux",
    ]);
    if rows.is_empty() {
        eprintln!("skipped: no per-core rows");
        return;
    }
    assert_eq!(rows.len(), 3 * 2 * 4, "{rows:?}");
    for r in &rows {
        if r.system.name().ends_with("-percore") {
            assert_eq!(r.system.backend(), Some(Backend::Percore), "{r:?}");
            assert_eq!(r.system.tlb(), "real", "{r:?}");
            assert!(r.messages_per_iter.is_some(), "{r:?}");
        }
        if r.system == System::Design(Design::RadixVm, Backend::Percore)
            && r.workload == Workload::Local
        {
            assert!(r.messages_per_iter.unwrap() < 0.0005, "{r:?}");
        }
    }
}

#[test]
fn faultbench_rows_for_the_per_core_designs() {
    let rows: Vec<FaultRow> = bench_rows(&[
        "faultbench",
        "--secs",
        "0.05",
        "--runs",
        "1",
        "--threads",
        "2",
        "--fractions",
        "0,0.5",
        "--systems",
        "radixvm-percore,bonsai-percore",
    ]);
    if rows.is_empty() {
        eprintln!("skipped: no per-core rows");
        return;
    }
    assert_eq!(rows.len(), 2 * 2, "{rows:?}");
    for r in &rows {
        assert_eq!(r.system.backend(), Some(Backend::Percore), "{r:?}");
        assert!(r.fault_ns >= 0.05, "{r:?}");
    }
}

/// Fault-around (`RADIXVM_FAULT_AROUND_PAGES`): a fault installs a block
/// of pages in one mapping; the stale-translation, broken-shootdown and
/// stress checks must hold for those pages as for single ones.
#[test]
fn fault_around_keeps_stale_translations_out() {
    let around = [("RADIXVM_FAULT_AROUND_PAGES", "4")];
    let (out, _) = selftest(&["stale", "--design", "radixvm", "--pages", "4"], &around);
    let t = text(&out);
    assert!(out.status.success() || unavailable(&out), "{t}");
    assert!(unavailable(&out) || t.contains("0 reached"), "{t}");
    let (out, _) = selftest(&["stale", "--broken", "--pages", "4"], &around);
    if !unavailable(&out) {
        let t = text(&out);
        assert!(!out.status.success() && t.contains("STALE"), "{t}");
    }
    let (out, _) = selftest(
        &["stress", "--workers", "2", "--design", "radixvm"],
        &[
            ("RADIXVM_FAULT_AROUND_PAGES", "8"),
            ("RADIXVM_STRESS_ROUNDS", "20"),
        ],
    );
    let t = text(&out);
    assert!(out.status.success() || unavailable(&out), "{t}");
}

#[test]
fn a_bad_fault_around_value_is_refused_with_a_reason() {
    let (out, _) = selftest(&["stale"], &[("RADIXVM_FAULT_AROUND_PAGES", "3")]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("power of two"), "{t}");
}
