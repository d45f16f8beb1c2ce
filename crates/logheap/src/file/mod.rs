//! Pool files: create, open, lock, header, layout and the clean-close state.
//!
//! A pool file starts with a header page ([`header`]), then a fixed root area, then the
//! data area the engine manages. Opening validates everything before mapping and returns
//! a distinct [`Error`] naming the file for each problem. A pool is locked (advisory
//! `flock`) while open, so a second process, or a second handle, is refused.
//!
//! A [`PoolFile`] can also live on the crash-simulation media
//! ([`PoolFile::create_sim`], [`PoolFile::open_image`]), which is how engines are tested
//! against every crash image.

pub(crate) mod header;
mod kind;

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use header::{FORMAT_VERSION, HEADER_SIZE, Header, MAGIC, PoolLayout, PoolState, STATE_OFFSET};
pub use kind::EngineKind;

use crate::error::{Error, Result};
use crate::media::{Media, MediaConfig, SimConfig};
use header::Geometry;

/// How to create a pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolOptions {
    /// Total size of the pool file in bytes.
    pub size: u64,
    /// The engine that will own the pool.
    pub engine: EngineKind,
    /// Size of the fixed root area (a multiple of 64).
    pub root_size: u64,
    /// Size of the engine's allocation chunks (a power of two, 4 KiB to 64 MiB).
    pub chunk_size: u64,
    /// How the pool's media persists.
    pub media: MediaConfig,
    /// Claim the file's whole size from the file system at creation (`fallocate`), so a
    /// full file system is an error at creation, never a `SIGBUS` later (default). When
    /// false the file is sparse and space is taken as the pool is written; it may then
    /// be larger than the free space, and a file system that fills up ends the process
    /// with `SIGBUS` at the store that finds no room.
    pub reserve_space: bool,
    /// Where the pool is mapped in each process that opens it.
    pub map_address: MapAddress,
}

/// Where a pool is mapped in the address space of each process that opens it.
///
/// A relocatable pool (the default) holds offsets, resolved against wherever the pool
/// is mapped (004's "lazy swizzling"). A pool with a fixed address is mapped at the same
/// address at every open (004's "constant virtual address"), so persistent data may hold
/// native pointers; opening fails with [`MediaError::AddressTaken`](crate::media::MediaError::AddressTaken)
/// (inside [`Error::Media`]) when something else is mapped there. Pools on simulation
/// media live in process memory and ignore the fixed address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MapAddress {
    /// Wherever the kernel picks.
    #[default]
    Anywhere,
    /// At an address picked at creation from the pool's UUID, in a range of the address
    /// space ordinary mappings do not use (32 TiB to 96 TiB), and recorded in the header.
    Fixed,
    /// At this address (page aligned, below 128 TiB), recorded in the header.
    At(u64),
}

/// Where [`MapAddress::Fixed`] picks addresses: a range far below the kernel's mmap area
/// (just under the stack, near 128 TiB), far above the program and its heap, and above
/// AddressSanitizer's shadow (which ends just past 16 TiB).
const FIXED_RANGE: std::ops::Range<u64> = (32 << 40)..(96 << 40);

impl MapAddress {
    /// The address to record for a pool of `size` bytes with `uuid` (0: anywhere).
    fn resolve(self, size: u64, uuid: &uuid::Uuid) -> u64 {
        match self {
            MapAddress::Anywhere => 0,
            MapAddress::At(addr) => addr,
            MapAddress::Fixed => {
                // Slots of the pool's size rounded up to a power of two (at least
                // 2 MiB), aligned to it: a million slots for pools of 64 MiB, so pools
                // with different UUIDs rarely share one, and pools of one size never
                // overlap in part.
                let slot = size.max(2 << 20).next_power_of_two();
                let slots = ((FIXED_RANGE.end - FIXED_RANGE.start) / slot).max(1);
                let (hi, lo) = uuid.as_u64_pair();
                FIXED_RANGE.start + ((hi ^ lo) % slots) * slot
            }
        }
    }
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            size: 64 << 20,
            engine: EngineKind::Log,
            root_size: 4096,
            chunk_size: 32 << 10,
            media: MediaConfig::default(),
            reserve_space: true,
            map_address: MapAddress::Anywhere,
        }
    }
}

