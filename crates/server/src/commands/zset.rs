//! Sorted-set commands over `crate::zset` (a small zset is one item, a
//! large one a member table plus a counted B+tree of engine items).
//!
//! Parsing, option checks and error texts follow redis-server 7.0's
//! `t_zset.c` in its order: options, then scores and ranges, then the
//! key's type. Scores are replied with `%.17g` (7.0's `addReplyDouble`):
//! bulk strings in RESP2, doubles in RESP3. Every command runs under its
//! key's stripe, taken by dispatch.

use super::hash::{rand_count, scan_args};
use super::{eq, int_arg, parse_f64, CmdError, CmdResult, Ctx, SYNTAX};
use crate::glob;
use crate::resp::{Proto, Reply};
use crate::zset::{self, cmp_entry, Entry, ZSet};

const NOT_FLOAT: &str = "ERR value is not a valid float";
const RANGE_NOT_FLOAT: &str = "ERR min or max is not a float";
const LEX_INVALID: &str = "ERR min or max not valid string range item";
const NAN_SCORE: &str = "ERR resulting score is not a number (NaN)";

/// `%.17g`, as C's printf (redis-server 7.0's score replies).
pub fn fmt_g17(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    let e = format!("{v:.16e}");
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..17).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", strip(mant), exp.abs())
    } else {
        strip(&format!("{:.*}", (16 - exp) as usize, v))
    }
}

/// redis-server's `d2string`: integers in ±2^62 as integers, else `%.17g`
/// (scores as a listpack stores them: ZSCAN).
pub fn fmt_d2string(v: f64) -> String {
    const HALF_LLONG: f64 = (i64::MAX / 2) as f64;
    if v != 0.0 && v.is_finite() && v.trunc() == v && (-HALF_LLONG..=HALF_LLONG).contains(&v) {
        return (v as i64).to_string();
    }
    fmt_g17(v)
}

/// A score: a bulk string in RESP2, a double in RESP3.
pub fn reply_score(r: &mut Reply, v: f64) {
    let s = fmt_g17(v);
    if r.proto == Proto::Resp3 {
        r.out.push(b',');
        r.out.extend_from_slice(s.as_bytes());
        r.out.extend_from_slice(b"\r\n");
    } else {
        r.bulk(s.as_bytes());
    }
}

fn float_arg(b: &[u8]) -> Result<f64, CmdError> {
    parse_f64(b).ok_or(CmdError::from(NOT_FLOAT))
}

