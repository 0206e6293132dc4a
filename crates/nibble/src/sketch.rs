//! Cache mode: how often each key is read, approximately (TinyLFU's
//! frequency sketch: Einziger, Friedman and Manes, "TinyLFU: A Highly
//! Efficient Cache Admission Policy", ACM TOS 2017; the one-word-per-key
//! layout is Caffeine's).
//!
//! Merge eviction (`compaction/evict.rs`) decides, object by object, what
//! a merge keeps. The object's accessed bit says only whether it was read
//! since it was last moved; a key that is read often but was evicted, or
//! re-set after a miss, looks as new as a key read once. The sketch
//! remembers reads of every key, stored or not, in a fixed table:
//!
//! ```text
//!  word = words[mix(hash) & mask]                      one 64-bit word per key
//!  ┌────────┬────────┬────────┬────────┐
//!  │ row 0  │ row 1  │ row 2  │ row 3  │  16 four-bit counters: 4 rows × 4
//!  └────────┴────────┴────────┴────────┘  row r: counter 4r + (2 bits of the hash)
//!  estimate = min over the 4 rows          (count-min: never below the truth
//!  read     = +1 on the rows at that min    unless halved; conservative update)
//!  every SAMPLE reads: every counter /= 2  (old popularity fades)
//! ```
//!
//! A read (hit or miss) costs one load and at most one compare-and-swap on
//! the key's word; a counter at 15 stays there, so the words of hot keys
//! are only read. A lost race loses that one count (the sketch is an
//! estimate). Reads are counted per thread and added to the shared total
//! every [`READS_PER_FLUSH`]; the compaction worker halves the counters
//! once the total passes [`SAMPLE_READS_PER_KEY`] times the store's key
//! count, as TinyLFU resets after a sample of ten times the cache's size.

use core::sync::atomic::{AtomicU64, Ordering};
use std::cell::Cell;

/// Capacity bytes per sketch word: with 1 KiB objects one word per key
/// (Caffeine's ratio), 0.8 % of the capacity, as much as the accessed
/// bits. Smaller objects share words and their estimates grow coarser.
pub(crate) const CAPACITY_BYTES_PER_WORD: usize = 1024;
/// Fewest and most words of a sketch.
const MIN_WORDS: usize = 64;
const MAX_WORDS: usize = 1 << 22;
/// Reads a thread counts before it adds them to the shared total.
const READS_PER_FLUSH: u32 = 64;
/// The counters halve after this many reads per key held.
pub(crate) const SAMPLE_READS_PER_KEY: u64 = 10;
/// Nibbles with the low three bits of each counter: a halving is a shift
/// right by one with the bit each counter got from its neighbour cleared.
const HALVE_MASK: u64 = 0x7777_7777_7777_7777;

thread_local! {
    static UNFLUSHED_READS: Cell<u32> = const { Cell::new(0) };
}

/// A count-min sketch of 4-bit counters, one word per key.
pub(crate) struct Sketch {
    words: Box<[AtomicU64]>,
    mask: u64,
    /// Reads counted since the last halving (flushed per thread).
    reads: AtomicU64,
}

impl Sketch {
    /// A sketch for a store of `capacity_bytes`.
    pub(crate) fn for_capacity(capacity_bytes: usize) -> Sketch {
        let n = (capacity_bytes / CAPACITY_BYTES_PER_WORD)
            .next_power_of_two()
            .clamp(MIN_WORDS, MAX_WORDS);
        Sketch {
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
            mask: n as u64 - 1,
            reads: AtomicU64::new(0),
        }
    }

