//! Writing an RDB file as redis-server 7.0 writes it (RDB version 10).
//!
//! ```text
//!  "REDIS0010"
//!  AUX redis-ver "7.0.0"   AUX redis-bits 64   AUX ctime <unix s>
//!  AUX used-mem <bytes>    AUX aof-base 0
//!  SELECTDB 0   RESIZEDB <keys> <keys with expiry>
//!  per key: [EXPIRETIME_MS <u64 LE unix ms>] type key value
//!  EOF  crc64 (u64 LE, over every byte before it)
//! ```
//!
//! Strings and the string encodings (integers, LZF over 20 bytes), and
//! the hash listpack, come from `commands::dump`, which DUMP uses too: a
//! value is written the same way in a DUMP payload and in a file. A list
//! is written as a quicklist of listpacks (18), a set as strings (2), and
//! a sorted set (which the server cannot store yet; written so encoder
//! and decoder are tested against each other) with binary scores (5):
//! encodings Redis 7.0 loads and converts to its compact forms where
//! small.
//!
//! [`Writer`] streams: it keeps a buffer of about [`WRITE_CHUNK_BYTES`],
//! folds each full buffer into the running CRC and writes it out, so a
//! file of any size costs one buffer of memory.

use std::io::Write;

use super::decode::{ty, OP_AUX, OP_EOF, OP_EXPIRETIME_MS, OP_RESIZEDB, OP_SELECTDB};
use super::RdbValue;
use crate::commands::dump::{crc64, lp_entry, put_len, put_string};

/// Bytes buffered before a write to the file.
pub const WRITE_CHUNK_BYTES: usize = 1 << 20;
/// Largest listpack node of a saved list, bytes (Redis's default
/// `list-max-listpack-size -2` is 8 KiB).
pub const LIST_NODE_MAX_BYTES: usize = 8 << 10;
/// The `redis-ver` aux field: the release whose format this is.
pub const AUX_REDIS_VER: &str = "7.0.0";

/// Hash encoding limits (`hash-max-listpack-entries`, `-value`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most fields of a listpack hash.
    pub hash_entries: usize,
    /// Longest field or value of a listpack hash.
    pub hash_value_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            hash_entries: 512,
            hash_value_bytes: 64,
        }
    }
}

/// Append `v`'s type byte and encoding to `out`.
pub fn put_value(out: &mut Vec<u8>, v: &RdbValue, lim: Limits) {
    match v {
        RdbValue::String(s) => {
            out.push(ty::STRING);
            put_string(out, s);
        }
        RdbValue::Hash(h) => {
            let small = h.len() <= lim.hash_entries
                && h.iter().all(|(f, x)| {
                    f.len() <= lim.hash_value_bytes && x.len() <= lim.hash_value_bytes
                });
            if small {
                out.push(ty::HASH_LISTPACK);
                put_string(out, &crate::commands::dump::listpack(h));
            } else {
                out.push(ty::HASH);
                put_len(out, h.len() as u64);
                for (f, x) in h {
                    put_string(out, f);
                    put_string(out, x);
                }
            }
        }
        RdbValue::List(l) => {
            out.push(ty::LIST_QUICKLIST_2);
            let nodes = list_nodes(l);
            put_len(out, nodes.len() as u64);
            for n in nodes {
                put_len(out, 2); // a packed (listpack) node
                put_string(out, &listpack_of(n));
            }
        }
        RdbValue::Set(s) => {
            out.push(ty::SET);
            put_len(out, s.len() as u64);
            for m in s {
                put_string(out, m);
            }
        }
        RdbValue::ZSet(z) => {
            out.push(ty::ZSET_2);
            put_len(out, z.len() as u64);
            for (m, sc) in z {
                put_string(out, m);
                out.extend_from_slice(&sc.to_bits().to_le_bytes());
            }
        }
    }
}

