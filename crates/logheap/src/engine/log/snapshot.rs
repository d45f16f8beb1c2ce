//! The clean-close snapshot: the DRAM state a clean close leaves behind, so the next open
//! need not replay the log ("Log-structured Non-volatile Main Memory", USENIX ATC 2017,
//! §3.5).
//!
//! A clean close writes what recovery would rebuild — every mapped piece (home, length,
//! log address), every live allocation (home, size) and a record of every chunk in a
//! log (its header and its book: blocks, largest version, fingerprint share, where its
//! blocks end) — and the next open, after a clean close, loads it instead of reading
//! the log: it reads the chunk headers and the last chunk of each log, not the blocks
//! of the others, which are checked later, before anything is read from them and by a
//! background scrub ([`super::chunk_checks`]). A damaged block is then found by the
//! read that meets it (which fails) or by the scrub, never returned: a snapshot never
//! hides damage.
//!
//! **Where**: in chunks that are in no log (free formatted chunks first, then chunks not
//! yet formatted). The first [`CHUNK_HEADER`] bytes of each are left as they are (zero in
//! a formatted free chunk), so recovery, which reads only the headers of free chunks,
//! still sees free chunks; a log that takes one later writes over the snapshot (a reused
//! chunk's stale bytes are already expected there). Each snapshot chunk starts, after the
//! header area, with a small header: magic, sequence number in the snapshot, the next
//! chunk (or none), and the bytes of payload in this chunk.
//!
//! **Found by** a locator in the superblock ([`LogSuperblock::write_snapshot_locator`]):
//! first chunk, number of chunks, payload length, payload checksum, under a checksum of
//! its own. The payload starts with the clean-close record it was written with.
//!
//! **Trusted only when** the pool was closed cleanly, the locator and every chunk header
//! check out, the payload's CRC32C matches, its close record equals the superblock's, the
//! chunk table adds up to the close record and to the log's fingerprint it recorded (an
//! order-free hash of every committed block's place and checksum: a block rewritten
//! since, even with a valid checksum of its own, is noticed when its chunk is checked),
//! the chunk headers read are those of the table, and its contents are consistent
//! (pieces sorted, disjoint, each inside the recorded run of blocks of a chunk in a
//! log; allocations accepted by the allocator's rebuild). Otherwise the open reads the
//! whole log: it loads the snapshot when the log agrees with it (a snapshot without a
//! chunk table, of an earlier format, is used so), else replays the log as after a
//! crash (and says why in
//! [`RecoveryReport::snapshot`](super::RecoveryReport::snapshot)).
//!
//! **Never stale**: every open durably erases the locator before it writes anything else
//! to the log, and a clean close writes the chunks, then the locator, then the
//! clean-close record, each durable before the next; the pool is marked closed after all
//! of them. A crash anywhere in between leaves a pool that was not closed cleanly, whose
//! open ignores any snapshot.
//!
//! [`LogSuperblock::write_snapshot_locator`]: super::superblock::LogSuperblock::write_snapshot_locator

use super::chunk_checks::ChunkRecord;
use super::chunks::{ChunkBook, ChunkGeometry};
use super::layout::{CHUNK_HEADER, ChunkHeader, HOME_LIMIT, LogKind, u32_at, u64_at};
use super::mapping::Piece;
use super::superblock::{CloseRecord, SnapshotLocator};
use crate::media::Media;
use integer_encoding::VarInt;

/// The payload magic of the varint format with a chunk table whose records hold their
/// chunk's entry and data byte counts, written now.
const PAYLOAD_MAGIC_TABLE: [u8; 8] = *b"LHSNAP04";
/// The payload magic of the varint format with a chunk table without those counts
/// (still read: the counts are then unknown, 0).
const PAYLOAD_MAGIC_TABLE_03: [u8; 8] = *b"LHSNAP03";
/// The payload magic of the varint format without a chunk table (still read; written
/// when the log's chunk headers cannot all be read at close).
const PAYLOAD_MAGIC: [u8; 8] = *b"LHSNAP02";
/// Bytes after a chunk table: its record count and its length in bytes.
const TABLE_TRAILER: usize = 16;
/// The payload magic of the first format (fixed little-endian words), still read.
const PAYLOAD_MAGIC_FIXED: [u8; 8] = *b"LHSNAP01";
const CHUNK_MAGIC: [u8; 8] = *b"LHSNAPCH";
/// Bytes of a snapshot chunk's own header (after the chunk header area): magic,
/// sequence number, next chunk, payload bytes in this chunk, four zero bytes.
const SNAP_CHUNK_HEADER: usize = 24;
/// No next chunk.
const LAST: u32 = u32::MAX;
/// Payload bytes before the pieces: magic, close record, log fingerprint, piece and
/// allocation counts.
const PAYLOAD_HEADER: usize = 8 + 32 + 8 + 16;
/// Bytes of a piece and of an allocation in the fixed format (`LHSNAP01`).
const PIECE_BYTES: usize = 24;
const ALLOCATION_BYTES: usize = 16;

/// What a clean close leaves for the next open: the state replay would rebuild, kept
/// as its encoded payload: a header (magic, the clean-close record, the log's
/// fingerprint, the piece and allocation counts; little-endian u64s), then every mapped
/// piece sorted by home, then every live allocation sorted by home, as LEB128 varints
/// of differences ([`Encoder`]): a piece is (home less the previous piece's end, zigzag;
/// length; log address less the previous piece's log end, zigzag), an allocation (home
/// less the previous allocation's end, zigzag; size). Pieces and allocations lie close
/// together, so each takes 3-8 bytes rather than the 24 and 16 of fixed words (the
/// `LHSNAP01` format, still read): an allocation checkpoint, rewritten often, holding
/// one per live allocation, is then a few percent of the data it describes rather than
/// a tenth of it. The shape is checked once, when a payload is read; the pieces and
/// allocations are decoded again as they are used.
///
/// A payload of the `LHSNAP04` format (and of `LHSNAP03`, whose records lack the entry
/// and data byte counts) goes on with a *chunk table*: a record of every
/// chunk in a log (its index, header and book, in index order; [`ChunkRecord`]), so
/// that an open need not read the log to know the logs' chains, their tails and the
/// chunk books, and can check each chunk later ([`super::chunk_checks`]); then the
/// table's record count and byte length (little-endian u64s).
#[derive(Debug)]
pub(crate) struct Snapshot {
    payload: Vec<u8>,
    /// Where the allocations start in the payload.
    allocations_at: usize,
    /// The encoder's state for the next piece or allocation pushed; `None` for a
    /// snapshot read back, which is only read (its reading skips the values).
    next: Option<Encoder>,
    /// Where the chunk table starts, with its record count, when there is one.
    table: Option<(usize, u64)>,
    /// Its records hold their chunk's entry and data byte counts (`LHSNAP04`).
    table_counts: bool,
}

