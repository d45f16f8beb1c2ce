//! The `redo` engine: Mnemosyne-style redo logging ("Log-structured Non-volatile Main
//! Memory", §5.3's Mnemosyne baseline) under the TL2 driver.
//!
//! A commit, under the transaction's locks:
//! 1. **Log.** One record with the transaction's final bytes (the write set resolved:
//!    each byte once), its allocations and its frees is appended to the thread's redo
//!    log, flushed, and made durable with **one fence**: the commit point.
//! 2. **Apply.** The bytes are stored at home and the allocator's marks made
//!    (`PersistentHeap::tx_mark`), all flushed, *not* fenced: the thread's next fence
//!    (its next commit's) makes them durable.
//! 3. **Truncate, lazily and in batches.** A log is reused from its start once every
//!    record in it is *retired*: the pool keeps one retired version R, and every record
//!    of version <= R is dead. A thread whose log is full advances R to the newest
//!    version below which every commit has finished: it flushes again what other
//!    threads applied and have not fenced yet (`clwb` writes a line back from whichever
//!    core holds it), fences, and stores R (one more fence).
//!
//! So a transaction costs **one fence**, plus two per truncation, which comes once per
//! log-full of records (a 16 KiB to 1 MiB log: tens to thousands of transactions).
//! Mnemosyne truncates in a background log manager; here the thread that needs room
//! does it, which keeps the fence count and moves the cost onto one commit in many.
//!
//! **Fast log (001's on-chip logging, `redo-fastlog`).** The record is written to the
//! fast log buffer, persistent as it is written: the commit needs no fence at all. The
//! home stores of a thread's transactions stay flushed and unfenced (listed in its
//! slot) until a truncation flushes them again and fences.
//!
//! Recovery replays, in version order over all threads' logs, every valid record of a
//! version above R (a log's records since its last reset, which increase), then stores
//! R. Replaying in version order makes an older record harmless even where a newer
//! transaction reused its space (see `alloc::persistent_heap::tx`).

use std::cell::Cell;
use std::fmt::Debug;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::LocalKey;

use super::options::RedoOptions;
use super::record::{self, EntryKind, HEADER, REDO_MAGIC, RecordBuilder};
use super::stats::RedoStats;
use super::words::WordMap;
use super::{
    EngineArea, EngineHeap, InPlace, LOG_HEADER, LogLease, LogPosition, Recovered, Start,
    flush_lines_once, lock, outside, write_flushed,
};
use crate::engine::{EngineConfig, EngineFigures, EngineLifecycle, EngineStats};
use crate::error::Result;
use crate::file::EngineKind;
use crate::media::CACHE_LINE;
use crate::media::Media;
use crate::stm::SpareState;
use crate::stm::{CommitSet, Domain, Engine, Persisted};
use crate::stm::{ResolveScratch, Span};

/// Records are placed at cache-line boundaries, so no line is flushed for two records.
const RECORD_ALIGN: u64 = 64;

/// The redo family's part of a transaction's state.
#[derive(Debug, Default)]
pub(crate) struct RedoScratch {
    lease: Option<LogLease>,
    pub(super) record: RecordBuilder,
    pub(super) spans: Vec<Span>,
    resolve: ResolveScratch,
    pub(super) flushed: Vec<(u64, u64)>,
    /// The metadata lines of the transaction's allocator marks.
    marks: Vec<u64>,
    /// hoop: the transaction's words, their offsets in the record, where the record is.
    pub(super) words: Vec<(u64, u64)>,
    pub(super) locs: Vec<(u64, u64)>,
    pub(super) run: Vec<u8>,
    pub(super) record_at: u64,
    pub(super) mapped: Vec<(u64, WordMap)>,
    /// hoop: the last commit stopped because its log held records not yet collected.
    log_not_retired: bool,
}

