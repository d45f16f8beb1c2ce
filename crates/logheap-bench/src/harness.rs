//! Runs one benchmark: a fresh pool, the workload's preload, then the measured phase on
//! any number of threads, and the figures of that phase.

use std::path::{Path, PathBuf};
use std::time::Instant;

use logheap::{Config, Emulation, Pool};

use crate::workload::{Op, Prepared, Shape, Workload, preload_rng};

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
    /// Whether NVM emulation was on (never for `pmdk`).
    pub emulated: bool,
    /// Wall time of the measured phase.
    pub seconds: f64,
    /// Committed transactions per second.
    pub tx_per_s: f64,
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
    /// Payload bytes per transaction (`None`: not measured).
    #[serde(default)]
    pub payload_bytes_per_tx: Option<f64>,
    /// Media bytes / payload bytes (`None`: not measured, or nothing written).
    #[serde(default)]
    pub write_amplification: Option<f64>,
    /// Aborted attempts per committed transaction.
    pub aborts_per_tx: f64,
    /// Node-cache hit ratio in the measured phase (`None` without node caches).
    #[serde(default)]
    pub node_cache_hit_ratio: Option<f64>,
    /// DRAM held by the mapping (nodes, directory, node caches); `None`: not measured
    /// (`pmdk` has no such mapping).
    #[serde(default)]
    pub dram_bytes: Option<u64>,
    /// Persistent memory in use: logheap, the chunks holding log data; `pmdk`, the
    /// usable size of every live object (a heap walk after the measured phase).
    #[serde(default)]
    pub pm_bytes_used: Option<u64>,
    /// Time of the preload.
    pub preload_seconds: f64,
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
    let parent: PathBuf = match &spec.dir {
        Some(d) => d.clone(),
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
/// ([`pmdk::UNAVAILABLE`](crate::pmdk::UNAVAILABLE)).
pub fn run_reporting(
    spec: &RunSpec,
    phase: &dyn Fn(&str),
) -> Result<RunResult, Box<dyn std::error::Error>> {
    if spec.engine == crate::pmdk::ENGINE {
        return crate::pmdk::run_reporting(spec, phase);
    }
    let dir = pool_dir(spec)?;
    // The pool is sized for every log block the run writes (nothing is cleaned), far
    // beyond what it holds at any time: a sparse file, so it takes only what is written.
    let mut config = Config::default()
        .engine_name(&spec.engine)?
        .size(pool_size(spec))
        .reserve_space(false);
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
    let prepared = Prepared::preload(&pool, spec.workload, shape, &mut rng)?;
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
    let seconds = run_timed(threads, |t| {
        per_thread[t]
            .iter()
            .try_for_each(|op| prepared.apply(&pool, op))
    })?;
    let after = pool.stats();
    let c = after.media.since(&before.media);
    let per_tx = |x: u64| x as f64 / c.transactions.max(1) as f64;
    let hits = after.log.node_cache_hits - before.log.node_cache_hits;
    let misses = after.log.node_cache_misses - before.log.node_cache_misses;
    let chunk = pool.header().chunk_size;
    let result = RunResult {
        engine: config.engine_label(),
        config: config.mapping.label(),
        workload: spec.workload,
        threads,
        ops: c.transactions,
        elements: spec.elements,
        value_size: spec.value_size,
        emulated: spec.emulation.is_some(),
        seconds,
        tx_per_s: c.transactions as f64 / seconds.max(1e-9),
        fences_per_tx: Some(per_tx(c.fences)),
        fences_per_write_tx: Some(c.fences as f64 / c.write_transactions.max(1) as f64),
        lines_flushed_per_tx: Some(per_tx(c.lines_flushed)),
        nt_bytes_per_tx: Some(per_tx(c.nt_bytes)),
        media_bytes_per_tx: Some(per_tx(c.media_bytes())),
        payload_bytes_per_tx: Some(per_tx(c.payload_bytes)),
        write_amplification: c.write_amplification(),
        aborts_per_tx: per_tx(c.aborts),
        node_cache_hit_ratio: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
        dram_bytes: Some(after.log.mapping_dram_bytes),
        pm_bytes_used: Some((after.log.chunks_total - after.log.chunks_free) * chunk),
        preload_seconds,
    };
    pool.close()?;
    Ok(result)
}
