//! Appending a transaction to its log set (000_70bf7223c84ebbe9.txt §4.2): the entries
//! of each log are packed into transaction blocks, splitting an entry where a chunk ends
//! and continuing in a new chunk; all blocks of the transaction, in all three logs, are
//! linked into one cycle by their peer pointers. Blocks and new chunk headers are written
//! with non-temporal stores and made durable by a single fence.

use super::chunks::{ChunkGeometry, ChunkPool, LogSet, TailChunk, payload_start};
use super::layout::{
    ChunkHeader, ENTRY_HEADER, EntryRef, LogKind, MAX_BLOCK_ENTRIES, PREAMBLE, block_size,
    encode_block,
};
use crate::media::Media;

/// Entries shorter than this are moved whole to the next chunk rather than split.
const MIN_SPLIT: usize = 64;
/// Bytes zeroed at a seal: a preamble, rounded up to the block alignment.
const SEAL_BYTES: usize = PREAMBLE.next_multiple_of(super::layout::BLOCK_ALIGN);

/// A data entry's final place: `len` bytes for `home` at pool offset `log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub kind: LogKind,
    pub home: u64,
    pub len: u64,
    pub log: u64,
}

/// The pool has no free chunk for the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfChunks;

struct PlannedBlock<'a> {
    kind: LogKind,
    chunk: u32,
    generation: u64,
    offset: u32,
    new_header: Option<ChunkHeader>,
    entries: Vec<EntryRef<'a>>,
}

/// What planning a transaction produces.
#[derive(Default)]
struct Plan<'a> {
    blocks: Vec<PlannedBlock<'a>>,
    /// Chunks taken from the pool.
    taken: Vec<u32>,
    /// Pool offsets where a sealed chunk's written part ends: a zeroed preamble goes
    /// there, so recovery reads the end of the chunk, not stale bytes of a former use.
    seals: Vec<u64>,
}

impl PlannedBlock<'_> {
    fn size(&self) -> usize {
        block_size(
            self.entries.len(),
            self.entries.iter().map(|e| e.data.len()).sum(),
        )
    }
}

/// Appends transactions to log sets on one media.
pub(crate) struct LogWriter<'e> {
    pub media: &'e Media,
    pub geometry: &'e ChunkGeometry,
    pub pool: &'e ChunkPool,
}

/// Ends appends to `t`'s chunk: where room for a preamble is left, a zeroed one is
/// planned at the tail, so recovery reads the end of the chunk there.
fn seal(geometry: &ChunkGeometry, t: &mut TailChunk, seals: &mut Vec<u64>) {
    if geometry.size as usize - t.offset as usize >= PREAMBLE {
        seals.push(geometry.offset(t.chunk) + t.offset as u64);
    }
    t.offset = geometry.size as u32;
}

