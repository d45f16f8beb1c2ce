//! The heap as the allocator of a transaction engine that keeps its data in place
//! (`redo`, `undo`): PMDK's reserve / publish split ("palloc_reserve",
//! "palloc_publish") over PAllocator's metadata (002).
//!
//! - A transaction *reserves* a block: DRAM only ([`PersistentHeap::tx_reserve`]), so
//!   an attempt that aborts gives it back ([`PersistentHeap::tx_release`]) and a crash
//!   leaks nothing.
//! - Its commit *marks* the block allocated (or a freed block free) in the persistent
//!   metadata ([`PersistentHeap::tx_mark`]): the bitmap bit of a small block, the
//!   page-table word of a big one, the table entry of a huge one. The heap stores a
//!   mark; the engine flushes the lines of a transaction's marks, each distinct line
//!   once, and never fences them: they ride on the engine's fences, and its log holds
//!   it too, so recovery redoes it (redo) or reverses it (undo) with
//!   [`Replay::mark`] before the heap builds its DRAM state.
//! - A committed free gives the block back in DRAM once the commit is durable.
//!
//! A redo log may be replayed over space that later transactions reused (records are
//! retired lazily). Two rules keep that safe: an engine's heap keeps its empty segments
//! (a small or big segment never becomes something else while the pool is open, so a
//! replayed data write never lands on allocator metadata), and the redo engine gives a
//! freed huge block's regions back only once its log no longer holds the free. A
//! replayed mark whose place no longer matches the segment table (its space was given
//! back and reused by later, also replayed, transactions) is skipped and counted.

use std::ops::Range;
use std::sync::atomic::Ordering;

use super::PersistentHeap;
use super::reader::Reader;
use super::state::{
    SizePolicy, USE_ARENA, USE_BIG, USE_HUGE, USE_HUGE_TAIL, USE_KIND, USE_SMALL, USE_VOLATILE,
    arena_hint,
};
use super::steps::Step;
use crate::alloc::big;
use crate::alloc::layout::{CHUNK, GRANULE, MicroLogSlot, MicroOp, TableEntry};
use crate::alloc::small;
use crate::error::{Error, Result};
use crate::media::Media;

/// An engine's recovery, run by the heap while it opens (see
/// [`PersistentHeap::open_for_engine`]).
pub(crate) type EngineReplay<'f> = &'f mut dyn FnMut(&mut Replay<'_>) -> Result<()>;

/// What an engine's recovery may do to the heap before its DRAM state is built.
pub(crate) struct Replay<'a> {
    pub(super) reader: &'a Reader<'a>,
    pub(super) entries: Vec<Option<TableEntry>>,
    /// Marks skipped because their place no longer matches the segment table.
    pub(crate) superseded: u64,
}

impl Replay<'_> {
    /// The heap's media.
    pub(crate) fn media(&self) -> &Media {
        self.reader.media
    }

    /// The root area.
    pub(crate) fn root(&self) -> Range<u64> {
        self.reader.root.clone()
    }

    /// The end of the pool file's regions: every byte a transaction may store lies
    /// below it.
    pub(crate) fn data_end(&self) -> u64 {
        let sb = self.reader.sb;
        sb.region_offset(sb.local_regions)
    }

    /// Whether `[offset, offset + len)` (not empty) lies in the root area or in the
    /// regions of the pool file: where a logged write may go.
    pub(crate) fn in_heap(&self, offset: u64, len: u64) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if self.reader.root.start <= offset && end <= self.reader.root.end {
            return true;
        }
        let sb = self.reader.sb;
        let regions_end = sb.region_offset(sb.local_regions);
        len > 0 && offset >= sb.regions_offset && end <= regions_end
    }

    /// Redoes (or, for an undo, reverses) the mark of a block at `offset` of `size`
    /// bytes (as [`PersistentHeap::tx_mark`] recorded it): stored and flushed, not
    /// fenced. Skipped, and counted in `superseded`, when its place no longer matches
    /// the segment table.
    pub(crate) fn mark(&mut self, offset: u64, size: u64, allocate: bool) {
        let op = if allocate {
            MicroOp::Allocate
        } else {
            MicroOp::Free
        };
        let record = MicroLogSlot::unsequenced(op, 0, offset, size);
        match self.reader.plan(&record, &self.entries) {
            Ok(step) => {
                step.apply(self.reader.media, self.reader.sb, op, size);
                if let Step::Huge { region, .. } = step {
                    self.entries[region as usize] = self.reader.entry(region).ok().flatten();
                }
            }
            Err(_) => self.superseded += 1,
        }
    }
}

