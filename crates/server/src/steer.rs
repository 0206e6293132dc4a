//! CPU placement: a loopback connection moves to the worker pinned to
//! the CPU its client runs on.
//!
//! Workers are pinned, one per CPU ([`crate::worker`]), and the kernel's
//! `SO_REUSEPORT` hash puts a new connection on any of them. A client on
//! the same machine then either runs on its worker's CPU or on another
//! one, and on a small VM the two placements are two stable modes of the
//! scheduler, 2-5x apart in throughput (docs/BENCHMARKS.md, "Throughput
//! under eviction"):
//!
//! ```text
//!   same CPU (fast)                        other CPU (slow)
//!   CPU 0: client ─send─► worker 0         CPU 0: client ─send─┐   (client sleeps, CPU 0 idles)
//!          ◄─reply── (wakes client here:   CPU 1:        worker 1 ◄┘ wakes on CPU 1, replies,
//!          CPU 1 is busy with the other           sleeps; the client wakes on idle CPU 0
//!          pair, so the wakee stays)              every hand-off crosses CPUs
//! ```
//!
//! On the same CPU a hand-off is a local wake-up (the sender is about to
//! block). Across CPUs every hand-off wakes a thread on the other vCPU,
//! and while one CPU idles the scheduler keeps placing wakees on it, so
//! the cross placement sustains itself; the server then spends 2-3x the
//! CPU per command and runs a third as many batches. Which mode a run
//! falls into is decided by where the connections land and where the
//! client threads happen to be.
//!
//! The connection can follow its client: for a TCP socket the kernel
//! records the CPU that processed the last segment received
//! (`SO_INCOMING_CPU`); over loopback that is the sending thread's CPU,
//! i.e. the client's. Every [`CHECK_EVERY_BATCHES`] batches a movable
//! connection reads it; after [`MOVE_AFTER_CHECKS`] checks in a row that
//! name one CPU whose worker is another one, the connection moves there
//! through the key-affinity lanes ([`crate::migrate`]), at most once per
//! [`crate::migrate::MIN_STAY_MS`]. Only loopback peers are steered: for a
//! remote peer the CPU is the NIC queue's, and a single-queue NIC would
//! pile every connection on one worker. Only pinned workers are steered
//! to (an unpinned worker has no CPU). A client thread that drifts
//! between CPUs faster than the checks never makes three agreeing reads,
//! so its connection stays put.
//!
//! The key wins over the CPU while the connection keeps to the key. A
//! connection whose worker was chosen for a key's stripe (key affinity, a
//! blocked wait moved to the key's owner, or steering finding it on the
//! owner of a gathered stripe: `Session::bound`) is not steered while
//! its batches' first keys stay on that stripe, so the two rules never
//! move it back and forth. Each check also looks at the first key of
//! the batch just run; after [`UNBIND_AFTER_CHECKS`] checks in a row on
//! other stripes the binding ends and steering resumes. Without that, a
//! pool of connections that once served one hot queue stays on the
//! queue's worker for the rest of its life, and a later load over many
//! keys runs on one worker of two (`memlab server` phases after `blpop`:
//! 0.82-0.91x redis-server where the same phases alone reach 1.5x).

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Batches between two reads of the incoming CPU (one `getsockopt`).
pub const CHECK_EVERY_BATCHES: u32 = 16;

/// Agreeing reads, in a row, that move a connection.
pub const MOVE_AFTER_CHECKS: u32 = 3;

/// Checks in a row whose batch's first key is off the bound stripe that
/// end a connection's binding to its key.
pub const UNBIND_AFTER_CHECKS: u32 = 3;

/// `Session::bound` of a connection moved by DEBUG MIGRATE: bound for
/// good (no stripe is this large).
pub const BOUND_FIXED: usize = usize::MAX;

/// One connection's placement record.
pub struct Steer {
    /// Batches since the last read.
    batches: u32,
    /// The worker the last reads named, and how many in a row.
    target: usize,
    streak: u32,
    /// Checks in a row whose batch's first key was off the bound stripe.
    stray: u32,
}

impl Default for Steer {
    fn default() -> Self {
        Steer::new()
    }
}

impl Steer {
    /// A connection with no reads yet.
    pub fn new() -> Steer {
        Steer {
            batches: 0,
            target: usize::MAX,
            streak: 0,
            stray: 0,
        }
    }

    /// True if the next [`Self::after_batch`] reads the client's CPU (and
    /// may move the connection).
    pub fn due(&self) -> bool {
        self.batches + 1 >= CHECK_EVERY_BATCHES
    }

