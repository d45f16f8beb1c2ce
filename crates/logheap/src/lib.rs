//! logheap: persistent transactional memory with a log-structured heap.
//!
//! Applications keep their data structures in a memory-mapped pool file and change them
//! in transactions that survive crashes. This crate is built in layers, bottom up:
//!
//! - [`media`]: mapped bytes and persistence (flush, fence, non-temporal copies),
//!   durability modes, NVM emulation, traffic counters and the crash-simulation media.
//!   Every persistent store of the layers above goes through it.
//! - [`pool`]: pool files: create, open, lock, header, layout, clean-close state.
//! - [`engine`]: the transaction engines.
#![warn(missing_docs)]

pub mod engine;
mod error;
pub mod media;
pub mod pool;

pub use engine::EngineKind;
pub use error::{Error, Result};
pub use media::{Durability, Emulation, FlushInstruction, Media, MediaConfig, MediaCounters};
pub use pool::{PoolFile, PoolOptions};
