//! The `oop` engine: endurance-aware out-of-place update (EAOOP, 003) in software,
//! under the TL2 driver, over the persistent heap.
//!
//! **The design (003 §3).** Every 8-byte word of the heap has its home and, once it is
//! updated, an *update slot*. A word's copies alternate: its `n`-th update since it got
//! its slot goes to the slot when `n` is odd and home when `n` is even, so the copy a
//! transaction writes is never the current one and no data is written twice (no log,
//! no merge). A DRAM mapping table `{home word → slot, update count}` says where each
//! word's current copy is (odd count: the slot, even: home); reads go through it. The
//! lightweight garbage collector drops a word's slot when its count reaches
//! [`GC_THRESHOLD`] (003's 4): the current copy is home then, so dropping it moves
//! nothing. Recovery compares, for each slot, the transaction ids of the word's two
//! copies and keeps the newer committed one (003's Algorithm 3); it rebuilds the
//! table with count 1 for each word whose current copy is in its slot, and drops the
//! others' slots.
//!
//! **What the software version keeps and what it cannot.** 003 puts the persist
//! buffer and the mapping table in the memory controller, tags every word written
//! with its transaction id as side-band metadata, and packs the tagged words of any
//! locations into whole 64-byte lines. Software has no side band, so:
//! - a slot is 32 bytes: `{home, value, txid of the slot copy, txid of the home copy}`.
//!   The home copy's id lives in the slot, so writing a word home also stores one
//!   word in its slot's line. Two slots share a line, and a transaction's new slots
//!   are taken in order, so the words of one transaction are packed two to a line.
//!   Each slot word recovery reads carries its own check (`slot_word`), so damage to
//!   a slot is refused at recovery, never trusted;
//! - a transaction's copies are made durable with one fence, then its *commit word*
//!   (the newest committed version of its thread's slot, in the engine area) with a
//!   second: a transaction id `version << 8 | thread slot` is committed when its
//!   version is at most that slot's commit word. The hardware commits with the persist
//!   buffer's drain, which software cannot order without a fence;
//! - the allocator's marks are not out of place (the heap's open reads them at home):
//!   a transaction that allocates or frees first records its allocations and frees in
//!   its thread's area (flushed with the copies), marks them after the first fence,
//!   and fences again before its commit word, so recovery can reverse the marks of a
//!   transaction that did not commit. Three fences for those transactions, two for the
//!   others;
//! - words inside blocks the transaction allocated, and not mapped, are written home
//!   directly: if it does not commit, the block is free again;
//! - a word's bytes that the transaction does not write are read from its current copy
//!   (the slot holds whole words).
//!
//! Slots live in chunks, heap blocks linked from the engine area (each allocated with
//! `allocate_into` on the previous chunk's link, so none is leaked), and are taken from
//! a DRAM free list; a chunk is added when the list is empty (`PoolFull` when the heap
//! has no room for one).
//!
//! A slot's stores are ordered for the crash model (a line persists a prefix of its
//! stores): a new slot's home word is stored last, so a torn new slot reads as free; a
//! slot dropped by the collector has its home word zeroed before it can be taken again.

use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::record::{self, EntryKind, HEADER, RecordBuilder};
use super::slot_word::{self, Home, VERSION_LIMIT};
use super::stats::{LogAreaStats, OopStats};
use super::words::{WORD, WordMap, WordTable, words_of};
use super::{
    EngineArea, EngineHeap, InPlace, LOG_HEADER, LogLease, MAX_LOGS, Recovered, flush_lines_once,
    lock,
};
use crate::alloc::PAddr;
use crate::engine::{EngineConfig, EngineFigures, EngineLifecycle, EngineStats};
use crate::error::Result;
use crate::file::EngineKind;
use crate::media::{CACHE_LINE, Media};
use crate::stm::SpareState;
use crate::stm::{CommitSet, Engine, Persisted};
use crate::stm::{ResolveScratch, Span};

