//! The replicated key-value store: a logheap-kv store under openraft's
//! `RaftStateMachine`, with its snapshots.

use std::io::Cursor;
use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use logheap_kv::KvStore;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};

use crate::keys::{self, APPLIED, DATA, SNAPSHOT_DATA, SNAPSHOT_META, data_key};
use crate::{Entry, Error, Node, NodeId, Request, Response, TypeConfig, snapshot};

/// What the state machine has applied: the last log id, and the last membership.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Applied {
    last: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Node>,
}

/// A node's state machine: the replicated keys and values, what it has applied, and
/// its current snapshot, in the pool it shares with the node's [`LogStore`]. Clones
/// share it (a clone builds snapshots).
///
/// [`LogStore`]: crate::LogStore
#[derive(Debug, Clone)]
pub struct StateMachine {
    store: Arc<KvStore>,
    applied: Applied,
    /// Snapshots built by this process (a part of their ids).
    built: Arc<AtomicU64>,
}

impl StateMachine {
    pub(crate) fn new(store: Arc<KvStore>) -> Result<StateMachine, Error> {
        let applied = match store.get(APPLIED)? {
            None => Applied::default(),
            Some(bytes) => keys::decode(&bytes).map_err(|source| Error::Decode {
                what: "the state machine's applied log id",
                source,
            })?,
        };
        Ok(StateMachine {
            store,
            applied,
            built: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The value of `key` in the replicated store, as this node has applied it.
    pub fn get(&self, key: &[u8]) -> logheap_kv::Result<Option<Vec<u8>>> {
        self.store.get(&data_key(key))
    }

    /// The keys and values from `start` (included) to `end` (excluded; `None`: to the
    /// last), at most `limit` of them, in key order, as this node has applied them.
    pub fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> logheap_kv::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let from = data_key(start);
        let to = match end {
            Some(end) => data_key(end),
            None => vec![DATA + 1],
        };
        self.store.read(|tx| {
            let mut out = Vec::new();
            tx.scan(
                Bound::Included(&from),
                Bound::Excluded(&to),
                logheap_kv::Direction::Forward,
                |k, v| {
                    if out.len() >= limit {
                        return ControlFlow::Break(());
                    }
                    out.push((k[1..].to_vec(), v.to_vec()));
                    ControlFlow::Continue(())
                },
            )?;
            Ok(out)
        })
    }

    /// The last log id applied.
    pub fn last_applied(&self) -> Option<LogId<NodeId>> {
        self.applied.last
    }

    /// The store underneath (shared with the log store).
    pub fn store(&self) -> &KvStore {
        &self.store
    }

    /// The current snapshot as stored, if any.
    fn stored_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let read =
            |e: &dyn std::error::Error| StorageIOError::read_snapshot(None, AnyError::error(e));
        let found = self
            .store
            .read(|tx| Ok((tx.get(SNAPSHOT_META)?, tx.get(SNAPSHOT_DATA)?)))
            .map_err(|e| read(&e))?;
        match found {
            (Some(meta), Some(data)) => {
                let meta: SnapshotMeta<NodeId, Node> = keys::decode(&meta).map_err(|e| read(&e))?;
                Ok(Some(Snapshot {
                    meta,
                    snapshot: Box::new(Cursor::new(data)),
                }))
            }
            _ => Ok(None),
        }
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let read =
            |e: &dyn std::error::Error| StorageIOError::read_state_machine(AnyError::error(e));
        // One read-only transaction: the data as of the applied log id read with it,
        // while writers go on.
        let (applied, data) = self
            .store
            .read(|tx| {
                let applied = tx.get(APPLIED)?;
                let mut data = Vec::new();
                tx.scan(
                    Bound::Included(&[DATA][..]),
                    Bound::Excluded(&[DATA + 1][..]),
                    logheap_kv::Direction::Forward,
                    |k, v| {
                        snapshot::push_pair(&mut data, &k[1..], v);
                        ControlFlow::Continue(())
                    },
                )?;
                Ok((applied, data))
            })
            .map_err(|e| read(&e))?;
        let applied: Applied = match applied {
            None => Applied::default(),
            Some(bytes) => keys::decode(&bytes).map_err(|e| read(&e))?,
        };
        // Unique: the applied log id, and when and how often this process built one.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = self.built.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match applied.last {
            Some(last) => format!("{}-{}-{nanos}-{n}", last.leader_id, last.index),
            None => format!("--{nanos}-{n}"),
        };
        let meta = SnapshotMeta {
            last_log_id: applied.last,
            last_membership: applied.membership,
            snapshot_id,
        };
        let meta_bytes = keys::encode(&meta);
        self.store
            .transaction(|tx| {
                tx.put(SNAPSHOT_META, &meta_bytes)?;
                tx.put(SNAPSHOT_DATA, &data)?;
                Ok(())
            })
            .map_err(|e| {
                StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(&e))
            })?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, Node>), StorageError<NodeId>> {
        Ok((self.applied.last, self.applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let mut applied = self.applied.clone();
        for e in &entries {
            applied.last = Some(e.log_id);
            if let EntryPayload::Membership(m) = &e.payload {
                applied.membership = StoredMembership::new(Some(e.log_id), m.clone());
            }
        }
        let applied_bytes = keys::encode(&applied);
        // The entries' changes and what is applied, in one transaction.
        let responses = self
            .store
            .transaction(|tx| {
                let mut responses = Vec::with_capacity(entries.len());
                for e in &entries {
                    let previous = match &e.payload {
                        EntryPayload::Normal(Request::Put { key, value }) => {
                            let k = data_key(key);
                            let previous = tx.get(&k)?;
                            tx.put(&k, value)?;
                            previous
                        }
                        EntryPayload::Normal(Request::Delete { key }) => {
                            let k = data_key(key);
                            let previous = tx.get(&k)?;
                            if previous.is_some() {
                                tx.delete(&k)?;
                            }
                            previous
                        }
                        EntryPayload::Blank | EntryPayload::Membership(_) => None,
                    };
                    responses.push(Response { previous });
                }
                tx.put(APPLIED, &applied_bytes)?;
                Ok(responses)
            })
            .map_err(|e| StorageIOError::write_state_machine(AnyError::new(&e)))?;
        self.applied = applied;
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let bad =
            |e: String| StorageIOError::read_snapshot(Some(meta.signature()), AnyError::error(e));
        let pairs = snapshot::pairs(&data).map_err(bad)?;
        let applied = Applied {
            last: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        let (applied_bytes, meta_bytes) = (keys::encode(&applied), keys::encode(meta));
        // The data replaced, what is applied and the snapshot kept, in one transaction:
        // a crash leaves the state machine as it was or as the snapshot says.
        self.store
            .transaction(|tx| {
                keys::delete_range(tx, &[DATA], &[DATA + 1])?;
                for (k, v) in &pairs {
                    tx.put(&data_key(k), v)?;
                }
                tx.put(APPLIED, &applied_bytes)?;
                tx.put(SNAPSHOT_META, &meta_bytes)?;
                tx.put(SNAPSHOT_DATA, &data)?;
                Ok(())
            })
            .map_err(|e| {
                StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(&e))
            })?;
        self.applied = applied;
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        self.stored_snapshot()
    }
}
