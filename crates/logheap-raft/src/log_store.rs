//! The Raft log in a logheap-kv store (openraft's `RaftLogStorage`).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use logheap_kv::KvStore;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};

use crate::keys::{self, COMMITTED, LOG, PURGED, VOTE, log_index, log_key};
use crate::{Entry, NodeId, TypeConfig};

/// A node's Raft log: entries, vote, committed and purged log ids, in its pool. Clones
/// share it (openraft reads through one while it appends through another).
#[derive(Debug, Clone)]
pub struct LogStore {
    store: Arc<KvStore>,
}

impl LogStore {
    pub(crate) fn new(store: Arc<KvStore>) -> LogStore {
        LogStore { store }
    }

    /// The store underneath (shared with the state machine).
    pub fn store(&self) -> &KvStore {
        &self.store
    }

    /// Appends `entries` (the log's next ones, in order) in one transaction: all of
    /// them are durable when it returns, or none is there. What openraft's `append`
    /// does before it reports them flushed.
    pub fn append_entries(
        &mut self,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<(), StorageError<NodeId>> {
        // Encoded first: the transaction may run more than once.
        let encoded: Vec<([u8; 9], Vec<u8>)> = entries
            .into_iter()
            .map(|e| (log_key(e.log_id.index), keys::encode(&e)))
            .collect();
        self.store
            .transaction(|tx| {
                for (key, value) in &encoded {
                    tx.put(key, value)?;
                }
                Ok(())
            })
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)).into())
    }

    /// The entries with indexes in `range`, in order (each checked to be the one its key
    /// names).
    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, StorageError<NodeId>> {
        let start = match range.start_bound() {
            Bound::Included(&i) => Bound::Included(log_key(i).to_vec()),
            Bound::Excluded(&i) => match i.checked_add(1) {
                Some(i) => Bound::Included(log_key(i).to_vec()),
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => Bound::Included(vec![LOG]),
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => Bound::Included(log_key(i).to_vec()),
            Bound::Excluded(&i) => Bound::Excluded(log_key(i).to_vec()),
            // Every log key is below the one-byte key after `l`.
            Bound::Unbounded => Bound::Excluded(vec![LOG + 1]),
        };
        let read = |e: &dyn std::error::Error| StorageIOError::read_logs(AnyError::error(e));
        let mut out = Vec::new();
        for item in self.store.range_bounds(as_slice(&start), as_slice(&end)) {
            let (key, value) = item.map_err(|e| read(&e))?;
            let entry: Entry = keys::decode(&value).map_err(|e| read(&e))?;
            if log_index(&key) != Some(entry.log_id.index) {
                return Err(StorageIOError::read_logs(AnyError::error(format!(
                    "the log entry under key {key:x?} has index {}",
                    entry.log_id.index
                )))
                .into());
            }
            out.push(entry);
        }
        Ok(out)
    }

    /// The log id of the last entry, if any.
    fn last_log_id(&self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        let last = self
            .store
            .range_bounds(Bound::Included(&[LOG][..]), Bound::Excluded(&[LOG + 1][..]))
            .next_back();
        match last {
            None => Ok(None),
            Some(item) => {
                let read =
                    |e: &dyn std::error::Error| StorageIOError::read_logs(AnyError::error(e));
                let (_, value) = item.map_err(|e| read(&e))?;
                let entry: Entry = keys::decode(&value).map_err(|e| read(&e))?;
                Ok(Some(entry.log_id))
            }
        }
    }
}

fn as_slice(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match bound {
        Bound::Included(k) => Bound::Included(&k[..]),
        Bound::Excluded(k) => Bound::Excluded(&k[..]),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        self.entries(range)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let last_purged_log_id = keys::read(&self.store, PURGED, StorageIOError::read_logs)?;
        let last_log_id = self.last_log_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        keys::write(&self.store, VOTE, vote, StorageIOError::write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        keys::read(&self.store, VOTE, StorageIOError::read_vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        keys::write(&self.store, COMMITTED, &committed, StorageIOError::write)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(
            keys::read::<Option<LogId<NodeId>>>(&self.store, COMMITTED, StorageIOError::read)?
                .flatten(),
        )
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let done = self.append_entries(entries);
        callback.log_io_completed(match &done {
            Ok(()) => Ok(()),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        });
        done
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.store
            .transaction(|tx| keys::delete_range(tx, &log_key(log_id.index), &[LOG + 1]))
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let purged = keys::encode(&log_id);
        // The purged log id and the removal in one transaction: the log's state is
        // never without its first entries and without the record of their purge.
        self.store
            .transaction(|tx| {
                tx.put(PURGED, &purged)?;
                match log_id.index.checked_add(1) {
                    Some(end) => keys::delete_range(tx, &log_key(0), &log_key(end)),
                    None => keys::delete_range(tx, &log_key(0), &[LOG + 1]),
                }
            })
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)).into())
    }
}
