//! Running a benchmark cell in a fresh child process.
//!
//! Two facts force the key-value benchmarks out of the parent process:
//!
//! * the global allocator is fixed per process, so the `*-jemalloc` and
//!   `*-mimalloc` baselines must run in the binaries `memlab-jemalloc` and
//!   `memlab-mimalloc`, which are `memlab` with another `#[global_allocator]`;
//! * RSS is a per-process figure that never goes down cleanly (freed heap
//!   memory stays mapped, allocators keep caches), so a memory measurement
//!   is only meaningful in a process that ran nothing else.
//!
//! So the parent plans the work and a child does it: the parent serializes
//! a [`Job`] to JSON and runs `<binary> __cell '<json>'` (a hidden
//! subcommand), where the binary is `memlab`, `memlab-jemalloc` or
//! `memlab-mimalloc` found next to the running executable. The child checks
//! that it has the global allocator the job asks for, runs the job, prints
//! one JSON result per line on stdout as each measurement completes (the
//! parent advances its progress bar on each) and exits 0; on failure it
//! prints the reason on stderr and exits 1 (3 when its watchdog fires). A
//! job is one cell (`frag`: one system and one size pair) or, where a
//! setup is expensive and shared, the cells of one system that use it
//! (`ycsb`: the load and every workload at one thread count, on the same
//! loaded store). The parent aggregates repeats and prints the tables.
//!
//! Every system runs this way, the Nibble variants and the glibc baselines
//! in `memlab` itself, so that all of them are measured alike.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use indicatif::ProgressBar;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Context, Result};

/// The hidden subcommand a child runs.
pub const CELL_SUBCOMMAND: &str = "__cell";

/// A global allocator (one per binary).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Alloc {
    /// The system allocator: glibc malloc (`memlab`).
    Glibc,
    /// jemalloc (`memlab-jemalloc`).
    Jemalloc,
    /// mimalloc (`memlab-mimalloc`).
    Mimalloc,
}

impl Alloc {
    /// The binary that has this global allocator.
    pub fn binary(self) -> &'static str {
        match self {
            Alloc::Glibc => "memlab",
            Alloc::Jemalloc => "memlab-jemalloc",
            Alloc::Mimalloc => "memlab-mimalloc",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Alloc::Glibc => "glibc",
            Alloc::Jemalloc => "jemalloc",
            Alloc::Mimalloc => "mimalloc",
        }
    }
}

static SELF_ALLOC: OnceLock<Alloc> = OnceLock::new();

/// Record which global allocator this process has (called by `main_entry`).
pub fn set_self_alloc(a: Alloc) {
    let _ = SELF_ALLOC.set(a);
}

/// Give this process's allocator's free pages back to the OS.
pub fn trim_allocator() {
    match self_alloc() {
        // SAFETY: malloc_trim only releases free memory of glibc's heap.
        Alloc::Glibc => unsafe {
            libc::malloc_trim(0);
        },
        Alloc::Jemalloc => {
            // MALLCTL_ARENAS_ALL = 4096: purge every arena's unused pages.
            let name = b"arena.4096.purge\0";
            // SAFETY: a NUL-terminated mallctl name with no old or new
            // value; jemalloc is this process's allocator.
            unsafe {
                tikv_jemalloc_sys::mallctl(
                    name.as_ptr() as *const libc::c_char,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                );
            }
        }
        // SAFETY: mi_collect(force) frees mimalloc's unused pages; mimalloc
        // is this process's allocator.
        Alloc::Mimalloc => unsafe { libmimalloc_sys::mi_collect(true) },
    }
}

/// The global allocator of this process (glibc unless told otherwise).
pub fn self_alloc() -> Alloc {
    SELF_ALLOC.get().copied().unwrap_or(Alloc::Glibc)
}

/// The binary with allocator `a`, next to the running executable.
pub fn binary_for(a: Alloc) -> Result<PathBuf> {
    crate::util::sibling_binary(a.binary(), "cargo build --release -p bench")
}

/// What a child runs.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "job", rename_all = "lowercase")]
pub enum Job {
    Ycsb(crate::ycsb::YcsbJob),
    Frag(crate::frag::FragJob),
    Churn(crate::churn::ChurnJob),
    Fill(crate::fill::FillJob),
}

impl Job {
    fn system(&self) -> crate::kv::System {
        match self {
            Job::Ycsb(j) => j.system,
            Job::Frag(j) => j.system,
            Job::Churn(j) => j.system,
            Job::Fill(j) => j.system,
        }
    }
}

