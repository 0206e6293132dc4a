//! The memcached text protocol parser.
//!
//! memcached's text protocol is line-oriented: a command line of
//! space-separated tokens ending in `\r\n` (a bare `\n` is accepted, as
//! memcached does), and for the storage commands a data block of exactly
//! `<bytes>` bytes followed by `\r\n`:
//!
//! ```text
//!   set <key> <flags> <exptime> <bytes> [noreply]\r\n<data>\r\n
//!   cas <key> <flags> <exptime> <bytes> <cas unique> [noreply]\r\n<data>\r\n
//!   get|gets <key>*\r\n           gat|gats <exptime> <key>*\r\n
//!   delete <key> [noreply]        incr|decr <key> <value> [noreply]
//!   touch <key> <exptime> [noreply]   flush_all [delay] [noreply]
//!   version | stats | verbosity <n> [noreply] | quit
//! ```
//!
//! [`parse`] looks at the front of the buffer and returns one [`McCommand`]
//! (borrowing keys and data from the buffer) and the bytes it used, or
//! `Incomplete(n)` with the buffer length it needs (for a storage command
//! that is the whole data block, so a 1 MiB value is not re-parsed on every
//! read). Errors that memcached answers and survives (an unknown command,
//! a malformed line) come back as [`McCommand::Error`] with the reply text;
//! errors after which the byte stream cannot be trusted (a line over
//! [`MAX_LINE`] bytes, a data block not followed by `\r\n`) are
//! [`McFatal`]: the connection replies and closes. A value over the size
//! limit is [`McCommand::TooLarge`]: the connection replies and then
//! discards the announced data block, as memcached does.

use smallvec::SmallVec;

/// Longest command line (memcached's limit is 2048 for keys + tokens).
pub const MAX_LINE: usize = 2048;
/// Longest key (memcached's KEY_MAX_LENGTH).
pub const MAX_KEY: usize = 250;
/// Most keys in one get.
pub const MAX_GET_KEYS: usize = 1024;
/// Keys of one get held without a heap allocation.
pub const GET_KEYS_INLINE: usize = 4;

/// Storage verbs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreVerb {
    /// Always store.
    Set,
    /// Only if absent.
    Add,
    /// Only if present.
    Replace,
    /// Append to the existing value.
    Append,
    /// Prepend to the existing value.
    Prepend,
    /// Only if the version matches.
    Cas,
}

/// A storage command's arguments, borrowing from the input.
#[derive(Debug, PartialEq, Eq)]
pub struct Store<'a> {
    /// Which.
    pub verb: StoreVerb,
    /// Key.
    pub key: &'a [u8],
    /// Client flags.
    pub flags: u32,
    /// Raw exptime.
    pub exptime: i64,
    /// Data.
    pub data: &'a [u8],
    /// For cas.
    pub cas: u64,
    /// noreply.
    pub noreply: bool,
}

