//! Connection and server commands: PING, HELLO, AUTH, CLIENT, COMMAND,
//! CONFIG, INFO, DBSIZE, FLUSHALL, SHUTDOWN, DEBUG POPULATE, TIME.
//! (SAVE, BGSAVE, LASTSAVE and INFO persistence are in `crate::rdb`.)
//!
//! DBSIZE and INFO keyspace count live keys by a cursor walk, so an item
//! that expired but was not reclaimed yet is never counted (Redis may
//! count one until its expiry cycle runs), and FLUSHALL deletes expired
//! items too. INFO's CPU section is getrusage(2) of the process and its
//! children.
//!
//! INFO tells the truth about memory: `used_memory` is what the engine
//! holds (blocks in segments, the index, fixed metadata), `used_memory_rss`
//! is the process's VmRSS from /proc/self/status, and
//! `mem_fragmentation_ratio` is their quotient. `maxmemory` is the engine's
//! capacity, which bounds RSS (the engine maps at most that much).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::{eq, int_arg, lookup, CmdError, CmdResult, Ctx, Spec, COMMANDS, SYNTAX};
use crate::glob;
use crate::resp::{Proto, Reply};
use crate::state::rss_bytes;

/// Server version reported by INFO and HELLO.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The Redis version we answer to (for clients that check features).
pub const REDIS_VERSION: &str = "7.2.0";

/// PING \[message\].
pub fn ping(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if a.len() <= 2 && super::pubsub::resp2_subscriber(ctx, r) {
        // A RESP2 subscriber's PING answers in the shape of a message.
        r.array(2);
        r.bulk(b"pong");
        r.bulk(a.get(1).copied().unwrap_or(b""));
        return Ok(());
    }
    match a.len() {
        1 => r.simple("PONG"),
        2 => r.bulk(a[1]),
        _ => return Err("ERR wrong number of arguments for 'ping' command".into()),
    }
    Ok(())
}

/// ECHO message.
pub fn echo(_ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    r.bulk(a[1]);
    Ok(())
}

/// QUIT.
pub fn quit(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    ctx.sess.close = true;
    r.ok();
    Ok(())
}

fn check_password(ctx: &mut Ctx, user: &[u8], pass: &[u8]) -> Result<(), CmdError> {
    let Some(want) = ctx.shared.settings.password() else {
        return Err("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?".into());
    };
    if !(crate::auth::ct_eq(user, b"default") & crate::auth::ct_eq(pass, want.as_bytes())) {
        ctx.sess.auth_failed("AUTH");
        return Err("WRONGPASS invalid username-password pair or user is disabled.".into());
    }
    ctx.sess.authed = true;
    Ok(())
}

/// AUTH \[username\] password.
pub fn auth(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    match a.len() {
        2 => check_password(ctx, b"default", a[1])?,
        3 => check_password(ctx, a[1], a[2])?,
        _ => return Err(SYNTAX.into()),
    }
    r.ok();
    Ok(())
}

