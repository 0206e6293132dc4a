//! The worker's shutdown signal as its connection tasks wait for it: one
//! flag and one waker slot per connection, in the worker thread's own
//! registry, so waiting costs a connection no lock and no allocation per
//! read.
//!
//! A connection waits for its next request, for pub/sub mail, for a
//! stalled write and for shutdown at once (`conn::read_more`). Waiting on
//! the server's `watch` channel for the last means registering with the
//! channel's `Notify` on every read (its mutex, a linked-list insert, and
//! the unlink when the read wins): about 1 k instructions per request,
//! shared between the workers' cores. Shutdown is a one-time event, so
//! here the worker's accept loop is the one task that waits on the
//! channel; when it fires, [`trigger`] sets this thread's flag and wakes
//! every connection task that registered a waker ([`Waiter`]). A
//! connection's [`Waiter::wait`] checks the flag and, at most once per
//! task waker change, stores its waker in its slot: a thread-local
//! borrow and a pointer compare per read.
//!
//! Everything is thread-local: a worker's connections are tasks of its
//! `LocalSet`, and [`trigger`] runs on that thread. A connection that
//! moves to another worker ([`crate::migrate`]) drops its [`Waiter`] on
//! the old thread and registers a new one on the new thread (where, if
//! shutdown was already signalled, it resolves at once).

use std::cell::RefCell;
use std::future::Future;
use std::task::{Poll, Waker};

#[derive(Default)]
struct Registry {
    /// Shutdown was signalled on this thread.
    stopped: bool,
    /// A waker slot per registered connection (`None`: not polled yet).
    wakers: Vec<Option<Waker>>,
    /// Slots of connections that have gone, for reuse.
    free: Vec<usize>,
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

/// One connection's place in its worker's shutdown registry; the slot is
/// released on drop.
pub struct Waiter {
    slot: usize,
}

impl Waiter {
    /// Register a connection of this thread.
    pub fn new() -> Waiter {
        REGISTRY.with(|r| {
            let mut r = r.borrow_mut();
            let slot = match r.free.pop() {
                Some(s) => s,
                None => {
                    r.wakers.push(None);
                    r.wakers.len() - 1
                }
            };
            Waiter { slot }
        })
    }

    /// Resolves once [`trigger`] has run on this thread.
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            REGISTRY.with(|r| {
                let mut r = r.borrow_mut();
                if r.stopped {
                    return Poll::Ready(());
                }
                let w = &mut r.wakers[self.slot];
                match w {
                    Some(old) if old.will_wake(cx.waker()) => {}
                    _ => *w = Some(cx.waker().clone()),
                }
                Poll::Pending
            })
        })
    }
}

impl Default for Waiter {
    fn default() -> Self {
        Waiter::new()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // `try_with`: a connection dropped while the thread's locals are
        // torn down has nothing left to release.
        let _ = REGISTRY.try_with(|r| {
            let mut r = r.borrow_mut();
            r.wakers[self.slot] = None;
            r.free.push(self.slot);
        });
    }
}

/// Signal shutdown to every connection of this thread: set the flag and
/// wake the tasks that wait.
pub fn trigger() {
    let wakers: Vec<Waker> = REGISTRY.with(|r| {
        let mut r = r.borrow_mut();
        r.stopped = true;
        r.wakers.iter_mut().filter_map(Option::take).collect()
    });
    // Woken outside the borrow: a waker may run code that registers.
    for w in wakers {
        w.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waiters registered before and after the trigger all resolve; a
    /// released slot is reused.
    #[test]
    fn trigger_wakes_every_waiter() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let a = Waiter::new();
            let b = Waiter::new();
            let sa = a.slot;
            drop(a);
            let c = Waiter::new();
            assert_eq!(c.slot, sa, "slot reused");
            let waits = async {
                tokio::join!(b.wait(), c.wait());
            };
            let fire = async {
                tokio::task::yield_now().await;
                trigger();
            };
            tokio::join!(waits, fire);
            Waiter::new().wait().await;
        });
    }
}
