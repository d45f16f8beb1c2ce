//! [`PersistentHeap`]: PAllocator (002) as a pool of its own: a persistent, recoverable,
//! leak-free allocator with arenas, three size policies and in-place metadata.
//!
//! - Small blocks (up to 4032 bytes) come from 8 KiB chunks with bitmaps ([`small`]),
//!   big ones from best fit over 4 KiB granules ([`big`]); each arena owns its own
//!   segments of either kind and has its own lock, so threads on different arenas never
//!   contend. Blocks of a segment's size or more (or of 16 MiB or more) are *huge*: a run
//!   of whole regions, recorded by its segment-table entry alone.
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

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::addr::PAddr;
use super::big::{self, BigBlock, BigRuns};
use super::defragment::{self, Defragmentation};
use super::files::{
    self, FILE_DATA, FileStore, FileTable, NO_FILE, Slot, set_file_state, slot_place,
    write_file_entry,
};
use super::layout::{
    CHUNK, CHUNK_HEADER, DIGEST_WORD, ENTRY_STATE, FileEntry, FileKind, FileState, GRANULE, Growth,
    HUGE_THRESHOLD, LINE, LIVE, MetadataPolicy, MicroLogSlot, MicroOp, SLOT_OP, SMALL_MAX,
    SUPERBLOCK_BYTES, SegmentKind, Superblock, SuperblockError, TableEntry, class_of,
    decode_digest, encode_digest,
};
use super::metadata_log::{self, DirtyLines, RingState};
use super::small::{self, ChunkState, SmallBlock, SmallChunks};
use crate::error::{Error, Result};

mod tx;
use crate::media::{Media, MediaConfig, MediaCounters, SimConfig};
use crate::pool::header::SUPERBLOCK;
use crate::pool::{EngineKind, MapAddress, PoolFile, PoolOptions};
pub(crate) use tx::{EngineReplay, Replay};

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

/// What a region is used as, as seen without a lock: `kind << 24 | arena`, or a huge
/// block's continuation, or 0 (free).
const USE_SMALL: u32 = 1 << 24;
const USE_BIG: u32 = 2 << 24;
const USE_HUGE: u32 = 3 << 24;
const USE_HUGE_TAIL: u32 = 4 << 24;
const USE_KIND: u32 = 0xff << 24;
/// Set beside the kind for a region of the volatile heap.
const USE_VOLATILE: u32 = 1 << 23;
/// The arena bits of a region's use.
const USE_ARENA: u32 = 0xffff;

/// An arena: its segments' DRAM state and its micro-log slot.
#[derive(Debug, Default)]
struct Arena {
    small: SmallChunks,
    big: BigRuns,
    /// Its small segments' regions.
    small_segments: BTreeSet<u32>,
    /// The sequence number of its micro-log slot.
    seq: u64,
    /// Its metadata-log ring ([`MetadataPolicy::MetadataLog`]).
    ring: RingState,
    /// The metadata steps of the ring's records, not yet stored in place.
    pending: Vec<(Step, MicroOp)>,
    /// Checkpoints taken.
    checkpoints: u64,
}

impl Arena {
    /// Its live small and big blocks and their usable bytes.
    fn live(&self) -> (u64, u64) {
        let (n, b) = self.small.live();
        let (m, c) = self.big.live();
        (n + m, b + c)
    }

    /// DRAM held by its indexes (approximate).
    fn dram_bytes(&self) -> u64 {
        self.small.dram_bytes() + self.big.dram_bytes()
    }

    /// Gives back a block it holds (DRAM only); whether its segment may now be empty (a
    /// small block's chunk emptied, or any big block: checking a big segment costs one
    /// look, a small one a look at every chunk).
    fn give_back(&mut self, held: Held) -> bool {
        match held {
            Held::Small(b) => self.small.give_back(b),
            Held::Big(b) => {
                self.big.give_back(b);
                true
            }
        }
    }
}

/// Which regions are free, and how often each was taken.
#[derive(Debug)]
struct Regions {
    /// Free regions (only regions of files that exist).
    free: BTreeSet<u32>,
    /// What each extension slot holds.
    slots: Vec<Slot>,
    generation: Vec<u64>,
    /// The volatile heap's huge blocks: their first region and their count of regions
    /// (a persistent huge block's count is in its table entry).
    volatile_huge: BTreeMap<u32, u64>,
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

/// The arena of this thread: threads are spread round-robin over the arenas as they
/// first allocate (002 keeps one allocator per core; a thread keeps its arena, so its
/// blocks stay together and its frees find their arena's lock uncontended).
fn arena_hint() -> usize {
    thread_local! {
        static HINT: usize = {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            NEXT.fetch_add(1, Ordering::Relaxed)
        };
    }
    HINT.with(|h| *h)
}

impl PersistentHeap {
    /// Creates a heap in a new pool file at `path` (which must not exist).
    pub fn create(path: impl AsRef<Path>, options: &HeapOptions) -> Result<PersistentHeap> {
        let sb = plan(options)?;
        let path = path.as_ref();
        let mut dir = path.as_os_str().to_owned();
        dir.push(".d");
        if sb.max_files > 0 && Path::new(&dir).exists() && !path.exists() {
            // Files of another heap that was here: a new heap must not take them.
            return Err(Error::AlreadyExists { path: dir.into() });
        }
        let file =
            PoolFile::create_spanning(path, &options.pool_options(), sb.span(), |media, _| {
                format(media, &sb)
            })?;
        PersistentHeap::start(file)
    }