/// ZADD key [NX|XX] [GT|LT] \[CH\] \[INCR\] score member [score member ...].
pub fn zadd(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) =
        (false, false, false, false, false, false);
    let mut i = 2;
    while i < a.len() {
        let f = a[i];
        if eq(f, "nx") {
            nx = true;
        } else if eq(f, "xx") {
            xx = true;
        } else if eq(f, "gt") {
            gt = true;
        } else if eq(f, "lt") {
            lt = true;
        } else if eq(f, "ch") {
            ch = true;
        } else if eq(f, "incr") {
            incr = true;
        } else {
            break;
        }
        i += 1;
    }
    let rest = &a[i..];
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Err(SYNTAX.into());
    }
    if nx && xx {
        return Err("ERR XX and NX options at the same time are not compatible".into());
    }
    if (nx && (gt || lt)) || (gt && lt) {
        return Err("ERR GT, LT, and/or NX options at the same time are not compatible".into());
    }
    if incr && rest.len() > 2 {
        return Err("ERR INCR option supports a single increment-element pair".into());
    }
    let pairs: Vec<(f64, &[u8])> = rest
        .chunks(2)
        .map(|p| Ok((float_arg(p[0])?, p[1])))
        .collect::<Result<_, CmdError>>()?;
    let opts = AddOpts {
        nx,
        xx,
        gt,
        lt,
        incr,
    };
    if xx && ctx.shared.store.meta(a[1])?.is_none() {
        if incr {
            r.null();
        } else {
            r.int(0);
        }
        return Ok(());
    }
    let (added, updated, last) = zset::modify(ctx.shared, a[1], |z| {
        let (mut added, mut updated, mut last) = (0i64, 0i64, None);
        for &(s, m) in &pairs {
            match add_one(z, m, s, opts)? {
                Added::New(s) => {
                    added += 1;
                    last = Some(s);
                }
                Added::Updated(s) => {
                    updated += 1;
                    last = Some(s);
                }
                Added::Same(s) => last = Some(s),
                Added::Nop => {}
            }
        }
        Ok((added, updated, last))
    })?;
    if incr {
        match last {
            Some(s) => reply_score(r, s),
            None => r.null(),
        }
    } else {
        r.int(if ch { added + updated } else { added });
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct AddOpts {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    incr: bool,
}

enum Added {
    New(f64),
    Updated(f64),
    Same(f64),
    Nop,
}

/// redis-server's `zsetAdd` for one member.
fn add_one(z: &mut ZSet, m: &[u8], s: f64, o: AddOpts) -> Result<Added, CmdError> {
    match z.score(m)? {
        Some(cur) => {
            if o.nx {
                return Ok(Added::Nop);
            }
            let s = if o.incr { s + cur } else { s };
            if s.is_nan() {
                return Err(NAN_SCORE.into());
            }
            if (o.lt && s >= cur) || (o.gt && s <= cur) {
                return Ok(Added::Nop);
            }
            if s == cur {
                return Ok(Added::Same(s));
            }
            z.insert(m, s)?;
            Ok(Added::Updated(s))
        }
        None => {
            if o.xx {
                return Ok(Added::Nop);
            }
            z.insert(m, s)?;
            Ok(Added::New(s))
        }
    }
}

/// ZINCRBY key increment member.
pub fn zincrby(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let by = float_arg(a[2])?;
    let opts = AddOpts {
        nx: false,
        xx: false,
        gt: false,
        lt: false,
        incr: true,
    };
    let s = zset::modify(ctx.shared, a[1], |z| match add_one(z, a[3], by, opts)? {
        Added::New(s) | Added::Updated(s) | Added::Same(s) => Ok(s),
        Added::Nop => Ok(by),
    })?;
    reply_score(r, s);
    Ok(())
}

/// ZREM key member...
pub fn zrem(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if ctx.shared.store.meta(a[1])?.is_none() {
        r.int(0);
        return Ok(());
    }
    let n = zset::modify(ctx.shared, a[1], |z| {
        let mut n = 0;
        for m in &a[2..] {
            n += i64::from(z.remove(m)?.is_some());
        }
        Ok(n)
    })?;
    r.int(n);
    Ok(())
}

/// ZSCORE key member.
pub fn zscore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    match zset::read(ctx.shared, a[1], |z| z.score(a[2]))?.flatten() {
        Some(s) => reply_score(r, s),
        None => r.null(),
    }
    Ok(())
}

/// ZMSCORE key member...
pub fn zmscore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let ss = zset::read(ctx.shared, a[1], |z| {
        a[2..]
            .iter()
            .map(|m| z.score(m))
            .collect::<Result<Vec<_>, _>>()
    })?
    .unwrap_or_else(|| vec![None; a.len() - 2]);
    r.array(ss.len());
    for s in ss {
        match s {
            Some(s) => reply_score(r, s),
            None => r.null(),
        }
    }
    Ok(())
}

/// ZCARD key.
pub fn zcard(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = zset::read(ctx.shared, a[1], |z| Ok(z.len()))?.unwrap_or(0);
    r.int(n as i64);
    Ok(())
}

/// A score bound: value and whether exclusive.
#[derive(Clone, Copy)]
struct ScoreBound(f64, bool);

/// `strtod` over the whole argument as `zslParseRange` uses it: leading
/// spaces skipped, nothing (or only spaces) reads as 0.
fn strtod_all(b: &[u8]) -> Option<f64> {
    let t = b.trim_ascii_start();
    if t.is_empty() {
        return Some(0.0);
    }
    parse_f64(t)
}

fn score_bound(b: &[u8]) -> Option<ScoreBound> {
    match b.strip_prefix(b"(") {
        Some(rest) => Some(ScoreBound(strtod_all(rest)?, true)),
        None => Some(ScoreBound(strtod_all(b)?, false)),
    }
}

/// A lex bound.
#[derive(Clone)]
enum LexBound {
    Min,
    Max,
    Incl(Vec<u8>),
    Excl(Vec<u8>),
}

fn lex_bound(b: &[u8]) -> Option<LexBound> {
    match b.split_first()? {
        (b'+', []) => Some(LexBound::Max),
        (b'-', []) => Some(LexBound::Min),
        (b'[', r) => Some(LexBound::Incl(r.to_vec())),
        (b'(', r) => Some(LexBound::Excl(r.to_vec())),
        _ => None,
    }
}

