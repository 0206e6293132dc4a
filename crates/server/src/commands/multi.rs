//! Transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH, and RESET.
//!
//! MULTI switches the connection into queueing: dispatch
//! ([`super::execute`]) still looks every command up and checks its arity
//! and authentication, answers `+QUEUED` and stores an owned copy of the
//! arguments. A command refused there (unknown, wrong arity, NOAUTH, a
//! RESP2 subscriber's forbidden command) flags the transaction, and EXEC
//! then answers `-EXECABORT Transaction discarded because of previous
//! errors.` and runs nothing, as Redis 7 does. Errors a command meets
//! while it runs (WRONGTYPE, not an integer) are its own element of
//! EXEC's reply array; the others still run.
//!
//! Atomicity without a global lock. Dispatch runs every command under the
//! key stripes of its keys (see [`crate::keylock`]). EXEC takes, in one
//! ordered acquisition ([`KeyLocks::lock_modes`]), the stripes of every
//! queued command's keys (exclusive where any of them writes) plus those
//! of the watched keys (shared), then runs the queue through
//! [`super::execute_held`], which skips dispatch's own locking (the locks
//! are not reentrant). No other client's command on those keys can run in
//! between, on any worker or protocol: memcached writes take the same
//! stripes. EXECs on disjoint keys run in parallel.
//!
//! ```text
//!   EXEC: lock(stripes of queue ∪ watched) ── watched versions unchanged? ── run queue ── unlock (+1 per write stripe)
//!                                                        └─ no: null array, nothing bumped
//! ```
//!
//! Commands whose keys the table does not name (K0). The connection and
//! server group (PING, ECHO, INFO, CONFIG, CLIENT, TIME, DBSIZE, ...) run
//! inside EXEC with no stripe: they touch no key; so do the pub/sub
//! commands. FLUSHALL, FLUSHDB and
//! DEBUG (POPULATE) take every stripe exclusively even outside EXEC
//! (FLUSHALL is a barrier against every other keyed command), and any
//! other K0 command (KEYS, SCAN, RANDOMKEY, OBJECT, and commands with a
//! `numkeys` argument that lock their keys themselves through
//! [`Ctx::lock`]) makes EXEC take every stripe, shared, or exclusive if
//! anything queued writes. With every stripe held, the bumps are explicit:
//! each queued write bumps its keys' stripes, FLUSHALL the stripes of the
//! keys it deleted.
//!
//! WATCH records, for each key, its stripe's version and, if the key has
//! a TTL, its expiry time. EXEC is dirty (null array) if a version moved
//! (a write to the key, or a false positive from another key of the
//! stripe) or if a watched key that was live at WATCH has expired since,
//! which is what Redis 7 checks. FLUSHALL counts as a write to the keys
//! it deleted only, as in Redis 7.
//!
//! RESET (here because it ends both kinds of connection state): discards
//! the transaction, forgets watches, leaves every channel and pattern,
//! returns to RESP2, clears the name, and re-requires AUTH when a password
//! is set.

use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::{key_args, CmdResult, Ctx, Spec};
use crate::keylock::{KeyGuard, KeyLocks};
use crate::resp::{Proto, Reply};

/// EXEC after a queueing error.
pub const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";

/// A transaction being queued. The arguments of every queued command are
/// copied back to back into one buffer, so queueing a command allocates
/// nothing once the session's buffers have grown (the state of the last
/// transaction is kept for the next one, see `SPARE_DATA_BYTES`).
#[derive(Default)]
pub struct MultiState {
    /// Every queued argument, back to back.
    data: Vec<u8>,
    /// The end offset in `data` of each queued argument, in order.
    ends: Vec<usize>,
    /// Commands, in order.
    queue: Vec<Queued>,
    /// A command was refused while queueing: EXEC aborts.
    failed: bool,
}

struct Queued {
    spec: &'static Spec,
    /// Index in `ends` one past the command's last argument (its first
    /// is the previous command's end).
    args_end: usize,
}

/// A session keeps the buffers of its last transaction for the next one
/// while they hold at most this many argument bytes (and
/// [`SPARE_COMMANDS`] commands of [`SPARE_ARGS`] arguments); larger ones
/// are freed.
const SPARE_DATA_BYTES: usize = 4 << 10;
/// See [`SPARE_DATA_BYTES`].
const SPARE_COMMANDS: usize = 64;
/// See [`SPARE_DATA_BYTES`].
const SPARE_ARGS: usize = 256;

/// The arguments of one queued command (inline for up to 8).
type Args<'a> = SmallVec<[&'a [u8]; 8]>;

