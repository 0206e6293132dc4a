//! Key affinity: a connection whose commands keep meeting another worker
//! on one key's stripe moves to the worker that owns that stripe.
//!
//! Workers are one per CPU (see [`crate::worker`]) and a connection runs
//! on the worker that accepted it, so 50 clients of one hot key are
//! spread over every worker, and every worker executes commands on that
//! key. On a machine whose CPUs the clients share (2 vCPUs, the client
//! beside the server), a worker that holds the key's stripe
//! ([`crate::keylock`]) is descheduled for a time slice now and then, and
//! the other worker spins and parks behind it: p99 2-5x redis-server's,
//! whose one thread owns every key. Redis and Dragonfly make one thread
//! the owner of a key; here the owner is a function of the stripe,
//! [`owner_of`] = stripe mod workers, and connections go to the key
//! rather than the key to a connection:
//!
//! ```text
//!   worker 0 (owns stripe 6)            worker 1
//!   conn A: LPUSH q  ── lock(6) ──┐     conn B: LPUSH q ── lock(6): busy, spin (contended: stripe 6)
//!                                 │     end of B's batch: Affinity sees 2 contended takes of
//!                                 │       stripe 6 in its window, owner_of(6) = 0 != 1
//!                                 │     B: flush replies ── into_std (leave worker 1's epoll)
//!   lane 0 ◄──────────────────────┴──────── Migrant { socket, session, buffers }
//!   from_std (join worker 0's epoll) ── B's task resumes: next read, next batch
//! ```
//!
//! Detection costs the hot path nothing new: a stripe acquisition that
//! fails its first `try_lock` already takes the cold spin path, which now
//! also records the stripe in a thread-local ([`crate::keylock::take_contended`]);
//! the connection clears it before each batch, reads it after, and feeds
//! [`Affinity`]. A connection moves after [`MOVE_AFTER_CONTENDED`]
//! contended acquisitions of one stripe owned by another worker within
//! [`WINDOW_BATCHES`] of its batches. Loads over many keys almost never
//! contend twice on one stripe (4096 stripes), so their connections stay
//! where the kernel's `SO_REUSEPORT` hash put them and keep every worker
//! busy; the clients of one hot key end up on one worker, which then
//! serves them as redis-server does, the others idle.
//!
//! Hot stripes move connections sooner. Every contended batch also adds
//! its count to the stripe's [`Heat`]: contended acquisitions by all
//! connections in the current and the last [`HEAT_WINDOW_MS`] window. A
//! stripe with [`HOT_CONTENDED`] of them is hot (hundreds of contentions
//! a second, which many keys spread over 4096 stripes never reach), and
//! then one contention moves a connection, and a new connection moves in
//! its first [`PLACE_BATCHES`] batches, without contending at all, when
//! its batch's first key falls on a hot stripe of another worker (the key
//! by the command table, looked up for those batches only). So when 50
//! clients start on one key, the first few contentions heat the stripe
//! and the rest move on their first batch or first contention, where the
//! two-contention rule alone made each meet the other worker twice.
//!
//! Blocked clients wait on their key's owner. A blocking command (BLPOP
//! and its kin, [`crate::blocking`]) that finds nothing registers its
//! waiter on the worker it runs on; if that is not the owner of its first
//! key's stripe, the batch stops there and the connection moves to the
//! owner with the waiter ([`Affinity::on_block`]), and waits there. Its
//! reply, and the requests it pipelined behind the blocking one, follow
//! on the owner. A queue's pushers gather on the owner (they contend on
//! the key), so the push that serves the waiter wakes a task of its own
//! worker: no cross-worker wake-up, no second CPU woken per element. The
//! wait may end while the connection is in transit (served, timed out,
//! CLIENT UNBLOCK): the waiter is shared, and the owner looks at its
//! state before it waits. A blocked client does not move sooner than
//! [`MIN_STAY_MS`] after its last move either.
//!
//! Ping-pong: a connection only ever moves to the owner of the stripe it
//! contended on, and the owner's own connections never move for that
//! stripe, so one hot key settles after one move per client. A client
//! that alternates between two hot keys of different owners could chase
//! them; after a move it stays at least [`MIN_STAY_MS`] before the next.
//!
//! What moves, and when. The move happens between two batches, never
//! inside one: the batch's replies are written first (directly, not
//! deferred to the end of the loop turn, see [`crate::outq`]), so no byte
//! of the client's stream is left on the old worker; what remains in the
//! input buffer is an incomplete request, which travels with the
//! connection. The session travels whole ([`crate::conn::Carry`]):
//! authentication, RESP version, client name, a MULTI queue (EXEC then
//! runs on the new worker; atomicity comes from the stripes, not from the
//! thread), WATCH records (stripe versions, global). A connection does not
//! move while it is subscribed (its mailbox wakes its task, and it takes no
//! stripes), while it must close, or while a memcached value is being
//! skipped; a blocking command that waits moves with its waiter (above)
//! or not at all, its wait then being part of the batch. TLS and Unix-socket
//! connections never move (only a TCP socket is handed over).
//!
//! The hand-over is tokio's `into_std` (deregister from this runtime's
//! epoll; the socket and anything the kernel buffered stay as they are)
//! and `from_std` on the new worker, whose epoll reports at once whatever
//! arrived meanwhile. Each worker has a lane, an unbounded channel that
//! a task of that worker drains; sending costs no lock. The client's
//! entry in the per-worker client registries (CLIENT LIST, maxclients
//! accounting) moves with it ([`crate::worker`]'s `ClientGuard::rehome`).
//! Shutdown: a migrant that arrives after its new worker stopped reading
//! its lane is dropped with the lane, which closes its socket and
//! unregisters it; one that arrives earlier is served until the worker's
//! stop signal, like any connection.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::keylock::KEY_LOCK_STRIPES;

