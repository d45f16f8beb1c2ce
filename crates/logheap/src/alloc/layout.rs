//! The persistent heap's on-media layout: superblock, segment table, micro-log slots and
//! size classes. Every structure here is little-endian and checked when read; nothing
//! read from a file is trusted before its check.
//!
//! File 0 (the pool file, engine `alloc`) holds:
//!
//! | where | what |
//! |---|---|
//! | header page, bytes 512.. | the heap superblock ([`Superblock`]) |
//! | root area | the application's root (persistent pointers start here) |
//! | data area, first | the segment table: one 64-byte [`TableEntry`] per region |
//! | then | one 64-byte micro-log slot per arena ([`MicroLogSlot`]) |
//! | then, with [`MetadataPolicy::MetadataLog`] | per arena, a metadata-log ring: a header line (`base` and `done` sequence numbers), then `log_records` records |
//! | then, aligned | the regions: `region_count` segments of `segment_size` bytes |
//!
//! A region in use is a *segment* of one kind: small (8 KiB chunks with bitmaps), big
//! (4 KiB granules with a page table) or the first region of a huge block (a run of
//! whole regions holding one allocation).

pub(crate) use crate::bytes::{u32_at, u64_at};

use std::ops::Range;

/// Bytes of one segment-table entry and of one micro-log slot (one cache line each, so
/// either is persisted by one line flush).
pub(crate) const LINE: u64 = 64;
/// Size of a small-allocator chunk (002: "Fixed-size memory chunk, e.g., 8 KB").
pub(crate) const CHUNK: u64 = 8192;
/// Bytes of a chunk's header (its class word and bitmap), kept at the segment's start.
pub(crate) const CHUNK_HEADER: u64 = 64;
/// Words of a chunk's allocation bitmap (448 bits: more than the 256 blocks of the
/// smallest class).
pub(crate) const BITMAP_WORDS: usize = 7;
/// The big allocator's unit (002: sizes are multiples of the system page size).
pub(crate) const GRANULE: u64 = 4096;
/// Where the regions start in file 0 is aligned to this.
pub(crate) const REGION_ALIGN: u64 = 64 << 10;
/// The smallest segment: room for a few chunks and granules.
pub(crate) const MIN_SEGMENT: u64 = 64 << 10;
/// The largest segment (a header chunk-size field limit).
pub(crate) const MAX_SEGMENT: u64 = 64 << 20;
/// Allocations this large or larger are huge (002: "[4 KB, 16 MB)" is best fit).
pub(crate) const HUGE_THRESHOLD: u64 = 16 << 20;

/// Block sizes of the small allocator (ours: spacing of at most 25 %, each at most
/// 8192 / 2 so a chunk holds at least two blocks, each a multiple of 16).
pub(crate) const CLASSES: [u32; 20] = [
    32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024, 1280, 1536, 2048, 2688,
    4032,
];

/// The largest size the small allocator serves.
pub(crate) const SMALL_MAX: u64 = CLASSES[CLASSES.len() - 1] as u64;

/// The class serving `size` bytes (`size` ≤ [`SMALL_MAX`]).
pub(crate) fn class_of(size: u64) -> usize {
    CLASSES.partition_point(|&c| u64::from(c) < size)
}

/// Blocks of class `class` in one chunk.
pub(crate) fn blocks_per_chunk(class: usize) -> u32 {
    BLOCKS_PER_CHUNK[class]
}

/// [`blocks_per_chunk`] of every class, worked out once (it is on the paths that take,
/// give back and decode chunks, where a division showed in profiles).
const BLOCKS_PER_CHUNK: [u32; CLASSES.len()] = {
    let mut out = [0; CLASSES.len()];
    let mut i = 0;
    while i < CLASSES.len() {
        out[i] = (CHUNK / CLASSES[i] as u64) as u32;
        i += 1;
    }
    out
};

/// The default number of records in an arena's metadata-log ring
/// ([`MetadataPolicy::MetadataLog`]): 256 KiB of records, so a checkpoint coalesces
/// thousands of metadata updates into the lines they touch.
pub const DEFAULT_LOG_RECORDS: u64 = 4096;
/// The fewest and most records a ring may have.
pub(crate) const LOG_RECORDS: std::ops::RangeInclusive<u64> = 2..=(1 << 20);
/// Bytes of one arena's ring of `records` records: its header line and its records.
fn ring_bytes(records: u64) -> u64 {
    if records == 0 {
        0
    } else {
        (1 + records) * LINE
    }
}

/// Offset, in a ring's header line, of the `base` word: the sequence number of the
/// record at position 0 (records not starting there are stale).
pub(crate) const RING_BASE: u64 = 0;
/// Offset, in a ring's header line, of the `done` word: the last record whose pointer
/// store is durable.
pub(crate) const RING_DONE: u64 = 8;