/// The engine area's oop fields (see the layout in `inplace`): the link to the first
/// slot chunk.
const CHAIN_AT: u64 = 16;
/// Slots per slot chunk, fixed when the pool is created.
const CHUNK_SLOTS_AT: u64 = 24;
/// A slot chunk allocated but not yet linked (see `Slots::grow`).
const STAGED_CHUNK_AT: u64 = 32;
/// Each log slot's commit word (the newest version it committed).
const COMMITS_AT: u64 = 2048;
/// The update count at which a word's slot is dropped (003: 4). Even: the current copy
/// is home then.
pub(crate) const GC_THRESHOLD: u32 = 4;
/// The magic of an allocation record ("OOPA").
pub(crate) const OOP_MAGIC: u32 = 0x4150_4f4f;
/// Bytes of a slot.
const SLOT: u64 = 32;
const SLOT_HOME: u64 = 0;
const SLOT_VALUE: u64 = 8;
const SLOT_TXID: u64 = 16;
const SLOT_HOME_TXID: u64 = 24;
/// Bytes of a slot chunk's header: magic, link to the next chunk, slots, !slots.
const CHUNK_HEADER: u64 = 64;
const CHUNK_MAGIC: u64 = u64::from_le_bytes(*b"OOPSLOT2");
/// The magic of a slot chunk of the format before slot words carried checks.
const UNCHECKED_CHUNK_MAGIC: u64 = u64::from_le_bytes(*b"OOPSLOT1");
const CHUNK_LINK: u64 = 8;
const THREAD_BITS: u32 = 8;
const LINE: u64 = CACHE_LINE as u64;

/// A transaction id: its commit version and its thread's slot.
fn txid(version: u64, slot: usize) -> u64 {
    version << THREAD_BITS | slot as u64
}

/// The update slots: their chunks and the free ones.
#[derive(Debug)]
struct Slots {
    /// Bytes of a chunk (header included).
    chunk_bytes: u64,
    /// Free slots (offsets).
    free: Mutex<Vec<u64>>,
    /// Chunks, and the offset of the link the next chunk is allocated into.
    chunks: Mutex<(Vec<u64>, u64)>,
}

impl Slots {
    fn per_chunk(&self) -> u64 {
        (self.chunk_bytes - CHUNK_HEADER) / SLOT
    }

    /// Takes `n` free slots into `out`, adding chunks as needed.
    fn take(&self, core: &InPlace, n: usize, out: &mut Vec<u64>) -> Result<()> {
        out.clear();
        loop {
            {
                let mut free = lock(&self.free);
                if free.len() >= n {
                    let at = free.len() - n;
                    out.extend(free.drain(at..));
                    return Ok(());
                }
            }
            self.grow(core, n)?;
        }
    }

    /// Gives slots back.
    fn give_back(&self, slots: &[u64]) {
        lock(&self.free).extend_from_slice(slots);
    }

    /// Adds a chunk: allocated into the engine area's staging word (so it is never
    /// leaked), its slots zeroed and its header made durable, then linked after the
    /// last chunk, then unstaged. Every chunk in the list has a valid header.
    fn grow(&self, core: &InPlace, needed: usize) -> Result<()> {
        let mut chunks = lock(&self.chunks);
        if lock(&self.free).len() >= needed {
            return Ok(()); // another thread grew it meanwhile
        }
        let staged = core.heap_root.start + STAGED_CHUNK_AT;
        let block = core.heap.heap.allocate_into(
            PAddr::new(0, staged).expect("the engine area is in the pool file"),
            self.chunk_bytes,
        )?;
        let at = block.offset();
        let media = &core.media;
        init_chunk(media, at, self.chunk_bytes);
        media.write_u64(chunks.1 as usize, block.raw());
        media.persist(chunks.1 as usize, 8);
        media.write_u64(staged as usize, 0);
        media.persist(staged as usize, 8);
        core.logs().set_area(0, Some((at, self.chunk_bytes)));
        chunks.0.push(at);
        chunks.1 = at + CHUNK_LINK;
        let per = self.per_chunk();
        lock(&self.free).extend((0..per).rev().map(|i| at + CHUNK_HEADER + i * SLOT));
        Ok(())
    }
}

