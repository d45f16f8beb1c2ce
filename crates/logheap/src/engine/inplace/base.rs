//! The base every in-place engine is built on ([`InPlace`]): the persistent heap with
//! the engine's allocation path ([`EngineHeap`]), the engine area in the heap's root
//! (its magic, the retired version, the log slots), opening with the engine's recovery
//! inside the heap's, and the helpers the engines share for stores and spans.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::data_checksums::{self, DataChecksums};
use super::log_areas::{LOG_HEADER, LogLease, LogPosition, LogTable, MAX_LOGS};
use super::stats::LogAreaStats;
use crate::alloc::{HeapOptions, MetadataPolicy, PAddr, PersistentHeap, Replay, TxHeap};
use crate::config::Config;
use crate::engine::{EngineFigures, EngineStats, NewPool};
use crate::error::{Error, Result};
use crate::file::{EngineKind, PoolFile};
#[cfg(test)]
use crate::media::SimConfig;
use crate::media::{CACHE_LINE, Media};
use crate::stm::{Domain, Span};
pub(crate) use crate::sync::lock;

/// Bytes of the engine's part of the heap's root area.
pub(crate) const ENGINE_AREA: u64 = 4096;
const ENGINE_MAGIC: u64 = 0x3145_4341_4c50_4e49; // "INPLACE1"
const RETIRED_WORD: u64 = 8;
const LOGS_AT: u64 = 64;

/// The pieces of `sp` outside every block of `blocks` `(home, size)`.
pub(crate) fn outside(sp: Span, blocks: &[(u64, u64)]) -> Vec<Span> {
    let mut pieces = vec![sp];
    for &(h, size) in blocks {
        pieces = pieces
            .into_iter()
            .flat_map(|p| {
                let (start, end) = (p.home, p.home + p.len);
                let (cut_start, cut_end) = (h.max(start), (h + size).min(end));
                if cut_start >= cut_end {
                    return vec![p];
                }
                let mut kept = Vec::new();
                if start < cut_start {
                    kept.push(Span {
                        home: start,
                        len: cut_start - start,
                        at: p.at,
                    });
                }
                if cut_end < end {
                    kept.push(Span {
                        home: cut_end,
                        len: end - cut_end,
                        at: p.at + (cut_end - start) as usize,
                    });
                }
                kept
            })
            .collect();
    }
    pieces
}

/// Stores `data` at `home` and flushes it.
pub(crate) fn write_flushed(media: &Media, home: u64, data: &[u8]) {
    media.write(home as usize, data);
    media.flush(home as usize, data.len());
}

/// Flushes the cache line of each offset in `marks` once, however many of them share
/// it (a transaction's allocator marks often fall in one chunk's bitmap words), and
/// leaves in `marks` the start of each line flushed, in order.
pub(crate) fn flush_lines_once(media: &Media, marks: &mut Vec<u64>) {
    let line = CACHE_LINE as u64;
    for m in marks.iter_mut() {
        *m -= *m % line;
    }
    marks.sort_unstable();
    marks.dedup();
    for &m in marks.iter() {
        media.flush(m as usize, CACHE_LINE);
    }
}

/// The heap of an in-place engine, as the TL2 driver sees it.
#[derive(Debug)]
pub(crate) struct EngineHeap {
    pub heap: PersistentHeap,
    /// Log areas (offsets), which are heap blocks but no allocation of the user's.
    logs: Arc<LogTable>,
    /// Frees of huge blocks are given back by the engine, later (the redo engine:
    /// once no log record names them).
    defer_huge_frees: bool,
    /// Other heap blocks of the engine's own (the data checksums' pages and
    /// directory), sorted: no allocation of the user's.
    internal: Box<[u64]>,
}

impl EngineHeap {
    fn is_internal(&self, home: u64) -> bool {
        self.internal.binary_search(&home).is_ok()
    }
}

impl TxHeap for EngineHeap {
    fn reserve(&self, size: u64) -> Result<u64> {
        self.heap.tx_reserve(size)
    }

