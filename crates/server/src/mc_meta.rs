//! memcached's meta commands: `mg`, `ms`, `md`, `ma`, `mn`, `me`.
//!
//! The meta commands are memcached 1.6's compact text protocol: one
//! command line `<verb> <key> [<datalen>] <flag>*`, where every flag is a
//! single letter, optionally followed by a token (`T30`, `Oabc`), and a
//! short reply code (`HD`, `VA`, `EN`, `NS`, `EX`, `NF`, `MN`) followed by
//! the *return flags* the request asked for, in the order it asked:
//!
//! ```text
//!   mg foo v k t c O9  ->  VA 2 kfoo t-1 c2 O9\r\nhi\r\n   (miss: EN)
//!   ms foo 2 T60 F5 c  ->  HD c3                          (data block follows the line)
//!   md foo C3 q        ->  (nothing: q hides HD)          (NF, EX are always shown)
//!   ma cnt N0 J10 v    ->  VA 2\r\n10\r\n
//!   mn                 ->  MN
//!   me foo             ->  ME foo exp=-1 la=0 cas=3 fetch=no cls=1 size=2
//! ```
//!
//! Everything maps onto the engine calls the classic verbs use (see
//! `mc_exec`): the item version is the CAS value, the 32-bit client flags
//! and the expiry are stored with the item, conditional writes are the
//! engine's `Condition`s, and `ma` reads, computes and writes back under
//! `IfVersion`, retrying on a race, as `incr` does.
//!
//! Flags served — `mg`: `c f h k l O q s t T u v E N R`; `ms`: `c C F I k O q
//! S T M N`; `md`: `C I k O q T`; `ma`: `c C D J k M N O q t T v`. What the
//! store does not track is answered as a fresh item would be: `h` is
//! always `h0`, `l` always `l0` (no per-item access time), `me`'s `la` is 0
//! and `fetch` is `no`. Stale-while-revalidate is not kept: `I` (invalidate)
//! is accepted and behaves as the plain command, `R` never wins a recache
//! token, and `N` on `mg` vivifies the missing item (empty, with the given
//! TTL) and answers `W` to the creator only, with no `Z` for later readers.
//! `E` (explicit CAS) is accepted and ignored: the engine picks versions.
//! Base64 keys (`b`) are decoded for the store and returned as sent (`k`
//! answers the base64 form followed by `b`); unlike memcached, an item
//! stored with a binary key is not remembered as such, so a later `k`
//! without `b` returns the key as that request spelled it.
//!
//! Quiet mode (`q`) hides what memcached 1.6 hides: `EN` for `mg`, `HD`
//! for `ms`, `md` and `ma` (and `ma`'s `VA`); errors, `NF`, `NS` and `EX`
//! are always sent. `mn` is the usual end-of-pipeline marker after quiet
//! commands.

use std::borrow::Cow;
use std::fmt::Write as _;

use nibble::{Condition, Error as StoreError, Expiry, PutOptions};

use crate::mc_exec::{expiry_of, Wr};
use crate::memcache::{McCommand, McParsed, MAX_KEY};
use crate::state::{unix_ms, Shared};
use crate::types::{is_collection, is_reserved_flags};

/// Which meta command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaVerb {
    /// `mg`.
    Get,
    /// `ms`.
    Set,
    /// `md`.
    Delete,
    /// `ma`.
    Arith,
    /// `me`.
    Debug,
}

/// A parsed meta command, borrowing from the input.
#[derive(Debug, PartialEq, Eq)]
pub struct Meta<'a> {
    /// Which.
    pub verb: MetaVerb,
    /// Key (decoded, with `b`).
    pub key: Cow<'a, [u8]>,
    /// The key as sent (what `k` returns).
    pub wire_key: &'a [u8],
    /// The flag tokens as sent (letter first), in order.
    pub flags: Vec<&'a [u8]>,
    /// `ms`'s data block.
    pub data: &'a [u8],
}

