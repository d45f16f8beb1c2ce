//! The public pool: create or open, root object, transactions, statistics, close.

use std::mem::ManuallyDrop;
use std::path::Path;

use bytemuck::Pod;

use crate::config::Config;
use crate::engine::{AnyEngine, Background, Compaction, EngineStats, NewPool};
use crate::error::{Error, Result};
use crate::file::{EngineKind, Header, PoolFile};
use crate::media::{MediaCounters, MediaView, SimConfig};
use crate::ptr::PPtr;
use crate::tx::{Transaction, Tx};

/// An open pool: a memory-mapped file holding persistent objects changed by
/// transactions. `Pool` is `Send + Sync`; any number of threads may run transactions.
///
/// Dropping a pool closes it cleanly, as [`close`](Pool::close) does, except while the
/// thread panics (then, and after [`abandon`](Pool::abandon), the next open recovers
/// as after a crash). [`close`](Pool::close) reports what drop cannot: an error while
/// closing.
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
    /// Dropped first: stops the engine's background work (the log engine's cleaners)
    /// before the engine goes.
    background: Option<Background>,
    /// Taken out only by `close`, `abandon` and `drop`, each the pool's last use.
    engine: ManuallyDrop<AnyEngine>,
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
    /// The engine's own figures.
    pub engine_stats: EngineStats,
    /// The durability mode in force: the one asked for, or what
    /// [`Durability::Auto`](crate::Durability::Auto) chose from the medium.
    pub durability: crate::Durability,
    /// What the pool's file lies on (see [`Medium`](crate::media::Medium)).
    pub medium: crate::media::Medium,
    /// Whether the pool keeps data checksums (see
    /// [`Config::data_checksums`](crate::Config)).
    pub data_checksums: bool,
}

impl Stats {
    /// The log engine's own figures (`None` for other engines).
    pub fn log(&self) -> Option<&crate::engine::LogEngineStats> {
        self.engine_stats.log()
    }

    /// What a committed transaction survives in the mode in force on this medium, in a
    /// few words ("power loss", "process crashes (the medium is memory)", ...).
    pub fn survives(&self) -> &'static str {
        self.medium.survives(self.durability)
    }
}

impl Pool {
    /// Creates a pool file at `path` (which must not exist).
    pub fn create(path: impl AsRef<Path>, config: &Config) -> Result<Pool> {
        Pool::start(AnyEngine::create(NewPool::File(path.as_ref()), config)?)
    }

    /// Opens the pool at `path` when it exists (with `config`'s media and engine
    /// options, as [`open_with`](Pool::open_with)), else creates it with `config`.
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

    /// Opens the pool at `path` with the media settings of `config`, and its engine
    /// options when it names the pool's engine (else that engine's defaults: the pool's
    /// size, engine and geometry are its own).
    pub fn open_with(path: impl AsRef<Path>, config: &Config) -> Result<Pool> {
        Pool::from_file(PoolFile::open(path, &config.media)?, config)
    }

    /// Creates a pool in memory on the crash-simulation media (see [`crate::media::sim`]).
    pub fn create_sim(config: &Config, sim: SimConfig) -> Result<Pool> {
        Pool::start(AnyEngine::create(NewPool::Sim(sim), config)?)
    }

    /// Opens a pool image (for example a crash image) on fresh simulation media,
    /// running recovery as [`open`](Pool::open) would, with `config`'s media and engine
    /// options.
    pub fn open_image(image: Vec<u8>, config: &Config, sim: SimConfig) -> Result<Pool> {
        Pool::from_file(PoolFile::open_image(image, &config.media, sim)?, config)
    }

    /// Starts the pool's engine on a pool file opened with [`PoolFile::open`] or
    /// [`PoolFile::open_image`] (running recovery as [`open`](Pool::open) would). With a
    /// crash simulator's fence hook installed on the file's media first, this crash-tests
    /// recovery itself.
    pub fn from_file(file: PoolFile, config: &Config) -> Result<Pool> {
        Pool::start(AnyEngine::open(file, config)?)
    }

    fn start(engine: AnyEngine) -> Result<Pool> {
        Ok(Pool {
            background: engine.background(),
            engine: ManuallyDrop::new(engine),
        })
    }

    /// The pool file.
    fn file(&self) -> &PoolFile {
        self.engine.file()
    }

    /// The root object: a fixed `T` at a fixed place, all zeros until first written.
    pub fn root<T: Pod>(&self) -> Result<PPtr<T>> {
        let root = self.engine.root();
        let needed = std::mem::size_of::<T>() as u64;
        if needed > root.end - root.start {
            return Err(Error::RootTooLarge {
                needed,
                available: root.end - root.start,
            });
        }
        Ok(PPtr::from_offset(root.start))
    }

