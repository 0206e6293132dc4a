//! SAVE, BGSAVE, LASTSAVE, snapshot points, INFO persistence and the
//! run-time `dir` / `dbfilename` / `save` settings.
//!
//! One save runs at a time (`in_progress`, taken by SAVE and BGSAVE
//! alike). SAVE writes the snapshot on the calling worker: that worker's
//! other clients wait, the other workers keep serving (Redis's SAVE
//! blocks every client). BGSAVE hands the same work to a thread of its
//! own and answers at once. A save that fails leaves the previous dump
//! in place and `rdb_last_bgsave_status:err`; the snapshot points retry
//! it no sooner than [`SAVE_RETRY_DELAY_S`] later, as Redis does.
//!
//! "Changes" (`rdb_changes_since_last_save`, the snapshot points) count
//! write commands (RESP commands flagged `write`, memcached stores) as
//! the workers run them, whether or not they changed a key: Redis counts
//! keys actually modified.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::encode::{Limits, Writer};
use super::load::LoadReport;
use super::{check_dbfilename, parse_save, show_save, RdbValue, SavePoint, DEFAULT_DBFILENAME};
use crate::coll::{self, Kind};
use crate::commands::{eq, CmdResult, Ctx};
use crate::config::ServerConfig;
use crate::resp::Reply;
use crate::state::{unix_ms, Shared};
use crate::types::is_collection;

/// Keys asked of the index cursor per step of a save.
pub const SAVE_SCAN_BATCH_KEYS: usize = 1024;
/// A failed snapshot-point save is retried no sooner than this (Redis's
/// `CONFIG_BGSAVE_RETRY_DELAY`).
pub const SAVE_RETRY_DELAY_S: u64 = 5;
/// How often the snapshot-point thread looks at the clock.
pub const SAVE_CRON_TICK_MS: u64 = 100;
/// Nice value of the BGSAVE thread: the workers win the CPU.
pub const BGSAVE_NICE: i32 = 10;

/// What SHUTDOWN asked for.
const SHUTDOWN_DEFAULT: u8 = 0;
const SHUTDOWN_NOSAVE: u8 = 1;
const SHUTDOWN_SAVED: u8 = 2;

/// Settings CONFIG SET may change.
struct Run {
    dir: PathBuf,
    dbfilename: String,
    save: Vec<SavePoint>,
}

/// Persistence state (one per server, in [`Shared`]).
pub struct Persistence {
    run: Mutex<Run>,
    me: OnceLock<Weak<Shared>>,
    in_progress: AtomicBool,
    in_background: AtomicBool,
    scheduled: AtomicBool,
    last_save_s: AtomicU64,
    last_bgsave_ok: AtomicBool,
    last_bgsave_time_s: AtomicI64,
    current_start_ms: AtomicU64,
    changes_base: AtomicU64,
    last_fail_s: AtomicU64,
    saves: AtomicU64,
    keys_done: AtomicU64,
    keys_total: AtomicU64,
    last_keys: AtomicU64,
    last_bytes: AtomicU64,
    shutdown: AtomicU8,
    temp_seq: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// What the import at start did.
    pub load: OnceLock<LoadReport>,
}

/// What one save wrote.
#[derive(Debug, Clone, Copy)]
pub struct SaveDone {
    /// Keys written.
    pub keys: u64,
    /// File size.
    pub bytes: u64,
    /// Wall time, seconds.
    pub secs: f64,
}

