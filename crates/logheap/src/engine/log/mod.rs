//! The log-structured engine ("Log-structured Non-volatile Main Memory", USENIX ATC 2017): the log is the home of the data.
//!
//! Every allocation and store of a committing transaction is appended to the committer's
//! logs (update, allocation, deallocation, initial data) as transaction blocks, made
//! durable with one fence, and then published in the DRAM home-to-log mapping before
//! the transaction's locks are released. Reads translate home addresses through the
//! mapping and copy from the log. On open, [`recovery`] rebuilds the mapping and the allocator from the log.
//!
//! Parts: [`layout`] (bytes on media), [`chunks`] (chunk pool, log tails), [`cleaner`]
//! (reclaiming the space of stale log data), [`log_writer`]
//! (commit-time append), [`mapping`] (home-to-log mapping), [`recovery`], [`snapshot`] (what a clean close leaves so that the next
//! open need not replay the log), [`epoch`] (the pool's own epoch-based reclamation
//! domain, which the mapping's frees and the cleaner's reclaimed chunks wait on).

mod checkpoint;
mod chunk_checks;
mod chunks;
mod cleaner;
mod commit_data;
mod damage;
mod epoch;
mod home_cache;
mod layout;
mod lifecycle;
mod log_writer;
pub(crate) mod mapping;
mod options;
mod recovery;
mod snapshot;
mod superblock;

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::LocalKey;

pub use cleaner::Compaction;
pub(crate) use cleaner::{CleanerSettings, CleanerThreads};
pub use damage::Damage;
pub use mapping::{MappingConfig, PartitionIndex};
pub use options::LogOptions;
pub(crate) use recovery::Examination;
pub use recovery::{DroppedTransaction, LogSummary, RecoveryReport, SnapshotUse};

use self::chunk_checks::ChunkRecord;
use self::chunks::{ChunkGeometry, ChunkPool};
use self::commit_data::CommitBuffers;
use self::epoch::PoolEpoch;
use self::layout::HOME_LIMIT;
use self::log_writer::{FreeLogSets, HeldLogSet, LogSet, LogWriter};
use self::mapping::{AddressMap, Mapping};
use self::snapshot::Snapshot;
use self::superblock::{CloseRecord, LogSuperblock};
use crate::alloc::TxHeap;
use crate::alloc::home::{HEAP_START, HomeHeap};
use crate::error::{Error, Result};
use crate::file::{Header, PoolFile, PoolLayout};
use crate::media::Media;
use crate::stm::Domain;
use crate::stm::SpareState;
use crate::stm::{CommitSet, Engine, Persisted};
use crate::sync::lock;

/// Home offset of the root object.
pub(crate) const ROOT_HOME: u64 = 4096;
/// Chunk generations reserved (durably) at each open; see [`LogEngine::open`].
const GENERATION_RESERVATION: u64 = 1 << 40;
/// Live bytes (as a fraction of a chunk's payload) below which a committer that found
/// no free chunk cleans a chunk (live bytes counted with their entry headers): a chunk
/// more live than this costs more than 32 bytes copied per byte gained, so a pool whose
/// chunks are all that full is full (`PoolFull`), rather than ground through ever
/// dearer cleaning passes. Growth stops earlier ([`FILL_LIMIT`]), so such a pool is
/// rare.
const URGENT_THRESHOLD: f64 = 0.97;
/// The share of the room the cleaner works in (free and sealed data chunks) that live
/// data with its entry headers may fill: a commit whose new objects would grow it
/// beyond fails with `PoolFull` ([`LogEngine::could_fit`]). Below [`URGENT_THRESHOLD`],
/// so that a full pool always has a victim worth cleaning, and stores and frees still
/// commit.
const FILL_LIMIT: f64 = 0.93;
/// How long a committer that found no free chunk waits at most, each time it cleans
/// inline, for a chunk (from cleaning, or reclaimed chunks passing their grace period).
const GRACE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a committer that found no free chunk waits, once cleaning gains nothing
/// more, for reclaimed chunks to pass their grace period while none does. Only a
/// transaction of this pool holds a grace period back (the pool has its own epoch:
/// [`epoch`]), and those are short (though on a loaded machine a pinned thread may
/// wait long for a core), unless their user keeps one open as long as it likes: then
/// waiting longer gains nothing.
const GRACE_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(1);
/// Waiting rounds after which chunks that cleaning gains no longer keep a committer
/// waiting for their grace period past [`GRACE_GIVE_UP`].
const GAINS_WAITED_FOR: usize = 64;