    /// Account one batch run on worker `here`; `bound` is the stripe the
    /// connection's worker was chosen for (cleared here once its batches
    /// keep off it), `first` the stripe of the batch's first key (needed
    /// only when [`Self::due`] was true before the batch), `incoming_cpu`
    /// reads the CPU of the client (called once per
    /// [`CHECK_EVERY_BATCHES`]), `cpu_worker[cpu]` is the worker pinned to
    /// `cpu` (`usize::MAX`: none), `moved_at` when the connection last
    /// moved. The worker to move to, if it should.
    pub fn after_batch(
        &mut self,
        here: usize,
        bound: &mut Option<usize>,
        first: Option<usize>,
        incoming_cpu: impl FnOnce() -> Option<usize>,
        cpu_worker: &[usize],
        moved_at: Option<Instant>,
    ) -> Option<usize> {
        self.batches += 1;
        if self.batches < CHECK_EVERY_BATCHES {
            return None;
        }
        self.batches = 0;
        if let Some(b) = *bound {
            // A batch without a key (PING, MULTI) says nothing either way.
            match first {
                Some(s) if s == b => self.stray = 0,
                Some(_) => self.stray += 1,
                None => {}
            }
            if b == BOUND_FIXED || self.stray < UNBIND_AFTER_CHECKS {
                return None;
            }
            *bound = None;
            self.stray = 0;
            self.streak = 0;
            self.target = usize::MAX;
        }
        let w = incoming_cpu()
            .and_then(|c| cpu_worker.get(c).copied())
            .unwrap_or(usize::MAX);
        if w == usize::MAX || w == here {
            self.streak = 0;
            self.target = usize::MAX;
            return None;
        }
        if w != self.target {
            self.target = w;
            self.streak = 0;
        }
        self.streak += 1;
        if self.streak < MOVE_AFTER_CHECKS {
            return None;
        }
        if moved_at
            .is_some_and(|t| t.elapsed() < Duration::from_millis(crate::migrate::MIN_STAY_MS))
        {
            return None;
        }
        self.streak = 0;
        Some(w)
    }
}

/// `cpu_worker[cpu]`: the worker pinned to `cpu`, `usize::MAX` where
/// none is; empty when no worker is pinned.
pub fn cpu_to_worker(worker_cpus: &[Option<usize>]) -> Vec<usize> {
    let n = worker_cpus
        .iter()
        .flatten()
        .map(|&c| c + 1)
        .max()
        .unwrap_or(0);
    let mut m = vec![usize::MAX; n];
    for (w, c) in worker_cpus.iter().enumerate() {
        if let Some(&c) = c.as_ref() {
            // Two workers on one CPU (more workers than CPUs): the first.
            if m[c] == usize::MAX {
                m[c] = w;
            }
        }
    }
    m
}