/// How a redo-logged commit reaches home: the one thing `redo` and `hoop` do
/// differently (PMDK's one mechanism, parameterised). `redo` ([`StoreHome`]) stores the
/// bytes home at publish; `hoop` (`hoop::Hoop`) leaves them in the log, sends reads to
/// them through a DRAM table, and writes them home in collections.
pub(crate) trait HomePath: Debug + Send + Sync + Sized + 'static {
    /// The engine kind of the pools it runs.
    const KIND: EngineKind;
    /// Whether home stores wait for collections (so a full log is collected, not
    /// waited for).
    const DEFERS_HOME: bool;
    /// A collection in progress (see [`collect_begin`](Self::collect_begin)).
    type Collection;
    /// The thread-local slot keeping a finished transaction's state (one per engine).
    fn spare() -> &'static LocalKey<SpareState<RedoScratch>>;
    /// Replaces in `buf`, a copy of the home bytes of `[home, home + buf.len())`, the
    /// bytes whose committed copy is elsewhere.
    fn overlay(&self, media: &Media, home: u64, buf: &mut [u8]);
    /// Adds the transaction's resolved writes (`s.spans` over `bytes`) to its record
    /// (`s.record`) and returns the payload bytes.
    fn record(&self, media: &Media, bytes: &[u8], s: &mut RedoScratch) -> u64;
    /// Makes a durable commit's writes visible: its stores, flushed ranges pushed to
    /// `s.flushed`; `frees` are the blocks it freed.
    fn publish(&self, media: &Media, bytes: &[u8], frees: &[(u64, u64)], s: &mut RedoScratch);
    /// Before a truncation retires the logs (no stripe lock held): whatever of them is
    /// not home yet goes home, flushed; the truncation fences.
    /// `seal` keeps the data checksums of the home bytes it stores.
    fn collect_begin(
        &self,
        shared: &Domain,
        media: &Media,
        seal: &dyn Fn(u64, u64),
    ) -> Option<Self::Collection>;
    /// After the truncation stored the retired version.
    fn collect_end(&self, shared: &Domain, collection: Option<Self::Collection>);
}

/// `redo`'s home path: the bytes are stored home at publish.
#[derive(Debug, Default)]
pub(crate) struct StoreHome;

thread_local! {
    static SPARE_STATE: SpareState<RedoScratch> = const { Cell::new(None) };
}

impl HomePath for StoreHome {
    const KIND: EngineKind = EngineKind::Redo;
    const DEFERS_HOME: bool = false;
    type Collection = ();

    fn spare() -> &'static LocalKey<SpareState<RedoScratch>> {
        &SPARE_STATE
    }

    #[inline]
    fn overlay(&self, _media: &Media, _home: u64, _buf: &mut [u8]) {}

    fn record(&self, _media: &Media, bytes: &[u8], s: &mut RedoScratch) -> u64 {
        let mut payload = 0;
        for sp in &s.spans {
            s.record
                .data(sp.home, &bytes[sp.at..sp.at + sp.len as usize]);
            payload += sp.len;
        }
        payload
    }

    fn publish(&self, media: &Media, bytes: &[u8], _frees: &[(u64, u64)], s: &mut RedoScratch) {
        for sp in &s.spans {
            media.write(sp.home as usize, &bytes[sp.at..sp.at + sp.len as usize]);
            s.flushed.push((sp.home, sp.len));
        }
        // Then each line once: the spans are sorted, and an object's fields written one
        // by one often share lines. (Stored first: a flush covers only earlier stores.)
        let mut flushed_to = 0;
        for sp in &s.spans {
            let (from, end) = (sp.home.max(flushed_to), sp.home + sp.len);
            if from < end {
                media.flush(from as usize, (end - from) as usize);
                flushed_to = end.next_multiple_of(CACHE_LINE as u64);
            }
        }
    }

    fn collect_begin(&self, _: &Domain, _: &Media, _: &dyn Fn(u64, u64)) -> Option<()> {
        None
    }

    fn collect_end(&self, _: &Domain, _: Option<()>) {}
}

/// A redo-logging engine (see the module docs) with home path `P`.
#[derive(Debug)]
pub(crate) struct RedoLogging<P> {
    pub core: InPlace,
    /// The retired version R, as stored; held while truncating.
    retired: Mutex<u64>,
    /// Huge blocks freed, by the version that freed them: given back once retired.
    deferred: Mutex<Vec<(u64, u64)>>,
    truncations: AtomicU64,
    recovered: Recovered,
    /// `redo-fastlog`: records go to the fast log buffer (001).
    fast_log: bool,
    /// How commits reach home.
    pub(super) path: P,
}