/// The log engine's part of a transaction's state, reused from one transaction of a
/// thread to the next.
#[derive(Debug, Default)]
pub(crate) struct LogScratch {
    /// Buffers of the commit path.
    buffers: CommitBuffers,
    /// The log set this thread's last commit appended to, kept for its next one.
    held: Option<HeldLogSet>,
    /// The transaction's guard of its pool's epoch ([`epoch`]), held from begin to
    /// finish: what it reads of the mapping and the log stays in place meanwhile. Its
    /// lookups run under it (handed down, no pin of their own), and the mapping's other
    /// pins inside the transaction are nested: a counter increment instead of a fence.
    pin: Option<crossbeam_epoch::Guard>,
    /// Free chunks the last commit that ran out of them needed at least (what
    /// [`make_room`](Engine::make_room) waits for).
    chunks_wanted: u64,
    /// What that commit adds to the live data: the bytes (and entry headers) of its
    /// allocations less the bytes it frees (stores into existing data add nothing).
    growth: i64,
}

thread_local! {
    /// A finished transaction's state, kept for the thread's next transaction.
    static SPARE_STATE: SpareState<LogScratch> = const { Cell::new(None) };
}

/// Figures of the log engine for [`Stats`](crate::Stats).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LogEngineStats {
    /// Chunks in the pool.
    pub chunks_total: u64,
    /// Chunks in no log.
    pub chunks_free: u64,
    /// The mapping configuration's name (`base` ... `full`).
    pub mapping: String,
    /// Mapping nodes.
    pub mapping_nodes: u64,
    /// Mapping partitions in use.
    pub mapping_partitions: u64,
    /// DRAM held by the mapping (directory, nodes, node caches).
    pub mapping_dram_bytes: u64,
    /// Node-cache hits.
    pub node_cache_hits: u64,
    /// Node-cache misses.
    pub node_cache_misses: u64,
    /// Hits / (hits + misses), or `None` without lookups through a cache.
    pub node_cache_hit_ratio: Option<f64>,
    /// Bytes of log data still mapped (live).
    pub live_log_bytes: u64,
    /// Chunks the cleaner reclaimed since the pool was opened.
    pub chunks_cleaned: u64,
    /// Of those, chunks reclaimed without copying (nothing in them was live).
    pub chunks_fast_cleaned: u64,
    /// Allocation checkpoints written since the pool was opened (each lets the
    /// allocation and free records it folds leave the log).
    pub allocation_checkpoints: u64,
    /// Live bytes the cleaner moved since the pool was opened.
    pub cleaner_bytes_moved: u64,
    /// Pages in the home cache (0 when it is off).
    pub home_cache_pages: u64,
    /// DRAM the home cache holds.
    pub home_cache_dram_bytes: u64,
    /// Pages the home cache filled from the log since the pool was opened.
    pub home_cache_fills: u64,
    /// Pages it evicted since the pool was opened.
    pub home_cache_evictions: u64,
    /// Reads of pages it could not cache (read through the mapping instead).
    pub home_cache_bypasses: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Bytes in live allocations.
    pub allocated_bytes: u64,
    /// What recovery found when the pool was opened.
    pub recovery: RecoveryReport,
    /// Chunks in a log not yet checked since an open that did not read them
    /// ([`RecoveryReport::chunks_unchecked`]); the background scrub takes them down
    /// to 0.
    pub chunks_unchecked: u64,
    /// Chunks whose check after the open failed: reads of data in them fail with
    /// [`Error::Corrupt`].
    pub chunks_damaged: u64,
}

/// The log-structured engine of one open pool.
#[derive(Debug)]
pub(crate) struct LogEngine {
    media: Arc<Media>,
    geometry: ChunkGeometry,
    root: Range<u64>,
    /// The concurrency-control state (the cleaner takes stripe locks too).
    stm: Arc<Domain>,
    mapping: Mapping,
    heap: HomeHeap,
    chunks: ChunkPool,
    /// The log sets no committing thread holds (see [`HeldLogSet`]).
    log_sets: Arc<FreeLogSets>,
    next_log_set: AtomicU32,
    superblock: LogSuperblock,
    cleaner: cleaner::Cleaner,
    /// The current allocation checkpoint and its chunks ([`checkpoint`]); its lock is
    /// held while a checkpoint is written.
    checkpoint: Mutex<Option<(superblock::CheckpointSlot, Vec<u32>)>>,
    /// Commits to go before the next inline cleaning pass is tried (after a pass that
    /// found nothing to clean).
    quiet: AtomicU64,
    report: RecoveryReport,
    /// The pool's reclamation domain (the mapping's too): transactions pin it, and
    /// reclaimed chunks wait for its grace periods. Its deferred functions own what
    /// they touch, so the order in which the fields drop does not matter to them.
    epoch: PoolEpoch,
    /// The DRAM home cache (`None`: reads go through the mapping).
    home_cache: Option<home_cache::HomeCache>,
    /// New objects' initial data goes to the initial-data logs, not the update logs
    /// ([`LogOptions::separate_initial_data`]).
    separate_initial: bool,
    /// The pool file (its media is `media`).
    file: PoolFile,
}

