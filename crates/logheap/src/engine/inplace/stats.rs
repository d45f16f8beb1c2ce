//! The in-place engines' own figures, one type per engine, for
//! [`EngineStats`](crate::EngineStats).

/// The per-thread log areas of an in-place engine and what recovery did with them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LogAreaStats {
    /// Log areas (one per thread that committed, at most).
    pub logs: u64,
    /// Bytes of the log areas.
    pub log_bytes: u64,
    /// Records recovery redid (redo, hoop) or undid (undo, oop) when the pool was opened.
    pub records_recovered: u64,
    /// Allocator marks recovery skipped because later transactions reused their space.
    pub marks_superseded: u64,
}

/// The `redo` engine's figures.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RedoStats {
    /// Its logs.
    #[serde(flatten)]
    pub logs: LogAreaStats,
    /// Truncations (each advances the retired version, two fences).
    pub truncations: u64,
}

/// The `hoop` engine's figures.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct HoopStats {
    /// Its logs.
    #[serde(flatten)]
    pub logs: LogAreaStats,
    /// Truncations (each retires the logs after a collection).
    pub truncations: u64,
    /// Words whose newest copy is in a log.
    pub update_slots: u64,
    /// Collections run (each writes every mapped word home and retires the logs).
    pub collections: u64,
    /// Words the collections wrote home.
    pub words_collected: u64,
}

/// The `undo` engine's figures.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct UndoStats {
    /// Its logs.
    #[serde(flatten)]
    pub logs: LogAreaStats,
}

/// The `oop` engine's figures.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct OopStats {
    /// Its logs (allocation records; the slot chunks are counted apart).
    #[serde(flatten)]
    pub logs: LogAreaStats,
    /// Words that have an update slot (their current copy is in it or, after an even
    /// number of updates, home).
    pub update_slots: u64,
    /// Bytes of the slot chunks.
    pub slot_bytes: u64,
    /// Slots the lightweight collector dropped since the pool was opened.
    pub slots_collected: u64,
    /// Slots recovery kept (their word's current copy) when the pool was opened.
    pub slots_recovered: u64,
}
