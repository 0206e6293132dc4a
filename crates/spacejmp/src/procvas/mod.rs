//! Process-per-VAS: a `vas_switch` that keeps each VAS's page table.
//!
//! SpaceJMP §4.1 (dissertation ch. 8-9): a VAS has its own page table and a
//! switch "simply overwrites CR3" with it, so nothing is unmapped or
//! faulted again. In one Linux process there is one page table, and the
//! in-process backend ([`crate::vas`]) must remap to switch between VASes
//! whose segments overlap. Linux *does* load a page table on every switch
//! between processes (with PCID where the CPU has it, so the TLB is not
//! flushed either). This backend uses that: **each VAS is a process** and a
//! switch moves the calling thread's execution into it.
//!
//! *The processes.* [`ProcSpaces::start`] forks one process per VAS from
//! the application, so code, globals and everything built before the fork
//! sit at the same addresses in each. A VAS process attaches its VAS
//! ([`Jmp::vas_attach`]), keeps it attached for its whole life (its page
//! table fills on first touch and stays filled), and runs one carrier
//! thread per lane, pinned to that lane's CPU and asleep on a futex. Memory
//! common to all of them is mapped before the fork, `MAP_SHARED`, at one
//! address: each lane's stack and control block ([`CommonMem`]).
//!
//! *The lanes.* A lane is a thread of the application that moves through
//! the VASes; a runtime has one or more ([`ProcOptions::lanes`]), each on
//! its own CPU, run by [`ProcSpaces::run_lane`] from as many threads. Lanes
//! in the same VAS are threads of the same process, so a VAS has one page
//! table whichever lanes are in it, as in the paper.
//!
//! *A switch.* [`ProcSpaces::run`] runs a closure on the lane stack. The
//! closure gets a [`Mover`]; `Mover::switch(k)` saves the callee-saved
//! registers and the stack pointer in the shared control block
//! (`ctx::swap`), returns to the current process's dispatcher (on that
//! process's private stack), which releases the VAS it leaves (its segment
//! locks), wakes VAS process `k`'s carrier of this lane and goes to sleep.
//! That carrier wakes, enters its VAS (takes the segment locks), and swaps to
//! the saved context: the closure continues after `switch` on the same
//! stack, in the other process. The kernel's context switch between the
//! two processes (pinned to one CPU) is the page-table load.
//!
//! ```text
//!   home (app)            VAS 0 process          VAS 1 process
//!   run(f) ─▶ lane: f ─ switch(0) ─▶ ctx saved ─▶ enter VAS 0 ─▶ lane: f ...
//!   sleep                 │                       switch(1) ─▶ leave ─▶ wake 1 ─▶ sleep
//!                         │                                    enter VAS 1 ─▶ lane: f ...
//!   ◀─ lane done ◀─ switch home ◀─────────────────────────────────────────────┘
//! ```
//!
//! *What a switched thread may touch.* After a switch the code runs in
//! another process, on another kernel thread. So across a switch:
//! - memory in the current VAS's segments ([`Mover::data`]), locals on the
//!   lane stack, and memory mapped `MAP_SHARED` before
//!   [`ProcSpaces::start`] are the same everywhere;
//! - the private heap, statics and thread-locals are each process's own
//!   copy (as of the fork): a `Box`, `Vec` or `String` made before a switch
//!   must not be used or dropped after it, and a thread-local read after a
//!   switch is the new process's. Allocation within one visit is fine.
//!
//! The types enforce what they can: the closure and its result are
//! `Copy + 'static` (so they own no heap memory and borrow nothing private
//! from the caller), a [`Mover`] is neither `Send` nor `Sync` (no other
//! thread can switch the lane), and a slice from [`Mover::data_mut`]
//! borrows the mover, so it cannot be held across a switch. An error or a
//! panic inside a VAS comes back as text ([`Error::InVas`]): the error
//! value lives in that process's heap.
//!
//! *Failures.* The home process reaps its VAS processes while the lane is
//! away: a switch to a VAS whose process has died returns
//! [`Error::VasProcess`] in the process the lane came from; a process that
//! dies while the lane runs in it takes the lane's state with it, so `run`
//! returns [`Error::Lane`] and the runtime refuses further runs. VAS
//! processes die with the home process (`PR_SET_PDEATHSIG`).
//!
//! *What is real.* The page-table load on each switch, and page tables that
//! stay filled. *What is not:* the thread's move, a user-level hand-off
//! between two kernel threads over a futex (two system calls per switch).
//! x86-64 only (the context swap is assembly).

