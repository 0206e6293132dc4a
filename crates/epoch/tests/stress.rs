//! Readers pin, follow a shared pointer and check the object's canary while
//! a writer keeps replacing the object, retiring the old one, and
//! "freeing" whatever `RetireList::collect` hands back. Freeing means
//! writing a poison canary and moving the object to a quarantine: nothing
//! is really freed until every thread has stopped, so a premature
//! reclamation shows up deterministically as a poisoned canary, never as a
//! use-after-free.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use epoch::{AtomicEpochs, EpochError, EpochScheme, Guard, RetireList, TscEpochs};

const LIVE_CANARY: u64 = 0x0b1e_c7a1_1fe0_0000;
const POISON_CANARY: u64 = 0xdead;
const RUN_MS: u64 = 500;
/// Detection budget for the deliberately broken scheme.
const BROKEN_RUN_MS: u64 = 3_000;
const READERS: usize = 2;
/// Bounds the quarantine (each entry is a small box).
const MAX_REPLACEMENTS: usize = 200_000;
const COLLECT_EVERY_REPLACEMENTS: usize = 16;
/// How long a reader holds an object between its two canary checks.
const HOLD_SPINS: usize = 64;
const WRITER_PAUSE_SPINS: usize = 200;

struct Object {
    canary: AtomicU64,
    generation: u64,
}

fn new_object(generation: u64) -> *mut Object {
    Box::into_raw(Box::new(Object {
        canary: AtomicU64::new(LIVE_CANARY),
        generation,
    }))
}

#[derive(Debug, Default)]
struct Outcome {
    reads: u64,
    premature: u64,
    replaced: usize,
    reclaimed: usize,
    /// Reclaimed before the readers stopped: reclamation makes progress
    /// under load rather than only at quiescence.
    reclaimed_while_running: usize,
}

fn run<S: EpochScheme>(scheme: &S, run_for: Duration, stop_at_first_violation: bool) -> Outcome {
    let current = AtomicPtr::new(new_object(0));
    let stop = AtomicBool::new(false);
    let premature = AtomicU64::new(0);
    let mut outcome = Outcome::default();
    let mut retired = RetireList::new();
    let mut quarantine: Vec<*mut Object> = Vec::new();

    thread::scope(|s| {
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                s.spawn(|| {
                    let mut reads = 0_u64;
                    let mut last_generation = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let guard = scheme.pin();
                        let object = current.load(Ordering::Acquire);
                        // SAFETY: objects are only poisoned, never freed,
                        // until every thread of this scope has been joined.
                        let object = unsafe { &*object };
                        let mut ok = object.canary.load(Ordering::Acquire) == LIVE_CANARY;
                        for _ in 0..HOLD_SPINS {
                            std::hint::spin_loop();
                        }
                        ok &= object.canary.load(Ordering::Acquire) == LIVE_CANARY;
                        assert!(object.generation >= last_generation, "time went backwards");
                        last_generation = object.generation;
                        drop(guard);
                        reads += 1;
                        if !ok {
                            premature.fetch_add(1, Ordering::Relaxed);
                            if stop_at_first_violation {
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                    reads
                })
            })
            .collect();

        // The writer (this thread).
        let deadline = Instant::now() + run_for;
        let mut reclaim = |ready: Vec<*mut Object>, outcome: &mut Outcome| {
            for object in ready {
                // SAFETY: as above, the object is still allocated.
                unsafe { &*object }
                    .canary
                    .store(POISON_CANARY, Ordering::Release);
                quarantine.push(object);
                outcome.reclaimed += 1;
            }
        };
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            if outcome.replaced < MAX_REPLACEMENTS {
                outcome.replaced += 1;
                let fresh = new_object(outcome.replaced as u64);
                let old = current.swap(fresh, Ordering::AcqRel);
                retired.push(scheme, old);
            }
            if outcome.replaced % COLLECT_EVERY_REPLACEMENTS == 0 {
                reclaim(retired.collect(scheme), &mut outcome);
            }
            for _ in 0..WRITER_PAUSE_SPINS {
                std::hint::spin_loop();
            }
        }
        stop.store(true, Ordering::Relaxed);
        outcome.reclaimed_while_running = outcome.reclaimed;
        outcome.reads = readers.into_iter().map(|r| r.join().unwrap()).sum();
        // Quiescent now: everything retired must be collectable.
        reclaim(retired.collect(scheme), &mut outcome);
    });

    assert!(
        retired.is_empty(),
        "{}: quiescent but not reclaimable",
        scheme.name()
    );
    outcome.premature = premature.load(Ordering::Relaxed);
    for object in quarantine
        .into_iter()
        .chain(retired.into_items())
        .chain([current.into_inner()])
    {
        // SAFETY: every thread is joined; each pointer came from
        // `Box::into_raw` and appears exactly once here.
        drop(unsafe { Box::from_raw(object) });
    }
    outcome
}

fn check_scheme<S: EpochScheme>(scheme: &S) {
    let outcome = run(scheme, Duration::from_millis(RUN_MS), false);
    eprintln!("{}: {outcome:?}", scheme.name());
    assert_eq!(outcome.premature, 0, "{}: premature reuse", scheme.name());
    assert!(outcome.reads > 0 && outcome.replaced > 0);
    assert_eq!(outcome.reclaimed, outcome.replaced);
    assert!(
        outcome.reclaimed_while_running > 0,
        "no progress under load"
    );
}

#[test]
fn tsc_epochs_never_reclaim_early() {
    check_scheme(&TscEpochs::new());
}

#[test]
fn atomic_epochs_never_reclaim_early() {
    check_scheme(&AtomicEpochs::new());
}

/// A scheme that pins correctly but never waits: the harness must catch it,
/// or the two tests above prove nothing.
struct NoWait<S>(S);

impl<S: EpochScheme> EpochScheme for NoWait<S> {
    fn name(&self) -> &'static str {
        "no-wait"
    }
    fn try_pin(&self) -> Result<Guard<'_>, EpochError> {
        self.0.try_pin()
    }
    fn now(&self) -> u64 {
        self.0.now()
    }
    fn reclaim_bound(&self) -> u64 {
        u64::MAX
    }
}

#[test]
fn harness_detects_a_scheme_that_does_not_wait() {
    let outcome = run(
        &NoWait(AtomicEpochs::new()),
        Duration::from_millis(BROKEN_RUN_MS),
        true,
    );
    eprintln!("no-wait: {outcome:?}");
    assert!(outcome.premature > 0, "the canary check has no teeth");
}