impl MultiState {
    fn push(&mut self, spec: &'static Spec, args: &[&[u8]]) {
        for a in args {
            self.data.extend_from_slice(a);
            self.ends.push(self.data.len());
        }
        self.queue.push(Queued {
            spec,
            args_end: self.ends.len(),
        });
    }

    /// The arguments of queued command `i`.
    fn args(&self, i: usize) -> Args<'_> {
        let lo = if i == 0 {
            0
        } else {
            self.queue[i - 1].args_end
        };
        let mut start = if lo == 0 { 0 } else { self.ends[lo - 1] };
        let mut out = Args::new();
        for &end in &self.ends[lo..self.queue[i].args_end] {
            out.push(&self.data[start..end]);
            start = end;
        }
        out
    }

    /// Empty, for the session's next transaction; `None` if its buffers
    /// are too large to keep.
    fn into_spare(mut self) -> Option<MultiState> {
        if self.data.capacity() > SPARE_DATA_BYTES
            || self.ends.capacity() > SPARE_ARGS
            || self.queue.capacity() > SPARE_COMMANDS
        {
            return None;
        }
        self.data.clear();
        self.ends.clear();
        self.queue.clear();
        self.failed = false;
        Some(self)
    }
}

/// One watched key.
pub struct Watched {
    key: Vec<u8>,
    stripe: usize,
    version: u64,
    /// The key's expiry at WATCH time, if it was live and had one.
    expiry_ms: Option<u64>,
}

/// Commands that run at once even inside MULTI (Redis's list).
pub fn runs_in_multi(spec: &Spec) -> bool {
    matches!(
        spec.name,
        "exec" | "discard" | "multi" | "watch" | "quit" | "reset"
    )
}

/// K0 commands that touch every key: they take every stripe exclusively.
pub fn is_global_writer(spec: &Spec) -> bool {
    matches!(spec.name, "flushall" | "flushdb" | "debug")
}

/// K0 commands that touch no key at all and need no stripe inside EXEC.
fn keyless(spec: &Spec) -> bool {
    matches!(
        spec.group,
        "connection" | "server" | "pubsub" | "transactions"
    ) && !is_global_writer(spec)
}

fn writes(spec: &Spec) -> bool {
    spec.flags.contains(&"write") || is_global_writer(spec)
}

/// Mark the transaction (if any) as failed: a command was refused.
pub fn flag_error(ctx: &mut Ctx) {
    if let Some(m) = &mut ctx.sess.multi {
        m.failed = true;
    }
}

/// Discard the transaction (if any) and the watches: an EXEC refused
/// before it ran.
pub fn abort(ctx: &mut Ctx) {
    end_multi(ctx);
}

/// Queue a command (dispatch checked name, arity and authentication).
pub fn queue(ctx: &mut Ctx, spec: &'static Spec, args: &[&[u8]], r: &mut Reply) {
    if let Some(m) = &mut ctx.sess.multi {
        m.push(spec, args);
        ctx.sess
            .info
            .multi
            .store(m.queue.len() as i64, Ordering::Relaxed);
    }
    r.simple("QUEUED");
}

/// MULTI.
pub fn multi(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if ctx.sess.multi.is_some() {
        return Err("ERR MULTI calls can not be nested".into());
    }
    ctx.sess.multi = Some(ctx.sess.multi_spare.take().unwrap_or_default());
    ctx.sess.info.multi.store(0, Ordering::Relaxed);
    r.ok();
    Ok(())
}

/// Leave MULTI (if in it) and forget watched keys.
fn end_multi(ctx: &mut Ctx) -> Option<MultiState> {
    unwatch_all(ctx);
    ctx.sess.info.multi.store(-1, Ordering::Relaxed);
    ctx.sess.multi.take()
}

/// Keep a finished transaction's buffers for the session's next MULTI.
fn recycle(ctx: &mut Ctx, m: MultiState) {
    ctx.sess.multi_spare = m.into_spare();
}

fn unwatch_all(ctx: &mut Ctx) {
    ctx.sess.watched.clear();
    ctx.sess.info.watch.store(0, Ordering::Relaxed);
}

/// DISCARD.
pub fn discard(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if ctx.sess.multi.is_none() {
        return Err("ERR DISCARD without MULTI".into());
    }
    if let Some(m) = end_multi(ctx) {
        recycle(ctx, m);
    }
    r.ok();
    Ok(())
}

