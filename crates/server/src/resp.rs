//! The RESP request parser and the reply writer.
//!
//! A client sends either a *multibulk* request (`*<n>\r\n` followed by `n`
//! bulk strings `$<len>\r\n<bytes>\r\n`) or an *inline* request, one line of
//! space-separated words with Redis's quoting rules (`redis-benchmark` and
//! `telnet` send those). The parser works on the connection's input buffer
//! and never copies an argument: a parsed request is a list of byte ranges
//! into the buffer, and the buffer is only compacted after the request ran.
//!
//! Requests arrive in arbitrary pieces, so the parser is *resumable*: when a
//! multibulk request is incomplete it keeps the ranges found so far and the
//! position where it stopped, and the next call continues from there. A
//! request of a million arguments fed 64 KiB at a time therefore costs
//! linear, not quadratic, time. For a bulk whose bytes have not all arrived
//! it also knows how many bytes it needs, so the connection does not call it
//! again until they are there.
//!
//! ```text
//!   buffer: *3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nva|      (read stops here)
//!           ^start            ^args[0]  ^args[1]  ^pos, need = 5+2 bytes
//! ```
//!
//! Every length is checked against the limits before anything is reserved
//! (`max_multibulk`, `max_bulk`, `max_inline`); a violation is a
//! [`ProtoError`], which the connection reports as `-ERR Protocol error: ...`
//! before closing. The parser never panics on any input: every index is
//! bounds-checked and every number is parsed with overflow checks (see the
//! proptest in `tests/parsers.rs` and the fuzz target in `fuzz/`).
//!
//! [`Reply`] writes replies straight into the connection's output buffer in
//! the protocol version the client chose with HELLO: maps, sets, doubles
//! and nulls have RESP3 forms and fall back to arrays, bulk strings and
//! `$-1` in RESP2.

use std::fmt;
use std::ops::Range;

/// Limits the parser enforces.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most arguments in one multibulk request.
    pub max_multibulk: usize,
    /// Longest bulk string.
    pub max_bulk: usize,
    /// Longest inline request line.
    pub max_inline: usize,
    /// The client has not authenticated: a length over the limits is
    /// reported as redis-server reports it then (`unauthenticated ...`).
    pub unauthenticated: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_multibulk: 1024 * 1024,
            max_bulk: 512 << 20,
            max_inline: 64 << 10,
            unauthenticated: false,
        }
    }
}

/// A protocol violation; the connection replies with it and closes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtoError {
    /// Bad `*<n>` header.
    InvalidMultibulkLength,
    /// Bad `$<len>` header.
    InvalidBulkLength,
    /// Something other than `$` where a bulk was expected.
    ExpectedDollar(u8),
    /// Inline line over the limit.
    TooBigInline,
    /// Multibulk header line over the limit.
    TooBigMultibulk,
    /// Bulk header line over the limit.
    TooBigBulkCount,
    /// Inline quoting error.
    UnbalancedQuotes,
    /// A bulk not followed by CRLF.
    MissingCrlf,
    /// Too many arguments before AUTH.
    UnauthenticatedMultibulkLength,
    /// A too long argument before AUTH.
    UnauthenticatedBulkLength,
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::InvalidMultibulkLength => write!(f, "invalid multibulk length"),
            ProtoError::InvalidBulkLength => write!(f, "invalid bulk length"),
            ProtoError::ExpectedDollar(c) => {
                write!(f, "expected '$', got '{}'", char::from(*c).escape_default())
            }
            ProtoError::TooBigInline => write!(f, "too big inline request"),
            ProtoError::TooBigMultibulk => write!(f, "too big mbulk count string"),
            ProtoError::TooBigBulkCount => write!(f, "too big bulk count string"),
            ProtoError::UnbalancedQuotes => write!(f, "unbalanced quotes in request"),
            ProtoError::MissingCrlf => write!(f, "expected CRLF after bulk"),
            ProtoError::UnauthenticatedMultibulkLength => {
                write!(f, "unauthenticated multibulk length")
            }
            ProtoError::UnauthenticatedBulkLength => write!(f, "unauthenticated bulk length"),
        }
    }
}