/// Zeroes a chunk's slots and its link, and writes its header, durably.
fn init_chunk(media: &Media, at: u64, bytes: u64) {
    let slots = (bytes - CHUNK_HEADER) / SLOT;
    media.fill(
        (at + CHUNK_HEADER) as usize,
        (bytes - CHUNK_HEADER) as usize,
        0,
    );
    media.flush(
        (at + CHUNK_HEADER) as usize,
        (bytes - CHUNK_HEADER) as usize,
    );
    media.fence();
    media.write_u64((at + CHUNK_LINK) as usize, 0);
    media.write_u64((at + 16) as usize, slots);
    media.write_u64((at + 24) as usize, !slots);
    media.write_u64(at as usize, CHUNK_MAGIC);
    media.persist(at as usize, CHUNK_HEADER as usize);
}

/// A thread's transaction state.
#[derive(Debug, Default)]
pub(crate) struct OopScratch {
    lease: Option<LogLease>,
    record: RecordBuilder,
    spans: Vec<Span>,
    resolve: ResolveScratch,
    /// The transaction's words: (home word, new value), in order.
    words: Vec<(u64, u64)>,
    /// New slots taken for this commit.
    new_slots: Vec<u64>,
    /// Each word's map before this commit (in `words` order).
    found: Vec<Option<WordMap>>,
    /// Slots given back by this commit's publish.
    dropped: Vec<u64>,
    /// Mapping changes to publish: (word, its new map).
    changes: Vec<(u64, WordMap)>,
    /// Blocks the transaction frees, sorted.
    freed: Vec<(u64, u64)>,
    /// Mapped words of the blocks it frees: their slots are dropped once it commits.
    released: Vec<(u64, WordMap)>,
    /// Lines stored this commit.
    lines: Vec<u64>,
    /// Words inside blocks the transaction allocates, stored home once its allocation
    /// record is durable (so recovery, which undoes the allocation, knows their lines).
    fresh: Vec<(u64, u64)>,
}

thread_local! {
    static SPARE_STATE: SpareState<OopScratch> = const { Cell::new(None) };
}

/// What the oop engine's recovery found.
#[derive(Debug, Default)]
struct OopRecovered {
    /// Bytes of a slot chunk of this pool.
    chunk_bytes: u64,
    chunks: Vec<u64>,
    free: Vec<u64>,
    mapped: Vec<(u64, u64)>,
    rolled_back: u64,
}

/// The oop engine (see the module docs).
#[derive(Debug)]
pub(crate) struct OopEngine {
    pub core: InPlace,
    mapping: WordTable,
    slots: Slots,
    /// Slots dropped by the collector.
    collected: AtomicU64,
    recovered: Recovered,
    /// Slots recovery kept (the word's current copy was in it).
    recovered_slots: u64,
}

impl OopEngine {
    /// Creates or opens an oop pool.
    fn start(how: super::Start<'_>, config: &crate::Config, _options: ()) -> Result<OopEngine> {
        let mut found = OopRecovered::default();
        // Chunks of about 1/256 of the pool, fixed when the pool is created.
        let new_pool_chunk = (config.size / 256)
            .checked_next_power_of_two()
            .unwrap_or(1 << 20)
            .clamp(8 << 10, 1 << 20);
        let (core, recovered) = InPlace::start(
            EngineKind::Oop,
            how,
            config,
            &mut |area| recover(area, new_pool_chunk, &mut found),
            false,
        )?;
        let chunk_bytes = found.chunk_bytes;
        let link = found
            .chunks
            .last()
            .map_or(core.heap_root.start + CHAIN_AT, |&at| at + CHUNK_LINK);
        for &at in &found.chunks {
            core.logs().set_area(0, Some((at, chunk_bytes)));
        }
        let mapping = WordTable::new();
        for &(word, slot) in &found.mapped {
            mapping.set(word, Some(WordMap { slot, count: 1 }));
        }
        Ok(OopEngine {
            core,
            mapping,
            slots: Slots {
                chunk_bytes,
                free: Mutex::new(found.free),
                chunks: Mutex::new((found.chunks, link)),
            },
            collected: AtomicU64::new(0),
            recovered_slots: found.mapped.len() as u64,
            recovered: Recovered {
                records: found.rolled_back,
                ..recovered
            },
        })
    }