/// The `redo` engine.
pub(crate) type RedoEngine = RedoLogging<StoreHome>;

impl<P: HomePath> RedoLogging<P> {
    /// Creates or opens a pool of `P`'s kind.
    pub(super) fn start_with(
        how: Start<'_>,
        config: &crate::Config,
        fast_log: bool,
        path: P,
    ) -> Result<Self> {
        let (core, recovered) = InPlace::start(P::KIND, how, config, &mut recover, true)?;
        let retired = core.shared.clock.now();
        Ok(RedoLogging {
            core,
            retired: Mutex::new(retired),
            deferred: Mutex::default(),
            truncations: AtomicU64::new(0),
            recovered,
            fast_log,
            path,
        })
    }

    /// Advances the retired version as far as every finished commit, and returns it.
    fn truncate(&self) -> u64 {
        let mut retired = lock(&self.retired);
        let target = self.core.shared.committed_through();
        if target <= *retired {
            return *retired;
        }
        let media = &self.core.media;
        let me = std::thread::current().id();
        // hoop: every mapped word's newest copy goes home first (no record at or below
        // the target may be needed once it is retired).
        let collection = self
            .path
            .collect_begin(&self.core.shared, media, &|home, len| {
                self.core.seal(home, len)
            });
        for log in self.core.logs().logs.iter() {
            let mut u = lock(&log.unfenced);
            // This thread's own flushes need only its fence.
            let own = u.thread == Some(me);
            if u.version != 0 && u.version <= target {
                if !own {
                    for &(offset, len) in &u.ranges {
                        media.flush(offset as usize, len as usize);
                    }
                }
                u.version = 0;
                u.ranges.clear();
            } else if u.version != 0 && self.fast_log && !own {
                // Fast log: the ranges of several transactions, some at or below the
                // target: flushed (and fenced below), kept for the newer ones.
                for &(offset, len) in &u.ranges {
                    media.flush(offset as usize, len as usize);
                }
            }
        }
        media.fence();
        self.core.store_retired(target);
        self.path.collect_end(&self.core.shared, collection);
        *retired = target;
        drop(retired);
        self.truncations.fetch_add(1, Ordering::Relaxed);
        let ready: Vec<u64> = {
            let mut d = lock(&self.deferred);
            let (ready, keep): (Vec<_>, Vec<_>) = d.drain(..).partition(|&(v, _)| v <= target);
            *d = keep;
            ready.into_iter().map(|(_, home)| home).collect()
        };
        for home in ready {
            self.core.heap.heap.tx_release(home);
        }
        target
    }

    /// Makes room for `needed` bytes at the log's start: waits until every record in it
    /// is retired, then resets it (growing its area if it is too small).
    fn make_space(&self, slot: usize, pos: &mut LogPosition, needed: u64) -> Result<()> {
        while pos.newest > self.truncate() {
            // An older transaction of another thread is still committing.
            std::thread::yield_now();
        }
        pos.tail = 0;
        pos.newest = 0;
        self.core.ensure_area(slot, pos, needed)
    }

    /// hoop: resets the log if every record in it is retired and returns `true`; else
    /// `false`, so the commit lets its locks go and collects in `make_room`.
    fn reset_retired_log(&self, slot: usize, pos: &mut LogPosition, needed: u64) -> Result<bool> {
        // Not waiting for the lock: a collection holds it while it waits for stripe
        // locks this transaction may hold.
        let retired = match self.retired.try_lock() {
            Ok(r) => *r,
            Err(std::sync::TryLockError::Poisoned(p)) => *p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(false),
        };
        if pos.newest > retired {
            return Ok(false);
        }
        pos.tail = 0;
        pos.newest = 0;
        self.core.ensure_area(slot, pos, needed)?;
        Ok(true)
    }

