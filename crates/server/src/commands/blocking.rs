//! Blocking pops and the multi-key pops: BLPOP, BRPOP, BLMOVE, BRPOPLPUSH,
//! BLMPOP, LMPOP, BZPOPMIN, BZPOPMAX, BZMPOP, ZMPOP; and the serving of
//! blocked clients when a key they wait on gets elements (the waiter
//! registry and the design are in [`crate::blocking`]).
//!
//! Each command parses into one `Pop`; `attempt` runs its
//! non-blocking form over the keys in order (a missing key is skipped, a
//! key of another type answers WRONGTYPE, the first non-empty one is
//! popped), as Redis 7.0's `blockingPopGenericCommand`,
//! `blmoveGenericCommand` and `mpopGenericCommand` do. If it found
//! nothing and the command may block (not inside MULTI/EXEC, where
//! redis-server answers the non-blocking form's nil), the handler
//! registers a waiter under its keys' stripes and leaves the wait to the
//! connection. [`serve_ready`] is what a pusher runs, after its command
//! released its stripes, for each key it signalled ([`signalled_keys`]):
//! the key's first waiting waiter is served by running `attempt` on
//! that key alone, under the waiter's stripes. Serving a BLMOVE pushes
//! onto its destination, which is then ready in turn.
//!
//! Timeouts are Redis's: seconds as a long double, truncated to
//! milliseconds, so `-0.0001` means 0 (forever); negative (or infinite)
//! is `ERR timeout is negative`; not a number is `ERR timeout is not a
//! float or out of range`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::{eq, CmdError, CmdResult, Ctx, Spec, SYNTAX, WRONGTYPE};
use crate::blocking::{Blocked, Waiter};
use crate::list;
use crate::resp::{Proto, Reply};
use crate::state::Shared;
use crate::types::{LIST_FLAGS, ZSET_FLAGS};
use crate::zset;

/// What a pop command does once it has a non-empty key.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// BLPOP/BRPOP: `[key, element]`.
    Pop { left: bool },
    /// BLMOVE/BRPOPLPUSH: the element, pushed onto the destination.
    Move { from_left: bool, to_left: bool },
    /// LMPOP/BLMPOP: `[key, [elements]]`.
    MPop { left: bool, count: u64 },
    /// BZPOPMIN/BZPOPMAX: `[key, member, score]`.
    ZPop { max: bool },
    /// ZMPOP/BZMPOP: `[key, [[member, score] ...]]`.
    ZMPop { max: bool, count: u64 },
}

impl Op {
    fn is_zset(self) -> bool {
        matches!(self, Op::ZPop { .. } | Op::ZMPop { .. })
    }
}

/// A pop command's keys: inline for the usual few, so a pop that finds
/// its element allocates nothing for them.
type Keys<'a> = SmallVec<[&'a [u8]; 4]>;

/// Elements popped: inline for one (BLPOP, BRPOP, BLMOVE).
type Popped = SmallVec<[Vec<u8>; 1]>;

/// A parsed pop command.
struct Pop<'a> {
    op: Op,
    keys: Keys<'a>,
    dst: Option<&'a [u8]>,
    /// The timeout in ms (0 = forever); `None` for LMPOP/ZMPOP.
    timeout_ms: Option<u64>,
}

