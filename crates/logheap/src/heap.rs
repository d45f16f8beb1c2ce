//! The public pool: create or open, root object, transactions, statistics, close.

use std::path::Path;
use std::sync::Arc;

use bytemuck::Pod;

use crate::alloc::TxHeap;
use crate::config::Config;
use crate::engine::inplace::oop::OopEngine;
use crate::engine::inplace::redo::RedoEngine;
use crate::engine::inplace::undo::UndoEngine;
use crate::engine::inplace::{InPlace, Start};
use crate::engine::log::{CleanerSettings, CleanerThreads, LogEngine};
use crate::engine::{Compaction, Engine, InPlaceEngineStats, LogEngineStats};
use crate::error::{Error, Result};
use crate::media::{Media, MediaCounters, SimConfig};
use crate::pool::{EngineKind, Header, PoolFile};
use crate::ptr::PPtr;
use crate::stm::Stm;
use crate::tx::Tx;

/// An open pool: a memory-mapped file holding persistent objects changed by
/// transactions. `Pool` is `Send + Sync`; any number of threads may run transactions.
///
/// ```
/// use logheap::{Config, Pool, PPtr};
/// let dir = tempfile::tempdir()?;
/// let pool = Pool::create(dir.path().join("counter.pool"), &Config::default().size(8 << 20))?;
/// let root: PPtr<u64> = pool.root()?;
/// pool.transaction(|tx| {
///     let n = tx.read(root)?;
///     tx.write(root, &(n + 1))
/// })?;
/// assert_eq!(pool.read(|tx| tx.read(root))?, 1);
/// pool.close()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Pool {
    /// Dropped first: stops the background cleaners before the engine goes.
    cleaners: CleanerThreads,
    engine: PoolEngine,
    /// The pool file of a log-engine pool (an in-place engine's heap holds its own).
    file: Option<PoolFile>,
}

/// The engine of an open pool, under its TL2 driver: one variant per engine, matched
/// once per call (no dynamic dispatch on the transaction paths).
#[derive(Debug)]
pub(crate) enum PoolEngine {
    /// The log-structured engine.
    Log(Stm<LogEngine>),
    /// The redo-logging engine (in place).
    Redo(Stm<RedoEngine>),
    /// The undo-logging engine (in place).
    Undo(Stm<UndoEngine>),
    /// The out-of-place update engine (EAOOP, 003).
    Oop(Stm<OopEngine>),
}

/// Counters and figures of a pool, from [`Pool::stats`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    /// The engine.
    pub engine: EngineKind,
    /// Persistence traffic and transaction counts, summed over threads.
    pub media: MediaCounters,
    /// Fences per committed write transaction.
    pub fences_per_write_tx: f64,
    /// Media bytes per payload byte (`None` before any payload).
    pub write_amplification: Option<f64>,
    /// Live allocations.
    pub allocations: u64,
    /// Bytes in live allocations (as requested).
    pub allocated_bytes: u64,
    /// DRAM the engine holds to find the data (the log engine: its address mapping;
    /// the in-place engines: their allocator's DRAM state).
    pub dram_bytes: u64,
    /// Bytes of the pool's data area in use (the log engine: chunks in a log or
    /// holding its allocation checkpoint; the in-place engines: the allocator's
    /// segments in use).
    pub pm_bytes_used: u64,
    /// The log engine's own figures (`None` for other engines).
    pub log: Option<LogEngineStats>,
    /// The in-place engines' (`redo`, `undo`, `oop`) own figures (`None` for the log engine).
    pub in_place: Option<InPlaceEngineStats>,
}

impl Pool {
    /// Creates a pool file at `path` (which must not exist).
    pub fn create(path: impl AsRef<Path>, config: &Config) -> Result<Pool> {
        check_engine(config.engine)?;
        if config.engine != EngineKind::Log {
            return Pool::start_in_place(config.engine, Start::Create(path.as_ref()), config);
        }
        let file = PoolFile::create_with(path, &config.pool_options(), |media, header| {
            LogEngine::format(media, header)
        })?;
        Pool::start(file, config)
    }