/// An open pool file: its validated header and its media.
///
/// Opening validates and maps a pool but leaves its state word as it was found; the
/// owner calls [`mark_open`](PoolFile::mark_open) before its first store, so a pool that
/// is refused after opening (a damaged log, say) stays exactly as it was. Dropping a
/// marked pool without [`close`](PoolFile::close) leaves it marked as not cleanly closed,
/// exactly as a crash would; the next open reports it.
#[derive(Debug)]
pub struct PoolFile {
    path: PathBuf,
    /// Held for the advisory lock; `None` on simulation media.
    _file: Option<File>,
    media: Arc<Media>,
    header: Header,
    was_clean: bool,
}

/// The name used in errors for pools that live in memory.
const MEMORY_POOL: &str = "<simulated pool>";

impl PoolFile {
    /// Creates a new pool file at `path`. The file appears under its name only once its
    /// header is durable, so a crash during creation never leaves a half-made pool there.
    /// The new pool is open (not marked clean) until [`close`](PoolFile::close).
    pub fn create(path: impl AsRef<Path>, options: &PoolOptions) -> Result<PoolFile> {
        PoolFile::create_with(path, options, |_, _| {})
    }

    /// Like [`create`](PoolFile::create), with `format` run on the new pool's media after
    /// the header is written and before the file appears under its name (an engine
    /// formats its superblock there).
    pub fn create_with(
        path: impl AsRef<Path>,
        options: &PoolOptions,
        format: impl FnOnce(&Media, &Header),
    ) -> Result<PoolFile> {
        PoolFile::create_spanning(path, options, options.size, format)
    }