/// Redis's `getTimeoutFromObjectOrReply` in seconds.
fn timeout_arg(b: &[u8]) -> Result<u64, CmdError> {
    let v =
        super::parse_f64(b).ok_or(CmdError::from("ERR timeout is not a float or out of range"))?;
    let ms = v * 1000.0;
    // C's (long long) of an out-of-range double is LLONG_MIN on x86.
    if ms <= -1.0 || ms >= 9.2e18 {
        return Err("ERR timeout is negative".into());
    }
    Ok(ms.max(0.0) as u64)
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

/// `numkeys key... LEFT|RIGHT|MIN|MAX [COUNT n]` from `a[i]` on.
fn parse_mpop<'a>(a: &[&'a [u8]], i: usize, zset: bool) -> Result<(Keys<'a>, bool, u64), CmdError> {
    let n = super::parse_i64(a[i])
        .filter(|n| *n > 0)
        .ok_or(CmdError::from("ERR numkeys should be greater than 0"))?;
    let where_idx = (i as u64).saturating_add(n as u64).saturating_add(1);
    if where_idx >= a.len() as u64 {
        return Err(SYNTAX.into());
    }
    let where_idx = where_idx as usize;
    let w = a[where_idx];
    let first = if zset {
        if eq(w, "min") {
            true
        } else if eq(w, "max") {
            false
        } else {
            return Err(SYNTAX.into());
        }
    } else {
        side(w)?
    };
    let mut count = None;
    let mut j = where_idx + 1;
    while j < a.len() {
        if count.is_none() && eq(a[j], "count") && j + 1 < a.len() {
            let c = super::parse_i64(a[j + 1])
                .filter(|c| *c > 0)
                .ok_or(CmdError::from("ERR count should be greater than 0"))?;
            count = Some(c as u64);
            j += 2;
        } else {
            return Err(SYNTAX.into());
        }
    }
    Ok((
        SmallVec::from_slice(&a[i + 1..where_idx]),
        first,
        count.unwrap_or(1),
    ))
}

/// Parse any of the pop commands (by name).
fn parse<'a>(a: &[&'a [u8]]) -> Result<Pop<'a>, CmdError> {
    let name = a[0];
    let last = a.len() - 1;
    let simple = |op: Op| -> Result<Pop<'a>, CmdError> {
        let timeout_ms = Some(timeout_arg(a[last])?);
        Ok(Pop {
            op,
            keys: SmallVec::from_slice(&a[1..last]),
            dst: None,
            timeout_ms,
        })
    };
    if eq(name, "blpop") {
        simple(Op::Pop { left: true })
    } else if eq(name, "brpop") {
        simple(Op::Pop { left: false })
    } else if eq(name, "bzpopmin") {
        simple(Op::ZPop { max: false })
    } else if eq(name, "bzpopmax") {
        simple(Op::ZPop { max: true })
    } else if eq(name, "blmove") || eq(name, "brpoplpush") {
        let (from_left, to_left) = if eq(name, "blmove") {
            (side(a[3])?, side(a[4])?)
        } else {
            (false, true)
        };
        Ok(Pop {
            op: Op::Move { from_left, to_left },
            keys: smallvec::smallvec![a[1]],
            dst: Some(a[2]),
            timeout_ms: Some(timeout_arg(a[last])?),
        })
    } else {
        let blocking = name[0].eq_ignore_ascii_case(&b'b');
        let z = eq(name, "zmpop") || eq(name, "bzmpop");
        let i = if blocking { 2 } else { 1 };
        let (keys, first, count) = parse_mpop(a, i, z)?;
        let op = if z {
            Op::ZMPop { max: !first, count }
        } else {
            Op::MPop { left: first, count }
        };
        let timeout_ms = if blocking {
            Some(timeout_arg(a[1])?)
        } else {
            None
        };
        Ok(Pop {
            op,
            keys,
            dst: None,
            timeout_ms,
        })
    }
}

/// Pop up to `count` entries of the zset at `key` from its low (or high)
/// end.
fn zpop(shared: &Shared, key: &[u8], max: bool, count: u64) -> Result<Vec<zset::Entry>, CmdError> {
    zset::modify(shared, key, |z| {
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
    })
}

fn lpop(shared: &Shared, key: &[u8], left: bool, count: u64) -> Result<Popped, CmdError> {
    let popped = list::modify_existing(&shared.store, key, |l| {
        let mut out = Popped::new();
        for _ in 0..count {
            let e = if left { l.pop_front()? } else { l.pop_back()? };
            match e {
                Some(e) => out.push(e),
                None => break,
            }
        }
        Ok(out)
    })?;
    Ok(popped.unwrap_or_default())
}

