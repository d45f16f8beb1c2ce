//! The TL2 driver every engine runs under: a transaction's snapshot, its validated
//! reads and buffered writes, and its commit (lock the written stripes, tick the clock,
//! validate the reads, let the engine persist and publish, release the locks at the new
//! version). The engine sees only a [`CommitSet`]; it never deals with locks or
//! versions itself.
//!
//! The order of a commit: locks → tick → validate → [`Engine::persist`] (durable when
//! it returns) → [`Engine::publish`] → the allocator's publish → release at the new
//! version. A reader therefore never sees data that is not durable: the stripes stay
//! locked until the commit is both durable and published.

use std::sync::Arc;

use super::{CommitSet, Engine, Persisted};
use super::{Domain, StripeLocks, WriteSet, is_locked, stripes, version_of};
use crate::alloc::{TxAllocs, TxHeap};
use crate::error::{Error, Result};

/// A thread's slot for a finished transaction's state, kept for its next transaction
/// (boxed: taking and giving it back moves a pointer, not the buffers).
pub(crate) type SpareState<S> = std::cell::Cell<Option<Box<TxState<S>>>>;

/// The largest copy buffer of [`Stm::read_with`] a thread keeps for its next
/// transactions (a larger one is given back to the allocator after its read).
const KEEP_COPY_BUFFER: usize = 1 << 16;

/// What [`Stm::read_in_place`] did with the reader it was handed.
enum InPlace<R, F> {
    /// It read the bytes in place and returned this.
    Read(R),
    /// The engine does not keep the bytes in place: the reader, unused.
    NotKept(F),
}

/// Adds the lock indices of `words` to a read set (consecutive reads of one stripe,
/// the fields of one object, are recorded once).
fn record_reads(reads: &mut Vec<u32>, words: &[(usize, u64)]) {
    for &(i, _) in words {
        if reads.last() != Some(&(i as u32)) {
            reads.push(i as u32);
        }
    }
}

/// The state of one transaction attempt. Its buffers are reused from one transaction of
/// a thread to the next ([`Stm::begin`], [`Stm::finish`]); `S` is the engine's own part.
#[derive(Debug, Default)]
pub(crate) struct TxState<S> {
    id: u64,
    rv: u64,
    read_only: bool,
    reads: Vec<u32>,
    writes: WriteSet,
    /// A read or free found a conflict: the attempt must be retried.
    conflicted: bool,
    stripe_words: Vec<(usize, u64)>,
    /// The buffer of [`Stm::read_with`]'s copies (kept up to [`KEEP_COPY_BUFFER`]).
    copy_buffer: Vec<u8>,
    /// Lock indices of the stripes the commit writes.
    indices: Vec<usize>,
    /// Lock words held during the commit.
    held: Vec<(usize, u64)>,
    /// What the attempt allocates and frees.
    allocs: TxAllocs,
    /// The engine's per-transaction state.
    pub(crate) scratch: S,
}

impl<S> TxState<S> {
    /// Whether this is a read-only transaction.
    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    /// Whether the attempt hit a conflict.
    pub(crate) fn conflicted(&self) -> bool {
        self.conflicted
    }

    /// Forgets what the attempt read, wrote and freed (its allocations are given back by
    /// `abort` or kept by `commit`).
    fn forget_attempt(&mut self) {
        self.reads.clear();
        self.writes.clear();
        self.allocs.clear_frees();
        self.conflicted = false;
    }

    fn wrote(&self) -> bool {
        !(self.writes.is_empty() && self.allocs.is_empty())
    }

    fn conflict(&mut self) -> Error {
        self.conflicted = true;
        Error::Conflict
    }
}

/// The driver over one engine `E` of an open pool.
#[derive(Debug)]
pub(crate) struct Stm<E> {
    shared: Arc<Domain>,
    engine: Arc<E>,
}

impl<E: Engine> Stm<E> {
    /// The driver of `engine`.
    pub(crate) fn new(engine: Arc<E>) -> Stm<E> {
        Stm {
            shared: engine.shared().clone(),
            engine,
        }
    }

    /// The engine.
    pub(crate) fn engine(&self) -> &Arc<E> {
        &self.engine
    }