mod carrier;
mod common;
mod ctx;
mod mover;

use carrier::vas_process;
pub use common::CommonMem;
pub use mover::Mover;
use mover::{decode_error, lane_entry};

use crate::error::{Error, Result};
use crate::vas::{Active, AttachOptions, VasHandle};
use crate::Jmp;
use std::io::Write;
use std::marker::PhantomData;
use std::mem::{align_of, size_of, MaybeUninit};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Most VASes one runtime holds.
pub const MAX_VASES: usize = 64;
/// Most lanes (moving threads) one runtime holds.
pub const MAX_LANES: usize = 64;
/// Most segments of one VAS visible through [`Mover::data`].
pub const MAX_SEGS_PER_VAS: usize = 16;
/// Default lane stack.
pub const DEFAULT_STACK_BYTES: usize = 1 << 20;
/// Slot of the home (application) process; VAS `k` has slot `k + 1`.
const HOME: usize = 0;
/// Bytes of the message an error or panic in a VAS carries home.
const MSG_BYTES: usize = 1024;
/// Bytes of a VAS name kept in the control block.
const NAME_BYTES: usize = 64;
/// How often a waiting home process checks on its VAS processes.
const REAP_POLL_MS: u64 = 20;
/// How often a sleeping VAS process checks that its parent lives.
const CHILD_POLL_MS: u64 = 500;
/// Guard page below the lane stack.
const GUARD_BYTES: usize = 4096;

// Slot states (a zeroed slot is starting).
const READY: u32 = 1;
const FAILED: u32 = 2;
const DEAD: u32 = 3;

// Outcome of the lane's last switch, set where it resumes.
const SWITCH_OK: u32 = 0;
const SWITCH_TARGET_DEAD: u32 = 1;
const SWITCH_ENTER_FAILED: u32 = 2;

// How a run ended.
const RUN_OK: u32 = 1;
const RUN_ERR: u32 = 2;
const RUN_PANIC: u32 = 3;

/// Per-process slot: its futex word and dispatcher context.
#[repr(C, align(64))]
struct Slot {
    /// 1 when the lane has been handed to this process (futex word).
    go: AtomicU32,
    /// 0 while starting, then READY, FAILED or DEAD.
    state: AtomicU32,
    pid: AtomicU32,
    /// This process's dispatcher context while the lane runs here (written
    /// and read only by this process).
    disp_sp: AtomicUsize,
    name: [AtomicU8; NAME_BYTES],
}

/// One segment of the VAS the lane is in.
#[repr(C)]
struct SegRow {
    data: AtomicU64,
    len: AtomicU64,
    writable: AtomicU32,
}

/// The lane's control block: one zeroed `MAP_SHARED` page range, at the same
/// address in every process of the runtime.
#[repr(C)]
struct Ctl {
    slots: [Slot; MAX_VASES + 1],
    nslots: AtomicUsize,
    stack_lo: AtomicUsize,
    stack_hi: AtomicUsize,
    /// The lane's saved context while it is not running.
    lane_sp: AtomicUsize,
    /// Slot the lane runs in (or last arrived at).
    at: AtomicUsize,
    /// Whether the process at `at` entered its VAS.
    entered: AtomicU32,
    /// Target and origin of the switch in progress.
    next: AtomicUsize,
    from: AtomicUsize,
    /// 0 while a switch is in transit, 1 once the target has the lane.
    arrived: AtomicU32,
    switch_err: AtomicU32,
    /// Set by the lane when the closure has finished and it is home.
    done: AtomicU32,
    run_status: AtomicU32,
    /// Set when the runtime shuts down: VAS processes exit.
    exit: AtomicU32,
    switches: AtomicU64,
    nsegs: AtomicUsize,
    segs: [SegRow; MAX_SEGS_PER_VAS],
    /// Address of the `Active` guard of the VAS the lane is in, in the
    /// private memory of the process at `at` (0 when none).
    active: AtomicUsize,
    msg_len: AtomicUsize,
    msg: [AtomicU8; MSG_BYTES],
}