/// HELLO [protover [AUTH user pass] [SETNAME name]].
pub fn hello(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let mut proto = ctx.sess.proto;
    if a.len() >= 2 {
        proto = match int_arg(a[1]) {
            Ok(2) => Proto::Resp2,
            Ok(3) => Proto::Resp3,
            Ok(_) => return Err("NOPROTO unsupported protocol version".into()),
            Err(_) => return Err("ERR Protocol version is not an integer or out of range".into()),
        };
    }
    let mut i = 2;
    let mut name = None;
    while i < a.len() {
        if eq(a[i], "auth") && i + 2 < a.len() {
            check_password(ctx, a[i + 1], a[i + 2])?;
            i += 3;
        } else if eq(a[i], "setname") && i + 1 < a.len() {
            name = Some(a[i + 1]);
            i += 2;
        } else {
            return Err(
                format!("ERR Syntax error in HELLO option '{}'", super::shown(a[i])).into(),
            );
        }
    }
    if !ctx.sess.authed {
        return Err("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".into());
    }
    if let Some(n) = name {
        set_name(ctx, n)?;
    }
    ctx.sess.proto = proto;
    ctx.sess
        .info
        .resp
        .store(if proto == Proto::Resp3 { 3 } else { 2 }, Ordering::Relaxed);
    r.proto = proto;
    r.map(7);
    r.bulk(b"server");
    r.bulk(b"redis");
    r.bulk(b"version");
    r.bulk(REDIS_VERSION.as_bytes());
    r.bulk(b"proto");
    r.int(if proto == Proto::Resp3 { 3 } else { 2 });
    r.bulk(b"id");
    r.int(ctx.sess.info.id as i64);
    r.bulk(b"mode");
    r.bulk(b"standalone");
    r.bulk(b"role");
    if ctx.shared.replica.primary().is_some() {
        r.bulk(b"replica");
    } else {
        r.bulk(b"master");
    }
    r.bulk(b"modules");
    r.array(0);
    Ok(())
}

/// SELECT 0.
pub fn select(_ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    match int_arg(a[1])? {
        0 => r.ok(),
        _ => return Err("ERR DB index is out of range".into()),
    }
    Ok(())
}

fn set_name(ctx: &mut Ctx, n: &[u8]) -> CmdResult {
    if n.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
        return Err(
            "ERR Client names cannot contain spaces, newlines or special characters.".into(),
        );
    }
    ctx.sess
        .info
        .text
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .name = String::from_utf8_lossy(n).into_owned();
    Ok(())
}

/// CLIENT SETNAME|GETNAME|SETINFO|ID|INFO|LIST|UNBLOCK.
pub fn client(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let sub = a[1];
    let info = ctx.sess.info.clone();
    if eq(sub, "setname") && a.len() == 3 {
        set_name(ctx, a[2])?;
        r.ok();
    } else if eq(sub, "getname") && a.len() == 2 {
        let n = info
            .text
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .name
            .clone();
        if n.is_empty() {
            r.null();
        } else {
            r.bulk(n.as_bytes());
        }
    } else if eq(sub, "setinfo") && a.len() == 4 {
        let v = String::from_utf8_lossy(a[3]).into_owned();
        if v.contains([' ', '\n', '\r']) {
            return Err(
                "ERR lib-name and lib-ver cannot contain spaces, newlines or special characters."
                    .into(),
            );
        }
        let mut t = info.text.lock().unwrap_or_else(|e| e.into_inner());
        if eq(a[2], "lib-name") {
            t.lib_name = v;
        } else if eq(a[2], "lib-ver") {
            t.lib_ver = v;
        } else {
            return Err(format!("ERR Unrecognized option '{}'", super::shown(a[2])).into());
        }
        drop(t);
        r.ok();
    } else if eq(sub, "id") && a.len() == 2 {
        r.int(info.id as i64);
    } else if eq(sub, "info") && a.len() == 2 {
        r.verbatim(&(info.line() + "\n"));
    } else if eq(sub, "unblock") && (a.len() == 3 || a.len() == 4) {
        let id = super::int_arg(a[2])?;
        let error = match a.get(3) {
            None => false,
            Some(w) if eq(w, "timeout") => false,
            Some(w) if eq(w, "error") => true,
            Some(_) => {
                return Err("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR".into());
            }
        };
        let unblocked = ctx
            .shared
            .client_list()
            .into_iter()
            .find(|c| c.id as i64 == id)
            .and_then(|c| c.blocked.lock().clone())
            .is_some_and(|w| w.unblock(error));
        r.int(i64::from(unblocked));
    } else if eq(sub, "list") {
        let ids = client_list_filter(&a[2..])?;
        let mut s = String::new();
        for c in ctx.shared.client_list() {
            if ids
                .as_ref()
                .is_some_and(|ids| !ids.contains(&(c.id as i64)))
            {
                continue;
            }
            s.push_str(&c.line());
            s.push('\n');
        }
        r.verbatim(&s);
    } else {
        return Err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try CLIENT HELP.",
            super::shown(sub)
        )
        .into());
    }
    Ok(())
}

