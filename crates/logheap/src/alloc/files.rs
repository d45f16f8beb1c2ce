//! The extension files of a persistent heap of several files (002: "a pool made of
//! several files"; it grows by adding files and shrinks by removing empty ones, and each
//! huge block has a file of its own).
//!
//! Every file of a heap is mapped into one range of address space, as PMDK maps the parts
//! of a pool set: file 0 (the pool file) at its start, extension file `k + 1` over slot `k`
//! of the range after it. So one [`Media`] covers them all: offsets inside the heap stay
//! plain numbers, one fence covers stores to every file, and the crash simulator sees all
//! of them. What a slot holds is recorded in file 0's file table (see
//! [`FileEntry`](super::layout::FileEntry)); the heap creates and removes files through a
//! [`FileStore`]:
//!
//! - [`FileStore::Dir`]: files `<pool>.d/<id>.lhf` next to the pool file. Each starts with
//!   a header page naming the pool and its own id and length (never mapped: the data
//!   follow it), so a foreign or misplaced file is refused. A file appears under its name
//!   only once complete and durable, as the pool file does, and a removal is made durable
//!   with an `fsync` of the directory.
//! - [`FileStore::Sim`]: the files are ranges of the crash-simulation media itself, and a
//!   directory area after them holds one word per slot (the file's length, 0 for none),
//!   stored and fenced like any metadata. One simulator then sees every store to every
//!   file and every directory operation, as one persistence domain would, so the crash
//!   tests run the same protocol as files on disk.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::layout::{FILE_STATE, FileEntry, FileKind, FileState, LINE, Superblock, TableEntry};
use crate::error::{Error, Result};
use crate::media::Media;

/// Bytes of an extension file's header (64 KiB, so the data may be mapped on kernels
/// with pages of up to 64 KiB); its data (regions) follow. A [`PAddr`]
/// into an extension file counts from the file's start, so its data start here.
///
/// [`PAddr`]: super::PAddr
pub(crate) const FILE_DATA: u64 = 64 << 10;
const FILE_MAGIC: [u8; 8] = *b"LHEXTEN1";
/// Bytes of the header covered by its CRC.
const HEADER_COVERED: usize = 48;

/// Where a heap's extension files live.
#[derive(Debug)]
pub(crate) enum FileStore {
    /// In the directory `<pool>.d`.
    Dir(DirStore),
    /// In the simulation media, after the span.
    Sim(SimStore),
}

/// Extension files in a directory (see the module docs).
#[derive(Debug)]
pub(crate) struct DirStore {
    dir: PathBuf,
    media: Arc<Media>,
    pool: uuid::Uuid,
    reserve_space: bool,
}

/// Extension files as ranges of the simulation media (see the module docs).
#[derive(Debug)]
pub(crate) struct SimStore {
    media: Arc<Media>,
    /// Where the directory words start in the media.
    directory: u64,
    slots: u64,
}

/// Bytes the simulation media needs after the span for the directory of `slots` slots.
pub(crate) fn sim_directory_bytes(slots: u64) -> u64 {
    (slots * 8).next_multiple_of(64)
}

impl FileStore {
    /// The store of the heap in `pool_path` whose media is `media`: the simulation media's
    /// own directory after `span`, or the directory `<pool>.d`.
    pub(crate) fn new(
        pool_path: &Path,
        media: &Arc<Media>,
        pool: uuid::Uuid,
        span: u64,
        slots: u64,
        reserve_space: bool,
    ) -> FileStore {
        if media.crash_simulator().is_some() {
            FileStore::Sim(SimStore {
                media: media.clone(),
                directory: span,
                slots,
            })
        } else {
            let mut dir = pool_path.as_os_str().to_owned();
            dir.push(".d");
            FileStore::Dir(DirStore {
                dir: dir.into(),
                media: media.clone(),
                pool,
                reserve_space,
            })
        }
    }

    /// Where the files are (for error messages).
    pub(crate) fn location(&self) -> PathBuf {
        match self {
            FileStore::Dir(d) => d.dir.clone(),
            FileStore::Sim(_) => PathBuf::from("<simulated files>"),
        }
    }