    /// Opens the pool at `path` when it exists (with `config`'s media and mapping
    /// settings, as [`open_with`](Pool::open_with)), else creates it with `config`.
    pub fn open_or_create(path: impl AsRef<Path>, config: &Config) -> Result<Pool> {
        match Pool::open_with(path.as_ref(), config) {
            Err(Error::NotFound { .. }) => match Pool::create(path.as_ref(), config) {
                // Another process created it meanwhile.
                Err(Error::AlreadyExists { .. }) => Pool::open_with(path, config),
                created => created,
            },
            opened => opened,
        }
    }

    /// Opens the pool at `path` with the default settings, recovering it if its last
    /// close was not clean.
    pub fn open(path: impl AsRef<Path>) -> Result<Pool> {
        Pool::open_with(path, &Config::default())
    }

    /// Opens the pool at `path` with the media and mapping settings of `config` (its
    /// size, engine and geometry are the pool's own and are ignored).
    pub fn open_with(path: impl AsRef<Path>, config: &Config) -> Result<Pool> {
        Pool::start(PoolFile::open(path, &config.media)?, config)
    }

    /// Creates a pool in memory on the crash-simulation media (see [`crate::media::sim`]).
    pub fn create_sim(config: &Config, sim: SimConfig) -> Result<Pool> {
        check_engine(config.engine)?;
        if config.engine != EngineKind::Log {
            return Pool::start_in_place(config.engine, Start::CreateSim(sim), config);
        }
        let file = PoolFile::create_sim(&config.pool_options(), sim)?;
        LogEngine::format(file.media(), file.header());
        Pool::start(file, config)
    }

    /// Opens a pool image (for example a crash image) on fresh simulation media,
    /// running recovery as [`open`](Pool::open) would, with `config`'s media and mapping
    /// settings.
    pub fn open_image(image: Vec<u8>, config: &Config, sim: SimConfig) -> Result<Pool> {
        Pool::start(PoolFile::open_image(image, &config.media, sim)?, config)
    }

    /// Starts the pool's engine on a pool file opened with [`PoolFile::open`] or
    /// [`PoolFile::open_image`] (running recovery as [`open`](Pool::open) would). With a
    /// crash simulator's fence hook installed on the file's media first, this crash-tests
    /// recovery itself.
    pub fn from_file(file: PoolFile, config: &Config) -> Result<Pool> {
        Pool::start(file, config)
    }

    fn start(file: PoolFile, config: &Config) -> Result<Pool> {
        if file.header().engine == EngineKind::Alloc {
            return Err(Error::WrongEngine {
                path: file.path().into(),
                found: EngineKind::Alloc,
                expected: EngineKind::Log,
            });
        }
        check_engine(file.header().engine)?;
        let kind = file.header().engine;
        if kind != EngineKind::Log {
            return Pool::start_in_place(kind, Start::Open(file), config);
        }
        let engine = LogEngine::open(
            &file,
            config.mapping,
            config.recovery_threads,
            CleanerSettings {
                threshold: config.clean_threshold,
                threads: config.cleaner_threads,
                inline: config.inline_cleaning,
                every: config.clean_every,
            },
        )?;
        let engine = Arc::new(engine);
        let cleaners = CleanerThreads::start(&engine);
        Ok(Pool {
            cleaners,
            engine: PoolEngine::Log(Stm::new(engine)),
            file: Some(file),
        })
    }

    /// Creates or opens a pool of an in-place engine (`redo`, `undo`, `oop`).
    fn start_in_place(kind: EngineKind, how: Start<'_>, config: &Config) -> Result<Pool> {
        let engine = match kind {
            EngineKind::Redo | EngineKind::Hoop => {
                PoolEngine::Redo(Stm::new(Arc::new(RedoEngine::start(kind, how, config)?)))
            }
            EngineKind::Undo => {
                PoolEngine::Undo(Stm::new(Arc::new(UndoEngine::start(how, config)?)))
            }
            EngineKind::Oop => PoolEngine::Oop(Stm::new(Arc::new(OopEngine::start(how, config)?))),
            other => return Err(Error::EngineUnavailable(other)),
        };
        Ok(Pool {
            cleaners: CleanerThreads::none(),
            engine,
            file: None,
        })
    }