const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
const INVALID_FLAG: &str = "CLIENT_ERROR invalid flag";
const INVALID_OR_DUP: &str = "CLIENT_ERROR invalid or duplicate flag";

fn allowed(verb: MetaVerb) -> &'static [u8] {
    match verb {
        MetaVerb::Get => b"bcfhklOqstTuvENR",
        MetaVerb::Set => b"bcCFIkOqSTMNE",
        MetaVerb::Delete => b"bCIkOqTE",
        MetaVerb::Arith => b"bcCDJkMNOqtTvE",
        MetaVerb::Debug => b"",
    }
}

/// Parse a meta command whose verb is `cmd` (`toks[0]`); `after` is where
/// the command line ended in `buf`.
pub fn parse<'a>(
    cmd: &[u8],
    toks: &[&'a [u8]],
    buf: &'a [u8],
    after: usize,
    max_value: usize,
) -> McParsed<'a> {
    let c = |cmd: McCommand<'a>| McParsed::Command(cmd, after);
    let verb = match cmd {
        b"mn" => return c(McCommand::Reply("MN")),
        b"mg" => MetaVerb::Get,
        b"ms" => MetaVerb::Set,
        b"md" => MetaVerb::Delete,
        b"ma" => MetaVerb::Arith,
        _ => MetaVerb::Debug,
    };
    let Some(&key) = toks.get(1) else {
        return c(McCommand::Error("ERROR"));
    };
    if key.len() > MAX_KEY {
        return c(McCommand::Error(BAD_FORMAT));
    }
    let (first_flag, data_len) = if verb == MetaVerb::Set {
        let Some(n) = toks
            .get(2)
            .and_then(|t| std::str::from_utf8(t).ok())
            .and_then(|t| t.parse::<u64>().ok())
        else {
            return c(McCommand::Error(BAD_FORMAT));
        };
        if n > max_value as u64 {
            return c(McCommand::TooLarge { skip: n + 2 });
        }
        (3, n as usize)
    } else {
        (2, 0)
    };
    // ms: the data block is consumed whatever the flags say.
    let (data, used) = if verb == MetaVerb::Set {
        let end = after + data_len;
        if buf.len() < end + 2 {
            return McParsed::Incomplete(end + 2);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return McParsed::Command(McCommand::Error("CLIENT_ERROR bad data chunk"), end + 2);
        }
        (&buf[after..end], end + 2)
    } else {
        (&buf[..0], after)
    };
    let bad = if verb == MetaVerb::Get {
        INVALID_FLAG
    } else {
        INVALID_OR_DUP
    };
    let flags: Vec<&'a [u8]> = toks.get(first_flag..).unwrap_or_default().to_vec();
    let mut seen = [false; 128];
    for f in &flags {
        let l = f[0];
        if !allowed(verb).contains(&l) || seen[usize::from(l & 0x7f)] {
            return McParsed::Command(McCommand::Error(bad), used);
        }
        seen[usize::from(l & 0x7f)] = true;
    }
    let key = if seen[usize::from(b'b')] {
        match base64_decode(key) {
            Some(k) if !k.is_empty() && k.len() <= MAX_KEY => Cow::Owned(k),
            // memcached's wording differs by command.
            _ if matches!(verb, MetaVerb::Get | MetaVerb::Set) => {
                return McParsed::Command(McCommand::Error("CLIENT_ERROR error decoding key"), used)
            }
            _ => return McParsed::Command(McCommand::Error(INVALID_OR_DUP), used),
        }
    } else {
        Cow::Borrowed(key)
    };
    McParsed::Command(
        McCommand::Meta(Meta {
            verb,
            key,
            wire_key: toks[1],
            flags,
            data,
        }),
        used,
    )
}

/// Decode standard padded base64; None if malformed.
fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let s = s
        .strip_suffix(b"==")
        .or_else(|| s.strip_suffix(b"="))
        .unwrap_or(s);
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in s {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // Leftover bits must be zero padding of less than a byte.
    (bits < 6 && acc == 0).then_some(out)
}