/// Where a heap keeps the state of its small chunks and big blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MetadataPolicy {
    /// In place (002): every allocation and free stores its bitmap bit or page-table
    /// word, and flushes that line, inside the call.
    #[default]
    InPlace,
    /// DRAM state and a metadata log (004): an allocation or free appends one record to
    /// its arena's ring, the DRAM state is the truth while the heap is open, and the
    /// in-place metadata is brought up to date at checkpoints (a full ring, giving a
    /// segment back, close), each dirty line flushed once.
    MetadataLog,
}

impl MetadataPolicy {
    fn code(self) -> u32 {
        match self {
            MetadataPolicy::InPlace => 0,
            MetadataPolicy::MetadataLog => 1,
        }
    }
}

/// The heap's format version (superblock bytes 8..12) with extension files.
pub(crate) const LAYOUT_VERSION: u32 = 2;
/// The format version of a heap of one file (bytes 96..120 of its superblock are zero).
pub(crate) const ONE_FILE_LAYOUT_VERSION: u32 = 1;
/// The most extension files a heap may have.
pub(crate) const MAX_FILES: u64 = 1 << 20;

/// How a heap may grow: up to `max_files` extension files, each a slot of
/// `file_regions` regions (a huge block's file may take several slots). Both 0: the
/// heap is one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Growth {
    /// Extension-file slots.
    pub max_files: u64,
    /// Regions per slot.
    pub file_regions: u64,
}
const SUPERBLOCK_MAGIC: [u8; 8] = *b"LHALLOC1";
/// Bytes of the superblock covered by its CRC.
const SUPERBLOCK_CRC_COVERED: usize = 120;
/// Bytes of the encoded superblock (with its CRC).
pub(crate) const SUPERBLOCK_BYTES: usize = SUPERBLOCK_CRC_COVERED + 4;
/// Where, inside the superblock, the clean-close metadata digest word is.
pub(crate) const DIGEST_WORD: u64 = 256;

/// Where the allocator metadata lives: the immutable part of the heap superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Superblock {
    /// Bytes of one region (segment).
    pub segment_size: u64,
    /// Number of arenas (and of micro-log slots).
    pub arenas: u32,
    /// Entries in the segment table (one per region).
    pub table_offset: u64,
    /// Offset of the micro-log slots in file 0.
    pub microlog_offset: u64,
    /// Offset of the first region in file 0.
    pub regions_offset: u64,
    /// Number of regions.
    pub region_count: u64,
    /// Where allocation state is kept.
    pub policy: MetadataPolicy,
    /// Offset of the metadata-log rings in file 0 (0 without them).
    pub ring_offset: u64,
    /// Records in each ring (0 without them).
    pub ring_records: u64,
    /// Regions in file 0 (all of them in a heap of one file); the others are in the
    /// extension files' slots.
    pub local_regions: u64,
    /// Regions of one extension-file slot (0 in a heap of one file).
    pub file_regions: u64,
    /// Extension-file slots, and entries of the file table (0 in a heap of one file).
    pub max_files: u64,
    /// Offset of the file table in file 0 (0 without one).
    pub file_table_offset: u64,
}

