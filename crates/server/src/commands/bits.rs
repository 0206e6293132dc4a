//! Bitmap commands: SETBIT, GETBIT, BITCOUNT, BITPOS, BITOP, BITFIELD and
//! BITFIELD_RO, with redis-server 7.0's semantics and error texts
//! (`bitops.c`).
//!
//! A bitmap is a string, as in Redis: bit 0 is the most significant bit
//! of byte 0, and bits past the end read as 0. Writes (SETBIT, BITFIELD
//! SET/INCRBY) are read-modify-writes of the whole value through
//! [`rmw`], the compare-and-swap loop on the item's
//! version that INCR and SETRANGE use, so concurrent writers on one key
//! never lose an update and the key's TTL and flags are kept. A write
//! first grows the string with zero bytes to cover the highest bit it
//! touches, as `lookupStringObjectOrCreate` does, even where BITFIELD's
//! `OVERFLOW FAIL` then writes nothing. BITOP writes its destination
//! without a TTL (Redis's `setKey`), or deletes it for an empty result.
//!
//! Offsets are limited by `proto-max-bulk-len` (the bit's byte must be
//! below it), with Redis's message; a string longer than the engine's
//! largest value fails when written, with the usual size error.

use std::sync::atomic::Ordering;

use super::strings::{read_string, rmw, Update};
use super::{eq, parse_i64, CmdError, CmdResult, Ctx, NOT_INT, SYNTAX};
use crate::resp::Reply;

const BAD_OFFSET: &str = "ERR bit offset is not an integer or out of range";
const BAD_BIT: &str = "ERR bit is not an integer or out of range";
const BAD_TYPE: &str =
    "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.";

/// `proto-max-bulk-len` as configured (Redis bounds offsets by it).
fn max_bulk_bytes(ctx: &Ctx) -> u64 {
    ctx.shared
        .settings
        .proto_max_bulk_len
        .load(Ordering::Relaxed)
}

/// Redis's `getBitOffsetFromArgument`: a bit offset, `#n` meaning
/// `n * bits` where `bits` is given (BITFIELD).
fn bit_offset(ctx: &Ctx, arg: &[u8], bits: Option<u64>) -> Result<u64, CmdError> {
    let (hash, digits) = match (arg.first(), bits) {
        (Some(b'#'), Some(b)) if b > 0 => (Some(b), &arg[1..]),
        _ => (None, arg),
    };
    let mut v = parse_i64(digits).ok_or(CmdError::from(BAD_OFFSET))?;
    if let Some(b) = hash {
        v = v.checked_mul(b as i64).ok_or(CmdError::from(BAD_OFFSET))?;
    }
    if v < 0 || (v as u64 >> 3) >= max_bulk_bytes(ctx) {
        return Err(BAD_OFFSET.into());
    }
    Ok(v as u64)
}

/// The bit at `off` (0 past the end).
#[inline]
fn get_bit(v: &[u8], off: u64) -> u8 {
    v.get((off >> 3) as usize)
        .map_or(0, |b| (b >> (7 - (off & 7))) & 1)
}

/// Set the bit at `off`; the string must be long enough.
#[inline]
fn set_bit(v: &mut [u8], off: u64, on: bool) {
    let byte = &mut v[(off >> 3) as usize];
    let mask = 1u8 << (7 - (off & 7));
    if on {
        *byte |= mask;
    } else {
        *byte &= !mask;
    }
}

/// SETBIT key offset value.
pub fn setbit(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let off = bit_offset(ctx, a[2], None)?;
    let on = match a[3] {
        b"0" => false,
        b"1" => true,
        _ => return Err(BAD_BIT.into()),
    };
    let byte = (off >> 3) as usize;
    let old = rmw(ctx, a[1], |m, cur| {
        let old = get_bit(cur, off);
        if m.is_some() && byte < cur.len() && (old == 1) == on {
            return Ok(Update::Skip(old));
        }
        let mut v = Vec::with_capacity(cur.len().max(byte + 1));
        v.extend_from_slice(cur);
        if v.len() <= byte {
            v.resize(byte + 1, 0);
        }
        set_bit(&mut v, off, on);
        Ok(Update::Write(v, old))
    })?;
    r.int(i64::from(old));
    Ok(())
}

