//! Creating and opening a heap. Every open checks and recovers the heap, in phases
//! (see [`PersistentHeap::start_with`]):
//!
//! 1. [`check_superblock`]: the pool is a heap of the expected engine, its superblock
//!    intact; then [`open_files`] opens its extension files.
//! 2. [`redo_micro_log`]: standalone allocations and frees a crash left half done are
//!    redone from the arenas' micro-log slots.
//! 3. [`replay_rings`]: the metadata-log rings are replayed into the in-place metadata
//!    ([`MetadataPolicy::MetadataLog`]).
//! 4. [`run_engine_hook`]: a transaction engine's own recovery redoes or reverses its
//!    marks (see [`tx`](super::tx)).
//! 5. The scan: every table entry and live segment's metadata, read and checked (see
//!    [`Reader::scan_all`]).
//! 6. [`check_digest`]: a cleanly closed heap's metadata must match the digest its
//!    close wrote.
//! 7. [`rebuild_regions`] and [`rebuild_arenas`]: the DRAM state, from what the scan
//!    found.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::reader::{Content, Reader, RecordLog, Scan, SegmentScan};
use super::state::{Arena, Regions, USE_BIG, USE_HUGE, USE_HUGE_TAIL, USE_SMALL};
use super::steps::{Step, checkpoint_ring, retire};
use super::tx::{EngineReplay, Replay};
use super::{HeapOptions, HeapRecovery, PersistentHeap};
use crate::alloc::files::{self, FileStore, FileTable, NO_FILE};
use crate::alloc::layout::{
    DIGEST_WORD, GRANULE, LINE, MetadataPolicy, MicroLogSlot, SUPERBLOCK_BYTES, SegmentKind,
    Superblock, SuperblockError, TableEntry, decode_digest, encode_digest,
};
use crate::alloc::metadata_log::{self, DirtyLines, RingState};
use crate::alloc::small;
use crate::error::{Error, Result};
use crate::file::header::SUPERBLOCK;
use crate::file::{EngineKind, PoolFile};
use crate::media::{Media, MediaConfig, SimConfig};

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

    /// Starts a heap of engine `alloc` on `file` (see [`start_with`](Self::start_with)).
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

    /// Starts a heap of `engine` on `file`: checks and recovers it in phases (see the
    /// module docs), running `replay`, an engine's recovery, after the heap's own logs
    /// are redone.
    fn start_with(
        mut file: PoolFile,
        engine: EngineKind,
        replay: Option<EngineReplay<'_>>,
    ) -> Result<PersistentHeap> {
        let started = Instant::now();
        let path = file.path().to_path_buf();
        let sb = check_superblock(&file, engine, &path)?;
        let root = file.layout().root.clone();
        let was_clean = file.was_clean();
        let (store, mut files, region_file) = open_files(&mut file, &sb, &path, was_clean)?;
        let media = file.media().clone();
        let reader = Reader {
            media: &media,
            sb: &sb,
            path: &path,
            root: root.clone(),
            region_file: &region_file,
        };
        let mut redone = redo_micro_log(&reader, &mut file, &mut files, &store, was_clean)?;
        let (ring_bases, replayed, ring_redone) = replay_rings(&reader, was_clean)?;
        redone += ring_redone;
        if let Some(replay) = replay {
            run_engine_hook(&reader, replay)?;
        }
        let (entries, scan) = reader.scan_all()?;
        if was_clean {
            check_digest(&reader, &scan)?;
            file.mark_open();
            // A removal that failed while the heap was open (see `remove_file`).
            files.finish_unfinished(&media, &sb, &store)?;
        }
        files.remove_empty_huge_files(&media, &sb, &store, &entries, &region_file, &path)?;
        let (free, generation) = rebuild_regions(&sb, &entries, &region_file);
        let (arenas, uses) = rebuild_arenas(&media, &sb, ring_bases, scan.segments);
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
            root,
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
}

