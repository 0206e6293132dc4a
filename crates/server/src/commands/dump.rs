//! DUMP and RESTORE in Redis's serialization format: the payload
//! redis-server 7.0 writes and reads, so a value moves between the two
//! servers either way (`redis-cli --pipe`, MIGRATE-style tools, client
//! libraries' copy helpers).
//!
//! A payload is one RDB object followed by a two-byte RDB version
//! (little-endian, 10 for 7.0) and the CRC64 of everything before the
//! checksum (Redis's `crc64`: the Jones polynomial, reflected, initial
//! value 0; little-endian on the wire):
//!
//! ```text
//!  type | object | version (u16 LE) | crc64 (u64 LE)
//! ```
//!
//! What is written, as Redis writes it:
//!
//! * a string: type 0 and the string with RDB's encodings: a value Redis
//!   would hold as an integer is written as an 8, 16 or 32-bit integer
//!   when it fits, a string over 20 bytes LZF-compressed when that saves
//!   at least 4 bytes (the `lzf` module, liblzf's algorithm), anything
//!   else as a length-prefixed string.
//! * a hash: type 16, one listpack (integers in listpack's integer
//!   encodings, fields in insertion order) while it is small by the
//!   `hash-max-listpack-*` tunables, else type 4, the field/value pairs.
//!
//! * a set: type 2, the members (Redis writes an intset as type 11; both
//!   load in either server).
//! * a list or a sorted set: the RDB writer's object (`rdb::encode`), as
//!   SAVE writes it (quicklist 2; zset listpack or skiplist form).
//!
//! What is read: strings in every RDB string encoding (integers, LZF),
//! hashes as listpack (16), ziplist-free hash table (4), sets as a table
//! (2) or an intset (11), and lists and sorted sets in every encoding the
//! RDB reader knows (`rdb::decode`), built through the RDB import. A hash
//! or set is restored as one item and turns large at its first write if
//! it is over the thresholds. Streams and modules have no counterpart
//! here and answer Redis's `Bad data format`, as does a malformed object. A
//! payload whose version is newer than 10 or whose checksum is wrong
//! answers `ERR DUMP payload version or checksum are wrong`.

use nibble::{Condition, Expiry, PutOptions};

use super::{eq, int_arg, parse_i64, CmdError, CmdResult, Ctx, SYNTAX};
use crate::coll::{self, Kind};
use crate::rdb::RdbValue;
use crate::resp::Reply;
use crate::state::unix_ms;
use crate::types::{encode_hash, Hash, HASH_FLAGS, SET_FLAGS};

/// The RDB version redis-server 7.0 writes.
pub const RDB_VERSION: u16 = 10;
/// RDB object types this server reads or writes.
const RDB_TYPE_STRING: u8 = 0;
const RDB_TYPE_SET: u8 = 2;
const RDB_TYPE_HASH: u8 = 4;
const RDB_TYPE_SET_INTSET: u8 = 11;
const RDB_TYPE_HASH_LISTPACK: u8 = 16;
/// Special string encodings (the top two bits of the length byte are 11).
const RDB_ENC_INT8: u8 = 0;
const RDB_ENC_INT16: u8 = 1;
const RDB_ENC_INT32: u8 = 2;
const RDB_ENC_LZF: u8 = 3;

const BAD_PAYLOAD: &str = "ERR DUMP payload version or checksum are wrong";
const BAD_FORMAT: &str = "ERR Bad data format";

/// Redis's CRC64 polynomial (Jones), reflected form.
const CRC64_JONES_REFLECTED: u64 = 0x95ac_9329_ac4b_c9b5;

