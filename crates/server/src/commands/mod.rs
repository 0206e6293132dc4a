//! Redis commands: the table, dispatch, and what every command shares.
//!
//! A request is a list of byte slices. [`execute`] finds the name's
//! [`Spec`] in a table built once (bucketed by name length and first
//! letter, compared ASCII-case-insensitively: no hashing, no copy), checks
//! authentication and arity the way Redis does, and runs the handler. A
//! handler writes its reply only on success; on failure it returns a
//! [`CmdError`] holding the complete error line (`ERR ...`, `WRONGTYPE ...`,
//! `OOM ...`), which dispatch writes. So a failed command never leaves half
//! a reply in the output.
//!
//! Handlers run on the worker thread that read the request, straight
//! against the engine; there is no command queue, and the only lock of
//! the server's own is the key stripes below. Commands that read and
//! then write one key (INCR, APPEND, SETRANGE, SETBIT, BITFIELD,
//! SET ... GET, GETSET, and a collection's root in `coll::modify`) also
//! loop on a compare-and-swap of the item's version, against writers
//! that take no stripe (memcached, expiry):
//!
//! ```text
//!   loop { v = get(key) ; new = f(v) ; put_with(key, new, IfVersion(v.version) or IfAbsent) ;
//!          if the version moved: retry }
//! ```
//!
//! Dispatch also takes the stripes of the command's keys (`keylock`),
//! exclusive for `write` commands, so among RESP commands MSET, MSETNX,
//! COPY, BITOP, RENAME, GETDEL, the STORE forms of the set commands and
//! every collection write are atomic. What can still interleave with
//! them are writers that take no stripe: memcached commands and expiry
//! (a MSETNX that finds a key appearing from memcached removes the keys
//! it already wrote, which another client may observe; a RENAME whose
//! source changes under it deletes nothing). EXPIRE's NX/XX/GT/LT options
//! check the current TTL before setting it, under the stripe.
//!
//! Collections (hashes and sets in `crate::coll`, lists in `crate::list`)
//! run under the key stripes dispatch takes (exclusive for `write`
//! commands), which is what makes a multi-item update of a large
//! collection atomic.
//!
//! Modules: [`strings`], [`lcs`], [`bits`] (bitmaps), [`keys`], [`dump`]
//! (DUMP/RESTORE), [`hash`], [`set`], [`list`], [`admin`] (connection and
//! server commands), [`multi`] (MULTI/EXEC/WATCH, RESET), [`pubsub`]
//! (SUBSCRIBE, PUBLISH, PUBSUB, and the sharded forms), [`blocking`]
//! (BLPOP and the other blocking pops, LMPOP, ZMPOP); the table itself
//! ([`COMMANDS`]) is in `table.rs`.
//!
//! Blocked clients: after a write that can give a list or sorted set
//! elements, while some client is blocked, dispatch notes the key as
//! ready and, once the command's stripes are released, serves the key's
//! waiters ([`blocking::serve_ready`], design in [`crate::blocking`]).
//!
//! On a replica ([`crate::replica`]) a gate byte, 0 on a primary, makes
//! dispatch refuse clients' writes (`-READONLY`) and, during a full
//! sync's load, data commands (`-LOADING`); one relaxed load when 0.
//!
//! Connection state that changes what dispatch does: inside MULTI a
//! command is checked and queued instead of run (see [`multi`]); a RESP2
//! connection with subscriptions accepts only the pub/sub commands, PING,
//! QUIT and RESET (see [`pubsub`]). Both are one branch on the hot path.

pub mod admin;
pub mod bits;
pub mod blocking;
pub mod dump;
pub mod hash;
pub mod keys;
pub mod lcs;
pub mod list;
pub mod lzf;
pub mod multi;
pub mod pubsub;
pub mod set;
pub mod strings;
mod table;
pub mod zset;

pub use table::COMMANDS;

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use nibble::Error as StoreError;

use crate::keylock::KeyGuard;
use crate::resp::{Proto, Reply};
use crate::state::{ClientInfo, Shared, WorkerStats};

/// Redis's OOM error line.
pub const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";
/// Redis's WRONGTYPE error line.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
/// Not an integer.
pub const NOT_INT: &str = "ERR value is not an integer or out of range";
/// Syntax error.
pub const SYNTAX: &str = "ERR syntax error";
/// Too large.
pub const TOO_BIG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";

