//! The one place that knows every engine: [`AnyEngine`] (an open pool's engine under its
//! TL2 driver) and [`AnyTx`] (a transaction on it), both made by the [`engines!`] list,
//! and the crate-private [`EngineLifecycle`] trait every engine implements beside the
//! transaction path's [`Engine`](crate::stm::Engine).
//!
//! Adding an engine means one line in the `engines!` call at the bottom of this file
//! (and a variant of [`EngineKind`], [`EngineConfig`] and [`EngineStats`] to name it),
//! and one impl of each trait. The pool and the transaction handle match no engine:
//! every method here is written once, generically, and the macro expands it into one
//! match arm per engine (static dispatch: no `dyn` on the transaction paths).

use std::fmt::Debug;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::config::EngineConfig;
use super::inplace::hoop::HoopEngine;
use super::inplace::oop::OopEngine;
use super::inplace::redo::RedoEngine;
use super::inplace::stats::{HoopStats, OopStats, RedoStats, UndoStats};
use super::inplace::undo::UndoEngine;
use super::log::{Compaction, Examination, LogEngine, LogEngineStats};
use crate::alloc::TxHeap;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::file::{EngineKind, PoolFile, ReadOnlyPool};
use crate::media::{Media, SimConfig};
use crate::stm::{Engine, Stm, TxState};

/// Where a new pool is made.
pub(crate) enum NewPool<'a> {
    /// A new pool file at this path (which must not exist).
    File(&'a Path),
    /// A new pool in memory on the crash-simulation media.
    Sim(SimConfig),
}

/// Work an engine runs beside the transactions (the log engine's background cleaners),
/// stopped when dropped.
pub(crate) type Background = Box<dyn Debug + Send + Sync>;

/// What [`EngineLifecycle::figures`] reports for [`Stats`](crate::Stats).
#[derive(Debug)]
pub(crate) struct EngineFigures {
    /// Live allocations.
    pub allocations: u64,
    /// Bytes in live allocations.
    pub allocated_bytes: u64,
    /// DRAM the engine holds to find the data.
    pub dram_bytes: u64,
    /// Bytes of the pool's data area in use.
    pub pm_bytes_used: u64,
    /// The engine's own figures.
    pub engine: EngineStats,
    /// Whether the pool keeps data checksums (in-place engines only).
    pub data_checksums: bool,
}

/// An engine's life outside the transaction path: create or open a pool (the engine
/// owns its pool file from then on), the root, figures, compaction, the check of a
/// pool file, close.
pub(crate) trait EngineLifecycle: Engine {
    /// The engine kind recorded in its pools' headers.
    const KIND: EngineKind;
    /// The engine's own options (what its [`EngineConfig`] variant carries).
    type Options: Copy;

    /// This engine's options in `config`, if it names this engine.
    fn options(config: &EngineConfig) -> Option<Self::Options>;
    /// Creates a pool (`config` gives its size, root area, media and space claim).
    fn create(at: NewPool<'_>, config: &Config, options: Self::Options) -> Result<Self>;
    /// Opens a pool file of this engine, recovering it if its last close was not clean.
    fn open(file: PoolFile, config: &Config, options: Self::Options) -> Result<Self>;
    /// The pool file.
    fn file(&self) -> &PoolFile;
    /// The home range of the root object.
    fn root(&self) -> Range<u64>;
    /// Counters and figures.
    fn figures(&self) -> EngineFigures;
    /// Compacts the pool's persistent data, if the engine has anything to compact.
    fn compact(&self) -> Compaction {
        Compaction::default()
    }
    /// Every line of user data whose data checksum fails, `(offset, stored,
    /// computed)` (the in-place engines with data checksums on; see
    /// [`Config::data_checksums`](crate::Config)).
    fn damaged_data(&self) -> Vec<(u64, u32, u32)> {
        Vec::new()
    }
    /// Zeroes every line of user data whose data checksum fails, with a new checksum,
    /// durably, and returns the lines (for a repair, with no transaction running).
    fn scrub_damaged_data(&self) -> Vec<u64> {
        Vec::new()
    }
    /// Starts the work the engine runs beside the transactions, if any.
    fn background(_engine: &Arc<Self>) -> Option<Background> {
        None
    }
    /// Examines a pool file read-only for [`check`](crate::check::check).
    fn examine(_pool: &ReadOnlyPool) -> Result<Examination> {
        Err(Error::EngineUnavailable(Self::KIND))
    }
    /// Closes the pool cleanly (no transaction and no background work is left).
    fn close(self) -> Result<()>;
}

/// One engine's own figures, in [`Stats`](crate::Stats).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum EngineStats {
    /// The log engine's (boxed: it is several times the size of the others).
    Log(Box<LogEngineStats>),
    /// The `redo` engine's.
    Redo(RedoStats),
    /// The `undo` engine's.
    Undo(UndoStats),
    /// The `oop` engine's.
    Oop(OopStats),
    /// The `hoop` engine's.
    Hoop(HoopStats),
}

