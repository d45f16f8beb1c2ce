//! Segregated fit for small blocks (002): a small segment is a run of 8 KiB chunks; each
//! chunk serves one size class. The chunks' 64-byte headers, one cache line each, sit
//! together at the start of the segment (so opening a heap reads a few pages per
//! segment, not one page per chunk):
//!
//! | bytes | what |
//! |---|---|
//! | 0..8 | class word: `class + 1` in bits 0..16 (0: never assigned), block size in bits 32..64 |
//! | 8..64 | allocation bitmap, 7 words, bit `i` = block `i` |
//!
//! An allocation is one bit set and a free one bit cleared, in one line ("one allocation
//! == one bit flip", 002). The class word is stored with every allocation (the same
//! line, stored before the bit), so a chunk that changes class needs no step of its own.
//!
//! This module holds the persistent encoding and the DRAM state of one arena's small
//! chunks: per class the chunks with free blocks, and the empty chunks any class may
//! take, lowest address first. A chunk is known by the file-0 offset of its blocks.

use std::collections::{BTreeMap, BTreeSet};

use super::layout::{
    BITMAP_WORDS, CHUNK, CHUNK_HEADER, CLASSES, GRANULE, blocks_per_chunk, u64_at,
};
use crate::media::Media;

/// A chunk's state: its header as stored (its class, if assigned, and its bitmap), and
/// its count of used blocks. The same value is read from a segment when a heap opens
/// and kept in DRAM after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ChunkState {
    /// The class, if the chunk was ever assigned one.
    pub class: Option<u8>,
    /// The allocation bitmap.
    pub bits: [u64; BITMAP_WORDS],
    /// Blocks allocated (bits set).
    pub used: u32,
}

impl ChunkState {
    /// Decodes and checks a stored header (why it is damaged, if it is).
    pub(crate) fn decode(b: &[u8; CHUNK_HEADER as usize]) -> Result<ChunkState, String> {
        let word = u64_at(b, 0);
        let mut bits = [0u64; BITMAP_WORDS];
        for (i, w) in bits.iter_mut().enumerate() {
            *w = u64_at(b, 8 + 8 * i);
        }
        let code = (word & 0xffff) as usize;
        if code == 0 {
            if word != 0 || bits.iter().any(|&w| w != 0) {
                return Err("a chunk without a class has a class word or allocated blocks".into());
            }
            return Ok(ChunkState::default());
        }
        let class = code - 1;
        if class >= CLASSES.len()
            || word >> 32 != u64::from(CLASSES[class])
            || word >> 16 & 0xffff != 0
        {
            return Err(format!("class word {word:#x} names no size class"));
        }
        let cap = blocks_per_chunk(class) as usize;
        for (i, &w) in bits.iter().enumerate() {
            let valid = cap.saturating_sub(i * 64).min(64);
            let mask = if valid == 64 {
                u64::MAX
            } else {
                (1u64 << valid) - 1
            };
            if w & !mask != 0 {
                return Err(format!(
                    "bitmap marks blocks past the {cap} blocks of class {}",
                    CLASSES[class]
                ));
            }
        }
        Ok(ChunkState {
            class: Some(class as u8),
            bits,
            used: bits.iter().map(|w| w.count_ones()).sum(),
        })
    }
}

/// The class word of a chunk serving `class`.
pub(crate) fn class_word(class: usize) -> u64 {
    (class as u64 + 1) | (u64::from(CLASSES[class]) << 32)
}

/// Marks block `block` of the chunk whose header is at `header` (a file-0 offset)
/// allocated to `class`, unflushed (the caller flushes the header's line, at once or at a
/// checkpoint). Idempotent, so recovery may redo it.
pub(crate) fn store_set(media: &Media, header: u64, class: usize, block: u32) {
    let at = header as usize;
    media.write_u64(at, class_word(class));
    let word = at + 8 + 8 * (block as usize / 64);
    media.write_u64(word, media.read_u64(word) | 1 << (block % 64));
}

/// Marks block `block` of the chunk whose header is at `header` free, unflushed.
/// Idempotent.
pub(crate) fn store_clear(media: &Media, header: u64, block: u32) {
    let word = header as usize + 8 + 8 * (block as usize / 64);
    media.write_u64(word, media.read_u64(word) & !(1 << (block % 64)));
}

