//! Reading an RDB file: every value type redis-server 7.0 writes (and the
//! older encodings it still reads) into the neutral [`RdbValue`].
//!
//! The parser walks the file once, front to back, handing each key to a
//! callback; it never trusts a length before it has the bytes (every read
//! is bounds-checked by `dump::Rd`), so a truncated or damaged file is an
//! [`RdbError`] naming the byte offset, never a panic or a huge
//! allocation. The checksum is checked first, over the whole file, so a
//! file with a flipped bit is refused before any key is imported.
//!
//! Encodings understood, by type byte:
//!
//! | type | what | payload |
//! |---|---|---|
//! | 0 | string | RDB string (raw, int8/16/32, LZF) |
//! | 1, 10, 14, 18 | list | strings / ziplist / quicklist of ziplists / quicklist of listpacks or plain nodes |
//! | 2, 11, 20 | set | strings / intset / listpack |
//! | 3, 5, 12, 17 | sorted set | strings + text scores / binary scores / ziplist / listpack |
//! | 4, 9, 13, 16 | hash | strings / zipmap / ziplist / listpack |
//!
//! Streams (15, 19, 21) and module values (6, 7, 0xF7) cannot be
//! skipped without parsing them, and are refused with the offset and a
//! message saying so.

use std::collections::HashSet;

use super::RdbValue;
use crate::commands::dump::{crc64, listpack_entries, pairs_to_hash, Rd};

/// Opcodes between keys.
pub const OP_FUNCTION2: u8 = 0xF5;
/// Function library (7.0 release candidates).
pub const OP_FUNCTION_PRE_GA: u8 = 0xF6;
/// Module auxiliary data.
pub const OP_MODULE_AUX: u8 = 0xF7;
/// LRU idle time of the next key.
pub const OP_IDLE: u8 = 0xF8;
/// LFU frequency of the next key.
pub const OP_FREQ: u8 = 0xF9;
/// Auxiliary field (name, value).
pub const OP_AUX: u8 = 0xFA;
/// Hash table size hints.
pub const OP_RESIZEDB: u8 = 0xFB;
/// Expiry of the next key, Unix ms (8 bytes LE).
pub const OP_EXPIRETIME_MS: u8 = 0xFC;
/// Expiry of the next key, Unix s (4 bytes LE).
pub const OP_EXPIRETIME: u8 = 0xFD;
/// Database number.
pub const OP_SELECTDB: u8 = 0xFE;
/// End of the file (the checksum follows).
pub const OP_EOF: u8 = 0xFF;

/// Value types (Redis's `RDB_TYPE_*`).
pub mod ty {
    /// String.
    pub const STRING: u8 = 0;
    /// List of strings (old).
    pub const LIST: u8 = 1;
    /// Set of strings.
    pub const SET: u8 = 2;
    /// Sorted set with text scores (old).
    pub const ZSET: u8 = 3;
    /// Hash of string pairs.
    pub const HASH: u8 = 4;
    /// Sorted set with binary scores.
    pub const ZSET_2: u8 = 5;
    /// Module value (pre-GA).
    pub const MODULE_PRE_GA: u8 = 6;
    /// Module value.
    pub const MODULE_2: u8 = 7;
    /// Hash as a zipmap (Redis < 2.6).
    pub const HASH_ZIPMAP: u8 = 9;
    /// List as a ziplist (Redis < 3.2).
    pub const LIST_ZIPLIST: u8 = 10;
    /// Set of integers.
    pub const SET_INTSET: u8 = 11;
    /// Sorted set as a ziplist (Redis < 7.0).
    pub const ZSET_ZIPLIST: u8 = 12;
    /// Hash as a ziplist (Redis < 7.0).
    pub const HASH_ZIPLIST: u8 = 13;
    /// List as a quicklist of ziplists (Redis 3.2 - 6.2).
    pub const LIST_QUICKLIST: u8 = 14;
    /// Stream.
    pub const STREAM_LISTPACKS: u8 = 15;
    /// Hash as a listpack.
    pub const HASH_LISTPACK: u8 = 16;
    /// Sorted set as a listpack.
    pub const ZSET_LISTPACK: u8 = 17;
    /// List as a quicklist of listpacks (Redis 7.0).
    pub const LIST_QUICKLIST_2: u8 = 18;
    /// Stream (7.0).
    pub const STREAM_LISTPACKS_2: u8 = 19;
    /// Set as a listpack (Redis 7.2, RDB 11).
    pub const SET_LISTPACK: u8 = 20;
    /// Stream (7.2).
    pub const STREAM_LISTPACKS_3: u8 = 21;
}

