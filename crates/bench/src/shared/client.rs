//! The client processes and their protocol: the parent hands each a
//! `ChildSpec` (JSON argument), the child answers `ready` on stdout, waits
//! for the common start time on stdin, runs the closed loop and prints one
//! `ChildOut` (JSON).

use super::*;

/// What a client process does.
#[derive(Serialize, Deserialize, Debug)]
pub(super) enum Role {
    /// The closed loop of a cell.
    Load {
        keys: u64,
        value_size: usize,
        set_permille: u32,
        warm_ns: u64,
        measure_ns: u64,
        seed: u64,
    },
    /// Restart: attach, answer one GET, report the time of the answer.
    Attach { key: u64, value_size: usize },
    /// Attach, say ready, wait to be killed.
    Hold,
}

#[derive(Serialize, Deserialize, Debug)]
pub(super) struct ChildSpec {
    pub(super) system: System,
    /// The store directory (direct) or the Unix socket (servers).
    pub(super) path: PathBuf,
    pub(super) role: Role,
}

/// What a client process reports.
#[derive(Serialize, Deserialize, Debug, Default)]
pub(super) struct ChildOut {
    pub(super) ops: u64,
    pub(super) gets: u64,
    pub(super) sets: u64,
    pub(super) secs: f64,
    /// Latency histogram: (ns, count) of every non-empty bucket.
    pub(super) hist: Vec<(u64, u64)>,
    /// Wrong or missing values, failed SETs.
    pub(super) bad: u64,
    pub(super) first_bad: Option<String>,
    /// Attach: CLOCK_MONOTONIC of the answer, and of entering main.
    pub(super) answer_ns: u64,
    pub(super) main_ns: u64,
}

/// A client's handle on a system.
pub(super) enum Client {
    Direct(SharedStore),
    Socket(Conn),
}

impl Client {
    pub(super) fn open(system: System, path: &Path, compaction: bool) -> Result<Client> {
        Ok(match system {
            System::Direct => Client::Direct(
                SharedStore::attach(
                    path,
                    &StoreOptions {
                        compaction_thread: compaction,
                        ..StoreOptions::default()
                    },
                )
                .with_context(|| format!("attach {}", path.display()))?,
            ),
            _ => Client::Socket(Conn::connect_unix(path, Proto::Resp)?),
        })
    }

    /// GET key `k`; `Ok(None)` if it came back right, else what was wrong.
    pub(super) fn get_check(&mut self, k: u64, len: usize) -> Result<Option<String>> {
        let kb = key(k);
        let wrong = |v: Option<&[u8]>| match v {
            Some(v) if value_ok(k, v, len) => None,
            Some(v) => Some(format!(
                "GET key {k}: wrong value ({} bytes, expected {len})",
                v.len()
            )),
            None => Some(format!("GET key {k}: missing")),
        };
        match self {
            Client::Direct(s) => {
                let v = s.get(&kb).context("get")?;
                Ok(wrong(v.as_deref()))
            }
            Client::Socket(c) => c.call(Expect::Get, &[b"GET", &kb], |r| match r {
                Reply::Value(v) => wrong(Some(v)),
                Reply::Nil => wrong(None),
                other => Some(format!("GET key {k}: {}", other.describe())),
            }),
        }
    }

    /// SET key `k` to `val`; `Ok(None)` if stored.
    pub(super) fn set(&mut self, k: u64, val: &[u8]) -> Result<Option<String>> {
        let kb = key(k);
        match self {
            Client::Direct(s) => Ok(s.put(&kb, val).err().map(|e| format!("put key {k}: {e}"))),
            Client::Socket(c) => c.call(Expect::Line, &[b"SET", &kb, val], |r| {
                (!r.is_stored()).then(|| format!("SET key {k}: {}", r.describe()))
            }),
        }
    }

    pub(super) fn close(self) -> Result<()> {
        match self {
            Client::Direct(s) => s.close().context("close"),
            Client::Socket(_) => Ok(()),
        }
    }
}