/// GETBIT key offset.
pub fn getbit(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let off = bit_offset(ctx, a[2], None)?;
    let m = read_string(ctx, a[1])?;
    ctx.hit(m.is_some());
    r.int(i64::from(get_bit(ctx.buf, off)));
    Ok(())
}

/// A range of BITCOUNT or BITPOS, resolved as Redis does: inclusive
/// first and last *bit* of the string, or `None` for an empty range.
fn resolve_range(len: u64, start: i64, end: i64, bit_unit: bool) -> Option<(u64, u64)> {
    let total = if bit_unit { len as i64 * 8 } else { len as i64 };
    let (mut s, mut e) = (start, end);
    if s < 0 {
        s += total;
    }
    if e < 0 {
        e += total;
    }
    s = s.max(0);
    e = e.max(0);
    if e >= total {
        e = total - 1;
    }
    if s > e {
        return None;
    }
    Some(if bit_unit {
        (s as u64, e as u64)
    } else {
        (s as u64 * 8, e as u64 * 8 + 7)
    })
}

/// BYTE or BIT (the optional unit of BITCOUNT and BITPOS).
fn unit(o: &[u8]) -> Result<bool, CmdError> {
    if eq(o, "bit") {
        Ok(true)
    } else if eq(o, "byte") {
        Ok(false)
    } else {
        Err(SYNTAX.into())
    }
}

/// Set bits of `v` in the inclusive bit range.
fn count_bits(v: &[u8], first: u64, last: u64) -> u64 {
    let (fb, lb) = ((first >> 3) as usize, (last >> 3) as usize);
    let mut n: u64 = v[fb..=lb].iter().map(|b| u64::from(b.count_ones())).sum();
    // Take off the bits of the edge bytes outside the range.
    let head = v[fb] & !(0xFFu8 >> (first & 7));
    let tail = match last & 7 {
        7 => 0,
        k => v[lb] & (0xFFu8 >> (k + 1)),
    };
    n -= u64::from(head.count_ones()) + u64::from(tail.count_ones());
    n
}

/// BITCOUNT key [start end [BYTE|BIT]].
pub fn bitcount(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    // 7.0 answers 0 for a missing key before it looks at the arguments.
    let Some(_) = read_string(ctx, a[1])? else {
        r.int(0);
        return Ok(());
    };
    let len = ctx.buf.len() as u64;
    let range = match a.len() {
        2 => (len > 0).then(|| (0, len * 8 - 1)),
        4 | 5 => {
            let s = parse_i64(a[2]).ok_or(CmdError::from(NOT_INT))?;
            let e = parse_i64(a[3]).ok_or(CmdError::from(NOT_INT))?;
            if s < 0 && e < 0 && s > e {
                r.int(0);
                return Ok(());
            }
            let bit_unit = match a.get(4) {
                Some(o) => unit(o)?,
                None => false,
            };
            resolve_range(len, s, e, bit_unit)
        }
        _ => return Err(SYNTAX.into()),
    };
    r.int(range.map_or(0, |(f, l)| count_bits(ctx.buf, f, l)) as i64);
    Ok(())
}

/// BITPOS key bit [start [end [BYTE|BIT]]].
pub fn bitpos(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let bit = match parse_i64(a[2]) {
        Some(b @ (0 | 1)) => b as u8,
        Some(_) => return Err("ERR The bit argument must be 1 or 0.".into()),
        None => return Err(NOT_INT.into()),
    };
    // A missing key is an infinite run of zeros.
    let Some(_) = read_string(ctx, a[1])? else {
        r.int(if bit == 1 { -1 } else { 0 });
        return Ok(());
    };
    let len = ctx.buf.len() as u64;
    let (range, end_given) = match a.len() {
        3 => ((len > 0).then(|| (0, len * 8 - 1)), false),
        4..=6 => {
            let s = parse_i64(a[3]).ok_or(CmdError::from(NOT_INT))?;
            let bit_unit = match a.get(5) {
                Some(o) => unit(o)?,
                None => false,
            };
            let (e, given) = match a.get(4) {
                Some(e) => (parse_i64(e).ok_or(CmdError::from(NOT_INT))?, true),
                None => (len as i64 - 1, false),
            };
            (resolve_range(len, s, e, bit_unit), given)
        }
        _ => return Err(SYNTAX.into()),
    };
    let Some((first, last)) = range else {
        r.int(-1);
        return Ok(());
    };
    let v = &ctx.buf[..];
    let found = find_bit(v, first, last, bit);
    r.int(match found {
        Some(p) => p as i64,
        // No clear bit: the string is zero-padded on the right unless the
        // caller gave an explicit end.
        None if bit == 0 && !end_given => last as i64 + 1,
        None => -1,
    });
    Ok(())
}

