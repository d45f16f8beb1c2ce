//! An entry count spread over eight words in separate 64-byte lines (each its own STM
//! lock stripe), the word chosen by the calling thread: transactions of different
//! threads (up to eight of them) never conflict on the count, as they would on a single
//! word. The count is the sum of the words, whichever thread added to which.

use std::sync::atomic::{AtomicU64, Ordering};

use logheap::{Error, PPtr, Tx};

const SLOTS: u64 = 8;
const SPACING: u64 = 64;

/// Allocates a zero count; returns its home offset.
pub(crate) fn create(tx: &mut Tx<'_>) -> Result<u64, Error> {
    tx.alloc_bytes(SLOTS * SPACING)
}

/// This thread's word of the count at `at`: threads take the words in turn as they
/// first count, so concurrent threads hold different words. (Chosen by key instead,
/// two threads' updates met on one word once in eight: a conflict that aborted one
/// of them.)
fn slot(at: u64) -> PPtr<u64> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static MINE: u64 = NEXT.fetch_add(1, Ordering::Relaxed) % SLOTS;
    }
    PPtr::from_offset(at + MINE.with(|i| *i) * SPACING)
}

/// Adds `delta` (to this thread's word).
pub(crate) fn add(tx: &mut Tx<'_>, at: u64, delta: i64) -> Result<(), Error> {
    let p = slot(at);
    let n = tx.read(p)?;
    tx.write(p, &n.wrapping_add_signed(delta))
}

/// The count.
pub(crate) fn total(tx: &mut Tx<'_>, at: u64) -> Result<u64, Error> {
    (0..SLOTS).try_fold(0u64, |sum, i| {
        Ok(sum.wrapping_add(tx.read(PPtr::<u64>::from_offset(at + i * SPACING))?))
    })
}
