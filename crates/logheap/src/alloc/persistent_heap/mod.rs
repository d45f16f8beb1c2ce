//! [`PersistentHeap`]: PAllocator (002) as a pool of its own: a persistent, recoverable,
//! leak-free allocator with arenas, three size policies and in-place metadata.
//!
//! - Small blocks (up to 4032 bytes) come from 8 KiB chunks with bitmaps ([`small`]),
//!   big ones from best fit over 4 KiB granules ([`big`](super::big)); each arena owns
//!   its own segments of either kind and has its own lock, so threads on different
//!   arenas never contend. Blocks of a segment's size or more (or of 16 MiB or more) are
//!   *huge*: a run of whole regions, recorded by its segment-table entry alone.
//! - The standalone calls [`allocate_into`](PersistentHeap::allocate_into) and
//!   [`deallocate`](PersistentHeap::deallocate) take the place where the pointer lives
//!   (002's "reference passing"), so a crash between allocating and linking leaks
//!   nothing: the arena's micro-log slot records `{op, dst, block, size}` and is fenced
//!   first (the commit point); then the metadata bit or word and `*dst` are stored and
//!   fenced; then the slot is retired and fenced. Recovery redoes a pending slot (every
//!   step is idempotent, and no one can have moved `*dst` before the call returned).
//!   That is three fences, as PMDK's `pmemobj_alloc` (redo persist, apply, clobber).
//! - With [`MetadataPolicy::MetadataLog`] (004), small and big allocations and frees
//!   append a record to their arena's metadata-log ring instead of using the micro-log
//!   slot and storing their bit or word in place: see [`metadata_log`](super::metadata_log).
//! - A volatile heap (004) shares the regions: [`allocate_volatile`](PersistentHeap::allocate_volatile)
//!   takes blocks from segments that have the same DRAM state as persistent ones but no
//!   table entry and no stored metadata, so they cost no flush or fence and every open
//!   finds their regions free.
//! - [`defragment`](PersistentHeap::defragment) punches free space out of the file
//!   (002), largest free range first.
//! - Opening rebuilds every DRAM structure from the metadata (chunk headers, page
//!   tables, the segment table). A cleanly closed heap also checks a digest of all the
//!   metadata written at close, so a flipped bit there is reported, not trusted.
//!
//! The parts: this module holds the API and its types; `access` resolves addresses
//! and checks every read and write; `open` creates and opens a heap and recovers it, in
//! phases; `reader` reads and checks the persistent metadata; `segments` takes blocks,
//! segments, regions and files and gives them back (growing and shrinking the heap);
//! `steps` runs the logged metadata steps; `state` is the DRAM state they share; `tx`
//! is a transaction engine's reserve / mark / publish path.

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;

use super::addr::PAddr;
use super::defragment::{self, Defragmentation};
use super::files::{FileStore, NO_FILE};
use super::layout::{
    CHUNK, CLASSES, DIGEST_WORD, GRANULE, Growth, MetadataPolicy, MicroLogSlot, MicroOp,
    Superblock, TableEntry, encode_digest,
};
use super::small;
use crate::error::{Error, Result};
use crate::file::header::SUPERBLOCK;
use crate::file::{EngineKind, MapAddress, PoolFile, PoolOptions};
use crate::media::{Media, MediaConfig, MediaCounters};

mod access;
mod open;
pub(crate) use open::sim_len;
mod reader;
mod segments;
mod state;
mod steps;
mod tx;

use reader::{Content, Reader};
use state::{
    Arena, Held, Regions, SizePolicy, USE_ARENA, USE_BIG, USE_HUGE, USE_KIND, USE_SMALL,
    USE_VOLATILE, arena_hint,
};
use steps::Step;
pub(crate) use tx::Replay;

