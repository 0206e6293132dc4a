//! Key commands: DEL, EXISTS, the EXPIRE family, TTL, TYPE, RENAME, KEYS,
//! SCAN, RANDOMKEY, TOUCH, COPY, OBJECT.
//!
//! Expiry is the engine's: an item carries a Unix-ms deadline, reads treat
//! it as absent after that, and compaction reclaims it. EXPIRE with a
//! deadline in the past deletes the key, as in Redis. SCAN is the engine's
//! cursor over index buckets (every key present for the whole iteration is
//! returned at least once), with MATCH and TYPE applied to each batch, so a
//! step may return no keys with a non-zero cursor, as in Redis. KEYS walks
//! the whole cursor.

use nibble::{Condition, Expiry, PutOptions};

use super::{eq, int_arg, CmdError, CmdResult, Ctx, SYNTAX};
use crate::coll;
use crate::glob;
use crate::resp::Reply;
use crate::state::unix_ms;
use crate::types::{is_collection, type_name};

/// DEL/UNLINK key...
pub fn del(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let mut n = 0;
    for k in &a[1..] {
        // A large collection's nodes go with its root (O(n / 16) items).
        if coll::delete_key(&ctx.shared.store, k)? {
            n += 1;
        }
    }
    r.int(n);
    Ok(())
}

/// EXISTS key...
pub fn exists(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let mut n = 0;
    for k in &a[1..] {
        if ctx.shared.store.contains(k)? {
            n += 1;
        }
    }
    r.int(n);
    Ok(())
}

fn expire_generic(
    ctx: &mut Ctx,
    a: &[&[u8]],
    r: &mut Reply,
    unit_ms: i64,
    absolute: bool,
    cmd: &str,
) -> CmdResult {
    let v = int_arg(a[2])?;
    let invalid = || CmdError::from(format!("ERR invalid expire time in '{cmd}' command"));
    let ms = v.checked_mul(unit_ms).ok_or_else(invalid)?;
    let at = if absolute {
        ms
    } else {
        ms.checked_add(unix_ms() as i64).ok_or_else(invalid)?
    };
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for o in &a[3..] {
        if eq(o, "nx") {
            nx = true;
        } else if eq(o, "xx") {
            xx = true;
        } else if eq(o, "gt") {
            gt = true;
        } else if eq(o, "lt") {
            lt = true;
        } else {
            return Err(format!("ERR Unsupported option {}", super::shown(o)).into());
        }
    }
    if nx && (xx || gt || lt) {
        return Err("ERR NX and XX, GT or LT options at the same time are not compatible".into());
    }
    if gt && lt {
        return Err("ERR GT and LT options at the same time are not compatible".into());
    }
    let store = &ctx.shared.store;
    let Some(m) = store.meta(a[1])? else {
        r.int(0);
        return Ok(());
    };
    // Options, against the TTL read just now (see the module notes).
    let cur = redis_expiry(&m);
    let allowed = match cur {
        None => !xx && !gt,
        Some(c) => !nx && (!gt || at > c) && (!lt || at < c),
    };
    if !allowed {
        r.int(0);
        return Ok(());
    }
    let done = if at <= unix_ms() as i64 {
        coll::delete_key(store, a[1])?
    } else {
        store.set_expiry(a[1], Some(at as u64))?
    };
    r.int(i64::from(done));
    Ok(())
}

/// EXPIRE key seconds [NX|XX|GT|LT].
pub fn expire(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    expire_generic(ctx, a, r, 1000, false, "expire")
}

/// PEXPIRE key ms.
pub fn pexpire(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    expire_generic(ctx, a, r, 1, false, "pexpire")
}

/// EXPIREAT key unix-seconds.
pub fn expireat(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    expire_generic(ctx, a, r, 1000, true, "expireat")
}

/// PEXPIREAT key unix-ms.
pub fn pexpireat(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    expire_generic(ctx, a, r, 1, true, "pexpireat")
}