/// Two snapshots are equal when their payloads are (the rest follows from it).
impl PartialEq for Snapshot {
    fn eq(&self, other: &Snapshot) -> bool {
        self.payload == other.payload
    }
}

impl Eq for Snapshot {}

/// The running state of the difference encoding: the end of the last piece (home and
/// log) or allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Encoder {
    home_end: u64,
    log_end: u64,
}

impl Encoder {
    fn push_piece(&mut self, out: &mut Vec<u8>, p: Piece) {
        push_var(out, p.home.wrapping_sub(self.home_end) as i64);
        push_var(out, p.len);
        push_var(out, p.log.wrapping_sub(self.log_end) as i64);
        self.home_end = p.home.wrapping_add(p.len);
        self.log_end = p.log.wrapping_add(p.len);
    }

    fn push_allocation(&mut self, out: &mut Vec<u8>, home: u64, size: u64) {
        push_var(out, home.wrapping_sub(self.home_end) as i64);
        push_var(out, size);
        self.home_end = home.wrapping_add(size);
    }

    /// The piece at `*at` in `b` (moving `at` past it); `None` when the bytes end or
    /// are not varints.
    fn next_piece(&mut self, b: &[u8], at: &mut usize) -> Option<Piece> {
        let home = self.home_end.wrapping_add(read_i64(b, at)? as u64);
        let len = read_u64(b, at)?;
        let log = self.log_end.wrapping_add(read_i64(b, at)? as u64);
        self.home_end = home.wrapping_add(len);
        self.log_end = log.wrapping_add(len);
        Some(Piece { home, len, log })
    }

    /// The allocation at `*at` in `b`, as [`next_piece`](Self::next_piece).
    fn next_allocation(&mut self, b: &[u8], at: &mut usize) -> Option<(u64, u64)> {
        let home = self.home_end.wrapping_add(read_i64(b, at)? as u64);
        let size = read_u64(b, at)?;
        self.home_end = home.wrapping_add(size);
        Some((home, size))
    }
}

/// Appends chunk record `r` (after one of index `prev_index`) to `out`: the index less
/// the previous one's, the kind with the zeroed flag (bit 7), owner, generation,
/// previous chunk plus one (0: none), sequence number, blocks, largest version, end
/// offset, entries and data bytes as varints, then the fingerprint share as a
/// little-endian u64.
fn push_chunk_record(out: &mut Vec<u8>, prev_index: u32, r: &ChunkRecord) {
    let h = &r.header;
    push_var(out, r.index.wrapping_sub(prev_index));
    push_var(out, h.kind as u8 | (h.zeroed as u8) << 7);
    push_var(out, h.owner);
    push_var(out, h.generation);
    push_var(out, h.prev.map_or(0, |p| p as u64 + 1));
    push_var(out, h.seq);
    push_var(out, r.book.blocks);
    push_var(out, r.book.max_version);
    push_var(out, r.book.end);
    push_var(out, r.book.entries);
    push_var(out, r.book.data);
    out.extend_from_slice(&r.book.digest.to_le_bytes());
}

/// The chunk record at `*at` in `b` (after one of index `prev_index`), moving `at`
/// past it; `None` when it does not decode. `counts`: the record holds the entry and
/// data byte counts (`LHSNAP04`; else they are 0).
fn read_chunk_record(
    b: &[u8],
    at: &mut usize,
    prev_index: u32,
    counts: bool,
) -> Option<ChunkRecord> {
    let index = prev_index.wrapping_add(read_var::<u32>(b, at)?);
    let kind_byte = read_var::<u8>(b, at)?;
    let owner = read_var::<u32>(b, at)?;
    let generation = read_var::<u64>(b, at)?;
    let prev = match read_var::<u64>(b, at)? {
        0 => None,
        p => Some(u32::try_from(p - 1).ok()?),
    };
    let seq = read_var::<u32>(b, at)?;
    let blocks = read_var::<u64>(b, at)?;
    let max_version = read_var::<u64>(b, at)?;
    let end = read_var::<u32>(b, at)?;
    let (entries, data) = if counts {
        (read_var::<u64>(b, at)?, read_var::<u64>(b, at)?)
    } else {
        (0, 0)
    };
    let digest = u64_at(b.get(*at..*at + 8)?, 0);
    *at += 8;
    Some(ChunkRecord {
        index,
        header: ChunkHeader {
            kind: LogKind::from_byte(kind_byte & 0x7f)?,
            zeroed: kind_byte & 0x80 != 0,
            owner,
            generation,
            prev,
            seq,
        },
        book: ChunkBook {
            blocks,
            max_version,
            digest,
            end,
            entries,
            data,
        },
    })
}

/// Appends `v` as a LEB128 varint (zigzag-encoded when signed).
fn push_var<V: VarInt>(out: &mut Vec<u8>, v: V) {
    let mut buf = [0u8; 10];
    let n = v.encode_var(&mut buf);
    out.extend_from_slice(&buf[..n]);
}

/// The varint at `*at` in `b` (moving `at` past it); `None` when the bytes end first.
fn read_var<V: VarInt>(b: &[u8], at: &mut usize) -> Option<V> {
    let (v, n) = V::decode_var(b.get(*at..)?)?;
    *at += n;
    Some(v)
}

