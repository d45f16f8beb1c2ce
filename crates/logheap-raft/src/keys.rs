//! Where things are in the store (keys by their first byte), and how they are encoded.

use logheap_kv::{KvStore, KvTx};
use openraft::{AnyError, StorageError, StorageIOError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::NodeId;

/// Log entries: `l` + the index, big-endian (so that key order is index order).
pub(crate) const LOG: u8 = b'l';
/// The log's vote.
pub(crate) const VOTE: &[u8] = b"m/vote";
/// The log's committed log id.
pub(crate) const COMMITTED: &[u8] = b"m/committed";
/// The log's last purged log id.
pub(crate) const PURGED: &[u8] = b"m/purged";
/// The state machine's applied log id and membership.
pub(crate) const APPLIED: &[u8] = b"s/applied";
/// The state machine's current snapshot: its meta, and its data.
pub(crate) const SNAPSHOT_META: &[u8] = b"s/snapshot/meta";
pub(crate) const SNAPSHOT_DATA: &[u8] = b"s/snapshot/data";
/// Data: `d` + the user's key.
pub(crate) const DATA: u8 = b'd';

/// The key of log entry `index`.
pub(crate) fn log_key(index: u64) -> [u8; 9] {
    let mut key = [LOG; 9];
    key[1..].copy_from_slice(&index.to_be_bytes());
    key
}

/// The index of log key `key`, if it is one.
pub(crate) fn log_index(key: &[u8]) -> Option<u64> {
    match key {
        [LOG, index @ ..] => Some(u64::from_be_bytes(index.try_into().ok()?)),
        _ => None,
    }
}

/// The key of the user's key `key`.
pub(crate) fn data_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(DATA);
    k.extend_from_slice(key);
    k
}

/// A value as stored.
pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("openraft's and this crate's types serialise")
}

/// A stored value, or why it does not decode.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// Reads and decodes `key` (`None` when absent); errors as `io` makes them.
pub(crate) fn read<T: DeserializeOwned>(
    store: &KvStore,
    key: &[u8],
    io: fn(AnyError) -> StorageIOError<NodeId>,
) -> Result<Option<T>, StorageError<NodeId>> {
    match store.get(key).map_err(|e| io(AnyError::new(&e)))? {
        None => Ok(None),
        Some(bytes) => Ok(Some(decode(&bytes).map_err(|e| io(AnyError::new(&e)))?)),
    }
}

/// Encodes and writes `value` at `key` in its own transaction (durable on return).
pub(crate) fn write<T: Serialize>(
    store: &KvStore,
    key: &[u8],
    value: &T,
    io: fn(AnyError) -> StorageIOError<NodeId>,
) -> Result<(), StorageError<NodeId>> {
    store
        .put(key, &encode(value))
        .map_err(|e| io(AnyError::new(&e)).into())
}

/// Deletes every key of `tx`'s store from `start` (included) to `end` (excluded).
pub(crate) fn delete_range(
    tx: &mut KvTx<'_, '_>,
    start: &[u8],
    end: &[u8],
) -> logheap_kv::Result<()> {
    use std::ops::{Bound, ControlFlow};
    let mut keys = Vec::new();
    tx.scan(
        Bound::Included(start),
        Bound::Excluded(end),
        logheap_kv::Direction::Forward,
        |k, _| {
            keys.push(k.to_vec());
            ControlFlow::Continue(())
        },
    )?;
    for k in keys {
        tx.delete(&k)?;
    }
    Ok(())
}
