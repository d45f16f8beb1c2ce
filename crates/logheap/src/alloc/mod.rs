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
    /// Live objects this attempt frees when it commits.
    pub frees: Vec<(u64, u64)>,
}

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
                true
            }
            None => false,
        }
    }

    /// Whether this attempt has already freed `home`.
    pub(crate) fn freed(&self, home: u64) -> bool {
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
    }

    /// Empties every list (the transaction has ended).
    pub(crate) fn clear(&mut self) {
        self.allocs.clear();
        self.alloc_then_freed.clear();
        self.frees.clear();
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