impl Ctl {
    fn set_msg(&self, s: &str) {
        let b = s.as_bytes();
        let n = b.len().min(MSG_BYTES);
        for (d, s) in self.msg.iter().zip(&b[..n]) {
            d.store(*s, Ordering::Relaxed);
        }
        self.msg_len.store(n, Ordering::Release);
    }

    fn msg(&self) -> String {
        let n = self.msg_len.load(Ordering::Acquire).min(MSG_BYTES);
        let v: Vec<u8> = self.msg[..n]
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        String::from_utf8_lossy(&v).into_owned()
    }

    fn name(&self, slot: usize) -> String {
        if slot == HOME {
            return "(home)".into();
        }
        let v: Vec<u8> = self.slots[slot]
            .name
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .take_while(|b| *b != 0)
            .collect();
        String::from_utf8_lossy(&v).into_owned()
    }

    /// Hand the lane to `slot`'s process and wake it.
    fn hand_off(&self, slot: usize) {
        let go = &self.slots[slot].go;
        go.store(1, Ordering::Release);
        xsync::futex::wake(go, 1);
    }
}

/// Page faults (minor + major) the calling kernel thread has taken so far
/// (`getrusage(RUSAGE_THREAD)`; 0 if it fails).
pub fn thread_faults() -> u64 {
    let mut ru = MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a valid out-pointer for getrusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: getrusage succeeded, so it filled `ru`.
    let ru = unsafe { ru.assume_init() };
    (ru.ru_minflt + ru.ru_majflt) as u64
}

/// Pin the calling thread to `cpu`; returns the previous mask.
fn pin_to(cpu: usize) -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the calls only read
    // and write these local sets.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut old) != 0 {
            return None;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return None;
        }
        Some(old)
    }
}

fn restore_affinity(old: &libc::cpu_set_t) {
    // SAFETY: `old` is a mask sched_getaffinity returned.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), old) };
}

/// Options of [`ProcSpaces::start`].
#[derive(Clone, Copy, Debug)]
pub struct ProcOptions {
    /// CPU of lane 0 (default: the CPU the caller of `start` is on); lane
    /// `i` runs on the `i`-th CPU after it in the process's affinity mask
    /// (wrapping). Every VAS process has one carrier thread per lane,
    /// pinned to that lane's CPU.
    pub cpu: Option<usize>,
    /// Lanes: threads that can move through the VASes at once, each on its
    /// own CPU (default 1). All lanes share each VAS's process, so a VAS has
    /// one page table whichever lanes run in it.
    pub lanes: usize,
    /// Pin at all (default true).
    pub pin: bool,
    /// Bytes of the lane stack (default 1 MiB, plus a guard page).
    pub stack_bytes: usize,
    /// Pre-fault each VAS's segments when its process attaches them.
    pub prefault: bool,
    /// How long `start` waits for every VAS process to attach.
    pub start_timeout: Duration,
}

impl Default for ProcOptions {
    fn default() -> Self {
        ProcOptions {
            cpu: None,
            lanes: 1,
            pin: true,
            stack_bytes: DEFAULT_STACK_BYTES,
            prefault: false,
            start_timeout: Duration::from_secs(10),
        }
    }
}