/// First bit equal to `bit` in the inclusive range.
fn find_bit(v: &[u8], first: u64, last: u64, bit: u8) -> Option<u64> {
    let mut p = first;
    // Bit by bit to a byte boundary, then whole bytes, then the tail.
    while p <= last && p & 7 != 0 {
        if get_bit(v, p) == bit {
            return Some(p);
        }
        p += 1;
    }
    let skip = if bit == 1 { 0x00 } else { 0xFF };
    while p + 7 <= last {
        let b = v[(p >> 3) as usize];
        if b != skip {
            let lead = if bit == 1 {
                b.leading_zeros()
            } else {
                b.leading_ones()
            };
            return Some(p + u64::from(lead));
        }
        p += 8;
    }
    while p <= last {
        if get_bit(v, p) == bit {
            return Some(p);
        }
        p += 1;
    }
    None
}

/// BITOP AND|OR|XOR|NOT destkey key [key ...].
pub fn bitop(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    #[derive(PartialEq)]
    enum Op {
        And,
        Or,
        Xor,
        Not,
    }
    let op = if eq(a[1], "and") {
        Op::And
    } else if eq(a[1], "or") {
        Op::Or
    } else if eq(a[1], "xor") {
        Op::Xor
    } else if eq(a[1], "not") {
        Op::Not
    } else {
        return Err(SYNTAX.into());
    };
    if op == Op::Not && a.len() != 4 {
        return Err("ERR BITOP NOT must be called with a single source key.".into());
    }
    let mut srcs: Vec<Vec<u8>> = Vec::with_capacity(a.len() - 3);
    for k in &a[3..] {
        let m = read_string(ctx, k)?;
        srcs.push(if m.is_some() {
            ctx.buf.clone()
        } else {
            Vec::new()
        });
    }
    let maxlen = srcs.iter().map(Vec::len).max().unwrap_or(0);
    let store = &ctx.shared.store;
    if maxlen == 0 {
        store.delete(a[2])?;
        r.int(0);
        return Ok(());
    }
    let mut out = vec![0u8; maxlen];
    for (i, o) in out.iter_mut().enumerate() {
        let byte = |s: &Vec<u8>| s.get(i).copied().unwrap_or(0);
        *o = match op {
            Op::Not => !byte(&srcs[0]),
            Op::And => srcs.iter().fold(0xFF, |acc, s| acc & byte(s)),
            Op::Or => srcs.iter().fold(0, |acc, s| acc | byte(s)),
            Op::Xor => srcs.iter().fold(0, |acc, s| acc ^ byte(s)),
        };
    }
    store.put(a[2], &out)?;
    r.int(maxlen as i64);
    Ok(())
}

/// Unsigned field of `bits` bits at bit `off` (zero past the end).
fn get_field(v: &[u8], off: u64, bits: u32) -> u64 {
    (0..u64::from(bits)).fold(0u64, |acc, i| (acc << 1) | u64::from(get_bit(v, off + i)))
}

/// Write the low `bits` bits of `val` at bit `off`.
fn set_field(v: &mut [u8], off: u64, bits: u32, val: u64) {
    for i in 0..u64::from(bits) {
        let on = (val >> (u64::from(bits) - 1 - i)) & 1 == 1;
        set_bit(v, off + i, on);
    }
}

/// OVERFLOW behaviour.
#[derive(Clone, Copy, PartialEq)]
enum Overflow {
    Wrap,
    Sat,
    Fail,
}

/// Which BITFIELD operation.
#[derive(Clone, Copy, PartialEq)]
enum FieldOp {
    Get,
    Set,
    Incr,
}

/// One parsed BITFIELD operation.
struct Field {
    op: FieldOp,
    signed: bool,
    bits: u32,
    off: u64,
    arg: i64,
    ow: Overflow,
}

