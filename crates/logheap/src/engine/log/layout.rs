//! Byte layout of the log ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §4.2), all little-endian.
//!
//! **Chunk header** (64 bytes: one cache line, at the start of every chunk), as eight
//! words: magic `LHC1` (4), log kind (1), flags (1; bit 0: the payload was all zeros
//! when the chunk joined its log), reserved (2) | owner log-set id (4), reserved
//! (4) | generation (8) | sequence number in the log (4), end mark `LHCT` (4) | three
//! reserved zero words | previous chunk of the same log or `u32::MAX` (4), CRC32C of
//! bytes 0..60 (4). Words 0, 1, 2 and 3 of a valid header are never zero. The header
//! is written in word order over a zeroed line, so a header whose write a crash
//! interrupted has a zero last word and a prefix of its words; a damaged one (any single
//! changed byte) does not look like that ([`HeaderState`]). The previous chunk and the
//! CRC share the last word so that the cleaner can *repoint* a chunk to another
//! predecessor with one 8-byte store, which a crash cannot tear
//! ([`ChunkHeader::last_word`]).
//!
//! **Transaction block** (16-byte aligned): preamble of 24 bytes — version (8), peer
//! pointer (48 bits, the pool offset of the next block of the same transaction, cyclic) and
//! entry count (16 bits) in one word, entries length (4), CRC32C (4) — then the entries.
//! The CRC covers the chunk index and generation, the preamble's first 20 bytes and the
//! entries, so a stale block left in a reused chunk never validates. The version and the
//! peer pointer of a valid block are never zero.
//!
//! **End mark**: 16 zero bytes. Every commit writes one after the last block it puts in a
//! chunk (unless the block ends the chunk), so the written part of a chunk always ends
//! in an end mark and never runs into stale bytes of a former use: after a crash, bytes
//! that are neither a valid block nor an end mark at the end of a log are a torn write.
//! A single changed byte cannot turn a block into an end mark (it would have to zero
//! both the version and the peer word).
//!
//! **Entry**: a header word — home offset (47 bits), tombstone bit, data size (16 bits) —
//! then `size` data bytes. In the update log entries carry data; so do they in the
//! initial-data log, which holds the images of the objects transactions allocate (with
//! `Config::separate_initial_data(false)` they go to the update log). In the allocation
//! log an entry with the tombstone bit set is an *allocation record* (8 data bytes: the
//! object's length); in the deallocation log every entry is a *free record* (tombstone
//! bit, 8 data bytes: the length freed).

pub(crate) use crate::bytes::{u32_at, u64_at};

/// Size of a chunk header.
pub(crate) const CHUNK_HEADER: usize = 64;
/// Size of a block preamble.
pub(crate) const PREAMBLE: usize = 24;
/// Size of an entry header.
pub(crate) const ENTRY_HEADER: usize = 8;
/// Largest data size of one entry.
pub(crate) const MAX_ENTRY_DATA: usize = u16::MAX as usize;
/// Most entries in one block.
pub(crate) const MAX_BLOCK_ENTRIES: usize = u16::MAX as usize;
/// Blocks start at multiples of this (so appends are whole non-temporal stores).
pub(crate) const BLOCK_ALIGN: usize = 16;
/// Size of the end mark that follows the last block of a commit in a chunk.
pub(crate) const END_MARK: usize = 16;
pub(crate) use crate::alloc::home::HOME_LIMIT;

const CHUNK_MAGIC: [u8; 4] = *b"LHC1";
const CHUNK_END_MARK: [u8; 4] = *b"LHCT";
const NO_CHUNK: u32 = u32::MAX;
/// Words of a chunk header.
const HEADER_WORDS: usize = CHUNK_HEADER / 8;

/// Which log a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LogKind {
    /// Stores to existing data.
    Update = 1,
    /// Allocation records.
    Alloc = 2,
    /// Free records (tombstones).
    Dealloc = 3,
    /// The initial data of new objects (their images): data like the update log's,
    /// kept apart from stores ("Log-structured Non-volatile Main Memory", §3.4,
    /// separate logs: stores die young, new objects live long, so chunks of stores
    /// alone are more often wholly stale and reclaimed without copying).
    Initial = 4,
}

impl LogKind {
    /// Every kind, in the order a transaction's blocks are written and linked.
    pub(crate) const ALL: [LogKind; 4] = [
        LogKind::Update,
        LogKind::Alloc,
        LogKind::Dealloc,
        LogKind::Initial,
    ];

