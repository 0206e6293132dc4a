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
//! table fills on first touch and stays filled), pins itself to the lane's
//! CPU and sleeps on a futex. Memory common to all of them is mapped before
//! the fork, `MAP_SHARED`, at one address: the lane's stack and the lane's
//! control block.
//!
//! *The lane.* [`ProcSpaces::run`] runs a closure on the lane stack. The
//! closure gets a [`Mover`]; `Mover::switch(k)` saves the callee-saved
//! registers and the stack pointer in the shared control block
//! ([`ctx::swap`]), returns to the current process's dispatcher (on that
//! process's private stack), which releases the VAS it leaves (its segment
//! locks), wakes VAS process `k` and goes to sleep. Process `k`'s
//! dispatcher wakes, enters its VAS (takes the segment locks), and swaps to
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

mod ctx;

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
    /// Page faults of this process's carrier thread when it last left.
    faults: AtomicU64,
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

/// Faults (minor + major) of the calling kernel thread so far.
fn thread_faults() -> u64 {
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
    /// CPU the lane and every VAS process run on (default: the CPU the
    /// caller of `start` is on). `None` leaves placement to the kernel.
    pub cpu: Option<usize>,
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
            pin: true,
            stack_bytes: DEFAULT_STACK_BYTES,
            prefault: false,
            start_timeout: Duration::from_secs(10),
        }
    }
}

/// Memory common to the home process and every VAS process of runtimes
/// started after it: a zeroed anonymous `MAP_SHARED` mapping, which a fork
/// inherits at the same address. Use it for what the lane and other threads
/// of the application share (flags, barriers, results); it is unmapped when
/// dropped, so drop it only after the runtimes that use it.
pub struct CommonMem {
    addr: usize,
    len: usize,
}

impl CommonMem {
    /// Map `len` bytes (rounded up to pages), zeroed.
    pub fn new(len: usize) -> Result<CommonMem> {
        let page = crate::sys::page_size() as usize;
        let len = len.max(1).div_ceil(page) * page;
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os("mmap (common memory)", "anonymous"));
        }
        Ok(CommonMem {
            addr: p as usize,
            len,
        })
    }

    /// Its address (the same in every process forked after `new`).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The atomic word at byte `offset` (8-aligned, in bounds).
    pub fn word(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len,
            "word {offset} outside common memory"
        );
        // SAFETY: in bounds and aligned (checked above); the mapping lives
        // as long as `self`, and the memory is only used atomically here.
        unsafe { &*((self.addr + offset) as *const std::sync::atomic::AtomicU64) }
    }
}