/// Where the headers and chunks of a small segment are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// The segment's file-0 offset.
    pub base: u64,
    /// Bytes of headers before the first chunk (whole pages).
    pub header_bytes: u64,
    /// Chunks in the segment.
    pub chunks: u64,
}

impl Geometry {
    /// The geometry of a small segment of `segment_size` bytes at `base`.
    pub(crate) fn of(base: u64, segment_size: u64) -> Geometry {
        let header_bytes = (segment_size / CHUNK * CHUNK_HEADER).next_multiple_of(GRANULE);
        Geometry {
            base,
            header_bytes,
            chunks: (segment_size - header_bytes) / CHUNK,
        }
    }

    /// The file-0 offset of the first chunk's blocks.
    pub(crate) fn data_start(&self) -> u64 {
        self.base + self.header_bytes
    }

    /// The file-0 offset of chunk `k`'s blocks.
    pub(crate) fn chunk(&self, k: u64) -> u64 {
        self.data_start() + k * CHUNK
    }

    /// The file-0 offset of the header of the chunk whose blocks start at `chunk`.
    pub(crate) fn header_of(&self, chunk: u64) -> u64 {
        self.base + (chunk - self.data_start()) / CHUNK * CHUNK_HEADER
    }

    /// The chunk holding file-0 offset `offset`, if a chunk does.
    pub(crate) fn chunk_containing(&self, offset: u64) -> Option<u64> {
        let k = offset.checked_sub(self.data_start())? / CHUNK;
        (k < self.chunks).then(|| self.chunk(k))
    }

    /// Where a small block of `class` at `offset` is: its chunk and its index there.
    pub(crate) fn block_of(&self, offset: u64, class: usize) -> Option<(u64, u32)> {
        let chunk = self.chunk_containing(offset)?;
        let inside = offset - chunk;
        let size = u64::from(CLASSES[class]);
        let block = inside / size;
        (inside.is_multiple_of(size) && block < u64::from(blocks_per_chunk(class)))
            .then_some((chunk, block as u32))
    }
}

/// File-0 offset of block `block` of class `class` in the chunk whose blocks start at
/// `chunk`.
pub(crate) fn block_offset(chunk: u64, class: usize, block: u32) -> u64 {
    chunk + u64::from(block) * u64::from(CLASSES[class])
}

/// A chunk's key in an arena: its file-0 offset (so sets order chunks by address).
type ChunkKey = u64;

/// One small segment's chunks, in address order.
#[derive(Debug)]
struct SmallSegment {
    geometry: Geometry,
    chunks: Box<[ChunkState]>,
}

/// The DRAM state of one arena's small chunks.
///
/// The chunks are kept per segment, in an array in address order, not in a map with an
/// entry per chunk: opening a heap then builds one array per segment from its headers
/// (a million blocks are ~77 K chunks; inserting each in a hash map was most of the
/// time of opening).
#[derive(Debug)]
pub(crate) struct SmallChunks {
    /// The arena's small segments, by file-0 offset.
    segments: BTreeMap<u64, SmallSegment>,
    /// Per class, the chunks with at least one free and one used block.
    partial: Vec<BTreeSet<ChunkKey>>,
    /// Chunks with no used block (any class may take them).
    empty: BTreeSet<ChunkKey>,
}

impl Default for SmallChunks {
    fn default() -> Self {
        SmallChunks {
            segments: BTreeMap::new(),
            partial: vec![BTreeSet::new(); CLASSES.len()],
            empty: BTreeSet::new(),
        }
    }
}

/// A small block handed out by [`SmallChunks::take`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SmallBlock {
    /// The chunk's file-0 offset.
    pub chunk: u64,
    /// The block's index in the chunk.
    pub block: u32,
    /// Its class.
    pub class: usize,
}

impl SmallBlock {
    /// The block's file-0 offset.
    pub(crate) fn offset(&self) -> u64 {
        block_offset(self.chunk, self.class, self.block)
    }
}

impl SmallChunks {
    /// Adds a small segment whose chunks are `chunks`, in order (as read from the
    /// segment, or all default for a new one).
    pub(crate) fn add_segment(&mut self, geometry: Geometry, chunks: Box<[ChunkState]>) {
        debug_assert_eq!(chunks.len() as u64, geometry.chunks);
        for (k, c) in chunks.iter().enumerate() {
            self.file(geometry.chunk(k as u64), c);
        }
        self.segments
            .insert(geometry.base, SmallSegment { geometry, chunks });
    }