/// A range of ranks `lo..hi` selected by bounds.
enum Bounds {
    Score(ScoreBound, ScoreBound),
    Lex(LexBound, LexBound),
}

impl Bounds {
    fn parse_score(min: &[u8], max: &[u8]) -> Result<Bounds, CmdError> {
        match (score_bound(min), score_bound(max)) {
            (Some(a), Some(b)) => Ok(Bounds::Score(a, b)),
            _ => Err(RANGE_NOT_FLOAT.into()),
        }
    }

    fn parse_lex(min: &[u8], max: &[u8]) -> Result<Bounds, CmdError> {
        match (lex_bound(min), lex_bound(max)) {
            (Some(a), Some(b)) => Ok(Bounds::Lex(a, b)),
            _ => Err(LEX_INVALID.into()),
        }
    }

    /// The ranks `lo..hi` of the entries inside the bounds.
    fn ranks(&self, z: &mut ZSet) -> Result<(u64, u64), CmdError> {
        let (lo, hi) = match self {
            Bounds::Score(min, max) => {
                let (m, x) = (*min, *max);
                let lo = z.rank_by(|s, _| if m.1 { s <= m.0 } else { s < m.0 })?;
                let hi = z.rank_by(|s, _| if x.1 { s < x.0 } else { s <= x.0 })?;
                (lo, hi)
            }
            Bounds::Lex(min, max) => {
                let lo = match min {
                    LexBound::Min => 0,
                    LexBound::Max => z.len(),
                    LexBound::Incl(b) => z.rank_by(|_, m| m < &b[..])?,
                    LexBound::Excl(b) => z.rank_by(|_, m| m <= &b[..])?,
                };
                let hi = match max {
                    LexBound::Min => 0,
                    LexBound::Max => z.len(),
                    LexBound::Incl(b) => z.rank_by(|_, m| m <= &b[..])?,
                    LexBound::Excl(b) => z.rank_by(|_, m| m < &b[..])?,
                };
                (lo, hi)
            }
        };
        Ok((lo, hi.max(lo)))
    }
}

/// ZCOUNT key min max.
pub fn zcount(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let b = Bounds::parse_score(a[2], a[3])?;
    let n = zset::read(ctx.shared, a[1], |z| b.ranks(z).map(|(l, h)| h - l))?;
    r.int(n.unwrap_or(0) as i64);
    Ok(())
}

