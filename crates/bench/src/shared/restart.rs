//! Restart timing: time from spawn to the first correct answer of a
//! restarted store (direct attach, redis-server with an RDB, nibble
//! --data-dir).

use super::*;

/// Keys of the restart data set.
pub(super) fn restart_keys(o: &Opts) -> u64 {
    (o.restart_bytes / (KEY_LEN + o.restart_value_size) as u64).max(1)
}

/// Capacity for the restart data set (live data at about 70 %).
pub(super) fn restart_capacity(o: &Opts) -> u64 {
    let live = restart_keys(o) * object_bytes(o.restart_value_size);
    (live / 7 * 10).max(64 << 20)
}

/// The key a restart probe asks for.
pub(super) fn probe_key(o: &Opts, r: usize) -> u64 {
    mix64(0xabcd ^ r as u64) % restart_keys(o)
}

pub(super) fn restart_direct(o: &Opts, r: usize, out: &mut Vec<RestartSample>) -> Result<()> {
    let keys = restart_keys(o);
    let d = o.dir.join(format!("restart-store-{r}"));
    let cap = restart_capacity(o);
    let s = SharedStore::create(&d, cap, &store_options(cap, keys))
        .with_context(|| format!("create {}", d.display()))?;
    load_direct(&s, keys, o.restart_value_size, 2)?;
    s.close().context("close")?;
    let attach = |out: &mut Vec<RestartSample>, name: &str| -> Result<()> {
        let spec = ChildSpec {
            system: System::Direct,
            path: d.clone(),
            role: Role::Attach {
                key: probe_key(o, r),
                value_size: o.restart_value_size,
            },
        };
        let t0 = mono_ns();
        let mut c = ClientProc::spawn(&spec)?;
        let res = c.result()?;
        if res.bad > 0 {
            return Err(format!("check failed: {}", res.first_bad.unwrap_or_default()).into());
        }
        out.push(RestartSample {
            repeat: r,
            system: name.into(),
            ms: res.answer_ns.saturating_sub(t0) as f64 / 1e6,
            keys,
            loading_replies: 0,
        });
        Ok(())
    };
    attach(out, "direct-attach")?;
    // The last process attached dies without closing: the next attach
    // must recover.
    let mut h = ClientProc::spawn(&ChildSpec {
        system: System::Direct,
        path: d.clone(),
        role: Role::Hold,
    })?;
    let l = h.read_line()?;
    if l.trim() != "ready" {
        return Err(format!("holder said {l:?}").into());
    }
    h.proc.kill();
    attach(out, "direct-attach-after-kill")?;
    SharedStore::remove(&d).context("remove")?;
    Ok(())
}

/// Spawn `spec`'s server and GET `k` every millisecond until the right
/// value comes back: (ms from spawn, -LOADING / error replies before).
pub(super) fn time_to_first_get(
    spec: &ServerSpec,
    k: u64,
    value_size: usize,
) -> Result<(Proc, f64, u64)> {
    let t0 = Instant::now();
    let mut p = spec.spawn()?;
    let mut loading = 0u64;
    loop {
        if let Some(e) = p.exited() {
            return Err(e);
        }
        if let Ok(mut c) = Conn::connect_unix(&spec.sock, Proto::Resp) {
            loop {
                let kb = key(k);
                let r = c.call(Expect::Get, &[b"GET", &kb], |r| match r {
                    Reply::Value(v) if value_ok(k, v, value_size) => Ok(true),
                    Reply::Error(e) if e.starts_with(b"LOADING") => Ok(false),
                    other => Err(other.describe()),
                })?;
                match r {
                    Ok(true) => {
                        let ms = t0.elapsed().as_secs_f64() * 1e3;
                        return Ok((p, ms, loading));
                    }
                    Ok(false) => loading += 1,
                    Err(e) => {
                        return Err(format!(
                            "check failed: {} restarted answered GET key {k} with {e}",
                            spec.sys.name()
                        )
                        .into())
                    }
                }
                if t0.elapsed() > START_TIMEOUT {
                    break;
                }
                std::thread::sleep(PROBE_INTERVAL);
            }
        }
        if t0.elapsed() > START_TIMEOUT {
            return Err(format!(
                "{} did not serve within {} s: {}",
                spec.sys.name(),
                START_TIMEOUT.as_secs(),
                p.log_tail()
            )
            .into());
        }
        std::thread::sleep(PROBE_INTERVAL);
    }
}

