//! `persist`: SpaceJMP §5.4, time to first query of a persisted index, and
//! the child processes of every workload.

use super::*;

const PERSIST_BENCH: &str = "jmp-persist";

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

/// The records `key(i) → i` for `i < n`, serialized as a map without
/// building one: bincode writes a map as its length and the pairs, which a
/// reader deserializes straight into a `HashMap<String, u64>`.
struct Records(u64);

impl Serialize for Records {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // (`Range::map` has an exact size hint, so bincode gets the length.)
        s.collect_map((0..self.0).map(|i| (key(i), i)))
    }
}

/// Offset-pointer file: `[nslots u64][slots: (key_off, key_len, val) u64 x 3...][keys...]`.
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
    f.flush()?;
    Ok(())
}

/// Entry point of the child processes: `args` are `ROLE ARG N` as passed
/// by this module (persistence readers print the answer for record `N` and
/// exit; `gups-mp:W:WINDOW STORE I` is GUPS worker `I`). Exits the process
/// on success.
pub fn child_main(args: &[String]) -> Result<(), BenchError> {
    let [role, arg, q] = args else {
        return Err(format!("child: expected ROLE ARG N, got {args:?}").into());
    };
    let q: u64 = q.parse().map_err(|e| format!("child: N {q:?}: {e}"))?;
    if let Some(rest) = role.strip_prefix("gups-mp:") {
        let (w, window) = rest.split_once(':').ok_or("child: gups-mp:W:WINDOW")?;
        return gups_mp_child(w, window, arg, q);
    }
    let k = key(q);
    let ans: u64 = match role.as_str() {
        "spawn" => q,
        "jmp" => {
            let jmp = Jmp::open(Config::with_store(arg))?;
            let vh = jmp.vas_attach("pv", AttachOptions::default())?;
            let a = vh.switch()?;
            let root = a.root::<SegMap<u64>>("ps")?;
            let m = root.get(&a)?;
            *m.get(&a, k.as_bytes())?.ok_or("missing record")?
        }
        "bincode" => {
            let mut buf = Vec::new();
            std::fs::File::open(arg)?.read_to_end(&mut buf)?;
            let m: HashMap<String, u64> = bincode::deserialize(&buf)?;
            *m.get(&k).ok_or("missing record")?
        }
        "offset" => {
            let f = std::fs::File::open(arg)?;
            let len = f.metadata()?.len() as usize;
            // SAFETY: a shared read-only mapping of a file nobody modifies
            // while the child runs.
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
                return Err("mmap of the offset file failed".into());
            }
            // SAFETY: the mapping is `len` bytes and lives until exit.
            let b = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
            let rd = |o: usize| {
                b.get(o..o + 8)
                    .and_then(|x| x.try_into().ok())
                    .map_or(0, u64::from_le_bytes)
            };
            let slots = rd(0).max(1);
            let mut s = fnv(k.as_bytes()) & (slots - 1);
            loop {
                let e = 8 + s as usize * 24;
                let (o, l) = (rd(e) as usize, rd(e + 8) as usize);
                if l == 0 {
                    return Err("missing record".into());
                }
                if b.get(o..o + l) == Some(k.as_bytes()) {
                    break rd(e + 16);
                }
                s = (s + 1) & (slots - 1);
            }
        }
        _ => return Err(format!("child: unknown role {role:?}").into()),
    };
    println!("{ans}");
    std::io::stdout().flush()?;
    // Skip teardown of what we built: the measurement ends at the answer.
    std::process::exit(0);
}

fn time_child(opts: &Options, role: &str, arg: &Path, q: u64) -> Res<f64> {
    let t = Instant::now();
    let mut c = child_command(opts)
        .args([role, &arg.display().to_string(), &q.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(c.stdout.take().ok_or("child stdout")?).read_line(&mut line)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let status = c.wait()?;
    if line.trim() != q.to_string() {
        return Err(format!("child {role} answered {:?} ({status})", line.trim()).into());
    }
    Ok(ms)
}

pub(super) fn bench_persist(jmp: &Jmp, opts: &Options, sink: &mut dyn Sink) -> Res<()> {
    let n = opts.records.max(1);
    let dir = jmp.registry().dir().to_path_buf();
    // SegMap: a bucket array of 2n slots plus ~64 B per node and key.
    let seg_size = (n * 160).next_power_of_two().max(1 << 20);
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
    let ser = dir.join("records.bincode");
    let t = Instant::now();
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&ser)?);
        bincode::serialize_into(&mut f, &Records(n))?;
        f.flush()?;
    }
    let build_ser = t.elapsed().as_secs_f64();
    let off = dir.join("records.off");
    let t = Instant::now();
    write_offset_file(&off, n)?;
    let build_off = t.elapsed().as_secs_f64();
    sink.note(
        PERSIST_BENCH,
        &format!(
            "SpaceJMP §5.4: {n} records (\"record-NNNNNNNNNN\" -> u64); a fresh process's time \
             from spawn to its first answer; built in {build_jmp:.2} s (segment), \
             {build_ser:.2} s (bincode file), {build_off:.2} s (offset file)"
        ),
    );
    let q = n / 2 + n.min(7) / 2;
    let mut medians = Vec::new();
    for (role, arg, system, note, build) in [
        (
            "spawn",
            dir.clone(),
            "process-spawn",
            "fork+exec+print, no data",
            0.0,
        ),
        (
            "jmp",
            dir.clone(),
            "spacejmp-segment",
            "attach VAS, follow the root pointer, query in place",
            build_jmp,
        ),
        (
            "offset",
            off.clone(),
            "mmap-offset-pointers",
            "mmap the file, probe an open-addressing table of offsets",
            build_off,
        ),
        (
            "bincode",
            ser.clone(),
            "bincode-hashmap",
            "read the file, deserialize HashMap<String,u64> with serde + bincode",
            build_ser,
        ),
    ] {
        let mut s = Vec::new();
        for _ in 0..opts.repeat {
            s.push(time_child(opts, role, &arg, q)?);
        }
        let st = stat(s);
        medians.push((system, st.median));
        let mut figures = vec![fig("records", n as f64, 0)];
        figs3(
            &mut figures,
            ["first_query_ms", "first_query_ms_min", "first_query_ms_max"],
            st,
            2,
        );
        figures.push(fig("build_s", build, 3));
        sink.row(Row {
            bench: PERSIST_BENCH,
            system: system.into(),
            labels: Vec::new(),
            figures,
            note: note.into(),
        });
    }
    let get = |s: &str| {
        medians
            .iter()
            .find(|(x, _)| *x == s)
            .map_or(f64::NAN, |(_, m)| *m)
    };
    sink.row(Row {
        bench: PERSIST_BENCH,
        system: "ratio".into(),
        labels: Vec::new(),
        figures: vec![
            fig("records", n as f64, 0),
            fig(
                "bincode_over_jmp",
                get("bincode-hashmap") / get("spacejmp-segment"),
                2,
            ),
            fig(
                "offset_over_jmp",
                get("mmap-offset-pointers") / get("spacejmp-segment"),
                2,
            ),
        ],
        note: "time to first answer, ratios of medians (issue 5 expects bincode_over_jmp >= 20)"
            .into(),
    });
    jmp.vas_remove("pv")?;
    jmp.seg_remove("ps")?;
    let _ = std::fs::remove_file(&ser);
    let _ = std::fs::remove_file(&off);
    Ok(())
}