/// ZLEXCOUNT key min max.
pub fn zlexcount(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let b = Bounds::parse_lex(a[2], a[3])?;
    let n = zset::read(ctx.shared, a[1], |z| b.ranks(z).map(|(l, h)| h - l))?;
    r.int(n.unwrap_or(0) as i64);
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RangeType {
    Auto,
    Rank,
    Score,
    Lex,
}

/// The rank range `lo..hi` of Redis's `start stop` index pair over `len`.
fn index_range(start: i64, stop: i64, len: u64) -> (u64, u64) {
    let len_i = len as i64;
    let mut s = if start < 0 { len_i + start } else { start };
    let e = if stop < 0 { len_i + stop } else { stop };
    if s < 0 {
        s = 0;
    }
    if s > e || s >= len_i {
        return (0, 0);
    }
    let e = e.min(len_i - 1);
    (s as u64, e as u64 + 1)
}

/// redis-server's `zrangeGenericCommand`: `args` starts at the key.
fn zrange_generic(
    ctx: &mut Ctx,
    args: &[&[u8]],
    r: &mut Reply,
    rtype: RangeType,
    rev: Option<bool>,
) -> CmdResult {
    zrange_to(ctx, args, r, rtype, rev, None)
}

/// [`zrange_generic`], storing the range at `dst` (ZRANGESTORE) instead
/// of replying with it.
fn zrange_to(
    ctx: &mut Ctx,
    args: &[&[u8]],
    r: &mut Reply,
    mut rtype: RangeType,
    mut rev: Option<bool>,
    dst: Option<&[u8]>,
) -> CmdResult {
    let (mut withscores, mut offset, mut limit) = (false, 0i64, -1i64);
    let mut j = 3;
    while j < args.len() {
        let left = args.len() - j - 1;
        let f = args[j];
        if dst.is_none() && eq(f, "withscores") {
            withscores = true;
        } else if eq(f, "limit") && left >= 2 {
            offset = int_arg(args[j + 1])?;
            limit = int_arg(args[j + 2])?;
            j += 2;
        } else if rev.is_none() && eq(f, "rev") {
            rev = Some(true);
        } else if rtype == RangeType::Auto && eq(f, "bylex") {
            rtype = RangeType::Lex;
        } else if rtype == RangeType::Auto && eq(f, "byscore") {
            rtype = RangeType::Score;
        } else {
            return Err(SYNTAX.into());
        }
        j += 1;
    }
    let rev = rev.unwrap_or(false);
    if rtype == RangeType::Auto {
        rtype = RangeType::Rank;
    }
    if limit != -1 && rtype == RangeType::Rank {
        return Err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX"
                .into(),
        );
    }
    if withscores && rtype == RangeType::Lex {
        return Err("ERR syntax error, WITHSCORES not supported in combination with BYLEX".into());
    }
    let (mut mn, mut mx) = (args[1], args[2]);
    if rev && rtype != RangeType::Rank {
        std::mem::swap(&mut mn, &mut mx);
    }
    let bounds = match rtype {
        RangeType::Score => Some(Bounds::parse_score(mn, mx)?),
        RangeType::Lex => Some(Bounds::parse_lex(mn, mx)?),
        _ => None,
    };
    let idx = match bounds {
        None => Some((int_arg(mn)?, int_arg(mx)?)),
        Some(_) => None,
    };
    let span = |z: &mut zset::ZSet| -> Result<(u64, u64), CmdError> {
        let len = z.len();
        Ok(match (&bounds, idx) {
            (Some(b), _) => {
                let (lo, hi) = b.ranks(z)?;
                if offset < 0 || (offset > 0 && offset as u64 >= len) {
                    return Ok((0, 0));
                }
                let n = hi - lo;
                let skip = (offset as u64).min(n);
                let take = if limit < 0 {
                    n - skip
                } else {
                    (limit as u64).min(n - skip)
                };
                if rev {
                    (hi - skip - take, hi - skip)
                } else {
                    (lo + skip, lo + skip + take)
                }
            }
            (None, Some((start, stop))) => {
                let (s, e) = index_range(start, stop, len);
                if rev {
                    (len - e.max(s).min(len), len - s)
                } else {
                    (s, e)
                }
                .clamp_empty()
            }
            (None, None) => (0, 0),
        })
    };
    let Some(d) = dst else {
        // The reply is written from the zset's entries in place, without
        // copying them out first.
        let found = zset::read(ctx.shared, args[0], |z| {
            let (lo, hi) = span(z)?;
            let n = hi.min(z.len()).saturating_sub(lo) as usize;
            entries_header(r, n, withscores);
            z.visit_range(lo, hi, rev, |s, m| reply_entry(r, s, m, withscores))
        })?;
        if found.is_none() {
            entries_header(r, 0, withscores);
        }
        return Ok(());
    };
    let out = zset::read(ctx.shared, args[0], |z| {
        let (lo, hi) = span(z)?;
        let mut v = z.range(lo, hi)?;
        if rev {
            v.reverse();
        }
        Ok(v)
    })?
    .unwrap_or_default();
    crate::coll::delete_key(&ctx.shared.store, d)?;
    if !out.is_empty() {
        zset::create(ctx.shared, d, &out)?;
    }
    r.int(out.len() as i64);
    Ok(())
}

/// ZRANGESTORE dst src min max [BYSCORE|BYLEX] \[REV\] [LIMIT offset count].
pub fn zrangestore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    zrange_to(ctx, &a[2..], r, RangeType::Auto, None, Some(a[1]))
}

trait ClampEmpty {
    fn clamp_empty(self) -> Self;
}

impl ClampEmpty for (u64, u64) {
    fn clamp_empty(self) -> Self {
        if self.0 >= self.1 {
            (0, 0)
        } else {
            self
        }
    }
}

fn reply_entries(r: &mut Reply, es: &[Entry], withscores: bool) {
    entries_header(r, es.len(), withscores);
    for (s, m) in es {
        reply_entry(r, *s, m, withscores);
    }
}

/// The array header of `n` entries: WITHSCORES in RESP3 gives one
/// (member, score) pair per entry, in RESP2 members and scores flat.
fn entries_header(r: &mut Reply, n: usize, withscores: bool) {
    let flat = withscores && r.proto != Proto::Resp3;
    r.array(if flat { n * 2 } else { n });
}

/// One entry after [`entries_header`].
fn reply_entry(r: &mut Reply, s: f64, m: &[u8], withscores: bool) {
    if withscores && r.proto == Proto::Resp3 {
        r.array(2);
    }
    r.bulk(m);
    if withscores {
        reply_score(r, s);
    }
}

