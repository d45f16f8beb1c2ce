//! The transaction handle.

use bytemuck::Pod;

use crate::engine::log::{LogEngine, TxState};
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
    engine: &'p LogEngine,
    pub(crate) state: TxState,
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        LogEngine::finish(std::mem::take(&mut self.state));
    }
}

impl<'p> Tx<'p> {
    pub(crate) fn new(engine: &'p LogEngine, read_only: bool) -> Tx<'p> {
        Tx {
            engine,
            state: engine.begin(read_only),
        }
    }

    /// Whether this transaction can only read.
    pub fn is_read_only(&self) -> bool {
        self.state.read_only()
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

    /// Reads `buf.len()` bytes at home offset `home`. Bytes never written read as zero.
    pub fn read_bytes(&mut self, home: u64, buf: &mut [u8]) -> Result<()> {
        self.engine.read(&mut self.state, home, buf)
    }

    /// Writes `bytes` at home offset `home` (buffered until commit). The range may span
    /// objects; it must lie in the home space.
    pub fn write_bytes(&mut self, home: u64, bytes: &[u8]) -> Result<()> {
        self.engine.write(&mut self.state, home, bytes)
    }

    /// Allocates a new object holding `value`.
    pub fn alloc<T: Pod>(&mut self, value: T) -> Result<PPtr<T>> {
        let bytes = bytemuck::bytes_of(&value);
        let home = self
            .engine
            .alloc(&mut self.state, bytes.len() as u64, Some(bytes))?;
        Ok(PPtr::from_offset(home))
    }

    /// Allocates a new zero-filled `T`.
    pub fn alloc_zeroed<T: Pod>(&mut self) -> Result<PPtr<T>> {
        let home = self.alloc_bytes(std::mem::size_of::<T>() as u64)?;
        Ok(PPtr::from_offset(home))
    }

    /// Allocates `len` zero-filled bytes and returns their home offset.
    pub fn alloc_bytes(&mut self, len: u64) -> Result<u64> {
        self.engine.alloc(&mut self.state, len, None)
    }

    /// Frees the object at `p` when the transaction commits.
    pub fn free<T>(&mut self, p: PPtr<T>) -> Result<()> {
        if p.is_null() {
            return Err(Error::InvalidFree { home: 0 });
        }
        self.engine.free(&mut self.state, p.offset())
    }
}