    /// Where file `id` is (for error messages).
    pub(crate) fn path(&self, id: u64) -> PathBuf {
        match self {
            FileStore::Dir(d) => d.file_path(id),
            FileStore::Sim(_) => PathBuf::from(format!("<simulated file {id}>")),
        }
    }

    /// Creates file `id` with `bytes` of zeroed data, durably, and attaches its data at
    /// `at` of the media. Fails with `AlreadyExists` when the file is there already.
    pub(crate) fn create(&self, id: u64, bytes: u64, at: u64) -> io::Result<()> {
        match self {
            FileStore::Dir(d) => d.create(id, bytes, at),
            FileStore::Sim(s) => s.create(id, bytes, at),
        }
    }

    /// Attaches the data of existing file `id` at `at`, after checking it is this heap's
    /// file `id` of `bytes` data bytes; why not, if it is not.
    pub(crate) fn open(&self, id: u64, bytes: u64, at: u64) -> Result<(), String> {
        match self {
            FileStore::Dir(d) => d.open(id, bytes, at),
            FileStore::Sim(s) => s.open(id, bytes),
        }
    }

    /// Detaches file `id` (of `bytes` data bytes at `at`) and removes it, durably (no
    /// error when it is not there).
    pub(crate) fn remove(&self, id: u64, bytes: u64, at: u64) -> io::Result<()> {
        match self {
            FileStore::Dir(d) => d.remove(id, bytes, at),
            FileStore::Sim(s) => s.remove(id),
        }
    }

    /// The ids of the files in the store.
    pub(crate) fn list(&self) -> io::Result<Vec<u64>> {
        match self {
            FileStore::Dir(d) => d.list(),
            FileStore::Sim(s) => Ok(s.list()),
        }
    }

    /// Bytes the files occupy on their file system (0 in memory).
    pub(crate) fn disk_bytes(&self) -> u64 {
        match self {
            FileStore::Dir(d) => d.disk_bytes(),
            FileStore::Sim(_) => 0,
        }
    }
}

