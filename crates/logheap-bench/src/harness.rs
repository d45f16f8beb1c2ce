//! Runs one benchmark: a fresh pool, the workload's preload, then the measured phase on
//! any number of threads, and the figures of that phase.
//!
//! Besides the engines the library knows by name, `log-cleaning` is the log engine in
//! the paper's "LSNVMM-Cleaning" setting ([`LOG_CLEANING`]) and `log-mixed` the log
//! engine with one log for stores and new objects' data ([`LOG_MIXED`]); with
//! [`RunSpec::utilisation`] the pool is sized so that the preloaded data fills that
//! share of the log, so the cleaner works throughout the measured phase (Fig. 11); and
//! the fragmentation workloads run through [`crate::fragmentation`] (Fig. 9).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use logheap::{Config, Emulation, EngineConfig, LogOptions, MappingConfig, Pool};

use crate::workload::{Lookups, Op, Prepared, Shape, Workload, preload_rng};

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Engine name (`log`, `log-base`, `log-2l`, `log-2l-gu`, `log-2l-gu-c`, ...; `pmdk`
    /// for PMDK's libpmemobj).
    pub engine: String,
    /// The workload.
    pub workload: Workload,
    /// Threads running transactions in the measured phase.
    pub threads: usize,
    /// Transactions in the measured phase (over all threads).
    pub ops: u64,
    /// Elements preloaded.
    pub elements: u64,
    /// Value size in bytes.
    pub value_size: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// NVM emulation at each fence (`None`: off; `pmdk` runs without it).
    pub emulation: Option<Emulation>,
    /// Directory for the pool file (default: `/dev/shm` when present).
    pub dir: Option<PathBuf>,
    /// Size the pool so that the live data after the preload is this share of the log
    /// (chunks x chunk size); `None`: room for every log block of the run, so nothing
    /// needs cleaning. Transactions refused with `PoolFull` are counted, not fatal.
    pub utilisation: Option<f64>,
    /// Sizes of the fragmentation workloads.
    pub frag: FragOptions,
    /// Ends the measured phase after this long even when transactions are left (the
    /// figures then cover the transactions run; `SpaceFigures::time_limited` says so).
    pub time_limit: Option<std::time::Duration>,
    /// Background cleaner threads of a log engine (0: the cleaner runs only inline, in
    /// committing threads; otherwise committers still help when free chunks run out).
    pub cleaner_threads: usize,
    /// Allocations per transaction of `alloc-batch` (ignored by the other workloads).
    pub alloc_batch: usize,
    /// The home cache's budget in bytes on the log engines that have one (`None`: the
    /// engine name's default; refused on an engine without the cache).
    pub home_cache: Option<u64>,
    /// Entries of each thread's mapping node cache on the log engines that have one
    /// (`None`: the default, 8,192; refused on an engine without it).
    pub node_cache: Option<usize>,
    /// Data checksums on the in-place engines ([`logheap::Config::data_checksums`];
    /// refused on the log engines).
    pub data_checksums: bool,
}

/// Sizes of the fragmentation workloads ([`crate::fragmentation`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FragOptions {
    /// Live bytes at most (default 16 MiB).
    pub live: u64,
    /// Bytes allocated by each phase, as a multiple of `live` (default 5, as in the
    /// FAST 2014 workloads: 50 GB allocated with 10 GB live).
    pub total_ratio: u64,
    /// Allocations per transaction on the log engine (default 1).
    pub batch: u64,
    /// The log engine's pool size; `None`: the smallest that runs (see
    /// [`FragSpec::pool_size`](crate::fragmentation::FragSpec::pool_size)).
    pub pool_size: Option<u64>,
}

impl Default for FragOptions {
    fn default() -> Self {
        FragOptions {
            live: 16 << 20,
            total_ratio: 5,
            batch: 1,
            pool_size: None,
        }
    }
}

/// The engine name of the log engine in the "LSNVMM-Cleaning" setting of "Log-structured
/// Non-volatile Main Memory" (USENIX ATC 2017, §5.3): chunks more than half stale are
/// cleaned every [`CLEAN_EVERY`] commits, whether space is short or not.
pub const LOG_CLEANING: &str = "log-cleaning";
/// Commits between the cleaning passes of [`LOG_CLEANING`].
pub const CLEAN_EVERY: u64 = 1000;
/// The engine name of the log engine with new objects' initial data in the update log
/// rather than a log of its own (`Config::separate_initial_data(false)`): the baseline
/// of Fig. 10 of "Log-structured Non-volatile Main Memory" (one log for stores and
/// allocations, against the separate logs of `log`).
pub const LOG_MIXED: &str = "log-mixed";

