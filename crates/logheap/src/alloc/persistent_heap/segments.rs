//! Where blocks come from and where freed space goes: an arena's segments, runs of
//! free regions for huge blocks, and extension files; growing the heap by a file and
//! shrinking it by removing empty ones.

use std::collections::BTreeSet;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;

use super::PersistentHeap;
use super::state::{
    Arena, Held, Regions, SizePolicy, USE_ARENA, USE_BIG, USE_HUGE, USE_HUGE_TAIL, USE_KIND,
    USE_SMALL, USE_VOLATILE,
};
use super::steps::Step;
use crate::alloc::big::{self, BigBlock};
use crate::alloc::files::{NO_FILE, Slot, set_file_state, slot_place, write_file_entry};
use crate::alloc::layout::{
    CLASSES, ENTRY_STATE, FileEntry, FileKind, FileState, GRANULE, HUGE_THRESHOLD, LINE, LIVE,
    SegmentKind, Superblock, TableEntry,
};
use crate::alloc::small::{self, ChunkState, SmallBlock};
use crate::error::{Error, Result};

impl PersistentHeap {
    /// Takes a block of `size` bytes served by `policy` for arena `a` (DRAM only, plus
    /// taking a segment when the arena has no room): its file-0 offset, usable size and
    /// where its metadata step stores.
    pub(super) fn reserve(
        &self,
        a: usize,
        arena: &mut MutexGuard<'_, Arena>,
        policy: SizePolicy,
        size: u64,
        volatile: bool,
    ) -> Result<(u64, u64, Step)> {
        match policy {
            SizePolicy::Small(class) => {
                let b = match arena.small.take(class) {
                    Some(b) => b,
                    None => {
                        self.add_segment(a, arena, SegmentKind::Small, volatile)?;
                        arena.small.take(class).expect("a new segment has room")
                    }
                };
                let region = self.sb.region_of(b.chunk).expect("a chunk is in a region");
                let step = Step::Small {
                    header: self.small_geometry(region as u32).header_of(b.chunk),
                    class,
                    block: b.block,
                };
                Ok((b.offset(), u64::from(CLASSES[class]), step))
            }
            SizePolicy::Big(len) => {
                let b = match arena.big.take(len) {
                    Some(b) => b,
                    None => {
                        self.add_segment(a, arena, SegmentKind::Big, volatile)?;
                        arena.big.take(len).expect("a new segment has room")
                    }
                };
                let base = self.sb.region_offset(u64::from(b.region));
                let step = Step::Big {
                    region: u64::from(b.region),
                    granule: u64::from(b.granule),
                    len: u64::from(len),
                };
                Ok((
                    base + u64::from(b.granule) * GRANULE,
                    u64::from(len) * GRANULE,
                    step,
                ))
            }
            SizePolicy::Huge(count) => {
                let mut regions = self.regions.lock().expect("regions lock");
                let own_file = size >= HUGE_THRESHOLD || count > self.sb.file_regions;
                let in_file = if self.sb.max_files > 0 && own_file && !volatile {
                    // 002: a file of its own, removed when the block is freed (also for
                    // a block no extension file could hold); when no slots are left, a
                    // run of free regions as in a heap of one file.
                    let slots = count.div_ceil(self.sb.file_regions);
                    match self.add_file(&mut regions, FileKind::Huge, slots, count) {
                        Ok(k) => Some(self.sb.slot_region(k) as u32),
                        Err(Error::PoolFull) => None,
                        Err(e) => return Err(e),
                    }
                } else {
                    None
                };
                let start = if let Some(start) = in_file {
                    start
                } else {
                    let start = match first_run(&self.sb, &regions.free, count as u32) {
                        Some(start) => start,
                        None if count <= self.sb.file_regions => {
                            self.grow(&mut regions)?;
                            first_run(&self.sb, &regions.free, count as u32)
                                .ok_or(Error::PoolFull)?
                        }
                        None => return Err(Error::PoolFull),
                    };
                    for r in start..start + count as u32 {
                        regions.free.remove(&r);
                    }
                    start
                };
                let flag = if volatile {
                    regions.volatile_huge.insert(start, count);
                    USE_VOLATILE
                } else {
                    0
                };
                self.uses[start as usize].store(USE_HUGE | flag, Ordering::Release);
                for r in start + 1..start + count as u32 {
                    self.uses[r as usize].store(USE_HUGE_TAIL | flag, Ordering::Release);
                }
                let offset = self.sb.region_offset(u64::from(start));
                let step = Step::Huge {
                    region: u64::from(start),
                    count,
                };
                Ok((offset, count * self.sb.segment_size, step))
            }
        }
    }

