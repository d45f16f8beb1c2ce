//! A heap with nothing in it, for the model engines of the driver's tests
//! (`tests.rs`, `loom_tests.rs`): they allocate nothing.

use crate::alloc::TxHeap;
use crate::error::{Error, Result};

/// A heap that holds nothing and refuses every reservation.
pub(super) struct NoHeap;

impl TxHeap for NoHeap {
    fn reserve(&self, _size: u64) -> Result<u64> {
        Err(Error::PoolFull)
    }
    fn size_of(&self, _home: u64) -> Option<u64> {
        None
    }
    fn cancel(&self, _reserved: &[(u64, u64)]) {}
    fn publish(&self, _allocs: &[(u64, u64)], _frees: &[(u64, u64)]) {}
    fn allocations(&self) -> Vec<(u64, u64)> {
        Vec::new()
    }
    fn live(&self) -> (u64, u64) {
        (0, 0)
    }
}
