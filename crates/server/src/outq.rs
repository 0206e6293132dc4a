//! Replies written just before the worker sleeps (Redis's `beforeSleep`).
//!
//! redis-server does not write a client's replies when it has run the
//! client's commands: `addReply` appends to the client's buffer and puts
//! the client on `clients_pending_write`; `beforeSleep`, run once per
//! event-loop turn just before `epoll_wait`, writes every client on that
//! list (`handleClientsWithPendingWrites`), and only a client whose write
//! came up short gets a writable handler (`EPOLLOUT`). One loop turn
//! therefore reads every ready socket, runs everything that arrived, and
//! then sends all the replies back to back, so a client (such as
//! `redis-benchmark`, itself one event loop over many connections) finds
//! many replies ready at its next wake-up, sends its next requests
//! together, and the server finds many sockets ready at its next
//! `epoll_wait`. Writing each connection's replies as soon as its batch
//! is run instead spreads the replies over the turn: the client wakes for
//! the first, sends one connection's next batch, and the server sleeps and
//! is woken more often (on a 2-vCPU VM, `redis-benchmark -P 16` against one
//! worker made about twice Redis's `epoll_wait` calls and four times its
//! context switches per request, see docs/BENCHMARKS.md).
//!
//! The same here, on tokio's `current_thread` runtime: a plain (TCP or
//! Unix) connection's task, at the end of a batch, hands its output to its
//! `OutSlot` ([`Deferred::defer`]) instead of writing it, and the slot
//! joins this worker's pending list (a thread-local: a worker's tasks and
//! its runtime share one thread). [`write_pending`] runs from the
//! runtime's `on_thread_park` hook, which tokio calls each time it has run
//! every ready task and is about to poll `epoll_wait`: it writes each
//! pending slot with one non-blocking `send`. A slot written in full is
//! done (its task is still waiting for input and is not woken); one that
//! is written in part, or fails, is marked stalled and its task woken, and
//! the task writes the rest itself with an ordinary awaited write (tokio
//! waits for `EPOLLOUT`) and reads nothing more until it is out, so a
//! client that does not read still holds at most one batch of replies.
//!
//! Order is kept by one rule: bytes in a slot always precede any the task
//! writes itself, so every direct write first takes the slot's bytes back
//! ([`Deferred::reclaim`]). Connections that write from other paths
//! (subscribers' messages, blocked commands, the 1 ms execution slice,
//! closing) do so. TLS connections keep writing at the end of each batch
//! (their records go through the TLS session, not straight to the socket).
//! A task that runs past its execution slice calls [`write_pending`]
//! itself before it yields, since tokio does not call the park hook while
//! a yielded task is waiting to run again.

use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::state::WorkerStats;

/// A written slot's buffer keeps at most this much capacity; a larger one
/// (a reply larger than the size output is flushed at) is freed. The
/// slot's buffer becomes the task's next output buffer (`defer` swaps
/// them), which the task frees itself when its batches turn small
/// (`conn.rs`, `IDLE_OUT_BYTES`).
const KEEP_OUT_BYTES: usize = crate::conn::OUT_SOFT;

/// One connection's replies waiting for the end of the loop turn.
struct OutSlot {
    /// The connection's socket; -1 once the connection has ended.
    fd: Cell<RawFd>,
    /// Replies not yet written.
    buf: RefCell<Vec<u8>>,
    /// On this worker's pending list.
    queued: Cell<bool>,
    /// A write came up short or failed: the task must write the rest.
    stalled: Cell<bool>,
    /// The task to wake when the slot stalls.
    waker: RefCell<Option<Waker>>,
}

thread_local! {
    /// This worker's slots with replies to write.
    static PENDING: RefCell<Vec<Rc<OutSlot>>> = const { RefCell::new(Vec::new()) };
    /// Whether this thread's runtime calls [`write_pending`] before it parks.
    static ENABLED: Cell<bool> = const { Cell::new(false) };
}

/// Declare that this thread's runtime calls [`write_pending`] from its
/// `on_thread_park` hook; connections served on this thread then defer
/// their writes. (Without it, [`Deferred::new`] gives `None` and every
/// connection writes at the end of each batch.)
pub fn enable_on_this_thread() {
    ENABLED.with(|e| e.set(true));
}

/// Write every pending slot of this worker: one non-blocking `send` each.
/// Runs before the worker parks (and from a task that yields after its
/// execution slice).
pub fn write_pending(stats: &WorkerStats) {
    let list = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if list.is_empty() {
        return;
    }
    for slot in &list {
        slot.queued.set(false);
        let fd = slot.fd.get();
        if fd < 0 {
            continue;
        }
        let mut buf = slot.buf.borrow_mut();
        if buf.is_empty() {
            continue;
        }
        let done = loop {
            // SAFETY: `fd` is the open socket of a live connection: the
            // connection's task owns the socket and sets the slot's fd to
            // -1 (`Deferred::drop`) in the same synchronous drop that
            // closes it, and this runs on the task's thread between polls,
            // never during one. `buf` is a valid, initialised byte range
            // that the `RefMut` keeps borrowed for the call.
            let n = unsafe {
                libc::send(
                    fd,
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // Would block or failed: the task writes (or fails) itself.
                break false;
            }
            let n = n as usize;
            WorkerStats::bump(&stats.net_out, n as u64);
            if n == buf.len() {
                break true;
            }
            buf.drain(..n);
            break false;
        };
        if done {
            buf.clear();
            if buf.capacity() > KEEP_OUT_BYTES {
                *buf = Vec::new();
            }
        } else {
            slot.stalled.set(true);
            if let Some(w) = slot.waker.borrow_mut().take() {
                w.wake();
            }
        }
    }
    // Keep the list's capacity for the next turn.
    let mut list = list;
    list.clear();
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        if p.is_empty() {
            *p = list;
        }
    });
}

