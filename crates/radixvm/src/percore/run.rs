//! Forking and supervising the workers of a per-core run.
//!
//! ```text
//!  parent: build space ─ Team (shared) ─ fork × n ───────────── supervise ─ reap
//!  worker i:            ME = i, pin to CPU i, attach as CPU i
//!                       ready ─ wait go ─ body(cpu, team) ─ leave Refcache
//!                       ─ done ─ keep servicing its ring until `exit` ─ _exit(0)
//! ```
//!
//! The parent polls `waitpid(WNOHANG)` while it waits: a worker that dies
//! (signal, non-zero exit), or hangs (not done, and no heartbeat, a count
//! the worker bumps at every poll of its ring, for [`HANG_TIMEOUT_MS`]),
//! or is not done by a timed run's deadline, ends the run with an error
//! naming it (index, pid, signal, and the message the
//! worker left in the MMU's error slot), and the other workers are
//! killed. Nothing waits without a deadline.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::{PercoreMmu, CURRENT, HANG_TIMEOUT_MS, ME, RESULT_WORDS};
use crate::space::Cpu;
use crate::AddressSpace;

const STATE_STARTING: u32 = 0;
const STATE_READY: u32 = 1;
const STATE_DONE: u32 = 2;
const STATE_FAILED: u32 = 3;

/// Polls between yields of the CPU in a worker's waits (a run may have
/// more workers than cores).
pub(super) const YIELD_EVERY_SPINS: u32 = 64;

/// An untimed run (no `secs`) that makes progress is stopped after this
/// long.
const UNTIMED_LIMIT_SECS: u64 = 3_600;

/// Longest nap of the supervising parent between looks at its workers.
const POLL_MAX_US: u64 = 5_000;

/// Capacity of each worker's hand-over queue (pipeline workload).
const QUEUE_SLOTS: usize = 1024;

/// A single-producer single-consumer queue of addresses in shared memory.
struct Queue {
    head: CachePadded<AtomicUsize>,
    tail: CachePadded<AtomicUsize>,
    slots: Box<[AtomicU64]>,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            slots: (0..QUEUE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Queue {
    fn push(&self, v: u64) -> bool {
        let tail = self.tail.load(Ordering::Relaxed);
        if tail - self.head.load(Ordering::Acquire) == QUEUE_SLOTS {
            return false;
        }
        self.slots[tail % QUEUE_SLOTS].store(v, Ordering::Relaxed);
        self.tail.store(tail + 1, Ordering::Release);
        true
    }

    fn pop(&self) -> Option<u64> {
        let head = self.head.load(Ordering::Relaxed);
        if head == self.tail.load(Ordering::Acquire) {
            return None;
        }
        let v = self.slots[head % QUEUE_SLOTS].load(Ordering::Relaxed);
        self.head.store(head + 1, Ordering::Release);
        Some(v)
    }
}

/// What the workers of one run share (lives in the shared heap).
pub struct Team {
    workers: usize,
    states: Box<[CachePadded<AtomicU32>]>,
    results: Box<[CachePadded<[AtomicU64; RESULT_WORDS]>]>,
    go: AtomicBool,
    /// The timed part starts when worker 0 says so ([`Worker::start_clock`]).
    deferred_clock: bool,
    clock_started: AtomicBool,
    stop: AtomicBool,
    exit: AtomicBool,
    /// Workload flag (global: another round?).
    more: AtomicBool,
    arrived: CachePadded<AtomicUsize>,
    generation: CachePadded<AtomicUsize>,
    queues: Box<[Queue]>,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

/// A worker's view of its run: its id, its MMU, the shared team.
pub struct Worker<'a> {
    /// Worker (and CPU) index.
    pub id: usize,
    mmu: &'a PercoreMmu,
    team: &'a Team,
}

impl std::fmt::Debug for Worker<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("id", &self.id).finish()
    }
}

