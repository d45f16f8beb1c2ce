//! The log engine's superblock: the few facts about the log that live outside it, in
//! the engine-owned part of the pool's header page.
//!
//! Layout (offsets from the start of the superblock, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | chunk generation mark, copy A |
//! | 8 | 8 | chunk generation mark, copy B |
//! | 16 | 8 | formatted chunks, copy A: count (low 32 bits), CRC32C of the count (high 32) |
//! | 24 | 8 | formatted chunks, copy B |
//! | 32 | 8 | cleaned-through version, copy A |
//! | 40 | 8 | cleaned-through version, copy B |
//! | 64 | 64 | clean-close record (see [`CloseRecord`]) |
//! | 128 | 64 | snapshot locator (see [`SnapshotLocator`]), or zeros |
//! | 192 | 64 | allocation checkpoint slot A (see [`CheckpointSlot`]), or zeros |
//! | 256 | 64 | allocation checkpoint slot B, or zeros |
//!
//! Every mark is one 8-byte word written with an untearable store, in two copies, so a
//! crash leaves each copy either old or new. A mark only grows,
//! so the larger copy is right after a crash; after a clean close both must be equal. The
//! formatted count carries a checksum, because a count that shrank would hide chunks
//! from recovery; the generation mark needs none, since any value at least as large as
//! the true one is safe (recovery also takes the largest generation it finds).
//!
//! * The **generation mark**: chunk generations seed block checksums, so a stale block in
//!   a reused chunk never validates; they must never repeat, even after a crash erased
//!   the headers that recorded them. Each open reserves a range above the mark and hands
//!   out generations inside it.
//! * The **formatted count**: chunks at or above it were never part of a log and hold no
//!   header, so recovery reads no further (an empty pool costs no scan). Chunks are
//!   formatted in batches as the logs grow: headers zeroed and made durable first, then
//!   the count.
//! * The **cleaned-through version** `W` (zero until the cleaner first reclaims a chunk):
//!   every transaction of version `W` or lower had finished its commit (its blocks were
//!   durable) when the mark was written. The cleaner raises it before it reclaims a
//!   chunk whose blocks are all of version `W` or lower, so recovery may take such blocks
//!   as committed even when a peer pointer of theirs names a block the cleaner reclaimed
//!   ([`super::recovery`]). Any value at most the true one is safe; it only grows.
//! * The **clean-close record**: what the log held at the last clean close. Opening a
//!   cleanly closed pool checks that the scan finds exactly that, so log data that went
//!   missing (a zeroed chunk header, a truncated log) is damage, not a shorter log.
//! * The **snapshot locator**: where the clean-close snapshot of the mapping and the
//!   allocator is ([`super::snapshot`]); zeros while the pool is open.

use super::damage::Damage;
use super::layout::{u32_at, u64_at};
use crate::media::Media;

const GENERATION: usize = 0;
const FORMATTED: usize = 16;
const CLEANED: usize = 32;
const CLOSE: usize = 64;
const CLOSE_MAGIC: [u8; 8] = *b"LHCLOSE\0";
const CLOSE_LEN: usize = 64;
const CLOSE_CRC_AT: usize = 60;
const LOCATOR: usize = 128;
const LOCATOR_MAGIC: [u8; 8] = *b"LHSNAPLC";
const LOCATOR_LEN: usize = 64;
const LOCATOR_CRC_AT: usize = 60;
/// The largest chunk generation (and generation mark) a log can reach.
pub(crate) const GENERATION_LIMIT: u64 = u64::MAX >> 2;
const CHECKPOINT_SLOTS: [usize; 2] = [192, 256];
const CHECKPOINT_MAGIC: [u8; 8] = *b"LHALCKPT";
const CHECKPOINT_LEN: usize = 64;
const CHECKPOINT_CRC_AT: usize = 60;
/// Bytes of the superblock the log engine uses.
pub(crate) const SUPERBLOCK_BYTES: usize = CHECKPOINT_SLOTS[1] + CHECKPOINT_LEN;