/// The `dir` a server starts with.
pub fn default_dir(cfg: &ServerConfig) -> PathBuf {
    if let Some(d) = &cfg.rdb.dir {
        return d.clone();
    }
    if let Some(d) = &cfg.data_dir {
        return d.clone();
    }
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

/// Write commands run so far, all workers (see the module text).
fn writes_total(sh: &Shared) -> u64 {
    sh.stats
        .iter()
        .map(|s| s.writes.load(Ordering::Relaxed) + s.sets.load(Ordering::Relaxed))
        .sum()
}

fn now_s() -> u64 {
    unix_ms() / 1000
}

impl Persistence {
    /// State for a server configured by `cfg`, after the import `load`.
    pub fn new(cfg: &ServerConfig) -> Persistence {
        Persistence {
            run: Mutex::new(Run {
                dir: default_dir(cfg),
                dbfilename: cfg
                    .rdb
                    .dbfilename
                    .clone()
                    .unwrap_or_else(|| DEFAULT_DBFILENAME.into()),
                save: cfg.rdb.save.clone(),
            }),
            me: OnceLock::new(),
            in_progress: AtomicBool::new(false),
            in_background: AtomicBool::new(false),
            scheduled: AtomicBool::new(false),
            last_save_s: AtomicU64::new(now_s()),
            last_bgsave_ok: AtomicBool::new(true),
            last_bgsave_time_s: AtomicI64::new(-1),
            current_start_ms: AtomicU64::new(0),
            changes_base: AtomicU64::new(0),
            last_fail_s: AtomicU64::new(0),
            saves: AtomicU64::new(0),
            keys_done: AtomicU64::new(0),
            keys_total: AtomicU64::new(0),
            last_keys: AtomicU64::new(0),
            last_bytes: AtomicU64::new(0),
            shutdown: AtomicU8::new(SHUTDOWN_DEFAULT),
            temp_seq: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
            load: OnceLock::new(),
        }
    }

    fn run(&self) -> std::sync::MutexGuard<'_, Run> {
        self.run.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The dump's path now (`dir`/`dbfilename`).
    pub fn path(&self) -> PathBuf {
        let r = self.run();
        r.dir.join(&r.dbfilename)
    }

    /// True while a save runs.
    pub fn in_progress(&self) -> bool {
        self.in_progress.load(Ordering::Acquire)
    }

    /// Unix seconds of the last successful save (start time before one).
    pub fn last_save(&self) -> u64 {
        self.last_save_s.load(Ordering::Relaxed)
    }

    fn join_finished(&self) {
        let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let (done, running): (Vec<_>, Vec<_>) = t.drain(..).partition(|h| h.is_finished());
        *t = running;
        for h in done {
            let _ = h.join();
        }
    }
}

/// Start the snapshot-point thread (after the server's [`Shared`] is
/// built; it holds only a weak reference).
pub fn start(sh: &Arc<Shared>) -> std::io::Result<()> {
    let _ = sh.persist.me.set(Arc::downgrade(sh));
    let weak = Arc::downgrade(sh);
    let h = std::thread::Builder::new()
        .name("nibble-rdb-cron".into())
        .spawn(move || cron(weak))?;
    sh.persist
        .threads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(h);
    Ok(())
}

fn cron(weak: Weak<Shared>) {
    let mut last_check = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(SAVE_CRON_TICK_MS));
        let Some(sh) = weak.upgrade() else { return };
        if sh.stopping.load(Ordering::Acquire) {
            return;
        }
        let p = &sh.persist;
        p.join_finished();
        if p.in_progress() {
            continue;
        }
        if p.scheduled.swap(false, Ordering::AcqRel) {
            if let Err(e) = bgsave(&sh) {
                log::warn!("scheduled BGSAVE: {e}");
            }
            continue;
        }
        if last_check.elapsed() < Duration::from_secs(1) {
            continue;
        }
        last_check = Instant::now();
        let points = p.run().save.clone();
        let changes = writes_total(&sh).saturating_sub(p.changes_base.load(Ordering::Relaxed));
        let since = now_s().saturating_sub(p.last_save());
        let retry_ok = p.last_bgsave_ok.load(Ordering::Relaxed)
            || now_s().saturating_sub(p.last_fail_s.load(Ordering::Relaxed)) >= SAVE_RETRY_DELAY_S;
        if let Some((s, n)) = points
            .iter()
            .find(|(s, n)| changes >= *n && since >= *s && changes > 0)
        {
            if retry_ok {
                log::info!("{n} changes in {s} seconds ({changes} now). Saving...");
                if let Err(e) = bgsave(&sh) {
                    log::warn!("BGSAVE: {e}");
                }
            }
        }
    }
}

