//! Optional: a worker polls a few microseconds before it sleeps, while it
//! has its CPU to itself (`idle-poll-us`, off by default).
//!
//! Under a pipelined load a worker is often idle for a few microseconds
//! between two clients' batches. If it sleeps in `epoll_wait` each time,
//! the client's next write must wake it: on a VM that is an IPI (a VM exit
//! on the client's vCPU) and a halted vCPU to resume, costs that land on
//! the client and add wake-up latency to every request. redis-server pays
//! them less often because its slower requests keep it busy (4.9 k context
//! switches in 2 s of `redis-benchmark -P 16` GET against one nibble
//! worker's 18.5 k, docs/BENCHMARKS.md).
//!
//! With `idle-poll-us N`, after a batch ran the worker keeps polling for
//! events without blocking until N µs have passed since the batch: the
//! runtime's `on_thread_park` hook ([`before_park`]) wakes a spinner task,
//! so tokio polls epoll with a zero timeout instead of parking; after the
//! window it sleeps as usual.
//!
//! Polling costs whoever else wants the worker's CPU: where clients (or
//! other workers, or other jobs) share the CPUs, a spinning worker delays
//! them more than its saved wake-ups gain (measured on 2 shared vCPUs: more
//! CPU per request and a worse p99; hence off by default). Even when on,
//! the worker polls only while it has its CPU to itself: every
//! `CHECK_EVERY` it reads its thread's run-queue wait from
//! `/proc/thread-self/schedstat` (time it was runnable while another task
//! ran on its CPU), and if that grew by more than `CONTENDED_PER_MILLE`
//! of the interval, polling stops for `BACKOFF`. It is meant for a
//! worker with a CPU of its own (`--threads 1` pinned, clients elsewhere).

use std::cell::RefCell;
use std::io::Read;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// The longest polling window `idle-poll-us` accepts.
pub const MAX_POLL_US: u64 = 1000;
/// How often the worker looks at its run-queue wait.
const CHECK_EVERY: Duration = Duration::from_millis(100);
/// Run-queue wait, in thousandths of the interval, that means contention.
const CONTENDED_PER_MILLE: u64 = 10;
/// How long spinning stays off after contention was seen.
const BACKOFF: Duration = Duration::from_secs(1);

struct Spin {
    /// The spinner task, waiting to be woken.
    waker: Option<Waker>,
    /// How long after a batch the worker keeps polling.
    window: Duration,
    /// When the worker last ran a batch.
    last_work: Instant,
    /// `/proc/thread-self/schedstat`, kept open; `None`: no spinning.
    stat: Option<std::fs::File>,
    /// Last look at the run-queue wait, and the wait then (ns).
    checked: Instant,
    wait_ns: u64,
    /// Spinning is off until then.
    off_until: Option<Instant>,
}

thread_local! {
    static SPIN: RefCell<Option<Spin>> = const { RefCell::new(None) };
}

/// This thread's run-queue wait so far (ns), re-read through `f`.
fn run_queue_wait_ns(f: &mut std::fs::File) -> Option<u64> {
    use std::io::Seek;
    let mut buf = [0u8; 96];
    f.rewind().ok()?;
    let n = f.read(&mut buf).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    text.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// Turn idle polling on for this worker thread (see the module doc); it
/// stays off where the thread's scheduler statistics cannot be read.
pub fn enable_on_this_thread(window: Duration) {
    if window.is_zero() {
        return;
    }
    let Ok(mut f) = std::fs::File::open("/proc/thread-self/schedstat") else {
        return;
    };
    let Some(wait_ns) = run_queue_wait_ns(&mut f) else {
        return;
    };
    let now = Instant::now();
    SPIN.with(|s| {
        *s.borrow_mut() = Some(Spin {
            waker: None,
            window,
            last_work: now,
            stat: Some(f),
            checked: now,
            wait_ns,
            off_until: None,
        })
    });
}

/// A batch ran at `now`: poll for the next one before sleeping.
#[inline]
pub fn note_work(now: Instant) {
    SPIN.with(|s| {
        if let Some(s) = s.borrow_mut().as_mut() {
            s.last_work = now;
        }
    });
}

/// From the runtime's park hook: keep the worker polling (wake the
/// spinner task, so tokio polls epoll without blocking) while within the
/// window after the last batch and not contended.
pub fn before_park() {
    SPIN.with(|s| {
        let mut s = s.borrow_mut();
        let Some(s) = s.as_mut() else {
            return;
        };
        if s.waker.is_none() {
            return;
        }
        let now = Instant::now();
        if now.duration_since(s.checked) >= CHECK_EVERY {
            let elapsed_ns = now.duration_since(s.checked).as_nanos() as u64;
            s.checked = now;
            match s.stat.as_mut().and_then(run_queue_wait_ns) {
                Some(w) => {
                    if w.saturating_sub(s.wait_ns) * 1000 > elapsed_ns * CONTENDED_PER_MILLE {
                        s.off_until = Some(now + BACKOFF);
                    }
                    s.wait_ns = w;
                }
                None => s.stat = None,
            }
        }
        if s.stat.is_none() || s.off_until.is_some_and(|t| now < t) {
            return;
        }
        if now.duration_since(s.last_work) < s.window {
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    });
}

/// The spinner task: does nothing but be woken by [`before_park`].
pub async fn spinner() {
    std::future::poll_fn(|cx| {
        SPIN.with(|s| {
            if let Some(s) = s.borrow_mut().as_mut() {
                s.waker = Some(cx.waker().clone());
            }
        });
        Poll::<()>::Pending
    })
    .await
}
