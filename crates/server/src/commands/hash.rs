//! Hash commands over one engine item per hash (see `types` for the
//! encoding and the flags value that marks it).
//!
//! Reads decode the whole item. Writes go through [`modify`], the CAS loop:
//! decode, change, encode, write with `IfVersion` (or `IfAbsent` for a new
//! hash), retry on a lost race. A hash left empty is deleted, as Redis
//! removes empty hashes.

use std::collections::HashMap;

use nibble::{Condition, Expiry, PutOptions};

use super::{int_arg, is_race, parse_i64, CmdError, CmdResult, Ctx, WRONGTYPE};
use crate::longdouble::IncrError;
use crate::resp::Reply;
use crate::types::{decode_hash, encode_hash, is_hash, Hash, HASH_FLAGS};

/// The hash at `key` and its version; `WRONGTYPE` for a string.
fn load(ctx: &mut Ctx, key: &[u8]) -> Result<Option<(Hash, u64)>, CmdError> {
    let Some(m) = ctx.shared.store.get_into(key, ctx.buf)? else {
        return Ok(None);
    };
    if !is_hash(&m) {
        return Err(WRONGTYPE.into());
    }
    let h = decode_hash(ctx.buf).ok_or(CmdError::from("ERR corrupt hash value"))?;
    Ok(Some((h, m.version)))
}

