//! String commands: GET, SET and its options, the INCR family, APPEND,
//! ranges, MGET/MSET.
//!
//! Every read-modify-write goes through [`rmw`], the compare-and-swap loop
//! described in the parent module: read the value and its version, compute
//! the new value, write it only if the version is unchanged (or, for a
//! missing key, only if it is still missing), else start again. Expiry is
//! kept (`Expiry::Keep`) as Redis keeps a key's TTL across INCR and APPEND,
//! and the item's flags are kept so a memcached item stays one.

use nibble::{Condition, Expiry, ItemMeta, PutOptions};

use super::{
    eq, int_arg, is_race, parse_i64, CmdError, CmdResult, Ctx, SYNTAX, TOO_BIG, WRONGTYPE,
};
use crate::longdouble::IncrError;
use crate::resp::Reply;
use crate::state::unix_ms;
use crate::types::is_collection;

/// Read `key` into `ctx.buf` as a string; `WRONGTYPE` for a hash.
pub fn read_string(ctx: &mut Ctx, key: &[u8]) -> Result<Option<ItemMeta>, CmdError> {
    let m = ctx.shared.store.get_into(key, ctx.buf)?;
    match m {
        Some(m) if is_collection(&m) => Err(WRONGTYPE.into()),
        Some(m) => Ok(Some(m)),
        // A miss leaves the buffer empty; callers treat it as the current
        // (empty) value.
        None => Ok(None),
    }
}

/// What a read-modify-write decided.
pub enum Update<T> {
    /// Write this value, then return T.
    Write(Vec<u8>, T),
    /// Write nothing, return T.
    Skip(T),
}

