//! An entry count spread over eight words in separate 64-byte lines (each its own STM
//! lock stripe), the word chosen by key: transactions that insert or remove different
//! keys rarely conflict on the count, as they would on a single word.

use logheap::{Error, PPtr, Tx};

const SLOTS: u64 = 8;
const SPACING: u64 = 64;

/// Allocates a zero count; returns its home offset.
pub(crate) fn create(tx: &mut Tx<'_>) -> Result<u64, Error> {
    tx.alloc_bytes(SLOTS * SPACING)
}

fn slot(at: u64, key: u64) -> PPtr<u64> {
    let i = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 61;
    PPtr::from_offset(at + i * SPACING)
}

/// Adds `delta` (for `key`'s slot).
pub(crate) fn add(tx: &mut Tx<'_>, at: u64, key: u64, delta: i64) -> Result<(), Error> {
    let p = slot(at, key);
    let n = tx.read(p)?;
    tx.write(p, &n.wrapping_add_signed(delta))
}

/// The count.
pub(crate) fn total(tx: &mut Tx<'_>, at: u64) -> Result<u64, Error> {
    (0..SLOTS).try_fold(0u64, |sum, i| {
        Ok(sum.wrapping_add(tx.read(PPtr::<u64>::from_offset(at + i * SPACING))?))
    })
}