    /// Creates a heap in memory on the crash-simulation media.
    pub fn create_sim(options: &HeapOptions, sim: SimConfig) -> Result<PersistentHeap> {
        let sb = plan(options)?;
        let len = sim_len(&sb);
        let file = PoolFile::create_sim_spanning(&options.pool_options(), len, sim)?;
        format(file.media(), &sb);
        PersistentHeap::start(file)
    }

    /// Opens the heap at `path` with the default media settings, recovering it if it was
    /// not closed cleanly.
    pub fn open(path: impl AsRef<Path>) -> Result<PersistentHeap> {
        PersistentHeap::open_with(path, &MediaConfig::default())
    }

    /// Opens the heap at `path` with `media`'s settings.
    pub fn open_with(path: impl AsRef<Path>, media: &MediaConfig) -> Result<PersistentHeap> {
        PersistentHeap::start(PoolFile::open(path, media)?)
    }

    /// Opens a heap image (for example a crash image) on fresh simulation media.
    pub fn open_image(
        image: Vec<u8>,
        media: &MediaConfig,
        sim: SimConfig,
    ) -> Result<PersistentHeap> {
        PersistentHeap::start(PoolFile::open_image(image, media, sim)?)
    }

    /// Starts a heap on an opened pool file: checks and rebuilds it (see the module docs).
    pub fn from_file(file: PoolFile) -> Result<PersistentHeap> {
        PersistentHeap::start(file)
    }

    fn start(file: PoolFile) -> Result<PersistentHeap> {
        PersistentHeap::start_with(file, EngineKind::Alloc, None)
    }

    /// Creates the heap of a transaction engine's pool (engine `engine`, one file).
    pub(crate) fn create_for_engine(
        path: &Path,
        options: &HeapOptions,
        engine: EngineKind,
        replay: EngineReplay<'_>,
    ) -> Result<PersistentHeap> {
        let sb = plan(options)?;
        let mut pool = options.pool_options();
        pool.engine = engine;
        let file =
            PoolFile::create_spanning(path, &pool, sb.span(), |media, _| format(media, &sb))?;
        PersistentHeap::start_with(file, engine, Some(replay))
    }

    /// Creates the heap of a transaction engine's pool on the crash-simulation media.
    pub(crate) fn create_sim_for_engine(
        options: &HeapOptions,
        engine: EngineKind,
        sim: SimConfig,
        replay: EngineReplay<'_>,
    ) -> Result<PersistentHeap> {
        let sb = plan(options)?;
        let mut pool = options.pool_options();
        pool.engine = engine;
        let file = PoolFile::create_sim_spanning(&pool, sim_len(&sb), sim)?;
        format(file.media(), &sb);
        PersistentHeap::start_with(file, engine, Some(replay))
    }

    /// Starts the heap of a transaction engine's pool on an opened pool file. `replay`
    /// runs after the heap's own logs are redone and before its DRAM state is built
    /// from its metadata, so the allocations and frees the engine's log redoes or
    /// undoes are in that state.
    pub(crate) fn open_for_engine(
        file: PoolFile,
        replay: EngineReplay<'_>,
    ) -> Result<PersistentHeap> {
        let engine = file.header().engine;
        PersistentHeap::start_with(file, engine, Some(replay))
    }

