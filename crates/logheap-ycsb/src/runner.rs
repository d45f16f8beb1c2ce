//! A YCSB run: a fresh store, the load phase (every record inserted, in hashed order),
//! then the run phase (the workload's operations on 1 or more threads), with each
//! operation's latency in an HDR histogram.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::generator::{RecordShape, ScrambledZipfian, SkewedLatest, fill_printable, key_of};
use crate::stores::{Store, StoreError, StoreKind};
use crate::workload::{Operation, RequestDistribution, Workload};

/// What one run does.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunConfig {
    /// Records inserted by the load phase (YCSB's `recordcount`).
    pub records: u64,
    /// Operations of the run phase, over all threads (YCSB's `operationcount`).
    pub operations: u64,
    /// Threads of both phases.
    pub threads: usize,
    /// Fields and their length.
    pub shape: RecordShape,
    /// The longest scan (YCSB's `maxscanlength`; lengths uniform in 1..=it).
    pub max_scan_len: usize,
    /// Seed of the threads' random numbers.
    pub seed: u64,
}

/// Latency figures of one operation type, in microseconds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Latency {
    /// Operations measured.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest.
    pub max_us: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Latency {
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            count: h.len(),
            mean_us: h.mean() / 1000.0,
            p50_us: us(h.value_at_quantile(0.5)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// One phase's figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Phase {
    /// Operations done.
    pub operations: u64,
    /// Wall time.
    pub seconds: f64,
    /// Operations per second.
    pub throughput: f64,
    /// Latency per operation type (YCSB's names).
    pub latency: BTreeMap<&'static str, Latency>,
    /// Reads, updates and read-modify-writes that found no record (0 unless a store
    /// loses data).
    pub misses: u64,
}

/// The result of one run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunResult {
    /// The store (`logheap-log`, `lmdb`, …).
    pub store: String,
    /// The workload.
    pub workload: Workload,
    /// Threads.
    pub threads: usize,
    /// The settings.
    pub config: RunConfig,
    /// How the store made commits durable.
    pub durability: String,
    /// The directory the store lived in.
    pub dir: String,
    /// The load phase.
    pub load: Phase,
    /// The run phase.
    pub run: Phase,
}

/// Per-thread histograms, one per operation type.
struct Recorder {
    histograms: BTreeMap<&'static str, Histogram<u64>>,
    misses: u64,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            histograms: BTreeMap::new(),
            misses: 0,
        }
    }

    fn record(&mut self, op: Operation, started: Instant) {
        let ns = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.histograms
            .entry(op.name())
            .or_insert_with(|| Histogram::new_with_bounds(1, 3_600_000_000_000, 3).unwrap())
            .saturating_record(ns.max(1));
    }

    fn merge(&mut self, other: Recorder) {
        for (name, h) in other.histograms {
            match self.histograms.get_mut(name) {
                Some(mine) => mine.add(&h).unwrap(),
                None => {
                    self.histograms.insert(name, h);
                }
            }
        }
        self.misses += other.misses;
    }

    fn phase(self, seconds: f64) -> Phase {
        let operations = self.histograms.values().map(|h| h.len()).sum();
        Phase {
            operations,
            seconds,
            throughput: operations as f64 / seconds.max(1e-9),
            latency: self
                .histograms
                .iter()
                .map(|(name, h)| (*name, Latency::of(h)))
                .collect(),
            misses: self.misses,
        }
    }
}

/// Inserts records acknowledged in order, so readers choose only among records that
/// exist (YCSB's `AcknowledgedCounterGenerator`).
struct InsertCounter {
    next: AtomicU64,
    acknowledged: AtomicU64,
}

