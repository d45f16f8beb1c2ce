//! The sequence lock of a mapping partition ([`SortedArray`](super::sorted_array)): one
//! writer at a time, readers that never write and retry when a writer raced them.
//!
//! The sequence is even while the protected words are stable and odd while the writer
//! changes them. The writer takes the lock with a compare-and-swap from even to odd,
//! then a release fence (its later stores to the words must not be seen before the odd
//! sequence), stores the words (relaxed atomics), and releases with an increment back
//! to even (a release store: the words' stores are seen before the even sequence). A
//! reader loads the sequence (acquire; odd: a writer is in, try again), loads the words
//! (relaxed atomics), then an acquire fence (the words' loads happen before the
//! re-load: an acquire load alone would not keep earlier loads before it) and re-loads
//! the sequence: unchanged means the words were one stable state. This is the
//! construction of Boehm, "Can seqlocks get along with programming language memory
//! models?" (MSPC 2012), with the reader's fence of its §5.
//!
//! Its atomics are the STM protocol's (`crate::stm::atomic`), so the loom model checks
//! (`stm/loom_tests.rs`) run this very code.

use crate::stm::atomic::{AtomicU64, Ordering, fence};

/// A sequence lock (see the module docs).
#[derive(Debug)]
pub(crate) struct SeqLock {
    seq: AtomicU64,
}

impl Default for SeqLock {
    fn default() -> Self {
        SeqLock::new()
    }
}

impl SeqLock {
    /// An unlocked sequence lock at sequence 0.
    pub(crate) fn new() -> SeqLock {
        SeqLock {
            seq: AtomicU64::new(0),
        }
    }

    /// The sequence word: unchanged exactly as long as the protected words are (node
    /// caches keep it to revalidate what they cached).
    pub(crate) fn word(&self) -> &AtomicU64 {
        &self.seq
    }

    /// Starts a read: the sequence to validate it against, or `None` while a writer is
    /// in (the caller tries again).
    #[inline]
    pub(crate) fn read_begin(&self) -> Option<u64> {
        let s = self.seq.load(Ordering::Acquire);
        (s & 1 == 0).then_some(s)
    }

    /// Whether the words loaded since [`read_begin`](Self::read_begin) returned `begun`
    /// were one stable state.
    #[inline]
    pub(crate) fn read_valid(&self, begun: u64) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == begun
    }

    /// Takes the writers' lock, waiting while another writer holds it.
    pub(crate) fn write_lock(&self) {
        loop {
            let s = self.seq.load(Ordering::Relaxed);
            if s & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // The words' stores must not be seen before the odd sequence.
                fence(Ordering::Release);
                return;
            }
            #[cfg(loom)]
            loom::thread::yield_now();
            #[cfg(not(loom))]
            std::hint::spin_loop();
        }
    }

    /// Releases the writers' lock: the words are stable again.
    pub(crate) fn write_unlock(&self) {
        self.seq.fetch_add(1, Ordering::Release);
    }
}