/// How to create a [`PersistentHeap`].
#[derive(Debug, Clone, Copy)]
pub struct HeapOptions {
    /// Size of the pool file in bytes.
    pub size: u64,
    /// The most bytes the heap may grow to by adding extension files in `<pool>.d/`
    /// (002's pool of several files), or 0 (the default): the heap is its pool file
    /// alone. A growable heap also gives each huge block of 16 MiB or more a file of its
    /// own, removed when the block is freed, and [`shrink`](PersistentHeap::shrink)
    /// removes extension files whose regions are all free.
    pub max_size: u64,
    /// Bytes of each extension file the heap grows by (rounded down to whole segments,
    /// at least one).
    pub file_size: u64,
    /// Size of one segment (a power of two, 64 KiB to 64 MiB): the unit an arena takes
    /// for its small or big blocks. Blocks of this size or more are huge.
    pub segment_size: u64,
    /// Arenas (each with its own lock and segments); threads are spread over them.
    pub arenas: u32,
    /// Size of the root area (a multiple of 64): where the first persistent pointers
    /// live.
    pub root_size: u64,
    /// How the media persists.
    pub media: MediaConfig,
    /// Where allocation state is kept: in place (002, the default) or in DRAM with a
    /// metadata log (004).
    pub metadata: MetadataPolicy,
    /// Records in each arena's metadata-log ring (with [`MetadataPolicy::MetadataLog`];
    /// 2 to 2^20): more records, fewer checkpoints and more metadata updates coalesced
    /// in each, and more to replay after a crash.
    pub log_records: u64,
    /// Claim the file's whole size at creation (see [`PoolOptions::reserve_space`]).
    pub reserve_space: bool,
    /// Where the heap is mapped: anywhere (persistent data holds [`PAddr`]s, resolved
    /// against the mapping), or at a fixed address recorded in the header, so
    /// persistent data may also hold native pointers (004; see [`MapAddress`] and
    /// [`PersistentHeap::direct`]).
    pub map_address: MapAddress,
}

impl Default for HeapOptions {
    fn default() -> Self {
        HeapOptions {
            size: 64 << 20,
            max_size: 0,
            file_size: 64 << 20,
            segment_size: 4 << 20,
            arenas: std::thread::available_parallelism().map_or(1, |n| n.get().min(64) as u32),
            root_size: 4096,
            media: MediaConfig::default(),
            metadata: MetadataPolicy::InPlace,
            log_records: super::layout::DEFAULT_LOG_RECORDS,
            reserve_space: true,
            map_address: MapAddress::Anywhere,
        }
    }
}

impl HeapOptions {
    /// How the heap may grow: extension-file slots of `file_size` bytes, enough for
    /// `max_size`.
    fn growth(&self) -> Result<Growth> {
        if self.max_size == 0 || self.max_size <= self.size {
            return Ok(Growth::default());
        }
        let seg = self.segment_size.max(1);
        let file_regions = (self.file_size / seg).max(1);
        let max_files = (self.max_size - self.size).div_ceil(file_regions * seg);
        if max_files > super::layout::MAX_FILES {
            return Err(Error::InvalidConfig(format!(
                "growing from {} to {} bytes by files of {} bytes takes {max_files} files; at most {} are supported",
                self.size,
                self.max_size,
                file_regions * seg,
                super::layout::MAX_FILES
            )));
        }
        Ok(Growth {
            max_files,
            file_regions,
        })
    }

    fn pool_options(&self) -> PoolOptions {
        PoolOptions {
            size: self.size,
            engine: EngineKind::Alloc,
            root_size: self.root_size,
            chunk_size: self.segment_size,
            media: self.media,
            reserve_space: self.reserve_space,
            map_address: self.map_address,
        }
    }
}

/// What opening a heap found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct HeapRecovery {
    /// Whether the heap had been closed cleanly.
    pub was_clean: bool,
    /// Standalone allocations and frees a crash left half done, redone.
    pub redone: u32,
    /// Metadata-log records replayed into the in-place metadata
    /// ([`MetadataPolicy::MetadataLog`]).
    pub replayed: u64,
    /// Segments read.
    pub segments: u64,
    /// Blocks found allocated.
    pub blocks: u64,
    /// Seconds spent rebuilding (after the pool file was opened).
    pub seconds: f64,
    /// Extension files opened.
    pub files: u64,
    /// Extension files a crash left being created or removed, or holding no block any
    /// more (a huge block's file whose allocation did not complete, or whose free
    /// did): removed.
    pub files_removed: u64,
    /// Files in `<pool>.d/` that the file table does not name: reported, never touched
    /// (their slots are not used).
    pub orphan_files: u64,
}