/// Phase 1: checks that `file` (at `path`) is a heap of `engine` and reads its
/// superblock, checked.
fn check_superblock(file: &PoolFile, engine: EngineKind, path: &Path) -> Result<Superblock> {
    if file.header().engine != engine {
        return Err(Error::WrongEngine {
            path: path.to_path_buf(),
            found: file.header().engine,
            expected: engine,
        });
    }
    let mut raw = [0u8; SUPERBLOCK_BYTES];
    file.media().read(SUPERBLOCK.start as usize, &mut raw);
    Superblock::decode(&raw, file.layout().data.clone()).map_err(|e| match e {
        SuperblockError::Checksum { stored, computed } => Error::Checksum {
            path: path.to_path_buf(),
            what: "heap superblock",
            offset: SUPERBLOCK.start,
            stored,
            computed,
        },
        SuperblockError::Invalid(reason) => Error::MetadataCorrupt {
            path: path.to_path_buf(),
            offset: SUPERBLOCK.start,
            reason,
        },
    })
}

/// Phase 1, continued: grows `file`'s media over the span of a growable heap and opens
/// the extension files its file table names (storing nothing): their store, the table,
/// and the file holding each region.
fn open_files(
    file: &mut PoolFile,
    sb: &Superblock,
    path: &Path,
    was_clean: bool,
) -> Result<(FileStore, FileTable, Box<[AtomicU32]>)> {
    if sb.max_files > 0 {
        let span = if file.media().crash_simulator().is_some() {
            sim_len(sb)
        } else {
            sb.span()
        };
        file.extend_span(span)?;
    }
    let media = file.media();
    let store = FileStore::new(
        path,
        media,
        file.header().uuid,
        sb.span(),
        sb.max_files,
        true,
    );
    let mut files = FileTable::open(media, sb, &store, path, was_clean)?;
    let region_file = std::mem::take(&mut files.region_file);
    Ok((store, files, region_file))
}

/// Phase 2: redoes every arena's pending micro-log record (a standalone allocation or
/// free a crash left half done) and retires it; returns how many. Every record is
/// checked before the first store, which marks the pool open and finishes the file
/// creations and removals a crash left unfinished. A cleanly closed heap must have no
/// pending record.
fn redo_micro_log(
    reader: &Reader<'_>,
    file: &mut PoolFile,
    files: &mut FileTable,
    store: &FileStore,
    was_clean: bool,
) -> Result<u32> {
    let (media, sb) = (reader.media, reader.sb);
    let pending = reader.pending_slots();
    if was_clean {
        return match pending.first() {
            Some((a, _)) => Err(reader.corrupt(
                sb.slot_offset(*a),
                "a cleanly closed heap has an unfinished allocation".into(),
            )),
            None => Ok(0),
        };
    }
    // Check every pending record before the first store.
    let entries = reader.entries()?;
    let steps = pending
        .iter()
        .map(|(a, r)| reader.check_record(sb.slot_offset(*a), RecordLog::MicroLog, r, &entries))
        .collect::<Result<Vec<_>>>()?;
    file.mark_open();
    files.finish_unfinished(media, sb, store)?;
    let mut redone = 0;
    for ((a, r), step) in pending.iter().zip(steps) {
        redo(media, sb, r, step);
        retire(media, sb.slot_offset(*a));
        redone += 1;
    }
    Ok(redone)
}

/// Redoes a pending record: its metadata step and its pointer store, durably.
fn redo(media: &Media, sb: &Superblock, r: &MicroLogSlot, step: Step) {
    step.apply(media, sb, r.op, r.size);
    let dst = r.dst as usize;
    media.write_u64(dst, r.dst_value(sb));
    media.flush(dst, 8);
    media.fence();
}