    fn size_of(&self, home: u64) -> Option<u64> {
        if self.logs.is_area(home) || self.is_internal(home) {
            return None;
        }
        self.heap.tx_size_of(home)
    }

    fn cancel(&self, reserved: &[(u64, u64)]) {
        for &(home, _) in reserved {
            self.heap.tx_release(home);
        }
    }

    fn publish(&self, _allocs: &[(u64, u64)], frees: &[(u64, u64)]) {
        for &(home, _) in frees {
            if !(self.defer_huge_frees && self.heap.tx_is_huge(home)) {
                self.heap.tx_release(home);
            }
        }
    }

    fn allocations(&self) -> Vec<(u64, u64)> {
        let mut blocks = self.heap.tx_blocks().unwrap_or_default();
        blocks.retain(|&(home, _)| !self.logs.is_area(home) && !self.is_internal(home));
        blocks
    }

    fn live(&self) -> (u64, u64) {
        let s = self.heap.stats();
        let (n, bytes) = self.logs.areas();
        (
            s.allocations.saturating_sub(n),
            s.allocated_bytes.saturating_sub(bytes),
        )
    }
}

/// What every in-place engine is made of.
#[derive(Debug)]
pub(crate) struct InPlace {
    pub heap: EngineHeap,
    pub media: Arc<Media>,
    pub shared: Arc<Domain>,
    /// The user's root object.
    pub root: Range<u64>,
    /// The heap's whole root area (the engine's part first).
    pub heap_root: Range<u64>,
    /// Capacity of a new log area.
    log_capacity: u64,
    /// The data checksums, when they are on.
    pub checksums: Option<DataChecksums>,
}

/// What an engine's recovery found, handed back from inside the heap's open.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    /// Each slot's log.
    pub positions: Vec<LogPosition>,
    /// The newest version the logs hold (redo), to start the clock above.
    pub last_version: u64,
    /// Records redone or undone.
    pub records: u64,
    /// Marks skipped (see `Replay::mark`).
    pub superseded: u64,
}

/// The engine area of a pool's root, read during recovery.
pub(crate) struct EngineArea<'a, 'r> {
    pub replay: &'a mut Replay<'r>,
    /// Offset of the engine area (the start of the heap's root area).
    pub base: u64,
    path: &'a Path,
    /// The data checksums, when they are on: recovery keeps those of what it stores.
    pub checksums: Option<DataChecksums>,
    /// Whether the pool was closed cleanly (nothing was in flight).
    pub clean: bool,
}

impl EngineArea<'_, '_> {
    /// The media.
    pub(crate) fn media(&self) -> &Media {
        self.replay.media()
    }

    /// The redo engine's retired version.
    pub(crate) fn retired(&self) -> u64 {
        self.media().read_u64((self.base + RETIRED_WORD) as usize)
    }

    /// Stores the retired version durably.
    pub(crate) fn set_retired(&self, version: u64) {
        store_retired(self.media(), self.base, version);
    }

    /// Stores `data` at `home` and flushes it, with its lines' data checksums.
    pub(crate) fn store_home(&self, home: u64, data: &[u8]) {
        write_flushed(self.media(), home, data);
        self.seal(home, data.len() as u64);
    }

    /// Stores the data checksums of `[home, home + len)` as its bytes are now (a range
    /// outside the heap, which only a hostile record names, is left alone).
    pub(crate) fn seal(&self, home: u64, len: u64) {
        if let Some(sums) = &self.checksums
            && len > 0
            && self.replay.in_heap(home, len)
        {
            sums.seal(self.media(), home, len, |_| {});
        }
    }

    /// An error naming a damaged place of the pool.
    pub(crate) fn corrupt(&self, offset: u64, reason: String) -> Error {
        Error::MetadataCorrupt {
            path: self.path.to_path_buf(),
            offset,
            reason,
        }
    }

