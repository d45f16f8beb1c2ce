//! Reading the log: the header of every formatted chunk and the blocks of every chunk in
//! a log. Nothing here judges what it reads; [`super::rules`] does.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::engine::log::chunks::{ChunkGeometry, payload_start};
use crate::engine::log::damage::Damage;
use crate::engine::log::layout::{
    BLOCK_ALIGN, BlockScan, CHUNK_HEADER, ChunkHeader, DecodedBlock, DecodedEntry, HeaderState,
    PREAMBLE, decode_block,
};
use crate::media::Media;

/// Why the run of valid blocks at the start of a chunk's payload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// At an end mark (or the end of the chunk) at this offset.
    End(u32),
    /// At bytes that are neither a valid block nor an end mark, at this offset: a torn
    /// write, or damage.
    Invalid(u32),
}

impl Stop {
    /// Offset of the stop within the chunk.
    pub(crate) fn offset(self) -> u32 {
        match self {
            Stop::End(at) | Stop::Invalid(at) => at,
        }
    }
}

/// One chunk of a log, as read.
#[derive(Debug)]
pub(crate) struct ScannedChunk {
    /// Chunk index.
    pub index: u32,
    pub header: ChunkHeader,
    /// Valid blocks: the run from the start of the payload (`blocks[..run]`), then any
    /// valid block of this chunk's generation found after the stop (`blocks[run..]`);
    /// all in offset order.
    pub blocks: Vec<DecodedBlock>,
    /// The entries of all its blocks, in block order (one list per chunk, not one per
    /// block: recovery reads millions of blocks).
    pub entries: Vec<DecodedEntry>,
    pub run: usize,
    pub stop: Stop,
}

/// A chunk whose header write a crash interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TornHeader {
    pub index: u32,
    pub owner: Option<u32>,
}

/// Everything read from the log.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Chunks with a valid header, by index.
    pub chunks: Vec<ScannedChunk>,
    /// Formatted chunks with a zero header.
    pub free: Vec<u32>,
    pub torn_headers: Vec<TornHeader>,
    /// Chunk headers that are damaged.
    pub problems: Vec<Damage>,
    /// The chunks whose headers are damaged (a salvaging open reclaims them).
    pub damaged_headers: Vec<u32>,
}

/// Reads the first `formatted` chunks.
pub(crate) fn scan(media: &Media, geometry: &ChunkGeometry, formatted: u32) -> Scan {
    let n = formatted.min(geometry.count);
    scan_range(media, geometry, 0..n, &mut Vec::new())
}

/// Reading the chunks with several threads: each takes batches of consecutive chunks
/// ([`Batches::take`]) until none is left; the batches are put back together in chunk
/// order ([`Batches::merge`]), so the result is [`scan`]'s whatever the number of
/// threads.
#[derive(Debug)]
pub(crate) struct Batches {
    /// Chunks to read.
    chunks: u32,
    /// Chunks per batch.
    batch: u32,
    /// The next batch to take.
    next: AtomicU32,
    /// The batches read.
    done: Mutex<Vec<(u32, Scan)>>,
}

impl Batches {
    /// The first `formatted` chunks, for `threads` threads.
    pub(crate) fn new(geometry: &ChunkGeometry, formatted: u32, threads: usize) -> Batches {
        let chunks = formatted.min(geometry.count);
        Batches {
            chunks,
            // Several batches per thread, so that a thread meeting full chunks while
            // another meets free ones (only a header to read) finishes about as soon.
            batch: (chunks / (threads as u32 * 8).max(1)).clamp(1, 256),
            next: AtomicU32::new(0),
            done: Mutex::new(Vec::new()),
        }
    }

    /// Reads batches until none is left (called by each thread).
    pub(crate) fn take(&self, media: &Media, geometry: &ChunkGeometry) {
        let mut mine = Vec::new();
        let mut buf = Vec::new();
        loop {
            let b = self.next.fetch_add(1, Ordering::Relaxed);
            let start = b.saturating_mul(self.batch);
            if start >= self.chunks {
                break;
            }
            let range = start..start.saturating_add(self.batch).min(self.chunks);
            mine.push((b, scan_range(media, geometry, range, &mut buf)));
        }
        self.done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(&mut mine);
    }

    /// Everything read, in chunk order (once every thread is done).
    pub(crate) fn merge(&self) -> Scan {
        let mut parts = std::mem::take(&mut *self.done.lock().unwrap_or_else(|p| p.into_inner()));
        parts.sort_unstable_by_key(|&(b, _)| b);
        let mut out = Scan::default();
        for (_, mut part) in parts {
            out.chunks.append(&mut part.chunks);
            out.free.append(&mut part.free);
            out.torn_headers.append(&mut part.torn_headers);
            out.problems.append(&mut part.problems);
            out.damaged_headers.append(&mut part.damaged_headers);
        }
        out
    }
}

