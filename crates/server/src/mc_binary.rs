//! memcached's binary protocol.
//!
//! Every request is a 24-byte header followed by a body of `extras`, `key`
//! and `value` (their lengths are in the header); every response has the
//! same shape with magic 0x81 and a status:
//!
//! ```text
//!   0      1       2..4     4       5        6..8     8..12   12..16  16..24
//!   magic  opcode  keylen   extlen  datatype vbucket/ bodylen opaque  cas
//!   0x80                                     status
//! ```
//!
//! A connection on the memcached port speaks binary when its first byte
//! is 0x80 (memcached decides the same way), text otherwise, for its
//! whole life. The opcodes served are GET/GETQ/GETK/GETKQ, SET/ADD/REPLACE
//! (+Q, with CAS), DELETE(Q) (with CAS), INCREMENT/DECREMENT(Q) (delta,
//! initial value, and the expiration 0xffffffff meaning "do not create"),
//! QUIT(Q), FLUSH(Q), NOOP, VERSION, APPEND/PREPEND(Q), STAT, TOUCH, GAT/GATQ/GATK/GATKQ and SASL (LIST_MECHS, AUTH, STEP). Quiet
//! variants send nothing on success (GETQ: nothing on a miss), so a client
//! pipelines them and ends with NOOP. Any other opcode answers status
//! 0x0081 (unknown command; VERBOSITY too, as memcached 1.6 answers), and a request whose extras/key/value do not
//! fit its opcode answers 0x0004 (invalid arguments); both keep the
//! connection. A header whose magic is not 0x80, or whose key and extras
//! do not fit in the body, closes the connection after an error response:
//! the byte stream cannot be trusted past it. A body over the value limit
//! answers 0x0003 (too large) and its bytes are discarded as they arrive.
//!
//! Authentication: with a memcached authfile (`mc_users`), a binary
//! connection must authenticate with SASL PLAIN (`\0user\0password`)
//! against the same users as the text protocol's auth `set`; before that
//! only the SASL opcodes, VERSION, NOOP and QUIT are served (others answer
//! 0x0020, auth error) and bodies are bounded by `MC_AUTH_MAX_BYTES`. A
//! failed attempt costs the same delay as a failed text authentication.
//! Without an authfile the SASL opcodes are unknown commands, as in a
//! memcached started without `-S`.
//!
//! Execution reuses the text protocol's engine calls (`mc_exec`): the
//! item version is the CAS value, flags and expiry are stored with the
//! item; INCREMENT/DECREMENT read, compute and write back under
//! `IfVersion`, retrying on a race.

use std::sync::atomic::Ordering;

use nibble::{Condition, Error as StoreError, Expiry, PutOptions};

use crate::commands::admin::flush;
use crate::mc_exec::{expiry_of, stats_pairs, MC_VERSION};
use crate::memcache::MAX_KEY;
use crate::state::{Shared, WorkerStats};
use crate::types::{is_collection, is_reserved_flags};

/// Header length in bytes.
pub const HEADER_BYTES: usize = 24;
/// Request magic.
pub const REQ_MAGIC: u8 = 0x80;
/// Response magic.
pub const RES_MAGIC: u8 = 0x81;

const OK: u16 = 0x00;
const NOT_FOUND: u16 = 0x01;
const EXISTS: u16 = 0x02;
const TOO_LARGE: u16 = 0x03;
const EINVAL: u16 = 0x04;
const NOT_STORED: u16 = 0x05;
const NON_NUMERIC: u16 = 0x06;
const AUTH_ERROR: u16 = 0x20;
const UNKNOWN: u16 = 0x81;
const NO_MEMORY: u16 = 0x82;

/// A request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Opcode.
    pub opcode: u8,
    /// Key length.
    pub key_len: usize,
    /// Extras length.
    pub ext_len: usize,
    /// Body length (extras + key + value).
    pub body_len: usize,
    /// Opaque, echoed back.
    pub opaque: u32,
    /// CAS.
    pub cas: u64,
}

