//! `jmpbench`: the SpaceJMP benchmarks of issue 5, to be wired into
//! `memlab jmp`.
//!
//! ```text
//! cargo run --release -p spacejmp --example jmpbench -- [--quick] [--json] [switch|attach|gups|persist]...
//! ```
//!
//! - `switch`: latency of `vas_switch` between two disjoint VASes (with and
//!   without lockable segments), between two overlapping VASes (on Linux a
//!   process-wide remap, labelled `remap`), and `mmap`+`munmap` of the same
//!   segment file. Each switch touches one byte of the target segment.
//! - `attach`: `vas_attach` of an existing 1 GiB segment, lazily and
//!   pre-faulted (`MAP_POPULATE`), 4 KiB pages (2 MiB pages when a
//!   hugetlbfs store is given in `SPACEJMP_HUGE_STORE` with pages reserved).
//! - `gups`: SpaceJMP §5.2. A table split into windows; each batch of
//!   updates goes to one random window. `MAP` remaps the window file at one
//!   fixed address per batch (`mmap MAP_FIXED`); `VAS-overlap` switches
//!   between VASes whose segments share one base (the paper's setting: more
//!   data than address space) — on Linux a remap; `VAS-disjoint` gives every
//!   window its own base, so a switch is only a lock hand-over.
//! - `persist`: SpaceJMP §5.4 (SAMTools). An index of string keys → u64 in a
//!   segment; a fresh process's time from spawn to first answered query,
//!   against rebuilding a `HashMap` from a serialized file and against an
//!   `mmap`ed file with offset pointers.
//!
//! Prints a table; with `--json`, one JSON object per row.

