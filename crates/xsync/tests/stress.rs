//! Many threads, one lock: the checker is an exact count (mutex) and a
//! two-field invariant readers must never see torn (rwlock).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const THREADS: usize = 8;
const INCREMENTS_PER_THREAD: u64 = 50_000;

/// A counter the mutex protects, read and written non-atomically with a
/// gap between, so a broken lock loses increments.
#[test]
fn mutex_counter_is_exact() {
    let m = xsync::Mutex::new(0u64);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let m = &m;
            s.spawn(move || {
                for i in 0..INCREMENTS_PER_THREAD {
                    let mut g = m.lock();
                    let v = *g;
                    std::hint::black_box(v);
                    *g = v + 1;
                    // Now and then hold the lock across a sleep so others
                    // exhaust their spin and sleep in FUTEX_WAIT.
                    if (i + t as u64).is_multiple_of(5_000) {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            });
        }
    });
    assert_eq!(m.into_inner(), THREADS as u64 * INCREMENTS_PER_THREAD);
}

/// Two fields writers keep equal; written in two steps with a gap.
struct Pair {
    a: UnsafeCell<u64>,
    b: UnsafeCell<u64>,
}

#[test]
fn rwlock_readers_never_see_torn_pair() {
    const WRITERS: usize = 3;
    const READERS: usize = 5;
    const WRITES_PER_WRITER: u64 = 20_000;
    let rw = xsync::RwLock::new(Pair {
        a: UnsafeCell::new(0),
        b: UnsafeCell::new(0),
    });
    let reads = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let (rw, done) = (&rw, &done);
            s.spawn(move || {
                for i in 0..WRITES_PER_WRITER {
                    let g = rw.write();
                    // SAFETY: the write guard is exclusive.
                    unsafe {
                        *g.a.get() += 1;
                        std::hint::black_box(*g.a.get());
                        *g.b.get() += 1;
                    }
                    if (i + w as u64).is_multiple_of(4_000) {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                done.fetch_add(1, Ordering::Release);
            });
        }
        for _ in 0..READERS {
            let (rw, done, reads) = (&rw, &done, &reads);
            s.spawn(move || {
                let mut n = 0u64;
                while done.load(Ordering::Acquire) < WRITERS as u64 || n == 0 {
                    let g = rw.read();
                    // SAFETY: readers only read; writers are excluded.
                    let (a, b) = unsafe { (*g.a.get(), *g.b.get()) };
                    assert_eq!(a, b, "reader saw a torn pair");
                    n += 1;
                    if n.is_multiple_of(10_000) {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
                reads.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    let g = rw.read();
    // SAFETY: all threads joined; read guard held.
    let (a, b) = unsafe { (*g.a.get(), *g.b.get()) };
    assert_eq!(a, WRITERS as u64 * WRITES_PER_WRITER);
    assert_eq!(a, b);
    assert!(reads.load(Ordering::Relaxed) > 0);
}

// SAFETY: access to the cells is serialised by the RwLock in the tests.
unsafe impl Sync for Pair {}