impl Worker<'_> {
    /// Workers in the run.
    pub fn workers(&self) -> usize {
        self.team.workers
    }

    /// The MMU.
    pub fn mmu(&self) -> &PercoreMmu {
        self.mmu
    }

    /// Answers pending shootdowns (call in every wait).
    pub fn relax(&self) {
        self.mmu.service(self.id);
        std::hint::spin_loop();
    }

    /// Whether the parent said stop.
    pub fn stopped(&self) -> bool {
        self.team.stop.load(Ordering::Relaxed)
    }

    /// Waits until every worker has called it (the same number of times),
    /// answering shootdowns meanwhile.
    pub fn barrier(&self) {
        let generation = self.team.generation.load(Ordering::Acquire);
        if self.team.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.team.workers {
            self.team.arrived.store(0, Ordering::Relaxed);
            self.team.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.team.generation.load(Ordering::Acquire) == generation {
            self.relax();
            spins += 1;
            if spins.is_multiple_of(YIELD_EVERY_SPINS) {
                // More workers than cores: let the others run.
                std::thread::yield_now();
            }
        }
    }

    /// Ends the untimed setup of a run started with [`run_after_setup`]:
    /// a barrier, after which the parent's clock (and its count of kernel
    /// TLB interrupts) starts.
    pub fn start_clock(&self) {
        self.barrier();
        if self.id == 0 {
            self.team.clock_started.store(true, Ordering::Release);
        }
    }

    /// Hands `addr` to worker `to` (waits while its queue is full, unless
    /// stopped).
    pub fn hand_over(&self, to: usize, addr: u64) {
        while !self.team.queues[to].push(addr) {
            if self.stopped() {
                return;
            }
            self.relax();
        }
    }

    /// Takes the next address handed to this worker.
    pub fn take(&self) -> Option<u64> {
        self.team.queues[self.id].pop()
    }

    /// A shared flag (global workload: another round?).
    pub fn more(&self) -> bool {
        self.team.more.load(Ordering::Acquire)
    }

    /// Sets the shared flag.
    pub fn set_more(&self, v: bool) {
        self.team.more.store(v, Ordering::Release);
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Per worker, what its body returned.
    pub results: Vec<[u64; RESULT_WORDS]>,
    /// Seconds from go to stop (or to the last worker done).
    pub secs: f64,
    /// Kernel TLB-shootdown interrupts during the timed part, all CPUs.
    pub kernel_tlb: Option<u64>,
}

fn describe_status(status: libc::c_int) -> String {
    if libc::WIFSIGNALED(status) {
        format!("was killed by signal {}", libc::WTERMSIG(status))
    } else if libc::WIFEXITED(status) {
        format!("exited with status {}", libc::WEXITSTATUS(status))
    } else {
        format!("ended with wait status {status:#x}")
    }
}

fn kill_all(pids: &[libc::pid_t], reaped: &mut [bool]) {
    for (i, &pid) in pids.iter().enumerate() {
        if !reaped[i] {
            // SAFETY: kill and waitpid of a child this run forked and has
            // not reaped (so the pid is still ours).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
            }
            reaped[i] = true;
        }
    }
}

/// Runs `body` in `workers` forked worker processes, worker `i` pinned to
/// allowed CPU `i` and attached to `space` as CPU `i`. With `secs`, the
/// parent says stop after that long ([`Worker::stopped`]); without, the
/// bodies run to completion. Every body must end within `secs` +
/// [`HANG_TIMEOUT_MS`].
///
/// After an `Err` the space may hold locks of a dead worker: the caller
/// should exit without dropping it.
///
/// Call only from a single-threaded process whose global allocator is
/// [`super::heap::SharedHeap`] (see [`super::available`]), with a space
/// over a [`PercoreMmu`], before this process registered with Refcache.
pub fn run(
    space: &dyn AddressSpace,
    workers: usize,
    secs: Option<f64>,
    body: &(dyn Fn(&Cpu<'_>, &Worker<'_>) -> [u64; RESULT_WORDS] + Sync),
) -> Result<RunResult, String> {
    run_inner(space, workers, secs, false, body)
}

/// [`run`], but the timed part (and the count of kernel TLB interrupts)
/// starts only when the bodies call [`Worker::start_clock`], after their
/// setup.
pub fn run_after_setup(
    space: &dyn AddressSpace,
    workers: usize,
    secs: Option<f64>,
    body: &(dyn Fn(&Cpu<'_>, &Worker<'_>) -> [u64; RESULT_WORDS] + Sync),
) -> Result<RunResult, String> {
    run_inner(space, workers, secs, true, body)
}

