//! The point of the crate: a lock in a `MAP_SHARED` page, taken by forked
//! children that contend and sleep in the futex, must exclude and wake
//! across processes. Parent checks the exact count, with a deadline (a
//! lost cross-process wake shows as a hang, turned into a failure here).

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const CHILDREN: usize = 4;
const INCREMENTS_PER_CHILD: u64 = 5_000;
/// Every this many increments a child holds the lock across a sleep, so
/// the others exhaust their spin and sleep in FUTEX_WAIT.
const SLEEP_EVERY_INCREMENTS: u64 = 250;
const HOLD_SLEEP_NS: i64 = 300_000;
const DEADLINE: Duration = Duration::from_secs(60);

/// What lives in the shared page.
#[repr(C)]
struct Shared {
    mutex: xsync::Mutex<u64>,
    rwlock: xsync::RwLock<[u64; 2]>,
    /// Times a child found a lock held (try_lock failed) before locking.
    contended: AtomicU64,
}

/// Child body: raw libc and the locks only; never returns.
fn child(shared: &Shared, me: u64) -> ! {
    let hold = libc::timespec {
        tv_sec: 0,
        tv_nsec: HOLD_SLEEP_NS,
    };
    for i in 0..INCREMENTS_PER_CHILD {
        let mut g = match shared.mutex.try_lock() {
            Some(g) => g,
            None => {
                shared.contended.fetch_add(1, Ordering::Relaxed);
                shared.mutex.lock()
            }
        };
        let v = *g;
        std::hint::black_box(v);
        *g = v + 1;
        if (i + me * 37).is_multiple_of(SLEEP_EVERY_INCREMENTS) {
            // SAFETY: `hold` is a valid timespec; the remainder may be null.
            unsafe { libc::nanosleep(&hold, core::ptr::null_mut()) };
        }
        drop(g);

        // The rwlock: write both halves, or read and check they match.
        if i.is_multiple_of(3) {
            let mut w = shared.rwlock.write();
            w[0] += 1;
            std::hint::black_box(&*w);
            w[1] += 1;
            if (i + me * 11).is_multiple_of(SLEEP_EVERY_INCREMENTS) {
                // SAFETY: as above.
                unsafe { libc::nanosleep(&hold, core::ptr::null_mut()) };
            }
        } else {
            let r = shared.rwlock.read();
            if r[0] != r[1] {
                // SAFETY: _exit ends the child without running the
                // parent's atexit handlers or unwinding a forked copy.
                unsafe { libc::_exit(3) };
            }
        }
    }
    // SAFETY: as above.
    unsafe { libc::_exit(0) }
}

#[test]
fn forked_children_share_the_locks() {
    let page_bytes = 4096usize;
    assert!(std::mem::size_of::<Shared>() <= page_bytes);
    // SAFETY: a fresh anonymous shared mapping; arguments are valid.
    let page = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            page_bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED, "mmap");
    let shared_ptr = page.cast::<Shared>();
    // SAFETY: the page is writable, page-aligned (enough for Shared) and
    // large enough (asserted); nothing else references it yet.
    unsafe {
        shared_ptr.write(Shared {
            mutex: xsync::Mutex::new(0),
            rwlock: xsync::RwLock::new([0, 0]),
            contended: AtomicU64::new(0),
        })
    };
    // SAFETY: initialised just above; the mapping lives until munmap at
    // the end, after every child has exited.
    let shared = unsafe { &*shared_ptr };

    let mut pids = Vec::with_capacity(CHILDREN);
    for me in 0..CHILDREN {
        // SAFETY: the child only touches the shared page, its stack, and
        // raw syscalls, then `_exit`s; it never returns into the harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            child(shared, me as u64);
        }
        pids.push(pid);
    }

    let start = Instant::now();
    let mut statuses = [None; CHILDREN];
    while statuses.iter().any(Option::is_none) {
        for (k, &pid) in pids.iter().enumerate() {
            if statuses[k].is_some() {
                continue;
            }
            let mut status = 0;
            // SAFETY: `pid` is our child; `status` is a valid out pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                statuses[k] = Some(status);
            }
        }
        if start.elapsed() > DEADLINE {
            for &pid in &pids {
                // SAFETY: killing and reaping our own children.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, core::ptr::null_mut(), 0);
                }
            }
            panic!("children still running after {DEADLINE:?}: a lost cross-process wake-up");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for (k, status) in statuses.iter().enumerate() {
        let status = status.expect("reaped");
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child {k} failed: status {status:#x} (exit 3 = torn rwlock read)"
        );
    }

    let count = *shared.mutex.lock();
    let pair = *shared.rwlock.read();
    let contended = shared.contended.load(Ordering::Relaxed);
    assert_eq!(count, CHILDREN as u64 * INCREMENTS_PER_CHILD);
    let writes_per_child = INCREMENTS_PER_CHILD.div_ceil(3);
    assert_eq!(pair, [CHILDREN as u64 * writes_per_child; 2]);
    assert!(contended > 0, "the children never contended");
    eprintln!(
        "{CHILDREN} children, count {count}, contended {contended} times, in {:?}",
        start.elapsed()
    );

    // SAFETY: every child has exited; `shared` is not used after this.
    unsafe { libc::munmap(page, page_bytes) };
}