    /// Every slot's log area `(offset, bytes)` (for redo recovery).
    pub(crate) fn areas(positions: &[LogPosition]) -> Vec<(u64, u64)> {
        positions
            .iter()
            .filter(|p| p.area != 0 && p.capacity > 0)
            .map(|p| (p.area, p.capacity + LOG_HEADER))
            .collect()
    }

    /// Every slot's log area, checked (an area whose header is torn, of a slot
    /// whose allocation a crash cut short, has no records).
    pub(crate) fn positions(&self) -> Result<Vec<LogPosition>> {
        let media = self.media();
        let mut out = Vec::with_capacity(MAX_LOGS);
        for k in 0..MAX_LOGS {
            let slot = self.base + LOGS_AT + 8 * k as u64;
            let raw = media.read_u64(slot as usize);
            if raw == 0 {
                out.push(LogPosition::default());
                continue;
            }
            let addr = PAddr::from_raw(raw);
            let area = addr.offset();
            let root = self.replay.root();
            if addr.file() != 0
                || !area.is_multiple_of(LOG_HEADER)
                || !self.replay.in_heap(area, LOG_HEADER)
                || area < root.end && area + LOG_HEADER > root.start
            {
                return Err(self.corrupt(slot, format!("log slot {k} holds {raw:#x}")));
            }
            let capacity = media.read_u64(area as usize);
            let check = media.read_u64(area as usize + 8);
            let capacity = if check == !capacity
                && capacity >= LOG_HEADER
                && capacity.is_multiple_of(LOG_HEADER)
                && LOG_HEADER
                    .checked_add(capacity)
                    .is_some_and(|bytes| self.replay.in_heap(area, bytes))
            {
                capacity
            } else {
                0
            };
            out.push(LogPosition {
                area,
                capacity,
                tail: 0,
                newest: 0,
            });
        }
        Ok(out)
    }
}

fn store_retired(media: &Media, base: u64, version: u64) {
    let at = (base + RETIRED_WORD) as usize;
    media.write_u64(at, version);
    media.persist(at, 8);
}

/// How an in-place engine's pool is created or opened.
pub(crate) enum Start<'a> {
    /// A new pool.
    Create(NewPool<'a>),
    /// An opened pool file.
    Open(PoolFile),
}

/// The heap options of an in-place engine's pool of `config`.
fn heap_options(config: &Config) -> HeapOptions {
    // Segments of about a sixteenth of the pool: room for the arenas' small and big
    // segments and the logs in small pools, 4 MiB (002's choice) in large ones.
    let segment = (config.size / 16)
        .checked_next_power_of_two()
        .map_or(4 << 20, |p| p / 2)
        .clamp(64 << 10, 4 << 20);
    HeapOptions {
        size: config.size,
        segment_size: segment,
        root_size: ENGINE_AREA + config.root_size.next_multiple_of(64),
        media: config.media,
        metadata: MetadataPolicy::InPlace,
        reserve_space: config.reserve_space,
        map_address: config.map_address,
        ..HeapOptions::default()
    }
}