    /// Takes a free region as a new segment of `kind` for arena `a`: zeroes its
    /// metadata and writes its table entry, durably (two fences), then adds it to the
    /// arena's DRAM state. A segment of the volatile heap gets the same DRAM state and
    /// no store at all (its region has no table entry, so it is free at the next open).
    fn add_segment(
        &self,
        a: usize,
        arena: &mut MutexGuard<'_, Arena>,
        kind: SegmentKind,
        volatile: bool,
    ) -> Result<()> {
        let mut regions = self.regions.lock().expect("regions lock");
        if regions.free.is_empty() {
            self.grow(&mut regions)?;
        }
        let r = regions.free.pop_first().ok_or(Error::PoolFull)?;
        regions.generation[r as usize] += 1;
        let generation = regions.generation[r as usize];
        drop(regions);
        let base = self.sb.region_offset(u64::from(r));
        let seg = self.sb.segment_size;
        let flag = if volatile { USE_VOLATILE } else { 0 };
        if !volatile {
            self.write_segment_entry(a, r, kind, generation);
        }
        match kind {
            SegmentKind::Small => {
                let g = small::Geometry::of(base, seg);
                let chunks = vec![ChunkState::default(); g.chunks as usize];
                arena.small.add_segment(g, chunks.into_boxed_slice());
                arena.small_segments.insert(r);
                self.uses[r as usize].store(USE_SMALL | flag | a as u32, Ordering::Release);
            }
            _ => {
                let first = big::table_granules(seg) as u32;
                let granules = (seg / GRANULE) as u32;
                arena
                    .big
                    .add_segment(r, granules, &[(first, granules - first)], &[]);
                self.uses[r as usize].store(USE_BIG | flag | a as u32, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Creates an extension file of `kind` over `slots` free slots holding `regions`
    /// regions, durably: its entry as
    /// creating (two fences), the file, then its entry as live (one fence). Returns its
    /// first slot. The file's regions are in no free list.
    fn add_file(
        &self,
        regions: &mut Regions,
        kind: FileKind,
        slots: u64,
        count: u64,
    ) -> Result<u64> {
        let k = (0..regions.slots.len() as u64)
            .find(|&k| {
                k + slots <= self.sb.max_files
                    && (k..k + slots).all(|c| regions.slots[c as usize] == Slot::Empty)
            })
            .ok_or(Error::PoolFull)?;
        let e = FileEntry {
            slot: k,
            kind,
            slots,
            regions: count,
        };
        let (id, at) = slot_place(&self.sb, k);
        let bytes = count * self.sb.segment_size;
        write_file_entry(&self.media, &self.sb, &e, FileState::Creating);
        if let Err(err) = self.store.create(id, bytes, at) {
            // The file is not there (creation links it last, and a failed attach
            // leaves the slot unused): the entry goes.
            set_file_state(&self.media, &self.sb, k, None);
            if err.kind() == std::io::ErrorKind::AlreadyExists {
                regions.slots[k as usize] = Slot::Orphan;
            }
            return Err(Error::io(self.store.path(id), "create", err));
        }
        set_file_state(&self.media, &self.sb, k, Some(FileState::Live));
        regions.slots[k as usize] = Slot::File(kind, slots);
        for c in k + 1..k + slots {
            regions.slots[c as usize] = Slot::Covered;
        }
        let first = self.sb.slot_region(k);
        for r in first..first + count {
            self.region_file[r as usize].store(id as u32, Ordering::Release);
        }
        self.file_bytes[k as usize].store(bytes, Ordering::Release);
        Ok(k)
    }

    /// Removes the extension file starting at slot `k`, none of whose regions is in
    /// use or in a free list, durably: its entry as removing (one fence), the file, then
    /// no entry (one fence). On an error the slot stays unused until the next open
    /// finishes the removal.
    fn remove_file(&self, regions: &mut Regions, k: u64) -> std::io::Result<u64> {
        let Slot::File(_, slots) = regions.slots[k as usize] else {
            return Ok(0);
        };
        let (id, at) = slot_place(&self.sb, k);
        let bytes = self.file_bytes[k as usize].swap(0, Ordering::AcqRel);
        let first = self.sb.slot_region(k);
        for r in first..first + bytes / self.sb.segment_size {
            self.region_file[r as usize].store(NO_FILE, Ordering::Release);
        }
        set_file_state(&self.media, &self.sb, k, Some(FileState::Removing));
        regions.slots[k as usize] = Slot::Removing;
        self.store.remove(id, bytes, at)?;
        set_file_state(&self.media, &self.sb, k, None);
        for c in k..k + slots {
            regions.slots[c as usize] = Slot::Empty;
        }
        Ok(bytes)
    }

    /// Grows the heap by one extension file of segments, whose regions become free.
    fn grow(&self, regions: &mut Regions) -> Result<()> {
        if self.sb.max_files == 0 {
            return Err(Error::PoolFull);
        }
        let rpf = self.sb.file_regions;
        let k = self.add_file(regions, FileKind::Segments, 1, rpf)?;
        let first = self.sb.slot_region(k) as u32;
        regions.free.extend(first..first + rpf as u32);
        Ok(())
    }

    /// Marks the `count` regions of the huge block at `region` free: a huge block's
    /// own file is removed (see `remove_file`; a failure leaves it for the next open),
    /// other regions go back to the free list.
    pub(super) fn free_huge_regions(&self, regions: &mut Regions, region: u32, count: u64) {
        for r in region..region + count as u32 {
            self.uses[r as usize].store(0, Ordering::Release);
        }
        let own_file = self
            .sb
            .slot_of_region(u64::from(region))
            .filter(|&k| matches!(regions.slots[k as usize], Slot::File(FileKind::Huge, _)));
        match own_file {
            Some(k) => {
                let _ = self.remove_file(regions, k);
            }
            None => regions.free.extend(region..region + count as u32),
        }
    }

    /// Removes every extension file of segments whose regions are all free, giving its
    /// storage back (002: the pool "shrinks by removing empty files"); returns the files
    /// removed and their data bytes. Allocation waits while this runs.
    ///
    /// # Errors
    /// [`Error::Io`] when a file cannot be removed (the files before it are).
    pub fn shrink(&self) -> Result<(u64, u64)> {
        if self.sb.max_files == 0 {
            return Ok((0, 0));
        }
        // Empty segments in extension files go back first, even an arena's last one.
        let first_extension = self.sb.local_regions as usize;
        for (arenas, flag) in [(&self.arenas, 0), (&self.volatile, USE_VOLATILE)] {
            for (a, arena) in arenas.iter().enumerate() {
                let mut arena = arena.lock().expect("arena lock");
                for (r, used) in self.uses.iter().enumerate().skip(first_extension) {
                    let used = used.load(Ordering::Acquire);
                    let segment = matches!(used & USE_KIND, USE_SMALL | USE_BIG);
                    if segment && used & USE_VOLATILE == flag && (used & USE_ARENA) as usize == a {
                        self.give_back_if_empty(&mut arena, used, r as u32, false);
                    }
                }
            }
        }
        let mut regions = self.regions.lock().expect("regions lock");
        let (mut files, mut bytes) = (0, 0);
        for k in 0..self.sb.max_files {
            if regions.slots[k as usize] != Slot::File(FileKind::Segments, 1) {
                continue;
            }
            let first = self.sb.slot_region(k) as u32;
            let all = first..first + self.sb.file_regions as u32;
            if !all.clone().all(|r| regions.free.contains(&r)) {
                continue;
            }
            for r in all {
                regions.free.remove(&r);
            }
            let (id, _) = slot_place(&self.sb, k);
            bytes += self
                .remove_file(&mut regions, k)
                .map_err(|e| Error::io(self.store.path(id), "remove", e))?;
            files += 1;
        }
        Ok((files, bytes))
    }

    /// Zeroes the metadata of region `r` as a new segment of `kind` and writes its table
    /// entry, durably (two fences).
    fn write_segment_entry(&self, a: usize, r: u32, kind: SegmentKind, generation: u64) {
        let base = self.sb.region_offset(u64::from(r));
        let seg = self.sb.segment_size;
        match kind {
            SegmentKind::Small => {
                let headers = small::Geometry::of(base, seg).header_bytes as usize;
                self.media.fill(base as usize, headers, 0);
                self.media.flush(base as usize, headers);
            }
            _ => {
                let table = (big::table_granules(seg) * GRANULE) as usize;
                self.media.fill(base as usize, table, 0);
                self.media.flush(base as usize, table);
            }
        }
        let entry = TableEntry {
            index: r,
            kind,
            owner: a as u16,
            size: seg,
            generation,
            requested: 0,
        };
        let at = self.sb.entry_offset(u64::from(r)) as usize;
        self.media.write(at, &entry.encode_body(base));
        self.media.flush(at, LINE as usize);
        self.media.fence();
        self.media.write_u64(at + ENTRY_STATE as usize, LIVE);
        self.media.persist(at + ENTRY_STATE as usize, 8);
    }

    /// Gives the segment of `region` back to the free regions when it is empty and, with
    /// `keep_last`, its arena has another segment of its kind (so a thread allocating
    /// and freeing one block does not take and give back a segment each time).
    pub(super) fn give_back_if_empty(
        &self,
        arena: &mut MutexGuard<'_, Arena>,
        used: u32,
        region: u32,
        keep_last: bool,
    ) {
        if self.engine_owned && used & USE_VOLATILE == 0 {
            return; // an engine's heap keeps its segments (see `tx`)
        }
        let base = self.sb.region_offset(u64::from(region));
        let seg = self.sb.segment_size;
        let empty = match used & USE_KIND {
            USE_SMALL => {
                (!keep_last || arena.small_segments.len() > 1)
                    && arena.small.all_empty(&small::Geometry::of(base, seg))
            }
            _ => {
                let first = big::table_granules(seg) as u32;
                (!keep_last || arena.big.segments() > 1)
                    && arena
                        .big
                        .is_empty(region, first, (seg / GRANULE) as u32 - first)
            }
        };
        if !empty {
            return;
        }
        if used & USE_VOLATILE == 0 {
            // No ring record may name the segment once its region is free.
            self.checkpoint(used & USE_ARENA, arena);
            let at = self.sb.entry_offset(u64::from(region)) as usize + ENTRY_STATE as usize;
            self.media.write_u64(at, 0);
            self.media.persist(at, 8);
        }
        if used & USE_KIND == USE_SMALL {
            arena.small.remove_segment(&small::Geometry::of(base, seg));
            arena.small_segments.remove(&region);
        } else {
            arena.big.remove_segment(region);
        }
        self.uses[region as usize].store(0, Ordering::Release);
        self.regions
            .lock()
            .expect("regions lock")
            .free
            .insert(region);
    }

    /// The allocated block at `offset` in a small or big segment, as the arena holds it,
    /// with its size as recorded in a micro-log record.
    pub(super) fn held_block(
        &self,
        arena: &Arena,
        used: u32,
        region: u32,
        offset: u64,
    ) -> Option<(Held, u64)> {
        let base = self.sb.region_offset(u64::from(region));
        if used & USE_KIND == USE_SMALL {
            let g = small::Geometry::of(base, self.sb.segment_size);
            let class = arena.small.class_of_chunk(g.chunk_containing(offset)?)?;
            let (chunk, block) = g.block_of(offset, class)?;
            arena.small.is_allocated(chunk, class, block).then_some((
                Held::Small(SmallBlock {
                    chunk,
                    block,
                    class,
                }),
                u64::from(CLASSES[class]),
            ))
        } else {
            let rel = offset - base;
            if !rel.is_multiple_of(GRANULE) {
                return None;
            }
            let granule = u32::try_from(rel / GRANULE).ok()?;
            let len = arena.big.allocated_len(region, granule)?;
            Some((
                Held::Big(BigBlock {
                    region,
                    granule,
                    len,
                }),
                u64::from(len) * GRANULE,
            ))
        }
    }
}

/// The first run of `count` consecutive free regions inside one file.
fn first_run(sb: &Superblock, free: &BTreeSet<u32>, count: u32) -> Option<u32> {
    let (mut start, mut len) = (0u32, 0u32);
    for &r in free {
        if len > 0 && r == start + len && !sb.file_starts_at(u64::from(r)) {
            len += 1;
        } else {
            start = r;
            len = 1;
        }
        if len == count {
            return Some(start);
        }
    }
    None
}