/// Run the non-blocking form over `keys` in order. `Ok(false)`: every
/// key was missing (nothing written). When `serving`, a key of another
/// type counts as missing (the waiter stays blocked, as in Redis) and
/// BLMOVE's destination type is checked the same way.
fn attempt(
    shared: &Shared,
    p: &Pop,
    keys: &[&[u8]],
    r: &mut Reply,
    serving: bool,
) -> Result<bool, CmdError> {
    let want = if p.op.is_zset() {
        ZSET_FLAGS
    } else {
        LIST_FLAGS
    };
    for &key in keys {
        // A client's own list pop needs no type check first: the pop
        // reads the key once and answers WRONGTYPE itself. A serve skips
        // a key of another type instead, so it looks first.
        let own_pop = !serving && matches!(p.op, Op::Pop { .. } | Op::MPop { .. });
        if !own_pop {
            let Some(m) = shared.store.meta(key)? else {
                continue;
            };
            if m.flags != want {
                if serving {
                    continue;
                }
                return Err(WRONGTYPE.into());
            }
        }
        match p.op {
            Op::Pop { left } => {
                let e = lpop(shared, key, left, 1)?;
                let Some(e) = e.first() else { continue };
                r.array(2);
                r.bulk(key);
                r.bulk(e);
            }
            Op::MPop { left, count } => {
                let es = lpop(shared, key, left, count)?;
                if es.is_empty() {
                    continue;
                }
                r.array(2);
                r.bulk(key);
                r.bulks(es.iter());
            }
            Op::Move { from_left, to_left } => {
                let dst = p.dst.unwrap_or(key);
                if let Some(dm) = shared.store.meta(dst)? {
                    if dm.flags != LIST_FLAGS {
                        if serving {
                            return Ok(false);
                        }
                        return Err(WRONGTYPE.into());
                    }
                }
                let e = lpop(shared, key, from_left, 1)?;
                let Some(e) = e.first() else { continue };
                list::modify(&shared.store, dst, |l| {
                    if to_left {
                        l.push_front(e)
                    } else {
                        l.push_back(e)
                    }
                })?;
                r.bulk(e);
            }
            Op::ZPop { max } => {
                let es = zpop(shared, key, max, 1)?;
                let Some((s, m)) = es.first() else { continue };
                r.array(3);
                r.bulk(key);
                r.bulk(m);
                super::zset::reply_score(r, *s);
            }
            Op::ZMPop { max, count } => {
                let es = zpop(shared, key, max, count)?;
                if es.is_empty() {
                    continue;
                }
                r.array(2);
                r.bulk(key);
                r.array(es.len());
                for (s, m) in &es {
                    r.array(2);
                    r.bulk(m);
                    super::zset::reply_score(r, *s);
                }
            }
        }
        return Ok(true);
    }
    Ok(false)
}

/// Run a pop command: at once if a key has elements, else block (or
/// answer nil inside a transaction, or for LMPOP/ZMPOP).
fn run(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, own_locks: bool) -> CmdResult {
    let p = parse(a)?;
    // BLMPOP/BZMPOP/LMPOP/ZMPOP: the table names no keys (numkeys).
    let _g = own_locks.then(|| ctx.lock(p.keys.iter().copied(), true));
    if attempt(ctx.shared, &p, &p.keys, r, false)? {
        return Ok(());
    }
    let Some(timeout_ms) = p.timeout_ms else {
        r.null_array();
        return Ok(());
    };
    if ctx.sess.in_exec || ctx.sess.multi.is_some() {
        match p.op {
            Op::Move { .. } => r.null(),
            _ => r.null_array(),
        }
        return Ok(());
    }
    let deadline = (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms));
    let waiter = Arc::new(Waiter::new(
        ctx.sess.info.id,
        r.proto,
        a,
        p.keys.iter().map(|k| k.to_vec()).collect(),
        p.dst,
    ));
    *ctx.sess.info.blocked.lock() = Some(waiter.clone());
    // Registered under the keys' stripes (dispatch's, or `_g`).
    ctx.sess.blocked = Some(Blocked::new(ctx.shared.blocking.clone(), waiter, deadline));
    Ok(())
}