use spacejmp::{Access, AttachOptions, Config, Jmp, SegMap, SegOptions};
use std::collections::HashMap;
use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Row {
    bench: &'static str,
    system: String,
    params: String,
    figures: Vec<(&'static str, f64)>,
    note: &'static str,
}

struct Out {
    json: bool,
    rows: Vec<Row>,
}

impl Out {
    fn push(&mut self, r: Row) {
        if self.json {
            let mut s = format!(
                "{{\"bench\":\"jmp-{}\",\"system\":\"{}\",\"threads\":1,\"params\":\"{}\"",
                r.bench, r.system, r.params
            );
            for (k, v) in &r.figures {
                s += &format!(",\"{k}\":{v:.3}");
            }
            s += &format!(",\"note\":\"{}\"}}", r.note);
            println!("{s}");
        } else {
            let f: Vec<String> = r
                .figures
                .iter()
                .map(|(k, v)| format!("{k}={v:.1}"))
                .collect();
            println!(
                "{:<8} {:<22} {:<28} {:<60} {}",
                r.bench,
                r.system,
                r.params,
                f.join(" "),
                r.note
            );
        }
        self.rows.push(r);
    }
}

/// Median and (max-min) of repeated measurements.
fn med(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    (v[v.len() / 2], v[v.len() - 1] - v[0])
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn seg(
    jmp: &Jmp,
    name: &str,
    size: u64,
    lockable: bool,
    base: Option<u64>,
    overlap: bool,
) -> Res<()> {
    let opts = SegOptions {
        base,
        lockable,
        allow_overlap: overlap,
        ..SegOptions::default()
    };
    jmp.seg_alloc(name, size, &opts)?;
    Ok(())
}

fn vas(jmp: &Jmp, name: &str, segs: &[&str]) -> Res<()> {
    jmp.vas_create(name, 0o660)?;
    for s in segs {
        jmp.seg_attach(name, s, Access::Write)?;
    }
    Ok(())
}

fn bench_switch(jmp: &Jmp, out: &mut Out, quick: bool) -> Res<()> {
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
    let iters = if quick { 200_000 } else { 1_000_000 };
    let reps = 3;
    for (label, a, b, sa, sb, n, note) in [
        (
            "disjoint+locks",
            "sw-vp",
            "sw-vq",
            "sw-p",
            "sw-q",
            iters,
            "no mapping change; exclusive segment locks",
        ),
        (
            "disjoint",
            "sw-vpn",
            "sw-vqn",
            "sw-pn",
            "sw-qn",
            iters,
            "no mapping change; no lockable segments",
        ),
        (
            "overlap-remap",
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
        for _ in 0..reps {
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
        let (m, spread) = med(samples);
        out.push(Row {
            bench: "switch",
            system: format!("vas-{label}"),
            params: "seg=1MiB".into(),
            figures: vec![
                ("ns_per_switch", m),
                ("spread_ns", spread),
                (
                    "remaps_per_switch",
                    (after.remaps - before.remaps) as f64
                        / (after.switches - before.switches) as f64,
                ),
            ],
            note,
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
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..2 * n {
            // SAFETY: a fresh shared mapping of our own file at a
            // kernel-chosen address, unmapped right after one read.
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
                    return Err("mmap failed".into());
                }
                black_box(*(p as *const u8).add(r.header_size as usize));
                libc::munmap(p, r.size as usize);
            }
        }
        samples.push(t.elapsed().as_nanos() as f64 / (2 * n) as f64);
    }
    let (m, spread) = med(samples);
    out.push(Row {
        bench: "switch",
        system: "mmap+munmap".into(),
        params: "seg=1MiB".into(),
        figures: vec![
            ("ns_per_switch", m),
            ("spread_ns", spread),
            ("remaps_per_switch", 1.0),
        ],
        note: "baseline: map, touch one byte, unmap",
    });
    Ok(())
}

fn bench_attach(jmp: &Jmp, out: &mut Out, label: &str) -> Res<()> {
    let gib = 1u64 << 30;
    let t = Instant::now();
    seg(jmp, "at-big", gib, true, None, false)?;
    let create_ms = t.elapsed().as_secs_f64() * 1e3;
    vas(jmp, "at-v", &["at-big"])?;
    for prefault in [false, true] {
        let mut samples = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let h = jmp.vas_attach("at-v", AttachOptions { prefault })?;
            let a = h.switch()?;
            black_box(a.bytes("at-big")?[0]);
            samples.push(t.elapsed().as_secs_f64() * 1e6);
            drop(a);
            drop(h);
        }
        let (m, spread) = med(samples);
        out.push(Row {
            bench: "attach",
            system: format!("vas_attach{}", if prefault { "+populate" } else { "" }),
            params: format!("1GiB pages={label}"),
            figures: vec![
                ("attach_us", m),
                ("spread_us", spread),
                ("create_ms", create_ms),
            ],
            note: "existing segment: open, validate header, mmap, switch, touch 1 byte",
        });
    }
    jmp.vas_remove("at-v")?;
    jmp.seg_remove("at-big")?;
    Ok(())
}

fn bench_gups(jmp: &Jmp, out: &mut Out, quick: bool) -> Res<()> {
    let win = if quick { 16u64 << 20 } else { 64 << 20 };
    let batch = 4096u64;
    let updates = if quick { 1u64 << 21 } else { 1 << 23 };
    let windows: &[u64] = if quick { &[1, 2, 4] } else { &[1, 2, 4, 8, 16] };
    let wbase = jmp.window().base() + (jmp.window().len() / 2);
    for &w in windows {
        // Overlapping windows: all at one base (the paper's setting).
        let mut ov = Vec::new();
        let mut dj = Vec::new();
        for i in 0..w {
            let o = format!("g{w}-o{i}");
            seg(jmp, &o, win, false, Some(wbase), true)?;
            vas(jmp, &format!("gv{w}-o{i}"), &[&o])?;
            let d = format!("g{w}-d{i}");
            seg(jmp, &d, win, false, None, false)?;
            vas(jmp, &format!("gv{w}-d{i}"), &[&d])?;
            ov.push(o);
            dj.push(d);
        }
        for (label, names, note) in [
            ("VAS-overlap", &ov, "switch = process-wide remap on Linux"),
            (
                "VAS-disjoint",
                &dj,
                "windows at distinct bases; switch changes no mapping",
            ),
        ] {
            let hs: Vec<_> = (0..w)
                .map(|i| {
                    let v = if label == "VAS-overlap" {
                        format!("gv{w}-o{i}")
                    } else {
                        format!("gv{w}-d{i}")
                    };
                    jmp.vas_attach(&v, AttachOptions::default())
                })
                .collect::<Result<_, _>>()?;
            // Warm up: fault every page of every window once (the paper's
            // table is resident).
            for (h, n) in hs.iter().zip(names.iter()) {
                let mut a = h.switch()?;
                for b in a.bytes_mut(n)?.iter_mut().step_by(4096) {
                    *b = 0;
                }
            }
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            let words = (win / 8) as usize;
            let t = Instant::now();
            let mut done = 0;
            while done < updates {
                let i = (rng.next() % w) as usize;
                let mut a = hs[i].switch()?;
                let b = a.bytes_mut(&names[i])?;
                // SAFETY: the data area is at least `win` bytes and
                // 8-aligned (it starts one page after the base).
                let t64 =
                    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut u64, words) };
                for _ in 0..batch {
                    let r = rng.next();
                    t64[(r as usize) % words] ^= r;
                }
                done += batch;
            }
            let mups = updates as f64 / t.elapsed().as_secs_f64() / 1e6;
            out.push(Row {
                bench: "gups",
                system: label.into(),
                params: format!("windows={w} win={}MiB batch={batch}", win >> 20),
                figures: vec![("mups", mups), ("windows", w as f64)],
                note,
            });
        }
        // MAP: remap the window's file at one fixed address per batch.
        let files: Vec<std::fs::File> = ov
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
            return Err("mmap region".into());
        }
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let words = (win / 8) as usize;
        let t = Instant::now();
        let mut done = 0;
        while done < updates {
            let i = (rng.next() % w) as usize;
            // SAFETY: MAP_FIXED over our own reservation `region`.
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
                return Err("mmap window".into());
            }
            // SAFETY: `p` maps `win` bytes read-write.
            let t64 = unsafe { std::slice::from_raw_parts_mut(p as *mut u64, words) };
            for _ in 0..batch {
                let r = rng.next();
                t64[(r as usize) % words] ^= r;
            }
            done += batch;
        }
        let mups = updates as f64 / t.elapsed().as_secs_f64() / 1e6;
        // SAFETY: our reservation.
        unsafe { libc::munmap(region, win as usize) };
        out.push(Row {
            bench: "gups",
            system: "MAP".into(),
            params: format!("windows={w} win={}MiB batch={batch}", win >> 20),
            figures: vec![("mups", mups), ("windows", w as f64)],
            note: "mmap MAP_FIXED of the window file per batch",
        });
        gups_mp(jmp, out, w, win, batch, updates, &dj)?;
        for i in 0..w {
            jmp.vas_remove(&format!("gv{w}-o{i}"))?;
            jmp.vas_remove(&format!("gv{w}-d{i}"))?;
            jmp.seg_remove(&ov[i as usize])?;
            jmp.seg_remove(&dj[i as usize])?;
        }
    }
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
        // keep their VAS attached) and 64-aligned; words 0, 8, 16 (x8 bytes)
        // are the head, tail and done counters, accessed only atomically.
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
fn gups_mp(
    jmp: &Jmp,
    out: &mut Out,
    w: u64,
    win: u64,
    batch: u64,
    updates: u64,
    windows: &[String],
) -> Res<()> {
    let mut kids = Vec::new();
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
            .ok_or("ring")?;
        rings.push(Ring { base });
        handles.push(h);
    }
    let store = jmp.registry().dir().display().to_string();
    for i in 0..w {
        let mut c = Command::new(std::env::current_exe()?)
            .args([
                "--child",
                &format!("gups-mp:{w}:{}", windows[i as usize]),
                &store,
                &i.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut rd = BufReader::new(c.stdout.take().ok_or("stdout")?);
        let mut line = String::new();
        rd.read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(format!("gups child: {line}").into());
        }
        kids.push((c, rd));
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
            // SAFETY: slot `head + k` is free (the consumer's tail is at most
            // RING - batch behind) and written only by this producer.
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
    let mups = updates as f64 / t.elapsed().as_secs_f64() / 1e6;
    for r in &rings {
        r.done().store(1, Ordering::Release);
    }
    for (mut c, _) in kids {
        c.wait()?;
    }
    drop(handles);
    out.push(Row {
        bench: "gups",
        system: "MP".into(),
        params: format!("windows={w} win={}MiB batch={batch}", win >> 20),
        figures: vec![("mups", mups), ("windows", w as f64)],
        note: "one process per window, updates over a shared-memory ring (2 cores shared)",
    });
    for i in 0..w {
        jmp.vas_remove(&format!("gm{w}-{i}"))?;
        jmp.seg_remove(&format!("gr{w}-{i}"))?;
    }
    Ok(())
}

fn gups_mp_child(w: &str, window: &str, store: &str, i: u64) -> Res<()> {
    let jmp = Jmp::open(Config::with_store(store))?;
    let vh = jmp.vas_attach(&format!("gm{w}-{i}"), AttachOptions::default())?;
    let mut a = vh.switch()?;
    let ring = Ring {
        base: a.bytes(&format!("gr{w}-{i}"))?.as_ptr() as u64,
    };
    let b = a.bytes_mut(window)?;
    let words = b.len() / 8;
    // SAFETY: the window's data area is 8-aligned and `words * 8` bytes.
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

fn key(i: u64) -> String {
    format!("record-{i:010}")
}

fn fnv(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Offset-pointer file: [nslots u64][slots: (key_off u64, key_len u64, val u64)...][keys...]
fn write_offset_file(path: &Path, n: u64) -> Res<()> {
    let slots = (n * 2).next_power_of_two();
    let mut table = vec![(0u64, 0u64, 0u64); slots as usize];
    let mut keys = Vec::with_capacity((n * 17) as usize);
    let keys_at = 8 + slots * 24;
    for i in 0..n {
        let k = key(i);
        let mut s = fnv(k.as_bytes()) & (slots - 1);
        while table[s as usize].1 != 0 {
            s = (s + 1) & (slots - 1);
        }
        table[s as usize] = (keys_at + keys.len() as u64, k.len() as u64, i);
        keys.extend_from_slice(k.as_bytes());
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(&slots.to_le_bytes())?;
    for (o, l, v) in table {
        f.write_all(&o.to_le_bytes())?;
        f.write_all(&l.to_le_bytes())?;
        f.write_all(&v.to_le_bytes())?;
    }
    f.write_all(&keys)?;
    Ok(())
}

/// Child roles: print the answer to one query as early as possible.
fn child(role: &str, arg: &str, q: u64) -> Res<()> {
    if let Some(rest) = role.strip_prefix("gups-mp:") {
        let (w, window) = rest.split_once(':').ok_or("gups-mp role")?;
        return gups_mp_child(w, window, arg, q);
    }
    let k = key(q);
    let ans: u64 = match role {
        "spawn" => q,
        "jmp" => {
            let jmp = Jmp::open(Config::with_store(arg))?;
            let vh = jmp.vas_attach("pv", AttachOptions::default())?;
            let a = vh.switch()?;
            let root = a.root::<SegMap<u64>>("ps")?;
            let m = root.get(&a)?;
            *m.get(&a, k.as_bytes())?.ok_or("missing")?
        }
        "deser" => {
            let mut buf = Vec::new();
            std::fs::File::open(arg)?.read_to_end(&mut buf)?;
            let n = u64::from_le_bytes(buf[..8].try_into()?);
            let mut m: HashMap<String, u64> = HashMap::with_capacity(n as usize);
            let mut p = 8;
            for _ in 0..n {
                let l = u32::from_le_bytes(buf[p..p + 4].try_into()?) as usize;
                let s = std::str::from_utf8(&buf[p + 4..p + 4 + l])?.to_string();
                let v = u64::from_le_bytes(buf[p + 4 + l..p + 12 + l].try_into()?);
                m.insert(s, v);
                p += 12 + l;
            }
            *m.get(&k).ok_or("missing")?
        }
        "offset" => {
            let f = std::fs::File::open(arg)?;
            let len = f.metadata()?.len() as usize;
            // SAFETY: a private read-only mapping of a file we do not modify.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err("mmap".into());
            }
            // SAFETY: the mapping is `len` bytes and lives until exit.
            let b = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
            let rd = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
            let slots = rd(0);
            let mut s = fnv(k.as_bytes()) & (slots - 1);
            loop {
                let e = 8 + s as usize * 24;
                let (o, l) = (rd(e) as usize, rd(e + 8) as usize);
                if l == 0 {
                    return Err("missing".into());
                }
                if &b[o..o + l] == k.as_bytes() {
                    break rd(e + 16);
                }
                s = (s + 1) & (slots - 1);
            }
        }
        _ => return Err("unknown role".into()),
    };
    println!("{ans}");
    std::io::stdout().flush()?;
    // Skip teardown of what we built: the measurement ends at the answer.
    std::process::exit(0);
}

fn time_child(role: &str, arg: &Path, q: u64) -> Res<f64> {
    let t = Instant::now();
    let mut c = Command::new(std::env::current_exe()?)
        .args(["--child", role, &arg.display().to_string(), &q.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(c.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    c.wait()?;
    if line.trim() != q.to_string() {
        return Err(format!("child {role} answered `{}`", line.trim()).into());
    }
    Ok(ms)
}

fn bench_persist(jmp: &Jmp, dir: &Path, out: &mut Out, quick: bool) -> Res<()> {
    let n: u64 = if quick { 1_000_000 } else { 10_000_000 };
    let seg_size = (n * 160).next_power_of_two();
    let t = Instant::now();
    jmp.seg_alloc("ps", seg_size, &SegOptions::default())?;
    vas(jmp, "pv", &["ps"])?;
    {
        let vh = jmp.vas_attach("pv", AttachOptions::default())?;
        let mut a = vh.switch()?;
        let mut m = SegMap::<u64>::new(&mut a, "ps", n)?;
        for i in 0..n {
            m.insert(&mut a, key(i).as_bytes(), i)?;
        }
        let root = a.alloc("ps", m)?;
        a.set_root("ps", root)?;
    }
    let build_jmp = t.elapsed().as_secs_f64();
    let ser = dir.join("records.bin");
    let t = Instant::now();
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&ser)?);
        f.write_all(&n.to_le_bytes())?;
        for i in 0..n {
            let k = key(i);
            f.write_all(&(k.len() as u32).to_le_bytes())?;
            f.write_all(k.as_bytes())?;
            f.write_all(&i.to_le_bytes())?;
        }
    }
    let build_ser = t.elapsed().as_secs_f64();
    let off = dir.join("records.off");
    write_offset_file(&off, n)?;
    let q = n / 2 + 7;
    let mut res = Vec::new();
    for (role, arg, system, note) in [
        (
            "spawn",
            dir.to_path_buf(),
            "process-spawn",
            "fork+exec+print, no data",
        ),
        (
            "jmp",
            dir.to_path_buf(),
            "spacejmp-segment",
            "attach VAS, follow root pointer, query in place",
        ),
        (
            "offset",
            off.clone(),
            "mmap-offset-pointers",
            "mmap file, open-addressing table of offsets",
        ),
        (
            "deser",
            ser.clone(),
            "deserialize-hashmap",
            "read file, rebuild HashMap<String,u64> (hand-rolled bincode-like format)",
        ),
    ] {
        let mut s = Vec::new();
        for _ in 0..3 {
            s.push(time_child(role, &arg, q)?);
        }
        let (m, spread) = med(s);
        res.push((system, m));
        out.push(Row {
            bench: "persist",
            system: system.into(),
            params: format!("records={n}"),
            figures: vec![("first_query_ms", m), ("spread_ms", spread)],
            note,
        });
    }
    let get = |s: &str| {
        res.iter()
            .find(|(x, _)| *x == s)
            .map(|(_, m)| *m)
            .unwrap_or(f64::NAN)
    };
    out.push(Row {
        bench: "persist",
        system: "ratio".into(),
        params: format!("records={n}"),
        figures: vec![
            (
                "deser_over_jmp",
                get("deserialize-hashmap") / get("spacejmp-segment"),
            ),
            (
                "offset_over_jmp",
                get("mmap-offset-pointers") / get("spacejmp-segment"),
            ),
            ("build_jmp_s", build_jmp),
            ("write_serialized_s", build_ser),
        ],
        note: "time to first answer, ratios of medians",
    });
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        let q = args
            .get(3)
            .and_then(|s| s.parse().ok())
            .ok_or("child args")?;
        return child(&args[1], &args[2], q);
    }
    let quick = args.iter().any(|a| a == "--quick");
    let json = args.iter().any(|a| a == "--json");
    let mut which: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(String::as_str)
        .collect();
    if which.is_empty() {
        which = vec!["switch", "attach", "gups", "persist"];
    }
    let dir = PathBuf::from(format!("/dev/shm/sjmp-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = Config::with_store(&dir).window(0x3000_0000_0000, 0x400_0000_0000);
    let mut out = Out {
        json,
        rows: Vec::new(),
    };
    if !json {
        println!(
            "{:<8} {:<22} {:<28} {:<60} note",
            "bench", "system", "params", "figures"
        );
    }
    let res = (|| -> Res<()> {
        let jmp = Jmp::open(cfg)?;
        for w in &which {
            match *w {
                "switch" => bench_switch(&jmp, &mut out, quick)?,
                "attach" => {
                    bench_attach(&jmp, &mut out, "4KiB")?;
                    match std::env::var("SPACEJMP_HUGE_STORE") {
                        Ok(h) => {
                            let hj = Jmp::open(Config::with_store(h).window(0x3800_0000_0000, 0x100_0000_0000))?;
                            bench_attach(&hj, &mut out, "2MiB")?;
                        }
                        Err(_) => eprintln!("attach 2MiB: skipped (set SPACEJMP_HUGE_STORE to a hugetlbfs directory with >= 513 free 2 MiB pages)"),
                    }
                }
                "gups" => bench_gups(&jmp, &mut out, quick)?,
                "persist" => bench_persist(&jmp, &dir, &mut out, quick)?,
                o => return Err(format!("unknown benchmark {o}").into()),
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    std::thread::sleep(Duration::from_millis(1));
    res
}
