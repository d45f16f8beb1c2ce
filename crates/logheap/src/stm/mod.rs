//! Concurrency control, TinySTM / TL2 style ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §4.1 runs on
//! TinySTM): a global version clock, a table of versioned locks over 64-byte address
//! stripes, reads validated against the transaction's snapshot (extended when possible),
//! writes buffered until commit, commit-time locking with try-lock and abort (so no
//! deadlock), and a read-only path that takes no lock.
//!
//! The commit version is the transaction's version in the log.

pub(crate) mod atomic;
mod clock;
mod domain;
mod driver;
mod engine;
mod locks;
#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(test)]
mod no_heap;
#[cfg(all(test, not(loom)))]
mod tests;
mod write_set;

pub(crate) use clock::VersionClock;
pub(crate) use domain::{Committing, Domain};
pub(crate) use driver::{SpareState, Stm, TxState};
pub(crate) use engine::{CommitSet, Engine, Persisted};
pub(crate) use locks::{LockTable, StripeLocks, is_locked, version_of};
pub(crate) use write_set::{ResolveScratch, Span, WriteSet};

/// Address stripe size covered by one versioned lock.
pub(crate) const STRIPE_SHIFT: u32 = 6;

/// The stripes overlapping `[home, home + len)` (by stripe number, before hashing).
pub(crate) fn stripes(home: u64, len: u64) -> std::ops::RangeInclusive<u64> {
    let first = home >> STRIPE_SHIFT;
    let last = (home + len.max(1) - 1) >> STRIPE_SHIFT;
    first..=last
}

/// Why a transaction attempt cannot go on; retried by the pool, never shown to users.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conflict;
