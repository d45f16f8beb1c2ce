//! Transaction engines. Every engine sits behind the same API; the pool header records
//! which one formatted a pool ([`EngineKind`](crate::EngineKind)).
//!
//! An engine is what the TL2 driver (`stm`) cannot know: where committed bytes are
//! read from, how a commit set is made durable and then visible, and how the pool is
//! recovered. The driver owns snapshots, read validation, locking and versions, and
//! hands the engine one `CommitSet` per commit, under the commit's locks.

mod any;
mod config;
pub(crate) mod inplace;
pub(crate) mod log;

pub use any::EngineStats;
pub(crate) use any::{
    AnyEngine, AnyTx, Background, EngineFigures, EngineLifecycle, NewPool, on_tx,
};
pub use config::{EngineChoice, EngineConfig};
pub use inplace::options::{RedoOptions, UndoOptions};
pub use inplace::persist_policy::PersistPolicy;
pub use inplace::stats::{HoopStats, LogAreaStats, OopStats, RedoStats, UndoStats};
pub use log::{
    Compaction, Damage, DroppedTransaction, LogEngineStats, LogOptions, LogSummary, MappingConfig,
    PartitionIndex, RecoveryReport, SnapshotUse,
};