/// [`read_var`] of a u64, with the one- and two-byte varints that most of a snapshot's
/// deltas and lengths are decoded inline: a clean open decodes millions of them, and
/// the general decoder costs several times as much per value.
#[inline]
fn read_u64(b: &[u8], at: &mut usize) -> Option<u64> {
    match b.get(*at..)? {
        [x, ..] if *x < 0x80 => {
            *at += 1;
            Some(*x as u64)
        }
        [x, y, ..] if *y < 0x80 => {
            *at += 2;
            Some((*x & 0x7f) as u64 | (*y as u64) << 7)
        }
        _ => read_var::<u64>(b, at),
    }
}

/// [`read_u64`] of a zigzag-encoded i64 (as [`VarInt`] encodes signed values).
#[inline]
fn read_i64(b: &[u8], at: &mut usize) -> Option<i64> {
    let u = read_u64(b, at)?;
    Some((u >> 1) as i64 ^ -((u & 1) as i64))
}

/// Moves `at` past `n` varints of `b` without decoding them (a clean open reads
/// millions), taking as a varint what [`VarInt`]'s u64 decoder takes: up to nine bytes
/// with the top bit set, then one without it (or, as the tenth, one below 2). `None`
/// when one does not decode (`at` is then left where it was).
fn skip_u64s(b: &[u8], at: &mut usize, n: u64) -> Option<()> {
    const TOP_BITS: u64 = 0x8080_8080_8080_8080;
    let (mut left, mut continued, mut i) = (n, 0, *at);
    while left > 0 {
        // Eight bytes at once while they hold fewer ends (bytes without the top bit)
        // than are left, and the varint running into them ends in time to need no
        // check of its tenth byte (no other varint can reach nine bytes inside them).
        if let Some(word) = b.get(i..i + 8) {
            let w = u64::from_le_bytes(word.try_into().expect("eight bytes"));
            let ends = !w & TOP_BITS;
            let count = ends.count_ones() as u64;
            if ends != 0 && continued + ends.trailing_zeros() / 8 <= 8 && count < left {
                left -= count;
                continued = ends.leading_zeros() / 8;
                i += 8;
                continue;
            }
        }
        let byte = *b.get(i)?;
        i += 1;
        if continued == 9 && byte >= 2 {
            return None;
        }
        if continued == 9 || byte < 0x80 {
            left -= 1;
            continued = 0;
        } else {
            continued += 1;
        }
    }
    *at = i;
    Some(())
}

/// Payload bytes one snapshot chunk holds.
fn payload_per_chunk(geometry: &ChunkGeometry) -> usize {
    geometry.size as usize - CHUNK_HEADER - SNAP_CHUNK_HEADER
}

/// Why nothing is pushed to a snapshot read back (a program error, not a file's).
const READ_BACK: &str = "a snapshot read back is only read, never added to";

/// Where the payload header keeps the piece and allocation counts.
const PIECES_AT: usize = 48;
const ALLOCATIONS_AT: usize = 56;

impl Snapshot {
    /// An empty snapshot of the log that `record` and `log_digest` describe; pieces and
    /// then allocations are added with [`push_piece`](Self::push_piece) and
    /// [`push_allocation`](Self::push_allocation).
    pub(crate) fn new(record: CloseRecord, log_digest: u64) -> Snapshot {
        let mut payload = Vec::with_capacity(PAYLOAD_HEADER);
        payload.extend_from_slice(&PAYLOAD_MAGIC);
        for v in record.words() {
            payload.extend_from_slice(&v.to_le_bytes());
        }
        payload.extend_from_slice(&log_digest.to_le_bytes());
        payload.extend_from_slice(&[0u8; 16]);
        Snapshot {
            allocations_at: payload.len(),
            payload,
            next: Some(Encoder::default()),
            table: None,
            table_counts: false,
        }
    }

    /// Adds the chunk table: `records`, one per chunk in a log, in index order (after
    /// every piece and allocation; once).
    pub(crate) fn push_chunk_table(&mut self, records: &[ChunkRecord]) {
        debug_assert!(self.table.is_none(), "one chunk table");
        debug_assert!(records.windows(2).all(|w| w[0].index < w[1].index));
        let start = self.payload.len();
        let mut prev = 0;
        for r in records {
            push_chunk_record(&mut self.payload, prev, r);
            prev = r.index;
        }
        let len = (self.payload.len() - start) as u64;
        self.payload
            .extend_from_slice(&(records.len() as u64).to_le_bytes());
        self.payload.extend_from_slice(&len.to_le_bytes());
        self.payload[..8].copy_from_slice(&PAYLOAD_MAGIC_TABLE);
        self.table = Some((start, records.len() as u64));
        self.table_counts = true;
    }

    /// The chunk table's records, in index order, when the snapshot has one.
    pub(crate) fn chunk_records(&self) -> Option<Vec<ChunkRecord>> {
        let (start, count) = self.table?;
        let mut at = start;
        let mut prev = 0;
        let mut out = Vec::with_capacity(count as usize);
        for _ in 0..count {
            // The shape was checked when the payload was made or read.
            let r = read_chunk_record(&self.payload, &mut at, prev, self.table_counts)?;
            prev = r.index;
            out.push(r);
        }
        Some(out)
    }

    fn bump_count(&mut self, at: usize) {
        let n = u64_at(&self.payload, at) + 1;
        self.payload[at..at + 8].copy_from_slice(&n.to_le_bytes());
    }

    /// Adds a mapped piece (pieces come in home order, before any allocation).
    pub(crate) fn push_piece(&mut self, p: Piece) {
        debug_assert_eq!(self.allocation_count(), 0, "pieces go before allocations");
        let next = self.next.as_mut().expect(READ_BACK);
        next.push_piece(&mut self.payload, p);
        self.allocations_at = self.payload.len();
        self.bump_count(PIECES_AT);
    }

    /// Adds a live allocation (in home order).
    pub(crate) fn push_allocation(&mut self, home: u64, size: u64) {
        let first = self.allocation_count() == 0;
        let next = self.next.as_mut().expect(READ_BACK);
        if first {
            *next = Encoder::default();
        }
        next.push_allocation(&mut self.payload, home, size);
        self.bump_count(ALLOCATIONS_AT);
    }

    /// The clean-close record it was written with.
    pub(crate) fn record(&self) -> CloseRecord {
        CloseRecord::from_words([8, 16, 24, 32].map(|at| u64_at(&self.payload, at)))
    }