impl LogWriter<'_> {
    /// Plans one log's blocks, advancing `tail`; new chunks and seals go into `plan`.
    fn plan_log<'a>(
        &self,
        kind: LogKind,
        set: &LogSet,
        tail: &mut Option<TailChunk>,
        entries: &[EntryRef<'a>],
        plan: &mut Plan<'a>,
    ) -> Result<(), OutOfChunks> {
        let (geometry, pool) = (self.geometry, self.pool);
        let chunk_size = geometry.size as usize;
        let mut block: Option<PlannedBlock<'a>> = None;
        let mut new_header: Option<ChunkHeader> = None;
        let close = |block: &mut Option<PlannedBlock<'a>>,
                     tail: &mut Option<TailChunk>,
                     out: &mut Vec<PlannedBlock<'a>>| {
            if let Some(b) = block.take() {
                if let Some(t) = tail.as_mut() {
                    t.offset += b.size() as u32;
                }
                out.push(b);
            }
        };
        for entry in entries {
            let mut e = *entry;
            loop {
                if block.is_none() {
                    let need = block_size(1, e.data.len().min(MIN_SPLIT));
                    let fits = tail.is_some_and(|t| t.offset as usize + need <= chunk_size);
                    if !fits {
                        let (chunk, generation) = pool.take().ok_or(OutOfChunks)?;
                        plan.taken.push(chunk);
                        if let Some(t) = tail {
                            seal(geometry, t, &mut plan.seals);
                        }
                        let header = set.next_header(kind, *tail, generation);
                        *tail = Some(TailChunk {
                            chunk,
                            generation,
                            seq: header.seq,
                            offset: payload_start(),
                        });
                        new_header = Some(header);
                    }
                    let t = tail.expect("a tail chunk was just ensured");
                    block = Some(PlannedBlock {
                        kind,
                        chunk: t.chunk,
                        generation: t.generation,
                        offset: t.offset,
                        new_header: new_header.take(),
                        entries: Vec::new(),
                    });
                }
                let b = block.as_mut().expect("a block was just opened");
                let room = chunk_size - b.offset as usize;
                let data: usize = b.entries.iter().map(|x| x.data.len()).sum();
                let n = b.entries.len();
                if n < MAX_BLOCK_ENTRIES && block_size(n + 1, data + e.data.len()) <= room {
                    b.entries.push(e);
                    break;
                }
                if n >= MAX_BLOCK_ENTRIES {
                    // The block is full by count; a new block may still fit in this chunk.
                    close(&mut block, tail, &mut plan.blocks);
                    continue;
                }
                // Out of room: split the entry if a useful part fits, then go to a new chunk
                // (a new block here would only have less room than this one had).
                let fixed = PREAMBLE + (n + 1) * ENTRY_HEADER + data;
                let split = room.saturating_sub(fixed);
                if !e.tombstone && split >= MIN_SPLIT && split < e.data.len() {
                    b.entries.push(EntryRef {
                        home: e.home,
                        tombstone: false,
                        data: &e.data[..split],
                    });
                    e = EntryRef {
                        home: e.home + split as u64,
                        tombstone: false,
                        data: &e.data[split..],
                    };
                }
                close(&mut block, tail, &mut plan.blocks);
                if let Some(t) = tail.as_mut() {
                    seal(geometry, t, &mut plan.seals);
                }
            }
        }
        close(&mut block, tail, &mut plan.blocks);
        Ok(())
    }

    /// Writes one transaction's entries (per log: update, allocation, deallocation) at
    /// `version` and makes them durable with one fence (`fence` is false only for fault
    /// injection). Returns where each data entry's bytes
    /// went. On [`OutOfChunks`] nothing was written and the log set is unchanged.
    pub(crate) fn append(
        &self,
        set: &mut LogSet,
        logs: [&[EntryRef<'_>]; 3],
        version: u64,
        fence: bool,
    ) -> Result<Vec<Placed>, OutOfChunks> {
        let (media, geometry, pool) = (self.media, self.geometry, self.pool);
        let mut tails = set.tails.map(|t| t.current);
        let mut plan = Plan::default();
        for kind in LogKind::ALL {
            let entries = logs[kind.index()];
            if entries.is_empty() {
                continue;
            }
            let tail = &mut tails[kind.index()];
            if let Err(e) = self.plan_log(kind, set, tail, entries, &mut plan) {
                pool.give_back(plan.taken);
                return Err(e);
            }
        }
        let blocks = plan.blocks;
        for &at in &plan.seals {
            media.write_nt(at as usize, &[0u8; SEAL_BYTES]);
        }
        let address = |b: &PlannedBlock<'_>| geometry.offset(b.chunk) + b.offset as u64;
        let mut placed = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            let chunk_at = geometry.offset(b.chunk);
            if let Some(h) = &b.new_header {
                media.write_nt(chunk_at as usize, &h.encode());
            }
            let at = address(b);
            let peer = address(&blocks[(i + 1) % blocks.len()]);
            encode_block(
                &mut set.scratch,
                b.chunk,
                b.generation,
                version,
                peer,
                &b.entries,
            );
            media.write_nt(at as usize, &set.scratch);
            let mut data_at = at + PREAMBLE as u64;
            for e in &b.entries {
                data_at += ENTRY_HEADER as u64;
                if !e.tombstone {
                    placed.push(Placed {
                        kind: b.kind,
                        home: e.home,
                        len: e.data.len() as u64,
                        log: data_at,
                    });
                }
                data_at += e.data.len() as u64;
            }
        }
        if fence {
            media.fence();
        }
        for kind in LogKind::ALL {
            set.tails[kind.index()].current = tails[kind.index()];
        }
        Ok(placed)
    }
}