    /// Retires everything and closes the pool cleanly.
    pub(super) fn close_retired(self) -> Result<()> {
        self.truncate();
        self.core.close()
    }

    /// The figures of its logs and truncations.
    pub(super) fn redo_stats(&self) -> RedoStats {
        RedoStats {
            logs: self.core.log_area_stats(&self.recovered),
            truncations: self.truncations.load(Ordering::Relaxed),
        }
    }
}

impl RedoEngine {
    fn start(how: Start<'_>, config: &crate::Config, options: RedoOptions) -> Result<Self> {
        Self::start_with(how, config, options.fast_log, StoreHome)
    }
}

impl EngineLifecycle for RedoEngine {
    const KIND: EngineKind = EngineKind::Redo;
    type Options = RedoOptions;

    fn options(config: &EngineConfig) -> Option<RedoOptions> {
        match config {
            EngineConfig::Redo(options) => Some(*options),
            _ => None,
        }
    }

    in_place_lifecycle_common!();

    fn figures(&self) -> EngineFigures {
        self.core.figures(EngineStats::Redo(self.redo_stats()))
    }

    fn close(self) -> Result<()> {
        self.close_retired()
    }
}

/// Redo recovery (see the module docs).
fn recover(area: &mut EngineArea<'_, '_>) -> Result<Recovered> {
    let retired = area.retired();
    let positions = area.positions()?;
    let media = area.media();
    let mut records: Vec<(u64, u64, Vec<u8>, Vec<record::Entry>)> = Vec::new();
    for p in positions.iter().filter(|p| p.capacity > 0) {
        let mut tail = 0u64;
        let mut previous = 0u64;
        while tail + HEADER as u64 <= p.capacity {
            let at = p.area + LOG_HEADER + tail;
            let mut h = [0u8; HEADER];
            media.read(at as usize, &mut h);
            let header = record::RecordHeader::decode(&h);
            if header.magic != REDO_MAGIC || header.version <= previous {
                break; // the end of the log, or an older lap's record
            }
            let Some(len) = header.record_len(p.capacity - tail - HEADER as u64) else {
                break;
            };
            let bytes = media.read_vec(at as usize, len);
            let Some((header, entries)) = record::decode(&bytes, REDO_MAGIC) else {
                break; // torn: the commit did not happen
            };
            if header.version > retired {
                records.push((header.version, at, bytes, entries));
            }
            previous = header.version;
            tail += (len as u64).next_multiple_of(RECORD_ALIGN);
        }
    }
    records.sort_unstable_by_key(|r| r.0);
    // Log areas are allocated outside transactions, possibly over space a replayed
    // record wrote or freed (its free retired or replayed too): a write there is stale
    // and skipped, and each area is marked allocated again after the replay.
    let areas = EngineArea::areas(&positions);
    let in_area = |home: u64, len: u64| {
        areas
            .iter()
            .any(|&(a, bytes)| home < a + bytes && a < home + len)
    };
    if let Some(w) = records.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(area.corrupt(w[1].1, format!("two redo records of version {}", w[1].0)));
    }
    for (_, at, bytes, entries) in &records {
        for e in entries {
            match e.kind {
                EntryKind::Data => {
                    if !area.replay.in_heap(e.home, e.len) {
                        return Err(area.corrupt(
                            *at,
                            format!(
                                "a redo record writes outside the heap at {:#x}+{}",
                                e.home, e.len
                            ),
                        ));
                    }
                    let data = &bytes[e.data..e.data + e.len as usize];
                    if in_area(e.home, e.len) {
                        write_outside_areas(area.media(), e.home, data, &areas);
                    } else {
                        write_flushed(area.media(), e.home, data);
                    }
                    area.seal(e.home, e.len);
                }
                EntryKind::Alloc => {
                    area.replay.mark(e.home, e.len, true);
                    area.seal(e.home, e.len);
                }
                EntryKind::Free => area.replay.mark(e.home, e.len, false),
            }
        }
    }
    if !records.is_empty() {
        for &(a, bytes) in &areas {
            area.replay.mark(a, bytes, true);
        }
    }
    let last = records.last().map_or(retired, |r| r.0.max(retired));
    if !records.is_empty() {
        area.media().fence();
        area.set_retired(last);
    }
    Ok(Recovered {
        positions,
        last_version: last,
        records: records.len() as u64,
        superseded: area.replay.superseded,
    })
}

