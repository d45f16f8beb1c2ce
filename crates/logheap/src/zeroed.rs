//! Large tables that start all zero and take memory only where they are written.
//!
//! The STM's lock table and the log engine's home-cache page table are megabytes of
//! words of which a run touches few. `vec![0; n]` gives untouched zero pages only while
//! the C allocator answers a request that large with a fresh `mmap`: glibc raises its
//! mmap threshold (up to 32 MiB) each time such a block is freed, so from the second
//! pool a process opens, each table came from the heap and was cleared with `memset`
//! (8 MiB each, about a millisecond per open, and all of it resident). An anonymous
//! mapping of our own is always lazily zero, and its pages go back when it is dropped.

use std::ptr::NonNull;

/// A slice of `len` values of `T`, all bits zero at first, in an anonymous mapping.
pub(crate) struct ZeroedTable<T> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: the table owns its values as a `Box<[T]>` would.
unsafe impl<T: Send> Send for ZeroedTable<T> {}
// SAFETY: as above: shared references give `&[T]` only.
unsafe impl<T: Sync> Sync for ZeroedTable<T> {}

impl<T> ZeroedTable<T> {
    /// A table of `len` values (at least one), each all bits zero.
    ///
    /// # Safety
    /// All bits zero must be a valid `T` (an atomic integer, an atomic pointer: null),
    /// and `T` must need no drop.
    pub(crate) unsafe fn new(len: usize) -> ZeroedTable<T> {
        const {
            assert!(
                std::mem::size_of::<T>() > 0 && std::mem::align_of::<T>() <= 4096,
                "a table of values that take room and fit a page's alignment"
            )
        };
        let len = len.max(1);
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("a table of that many values fits no address space");
        // SAFETY: a new private anonymous mapping at an address the kernel chooses
        // touches no existing memory; it is page-aligned, so aligned for any `T` of an
        // alignment up to a page.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                bytes,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
            )
        };
        let ptr = match ptr {
            Ok(p) => p,
            // Out of address space: the same as the allocator running out.
            Err(e) => match std::alloc::Layout::array::<T>(len) {
                Ok(layout) => std::alloc::handle_alloc_error(layout),
                Err(_) => panic!("a table of {bytes} bytes fits no address space: {e}"),
            },
        };
        ZeroedTable {
            ptr: NonNull::new(ptr.cast()).expect("mmap never returns null on success"),
            len,
        }
    }

    fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

impl<T> std::ops::Deref for ZeroedTable<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` values of `T`, all valid (zero bits, by `new`'s
        // contract, or values stored through the slice since), and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> std::ops::DerefMut for ZeroedTable<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for ZeroedTable<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `new` with this length and nothing borrows it
        // any more; `T` needs no drop (`new`'s contract).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.bytes()) };
    }
}

impl<T> std::fmt::Debug for ZeroedTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeroedTable")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn a_table_starts_zero_keeps_what_is_stored_and_can_be_huge() {
        // SAFETY: a zero `AtomicU64` is 0.
        let table = unsafe { ZeroedTable::<AtomicU64>::new(1 << 24) };
        assert_eq!(table.len(), 1 << 24);
        assert!(
            table
                .iter()
                .step_by(4096)
                .all(|w| w.load(Ordering::Relaxed) == 0)
        );
        table[12345].store(7, Ordering::Relaxed);
        table[(1 << 24) - 1].store(9, Ordering::Relaxed);
        assert_eq!(table[12345].load(Ordering::Relaxed), 7);
        assert_eq!(table[(1 << 24) - 1].load(Ordering::Relaxed), 9);
        // SAFETY: as above.
        let one = unsafe { ZeroedTable::<AtomicU64>::new(0) };
        assert_eq!(one.len(), 1);
    }
}