    pub(crate) fn from_byte(b: u8) -> Option<LogKind> {
        LogKind::ALL.into_iter().find(|k| *k as u8 == b)
    }

    pub(crate) fn index(self) -> usize {
        self as usize - 1
    }

    /// Whether its entries are data (mapped and cleaned chunk by chunk), not records
    /// (which leave the pool through allocation checkpoints).
    pub(crate) fn holds_data(self) -> bool {
        matches!(self, LogKind::Update | LogKind::Initial)
    }
}

/// A decoded chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkHeader {
    pub kind: LogKind,
    /// The payload was all zeros when the chunk joined its log: then everything after a
    /// commit's last block in it stays zero until the next commit writes there.
    pub zeroed: bool,
    pub owner: u32,
    pub generation: u64,
    pub prev: Option<u32>,
    pub seq: u32,
}

impl ChunkHeader {
    pub(crate) fn encode(&self) -> [u8; CHUNK_HEADER] {
        let mut b = [0u8; CHUNK_HEADER];
        b[0..4].copy_from_slice(&CHUNK_MAGIC);
        b[4] = self.kind as u8;
        b[5] = self.zeroed as u8;
        b[8..12].copy_from_slice(&self.owner.to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b[24..28].copy_from_slice(&self.seq.to_le_bytes());
        b[28..32].copy_from_slice(&CHUNK_END_MARK);
        b[56..60].copy_from_slice(&self.prev.unwrap_or(NO_CHUNK).to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The header in `b`, or `None` when `b` holds no valid header.
    pub(crate) fn decode(b: &[u8]) -> Option<ChunkHeader> {
        if b.len() < CHUNK_HEADER || b[0..4] != CHUNK_MAGIC || b[28..32] != CHUNK_END_MARK {
            return None;
        }
        if crc32c::crc32c(&b[..60]) != u32_at(b, 60) {
            return None;
        }
        let prev = u32_at(b, 56);
        if b[5] > 1 {
            return None;
        }
        Some(ChunkHeader {
            kind: LogKind::from_byte(b[4])?,
            zeroed: b[5] == 1,
            owner: u32_at(b, 8),
            generation: u64_at(b, 16),
            prev: (prev != NO_CHUNK).then_some(prev),
            seq: u32_at(b, 24),
        })
    }

    /// The header's last word (previous chunk and CRC) and its offset in the header:
    /// the only word that differs between two headers that differ only in `prev`, so
    /// storing it (one untearable 8-byte store) repoints a written header.
    pub(crate) fn last_word(&self) -> (usize, u64) {
        let at = CHUNK_HEADER - 8;
        (at, u64_at(&self.encode(), at))
    }
}

/// What the first line of a chunk holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderState {
    /// Zeros: the chunk is in no log.
    Free,
    /// A valid header.
    Valid(ChunkHeader),
    /// A prefix of a header's words over zeros, without its last word: a header whose
    /// write a crash interrupted (in flight, so its chunk holds nothing committed). The
    /// owner is known when its word reached the media.
    Torn {
        /// The owning log set, if its word was written.
        owner: Option<u32>,
    },
    /// Anything else: damage.
    Damaged,
}

impl HeaderState {
    /// Classifies the 64 bytes at the start of a chunk.
    pub(crate) fn of(b: &[u8; CHUNK_HEADER]) -> HeaderState {
        if b.iter().all(|&x| x == 0) {
            return HeaderState::Free;
        }
        if let Some(h) = ChunkHeader::decode(b) {
            return HeaderState::Valid(h);
        }
        let words: [u64; HEADER_WORDS] = std::array::from_fn(|i| u64_at(b, i * 8));
        // Words 4..7 are zero in a torn header (reserved, or not yet written); words
        // 0..3 are never zero when written, so the written ones form a prefix.
        let written = words.iter().take_while(|&&w| w != 0).count();
        let prefix = written <= 4 && words[written..].iter().all(|&w| w == 0);
        let first_word_fits =
            written == 0 || (b[0..4] == CHUNK_MAGIC && LogKind::from_byte(b[4]).is_some());
        if prefix && first_word_fits {
            HeaderState::Torn {
                owner: (written >= 2).then(|| u32_at(b, 8)),
            }
        } else {
            HeaderState::Damaged
        }
    }
}

/// The order in which a chunk header's words are zeroed when its chunk leaves its log:
/// the last word first, then the others from the back, so that a crash at any point
/// leaves a torn header (never a damaged one).
pub(crate) fn header_erase_order() -> impl Iterator<Item = usize> {
    (0..HEADER_WORDS).rev().map(|w| w * 8)
}

/// One entry to encode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EntryRef<'a> {
    pub home: u64,
    pub tombstone: bool,
    pub data: &'a [u8],
}

/// The encoded size of a block holding entries with `data_bytes` in all.
pub(crate) fn block_size(entries: usize, data_bytes: usize) -> usize {
    (PREAMBLE + entries * ENTRY_HEADER + data_bytes).next_multiple_of(BLOCK_ALIGN)
}

fn entry_word(home: u64, tombstone: bool, size: usize) -> u64 {
    debug_assert!(home < HOME_LIMIT && size <= MAX_ENTRY_DATA);
    home | (tombstone as u64) << 47 | (size as u64) << 48
}

/// Encodes a block into `out` (cleared first).
pub(crate) fn encode_block<'a>(
    out: &mut Vec<u8>,
    chunk: u32,
    generation: u64,
    version: u64,
    peer: u64,
    entries: impl ExactSizeIterator<Item = EntryRef<'a>> + Clone,
) {
    out.clear();
    let len: usize = entries.clone().map(|e| ENTRY_HEADER + e.data.len()).sum();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(peer | (entries.len() as u64) << 48).to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    for e in entries {
        out.extend_from_slice(&entry_word(e.home, e.tombstone, e.data.len()).to_le_bytes());
        out.extend_from_slice(e.data);
    }
    let crc = block_crc(chunk, generation, &out[..20], &out[PREAMBLE..]);
    out[20..24].copy_from_slice(&crc.to_le_bytes());
    out.resize(out.len().next_multiple_of(BLOCK_ALIGN), 0);
}

