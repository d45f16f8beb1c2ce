//! [`Reader`]: reads and checks the heap's persistent metadata (the segment table, the
//! micro-log slots, every live segment's chunk headers or page table), for recovery,
//! for the digest a clean close writes, and for
//! [`PersistentHeap::blocks`](super::PersistentHeap::blocks).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use super::state::SizePolicy;
use super::steps::Step;
use crate::alloc::big;
use crate::alloc::files::NO_FILE;
use crate::alloc::layout::{
    CHUNK_HEADER, GRANULE, LINE, MetadataPolicy, MicroLogSlot, SegmentKind, Superblock, TableEntry,
};
use crate::alloc::small::{self, ChunkState};
use crate::error::{Error, Result};
use crate::media::Media;

/// Reads and checks persistent metadata.
pub(super) struct Reader<'a> {
    /// The heap's media.
    pub(super) media: &'a Media,
    /// Its superblock.
    pub(super) sb: &'a Superblock,
    /// Its pool file's path, for damage reports.
    pub(super) path: &'a Path,
    /// The root area.
    pub(super) root: Range<u64>,
    /// Per region, the file holding it (`NO_FILE`: none, so nothing there may be read).
    pub(super) region_file: &'a [AtomicU32],
}

/// One segment's metadata, as read.
pub(super) struct SegmentScan {
    /// Its region.
    pub(super) region: u32,
    /// Its arena.
    pub(super) owner: u16,
    /// What its metadata holds.
    pub(super) content: Content,
}

/// What one segment's metadata holds.
pub(super) enum Content {
    /// Every chunk's header, in address order.
    Small(Box<[ChunkState]>),
    /// Free runs `(granule, len)`, blocks and granules allocated.
    Big {
        free: Vec<(u32, u32)>,
        allocated: Vec<(u32, u32)>,
    },
    /// A huge block over `regions` regions.
    Huge { regions: u32 },
}

/// The log a record was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecordLog {
    /// An arena's micro-log slot (any block).
    MicroLog,
    /// An arena's metadata-log ring (small and big blocks only).
    MetadataLog,
}

impl RecordLog {
    /// Its name in damage reports.
    fn name(self) -> &'static str {
        match self {
            RecordLog::MicroLog => "micro-log",
            RecordLog::MetadataLog => "metadata-log",
        }
    }
}

/// What reading every segment (or a run of them) found.
#[derive(Default)]
pub(super) struct Scan {
    /// Every segment read, in region order.
    pub(super) segments: Vec<SegmentScan>,
    /// Segments read.
    pub(super) segment_count: u64,
    /// Blocks found allocated.
    pub(super) blocks: u64,
    /// CRC of every live segment's table entry and metadata, in region order.
    pub(super) digest: u32,
    /// Bytes the digest covers (to combine the digests of consecutive runs).
    digested: usize,
}

impl Scan {
    /// Adds `bytes` to the digest.
    fn digest(&mut self, bytes: &[u8]) {
        self.digest = crc32c::crc32c_append(self.digest, bytes);
        self.digested += bytes.len();
    }

    /// Appends the scan of the segments that follow this scan's.
    fn extend(&mut self, next: Scan) {
        self.segments.extend(next.segments);
        self.segment_count += next.segment_count;
        self.blocks += next.blocks;
        self.digest = crc32c::crc32c_combine(self.digest, next.digest, next.digested);
        self.digested += next.digested;
    }
}

/// Live segments per recovery thread: fewer are read on the opening thread alone (a
/// thread costs tens of microseconds to start; a segment's metadata a few to read).
const SEGMENTS_PER_THREAD: usize = 16;