fn superblock_of(layout: &PoolLayout) -> LogSuperblock {
    LogSuperblock {
        at: layout.superblock.start as usize,
    }
}

/// The error for a damaged log: the first problem, and how many more there are.
fn corrupt(path: &std::path::Path, problems: Vec<Damage>) -> Error {
    let more = problems.len().saturating_sub(1);
    let first = problems
        .into_iter()
        .next()
        .unwrap_or_else(|| Damage::at(0, "the log is damaged".into()));
    let mut reason = match &first.log {
        Some(log) => format!("{log}: {}", first.reason),
        None => first.reason,
    };
    if more > 0 {
        reason.push_str(&format!(
            " (and {more} more problem{}; `logheap check` lists them all)",
            if more == 1 { "" } else { "s" }
        ));
    }
    Error::Corrupt {
        path: path.into(),
        offset: first.offset,
        reason,
    }
}

impl LogEngine {
    /// Formats the engine's part of a new pool (its superblock), durably. The first
    /// chunks count as formatted (a new file is zeros); more are formatted as the logs
    /// grow.
    pub(crate) fn format(media: &Media, header: &Header) {
        let geometry = ChunkGeometry::of(header);
        superblock_of(&header.layout).format(media, geometry.count.min(chunks::FORMAT_STEP_MIN));
    }

    /// Opens the engine on a pool file: reads the log and recovers the mapping, allocator
    /// and chunk state from it; refuses a damaged log before writing anything; then marks
    /// the pool open, erases what a crash left half-written, and reserves chunk
    /// generations.
    ///
    /// Chunk generations seed block checksums, so a stale block left in a reused chunk
    /// never validates. They must never repeat, even across crashes that erase the
    /// chunk headers recording them: each open durably records a high-water mark in the
    /// superblock and hands out generations below it.
    ///
    /// `options.recovery_threads` recover the log (0: one per core, see
    /// [`Config::recovery_threads`](crate::Config::recovery_threads)). `salvage` (a
    /// repair): a damaged log is cut back to before its first damage instead of being
    /// refused (see `recovery::rules::salvage_cut`).
    pub(crate) fn open(file: PoolFile, options: &LogOptions, salvage: bool) -> Result<LogEngine> {
        options.check().map_err(Error::InvalidConfig)?;
        let recovery_threads = options.recovery_threads;
        let home_cache_bytes = options.home_cache;
        let cleaning = CleanerSettings {
            threshold: options.clean_threshold,
            threads: options.cleaner_threads,
            inline: options.inline_cleaning,
            every: options.clean_every,
        };
        let media = file.media().clone();
        let layout = file.layout();
        let root_size = layout.root.end - layout.root.start;
        if ROOT_HOME + root_size > HEAP_START {
            return Err(Error::InvalidConfig(format!(
                "the log engine's root area is at most {} bytes",
                HEAP_START - ROOT_HOME
            )));
        }
        let geometry = ChunkGeometry::of(file.header());
        let superblock = superblock_of(layout);
        let corrupt = |problems: Vec<Damage>| corrupt(file.path(), problems);
        let clean = file.was_clean();
        let marks = superblock
            .read_marks(&media, clean)
            .map_err(|d| corrupt(vec![d]))?;
        let close = match clean {
            true => Some(
                superblock
                    .read_close_record(&media)
                    .map_err(|d| corrupt(vec![d]))?,
            ),
            false => None,
        };
        let snapshot = match clean {
            true => superblock.read_snapshot_locator(&media),
            false => Ok(None),
        };
        let epoch = PoolEpoch::new();
        let mapping = Mapping::with_epoch(options.mapping, epoch.clone())
            .with_node_cache_entries(options.node_cache_entries);
        let threads = recovery::threads_for(recovery_threads, &geometry, marks.formatted);
        let checkpoint = checkpoint::read_current(&media, &geometry, &superblock)
            .map_err(|d| corrupt(vec![d]))?;
        let seed = checkpoint.as_ref().map(|(_, seed)| seed);
        let recovered = recovery::recover(
            &media,
            &geometry,
            marks,
            close,
            snapshot,
            &mapping,
            (threads, seed, salvage),
        )
        .map_err(corrupt)?;

        // Accepted: from here on the pool is written. The snapshot describes the log as
        // it is now; it goes before the log changes.
        file.mark_open();
        superblock.clear_snapshot_locator(&media);
        recovered.repair(&media, &geometry);
        // Both are at most GENERATION_LIMIT (checked before), far below overflow.
        let base = marks.generation.max(recovered.max_generation);
        let reserved = base + GENERATION_RESERVATION;
        superblock.write_generation(&media, reserved);

        let chunks = ChunkPool::new(
            media.clone(),
            superblock,
            geometry,
            recovered.free_chunks,
            marks.formatted,
            base,
        );
        // The logs of the previous run go on where they ended.
        let mut log_sets: Vec<LogSet> = Vec::new();
        for t in &recovered.tails {
            let set = match log_sets.iter_mut().find(|s| s.id == t.owner) {
                Some(set) => set,
                None => {
                    log_sets.push(LogSet::new(t.owner));
                    log_sets.last_mut().expect("just pushed")
                }
            };
            set.tails[t.kind.index()].current = Some(t.tail);
        }
        // Most chunks of a large pool are empty: an atomic add on each cost more than
        // the rest of a clean open.
        for (c, &live) in recovered.live.iter().enumerate() {
            if live != 0 {
                chunks.add_live(c as u32, live);
            }
        }
        for &(c, book) in &recovered.books {
            chunks.record_book(c, book);
        }
        chunks
            .checks()
            .expect(recovered.pending.iter().copied(), &recovered.chains);
        let books = chunks.book_totals();
        debug_assert_eq!(
            (books.blocks, books.digest),
            (recovered.in_log.blocks, recovered.log_digest),
            "the chunk books disagree with what recovery found"
        );
        for (kind, chain) in &recovered.chains {
            for (k, &c) in chain.iter().enumerate() {
                chunks.link(k.checked_sub(1).map(|p| chain[p]), c, *kind);
                if !recovered.tails.iter().any(|t| t.tail.chunk == c) {
                    chunks.seal(c);
                }
            }
        }
        Ok(LogEngine {
            geometry,
            root: ROOT_HOME..ROOT_HOME + root_size,
            // Versions go on above every version seen and above the cleaned-through
            // version (a new transaction at or below it would count as committed).
            stm: Arc::new(Domain::new(
                file.header().pool_size,
                recovered.report.max_version.max(marks.cleaned),
            )),
            mapping,
            heap: HomeHeap::new(recovered.allocator, geometry.count as u64 * geometry.size),
            chunks,
            log_sets: Arc::new(Mutex::new(log_sets)),
            next_log_set: AtomicU32::new(recovered.max_owner + 1),
            superblock,
            checkpoint: Mutex::new(checkpoint.map(|(slot, seed)| (slot, seed.chunks))),
            cleaner: cleaner::Cleaner::new(cleaning, geometry.count, marks.cleaned),
            quiet: AtomicU64::new(0),
            report: recovered.report,
            media,
            epoch,
            home_cache: (home_cache_bytes > 0)
                .then(|| home_cache::HomeCache::new(home_cache_bytes, HOME_LIMIT.trailing_zeros())),
            separate_initial: options.separate_initial_data,
            file,
        })
    }