impl Drop for CommonMem {
    fn drop(&mut self) {
        // SAFETY: our own mapping; the caller drops it after the runtimes
        // that use it.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// A runtime of one lane and one process per VAS (module essay).
pub struct ProcSpaces {
    ctl_map: CommonMem,
    /// The lane stack: mapped for the runtime's life, used through `Ctl`.
    _stack_map: CommonMem,
    pids: Vec<libc::pid_t>,
    reaped: Vec<bool>,
    cpu: Option<usize>,
    lost: bool,
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
        let page = crate::sys::page_size() as usize;
        let ctl_map = CommonMem::new(size_of::<Ctl>())?;
        let stack_len = opts.stack_bytes.div_ceil(page) * page;
        let stack_map = CommonMem::new(stack_len + GUARD_BYTES)?;
        // SAFETY: the lowest page of our own mapping becomes the guard.
        if unsafe {
            libc::mprotect(
                stack_map.addr as *mut libc::c_void,
                GUARD_BYTES,
                libc::PROT_NONE,
            )
        } != 0
        {
            return Err(Error::last_os("mprotect (lane stack guard)", "anonymous"));
        }
        // SAFETY: the mapping is zeroed, page-aligned and as large as Ctl;
        // all-zero is a valid Ctl (atomics and arrays of atomics).
        let ctl: &Ctl = unsafe { &*(ctl_map.addr as *const Ctl) };
        ctl.stack_lo
            .store(stack_map.addr + GUARD_BYTES, Ordering::Relaxed);
        ctl.stack_hi
            .store(stack_map.addr + stack_map.len, Ordering::Relaxed);
        ctl.nslots.store(vases.len() + 1, Ordering::Relaxed);
        ctl.slots[HOME].state.store(READY, Ordering::Relaxed);
        for (k, v) in vases.iter().enumerate() {
            for (d, s) in ctl.slots[k + 1].name.iter().zip(v.bytes()) {
                d.store(s, Ordering::Relaxed);
            }
        }
        let cpu = if opts.pin {
            // SAFETY: sched_getcpu has no preconditions.
            opts.cpu
                .or_else(|| usize::try_from(unsafe { libc::sched_getcpu() }).ok())
        } else {
            None
        };
        // Buffered output would be written once per process.
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        let mut rt = ProcSpaces {
            ctl_map,
            _stack_map: stack_map,
            pids: Vec::new(),
            reaped: Vec::new(),
            cpu,
            lost: false,
        };
        for (k, v) in vases.iter().enumerate() {
            // SAFETY: fork; the child runs only `vas_process`, which never
            // returns into the caller's frames and ends in `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                vas_process(jmp, ctl, k + 1, v, opts.prefault, cpu, parent);
            }
            if pid < 0 {
                return Err(Error::last_os("fork (VAS process)", *v));
            }
            ctl.slots[k + 1].pid.store(pid as u32, Ordering::Relaxed);
            rt.pids.push(pid);
            rt.reaped.push(false);
        }
        let deadline = Instant::now() + opts.start_timeout;
        for k in 1..=vases.len() {
            loop {
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
                if rt.reaped[k - 1] {
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

    fn ctl(&self) -> &Ctl {
        // SAFETY: `ctl_map` holds a Ctl (set up in `start`) for our lifetime.
        unsafe { &*(self.ctl_map.addr as *const Ctl) }
    }

    /// Process ids of the VAS processes, in the order of `start`'s list.
    pub fn pids(&self) -> &[libc::pid_t] {
        &self.pids
    }

    /// CPU the lane runs on, if pinned.
    pub fn cpu(&self) -> Option<usize> {
        self.cpu
    }

    /// Switches completed so far (arrivals in a VAS process or home).
    pub fn switches(&self) -> u64 {
        self.ctl().switches.load(Ordering::Relaxed)
    }

    /// Reap VAS processes that have exited; mark their slots dead.
    fn reap(&mut self) -> bool {
        let mut any = false;
        for (k, &pid) in self.pids.iter().enumerate() {
            if self.reaped[k] {
                continue;
            }
            let mut status = 0;
            // SAFETY: `pid` is our child; WNOHANG never blocks.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid || r < 0 {
                self.reaped[k] = true;
                self.ctl().slots[k + 1].state.store(DEAD, Ordering::Release);
                any = true;
            }
        }
        any
    }

    /// Home waits for the lane to come back, checking on the VAS processes.
    fn wait_home(&mut self) -> Result<()> {
        loop {
            let ctl = self.ctl();
            let go = &ctl.slots[HOME].go;
            if go.swap(0, Ordering::Acquire) == 1 {
                return Ok(());
            }
            xsync::futex::wait_timeout(go, 0, Duration::from_millis(REAP_POLL_MS));
            if go.load(Ordering::Acquire) == 1 {
                continue;
            }
            self.reap();
            let ctl = self.ctl();
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
                        return Err(self.lose(from));
                    }
                    ctl.hand_off(from);
                }
            } else {
                let at = ctl.at.load(Ordering::Acquire);
                if at != HOME && ctl.slots[at].state.load(Ordering::Acquire) == DEAD {
                    return Err(self.lose(at));
                }
            }
        }
    }

    fn lose(&mut self, slot: usize) -> Error {
        self.lost = true;
        Error::Lane(format!(
            "the process of VAS `{}` died while the lane was in it; the lane's state is gone \
             and this runtime cannot run again",
            self.ctl().name(slot)
        ))
    }