/// The CPU that processed the last segment received on socket `fd`
/// (`SO_INCOMING_CPU`); `None` where the kernel does not say.
pub fn incoming_cpu(fd: RawFd) -> Option<usize> {
    let mut cpu: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `cpu` and `len` are live locals of the sizes passed; the
    // kernel writes at most `len` bytes into `cpu`. A bad or closed `fd`
    // only makes the call fail.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_INCOMING_CPU,
            (&mut cpu as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (r == 0 && cpu >= 0).then_some(cpu as usize)
}

/// A peer address (as [`crate::state::ClientInfo`] keeps it) on loopback.
pub fn is_loopback(peer: &str) -> bool {
    peer.parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worker 0 on CPU 0, worker 1 on CPU 1.
    const MAP: [usize; 2] = [0, 1];

    fn batches(s: &mut Steer, here: usize, cpu: usize, n: u32) -> Option<usize> {
        let mut out = None;
        for _ in 0..n {
            if let Some(w) = s.after_batch(here, &mut None, None, || Some(cpu), &MAP, None) {
                out = Some(w);
            }
        }
        out
    }

    #[test]
    fn moves_to_the_worker_of_the_clients_cpu_after_agreeing_reads() {
        let mut s = Steer::new();
        let needed = CHECK_EVERY_BATCHES * MOVE_AFTER_CHECKS;
        assert_eq!(batches(&mut s, 0, 1, needed - 1), None);
        assert_eq!(batches(&mut s, 0, 1, 1), Some(1));
    }

    #[test]
    fn a_client_on_its_workers_cpu_or_a_drifting_one_stays() {
        let mut s = Steer::new();
        assert_eq!(batches(&mut s, 0, 0, 1000), None);
        // Alternating reads never agree three times in a row.
        let mut t = Steer::new();
        for i in 0..1000u32 {
            let cpu = ((i / CHECK_EVERY_BATCHES) % 2) as usize;
            assert_eq!(
                t.after_batch(0, &mut None, None, || Some(cpu), &MAP, None),
                None
            );
        }
    }

    #[test]
    fn unknown_cpus_and_unpinned_workers_never_move() {
        let mut s = Steer::new();
        for _ in 0..1000 {
            assert_eq!(s.after_batch(0, &mut None, None, || None, &MAP, None), None);
            assert_eq!(
                s.after_batch(0, &mut None, None, || Some(7), &MAP, None),
                None
            );
            assert_eq!(
                s.after_batch(0, &mut None, None, || Some(1), &[], None),
                None
            );
        }
    }

    #[test]
    fn a_moved_connection_stays_its_minimum() {
        let mut s = Steer::new();
        let now = Some(Instant::now());
        for _ in 0..CHECK_EVERY_BATCHES * MOVE_AFTER_CHECKS * 4 {
            assert_eq!(
                s.after_batch(0, &mut None, None, || Some(1), &MAP, now),
                None
            );
        }
    }

    /// Runs `n` batches bound to `bound`, each with first-key stripe
    /// `first`, the client on CPU 1; the worker it moved to, if any.
    fn bound_batches(
        s: &mut Steer,
        bound: &mut Option<usize>,
        first: Option<usize>,
        n: u32,
    ) -> Option<usize> {
        let mut out = None;
        for _ in 0..n {
            if let Some(w) = s.after_batch(0, bound, first, || Some(1), &MAP, None) {
                out = Some(w);
            }
        }
        out
    }

    #[test]
    fn a_connection_keeping_to_its_key_stays_bound() {
        let mut s = Steer::new();
        let mut bound = Some(42);
        let many = CHECK_EVERY_BATCHES * (UNBIND_AFTER_CHECKS + MOVE_AFTER_CHECKS) * 4;
        assert_eq!(bound_batches(&mut s, &mut bound, Some(42), many), None);
        assert_eq!(
            bound_batches(&mut s, &mut bound, None, many),
            None,
            "keyless"
        );
        assert_eq!(bound, Some(42));
        // Strays that are not in a row keep the binding.
        for _ in 0..many {
            bound_batches(&mut s, &mut bound, Some(7), CHECK_EVERY_BATCHES);
            bound_batches(&mut s, &mut bound, Some(42), CHECK_EVERY_BATCHES);
        }
        assert_eq!(bound, Some(42));
        let mut fixed = Some(BOUND_FIXED);
        assert_eq!(bound_batches(&mut s, &mut fixed, Some(7), many), None);
        assert_eq!(fixed, Some(BOUND_FIXED));
    }

    #[test]
    fn a_connection_that_leaves_its_key_is_unbound_then_steered() {
        let mut s = Steer::new();
        let mut bound = Some(42);
        let unbind = CHECK_EVERY_BATCHES * UNBIND_AFTER_CHECKS;
        assert_eq!(bound_batches(&mut s, &mut bound, Some(7), unbind - 1), None);
        assert_eq!(bound, Some(42));
        // The last stray check unbinds; that check's CPU read counts.
        assert_eq!(bound_batches(&mut s, &mut bound, Some(7), 1), None);
        assert_eq!(bound, None);
        let steer = CHECK_EVERY_BATCHES * (MOVE_AFTER_CHECKS - 1);
        assert_eq!(bound_batches(&mut s, &mut bound, Some(7), steer), Some(1));
    }

    #[test]
    fn the_map_names_each_pinned_cpus_first_worker() {
        assert_eq!(cpu_to_worker(&[None, None]), Vec::<usize>::new());
        assert_eq!(
            cpu_to_worker(&[Some(1), Some(3)]),
            vec![usize::MAX, 0, usize::MAX, 1]
        );
        assert_eq!(cpu_to_worker(&[Some(0), Some(1), Some(0)]), vec![0, 1]);
    }

    #[test]
    fn loopback_peers_only() {
        assert!(is_loopback("127.0.0.1:5000"));
        assert!(is_loopback("[::1]:5000"));
        assert!(!is_loopback("10.0.0.2:5000"));
        assert!(!is_loopback("/tmp/sock"));
    }

    /// Over loopback the incoming CPU is the sender's: a client thread
    /// pinned to a CPU makes the server side of its socket report it.
    #[test]
    fn loopback_incoming_cpu_is_the_senders_cpu() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let cpus = topology::allowed_cpus();
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        for &cpu in &cpus {
            let t = std::thread::spawn(move || {
                topology::pin_current_thread(cpu).expect("pin");
                let mut c = std::net::TcpStream::connect(addr).expect("connect");
                for _ in 0..4 {
                    c.write_all(b"x").expect("write");
                    let mut b = [0u8; 1];
                    c.read_exact(&mut b).expect("read");
                }
            });
            let (mut s, _) = l.accept().expect("accept");
            for _ in 0..4 {
                let mut b = [0u8; 1];
                s.read_exact(&mut b).expect("read");
                assert_eq!(incoming_cpu(s.as_raw_fd()), Some(cpu));
                s.write_all(b"y").expect("write");
            }
            t.join().expect("client");
        }
    }
}
