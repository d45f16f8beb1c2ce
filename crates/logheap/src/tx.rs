//! The transaction handle.

use bytemuck::Pod;

use crate::engine::inplace::oop::{OopEngine, OopScratch};
use crate::engine::inplace::redo::{RedoEngine, RedoScratch};
use crate::engine::inplace::undo::{UndoEngine, UndoScratch};
use crate::engine::log::{LogEngine, LogScratch};
use crate::error::{Error, Result};
use crate::heap::PoolEngine;
use crate::ptr::PPtr;
use crate::stm::{Stm, TxState};

/// A transaction in progress, handed to the closure of
/// [`Pool::transaction`](crate::Pool::transaction) or [`Pool::read`](crate::Pool::read).
///
/// Reads see the transaction's consistent snapshot plus its own writes; writes,
/// allocations and frees take effect, all or nothing, when the closure returns `Ok`.
/// When an operation returns [`Error::Conflict`], return it from the closure (`?` does):
/// the transaction is then retried from the start.
pub struct Tx<'p> {
    inner: TxInner<'p>,
}

/// A transaction on one engine: its driver and its state (one variant per engine, as
/// [`PoolEngine`]).
enum TxInner<'p> {
    Log(&'p Stm<LogEngine>, TxState<LogScratch>),
    Redo(&'p Stm<RedoEngine>, TxState<RedoScratch>),
    Undo(&'p Stm<UndoEngine>, TxState<UndoScratch>),
    Oop(&'p Stm<OopEngine>, TxState<OopScratch>),
}

/// Runs `$body` with `$stm` (the engine's driver) and `$state` (the transaction's
/// state) of `$tx`, whichever engine it runs on.
macro_rules! on_engine {
    ($tx:expr, |$stm:ident, $state:ident| $body:expr) => {
        match &mut $tx.inner {
            TxInner::Log($stm, $state) => $body,
            TxInner::Redo($stm, $state) => $body,
            TxInner::Undo($stm, $state) => $body,
            TxInner::Oop($stm, $state) => $body,
        }
    };
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        match &mut self.inner {
            TxInner::Log(_, state) => Stm::<LogEngine>::finish(std::mem::take(state)),
            TxInner::Redo(_, state) => Stm::<RedoEngine>::finish(std::mem::take(state)),
            TxInner::Undo(_, state) => Stm::<UndoEngine>::finish(std::mem::take(state)),
            TxInner::Oop(_, state) => Stm::<OopEngine>::finish(std::mem::take(state)),
        }
    }
}

impl<'p> Tx<'p> {
    /// Begins a transaction on `engine`.
    pub(crate) fn begin(engine: &'p PoolEngine, read_only: bool) -> Tx<'p> {
        let inner = match engine {
            PoolEngine::Log(stm) => TxInner::Log(stm, stm.begin(read_only)),
            PoolEngine::Redo(stm) => TxInner::Redo(stm, stm.begin(read_only)),
            PoolEngine::Undo(stm) => TxInner::Undo(stm, stm.begin(read_only)),
            PoolEngine::Oop(stm) => TxInner::Oop(stm, stm.begin(read_only)),
        };
        Tx { inner }
    }

    /// Commits the attempt.
    pub(crate) fn commit(&mut self) -> Result<()> {
        on_engine!(self, |stm, state| stm.commit(state))
    }

    /// Ends an attempt that will not commit.
    pub(crate) fn abort(&mut self) {
        on_engine!(self, |stm, state| stm.abort(state))
    }

    /// Prepares another attempt after [`abort`](Self::abort).
    pub(crate) fn restart(&mut self) {
        on_engine!(self, |stm, state| stm.restart(state))
    }

    /// Whether the attempt hit a conflict.
    pub(crate) fn conflicted(&mut self) -> bool {
        on_engine!(self, |_stm, state| state.conflicted())
    }

    /// Whether this transaction can only read.
    pub fn is_read_only(&self) -> bool {
        match &self.inner {
            TxInner::Log(_, state) => state.read_only(),
            TxInner::Redo(_, state) => state.read_only(),
            TxInner::Undo(_, state) => state.read_only(),
            TxInner::Oop(_, state) => state.read_only(),
        }
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
        on_engine!(self, |stm, state| stm.read(state, home, buf))
    }

    /// Writes `bytes` at home offset `home` (buffered until commit). The range may span
    /// objects; it must lie in the home space.
    pub fn write_bytes(&mut self, home: u64, bytes: &[u8]) -> Result<()> {
        on_engine!(self, |stm, state| stm.write(state, home, bytes))
    }

    /// Allocates a new object holding `value`.
    pub fn alloc<T: Pod>(&mut self, value: T) -> Result<PPtr<T>> {
        let bytes = bytemuck::bytes_of(&value);
        let len = bytes.len() as u64;
        let home = on_engine!(self, |stm, state| stm.alloc(state, len, Some(bytes)))?;
        Ok(PPtr::from_offset(home))
    }

    /// Allocates a new zero-filled `T`.
    pub fn alloc_zeroed<T: Pod>(&mut self) -> Result<PPtr<T>> {
        let home = self.alloc_bytes(std::mem::size_of::<T>() as u64)?;
        Ok(PPtr::from_offset(home))
    }

    /// Allocates `len` zero-filled bytes and returns their home offset.
    pub fn alloc_bytes(&mut self, len: u64) -> Result<u64> {
        on_engine!(self, |stm, state| stm.alloc(state, len, None))
    }

    /// Frees the object at `p` when the transaction commits.
    pub fn free<T>(&mut self, p: PPtr<T>) -> Result<()> {
        if p.is_null() {
            return Err(Error::InvalidFree { home: 0 });
        }
        let home = p.offset();
        on_engine!(self, |stm, state| stm.free(state, home))
    }
}
