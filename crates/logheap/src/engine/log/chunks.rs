//! Chunks: the pool's data area cut into fixed-size pieces (32 KiB by default), a global
//! pool of free chunks that formats more as the logs grow, per-chunk live-byte counts (for
//! the cleaner), and the log tails of each log set ("Log-structured Non-volatile Main
//! Memory", USENIX ATC 2017, §3.3).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::layout::{CHUNK_HEADER, ChunkHeader, LogKind};
use super::log_writer::Plan;
use super::superblock::Superblock;
use crate::media::Media;

/// Where chunks are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkGeometry {
    /// Pool offset of chunk 0.
    pub start: u64,
    /// Bytes per chunk.
    pub size: u64,
    /// Number of chunks.
    pub count: u32,
}

impl ChunkGeometry {
    /// The chunks that fit in the data area `[start, end)`.
    pub(crate) fn new(start: u64, end: u64, size: u64) -> ChunkGeometry {
        let count = ((end - start) / size).min(u32::MAX as u64 - 1) as u32;
        ChunkGeometry { start, size, count }
    }

    /// The chunks of a pool with `header`.
    pub(crate) fn of(header: &crate::pool::Header) -> ChunkGeometry {
        let data = &header.layout.data;
        ChunkGeometry::new(data.start, data.end, header.chunk_size)
    }

    /// Pool offset of chunk `c`.
    pub(crate) fn offset(&self, c: u32) -> u64 {
        self.start + c as u64 * self.size
    }

    /// The chunk holding pool offset `at`.
    pub(crate) fn chunk_of(&self, at: u64) -> u32 {
        ((at - self.start) / self.size) as u32
    }
}

/// The chunks not in any log, the formatting of chunks as the logs grow, and accounting
/// over all chunks.
#[derive(Debug)]
pub(crate) struct ChunkPool {
    media: Arc<Media>,
    superblock: Superblock,
    geometry: ChunkGeometry,
    state: Mutex<FreeChunks>,
    /// Live (mapped) data bytes per chunk.
    live: Box<[AtomicI64]>,
    next_generation: AtomicU64,
}

#[derive(Debug)]
struct FreeChunks {
    /// Formatted chunks in no log, lowest last.
    free: Vec<u32>,
    /// Chunks below this index are formatted (their headers are valid or zero).
    formatted: u32,
    /// Chunks in a log.
    in_use: u32,
}

/// A chunk taken from the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TakenChunk {
    pub chunk: u32,
    /// A fresh generation for it.
    pub generation: u64,
    /// Its payload is all zeros.
    pub zero_payload: bool,
}

/// Chunks formatted at a time: a quarter of those formatted so far, within these bounds.
/// A new pool starts with the first `FORMAT_STEP_MIN` formatted.
pub(crate) const FORMAT_STEP_MIN: u32 = 64;
const FORMAT_STEP_MAX: u32 = 16_384;

