//! Chunks: the pool's data area cut into fixed-size pieces (32 KiB by default), a global
//! pool of free chunks that formats more as the logs grow, per-chunk live-byte counts (for
//! the cleaner), and the chunk each log appends to ("Log-structured Non-volatile Main
//! Memory", USENIX ATC 2017, §3.3). The log sets (each a committer's four logs) are in
//! [`super::log_writer`].

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::chunk_checks::ChunkChecks;
use super::layout::{CHUNK_HEADER, ChunkHeader, LogKind, header_erase_order};
use super::superblock::LogSuperblock;
use crate::media::Media;
use crate::sync::lock;

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
    pub(crate) fn of(header: &crate::file::Header) -> ChunkGeometry {
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
    superblock: LogSuperblock,
    geometry: ChunkGeometry,
    state: Mutex<FreeChunks>,
    /// Live (mapped) data bytes per chunk.
    live: Box<[AtomicI64]>,
    /// Per chunk: it is in a log but no log appends to it any more (not a log's tail),
    /// so everything in it is committed and the cleaner may take it.
    sealed: Box<[AtomicBool]>,
    /// Per chunk: the committed blocks in it, for the clean-close record, the log's
    /// fingerprint and the cleaner (a chunk's largest version).
    books: Box<[Book]>,
    /// Per chunk: whether its blocks were read and found as the clean-close snapshot
    /// recorded them (after an open that loaded it without reading the log).
    checks: ChunkChecks,
    /// Chunks the cleaner reclaimed, waiting for readers to leave them.
    released: Arc<Released>,
    /// Each chunk's neighbours in its log, as their durable headers say.
    links: Mutex<Links>,
    /// Per chunk: it is in an allocation or deallocation log (its records leave the
    /// pool through allocation checkpoints: [`super::checkpoint`]).
    records: Box<[AtomicBool]>,
    /// Sealed chunks of allocation and deallocation logs.
    sealed_records: AtomicU64,
    /// Free chunks kept from committers for an allocation checkpoint
    /// ([`hold_for_checkpoint`](Self::hold_for_checkpoint)).
    checkpoint_reserve: AtomicU64,
    /// Chunks in a log (taken and not given back or reclaimed; an allocation
    /// checkpoint's too): kept apart from the free-chunk state so that committers check
    /// how many are free without taking a lock.
    in_log: AtomicU64,
    next_generation: AtomicU64,
}

/// Each chunk's neighbours in its log: the chunk its header names as previous, and the
/// chunk whose header names it (`NO_LINK` for none). Kept so that the cleaner can take
/// a chunk out of the middle of its log's chain ([`ChunkPool::unlink`]); its lock also
/// makes chain changes one at a time.
#[derive(Debug)]
struct Links {
    prev: Box<[u32]>,
    next: Box<[u32]>,
}

/// No neighbour in [`Links`].
const NO_LINK: u32 = u32::MAX;

/// What the committed blocks of one chunk add up to: fixed-size counters, so booking a
/// block allocates nothing (the number of distinct versions, which does not add up over
/// chunks, is counted from the log itself when the pool is closed:
/// [`recovery::committed_transactions`](super::recovery::committed_transactions)).
#[derive(Debug, Default)]
struct Book {
    /// Blocks.
    blocks: AtomicU64,
    /// Their largest version (0 if none).
    max_version: AtomicU64,
    /// Their share of the log's fingerprint
    /// ([`block_digest`](super::layout::block_digest)).
    digest: AtomicU64,
    /// Offset in the chunk where its last block ends (0 if none).
    end: AtomicU32,
    /// Entries of the blocks.
    entries: AtomicU64,
    /// Data bytes of those entries.
    data: AtomicU64,
}

impl Book {
    fn clear(&self) {
        self.blocks.store(0, Ordering::Relaxed);
        self.max_version.store(0, Ordering::Relaxed);
        self.digest.store(0, Ordering::Relaxed);
        self.end.store(0, Ordering::Relaxed);
        self.entries.store(0, Ordering::Relaxed);
        self.data.store(0, Ordering::Relaxed);
    }

