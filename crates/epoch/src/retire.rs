//! Things waiting for a quiescent period: what compaction does with the
//! segments it has emptied.

use crate::EpochScheme;

/// An item and the stamp ([`EpochScheme::now`]) taken when it was retired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired<T> {
    /// The retired thing (a segment, a box, an index).
    pub item: T,
    /// Its retirement stamp, from the scheme that will judge it.
    pub retired_at: u64,
}

/// A list of retired items, handed back once no operation can still hold
/// a reference to them.
///
/// One list belongs to one owner (a compaction thread); share it behind a
/// lock if several threads retire. Stamps are only comparable within one
/// scheme, so use each list with one scheme.
#[derive(Debug)]
pub struct RetireList<T> {
    pending: Vec<Retired<T>>,
}

impl<T> RetireList<T> {
    /// An empty list.
    pub fn new() -> Self {
        RetireList {
            pending: Vec::new(),
        }
    }

    /// Retires `item`, stamping it with `scheme.now()`; returns the stamp.
    ///
    /// Call this only after `item` has been unlinked: no operation that
    /// starts from now on may be able to reach it. Operations already
    /// running may, and `collect` waits for them.
    pub fn push<S: EpochScheme + ?Sized>(&mut self, scheme: &S, item: T) -> u64 {
        let retired_at = scheme.now();
        self.pending.push(Retired { item, retired_at });
        retired_at
    }

    /// Adds an item stamped earlier (by the same scheme).
    pub fn push_retired(&mut self, retired: Retired<T>) {
        self.pending.push(retired);
    }

    /// Removes and returns, in retirement order, every item that is now
    /// safe to reuse under `scheme`.
    pub fn collect<S: EpochScheme + ?Sized>(&mut self, scheme: &S) -> Vec<T> {
        if self.pending.is_empty() {
            return Vec::new();
        }
        let bound = scheme.reclaim_bound();
        self.pending
            .extract_if(.., |retired| retired.retired_at < bound)
            .map(|retired| retired.item)
            .collect()
    }

    /// Items still waiting.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The items still waiting, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Retired<T>> {
        self.pending.iter()
    }

    /// Every item, safe or not: for teardown, once no thread can pin any
    /// more.
    pub fn into_items(self) -> Vec<T> {
        self.pending.into_iter().map(|r| r.item).collect()
    }
}

impl<T> Default for RetireList<T> {
    fn default() -> Self {
        RetireList::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AtomicEpochs, LogicalClock, TscConfig, TscEpochs};

    fn collect_waits_for_the_guard<S: EpochScheme>(scheme: &S) {
        let mut list = RetireList::new();
        list.push(scheme, "before");
        let guard = scheme.pin();
        list.push(scheme, "during-1");
        list.push(scheme, "during-2");
        assert_eq!(list.collect(scheme), vec!["before"]);
        assert_eq!(list.len(), 2);
        assert!(list.collect(scheme).is_empty(), "{}", scheme.name());
        drop(guard);
        assert_eq!(list.collect(scheme), vec!["during-1", "during-2"]);
        assert!(list.is_empty());
    }

    #[test]
    fn collect_waits_for_the_guard_tsc() {
        collect_waits_for_the_guard(&TscEpochs::with_clock(
            TscConfig::default(),
            LogicalClock::new(),
        ));
        collect_waits_for_the_guard(&TscEpochs::new());
    }

    #[test]
    fn collect_waits_for_the_guard_atomic() {
        collect_waits_for_the_guard(&AtomicEpochs::new());
    }

    #[test]
    fn works_through_dyn() {
        let scheme: Box<dyn EpochScheme> = crate::EpochKind::GlobalAtomic.build();
        let mut list = RetireList::new();
        let stamp = list.push(&*scheme, 7_u32);
        assert_eq!(list.iter().next().map(|r| r.retired_at), Some(stamp));
        assert_eq!(list.collect(&*scheme), vec![7]);
        list.push_retired(Retired {
            item: 8,
            retired_at: u64::MAX - 2,
        });
        assert!(list.collect(&*scheme).is_empty());
        assert_eq!(list.into_items(), vec![8]);
    }
}