impl ChunkPool {
    /// A pool whose first `formatted` chunks are formatted, of which `free` are in no
    /// log; new chunk generations start above `generation`.
    pub(crate) fn new(
        media: Arc<Media>,
        superblock: Superblock,
        geometry: ChunkGeometry,
        mut free: Vec<u32>,
        formatted: u32,
        generation: u64,
    ) -> ChunkPool {
        // Hand out low chunks first.
        free.sort_unstable_by(|a, b| b.cmp(a));
        let in_use = formatted - free.len() as u32;
        ChunkPool {
            media,
            superblock,
            geometry,
            state: Mutex::new(FreeChunks {
                free,
                formatted,
                in_use,
            }),
            live: (0..geometry.count).map(|_| AtomicI64::new(0)).collect(),
            next_generation: AtomicU64::new(generation + 1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FreeChunks> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a free chunk, formatting more chunks when none is left; `None` when every
    /// chunk is in a log.
    pub(crate) fn take(&self) -> Option<TakenChunk> {
        let chunk = {
            let mut st = self.lock();
            if st.free.is_empty() {
                self.format_more(&mut st);
            }
            let chunk = st.free.pop()?;
            st.in_use += 1;
            chunk
        };
        // A chunk that was never in a log is usually all zeros: then its blocks need no
        // end mark after them (the zeros are one). Reused chunks hold stale bytes. One
        // read of the chunk tells, once per chunk's turn in a log.
        let start = self.geometry.offset(chunk) as usize + CHUNK_HEADER;
        let end = self.geometry.offset(chunk + 1) as usize;
        let mut piece = [0u8; 512];
        let zero_payload = (start..end).step_by(piece.len()).all(|at| {
            let piece = &mut piece[..(end - at).min(512)];
            self.media.read(at, piece);
            piece.iter().all(|&b| b == 0)
        });
        Some(TakenChunk {
            chunk,
            generation: self.next_generation.fetch_add(1, Ordering::Relaxed),
            zero_payload,
        })
    }

    /// Formats the next batch of chunks: their header lines are zeroed (they may hold
    /// bytes of a former life of the file) and made durable, then the formatted count
    /// is raised durably. Until the count is durable nothing is written to them, so
    /// recovery never needs to look past it.
    fn format_more(&self, st: &mut FreeChunks) {
        let step = (st.formatted / 4).clamp(FORMAT_STEP_MIN, FORMAT_STEP_MAX);
        let end = st.formatted.saturating_add(step).min(self.geometry.count);
        if end == st.formatted {
            return;
        }
        let mut head = [0u8; CHUNK_HEADER];
        let mut wrote = false;
        for c in st.formatted..end {
            let at = self.geometry.offset(c) as usize;
            self.media.read(at, &mut head);
            if head.iter().any(|&b| b != 0) {
                self.media.write(at, &[0u8; CHUNK_HEADER]);
                self.media.flush(at, CHUNK_HEADER);
                wrote = true;
            }
        }
        if wrote {
            self.media.fence();
        }
        self.superblock.write_formatted(&self.media, end);
        st.free.extend((st.formatted..end).rev());
        st.formatted = end;
    }

    /// Returns chunks that were taken but never written.
    pub(crate) fn give_back(&self, chunks: impl IntoIterator<Item = TakenChunk>) {
        let mut st = self.lock();
        let before = st.free.len();
        st.free.extend(chunks.into_iter().map(|t| t.chunk));
        st.in_use -= (st.free.len() - before) as u32;
    }

    /// Every chunk in no log: the formatted ones (lowest first), then those not yet
    /// formatted.
    pub(crate) fn unused(&self) -> Vec<u32> {
        let st = self.lock();
        let mut out: Vec<u32> = st.free.iter().rev().copied().collect();
        out.extend(st.formatted..self.geometry.count);
        out
    }

    /// Chunks in no log (formatted or not).
    pub(crate) fn free_count(&self) -> u64 {
        self.geometry.count as u64 - self.in_use()
    }

    /// Chunks in a log.
    pub(crate) fn in_use(&self) -> u64 {
        self.lock().in_use as u64
    }

    /// Adjusts chunk `c`'s live bytes.
    pub(crate) fn add_live(&self, c: u32, delta: i64) {
        if let Some(l) = self.live.get(c as usize) {
            l.fetch_add(delta, Ordering::Relaxed);
        }
    }

    /// Live bytes over all chunks.
    pub(crate) fn total_live_bytes(&self) -> i64 {
        self.live.iter().map(|l| l.load(Ordering::Relaxed)).sum()
    }
}

/// The append position of one log.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LogTail {
    /// Current chunk, its generation and sequence number in the log, and the offset of
    /// the next block within it.
    pub current: Option<TailChunk>,
}

/// The chunk a log appends to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TailChunk {
    pub chunk: u32,
    pub generation: u64,
    pub seq: u32,
    pub offset: u32,
    /// Everything from `offset` to the end of the chunk is zero, so a commit needs no
    /// end mark after its blocks.
    pub zero_rest: bool,
}

/// One committer's three logs (update, allocation, deallocation). A committing
/// transaction checks a log set out, so concurrent commits append to different logs.
#[derive(Debug)]
pub(crate) struct LogSet {
    pub id: u32,
    pub tails: [LogTail; 3],
    /// Where blocks are encoded before they are written (reused by every commit).
    pub scratch: Vec<u8>,
    /// Where commits are planned (reused by every commit).
    pub plan: Plan,
    /// What this open appended through the set (counted here, where only the committer
    /// holding the set writes, rather than in counters every committer shares).
    pub appended: Appended,
}

/// Transactions and blocks appended, and the largest version.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Appended {
    pub transactions: u64,
    pub blocks: u64,
    pub max_version: u64,
    /// The appended blocks' share of the log's fingerprint
    /// ([`block_digest`](super::layout::block_digest)).
    pub digest: u64,
}

impl Appended {
    /// Counts one appended transaction of `blocks` blocks at `version`, whose blocks'
    /// share of the log's fingerprint is `digest`.
    pub(crate) fn record(&mut self, blocks: usize, version: u64, digest: u64) {
        self.digest ^= digest;
        self.transactions += 1;
        self.blocks += blocks as u64;
        self.max_version = self.max_version.max(version);
    }
}

impl LogSet {
    pub(crate) fn new(id: u32) -> LogSet {
        LogSet {
            id,
            tails: [LogTail::default(); 3],
            scratch: Vec::new(),
            plan: Plan::default(),
            appended: Appended::default(),
        }
    }

    /// The header of chunk `taken` when it follows `tail` in log `kind`.
    pub(crate) fn next_header(
        &self,
        kind: LogKind,
        tail: Option<TailChunk>,
        taken: &TakenChunk,
    ) -> ChunkHeader {
        ChunkHeader {
            kind,
            zeroed: taken.zero_payload,
            owner: self.id,
            generation: taken.generation,
            prev: tail.map(|t| t.chunk),
            seq: tail.map_or(0, |t| t.seq + 1),
        }
    }
}

/// Bytes of a chunk available to blocks.
pub(crate) fn payload_start() -> u32 {
    CHUNK_HEADER as u32
}
