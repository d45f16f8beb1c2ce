//! [`KvStore`]: a store in a pool of its own, with transactions, batches and scans.

use std::collections::VecDeque;
use std::ops::{Bound, ControlFlow, RangeBounds};
use std::path::Path;

use logheap::{Config, PPtr, Pool, Tx};

use crate::tree::{Direction, KvTree};
use crate::{Error, Result};

/// The pool's root object when it holds a store.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct StoreRoot {
    magic: u64,
    tree: u64,
}

/// What a store's root begins with.
const STORE_MAGIC: u64 = u64::from_le_bytes(*b"lhkvstr1");

/// Entries a scan reads per transaction: a scan is a series of short read-only
/// transactions, each resuming after the last key it returned, so a long scan never
/// holds back writers or restarts from the beginning.
const SCAN_BATCH: usize = 64;

/// A persistent ordered key-value store in a logheap pool.
///
/// Every call is one transaction, durable when it returns; [`write`](Self::write) and
/// [`transaction`](Self::transaction) make several changes one. The store may be used
/// from many threads at once (`&KvStore` is `Send + Sync`).
pub struct KvStore {
    pool: Pool,
    tree: KvTree,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("path", &self.pool.path())
            .field("tree", &self.tree)
            .finish()
    }
}

/// Figures of a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvStats {
    /// Entries.
    pub entries: u64,
    /// Levels of the tree, leaves included.
    pub levels: u64,
    /// Leaves.
    pub leaves: u64,
    /// Bytes of keys and values held.
    pub payload_bytes: u64,
}

impl KvStore {
    /// Opens the store in the pool at `path`, creating the pool (with `config`) and an
    /// empty store on first use. A pool whose root holds other data is refused
    /// ([`Error::NotAStore`]).
    pub fn open(path: impl AsRef<Path>, config: &Config) -> Result<KvStore> {
        KvStore::with_pool(Pool::open_or_create(path, config)?)
    }

    /// Opens the store in an existing pool at `path` (settings from its header).
    pub fn open_existing(path: impl AsRef<Path>) -> Result<KvStore> {
        KvStore::with_pool(Pool::open(path)?)
    }

    /// The store in `pool`, created there (in its root object) if the root is empty.
    pub fn with_pool(pool: Pool) -> Result<KvStore> {
        let root: PPtr<StoreRoot> = pool.root()?;
        let path = pool.path().display().to_string();
        let tree = pool.transaction(|tx| {
            let r = tx.read(root)?;
            match r.magic {
                STORE_MAGIC => Ok(KvTree::from_pointer(r.tree)),
                0 if r.tree == 0 => {
                    let tree = KvTree::create(tx)?;
                    tx.write(
                        root,
                        &StoreRoot {
                            magic: STORE_MAGIC,
                            tree: tree.pointer(),
                        },
                    )?;
                    Ok(tree)
                }
                found => Err(Error::NotAStore {
                    path: path.clone(),
                    found,
                }),
            }
        })?;
        Ok(KvStore { pool, tree })
    }

    /// The pool underneath.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The tree, for use inside the pool's own transactions.
    pub fn tree(&self) -> KvTree {
        self.tree
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut out = Vec::new();
        Ok(self.get_into(key, &mut out)?.then_some(out))
    }