/// Quicklist node containers (type 18).
const QUICKLIST_NODE_PLAIN: u64 = 1;
const QUICKLIST_NODE_PACKED: u64 = 2;
/// Newest RDB version read (Redis 7.2 writes 11; its new set encoding is
/// read, its streams are refused like every stream).
pub const RDB_VERSION_MAX_READ: u16 = 11;
/// Bytes of the magic and version: `REDIS0010`.
pub const RDB_HEADER_BYTES: usize = 9;

/// Why a file was refused: what, and at which byte.
#[derive(Debug, Clone, PartialEq)]
pub struct RdbError {
    /// Byte offset in the file.
    pub offset: usize,
    /// What is wrong.
    pub what: String,
}

impl std::fmt::Display for RdbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at byte offset {}: {}", self.offset, self.what)
    }
}

/// One key of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Database number (SELECTDB).
    pub db: u64,
    /// The key.
    pub key: Vec<u8>,
    /// Expiry, Unix ms.
    pub expire_ms: Option<i64>,
    /// The value.
    pub value: RdbValue,
}

/// What the header and aux fields said.
#[derive(Debug, Default, Clone)]
pub struct FileInfo {
    /// RDB version.
    pub version: u16,
    /// Aux fields in file order.
    pub aux: Vec<(Vec<u8>, Vec<u8>)>,
    /// Function libraries skipped (OP_FUNCTION2).
    pub functions_skipped: u64,
}

/// A bounds-checked reader that knows its offset in the file.
struct P<'a> {
    rd: Rd<'a>,
    total: usize,
}

impl<'a> P<'a> {
    fn off(&self) -> usize {
        self.total - self.rd.0.len()
    }

    fn err<T>(&self, what: impl Into<String>) -> Result<T, RdbError> {
        Err(RdbError {
            offset: self.off(),
            what: what.into(),
        })
    }

    fn truncated<T>(&self) -> Result<T, RdbError> {
        self.err("file truncated or length out of range")
    }