/// A command's error reply (without the leading `-`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdError(pub Cow<'static, str>);

impl From<&'static str> for CmdError {
    fn from(s: &'static str) -> Self {
        CmdError(Cow::Borrowed(s))
    }
}

impl From<String> for CmdError {
    fn from(s: String) -> Self {
        CmdError(Cow::Owned(s))
    }
}

impl From<StoreError> for CmdError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::OutOfMemory { .. } => OOM.into(),
            StoreError::ValueTooLarge { .. } => TOO_BIG.into(),
            StoreError::BadKey { len } => format!(
                "ERR key of {len} bytes is longer than the limit of {} bytes",
                nibble::MAX_KEY_BYTES
            )
            .into(),
            // The shared store's lock-wait and I/O errors arrive as Io
            // with their own message.
            StoreError::Io(e) => format!("ERR {e}").into(),
            e => format!("ERR {e}").into(),
        }
    }
}

/// Result of a handler.
pub type CmdResult = Result<(), CmdError>;

/// Per-connection RESP state.
pub struct Session {
    /// Protocol version.
    pub proto: Proto,
    /// Authenticated (or no password required).
    pub authed: bool,
    /// CLIENT LIST entry.
    pub info: Arc<ClientInfo>,
    /// Close after flushing (QUIT).
    pub close: bool,
    /// Failed authentication attempts so far.
    pub auth_failures: u32,
    /// Set by a failed attempt: wait this long before replying and before
    /// reading the next request (see `auth`).
    pub penalty: Option<std::time::Duration>,
    /// Inside MULTI: the queue.
    pub multi: Option<multi::MultiState>,
    /// The last transaction's emptied buffers, for the next MULTI.
    pub multi_spare: Option<multi::MultiState>,
    /// WATCHed keys.
    pub watched: Vec<multi::Watched>,
    /// EXEC holds every key stripe (see [`Ctx::lock`]).
    pub exec_all: bool,
    /// Channel and pattern subscriptions, once the connection subscribed.
    pub subs: Option<crate::pubsub::Subs>,
    /// The replication link's session: the primary's command stream,
    /// which a read-only replica's gate lets through (see `replica`).
    pub primary: bool,
    /// A write command ran since the replies were last written: under
    /// `appendfsync always` they wait for a flush (see `durability`).
    pub dirty: bool,
    /// Set by a blocking command that found nothing: the connection
    /// waits on it before its next request (see [`crate::blocking`]).
    pub blocked: Option<crate::blocking::Blocked>,
    /// EXEC is running its queue: blocking commands do not block.
    pub in_exec: bool,
    /// Keys this connection's writes signalled as ready for blocked
    /// clients, served once its stripes are released.
    pub ready: Vec<Vec<u8>>,
    /// The command just run handed its element to a waiter and left its
    /// key missing (`blocking::hand_off`): nothing to signal.
    pub handed_off: bool,
    /// The worker this connection runs on.
    pub worker: usize,
    /// Move to this worker once the batch ends (DEBUG MIGRATE).
    pub move_to: Option<usize>,
    /// The key stripe its worker was chosen for (key affinity, a blocked
    /// wait on a key's owner), or [`crate::steer::BOUND_FIXED`] after
    /// DEBUG MIGRATE: CPU placement ([`crate::steer`]) leaves it there
    /// while its batches keep to that stripe, so the two never move it
    /// back and forth.
    pub bound: Option<usize>,
}

impl Session {
    /// A new session of `info`'s connection.
    pub fn new(info: Arc<ClientInfo>, authed: bool) -> Session {
        Session {
            proto: Proto::Resp2,
            authed,
            info,
            close: false,
            auth_failures: 0,
            penalty: None,
            multi: None,
            multi_spare: None,
            watched: Vec::new(),
            exec_all: false,
            subs: None,
            primary: false,
            dirty: false,
            blocked: None,
            in_exec: false,
            ready: Vec::new(),
            handed_off: false,
            worker: 0,
            move_to: None,
            bound: None,
        }
    }

    /// Channels plus patterns this connection is subscribed to.
    pub fn subscriptions(&self) -> usize {
        self.subs.as_ref().map_or(0, crate::pubsub::Subs::count)
    }

