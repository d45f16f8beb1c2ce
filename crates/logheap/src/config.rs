//! Pool configuration.

use crate::engine::{EngineChoice, EngineConfig, LogOptions, MappingConfig, PersistPolicy};
use crate::file::EngineKind;
use crate::media::{Durability, Emulation, FlushInstruction, MediaConfig};

/// How to create (or open) a pool. Built with chained setters from `Config::default()`.
///
/// The engine and its own options are an [`EngineConfig`]; the setters of the log
/// engine's options (`chunk_size`, `mapping`, ...) and of the in-place engines'
/// (`fast_log`, `persist_policy`) change the options of the engine chosen so far. One
/// that does not apply to that engine is refused when the pool is created or opened
/// ([`Error::InvalidConfig`](crate::Error::InvalidConfig), naming the option and the
/// engine), never silently ignored.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Pool file size in bytes (default 64 MiB).
    pub size: u64,
    /// Size of the root object area (default 4 KiB).
    pub root_size: u64,
    /// How the media persists (default: `pmem`, best flush instruction, no emulation).
    pub media: MediaConfig,
    /// Claim the pool file's whole size from the file system when creating it (default
    /// true): a pool that does not fit is refused with [`Error::NoSpace`](crate::Error)
    /// at creation instead of failing with `SIGBUS` when the file system fills up later.
    /// False makes a sparse file that takes space only as it is written (for pools sized
    /// far beyond what they will hold, such as benchmark pools on tmpfs); a file system
    /// that fills up then ends the process with `SIGBUS`.
    pub reserve_space: bool,
    /// Where a new pool is mapped, now and at every later open (default: wherever the
    /// kernel picks). A fixed address lets the pool hold plain pointers into itself,
    /// as programs compiled for the GNU TM runtime (`logheap-itm`) do.
    pub map_address: crate::file::MapAddress,
    /// The engine and its options (default: the log-structured engine).
    pub engine: EngineConfig,
    /// Data checksums of the in-place engines (`redo`, `undo`, `oop`, `hoop`): a
    /// CRC-32C of every 64-byte line of user data, kept at commit and verified on every
    /// read and by `logheap check`, so damage to data stored at home is an error, never
    /// a value. `None` (the default): a new pool has none, an opened pool keeps what it
    /// has; `Some(true)` turns them on (at create, or at an open of a pool without
    /// them), `Some(false)` turns them off. The log engine always checks its blocks:
    /// `Some(true)` is refused there. Their cost is in docs/benchmarks.md.
    pub data_checksums: Option<bool>,
    /// An option set that does not apply to the engine chosen: `(option, engine)`,
    /// refused at create and open.
    misapplied: Option<(&'static str, EngineKind)>,
    /// A kind chosen that is no transaction engine ([`EngineKind::Alloc`]), refused at
    /// create.
    not_an_engine: Option<EngineKind>,
    /// Open to repair ([`check::repair`](crate::check::repair)): a damaged log is cut
    /// back to before its first damage instead of being refused.
    pub(crate) salvage: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            size: 64 << 20,
            root_size: 4096,
            media: MediaConfig::default(),
            reserve_space: true,
            map_address: crate::file::MapAddress::Anywhere,
            engine: EngineConfig::default(),
            data_checksums: None,
            misapplied: None,
            not_an_engine: None,
            salvage: false,
        }
    }
}

impl Config {
    /// Sets the pool size in bytes.
    pub fn size(mut self, bytes: u64) -> Self {
        self.size = bytes;
        self
    }

    /// Sets the engine: an [`EngineConfig`], or an [`EngineKind`] with its default
    /// options. Given the kind chosen already, it keeps the options set so far; given
    /// another, the options of the engine chosen before go with it (so a configuration
    /// can be set up for one engine and then moved to another).
    pub fn engine(mut self, engine: impl EngineChoice) -> Self {
        let engine = match engine.into_engine_config() {
            Ok(engine) => engine,
            Err(kind) => {
                self.not_an_engine = Some(kind);
                return self;
            }
        };
        self.not_an_engine = None;
        if engine.kind() == self.engine.kind() && engine.first_changed().is_none() {
            return self;
        }
        self.engine = engine;
        self
    }

    /// Sets the root area size.
    pub fn root_size(mut self, bytes: u64) -> Self {
        self.root_size = bytes;
        self
    }