/// CLIENT LIST's options, `[TYPE type] [ID id ...]`: `None` lists every
/// client, `Some(ids)` those ids only (an empty list: none, as for a type
/// other than `normal`; every client here is a normal one).
fn client_list_filter(o: &[&[u8]]) -> Result<Option<Vec<i64>>, CmdError> {
    match o {
        [] => Ok(None),
        [t, ty] if eq(t, "type") => {
            let ty = String::from_utf8_lossy(ty).to_ascii_lowercase();
            match ty.as_str() {
                "normal" => Ok(None),
                "master" | "replica" | "slave" | "pubsub" => Ok(Some(Vec::new())),
                _ => Err(format!("ERR Unknown client type '{ty}'").into()),
            }
        }
        [i, ids @ ..] if eq(i, "id") && !ids.is_empty() => ids
            .iter()
            .map(|b| super::parse_i64(b).ok_or(CmdError::from("ERR Invalid client ID")))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        _ => Err(SYNTAX.into()),
    }
}

fn command_info(s: &Spec, r: &mut Reply) {
    r.array(10);
    r.bulk(s.name.as_bytes());
    r.int(i64::from(s.arity));
    r.set(s.flags.len());
    for f in s.flags {
        r.simple(f);
    }
    r.int(i64::from(s.keys.0));
    r.int(i64::from(s.keys.1));
    r.int(i64::from(s.keys.2));
    r.set(1);
    r.simple(&format!("@{}", s.group));
    r.set(0);
    r.array(0);
    r.array(0);
}

/// COMMAND [COUNT | LIST | INFO name... | DOCS name...].
pub fn command(_ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if a.len() == 1 {
        r.array(COMMANDS.len());
        for s in COMMANDS {
            command_info(s, r);
        }
        return Ok(());
    }
    let sub = a[1];
    let named = |a: &[&[u8]]| -> Vec<Option<&'static Spec>> {
        if a.len() > 2 {
            a[2..].iter().map(|n| lookup(n)).collect()
        } else {
            COMMANDS.iter().map(Some).collect()
        }
    };
    if eq(sub, "count") {
        r.int(COMMANDS.len() as i64);
    } else if eq(sub, "list") {
        r.bulks(COMMANDS.iter().map(|s| s.name));
    } else if eq(sub, "info") {
        let specs = named(a);
        r.array(specs.len());
        for s in specs {
            match s {
                Some(s) => command_info(s, r),
                None => r.null_array(),
            }
        }
    } else if eq(sub, "docs") {
        let specs: Vec<&Spec> = named(a).into_iter().flatten().collect();
        r.map(specs.len());
        for s in specs {
            r.bulk(s.name.as_bytes());
            r.map(3);
            r.bulk(b"summary");
            r.bulk(s.summary.as_bytes());
            r.bulk(b"since");
            r.bulk(b"1.0.0");
            r.bulk(b"group");
            r.bulk(s.group.as_bytes());
        }
    } else {
        return Err(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            super::shown(sub)
        )
        .into());
    }
    Ok(())
}

