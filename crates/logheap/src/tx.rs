//! The transaction handle.

use bytemuck::Pod;

use crate::engine::{AnyEngine, AnyTx, on_tx};
use crate::error::{Error, Result};
use crate::ptr::PPtr;

/// A transaction in progress, handed to the closure of
/// [`Pool::transaction`](crate::Pool::transaction) or [`Pool::read`](crate::Pool::read).
///
/// Reads see the transaction's consistent snapshot plus its own writes; writes,
/// allocations and frees take effect, all or nothing, when the closure returns `Ok`.
/// When an operation returns [`Error::Conflict`], return it from the closure (`?` does):
/// the transaction is then retried from the start.
pub struct Tx<'p> {
    inner: AnyTx<'p>,
}

impl<'p> Tx<'p> {
    /// Begins a transaction on `engine`.
    pub(crate) fn begin(engine: &'p AnyEngine, read_only: bool) -> Tx<'p> {
        Tx {
            inner: engine.begin(read_only),
        }
    }

    /// Commits the attempt.
    pub(crate) fn commit(&mut self) -> Result<()> {
        on_tx!(&mut self.inner, |stm, state| stm.commit(state))
    }

    /// Ends an attempt that will not commit.
    pub(crate) fn abort(&mut self) {
        on_tx!(&mut self.inner, |stm, state| stm.abort(state))
    }

    /// Prepares another attempt after [`abort`](Self::abort).
    pub(crate) fn restart(&mut self) {
        on_tx!(&mut self.inner, |stm, state| stm.restart(state))
    }

    /// Whether the attempt hit a conflict.
    pub(crate) fn conflicted(&mut self) -> bool {
        on_tx!(&mut self.inner, |_stm, state| state.conflicted())
    }

    /// Whether this transaction can only read.
    pub fn is_read_only(&self) -> bool {
        on_tx!(&self.inner, |_stm, state| state.read_only())
    }

    /// Reads the `T` at `p`.
    pub fn read<T: Pod>(&mut self, p: PPtr<T>) -> Result<T> {
        let mut value = <T as bytemuck::Zeroable>::zeroed();
        self.read_bytes(p.offset(), bytemuck::bytes_of_mut(&mut value))?;
        Ok(value)
    }

    /// Writes `value` at `p` (buffered until commit).
    pub fn write<T: Pod>(&mut self, p: PPtr<T>, value: &T) -> Result<()> {
        self.write_bytes(p.offset(), bytemuck::bytes_of(value))
    }

    /// Writes the 8-byte words of `new` that differ from `old`, the `T` at `p` as read
    /// earlier (runs of changed words at once): for a node edited in DRAM and written
    /// back, so the engine logs and persists only what changed. `T`'s size must be a
    /// multiple of 8 bytes.
    pub fn write_changes<T: Pod>(&mut self, p: PPtr<T>, old: &T, new: &T) -> Result<()> {
        let (a, b) = (bytemuck::bytes_of(old), bytemuck::bytes_of(new));
        if !a.len().is_multiple_of(8) {
            return Err(Error::InvalidSize(a.len() as u64));
        }
        let mut w = 0;
        while w < a.len() {
            if a[w..w + 8] == b[w..w + 8] {
                w += 8;
                continue;
            }
            let start = w;
            while w < a.len() && a[w..w + 8] != b[w..w + 8] {
                w += 8;
            }
            self.write_bytes(p.offset() + start as u64, &b[start..w])?;
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at home offset `home`. Bytes never written read as zero.
    pub fn read_bytes(&mut self, home: u64, buf: &mut [u8]) -> Result<()> {
        on_tx!(&mut self.inner, |stm, state| stm.read(state, home, buf))
    }

    /// Hands the `len` bytes at home offset `home`, as this transaction sees them, to
    /// `f` and returns what it returns. Where the engine can make it sound, `f` reads
    /// them where they lie, without a copy: on the `log` engine, a range the log holds
    /// in one piece (an object or value written whole in one transaction and not partly
    /// rewritten since; the transaction's own writes to it are not in the log yet),
    /// whose bytes nothing changes while the transaction runs. Otherwise `f` reads a
    /// copy (in a buffer the transaction keeps). Reads that went in place are counted
    /// in [`MediaCounters::reads_in_place`](crate::MediaCounters::reads_in_place).
    ///
    /// For large values read once (a key-value store's `get`), this saves the copy
    /// [`read_bytes`](Self::read_bytes) makes into the caller's buffer.
    pub fn read_with<R>(&mut self, home: u64, len: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        on_tx!(&mut self.inner, |stm, state| stm
            .read_with(state, home, len, f))
    }

    /// Writes `bytes` at home offset `home` (buffered until commit). The range may span
    /// objects; it must lie in the home space.
    pub fn write_bytes(&mut self, home: u64, bytes: &[u8]) -> Result<()> {
        on_tx!(&mut self.inner, |stm, state| stm.write(state, home, bytes))
    }

    /// Allocates a new object holding `value`.
    pub fn alloc<T: Pod>(&mut self, value: T) -> Result<PPtr<T>> {
        let bytes = bytemuck::bytes_of(&value);
        let len = bytes.len() as u64;
        let home = on_tx!(&mut self.inner, |stm, state| stm.alloc(
            state,
            len,
            Some(bytes)
        ))?;
        Ok(PPtr::from_offset(home))
    }

    /// Allocates a new zero-filled `T`.
    pub fn alloc_zeroed<T: Pod>(&mut self) -> Result<PPtr<T>> {
        let home = self.alloc_bytes(std::mem::size_of::<T>() as u64)?;
        Ok(PPtr::from_offset(home))
    }

    /// Allocates `len` zero-filled bytes and returns their home offset.
    pub fn alloc_bytes(&mut self, len: u64) -> Result<u64> {
        on_tx!(&mut self.inner, |stm, state| stm.alloc(state, len, None))
    }

    /// Allocates a new object holding a copy of `bytes` (as many bytes as it holds) and
    /// returns its home offset: for byte strings (a record, a value) whose length is
    /// known only at run time, written once rather than zero-filled and then written.
    pub fn alloc_from(&mut self, bytes: &[u8]) -> Result<u64> {
        let len = bytes.len() as u64;
        on_tx!(&mut self.inner, |stm, state| stm.alloc(
            state,
            len,
            Some(bytes)
        ))
    }

    /// The size of the object that begins at home offset `home` (as allocated), or
    /// `None` when no live object begins there: to check a length read from the pool
    /// before trusting it (a reader of a damaged pool must not allocate gigabytes on
    /// its word). It sees this transaction's own allocations and frees; the allocator
    /// answers for the rest without the transaction's snapshot, so use it as a check,
    /// not to decide what a transaction does.
    pub fn allocation_size(&mut self, home: u64) -> Option<u64> {
        on_tx!(&mut self.inner, |stm, state| stm
            .allocation_size(state, home))
    }

    /// Frees the object at `p` when the transaction commits.
    pub fn free<T>(&mut self, p: PPtr<T>) -> Result<()> {
        if p.is_null() {
            return Err(Error::InvalidFree { home: 0 });
        }
        let home = p.offset();
        on_tx!(&mut self.inner, |stm, state| stm.free(state, home))
    }
}

/// A transaction ended by hand, from [`Pool::begin`](crate::Pool::begin): its
/// operations are [`Tx`]'s (it dereferences to one); [`commit`](Self::commit) makes it
/// durable, [`abort`](Self::abort) or dropping it throws it away. A conflict is not
/// retried: the caller begins again.
pub struct Transaction<'p> {
    tx: Tx<'p>,
    ended: bool,
}

impl<'p> Transaction<'p> {
    pub(crate) fn new(tx: Tx<'p>) -> Transaction<'p> {
        Transaction { tx, ended: false }
    }

    /// Commits: `Ok` means durable. On an error (a conflict with a concurrent
    /// transaction included: [`Error::Conflict`]) nothing of it takes effect.
    pub fn commit(mut self) -> Result<()> {
        self.ended = true;
        let result = self.tx.commit();
        if result.is_err() {
            self.tx.abort();
        }
        result
    }

    /// Throws the transaction away: nothing of it takes effect.
    pub fn abort(mut self) {
        self.ended = true;
        self.tx.abort();
    }
}

impl<'p> std::ops::Deref for Transaction<'p> {
    type Target = Tx<'p>;
    fn deref(&self) -> &Tx<'p> {
        &self.tx
    }
}

impl<'p> std::ops::DerefMut for Transaction<'p> {
    fn deref_mut(&mut self) -> &mut Tx<'p> {
        &mut self.tx
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.tx.abort();
        }
    }
}

impl std::fmt::Debug for Transaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("read_only", &self.tx.is_read_only())
            .finish()
    }
}