/// Phase 3: replays every arena's metadata-log ring into the in-place metadata (see
/// [`metadata_log`]; nothing to do in place), after checking every record. Returns
/// each arena's next ring base, the records replayed and the pointer stores redone.
/// A cleanly closed heap must have no valid record.
fn replay_rings(reader: &Reader<'_>, was_clean: bool) -> Result<(Vec<u64>, u64, u32)> {
    let (media, sb) = (reader.media, reader.sb);
    if sb.policy != MetadataPolicy::MetadataLog {
        return Ok((vec![0; sb.arenas as usize], 0, 0));
    }
    let entries = reader.entries()?;
    let mut rings = Vec::with_capacity(sb.arenas as usize);
    for a in 0..sb.arenas {
        let ring = metadata_log::read(media, sb, a);
        let header = sb.ring_header(a);
        if ring.base == 0 || ring.base > u64::MAX / 2 {
            return Err(reader.corrupt(
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
            return Err(reader.corrupt(
                *at,
                "a cleanly closed heap has metadata-log records not checkpointed".into(),
            ));
        }
        let steps = ring
            .records
            .iter()
            .map(|(at, r)| reader.check_record(*at, RecordLog::MetadataLog, r, &entries))
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
            media.write_u64(dst as usize, last.dst_value(sb));
            lines.add(dst);
            redone += 1;
        }
        let steps = steps
            .iter()
            .zip(&ring.records)
            .map(|(&s, (_, r))| (s, r.op));
        checkpoint_ring(media, sb, a as u32, steps, lines, last.seq);
        replayed += ring.records.len() as u64;
        bases.push(last.seq + 1);
    }
    Ok((bases, replayed, redone))
}

/// Phase 4: runs an engine's recovery (see [`PersistentHeap::open_for_engine`]) over
/// the heap's metadata, before its DRAM state is built.
fn run_engine_hook(reader: &Reader<'_>, replay: EngineReplay<'_>) -> Result<()> {
    replay(&mut Replay {
        entries: reader.entries()?,
        reader,
        superseded: 0,
    })
}

/// Phase 6: checks a cleanly closed heap's metadata, as `scan` read it, against the
/// digest its close wrote.
fn check_digest(reader: &Reader<'_>, scan: &Scan) -> Result<()> {
    let word = reader
        .media
        .read_u64((SUPERBLOCK.start + DIGEST_WORD) as usize);
    let computed = scan.digest;
    match decode_digest(word) {
        Some(stored) if stored == computed => Ok(()),
        Some(stored) => Err(Error::Checksum {
            path: PathBuf::from(reader.path),
            what: "heap metadata (digest written at the last clean close)",
            offset: SUPERBLOCK.start + DIGEST_WORD,
            stored,
            computed,
        }),
        None => Err(reader.corrupt(
            SUPERBLOCK.start + DIGEST_WORD,
            format!("the clean-close digest word {word:#018x} is damaged"),
        )),
    }
}

/// Phase 7: the free regions and every region's generation, from the segment table
/// (`entries`): a region is free when no live entry and no huge block's run covers it
/// and a file holds it.
fn rebuild_regions(
    sb: &Superblock,
    entries: &[Option<TableEntry>],
    region_file: &[AtomicU32],
) -> (BTreeSet<u32>, Vec<u64>) {
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
    (free, generation)
}

/// Phase 7: every arena's DRAM state and every region's use, from the arenas'
/// micro-log sequence numbers, their rings' next bases (`ring_bases`) and the
/// `segments` scanned.
fn rebuild_arenas(
    media: &Media,
    sb: &Superblock,
    ring_bases: Vec<u64>,
    segments: Vec<SegmentScan>,
) -> (Vec<Arena>, Box<[AtomicU32]>) {
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
    for s in segments {
        let arena = &mut arenas[s.owner as usize];
        match s.content {
            Content::Small(headers) => {
                let base = sb.region_offset(u64::from(s.region));
                let g = small::Geometry::of(base, sb.segment_size);
                arena.small.add_segment(g, headers);
                arena.small_segments.insert(s.region);
                uses[s.region as usize].store(USE_SMALL | u32::from(s.owner), Ordering::Relaxed);
            }
            Content::Big { free, allocated } => {
                let granules = (sb.segment_size / GRANULE) as u32;
                arena.big.add_segment(s.region, granules, &free, &allocated);
                uses[s.region as usize].store(USE_BIG | u32::from(s.owner), Ordering::Relaxed);
            }
            Content::Huge { regions } => {
                uses[s.region as usize].store(USE_HUGE, Ordering::Relaxed);
                for t in 1..regions {
                    uses[s.region as usize + t as usize].store(USE_HUGE_TAIL, Ordering::Relaxed);
                }
            }
        }
    }
    (arenas, uses)
}

fn plan(options: &HeapOptions) -> Result<Superblock> {
    let header = crate::file::header::Header::new(
        EngineKind::Alloc,
        crate::file::header::Geometry {
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
pub(crate) fn sim_len(sb: &Superblock) -> u64 {
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
