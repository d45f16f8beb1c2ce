//! Persistent addresses of the persistent heap: `{file id, offset}` packed into 8 bytes.
//!
//! PAllocator (002) addresses persistent memory as "PPtr: {File ID, Offset}" so pointers
//! stay valid across restarts and remaps. 002 packs them into 16 bytes for multi-file
//! pools; we pack a 24-bit file id and a 40-bit offset into one word instead (files up to
//! 1 TiB, 16 M files), so a persistent pointer is one atomic store and the same size as a
//! [`PPtr`](crate::PPtr). A `PAddr` is resolved to memory through the heap's file table
//! when it is used ("lazy swizzling", 004): nothing stored is ever rewritten at restart.

use std::fmt;

/// Bits of a [`PAddr`] that hold the offset inside its file.
pub const OFFSET_BITS: u32 = 40;
/// The largest file id a [`PAddr`] can name.
pub const MAX_FILE_ID: u32 = (1 << (64 - OFFSET_BITS)) - 1;
/// The largest offset a [`PAddr`] can hold.
pub const MAX_OFFSET: u64 = (1 << OFFSET_BITS) - 1;

/// A persistent address: a file of the heap and an offset inside it.
///
/// `PAddr::NULL` (file 0, offset 0: the pool header, never allocated) is the null
/// pointer. Store a `PAddr` in persistent memory as its [`raw`](PAddr::raw) word.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
#[serde(transparent)]
#[repr(transparent)]
pub struct PAddr(u64);

impl PAddr {
    /// The null address.
    pub const NULL: PAddr = PAddr(0);

    /// The address `offset` bytes into file `file`, or `None` when either is out of range.
    pub fn new(file: u32, offset: u64) -> Option<PAddr> {
        (file <= MAX_FILE_ID && offset <= MAX_OFFSET)
            .then(|| PAddr((u64::from(file) << OFFSET_BITS) | offset))
    }

    /// The address stored as `raw` (any word is an address; the heap checks it on use).
    pub const fn from_raw(raw: u64) -> PAddr {
        PAddr(raw)
    }

    /// The word to store in persistent memory.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The file the address is in (0: the pool file itself).
    pub const fn file(self) -> u32 {
        (self.0 >> OFFSET_BITS) as u32
    }

    /// The offset inside the file.
    pub const fn offset(self) -> u64 {
        self.0 & MAX_OFFSET
    }

    /// Whether this is the null address.
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` further on in the same file, or `None` past the offset range.
    pub fn checked_add(self, bytes: u64) -> Option<PAddr> {
        PAddr::new(self.file(), self.offset().checked_add(bytes)?)
    }
}

impl fmt::Debug for PAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PAddr({}:{:#x})", self.file(), self.offset())
    }
}

impl fmt::Display for PAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{:#x}", self.file(), self.offset())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_and_offset_round_trip_at_the_limits() {
        for (file, offset) in [(0, 0), (1, 4096), (MAX_FILE_ID, MAX_OFFSET), (7, 1 << 39)] {
            let a = PAddr::new(file, offset).unwrap();
            assert_eq!((a.file(), a.offset()), (file, offset));
            assert_eq!(PAddr::from_raw(a.raw()), a);
        }
        assert!(PAddr::new(MAX_FILE_ID + 1, 0).is_none());
        assert!(PAddr::new(0, MAX_OFFSET + 1).is_none());
        assert!(PAddr::NULL.is_null() && !PAddr::new(0, 8).unwrap().is_null());
        assert_eq!(PAddr::new(3, 10).unwrap().checked_add(6), PAddr::new(3, 16));
        assert_eq!(PAddr::new(3, MAX_OFFSET).unwrap().checked_add(1), None);
    }
}