    /// The committed value of the word at `word` (its current copy).
    fn current_word(&self, word: u64) -> u64 {
        match self.mapping.get(word) {
            Some(m) if m.count % 2 == 1 => self.core.media.read_u64((m.slot + SLOT_VALUE) as usize),
            _ => self.core.media.read_u64(word as usize),
        }
    }

    /// The commit word of thread slot `k`.
    fn commit_word(&self, k: usize) -> usize {
        (self.core.heap_root.start + COMMITS_AT + 8 * k as u64) as usize
    }
}

impl EngineLifecycle for OopEngine {
    const KIND: EngineKind = EngineKind::Oop;
    type Options = ();

    fn options(config: &EngineConfig) -> Option<()> {
        matches!(config, EngineConfig::Oop).then_some(())
    }

    in_place_lifecycle_common!();

    fn close(self) -> Result<()> {
        self.core.close()
    }

    fn figures(&self) -> EngineFigures {
        let chunks = lock(&self.slots.chunks).0.len() as u64;
        let areas = self.core.log_area_stats(&self.recovered);
        self.core.figures(EngineStats::Oop(OopStats {
            logs: LogAreaStats {
                logs: areas.logs.saturating_sub(chunks),
                log_bytes: areas
                    .log_bytes
                    .saturating_sub(chunks * self.slots.chunk_bytes),
                ..areas
            },
            update_slots: self.mapping.len(),
            slot_bytes: chunks * self.slots.chunk_bytes,
            slots_collected: self.collected.load(Ordering::Relaxed),
            slots_recovered: self.recovered_slots,
        }))
    }
}

/// Whether `[home, home + 8)` lies in one of `fresh` (sorted blocks).
pub(crate) fn in_blocks(blocks: &[(u64, u64)], home: u64) -> bool {
    let k = blocks.partition_point(|&(h, _)| h <= home);
    k > 0 && {
        let (h, size) = blocks[k - 1];
        home + WORD <= h + size
    }
}