/// CONFIG GET pattern... | SET name value ... | RESETSTAT.
pub fn config(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let sub = a[1];
    let settings = &ctx.shared.settings;
    if eq(sub, "get") && a.len() >= 3 {
        let mut all = settings.get_all(&ctx.shared.config);
        all.extend(crate::rdb::persist::config_get(ctx.shared));
        all.extend(crate::replica::config_get(ctx.shared));
        all.push((
            "appendfsync",
            ctx.shared.durability.policy().name().to_string(),
        ));
        // As redis-server answers it, but only to the exact name: a glob
        // such as `*` does not carry the password into dumps and logs.
        if a[2..].iter().any(|p| eq(p, "requirepass")) {
            all.push(("requirepass", settings.password().unwrap_or_default()));
        }
        let hits: Vec<&(&str, String)> = all
            .iter()
            .filter(|(n, _)| {
                a[2..]
                    .iter()
                    .any(|p| glob::matches(&p.to_ascii_lowercase(), n.as_bytes()))
            })
            .collect();
        r.map(hits.len());
        for (n, v) in hits {
            r.bulk(n.as_bytes());
            r.bulk(v.as_bytes());
        }
    } else if eq(sub, "set") && a.len() >= 4 && a.len() & 1 == 0 {
        for kv in a[2..].chunks(2) {
            let name = String::from_utf8_lossy(kv[0]).to_ascii_lowercase();
            let value = String::from_utf8_lossy(kv[1]).into_owned();
            if let Some(done) = crate::rdb::persist::config_set(ctx.shared, &name, &value) {
                done?;
                continue;
            }
            if let Some(done) = crate::replica::config_set(ctx.shared, &name, &value) {
                done?;
                continue;
            }
            if name == "appendfsync" {
                let failed = |why: &str| {
                    format!("ERR CONFIG SET failed (possibly related to argument 'appendfsync') - {why}")
                };
                let p: crate::durability::Appendfsync =
                    value.parse().map_err(|e: String| failed(&e))?;
                let d = &ctx.shared.durability;
                d.set_policy(ctx.shared, p).map_err(|e| failed(&e))?;
                continue;
            }
            settings.set(&ctx.shared.config, &name, &value)?;
            if name == "maxmemory-policy" {
                ctx.shared.store.set_eviction(settings.policy().engine())?;
            }
        }
        r.ok();
    } else if eq(sub, "resetstat") && a.len() == 2 {
        for s in &ctx.shared.stats {
            for c in [
                &s.commands,
                &s.hits,
                &s.misses,
                &s.sets,
                &s.net_in,
                &s.net_out,
                &s.rejected_calls,
            ] {
                c.store(0, Ordering::Relaxed);
            }
        }
        r.ok();
    } else {
        return Err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try CONFIG HELP.",
            super::shown(sub)
        )
        .into());
    }
    Ok(())
}

