//! List commands over `crate::list` (a root holding both ends, and chunk
//! items; a push or pop at either end is one root read and one root
//! write, plus one chunk item per 64 operations, whatever the length).
//!
//! Every command runs under its keys' stripes (LMOVE and RPOPLPUSH name
//! both keys in the table), so a move between two lists is atomic.

use super::{eq, int_arg, CmdError, CmdResult, Ctx, SYNTAX, WRONGTYPE};
use crate::list::{self, List};
use crate::resp::Reply;
use crate::types::LIST_FLAGS;

fn push(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, left: bool, only_existing: bool) -> CmdResult {
    let store = &ctx.shared.store;
    if only_existing && list::open(store, a[1])?.is_none() {
        r.int(0);
        return Ok(());
    }
    if !only_existing && a.len() == 3 && super::blocking::hand_off(ctx, a[1], a[2])? {
        r.int(1);
        return Ok(());
    }
    let n = list::modify(store, a[1], |l| {
        for e in &a[2..] {
            if left {
                l.push_front(e)?;
            } else {
                l.push_back(e)?;
            }
        }
        Ok(l.len())
    })?;
    r.int(n as i64);
    Ok(())
}

/// LPUSH key element...
pub fn lpush(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    push(ctx, a, r, true, false)
}

/// RPUSH key element...
pub fn rpush(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    push(ctx, a, r, false, false)
}

/// LPUSHX key element...
pub fn lpushx(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    push(ctx, a, r, true, true)
}

/// RPUSHX key element...
pub fn rpushx(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    push(ctx, a, r, false, true)
}

fn pop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, left: bool) -> CmdResult {
    if a.len() > 3 {
        let name = if left { "lpop" } else { "rpop" };
        return Err(format!("ERR wrong number of arguments for '{name}' command").into());
    }
    let count = if a.len() == 3 {
        Some(
            super::parse_i64(a[2])
                .filter(|n| *n >= 0)
                .ok_or(CmdError::from(
                    "ERR value is out of range, must be positive",
                ))?,
        )
    } else {
        None
    };
    let store = &ctx.shared.store;
    let take = |l: &mut List| -> Result<Option<Vec<u8>>, CmdError> {
        if left {
            l.pop_front()
        } else {
            l.pop_back()
        }
    };
    let Some(n) = count else {
        // One element: no list of them to build (a list is never stored
        // empty, so a present one gives an element).
        let e = list::modify_existing(store, a[1], take)?.flatten();
        r.opt_bulk(e.as_deref());
        return Ok(());
    };
    let out = list::modify_existing(store, a[1], |l| {
        let mut out = Vec::new();
        for _ in 0..n {
            match take(l)? {
                Some(e) => out.push(e),
                None => break,
            }
        }
        Ok(out)
    })?;
    match out {
        None => r.null_array(),
        Some(out) => r.bulks(out.iter()),
    }
    Ok(())
}

/// LPOP key \[count\].
pub fn lpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    pop(ctx, a, r, true)
}

/// RPOP key \[count\].
pub fn rpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    pop(ctx, a, r, false)
}

/// LLEN key.
pub fn llen(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = list::read(&ctx.shared.store, a[1], |l| Ok(l.len()))?;
    r.int(n.unwrap_or(0) as i64);
    Ok(())
}

/// Redis's start/stop normalization: `None` for an empty range.
fn span(start: i64, stop: i64, len: u64) -> Option<(u64, u64)> {
    let len = len as i64;
    let start = if start < 0 {
        (len + start).max(0)
    } else {
        start
    };
    let stop = if stop < 0 { len + stop } else { stop };
    if start > stop || start >= len {
        return None;
    }
    Some((start as u64, stop.min(len - 1) as u64))
}

/// LRANGE key start stop.
pub fn lrange(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (start, stop) = (int_arg(a[2])?, int_arg(a[3])?);
    let out = list::read(&ctx.shared.store, a[1], |l| {
        match span(start, stop, l.len()) {
            Some((s, e)) => l.range(s, e),
            None => Ok(Vec::new()),
        }
    })?
    .unwrap_or_default();
    r.bulks(out.iter());
    Ok(())
}

