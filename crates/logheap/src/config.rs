//! Pool configuration.

use crate::engine::{MappingConfig, PersistPolicy};
use crate::media::{Durability, Emulation, FlushInstruction, MediaConfig};
use crate::pool::EngineKind;

/// How to create (or open) a pool. Built with chained setters from `Config::default()`.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Pool file size in bytes (default 64 MiB).
    pub size: u64,
    /// The engine (default: the log-structured engine).
    pub engine: EngineKind,
    /// Log chunk size, a power of two from 4 KiB to 64 MiB (default 32 KiB).
    pub chunk_size: u64,
    /// Size of the root object area (default 4 KiB).
    pub root_size: u64,
    /// How the media persists (default: `pmem`, best flush instruction, no emulation).
    pub media: MediaConfig,
    /// The log engine's address-mapping optimisations (default: all on). Not stored in
    /// the pool: each open chooses.
    pub mapping: MappingConfig,
    /// Claim the pool file's whole size from the file system when creating it (default
    /// true): a pool that does not fit is refused with [`Error::NoSpace`](crate::Error)
    /// at creation instead of failing with `SIGBUS` when the file system fills up later.
    /// False makes a sparse file that takes space only as it is written (for pools sized
    /// far beyond what they will hold, such as benchmark pools on tmpfs); a file system
    /// that fills up then ends the process with `SIGBUS`.
    pub reserve_space: bool,
    /// Threads that recover the log when a pool is opened (default 0: one per core, as
    /// [`std::thread::available_parallelism`] counts them, but no more than one per
    /// 4 MiB of formatted log, so a small pool opens on one thread). 1 recovers on the opening
    /// thread alone, sequentially. With more, that many threads (the opening thread and
    /// `n - 1` others) read the chunks and replay the committed transactions by home
    /// partition ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §4.5); the
    /// opening thread leads them, judges the logs, and rebuilds the allocator while the
    /// others replay the data. The recovered state is the same whatever the number (at
    /// most 1024 are used). Not stored in the pool: each open chooses.
    pub recovery_threads: usize,
    /// The log engine's cleaner takes a chunk when its live (still mapped) bytes are
    /// below this fraction of its payload (default 0.2, as in "Log-structured
    /// Non-volatile Main Memory", USENIX ATC 2017, §3.4); committing threads clean when
    /// free chunks run low, and take any chunk up to 90% live when none is left. Not
    /// stored in the pool: each open chooses.
    pub clean_threshold: f64,
    /// Background threads of the log engine's cleaner (default 0). They clean when
    /// committers find free chunks running low, each pass on chunks of its own, so that
    /// cleaning leaves the committing threads alone when there are spare cores. Not
    /// stored in the pool: each open chooses.
    pub cleaner_threads: usize,
    /// Whether committing threads run the cleaner themselves (default true): when free
    /// chunks run low they clean a pass before committing, and when none is left they
    /// clean (or wait for the background cleaners) before `PoolFull`. The choice for a
    /// machine without a spare core. With this false and no
    /// [`cleaner_threads`](Self::cleaner_threads), nothing is ever cleaned: the log
    /// fills up as it would without a cleaner.
    pub inline_cleaning: bool,
    /// Commits between cleaning passes that run whatever the free chunks (0, the
    /// default: none; the cleaner then runs only when free chunks run low). The
    /// "LSNVMM-Cleaning" setting of "Log-structured Non-volatile Main Memory", USENIX
    /// ATC 2017, §5.3, is about 1,000 commits with a `clean_threshold` of 0.5. The
    /// passes run in the committing thread, so only with
    /// [`inline_cleaning`](Self::inline_cleaning). Not stored in the pool: each open
    /// chooses.
    pub clean_every: u64,
    /// `redo` and `undo`: write the log to the fast log buffer of 001 (on-chip
    /// logging: a small non-volatile memory beside the cores; emulated, see
    /// [`Media::write_fast_log`](crate::media::Media::write_fast_log)) instead of
    /// ordinary persistent memory, so logging needs no flush and no fence. The pool's
    /// format is the same; not stored in the pool: each open chooses. Engine names
    /// `redo-fastlog`, `undo-fastlog`.
    pub fast_log: bool,
    /// `undo`: how the home stores are persisted, per page (001's caching modes:
    /// write-back, non-temporal, uncached, or 001's adaptive choice; see
    /// [`PersistPolicy`]). Not stored in the pool: each open chooses. Engine names
    /// `undo-nt`, `undo-uc`, `undo-adaptive`.
    pub persist_policy: PersistPolicy,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            size: 64 << 20,
            engine: EngineKind::Log,
            chunk_size: 32 << 10,
            root_size: 4096,
            media: MediaConfig::default(),
            mapping: MappingConfig::default(),
            reserve_space: true,
            recovery_threads: 0,
            clean_threshold: 0.2,
            cleaner_threads: 0,
            inline_cleaning: true,
            clean_every: 0,
            fast_log: false,
            persist_policy: PersistPolicy::WriteBack,
        }
    }
}

impl Config {
    /// Sets the pool size in bytes.
    pub fn size(mut self, bytes: u64) -> Self {
        self.size = bytes;
        self
    }

    /// Sets the engine.
    pub fn engine(mut self, engine: EngineKind) -> Self {
        self.engine = engine;
        self
    }