    /// Examines a pool's log read-only, collecting every problem found (for `logheap
    /// check`). `clean`: the pool was closed cleanly.
    pub(crate) fn examine(media: &Media, header: &Header, clean: bool) -> Examination {
        let layout = &header.layout;
        let geometry = ChunkGeometry::of(header);
        let superblock = superblock_of(layout);
        let mut problems = Vec::new();
        if layout.root.end - layout.root.start > HEAP_START - ROOT_HOME {
            problems.push(Damage::at(
                56,
                format!(
                    "the root area is larger than the log engine's {} bytes",
                    HEAP_START - ROOT_HOME
                ),
            ));
        }
        let marks = superblock.read_marks(media, clean).unwrap_or_else(|d| {
            problems.push(d);
            // Without a trustworthy count, read every chunk.
            superblock::Marks {
                generation: 0,
                formatted: geometry.count,
                cleaned: 0,
            }
        });
        let close = match clean {
            true => superblock
                .read_close_record(media)
                .map_err(|d| problems.push(d))
                .ok(),
            false => None,
        };
        let snapshot = match clean {
            true => superblock.read_snapshot_locator(media),
            false => Ok(None),
        };
        let mapping = Mapping::new(MappingConfig::FULL);
        let threads = recovery::threads_for(0, &geometry, marks.formatted);
        let seed = checkpoint::read_current(media, &geometry, &superblock)
            .map_err(|d| problems.push(d))
            .ok()
            .flatten()
            .map(|(_, seed)| seed);
        let mut found = recovery::examine(
            media,
            &geometry,
            marks,
            close,
            snapshot,
            &mapping,
            (threads, seed.as_ref()),
        );
        problems.append(&mut found.problems);
        found.problems = problems;
        found
    }

