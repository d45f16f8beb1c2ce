//! logheap: persistent transactional memory with a log-structured heap.
//!
//! Applications keep their data structures in a memory-mapped pool file and change them
//! in transactions that survive crashes:
//!
//! ```
//! use logheap::{pfield, Config, PPtr, Pool};
//!
//! // Stored types are plain data. The derives come with logheap (no other dependency
//! // needed); the attribute tells them where.
//! #[derive(Clone, Copy, logheap::Pod, logheap::Zeroable)]
//! #[bytemuck(crate = "logheap::bytemuck")]
//! #[repr(C)]
//! struct Node { key: u64, next: PPtr<Node> }
//!
//! let dir = tempfile::tempdir()?;
//! let pool = Pool::open_or_create(dir.path().join("list.pool"), &Config::default().size(8 << 20))?;
//! let head: PPtr<PPtr<Node>> = pool.root()?;
//! pool.transaction(|tx| {
//!     let old = tx.read(head)?;
//!     let n = tx.alloc(Node { key: 7, next: old })?;
//!     tx.write(head, &n)?;
//!     tx.write(pfield!(n, Node, key), &8)
//! })?;
//! let key = pool.read(|tx| {
//!     let n = tx.read(head)?;
//!     tx.read(pfield!(n, Node, key))
//! })?;
//! assert_eq!(key, 8);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The crate is built in layers, bottom up; what users name is re-exported here, in one
//! flat list, and three modules are public for what belongs to them:
//!
//! - [`media`]: mapped bytes and persistence (flush, fence, non-temporal copies),
//!   durability modes, NVM emulation, traffic counters and the crash-simulation media.
//!   Every persistent store of the layers above goes through it.
//! - pool files (`file`): create, open, lock, header, layout, clean-close state
//!   ([`PoolFile`], [`Header`]).
//! - [`alloc`]: allocators: the log engine's home allocator, and
//!   [`PersistentHeap`](alloc::PersistentHeap), the persistent allocator (002, 004) in
//!   a pool of its own.
//! - `stm`: concurrency control (global version clock, versioned locks, read and write
//!   sets) and the `Engine` trait it drives.
//! - engines (`engine`): the log-structured engine (the default) and the in-place ones,
//!   chosen with an [`EngineConfig`].
//! - [`Pool`], [`Tx`], [`PPtr`], [`Config`], [`Stats`]: the public API; [`check`]:
//!   read-only verification of a pool file (`logheap check`).
#![warn(missing_docs)]

pub mod alloc;
mod bytes;
pub mod check;
mod config;
mod engine;
mod error;
mod file;
pub mod media;
mod pool;
mod ptr;
mod stm;
mod sync;
mod tx;
mod zeroed;

/// The `bytemuck` crate, whose `Pod` and `Zeroable` derives make a type storable: derive
/// them as `logheap::Pod` and `logheap::Zeroable` with `#[bytemuck(crate =
/// "logheap::bytemuck")]` on the type, or depend on `bytemuck` (feature `derive`).
pub use bytemuck;
pub use bytemuck::{Pod, Zeroable};
pub use check::{CheckReport, LogSummary};
pub use config::Config;
pub use engine::{
    Compaction, Damage, DroppedTransaction, EngineChoice, EngineConfig, EngineStats, HoopStats,
    LogAreaStats, LogEngineStats, LogOptions, MappingConfig, OopStats, PartitionIndex,
    PersistPolicy, RecoveryReport, RedoOptions, RedoStats, SnapshotUse, UndoOptions, UndoStats,
};
pub use error::{Error, Result};
pub use file::{
    EngineKind, FORMAT_VERSION, HEADER_SIZE, Header, MAGIC, MapAddress, PoolFile, PoolLayout,
    PoolOptions, PoolState, Removal, STATE_OFFSET,
};
pub use media::{
    Durability, Emulation, FlushInstruction, Media, MediaConfig, MediaCounters, MediaView, Medium,
};
pub use pool::{Pool, Stats};
pub use ptr::PPtr;
pub use tx::Transaction;
pub use tx::Tx;