/// Outcome of looking at the front of the input.
#[derive(Debug, PartialEq, Eq)]
pub enum BinParsed {
    /// A whole request of this many bytes (header + body) is buffered.
    Request(Header, usize),
    /// Need at least this many bytes.
    Incomplete(usize),
    /// Answered already (in `out`); discard the header and then `skip`
    /// bytes of body.
    Skip(usize),
    /// Answered already; close the connection.
    Fatal,
}

/// Look at the front of `buf`; error responses go to `out`.
pub fn parse(buf: &[u8], max_body: usize, out: &mut Vec<u8>) -> BinParsed {
    if buf.len() < HEADER_BYTES {
        return BinParsed::Incomplete(HEADER_BYTES);
    }
    let u16_at = |i: usize| u16::from_be_bytes([buf[i], buf[i + 1]]);
    let u32_at = |i: usize| u32::from_be_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let mut cas = [0u8; 8];
    cas.copy_from_slice(&buf[16..24]);
    let h = Header {
        opcode: buf[1],
        key_len: usize::from(u16_at(2)),
        ext_len: usize::from(buf[4]),
        body_len: u32_at(8) as usize,
        opaque: u32_at(12),
        cas: u64::from_be_bytes(cas),
    };
    if buf[0] != REQ_MAGIC || h.key_len + h.ext_len > h.body_len {
        respond(out, &h, EINVAL, 0, &[], &[], b"Invalid arguments");
        return BinParsed::Fatal;
    }
    if h.body_len > max_body {
        respond(out, &h, TOO_LARGE, 0, &[], &[], b"Too large.");
        return BinParsed::Skip(h.body_len);
    }
    let total = HEADER_BYTES + h.body_len;
    if buf.len() < total {
        return BinParsed::Incomplete(total);
    }
    BinParsed::Request(h, total)
}

