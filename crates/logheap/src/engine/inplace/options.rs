//! The options of the in-place engines: what [`EngineConfig::Redo`](crate::EngineConfig)
//! and [`EngineConfig::Undo`](crate::EngineConfig) carry (`oop` and `hoop` take none).
//! None is stored in the pool: each open chooses.

use super::persist_policy::PersistPolicy;

/// The `redo` engine's options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedoOptions {
    /// Write the log to the fast log buffer of 001 (on-chip logging: a small
    /// non-volatile memory beside the cores; emulated, see
    /// [`Media::write_fast_log`](crate::media::Media::write_fast_log)) instead of
    /// ordinary persistent memory, so a commit needs no fence (engine name
    /// `redo-fastlog`). The pool's format is the same.
    pub fast_log: bool,
}

/// The `undo` engine's options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UndoOptions {
    /// Write the undo log to the fast log buffer of 001 (see
    /// [`RedoOptions::fast_log`]): a commit needs one fence (engine name
    /// `undo-fastlog`).
    pub fast_log: bool,
    /// How the home stores are persisted, per page (001's caching modes: write-back,
    /// non-temporal, uncached, or 001's adaptive choice; see [`PersistPolicy`]). Engine
    /// names `undo-nt`, `undo-uc`, `undo-adaptive`.
    pub persist_policy: PersistPolicy,
}

impl RedoOptions {
    /// Sets whether the log goes to the fast log buffer.
    pub fn fast_log(mut self, fast: bool) -> Self {
        self.fast_log = fast;
        self
    }
}

impl UndoOptions {
    /// Sets whether the log goes to the fast log buffer.
    pub fn fast_log(mut self, fast: bool) -> Self {
        self.fast_log = fast;
        self
    }

    /// Sets how the home stores are persisted.
    pub fn persist_policy(mut self, policy: PersistPolicy) -> Self {
        self.persist_policy = policy;
        self
    }
}