    /// Count a failed authentication attempt: log it (rate-limited, with
    /// the peer's address, never the password) and set the penalty.
    pub fn auth_failed(&mut self, what: &str) {
        self.auth_failures = self.auth_failures.saturating_add(1);
        self.penalty = Some(crate::auth::auth_fail_delay(self.auth_failures));
        crate::warn_limited!(
            crate::auth::AUTH_FAIL_LOG,
            "{what} failed: client id={} addr={} ({} failed attempts on this connection)",
            self.info.id,
            self.info.addr,
            self.auth_failures
        );
    }
}

/// What a handler sees.
pub struct Ctx<'a> {
    /// Shared state.
    pub shared: &'a Shared,
    /// This worker's counters.
    pub stats: &'a WorkerStats,
    /// This connection.
    pub sess: &'a mut Session,
    /// Scratch buffer for values.
    pub buf: &'a mut Vec<u8>,
}

impl<'a> Ctx<'a> {
    /// The engine.
    pub fn store(&self) -> &crate::engine::Engine {
        &self.shared.store
    }

    /// Take the stripes of keys the command table does not name (see
    /// [`crate::keylock`]); nothing when EXEC already holds every stripe.
    pub fn lock<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>, write: bool) -> KeyGuard<'a> {
        if self.sess.exec_all {
            KeyGuard::none()
        } else {
            self.shared.keylocks.lock(keys, write)
        }
    }

    /// Count a read hit or miss.
    pub fn hit(&self, found: bool) {
        let c = if found {
            &self.stats.hits
        } else {
            &self.stats.misses
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// A handler.
pub type Handler = fn(&mut Ctx, &[&[u8]], &mut Reply) -> CmdResult;

/// One command of the table.
pub struct Spec {
    /// Lower-case name.
    pub name: &'static str,
    /// Redis arity: n = exactly n arguments (with the name), -n = at least n.
    pub arity: i32,
    /// Redis command flags.
    pub flags: &'static [&'static str],
    /// First key, last key, step (COMMAND INFO).
    pub keys: (i32, i32, i32),
    /// Group (COMMAND DOCS).
    pub group: &'static str,
    /// One-line summary.
    pub summary: &'static str,
    /// The handler.
    pub run: Handler,
}

/// Longest command name the table can hold (names are looked up by
/// length, then by first letter).
const MAX_NAME: usize = 32;

/// The command table as looked up: buckets indexed by [`bucket`] (no
/// hashing and no copy of the name, just an index and a case-insensitive
/// compare against the few names of the same length and first letter),
/// plus GET and SET, which are checked first.
struct Table {
    buckets: Vec<Vec<&'static Spec>>,
    get: &'static Spec,
    set: &'static Spec,
}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        let mut buckets: Vec<Vec<&'static Spec>> = vec![Vec::new(); (MAX_NAME + 1) * 32];
        for s in COMMANDS {
            let name = s.name.as_bytes();
            assert!(
                !name.is_empty() && name.len() <= MAX_NAME,
                "command name {:?} is empty or too long",
                s.name
            );
            buckets[bucket(name)].push(s);
        }
        let find = |n: &str| *COMMANDS.iter().find(|s| s.name == n).as_ref().unwrap();
        Table {
            buckets,
            get: find("get"),
            set: find("set"),
        }
    })
}

/// The bucket of a non-empty name of at most [`MAX_NAME`] bytes.
#[inline]
fn bucket(name: &[u8]) -> usize {
    name.len() * 32 + usize::from(name[0].to_ascii_lowercase() & 31)
}

/// Find a command by (any-case) name.
#[inline]
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    let t = table();
    if let &[a, b, c] = name {
        // `x | 0x20` equals a lower-case letter exactly when x is that
        // letter in either case.
        match [a | 0x20, b | 0x20, c | 0x20] {
            [b'g', b'e', b't'] => return Some(t.get),
            [b's', b'e', b't'] => return Some(t.set),
            _ => {}
        }
    }
    if name.is_empty() || name.len() > MAX_NAME {
        return None;
    }
    // Names in the table are lower-case ASCII, so an ASCII
    // case-insensitive compare matches exactly the names that lower-case
    // to one of them (a non-ASCII byte only equals itself).
    t.buckets[bucket(name)]
        .iter()
        .find(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
        .copied()
}

