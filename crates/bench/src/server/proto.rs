//! The client side of the two wire protocols `memlab server` speaks: RESP2
//! (Redis) and the memcached text protocol. Only what a load generator
//! needs: encoding GET, SET, DEL and arbitrary commands into a buffer, and
//! parsing one reply at a time out of a receive buffer without copying
//! (a [`Reply`] borrows the buffer).
//!
//! Parsing is incremental: [`parse`] returns `Ok(None)` while the buffer
//! holds only part of a reply, and the caller reads more and tries again
//! from the same offset. A reply the client cannot understand is an error,
//! and the connection is given up (the generator then fails the run).
//!
//! The memcached text protocol is not self-describing (`END` closes a `get`
//! or a `stats`, a storage command answers one line), so its parser is told
//! what the request was ([`Expect`]). RESP replies describe themselves; the
//! parser ignores `Expect` for RESP.

use std::fmt;

use crate::error::{BenchError, Result};

/// Which protocol a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// Redis serialization protocol (RESP2)
    Resp,
    /// memcached's text protocol
    Memcached,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Resp => "resp",
            Proto::Memcached => "memcached",
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a request was, for the memcached parser (RESP ignores it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// `get`: `VALUE ... END` or just `END`.
    Get,
    /// `set`, `delete`, `version`, `flush_all`, ...: one line.
    Line,
    /// `stats`: `STAT` lines up to `END`.
    Stats,
}