    /// The in-place engine's common part, if the pool has one.
    fn in_place(&self) -> Option<&InPlace> {
        match &self.engine {
            PoolEngine::Log(_) => None,
            PoolEngine::Redo(stm) => Some(&stm.engine().core),
            PoolEngine::Undo(stm) => Some(&stm.engine().core),
            PoolEngine::Oop(stm) => Some(&stm.engine().core),
        }
    }

    /// The pool file.
    fn file(&self) -> &PoolFile {
        match (&self.file, self.in_place()) {
            (Some(file), _) => file,
            (None, Some(core)) => core.heap.heap.pool_file(),
            (None, None) => unreachable!("a log-engine pool keeps its file"),
        }
    }

    /// The root object: a fixed `T` at a fixed place, all zeros until first written.
    pub fn root<T: Pod>(&self) -> Result<PPtr<T>> {
        let root = match &self.engine {
            PoolEngine::Log(stm) => stm.engine().root(),
            PoolEngine::Redo(stm) => stm.engine().core.root.clone(),
            PoolEngine::Undo(stm) => stm.engine().core.root.clone(),
            PoolEngine::Oop(stm) => stm.engine().core.root.clone(),
        };
        let needed = std::mem::size_of::<T>() as u64;
        if needed > root.end - root.start {
            return Err(Error::RootTooLarge {
                needed,
                available: root.end - root.start,
            });
        }
        Ok(PPtr::from_offset(root.start))
    }

    /// Runs `f` as one atomic, isolated, durable transaction and returns its result.
    ///
    /// `f` may run more than once (after a conflict with a concurrent transaction). An
    /// error it returns aborts the transaction (nothing of it takes effect) and comes
    /// back unchanged. `Ok` means the transaction is durable.
    pub fn transaction<R, E: From<Error>>(
        &self,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        self.run(false, f)
    }

    /// Runs `f` as a read-only transaction: a consistent snapshot, no locks taken.
    pub fn read<R, E: From<Error>>(
        &self,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        self.run(true, f)
    }

