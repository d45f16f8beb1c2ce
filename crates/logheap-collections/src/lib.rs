//! Persistent data structures written only against logheap's public transaction API, so
//! they run on every engine: a hash map, a red-black tree, a B+ tree, a crit-bit tree, a
//! large array, a queue and a vector. Keys are `u64`; values are byte strings of any length.
//!
//! Each structure is a small `Copy` handle around a persistent pointer to its header.
//! Store the handle's [`pointer`](HashMap::pointer) in your root object and reopen it
//! with `from_pointer` in a later run. Every operation takes the transaction it runs in,
//! so several operations, on several structures, can be one atomic transaction.
//!
//! ```
//! use logheap::{Config, Pool, PPtr};
//! use logheap_collections::HashMap;
//!
//! let dir = tempfile::tempdir()?;
//! let pool = Pool::create(dir.path().join("kv.pool"), &Config::default().size(16 << 20))?;
//! let root: PPtr<u64> = pool.root()?;
//! let map = pool.transaction(|tx| {
//!     let map = HashMap::create(tx, 1024)?;
//!     tx.write(root, &map.pointer())?;
//!     Ok::<_, logheap::Error>(map)
//! })?;
//! pool.transaction(|tx| map.insert(tx, 7, b"seven"))?;
//! assert_eq!(pool.read(|tx| map.get(tx, 7))?, Some(b"seven".to_vec()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

mod array;
mod bp_tree;
mod crit_bit;
mod hash_map;
mod queue;
mod rb_tree;
mod striped_count;
mod value_object;
mod vector;

pub use array::Array;
pub use bp_tree::BpTree;
pub use crit_bit::CritBitTree;
pub use hash_map::HashMap;
pub use queue::Queue;
pub use rb_tree::RbTree;
pub use vector::Vector;