/// The child side: run `spec` (a JSON [`Job`]), results on stdout. Returns
/// the exit status.
pub fn child_main(spec: &str) -> i32 {
    let job: Job = match serde_json::from_str(spec) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("memlab {CELL_SUBCOMMAND}: bad job spec: {e}");
            return 1;
        }
    };
    let want = job.system().alloc();
    if want != self_alloc() {
        eprintln!(
            "memlab {CELL_SUBCOMMAND}: {} needs the {} allocator ({}), this binary has {}",
            job.system(),
            want.name(),
            want.binary(),
            self_alloc().name()
        );
        return 1;
    }
    let mut out = std::io::stdout().lock();
    let mut emit = |v: serde_json::Value| {
        // A closed pipe means the parent is gone: nothing to do but stop.
        if writeln!(out, "{v}").and_then(|_| out.flush()).is_err() {
            std::process::exit(1);
        }
    };
    let r = match &job {
        Job::Ycsb(j) => crate::ycsb::run_job(j, &mut |c| emit(to_value(&c))),
        Job::Frag(j) => crate::frag::run_job(j, &mut |c| emit(to_value(&c))),
        Job::Churn(j) => crate::churn::run_job(j, &mut |c| emit(to_value(&c))),
        Job::Fill(j) => crate::fill::run_job(j, &mut |c| emit(to_value(&c))),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

fn to_value<T: Serialize>(t: &T) -> serde_json::Value {
    serde_json::to_value(t).unwrap_or(serde_json::Value::Null)
}

/// The parent side: run `job` in the binary for its system's allocator,
/// calling `on_result` for each result line as it arrives. Stderr of a
/// successful child is shown as notes; a failed child's is the error.
///
/// `prime_bytes`: the child's expected footprint, primed first (see
/// [`crate::util::prime_memory`]; 0 for none).
pub fn run_child<R: DeserializeOwned>(
    job: &Job,
    prime_bytes: usize,
    pb: &ProgressBar,
    mut on_result: impl FnMut(R),
) -> Result<()> {
    let alloc = job.system().alloc();
    let bin = binary_for(alloc)?;
    crate::util::prime_memory(prime_bytes);
    let spec = serde_json::to_string(job).context("serializing the job")?;
    let mut child = Command::new(&bin)
        .arg(CELL_SUBCOMMAND)
        .arg(&spec)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    let mut stderr = child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let stdout = child.stdout.take().expect("piped");
    let mut parse_err = None;
    for line in BufReader::new(stdout).lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                parse_err.get_or_insert(format!("reading the child's output: {e}"));
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<R>(&line) {
            Ok(r) => on_result(r),
            Err(e) => {
                parse_err.get_or_insert(format!("bad result line from the child ({e}): {line}"));
            }
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for {}", bin.display()))?;
    let err_text = err_reader.join().unwrap_or_default();
    let err_text = err_text.trim();
    if !status.success() {
        let what = match status.code() {
            Some(crate::util::EXIT_HANG) => "hung (its watchdog fired)".to_string(),
            Some(c) => format!("exited with status {c}"),
            None => format!("was killed ({status})"),
        };
        return Err(format!(
            "{} {what}{}{}",
            alloc.binary(),
            if err_text.is_empty() { "" } else { ": " },
            tail(err_text, 2000)
        )
        .into());
    }
    if !err_text.is_empty() {
        pb.suspend(|| {
            for l in err_text.lines() {
                eprintln!("memlab: {}: {l}", job.system());
            }
        });
    }
    match parse_err {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

fn tail(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut i = s.len() - n;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

/// Split `systems` into those whose binary exists and notes about the others.
pub fn available(systems: &[crate::kv::System]) -> (Vec<crate::kv::System>, Vec<String>) {
    let mut ok = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut missing: Vec<(Alloc, String, Vec<&str>)> = Vec::new();
    for &s in systems {
        match binary_for(s.alloc()) {
            Ok(_) => ok.push(s),
            Err(e) => match missing.iter_mut().find(|m| m.0 == s.alloc()) {
                Some(m) => m.2.push(s.name()),
                None => missing.push((s.alloc(), e.to_string(), vec![s.name()])),
            },
        }
    }
    for (_, e, names) in missing {
        notes.push(format!("skipping {}: {e}", names.join(", ")));
    }
    (ok, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_round_trip_through_json() {
        let job = Job::Frag(crate::frag::FragJob {
            system: "hashmap-jemalloc".parse().unwrap(),
            size_a: 64,
            size_b: 128,
            target_bytes: 1 << 20,
            capacity: 2 << 20,
            compact_timeout_ms: 10,
            seed: 3,
        });
        let text = serde_json::to_string(&job).unwrap();
        assert!(text.contains(r#""job":"frag""#), "{text}");
        let back: Job = serde_json::from_str(&text).unwrap();
        assert_eq!(back.system().alloc(), Alloc::Jemalloc);
    }

    #[test]
    fn missing_siblings_are_skipped_with_a_note() {
        // Test binaries live in target/*/deps, where no memlab binary is.
        let systems = crate::kv::ALL_SYSTEMS.to_vec();
        let (ok, notes) = available(&systems);
        if binary_for(Alloc::Jemalloc).is_err() {
            assert!(ok.iter().all(|s| s.alloc() != Alloc::Jemalloc));
            assert!(
                notes.iter().any(|n| n.contains("memlab-jemalloc")),
                "{notes:?}"
            );
        }
        assert_eq!(ok.is_empty(), notes.len() == 3, "{notes:?}");
    }

    #[test]
    fn child_rejects_a_job_for_another_allocator() {
        set_self_alloc(Alloc::Glibc);
        let job = r#"{"job":"churn","system":"dashmap-mimalloc","threads":1,"files_per_thread":1,"ops_per_thread":1,"capacity":67108864,"seed":1}"#;
        assert_eq!(child_main(job), 1);
        assert_eq!(child_main("not json"), 1);
    }
}