/// Contended acquisitions of one foreign-owned stripe that move a
/// connection.
pub const MOVE_AFTER_CONTENDED: u32 = 2;

/// Batches over which those contended acquisitions must fall.
pub const WINDOW_BATCHES: u32 = 64;

/// Least time a moved connection stays on its new worker before it may
/// move again.
pub const MIN_STAY_MS: u64 = 200;

/// Length of one window of a stripe's heat.
pub const HEAT_WINDOW_MS: u64 = 10;

/// Contended acquisitions of a stripe, by all connections, within one
/// heat window (this one or the last) that make it hot.
pub const HOT_CONTENDED: u32 = 8;

/// How long a stripe stays gathered on its owner after it was last hot:
/// CPU steering does not move a connection whose key is on such a stripe
/// away from the stripe's owner ([`Heat::gathered`]).
pub const GATHERED_MS: u64 = 10_000;

/// A connection's first batches, in which it is placed by the stripe of
/// its batch's first key when that stripe is hot.
pub const PLACE_BATCHES: u32 = 8;

/// The worker that owns `stripe` among `workers`.
#[inline]
pub fn owner_of(stripe: usize, workers: usize) -> usize {
    stripe % workers.max(1)
}

/// How hot each stripe is: contended acquisitions of it, by every
/// connection of every worker, in the current and the last window of
/// [`HEAT_WINDOW_MS`]. Written only by connections whose batch
/// contended, read by those and by new connections ([`PLACE_BATCHES`]):
/// never on an uncontended command's path.
pub struct Heat {
    epoch: Instant,
    /// Per stripe: window number (high 32 bits), the last window's count
    /// (bits 16..32), the current window's count (bits 0..16).
    stripes: Box<[AtomicU64]>,
    /// Per stripe: 1 + the window in which it was last seen hot (0:
    /// never).
    hot_at: Box<[AtomicU32]>,
}

impl Default for Heat {
    fn default() -> Self {
        Heat::new()
    }
}

fn pack(window: u32, last: u32, cur: u32) -> u64 {
    (u64::from(window) << 32) | (u64::from(last.min(0xffff)) << 16) | u64::from(cur.min(0xffff))
}

/// The (last, current) counts of `v` as seen in window `now`.
fn counts(v: u64, now: u32) -> (u32, u32) {
    let (w, last, cur) = (
        (v >> 32) as u32,
        ((v >> 16) & 0xffff) as u32,
        (v & 0xffff) as u32,
    );
    match now.wrapping_sub(w) {
        0 => (last, cur),
        1 => (cur, 0),
        _ => (0, 0),
    }
}