/// BLPOP key [key ...] timeout.
pub fn blpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    run(ctx, a, r, false)
}

/// BRPOP key [key ...] timeout.
pub fn brpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    run(ctx, a, r, false)
}

/// BLMOVE source destination LEFT|RIGHT LEFT|RIGHT timeout.
pub fn blmove(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    run(ctx, a, r, false)
}

/// BRPOPLPUSH source destination timeout.
pub fn brpoplpush(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    run(ctx, a, r, false)
}

/// BLMPOP timeout numkeys key [key ...] LEFT|RIGHT [COUNT count].
pub fn blmpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    run(ctx, a, r, true)
}

/// LMPOP numkeys key [key ...] LEFT|RIGHT [COUNT count].
pub fn lmpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    run(ctx, a, r, true)
}

/// BZPOPMIN key [key ...] timeout.
pub fn bzpopmin(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    run(ctx, a, r, false)
}

/// BZPOPMAX key [key ...] timeout.
pub fn bzpopmax(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    run(ctx, a, r, false)
}

/// BZMPOP timeout numkeys key [key ...] MIN|MAX [COUNT count].
pub fn bzmpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    run(ctx, a, r, true)
}

/// ZMPOP numkeys key [key ...] MIN|MAX [COUNT count].
pub fn zmpop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    run(ctx, a, r, true)
}

/// The keys a write command may have given elements to (the ones it
/// signals as ready); empty for every other command.
pub fn signalled_keys<'a>(spec: &Spec, a: &[&'a [u8]]) -> &'a [u8] {
    let i = match spec.name {
        "lpush" | "rpush" | "lpushx" | "rpushx" | "linsert" | "zadd" | "zincrby" | "restore"
        | "zunionstore" | "zinterstore" | "zdiffstore" => 1,
        "lmove" | "rpoplpush" | "blmove" | "brpoplpush" | "rename" | "renamenx" | "copy"
        | "zrangestore" => 2,
        _ => return &[],
    };
    a.get(i).copied().unwrap_or(&[])
}

/// Serve the waiters of every `ready` key, first come first served, while
/// the key has elements; runs with no stripe held.
pub fn serve_ready(shared: &Shared, ready: &mut Vec<Vec<u8>>) {
    let reg = &shared.blocking;
    while let Some(key) = ready.pop() {
        while let Some(w) = reg.first_waiting(&key) {
            let guard = shared
                .keylocks
                .lock(w.lock_keys.iter().map(Vec::as_slice), true);
            if !w.begin_serve() {
                // Gone, timed out or taken meanwhile: look again.
                continue;
            }
            let argv: Vec<&[u8]> = w.args.iter().map(Vec::as_slice).collect();
            let mut out = Vec::new();
            let mut r = Reply {
                out: &mut out,
                proto: w.proto,
            };
            let p = match parse(&argv) {
                Ok(p) => p,
                Err(e) => {
                    r.error(&e.0);
                    drop(guard);
                    w.finish_serve(out);
                    continue;
                }
            };
            match attempt(shared, &p, &[&key], &mut r, true) {
                Ok(true) => {
                    drop(guard);
                    w.finish_serve(out);
                    if let Some(d) = p.dst {
                        ready.push(d.to_vec());
                    }
                }
                Ok(false) => {
                    drop(guard);
                    w.abandon_serve();
                    break;
                }
                Err(e) => {
                    out.clear();
                    Reply {
                        out: &mut out,
                        proto: w.proto,
                    }
                    .error(&e.0);
                    drop(guard);
                    w.finish_serve(out);
                }
            }
        }
    }
}