/// ZRANGE key start stop [BYSCORE|BYLEX] \[REV\] [LIMIT offset count] \[WITHSCORES\].
pub fn zrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    zrange_generic(ctx, &a[1..], r, RangeType::Auto, None)
}

/// ZREVRANGE key start stop \[WITHSCORES\].
pub fn zrevrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    zrange_generic(ctx, &a[1..], r, RangeType::Rank, Some(true))
}

/// ZRANGEBYSCORE key min max \[WITHSCORES\] [LIMIT offset count].
pub fn zrangebyscore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    zrange_generic(ctx, &a[1..], r, RangeType::Score, Some(false))
}

/// ZREVRANGEBYSCORE key max min \[WITHSCORES\] [LIMIT offset count].
pub fn zrevrangebyscore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    zrange_generic(ctx, &a[1..], r, RangeType::Score, Some(true))
}

/// ZRANGEBYLEX key min max [LIMIT offset count].
pub fn zrangebylex(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    zrange_generic(ctx, &a[1..], r, RangeType::Lex, Some(false))
}

/// ZREVRANGEBYLEX key max min [LIMIT offset count].
pub fn zrevrangebylex(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    zrange_generic(ctx, &a[1..], r, RangeType::Lex, Some(true))
}

fn rank_generic(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, rev: bool) -> CmdResult {
    let rk = zset::read(ctx.shared, a[1], |z| {
        Ok(z.rank(a[2])?.map(|k| if rev { z.len() - 1 - k } else { k }))
    })?
    .flatten();
    match rk {
        Some(k) => r.int(k as i64),
        None => r.null(),
    }
    Ok(())
}

/// ZRANK key member.
pub fn zrank(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    rank_generic(ctx, a, r, false)
}

/// ZREVRANK key member.
pub fn zrevrank(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    rank_generic(ctx, a, r, true)
}

/// Remove the entries of ranks `lo..hi` chosen by `pick`; how many.
fn remove_range(
    ctx: &mut Ctx,
    key: &[u8],
    pick: impl Fn(&mut ZSet) -> Result<(u64, u64), CmdError>,
) -> Result<i64, CmdError> {
    if ctx.shared.store.meta(key)?.is_none() {
        return Ok(0);
    }
    zset::modify(ctx.shared, key, |z| {
        let (lo, hi) = pick(z)?;
        let victims = z.range(lo, hi)?;
        for (_, m) in &victims {
            z.remove(m)?;
        }
        Ok(victims.len() as i64)
    })
}

/// ZREMRANGEBYRANK key start stop.
pub fn zremrangebyrank(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (start, stop) = (int_arg(a[2])?, int_arg(a[3])?);
    let n = remove_range(ctx, a[1], |z| Ok(index_range(start, stop, z.len())))?;
    r.int(n);
    Ok(())
}

/// ZREMRANGEBYSCORE key min max.
pub fn zremrangebyscore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let b = Bounds::parse_score(a[2], a[3])?;
    let n = remove_range(ctx, a[1], |z| b.ranks(z))?;
    r.int(n);
    Ok(())
}

/// ZREMRANGEBYLEX key min max.
pub fn zremrangebylex(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let b = Bounds::parse_lex(a[2], a[3])?;
    let n = remove_range(ctx, a[1], |z| b.ranks(z))?;
    r.int(n);
    Ok(())
}

fn pop_generic(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, max: bool) -> CmdResult {
    if a.len() > 3 {
        return Err(SYNTAX.into());
    }
    let count = match a.get(2) {
        Some(c) => {
            let n = int_arg(c).ok().filter(|n| *n >= 0).ok_or(CmdError::from(
                "ERR value is out of range, must be positive",
            ))?;
            if n == 0 {
                // redis-server checks the type first.
                zset::read(ctx.shared, a[1], |_| Ok(()))?;
                r.array(0);
                return Ok(());
            }
            n as u64
        }
        None => 1,
    };
    let popped = if ctx.shared.store.meta(a[1])?.is_none() {
        Vec::new()
    } else {
        zset::modify(ctx.shared, a[1], |z| {
            let len = z.len();
            let n = count.min(len);
            let mut v = if max {
                let mut v = z.range(len - n, len)?;
                v.reverse();
                v
            } else {
                z.range(0, n)?
            };
            for (_, m) in &v {
                z.remove(m)?;
            }
            v.shrink_to_fit();
            Ok(v)
        })?
    };
    let nested = r.proto == Proto::Resp3 && a.len() == 3;
    if nested {
        reply_entries(r, &popped, true);
    } else {
        r.array(popped.len() * 2);
        for (s, m) in &popped {
            r.bulk(m);
            reply_score(r, *s);
        }
    }
    Ok(())
}