/// The checksum of a block: CRC32C of its chunk's index and generation (so a stale block
/// of a reused chunk never validates), the first 20 bytes of its preamble and its entries.
pub(crate) fn block_crc(chunk: u32, generation: u64, preamble: &[u8], entries: &[u8]) -> u32 {
    // The same CRC as over the four parts one after another, in two calls: the crate's
    // fixed cost per call is most of a small block's checksum.
    let mut head = [0u8; 4 + 8 + 20];
    head[..4].copy_from_slice(&chunk.to_le_bytes());
    head[4..12].copy_from_slice(&generation.to_le_bytes());
    let n = preamble.len().min(20);
    head[12..12 + n].copy_from_slice(&preamble[..n]);
    let mut crc = crc32c::crc32c(&head[..12 + n]);
    if preamble.len() > 20 {
        crc = crc32c::crc32c_append(crc, &preamble[20..]);
    }
    crc32c::crc32c_append(crc, entries)
}

/// A decoded entry; `data` is the offset of its data within the chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecodedEntry {
    pub home: u64,
    pub tombstone: bool,
    pub size: u32,
    pub data: u32,
}

/// A decoded, checksum-valid block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodedBlock {
    /// Offset of the block within its chunk.
    pub offset: u32,
    pub version: u64,
    pub peer: u64,
    /// The checksum stored in its preamble (what [`block_digest`] takes).
    pub crc: u32,
    /// Where its entries are in the list [`decode_block`] appended them to.
    pub entries: std::ops::Range<u32>,
    /// Offset of the next block within the chunk.
    pub end: u32,
}

impl DecodedBlock {
    /// The block's entries in `list`, the list [`decode_block`] appended them to.
    pub(crate) fn entries_in<'a>(&self, list: &'a [DecodedEntry]) -> &'a [DecodedEntry] {
        &list[self.entries.start as usize..self.entries.end as usize]
    }
}

/// What is at some offset of a chunk's payload.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BlockScan {
    /// A valid block.
    Block(DecodedBlock),
    /// An end mark (or the end of the chunk): the end of the written part.
    End,
    /// Something that is not a valid block (a torn write or damage).
    Invalid,
}