impl InPlace {
    /// Creates or opens the pool of engine `kind`, running `recover` inside the heap's
    /// open (after its own logs, before its DRAM state is built).
    pub(crate) fn start(
        kind: EngineKind,
        how: Start<'_>,
        config: &Config,
        recover: &mut dyn FnMut(&mut EngineArea<'_, '_>) -> Result<Recovered>,
        defer_huge_frees: bool,
    ) -> Result<(InPlace, Recovered)> {
        let options = heap_options(config);
        let creating = !matches!(how, Start::Open(_));
        let mut recovered = None;
        let mut loaded_checksums = None;
        let mut path_buf = std::path::PathBuf::new();
        let mut clean = true;
        if let Start::Open(file) = &how {
            path_buf = file.path().to_path_buf();
            clean = file.was_clean();
        }
        let mut hook = |replay: &mut Replay<'_>| -> Result<()> {
            let base = replay.root().start;
            if replay.root().end.saturating_sub(base) < ENGINE_AREA {
                return Err(Error::MetadataCorrupt {
                    path: path_buf.clone(),
                    offset: base,
                    reason: format!(
                        "the root area ({} bytes) has no room for the engine's {ENGINE_AREA}",
                        replay.root().end.saturating_sub(base)
                    ),
                });
            }
            let media = replay.media();
            if creating {
                media.write_u64(base as usize, ENGINE_MAGIC);
                media.persist(base as usize, 8);
            }
            let magic = media.read_u64(base as usize);
            if magic != ENGINE_MAGIC {
                return Err(Error::MetadataCorrupt {
                    path: path_buf.clone(),
                    offset: base,
                    reason: format!("the engine area's magic is {magic:#x}"),
                });
            }
            let span = replay.data_end();
            let checksums = {
                let in_heap = |at: u64, len: u64| replay.in_heap(at, len);
                let corrupt = |offset: u64, reason: String| Error::MetadataCorrupt {
                    path: path_buf.clone(),
                    offset,
                    reason,
                };
                DataChecksums::load(replay.media(), base, span, &in_heap, &corrupt)?
            };
            let mut area = EngineArea {
                replay,
                base,
                path: &path_buf,
                checksums,
                clean,
            };
            recovered = Some(recover(&mut area)?);
            loaded_checksums = area.checksums.take();
            Ok(())
        };
        let heap = match how {
            Start::Create(NewPool::File(path)) => {
                PersistentHeap::create_for_engine(path, &options, kind, &mut hook)?
            }
            Start::Create(NewPool::Sim(sim)) => {
                PersistentHeap::create_sim_for_engine(&options, kind, sim, &mut hook)?
            }
            Start::Open(file) => PersistentHeap::open_for_engine(file, &mut hook)?,
        };
        let mut recovered = recovered.unwrap_or_default();
        let heap_root = heap.root().offset()..heap.root().offset() + heap.root_size();
        let checksums = Self::choose_checksums(&heap, heap_root.start, config, loaded_checksums)?;
        let root = heap_root.start + ENGINE_AREA..heap_root.end;
        let positions = std::mem::take(&mut recovered.positions);
        let logs = Arc::new(LogTable::new(positions));
        let media = heap.shared_media().clone();
        let size = heap.pool_file().header().pool_size;
        let log_capacity = (size / 64)
            .checked_next_power_of_two()
            .unwrap_or(1 << 20)
            .clamp(16 << 10, 1 << 20)
            - LOG_HEADER;
        let shared = Arc::new(Domain::new(size, recovered.last_version));
        let mut internal: Vec<u64> = checksums.iter().flat_map(|c| c.own_blocks()).collect();
        internal.sort_unstable();
        Ok((
            InPlace {
                heap: EngineHeap {
                    heap,
                    logs,
                    defer_huge_frees,
                    internal: internal.into(),
                },
                media,
                shared,
                root,
                heap_root,
                log_capacity,
                checksums,
            },
            recovered,
        ))
    }

    /// Turns the data checksums on or off as `config` asks (`None`: as the pool has
    /// them), at open, before any transaction.
    fn choose_checksums(
        heap: &PersistentHeap,
        base: u64,
        config: &Config,
        loaded: Option<DataChecksums>,
    ) -> Result<Option<DataChecksums>> {
        let media = heap.shared_media();
        let span = heap.data_end();
        let path = heap.path().to_path_buf();
        let corrupt = |offset: u64, reason: String| Error::MetadataCorrupt {
            path: path.clone(),
            offset,
            reason,
        };
        match (config.data_checksums, loaded) {
            (Some(true), None) => {
                data_checksums::turn_on(heap, media, base, span, &corrupt).map(Some)
            }
            (Some(false), Some(_)) => {
                data_checksums::turn_off(heap, media, base, span, &corrupt).map(|()| None)
            }
            (_, loaded) => Ok(loaded),
        }
    }

    /// Stores the data checksums of `[home, home + len)` as its bytes are now (flushed;
    /// the caller fences), when they are on.
    #[inline]
    pub(crate) fn seal(&self, home: u64, len: u64) {
        if let Some(sums) = &self.checksums {
            sums.seal(&self.media, home, len, |_| {});
        }
    }

    /// [`seal`](Self::seal), pushing each checksum stored to `flushed` as
    /// `(offset, 4)` (for a fence another thread may have to give).
    pub(crate) fn seal_tracked(&self, home: u64, len: u64, flushed: &mut Vec<(u64, u64)>) {
        if let Some(sums) = &self.checksums {
            sums.seal(&self.media, home, len, |at| flushed.push((at, 4)));
        }
    }

    /// Stores the data checksums of every block in `blocks` `(home, size)`: blocks a
    /// transaction allocates are checksummed whole (their bytes were no user's).
    pub(crate) fn seal_blocks(&self, blocks: &[(u64, u64)]) {
        if self.checksums.is_some() {
            for &(home, size) in blocks {
                self.seal(home, size);
            }
        }
    }

    /// The error for a read of `[home, home + len)` whose data checksum failed, or
    /// `Conflict` when its lines match again (a store since: the read retries).
    pub(crate) fn read_damage(&self, home: u64, len: u64) -> Error {
        let found = self
            .checksums
            .as_ref()
            .and_then(|sums| sums.first_damaged(&self.media, home, len));
        match found {
            Some((line, stored, computed)) => Error::Checksum {
                path: self.file().path().to_path_buf(),
                what: "user data (line)",
                offset: line,
                stored,
                computed,
            },
            None => Error::Conflict,
        }
    }

    /// Zeroes each line [`damaged_lines`](Self::damaged_lines) finds and stores its new
    /// checksum, durably; returns the lines. For a repair: no transaction runs.
    pub(crate) fn scrub_damaged_lines(&self) -> Vec<u64> {
        let lines: Vec<u64> = self.damaged_lines().into_iter().map(|d| d.0).collect();
        for &line in &lines {
            write_flushed(&self.media, line, &[0u8; CACHE_LINE]);
            self.seal(line, CACHE_LINE as u64);
        }
        if !lines.is_empty() {
            self.media.fence();
        }
        lines
    }

    /// Every line of the live allocations and the root whose bytes do not match its
    /// data checksum: `(line, stored, computed)` (for `logheap check`).
    pub(crate) fn damaged_lines(&self) -> Vec<(u64, u32, u32)> {
        let Some(sums) = &self.checksums else {
            return Vec::new();
        };
        let mut ranges = self.heap.allocations();
        ranges.push((self.root.start, self.root.end - self.root.start));
        let mut found = Vec::new();
        for (home, len) in ranges {
            let mut at = home;
            while let Some(d) = sums.first_damaged(&self.media, at, home + len - at) {
                found.push(d);
                at = d.0 + data_checksums::LINE;
                if at >= home + len {
                    break;
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }

    /// The pool's size in bytes.
    pub(crate) fn pool_size(&self) -> u64 {
        self.file().header().pool_size
    }

    /// The pool file.
    pub(crate) fn file(&self) -> &PoolFile {
        self.heap.heap.pool_file()
    }

    /// The figures every in-place engine reports alike, with its own `engine` figures.
    pub(crate) fn figures(&self, engine: EngineStats) -> EngineFigures {
        let heap = self.heap.heap.stats();
        let (allocations, allocated_bytes) = self.heap.live();
        EngineFigures {
            allocations,
            allocated_bytes,
            dram_bytes: heap.dram_bytes,
            pm_bytes_used: heap.pm_bytes_used,
            engine,
            data_checksums: self.checksums.is_some(),
        }
    }

    /// Its log areas and what recovery did with them.
    pub(crate) fn log_area_stats(&self, recovered: &Recovered) -> LogAreaStats {
        let (logs, log_bytes) = self.logs().areas();
        LogAreaStats {
            logs,
            log_bytes,
            records_recovered: recovered.records,
            marks_superseded: recovered.superseded,
        }
    }

    /// Closes the pool (its heap) cleanly.
    pub(crate) fn close(self) -> Result<()> {
        self.heap.heap.close()
    }

    /// The log table.
    pub(crate) fn logs(&self) -> &Arc<LogTable> {
        &self.heap.logs
    }

    /// Makes sure `lease` is a lease of this pool's logs, taking a free slot (waiting
    /// for one when every slot is leased).
    pub(crate) fn lease(&self, lease: &mut Option<LogLease>) {
        LogTable::lease(self.logs(), lease);
    }

    /// Whether a transaction may read and write `[home, home + len)`.
    pub(crate) fn check_range(&self, home: u64, len: u64) -> Result<()> {
        let bad = || Error::InvalidRange { home, len };
        let end = home.checked_add(len).ok_or_else(bad)?;
        if len == 0 {
            return Err(bad());
        }
        if self.root.start <= home && end <= self.root.end {
            return Ok(());
        }
        if home < self.heap_root.end && end > self.heap_root.start {
            return Err(bad()); // the engine's area
        }
        if self.heap.heap.tx_is_data(home, len) {
            Ok(())
        } else {
            Err(bad())
        }
    }

    /// Copies the committed bytes at `home` (they are at home); returns whether they
    /// match their data checksums (always, when those are off).
    #[inline]
    pub(crate) fn read(&self, home: u64, buf: &mut [u8]) -> bool {
        match &self.checksums {
            None => {
                self.media.read(home as usize, buf);
                true
            }
            Some(sums) => sums.read_verified(&self.media, home, buf),
        }
    }

    /// Gives `position` an area of at least `needed` bytes of records, empty: a new
    /// heap block stored in the slot (the old one freed first). Only for a log none of
    /// whose records will be needed again.
    pub(crate) fn ensure_area(
        &self,
        slot: usize,
        position: &mut LogPosition,
        needed: u64,
    ) -> Result<()> {
        if position.area != 0 && position.capacity >= needed {
            return Ok(());
        }
        let heap = &self.heap.heap;
        let dst = PAddr::new(0, self.heap_root.start + LOGS_AT + 8 * slot as u64)
            .expect("the root area is in the pool file");
        let old = position.area;
        if old != 0 {
            heap.deallocate(dst)?;
            self.logs().set_area(old, None);
            *position = LogPosition::default();
        }
        let capacity = needed
            .max(self.log_capacity)
            .checked_next_power_of_two()
            .ok_or(Error::InvalidSize(needed))?;
        let block = heap.allocate_into(dst, capacity + LOG_HEADER)?;
        let area = block.offset();
        self.media.write_u64(area as usize, capacity);
        self.media.write_u64(area as usize + 8, !capacity);
        // The block's last owner may have left a record at its start (another slot's
        // log): it must not be read as this slot's.
        let magic = area as usize + LOG_HEADER as usize + super::record::MAGIC_WORD;
        self.media.write_u64(magic, 0);
        self.media.flush(area as usize, 16);
        self.media.persist(magic, 8);
        self.logs().set_area(0, Some((area, capacity + LOG_HEADER)));
        *position = LogPosition {
            area,
            capacity,
            tail: 0,
            newest: 0,
        };
        Ok(())
    }

    /// Stores the redo engine's retired version durably.
    pub(crate) fn store_retired(&self, version: u64) {
        store_retired(&self.media, self.heap_root.start, version);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::MediaConfig;

    #[test]
    fn marks_sharing_a_line_flush_it_once() {
        let media = Media::sim(4096, &MediaConfig::default(), SimConfig::default()).unwrap();
        let mut marks = vec![200, 8, 0, 63, 64, 130, 8];
        flush_lines_once(&media, &mut marks);
        assert_eq!(marks, [0, 64, 128, 192]);
        assert_eq!(media.counters().lines_flushed, 4);
        let mut none = Vec::new();
        flush_lines_once(&media, &mut none);
        assert_eq!(media.counters().lines_flushed, 4);
    }
}