impl PersistentHeap {
    /// Reserves a block of `size` bytes for a transaction (DRAM only, though taking a
    /// new segment stores and fences the segment's table entry) and returns its offset.
    ///
    /// # Errors
    /// [`Error::InvalidSize`] for 0 or more than [`max_allocation`](Self::max_allocation);
    /// [`Error::PoolFull`] when no block is free.
    pub(crate) fn tx_reserve(&self, size: u64) -> Result<u64> {
        let policy = SizePolicy::of(self.sb.segment_size, size)
            .filter(|_| size <= self.max_allocation())
            .ok_or(Error::InvalidSize(size))?;
        let a = arena_hint() % self.arenas.len();
        let mut arena = self.arenas[a].lock().expect("arena lock");
        self.reserve(a, &mut arena, policy, size, false)
            .map(|(offset, _, _)| offset)
    }

    /// The size to record for the live (or reserved) block at `offset`: a huge block's
    /// requested size (what its table entry keeps), else its usable size. `None` when
    /// no block starts there.
    pub(crate) fn tx_size_of(&self, offset: u64) -> Option<u64> {
        let region = self.sb.region_of(offset)? as u32;
        let used = self.uses[region as usize].load(Ordering::Acquire);
        if used & USE_VOLATILE != 0 {
            return None;
        }
        match used & USE_KIND {
            USE_SMALL | USE_BIG => {
                let arena = self.arenas[(used & USE_ARENA) as usize]
                    .lock()
                    .expect("arena lock");
                if self.uses[region as usize].load(Ordering::Acquire) != used {
                    return None;
                }
                self.held_block(&arena, used, region, offset)
                    .map(|(_, size)| size)
            }
            USE_HUGE if offset == self.sb.region_offset(u64::from(region)) => {
                self.entry(region).map(|e| e.requested)
            }
            _ => None,
        }
    }

    /// Whether the block at `offset` is huge.
    pub(crate) fn tx_is_huge(&self, offset: u64) -> bool {
        self.sb
            .region_of(offset)
            .is_some_and(|r| self.uses[r as usize].load(Ordering::Acquire) & USE_KIND == USE_HUGE)
    }

    /// Stores, without flushing, the persistent mark of the reserved or live block at
    /// `offset` of `size` bytes (its requested size when allocating, its
    /// [`tx_size_of`](Self::tx_size_of) when freeing): allocated or free. Idempotent.
    /// Returns the offset of the metadata stored, all in one cache line, which the
    /// caller flushes: a transaction's marks often share lines (a chunk's bitmap words),
    /// so the engine flushes each distinct line once (`None`: no block there, a bug of
    /// the caller).
    pub(crate) fn tx_mark(&self, offset: u64, size: u64, allocate: bool) -> Option<u64> {
        let op = if allocate {
            MicroOp::Allocate
        } else {
            MicroOp::Free
        };
        let Some(region) = self.sb.region_of(offset).map(|r| r as u32) else {
            debug_assert!(false, "a mark outside the regions");
            return None;
        };
        let used = self.uses[region as usize].load(Ordering::Acquire);
        match used & USE_KIND {
            USE_SMALL | USE_BIG => {
                // The bitmap word is shared with the chunk's other blocks: store it
                // under the arena's lock.
                let arena = self.arenas[(used & USE_ARENA) as usize]
                    .lock()
                    .expect("arena lock");
                let Some((held, _)) = self.held_block(&arena, used, region, offset) else {
                    debug_assert!(false, "a mark of a block the arena does not hold");
                    return None;
                };
                let step = self.step_of(held, region);
                Some(step.store_unflushed(&self.media, &self.sb, op, size).0)
            }
            USE_HUGE => {
                let Some(SizePolicy::Huge(count)) = SizePolicy::of(self.sb.segment_size, size)
                else {
                    debug_assert!(false, "a huge block's mark with a size not huge");
                    return None;
                };
                let step = Step::Huge {
                    region: u64::from(region),
                    count,
                };
                Some(step.store_unflushed(&self.media, &self.sb, op, size).0)
            }
            _ => {
                debug_assert!(false, "a mark of a region with no block");
                None
            }
        }
    }