    /// Reads the value of `key` into `out` (its capacity reused, so a caller that keeps
    /// `out` copies each value once and allocates nothing once it is large enough);
    /// returns whether the key is present.
    pub fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        self.pool.read(|tx| self.tree.get_into(tx, key, out))
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        self.pool.read(|tx| self.tree.contains(tx, key))
    }

    /// Sets `key` to `value`, durably.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.pool
            .transaction(|tx| self.tree.put(tx, key, value))
            .map(drop)
    }

    /// Removes `key`, durably; returns whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.pool.transaction(|tx| self.tree.delete(tx, key))
    }

    /// Applies `batch` as one transaction: all of it or, after a crash, none.
    pub fn write(&self, batch: &WriteBatch) -> Result<()> {
        self.pool.transaction(|tx| {
            for op in &batch.ops {
                match op {
                    BatchOp::Put(k, v) => self.tree.put(tx, k, v).map(drop)?,
                    BatchOp::Delete(k) => self.tree.delete(tx, k).map(drop)?,
                }
            }
            Ok(())
        })
    }

    /// Runs `f` as one atomic, isolated, durable transaction over the store. `f` may
    /// run more than once (after a conflict with a concurrent transaction); an error it
    /// returns aborts the transaction and comes back.
    pub fn transaction<R>(&self, mut f: impl FnMut(&mut KvTx<'_, '_>) -> Result<R>) -> Result<R> {
        self.pool.transaction(|tx| {
            f(&mut KvTx {
                tx,
                tree: self.tree,
            })
        })
    }

    /// Runs `f` on a consistent snapshot of the store (a read-only transaction).
    pub fn read<R>(&self, mut f: impl FnMut(&mut KvTx<'_, '_>) -> Result<R>) -> Result<R> {
        self.pool.read(|tx| {
            f(&mut KvTx {
                tx,
                tree: self.tree,
            })
        })
    }

    /// Entries in `range`, in key order (reverse it with `.rev()`; both ends can be
    /// taken from). Keys present for the whole scan are each returned once, in order;
    /// changes made while it runs may or may not be seen.
    ///
    /// The bounds are any byte strings: `store.range(b"a".as_slice()..b"m")`,
    /// `store.range("user:".."user;")`, `(Bound<&[u8]>, Bound<&[u8]>)` pairs.
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Range<'_> {
        Range::new(self, owned(range.start_bound()), owned(range.end_bound()))
    }

    /// Entries between two bounds given as [`Bound`]s (what `range` takes, without
    /// type inference to help).
    pub fn range_bounds(&self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Range<'_> {
        Range::new(self, start.map(<[u8]>::to_vec), end.map(<[u8]>::to_vec))
    }

    /// Entries whose key begins with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> Range<'_> {
        Range::new(
            self,
            Bound::Included(prefix.to_vec()),
            prefix_end(prefix).map_or(Bound::Unbounded, Bound::Excluded),
        )
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> Range<'_> {
        Range::new(self, Bound::Unbounded, Bound::Unbounded)
    }

    /// Number of entries.
    pub fn len(&self) -> Result<u64> {
        self.pool.read(|tx| self.tree.len(tx))
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Figures of the store: entries, levels, leaves, payload bytes (a walk of every
    /// leaf, in one read-only transaction).
    pub fn stats(&self) -> Result<KvStats> {
        self.pool.read(|tx| self.tree.stats(tx))
    }

    /// Checks the tree's invariants; returns the first violation found.
    pub fn verify(&self) -> Result<Option<String>> {
        self.pool.read(|tx| self.tree.verify(tx))
    }

    /// Closes the store and its pool cleanly.
    pub fn close(self) -> Result<()> {
        Ok(self.pool.close()?)
    }

    /// Gives back the pool.
    pub fn into_pool(self) -> Pool {
        self.pool
    }
}

/// The smallest key above every key that begins with `prefix` (`None`: no such key,
/// as for an empty prefix or one of `0xff` bytes only).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The store's operations inside a transaction ([`KvStore::transaction`],
/// [`KvStore::read`]): what they change takes effect with the transaction, and they see
/// its own earlier changes.
pub struct KvTx<'a, 'p> {
    tx: &'a mut Tx<'p>,
    tree: KvTree,
}

impl<'p> KvTx<'_, 'p> {
    /// The value of `key`, if present.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.tree.get(self.tx, key)
    }

    /// Reads the value of `key` into `out`; returns whether the key is present.
    pub fn get_into(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        self.tree.get_into(self.tx, key, out)
    }

    /// Sets `key` to `value`; returns whether the key is new.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.tree.put(self.tx, key, value)
    }

    /// Reads the value of `key` into `value`, lets `change` alter it and stores it back
    /// (a read-modify-write in one descent); returns whether the key was present.
    pub fn update(
        &mut self,
        key: &[u8],
        value: &mut Vec<u8>,
        change: impl FnOnce(&mut Vec<u8>),
    ) -> Result<bool> {
        self.tree.update(self.tx, key, value, change)
    }

    /// Removes `key`; returns whether it was present.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        self.tree.delete(self.tx, key)
    }

    /// Calls `f` with each entry between `start` and `end`, in `direction`, until it returns
    /// [`ControlFlow::Break`]: all of it within this transaction's snapshot.
    pub fn scan(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        direction: Direction,
        f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        self.tree.scan(self.tx, start, end, direction, f)
    }

    /// Number of entries.
    pub fn len(&mut self) -> Result<u64> {
        self.tree.len(self.tx)
    }

    /// Whether the store is empty.
    pub fn is_empty(&mut self) -> Result<bool> {
        self.tree.is_empty(self.tx)
    }

    /// The transaction underneath, to change other data of the pool in it too.
    pub fn pool_tx(&mut self) -> &mut Tx<'p> {
        self.tx
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum BatchOp {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// Puts and deletes applied together, in order, by [`KvStore::write`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<BatchOp>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> WriteBatch {
        WriteBatch::default()
    }

    /// Adds a put.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> &mut WriteBatch {
        self.ops.push(BatchOp::Put(key.to_vec(), value.to_vec()));
        self
    }

    /// Adds a delete.
    pub fn delete(&mut self, key: &[u8]) -> &mut WriteBatch {
        self.ops.push(BatchOp::Delete(key.to_vec()));
        self
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Empties the batch (keeping its memory).
    pub fn clear(&mut self) {
        self.ops.clear();
    }
}

