//! Loom model of the reclamation rule, for both schemes.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p epoch --test loom --release`
//!
//! A reader pins, loads the index of the current object, reads that object
//! and unpins; a writer swaps the index to a new object, stamps the
//! retirement with `now()`, and frees the old object only if
//! `safe_to_reclaim` says so. Objects are `loom::cell::UnsafeCell`s, so a
//! free that is not ordered after the read (happens-before) is reported by
//! loom as a data race even when the value happened to look fine; the value
//! check catches the rest. The table uses a `LogicalClock` (a shared
//! counter bumped with `Relaxed` RMWs: one global order of stamps, no
//! happens-before, like a synchronised TSC), and `register()` handles,
//! because loom threads share one OS thread and its `thread_local!`s.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use epoch::{AtomicEpochs, EpochScheme, LogicalClock, TscConfig, TscEpochs};

const LIVE: u64 = 0x11fe;
const FREED: u64 = 0xdead;
/// Preemptions explored in the three-thread model.
const TWO_READER_PREEMPTION_BOUND: usize = 3;

struct World<S> {
    scheme: S,
    /// Index of the current object.
    current: AtomicUsize,
    objects: [UnsafeCell<u64>; 2],
}

impl<S> World<S> {
    fn new(scheme: S) -> Arc<World<S>> {
        Arc::new(World {
            scheme,
            current: AtomicUsize::new(0),
            objects: [UnsafeCell::new(LIVE), UnsafeCell::new(LIVE)],
        })
    }

    /// The reader's critical section (the caller holds a guard).
    fn read_current(&self) {
        let index = self.current.load(Ordering::Acquire);
        // SAFETY: a read through loom's cell; loom reports it if it races
        // with the writer's free.
        let value = self.objects[index].with(|p| unsafe { *p });
        assert_eq!(value, LIVE, "reader saw a freed object");
    }
}

impl<S: EpochScheme> World<S> {
    /// The writer: unlink object 0, retire it, free it if allowed.
    fn replace_and_maybe_free(&self, check: bool) -> bool {
        let old = self.current.swap(1, Ordering::AcqRel);
        let retired_at = self.scheme.now();
        let free = !check || self.scheme.safe_to_reclaim(retired_at);
        if free {
            // SAFETY: a write through loom's cell; loom reports it if it
            // races with a reader.
            self.objects[old].with_mut(|p| unsafe { *p = FREED });
        }
        free
    }
}

fn tsc_table() -> TscEpochs<LogicalClock> {
    TscEpochs::with_clock(
        TscConfig {
            capacity_slots: 2,
            ..TscConfig::default()
        },
        LogicalClock::new(),
    )
}

/// One reader operation against one retirement, TSC table. The main thread
/// owns slot 0 (quiescent) so the reader claims slot 1 and the scan depends
/// on seeing the high-water mark move.
#[test]
fn tsc_reader_never_sees_freed_object() {
    loom::model(|| {
        let world = World::new(tsc_table());
        let _main_slot = world.scheme.register().unwrap();
        let reader = {
            let world = world.clone();
            thread::spawn(move || {
                let handle = world.scheme.register().unwrap();
                let guard = handle.pin();
                world.read_current();
                drop(guard);
            })
        };
        world.replace_and_maybe_free(true);
        reader.join().unwrap();
    });
}

/// Two operations in a row by the reader: the reclaimer may see the second
/// operation's stamp (> T) having missed the first one's clearing store.
#[test]
fn tsc_reader_two_operations() {
    loom::model(|| {
        let world = World::new(tsc_table());
        let reader = {
            let world = world.clone();
            thread::spawn(move || {
                let handle = world.scheme.register().unwrap();
                for _ in 0..2 {
                    let guard = handle.pin();
                    world.read_current();
                    drop(guard);
                }
            })
        };
        world.replace_and_maybe_free(true);
        reader.join().unwrap();
    });
}

/// Nested guards: the inner unpin must not end the outer operation.
#[test]
fn tsc_nested_guard_keeps_protection() {
    loom::model(|| {
        let world = World::new(tsc_table());
        let reader = {
            let world = world.clone();
            thread::spawn(move || {
                let handle = world.scheme.register().unwrap();
                let outer = handle.pin();
                drop(handle.pin());
                world.read_current();
                drop(outer);
            })
        };
        world.replace_and_maybe_free(true);
        reader.join().unwrap();
    });
}

/// Two readers with their own slots: the scan must check both. Three
/// threads explode the state space, so preemptions are bounded (loom's
/// usual practice; bugs almost always need only one or two).
#[test]
fn tsc_two_readers() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(TWO_READER_PREEMPTION_BOUND);
    builder.check(|| {
        let world = World::new(tsc_table());
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let world = world.clone();
                thread::spawn(move || {
                    let handle = world.scheme.register().unwrap();
                    let guard = handle.pin();
                    world.read_current();
                    drop(guard);
                })
            })
            .collect();
        world.replace_and_maybe_free(true);
        for reader in readers {
            reader.join().unwrap();
        }
    });
}

#[test]
fn atomic_reader_never_sees_freed_object() {
    loom::model(|| {
        let world = World::new(AtomicEpochs::new());
        let reader = {
            let world = world.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    let guard = world.scheme.pin();
                    world.read_current();
                    drop(guard);
                }
            })
        };
        world.replace_and_maybe_free(true);
        reader.join().unwrap();
    });
}

/// The model has teeth: a writer that skips the check is caught.
#[test]
#[should_panic]
fn writer_skipping_the_check_is_caught() {
    loom::model(|| {
        let world = World::new(tsc_table());
        let reader = {
            let world = world.clone();
            thread::spawn(move || {
                let handle = world.scheme.register().unwrap();
                let guard = handle.pin();
                world.read_current();
                drop(guard);
            })
        };
        world.replace_and_maybe_free(false);
        reader.join().unwrap();
    });
}