/// Read-modify-write of the hash at `key`. `f` returns the reply value and
/// whether it changed anything.
fn modify<T>(
    ctx: &mut Ctx,
    key: &[u8],
    mut f: impl FnMut(&mut Hash) -> Result<(T, bool), CmdError>,
) -> Result<T, CmdError> {
    loop {
        let cur = load(ctx, key)?;
        let version = cur.as_ref().map(|c| c.1);
        let mut h = cur.map(|c| c.0).unwrap_or_default();
        let (out, changed) = f(&mut h)?;
        if !changed {
            return Ok(out);
        }
        let store = &ctx.shared.store;
        if h.is_empty() {
            if let Some(v) = version {
                if store.meta(key)?.is_some_and(|m| m.version == v) {
                    store.delete(key)?;
                } else {
                    continue;
                }
            }
            return Ok(out);
        }
        let bytes = encode_hash(&h);
        if bytes.len() > ctx.shared.settings.engine_max_value as usize {
            return Err("ERR hash exceeds the largest value the engine stores".into());
        }
        let opts = PutOptions {
            condition: version.map_or(Condition::IfAbsent, Condition::IfVersion),
            expiry: Expiry::Keep,
            flags: HASH_FLAGS,
        };
        match store.put_with(key, &bytes, opts) {
            Ok(_) => return Ok(out),
            Err(e) if is_race(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Set `pairs` in `h`; returns how many fields were new.
fn set_fields(h: &mut Hash, pairs: &[&[u8]]) -> usize {
    let mut pos: HashMap<Vec<u8>, usize> = h
        .iter()
        .enumerate()
        .map(|(i, (f, _))| (f.clone(), i))
        .collect();
    let mut added = 0;
    for kv in pairs.chunks(2) {
        match pos.get(kv[0]) {
            Some(&i) => h[i].1 = kv[1].to_vec(),
            None => {
                pos.insert(kv[0].to_vec(), h.len());
                h.push((kv[0].to_vec(), kv[1].to_vec()));
                added += 1;
            }
        }
    }
    added
}

fn check_pairs(a: &[&[u8]], cmd: &str) -> CmdResult {
    if a.len() & 1 != 0 {
        return Err(format!("ERR wrong number of arguments for '{cmd}' command").into());
    }
    Ok(())
}

/// HSET key field value [field value ...].
pub fn hset(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    check_pairs(a, "hset")?;
    let n = modify(ctx, a[1], |h| Ok((set_fields(h, &a[2..]), true)))?;
    r.int(n as i64);
    Ok(())
}

/// HMSET key field value [field value ...].
pub fn hmset(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    check_pairs(a, "hmset")?;
    modify(ctx, a[1], |h| Ok((set_fields(h, &a[2..]), true)))?;
    r.ok();
    Ok(())
}

fn find<'h>(h: &'h Hash, f: &[u8]) -> Option<&'h [u8]> {
    h.iter().find(|(k, _)| k == f).map(|(_, v)| &v[..])
}

/// HSETNX key field value.
pub fn hsetnx(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = modify(ctx, a[1], |h| {
        if find(h, a[2]).is_some() {
            return Ok((0, false));
        }
        h.push((a[2].to_vec(), a[3].to_vec()));
        Ok((1, true))
    })?;
    r.int(n);
    Ok(())
}

/// HGET key field.
pub fn hget(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = load(ctx, a[1])?;
    let v = h.as_ref().and_then(|(h, _)| find(h, a[2]));
    ctx.hit(v.is_some());
    r.opt_bulk(v);
    Ok(())
}

/// HMGET key field...
pub fn hmget(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = load(ctx, a[1])?;
    r.array(a.len() - 2);
    for f in &a[2..] {
        r.opt_bulk(h.as_ref().and_then(|(h, _)| find(h, f)));
    }
    Ok(())
}

/// HGETALL key (a map in RESP3).
pub fn hgetall(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = load(ctx, a[1])?.map(|x| x.0).unwrap_or_default();
    r.map(h.len());
    for (f, v) in &h {
        r.bulk(f);
        r.bulk(v);
    }
    Ok(())
}

/// HDEL key field...
pub fn hdel(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = modify(ctx, a[1], |h| {
        let before = h.len();
        h.retain(|(f, _)| !a[2..].contains(&&f[..]));
        let n = before - h.len();
        Ok((n, n > 0))
    })?;
    r.int(n as i64);
    Ok(())
}

/// HEXISTS key field.
pub fn hexists(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = load(ctx, a[1])?;
    r.int(i64::from(h.is_some_and(|(h, _)| find(&h, a[2]).is_some())));
    Ok(())
}

/// HLEN key.
pub fn hlen(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = load(ctx, a[1])?;
    r.int(h.map_or(0, |(h, _)| h.len() as i64));
    Ok(())
}

/// HKEYS key.
pub fn hkeys(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = load(ctx, a[1])?.map(|x| x.0).unwrap_or_default();
    r.bulks(h.iter().map(|(f, _)| f));
    Ok(())
}

/// HVALS key.
pub fn hvals(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = load(ctx, a[1])?.map(|x| x.0).unwrap_or_default();
    r.bulks(h.iter().map(|(_, v)| v));
    Ok(())
}

/// HSTRLEN key field.
pub fn hstrlen(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = load(ctx, a[1])?;
    r.int(
        h.as_ref()
            .and_then(|(h, _)| find(h, a[2]))
            .map_or(0, |v| v.len() as i64),
    );
    Ok(())
}

fn upsert(h: &mut Hash, f: &[u8], v: Vec<u8>) {
    match h.iter_mut().find(|(k, _)| k == f) {
        Some(e) => e.1 = v,
        None => h.push((f.to_vec(), v)),
    }
}

/// HINCRBY key field n.
pub fn hincrby(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let by = int_arg(a[3])?;
    let v = modify(ctx, a[1], |h| {
        let old = match find(h, a[2]) {
            Some(v) => parse_i64(v).ok_or(CmdError::from("ERR hash value is not an integer"))?,
            None => 0,
        };
        let new = old
            .checked_add(by)
            .ok_or(CmdError::from("ERR increment or decrement would overflow"))?;
        upsert(h, a[2], new.to_string().into_bytes());
        Ok((new, true))
    })?;
    r.int(v);
    Ok(())
}

/// HINCRBYFLOAT key field f.
pub fn hincrbyfloat(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    // The increment is checked before the key (redis-server's order).
    match crate::longdouble::incr(None, a[3], true) {
        Err(IncrError::Increment) => return Err("ERR value is not a valid float".into()),
        Err(IncrError::IncrementNotFinite) => return Err("ERR value is NaN or Infinity".into()),
        _ => {}
    }
    let s = modify(ctx, a[1], |h| {
        let s = crate::longdouble::incr(find(h, a[2]), a[3], true).map_err(|e| match e {
            IncrError::Current => CmdError::from("ERR hash value is not a float"),
            IncrError::Increment => CmdError::from("ERR value is not a valid float"),
            IncrError::IncrementNotFinite => CmdError::from("ERR value is NaN or Infinity"),
            IncrError::Result => CmdError::from("ERR increment would produce NaN or Infinity"),
        })?;
        upsert(h, a[2], s.clone().into_bytes());
        Ok((s, true))
    })?;
    r.bulk(s.as_bytes());
    Ok(())
}
