//! YCSB on logheap-kv and its peers.
//!
//! The YCSB core workloads A–F, ported from the YCSB specification and core source
//! ([`generator`]: scrambled Zipfian with constant 0.99, skewed latest, hashed insert
//! order, 1 KB records of 10 × 100 B fields; [`workload`]: the six mixes), run on any
//! [`Store`](stores::Store): logheap-kv on a logheap engine, LMDB (heed), redb, fjall
//! and, with the `rocksdb` feature, RocksDB, each with durable commits. [`runner`] runs a
//! load phase and a run phase on 1 or more threads with HDR latency histograms;
//! [`report`] writes JSON lines, Markdown and plots. `logheap ycsb` is the command.
#![warn(missing_docs)]

pub mod generator;
pub mod report;
pub mod runner;
pub mod stores;
pub mod workload;

pub use runner::{RunConfig, RunResult, run};
pub use stores::{Store, StoreError, StoreKind};
pub use workload::Workload;
