//! The background epoch ticker: sv6 ends Refcache epochs from the timer
//! interrupt; here a thread calls [`Refcache::tick`] every period, flushing
//! the caches of idle threads on their behalf so they cannot stall epochs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cache::Refcache;

/// Default period between ticks, in milliseconds (sv6 uses its scheduler
/// tick, 10 ms).
pub const DEFAULT_TICK_PERIOD_MS: u64 = 10;

/// A thread ticking one domain; stops and joins when dropped.
#[derive(Debug)]
pub struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    /// Ticks `domain` every `period` until dropped.
    pub fn spawn(domain: Arc<Refcache>, period: Duration) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("refcache-ticker".into())
            .spawn(move || run(&domain, period, &flag))
            .expect("spawn the Refcache ticker");
        Ticker {
            stop,
            thread: Some(thread),
        }
    }
}

/// Ticks `domain` every `period` until `stop` is set: the ticker's loop,
/// for callers that run it in a scoped thread of their own.
pub fn run(domain: &Refcache, period: Duration, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(period);
        domain.tick();
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
