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
    /// Every problem found; empty when the pool is sound.
    pub problems: Vec<Damage>,
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
            let offset = match &damaged {
                Error::Checksum { offset, .. } => *offset,
                _ => 0,
            };
            report.problems.push(Damage {
                offset,
                log: None,
                reason: damaged.to_string(),
            });
            return Ok(report);
        }
    };
    if pool.header.engine == EngineKind::Alloc {
        return Err(Error::WrongEngine {
            path: path.into(),
            found: EngineKind::Alloc,
            expected: EngineKind::Log,
        });
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
