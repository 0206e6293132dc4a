//! Smoke test of `memlab shared`: every workload at a tiny size through
//! the real binary (clap options, the `--child` client processes, the
//! servers over Unix sockets, the restart probes) in a few seconds.
//! Figures are not checked, only that every system produced its rows and
//! every check passed (exit status 0). redis-server rows are skipped, with
//! the reason printed, only when redis-server is not installed; nibble
//! rows when the `nibble` binary has not been built.

use std::path::PathBuf;
use std::process::Command;

mod common;

fn nibble_bin() -> Option<PathBuf> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_memlab"));
    let dir = exe.parent()?;
    [dir.join("nibble"), dir.parent()?.join("release/nibble")]
        .into_iter()
        .find(|p| p.is_file())
}

fn in_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

#[test]
fn shared_every_workload_tiny() {
    let dir = std::env::temp_dir().join(format!("memlab-shared-smoke-{}", std::process::id()));
    let mut systems = vec!["direct"];
    let mut cmd = common::memlab();
    cmd.arg("shared");
    match nibble_bin() {
        Some(p) => {
            systems.push("nibble");
            let help = Command::new(&p)
                .arg("--help")
                .output()
                .expect("nibble --help");
            if String::from_utf8_lossy(&help.stdout).contains("--data-dir") {
                systems.push("nibble-data-dir");
            } else {
                eprintln!("shared_smoke: no nibble-data-dir rows: this nibble has no --data-dir");
            }
            cmd.arg("--nibble-bin").arg(p);
        }
        None => eprintln!("shared_smoke: no nibble rows: the nibble binary is not built"),
    }
    if in_path("redis-server") {
        systems.push("redis");
    } else {
        eprintln!("shared_smoke: skipping redis rows: redis-server is not installed");
    }
    let run = common::run_json(
        cmd.env("MEMLAB_NO_INSTALL", "1")
            .args(["--json", "--repeat", "1", "--keys", "500"])
            .args([
                "--seconds",
                "0.05",
                "--restart-mib",
                "2",
                "--processes",
                "1,2",
            ])
            .args(["--set-pcts", "50", "--systems", &systems.join(",")])
            .arg("--dir")
            .arg(&dir),
    );
    assert!(!dir.exists(), "the scratch directory was not removed");
    let (rows, stdout) = (&run.rows, &run.stdout);
    let count = |bench: &str, system: &str| run.count(bench, system);
    for s in &systems {
        // get and set at 1 and 2 processes.
        assert_eq!(count("shared", s), 4, "{s}: {stdout}");
        assert_eq!(count("shared-mix", s), 1, "{s}: {stdout}");
        for r in rows.iter().filter(|r| r["system"] == *s) {
            if let Some(x) = r["ops_per_sec"].as_f64() {
                assert!(x > 0.0, "{r}");
            }
        }
    }
    assert_eq!(count("shared-restart", "direct-attach"), 1, "{stdout}");
    assert_eq!(count("shared-restart", "direct-attach-after-kill"), 1);
    if systems.contains(&"nibble-data-dir") {
        assert_eq!(count("shared-restart", "nibble-data-dir"), 1, "{stdout}");
        assert_eq!(count("shared-restart", "nibble-data-dir-after-kill"), 1);
    }
    if systems.contains(&"redis") {
        assert_eq!(count("shared-restart", "redis-rdb"), 1, "{stdout}");
        assert_eq!(count("shared-ratio", "direct/redis"), 5, "{stdout}");
    }
}