/// Slicing-by-8 tables: `t[0]` is the byte-at-a-time table, `t[k][i]`
/// the CRC of byte `i` followed by `k` zero bytes. Eight bytes per step
/// instead of one (an RDB save checksums every byte it writes).
fn crc64_tables() -> &'static [[u64; 256]; 8] {
    static T: std::sync::OnceLock<[[u64; 256]; 8]> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = [[0u64; 256]; 8];
        for (i, e) in t[0].iter_mut().enumerate() {
            let mut c = i as u64;
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ CRC64_JONES_REFLECTED
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        for k in 1..8 {
            let (done, rest) = t.split_at_mut(k);
            for (e, &p) in rest[0].iter_mut().zip(done[k - 1].iter()) {
                *e = (p >> 8) ^ done[0][(p & 0xff) as usize];
            }
        }
        t
    })
}

/// Redis's `crc64(crc, data)`.
pub fn crc64(mut crc: u64, data: &[u8]) -> u64 {
    let t = crc64_tables();
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let x = crc ^ u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        crc = t[7][(x & 0xff) as usize]
            ^ t[6][((x >> 8) & 0xff) as usize]
            ^ t[5][((x >> 16) & 0xff) as usize]
            ^ t[4][((x >> 24) & 0xff) as usize]
            ^ t[3][((x >> 32) & 0xff) as usize]
            ^ t[2][((x >> 40) & 0xff) as usize]
            ^ t[1][((x >> 48) & 0xff) as usize]
            ^ t[0][(x >> 56) as usize];
    }
    for &b in chunks.remainder() {
        crc = t[0][((crc ^ u64::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// `rdbSaveLen`.
pub(crate) fn put_len(out: &mut Vec<u8>, len: u64) {
    if len < 1 << 6 {
        out.push(len as u8);
    } else if len < 1 << 14 {
        out.push(0x40 | (len >> 8) as u8);
        out.push(len as u8);
    } else if len <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

/// `rdbEncodeInteger`: the special encoding of `v` if it fits 32 bits.
fn put_int(out: &mut Vec<u8>, v: i64) -> bool {
    if let Ok(x) = i8::try_from(v) {
        out.extend_from_slice(&[0xC0 | RDB_ENC_INT8, x as u8]);
    } else if let Ok(x) = i16::try_from(v) {
        out.push(0xC0 | RDB_ENC_INT16);
        out.extend_from_slice(&x.to_le_bytes());
    } else if let Ok(x) = i32::try_from(v) {
        out.push(0xC0 | RDB_ENC_INT32);
        out.extend_from_slice(&x.to_le_bytes());
    } else {
        return false;
    }
    true
}

/// Redis tries LZF only on strings longer than this.
const LZF_MIN_BYTES: usize = 20;

/// A string as Redis saves it (`rdbSaveRawString`, or the integer form
/// of an int-encoded object): an integer encoding, LZF when it saves at
/// least 4 bytes, or the bytes as they are.
pub(crate) fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    // Redis holds a canonical integer of up to 20 characters as an
    // integer, and tries the integer form for raw strings of up to 11;
    // both come to: canonical integer that fits 32 bits.
    if s.len() <= 20 {
        if let Some(v) = parse_i64(s) {
            if put_int(out, v) {
                return;
            }
        }
    }
    if s.len() > LZF_MIN_BYTES {
        if let Some(c) = super::lzf::compress(s, s.len() - 4) {
            out.push(0xC0 | RDB_ENC_LZF);
            put_len(out, c.len() as u64);
            put_len(out, s.len() as u64);
            out.extend_from_slice(&c);
            return;
        }
    }
    put_len(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// listpack's `lpEncodeBacklen` of an entry of `l` bytes.
fn lp_backlen(out: &mut Vec<u8>, l: usize) {
    let l = l as u64;
    if l <= 127 {
        out.push(l as u8);
    } else if l < 16383 {
        out.extend_from_slice(&[(l >> 7) as u8, (l & 127) as u8 | 128]);
    } else if l < 2_097_151 {
        out.extend_from_slice(&[
            (l >> 14) as u8,
            ((l >> 7) & 127) as u8 | 128,
            (l & 127) as u8 | 128,
        ]);
    } else if l < 268_435_455 {
        out.extend_from_slice(&[
            (l >> 21) as u8,
            ((l >> 14) & 127) as u8 | 128,
            ((l >> 7) & 127) as u8 | 128,
            (l & 127) as u8 | 128,
        ]);
    } else {
        out.extend_from_slice(&[
            (l >> 28) as u8,
            ((l >> 21) & 127) as u8 | 128,
            ((l >> 14) & 127) as u8 | 128,
            ((l >> 7) & 127) as u8 | 128,
            (l & 127) as u8 | 128,
        ]);
    }
}

/// One listpack entry: integers as listpack's integer encodings (as
/// `lpStringToInt64` decides), other bytes as strings.
pub(crate) fn lp_entry(out: &mut Vec<u8>, s: &[u8]) {
    let start = out.len();
    match parse_i64(s) {
        Some(v) if (0..=127).contains(&v) => out.push(v as u8),
        Some(v) if (-4096..=4095).contains(&v) => {
            let u = if v < 0 { (1 << 13) + v } else { v } as u16;
            out.extend_from_slice(&[0xC0 | (u >> 8) as u8, u as u8]);
        }
        Some(v) if i16::try_from(v).is_ok() => {
            out.push(0xF1);
            out.extend_from_slice(&(v as i16).to_le_bytes());
        }
        Some(v) if (-(1 << 23)..(1 << 23)).contains(&v) => {
            out.push(0xF2);
            out.extend_from_slice(&(v as i32).to_le_bytes()[..3]);
        }
        Some(v) if i32::try_from(v).is_ok() => {
            out.push(0xF3);
            out.extend_from_slice(&(v as i32).to_le_bytes());
        }
        Some(v) => {
            out.push(0xF4);
            out.extend_from_slice(&v.to_le_bytes());
        }
        None if s.len() < 64 => {
            out.push(0x80 | s.len() as u8);
            out.extend_from_slice(s);
        }
        None if s.len() < 4096 => {
            out.extend_from_slice(&[0xE0 | (s.len() >> 8) as u8, s.len() as u8]);
            out.extend_from_slice(s);
        }
        None => {
            out.push(0xF0);
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s);
        }
    }
    let l = out.len() - start;
    lp_backlen(out, l);
}

/// A hash as a listpack.
pub(crate) fn listpack(h: &Hash) -> Vec<u8> {
    let mut lp = vec![0u8; 6];
    for (f, v) in h {
        lp_entry(&mut lp, f);
        lp_entry(&mut lp, v);
    }
    lp.push(0xFF);
    let total = lp.len() as u32;
    lp[..4].copy_from_slice(&total.to_le_bytes());
    let n = (h.len() * 2).min(65535) as u16;
    lp[4..6].copy_from_slice(&n.to_le_bytes());
    lp
}

/// The `hash-max-listpack-*` tunables.
fn listpack_limits(ctx: &Ctx) -> (usize, usize) {
    hash_listpack_limits(&ctx.shared.settings)
}

/// The `hash-max-listpack-*` tunables of `settings` (entries, bytes).
pub(crate) fn hash_listpack_limits(settings: &crate::config::Settings) -> (usize, usize) {
    let t = settings.tunables.get_all();
    let num = |n: &str| {
        t.iter()
            .find(|(k, _)| *k == n)
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(0)
    };
    (
        num("hash-max-listpack-entries"),
        num("hash-max-listpack-value"),
    )
}

/// Whether Redis would keep this hash as a listpack.
pub fn hash_is_listpack(ctx: &Ctx, h: &Hash) -> bool {
    let (max_n, max_len) = listpack_limits(ctx);
    h.len() <= max_n
        && h.iter()
            .all(|(f, v)| f.len() <= max_len && v.len() <= max_len)
}

/// The DUMP payload of a value.
fn payload(ctx: &Ctx, hash: Option<&Hash>, v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() + 16);
    match hash {
        None => {
            out.push(RDB_TYPE_STRING);
            put_string(&mut out, v);
        }
        Some(h) if hash_is_listpack(ctx, h) => {
            out.push(RDB_TYPE_HASH_LISTPACK);
            put_string(&mut out, &listpack(h));
        }
        Some(h) => {
            out.push(RDB_TYPE_HASH);
            put_len(&mut out, h.len() as u64);
            for (f, x) in h {
                put_string(&mut out, f);
                put_string(&mut out, x);
            }
        }
    }
    out.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = crc64(0, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The DUMP payload of a list or sorted set: the RDB object, version,
/// checksum.
fn rdb_payload(v: &RdbValue) -> Vec<u8> {
    let mut out = Vec::new();
    crate::rdb::encode::put_value(&mut out, v, crate::rdb::encode::Limits::default());
    out.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = crc64(0, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// DUMP key.
pub fn dump(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let Some(m) = ctx.shared.store.get_into(a[1], ctx.buf)? else {
        r.null();
        return Ok(());
    };
    let p = match coll::load_all(ctx.shared, a[1], m.flags)? {
        Some((Kind::Hash, h, _)) => payload(ctx, Some(&h), &[]),
        Some((Kind::Set, members, _)) => {
            let mut out = vec![RDB_TYPE_SET];
            put_len(&mut out, members.len() as u64);
            for (x, _) in &members {
                put_string(&mut out, x);
            }
            out.extend_from_slice(&RDB_VERSION.to_le_bytes());
            let crc = crc64(0, &out);
            out.extend_from_slice(&crc.to_le_bytes());
            out
        }
        // Lists and sorted sets: the RDB writer's encodings (quicklist 2,
        // zset listpack or skiplist form), as SAVE writes them.
        Some((Kind::List, items, _)) => {
            let v = RdbValue::List(items.into_iter().map(|(x, _)| x).collect());
            rdb_payload(&v)
        }
        Some((Kind::Zset, items, _)) => {
            // `load_all` gives a zset as (member, score as 8 LE bytes).
            let v = RdbValue::ZSet(
                items
                    .into_iter()
                    .map(|(m, s)| {
                        let b: [u8; 8] = s.as_slice().try_into().unwrap_or_default();
                        (m, f64::from_le_bytes(b))
                    })
                    .collect(),
            );
            rdb_payload(&v)
        }
        None => payload(ctx, None, ctx.buf),
    };
    r.bulk(&p);
    Ok(())
}

/// A cursor over a payload; every read fails on truncation.
pub(crate) struct Rd<'a>(pub(crate) &'a [u8]);

impl<'a> Rd<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }

    pub(crate) fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    /// `rdbLoadLenByRef`: (length or special encoding, is it encoded).
    pub(crate) fn len(&mut self) -> Option<(u64, bool)> {
        let b = self.byte()?;
        Some(match b >> 6 {
            0 => (u64::from(b & 0x3f), false),
            1 => ((u64::from(b & 0x3f) << 8) | u64::from(self.byte()?), false),
            3 => (u64::from(b & 0x3f), true),
            _ => match b {
                0x80 => (
                    u64::from(u32::from_be_bytes(self.take(4)?.try_into().ok()?)),
                    false,
                ),
                0x81 => (u64::from_be_bytes(self.take(8)?.try_into().ok()?), false),
                _ => return None,
            },
        })
    }

    /// `rdbGenericLoadStringObject`.
    pub(crate) fn string(&mut self) -> Option<Vec<u8>> {
        let (n, enc) = self.len()?;
        if !enc {
            return Some(self.take(usize::try_from(n).ok()?)?.to_vec());
        }
        let v: i64 = match n as u8 {
            RDB_ENC_INT8 => i64::from(self.byte()? as i8),
            RDB_ENC_INT16 => i64::from(i16::from_le_bytes(self.take(2)?.try_into().ok()?)),
            RDB_ENC_INT32 => i64::from(i32::from_le_bytes(self.take(4)?.try_into().ok()?)),
            RDB_ENC_LZF => {
                let (clen, e1) = self.len()?;
                let (len, e2) = self.len()?;
                if e1 || e2 {
                    return None;
                }
                let c = self.take(usize::try_from(clen).ok()?)?;
                return super::lzf::decompress(c, usize::try_from(len).ok()?);
            }
            _ => return None,
        };
        Some(v.to_string().into_bytes())
    }
}

/// listpack entries as strings; `None` if malformed.
pub(crate) fn listpack_entries(lp: &[u8]) -> Option<Vec<Vec<u8>>> {
    if lp.len() < 7 || u32::from_le_bytes(lp[..4].try_into().ok()?) as usize != lp.len() {
        return None;
    }
    if *lp.last()? != 0xFF {
        return None;
    }
    let mut p = 6;
    let mut out = Vec::new();
    loop {
        let b = *lp.get(p)?;
        if b == 0xFF {
            break;
        }
        let bytes = |from: usize, n: usize| lp.get(from..from + n);
        let le = |from: usize, n: usize| -> Option<u64> {
            let s = bytes(from, n)?;
            Some(s.iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x)))
        };
        let sign = |u: u64, bits: u32| -> i64 {
            if u >= 1 << (bits - 1) {
                u as i64 - (1i64 << bits)
            } else {
                u as i64
            }
        };
        let (value, size): (Vec<u8>, usize) = if b & 0x80 == 0 {
            (u64::from(b & 0x7f).to_string().into_bytes(), 1)
        } else if b & 0xC0 == 0x80 {
            let n = usize::from(b & 0x3f);
            (bytes(p + 1, n)?.to_vec(), 1 + n)
        } else if b & 0xE0 == 0xC0 {
            let u = (u64::from(b & 0x1f) << 8) | u64::from(*lp.get(p + 1)?);
            (sign(u, 13).to_string().into_bytes(), 2)
        } else if b & 0xF0 == 0xE0 {
            let n = (usize::from(b & 0x0f) << 8) | usize::from(*lp.get(p + 1)?);
            (bytes(p + 2, n)?.to_vec(), 2 + n)
        } else {
            match b {
                0xF0 => {
                    let n = le(p + 1, 4)? as usize;
                    (bytes(p + 5, n)?.to_vec(), 5 + n)
                }
                0xF1 => (sign(le(p + 1, 2)?, 16).to_string().into_bytes(), 3),
                0xF2 => (sign(le(p + 1, 3)?, 24).to_string().into_bytes(), 4),
                0xF3 => (sign(le(p + 1, 4)?, 32).to_string().into_bytes(), 5),
                0xF4 => ((le(p + 1, 8)? as i64).to_string().into_bytes(), 9),
                _ => return None,
            }
        };
        let mut bl = Vec::new();
        lp_backlen(&mut bl, size);
        p += size + bl.len();
        out.push(value);
    }
    (p + 1 == lp.len()).then_some(out)
}

/// Fields and values in pairs into a hash: `None` if odd, empty or with
/// a field twice (Redis refuses all three).
pub(crate) fn pairs_to_hash(items: Vec<Vec<u8>>) -> Option<Hash> {
    if items.is_empty() || !items.len().is_multiple_of(2) {
        return None;
    }
    let mut h: Hash = Vec::with_capacity(items.len() / 2);
    let mut seen = std::collections::HashSet::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(f), Some(v)) = (it.next(), it.next()) {
        if !seen.insert(f.clone()) {
            return None;
        }
        h.push((f, v));
    }
    Some(h)
}

/// A decoded object: the bytes to store and the flags saying their type.
fn decode_object(body: &[u8]) -> Option<(Vec<u8>, u32)> {
    let mut rd = Rd(body);
    match rd.byte()? {
        RDB_TYPE_STRING => Some((rd.string()?, 0)),
        RDB_TYPE_HASH_LISTPACK => {
            let lp = rd.string()?;
            let h = pairs_to_hash(listpack_entries(&lp)?)?;
            Some((encode_hash(&h), HASH_FLAGS))
        }
        RDB_TYPE_HASH => {
            let (n, enc) = rd.len()?;
            if enc || n == 0 || n > body.len() as u64 {
                return None;
            }
            let mut items = Vec::with_capacity(2 * n as usize);
            for _ in 0..2 * n {
                items.push(rd.string()?);
            }
            Some((encode_hash(&pairs_to_hash(items)?), HASH_FLAGS))
        }
        RDB_TYPE_SET => {
            let (n, enc) = rd.len()?;
            if enc || n == 0 || n > body.len() as u64 {
                return None;
            }
            let mut items = Vec::with_capacity(n as usize);
            for _ in 0..n {
                items.push(rd.string()?);
            }
            encode_set(items)
        }
        RDB_TYPE_SET_INTSET => {
            // An intset blob: encoding (2, 4 or 8 bytes per member), count,
            // then the members, all little-endian.
            let blob = rd.string()?;
            let w = u32::from_le_bytes(blob.get(0..4)?.try_into().ok()?) as usize;
            let n = u32::from_le_bytes(blob.get(4..8)?.try_into().ok()?) as usize;
            if !matches!(w, 2 | 4 | 8) || blob.len() != 8 + w * n || n == 0 {
                return None;
            }
            let items = blob[8..]
                .chunks(w)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b[..w].copy_from_slice(c);
                    let v = i64::from_le_bytes(b);
                    let shift = 64 - 8 * w as u32;
                    ((v << shift) >> shift).to_string().into_bytes()
                })
                .collect();
            encode_set(items)
        }
        _ => None,
    }
}

/// Members into a small set's bytes: `None` if empty or with a member twice.
fn encode_set(items: Vec<Vec<u8>>) -> Option<(Vec<u8>, u32)> {
    let mut seen = std::collections::HashSet::with_capacity(items.len());
    if items.is_empty() || !items.iter().all(|m| seen.insert(&m[..])) {
        return None;
    }
    let pairs: Vec<coll::Pair> = items.into_iter().map(|m| (m, Vec::new())).collect();
    Some((coll::encode_small_set(&pairs), SET_FLAGS))
}

/// `verifyDumpPayload`: whether the version and checksum are good.
fn verify(p: &[u8]) -> Option<()> {
    if p.len() < 10 {
        return None;
    }
    let footer = &p[p.len() - 10..];
    let ver = u16::from_le_bytes([footer[0], footer[1]]);
    if ver > RDB_VERSION {
        return None;
    }
    let crc = u64::from_le_bytes(footer[2..].try_into().ok()?);
    (crc64(0, &p[..p.len() - 8]) == crc).then_some(())
}

/// RESTORE key ttl payload \[REPLACE\] \[ABSTTL\] [IDLETIME s] [FREQ f].
/// IDLETIME and FREQ are checked and ignored (no access clock here).
pub fn restore(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let (mut replace, mut absttl, mut idle, mut freq) = (false, false, false, false);
    let mut j = 4;
    while j < a.len() {
        let more = j + 1 < a.len();
        if eq(a[j], "replace") {
            replace = true;
        } else if eq(a[j], "absttl") {
            absttl = true;
        } else if eq(a[j], "idletime") && more && !freq {
            if int_arg(a[j + 1])? < 0 {
                return Err("ERR Invalid IDLETIME value, must be >= 0".into());
            }
            idle = true;
            j += 1;
        } else if eq(a[j], "freq") && more && !idle {
            if !(0..=255).contains(&int_arg(a[j + 1])?) {
                return Err("ERR Invalid FREQ value, must be >= 0 and <= 255".into());
            }
            freq = true;
            j += 1;
        } else {
            return Err(SYNTAX.into());
        }
        j += 1;
    }
    let store = &ctx.shared.store;
    if !replace && store.contains(a[1])? {
        return Err("BUSYKEY Target key name already exists.".into());
    }
    let ttl = int_arg(a[2])?;
    if ttl < 0 {
        return Err("ERR Invalid TTL value, must be >= 0".into());
    }
    verify(a[3]).ok_or(CmdError::from(BAD_PAYLOAD))?;
    let at = match (ttl, absttl) {
        (0, _) => None,
        (t, true) => Some(t),
        (t, false) => Some(t.saturating_add(unix_ms() as i64)),
    };
    // Lists and sorted sets (every RDB encoding of them) are built through
    // the RDB import, as at start.
    use crate::rdb::decode::ty;
    let t = a[3][0];
    if matches!(
        t,
        ty::LIST
            | ty::LIST_ZIPLIST
            | ty::LIST_QUICKLIST
            | ty::LIST_QUICKLIST_2
            | ty::ZSET
            | ty::ZSET_2
            | ty::ZSET_ZIPLIST
            | ty::ZSET_LISTPACK
    ) {
        let v = crate::rdb::decode::value_of(&a[3][1..a[3].len() - 10], t)
            .map_err(|_| CmdError::from(BAD_FORMAT))?;
        if at.is_some_and(|t| t <= unix_ms() as i64) {
            if replace {
                coll::delete_key(store, a[1])?;
            }
            r.ok();
            return Ok(());
        }
        let exp = at.map(|t| t as u64);
        let done = match v {
            RdbValue::List(l) => crate::rdb::load::import_list(ctx.shared, a[1], exp, l),
            RdbValue::ZSet(z) => crate::rdb::load::import_zset(ctx.shared, a[1], exp, z),
            _ => return Err(BAD_FORMAT.into()),
        };
        return match done {
            Ok(crate::rdb::load::Imported::Stored) => {
                r.ok();
                Ok(())
            }
            Ok(crate::rdb::load::Imported::TooLarge) => {
                Err("ERR value exceeds the largest item the engine stores".into())
            }
            Ok(_) => Err(BAD_FORMAT.into()),
            Err(e) => Err(format!("ERR {e}").into()),
        };
    }
    // Redis reads the object from the whole payload, footer included (an
    // object that runs into it is still read), and ignores what is left.
    let (value, flags) = decode_object(a[3]).ok_or(CmdError::from(BAD_FORMAT))?;
    if at.is_some_and(|t| t <= unix_ms() as i64) {
        // Already expired: the key is gone (REPLACE deleted the old one).
        if replace {
            coll::delete_key(store, a[1])?;
        }
        r.ok();
        return Ok(());
    }
    if replace {
        coll::delete_key(store, a[1])?;
    }
    let opts = PutOptions {
        condition: if replace {
            Condition::Always
        } else {
            Condition::IfAbsent
        },
        expiry: at.map_or(Expiry::Never, |t| Expiry::At(t as u64)),
        flags,
    };
    match store.put_with(a[1], &value, opts) {
        Ok(_) => r.ok(),
        Err(nibble::Error::Exists) => return Err("BUSYKEY Target key name already exists.".into()),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_matches_redis() {
        assert_eq!(crc64(0, b"123456789"), 0xe9c6_d914_c4b8_d9ca);
        // Any split gives the same CRC (slicing-by-8 and the byte tail).
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
        let whole = crc64(0, &data);
        for cut in [1, 7, 8, 9, 500, 999] {
            assert_eq!(crc64(crc64(0, &data[..cut]), &data[cut..]), whole);
        }
    }

    #[test]
    fn listpack_roundtrip() {
        let h: Hash = vec![
            (b"f".to_vec(), b"v".to_vec()),
            (b"n".to_vec(), b"-5000".to_vec()),
            (b"big".to_vec(), b"12345678901".to_vec()),
            (vec![b'x'; 100], vec![b'y'; 5000]),
        ];
        let lp = listpack(&h);
        assert_eq!(pairs_to_hash(listpack_entries(&lp).unwrap()).unwrap(), h);
    }
}