    fn byte(&mut self) -> Result<u8, RdbError> {
        match self.rd.byte() {
            Some(b) => Ok(b),
            None => self.truncated(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], RdbError> {
        match self.rd.take(n) {
            Some(b) => Ok(b),
            None => self.truncated(),
        }
    }

    /// A plain length (not a special string encoding).
    fn len(&mut self) -> Result<u64, RdbError> {
        let at = self.off();
        match self.rd.len() {
            Some((n, false)) => Ok(n),
            Some((_, true)) => Err(RdbError {
                offset: at,
                what: "a string encoding where a length was expected".into(),
            }),
            None => Err(RdbError {
                offset: at,
                what: "bad length encoding or file truncated".into(),
            }),
        }
    }

    /// A count of items, each taking at least `min_bytes`: refused when
    /// the rest of the file cannot hold that many (no huge allocation).
    fn count(&mut self, min_bytes: u64) -> Result<usize, RdbError> {
        let at = self.off();
        let n = self.len()?;
        if n.saturating_mul(min_bytes) > self.rd.0.len() as u64 {
            return Err(RdbError {
                offset: at,
                what: format!("count {n} larger than the rest of the file"),
            });
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<Vec<u8>, RdbError> {
        let at = self.off();
        self.rd.string().ok_or_else(|| RdbError {
            offset: at,
            what: "bad string (length, integer or LZF encoding) or file truncated".into(),
        })
    }

    fn u64_le(&mut self) -> Result<u64, RdbError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }
}

/// Check the magic, the version and the trailing checksum of a whole
/// file; the version. A zero checksum means the writer had checksums off
/// (`rdbchecksum no`), as Redis accepts.
pub fn check_file(data: &[u8]) -> Result<u16, RdbError> {
    let bad = |offset, what: String| Err(RdbError { offset, what });
    if data.len() < RDB_HEADER_BYTES || &data[..5] != b"REDIS" {
        return bad(0, "not an RDB file (no REDIS magic)".into());
    }
    let v = std::str::from_utf8(&data[5..9])
        .ok()
        .and_then(|s| s.parse::<u16>().ok());
    let Some(version) = v else {
        return bad(5, "bad RDB version field".into());
    };
    if !(1..=RDB_VERSION_MAX_READ).contains(&version) {
        return bad(5, format!("RDB version {version} not supported"));
    }
    if version >= 5 {
        if data.len() < RDB_HEADER_BYTES + 9 {
            return bad(data.len(), "file truncated (no EOF and checksum)".into());
        }
        let body = &data[..data.len() - 8];
        let want = u64::from_le_bytes(data[data.len() - 8..].try_into().unwrap_or_default());
        if want != 0 {
            let got = crc64(0, body);
            if got != want {
                return bad(
                    data.len() - 8,
                    format!("checksum mismatch (file says {want:016x}, content gives {got:016x}): damaged or truncated"),
                );
            }
        }
    }
    Ok(version)
}

/// Parse a whole file (after [`check_file`]), calling `each` per key.
pub fn parse(
    data: &[u8],
    mut each: impl FnMut(Entry) -> Result<(), RdbError>,
) -> Result<FileInfo, RdbError> {
    let version = check_file(data)?;
    let mut info = FileInfo {
        version,
        ..Default::default()
    };
    let mut p = P {
        rd: Rd(&data[RDB_HEADER_BYTES..]),
        total: data.len(),
    };
    let mut db = 0u64;
    let mut expire: Option<i64> = None;
    loop {
        let at = p.off();
        let op = p.byte()?;
        match op {
            OP_EOF => break,
            OP_AUX => {
                let k = p.string()?;
                let v = p.string()?;
                info.aux.push((k, v));
            }
            OP_SELECTDB => db = p.len()?,
            OP_RESIZEDB => {
                p.len()?;
                p.len()?;
            }
            OP_EXPIRETIME_MS => expire = Some(p.u64_le()? as i64),
            OP_EXPIRETIME => {
                let b = p.take(4)?;
                let s = i32::from_le_bytes(b.try_into().unwrap_or_default());
                expire = Some(i64::from(s) * 1000);
            }
            OP_IDLE => {
                p.len()?;
            }
            OP_FREQ => {
                p.byte()?;
            }
            OP_FUNCTION2 => {
                // A function library's code: nothing here runs functions.
                p.string()?;
                info.functions_skipped += 1;
            }
            OP_FUNCTION_PRE_GA | OP_MODULE_AUX => {
                return Err(RdbError {
                    offset: at,
                    what: format!(
                        "opcode {op:#04x} (module or pre-GA function data) not supported"
                    ),
                })
            }
            t => {
                let key = p.string()?;
                let value = value(&mut p, t, at)?;
                each(Entry {
                    db,
                    key,
                    expire_ms: expire.take(),
                    value,
                })?;
            }
        }
    }
    if version >= 5 && p.rd.0.len() != 8 {
        return p.err("bytes after the EOF opcode other than the checksum");
    }
    Ok(info)
}

/// Decode one value of type `t` (whose type byte was at `at`).
pub fn value_of(body: &[u8], t: u8) -> Result<RdbValue, RdbError> {
    let mut p = P {
        rd: Rd(body),
        total: body.len(),
    };
    value(&mut p, t, 0)
}

fn value(p: &mut P, t: u8, at: usize) -> Result<RdbValue, RdbError> {
    let bad = |what: String| RdbError { offset: at, what };
    let v =
        match t {
            ty::STRING => RdbValue::String(p.string()?),
            ty::LIST => {
                let n = p.count(1)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(p.string()?);
                }
                RdbValue::List(v)
            }
            ty::SET => {
                let n = p.count(1)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(p.string()?);
                }
                RdbValue::Set(v)
            }
            ty::ZSET | ty::ZSET_2 => {
                let n = p.count(2)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let m = p.string()?;
                    let s = if t == ty::ZSET_2 {
                        f64::from_bits(p.u64_le()?)
                    } else {
                        text_double(p)?
                    };
                    if s.is_nan() {
                        return Err(bad("sorted set score is NaN".into()));
                    }
                    v.push((m, s));
                }
                RdbValue::ZSet(v)
            }
            ty::HASH => {
                let n = p.count(2)?;
                let mut v = Vec::with_capacity(2 * n);
                for _ in 0..2 * n {
                    v.push(p.string()?);
                }
                RdbValue::Hash(pairs(v).ok_or_else(|| bad("hash with a field twice".into()))?)
            }
            ty::HASH_ZIPMAP => {
                let b = p.string()?;
                RdbValue::Hash(zipmap(&b).ok_or_else(|| bad("malformed zipmap".into()))?)
            }
            ty::LIST_ZIPLIST => {
                let b = p.string()?;
                RdbValue::List(ziplist(&b).ok_or_else(|| bad("malformed ziplist".into()))?)
            }
            ty::SET_INTSET => {
                let b = p.string()?;
                RdbValue::Set(intset(&b).ok_or_else(|| bad("malformed intset".into()))?)
            }
            ty::SET_LISTPACK => {
                let b = p.string()?;
                RdbValue::Set(listpack_entries(&b).ok_or_else(|| bad("malformed listpack".into()))?)
            }
            ty::ZSET_ZIPLIST | ty::ZSET_LISTPACK => {
                let b = p.string()?;
                let items = if t == ty::ZSET_ZIPLIST {
                    ziplist(&b)
                } else {
                    listpack_entries(&b)
                }
                .ok_or_else(|| bad("malformed ziplist/listpack".into()))?;
                RdbValue::ZSet(
                    zset_pairs(items).ok_or_else(|| bad("malformed sorted set entries".into()))?,
                )
            }
            ty::HASH_ZIPLIST | ty::HASH_LISTPACK => {
                let b = p.string()?;
                let items = if t == ty::HASH_ZIPLIST {
                    ziplist(&b)
                } else {
                    listpack_entries(&b)
                }
                .ok_or_else(|| bad("malformed ziplist/listpack".into()))?;
                if items.is_empty() {
                    RdbValue::Hash(Vec::new())
                } else {
                    RdbValue::Hash(pairs_to_hash(items).ok_or_else(|| {
                        bad("hash with an odd entry count or a field twice".into())
                    })?)
                }
            }
            ty::LIST_QUICKLIST | ty::LIST_QUICKLIST_2 => {
                let n = p.count(1)?;
                let mut v = Vec::new();
                for _ in 0..n {
                    let container = if t == ty::LIST_QUICKLIST_2 {
                        p.len()?
                    } else {
                        QUICKLIST_NODE_PACKED
                    };
                    let b = p.string()?;
                    match container {
                        QUICKLIST_NODE_PLAIN => v.push(b),
                        QUICKLIST_NODE_PACKED => {
                            let items = if t == ty::LIST_QUICKLIST {
                                ziplist(&b)
                            } else {
                                listpack_entries(&b)
                            };
                            v.extend(items.ok_or_else(|| bad("malformed quicklist node".into()))?);
                        }
                        c => return Err(bad(format!("quicklist container {c} unknown"))),
                    }
                }
                RdbValue::List(v)
            }
            ty::STREAM_LISTPACKS | ty::STREAM_LISTPACKS_2 | ty::STREAM_LISTPACKS_3 => {
                return Err(bad(format!(
                    "stream value (type {t}) not supported: streams cannot be imported"
                )))
            }
            ty::MODULE_PRE_GA | ty::MODULE_2 => {
                return Err(bad(format!(
                    "module value (type {t}) not supported: no modules here"
                )))
            }
            t => return Err(bad(format!("unknown value type {t}"))),
        };
    match &v {
        RdbValue::Set(s) if has_duplicates(s.iter()) => Err(bad("set with a member twice".into())),
        RdbValue::ZSet(z) if has_duplicates(z.iter().map(|(m, _)| m)) => {
            Err(bad("sorted set with a member twice".into()))
        }
        _ => Ok(v),
    }
}

