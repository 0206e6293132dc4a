//! Hash commands over `coll`: a small hash is one engine item, a large one
//! a linear-hashing table of bucket items (see `coll` for both, and
//! `types` for the flags value that marks a hash).
//!
//! Every command runs under its key's stripe (exclusive for writes), so a
//! write is read, change, [`coll::modify`]'s commit; the commit reruns the
//! command only if a writer outside the stripe (memcached, expiry) replaced
//! the key meanwhile. HSET of one field and HDEL of one go through
//! [`coll::modify_one`]: one engine read-modify-write of a small hash. A
//! hash left empty is deleted, as Redis removes empty hashes.

use super::{eq, int_arg, parse_i64, CmdError, CmdResult, Ctx, SYNTAX};
use crate::coll::{self, Coll, Kind};
use crate::glob;
use crate::longdouble::IncrError;
use crate::resp::{Proto, Reply};

fn check_pairs(a: &[&[u8]], cmd: &str) -> CmdResult {
    if a.len() & 1 != 0 {
        return Err(format!("ERR wrong number of arguments for '{cmd}' command").into());
    }
    Ok(())
}

fn set_fields(c: &mut Coll, pairs: &[&[u8]]) -> Result<i64, CmdError> {
    let mut added = 0;
    for kv in pairs.chunks(2) {
        added += i64::from(c.insert(kv[0], kv[1])?);
    }
    Ok(added)
}

/// HSET key field value [field value ...].
pub fn hset(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    check_pairs(a, "hset")?;
    let n = if a.len() == 4 {
        i64::from(coll::modify_one(
            ctx.shared,
            a[1],
            Kind::Hash,
            a[2],
            Some(a[3]),
        )?)
    } else {
        coll::modify(ctx.shared, a[1], Kind::Hash, |c| set_fields(c, &a[2..]))?
    };
    r.int(n);
    Ok(())
}

/// HMSET key field value [field value ...].
pub fn hmset(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    check_pairs(a, "hmset")?;
    coll::modify(ctx.shared, a[1], Kind::Hash, |c| set_fields(c, &a[2..]))?;
    r.ok();
    Ok(())
}

/// HSETNX key field value.
pub fn hsetnx(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = coll::modify(ctx.shared, a[1], Kind::Hash, |c| {
        if c.contains(a[2])? {
            return Ok(0);
        }
        c.insert(a[2], a[3])?;
        Ok(1)
    })?;
    r.int(n);
    Ok(())
}

/// HGET key field.
pub fn hget(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let v = coll::read(ctx.shared, a[1], Kind::Hash, |c| c.get(a[2]))?.flatten();
    ctx.hit(v.is_some());
    r.opt_bulk(v.as_deref());
    Ok(())
}

/// HMGET key field...
pub fn hmget(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let vs = coll::read(ctx.shared, a[1], Kind::Hash, |c| {
        a[2..]
            .iter()
            .map(|f| c.get(f))
            .collect::<Result<Vec<_>, _>>()
    })?;
    r.array(a.len() - 2);
    for i in 0..a.len() - 2 {
        r.opt_bulk(vs.as_ref().and_then(|v| v[i].as_deref()));
    }
    Ok(())
}

fn all(ctx: &mut Ctx, key: &[u8]) -> Result<Vec<coll::Pair>, CmdError> {
    Ok(coll::read(ctx.shared, key, Kind::Hash, |c| c.all())?.unwrap_or_default())
}

/// HGETALL key (a map in RESP3).
pub fn hgetall(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = all(ctx, a[1])?;
    r.map(h.len());
    for (f, v) in &h {
        r.bulk(f);
        r.bulk(v);
    }
    Ok(())
}

/// HDEL key field...
pub fn hdel(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    r.int(coll::change_each(
        ctx.shared,
        a[1],
        Kind::Hash,
        &a[2..],
        None,
    )?);
    Ok(())
}

/// HEXISTS key field.
pub fn hexists(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let e = coll::read(ctx.shared, a[1], Kind::Hash, |c| c.contains(a[2]))?;
    r.int(i64::from(e == Some(true)));
    Ok(())
}

/// HLEN key.
pub fn hlen(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = coll::read(ctx.shared, a[1], Kind::Hash, |c| Ok(c.len()))?;
    r.int(n.unwrap_or(0) as i64);
    Ok(())
}

/// HKEYS key.
pub fn hkeys(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = all(ctx, a[1])?;
    r.bulks(h.iter().map(|(f, _)| f));
    Ok(())
}

/// HVALS key.
pub fn hvals(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let h = all(ctx, a[1])?;
    r.bulks(h.iter().map(|(_, v)| v));
    Ok(())
}

/// HSTRLEN key field.
pub fn hstrlen(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let v = coll::read(ctx.shared, a[1], Kind::Hash, |c| c.get(a[2]))?.flatten();
    r.int(v.map_or(0, |v| v.len() as i64));
    Ok(())
}

