//! The evaluation of "Log-structured Non-volatile Main Memory" (USENIX ATC 2017) §5 on logheap: workloads on persistent
//! collections, a harness that runs them on a fresh pool and measures transactions and
//! persistence traffic, and reports.
//!
//! Any engine the library knows by name runs the same workloads (`RunSpec::engine`), and
//! so does the peer engine `pmdk`: the same workloads written in C on PMDK's libpmemobj
//! ([`pmdk`]), built when `pkg-config` finds libpmemobj.
#![warn(missing_docs)]

pub mod alloc_batch;
pub mod alloc_bench;
pub mod fragmentation;
pub mod harness;
pub mod keys;
pub mod plots;
pub mod pmdk;
pub mod report;
pub mod versus;
pub mod workload;

pub use harness::{FragOptions, RunResult, RunSpec, SpaceFigures, run, run_reporting};
pub use workload::Workload;