/// The token of flag `l`, if sent.
fn token<'a>(m: &Meta<'a>, l: u8) -> Option<&'a [u8]> {
    m.flags.iter().find(|f| f[0] == l).map(|f| &f[1..])
}

fn has(m: &Meta<'_>, l: u8) -> bool {
    token(m, l).is_some()
}

/// The numeric token of flag `l`: Ok(None) if absent, Err if malformed.
fn num<T: std::str::FromStr>(m: &Meta<'_>, l: u8) -> Result<Option<T>, ()> {
    match token(m, l) {
        None => Ok(None),
        Some(t) => std::str::from_utf8(t)
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or(()),
    }
}

/// What the item looked like, for the return flags.
#[derive(Clone, Copy, Default)]
struct Seen {
    cas: u64,
    flags: u32,
    len: usize,
    expiry_ms: Option<u64>,
}

/// Remaining TTL in seconds (-1: never expires), rounded up.
fn ttl_of(expiry_ms: Option<u64>) -> i64 {
    match expiry_ms {
        None => -1,
        Some(e) => e.saturating_sub(unix_ms()).div_ceil(1000) as i64,
    }
}

/// Append the return flags `m` asked for, in its order.
fn ret_flags(m: &Meta<'_>, s: &Seen, out: &mut Vec<u8>) {
    for f in &m.flags {
        let w = &mut Wr(out);
        let _ = match f[0] {
            b'O' => {
                w.0.extend_from_slice(b" O");
                w.0.extend_from_slice(&f[1..]);
                Ok(())
            }
            b'k' => {
                w.0.extend_from_slice(b" k");
                w.0.extend_from_slice(m.wire_key);
                if has(m, b'b') {
                    w.0.extend_from_slice(b" b");
                }
                Ok(())
            }
            b'c' => write!(w, " c{}", s.cas),
            b'f' if m.verb == MetaVerb::Get => write!(w, " f{}", s.flags),
            b's' if m.verb == MetaVerb::Get => write!(w, " s{}", s.len),
            b't' => write!(w, " t{}", ttl_of(s.expiry_ms)),
            b'h' => write!(w, " h0"),
            b'l' => write!(w, " l0"),
            _ => Ok(()),
        };
    }
}

fn code(out: &mut Vec<u8>, code: &str, m: &Meta<'_>, s: &Seen) {
    out.extend_from_slice(code.as_bytes());
    ret_flags(m, s, out);
    out.extend_from_slice(b"\r\n");
}

fn line(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn store_err(e: &StoreError) -> &'static str {
    match e {
        StoreError::OutOfMemory { .. } => "SERVER_ERROR out of memory storing object",
        StoreError::ValueTooLarge { .. } => "SERVER_ERROR object too large for cache",
        _ => "SERVER_ERROR internal error",
    }
}

/// Does this meta command write its item (and so take its key stripe
/// exclusively, see `mc_exec`)? Sets, deletes, arithmetic, and a get that
/// touches (`T`), autovivifies (`N`) or recaches (`R`).
pub fn writes(m: &Meta<'_>) -> bool {
    match m.verb {
        MetaVerb::Set | MetaVerb::Delete | MetaVerb::Arith => true,
        MetaVerb::Get => has(m, b'T') || has(m, b'N') || has(m, b'R'),
        MetaVerb::Debug => false,
    }
}

/// Execute one meta command, appending its reply to `out`; returns
/// whether it was a hit (for `get_hits`/`get_misses`), None if not a read.
pub fn execute(
    shared: &Shared,
    m: &Meta<'_>,
    out: &mut Vec<u8>,
    buf: &mut Vec<u8>,
) -> Option<bool> {
    match m.verb {
        MetaVerb::Get => Some(get(shared, m, out, buf)),
        MetaVerb::Set => {
            set(shared, m, out, buf);
            None
        }
        MetaVerb::Delete => {
            delete(shared, m, out);
            None
        }
        MetaVerb::Arith => {
            arith(shared, m, out, buf);
            None
        }
        MetaVerb::Debug => {
            debug(shared, m, out, buf);
            None
        }
    }
}