impl DirStore {
    fn file_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id:08}.lhf"))
    }

    fn header(&self, id: u64, bytes: u64) -> Vec<u8> {
        let mut b = vec![0u8; FILE_DATA as usize];
        b[0..8].copy_from_slice(&FILE_MAGIC);
        b[8..24].copy_from_slice(self.pool.as_bytes());
        b[24..32].copy_from_slice(&id.to_le_bytes());
        b[32..40].copy_from_slice(&bytes.to_le_bytes());
        let crc = crc32c::crc32c(&b[..HEADER_COVERED]);
        b[HEADER_COVERED..HEADER_COVERED + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn create(&self, id: u64, bytes: u64, at: u64) -> io::Result<()> {
        if !self.dir.exists() {
            std::fs::create_dir(&self.dir)?;
            let parent = match self.dir.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            sync_dir(parent);
        }
        let path = self.file_path(id);
        if path.exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not in the file table", path.display()),
            ));
        }
        // Made under a temporary name, then linked: the file never appears half made.
        let tmp = self
            .dir
            .join(format!(".{id:08}.lhf.creating-{}", std::process::id()));
        let made = (|| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            let len = FILE_DATA + bytes;
            let claimed = if self.reserve_space {
                rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, len)
            } else {
                Err(rustix::io::Errno::OPNOTSUPP)
            };
            match claimed {
                Ok(()) => {}
                // Sparse, or a file system without fallocate.
                Err(rustix::io::Errno::OPNOTSUPP) => file.set_len(len)?,
                Err(e) => return Err(e.into()),
            }
            file.write_all_at(&self.header(id, bytes), 0)?;
            file.sync_all()?;
            std::fs::hard_link(&tmp, &path)?;
            sync_dir(&self.dir);
            Ok::<File, io::Error>(file)
        })();
        let _ = std::fs::remove_file(&tmp);
        let file = made?;
        // SAFETY: the range is a free slot of the span, which nothing touches until the
        // heap records the file as live.
        let attached = unsafe {
            self.media
                .attach(at as usize, &file, FILE_DATA, bytes as usize)
        };
        if attached.is_err() {
            // Not left behind as an orphan: the heap clears the entry.
            let _ = std::fs::remove_file(&path);
            sync_dir(&self.dir);
        }
        attached
    }

    fn open(&self, id: u64, bytes: u64, at: u64) -> Result<(), String> {
        let path = self.file_path(id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open it: {e}"))?;
        let len = file
            .metadata()
            .map_err(|e| format!("cannot stat it: {e}"))?
            .len();
        if len < FILE_DATA + bytes {
            return Err(format!(
                "it holds {len} bytes, fewer than its {} (truncated)",
                FILE_DATA + bytes
            ));
        }
        let mut page = vec![0u8; FILE_DATA as usize];
        file.read_exact_at(&mut page, 0)
            .map_err(|e| format!("cannot read its header: {e}"))?;
        if page != self.header(id, bytes) {
            return Err(format!(
                "its header is not that of file {id} of {bytes} data bytes of this pool (a foreign or damaged file)"
            ));
        }
        // SAFETY: the range is the slot of a file the heap has not attached yet (it is
        // opening), so nothing touches it.
        unsafe {
            self.media
                .attach(at as usize, &file, FILE_DATA, bytes as usize)
        }
        .map_err(|e| format!("cannot map it: {e}"))
    }

    fn remove(&self, id: u64, bytes: u64, at: u64) -> io::Result<()> {
        if bytes > 0 {
            // SAFETY: the heap removes a file only once no block lives in it, and takes
            // its regions out of every free list first, so nothing touches the range.
            unsafe { self.media.detach(at as usize, bytes as usize) }?;
        }
        match std::fs::remove_file(self.file_path(id)) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.contains(".lhf.creating-") {
                // A creation a crash cut short (or the second link of one that was
                // linked): never named by the table, so it goes.
                let _ = std::fs::remove_file(self.dir.join(&*name));
                continue;
            }
            if let Some(id) = name
                .strip_suffix(".lhf")
                .filter(|n| n.len() == 8 && n.bytes().all(|c| c.is_ascii_digit()))
                .and_then(|n| n.parse().ok())
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    fn disk_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.list()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|id| std::fs::metadata(self.file_path(id)).ok())
            .map(|m| m.blocks() * 512)
            .sum()
    }
}

impl SimStore {
    fn word(&self, id: u64) -> usize {
        (self.directory + (id - 1) * 8) as usize
    }

    fn create(&self, id: u64, bytes: u64, at: u64) -> io::Result<()> {
        if self.media.read_u64(self.word(id)) != 0 {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("simulated file {id} exists and is not in the file table"),
            ));
        }
        // A new file reads as zeros (a hole is durable at once, as the file system's).
        self.media.discard(at as usize, bytes as usize)?;
        self.media.write_u64(self.word(id), bytes);
        self.media.persist(self.word(id), 8);
        Ok(())
    }

    fn open(&self, id: u64, bytes: u64) -> Result<(), String> {
        match self.media.read_u64(self.word(id)) {
            0 => Err("it does not exist".into()),
            b if b == bytes => Ok(()),
            b => Err(format!("it holds {b} bytes, not {bytes}")),
        }
    }

    fn remove(&self, id: u64) -> io::Result<()> {
        self.media.write_u64(self.word(id), 0);
        self.media.persist(self.word(id), 8);
        Ok(())
    }

    fn list(&self) -> Vec<u64> {
        (1..=self.slots)
            .filter(|&id| self.media.read_u64(self.word(id)) != 0)
            .collect()
    }
}

/// Makes a directory's entries durable (best effort: not every file system allows
/// opening a directory for fsync).
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// What an extension-file slot holds (the heap's DRAM view of its file table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Nothing: a file may be created here.
    Empty,
    /// A file the file table does not name (never used).
    Orphan,
    /// The first slot of a file of this kind over this many slots.
    File(FileKind, u64),
    /// A later slot of a huge block's file.
    Covered,
    /// A file whose removal failed: the next open finishes it.
    Removing,
}

/// `region_file` of a region no file holds.
pub(crate) const NO_FILE: u32 = u32::MAX;