    fn start_with(
        mut file: PoolFile,
        engine: EngineKind,
        replay: Option<EngineReplay<'_>>,
    ) -> Result<PersistentHeap> {
        let started = Instant::now();
        let path = file.path().to_path_buf();
        if file.header().engine != engine {
            return Err(Error::WrongEngine {
                path,
                found: file.header().engine,
                expected: engine,
            });
        }
        let layout = file.layout().clone();
        let mut raw = [0u8; SUPERBLOCK_BYTES];
        file.media().read(SUPERBLOCK.start as usize, &mut raw);
        let sb = Superblock::decode(&raw, layout.data.clone()).map_err(|e| match e {
            SuperblockError::Checksum { stored, computed } => Error::Checksum {
                path: path.clone(),
                what: "heap superblock",
                offset: SUPERBLOCK.start,
                stored,
                computed,
            },
            SuperblockError::Invalid(reason) => Error::MetadataCorrupt {
                path: path.clone(),
                offset: SUPERBLOCK.start,
                reason,
            },
        })?;
        let was_clean = file.was_clean();
        if sb.max_files > 0 {
            let span = if file.media().crash_simulator().is_some() {
                sim_len(&sb)
            } else {
                sb.span()
            };
            file.extend_span(span)?;
        }
        let media = file.media().clone();
        let store = FileStore::new(
            &path,
            &media,
            file.header().uuid,
            sb.span(),
            sb.max_files,
            true,
        );
        let mut files = FileTable::open(&media, &sb, &store, &path, was_clean)?;
        let region_file = std::mem::take(&mut files.region_file);
        let reader = Reader {
            media: &media,
            sb: &sb,
            path: &path,
            root: layout.root.clone(),
            region_file: &region_file,
        };
        let pending = reader.pending_slots();
        let mut redone = 0;
        if was_clean {
            if let Some((a, _)) = pending.first() {
                return Err(reader.corrupt(
                    sb.slot_offset(*a),
                    "a cleanly closed heap has an unfinished allocation".into(),
                ));
            }
        } else {
            // Check every pending record before the first store.
            let entries = reader.entries()?;
            let steps = pending
                .iter()
                .map(|(a, r)| {
                    reader.check_record(sb.slot_offset(*a), RecordLog::MicroLog, r, &entries)
                })
                .collect::<Result<Vec<_>>>()?;
            file.mark_open();
            files.finish_unfinished(&media, &sb, &store)?;
            for ((a, r), step) in pending.iter().zip(steps) {
                reader.redo(r, step);
                retire(&media, sb.slot_offset(*a));
                redone += 1;
            }
        }
        let (ring_bases, replayed, ring_redone) = reader.replay_rings(was_clean)?;
        redone += ring_redone;
        if let Some(replay) = replay {
            replay(&mut Replay {
                entries: reader.entries()?,
                reader: &reader,
                superseded: 0,
            })?;
        }
        let (entries, scan) = reader.scan_all()?;
        if was_clean {
            let word = media.read_u64((SUPERBLOCK.start + DIGEST_WORD) as usize);
            let computed = scan.digest;
            match decode_digest(word) {
                Some(stored) if stored == computed => {}
                Some(stored) => {
                    return Err(Error::Checksum {
                        path,
                        what: "heap metadata (digest written at the last clean close)",
                        offset: SUPERBLOCK.start + DIGEST_WORD,
                        stored,
                        computed,
                    });
                }
                None => {
                    return Err(reader.corrupt(
                        SUPERBLOCK.start + DIGEST_WORD,
                        format!("the clean-close digest word {word:#018x} is damaged"),
                    ));
                }
            }
            file.mark_open();
        }
        if was_clean {
            // A removal that failed while the heap was open (see `remove_file`).
            files.finish_unfinished(&media, &sb, &store)?;
        }
        files.remove_empty_huge_files(&media, &sb, &store, &entries, &region_file, &path)?;
        let mut seqs = vec![0; sb.arenas as usize];
        for (a, s) in seqs.iter_mut().enumerate() {
            let mut b = [0u8; 64];
            media.read(sb.slot_offset(a as u32) as usize, &mut b);
            *s = MicroLogSlot::stored_seq(&b);
        }
        let mut arenas: Vec<Arena> = seqs
            .into_iter()
            .zip(ring_bases)
            .map(|(seq, base)| Arena {
                seq,
                ring: RingState { base, tail: 0 },
                ..Arena::default()
            })
            .collect();
        let uses: Box<[AtomicU32]> = (0..sb.region_count).map(|_| AtomicU32::new(0)).collect();
        let mut free = BTreeSet::new();
        let mut generation = vec![0; sb.region_count as usize];
        let mut huge_tail = 0..0;
        for (r, e) in entries.iter().enumerate() {
            match e {
                Some(e) => {
                    generation[r] = e.generation;
                    if e.kind == SegmentKind::Huge {
                        huge_tail = r + 1..r + (e.size / sb.segment_size) as usize;
                    }
                }
                None if huge_tail.contains(&r) => {}
                None if region_file[r].load(Ordering::Relaxed) == NO_FILE => {}
                None => {
                    free.insert(r as u32);
                }
            }
        }
        for s in scan.segments {
            let arena = &mut arenas[s.owner as usize];
            match s.content {
                Content::Small(headers) => {
                    let base = sb.region_offset(u64::from(s.region));
                    let g = small::Geometry::of(base, sb.segment_size);
                    arena.small.add_segment(g, headers);
                    arena.small_segments.insert(s.region);
                    uses[s.region as usize]
                        .store(USE_SMALL | u32::from(s.owner), Ordering::Relaxed);
                }
                Content::Big { free, allocated } => {
                    let granules = (sb.segment_size / GRANULE) as u32;
                    arena.big.add_segment(s.region, granules, &free, &allocated);
                    uses[s.region as usize].store(USE_BIG | u32::from(s.owner), Ordering::Relaxed);
                }
                Content::Huge { regions } => {
                    uses[s.region as usize].store(USE_HUGE, Ordering::Relaxed);
                    for t in 1..regions {
                        uses[s.region as usize + t as usize]
                            .store(USE_HUGE_TAIL, Ordering::Relaxed);
                    }
                }
            }
        }
        let recovery = HeapRecovery {
            was_clean,
            redone,
            replayed,
            segments: scan.segment_count,
            blocks: scan.blocks,
            seconds: started.elapsed().as_secs_f64(),
            files: files.opened,
            files_removed: files.removed,
            orphan_files: files.orphans,
        };
        let volatile = (0..sb.arenas)
            .map(|_| CachePadded::new(Mutex::new(Arena::default())))
            .collect();
        Ok(PersistentHeap {
            media,
            sb,
            root: layout.root,
            arenas: arenas
                .into_iter()
                .map(|a| CachePadded::new(Mutex::new(a)))
                .collect(),
            volatile,
            regions: Mutex::new(Regions {
                free,
                slots: files.slots,
                generation,
                volatile_huge: BTreeMap::new(),
            }),
            uses,
            region_file,
            file_bytes: files.file_bytes,
            store,
            recovery,
            file,
            engine_owned: engine != EngineKind::Alloc,
        })
    }

    /// The root area: where the first persistent pointers live (all zeros when created).
    pub fn root(&self) -> PAddr {
        PAddr::new(0, self.root.start).expect("the root is inside file 0")
    }

    /// Bytes of the root area.
    pub fn root_size(&self) -> u64 {
        self.root.end - self.root.start
    }

