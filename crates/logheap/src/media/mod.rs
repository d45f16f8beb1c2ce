//! Mapped bytes and persistence.
//!
//! [`Media`] is the only way layers above write persistent memory: stores, flushes,
//! fences and non-temporal copies all go through it, so the traffic counters, the NVM
//! emulation and the crash simulator see every one. Reads copy out of the mapping.
//!
//! Two backings exist: a mapped pool file ([`Media::map_file`]) and the crash-simulation
//! media ([`Media::sim`]), which keeps a shadow persisted image and offers crash images
//! at every fence (see [`sim`]).

mod calibrate;
mod counters;
mod cpu;
mod emulation;
mod file_mapping;
mod medium;
pub mod sim;
mod view;
pub(crate) mod word_copy;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::ptr::NonNull;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

pub use calibrate::{Calibration, CalibrationOptions, calibrate};
pub use counters::MediaCounters;
pub use cpu::{CACHE_LINE, FlushInstruction};
pub use emulation::{Emulation, TscClock};
pub use file_mapping::MapMode;
pub use medium::Medium;
pub use sim::{CrashPoint, CrashSimulator, FenceFilter, FenceGate, FenceHook, SimConfig};
pub use view::MediaView;

use counters::{CounterRegistry, ThreadCounters};
use file_mapping::FileMapping;

/// What makes a store durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Chosen by the medium when the file is mapped (the default; see [`Medium`]):
    /// `pmem` on DAX (mapped with `MAP_SYNC`) and on file systems in memory (tmpfs,
    /// ramfs, hugetlbfs: there it survives process crashes, as nothing there survives a
    /// power cut), `msync` on every other file system. [`Media::durability`] and
    /// [`Media::medium`] tell what was chosen and why.
    Auto,
    /// Cache-line flush + fence. Durable on DAX persistent memory; on DRAM or tmpfs this
    /// is the usual emulation of persistent memory. On a file system on block storage
    /// (not DAX) it survives process crashes only, and is refused unless the
    /// configuration accepts that ([`MediaConfig::accept_process_crash_only`]).
    Pmem,
    /// Flushed ranges are `msync`ed at each fence: durable on ordinary files on block
    /// storage, on any Linux machine.
    Msync,
    /// No flush and no fence: measures the pure software cost. Not durable.
    None,
}

impl Durability {
    /// Every mode.
    pub const ALL: [Durability; 4] = [Self::Auto, Self::Pmem, Self::Msync, Self::None];

    /// The lower-case name used in configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Pmem => "pmem",
            Self::Msync => "msync",
            Self::None => "none",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown durability mode {s:?} (auto, pmem, msync, none)"))
    }
}

/// How a media persists: durability mode, flush instruction and NVM emulation.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MediaConfig {
    /// What makes a store durable.
    pub durability: Durability,
    /// Whether `pmem` mode is accepted on a file system on block storage, where it
    /// survives process crashes but not power loss (refused otherwise).
    #[serde(default)]
    pub process_crash_only: bool,
    /// Force a flush instruction; `None` picks the best the CPU has.
    pub flush: Option<FlushInstruction>,
    /// Extra cost per fence to emulate NVM; `None` (the default) adds nothing.
    pub emulation: Option<Emulation>,
}

impl Default for MediaConfig {
    fn default() -> Self {
        MediaConfig {
            durability: Durability::Auto,
            process_crash_only: false,
            flush: None,
            emulation: None,
        }
    }
}

impl MediaConfig {
    /// Sets the durability mode.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Accepts `pmem` mode on a file system on block storage, where it survives process
    /// crashes but not power loss (for tests and benchmarks that measure the engines,
    /// not the disk).
    pub fn accept_process_crash_only(mut self) -> Self {
        self.process_crash_only = true;
        self
    }

    /// Forces a flush instruction.
    pub fn flush(mut self, flush: FlushInstruction) -> Self {
        self.flush = Some(flush);
        self
    }

    /// Turns NVM emulation on with the given settings.
    pub fn emulation(mut self, emulation: Emulation) -> Self {
        self.emulation = Some(emulation);
        self
    }
}