fn run_inner(
    space: &dyn AddressSpace,
    workers: usize,
    secs: Option<f64>,
    deferred_clock: bool,
    body: &(dyn Fn(&Cpu<'_>, &Worker<'_>) -> [u64; RESULT_WORDS] + Sync),
) -> Result<RunResult, String> {
    super::available()?;
    let mmu = space
        .mmu()
        .percore()
        .ok_or("the space does not run over the per-core MMU")?;
    assert!((1..=crate::MAX_CPUS).contains(&workers));
    let team = Box::new(Team {
        workers,
        states: (0..workers)
            .map(|_| CachePadded::new(AtomicU32::new(STATE_STARTING)))
            .collect(),
        results: (0..workers)
            .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect(),
        go: AtomicBool::new(false),
        deferred_clock,
        clock_started: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        exit: AtomicBool::new(false),
        more: AtomicBool::new(true),
        arrived: CachePadded::new(AtomicUsize::new(0)),
        generation: CachePadded::new(AtomicUsize::new(0)),
        queues: (0..workers).map(|_| Queue::default()).collect(),
    });
    let cpus = topology::allowed_cpus();
    crate::frameref::init_domain_with(crate::frameref::PERCORE_OPS_PER_TICK);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut pids = Vec::with_capacity(workers);
    for i in 0..workers {
        // SAFETY: fork(2); the process is single-threaded (the caller's
        // contract), so the child is a complete copy; the child runs
        // `worker_main`, which never returns.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            let mut reaped = vec![false; pids.len()];
            kill_all(&pids, &mut reaped);
            return Err(format!("fork of worker {i}: {e}"));
        }
        if pid == 0 {
            worker_main(i, space, mmu, &team, &cpus, body);
        }
        pids.push(pid);
    }
    let mut reaped = vec![false; workers];
    // Watches the workers until `until(team)`; Err names a dead worker,
    // or a hung one: not done and no heartbeat for HANG_TIMEOUT_MS, or
    // not done by `deadline`.
    let watch = |until: &dyn Fn(&Team) -> bool,
                 deadline: Instant,
                 reaped: &mut Vec<bool>|
     -> Result<(), String> {
        // Back off to POLL_MAX_US: on a machine with as many cores as
        // workers, a parent waking often takes CPU time from a worker.
        let mut nap_us = 100;
        let mut beats: Vec<(u64, Instant)> = (0..workers)
            .map(|i| (mmu.beats(i), Instant::now()))
            .collect();
        loop {
            let now = Instant::now();
            let mut stalled = Vec::new();
            for (i, (beat, since)) in beats.iter_mut().enumerate() {
                let b = mmu.beats(i);
                if b != *beat {
                    *beat = b;
                    *since = now;
                } else if now - *since > Duration::from_millis(HANG_TIMEOUT_MS)
                    && team.states[i].load(Ordering::Acquire) != STATE_DONE
                {
                    stalled.push(format!("worker {i} (pid {})", pids[i]));
                }
            }
            if !stalled.is_empty() {
                let why = mmu.error().map(|e| format!(" ({e})")).unwrap_or_default();
                return Err(format!(
                    "{} hung: no progress for {HANG_TIMEOUT_MS} ms{why}",
                    stalled.join(", ")
                ));
            }
            if until(&team) {
                return Ok(());
            }
            for (i, &pid) in pids.iter().enumerate() {
                if reaped[i] {
                    continue;
                }
                let mut status = 0;
                // SAFETY: waitpid of our own child, not blocking.
                let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                if r == pid {
                    reaped[i] = true;
                    let clean = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
                    if !clean || team.states[i].load(Ordering::Acquire) != STATE_DONE {
                        let why = mmu.error().map(|e| format!(": {e}")).unwrap_or_default();
                        return Err(format!(
                            "worker {i} (pid {pid}) {}{why}",
                            describe_status(status)
                        ));
                    }
                }
            }
            if Instant::now() > deadline {
                let hung: Vec<String> = (0..workers)
                    .filter(|&i| team.states[i].load(Ordering::Acquire) != STATE_DONE)
                    .map(|i| format!("worker {i} (pid {})", pids[i]))
                    .collect();
                let why = mmu.error().map(|e| format!(" ({e})")).unwrap_or_default();
                return Err(format!(
                    "{} hung: not done by the run's deadline{why}",
                    hung.join(", ")
                ));
            }
            std::thread::sleep(Duration::from_micros(nap_us));
            nap_us = (nap_us * 2).min(POLL_MAX_US);
        }
    };
    let hang = Duration::from_millis(HANG_TIMEOUT_MS);
    let all = |s: u32| move |t: &Team| t.states.iter().all(|x| x.load(Ordering::Acquire) == s);
    let outcome = (|| {
        watch(&all(STATE_READY), Instant::now() + hang, &mut reaped)?;
        // Untimed runs may take long: hangs are found by heartbeat.
        let no_deadline = Instant::now() + Duration::from_secs(UNTIMED_LIMIT_SECS);
        team.go.store(true, Ordering::Release);
        if team.deferred_clock {
            watch(
                &|t: &Team| {
                    t.clock_started.load(Ordering::Acquire)
                        || t.states
                            .iter()
                            .all(|x| x.load(Ordering::Acquire) == STATE_DONE)
                },
                no_deadline,
                &mut reaped,
            )?;
        }
        let tlb_before = crate::bench::kernel_tlb_shootdowns();
        let t0 = Instant::now();
        let mut elapsed = None;
        if let Some(secs) = secs {
            let end = t0 + Duration::from_secs_f64(secs);
            watch(
                &|t: &Team| {
                    t.states
                        .iter()
                        .any(|x| x.load(Ordering::Acquire) == STATE_FAILED)
                        || Instant::now() >= end
                },
                end + hang,
                &mut reaped,
            )?;
            team.stop.store(true, Ordering::Release);
            elapsed = Some(t0.elapsed());
        }
        let deadline = match secs {
            Some(_) => Instant::now() + hang,
            None => no_deadline,
        };
        watch(&all(STATE_DONE), deadline, &mut reaped)?;
        let secs = elapsed.unwrap_or_else(|| t0.elapsed()).as_secs_f64();
        let kernel_tlb = tlb_before
            .zip(crate::bench::kernel_tlb_shootdowns())
            .map(|(a, b)| b - a);
        Ok(RunResult {
            results: team
                .results
                .iter()
                .map(|r| std::array::from_fn(|k| r[k].load(Ordering::Relaxed)))
                .collect(),
            secs,
            kernel_tlb,
        })
    })();
    team.exit.store(true, Ordering::Release);
    match outcome {
        Ok(result) => {
            // Reap (with a deadline); a worker that fails now still fails
            // the run.
            let deadline = Instant::now() + hang;
            for (i, &pid) in pids.iter().enumerate() {
                while !reaped[i] {
                    let mut status = 0;
                    // SAFETY: waitpid of our own child, not blocking.
                    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                    if r == pid {
                        reaped[i] = true;
                        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                            kill_all(&pids, &mut reaped);
                            return Err(format!(
                                "worker {i} (pid {pid}) {} while leaving",
                                describe_status(status)
                            ));
                        }
                    } else if Instant::now() > deadline {
                        kill_all(&pids, &mut reaped);
                        return Err(format!("worker {i} (pid {pid}) hung while leaving"));
                    } else {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }
            Ok(result)
        }
        Err(e) => {
            kill_all(&pids, &mut reaped);
            Err(e)
        }
    }
}