impl Heat {
    /// Every stripe cold.
    pub fn new() -> Heat {
        Heat {
            epoch: Instant::now(),
            stripes: (0..KEY_LOCK_STRIPES).map(|_| AtomicU64::new(0)).collect(),
            hot_at: (0..KEY_LOCK_STRIPES).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn window(&self) -> u32 {
        (self.epoch.elapsed().as_millis() as u64 / HEAT_WINDOW_MS) as u32
    }

    /// Add `n` contended acquisitions of `stripe`; is it hot now?
    pub fn note(&self, stripe: usize, n: u32) -> bool {
        let Some(a) = self.stripes.get(stripe) else {
            return false;
        };
        let now = self.window();
        let mut v = a.load(Ordering::Relaxed);
        loop {
            let (last, cur) = counts(v, now);
            let cur = cur.saturating_add(n);
            match a.compare_exchange_weak(
                v,
                pack(now, last, cur),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    let hot = last.max(cur) >= HOT_CONTENDED;
                    if hot {
                        if let Some(h) = self.hot_at.get(stripe) {
                            h.store(now.wrapping_add(1), Ordering::Relaxed);
                        }
                    }
                    return hot;
                }
                Err(x) => v = x,
            }
        }
    }

    /// Was `stripe` hot within the last [`GATHERED_MS`]? Its clients
    /// have then gathered on its owner, and stopped contending there.
    pub fn gathered(&self, stripe: usize) -> bool {
        let Some(h) = self.hot_at.get(stripe) else {
            return false;
        };
        let at = h.load(Ordering::Relaxed);
        at != 0
            && u64::from(self.window().wrapping_sub(at.wrapping_sub(1)))
                <= GATHERED_MS / HEAT_WINDOW_MS
    }

    /// Is `stripe` hot (see [`HOT_CONTENDED`])?
    pub fn is_hot(&self, stripe: usize) -> bool {
        let Some(a) = self.stripes.get(stripe) else {
            return false;
        };
        let (last, cur) = counts(a.load(Ordering::Relaxed), self.window());
        last.max(cur) >= HOT_CONTENDED
    }
}

/// One connection's record of the stripes it contended on.
pub struct Affinity {
    /// The foreign-owned stripe it contended on last.
    stripe: usize,
    /// Contended acquisitions of `stripe` in the current window.
    hits: u32,
    /// Batches since the window opened.
    batches: u32,
    /// Batches run on this worker, up to [`PLACE_BATCHES`].
    placed: u32,
    /// When the connection last moved (none: never).
    moved_at: Option<Instant>,
}

impl Affinity {
    /// A connection that arrived at its worker `moved_at` (a move), or
    /// was accepted there (`None`).
    pub fn new(moved_at: Option<Instant>) -> Affinity {
        Affinity {
            stripe: usize::MAX,
            hits: 0,
            batches: 0,
            placed: 0,
            moved_at,
        }
    }

    /// Is the connection still to be placed by its first key? A new one,
    /// in its first [`PLACE_BATCHES`] batches; not one that moved here.
    #[inline]
    pub fn placing(&self) -> bool {
        self.moved_at.is_none() && self.placed < PLACE_BATCHES
    }

    /// May it move now (it stayed [`MIN_STAY_MS`] since its last move)?
    fn may_move(&self) -> bool {
        self.moved_at
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(MIN_STAY_MS))
    }

    /// Account one batch run on worker `here` of `workers`, in which
    /// `contended` = (last stripe, count) acquisitions were contended and
    /// whose first key has stripe `first` (given while [`Self::placing`]);
    /// the worker to move to and the stripe it is chosen for, if the
    /// connection should move: the owner of a foreign stripe it contended
    /// on [`MOVE_AFTER_CONTENDED`] times in [`WINDOW_BATCHES`], or once if
    /// the stripe is hot; or, while it is being placed, the owner of its
    /// first key's stripe if that is hot.
    pub fn after_batch(
        &mut self,
        contended: Option<(usize, u32)>,
        first: Option<usize>,
        here: usize,
        workers: usize,
        heat: &Heat,
    ) -> Option<(usize, usize)> {
        self.batches = self.batches.saturating_add(1);
        self.placed = self.placed.saturating_add(1);
        if self.batches > WINDOW_BATCHES {
            self.hits = 0;
            self.batches = 0;
        }
        let to = match contended {
            Some((stripe, n)) => {
                let owner = owner_of(stripe, workers);
                if owner == here {
                    return None;
                }
                if stripe != self.stripe {
                    self.stripe = stripe;
                    self.hits = 0;
                    self.batches = 0;
                }
                self.hits = self.hits.saturating_add(n);
                let hot = heat.note(stripe, n);
                (hot || self.hits >= MOVE_AFTER_CONTENDED).then_some((owner, stripe))
            }
            None => first
                .filter(|&s| owner_of(s, workers) != here && heat.is_hot(s))
                .map(|s| (owner_of(s, workers), s)),
        };
        to.filter(|_| self.may_move())
    }