    /// Like [`create_with`](PoolFile::create_with), for a pool whose files will span
    /// `span` bytes of address space (see [`extend_span`](PoolFile::extend_span)): a
    /// fixed mapping address is picked with room for all of them.
    pub(crate) fn create_spanning(
        path: impl AsRef<Path>,
        options: &PoolOptions,
        span: u64,
        format: impl FnOnce(&Media, &Header),
    ) -> Result<PoolFile> {
        let path = path.as_ref();
        let header = new_header(options, span)?;
        if path.exists() {
            return Err(Error::AlreadyExists { path: path.into() });
        }
        // Errors name the path the user gave, never the temporary name.
        let io = |op: &'static str| move |e: std::io::Error| Error::io(path, op, e);
        let tmp = creating_path(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io("create"))?;
        let made = (|| {
            lock(&file, path)?;
            claim_space(&file, path, header.pool_size, options.reserve_space)?;
            let media = map(&file, &header, &options.media, path)?;
            write_header(&media, &header);
            format(&media, &header);
            file.sync_all().map_err(io("fsync"))?;
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(Error::AlreadyExists { path: path.into() });
                }
                Err(e) => return Err(Error::io(path, "link", e)),
            }
            sync_parent(path);
            Ok(media)
        })();
        let _ = std::fs::remove_file(&tmp);
        let media = made?;
        Ok(PoolFile {
            path: path.into(),
            _file: Some(file),
            media: Arc::new(media),
            header,
            was_clean: true,
        })
    }

    /// Opens the pool at `path`, checking every part of its header before mapping it.
    pub fn open(path: impl AsRef<Path>, media: &MediaConfig) -> Result<PoolFile> {
        let path = path.as_ref();
        let file = open_existing(path, true)?;
        lock(&file, path)?;
        let (header, state) = read_header(&file, path)?;
        let media = map(&file, &header, media, path)?;
        Ok(PoolFile {
            path: path.into(),
            _file: Some(file),
            media: Arc::new(media),
            header,
            was_clean: state.clean,
        })
    }

    /// Opens the pool at `path` for reading only, sharing it with other readers (a
    /// process that has it open for writing makes this fail with [`Error::Locked`]):
    /// for checking tools. Nothing is ever written through the returned media.
    pub(crate) fn open_read_only(path: &Path) -> Result<ReadOnlyPool> {
        let file = open_existing(path, false)?;
        match file.try_lock_shared() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(Error::Locked { path: path.into() }),
            Err(TryLockError::Error(e)) => return Err(Error::io(path, "lock", e)),
        }
        let (header, state) = read_header(&file, path)?;
        let media =
            Media::map_file_read_only(&file, header.pool_size as usize).map_err(|source| {
                Error::Media {
                    path: path.into(),
                    source,
                }
            })?;
        Ok(ReadOnlyPool {
            _file: Some(file),
            header,
            state,
            media,
        })
    }

    /// Removes the pool at `path` with its extension files (`<pool>.d/*.lhf`, a
    /// multi-file heap's): a file that is no pool (its header does not validate) and a
    /// pool open in any process (its lock is held) are refused and left as they are.
    /// The `<pool>.d/` directory goes too when nothing else is left in it.
    pub fn remove(path: impl AsRef<Path>) -> Result<Removal> {
        let path = path.as_ref();
        let file = open_existing(path, true)?;
        read_header(&file, path)?;
        // Held until the file is gone: no process opens it meanwhile.
        lock(&file, path)?;
        let mut removal = Removal {
            bytes: file
                .metadata()
                .map_err(|e| Error::io(path, "stat", e))?
                .len(),
            ..Removal::default()
        };
        let mut dir = path.as_os_str().to_owned();
        dir.push(".d");
        let dir = std::path::PathBuf::from(dir);
        if dir.is_dir() {
            let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, "list", e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(&dir, "list", e))?;
                let name = entry.path();
                if name.extension().is_some_and(|x| x == "lhf") {
                    let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                    std::fs::remove_file(&name).map_err(|e| Error::io(&name, "remove", e))?;
                    removal.extension_files += 1;
                    removal.bytes += len;
                } else {
                    removal.left_in_directory += 1;
                }
            }
            if removal.left_in_directory == 0 {
                std::fs::remove_dir(&dir).map_err(|e| Error::io(&dir, "remove", e))?;
            }
        }
        std::fs::remove_file(path).map_err(|e| Error::io(path, "remove", e))?;
        sync_parent(path);
        Ok(removal)
    }

    /// Reads and validates the header of the pool at `path` without opening the pool
    /// (no lock taken, nothing written): for inspection tools.
    pub fn inspect(path: impl AsRef<Path>) -> Result<(Header, PoolState)> {
        let path = path.as_ref();
        let file = open_existing(path, false)?;
        read_header(&file, path)
    }

    /// Creates a pool in memory on the crash-simulation media.
    pub fn create_sim(options: &PoolOptions, sim: SimConfig) -> Result<PoolFile> {
        PoolFile::create_sim_spanning(options, options.size, sim)
    }

    /// Like [`create_sim`](PoolFile::create_sim), on `len` bytes of simulation media (at
    /// least the pool's size): room for the other files of a pool of several files,
    /// which live in the same simulated memory.
    pub(crate) fn create_sim_spanning(
        options: &PoolOptions,
        len: u64,
        sim: SimConfig,
    ) -> Result<PoolFile> {
        let header = new_header(options, len)?;
        let media = Media::sim(len.max(header.pool_size) as usize, &options.media, sim).map_err(
            |source| Error::Media {
                path: MEMORY_POOL.into(),
                source,
            },
        )?;
        write_header(&media, &header);
        Ok(PoolFile {
            path: MEMORY_POOL.into(),
            _file: None,
            media: Arc::new(media),
            header,
            was_clean: true,
        })
    }

    /// Opens a pool image (for example a crash image) on fresh crash-simulation media,
    /// with the same checks as [`open`](PoolFile::open).
    pub fn open_image(image: Vec<u8>, media: &MediaConfig, sim: SimConfig) -> Result<PoolFile> {
        let path = Path::new(MEMORY_POOL);
        let (header, state) = decode_header(&image, image.len() as u64, path)?;
        let media = Media::sim_from_image(image, media, sim).map_err(|source| Error::Media {
            path: path.into(),
            source,
        })?;
        Ok(PoolFile {
            path: path.into(),
            _file: None,
            media: Arc::new(media),
            header,
            was_clean: state.clean,
        })
    }

    /// Reads a pool image (for example a crash image) for checking tools, as
    /// [`open_image`](PoolFile::open_image) would, without the simulator's bookkeeping.
    pub(crate) fn read_image(image: Vec<u8>) -> Result<ReadOnlyPool> {
        let path = Path::new(MEMORY_POOL);
        let (header, state) = decode_header(&image, image.len() as u64, path)?;
        let media = Media::sim_from_image(image, &MediaConfig::default(), SimConfig::default())
            .map_err(|source| Error::Media {
                path: path.into(),
                source,
            })?;
        Ok(ReadOnlyPool {
            _file: None,
            header,
            state,
            media,
        })
    }

    /// Marks the pool open (not cleanly closed), durably: call it before the first store
    /// to the pool. Until then a crash or a drop leaves the pool as it was found.
    pub fn mark_open(&self) {
        let open = PoolState { clean: false }.encode();
        if self.media.read_u64(STATE_OFFSET as usize) != open {
            set_state(&self.media, PoolState { clean: false });
        }
    }

    /// Grows the pool's media to `span` bytes of address space, the pool file mapped
    /// over the first bytes and the rest reserved for other files the engine attaches
    /// (see [`Media::extend`]). Must be called before the media is shared.
    pub(crate) fn extend_span(&mut self, span: u64) -> Result<()> {
        let fixed = self.header.map_address != 0;
        let len = self.header.pool_size as usize;
        let path = self.path.clone();
        let media = Arc::get_mut(&mut self.media).ok_or_else(|| {
            Error::InvalidConfig("the pool's media is in use; its span cannot grow".into())
        })?;
        media
            .extend(self._file.as_ref(), len, span as usize, fixed)
            .map_err(|source| Error::Media { path, source })
    }

    /// The file's path (a placeholder name for simulated pools).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Where the superblock, root area and data area are.
    pub fn layout(&self) -> &PoolLayout {
        &self.header.layout
    }

    /// The media holding the pool.
    pub fn media(&self) -> &Arc<Media> {
        &self.media
    }

    /// Whether the pool was closed cleanly before this open (true for a new pool). When
    /// false, the engine must run recovery.
    pub fn was_clean(&self) -> bool {
        self.was_clean
    }

    /// Bytes the pool file occupies on its file system (`st_blocks × 512`: less than its
    /// size when it is sparse or has holes punched), or `None` for a pool in memory.
    pub fn disk_bytes(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let file = self._file.as_ref()?;
        file.metadata().ok().map(|m| m.blocks() * 512)
    }

    /// Marks the pool cleanly closed (durably) and releases it.
    pub fn close(self) -> Result<()> {
        set_state(&self.media, PoolState { clean: true });
        if self.media.msync_errors() > 0 {
            return Err(Error::io(
                &self.path,
                "msync",
                std::io::Error::other(format!("{} msync calls failed", self.media.msync_errors())),
            ));
        }
        Ok(())
    }
}