    /// Removes a segment (an empty one being given back).
    pub(crate) fn remove_segment(&mut self, g: &Geometry) {
        let Some(s) = self.segments.remove(&g.base) else {
            return;
        };
        for (k, c) in s.chunks.iter().enumerate() {
            debug_assert_eq!(c.used, 0);
            let key = g.chunk(k as u64);
            if let Some(class) = c.class {
                self.partial[class as usize].remove(&key);
            }
            self.empty.remove(&key);
        }
    }

    /// The file-0 offsets of the chunks with no used block, in address order (their
    /// bytes, all but the header kept at the segment's start, hold nothing).
    pub(crate) fn empty_chunks(&self) -> impl Iterator<Item = u64> + '_ {
        self.empty.iter().copied()
    }

    /// Whether every chunk of a segment is empty.
    pub(crate) fn all_empty(&self, g: &Geometry) -> bool {
        self.segments
            .get(&g.base)
            .is_none_or(|s| s.chunks.iter().all(|c| c.used == 0))
    }

    fn chunk(&self, key: ChunkKey) -> Option<&ChunkState> {
        let (_, s) = self.segments.range(..=key).next_back()?;
        let k = key.checked_sub(s.geometry.data_start())? / CHUNK;
        s.chunks.get(k as usize)
    }

    fn chunk_mut(&mut self, key: ChunkKey) -> Option<&mut ChunkState> {
        let (_, s) = self.segments.range_mut(..=key).next_back()?;
        let k = key.checked_sub(s.geometry.data_start())? / CHUNK;
        s.chunks.get_mut(k as usize)
    }

    fn file(&mut self, key: u64, c: &ChunkState) {
        match c.class {
            _ if c.used == 0 => {
                self.empty.insert(key);
            }
            Some(class) if c.used < blocks_per_chunk(class as usize) => {
                self.partial[class as usize].insert(key);
            }
            _ => {}
        }
    }

    /// Takes a free block of `class` (DRAM only), or `None` when no chunk of the arena
    /// has room: the caller adds a segment.
    pub(crate) fn take(&mut self, class: usize) -> Option<SmallBlock> {
        let key = match self.partial[class].first() {
            Some(&k) => k,
            None => {
                let k = self.empty.pop_first()?;
                let c = self.chunk_mut(k).expect("an empty chunk is known");
                c.class = Some(class as u8);
                c.bits = [0; BITMAP_WORDS];
                self.partial[class].insert(k);
                k
            }
        };
        let c = self.chunk_mut(key).expect("a partial chunk is known");
        let cap = blocks_per_chunk(class);
        let (w, word) = c
            .bits
            .iter()
            .enumerate()
            .find(|(_, w)| **w != u64::MAX)
            .expect("a partial chunk has a free block");
        let block = w as u32 * 64 + (!*word).trailing_zeros();
        debug_assert!(block < cap);
        c.bits[w] |= 1 << (block % 64);
        c.used += 1;
        if c.used == cap {
            self.partial[class].remove(&key);
        }
        Some(SmallBlock {
            chunk: key,
            block,
            class,
        })
    }

    /// Gives back a block (a cancelled reservation, or a free once durable); whether its
    /// chunk is now empty.
    pub(crate) fn give_back(&mut self, b: SmallBlock) -> bool {
        let c = self.chunk_mut(b.chunk).expect("the block's chunk is known");
        debug_assert!(c.bits[b.block as usize / 64] & 1 << (b.block % 64) != 0);
        c.bits[b.block as usize / 64] &= !(1 << (b.block % 64));
        c.used -= 1;
        let class = b.class;
        if c.used == 0 {
            self.partial[class].remove(&b.chunk);
            self.empty.insert(b.chunk);
            return true;
        }
        if c.used + 1 == blocks_per_chunk(class) {
            self.partial[class].insert(b.chunk);
        }
        false
    }

    /// The class of the chunk at `chunk`, and whether block `block` is allocated there.
    pub(crate) fn is_allocated(&self, chunk: u64, class: usize, block: u32) -> bool {
        self.chunk(chunk).is_some_and(|c| {
            c.class == Some(class as u8) && c.bits[block as usize / 64] & 1 << (block % 64) != 0
        })
    }

    /// The class of the chunk at `chunk`, if it has one.
    pub(crate) fn class_of_chunk(&self, chunk: u64) -> Option<usize> {
        self.chunk(chunk).and_then(|c| c.class.map(usize::from))
    }

    /// Live blocks and their bytes.
    pub(crate) fn live(&self) -> (u64, u64) {
        self.segments
            .values()
            .flat_map(|s| s.chunks.iter())
            .filter_map(|c| {
                c.class
                    .map(|k| (u64::from(c.used), u64::from(CLASSES[k as usize])))
            })
            .fold((0, 0), |(n, b), (u, s)| (n + u, b + u * s))
    }

    /// DRAM held (approximate).
    pub(crate) fn dram_bytes(&self) -> u64 {
        let sets: usize = self.partial.iter().map(BTreeSet::len).sum::<usize>() + self.empty.len();
        let chunks: usize = self.segments.values().map(|s| s.chunks.len()).sum();
        let segments = self.segments.len() * std::mem::size_of::<(u64, SmallSegment)>();
        (chunks * std::mem::size_of::<ChunkState>() + segments + sets * 16) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::layout::class_of;

    #[test]
    fn a_segments_headers_fill_whole_pages_before_its_chunks() {
        let g = Geometry::of(1 << 20, 4 << 20);
        assert_eq!((g.header_bytes, g.chunks), (32 << 10, 508));
        assert!(g.chunks * CHUNK_HEADER <= g.header_bytes);
        assert!(g.data_start() + g.chunks * CHUNK <= (1 << 20) + (4 << 20));
        let small = Geometry::of(0, 64 << 10);
        assert_eq!((small.header_bytes, small.chunks), (4096, 7));
    }

    #[test]
    fn headers_round_trip_and_damage_is_named() {
        let mut b = [0u8; 64];
        assert_eq!(ChunkState::decode(&b).unwrap(), ChunkState::default());
        let class = class_of(100);
        b[0..8].copy_from_slice(&class_word(class).to_le_bytes());
        b[8] = 0b101;
        let h = ChunkState::decode(&b).unwrap();
        assert_eq!((h.class, h.used), (Some(class as u8), 2));
        let mut past = b;
        past[63] = 0x80; // bit 447: past the 64 blocks of class 128
        assert!(ChunkState::decode(&past).is_err());
        let mut bad_class = b;
        bad_class[0] = 77;
        assert!(ChunkState::decode(&bad_class).is_err());
        let mut no_class = b;
        no_class[0..8].fill(0);
        assert!(ChunkState::decode(&no_class).is_err());
    }

    #[test]
    fn blocks_are_taken_lowest_first_and_chunks_change_class_once_empty() {
        let g = Geometry {
            base: 0,
            header_bytes: CHUNK,
            chunks: 2,
        };
        let mut s = SmallChunks::default();
        s.add_segment(g, Box::new([ChunkState::default(); 2]));
        let c = class_of(4000);
        let a = s.take(c).unwrap();
        let b = s.take(c).unwrap();
        assert_eq!((a.chunk, a.block, b.block), (CHUNK, 0, 1));
        let d = s.take(c).unwrap();
        assert_eq!((d.chunk, d.block), (2 * CHUNK, 0), "chunk 1 is full");
        assert!(!s.give_back(a), "its chunk still holds b");
        assert_eq!(s.take(c).unwrap(), a, "a partial chunk is used first");
        let emptied: Vec<bool> = [a, b, d].into_iter().map(|blk| s.give_back(blk)).collect();
        assert_eq!(
            emptied,
            [false, true, true],
            "each chunk says when it empties"
        );
        assert!(s.all_empty(&g));
        let small = s.take(0).unwrap();
        assert_eq!(
            (small.chunk, small.block),
            (CHUNK, 0),
            "the empty chunk took class 32"
        );
        assert!(s.is_allocated(CHUNK, 0, 0) && !s.is_allocated(CHUNK, c, 0));
        assert_eq!(s.live(), (1, 32));
        assert_eq!(g.block_of(small.offset(), 0), Some((CHUNK, 0)));
        assert_eq!(g.block_of(small.offset() + 8, 0), None);
        assert_eq!(g.block_of(8, 0), None, "among the headers");
        assert_eq!(g.block_of(3 * CHUNK, 0), None, "past the chunks");
        assert_eq!(g.header_of(2 * CHUNK), 64);
        s.give_back(small);
        s.remove_segment(&g);
        assert_eq!(s.live(), (0, 0));
        assert!(s.take(0).is_none(), "no segment left");
    }
}
