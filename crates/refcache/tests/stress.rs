//! Concurrent checks: threads revive objects through weak references,
//! clone and drop them, while a ticker ends epochs. A held reference must
//! always see a live object; at the end every object is freed exactly once.
//! `REFCACHE_STRESS_SECS` lengthens the run (default: a fraction of a
//! second).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use refcache::{Config, RefCounter, Refcache, ThreadCount, Ticker};

const ALIVE_MAGIC: u64 = 0xA11CE;

struct Canary {
    magic: u64,
    freed: Arc<AtomicUsize>,
}

impl Drop for Canary {
    fn drop(&mut self) {
        assert_eq!(self.magic, ALIVE_MAGIC, "freed twice");
        self.magic = 0;
        self.freed.fetch_add(1, Ordering::SeqCst);
    }
}

fn budget() -> Duration {
    std::env::var("REFCACHE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_millis(300))
}

#[test]
fn weak_revival_races_with_frees() {
    const OBJECTS: usize = 16;
    let domain = Arc::new(Refcache::new(Config {
        cache_slots: 8,
        max_threads: 8,
        ops_per_tick: 64,
    }));
    let ticker = Ticker::spawn(domain.clone(), Duration::from_micros(200));
    let freed = Arc::new(AtomicUsize::new(0));
    // The creator keeps its strong references until the workers have
    // revived something: on a loaded machine the workers may start only
    // after every object has been freed, and the race would not happen.
    let creator = domain.register().unwrap();
    let (strongs, weaks): (Vec<_>, Vec<_>) = (0..OBJECTS)
        .map(|_| {
            creator.alloc_with_weak(
                Canary {
                    magic: ALIVE_MAGIC,
                    freed: freed.clone(),
                },
                None,
            )
        })
        .unzip();
    let stop = AtomicBool::new(false);
    let revived = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (domain, weaks, stop, revived) = (&domain, &weaks, &stop, &revived);
            s.spawn(move || {
                let local = domain.register().unwrap();
                let mut held = Vec::new();
                let mut i: u64 = t as u64 + 1;
                while !stop.load(Ordering::Relaxed) {
                    i = i
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let w = &weaks[(i >> 33) as usize % OBJECTS];
                    if let Some(r) = w.try_get(&local) {
                        revived.fetch_add(1, Ordering::Relaxed);
                        assert_eq!(r.magic, ALIVE_MAGIC, "use after free");
                        let c = local.clone_ref(&r);
                        local.release(r);
                        held.push(c);
                    }
                    if held.len() > 4 || (i >> 40).is_multiple_of(3) {
                        if let Some(r) = held.pop() {
                            assert_eq!(r.magic, ALIVE_MAGIC, "use after free");
                            local.release(r);
                        }
                    }
                }
                for r in held {
                    local.release(r);
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while revived.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // From here on, frees race with revivals.
        for strong in strongs {
            creator.release(strong);
        }
        std::thread::sleep(budget());
        stop.store(true, Ordering::Relaxed);
    });
    drop(creator);
    drop(ticker);
    assert!(domain.quiesce(64));
    assert_eq!(freed.load(Ordering::SeqCst), OBJECTS);
    assert!(weaks.iter().all(|w| w.is_freed()));
    assert!(revived.load(Ordering::Relaxed) > 0);
}

#[test]
fn shared_object_counts_balance_under_every_scheme() {
    for kind in refcache::CounterKind::ALL {
        refcache::scheme::with_counter(kind, 2, |counter| {
            std::thread::scope(|s| {
                for t in 0..2 {
                    s.spawn(move || {
                        let mut thread = counter.dyn_thread(t);
                        let start = Instant::now();
                        while start.elapsed() < Duration::from_millis(50) {
                            for _ in 0..100 {
                                thread.inc();
                                thread.dec();
                            }
                        }
                    });
                }
            });
        });
    }
    // The shared counter ends where it started.
    let shared = refcache::SharedCount::new(1);
    std::thread::scope(|s| {
        for t in 0..2 {
            let shared = &shared;
            s.spawn(move || {
                let th = RefCounter::thread(shared, t);
                for _ in 0..10_000 {
                    th.inc();
                    th.dec();
                }
            });
        }
    });
    assert_eq!(shared.get(), 1);
    let tree = refcache::Snzi::new(2, 1);
    std::thread::scope(|s| {
        for t in 0..4 {
            let tree = &tree;
            s.spawn(move || {
                let mut th = tree.thread(t);
                for _ in 0..10_000 {
                    th.inc();
                    th.dec();
                }
            });
        }
    });
    assert_eq!(tree.root(), 1);
}

#[test]
fn threads_register_and_leave_concurrently() {
    let domain = Refcache::new(Config {
        max_threads: 4,
        ..Config::default()
    });
    let object = {
        let local = domain.register().unwrap();
        local.alloc(7_u32)
    };
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (domain, object) = (&domain, &object);
            s.spawn(move || {
                for _ in 0..200 {
                    let local = domain.register().expect("a core is free");
                    let r = local.clone_ref(object);
                    assert_eq!(*r, 7);
                    local.release(r);
                }
            });
        }
    });
    let local = domain.register().unwrap();
    local.release(object);
    drop(local);
    assert!(domain.quiesce(16));
    assert_eq!(domain.objects_freed(), 1);
}
