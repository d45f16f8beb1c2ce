//! A pool's concurrency domain: the state its transactions share (the version clock, the
//! versioned lock table, transaction ids, and the versions still committing).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{LockTable, VersionClock};

/// log2 of the number of versioned locks: one lock per 256 bytes of pool (live data is
/// at most the pool, so at most four of its 64-byte stripes share a lock), within these
/// bounds.
const LOCK_BITS: std::ops::RangeInclusive<u32> = 12..=20;

/// The concurrency domain of one open pool: what every transaction (and every engine
/// thread that takes stripe locks, such as
/// the log engine's cleaner) shares.
#[derive(Debug)]
pub(crate) struct Domain {
    /// The global version clock.
    pub clock: VersionClock,
    /// The versioned locks over address stripes.
    pub locks: LockTable,
    next_owner: AtomicU64,
    /// Versions of the transactions between their tick and the end of their publish.
    committing: Mutex<Vec<u64>>,
}

impl Domain {
    /// The state of a pool of `pool_size` bytes whose largest committed version is
    /// `last_version` (new versions go on above it).
    pub(crate) fn new(pool_size: u64, last_version: u64) -> Domain {
        Domain {
            clock: VersionClock::starting_after(last_version),
            locks: LockTable::new(
                (pool_size / 256)
                    .max(1)
                    .ilog2()
                    .clamp(*LOCK_BITS.start(), *LOCK_BITS.end()),
            ),
            next_owner: AtomicU64::new(1),
            committing: Mutex::new(Vec::new()),
        }
    }

    /// A new lock owner id (for a transaction, or an engine thread taking locks).
    #[inline]
    pub(crate) fn new_owner(&self) -> u64 {
        self.next_owner.fetch_add(1, Ordering::Relaxed)
    }

    fn committing(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.committing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ticks the clock for a committing transaction and registers it as committing.
    pub(crate) fn tick_committing(&self) -> u64 {
        let mut committing = self.committing();
        let version = self.clock.tick();
        committing.push(version);
        version
    }

    /// The transaction at `version` has finished its commit (or will not commit).
    pub(crate) fn done_committing(&self, version: u64) {
        let mut committing = self.committing();
        if let Some(k) = committing.iter().position(|&v| v == version) {
            committing.swap_remove(k);
        }
    }

    /// The largest version up to which every transaction has finished its commit.
    pub(crate) fn committed_through(&self) -> u64 {
        let committing = self.committing();
        committing
            .iter()
            .min()
            .map_or_else(|| self.clock.now(), |&m| m - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_through_stops_below_the_oldest_commit_in_flight() {
        let s = Domain::new(1 << 20, 10);
        assert_eq!(s.committed_through(), 10);
        let a = s.tick_committing();
        let b = s.tick_committing();
        assert_eq!((a, b), (11, 12));
        assert_eq!(s.committed_through(), 10);
        s.done_committing(a);
        assert_eq!(s.committed_through(), 11);
        s.done_committing(b);
        assert_eq!(s.committed_through(), 12);
        assert_ne!(s.new_owner(), s.new_owner());
    }
}
