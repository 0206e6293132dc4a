//! One system in one run: start (or reach) the server, load it, run each
//! phase, sample memory, stop it.

use super::*;

/// Everything for one system in one run.
pub(super) fn run_target(
    o: &Opts,
    t: &Target,
    run: usize,
    rb_bin: Option<&std::path::Path>,
    pb: &ProgressBar,
    rep: &mut Reporter,
    samples: &mut Vec<Sample>,
) -> Result<()> {
    let name = t.name();
    let seed = 1 + run as u64;
    let max_threads = o.threads.iter().copied().max().unwrap_or(1);
    let phases = measured(o);
    if !phases.is_empty() || rb_bin.is_some() {
        pb.set_message(format!("{name}: starting"));
        let server = Server::start(o, t)?;
        let mut conns = server.connect(o.connections)?;
        let mut ctl = server.connect(1)?.remove(0);
        let live = if phases.is_empty() {
            0
        } else {
            pb.set_message(format!("{name}: loading {} keys", o.keys));
            let ops = load::preload_ops(o.keys, o.value_size);
            let r = load::run_bulk(&mut conns, max_threads, &ops, BULK_PIPELINE)?;
            if !r.failed.is_empty() {
                return Err(format!(
                    "{} of {} preload SETs failed, first: {}",
                    r.failed.len(),
                    o.keys,
                    r.first_error.as_deref().unwrap_or("?")
                )
                .into());
            }
            let live = o.keys * (KEY_LEN + o.value_size) as u64;
            let (keys, used) = sut::server_counts(&mut ctl);
            if let Some(k) = keys.filter(|&k| k < o.keys) {
                rep.fail(format!(
                    "{BENCH} {name} run {}: the server holds {k} keys after {} were stored (evicted or lost)",
                    run + 1,
                    o.keys
                ));
            }
            let (rss, hwm) = server.rss();
            samples.push(Sample {
                system: name,
                run,
                phase: "load".into(),
                threads: max_threads,
                ops_per_sec: o.keys as f64 / r.secs,
                rss,
                hwm,
                live: Some(live),
                server_keys: keys,
                server_used: used,
                completed: true,
                secs: r.secs,
                ..Sample::default()
            });
            pb.inc(1);
            live
        };
        for &threads in &o.threads {
            for &ph in &phases {
                if ph.resp_only() && server.proto() != Proto::Resp {
                    pb.inc(1);
                    continue;
                }
                pb.set_message(format!("{name}: {} t={threads}", ph.name()));
                let (kind, read_ratio) = ph.mix_kind(o.read_ratio);
                let mix = Mix {
                    kind,
                    read_ratio,
                    value_size: o.value_size,
                    chooser: KeyChooser::new(o.dist, o.keys),
                    pipeline: o.pipeline,
                };
                let cpu = server
                    .pid()
                    .map(|pid| sut::CpuWindow::spawn(pid, Instant::now() + o.warmup, o.measure));
                let r = load::run_phase(&mut conns, threads, &mix, o.warmup, o.measure, seed)?;
                let cpu_secs = cpu.and_then(sut::CpuWindow::join);
                let what = format!(
                    "{BENCH} {name} {} threads={threads} run {}",
                    ph.name(),
                    run + 1
                );
                if r.misses > 0 || r.bad_values > 0 {
                    rep.fail(format!(
                        "{what}: {} GETs of loaded keys missed, {} returned a value of the wrong length",
                        r.misses, r.bad_values
                    ));
                }
                if r.errors > 0 {
                    rep.error(format!(
                        "{what}: {} error replies, first: {}",
                        r.errors,
                        r.first_error.as_deref().unwrap_or("?")
                    ));
                }
                let (rss, hwm) = server.rss();
                samples.push(Sample {
                    system: name,
                    run,
                    phase: ph.name().into(),
                    threads,
                    ops_per_sec: r.ops_per_sec(),
                    p50: Some(r.p_ns(0.5) as f64),
                    p99: Some(r.p_ns(0.99) as f64),
                    p999: Some(r.p_ns(0.999) as f64),
                    rss,
                    hwm,
                    live: Some(live),
                    cpu_ns_per_op: cpu_secs
                        .filter(|_| r.ops_per_sec() > 0.0)
                        .map(|c| c * 1e9 / (r.ops_per_sec() * r.secs)),
                    completed: true,
                    secs: r.secs,
                    ..Sample::default()
                });
                pb.inc(1);
            }
        }
        drop(conns);
        drop(ctl);
        if let (Some(bin), Some(port)) = (rb_bin, server.resp_port()) {
            pb.set_message(format!("{name}: redis-benchmark"));
            // ~200k requests/s is slow for a pipelined SET/GET: allow that and a minute.
            let timeout = Duration::from_secs(60 + 2 * o.rb_requests / 200_000);
            match sut::redis_benchmark(bin, port, o.rb_requests, timeout) {
                Ok(v) => {
                    for x in v {
                        samples.push(Sample {
                            system: name,
                            run,
                            phase: format!("rb:{}", x.test),
                            threads: 1,
                            ops_per_sec: x.rps,
                            p50: x.p50_ms.map(|ms| ms * 1e6),
                            completed: true,
                            ..Sample::default()
                        });
                    }
                }
                Err(e) => rep.error(format!("{RB} {name} run {}: {e}", run + 1)),
            }
        }
        pb.inc(1);
        server.stop()?;
    }
    if o.phases.contains(&Phase::Churn) {
        pb.set_message(format!("{name}: churn"));
        let server = Server::start(o, t)?;
        let mut conns = server.connect(o.connections.min(8 * max_threads))?;
        let mut ctl = server.connect(1)?.remove(0);
        let rss_start = server.rss().0;
        let spec = ChurnSpec {
            target: o.churn_bytes,
            sizes_a: CHURN_SIZES_A,
            sizes_b: CHURN_SIZES_B,
            delete_permille: 900,
            pipeline: BULK_PIPELINE,
            seed,
        };
        let c = load::churn(&mut conns, max_threads, &spec)?;
        let settled = settle_rss(&server, o.churn_settle);
        let (keys, used) = sut::server_counts(&mut ctl);
        let (rss, hwm) = server.rss();
        // Redis's allocator keeps freed pages a while; MEMORY PURGE returns
        // them at once: its best case, reported beside the as-is figure.
        let purged = match ctl.proto() {
            Proto::Resp => {
                match ctl.call(Expect::Line, &[b"MEMORY", b"PURGE"], |r| r.is_stored()) {
                    Ok(true) => {
                        std::thread::sleep(Duration::from_millis(100));
                        server.rss().0
                    }
                    _ => None,
                }
            }
            Proto::Memcached => None,
        };
        if let Some(k) = keys.filter(|&k| k < c.live_keys) {
            rep.fail(format!(
                "{CHURN} {name} run {}: the server holds {k} keys, {} should be live (evicted or lost)",
                run + 1,
                c.live_keys
            ));
        }
        samples.push(Sample {
            system: name,
            run,
            phase: "churn".into(),
            threads: max_threads,
            ops_per_sec: c.ops as f64 / c.secs,
            rss,
            hwm,
            rss_start,
            rss_purged: purged,
            settle: Some(settled),
            live: Some(c.live_bytes),
            live_keys: Some(c.live_keys),
            server_keys: keys,
            server_used: used,
            completed: c.live_bytes >= o.churn_bytes,
            secs: c.secs,
            ..Sample::default()
        });
        if c.failed > 0 {
            rep.note(
                CHURN,
                &format!(
                    "{name} run {}: {} requests failed (first: {}); those keys are not counted live",
                    run + 1,
                    c.failed,
                    c.first_error.as_deref().unwrap_or("a DEL found no key")
                ),
            );
        }
        drop(conns);
        drop(ctl);
        pb.inc(1);
        server.stop()?;
    }
    Ok(())
}

