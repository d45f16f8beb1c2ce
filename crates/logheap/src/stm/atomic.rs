//! The atomics of the STM protocol (the version clock, the lock words, the commit
//! slots): std's, or loom's when the protocol is model checked (`--cfg loom`, see
//! `loom_tests.rs`), so that loom sees, and permutes, every access the protocol makes.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering, fence};