/// What [`PoolFile::remove`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Removal {
    /// Extension files removed from `<pool>.d/`.
    pub extension_files: u64,
    /// Bytes of the files removed (their lengths).
    pub bytes: u64,
    /// Files in `<pool>.d/` that are no extension files, left there (with the directory).
    pub left_in_directory: u64,
}

impl Drop for PoolFile {
    fn drop(&mut self) {
        // Release the lock explicitly: a process forked meanwhile (by another thread)
        // holds a copy of the descriptor until it execs, which would keep an implicit
        // lock alive and make an immediate reopen fail with `Locked`.
        if let Some(file) = &self._file {
            let _ = file.unlock();
        }
    }
}

/// A pool opened for reading only (see [`PoolFile::open_read_only`]).
#[derive(Debug)]
pub(crate) struct ReadOnlyPool {
    /// Held for the shared lock (`None` for an image in memory).
    _file: Option<File>,
    pub header: Header,
    pub state: PoolState,
    pub media: Media,
}

/// Gives the file the pool's size: claims the space (`fallocate`) when `reserve`, else
/// makes a sparse file.
fn claim_space(file: &File, path: &Path, size: u64, reserve: bool) -> Result<()> {
    let available = || {
        rustix::fs::fstatvfs(file)
            .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
            .ok()
    };
    let no_space = |available: Option<u64>| Error::NoSpace {
        path: path.into(),
        needed: size,
        available: available.unwrap_or(0),
    };
    if reserve {
        match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, size) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::NOSPC | rustix::io::Errno::FBIG) => {
                return Err(no_space(available()));
            }
            // File systems without fallocate: check the free space as for a sparse file.
            Err(rustix::io::Errno::OPNOTSUPP) => {}
            Err(e) => return Err(Error::io(path, "reserve space", e.into())),
        }
    }
    // A file system without fallocate still gets the check; a sparse pool was asked to
    // take space only as it is written, so it may be larger than what is free now.
    if reserve
        && let Some(free) = available()
        && free < size
    {
        return Err(no_space(Some(free)));
    }
    file.set_len(size)
        .map_err(|e| Error::io(path, "set length", e))
}