impl Superblock {
    /// The layout of a heap with `segment_size` regions and `arenas` arenas over the
    /// data area `data`, or why none fits.
    pub(crate) fn plan(
        data: Range<u64>,
        segment_size: u64,
        arenas: u32,
        policy: MetadataPolicy,
        log_records: u64,
        growth: Growth,
    ) -> Result<Superblock, String> {
        if data.end > super::addr::MAX_OFFSET + 1 {
            return Err(format!(
                "a heap of {} bytes: a persistent address reaches {} bytes into a file",
                data.end,
                super::addr::MAX_OFFSET + 1
            ));
        }
        let Growth {
            max_files,
            file_regions,
        } = growth;
        if (max_files == 0) != (file_regions == 0) || max_files > MAX_FILES {
            return Err(format!(
                "{max_files} extension files of {file_regions} regions: both or neither, and at most {MAX_FILES} files"
            ));
        }
        let ext_regions = max_files
            .checked_mul(file_regions)
            .filter(|&n| n <= u64::from(u32::MAX) / 2)
            .ok_or_else(|| format!("{max_files} files of {file_regions} regions are too many"))?;
        if !segment_size.is_power_of_two() || !(MIN_SEGMENT..=MAX_SEGMENT).contains(&segment_size) {
            return Err(format!(
                "segment size {segment_size} is not a power of two between {MIN_SEGMENT} and {MAX_SEGMENT}"
            ));
        }
        if !(1..=1024).contains(&arenas) {
            return Err(format!("{arenas} arenas: between 1 and 1024 are supported"));
        }
        let space = data.end.saturating_sub(data.start);
        // Each region costs its size plus one table entry; the micro-log and alignment
        // come off the top.
        let microlog_bytes = (u64::from(arenas) * LINE).next_multiple_of(GRANULE);
        let ring_records = match policy {
            MetadataPolicy::InPlace => 0,
            MetadataPolicy::MetadataLog if LOG_RECORDS.contains(&log_records) => log_records,
            MetadataPolicy::MetadataLog => {
                return Err(format!(
                    "a metadata log of {log_records} records: between {} and {} are supported",
                    LOG_RECORDS.start(),
                    LOG_RECORDS.end()
                ));
            }
        };
        let ring_bytes = u64::from(arenas) * ring_bytes(ring_records);
        let file_table_bytes = (max_files * LINE).next_multiple_of(GRANULE);
        // The table has an entry for every region of every extension file as well.
        let overhead = microlog_bytes
            + ring_bytes
            + REGION_ALIGN
            + GRANULE
            + file_table_bytes
            + ext_regions * LINE
            + if max_files > 0 { GRANULE } else { 0 };
        let local_regions = space.saturating_sub(overhead) / (segment_size + LINE);
        if local_regions == 0 {
            return Err(format!(
                "a data area of {space} bytes holds no {segment_size}-byte segment"
            ));
        }
        let region_count = local_regions + ext_regions;
        let table_offset = data.start;
        let file_table_offset = table_offset + (region_count * LINE).next_multiple_of(GRANULE);
        let microlog_offset = file_table_offset + file_table_bytes;
        let file_table_offset = if max_files > 0 { file_table_offset } else { 0 };
        let ring_offset = match policy {
            MetadataPolicy::InPlace => 0,
            MetadataPolicy::MetadataLog => microlog_offset + microlog_bytes,
        };
        let regions_offset =
            (microlog_offset + microlog_bytes + ring_bytes).next_multiple_of(REGION_ALIGN);
        let mut local_regions = local_regions;
        while regions_offset + local_regions * segment_size > data.end {
            local_regions -= 1;
        }
        if local_regions == 0 {
            return Err(format!(
                "a data area of {space} bytes holds no {segment_size}-byte segment"
            ));
        }
        let region_count = local_regions + ext_regions;
        let span = regions_offset + region_count * segment_size;
        if span > super::addr::MAX_OFFSET + 1 {
            return Err(format!(
                "a heap whose files span {span} bytes: at most {} bytes are supported",
                super::addr::MAX_OFFSET + 1
            ));
        }
        Ok(Superblock {
            local_regions,
            file_regions,
            max_files,
            file_table_offset,
            segment_size,
            arenas,
            table_offset,
            microlog_offset,
            regions_offset,
            region_count,
            policy,
            ring_offset,
            ring_records,
        })
    }

    /// Offset in file 0 of arena `a`'s ring header line.
    pub(crate) fn ring_header(&self, a: u32) -> u64 {
        self.ring_offset + u64::from(a) * ring_bytes(self.ring_records)
    }

    /// Offset in file 0 of record `i` of arena `a`'s ring.
    pub(crate) fn ring_record(&self, a: u32, i: u64) -> u64 {
        self.ring_header(a) + LINE + i * LINE
    }