fn get(shared: &Shared, m: &Meta<'_>, out: &mut Vec<u8>, buf: &mut Vec<u8>) -> bool {
    let store = &shared.store;
    let (Ok(new_ttl), Ok(viv_ttl)) = (num::<i64>(m, b'T'), num::<i64>(m, b'N')) else {
        line(out, BAD_FORMAT);
        return false;
    };
    let (meta, won) = match store.get_into(&m.key[..], buf) {
        Ok(Some(meta)) if !is_collection(&meta) => (meta, false),
        Ok(_) => {
            let Some(ttl) = viv_ttl else {
                if !has(m, b'q') {
                    line(out, "EN");
                }
                return false;
            };
            // Vivify: create the empty item; the creator gets `W`.
            let expiry = expiry_of(ttl).map_or(Expiry::Never, Expiry::At);
            let opts = PutOptions {
                condition: Condition::IfAbsent,
                expiry,
                flags: 0,
            };
            match store.put_with(&m.key[..], b"", opts) {
                Ok(_) | Err(StoreError::Exists) => {}
                Err(e) => {
                    line(out, store_err(&e));
                    return false;
                }
            }
            match store.get_into(&m.key[..], buf) {
                Ok(Some(meta)) => (meta, true),
                _ => {
                    line(out, "EN");
                    return false;
                }
            }
        }
        Err(e) => {
            line(out, store_err(&e));
            return false;
        }
    };
    let mut seen = Seen {
        cas: meta.version,
        flags: meta.flags,
        len: buf.len(),
        expiry_ms: meta.expiry_ms,
    };
    if let Some(t) = new_ttl {
        seen.expiry_ms = expiry_of(t);
        // No room to give the item its TTL (a store that refuses instead
        // of evicting): the command fails.
        if let Err(e) = store.set_expiry(&m.key[..], seen.expiry_ms) {
            line(out, store_err(&e));
            return false;
        }
    }
    if has(m, b'v') {
        let _ = write!(Wr(out), "VA {}", buf.len());
    } else {
        out.extend_from_slice(b"HD");
    }
    ret_flags(m, &seen, out);
    if won {
        out.extend_from_slice(b" W");
    }
    out.extend_from_slice(b"\r\n");
    if has(m, b'v') {
        out.extend_from_slice(buf);
        out.extend_from_slice(b"\r\n");
    }
    !won
}

fn set(shared: &Shared, m: &Meta<'_>, out: &mut Vec<u8>, buf: &mut Vec<u8>) {
    let store = &shared.store;
    let (Ok(flags), Ok(ttl), Ok(cas), Ok(viv)) = (
        num::<u32>(m, b'F'),
        num::<i64>(m, b'T'),
        num::<u64>(m, b'C'),
        num::<i64>(m, b'N'),
    ) else {
        line(out, BAD_FORMAT);
        return;
    };
    let flags = flags.unwrap_or(0);
    if is_reserved_flags(flags) {
        line(
            out,
            &format!("CLIENT_ERROR flags value {flags} is reserved by this server"),
        );
        return;
    }
    let mode = match token(m, b'M') {
        None => b'S',
        Some([c]) => c.to_ascii_uppercase(),
        Some(_) => 0,
    };
    let expiry = expiry_of(ttl.unwrap_or(0)).map_or(Expiry::Never, Expiry::At);
    let condition = match (mode, cas) {
        (_, Some(v)) if mode != b'E' => Condition::IfVersion(v),
        (b'S', None) => Condition::Always,
        (b'E', _) => Condition::IfAbsent,
        (b'R', None) => Condition::IfPresent,
        (b'A' | b'P', None) => {
            return concat(shared, m, mode == b'A', viv, out, buf);
        }
        _ => {
            line(out, "CLIENT_ERROR invalid mode for ms M token");
            return;
        }
    };
    let r = store.put_with(
        &m.key[..],
        m.data,
        PutOptions {
            condition,
            expiry,
            flags,
        },
    );
    let seen = Seen {
        cas: *r.as_ref().unwrap_or(&0),
        ..Seen::default()
    };
    match r {
        Ok(_) if has(m, b'q') => {}
        Ok(_) => code(out, "HD", m, &seen),
        Err(StoreError::Exists) => code(out, "NS", m, &seen),
        Err(StoreError::NotFound) if cas.is_some() => code(out, "NF", m, &seen),
        Err(StoreError::NotFound) => code(out, "NS", m, &seen),
        Err(StoreError::VersionMismatch { .. }) => code(out, "EX", m, &seen),
        Err(e) => line(out, store_err(&e)),
    }
}