    /// Prepares a clean close: writes the snapshot of the mapping and the allocator (when
    /// the free chunks can hold it) and records what the log holds, durably, so the next
    /// open can check it finds exactly that and load the snapshot instead of replaying
    /// the log. The caller then marks the pool closed.
    pub(crate) fn prepare_close(&self) {
        // No commit or cleaning is in progress (closing takes the pool): the chunk books
        // hold every committed block in the log. Transactions (distinct versions: the
        // cleaner's copies share their source's version) are counted from the log.
        let books = self.chunks.book_totals();
        let record = CloseRecord {
            max_version: books.max_version,
            transactions: recovery::committed_transactions(
                &self.media,
                &self.geometry,
                self.chunks.formatted(),
            ),
            blocks: books.blocks,
            // The allocation checkpoint's chunks are in no log.
            chunks_in_use: self.chunks.in_use()
                - lock(&self.checkpoint)
                    .as_ref()
                    .map_or(0, |(_, chunks)| chunks.len() as u64),
        };
        let log_digest = books.digest;
        // The mapping reports its pieces in home order (partitions in order, each
        // sorted); were they not, loading the snapshot would refuse it.
        let mut snapshot = Snapshot::new(record, log_digest);
        self.mapping.for_each_piece(|p| snapshot.push_piece(p));
        for (home, size) in self.heap.allocations() {
            snapshot.push_allocation(home, size);
        }
        if let Some(table) = self.chunk_table(record.chunks_in_use) {
            snapshot.push_chunk_table(&table);
        }
        if let Some(at) = snapshot.write(&self.media, &self.geometry, &self.chunks.unused()) {
            self.superblock.write_snapshot_locator(&self.media, &at);
        }
        self.superblock.write_close_record(&self.media, &record);
    }

    /// A record of every chunk in a log (its header and its book), for the clean-close
    /// snapshot; `None` when the headers are not `chunks_in_use` valid ones (then the
    /// next open reads the log, which finds what is wrong). A chunk not checked since
    /// the open, or whose check failed, keeps the header it should have (so the next
    /// open checks it again, and finds the same); the others' are read now.
    fn chunk_table(&self, chunks_in_use: u64) -> Option<Vec<ChunkRecord>> {
        let mut head = [0u8; layout::CHUNK_HEADER];
        let mut table = Vec::new();
        for c in 0..self.chunks.formatted() {
            let header = match self.chunks.checks().recorded_header(c) {
                Some(header) => header,
                None => {
                    self.media.read(self.geometry.offset(c) as usize, &mut head);
                    match layout::HeaderState::of(&head) {
                        layout::HeaderState::Free => continue,
                        layout::HeaderState::Valid(header) => header,
                        _ => return None,
                    }
                }
            };
            table.push(ChunkRecord {
                index: c,
                header,
                book: self.chunks.book_of(c),
            });
        }
        (table.len() as u64 == chunks_in_use).then_some(table)
    }

    /// The home range of the root object.
    pub(crate) fn root(&self) -> Range<u64> {
        self.root.clone()
    }

    pub(super) fn checkout_log_set(&self) -> LogSet {
        lock(&self.log_sets)
            .pop()
            .unwrap_or_else(|| LogSet::new(self.next_log_set.fetch_add(1, Ordering::Relaxed)))
    }

    /// Whether a commit adding `growth` bytes to the live data (its allocations with
    /// their entry headers, less what it frees) leaves live data within
    /// [`FILL_LIMIT`] of the room the cleaner works in: when not, waiting for the
    /// cleaner is pointless and the commit fails with `PoolFull` at once. A commit that
    /// frees at least what it allocates (or only stores) always may wait: that is how a
    /// full pool is emptied.
    fn could_fit(&self, growth: i64) -> bool {
        if growth <= 0 {
            return true;
        }
        // The room: free chunks (but the cleaner's reserve) and sealed data chunks,
        // with the live data (and its entry headers, as the cleaner packs it) of those
        // chunks. The logs' tails, allocation records and checkpoints are left out on
        // both sides. Filled to `FILL_LIMIT` of it, some victim is at most that live,
        // below the urgent threshold: cleaning always gains.
        let payload = self.geometry.size - layout::CHUNK_HEADER as u64;
        let (mut sealed, mut live) = (0u64, 0i64);
        for c in 0..self.geometry.count {
            if self.chunks.is_sealed(c) && !self.chunks.holds_records(c) {
                sealed += 1;
                live = live.saturating_add(self.chunks.live_with_headers(c));
            }
        }
        let free = self
            .chunks
            .free_count()
            .saturating_sub(self.chunks.reserve());
        let room = (free + sealed) * payload;
        live.saturating_add(growth) as f64 <= room as f64 * FILL_LIMIT
    }

