//! The process-per-VAS backend: overlapping VASes keep their own pages and
//! page tables, the lane's stack state crosses switches, errors and panics
//! come home as text, dead VAS processes are reported, and segment locks
//! keep their cross-process meaning.

mod common;

use common::Store;
use spacejmp::procvas::{CommonMem, Mover, ProcOptions, ProcSpaces};
use spacejmp::{Access, AttachOptions, Error, Jmp, SegOptions};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Two VASes whose one segment each sits at the same base (`seg_clone`).
fn overlapping(jmp: &Jmp, size: u64) {
    jmp.seg_alloc("a", size, &SegOptions::default()).unwrap();
    jmp.seg_clone("a", "b").unwrap();
    for (v, s) in [("va", "a"), ("vb", "b")] {
        jmp.vas_create(v, 0o600).unwrap();
        jmp.seg_attach(v, s, Access::Write).unwrap();
    }
}

fn word(m: &mut Mover, i: usize) -> spacejmp::Result<&mut u64> {
    let d = m.data_mut(0)?;
    let w = &mut d[i * 8..i * 8 + 8];
    // SAFETY: an 8-aligned, 8-byte range of the segment's data area (the
    // data area starts on a page boundary).
    Ok(unsafe { &mut *(w.as_mut_ptr() as *mut u64) })
}

#[test]
fn overlapping_vases_keep_their_own_pages_and_page_tables() {
    let st = Store::new("pv-overlap", 40);
    let jmp = st.open();
    overlapping(&jmp, 1 << 20);
    let a = jmp.seg_find("a").unwrap();
    assert_eq!(a.base, jmp.seg_find("b").unwrap().base, "clones overlap");
    let mut rt = ProcSpaces::start(&jmp, &["va", "vb"], ProcOptions::default()).unwrap();
    let (rounds, late_faults) = rt
        .run(|m| {
            // First pass: write each VAS's identity into the same address.
            for v in 0..2 {
                m.switch(v)?;
                for i in 0..64 {
                    *word(m, i * 512)? = 1000 + v as u64;
                }
            }
            // Every later visit finds its own value and faults no more.
            let mut faults = 0u64;
            let mut rounds = 0u64;
            for r in 0..400 {
                let v = r % 2;
                m.switch(v)?;
                let f0 = m.faults();
                for i in 0..64 {
                    if *word(m, i * 512)? != 1000 + v as u64 {
                        return Ok((u64::MAX, 0));
                    }
                }
                faults += m.faults() - f0;
                rounds += 1;
            }
            Ok((rounds, faults))
        })
        .unwrap();
    assert_eq!(rounds, 400, "a VAS saw the other's data");
    assert_eq!(late_faults, 0, "pages faulted again after the first pass");
    assert!(rt.switches() >= 402, "switches counted: {}", rt.switches());
    drop(rt);
    // The data is in the segments: an in-process attach sees it.
    for (v, s, want) in [("va", "a", 1000u64), ("vb", "b", 1001)] {
        let h = jmp.vas_attach(v, AttachOptions::default()).unwrap();
        let x = h.switch().unwrap();
        let b = x.bytes(s).unwrap();
        assert_eq!(u64::from_ne_bytes(b[..8].try_into().unwrap()), want);
    }
}

#[test]
fn lane_locals_cross_switches_between_three_vases() {
    let st = Store::new("pv-locals", 41);
    let jmp = st.open();
    overlapping(&jmp, 1 << 20);
    jmp.seg_clone("a", "c").unwrap();
    jmp.vas_create("vc", 0o600).unwrap();
    jmp.seg_attach("vc", "c", Access::Write).unwrap();
    let mut rt = ProcSpaces::start(&jmp, &["va", "vb", "vc"], ProcOptions::default()).unwrap();
    let out = rt
        .run(|m| {
            let mut visits = [0u64; 3];
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..900 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let v = (x % 3) as usize;
                m.switch(v)?;
                assert_eq!(m.current(), Some(v));
                *word(m, 0)? += 1;
                visits[v] += 1;
            }
            let mut stored = [0u64; 3];
            for (v, s) in stored.iter_mut().enumerate() {
                m.switch(v)?;
                *s = *word(m, 0)?;
            }
            m.home()?;
            assert_eq!(m.current(), None);
            Ok((visits, stored))
        })
        .unwrap();
    assert_eq!(out.0, out.1, "each VAS counted exactly the lane's visits");
    assert_eq!(out.0.iter().sum::<u64>(), 900);
}