/// A started server, or the external endpoint.
pub(super) enum Server {
    Proc(ServerProc),
    External {
        addr: SocketAddr,
        proto: Proto,
        pid: Option<u32>,
    },
}

impl Server {
    pub(super) fn start(o: &Opts, t: &Target) -> Result<Server> {
        match t {
            Target::Start(s) => {
                util::prime_memory(o.memory as usize);
                ServerProc::start(*s, &o.bins, o.memory, o.protocol).map(Server::Proc)
            }
            Target::External { addr, pid } => Ok(Server::External {
                addr: *addr,
                proto: o.protocol,
                pid: *pid,
            }),
        }
    }

    pub(super) fn connect(&self, n: usize) -> Result<Vec<Conn>> {
        let addr = match self {
            Server::Proc(p) => p.addr,
            Server::External { addr, .. } => *addr,
        };
        (0..n).map(|_| Conn::connect(addr, self.proto())).collect()
    }

    /// The protocol the generator speaks to it.
    pub(super) fn proto(&self) -> Proto {
        match self {
            Server::Proc(p) => p.proto,
            Server::External { proto, .. } => *proto,
        }
    }

    pub(super) fn pid(&self) -> Option<u32> {
        match self {
            Server::Proc(p) => Some(p.pid()),
            Server::External { pid, .. } => *pid,
        }
    }