impl InsertCounter {
    fn claim(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Marks record `n` inserted once every record before it is.
    fn acknowledge(&self, n: u64, failed: &AtomicBool) {
        while self.acknowledged.load(Ordering::Acquire) != n {
            if failed.load(Ordering::Relaxed) {
                return;
            }
            std::thread::yield_now();
        }
        self.acknowledged.store(n + 1, Ordering::Release);
    }

    /// Records that exist.
    fn existing(&self) -> u64 {
        self.acknowledged.load(Ordering::Acquire)
    }
}

/// Runs `workload` on a fresh store of `kind` in a new directory under `parent`
/// (removed afterwards).
pub fn run(
    kind: StoreKind,
    workload: Workload,
    config: &RunConfig,
    parent: &Path,
) -> Result<RunResult, StoreError> {
    let dir = tempfile::Builder::new()
        .prefix("logheap-ycsb-")
        .tempdir_in(parent)
        .map_err(|e| StoreError {
            store: "ycsb",
            message: format!("{}: cannot make a directory: {e}", parent.display()),
        })?;
    let payload = config.records * (config.shape.value_len() as u64 + 32);
    let store = kind.open(dir.path(), payload * 2)?;
    let threads = config.threads.max(1);
    let load = load_phase(store.as_ref(), config, threads)?;
    let run = run_phase(store.as_ref(), workload, config, threads)?;
    let durability = store.durability();
    drop(store);
    Ok(RunResult {
        store: kind.to_string(),
        workload,
        threads,
        config: config.clone(),
        durability,
        dir: parent.display().to_string(),
        load,
        run,
    })
}

/// Runs `body(thread)` on `threads` threads started together; returns the merged
/// recorders and the wall time.
fn on_threads(
    threads: usize,
    body: impl Fn(usize, &AtomicBool) -> Result<Recorder, StoreError> + Sync,
) -> Result<Phase, StoreError> {
    let start = Barrier::new(threads + 1);
    let failed = AtomicBool::new(false);
    let results = Mutex::new(Vec::new());
    let began = std::thread::scope(|s| {
        for t in 0..threads {
            let (start, failed, results, body) = (&start, &failed, &results, &body);
            s.spawn(move || {
                start.wait();
                let r = body(t, failed);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                results.lock().unwrap().push(r);
            });
        }
        start.wait();
        // The scope joins every thread before it returns: timed until then.
        Instant::now()
    });
    let seconds = began.elapsed().as_secs_f64();
    let mut total = Recorder::new();
    for r in results.into_inner().unwrap() {
        total.merge(r?);
    }
    Ok(total.phase(seconds))
}

fn load_phase(store: &dyn Store, config: &RunConfig, threads: usize) -> Result<Phase, StoreError> {
    on_threads(threads, |t, failed| {
        let mut rng = SmallRng::seed_from_u64(config.seed ^ ((t as u64 + 1) * 0x9E37_79B9));
        let mut rec = Recorder::new();
        let mut value = Vec::new();
        let mut n = t as u64;
        while n < config.records && !failed.load(Ordering::Relaxed) {
            config.shape.fill(&mut rng, &mut value);
            let started = Instant::now();
            store.insert(&key_of(n), &value)?;
            rec.record(Operation::Insert, started);
            n += threads as u64;
        }
        Ok(rec)
    })
}

/// Picks the record an operation touches.
enum KeyChooser {
    Zipfian(ScrambledZipfian),
    Latest(SkewedLatest),
}

impl KeyChooser {
    fn next(&mut self, counter: &InsertCounter, rng: &mut impl Rng) -> u64 {
        let existing = counter.existing().max(1);
        match self {
            // YCSB draws again until it names a record that exists.
            KeyChooser::Zipfian(z) => loop {
                let k = z.next(rng);
                if k < existing {
                    return k;
                }
            },
            KeyChooser::Latest(l) => l.next(existing - 1, rng),
        }
    }
}

fn run_phase(
    store: &dyn Store,
    workload: Workload,
    config: &RunConfig,
    threads: usize,
) -> Result<Phase, StoreError> {
    let counter = InsertCounter {
        next: AtomicU64::new(config.records),
        acknowledged: AtomicU64::new(config.records),
    };
    // YCSB sizes the Zipfian key space for the inserts expected during the run.
    let expected_new = (config.operations as f64 * workload.insert_proportion() * 2.0) as u64;
    let shape = config.shape;
    on_threads(threads, |t, failed| {
        let mut rng = SmallRng::seed_from_u64(config.seed ^ ((t as u64 + 101) * 0x5851_F42D));
        let mut chooser = match workload.distribution() {
            RequestDistribution::Zipfian => {
                KeyChooser::Zipfian(ScrambledZipfian::new(0, config.records + expected_new))
            }
            RequestDistribution::Latest => KeyChooser::Latest(SkewedLatest::new(config.records)),
        };
        let ops = config.operations / threads as u64
            + u64::from((t as u64) < config.operations % threads as u64);
        let mut rec = Recorder::new();
        let (mut value, mut field) = (Vec::new(), vec![0u8; shape.field_len]);
        for _ in 0..ops {
            if failed.load(Ordering::Relaxed) {
                break;
            }
            let op = workload.pick(rng.random());
            let started;
            match op {
                Operation::Read => {
                    let key = key_of(chooser.next(&counter, &mut rng));
                    started = Instant::now();
                    rec.misses += u64::from(!store.read(&key, &mut value)?);
                }
                Operation::Update => {
                    let key = key_of(chooser.next(&counter, &mut rng));
                    let at = rng.random_range(0..shape.fields) * shape.field_len;
                    fill_printable(&mut rng, &mut field);
                    started = Instant::now();
                    rec.misses += u64::from(!store.update(&key, at, &field)?);
                }
                Operation::Insert => {
                    let n = counter.claim();
                    shape.fill(&mut rng, &mut value);
                    started = Instant::now();
                    let r = store.insert(&key_of(n), &value);
                    // Acknowledge even a failed insert, so no other thread waits on it.
                    counter.acknowledge(n, failed);
                    r?;
                }
                Operation::Scan => {
                    let key = key_of(chooser.next(&counter, &mut rng));
                    let len = rng.random_range(1..=config.max_scan_len.max(1));
                    started = Instant::now();
                    store.scan(&key, len)?;
                }
                Operation::ReadModifyWrite => {
                    let key = key_of(chooser.next(&counter, &mut rng));
                    let at = rng.random_range(0..shape.fields) * shape.field_len;
                    fill_printable(&mut rng, &mut field);
                    started = Instant::now();
                    let found = store.read(&key, &mut value)?;
                    rec.misses += u64::from(!(found && store.update(&key, at, &field)?));
                }
            }
            rec.record(op, started);
        }
        Ok(rec)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small run of each workload on logheap-kv and LMDB: every operation done, none
    /// missing its record, inserts growing the store, scans reading.
    #[test]
    fn every_workload_runs_on_two_threads_without_misses() {
        let parent = tempfile::tempdir().unwrap();
        let config = RunConfig {
            records: 2000,
            operations: 2000,
            threads: 2,
            shape: RecordShape {
                fields: 10,
                field_len: 100,
            },
            max_scan_len: 100,
            seed: 7,
        };
        for kind in [
            StoreKind::Logheap(logheap::EngineKind::Log),
            StoreKind::Lmdb,
        ] {
            for workload in crate::workload::ALL {
                let r = run(kind, workload, &config, parent.path()).unwrap();
                assert_eq!(r.load.operations, 2000, "{kind} {workload}");
                assert_eq!(r.run.operations, 2000, "{kind} {workload}");
                assert_eq!(r.run.misses, 0, "{kind} {workload}");
                for (op, _) in workload.mix() {
                    let l = &r.run.latency[op.name()];
                    assert!(l.count > 0 && l.p50_us <= l.p99_us && l.p99_us <= l.max_us);
                }
            }
        }
    }
}