    /// The pool file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The media holding the heap (for its counters and, on simulation media, its crash
    /// simulator).
    pub fn media(&self) -> &Arc<Media> {
        &self.media
    }

    /// The address the heap is mapped at in every process when it was created with a
    /// fixed [`MapAddress`], else `None` (it is mapped wherever the kernel picks, and on
    /// simulation media, which ignore the recorded address).
    pub fn map_address(&self) -> Option<u64> {
        let at = self.file.header().map_address;
        (at != 0 && self.media.base_address() as u64 == at).then_some(at)
    }

    /// The native address of `[addr, addr + len)`, checked as [`read`](Self::read)
    /// checks (in the root area or inside one block's segment), for reading through
    /// plain loads. It stays valid while the heap is open; with a fixed
    /// [`map_address`](Self::map_address) it is the same at every open, so it may be
    /// stored in persistent data (through [`write_u64`](Self::write_u64), like every
    /// store) and followed after a restart.
    pub fn direct(&self, addr: PAddr, len: u64) -> Result<*const u8> {
        let at = self.data_range(addr, len)?;
        Ok((self.media.base_address() + at as usize) as *const u8)
    }

    /// The native address of `addr`, checked only against the file's bounds (as a
    /// persistent pointer's dereference in a hot loop is: one compare and one add), or
    /// `None` outside them. Prefer [`direct`](Self::direct) unless the check shows.
    #[inline]
    pub fn resolve(&self, addr: PAddr) -> Option<*const u8> {
        let at = self.span_offset(addr);
        at.map(|o| (self.media.base_address() + o as usize) as *const u8)
    }

    /// The persistent address of a native pointer into this heap's mapping (the inverse
    /// of [`resolve`](Self::resolve)), or `None` when it points elsewhere.
    pub fn addr_of(&self, ptr: *const u8) -> Option<PAddr> {
        let offset = (ptr as usize).checked_sub(self.media.base_address())? as u64;
        match self.sb.region_of(offset) {
            None if offset < self.file.header().pool_size => PAddr::new(0, offset),
            None => None,
            Some(r) => self.paddr(offset, r),
        }
    }

    /// The span offset of `addr` when it lies in one of the heap's files (file 0's
    /// offsets are span offsets; an extension file's count from its start).
    fn span_offset(&self, addr: PAddr) -> Option<u64> {
        let (file, offset) = (addr.file(), addr.offset());
        if file == 0 {
            // File 0 ends where its regions end: the span after it is the extension
            // files', reached only through their own ids.
            let end = self.sb.region_offset(self.sb.local_regions);
            return (offset < end).then_some(offset);
        }
        let k = u64::from(file) - 1;
        let bytes = self.file_bytes.get(k as usize)?.load(Ordering::Acquire);
        (FILE_DATA..FILE_DATA + bytes)
            .contains(&offset)
            .then(|| self.sb.region_offset(self.sb.slot_region(k)) + offset - FILE_DATA)
    }