/// Write a snapshot to `dir`/`dbfilename` (temp file, fsync, rename,
/// fsync dir). The caller holds `in_progress`. `abort` is polled between
/// cursor steps.
fn save_now(sh: &Shared, abort: &dyn Fn() -> bool) -> Result<SaveDone, String> {
    let p = &sh.persist;
    let (dir, name) = {
        let r = p.run();
        (r.dir.clone(), r.dbfilename.clone())
    };
    let base = writes_total(sh);
    let t = Instant::now();
    p.current_start_ms.store(unix_ms(), Ordering::Relaxed);
    p.keys_done.store(0, Ordering::Relaxed);
    p.keys_total.store(sh.store.len(), Ordering::Relaxed);
    let tmp = dir.join(format!(
        "temp-{}-{}.rdb",
        std::process::id(),
        p.temp_seq.fetch_add(1, Ordering::Relaxed)
    ));
    let target = dir.join(&name);
    let res = write_snapshot(sh, &tmp, abort).and_then(|(keys, bytes)| {
        std::fs::rename(&tmp, &target)
            .map_err(|e| format!("renaming {} to {}: {e}", tmp.display(), target.display()))?;
        // The rename is durable once the directory is.
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("syncing {}: {e}", dir.display()))?;
        Ok((keys, bytes))
    });
    let secs = t.elapsed().as_secs_f64();
    p.current_start_ms.store(0, Ordering::Relaxed);
    match res {
        Ok((keys, bytes)) => {
            p.changes_base.store(base, Ordering::Relaxed);
            p.last_save_s.store(now_s(), Ordering::Relaxed);
            p.saves.fetch_add(1, Ordering::Relaxed);
            p.last_keys.store(keys, Ordering::Relaxed);
            p.last_bytes.store(bytes, Ordering::Relaxed);
            log::info!(
                "DB saved on disk: {} ({keys} keys, {bytes} bytes, {secs:.3} s)",
                target.display()
            );
            Ok(SaveDone { keys, bytes, secs })
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            p.last_fail_s.store(now_s(), Ordering::Relaxed);
            log::error!("saving {}: {e}", target.display());
            Err(e)
        }
    }
}

