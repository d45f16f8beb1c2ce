//! logheap-kv: a persistent ordered key-value store on logheap.
//!
//! Byte keys and byte values of any length (up to 4 GiB each), kept in key order in a
//! B+ tree inside a logheap pool, on any engine. Every change is a logheap transaction:
//! durable when the call returns, atomic across a crash.
//!
//! - [`KvStore`]: a store in a pool file of its own (created on first use): `get`,
//!   `put`, `delete`, [`WriteBatch`]es applied in one transaction, user transactions
//!   over several operations ([`KvStore::transaction`]), and range, prefix and full
//!   scans, forwards and backwards ([`KvStore::range`]). Share it between threads
//!   (`&KvStore` is `Sync`); concurrent transactions are isolated by logheap's STM.
//! - [`KvTree`]: the tree itself, a handle whose operations take the caller's
//!   [`logheap::Tx`], for applications that keep a store beside other data in one pool
//!   and change both in one transaction.
//!
//! ```
//! use logheap::Config;
//! use logheap_kv::KvStore;
//!
//! let dir = tempfile::tempdir()?;
//! let store = KvStore::open(dir.path().join("kv.pool"), &Config::default().size(32 << 20))?;
//! store.put(b"apple", b"red")?;
//! store.put(b"banana", b"yellow")?;
//! store.put(b"cherry", b"dark red")?;
//! assert_eq!(store.get(b"banana")?, Some(b"yellow".to_vec()));
//! let keys: Vec<Vec<u8>> = store
//!     .range(b"b".as_slice()..)
//!     .map(|entry| entry.map(|(key, _)| key))
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(keys, [b"banana".to_vec(), b"cherry".to_vec()]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

mod node;
mod store;
mod tree;

pub use store::{KvStats, KvStore, KvTx, Range, WriteBatch};
pub use tree::{Direction, KvTree, MAX_LEN};

/// What can go wrong in a store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error of the pool underneath (its transactions, space, file).
    #[error(transparent)]
    Pool(#[from] logheap::Error),
    /// A node of the tree is not what the tree says is there: the pool is damaged.
    #[error(
        "logheap-kv: the object at home offset {at:#x} should be {expected}, and is not: the store is damaged"
    )]
    Damaged {
        /// Where.
        at: u64,
        /// What should have been there.
        expected: &'static str,
    },
    /// A key or value longer than a store keeps.
    #[error("logheap-kv: a {what} of {len} bytes is longer than the {max} bytes a store keeps")]
    TooLarge {
        /// `"key"` or `"value"`.
        what: &'static str,
        /// Its length.
        len: u64,
        /// The most.
        max: u64,
    },
    /// The pool's root holds something other than a store.
    #[error(
        "logheap-kv: pool {path} holds other data (root word {found:#018x}), not a logheap-kv store"
    )]
    NotAStore {
        /// The pool file.
        path: String,
        /// The first word of its root.
        found: u64,
    },
}

/// The result of a store operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;