    /// Run `f` on the lane: it starts in the calling (home) process, moves
    /// between VAS processes with [`Mover::switch`], and is brought home
    /// when it returns. See the module essay for what `f` may touch.
    pub fn run<R, F>(&mut self, f: F) -> Result<R>
    where
        F: FnOnce(&mut Mover) -> Result<R> + Copy + 'static,
        R: Copy + 'static,
    {
        if self.lost {
            return Err(Error::Lane(
                "a VAS process died with the lane in it; start a new runtime".into(),
            ));
        }
        let ctl_ptr = self.ctl_map.addr as *const Ctl;
        let ctl = self.ctl();
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
        // stack, which no lane uses now (`run` takes `&mut self`).
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
        let old = self.cpu.and_then(pin_to);
        let res = loop {
            let ctl = self.ctl();
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
            if let Err(e) = self.wait_home() {
                break Err(e);
            }
            let ctl = self.ctl();
            ctl.switches.fetch_add(1, Ordering::Relaxed);
            ctl.entered.store(1, Ordering::Relaxed);
            ctl.nsegs.store(0, Ordering::Relaxed);
            ctl.active.store(0, Ordering::Relaxed);
        };
        if let Some(old) = old {
            restore_affinity(&old);
        }
        res?;
        let ctl = self.ctl();
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
        let ctl = self.ctl();
        ctl.exit.store(1, Ordering::Release);
        for k in 1..=self.pids.len() {
            ctl.hand_off(k);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.reaped.iter().any(|r| !r) && Instant::now() < deadline {
            self.reap();
            std::thread::sleep(Duration::from_millis(1));
        }
        for (k, &pid) in self.pids.iter().enumerate() {
            if !self.reaped[k] {
                // SAFETY: our unreaped child: kill and reap it.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
            }
        }
    }
}

/// Errors from a VAS travel as text: `kind \x1f vas \x1f detail`.
const ERR_SEP: char = '\u{1f}';

fn encode_error(e: &Error, at: &str) -> String {
    match e {
        Error::VasProcess { vas, detail } => format!("p{ERR_SEP}{vas}{ERR_SEP}{detail}"),
        Error::Lane(d) => format!("l{ERR_SEP}{ERR_SEP}{d}"),
        Error::InVas { vas, detail } => format!("v{ERR_SEP}{vas}{ERR_SEP}{detail}"),
        e => format!("v{ERR_SEP}{at}{ERR_SEP}{e}"),
    }
}

fn decode_error(s: &str) -> Error {
    let mut it = s.splitn(3, ERR_SEP);
    let (kind, vas, detail) = (
        it.next().unwrap_or(""),
        it.next().unwrap_or("").to_string(),
        it.next().unwrap_or("").to_string(),
    );
    match kind {
        "p" => Error::VasProcess { vas, detail },
        "l" => Error::Lane(detail),
        _ => Error::InVas { vas, detail },
    }
}

/// The lane's first frame: run the closure, record its outcome where it
/// ended, go home and finish.
extern "C" fn lane_entry<F, R>(arg: usize) -> !
where
    F: FnOnce(&mut Mover) -> Result<R> + Copy + 'static,
    R: Copy + 'static,
{
    let start = arg as *mut LaneStart<F, R>;
    // SAFETY: `run` wrote a LaneStart at `arg` on the lane stack, which
    // stays mapped in every process of the runtime.
    let (f, ctl_ptr) = unsafe { ((*start).f, (*start).ctl) };
    // SAFETY: the control block outlives every run.
    let ctl: &Ctl = unsafe { &*ctl_ptr };
    let mut mover = Mover {
        ctl: ctl_ptr,
        _local: PhantomData,
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| f(&mut mover)));
    match outcome {
        Ok(Ok(r)) => {
            // SAFETY: `out` is ours to write; R is Copy, so no destructor
            // and no private heap behind it.
            unsafe { (*start).out.write(r) };
            ctl.run_status.store(RUN_OK, Ordering::Release);
        }
        Ok(Err(e)) => {
            ctl.set_msg(&encode_error(&e, &ctl.name(ctl.at.load(Ordering::Relaxed))));
            ctl.run_status.store(RUN_ERR, Ordering::Release);
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string payload".into());
            ctl.set_msg(&format!(
                "{what} (in VAS `{}`)",
                ctl.name(ctl.at.load(Ordering::Relaxed))
            ));
            ctl.run_status.store(RUN_PANIC, Ordering::Release);
        }
    }
    // Everything this process allocated for the outcome is dropped above,
    // here. Now go home; home is alive (it is waiting for us).
    while mover.go(HOME).is_err() {}
    ctl.done.store(1, Ordering::Release);
    let mut finished = 0usize;
    // SAFETY: we are home; home's dispatcher context is saved in its slot.
    // This context is never resumed.
    unsafe {
        ctx::swap(
            &mut finished,
            ctl.slots[HOME].disp_sp.load(Ordering::Acquire),
        )
    };
    std::process::abort()
}