    /// A blocking command of this connection, on worker `here` of
    /// `workers`, waits on a key of stripe `stripe`: the worker to wait
    /// on instead, the stripe's owner, where the key's pushers gather
    /// once it is hot, and whose pushes then wake the waiter without a
    /// cross-worker wake-up.
    pub fn on_block(&self, stripe: usize, here: usize, workers: usize) -> Option<usize> {
        let owner = owner_of(stripe, workers);
        (owner != here && self.may_move()).then_some(owner)
    }
}

/// The per-worker lanes that moving connections travel on; `T` is the
/// connection in transit (`worker::Migrant`).
pub struct Lanes<T> {
    tx: Vec<mpsc::UnboundedSender<T>>,
    /// Each worker takes its receiver once, at start.
    rx: Mutex<Vec<Option<mpsc::UnboundedReceiver<T>>>>,
}

impl<T> Lanes<T> {
    /// One lane per worker.
    pub fn new(workers: usize) -> Lanes<T> {
        let (tx, rx) = (0..workers)
            .map(|_| {
                let (t, r) = mpsc::unbounded_channel();
                (t, Some(r))
            })
            .unzip();
        Lanes {
            tx,
            rx: Mutex::new(rx),
        }
    }

    /// Worker `w`'s end of its lane (`None` if already taken).
    pub fn take_receiver(&self, w: usize) -> Option<mpsc::UnboundedReceiver<T>> {
        self.rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(w)?
            .take()
    }