    fn run<R, E: From<Error>>(
        &self,
        read_only: bool,
        mut f: impl FnMut(&mut Tx<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let mut tx = Tx::begin(&self.engine, read_only);
        let mut attempt = 0u32;
        loop {
            let outcome = match f(&mut tx) {
                Ok(value) => match tx.commit() {
                    Ok(()) => return Ok(value),
                    Err(Error::Conflict) => None,
                    Err(e) => Some(E::from(e)),
                },
                Err(_) if tx.conflicted() => None,
                Err(e) => Some(e),
            };
            tx.abort();
            if let Some(e) = outcome {
                return Err(e);
            }
            attempt += 1;
            backoff(attempt);
            tx.restart();
        }
    }

    /// Counters and figures.
    pub fn stats(&self) -> Stats {
        let media = self.media().counters();
        let engine = self.file().header().engine;
        let fences_per_write_tx = if media.write_transactions == 0 {
            0.0
        } else {
            media.fences as f64 / media.write_transactions as f64
        };
        let write_amplification = media.write_amplification();
        if let Some(core) = self.in_place() {
            let heap = core.heap.heap.stats();
            let (allocations, allocated_bytes) = core.heap.live();
            let in_place = match &self.engine {
                PoolEngine::Redo(stm) => stm.engine().stats(),
                PoolEngine::Undo(stm) => stm.engine().stats(),
                PoolEngine::Oop(stm) => stm.engine().stats(),
                PoolEngine::Log(_) => unreachable!("an in-place engine"),
            };
            return Stats {
                engine,
                media,
                fences_per_write_tx,
                write_amplification,
                allocations,
                allocated_bytes,
                dram_bytes: heap.dram_bytes,
                pm_bytes_used: heap.pm_bytes_used,
                log: None,
                in_place: Some(in_place),
            };
        }
        let log = match &self.engine {
            PoolEngine::Log(stm) => stm.engine().stats(),
            _ => unreachable!("the log engine"),
        };
        Stats {
            engine,
            fences_per_write_tx,
            write_amplification,
            media,
            allocations: log.allocations,
            allocated_bytes: log.allocated_bytes,
            dram_bytes: log.mapping_dram_bytes,
            pm_bytes_used: (log.chunks_total - log.chunks_free) * self.file().header().chunk_size,
            log: Some(log),
            in_place: None,
        }
    }

    /// Compacts the log: folds allocation and free records into an allocation
    /// checkpoint, then copies the live data of every sealed update chunk, least live
    /// first, packed into new chunks, and gives the old ones back to the free chunks, so
    /// that the log holds little more than its live data and their entry headers. It
    /// copies all the live data once (chunks already full of live data too), so it
    /// costs about as much as writing the live data again; the cleaner, which runs
    /// when free chunks run low, leaves chunks fuller than its threshold alone.
    ///
    /// Transactions may run meanwhile: a chunk whose data one holds locks on, or
    /// holding a version not yet committed through, is left as it is
    /// ([`Compaction::chunks_skipped`](crate::Compaction::chunks_skipped)). Crash-safe as
    /// the cleaner is: a crash during compaction loses nothing committed.
    ///
    /// The in-place engines keep no log of data to compact: for them this does nothing
    /// and returns an empty [`Compaction`].
    pub fn compact(&self) -> Compaction {
        match &self.engine {
            PoolEngine::Log(stm) => stm.engine().compact(),
            PoolEngine::Redo(_) | PoolEngine::Undo(_) | PoolEngine::Oop(_) => Compaction::default(),
        }
    }

    /// Every live allocation `(home offset, size)`, sorted (for checking tools). The
    /// log engine reports the sizes allocated; the in-place engines (`redo`, `undo`),
    /// whose allocator keeps size classes, report each block's usable size (at least
    /// the size allocated).
    pub fn allocations(&self) -> Vec<(u64, u64)> {
        match &self.engine {
            PoolEngine::Log(stm) => stm.engine().heap().allocations(),
            PoolEngine::Redo(stm) => stm.engine().heap().allocations(),
            PoolEngine::Undo(stm) => stm.engine().heap().allocations(),
            PoolEngine::Oop(stm) => stm.engine().heap().allocations(),
        }
    }

    /// The pool's media (for counters and the crash simulator).
    pub fn media(&self) -> &Arc<Media> {
        self.file().media()
    }

    /// The pool header.
    pub fn header(&self) -> &Header {
        self.file().header()
    }

    /// The pool file's path.
    pub fn path(&self) -> &Path {
        self.file().path()
    }

    /// Whether the pool was closed cleanly before this open.
    pub fn was_clean(&self) -> bool {
        self.file().was_clean()
    }

    /// Closes the pool cleanly. (Dropping it without closing is like a crash: the next
    /// open runs recovery.)
    pub fn close(self) -> Result<()> {
        let Pool {
            cleaners,
            engine,
            file,
        } = self;
        drop(cleaners);
        match engine {
            PoolEngine::Log(stm) => {
                stm.engine().close();
                file.expect("a log-engine pool keeps its file").close()
            }
            PoolEngine::Redo(stm) => {
                let engine = stm.into_engine();
                engine.close();
                Arc::into_inner(engine)
                    .expect("no transaction outlives its pool")
                    .core
                    .heap
                    .heap
                    .close()
            }
            PoolEngine::Undo(stm) => Arc::into_inner(stm.into_engine())
                .expect("no transaction outlives its pool")
                .core
                .heap
                .heap
                .close(),
            PoolEngine::Oop(stm) => Arc::into_inner(stm.into_engine())
                .expect("no transaction outlives its pool")
                .core
                .heap
                .heap
                .close(),
        }
    }
}

fn check_engine(kind: EngineKind) -> Result<()> {
    match kind {
        EngineKind::Log
        | EngineKind::Redo
        | EngineKind::Undo
        | EngineKind::Oop
        | EngineKind::Hoop => Ok(()),
        EngineKind::Alloc => Err(Error::InvalidConfig(
            "engine alloc is a bare persistent heap: create it with alloc::PersistentHeap".into(),
        )),
    }
}

/// Waits before retry `attempt`: spins that double each time, then yields.
fn backoff(attempt: u32) {
    if attempt < 10 {
        for _ in 0..(1u32 << attempt) {
            std::hint::spin_loop();
        }
    } else {
        std::thread::yield_now();
    }
}