/// HINCRBY key field n.
pub fn hincrby(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let by = int_arg(a[3])?;
    let v = coll::modify(ctx.shared, a[1], Kind::Hash, |c| {
        let old = match c.get(a[2])? {
            Some(v) => parse_i64(&v).ok_or(CmdError::from("ERR hash value is not an integer"))?,
            None => 0,
        };
        let new = old
            .checked_add(by)
            .ok_or(CmdError::from("ERR increment or decrement would overflow"))?;
        c.insert(a[2], new.to_string().as_bytes())?;
        Ok(new)
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
    let s = coll::modify(ctx.shared, a[1], Kind::Hash, |c| {
        let cur = c.get(a[2])?;
        let s = crate::longdouble::incr(cur.as_deref(), a[3], true).map_err(|e| match e {
            IncrError::Current => CmdError::from("ERR hash value is not a float"),
            IncrError::Increment => CmdError::from("ERR value is not a valid float"),
            IncrError::IncrementNotFinite => CmdError::from("ERR value is NaN or Infinity"),
            IncrError::Result => CmdError::from("ERR increment would produce NaN or Infinity"),
        })?;
        c.insert(a[2], s.as_bytes())?;
        Ok(s)
    })?;
    r.bulk(s.as_bytes());
    Ok(())
}

/// The arguments of HSCAN/SSCAN after the key: cursor, MATCH, COUNT
/// (redis-server's parsing and error texts).
pub(super) fn scan_args<'a>(a: &[&'a [u8]]) -> Result<(u64, Option<&'a [u8]>, usize), CmdError> {
    let cursor: u64 = std::str::from_utf8(a[2])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(CmdError::from("ERR invalid cursor"))?;
    let (mut pat, mut count) = (None, 10usize);
    let mut i = 3;
    while i < a.len() {
        if eq(a[i], "count") && i + 1 < a.len() {
            let c = int_arg(a[i + 1])?;
            if c < 1 {
                return Err(SYNTAX.into());
            }
            count = c as usize;
        } else if eq(a[i], "match") && i + 1 < a.len() {
            pat = Some(a[i + 1]).filter(|p| *p != b"*");
        } else {
            return Err(SYNTAX.into());
        }
        i += 2;
    }
    Ok((cursor, pat, count))
}

/// HSCAN key cursor [MATCH pattern] [COUNT count].
pub fn hscan(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (cursor, pat, count) = scan_args(a)?;
    let (next, items) = coll::read(ctx.shared, a[1], Kind::Hash, |c| c.scan(cursor, count))?
        .unwrap_or((0, Vec::new()));
    let items: Vec<_> = items
        .into_iter()
        .filter(|(f, _)| pat.is_none_or(|p| glob::matches(p, f)))
        .collect();
    r.array(2);
    r.bulk(next.to_string().as_bytes());
    r.array(items.len() * 2);
    for (f, v) in &items {
        r.bulk(f);
        r.bulk(v);
    }
    Ok(())
}

/// A random-count argument (HRANDFIELD, SRANDMEMBER): any i64 but
/// i64::MIN, as redis-server's `-LONG_MAX..LONG_MAX`.
pub(super) fn rand_count(b: &[u8]) -> Result<i64, CmdError> {
    let n = int_arg(b)?;
    if n == i64::MIN {
        return Err(
            "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807"
                .into(),
        );
    }
    Ok(n)
}

/// `count` random elements of `c`: distinct if `uniq` (then at most
/// `len`), else exactly `count`, possibly repeated.
pub(super) fn random_pick(
    c: &mut Coll,
    count: u64,
    uniq: bool,
) -> Result<Vec<coll::Pair>, CmdError> {
    let len = c.len();
    if !uniq {
        let mut out = Vec::with_capacity(count.min(1 << 20) as usize);
        for _ in 0..count {
            match c.random()? {
                Some(p) => out.push(p),
                None => break,
            }
        }
        return Ok(out);
    }
    if count >= len {
        return c.all();
    }
    if count * 3 > len {
        // Many of them: shuffle the whole set and keep a prefix.
        let mut all = c.all()?;
        for i in 0..count as usize {
            let j = i + (coll::random_u64() % (all.len() - i) as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(count as usize);
        return Ok(all);
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(count as usize);
    while (out.len() as u64) < count {
        let Some(p) = c.random()? else { break };
        if seen.insert(p.0.clone()) {
            out.push(p);
        }
    }
    Ok(out)
}

/// HRANDFIELD key [count \[WITHVALUES\]].
pub fn hrandfield(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if a.len() > 4 || (a.len() == 4 && !eq(a[3], "withvalues")) {
        return Err(SYNTAX.into());
    }
    if a.len() == 2 {
        let p = coll::read(ctx.shared, a[1], Kind::Hash, |c| c.random())?.flatten();
        r.opt_bulk(p.as_ref().map(|p| &p.0[..]));
        return Ok(());
    }
    let n = rand_count(a[2])?;
    let with = a.len() == 4;
    let picked = coll::read(ctx.shared, a[1], Kind::Hash, |c| {
        if n == 0 {
            return Ok(Vec::new());
        }
        random_pick(c, n.unsigned_abs(), n > 0)
    })?
    .unwrap_or_default();
    if !with {
        r.bulks(picked.iter().map(|p| &p.0));
    } else if ctx.sess.proto == Proto::Resp3 {
        r.array(picked.len());
        for (f, v) in &picked {
            r.array(2);
            r.bulk(f);
            r.bulk(v);
        }
    } else {
        r.array(picked.len() * 2);
        for (f, v) in &picked {
            r.bulk(f);
            r.bulk(v);
        }
    }
    Ok(())
}