/// One parsed request: argument ranges into the buffer, and how many bytes
/// of the buffer it used. Inline arguments with escapes cannot be ranges,
/// so those come as owned bytes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Bytes consumed from the start of the buffer.
    pub consumed: usize,
    /// Arguments.
    pub args: Vec<Arg>,
}

/// One argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg {
    /// Bytes `range` of the buffer.
    Range(Range<usize>),
    /// Bytes produced by unquoting an inline argument.
    Owned(Vec<u8>),
}

impl Request {
    /// The arguments as slices of `buf` (the buffer the request was parsed from).
    pub fn slices<'a>(&'a self, buf: &'a [u8]) -> Vec<&'a [u8]> {
        self.args
            .iter()
            .map(|a| match a {
                Arg::Range(r) => &buf[r.clone()],
                Arg::Owned(v) => &v[..],
            })
            .collect()
    }

    /// Run `f` on the arguments as slices of `buf`, without allocating
    /// for requests of up to 8 arguments (GET, SET and most others).
    #[inline]
    pub fn with_slices<R>(&self, buf: &[u8], f: impl FnOnce(&[&[u8]]) -> R) -> R {
        const N: usize = 8;
        if self.args.len() > N {
            return f(&self.slices(buf));
        }
        let mut a: [&[u8]; N] = [&[]; N];
        for (d, s) in a.iter_mut().zip(&self.args) {
            *d = match s {
                Arg::Range(r) => &buf[r.clone()],
                Arg::Owned(v) => &v[..],
            };
        }
        f(&a[..self.args.len()])
    }
}

/// Longest `*<n>` or `$<len>` header line accepted (Redis's 64 KiB inline
/// limit applies to those too; real ones are a few bytes).
const MAX_HEADER_LINE: usize = 1024;

/// Outcome of one parse step.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A complete request.
    Request(Request),
    /// Need more bytes: at least this many in the buffer in total.
    Incomplete(usize),
}

/// The resumable parser (one per connection).
#[derive(Debug, Default)]
pub struct Parser {
    partial: Option<Partial>,
    /// An emptied argument vector handed back by [`Parser::recycle`], reused
    /// for the next multibulk request so that parsing does not allocate.
    spare: Vec<Arg>,
}

#[derive(Debug)]
struct Partial {
    remaining: usize,
    pos: usize,
    args: Vec<Arg>,
}

/// Position of the first `\n` at or after `from`.
fn find_lf(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .iter()
        .position(|&b| b == b'\n')
        .map(|p| p + from)
}

/// The common header `DIGITS\r\n` at `at` in one pass: its value and
/// where the line ends, or `None` for anything else (a sign, a leading
/// zero, more than 18 digits, a line not complete in `buf`), which the
/// general path ([`find_lf`], [`parse_len`]) then parses or rejects.
#[inline]
fn plain_len(buf: &[u8], at: usize) -> Option<(i64, usize)> {
    let digits = buf.get(at..)?;
    let mut v: i64 = 0;
    let mut i = 0;
    while i < digits.len() && i < 18 && digits[i].is_ascii_digit() {
        v = v * 10 + i64::from(digits[i] - b'0');
        i += 1;
    }
    let plain = i > 0 && (digits[0] != b'0' || i == 1);
    (plain && digits.get(i..i + 2) == Some(b"\r\n")).then_some((v, at + i + 2))
}

/// Parse a decimal integer from a header line (after the type byte).
fn parse_len(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    // As redis-server's string2ll: no leading zero (`$04`), no `-0`.
    if digits[0] == b'0' && (digits.len() > 1 || neg) {
        return None;
    }
    let mut v: i64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i64::from(c - b'0');
    }
    Some(if neg { -v } else { v })
}

impl Parser {
    /// A fresh parser.
    pub fn new() -> Parser {
        Parser::default()
    }