/// Redis's `getBitfieldTypeFromArgument`: `i1`..`i64` or `u1`..`u63`.
fn field_type(t: &[u8]) -> Result<(bool, u32), CmdError> {
    let signed = match t.first() {
        Some(b'i') => true,
        Some(b'u') => false,
        _ => return Err(BAD_TYPE.into()),
    };
    match parse_i64(&t[1..]) {
        Some(b) if b >= 1 && b <= if signed { 64 } else { 63 } => Ok((signed, b as u32)),
        _ => Err(BAD_TYPE.into()),
    }
}

/// `checkUnsignedBitfieldOverflow`: (overflowed, value to store).
fn unsigned_overflow(value: u64, incr: i64, bits: u32, ow: Overflow) -> (bool, u64) {
    let max = (1u64 << bits) - 1;
    let maxincr = max.wrapping_sub(value) as i64;
    let minincr = value.wrapping_neg() as i64;
    let wrap = || value.wrapping_add(incr as u64) & max;
    if value > max || (incr > 0 && incr > maxincr) {
        (true, if ow == Overflow::Sat { max } else { wrap() })
    } else if incr < 0 && incr < minincr {
        (true, if ow == Overflow::Sat { 0 } else { wrap() })
    } else {
        (false, value.wrapping_add(incr as u64))
    }
}

/// `checkSignedBitfieldOverflow`: (overflowed, value to store).
fn signed_overflow(value: i64, incr: i64, bits: u32, ow: Overflow) -> (bool, i64) {
    let max: i64 = if bits == 64 {
        i64::MAX
    } else {
        (1i64 << (bits - 1)) - 1
    };
    let min = -max - 1;
    let maxincr = (max as u64).wrapping_sub(value as u64) as i64;
    let minincr = min.wrapping_sub(value);
    let wrap = || {
        let mut c = (value as u64).wrapping_add(incr as u64);
        if bits < 64 {
            let mask = u64::MAX << bits;
            if c & (1u64 << (bits - 1)) != 0 {
                c |= mask;
            } else {
                c &= !mask;
            }
        }
        c as i64
    };
    if value > max || (bits != 64 && incr > maxincr) || (value >= 0 && incr > 0 && incr > maxincr) {
        (true, if ow == Overflow::Sat { max } else { wrap() })
    } else if value < min
        || (bits != 64 && incr < minincr)
        || (value < 0 && incr < 0 && incr < minincr)
    {
        (true, if ow == Overflow::Sat { min } else { wrap() })
    } else {
        (false, value.wrapping_add(incr))
    }
}

/// Sign-extend a `bits`-bit field.
fn signed_of(u: u64, bits: u32) -> i64 {
    if bits < 64 && u & (1u64 << (bits - 1)) != 0 {
        (u | (u64::MAX << bits)) as i64
    } else {
        u as i64
    }
}

fn parse_fields(ctx: &Ctx, a: &[&[u8]]) -> Result<Vec<Field>, CmdError> {
    let mut ops = Vec::new();
    let mut ow = Overflow::Wrap;
    let mut j = 2;
    while j < a.len() {
        let rem = a.len() - j - 1;
        let sub = a[j];
        let op = if eq(sub, "get") && rem >= 2 {
            FieldOp::Get
        } else if eq(sub, "set") && rem >= 3 {
            FieldOp::Set
        } else if eq(sub, "incrby") && rem >= 3 {
            FieldOp::Incr
        } else if eq(sub, "overflow") && rem >= 1 {
            let t = a[j + 1];
            ow = if eq(t, "wrap") {
                Overflow::Wrap
            } else if eq(t, "sat") {
                Overflow::Sat
            } else if eq(t, "fail") {
                Overflow::Fail
            } else {
                return Err("ERR Invalid OVERFLOW type specified".into());
            };
            j += 2;
            continue;
        } else {
            return Err(SYNTAX.into());
        };
        let (signed, bits) = field_type(a[j + 1])?;
        let off = bit_offset(ctx, a[j + 2], Some(u64::from(bits)))?;
        let arg = if op == FieldOp::Get {
            0
        } else {
            parse_i64(a[j + 3]).ok_or(CmdError::from(NOT_INT))?
        };
        ops.push(Field {
            op,
            signed,
            bits,
            off,
            arg,
            ow,
        });
        j += if op == FieldOp::Get { 3 } else { 4 };
    }
    Ok(ops)
}