#[test]
fn errors_and_panics_in_a_vas_come_home_and_the_runtime_goes_on() {
    let st = Store::new("pv-errors", 42);
    let jmp = st.open();
    overlapping(&jmp, 1 << 20);
    let mut rt = ProcSpaces::start(&jmp, &["va", "vb"], ProcOptions::default()).unwrap();
    let e = rt
        .run(|m| {
            m.switch(1)?;
            m.data(3)?;
            Ok(())
        })
        .unwrap_err();
    match &e {
        Error::InVas { vas, detail } => {
            assert_eq!(vas, "vb");
            assert!(detail.contains("has 1 segments"), "{detail}");
        }
        e => panic!("unexpected {e:?}"),
    }
    let e = rt
        .run(|m| {
            m.switch(0)?;
            if m.current() == Some(0) {
                panic!("boom");
            }
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(&e, Error::InVas { detail, .. } if detail.contains("boom") && detail.contains("va")),
        "{e}"
    );
    assert!(matches!(
        rt.run(|m| m.switch(7)).unwrap_err(),
        Error::InVas { .. }
    ));
    let v = rt
        .run(|m| {
            m.switch(0)?;
            let x = *word(m, 0)?;
            m.switch(1)?;
            Ok(x + 1)
        })
        .unwrap();
    assert_eq!(v, 1, "the runtime still works after errors and a panic");
}

#[test]
fn a_dead_vas_fails_the_switch_and_a_death_inside_loses_the_lane() {
    let st = Store::new("pv-dead", 43);
    let jmp = st.open();
    overlapping(&jmp, 1 << 20);
    let mut rt = ProcSpaces::start(&jmp, &["va", "vb"], ProcOptions::default()).unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(rt.pids()[1], libc::SIGKILL) };
    let (died, back) = rt
        .run(|m| {
            m.switch(0)?;
            let died = matches!(m.switch(1), Err(Error::VasProcess { .. }));
            // The lane stayed where it was and goes on.
            let back = m.current() == Some(0) && *word(m, 0)? == 0;
            // A second try fails at once.
            let again = matches!(m.switch(1), Err(Error::VasProcess { .. }));
            Ok((died && again, back))
        })
        .unwrap();
    assert!(died, "switching into a killed VAS process is an error");
    assert!(back, "the lane continues in the VAS it came from");
    let t = Instant::now();
    let e = rt
        .run(|m| {
            m.switch(0)?;
            // SAFETY: the lane kills the VAS process it runs in.
            unsafe { libc::raise(libc::SIGKILL) };
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(&e, Error::Lane(d) if d.contains("va")), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "death noticed promptly"
    );
    assert!(matches!(rt.run(|_| Ok(())), Err(Error::Lane(_))));
}

#[test]
fn segment_locks_hold_across_processes_while_the_lane_is_inside() {
    let st = Store::new("pv-locks", 44);
    let jmp = st.open();
    let opts = SegOptions {
        lockable: true,
        ..Default::default()
    };
    jmp.seg_alloc("l", 1 << 20, &opts).unwrap();
    for v in ["vl", "vl2"] {
        jmp.vas_create(v, 0o600).unwrap();
        jmp.seg_attach(v, "l", Access::Write).unwrap();
    }
    // A flag shared with the VAS processes (mapped before the fork).
    let common = CommonMem::new(8).unwrap();
    let flag = common.addr();
    let mut rt = ProcSpaces::start(&jmp, &["vl"], ProcOptions::default()).unwrap();
    std::thread::scope(|s| {
        let jmp = &jmp;
        s.spawn(move || {
            // SAFETY: the common memory outlives the scope; 8-aligned.
            let f = unsafe { &*(flag as *const AtomicU32) };
            while f.load(Ordering::Acquire) != 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let h = jmp.vas_attach("vl2", AttachOptions::default()).unwrap();
            let r = h.switch_until(Some(Instant::now() + Duration::from_millis(100)));
            let timed_out = matches!(r, Err(Error::Timeout { .. }));
            drop(r);
            f.store(if timed_out { 2 } else { 3 }, Ordering::Release);
        });
        let verdict = rt
            .run(move |m| {
                m.switch(0)?;
                // SAFETY: as above; mapped in every process of the runtime.
                let f = unsafe { &*(flag as *const AtomicU32) };
                f.store(1, Ordering::Release);
                while f.load(Ordering::Acquire) == 1 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(f.load(Ordering::Acquire))
            })
            .unwrap();
        assert_eq!(verdict, 2, "another process took the lock the lane held");
    });
    // The lane left: the lock is free again.
    let h = jmp.vas_attach("vl2", AttachOptions::default()).unwrap();
    assert!(h
        .switch_until(Some(Instant::now() + Duration::from_millis(500)))
        .is_ok());
}

#[test]
fn a_segment_common_to_two_vases_carries_heap_data_across_switches() {
    let st = Store::new("pv-common", 45);
    let jmp = st.open();
    overlapping(&jmp, 1 << 20);
    jmp.seg_alloc("common", 1 << 20, &SegOptions::default())
        .unwrap();
    for v in ["va", "vb"] {
        jmp.seg_attach(v, "common", Access::Write).unwrap();
    }
    let mut rt = ProcSpaces::start(&jmp, &["va", "vb"], ProcOptions::default()).unwrap();
    let got = rt
        .run(|m| {
            m.switch(0)?;
            m.with_active(|a| {
                let p = a.alloc("common", 0xfeed_u64)?;
                a.set_root("common", p)
            })??;
            m.switch(1)?;
            let v = m.with_active(|a| -> spacejmp::Result<u64> {
                Ok(*a.root::<u64>("common")?.get(a)?)
            })??;
            m.home()?;
            let refused = m.with_active(|_| ()).is_err();
            Ok((v, refused))
        })
        .unwrap();
    assert_eq!(got, (0xfeed, true));
}

#[test]
fn two_lanes_move_at_once_through_one_process_per_vas() {
    let st = Store::new("pv-lanes", 46);
    let jmp = st.open();
    overlapping(&jmp, 1 << 20);
    let opts = ProcOptions {
        lanes: 2,
        ..ProcOptions::default()
    };
    let rt = ProcSpaces::start(&jmp, &["va", "vb"], opts).unwrap();
    assert_eq!(rt.lanes(), 2);
    let body = |m: &mut Mover| {
        let mut pids = [0i32; 2];
        for r in 0..300 {
            let v = r % 2;
            m.switch(v)?;
            // SAFETY: getpid has no preconditions.
            pids[v] = unsafe { libc::getpid() };
            // Each lane counts in its own word of the segment.
            // SAFETY: sched_getcpu has no preconditions.
            let slot = 1 + (unsafe { libc::sched_getcpu() } as usize % 2);
            *word(m, slot * 8)? += 1;
        }
        m.home()?;
        Ok(pids)
    };
    let (a, b) = std::thread::scope(|s| {
        let rt = &rt;
        let h0 = s.spawn(move || rt.run_lane(0, body));
        let h1 = s.spawn(move || rt.run_lane(1, body));
        (h0.join().unwrap().unwrap(), h1.join().unwrap().unwrap())
    });
    // Both lanes ran in the same process of each VAS: one page table per
    // VAS, whichever lane is in it.
    assert_eq!(a, b);
    assert_eq!(a.to_vec(), rt.pids().to_vec());
    assert!(rt.switches() >= 600, "switches: {}", rt.switches());
    assert!(matches!(
        rt.run_lane(2, |_| Ok(())),
        Err(Error::InvalidArgument(_))
    ));
}