    /// The superblock's bytes.
    pub(crate) fn encode(&self) -> [u8; SUPERBLOCK_BYTES] {
        let mut b = [0u8; SUPERBLOCK_BYTES];
        b[0..8].copy_from_slice(&SUPERBLOCK_MAGIC);
        // A heap of one file keeps layout 1 (bytes 96..120 zero), so builds that know
        // only that layout still open it; one of several files is layout 2.
        let version = if self.max_files > 0 {
            LAYOUT_VERSION
        } else {
            ONE_FILE_LAYOUT_VERSION
        };
        b[8..12].copy_from_slice(&version.to_le_bytes());
        b[12..16].copy_from_slice(&self.policy.code().to_le_bytes());
        b[16..24].copy_from_slice(&self.segment_size.to_le_bytes());
        b[24..28].copy_from_slice(&(CHUNK as u32).to_le_bytes());
        b[28..32].copy_from_slice(&(GRANULE as u32).to_le_bytes());
        b[32..40].copy_from_slice(&HUGE_THRESHOLD.to_le_bytes());
        b[40..44].copy_from_slice(&self.arenas.to_le_bytes());
        b[44..48].copy_from_slice(&(self.region_count as u32).to_le_bytes());
        b[48..56].copy_from_slice(&self.table_offset.to_le_bytes());
        b[56..64].copy_from_slice(&self.microlog_offset.to_le_bytes());
        b[64..72].copy_from_slice(&self.regions_offset.to_le_bytes());
        b[72..80].copy_from_slice(&self.region_count.to_le_bytes());
        b[80..88].copy_from_slice(&self.ring_offset.to_le_bytes());
        b[88..96].copy_from_slice(&self.ring_records.to_le_bytes());
        if self.max_files > 0 {
            b[96..104].copy_from_slice(&self.local_regions.to_le_bytes());
            b[104..108].copy_from_slice(&(self.file_regions as u32).to_le_bytes());
            b[108..112].copy_from_slice(&(self.max_files as u32).to_le_bytes());
            b[112..120].copy_from_slice(&self.file_table_offset.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b[..SUPERBLOCK_CRC_COVERED]);
        b[SUPERBLOCK_CRC_COVERED..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a superblock read from a pool whose data area is `data`.
    pub(crate) fn decode(b: &[u8], data: Range<u64>) -> Result<Superblock, SuperblockError> {
        if b.len() < SUPERBLOCK_BYTES || b[0..8] != SUPERBLOCK_MAGIC {
            return Err(SuperblockError::Invalid(
                "no heap superblock (the pool was not formatted by the persistent heap)".into(),
            ));
        }
        let stored = u32_at(b, SUPERBLOCK_CRC_COVERED);
        let computed = crc32c::crc32c(&b[..SUPERBLOCK_CRC_COVERED]);
        if stored != computed {
            return Err(SuperblockError::Checksum { stored, computed });
        }
        let version = u32_at(b, 8);
        if version != LAYOUT_VERSION && version != ONE_FILE_LAYOUT_VERSION {
            return Err(SuperblockError::Invalid(format!(
                "heap layout version {version} (this build reads {ONE_FILE_LAYOUT_VERSION} and {LAYOUT_VERSION})"
            )));
        }
        let growth = if version == LAYOUT_VERSION {
            Growth {
                max_files: u64::from(u32_at(b, 108)),
                file_regions: u64::from(u32_at(b, 104)),
            }
        } else {
            Growth::default()
        };
        let policy = match u32_at(b, 12) {
            0 => MetadataPolicy::InPlace,
            1 => MetadataPolicy::MetadataLog,
            other => {
                return Err(SuperblockError::Invalid(format!(
                    "metadata policy {other} is not supported by this build"
                )));
            }
        };
        if u64::from(u32_at(b, 24)) != CHUNK
            || u64::from(u32_at(b, 28)) != GRANULE
            || u64_at(b, 32) != HUGE_THRESHOLD
        {
            return Err(SuperblockError::Invalid(
                "chunk, granule or huge-threshold size differs from this build's".into(),
            ));
        }
        let s = Superblock {
            segment_size: u64_at(b, 16),
            arenas: u32_at(b, 40),
            table_offset: u64_at(b, 48),
            microlog_offset: u64_at(b, 56),
            regions_offset: u64_at(b, 64),
            region_count: u64_at(b, 72),
            policy,
            ring_offset: u64_at(b, 80),
            ring_records: u64_at(b, 88),
            local_regions: if version == LAYOUT_VERSION {
                u64_at(b, 96)
            } else {
                u64_at(b, 72)
            },
            file_regions: growth.file_regions,
            max_files: growth.max_files,
            file_table_offset: if version == LAYOUT_VERSION {
                u64_at(b, 112)
            } else {
                0
            },
        };
        if version == LAYOUT_VERSION && growth.max_files == 0 {
            return Err(SuperblockError::Invalid(
                "layout 2 without extension files".into(),
            ));
        }
        // The stored layout must be exactly the one this data area and these
        // parameters give, so no offset read here can point outside the pool.
        match Superblock::plan(
            data,
            s.segment_size,
            s.arenas,
            s.policy,
            s.ring_records,
            growth,
        ) {
            Ok(expected) if expected == s && u64::from(u32_at(b, 44)) == s.region_count => Ok(s),
            Ok(expected) => Err(SuperblockError::Invalid(format!(
                "layout {s:?} does not match the pool's data area (expected {expected:?})"
            ))),
            Err(reason) => Err(SuperblockError::Invalid(reason)),
        }
    }

    /// Offset in file 0 of region `r`.
    pub(crate) fn region_offset(&self, r: u64) -> u64 {
        self.regions_offset + r * self.segment_size
    }

    /// The region holding file-0 offset `offset`, if any.
    #[inline]
    pub(crate) fn region_of(&self, offset: u64) -> Option<u64> {
        // The segment size is a power of two (checked when the superblock is read): a
        // shift, not a division, on every transactional access's range check.
        let r = offset.checked_sub(self.regions_offset)? >> self.segment_size.trailing_zeros();
        (r < self.region_count).then_some(r)
    }

    /// Bytes of address space the heap's files span: file 0, then every extension
    /// slot's regions.
    pub(crate) fn span(&self) -> u64 {
        self.region_offset(self.region_count)
    }

    /// The first region of extension slot `k`.
    pub(crate) fn slot_region(&self, k: u64) -> u64 {
        self.local_regions + k * self.file_regions
    }

    /// The extension slot holding region `r` (`None` in file 0).
    pub(crate) fn slot_of_region(&self, r: u64) -> Option<u64> {
        r.checked_sub(self.local_regions)
            .map(|e| e / self.file_regions)
    }

    /// Whether a run of regions may not continue from region `r - 1` into `r` (a file
    /// starts at `r`: a huge block never spans two files).
    pub(crate) fn file_starts_at(&self, r: u64) -> bool {
        r >= self.local_regions && (r - self.local_regions).is_multiple_of(self.file_regions)
    }

    /// The persistent address of the block starting at `offset` of the span (a block
    /// is in file 0, in a segments file of one slot, or at the start of its huge file,
    /// so its slot is its file's).
    pub(crate) fn block_addr(&self, offset: u64) -> super::PAddr {
        let in_file = self
            .region_of(offset)
            .and_then(|r| self.slot_of_region(r))
            .map(|k| {
                let base = self.region_offset(self.slot_region(k));
                (k as u32 + 1, super::files::FILE_DATA + offset - base)
            });
        let (file, at) = in_file.unwrap_or((0, offset));
        super::PAddr::new(file, at).expect("inside the span")
    }

    /// Offset in file 0 of file-table entry `k` (extension slot `k`).
    pub(crate) fn file_entry_offset(&self, k: u64) -> u64 {
        self.file_table_offset + k * LINE
    }

    /// Offset in file 0 of table entry `r`.
    pub(crate) fn entry_offset(&self, r: u64) -> u64 {
        self.table_offset + r * LINE
    }

    /// Offset in file 0 of arena `a`'s micro-log slot.
    pub(crate) fn slot_offset(&self, a: u32) -> u64 {
        self.microlog_offset + u64::from(a) * LINE
    }
}

/// Why a superblock was refused.
#[derive(Debug)]
pub(crate) enum SuperblockError {
    /// Its checksum does not match.
    Checksum {
        /// As stored.
        stored: u32,
        /// As computed.
        computed: u32,
    },
    /// It is not a valid superblock for this pool.
    Invalid(String),
}

/// What a region is used as (segment-table entry byte 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SegmentKind {
    /// 8 KiB chunks of small blocks with bitmaps.
    Small = 1,
    /// Best fit in 4 KiB granules with a page table.
    Big = 2,
    /// The first region of a huge block.
    Huge = 3,
}

impl SegmentKind {
    fn from_code(code: u8) -> Option<SegmentKind> {
        match code {
            1 => Some(SegmentKind::Small),
            2 => Some(SegmentKind::Big),
            3 => Some(SegmentKind::Huge),
            _ => None,
        }
    }
}

/// The state word of a live segment-table entry. A free entry's word is 0; any other
/// value is damage. One flipped bit never turns either into the other.
pub(crate) const LIVE: u64 = u64::from_le_bytes(*b"LIVE\xa5seg");
/// Offset of the state word inside an entry.
pub(crate) const ENTRY_STATE: u64 = 48;
const ENTRY_CRC: usize = 56;

/// A live segment-table entry: what region `index` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableEntry {
    /// The region's index (also its place in the table).
    pub index: u32,
    /// What the region holds.
    pub kind: SegmentKind,
    /// The arena that owns it.
    pub owner: u16,
    /// Bytes covered: the segment size, or a huge block's whole run of regions.
    pub size: u64,
    /// Incremented each time the region is taken.
    pub generation: u64,
    /// A huge block's requested size (0 for segments).
    pub requested: u64,
}

impl TableEntry {
    /// The entry's first 48 bytes and their CRC (the state word is written apart).
    pub(crate) fn encode_body(&self, location: u64) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&self.index.to_le_bytes());
        b[4] = self.kind as u8;
        b[6..8].copy_from_slice(&self.owner.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&location.to_le_bytes());
        b[24..32].copy_from_slice(&self.generation.to_le_bytes());
        b[32..40].copy_from_slice(&self.requested.to_le_bytes());
        let crc = crc32c::crc32c(&b[..ENTRY_STATE as usize]);
        b[ENTRY_CRC..ENTRY_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes entry `index`, stored for a region at `location` of a heap with
    /// `region_count` regions and `arenas` arenas: `Ok(None)` for a free entry, an
    /// error (why) for a damaged one.
    pub(crate) fn decode(
        b: &[u8; 64],
        index: u32,
        location: u64,
        sb: &Superblock,
    ) -> Result<Option<TableEntry>, String> {
        let state = u64_at(b, ENTRY_STATE as usize);
        if state == 0 {
            return Ok(None);
        }
        if state != LIVE {
            return Err(format!("state word {state:#018x} is neither free nor live"));
        }
        let stored = u32_at(b, ENTRY_CRC);
        let computed = crc32c::crc32c(&b[..ENTRY_STATE as usize]);
        if stored != computed {
            return Err(format!(
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ));
        }
        let kind = SegmentKind::from_code(b[4]).ok_or(format!("unknown kind {}", b[4]))?;
        let e = TableEntry {
            index: u32_at(b, 0),
            kind,
            owner: u16::from_le_bytes([b[6], b[7]]),
            size: u64_at(b, 8),
            generation: u64_at(b, 24),
            requested: u64_at(b, 32),
        };
        if e.index != index || u64_at(b, 16) != location {
            return Err(format!(
                "entry names region {} at {:#x}, not region {index} at {location:#x}",
                e.index,
                u64_at(b, 16)
            ));
        }
        if u32::from(e.owner) >= sb.arenas {
            return Err(format!("owner arena {} of {}", e.owner, sb.arenas));
        }
        let regions_left = sb.region_count - u64::from(index);
        let fits = match kind {
            SegmentKind::Small | SegmentKind::Big => e.size == sb.segment_size && e.requested == 0,
            SegmentKind::Huge => {
                e.size.is_multiple_of(sb.segment_size)
                    && e.size / sb.segment_size <= regions_left
                    && e.requested > 0
                    && e.requested <= e.size
            }
        };
        if !fits {
            return Err(format!(
                "size {} / requested {} do not fit a {kind:?} entry",
                e.size, e.requested
            ));
        }
        Ok(Some(e))
    }
}

/// What an extension file holds (file-table entry byte 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// Regions for segments (a file the heap grew by); removed by shrinking once all
    /// its regions are free.
    Segments = 1,
    /// One huge block (002: a file per huge allocation); removed when the block is
    /// freed.
    Huge = 2,
}