/// Figures of a [`PersistentHeap`].
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct HeapStats {
    /// Live allocations.
    pub allocations: u64,
    /// Their usable bytes.
    pub allocated_bytes: u64,
    /// Segments serving small blocks.
    pub small_segments: u64,
    /// Segments serving big blocks.
    pub big_segments: u64,
    /// Huge blocks.
    pub huge_blocks: u64,
    /// Regions in use (by segments or huge blocks) and in all.
    pub regions_used: u64,
    /// All regions.
    pub regions: u64,
    /// Bytes of one region.
    pub segment_size: u64,
    /// Persistent bytes in use: regions in use times their size.
    pub pm_bytes_used: u64,
    /// DRAM held by the allocator's indexes (approximate).
    pub dram_bytes: u64,
    /// The media's traffic counters.
    pub media: MediaCounters,
    /// What the last open found.
    pub recovery: HeapRecovery,
    /// Where allocation state is kept.
    pub metadata: MetadataPolicy,
    /// Metadata-log checkpoints since the heap was opened.
    pub checkpoints: u64,
    /// Extension files (see [`HeapOptions::max_size`]).
    pub files: u64,
    /// Their data bytes.
    pub file_bytes: u64,
    /// Live blocks of the volatile heap.
    pub volatile_allocations: u64,
    /// Their usable bytes.
    pub volatile_allocated_bytes: u64,
}

/// One block, as found in the persistent metadata by [`PersistentHeap::blocks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Block {
    /// Where it starts.
    pub addr: PAddr,
    /// Its usable size.
    pub size: u64,
}

/// A persistent heap in a pool file of its own (engine `alloc`): see the module docs.
///
/// Persistent pointers are [`PAddr`]s; [`root`](PersistentHeap::root) is where the
/// first ones live. Contents are reached through [`read`](PersistentHeap::read),
/// [`write`](PersistentHeap::write) and [`persist`](PersistentHeap::persist), which
/// refuse ranges over allocator metadata. Every method takes `&self` and may be called
/// from many threads.
#[derive(Debug)]
pub struct PersistentHeap {
    file: PoolFile,
    media: Arc<Media>,
    sb: Superblock,
    root: Range<u64>,
    arenas: Box<[CachePadded<Mutex<Arena>>]>,
    /// The volatile heap's arenas (004): DRAM state only, over regions that have no
    /// table entry, so every open finds them free.
    volatile: Box<[CachePadded<Mutex<Arena>>]>,
    regions: Mutex<Regions>,
    /// Per region, its use (see `USE_*`), readable without a lock.
    uses: Box<[AtomicU32]>,
    /// Per region, the file holding it: 0 (the pool file), an extension file's id
    /// (`slot + 1`), or `NO_FILE`; readable without a lock.
    region_file: Box<[AtomicU32]>,
    /// Per extension slot, the data bytes of the file starting there (0: none).
    file_bytes: Box<[AtomicU64]>,
    /// Where extension files are created and removed.
    store: FileStore,
    recovery: HeapRecovery,
    /// The heap is the allocator of a transaction engine (`redo`, `undo`): empty
    /// segments are kept (see [`PersistentHeap::tx_reserve`]).
    engine_owned: bool,
}

impl PersistentHeap {
    /// The root area: where the first persistent pointers live (all zeros when created).
    pub fn root(&self) -> PAddr {
        PAddr::new(0, self.root.start).expect("the root is inside file 0")
    }

    /// Bytes of the root area.
    pub fn root_size(&self) -> u64 {
        self.root.end - self.root.start
    }

    /// The end of the pool file's regions (see `Replay::data_end`).
    pub(crate) fn data_end(&self) -> u64 {
        self.sb.region_offset(self.sb.local_regions)
    }

    /// The pool file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The media holding the heap, read-only (for its counters and, on simulation
    /// media, its crash simulator): the heap's own calls are what store into it.
    pub fn media(&self) -> &crate::media::MediaView {
        crate::media::MediaView::of(&self.media)
    }

    /// The media holding the heap, for the engine that runs on it.
    pub(crate) fn shared_media(&self) -> &Arc<Media> {
        &self.media
    }

    /// The address the heap is mapped at in every process when it was created with a
    /// fixed [`MapAddress`], else `None` (it is mapped wherever the kernel picks, and on
    /// simulation media, which ignore the recorded address).
    pub fn map_address(&self) -> Option<u64> {
        let at = self.file.header().map_address;
        (at != 0 && self.media.base_address() as u64 == at).then_some(at)
    }