    /// Sets the log chunk size.
    pub fn chunk_size(mut self, bytes: u64) -> Self {
        self.chunk_size = bytes;
        self
    }

    /// Sets the root area size.
    pub fn root_size(mut self, bytes: u64) -> Self {
        self.root_size = bytes;
        self
    }

    /// Sets the durability mode.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.media.durability = durability;
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

    /// Sets whether creation claims the file's whole size (see
    /// [`reserve_space`](Self::reserve_space)).
    pub fn reserve_space(mut self, reserve: bool) -> Self {
        self.reserve_space = reserve;
        self
    }

    /// Sets the number of threads that recover the log on open (0: one per core; see
    /// [`recovery_threads`](Self::recovery_threads)).
    pub fn recovery_threads(mut self, threads: usize) -> Self {
        self.recovery_threads = threads;
        self
    }

    /// Sets the live fraction below which the cleaner takes a chunk (see
    /// [`clean_threshold`](Self::clean_threshold)); clamped to `0.0..=1.0`.
    pub fn clean_threshold(mut self, fraction: f64) -> Self {
        self.clean_threshold = if fraction.is_nan() {
            0.2
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// Sets the number of background cleaner threads (see
    /// [`cleaner_threads`](Self::cleaner_threads)); at most 64 are started.
    pub fn cleaner_threads(mut self, threads: usize) -> Self {
        self.cleaner_threads = threads;
        self
    }

    /// Sets whether committing threads clean inline (see
    /// [`inline_cleaning`](Self::inline_cleaning)).
    pub fn inline_cleaning(mut self, inline: bool) -> Self {
        self.inline_cleaning = inline;
        self
    }

    /// Sets the commits between cleaning passes that run whatever the free chunks (0:
    /// none; see [`clean_every`](Self::clean_every)).
    pub fn clean_every(mut self, commits: u64) -> Self {
        self.clean_every = commits;
        self
    }

    /// Sets the address-mapping configuration.
    pub fn mapping(mut self, mapping: MappingConfig) -> Self {
        self.mapping = mapping;
        self
    }

    /// Sets how `undo` persists its home stores (see
    /// [`persist_policy`](Self::persist_policy)).
    pub fn persist_policy(mut self, policy: PersistPolicy) -> Self {
        self.persist_policy = policy;
        self
    }

    /// Sets whether `redo` and `undo` log to the fast log buffer (see
    /// [`fast_log`](Self::fast_log)).
    pub fn fast_log(mut self, fast: bool) -> Self {
        self.fast_log = fast;
        self
    }

    /// Sets engine and mapping from an engine name: `log` (all optimisations),
    /// `log-base`, `log-2l`, `log-2l-gu`, `log-2l-gu-c` (the paper's ablation), `redo`,
    /// `undo`, `redo-fastlog`, `undo-fastlog` (001's on-chip logging), `oop`, `hoop`.
    pub fn engine_name(mut self, name: &str) -> Result<Self, String> {
        self.persist_policy = PersistPolicy::WriteBack;
        for policy in PersistPolicy::ALL.into_iter().skip(1) {
            if let Some(base) = name.strip_suffix(policy.suffix()) {
                if base != "undo" {
                    return Err(format!(
                        "{name}: only undo takes a persist policy (undo-nt, undo-uc, undo-adaptive)"
                    ));
                }
                self.engine = EngineKind::Undo;
                self.fast_log = false;
                self.persist_policy = policy;
                return Ok(self);
            }
        }
        if let Some(base) = name.strip_suffix("-fastlog") {
            self.engine = base.parse()?;
            if !matches!(self.engine, EngineKind::Redo | EngineKind::Undo) {
                return Err(format!(
                    "{name}: only redo and undo have a fast log (redo-fastlog, undo-fastlog)"
                ));
            }
            self.fast_log = true;
            return Ok(self);
        }
        self.fast_log = false;
        if let Some(rest) = name.strip_prefix("log-")
            && let Some(m) = MappingConfig::named(rest).filter(|_| rest != "full")
        {
            self.engine = EngineKind::Log;
            self.mapping = m;
            return Ok(self);
        }
        self.engine = name.parse()?;
        if self.engine == EngineKind::Log {
            self.mapping = MappingConfig::FULL;
        }
        Ok(self)
    }

    /// The engine name [`engine_name`](Self::engine_name) accepts for this configuration.
    pub fn engine_label(&self) -> String {
        match self.engine {
            EngineKind::Log if self.mapping == MappingConfig::FULL => "log".into(),
            EngineKind::Log => format!("log-{}", self.mapping.label()),
            other @ (EngineKind::Redo | EngineKind::Undo) if self.fast_log => {
                format!("{other}-fastlog")
            }
            EngineKind::Undo if self.persist_policy != PersistPolicy::WriteBack => {
                format!("undo{}", self.persist_policy.suffix())
            }
            other => other.to_string(),
        }
    }

    pub(crate) fn pool_options(&self) -> crate::pool::PoolOptions {
        crate::pool::PoolOptions {
            size: self.size,
            engine: self.engine,
            root_size: self.root_size,
            chunk_size: self.chunk_size,
            media: self.media,
            reserve_space: self.reserve_space,
            map_address: crate::pool::MapAddress::Anywhere,
        }
    }
}
