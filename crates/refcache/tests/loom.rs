//! Loom models of Refcache's review rule: an object is freed only after
//! its count stayed zero for two epochs, and a `try_get` racing with the
//! review either revives the object or fails, never touches freed memory.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p refcache --test loom --release`
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use refcache::{Config, Refcache};

/// Sets its flag when dropped, i.e. when Refcache frees the object.
struct Canary(Arc<AtomicUsize>);

impl Drop for Canary {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn small() -> Config {
    Config {
        cache_slots: 2,
        max_threads: 3,
        ops_per_tick: 0,
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// Thread A drops its reference while thread B, holding another one,
/// reads the object and ends epochs. The object must stay live while B
/// holds its reference and be freed exactly once after both are gone.
#[test]
fn never_freed_while_referenced() {
    model(|| {
        let freed = Arc::new(AtomicUsize::new(0));
        let domain = Arc::new(Refcache::new(small()));
        let (a_ref, b_ref) = {
            let local = domain.register().unwrap();
            let a = local.alloc(Canary(freed.clone()));
            let b = local.clone_ref(&a);
            (a, b)
        };
        let d = domain.clone();
        let a = thread::spawn(move || {
            let local = d.register().unwrap();
            local.release(a_ref);
            local.flush();
            d.tick();
        });
        let d = domain.clone();
        let f = freed.clone();
        let b = thread::spawn(move || {
            let local = d.register().unwrap();
            d.tick();
            local.flush();
            d.tick();
            assert_eq!(f.load(Ordering::SeqCst), 0, "freed while referenced");
            local.release(b_ref);
        });
        a.join().unwrap();
        b.join().unwrap();
        assert!(domain.quiesce(8));
        assert_eq!(freed.load(Ordering::SeqCst), 1);
    });
}

/// The dirty zero: A's release brings the global count to zero and queues
/// the object while B revives it with `try_get` and then lets it go again.
/// Whatever the interleaving, B's revived reference is live, and the
/// object is freed exactly once in the end.
#[test]
fn try_get_races_review() {
    model(|| {
        let freed = Arc::new(AtomicUsize::new(0));
        let domain = Arc::new(Refcache::new(small()));
        let (strong, weak) = {
            let local = domain.register().unwrap();
            local.alloc_with_weak(Canary(freed.clone()), None)
        };
        let d = domain.clone();
        let a = thread::spawn(move || {
            let local = d.register().unwrap();
            local.release(strong);
            local.flush();
            d.tick();
            d.tick();
            local.flush();
        });
        let d = domain.clone();
        let f = freed.clone();
        let b = thread::spawn(move || {
            let local = d.register().unwrap();
            if let Some(revived) = weak.try_get(&local) {
                d.tick();
                assert_eq!(f.load(Ordering::SeqCst), 0, "revived object freed");
                assert_eq!(revived.0.load(Ordering::SeqCst), 0);
                local.release(revived);
            }
            weak
        });
        a.join().unwrap();
        let weak = b.join().unwrap();
        assert!(domain.quiesce(12));
        assert_eq!(freed.load(Ordering::SeqCst), 1);
        assert!(weak.is_freed());
    });
}
