//! A pool's concurrency domain: the state its transactions share (the version clock, the
//! versioned lock table, transaction ids, and the versions still committing).

use std::cell::Cell;

use super::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use super::{LockTable, VersionClock};

/// log2 of the number of versioned locks: one lock per 256 bytes of pool (live data is
/// at most the pool, so at most four of its 64-byte stripes share a lock), within these
/// bounds.
#[cfg(not(loom))]
const LOCK_BITS: std::ops::RangeInclusive<u32> = 12..=20;
/// Under model checking, a few locks: each is an object loom tracks.
#[cfg(loom)]
const LOCK_BITS: std::ops::RangeInclusive<u32> = 4..=4;

/// The concurrency domain of one open pool: what every transaction (and every engine
/// thread that takes stripe locks, such as
/// the log engine's cleaner) shares.
#[derive(Debug)]
pub(crate) struct Domain {
    /// The global version clock.
    pub clock: VersionClock,
    /// The versioned locks over address stripes.
    pub locks: LockTable,
    /// The commits in flight, one slot each: from before its tick to the end of its
    /// publish, a lower bound of its version (0: a free slot). No lock on the commit
    /// path: a commit claims a slot with one compare-and-swap (its thread's own, unless
    /// another thread mapped to it is committing) and frees it with a store.
    committing: Box<[CachePadded<AtomicU64>]>,
}

/// Slots for commits in flight (more than threads that commit at once, usually).
#[cfg(not(loom))]
const COMMIT_SLOTS: usize = 64;
/// Under model checking: one, so that two committers meet on it.
#[cfg(loom)]
const COMMIT_SLOTS: usize = 1;

/// Lock owner ids, unique in the process (a transaction takes one for its thread's
/// transactions, an engine thread one for itself). Counters, not part of the protocol:
/// std's atomics even under model checking.
static NEXT_OWNER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A number per thread, for spreading threads over the commit slots.
static NEXT_THREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    static THREAD_NUMBER: Cell<u64> = const { Cell::new(u64::MAX) };
}

/// This thread's number (given at its first commit).
fn thread_number() -> u64 {
    THREAD_NUMBER.with(|n| {
        if n.get() == u64::MAX {
            n.set(NEXT_THREAD.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        }
        n.get()
    })
}

/// A commit in flight: its version and the slot that says so (see
/// [`Domain::tick_committing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Committing {
    /// The commit version.
    pub version: u64,
    slot: usize,
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
            committing: (0..COMMIT_SLOTS)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        }
    }

    /// A new lock owner id (for a transaction, or an engine thread taking locks),
    /// unique in the process.
    #[inline]
    pub(crate) fn new_owner(&self) -> u64 {
        NEXT_OWNER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Ticks the clock for a committing transaction and registers it as committing.
    ///
    /// The slot holds a lower bound of the version from *before* the tick (`SeqCst`,
    /// as the tick): a [`committed_through`](Self::committed_through) that reads the
    /// clock at or past this version then finds the slot taken.
    pub(crate) fn tick_committing(&self) -> Committing {
        let n = self.committing.len();
        let home = thread_number() as usize % n;
        let mut slot = home;
        loop {
            let bound = self.clock.now() + 1;
            if self.committing[slot]
                .compare_exchange(0, bound, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                break;
            }
            // Another thread mapped to this slot is committing: the next one (after a
            // whole round of busy slots, let the committers run).
            slot = (slot + 1) % n;
            if slot == home {
                #[cfg(not(loom))]
                std::thread::yield_now();
                #[cfg(loom)]
                loom::thread::yield_now();
            }
        }
        let version = self.clock.tick();
        Committing { version, slot }
    }

    /// The transaction registered as `c` has finished its commit (or will not commit).
    pub(crate) fn done_committing(&self, c: Committing) {
        self.committing[c.slot].store(0, Ordering::Release);
    }

    /// The largest version up to which every transaction has finished its commit.
    pub(crate) fn committed_through(&self) -> u64 {
        // The clock first, then the slots (both SeqCst, as the claims and the ticks): a
        // commit whose tick this read sees claimed its slot before, and is found.
        let now = self.clock.now_seq_cst();
        self.committing
            .iter()
            .map(|s| s.load(Ordering::SeqCst))
            .filter(|&bound| bound != 0)
            .map(|bound| bound - 1)
            .fold(now, u64::min)
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
        assert_eq!((a.version, b.version), (11, 12));
        assert_ne!(a.slot, b.slot);
        assert_eq!(s.committed_through(), 10);
        s.done_committing(a);
        assert_eq!(s.committed_through(), 11);
        s.done_committing(b);
        assert_eq!(s.committed_through(), 12);
        let c = s.tick_committing();
        assert_eq!(s.committed_through(), 12);
        s.done_committing(c);
        assert_eq!(s.committed_through(), 13);
        assert_ne!(s.new_owner(), s.new_owner());
    }
}
