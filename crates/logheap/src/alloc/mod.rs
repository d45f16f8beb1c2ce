//! Allocators, as a layer of their own under the engines.
//!
//! A transaction *reserves* space while it runs and its engine's commit *publishes* it
//! (PMDK's `palloc_reserve` / `palloc_publish` split): a reservation is the allocator's
//! DRAM state only, so an attempt that aborts, or a crash before the commit is durable,
//! leaks nothing. What a transaction frees stays allocated until its commit is
//! published, so no other transaction can reuse the space before the free is durable.
//!
//! - `home`: the log-structured engine's home-space allocator, whose state is rebuilt
//!   from the log on recovery (nothing of it is persisted by itself).
//! - [`PersistentHeap`]: PAllocator (002), a persistent, recoverable and leak-free
//!   allocator in a pool of its own (engine `alloc`), with [`PAddr`] persistent
//!   addresses, arenas, segregated fit for small blocks (`small`), best fit for big
//!   ones (`big`), huge blocks over whole regions, and in-place metadata (`layout`).

mod addr;
mod big;
mod defragment;
mod files;
pub(crate) mod home;
pub(crate) mod layout;
mod metadata_log;
pub(crate) mod persistent_heap;
mod small;

pub use addr::{MAX_FILE_ID, MAX_OFFSET, OFFSET_BITS, PAddr};
pub use defragment::Defragmentation;
pub use layout::{DEFAULT_LOG_RECORDS, MetadataPolicy};
pub(crate) use persistent_heap::Replay;
pub use persistent_heap::{Block, HeapOptions, HeapRecovery, HeapStats, PersistentHeap};

use crate::error::Result;

/// An allocator transactions reserve from and publish to (see the module docs).
pub(crate) trait TxHeap: Send + Sync {
    /// Reserves `size` bytes for a transaction and returns their home offset.
    fn reserve(&self, size: u64) -> Result<u64>;
    /// The size of the live allocation starting at `home`, if there is one.
    fn size_of(&self, home: u64) -> Option<u64>;
    /// Gives back reservations that will not be published (their transaction aborted,
    /// or freed them again); nothing to do for an empty list.
    fn cancel(&self, reserved: &[(u64, u64)]);
    /// Publishes a committed transaction's allocations and frees (called once the
    /// commit is durable, while its locks are held): the freed space becomes reusable.
    fn publish(&self, allocs: &[(u64, u64)], frees: &[(u64, u64)]);
    /// Every live allocation `(home, size)`, sorted.
    fn allocations(&self) -> Vec<(u64, u64)>;
    /// Live allocations and their bytes.
    fn live(&self) -> (u64, u64);
}

/// What one transaction attempt allocates and frees: `(home, size)` pairs.
#[derive(Debug, Default)]
pub(crate) struct TxAllocs {
    /// Reserved by this attempt, to be published by its commit.
    pub allocs: Vec<(u64, u64)>,
    /// Reserved and freed again by this attempt: given back at its end.
    pub alloc_then_freed: Vec<(u64, u64)>,
    /// Live objects this attempt frees when it commits (added with
    /// [`TxAllocs::push_free`]).
    pub frees: Vec<(u64, u64)>,
    /// The homes of `frees` and `alloc_then_freed` once they are more than
    /// [`FREED_SCAN_LIMIT`] (empty until then): a transaction that frees thousands of
    /// objects (a range delete) checks each free against the others in constant time,
    /// not by a scan. Cleared with them, its capacity kept.
    freed_index: std::collections::HashSet<u64>,
}

/// Up to this many frees in one attempt, [`TxAllocs::freed`] scans them.
const FREED_SCAN_LIMIT: usize = 32;

impl TxAllocs {
    /// Whether the attempt allocates or frees anything.
    pub(crate) fn is_empty(&self) -> bool {
        self.allocs.is_empty() && self.frees.is_empty()
    }

    /// Frees an object this attempt allocated: true if `home` was one (it is then given
    /// back at the attempt's end, never published).
    pub(crate) fn free_own(&mut self, home: u64) -> bool {
        match self.allocs.iter().position(|&(h, _)| h == home) {
            Some(k) => {
                let a = self.allocs.swap_remove(k);
                self.alloc_then_freed.push(a);
                self.note_freed(a.0);
                true
            }
            None => false,
        }
    }

    /// Frees the published object `home` of `size` bytes when the attempt commits.
    pub(crate) fn push_free(&mut self, home: u64, size: u64) {
        self.frees.push((home, size));
        self.note_freed(home);
    }

    /// Keeps the index of freed homes up to date (building it when the frees pass
    /// [`FREED_SCAN_LIMIT`]).
    fn note_freed(&mut self, home: u64) {
        let n = self.frees.len() + self.alloc_then_freed.len();
        if n == FREED_SCAN_LIMIT + 1 {
            let all = self.frees.iter().chain(&self.alloc_then_freed);
            self.freed_index.extend(all.map(|&(h, _)| h));
        } else if n > FREED_SCAN_LIMIT + 1 {
            self.freed_index.insert(home);
        }
    }

