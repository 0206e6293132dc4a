//! Every error path of the issue: window taken, name exists, base collides,
//! tmpfs full, header mismatch, permission denied; plus overlapping VASes in
//! one process (the remap path) and the type-level safety checks.

mod common;

use common::Store;
use spacejmp::{Access, Error, Jmp, SegOptions, SegPtr, Window};
use std::sync::mpsc;

#[test]
fn window_taken_is_reported_not_clobbered() {
    let st = Store::new("wtaken", 10);
    // Something else already lives inside the window.
    let probe = st.window.0 + (1 << 30);
    // SAFETY (test): an anonymous mapping at an address nothing uses.
    let p = unsafe {
        libc::mmap(
            probe as *mut libc::c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(p as u64, probe);
    // SAFETY (test): `p` is the start of the 4 KiB read-write mapping made
    // above, aligned for u64.
    unsafe { *(p as *mut u64) = 77 };
    let e = Jmp::open(st.config()).err().expect("must fail");
    assert!(matches!(e, Error::WindowTaken { .. }), "{e}");
    assert!(e.to_string().contains("SPACEJMP_WINDOW"));
    // The existing mapping is intact.
    // SAFETY (test): the failed `Jmp::open` must not have unmapped it
    // (that is what this test checks); the address is aligned.
    assert_eq!(unsafe { *(p as *const u64) }, 77);
    // SAFETY (test): `p`/4096 is exactly the mapping made above, and no
    // reference into it remains.
    unsafe { libc::munmap(p, 4096) };
    // Two contexts over one window collide too.
    let a = st.open();
    let e = Jmp::open(st.config()).err().expect("second context");
    assert!(matches!(e, Error::WindowTaken { .. }));
    drop(a);
    assert!(matches!(
        Window::reserve(1, 4096),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn name_and_base_errors() {
    let st = Store::new("names", 11);
    let jmp = st.open();
    let a = jmp.seg_alloc("a", 1 << 20, &SegOptions::default()).unwrap();
    assert!(matches!(
        jmp.seg_alloc("a", 1 << 20, &SegOptions::default()),
        Err(Error::NameExists { .. })
    ));
    let opts = SegOptions {
        base: Some(a.base + 4096),
        ..SegOptions::default()
    };
    assert!(matches!(
        jmp.seg_alloc("b", 1 << 20, &opts),
        Err(Error::AddressInUse { .. })
    ));
    let opts = SegOptions {
        base: Some(0x10_0000),
        ..SegOptions::default()
    };
    assert!(matches!(
        jmp.seg_alloc("c", 1 << 20, &opts),
        Err(Error::OutOfWindow { .. })
    ));
    for bad in ["", "a/b", ".hidden", &"x".repeat(64)] {
        assert!(matches!(
            jmp.seg_alloc(bad, 4096, &SegOptions::default()),
            Err(Error::InvalidName(_))
        ));
    }
    assert!(matches!(jmp.seg_find("nope"), Err(Error::NotFound { .. })));
    assert!(matches!(
        jmp.vas_attach("nope", Default::default()),
        Err(Error::NotFound { .. })
    ));
    jmp.vas_create("v", 0o660).unwrap();
    assert!(matches!(
        jmp.vas_create("v", 0o660),
        Err(Error::NameExists { .. })
    ));
    // An overlapping segment may exist, but not in the same VAS.
    let opts = SegOptions {
        base: Some(a.base),
        allow_overlap: true,
        ..SegOptions::default()
    };
    jmp.seg_alloc("a2", 1 << 20, &opts).unwrap();
    jmp.seg_attach("v", "a", Access::Write).unwrap();
    assert!(matches!(
        jmp.seg_attach("v", "a2", Access::Write),
        Err(Error::AddressInUse { .. })
    ));
    // Auto bases never overlap and stay in the window.
    let b = jmp.seg_alloc("b", 3 << 20, &SegOptions::default()).unwrap();
    assert!(!b.overlaps(a.base, a.size));
    assert!(jmp.window().contains(b.base, b.size));
    jmp.seg_remove("a2").unwrap();
    assert!(matches!(jmp.seg_remove("a2"), Err(Error::NotFound { .. })));
}

#[test]
fn tmpfs_full_is_an_error_at_creation() {
    let st = Store::new("full", 12);
    let jmp = st.open();
    // SAFETY (test): statvfs into a zeroed struct.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    let c = std::ffi::CString::new(st.dir.to_str().unwrap()).unwrap();
    // SAFETY (test): valid path and out-pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
    let total = sv.f_blocks as u64 * sv.f_frsize as u64;
    let size = (total + (1 << 30)).next_power_of_two();
    let e = jmp
        .seg_alloc("huge", size, &SegOptions::default())
        .expect_err("must not fit");
    assert!(matches!(e, Error::NoSpace { .. }), "{e}");
    // Nothing half-created is left behind.
    assert!(matches!(jmp.seg_find("huge"), Err(Error::NotFound { .. })));
    assert!(!st.dir.join("seg.huge").exists());
}

#[test]
fn header_mismatch_and_permission() {
    let st = Store::new("hdr", 13);
    let jmp = st.open();
    jmp.seg_alloc("s", 1 << 20, &SegOptions::default()).unwrap();
    jmp.seg_alloc("t", 1 << 20, &SegOptions::default()).unwrap();
    jmp.vas_create("v", 0o660).unwrap();
    jmp.seg_attach("v", "s", Access::Write).unwrap();
    jmp.vas_create("vt", 0o660).unwrap();
    jmp.seg_attach("vt", "t", Access::Write).unwrap();
    // Read-only mode in the header: write attach refused, read allowed.
    jmp.seg_set_mode("s", 0o440).unwrap();
    assert!(matches!(
        jmp.vas_attach("v", Default::default()),
        Err(Error::PermissionDenied { .. })
    ));
    jmp.vas_create("vr", 0o660).unwrap();
    jmp.seg_attach("vr", "s", Access::Read).unwrap();
    {
        let vh = jmp.vas_attach("vr", Default::default()).unwrap();
        let mut a = vh.switch().unwrap();
        // Writing through a read-only attach is refused by the types.
        assert!(matches!(
            a.bytes_mut("s"),
            Err(Error::PermissionDenied { .. })
        ));
        assert!(matches!(
            a.alloc("s", 1u64),
            Err(Error::PermissionDenied { .. })
        ));
    }
    // Corrupt t's magic: attach refuses it.
    let p = st.dir.join("seg.t");
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&p, &bytes).unwrap();
    let e = jmp
        .vas_attach("vt", Default::default())
        .err()
        .expect("mismatch");
    assert!(matches!(e, Error::HeaderMismatch { .. }), "{e}");
}

#[test]
fn overlapping_vases_switch_by_remapping() {
    let st = Store::new("overlap", 14);
    let jmp = st.open();
    jmp.seg_alloc("s", 1 << 20, &SegOptions::default()).unwrap();
    jmp.vas_create("a", 0o660).unwrap();
    jmp.seg_attach("a", "s", Access::Write).unwrap();
    let ha = jmp.vas_attach("a", Default::default()).unwrap();
    {
        let mut x = ha.switch().unwrap();
        x.bytes_mut("s").unwrap()[0] = 1;
    }
    // A clone sits at the same base: VAS b overlaps VAS a.
    jmp.seg_clone("s", "s2").unwrap();
    jmp.vas_create("b", 0o660).unwrap();
    jmp.seg_attach("b", "s2", Access::Write).unwrap();
    let hb = jmp.vas_attach("b", Default::default()).unwrap();
    let before = jmp.stats().snapshot();
    {
        let mut y = hb.switch().unwrap();
        assert_eq!(y.bytes("s2").unwrap()[0], 1);
        y.bytes_mut("s2").unwrap()[0] = 2;
    }
    {
        let x = ha.switch().unwrap();
        assert_eq!(x.bytes("s").unwrap()[0], 1);
        // Nested switch on one thread is refused.
        assert!(matches!(hb.switch(), Err(Error::AlreadyActive { .. })));
        let y = x.switch_to(&hb).unwrap();
        assert_eq!(y.bytes("s2").unwrap()[0], 2);
    }
    let after = jmp.stats().snapshot();
    assert_eq!(after.remaps - before.remaps, 3);
    assert_eq!(after.switches - before.switches, 3);
    // While another thread is inside a, switching this thread into b is a
    // process-wide remap of a's range: refused.
    let (tx, rx) = mpsc::channel();
    let (tx2, rx2) = mpsc::channel::<()>();
    let ha_ref = &ha;
    std::thread::scope(|sc| {
        sc.spawn(move || {
            let _x = ha_ref.switch().unwrap();
            tx.send(()).unwrap();
            rx2.recv().unwrap();
        });
        rx.recv().unwrap();
        let e = hb.switch().err().expect("busy");
        assert!(matches!(e, Error::Busy { .. }), "{e}");
        assert!(e.to_string().contains("process-wide remap"));
        tx2.send(()).unwrap();
    });
    let y = hb.switch().unwrap();
    assert_eq!(y.bytes("s2").unwrap()[0], 2);
}

#[test]
fn disjoint_switch_keeps_mappings_and_pointers_are_checked() {
    let st = Store::new("disjoint", 15);
    let jmp = st.open();
    jmp.seg_alloc("p", 1 << 20, &SegOptions::default()).unwrap();
    jmp.seg_alloc("q", 1 << 20, &SegOptions::default()).unwrap();
    for (v, s) in [("vp", "p"), ("vq", "q")] {
        jmp.vas_create(v, 0o660).unwrap();
        jmp.seg_attach(v, s, Access::Write).unwrap();
    }
    let hp = jmp.vas_attach("vp", Default::default()).unwrap();
    let hq = jmp.vas_attach("vq", Default::default()).unwrap();
    let ptr: SegPtr<u64>;
    {
        let mut a = hp.switch().unwrap();
        ptr = a.alloc("p", 5u64).unwrap();
        assert_eq!(*ptr.get(&a).unwrap(), 5);
        *ptr.get_mut(&mut a).unwrap() = 6;
        assert_eq!(*a.vcast(ptr.addr() as *const u64).unwrap(), 6);
        a.free(ptr).unwrap();
        assert!(matches!(a.free(ptr), Err(Error::BadPointer { .. })));
    }
    {
        // A pointer into p is not valid in vq: the paper's rule, checked.
        let b = hq.switch().unwrap();
        assert!(matches!(ptr.get(&b), Err(Error::BadPointer { .. })));
        assert!(matches!(
            b.vcast(&7u64 as *const u64),
            Err(Error::BadPointer { .. })
        ));
    }
    assert_eq!(jmp.stats().snapshot().remaps, 0);
}
