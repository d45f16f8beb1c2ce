//! Chunks: the pool's data area cut into fixed-size pieces (32 KiB by default), a global
//! pool of free chunks, per-chunk live-byte counts (for the cleaner), and the log tails
//! of each log set (000_70bf7223c84ebbe9.txt §3.3).

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use super::layout::{CHUNK_HEADER, ChunkHeader, LogKind};

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

    /// Pool offset of chunk `c`.
    pub(crate) fn offset(&self, c: u32) -> u64 {
        self.start + c as u64 * self.size
    }

    /// The chunk holding pool offset `at`.
    pub(crate) fn chunk_of(&self, at: u64) -> u32 {
        ((at - self.start) / self.size) as u32
    }
}

/// The chunks not in any log, and accounting over all chunks.
#[derive(Debug)]
pub(crate) struct ChunkPool {
    free: Mutex<Vec<u32>>,
    /// Live (mapped) data bytes per chunk.
    live: Box<[AtomicI64]>,
    next_generation: AtomicU64,
}

impl ChunkPool {
    /// A pool with the given free chunks; new chunk generations start above `generation`.
    pub(crate) fn new(geometry: ChunkGeometry, mut free: Vec<u32>, generation: u64) -> ChunkPool {
        // Hand out low chunks first.
        free.sort_unstable_by(|a, b| b.cmp(a));
        ChunkPool {
            free: Mutex::new(free),
            live: (0..geometry.count).map(|_| AtomicI64::new(0)).collect(),
            next_generation: AtomicU64::new(generation + 1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a free chunk and a fresh generation for it.
    pub(crate) fn take(&self) -> Option<(u32, u64)> {
        let c = self.lock().pop()?;
        Some((c, self.next_generation.fetch_add(1, Ordering::Relaxed)))
    }

    /// Returns chunks that were taken but never written.
    pub(crate) fn give_back(&self, chunks: impl IntoIterator<Item = u32>) {
        self.lock().extend(chunks);
    }

    /// Number of free chunks.
    pub(crate) fn free_count(&self) -> usize {
        self.lock().len()
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
}

/// One committer's three logs (update, allocation, deallocation). A committing
/// transaction checks a log set out, so concurrent commits append to different logs.
#[derive(Debug)]
pub(crate) struct LogSet {
    pub id: u32,
    pub tails: [LogTail; 3],
    /// Where blocks are encoded before they are written (reused by every commit).
    pub scratch: Vec<u8>,
}

impl LogSet {
    pub(crate) fn new(id: u32) -> LogSet {
        LogSet {
            id,
            tails: [LogTail::default(); 3],
            scratch: Vec::new(),
        }
    }

    /// The header of the chunk that follows `tail` in log `kind`.
    pub(crate) fn next_header(
        &self,
        kind: LogKind,
        tail: Option<TailChunk>,
        generation: u64,
    ) -> ChunkHeader {
        ChunkHeader {
            kind,
            owner: self.id,
            generation,
            prev: tail.map(|t| t.chunk),
            seq: tail.map_or(0, |t| t.seq + 1),
        }
    }
}

/// Bytes of a chunk available to blocks.
pub(crate) fn payload_start() -> u32 {
    CHUNK_HEADER as u32
}