    /// The largest block this heap can ever hold (a huge block over every region).
    pub fn max_allocation(&self) -> u64 {
        let run = self.sb.local_regions.max(self.sb.file_regions);
        run.max(self.sb.max_files * self.sb.file_regions) * self.sb.segment_size
    }

    /// Allocates a block of at least `size` bytes (contents unspecified) and stores its
    /// address at `dst`, durably, before returning it. `dst` must be an 8-byte aligned
    /// word in the root area or in an allocated block. A crash at any point leaves
    /// either no block and `*dst` unchanged, or the block allocated and `*dst` pointing
    /// at it: never a leaked block.
    pub fn allocate_into(&self, dst: PAddr, size: u64) -> Result<PAddr> {
        self.allocate(dst, size, false)
    }

    /// Like [`allocate_into`](PersistentHeap::allocate_into), with the block's usable
    /// bytes zeroed (durably, with the pointer).
    pub fn allocate_zeroed_into(&self, dst: PAddr, size: u64) -> Result<PAddr> {
        self.allocate(dst, size, true)
    }

    /// [`allocate_into`](PersistentHeap::allocate_into), its block zeroed with `zeroed`.
    fn allocate(&self, dst: PAddr, size: u64, zeroed: bool) -> Result<PAddr> {
        let policy = SizePolicy::of(self.sb.segment_size, size)
            .filter(|_| size <= self.max_allocation())
            .ok_or(Error::InvalidSize(size))?;
        let dst_off = self.persistent_word(dst)?;
        let a = arena_hint() % self.arenas.len();
        let mut arena = self.arenas[a].lock().expect("arena lock");
        let (offset, usable, step) = self.reserve(a, &mut arena, policy, size, false)?;
        if zeroed {
            self.media.fill(offset as usize, usable as usize, 0);
            self.media.flush(offset as usize, usable as usize);
        }
        let record = MicroLogSlot::unsequenced(MicroOp::Allocate, dst_off, offset, size);
        self.run_logged(a as u32, &mut arena, record, step, dst_off);
        Ok(self.sb.block_addr(offset))
    }

    /// Allocates a block of at least `size` bytes (contents unspecified) in the volatile
    /// heap (004: the device "partitioned to volatile + persistent heap"), for data that
    /// need not survive: nothing about it is logged, flushed or stored as metadata, so it
    /// costs no fence, and every open of the heap starts with the volatile heap empty.
    /// Its blocks come from the same regions as persistent ones and are read and written
    /// through the same calls; they may hold persistent pointers, but a persistent
    /// pointer may not live in one (allocate_into and deallocate refuse such a `dst`),
    /// and a pointer to one kept in persistent memory dangles after the next open.
    pub fn allocate_volatile(&self, size: u64) -> Result<PAddr> {
        let policy = SizePolicy::of(self.sb.segment_size, size)
            .filter(|_| size <= self.max_allocation())
            .ok_or(Error::InvalidSize(size))?;
        let a = arena_hint() % self.volatile.len();
        let mut arena = self.volatile[a].lock().expect("arena lock");
        let (offset, _, _) = self.reserve(a, &mut arena, policy, size, true)?;
        Ok(self.sb.block_addr(offset))
    }

    /// Frees a block of the volatile heap (see
    /// [`allocate_volatile`](PersistentHeap::allocate_volatile)).
    ///
    /// # Errors
    /// [`Error::InvalidFree`] when `addr` is not the start of a live volatile block.
    pub fn deallocate_volatile(&self, addr: PAddr) -> Result<()> {
        let invalid = || Error::InvalidFree { home: addr.raw() };
        let offset = self.span_offset(addr).ok_or_else(invalid)?;
        let region = self.region_at(addr).ok_or_else(invalid)?;
        let used = self.uses[region as usize].load(Ordering::Acquire);
        if used & USE_VOLATILE == 0 {
            return Err(invalid());
        }
        match used & USE_KIND {
            USE_SMALL | USE_BIG => {
                let mut arena = self.volatile[(used & USE_ARENA) as usize]
                    .lock()
                    .expect("arena lock");
                if self.uses[region as usize].load(Ordering::Acquire) != used {
                    return Err(invalid()); // the segment was given back meanwhile
                }
                let (held, _) = self
                    .held_block(&arena, used, region, offset)
                    .ok_or_else(invalid)?;
                if arena.give_back(held) {
                    self.give_back_if_empty(&mut arena, used, region, true);
                }
                Ok(())
            }
            USE_HUGE if offset == self.sb.region_offset(u64::from(region)) => {
                let mut regions = self.regions.lock().expect("regions lock");
                let count = regions.volatile_huge.remove(&region).ok_or_else(invalid)?;
                self.free_huge_regions(&mut regions, region, count);
                Ok(())
            }
            _ => Err(invalid()),
        }
    }

