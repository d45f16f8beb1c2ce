//! Which engine owns a pool.

use std::fmt;
use std::str::FromStr;

/// The engine that formats and runs a pool; recorded in the pool header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// Log-structured: the log is the home of the data ("Log-structured Non-volatile Main Memory", USENIX ATC 2017).
    Log,
    /// Redo logging with in-place home data (Mnemosyne-style baseline).
    Redo,
    /// Undo logging with in-place home data (PMDK-style baseline, 004 hybrid).
    Undo,
    /// Endurance-aware out-of-place update ("endurance-aware out-of-place update", EAOOP).
    Oop,
    /// HOOP: out-of-place updates into logs, written home by periodic collections
    /// (003's strongest baseline).
    Hoop,
    /// No transaction engine: the pool is a bare persistent heap
    /// ([`PersistentHeap`](crate::alloc::PersistentHeap), PAllocator of 002).
    Alloc,
}

impl EngineKind {
    /// Every engine kind.
    pub const ALL: [EngineKind; 6] = [
        Self::Log,
        Self::Redo,
        Self::Undo,
        Self::Oop,
        Self::Alloc,
        Self::Hoop,
    ];

    /// The code stored in the pool header.
    pub fn code(self) -> u32 {
        match self {
            Self::Log => 1,
            Self::Redo => 2,
            Self::Undo => 3,
            Self::Oop => 4,
            Self::Alloc => 5,
            Self::Hoop => 6,
        }
    }

    /// The kind with the given header code.
    pub fn from_code(code: u32) -> Option<EngineKind> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }

    /// The lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Log => "log",
            Self::Redo => "redo",
            Self::Undo => "undo",
            Self::Oop => "oop",
            Self::Alloc => "alloc",
            Self::Hoop => "hoop",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown engine {s:?} (log, redo, undo, oop, hoop, alloc)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip() {
        for k in EngineKind::ALL {
            assert_eq!(EngineKind::from_code(k.code()), Some(k));
            assert_eq!(k.name().parse::<EngineKind>(), Ok(k));
        }
        assert_eq!(EngineKind::from_code(0), None);
        assert!("lsm".parse::<EngineKind>().is_err());
    }
}
