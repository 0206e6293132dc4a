//! `gups`: SpaceJMP §5.2, random updates over a table split into windows
//! (MAP, MP, VAS-overlap, VAS-disjoint).

use super::*;

const GUPS_BENCH: &str = "jmp-gups";

/// One GUPS cell's rows: its parameters and the median/min/max rate.
pub(super) fn gups_row(system: &str, w: u64, opts: &Options, mups: Vec<f64>, note: &str) -> Row {
    let (win, batch, updates) = gups_sizes(opts);
    let mut figures = vec![
        fig("windows", w as f64, 0),
        fig("window_mib", win as f64 / (1 << 20) as f64, 2),
        fig("batch", batch as f64, 0),
        fig("updates", updates as f64, 0),
    ];
    figs3(
        &mut figures,
        ["mups", "mups_min", "mups_max"],
        stat(mups),
        2,
    );
    if system == "MP" {
        figures.push(fig("processes", (w + 1) as f64, 0));
    }
    Row {
        bench: GUPS_BENCH,
        system: system.into(),
        labels: Vec::new(),
        figures,
        note: note.into(),
    }
}

/// `batch` random updates into `t64`.
pub(super) fn update_batch(t64: &mut [u64], rng: &mut Rng, batch: u64) {
    let words = t64.len();
    for _ in 0..batch {
        let r = rng.next();
        t64[(r as usize) % words] ^= r;
    }
}

/// Window bytes, batch and updates of a GUPS run, within sane bounds.
pub(super) fn gups_sizes(opts: &Options) -> (u64, u64, u64) {
    let batch = opts.gups_batch.clamp(1, RING / 2);
    (
        opts.gups_window_bytes.max(1 << 16),
        batch,
        opts.gups_updates.max(batch),
    )
}

pub(super) fn bench_gups(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink) -> Res<()> {
    let (win, batch, updates) = gups_sizes(opts);
    let wbase = jmp.window().base() + (jmp.window().len() / 2);
    sink.note(
        GUPS_BENCH,
        "SpaceJMP §5.2: million updates/s; one random window per batch. VAS-overlap \
         switches by a process-wide remap on Linux; MP shares the machine's cores",
    );
    for &w in &opts.gups_windows {
        let mut ov = Vec::new();
        let mut dj = Vec::new();
        for i in 0..w {
            // Overlapping windows: all at one base (the paper's setting).
            let o = format!("g{w}-o{i}");
            seg(jmp, &o, win, false, Some(wbase), true)?;
            vas(jmp, &format!("gv{w}-o{i}"), &[&o])?;
            let d = format!("g{w}-d{i}");
            seg(jmp, &d, win, false, None, false)?;
            vas(jmp, &format!("gv{w}-d{i}"), &[&d])?;
            ov.push(o);
            dj.push(d);
        }
        for (label, names, tag, note) in [
            (
                "VAS-overlap",
                &ov,
                "o",
                "one base for all windows; switch = process-wide remap on Linux",
            ),
            (
                "VAS-disjoint",
                &dj,
                "d",
                "windows at distinct bases; switch changes no mapping",
            ),
        ] {
            let hs: Vec<_> = (0..w)
                .map(|i| jmp.vas_attach(&format!("gv{w}-{tag}{i}"), AttachOptions::default()))
                .collect::<Result<_, _>>()?;
            // Warm up: fault every page of every window once (the paper's
            // table is resident).
            for (h, n) in hs.iter().zip(names.iter()) {
                let mut a = h.switch()?;
                for b in a.bytes_mut(n)?.iter_mut().step_by(4096) {
                    *b = 0;
                }
            }
            let mut mups = Vec::new();
            for _ in 0..opts.repeat {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
                let t = Instant::now();
                let mut done = 0;
                while done < updates {
                    let i = (rng.next() % w) as usize;
                    let mut a = hs[i].switch()?;
                    let b = a.bytes_mut(&names[i])?;
                    let words = b.len().min(win as usize) / 8;
                    // SAFETY: the data area is at least `words * 8` bytes
                    // and 8-aligned (it starts one page after the base);
                    // the slice does not outlive the guard `a`.
                    let t64 = unsafe {
                        std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut u64, words)
                    };
                    update_batch(t64, &mut rng, batch);
                    done += batch;
                }
                mups.push(updates as f64 / t.elapsed().as_secs_f64() / 1e6);
            }
            sink.row(gups_row(label, w, opts, mups, note));
        }
        let ov_vases: Vec<String> = (0..w).map(|i| format!("gv{w}-o{i}")).collect();
        super::lane::gups_process(jmp, opts, sink, w, &ov_vases)?;
        gups_map(jmp, opts, sink, w, &ov)?;
        gups_mp(jmp, opts, sink, w, &dj)?;
        for i in 0..w {
            jmp.vas_remove(&format!("gv{w}-o{i}"))?;
            jmp.vas_remove(&format!("gv{w}-d{i}"))?;
            jmp.seg_remove(&ov[i as usize])?;
            jmp.seg_remove(&dj[i as usize])?;
        }
    }
    Ok(())
}