/// The media of a configuration could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// `pmem` mode was asked for on a medium where flushes do not make stores durable,
    /// without accepting process-crash durability.
    #[error(
        "pmem mode on a {medium} medium survives {survives}: use msync or auto, or accept process-crash durability (MediaConfig::accept_process_crash_only, --process-crash-only)"
    )]
    NotDurable {
        /// The medium of the file.
        medium: Medium,
        /// What `pmem` mode survives there.
        survives: &'static str,
    },
    /// The forced flush instruction does not exist on this CPU.
    #[error("the CPU does not support the {0} instruction")]
    UnsupportedFlush(FlushInstruction),
    /// The address a pool must be mapped at (a fixed mapping) is taken by another
    /// mapping in this process.
    #[error(
        "cannot map {len} bytes at {addr:#x}, where the pool must be mapped: another mapping (another pool, a library, the heap) holds part of that range"
    )]
    AddressTaken {
        /// The address asked for.
        addr: usize,
        /// Bytes asked for.
        len: usize,
    },
    /// Mapping the file failed.
    #[error("cannot map {len} bytes: {source}")]
    Map {
        /// Bytes asked for.
        len: usize,
        /// What the kernel said.
        source: std::io::Error,
    },
}

enum Backing {
    File(FileMapping),
    /// A file mapped for reading only (checking tools); stores to it are a bug.
    ReadOnly(FileMapping),
    Sim(Box<CrashSimulator>),
}

/// A range of persistent (or simulated persistent) memory and the means to persist it.
///
/// `Media` is `Send + Sync`. Writes from several threads to disjoint ranges need no
/// further synchronisation; overlapping writes must be ordered by the caller.
pub struct Media {
    id: u64,
    base: NonNull<u8>,
    len: usize,
    backing: Backing,
    /// The mode in force (never `Auto`).
    durability: Durability,
    medium: Medium,
    process_crash_only: bool,
    flush: FlushInstruction,
    emulation: Option<Emulation>,
    counters: CounterRegistry,
    msync_errors: AtomicU64,
}

// SAFETY: `base` points into memory owned by `backing` for the media's whole life; every
// access is a raw copy or an atomic word access, and concurrent use of disjoint ranges is
// the documented contract.
unsafe impl Send for Media {}
// SAFETY: as above.
unsafe impl Sync for Media {}

impl fmt::Debug for Media {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Media")
            .field("len", &self.len)
            .field("map_mode", &self.map_mode())
            .field("durability", &self.durability)
            .field("medium", &self.medium)
            .field("flush", &self.flush)
            .field("emulation", &self.emulation)
            .finish()
    }
}

/// Per-thread, per-media state: the counter block and what the next fence must cover.
struct ThreadSlot {
    media_id: u64,
    counters: Arc<CachePadded<ThreadCounters>>,
    /// Byte ranges flushed since the last fence (msync mode only).
    dirty: Vec<Range<usize>>,
}

