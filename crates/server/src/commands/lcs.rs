//! LCS key1 key2 \[LEN\] \[IDX\] [MINMATCHLEN n] \[WITHMATCHLEN\]: the longest
//! common subsequence of two strings, as redis-server 7.0 computes and
//! reports it (`t_string.c`, `lcsCommand`).
//!
//! The table is the textbook dynamic program, `(len1 + 1) × (len2 + 1)`
//! 32-bit cells, refused (as Redis does) when it would exceed
//! `proto-max-bulk-len` bytes. The walk back from the last cell picks the
//! same path as Redis (on a tie it moves along the second string) and
//! emits IDX ranges at the same points, including Redis's habit of
//! closing a range when the next match is not contiguous with it, so the
//! ranges, their order and the `len` are Redis's own.

use std::sync::atomic::Ordering;

use super::{eq, int_arg, CmdError, CmdResult, Ctx, SYNTAX};
use crate::resp::Reply;
use crate::types::is_collection;

/// Read a key for LCS: its bytes (empty if missing); `None` if it holds
/// a hash.
fn value(ctx: &mut Ctx, key: &[u8]) -> Result<Option<Vec<u8>>, CmdError> {
    match ctx.shared.store.get_into(key, ctx.buf)? {
        Some(m) if is_collection(&m) => Ok(None),
        Some(_) => Ok(Some(ctx.buf.clone())),
        None => Ok(Some(Vec::new())),
    }
}

/// One IDX range: (a_start, a_end, b_start, b_end, length).
type Range = (u32, u32, u32, u32, u32);

/// LCS.
pub fn lcs(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (Some(x), Some(y)) = (value(ctx, a[1])?, value(ctx, a[2])?) else {
        return Err("ERR The specified keys must contain string values".into());
    };
    let (mut getlen, mut getidx, mut withlen, mut minlen) = (false, false, false, 0i64);
    let mut j = 3;
    while j < a.len() {
        let o = a[j];
        if eq(o, "idx") {
            getidx = true;
        } else if eq(o, "len") {
            getlen = true;
        } else if eq(o, "withmatchlen") {
            withlen = true;
        } else if eq(o, "minmatchlen") && j + 1 < a.len() {
            minlen = int_arg(a[j + 1])?.max(0);
            j += 1;
        } else {
            return Err(SYNTAX.into());
        }
        j += 1;
    }
    if getidx && getlen {
        return Err("ERR If you want both the length and indexes, please just use IDX.".into());
    }
    if x.len() >= u32::MAX as usize - 1 || y.len() >= u32::MAX as usize - 1 {
        return Err("ERR String too long for LCS".into());
    }
    let (alen, blen) = (x.len(), y.len());
    let cells = (alen as u64 + 1) * (blen as u64 + 1);
    let limit = ctx
        .shared
        .settings
        .proto_max_bulk_len
        .load(Ordering::Relaxed);
    if cells * 4 > limit {
        return Err(
            "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len".into(),
        );
    }
    let w = blen + 1;
    let mut t = vec![0u32; cells as usize];
    for i in 1..=alen {
        for k in 1..=blen {
            t[i * w + k] = if x[i - 1] == y[k - 1] {
                t[(i - 1) * w + k - 1] + 1
            } else {
                t[(i - 1) * w + k].max(t[i * w + k - 1])
            };
        }
    }
    let total = t[alen * w + blen];
    let mut result = vec![0u8; total as usize];
    let mut ranges: Vec<Range> = Vec::new();
    let unset = alen as u32;
    let (mut a_start, mut a_end, mut b_start, mut b_end) = (unset, 0u32, 0u32, 0u32);
    let (mut i, mut k, mut idx) = (alen, blen, total as usize);
    let compute = getidx || !getlen;
    while compute && i > 0 && k > 0 {
        let mut emit = false;
        if x[i - 1] == y[k - 1] {
            result[idx - 1] = x[i - 1];
            if a_start == unset {
                a_start = (i - 1) as u32;
                a_end = a_start;
                b_start = (k - 1) as u32;
                b_end = b_start;
            } else if a_start == i as u32 && b_start == k as u32 {
                a_start -= 1;
                b_start -= 1;
            } else {
                emit = true;
            }
            if a_start == 0 || b_start == 0 {
                emit = true;
            }
            idx -= 1;
            i -= 1;
            k -= 1;
        } else {
            if t[(i - 1) * w + k] > t[i * w + k - 1] {
                i -= 1;
            } else {
                k -= 1;
            }
            if a_start != unset {
                emit = true;
            }
        }
        if emit {
            let mlen = a_end.wrapping_sub(a_start).wrapping_add(1);
            if minlen == 0 || i64::from(mlen) >= minlen {
                ranges.push((a_start, a_end, b_start, b_end, mlen));
            }
            a_start = unset;
        }
    }
    if getidx {
        r.map(2);
        r.bulk(b"matches");
        r.array(ranges.len());
        for (s1, e1, s2, e2, n) in ranges {
            r.array(if withlen { 3 } else { 2 });
            r.array(2);
            r.int(i64::from(s1));
            r.int(i64::from(e1));
            r.array(2);
            r.int(i64::from(s2));
            r.int(i64::from(e2));
            if withlen {
                r.int(i64::from(n));
            }
        }
        r.bulk(b"len");
        r.int(i64::from(total));
    } else if getlen {
        r.int(i64::from(total));
    } else {
        r.bulk(&result);
    }
    Ok(())
}