    /// Sets the durability mode (the default, [`Durability::Auto`], chooses it from
    /// the file system the pool lies on).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.media.durability = durability;
        self
    }

    /// Accepts [`Durability::Pmem`] on a file system on block storage, where it survives
    /// process crashes but not power loss (refused otherwise): for tests and benchmarks
    /// that measure the engines, not the disk.
    pub fn accept_process_crash_only(mut self) -> Self {
        self.media = self.media.accept_process_crash_only();
        self
    }

    /// Forces a flush instruction.
    pub fn flush(mut self, flush: FlushInstruction) -> Self {
        self.media.flush = Some(flush);
        self
    }

    /// Turns on NVM emulation.
    pub fn emulation(mut self, emulation: Emulation) -> Self {
        self.media.emulation = Some(emulation);
        self
    }

    /// Sets where a new pool is mapped (see [`map_address`](Self::map_address)).
    pub fn map_address(mut self, at: crate::file::MapAddress) -> Self {
        self.map_address = at;
        self
    }

    /// Sets whether creation claims the file's whole size (see
    /// [`reserve_space`](Self::reserve_space)).
    pub fn reserve_space(mut self, reserve: bool) -> Self {
        self.reserve_space = reserve;
        self
    }

    /// Sets the log engine's chunk size (see [`LogOptions::chunk_size`]).
    pub fn chunk_size(self, bytes: u64) -> Self {
        self.log_option("chunk_size", |o| o.chunk_size = bytes)
    }

    /// Sets the log engine's address-mapping configuration (see
    /// [`LogOptions::mapping`]).
    pub fn mapping(self, mapping: MappingConfig) -> Self {
        self.log_option("mapping", |o| o.mapping = mapping)
    }

    /// Sets the number of threads that recover the log on open (0: one per core; see
    /// [`LogOptions::recovery_threads`]).
    pub fn recovery_threads(self, threads: usize) -> Self {
        self.log_option("recovery_threads", |o| o.recovery_threads = threads)
    }

    /// Sets the live fraction below which the log cleaner takes a chunk (see
    /// [`LogOptions::clean_threshold`]); clamped to `0.0..=1.0`.
    pub fn clean_threshold(self, fraction: f64) -> Self {
        self.log_option("clean_threshold", |o| *o = o.clean_threshold(fraction))
    }

    /// Sets the number of background cleaner threads (see
    /// [`LogOptions::cleaner_threads`]).
    pub fn cleaner_threads(self, threads: usize) -> Self {
        self.log_option("cleaner_threads", |o| o.cleaner_threads = threads)
    }

    /// Sets whether committing threads clean inline (see
    /// [`LogOptions::inline_cleaning`]).
    pub fn inline_cleaning(self, inline: bool) -> Self {
        self.log_option("inline_cleaning", |o| o.inline_cleaning = inline)
    }

    /// Sets the commits between cleaning passes that run whatever the free chunks (see
    /// [`LogOptions::clean_every`]).
    pub fn clean_every(self, commits: u64) -> Self {
        self.log_option("clean_every", |o| o.clean_every = commits)
    }

    /// Sets whether the log engine puts new objects' initial data in a log of its own
    /// (see [`LogOptions::separate_initial_data`]).
    pub fn separate_initial_data(self, separate: bool) -> Self {
        self.log_option("separate_initial_data", |o| {
            o.separate_initial_data = separate
        })
    }

    /// Sets the entries of each thread's node cache on the log engine (see
    /// [`LogOptions::node_cache_entries`]).
    pub fn node_cache_entries(self, entries: usize) -> Self {
        self.log_option("node_cache_entries", |o| o.node_cache_entries = entries)
    }

    /// Sets how `undo` persists its home stores (see
    /// [`UndoOptions::persist_policy`](crate::UndoOptions::persist_policy)).
    pub fn persist_policy(mut self, policy: PersistPolicy) -> Self {
        match &mut self.engine {
            EngineConfig::Undo(o) => o.persist_policy = policy,
            other if policy != PersistPolicy::WriteBack => {
                self.misapplied = self.misapplied.or(Some(("persist_policy", other.kind())))
            }
            _ => {}
        }
        self
    }

    /// Turns the in-place engines' data checksums on or off (see
    /// [`Config::data_checksums`](#structfield.data_checksums)).
    pub fn data_checksums(mut self, on: bool) -> Self {
        self.data_checksums = Some(on);
        self
    }

    /// Sets whether `redo` and `undo` log to the fast log buffer (see
    /// [`RedoOptions::fast_log`](crate::RedoOptions::fast_log)).
    pub fn fast_log(mut self, fast: bool) -> Self {
        match &mut self.engine {
            EngineConfig::Redo(o) => o.fast_log = fast,
            EngineConfig::Undo(o) => o.fast_log = fast,
            other if fast => self.misapplied = self.misapplied.or(Some(("fast_log", other.kind()))),
            _ => {}
        }
        self
    }

    /// Changes the log engine's options, or records that `option` was set for another
    /// engine.
    /// (Setting one to its default value on another engine changes nothing and is not
    /// refused.)
    fn log_option(mut self, option: &'static str, set: impl FnOnce(&mut LogOptions)) -> Self {
        match &mut self.engine {
            EngineConfig::Log(o) => set(o),
            other => {
                let mut o = LogOptions::default();
                set(&mut o);
                if o != LogOptions::default() {
                    self.misapplied = self.misapplied.or(Some((option, other.kind())));
                }
            }
        }
        self
    }

    /// The engine options a pool of engine `kind` runs with under this configuration:
    /// this configuration's when it names `kind`, else `kind`'s defaults (a pool opened
    /// with a configuration made for another engine, such as `Config::default()` for a
    /// `redo` pool). Refuses an option set on an engine it does not apply to.
    pub(crate) fn engine_for(&self, kind: EngineKind) -> crate::Result<EngineConfig> {
        let refuse = |option: &str, engine: EngineKind| {
            crate::Error::InvalidConfig(format!(
                "option {option} does not apply to engine {engine}"
            ))
        };
        if let Some((option, engine)) = self.misapplied {
            return Err(refuse(option, engine));
        }
        if kind == EngineKind::Log && self.data_checksums == Some(true) {
            return Err(refuse("data_checksums", kind));
        }
        if let Some(kind) = self.not_an_engine {
            return Err(crate::Error::InvalidConfig(format!(
                "engine {kind} is a bare persistent heap: create it with alloc::PersistentHeap"
            )));
        }
        if self.engine.kind() == kind {
            return Ok(self.engine);
        }
        EngineConfig::of_kind(kind).ok_or_else(|| {
            crate::Error::InvalidConfig(
                "engine alloc is a bare persistent heap: create it with alloc::PersistentHeap"
                    .into(),
            )
        })
    }

    pub(crate) fn pool_options(&self) -> crate::file::PoolOptions {
        crate::file::PoolOptions {
            size: self.size,
            engine: self.engine.kind(),
            root_size: self.root_size,
            chunk_size: match self.engine {
                EngineConfig::Log(o) => o.chunk_size,
                _ => LogOptions::default().chunk_size,
            },
            media: self.media,
            reserve_space: self.reserve_space,
            map_address: self.map_address,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineKind, RedoOptions, UndoOptions};

    #[test]
    fn an_option_of_another_engine_is_refused_naming_it() {
        let redo = Config::default().engine(EngineKind::Redo);
        let err = redo
            .chunk_size(4096)
            .engine_for(EngineKind::Redo)
            .unwrap_err();
        assert!(err.to_string().contains("chunk_size"), "{err}");
        assert!(err.to_string().contains("redo"), "{err}");
        let err = Config::default()
            .persist_policy(PersistPolicy::NonTemporal)
            .engine_for(EngineKind::Log)
            .unwrap_err();
        assert!(err.to_string().contains("persist_policy"), "{err}");
        // Set to its default, an option changes nothing and is not refused.
        assert!(redo.cleaner_threads(0).engine_for(EngineKind::Redo).is_ok());
        assert!(
            Config::default()
                .fast_log(false)
                .engine_for(EngineKind::Log)
                .is_ok()
        );
        assert!(
            Config::default()
                .engine(EngineKind::Alloc)
                .engine_for(EngineKind::Log)
                .is_err()
        );
    }

    #[test]
    fn choosing_an_engine_keeps_or_replaces_the_options() {
        let log = Config::default().chunk_size(4096).engine(EngineKind::Log);
        assert!(matches!(log.engine, EngineConfig::Log(o) if o.chunk_size == 4096));
        let undo = log.engine(EngineKind::Undo).fast_log(true);
        assert_eq!(
            undo.engine,
            EngineConfig::Undo(UndoOptions {
                fast_log: true,
                persist_policy: PersistPolicy::WriteBack
            })
        );
        assert_eq!(undo.engine_for(EngineKind::Undo).unwrap(), undo.engine);
        // Opening a pool of another engine: that engine's defaults.
        assert_eq!(
            Config::default().engine_for(EngineKind::Oop).unwrap(),
            EngineConfig::Oop
        );
        assert_eq!(
            undo.engine_for(EngineKind::Redo).unwrap(),
            EngineConfig::Redo(RedoOptions::default())
        );
    }
}