/// Walk the engine and write every live key to `tmp`; (keys, bytes).
fn write_snapshot(sh: &Shared, tmp: &Path, abort: &dyn Fn() -> bool) -> Result<(u64, u64), String> {
    let io = |e: std::io::Error| format!("writing {}: {e}", tmp.display());
    let f = File::create(tmp).map_err(io)?;
    let (hash_entries, hash_value_bytes) =
        crate::commands::dump::hash_listpack_limits(&sh.settings);
    let lim = Limits {
        hash_entries,
        hash_value_bytes,
    };
    let store = &sh.store;
    let mut w = Writer::new(f, lim, store.stats().used_bytes, store.len(), 0).map_err(io)?;
    let (mut cursor, mut keys) = (0u64, 0u64);
    let mut buf = Vec::new();
    // The local engine's cursor may return a key twice when the index
    // grows during the walk, and redis-server refuses a file with a key
    // twice: keys already written are remembered by a 128-bit
    // fingerprint (16 bytes a key, no copy of the key).
    let mut seen: HashSet<u128> = HashSet::with_capacity(store.len() as usize);
    loop {
        if abort() {
            return Err("aborted (the server is shutting down)".into());
        }
        let (next, batch) = store
            .scan(cursor, SAVE_SCAN_BATCH_KEYS)
            .map_err(|e| format!("engine scan: {e}"))?;
        for k in batch {
            if !seen.insert(fingerprint(&k)) {
                continue;
            }
            // Each key is read whole, as of this instant.
            let Some(m) = store
                .get_into(&k, &mut buf)
                .map_err(|e| format!("engine read: {e}"))?
            else {
                continue;
            };
            if is_collection(&m) {
                // A collection may span many engine items: read it whole
                // under its key's stripe, as a reader command would.
                let loaded = {
                    let _g = sh.keylocks.lock([k.as_slice()], false);
                    coll::load_all(sh, &k, m.flags)
                };
                let v = match loaded {
                    Ok(Some((Kind::Hash, h, _))) => RdbValue::Hash(h),
                    Ok(Some((Kind::Set, s, _))) => {
                        RdbValue::Set(s.into_iter().map(|p| p.0).collect())
                    }
                    Ok(Some((Kind::List, l, _))) => {
                        RdbValue::List(l.into_iter().map(|p| p.0).collect())
                    }
                    // `load_all` gives a zset as (member, score as 8 LE bytes).
                    Ok(Some((Kind::Zset, z, _))) => RdbValue::ZSet(
                        z.into_iter()
                            .map(|(m, s)| {
                                let b: [u8; 8] = s.as_slice().try_into().unwrap_or_default();
                                (m, f64::from_le_bytes(b))
                            })
                            .collect(),
                    ),
                    // Deleted since the scan.
                    Ok(None) => continue,
                    Err(e) => {
                        log::error!(
                            "save: key {:?}: {}; not saved",
                            crate::commands::shown(&k),
                            e.0
                        );
                        continue;
                    }
                };
                let empty = match &v {
                    RdbValue::Hash(h) => h.is_empty(),
                    RdbValue::Set(s) | RdbValue::List(s) => s.is_empty(),
                    RdbValue::ZSet(z) => z.is_empty(),
                    _ => false,
                };
                if empty {
                    continue;
                }
                w.put(&k, m.expiry_ms, &v).map_err(io)?;
            } else {
                w.put_string_key(&k, m.expiry_ms, &buf).map_err(io)?;
            }
            keys += 1;
        }
        sh.persist.keys_done.store(keys, Ordering::Relaxed);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let (f, bytes) = w.finish().map_err(io)?;
    f.sync_all().map_err(io)?;
    Ok((keys, bytes))
}

/// Two independent 64-bit SipHashes of `key`.
fn fingerprint(key: &[u8]) -> u128 {
    let h = |salt: u64| {
        let mut s = std::hash::DefaultHasher::new();
        salt.hash(&mut s);
        key.hash(&mut s);
        s.finish()
    };
    (u128::from(h(0x9e37_79b9_7f4a_7c15)) << 64) | u128::from(h(0xc2b2_ae3d_27d4_eb4f))
}

/// Lower this thread's priority (nice), best effort.
fn lower_priority() {
    // SAFETY: gettid has no arguments and cannot fail; setpriority on
    // this thread's id changes only this thread's nice value.
    let r = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, BGSAVE_NICE)
    };
    if r != 0 {
        log::debug!("bgsave: setpriority failed");
    }
}

/// Start a background save; `Err` with Redis's text if one runs.
pub fn bgsave(sh: &Shared) -> Result<(), String> {
    let p = &sh.persist;
    let Some(arc) = p.me.get().and_then(Weak::upgrade) else {
        return Err("ERR server not started".into());
    };
    if p.in_progress
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err("ERR Background save already in progress".into());
    }
    p.in_background.store(true, Ordering::Release);
    log::info!("Background saving started");
    let h = std::thread::Builder::new()
        .name("nibble-bgsave".into())
        .spawn(move || {
            lower_priority();
            let sh = &*arc;
            let stop = || sh.stopping.load(Ordering::Acquire);
            let r = save_now(sh, &stop);
            let p = &sh.persist;
            p.last_bgsave_ok.store(r.is_ok(), Ordering::Relaxed);
            if let Ok(d) = r {
                p.last_bgsave_time_s
                    .store(d.secs.round() as i64, Ordering::Relaxed);
                log::info!("Background saving terminated with success");
            }
            p.in_background.store(false, Ordering::Release);
            p.in_progress.store(false, Ordering::Release);
        });
    match h {
        Ok(h) => {
            p.threads.lock().unwrap_or_else(|e| e.into_inner()).push(h);
            Ok(())
        }
        Err(e) => {
            p.in_background.store(false, Ordering::Release);
            p.in_progress.store(false, Ordering::Release);
            p.last_bgsave_ok.store(false, Ordering::Relaxed);
            Err(format!("ERR cannot start the background save thread: {e}"))
        }
    }
}