/// ZPOPMIN key \[count\].
pub fn zpopmin(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    pop_generic(ctx, a, r, false)
}

/// ZPOPMAX key \[count\].
pub fn zpopmax(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    pop_generic(ctx, a, r, true)
}

/// ZRANDMEMBER key [count \[WITHSCORES\]].
pub fn zrandmember(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if a.len() > 4 || (a.len() == 4 && !eq(a[3], "withscores")) {
        return Err(SYNTAX.into());
    }
    if a.len() == 2 {
        let p = zset::read(ctx.shared, a[1], |z| {
            let n = z.len();
            let k = crate::coll::random_u64() % n.max(1);
            Ok(z.range(k, k + 1)?.pop())
        })?
        .flatten();
        r.opt_bulk(p.as_ref().map(|p| &p.1[..]));
        return Ok(());
    }
    let n = rand_count(a[2])?;
    let with = a.len() == 4;
    let picked = zset::read(ctx.shared, a[1], |z| {
        let len = z.len();
        if n == 0 || len == 0 {
            return Ok(Vec::new());
        }
        if n > 0 && n as u64 >= len {
            return z.all();
        }
        if n > 0 && n as u64 * 3 > len {
            // Many of them: shuffle every entry and keep a prefix.
            let mut all = z.all()?;
            for i in 0..n as usize {
                let j = i + (crate::coll::random_u64() % (all.len() - i) as u64) as usize;
                all.swap(i, j);
            }
            all.truncate(n as usize);
            return Ok(all);
        }
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        while (out.len() as u64) < n.unsigned_abs() {
            let k = crate::coll::random_u64() % len;
            if n > 0 && !seen.insert(k) {
                continue;
            }
            out.extend(z.range(k, k + 1)?);
        }
        Ok(out)
    })?
    .unwrap_or_default();
    reply_entries(r, &picked, with);
    Ok(())
}

