//! Process control: the scratch directory, child processes that die with
//! memlab, the servers under test, and preloading a store or a server.

use super::*;

/// Default scratch directories: this prefix + the pid.
pub(super) const SCRATCH_PREFIX: &str = "/dev/shm/memlab-shared-";

/// Remove default scratch directories of memlab processes that no longer
/// exist (a run killed by a signal cannot remove its own).
pub(super) fn remove_stale_scratch() {
    let (parent, stem) = SCRATCH_PREFIX.rsplit_once('/').unwrap_or(("/dev/shm", ""));
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(stem))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!(
                "memlab shared: note: removing {} (its memlab is gone)",
                e.path().display()
            );
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The scratch directory, removed on drop.
pub(super) struct Scratch(PathBuf);

impl Scratch {
    pub(super) fn create(dir: &Path) -> Result<Scratch> {
        if dir.exists() {
            return Err(
                format!("{} exists; remove it or pass another --dir", dir.display()).into(),
            );
        }
        std::fs::create_dir_all(dir).with_context(|| dir.display())?;
        Ok(Scratch(dir.to_path_buf()))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process (server or client): PR_SET_PDEATHSIG so it dies with
/// memlab, registered with `memlab server`'s signal handler, stopped
/// (SIGTERM, then SIGKILL) and reaped on drop.
pub(super) struct Proc {
    pub(super) child: Child,
    pub(super) what: String,
    pub(super) log: Option<PathBuf>,
}

impl Proc {
    /// Spawn `cmd`; `log`: its stdout and stderr go there (else as set on
    /// `cmd`).
    pub(super) fn spawn(mut cmd: Command, what: &str, log: Option<&Path>) -> Result<Proc> {
        let child = sut::spawn_tied(&mut cmd, log, what)?;
        Ok(Proc {
            child,
            what: what.to_string(),
            log: log.map(Path::to_path_buf),
        })
    }

    /// Exited already? Then why, with the log's tail.
    pub(super) fn exited(&mut self) -> Option<BenchError> {
        match self.child.try_wait() {
            Ok(Some(st)) => Some(BenchError::Run(format!(
                "{} exited ({st}): {}",
                self.what,
                self.log_tail()
            ))),
            _ => None,
        }
    }

    pub(super) fn log_tail(&self) -> String {
        let Some(l) = &self.log else {
            return String::new();
        };
        let s = std::fs::read_to_string(l).unwrap_or_default();
        let t: Vec<&str> = s.lines().rev().take(6).collect();
        t.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// SIGTERM, wait (up to STOP_GRACE), SIGKILL if needed.
    pub(super) fn stop(&mut self) -> Result<ExitStatus> {
        sut::terminate(&mut self.child, STOP_GRACE).ok_or_else(|| {
            BenchError::Run(format!(
                "{} did not stop within {} s of SIGTERM (killed)",
                self.what,
                STOP_GRACE.as_secs()
            ))
        })
    }

    /// SIGKILL and reap.
    pub(super) fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL (std does nothing once reaped)
        let _ = self.child.wait();
        sut::unregister_child(self.child.id());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        sut::terminate(&mut self.child, STOP_GRACE);
    }
}

/// How a server is started.
#[derive(Clone, Debug)]
pub(super) struct ServerSpec {
    pub(super) sys: System,
    pub(super) bin: PathBuf,
    pub(super) sock: PathBuf,
    pub(super) args: Vec<String>,
    pub(super) log: PathBuf,
    /// nibble's --data-dir.
    pub(super) store_dir: Option<PathBuf>,
}

impl ServerSpec {
    /// `data_dir`: nibble's --data-dir, or redis's --dir for its RDB.
    pub(super) fn new(
        o: &Opts,
        sys: System,
        tag: &str,
        capacity: u64,
        data_dir: Option<&Path>,
    ) -> Result<ServerSpec> {
        let sock = o.dir.join(format!("{}-{tag}.sock", sys.name()));
        let log = o.dir.join(format!("{}-{tag}.log", sys.name()));
        let s = |x: &str| x.to_string();
        let own_dir = o.dir.join(format!("{}-{tag}.store", sys.name()));
        let data_dir = match sys {
            System::NibbleDataDir => Some(data_dir.unwrap_or(&own_dir)),
            _ => data_dir,
        };
        let (bin, args) = match sys {
            System::Nibble | System::NibbleDataDir => {
                let mut v = vec![
                    s("--port=-1"),
                    s("--unixsocket"),
                    sock.display().to_string(),
                    s("--maxmemory"),
                    capacity.to_string(),
                ];
                if let Some(d) = data_dir {
                    v.extend([s("--data-dir"), d.display().to_string()]);
                }
                (o.bins.nibble.clone()?, v)
            }
            System::Redis => {
                let d = data_dir.unwrap_or(&o.dir);
                (
                    o.bins.redis.clone()?,
                    vec![
                        s("--port"),
                        s("0"),
                        s("--unixsocket"),
                        sock.display().to_string(),
                        s("--unixsocketperm"),
                        s("700"),
                        s("--save"),
                        s(""),
                        s("--appendonly"),
                        s("no"),
                        s("--dir"),
                        d.display().to_string(),
                        s("--dbfilename"),
                        format!("{tag}.rdb"),
                        s("--daemonize"),
                        s("no"),
                    ],
                )
            }
            System::Direct => return Err("direct has no server".into()),
        };
        Ok(ServerSpec {
            sys,
            bin,
            sock,
            args,
            log,
            store_dir: data_dir
                .filter(|_| sys != System::Redis)
                .map(Path::to_path_buf),
        })
    }

    pub(super) fn spawn(&self) -> Result<Proc> {
        let _ = std::fs::remove_file(&self.sock);
        let mut cmd = Command::new(&self.bin);
        cmd.args(&self.args);
        Proc::spawn(cmd, self.sys.name(), Some(&self.log))
    }

    /// Spawn and wait until it answers PING.
    pub(super) fn start(&self) -> Result<(Proc, Conn)> {
        let mut p = self.spawn()?;
        let t0 = Instant::now();
        loop {
            if let Some(e) = p.exited() {
                return Err(e);
            }
            if let Ok(mut c) = Conn::connect_unix(&self.sock, Proto::Resp) {
                let pong = c.call(Expect::Line, &[b"PING"], |r| {
                    matches!(r, Reply::Status(b"PONG"))
                })?;
                if pong {
                    return Ok((p, c));
                }
            }
            if t0.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "{} did not answer on {} within {} s: {}",
                    self.sys.name(),
                    self.sock.display(),
                    START_TIMEOUT.as_secs(),
                    p.log_tail()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// SET keys `lo..hi` to their values over `c`, pipelined.
pub(super) fn load_socket(c: &mut Conn, lo: u64, hi: u64, value_size: usize) -> Result<()> {
    let mut val = vec![0u8; value_size];
    let mut k = lo;
    let mut bad: Option<String> = None;
    while k < hi {
        let n = (hi - k).min(LOAD_PIPELINE as u64);
        for j in k..k + n {
            fill_value(j, &mut val);
            c.queue(&[b"SET", &key(j), &val]);
        }
        c.send_queued(n as usize, Expect::Line, |r| {
            if !r.is_stored() && bad.is_none() {
                bad = Some(r.describe());
            }
        })?;
        if let Some(b) = bad {
            return Err(format!("preload SET refused: {b}").into());
        }
        k += n;
    }
    Ok(())
}

/// Put keys `0..keys` into `s` with `threads` threads.
pub(super) fn load_direct(
    s: &SharedStore,
    keys: u64,
    value_size: usize,
    threads: u64,
) -> Result<()> {
    let per = keys.div_ceil(threads.max(1));
    let res: Vec<Result<()>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                sc.spawn(move || {
                    let mut val = vec![0u8; value_size];
                    for k in (t * per).min(keys)..((t + 1) * per).min(keys) {
                        fill_value(k, &mut val);
                        s.put(&key(k), &val)
                            .with_context(|| format!("preload put of key {k}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("loader panicked".into())))
            .collect()
    });
    res.into_iter().collect()
}