    /// Frees the block whose address is stored at `dst` and stores null there, durably
    /// (a null `*dst` is a no-op, as `free(NULL)`). A crash at any point leaves either
    /// the block allocated and `*dst` unchanged, or the block free and `*dst` null.
    pub fn deallocate(&self, dst: PAddr) -> Result<()> {
        let dst_off = self.persistent_word(dst)?;
        let addr = PAddr::from_raw(self.media.read_u64(dst_off as usize));
        if addr.is_null() {
            return Ok(());
        }
        let invalid = || Error::InvalidFree { home: addr.raw() };
        let offset = self.span_offset(addr).ok_or_else(invalid)?;
        let region = self.region_at(addr).ok_or_else(invalid)?;
        let used = self.uses[region as usize].load(Ordering::Acquire);
        if used & USE_VOLATILE != 0 {
            return Err(invalid());
        }
        match used & USE_KIND {
            USE_SMALL | USE_BIG => {
                let a = (used & USE_ARENA) as usize;
                let mut arena = self.arenas[a].lock().expect("arena lock");
                if self.uses[region as usize].load(Ordering::Acquire) != used {
                    return Err(invalid()); // the segment was given back meanwhile
                }
                let (held, size) = self
                    .held_block(&arena, used, region, offset)
                    .ok_or_else(invalid)?;
                let record = MicroLogSlot::unsequenced(MicroOp::Free, dst_off, offset, size);
                let step = self.step_of(held, region);
                self.run_logged(a as u32, &mut arena, record, step, dst_off);
                if arena.give_back(held) {
                    self.give_back_if_empty(&mut arena, used, region, true);
                }
                Ok(())
            }
            USE_HUGE if offset == self.sb.region_offset(u64::from(region)) => {
                let a = arena_hint() % self.arenas.len();
                let mut arena = self.arenas[a].lock().expect("arena lock");
                let mut regions = self.regions.lock().expect("regions lock");
                if self.uses[region as usize].load(Ordering::Acquire) != USE_HUGE {
                    return Err(invalid());
                }
                let entry = self.entry(region).ok_or_else(invalid)?;
                let count = entry.size / self.sb.segment_size;
                let record =
                    MicroLogSlot::unsequenced(MicroOp::Free, dst_off, offset, entry.requested);
                let step = Step::Huge {
                    region: u64::from(region),
                    count,
                };
                self.run_logged(a as u32, &mut arena, record, step, dst_off);
                self.free_huge_regions(&mut regions, region, count);
                Ok(())
            }
            _ => Err(invalid()),
        }
    }

    /// The usable size of the allocated block at `addr`.
    pub fn usable_size(&self, addr: PAddr) -> Result<u64> {
        let invalid = || Error::InvalidAddress {
            addr,
            reason: "not the start of an allocated block",
        };
        let offset = self.span_offset(addr).ok_or_else(invalid)?;
        let region = self.region_at(addr).ok_or_else(invalid)?;
        let used = self.uses[region as usize].load(Ordering::Acquire);
        match used & USE_KIND {
            USE_SMALL | USE_BIG => {
                let arenas = if used & USE_VOLATILE != 0 {
                    &self.volatile
                } else {
                    &self.arenas
                };
                let arena = arenas[(used & USE_ARENA) as usize]
                    .lock()
                    .expect("arena lock");
                let (held, _) = self
                    .held_block(&arena, used, region, offset)
                    .ok_or_else(invalid)?;
                Ok(match held {
                    Held::Small(b) => u64::from(CLASSES[b.class]),
                    Held::Big(b) => u64::from(b.len) * GRANULE,
                })
            }
            USE_HUGE if offset == self.sb.region_offset(u64::from(region)) => {
                self.huge_size(region, used).ok_or_else(invalid)
            }
            _ => Err(invalid()),
        }
    }