fn has_duplicates<'a>(mut it: impl Iterator<Item = &'a Vec<u8>>) -> bool {
    let mut seen = HashSet::new();
    it.any(|m| !seen.insert(m.as_slice()))
}

/// Pairs of a flat list, refused with a duplicate field (empty is fine
/// here; the importer reports empty values).
fn pairs(items: Vec<Vec<u8>>) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if items.is_empty() {
        return Some(Vec::new());
    }
    pairs_to_hash(items)
}

/// `rdbLoadDoubleValue`: a length byte (253 NaN, 254 +inf, 255 -inf)
/// then that many ASCII bytes.
fn text_double(p: &mut P) -> Result<f64, RdbError> {
    let n = p.byte()?;
    match n {
        253 => Ok(f64::NAN),
        254 => Ok(f64::INFINITY),
        255 => Ok(f64::NEG_INFINITY),
        n => {
            let b = p.take(usize::from(n))?;
            match crate::commands::parse_f64(b) {
                Some(v) => Ok(v),
                None => p.err("bad score text"),
            }
        }
    }
}

/// Member/score pairs of a ziplist or listpack.
fn zset_pairs(items: Vec<Vec<u8>>) -> Option<Vec<(Vec<u8>, f64)>> {
    if !items.len().is_multiple_of(2) {
        return None;
    }
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(m), Some(s)) = (it.next(), it.next()) {
        out.push((m, crate::commands::parse_f64(&s)?));
    }
    Some(out)
}

