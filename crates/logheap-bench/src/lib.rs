//! The evaluation of "Log-structured Non-volatile Main Memory" (USENIX ATC 2017) §5 on logheap: workloads on persistent
//! collections, a harness that runs them on a fresh pool and measures transactions and
//! persistence traffic, and reports.
//!
//! Any engine the library knows by name runs the same workloads (`RunSpec::engine`).
#![warn(missing_docs)]

pub mod harness;
pub mod keys;
pub mod plots;
pub mod report;
pub mod workload;

pub use harness::{RunResult, RunSpec, run, run_reporting};
pub use workload::Workload;
