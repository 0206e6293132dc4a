//! Offline references for the miss ratio of a trace, for `memlab cache`.
//!
//! They tell how much of a miss-ratio gap between two caches a better
//! policy could still close:
//!
//! * `opt`: Belady's MIN (Belady 1966; Mattson et al. 1970), with bypass:
//!   after each request the item whose next request lies furthest in the
//!   future leaves, which may be the one just requested (a cache may
//!   decline to store). It knows the future, so it is the lowest miss
//!   ratio of any cache holding `capacity` items.
//! * `top-c`: the best *static* content: the `capacity` most popular keys
//!   of the distribution the trace is drawn from, each cached from its
//!   first request on and never evicted; every other key always misses.
//!   On a trace whose requests are independent draws from a fixed
//!   popularity (the zipf traces), this is what LFU with perfect
//!   frequency estimates achieves: a reference for frequency-based
//!   policies, not a bound (where the cache is large, recency pays too
//!   and LRU-like caches miss less than a static set).
//!
//! `opt` is a bound: no cache holding `capacity` items misses less. Both
//! count a miss the same way as the caches (a request in the
//! measured part of the trace that does not find its key) and hold
//! `capacity` items: the cache's bytes over one item's key and value bytes,
//! i.e. as if an item cost no metadata at all, more items than any real
//! cache holds in the same memory.

use std::collections::{BinaryHeap, HashMap, HashSet};

use super::Req;

/// Belady's MIN: the miss ratio of the counted requests of `reqs` with
/// room for `capacity` items.
pub(super) fn opt_miss_ratio(reqs: &[Req], capacity: usize) -> f64 {
    const NEVER: usize = usize::MAX;
    let mut next_use = vec![NEVER; reqs.len()];
    let mut last: HashMap<u64, usize> = HashMap::new();
    for (i, r) in reqs.iter().enumerate().rev() {
        if let Some(j) = last.insert(r.key, i) {
            next_use[i] = j;
        }
    }
    // key -> its next use; a max-heap of (next use, key) with stale entries
    // skipped when popped.
    let mut held: HashMap<u64, usize> = HashMap::with_capacity(capacity + 1);
    let mut heap: BinaryHeap<(usize, u64)> = BinaryHeap::new();
    let (mut misses, mut counted) = (0u64, 0u64);
    for (i, r) in reqs.iter().enumerate() {
        let hit = held.contains_key(&r.key);
        if r.counted {
            counted += 1;
            misses += u64::from(!hit);
        }
        held.insert(r.key, next_use[i]);
        heap.push((next_use[i], r.key));
        while held.len() > capacity {
            let Some((nu, k)) = heap.pop() else { break };
            if held.get(&k) == Some(&nu) {
                held.remove(&k);
            }
        }
        // Keep the heap from growing with stale entries without bound.
        if heap.len() > 4 * (capacity + 16) {
            heap = held.iter().map(|(&k, &nu)| (nu, k)).collect();
        }
    }
    misses as f64 / counted.max(1) as f64
}

/// The best static content: the miss ratio of the counted requests of
/// `reqs` when the first `capacity` keys of `popular` (the keys from the
/// most popular down) are kept from their first request on and nothing
/// else is kept.
pub(super) fn top_c_miss_ratio(reqs: &[Req], popular: &[u64], capacity: usize) -> f64 {
    let top: HashSet<u64> = popular.iter().take(capacity).copied().collect();
    let mut seen: HashSet<u64> = HashSet::new();
    let (mut misses, mut counted) = (0u64, 0u64);
    for r in reqs {
        // A kept key hits from its second request on.
        let hit = top.contains(&r.key) && !seen.insert(r.key);
        if r.counted {
            counted += 1;
            misses += u64::from(!hit);
        }
    }
    misses as f64 / counted.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn reqs(keys: &[u64]) -> Vec<Req> {
        keys.iter()
            .map(|&key| Req {
                key,
                ttl_secs: 0,
                counted: true,
            })
            .collect()
    }

    /// An exact LRU, the model the bounds must never lose to.
    fn lru_miss_ratio(reqs: &[Req], capacity: usize) -> f64 {
        let mut q: VecDeque<u64> = VecDeque::new();
        let (mut misses, mut counted) = (0u64, 0u64);
        for r in reqs {
            let hit = match q.iter().position(|&k| k == r.key) {
                Some(p) => {
                    q.remove(p);
                    true
                }
                None => false,
            };
            q.push_back(r.key);
            if q.len() > capacity {
                q.pop_front();
            }
            if r.counted {
                counted += 1;
                misses += u64::from(!hit);
            }
        }
        misses as f64 / counted.max(1) as f64
    }

    #[test]
    fn opt_on_a_textbook_trace() {
        // 7 0 1 2 0 3 0 4 2 3 0 3 2 1 2 0 1 7 0 1 with 3 frames: MIN
        // faults 9 times when every page must be loaded (Silberschatz's
        // example), 8 with bypass (the 4 at step 8 is never requested
        // again, so it is not stored), LRU 12.
        let t = reqs(&[7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]);
        assert!((opt_miss_ratio(&t, 3) - 8.0 / 20.0).abs() < 1e-12);
        assert!((lru_miss_ratio(&t, 3) - 12.0 / 20.0).abs() < 1e-12);
    }

    #[test]
    fn bounds_never_lose_to_lru_and_top_c_counts_what_it_keeps() {
        let t = super::super::make_trace(super::super::TraceKind::Zipf(1.0), 3000);
        for cap in [10, 100, 300, 3000] {
            let (opt, lru) = (opt_miss_ratio(&t.reqs, cap), lru_miss_ratio(&t.reqs, cap));
            let top = top_c_miss_ratio(&t.reqs, &t.popular, cap);
            assert!(opt <= lru + 1e-12, "cap {cap}: opt {opt} lru {lru}");
            assert!(opt <= top + 1e-12, "cap {cap}: opt {opt} top-c {top}");
            // On independent zipf draws the best static set beats LRU.
            if cap < 3000 {
                assert!(top < lru, "cap {cap}: top-c {top} lru {lru}");
            }
        }
        // Room for every key: all three miss only on first use.
        let first = {
            let mut seen = HashSet::new();
            t.reqs
                .iter()
                .filter(|r| seen.insert(r.key) && r.counted)
                .count() as f64
                / t.reqs.iter().filter(|r| r.counted).count() as f64
        };
        assert!((top_c_miss_ratio(&t.reqs, &t.popular, 3000) - first).abs() < 1e-12);
        assert!((opt_miss_ratio(&t.reqs, 3000) - first).abs() < 1e-12);
        // One item, a trace of one key: only the first request misses;
        // a key that is not among the popular ones always misses.
        assert!((top_c_miss_ratio(&reqs(&[5, 5, 5, 5]), &[5], 1) - 0.25).abs() < 1e-12);
        assert!((top_c_miss_ratio(&reqs(&[5, 5, 6, 6]), &[5], 1) - 0.75).abs() < 1e-12);
    }
}