/// The body of a VAS process: attach, then serve the lane until told to
/// exit. Never returns.
fn vas_process(
    jmp: &Jmp,
    ctl: &Ctl,
    me: usize,
    vas: &str,
    prefault: bool,
    cpu: Option<usize>,
    parent: libc::pid_t,
) -> ! {
    // SAFETY: prctl/getppid have no memory preconditions; `_exit` ends the
    // child without running the parent's destructors a second time.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            libc::_exit(1);
        }
    }
    if let Some(c) = cpu {
        pin_to(c);
    }
    let handle = match jmp.vas_attach(vas, AttachOptions { prefault }) {
        Ok(h) => h,
        Err(e) => {
            ctl.set_msg(&e.to_string());
            ctl.slots[me].state.store(FAILED, Ordering::Release);
            // SAFETY: as above.
            unsafe { libc::_exit(1) }
        }
    };
    ctl.slots[me].state.store(READY, Ordering::Release);
    loop {
        wait_turn(ctl, me, parent);
        ctl.switches.fetch_add(1, Ordering::Relaxed);
        let mut active = enter(ctl, &handle);
        ctl.active.store(
            active.as_mut().map_or(0, |a| a as *mut Active<'_> as usize),
            Ordering::Relaxed,
        );
        ctl.at.store(me, Ordering::Relaxed);
        ctl.arrived.store(1, Ordering::Release);
        // SAFETY: lane_sp is the lane's context on the shared lane stack,
        // mapped at the same address here; our context goes to our slot.
        unsafe {
            ctx::swap(
                ctl.slots[me].disp_sp.as_ptr(),
                ctl.lane_sp.load(Ordering::Acquire),
            )
        };
        ctl.slots[me]
            .faults
            .store(thread_faults(), Ordering::Relaxed);
        ctl.active.store(0, Ordering::Relaxed);
        drop(active);
        ctl.hand_off(ctl.next.load(Ordering::Relaxed));
    }
}

/// Enter this process's VAS for the lane and publish its segments.
fn enter<'h>(ctl: &Ctl, handle: &'h VasHandle<'_>) -> Option<Active<'h>> {
    match handle.switch() {
        Ok(a) => {
            let mut n = 0;
            for (s, access) in handle.segments() {
                let row = &ctl.segs[n];
                row.data.store(s.data_start(), Ordering::Relaxed);
                row.len.store(s.size - s.header_size, Ordering::Relaxed);
                row.writable
                    .store((access == crate::Access::Write) as u32, Ordering::Relaxed);
                n += 1;
            }
            ctl.nsegs.store(n, Ordering::Relaxed);
            ctl.entered.store(1, Ordering::Relaxed);
            Some(a)
        }
        Err(e) => {
            ctl.set_msg(&e.to_string());
            ctl.nsegs.store(0, Ordering::Relaxed);
            ctl.entered.store(0, Ordering::Relaxed);
            ctl.switch_err.store(SWITCH_ENTER_FAILED, Ordering::Relaxed);
            None
        }
    }
}

/// Sleep until the lane is handed to `me`; exit when told to or when the
/// parent is gone.
fn wait_turn(ctl: &Ctl, me: usize, parent: libc::pid_t) {
    let go = &ctl.slots[me].go;
    loop {
        if ctl.exit.load(Ordering::Acquire) == 1 {
            // SAFETY: ends the child without unwinding into the parent's
            // frames or dropping objects the parent owns.
            unsafe { libc::_exit(0) };
        }
        if go.swap(0, Ordering::Acquire) == 1 {
            return;
        }
        xsync::futex::wait_timeout(go, 0, Duration::from_millis(CHILD_POLL_MS));
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } != parent {
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
    }
}

/// The lane's handle inside [`ProcSpaces::run`]: switch between VASes and
/// reach the current VAS's segments. Neither `Send` nor `Sync`.
pub struct Mover {
    ctl: *const Ctl,
    _local: PhantomData<*mut ()>,
}

impl Mover {
    fn ctl(&self) -> &Ctl {
        // SAFETY: the control block is mapped in every process of the
        // runtime for as long as a lane runs.
        unsafe { &*self.ctl }
    }

    /// Number of VASes in the runtime.
    pub fn vases(&self) -> usize {
        self.ctl().nslots.load(Ordering::Relaxed) - 1
    }

    /// Index of the VAS the lane is in (`None` at home, or when entering
    /// the VAS failed).
    pub fn current(&self) -> Option<usize> {
        let c = self.ctl();
        let at = c.at.load(Ordering::Relaxed);
        (at != HOME && c.entered.load(Ordering::Relaxed) == 1).then(|| at - 1)
    }

    /// Move the lane into VAS `vas` (an index into `start`'s list): its
    /// process, its page table, its segment locks.
    pub fn switch(&mut self, vas: usize) -> Result<()> {
        if vas >= self.vases() {
            return Err(Error::InvalidArgument(format!(
                "VAS index {vas} out of range (the runtime has {})",
                self.vases()
            )));
        }
        self.go(vas + 1)
    }

