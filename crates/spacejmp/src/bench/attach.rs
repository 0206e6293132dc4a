//! `attach`: attaching a large segment with 4 KiB and 2 MiB pages, and the
//! hugetlbfs setup the 2 MiB rows need.

use super::*;

const ATTACH_BENCH: &str = "jmp-attach";

pub(super) fn bench_attach(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink, pages: &str) -> Res<()> {
    let size = opts.attach_bytes;
    let t = Instant::now();
    seg(jmp, "at-big", size, true, None, false)?;
    let create_ms = t.elapsed().as_secs_f64() * 1e3;
    vas(jmp, "at-v", &["at-big"])?;
    for prefault in [false, true] {
        let mut samples = Vec::new();
        for _ in 0..opts.repeat {
            let t = Instant::now();
            let h = jmp.vas_attach("at-v", AttachOptions { prefault })?;
            let a = h.switch()?;
            black_box(a.bytes("at-big")?[0]);
            samples.push(t.elapsed().as_secs_f64() * 1e6);
            drop(a);
            drop(h);
        }
        let mut figures = vec![fig("seg_mib", (size >> 20) as f64, 0)];
        figs3(
            &mut figures,
            ["attach_us", "attach_us_min", "attach_us_max"],
            stat(samples),
            1,
        );
        figures.push(fig("create_ms", create_ms, 2));
        sink.row(Row {
            bench: ATTACH_BENCH,
            system: if prefault {
                "vas_attach+populate"
            } else {
                "vas_attach"
            }
            .into(),
            labels: vec![("pages", pages.to_string())],
            figures,
            note: format!(
                "existing segment: open, validate header, mmap{}, switch, touch 1 byte",
                if prefault {
                    " + MADV_POPULATE (pre-fault every page)"
                } else {
                    ""
                }
            ),
        });
    }
    jmp.vas_remove("at-v")?;
    jmp.seg_remove("at-big")?;
    Ok(())
}

/// The 2 MiB-page attach rows, or a note saying why there are none.
pub(super) fn attach_huge(opts: &Options, sink: &mut dyn Sink) -> Res<()> {
    // Header page + data pages, + 2 for the registry file and its
    // replacement (each is one huge page on hugetlbfs).
    let need = opts.attach_bytes.div_ceil(2 << 20) + 3;
    let setup = match &opts.huge {
        HugePages::Off => {
            sink.note(ATTACH_BENCH, "2 MiB pages: skipped (--huge off)");
            return Ok(());
        }
        HugePages::Store(dir) => HugeSetup::given(dir.clone()),
        HugePages::Auto => match HugeSetup::auto(&opts.scratch, need) {
            Ok(s) => s,
            Err(why) => {
                sink.note(ATTACH_BENCH, &format!("2 MiB pages: not measured: {why}"));
                return Ok(());
            }
        },
    };
    if let Some(what) = &setup.changed {
        sink.note(
            ATTACH_BENCH,
            &format!("2 MiB pages: {what} (restored afterwards)"),
        );
    }
    let store = setup
        .store
        .join(format!("sjmp-bench-{}", std::process::id()));
    let res = (|| -> Res<()> {
        let hj = Jmp::open(Config::with_store(&store).window(HUGE_WINDOW.0, HUGE_WINDOW.1))?;
        bench_attach(&hj, opts, sink, "2MiB")
    })();
    let _ = std::fs::remove_dir_all(&store);
    drop(setup);
    res
}

/// A hugetlbfs store for the attach benchmark, and what was changed on the
/// system to get it (undone on drop).
struct HugeSetup {
    store: PathBuf,
    changed: Option<String>,
    mounted: Option<PathBuf>,
    old_nr: Option<u64>,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

fn meminfo(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
}

impl HugeSetup {
    fn given(store: PathBuf) -> HugeSetup {
        HugeSetup {
            store,
            changed: None,
            mounted: None,
            old_nr: None,
        }
    }

    /// Find or mount a 2 MiB hugetlbfs and make sure `need` pages are free.
    fn auto(scratch: &Path, need: u64) -> Result<HugeSetup, String> {
        if meminfo("Hugepagesize:") != Some(2048) {
            return Err("the default huge page size is not 2 MiB (or no hugetlb support)".into());
        }
        let mut s = HugeSetup::given(PathBuf::new());
        let mut changed = Vec::new();
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let existing = mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"hugetlbfs") && f.get(3).is_some_and(|o| !o.contains("pagesize=1G")))
                .then(|| PathBuf::from(f[1]))
        });
        match existing {
            Some(dir) => s.store = dir,
            None => {
                let dir = scratch.with_extension("hugetlbfs");
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                let c = |x: &str| std::ffi::CString::new(x).unwrap_or_default();
                let (src, fs, data) = (c("none"), c("hugetlbfs"), c("pagesize=2M"));
                let target = c(&dir.display().to_string());
                // SAFETY: valid NUL-terminated strings that outlive the call.
                let r = unsafe {
                    libc::mount(
                        src.as_ptr(),
                        target.as_ptr(),
                        fs.as_ptr(),
                        0,
                        data.as_ptr().cast(),
                    )
                };
                if r != 0 {
                    let e = std::io::Error::last_os_error();
                    let _ = std::fs::remove_dir(&dir);
                    return Err(format!(
                        "no hugetlbfs mounted and mounting one at {} failed: {e} (needs root)",
                        dir.display()
                    ));
                }
                changed.push(format!("mounted hugetlbfs at {}", dir.display()));
                s.store = dir.clone();
                s.mounted = Some(dir);
            }
        }
        let free = meminfo("HugePages_Free:").unwrap_or(0);
        if free < need {
            let total = meminfo("HugePages_Total:").unwrap_or(0);
            let want = total + (need - free);
            let old: u64 = std::fs::read_to_string(NR_HUGEPAGES)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(total);
            if let Err(e) = std::fs::write(NR_HUGEPAGES, format!("{want}\n")) {
                return Err(format!(
                    "{free} free 2 MiB pages, {need} needed, and writing {want} to {NR_HUGEPAGES} \
                     failed: {e} (needs root: `echo {want} > {NR_HUGEPAGES}`)"
                ));
            }
            s.old_nr = Some(old);
            let got = meminfo("HugePages_Free:").unwrap_or(0);
            if got < need {
                return Err(format!(
                    "asked the kernel for {want} huge pages; only {got} free, {need} needed \
                     (memory too fragmented or too small)"
                ));
            }
            changed.push(format!("raised {NR_HUGEPAGES} from {old} to {want}"));
        }
        s.changed = (!changed.is_empty()).then(|| changed.join(", "));
        Ok(s)
    }
}

impl Drop for HugeSetup {
    fn drop(&mut self) {
        if let Some(dir) = &self.mounted {
            if let Ok(t) = std::ffi::CString::new(dir.display().to_string()) {
                // SAFETY: a valid path string; unmounts what we mounted.
                unsafe { libc::umount(t.as_ptr()) };
            }
            let _ = std::fs::remove_dir(dir);
        }
        if let Some(old) = self.old_nr {
            let _ = std::fs::write(NR_HUGEPAGES, format!("{old}\n"));
        }
    }
}