/// Decodes the block at `offset` of `chunk_bytes` (a whole chunk), never panicking.
/// A valid block's entries are appended to `entries` (the block's
/// [`DecodedBlock::entries`] says where), so that a caller decoding many blocks into one
/// list allocates once, not per block; otherwise `entries` is left as it was.
pub(crate) fn decode_block(
    chunk_bytes: &[u8],
    chunk: u32,
    generation: u64,
    offset: usize,
    entries: &mut Vec<DecodedEntry>,
) -> BlockScan {
    let Some(pre) = chunk_bytes.get(offset..offset + PREAMBLE) else {
        return BlockScan::End;
    };
    let version = u64_at(pre, 0);
    let word = u64_at(pre, 8);
    if version == 0 && word == 0 {
        return BlockScan::End;
    }
    if version == 0 {
        return BlockScan::Invalid;
    }
    let peer = word & ((1 << 48) - 1);
    let count = (word >> 48) as usize;
    let len = u32_at(pre, 16) as usize;
    let Some(body) = chunk_bytes.get(offset + PREAMBLE..offset + PREAMBLE + len) else {
        return BlockScan::Invalid;
    };
    if block_crc(chunk, generation, &pre[..20], body) != u32_at(pre, 20) {
        return BlockScan::Invalid;
    }
    let first = entries.len();
    let invalid = |entries: &mut Vec<DecodedEntry>| {
        entries.truncate(first);
        BlockScan::Invalid
    };
    // `count` comes from the file: reserve no more than the body can hold.
    entries.reserve(count.min(len / ENTRY_HEADER));
    let mut at = 0;
    while at < len {
        let Some(h) = body.get(at..at + ENTRY_HEADER) else {
            return invalid(entries);
        };
        let w = u64_at(h, 0);
        let size = (w >> 48) as usize;
        if at + ENTRY_HEADER + size > len {
            return invalid(entries);
        }
        entries.push(DecodedEntry {
            home: w & (HOME_LIMIT - 1),
            tombstone: w >> 47 & 1 == 1,
            size: size as u32,
            data: (offset + PREAMBLE + at + ENTRY_HEADER) as u32,
        });
        at += ENTRY_HEADER + size;
    }
    if entries.len() - first != count {
        return invalid(entries);
    }
    BlockScan::Block(DecodedBlock {
        offset: offset as u32,
        version,
        peer,
        crc: u32_at(pre, 20),
        // Lists hold the entries of one chunk at most: far fewer than 2^32.
        entries: first as u32..entries.len() as u32,
        end: (offset + block_size(0, len)) as u32,
    })
}

/// The checksum stored in an encoded block (`block` starts at its preamble).
pub(crate) fn stored_crc(block: &[u8]) -> u32 {
    u32_at(block, 20)
}

