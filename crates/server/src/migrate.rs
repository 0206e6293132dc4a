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
//! stripes), while it must close, while a memcached value is being
//! skipped, or while a blocking command waits (that wait is inside a
//! batch, so by the batch's end it is over). TLS and Unix-socket
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

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

/// Contended acquisitions of one foreign-owned stripe that move a
/// connection.
pub const MOVE_AFTER_CONTENDED: u32 = 2;

/// Batches over which those contended acquisitions must fall.
pub const WINDOW_BATCHES: u32 = 64;

/// Least time a moved connection stays on its new worker before it may
/// move again.
pub const MIN_STAY_MS: u64 = 200;

/// The worker that owns `stripe` among `workers`.
#[inline]
pub fn owner_of(stripe: usize, workers: usize) -> usize {
    stripe % workers.max(1)
}

/// One connection's record of the stripes it contended on.
pub struct Affinity {
    /// The foreign-owned stripe it contended on last.
    stripe: usize,
    /// Contended acquisitions of `stripe` in the current window.
    hits: u32,
    /// Batches since the window opened.
    batches: u32,
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
            moved_at,
        }
    }

    /// Account one batch run on worker `here` of `workers`, in which
    /// `contended` = (last stripe, count) acquisitions were contended;
    /// the worker to move to, if the connection should.
    pub fn after_batch(
        &mut self,
        contended: Option<(usize, u32)>,
        here: usize,
        workers: usize,
    ) -> Option<usize> {
        self.batches = self.batches.saturating_add(1);
        if self.batches > WINDOW_BATCHES {
            self.hits = 0;
            self.batches = 0;
        }
        let (stripe, n) = contended?;
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
        if self.hits < MOVE_AFTER_CONTENDED {
            return None;
        }
        if self
            .moved_at
            .is_some_and(|t| t.elapsed() < Duration::from_millis(MIN_STAY_MS))
        {
            return None;
        }
        Some(owner)
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

    /// Stripe 7 is owned by worker 1 of 2.
    #[test]
    fn moves_after_repeated_contention_on_a_foreign_stripe() {
        let mut a = Affinity::new(None);
        assert_eq!(a.after_batch(None, 0, 2), None);
        assert_eq!(a.after_batch(Some((7, 1)), 0, 2), None);
        assert_eq!(a.after_batch(None, 0, 2), None);
        assert_eq!(a.after_batch(Some((7, 1)), 0, 2), Some(1));
    }

    #[test]
    fn own_stripes_and_scattered_stripes_do_not_move() {
        let mut a = Affinity::new(None);
        for i in 0..1000 {
            // Own stripe (even on worker 0 of 2): never a move.
            assert_eq!(a.after_batch(Some((6, 5)), 0, 2), None);
            // A different foreign stripe each time: never two hits.
            assert_eq!(a.after_batch(Some((2 * i + 1, 1)), 0, 2), None);
        }
    }

    #[test]
    fn hits_outside_the_window_do_not_add_up() {
        let mut a = Affinity::new(None);
        assert_eq!(a.after_batch(Some((7, 1)), 0, 2), None);
        for _ in 0..WINDOW_BATCHES {
            assert_eq!(a.after_batch(None, 0, 2), None);
        }
        assert_eq!(a.after_batch(Some((7, 1)), 0, 2), None);
        assert_eq!(a.after_batch(Some((7, 1)), 0, 2), Some(1));
    }

    #[test]
    fn a_moved_connection_stays_its_minimum() {
        let mut a = Affinity::new(Some(Instant::now()));
        assert_eq!(a.after_batch(Some((7, 5)), 0, 2), None);
        let mut b = Affinity::new(Some(Instant::now() - Duration::from_millis(MIN_STAY_MS)));
        assert_eq!(b.after_batch(Some((7, 5)), 0, 2), Some(1));
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