    /// The engine, the driver gone.
    pub(crate) fn into_engine(self) -> Arc<E> {
        self.engine
    }

    /// Starts a transaction (its first attempt), on the buffers the thread's last
    /// transaction left if there are any.
    pub(crate) fn begin(&self, read_only: bool) -> Box<TxState<E::Scratch>> {
        let mut tx = E::spare().take().unwrap_or_default();
        self.engine.begin(&mut tx.scratch);
        if tx.id == 0 {
            // Kept with the state for the thread's later transactions: only one of them
            // runs at a time (a nested one takes a fresh state).
            tx.id = self.shared.new_owner();
        }
        tx.rv = self.shared.clock.now();
        tx.read_only = read_only;
        tx
    }

    /// Ends a transaction: keeps its buffers, emptied, for the thread's next one.
    pub(crate) fn finish(mut tx: Box<TxState<E::Scratch>>) {
        tx.forget_attempt();
        tx.allocs.clear();
        E::end(&mut tx.scratch);
        E::spare().set(Some(tx));
    }

    /// Ends an attempt that will not commit: gives back its reservations.
    pub(crate) fn abort(&self, tx: &mut TxState<E::Scratch>) {
        tx.allocs.cancel(self.engine.heap());
        self.engine.media().count_abort();
    }

    /// Prepares `tx` for another attempt after [`abort`](Self::abort).
    pub(crate) fn restart(&self, tx: &mut TxState<E::Scratch>) {
        tx.rv = self.shared.clock.now();
        tx.forget_attempt();
    }

    /// Whether every stripe `tx` read still has a version within its snapshot.
    fn reads_valid(&self, tx: &TxState<E::Scratch>, own: Option<&StripeLocks>) -> bool {
        let locks = &self.shared.locks;
        tx.reads.iter().all(|&i| {
            let w = locks.load(i as usize);
            if is_locked(w) {
                own.and_then(|l| l.previous_version(i as usize))
                    .is_some_and(|v| v <= tx.rv)
            } else {
                version_of(w) <= tx.rv
            }
        })
    }

    /// Moves `tx`'s snapshot to now if nothing it read has changed.
    fn extend(&self, tx: &mut TxState<E::Scratch>) -> bool {
        let now = self.shared.clock.now();
        if self.reads_valid(tx, None) {
            tx.rv = now;
            true
        } else {
            false
        }
    }

    /// Reads `[home, home + buf.len())` as of `tx`'s snapshot, with `tx`'s own writes.
    #[inline]
    pub(crate) fn read(
        &self,
        tx: &mut TxState<E::Scratch>,
        home: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.engine.check_range(home, buf.len() as u64)?;
        if tx.conflicted {
            return Err(Error::Conflict);
        }
        let span = stripes(home, buf.len() as u64);
        if span.end() - span.start() <= 1 {
            self.read_in_two_stripes(tx, *span.start(), *span.end(), home, buf)
        } else {
            self.read_across_stripes(tx, home, buf)
        }
    }

    /// [`read`](Self::read) of a range inside one stripe or over two neighbouring ones
    /// (most reads: a field, a small object, which a 64-byte stripe boundary may cut):
    /// their lock words are kept in registers, not in `stripe_words`. `last` is `first`
    /// (then both words are the one stripe's, loaded twice) or `first + 1`.
    #[inline]
    fn read_in_two_stripes(
        &self,
        tx: &mut TxState<E::Scratch>,
        first: u64,
        last: u64,
        home: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let locks = &self.shared.locks;
        let (i, j) = (locks.index(first), locks.index(last));
        loop {
            let (w, v) = (locks.load(i), locks.load(j));
            if is_locked(w) || is_locked(v) {
                return Err(tx.conflict());
            }
            if version_of(w).max(version_of(v)) > tx.rv {
                // A read-only transaction keeps no read set, so it cannot extend its
                // snapshot: it starts again at a new one.
                if !tx.read_only && self.extend(tx) {
                    continue;
                }
                return Err(tx.conflict());
            }
            let intact = self.engine.read_committed(&tx.scratch, home, buf);
            // As in `unchanged`: the copy's loads before the re-check's.
            super::atomic::fence(super::atomic::Ordering::Acquire);
            if locks.load(i) != w || locks.load(j) != v {
                return Err(tx.conflict());
            }
            if !intact {
                return Err(self.damaged(tx, home, buf.len()));
            }
            break;
        }
        if tx.read_only {
            return Ok(());
        }
        // Consecutive reads of one stripe (the fields of one object) are recorded once.
        if tx.reads.last() != Some(&(i as u32)) {
            tx.reads.push(i as u32);
        }
        if j != i {
            tx.reads.push(j as u32);
        }
        tx.writes.overlay(home, buf);
        Ok(())
    }