    /// Free chunks below which committing threads clean inline.
    pub(super) fn low_water(&self) -> u64 {
        (self.geometry.count as u64 / 16).clamp(2, 64)
    }

    /// Runs the cleaner in a committing thread (which holds no stripe lock), without the
    /// transaction's epoch pin so that reclaimed chunks can pass their grace period.
    /// `urgent`: the commit found no free chunk, so any chunk up to
    /// [`URGENT_THRESHOLD`] live may be cleaned, and the thread waits for grace periods (and for the background cleaners,
    /// which it wakes; it cleans itself only with inline cleaning on); returns whether
    /// a chunk could be taken (at some moment: another committer may have taken it).
    fn clean_inline(&self, s: &mut LogScratch, urgent: bool) -> bool {
        let inline = self.cleaner.settings.inline;
        let background = self.cleaner.settings.threads > 0;
        // A commit may need chunks in several logs at once: one free chunk is not
        // room for it.
        let wanted = s.chunks_wanted.max(1);
        if urgent && background {
            self.cleaner.wanted.fetch_max(wanted, Ordering::AcqRel);
            self.cleaner.stalled.store(false, Ordering::Release);
            self.cleaner.wakeup.notify();
        }
        if !urgent && self.quiet.load(Ordering::Relaxed) > 0 {
            self.quiet.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        s.pin = None;
        let threshold = if urgent {
            URGENT_THRESHOLD.max(self.cleaner.settings.threshold)
        } else {
            self.cleaner.settings.threshold
        };
        let clean = || if inline { self.clean(threshold) } else { 0 };
        let mut free = self.chunks.free_count();
        let cleaned = clean();
        // A chunk could be taken at some moment (another committer may take it first).
        let mut came = false;
        if urgent {
            // Wait while a chunk may still come, up to a bound: another pass may be
            // running, and reclaimed chunks come back once every transaction of this
            // pool that was open when they were reclaimed has finished (this thread's
            // flushes then move the pool's epoch on; nothing outside the pool holds it
            // back). A pass that frees no chunk on balance (moving live data takes as
            // many chunks as it frees) with none in its grace period ends the wait: the
            // pool is full of live data.
            let start = std::time::Instant::now();
            let (mut waiting, mut moved) = (self.chunks.waiting(), start);
            for round in 0.. {
                if self.chunks.available() >= wanted {
                    came = true;
                    break;
                }
                if start.elapsed() > GRACE_WAIT {
                    break;
                }
                self.epoch.pin().flush();
                if round % 8 == 7 {
                    if !inline {
                        self.cleaner.wanted.fetch_max(wanted, Ordering::AcqRel);
                        self.cleaner.wakeup.notify();
                    }
                    clean();
                    let now = self.chunks.free_count();
                    // Without inline cleaning, the background cleaners gain for it until
                    // a pass of theirs finds nothing (within the overall bound).
                    // A compaction in progress holds the committers' pass and
                    // reclaims chunks as it goes: keep waiting for it.
                    let gaining = if inline {
                        now > free && round <= GAINS_WAITED_FOR
                    } else {
                        !self.cleaner.stalled.load(Ordering::Acquire)
                    } || self.cleaner.compacting.load(Ordering::Acquire);
                    free = now;
                    // Chunks in their grace period are worth waiting for while grace
                    // periods still end (the pool's transactions may still end soon:
                    // one held open by its user stops them).
                    let still = self.chunks.waiting();
                    if still < waiting {
                        moved = std::time::Instant::now();
                    }
                    waiting = still;
                    let in_grace = still > 0 && moved.elapsed() <= GRACE_GIVE_UP;
                    if !gaining && !in_grace {
                        break;
                    }
                }
                // Spin briefly, then sleep: the threads being waited for (the pool's
                // transactions, the background cleaners) need the cores.
                if round < GAINS_WAITED_FOR {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            }
        } else if cleaned == 0 {
            self.quiet
                .store(self.geometry.count as u64 / 4 + 16, Ordering::Relaxed);
        }
        s.pin = Some(self.epoch.pin());
        came || self.chunks.available() >= wanted
    }

    /// Engine figures.
    pub(crate) fn stats(&self) -> LogEngineStats {
        let (allocations, allocated_bytes) = self.heap.live();
        let home = self
            .home_cache
            .as_ref()
            .map(|c| c.figures())
            .unwrap_or_default();
        let cache = self.mapping.cache_figures();
        let lookups = cache.hits + cache.misses;
        LogEngineStats {
            chunks_total: self.geometry.count as u64,
            chunks_free: self.chunks.free_count(),
            mapping: self.mapping.config().label(),
            mapping_nodes: self.mapping.nodes(),
            mapping_partitions: self.mapping.partition_count(),
            mapping_dram_bytes: self.mapping.dram_bytes(),
            node_cache_hits: cache.hits,
            node_cache_misses: cache.misses,
            node_cache_hit_ratio: (lookups > 0).then(|| cache.hits as f64 / lookups as f64),
            live_log_bytes: self.chunks.total_live_bytes().max(0) as u64,
            chunks_cleaned: self.cleaner.chunks_cleaned.load(Ordering::Relaxed),
            chunks_fast_cleaned: self.cleaner.chunks_fast_cleaned.load(Ordering::Relaxed),
            allocation_checkpoints: self.cleaner.checkpoints.load(Ordering::Relaxed),
            cleaner_bytes_moved: self.cleaner.bytes_moved.load(Ordering::Relaxed),
            home_cache_pages: home.pages,
            home_cache_dram_bytes: self.home_cache.as_ref().map_or(0, |c| c.dram_bytes()),
            home_cache_fills: home.fills,
            home_cache_evictions: home.evictions,
            home_cache_bypasses: home.bypasses,
            allocations,
            allocated_bytes,
            recovery: self.report.clone(),
            chunks_unchecked: self.chunks.checks().pending(),
            chunks_damaged: self.chunks.checks().damaged(),
        }
    }
}

impl Engine for LogEngine {
    type Scratch = LogScratch;
    type Heap = HomeHeap;
    const FRESH_BLOCKS_READ_ZERO: bool = true;

    fn spare() -> &'static LocalKey<SpareState<LogScratch>> {
        &SPARE_STATE
    }

    fn shared(&self) -> &Arc<Domain> {
        &self.stm
    }

    fn media(&self) -> &Arc<Media> {
        &self.media
    }

    fn heap(&self) -> &HomeHeap {
        &self.heap
    }

    #[inline]
    fn begin(&self, s: &mut LogScratch) {
        s.pin = Some(self.epoch.pin());
    }

    #[inline]
    fn end(s: &mut LogScratch) {
        s.pin = None;
    }

    #[inline]
    fn check_range(&self, home: u64, len: u64) -> Result<()> {
        if home < ROOT_HOME || len == 0 || home.checked_add(len).is_none_or(|e| e > HOME_LIMIT) {
            return Err(Error::InvalidRange { home, len });
        }
        Ok(())
    }

    /// Under the transaction's guard of the pool's epoch, when it holds one (it always
    /// does outside [`clean_inline`](LogEngine::clean_inline)): handed down to the
    /// mapping, it spares the lookup a pin of its own.
    #[inline]
    fn read_committed(&self, s: &LogScratch, home: u64, buf: &mut [u8]) -> bool {
        // Blocks' CRCs are checked when the log is read whole (recovery, a chunk's
        // check after an open that loaded the snapshot, the cleaner), not per read;
        // a read of a chunk whose check failed fails.
        match (&self.home_cache, &s.pin) {
            (Some(cache), Some(guard)) => self.read_cached(cache, guard, home, buf),
            _ => self.read_mapped(s.pin.as_ref(), home, buf),
        }
    }

    /// A read met a chunk whose check failed ([`chunk_checks`]): the error names the
    /// first such chunk the range maps into.
    fn read_damage(&self, home: u64, len: u64) -> Error {
        let checks = self.chunks.checks();
        let mut chunk = None;
        self.mapping.lookup(home, len, |x| {
            if let Some(log) = x.log
                && chunk.is_none()
                && checks.is_damaged(self.geometry.chunk_of(log))
            {
                chunk = Some(self.geometry.chunk_of(log));
            }
        });
        let found = checks.damage_of(chunk);
        Error::Corrupt {
            path: self.file.path().into(),
            offset: found.as_ref().map_or(0, |d| d.offset),
            reason: format!(
                "the log holding home {home:#x}+{len} is damaged: {}",
                found.map_or_else(|| "a chunk failed its check".into(), |d| d.reason)
            ),
        }
    }

    const KEEPS_COMMITTED_IN_PLACE: bool = true;

    /// A range the mapping holds in one run of the log (a value written whole in one
    /// transaction and not partly rewritten since), where it lies. Committed log
    /// bytes are never written again until their chunk is reclaimed, which waits for
    /// every guard of the pool's epoch taken before: the transaction's own (`s.pin`,
    /// held until it finishes) keeps them in place.
    fn committed_in_place<'s>(
        &'s self,
        s: &'s LogScratch,
        home: u64,
        len: u64,
    ) -> Option<&'s [u8]> {
        let guard = s.pin.as_ref()?;
        // The extents must follow one another in the log as they do at home (a range
        // over several partitions comes as one extent per partition).
        let mut start = None;
        let mut next = Some(home);
        self.mapping
            .lookup_pinned(guard, home, len, |x| match (x.log, start) {
                (Some(log), None) if next == Some(x.home) => {
                    start = Some(log);
                    next = Some(x.home + x.len);
                }
                (Some(log), Some(first))
                    if next == Some(x.home) && log == first + (x.home - home) =>
                {
                    next = Some(x.home + x.len);
                }
                _ => next = None,
            });
        let log = start.filter(|_| next == Some(home + len))?;
        // Not before the chunk is checked (else the copying read reports the damage).
        if !self.chunks.readable(self.geometry.chunk_of(log)) {
            return None;
        }
        // SAFETY: the bytes at `log` are committed log bytes (the mapping points at
        // nothing else), which nothing stores to while `s.pin`, which the slice's
        // lifetime borrows, is held (see above).
        Some(unsafe { self.media.bytes_in_place(log as usize, len as usize) })
    }

    /// Cleans when free chunks run low (or every [`CleanerSettings::every`] commits).
    fn before_commit(&self, s: &mut LogScratch) {
        if self.chunks.available() < self.low_water() {
            if self.cleaner.settings.threads > 0 {
                self.cleaner.wakeup.notify();
            }
            if self.cleaner.settings.inline {
                self.clean_inline(s, false);
            }
        } else if self.cleaner.settings.every > 0
            && self.cleaner.settings.inline
            && self
                .cleaner
                .commits
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(self.cleaner.settings.every)
        {
            s.pin = None; // as in `clean_inline`: reclaimed chunks pass their grace period
            self.clean(self.cleaner.settings.threshold);
            s.pin = Some(self.epoch.pin());
        }
    }

    /// Appends the transaction's blocks to a log set (its update, allocation,
    /// deallocation and initial-data logs) with one fence.
    fn persist(&self, set: &CommitSet<'_>, s: &mut LogScratch) -> Result<Persisted> {
        let b = &mut s.buffers;
        let a = set.allocs;
        let payload = b.stage(
            set.writes,
            &a.allocs,
            &a.frees,
            &a.alloc_then_freed,
            self.mapping.config().group_update,
            self.separate_initial,
        );
        if b.is_empty() {
            return Ok(Persisted::Nothing);
        }
        // The set this thread committed with last, if it is this pool's.
        let mut logs = s
            .held
            .take()
            .and_then(|held| held.take_for(&self.log_sets))
            .unwrap_or_else(|| self.checkout_log_set());
        let writer = LogWriter {
            media: &self.media,
            geometry: &self.geometry,
            pool: &self.chunks,
        };
        let [update, alloc, dealloc, initial] = &b.logs;
        let appended = writer.append(
            &mut logs,
            [update, alloc, dealloc, initial],
            &b.staging,
            set.version,
            &mut b.placed,
        );
        s.held = Some(HeldLogSet::new(logs, &self.log_sets));
        match appended {
            Ok(_) => Ok(Persisted::Durable { payload }),
            Err(short) => {
                s.chunks_wanted = short.needed;
                let sizes = |list: &[(u64, u64)]| list.iter().map(|&(_, n)| n as i64).sum::<i64>();
                s.growth = sizes(&a.allocs) + (a.allocs.len() * layout::ENTRY_HEADER) as i64
                    - sizes(&a.frees);
                Err(Error::PoolFull)
            }
        }
    }

    /// Points the mapping at the new log data (and away from what the frees end).
    fn publish(&self, set: &CommitSet<'_>, s: &mut LogScratch) {
        let map = &self.mapping;
        let chunks = &self.chunks;
        let geometry = &self.geometry;
        let mut displaced =
            |log: u64, bytes: u64| chunks.add_live(geometry.chunk_of(log), -(bytes as i64));
        for &(home, size) in &set.allocs.frees {
            map.remove(home, size, &mut displaced);
        }
        for p in &s.buffers.placed {
            map.insert(p.home, p.len, p.log, &mut displaced);
            chunks.add_live(geometry.chunk_of(p.log), p.len as i64);
        }
        if let Some(cache) = &self.home_cache {
            let own;
            let guard = match &s.pin {
                Some(guard) => guard,
                None => {
                    own = self.epoch.pin();
                    &own
                }
            };
            self.publish_to_cache(cache, guard, set, &s.buffers);
        }
    }

    /// Back pressure: out of chunks, clean (or wait for the cleaner) and try again;
    /// `PoolFull` only when cleaning frees nothing. A chunk that another committer took
    /// first is no sign of a full pool: then try again, within a time bound.
    fn make_room(&self, s: &mut LogScratch, since: std::time::Instant) -> bool {
        self.cleaner.enabled()
            && self.could_fit(s.growth)
            && since.elapsed() <= GRACE_WAIT
            && self.clean_inline(s, true)
    }
}