/// The pool configuration of a logheap engine name (the library's names,
/// [`LOG_CLEANING`] and [`LOG_MIXED`]).
pub fn config_for(engine: &str) -> Result<Config, String> {
    if engine == LOG_CLEANING {
        return Ok(Config::default()
            .clean_threshold(0.5)
            .clean_every(CLEAN_EVERY));
    }
    if engine == LOG_MIXED {
        return Ok(Config::default().separate_initial_data(false));
    }
    Ok(Config::default().engine(engine.parse::<EngineConfig>()?))
}

/// The configuration of `engine` with `cleaner_threads` background cleaner threads
/// ([`config_for`], then [`Config::cleaner_threads`]).
pub fn config_with_cleaners(engine: &str, cleaner_threads: usize) -> Result<Config, String> {
    Ok(config_for(engine)?.cleaner_threads(cleaner_threads))
}

/// The figures of one run's measured phase.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunResult {
    /// Engine name.
    pub engine: String,
    /// Mapping configuration label (`base` ... `full`).
    pub config: String,
    /// Workload name.
    pub workload: Workload,
    /// Threads.
    pub threads: usize,
    /// Transactions measured.
    pub ops: u64,
    /// Elements preloaded.
    pub elements: u64,
    /// Value size.
    pub value_size: usize,
    /// The durability mode the pool ran in and its medium (`pmem (memory medium)`:
    /// what [`logheap::Durability::Auto`] chose); `None` where no logheap pool ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    /// Whether NVM emulation was on (never for `pmdk`).
    pub emulated: bool,
    /// Wall time of the measured phase.
    pub seconds: f64,
    /// Committed transactions per second (allocator workloads: operations per second).
    pub tx_per_s: f64,
    /// Allocator workloads: allocations and frees per second (`None` elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_per_s: Option<f64>,
    /// `alloc-batch`: allocations per transaction (`None` elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_batch: Option<usize>,
    /// Fences per transaction (`None`: not measured, as on `pmdk`).
    #[serde(default)]
    pub fences_per_tx: Option<f64>,
    /// Fences per transaction that wrote something (`None`: not measured).
    #[serde(default)]
    pub fences_per_write_tx: Option<f64>,
    /// Cache lines flushed per transaction (`None`: not measured).
    #[serde(default)]
    pub lines_flushed_per_tx: Option<f64>,
    /// Non-temporal bytes per transaction (`None`: not measured).
    #[serde(default)]
    pub nt_bytes_per_tx: Option<f64>,
    /// Media bytes (64 x lines + non-temporal bytes) per transaction (`None`: not
    /// measured).
    #[serde(default)]
    pub media_bytes_per_tx: Option<f64>,
    /// Bytes stored to the media per transaction: the modified part of the write
    /// traffic, the paper's "dirty bytes" (Fig. 8; `None`: not measured).
    #[serde(default)]
    pub dirty_bytes_per_tx: Option<f64>,
    /// Payload bytes per transaction (`None`: not measured).
    #[serde(default)]
    pub payload_bytes_per_tx: Option<f64>,
    /// Media bytes / payload bytes (`None`: not measured, or nothing written).
    #[serde(default)]
    pub write_amplification: Option<f64>,
    /// Nanoseconds of NVM emulation delay per transaction (`None`: not measured, or the
    /// run was not emulated).
    #[serde(default)]
    pub emulated_ns_per_tx: Option<f64>,
    /// Aborted attempts per committed transaction.
    pub aborts_per_tx: f64,
    /// Read-heavy workloads: look-ups run in the measured phase (they count as
    /// transactions in `ops` and `tx_per_s`; `None` for the other workloads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookups: Option<u64>,
    /// Read-heavy workloads: of those, the look-ups that found their key (the same on
    /// every engine for the same operations on one thread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookups_found: Option<u64>,
    /// Node-cache hit ratio in the measured phase (`None` without node caches).
    #[serde(default)]
    pub node_cache_hit_ratio: Option<f64>,
    /// DRAM the engine holds to find the data (`Stats::dram_bytes`): on the log
    /// engines the mapping (nodes, directory, node caches) and the home cache; on the
    /// in-place ones their allocator's DRAM state. `None`: not measured (`pmdk`).
    #[serde(default)]
    pub dram_bytes: Option<u64>,
    /// Persistent memory in use: logheap, the chunks holding log data; `pmdk`, the
    /// usable size of every live object (a heap walk after the measured phase).
    #[serde(default)]
    pub pm_bytes_used: Option<u64>,
    /// Time of the preload.
    pub preload_seconds: f64,
    /// Fragmentation, utilisation and cleaner figures (absent where they do not apply).
    #[serde(flatten)]
    pub space: SpaceFigures,
}

