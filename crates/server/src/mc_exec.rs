//! memcached command execution over the engine.
//!
//! memcached's verbs map onto the engine's conditional writes one to one:
//! `set` is an unconditional put, `add` is `IfAbsent`, `replace` is
//! `IfPresent`, `cas` is `IfVersion(cas unique)` (the engine's item version
//! is the cas unique `gets` reports). `append`, `prepend`, `incr` and
//! `decr` read, compute, and write back under `IfVersion`, retrying when
//! another client got there first, so they are atomic like memcached's.
//!
//! Expiry follows memcached: 0 = never, a negative value = already
//! expired, up to 30 days = seconds from now, above that = an absolute Unix
//! time in seconds. Client flags are stored whole in the item's 32-bit
//! flags; the top sixteen values (4294967280 and up) are reserved for Redis types (see
//! `types`) and refused here.
//!
//! Key stripes: every memcached write (store verbs, delete, incr/decr,
//! touch, a get that touches, the meta writes) runs under its key's
//! stripe held exclusively, like a RESP write command (see
//! [`crate::keylock`]), so an EXEC or a multi-item collection update never
//! sees one half done, and a WATCH on the key sees it. `flush_all` takes
//! every stripe. Plain reads take none (an engine read is atomic).
//!
//! Errors: a full store answers `SERVER_ERROR out of memory storing
//! object`, a value over the limit `SERVER_ERROR object too large for
//! cache`; reads, deletes and touches keep working when the store is full.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use nibble::{Condition, Error as StoreError, Expiry, PutOptions};

use crate::commands::admin::flush;
use crate::keylock::KeyGuard;
use crate::memcache::{McCommand, Store, StoreVerb};
use crate::resp::push_u64;
use crate::state::{rss_bytes, unix_ms, Shared, WorkerStats};
use crate::types::{is_collection, is_reserved_flags};

/// memcached's "relative vs absolute" threshold: 30 days in seconds.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;
/// The version string.
pub const MC_VERSION: &str = concat!("1.6.0-nibble-", env!("CARGO_PKG_VERSION"));

/// Convert a memcached exptime to an absolute Unix ms (None = never).
pub fn expiry_of(exptime: i64) -> Option<u64> {
    if exptime == 0 {
        return None;
    }
    if exptime < 0 {
        return Some(1);
    }
    if exptime > REALTIME_MAXDELTA {
        return Some((exptime as u64).saturating_mul(1000).max(1));
    }
    Some(unix_ms() + exptime as u64 * 1000)
}

fn store_err(e: &StoreError) -> &'static str {
    match e {
        StoreError::OutOfMemory { .. } => "SERVER_ERROR out of memory storing object",
        StoreError::ValueTooLarge { .. } => "SERVER_ERROR object too large for cache",
        StoreError::BadKey { .. } => "CLIENT_ERROR bad command line format",
        _ => "SERVER_ERROR internal error",
    }
}

