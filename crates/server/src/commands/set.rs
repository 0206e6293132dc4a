//! Set commands over `coll` (a small set is one item, `intset` when every
//! member is an integer, a large one a linear-hashing table of buckets).
//!
//! Single-key commands run under their key's stripe, taken by dispatch.
//! SINTER/SUNION/SDIFF and their STORE forms name all their keys in the
//! table (shared for the reads, exclusive for the STORE forms), so a
//! result is computed from sets no writer touches meanwhile. SINTERCARD's
//! keys follow a `numkeys` argument, so it takes their stripes itself.

use std::collections::HashSet;

use super::hash::{rand_count, random_pick, scan_args};
use super::{eq, int_arg, CmdError, CmdResult, Ctx, SYNTAX};
use crate::coll::{self, Kind};
use crate::glob;
use crate::resp::Reply;

/// SADD key member...
pub fn sadd(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    r.int(coll::change_each(
        ctx.shared,
        a[1],
        Kind::Set,
        &a[2..],
        Some(b""),
    )?);
    Ok(())
}

/// SREM key member...
pub fn srem(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    r.int(coll::change_each(
        ctx.shared,
        a[1],
        Kind::Set,
        &a[2..],
        None,
    )?);
    Ok(())
}

/// SISMEMBER key member.
pub fn sismember(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let e = coll::read(ctx.shared, a[1], Kind::Set, |c| c.contains(a[2]))?;
    r.int(i64::from(e == Some(true)));
    Ok(())
}

/// SMISMEMBER key member...
pub fn smismember(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let e = coll::read(ctx.shared, a[1], Kind::Set, |c| {
        a[2..]
            .iter()
            .map(|m| c.contains(m))
            .collect::<Result<Vec<_>, _>>()
    })?;
    r.array(a.len() - 2);
    for i in 0..a.len() - 2 {
        r.int(i64::from(e.as_ref().is_some_and(|e| e[i])));
    }
    Ok(())
}

fn members(ctx: &Ctx, key: &[u8]) -> Result<Option<Vec<Vec<u8>>>, CmdError> {
    Ok(coll::read(ctx.shared, key, Kind::Set, |c| c.all())?
        .map(|v| v.into_iter().map(|p| p.0).collect()))
}

fn reply_set(r: &mut Reply, ms: &[Vec<u8>]) {
    r.set(ms.len());
    for m in ms {
        r.bulk(m);
    }
}

/// SMEMBERS key.
pub fn smembers(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    reply_set(r, &members(ctx, a[1])?.unwrap_or_default());
    Ok(())
}

/// SCARD key.
pub fn scard(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = coll::read(ctx.shared, a[1], Kind::Set, |c| Ok(c.len()))?;
    r.int(n.unwrap_or(0) as i64);
    Ok(())
}

/// SPOP key \[count\].
pub fn spop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if a.len() > 3 {
        return Err(SYNTAX.into());
    }
    if a.len() == 2 {
        let p = coll::modify(ctx.shared, a[1], Kind::Set, |c| {
            let Some(p) = c.random()? else {
                return Ok(None);
            };
            c.remove(&p.0)?;
            Ok(Some(p.0))
        })?;
        r.opt_bulk(p.as_deref());
        return Ok(());
    }
    let n = int_arg(a[2])
        .ok()
        .filter(|n| *n >= 0)
        .ok_or(CmdError::from(
            "ERR value is out of range, must be positive",
        ))?;
    let popped = coll::modify(ctx.shared, a[1], Kind::Set, |c| {
        if n == 0 {
            return Ok(Vec::new());
        }
        let picked = random_pick(c, n as u64, true)?;
        for p in &picked {
            c.remove(&p.0)?;
        }
        Ok(picked.into_iter().map(|p| p.0).collect::<Vec<_>>())
    })?;
    reply_set(r, &popped);
    Ok(())
}

/// SRANDMEMBER key \[count\].
pub fn srandmember(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if a.len() > 3 {
        return Err(SYNTAX.into());
    }
    if a.len() == 2 {
        let p = coll::read(ctx.shared, a[1], Kind::Set, |c| c.random())?.flatten();
        r.opt_bulk(p.as_ref().map(|p| &p.0[..]));
        return Ok(());
    }
    let n = rand_count(a[2])?;
    let picked = coll::read(ctx.shared, a[1], Kind::Set, |c| {
        if n == 0 {
            return Ok(Vec::new());
        }
        random_pick(c, n.unsigned_abs(), n > 0)
    })?
    .unwrap_or_default();
    r.bulks(picked.iter().map(|p| &p.0));
    Ok(())
}

/// SSCAN key cursor [MATCH pattern] [COUNT count].
pub fn sscan(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (cursor, pat, count) = scan_args(a)?;
    let (next, items) = coll::read(ctx.shared, a[1], Kind::Set, |c| c.scan(cursor, count))?
        .unwrap_or((0, Vec::new()));
    let items: Vec<_> = items
        .into_iter()
        .filter(|(m, _)| pat.is_none_or(|p| glob::matches(p, m)))
        .collect();
    r.array(2);
    r.bulk(next.to_string().as_bytes());
    r.bulks(items.iter().map(|p| &p.0));
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Inter,
    Union,
    Diff,
}