/// Oop recovery: reverses the marks of each thread's transaction that did not commit,
/// then settles every slot (see the module docs).
fn recover(
    area: &mut EngineArea<'_, '_>,
    new_pool_chunk: u64,
    found: &mut OopRecovered,
) -> Result<Recovered> {
    let positions = area.positions()?;
    let media = area.media();
    let base = area.base;
    // The pool's chunk size: stored when the pool is created.
    let mut chunk_slots = media.read_u64((base + CHUNK_SLOTS_AT) as usize);
    if chunk_slots == 0
        && (media.read_u64((base + CHAIN_AT) as usize) != 0
            || media.read_u64((base + STAGED_CHUNK_AT) as usize) != 0)
    {
        return Err(area.corrupt(
            base + CHUNK_SLOTS_AT,
            "slot chunks, but no chunk size".into(),
        ));
    }
    if chunk_slots == 0 {
        chunk_slots = (new_pool_chunk - CHUNK_HEADER) / SLOT;
        media.write_u64((base + CHUNK_SLOTS_AT) as usize, chunk_slots);
        media.persist((base + CHUNK_SLOTS_AT) as usize, 8);
    }
    let Some(chunk_bytes) = chunk_slots
        .checked_mul(SLOT)
        .and_then(|b| b.checked_add(CHUNK_HEADER))
        .filter(|&b| b <= 1 << 30)
    else {
        return Err(area.corrupt(
            base + CHUNK_SLOTS_AT,
            format!("{chunk_slots} slots per chunk"),
        ));
    };
    found.chunk_bytes = chunk_bytes;
    let commits: Vec<u64> = (0..MAX_LOGS)
        .map(|k| media.read_u64((base + COMMITS_AT + 8 * k as u64) as usize))
        .collect();
    let committed = |t: u64| {
        let k = (t & ((1 << THREAD_BITS) - 1)) as usize;
        t != 0 && k < MAX_LOGS && t >> THREAD_BITS <= commits[k]
    };
    // 1. Allocation records of transactions that did not commit: reverse their marks.
    for (k, p) in positions.iter().enumerate().filter(|(_, p)| p.capacity > 0) {
        let at = p.area + LOG_HEADER;
        let mut h = [0u8; HEADER];
        area.media().read(at as usize, &mut h);
        let header = record::RecordHeader::decode(&h);
        // A record of another slot (left in a block this area reused) is not ours.
        let mine = header.version & ((1 << THREAD_BITS) - 1) == k as u64;
        if header.magic != OOP_MAGIC || !mine || committed(header.version) {
            continue;
        }
        let Some(len) = header.record_len(p.capacity - HEADER as u64) else {
            continue;
        };
        let bytes = area.media().read_vec(at as usize, len);
        let Some((_, entries)) = record::decode(&bytes, OOP_MAGIC) else {
            continue; // torn: nothing was marked yet
        };
        for e in entries.iter().rev() {
            match e.kind {
                EntryKind::Alloc => {
                    area.replay.mark(e.home, e.len, false);
                    // Its words may be home without their line's checksum.
                    area.seal(e.home, e.len);
                }
                EntryKind::Free => area.replay.mark(e.home, e.len, true),
                EntryKind::Data => {
                    return Err(area.corrupt(at, "an allocation record holds data".into()));
                }
            }
        }
        let media = area.media();
        media.fence();
        record::invalidate(media, at);
        found.rolled_back += 1;
    }
    // 2. The slot chunks: keep each word's newest committed copy.
    let root = area.replay.root();
    let chunk_ok = |area: &EngineArea<'_, '_>, at: u64| {
        at.is_multiple_of(LINE)
            && area.replay.in_heap(at, chunk_bytes)
            && !(at < root.end && at + chunk_bytes > root.start)
    };
    let mut link = base + CHAIN_AT;
    let mut visited = std::collections::HashSet::new();
    let mut homes = std::collections::HashSet::new();
    loop {
        let raw = area.media().read_u64(link as usize);
        if raw == 0 {
            break;
        }
        let addr = PAddr::from_raw(raw);
        let at = addr.offset();
        if addr.file() != 0 || !chunk_ok(area, at) || !visited.insert(at) {
            return Err(area.corrupt(link, format!("a slot-chunk link holds {raw:#x}")));
        }
        let media = area.media();
        if media.read_u64(at as usize) == UNCHECKED_CHUNK_MAGIC {
            return Err(area.corrupt(
                at,
                "a slot chunk of an earlier oop format (slot words without checks): \
                 open the pool with the logheap release that wrote it"
                    .into(),
            ));
        }
        if media.read_u64(at as usize) != CHUNK_MAGIC
            || media.read_u64(at as usize + 16) != chunk_slots
            || media.read_u64(at as usize + 24) != !chunk_slots
        {
            return Err(area.corrupt(at, "a slot chunk's header is damaged".into()));
        }
        for i in (0..chunk_slots).rev() {
            let slot = at + CHUNK_HEADER + i * SLOT;
            let media = area.media();
            let home_word = media.read_u64((slot + SLOT_HOME) as usize);
            let value = media.read_u64((slot + SLOT_VALUE) as usize);
            let sealed_u = media.read_u64((slot + SLOT_TXID) as usize);
            let sealed_h = media.read_u64((slot + SLOT_HOME_TXID) as usize);
            let (home, copy_intact) = match slot_word::open_home(home_word, value, sealed_u) {
                Home::Free => {
                    found.free.push(slot);
                    continue;
                }
                Home::At { home, copy_intact } => (home, copy_intact),
                Home::Damaged => {
                    return Err(area.corrupt(slot, "an update slot's home word is damaged".into()));
                }
            };
            let (Some(u), Some(h)) = (
                slot_word::open_txid(sealed_u),
                slot_word::open_txid(sealed_h),
            ) else {
                return Err(area.corrupt(slot, "an update slot's transaction id is damaged".into()));
            };
            let slot_current = committed(u) && !(committed(h) && h > u);
            if slot_current {
                if !copy_intact {
                    return Err(area.corrupt(
                        slot + SLOT_VALUE,
                        format!("the current copy of the word at {home:#x} is damaged"),
                    ));
                }
                if !home.is_multiple_of(WORD)
                    || !area.replay.in_heap(home, WORD)
                    || !homes.insert(home)
                {
                    return Err(area.corrupt(
                        slot,
                        format!("an update slot names home {home:#x} (unaligned, outside the heap or named twice)"),
                    ));
                }
                let media = area.media();
                if h != 0 {
                    media.write_u64((slot + SLOT_HOME_TXID) as usize, 0);
                    media.flush((slot + SLOT_HOME_TXID) as usize, 8);
                }
                // A transaction a crash cut short may have stored this word's home
                // copy (stale: the slot's is current) but not its line's checksum.
                if !area.clean {
                    area.seal(home, WORD);
                }
                found.mapped.push((home, slot));
            } else {
                let media = area.media();
                media.write_u64((slot + SLOT_HOME) as usize, 0);
                media.flush((slot + SLOT_HOME) as usize, 8);
                found.free.push(slot);
            }
        }
        found.chunks.push(at);
        link = at + CHUNK_LINK;
    }
    // 3. A chunk allocated but not yet linked (a crash in `Slots::grow`): its slots
    // were never used; link it now.
    let staged = base + STAGED_CHUNK_AT;
    let raw = area.media().read_u64(staged as usize);
    if raw != 0 {
        let addr = PAddr::from_raw(raw);
        let at = addr.offset();
        if addr.file() != 0 || !chunk_ok(area, at) {
            return Err(area.corrupt(staged, format!("the staged slot chunk is {raw:#x}")));
        }
        if !visited.contains(&at) {
            let media = area.media();
            init_chunk(media, at, chunk_bytes);
            media.write_u64(link as usize, raw);
            media.persist(link as usize, 8);
            found
                .free
                .extend((0..chunk_slots).rev().map(|i| at + CHUNK_HEADER + i * SLOT));
            found.chunks.push(at);
        }
        let media = area.media();
        media.write_u64(staged as usize, 0);
        media.persist(staged as usize, 8);
    }
    area.media().fence();
    Ok(Recovered {
        positions,
        last_version: commits.iter().copied().max().unwrap_or(0),
        records: 0,
        superseded: area.replay.superseded,
    })
}