/// WATCH key [key ...]. Dispatch holds the keys' stripes (shared), so the
/// versions read are those of the last completed writes.
pub fn watch(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if ctx.sess.multi.is_some() {
        return Err("ERR WATCH inside MULTI is not allowed".into());
    }
    for &key in &a[1..] {
        if ctx.sess.watched.iter().any(|w| w.key == key) {
            continue;
        }
        let stripe = KeyLocks::stripe_of(key);
        let version = ctx.shared.keylocks.version(stripe);
        let expiry_ms = ctx.store().meta(key)?.and_then(|m| m.expiry_ms);
        ctx.sess.watched.push(Watched {
            key: key.to_vec(),
            stripe,
            version,
            expiry_ms,
        });
    }
    ctx.sess
        .info
        .watch
        .store(ctx.sess.watched.len() as u32, Ordering::Relaxed);
    r.ok();
    Ok(())
}

/// UNWATCH.
pub fn unwatch(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    unwatch_all(ctx);
    r.ok();
    Ok(())
}

/// EXEC.
pub fn exec(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if ctx.sess.multi.is_none() {
        return Err("ERR EXEC without MULTI".into());
    }
    let watched = std::mem::take(&mut ctx.sess.watched);
    let Some(m) = end_multi(ctx) else {
        return Ok(());
    };
    if m.failed {
        recycle(ctx, m);
        return Err(EXECABORT.into());
    }
    let shared = ctx.shared;
    let locks = &shared.keylocks;
    // Every stripe if some queued command's keys are unknown to the table.
    let all = m
        .queue
        .iter()
        .any(|q| q.spec.keys.0 <= 0 && !keyless(q.spec));
    let argv: SmallVec<[Args; 4]> = (0..m.queue.len()).map(|i| m.args(i)).collect();
    let mut guard: KeyGuard = if all {
        locks.lock_all(m.queue.iter().any(|q| writes(q.spec)))
    } else {
        let keys: SmallVec<[(&[u8], bool); 8]> = m
            .queue
            .iter()
            .zip(&argv)
            .flat_map(|(q, args)| {
                let w = writes(q.spec);
                key_args(q.spec, args).map(move |k| (k, w))
            })
            .chain(watched.iter().map(|w| (w.key.as_slice(), false)))
            .collect();
        locks.lock_modes(keys)
    };
    let now = crate::state::unix_ms();
    let dirty = watched
        .iter()
        .any(|w| locks.version(w.stripe) != w.version || w.expiry_ms.is_some_and(|t| t <= now));
    if dirty {
        guard.disarm();
        r.null_array();
        drop(argv);
        recycle(ctx, m);
        return Ok(());
    }
    r.array(m.queue.len());
    ctx.sess.exec_all = all;
    ctx.sess.in_exec = true;
    for (q, args) in m.queue.iter().zip(&argv) {
        super::execute_held(ctx, q.spec, args, r);
        if all && q.spec.flags.contains(&"write") {
            for k in key_args(q.spec, args) {
                locks.bump_held(k);
            }
        }
    }
    ctx.sess.exec_all = false;
    ctx.sess.in_exec = false;
    drop(guard);
    drop(argv);
    recycle(ctx, m);
    Ok(())
}

/// RESET.
pub fn reset(ctx: &mut Ctx, _a: &[&[u8]], r: &mut Reply) -> CmdResult {
    end_multi(ctx);
    crate::commands::pubsub::leave_all(ctx);
    ctx.sess.proto = Proto::Resp2;
    r.proto = Proto::Resp2;
    ctx.sess.info.resp.store(2, Ordering::Relaxed);
    ctx.sess.authed = ctx.shared.settings.password().is_none();
    ctx.sess
        .info
        .text
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .name
        .clear();
    r.simple("RESET");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every queued command's arguments come back as they were
        /// queued, empty arguments and all, and a recycled state is
        /// empty (or freed when it grew past the spare limits).
        #[test]
        fn queued_arguments_round_trip(
            cmds in prop::collection::vec(
                prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..10),
                0..100,
            )
        ) {
            let spec = super::super::lookup(b"set").unwrap();
            let mut m = MultiState::default();
            for c in &cmds {
                let args: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
                m.push(spec, &args);
            }
            prop_assert_eq!(m.queue.len(), cmds.len());
            for (i, c) in cmds.iter().enumerate() {
                let got: Vec<&[u8]> = m.args(i).to_vec();
                let want: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
                prop_assert_eq!(got, want);
            }
            let big = m.data.capacity() > SPARE_DATA_BYTES
                || m.ends.capacity() > SPARE_ARGS
                || m.queue.capacity() > SPARE_COMMANDS;
            match m.into_spare() {
                Some(s) => {
                    prop_assert!(!big);
                    prop_assert!(s.data.is_empty() && s.ends.is_empty() && s.queue.is_empty());
                    prop_assert!(!s.failed);
                }
                None => prop_assert!(big),
            }
        }
    }
}