fn concat(
    shared: &Shared,
    m: &Meta<'_>,
    append: bool,
    vivify: Option<i64>,
    out: &mut Vec<u8>,
    buf: &mut Vec<u8>,
) {
    let store = &shared.store;
    let max = shared.settings.max_bulk();
    loop {
        let (v, opts) = match store.get_into(&m.key[..], buf) {
            Ok(Some(meta)) if is_collection(&meta) => {
                return line(out, "CLIENT_ERROR cannot append to a Redis hash")
            }
            Ok(Some(meta)) => {
                if buf.len() + m.data.len() > max {
                    return line(out, "SERVER_ERROR object too large for cache");
                }
                let mut v = Vec::with_capacity(buf.len() + m.data.len());
                let (a, b) = if append {
                    (&buf[..], m.data)
                } else {
                    (m.data, &buf[..])
                };
                v.extend_from_slice(a);
                v.extend_from_slice(b);
                let opts = PutOptions {
                    condition: Condition::IfVersion(meta.version),
                    expiry: Expiry::Keep,
                    flags: meta.flags,
                };
                (v, opts)
            }
            Ok(None) => match vivify {
                None => return code(out, "NS", m, &Seen::default()),
                Some(t) => {
                    let opts = PutOptions {
                        condition: Condition::IfAbsent,
                        expiry: expiry_of(t).map_or(Expiry::Never, Expiry::At),
                        flags: 0,
                    };
                    (m.data.to_vec(), opts)
                }
            },
            Err(e) => return line(out, store_err(&e)),
        };
        match store.put_with(&m.key[..], &v, opts) {
            Ok(cas) => {
                if !has(m, b'q') {
                    let seen = Seen {
                        cas,
                        ..Seen::default()
                    };
                    code(out, "HD", m, &seen);
                }
                return;
            }
            Err(e) if crate::commands::is_race(&e) => continue,
            Err(e) => return line(out, store_err(&e)),
        }
    }
}

fn delete(shared: &Shared, m: &Meta<'_>, out: &mut Vec<u8>) {
    let Ok(cas) = num::<u64>(m, b'C') else {
        return line(out, BAD_FORMAT);
    };
    let cond = cas.map_or(Condition::Always, Condition::IfVersion);
    let seen = Seen::default();
    match shared.store.delete_if(&m.key[..], cond) {
        Ok(()) if has(m, b'q') => {}
        Ok(()) => code(out, "HD", m, &seen),
        Err(StoreError::NotFound) => code(out, "NF", m, &seen),
        Err(StoreError::VersionMismatch { .. }) => code(out, "EX", m, &seen),
        Err(e) => line(out, store_err(&e)),
    }
}