/// ZSCAN key cursor [MATCH pattern] [COUNT count].
pub fn zscan(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (cursor, pat, count) = scan_args(a)?;
    let (next, items) =
        zset::read(ctx.shared, a[1], |z| z.scan(cursor, count))?.unwrap_or((0, Vec::new()));
    let items: Vec<_> = items
        .into_iter()
        .filter(|(_, m)| pat.is_none_or(|p| glob::matches(p, m)))
        .collect();
    r.array(2);
    r.bulk(next.to_string().as_bytes());
    r.array(items.len() * 2);
    for (s, m) in &items {
        r.bulk(m);
        r.bulk(fmt_d2string(*s).as_bytes());
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SetOp {
    Union,
    Inter,
    Diff,
}

#[derive(Clone, Copy)]
enum Aggregate {
    Sum,
    Min,
    Max,
}

fn aggregate(a: Aggregate, target: f64, v: f64) -> f64 {
    match a {
        Aggregate::Sum => {
            let s = target + v;
            if s.is_nan() {
                0.0
            } else {
                s
            }
        }
        Aggregate::Min => v.min(target),
        Aggregate::Max => v.max(target),
    }
}

/// The (member, score) pairs of a zset or set at `key` (a set's members
/// score 1), `None` if absent; WRONGTYPE for other types.
/// A set-operation input: (member, score) pairs.
type Source = Vec<(Vec<u8>, f64)>;

fn source(ctx: &Ctx, key: &[u8]) -> Result<Option<Source>, CmdError> {
    let Some(m) = ctx.shared.store.meta(key)? else {
        return Ok(None);
    };
    match m.flags {
        crate::types::ZSET_FLAGS => Ok(zset::read(ctx.shared, key, |z| z.all())?
            .map(|v| v.into_iter().map(|(s, m)| (m, s)).collect())),
        crate::types::SET_FLAGS => {
            Ok(
                crate::coll::read(ctx.shared, key, crate::coll::Kind::Set, |c| c.all())?
                    .map(|v| v.into_iter().map(|(m, _)| (m, 1.0)).collect()),
            )
        }
        _ => Err(super::WRONGTYPE.into()),
    }
}

/// redis-server's `zunionInterDiffGenericCommand`: `a[nk]` is numkeys;
/// `dst` the destination of a STORE form. Result in zset order.
fn set_op(
    ctx: &mut Ctx,
    a: &[&[u8]],
    nk: usize,
    dst: Option<&[u8]>,
    op: SetOp,
    name: &str,
) -> Result<(Vec<Entry>, bool), CmdError> {
    let n = int_arg(a[nk])?;
    if n < 1 {
        return Err(format!("ERR at least 1 input key is needed for '{name}' command").into());
    }
    if n as usize > a.len() - nk - 1 {
        return Err(SYNTAX.into());
    }
    let n = n as usize;
    let keys = &a[nk + 1..nk + 1 + n];
    let _g = ctx.shared.keylocks.lock_modes(
        keys.iter()
            .map(|k| (*k, false))
            .chain(dst.map(|d| (d, true))),
    );
    let mut srcs = Vec::with_capacity(n);
    for k in keys {
        srcs.push(source(ctx, k)?);
    }
    let mut weights = vec![1.0f64; n];
    let mut agg = Aggregate::Sum;
    let mut withscores = false;
    let mut j = nk + 1 + n;
    while j < a.len() {
        let left = a.len() - j;
        if op != SetOp::Diff && left > n && eq(a[j], "weights") {
            for (i, w) in weights.iter_mut().enumerate() {
                *w = parse_f64(a[j + 1 + i])
                    .ok_or(CmdError::from("ERR weight value is not a float"))?;
            }
            j += 1 + n;
        } else if op != SetOp::Diff && left >= 2 && eq(a[j], "aggregate") {
            agg = if eq(a[j + 1], "sum") {
                Aggregate::Sum
            } else if eq(a[j + 1], "min") {
                Aggregate::Min
            } else if eq(a[j + 1], "max") {
                Aggregate::Max
            } else {
                return Err(SYNTAX.into());
            };
            j += 2;
        } else if dst.is_none() && eq(a[j], "withscores") {
            withscores = true;
            j += 1;
        } else {
            return Err(SYNTAX.into());
        }
    }
    let weigh = |w: f64, s: f64| {
        let v = w * s;
        if v.is_nan() {
            0.0
        } else {
            v
        }
    };
    let mut out: Vec<Entry> = Vec::new();
    match op {
        SetOp::Union => {
            let mut acc: std::collections::HashMap<Vec<u8>, f64> = Default::default();
            let mut order = Vec::new();
            for (src, w) in srcs.iter().zip(&weights) {
                for (m, s) in src.iter().flatten() {
                    let v = weigh(*w, *s);
                    match acc.get_mut(m) {
                        Some(t) => *t = aggregate(agg, *t, v),
                        None => {
                            acc.insert(m.clone(), v);
                            order.push(m.clone());
                        }
                    }
                }
            }
            out = order.into_iter().map(|m| (acc[&m], m)).collect();
        }
        SetOp::Inter => {
            if srcs.iter().all(Option::is_some) {
                let mut idx: Vec<usize> = (0..n).collect();
                idx.sort_by_key(|&i| srcs[i].as_ref().map_or(0, Vec::len));
                let maps: Vec<std::collections::HashMap<&[u8], f64>> = srcs
                    .iter()
                    .map(|s| s.iter().flatten().map(|(m, v)| (&m[..], *v)).collect())
                    .collect();
                let first = idx[0];
                for (m, s) in srcs[first].iter().flatten() {
                    let mut score = weigh(weights[first], *s);
                    let mut all = true;
                    for &i in &idx[1..] {
                        match maps[i].get(&m[..]) {
                            Some(v) => score = aggregate(agg, score, weigh(weights[i], *v)),
                            None => {
                                all = false;
                                break;
                            }
                        }
                    }
                    if all {
                        out.push((score, m.clone()));
                    }
                }
            }
        }
        SetOp::Diff => {
            let rest: std::collections::HashSet<&[u8]> = srcs[1..]
                .iter()
                .flatten()
                .flatten()
                .map(|(m, _)| &m[..])
                .collect();
            out = srcs[0]
                .iter()
                .flatten()
                .filter(|(m, _)| !rest.contains(&m[..]))
                .map(|(m, s)| (*s, m.clone()))
                .collect();
        }
    }
    out.sort_by(|x, y| cmp_entry((x.0, &x.1), (y.0, &y.1)));
    if let Some(d) = dst {
        crate::coll::delete_key(&ctx.shared.store, d)?;
        if !out.is_empty() {
            zset::create(ctx.shared, d, &out)?;
        }
    }
    Ok((out, withscores))
}

fn set_op_reply(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, op: SetOp, name: &str) -> CmdResult {
    let (out, withscores) = set_op(ctx, a, 1, None, op, name)?;
    reply_entries(r, &out, withscores);
    Ok(())
}

fn set_op_store(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, op: SetOp, name: &str) -> CmdResult {
    let (out, _) = set_op(ctx, a, 2, Some(a[1]), op, name)?;
    r.int(out.len() as i64);
    Ok(())
}

/// ZINTERCARD numkeys key... [LIMIT limit]: the size of the
/// intersection (of sorted sets or sets), counting stops at `limit`. The
/// keys follow `numkeys`, so the stripes are taken here (shared).
pub fn zintercard(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = int_arg(a[1])?;
    if n < 1 {
        return Err("ERR at least 1 input key is needed for 'zintercard' command".into());
    }
    if n as u64 > (a.len() - 2) as u64 {
        return Err(SYNTAX.into());
    }
    let keys = &a[2..2 + n as usize];
    let _g = ctx.lock(keys.iter().copied(), false);
    let mut srcs = Vec::with_capacity(keys.len());
    for k in keys {
        srcs.push(source(ctx, k)?);
    }
    let mut limit = 0u64;
    let mut j = 2 + keys.len();
    while j < a.len() {
        if eq(a[j], "limit") && j + 1 < a.len() {
            limit = super::parse_i64(a[j + 1])
                .filter(|l| *l >= 0)
                .ok_or(CmdError::from("ERR LIMIT can't be negative"))? as u64;
            j += 2;
        } else {
            return Err(SYNTAX.into());
        }
    }
    let limit = if limit == 0 { u64::MAX } else { limit };
    let mut count = 0u64;
    if srcs.iter().all(Option::is_some) {
        let mut srcs: Vec<Source> = srcs.into_iter().flatten().collect();
        srcs.sort_by_key(Vec::len);
        let sets: Vec<std::collections::HashSet<&[u8]>> = srcs[1..]
            .iter()
            .map(|s| s.iter().map(|(m, _)| &m[..]).collect())
            .collect();
        for (m, _) in &srcs[0] {
            if count >= limit {
                break;
            }
            if sets.iter().all(|s| s.contains(&m[..])) {
                count += 1;
            }
        }
    }
    r.int(count as i64);
    Ok(())
}

/// ZUNION numkeys key... [WEIGHTS w...] [AGGREGATE SUM|MIN|MAX] \[WITHSCORES\].
pub fn zunion(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    set_op_reply(ctx, a, r, SetOp::Union, "zunion")
}

/// ZINTER numkeys key... [WEIGHTS w...] [AGGREGATE SUM|MIN|MAX] \[WITHSCORES\].
pub fn zinter(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    set_op_reply(ctx, a, r, SetOp::Inter, "zinter")
}

/// ZDIFF numkeys key... \[WITHSCORES\].
pub fn zdiff(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    set_op_reply(ctx, a, r, SetOp::Diff, "zdiff")
}

/// ZUNIONSTORE destination numkeys key... [WEIGHTS w...] [AGGREGATE ...].
pub fn zunionstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    set_op_store(ctx, a, r, SetOp::Union, "zunionstore")
}

/// ZINTERSTORE destination numkeys key... [WEIGHTS w...] [AGGREGATE ...].
pub fn zinterstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    set_op_store(ctx, a, r, SetOp::Inter, "zinterstore")
}

/// ZDIFFSTORE destination numkeys key...
pub fn zdiffstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    set_op_store(ctx, a, r, SetOp::Diff, "zdiffstore")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g17_formats_like_printf() {
        for (v, s) in [
            (1.0, "1"),
            (1.1, "1.1000000000000001"),
            (-2.5, "-2.5"),
            (1e17, "1e+17"),
            (1e16, "10000000000000000"),
            (0.0001, "0.0001"),
            (0.00001, "1.0000000000000001e-05"),
            (f64::INFINITY, "inf"),
            (-0.0, "-0"),
            (123456789.125, "123456789.125"),
        ] {
            assert_eq!(fmt_g17(v), s, "{v}");
        }
        assert_eq!(fmt_d2string(1e17), "100000000000000000");
        assert_eq!(fmt_d2string(1.5), "1.5");
    }
}