thread_local! {
    static SLOTS: RefCell<Vec<ThreadSlot>> = const { RefCell::new(Vec::new()) };
    /// The counter block this thread used last, with its media's id (0: none): every
    /// store, flush and fence counts into it, so the common case is two thread-local
    /// loads and a compare, not a search of `SLOTS` under a `RefCell` borrow. Plain
    /// data without a destructor, so its access needs no lazy-initialisation check.
    static LAST_COUNTERS: Cell<(u64, *const ThreadCounters)> =
        const { Cell::new((0, std::ptr::null())) };
    static THREAD_TOKEN: u64 = {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

fn next_media_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn thread_token() -> u64 {
    THREAD_TOKEN.with(|t| *t)
}

impl Media {
    /// Maps the first `len` bytes of `file` (`MAP_SYNC` where the file system allows it).
    pub fn map_file(file: &File, len: usize, config: &MediaConfig) -> Result<Media, MediaError> {
        Media::map_file_at(file, len, config, None)
    }

    /// Like [`map_file`](Media::map_file), at address `at` when given
    /// (`MAP_FIXED_NOREPLACE`; [`MediaError::AddressTaken`] when the range is in use).
    pub fn map_file_at(
        file: &File,
        len: usize,
        config: &MediaConfig,
        at: Option<usize>,
    ) -> Result<Media, MediaError> {
        Media::map_file_spanning(file, len, len, config, at)
    }

    /// Like [`map_file_at`](Media::map_file_at), inside `span` bytes of address space
    /// (at least `len`): the media is `span` bytes long, and the bytes past `len` are
    /// reserved for other files, [`attach`](Media::attach)ed later (a pool of several
    /// files seen as one range, so one fence covers them all). A part where no file is
    /// attached holds private zero pages: touching it never faults, and nothing stored
    /// there persists.
    pub(crate) fn map_file_spanning(
        file: &File,
        len: usize,
        span: usize,
        config: &MediaConfig,
        at: Option<usize>,
    ) -> Result<Media, MediaError> {
        let flush = resolve_flush(config)?;
        let mapping = FileMapping::spanning(file, len, span, at).map_err(|source| match at {
            Some(addr) if source.kind() == std::io::ErrorKind::AlreadyExists => {
                MediaError::AddressTaken { addr, len: span }
            }
            _ => MediaError::Map { len: span, source },
        })?;
        // MAP_SYNC is the proof of DAX; a file that claims DAX but could not be mapped
        // with it is written back like any page-cache file.
        let medium = match (mapping.mode(), Medium::of_file(file)) {
            (MapMode::Sync, _) => Medium::Dax,
            (_, Medium::Dax) => Medium::PageCache,
            (_, medium) => medium,
        };
        let durability = medium.resolve(config.durability, config.process_crash_only)?;
        Ok(Media::with_backing(
            mapping.ptr(),
            span,
            Backing::File(mapping),
            config,
            (durability, medium),
            flush,
        ))
    }

    /// Grows a file media's span to `span` bytes (see
    /// [`map_file_spanning`](Media::map_file_spanning)); its first `file_len` bytes stay
    /// mapped from `file`, possibly at a new address (never with `fixed`: then the
    /// address space after the mapping must be free). Simulation media, whose whole
    /// length is memory, must be `span` bytes long already.
    ///
    /// # Errors
    /// When the kernel refuses, the span after a fixed mapping is taken
    /// ([`MediaError::AddressTaken`]), or simulation media are shorter.
    pub(crate) fn extend(
        &mut self,
        file: Option<&File>,
        file_len: usize,
        span: usize,
        fixed: bool,
    ) -> Result<(), MediaError> {
        let addr = self.base.as_ptr() as usize;
        let map_error = |source: std::io::Error| match source.kind() {
            std::io::ErrorKind::AlreadyExists => MediaError::AddressTaken { addr, len: span },
            _ => MediaError::Map { len: span, source },
        };
        match (&mut self.backing, file) {
            (Backing::File(m), Some(file)) => {
                m.extend(file, file_len, span, fixed).map_err(map_error)?;
                self.base = m.ptr();
                self.len = self.len.max(span);
                Ok(())
            }
            _ if span <= self.len => Ok(()),
            _ => Err(MediaError::Map {
                len: span,
                source: std::io::Error::other(format!(
                    "the media holds {} bytes, fewer than the {span} its files span",
                    self.len
                )),
            }),
        }
    }

    /// Maps `len` bytes of `file` from `file_offset` (both page aligned) at `offset` of
    /// this media's span (see [`map_file_spanning`](Media::map_file_spanning)). On
    /// simulation media, whose whole length is memory, this does nothing: the caller
    /// keeps the range's contents.
    ///
    /// # Errors
    /// When the range is not page aligned inside the media, the media is read-only, or
    /// the kernel refuses.
    ///
    /// # Safety
    /// Nothing may use `[offset, offset + len)` while this runs: its contents become the
    /// file's.
    pub(crate) unsafe fn attach(
        &self,
        offset: usize,
        file: &File,
        file_offset: u64,
        len: usize,
    ) -> std::io::Result<()> {
        match &self.backing {
            // SAFETY: as the caller promises.
            Backing::File(m) => unsafe { m.attach(offset, file, file_offset, len) },
            Backing::Sim(_) => Ok(()),
            Backing::ReadOnly(_) => Err(std::io::Error::other("the media is read-only")),
        }
    }

    /// Unmaps the file attached at `[offset, offset + len)` (see
    /// [`attach`](Media::attach)); the range holds private zero pages until a file is
    /// attached there again. On simulation media this does nothing.
    ///
    /// # Errors
    /// As [`attach`](Media::attach).
    ///
    /// # Safety
    /// Nothing may touch the range afterwards, until a file is attached there again.
    pub(crate) unsafe fn detach(&self, offset: usize, len: usize) -> std::io::Result<()> {
        match &self.backing {
            // SAFETY: as the caller promises.
            Backing::File(m) => unsafe { m.detach(offset, len) },
            Backing::Sim(_) => Ok(()),
            Backing::ReadOnly(_) => Err(std::io::Error::other("the media is read-only")),
        }
    }

    /// The settings the media was made with.
    pub fn config(&self) -> MediaConfig {
        MediaConfig {
            durability: self.durability,
            process_crash_only: self.process_crash_only,
            flush: Some(self.flush),
            emulation: self.emulation,
        }
    }

    /// Maps the first `len` bytes of `file` for reading only (for checking tools: the
    /// store methods must not be called on it; they panic).
    pub(crate) fn map_file_read_only(file: &File, len: usize) -> Result<Media, MediaError> {
        let mapping =
            FileMapping::read_only(file, len).map_err(|source| MediaError::Map { len, source })?;
        let config = MediaConfig::default();
        // What an open of the file would choose (the tools report it); never used.
        let medium = Medium::of_file(file);
        Ok(Media::with_backing(
            mapping.ptr(),
            len,
            Backing::ReadOnly(mapping),
            &config,
            (medium.auto_durability(), medium),
            FlushInstruction::detect(),
        ))
    }

    /// Crash-simulation media of `len` bytes (rounded up to whole lines), zero-filled.
    /// It persists like `pmem` (its medium is [`Medium::Simulated`]); `config.durability`
    /// is ignored, emulation is honoured.
    pub fn sim(len: usize, config: &MediaConfig, sim: SimConfig) -> Result<Media, MediaError> {
        Media::sim_from_image(vec![0; len], config, sim)
    }

    /// Crash-simulation media whose memory and persisted image start as `image`
    /// (for opening a crash image).
    pub fn sim_from_image(
        image: Vec<u8>,
        config: &MediaConfig,
        sim: SimConfig,
    ) -> Result<Media, MediaError> {
        let flush = resolve_flush(config)?;
        let simulator = CrashSimulator::new(image, sim);
        let len = simulator.len();
        let base = NonNull::new(simulator.base()).ok_or(MediaError::Map {
            len,
            source: std::io::Error::other("empty simulated media"),
        })?;
        Ok(Media::with_backing(
            base,
            len,
            Backing::Sim(Box::new(simulator)),
            config,
            (Durability::Pmem, Medium::Simulated),
            flush,
        ))
    }

    fn with_backing(
        base: NonNull<u8>,
        len: usize,
        backing: Backing,
        config: &MediaConfig,
        (durability, medium): (Durability, Medium),
        flush: FlushInstruction,
    ) -> Media {
        if config.emulation.is_some() {
            TscClock::get(); // calibrate now rather than inside the first fence
        }
        // Word copies rely on it (see `copy_in`).
        assert!(
            (base.as_ptr() as usize).is_multiple_of(8),
            "a media starts on a word"
        );
        Media {
            id: next_media_id(),
            base,
            len,
            backing,
            durability,
            medium,
            process_crash_only: config.process_crash_only,
            flush,
            emulation: config.emulation,
            counters: CounterRegistry::default(),
            msync_errors: AtomicU64::new(0),
        }
    }

    /// The address the media's first byte is mapped at in this process (valid while the
    /// media lives; on simulation media, the simulator's volatile view).
    pub fn base_address(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the media has no bytes (never true for a constructed media).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The durability mode in force (never [`Durability::Auto`]: what it chose).
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// What the media's file lies on, which [`Durability::Auto`] chose the mode from.
    pub fn medium(&self) -> Medium {
        self.medium
    }

    /// What a store the media made durable survives, in a few words.
    pub fn survives(&self) -> &'static str {
        self.medium.survives(self.durability)
    }

    /// The flush instruction in use.
    pub fn flush_instruction(&self) -> FlushInstruction {
        self.flush
    }

    /// The NVM emulation settings, if on.
    pub fn emulation(&self) -> Option<Emulation> {
        self.emulation
    }

    /// How the memory is mapped.
    pub fn map_mode(&self) -> MapMode {
        match &self.backing {
            Backing::File(m) | Backing::ReadOnly(m) => m.mode(),
            Backing::Sim(_) => MapMode::Memory,
        }
    }

    /// The crash simulator, when this is simulation media.
    pub fn crash_simulator(&self) -> Option<&CrashSimulator> {
        match &self.backing {
            Backing::Sim(s) => Some(s),
            Backing::File(_) | Backing::ReadOnly(_) => None,
        }
    }

    /// `msync` calls that failed (msync mode); a non-zero value means durability was lost.
    pub fn msync_errors(&self) -> u64 {
        self.msync_errors.load(Ordering::Relaxed)
    }

    /// Traffic summed over all threads so far.
    pub fn counters(&self) -> MediaCounters {
        self.counters.sum()
    }

    /// Reports `bytes` of application payload (the denominator of write amplification).
    pub fn add_payload(&self, bytes: u64) {
        self.local_counters().add_payload(bytes);
    }

    /// Reports a committed transaction (`wrote`: it was a write transaction).
    pub fn count_transaction(&self, wrote: bool) {
        self.local_counters().add_transaction(wrote);
    }

    /// Reports an aborted transaction attempt.
    pub fn count_abort(&self) {
        self.local_counters().add_abort();
    }

    /// Reports a read handed to its caller in place, without a copy.
    pub fn count_read_in_place(&self) {
        self.local_counters().add_read_in_place();
    }

    #[inline]
    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset <= self.len && len <= self.len - offset,
            "media access {offset}+{len} outside {} bytes",
            self.len
        );
    }

    /// Whether fences sync the ranges flushed before them (`msync` mode on a file).
    fn msyncs(&self) -> bool {
        self.durability == Durability::Msync && matches!(self.backing, Backing::File(_))
    }

    /// This thread's counter block of this media.
    #[inline]
    fn local_counters(&self) -> &ThreadCounters {
        let (id, block) = LAST_COUNTERS.with(Cell::get);
        if id == self.id {
            // SAFETY: `block` was set by `with_slot` from this media's registration of
            // this thread (media ids are never reused), and the media's registry keeps
            // every block it registered alive as long as the media lives, which is at
            // least as long as `&self`.
            return unsafe { &*block };
        }
        let block = self.with_slot(|slot| -> *const ThreadCounters { &**slot.counters });
        // SAFETY: as above: this media's block for this thread, kept by its registry.
        unsafe { &*block }
    }

    /// This thread's slot of this media (registered on first use), which also becomes
    /// the block [`local_counters`](Self::local_counters) finds first.
    fn with_slot<R>(&self, f: impl FnOnce(&mut ThreadSlot) -> R) -> R {
        SLOTS.with(|slots| {
            let mut slots = slots.borrow_mut();
            let index = match slots.iter().position(|s| s.media_id == self.id) {
                Some(i) => i,
                None => {
                    // Drop slots of media that no longer exist (their registry let go).
                    slots.retain(|s| Arc::strong_count(&s.counters) > 1);
                    slots.push(ThreadSlot {
                        media_id: self.id,
                        counters: self.counters.register(),
                        dirty: Vec::new(),
                    });
                    slots.len() - 1
                }
            };
            let slot = &mut slots[index];
            let block: &ThreadCounters = &slot.counters;
            LAST_COUNTERS.with(|last| last.set((self.id, block)));
            f(slot)
        })
    }

    /// Stores `bytes` at `offset` through the cache. Not persistent until flushed and
    /// fenced.
    ///
    /// # Panics
    /// If the range is outside the media (a bug in the caller, which must validate
    /// offsets read from files).
    #[inline]
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        self.check(offset, bytes.len());
        let store = || self.copy_in(offset, bytes);
        match &self.backing {
            Backing::Sim(s) => s.store(offset, bytes.len(), 0, store),
            Backing::File(_) => store(),
            Backing::ReadOnly(_) => read_only_store(),
        }
        self.count_stored(bytes.len());
    }

    /// Copies `bytes` into the mapping at `offset` (atomic word stores, nothing
    /// counted). The caller has checked the range with `check`.
    #[inline]
    fn copy_in(&self, offset: usize, bytes: &[u8]) {
        debug_assert!(offset <= self.len && bytes.len() <= self.len - offset);
        // SAFETY: the range is inside the media (the caller checked it), and the whole
        // words around it are mapped: the base is word aligned, and the memory behind a
        // media is whole pages (a file mapping) or whole lines (the simulator's), so a
        // last word that runs past the media's length stays inside them. The media's
        // every access to the mapping is an atomic word access.
        unsafe { word_copy::store(self.base.as_ptr().add(offset), bytes) }
    }

    /// Counts `len` bytes stored by this thread (the dirty-bytes counter).
    #[inline]
    fn count_stored(&self, len: usize) {
        if len > 0 && self.durability != Durability::None {
            self.local_counters().add_dirty_bytes(len as u64);
        }
    }

    /// Stores `len` copies of `byte` at `offset` through the cache.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) {
        self.check(offset, len);
        // SAFETY: as in `copy_in`.
        let store = || unsafe { word_copy::fill(self.base.as_ptr().add(offset), len, byte) };
        match &self.backing {
            Backing::Sim(s) => s.store(offset, len, 0, store),
            Backing::File(_) => store(),
            Backing::ReadOnly(_) => read_only_store(),
        }
        self.count_stored(len);
    }

    /// Stores one 8-byte word atomically (it can never be torn by a crash).
    ///
    /// # Panics
    /// If `offset` is not 8-byte aligned or is outside the media.
    #[inline]
    pub fn write_u64(&self, offset: usize, value: u64) {
        self.check(offset, 8);
        assert!(
            offset.is_multiple_of(8),
            "unaligned atomic store at {offset}"
        );
        // SAFETY: in bounds and 8-aligned (checked above, and the base is page aligned);
        // AtomicU64 has the layout of u64.
        let store = || unsafe {
            (*(self.base.as_ptr().add(offset) as *const AtomicU64)).store(value, Ordering::Release)
        };
        match &self.backing {
            Backing::Sim(s) => s.store(offset, 8, 0, store),
            Backing::File(_) => store(),
            Backing::ReadOnly(_) => read_only_store(),
        }
        self.count_stored(8);
    }

    /// Copies `bytes` to `offset` with non-temporal stores; persistent at the next fence
    /// without a flush (any unaligned head or tail is flushed here).
    pub fn write_nt(&self, offset: usize, bytes: &[u8]) {
        self.check(offset, bytes.len());
        let dst = self.base.as_ptr();
        match &self.backing {
            Backing::Sim(s) => {
                let me = thread_token();
                // SAFETY: as in `copy_in`.
                s.store(offset, bytes.len(), me, || unsafe {
                    word_copy::store(dst.add(offset), bytes)
                });
                let counters = self.local_counters();
                counters.add_nt_bytes(bytes.len() as u64);
                counters.add_dirty_bytes(bytes.len() as u64);
                self.note_unfenced(counters, offset, bytes.len());
            }
            Backing::File(_) if self.durability == Durability::Pmem => {
                // SAFETY: in bounds (checked above); no overlap with `bytes`.
                let nt = unsafe { cpu::copy_nontemporal(dst.add(offset), bytes) };
                let cached = bytes.len() - nt;
                let counters = self.local_counters();
                counters.add_nt_bytes(nt as u64);
                counters.add_dirty_bytes(bytes.len() as u64);
                self.note_unfenced(counters, offset, bytes.len());
                if cached > 0 {
                    // The unaligned head and tail went through the cache.
                    let head = (16 - (dst as usize + offset) % 16) % 16;
                    let head = head.min(bytes.len());
                    self.flush(offset, head);
                    self.flush(offset + head + nt, bytes.len() - head - nt);
                }
            }
            Backing::File(_) => {
                self.write(offset, bytes);
                self.flush(offset, bytes.len());
            }
            Backing::ReadOnly(_) => read_only_store(),
        }
    }

    /// Stores `bytes` at `offset` in the fast log buffer of 001 ("on-chip logging": a
    /// small non-volatile memory beside the cores, in the same address space): the
    /// bytes are persistent when the call returns, without a flush or a fence, and cost
    /// the emulation's [`fast_log_line_ns`](Emulation::fast_log_line_ns) per line.
    ///
    /// This machine has no such memory: the crash simulator models it (the stores are
    /// persistent at once, and a crash point is offered before them, as at a fence);
    /// on a file the bytes are stored and written back but not fenced, so outside the
    /// simulator a `*-fastlog` engine is an emulation for measurement, durable only at
    /// the thread's next fence.
    pub fn write_fast_log(&self, offset: usize, bytes: &[u8]) {
        self.check(offset, bytes.len());
        if bytes.is_empty() {
            return;
        }
        let store = || self.copy_in(offset, bytes);
        match &self.backing {
            Backing::Sim(s) => s.store_persistent(offset, bytes.len(), store),
            Backing::File(_) => {
                store();
                if self.durability == Durability::Pmem {
                    // SAFETY: the range is inside the mapping (checked above).
                    unsafe {
                        cpu::flush_range(self.flush, self.base.as_ptr().add(offset), bytes.len())
                    }
                }
            }
            Backing::ReadOnly(_) => read_only_store(),
        }
        let lines = ((offset + bytes.len() - 1) / CACHE_LINE - offset / CACHE_LINE + 1) as u64;
        let delay = self.emulation.map(|e| e.fast_log_line_ns * lines);
        if let Some(ns) = delay.filter(|&ns| ns > 0) {
            let clock = TscClock::get();
            let start = clock.now();
            clock.spin_until(start, ns);
        }
        let durable = self.durability != Durability::None;
        let counters = self.local_counters();
        counters.add_fast_log_bytes(bytes.len() as u64);
        if durable {
            counters.add_dirty_bytes(bytes.len() as u64);
        }
        if let Some(ns) = delay {
            counters.add_emulated_delay(ns);
        }
        if self.msyncs() {
            // msync mode: the thread's next fence syncs it, as the docs say.
            self.with_slot(|slot| add_dirty(&mut slot.dirty, offset..offset + bytes.len()));
        }
    }

    /// Notes `[offset, offset + len)`, written back, for the emulation (an empty range
    /// writes nothing back).
    #[inline]
    fn note_unfenced(&self, counters: &ThreadCounters, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        if let Some(emulation) = &self.emulation {
            let first = offset / CACHE_LINE;
            let lines = (offset + len - 1) / CACHE_LINE - first + 1;
            counters.add_unfenced(first as u64, lines as u64, emulation);
        }
    }

    /// Writes back the cache lines overlapping `[offset, offset + len)`.
    pub fn flush(&self, offset: usize, len: usize) {
        self.check(offset, len);
        if len == 0 || self.durability == Durability::None {
            return;
        }
        let first = offset / CACHE_LINE;
        let lines = ((offset + len - 1) / CACHE_LINE - first + 1) as u64;
        match &self.backing {
            Backing::Sim(s) => s.flush(offset, len, thread_token()),
            Backing::ReadOnly(_) => return,
            Backing::File(_) => match self.durability {
                // SAFETY: the range is inside the mapping (checked above).
                Durability::Pmem => unsafe {
                    cpu::flush_range(self.flush, self.base.as_ptr().add(offset), len)
                },
                Durability::Msync => {
                    self.with_slot(|slot| add_dirty(&mut slot.dirty, offset..offset + len))
                }
                Durability::None | Durability::Auto => {}
            },
        }
        let counters = self.local_counters();
        counters.add_lines(lines);
        self.note_unfenced(counters, offset, len);
    }

    /// Persist barrier: every earlier flush and non-temporal store of this thread is
    /// durable when it returns (in `msync` mode, the flushed ranges are synced now).
    pub fn fence(&self) {
        if self.durability == Durability::None {
            return;
        }
        let start_tick = self.emulation.map(|_| TscClock::get().now());
        let counters = self.local_counters();
        // Only msync mode keeps ranges to sync (an empty vector allocates nothing).
        let mut dirty = if self.msyncs() {
            self.with_slot(|slot| std::mem::take(&mut slot.dirty))
        } else {
            Vec::new()
        };
        match &self.backing {
            Backing::Sim(s) => s.fence(thread_token()),
            Backing::ReadOnly(_) => return,
            Backing::File(mapping) => {
                cpu::store_fence();
                for range in &dirty {
                    if mapping.msync(range.start, range.len()).is_err() {
                        self.msync_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        let delay = match (self.emulation, start_tick) {
            (Some(emulation), Some(start)) => {
                let ns = counters.take_unfenced_ns(&emulation);
                TscClock::get().spin_until(start, ns);
                Some(ns)
            }
            _ => None,
        };
        counters.add_fence();
        if let Some(ns) = delay {
            counters.add_emulated_delay(ns);
        }
        if dirty.capacity() > 0 {
            dirty.clear();
            // Hand the (now empty) vector back so its allocation is reused.
            self.with_slot(|slot| {
                if slot.dirty.is_empty() {
                    slot.dirty = dirty;
                }
            });
        }
    }

    /// Gives back to the file system the storage of the whole pages inside
    /// `[offset, offset + len)`, whose contents the caller no longer needs (002's
    /// defragmentation: "punch holes in free blocks"). The file keeps its size; the pages
    /// read as zeros afterwards and take storage again when next written. Returns the bytes
    /// of the pages given back (0 when the range holds no whole page).
    ///
    /// On a file this is `madvise(MADV_REMOVE)`, which the kernel documents as equivalent
    /// to `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)` over the same bytes; it
    /// works through the mapping, so it needs no file descriptor. On simulation media the
    /// pages become zeros in memory and in the persisted image at once (a hole is
    /// durable when the call returns, as the file system's punch is).
    ///
    /// # Errors
    /// When the file system cannot punch holes (`EOPNOTSUPP`) or the kernel refuses.
    ///
    /// # Panics
    /// If the range is outside the media, or the media is mapped read-only.
    pub fn discard(&self, offset: usize, len: usize) -> std::io::Result<u64> {
        self.check(offset, len);
        let page = rustix::param::page_size();
        let start = offset.next_multiple_of(page);
        let end = (offset + len) / page * page;
        if end <= start {
            return Ok(0);
        }
        match &self.backing {
            Backing::Sim(s) => s.discard(start, end - start),
            Backing::File(_) => {
                // SAFETY: `start..end` is page aligned and inside this shared mapping;
                // the caller promises no one needs its contents, and every later access
                // still finds mapped memory (the pages read as zeros).
                unsafe {
                    rustix::mm::madvise(
                        self.base.as_ptr().add(start).cast(),
                        end - start,
                        rustix::mm::Advice::LinuxRemove,
                    )
                }?;
            }
            Backing::ReadOnly(_) => read_only_store(),
        }
        Ok((end - start) as u64)
    }

    /// Flush then fence: `[offset, offset + len)` is durable when it returns.
    pub fn persist(&self, offset: usize, len: usize) {
        self.flush(offset, len);
        self.fence();
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`, as atomic word loads: another
    /// thread may be storing them (an optimistic reader validates what it copied).
    #[inline]
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        self.check(offset, buf.len());
        // SAFETY: as in `copy_in`: the words around the range are inside the media, and
        // every store to the mapping is an atomic word store.
        unsafe { word_copy::load(self.base.as_ptr().add(offset), buf) };
    }

    /// The bytes of `[offset, offset + len)` as a slice of the mapping, read where they
    /// lie (no copy).
    ///
    /// # Safety
    /// Nothing may store to the range while the slice lives: bytes that are never
    /// written again while the caller holds them (the log engine's committed log bytes,
    /// which its epoch keeps in place).
    ///
    /// # Panics
    /// If the range is outside the media.
    pub(crate) unsafe fn bytes_in_place(&self, offset: usize, len: usize) -> &[u8] {
        self.check(offset, len);
        // SAFETY: the range is inside the mapping (checked above), which lives as long
        // as `self`; the caller promises that no store reaches it while the slice lives,
        // and earlier stores (atomic, by any thread) happen before the caller's read
        // through the synchronisation that told it where the bytes are.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), len) }
    }

    /// Reads `len` bytes at `offset` into a new vector.
    pub fn read_vec(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.read(offset, &mut v);
        v
    }

    /// Loads one 8-byte word atomically.
    ///
    /// # Panics
    /// If `offset` is not 8-byte aligned or is outside the media.
    #[inline]
    pub fn read_u64(&self, offset: usize) -> u64 {
        self.check(offset, 8);
        assert!(
            offset.is_multiple_of(8),
            "unaligned atomic load at {offset}"
        );
        // SAFETY: in bounds and aligned (checked above); AtomicU64 has u64's layout.
        unsafe { (*(self.base.as_ptr().add(offset) as *const AtomicU64)).load(Ordering::Acquire) }
    }
}

/// A store to read-only media: a bug in the caller, which promised to only read.
#[cold]
fn read_only_store() -> ! {
    panic!("a store to media mapped read-only")
}

/// Adds a range to a list of dirty ranges, merging it with one it touches.
fn add_dirty(dirty: &mut Vec<Range<usize>>, range: Range<usize>) {
    if let Some(last) = dirty.last_mut()
        && range.start <= last.end
        && last.start <= range.end
    {
        last.start = last.start.min(range.start);
        last.end = last.end.max(range.end);
        return;
    }
    dirty.push(range);
}

fn resolve_flush(config: &MediaConfig) -> Result<FlushInstruction, MediaError> {
    match config.flush {
        Some(forced) if !forced.is_supported() && cfg!(target_arch = "x86_64") => {
            Err(MediaError::UnsupportedFlush(forced))
        }
        Some(forced) => Ok(forced),
        None => Ok(FlushInstruction::detect()),
    }
}