    /// Every allocated block, read from the persistent metadata (not from DRAM), sorted
    /// by address: for checking tools and crash tests.
    /// With a metadata log, every arena is checkpointed first.
    pub fn blocks(&self) -> Result<Vec<Block>> {
        self.checkpoint_all();
        // No file is removed while its segments are read.
        let regions = self.regions.lock().expect("regions lock");
        let (_, scan) = self.reader().scan_all()?;
        drop(regions);
        let mut out = Vec::with_capacity(scan.blocks as usize);
        for s in &scan.segments {
            match &s.content {
                Content::Small(headers) => {
                    let base = self.sb.region_offset(u64::from(s.region));
                    let g = small::Geometry::of(base, self.sb.segment_size);
                    for (k, h) in headers.iter().enumerate() {
                        let chunk = g.chunk(k as u64);
                        let Some(class) = h.class.map(usize::from) else {
                            continue;
                        };
                        for (w, &word) in h.bits.iter().enumerate() {
                            let mut bits = word;
                            while bits != 0 {
                                let block = w as u32 * 64 + bits.trailing_zeros();
                                bits &= bits - 1;
                                out.push(Block {
                                    addr: self
                                        .sb
                                        .block_addr(small::block_offset(chunk, class, block)),
                                    size: u64::from(CLASSES[class]),
                                });
                            }
                        }
                    }
                }
                Content::Big { allocated, .. } => {
                    let base = self.sb.region_offset(u64::from(s.region));
                    out.extend(allocated.iter().map(|&(g, len)| Block {
                        addr: self.sb.block_addr(base + u64::from(g) * GRANULE),
                        size: u64::from(len) * GRANULE,
                    }));
                }
                Content::Huge { regions } => out.push(Block {
                    addr: self
                        .sb
                        .block_addr(self.sb.region_offset(u64::from(s.region))),
                    size: u64::from(*regions) * self.sb.segment_size,
                }),
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Gives the storage of free memory back to the file system, largest free range
    /// first, until `target` bytes are given back (`u64::MAX`: every free page), keeping
    /// the file's size (002's defragmentation; see [`Defragmentation`]). Free regions,
    /// free runs of big segments and empty chunks of small segments are punched; nothing
    /// allocated and no metadata is touched, and the heap stays usable: a punched page
    /// takes storage again when it is next written. Allocation waits while this runs.
    ///
    /// A heap created with [`reserve_space`](HeapOptions::reserve_space) gives up that
    /// promise for the pages punched: should the file system fill up, a store to a
    /// punched page that is reused ends the process with `SIGBUS`, as in a sparse
    /// pool. Punch only where the file system keeps room.
    ///
    /// # Errors
    /// [`Error::Io`] when the file system cannot punch holes.
    pub fn defragment(&self, target: u64) -> Result<Defragmentation> {
        let before = self.disk_bytes();
        let (files_removed, file_bytes_removed) = self.shrink()?;
        let target = target.saturating_sub(file_bytes_removed);
        // Every arena, then the free regions (the order allocation takes them in), so no
        // free range is handed out while it is punched.
        let arenas: Vec<_> = self
            .arenas
            .iter()
            .chain(self.volatile.iter())
            .map(|a| a.lock().expect("arena lock"))
            .collect();
        let regions = self.regions.lock().expect("regions lock");
        let seg = self.sb.segment_size;
        let mut free: Vec<Range<u64>> = defragment::coalesce(regions.free.iter().map(|&r| {
            let base = self.sb.region_offset(u64::from(r));
            base..base + seg
        }));
        for arena in &arenas {
            let chunks = arena.small.empty_chunks().map(|c| c..c + CHUNK);
            free.extend(defragment::coalesce(chunks));
            free.extend(arena.big.free_runs().map(|(region, start, len)| {
                let base = self.sb.region_offset(u64::from(region));
                let start = base + u64::from(start) * GRANULE;
                start..start + u64::from(len) * GRANULE
            }));
        }
        let mut done = defragment::punch_largest_first(&self.media, free, target)
            .map_err(|e| Error::io(self.file.path(), "punch holes in", e))?;
        drop(regions);
        drop(arenas);
        done.files_removed = files_removed;
        done.file_bytes_removed = file_bytes_removed;
        done.disk_bytes_before = before;
        done.disk_bytes_after = self.disk_bytes();
        Ok(done)
    }

    /// Bytes the pool file and the extension files occupy on their file system, or
    /// `None` in memory.
    fn disk_bytes(&self) -> Option<u64> {
        self.file.disk_bytes().map(|b| b + self.store.disk_bytes())
    }

    /// The heap's figures.
    pub fn stats(&self) -> HeapStats {
        let mut s = HeapStats {
            segment_size: self.sb.segment_size,
            regions: self.sb.region_count,
            media: self.media.counters(),
            recovery: self.recovery,
            metadata: self.sb.policy,
            ..HeapStats::default()
        };
        for arena in self.arenas.iter() {
            let arena = arena.lock().expect("arena lock");
            let (n, b) = arena.live();
            s.allocations += n;
            s.allocated_bytes += b;
            s.small_segments += arena.small_segments.len() as u64;
            s.big_segments += arena.big.segments() as u64;
            s.dram_bytes += arena.dram_bytes();
            s.checkpoints += arena.checkpoints;
        }
        for arena in self.volatile.iter() {
            let arena = arena.lock().expect("arena lock");
            let (n, b) = arena.live();
            s.volatile_allocations += n;
            s.volatile_allocated_bytes += b;
            s.dram_bytes += arena.dram_bytes();
        }
        for &count in self
            .regions
            .lock()
            .expect("regions lock")
            .volatile_huge
            .values()
        {
            s.volatile_allocations += 1;
            s.volatile_allocated_bytes += count * self.sb.segment_size;
        }
        for (r, u) in self.uses.iter().enumerate() {
            let u = u.load(Ordering::Acquire);
            if u != 0 {
                s.regions_used += 1;
            }
            if u == USE_HUGE
                && let Some(e) = self.entry(r as u32)
            {
                s.huge_blocks += 1;
                s.allocations += 1;
                s.allocated_bytes += e.size;
            }
        }
        s.regions = self
            .region_file
            .iter()
            .filter(|f| f.load(Ordering::Acquire) != NO_FILE)
            .count() as u64;
        for b in self.file_bytes.iter() {
            let b = b.load(Ordering::Acquire);
            if b > 0 {
                s.files += 1;
                s.file_bytes += b;
            }
        }
        s.pm_bytes_used = s.regions_used * self.sb.segment_size;
        s.dram_bytes += (self.uses.len() * 4 + self.sb.region_count as usize * 8) as u64;
        s
    }

    /// Closes the heap cleanly: writes the digest of its metadata, then marks the pool
    /// closed.
    pub fn close(self) -> Result<()> {
        self.checkpoint_all();
        let (_, scan) = self.reader().scan_all()?;
        let at = (SUPERBLOCK.start + DIGEST_WORD) as usize;
        self.media.write_u64(at, encode_digest(scan.digest));
        self.media.persist(at, 8);
        self.file.close()
    }

    /// Where the headers and chunks of the small segment in `region` are.
    fn small_geometry(&self, region: u32) -> small::Geometry {
        small::Geometry::of(
            self.sb.region_offset(u64::from(region)),
            self.sb.segment_size,
        )
    }

    /// A reader of the heap's persistent metadata.
    fn reader(&self) -> Reader<'_> {
        Reader {
            media: &self.media,
            sb: &self.sb,
            path: self.file.path(),
            root: self.root.clone(),
            region_file: &self.region_file,
        }
    }

    /// The live table entry of region `r`.
    fn entry(&self, r: u32) -> Option<TableEntry> {
        self.reader().entry(u64::from(r)).ok().flatten()
    }

    /// The bytes of the huge block whose first region is `head`, of the volatile heap
    /// when `used` (the use of any of its regions) says so.
    fn huge_size(&self, head: u32, used: u32) -> Option<u64> {
        if used & USE_VOLATILE != 0 {
            let regions = self.regions.lock().expect("regions lock");
            let count = regions.volatile_huge.get(&head)?;
            Some(count * self.sb.segment_size)
        } else {
            self.entry(head).map(|e| e.size)
        }
    }
}