/// Show bytes in an error message: lossy UTF-8, at most 128 bytes.
pub fn shown(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(128)]).into_owned()
}

/// Run one request and write its reply.
pub fn execute(ctx: &mut Ctx, args: &[&[u8]], r: &mut Reply) {
    let Some(&name) = args.first() else { return };
    WorkerStats::bump(&ctx.stats.commands, 1);
    let Some(spec) = lookup(name) else {
        let mut msg = format!(
            "ERR unknown command '{}', with args beginning with: ",
            shown(name)
        );
        for a in &args[1..] {
            msg.push('\'');
            msg.push_str(&shown(a));
            msg.push_str("' ");
        }
        reject(ctx, r, &msg, None);
        return;
    };
    if !ctx.sess.authed && !spec.flags.contains(&"noauth") {
        reject(ctx, r, "NOAUTH Authentication required.", Some(spec));
        return;
    }
    let n = args.len() as i32;
    if (spec.arity > 0 && n != spec.arity) || (spec.arity < 0 && n < -spec.arity) {
        let msg = format!("ERR wrong number of arguments for '{}' command", spec.name);
        reject(ctx, r, &msg, Some(spec));
        return;
    }
    let gate = ctx.shared.replica.gate();
    if gate != 0 && !ctx.sess.primary {
        if let Some(msg) = crate::replica::refused(gate, spec) {
            reject(ctx, r, msg, Some(spec));
            return;
        }
    }
    if ctx.sess.subs.is_some() && r.proto == Proto::Resp2 && !pubsub::allowed_subscribed(ctx, spec)
    {
        let msg = format!(
            "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context",
            spec.name
        );
        reject(ctx, r, &msg, Some(spec));
        return;
    }
    if ctx.sess.multi.is_some() && !multi::runs_in_multi(spec) {
        multi::queue(ctx, spec, args, r);
        return;
    }
    let write = spec.flags.contains(&"write");
    let keys = lock_keys(ctx.shared, spec, args, write);
    if write {
        WorkerStats::bump(&ctx.stats.writes, 1);
        ctx.sess.dirty = true;
    }
    if let Err(e) = (spec.run)(ctx, args, r) {
        r.error(&e.0);
    }
    signal(ctx, spec, args);
    drop(keys);
    if !ctx.sess.ready.is_empty() {
        blocking::serve_ready(ctx.shared, &mut ctx.sess.ready);
    }
}

/// Note the key a write may have given list or zset elements to, while
/// some client is blocked (one relaxed load otherwise), unless the write
/// handed its element straight to a waiter.
#[inline]
fn signal(ctx: &mut Ctx, spec: &Spec, args: &[&[u8]]) {
    if std::mem::take(&mut ctx.sess.handed_off) {
        return;
    }
    if ctx.shared.blocking.blocked() > 0 {
        let k = blocking::signalled_keys(spec, args);
        if !k.is_empty() {
            ctx.sess.ready.push(k.to_vec());
        }
    }
}

/// A command refused before it ran: count it, flag a transaction being
/// queued, answer the error. A refused EXEC discards the transaction and
/// says so, as Redis's `execCommandAbort` (whether or not in MULTI).
#[cold]
fn reject(ctx: &mut Ctx, r: &mut Reply, msg: &str, spec: Option<&Spec>) {
    WorkerStats::bump(&ctx.stats.rejected_calls, 1);
    if spec.is_some_and(|s| s.name == "exec") {
        multi::abort(ctx);
        let why = msg.strip_prefix("ERR ").unwrap_or(msg);
        r.error(&format!(
            "EXECABORT Transaction discarded because of: {why}"
        ));
        return;
    }
    multi::flag_error(ctx);
    r.error(msg);
}

/// Run a checked command whose key stripes the caller (EXEC) holds.
pub fn execute_held(ctx: &mut Ctx, spec: &'static Spec, args: &[&[u8]], r: &mut Reply) {
    WorkerStats::bump(&ctx.stats.commands, 1);
    if spec.flags.contains(&"write") {
        ctx.sess.dirty = true;
    }
    if let Err(e) = (spec.run)(ctx, args, r) {
        r.error(&e.0);
    }
    signal(ctx, spec, args);
}