/// Where an extension file is in its life (the state word of its file-table entry;
/// 0 is no file). The words are far apart in Hamming distance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileState {
    /// Being created: recovery removes it.
    Creating,
    /// Created and attached.
    Live,
    /// Being removed: recovery finishes the removal.
    Removing,
}

const FILE_CREATING: u64 = u64::from_le_bytes(*b"FILE+new");
const FILE_LIVE: u64 = u64::from_le_bytes(*b"FILE\xa5liv");
const FILE_REMOVING: u64 = u64::from_le_bytes(*b"FILE-del");
/// Offset of the state word inside a file-table entry.
pub(crate) const FILE_STATE: u64 = 0;
const FILE_CRC: usize = 56;

impl FileState {
    /// Its state word.
    pub(crate) fn word(self) -> u64 {
        match self {
            FileState::Creating => FILE_CREATING,
            FileState::Live => FILE_LIVE,
            FileState::Removing => FILE_REMOVING,
        }
    }
}

/// A file-table entry: extension slot `slot` (and the slots after it, for a huge block
/// larger than one) holds a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileEntry {
    /// Its slot (also its place in the table; the file's id is `slot + 1`).
    pub slot: u64,
    /// What it holds.
    pub kind: FileKind,
    /// Slots it covers.
    pub slots: u64,
    /// Regions it holds (the file's data is this many segments long).
    pub regions: u64,
}