impl Engine for OopEngine {
    type Scratch = OopScratch;
    type Heap = EngineHeap;
    const FRESH_BLOCKS_READ_ZERO: bool = false;

    in_place_engine_common!(OopScratch, SPARE_STATE);

    #[inline]
    fn read_committed(&self, _s: &OopScratch, home: u64, buf: &mut [u8]) -> bool {
        // The home bytes are checked whether or not a slot holds the current copy of
        // some of their words: a line's checksum is of its home bytes as stored.
        let intact = self.core.read(home, buf);
        self.mapping.overlay(&self.core.media, home, buf, |m| {
            (m.count % 2 == 1).then_some(m.slot + SLOT_VALUE)
        });
        intact
    }

    fn read_damage(&self, home: u64, len: u64) -> crate::Error {
        self.core.read_damage(home, len)
    }

    /// Copies out of place (fence), marks (fence, when the transaction allocates or
    /// frees), commit word (fence).
    fn persist(&self, set: &CommitSet<'_>, s: &mut OopScratch) -> Result<Persisted> {
        set.writes.resolve_into(&mut s.resolve, &mut s.spans);
        let allocs = set.allocs;
        if !allocs.alloc_then_freed.is_empty() {
            let freed_again = &allocs.alloc_then_freed;
            s.spans = s
                .spans
                .iter()
                .flat_map(|&sp| super::outside(sp, freed_again))
                .collect();
        }
        if s.spans.is_empty() && allocs.allocs.is_empty() && allocs.frees.is_empty() {
            return Ok(Persisted::Nothing);
        }
        let media = &self.core.media;
        let lease = s.lease.as_ref().expect("leased before the commit");
        let k = lease.index;
        if set.version >= VERSION_LIMIT {
            return Err(crate::Error::VersionsExhausted);
        }
        let unsealed_id = txid(set.version, k);
        let id = slot_word::seal_txid(unsealed_id);
        words_of(&s.spans, set.writes.bytes(), &mut s.words, |w| {
            self.current_word(w)
        });
        // Words of blocks it frees are dead once it commits: not written; their slots
        // are released (below, and in `publish`).
        s.freed.clear();
        s.freed.extend_from_slice(&allocs.frees);
        s.freed.sort_unstable();
        if !s.freed.is_empty() {
            let freed = &s.freed;
            s.words.retain(|&(w, _)| !in_blocks(freed, w));
        }
        s.released.clear();
        for &(home, size) in &s.freed {
            self.mapping.mapped_in(home, size, &mut s.released);
        }
        // Everything that can fail comes before the first store.
        // Each word's map, looked up once (the stripe locks held keep it).
        s.found.clear();
        s.found
            .extend(s.words.iter().map(|&(w, _)| self.mapping.get(w)));
        let unmapped = s
            .words
            .iter()
            .zip(&s.found)
            .filter(|&(&(w, _), m)| m.is_none() && !in_blocks(&allocs.allocs, w))
            .count();
        s.new_slots.clear();
        if unmapped > 0 {
            self.slots.take(&self.core, unmapped, &mut s.new_slots)?;
        }
        let logs_marks = !allocs.allocs.is_empty() || !allocs.frees.is_empty();
        let record_at = if logs_marks {
            let b = &mut s.record;
            b.start();
            for &(home, size) in &allocs.allocs {
                b.block(EntryKind::Alloc, home, size);
            }
            for &(home, size) in &allocs.frees {
                b.block(EntryKind::Free, home, size);
            }
            let mut pos = lock(&lease.log().position);
            if let Err(e) = self.core.ensure_area(k, &mut pos, b.len() as u64) {
                drop(pos);
                self.slots.give_back(&s.new_slots);
                return Err(e);
            }
            Some(pos.area + LOG_HEADER)
        } else {
            None
        };
        // 1. The copies, out of place.
        s.changes.clear();
        s.lines.clear();
        s.fresh.clear();
        let mut new_slots = s.new_slots.iter();
        for (&(w, value), &found) in s.words.iter().zip(&s.found) {
            match found {
                None if in_blocks(&allocs.allocs, w) => s.fresh.push((w, value)),
                None => {
                    let slot = *new_slots.next().expect("a slot per unmapped word");
                    media.write_u64((slot + SLOT_VALUE) as usize, value);
                    media.write_u64((slot + SLOT_TXID) as usize, id);
                    media.write_u64((slot + SLOT_HOME_TXID) as usize, 0);
                    let home = slot_word::seal_home(w, value, id);
                    media.write_u64((slot + SLOT_HOME) as usize, home);
                    s.lines.push(slot);
                    s.changes.push((w, WordMap { slot, count: 1 }));
                }
                Some(m) => {
                    let count = m.count + 1;
                    if count % 2 == 1 {
                        media.write_u64((m.slot + SLOT_VALUE) as usize, value);
                        media.write_u64((m.slot + SLOT_TXID) as usize, id);
                        // Last: the home word's check of the copy (see `slot_word`).
                        let home = slot_word::seal_home(w, value, id);
                        media.write_u64((m.slot + SLOT_HOME) as usize, home);
                    } else {
                        media.write_u64(w as usize, value);
                        media.write_u64((m.slot + SLOT_HOME_TXID) as usize, id);
                        self.core.seal(w, WORD);
                        s.lines.push(w);
                    }
                    s.lines.push(m.slot);
                    s.changes.push((
                        w,
                        WordMap {
                            slot: m.slot,
                            count,
                        },
                    ));
                }
            }
        }
        // A freed word whose current copy is its slot: the home copy is made the newer
        // one by this transaction, so once it commits the slot is stale (and may be
        // dropped) whatever later reuses the block's space.
        for &(_, m) in &s.released {
            if m.count % 2 == 1 {
                media.write_u64((m.slot + SLOT_HOME_TXID) as usize, id);
                s.lines.push(m.slot);
            }
        }
        if let Some(at) = record_at {
            let rec = s.record.seal(unsealed_id, OOP_MAGIC);
            media.write(at as usize, rec);
            media.flush(at as usize, rec.len());
        }
        flush_lines_once(media, &mut s.lines);
        media.fence();
        // 2. The words of the blocks it allocates, home, with their blocks' data
        // checksums, and the allocator's marks, once the record that can reverse them is
        // durable (fenced with the marks: a transaction that allocates logs its marks).
        if logs_marks {
            let heap = &self.core.heap.heap;
            s.lines.clear();
            for &(w, value) in &s.fresh {
                media.write_u64(w as usize, value);
                s.lines.push(w);
            }
            self.core.seal_blocks(&allocs.allocs);
            for &(home, size) in &allocs.allocs {
                s.lines.extend(heap.tx_mark(home, size, true));
            }
            for &(home, size) in &allocs.frees {
                s.lines.extend(heap.tx_mark(home, size, false));
            }
            flush_lines_once(media, &mut s.lines);
            media.fence();
        }
        // 3. The commit word: the commit point.
        let commit = self.commit_word(k);
        media.write_u64(commit, set.version);
        media.persist(commit, 8);
        Ok(Persisted::Durable {
            payload: s.spans.iter().map(|sp| sp.len).sum(),
        })
    }