/// A runtime of one process per VAS and one or more lanes (module essay).
/// `Sync`: different threads may run different lanes at once.
pub struct ProcSpaces {
    /// One control block per lane.
    ctls: Vec<CommonMem>,
    /// The lane stacks: mapped for the runtime's life, used through `Ctl`.
    _stacks: Vec<CommonMem>,
    pids: Vec<libc::pid_t>,
    reaped: std::sync::Mutex<Vec<bool>>,
    cpus: Vec<Option<usize>>,
    lost: Vec<std::sync::atomic::AtomicBool>,
    busy: Vec<std::sync::atomic::AtomicBool>,
}

/// CPUs this process may run on, in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

// Where the lane starts: the closure, its result, and the control block, at
// the top of the lane stack.
#[repr(C)]
struct LaneStart<F, R> {
    f: F,
    out: MaybeUninit<R>,
    ctl: *const Ctl,
}

impl ProcSpaces {
    /// Fork one process per VAS in `vases` (by name); each attaches its VAS
    /// and waits for the lane. Call it while no other thread of this
    /// process is inside a [`Jmp`] call (the children are forks).
    pub fn start(jmp: &Jmp, vases: &[&str], opts: ProcOptions) -> Result<ProcSpaces> {
        if vases.is_empty() || vases.len() > MAX_VASES {
            return Err(Error::InvalidArgument(format!(
                "a process-per-VAS runtime holds 1 to {MAX_VASES} VASes, not {}",
                vases.len()
            )));
        }
        for v in vases {
            let info = jmp.vas_find(v)?;
            if info.segs.len() > MAX_SEGS_PER_VAS {
                return Err(Error::InvalidArgument(format!(
                    "VAS `{v}` has {} segments; a VAS process shows at most {MAX_SEGS_PER_VAS}",
                    info.segs.len()
                )));
            }
        }
        if opts.stack_bytes < 64 << 10 {
            return Err(Error::InvalidArgument(
                "the lane stack needs at least 64 KiB".into(),
            ));
        }
        if opts.lanes == 0 || opts.lanes > MAX_LANES {
            return Err(Error::InvalidArgument(format!(
                "a process-per-VAS runtime has 1 to {MAX_LANES} lanes, not {}",
                opts.lanes
            )));
        }
        let page = crate::sys::page_size() as usize;
        let stack_len = opts.stack_bytes.div_ceil(page) * page;
        let mut ctls = Vec::new();
        let mut stacks = Vec::new();
        for _ in 0..opts.lanes {
            let ctl_map = CommonMem::new(size_of::<Ctl>())?;
            let stack_map = CommonMem::new(stack_len + GUARD_BYTES)?;
            // SAFETY: the lowest page of our own mapping becomes the guard.
            if unsafe {
                libc::mprotect(
                    stack_map.addr() as *mut libc::c_void,
                    GUARD_BYTES,
                    libc::PROT_NONE,
                )
            } != 0
            {
                return Err(Error::last_os("mprotect (lane stack guard)", "anonymous"));
            }
            // SAFETY: the mapping is zeroed, page-aligned and as large as
            // Ctl; all-zero is a valid Ctl (atomics and arrays of atomics).
            let ctl: &Ctl = unsafe { &*(ctl_map.addr() as *const Ctl) };
            ctl.stack_lo
                .store(stack_map.addr() + GUARD_BYTES, Ordering::Relaxed);
            ctl.stack_hi
                .store(stack_map.addr() + stack_map.len(), Ordering::Relaxed);
            ctl.nslots.store(vases.len() + 1, Ordering::Relaxed);
            ctl.slots[HOME].state.store(READY, Ordering::Relaxed);
            for (k, v) in vases.iter().enumerate() {
                for (d, s) in ctl.slots[k + 1].name.iter().zip(v.bytes()) {
                    d.store(s, Ordering::Relaxed);
                }
            }
            ctls.push(ctl_map);
            stacks.push(stack_map);
        }
        let cpus: Vec<Option<usize>> = if opts.pin {
            // SAFETY: sched_getcpu has no preconditions.
            let first = opts
                .cpu
                .or_else(|| usize::try_from(unsafe { libc::sched_getcpu() }).ok());
            let allowed = allowed_cpus();
            let at = first.and_then(|c| allowed.iter().position(|&a| a == c));
            (0..opts.lanes)
                .map(|i| match (i, at) {
                    (0, _) => first,
                    (_, Some(at)) => Some(allowed[(at + i) % allowed.len()]),
                    _ => None,
                })
                .collect()
        } else {
            vec![None; opts.lanes]
        };
        // Buffered output would be written once per process.
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        let lane_ctls: Vec<&Ctl> = ctls
            .iter()
            // SAFETY: each map holds a Ctl set up above.
            .map(|m| unsafe { &*(m.addr() as *const Ctl) })
            .collect();
        let mut rt = ProcSpaces {
            pids: Vec::new(),
            reaped: std::sync::Mutex::new(Vec::new()),
            lost: (0..opts.lanes).map(|_| Default::default()).collect(),
            busy: (0..opts.lanes).map(|_| Default::default()).collect(),
            cpus: cpus.clone(),
            ctls: Vec::new(),
            _stacks: Vec::new(),
        };
        for (k, v) in vases.iter().enumerate() {
            // SAFETY: fork; the child runs only `vas_process`, which never
            // returns into the caller's frames and ends in `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                vas_process(jmp, &lane_ctls, k + 1, v, opts.prefault, &cpus, parent);
            }
            if pid < 0 {
                rt.ctls = ctls;
                rt._stacks = stacks;
                return Err(Error::last_os("fork (VAS process)", *v));
            }
            for c in &lane_ctls {
                c.slots[k + 1].pid.store(pid as u32, Ordering::Relaxed);
            }
            rt.pids.push(pid);
            rt.reaped_mut().push(false);
        }
        drop(lane_ctls);
        rt.ctls = ctls;
        rt._stacks = stacks;
        let deadline = Instant::now() + opts.start_timeout;
        for k in 1..=vases.len() {
            loop {
                let ctl = rt.ctl(0);
                match ctl.slots[k].state.load(Ordering::Acquire) {
                    READY => break,
                    FAILED => {
                        return Err(Error::VasProcess {
                            vas: ctl.name(k),
                            detail: format!("could not attach its VAS: {}", ctl.msg()),
                        })
                    }
                    _ => {}
                }
                rt.reap();
                if rt.reaped_mut()[k - 1] {
                    return Err(Error::VasProcess {
                        vas: ctl.name(k),
                        detail: "died while attaching its VAS".into(),
                    });
                }
                if Instant::now() > deadline {
                    return Err(Error::VasProcess {
                        vas: ctl.name(k),
                        detail: format!(
                            "did not attach its VAS within {:?} (another thread held the \
                             process's SpaceJMP state at the fork?)",
                            opts.start_timeout
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(rt)
    }

    fn ctl(&self, lane: usize) -> &Ctl {
        // SAFETY: `ctls[lane]` holds a Ctl (set up in `start`) for our
        // lifetime.
        unsafe { &*(self.ctls[lane].addr() as *const Ctl) }
    }

    fn reaped_mut(&self) -> std::sync::MutexGuard<'_, Vec<bool>> {
        self.reaped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Process ids of the VAS processes, in the order of `start`'s list.
    pub fn pids(&self) -> &[libc::pid_t] {
        &self.pids
    }

    /// Number of lanes.
    pub fn lanes(&self) -> usize {
        self.ctls.len()
    }

    /// CPU lane `lane` runs on, if pinned.
    pub fn cpu(&self, lane: usize) -> Option<usize> {
        self.cpus.get(lane).copied().flatten()
    }

    /// Switches completed so far by all lanes (arrivals in a VAS process
    /// or home).
    pub fn switches(&self) -> u64 {
        (0..self.lanes())
            .map(|l| self.ctl(l).switches.load(Ordering::Relaxed))
            .sum()
    }

    /// Reap VAS processes that have exited; mark their slots dead in
    /// every lane.
    fn reap(&self) -> bool {
        let mut any = false;
        let mut reaped = self.reaped_mut();
        for (k, &pid) in self.pids.iter().enumerate() {
            if reaped[k] {
                continue;
            }
            let mut status = 0;
            // SAFETY: `pid` is our child; WNOHANG never blocks.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid || r < 0 {
                reaped[k] = true;
                for l in 0..self.lanes() {
                    self.ctl(l).slots[k + 1]
                        .state
                        .store(DEAD, Ordering::Release);
                }
                any = true;
            }
        }
        any
    }

    /// Home waits for lane `lane` to come back, checking on the VAS
    /// processes.
    fn wait_home(&self, lane: usize) -> Result<()> {
        let ctl = self.ctl(lane);
        loop {
            let go = &ctl.slots[HOME].go;
            if go.swap(0, Ordering::Acquire) == 1 {
                return Ok(());
            }
            xsync::futex::wait_timeout(go, 0, Duration::from_millis(REAP_POLL_MS));
            if go.load(Ordering::Acquire) == 1 {
                continue;
            }
            self.reap();
            let arrived = ctl.arrived.load(Ordering::Acquire);
            if arrived == 0 {
                let next = ctl.next.load(Ordering::Relaxed);
                if ctl.slots[next].state.load(Ordering::Acquire) == DEAD {
                    // In transit to a dead process: give the lane back to
                    // where it came from, with an error.
                    ctl.switch_err.store(SWITCH_TARGET_DEAD, Ordering::Relaxed);
                    ctl.arrived.store(1, Ordering::Release);
                    let from = ctl.from.load(Ordering::Relaxed);
                    if from == HOME {
                        return Ok(());
                    }
                    if ctl.slots[from].state.load(Ordering::Acquire) == DEAD {
                        return Err(self.lose(lane, from));
                    }
                    ctl.hand_off(from);
                }
            } else {
                let at = ctl.at.load(Ordering::Acquire);
                if at != HOME && ctl.slots[at].state.load(Ordering::Acquire) == DEAD {
                    return Err(self.lose(lane, at));
                }
            }
        }
    }

    fn lose(&self, lane: usize, slot: usize) -> Error {
        self.lost[lane].store(true, Ordering::Release);
        Error::Lane(format!(
            "the process of VAS `{}` died while lane {lane} was in it; the lane's state is \
             gone and this lane cannot run again",
            self.ctl(lane).name(slot)
        ))
    }

    /// Run `f` on lane 0: it starts in the calling (home) process, moves
    /// between VAS processes with [`Mover::switch`], and is brought home
    /// when it returns. See the module essay for what `f` may touch.
    pub fn run<R, F>(&mut self, f: F) -> Result<R>
    where
        F: FnOnce(&mut Mover) -> Result<R> + Copy + 'static,
        R: Copy + 'static,
    {
        self.run_lane(0, f)
    }

    /// Run `f` on lane `lane` (as [`ProcSpaces::run`]); different threads
    /// may run different lanes at once, a lane runs one closure at a time.
    pub fn run_lane<R, F>(&self, lane: usize, f: F) -> Result<R>
    where
        F: FnOnce(&mut Mover) -> Result<R> + Copy + 'static,
        R: Copy + 'static,
    {
        if lane >= self.lanes() {
            return Err(Error::InvalidArgument(format!(
                "lane {lane} out of range (the runtime has {})",
                self.lanes()
            )));
        }
        if self.lost[lane].load(Ordering::Acquire) {
            return Err(Error::Lane(
                "a VAS process died with this lane in it; start a new runtime".into(),
            ));
        }
        if self.busy[lane].swap(true, Ordering::Acquire) {
            return Err(Error::Lane(format!("lane {lane} is already running")));
        }
        let r = self.run_on(lane, f);
        self.busy[lane].store(false, Ordering::Release);
        r
    }

    fn run_on<R, F>(&self, lane: usize, f: F) -> Result<R>
    where
        F: FnOnce(&mut Mover) -> Result<R> + Copy + 'static,
        R: Copy + 'static,
    {
        let ctl_ptr = self.ctls[lane].addr() as *const Ctl;
        let ctl = self.ctl(lane);
        let hi = ctl.stack_hi.load(Ordering::Relaxed);
        let lo = ctl.stack_lo.load(Ordering::Relaxed);
        let align = align_of::<LaneStart<F, R>>().max(64);
        let start_addr = (hi - size_of::<LaneStart<F, R>>()) & !(align - 1);
        if start_addr < lo + (hi - lo) / 2 {
            return Err(Error::InvalidArgument(
                "the closure and its result take more than half the lane stack".into(),
            ));
        }
        // SAFETY: `start_addr` is aligned for LaneStart and lies in the lane
        // stack, which no run uses now (the lane's busy flag is ours).
        unsafe {
            (start_addr as *mut LaneStart<F, R>).write(LaneStart {
                f,
                out: MaybeUninit::uninit(),
                ctl: ctl_ptr,
            })
        };
        // SAFETY: the frame goes right below LaneStart, in the unused lane
        // stack; the top is 16-aligned.
        let sp = unsafe { ctx::prepare(start_addr & !15, lane_entry::<F, R>, start_addr) };
        ctl.lane_sp.store(sp, Ordering::Relaxed);
        ctl.done.store(0, Ordering::Relaxed);
        ctl.run_status.store(0, Ordering::Relaxed);
        ctl.msg_len.store(0, Ordering::Relaxed);
        ctl.switch_err.store(SWITCH_OK, Ordering::Relaxed);
        ctl.arrived.store(1, Ordering::Relaxed);
        ctl.entered.store(1, Ordering::Relaxed);
        ctl.nsegs.store(0, Ordering::Relaxed);
        ctl.active.store(0, Ordering::Relaxed);
        let old = self.cpu(lane).and_then(pin_to);
        let res = loop {
            ctl.at.store(HOME, Ordering::Release);
            // SAFETY: lane_sp is the lane's saved context on the lane
            // stack (mapped here); our own context is saved in our slot.
            unsafe {
                ctx::swap(
                    ctl.slots[HOME].disp_sp.as_ptr(),
                    ctl.lane_sp.load(Ordering::Acquire),
                )
            };
            if ctl.done.load(Ordering::Acquire) == 1 {
                break Ok(());
            }
            ctl.hand_off(ctl.next.load(Ordering::Relaxed));
            if let Err(e) = self.wait_home(lane) {
                break Err(e);
            }
            ctl.switches.fetch_add(1, Ordering::Relaxed);
            ctl.entered.store(1, Ordering::Relaxed);
            ctl.nsegs.store(0, Ordering::Relaxed);
            ctl.active.store(0, Ordering::Relaxed);
        };
        if let Some(old) = old {
            restore_affinity(&old);
        }
        res?;
        match ctl.run_status.load(Ordering::Acquire) {
            // SAFETY: RUN_OK means the lane wrote `out` before finishing.
            RUN_OK => Ok(unsafe { (*(start_addr as *const LaneStart<F, R>)).out.assume_init() }),
            RUN_PANIC => Err(Error::InVas {
                vas: String::new(),
                detail: format!("panicked: {}", ctl.msg()),
            }),
            _ => Err(decode_error(&ctl.msg())),
        }
    }
}

impl Drop for ProcSpaces {
    fn drop(&mut self) {
        for l in 0..self.lanes() {
            let ctl = self.ctl(l);
            ctl.exit.store(1, Ordering::Release);
            for k in 1..=self.pids.len() {
                ctl.hand_off(k);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.reaped_mut().iter().any(|r| !r) && Instant::now() < deadline {
            self.reap();
            std::thread::sleep(Duration::from_millis(1));
        }
        let reaped = self.reaped_mut().clone();
        for (k, &pid) in self.pids.iter().enumerate() {
            if !reaped[k] {
                // SAFETY: our unreaped child: kill and reap it.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
            }
        }
    }
}