/// A push of one element onto a missing key whose first waiter is a
/// one-key BLPOP or BRPOP: the element goes to the waiter at once, and the
/// key stays missing. That is what the push and the serve that follows it
/// would leave (Redis: the list is created, the waiter pops its only
/// element, the list is deleted; the pusher gets `1`, the waiter
/// `[key, element]`), without writing the list and deleting it again.
/// Runs under the key's stripe, which the push holds exclusively (so its
/// WATCH version moves as for the push); not inside EXEC, where Redis
/// serves the waiters only after the whole transaction (a later command
/// of it sees the element). The key is not signalled afterwards: it is
/// missing, so serving its other waiters would find nothing to pop (and
/// wake one for nothing). Returns false, having changed nothing, when
/// any of it does not hold: the push then runs as usual.
pub fn hand_off(ctx: &mut Ctx, key: &[u8], elem: &[u8]) -> Result<bool, CmdError> {
    let shared = ctx.shared;
    if shared.blocking.blocked() == 0 || ctx.sess.in_exec {
        return Ok(false);
    }
    let Some(w) = shared.blocking.first_waiting(key) else {
        return Ok(false);
    };
    // A one-key pop (either end: the list would hold one element): its
    // stripes are the key's, held here, and its reply is that element.
    let pop = w
        .args
        .first()
        .is_some_and(|c| eq(c, "blpop") || eq(c, "brpop"));
    if !pop || w.lock_keys.len() != 1 || w.lock_keys[0] != key || shared.store.contains(key)? {
        return Ok(false);
    }
    if !w.begin_serve() {
        return Ok(false);
    }
    let mut out = Vec::new();
    let mut r = Reply {
        out: &mut out,
        proto: w.proto,
    };
    r.array(2);
    r.bulk(key);
    r.bulk(elem);
    w.finish_serve(out);
    ctx.sess.handed_off = true;
    Ok(true)
}

/// The reply of a wait that timed out.
pub fn timed_out_reply(out: &mut Vec<u8>, proto: Proto) {
    Reply { out, proto }.null_array();
}

/// The reply of CLIENT UNBLOCK ... ERROR.
pub const UNBLOCKED: &str = "UNBLOCKED client unblocked via CLIENT UNBLOCK";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_follow_redis() {
        assert_eq!(timeout_arg(b"0").unwrap(), 0);
        assert_eq!(timeout_arg(b"0.5").unwrap(), 500);
        assert_eq!(timeout_arg(b"-0.0001").unwrap(), 0);
        assert_eq!(timeout_arg(b"1e3").unwrap(), 1_000_000);
        let neg = "ERR timeout is negative";
        assert_eq!(timeout_arg(b"-1").unwrap_err().0, neg);
        assert_eq!(timeout_arg(b"inf").unwrap_err().0, neg);
        assert_eq!(timeout_arg(b"1e30").unwrap_err().0, neg);
        let nan = "ERR timeout is not a float or out of range";
        assert_eq!(timeout_arg(b"x").unwrap_err().0, nan);
        assert_eq!(timeout_arg(b"nan").unwrap_err().0, nan);
    }

    #[test]
    fn mpop_arguments() {
        let a: Vec<&[u8]> = vec![b"lmpop", b"2", b"a", b"b", b"LEFT", b"COUNT", b"3"];
        let (keys, left, count) = parse_mpop(&a, 1, false).unwrap();
        assert_eq!(keys[..], [&b"a"[..], b"b"]);
        assert!(left);
        assert_eq!(count, 3);
        let bad: Vec<&[u8]> = vec![b"lmpop", b"3", b"a", b"LEFT"];
        assert_eq!(parse_mpop(&bad, 1, false).unwrap_err().0, SYNTAX);
        let huge: Vec<&[u8]> = vec![b"lmpop", b"9223372036854775807", b"a", b"LEFT"];
        assert_eq!(parse_mpop(&huge, 1, false).unwrap_err().0, SYNTAX);
    }
}
