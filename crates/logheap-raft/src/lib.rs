//! logheap-raft: logheap as [openraft](https://docs.rs/openraft)'s storage.
//!
//! One logheap pool holds everything a Raft node keeps: the log (entries, vote,
//! committed and purged log ids) and the state machine, a [`logheap_kv`] store, with its
//! applied log id, its membership and its current snapshot. Each storage call is one
//! logheap transaction, so it is atomic across a crash and durable when it returns:
//!
//! - [`LogStore`] (openraft's `RaftLogStorage`): an `append` writes all its entries in
//!   one transaction and reports them flushed when it commits; `truncate` and `purge`
//!   remove their ranges in one transaction each (a purge records the purged log id in
//!   the same one, so the log never has a hole); openraft serialises the calls.
//! - [`StateMachine`] (openraft's `RaftStateMachine`): `apply` changes the data and the
//!   applied log id (and membership) of a batch of entries in one transaction; a
//!   snapshot is the data as of the applied log id, built in one read-only transaction
//!   (a consistent view, without stopping writers) and installed in one transaction.
//!
//! Keys in the store are namespaced by their first byte: `l` + big-endian index for
//! log entries, `m` for the log's metadata, `s` for the state machine's, `d` + the
//! user's key for data. Entries and metadata are stored as JSON (openraft's types are
//! `serde`); the snapshot data is a length-prefixed list of the data's keys and values.
//!
//! ```
//! use logheap_raft::{Request, open};
//!
//! let dir = tempfile::tempdir()?;
//! let config = logheap::Config::default().size(32 << 20);
//! let (mut log, mut state_machine) = open(dir.path().join("node.pool"), &config)?;
//! // Hand both to `openraft::Raft::new(id, config, network, log, state_machine)`.
//! # let _ = (&mut log, &mut state_machine, Request::Delete { key: Vec::new() });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]
// openraft's storage traits return its `StorageError` (over 200 bytes); the helpers
// here return it as they do.
#![allow(clippy::result_large_err)]

mod keys;
mod log_store;
pub mod server;
mod snapshot;
mod state_machine;

// `declare_raft_types!` names the default snapshot data type as `Cursor<Vec<u8>>`.
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

pub use log_store::LogStore;
pub use state_machine::StateMachine;

/// Node ids of a cluster.
pub type NodeId = u64;

/// A node's address, as openraft's basic node (`addr`: where its RPC server listens).
pub type Node = openraft::BasicNode;

/// A change to the replicated key-value store: the payload of a normal log entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Request {
    /// Sets `key` to `value`.
    Put {
        /// The key.
        key: Vec<u8>,
        /// Its new value.
        value: Vec<u8>,
    },
    /// Removes `key`.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
}

/// What applying an entry answers: for a [`Request`], the value its key had before
/// (`None`: absent, or the entry was not a request).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Response {
    /// The key's previous value.
    pub previous: Option<Vec<u8>>,
}

openraft::declare_raft_types!(
    /// The Raft types of a logheap-kv cluster: [`Request`]s in, [`Response`]s out,
    /// `u64` node ids, basic nodes, snapshots as bytes in memory.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = Node,
);

/// A log entry of a logheap-kv cluster.
pub type Entry = openraft::Entry<TypeConfig>;

/// What goes wrong opening a node's storage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store underneath (its pool, its file, its tree).
    #[error(transparent)]
    Kv(#[from] logheap_kv::Error),
    /// Something the store holds does not decode: the pool is not a Raft node's, or
    /// is damaged.
    #[error("logheap-raft: {what} does not decode: {source}")]
    Decode {
        /// What was being read.
        what: &'static str,
        /// Why it did not decode.
        source: serde_json::Error,
    },
}

/// Opens the storage of one Raft node in the pool at `path` (created with `config` on
/// first use): its log store and its state machine, sharing the pool.
pub fn open(
    path: impl AsRef<Path>,
    config: &logheap::Config,
) -> Result<(LogStore, StateMachine), Error> {
    from_store(logheap_kv::KvStore::open(path, config)?)
}

/// [`open`] on a store already open.
pub fn from_store(store: logheap_kv::KvStore) -> Result<(LogStore, StateMachine), Error> {
    let store = Arc::new(store);
    let state_machine = StateMachine::new(store.clone())?;
    Ok((LogStore::new(store), state_machine))
}
