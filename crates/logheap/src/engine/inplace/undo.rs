//! The `undo` engine: undo logging ("Log-structured Non-volatile Main Memory", §5.3's
//! Mnemosyne-Undo, and PMDK's design) with 004's hybrid object / word logging, under
//! the TL2 driver.
//!
//! A commit, under the transaction's locks:
//! 1. **Undo log.** One record with the *old* bytes of every range the transaction
//!    writes, and its allocations and frees, goes to the thread's undo log, flushed,
//!    **fence**. Ranges inside blocks the transaction allocated are not logged: a
//!    rolled-back allocation is freed, so its old bytes do not matter (PMDK skips them
//!    too).
//! 2. **In place.** The new bytes are stored at home and the allocator's marks made,
//!    flushed, **fence**.
//! 3. **Commit.** The record is invalidated (its magic word zeroed), flushed,
//!    **fence**: the commit point.
//!
//! Three fences per transaction, whatever its size. The TL2 driver buffers writes and
//! takes its locks at commit, so the old bytes of all the transaction's ranges are
//! logged together, behind one fence; an undo PTM that stores in place as the
//! transaction runs (PMDK, Mnemosyne-Undo with encounter-time locking) fences once per
//! range it first writes. The persistent traffic is the same: old bytes, new bytes,
//! the invalidation.
//!
//! **Hybrid logging (004).** The written ranges of a transaction, sorted, are logged as
//! few entries as pays: two ranges whose gap is at most [`MERGE_GAP`] bytes become one
//! entry (the gap's bytes logged too), so an object the transaction mostly rewrites is
//! logged whole, as one entry, and sparse word writes each get an entry of their own.
//!
//! **Fast log (001's on-chip logging, `undo-fastlog`).** The record is written to the
//! fast log buffer, persistent as it is written, and invalidated there: one fence per
//! transaction (the in-place stores' and marks').
//!
//! Recovery rolls back every valid record: old bytes back home, allocations freed,
//! frees undone; then invalidates it.

use std::cell::Cell;

use super::options::UndoOptions;
use super::persist_policy::HomeStores;
use super::record::{self, EntryKind, HEADER, MAGIC_WORD, RecordBuilder, UNDO_MAGIC};
use super::stats::UndoStats;
use super::{
    EngineArea, EngineHeap, InPlace, LOG_HEADER, LogLease, Recovered, Start, flush_lines_once, lock,
};
use crate::engine::{EngineConfig, EngineFigures, EngineLifecycle, EngineStats};
use crate::error::Result;
use crate::file::EngineKind;
use crate::stm::SpareState;
use crate::stm::{CommitSet, Engine, Persisted};
use crate::stm::{ResolveScratch, Span};

/// The widest gap between two written ranges that are logged as one entry: an entry
/// costs a 16-byte header and up to 7 bytes of padding, so logging up to 32 unwritten
/// bytes instead costs about what a second entry would, and keeps an object's old
/// bytes in one piece. It must stay below the 64-byte lock stripe: then every byte of a
/// gap lies in a stripe the transaction has locked (the last of one range or the first
/// of the next), so no other transaction writes it meanwhile, and restoring it on a
/// rollback cannot undo another transaction's commit.
pub(crate) const MERGE_GAP: u64 = 32;

/// The undo engine's part of a transaction's state.
#[derive(Debug, Default)]
pub(crate) struct UndoScratch {
    lease: Option<LogLease>,
    record: RecordBuilder,
    spans: Vec<Span>,
    resolve: ResolveScratch,
    /// The ranges logged (merged).
    ranges: Vec<(u64, u64)>,
    /// The metadata lines of the transaction's allocator marks.
    marks: Vec<u64>,
}

thread_local! {
    static SPARE_STATE: SpareState<UndoScratch> = const { Cell::new(None) };
}

/// The undo engine (see the module docs).
#[derive(Debug)]
pub(crate) struct UndoEngine {
    pub core: InPlace,
    recovered: Recovered,
    /// `undo-fastlog`: records go to the fast log buffer (001).
    fast_log: bool,
    /// How the home stores are persisted (001's caching modes).
    home_stores: HomeStores,
}