impl EngineStats {
    /// The log engine's figures, if these are the log engine's.
    pub fn log(&self) -> Option<&LogEngineStats> {
        match self {
            EngineStats::Log(s) => Some(s),
            _ => None,
        }
    }

    /// The records recovery redid or undid when the pool was opened (an in-place
    /// engine), or the transactions it replayed (the log engine).
    pub fn records_recovered(&self) -> u64 {
        match self {
            EngineStats::Log(s) => s.recovery.transactions,
            EngineStats::Redo(s) => s.logs.records_recovered,
            EngineStats::Undo(s) => s.logs.records_recovered,
            EngineStats::Oop(s) => s.logs.records_recovered,
            EngineStats::Hoop(s) => s.logs.records_recovered,
        }
    }
}

/// Declares [`AnyEngine`] and [`AnyTx`] with one variant per engine listed, and their
/// methods, each written once and expanded into one match arm per engine.
macro_rules! engines {
    ($($variant:ident => $engine:ty),+ $(,)?) => {
        /// The engine of an open pool under its TL2 driver.
        #[derive(Debug)]
        pub(crate) enum AnyEngine {
            $(
                #[doc = concat!("A pool of `", stringify!($engine), "`.")]
                $variant(Stm<$engine>),
            )+
        }

        /// A transaction on an [`AnyEngine`]: the engine's driver and the
        /// transaction's state (boxed: a transaction moves a pointer, not its buffers,
        /// between the thread's spare slot and the handle; `None` once it dropped).
        pub(crate) enum AnyTx<'p> {
            $(
                #[doc = concat!("A transaction on `", stringify!($engine), "`.")]
                $variant(&'p Stm<$engine>, Option<Box<TxState<<$engine as Engine>::Scratch>>>),
            )+
        }

        impl AnyEngine {
            /// Creates a pool of the engine `config` names.
            pub(crate) fn create(at: NewPool<'_>, config: &Config) -> Result<AnyEngine> {
                let kind = config.engine.kind();
                let engine = config.engine_for(kind)?;
                $(
                    if let Some(options) = <$engine as EngineLifecycle>::options(&engine) {
                        let e = <$engine as EngineLifecycle>::create(at, config, options)?;
                        return Ok(AnyEngine::$variant(Stm::new(Arc::new(e))));
                    }
                )+
                Err(Error::EngineUnavailable(kind))
            }

            /// Opens a pool file with the engine its header names (and `config`'s
            /// options for it).
            pub(crate) fn open(file: PoolFile, config: &Config) -> Result<AnyEngine> {
                let kind = file.header().engine;
                if kind == EngineKind::Alloc {
                    return Err(Error::WrongEngine {
                        path: file.path().into(),
                        found: EngineKind::Alloc,
                        expected: config.engine.kind(),
                    });
                }
                let engine = config.engine_for(kind)?;
                $(
                    if let Some(options) = <$engine as EngineLifecycle>::options(&engine) {
                        let e = <$engine as EngineLifecycle>::open(file, config, options)?;
                        return Ok(AnyEngine::$variant(Stm::new(Arc::new(e))));
                    }
                )+
                Err(Error::EngineUnavailable(kind))
            }

            /// Examines a pool file of engine `kind` read-only.
            pub(crate) fn examine(kind: EngineKind, pool: &ReadOnlyPool) -> Result<Examination> {
                $(
                    if kind == <$engine as EngineLifecycle>::KIND {
                        return <$engine as EngineLifecycle>::examine(pool);
                    }
                )+
                Err(Error::EngineUnavailable(kind))
            }

            /// Starts the engine's background work, if it has any.
            pub(crate) fn background(&self) -> Option<Background> {
                match self {
                    $(AnyEngine::$variant(stm) => <$engine as EngineLifecycle>::background(stm.engine()),)+
                }
            }

            /// The pool file.
            pub(crate) fn file(&self) -> &PoolFile {
                match self {
                    $(AnyEngine::$variant(stm) => stm.engine().file(),)+
                }
            }

            /// The pool's media.
            pub(crate) fn media(&self) -> &Arc<Media> {
                match self {
                    $(AnyEngine::$variant(stm) => stm.engine().media(),)+
                }
            }

            /// The home range of the root object.
            pub(crate) fn root(&self) -> Range<u64> {
                match self {
                    $(AnyEngine::$variant(stm) => stm.engine().root(),)+
                }
            }

            /// Counters and figures.
            pub(crate) fn figures(&self) -> EngineFigures {
                match self {
                    $(AnyEngine::$variant(stm) => stm.engine().figures(),)+
                }
            }

            /// Compacts the pool's persistent data.
            pub(crate) fn compact(&self) -> Compaction {
                match self {
                    $(AnyEngine::$variant(stm) => stm.engine().compact(),)+
                }
            }

            /// Every line of user data whose data checksum fails.
            pub(crate) fn damaged_data(&self) -> Vec<(u64, u32, u32)> {
                match self {
                    $(AnyEngine::$variant(stm) => stm.engine().damaged_data(),)+
                }
            }

            /// Zeroes the lines of user data whose data checksum fails.
            pub(crate) fn scrub_damaged_data(&self) -> Vec<u64> {
                match self {
                    $(AnyEngine::$variant(stm) => stm.engine().scrub_damaged_data(),)+
                }
            }

            /// Every live allocation `(home, size)`, sorted.
            pub(crate) fn allocations(&self) -> Vec<(u64, u64)> {
                match self {
                    $(AnyEngine::$variant(stm) => stm.engine().heap().allocations(),)+
                }
            }

            /// Closes the pool cleanly (its background work already stopped).
            pub(crate) fn close(self) -> Result<()> {
                match self {
                    $(AnyEngine::$variant(stm) => Arc::into_inner(stm.into_engine())
                        .expect("no transaction or background work outlives its pool")
                        .close(),)+
                }
            }

            /// Whether a transaction may read and write `[home, home + len)`.
            pub(crate) fn check_range(&self, home: u64, len: u64) -> Result<()> {
                match self {
                    $(AnyEngine::$variant(stm) => stm.engine().check_range(home, len),)+
                }
            }

            /// Begins a transaction.
            pub(crate) fn begin(&self, read_only: bool) -> AnyTx<'_> {
                match self {
                    $(AnyEngine::$variant(stm) => AnyTx::$variant(stm, Some(stm.begin(read_only))),)+
                }
            }
        }

        /// Runs `$body` with `$stm` (the engine's driver) and `$state` (the
        /// transaction's state) of the [`AnyTx`] `$tx`, whichever engine it runs on.
        macro_rules! on_tx {
            ($tx:expr, |$stm:ident, $state:ident| $body:expr) => {
                match $tx {
                    $(AnyTx::$variant($stm, Some($state)) => $body,)+
                    _ => unreachable!("a transaction's state is taken only when it drops"),
                }
            };
        }

        impl Drop for AnyTx<'_> {
            fn drop(&mut self) {
                match self {
                    $(AnyTx::$variant(_, state) => {
                        if let Some(state) = state.take() {
                            Stm::<$engine>::finish(state);
                        }
                    })+
                }
            }
        }
    };
}

engines! {
    Log => LogEngine,
    Redo => RedoEngine,
    Undo => UndoEngine,
    Oop => OopEngine,
    Hoop => HoopEngine,
}

// The macro is textually scoped to this file; this import makes it a path the
// transaction handle can name (clippy takes it for a redundant one).
#[allow(clippy::single_component_path_imports)]
pub(crate) use on_tx;
