//! Clients blocked on list and sorted-set keys (BLPOP, BRPOP, BLMOVE,
//! BRPOPLPUSH, BLMPOP, BZPOPMIN, BZPOPMAX, BZMPOP), as Redis 7.0's
//! `blocked.c` does it, without its single thread.
//!
//! A blocking command first runs as its non-blocking form under its key
//! stripes. If every key is empty it registers a [`Waiter`] on each of its
//! keys (a per-key FIFO), *while still holding those stripes*, and the
//! connection task then waits on the waiter (its worker keeps serving its
//! other connections: nothing is parked but the task). A command that can
//! put elements into a list or sorted set (LPUSH, RPUSH, LINSERT, LMOVE,
//! ZADD, the STORE forms, RESTORE, RENAME, COPY, and the same inside
//! EXEC) signals its keys as ready once its own stripes are released,
//! and the signalling client serves the waiters, as Redis's
//! `handleClientsBlockedOnKeys` runs after the command that pushed:
//!
//! ```text
//!  BLPOP k 0 (worker 1): lock(k) ─ k empty ─ register W on k ─ unlock ─ task waits on W.wake
//!  LPUSH k x (worker 0): lock(k) ─ push ─ unlock ─ any waiters? ─ first WAITING waiter of k: W
//!                        lock(W's keys) ─ W: WAITING→SERVING ─ pop for W ─ W: SERVED, reply ─ unlock ─ wake W
//!  W's task (worker 1):  woken ─ SERVED ─ write the reply ─ unregister ─ next pipelined request
//! ```
//!
//! Hand-off: a push of one element onto a missing key whose first
//! waiter is a one-key BLPOP or BRPOP gives the element to the waiter
//! under the pusher's own stripe and stores nothing
//! ([`crate::commands::blocking::hand_off`]): the push and the serve
//! would leave the key missing anyway, and a queue whose consumers wait
//! (the usual job queue) then costs no list write and delete per element.
//! Not inside EXEC, whose later commands must see the element.
//!
//! Which worker waits: a TCP client whose key's stripe another worker
//! owns moves there with its registered waiter and waits on the owner
//! (see [`crate::migrate`]), where the key's hot pushers gather, so the
//! wake-up above is then a task of the pusher's own worker.
//!
//! No lost wake-up: registration happens under the key's stripe, and a
//! pusher looks for waiters only after it released the stripe, so either
//! the waiter's check saw the element or the pusher sees the waiter.
//! FIFO: the waiters of a key are served in registration order; a waiter
//! whose pop finds the key empty again (another server took the element)
//! goes back to WAITING and keeps its place. A served waiter's element is
//! popped only after its state moved from WAITING to SERVING, and a
//! connection that finds its client gone, or whose timeout fires, moves
//! it from WAITING to GONE or TIMED_OUT first, so nothing is ever popped
//! for a client that had already gone or stopped waiting.
//!
//! No global lock on the hot path: the registry is [`SHARDS`] mutexes
//! keyed by the key's hash, touched only by blocking commands that find
//! nothing and by pushers while at least one client is blocked; a push
//! with nobody blocked pays one relaxed load of [`Registry::blocked`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::resp::Proto;

/// Shards of the waiter registry (a power of two).
pub const SHARDS: usize = 64;

/// A waiter's state.
const WAITING: u8 = 0;
const SERVING: u8 = 1;
const SERVED: u8 = 2;
const GONE: u8 = 3;
const TIMED_OUT: u8 = 4;
const UNBLOCKED_TIMEOUT: u8 = 5;
const UNBLOCKED_ERROR: u8 = 6;

/// How a wait ended, as its connection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Served: the reply is in the waiter.
    Served,
    /// Timed out (or CLIENT UNBLOCK ... TIMEOUT): a null reply.
    TimedOut,
    /// CLIENT UNBLOCK ... ERROR.
    Unblocked,
    /// Still waiting (or being served right now).
    Pending,
}