/// The INFO text for `section` ("" or "all"/"everything"/"default" = all).
pub fn info_text(ctx: &Ctx, section: &str) -> String {
    let sh = ctx.shared;
    let st = sh.store.stats();
    let t = sh.totals();
    let all = matches!(section, "" | "all" | "everything" | "default");
    let want = |s: &str| all || section.eq_ignore_ascii_case(s);
    let mut o = String::new();
    let uptime = sh.started.elapsed().as_secs();
    if want("server") {
        let (port, mc) = *sh.ports.lock().unwrap_or_else(|e| e.into_inner());
        let _ = write!(
            o,
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nnibble_version:{VERSION}\r\nredis_mode:standalone\r\nos:Linux\r\narch_bits:64\r\nprocess_id:{}\r\ntcp_port:{port}\r\nmemcached_port:{mc}\r\nengine:{}\r\nengine_mode:{}\r\nepoch_scheme:{}\r\n",
            std::process::id(),
            st.engine,
            st.mode,
            st.epoch,
        );
        if let Some(s) = sh.store.shared() {
            let _ = write!(
                o,
                "data_dir:{}\r\nstore_start:{}\r\nstore_open_ms:{:.1}\r\nstore_processes:{}\r\n",
                s.dir.display(),
                s.start,
                s.open_ms,
                st.processes
            );
        }
        let _ = write!(
            o,
            "thread_model:thread-per-core\r\nio_threads_active:{}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\n\r\n",
            sh.config.threads,
            uptime / 86400
        );
    }
    if want("clients") {
        let _ = write!(
            o,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:{}\r\n\r\n",
            sh.connected.load(Ordering::Relaxed),
            sh.settings.maxclients.load(Ordering::Relaxed),
            sh.blocking.blocked()
        );
    }
    if want("memory") {
        let used = st.used_bytes;
        let rss = rss_bytes();
        let ratio = if used > 0 {
            rss as f64 / used as f64
        } else {
            0.0
        };
        let _ = write!(
            o,
            "# Memory\r\nused_memory:{used}\r\nused_memory_human:{:.2}M\r\nused_memory_rss:{rss}\r\nused_memory_rss_human:{:.2}M\r\nused_memory_dataset:{}\r\nused_memory_index:{}\r\nmaxmemory:{}\r\nmaxmemory_human:{:.2}M\r\nmaxmemory_policy:{}\r\nmem_fragmentation_ratio:{ratio:.2}\r\nnibble_pool_bytes:{}\r\nnibble_blocks_total:{}\r\nnibble_blocks_in_use:{}\r\nnibble_blocks_free_resident:{}\r\nnibble_blocks_released:{}\r\nnibble_blocks_mapped_ahead:{}\r\nnibble_segments_closed:{}\r\nnibble_compaction_passes:{}\r\nnibble_bytes_relocated:{}\r\nnibble_eviction_passes:{}\r\nnibble_evicted_bytes:{}\r\nnibble_write_waits:{}\r\nnibble_write_wait_us:{}\r\n\r\n",
            used as f64 / 1048576.0,
            rss as f64 / 1048576.0,
            st.live_bytes,
            st.index_bytes,
            st.capacity_bytes,
            st.capacity_bytes as f64 / 1048576.0,
            sh.settings.policy().name(),
            st.pool_bytes,
            st.blocks_total,
            st.blocks_in_use,
            st.blocks_free_resident,
            st.blocks_released,
            st.blocks_mapped_ahead,
            st.segments_closed,
            st.compaction_passes,
            st.bytes_relocated,
            st.eviction_passes,
            st.evicted_bytes,
            st.write_waits,
            st.write_wait_us,
        );
    }
    if want("persistence") {
        o.push_str(
            &sh.durability
                .info_section(sh, crate::rdb::persist::info(sh)),
        );
    }
    if want("stats") {
        let _ = write!(
            o,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\ntotal_net_input_bytes:{}\r\ntotal_net_output_bytes:{}\r\nprotocol_errors:{}\r\nexpired_keys:{}\r\nexpired_segments:{}\r\nexpiry_bytes_read:{}\r\nevicted_keys:{}\r\nexpired_reclaimed:{}\r\ndamaged_objects:{}\r\nrejected_calls:{}\r\nmigrated_clients:{}\r\n\r\n",
            t.connections, t.commands, t.rejected, t.hits, t.misses, t.net_in, t.net_out, t.proto_errors, st.expired_reclaimed, st.expired_segments, st.expiry_bytes_read, st.evicted_items, st.expired_reclaimed, st.damaged_objects, t.rejected_calls, t.moved_in
        );
    }
    if want("replication") {
        o.push_str(&crate::replica::info(sh));
    }
    if want("cpu") {
        let (s, u, cs, cu) = cpu_times();
        let _ = write!(
            o,
            "# CPU\r\nused_cpu_sys:{s:.6}\r\nused_cpu_user:{u:.6}\r\nused_cpu_sys_children:{cs:.6}\r\nused_cpu_user_children:{cu:.6}\r\n\r\n"
        );
    }
    if want("keyspace") {
        o.push_str("# Keyspace\r\n");
        match keyspace(&sh.store, true) {
            Ok(k) if k.keys > 0 => {
                let _ = write!(
                    o,
                    "db0:keys={},expires={},avg_ttl={}\r\n",
                    k.keys, k.expires, k.avg_ttl_ms
                );
            }
            _ => {}
        }
        o.push_str("\r\n");
    }
    o
}

