//! The lane's side of a switch: the first frame of a run ([`lane_entry`]),
//! the [`Mover`] the closure switches with, and how an outcome crosses back
//! to the home process (errors as text: they live in another heap).

use super::*;

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

pub(super) fn decode_error(s: &str) -> Error {
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
pub(super) extern "C" fn lane_entry<F, R>(arg: usize) -> !
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