    /// [`read`](Self::read) of a range over more than two stripes.
    fn read_across_stripes(
        &self,
        tx: &mut TxState<E::Scratch>,
        home: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let mut words = std::mem::take(&mut tx.stripe_words);
        let read = self
            .check_stripes(tx, home, buf.len() as u64, &mut words)
            .and_then(|()| {
                let intact = self.engine.read_committed(&tx.scratch, home, buf);
                if !self.unchanged(&words) {
                    return Err(tx.conflict());
                }
                if !intact {
                    return Err(self.damaged(tx, home, buf.len()));
                }
                Ok(())
            });
        // A read-only transaction checks every read against its one snapshot as it is
        // made (TL2's read-only path): nothing to validate at the end, so no read set.
        if read.is_ok() && !tx.read_only {
            record_reads(&mut tx.reads, &words);
            tx.writes.overlay(home, buf);
        }
        tx.stripe_words = words;
        read
    }

    /// Loads the lock word of every stripe of `[home, home + len)` into `words`, each
    /// free and within `tx`'s snapshot (which a writer extends when a word is newer and
    /// nothing it read has changed); a conflict otherwise. The first half of a read over
    /// many stripes: the engine's copy (or lookup) follows, then [`unchanged`].
    ///
    /// [`unchanged`]: Self::unchanged
    fn check_stripes(
        &self,
        tx: &mut TxState<E::Scratch>,
        home: u64,
        len: u64,
        words: &mut Vec<(usize, u64)>,
    ) -> Result<()> {
        let locks = &self.shared.locks;
        'attempt: loop {
            words.clear();
            for s in stripes(home, len) {
                let i = locks.index(s);
                let w = locks.load(i);
                if is_locked(w) {
                    return Err(tx.conflict());
                }
                if version_of(w) > tx.rv {
                    // A read-only transaction keeps no read set, so it cannot extend
                    // its snapshot: it starts again at a new one.
                    if !tx.read_only && self.extend(tx) {
                        continue 'attempt;
                    }
                    return Err(tx.conflict());
                }
                words.push((i, w));
            }
            return Ok(());
        }
    }

    /// Whether every lock word [`check_stripes`](Self::check_stripes) loaded is still
    /// the same: the second half of a read over many stripes, after the engine's copy.
    fn unchanged(&self, words: &[(usize, u64)]) -> bool {
        // The copy's loads happen before the re-check's (a seqlock reader's fence: an
        // acquire load alone would not keep the earlier loads before it). Pairs with
        // the committer's lock acquisition before its stores.
        super::atomic::fence(super::atomic::Ordering::Acquire);
        let locks = &self.shared.locks;
        words.iter().all(|&(i, w)| locks.load(i) == w)
    }

    /// Hands the bytes of `[home, home + len)` as of `tx`'s snapshot, with `tx`'s own
    /// writes, to `f`. Where the engine keeps them in place
    /// ([`Engine::committed_in_place`]) and `tx` wrote none of them, `f` reads them
    /// there, without a copy; otherwise it reads a copy in `tx`'s buffer.
    pub(crate) fn read_with<R>(
        &self,
        tx: &mut TxState<E::Scratch>,
        home: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        if len == 0 {
            return Ok(f(&[]));
        }
        self.engine.check_range(home, len as u64)?;
        if tx.conflicted {
            return Err(Error::Conflict);
        }
        let f = if E::KEEPS_COMMITTED_IN_PLACE
            && (tx.read_only || !tx.writes.may_touch(home, len as u64))
        {
            match self.read_in_place(tx, home, len as u64, f)? {
                InPlace::Read(r) => return Ok(r),
                InPlace::NotKept(f) => f,
            }
        } else {
            f
        };
        // The buffer keeps its length (zeroed once, when it grows), so a read into it
        // writes its bytes once.
        let mut buf = std::mem::take(&mut tx.copy_buffer);
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let read = self
            .read(tx, home, &mut buf[..len])
            .map(|()| f(&buf[..len]));
        if buf.capacity() <= KEEP_COPY_BUFFER {
            tx.copy_buffer = buf;
        }
        read
    }

    /// [`read_with`](Self::read_with) where the engine keeps the bytes in place: the
    /// lock words of every stripe of the range checked before the engine finds the bytes
    /// and again after, as around a copy; then `f` reads them (they do not change while
    /// `tx` runs, so nothing needs checking after it).
    fn read_in_place<R, F: FnOnce(&[u8]) -> R>(
        &self,
        tx: &mut TxState<E::Scratch>,
        home: u64,
        len: u64,
        f: F,
    ) -> Result<InPlace<R, F>> {
        let mut words = std::mem::take(&mut tx.stripe_words);
        let read = self
            .check_stripes(tx, home, len, &mut words)
            .and_then(|()| {
                let Some(bytes) = self.engine.committed_in_place(&tx.scratch, home, len) else {
                    return Ok(InPlace::NotKept(f));
                };
                if !self.unchanged(&words) {
                    return Err(tx.conflict());
                }
                let r = f(bytes);
                self.engine.media().count_read_in_place();
                Ok(InPlace::Read(r))
            });
        if matches!(read, Ok(InPlace::Read(_))) && !tx.read_only {
            record_reads(&mut tx.reads, &words);
        }
        tx.stripe_words = words;
        read
    }

    /// A validated read whose engine check failed: the engine's error for it (a
    /// `Conflict` marks the transaction conflicted, so it retries).
    #[cold]
    fn damaged(&self, tx: &mut TxState<E::Scratch>, home: u64, len: usize) -> Error {
        match self.engine.read_damage(home, len as u64) {
            Error::Conflict => tx.conflict(),
            e => e,
        }
    }

    /// Buffers a write.
    #[inline]
    pub(crate) fn write(
        &self,
        tx: &mut TxState<E::Scratch>,
        home: u64,
        bytes: &[u8],
    ) -> Result<()> {
        if tx.read_only {
            return Err(Error::ReadOnly);
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.engine.check_range(home, bytes.len() as u64)?;
        tx.writes.push(home, bytes);
        Ok(())
    }

    /// Allocates `size` bytes, initialised with `init` (zeros if `None`).
    pub(crate) fn alloc(
        &self,
        tx: &mut TxState<E::Scratch>,
        size: u64,
        init: Option<&[u8]>,
    ) -> Result<u64> {
        if tx.read_only {
            return Err(Error::ReadOnly);
        }
        let home = self.engine.heap().reserve(size)?;
        tx.allocs.allocs.push((home, size));
        match init {
            Some(bytes) => tx.writes.push(home, bytes),
            None if !E::FRESH_BLOCKS_READ_ZERO => {
                const ZEROS: [u8; 4096] = [0; 4096];
                let mut at = 0;
                while at < size {
                    let n = (size - at).min(ZEROS.len() as u64);
                    tx.writes.push(home + at, &ZEROS[..n as usize]);
                    at += n;
                }
            }
            None => {}
        }
        Ok(home)
    }

    /// The size of the live allocation starting at `home` as `tx` sees it: one it made
    /// itself, or a published one it has not freed.
    pub(crate) fn allocation_size(&self, tx: &TxState<E::Scratch>, home: u64) -> Option<u64> {
        if let Some(&(_, size)) = tx.allocs.allocs.iter().find(|&&(h, _)| h == home) {
            return Some(size);
        }
        if tx.allocs.freed(home) {
            return None;
        }
        self.engine.heap().size_of(home)
    }

    /// Frees the allocation at `home` when the transaction commits.
    pub(crate) fn free(&self, tx: &mut TxState<E::Scratch>, home: u64) -> Result<()> {
        if tx.read_only {
            return Err(Error::ReadOnly);
        }
        if tx.allocs.free_own(home) {
            return Ok(());
        }
        if tx.allocs.freed(home) {
            return Err(Error::InvalidFree { home });
        }
        // Read the object's first byte, so that two transactions freeing it conflict.
        let mut probe = [0u8];
        self.read(tx, home, &mut probe)?;
        match self.engine.heap().size_of(home) {
            Some(size) => {
                tx.allocs.push_free(home, size);
                Ok(())
            }
            None if !self.reads_valid(tx, None) => Err(tx.conflict()),
            None => Err(Error::InvalidFree { home }),
        }
    }

    /// Commits `tx`: validate, persist, publish, release. On [`Error::PoolFull`] the
    /// engine may make room ([`Engine::make_room`], run without locks) and the commit is
    /// tried again.
    pub(crate) fn commit(&self, tx: &mut TxState<E::Scratch>) -> Result<()> {
        if tx.conflicted {
            return Err(Error::Conflict);
        }
        if !tx.wrote() {
            // Every read was validated against one snapshot: nothing to do.
            tx.allocs.cancel_freed_again(self.engine.heap());
            self.engine.media().count_transaction(false);
            return Ok(());
        }
        self.engine.before_commit(&mut tx.scratch);
        let start = std::time::Instant::now();
        loop {
            match self.commit_attempt(tx) {
                Err(Error::PoolFull) if self.engine.make_room(&mut tx.scratch, start) => {}
                result => return result,
            }
        }
    }

    /// One try of [`commit`](Self::commit) for a transaction that wrote.
    fn commit_attempt(&self, tx: &mut TxState<E::Scratch>) -> Result<()> {
        let locks = &self.shared.locks;
        let mut indices = std::mem::take(&mut tx.indices);
        indices.clear();
        let ranges = tx
            .writes
            .ranges()
            .chain(tx.allocs.allocs.iter().copied())
            .chain(tx.allocs.frees.iter().copied());
        for (home, len) in ranges {
            indices.extend(stripes(home, len).map(|s| locks.index(s)));
        }
        indices.sort_unstable();
        indices.dedup();
        let acquired = StripeLocks::acquire(locks, &indices, tx.id, std::mem::take(&mut tx.held));
        tx.indices = indices;
        let Ok(held) = acquired else {
            return Err(tx.conflict());
        };
        let committing = self.shared.tick_committing();
        let version = committing.version;
        if version != tx.rv + 1 && !self.reads_valid(tx, Some(&held)) {
            tx.held = held.restore(locks);
            self.shared.done_committing(committing);
            return Err(tx.conflict());
        }
        tx.allocs.allocs.sort_unstable();
        let set = CommitSet {
            version,
            writes: &tx.writes,
            allocs: &tx.allocs,
        };
        let payload = match self.engine.persist(&set, &mut tx.scratch) {
            Err(e) => {
                tx.held = held.restore(locks);
                self.shared.done_committing(committing);
                return Err(e);
            }
            Ok(Persisted::Nothing) => {
                // Everything written was freed again by the transaction.
                tx.held = held.restore(locks);
                self.shared.done_committing(committing);
                tx.allocs.cancel_freed_again(self.engine.heap());
                self.engine.media().count_transaction(false);
                return Ok(());
            }
            Ok(Persisted::Durable { payload }) => payload,
        };
        self.engine.publish(&set, &mut tx.scratch);
        // Freed space goes back to the allocator while its stripes are still locked: a
        // transaction that then probes it either conflicts or finds it not allocated.
        let heap = self.engine.heap();
        heap.publish(&tx.allocs.allocs, &tx.allocs.frees);
        tx.allocs.cancel_freed_again(heap);
        tx.held = held.release(locks, version);
        // Published (and durable): from here on it counts as committed.
        self.shared.done_committing(committing);
        tx.allocs.allocs.clear();
        let media = self.engine.media();
        media.add_payload(payload);
        media.count_transaction(true);
        Ok(())
    }
}