/// A synchronous save (SAVE, SHUTDOWN SAVE, shutdown with save points).
pub fn save_sync(sh: &Shared) -> Result<SaveDone, String> {
    let p = &sh.persist;
    if p.in_progress
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err("ERR Background save already in progress".into());
    }
    let r = save_now(sh, &|| false);
    p.in_progress.store(false, Ordering::Release);
    r.map_err(|e| format!("ERR {e}"))
}

/// SAVE.
pub fn save_cmd(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    save_sync(ctx.shared)?;
    r.ok();
    Ok(())
}

/// BGSAVE \[SCHEDULE\].
pub fn bgsave_cmd(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let schedule = match a {
        [_] => false,
        [_, s] if eq(s, "schedule") => true,
        _ => return Err(crate::commands::SYNTAX.into()),
    };
    let p = &ctx.shared.persist;
    if schedule && p.in_progress() {
        p.scheduled.store(true, Ordering::Release);
        r.simple("Background saving scheduled");
        return Ok(());
    }
    bgsave(ctx.shared)?;
    r.simple("Background saving started");
    Ok(())
}

/// LASTSAVE.
pub fn lastsave_cmd(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    r.int(ctx.shared.persist.last_save() as i64);
    Ok(())
}

/// SHUTDOWN's save: with SAVE, or with snapshot points and no NOSAVE,
/// save now (an error aborts the shutdown, as in Redis).
pub fn shutdown_save(sh: &Shared, save: bool, nosave: bool) -> Result<(), String> {
    let p = &sh.persist;
    if nosave {
        p.shutdown.store(SHUTDOWN_NOSAVE, Ordering::Relaxed);
        return Ok(());
    }
    if save || !p.run().save.is_empty() {
        // A BGSAVE in progress is stopped by the shutdown; this save
        // replaces it.
        if p.in_background.load(Ordering::Acquire) {
            wait_background(sh);
        }
        save_sync(sh).map_err(|e| {
            log::error!("SHUTDOWN: {e}");
            "ERR Errors trying to SHUTDOWN. Check logs.".to_string()
        })?;
        p.shutdown.store(SHUTDOWN_SAVED, Ordering::Relaxed);
    }
    Ok(())
}