    /// Move the lane back to the home process (in no VAS).
    pub fn home(&mut self) -> Result<()> {
        self.go(HOME)
    }

    fn go(&mut self, slot: usize) -> Result<()> {
        let c = self.ctl();
        let at = c.at.load(Ordering::Relaxed);
        if slot == at && c.entered.load(Ordering::Relaxed) == 1 {
            return Ok(());
        }
        if c.slots[slot].state.load(Ordering::Acquire) == DEAD {
            return Err(Error::VasProcess {
                vas: c.name(slot),
                detail: "has died".into(),
            });
        }
        c.next.store(slot, Ordering::Relaxed);
        c.from.store(at, Ordering::Relaxed);
        c.switch_err.store(SWITCH_OK, Ordering::Relaxed);
        c.arrived.store(0, Ordering::Release);
        // SAFETY: the dispatcher of the process we are in saved its context
        // in its slot before it swapped to us; ours goes to `lane_sp`.
        unsafe {
            ctx::swap(
                c.lane_sp.as_ptr(),
                c.slots[at].disp_sp.load(Ordering::Acquire),
            )
        };
        let c = self.ctl();
        match c.switch_err.load(Ordering::Acquire) {
            SWITCH_OK => Ok(()),
            SWITCH_TARGET_DEAD => Err(Error::VasProcess {
                vas: c.name(slot),
                detail: "died before the lane arrived".into(),
            }),
            _ => Err(Error::InVas {
                vas: c.name(slot),
                detail: format!("entering the VAS failed: {}", c.msg()),
            }),
        }
    }

    fn seg(&self, k: usize, write: bool) -> Result<(u64, u64)> {
        let c = self.ctl();
        let Some(cur) = self.current() else {
            return Err(Error::Lane("the lane is in no VAS".into()));
        };
        let n = c.nsegs.load(Ordering::Relaxed);
        if k >= n {
            return Err(Error::InvalidArgument(format!(
                "VAS `{}` has {n} segments, not {}",
                c.name(cur + 1),
                k + 1
            )));
        }
        let row = &c.segs[k];
        if write && row.writable.load(Ordering::Relaxed) == 0 {
            return Err(Error::PermissionDenied {
                name: c.name(cur + 1),
                detail: format!("segment {k} is attached read-only"),
            });
        }
        Ok((
            row.data.load(Ordering::Relaxed),
            row.len.load(Ordering::Relaxed),
        ))
    }

    /// The data area of segment `k` (in the order of the VAS's segment list)
    /// of the current VAS.
    pub fn data(&self, k: usize) -> Result<&[u8]> {
        let (p, n) = self.seg(k, false)?;
        // SAFETY: the current VAS process has the segment mapped at `p` for
        // `n` bytes while the lane is in it; the slice borrows the mover,
        // so it cannot live across a switch.
        Ok(unsafe { std::slice::from_raw_parts(p as *const u8, n as usize) })
    }

    /// Writable data area of segment `k` of the current VAS.
    pub fn data_mut(&mut self, k: usize) -> Result<&mut [u8]> {
        let (p, n) = self.seg(k, true)?;
        // SAFETY: as in `data`, and the segment is mapped writable; the
        // exclusive borrow of the mover keeps a second slice from existing.
        Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n as usize) })
    }

    /// Run `f` with the current VAS's [`Active`] guard: the whole in-VAS
    /// API (segment heaps, roots, [`crate::SegPtr::get`], `vcast`) of the
    /// process the lane is in. A segment attached to several VASes is one
    /// file at one base in each of their processes, so a heap in it is
    /// common to them: that is where data that crosses switches lives.
    pub fn with_active<T>(&mut self, f: impl FnOnce(&mut Active<'_>) -> T) -> Result<T> {
        let p = self.ctl().active.load(Ordering::Relaxed);
        if p == 0 || self.current().is_none() {
            return Err(Error::Lane("the lane is in no VAS".into()));
        }
        // SAFETY: `p` is the address of the guard the dispatcher of the
        // process we run in holds on its (suspended) private stack for as
        // long as the lane is here; the lane cannot leave while `f` runs
        // (`self` is borrowed), and `f` cannot keep anything tied to the
        // guard's lifetime, which it cannot name.
        let a = unsafe { &mut *(p as *mut Active<'_>) };
        Ok(f(a))
    }

    /// Page faults taken so far by the process the lane is in (its carrier
    /// thread: the lane's own faults there).
    pub fn faults(&self) -> u64 {
        thread_faults()
    }
}