/// The expiry as Redis reports it, Unix ms. The engine keeps an expiry
/// in a 47-bit field (the 48-bit field's top bit is the pinned mark of
/// cache mode; the shared store keeps 48 bits), clamping later ones to
/// its largest value (2^47 - 1 ms, in the year 6429); that value and any
/// above it are reported as the i64
/// maximum, so `PEXPIREAT k 9223372036854775807` reads back as Redis
/// answers it (any expiry past the field's range reads back so).
fn redis_expiry(m: &nibble::ItemMeta) -> Option<i64> {
    m.expiry_ms.map(|e| {
        if e >= nibble::object::MAX_EXPIRY_MS {
            i64::MAX
        } else {
            e as i64
        }
    })
}

fn ttl_generic(ctx: &mut Ctx, key: &[u8], r: &mut Reply, ms: bool, absolute: bool) -> CmdResult {
    let m = ctx.shared.store.meta(key)?;
    let v = match m {
        None => -2,
        Some(m) => match redis_expiry(&m).map(|e| e as u64) {
            None => -1,
            Some(at) if absolute => {
                if ms {
                    at as i64
                } else {
                    // Rounded, as redis-server's EXPIRETIME.
                    (at.saturating_add(500) / 1000) as i64
                }
            }
            Some(at) => {
                let left = at.saturating_sub(unix_ms()) as i64;
                if ms {
                    left
                } else {
                    (left + 500) / 1000
                }
            }
        },
    };
    r.int(v);
    Ok(())
}

/// TTL key.
pub fn ttl(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    ttl_generic(ctx, a[1], r, false, false)
}

/// PTTL key.
pub fn pttl(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    ttl_generic(ctx, a[1], r, true, false)
}

/// EXPIRETIME key.
pub fn expiretime(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    ttl_generic(ctx, a[1], r, false, true)
}

/// PEXPIRETIME key.
pub fn pexpiretime(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    ttl_generic(ctx, a[1], r, true, true)
}

/// PERSIST key.
pub fn persist(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let store = &ctx.shared.store;
    let done = match store.meta(a[1])? {
        Some(m) if m.expiry_ms.is_some() => store.set_expiry(a[1], None)?,
        _ => false,
    };
    r.int(i64::from(done));
    Ok(())
}

/// TYPE key.
pub fn type_(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let t = match ctx.shared.store.meta(a[1])? {
        None => "none",
        Some(m) => type_name(&m),
    };
    r.simple(t);
    Ok(())
}