/// `memlab shared --child SPEC`: one client process.
pub(super) fn child_main(spec: &str) -> Result<i32> {
    let main_ns = mono_ns();
    let spec: ChildSpec = serde_json::from_str(spec).context("child spec")?;
    let mut so = std::io::stdout().lock();
    let out = match spec.role {
        Role::Attach { key: k, value_size } => {
            let mut c = Client::open(spec.system, &spec.path, true)?;
            let wrong = c.get_check(k, value_size)?;
            let answer_ns = mono_ns();
            let out = ChildOut {
                answer_ns,
                main_ns,
                bad: u64::from(wrong.is_some()),
                first_bad: wrong,
                ..ChildOut::default()
            };
            c.close()?;
            out
        }
        Role::Hold => {
            let _c = Client::open(spec.system, &spec.path, true)?;
            writeln!(so, "ready")
                .and_then(|_| so.flush())
                .context("writing to stdout")?;
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Role::Load { .. } => {
            let mut c = Client::open(spec.system, &spec.path, false)?;
            writeln!(so, "ready")
                .and_then(|_| so.flush())
                .context("writing to stdout")?;
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("reading the start time")?;
            let t0: u64 = line
                .trim()
                .strip_prefix("go ")
                .and_then(|x| x.parse().ok())
                .ok_or_else(|| format!("bad start line {line:?}"))?;
            let out = closed_loop(&mut c, &spec.role, t0)?;
            c.close()?;
            out
        }
    };
    let line = serde_json::to_string(&out).context("child output")?;
    writeln!(so, "{line}")
        .and_then(|_| so.flush())
        .context("writing to stdout")?;
    Ok(0)
}

/// One request at a time from CLOCK_MONOTONIC `t0` for the warm-up and
/// the measured window.
pub(super) fn closed_loop(c: &mut Client, role: &Role, t0: u64) -> Result<ChildOut> {
    let Role::Load {
        keys,
        value_size,
        set_permille,
        warm_ns,
        measure_ns,
        seed,
    } = *role
    else {
        return Err("not a load role".into());
    };
    let start = instant_at(t0);
    let warm_end = instant_at(t0 + warm_ns);
    let end = instant_at(t0 + warm_ns + measure_ns);
    let mut hist = load::latency_hist()?;
    let mut rng = Rng::new(seed);
    let mut val = vec![0u8; value_size];
    let mut out = ChildOut::default();
    std::thread::sleep(start.saturating_duration_since(Instant::now()));
    let mut measuring = false;
    let mut window_start = Instant::now();
    let mut i: u64 = 0;
    loop {
        if i.is_multiple_of(CHECK_EVERY_OPS) {
            let now = Instant::now();
            if !measuring && now >= warm_end {
                measuring = true;
                window_start = now;
                out.ops = 0;
                out.gets = 0;
                out.sets = 0;
            } else if measuring && now >= end {
                out.secs = now.duration_since(window_start).as_secs_f64();
                break;
            }
        }
        let k = rng.range(0, keys);
        let is_set = rng.range(0, 1000) < set_permille as u64;
        let t = (measuring && i.is_multiple_of(SAMPLE_EVERY_OPS)).then(Instant::now);
        let wrong = if is_set {
            fill_value(k, &mut val);
            out.sets += 1;
            c.set(k, &val)?
        } else {
            out.gets += 1;
            c.get_check(k, value_size)?
        };
        if let Some(t) = t {
            let _ = hist.record(t.elapsed().as_nanos() as u64);
        }
        if let Some(w) = wrong {
            out.bad += 1;
            out.first_bad.get_or_insert(w);
        }
        out.ops += 1;
        i += 1;
    }
    out.hist = hist
        .iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect();
    Ok(out)
}

/// A client process as the parent sees it.
pub(super) struct ClientProc {
    pub(super) proc: Proc,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) stdout: BufReader<ChildStdout>,
}