/// Split a list into runs of at most [`LIST_NODE_MAX_BYTES`] (at least
/// one element each).
fn list_nodes(l: &[Vec<u8>]) -> Vec<&[Vec<u8>]> {
    let mut nodes = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, e) in l.iter().enumerate() {
        if i > start && bytes + e.len() > LIST_NODE_MAX_BYTES {
            nodes.push(&l[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += e.len() + 2;
    }
    if start < l.len() {
        nodes.push(&l[start..]);
    }
    nodes
}

/// A listpack of `items`.
fn listpack_of(items: &[Vec<u8>]) -> Vec<u8> {
    let mut lp = vec![0u8; 6];
    for it in items {
        lp_entry(&mut lp, it);
    }
    lp.push(0xFF);
    let total = lp.len() as u32;
    lp[..4].copy_from_slice(&total.to_le_bytes());
    let n = items.len().min(65535) as u16;
    lp[4..6].copy_from_slice(&n.to_le_bytes());
    lp
}

/// A streaming RDB writer over any `Write`.
pub struct Writer<W: Write> {
    out: W,
    buf: Vec<u8>,
    crc: u64,
    /// Bytes handed to `out` so far.
    pub written: u64,
    lim: Limits,
}

impl<W: Write> Writer<W> {
    /// Start a file: magic, version, aux fields, SELECTDB 0, RESIZEDB.
    pub fn new(
        out: W,
        lim: Limits,
        used_mem: u64,
        keys_hint: u64,
        expires_hint: u64,
    ) -> std::io::Result<Self> {
        let mut w = Writer {
            out,
            buf: Vec::with_capacity(WRITE_CHUNK_BYTES + (64 << 10)),
            crc: 0,
            written: 0,
            lim,
        };
        w.buf.extend_from_slice(b"REDIS");
        w.buf
            .extend_from_slice(format!("{:04}", crate::commands::dump::RDB_VERSION).as_bytes());
        let ctime = crate::state::unix_ms() / 1000;
        for (k, v) in [
            ("redis-ver", AUX_REDIS_VER.to_string()),
            ("redis-bits", "64".to_string()),
            ("ctime", ctime.to_string()),
            ("used-mem", used_mem.to_string()),
            ("aof-base", "0".to_string()),
        ] {
            w.buf.push(OP_AUX);
            put_string(&mut w.buf, k.as_bytes());
            put_string(&mut w.buf, v.as_bytes());
        }
        w.buf.push(OP_SELECTDB);
        put_len(&mut w.buf, 0);
        w.buf.push(OP_RESIZEDB);
        put_len(&mut w.buf, keys_hint);
        put_len(&mut w.buf, expires_hint);
        Ok(w)
    }

    fn flush_chunk(&mut self) -> std::io::Result<()> {
        self.crc = crc64(self.crc, &self.buf);
        self.out.write_all(&self.buf)?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Start a key: its expiry (the type byte and key follow).
    fn key_head(&mut self, expire_ms: Option<u64>) {
        if let Some(at) = expire_ms {
            self.buf.push(OP_EXPIRETIME_MS);
            self.buf.extend_from_slice(&at.to_le_bytes());
        }
    }

    /// One key with any value.
    pub fn put(&mut self, key: &[u8], expire_ms: Option<u64>, v: &RdbValue) -> std::io::Result<()> {
        self.key_head(expire_ms);
        // The type byte comes before the key: write the value into the
        // buffer, then move its first byte (the type) ahead of the key.
        let at = self.buf.len();
        put_value(&mut self.buf, v, self.lim);
        let t = self.buf[at];
        let mut k = Vec::with_capacity(key.len() + 5);
        put_string(&mut k, key);
        self.buf.splice(at..at + 1, std::iter::once(t).chain(k));
        self.maybe_flush()
    }

    /// One string key (no copy of the value into an [`RdbValue`]).
    pub fn put_string_key(
        &mut self,
        key: &[u8],
        expire_ms: Option<u64>,
        v: &[u8],
    ) -> std::io::Result<()> {
        self.key_head(expire_ms);
        self.buf.push(ty::STRING);
        put_string(&mut self.buf, key);
        put_string(&mut self.buf, v);
        self.maybe_flush()
    }

    fn maybe_flush(&mut self) -> std::io::Result<()> {
        if self.buf.len() >= WRITE_CHUNK_BYTES {
            self.flush_chunk()?;
        }
        Ok(())
    }

    /// EOF and the checksum; the inner writer (not flushed or synced)
    /// and the file's size in bytes.
    pub fn finish(mut self) -> std::io::Result<(W, u64)> {
        self.buf.push(OP_EOF);
        self.flush_chunk()?;
        let crc = self.crc.to_le_bytes();
        self.out.write_all(&crc)?;
        self.written += 8;
        Ok((self.out, self.written))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdb::decode;

    #[test]
    fn file_roundtrip_every_type() {
        let entries = vec![
            (b"s".to_vec(), None, RdbValue::String(b"hello".to_vec())),
            (
                b"i".to_vec(),
                Some(4_000_000_000_000u64),
                RdbValue::String(b"-12345".to_vec()),
            ),
            (b"z".to_vec(), None, RdbValue::String(vec![b'a'; 1000])),
            (
                b"h".to_vec(),
                None,
                RdbValue::Hash(vec![(b"f".to_vec(), b"1".to_vec())]),
            ),
            (
                b"H".to_vec(),
                None,
                RdbValue::Hash(vec![(b"f".to_vec(), vec![b'q'; 100])]),
            ),
            (
                b"l".to_vec(),
                None,
                RdbValue::List((0..3000).map(|i| format!("e{i}").into_bytes()).collect()),
            ),
            (
                b"S".to_vec(),
                None,
                RdbValue::Set(vec![b"1".to_vec(), b"x".to_vec()]),
            ),
            (
                b"Z".to_vec(),
                Some(5),
                RdbValue::ZSet(vec![(b"m".to_vec(), 1.5), (b"n".to_vec(), f64::INFINITY)]),
            ),
        ];
        let mut w = Writer::new(Vec::new(), Limits::default(), 0, 8, 2).unwrap();
        for (k, e, v) in &entries {
            w.put(k, *e, v).unwrap();
        }
        let (file, n) = w.finish().unwrap();
        assert_eq!(n as usize, file.len());
        let mut got = Vec::new();
        let info = decode::parse(&file, |e| {
            got.push((e.key, e.expire_ms.map(|x| x as u64), e.value));
            Ok(())
        })
        .unwrap();
        assert_eq!(info.version, 10);
        assert_eq!(got, entries);
        // One flipped bit anywhere is refused by the checksum.
        let mut bad = file.clone();
        bad[40] ^= 4;
        assert!(decode::parse(&bad, |_| Ok(()))
            .unwrap_err()
            .what
            .contains("checksum"));
        // Truncated.
        assert!(decode::parse(&file[..file.len() - 20], |_| Ok(())).is_err());
    }
}