    /// Points the mapping at the new copies; drops the slots whose count reached the
    /// threshold (their current copy is home).
    fn publish(&self, _set: &CommitSet<'_>, s: &mut OopScratch) {
        let media = &self.core.media;
        let dropped = &mut s.dropped;
        dropped.clear();
        for &(w, m) in &s.released {
            self.mapping.set(w, None);
            media.write_u64((m.slot + SLOT_HOME) as usize, 0);
            media.flush((m.slot + SLOT_HOME) as usize, 8);
            dropped.push(m.slot);
        }
        for &(w, m) in &s.changes {
            if m.count >= GC_THRESHOLD && m.count % 2 == 0 {
                self.mapping.set(w, None);
                media.write_u64((m.slot + SLOT_HOME) as usize, 0);
                media.flush((m.slot + SLOT_HOME) as usize, 8);
                dropped.push(m.slot);
            } else {
                self.mapping.set(w, Some(m));
            }
        }
        if !dropped.is_empty() {
            self.collected
                .fetch_add(dropped.len() as u64, Ordering::Relaxed);
            self.slots.give_back(dropped);
        }
    }

    fn make_room(&self, _s: &mut OopScratch, _since: std::time::Instant) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(home: u64, len: u64, at: usize) -> Span {
        Span { home, len, at }
    }

