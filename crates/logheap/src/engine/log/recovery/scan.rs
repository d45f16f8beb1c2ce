//! Reading the log: the header of every formatted chunk and the blocks of every chunk in
//! a log. Nothing here judges what it reads; [`super::rules`] does.

use super::Damage;
use crate::engine::log::chunks::{ChunkGeometry, payload_start};
use crate::engine::log::layout::{
    BLOCK_ALIGN, BlockScan, CHUNK_HEADER, ChunkHeader, DecodedBlock, HeaderState, PREAMBLE,
    decode_block,
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
    /// valid block of this chunk's generation found after the stop (`blocks[run..]`).
    pub blocks: Vec<DecodedBlock>,
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
}

/// Reads the first `formatted` chunks.
pub(crate) fn scan(media: &Media, geometry: &ChunkGeometry, formatted: u32) -> Scan {
    let mut out = Scan::default();
    let mut buf = vec![0u8; geometry.size as usize];
    let mut head = [0u8; CHUNK_HEADER];
    for c in 0..formatted.min(geometry.count) {
        let at = geometry.offset(c);
        media.read(at as usize, &mut head);
        match HeaderState::of(&head) {
            HeaderState::Free => out.free.push(c),
            HeaderState::Torn { owner } => out.torn_headers.push(TornHeader { index: c, owner }),
            HeaderState::Damaged => out.problems.push(Damage::at(
                at,
                format!("the header of chunk {c} is damaged"),
            )),
            HeaderState::Valid(header) => {
                media.read(at as usize, &mut buf);
                out.chunks.push(scan_chunk(&buf, c, header));
            }
        }
    }
    out
}

/// Reads the blocks of one chunk (`bytes` is the whole chunk).
fn scan_chunk(bytes: &[u8], index: u32, header: ChunkHeader) -> ScannedChunk {
    let mut blocks = Vec::new();
    let mut offset = payload_start() as usize;
    let stop = loop {
        match decode_block(bytes, index, header.generation, offset) {
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
        match decode_block(bytes, index, header.generation, at) {
            BlockScan::Block(b) => {
                at = b.end as usize;
                blocks.push(b);
            }
            BlockScan::End | BlockScan::Invalid => at += BLOCK_ALIGN,
        }
    }
    ScannedChunk {
        index,
        header,
        blocks,
        run,
        stop,
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