/// The members of `op` over `keys` (every key's type is checked first, as
/// redis-server 7.0 does, even when a missing key makes SINTER empty).
fn combine(ctx: &Ctx, keys: &[&[u8]], op: Op, limit: usize) -> Result<Vec<Vec<u8>>, CmdError> {
    let mut sets = Vec::with_capacity(keys.len());
    let mut missing = false;
    for k in keys {
        match members(ctx, k)? {
            Some(m) => sets.push(m),
            None if op == Op::Diff && sets.is_empty() => sets.push(Vec::new()),
            None => missing = true,
        }
    }
    if op == Op::Inter && missing {
        return Ok(Vec::new());
    }
    Ok(match op {
        Op::Inter => {
            sets.sort_by_key(Vec::len);
            let rest: Vec<HashSet<&[u8]>> = sets[1..]
                .iter()
                .map(|s| s.iter().map(|m| &m[..]).collect())
                .collect();
            let mut out = Vec::new();
            for m in &sets[0] {
                if rest.iter().all(|s| s.contains(&m[..])) {
                    out.push(m.clone());
                    if out.len() == limit {
                        break;
                    }
                }
            }
            out
        }
        Op::Union => {
            let mut seen = HashSet::new();
            let mut out = Vec::new();
            for s in sets {
                for m in s {
                    if seen.insert(m.clone()) {
                        out.push(m);
                    }
                }
            }
            out
        }
        Op::Diff => {
            let Some((first, rest)) = sets.split_first() else {
                return Ok(Vec::new());
            };
            let rest: HashSet<&[u8]> = rest.iter().flatten().map(|m| &m[..]).collect();
            first
                .iter()
                .filter(|m| !rest.contains(&m[..]))
                .cloned()
                .collect()
        }
    })
}

fn combine_reply(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, op: Op) -> CmdResult {
    let out = combine(ctx, &a[1..], op, usize::MAX)?;
    reply_set(r, &out);
    Ok(())
}

fn combine_store(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, op: Op) -> CmdResult {
    let out = combine(ctx, &a[2..], op, usize::MAX)?;
    coll::delete_key(&ctx.shared.store, a[1])?;
    if !out.is_empty() {
        let items: Vec<coll::Pair> = out.into_iter().map(|m| (m, Vec::new())).collect();
        coll::create(ctx.shared, a[1], Kind::Set, &items, None)?;
        r.int(items.len() as i64);
    } else {
        r.int(0);
    }
    Ok(())
}

/// SINTER key...
pub fn sinter(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    combine_reply(ctx, a, r, Op::Inter)
}

/// SUNION key...
pub fn sunion(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    combine_reply(ctx, a, r, Op::Union)
}

/// SDIFF key...
pub fn sdiff(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    combine_reply(ctx, a, r, Op::Diff)
}

/// SINTERSTORE destination key...
pub fn sinterstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    combine_store(ctx, a, r, Op::Inter)
}

/// SUNIONSTORE destination key...
pub fn sunionstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    combine_store(ctx, a, r, Op::Union)
}

/// SDIFFSTORE destination key...
pub fn sdiffstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    combine_store(ctx, a, r, Op::Diff)
}

/// SINTERCARD numkeys key... [LIMIT limit]. The keys follow `numkeys`, so
/// the table names none and the stripes are taken here (shared).
pub fn sintercard(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = super::parse_i64(a[1])
        .filter(|n| *n > 0)
        .ok_or(CmdError::from("ERR numkeys should be greater than 0"))?;
    if n as usize > a.len() - 2 {
        return Err("ERR Number of keys can't be greater than number of args".into());
    }
    let keys = &a[2..2 + n as usize];
    let mut limit = 0i64;
    let mut i = 2 + n as usize;
    while i < a.len() {
        if eq(a[i], "limit") && i + 1 < a.len() {
            limit = int_arg(a[i + 1])?;
            if limit < 0 {
                return Err("ERR LIMIT can't be negative".into());
            }
            i += 2;
        } else {
            return Err(SYNTAX.into());
        }
    }
    let limit = if limit == 0 {
        usize::MAX
    } else {
        limit as usize
    };
    let _g = ctx.lock(keys.iter().copied(), false);
    let out = combine(ctx, keys, Op::Inter, limit)?;
    r.int(out.len() as i64);
    Ok(())
}

/// SMOVE source destination member.
pub fn smove(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (src, dst, m) = (a[1], a[2], a[3]);
    let store = &ctx.shared.store;
    // Both types are checked before anything moves (redis-server's order:
    // a missing source first, then the types).
    let Some(sm) = store.meta(src)? else {
        r.int(0);
        return Ok(());
    };
    let dm = store.meta(dst)?;
    if sm.flags != Kind::Set.flags() || dm.is_some_and(|d| d.flags != Kind::Set.flags()) {
        return Err(super::WRONGTYPE.into());
    }
    if src == dst {
        let e = coll::read(ctx.shared, src, Kind::Set, |c| c.contains(m))?;
        r.int(i64::from(e == Some(true)));
        return Ok(());
    }
    let moved = coll::modify(ctx.shared, src, Kind::Set, |c| c.remove(m))?;
    if moved {
        coll::modify(ctx.shared, dst, Kind::Set, |c| c.insert(m, b""))?;
    }
    r.int(i64::from(moved));
    Ok(())
}