/// Reads the chunks of `range` (`buf` is scratch space).
pub(super) fn scan_range(
    media: &Media,
    geometry: &ChunkGeometry,
    range: std::ops::Range<u32>,
    buf: &mut Vec<u8>,
) -> Scan {
    let mut out = Scan::default();
    buf.resize(geometry.size as usize, 0);
    let mut head = [0u8; CHUNK_HEADER];
    for c in range {
        let at = geometry.offset(c);
        media.read(at as usize, &mut head);
        match HeaderState::of(&head) {
            HeaderState::Free => out.free.push(c),
            HeaderState::Torn { owner } => out.torn_headers.push(TornHeader { index: c, owner }),
            HeaderState::Damaged => {
                out.problems.push(Damage::at(
                    at,
                    format!("the header of chunk {c} is damaged"),
                ));
                out.damaged_headers.push(c);
            }
            HeaderState::Valid(header) => {
                media.read(at as usize, buf);
                out.chunks.push(scan_chunk(buf, c, header));
            }
        }
    }
    out
}

/// Reads the blocks of one chunk (`bytes` is the whole chunk).
fn scan_chunk(bytes: &[u8], index: u32, header: ChunkHeader) -> ScannedChunk {
    let mut blocks = Vec::new();
    let mut entries = Vec::new();
    let mut offset = payload_start() as usize;
    let stop = loop {
        match decode_block(bytes, index, header.generation, offset, &mut entries) {
            BlockScan::Block(b) => {
                offset = b.end as usize;
                blocks.push(b);
            }
            BlockScan::End => break Stop::End(offset as u32),
            BlockScan::Invalid => break Stop::Invalid(offset as u32),
        }
    };
    let run = blocks.len();
    // Nothing of this chunk's generation may follow the stop except the rest of a
    // transaction whose write a crash interrupted; look for it at every block position.
    let mut at = offset + BLOCK_ALIGN;
    while at + PREAMBLE <= bytes.len() {
        match decode_block(bytes, index, header.generation, at, &mut entries) {
            BlockScan::Block(b) => {
                at = b.end as usize;
                blocks.push(b);
            }
            BlockScan::End | BlockScan::Invalid => at += BLOCK_ALIGN,
        }
    }
    debug_assert!(blocks.windows(2).all(|w| w[0].offset < w[1].offset));
    ScannedChunk {
        index,
        header,
        blocks,
        entries,
        run,
        stop,
    }
}

impl ScannedChunk {
    /// The entries of `block`, one of this chunk's blocks.
    pub(crate) fn entries_of(&self, block: &DecodedBlock) -> &[DecodedEntry] {
        block.entries_in(&self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::log::layout::{END_MARK, EntryRef, LogKind, encode_block};

    fn chunk_with(blocks: &[(usize, u64)], generation: u64) -> Vec<u8> {
        let mut bytes = vec![0u8; 4096];
        let data = [3u8; 40];
        let mut buf = Vec::new();
        for &(at, version) in blocks {
            let e = [EntryRef {
                home: 1 << 20,
                tombstone: false,
                data: &data,
            }];
            encode_block(&mut buf, 2, generation, version, 64, e.iter().copied());
            bytes[at..at + buf.len()].copy_from_slice(&buf);
        }
        bytes
    }

    fn header() -> ChunkHeader {
        ChunkHeader {
            kind: LogKind::Update,
            zeroed: false,
            owner: 1,
            generation: 5,
            prev: None,
            seq: 0,
        }
    }

    #[test]
    fn a_run_ends_at_an_end_mark_and_blocks_after_it_are_found() {
        // Blocks of 24 + 8 + 40 = 72 -> 80 bytes, at 64 and 144; an end mark at 224;
        // then a block of the same generation further on.
        let bytes = chunk_with(&[(64, 1), (144, 2), (224 + END_MARK + 32, 3)], 5);
        let c = scan_chunk(&bytes, 2, header());
        assert_eq!(c.run, 2);
        assert_eq!(c.stop, Stop::End(224));
        assert_eq!(c.blocks.len(), 3);
        assert_eq!(c.blocks[2].version, 3);
    }

    #[test]
    fn torn_bytes_stop_the_run_and_stale_blocks_are_not_found() {
        let mut bytes = chunk_with(&[(64, 1)], 5);
        let stale = chunk_with(&[(400, 9)], 4);
        bytes[400..480].copy_from_slice(&stale[400..480]);
        bytes[150] = 0xee; // a torn write after the first block
        let c = scan_chunk(&bytes, 2, header());
        assert_eq!(c.run, 1);
        assert_eq!(c.stop, Stop::Invalid(144));
        assert_eq!(
            c.blocks.len(),
            1,
            "a block of an older generation is not this log's"
        );
    }
}
