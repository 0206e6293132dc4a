//! `switch`: VAS switch latency against `mmap` + touch + `munmap`.

use super::*;

const SWITCH_BENCH: &str = "jmp-switch";

pub(super) fn bench_switch(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink) -> Res<()> {
    let mib = 1u64 << 20;
    seg(jmp, "sw-p", mib, true, None, false)?;
    seg(jmp, "sw-q", mib, true, None, false)?;
    seg(jmp, "sw-pn", mib, false, None, false)?;
    seg(jmp, "sw-qn", mib, false, None, false)?;
    let r = jmp.seg_alloc("sw-r", mib, &SegOptions::default())?;
    jmp.seg_clone("sw-r", "sw-r2")?;
    for (v, s) in [
        ("sw-vp", "sw-p"),
        ("sw-vq", "sw-q"),
        ("sw-vpn", "sw-pn"),
        ("sw-vqn", "sw-qn"),
        ("sw-vr", "sw-r"),
        ("sw-vr2", "sw-r2"),
    ] {
        vas(jmp, v, &[s])?;
    }
    let iters = opts.switch_iters.max(100);
    sink.note(
        SWITCH_BENCH,
        "1 MiB segments; each switch touches one byte of the segment it enters; \
         overlap-remap is a process-wide mmap MAP_FIXED on Linux, not a CR3 write",
    );
    for (label, a, b, sa, sb, n, note) in [
        (
            "vas-disjoint+locks",
            "sw-vp",
            "sw-vq",
            "sw-p",
            "sw-q",
            iters,
            "no mapping change; exclusive segment locks",
        ),
        (
            "vas-disjoint",
            "sw-vpn",
            "sw-vqn",
            "sw-pn",
            "sw-qn",
            iters,
            "no mapping change; no lockable segments",
        ),
        (
            "vas-overlap-remap",
            "sw-vr",
            "sw-vr2",
            "sw-r",
            "sw-r2",
            iters / 100,
            "process-wide remap (mmap MAP_FIXED), not a CR3 write",
        ),
    ] {
        let ha = jmp.vas_attach(a, AttachOptions::default())?;
        let hb = jmp.vas_attach(b, AttachOptions::default())?;
        let before = jmp.stats().snapshot();
        let mut samples = Vec::new();
        for _ in 0..opts.repeat {
            let t = Instant::now();
            for _ in 0..n {
                let x = ha.switch()?;
                black_box(x.bytes(sa)?[0]);
                drop(x);
                let y = hb.switch()?;
                black_box(y.bytes(sb)?[0]);
                drop(y);
            }
            samples.push(t.elapsed().as_nanos() as f64 / (2 * n) as f64);
        }
        let after = jmp.stats().snapshot();
        let mut figures = vec![fig("seg_mib", 1.0, 0)];
        figs3(
            &mut figures,
            ["ns_per_switch", "ns_per_switch_min", "ns_per_switch_max"],
            stat(samples),
            1,
        );
        figures.push(fig(
            "remaps_per_switch",
            (after.remaps - before.remaps) as f64
                / (after.switches - before.switches).max(1) as f64,
            2,
        ));
        sink.row(Row {
            bench: SWITCH_BENCH,
            system: label.into(),
            labels: Vec::new(),
            figures,
            note: note.into(),
        });
    }
    // Baseline: mmap + touch + munmap of the same segment file.
    let path = jmp.registry().dir().join("seg.sw-r");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let n = iters / 100;
    let mut samples = Vec::new();
    for _ in 0..opts.repeat {
        let t = Instant::now();
        for _ in 0..2 * n {
            // SAFETY: a fresh shared mapping of our own file at a
            // kernel-chosen address, read once, unmapped right after.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    r.size as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                );
                if p == libc::MAP_FAILED {
                    return Err("mmap of the switch segment failed".into());
                }
                black_box(*(p as *const u8).add(r.header_size as usize));
                libc::munmap(p, r.size as usize);
            }
        }
        samples.push(t.elapsed().as_nanos() as f64 / (2 * n) as f64);
    }
    let mut figures = vec![fig("seg_mib", 1.0, 0)];
    figs3(
        &mut figures,
        ["ns_per_switch", "ns_per_switch_min", "ns_per_switch_max"],
        stat(samples),
        1,
    );
    figures.push(fig("remaps_per_switch", 1.0, 2));
    sink.row(Row {
        bench: SWITCH_BENCH,
        system: "mmap+munmap".into(),
        labels: Vec::new(),
        figures,
        note: "baseline: map, touch one byte, unmap".into(),
    });
    super::lane::bench_switch_sizes(jmp, opts, sink)?;
    for v in ["sw-vp", "sw-vq", "sw-vpn", "sw-vqn", "sw-vr", "sw-vr2"] {
        jmp.vas_remove(v)?;
    }
    for s in ["sw-p", "sw-q", "sw-pn", "sw-qn", "sw-r", "sw-r2"] {
        jmp.seg_remove(s)?;
    }
    Ok(())
}