/// MAP: remap the window's file at one fixed address per batch.
fn gups_map(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink, w: u64, windows: &[String]) -> Res<()> {
    let (win, batch, updates) = gups_sizes(opts);
    let files: Vec<std::fs::File> = windows
        .iter()
        .map(|n| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(jmp.registry().dir().join(format!("seg.{n}")))
        })
        .collect::<Result<_, _>>()?;
    let hdr = jmp.registry().page_size();
    // SAFETY: a private reservation for the MAP variant, replaced with
    // MAP_FIXED below only within itself, unmapped at the end.
    let region = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            win as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if region == libc::MAP_FAILED {
        return Err("cannot reserve the MAP region".into());
    }
    let words = (win / 8) as usize;
    let mut mups = Vec::new();
    let mut res: Res<()> = Ok(());
    'runs: for _ in 0..opts.repeat {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let t = Instant::now();
        let mut done = 0;
        while done < updates {
            let i = (rng.next() % w) as usize;
            // SAFETY: MAP_FIXED over our own reservation `region`, `win`
            // bytes of the window file after its header page.
            let p = unsafe {
                libc::mmap(
                    region,
                    win as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    files[i].as_raw_fd(),
                    hdr as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                res = Err("mmap of a GUPS window failed".into());
                break 'runs;
            }
            // SAFETY: `p` maps `win` bytes read-write until the next remap,
            // and the slice is dropped before it.
            let t64 = unsafe { std::slice::from_raw_parts_mut(p as *mut u64, words) };
            update_batch(t64, &mut rng, batch);
            done += batch;
        }
        mups.push(updates as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    // SAFETY: our reservation (possibly remapped over), no longer used.
    unsafe { libc::munmap(region, win as usize) };
    res?;
    sink.row(gups_row(
        "MAP",
        w,
        opts,
        mups,
        "mmap MAP_FIXED of the window file per batch",
    ));
    Ok(())
}

/// Ring of update values in a shared segment (SPSC): head, tail and done
/// words on their own cache lines, then `RING` slots.
const RING: u64 = 1 << 16;

struct Ring {
    base: u64,
}

impl Ring {
    fn word(&self, i: u64) -> &AtomicU64 {
        // SAFETY: the ring segment's data area is mapped (both processes
        // keep their VAS attached while they use the ring) and 64-aligned;
        // the words at byte offsets 0, 64 and 128 are the head, tail and
        // done counters, accessed only atomically.
        unsafe { &*((self.base + i * 64) as *const AtomicU64) }
    }
    fn head(&self) -> &AtomicU64 {
        self.word(0)
    }
    fn tail(&self) -> &AtomicU64 {
        self.word(1)
    }
    fn done(&self) -> &AtomicU64 {
        self.word(2)
    }
    fn slot(&self, k: u64) -> *mut u64 {
        (self.base + 256 + (k % RING) * 8) as *mut u64
    }
}

/// MP: one process per window; the driver sends update values over a
/// shared-memory ring per process.
fn gups_mp(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink, w: u64, windows: &[String]) -> Res<()> {
    let (_, batch, updates) = gups_sizes(opts);
    let mut rings = Vec::new();
    let mut handles = Vec::new();
    for i in 0..w {
        let r = format!("gr{w}-{i}");
        seg(jmp, &r, 256 + RING * 8, false, None, false)?;
        let v = format!("gm{w}-{i}");
        vas(jmp, &v, &[&windows[i as usize], &r])?;
        let h = jmp.vas_attach(&v, AttachOptions::default())?;
        let base = h
            .segments()
            .find(|(s, _)| s.name == r)
            .map(|(s, _)| s.data_start())
            .ok_or("ring segment missing from its VAS")?;
        rings.push(Ring { base });
        handles.push(h);
    }
    let store = jmp.registry().dir().display().to_string();
    let mut mups = Vec::new();
    for _ in 0..opts.repeat {
        for r in &rings {
            r.head().store(0, Ordering::Relaxed);
            r.tail().store(0, Ordering::Relaxed);
            r.done().store(0, Ordering::Release);
        }
        let mut kids = Vec::new();
        for i in 0..w {
            let mut c = child_command(opts)
                .args([
                    &format!("gups-mp:{w}:{}", windows[i as usize]),
                    &store,
                    &i.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()?;
            let mut rd = BufReader::new(c.stdout.take().ok_or("child stdout")?);
            let mut line = String::new();
            rd.read_line(&mut line)?;
            if line.trim() != "ready" {
                let _ = c.kill();
                let _ = c.wait();
                return Err(format!("gups child: {line:?}").into());
            }
            kids.push(c);
        }
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let t = Instant::now();
        let mut done = 0;
        while done < updates {
            let r = &rings[(rng.next() % w) as usize];
            let head = r.head().load(Ordering::Relaxed);
            while head + batch - r.tail().load(Ordering::Acquire) > RING {
                std::thread::yield_now();
            }
            for k in 0..batch {
                // SAFETY: slot `head + k` is free (the consumer's tail is at
                // most RING - batch behind) and written only by this producer.
                unsafe { *r.slot(head + k) = rng.next() };
            }
            r.head().store(head + batch, Ordering::Release);
            done += batch;
        }
        for r in &rings {
            while r.tail().load(Ordering::Acquire) != r.head().load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
        }
        mups.push(updates as f64 / t.elapsed().as_secs_f64() / 1e6);
        for r in &rings {
            r.done().store(1, Ordering::Release);
        }
        for mut c in kids {
            c.wait()?;
        }
    }
    drop(handles);
    sink.row(gups_row(
        "MP",
        w,
        opts,
        mups,
        "one process per window, updates over a shared-memory ring",
    ));
    for i in 0..w {
        jmp.vas_remove(&format!("gm{w}-{i}"))?;
        jmp.seg_remove(&format!("gr{w}-{i}"))?;
    }
    Ok(())
}

pub(super) fn gups_mp_child(w: &str, window: &str, store: &str, i: u64) -> Res<()> {
    let jmp = Jmp::open(Config::with_store(store))?;
    let vh = jmp.vas_attach(&format!("gm{w}-{i}"), AttachOptions::default())?;
    let mut a = vh.switch()?;
    let ring = Ring {
        base: a.bytes(&format!("gr{w}-{i}"))?.as_ptr() as u64,
    };
    let b = a.bytes_mut(window)?;
    let words = b.len() / 8;
    // SAFETY: the window's data area is 8-aligned and `words * 8` bytes,
    // and `a` lives until the process exits.
    let t64 = unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut u64, words) };
    for x in t64.iter_mut().step_by(512) {
        *x = 0;
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut tail = ring.tail().load(Ordering::Relaxed);
    let mut idle = 0u32;
    loop {
        let head = ring.head().load(Ordering::Acquire);
        if head != tail {
            for k in tail..head {
                // SAFETY: slots in [tail, head) were published by the
                // producer's Release store of head.
                let r = unsafe { *ring.slot(k) };
                t64[(r as usize) % words] ^= r;
            }
            tail = head;
            ring.tail().store(tail, Ordering::Release);
            idle = 0;
        } else if ring.done().load(Ordering::Acquire) != 0 {
            break;
        } else {
            idle += 1;
            if idle > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
    std::process::exit(0);
}