    /// Hand back a request's argument vector once the request has run; the
    /// next multibulk request reuses its allocation.
    #[inline]
    pub fn recycle(&mut self, mut args: Vec<Arg>) {
        if args.capacity() <= 1024 {
            args.clear();
            self.spare = args;
        }
    }

    /// Forget any partial request (the buffer was reset).
    pub fn reset(&mut self) {
        self.partial = None;
    }

    /// Parse the next request from `buf`, which starts at the first byte
    /// not yet consumed. After `Request(r)` the caller must drop
    /// `r.consumed` bytes from the front of its buffer before the next call;
    /// after `Incomplete` it must call again with the same bytes plus more.
    pub fn parse(&mut self, buf: &[u8], limits: &Limits) -> Result<Parsed, ProtoError> {
        if let Some(p) = self.partial.take() {
            return self.multibulk_from(buf, limits, p);
        }
        let Some(&first) = buf.first() else {
            return Ok(Parsed::Incomplete(1));
        };
        if first != b'*' {
            return parse_inline(buf, limits);
        }
        let (n, after) = match plain_len(buf, 1) {
            Some(x) => x,
            None => {
                let Some(lf) = find_lf(buf, 0) else {
                    if buf.len() > MAX_HEADER_LINE {
                        return Err(ProtoError::TooBigMultibulk);
                    }
                    return Ok(Parsed::Incomplete(buf.len() + 1));
                };
                if lf > MAX_HEADER_LINE {
                    return Err(ProtoError::TooBigMultibulk);
                }
                if lf < 2 || buf[lf - 1] != b'\r' {
                    return Err(ProtoError::InvalidMultibulkLength);
                }
                let n = parse_len(&buf[1..lf - 1]).ok_or(ProtoError::InvalidMultibulkLength)?;
                (n, lf + 1)
            }
        };
        if n > limits.max_multibulk as i64 {
            return Err(if limits.unauthenticated {
                ProtoError::UnauthenticatedMultibulkLength
            } else {
                ProtoError::InvalidMultibulkLength
            });
        }
        if n <= 0 {
            // `*0` and `*-1` are empty requests; Redis skips them.
            return Ok(Parsed::Request(Request {
                consumed: after,
                args: Vec::new(),
            }));
        }
        let mut args = std::mem::take(&mut self.spare);
        args.reserve((n as usize).min(1024));
        let p = Partial {
            remaining: n as usize,
            pos: after,
            args,
        };
        self.multibulk_from(buf, limits, p)
    }

    fn multibulk_from(
        &mut self,
        buf: &[u8],
        limits: &Limits,
        mut p: Partial,
    ) -> Result<Parsed, ProtoError> {
        while p.remaining > 0 {
            let Some(&c) = buf.get(p.pos) else {
                let need = p.pos + 1;
                self.partial = Some(p);
                return Ok(Parsed::Incomplete(need));
            };
            if c != b'$' {
                return Err(ProtoError::ExpectedDollar(c));
            }
            let (len, start) = match plain_len(buf, p.pos + 1) {
                Some(x) => x,
                None => {
                    let Some(lf) = find_lf(buf, p.pos) else {
                        if buf.len() - p.pos > MAX_HEADER_LINE {
                            return Err(ProtoError::TooBigBulkCount);
                        }
                        let need = buf.len() + 1;
                        self.partial = Some(p);
                        return Ok(Parsed::Incomplete(need));
                    };
                    if lf - p.pos > MAX_HEADER_LINE {
                        return Err(ProtoError::TooBigBulkCount);
                    }
                    if lf < p.pos + 2 || buf[lf - 1] != b'\r' {
                        return Err(ProtoError::InvalidBulkLength);
                    }
                    let len =
                        parse_len(&buf[p.pos + 1..lf - 1]).ok_or(ProtoError::InvalidBulkLength)?;
                    (len, lf + 1)
                }
            };
            if len < 0 || len as u64 > limits.max_bulk as u64 {
                return Err(if limits.unauthenticated && len >= 0 {
                    ProtoError::UnauthenticatedBulkLength
                } else {
                    ProtoError::InvalidBulkLength
                });
            }
            let end = start + len as usize;
            if buf.len() < end + 2 {
                let need = end + 2;
                self.partial = Some(p);
                return Ok(Parsed::Incomplete(need));
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(ProtoError::MissingCrlf);
            }
            p.args.push(Arg::Range(start..end));
            p.pos = end + 2;
            p.remaining -= 1;
        }
        Ok(Parsed::Request(Request {
            consumed: p.pos,
            args: p.args,
        }))
    }
}

