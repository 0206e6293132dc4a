//! Refcache against a model: the true count of every object, kept by the
//! test. Several `Local`s on one OS thread stand for several threads (each
//! has its own cache), and operations, flushes and ticks interleave in any
//! order proptest picks. Invariants: an object whose true count is above
//! zero is never freed; a failed `try_get` means the object is freed; once
//! every reference is dropped, quiescing frees every object exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use refcache::{Config, Counted, Refcache, Weak};

struct Canary {
    freed: Arc<AtomicUsize>,
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.freed.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { thread: usize },
    Clone { thread: usize, object: usize },
    Release { thread: usize, object: usize },
    TryGet { thread: usize, object: usize },
    Flush { thread: usize },
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0..3usize).prop_map(|thread| Op::Alloc { thread }),
        3 => (0..3usize, 0..8usize).prop_map(|(thread, object)| Op::Clone { thread, object }),
        4 => (0..3usize, 0..8usize).prop_map(|(thread, object)| Op::Release { thread, object }),
        2 => (0..3usize, 0..8usize).prop_map(|(thread, object)| Op::TryGet { thread, object }),
        1 => (0..3usize).prop_map(|thread| Op::Flush { thread }),
        2 => Just(Op::Tick),
    ]
}

struct Tracked {
    freed: Arc<AtomicUsize>,
    weak: Weak<Canary>,
    refs: Vec<Counted<Canary>>,
}

fn run(ops: Vec<Op>, cache_slots: usize) {
    let domain = Refcache::new(Config {
        cache_slots,
        max_threads: 4,
        ops_per_tick: 0,
    });
    let locals: Vec<_> = (0..3).map(|_| domain.register().unwrap()).collect();
    let mut objects: Vec<Tracked> = Vec::new();
    for op in ops {
        match op {
            Op::Alloc { thread } => {
                let freed = Arc::new(AtomicUsize::new(0));
                let (strong, weak) = locals[thread].alloc_with_weak(
                    Canary {
                        freed: freed.clone(),
                    },
                    None,
                );
                objects.push(Tracked {
                    freed,
                    weak,
                    refs: vec![strong],
                });
            }
            Op::Clone { thread, object } => {
                if let Some(t) = objects.get_mut(object) {
                    if let Some(first) = t.refs.first() {
                        let new = locals[thread].clone_ref(first);
                        t.refs.push(new);
                    }
                }
            }
            Op::Release { thread, object } => {
                if let Some(t) = objects.get_mut(object) {
                    if let Some(r) = t.refs.pop() {
                        locals[thread].release(r);
                    }
                }
            }
            Op::TryGet { thread, object } => {
                if let Some(t) = objects.get_mut(object) {
                    match t.weak.try_get(&locals[thread]) {
                        Some(r) => {
                            assert_eq!(t.freed.load(Ordering::SeqCst), 0);
                            t.refs.push(r);
                        }
                        None => {
                            assert!(t.refs.is_empty(), "try_get failed on a live object");
                            assert_eq!(t.freed.load(Ordering::SeqCst), 1);
                        }
                    }
                }
            }
            Op::Flush { thread } => locals[thread].flush(),
            Op::Tick => {
                domain.tick();
            }
        }
        for t in &objects {
            if !t.refs.is_empty() {
                assert_eq!(t.freed.load(Ordering::SeqCst), 0, "freed while referenced");
            }
            assert!(t.freed.load(Ordering::SeqCst) <= 1, "freed twice");
        }
    }
    for t in &mut objects {
        for r in t.refs.drain(..) {
            locals[0].release(r);
        }
    }
    drop(locals);
    assert!(domain.quiesce(32));
    for t in &objects {
        assert_eq!(t.freed.load(Ordering::SeqCst), 1, "not freed in the end");
        assert!(t.weak.is_freed());
    }
    assert_eq!(domain.objects_freed(), objects.len() as u64);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn matches_true_counts(ops in proptest::collection::vec(op(), 0..120)) {
        run(ops.clone(), 4096);
        // Two slots: constant conflict evictions.
        run(ops, 2);
    }
}