/// Where extension slot `k`'s file starts in the span, and its id.
pub(crate) fn slot_place(sb: &Superblock, k: u64) -> (u64, u64) {
    (k + 1, sb.region_offset(sb.slot_region(k)))
}

/// Writes file-table entry `e` in state `state`, durably: its body, fence, then its
/// state word, fence (so a torn body is never taken for a file).
pub(crate) fn write_file_entry(media: &Media, sb: &Superblock, e: &FileEntry, state: FileState) {
    let at = sb.file_entry_offset(e.slot) as usize;
    media.write(at, &e.encode_body());
    media.flush(at, LINE as usize);
    media.fence();
    set_file_state(media, sb, e.slot, Some(state));
}

/// Stores the state word of file-table entry `k` (`None`: no file), durably.
pub(crate) fn set_file_state(media: &Media, sb: &Superblock, k: u64, state: Option<FileState>) {
    let at = (sb.file_entry_offset(k) + FILE_STATE) as usize;
    media.write_u64(at, state.map_or(0, FileState::word));
    media.persist(at, 8);
}

/// The file table as recovery reads it, and the DRAM state the heap keeps of it.
#[derive(Debug)]
pub(crate) struct FileTable {
    /// Per extension slot, what it holds.
    pub slots: Vec<Slot>,
    /// Per region, the file holding it (see `NO_FILE`); the heap takes it once the table
    /// is open.
    pub region_file: Box<[AtomicU32]>,
    /// Per slot, the data bytes of the file starting there (0: none).
    pub file_bytes: Box<[AtomicU64]>,
    /// Files a crash left being created or removed: their removal is finished once the
    /// heap may be written.
    unfinished: Vec<FileEntry>,
    /// Files opened.
    pub opened: u64,
    /// Files removed by recovery.
    pub removed: u64,
    /// Files in the store the table does not name.
    pub orphans: u64,
}

impl FileTable {
    /// Reads and checks the file table and opens every live file (attaching it to the
    /// media); stores nothing. A file a crash left half created or half removed is an
    /// error in a cleanly closed heap.
    pub(crate) fn open(
        media: &Media,
        sb: &Superblock,
        store: &FileStore,
        path: &Path,
        was_clean: bool,
    ) -> Result<FileTable> {
        let mut table = FileTable {
            slots: vec![Slot::Empty; sb.max_files as usize],
            region_file: (0..sb.region_count)
                .map(|r| AtomicU32::new(if r < sb.local_regions { 0 } else { NO_FILE }))
                .collect(),
            file_bytes: (0..sb.max_files).map(|_| AtomicU64::new(0)).collect(),
            unfinished: Vec::new(),
            opened: 0,
            removed: 0,
            orphans: 0,
        };
        let corrupt = |k: u64, reason: String| Error::MetadataCorrupt {
            path: path.to_path_buf(),
            offset: sb.file_entry_offset(k),
            reason: format!("file-table entry {k}: {reason}"),
        };
        let mut k = 0;
        while k < sb.max_files {
            let mut b = [0u8; LINE as usize];
            media.read(sb.file_entry_offset(k) as usize, &mut b);
            let Some((state, e)) = FileEntry::decode(&b, k, sb).map_err(|r| corrupt(k, r))? else {
                k += 1;
                continue;
            };
            if table.slots[k as usize] != Slot::Empty {
                return Err(corrupt(k, "a file inside another file's slots".into()));
            }
            table.slots[k as usize] = Slot::File(e.kind, e.slots);
            for c in k + 1..k + e.slots {
                table.slots[c as usize] = Slot::Covered;
            }
            match state {
                FileState::Live => {
                    let (id, at) = slot_place(sb, k);
                    let bytes = e.regions * sb.segment_size;
                    store
                        .open(id, bytes, at)
                        .map_err(|why| Error::MetadataCorrupt {
                            path: store.path(id),
                            offset: sb.file_entry_offset(k),
                            reason: format!(
                                "extension file {id}, live in the file table of {}: {why}",
                                path.display()
                            ),
                        })?;
                    table.attached(sb, &e);
                    table.opened += 1;
                }
                // A removal that failed while the heap was open is finished at the next
                // open, clean or not; a creation never outlives its call.
                FileState::Creating if was_clean => {
                    return Err(corrupt(
                        k,
                        "a cleanly closed heap has a file being created".into(),
                    ));
                }
                _ => table.unfinished.push(e),
            }
            k += 1;
        }
        let ids = store
            .list()
            .map_err(|e| Error::io(store.location(), "list", e))?;
        for id in ids {
            let named = id >= 1
                && id <= sb.max_files
                && table.slots[id as usize - 1] != Slot::Empty
                && table.slots[id as usize - 1] != Slot::Covered;
            if !named {
                table.orphans += 1;
                if (1..=sb.max_files).contains(&id) && table.slots[id as usize - 1] == Slot::Empty {
                    table.slots[id as usize - 1] = Slot::Orphan;
                }
            }
        }
        Ok(table)
    }

