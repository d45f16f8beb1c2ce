//! The log engine's options ([`LogOptions`]): what [`EngineConfig::Log`](crate::EngineConfig)
//! carries.

use super::MappingConfig;

/// The log engine's options. The chunk size is part of the pool's geometry (chosen at
/// creation, stored in the pool); the others are not stored: each open chooses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogOptions {
    /// Log chunk size, a power of two from 4 KiB to 64 MiB (default 32 KiB). Used when
    /// the pool is created; an open uses the pool's own.
    pub chunk_size: u64,
    /// The address-mapping optimisations (default: all on).
    pub mapping: MappingConfig,
    /// Threads that recover the log when a pool is opened (default 0: one per core, as
    /// [`std::thread::available_parallelism`] counts them, but no more than one per
    /// 4 MiB of formatted log, so a small pool opens on one thread). 1 recovers on the
    /// opening thread alone, sequentially. With more, that many threads (the opening
    /// thread and `n - 1` others) read the chunks and replay the committed transactions
    /// by home partition ("Log-structured Non-volatile Main Memory", USENIX ATC 2017,
    /// §4.5); the opening thread leads them, judges the logs, and rebuilds the allocator
    /// while the others replay the data. The recovered state is the same whatever the
    /// number (at most 1024 are used).
    pub recovery_threads: usize,
    /// The cleaner takes a chunk when its live (still mapped) bytes are below this
    /// fraction of its payload (default 0.2, as in "Log-structured Non-volatile Main
    /// Memory", USENIX ATC 2017, §3.4); committing threads clean when free chunks run
    /// low, and take any chunk up to 97% live when none is left (live bytes counted
    /// with their entry headers).
    pub clean_threshold: f64,
    /// Background threads of the cleaner (default 0). They clean when committers find
    /// free chunks running low, each pass on chunks of its own, so that cleaning leaves
    /// the committing threads alone when there are spare cores.
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
    /// [`inline_cleaning`](Self::inline_cleaning).
    pub clean_every: u64,
    /// Bytes of DRAM the home cache may hold (default 256 MiB; 0 turns it off): a
    /// copy of the home space, page by page, that reads copy from instead of walking
    /// the mapping and copying out of the log. Pages are filled from the log when a
    /// read first meets them, kept up to date by commits, and never written back (the
    /// log holds the data). Past the budget one miss in 16 fills its page, evicting
    /// one CLOCK chooses, and the others read through the mapping, so a budget smaller
    /// than the data read costs little more than no cache. Only the pages read are
    /// held, so a pool whose data fits the budget is cached whole.
    pub home_cache: u64,
    /// Whether the initial data of new objects goes to a log of its own, apart from
    /// stores into existing objects (default true; "Log-structured Non-volatile Main
    /// Memory", USENIX ATC 2017, §3.4, separate logs). Stores die young and new objects
    /// live long: apart, chunks of stores are more often wholly stale, reclaimed
    /// without copying (fast cleaning). False puts both in the update log, the
    /// paper's baseline for Fig. 10.
    pub separate_initial_data: bool,
    /// Entries of each thread's mapping node cache (default 8,192; rounded down to a
    /// power of two sets of four entries; 4 to 4 M, the paper's largest): a bigger
    /// cache hits more often on a large working set, at 40 bytes of DRAM per entry and
    /// thread. Refused when the mapping has no node cache ([`MappingConfig`]'s
    /// `node_cache`). `Pool::stats().log()` reports its hit ratio.
    pub node_cache_entries: usize,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            chunk_size: 32 << 10,
            mapping: MappingConfig::default(),
            recovery_threads: 0,
            clean_threshold: 0.2,
            cleaner_threads: 0,
            inline_cleaning: true,
            clean_every: 0,
            home_cache: 256 << 20,
            separate_initial_data: true,
            node_cache_entries: super::mapping::node_cache::DEFAULT_ENTRIES,
        }
    }
}

impl LogOptions {
    /// Sets the log chunk size.
    pub fn chunk_size(mut self, bytes: u64) -> Self {
        self.chunk_size = bytes;
        self
    }

    /// Sets the address-mapping configuration.
    pub fn mapping(mut self, mapping: MappingConfig) -> Self {
        self.mapping = mapping;
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

    /// Sets the home cache's DRAM budget in bytes (0: no cache; see
    /// [`home_cache`](Self::home_cache)).
    pub fn home_cache(mut self, bytes: u64) -> Self {
        self.home_cache = bytes;
        self
    }

    /// Sets whether new objects' initial data goes to a log of its own (see
    /// [`separate_initial_data`](Self::separate_initial_data)).
    pub fn separate_initial_data(mut self, separate: bool) -> Self {
        self.separate_initial_data = separate;
        self
    }

    /// Sets the entries of each thread's node cache (see
    /// [`node_cache_entries`](Self::node_cache_entries)).
    pub fn node_cache_entries(mut self, entries: usize) -> Self {
        self.node_cache_entries = entries;
        self
    }

    /// Why these options cannot be used together, if they cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        self.mapping.check()?;
        use super::mapping::node_cache::{DEFAULT_ENTRIES, MAX_ENTRIES, WAYS};
        if self.node_cache_entries != DEFAULT_ENTRIES && !self.mapping.node_cache {
            return Err(format!(
                "node_cache_entries ({}) applies only to a mapping with the node cache",
                self.node_cache_entries
            ));
        }
        if !(WAYS..=MAX_ENTRIES).contains(&self.node_cache_entries) {
            return Err(format!(
                "node_cache_entries must be from {WAYS} to {MAX_ENTRIES}, not {}",
                self.node_cache_entries
            ));
        }
        Ok(())
    }

    /// The name of the first option that differs from its default, if any.
    pub(crate) fn first_changed(&self) -> Option<&'static str> {
        let d = LogOptions::default();
        [
            (self.chunk_size != d.chunk_size, "chunk_size"),
            (self.mapping != d.mapping, "mapping"),
            (
                self.recovery_threads != d.recovery_threads,
                "recovery_threads",
            ),
            (self.clean_threshold != d.clean_threshold, "clean_threshold"),
            (self.cleaner_threads != d.cleaner_threads, "cleaner_threads"),
            (self.inline_cleaning != d.inline_cleaning, "inline_cleaning"),
            (self.clean_every != d.clean_every, "clean_every"),
            (self.home_cache != d.home_cache, "home_cache"),
            (
                self.separate_initial_data != d.separate_initial_data,
                "separate_initial_data",
            ),
            (
                self.node_cache_entries != d.node_cache_entries,
                "node_cache_entries",
            ),
        ]
        .into_iter()
        .find_map(|(changed, name)| changed.then_some(name))
    }
}