#[test]
fn dirty_zero_waits_two_more_epochs() {
    let domain = Refcache::new(Config {
        cache_slots: 64,
        max_threads: 2,
        ops_per_tick: 0,
    });
    let a = domain.register().unwrap();
    let b = domain.register().unwrap();
    let freed = Arc::new(AtomicUsize::new(0));
    let (strong, weak) = a.alloc_with_weak(
        Canary {
            freed: freed.clone(),
        },
        None,
    );
    let extra = b.clone_ref(&strong); // +1 cached in b
    a.release(strong); // -1 cached in a
                       // a's flush: global 1 - 1 = 0 although the true count is 1; queued by
                       // a in epoch 0. Both caches count as flushed in epoch 0 (b's +1 came
                       // after its registration), so the epoch ends: 1.
    a.flush();
    assert_eq!(domain.epoch(), 1);
    b.flush(); // global 1; a has not flushed in epoch 1 yet
    assert_eq!(domain.epoch(), 1);
    b.release(extra);
    b.flush(); // global 0 again while queued: a dirty zero
    a.flush(); // epoch 1 < 0 + 2: not reviewed yet; epoch ends: 2
    assert_eq!(domain.epoch(), 2);
    assert_eq!(freed.load(Ordering::SeqCst), 0);
    b.flush();
    a.flush(); // review in epoch 2: zero but dirty -> requeued in 2; epoch 3
    assert_eq!(domain.epoch(), 3);
    b.flush();
    a.flush(); // epoch 3 < 2 + 2: too early for the requeued object
    assert_eq!(
        freed.load(Ordering::SeqCst),
        0,
        "requeued object reviewed early"
    );
    assert_eq!(domain.epoch(), 4);
    b.flush();
    a.flush(); // review in epoch 4: a clean zero, weak swapped to null
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    assert!(weak.is_freed());
}

#[test]
fn idle_registered_thread_holds_up_frees_until_it_flushes() {
    let domain = Refcache::new(Config {
        ops_per_tick: 0,
        ..Config::default()
    });
    let a = domain.register().unwrap();
    let idle = domain.register().unwrap();
    let object = a.alloc(1_u8);
    a.release(object);
    for _ in 0..4 {
        a.flush();
    }
    assert_eq!(domain.objects_freed(), 0);
    idle.flush();
    for _ in 0..4 {
        a.flush();
        idle.flush();
    }
    assert_eq!(domain.objects_freed(), 1);
}

#[test]
fn callback_runs_once_with_the_value() {
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    fn on_free(value: u64) {
        SEEN.fetch_add(value as usize, Ordering::SeqCst);
    }
    let domain = Refcache::new(Config {
        ops_per_tick: 0,
        ..Config::default()
    });
    let local = domain.register().unwrap();
    let object = local.alloc_with_callback(7_u64, on_free);
    local.release(object);
    drop(local);
    assert!(domain.quiesce(8));
    assert_eq!(SEEN.load(Ordering::SeqCst), 7);
}

#[test]
fn baselines_count() {
    use refcache::{SharedCount, Snzi};
    let shared = SharedCount::new(1);
    shared.inc();
    assert!(!shared.dec());
    assert!(shared.dec());
    let tree = Snzi::new(4, 1);
    for thread in 0..8 {
        tree.inc(thread);
    }
    assert_eq!(tree.root(), 2); // the initial reference and the top node
    for thread in 0..8 {
        assert!(!tree.dec(thread));
    }
    assert_eq!(tree.root(), 1);
    assert!(tree.bytes_per_object() > Refcache::BYTES_PER_OBJECT);
    for kind in refcache::CounterKind::ALL {
        assert_eq!(kind.name().parse(), Ok(kind));
    }
}