/// CPU seconds (system, user) of this process and of its waited-for
/// children, from getrusage(2).
fn cpu_times() -> (f64, f64, f64, f64) {
    let get = |who| {
        // SAFETY: rusage is integers and timevals, for which all-zero
        // bytes are a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a live, writable rusage owned by this frame;
        // getrusage writes only that struct.
        if unsafe { libc::getrusage(who, &mut ru) } != 0 {
            return (0.0, 0.0);
        }
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        (t(ru.ru_stime), t(ru.ru_utime))
    };
    let (s, u) = get(libc::RUSAGE_SELF);
    let (cs, cu) = get(libc::RUSAGE_CHILDREN);
    (s, u, cs, cu)
}

/// INFO [section...].
pub fn info(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let mut text = String::new();
    if a.len() == 1 {
        text = info_text(ctx, "");
    } else {
        for s in &a[1..] {
            text.push_str(&info_text(
                ctx,
                &String::from_utf8_lossy(s).to_ascii_lowercase(),
            ));
        }
    }
    r.verbatim(&text);
    Ok(())
}

/// DBSIZE: the live keys (a cursor walk, so an expired item the engine
/// has not reclaimed yet is not counted).
pub fn dbsize(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    r.int(keyspace(&ctx.shared.store, false)?.keys as i64);
    Ok(())
}

/// What INFO keyspace reports.
#[derive(Default)]
pub struct Keyspace {
    /// Live keys.
    pub keys: u64,
    /// Live keys with an expiry.
    pub expires: u64,
    /// Mean time to live of those, ms.
    pub avg_ttl_ms: u64,
}

