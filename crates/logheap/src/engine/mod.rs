//! Transaction engines. Every engine sits behind the same API; the pool header records
//! which one formatted a pool.

pub(crate) mod log;

pub use log::{
    Compaction, Damage, DroppedTransaction, LogEngineStats, LogSummary, MappingConfig,
    PartitionIndex, RecoveryReport, SnapshotUse,
};
