//! The per-thread log areas of an in-place engine's pool: where each thread's log is
//! and how far it is written, what a redo log's last transactions left unfenced, the
//! table of log slots and the lease a committing thread holds on one.

use std::sync::{Arc, Mutex};

use super::lock;

/// Per-thread logs a pool can hold. A thread keeps its lease from its first commit on
/// the pool until it ends: while this many threads that committed are alive, another
/// thread's first commit waits for one of them to end.
pub(crate) const MAX_LOGS: usize = 240;
/// Bytes at the start of a log area before its records: its capacity, twice (the
/// second inverted), so a torn or foreign header is known.
pub(crate) const LOG_HEADER: u64 = 64;

/// Where one thread's log is, and how far it is written.
#[derive(Debug, Default)]
pub(crate) struct LogPosition {
    /// Offset of the log area (0: no area yet).
    pub area: u64,
    /// Bytes of the area for records.
    pub capacity: u64,
    /// Bytes of records written since the log was last reset.
    pub tail: u64,
    /// The newest version in the log since it was last reset (0: none).
    pub newest: u64,
}

/// What a redo log's last transaction (with the fast log: its transactions since the
/// last truncation) stored in place and flushed, not yet fenced (its thread's next
/// fence makes it durable; a truncation flushes it again).
#[derive(Debug, Default)]
pub(crate) struct Unfenced {
    /// The transaction's version (0: nothing unfenced).
    pub version: u64,
    /// The thread that flushed them (only its fence makes them durable).
    pub thread: Option<std::thread::ThreadId>,
    /// The ranges it flushed.
    pub ranges: Vec<(u64, u64)>,
}

/// One log slot of the pool.
#[derive(Debug, Default)]
pub(crate) struct ThreadLog {
    /// Used by the thread that leases the slot (so never contended).
    pub position: Mutex<LogPosition>,
    /// Shared with truncations.
    pub unfenced: Mutex<Unfenced>,
}

/// The pool's log slots, and which are leased.
#[derive(Debug)]
pub(crate) struct LogTable {
    pub logs: Box<[ThreadLog]>,
    free: Mutex<Vec<usize>>,
    /// Engine blocks in use, log areas and oop's slot chunks: offset → bytes (for
    /// telling them from user allocations).
    areas: Mutex<Vec<(u64, u64)>>,
}

impl LogTable {
    pub(crate) fn new(positions: Vec<LogPosition>) -> LogTable {
        let areas = positions
            .iter()
            .filter(|p| p.area != 0)
            .map(|p| (p.area, p.capacity + LOG_HEADER))
            .collect();
        LogTable {
            logs: positions
                .into_iter()
                .map(|p| ThreadLog {
                    position: Mutex::new(p),
                    unfenced: Mutex::default(),
                })
                .collect(),
            free: Mutex::new((0..MAX_LOGS).rev().collect()),
            areas: Mutex::new(areas),
        }
    }

    pub(crate) fn is_area(&self, home: u64) -> bool {
        lock(&self.areas).iter().any(|&(a, _)| a == home)
    }

    pub(crate) fn areas(&self) -> (u64, u64) {
        let a = lock(&self.areas);
        (a.len() as u64, a.iter().map(|&(_, b)| b).sum())
    }

    pub(crate) fn set_area(&self, old: u64, new: Option<(u64, u64)>) {
        let mut a = lock(&self.areas);
        a.retain(|&(o, _)| o != old);
        a.extend(new);
    }
}

/// A thread's lease of a log slot, given back when the thread's transaction state is
/// dropped (the thread ended) or moves to another pool.
#[derive(Debug)]
pub(crate) struct LogLease {
    table: Arc<LogTable>,
    /// The slot.
    pub index: usize,
}

impl LogLease {
    /// The leased log.
    pub(crate) fn log(&self) -> &ThreadLog {
        &self.table.logs[self.index]
    }

    pub(crate) fn of(&self, table: &Arc<LogTable>) -> bool {
        Arc::ptr_eq(&self.table, table)
    }
}

impl LogTable {
    /// Makes sure `lease` is a lease of `table`'s logs, taking a free slot (waiting for
    /// one when every slot is leased).
    pub(crate) fn lease(table: &Arc<LogTable>, lease: &mut Option<LogLease>) {
        if lease.as_ref().is_some_and(|l| l.of(table)) {
            return;
        }
        *lease = None;
        loop {
            if let Some(index) = lock(&table.free).pop() {
                *lease = Some(LogLease {
                    table: table.clone(),
                    index,
                });
                return;
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for LogLease {
    fn drop(&mut self) {
        lock(&self.table.free).push(self.index);
    }
}
