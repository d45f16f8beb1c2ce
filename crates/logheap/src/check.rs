//! Checking a pool file without changing it (the library behind `logheap check`, in the
//! spirit of `pmempool check`).
//!
//! [`check`] opens the file read-only (sharing it with other readers; a process that has
//! the pool open for writing makes it fail with [`Error::Locked`]), validates the header,
//! and examines the log as recovery would: every chunk header, every block and its CRC,
//! the chains of chunks, which transactions are committed and what a crash left
//! unfinished, that allocation records agree (no overlap, no free of something not
//! allocated), and that the mapping the log implies is consistent. Unlike opening, it
//! does not stop at the first problem.
//!
//! A pool of an in-place engine or a persistent heap is checked by recovering a copy of
//! it in memory, as opening it would (the file is only read), then checking its live
//! allocations (see [`check`]).

use std::path::{Path, PathBuf};

pub use crate::engine::LogSummary;
use crate::engine::{AnyEngine, Damage, RecoveryReport};
use crate::error::{Error, Result};
use crate::file::EngineKind;
use crate::file::{Header, PoolFile, ReadOnlyPool};

/// What [`check`] found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    /// The file checked.
    pub path: PathBuf,
    /// The validated header (`None` when the header itself is damaged).
    pub header: Option<Header>,
    /// Whether the pool was closed cleanly (`None` when the header is damaged).
    pub clean: Option<bool>,
    /// What opening the pool would find: committed transactions, and the unfinished
    /// ones recovery would drop after a crash.
    pub recovery: Option<RecoveryReport>,
    /// Each log: its chunks, blocks and live bytes.
    pub logs: Vec<LogSummary>,
    /// Live allocations.
    pub allocations: u64,
    /// Bytes in live allocations.
    pub allocated_bytes: u64,
    /// Bytes of the log still mapped.
    pub live_log_bytes: u64,
    /// A pool of an in-place engine or a persistent heap: its recovered copy's
    /// structures (`None` for the log engine, whose are in `logs`, or when the copy
    /// could not be opened).
    pub structures: Option<Structures>,
    /// Every problem found; empty when the pool is sound.
    pub problems: Vec<Damage>,
}

/// The structures of a pool of an in-place engine or a persistent heap, as its
/// recovered copy has them (for `logheap check` and `inspect`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Structures {
    /// Bytes of the data area the allocator's segments in use take.
    pub pm_bytes_used: u64,
    /// Whether the pool keeps data checksums.
    pub data_checksums: bool,
    /// The engine's own figures: its per-thread log areas, and `oop`'s update slots
    /// or `hoop`'s mapped words (`None` for a persistent heap).
    pub engine: Option<crate::EngineStats>,
}

