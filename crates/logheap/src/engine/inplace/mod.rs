//! The engines that keep data at its home, in the persistent heap: `redo`
//! (Mnemosyne-style) and `undo` (Mnemosyne-Undo of "Log-structured Non-volatile Main
//! Memory", §5.3, with 004's hybrid logging), which log beside it, and `oop` (003's
//! EAOOP), which alternates each word between its home and an update slot; `hoop` is
//! the redo engine with its home stores deferred to collections. All run under the same
//! TL2 driver as the log engine, and allocate from the persistent heap (002) through its
//! reserve / mark / publish path (`alloc::persistent_heap::tx`).
//!
//! A pool of these engines is a [`PersistentHeap`] pool whose header names the engine.
//! Home offsets are offsets in the pool's mapping: reads copy from home, commits store
//! at home. The first [`ENGINE_AREA`] bytes of the heap's root area are the engine's:
//!
//! ```text
//!   0    magic      u64   ENGINE_MAGIC
//!   8    retired    u64   redo: every record of version <= retired is retired
//!   16   chunks     u64   oop: link to the first slot chunk (PAddr, 0: none)
//!   24   slots      u64   oop: slots per chunk
//!   32   staged     u64   oop: a chunk being added (PAddr, 0: none)
//!   64   logs       u64 x MAX_LOGS   per-thread log areas (PAddr, 0: none)
//!   2048 commits    u64 x MAX_LOGS   oop: each log slot's newest committed version
//! ```
//!
//! and the user's root object follows. Each thread that commits leases one log area
//! (a heap block allocated with `allocate_into` on the slot, so it is never leaked):
//! its first 64 bytes hold its capacity, then records (`record`). A log area grows (a
//! new block, the old one freed) when a transaction's record does not fit.
//!
//! What the software versions keep and leave out is in `redo` and `undo`.

/// The `Engine` methods every in-place engine has alike (its `core` is an [`InPlace`],
/// its scratch has a `lease`): the thread-local spare state, the shared parts, no
/// work at begin and end, the core's range check, and a log lease before each commit.
macro_rules! in_place_engine_common {
    ($scratch:ty, $spare:ident) => {
        fn spare() -> &'static std::thread::LocalKey<crate::stm::SpareState<$scratch>> {
            &$spare
        }

        in_place_engine_common!($scratch);
    };
    ($scratch:ty) => {
        fn shared(&self) -> &std::sync::Arc<crate::stm::Domain> {
            &self.core.shared
        }

        fn media(&self) -> &std::sync::Arc<crate::media::Media> {
            &self.core.media
        }

        fn heap(&self) -> &super::EngineHeap {
            &self.core.heap
        }

        fn begin(&self, _s: &mut $scratch) {}

        fn end(_s: &mut $scratch) {}

        #[inline]
        fn check_range(&self, home: u64, len: u64) -> crate::error::Result<()> {
            self.core.check_range(home, len)
        }

        fn before_commit(&self, s: &mut $scratch) {
            self.core.lease(&mut s.lease);
        }
    };
}

/// The [`EngineLifecycle`](crate::engine::EngineLifecycle) methods every in-place
/// engine has alike (its `core` is an [`InPlace`], it has a
/// `start(Start, &Config, Self::Options)`): create and open through `start`, the pool
/// file and the root.
macro_rules! in_place_lifecycle_common {
    () => {
        fn create(
            at: crate::engine::NewPool<'_>,
            config: &crate::Config,
            options: Self::Options,
        ) -> crate::error::Result<Self> {
            Self::start(super::Start::Create(at), config, options)
        }

        fn open(
            file: crate::file::PoolFile,
            config: &crate::Config,
            options: Self::Options,
        ) -> crate::error::Result<Self> {
            Self::start(super::Start::Open(file), config, options)
        }

        fn file(&self) -> &crate::file::PoolFile {
            self.core.file()
        }

        fn root(&self) -> std::ops::Range<u64> {
            self.core.root.clone()
        }

        fn damaged_data(&self) -> Vec<(u64, u32, u32)> {
            self.core.damaged_lines()
        }

        fn scrub_damaged_data(&self) -> Vec<u64> {
            self.core.scrub_damaged_lines()
        }

        /// No log of data to compact: the heap's free space is punched out of the
        /// pool's files instead (transactions may run meanwhile).
        fn compact(&self) -> crate::engine::Compaction {
            crate::engine::Compaction {
                defragmentation: self.core.heap.heap.defragment(u64::MAX).ok(),
                ..Default::default()
            }
        }
    };
}

mod base;
pub(crate) mod data_checksums;
pub(crate) mod hoop;
mod log_areas;
pub(crate) mod oop;
pub(crate) mod options;
pub(crate) mod persist_policy;
pub(crate) mod record;
pub(crate) mod redo;
mod slot_word;
pub(crate) mod stats;
pub(crate) mod undo;
pub(crate) mod words;

pub(crate) use base::{
    EngineArea, EngineHeap, InPlace, Recovered, Start, flush_lines_once, lock, outside,
    write_flushed,
};
pub(crate) use log_areas::{LOG_HEADER, LogLease, LogPosition, MAX_LOGS};
