//! Small helpers every workload needs: which CPUs to use and how to pin to
//! them, process RSS, median-and-spread of repeated runs, progress bars, a
//! cheap PRNG for jitter, and a watchdog that turns a hang into a clear
//! error instead of a frozen terminal.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::error::{Context, Result};

/// Exit status when the watchdog fires (a workload hung).
pub const EXIT_HANG: i32 = 3;

/// The online CPUs, never empty (falls back to CPU 0).
pub fn online_cpus() -> Vec<usize> {
    let cpus = topology::online_cpus();
    if cpus.is_empty() {
        vec![0]
    } else {
        cpus
    }
}

/// The default thread counts: 1, 2, then powers of two up to the number of
/// online CPUs, and that number itself.
pub fn default_threads(ncpu: usize) -> Vec<usize> {
    let mut v = vec![1, 2];
    let mut t = 4;
    while t <= ncpu {
        v.push(t);
        t *= 2;
    }
    if ncpu > 2 && !v.contains(&ncpu) {
        v.push(ncpu);
    }
    v
}

/// Pin the calling thread to `cpu`, with a message that says which.
pub fn pin_to(cpu: usize) -> Result<()> {
    topology::pin_current_thread(cpu).with_context(|| format!("cannot pin thread to CPU {cpu}"))
}

/// Resident set size of this process (VmRSS of `/proc/self/status`), bytes.
pub fn rss_bytes() -> Option<u64> {
    status_kib("VmRSS:").map(|k| k * 1024)
}

/// The file-backed part of this process's RSS (`RssFile`: code and
/// libraries), bytes.
pub fn rss_file_bytes() -> Option<u64> {
    status_kib("RssFile:").map(|k| k * 1024)
}

/// A `kB` field of `/proc/self/status`.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Touch `bytes` of fresh anonymous memory (in transparent huge pages where
/// the kernel gives them) once and give it back.
///
/// On a virtual machine, memory the guest has not used for a few seconds
/// is handed back to the host, and the next process to fault it in pays
/// many times the usual page-fault cost. Measured here, a Nibble `churn`
/// child that maps 790 MiB: 2.4 s of system time right after a 15 s pause,
/// 0.07 s when another process had just touched and freed as much in huge
/// pages (4 KiB pages did not help: the store's pool uses huge pages).
/// Without this, whichever system runs first after a pause, or first needs
/// more memory than the one before, is penalized. So the parent primes a
/// child's expected footprint before starting it; the child then reuses
/// the pages just released, and when memory is warm priming costs only the
/// kernel's zeroing (~0.1 s per GiB). Capped at half of MemAvailable.
pub fn prime_memory(bytes: usize) {
    const HUGE: usize = 2 << 20;
    let avail = mem_available_bytes().unwrap_or(0) / 2;
    let len = bytes.min(avail as usize) & !(HUGE - 1);
    if len == 0 {
        return;
    }
    // SAFETY: a private anonymous mapping of `len + HUGE` bytes that only
    // this function uses: written one byte per page of a 2 MiB-aligned
    // `len`-byte range inside it, then unmapped whole.
    unsafe {
        let map_len = len + HUGE;
        let p = libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return;
        }
        let skew = (HUGE - (p as usize) % HUGE) % HUGE;
        let base = (p as *mut u8).add(skew);
        libc::madvise(base as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        let mut off = 0;
        while off < len {
            base.add(off).write_volatile(1);
            off += 4096;
        }
        libc::munmap(p, map_len);
    }
}

/// Minor page faults of this process so far (`getrusage(RUSAGE_SELF)`,
/// every thread); 0 if the call fails.
pub fn minor_faults() -> u64 {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_minflt as u64
}

/// MemAvailable of `/proc/meminfo`, bytes.
pub fn mem_available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Median and range of repeated measurements.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// Summarize `xs` (must be non-empty; NaNs sort last).
    pub fn of(xs: &[f64]) -> Spread {
        let mut v = xs.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            median,
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// A progress bar on stderr (indicatif hides it when stderr is not a terminal).
pub fn progress_bar(total: u64, prefix: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{prefix:.bold} [{bar:30.cyan/blue}] {pos}/{len} {elapsed_precise} eta {eta} {wide_msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    pb.set_style(style);
    pb.set_prefix(prefix.to_string());
    pb
}

/// xorshift64*: enough randomness to jitter sampling intervals.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[0, 1)`, 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)` (`hi > lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }
}

/// Kills the process with a clear message if it is still armed after a
/// deadline: a benchmark that hangs (a deadlock in the code under test)
/// should say so and exit, not sit there. Disarmed on drop.
pub struct Watchdog {
    _disarm: mpsc::Sender<()>,
}

impl Watchdog {
    pub fn arm(limit: Duration, what: String) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        let start = Instant::now();
        std::thread::Builder::new()
            .name("memlab-watchdog".into())
            .spawn(move || {
                if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                    eprintln!(
                        "\nmemlab: HANG: {what} did not finish within {:.1} s; aborting (exit {EXIT_HANG})",
                        start.elapsed().as_secs_f64()
                    );
                    std::process::exit(EXIT_HANG);
                }
            })
            .ok();
        Watchdog { _disarm: tx }
    }
}

/// Turn a worker thread's panic payload into a message.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// A histogram of TSC ticks (1 tick .. 2^40 ticks, 2 significant digits).
pub fn new_hist() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 1 << 40, 2).context("histogram")
}

/// Join every worker, turning panics into errors; all errors joined in one message.
pub fn join_all<T>(handles: Vec<std::thread::ScopedJoinHandle<'_, Result<T>>>) -> Result<Vec<T>> {
    let mut ok = Vec::new();
    let mut errs = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(v)) => ok.push(v),
            Ok(Err(e)) => errs.push(format!("thread {i}: {e}")),
            Err(p) => errs.push(format!("thread {i} panicked: {}", panic_message(&*p))),
        }
    }
    if errs.is_empty() {
        Ok(ok)
    } else {
        Err(errs.join("; ").into())
    }
}

/// The binary `name` next to the running executable (or one directory up:
/// test binaries live in target/<profile>/deps); `build` says how to
/// build it when it is missing.
pub fn sibling_binary(name: &str, build: &str) -> Result<std::path::PathBuf> {
    let exe = std::env::current_exe().context("cannot find the running executable")?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(format!(
        "{name} not found next to {} (build it with `{build}`)",
        exe.display()
    )
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_median_even_and_odd() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Spread::of(&[4.0, 1.0, 2.0, 3.0]);
        assert_eq!(s.median, 2.5);
    }

    #[test]
    fn default_threads_powers_of_two() {
        assert_eq!(default_threads(1), vec![1, 2]);
        assert_eq!(default_threads(2), vec![1, 2]);
        assert_eq!(default_threads(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(default_threads(12), vec![1, 2, 4, 8, 12]);
    }

    #[test]
    fn rss_is_readable() {
        assert!(rss_bytes().unwrap_or(0) > 0);
    }
}