impl FileEntry {
    /// The entry's bytes after its state word, and their CRC (the state word is written
    /// apart, once the body is durable).
    pub(crate) fn encode_body(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[8] = self.kind as u8;
        b[16..24].copy_from_slice(&self.slots.to_le_bytes());
        b[24..32].copy_from_slice(&self.regions.to_le_bytes());
        b[32..40].copy_from_slice(&self.slot.to_le_bytes());
        let crc = crc32c::crc32c(&b[8..FILE_CRC]);
        b[FILE_CRC..FILE_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes entry `slot`: `Ok(None)` for no file, an error (why) for a damaged one.
    pub(crate) fn decode(
        b: &[u8; 64],
        slot: u64,
        sb: &Superblock,
    ) -> Result<Option<(FileState, FileEntry)>, String> {
        let state = match u64_at(b, FILE_STATE as usize) {
            0 => return Ok(None),
            FILE_CREATING => FileState::Creating,
            FILE_LIVE => FileState::Live,
            FILE_REMOVING => FileState::Removing,
            other => return Err(format!("state word {other:#018x} is not a file state")),
        };
        let stored = u32_at(b, FILE_CRC);
        let computed = crc32c::crc32c(&b[8..FILE_CRC]);
        if stored != computed {
            return Err(format!(
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ));
        }
        let kind = match b[8] {
            1 => FileKind::Segments,
            2 => FileKind::Huge,
            other => return Err(format!("unknown file kind {other}")),
        };
        let e = FileEntry {
            slot: u64_at(b, 32),
            kind,
            slots: u64_at(b, 16),
            regions: u64_at(b, 24),
        };
        let fits = e.slot == slot
            && e.slots >= 1
            && e.slots <= sb.max_files - slot
            && e.regions >= 1
            && e.regions <= e.slots * sb.file_regions
            && (kind == FileKind::Huge || (e.slots == 1 && e.regions == sb.file_regions));
        if !fits {
            return Err(format!("{e:?} does not fit slot {slot}"));
        }
        Ok(Some((state, e)))
    }
}

/// What a micro-log record does. The codes are far apart in Hamming distance, and a
/// retired slot's op word is 0, so a flipped bit never makes a retired record pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MicroOp {
    /// `*dst = addr`, and `addr` (of `size` bytes) becomes allocated.
    Allocate,
    /// `*dst = null`, and `addr` (of `size` bytes) becomes free.
    Free,
}

const OP_ALLOCATE: u64 = 0x5a3c_96e1_a110_c8ed;
const OP_FREE: u64 = 0xa5c3_691e_f4ee_d00d;
/// Offset of the op word in a slot (retiring a record stores 0 there).
pub(crate) const SLOT_OP: u64 = 8;
const SLOT_CRC: usize = 40;

/// One arena's in-flight standalone allocation or free: written and fenced before any
/// of its effects, retired (op word zeroed) after they are durable, and redone by
/// recovery while still pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MicroLogSlot {
    /// Sequence number (per arena).
    pub seq: u64,
    /// What the record does.
    pub op: MicroOp,
    /// Where the pointer to the block is stored (an offset of the heap's span).
    pub dst: u64,
    /// The block.
    pub addr: u64,
    /// The block's requested size.
    pub size: u64,
}