/// Stores the bytes of `data` (for `home`) that lie in none of `areas`, flushed.
fn write_outside_areas(media: &Media, home: u64, data: &[u8], areas: &[(u64, u64)]) {
    let mut cuts: Vec<(u64, u64)> = areas
        .iter()
        .map(|&(a, bytes)| (a.max(home), (a + bytes).min(home + data.len() as u64)))
        .filter(|&(s, e)| s < e)
        .collect();
    cuts.sort_unstable();
    let mut at = home;
    for (s, e) in cuts.into_iter().chain([(home + data.len() as u64, 0)]) {
        if s > at {
            let piece = &data[(at - home) as usize..(s - home) as usize];
            write_flushed(media, at, piece);
        }
        at = at.max(e);
    }
}

impl<P: HomePath> Engine for RedoLogging<P> {
    type Scratch = RedoScratch;
    type Heap = EngineHeap;
    const FRESH_BLOCKS_READ_ZERO: bool = false;

    in_place_engine_common!(RedoScratch);

    fn spare() -> &'static LocalKey<SpareState<RedoScratch>> {
        P::spare()
    }

    #[inline]
    fn read_committed(&self, _s: &RedoScratch, home: u64, buf: &mut [u8]) -> bool {
        let intact = self.core.read(home, buf);
        self.path.overlay(&self.core.media, home, buf);
        intact
    }

    fn read_damage(&self, home: u64, len: u64) -> crate::Error {
        self.core.read_damage(home, len)
    }

    /// Appends the redo record and fences: the commit point.
    fn persist(&self, set: &CommitSet<'_>, s: &mut RedoScratch) -> Result<Persisted> {
        set.writes.resolve_into(&mut s.resolve, &mut s.spans);
        // Writes to blocks the transaction allocated and freed again go nowhere: their
        // space is given back at once, and a replayed write must not land on it.
        let freed_again = &set.allocs.alloc_then_freed;
        if !freed_again.is_empty() {
            s.spans = s
                .spans
                .iter()
                .flat_map(|&sp| outside(sp, freed_again))
                .collect();
        }
        let bytes = set.writes.bytes();
        s.record.start();
        let payload = self.path.record(&self.core.media, bytes, s);
        let b = &mut s.record;
        for &(home, size) in &set.allocs.allocs {
            b.block(EntryKind::Alloc, home, size);
        }
        for &(home, size) in &set.allocs.frees {
            b.block(EntryKind::Free, home, size);
        }
        if b.is_empty() {
            return Ok(Persisted::Nothing);
        }
        let lease = s.lease.as_ref().expect("leased before the commit");
        let log = lease.log();
        let mut pos = lock(&log.position);
        let needed = (b.len() as u64).next_multiple_of(RECORD_ALIGN);
        if pos.area == 0 || pos.tail + needed > pos.capacity {
            if P::DEFERS_HOME {
                if !self.reset_retired_log(lease.index, &mut pos, needed)? {
                    s.log_not_retired = true;
                    return Err(crate::Error::PoolFull);
                }
            } else {
                self.make_space(lease.index, &mut pos, needed)?;
            }
        }
        let at = (pos.area + LOG_HEADER + pos.tail) as usize;
        s.record_at = at as u64;
        let rec = b.seal(set.version, REDO_MAGIC);
        let media = &self.core.media;
        if self.fast_log {
            // 001: the record is persistent as it is written: the commit point, with
            // no fence. The home stores of this thread's transactions stay flushed and
            // unfenced until a truncation fences them.
            media.write_fast_log(at, rec);
            pos.tail += needed;
            pos.newest = set.version;
            return Ok(Persisted::Durable { payload });
        }
        media.write(at, rec);
        media.flush(at, rec.len());
        pos.tail += needed;
        pos.newest = set.version;
        drop(pos);
        // The fence also makes the slot's last in-place stores durable: flushed by this
        // thread, or flushed here again when another thread (which held the lease
        // before) flushed them.
        let mut u = lock(&log.unfenced);
        if u.version != 0 && u.thread != Some(std::thread::current().id()) {
            for &(offset, len) in &u.ranges {
                media.flush(offset as usize, len as usize);
            }
        }
        media.fence();
        u.version = 0;
        u.ranges.clear();
        Ok(Persisted::Durable { payload })
    }

    /// Stores the transaction's bytes and marks at home, flushed (fenced by the
    /// thread's next fence, or by a truncation).
    fn publish(&self, set: &CommitSet<'_>, s: &mut RedoScratch) {
        let media = &self.core.media;
        let heap = &self.core.heap.heap;
        let bytes = set.writes.bytes();
        s.flushed.clear();
        self.path.publish(media, bytes, &set.allocs.frees, s);
        if self.core.checksums.is_some() {
            // The lines stored home (none for hoop, whose stores wait for a
            // collection), and the blocks allocated, whole.
            if !P::DEFERS_HOME {
                for sp in &s.spans {
                    self.core.seal_tracked(sp.home, sp.len, &mut s.flushed);
                }
            }
            for &(home, size) in &set.allocs.allocs {
                self.core.seal_tracked(home, size, &mut s.flushed);
            }
        }
        s.marks.clear();
        for &(home, size) in &set.allocs.allocs {
            s.marks.extend(heap.tx_mark(home, size, true));
        }
        for &(home, size) in &set.allocs.frees {
            s.marks.extend(heap.tx_mark(home, size, false));
            if heap.tx_is_huge(home) {
                lock(&self.deferred).push((set.version, home));
            }
        }
        flush_lines_once(media, &mut s.marks);
        s.flushed
            .extend(s.marks.iter().map(|&line| (line, CACHE_LINE as u64)));
        let lease = s.lease.as_ref().expect("leased before the commit");
        let mut u = lock(&lease.log().unfenced);
        u.version = set.version;
        let previous = u.thread.replace(std::thread::current().id());
        if self.fast_log {
            // No commit fences: every transaction's stores wait for a truncation. They
            // are all this thread's flushes (a previous lease holder's are flushed
            // again here), so a truncation by this thread need not flush them again.
            if previous != u.thread {
                for &(offset, len) in &u.ranges {
                    media.flush(offset as usize, len as usize);
                }
            }
            u.ranges.append(&mut s.flushed);
        } else {
            std::mem::swap(&mut u.ranges, &mut s.flushed);
        }
    }

    /// Out of space: a truncation gives back freed huge blocks it was holding.
    fn make_room(&self, s: &mut RedoScratch, _since: std::time::Instant) -> bool {
        if P::DEFERS_HOME && std::mem::take(&mut s.log_not_retired) {
            // The thread's log is full of records not yet collected: collect (no lock
            // is held now) unless another collection retired them meanwhile, then the
            // commit tries again. When an older transaction of another thread is still
            // committing, R cannot pass it yet: let it finish.
            let newest = s
                .lease
                .as_ref()
                .map_or(0, |l| lock(&l.log().position).newest);
            if newest > *lock(&self.retired) && self.truncate() < newest {
                std::thread::yield_now();
            }
            return true;
        }
        let pending = lock(&self.deferred).len();
        pending > 0 && {
            self.truncate();
            lock(&self.deferred).len() < pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::outside;
    use super::*;

    #[test]
    fn a_write_keeps_its_bytes_outside_blocks_freed_again() {
        let sp = Span {
            home: 100,
            len: 100,
            at: 7,
        };
        let pieces = outside(sp, &[(120, 20), (180, 64)]);
        assert_eq!(
            pieces,
            vec![
                Span {
                    home: 100,
                    len: 20,
                    at: 7
                },
                Span {
                    home: 140,
                    len: 40,
                    at: 47
                },
            ]
        );
        assert_eq!(outside(sp, &[(0, 50)]), vec![sp]);
        assert!(outside(sp, &[(90, 200)]).is_empty());
    }
}
