//! The records of the in-place engines' logs: one record per transaction, a header
//! and entries, checked by a CRC.
//!
//! ```text
//! header (32 bytes):
//!   0  version   u64   the transaction's commit version
//!   8  body      u64   bytes of entries after the header
//!   16 magic     u32   REDO_MAGIC or UNDO_MAGIC (0: invalidated)
//!   20 entries   u32
//!   24 crc       u32   crc32c of header bytes 0..24 and the body
//!   28 zero      u32
//! entry:
//!   0  home      u64
//!   8  kind << 56 | len
//!   16 data      len bytes, padded to 8 (data entries only)
//! ```
//!
//! A data entry holds new bytes (redo) or old bytes (undo); an allocation or free entry
//! holds a block's offset and the size its mark was made with.

/// The magic of a redo record.
pub(crate) const REDO_MAGIC: u32 = 0x4f44_4552; // "REDO"
/// The magic of an undo record.
pub(crate) const UNDO_MAGIC: u32 = 0x4f44_4e55; // "UNDO"
/// Bytes of a record header.
pub(crate) const HEADER: usize = 32;
/// Where the magic word is in the header (an undo record is invalidated by storing
/// zero in the aligned word holding it).
pub(crate) const MAGIC_WORD: usize = 16;
/// Invalidates the record at `at` (zeroes its magic word), durably.
pub(crate) fn invalidate(media: &crate::media::Media, at: u64) {
    let word = at as usize + MAGIC_WORD;
    media.write_u64(word, 0);
    media.persist(word, 8);
}

/// Bytes of an entry header.
pub(crate) const ENTRY_HEADER: usize = 16;
const KIND_SHIFT: u32 = 56;

/// What an entry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// Bytes at `home`.
    Data,
    /// A block allocated.
    Alloc,
    /// A block freed.
    Free,
}

impl EntryKind {
    fn code(self) -> u64 {
        match self {
            EntryKind::Data => 1,
            EntryKind::Alloc => 2,
            EntryKind::Free => 3,
        }
    }

    fn from_code(code: u64) -> Option<EntryKind> {
        match code {
            1 => Some(EntryKind::Data),
            2 => Some(EntryKind::Alloc),
            3 => Some(EntryKind::Free),
            _ => None,
        }
    }
}

/// One decoded entry: for data, `len` bytes at `data` of the record; for allocations
/// and frees, `len` is the block's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub kind: EntryKind,
    pub home: u64,
    pub len: u64,
    /// Offset of the data in the record (data entries).
    pub data: usize,
}

/// Builds one record in a buffer reused from one transaction to the next.
#[derive(Debug, Default)]
pub(crate) struct RecordBuilder {
    buf: Vec<u8>,
    entries: u32,
}

impl RecordBuilder {
    /// Starts a new record.
    pub(crate) fn start(&mut self) {
        self.buf.clear();
        self.buf.resize(HEADER, 0);
        self.entries = 0;
    }

    /// Whether no entry was added.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Adds a data entry of `bytes` at `home`.
    pub(crate) fn data(&mut self, home: u64, bytes: &[u8]) {
        self.entry_header(EntryKind::Data, home, bytes.len() as u64);
        self.buf.extend_from_slice(bytes);
        self.buf.resize(self.buf.len().next_multiple_of(8), 0);
    }

    /// Adds a data entry of `len` bytes at `home`, filled by `fill` in place.
    pub(crate) fn data_with(&mut self, home: u64, len: usize, fill: impl FnOnce(&mut [u8])) {
        self.entry_header(EntryKind::Data, home, len as u64);
        let at = self.buf.len();
        self.buf.resize(at + len.next_multiple_of(8), 0);
        fill(&mut self.buf[at..at + len]);
    }

    /// Adds an allocation or free entry.
    pub(crate) fn block(&mut self, kind: EntryKind, home: u64, size: u64) {
        debug_assert_ne!(kind, EntryKind::Data);
        self.entry_header(kind, home, size);
    }

    fn entry_header(&mut self, kind: EntryKind, home: u64, len: u64) {
        debug_assert!(len < 1 << KIND_SHIFT);
        self.buf.extend_from_slice(&home.to_le_bytes());
        self.buf
            .extend_from_slice(&(kind.code() << KIND_SHIFT | len).to_le_bytes());
        self.entries += 1;
    }