/// An index argument against a list of `len`: `None` if out of range.
fn index(i: i64, len: u64) -> Option<u64> {
    let i = if i < 0 { len as i64 + i } else { i };
    (i >= 0 && (i as u64) < len).then_some(i as u64)
}

/// LINDEX key index.
pub fn lindex(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let e = list::read(&ctx.shared.store, a[1], |l| {
        let i = int_arg(a[2])?;
        match index(i, l.len()) {
            Some(i) => l.get(i),
            None => Ok(None),
        }
    })?
    .flatten();
    r.opt_bulk(e.as_deref());
    Ok(())
}

/// LSET key index element.
pub fn lset(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let store = &ctx.shared.store;
    if list::open(store, a[1])?.is_none() {
        return Err("ERR no such key".into());
    }
    let i = int_arg(a[2])?;
    list::modify(store, a[1], |l| {
        let i = index(i, l.len()).ok_or(CmdError::from("ERR index out of range"))?;
        l.set(i, a[3])
    })?;
    r.ok();
    Ok(())
}

/// LREM key count element.
pub fn lrem(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let count = int_arg(a[2])?;
    let store = &ctx.shared.store;
    if list::open(store, a[1])?.is_none() {
        r.int(0);
        return Ok(());
    }
    let n = list::modify(store, a[1], |l| {
        let mut all = l.all()?;
        let limit = if count == 0 {
            usize::MAX
        } else {
            count.unsigned_abs().min(usize::MAX as u64) as usize
        };
        let mut removed = 0;
        if count >= 0 {
            all.retain(|e| {
                if removed < limit && e[..] == *a[3] {
                    removed += 1;
                    false
                } else {
                    true
                }
            });
        } else {
            let mut keep: Vec<Vec<u8>> = Vec::with_capacity(all.len());
            for e in all.into_iter().rev() {
                if removed < limit && e[..] == *a[3] {
                    removed += 1;
                } else {
                    keep.push(e);
                }
            }
            keep.reverse();
            all = keep;
        }
        if removed > 0 {
            l.replace_all(all);
        }
        Ok(removed)
    })?;
    r.int(n as i64);
    Ok(())
}

/// LTRIM key start stop.
pub fn ltrim(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (start, stop) = (int_arg(a[2])?, int_arg(a[3])?);
    let store = &ctx.shared.store;
    if list::open(store, a[1])?.is_some() {
        list::modify(store, a[1], |l| {
            let len = l.len();
            let (front, back) = match span(start, stop, len) {
                Some((s, e)) => (s, len - 1 - e),
                None => (len, 0),
            };
            for _ in 0..front {
                l.pop_front()?;
            }
            for _ in 0..back {
                l.pop_back()?;
            }
            Ok(())
        })?;
    }
    r.ok();
    Ok(())
}

/// LINSERT key BEFORE|AFTER pivot element.
pub fn linsert(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let after = if eq(a[2], "after") {
        true
    } else if eq(a[2], "before") {
        false
    } else {
        return Err(SYNTAX.into());
    };
    let store = &ctx.shared.store;
    if list::open(store, a[1])?.is_none() {
        r.int(0);
        return Ok(());
    }
    let n = list::modify(store, a[1], |l| {
        let mut all = l.all()?;
        let Some(p) = all.iter().position(|e| e[..] == *a[3]) else {
            return Ok(-1);
        };
        all.insert(if after { p + 1 } else { p }, a[4].to_vec());
        let n = all.len() as i64;
        l.replace_all(all);
        Ok(n)
    })?;
    r.int(n);
    Ok(())
}