    /// Bytes the sketch takes.
    pub(crate) fn bytes(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    /// The key's word and the shifts of its four counters.
    #[inline]
    fn slots(&self, hash: u64) -> (&AtomicU64, [u32; 4]) {
        // The index uses the hash's low and high bits; mix them so that
        // keys of one bucket spread over the sketch.
        let h = (hash ^ (hash >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let word = &self.words[((h >> 32) & self.mask) as usize];
        let mut shifts = [0u32; 4];
        for (r, s) in shifts.iter_mut().enumerate() {
            let pick = ((h >> (2 * r)) & 3) as u32;
            *s = 4 * (4 * r as u32 + pick);
        }
        (word, shifts)
    }

    /// The key with this hash was read (found or not).
    #[inline]
    pub(crate) fn record(&self, hash: u64) {
        let (word, shifts) = self.slots(hash);
        let cur = word.load(Ordering::Relaxed);
        let min = shifts.iter().map(|&s| (cur >> s) & 15).min().unwrap_or(15);
        if min < 15 {
            let add: u64 = shifts
                .iter()
                .filter(|&&s| (cur >> s) & 15 == min)
                .map(|&s| 1u64 << s)
                .fold(0, |a, b| a | b);
            // One try: a lost race loses one count of an estimate.
            let _ =
                word.compare_exchange_weak(cur, cur + add, Ordering::Relaxed, Ordering::Relaxed);
        }
        UNFLUSHED_READS.with(|c| {
            let n = c.get() + 1;
            if n >= READS_PER_FLUSH {
                self.reads.fetch_add(n as u64, Ordering::Relaxed);
                c.set(0);
            } else {
                c.set(n);
            }
        });
    }

    /// Start loading the counters of the key with this hash (one line),
    /// ahead of an [`Sketch::estimate`] of a batch of keys.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        let (word, _) = self.slots(hash);
        crate::prefetch::line((word as *const AtomicU64).cast());
    }

    /// How often the key with this hash was read, 0 to 15 (an
    /// over-estimate only where other keys share all four counters).
    #[inline]
    pub(crate) fn estimate(&self, hash: u64) -> u8 {
        let (word, shifts) = self.slots(hash);
        let cur = word.load(Ordering::Relaxed);
        shifts
            .iter()
            .map(|&s| ((cur >> s) & 15) as u8)
            .min()
            .unwrap_or(0)
    }

    /// Halve every counter if `keys` (the store's key count) times
    /// [`SAMPLE_READS_PER_KEY`] reads have been counted since the last
    /// halving; true if it did. Called by compaction workers.
    pub(crate) fn age_if_due(&self, keys: u64) -> bool {
        let due = SAMPLE_READS_PER_KEY * keys.max(MIN_WORDS as u64);
        let seen = self.reads.load(Ordering::Relaxed);
        if seen < due
            || self
                .reads
                .compare_exchange(seen, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        for w in self.words.iter() {
            // A read that lands between the load and the store loses its
            // count, as a lost race in `record` does.
            let v = w.load(Ordering::Relaxed);
            if v != 0 {
                w.store((v >> 1) & HALVE_MASK, Ordering::Relaxed);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(i: u64) -> u64 {
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) ^ i
    }

    #[test]
    fn counts_saturate_and_halve() {
        let s = Sketch::for_capacity(1 << 20);
        let k = mix(7);
        assert_eq!(s.estimate(k), 0);
        for n in 1..=20u8 {
            s.record(k);
            assert_eq!(s.estimate(k), n.min(15));
        }
        // Flush this thread's count, then age: due after 10 reads per key.
        s.reads.fetch_add(1 << 20, Ordering::Relaxed);
        assert!(s.age_if_due(1));
        assert_eq!(s.estimate(k), 7);
        assert!(!s.age_if_due(1), "the total restarted at zero");
    }

    /// Against a model: a key read more often than another is never
    /// estimated lower when neither saturates, and an estimate is never
    /// below the true count (count-min, no halving).
    #[test]
    fn estimates_follow_true_counts() {
        let s = Sketch::for_capacity(2 << 20); // 2,048 words
        let mut truth = std::collections::HashMap::new();
        for i in 0..1_000u64 {
            for _ in 0..(i % 5) {
                s.record(mix(i));
                *truth.entry(i).or_insert(0u8) += 1;
            }
        }
        let mut above = 0;
        for i in 0..1_000u64 {
            let t = truth.get(&i).copied().unwrap_or(0);
            let e = s.estimate(mix(i));
            assert!(e >= t, "key {i}: estimate {e} below {t}");
            above += usize::from(e > t);
        }
        assert!(above < 50, "{above} of 1000 over-estimated");
    }

    #[test]
    fn sized_by_capacity_within_bounds() {
        assert_eq!(Sketch::for_capacity(0).words.len(), MIN_WORDS);
        assert_eq!(Sketch::for_capacity(8 << 20).words.len(), 8_192);
        assert_eq!(Sketch::for_capacity(1 << 40).words.len(), MAX_WORDS);
        assert_eq!(Sketch::for_capacity(8 << 20).bytes(), 65_536);
    }
}