    /// Gives the block at `offset` back to the DRAM free structures: a reservation
    /// that will not be published, or a block whose free is durable.
    pub(crate) fn tx_release(&self, offset: u64) {
        let Some(region) = self.sb.region_of(offset).map(|r| r as u32) else {
            return;
        };
        let used = self.uses[region as usize].load(Ordering::Acquire);
        match used & USE_KIND {
            USE_SMALL | USE_BIG => {
                let mut arena = self.arenas[(used & USE_ARENA) as usize]
                    .lock()
                    .expect("arena lock");
                if let Some((held, _)) = self.held_block(&arena, used, region, offset)
                    && arena.give_back(held)
                {
                    self.give_back_if_empty(&mut arena, used, region, true);
                }
            }
            USE_HUGE => {
                let mut regions = self.regions.lock().expect("regions lock");
                let mut count = 1u64;
                while (region as u64 + count) < self.sb.region_count
                    && self.uses[(region as u64 + count) as usize].load(Ordering::Acquire)
                        == USE_HUGE_TAIL
                {
                    count += 1;
                }
                self.free_huge_regions(&mut regions, region, count);
            }
            _ => {}
        }
    }

    /// Whether a transaction may read and write `[offset, offset + len)` (not empty):
    /// the root area, or the data (not the metadata) of the regions.
    pub(crate) fn tx_is_data(&self, offset: u64, len: u64) -> bool {
        if let Some(is_data) = self.fast_is_data(offset, len) {
            return is_data;
        }
        let Some(region) = self.sb.region_of(offset) else {
            return self.root.contains(&offset)
                && self.data_range(self.sb.block_addr(offset), len).is_ok();
        };
        if self.data_range(self.sb.block_addr(offset), len).is_ok() {
            return true;
        }
        // A huge block reserved by a transaction has no table entry yet: its run of
        // regions is known from their uses.
        let kind =
            |r: u64| self.uses[r as usize].load(Ordering::Acquire) & (USE_KIND | USE_VOLATILE);
        if !matches!(kind(region), USE_HUGE | USE_HUGE_TAIL) {
            return false;
        }
        let mut head = region;
        while kind(head) == USE_HUGE_TAIL && head > 0 {
            head -= 1;
        }
        let mut end = head + 1;
        while end < self.sb.region_count && kind(end) == USE_HUGE_TAIL {
            end += 1;
        }
        kind(head) == USE_HUGE
            && offset
                .checked_add(len)
                .is_some_and(|e| e <= self.sb.region_offset(end))
    }

    /// [`tx_is_data`](Self::tx_is_data) from the region table alone, for the ranges most
    /// accesses are: one starting in a region of small blocks (every object of up to a
    /// few KiB), answered from the region's geometry; one in a region of big blocks,
    /// whose data is all of it past its block table; and one inside a huge block (a
    /// large array), which spans whole regions from its head region through its tail
    /// regions (its head found by walking back, as the slow path does). `None` when
    /// the table alone does not answer (the slow path decides). The same answer as
    /// [`data_range`](Self::data_range)'s, without its round trip through a block
    /// address or the block table.
    #[inline]
    fn fast_is_data(&self, offset: u64, len: u64) -> Option<bool> {
        let region = self.sb.region_of(offset)?;
        let used = self.uses[region as usize].load(Ordering::Acquire) & USE_KIND;
        let end = offset.checked_add(len)?;
        match used {
            USE_SMALL => {
                let geometry =
                    small::Geometry::of(self.sb.region_offset(region), self.sb.segment_size);
                Some(
                    geometry
                        .chunk_containing(offset)
                        .is_some_and(|chunk| end <= chunk + CHUNK),
                )
            }
            USE_BIG => {
                // Past the region's block table, inside the region.
                let base = self.sb.region_offset(region);
                let data = base + big::table_granules(self.sb.segment_size) * GRANULE;
                Some(offset >= data && end <= base + self.sb.segment_size)
            }
            USE_HUGE | USE_HUGE_TAIL => {
                // The block's head region, back over its tails (a block being freed has
                // its head cleared first: then the slow path answers).
                let kind = |r: u64| self.uses[r as usize].load(Ordering::Acquire) & USE_KIND;
                let mut head = region;
                while head > 0 && kind(head) == USE_HUGE_TAIL {
                    head -= 1;
                }
                if kind(head) != USE_HUGE {
                    return None;
                }
                // A range whose every later region is a tail lies inside the block.
                let mut next = region + 1;
                while self.sb.region_offset(next) < end {
                    if next >= self.sb.region_count || kind(next) != USE_HUGE_TAIL {
                        return None;
                    }
                    next += 1;
                }
                Some(true)
            }
            _ => None,
        }
    }

    /// Every live block `(offset, usable size)`, sorted, from the persistent metadata.
    pub(crate) fn tx_blocks(&self) -> Result<Vec<(u64, u64)>> {
        let mut out: Vec<(u64, u64)> = self
            .blocks()?
            .into_iter()
            .filter_map(|b| Some((self.span_offset(b.addr)?, b.size)))
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// The pool file.
    pub(crate) fn pool_file(&self) -> &crate::file::PoolFile {
        &self.file
    }
}