pub(super) fn restart_redis(o: &Opts, r: usize, out: &mut Vec<RestartSample>) -> Result<()> {
    // The RDB goes to a disk directory: just written, it is in the page
    // cache (so the load reads memory), but the kernel may drop it under
    // memory pressure, where a tmpfs copy beside Redis's own heap would
    // double the footprint.
    let tag = format!("restart-{}-{r}", std::process::id());
    let spec = ServerSpec::new(o, System::Redis, &tag, 0, Some(&o.rdb_dir))?;
    let rdb = o.rdb_dir.join(format!("{tag}.rdb"));
    let res = restart_redis_at(o, r, &spec, out);
    let _ = std::fs::remove_file(&rdb);
    res
}

pub(super) fn restart_redis_at(
    o: &Opts,
    r: usize,
    spec: &ServerSpec,
    out: &mut Vec<RestartSample>,
) -> Result<()> {
    let keys = restart_keys(o);
    let (mut p, mut c) = spec.start()?;
    load_socket(&mut c, 0, keys, o.restart_value_size)?;
    bgsave(&mut c)?;
    drop(c);
    p.stop()?;
    drop(p);
    let (mut p, ms, loading) = time_to_first_get(spec, probe_key(o, r), o.restart_value_size)?;
    out.push(RestartSample {
        repeat: r,
        system: "redis-rdb".into(),
        ms,
        keys,
        loading_replies: loading,
    });
    p.stop()?;
    Ok(())
}

/// BGSAVE and wait for it to finish successfully.
pub(super) fn bgsave(c: &mut Conn) -> Result<()> {
    let ok = c.call(
        Expect::Line,
        &[b"BGSAVE"],
        |r| matches!(r, Reply::Status(s) if s.starts_with(b"Background saving")),
    )?;
    if !ok {
        return Err("BGSAVE refused".into());
    }
    let t0 = Instant::now();
    loop {
        let info = c.call(Expect::Line, &[b"INFO", b"persistence"], |r| match r {
            Reply::Value(t) => String::from_utf8_lossy(t).into_owned(),
            _ => String::new(),
        })?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        };
        if field("rdb_bgsave_in_progress").as_deref() == Some("0") {
            return match field("rdb_last_bgsave_status").as_deref() {
                Some("ok") => Ok(()),
                s => Err(format!("BGSAVE failed: rdb_last_bgsave_status {s:?}").into()),
            };
        }
        if t0.elapsed() > START_TIMEOUT {
            return Err("BGSAVE did not finish".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn restart_nibble(o: &Opts, r: usize, out: &mut Vec<RestartSample>) -> Result<()> {
    let keys = restart_keys(o);
    let d = o.dir.join(format!("nibble-data-{r}"));
    let spec = ServerSpec::new(
        o,
        System::Nibble,
        &format!("restart-{r}"),
        restart_capacity(o),
        Some(&d),
    )?;
    let (mut p, mut c) = spec.start()?;
    load_socket(&mut c, 0, keys, o.restart_value_size)?;
    drop(c);
    p.stop()?;
    drop(p);
    let (mut p, ms, loading) = time_to_first_get(&spec, probe_key(o, r), o.restart_value_size)?;
    out.push(RestartSample {
        repeat: r,
        system: "nibble-data-dir".into(),
        ms,
        keys,
        loading_replies: loading,
    });
    p.kill();
    drop(p);
    let (mut p, ms, loading) = time_to_first_get(&spec, probe_key(o, r + 1), o.restart_value_size)?;
    out.push(RestartSample {
        repeat: r,
        system: "nibble-data-dir-after-kill".into(),
        ms,
        keys,
        loading_replies: loading,
    });
    p.stop()?;
    drop(p);
    let _ = std::fs::remove_dir_all(&d);
    Ok(())
}