/// One block's share of a log's fingerprint: the XOR over the log's committed blocks
/// of this hash of where each is and its stored checksum. Order does not matter, so a
/// committer adds its blocks as it appends them and recovery adds what it reads; a
/// block rewritten with a checksum of its own changes it (the snapshot of a clean close
/// records it, so that a log changed behind the snapshot's back is noticed).
pub(crate) fn block_digest(chunk: u32, offset: u32, crc: u32) -> u64 {
    // splitmix64's finaliser over the three fields.
    let mut x = ((chunk as u64) << 32 | offset as u64) ^ (crc as u64).rotate_left(23);
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_crc_is_the_crc_of_its_parts_in_order() {
        let preamble: Vec<u8> = (0..20).collect();
        let entries: Vec<u8> = (0..100).map(|i| (i * 7) as u8).collect();
        let mut all = 9u32.to_le_bytes().to_vec();
        all.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        all.extend_from_slice(&preamble);
        all.extend_from_slice(&entries);
        assert_eq!(
            block_crc(9, 0x0102_0304_0506_0708, &preamble, &entries),
            crc32c::crc32c(&all)
        );
        assert_ne!(
            block_crc(8, 0x0102_0304_0506_0708, &preamble, &entries),
            crc32c::crc32c(&all)
        );
    }

    #[test]
    fn chunk_header_round_trip_and_damage() {
        let h = ChunkHeader {
            kind: LogKind::Alloc,
            zeroed: true,
            owner: 3,
            generation: 99,
            prev: Some(7),
            seq: 2,
        };
        let b = h.encode();
        assert_eq!(ChunkHeader::decode(&b), Some(h));
        for bit in 0..CHUNK_HEADER * 8 {
            let mut d = b;
            d[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(ChunkHeader::decode(&d), None, "bit {bit}");
        }
        assert_eq!(ChunkHeader::decode(&[0u8; 64]), None);
        // Repointing stores the last word only, and yields the header with the new
        // predecessor (or none).
        for prev in [Some(0), Some(12), None] {
            let to = ChunkHeader { prev, ..h };
            let (at, word) = to.last_word();
            let mut r = b;
            r[at..at + 8].copy_from_slice(&word.to_le_bytes());
            assert_eq!(r, to.encode());
            assert_eq!(ChunkHeader::decode(&r), Some(to));
        }
    }

    #[test]
    fn torn_and_damaged_headers_are_told_apart() {
        let h = ChunkHeader {
            kind: LogKind::Update,
            zeroed: false,
            owner: 4,
            generation: 1 << 20,
            prev: None,
            seq: 0,
        };
        let full = h.encode();
        assert_eq!(HeaderState::of(&full), HeaderState::Valid(h));
        assert_eq!(HeaderState::of(&[0; CHUNK_HEADER]), HeaderState::Free);
        // Every prefix of the header's words, written over zeros, is a torn header;
        // so is every state of its erasure.
        for words in 1..HEADER_WORDS {
            let mut b = [0u8; CHUNK_HEADER];
            b[..words * 8].copy_from_slice(&full[..words * 8]);
            let owner = (words >= 2).then_some(4);
            assert_eq!(
                HeaderState::of(&b),
                HeaderState::Torn { owner },
                "{words} words"
            );
        }
        let mut b = full;
        for (i, word) in header_erase_order().enumerate() {
            b[word..word + 8].fill(0);
            let state = HeaderState::of(&b);
            assert!(
                matches!(state, HeaderState::Torn { .. } | HeaderState::Free),
                "erased {} words: {state:?}",
                i + 1
            );
        }
        // Any single changed byte of a valid or a free header is damage.
        for at in 0..CHUNK_HEADER {
            for base in [full, [0u8; CHUNK_HEADER]] {
                let mut b = base;
                b[at] ^= 0x10;
                assert_eq!(HeaderState::of(&b), HeaderState::Damaged, "byte {at}");
            }
        }
    }

    #[test]
    fn block_round_trip_and_every_flipped_bit_is_caught() {
        let data = [7u8; 130];
        let entries = [
            EntryRef {
                home: 4096,
                tombstone: false,
                data: &data,
            },
            EntryRef {
                home: (1 << 47) - 8,
                tombstone: true,
                data: &8u64.to_le_bytes(),
            },
        ];
        let mut buf = Vec::new();
        encode_block(&mut buf, 5, 11, 42, 0x1234_5678, entries.iter().copied());
        assert_eq!(buf.len(), block_size(2, 138));
        assert_eq!(buf.len() % BLOCK_ALIGN, 0);
        let mut chunk = vec![0u8; 1024];
        chunk[64..64 + buf.len()].copy_from_slice(&buf);
        // Entries are appended after what the list already holds.
        let earlier = DecodedEntry {
            home: 0,
            tombstone: false,
            size: 0,
            data: 0,
        };
        let mut decoded = vec![earlier];
        let BlockScan::Block(b) = decode_block(&chunk, 5, 11, 64, &mut decoded) else {
            panic!("block did not decode")
        };
        assert_eq!(
            (b.version, b.peer, b.entries.clone()),
            (42, 0x1234_5678, 1..3)
        );
        let e = &decoded[b.entries.start as usize..b.entries.end as usize];
        assert_eq!(decoded[0], earlier);
        assert_eq!(e[0].data, 64 + 24 + 8);
        assert_eq!(&chunk[e[0].data as usize..][..130], &data);
        assert!(e[1].tombstone && e[1].home == (1 << 47) - 8);
        assert_eq!(b.end as usize, 64 + buf.len());
        assert_eq!(
            decode_block(&chunk, 5, 11, b.end as usize, &mut decoded),
            BlockScan::End
        );
        // Another chunk or generation: the same bytes are not a valid block there.
        assert_eq!(
            decode_block(&chunk, 6, 11, 64, &mut decoded),
            BlockScan::Invalid
        );
        assert_eq!(
            decode_block(&chunk, 5, 12, 64, &mut decoded),
            BlockScan::Invalid
        );
        for bit in 0..(24 + 2 * 8 + 138) * 8 {
            let mut d = chunk.clone();
            d[64 + bit / 8] ^= 1 << (bit % 8);
            assert!(
                !matches!(
                    decode_block(&d, 5, 11, 64, &mut decoded),
                    BlockScan::Block(_)
                ),
                "bit {bit} not caught"
            );
        }
        // What failed to decode left the list as it was.
        assert_eq!(decoded.len(), 3);
    }

    #[test]
    fn truncated_or_garbage_blocks_never_panic() {
        let mut chunk = vec![0xffu8; 256];
        let mut decoded = Vec::new();
        assert_eq!(
            decode_block(&chunk, 0, 0, 200, &mut decoded),
            BlockScan::Invalid
        );
        assert_eq!(
            decode_block(&chunk, 0, 0, 250, &mut decoded),
            BlockScan::End
        );
        chunk[0..8].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(
            decode_block(&chunk, 0, 0, 0, &mut decoded),
            BlockScan::Invalid
        );
        assert!(decoded.is_empty());
    }
}