/// Store `value` (an item read with metadata `m`) under `dst` with the
/// same expiry and flags, over an existing `dst` only with `overwrite`;
/// false when `dst` exists and was kept (RENAME, RENAMENX, COPY).
fn put_copy(
    store: &crate::engine::Engine,
    dst: &[u8],
    value: &[u8],
    m: &nibble::ItemMeta,
    overwrite: bool,
) -> Result<bool, CmdError> {
    let opts = PutOptions {
        condition: if overwrite {
            Condition::Always
        } else {
            Condition::IfAbsent
        },
        expiry: m.expiry_ms.map_or(Expiry::Never, Expiry::At),
        flags: m.flags,
    };
    match store.put_with(dst, value, opts) {
        Ok(_) => Ok(true),
        Err(nibble::Error::Exists) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn rename_generic(ctx: &mut Ctx, a: &[&[u8]], nx: bool) -> Result<bool, CmdError> {
    let (src, dst) = (a[1], a[2]);
    let store = &ctx.shared.store;
    let Some(m) = store.get_into(src, ctx.buf)? else {
        return Err("ERR no such key".into());
    };
    if src == dst {
        return Ok(!nx);
    }
    if nx && store.contains(dst)? {
        return Ok(false);
    }
    // A large collection over `dst` dies with its nodes; one moving from
    // `src` keeps its nodes and learns its new owner (both stripes are
    // held, so the sweeper sees either the old owner or the new).
    coll::delete_key(store, dst)?;
    if !put_copy(store, dst, ctx.buf, &m, true)? {
        return Ok(false);
    }
    coll::renamed(store, m.flags, ctx.buf, dst)?;
    // Delete the source only if it is still the item we copied.
    if store.meta(src)?.is_some_and(|now| now.version == m.version) {
        store.delete(src)?;
    }
    Ok(true)
}

/// RENAME src dst.
pub fn rename(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    rename_generic(ctx, a, false)?;
    r.ok();
    Ok(())
}

/// RENAMENX src dst.
pub fn renamenx(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let done = rename_generic(ctx, a, true)?;
    r.int(i64::from(done));
    Ok(())
}

/// Every key matching `pattern` (a full cursor walk).
pub fn all_keys(
    store: &crate::engine::Engine,
    pattern: Option<&[u8]>,
) -> Result<Vec<Vec<u8>>, CmdError> {
    let mut out = Vec::new();
    let mut cursor = 0;
    loop {
        let (next, keys) = store.scan(cursor, 1024)?;
        out.extend(
            keys.into_iter()
                .filter(|k| pattern.is_none_or(|p| glob::matches(p, k))),
        );
        if next == 0 {
            break;
        }
        cursor = next;
    }
    // The cursor may return a key twice if the index grew mid-walk.
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// KEYS pattern.
pub fn keys(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let pat = (a[1] != b"*").then_some(a[1]);
    let ks = all_keys(&ctx.shared.store, pat)?;
    r.bulks(ks.iter());
    Ok(())
}

/// How many more cursor steps SCAN takes while they return no key.
const SCAN_EMPTY_STEPS: usize = 64;

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE t].
pub fn scan(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let cursor: u64 = std::str::from_utf8(a[1])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(CmdError::from("ERR invalid cursor"))?;
    let (mut pat, mut count, mut ty): (Option<&[u8]>, usize, Option<&[u8]>) = (None, 10, None);
    let mut i = 2;
    while i < a.len() {
        if i + 1 >= a.len() {
            return Err(SYNTAX.into());
        }
        if eq(a[i], "match") {
            pat = Some(a[i + 1]);
        } else if eq(a[i], "count") {
            let c = int_arg(a[i + 1])?;
            if c < 1 {
                return Err(SYNTAX.into());
            }
            count = c as usize;
        } else if eq(a[i], "type") {
            ty = Some(a[i + 1]);
        } else {
            return Err(SYNTAX.into());
        }
        i += 2;
    }
    let store = &ctx.shared.store;
    // An empty keyspace ends the walk at once, as in Redis; otherwise a
    // few steps are taken until one returns keys (Redis, too, may answer
    // a non-zero cursor with no keys after bounded work).
    let (mut next, mut keys) = if store.is_empty() {
        (0, Vec::new())
    } else {
        store.scan(cursor, count)?
    };
    for _ in 0..SCAN_EMPTY_STEPS {
        if !keys.is_empty() || next == 0 {
            break;
        }
        (next, keys) = store.scan(next, count)?;
    }
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        if pat.is_some_and(|p| p != b"*" && !glob::matches(p, &k)) {
            continue;
        }
        if let Some(t) = ty {
            let Some(m) = store.meta(&k)? else { continue };
            let kt = type_name(&m);
            if !eq(t, kt) {
                continue;
            }
        }
        out.push(k);
    }
    r.array(2);
    r.bulk(next.to_string().as_bytes());
    r.bulks(out.iter());
    Ok(())
}

/// RANDOMKEY: a key from the first non-empty scan step after a
/// pseudo-random pick within it (not uniform over the keyspace).
pub fn randomkey(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let store = &ctx.shared.store;
    let mut cursor = 0;
    loop {
        let (next, keys) = store.scan(cursor, 64)?;
        if !keys.is_empty() {
            let i = (topology::rdtsc() as usize) % keys.len();
            r.bulk(&keys[i]);
            return Ok(());
        }
        if next == 0 {
            r.null();
            return Ok(());
        }
        cursor = next;
    }
}

/// TOUCH key...: how many of the keys exist (there is no access time to
/// update; see OBJECT IDLETIME).
pub fn touch(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    exists(ctx, a, r)
}

/// COPY source destination [DB 0] \[REPLACE\]. There is one database, so a
/// `DB` other than 0 is Redis's "DB index is out of range".
pub fn copy(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let mut replace = false;
    let mut j = 3;
    while j < a.len() {
        if eq(a[j], "replace") {
            replace = true;
        } else if eq(a[j], "db") && j + 1 < a.len() {
            let db = int_arg(a[j + 1])?;
            if i32::try_from(db).is_err() {
                return Err(
                    "ERR value is out of range, value must between -2147483648 and 2147483647"
                        .into(),
                );
            }
            if db != 0 {
                return Err("ERR DB index is out of range".into());
            }
            j += 1;
        } else {
            return Err(SYNTAX.into());
        }
        j += 1;
    }
    let (src, dst) = (a[1], a[2]);
    if src == dst {
        return Err("ERR source and destination objects are the same".into());
    }
    let store = &ctx.shared.store;
    let Some(m) = store.get_into(src, ctx.buf)? else {
        r.int(0);
        return Ok(());
    };
    if !coll::is_big_root(m.flags, ctx.buf) {
        if replace {
            coll::delete_key(store, dst)?;
        }
        let copied = put_copy(store, dst, ctx.buf, &m, replace)?;
        r.int(i64::from(copied));
        return Ok(());
    }
    // A large collection is copied element by element into a new one.
    if store.contains(dst)? {
        if !replace {
            r.int(0);
            return Ok(());
        }
        coll::delete_key(store, dst)?;
    }
    let Some((kind, items, _)) = coll::load_all(ctx.shared, src, m.flags)? else {
        r.int(0);
        return Ok(());
    };
    coll::create(ctx.shared, dst, kind, &items, m.expiry_ms)?;
    r.int(1);
    Ok(())
}

/// OBJECT HELP's text (redis-server 7.0's).
const OBJECT_HELP: &[&str] = &[
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    Return the kind of internal representation used in order to store the value",
    "    associated with a <key>.",
    "FREQ <key>",
    "    Return the access frequency index of the <key>. The returned integer is",
    "    proportional to the logarithm of the recent access frequency of the key.",
    "IDLETIME <key>",
    "    Return the idle time of the <key>, that is the approximated number of",
    "    seconds elapsed since the last access to the key.",
    "REFCOUNT <key>",
    "    Return the number of references of the value associated with the specified",
    "    <key>.",
    "HELP",
    "    Prints this help.",
];

/// Redis's shared integers: values 0..10000 are one shared object.
const SHARED_INTEGERS: i64 = 10_000;
/// Longest string Redis keeps as `embstr`.
const EMBSTR_MAX_BYTES: usize = 44;

/// The encoding Redis would report for a value written by SET: `int`,
/// `embstr` or `raw` for strings; `listpack` or `hashtable` for hashes,
/// by the hash-max-listpack-* tunables. (Redis also reports `raw` for a
/// short string changed in place by APPEND, SETRANGE or SETBIT; the
/// history is not kept here, so such a string reports `embstr`.)
fn encoding(ctx: &Ctx, key: &[u8], m: &nibble::ItemMeta, v: &[u8]) -> &'static str {
    if is_collection(m) {
        return coll::encoding_of(ctx.shared, key, m.flags).unwrap_or("unknown");
    }
    if v.len() <= 20 && super::parse_i64(v).is_some() {
        "int"
    } else if v.len() <= EMBSTR_MAX_BYTES {
        "embstr"
    } else {
        "raw"
    }
}