/// Where the current allocation checkpoint is: the live allocations as of a version,
/// written so that the allocation and free records at or below it can leave the log
/// ([`super::checkpoint`]). Two slots take turns: a new checkpoint goes to the slot the
/// current one is not in (with the next sequence number) and is made durable, then the
/// other slot is erased, and only then may anything the new checkpoint replaces be
/// reclaimed. So a crash leaves the old checkpoint, or both (the newer wins), or the
/// new one; a slot that fails its checksum beside a valid one is a torn write of a
/// checkpoint that never took effect, and one that fails beside none is damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CheckpointSlot {
    /// Grows by one with each checkpoint.
    pub seq: u64,
    /// The records at or below this version are in the checkpoint.
    pub version: u64,
    /// Where its payload is.
    pub locator: SnapshotLocator,
}

/// The marks read at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marks {
    /// The chunk generation mark.
    pub generation: u64,
    /// Chunks formatted so far.
    pub formatted: u32,
    /// The cleaned-through version (0: the cleaner never reclaimed a chunk).
    pub cleaned: u64,
}

/// What the log held when the pool was last closed cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CloseRecord {
    /// Largest transaction version in the log.
    pub max_version: u64,
    /// Committed transactions in the log.
    pub transactions: u64,
    /// Valid transaction blocks in the log.
    pub blocks: u64,
    /// Chunks with a valid header.
    pub chunks_in_use: u64,
}

impl CloseRecord {
    /// Its fields, in their stored order.
    pub(crate) fn words(&self) -> [u64; 4] {
        [
            self.max_version,
            self.transactions,
            self.blocks,
            self.chunks_in_use,
        ]
    }

    /// The record with these fields (in [`words`](Self::words) order).
    pub(crate) fn from_words(w: [u64; 4]) -> CloseRecord {
        CloseRecord {
            max_version: w[0],
            transactions: w[1],
            blocks: w[2],
            chunks_in_use: w[3],
        }
    }
}

/// Where the clean-close snapshot is ([`super::snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SnapshotLocator {
    /// Its first chunk.
    pub first: u32,
    /// Chunks it takes.
    pub chunks: u32,
    /// Payload bytes.
    pub bytes: u64,
    /// CRC32C of the payload.
    pub crc: u32,
}

impl SnapshotLocator {
    /// Encoded size: first chunk (4), chunks (4), payload bytes (8), CRC (4).
    const BYTES: usize = 20;

    /// Writes it into `b` (exactly [`BYTES`](Self::BYTES) long).
    fn encode(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.first.to_le_bytes());
        b[4..8].copy_from_slice(&self.chunks.to_le_bytes());
        b[8..16].copy_from_slice(&self.bytes.to_le_bytes());
        b[16..20].copy_from_slice(&self.crc.to_le_bytes());
    }

    /// Reads one from the start of `b` (at least [`BYTES`](Self::BYTES) long).
    fn decode(b: &[u8]) -> SnapshotLocator {
        SnapshotLocator {
            first: u32_at(b, 0),
            chunks: u32_at(b, 4),
            bytes: u64_at(b, 8),
            crc: u32_at(b, 16),
        }
    }
}

/// The superblock of one pool.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogSuperblock {
    /// Pool offset of the superblock.
    pub at: usize,
}

fn encode_count(count: u32) -> u64 {
    (crc32c::crc32c(&count.to_le_bytes()) as u64) << 32 | count as u64
}

/// The largest cleaned-through version the superblock holds (48 bits).
pub(crate) const CLEANED_LIMIT: u64 = (1 << 48) - 1;