    /// Forgets this attempt's frees of published objects (it is retried).
    pub(crate) fn clear_frees(&mut self) {
        self.frees.clear();
        self.rebuild_freed_index();
    }

    /// The index of freed homes made anew from the lists (after one was cleared).
    fn rebuild_freed_index(&mut self) {
        self.freed_index.clear();
        if self.frees.len() + self.alloc_then_freed.len() > FREED_SCAN_LIMIT {
            let all = self.frees.iter().chain(&self.alloc_then_freed);
            self.freed_index.extend(all.map(|&(h, _)| h));
        }
    }

    /// Whether this attempt has already freed `home`.
    pub(crate) fn freed(&self, home: u64) -> bool {
        if self.frees.len() + self.alloc_then_freed.len() > FREED_SCAN_LIMIT {
            return self.freed_index.contains(&home);
        }
        self.frees
            .iter()
            .chain(&self.alloc_then_freed)
            .any(|&(h, _)| h == home)
    }

    /// Gives everything this attempt reserved back to `heap` (it will not commit).
    pub(crate) fn cancel(&mut self, heap: &impl TxHeap) {
        heap.cancel(&self.allocs);
        self.allocs.clear();
        self.cancel_freed_again(heap);
    }

    /// Gives back what this attempt allocated and freed again (after its commit).
    pub(crate) fn cancel_freed_again(&mut self, heap: &impl TxHeap) {
        heap.cancel(&self.alloc_then_freed);
        self.alloc_then_freed.clear();
        self.rebuild_freed_index();
    }

    /// Empties every list (the transaction has ended).
    pub(crate) fn clear(&mut self) {
        self.allocs.clear();
        self.alloc_then_freed.clear();
        self.frees.clear();
        self.freed_index.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A heap that records what is given back to it.
    #[derive(Default)]
    struct Recorder {
        cancelled: Mutex<Vec<u64>>,
    }

    impl TxHeap for Recorder {
        fn reserve(&self, _size: u64) -> Result<u64> {
            unreachable!("not used by these tests")
        }
        fn size_of(&self, _home: u64) -> Option<u64> {
            None
        }
        fn cancel(&self, reserved: &[(u64, u64)]) {
            let mut c = self.cancelled.lock().unwrap();
            c.extend(reserved.iter().map(|&(h, _)| h));
        }
        fn publish(&self, _allocs: &[(u64, u64)], _frees: &[(u64, u64)]) {}
        fn allocations(&self) -> Vec<(u64, u64)> {
            Vec::new()
        }
        fn live(&self) -> (u64, u64) {
            (0, 0)
        }
    }

    #[test]
    fn freed_answers_alike_for_few_and_many_frees_and_after_either_list_is_cleared() {
        let heap = Recorder::default();
        let mut t = TxAllocs::default();
        t.allocs.extend((0..50u64).map(|i| (10_000 + i * 16, 16)));
        for i in 0..100u64 {
            t.push_free(i * 64, 64);
            if i % 2 == 0 {
                assert!(t.free_own(10_000 + i / 2 * 16));
            }
            // Every home freed so far, and none other.
            assert!((0..=i).all(|k| t.freed(k * 64)), "after {i}");
            assert!(!t.freed(i * 64 + 8) && !t.freed((i + 1) * 64));
        }
        assert!(t.freed(10_000) && !t.freed(10_000 + 50 * 16));
        // The published frees forgotten (a retry): those allocated and freed remain.
        t.clear_frees();
        assert!(!t.freed(0) && !t.freed(99 * 64));
        assert!((0..50u64).all(|k| t.freed(10_000 + k * 16)));
        // Those given back: nothing is freed any more.
        t.cancel_freed_again(&heap);
        assert!(!t.freed(10_000));
        t.push_free(64, 64);
        assert!(t.freed(64) && !t.freed(0));
    }

    #[test]
    fn an_object_allocated_and_freed_by_one_attempt_is_never_published() {
        let heap = Recorder::default();
        let mut t = TxAllocs::default();
        t.allocs.extend([(100, 8), (200, 8)]);
        t.frees.push((300, 8));
        assert!(t.free_own(100));
        assert!(!t.free_own(300), "300 is not this attempt's own allocation");
        assert_eq!(t.allocs, vec![(200, 8)]);
        assert!(t.freed(100) && t.freed(300) && !t.freed(200));
        t.cancel_freed_again(&heap);
        assert_eq!(*heap.cancelled.lock().unwrap(), vec![100]);
        assert!(!t.is_empty());
    }

    #[test]
    fn cancelling_an_attempt_gives_back_every_reservation_once() {
        let heap = Recorder::default();
        let mut t = TxAllocs::default();
        t.allocs.extend([(100, 8), (200, 8)]);
        t.free_own(200);
        t.cancel(&heap);
        t.cancel(&heap);
        let mut c = heap.cancelled.lock().unwrap().clone();
        c.sort_unstable();
        assert_eq!(c, vec![100, 200]);
        assert!(t.allocs.is_empty() && t.alloc_then_freed.is_empty());
    }
}