    /// Send `m` to worker `w`; `Err(m)` if that worker no longer reads its
    /// lane (it stopped) or does not exist.
    pub fn send(&self, w: usize, m: T) -> Result<(), T> {
        match self.tx.get(w) {
            Some(t) => t.send(m).map_err(|e| e.0),
            None => Err(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a.after_batch` on worker 0 of 2 with no first key.
    fn batch(a: &mut Affinity, c: Option<(usize, u32)>, h: &Heat) -> Option<usize> {
        a.after_batch(c, None, 0, 2, h).map(|(w, _)| w)
    }

    #[test]
    fn a_stripe_once_hot_stays_gathered() {
        let h = Heat::new();
        assert!(!h.gathered(5));
        for _ in 0..HOT_CONTENDED {
            h.note(5, 1);
        }
        assert!(h.is_hot(5));
        assert!(h.gathered(5));
        assert!(!h.gathered(6));
    }

    /// Stripe 7 is owned by worker 1 of 2.
    #[test]
    fn moves_after_repeated_contention_on_a_foreign_stripe() {
        let h = Heat::new();
        let mut a = Affinity::new(None);
        assert_eq!(batch(&mut a, None, &h), None);
        assert_eq!(batch(&mut a, Some((7, 1)), &h), None);
        assert_eq!(batch(&mut a, None, &h), None);
        assert_eq!(batch(&mut a, Some((7, 1)), &h), Some(1));
    }

    #[test]
    fn own_stripes_and_scattered_stripes_do_not_move() {
        let h = Heat::new();
        let mut a = Affinity::new(None);
        for i in 0..1000 {
            // Own stripe (even on worker 0 of 2): never a move.
            assert_eq!(batch(&mut a, Some((6, 5)), &h), None);
            // A different foreign stripe each time: never two hits, and
            // no stripe gets hot.
            assert_eq!(batch(&mut a, Some((2 * i + 1, 1)), &h), None);
        }
        assert!(!h.is_hot(6), "own-stripe contention is not counted");
    }

    #[test]
    fn hits_outside_the_window_do_not_add_up() {
        let h = Heat::new();
        let mut a = Affinity::new(None);
        assert_eq!(batch(&mut a, Some((7, 1)), &h), None);
        for _ in 0..WINDOW_BATCHES {
            assert_eq!(batch(&mut a, None, &h), None);
        }
        assert_eq!(batch(&mut a, Some((7, 1)), &h), None);
        assert_eq!(batch(&mut a, Some((7, 1)), &h), Some(1));
    }

    #[test]
    fn a_moved_connection_stays_its_minimum() {
        let h = Heat::new();
        let mut a = Affinity::new(Some(Instant::now()));
        assert_eq!(batch(&mut a, Some((7, 5)), &h), None);
        assert_eq!(a.on_block(7, 0, 2), None);
        let mut b = Affinity::new(Some(Instant::now() - Duration::from_millis(MIN_STAY_MS)));
        assert_eq!(batch(&mut b, Some((7, 5)), &h), Some(1));
        assert_eq!(b.on_block(7, 0, 2), Some(1));
    }

    /// Other connections made stripe 9 hot: one contention moves.
    #[test]
    fn one_contention_moves_on_a_hot_stripe_only() {
        let h = Heat::new();
        let mut cold = Affinity::new(None);
        assert_eq!(batch(&mut cold, Some((9, 1)), &h), None, "cold: stays");
        for _ in 0..HOT_CONTENDED {
            h.note(9, 1);
        }
        assert!(h.is_hot(9));
        let mut a = Affinity::new(None);
        assert_eq!(batch(&mut a, Some((9, 1)), &h), Some(1), "hot: moves");
        // A hot stripe the connection's worker owns: no move.
        for _ in 0..HOT_CONTENDED {
            h.note(10, 1);
        }
        assert_eq!(batch(&mut a, Some((10, 1)), &h), None);
    }

    /// A new connection whose first key's stripe is hot and foreign
    /// moves without contending; on a cold stripe, or once placed, or
    /// after a move, it does not.
    #[test]
    fn new_connections_are_placed_by_a_hot_first_key() {
        let h = Heat::new();
        let mut a = Affinity::new(None);
        assert!(a.placing());
        assert_eq!(a.after_batch(None, Some(11), 0, 2, &h), None, "cold");
        h.note(11, HOT_CONTENDED);
        assert_eq!(a.after_batch(None, Some(11), 0, 2, &h), Some((1, 11)));
        assert_eq!(a.after_batch(None, Some(11), 1, 2, &h), None, "owner");
        for _ in 0..PLACE_BATCHES {
            a.after_batch(None, None, 0, 2, &h);
        }
        assert!(!a.placing(), "placed after its first batches");
        let moved = Affinity::new(Some(Instant::now() - Duration::from_secs(1)));
        assert!(!moved.placing(), "a moved connection is placed already");
    }

    /// Heat counts the current and the last window only.
    #[test]
    fn heat_cools_after_two_windows() {
        let h = Heat::new();
        assert!(!h.note(3, HOT_CONTENDED - 1));
        assert!(h.note(3, 1));
        // The counts as seen in their window, one and two windows later.
        let v = h.stripes[3].load(Ordering::Relaxed);
        let w = (v >> 32) as u32;
        assert_eq!(counts(v, w), (0, HOT_CONTENDED));
        assert_eq!(counts(v, w + 1), (HOT_CONTENDED, 0));
        assert_eq!(counts(v, w + 2), (0, 0));
        assert!(!h.is_hot(KEY_LOCK_STRIPES), "out of range: cold");
        assert!(!h.note(KEY_LOCK_STRIPES, 100));
    }

    /// A blocked client waits on its key's owner.
    #[test]
    fn a_blocked_client_goes_to_the_owner() {
        let a = Affinity::new(None);
        assert_eq!(a.on_block(7, 0, 2), Some(1));
        assert_eq!(a.on_block(7, 1, 2), None);
        assert_eq!(a.on_block(7, 0, 1), None, "one worker");
    }

    #[test]
    fn lanes_deliver_and_refuse_after_the_receiver_goes() {
        let l: Lanes<u32> = Lanes::new(2);
        let mut r1 = l.take_receiver(1).expect("receiver");
        assert!(l.take_receiver(1).is_none(), "taken once");
        l.send(1, 5).expect("sent");
        assert_eq!(r1.try_recv().ok(), Some(5));
        drop(r1);
        assert_eq!(l.send(1, 6), Err(6));
        assert_eq!(l.send(9, 7), Err(7));
    }
}