/// CRC-16/CCITT-FALSE of `bytes`: it finds every error confined to 16 consecutive bits.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0xffffu16;
    for &b in bytes {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                crc << 1 ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cleaned-through version as stored: 48 bits and their CRC-16 (0 stays 0, as in a
/// pool the cleaner never touched). A flipped bit must not raise it: blocks at or
/// below it count as committed.
fn encode_cleaned(version: u64) -> u64 {
    match version {
        0 => 0,
        v => v | (crc16(&v.to_le_bytes()[..6]) as u64) << 48,
    }
}

fn decode_cleaned(word: u64) -> Option<u64> {
    let version = word & CLEANED_LIMIT;
    (encode_cleaned(version) == word).then_some(version)
}

fn decode_count(word: u64) -> Option<u32> {
    let count = word as u32;
    (encode_count(count) == word).then_some(count)
}

impl LogSuperblock {
    /// Writes a new pool's superblock: generation mark 0, the first `formatted` chunks
    /// formatted (a new file is all zeros), and the close record of an empty log (a new
    /// pool opens as a cleanly closed empty one). Durable when it returns.
    pub(crate) fn format(&self, media: &Media, formatted: u32) {
        media.write(self.at, &[0u8; SUPERBLOCK_BYTES]);
        media.write_u64(self.at + FORMATTED, encode_count(formatted));
        media.write_u64(self.at + FORMATTED + 8, encode_count(formatted));
        media.flush(self.at, SUPERBLOCK_BYTES);
        self.write_close_record(media, &CloseRecord::default());
    }

    /// Reads the marks. `clean`: the pool was closed cleanly, so both copies of each
    /// mark must agree.
    pub(crate) fn read_marks(&self, media: &Media, clean: bool) -> Result<Marks, Damage> {
        let g = [0, 8].map(|i| media.read_u64(self.at + GENERATION + i));
        if clean && g[0] != g[1] {
            return Err(Damage::at(
                (self.at + GENERATION) as u64,
                format!(
                    "the two copies of the chunk generation mark differ ({} and {}) after a clean close",
                    g[0], g[1]
                ),
            ));
        }
        // Generations are reserved in steps far below 2^62; a mark beyond is damage.
        if g[0].max(g[1]) > GENERATION_LIMIT {
            return Err(Damage::at(
                (self.at + GENERATION) as u64,
                format!(
                    "the chunk generation mark {} is beyond any reachable value",
                    g[0].max(g[1])
                ),
            ));
        }
        let words = [0, 8].map(|i| media.read_u64(self.at + FORMATTED + i));
        let counts = words.map(decode_count);
        let formatted = match counts {
            [Some(a), Some(b)] if a == b || !clean => a.max(b),
            [Some(a), None] | [None, Some(a)] if !clean => a,
            _ => {
                return Err(Damage::at(
                    (self.at + FORMATTED) as u64,
                    format!(
                        "the formatted-chunk count is damaged (copies {:#018x} and {:#018x})",
                        words[0], words[1]
                    ),
                ));
            }
        };
        // The larger copy is right after a crash; damage to it can only make recovery
        // take a transaction as committed that a crash interrupted, so it is bounded by
        // the largest version a log can reach (checked with the log's versions).
        let words = [0, 8].map(|i| media.read_u64(self.at + CLEANED + i));
        let cleaned = match words.map(decode_cleaned) {
            [Some(a), Some(b)] if a == b || !clean => a.max(b),
            [Some(a), None] | [None, Some(a)] if !clean => a,
            _ => {
                return Err(Damage::at(
                    (self.at + CLEANED) as u64,
                    format!(
                        "the cleaned-through version is damaged (copies {:#018x} and {:#018x})",
                        words[0], words[1]
                    ),
                ));
            }
        };
        Ok(Marks {
            generation: g[0].max(g[1]),
            formatted,
            cleaned,
        })
    }

    /// Durably raises the cleaned-through version to `version` (at most
    /// [`CLEANED_LIMIT`]).
    pub(crate) fn write_cleaned(&self, media: &Media, version: u64) {
        self.write_mark(media, CLEANED, encode_cleaned(version.min(CLEANED_LIMIT)));
    }

    /// Durably sets the generation mark (both copies, one after the other).
    pub(crate) fn write_generation(&self, media: &Media, mark: u64) {
        self.write_mark(media, GENERATION, mark);
    }

    /// Durably sets the formatted-chunk count.
    pub(crate) fn write_formatted(&self, media: &Media, count: u32) {
        self.write_mark(media, FORMATTED, encode_count(count));
    }

    /// Writes both copies of a mark and makes them durable. Each copy is one untearable
    /// store, so a crash leaves each old or new: the copies guard against damage, not
    /// against tearing, and one fence serves both.
    fn write_mark(&self, media: &Media, field: usize, word: u64) {
        media.write_u64(self.at + field, word);
        media.write_u64(self.at + field + 8, word);
        media.persist(self.at + field, 16);
    }

    /// Durably writes the clean-close record.
    pub(crate) fn write_close_record(&self, media: &Media, record: &CloseRecord) {
        let mut b = [0u8; CLOSE_LEN];
        b[..8].copy_from_slice(&CLOSE_MAGIC);
        for (i, v) in record.words().into_iter().enumerate() {
            b[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b[..CLOSE_CRC_AT]);
        b[CLOSE_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        media.write(self.at + CLOSE, &b);
        media.persist(self.at + CLOSE, CLOSE_LEN);
    }

    /// Reads the clean-close record (only meaningful when the pool was closed cleanly).
    pub(crate) fn read_close_record(&self, media: &Media) -> Result<CloseRecord, Damage> {
        let mut b = [0u8; CLOSE_LEN];
        media.read(self.at + CLOSE, &mut b);
        let stored = u32_at(&b, CLOSE_CRC_AT);
        if b[..8] != CLOSE_MAGIC || crc32c::crc32c(&b[..CLOSE_CRC_AT]) != stored {
            return Err(Damage::at(
                (self.at + CLOSE) as u64,
                "the clean-close record is damaged".into(),
            ));
        }
        Ok(CloseRecord::from_words(
            [0, 1, 2, 3].map(|i| u64_at(&b, 8 + i * 8)),
        ))
    }

    /// Durably writes the snapshot locator.
    pub(crate) fn write_snapshot_locator(&self, media: &Media, locator: &SnapshotLocator) {
        let mut b = [0u8; LOCATOR_LEN];
        b[..8].copy_from_slice(&LOCATOR_MAGIC);
        locator.encode(&mut b[8..8 + SnapshotLocator::BYTES]);
        let crc = crc32c::crc32c(&b[..LOCATOR_CRC_AT]);
        b[LOCATOR_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        media.write(self.at + LOCATOR, &b);
        media.persist(self.at + LOCATOR, LOCATOR_LEN);
    }

    /// Reads the snapshot locator: `Ok(None)` when there is none (all zeros), an error
    /// when it is damaged.
    pub(crate) fn read_snapshot_locator(
        &self,
        media: &Media,
    ) -> Result<Option<SnapshotLocator>, String> {
        let mut b = [0u8; LOCATOR_LEN];
        media.read(self.at + LOCATOR, &mut b);
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if b[..8] != LOCATOR_MAGIC || crc32c::crc32c(&b[..LOCATOR_CRC_AT]) != u32_at(&b, 60) {
            return Err("the snapshot locator is damaged".into());
        }
        Ok(Some(SnapshotLocator::decode(&b[8..])))
    }

    /// Durably writes `slot` into the slot its sequence number picks (the one the
    /// current checkpoint, of the sequence number before, is not in).
    pub(crate) fn write_checkpoint(&self, media: &Media, slot: &CheckpointSlot) {
        let mut b = [0u8; CHECKPOINT_LEN];
        b[..8].copy_from_slice(&CHECKPOINT_MAGIC);
        b[8..16].copy_from_slice(&slot.seq.to_le_bytes());
        b[16..24].copy_from_slice(&slot.version.to_le_bytes());
        slot.locator.encode(&mut b[24..24 + SnapshotLocator::BYTES]);
        let crc = crc32c::crc32c(&b[..CHECKPOINT_CRC_AT]);
        b[CHECKPOINT_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        let at = self.at + CHECKPOINT_SLOTS[(slot.seq % 2) as usize];
        media.write(at, &b);
        media.persist(at, CHECKPOINT_LEN);
    }

    /// Durably erases the slot that checkpoint `seq` is not in (once checkpoint `seq`
    /// is durable, the one before it no longer counts).
    pub(crate) fn erase_other_checkpoint(&self, media: &Media, seq: u64) {
        let at = self.at + CHECKPOINT_SLOTS[(seq.wrapping_add(1) % 2) as usize];
        media.write(at, &[0u8; CHECKPOINT_LEN]);
        media.persist(at, CHECKPOINT_LEN);
    }

    /// The current allocation checkpoint: `Ok(None)` when there is none, an error when
    /// no slot is valid but one is damaged.
    pub(crate) fn read_checkpoint(&self, media: &Media) -> Result<Option<CheckpointSlot>, Damage> {
        let slots = CHECKPOINT_SLOTS.map(|field| {
            let mut b = [0u8; CHECKPOINT_LEN];
            media.read(self.at + field, &mut b);
            if b.iter().all(|&x| x == 0) {
                return Ok(None);
            }
            if b[..8] != CHECKPOINT_MAGIC
                || crc32c::crc32c(&b[..CHECKPOINT_CRC_AT]) != u32_at(&b, CHECKPOINT_CRC_AT)
                || b[44..CHECKPOINT_CRC_AT] != [0; 16]
            {
                return Err(Damage::at(
                    (self.at + field) as u64,
                    "the allocation checkpoint slot is damaged".into(),
                ));
            }
            Ok(Some(CheckpointSlot {
                seq: u64_at(&b, 8),
                version: u64_at(&b, 16),
                locator: SnapshotLocator::decode(&b[24..]),
            }))
        });
        match slots {
            [Ok(a), Ok(b)] => Ok(match (a, b) {
                (Some(a), Some(b)) => Some(if a.seq >= b.seq { a } else { b }),
                (a, b) => a.or(b),
            }),
            // A torn write of a checkpoint that never took effect: the other counts.
            [Ok(Some(valid)), Err(_)] | [Err(_), Ok(Some(valid))] => Ok(Some(valid)),
            [Err(e), _] | [_, Err(e)] => Err(e),
        }
    }

    /// Durably erases the snapshot locator, if there is one (every open does, before it
    /// writes to the log: a snapshot describes the log of one clean close only).
    pub(crate) fn clear_snapshot_locator(&self, media: &Media) {
        let mut b = [0u8; LOCATOR_LEN];
        media.read(self.at + LOCATOR, &mut b);
        if b.iter().any(|&x| x != 0) {
            media.write(self.at + LOCATOR, &[0u8; LOCATOR_LEN]);
            media.persist(self.at + LOCATOR, LOCATOR_LEN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{MediaConfig, SimConfig};

    fn media() -> Media {
        Media::sim(4096, &MediaConfig::default(), SimConfig::default()).unwrap()
    }

    fn slot(seq: u64) -> CheckpointSlot {
        CheckpointSlot {
            seq,
            version: 100 + seq,
            locator: SnapshotLocator {
                first: 3,
                chunks: 2,
                bytes: 5000,
                crc: 77,
            },
        }
    }

    #[test]
    fn checkpoint_slots_take_turns_and_a_torn_one_falls_back_to_the_other() {
        let m = media();
        let sb = LogSuperblock { at: 512 };
        sb.format(&m, 16);
        assert_eq!(sb.read_checkpoint(&m).unwrap(), None);
        sb.write_checkpoint(&m, &slot(1));
        assert_eq!(sb.read_checkpoint(&m).unwrap(), Some(slot(1)));
        // Both valid: the newer counts.
        sb.write_checkpoint(&m, &slot(2));
        assert_eq!(sb.read_checkpoint(&m).unwrap(), Some(slot(2)));
        sb.erase_other_checkpoint(&m, 2);
        assert_eq!(sb.read_checkpoint(&m).unwrap(), Some(slot(2)));
        // A torn write of checkpoint 3 (any changed byte of its slot) leaves 2.
        sb.write_checkpoint(&m, &slot(3));
        let at = 512 + CHECKPOINT_SLOTS[1];
        for byte in 0..CHECKPOINT_LEN {
            let b = m.read_u64(at + byte / 8 * 8);
            m.write_u64(at + byte / 8 * 8, b ^ (1 << (byte % 8 * 8)));
            assert_eq!(
                sb.read_checkpoint(&m).unwrap(),
                Some(slot(2)),
                "byte {byte}"
            );
            m.write_u64(at + byte / 8 * 8, b);
        }
        assert_eq!(sb.read_checkpoint(&m).unwrap(), Some(slot(3)));
        // A damaged slot beside none is damage.
        sb.erase_other_checkpoint(&m, 3);
        let at = 512 + CHECKPOINT_SLOTS[1];
        let b = m.read_u64(at + 16);
        m.write_u64(at + 16, b ^ 1);
        assert!(sb.read_checkpoint(&m).is_err());
    }

    #[test]
    fn marks_round_trip_and_damage_is_found() {
        let m = media();
        let sb = LogSuperblock { at: 512 };
        sb.format(&m, 16);
        assert_eq!(
            sb.read_marks(&m, true),
            Ok(Marks {
                generation: 0,
                formatted: 16,
                cleaned: 0
            })
        );
        sb.write_generation(&m, 77);
        sb.write_formatted(&m, 123);
        let marks = sb.read_marks(&m, true).unwrap();
        assert_eq!((marks.generation, marks.formatted), (77, 123));
        // Every single changed byte of the formatted count is found after a clean close,
        // and after a crash the other copy is used.
        for byte in 0..16 {
            let at = 512 + FORMATTED + byte;
            let mut b = [0u8];
            m.read(at, &mut b);
            m.write(at, &[b[0] ^ 0x40]);
            assert!(sb.read_marks(&m, true).is_err(), "byte {byte}");
            assert_eq!(sb.read_marks(&m, false).unwrap().formatted, 123);
            m.write(at, &b);
        }
        // Copies that differ: an error after a clean close, the larger after a crash.
        m.write_u64(512 + 8, 90);
        assert!(sb.read_marks(&m, true).is_err());
        assert_eq!(sb.read_marks(&m, false).unwrap().generation, 90);
        m.write_u64(512 + FORMATTED, encode_count(200));
        assert_eq!(sb.read_marks(&m, false).unwrap().formatted, 200);
    }

    #[test]
    fn snapshot_locator_round_trips_clears_and_every_flipped_byte_is_caught() {
        let m = media();
        let sb = LogSuperblock { at: 512 };
        sb.format(&m, 0);
        assert_eq!(sb.read_snapshot_locator(&m), Ok(None));
        let l = SnapshotLocator {
            first: 7,
            chunks: 3,
            bytes: 70_000,
            crc: 0xdead_beef,
        };
        sb.write_snapshot_locator(&m, &l);
        assert_eq!(sb.read_snapshot_locator(&m), Ok(Some(l)));
        for byte in 0..LOCATOR_LEN {
            let at = 512 + LOCATOR + byte;
            let mut b = [0u8];
            m.read(at, &mut b);
            m.write(at, &[b[0] ^ 4]);
            assert!(sb.read_snapshot_locator(&m).is_err(), "byte {byte}");
            m.write(at, &b);
        }
        sb.clear_snapshot_locator(&m);
        assert_eq!(sb.read_snapshot_locator(&m), Ok(None));
        // The close record is untouched by the locator.
        assert_eq!(sb.read_close_record(&m), Ok(CloseRecord::default()));
    }

    #[test]
    fn close_record_round_trips_and_every_flipped_byte_is_caught() {
        let m = media();
        let sb = LogSuperblock { at: 512 };
        sb.format(&m, 0);
        assert_eq!(sb.read_close_record(&m), Ok(CloseRecord::default()));
        let r = CloseRecord {
            max_version: 9,
            transactions: 5,
            blocks: 7,
            chunks_in_use: 3,
        };
        sb.write_close_record(&m, &r);
        assert_eq!(sb.read_close_record(&m), Ok(r));
        for byte in 0..CLOSE_LEN {
            let at = 512 + CLOSE + byte;
            let mut b = [0u8];
            m.read(at, &mut b);
            m.write(at, &[b[0] ^ 1]);
            assert!(sb.read_close_record(&m).is_err(), "byte {byte}");
            m.write(at, &b);
        }
    }
}