/// One blocked client's command.
pub struct Waiter {
    /// The client's id (CLIENT UNBLOCK).
    pub client_id: u64,
    /// Its protocol (the served reply's encoding).
    pub proto: Proto,
    /// The command, owned (the serving client runs its pop).
    pub args: Vec<Vec<u8>>,
    /// Keys waited on, in the command's order.
    pub keys: Vec<Vec<u8>>,
    /// Stripes a serve takes: the keys, plus BLMOVE's destination.
    pub lock_keys: Vec<Vec<u8>>,
    state: AtomicU8,
    /// Wakes the waiting connection (served, unblocked).
    pub wake: Notify,
    /// The served reply.
    reply: Mutex<Vec<u8>>,
}

impl Waiter {
    /// A waiter for `args` (a blocking command) on `keys`.
    pub fn new(
        client_id: u64,
        proto: Proto,
        args: &[&[u8]],
        keys: Vec<Vec<u8>>,
        dst: Option<&[u8]>,
    ) -> Waiter {
        let mut lock_keys = keys.clone();
        if let Some(d) = dst {
            lock_keys.push(d.to_vec());
        }
        Waiter {
            client_id,
            proto,
            args: args.iter().map(|a| a.to_vec()).collect(),
            keys,
            lock_keys,
            state: AtomicU8::new(WAITING),
            wake: Notify::new(),
            reply: Mutex::new(Vec::new()),
        }
    }

    fn cas(&self, from: u8, to: u8) -> bool {
        self.state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Start serving: true if the waiter was waiting (it is now ours).
    pub fn begin_serve(&self) -> bool {
        self.cas(WAITING, SERVING)
    }

    /// Serving found nothing to pop: the waiter keeps waiting.
    pub fn abandon_serve(&self) {
        self.state.store(WAITING, Ordering::Release);
        // Its timeout may have fired meanwhile: let it look again.
        self.wake.notify_one();
    }

    /// Serving done: hand over `reply` and wake the connection.
    pub fn finish_serve(&self, reply: Vec<u8>) {
        *self.reply.lock() = reply;
        self.state.store(SERVED, Ordering::Release);
        self.wake.notify_one();
    }

    /// The served reply (once [`Outcome::Served`]).
    pub fn take_reply(&self) -> Vec<u8> {
        std::mem::take(&mut *self.reply.lock())
    }

    /// The timeout fired: stop waiting unless a serve is under way.
    pub fn time_out(&self) -> bool {
        self.cas(WAITING, TIMED_OUT)
    }

    /// The client went away: stop waiting unless a serve is under way.
    pub fn client_gone(&self) -> bool {
        self.cas(WAITING, GONE)
    }

    /// CLIENT UNBLOCK: true if the waiter was waiting.
    pub fn unblock(&self, error: bool) -> bool {
        let to = if error {
            UNBLOCKED_ERROR
        } else {
            UNBLOCKED_TIMEOUT
        };
        let ok = self.cas(WAITING, to);
        if ok {
            self.wake.notify_one();
        }
        ok
    }

    /// Is it waiting (not being served, not finished)?
    pub fn is_waiting(&self) -> bool {
        self.state.load(Ordering::Acquire) == WAITING
    }

    /// How the wait stands.
    pub fn outcome(&self) -> Outcome {
        match self.state.load(Ordering::Acquire) {
            SERVED => Outcome::Served,
            TIMED_OUT | UNBLOCKED_TIMEOUT => Outcome::TimedOut,
            UNBLOCKED_ERROR => Outcome::Unblocked,
            _ => Outcome::Pending,
        }
    }
}

type Queue = VecDeque<Arc<Waiter>>;
type Shard = CachePadded<Mutex<HashMap<Box<[u8]>, Queue>>>;

/// The waiters of every key.
pub struct Registry {
    shards: Box<[Shard]>,
    /// Clients blocked now (INFO `blocked_clients`; pushers skip the
    /// registry while it is 0).
    blocked: AtomicUsize,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

fn shard_of(key: &[u8]) -> usize {
    (nibble::hash_key(key) as usize) & (SHARDS - 1)
}

impl Registry {
    /// Nobody blocked.
    pub fn new() -> Registry {
        Registry {
            shards: (0..SHARDS).map(|_| Default::default()).collect(),
            blocked: AtomicUsize::new(0),
        }
    }