impl ClientProc {
    pub(super) fn spawn(spec: &ChildSpec) -> Result<ClientProc> {
        // /proc/self/exe, not current_exe(): it still runs this binary if
        // a build replaced the file since memlab started.
        let mut cmd = Command::new("/proc/self/exe");
        cmd.args(["shared", "--child"])
            .arg(serde_json::to_string(spec).context("child spec")?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut proc = Proc::spawn(cmd, "client process", None)?;
        let stdin = proc.child.stdin.take();
        let stdout = BufReader::new(proc.child.stdout.take().ok_or("no child stdout")?);
        Ok(ClientProc {
            proc,
            stdin,
            stdout,
        })
    }

    pub(super) fn read_line(&mut self) -> Result<String> {
        let mut l = String::new();
        match self.stdout.read_line(&mut l) {
            Ok(0) => {
                let why = self
                    .proc
                    .child
                    .wait()
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                Err(format!("client process ended without output ({why})").into())
            }
            Ok(_) => Ok(l),
            Err(e) => Err(BenchError::io("reading a client process", e)),
        }
    }

    pub(super) fn result(&mut self) -> Result<ChildOut> {
        let l = self.read_line()?;
        let out = serde_json::from_str(&l).with_context(|| format!("client output {l:?}"))?;
        let st = self
            .proc
            .child
            .wait()
            .context("waiting for a client process")?;
        sut::unregister_child(self.proc.child.id());
        if !st.success() {
            return Err(format!("client process {st}").into());
        }
        Ok(out)
    }
}

/// What a cell measured, over all its processes.
pub(super) struct CellOut {
    pub(super) ops_per_sec: f64,
    pub(super) p50_ns: f64,
    pub(super) p99_ns: f64,
    pub(super) gets: u64,
    pub(super) sets: u64,
}

/// Run one cell: `cell.processes` client processes on `path`.
pub(super) fn run_cell(
    o: &Opts,
    sys: System,
    path: &Path,
    cell: &Cell,
    seed: u64,
) -> Result<CellOut> {
    let mut kids = Vec::new();
    for p in 0..cell.processes {
        let spec = ChildSpec {
            system: sys,
            path: path.to_path_buf(),
            role: Role::Load {
                keys: o.keys,
                value_size: o.value_size,
                set_permille: cell.set_pct * 10,
                warm_ns: o.warmup.as_nanos() as u64,
                measure_ns: o.measure.as_nanos() as u64,
                seed: mix64(seed ^ (p as u64) << 32),
            },
        };
        kids.push(ClientProc::spawn(&spec)?);
    }
    for k in &mut kids {
        let l = k.read_line()?;
        if l.trim() != "ready" {
            return Err(format!("client process said {l:?}, not ready").into());
        }
    }
    let t0 = mono_ns() + START_SLACK.as_nanos() as u64;
    for k in &mut kids {
        let mut w = k.stdin.take().ok_or("no child stdin")?;
        writeln!(w, "go {t0}").context("starting a client")?;
    }
    let mut hist: Histogram<u64> = load::latency_hist()?;
    let (mut ops_per_sec, mut gets, mut sets) = (0.0, 0, 0);
    let mut bad = Vec::new();
    for k in &mut kids {
        let r = k.result()?;
        if r.secs <= 0.0 {
            return Err("a client measured an empty window".into());
        }
        ops_per_sec += r.ops as f64 / r.secs;
        gets += r.gets;
        sets += r.sets;
        for (v, c) in r.hist {
            let _ = hist.record_n(v, c);
        }
        if r.bad > 0 {
            bad.push(format!(
                "{} bad replies, first: {}",
                r.bad,
                r.first_bad.unwrap_or_default()
            ));
        }
    }
    if !bad.is_empty() {
        return Err(format!("check failed: {}", bad.join("; ")).into());
    }
    let q = |x: f64| {
        if hist.is_empty() {
            f64::NAN
        } else {
            hist.value_at_quantile(x) as f64
        }
    };
    Ok(CellOut {
        ops_per_sec,
        p50_ns: q(0.5),
        p99_ns: q(0.99),
        gets,
        sets,
    })
}
