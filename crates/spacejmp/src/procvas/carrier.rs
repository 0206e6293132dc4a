//! The VAS processes' side of a switch: attach the VAS, then one carrier
//! thread per lane, each asleep on its futex word until the lane is handed
//! to it, entering the VAS (segment locks) and swapping to the lane's saved
//! context; when the lane leaves, release the VAS and wake the target.

use super::*;

/// The body of a VAS process: attach, then serve every lane (one carrier
/// thread each, pinned to the lane's CPU) until told to exit. Never
/// returns.
pub(super) fn vas_process(
    jmp: &Jmp,
    ctls: &[&Ctl],
    me: usize,
    vas: &str,
    prefault: bool,
    cpus: &[Option<usize>],
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
    let handle = match jmp.vas_attach(vas, AttachOptions { prefault }) {
        Ok(h) => h,
        Err(e) => {
            ctls[0].set_msg(&e.to_string());
            ctls[0].slots[me].state.store(FAILED, Ordering::Release);
            // SAFETY: as above.
            unsafe { libc::_exit(1) }
        }
    };
    let handle = &handle;
    std::thread::scope(|s| {
        for (l, ctl) in ctls.iter().enumerate().skip(1) {
            let cpu = cpus[l];
            s.spawn(move || serve_lane(ctl, me, handle, cpu, parent));
        }
        ctls[0].slots[me].state.store(READY, Ordering::Release);
        serve_lane(ctls[0], me, handle, cpus[0], parent)
    })
}

/// One carrier thread of a VAS process: serve one lane until told to exit.
fn serve_lane(
    ctl: &Ctl,
    me: usize,
    handle: &VasHandle<'_>,
    cpu: Option<usize>,
    parent: libc::pid_t,
) -> ! {
    if let Some(c) = cpu {
        pin_to(c);
    }
    loop {
        wait_turn(ctl, me, parent);
        ctl.switches.fetch_add(1, Ordering::Relaxed);
        let mut active = enter(ctl, handle);
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