    /// Clients blocked now.
    #[inline]
    pub fn blocked(&self) -> usize {
        self.blocked.load(Ordering::Relaxed)
    }

    /// Append `w` to the queue of each of its keys. The caller holds the
    /// keys' stripes (see the module essay).
    pub fn register(&self, w: &Arc<Waiter>) {
        self.blocked.fetch_add(1, Ordering::Relaxed);
        for k in &w.keys {
            self.shards[shard_of(k)]
                .lock()
                .entry(k.as_slice().into())
                .or_default()
                .push_back(w.clone());
        }
    }

    /// Remove `w` from its keys' queues.
    pub fn unregister(&self, w: &Arc<Waiter>) {
        for k in &w.keys {
            let mut s = self.shards[shard_of(k)].lock();
            if let Some(q) = s.get_mut(k.as_slice()) {
                q.retain(|x| !Arc::ptr_eq(x, w));
                if q.is_empty() {
                    s.remove(k.as_slice());
                }
            }
        }
        self.blocked.fetch_sub(1, Ordering::Relaxed);
    }

    /// The first waiter of `key` still waiting, in FIFO order.
    pub fn first_waiting(&self, key: &[u8]) -> Option<Arc<Waiter>> {
        self.shards[shard_of(key)]
            .lock()
            .get(key)?
            .iter()
            .find(|w| w.is_waiting())
            .cloned()
    }

    /// Does anyone wait on `key`?
    pub fn has_waiters(&self, key: &[u8]) -> bool {
        self.shards[shard_of(key)].lock().contains_key(key)
    }
}

/// A registered waiter, unregistered on drop (the connection's wait ended
/// one way or another, also when the connection task is dropped).
pub struct Blocked {
    registry: Arc<Registry>,
    /// The waiter.
    pub waiter: Arc<Waiter>,
    /// When the wait times out (`None`: never).
    pub deadline: Option<std::time::Instant>,
}

impl Blocked {
    /// Register `waiter` (under its keys' stripes).
    pub fn new(
        registry: Arc<Registry>,
        waiter: Arc<Waiter>,
        deadline: Option<std::time::Instant>,
    ) -> Blocked {
        registry.register(&waiter);
        Blocked {
            registry,
            waiter,
            deadline,
        }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // A connection dropped mid-wait: nothing may be popped for it.
        self.waiter.client_gone();
        self.registry.unregister(&self.waiter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: u64, keys: &[&str]) -> Arc<Waiter> {
        Arc::new(Waiter::new(
            id,
            Proto::Resp2,
            &[b"blpop"],
            keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            None,
        ))
    }

    #[test]
    fn fifo_per_key_and_unregister_on_drop() {
        let reg = Arc::new(Registry::new());
        let a = Blocked::new(reg.clone(), waiter(1, &["k", "j"]), None);
        let b = Blocked::new(reg.clone(), waiter(2, &["k"]), None);
        assert_eq!(reg.blocked(), 2);
        assert_eq!(reg.first_waiting(b"k").unwrap().client_id, 1);
        assert!(a.waiter.begin_serve());
        // Being served: the next one is first.
        assert_eq!(reg.first_waiting(b"k").unwrap().client_id, 2);
        a.waiter.abandon_serve();
        assert_eq!(reg.first_waiting(b"k").unwrap().client_id, 1);
        assert!(a.waiter.time_out());
        assert!(!a.waiter.begin_serve());
        assert_eq!(a.waiter.outcome(), Outcome::TimedOut);
        drop(a);
        assert!(!reg.has_waiters(b"j"));
        assert_eq!(reg.first_waiting(b"k").unwrap().client_id, 2);
        assert!(b.waiter.unblock(true));
        assert_eq!(b.waiter.outcome(), Outcome::Unblocked);
        drop(b);
        assert_eq!(reg.blocked(), 0);
        assert!(!reg.has_waiters(b"k"));
    }

    #[test]
    fn gone_client_is_never_served() {
        let reg = Arc::new(Registry::new());
        let a = Blocked::new(reg.clone(), waiter(1, &["k"]), None);
        assert!(a.waiter.client_gone());
        assert!(!a.waiter.begin_serve());
        assert!(reg.first_waiting(b"k").is_none());
    }
}