impl RunResult {
    /// A result for `engine` running `workload` on `threads` threads, with every
    /// measured figure zero or absent: engines that measure only some figures (PMDK,
    /// the allocator workloads) fill those in.
    pub fn unmeasured(engine: &str, workload: Workload, threads: usize) -> RunResult {
        RunResult {
            engine: engine.into(),
            config: engine.into(),
            workload,
            threads,
            ops: 0,
            elements: 0,
            value_size: 0,
            durability: None,
            emulated: false,
            seconds: 0.0,
            tx_per_s: 0.0,
            ops_per_s: None,
            alloc_batch: None,
            fences_per_tx: None,
            fences_per_write_tx: None,
            lines_flushed_per_tx: None,
            nt_bytes_per_tx: None,
            media_bytes_per_tx: None,
            dirty_bytes_per_tx: None,
            payload_bytes_per_tx: None,
            write_amplification: None,
            emulated_ns_per_tx: None,
            aborts_per_tx: 0.0,
            lookups: None,
            lookups_found: None,
            node_cache_hit_ratio: None,
            dram_bytes: None,
            pm_bytes_used: None,
            preload_seconds: 0.0,
            space: SpaceFigures::default(),
        }
    }
}

/// The figures of issue 10's benchmarks: fragmentation (Fig. 9), and log utilisation
/// and cleaning (Fig. 11, LSNVMM-Cleaning). Each is `None` where it does not apply.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpaceFigures {
    /// 1 - live bytes / held bytes at the end of a fragmentation workload.
    #[serde(default)]
    pub fragmentation: Option<f64>,
    /// Bytes the fragmentation workload has allocated at the end (the sizes asked for).
    #[serde(default)]
    pub live_bytes: Option<u64>,
    /// Bytes the allocator holds for them: the log engine's chunks in use x chunk size,
    /// glibc's `arena + hblkhd` (less what others used), jemalloc's `stats.active`.
    #[serde(default)]
    pub held_bytes: Option<u64>,
    /// Log engine: 1 - live bytes / bytes held after compacting the log at the end
    /// ([`logheap::Pool::compact`]).
    #[serde(default)]
    pub compacted_fragmentation: Option<f64>,
    /// Log engine: the bytes held after compacting the log at the end.
    #[serde(default)]
    pub compacted_held_bytes: Option<u64>,
    /// The allocator's own count of bytes in use: glibc's `uordblks`, jemalloc's
    /// `stats.allocated`, the log engine's live (mapped) log bytes.
    #[serde(default)]
    pub allocator_bytes: Option<u64>,
    /// jemalloc's `stats.resident` growth over the run.
    #[serde(default)]
    pub resident_bytes: Option<u64>,
    /// Allocations made by a fragmentation workload.
    #[serde(default)]
    pub allocations: Option<u64>,
    /// Frees made by a fragmentation workload.
    #[serde(default)]
    pub frees: Option<u64>,
    /// The log engine's pool size, where the run chose it.
    #[serde(default)]
    pub pool_bytes: Option<u64>,
    /// Live log bytes after the preload / (chunks x chunk size).
    #[serde(default)]
    pub utilisation: Option<f64>,
    /// Transactions refused with `PoolFull` in the measured phase.
    #[serde(default)]
    pub pool_full: Option<u64>,
    /// Bytes the measured phase wrote to the log / the log's size: how many times over
    /// the log was written.
    #[serde(default)]
    pub log_turnover: Option<f64>,
    /// Chunks the cleaner reclaimed in the measured phase.
    #[serde(default)]
    pub chunks_cleaned: Option<u64>,
    /// Of those, chunks reclaimed without copying.
    #[serde(default)]
    pub chunks_fast_cleaned: Option<u64>,
    /// Live bytes the cleaner moved in the measured phase.
    #[serde(default)]
    pub cleaner_bytes_moved: Option<u64>,
    /// Chunk bytes reclaimed per second of the measured phase (MB/s).
    #[serde(default)]
    pub reclaimed_mb_per_s: Option<f64>,
    /// Live bytes moved per second of the measured phase (MB/s).
    #[serde(default)]
    pub moved_mb_per_s: Option<f64>,
    /// The measured phase ended at its time limit before all its transactions ran.
    #[serde(default)]
    pub time_limited: Option<bool>,
    /// Background cleaner threads of a log-engine run (`None`: not a log engine, or a
    /// result written before this was recorded).
    #[serde(default)]
    pub cleaner_threads: Option<usize>,
}