    /// Records that `e`'s file is attached: its regions and bytes.
    fn attached(&self, sb: &Superblock, e: &FileEntry) {
        let first = sb.slot_region(e.slot);
        for r in first..first + e.regions {
            self.region_file[r as usize].store(e.slot as u32 + 1, Ordering::Relaxed);
        }
        self.file_bytes[e.slot as usize].store(e.regions * sb.segment_size, Ordering::Relaxed);
    }

    /// Finishes removing the files a crash left being created or removed (none of
    /// their regions holds a block: a file is created before any of its regions is
    /// used, and removed after the last is freed).
    pub(crate) fn finish_unfinished(
        &mut self,
        media: &Media,
        sb: &Superblock,
        store: &FileStore,
    ) -> Result<()> {
        for e in std::mem::take(&mut self.unfinished) {
            let (id, at) = slot_place(sb, e.slot);
            // Never attached: nothing to unmap.
            store
                .remove(id, 0, at)
                .map_err(|err| Error::io(store.path(id), "remove", err))?;
            set_file_state(media, sb, e.slot, None);
            for c in e.slot..e.slot + e.slots {
                self.slots[c as usize] = Slot::Empty;
            }
            self.removed += 1;
        }
        Ok(())
    }

    /// Removes every live huge-block file whose block is not allocated (a crash came
    /// between creating the file and the allocation's commit, or between the free's
    /// commit and the removal; or the block was in the volatile heap).
    pub(crate) fn remove_empty_huge_files(
        &mut self,
        media: &Media,
        sb: &Superblock,
        store: &FileStore,
        entries: &[Option<TableEntry>],
        region_file: &[AtomicU32],
        path: &Path,
    ) -> Result<()> {
        for k in 0..sb.max_files {
            let Slot::File(FileKind::Huge, slots) = self.slots[k as usize] else {
                continue;
            };
            let head = sb.slot_region(k);
            let bytes = self.file_bytes[k as usize].load(Ordering::Relaxed);
            if bytes == 0 {
                continue;
            }
            // The file holds one huge block of its whole length, or nothing.
            let count = bytes / sb.segment_size;
            let holds_its_block = entries[head as usize]
                .is_some_and(|e| e.kind == super::layout::SegmentKind::Huge && e.size == bytes);
            let stray = (head..head + count)
                .find(|&r| entries[r as usize].is_some() && (r != head || !holds_its_block));
            if let Some(r) = stray {
                return Err(Error::MetadataCorrupt {
                    path: path.to_path_buf(),
                    offset: sb.entry_offset(r),
                    reason: format!(
                        "region {r} lies in the file of a huge block (extension file {}) but is not that block",
                        k + 1
                    ),
                });
            }
            if holds_its_block {
                continue;
            }
            let (id, at) = slot_place(sb, k);
            set_file_state(media, sb, k, Some(FileState::Removing));
            store
                .remove(id, bytes, at)
                .map_err(|err| Error::io(store.path(id), "remove", err))?;
            set_file_state(media, sb, k, None);
            for r in head..head + bytes / sb.segment_size {
                region_file[r as usize].store(NO_FILE, Ordering::Relaxed);
            }
            self.file_bytes[k as usize].store(0, Ordering::Relaxed);
            for c in k..k + slots {
                self.slots[c as usize] = Slot::Empty;
            }
            self.removed += 1;
        }
        Ok(())
    }
}