/// Wait until no background save runs.
fn wait_background(sh: &Shared) {
    while sh.persist.in_background.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// At shutdown, after the workers stopped: join the save threads (a
/// BGSAVE in progress stops at its next cursor step and removes its
/// temp file), then save if snapshot points are set and neither SHUTDOWN
/// NOSAVE nor SHUTDOWN's own save ran. With no writer left, that save is
/// a point-in-time snapshot.
pub fn at_shutdown(sh: &Shared) {
    let p = &sh.persist;
    let handles: Vec<_> = p
        .threads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain(..)
        .collect();
    for h in handles {
        let _ = h.join();
    }
    if p.shutdown.load(Ordering::Relaxed) == SHUTDOWN_DEFAULT && !p.run().save.is_empty() {
        log::info!("saving the final RDB snapshot before exiting");
        if let Err(e) = save_sync(sh) {
            log::error!("final save: {e}");
        }
    }
}

/// CONFIG GET's RDB settings.
pub fn config_get(sh: &Shared) -> Vec<(&'static str, String)> {
    let r = sh.persist.run();
    vec![
        ("dir", r.dir.display().to_string()),
        ("dbfilename", r.dbfilename.clone()),
        ("save", show_save(&r.save)),
        ("rdbcompression", "yes".into()),
        ("rdbchecksum", "yes".into()),
    ]
}

/// CONFIG SET of an RDB setting: `None` if `name` is not one.
pub fn config_set(sh: &Shared, name: &str, value: &str) -> Option<Result<(), String>> {
    let failed = |why: &str| {
        format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {why}")
    };
    let mut r = sh.persist.run();
    Some(match name {
        "dir" => match std::fs::canonicalize(value) {
            Ok(d) if d.is_dir() => {
                r.dir = d;
                Ok(())
            }
            Ok(_) => Err(failed("Not a directory")),
            Err(e) => Err(failed(&e.to_string())),
        },
        "dbfilename" => check_dbfilename(value)
            .map(|v| r.dbfilename = v)
            .map_err(|e| failed(&e)),
        "save" => parse_save(value)
            .map(|v| r.save = v)
            .map_err(|e| failed(&e)),
        "rdbcompression" | "rdbchecksum" => crate::config::parse_yes_no(name, value)
            .map(|_| ())
            .map_err(|e| failed(&e)),
        _ => return None,
    })
}

/// The INFO persistence section.
pub fn info(sh: &Shared) -> String {
    let p = &sh.persist;
    let start = p.current_start_ms.load(Ordering::Relaxed);
    let bg = p.in_background.load(Ordering::Acquire);
    let current = if bg && start > 0 {
        (unix_ms().saturating_sub(start) / 1000) as i64
    } else {
        -1
    };
    let (done, total) = if start > 0 {
        (
            p.keys_done.load(Ordering::Relaxed),
            p.keys_total.load(Ordering::Relaxed),
        )
    } else {
        (0, 0)
    };
    let l = p.load.get().cloned().unwrap_or_default();
    let mut o = String::new();
    let _ = write!(
        o,
        "# Persistence\r\nloading:0\r\nasync_loading:0\r\ncurrent_cow_peak:0\r\ncurrent_cow_size:0\r\ncurrent_cow_size_age:0\r\ncurrent_fork_perc:0.00\r\ncurrent_save_keys_processed:{done}\r\ncurrent_save_keys_total:{total}\r\nrdb_changes_since_last_save:{}\r\nrdb_bgsave_in_progress:{}\r\nrdb_last_save_time:{}\r\nrdb_last_bgsave_status:{}\r\nrdb_last_bgsave_time_sec:{}\r\nrdb_current_bgsave_time_sec:{current}\r\nrdb_saves:{}\r\nrdb_last_cow_size:0\r\nrdb_last_load_keys_expired:{}\r\nrdb_last_load_keys_loaded:{}\r\nrdb_last_load_keys_unsupported:{}\r\nrdb_last_save_keys:{}\r\nrdb_last_save_bytes:{}\r\nrdb_snapshot:per-key\r\naof_enabled:0\r\naof_rewrite_in_progress:0\r\naof_rewrite_scheduled:0\r\naof_last_rewrite_time_sec:-1\r\naof_current_rewrite_time_sec:-1\r\naof_last_bgrewrite_status:ok\r\naof_rewrites:0\r\naof_last_write_status:ok\r\nmodule_fork_in_progress:0\r\nmodule_fork_last_cow_size:0\r\n\r\n",
        writes_total(sh).saturating_sub(p.changes_base.load(Ordering::Relaxed)),
        u8::from(bg),
        p.last_save(),
        if p.last_bgsave_ok.load(Ordering::Relaxed) { "ok" } else { "err" },
        p.last_bgsave_time_s.load(Ordering::Relaxed),
        p.saves.load(Ordering::Relaxed),
        l.expired,
        l.loaded,
        l.unsupported_total(),
        p.last_keys.load(Ordering::Relaxed),
        p.last_bytes.load(Ordering::Relaxed),
    );
    o
}