    fn add(&self, book: ChunkBook) {
        self.blocks.fetch_add(book.blocks, Ordering::Relaxed);
        self.max_version
            .fetch_max(book.max_version, Ordering::Relaxed);
        self.digest.fetch_xor(book.digest, Ordering::Relaxed);
        self.end.fetch_max(book.end, Ordering::Relaxed);
        self.entries.fetch_add(book.entries, Ordering::Relaxed);
        self.data.fetch_add(book.data, Ordering::Relaxed);
    }
}

/// One chunk's book as values: what the committed blocks in it add up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ChunkBook {
    /// Blocks.
    pub blocks: u64,
    /// Their largest version (0 if none).
    pub max_version: u64,
    /// Their share of the log's fingerprint.
    pub digest: u64,
    /// Offset in the chunk where the last of them ends (0 if none).
    pub end: u32,
    /// Entries of the blocks (0 when not known: read from a snapshot that did not
    /// record them).
    pub entries: u64,
    /// Data bytes of those entries (0 when not known).
    pub data: u64,
}

impl ChunkBook {
    /// The book of one block: of `version`, fingerprint share `digest`, ending at
    /// `end`, holding `entries` entries of `data` data bytes in all.
    pub(crate) fn block(version: u64, digest: u64, end: u32, entries: u64, data: u64) -> Self {
        ChunkBook {
            blocks: 1,
            max_version: version,
            digest,
            end,
            entries,
            data,
        }
    }

    /// The book of decoded block `b` of chunk `chunk`, whose entries are `entries`.
    pub(crate) fn of_block(
        chunk: u32,
        b: &super::layout::DecodedBlock,
        entries: &[super::layout::DecodedEntry],
    ) -> Self {
        let data = entries.iter().map(|e| e.size as u64).sum();
        let digest = super::layout::block_digest(chunk, b.offset, b.crc);
        ChunkBook::block(b.version, digest, b.end, entries.len() as u64, data)
    }

    /// Adds the blocks of `other`.
    pub(crate) fn add(&mut self, other: ChunkBook) {
        self.blocks += other.blocks;
        self.max_version = self.max_version.max(other.max_version);
        self.digest ^= other.digest;
        self.end = self.end.max(other.end);
        self.entries += other.entries;
        self.data += other.data;
    }

    /// `live` data bytes of the chunk with their share of entry headers (as many per
    /// data byte as its entries have on average): what moving them costs, and what
    /// they take in a log packed tight. `live` when the entries are not known.
    pub(crate) fn with_headers(&self, live: i64) -> i64 {
        if self.data == 0 || live <= 0 {
            return live;
        }
        let headers = self.entries as u128 * super::layout::ENTRY_HEADER as u128;
        // Saturating: the counts may come from a snapshot (checksummed, but never
        // trusted to be small).
        let extra = (live as u128).saturating_mul(headers) / self.data as u128;
        live.saturating_add(extra.min(i64::MAX as u128) as i64)
    }
}

/// Chunks reclaimed by the cleaner: `waiting` of them are in their grace period (a
/// reader may still be copying from one); those past it are in `ready`.
#[derive(Debug, Default)]
struct Released {
    ready: Mutex<Vec<u32>>,
    waiting: AtomicU64,
}

/// What the chunk books add up to (for the clean-close record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BookTotals {
    /// Committed blocks.
    pub blocks: u64,
    /// Their largest version.
    pub max_version: u64,
    /// The log's fingerprint.
    pub digest: u64,
}