/// A connection's handle on its slot; dropping it (when the connection
/// ends) detaches the slot from the socket.
pub struct Deferred {
    slot: Rc<OutSlot>,
}

impl Deferred {
    /// A slot for the socket `fd`, or `None` where this thread's runtime
    /// does not write pending slots (see [`enable_on_this_thread`]).
    pub fn new(fd: RawFd) -> Option<Deferred> {
        if !ENABLED.with(|e| e.get()) {
            return None;
        }
        Some(Deferred {
            slot: Rc::new(OutSlot {
                fd: Cell::new(fd),
                buf: RefCell::new(Vec::new()),
                queued: Cell::new(false),
                stalled: Cell::new(false),
                waker: RefCell::new(None),
            }),
        })
    }

    /// Whether a deferred write came up short: the task must write itself.
    pub fn stalled(&self) -> bool {
        self.slot.stalled.get()
    }

    /// Capacity of the slot's buffer (the task's next output buffer once
    /// it defers again).
    pub fn spare_capacity(&self) -> usize {
        self.slot.buf.borrow().capacity()
    }

    /// Free the slot's buffer if it holds nothing to write (a connection
    /// gone idle, see `conn.rs`, `SHED_OUT_MS`).
    pub fn shed(&self) {
        let mut buf = self.slot.buf.borrow_mut();
        if buf.is_empty() {
            *buf = Vec::new();
        }
    }

    /// Hand `out`'s bytes to the slot, to be written before the worker
    /// parks; `out` is left empty (it takes the slot's spare buffer).
    pub fn defer(&self, out: &mut Vec<u8>) {
        if out.is_empty() {
            return;
        }
        {
            let mut buf = self.slot.buf.borrow_mut();
            if buf.is_empty() {
                std::mem::swap(&mut *buf, out);
            } else {
                buf.extend_from_slice(out);
                out.clear();
            }
        }
        if !self.slot.queued.replace(true) {
            PENDING.with(|p| p.borrow_mut().push(self.slot.clone()));
        }
    }

    /// Take back the bytes not yet written, ahead of `out`'s, before the
    /// task writes itself.
    pub fn reclaim(&self, out: &mut Vec<u8>) {
        self.slot.stalled.set(false);
        let mut buf = self.slot.buf.borrow_mut();
        if buf.is_empty() {
            return;
        }
        buf.extend_from_slice(out);
        std::mem::swap(&mut *buf, out);
        buf.clear();
    }

    /// Resolves once the slot stalls (see [`Deferred::stalled`]).
    pub async fn wait_stalled(&self) {
        std::future::poll_fn(|cx| {
            if self.slot.stalled.get() {
                return Poll::Ready(());
            }
            let mut w = self.slot.waker.borrow_mut();
            match &*w {
                Some(old) if old.will_wake(cx.waker()) => {}
                _ => *w = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        // The socket closes with the connection: never write to it again
        // (the slot may stay on the pending list until the next turn).
        self.slot.fd.set(-1);
        self.slot.buf.borrow_mut().clear();
        self.slot.waker.borrow_mut().take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn deferred_bytes_go_out_in_order_at_write_pending() {
        enable_on_this_thread();
        let (a, mut b) = UnixStream::pair().unwrap();
        let stats = WorkerStats::default();
        let d = Deferred::new(a.as_raw_fd()).unwrap();
        let mut out = b"one ".to_vec();
        d.defer(&mut out);
        assert!(out.is_empty());
        out.extend_from_slice(b"two ");
        d.defer(&mut out);
        // A direct write takes the deferred bytes back first.
        out.extend_from_slice(b"three");
        d.reclaim(&mut out);
        assert_eq!(out, b"one two three");
        d.defer(&mut out);
        write_pending(&stats);
        b.set_nonblocking(true).unwrap();
        let mut got = vec![0; 64];
        let n = b.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"one two three");
        assert!(!d.stalled());
        // Nothing pending: nothing written.
        write_pending(&stats);
        assert!(b.read(&mut got).is_err());
    }

    #[test]
    fn a_full_socket_stalls_the_slot_and_keeps_the_rest() {
        enable_on_this_thread();
        let (a, b) = UnixStream::pair().unwrap();
        let stats = WorkerStats::default();
        let d = Deferred::new(a.as_raw_fd()).unwrap();
        let big = vec![7u8; 8 << 20];
        let mut out = big.clone();
        d.defer(&mut out);
        write_pending(&stats);
        assert!(d.stalled());
        let mut rest = Vec::new();
        d.reclaim(&mut rest);
        assert!(!d.stalled());
        assert!(!rest.is_empty() && rest.len() < big.len());
        drop(b);
    }

    #[test]
    fn a_dropped_connection_is_never_written() {
        enable_on_this_thread();
        let (a, b) = UnixStream::pair().unwrap();
        let stats = WorkerStats::default();
        let d = Deferred::new(a.as_raw_fd()).unwrap();
        let mut out = b"late".to_vec();
        d.defer(&mut out);
        drop(d);
        drop(a);
        write_pending(&stats);
        drop(b);
    }
}
