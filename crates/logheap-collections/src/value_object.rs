//! Values stored out of line, as `{len: u64, bytes}` objects: the trees keep a pointer
//! to one per entry, so a value of any length never moves a node.

use logheap::{Error, PPtr, Tx};

/// Allocates an object holding `value`; returns its home offset.
pub(crate) fn create(tx: &mut Tx<'_>, value: &[u8]) -> Result<u64, Error> {
    let at = tx.alloc_bytes(8 + value.len() as u64)?;
    tx.write(PPtr::<u64>::from_offset(at), &(value.len() as u64))?;
    tx.write_bytes(at + 8, value)?;
    Ok(at)
}

/// Reads the value of the object at `at` into `out` (replacing what it held; its
/// capacity is reused, so a caller that keeps `out` allocates nothing once it is large
/// enough).
pub(crate) fn read_into(tx: &mut Tx<'_>, at: u64, out: &mut Vec<u8>) -> Result<(), Error> {
    let len: u64 = tx.read(PPtr::from_offset(at))?;
    out.clear();
    out.resize(len as usize, 0);
    tx.read_bytes(at + 8, out)
}

/// Puts `value` in the object at `at`: in place when the length is the same, else in a
/// new object (the old one is freed). Returns where the value now is.
pub(crate) fn replace(tx: &mut Tx<'_>, at: u64, value: &[u8]) -> Result<u64, Error> {
    let len: u64 = tx.read(PPtr::from_offset(at))?;
    if len == value.len() as u64 {
        tx.write_bytes(at + 8, value)?;
        return Ok(at);
    }
    let fresh = create(tx, value)?;
    tx.free(PPtr::<u8>::from_offset(at))?;
    Ok(fresh)
}

/// Frees the object at `at`.
pub(crate) fn free(tx: &mut Tx<'_>, at: u64) -> Result<(), Error> {
    tx.free(PPtr::<u8>::from_offset(at))
}