/// Entries of a ziplist (`ziplist.c`): zlbytes u32, zltail u32, zllen
/// u16, entries (prevlen, encoding, data), 0xFF.
pub fn ziplist(z: &[u8]) -> Option<Vec<Vec<u8>>> {
    if z.len() < 11 || u32::from_le_bytes(z[..4].try_into().ok()?) as usize != z.len() {
        return None;
    }
    if *z.last()? != 0xFF {
        return None;
    }
    let mut p = 10;
    let mut out = Vec::new();
    let get = |from: usize, n: usize| z.get(from..from.checked_add(n)?);
    loop {
        let b = *z.get(p)?;
        if b == 0xFF {
            break;
        }
        p += if b < 254 { 1 } else { 5 };
        let e = *z.get(p)?;
        let le_int = |from: usize, n: usize| -> Option<i64> {
            let s = get(from, n)?;
            let u = s.iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x));
            let shift = 64 - 8 * n as u32;
            Some(((u << shift) as i64) >> shift)
        };
        let (v, size): (Vec<u8>, usize) = match e >> 6 {
            0 => {
                let n = usize::from(e & 0x3f);
                (get(p + 1, n)?.to_vec(), 1 + n)
            }
            1 => {
                let n = (usize::from(e & 0x3f) << 8) | usize::from(*z.get(p + 1)?);
                (get(p + 2, n)?.to_vec(), 2 + n)
            }
            2 => {
                let n = u32::from_be_bytes(get(p + 1, 4)?.try_into().ok()?) as usize;
                (get(p + 5, n)?.to_vec(), 5 + n)
            }
            _ => {
                let (x, n) = match e {
                    0xC0 => (le_int(p + 1, 2)?, 2),
                    0xD0 => (le_int(p + 1, 4)?, 4),
                    0xE0 => (le_int(p + 1, 8)?, 8),
                    0xF0 => (le_int(p + 1, 3)?, 3),
                    0xFE => (le_int(p + 1, 1)?, 1),
                    0xF1..=0xFD => (i64::from(e & 0x0f) - 1, 0),
                    _ => return None,
                };
                (x.to_string().into_bytes(), 1 + n)
            }
        };
        p += size;
        out.push(v);
    }
    (p + 1 == z.len()).then_some(out)
}