impl CheckReport {
    /// Whether no problem was found.
    pub fn is_sound(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the pool file at `path`, read-only.
///
/// Returns `Ok` with the problems found (a damaged header is one) or `Err` when the pool
/// cannot be checked at all: the file does not exist or cannot be read, another process
/// has it open, or it was written by a format or engine this build does not have.
pub fn check(path: impl AsRef<Path>) -> Result<CheckReport> {
    let path = path.as_ref();
    examine(path, PoolFile::open_read_only(path))
}

/// Checks a pool image held in memory (a copy of a pool file, or a crash image from the
/// simulator), as [`check`] checks a file.
pub fn check_image(image: Vec<u8>) -> Result<CheckReport> {
    examine(Path::new("<pool image>"), PoolFile::read_image(image))
}

fn examine(path: &Path, opened: Result<ReadOnlyPool>) -> Result<CheckReport> {
    let mut report = CheckReport {
        path: path.into(),
        header: None,
        clean: None,
        recovery: None,
        logs: Vec::new(),
        allocations: 0,
        allocated_bytes: 0,
        live_log_bytes: 0,
        structures: None,
        problems: Vec::new(),
    };
    let pool = match opened {
        Ok(pool) => pool,
        Err(
            e @ (Error::NotFound { .. }
            | Error::Locked { .. }
            | Error::Io { .. }
            | Error::Media { .. }
            | Error::UnsupportedVersion { .. }),
        ) => return Err(e),
        Err(damaged) => {
            report.problems.push(damage_of(&damaged));
            return Ok(report);
        }
    };
    if pool.header.engine != EngineKind::Log {
        return examine_by_recovering_a_copy(path, pool, report);
    }
    let found = AnyEngine::examine(pool.header.engine, &pool)?;
    report.header = Some(pool.header.clone());
    report.clean = Some(pool.state.clean);
    report.recovery = Some(found.report);
    report.logs = found.logs;
    report.allocations = found.allocations;
    report.allocated_bytes = found.allocated_bytes;
    report.live_log_bytes = found.live_log_bytes;
    report.problems = found.problems;
    Ok(report)
}

/// A problem that stopped an open (or the header's validation), as damage at the offset
/// the error names (0 when it names none).
fn damage_of(damaged: &Error) -> Damage {
    let offset = match damaged {
        Error::Checksum { offset, .. }
        | Error::Corrupt { offset, .. }
        | Error::MetadataCorrupt { offset, .. } => *offset,
        _ => 0,
    };
    Damage {
        offset,
        log: None,
        reason: damaged.to_string(),
    }
}

/// The most address space a heap may span for [`examine_by_recovering_a_copy`] to copy
/// it into memory.
const MAX_CHECKED_SPAN: usize = 4 << 30;

/// Checks a pool of an in-place engine (`redo`, `undo`, `oop`, `hoop`) or a persistent
/// heap (`alloc`): the engine opens a copy of the file in memory (the file is only read)
/// as it would open the pool, which validates everything it reads back (its engine area,
/// each log record and its CRC, the allocator's metadata) and replays or rolls back what
/// a crash left; then the live allocations are listed and checked for overlaps, and,
/// when the pool keeps data checksums, every line of user data against its checksum
/// (each damaged line is a problem). The open stops at the first damage to the
/// engine's structures it meets, so such damage is one problem.
///
/// A pool with extension files (`<pool>.d/`) is copied to a temporary directory with
/// its files instead, and the copy opened there (then removed). A heap spanning more
/// than 4 GiB without extension files cannot be checked ([`Error::CannotCheck`]).
fn examine_by_recovering_a_copy(
    path: &Path,
    pool: ReadOnlyPool,
    mut report: CheckReport,
) -> Result<CheckReport> {
    let kind = pool.header.engine;
    let has_extensions = !extension_files(path)?.is_empty();
    let cannot = |reason: &str| Error::CannotCheck {
        path: path.into(),
        reason: reason.into(),
    };
    report.header = Some(pool.header.clone());
    report.clean = Some(pool.state.clean);
    if has_extensions {
        drop(pool);
        let copy = CopyOnDisk::make(path)?;
        let opened = open_and_list(kind, OpenFrom::Path(&copy.pool));
        drop(copy);
        return finish(report, opened);
    }
    let mut image = pool.media.read_vec(0, pool.media.len());
    // A heap that may grow by extension files spans more address space than its first
    // file: the copy is given that span (empty: no extension file exists).
    let mut raw = [0u8; crate::alloc::layout::SUPERBLOCK_BYTES];
    let at = crate::file::header::SUPERBLOCK.start as usize;
    if let Some(bytes) = image.get(at..at + raw.len()) {
        raw.copy_from_slice(bytes);
        if let Ok(sb) =
            crate::alloc::layout::Superblock::decode(&raw, pool.header.layout.data.clone())
        {
            let span = crate::alloc::persistent_heap::sim_len(&sb);
            let span = usize::try_from(span).unwrap_or(usize::MAX);
            if span > MAX_CHECKED_SPAN {
                return Err(cannot(
                    "the heap spans more address space than a check copies",
                ));
            }
            image.resize(span.max(image.len()), 0);
        }
    }
    drop(pool);
    let opened = open_and_list(kind, OpenFrom::Image(image));
    finish(report, opened)
}

/// Where [`open_and_list`] opens a pool's copy.
enum OpenFrom<'a> {
    /// An image in memory (simulation media).
    Image(Vec<u8>),
    /// A copy on disk, with its extension files.
    Path(&'a Path),
}

/// What a recovered copy holds: its live allocations, each damaged line of user data
/// `(line, stored, computed)`, and its structures.
type Listed = (Vec<(u64, u64)>, Vec<(u64, u32, u32)>, Structures);

/// Opens a copy of a pool of engine `kind` as opening the pool would (recovering it)
/// and lists what it holds.
fn open_and_list(kind: EngineKind, from: OpenFrom<'_>) -> Result<Listed> {
    let sim = crate::media::SimConfig::default();
    if kind == EngineKind::Alloc {
        let heap = match from {
            OpenFrom::Image(image) => {
                crate::alloc::PersistentHeap::open_image(image, &Default::default(), sim)?
            }
            OpenFrom::Path(path) => crate::alloc::PersistentHeap::open(path)?,
        };
        let blocks = heap.blocks()?;
        let allocations = blocks.into_iter().map(|b| (b.addr.raw(), b.size)).collect();
        let structures = Structures {
            pm_bytes_used: heap.stats().pm_bytes_used,
            data_checksums: false,
            engine: None,
        };
        // A copy: whatever closing writes goes with it.
        let _ = heap.close();
        return Ok((allocations, Vec::new(), structures));
    }
    let config = crate::Config::default();
    let pool = match from {
        OpenFrom::Image(image) => crate::Pool::open_image(image, &config, sim)?,
        OpenFrom::Path(path) => crate::Pool::open_with(path, &config)?,
    };
    let stats = pool.stats();
    let structures = Structures {
        pm_bytes_used: stats.pm_bytes_used,
        data_checksums: stats.data_checksums,
        engine: Some(stats.engine_stats),
    };
    let listed = (pool.allocations(), pool.damaged_data(), structures);
    pool.abandon(); // nothing to write back: the copy goes
    Ok(listed)
}

/// Fills `report` from what a recovered copy held: each damaged line of user data and
/// each pair of overlapping allocations is a problem, as is damage that stopped the
/// copy's open.
fn finish(mut report: CheckReport, opened: Result<Listed>) -> Result<CheckReport> {
    let (mut allocations, damaged_lines, structures) = match opened {
        Ok(listed) => listed,
        Err(e @ (Error::Io { .. } | Error::Media { .. } | Error::NoSpace { .. })) => {
            return Err(e);
        }
        Err(damaged) => {
            report.problems.push(damage_of(&damaged));
            return Ok(report);
        }
    };
    report.structures = Some(structures);
    for (line, stored, computed) in damaged_lines {
        report.problems.push(Damage::at(
            line,
            format!(
                "user data does not match its data checksum (stored {stored:#010x}, computed {computed:#010x})"
            ),
        ));
    }
    allocations.sort_unstable();
    for pair in allocations.windows(2) {
        let ((a, a_len), (b, _)) = (pair[0], pair[1]);
        if a + a_len > b {
            report.problems.push(Damage::at(
                b,
                format!("the allocation at {b:#x} overlaps the one at {a:#x} ({a_len} bytes)"),
            ));
        }
    }
    report.allocations = allocations.len() as u64;
    report.allocated_bytes = allocations.iter().map(|&(_, len)| len).sum();
    Ok(report)
}

/// A copy of a pool file and its extension files in a directory of the system's
/// temporary directory, removed when dropped.
struct CopyOnDisk {
    dir: PathBuf,
    pool: PathBuf,
}

impl CopyOnDisk {
    fn make(path: &Path) -> Result<CopyOnDisk> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("logheap-check-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| Error::io(&dir, "create", e))?;
        let copy = CopyOnDisk {
            pool: dir.join("pool"),
            dir,
        };
        copy_pool(path, &copy.pool)?;
        Ok(copy)
    }
}

impl Drop for CopyOnDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What [`repair`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RepairReport {
    /// The check before the repair.
    pub before: CheckReport,
    /// Where the pool was copied before it was changed (with its extension files in
    /// `<backup>.d/`); `None` when it was sound and nothing was done.
    pub backup: Option<PathBuf>,
    /// What the repair dropped, one line each.
    pub dropped: Vec<String>,
    /// The check after the repair.
    pub after: CheckReport,
}

/// Makes the damaged pool at `path` sound again, dropping exactly what cannot be
/// trusted, after copying it to `backup` (refused when `backup` exists). A sound pool
/// is left as it is (and not copied).
///
/// - **Log engine:** the log is cut back to before its first damage: every transaction
///   from the first one that damage hides is dropped (a later one may have read what it
///   wrote, so only a prefix of the history can be trusted), the damaged and emptied
///   chunks go back to the free pool, and the pool is closed cleanly. The report says
///   from which version on, and how many transactions were dropped.
/// - **In-place engines:** each damaged structure that stops the pool from opening is
///   dropped (a log slot, a small-allocator chunk and its allocations, a stray
///   page-table word, an `oop` update slot, the data-checksum pages, which are then
///   built again; see `salvage_in_place`), and, with data checksums on, each 64-byte
///   line of user data whose bytes do not match their checksum is zeroed, with a new
///   checksum.
///
/// Damage this cannot drop (a pool header, a superblock, the heap's segment table or
/// metadata digest, a big block's head, a persistent heap's metadata; on the log
/// engine, damage in a pool whose cleaner has reclaimed chunks, whose older data may be
/// gone, or older than its allocation checkpoint) is [`Error::CannotRepair`], with the
/// pool unchanged (the backup is still written first). An in-place pool is repaired on
/// a copy in memory and written back once; a crash during that write can tear it, and
/// the backup is then the way back.
pub fn repair(path: impl AsRef<Path>, backup: impl AsRef<Path>) -> Result<RepairReport> {
    let (path, backup) = (path.as_ref(), backup.as_ref());
    let before = check(path)?;
    if before.is_sound() {
        return Ok(RepairReport {
            after: before.clone(),
            before,
            backup: None,
            dropped: Vec::new(),
        });
    }
    let cannot = |reason: String| Error::CannotRepair {
        path: path.into(),
        reason,
    };
    let Some(header) = before.header.clone() else {
        return Err(cannot(format!(
            "the pool header is damaged ({})",
            before.problems[0]
        )));
    };
    copy_pool(path, backup)?;
    let mut dropped = Vec::new();
    match header.engine {
        EngineKind::Log => {
            let mut config = crate::Config::default();
            config.salvage = true;
            let pool = crate::Pool::open_with(path, &config).map_err(|e| cannot(e.to_string()))?;
            if let Some(log) = pool.stats().log() {
                let r = &log.recovery;
                if let Some(cut) = r.salvaged_from {
                    dropped.push(format!(
                        "{} transaction(s) of version {cut} or newer: the pool is as it was before its first damage",
                        r.dropped_transactions
                    ));
                }
                if r.chunks_reclaimed > 0 {
                    dropped.push(format!(
                        "{} chunk(s) of the log, damaged or holding only what was dropped, returned to the free pool",
                        r.chunks_reclaimed
                    ));
                }
            }
            pool.close()?;
        }
        EngineKind::Alloc => {
            return Err(cannot(format!(
                "a persistent heap's metadata is damaged ({}); repair does not rebuild it",
                before.problems[0]
            )));
        }
        _ => {
            salvage_in_place(path, &header, &mut dropped)?;
        }
    }
    let after = check(path)?;
    Ok(RepairReport {
        before,
        backup: Some(backup.into()),
        dropped,
        after,
    })
}

/// Repairs the in-place pool at `path` (one file) on a copy in memory, then writes the
/// copy back once, closed cleanly: nothing is written to the file unless the whole
/// repair succeeds (a crash during that one write can tear it: the backup is the way
/// back). Each damage that stops the copy from opening is dropped and the open tried
/// again:
/// - a log slot of the engine area that holds no log area (the slot is cleared: that
///   thread's records are lost; an area it named, if any, stays allocated);
/// - a small-allocator chunk whose header is damaged (the chunk is freed: the
///   allocations in it are lost; reading them is then an error);
/// - a stray word of a big segment's page table inside a block (it is cleared);
/// - an `oop` update slot whose words fail their checks (the slot is freed: the word's
///   home copy is current again);
/// - damaged data-checksum pages or directory (dropped: the old blocks stay allocated).
///
/// Then, with data checksums, each damaged line of user data is zeroed (against the
/// checksums the pool has), and the checksums are built again from the data when their
/// own blocks were dropped or may have been freed with a chunk. Other damage (a heap
/// superblock, the segment table, a micro-log slot, a big block's head, an `oop` slot
/// chunk's header, a metadata digest that no longer matches) is
/// [`Error::CannotRepair`], the file unchanged.
fn salvage_in_place(path: &Path, header: &Header, dropped: &mut Vec<String>) -> Result<()> {
    use crate::engine::inplace::data_checksums::{DIRECTORY_AT, STATE_AT};
    let cannot = |reason: String| Error::CannotRepair {
        path: path.into(),
        reason,
    };
    let original = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
    let mut image = original.clone();
    let base = header.layout.root.start;
    let zero = |image: &mut Vec<u8>, at: u64, len: u64| {
        if let Some(bytes) = image.get_mut(at as usize..(at + len) as usize) {
            bytes.fill(0);
        }
    };
    // Drops the data checksums: the state word and the link to the directory.
    let drop_checksums = |image: &mut Vec<u8>| {
        zero(image, base + STATE_AT, 8);
        zero(image, base + DIRECTORY_AT, 8);
    };
    let sim = crate::media::SimConfig::default;
    let plain = crate::Config::default();
    let (mut rebuild, mut dropped_checksums) = (false, false);
    let mut opened = None;
    for _ in 0..256 {
        let (offset, reason) = match crate::Pool::open_image(image.clone(), &plain, sim()) {
            Ok(pool) => {
                opened = Some(pool);
                break;
            }
            Err(Error::MetadataCorrupt { offset, reason, .. }) => (offset, reason),
            Err(e) => return Err(cannot(e.to_string())),
        };
        if reason.starts_with("log slot ") {
            zero(&mut image, offset, 8);
            dropped.push(format!(
                "the engine's log slot at offset {offset} ({reason}): that thread's log records"
            ));
        } else if reason.starts_with("chunk header:") {
            zero(&mut image, offset, crate::alloc::layout::CHUNK_HEADER);
            dropped.push(format!(
                "the allocations of the small-allocator chunk whose header at offset {offset} is damaged ({reason})"
            ));
            // It may have held data-checksum pages, now free: they are built again.
            rebuild = true;
        } else if reason.starts_with("a page-table word inside the block") {
            zero(&mut image, offset, 8);
            dropped.push(format!(
                "a stray page-table word at offset {offset} inside a big block"
            ));
        } else if reason.starts_with("an update slot") || reason.starts_with("the current copy") {
            let slot = offset - offset % 32;
            zero(&mut image, slot, 32);
            dropped.push(format!(
                "the update slot at offset {slot} ({reason}): its word's home copy is current again"
            ));
        } else if reason.contains("data-checksum") && !dropped_checksums {
            drop_checksums(&mut image);
            dropped_checksums = true;
            rebuild = true;
            dropped.push(format!(
                "the data checksums ({reason}), built again from the user data as it is"
            ));
        } else {
            return Err(cannot(format!(
                "offset {offset}: {reason} (repair does not rebuild this structure)"
            )));
        }
    }
    let Some(pool) = opened else {
        return Err(cannot("the damage does not stop".into()));
    };
    // Damaged lines of user data, against the checksums the pool has.
    let had_checksums = pool.stats().data_checksums;
    for line in pool.scrub_damaged_data() {
        dropped.push(format!(
            "the 64 bytes of user data at offset {line} (they did not match their data checksum), now zeros"
        ));
    }
    let media = pool.media().clone();
    pool.close().map_err(|e| cannot(e.to_string()))?;
    image = persisted(&media)?;
    if rebuild && (had_checksums || dropped_checksums) {
        if had_checksums {
            drop_checksums(&mut image);
            dropped.push(
                "the data-checksum pages (a dropped chunk may have held some), built again".into(),
            );
        }
        let pool = crate::Pool::open_image(image, &plain.data_checksums(true), sim())
            .map_err(|e| cannot(e.to_string()))?;
        let media = pool.media().clone();
        pool.close().map_err(|e| cannot(e.to_string()))?;
        image = persisted(&media)?;
    }
    image.resize(original.len(), 0);
    if image == original {
        return Ok(());
    }
    // Written back through the pool file's media, as every store to a pool is.
    let file = PoolFile::open(path, &crate::media::MediaConfig::default())?;
    let media = file.media();
    let len = media.len().min(image.len());
    media.write(0, &image[..len]);
    media.persist(0, len);
    Ok(())
}

/// What the simulation media `media` holds durably (a copy closed cleanly).
fn persisted(media: &crate::media::MediaView) -> Result<Vec<u8>> {
    media
        .crash_simulator()
        .map(|sim| sim.persisted_image())
        .ok_or_else(|| Error::InvalidConfig("a repair copy is not on simulation media".into()))
}

/// Copies the pool file at `path` to `to` (refused when it exists), with its extension
/// files into `<to>.d/`, durably.
fn copy_pool(path: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        return Err(Error::AlreadyExists { path: to.into() });
    }
    let copy = |from: &Path, into: &Path| -> Result<()> {
        std::fs::copy(from, into).map_err(|e| Error::io(into, "copy", e))?;
        std::fs::File::open(into)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io(into, "fsync", e))
    };
    copy(path, to)?;
    let files = extension_files(path)?;
    if !files.is_empty() {
        let into = extension_dir(to);
        std::fs::create_dir_all(&into).map_err(|e| Error::io(&into, "create", e))?;
        for file in files {
            if let Some(name) = file.file_name() {
                copy(&file, &into.join(name))?;
            }
        }
    }
    Ok(())
}

/// The directory of the extension files of the pool at `path` (`<pool>.d`).
fn extension_dir(path: &Path) -> PathBuf {
    let mut dir = path.as_os_str().to_owned();
    dir.push(".d");
    dir.into()
}

/// The extension files (`<pool>.d/*.lhf`) of the pool at `path`; none when it has no
/// such directory.
fn extension_files(path: &Path) -> Result<Vec<PathBuf>> {
    let dir = extension_dir(path);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let mut files = Vec::new();
    for entry in entries {
        let file = entry.map_err(|e| Error::io(&dir, "list", e))?.path();
        if file.extension().is_some_and(|x| x == "lhf") {
            files.push(file);
        }
    }
    Ok(files)
}