/// OBJECT ENCODING|REFCOUNT|IDLETIME|FREQ key, OBJECT HELP.
pub fn object(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let sub = a[1];
    if eq(sub, "help") && a.len() == 2 {
        r.array(OBJECT_HELP.len());
        for l in OBJECT_HELP {
            r.simple(l);
        }
        return Ok(());
    }
    let name = ["encoding", "refcount", "idletime", "freq", "help"]
        .into_iter()
        .find(|n| eq(sub, n));
    let Some(name) = name else {
        return Err(format!(
            "ERR unknown subcommand '{}'. Try OBJECT HELP.",
            super::shown(sub)
        )
        .into());
    };
    if a.len() != 3 || name == "help" {
        return Err(format!("ERR wrong number of arguments for 'object|{name}' command").into());
    }
    let Some(m) = ctx.shared.store.get_into(a[2], ctx.buf)? else {
        r.null();
        return Ok(());
    };
    match name {
        "encoding" => r.bulk(encoding(ctx, a[2], &m, ctx.buf).as_bytes()),
        "refcount" => {
            let shared_int = !is_collection(&m)
                && ctx.buf.len() <= 20
                && super::parse_i64(ctx.buf).is_some_and(|n| (0..SHARED_INTEGERS).contains(&n));
            r.int(if shared_int { i64::from(i32::MAX) } else { 1 });
        }
        // No access clock is kept: every key reads as just used.
        "idletime" => r.int(0),
        _ => return Err("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.".into()),
    }
    Ok(())
}