    pub(super) fn rss(&self) -> (Option<u64>, Option<u64>) {
        match self.pid().and_then(sut::proc_rss) {
            Some((r, h)) => (Some(r), Some(h)),
            None => (None, None),
        }
    }

    pub(super) fn resp_port(&self) -> Option<u16> {
        match self {
            Server::Proc(p) => p.resp_port,
            Server::External { addr, proto, .. } => (*proto == Proto::Resp).then_some(addr.port()),
        }
    }

    /// Stop the server; an error if it had died on its own.
    pub(super) fn stop(self) -> Result<()> {
        if let Server::Proc(p) = self {
            if p.rss().is_none() {
                return Err(
                    format!("{} died during the run: {}", p.sys.name(), p.log_tail(1500)).into(),
                );
            }
        }
        Ok(())
    }
}

/// RSS samples, [`SETTLE_POLL`] apart, over which RSS must fall by less
/// than [`SETTLE_FALL_PERMILLE`] for the churn to count as settled.
const SETTLE_WINDOW_POLLS: usize = 4;
/// Time between two RSS samples while the churn settles.
const SETTLE_POLL: Duration = Duration::from_millis(250);
/// A fall of RSS below this (per mille of RSS) over the window is "settled".
const SETTLE_FALL_PERMILLE: u64 = 10;
/// The longest settle, as a multiple of the minimum.
const SETTLE_MAX_FACTOR: u32 = 10;

/// Wait at least `min`, then until the server's RSS stops falling (less
/// than 1 % over the last second) or `SETTLE_MAX_FACTOR x min` passed:
/// what background compaction, decay or purging returns is counted
/// whenever it finishes, the same rule for every server. Returns the time
/// waited.
fn settle_rss(server: &Server, min: Duration) -> Duration {
    let t = std::time::Instant::now();
    std::thread::sleep(min);
    let mut window: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
    while t.elapsed() < min * SETTLE_MAX_FACTOR {
        let Some(rss) = server.rss().0 else {
            break;
        };
        window.push_back(rss);
        if window.len() > SETTLE_WINDOW_POLLS {
            window.pop_front();
            let first = window[0];
            if first.saturating_sub(rss) * 1000 < first * SETTLE_FALL_PERMILLE {
                break;
            }
        }
        std::thread::sleep(SETTLE_POLL);
    }
    t.elapsed()
}