/// The keys of a request, by the table's (first, last, step): the
/// arguments COMMAND INFO names as keys.
pub fn key_args<'a: 'b, 'b>(
    spec: &Spec,
    args: &'b [&'a [u8]],
) -> impl Iterator<Item = &'a [u8]> + 'b {
    let (first, last, step) = spec.keys;
    let n = args.len() as i32;
    let last = if last < 0 { n + last } else { last.min(n - 1) };
    let (first, step) = (first.max(1), step.max(1));
    let count = if spec.keys.0 <= 0 || last < first {
        0
    } else {
        ((last - first) / step + 1) as usize
    };
    (0..count).map(move |i| args[(first + i as i32 * step) as usize])
}

/// Take the key stripes a request runs under (see [`crate::keylock`]):
/// exclusive for a `write` command, shared otherwise.
fn lock_keys<'s>(shared: &'s Shared, spec: &Spec, args: &[&[u8]], write: bool) -> KeyGuard<'s> {
    if spec.keys.0 <= 0 {
        if multi::is_global_writer(spec) {
            return shared.keylocks.lock_all(true);
        }
        return KeyGuard::none();
    }
    let (first, last, _) = spec.keys;
    if first == last {
        // One key (arity guarantees the argument is there).
        if let Some(k) = args.get(first as usize) {
            return shared.keylocks.lock_one(k, write);
        }
    }
    shared.keylocks.lock(key_args(spec, args), write)
}

/// Parse an integer the way Redis's `string2ll` does: optional `-`, no
/// `+`, no spaces, no leading zeros.
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    if b.is_empty() || b.len() > 20 {
        return None;
    }
    if b == b"0" {
        return Some(0);
    }
    let (neg, d) = if b[0] == b'-' {
        (true, &b[1..])
    } else {
        (false, b)
    };
    if d.is_empty() || d[0] == b'0' {
        return None;
    }
    let mut v: u64 = 0;
    for &c in d {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    if neg {
        if v > i64::MAX as u64 + 1 {
            None
        } else {
            Some((v as i64).wrapping_neg())
        }
    } else {
        i64::try_from(v).ok()
    }
}

/// An integer argument or `ERR value is not an integer or out of range`.
pub fn int_arg(b: &[u8]) -> Result<i64, CmdError> {
    parse_i64(b).ok_or(CmdError::from(NOT_INT))
}

/// Parse a float exactly as Redis's `string2d` does: C `strtod` over the
/// whole argument (so hexadecimal floats such as `0x1p4`, `inf` and
/// `infinity` are accepted), no leading space, no NaN, and no overflow to
/// infinity or underflow to zero (`ERANGE`).
pub fn parse_f64(b: &[u8]) -> Option<f64> {
    // A plain integer (scores are often member numbers) converts exactly
    // while within f64's integer range: no copy, no float parse.
    if let Some(i) = parse_i64(b) {
        if i.unsigned_abs() <= F64_EXACT_INT_MAX {
            return Some(i as f64);
        }
    }
    // C `isspace` (strtod would skip it; Redis refuses it).
    let c_space = |c: u8| c.is_ascii_whitespace() || c == 0x0b;
    if b.is_empty() || c_space(b[0]) || b.contains(&0) {
        return None;
    }
    // NUL-terminated: on the stack for ordinary arguments, else copied.
    let mut stack = [0u8; FLOAT_STACK_BYTES + 1];
    let heap: Vec<u8>;
    let c_str: &[u8] = if b.len() <= FLOAT_STACK_BYTES {
        stack[..b.len()].copy_from_slice(b);
        &stack[..=b.len()]
    } else {
        heap = [b, &[0]].concat();
        &heap
    };
    let mut end: *mut libc::c_char = std::ptr::null_mut();
    // SAFETY: `c_str` is `b` followed by a NUL (no NUL inside `b`, checked
    // above), so strtod reads a C string inside it and sets `end` to a
    // pointer into it; errno is this thread's.
    let (v, consumed, erange) = unsafe {
        *libc::__errno_location() = 0;
        let v = libc::strtod(c_str.as_ptr().cast(), &mut end);
        let erange = *libc::__errno_location() == libc::ERANGE;
        (
            v,
            end.offset_from(c_str.as_ptr().cast::<libc::c_char>()),
            erange,
        )
    };
    if consumed != b.len() as isize || v.is_nan() || (erange && (v.is_infinite() || v == 0.0)) {
        return None;
    }
    Some(v)
}