/// A parsed command, borrowing from the input.
#[derive(Debug, PartialEq, Eq)]
pub enum McCommand<'a> {
    /// set/add/replace/append/prepend/cas.
    Store(Store<'a>),
    /// get/gets/gat/gats.
    Get {
        /// Keys (inline up to [`GET_KEYS_INLINE`]).
        keys: SmallVec<[&'a [u8]; GET_KEYS_INLINE]>,
        /// Reply with cas values.
        with_cas: bool,
        /// gat/gats: new exptime.
        touch: Option<i64>,
    },
    /// delete.
    Delete {
        /// Key.
        key: &'a [u8],
        /// noreply.
        noreply: bool,
    },
    /// incr/decr.
    Arith {
        /// Key.
        key: &'a [u8],
        /// Amount.
        delta: u64,
        /// incr (true) or decr.
        incr: bool,
        /// noreply.
        noreply: bool,
    },
    /// touch.
    Touch {
        /// Key.
        key: &'a [u8],
        /// Raw exptime.
        exptime: i64,
        /// noreply.
        noreply: bool,
    },
    /// flush_all.
    FlushAll {
        /// Delay in seconds.
        delay: i64,
        /// noreply.
        noreply: bool,
    },
    /// version.
    Version,
    /// `stats` with no argument: the general statistics.
    Stats,
    /// A command answered with one fixed line (`stats reset` -> `RESET`,
    /// `stats items|slabs|sizes|conns` -> `END`: this server has no slab
    /// classes to list).
    Reply(&'static str),
    /// verbosity.
    Verbosity {
        /// noreply.
        noreply: bool,
    },
    /// quit.
    Quit,
    /// A storage command whose value is over the limit: reply
    /// `SERVER_ERROR object too large for cache`, then discard the next
    /// `skip` bytes (the data block and its CRLF).
    TooLarge {
        /// Bytes to discard.
        skip: u64,
    },
    /// A meta command (`mg`, `ms`, `md`, `ma`, `me`; see `mc_meta`).
    Meta(crate::mc_meta::Meta<'a>),
    /// A line consumed without a reply (an argument error under
    /// `noreply`).
    Silent,
    /// A recoverable error: reply with this line and continue.
    Error(&'static str),
}

impl McCommand<'_> {
    /// The command's first key, if it has one (where key affinity and
    /// CPU steering look, see `crate::migrate`).
    pub fn first_key(&self) -> Option<&[u8]> {
        match self {
            McCommand::Store(a) => Some(a.key),
            McCommand::Get { keys, .. } => keys.first().copied(),
            McCommand::Delete { key, .. }
            | McCommand::Arith { key, .. }
            | McCommand::Touch { key, .. } => Some(key),
            McCommand::Meta(m) => Some(&m.key[..]),
            _ => None,
        }
    }

    /// Whether running it may change the store (under `appendfsync
    /// always` its reply then waits for a flush): false for plain
    /// get/gets and the informational commands; meta commands count as
    /// writes (their flags may set a TTL or a value).
    pub fn may_write(&self) -> bool {
        !matches!(
            self,
            McCommand::Get { touch: None, .. }
                | McCommand::Version
                | McCommand::Stats
                | McCommand::Reply(_)
                | McCommand::Verbosity { .. }
                | McCommand::Quit
                | McCommand::TooLarge { .. }
        )
    }
}

/// An error after which the connection closes (after sending the text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McFatal(pub &'static str);

/// Outcome of one parse step.
#[derive(Debug, PartialEq, Eq)]
pub enum McParsed<'a> {
    /// A command and the bytes it used.
    Command(McCommand<'a>, usize),
    /// Need at least this many bytes in the buffer.
    Incomplete(usize),
}

fn num<T: std::str::FromStr>(tok: &[u8]) -> Option<T> {
    std::str::from_utf8(tok).ok()?.parse().ok()
}

const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";

fn key_ok(k: &[u8]) -> bool {
    !k.is_empty() && k.len() <= MAX_KEY
}

/// Parse one command from the front of `buf`; `max_value` bounds data blocks.
///
/// As in memcached, an argument error (`CLIENT_ERROR ...`) of a storage,
/// `incr`/`decr` or `touch` line whose last token is `noreply` is not
/// answered: the line is consumed silently.
pub fn parse(buf: &[u8], max_value: usize) -> Result<McParsed<'_>, McFatal> {
    let r = parse_line(buf, max_value)?;
    if let McParsed::Command(McCommand::Error(e), used) = r {
        if e.starts_with("CLIENT_ERROR") {
            let line = buf[..used].trim_ascii_end();
            let mut toks = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
            let quiet_verb = matches!(
                toks.next(),
                Some(
                    b"set"
                        | b"add"
                        | b"replace"
                        | b"append"
                        | b"prepend"
                        | b"cas"
                        | b"incr"
                        | b"decr"
                        | b"touch"
                )
            );
            if quiet_verb && toks.next_back() == Some(b"noreply") {
                return Ok(McParsed::Command(McCommand::Silent, used));
            }
        }
    }
    Ok(r)
}

fn parse_line<'a>(buf: &'a [u8], max_value: usize) -> Result<McParsed<'a>, McFatal> {
    let Some(lf) = memchr::memchr(b'\n', &buf[..buf.len().min(MAX_LINE + 1)]) else {
        if buf.len() > MAX_LINE {
            return Err(McFatal("CLIENT_ERROR line too long"));
        }
        return Ok(McParsed::Incomplete(buf.len() + 1));
    };
    let line_end = if lf > 0 && buf[lf - 1] == b'\r' {
        lf - 1
    } else {
        lf
    };
    let line = &buf[..line_end];
    let after = lf + 1;
    // Tokens and keys stay inline for ordinary commands: no allocation per
    // request.
    let toks: SmallVec<[&[u8]; 8]> = line
        .split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .collect();
    let Some(&cmd) = toks.first() else {
        return Ok(McParsed::Command(McCommand::Error("ERROR"), after));
    };
    let noreply_at = |i: usize| toks.get(i) == Some(&&b"noreply"[..]);
    let c = |cmd: McCommand<'a>| Ok(McParsed::Command(cmd, after));
    match cmd {
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
            let verb = match cmd {
                b"set" => StoreVerb::Set,
                b"add" => StoreVerb::Add,
                b"replace" => StoreVerb::Replace,
                b"append" => StoreVerb::Append,
                b"prepend" => StoreVerb::Prepend,
                _ => StoreVerb::Cas,
            };
            let want = if verb == StoreVerb::Cas { 6 } else { 5 };
            if toks.len() < want || toks.len() > want + 1 {
                return c(McCommand::Error("ERROR"));
            }
            let bytes: Option<i64> = num(toks[4]);
            let (Some(flags), Some(exptime), Some(bytes)) =
                (num::<u32>(toks[2]), num::<i64>(toks[3]), bytes)
            else {
                return c(McCommand::Error(BAD_FORMAT));
            };
            if bytes < 0 {
                return c(McCommand::Error(BAD_FORMAT));
            }
            if bytes as u64 > max_value as u64 {
                // Like memcached: answer, then skip the data block as it
                // arrives (the connection does the skipping).
                return c(McCommand::TooLarge {
                    skip: bytes as u64 + 2,
                });
            }
            let cas = if verb == StoreVerb::Cas {
                match num::<u64>(toks[5]) {
                    Some(v) => v,
                    None => return c(McCommand::Error(BAD_FORMAT)),
                }
            } else {
                0
            };
            let key = toks[1];
            if !key_ok(key) {
                return Err(McFatal(BAD_FORMAT));
            }
            let noreply = noreply_at(want);
            let end = after + bytes as usize;
            if buf.len() < end + 2 {
                return Ok(McParsed::Incomplete(end + 2));
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(McFatal("CLIENT_ERROR bad data chunk"));
            }
            Ok(McParsed::Command(
                McCommand::Store(Store {
                    verb,
                    key,
                    flags,
                    exptime,
                    data: &buf[after..end],
                    cas,
                    noreply,
                }),
                end + 2,
            ))
        }
        b"get" | b"gets" | b"gat" | b"gats" => {
            let touch_cmd = cmd.starts_with(b"gat");
            let first_key = if touch_cmd { 2 } else { 1 };
            let touch = if touch_cmd {
                match toks.get(1).and_then(|t| num::<i64>(t)) {
                    Some(v) => Some(v),
                    None => return c(McCommand::Error("ERROR")),
                }
            } else {
                None
            };
            let keys: SmallVec<[&[u8]; GET_KEYS_INLINE]> =
                SmallVec::from_slice(&toks[first_key.min(toks.len())..]);
            if keys.is_empty() {
                return c(McCommand::Error("ERROR"));
            }
            if keys.len() > MAX_GET_KEYS || !keys.iter().all(|k| key_ok(k)) {
                return c(McCommand::Error(BAD_FORMAT));
            }
            Ok(McParsed::Command(
                McCommand::Get {
                    keys,
                    with_cas: cmd.ends_with(b"s"),
                    touch,
                },
                after,
            ))
        }
        b"delete" => {
            // memcached accepts an obsolete `0` time argument.
            let key = match toks.get(1) {
                Some(k) if key_ok(k) => *k,
                _ => return c(McCommand::Error("ERROR")),
            };
            let rest = &toks[2..];
            let noreply = rest.last() == Some(&&b"noreply"[..]);
            let extra = rest.len() - usize::from(noreply);
            if extra > 1 || (extra == 1 && rest[0] != b"0") {
                return c(McCommand::Error(
                    "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]",
                ));
            }
            Ok(McParsed::Command(McCommand::Delete { key, noreply }, after))
        }
        b"incr" | b"decr" => {
            if toks.len() < 3 || toks.len() > 4 {
                return c(McCommand::Error("ERROR"));
            }
            let key = toks[1];
            if !key_ok(key) {
                return c(McCommand::Error(BAD_FORMAT));
            }
            let Some(delta) = num::<u64>(toks[2]) else {
                return c(McCommand::Error(
                    "CLIENT_ERROR invalid numeric delta argument",
                ));
            };
            Ok(McParsed::Command(
                McCommand::Arith {
                    key,
                    delta,
                    incr: cmd == b"incr",
                    noreply: noreply_at(3),
                },
                after,
            ))
        }
        b"touch" => {
            if toks.len() < 3 || toks.len() > 4 {
                return c(McCommand::Error("ERROR"));
            }
            let key = toks[1];
            let Some(exptime) = num::<i64>(toks[2]) else {
                return c(McCommand::Error("CLIENT_ERROR invalid exptime argument"));
            };
            if !key_ok(key) {
                return c(McCommand::Error(BAD_FORMAT));
            }
            Ok(McParsed::Command(
                McCommand::Touch {
                    key,
                    exptime,
                    noreply: noreply_at(3),
                },
                after,
            ))
        }
        b"flush_all" => {
            let noreply = toks.last() == Some(&&b"noreply"[..]);
            let nargs = toks.len() - 1 - usize::from(noreply);
            let delay = match nargs {
                0 => 0,
                1 => match num::<i64>(toks[1]) {
                    Some(d) => d,
                    None => return c(McCommand::Error("CLIENT_ERROR invalid exptime argument")),
                },
                _ => return c(McCommand::Error("ERROR")),
            };
            Ok(McParsed::Command(
                McCommand::FlushAll { delay, noreply },
                after,
            ))
        }
        b"version" => c(McCommand::Version),
        // memcached answers an unknown stats group, `noreply` included,
        // with `ERROR` (stats have no quiet form).
        b"stats" => match toks.get(1..) {
            Some([]) | None => c(McCommand::Stats),
            Some([g]) if *g == b"reset" => c(McCommand::Reply("RESET")),
            Some([g]) if matches!(*g, b"items" | b"slabs" | b"sizes" | b"conns") => {
                c(McCommand::Reply("END"))
            }
            _ => c(McCommand::Error("ERROR")),
        },
        b"verbosity" => {
            if toks.len() < 2 || toks.len() > 3 {
                return c(McCommand::Error("ERROR"));
            }
            c(McCommand::Verbosity {
                noreply: toks.last() == Some(&&b"noreply"[..]),
            })
        }
        b"quit" => c(McCommand::Quit),
        b"mg" | b"ms" | b"md" | b"ma" | b"mn" | b"me" => {
            Ok(crate::mc_meta::parse(cmd, &toks, buf, after, max_value))
        }
        _ => c(McCommand::Error("ERROR")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_and_get() {
        let b = b"set k 5 0 3\r\nabc\r\nget a b\r\n";
        let McParsed::Command(cmd, n) = parse(b, 1 << 20).unwrap() else {
            panic!()
        };
        assert_eq!(n, 18);
        assert!(matches!(
            cmd,
            McCommand::Store(Store {
                flags: 5,
                data: b"abc",
                ..
            })
        ));
        let McParsed::Command(McCommand::Get { keys, .. }, _) = parse(&b[n..], 1 << 20).unwrap()
        else {
            panic!()
        };
        assert_eq!(keys[..], [&b"a"[..], &b"b"[..]]);
    }

    /// Reads wait for no flush under `appendfsync always`; anything
    /// that may change the store does.
    #[test]
    fn which_commands_may_write() {
        let may_write = |line: &[u8]| match parse(line, 1 << 20).unwrap() {
            McParsed::Command(c, _) => c.may_write(),
            McParsed::Incomplete(_) => panic!("incomplete: {line:?}"),
        };
        for r in [
            &b"get a b\r\n"[..],
            b"gets a\r\n",
            b"version\r\n",
            b"stats\r\n",
        ] {
            assert!(!may_write(r), "{r:?}");
        }
        for w in [
            &b"set k 0 0 1\r\nx\r\n"[..],
            b"gat 10 a\r\n",
            b"touch a 10\r\n",
            b"delete a\r\n",
            b"incr a 1\r\n",
            b"flush_all\r\n",
            b"mg a v\r\n",
        ] {
            assert!(may_write(w), "{w:?}");
        }
    }

    #[test]
    fn incomplete_and_errors() {
        assert_eq!(
            parse(b"set k 0 0 10\r\nab", 1 << 20).unwrap(),
            McParsed::Incomplete(26)
        );
        assert!(parse(b"set k 0 0 2\r\nabcd\r\n", 1 << 20).is_err());
        assert!(matches!(
            parse(b"bogus\r\n", 1 << 20).unwrap(),
            McParsed::Command(McCommand::Error("ERROR"), 7)
        ));
        assert!(parse(&[b'a'; 5000], 1 << 20).is_err());
        assert_eq!(
            parse(b"set k 0 0 100\r\n", 10).unwrap(),
            McParsed::Command(McCommand::TooLarge { skip: 102 }, 15)
        );
    }
}