impl UndoEngine {
    /// Creates or opens an undo pool.
    fn start(how: Start<'_>, config: &crate::Config, options: UndoOptions) -> Result<UndoEngine> {
        let (core, recovered) = InPlace::start(EngineKind::Undo, how, config, &mut recover, false)?;
        let home_stores = HomeStores::new(options.persist_policy, core.pool_size());
        Ok(UndoEngine {
            core,
            recovered,
            fast_log: options.fast_log,
            home_stores,
        })
    }
}

impl EngineLifecycle for UndoEngine {
    const KIND: EngineKind = EngineKind::Undo;
    type Options = UndoOptions;

    fn options(config: &EngineConfig) -> Option<UndoOptions> {
        match config {
            EngineConfig::Undo(options) => Some(*options),
            _ => None,
        }
    }

    in_place_lifecycle_common!();

    fn close(self) -> Result<()> {
        self.core.close()
    }

    fn figures(&self) -> EngineFigures {
        self.core.figures(EngineStats::Undo(UndoStats {
            logs: self.core.log_area_stats(&self.recovered),
        }))
    }
}

/// Merges sorted, disjoint `spans` into the ranges to log (see [`MERGE_GAP`]), leaving
/// out what lies in `fresh` (sorted blocks the transaction allocated).
pub(crate) fn ranges_to_log(spans: &[Span], fresh: &[(u64, u64)], out: &mut Vec<(u64, u64)>) {
    out.clear();
    let in_fresh = |home: u64, len: u64| {
        let k = fresh.partition_point(|&(h, _)| h <= home);
        k > 0 && {
            let (h, size) = fresh[k - 1];
            home + len <= h + size
        }
    };
    for sp in spans.iter().filter(|sp| !in_fresh(sp.home, sp.len)) {
        match out.last_mut() {
            Some((start, len)) if sp.home <= *start + *len + MERGE_GAP => {
                *len = sp.home + sp.len - *start;
            }
            _ => out.push((sp.home, sp.len)),
        }
    }
}

/// Undo recovery: rolls back each thread's unfinished transaction.
fn recover(area: &mut EngineArea<'_, '_>) -> Result<Recovered> {
    let positions = area.positions()?;
    let mut records = 0;
    for p in positions.iter().filter(|p| p.capacity > 0) {
        let at = p.area + LOG_HEADER;
        let media = area.media();
        let mut h = [0u8; HEADER];
        media.read(at as usize, &mut h);
        let header = record::RecordHeader::decode(&h);
        if header.magic != UNDO_MAGIC {
            continue;
        }
        let Some(len) = header.record_len(p.capacity - HEADER as u64) else {
            continue;
        };
        let bytes = media.read_vec(at as usize, len);
        let Some((_, entries)) = record::decode(&bytes, UNDO_MAGIC) else {
            continue; // torn: nothing was stored in place yet
        };
        for e in entries.iter().rev() {
            match e.kind {
                EntryKind::Data => {
                    if !area.replay.in_heap(e.home, e.len) {
                        return Err(area.corrupt(
                            at,
                            format!(
                                "an undo record names {:#x}+{}, outside the heap",
                                e.home, e.len
                            ),
                        ));
                    }
                    area.store_home(e.home, &bytes[e.data..e.data + e.len as usize]);
                }
                EntryKind::Alloc => {
                    area.replay.mark(e.home, e.len, false);
                    // Its bytes (not logged) may be home without their line's checksum.
                    area.seal(e.home, e.len);
                }
                EntryKind::Free => area.replay.mark(e.home, e.len, true),
            }
        }
        let media = area.media();
        media.fence();
        record::invalidate(media, at);
        records += 1;
    }
    Ok(Recovered {
        positions,
        last_version: 0,
        records,
        superseded: area.replay.superseded,
    })
}

impl Engine for UndoEngine {
    type Scratch = UndoScratch;
    type Heap = EngineHeap;
    const FRESH_BLOCKS_READ_ZERO: bool = false;

    in_place_engine_common!(UndoScratch, SPARE_STATE);