/// One reply. Borrows the receive buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// RESP simple string (`+OK`), or a memcached status line (`STORED`,
    /// `DELETED`, `NOT_STORED`, `VERSION 1.6`, `OK`, ...).
    Status(&'a [u8]),
    /// RESP bulk string, or the data of a memcached `VALUE`.
    Value(&'a [u8]),
    /// RESP nil bulk/array/null, memcached `END` without a value, or
    /// memcached `NOT_FOUND`.
    Nil,
    /// RESP integer.
    Int(i64),
    /// RESP array (its elements are skipped; this is their count).
    Array(usize),
    /// RESP error (`-ERR ...`, `-OOM ...`) or a memcached `ERROR`,
    /// `CLIENT_ERROR ...`, `SERVER_ERROR ...` line.
    Error(&'a [u8]),
    /// memcached `stats`: the `STAT ...` lines, without the final `END`.
    Stats(&'a [u8]),
}

impl Reply<'_> {
    /// A storage command succeeded (`+OK`, `STORED`).
    pub fn is_stored(&self) -> bool {
        matches!(self, Reply::Status(s) if *s == b"OK" || *s == b"STORED")
    }

    /// A delete removed a key (`:1`, `DELETED`).
    pub fn is_deleted(&self) -> bool {
        matches!(self, Reply::Int(n) if *n > 0) || matches!(self, Reply::Status(b"DELETED"))
    }

    /// Short printable form for error messages.
    pub fn describe(&self) -> String {
        let show = |b: &[u8]| {
            let s = String::from_utf8_lossy(&b[..b.len().min(120)]).into_owned();
            if b.len() > 120 {
                s + "..."
            } else {
                s
            }
        };
        match self {
            Reply::Status(s) => format!("status {:?}", show(s)),
            Reply::Value(v) => format!("value of {} bytes", v.len()),
            Reply::Nil => "nil".into(),
            Reply::Int(n) => format!("integer {n}"),
            Reply::Array(n) => format!("array of {n}"),
            Reply::Error(e) => format!("error {:?}", show(e)),
            Reply::Stats(s) => format!("stats ({} bytes)", s.len()),
        }
    }
}

/// Largest bulk string or value the parser accepts (a garbled length
/// would otherwise make the client buffer gigabytes).
pub const MAX_VALUE: usize = 512 << 20;

// ---------------------------------------------------------------------------
// Encoding

/// Append the decimal form of `n`.
#[inline]
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut d = [0u8; 20];
    let mut i = d.len();
    loop {
        i -= 1;
        d[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&d[i..]);
}

/// `<length>\r\n<data>\r\n`: the tail of a RESP bulk string and of a
/// memcached `set`.
#[inline]
fn push_sized(out: &mut Vec<u8>, b: &[u8]) {
    push_decimal(out, b.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

#[inline]
fn push_bulk(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'$');
    push_sized(out, b);
}

/// A command of one key: `resp` (the RESP array header and the command's
/// bulk string) or the memcached `word` (with its space), then the key.
#[inline]
fn enc_key_cmd(p: Proto, out: &mut Vec<u8>, resp: &[u8], word: &[u8], key: &[u8]) {
    match p {
        Proto::Resp => {
            out.extend_from_slice(resp);
            push_bulk(out, key);
        }
        Proto::Memcached => {
            out.extend_from_slice(word);
            out.extend_from_slice(key);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// `GET key`.
#[inline]
pub fn enc_get(p: Proto, out: &mut Vec<u8>, key: &[u8]) {
    enc_key_cmd(p, out, b"*2\r\n$3\r\nGET\r\n", b"get ", key);
}

/// `SET key value` (no expiry, flags 0).
#[inline]
pub fn enc_set(p: Proto, out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    match p {
        Proto::Resp => {
            out.extend_from_slice(b"*3\r\n$3\r\nSET\r\n");
            push_bulk(out, key);
            push_bulk(out, value);
        }
        Proto::Memcached => {
            out.extend_from_slice(b"set ");
            out.extend_from_slice(key);
            out.extend_from_slice(b" 0 0 ");
            push_sized(out, value);
        }
    }
}

/// `SET key value EX ttl` / `set key 0 ttl len`: a write with a time to
/// live in seconds (0 = none).
pub fn enc_set_ttl(p: Proto, out: &mut Vec<u8>, key: &[u8], value: &[u8], ttl_secs: u32) {
    if ttl_secs == 0 {
        return enc_set(p, out, key, value);
    }
    match p {
        Proto::Resp => {
            out.extend_from_slice(b"*5\r\n$3\r\nSET\r\n");
            push_bulk(out, key);
            push_bulk(out, value);
            out.extend_from_slice(b"$2\r\nEX\r\n");
            let mut num = Vec::with_capacity(10);
            push_decimal(&mut num, ttl_secs as u64);
            push_bulk(out, &num);
        }
        Proto::Memcached => {
            out.extend_from_slice(b"set ");
            out.extend_from_slice(key);
            out.extend_from_slice(b" 0 ");
            push_decimal(out, ttl_secs as u64);
            out.push(b' ');
            push_sized(out, value);
        }
    }
}

/// `DEL key` / `delete key`.
#[inline]
pub fn enc_del(p: Proto, out: &mut Vec<u8>, key: &[u8]) {
    enc_key_cmd(p, out, b"*2\r\n$3\r\nDEL\r\n", b"delete ", key);
}

/// Any command: a RESP array of bulk strings, or the words joined by
/// spaces on one memcached line.
pub fn enc_cmd(p: Proto, out: &mut Vec<u8>, args: &[&[u8]]) {
    match p {
        Proto::Resp => {
            out.push(b'*');
            push_decimal(out, args.len() as u64);
            out.extend_from_slice(b"\r\n");
            for a in args {
                push_bulk(out, a);
            }
        }
        Proto::Memcached => {
            for (i, a) in args.iter().enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                out.extend_from_slice(a);
            }
            out.extend_from_slice(b"\r\n");
        }
    }
}

// ---------------------------------------------------------------------------
// Parsing

/// Position of the `\r\n` ending the line that starts at `from`.
#[inline]
fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < buf.len() {
        let j = i + buf[i..].iter().position(|&c| c == b'\n')?;
        if j > from && buf[j - 1] == b'\r' {
            return Some(j - 1);
        }
        i = j + 1;
    }
    None
}

fn parse_int(b: &[u8]) -> Result<i64> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| format!("bad integer {:?}", String::from_utf8_lossy(b)).into())
}

fn bad(what: &str, line: &[u8]) -> BenchError {
    let n = line.len().min(80);
    BenchError::Run(format!(
        "unexpected {what} reply {:?}",
        String::from_utf8_lossy(&line[..n])
    ))
}

/// One reply from the start of `buf`: `Ok(Some((reply, bytes used)))`,
/// `Ok(None)` if `buf` holds only part of it, `Err` if it is not a reply.
pub fn parse(p: Proto, expect: Expect, buf: &[u8]) -> Result<Option<(Reply<'_>, usize)>> {
    match p {
        Proto::Resp => parse_resp(buf),
        Proto::Memcached => parse_mc(expect, buf),
    }
}

/// One RESP2 value (plus RESP3's `_` null, which a RESP2 server never sends).
pub fn parse_resp(buf: &[u8]) -> Result<Option<(Reply<'_>, usize)>> {
    let Some(e) = line_end(buf, 0) else {
        return Ok(None);
    };
    if e == 0 {
        return Err("empty RESP line".into());
    }
    let body = &buf[1..e];
    let next = e + 2;
    let r = match buf[0] {
        b'+' => Reply::Status(body),
        b'-' => Reply::Error(body),
        b':' => Reply::Int(parse_int(body)?),
        b'_' => Reply::Nil,
        b'$' => {
            let n = parse_int(body)?;
            if n < 0 {
                return Ok(Some((Reply::Nil, next)));
            }
            let n = n as usize;
            if n > MAX_VALUE {
                return Err(format!("bulk string of {n} bytes").into());
            }
            if buf.len() < next + n + 2 {
                return Ok(None);
            }
            if &buf[next + n..next + n + 2] != b"\r\n" {
                return Err("bulk string not followed by CRLF".into());
            }
            return Ok(Some((Reply::Value(&buf[next..next + n]), next + n + 2)));
        }
        b'*' => {
            let n = parse_int(body)?;
            if n < 0 {
                return Ok(Some((Reply::Nil, next)));
            }
            let mut at = next;
            for _ in 0..n {
                match parse_resp(&buf[at..])? {
                    Some((_, used)) => at += used,
                    None => return Ok(None),
                }
            }
            return Ok(Some((Reply::Array(n as usize), at)));
        }
        _ => return Err(bad("RESP", &buf[..e])),
    };
    Ok(Some((r, next)))
}

/// One memcached text-protocol reply to a request of kind `expect`.
pub fn parse_mc(expect: Expect, buf: &[u8]) -> Result<Option<(Reply<'_>, usize)>> {
    let Some(e) = line_end(buf, 0) else {
        return Ok(None);
    };
    let line = &buf[..e];
    let next = e + 2;
    if line == b"ERROR" || line.starts_with(b"CLIENT_ERROR") || line.starts_with(b"SERVER_ERROR") {
        return Ok(Some((Reply::Error(line), next)));
    }
    match expect {
        Expect::Line => {
            if line == b"NOT_FOUND" {
                Ok(Some((Reply::Nil, next)))
            } else {
                Ok(Some((Reply::Status(line), next)))
            }
        }
        Expect::Get => {
            if line == b"END" {
                return Ok(Some((Reply::Nil, next)));
            }
            // VALUE <key> <flags> <bytes> [<cas>]
            let mut words = line.split(|&c| c == b' ');
            if words.next() != Some(b"VALUE") {
                return Err(bad("memcached get", line));
            }
            let n = words
                .nth(2)
                .ok_or_else(|| bad("memcached get", line))
                .and_then(parse_int)?;
            if n < 0 || n as usize > MAX_VALUE {
                return Err(bad("memcached get", line));
            }
            let n = n as usize;
            if buf.len() < next + n + 2 + 5 {
                return Ok(None);
            }
            if &buf[next + n..next + n + 2] != b"\r\n" {
                return Err("memcached value not followed by CRLF".into());
            }
            if &buf[next + n + 2..next + n + 7] != b"END\r\n" {
                // Only single-key gets are sent.
                return Err(bad("memcached get (no END)", &buf[next + n + 2..]));
            }
            Ok(Some((Reply::Value(&buf[next..next + n]), next + n + 7)))
        }
        Expect::Stats => {
            // STAT lines until a line that is exactly END.
            let mut at = 0;
            loop {
                let Some(le) = line_end(buf, at) else {
                    return Ok(None);
                };
                if &buf[at..le] == b"END" {
                    return Ok(Some((Reply::Stats(&buf[..at]), le + 2)));
                }
                if !buf[at..le].starts_with(b"STAT ") {
                    return Err(bad("memcached stats", &buf[at..le]));
                }
                at = le + 2;
            }
        }
    }
}

/// `field` of a Redis INFO text (`field:value` lines) or a memcached
/// stats block (`STAT field value` lines), as an integer.
pub fn stat_field(text: &[u8], field: &str) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    for line in text.lines() {
        let line = line.trim_end();
        let (k, v) = if let Some(rest) = line.strip_prefix("STAT ") {
            rest.split_once(' ')?
        } else if let Some(kv) = line.split_once(':') {
            kv
        } else {
            continue;
        };
        if k == field {
            return v.trim().parse().ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(p: Proto, x: Expect, b: &[u8]) -> (Reply<'_>, usize) {
        parse(p, x, b).unwrap().unwrap()
    }

    #[test]
    fn resp_encodes_like_redis_cli() {
        let mut out = Vec::new();
        enc_set(Proto::Resp, &mut out, b"k1", b"hello");
        enc_get(Proto::Resp, &mut out, b"k1");
        enc_del(Proto::Resp, &mut out, b"k1");
        enc_cmd(Proto::Resp, &mut out, &[b"DBSIZE"]);
        assert_eq!(
            out,
            b"*3\r\n$3\r\nSET\r\n$2\r\nk1\r\n$5\r\nhello\r\n\
              *2\r\n$3\r\nGET\r\n$2\r\nk1\r\n\
              *2\r\n$3\r\nDEL\r\n$2\r\nk1\r\n\
              *1\r\n$6\r\nDBSIZE\r\n"
        );
    }

    #[test]
    fn memcached_encodes_text_lines() {
        let mut out = Vec::new();
        enc_set(Proto::Memcached, &mut out, b"k1", b"hello");
        enc_get(Proto::Memcached, &mut out, b"k1");
        enc_del(Proto::Memcached, &mut out, b"k1");
        enc_cmd(Proto::Memcached, &mut out, &[b"stats", b"items"]);
        assert_eq!(
            out,
            b"set k1 0 0 5\r\nhello\r\nget k1\r\ndelete k1\r\nstats items\r\n"
        );
        let mut d = Vec::new();
        push_decimal(&mut d, 0);
        push_decimal(&mut d, 18_446_744_073_709_551_615);
        assert_eq!(d, b"018446744073709551615");
    }

    #[test]
    fn resp_replies_parse_incrementally() {
        let p = Proto::Resp;
        let x = Expect::Line;
        assert_eq!(one(p, x, b"+OK\r\n"), (Reply::Status(b"OK"), 5));
        assert!(one(p, x, b"+OK\r\n").0.is_stored());
        assert_eq!(one(p, x, b":1\r\n:0\r\n"), (Reply::Int(1), 4));
        assert!(one(p, x, b":1\r\n").0.is_deleted());
        assert_eq!(one(p, x, b"$-1\r\n"), (Reply::Nil, 5));
        assert_eq!(one(p, x, b"_\r\n"), (Reply::Nil, 3));
        assert_eq!(
            one(p, x, b"-OOM command not allowed\r\n").0,
            Reply::Error(b"OOM command not allowed")
        );
        let full = b"$5\r\nhe\r\no\r\n+PONG\r\n";
        // Every strict prefix of the first reply is incomplete.
        for n in 0..11 {
            assert_eq!(parse(p, x, &full[..n]).unwrap(), None, "prefix {n}");
        }
        assert_eq!(one(p, x, full), (Reply::Value(b"he\r\no"), 11));
        let arr = b"*3\r\n$1\r\na\r\n$-1\r\n*1\r\n:7\r\n";
        assert_eq!(parse(p, x, &arr[..arr.len() - 1]).unwrap(), None);
        assert_eq!(one(p, x, arr), (Reply::Array(3), arr.len()));
        assert!(parse(p, x, b"?what\r\n").is_err());
        assert!(parse(p, x, b"$5\r\nhelloXX").is_err());
        assert!(parse(p, x, b"$999999999999\r\n").is_err());
    }

    #[test]
    fn memcached_replies_parse_by_request_kind() {
        let p = Proto::Memcached;
        let get = b"VALUE k1 0 5\r\nhello\r\nEND\r\n";
        for n in 0..get.len() {
            assert_eq!(
                parse(p, Expect::Get, &get[..n]).unwrap(),
                None,
                "prefix {n}"
            );
        }
        assert_eq!(
            one(p, Expect::Get, get),
            (Reply::Value(b"hello"), get.len())
        );
        // With a CAS column (gets) too.
        assert_eq!(
            one(p, Expect::Get, b"VALUE k 3 2 99\r\nhi\r\nEND\r\n").0,
            Reply::Value(b"hi")
        );
        assert_eq!(one(p, Expect::Get, b"END\r\n"), (Reply::Nil, 5));
        assert!(one(p, Expect::Line, b"STORED\r\n").0.is_stored());
        assert!(one(p, Expect::Line, b"DELETED\r\n").0.is_deleted());
        assert_eq!(one(p, Expect::Line, b"NOT_FOUND\r\n").0, Reply::Nil);
        assert_eq!(
            one(
                p,
                Expect::Line,
                b"SERVER_ERROR out of memory storing object\r\n"
            )
            .0,
            Reply::Error(b"SERVER_ERROR out of memory storing object")
        );
        assert_eq!(one(p, Expect::Get, b"ERROR\r\n").0, Reply::Error(b"ERROR"));
        let stats = b"STAT pid 1\r\nSTAT curr_items 42\r\nEND\r\n";
        assert_eq!(parse(p, Expect::Stats, &stats[..20]).unwrap(), None);
        let (r, used) = one(p, Expect::Stats, stats);
        assert_eq!(used, stats.len());
        let Reply::Stats(text) = r else {
            panic!("{r:?}")
        };
        assert_eq!(stat_field(text, "curr_items"), Some(42));
        assert_eq!(
            stat_field(b"# Memory\r\nused_memory:1024\r\n", "used_memory"),
            Some(1024)
        );
        assert!(parse(p, Expect::Get, b"VALUES x\r\n").is_err());
    }
}