/// Append one response.
fn respond(
    out: &mut Vec<u8>,
    h: &Header,
    status: u16,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    out.push(RES_MAGIC);
    out.push(h.opcode);
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.push(0);
    out.extend_from_slice(&status.to_be_bytes());
    let body = extras.len() + key.len() + value.len();
    out.extend_from_slice(&(body as u32).to_be_bytes());
    out.extend_from_slice(&h.opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

fn status_text(status: u16) -> &'static [u8] {
    match status {
        NOT_FOUND => b"Not found",
        EXISTS => b"Data exists for key.",
        TOO_LARGE => b"Too large.",
        EINVAL => b"Invalid arguments",
        NOT_STORED => b"Not stored.",
        NON_NUMERIC => b"Non-numeric server-side value for incr or decr",
        AUTH_ERROR => b"Auth failure.",
        UNKNOWN => b"Unknown command",
        NO_MEMORY => b"Out of memory",
        _ => b"",
    }
}

fn error(out: &mut Vec<u8>, h: &Header, status: u16) {
    respond(out, h, status, 0, &[], &[], status_text(status));
}

fn store_status(e: &StoreError) -> u16 {
    match e {
        StoreError::OutOfMemory { .. } => NO_MEMORY,
        StoreError::ValueTooLarge { .. } => TOO_LARGE,
        StoreError::Exists | StoreError::VersionMismatch { .. } => EXISTS,
        StoreError::NotFound => NOT_FOUND,
        _ => EINVAL,
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn expiry(exptime: u32) -> Expiry {
    expiry_of(i64::from(exptime)).map_or(Expiry::Never, Expiry::At)
}

/// What a request's body must hold: (extras lengths allowed, key
/// required/forbidden/optional, value allowed).
fn shape(op: u8) -> Option<(&'static [usize], Option<bool>, bool)> {
    Some(match op {
        0x00 | 0x09 | 0x0c | 0x0d | 0x04 | 0x14 => (&[0], Some(true), false),
        0x01..=0x03 | 0x11..=0x13 => (&[8], Some(true), true),
        0x05 | 0x06 | 0x15 | 0x16 => (&[20], Some(true), false),
        0x07 | 0x17 | 0x0a | 0x0b => (&[0], Some(false), false),
        0x08 | 0x18 => (&[0, 4], Some(false), false),
        0x0e | 0x0f | 0x19 | 0x1a => (&[0], Some(true), true),
        0x10 => (&[0], None, false),
        0x1c | 0x1d | 0x1e | 0x23 | 0x24 => (&[4], Some(true), false),
        0x20 => (&[0], Some(false), false),
        0x21 | 0x22 => (&[0], Some(true), true),
        _ => return None,
    })
}

/// The connection's state that binary requests can change.
pub struct BinConn<'s> {
    /// Authenticated (always, without an authfile).
    pub authed: &'s mut bool,
    /// Set when an authentication attempt failed (the caller applies the
    /// delay).
    pub auth_failed: bool,
}

/// Execute one whole request (`req` = header + body); returns true if the
/// connection should close.
pub fn execute(
    shared: &Shared,
    stats: &WorkerStats,
    conn: &mut BinConn<'_>,
    h: &Header,
    req: &[u8],
    out: &mut Vec<u8>,
    buf: &mut Vec<u8>,
) -> bool {
    WorkerStats::bump(&stats.commands, 1);
    let body = &req[HEADER_BYTES..];
    let extras = &body[..h.ext_len];
    let key = &body[h.ext_len..h.ext_len + h.key_len];
    let value = &body[h.ext_len + h.key_len..];
    let op = h.opcode;
    let Some((ext_ok, key_req, value_ok)) = shape(op) else {
        error(out, h, UNKNOWN);
        return false;
    };
    let sasl = matches!(op, 0x20..=0x22);
    if sasl && shared.settings.mc_users.is_none() {
        error(out, h, UNKNOWN);
        return false;
    }
    if !*conn.authed && !sasl && !matches!(op, 0x07 | 0x17 | 0x0a | 0x0b) {
        error(out, h, AUTH_ERROR);
        return false;
    }
    let key_fits = match key_req {
        Some(true) => !key.is_empty() && key.len() <= MAX_KEY,
        Some(false) => key.is_empty(),
        None => key.len() <= MAX_KEY,
    };
    if !ext_ok.contains(&extras.len()) || !key_fits || (!value_ok && !value.is_empty()) {
        error(out, h, EINVAL);
        return false;
    }
    let store = &shared.store;
    // Writes run under their key's stripe, exclusively (see `mc_exec`).
    let writes = matches!(
        op,
        0x01..=0x06 | 0x0e | 0x0f | 0x11..=0x16 | 0x19 | 0x1a | 0x1c | 0x1d | 0x1e | 0x23 | 0x24
    );
    let _stripes = if writes {
        shared.keylocks.lock([key], true)
    } else {
        crate::keylock::KeyGuard::none()
    };
    let quiet = matches!(op, 0x09 | 0x0d | 0x11..=0x1a | 0x1e | 0x24);
    match op {
        // GET, GETQ, GETK, GETKQ, GAT, GATQ, GATK, GATKQ.
        0x00 | 0x09 | 0x0c | 0x0d | 0x1d | 0x1e | 0x23 | 0x24 => {
            let with_key = matches!(op, 0x0c | 0x0d | 0x23 | 0x24);
            let hit = match store.get_into(key, buf) {
                Ok(Some(m)) if !is_collection(&m) => {
                    let gat = matches!(op, 0x1d | 0x1e | 0x23 | 0x24);
                    let touched = if gat {
                        store.set_expiry(key, expiry_of(i64::from(be32(extras))))
                    } else {
                        Ok(true)
                    };
                    match touched {
                        Ok(_) => {
                            let k: &[u8] = if with_key { key } else { &[] };
                            respond(out, h, OK, m.version, &m.flags.to_be_bytes(), k, buf);
                            true
                        }
                        // No room to give the item its TTL (a store that
                        // refuses instead of evicting): the GAT fails.
                        Err(e) => {
                            error(out, h, store_status(&e));
                            false
                        }
                    }
                }
                Ok(_) => {
                    if !quiet {
                        let k: &[u8] = if with_key { key } else { &[] };
                        respond(out, h, NOT_FOUND, 0, &[], k, status_text(NOT_FOUND));
                    }
                    false
                }
                Err(e) => {
                    error(out, h, store_status(&e));
                    false
                }
            };
            let c = if hit { &stats.hits } else { &stats.misses };
            c.fetch_add(1, Ordering::Relaxed);
        }
        // SET, ADD, REPLACE (+Q).
        0x01..=0x03 | 0x11..=0x13 => {
            WorkerStats::bump(&stats.sets, 1);
            let flags = be32(&extras[..4]);
            if is_reserved_flags(flags) {
                error(out, h, EINVAL);
                return false;
            }
            let verb = op & 0x0f;
            let condition = match (verb, h.cas) {
                (0x02, _) => Condition::IfAbsent,
                (_, 0) if verb == 0x03 => Condition::IfPresent,
                (_, 0) => Condition::Always,
                (_, v) => Condition::IfVersion(v),
            };
            let opts = PutOptions {
                condition,
                expiry: expiry(be32(&extras[4..8])),
                flags,
            };
            match store.put_with(key, value, opts) {
                Ok(_) if quiet => {}
                Ok(v) => respond(out, h, OK, v, &[], &[], &[]),
                Err(StoreError::NotFound) if verb == 0x03 || h.cas != 0 => error(out, h, NOT_FOUND),
                Err(e) => error(out, h, store_status(&e)),
            }
        }
        // DELETE(Q).
        0x04 | 0x14 => {
            let cond = match h.cas {
                0 => Condition::Always,
                v => Condition::IfVersion(v),
            };
            match store.delete_if(key, cond) {
                Ok(()) if quiet => {}
                Ok(()) => respond(out, h, OK, 0, &[], &[], &[]),
                Err(e) => error(out, h, store_status(&e)),
            }
        }
        // INCREMENT, DECREMENT (+Q).
        0x05 | 0x06 | 0x15 | 0x16 => {
            let incr = matches!(op, 0x05 | 0x15);
            match arith(shared, key, extras, h.cas, incr, buf) {
                Ok(_) if quiet => {}
                Ok((n, v)) => respond(out, h, OK, v, &[], &[], &n.to_be_bytes()),
                Err(s) => error(out, h, s),
            }
        }
        // QUIT(Q).
        0x07 | 0x17 => {
            if !quiet {
                respond(out, h, OK, 0, &[], &[], &[]);
            }
            return true;
        }
        // FLUSH(Q).
        0x08 | 0x18 => match flush(shared) {
            Ok(()) if quiet => {}
            Ok(()) => respond(out, h, OK, 0, &[], &[], &[]),
            Err(e) => error(out, h, store_status(&e)),
        },
        0x0a => respond(out, h, OK, 0, &[], &[], &[]),
        0x0b => respond(out, h, OK, 0, &[], &[], MC_VERSION.as_bytes()),
        // APPEND, PREPEND (+Q).
        0x0e | 0x0f | 0x19 | 0x1a => {
            let append = matches!(op, 0x0e | 0x19);
            match concat(shared, key, value, append, buf) {
                Ok(_) if quiet => {}
                Ok(v) => respond(out, h, OK, v, &[], &[], &[]),
                Err(s) => error(out, h, s),
            }
        }
        0x10 => {
            if key.is_empty() {
                for (k, v) in stats_pairs(shared) {
                    respond(out, h, OK, 0, &[], k.as_bytes(), v.as_bytes());
                }
            } else if key != b"reset" {
                error(out, h, NOT_FOUND);
                return false;
            }
            respond(out, h, OK, 0, &[], &[], &[]);
        }
        // TOUCH: answers the flags and CAS, without the value.
        0x1c => match store.get_into(key, buf) {
            Ok(Some(m)) if !is_collection(&m) => {
                match store.set_expiry(key, expiry_of(i64::from(be32(extras)))) {
                    Ok(true) => respond(out, h, OK, m.version, &m.flags.to_be_bytes(), &[], &[]),
                    Ok(false) => error(out, h, NOT_FOUND),
                    Err(e) => error(out, h, store_status(&e)),
                }
            }
            Ok(_) => error(out, h, NOT_FOUND),
            Err(e) => error(out, h, store_status(&e)),
        },
        0x20 => respond(out, h, OK, 0, &[], &[], b"PLAIN"),
        0x21 if key == b"PLAIN" => {
            // PLAIN: [authzid] \0 authcid \0 password.
            let mut parts = value.splitn(3, |&b| b == 0);
            let (_, user, pass) = (parts.next(), parts.next(), parts.next());
            let ok = match (user, pass) {
                (Some(u), Some(p)) if !u.contains(&b' ') => {
                    let mut line = u.to_vec();
                    line.push(b' ');
                    line.extend_from_slice(p);
                    shared
                        .settings
                        .mc_users
                        .as_ref()
                        .is_some_and(|m| m.check(&line))
                }
                _ => false,
            };
            if ok {
                *conn.authed = true;
                respond(out, h, OK, 0, &[], &[], b"Authenticated");
            } else {
                conn.auth_failed = true;
                error(out, h, AUTH_ERROR);
            }
        }
        // Another mechanism, or a STEP (PLAIN is one step).
        _ => {
            conn.auth_failed = true;
            error(out, h, AUTH_ERROR);
        }
    }
    false
}

fn arith(
    shared: &Shared,
    key: &[u8],
    extras: &[u8],
    cas: u64,
    incr: bool,
    buf: &mut Vec<u8>,
) -> Result<(u64, u64), u16> {
    let store = &shared.store;
    let (delta, initial, exptime) = (
        be64(&extras[..8]),
        be64(&extras[8..16]),
        be32(&extras[16..20]),
    );
    loop {
        let (new, opts) = match store.get_into(key, buf) {
            Ok(Some(m)) => {
                if cas != 0 && cas != m.version {
                    return Err(EXISTS);
                }
                let Some(new) = crate::mc_exec::counter_step(buf, &m, incr, delta) else {
                    return Err(NON_NUMERIC);
                };
                let opts = PutOptions {
                    condition: Condition::IfVersion(m.version),
                    expiry: Expiry::Keep,
                    flags: m.flags,
                };
                (new, opts)
            }
            Ok(None) if exptime == u32::MAX || cas != 0 => return Err(NOT_FOUND),
            Ok(None) => {
                let opts = PutOptions {
                    condition: Condition::IfAbsent,
                    expiry: expiry(exptime),
                    flags: 0,
                };
                (initial, opts)
            }
            Err(e) => return Err(store_status(&e)),
        };
        match store.put_with(key, new.to_string().as_bytes(), opts) {
            Ok(v) => return Ok((new, v)),
            Err(e) if crate::commands::is_race(&e) => continue,
            Err(e) => return Err(store_status(&e)),
        }
    }
}

fn concat(
    shared: &Shared,
    key: &[u8],
    data: &[u8],
    append: bool,
    buf: &mut Vec<u8>,
) -> Result<u64, u16> {
    let store = &shared.store;
    let max = shared.settings.max_bulk();
    loop {
        let m = match store.get_into(key, buf) {
            Ok(Some(m)) if !is_collection(&m) => m,
            Ok(_) => return Err(NOT_STORED),
            Err(e) => return Err(store_status(&e)),
        };
        if buf.len() + data.len() > max {
            return Err(TOO_LARGE);
        }
        let v = crate::mc_exec::joined(buf, data, append);
        let opts = PutOptions {
            condition: Condition::IfVersion(m.version),
            expiry: Expiry::Keep,
            flags: m.flags,
        };
        match store.put_with(key, &v, opts) {
            Ok(ver) => return Ok(ver),
            Err(e) if crate::commands::is_race(&e) => continue,
            Err(e) => return Err(store_status(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut out = Vec::new();
        for _ in 0..10_000 {
            let mut b = [0u8; 40];
            for x in b.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *x = seed as u8;
            }
            b[0] = if seed & 1 == 0 { REQ_MAGIC } else { b[0] };
            let _ = parse(&b, 1 << 20, &mut out);
            out.clear();
        }
        assert_eq!(parse(&[0x80; 10], 100, &mut out), BinParsed::Incomplete(24));
    }
}