    /// Seals the record with its version and magic and returns its bytes.
    pub(crate) fn seal(&mut self, version: u64, magic: u32) -> &[u8] {
        let body = (self.buf.len() - HEADER) as u64;
        self.buf[0..8].copy_from_slice(&version.to_le_bytes());
        self.buf[8..16].copy_from_slice(&body.to_le_bytes());
        self.buf[16..20].copy_from_slice(&magic.to_le_bytes());
        self.buf[20..24].copy_from_slice(&self.entries.to_le_bytes());
        let crc = crc(&self.buf[..24], &self.buf[HEADER..]);
        self.buf[24..28].copy_from_slice(&crc.to_le_bytes());
        self.buf[28..32].fill(0);
        &self.buf
    }

    /// The record's length so far.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }
}

fn crc(header: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header), body)
}

/// A record's header fields, decoded from the first [`HEADER`] bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub version: u64,
    pub body: u64,
    pub magic: u32,
    pub entries: u32,
    pub crc: u32,
}

impl RecordHeader {
    /// Decodes a header (no check).
    pub(crate) fn decode(b: &[u8; HEADER]) -> RecordHeader {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        RecordHeader {
            version: u64_at(0),
            body: u64_at(8),
            magic: u32_at(16),
            entries: u32_at(20),
            crc: u32_at(24),
        }
    }

    /// The whole record's length, if its body fits in `room` bytes after the header.
    pub(crate) fn record_len(&self, room: u64) -> Option<usize> {
        (self.body <= room && self.body.is_multiple_of(8)).then_some(HEADER + self.body as usize)
    }
}

/// Checks a whole record (`bytes` is header and body, as [`RecordHeader::record_len`] said)
/// with the given magic, and decodes its entries; `None` if it is not a valid record.
pub(crate) fn decode(bytes: &[u8], magic: u32) -> Option<(RecordHeader, Vec<Entry>)> {
    let header = RecordHeader::decode(bytes.get(..HEADER)?.try_into().ok()?);
    if header.magic != magic
        || bytes.len() != HEADER + header.body as usize
        || bytes[28..HEADER] != [0; 4]
    {
        return None;
    }
    if crc(&bytes[..24], &bytes[HEADER..]) != header.crc {
        return None;
    }
    let mut entries = Vec::with_capacity(header.entries.min(1 << 16) as usize);
    let mut at = HEADER;
    for _ in 0..header.entries {
        let head = bytes.get(at..at + ENTRY_HEADER)?;
        let home = u64::from_le_bytes(head[..8].try_into().ok()?);
        let word = u64::from_le_bytes(head[8..].try_into().ok()?);
        let kind = EntryKind::from_code(word >> KIND_SHIFT)?;
        let len = word & ((1 << KIND_SHIFT) - 1);
        at += ENTRY_HEADER;
        let data = at;
        if kind == EntryKind::Data {
            let padded = usize::try_from(len).ok()?.checked_next_multiple_of(8)?;
            at = at.checked_add(padded)?;
            if at > bytes.len() {
                return None;
            }
        }
        entries.push(Entry {
            kind,
            home,
            len,
            data,
        });
    }
    (at == bytes.len()).then_some((header, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_any_flipped_byte_is_refused() {
        let mut b = RecordBuilder::default();
        b.start();
        b.data(4096, b"hello");
        b.block(EntryKind::Alloc, 8192, 100);
        b.data_with(64, 3, |d| d.copy_from_slice(b"abc"));
        b.block(EntryKind::Free, 12288, 64);
        let bytes = b.seal(7, REDO_MAGIC).to_vec();
        let (h, entries) = decode(&bytes, REDO_MAGIC).expect("valid");
        assert_eq!((h.version, h.entries), (7, 4));
        assert_eq!(entries[0].kind, EntryKind::Data);
        assert_eq!(&bytes[entries[0].data..entries[0].data + 5], b"hello");
        assert_eq!(
            (entries[1].kind, entries[1].home, entries[1].len),
            (EntryKind::Alloc, 8192, 100)
        );
        assert_eq!(&bytes[entries[2].data..entries[2].data + 3], b"abc");
        assert_eq!((entries[3].kind, entries[3].len), (EntryKind::Free, 64));
        assert!(decode(&bytes, UNDO_MAGIC).is_none(), "another log's magic");
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad, REDO_MAGIC).is_none(), "byte {i} flipped");
        }
        assert!(
            decode(&bytes[..bytes.len() - 8], REDO_MAGIC).is_none(),
            "cut short"
        );
    }

    #[test]
    fn a_header_claiming_more_than_the_room_is_refused() {
        let mut b = RecordBuilder::default();
        b.start();
        b.data(0, &[1; 40]);
        let bytes = b.seal(1, UNDO_MAGIC).to_vec();
        let h = RecordHeader::decode(bytes[..HEADER].try_into().unwrap());
        assert_eq!(h.record_len(1 << 20), Some(bytes.len()));
        assert_eq!(h.record_len(h.body - 8), None);
    }
}