    /// The home range of the root area (its size is [`Config::root_size`]).
    pub fn root_range(&self) -> std::ops::Range<u64> {
        self.engine.root()
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

    /// Begins a transaction that its caller ends by hand: [`Transaction::commit`], or
    /// [`Transaction::abort`] (dropping it aborts too). For bindings whose callers
    /// cannot hand over a closure (the C API); in Rust, [`transaction`](Self::transaction)
    /// and [`read`](Self::read) are simpler and retry conflicts themselves. Here a
    /// conflict ends the transaction: `commit` (or any operation) returns
    /// [`Error::Conflict`], and the caller begins again and repeats its work.
    ///
    /// The transaction belongs to the thread that began it (it is not `Send`).
    pub fn begin(&self, read_only: bool) -> Transaction<'_> {
        Transaction::new(Tx::begin(&self.engine, read_only))
    }

    /// The address in this process of the bytes at home offset `home..home + len`, for
    /// reads outside any transaction, where the engine keeps each object's committed
    /// bytes at its home (`redo`, whose commits store them there, and `undo`, which
    /// stores in place), as libpmemobj's `pmemobj_direct` does. The bytes are the
    /// committed ones only while no transaction writes them; changes must go through a
    /// transaction. The other engines keep the newest bytes elsewhere (a log, an update
    /// slot) and refuse with [`Error::NoDirectAccess`]; a range a transaction could not
    /// read is [`Error::InvalidRange`].
    pub fn direct(&self, home: u64, len: u64) -> Result<*const u8> {
        let kind = self.header().engine;
        if !matches!(kind, EngineKind::Redo | EngineKind::Undo) {
            return Err(Error::NoDirectAccess(kind));
        }
        self.engine.check_range(home, len.max(1))?;
        Ok((self.engine.media().base_address() + home as usize) as *const u8)
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
        let (durability, medium) = (self.media().durability(), self.media().medium());
        let media = self.media().counters();
        let engine = self.file().header().engine;
        let fences_per_write_tx = if media.write_transactions == 0 {
            0.0
        } else {
            media.fences as f64 / media.write_transactions as f64
        };
        let write_amplification = media.write_amplification();
        let figures = self.engine.figures();
        Stats {
            engine,
            media,
            fences_per_write_tx,
            write_amplification,
            allocations: figures.allocations,
            allocated_bytes: figures.allocated_bytes,
            dram_bytes: figures.dram_bytes,
            pm_bytes_used: figures.pm_bytes_used,
            engine_stats: figures.engine,
            durability,
            medium,
            data_checksums: figures.data_checksums,
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
    /// The in-place engines keep no log of data to compact: for them this punches the
    /// heap's free space out of the pool's files
    /// ([`PersistentHeap::defragment`](crate::alloc::PersistentHeap::defragment): free
    /// pages given back to the file system, empty extension files removed), reported
    /// in [`Compaction::defragmentation`](crate::Compaction::defragmentation) (`None`
    /// when the file system cannot punch holes).
    pub fn compact(&self) -> Compaction {
        self.engine.compact()
    }

    /// Every live allocation `(home offset, size)`, sorted (for checking tools). The
    /// log engine reports the sizes allocated; the in-place engines (`redo`, `undo`),
    /// whose allocator keeps size classes, report each block's usable size (at least
    /// the size allocated).
    pub fn allocations(&self) -> Vec<(u64, u64)> {
        self.engine.allocations()
    }

    /// Every line of user data (live allocations and the root) whose bytes do not
    /// match its data checksum, `(offset, stored, computed)`; empty when the pool keeps
    /// no data checksums (see [`Config::data_checksums`]).
    pub fn damaged_data(&self) -> Vec<(u64, u32, u32)> {
        self.engine.damaged_data()
    }

    /// Zeroes every line of user data whose data checksum fails, with its new checksum,
    /// durably, and returns the lines (for [`check::repair`](crate::check::repair)).
    pub(crate) fn scrub_damaged_data(&self) -> Vec<u64> {
        self.engine.scrub_damaged_data()
    }

    /// The pool's media, read-only (counters, durability mode, the crash simulator):
    /// stores go through transactions only.
    pub fn media(&self) -> &MediaView {
        MediaView::of(self.engine.media())
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

    /// Closes the pool cleanly: the next open needs no recovery. (Dropping the pool
    /// does the same, but cannot report an error.)
    pub fn close(self) -> Result<()> {
        self.into_engine().close()
    }

    /// Gives the pool up without closing it, as a crash would: the next open runs
    /// recovery. For tests of recovery and for tools that must not write a clean
    /// close.
    pub fn abandon(self) {
        drop(self.into_engine());
    }

    /// Stops the background work and takes the engine out of the pool, which is gone.
    fn into_engine(self) -> AnyEngine {
        let mut pool = ManuallyDrop::new(self);
        drop(pool.background.take());
        // SAFETY: `pool` is never dropped (it is in a `ManuallyDrop`), so this is the
        // only take of its engine, and nothing uses the pool after it.
        unsafe { ManuallyDrop::take(&mut pool.engine) }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        drop(self.background.take());
        // SAFETY: `drop` runs once and last; `close` and `abandon` never let it run
        // after their own take.
        let engine = unsafe { ManuallyDrop::take(&mut self.engine) };
        if std::thread::panicking() {
            // A panic may have stopped an engine operation half-way: do not record a
            // clean close over it; the next open recovers.
            drop(engine);
        } else {
            // The error cannot be returned; the next open recovers instead.
            let _ = engine.close();
        }
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