/// The CAS loop over one string key. `f` sees the current item (if any)
/// and its value.
pub fn rmw<T>(
    ctx: &mut Ctx,
    key: &[u8],
    mut f: impl FnMut(Option<&ItemMeta>, &[u8]) -> Result<Update<T>, CmdError>,
) -> Result<T, CmdError> {
    loop {
        let cur = read_string(ctx, key)?;
        let (value, out) = match f(cur.as_ref(), ctx.buf)? {
            Update::Skip(t) => return Ok(t),
            Update::Write(v, t) => (v, t),
        };
        let opts = PutOptions {
            condition: cur.map_or(Condition::IfAbsent, |m| Condition::IfVersion(m.version)),
            expiry: Expiry::Keep,
            flags: cur.map_or(0, |m| m.flags),
        };
        match ctx.shared.store.put_with(key, &value, opts) {
            Ok(_) => return Ok(out),
            Err(e) if is_race(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// GET key.
pub fn get(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let m = read_string(ctx, a[1])?;
    ctx.hit(m.is_some());
    r.opt_bulk(m.map(|_| &ctx.buf[..]));
    Ok(())
}

/// An absolute expiry from a relative or absolute argument, or Redis's
/// "invalid expire time" error for `cmd`.
pub fn expiry_ms(arg: &[u8], unit_ms: i64, absolute: bool, cmd: &str) -> Result<u64, CmdError> {
    let v = int_arg(arg)?;
    let invalid = || CmdError::from(format!("ERR invalid expire time in '{cmd}' command"));
    if v <= 0 && (!absolute || cmd == "set" || cmd == "getex") {
        return Err(invalid());
    }
    let ms = v.checked_mul(unit_ms).ok_or_else(invalid)?;
    let abs = if absolute {
        ms
    } else {
        ms.checked_add(unix_ms() as i64).ok_or_else(invalid)?
    };
    Ok(abs.max(1) as u64)
}

struct SetArgs {
    cond: Condition,
    expiry: Expiry,
    get: bool,
}

fn parse_set_args(a: &[&[u8]]) -> Result<SetArgs, CmdError> {
    let mut s = SetArgs {
        cond: Condition::Always,
        expiry: Expiry::Never,
        get: false,
    };
    let mut have_expiry = false;
    let mut i = 3;
    while i < a.len() {
        let o = a[i];
        if eq(o, "nx") && s.cond == Condition::Always {
            s.cond = Condition::IfAbsent;
        } else if eq(o, "xx") && s.cond == Condition::Always {
            s.cond = Condition::IfPresent;
        } else if eq(o, "get") {
            s.get = true;
        } else if eq(o, "keepttl") && !have_expiry {
            s.expiry = Expiry::Keep;
            have_expiry = true;
        } else if (eq(o, "ex") || eq(o, "px") || eq(o, "exat") || eq(o, "pxat"))
            && !have_expiry
            && i + 1 < a.len()
        {
            let unit = if eq(o, "ex") || eq(o, "exat") {
                1000
            } else {
                1
            };
            let abs = eq(o, "exat") || eq(o, "pxat");
            s.expiry = Expiry::At(expiry_ms(a[i + 1], unit, abs, "set")?);
            have_expiry = true;
            i += 1;
        } else {
            return Err(SYNTAX.into());
        }
        i += 1;
    }
    Ok(s)
}

/// SET key value [NX|XX] \[GET\] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL].
pub fn set(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let s = parse_set_args(a)?;
    let (key, value) = (a[1], a[2]);
    if !s.get {
        let opts = PutOptions {
            condition: s.cond,
            expiry: s.expiry,
            flags: 0,
        };
        match ctx.shared.store.put_with(key, value, opts) {
            Ok(_) => r.ok(),
            Err(nibble::Error::Exists | nibble::Error::NotFound) => r.null(),
            Err(e) => return Err(e.into()),
        }
        return Ok(());
    }
    // SET ... GET: the old value, atomically with the write.
    let old = set_get(ctx, key, value, s.cond, s.expiry)?;
    r.opt_bulk(old.as_deref());
    Ok(())
}

/// Write `value` and return the previous value, under CAS.
fn set_get(
    ctx: &mut Ctx,
    key: &[u8],
    value: &[u8],
    cond: Condition,
    expiry: Expiry,
) -> Result<Option<Vec<u8>>, CmdError> {
    loop {
        let cur = read_string(ctx, key)?;
        let old = cur.map(|_| ctx.buf.clone());
        match (cond, cur) {
            (Condition::IfAbsent, Some(_)) | (Condition::IfPresent, None) => return Ok(old),
            _ => {}
        }
        let opts = PutOptions {
            condition: cur.map_or(Condition::IfAbsent, |m| Condition::IfVersion(m.version)),
            expiry,
            flags: 0,
        };
        match ctx.shared.store.put_with(key, value, opts) {
            Ok(_) => return Ok(old),
            Err(e) if is_race(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

fn setex_common(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, unit: i64, cmd: &str) -> CmdResult {
    let at = expiry_ms(a[2], unit, false, cmd)?;
    let opts = PutOptions {
        expiry: Expiry::At(at),
        ..Default::default()
    };
    ctx.shared.store.put_with(a[1], a[3], opts)?;
    r.ok();
    Ok(())
}

/// SETEX key seconds value.
pub fn setex(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    setex_common(ctx, a, r, 1000, "setex")
}

/// PSETEX key ms value.
pub fn psetex(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    setex_common(ctx, a, r, 1, "psetex")
}

/// SETNX key value.
pub fn setnx(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let opts = PutOptions {
        condition: Condition::IfAbsent,
        ..Default::default()
    };
    match ctx.shared.store.put_with(a[1], a[2], opts) {
        Ok(_) => r.int(1),
        Err(nibble::Error::Exists) => r.int(0),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// GETSET key value.
pub fn getset(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let old = set_get(ctx, a[1], a[2], Condition::Always, Expiry::Never)?;
    r.opt_bulk(old.as_deref());
    Ok(())
}

/// GETDEL key.
///
/// Atomic: the delete is conditional on the version read, and a write in
/// between makes it read again.
pub fn getdel(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    loop {
        let Some(m) = read_string(ctx, a[1])? else {
            r.opt_bulk(None);
            return Ok(());
        };
        match ctx
            .shared
            .store
            .delete_if(a[1], nibble::Condition::IfVersion(m.version))
        {
            Ok(()) => {
                r.opt_bulk(Some(&ctx.buf[..]));
                return Ok(());
            }
            Err(nibble::Error::VersionMismatch { .. }) => continue,
            Err(nibble::Error::NotFound) => {
                r.opt_bulk(None);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// GETEX key [EX s|PX ms|EXAT t|PXAT t|PERSIST].
pub fn getex(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let new_expiry: Option<Option<u64>> = match a.len() {
        2 => None,
        3 if eq(a[2], "persist") => Some(None),
        4 => {
            let o = a[2];
            let (unit, abs) = if eq(o, "ex") {
                (1000, false)
            } else if eq(o, "px") {
                (1, false)
            } else if eq(o, "exat") {
                (1000, true)
            } else if eq(o, "pxat") {
                (1, true)
            } else {
                return Err(SYNTAX.into());
            };
            Some(Some(expiry_ms(a[3], unit, abs, "getex")?))
        }
        _ => return Err(SYNTAX.into()),
    };
    let m = read_string(ctx, a[1])?;
    if let (Some(_), Some(e)) = (m, new_expiry) {
        ctx.shared.store.set_expiry(a[1], e)?;
    }
    r.opt_bulk(m.map(|_| &ctx.buf[..]));
    Ok(())
}

/// MGET key...
pub fn mget(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    r.array(a.len() - 1);
    for k in &a[1..] {
        match ctx.shared.store.get_into(k, ctx.buf) {
            Ok(Some(m)) if !is_collection(&m) => {
                ctx.hit(true);
                r.bulk(ctx.buf);
            }
            _ => {
                ctx.hit(false);
                r.null();
            }
        }
    }
    Ok(())
}

fn check_pairs(a: &[&[u8]], cmd: &str) -> CmdResult {
    if a.len() & 1 == 0 {
        return Err(format!("ERR wrong number of arguments for '{cmd}' command").into());
    }
    Ok(())
}

/// MSET key value [key value ...].
pub fn mset(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    check_pairs(a, "mset")?;
    for kv in a[1..].chunks(2) {
        ctx.shared.store.put(kv[0], kv[1])?;
    }
    r.ok();
    Ok(())
}

/// MSETNX key value [key value ...]. A key named twice is written once,
/// with its last value (as Redis, whose later SET overwrites the earlier).
pub fn msetnx(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    check_pairs(a, "msetnx")?;
    let store = &ctx.shared.store;
    let mut pairs: Vec<(&[u8], &[u8])> = Vec::with_capacity(a.len() / 2);
    for kv in a[1..].chunks(2) {
        if store.contains(kv[0])? {
            r.int(0);
            return Ok(());
        }
        match pairs.iter_mut().find(|(k, _)| *k == kv[0]) {
            Some(p) => p.1 = kv[1],
            None => pairs.push((kv[0], kv[1])),
        }
    }
    let mut written: Vec<(&[u8], u64)> = Vec::new();
    let opts = PutOptions {
        condition: Condition::IfAbsent,
        ..Default::default()
    };
    for (k, v) in pairs {
        match store.put_with(k, v, opts) {
            Ok(ver) => written.push((k, ver)),
            Err(e) => {
                // Undo: remove what we wrote, if nobody changed it since.
                for (k, ver) in written {
                    let _ = store.delete_if(k, Condition::IfVersion(ver));
                }
                if matches!(e, nibble::Error::Exists) {
                    r.int(0);
                    return Ok(());
                }
                return Err(e.into());
            }
        }
    }
    r.int(1);
    Ok(())
}

/// APPEND key value.
pub fn append(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let max = ctx.shared.settings.max_bulk();
    let add = a[2];
    let len = rmw(ctx, a[1], |_, cur| {
        if cur.len() + add.len() > max {
            return Err(TOO_BIG.into());
        }
        let mut v = Vec::with_capacity(cur.len() + add.len());
        v.extend_from_slice(cur);
        v.extend_from_slice(add);
        let n = v.len();
        Ok(Update::Write(v, n))
    })?;
    r.int(len as i64);
    Ok(())
}

/// STRLEN key.
pub fn strlen(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    match ctx.shared.store.meta(a[1])? {
        Some(m) if is_collection(&m) => return Err(WRONGTYPE.into()),
        Some(m) => r.int(m.value_len as i64),
        None => r.int(0),
    }
    Ok(())
}

/// GETRANGE key start end.
pub fn getrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (mut s, mut e) = (int_arg(a[2])?, int_arg(a[3])?);
    let m = read_string(ctx, a[1])?;
    let v = &ctx.buf[..];
    let len = v.len() as i64;
    if m.is_none() || len == 0 || (s < 0 && e < 0 && s > e) {
        r.bulk(b"");
        return Ok(());
    }
    if s < 0 {
        s += len;
    }
    if e < 0 {
        e += len;
    }
    s = s.max(0);
    e = e.max(0).min(len - 1);
    if s > e || s >= len {
        r.bulk(b"");
    } else {
        r.bulk(&v[s as usize..=e as usize]);
    }
    Ok(())
}

/// SETRANGE key offset value.
pub fn setrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let off = int_arg(a[2])?;
    if off < 0 {
        return Err("ERR offset is out of range".into());
    }
    let max = ctx.shared.settings.max_bulk() as i64;
    let val = a[3];
    if off.saturating_add(val.len() as i64) > max {
        return Err(TOO_BIG.into());
    }
    let off = off as usize;
    let len = rmw(ctx, a[1], |m, cur| {
        if val.is_empty() {
            return Ok(Update::Skip(m.map_or(0, |_| cur.len())));
        }
        let mut v = cur.to_vec();
        if v.len() < off + val.len() {
            v.resize(off + val.len(), 0);
        }
        v[off..off + val.len()].copy_from_slice(val);
        let n = v.len();
        Ok(Update::Write(v, n))
    })?;
    r.int(len as i64);
    Ok(())
}

fn incr_by(ctx: &mut Ctx, key: &[u8], by: i64, r: &mut Reply) -> CmdResult {
    let v = rmw(ctx, key, |m, cur| {
        let old = if m.is_none() {
            0
        } else {
            parse_i64(cur).ok_or(CmdError::from(super::NOT_INT))?
        };
        let new = old
            .checked_add(by)
            .ok_or(CmdError::from("ERR increment or decrement would overflow"))?;
        Ok(Update::Write(new.to_string().into_bytes(), new))
    })?;
    r.int(v);
    Ok(())
}

/// INCR key.
pub fn incr(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    incr_by(ctx, a[1], 1, r)
}

/// DECR key.
pub fn decr(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    incr_by(ctx, a[1], -1, r)
}

/// INCRBY key n.
pub fn incrby(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let by = int_arg(a[2])?;
    incr_by(ctx, a[1], by, r)
}

/// DECRBY key n.
pub fn decrby(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let by = int_arg(a[2])?;
    let neg = by
        .checked_neg()
        .ok_or(CmdError::from("ERR decrement would overflow"))?;
    incr_by(ctx, a[1], neg, r)
}

/// INCRBYFLOAT key f (in `long double`, as redis-server; see `longdouble`).
pub fn incrbyfloat(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let s = rmw(ctx, a[1], |m, cur| {
        let s = crate::longdouble::incr(m.map(|_| cur), a[2], false).map_err(|e| match e {
            IncrError::Result => CmdError::from("ERR increment would produce NaN or Infinity"),
            _ => CmdError::from("ERR value is not a valid float"),
        })?;
        Ok(Update::Write(s.clone().into_bytes(), s))
    })?;
    r.bulk(s.as_bytes());
    Ok(())
}
