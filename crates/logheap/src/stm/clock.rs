//! The global version clock.

use super::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// Monotonic commit timestamps; each write commit takes a unique one.
#[derive(Debug, Default)]
pub(crate) struct VersionClock(CachePadded<AtomicU64>);

impl VersionClock {
    /// A clock whose next commit version is `last + 1`.
    pub(crate) fn starting_after(last: u64) -> VersionClock {
        VersionClock(CachePadded::new(AtomicU64::new(last)))
    }

    /// The latest committed version: a snapshot start.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// The latest committed version, read in the single total order of `SeqCst`
    /// operations (see `Domain::committed_through`).
    #[inline]
    pub(crate) fn now_seq_cst(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Takes the next commit version (`SeqCst`: see `Domain::tick_committing`).
    #[inline]
    pub(crate) fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
}