/// Members of an intset: encoding u32 (2, 4 or 8 bytes per member),
/// count u32, members, all little-endian.
pub fn intset(b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let enc = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
    let n = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?) as usize;
    if !matches!(enc, 2 | 4 | 8) || b.len() != 8 + enc.checked_mul(n)? {
        return None;
    }
    Some(
        b[8..]
            .chunks_exact(enc)
            .map(|c| {
                let v = match enc {
                    2 => i64::from(i16::from_le_bytes([c[0], c[1]])),
                    4 => i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                    _ => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
                };
                v.to_string().into_bytes()
            })
            .collect(),
    )
}

/// Pairs of a zipmap (Redis < 2.6): zmlen, then (len, field, len, free,
/// value, free bytes) until 0xFF; a length is one byte below 254, or 254
/// and a u32 (little-endian).
pub fn zipmap(z: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut p = 1;
    let len = |p: &mut usize| -> Option<Option<usize>> {
        let b = *z.get(*p)?;
        *p += 1;
        match b {
            255 => Some(None),
            254 => {
                let n = u32::from_le_bytes(z.get(*p..*p + 4)?.try_into().ok()?) as usize;
                *p += 4;
                Some(Some(n))
            }
            n => Some(Some(usize::from(n))),
        }
    };
    let mut items = Vec::new();
    while let Some(fl) = len(&mut p)? {
        let f = z.get(p..p.checked_add(fl)?)?.to_vec();
        p += fl;
        let vl = len(&mut p)??;
        let free = usize::from(*z.get(p)?);
        p += 1;
        let v = z.get(p..p.checked_add(vl)?)?.to_vec();
        p += vl + free;
        items.push(f);
        items.push(v);
    }
    if p != z.len() {
        return None;
    }
    pairs(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ziplist of `items` (strings as strings, small ints as the
    /// immediate form, others as int16/int64), as Redis 6 would write.
    fn make_ziplist(items: &[&[u8]]) -> Vec<u8> {
        let mut z = vec![0u8; 10];
        let mut prev = 0usize;
        for it in items {
            let start = z.len();
            if prev < 254 {
                z.push(prev as u8);
            } else {
                z.push(254);
                z.extend_from_slice(&(prev as u32).to_le_bytes());
            }
            match crate::commands::parse_i64(it) {
                Some(v) if (0..=12).contains(&v) => z.push(0xF1 + v as u8),
                Some(v) if i16::try_from(v).is_ok() => {
                    z.push(0xC0);
                    z.extend_from_slice(&(v as i16).to_le_bytes());
                }
                Some(v) => {
                    z.push(0xE0);
                    z.extend_from_slice(&v.to_le_bytes());
                }
                None if it.len() < 64 => {
                    z.push(it.len() as u8);
                    z.extend_from_slice(it);
                }
                None => {
                    z.push(0x80);
                    z.extend_from_slice(&(it.len() as u32).to_be_bytes());
                    z.extend_from_slice(it);
                }
            }
            prev = z.len() - start;
        }
        z.push(0xFF);
        let n = z.len() as u32;
        z[..4].copy_from_slice(&n.to_le_bytes());
        z[8..10].copy_from_slice(&(items.len() as u16).to_le_bytes());
        z
    }

    #[test]
    fn ziplist_entries() {
        let long = vec![b'x'; 300];
        let items: Vec<&[u8]> = vec![b"a", b"7", b"-300", b"123456789012", &long, b"0"];
        assert_eq!(
            ziplist(&make_ziplist(&items)).unwrap(),
            items.iter().map(|s| s.to_vec()).collect::<Vec<_>>()
        );
        let mut z = make_ziplist(&items);
        z.truncate(z.len() - 3);
        assert!(ziplist(&z).is_none());
    }

    #[test]
    fn intset_members() {
        let mut b = Vec::new();
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&3u32.to_le_bytes());
        for v in [-70000i32, 1, 70000] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(
            intset(&b).unwrap(),
            vec![b"-70000".to_vec(), b"1".to_vec(), b"70000".to_vec()]
        );
        assert!(intset(&b[..b.len() - 1]).is_none());
    }

    #[test]
    fn zipmap_pairs() {
        let mut z = vec![2u8];
        z.extend_from_slice(&[1, b'a', 2, 1, b'v', b'w', 0]);
        z.extend_from_slice(&[2, b'b', b'b', 0, 0]);
        z.push(255);
        assert_eq!(
            zipmap(&z).unwrap(),
            vec![
                (b"a".to_vec(), b"vw".to_vec()),
                (b"bb".to_vec(), Vec::new())
            ]
        );
    }

    #[test]
    fn hash_ziplist_and_quicklist_values() {
        let z = make_ziplist(&[b"f", b"1", b"g", b"two"]);
        let mut body = Vec::new();
        crate::commands::dump::put_string(&mut body, &z);
        assert_eq!(
            value_of(&body, ty::HASH_ZIPLIST).unwrap(),
            RdbValue::Hash(vec![
                (b"f".to_vec(), b"1".to_vec()),
                (b"g".to_vec(), b"two".to_vec())
            ])
        );
        let mut q = Vec::new();
        crate::commands::dump::put_len(&mut q, 2);
        crate::commands::dump::put_string(&mut q, &make_ziplist(&[b"a", b"b"]));
        crate::commands::dump::put_string(&mut q, &make_ziplist(&[b"3"]));
        assert_eq!(
            value_of(&q, ty::LIST_QUICKLIST).unwrap(),
            RdbValue::List(vec![b"a".to_vec(), b"b".to_vec(), b"3".to_vec()])
        );
        let zs = make_ziplist(&[b"m", b"1.5", b"n", b"2"]);
        let mut body = Vec::new();
        crate::commands::dump::put_string(&mut body, &zs);
        assert_eq!(
            value_of(&body, ty::ZSET_ZIPLIST).unwrap(),
            RdbValue::ZSet(vec![(b"m".to_vec(), 1.5), (b"n".to_vec(), 2.0)])
        );
    }

    #[test]
    fn refusals_name_the_offset() {
        assert_eq!(check_file(b"NOTRDB0010xxxxxxxxxxx").unwrap_err().offset, 0);
        assert!(check_file(b"REDIS0099\xff\0\0\0\0\0\0\0\0")
            .unwrap_err()
            .what
            .contains("version"));
        // A set with a member twice.
        let mut b = Vec::new();
        crate::commands::dump::put_len(&mut b, 2);
        crate::commands::dump::put_string(&mut b, b"x");
        crate::commands::dump::put_string(&mut b, b"x");
        assert!(value_of(&b, ty::SET).is_err());
        assert!(value_of(&b, 15).unwrap_err().what.contains("stream"));
        assert!(value_of(&b, 200).unwrap_err().what.contains("unknown"));
    }
}