#[derive(Debug)]
struct FreeChunks {
    /// Formatted chunks in no log, lowest last.
    free: Vec<u32>,
    /// Chunks below this index are formatted (their headers are valid or zero).
    formatted: u32,
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

/// Most chunks kept for the cleaner ([`ChunkPool::reserve`]).
const CLEANER_RESERVE: u64 = 4;

/// Chunks formatted at a time: a quarter of those formatted so far, within these bounds.
/// A new pool starts with the first `FORMAT_STEP_MIN` formatted.
pub(crate) const FORMAT_STEP_MIN: u32 = 64;
const FORMAT_STEP_MAX: u32 = 16_384;

impl ChunkPool {
    /// A pool whose first `formatted` chunks are formatted, of which `free` are in no
    /// log; new chunk generations start above `generation`.
    pub(crate) fn new(
        media: Arc<Media>,
        superblock: LogSuperblock,
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
            state: Mutex::new(FreeChunks { free, formatted }),
            live: (0..geometry.count).map(|_| AtomicI64::new(0)).collect(),
            sealed: (0..geometry.count)
                .map(|_| AtomicBool::new(false))
                .collect(),
            books: (0..geometry.count).map(|_| Book::default()).collect(),
            checks: ChunkChecks::new(geometry.count),
            released: Arc::default(),
            records: (0..geometry.count)
                .map(|_| AtomicBool::new(false))
                .collect(),
            sealed_records: AtomicU64::new(0),
            checkpoint_reserve: AtomicU64::new(0),
            in_log: AtomicU64::new(in_use as u64),
            links: Mutex::new(Links {
                prev: vec![NO_LINK; geometry.count as usize].into(),
                next: vec![NO_LINK; geometry.count as usize].into(),
            }),
            next_generation: AtomicU64::new(generation + 1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FreeChunks> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Chunks kept for the cleaner: a committer does not take the last of them, so the
    /// cleaner always has room to move live data to.
    pub(crate) fn reserve(&self) -> u64 {
        (self.geometry.count as u64 / 8).min(CLEANER_RESERVE)
    }

    /// Chunks committers leave alone: the cleaner's [`reserve`](Self::reserve), and
    /// those an allocation checkpoint waits for.
    fn held_back(&self) -> u64 {
        self.reserve() + self.checkpoint_reserve.load(Ordering::Relaxed)
    }

    /// Keeps `chunks` free chunks (beyond the cleaner's reserve, at most a quarter of
    /// the pool) from committers, for an allocation checkpoint that found too few: they
    /// then clean until the free chunks are there (0: none kept).
    pub(crate) fn hold_for_checkpoint(&self, chunks: u64) {
        let most = self.geometry.count as u64 / 4;
        self.checkpoint_reserve
            .store(chunks.min(most), Ordering::Relaxed);
    }

    /// Takes a free chunk for a committer, formatting more chunks when none is left;
    /// `None` when only the cleaner's reserve is left.
    pub(crate) fn take(&self) -> Option<TakenChunk> {
        self.take_as(false)
    }

    /// Takes a free chunk for the cleaner (which may use the reserve).
    pub(crate) fn take_for_cleaner(&self) -> Option<TakenChunk> {
        self.take_as(true)
    }

    fn take_as(&self, cleaner: bool) -> Option<TakenChunk> {
        let chunk = {
            let mut st = self.lock();
            let ready = std::mem::take(&mut *lock(&self.released.ready));
            st.free.extend(ready);
            let available = st.free.len() as u64 + (self.geometry.count - st.formatted) as u64;
            if !cleaner && available <= self.held_back() {
                return None;
            }
            if st.free.is_empty() {
                self.format_more(&mut st);
            }
            let chunk = st.free.pop()?;
            self.in_log.fetch_add(1, Ordering::Relaxed);
            chunk
        };
        self.sealed[chunk as usize].store(false, Ordering::Relaxed);
        debug_assert_eq!(self.books[chunk as usize].blocks.load(Ordering::Relaxed), 0);
        // A chunk that was never in a log is usually all zeros: then its blocks need no
        // end mark after them (the zeros are one). Reused chunks hold stale bytes. One
        // read of the chunk tells, once per chunk's turn in a log.
        let start = self.geometry.offset(chunk) as usize + CHUNK_HEADER;
        let end = self.geometry.offset(chunk + 1) as usize;
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut piece = [0u8; ZEROS.len()];
        let zero_payload = (start..end).step_by(piece.len()).all(|at| {
            let n = (end - at).min(piece.len());
            self.media.read(at, &mut piece[..n]);
            // A slice comparison (memcmp), not a byte loop: a fresh chunk is read whole.
            piece[..n] == ZEROS[..n]
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

    /// Returns chunks that were taken and are in no log (never written, or holding
    /// an allocation checkpoint no longer current) to the free chunks.
    pub(crate) fn give_back(&self, chunks: impl IntoIterator<Item = u32>) {
        let mut st = self.lock();
        let before = st.free.len();
        st.free.extend(chunks);
        let returned = st.free.len() - before;
        self.in_log.fetch_sub(returned as u64, Ordering::Relaxed);
    }

    /// Every chunk in no log: the formatted ones (lowest first), then those not yet
    /// formatted.
    pub(crate) fn unused(&self) -> Vec<u32> {
        let mut st = self.lock();
        let ready = std::mem::take(&mut *lock(&self.released.ready));
        st.free.extend(ready);
        let mut out: Vec<u32> = st.free.iter().rev().copied().collect();
        out.extend(st.formatted..self.geometry.count);
        out
    }

    /// Chunks in no log (formatted or not), including those in their grace period.
    pub(crate) fn free_count(&self) -> u64 {
        self.geometry.count as u64 - self.in_use()
    }

    /// Whether the cleaner could take the free chunks an allocation checkpoint waits
    /// for ([`hold_for_checkpoint`](Self::hold_for_checkpoint); true when none is held).
    pub(crate) fn checkpoint_fits(&self) -> bool {
        let held = self.checkpoint_reserve.load(Ordering::Relaxed);
        self.free_count().saturating_sub(self.waiting()) >= held
    }

    /// Chunks a committer can take now (past their grace period, beyond the reserve).
    pub(crate) fn available(&self) -> u64 {
        let waiting = self.released.waiting.load(Ordering::Relaxed);
        self.free_count()
            .saturating_sub(waiting)
            .saturating_sub(self.held_back())
    }

    /// Chunks in a log (a chunk the cleaner reclaimed leaves its log at once, though it
    /// is taken again only after its grace period).
    pub(crate) fn in_use(&self) -> u64 {
        self.in_log.load(Ordering::Relaxed)
    }

    /// Reclaimed chunks still in their grace period.
    pub(crate) fn waiting(&self) -> u64 {
        self.released.waiting.load(Ordering::Relaxed)
    }

    /// Marks chunk `c` as no log's tail any more.
    pub(crate) fn seal(&self, c: u32) {
        if let Some(s) = self.sealed.get(c as usize)
            && !s.swap(true, Ordering::AcqRel)
            && self.holds_records(c)
        {
            self.sealed_records.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether chunk `c` is in an allocation or deallocation log.
    pub(crate) fn holds_records(&self, c: u32) -> bool {
        self.records
            .get(c as usize)
            .is_some_and(|r| r.load(Ordering::Acquire))
    }

    /// Sealed chunks of allocation and deallocation logs.
    pub(crate) fn sealed_record_chunks(&self) -> u64 {
        self.sealed_records.load(Ordering::Relaxed)
    }

    /// Whether chunk `c` is in a log and no log appends to it.
    pub(crate) fn is_sealed(&self, c: u32) -> bool {
        self.sealed
            .get(c as usize)
            .is_some_and(|s| s.load(Ordering::Acquire))
    }

    /// Records committed blocks in chunk `c`: one as it is written
    /// ([`ChunkBook::block`]), or all of a chunk's at open.
    pub(crate) fn record_book(&self, c: u32, book: ChunkBook) {
        if let Some(b) = self.books.get(c as usize) {
            b.add(book);
        }
    }

    /// Chunk `c`'s book (for the clean-close snapshot).
    pub(crate) fn book_of(&self, c: u32) -> ChunkBook {
        self.books
            .get(c as usize)
            .map_or_else(ChunkBook::default, |b| ChunkBook {
                blocks: b.blocks.load(Ordering::Relaxed),
                max_version: b.max_version.load(Ordering::Relaxed),
                digest: b.digest.load(Ordering::Relaxed),
                end: b.end.load(Ordering::Relaxed),
                entries: b.entries.load(Ordering::Relaxed),
                data: b.data.load(Ordering::Relaxed),
            })
    }

    /// The check state of the chunks ([`ChunkChecks`]).
    pub(crate) fn checks(&self) -> &ChunkChecks {
        &self.checks
    }

    /// Whether the data in chunk `c` may be read: checked, or checked now and found
    /// sound ([`ChunkChecks::readable`]).
    #[inline]
    pub(crate) fn readable(&self, c: u32) -> bool {
        self.checks.readable(&self.media, &self.geometry, c)
    }

    /// The largest version of a block in chunk `c` (0 if none).
    pub(crate) fn max_version_in(&self, c: u32) -> u64 {
        self.books
            .get(c as usize)
            .map_or(0, |b| b.max_version.load(Ordering::Relaxed))
    }

    /// What the books of all chunks add up to.
    pub(crate) fn book_totals(&self) -> BookTotals {
        self.books
            .iter()
            .fold(BookTotals::default(), |t, b| BookTotals {
                blocks: t.blocks + b.blocks.load(Ordering::Relaxed),
                max_version: t.max_version.max(b.max_version.load(Ordering::Relaxed)),
                digest: t.digest ^ b.digest.load(Ordering::Relaxed),
            })
    }

    /// Chunks formatted so far (recovery never needs to look past them).
    pub(crate) fn formatted(&self) -> u32 {
        self.lock().formatted
    }

    /// Records that chunk `c`'s header, durable, names `prev` as the previous chunk of
    /// its log, of `kind`. Called once the header is durable, before `prev` is sealed,
    /// so the cleaner never sees a sealed chunk whose successor it does not know.
    pub(crate) fn link(&self, prev: Option<u32>, c: u32, kind: LogKind) {
        if let Some(r) = self.records.get(c as usize) {
            r.store(!kind.holds_data(), Ordering::Release);
        }
        let mut links = lock(&self.links);
        if let Some(slot) = links.prev.get_mut(c as usize) {
            *slot = prev.unwrap_or(NO_LINK);
        }
        if let Some(slot) = prev.and_then(|p| links.next.get_mut(p as usize)) {
            *slot = c;
        }
    }

    /// Takes chunk `victim` (holding nothing live or committed that is not also
    /// elsewhere) out of its log's chain and erases its header, durably: the chunk
    /// after it is first *repointed* to the chunk before it (its header's last word,
    /// holding the previous chunk and the header CRC, replaced in one untearable 8-byte
    /// store, and fenced), then the victim's header is erased from its last word (so a
    /// crash leaves it torn or free, never damaged) and fenced. The chain of every log
    /// thus stays contiguous, and a chunk header lost to damage is always a broken
    /// chain. A crash between the two steps leaves the victim valid but off its chain,
    /// which recovery recognises and finishes ([`super::recovery`]). `false` (and
    /// nothing written) when the victim has no successor (it is a log's last chunk) or
    /// the successor's header is not valid.
    pub(crate) fn unlink(&self, victim: u32) -> bool {
        let mut links = lock(&self.links);
        let v = victim as usize;
        let Some(&next) = links.next.get(v).filter(|&&n| n != NO_LINK) else {
            return false;
        };
        let prev = links.prev[v];
        let next_at = self.geometry.offset(next) as usize;
        let mut head = [0u8; CHUNK_HEADER];
        self.media.read(next_at, &mut head);
        let Some(header) = ChunkHeader::decode(&head).filter(|h| h.prev == Some(victim)) else {
            return false;
        };
        let repointed = ChunkHeader {
            prev: (prev != NO_LINK).then_some(prev),
            ..header
        };
        let (word_at, word) = repointed.last_word();
        // A pending predecessor is checked while the victim still holds its blocks: a
        // lost end mark at its end is told from damage by the transaction going on at
        // the start of the chunk after it, which is the victim.
        if prev != NO_LINK {
            self.checks.check(&self.media, &self.geometry, prev);
        }
        // A pending check of the successor expects its new previous chunk from now on.
        self.checks.repoint(next, repointed.prev, || {
            self.media.write_u64(next_at + word_at, word);
            self.media.flush(next_at + word_at, 8);
            self.media.fence();
        });
        // The victim leaves its log: a pending check of it is dropped (and one in
        // progress finished) before its header goes.
        self.checks.settle(victim);
        links.prev[next as usize] = prev;
        if prev != NO_LINK {
            links.next[prev as usize] = next;
        }
        let at = self.geometry.offset(victim) as usize;
        for word in header_erase_order() {
            self.media.write_u64(at + word, 0);
        }
        self.media.flush(at, CHUNK_HEADER);
        self.media.fence();
        links.prev[v] = NO_LINK;
        links.next[v] = NO_LINK;
        true
    }

    /// Takes chunk `c` out of the accounting when the cleaner has reclaimed it (its
    /// header is erased) and hands it back to the free chunks once no reader can be in
    /// it any more: after a grace period of `guard`'s collector, which must be the
    /// pool's ([`PoolEpoch`](super::epoch::PoolEpoch), which every reader of the log
    /// pins). The deferred hand-back owns what it touches (it may run after the pool is
    /// gone).
    pub(crate) fn release(&self, c: u32, guard: &crossbeam_epoch::Guard) {
        let was_sealed = self.sealed[c as usize].swap(false, Ordering::AcqRel);
        if self.records[c as usize].swap(false, Ordering::AcqRel) && was_sealed {
            self.sealed_records.fetch_sub(1, Ordering::Relaxed);
        }
        self.books[c as usize].clear();
        self.live[c as usize].store(0, Ordering::Relaxed);
        self.in_log.fetch_sub(1, Ordering::Relaxed);
        self.released.waiting.fetch_add(1, Ordering::Relaxed);
        let released = self.released.clone();
        guard.defer(move || {
            let mut ready = lock(&released.ready);
            ready.push(c);
            released.waiting.fetch_sub(1, Ordering::Relaxed);
        });
        guard.flush();
    }

    /// Live bytes of chunk `c`.
    pub(crate) fn live_of(&self, c: u32) -> i64 {
        self.live
            .get(c as usize)
            .map_or(0, |l| l.load(Ordering::Relaxed))
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

    /// Live bytes of chunk `c` with their entry headers ([`ChunkBook::with_headers`]):
    /// what the cleaner copies to move them.
    pub(crate) fn live_with_headers(&self, c: u32) -> i64 {
        self.book_of(c).with_headers(self.live_of(c))
    }
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

/// Bytes of a chunk available to blocks.
pub(crate) fn payload_start() -> u32 {
    CHUNK_HEADER as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{MediaConfig, SimConfig};

    /// A pool of 64 formatted chunks of 4 KiB, all free.
    fn pool() -> ChunkPool {
        let geometry = ChunkGeometry::new(4096, 4096 + 64 * 4096, 4096);
        let media =
            Arc::new(Media::sim(66 * 4096, &MediaConfig::default(), SimConfig::default()).unwrap());
        ChunkPool::new(
            media,
            LogSuperblock { at: 0 },
            geometry,
            (0..64).collect(),
            64,
            1,
        )
    }

    #[test]
    fn chunks_held_for_a_checkpoint_are_left_to_the_cleaner() {
        let chunks = pool();
        assert_eq!(chunks.available(), 64 - chunks.reserve());
        chunks.hold_for_checkpoint(10);
        assert_eq!(chunks.available(), 64 - chunks.reserve() - 10);
        let mut taken = Vec::new();
        while let Some(t) = chunks.take() {
            taken.push(t.chunk);
        }
        // Committers stop short of the reserve and the checkpoint's chunks...
        assert_eq!(taken.len() as u64, 64 - chunks.reserve() - 10);
        assert!(chunks.checkpoint_fits());
        // ...which the cleaner may take.
        let checkpoint: Vec<_> = (0..10).map_while(|_| chunks.take_for_cleaner()).collect();
        assert_eq!(checkpoint.len(), 10);
        chunks.give_back(checkpoint.iter().map(|t| t.chunk));
        // Held no more: committers take them again. At most a quarter of the pool is held.
        chunks.hold_for_checkpoint(0);
        assert_eq!(chunks.take().map(|_| ()), Some(()));
        // 13 free: held back are the reserve and a quarter of the pool, not 1,000.
        chunks.hold_for_checkpoint(1000);
        assert_eq!(chunks.available(), 0);
        assert!(chunks.take().is_none());
        assert!(!chunks.checkpoint_fits(), "16 held, 13 free");
        chunks.hold_for_checkpoint(5);
        assert_eq!(chunks.available(), 13 - chunks.reserve() - 5);
    }

    #[test]
    fn live_bytes_carry_their_share_of_entry_headers() {
        let mut book = ChunkBook::default();
        // Unknown entries: the live bytes as they are.
        assert_eq!(book.with_headers(1000), 1000);
        book.add(ChunkBook::block(5, 1, 2000, 10, 800));
        book.add(ChunkBook::block(6, 2, 4000, 10, 1200));
        assert_eq!((book.blocks, book.max_version, book.end), (2, 6, 4000));
        assert_eq!((book.entries, book.data, book.digest), (20, 2000, 3));
        // 20 headers of 8 bytes for 2,000 data bytes: 8% more.
        assert_eq!(book.with_headers(1000), 1080);
        assert_eq!(book.with_headers(2000), 2160);
        assert_eq!(book.with_headers(0), 0);
    }
}