fn line(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The stripes a text or meta command runs under: its keys', exclusively,
/// if it writes.
fn lock<'s>(shared: &'s Shared, cmd: &McCommand<'_>) -> KeyGuard<'s> {
    let locks = &shared.keylocks;
    match cmd {
        McCommand::Store(a) => locks.lock([a.key], true),
        McCommand::Delete { key, .. }
        | McCommand::Arith { key, .. }
        | McCommand::Touch { key, .. } => locks.lock([*key], true),
        McCommand::Get {
            keys,
            touch: Some(_),
            ..
        } => locks.lock(keys.iter().copied(), true),
        McCommand::Meta(m) if crate::mc_meta::writes(m) => locks.lock([&m.key[..]], true),
        _ => KeyGuard::none(),
    }
}

/// Execute one command; returns true if the connection should close.
pub fn execute(
    shared: &Shared,
    stats: &WorkerStats,
    cmd: McCommand<'_>,
    out: &mut Vec<u8>,
    buf: &mut Vec<u8>,
) -> bool {
    WorkerStats::bump(&stats.commands, 1);
    let store = &shared.store;
    let _stripes = lock(shared, &cmd);
    let (reply, noreply): (Cow<'static, str>, bool) = match cmd {
        McCommand::Store(a) => {
            WorkerStats::bump(&stats.sets, 1);
            let r: Cow<'static, str> = if is_reserved_flags(a.flags) {
                format!(
                    "CLIENT_ERROR flags value {} is reserved by this server",
                    a.flags
                )
                .into()
            } else {
                storage(shared, &a, buf).into()
            };
            (r, a.noreply)
        }
        McCommand::Get {
            keys,
            with_cas,
            touch,
        } => {
            // A touch that fails (no room to give the item its TTL on a
            // store that refuses instead of evicting) fails the command:
            // the values already written for it are taken back.
            let start = out.len();
            let mut failed = None;
            for k in keys {
                let found = match store.get_into(k, buf) {
                    Ok(Some(m)) => {
                        if let Some(t) = touch {
                            if let Err(e) = store.set_expiry(k, expiry_of(t)) {
                                failed = Some(store_err(&e));
                                break;
                            }
                        }
                        out.extend_from_slice(b"VALUE ");
                        out.extend_from_slice(k);
                        out.push(b' ');
                        push_u64(out, u64::from(m.flags));
                        out.push(b' ');
                        push_u64(out, buf.len() as u64);
                        if with_cas {
                            out.push(b' ');
                            push_u64(out, m.version);
                        }
                        out.extend_from_slice(b"\r\n");
                        out.extend_from_slice(buf);
                        out.extend_from_slice(b"\r\n");
                        true
                    }
                    _ => false,
                };
                let c = if found { &stats.hits } else { &stats.misses };
                c.fetch_add(1, Ordering::Relaxed);
            }
            match failed {
                Some(e) => {
                    out.truncate(start);
                    (e.into(), false)
                }
                None => ("END".into(), false),
            }
        }
        McCommand::Delete { key, noreply } => {
            let r = match store.delete(key) {
                Ok(true) => "DELETED",
                Ok(false) => "NOT_FOUND",
                Err(e) => store_err(&e),
            };
            (r.into(), noreply)
        }
        McCommand::Arith {
            key,
            delta,
            incr,
            noreply,
        } => (arith(shared, key, delta, incr, buf), noreply),
        McCommand::Touch {
            key,
            exptime,
            noreply,
        } => {
            let r = match store.set_expiry(key, expiry_of(exptime)) {
                Ok(true) => "TOUCHED",
                Ok(false) => "NOT_FOUND",
                Err(e) => store_err(&e),
            };
            (r.into(), noreply)
        }
        McCommand::FlushAll { noreply, .. } => {
            let r = match flush(shared) {
                Ok(()) => "OK",
                Err(e) => store_err(&e),
            };
            (r.into(), noreply)
        }
        McCommand::Version => (format!("VERSION {MC_VERSION}").into(), false),
        McCommand::Stats => {
            stats_text(shared, out);
            ("END".into(), false)
        }
        McCommand::Verbosity { noreply } => ("OK".into(), noreply),
        McCommand::Quit => return true,
        McCommand::TooLarge { .. } => ("SERVER_ERROR object too large for cache".into(), false),
        McCommand::Error(e) | McCommand::Reply(e) => (e.into(), false),
        McCommand::Silent => return false,
        McCommand::Meta(m) => {
            if let Some(hit) = crate::mc_meta::execute(shared, &m, out, buf) {
                let c = if hit { &stats.hits } else { &stats.misses };
                c.fetch_add(1, Ordering::Relaxed);
            } else if m.verb == crate::mc_meta::MetaVerb::Set {
                WorkerStats::bump(&stats.sets, 1);
            }
            return false;
        }
    };
    if !noreply {
        line(out, &reply);
    }
    false
}

fn storage(shared: &Shared, a: &Store<'_>, buf: &mut Vec<u8>) -> &'static str {
    let &Store {
        verb,
        key,
        flags,
        exptime,
        data,
        cas,
        noreply: _,
    } = a;
    let store = &shared.store;
    let expiry = expiry_of(exptime).map_or(Expiry::Never, Expiry::At);
    let condition = match verb {
        StoreVerb::Set => Condition::Always,
        StoreVerb::Add => Condition::IfAbsent,
        StoreVerb::Replace => Condition::IfPresent,
        StoreVerb::Cas => Condition::IfVersion(cas),
        StoreVerb::Append | StoreVerb::Prepend => {
            return concat(shared, key, data, verb == StoreVerb::Append, buf)
        }
    };
    match store.put_with(
        key,
        data,
        PutOptions {
            condition,
            expiry,
            flags,
        },
    ) {
        Ok(_) => "STORED",
        Err(StoreError::Exists) => "NOT_STORED",
        Err(StoreError::NotFound) if verb == StoreVerb::Cas => "NOT_FOUND",
        Err(StoreError::NotFound) => "NOT_STORED",
        Err(StoreError::VersionMismatch { .. }) => "EXISTS",
        Err(e) => store_err(&e),
    }
}

fn concat(
    shared: &Shared,
    key: &[u8],
    data: &[u8],
    append: bool,
    buf: &mut Vec<u8>,
) -> &'static str {
    let store = &shared.store;
    let max = shared.settings.max_bulk();
    loop {
        let m = match store.get_into(key, buf) {
            Ok(Some(m)) => m,
            Ok(None) => return "NOT_STORED",
            Err(e) => return store_err(&e),
        };
        if is_collection(&m) {
            return "CLIENT_ERROR cannot append to a Redis hash";
        }
        if buf.len() + data.len() > max {
            return "SERVER_ERROR object too large for cache";
        }
        let v = joined(buf, data, append);
        match store.put_with(
            key,
            &v,
            PutOptions {
                condition: Condition::IfVersion(m.version),
                expiry: Expiry::Keep,
                flags: m.flags,
            },
        ) {
            Ok(_) => return "STORED",
            Err(e) if crate::commands::is_race(&e) => continue,
            Err(e) => return store_err(&e),
        }
    }
}

