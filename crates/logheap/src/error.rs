//! The error type of the library.

use std::path::PathBuf;

use crate::media::MediaError;

/// Everything that can go wrong opening, creating or using a pool.
///
/// Errors about a pool file name the file and, where it applies, the byte offset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The pool file does not exist.
    #[error("{path}: no such pool file")]
    NotFound {
        /// The file asked for.
        path: PathBuf,
    },
    /// A pool file already exists where one was to be created.
    #[error("{path}: a file already exists there")]
    AlreadyExists {
        /// The file asked for.
        path: PathBuf,
    },
    /// Another process (or another handle in this one) has the pool open.
    #[error("{path}: the pool is already open by another process (or handle)")]
    Locked {
        /// The pool file.
        path: PathBuf,
    },
    /// The file is shorter than a pool header.
    #[error("{path}: {len} bytes is too small to be a pool (a header alone is {min} bytes)")]
    TooSmall {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The least a pool can be.
        min: u64,
    },
    /// The file is shorter than its header says the pool is.
    #[error("{path}: truncated: the header says {expected} bytes but the file has {actual}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Pool size recorded in the header.
        expected: u64,
        /// File length found.
        actual: u64,
    },
    /// The file does not start with the pool magic: it is not a logheap pool.
    #[error("{path}: not a logheap pool (bytes 0..8 are {found:02x?}, expected {expected:02x?})")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first eight bytes found.
        found: [u8; 8],
        /// The magic expected.
        expected: [u8; 8],
    },
    /// The pool was written by an unsupported format version.
    #[error(
        "{path}: pool format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Version found in the header.
        found: u32,
        /// Version this build supports.
        supported: u32,
    },
    /// A checksum over pool metadata does not match: the bytes are damaged.
    #[error(
        "{path}: {what} checksum mismatch at offset {offset} (stored {stored:#010x}, computed {computed:#010x})"
    )]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Which structure.
        what: &'static str,
        /// Byte offset of the structure in the file.
        offset: u64,
        /// Checksum stored.
        stored: u32,
        /// Checksum of the bytes found.
        computed: u32,
    },
    /// A header field holds a value no valid pool has.
    #[error("{path}: bad pool header: {reason}")]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file system has no room for a pool of the size asked for; nothing was
    /// created.
    #[error(
        "{path}: not enough space for a pool of {needed} bytes: the file system has {available} bytes free"
    )]
    NoSpace {
        /// The pool file asked for.
        path: PathBuf,
        /// Bytes the pool needs.
        needed: u64,
        /// Bytes free on the file system.
        available: u64,
    },
    /// A configuration asks for something impossible.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The media could not be set up.
    #[error("{path}: {source}")]
    Media {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: MediaError,
    },
    /// The log is damaged in a way recovery cannot repair without losing committed data.
    /// Returned by an open, or, after an open that loaded the clean-close snapshot
    /// without reading the log, by a read of data in a chunk whose check failed (the
    /// read returns nothing of it; `logheap check` lists the damage).
    #[error("{path}: the log is damaged at offset {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the damage in the file.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The pool (or persistent heap) has no room for the transaction or the allocation;
    /// nothing of it was written and the pool stays usable. With the log engine this
    /// means live data truly does not fit: the cleaner could not free a chunk, or live
    /// data with the transaction's new objects (and their entry headers) would fill
    /// more than 93% of the chunks the cleaner works in
    /// (`live_log_bytes` of `Pool::stats().log()` says how much is live; freeing objects
    /// makes room again).
    #[error(
        "the pool is full: live data leaves no room for this (see Pool::stats for the live bytes)"
    )]
    PoolFull,
    /// `logheap check --repair` cannot make this pool sound (see
    /// [`check::repair`](crate::check::repair)); the pool was not changed.
    #[error("{path}: cannot repair: {reason}")]
    CannotRepair {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The engine's transaction versions are used up: the `oop` engine's update slots
    /// hold versions below 2^48, so a pool that has committed that many write
    /// transactions takes no more.
    #[error("the engine's transaction versions are used up")]
    VersionsExhausted,
    /// The home address space (2^47 bytes) is exhausted.
    #[error("the home address space is exhausted")]
    HomeSpaceFull,
    /// [`Pool::direct`](crate::Pool::direct) on an engine that keeps the newest bytes
    /// of an object somewhere other than its home.
    #[error("the {} engine keeps no object at its home address: read it in a transaction", .0.name())]
    NoDirectAccess(crate::file::EngineKind),
    /// A pointer or byte range outside the usable home space (null, or past 2^47).
    #[error("invalid home range {home:#x}+{len}")]
    InvalidRange {
        /// Start of the range.
        home: u64,
        /// Its length.
        len: u64,
    },
    /// `free` of an address that is not the start of a live allocation.
    #[error("free of {home:#x}, which is not a live allocation")]
    InvalidFree {
        /// The address freed.
        home: u64,
    },
    /// An allocation of zero bytes or of more than the home space.
    #[error("cannot allocate {0} bytes")]
    InvalidSize(u64),
    /// A write, allocation or free inside a read-only transaction.
    #[error("a read-only transaction cannot write, allocate or free")]
    ReadOnly,
    /// The root type does not fit the pool's root area.
    #[error("the root type needs {needed} bytes but the pool's root area has {available}")]
    RootTooLarge {
        /// Size of the root type.
        needed: u64,
        /// Size of the root area.
        available: u64,
    },
    /// The transaction conflicted with a concurrent one: the internal retry signal.
    /// Inside a transaction closure, return it (with `?`): the transaction is retried
    /// automatically, so it never reaches the caller of
    /// [`Pool::transaction`](crate::Pool::transaction). Only the library makes it.
    #[doc(hidden)]
    #[non_exhaustive]
    #[error("transaction conflict (retried automatically)")]
    Conflict,
    /// `check` cannot verify this pool (the reason says why); nothing was found wrong
    /// with it.
    #[error("{path}: cannot check: {reason}")]
    CannotCheck {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The engine recorded in the pool is not built into this version.
    #[error("engine {0} is not available in this build")]
    EngineUnavailable(crate::file::EngineKind),
    /// The pool belongs to another engine (a bare persistent heap is opened with
    /// [`PersistentHeap`](crate::alloc::PersistentHeap), the others with
    /// [`Pool`](crate::Pool)).
    #[error("{path}: the pool is formatted for engine {found}, not {expected}")]
    WrongEngine {
        /// The file.
        path: PathBuf,
        /// The engine in its header.
        found: crate::file::EngineKind,
        /// The engine asked for.
        expected: crate::file::EngineKind,
    },
    /// Allocator metadata of a persistent heap is damaged; nothing was changed.
    #[error("{path}: allocator metadata damaged at offset {offset}: {reason}")]
    MetadataCorrupt {
        /// The file.
        path: PathBuf,
        /// Where in the file.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// An address given to the persistent heap names no place it may read or write.
    #[error("invalid heap address {addr}: {reason}")]
    InvalidAddress {
        /// The address.
        addr: crate::alloc::PAddr,
        /// Why.
        reason: &'static str,
    },
    /// An operating-system call on the pool file failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            op,
            source,
        }
    }
}