    /// The persistent address of span offset `offset`, in region `r`.
    fn paddr(&self, offset: u64, r: u64) -> Option<PAddr> {
        match self.region_file[r as usize].load(Ordering::Acquire) {
            NO_FILE => None,
            0 => PAddr::new(0, offset),
            id => {
                let base = self
                    .sb
                    .region_offset(self.sb.slot_region(u64::from(id) - 1));
                PAddr::new(id, FILE_DATA + offset - base)
            }
        }
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

    fn allocate(&self, dst: PAddr, size: u64, zeroed: bool) -> Result<PAddr> {
        let policy = size_policy(self.sb.segment_size, size)
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
        let policy = size_policy(self.sb.segment_size, size)
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
                    Held::Small(b) => u64::from(super::layout::CLASSES[b.class]),
                    Held::Big(b) => u64::from(b.len) * GRANULE,
                })
            }
            USE_HUGE if offset == self.sb.region_offset(u64::from(region)) => {
                self.huge_size(region, used).ok_or_else(invalid)
            }
            _ => Err(invalid()),
        }
    }

    /// Copies `buf.len()` bytes at `addr` into `buf`.
    pub fn read(&self, addr: PAddr, buf: &mut [u8]) -> Result<()> {
        let at = self.data_range(addr, buf.len() as u64)?;
        self.media.read(at as usize, buf);
        Ok(())
    }

    /// Loads the 8-byte word at `addr` (8-byte aligned) atomically.
    pub fn read_u64(&self, addr: PAddr) -> Result<u64> {
        let at = self.word(addr)?;
        Ok(self.media.read_u64(at as usize))
    }

    /// Stores `bytes` at `addr` through the cache: durable after
    /// [`persist`](PersistentHeap::persist) of the range.
    pub fn write(&self, addr: PAddr, bytes: &[u8]) -> Result<()> {
        let at = self.data_range(addr, bytes.len() as u64)?;
        self.media.write(at as usize, bytes);
        Ok(())
    }

    /// Stores the 8-byte word at `addr` (8-byte aligned) atomically, through the cache.
    pub fn write_u64(&self, addr: PAddr, value: u64) -> Result<()> {
        let at = self.word(addr)?;
        self.media.write_u64(at as usize, value);
        Ok(())
    }

    /// Makes `[addr, addr + len)` durable (flush, then fence).
    pub fn persist(&self, addr: PAddr, len: u64) -> Result<()> {
        let at = self.data_range(addr, len)?;
        self.media.persist(at as usize, len as usize);
        Ok(())
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
                                    size: u64::from(super::layout::CLASSES[class]),
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

    /// The region holding `addr`, if it is in one.
    fn region_at(&self, addr: PAddr) -> Option<u32> {
        let r = self.sb.region_of(self.span_offset(addr)?)?;
        (self.region_file[r as usize].load(Ordering::Acquire) != NO_FILE).then_some(r as u32)
    }

    /// Takes a block of `size` bytes served by `policy` for arena `a` (DRAM only, plus
    /// taking a segment when the arena has no room): its file-0 offset, usable size and
    /// where its metadata step stores.
    fn reserve(
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
                        self.add_segment(a, arena, SegmentKind::Small, size, volatile)?;
                        arena.small.take(class).expect("a new segment has room")
                    }
                };
                let region = self.sb.region_of(b.chunk).expect("a chunk is in a region");
                let step = Step::Small {
                    header: self.small_geometry(region as u32).header_of(b.chunk),
                    class,
                    block: b.block,
                };
                Ok((b.offset(), u64::from(super::layout::CLASSES[class]), step))
            }
            SizePolicy::Big(len) => {
                let b = match arena.big.take(len) {
                    Some(b) => b,
                    None => {
                        self.add_segment(a, arena, SegmentKind::Big, size, volatile)?;
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
                    match self.add_file(&mut regions, FileKind::Huge, slots, count, size) {
                        Ok(k) => Some(self.sb.slot_region(k) as u32),
                        Err(Error::HeapFull { .. }) => None,
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
                            self.grow(&mut regions, size)?;
                            first_run(&self.sb, &regions.free, count as u32)
                                .ok_or(Error::HeapFull { size })?
                        }
                        None => return Err(Error::HeapFull { size }),
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
        size: u64,
        volatile: bool,
    ) -> Result<()> {
        let mut regions = self.regions.lock().expect("regions lock");
        if regions.free.is_empty() {
            self.grow(&mut regions, size)?;
        }
        let r = regions.free.pop_first().ok_or(Error::HeapFull { size })?;
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
    /// regions (for a block of `size` bytes, named in errors), durably: its entry as
    /// creating (two fences), the file, then its entry as live (one fence). Returns its
    /// first slot. The file's regions are in no free list.
    fn add_file(
        &self,
        regions: &mut Regions,
        kind: FileKind,
        slots: u64,
        count: u64,
        size: u64,
    ) -> Result<u64> {
        let k = (0..regions.slots.len() as u64)
            .find(|&k| {
                k + slots <= self.sb.max_files
                    && (k..k + slots).all(|c| regions.slots[c as usize] == Slot::Empty)
            })
            .ok_or(Error::HeapFull { size })?;
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

    /// Grows the heap by one extension file of segments (for a block of `size` bytes,
    /// named in errors), whose regions become free.
    fn grow(&self, regions: &mut Regions, size: u64) -> Result<()> {
        if self.sb.max_files == 0 {
            return Err(Error::HeapFull { size });
        }
        let rpf = self.sb.file_regions;
        let k = self.add_file(regions, FileKind::Segments, 1, rpf, size)?;
        let first = self.sb.slot_region(k) as u32;
        regions.free.extend(first..first + rpf as u32);
        Ok(())
    }

    /// Marks the `count` regions of the huge block at `region` free: a huge block's
    /// own file is removed (see `remove_file`; a failure leaves it for the next open),
    /// other regions go back to the free list.
    fn free_huge_regions(&self, regions: &mut Regions, region: u32, count: u64) {
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
    fn give_back_if_empty(
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
    fn held_block(
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
                u64::from(super::layout::CLASSES[class]),
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

    /// Where the metadata step of the small or big block `held` (in `region`) stores.
    fn step_of(&self, held: Held, region: u32) -> Step {
        match held {
            Held::Small(b) => Step::Small {
                header: self.small_geometry(region).header_of(b.chunk),
                class: b.class,
                block: b.block,
            },
            Held::Big(b) => Step::Big {
                region: u64::from(region),
                granule: u64::from(b.granule),
                len: u64::from(b.len),
            },
        }
    }

    /// Runs one logged standalone step for arena `a`: the record, fence; its metadata
    /// step and `*dst` (the block, or null for a free), fence; retire, fence.
    /// `record` gets its sequence number here, from the log it goes to.
    fn run_logged(
        &self,
        a: u32,
        arena: &mut Arena,
        record: MicroLogSlot,
        step: Step,
        dst_off: u64,
    ) {
        if self.sb.policy == MetadataPolicy::MetadataLog && !matches!(step, Step::Huge { .. }) {
            self.run_ring_logged(a, arena, record, step, dst_off);
            return;
        }
        let record = MicroLogSlot {
            seq: arena.seq + 1,
            ..record
        };
        let slot = self.sb.slot_offset(a) as usize;
        self.media.write(slot, &record.encode());
        self.media.flush(slot, LINE as usize);
        self.media.fence();
        apply_step(&self.media, &self.sb, step, record.op, record.size);
        self.media
            .write_u64(dst_off as usize, record.dst_value(&self.sb));
        self.media.flush(dst_off as usize, 8);
        self.media.fence();
        retire(&self.media, slot as u64);
        arena.seq = record.seq;
    }

    /// Runs one standalone small or big step through arena `a`'s metadata-log ring
    /// (see [`metadata_log`]): the record, fence; `*dst`, fence; `done`, fence. The
    /// metadata step waits in DRAM for the next checkpoint.
    fn run_ring_logged(
        &self,
        a: u32,
        arena: &mut Arena,
        record: MicroLogSlot,
        step: Step,
        dst_off: u64,
    ) {
        if arena.ring.is_full(self.sb.ring_records) {
            self.checkpoint(a, arena);
        }
        let record = MicroLogSlot {
            seq: arena.ring.next_seq(),
            ..record
        };
        metadata_log::append(&self.media, &self.sb, a, arena.ring.tail, &record);
        self.media
            .write_u64(dst_off as usize, record.dst_value(&self.sb));
        self.media.flush(dst_off as usize, 8);
        self.media.fence();
        metadata_log::set_done(&self.media, &self.sb, a, record.seq);
        arena.ring.tail += 1;
        arena.pending.push((step, record.op));
    }

    /// Stores arena `a`'s pending metadata steps in place, flushing each dirtied line
    /// once, fences, and starts its ring over (a no-op for an empty ring).
    fn checkpoint(&self, a: u32, arena: &mut Arena) {
        if arena.ring.tail == 0 {
            return;
        }
        let last = arena.ring.next_seq() - 1;
        let steps = std::mem::take(&mut arena.pending);
        checkpoint_ring(&self.media, &self.sb, a, steps, DirtyLines::default(), last);
        arena.ring.base = last + 1;
        arena.ring.tail = 0;
        arena.checkpoints += 1;
    }

    /// Checkpoints every arena (with a metadata log; else nothing to do).
    fn checkpoint_all(&self) {
        if self.sb.policy != MetadataPolicy::MetadataLog {
            return;
        }
        for (a, arena) in self.arenas.iter().enumerate() {
            self.checkpoint(a as u32, &mut arena.lock().expect("arena lock"));
        }
    }

    /// The file-0 offset of the aligned word at `addr` (see `data_range`).
    fn word(&self, addr: PAddr) -> Result<u64> {
        if !addr.offset().is_multiple_of(8) {
            return Err(Error::InvalidAddress {
                addr,
                reason: "a pointer or word must be 8-byte aligned",
            });
        }
        self.data_range(addr, 8)
    }

    /// [`word`](Self::word), for a word that will hold a persistent pointer: never in the
    /// volatile heap, which recovery does not know.
    fn persistent_word(&self, addr: PAddr) -> Result<u64> {
        let at = self.word(addr)?;
        let region = self.sb.region_of(at);
        if region.is_some_and(|r| self.uses[r as usize].load(Ordering::Acquire) & USE_VOLATILE != 0)
        {
            return Err(Error::InvalidAddress {
                addr,
                reason: "a persistent pointer cannot live in the volatile heap",
            });
        }
        Ok(at)
    }

    /// The file-0 offset of `[addr, addr + len)` when it lies in the root area or in the
    /// data part of one region in use (never over allocator metadata).
    fn data_range(&self, addr: PAddr, len: u64) -> Result<u64> {
        let bad = |reason| Err(Error::InvalidAddress { addr, reason });
        let Some(start) = self.span_offset(addr) else {
            return bad("no such file in this heap, or outside it");
        };
        let Some(end) = start.checked_add(len) else {
            return bad("the range wraps around");
        };
        if addr.file() == 0 && self.root.start <= start && end <= self.root.end {
            return Ok(start);
        }
        let Some(region) = self.sb.region_of(start) else {
            return bad("outside the root area and the heap's regions");
        };
        let base = self.sb.region_offset(region);
        let used = self.uses[region as usize].load(Ordering::Acquire);
        let (lo, hi) = match used & USE_KIND {
            USE_SMALL => {
                let g = small::Geometry::of(base, self.sb.segment_size);
                match g.chunk_containing(start) {
                    Some(chunk) => (chunk, chunk + CHUNK),
                    None => return bad("over allocator metadata"),
                }
            }
            USE_BIG => (
                base + big::table_granules(self.sb.segment_size) * GRANULE,
                base + self.sb.segment_size,
            ),
            USE_HUGE | USE_HUGE_TAIL => {
                // The huge block this region belongs to ends where its run ends.
                let mut head = region;
                while self.uses[head as usize].load(Ordering::Acquire) & USE_KIND == USE_HUGE_TAIL
                    && head > 0
                {
                    head -= 1;
                }
                let run = self.huge_size(head as u32, used).unwrap_or(0);
                let head_base = self.sb.region_offset(head);
                (head_base, head_base + run)
            }
            _ => return bad("in a region that holds no blocks"),
        };
        if start < lo || end > hi {
            return bad("over allocator metadata or across segments");
        }
        Ok(start)
    }
}

/// A block an arena holds.
#[derive(Debug, Clone, Copy)]
enum Held {
    Small(SmallBlock),
    Big(BigBlock),
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

/// Retires a micro-log slot (its op word becomes 0), durably.
fn retire(media: &Media, slot: u64) {
    let at = (slot + SLOT_OP) as usize;
    media.write_u64(at, 0);
    media.persist(at, 8);
}

fn plan(options: &HeapOptions) -> Result<Superblock> {
    let header = crate::pool::header::Header::new(
        EngineKind::Alloc,
        crate::pool::header::Geometry {
            pool_size: options.size,
            root_size: options.root_size,
            chunk_size: options.segment_size,
        },
    )
    .map_err(Error::InvalidConfig)?;
    Superblock::plan(
        header.layout.data,
        options.segment_size,
        options.arenas,
        options.metadata,
        options.log_records,
        options.growth()?,
    )
    .map_err(Error::InvalidConfig)
}

/// Bytes of simulation media a heap needs: its span, and the directory of its extension
/// files after it.
fn sim_len(sb: &Superblock) -> u64 {
    if sb.max_files == 0 {
        sb.span()
    } else {
        sb.span() + files::sim_directory_bytes(sb.max_files)
    }
}

/// Writes a new heap's superblock and the digest of its (empty) metadata; its table and
/// micro-log are the zeros of a new file.
fn format(media: &Media, sb: &Superblock) {
    let at = SUPERBLOCK.start as usize;
    media.write(at, &sb.encode());
    media.flush(at, SUPERBLOCK_BYTES);
    // The digest of empty metadata: no segments, and (with a metadata log) the ring
    // headers, as `Reader::scan_all` reads them.
    let mut empty = 0;
    if sb.policy == MetadataPolicy::MetadataLog {
        metadata_log::format(media, sb);
        for a in 0..sb.arenas {
            let mut line = [0u8; LINE as usize];
            media.read(sb.ring_header(a) as usize, &mut line);
            empty = crc32c::crc32c_append(empty, &line);
        }
    }
    let digest = (SUPERBLOCK.start + DIGEST_WORD) as usize;
    media.write_u64(digest, encode_digest(empty));
    media.persist(digest, 8);
}

/// Reads and checks persistent metadata.
struct Reader<'a> {
    media: &'a Media,
    sb: &'a Superblock,
    path: &'a Path,
    root: Range<u64>,
    /// Per region, the file holding it (`NO_FILE`: none, so nothing there may be read).
    region_file: &'a [AtomicU32],
}

/// One segment's metadata, as read.
struct SegmentScan {
    region: u32,
    owner: u16,
    content: Content,
}

enum Content {
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
enum RecordLog {
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
struct Scan {
    segments: Vec<SegmentScan>,
    segment_count: u64,
    blocks: u64,
    /// CRC of every live segment's table entry and metadata, in region order.
    digest: u32,
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
    fn corrupt(&self, offset: u64, reason: String) -> Error {
        Error::MetadataCorrupt {
            path: PathBuf::from(self.path),
            offset,
            reason,
        }
    }

    /// Table entry `r`, checked.
    fn entry(&self, r: u64) -> Result<Option<TableEntry>> {
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
    fn entries(&self) -> Result<Vec<Option<TableEntry>>> {
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
    fn pending_slots(&self) -> Vec<(u32, MicroLogSlot)> {
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
    fn check_record(
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

    /// Replays every arena's metadata-log ring into the in-place metadata (see
    /// [`metadata_log`]; nothing to do in place), after checking every record. Returns
    /// each arena's next ring base, the records replayed and the pointer stores redone.
    /// A cleanly closed heap must have no valid record.
    fn replay_rings(&self, was_clean: bool) -> Result<(Vec<u64>, u64, u32)> {
        if self.sb.policy != MetadataPolicy::MetadataLog {
            return Ok((vec![0; self.sb.arenas as usize], 0, 0));
        }
        let entries = self.entries()?;
        let mut rings = Vec::with_capacity(self.sb.arenas as usize);
        for a in 0..self.sb.arenas {
            let ring = metadata_log::read(self.media, self.sb, a);
            let header = self.sb.ring_header(a);
            if ring.base == 0 || ring.base > u64::MAX / 2 {
                return Err(self.corrupt(
                    header,
                    format!(
                        "metadata-log ring {a} starts at sequence number {}",
                        ring.base
                    ),
                ));
            }
            if let Some((at, _)) = ring.records.first()
                && was_clean
            {
                return Err(self.corrupt(
                    *at,
                    "a cleanly closed heap has metadata-log records not checkpointed".into(),
                ));
            }
            let steps = ring
                .records
                .iter()
                .map(|(at, r)| self.check_record(*at, RecordLog::MetadataLog, r, &entries))
                .collect::<Result<Vec<_>>>()?;
            rings.push((ring, steps));
        }
        let (mut replayed, mut redone) = (0, 0);
        let mut bases = Vec::with_capacity(rings.len());
        for (a, (ring, steps)) in rings.iter().enumerate() {
            let Some((_, last)) = ring.records.last() else {
                bases.push(ring.base);
                continue;
            };
            let mut lines = DirtyLines::default();
            if last.seq > ring.done {
                // The call had not returned: finish its pointer store.
                let dst = last.dst;
                self.media.write_u64(dst as usize, last.dst_value(self.sb));
                lines.add(dst);
                redone += 1;
            }
            let steps = steps
                .iter()
                .zip(&ring.records)
                .map(|(&s, (_, r))| (s, r.op));
            checkpoint_ring(self.media, self.sb, a as u32, steps, lines, last.seq);
            replayed += ring.records.len() as u64;
            bases.push(last.seq + 1);
        }
        Ok((bases, replayed, redone))
    }

    /// Redoes a pending record: its metadata step and its pointer store, durably.
    fn redo(&self, r: &MicroLogSlot, step: Step) {
        apply_step(self.media, self.sb, step, r.op, r.size);
        let dst = r.dst as usize;
        self.media.write_u64(dst, r.dst_value(self.sb));
        self.media.flush(dst, 8);
        self.media.fence();
    }

    /// Where a record's metadata step stores, checked against the segment table: the
    /// block's size class decides the segment kind it must lie in.
    fn plan(&self, r: &MicroLogSlot, entries: &[Option<TableEntry>]) -> Result<Step, String> {
        let region = self
            .sb
            .region_of(r.addr)
            .filter(|&region| self.file_of(region) != NO_FILE)
            .ok_or("the block is outside the regions of the heap's files")?;
        let base = self.sb.region_offset(region);
        let entry = entries[region as usize];
        let seg = self.sb.segment_size;
        match size_policy(seg, r.size) {
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
    fn scan_all(&self) -> Result<(Vec<Option<TableEntry>>, Scan)> {
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
                let word = |g: u64| super::layout::u64_at(&table, (g * 8) as usize);
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

/// How a block of some size is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SizePolicy {
    /// By the small allocator, in this class.
    Small(usize),
    /// By the big allocator, in this many granules.
    Big(u32),
    /// As a huge block over this many regions.
    Huge(u64),
}

/// How a heap with `segment_size` regions serves `size` bytes (`None`: zero bytes).
fn size_policy(segment_size: u64, size: u64) -> Option<SizePolicy> {
    let big_max = segment_size - big::table_granules(segment_size) * GRANULE;
    match size {
        0 => None,
        s if s <= SMALL_MAX => Some(SizePolicy::Small(class_of(s))),
        s if s <= big_max && s < HUGE_THRESHOLD => {
            Some(SizePolicy::Big(s.div_ceil(GRANULE) as u32))
        }
        s => Some(SizePolicy::Huge(s.div_ceil(segment_size))),
    }
}

/// Where a micro-log record's metadata step stores.
#[derive(Debug, Clone, Copy)]
enum Step {
    Small {
        header: u64,
        class: usize,
        block: u32,
    },
    Big {
        region: u64,
        granule: u64,
        len: u64,
    },
    Huge {
        region: u64,
        count: u64,
    },
}

/// Stores `steps` of arena `a`'s ring in place, flushes each line they dirtied (and
/// the lines already in `lines`) once, fences, and starts the ring over after record
/// `last` (the checkpoint of [`metadata_log`], at run time and in recovery alike).
fn checkpoint_ring(
    media: &Media,
    sb: &Superblock,
    a: u32,
    steps: impl IntoIterator<Item = (Step, MicroOp)>,
    mut lines: DirtyLines,
    last: u64,
) {
    for (step, op) in steps {
        lines.add(store_step(media, sb, step, op));
    }
    lines.flush(media);
    media.fence();
    metadata_log::restart(media, sb, a, last + 1, last);
}

/// Stores a small or big step's bit or word in place, unflushed, and returns where
/// (a huge step is never in a metadata log: it stores nothing).
fn store_step(media: &Media, sb: &Superblock, step: Step, op: MicroOp) -> u64 {
    match (step, op) {
        (
            Step::Small {
                header,
                class,
                block,
            },
            MicroOp::Allocate,
        ) => {
            small::store_set(media, header, class, block);
            header
        }
        (Step::Small { header, block, .. }, MicroOp::Free) => {
            small::store_clear(media, header, block);
            header
        }
        (
            Step::Big {
                region,
                granule,
                len,
            },
            MicroOp::Allocate,
        ) => {
            let base = sb.region_offset(region);
            big::store_set(media, base, region, granule, len);
            base + granule * 8
        }
        (
            Step::Big {
                region, granule, ..
            },
            MicroOp::Free,
        ) => {
            let base = sb.region_offset(region);
            big::store_clear(media, base, granule);
            base + granule * 8
        }
        (Step::Huge { region, .. }, _) => {
            debug_assert!(false, "a huge step in a metadata log");
            sb.entry_offset(region)
        }
    }
}

/// Applies the metadata step of `op` on the block at `step` of `size` requested bytes
/// (flushed, not fenced). Idempotent, so recovery may redo it.
fn apply_step(media: &Media, sb: &Superblock, step: Step, op: MicroOp, size: u64) {
    let (at, len) = store_step_unflushed(media, sb, step, op, size);
    media.flush(at as usize, len as usize);
}

/// Stores `op` of `step` (a block of `size` requested bytes), without flushing it;
/// returns the bytes stored (inside one cache line), for the caller to flush.
fn store_step_unflushed(
    media: &Media,
    sb: &Superblock,
    step: Step,
    op: MicroOp,
    size: u64,
) -> (u64, u64) {
    match (step, op) {
        (Step::Huge { region, count }, MicroOp::Allocate) => {
            let e = TableEntry {
                index: region as u32,
                kind: SegmentKind::Huge,
                owner: 0,
                size: count * sb.segment_size,
                generation: 0,
                requested: size,
            };
            let at = sb.entry_offset(region) as usize;
            media.write(at, &e.encode_body(sb.region_offset(region)));
            media.write_u64(at + ENTRY_STATE as usize, LIVE);
            (at as u64, LINE)
        }
        (Step::Huge { region, .. }, MicroOp::Free) => {
            let at = sb.entry_offset(region) as usize + ENTRY_STATE as usize;
            media.write_u64(at, 0);
            (at as u64, 8)
        }
        _ => {
            // A bit in a chunk header, or a page-table word: one line either way.
            (store_step(media, sb, step, op), 8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