fn arith(
    shared: &Shared,
    key: &[u8],
    delta: u64,
    incr: bool,
    buf: &mut Vec<u8>,
) -> Cow<'static, str> {
    let store = &shared.store;
    loop {
        let m = match store.get_into(key, buf) {
            Ok(Some(m)) => m,
            Ok(None) => return "NOT_FOUND".into(),
            Err(e) => return store_err(&e).into(),
        };
        let Some(new) = counter_step(buf, &m, incr, delta) else {
            return "CLIENT_ERROR cannot increment or decrement non-numeric value".into();
        };
        let s = new.to_string();
        match store.put_with(
            key,
            s.as_bytes(),
            PutOptions {
                condition: Condition::IfVersion(m.version),
                expiry: Expiry::Keep,
                flags: m.flags,
            },
        ) {
            Ok(_) => return s.into(),
            Err(e) if crate::commands::is_race(&e) => continue,
            Err(e) => return store_err(&e).into(),
        }
    }
}

fn stats_text(shared: &Shared, out: &mut Vec<u8>) {
    for (k, v) in stats_pairs(shared) {
        let _ = write!(Wr(out), "STAT {k} {v}\r\n");
    }
}

/// The general statistics, as (name, value) pairs.
pub fn stats_pairs(shared: &Shared) -> Vec<(&'static str, String)> {
    let st = shared.store.stats();
    let t = shared.totals();
    let now = unix_ms() / 1000;
    vec![
        ("pid", std::process::id().to_string()),
        ("uptime", shared.started.elapsed().as_secs().to_string()),
        ("time", now.to_string()),
        ("version", MC_VERSION.into()),
        ("pointer_size", "64".into()),
        ("rusage_maxrss", (rss_bytes() / 1024).to_string()),
        (
            "curr_connections",
            shared.connected.load(Ordering::Relaxed).to_string(),
        ),
        ("total_connections", t.connections.to_string()),
        ("rejected_connections", t.rejected.to_string()),
        ("cmd_get", (t.hits + t.misses).to_string()),
        ("cmd_set", t.sets.to_string()),
        ("get_hits", t.hits.to_string()),
        ("get_misses", t.misses.to_string()),
        ("bytes_read", t.net_in.to_string()),
        ("bytes_written", t.net_out.to_string()),
        ("limit_maxbytes", st.capacity_bytes.to_string()),
        ("threads", shared.config.threads.to_string()),
        ("bytes", st.live_bytes.to_string()),
        ("curr_items", st.items.to_string()),
        ("evictions", st.evicted_items.to_string()),
        ("expired_unfetched", st.expired_unfetched.to_string()),
    ]
}

/// `fmt::Write` over a byte vector.
pub(crate) struct Wr<'a>(pub(crate) &'a mut Vec<u8>);

impl std::fmt::Write for Wr<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// `stored` with `data` after it (append) or before it (prepend).
pub(crate) fn joined(stored: &[u8], data: &[u8], append: bool) -> Vec<u8> {
    let (first, second) = if append {
        (stored, data)
    } else {
        (data, stored)
    };
    let mut v = Vec::with_capacity(stored.len() + data.len());
    v.extend_from_slice(first);
    v.extend_from_slice(second);
    v
}

/// memcached's incr/decr on a stored value: the value must be an unsigned
/// decimal (trailing spaces allowed, as memcached pads shrunk values) and
/// not a Redis hash; incr wraps at 2^64, decr stops at 0. `None`: not a
/// number (the caller's `CLIENT_ERROR` / `NON_NUMERIC`).
pub(crate) fn counter_step(
    stored: &[u8],
    meta: &nibble::ItemMeta,
    incr: bool,
    delta: u64,
) -> Option<u64> {
    if is_collection(meta) {
        return None;
    }
    let cur = std::str::from_utf8(stored)
        .ok()
        .map(|s| s.trim_end())
        .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())?;
    Some(if incr {
        cur.wrapping_add(delta)
    } else {
        cur.saturating_sub(delta)
    })
}