/// The header of a new pool whose files span `span` bytes of address space.
fn new_header(options: &PoolOptions, span: u64) -> Result<Header> {
    let mut header = Header::new(
        options.engine,
        Geometry {
            pool_size: options.size,
            root_size: options.root_size,
            chunk_size: options.chunk_size,
        },
    )
    .map_err(Error::InvalidConfig)?;
    header.map_address = options
        .map_address
        .resolve(span.max(options.size), &header.uuid);
    if header.map_address != 0 {
        header.format_version = header::FIXED_FORMAT_VERSION;
    }
    header.check_geometry().map_err(Error::InvalidConfig)?;
    Ok(header)
}

/// Writes the header and an "open" state word, durably, through the media.
fn write_header(media: &Media, header: &Header) {
    media.write(0, &header.encode());
    media.write_u64(STATE_OFFSET as usize, PoolState { clean: false }.encode());
    media.persist(0, STATE_OFFSET as usize + 8);
}

fn set_state(media: &Media, state: PoolState) {
    media.write_u64(STATE_OFFSET as usize, state.encode());
    media.persist(STATE_OFFSET as usize, 8);
}

/// Opens the existing file at `path`, for writing too when `write` (a missing file is
/// [`Error::NotFound`]).
fn open_existing(path: &Path, write: bool) -> Result<File> {
    match OpenOptions::new().read(true).write(write).open(path) {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::NotFound { path: path.into() })
        }
        Err(e) => Err(Error::io(path, "open", e)),
    }
}

fn lock(file: &File, path: &Path) -> Result<()> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(Error::Locked { path: path.into() }),
        Err(TryLockError::Error(e)) => Err(Error::io(path, "lock", e)),
    }
}

fn map(file: &File, header: &Header, config: &MediaConfig, path: &Path) -> Result<Media> {
    let at = (header.map_address != 0).then_some(header.map_address as usize);
    Media::map_file_at(file, header.pool_size as usize, config, at).map_err(|source| Error::Media {
        path: path.into(),
        source,
    })
}

fn read_header(file: &File, path: &Path) -> Result<(Header, PoolState)> {
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    if len < HEADER_SIZE {
        return Err(Error::TooSmall {
            path: path.into(),
            len,
            min: HEADER_SIZE,
        });
    }
    let mut page = vec![0u8; HEADER_SIZE as usize];
    file.read_exact_at(&mut page, 0)
        .map_err(|e| Error::io(path, "read header", e))?;
    decode_header(&page, len, path)
}

/// Validates a header page of a file of `file_len` bytes.
fn decode_header(page: &[u8], file_len: u64, path: &Path) -> Result<(Header, PoolState)> {
    if file_len < HEADER_SIZE || (page.len() as u64) < HEADER_SIZE {
        return Err(Error::TooSmall {
            path: path.into(),
            len: file_len,
            min: HEADER_SIZE,
        });
    }
    let header = Header::decode(page, path)?;
    if file_len < header.pool_size {
        return Err(Error::Truncated {
            path: path.into(),
            expected: header.pool_size,
            actual: file_len,
        });
    }
    let at = STATE_OFFSET as usize;
    let mut word = [0u8; 8];
    word.copy_from_slice(&page[at..at + 8]);
    let state = PoolState::decode(u64::from_le_bytes(word), path)?;
    Ok((header, state))
}

fn creating_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pool".into());
    path.with_file_name(format!(".{name}.creating-{}", std::process::id()))
}

/// Makes the new directory entry durable (best effort: not every file system allows
/// opening a directory for fsync).
fn sync_parent(path: &Path) {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Ok(dir) = File::open(parent) {
        let _ = dir.sync_all();
    }
}
