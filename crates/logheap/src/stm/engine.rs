//! The seam between the TL2 driver and the engines it drives: the [`Engine`] trait,
//! and what a commit hands an engine ([`CommitSet`]) and gets back ([`Persisted`]).
//! It lives beside its consumer, the driver; engines implement it (as redb keeps its
//! `StorageBackend` beside `Database`).

use std::sync::Arc;
use std::thread::LocalKey;

use super::{Domain, SpareState, WriteSet};

use crate::alloc::{TxAllocs, TxHeap};
use crate::error::Result;
use crate::media::Media;

/// What a committing transaction hands its engine, under its locks.
#[derive(Debug)]
pub(crate) struct CommitSet<'a> {
    /// The commit version (unique, above every version committed before).
    pub version: u64,
    /// The buffered writes.
    pub writes: &'a WriteSet,
    /// Allocations (sorted), frees and allocations freed again.
    pub allocs: &'a TxAllocs,
}

/// What [`Engine::persist`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Persisted {
    /// Nothing needed persisting (everything written was freed again by the
    /// transaction): the commit ends at once.
    Nothing,
    /// The commit set is durable; `payload` bytes of user data were written.
    Durable {
        /// Bytes of user data the commit wrote (for write amplification).
        payload: u64,
    },
}

/// One transaction engine (see the module docs). Calls on the hot paths are static
/// (the pool dispatches once per transaction through an enum).
pub(crate) trait Engine: Send + Sync + Sized + 'static {
    /// The engine's per-transaction state, reused across a thread's transactions.
    type Scratch: Default + 'static;
    /// The allocator transactions reserve from.
    type Heap: TxHeap;
    /// Whether a block just reserved reads as zeros without being written (the log
    /// engine's fresh log blocks). Otherwise a zero-filled allocation is written with
    /// zeros in its transaction (a reserved block of the persistent heap holds whatever
    /// its last owner left).
    const FRESH_BLOCKS_READ_ZERO: bool;

    /// The thread-local slot keeping a finished transaction's state for the thread's
    /// next one (one per engine type: a `thread_local!` in generic code would be shared
    /// by every engine).
    fn spare() -> &'static LocalKey<SpareState<Self::Scratch>>;
    /// The concurrency-control state (created by the engine when it opens, its clock
    /// above every version it recovered).
    fn shared(&self) -> &Arc<Domain>;
    /// The media of the pool.
    fn media(&self) -> &Arc<Media>;
    /// The allocator.
    fn heap(&self) -> &Self::Heap;
    /// A transaction begins (on this thread).
    fn begin(&self, scratch: &mut Self::Scratch);
    /// A transaction ends.
    fn end(scratch: &mut Self::Scratch);
    /// Whether `[home, home + len)` may be read and written by transactions.
    fn check_range(&self, home: u64, len: u64) -> Result<()>;
    /// Copies the committed bytes of `[home, home + buf.len())` (not empty); bytes never
    /// written are zero. The driver validates around it. Returns false when the bytes
    /// fail a check of the engine's own (the in-place engines' data checksums): once
    /// the driver's validation says the copy was not torn by a commit, the read fails
    /// with [`read_damage`](Self::read_damage).
    fn read_committed(&self, scratch: &Self::Scratch, home: u64, buf: &mut [u8]) -> bool;
    /// Whether [`committed_in_place`](Self::committed_in_place) can ever answer (else
    /// the driver does not ask).
    const KEEPS_COMMITTED_IN_PLACE: bool = false;
    /// The committed bytes of `[home, home + len)` (not empty) where they lie, when the
    /// engine keeps them in one place that nothing overwrites while `scratch`'s
    /// transaction runs (the log engine's log, under the transaction's epoch guard);
    /// `None` otherwise, and the driver copies them with
    /// [`read_committed`](Self::read_committed). Called between the driver's lock-word
    /// checks, as `read_committed` is: the slice is only used once they pass.
    fn committed_in_place<'s>(
        &'s self,
        scratch: &'s Self::Scratch,
        home: u64,
        len: u64,
    ) -> Option<&'s [u8]> {
        let _ = (scratch, home, len);
        None
    }
    /// The error of a read of `[home, home + len)` whose check failed
    /// ([`read_committed`](Self::read_committed) returned false); `Conflict` makes the
    /// transaction retry.
    fn read_damage(&self, home: u64, len: u64) -> crate::Error {
        let _ = (home, len);
        crate::Error::Conflict
    }
    /// A transaction that wrote is about to commit (no locks held).
    fn before_commit(&self, scratch: &mut Self::Scratch);
    /// Makes the commit set durable (under the commit's locks, after validation). On
    /// error nothing of it may be visible, now or after a crash.
    fn persist(&self, set: &CommitSet<'_>, scratch: &mut Self::Scratch) -> Result<Persisted>;
    /// Makes a durable commit set visible to reads (under the commit's locks).
    fn publish(&self, set: &CommitSet<'_>, scratch: &mut Self::Scratch);
    /// After [`persist`](Self::persist) failed with `PoolFull` (no locks held): makes
    /// room, and returns whether the commit, started at `since`, should be tried again.
    fn make_room(&self, scratch: &mut Self::Scratch, since: std::time::Instant) -> bool;
}