fn arith(shared: &Shared, m: &Meta<'_>, out: &mut Vec<u8>, buf: &mut Vec<u8>) {
    let store = &shared.store;
    let (Ok(viv), Ok(initial), Ok(delta), Ok(ttl), Ok(cas)) = (
        num::<i64>(m, b'N'),
        num::<u64>(m, b'J'),
        num::<u64>(m, b'D'),
        num::<i64>(m, b'T'),
        num::<u64>(m, b'C'),
    ) else {
        return line(out, INVALID_OR_DUP);
    };
    let incr = match token(m, b'M') {
        None => true,
        Some([b'I' | b'i' | b'+']) => true,
        Some([b'D' | b'd' | b'-']) => false,
        Some(_) => return line(out, "CLIENT_ERROR invalid mode for ma M token"),
    };
    let delta = delta.unwrap_or(1);
    loop {
        let (new, opts, cur_expiry) = match store.get_into(&m.key[..], buf) {
            Ok(Some(meta)) => {
                if cas.is_some_and(|c| c != meta.version) {
                    return code(out, "EX", m, &Seen::default());
                }
                let Some(new) = crate::mc_exec::counter_step(buf, &meta, incr, delta) else {
                    return line(
                        out,
                        "CLIENT_ERROR cannot increment or decrement non-numeric value",
                    );
                };
                let expiry = ttl.map_or(Expiry::Keep, |t| {
                    expiry_of(t).map_or(Expiry::Never, Expiry::At)
                });
                let e = ttl.map_or(meta.expiry_ms, expiry_of);
                let opts = PutOptions {
                    condition: Condition::IfVersion(meta.version),
                    expiry,
                    flags: meta.flags,
                };
                (new, opts, e)
            }
            Ok(None) => {
                let Some(t) = viv else {
                    return code(out, "NF", m, &Seen::default());
                };
                let e = expiry_of(t);
                let opts = PutOptions {
                    condition: Condition::IfAbsent,
                    expiry: e.map_or(Expiry::Never, Expiry::At),
                    flags: 0,
                };
                (initial.unwrap_or(0), opts, e)
            }
            Err(e) => return line(out, store_err(&e)),
        };
        let s = new.to_string();
        match store.put_with(&m.key[..], s.as_bytes(), opts) {
            Ok(v) => {
                if has(m, b'q') {
                    return;
                }
                let seen = Seen {
                    cas: v,
                    flags: opts.flags,
                    len: s.len(),
                    expiry_ms: cur_expiry,
                };
                if has(m, b'v') {
                    let _ = write!(Wr(out), "VA {}", s.len());
                    ret_flags(m, &seen, out);
                    out.extend_from_slice(b"\r\n");
                    line(out, &s);
                } else {
                    code(out, "HD", m, &seen);
                }
                return;
            }
            Err(e) if crate::commands::is_race(&e) => continue,
            Err(e) => return line(out, store_err(&e)),
        }
    }
}

fn debug(shared: &Shared, m: &Meta<'_>, out: &mut Vec<u8>, buf: &mut Vec<u8>) {
    match shared.store.get_into(&m.key[..], buf) {
        Ok(Some(meta)) => {
            out.extend_from_slice(b"ME ");
            out.extend_from_slice(m.wire_key);
            let _ = write!(
                Wr(out),
                " exp={} la=0 cas={} fetch=no cls=1 size={}\r\n",
                ttl_of(meta.expiry_ms),
                meta.version,
                buf.len() + m.key.len()
            );
        }
        Ok(None) => line(out, "EN"),
        Err(e) => line(out, store_err(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_keys() {
        assert_eq!(base64_decode(b"Zm9v").unwrap(), b"foo");
        assert_eq!(base64_decode(b"Zm9vYg==").unwrap(), b"foob");
        assert_eq!(base64_decode(b"Zm9vYmE=").unwrap(), b"fooba");
        assert_eq!(base64_decode(b"AP8=").unwrap(), [0, 255]);
        for bad in [&b"Zm9vYg"[..], b"@@@@", b"Zm9vY===", b"Zm9=Yg=="] {
            assert!(base64_decode(bad).is_none(), "{bad:?}");
        }
    }
}