/// One inline request line.
fn parse_inline(buf: &[u8], limits: &Limits) -> Result<Parsed, ProtoError> {
    let Some(lf) = find_lf(buf, 0) else {
        if buf.len() > limits.max_inline {
            return Err(ProtoError::TooBigInline);
        }
        return Ok(Parsed::Incomplete(buf.len() + 1));
    };
    if lf > limits.max_inline {
        return Err(ProtoError::TooBigInline);
    }
    let end = if lf > 0 && buf[lf - 1] == b'\r' {
        lf - 1
    } else {
        lf
    };
    let args = split_args(&buf[..end])?;
    Ok(Parsed::Request(Request {
        consumed: lf + 1,
        args,
    }))
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Split an inline line like Redis's `sdssplitargs`: words separated by
/// blanks; `"..."` with `\n \r \t \b \a \\ \" \xHH` escapes; `'...'` with
/// `\'`; a closing quote must be followed by a blank or the end.
pub fn split_args(line: &[u8]) -> Result<Vec<Arg>, ProtoError> {
    let mut args = Vec::new();
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= n {
            return Ok(args);
        }
        let start = i;
        if line[i] != b'"' && line[i] != b'\'' {
            // Plain word: no copy needed.
            while i < n && !line[i].is_ascii_whitespace() && line[i] != b'"' && line[i] != b'\'' {
                i += 1;
            }
            if i < n && (line[i] == b'"' || line[i] == b'\'') {
                // A quote inside a word: Redis treats it as a literal
                // character; take the rest of the word literally.
                while i < n && !line[i].is_ascii_whitespace() {
                    i += 1;
                }
            }
            args.push(Arg::Range(start..i));
            continue;
        }
        let quote = line[i];
        i += 1;
        let mut cur = Vec::new();
        loop {
            if i >= n {
                return Err(ProtoError::UnbalancedQuotes);
            }
            let c = line[i];
            if quote == b'"' && c == b'\\' && i + 3 < n && line[i + 1] == b'x' {
                if let (Some(h), Some(l)) = (hex_val(line[i + 2]), hex_val(line[i + 3])) {
                    cur.push(h * 16 + l);
                    i += 4;
                    continue;
                }
            }
            if quote == b'"' && c == b'\\' && i + 1 < n {
                cur.push(match line[i + 1] {
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'b' => 8,
                    b'a' => 7,
                    other => other,
                });
                i += 2;
                continue;
            }
            if quote == b'\'' && c == b'\\' && i + 1 < n && line[i + 1] == b'\'' {
                cur.push(b'\'');
                i += 2;
                continue;
            }
            if c == quote {
                i += 1;
                if i < n && !line[i].is_ascii_whitespace() {
                    return Err(ProtoError::UnbalancedQuotes);
                }
                break;
            }
            cur.push(c);
            i += 1;
        }
        args.push(Arg::Owned(cur));
    }
}

/// The RESP protocol version of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// RESP2 (the default).
    Resp2,
    /// RESP3 (after `HELLO 3`).
    Resp3,
}

/// A reply writer over the connection's output buffer.
pub struct Reply<'a> {
    /// The output buffer.
    pub out: &'a mut Vec<u8>,
    /// Protocol version.
    pub proto: Proto,
}