/// An entry: key and value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// The entries of a key range, from [`KvStore::range`], [`KvStore::prefix`] or
/// [`KvStore::iter`]: an iterator from either end, reading [`SCAN_BATCH`] entries per
/// read-only transaction.
pub struct Range<'s> {
    store: &'s KvStore,
    /// What is left to read: keys after the front's last and before the back's last.
    start: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    front: VecDeque<Entry>,
    back: VecDeque<Entry>,
    /// No entry is left between `start` and `end` in the store.
    drained: bool,
    failed: bool,
}

impl std::fmt::Debug for Range<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Range")
            .field("start", &self.start)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl<'s> Range<'s> {
    fn new(store: &'s KvStore, start: Bound<Vec<u8>>, end: Bound<Vec<u8>>) -> Range<'s> {
        Range {
            store,
            start,
            end,
            front: VecDeque::new(),
            back: VecDeque::new(),
            drained: false,
            failed: false,
        }
    }

    /// Reads the next batch from one end into its buffer; moves that end's bound.
    fn refill(&mut self, direction: Direction) -> Result<()> {
        let start = self.start.as_ref().map(Vec::as_slice);
        let end = self.end.as_ref().map(Vec::as_slice);
        let tree = self.store.tree;
        let batch = self.store.pool.read(|tx| {
            let mut batch = Vec::with_capacity(SCAN_BATCH);
            tree.scan(tx, start, end, direction, |k, v| {
                batch.push((k.to_vec(), v.to_vec()));
                if batch.len() == SCAN_BATCH {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })?;
            Ok::<_, Error>(batch)
        })?;
        if batch.len() < SCAN_BATCH {
            self.drained = true;
        }
        if let Some((last, _)) = batch.last() {
            match direction {
                Direction::Forward => self.start = Bound::Excluded(last.clone()),
                Direction::Backward => self.end = Bound::Excluded(last.clone()),
            }
        }
        match direction {
            Direction::Forward => self.front.extend(batch),
            Direction::Backward => self.back.extend(batch),
        }
        Ok(())
    }

    fn next_from(&mut self, direction: Direction) -> Option<Result<Entry>> {
        if self.failed {
            return None;
        }
        loop {
            let own = match direction {
                Direction::Forward => self.front.pop_front(),
                Direction::Backward => self.back.pop_front(),
            };
            if let Some(entry) = own {
                return Some(Ok(entry));
            }
            if self.drained {
                // What is left was read by the other end: take it from its far side.
                return match direction {
                    Direction::Forward => self.back.pop_back(),
                    Direction::Backward => self.front.pop_back(),
                }
                .map(Ok);
            }
            if let Err(e) = self.refill(direction) {
                self.failed = true;
                return Some(Err(e));
            }
        }
    }
}

fn owned<K: AsRef<[u8]>>(bound: Bound<&K>) -> Bound<Vec<u8>> {
    bound.map(|k| k.as_ref().to_vec())
}

impl Iterator for Range<'_> {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_from(Direction::Forward)
    }
}

impl DoubleEndedIterator for Range<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.next_from(Direction::Backward)
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_is_the_next_key_past_the_prefix() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }
}
