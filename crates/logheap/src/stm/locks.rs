//! Versioned locks over address stripes.
//!
//! A lock word is `version << 1` when free and `owner << 1 | 1` when held, `owner` being
//! the committing transaction's id. Stripes map onto a fixed table by their low bits
//! (as TinySTM's lock array does), so unrelated addresses a table's span apart share a
//! lock (a false conflict, never a missed one), and the stripes of one object have
//! neighbouring locks: a read of a 128-byte object loads one line of lock words, not
//! three scattered ones.

use super::atomic::{AtomicU64, Ordering};

use super::Conflict;

/// The lock table.
#[derive(Debug)]
pub(crate) struct LockTable {
    #[cfg(not(loom))]
    words: crate::zeroed::ZeroedTable<AtomicU64>,
    #[cfg(loom)]
    words: Box<[AtomicU64]>,
    bits: u32,
}

impl LockTable {
    /// A table of `2^bits` locks.
    pub(crate) fn new(bits: u32) -> LockTable {
        // Untouched zero pages: a run writes few of the table's locks (see `zeroed`).
        #[cfg(not(loom))]
        // SAFETY: a zero `AtomicU64` is 0, and it needs no drop.
        let words = unsafe { crate::zeroed::ZeroedTable::new(1usize << bits) };
        // Loom's atomics are objects of their own, made one by one.
        #[cfg(loom)]
        let words = (0..1usize << bits).map(|_| AtomicU64::new(0)).collect();
        LockTable { words, bits }
    }

    /// The lock index of a stripe.
    #[inline]
    pub(crate) fn index(&self, stripe: u64) -> usize {
        (stripe & ((1u64 << self.bits) - 1)) as usize
    }

    /// The current word of lock `i`.
    #[inline]
    pub(crate) fn load(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::Acquire)
    }

    #[inline]
    fn try_lock(&self, i: usize, owner: u64) -> Result<u64, u64> {
        let w = self.words[i].load(Ordering::Acquire);
        if is_locked(w) {
            return Err(w);
        }
        self.words[i]
            .compare_exchange(w, owner << 1 | 1, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| w)
    }

    #[inline]
    fn store(&self, i: usize, word: u64) {
        self.words[i].store(word, Ordering::Release);
    }
}

/// Whether a lock word is held.
#[inline]
pub(crate) fn is_locked(word: u64) -> bool {
    word & 1 == 1
}

/// The version of a free lock word.
#[inline]
pub(crate) fn version_of(word: u64) -> u64 {
    word >> 1
}

/// The locks one committing transaction holds, with the words they had before.
#[derive(Debug, Default)]
pub(crate) struct StripeLocks {
    held: Vec<(usize, u64)>,
}

impl StripeLocks {
    /// Takes every lock in `indices` (sorted and deduplicated by the caller) for `owner`,
    /// spinning briefly on a held one; on failure releases what it took. `buffer` (its
    /// contents ignored) holds the lock words; [`release`](Self::release) and
    /// [`restore`](Self::restore) give it back for the next commit.
    pub(crate) fn acquire(
        table: &LockTable,
        indices: &[usize],
        owner: u64,
        mut buffer: Vec<(usize, u64)>,
    ) -> Result<StripeLocks, Conflict> {
        buffer.clear();
        let mut locks = StripeLocks { held: buffer };
        for &i in indices {
            let mut spins = 0;
            loop {
                match table.try_lock(i, owner) {
                    Ok(previous) => {
                        locks.held.push((i, previous));
                        break;
                    }
                    Err(_) if spins < 64 => {
                        spins += 1;
                        std::hint::spin_loop();
                    }
                    Err(_) => {
                        locks.restore(table);
                        return Err(Conflict);
                    }
                }
            }
        }
        // The holder's stores come after its locks (a seqlock writer's fence): a reader
        // whose copy saw one of them then sees a lock word changed (its acquire fence
        // before the re-check pairs with this).
        super::atomic::fence(Ordering::Release);
        Ok(locks)
    }

    /// Takes every lock in `indices` (sorted and deduplicated) for `owner`, waiting for
    /// each held one to be let go. Only for an engine thread that holds no other lock
    /// (a transaction never waits for a lock, so this cannot deadlock with one).
    pub(crate) fn acquire_waiting(
        table: &LockTable,
        indices: &[usize],
        owner: u64,
        mut buffer: Vec<(usize, u64)>,
    ) -> StripeLocks {
        buffer.clear();
        let mut locks = StripeLocks { held: buffer };
        for &i in indices {
            let mut spins = 0u32;
            let previous = loop {
                match table.try_lock(i, owner) {
                    Ok(previous) => break previous,
                    Err(_) if spins < 64 => {
                        spins += 1;
                        std::hint::spin_loop();
                    }
                    Err(_) => std::thread::yield_now(),
                }
            };
            locks.held.push((i, previous));
        }
        // As in `acquire`: the holder's stores come after its locks.
        super::atomic::fence(Ordering::Release);
        locks
    }

    /// The version lock `i` had before this transaction took it, if it holds it.
    pub(crate) fn previous_version(&self, i: usize) -> Option<u64> {
        self.held
            .binary_search_by_key(&i, |&(j, _)| j)
            .ok()
            .map(|k| version_of(self.held[k].1))
    }

    /// Releases every lock with the new commit version; returns the buffer.
    pub(crate) fn release(self, table: &LockTable, version: u64) -> Vec<(usize, u64)> {
        for &(i, _) in &self.held {
            table.store(i, version << 1);
        }
        self.held
    }

    /// Releases every lock with the word it had before (the commit did not happen);
    /// returns the buffer.
    pub(crate) fn restore(self, table: &LockTable) -> Vec<(usize, u64)> {
        for &(i, previous) in &self.held {
            table.store(i, previous);
        }
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_release_and_conflict() {
        let t = LockTable::new(10);
        let a = StripeLocks::acquire(&t, &[1, 5, 9], 7, Vec::new()).unwrap();
        assert!(is_locked(t.load(5)));
        assert_eq!(a.previous_version(5), Some(0));
        assert_eq!(a.previous_version(6), None);
        assert_eq!(
            StripeLocks::acquire(&t, &[0, 5], 8, Vec::new()).err(),
            Some(Conflict)
        );
        assert!(
            !is_locked(t.load(0)),
            "a failed acquire releases what it took"
        );
        a.release(&t, 42);
        assert_eq!(version_of(t.load(9)), 42);
        let b = StripeLocks::acquire(&t, &[9], 8, Vec::new()).unwrap();
        b.restore(&t);
        assert_eq!(version_of(t.load(9)), 42);
    }
}
