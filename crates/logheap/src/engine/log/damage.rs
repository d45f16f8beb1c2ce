//! Damage found in a pool: what recovery, the superblock and the allocation checkpoint
//! report when what they read cannot be true, and why a pool is refused.

use std::fmt;

/// Damage found in a pool: what is wrong and where.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Damage {
    /// Byte offset in the pool file.
    pub offset: u64,
    /// The log it is in, when it is in one (e.g. "update log of log set 3").
    pub log: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl Damage {
    /// Damage at pool offset `offset`, in no particular log.
    pub(crate) fn at(offset: u64, reason: String) -> Damage {
        Damage {
            offset,
            log: None,
            reason,
        }
    }

    /// Damage at pool offset `offset` in the log named `log`.
    pub(crate) fn in_log(offset: u64, log: String, reason: String) -> Damage {
        Damage {
            offset,
            log: Some(log),
            reason,
        }
    }
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.log {
            Some(log) => write!(f, "offset {} ({log}): {}", self.offset, self.reason),
            None => write!(f, "offset {}: {}", self.offset, self.reason),
        }
    }
}