    #[test]
    fn spans_become_whole_words_with_the_rest_from_the_current_copy() {
        let bytes: Vec<u8> = (1..=32).collect();
        let mut out = Vec::new();
        // 8..16 whole, 20..22 partial, 22..26 partial across two words.
        words_of(
            &[span(8, 8, 0), span(20, 2, 8), span(22, 4, 10)],
            &bytes,
            &mut out,
            |w| {
                if w == 16 {
                    u64::MAX
                } else {
                    0x1111_1111_1111_1111 * (w / 8)
                }
            },
        );
        let le = |b: [u8; 8]| u64::from_le_bytes(b);
        assert_eq!(out.len(), 3, "{out:x?}");
        assert_eq!(out[0], (8, le([1, 2, 3, 4, 5, 6, 7, 8])));
        assert_eq!(
            out[1],
            (16, le([0xff, 0xff, 0xff, 0xff, 9, 10, 11, 12])),
            "bytes 20..24 written, 16..20 kept"
        );
        assert_eq!(
            out[2],
            (24, le([13, 14, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33]))
        );
    }

    #[test]
    fn transaction_ids_carry_version_and_thread_slot() {
        assert_eq!(txid(5, 3), 5 << 8 | 3);
        assert!(txid(6, 0) > txid(5, MAX_LOGS - 1));
    }

    #[test]
    fn fresh_blocks_cover_whole_words_only() {
        let blocks = [(64, 32), (256, 64)];
        assert!(in_blocks(&blocks, 64) && in_blocks(&blocks, 88));
        assert!(!in_blocks(&blocks, 96) && !in_blocks(&blocks, 60));
        assert!(in_blocks(&blocks, 312) && !in_blocks(&blocks, 320));
    }
}