/// Pool size for a run: room for the preload and every measured transaction's log
/// blocks (nothing is cleaned), on a sparse tmpfs file. `pmdk` uses the same size, but
/// `pmemobj_create` allocates the whole file up front.
pub(crate) fn pool_size(spec: &RunSpec) -> u64 {
    let per_item = 4 * (spec.value_size as u64 + 512);
    (256 << 20) + (spec.elements + spec.ops) * per_item
}

/// Runs `work(t)` for every thread `t` of `threads`, all at once; returns the wall time
/// until the last one finished, or the first error.
pub(crate) fn run_timed<E>(
    threads: usize,
    work: impl Fn(usize) -> Result<(), E> + Sync,
) -> Result<f64, Box<dyn std::error::Error>>
where
    E: Into<Box<dyn std::error::Error>> + Send,
{
    let start = Instant::now();
    std::thread::scope(|s| -> Result<(), Box<dyn std::error::Error>> {
        let work = &work;
        let workers: Vec<_> = (0..threads).map(|t| s.spawn(move || work(t))).collect();
        for w in workers {
            w.join()
                .map_err(|_| "a workload thread panicked")?
                .map_err(Into::into)?;
        }
        Ok(())
    })?;
    Ok(start.elapsed().as_secs_f64())
}

/// Runs `spec` on a fresh pool and returns its figures.
pub fn run(spec: &RunSpec) -> Result<RunResult, Box<dyn std::error::Error>> {
    run_reporting(spec, &|_| {})
}

/// A fresh directory for a run's pool file, removed when dropped: under `spec.dir`,
/// else `/dev/shm` when present, else the temporary directory.
pub(crate) fn pool_dir(spec: &RunSpec) -> Result<tempfile::TempDir, String> {
    pool_dir_in(spec.dir.as_deref())
}

/// A fresh directory for a pool file, removed when dropped: under `dir`, else
/// `/dev/shm` when present, else the temporary directory.
pub(crate) fn pool_dir_in(dir: Option<&Path>) -> Result<tempfile::TempDir, String> {
    let parent: PathBuf = match dir {
        Some(d) => d.to_path_buf(),
        None if Path::new("/dev/shm").is_dir() => "/dev/shm".into(),
        None => std::env::temp_dir(),
    };
    tempfile::Builder::new()
        .prefix("logheap-bench-")
        .tempdir_in(&parent)
        .map_err(|e| format!("{}: cannot make a pool directory: {e}", parent.display()))
}