/// Run the operations on `v` (grown already), pushing each reply
/// (`None`: an OVERFLOW FAIL).
fn run_fields(v: &mut [u8], ops: &[Field], out: &mut Vec<Option<i64>>) {
    out.clear();
    for f in ops {
        let raw = get_field(v, f.off, f.bits);
        let reply = match (f.op, f.signed) {
            (FieldOp::Get, true) => Some(signed_of(raw, f.bits)),
            (FieldOp::Get, false) => Some(raw as i64),
            (op, true) => {
                let old = signed_of(raw, f.bits);
                let (over, new) = if op == FieldOp::Incr {
                    signed_overflow(old, f.arg, f.bits, f.ow)
                } else {
                    signed_overflow(f.arg, 0, f.bits, f.ow)
                };
                if over && f.ow == Overflow::Fail {
                    None
                } else {
                    set_field(v, f.off, f.bits, new as u64);
                    Some(if op == FieldOp::Incr { new } else { old })
                }
            }
            (op, false) => {
                let (over, new) = if op == FieldOp::Incr {
                    unsigned_overflow(raw, f.arg, f.bits, f.ow)
                } else {
                    unsigned_overflow(f.arg as u64, 0, f.bits, f.ow)
                };
                if over && f.ow == Overflow::Fail {
                    None
                } else {
                    set_field(v, f.off, f.bits, new);
                    Some(if op == FieldOp::Incr {
                        new as i64
                    } else {
                        raw as i64
                    })
                }
            }
        };
        out.push(reply);
    }
}

fn bitfield_generic(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, ro: bool) -> CmdResult {
    let ops = parse_fields(ctx, a)?;
    let mut replies = Vec::with_capacity(ops.len());
    let highest = ops
        .iter()
        .filter(|f| f.op != FieldOp::Get)
        .map(|f| f.off + u64::from(f.bits) - 1)
        .max();
    match highest {
        None => {
            read_string(ctx, a[1])?;
            let mut v = std::mem::take(ctx.buf);
            run_fields(&mut v, &ops, &mut replies);
            *ctx.buf = v;
        }
        Some(_) if ro => {
            return Err("ERR BITFIELD_RO only supports the GET subcommand".into());
        }
        Some(hi) => {
            let need = (hi >> 3) as usize + 1;
            rmw(ctx, a[1], |_, cur| {
                let mut v = Vec::with_capacity(cur.len().max(need));
                v.extend_from_slice(cur);
                if v.len() < need {
                    v.resize(need, 0);
                }
                run_fields(&mut v, &ops, &mut replies);
                Ok(Update::Write(v, ()))
            })?;
        }
    }
    r.array(replies.len());
    for x in replies {
        match x {
            Some(n) => r.int(n),
            None => r.null(),
        }
    }
    Ok(())
}

/// BITFIELD key [GET type offset | SET type offset value | INCRBY type
/// offset increment | OVERFLOW WRAP|SAT|FAIL] ...
pub fn bitfield(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    bitfield_generic(ctx, a, r, false)
}

/// BITFIELD_RO key [GET type offset] ...
pub fn bitfield_ro(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    bitfield_generic(ctx, a, r, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_positions() {
        let v = [0xFFu8, 0xF0, 0x00];
        assert_eq!(count_bits(&v, 0, 23), 12);
        assert_eq!(count_bits(&v, 1, 11), 11);
        assert_eq!(count_bits(&v, 4, 4), 1);
        assert_eq!(find_bit(&v, 0, 23, 0), Some(12));
        assert_eq!(find_bit(&v, 13, 23, 1), None);
        assert_eq!(find_bit(&[0x00, 0x01], 0, 15, 1), Some(15));
    }

    #[test]
    fn fields() {
        let mut v = vec![0u8; 2];
        set_field(&mut v, 3, 5, 0b10110);
        assert_eq!(get_field(&v, 3, 5), 0b10110);
        assert_eq!(signed_of(0b10110, 5), -10);
        assert_eq!(unsigned_overflow(250, 10, 8, Overflow::Wrap), (true, 4));
        assert_eq!(unsigned_overflow(250, 10, 8, Overflow::Sat), (true, 255));
        assert_eq!(signed_overflow(120, 10, 8, Overflow::Wrap), (true, -126));
        assert_eq!(signed_overflow(-120, -10, 8, Overflow::Sat), (true, -128));
        assert_eq!(signed_overflow(5, -10, 8, Overflow::Wrap), (false, -5));
    }
}