/// Float arguments up to this length are parsed from a stack copy; longer
/// ones (Redis accepts any length, e.g. many trailing zeros) from a heap
/// copy.
const FLOAT_STACK_BYTES: usize = 256;

/// Largest integer magnitude every smaller one of which an f64 holds
/// exactly (2^53).
const F64_EXACT_INT_MAX: u64 = 1 << 53;

/// True if `a` equals `b` ignoring ASCII case.
pub fn eq(a: &[u8], b: &str) -> bool {
    a.eq_ignore_ascii_case(b.as_bytes())
}

/// Is this error a lost compare-and-swap race (retry)?
pub fn is_race(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::VersionMismatch { .. } | StoreError::Exists | StoreError::NotFound
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"01"), None);
        assert_eq!(parse_i64(b"+1"), None);
        assert_eq!(parse_i64(b" 1"), None);
        assert_eq!(parse_i64(b"-0"), None);
    }

    /// The integer fast path agrees with the float parse; the special
    /// forms and the rejections hold.
    #[test]
    fn floats() {
        for t in [
            "0",
            "-0",
            "7",
            "-12",
            "1.5",
            "1e3",
            "-2.5e-3",
            "9007199254740992",
            "9007199254740993",
            "-9007199254740993",
            "9223372036854775807",
            "010",
            "+4",
            "0.1",
        ] {
            let want: f64 = t.parse().expect("a float");
            let got = parse_f64(t.as_bytes()).expect(t);
            assert_eq!(got.to_bits(), want.to_bits(), "{t}");
        }
        for (t, v) in [
            ("inf", f64::INFINITY),
            ("+Inf", f64::INFINITY),
            ("INFINITY", f64::INFINITY),
            ("-inf", f64::NEG_INFINITY),
            ("-Infinity", f64::NEG_INFINITY),
        ] {
            assert_eq!(parse_f64(t.as_bytes()), Some(v), "{t}");
        }
        for (t, v) in [
            ("0x10", 16.0),
            ("0x1p4", 16.0),
            ("-0X1.8p1", -3.0),
            (".5", 0.5),
            ("5.", 5.0),
        ] {
            assert_eq!(parse_f64(t.as_bytes()), Some(v), "{t}");
        }
        let long = format!("1.{}", "0".repeat(400));
        assert_eq!(parse_f64(long.as_bytes()), Some(1.0));
        assert_eq!(parse_f64(b"\x0b1"), None);
        for t in [
            "", " 1", "1 ", "nan", "NaN", "abc", "1x", "1e400", "-1e400", "1e-400", "1\x001",
        ] {
            assert_eq!(parse_f64(t.as_bytes()), None, "{t}");
        }
        assert_eq!(parse_f64(b"\xff1"), None);
    }

    #[test]
    fn table_is_consistent() {
        assert_eq!(
            table().buckets.iter().map(Vec::len).sum::<usize>(),
            COMMANDS.len()
        );
        assert!(lookup(b"gEt").is_some_and(|s| s.name == "get"));
        assert!(lookup(b"SeT").is_some_and(|s| s.name == "set"));
        assert!(lookup(b"ge\x14").is_none());
        assert!(lookup(b"g\xc5t").is_none());
        // Every name finds its own spec, in any case (so no name is listed
        // twice: the second would be shadowed by the first).
        for s in COMMANDS {
            assert!(std::ptr::eq(lookup(s.name.as_bytes()).unwrap(), s));
            let upper = s.name.to_ascii_uppercase();
            assert!(std::ptr::eq(lookup(upper.as_bytes()).unwrap(), s));
        }
        assert!(lookup(b"GeT").is_some());
        assert!(lookup(b"nope").is_none());
        assert!(lookup(b"").is_none());
        assert!(lookup(b"ge").is_none());
        assert!(lookup(b"gett").is_none());
        assert!(lookup("g\u{e9}t".as_bytes()).is_none());
        assert!(lookup(&[b'g'; 40]).is_none());
    }
}