/// [`run`], telling `phase` what it is doing ("preloading ...", "measuring ...").
///
/// The engine `pmdk` runs the same workloads on PMDK's libpmemobj ([`crate::pmdk`]);
/// when this build has no PMDK it is an error saying so
/// ([`pmdk::UNAVAILABLE`](crate::pmdk::UNAVAILABLE)). The fragmentation workloads run
/// through [`crate::fragmentation`] (on the log engine, the persistent heap, `glibc` or
/// `jemalloc`).
pub fn run_reporting(
    spec: &RunSpec,
    phase: &dyn Fn(&str),
) -> Result<RunResult, Box<dyn std::error::Error>> {
    if spec.workload.is_fragmentation() {
        return run_fragmentation(spec, phase);
    }
    match spec.workload {
        Workload::AllocRandom => return crate::alloc_bench::run(spec, phase),
        Workload::AllocBatch => return crate::alloc_batch::run(spec, phase),
        _ => {}
    }
    if spec.engine == crate::pmdk::ENGINE {
        if spec.workload.is_from_other_documents() {
            return Err(format!(
                "pmdk does not run {} (the PMDK peer engine has the paper's workloads only)",
                spec.workload
            )
            .into());
        }
        return crate::pmdk::run_reporting(spec, phase);
    }
    if crate::fragmentation::is_dram_allocator(&spec.engine) {
        return Err(format!(
            "{} runs only the fragmentation workloads (frag-w1, frag-w2, frag-w3)",
            spec.engine
        )
        .into());
    }
    let dir = pool_dir(spec)?;
    // Without a utilisation the pool is sized for every log block the run writes
    // (nothing is cleaned), far beyond what it holds at any time: a sparse file, so it
    // takes only what is written.
    let size = match spec.utilisation {
        None => pool_size(spec),
        Some(u) => sized_for(spec, u, phase)?,
    };
    let mut config = config_with_cleaners(&spec.engine, spec.cleaner_threads)?
        .size(size)
        .reserve_space(false);
    if let Some(bytes) = spec.home_cache {
        config = match config.engine {
            EngineConfig::Log(o) if o.home_cache > 0 => config.engine(o.home_cache(bytes)),
            _ => {
                return Err(format!(
                    "--home-cache: engine {} has no home cache (log has; log-nocache and the ablation ladder read through the mapping)",
                    spec.engine
                )
                .into());
            }
        };
    }
    if let Some(entries) = spec.node_cache {
        config = match config.engine {
            EngineConfig::Log(o) if o.mapping.node_cache => {
                config.engine(o.node_cache_entries(entries))
            }
            _ => {
                return Err(format!(
                    "--node-cache: engine {} has no mapping node cache (log, log-2l-gu-c and log-2l-gu-c-skiplist have)",
                    spec.engine
                )
                .into());
            }
        };
    }
    if spec.data_checksums {
        config = config.data_checksums(true);
    }
    if let Some(e) = spec.emulation {
        config = config.emulation(e);
    }
    let pool = Pool::create(dir.path().join("bench.pool"), &config)?;
    let mut rng = preload_rng(spec.seed);
    let start = Instant::now();
    let shape = Shape {
        elements: spec.elements,
        value_size: spec.value_size,
    };
    phase(&format!("preloading {} elements", spec.elements));
    let prepared =
        Prepared::preload(&pool, spec.workload, shape, &mut rng).map_err(|e| {
            match (e, spec.utilisation) {
                (logheap::Error::PoolFull, Some(u)) => format!(
                    "the preload does not fit in a log {:.0}% full of it (PoolFull)",
                    100.0 * u
                ),
                (e, _) => e.to_string(),
            }
        })?;
    phase(&format!("measuring {} transactions", spec.ops));
    let preload_seconds = start.elapsed().as_secs_f64();

    let before = pool.stats();
    let threads = spec.threads.max(1);
    // Each thread's operations are drawn before the clock starts, as for PMDK: drawing
    // a Zipf key costs a `powf`, which is no part of a transaction.
    let per_thread: Vec<Vec<Op>> = (0..threads)
        .map(|t| {
            prepared
                .stream()
                .thread_ops(spec.seed, spec.ops, threads, t)
        })
        .collect();
    let refused = AtomicU64::new(0);
    let limited = std::sync::atomic::AtomicBool::new(false);
    let lookups = Mutex::new(Lookups::default());
    let began = Instant::now();
    let seconds = run_timed(threads, |t| {
        let mut found = Lookups::default();
        for (i, op) in per_thread[t].iter().enumerate() {
            if i % 64 == 63
                && let Some(limit) = spec.time_limit
                && (limited.load(Ordering::Relaxed) || began.elapsed() > limit)
            {
                limited.store(true, Ordering::Relaxed);
                break;
            }
            match prepared.apply_counting(&pool, op, &mut found) {
                // In a pool sized to a utilisation, a transaction the engine refuses
                // for want of space is counted; the run goes on.
                Err(logheap::Error::PoolFull) if spec.utilisation.is_some() => {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
                Ok(()) => {}
            }
        }
        lookups.lock().unwrap_or_else(|p| p.into_inner()).add(found);
        Ok(())
    })?;
    let lookups = lookups.into_inner().unwrap_or_else(|p| p.into_inner());
    let after = pool.stats();
    let c = after.media.since(&before.media);
    let per_tx = |x: u64| x as f64 / c.transactions.max(1) as f64;
    // The log engine's own figures (zeros for an engine without them).
    let none = logheap::LogEngineStats::default();
    let (b, a) = (before.log().unwrap_or(&none), after.log().unwrap_or(&none));
    let hits = a.node_cache_hits - b.node_cache_hits;
    let misses = a.node_cache_misses - b.node_cache_misses;
    let chunk = pool.header().chunk_size;
    let log_bytes = a.chunks_total * chunk;
    let cleaned = a.chunks_cleaned - b.chunks_cleaned;
    let moved = a.cleaner_bytes_moved - b.cleaner_bytes_moved;
    let per_s = |bytes: u64| bytes as f64 / seconds.max(1e-9) / 1e6;
    let space = SpaceFigures {
        utilisation: spec
            .utilisation
            .map(|_| b.live_log_bytes as f64 / log_bytes.max(1) as f64),
        pool_bytes: spec.utilisation.map(|_| size),
        pool_full: spec.utilisation.map(|_| refused.load(Ordering::Relaxed)),
        log_turnover: Some(c.nt_bytes as f64 / log_bytes.max(1) as f64),
        chunks_cleaned: Some(cleaned),
        chunks_fast_cleaned: Some(a.chunks_fast_cleaned - b.chunks_fast_cleaned),
        cleaner_bytes_moved: Some(moved),
        reclaimed_mb_per_s: Some(per_s(cleaned * chunk)),
        moved_mb_per_s: Some(per_s(moved)),
        time_limited: spec.time_limit.map(|_| limited.load(Ordering::Relaxed)),
        cleaner_threads: Some(spec.cleaner_threads),
        ..SpaceFigures::default()
    };
    let result = RunResult {
        engine: spec.engine.clone(),
        config: match config.engine {
            EngineConfig::Log(o) => o.mapping,
            _ => MappingConfig::FULL,
        }
        .label(),
        workload: spec.workload,
        threads,
        ops: c.transactions,
        elements: spec.elements,
        value_size: spec.value_size,
        durability: Some(format!("{} ({} medium)", after.durability, after.medium)),
        emulated: spec.emulation.is_some(),
        seconds,
        tx_per_s: c.transactions as f64 / seconds.max(1e-9),
        ops_per_s: None,
        alloc_batch: None,
        fences_per_tx: Some(per_tx(c.fences)),
        fences_per_write_tx: Some(c.fences as f64 / c.write_transactions.max(1) as f64),
        lines_flushed_per_tx: Some(per_tx(c.lines_flushed)),
        nt_bytes_per_tx: Some(per_tx(c.nt_bytes)),
        media_bytes_per_tx: Some(per_tx(c.media_bytes())),
        dirty_bytes_per_tx: Some(per_tx(c.dirty_bytes)),
        payload_bytes_per_tx: Some(per_tx(c.payload_bytes)),
        write_amplification: c.write_amplification(),
        emulated_ns_per_tx: spec
            .emulation
            .is_some()
            .then(|| per_tx(c.emulated_delay_ns)),
        aborts_per_tx: per_tx(c.aborts),
        lookups: spec.workload.is_read_heavy().then_some(lookups.lookups),
        lookups_found: spec.workload.is_read_heavy().then_some(lookups.found),
        node_cache_hit_ratio: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
        dram_bytes: Some(after.dram_bytes),
        pm_bytes_used: Some(after.pm_bytes_used),
        preload_seconds,
        space,
    };
    pool.close()?;
    Ok(result)
}

/// What a preload leaves in the log: (live log bytes, pool size - chunks x chunk size).
type Calibration = (u64, u64);

/// The pool size at which the preload of `spec` fills `utilisation` of the log. The
/// preload's live bytes are measured once per engine, workload, size and seed (on a
/// pool with room for everything) and kept for the process.
fn sized_for(
    spec: &RunSpec,
    utilisation: f64,
    phase: &dyn Fn(&str),
) -> Result<u64, Box<dyn std::error::Error>> {
    type Key = (String, &'static str, u64, usize, u64);
    static CALIBRATIONS: Mutex<BTreeMap<Key, Calibration>> = Mutex::new(BTreeMap::new());
    if !(utilisation > 0.0 && utilisation < 1.0) {
        return Err(format!("utilisation {utilisation}: give a share between 0 and 1").into());
    }
    let key = (
        spec.engine.clone(),
        spec.workload.name(),
        spec.elements,
        spec.value_size,
        spec.seed,
    );
    let known = CALIBRATIONS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .copied();
    let (live, overhead) = match known {
        Some(c) => c,
        None => {
            phase("measuring the preload's live bytes");
            let dir = pool_dir(spec)?;
            let size = pool_size(spec);
            let config = config_for(&spec.engine)?.size(size).reserve_space(false);
            let pool = Pool::create(dir.path().join("calibrate.pool"), &config)?;
            let shape = Shape {
                elements: spec.elements,
                value_size: spec.value_size,
            };
            Prepared::preload(&pool, spec.workload, shape, &mut preload_rng(spec.seed))?;
            let s = pool.stats().log().cloned().unwrap_or_default();
            let c = (
                s.live_log_bytes,
                size - s.chunks_total * pool.header().chunk_size,
            );
            pool.close()?;
            CALIBRATIONS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, c);
            c
        }
    };
    let chunk = match config_for(&spec.engine)?.engine {
        EngineConfig::Log(o) => o.chunk_size,
        _ => LogOptions::default().chunk_size,
    };
    let chunks = (live as f64 / utilisation / chunk as f64).ceil() as u64;
    Ok(chunks.max(16) * chunk + overhead)
}

/// A fragmentation workload ([`crate::fragmentation`]) as a bench run: its
/// `ops`, `tx_per_s` and per-"transaction" figures count allocations (with the frees
/// each caused), whatever `--frag-batch` puts in one transaction.
fn run_fragmentation(
    spec: &RunSpec,
    phase: &dyn Fn(&str),
) -> Result<RunResult, Box<dyn std::error::Error>> {
    use crate::fragmentation::{FragSpec, is_dram_allocator};
    if spec.engine == crate::pmdk::ENGINE {
        return Err(
            "the fragmentation workloads run on log engines, the persistent heap, glibc and jemalloc"
                .into(),
        );
    }
    if !is_dram_allocator(&spec.engine) && !crate::alloc_bench::is_persistent_heap(&spec.engine) {
        config_for(&spec.engine)?;
    }
    let f = spec.frag;
    let frag = FragSpec {
        engine: spec.engine.clone(),
        workload: spec.workload,
        live: f.live,
        total: f.live.saturating_mul(f.total_ratio.max(1)),
        batch: f.batch.max(1),
        pool_size: f.pool_size,
        seed: spec.seed,
        emulation: spec.emulation,
        dir: spec.dir.clone(),
        cleaner_threads: spec.cleaner_threads,
    };
    phase(&format!(
        "allocating {} MiB per phase, {} MiB live at most",
        frag.total >> 20,
        frag.live >> 20
    ));
    let out = crate::fragmentation::run(&frag)?;
    let steps = out.allocations.max(1);
    let per = |x: u64| Some(x as f64 / steps as f64);
    let media = out.media.as_ref();
    let log = out.log.as_ref();
    Ok(RunResult {
        engine: spec.engine.clone(),
        config: match log {
            Some(l) => l.mapping.clone(),
            None => spec.engine.clone(),
        },
        workload: spec.workload,
        threads: 1,
        ops: out.allocations,
        elements: 0,
        value_size: 0,
        // Every engine with a pool (log, alloc) ran on the emulated media.
        durability: None,
        emulated: out.pool_bytes.is_some() && spec.emulation.is_some(),
        seconds: out.seconds,
        tx_per_s: out.allocations as f64 / out.seconds.max(1e-9),
        ops_per_s: None,
        alloc_batch: None,
        fences_per_tx: media.and_then(|m| per(m.fences)),
        fences_per_write_tx: media.map(|m| m.fences as f64 / m.write_transactions.max(1) as f64),
        lines_flushed_per_tx: media.and_then(|m| per(m.lines_flushed)),
        nt_bytes_per_tx: media.and_then(|m| per(m.nt_bytes)),
        media_bytes_per_tx: media.and_then(|m| per(m.media_bytes())),
        dirty_bytes_per_tx: media.and_then(|m| per(m.dirty_bytes)),
        payload_bytes_per_tx: media.and_then(|m| per(m.payload_bytes)),
        write_amplification: media.and_then(|m| m.write_amplification()),
        emulated_ns_per_tx: media
            .filter(|_| spec.emulation.is_some())
            .and_then(|m| per(m.emulated_delay_ns)),
        aborts_per_tx: media.map_or(0.0, |m| m.aborts as f64 / steps as f64),
        lookups: None,
        lookups_found: None,
        node_cache_hit_ratio: log.and_then(|l| l.node_cache_hit_ratio),
        dram_bytes: log.map(|l| l.mapping_dram_bytes),
        pm_bytes_used: out.pool_bytes.map(|_| out.held_bytes),
        preload_seconds: 0.0,
        space: SpaceFigures {
            fragmentation: Some(out.fragmentation()),
            live_bytes: Some(out.live_bytes),
            held_bytes: Some(out.held_bytes),
            compacted_fragmentation: out.compacted_fragmentation(),
            compacted_held_bytes: out.compacted_held_bytes,
            allocator_bytes: Some(out.allocator_bytes),
            resident_bytes: out.resident_bytes,
            allocations: Some(out.allocations),
            frees: Some(out.frees),
            pool_bytes: out.pool_bytes,
            chunks_cleaned: log.map(|l| l.chunks_cleaned),
            chunks_fast_cleaned: log.map(|l| l.chunks_fast_cleaned),
            cleaner_bytes_moved: log.map(|l| l.cleaner_bytes_moved),
            cleaner_threads: log.map(|_| spec.cleaner_threads),
            ..SpaceFigures::default()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{OpStream, model, thread_rng};

    fn spec(engine: &str, workload: Workload, threads: usize) -> RunSpec {
        RunSpec {
            engine: engine.into(),
            workload,
            threads,
            ops: 600,
            elements: 300,
            value_size: 48,
            seed: 11,
            emulation: None,
            dir: None,
            utilisation: None,
            frag: FragOptions::default(),
            time_limit: None,
            cleaner_threads: 0,
            alloc_batch: 1,
            home_cache: None,
            node_cache: None,
            data_checksums: false,
        }
    }

    /// What the look-ups of `spec` find on one thread, by the model.
    fn modelled(spec: &RunSpec) -> crate::workload::Lookups {
        let stream = OpStream::new(
            spec.workload,
            Shape {
                elements: spec.elements,
                value_size: spec.value_size,
            },
        );
        let mut rng = preload_rng(spec.seed);
        let preload: Vec<Op> = (0..stream.elements())
            .map(|i| stream.preload_op(i, &mut rng))
            .collect();
        let mut rng = thread_rng(spec.seed, 0);
        let ops: Vec<Op> = (0..spec.ops).map(|_| stream.next_op(&mut rng)).collect();
        model::lookups(spec.workload, &preload, &ops).0
    }

    #[test]
    fn read_heavy_runs_count_every_lookup_as_a_transaction_and_find_the_models_keys() {
        let mut engines = vec!["log", "redo", "hoop"];
        if crate::pmdk::pmdk_available() {
            engines.push(crate::pmdk::ENGINE);
        }
        for w in Workload::READ_HEAVY {
            let want = modelled(&spec("log", w, 1));
            assert!(want.lookups >= 540 && want.found > 0 && want.found < want.lookups);
            for engine in &engines {
                let r = run(&spec(engine, w, 1)).unwrap();
                assert_eq!(r.ops, 600, "{engine} {w}");
                assert!(r.tx_per_s > 0.0);
                assert_eq!(
                    (r.lookups, r.lookups_found),
                    (Some(want.lookups), Some(want.found)),
                    "{engine} {w}"
                );
                if *engine != crate::pmdk::ENGINE {
                    // Look-ups write nothing: fences come from the updates alone.
                    let lookup_only = want.lookups == 600;
                    assert_eq!(r.fences_per_tx == Some(0.0), lookup_only, "{engine} {w}");
                }
            }
            // Two threads: every operation runs, every look-up is counted.
            let r = run(&spec("log", w, 2)).unwrap();
            assert_eq!((r.ops, r.threads), (600, 2), "{w}");
            assert_eq!(r.lookups.map(|l| l >= 540), Some(true), "{w}");
        }
        // The other workloads report no look-ups.
        let r = run(&spec("log", Workload::HashtableUpd, 1)).unwrap();
        assert_eq!((r.lookups, r.lookups_found), (None, None));
    }
}