/// A worker's life (never returns).
fn worker_main(
    i: usize,
    space: &dyn AddressSpace,
    mmu: &PercoreMmu,
    team: &Team,
    cpus: &[usize],
    body: &(dyn Fn(&Cpu<'_>, &Worker<'_>) -> [u64; RESULT_WORDS] + Sync),
) -> ! {
    ME.store(i, Ordering::Relaxed);
    CURRENT.store((mmu as *const PercoreMmu).cast_mut(), Ordering::Release);
    if !cpus.is_empty() {
        let _ = topology::pin_current_thread(cpus[i % cpus.len()]);
    }
    // A worker is one thread on one core: its metadata allocations come
    // from its own cache, not the shared stacks (heap essay).
    super::heap::enable_thread_cache();
    let worker = Worker { id: i, mmu, team };
    let cpu = Cpu::attach(space, i);
    team.states[i].store(STATE_READY, Ordering::Release);
    while !team.go.load(Ordering::Acquire) {
        mmu.idle(i);
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&cpu, &worker)));
    // No longer counting: let Refcache's epochs advance without us.
    crate::frameref::leave();
    match outcome {
        Ok(r) => {
            for (slot, v) in team.results[i].iter().zip(r) {
                slot.store(v, Ordering::Relaxed);
            }
            team.states[i].store(STATE_DONE, Ordering::Release);
        }
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            mmu.error.set(&format!("worker {i} panicked: {msg}"));
            team.states[i].store(STATE_FAILED, Ordering::Release);
            // SAFETY: ends this worker without dropping shared objects.
            unsafe { libc::_exit(101) };
        }
    }
    // Others may still shoot down pages we hold: answer until all leave.
    while !team.exit.load(Ordering::Acquire) {
        mmu.idle(i);
    }
    std::mem::forget(cpu);
    super::heap::flush_thread_cache();
    // SAFETY: ends this worker without running destructors of objects it
    // shares with the parent and the other workers (module essay).
    unsafe { libc::_exit(0) }
}