fn push_int(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

/// Append `u` in decimal (no formatting machinery: replies write several
/// numbers per request).
pub fn push_u64(out: &mut Vec<u8>, mut u: u64) {
    let mut b = [0u8; 20];
    let mut i = b.len();
    loop {
        i -= 1;
        b[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    out.extend_from_slice(&b[i..]);
}

/// Format a float the way Redis does for INCRBYFLOAT and doubles: the
/// shortest representation that round-trips, no exponent for ordinary
/// magnitudes, `inf`/`-inf`.
pub fn format_double(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == v.trunc() && v.abs() < 1e17 {
        return format!("{}", v as i64);
    }
    format!("{v}")
}

impl Reply<'_> {
    /// `+s`.
    pub fn simple(&mut self, s: &str) {
        self.out.push(b'+');
        self.out.extend_from_slice(s.as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    /// `+OK`.
    pub fn ok(&mut self) {
        self.out.extend_from_slice(b"+OK\r\n");
    }

    /// `-msg` (msg includes the code, e.g. `ERR syntax error`). CR and LF
    /// in the message become spaces so the reply stays one line.
    pub fn error(&mut self, msg: &str) {
        self.out.push(b'-');
        self.out.extend(
            msg.bytes()
                .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
        self.out.extend_from_slice(b"\r\n");
    }

    /// `:n`.
    pub fn int(&mut self, v: i64) {
        self.out.push(b':');
        push_int(self.out, v);
        self.out.extend_from_slice(b"\r\n");
    }

    /// `$len\r\nbytes\r\n`.
    pub fn bulk(&mut self, b: &[u8]) {
        // One capacity check for the whole reply (header is at most 23 bytes).
        self.out.reserve(b.len() + 25);
        self.out.push(b'$');
        push_int(self.out, b.len() as i64);
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(b);
        self.out.extend_from_slice(b"\r\n");
    }

    /// Bulk or null.
    pub fn opt_bulk(&mut self, b: Option<&[u8]>) {
        match b {
            Some(b) => self.bulk(b),
            None => self.null(),
        }
    }

    /// A verbatim text reply (INFO, CLIENT LIST): bulk in RESP2, `=` in RESP3.
    pub fn verbatim(&mut self, text: &str) {
        if self.proto == Proto::Resp3 {
            self.out.push(b'=');
            push_int(self.out, text.len() as i64 + 4);
            self.out.extend_from_slice(b"\r\ntxt:");
            self.out.extend_from_slice(text.as_bytes());
            self.out.extend_from_slice(b"\r\n");
        } else {
            self.bulk(text.as_bytes());
        }
    }

    /// Null: `$-1` (RESP2) or `_` (RESP3).
    pub fn null(&mut self) {
        if self.proto == Proto::Resp3 {
            self.out.extend_from_slice(b"_\r\n");
        } else {
            self.out.extend_from_slice(b"$-1\r\n");
        }
    }

    /// Null array: `*-1` (RESP2) or `_` (RESP3).
    pub fn null_array(&mut self) {
        if self.proto == Proto::Resp3 {
            self.out.extend_from_slice(b"_\r\n");
        } else {
            self.out.extend_from_slice(b"*-1\r\n");
        }
    }

    fn header(&mut self, c: u8, n: usize) {
        self.out.push(c);
        push_int(self.out, n as i64);
        self.out.extend_from_slice(b"\r\n");
    }

    /// Array header.
    pub fn array(&mut self, n: usize) {
        self.header(b'*', n);
    }

    /// Push header (RESP3 `>`; RESP2: array), for pub/sub messages.
    pub fn push(&mut self, n: usize) {
        if self.proto == Proto::Resp3 {
            self.header(b'>', n);
        } else {
            self.header(b'*', n);
        }
    }

    /// Map header of `n` pairs (RESP2: array of 2n).
    pub fn map(&mut self, n: usize) {
        if self.proto == Proto::Resp3 {
            self.header(b'%', n);
        } else {
            self.header(b'*', 2 * n);
        }
    }

    /// Set header (RESP2: array).
    pub fn set(&mut self, n: usize) {
        if self.proto == Proto::Resp3 {
            self.header(b'~', n);
        } else {
            self.header(b'*', n);
        }
    }

    /// A double (RESP2: bulk string).
    pub fn double(&mut self, v: f64) {
        let s = format_double(v);
        if self.proto == Proto::Resp3 {
            self.out.push(b',');
            self.out.extend_from_slice(s.as_bytes());
            self.out.extend_from_slice(b"\r\n");
        } else {
            self.bulk(s.as_bytes());
        }
    }

    /// Array of bulk strings.
    pub fn bulks<I, B>(&mut self, items: I)
    where
        I: ExactSizeIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        self.array(items.len());
        for b in items {
            self.bulk(b.as_ref());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> Vec<Vec<Vec<u8>>> {
        let mut p = Parser::new();
        let mut off = 0;
        let mut out = Vec::new();
        while let Ok(Parsed::Request(r)) = p.parse(&input[off..], &Limits::default()) {
            out.push(r.slices(&input[off..]).iter().map(|s| s.to_vec()).collect());
            off += r.consumed;
        }
        out
    }

    #[test]
    fn plain_len_agrees_with_the_general_path() {
        // Where the one-pass header parse answers, it answers as
        // `find_lf` + `parse_len` would.
        for h in [
            &b"3\r\n"[..],
            b"0\r\n",
            b"10\r\n",
            b"512\r\nabc",
            b"999999999999999999\r\n",
            b"9999999999999999999\r\n",
            b"03\r\n",
            b"-1\r\n",
            b"+3\r\n",
            b"3\r",
            b"3\n",
            b"3",
            b"",
            b"3x\r\n",
            b"00\r\n",
        ] {
            let general = find_lf(h, 0)
                .filter(|&lf| lf >= 1 && h[lf - 1] == b'\r')
                .and_then(|lf| parse_len(&h[..lf - 1]).map(|v| (v, lf + 1)));
            if let Some(fast) = plain_len(h, 0) {
                assert_eq!(Some(fast), general, "{:?}", String::from_utf8_lossy(h));
            }
        }
        assert_eq!(plain_len(b"3\r\n", 0), Some((3, 3)));
        assert_eq!(plain_len(b"$16\r\n", 1), Some((16, 5)));
        assert_eq!(plain_len(b"03\r\n", 0), None);
        assert_eq!(plain_len(b"3\r", 0), None);
    }

    #[test]
    fn multibulk_and_inline() {
        let r = parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\nset a \"b c\\x41\"\r\n");
        assert_eq!(r[0], vec![b"GET".to_vec(), b"k".to_vec()]);
        assert_eq!(r[1], vec![b"PING".to_vec()]);
        assert_eq!(r[2], vec![b"set".to_vec(), b"a".to_vec(), b"b cA".to_vec()]);
    }

    #[test]
    fn resumes() {
        let input = b"*2\r\n$3\r\nGET\r\n$5\r\nhello\r\n";
        let mut p = Parser::new();
        for cut in 0..input.len() {
            match p.parse(&input[..cut], &Limits::default()).unwrap() {
                Parsed::Incomplete(n) => assert!(n > cut),
                Parsed::Request(_) => panic!("complete at {cut}"),
            }
        }
        match p.parse(input, &Limits::default()).unwrap() {
            Parsed::Request(r) => assert_eq!(r.consumed, input.len()),
            Parsed::Incomplete(_) => panic!(),
        }
    }

    #[test]
    fn errors() {
        let mut p = Parser::new();
        let l = Limits::default();
        assert_eq!(
            p.parse(b"*x\r\n", &l),
            Err(ProtoError::InvalidMultibulkLength)
        );
        assert_eq!(
            Parser::new().parse(b"*1\r\n:1\r\n", &l),
            Err(ProtoError::ExpectedDollar(b':'))
        );
        assert_eq!(
            Parser::new().parse(b"*1\r\n$-5\r\n", &l),
            Err(ProtoError::InvalidBulkLength)
        );
        assert_eq!(
            Parser::new().parse(b"set \"a\r\n", &l),
            Err(ProtoError::UnbalancedQuotes)
        );
    }

    #[test]
    fn doubles() {
        assert_eq!(format_double(3.0), "3");
        assert_eq!(format_double(10.5), "10.5");
        assert_eq!(format_double(f64::INFINITY), "inf");
    }
}