impl MicroLogSlot {
    /// The slot's bytes.
    pub(crate) fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        let op = match self.op {
            MicroOp::Allocate => OP_ALLOCATE,
            MicroOp::Free => OP_FREE,
        };
        b[8..16].copy_from_slice(&op.to_le_bytes());
        b[16..24].copy_from_slice(&self.dst.to_le_bytes());
        b[24..32].copy_from_slice(&self.addr.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        let crc = crc32c::crc32c(&b[..SLOT_CRC]);
        b[SLOT_CRC..SLOT_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The pending record in a slot, if there is one. A torn or retired record is none:
    /// a torn one never got past its fence, so nothing of it happened.
    pub(crate) fn decode(b: &[u8; 64]) -> Option<MicroLogSlot> {
        let op = match u64_at(b, SLOT_OP as usize) {
            OP_ALLOCATE => MicroOp::Allocate,
            OP_FREE => MicroOp::Free,
            _ => return None,
        };
        (u32_at(b, SLOT_CRC) == crc32c::crc32c(&b[..SLOT_CRC])).then(|| MicroLogSlot {
            seq: u64_at(b, 0),
            op,
            dst: u64_at(b, 16),
            addr: u64_at(b, 24),
            size: u64_at(b, 32),
        })
    }

    /// A record of `op` on the block at span offset `addr` of `size` requested bytes,
    /// whose pointer lives at `dst`; its sequence number (0 here) is given by the log it
    /// is written to.
    pub(crate) fn unsequenced(op: MicroOp, dst: u64, addr: u64, size: u64) -> Self {
        MicroLogSlot {
            seq: 0,
            op,
            dst,
            addr,
            size,
        }
    }

    /// What the record stores at `dst`: the block (an allocation) or null (a free).
    pub(crate) fn dst_value(&self, sb: &Superblock) -> u64 {
        match self.op {
            MicroOp::Allocate => sb.block_addr(self.addr).raw(),
            MicroOp::Free => 0,
        }
    }

    /// The sequence number stored in a slot, pending or not.
    pub(crate) fn stored_seq(b: &[u8; 64]) -> u64 {
        u64_at(b, 0)
    }
}

/// The clean-close digest word: the CRC of all allocator metadata, with its own check.
pub(crate) fn encode_digest(digest: u32) -> u64 {
    let check = crc32c::crc32c(&(digest ^ 0x5eed_d16e).to_le_bytes());
    u64::from(digest) | (u64::from(check) << 32)
}

/// The digest in a digest word, if the word is valid.
pub(crate) fn decode_digest(word: u64) -> Option<u32> {
    let digest = word as u32;
    (word != 0 && encode_digest(digest) == word).then_some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock::plan(
            8192..(8 << 20),
            1 << 20,
            2,
            MetadataPolicy::InPlace,
            0,
            Growth::default(),
        )
        .unwrap()
    }

    #[test]
    fn classes_cover_every_small_size_with_room_for_two_blocks() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(32), 0);
        assert_eq!(class_of(33), 1);
        assert_eq!(class_of(SMALL_MAX), CLASSES.len() - 1);
        for (i, &c) in CLASSES.iter().enumerate() {
            assert!(c.is_multiple_of(16));
            assert!(blocks_per_chunk(i) >= 2);
            assert!(blocks_per_chunk(i) as usize <= BITMAP_WORDS * 64);
            if i > 0 {
                assert!(c > CLASSES[i - 1]);
            }
        }
    }

    #[test]
    fn a_planned_superblock_round_trips_and_its_regions_fit() {
        let s = sb();
        assert!(s.region_count >= 6, "{s:?}");
        assert!(s.region_offset(s.region_count) <= 8 << 20);
        assert!(s.microlog_offset >= s.table_offset + s.region_count * LINE);
        assert!(s.regions_offset >= s.slot_offset(s.arenas));
        assert!(s.regions_offset.is_multiple_of(REGION_ALIGN));
        let b = s.encode();
        assert_eq!(Superblock::decode(&b, 8192..(8 << 20)).unwrap(), s);
        let mut bad = b;
        bad[20] ^= 1;
        assert!(matches!(
            Superblock::decode(&bad, 8192..(8 << 20)),
            Err(SuperblockError::Checksum { .. })
        ));
        assert!(matches!(
            Superblock::decode(&b, 8192..(16 << 20)),
            Err(SuperblockError::Invalid(_))
        ));
        assert!(
            Superblock::plan(
                8192..65536,
                1 << 20,
                2,
                MetadataPolicy::InPlace,
                0,
                Growth::default()
            )
            .is_err()
        );
        assert!(
            Superblock::plan(
                8192..(8 << 20),
                3 << 20,
                2,
                MetadataPolicy::InPlace,
                0,
                Growth::default()
            )
            .is_err()
        );
        // Past 1 TiB a file offset no longer fits a persistent address.
        let tib = 1u64 << 40;
        assert!(
            Superblock::plan(
                8192..tib,
                1 << 20,
                2,
                MetadataPolicy::InPlace,
                0,
                Growth::default()
            )
            .is_ok()
        );
        assert!(
            Superblock::plan(
                8192..tib + 4096,
                1 << 20,
                2,
                MetadataPolicy::InPlace,
                0,
                Growth::default()
            )
            .is_err()
        );
    }

    #[test]
    fn table_entries_round_trip_and_refuse_damage() {
        let s = sb();
        let e = TableEntry {
            index: 2,
            kind: SegmentKind::Huge,
            owner: 1,
            size: 2 << 20,
            generation: 9,
            requested: (1 << 20) + 5,
        };
        let loc = s.region_offset(2);
        let mut b = e.encode_body(loc);
        assert_eq!(
            TableEntry::decode(&b, 2, loc, &s),
            Ok(None),
            "no state word yet"
        );
        b[48..56].copy_from_slice(&LIVE.to_le_bytes());
        assert_eq!(TableEntry::decode(&b, 2, loc, &s), Ok(Some(e)));
        assert!(TableEntry::decode(&b, 3, s.region_offset(3), &s).is_err());
        for byte in [0, 4, 8, 20, 33, 49, 57] {
            let mut d = b;
            d[byte] ^= 0x10;
            assert!(TableEntry::decode(&d, 2, loc, &s).is_err(), "byte {byte}");
        }
        let too_long = TableEntry {
            size: s.segment_size * s.region_count,
            ..e
        };
        let mut t = too_long.encode_body(loc);
        t[48..56].copy_from_slice(&LIVE.to_le_bytes());
        assert!(TableEntry::decode(&t, 2, loc, &s).is_err());
    }

    #[test]
    fn a_retired_or_torn_micro_log_record_is_never_pending() {
        let r = MicroLogSlot {
            seq: 4,
            op: MicroOp::Free,
            dst: 4096,
            addr: 1 << 20,
            size: 100,
        };
        let b = r.encode();
        assert_eq!(MicroLogSlot::decode(&b), Some(r));
        let mut retired = b;
        retired[8..16].fill(0);
        assert_eq!(MicroLogSlot::decode(&retired), None);
        for bit in 0..64 {
            let mut flipped = retired;
            flipped[8 + bit / 8] ^= 1 << (bit % 8);
            assert_eq!(MicroLogSlot::decode(&flipped), None, "bit {bit}");
        }
        let mut torn = b;
        torn[30] ^= 4;
        assert_eq!(MicroLogSlot::decode(&torn), None);
        assert_eq!(MicroLogSlot::stored_seq(&torn), 4);
    }

    #[test]
    fn digest_words_check_themselves() {
        let w = encode_digest(0xdead_beef);
        assert_eq!(decode_digest(w), Some(0xdead_beef));
        assert_eq!(decode_digest(w ^ 1), None);
        assert_eq!(decode_digest(0), None);
    }
}