    /// The fingerprint of the log it describes
    /// ([`block_digest`](super::layout::block_digest)).
    pub(crate) fn log_digest(&self) -> u64 {
        u64_at(&self.payload, 40)
    }

    fn piece_count(&self) -> usize {
        u64_at(&self.payload, PIECES_AT) as usize
    }

    fn allocation_count(&self) -> usize {
        u64_at(&self.payload, ALLOCATIONS_AT) as usize
    }

    /// Every mapped piece, in the order written (home order).
    pub(crate) fn pieces(&self) -> impl Iterator<Item = Piece> + Clone + '_ {
        let (mut at, mut state) = (PAYLOAD_HEADER, Encoder::default());
        let b = &self.payload[..self.allocations_at];
        // The shape was checked when the payload was made or read: every piece decodes.
        (0..self.piece_count()).map_while(move |_| state.next_piece(b, &mut at))
    }

    /// Every live allocation (home, size), in the order written (home order).
    pub(crate) fn allocations(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (mut at, mut state) = (self.allocations_at, Encoder::default());
        let b = &self.payload[..];
        (0..self.allocation_count()).map_while(move |_| state.next_allocation(b, &mut at))
    }

    /// Takes a payload whose checksum matched, checking its shape (not its contents):
    /// the header, and that its counts of pieces and allocations decode to exactly its
    /// bytes. A payload of the fixed format is converted.
    fn decode(payload: Vec<u8>) -> Result<Snapshot, String> {
        let b = &payload;
        if b.len() >= PAYLOAD_HEADER && b[..8] == PAYLOAD_MAGIC_FIXED {
            return Snapshot::decode_fixed(payload);
        }
        let counts = b.get(..8) == Some(&PAYLOAD_MAGIC_TABLE[..]);
        let table = match b.get(..8) {
            Some(m) if b.len() >= PAYLOAD_HEADER && m == PAYLOAD_MAGIC => None,
            Some(m)
                if b.len() >= PAYLOAD_HEADER + TABLE_TRAILER
                    && (m == PAYLOAD_MAGIC_TABLE || m == PAYLOAD_MAGIC_TABLE_03) =>
            {
                let trailer = b.len() - TABLE_TRAILER;
                let (count, len) = (u64_at(b, trailer), u64_at(b, trailer + 8));
                // A record takes 17 bytes at least.
                if len > (trailer - PAYLOAD_HEADER) as u64 || count.saturating_mul(17) > len {
                    return Err("the snapshot's chunk table does not fit its payload".into());
                }
                let start = trailer - len as usize;
                let (mut at, mut prev) = (start, 0);
                for i in 0..count {
                    let r = read_chunk_record(b, &mut at, prev, counts)
                        .filter(|r| i == 0 || r.index > prev)
                        .ok_or_else(|| format!("snapshot chunk record {i} does not decode"))?;
                    prev = r.index;
                }
                if at != trailer {
                    return Err("the snapshot's chunk table holds more than its records".into());
                }
                Some((start, count))
            }
            _ => return Err("the snapshot payload has no valid header".into()),
        };
        let body_end = table.map_or(b.len(), |(start, _)| start);
        let b = &b[..body_end];
        let (pieces, allocations) = (u64_at(b, PIECES_AT), u64_at(b, ALLOCATIONS_AT));
        // A piece takes three bytes at least and an allocation two: counts the bytes
        // cannot hold are damage (and are not looped over).
        if pieces.saturating_add(allocations) > b.len() as u64 {
            return Err("the snapshot payload's counts exceed its bytes".into());
        }
        // Three varints a piece, two an allocation: each one that does not decode is
        // found here, so the readers of the values need not look again.
        let mut at = PAYLOAD_HEADER;
        skip_u64s(b, &mut at, 3 * pieces)
            .ok_or_else(|| "a snapshot piece does not decode".to_string())?;
        let allocations_at = at;
        skip_u64s(b, &mut at, 2 * allocations)
            .ok_or_else(|| "a snapshot allocation does not decode".to_string())?;
        if at != b.len() {
            return Err(format!(
                "the snapshot payload holds {} bytes, not the {at} its counts need",
                b.len()
            ));
        }
        Ok(Snapshot {
            payload,
            allocations_at,
            next: None,
            table,
            table_counts: counts,
        })
    }

    /// [`decode`](Self::decode) of a payload of the fixed format (`LHSNAP01`).
    fn decode_fixed(b: Vec<u8>) -> Result<Snapshot, String> {
        let (pieces, allocations) = (u64_at(&b, PIECES_AT), u64_at(&b, ALLOCATIONS_AT));
        let expected = (pieces as u128) * PIECE_BYTES as u128
            + (allocations as u128) * ALLOCATION_BYTES as u128
            + PAYLOAD_HEADER as u128;
        if expected != b.len() as u128 {
            return Err(format!(
                "the snapshot payload holds {} bytes, not the {expected} its counts need",
                b.len()
            ));
        }
        let mut converted = Snapshot::new(
            CloseRecord::from_words([8, 16, 24, 32].map(|at| u64_at(&b, at))),
            u64_at(&b, 40),
        );
        let words = &b[PAYLOAD_HEADER..];
        let (piece_bytes, allocation_bytes) = words.split_at(pieces as usize * PIECE_BYTES);
        for p in piece_bytes.chunks_exact(PIECE_BYTES) {
            converted.push_piece(Piece {
                home: u64_at(p, 0),
                len: u64_at(p, 8),
                log: u64_at(p, 16),
            });
        }
        for a in allocation_bytes.chunks_exact(ALLOCATION_BYTES) {
            converted.push_allocation(u64_at(a, 0), u64_at(a, 8));
        }
        Ok(converted)
    }

    /// Chunks the snapshot takes when written.
    pub(crate) fn chunks_needed(&self, geometry: &ChunkGeometry) -> usize {
        self.payload
            .len()
            .div_ceil(payload_per_chunk(geometry))
            .max(1)
    }

    /// Writes the snapshot into `free` chunks (in that order; none of them in a log) and
    /// makes it durable. Returns its locator, or `None` (nothing written) when the free
    /// chunks are too few to hold it.
    pub(crate) fn write(
        &self,
        media: &Media,
        geometry: &ChunkGeometry,
        free: &[u32],
    ) -> Option<SnapshotLocator> {
        let payload = &self.payload;
        let per_chunk = payload_per_chunk(geometry);
        let needed = payload.len().div_ceil(per_chunk).max(1);
        let chunks = free.get(..needed)?;
        for (i, (part, &c)) in payload
            .chunks(per_chunk)
            .chain(payload.is_empty().then_some(&[][..]))
            .zip(chunks)
            .enumerate()
        {
            let next = chunks.get(i + 1).copied().unwrap_or(LAST);
            let mut head = [0u8; SNAP_CHUNK_HEADER];
            head[..8].copy_from_slice(&CHUNK_MAGIC);
            head[8..12].copy_from_slice(&(i as u32).to_le_bytes());
            head[12..16].copy_from_slice(&next.to_le_bytes());
            head[16..20].copy_from_slice(&(part.len() as u32).to_le_bytes());
            let at = geometry.offset(c) as usize + CHUNK_HEADER;
            media.write(at, &head);
            media.write(at + SNAP_CHUNK_HEADER, part);
            media.flush(at, SNAP_CHUNK_HEADER + part.len());
        }
        media.fence();
        Some(SnapshotLocator {
            first: chunks[0],
            chunks: needed as u32,
            bytes: payload.len() as u64,
            crc: crc32c::crc32c(payload),
        })
    }

    /// Reads the snapshot `locator` points to, checking every chunk header and the
    /// payload's checksum. The error says why it cannot be used.
    pub(crate) fn read(
        media: &Media,
        geometry: &ChunkGeometry,
        locator: &SnapshotLocator,
    ) -> Result<Snapshot, String> {
        Snapshot::read_with_chunks(media, geometry, locator).map(|(snapshot, _)| snapshot)
    }

    /// [`read`](Self::read), with the chunks the snapshot is written in, in order.
    pub(crate) fn read_with_chunks(
        media: &Media,
        geometry: &ChunkGeometry,
        locator: &SnapshotLocator,
    ) -> Result<(Snapshot, Vec<u32>), String> {
        let per_chunk = payload_per_chunk(geometry) as u64;
        if locator.chunks as u64 != locator.bytes.div_ceil(per_chunk).max(1)
            || locator.chunks > geometry.count
        {
            return Err(format!(
                "the snapshot locator's {} chunks cannot hold {} bytes",
                locator.chunks, locator.bytes
            ));
        }
        let mut payload = Vec::with_capacity(locator.bytes as usize);
        let mut read_from = Vec::with_capacity(locator.chunks as usize);
        let mut chunk = locator.first;
        let mut head = [0u8; SNAP_CHUNK_HEADER];
        for i in 0..locator.chunks {
            if chunk >= geometry.count {
                return Err(format!("snapshot chunk {i} is outside the pool"));
            }
            let at = geometry.offset(chunk) as usize + CHUNK_HEADER;
            media.read(at, &mut head);
            let (seq, next, len) = (u32_at(&head, 8), u32_at(&head, 12), u32_at(&head, 16));
            let expected_len = (locator.bytes - payload.len() as u64).min(per_chunk);
            let last = i + 1 == locator.chunks;
            if head[..8] != CHUNK_MAGIC
                || head[20..] != [0; 4]
                || seq != i
                || len as u64 != expected_len
                || (next == LAST) != last
            {
                return Err(format!(
                    "the header of snapshot chunk {i} (chunk {chunk}) is damaged"
                ));
            }
            let start = payload.len();
            payload.resize(start + len as usize, 0);
            media.read(at + SNAP_CHUNK_HEADER, &mut payload[start..]);
            read_from.push(chunk);
            chunk = next;
        }
        if crc32c::crc32c(&payload) != locator.crc {
            return Err("the snapshot's checksum does not match".into());
        }
        Ok((Snapshot::decode(payload)?, read_from))
    }

    /// Checks that the pieces can be loaded into an empty mapping: sorted by home,
    /// disjoint, inside the home space (as [`Mapping::load_sorted`] also checks), and
    /// each inside the committed run of blocks of a chunk in a log (`run_end(chunk)`:
    /// pool offset where that run ends, `None` for a chunk in no log), which only the
    /// log can tell. `each` is shown every piece that passed (so that a caller needs no
    /// pass of its own over them).
    ///
    /// [`Mapping::load_sorted`]: super::mapping::Mapping::load_sorted
    pub(crate) fn check_pieces(
        &self,
        geometry: &ChunkGeometry,
        run_end: impl Fn(u32) -> Option<u64>,
        mut each: impl FnMut(&Piece),
    ) -> Result<(), String> {
        let mut home_end = 0;
        for p in self.pieces() {
            let bad = |why: &str| Err(format!("snapshot piece {:#x}+{}: {why}", p.home, p.len));
            if p.len == 0 || p.home < home_end {
                return bad("empty, unsorted or overlapping");
            }
            home_end = match p.home.checked_add(p.len) {
                Some(end) if end <= HOME_LIMIT => end,
                _ => return bad("outside the home space"),
            };
            let data_end = geometry.offset(geometry.count);
            if p.log < geometry.start || p.log >= data_end {
                return bad("maps outside the log");
            }
            let c = geometry.chunk_of(p.log);
            let chunk_start = geometry.offset(c);
            let inside = run_end(c).is_some_and(|end| {
                p.log >= chunk_start + CHUNK_HEADER as u64
                    && p.log.checked_add(p.len).is_some_and(|e| e <= end)
            });
            if !inside {
                return bad("maps outside the committed blocks of a log chunk");
            }
            each(&p);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{MediaConfig, SimConfig};

    #[test]
    fn the_inline_varint_reads_agree_with_the_general_decoder() {
        let mut values: Vec<u64> = (0..20_000).collect();
        values.extend((0..64).map(|s| 1u64 << s));
        values.extend((1..64).map(|s| (1u64 << s) - 1));
        values.push(u64::MAX);
        for v in values {
            for signed in [v as i64, (v as i64).wrapping_neg(), v as i64 >> 1] {
                let mut b = Vec::new();
                push_var(&mut b, v);
                push_var(&mut b, signed);
                let (mut fast, mut general) = (0, 0);
                assert_eq!(read_u64(&b, &mut fast), read_var::<u64>(&b, &mut general));
                assert_eq!(read_i64(&b, &mut fast), read_var::<i64>(&b, &mut general));
                assert_eq!((fast, general), (b.len(), b.len()));
            }
        }
        // Bytes that end in the middle of a varint, or are none, decode as nothing.
        for b in [&[][..], &[0x80], &[0xff, 0xff]] {
            assert_eq!(read_u64(b, &mut 0), read_var::<u64>(b, &mut 0));
            assert_eq!(read_u64(b, &mut 0), None);
        }
        // A varint that does not end in the first two bytes: the general decoder's.
        let b = [0x80, 0x80, 0x01];
        assert_eq!(read_u64(&b, &mut 0), Some(1 << 14));
    }

    #[test]
    fn skipping_varints_takes_exactly_what_decoding_takes() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            // Random bytes, biased towards long runs of continuation bytes.
            let bytes: Vec<u8> = (0..40)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    match rng % 4 {
                        0 => (rng >> 8) as u8 & 0x7f,
                        1 => 1,
                        _ => 0x80 | (rng >> 8) as u8,
                    }
                })
                .collect();
            for n in 0..12 {
                let mut decoded = Some(0);
                for _ in 0..n {
                    decoded =
                        decoded.and_then(|mut at| read_var::<u64>(&bytes, &mut at).map(|_| at));
                }
                let mut at = 0;
                let skipped = skip_u64s(&bytes, &mut at, n).map(|()| at);
                assert_eq!(skipped, decoded, "{bytes:x?}, {n} varints");
            }
        }
    }

    const CHUNK: u64 = 4096;

    fn setup() -> (Media, ChunkGeometry) {
        let media = Media::sim(
            64 * CHUNK as usize,
            &MediaConfig::default(),
            SimConfig::default(),
        )
        .unwrap();
        (media, ChunkGeometry::new(0, 64 * CHUNK, CHUNK))
    }

    fn sample(pieces: u64) -> Snapshot {
        let record = CloseRecord {
            max_version: 77,
            transactions: 5,
            blocks: 9,
            chunks_in_use: 2,
        };
        let mut s = Snapshot::new(record, 0x1234_5678_9abc_def0);
        for i in 0..pieces {
            s.push_piece(Piece {
                home: (1 << 20) + i * 64,
                len: 40,
                log: 64 + i * 48,
            });
        }
        for i in 0..pieces / 2 {
            s.push_allocation((1 << 20) + i * 128, 100);
        }
        assert_eq!(s.record(), record);
        assert_eq!(s.log_digest(), 0x1234_5678_9abc_def0);
        assert_eq!(s.pieces().count() as u64, pieces);
        assert_eq!(s.allocations().nth(1), Some(((1 << 20) + 128, 100)));
        s
    }

    #[test]
    fn a_snapshot_round_trips_across_chunks_in_any_order() {
        let (media, geometry) = setup();
        let snap = sample(5000);
        let free = [40, 3, 17, 9, 60, 61, 62];
        let locator = snap.write(&media, &geometry, &free).unwrap();
        assert!(locator.chunks > 3, "spans several chunks");
        assert_eq!(Snapshot::read(&media, &geometry, &locator).unwrap(), snap);
        // The chunk header areas stay untouched (zero), so the chunks still look free.
        for &c in &free {
            let mut head = [0u8; CHUNK_HEADER];
            media.read(geometry.offset(c) as usize, &mut head);
            assert_eq!(head, [0u8; CHUNK_HEADER]);
        }
        // An empty snapshot takes one chunk.
        let empty = Snapshot::new(CloseRecord::default(), 0);
        let locator = empty.write(&media, &geometry, &free).unwrap();
        assert_eq!(locator.chunks, 1);
        assert_eq!(Snapshot::read(&media, &geometry, &locator).unwrap(), empty);
    }

    /// The payload of `s` in the fixed format (`LHSNAP01`).
    fn fixed_payload(s: &Snapshot) -> Vec<u8> {
        let mut b = s.payload[..PAYLOAD_HEADER].to_vec();
        b[..8].copy_from_slice(&PAYLOAD_MAGIC_FIXED);
        for p in s.pieces() {
            for v in [p.home, p.len, p.log] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        for (home, size) in s.allocations() {
            b.extend_from_slice(&home.to_le_bytes());
            b.extend_from_slice(&size.to_le_bytes());
        }
        b
    }

    #[test]
    fn the_varint_payload_is_compact_and_the_fixed_format_is_still_read() {
        let s = sample(1000);
        let fixed = fixed_payload(&s);
        assert!(
            s.payload.len() * 4 < fixed.len(),
            "{} bytes against {} fixed",
            s.payload.len(),
            fixed.len()
        );
        assert_eq!(Snapshot::decode(fixed).unwrap(), s);
        assert_eq!(Snapshot::decode(s.payload.clone()).unwrap(), s);
        // Far apart, backwards and at the ends of the address space: differences wrap.
        let mut odd = Snapshot::new(CloseRecord::default(), 0);
        for (home, len, log) in [(8, 1, u64::MAX - 9), (u64::MAX - 100, 50, 16)] {
            odd.push_piece(Piece { home, len, log });
        }
        odd.push_allocation(u64::MAX - 8, 8);
        odd.push_allocation(0, 1);
        let back = Snapshot::decode(odd.payload.clone()).unwrap();
        assert_eq!(
            back.pieces().collect::<Vec<_>>(),
            odd.pieces().collect::<Vec<_>>()
        );
        assert_eq!(
            back.allocations().collect::<Vec<_>>(),
            vec![(u64::MAX - 8, 8), (0, 1)]
        );
    }

    #[test]
    fn counts_that_do_not_match_the_payload_are_refused() {
        let s = sample(100);
        let with_counts = |pieces: u64, allocations: u64, cut: usize| {
            let mut b = s.payload.clone();
            b[PIECES_AT..PIECES_AT + 8].copy_from_slice(&pieces.to_le_bytes());
            b[ALLOCATIONS_AT..ALLOCATIONS_AT + 8].copy_from_slice(&allocations.to_le_bytes());
            b.truncate(b.len() - cut);
            Snapshot::decode(b)
        };
        assert!(with_counts(100, 50, 0).is_ok());
        assert!(with_counts(100, 49, 0).is_err(), "bytes left over");
        assert!(with_counts(101, 50, 0).is_err(), "one piece too many");
        assert!(with_counts(100, 50, 1).is_err(), "cut short");
        assert!(
            with_counts(u64::MAX, u64::MAX, 0).is_err(),
            "counts past the bytes"
        );
        // A varint that never ends.
        let mut b = s.payload[..PAYLOAD_HEADER].to_vec();
        b[PIECES_AT..PIECES_AT + 8].copy_from_slice(&1u64.to_le_bytes());
        b[ALLOCATIONS_AT..ALLOCATIONS_AT + 8].copy_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&[0xff; 12]);
        assert!(Snapshot::decode(b).is_err());
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "pieces go before allocations")]
    fn a_piece_after_an_allocation_is_a_bug() {
        let mut s = Snapshot::new(CloseRecord::default(), 0);
        s.push_allocation(1 << 20, 8);
        s.push_piece(Piece {
            home: 1 << 20,
            len: 8,
            log: 64,
        });
    }

    #[test]
    fn too_few_free_chunks_write_nothing() {
        let (media, geometry) = setup();
        let before = media.counters();
        assert!(sample(5000).write(&media, &geometry, &[1, 2]).is_none());
        assert_eq!(media.counters(), before);
    }

    #[test]
    fn every_flipped_byte_of_a_snapshot_is_caught() {
        let (media, geometry) = setup();
        let snap = sample(100);
        let free = [5, 6, 7];
        let locator = snap.write(&media, &geometry, &free).unwrap();
        let used = locator.bytes as usize + SNAP_CHUNK_HEADER;
        for &c in &free[..locator.chunks as usize] {
            let start = geometry.offset(c) as usize + CHUNK_HEADER;
            for at in start..(start + used).min(geometry.offset(c + 1) as usize) {
                let mut b = [0u8];
                media.read(at, &mut b);
                media.write(at, &[b[0] ^ 0x10]);
                assert!(
                    Snapshot::read(&media, &geometry, &locator).is_err(),
                    "a flip at {at} went unnoticed"
                );
                media.write(at, &b);
            }
        }
        // A locator that does not fit its chunks, or points outside the pool.
        let mut bad = locator;
        bad.chunks += 1;
        assert!(Snapshot::read(&media, &geometry, &bad).is_err());
        let mut bad = locator;
        bad.first = geometry.count + 3;
        assert!(Snapshot::read(&media, &geometry, &bad).is_err());
        let mut bad = locator;
        bad.bytes = u64::MAX;
        assert!(Snapshot::read(&media, &geometry, &bad).is_err());
    }

    /// A cleanly closed pool whose root (a `u64`) holds 41: its config, root and image.
    fn closed_pool_holding_41() -> (crate::Config, crate::PPtr<u64>, Vec<u8>) {
        let config = crate::Config::default().size(1 << 20).chunk_size(4096);
        let pool = crate::Pool::create_sim(&config, SimConfig::default()).unwrap();
        let root: crate::PPtr<u64> = pool.root().unwrap();
        pool.transaction(|tx| tx.write(root, &41)).unwrap();
        let media = pool.media().clone();
        pool.close().unwrap();
        (
            config,
            root,
            media.crash_simulator().unwrap().persisted_image(),
        )
    }

    /// A sound snapshot of another close (same log geometry, another record) is not
    /// loaded: the open replays the log and says why.
    #[test]
    fn a_snapshot_of_another_close_is_not_loaded() {
        use crate::engine::log::superblock::LogSuperblock;
        use crate::{Pool, SnapshotUse};
        let (config, root, image) = closed_pool_holding_41();

        let file = crate::PoolFile::open_image(image, &config.media, SimConfig::default()).unwrap();
        let geometry = ChunkGeometry::of(file.header());
        let superblock = LogSuperblock {
            at: file.layout().superblock.start as usize,
        };
        let media = file.media();
        let at = superblock.read_snapshot_locator(media).unwrap().unwrap();
        let read = Snapshot::read(media, &geometry, &at).unwrap();
        let mut record = read.record();
        record.transactions += 1;
        let mut snapshot = Snapshot::new(record, read.log_digest());
        read.pieces().for_each(|p| snapshot.push_piece(p));
        read.allocations()
            .for_each(|(h, s)| snapshot.push_allocation(h, s));
        let free: Vec<u32> = (geometry.count - 8..geometry.count).collect();
        let at = snapshot.write(media, &geometry, &free).unwrap();
        superblock.write_snapshot_locator(media, &at);
        let image = media.crash_simulator().unwrap().persisted_image();
        drop(file);

        let pool = Pool::open_image(image, &config, SimConfig::default()).unwrap();
        assert_eq!(
            pool.stats().log().cloned().unwrap().recovery.snapshot,
            SnapshotUse::Rejected("the snapshot was written at another close".into())
        );
        assert_eq!(pool.read(|tx| tx.read(root)).unwrap(), 41);
    }

    /// A block rewritten after the close with a checksum of its own (the log still
    /// reads as sound) is noticed by the log's fingerprint, which the sound snapshot
    /// of that close recorded: the log was changed while closed, which is damage. The
    /// open refuses it (when it reads that chunk) or the read that meets it fails (when
    /// the chunk is checked after the open); the changed value is never returned.
    #[test]
    fn a_log_changed_behind_the_snapshot_is_noticed() {
        use crate::engine::log::ROOT_HOME;
        use crate::engine::log::layout::{
            BlockScan, HeaderState, PREAMBLE, block_crc, decode_block,
        };
        use crate::{Pool, SnapshotUse};
        let (config, root, mut image) = closed_pool_holding_41();

        let file = crate::PoolFile::open_image(image.clone(), &config.media, SimConfig::default())
            .unwrap();
        let geometry = ChunkGeometry::of(file.header());
        drop(file);
        let mut changed = false;
        for c in 0..geometry.count {
            let at = geometry.offset(c) as usize;
            let chunk = &mut image[at..at + geometry.size as usize];
            let head: [u8; CHUNK_HEADER] = chunk[..CHUNK_HEADER].try_into().unwrap();
            let HeaderState::Valid(header) = HeaderState::of(&head) else {
                continue;
            };
            let mut decoded = Vec::new();
            let BlockScan::Block(b) = decode_block(chunk, c, header.generation, 64, &mut decoded)
            else {
                continue;
            };
            if let Some(e) = decoded.iter().find(|e| e.home == ROOT_HOME && e.size == 8) {
                chunk[e.data as usize] ^= 1;
                let start = b.offset as usize;
                let (pre, body) = chunk[start..b.end as usize].split_at_mut(PREAMBLE);
                let len = u32_at(pre, 16) as usize;
                let crc = block_crc(c, header.generation, &pre[..20], &body[..len]);
                pre[20..24].copy_from_slice(&crc.to_le_bytes());
                changed = true;
                break;
            }
        }
        assert!(changed, "the root's update block was found");
        match Pool::open_image(image.clone(), &config, SimConfig::default()) {
            Err(crate::Error::Corrupt { reason, .. }) => {
                assert!(reason.contains("changed since"), "{reason}")
            }
            Err(e) => panic!("refused with {e}"),
            Ok(pool) => {
                assert_eq!(
                    pool.stats().log().cloned().unwrap().recovery.snapshot,
                    SnapshotUse::Loaded
                );
                assert!(matches!(
                    pool.read(|tx| tx.read(root)),
                    Err(crate::Error::Corrupt { .. })
                ));
            }
        }
        // `logheap check` reads the whole log, and finds it too.
        let report = crate::check::check_image(image).unwrap();
        assert!(!report.is_sound());
    }

    #[test]
    fn pieces_are_checked_against_the_log() {
        let geometry = ChunkGeometry::new(0, 64 * CHUNK, CHUNK);
        // Chunk 0 is in a log with committed blocks up to byte 3000 of it.
        let run_end = |c: u32| (c == 0).then_some(3000);
        let ok = |pieces: Vec<Piece>| {
            let mut s = Snapshot::new(CloseRecord::default(), 0);
            pieces.into_iter().for_each(|p| s.push_piece(p));
            s.check_pieces(&geometry, run_end, |_| {})
        };
        let p = |home, len, log| Piece { home, len, log };
        assert!(ok(vec![p(1 << 20, 8, 64), p((1 << 20) + 8, 8, 72)]).is_ok());
        // Overlapping, unsorted, empty.
        assert!(ok(vec![p(1 << 20, 16, 64), p((1 << 20) + 8, 8, 72)]).is_err());
        assert!(ok(vec![p((1 << 20) + 8, 8, 64), p(1 << 20, 8, 72)]).is_err());
        assert!(ok(vec![p(1 << 20, 0, 64)]).is_err());
        // Outside home space, in the chunk header, past the committed run, in a free
        // chunk, outside the pool.
        assert!(ok(vec![p(HOME_LIMIT - 4, 8, 64)]).is_err());
        assert!(ok(vec![p(u64::MAX - 2, 8, 64)]).is_err());
        assert!(ok(vec![p(1 << 20, 8, 8)]).is_err());
        assert!(ok(vec![p(1 << 20, 8, 2996)]).is_err());
        assert!(ok(vec![p(1 << 20, 8, CHUNK + 64)]).is_err());
        assert!(ok(vec![p(1 << 20, 8, 64 * CHUNK + 64)]).is_err());
        assert!(ok(vec![p(1 << 20, u64::MAX, 64)]).is_err());
    }

    fn records() -> Vec<ChunkRecord> {
        let header = |prev| ChunkHeader {
            kind: LogKind::Update,
            zeroed: true,
            owner: 3,
            generation: 1 << 33,
            prev,
            seq: prev.map_or(0, |_| 1),
        };
        let book = ChunkBook {
            blocks: 7,
            max_version: 1234,
            digest: 0xfeed_beef_0123_4567,
            end: 30_000,
            entries: 250,
            data: 21_000,
        };
        vec![
            ChunkRecord {
                index: 4,
                header: header(None),
                book,
            },
            ChunkRecord {
                index: 9,
                header: header(Some(4)),
                book: ChunkBook { blocks: 1, ..book },
            },
        ]
    }

    #[test]
    fn the_chunk_table_round_trips_with_its_counts() {
        let (media, geometry) = setup();
        let mut snap = sample(300);
        snap.push_chunk_table(&records());
        assert_eq!(snap.chunk_records(), Some(records()));
        let locator = snap.write(&media, &geometry, &[20, 21, 22]).unwrap();
        let read = Snapshot::read(&media, &geometry, &locator).unwrap();
        assert_eq!(read.chunk_records(), Some(records()));
        assert_eq!(read.pieces().count(), 300);
    }

    #[test]
    fn a_table_without_counts_is_still_read() {
        // The `LHSNAP03` table: each record without its entry and data counts.
        let mut snap = sample(10);
        let start = snap.payload.len();
        let mut prev = 0;
        for r in records() {
            let mut full = Vec::new();
            push_chunk_record(&mut full, prev, &r);
            // Drop the two count varints before the 8-byte digest.
            let counts = {
                let mut c = Vec::new();
                push_var(&mut c, r.book.entries);
                push_var(&mut c, r.book.data);
                c.len()
            };
            let digest_at = full.len() - 8;
            full.drain(digest_at - counts..digest_at);
            snap.payload.extend_from_slice(&full);
            prev = r.index;
        }
        let len = (snap.payload.len() - start) as u64;
        snap.payload.extend_from_slice(&2u64.to_le_bytes());
        snap.payload.extend_from_slice(&len.to_le_bytes());
        snap.payload[..8].copy_from_slice(&PAYLOAD_MAGIC_TABLE_03);
        let read = Snapshot::decode(snap.payload.clone()).unwrap();
        let want: Vec<ChunkRecord> = records()
            .into_iter()
            .map(|r| ChunkRecord {
                book: ChunkBook {
                    entries: 0,
                    data: 0,
                    ..r.book
                },
                ..r
            })
            .collect();
        assert_eq!(read.chunk_records(), Some(want));
        assert_eq!(read.pieces().count(), 10);
    }
}