    #[inline]
    fn read_committed(&self, _s: &UndoScratch, home: u64, buf: &mut [u8]) -> bool {
        self.core.read(home, buf)
    }

    fn read_damage(&self, home: u64, len: u64) -> crate::Error {
        self.core.read_damage(home, len)
    }

    /// Undo log (fence), in place (fence), invalidate (fence).
    fn persist(&self, set: &CommitSet<'_>, s: &mut UndoScratch) -> Result<Persisted> {
        set.writes.resolve_into(&mut s.resolve, &mut s.spans);
        let allocs = set.allocs;
        if s.spans.is_empty() && allocs.allocs.is_empty() && allocs.frees.is_empty() {
            return Ok(Persisted::Nothing);
        }
        let media = &self.core.media;
        ranges_to_log(&s.spans, &allocs.allocs, &mut s.ranges);
        let b = &mut s.record;
        b.start();
        for &(home, len) in &s.ranges {
            b.data_with(home, len as usize, |d| media.read(home as usize, d));
        }
        for &(home, size) in &allocs.allocs {
            b.block(EntryKind::Alloc, home, size);
        }
        for &(home, size) in &allocs.frees {
            b.block(EntryKind::Free, home, size);
        }
        let lease = s.lease.as_ref().expect("leased before the commit");
        let mut pos = lock(&lease.log().position);
        self.core
            .ensure_area(lease.index, &mut pos, b.len() as u64)?;
        let at = pos.area + LOG_HEADER;
        drop(pos);
        let rec = b.seal(set.version, UNDO_MAGIC);
        let fast = self.fast_log;
        if fast {
            // 001: the record is persistent as it is written.
            media.write_fast_log(at as usize, rec);
        } else {
            media.write(at as usize, rec);
            media.flush(at as usize, rec.len());
            media.fence();
        }
        let bytes = set.writes.bytes();
        let mut payload = 0;
        let stores = &self.home_stores;
        s.marks.clear();
        for sp in &s.spans {
            stores.store(
                media,
                sp.home,
                &bytes[sp.at..sp.at + sp.len as usize],
                &mut s.marks,
            );
            payload += sp.len;
        }
        for sp in &s.spans {
            self.core.seal(sp.home, sp.len);
        }
        self.core.seal_blocks(&allocs.allocs);
        let heap = &self.core.heap.heap;
        for &(home, size) in &allocs.allocs {
            s.marks.extend(heap.tx_mark(home, size, true));
        }
        for &(home, size) in &allocs.frees {
            s.marks.extend(heap.tx_mark(home, size, false));
        }
        flush_lines_once(media, &mut s.marks);
        media.fence();
        if fast {
            media.write_fast_log(at as usize + MAGIC_WORD, &[0; 8]);
        } else {
            record::invalidate(media, at);
        }
        stores.transaction_done();
        Ok(Persisted::Durable { payload })
    }

    /// Nothing: the bytes are at home since `persist`.
    fn publish(&self, _set: &CommitSet<'_>, _s: &mut UndoScratch) {}

    fn make_room(&self, _s: &mut UndoScratch, _since: std::time::Instant) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(home: u64, len: u64) -> Span {
        Span { home, len, at: 0 }
    }

    #[test]
    fn near_ranges_are_logged_as_one_and_fresh_blocks_not_at_all() {
        let spans = [
            span(0, 8),
            span(16, 8),
            span(100, 8),
            span(1000, 8),
            span(1010, 4),
        ];
        let mut out = Vec::new();
        ranges_to_log(&spans, &[], &mut out);
        assert_eq!(out, vec![(0, 24), (100, 8), (1000, 14)]);
        ranges_to_log(&spans, &[(96, 64)], &mut out);
        assert_eq!(
            out,
            vec![(0, 24), (1000, 14)],
            "100..108 is in a fresh block"
        );
        ranges_to_log(&spans, &[(0, 20)], &mut out);
        assert_eq!(
            out,
            vec![(16, 8), (100, 8), (1000, 14)],
            "16..24 leaves the fresh block"
        );
    }
}