/// LPOS key element [RANK rank] [COUNT num-matches] [MAXLEN len].
pub fn lpos(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (mut rank, mut count, mut maxlen) = (1i64, None, 0i64);
    let mut i = 3;
    while i < a.len() {
        if i + 1 >= a.len() {
            return Err(SYNTAX.into());
        }
        let v = a[i + 1];
        if eq(a[i], "rank") {
            rank = int_arg(v)?;
            if rank == 0 {
                return Err("ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list".into());
            }
        } else if eq(a[i], "count") {
            let c = int_arg(v)?;
            if c < 0 {
                return Err("ERR COUNT can't be negative".into());
            }
            count = Some(c);
        } else if eq(a[i], "maxlen") {
            maxlen = int_arg(v)?;
            if maxlen < 0 {
                return Err("ERR MAXLEN can't be negative".into());
            }
        } else {
            return Err(SYNTAX.into());
        }
        i += 2;
    }
    let all = list::load_all(&ctx.shared.store, a[1])?;
    let Some(all) = all else {
        match count {
            Some(_) => r.array(0),
            None => r.null(),
        }
        return Ok(());
    };
    let len = all.len();
    let order: Box<dyn Iterator<Item = usize>> = if rank > 0 {
        Box::new(0..len)
    } else {
        Box::new((0..len).rev())
    };
    let skip = rank.unsigned_abs().saturating_sub(1);
    let want = match count {
        Some(0) => u64::MAX,
        Some(c) => c as u64,
        None => 1,
    };
    let mut found = Vec::new();
    let mut seen = 0u64;
    for (looked, idx) in order.enumerate() {
        if maxlen > 0 && looked as i64 >= maxlen {
            break;
        }
        if all[idx][..] == *a[2] {
            seen += 1;
            if seen > skip {
                found.push(idx as i64);
                if found.len() as u64 >= want {
                    break;
                }
            }
        }
    }
    match count {
        Some(_) => {
            r.array(found.len());
            for f in found {
                r.int(f);
            }
        }
        None => match found.first() {
            Some(&f) => r.int(f),
            None => r.null(),
        },
    }
    Ok(())
}

fn side(b: &[u8]) -> Result<bool, CmdError> {
    if eq(b, "left") {
        Ok(true)
    } else if eq(b, "right") {
        Ok(false)
    } else {
        Err(SYNTAX.into())
    }
}

fn move_generic(
    ctx: &mut Ctx,
    r: &mut Reply,
    src: &[u8],
    dst: &[u8],
    from_left: bool,
    to_left: bool,
) -> CmdResult {
    let store = &ctx.shared.store;
    let pop = |l: &mut List| {
        if from_left {
            l.pop_front()
        } else {
            l.pop_back()
        }
    };
    let push = |l: &mut List, e: &[u8]| {
        if to_left {
            l.push_front(e)
        } else {
            l.push_back(e)
        }
    };
    if src == dst {
        // A rotation: one read and one write of the list.
        let e = list::modify_existing(store, src, |l| {
            let e = pop(l)?;
            if let Some(e) = &e {
                push(l, e)?;
            }
            Ok(e)
        })?
        .flatten();
        r.opt_bulk(e.as_deref());
        return Ok(());
    }
    // Redis's order: a missing source answers nil whatever the
    // destination is; a destination of another type is refused before
    // anything moves. The destination's type comes from its metadata;
    // the source is looked at only if that refuses (the pop reads it
    // anyway, answering nil or WRONGTYPE itself).
    if store.meta(dst)?.is_some_and(|m| m.flags != LIST_FLAGS) {
        if store.meta(src)?.is_none() {
            r.null();
            return Ok(());
        }
        return Err(WRONGTYPE.into());
    }
    let e = list::modify_existing(store, src, pop)?.flatten();
    if let Some(e) = &e {
        list::modify(store, dst, |l| push(l, e))?;
    }
    r.opt_bulk(e.as_deref());
    Ok(())
}

/// LMOVE source destination LEFT|RIGHT LEFT|RIGHT.
pub fn lmove(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (from, to) = (side(a[3])?, side(a[4])?);
    move_generic(ctx, r, a[1], a[2], from, to)
}

/// RPOPLPUSH source destination.
pub fn rpoplpush(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    move_generic(ctx, r, a[1], a[2], false, true)
}