/// Count the live keys (and, with `ttls`, those with an expiry and their
/// mean TTL) by a cursor walk; expired items are skipped.
pub fn keyspace(store: &crate::engine::Engine, ttls: bool) -> Result<Keyspace, CmdError> {
    let mut k = Keyspace::default();
    let mut ttl_sum: u128 = 0;
    let now = crate::state::unix_ms();
    let mut cursor = 0;
    loop {
        let (next, keys) = store.scan(cursor, 1024)?;
        if !ttls {
            k.keys += keys.len() as u64;
        } else {
            for key in keys {
                let Some(m) = store.meta(&key)? else { continue };
                k.keys += 1;
                if let Some(at) = m.expiry_ms {
                    k.expires += 1;
                    ttl_sum += u128::from(at.saturating_sub(now));
                }
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    if k.expires > 0 {
        k.avg_ttl_ms = (ttl_sum / u128::from(k.expires)) as u64;
    }
    Ok(k)
}

/// Delete every key (FLUSHALL, FLUSHDB, memcached flush_all), taking
/// every key stripe first (see [`crate::keylock`]).
pub fn flush(shared: &crate::state::Shared) -> Result<(), nibble::Error> {
    let _all = shared.keylocks.lock_all(true);
    flush_held(shared)
}

/// Delete every key while the caller holds every stripe exclusively;
/// bumps the WATCH version of each deleted key's stripe.
pub fn flush_held(shared: &crate::state::Shared) -> Result<(), nibble::Error> {
    let store = &shared.store;
    let mut cursor = 0;
    loop {
        // Expired items not yet reclaimed go too: FLUSHALL empties the
        // index, and DBSIZE after it is 0.
        let (next, keys) = store.raw_scan(cursor, 1024)?;
        for k in keys {
            // Internal keys (large collections' nodes) go too. An
            // expired key's delete is no write a watcher could see (EXEC
            // checks expiry itself); a live user key's is.
            let is_internal = crate::engine::is_internal_key(&k);
            if store.raw_delete(&k)? && !is_internal {
                if let Some(user) = crate::engine::from_engine_key(k) {
                    shared.keylocks.bump_held(&user);
                }
            }
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// FLUSHALL / FLUSHDB [ASYNC|SYNC].
pub fn flushall(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if a.len() > 2 || (a.len() == 2 && !eq(a[1], "async") && !eq(a[1], "sync")) {
        return Err(SYNTAX.into());
    }
    // Dispatch (or EXEC) holds every stripe: see `multi::is_global_writer`.
    flush_held(ctx.shared)?;
    r.ok();
    Ok(())
}

/// SHUTDOWN [NOSAVE|SAVE|NOW|FORCE|ABORT].
pub fn shutdown(ctx: &mut Ctx, a: &[&[u8]], _r: &mut Reply) -> CmdResult {
    if a[1..].iter().any(|o| eq(o, "abort")) {
        return Err("ERR No shutdown in progress.".into());
    }
    let save = a[1..].iter().any(|o| eq(o, "save"));
    let nosave = a[1..].iter().any(|o| eq(o, "nosave"));
    if save && nosave {
        return Err(SYNTAX.into());
    }
    crate::rdb::persist::shutdown_save(ctx.shared, save, nosave)?;
    log::warn!("SHUTDOWN requested by client {}", ctx.sess.info.id);
    ctx.shared.shutdown();
    ctx.sess.close = true;
    Ok(())
}

/// DEBUG POPULATE count \[prefix\] \[size\] | MIGRATE worker.
pub fn debug(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if eq(a[1], "migrate") && a.len() == 3 {
        return debug_migrate(ctx, a[2], r);
    }
    if !eq(a[1], "populate") || a.len() < 3 || a.len() > 5 {
        return Err(
            "ERR DEBUG supports only POPULATE count [prefix] [size] and MIGRATE worker here".into(),
        );
    }
    let count = int_arg(a[2])?;
    if count < 0 {
        return Err("ERR count must be non-negative".into());
    }
    let prefix = a.get(3).copied().unwrap_or(b"key");
    let size = match a.get(4) {
        Some(s) => usize::try_from(int_arg(s)?).map_err(|_| CmdError::from(SYNTAX))?,
        None => 0,
    };
    if size > ctx.shared.settings.max_bulk() {
        return Err(super::TOO_BIG.into());
    }
    let store = &ctx.shared.store;
    let mut key = Vec::new();
    let mut val = Vec::new();
    for i in 0..count {
        key.clear();
        key.extend_from_slice(prefix);
        let _ = write!(Wr(&mut key), ":{i}");
        val.clear();
        let _ = write!(Wr(&mut val), "value:{i}");
        if size > 0 {
            val.resize(size, 0);
        }
        match store.put_with(
            &key,
            &val,
            nibble::PutOptions {
                condition: nibble::Condition::IfAbsent,
                ..Default::default()
            },
        ) {
            // Dispatch holds every stripe (see `multi::is_global_writer`).
            Ok(_) => ctx.shared.keylocks.bump_held(&key),
            Err(nibble::Error::Exists) => {}
            Err(e) => return Err(e.into()),
        }
    }
    r.ok();
    Ok(())
}

/// DEBUG MIGRATE worker: move this connection to `worker` once its
/// batch ends, as key affinity would (see [`crate::migrate`]); the reply
/// is the worker it runs on now. A connection that cannot move (TLS,
/// Unix socket, subscribed) stays where it is.
fn debug_migrate(ctx: &mut Ctx, w: &[u8], r: &mut Reply) -> CmdResult {
    let to = usize::try_from(int_arg(w)?)
        .ok()
        .filter(|&t| t < ctx.shared.clients.len())
        .ok_or_else(|| CmdError::from("ERR no such worker"))?;
    ctx.sess.move_to = (to != ctx.sess.worker).then_some(to);
    r.int(ctx.sess.worker as i64);
    Ok(())
}

/// `fmt::Write` over a byte vector.
struct Wr<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Wr<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// TIME.
pub fn time(_ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    r.array(2);
    r.bulk((us / 1_000_000).to_string().as_bytes());
    r.bulk((us % 1_000_000).to_string().as_bytes());
    Ok(())
}