impl Reader<'_> {
    /// A report of damage found at file-0 offset `offset`.
    pub(super) fn corrupt(&self, offset: u64, reason: String) -> Error {
        Error::MetadataCorrupt {
            path: PathBuf::from(self.path),
            offset,
            reason,
        }
    }

    /// Table entry `r`, checked.
    pub(super) fn entry(&self, r: u64) -> Result<Option<TableEntry>> {
        let mut b = [0u8; 64];
        let at = self.sb.entry_offset(r);
        self.media.read(at as usize, &mut b);
        TableEntry::decode(&b, r as u32, self.sb.region_offset(r), self.sb)
            .map_err(|reason| self.corrupt(at, format!("segment-table entry {r}: {reason}")))
    }

    /// The file holding region `r` (`NO_FILE`: none).
    fn file_of(&self, r: u64) -> u32 {
        self.region_file[r as usize].load(Ordering::Relaxed)
    }

    /// Whether the `count` regions from `r` are all in the one file that exists.
    fn in_one_file(&self, r: u64, count: u64) -> bool {
        let file = self.file_of(r);
        file != NO_FILE && (r..r + count).all(|t| self.file_of(t) == file)
    }

    /// Every table entry, checked, with huge blocks' runs checked to be free, and every
    /// live entry's regions checked to be in one file that exists.
    pub(super) fn entries(&self) -> Result<Vec<Option<TableEntry>>> {
        let entries = (0..self.sb.region_count)
            .map(|r| self.entry(r))
            .collect::<Result<Vec<_>>>()?;
        for e in entries.iter().flatten() {
            let count = e.size / self.sb.segment_size;
            if !self.in_one_file(u64::from(e.index), count) {
                return Err(self.corrupt(
                    self.sb.entry_offset(u64::from(e.index)),
                    format!(
                        "region {} is in use, but its {count} region(s) are not in one file of the heap",
                        e.index
                    ),
                ));
            }
            if e.kind == SegmentKind::Huge {
                for t in u64::from(e.index) + 1..u64::from(e.index) + count {
                    if entries[t as usize].is_some() {
                        return Err(self.corrupt(
                            self.sb.entry_offset(t),
                            format!(
                                "region {t} is in use but lies inside the huge block at region {}",
                                e.index
                            ),
                        ));
                    }
                }
            }
        }
        Ok(entries)
    }

    /// Every arena's pending micro-log record.
    pub(super) fn pending_slots(&self) -> Vec<(u32, MicroLogSlot)> {
        (0..self.sb.arenas)
            .filter_map(|a| {
                let mut b = [0u8; 64];
                self.media.read(self.sb.slot_offset(a) as usize, &mut b);
                MicroLogSlot::decode(&b).map(|r| (a, r))
            })
            .collect()
    }

    /// Whether `dst` is a word recovery may store a pointer to: in the root area or in
    /// a region (the block it lies in may itself be one this record frees or allocates).
    fn dst_ok(&self, dst: u64) -> bool {
        dst.is_multiple_of(8)
            && ((self.root.start <= dst && dst.checked_add(8).is_some_and(|e| e <= self.root.end))
                || self
                    .sb
                    .region_of(dst)
                    .is_some_and(|r| self.file_of(r) != NO_FILE))
    }

    /// Checks a record read from `log` at file-0 offset `at` against the table before
    /// anything is redone: a pointer slot recovery may store to, and where its metadata
    /// step stores.
    pub(super) fn check_record(
        &self,
        at: u64,
        log: RecordLog,
        r: &MicroLogSlot,
        entries: &[Option<TableEntry>],
    ) -> Result<Step> {
        let why = |reason: &str| self.corrupt(at, format!("{} record {r:?}: {reason}", log.name()));
        if !self.dst_ok(r.dst) {
            return Err(why(
                "its pointer slot is not a word of the root or a region",
            ));
        }
        match self.plan(r, entries).map_err(|reason| why(&reason))? {
            Step::Huge { .. } if log == RecordLog::MetadataLog => {
                Err(why("a huge block is never in a metadata log"))
            }
            step => Ok(step),
        }
    }

    /// Where a record's metadata step stores, checked against the segment table: the
    /// block's size class decides the segment kind it must lie in.
    pub(super) fn plan(
        &self,
        r: &MicroLogSlot,
        entries: &[Option<TableEntry>],
    ) -> Result<Step, String> {
        let region = self
            .sb
            .region_of(r.addr)
            .filter(|&region| self.file_of(region) != NO_FILE)
            .ok_or("the block is outside the regions of the heap's files")?;
        let base = self.sb.region_offset(region);
        let entry = entries[region as usize];
        let seg = self.sb.segment_size;
        match SizePolicy::of(seg, r.size) {
            None => Err(format!("a block of {} bytes", r.size)),
            Some(SizePolicy::Small(class)) => {
                let g = small::Geometry::of(base, seg);
                let (chunk, block) = g
                    .block_of(r.addr, class)
                    .ok_or("not a small block's place")?;
                match entry {
                    Some(e) if e.kind == SegmentKind::Small => Ok(Step::Small {
                        header: g.header_of(chunk),
                        class,
                        block,
                    }),
                    _ => Err("a small block outside a small segment".into()),
                }
            }
            Some(SizePolicy::Big(len)) => {
                let rel = r.addr - base;
                let granule = rel / GRANULE;
                let len = u64::from(len);
                if !rel.is_multiple_of(GRANULE)
                    || granule < big::table_granules(seg)
                    || granule + len > seg / GRANULE
                {
                    return Err("not a big block's place".into());
                }
                match entry {
                    Some(e) if e.kind == SegmentKind::Big => Ok(Step::Big {
                        region,
                        granule,
                        len,
                    }),
                    _ => Err("a big block outside a big segment".into()),
                }
            }
            Some(SizePolicy::Huge(count)) => {
                if r.addr != base
                    || region + count > self.sb.region_count
                    || !self.in_one_file(region, count)
                {
                    return Err("not a huge block's place".into());
                }
                // Before its step the head entry is free (allocating) or live (freeing),
                // after it the other way round: either may be found.
                let head_ok =
                    entry.is_none_or(|e| e.kind == SegmentKind::Huge && e.requested == r.size);
                let tails_free =
                    (region + 1..region + count).all(|t| entries[t as usize].is_none());
                if !head_ok || !tails_free {
                    return Err("the huge block's regions are not its own".into());
                }
                Ok(Step::Huge { region, count })
            }
        }
    }

    /// Every table entry and every live segment's metadata, checked. Large heaps are
    /// read by several threads, each over a run of consecutive segments, as PAllocator
    /// recovers its allocators in parallel (002); the result, and the first damage
    /// reported, are the same as one thread's.
    pub(super) fn scan_all(&self) -> Result<(Vec<Option<TableEntry>>, Scan)> {
        let entries = self.entries()?;
        let live: Vec<&TableEntry> = entries.iter().flatten().collect();
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(live.len().div_ceil(SEGMENTS_PER_THREAD))
            .max(1);
        let segments = self.scan_in_parts(&live, threads)?;
        if self.sb.policy == MetadataPolicy::InPlace {
            return Ok((entries, segments));
        }
        // The ring headers too: a flipped `base` could bring stale records back.
        let mut scan = Scan::default();
        for a in 0..self.sb.arenas {
            let mut line = [0u8; LINE as usize];
            self.media.read(self.sb.ring_header(a) as usize, &mut line);
            scan.digest(&line);
        }
        scan.extend(segments);
        Ok((entries, scan))
    }

    /// Scans `live` in `parts` runs of consecutive segments, one thread each.
    fn scan_in_parts(&self, live: &[&TableEntry], parts: usize) -> Result<Scan> {
        let scan_run = |run: &[&TableEntry]| -> Result<Scan> {
            let mut scan = Scan::default();
            for e in run {
                self.scan_segment(e, &mut scan)?;
            }
            Ok(scan)
        };
        if parts <= 1 {
            return scan_run(live);
        }
        let runs: Vec<Result<Scan>> = std::thread::scope(|threads| {
            let handles: Vec<_> = live
                .chunks(live.len().div_ceil(parts).max(1))
                .map(|run| threads.spawn(move || scan_run(run)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut scan = Scan::default();
        for run in runs {
            scan.extend(run?);
        }
        Ok(scan)
    }

    /// Reads one live segment's metadata into `scan`, checking it.
    fn scan_segment(&self, e: &TableEntry, scan: &mut Scan) -> Result<()> {
        let region = u64::from(e.index);
        let base = self.sb.region_offset(region);
        let seg = self.sb.segment_size;
        let mut entry = [0u8; 64];
        self.media
            .read(self.sb.entry_offset(region) as usize, &mut entry);
        scan.digest(&entry);
        scan.segment_count += 1;
        let content = match e.kind {
            SegmentKind::Small => {
                let g = small::Geometry::of(base, seg);
                let table = self
                    .media
                    .read_vec(base as usize, (g.chunks * CHUNK_HEADER) as usize);
                scan.digest(&table);
                let mut headers = Vec::with_capacity(g.chunks as usize);
                for (k, b) in table.chunks_exact(CHUNK_HEADER as usize).enumerate() {
                    let b: &[u8; CHUNK_HEADER as usize] = b.try_into().expect("one header");
                    let h = ChunkState::decode(b).map_err(|reason| {
                        let at = base + k as u64 * CHUNK_HEADER;
                        self.corrupt(at, format!("chunk header: {reason}"))
                    })?;
                    scan.blocks += u64::from(h.used);
                    headers.push(h);
                }
                Content::Small(headers.into_boxed_slice())
            }
            SegmentKind::Big => {
                let granules = seg / GRANULE;
                let table = self.media.read_vec(base as usize, (granules * 8) as usize);
                scan.digest(&table);
                let word = |g: u64| crate::alloc::layout::u64_at(&table, (g * 8) as usize);
                let first = big::table_granules(seg);
                if let Some(g) = (0..first).find(|&g| word(g) != 0) {
                    return Err(self.corrupt(
                        base + g * 8,
                        "a page-table word for the table itself".into(),
                    ));
                }
                let (mut free, mut allocated) = (Vec::new(), Vec::new());
                let mut g = first;
                let mut run_start = None;
                while g < granules {
                    let len = big::decode_entry(word(g), region, g, granules)
                        .map_err(|reason| self.corrupt(base + g * 8, reason))?;
                    match len {
                        Some(len) => {
                            if let Some(s) = run_start.take() {
                                free.push((s as u32, (g - s) as u32));
                            }
                            if let Some(i) = (g + 1..g + len).find(|&i| word(i) != 0) {
                                return Err(self.corrupt(
                                    base + i * 8,
                                    format!("a page-table word inside the block at granule {g}"),
                                ));
                            }
                            allocated.push((g as u32, len as u32));
                            g += len;
                        }
                        None => {
                            run_start.get_or_insert(g);
                            g += 1;
                        }
                    }
                }
                if let Some(s) = run_start {
                    free.push((s as u32, (granules - s) as u32));
                }
                scan.blocks += allocated.len() as u64;
                Content::Big { free, allocated }
            }
            SegmentKind::Huge => {
                let count = e.size / seg;
                scan.blocks += 1;
                Content::Huge {
                    regions: count as u32,
                }
            }
        };
        scan.segments.push(SegmentScan {
            region: e.index,
            owner: e.owner,
            content,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{HeapOptions, PersistentHeap};

    /// A heap of many small 64 KiB segments in both arenas, some big blocks among them.
    fn many_segments() -> (tempfile::TempDir, PersistentHeap) {
        let dir = tempfile::tempdir().unwrap();
        let options = HeapOptions {
            size: 8 << 20,
            segment_size: 64 << 10,
            arenas: 2,
            ..HeapOptions::default()
        };
        let heap = PersistentHeap::create(dir.path().join("heap"), &options).unwrap();
        let array = heap.allocate_zeroed_into(heap.root(), 8 * 3000).unwrap();
        for i in 0..3000u64 {
            let size = if i % 50 == 0 { 9000 } else { 64 + i % 900 };
            heap.allocate_into(array.checked_add(8 * i).unwrap(), size)
                .unwrap();
        }
        (dir, heap)
    }

    #[test]
    fn a_scan_in_parallel_runs_finds_what_one_thread_finds() {
        let (_dir, heap) = many_segments();
        let reader = heap.reader();
        let entries = reader.entries().unwrap();
        let live: Vec<&TableEntry> = entries.iter().flatten().collect();
        assert!(live.len() > 20, "{} segments", live.len());
        let one = reader.scan_in_parts(&live, 1).unwrap();
        for parts in [2, 3, live.len(), live.len() + 5] {
            let many = reader.scan_in_parts(&live, parts).unwrap();
            assert_eq!(many.digest, one.digest, "{parts} parts");
            assert_eq!(many.digested, one.digested);
            assert_eq!(
                (many.blocks, many.segment_count),
                (one.blocks, one.segment_count)
            );
            let regions = |s: &Scan| s.segments.iter().map(|g| g.region).collect::<Vec<_>>();
            assert_eq!(regions(&many), regions(&one));
        }
        assert_eq!(one.blocks, 3001, "the array and its blocks");
    }

    #[test]
    fn damage_in_a_late_segment_is_reported_alike_by_every_split() {
        let (_dir, heap) = many_segments();
        let reader = heap.reader();
        let entries = reader.entries().unwrap();
        let live: Vec<&TableEntry> = entries.iter().flatten().collect();
        let last_small = live
            .iter()
            .rev()
            .find(|e| e.kind == SegmentKind::Small)
            .unwrap();
        let at = heap.sb.region_offset(u64::from(last_small.index)) as usize;
        heap.media.write_u64(at, 77); // a class word naming no class
        let offset = |parts| match reader.scan_in_parts(&live, parts) {
            Err(Error::MetadataCorrupt { offset, .. }) => offset,
            other => panic!("{parts} parts: {:?}", other.map(|s| s.blocks)),
        };
        assert_eq!(offset(1), at as u64);
        assert_eq!(offset(3), at as u64);
        assert_eq!(offset(live.len()), at as u64);
    }
}
