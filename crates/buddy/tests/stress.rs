//! Multi-threaded stress: random allocations, a third of them freed by
//! another thread (cross-heap frees), with a checker that owns one flag per
//! frame. Then out of memory under concurrency, and recovery after frees.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;

use buddy::{AllocError, AllocatorKind, FrameAllocator};
use common::{assert_fully_coalesced, build, config};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// One flag per frame: set while some thread holds it.
struct Checker(Vec<AtomicBool>);

impl Checker {
    fn take(&self, f: u64, order: u32) {
        for i in f..f + (1 << order) {
            assert!(
                !self.0[i as usize].swap(true, Ordering::AcqRel),
                "frame {i} handed out twice"
            );
        }
    }
    fn give(&self, f: u64, order: u32) {
        for i in f..f + (1 << order) {
            assert!(self.0[i as usize].swap(false, Ordering::AcqRel));
        }
    }
}

const THREADS: usize = 4;
/// Operations per thread in the default (fast) run.
const STRESS_OPS_PER_THREAD: usize = 20_000;

/// Operations per thread: `BUDDY_STRESS_OPS` overrides the default for long
/// runs (`BUDDY_STRESS_OPS=5000000 cargo test --release -p buddy --test stress`).
fn stress_ops() -> usize {
    std::env::var("BUDDY_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(STRESS_OPS_PER_THREAD)
}

fn stress(kind: AllocatorKind) {
    let frames = 4096u64;
    let ops = stress_ops();
    let a: Arc<dyn FrameAllocator> = Arc::from(build(kind, frames, &config(THREADS, Some(6))));
    let checker = Arc::new(Checker(
        (0..frames).map(|_| AtomicBool::new(false)).collect(),
    ));
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<(u64, u32)>()).unzip();
    let handles: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(t, rx)| {
            let a = a.clone();
            let checker = checker.clone();
            let peer = txs[(t + 1) % THREADS].clone();
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(t as u64);
                let mut mine: Vec<(u64, u32)> = Vec::new();
                for _ in 0..ops {
                    while let Ok((f, k)) = rx.try_recv() {
                        checker.give(f, k);
                        a.free_on(t, f, k).unwrap();
                    }
                    if mine.len() < 64 && rng.gen_bool(0.55) {
                        let order = [0, 0, 0, 1, 2, 3][rng.gen_range(0..6)];
                        match a.alloc_on(t, order) {
                            Ok(f) => {
                                checker.take(f, order);
                                if rng.gen_bool(0.33) {
                                    peer.send((f, order)).unwrap();
                                } else {
                                    mine.push((f, order));
                                }
                            }
                            Err(AllocError::OutOfMemory { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    } else if let Some((f, k)) = mine.pop() {
                        checker.give(f, k);
                        a.free_on(t, f, k).unwrap();
                    }
                }
                for (f, k) in mine {
                    checker.give(f, k);
                    a.free_on(t, f, k).unwrap();
                }
                rx
            })
        })
        .collect();
    drop(txs);
    let rxs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (t, rx) in rxs.into_iter().enumerate() {
        while let Ok((f, k)) = rx.try_recv() {
            checker.give(f, k);
            a.free_on(t, f, k).unwrap();
        }
    }
    assert_fully_coalesced(&*a);
}

#[test]
fn stress_distributed() {
    stress(AllocatorKind::Distributed);
}

#[test]
fn stress_global_lock() {
    stress(AllocatorKind::GlobalLock);
}

#[test]
fn stress_linux_pcp() {
    stress(AllocatorKind::LinuxPcp);
}

/// Two threads allocate until out of memory; together they must hold every
/// frame. After a full free, everything is allocatable again.
fn oom_then_recover(kind: AllocatorKind, order: u32) {
    let frames = 2048u64;
    let a: Arc<dyn FrameAllocator> = Arc::from(build(kind, frames, &config(2, Some(5))));
    for round in 0..2 {
        let held: Vec<Vec<u64>> = thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|t| {
                    let a = a.clone();
                    s.spawn(move || {
                        let mut got = Vec::new();
                        loop {
                            match a.alloc_on(t, order) {
                                Ok(f) => got.push(f),
                                Err(AllocError::OutOfMemory { .. }) => break got,
                                Err(e) => panic!("{e}"),
                            }
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = held.iter().flatten().copied().collect();
        // A frame that was in flight when a thread gave up is still allocatable.
        while let Ok(f) = a.alloc_on(0, order) {
            all.push(f);
        }
        assert_eq!(
            all.len() as u64,
            frames >> order,
            "{kind} round {round}: frames missing at out-of-memory"
        );
        // Free cross-thread: each thread frees the other's frames.
        thread::scope(|s| {
            for (t, mine) in held.iter().enumerate() {
                let a = a.clone();
                s.spawn(move || {
                    for &f in mine {
                        a.free_on(1 - t, f, order).unwrap();
                    }
                });
            }
        });
        let counted: usize = held.iter().map(Vec::len).sum();
        for &f in &all[counted..] {
            a.free_on(1, f, order).unwrap();
        }
        assert_fully_coalesced(&*a);
    }
}

#[test]
fn oom_under_concurrency_distributed() {
    oom_then_recover(AllocatorKind::Distributed, 0);
    oom_then_recover(AllocatorKind::Distributed, 2);
}

#[test]
fn oom_under_concurrency_baselines() {
    oom_then_recover(AllocatorKind::GlobalLock, 0);
    oom_then_recover(AllocatorKind::LinuxPcp, 0);
    oom_then_recover(AllocatorKind::LinuxPcp, 2);
}
