//! `logheap bench`: the paper's evaluation, run and reported in one command.
//!
//! Without arguments it runs every workload of the paper, and the read-heavy ones
//! (`hashtable-read95`, `rbtree-read95`, `hashtable-lookup`, `rbtree-lookup`), on every
//! configuration of the address-mapping ablation (Base, 2L, 2L-GU, 2L-GU-C, full), on
//! the logging baselines `redo` and `undo` (§5.3) and on 003's out-of-place `oop`, on
//! one thread; on two threads, every workload on `log`, `redo`, `undo` and `oop` (Fig.
//! 7 b) and the update workloads on 2L-GU-C (Fig. 6); all with the paper's
//! NVM emulation (500 ns, 1 GB/s). When this build has PMDK, the peer engine `pmdk`
//! (libpmemobj) runs every workload on one and two threads too. It writes
//! `results.jsonl` and `results.md` into a results directory named on its last line;
//! `--plot DIR` draws the figures (Fig. 4-8 and the PMDK comparison).
//!
//! The cleaning benchmarks (issue 10) are options of the same command: the
//! fragmentation workloads `frag-w1`, `frag-w2`, `frag-w3` (Fig. 9; default engines
//! `log`, `alloc`, `glibc`, `jemalloc`), `--utilisation` (each run in a pool its preload fills to
//! that share, so the cleaner works; Fig. 11), and the engine `log-cleaning` (the
//! paper's LSNVMM-Cleaning setting). `--plot DIR` draws their figures into `DIR`.

use std::io::Write as _;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use logheap::{Emulation, MappingConfig};
use logheap_bench::fragmentation::{GLIBC, JEMALLOC, is_dram_allocator};
use logheap_bench::harness::{LOG_CLEANING, LOG_MIXED};
use logheap_bench::pmdk::{self, pmdk_available};
use logheap_bench::{
    FragOptions, RunSpec, Workload, alloc_batch, alloc_bench, report, run_reporting,
};

use crate::size::parse_size;

/// Options of `logheap bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Workloads to run (repeat the option; default: the paper's workloads and the
    /// read-heavy ones, hashtable-read95, rbtree-read95, hashtable-lookup and
    /// rbtree-lookup; the fragmentation ones, frag-w1 to frag-w3, alloc-random,
    /// alloc-batch and the other documents' run only when named). alloc-random runs on the persistent heap `alloc` (metadata in place) or
    /// `alloc-log` (DRAM state and a metadata log), `pmdk`, `glibc` and
    /// `jemalloc`, on 1 and 2 threads unless --threads says otherwise.
    #[arg(long = "workload")]
    workloads: Vec<Workload>,
    /// Engines to run (repeat; default: log-base, log-2l, log-2l-gu, log-2l-gu-c, log,
    /// and pmdk when this build has PMDK's libpmemobj; for the fragmentation workloads
    /// log, alloc, glibc and jemalloc). `log-cleaning` is log in the paper's LSNVMM-Cleaning
    /// setting (chunks more than half stale cleaned every 1,000 commits).
    #[arg(long = "engine")]
    engines: Vec<String>,
    /// Thread counts (repeat; default: 1, plus 2 threads for every workload on log,
    /// redo, undo, oop and pmdk, and for the update workloads on log-2l-gu-c and
    /// log-cleaning, without --utilisation). The fragmentation workloads always run on
    /// one thread.
    #[arg(long = "threads")]
    threads: Vec<usize>,
    /// Transactions per run.
    #[arg(long, default_value_t = 20_000)]
    ops: u64,
    /// Elements preloaded per run.
    #[arg(long, default_value_t = 50_000)]
    elements: u64,
    /// Value sizes in bytes (repeat; default 128).
    #[arg(long = "value-size")]
    value_sizes: Vec<usize>,
    /// Run each workload in a pool its preload fills to this share of the log (repeat,
    /// e.g. 0.5 to 0.9), so the cleaner works throughout (Fig. 11); transactions the
    /// engine refuses for want of space are counted. Default: a pool with room for
    /// everything, which only `log-cleaning` cleans.
    #[arg(long = "utilisation")]
    utilisations: Vec<f64>,
    /// End each measured phase after this many seconds even when transactions are left
    /// (default: with --utilisation 60, else none): a log too full to clean well can
    /// slow transactions down a thousandfold.
    #[arg(long)]
    time_limit: Option<f64>,
    /// Background cleaner threads of the log engines (default 0: the cleaner runs inline
    /// in committing threads only; with threads, committers still help when free
    /// chunks run out). The paper runs two beside its transaction threads.
    #[arg(long, default_value_t = 0)]
    cleaner_threads: usize,
    /// The log engine's home cache budget (bytes, or with a unit: 4M, 1G; 0 turns it
    /// off); default: the engine's own (256 MiB on `log`). Refused on engines without
    /// the cache.
    #[arg(long, value_parser = parse_size)]
    home_cache: Option<u64>,
    /// Entries of each thread's mapping node cache on the log engines that have one
    /// (default 8,192; 4 to 4M, rounded down to a power of two sets of four); runs
    /// report its hit ratio. Refused on engines without the cache.
    #[arg(long, value_parser = parse_size)]
    node_cache: Option<u64>,
    /// Data checksums on the in-place engines (redo, undo, oop, hoop and their
    /// variants): every line of user data checked on read (refused on the log
    /// engines, whose blocks carry CRCs anyway).
    #[arg(long)]
    data_checksums: bool,
    /// Fragmentation workloads: live bytes at most (e.g. 16M).
    #[arg(long, value_parser = parse_size, default_value = "16M")]
    frag_live: u64,
    /// Fragmentation workloads: bytes allocated by each phase, as a multiple of
    /// --frag-live.
    #[arg(long, default_value_t = 5)]
    frag_ratio: u64,
    /// Fragmentation workloads: allocations per transaction on the log engine.
    #[arg(long, default_value_t = 1)]
    frag_batch: u64,
    /// alloc-batch: allocations per transaction (repeat; default 1, 8 and 64).
    #[arg(long = "alloc-batch")]
    alloc_batches: Vec<usize>,
    /// Fragmentation workloads: the log engine's pool size (default: the smallest,
    /// searched from the live bytes in steps of 5%, in which the workload runs without
    /// PoolFull).
    #[arg(long, value_parser = parse_size)]
    frag_pool: Option<u64>,
    /// Also draw the figures of the cleaning benchmarks (Fig. 9, Fig. 11, LSNVMM-Cleaning
    /// against log) into this directory.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// Run glibc and jemalloc in this process (by default each such run is a child
    /// process of its own, so that the heaps it measures hold nothing of other runs).
    #[arg(long, hide = true)]
    in_process: bool,
    /// NVM emulation: `paper` (500 ns, 1 GB/s) or `off`.
    #[arg(long, default_value = "paper")]
    emulation: String,
    /// Same as `--emulation paper` (the default).
    #[arg(long, conflicts_with = "emulation")]
    emulate: bool,
    /// The paper's sizes: 10 M elements, 1 M transactions per run (needs a lot of memory
    /// and time).
    #[arg(long)]
    full: bool,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object per run on standard output.
    #[arg(long)]
    json: bool,
    /// Results directory (default: bench-results/<unix time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Directory for the pool files (default: /dev/shm when present).
    #[arg(long)]
    pool_dir: Option<PathBuf>,
    /// Run nothing: redraw the table and plots of an earlier results directory.
    #[arg(long, value_name = "DIR")]
    report_only: Option<PathBuf>,
}

/// Writes `results.md` and the plots of `results` into `out`.
fn write_reports(
    out: &std::path::Path,
    header: &str,
    results: &[logheap_bench::RunResult],
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::write(
        out.join("results.md"),
        format!("{header}{}", report::markdown(results)),
    )?;
    match logheap_bench::plots::draw_all(results, out) {
        Ok(files) => eprintln!("plots: {} files", files.len()),
        Err(e) => eprintln!("plots not drawn: {e}"),
    }
    Ok(())
}

/// Draws the cleaning figures of `results` into `dir` (`--plot`).
fn write_plots(dir: &std::path::Path, results: &[logheap_bench::RunResult]) {
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("plots not drawn: {}: {e}", dir.display());
        return;
    }
    match logheap_bench::plots::draw_cleaning(results, dir) {
        Ok(files) => eprintln!("plots: {} files in {}", files.len(), dir.display()),
        Err(e) => eprintln!("plots not drawn: {e}"),
    }
}

/// The engine name of the log engine with `mapping` (`log`, `log-base`, ...).
fn engine_of(mapping: MappingConfig) -> String {
    logheap::EngineConfig::Log(logheap::LogOptions::default().mapping(mapping)).to_string()
}

/// One run of the plan.
#[derive(Debug, Clone, PartialEq)]
struct Planned {
    engine: String,
    workload: Workload,
    threads: usize,
    value_size: usize,
    utilisation: Option<f64>,
    /// Allocations per transaction (`alloc-batch`; 1 elsewhere).
    batch: usize,
}

fn plan(args: &Args) -> Vec<Planned> {
    let workloads = if args.workloads.is_empty() {
        Workload::DEFAULT_RUN.to_vec()
    } else {
        args.workloads.clone()
    };
    let engines_for = |w: Workload| -> Vec<String> {
        if !args.engines.is_empty() {
            return args.engines.clone();
        }
        if w.is_fragmentation() {
            return ["log", alloc_bench::ALLOC, GLIBC, JEMALLOC]
                .map(String::from)
                .to_vec();
        }
        if w.is_allocator() {
            return w
                .allocator_engines()
                .into_iter()
                .filter(|&e| e != pmdk::ENGINE || pmdk_available())
                .map(String::from)
                .collect();
        }
        if w.is_mix() {
            // 001's comparisons: the fast log, and the persist policies.
            return [
                "undo",
                "undo-fastlog",
                "undo-nt",
                "undo-uc",
                "undo-adaptive",
                "redo",
                "redo-fastlog",
            ]
            .map(String::from)
            .to_vec();
        }
        if w.is_from_other_documents() {
            // 003's comparison: oop against undo, redo and hoop (and log for scale).
            return ["oop", "undo", "redo", "hoop", "log"]
                .map(String::from)
                .to_vec();
        }
        let mut engines: Vec<String> = MappingConfig::LADDER
            .iter()
            .map(|&(_, m)| engine_of(m))
            .collect();
        // The paper's baselines (§5.3): redo (Mnemosyne) and undo (Mnemosyne-Undo), and
        // with 001's fast log; 003's out-of-place update and its baseline HOOP.
        engines.extend(
            [
                "redo",
                "undo",
                "redo-fastlog",
                "undo-fastlog",
                "oop",
                "hoop",
            ]
            .map(String::from),
        );
        if pmdk_available() {
            engines.push(pmdk::ENGINE.to_string());
        }
        engines
    };
    let threads = if args.threads.is_empty() {
        vec![1]
    } else {
        args.threads.clone()
    };
    let sizes = if args.value_sizes.is_empty() {
        vec![128]
    } else {
        args.value_sizes.clone()
    };
    let utilisations: Vec<Option<f64>> = if args.utilisations.is_empty() {
        vec![None]
    } else {
        args.utilisations.iter().map(|&u| Some(u)).collect()
    };
    let mut runs = Vec::new();
    for &w in &workloads {
        // The fragmentation workloads are single-threaded and sized by the --frag
        // options; alloc-random runs on one and two threads unless told (002 measures
        // per-thread scaling), alloc-batch on one (its figures are per operation) in
        // batches of 1, 8 and 64; none has a value size or a utilisation.
        let (threads, sizes, utilisations) = if w.is_fragmentation() {
            (vec![1], vec![0], vec![None])
        } else if w.is_allocator() {
            let threads = match (args.threads.is_empty(), w) {
                (false, _) => args.threads.clone(),
                (true, Workload::AllocBatch) => vec![1],
                (true, _) => vec![1, 2],
            };
            (threads, vec![0], vec![None])
        } else {
            (threads.clone(), sizes.clone(), utilisations.clone())
        };
        let batches = match (w, args.alloc_batches.is_empty()) {
            (Workload::AllocBatch, true) => alloc_batch::DEFAULT_BATCHES.to_vec(),
            (Workload::AllocBatch, false) => args.alloc_batches.clone(),
            _ => vec![1],
        };
        for &value_size in &sizes {
            for &utilisation in &utilisations {
                for e in engines_for(w) {
                    for &batch in &batches {
                        for &threads in &threads {
                            runs.push(Planned {
                                engine: e.clone(),
                                workload: w,
                                threads,
                                value_size,
                                utilisation,
                                batch,
                            });
                        }
                    }
                }
            }
        }
    }
    if args.threads.is_empty() && args.utilisations.is_empty() {
        // Two threads: every workload on log, redo, undo, oop, hoop and pmdk (Fig. 7 b),
        // the update workloads also on log-2l-gu-c and log-cleaning (Fig. 6).
        let on_two_threads = |w: Workload, e: &str| {
            matches!(e, "log" | "redo" | "undo" | "oop" | "hoop" | pmdk::ENGINE)
                || (w.is_update() && (e == "log-2l-gu-c" || e == LOG_CLEANING))
        };
        for &w in workloads
            .iter()
            .filter(|w| !w.is_allocator() && !w.is_fragmentation())
        {
            for &value_size in &sizes {
                for e in engines_for(w).into_iter().filter(|e| on_two_threads(w, e)) {
                    runs.push(Planned {
                        engine: e,
                        workload: w,
                        threads: 2,
                        value_size,
                        utilisation: None,
                        batch: 1,
                    });
                }
            }
        }
    }
    runs
}

/// Refuses a plan that cannot run, before anything runs: no threads, or an engine that
/// does not exist (naming those that do).
fn check_plan(runs: &[Planned]) -> Result<(), String> {
    for r in runs {
        let engine = &r.engine;
        if r.threads == 0 {
            return Err("--threads 0: a run needs at least one thread".into());
        }
        if let Some(u) = r.utilisation
            && !(u > 0.0 && u < 1.0)
        {
            return Err(format!("--utilisation {u}: give a share between 0 and 1"));
        }
        if r.workload.is_allocator() {
            let engines = r.workload.allocator_engines();
            if !engines.contains(&engine.as_str()) {
                return Err(format!(
                    "--engine {engine}: {} runs on {}",
                    r.workload,
                    engines.join(", ")
                ));
            }
            if r.batch == 0 {
                return Err("--alloc-batch 0: a transaction needs at least one allocation".into());
            }
            if r.utilisation.is_some() {
                return Err(format!("--utilisation does not apply to {}", r.workload));
            }
            continue;
        }
        if alloc_bench::is_persistent_heap(engine) {
            if !r.workload.is_fragmentation() {
                return Err(format!(
                    "--engine {engine} (the persistent heap) runs only alloc-random, alloc-batch and the fragmentation workloads (frag-w1, frag-w2, frag-w3), not {}",
                    r.workload
                ));
            }
            continue;
        }
        if is_dram_allocator(engine) {
            if !r.workload.is_fragmentation() {
                return Err(format!(
                    "--engine {engine} runs only the fragmentation workloads (frag-w1, frag-w2, frag-w3) and alloc-random, not {}",
                    r.workload
                ));
            }
            continue;
        }
        if engine == pmdk::ENGINE {
            if r.workload.is_from_other_documents() {
                return Err(format!(
                    "--engine pmdk does not run {} (the PMDK peer engine has the paper's workloads only)",
                    r.workload
                ));
            }
            if r.workload.is_fragmentation() {
                return Err(format!(
                    "--engine pmdk does not run {} (the fragmentation workloads run on log engines, the persistent heap, glibc and jemalloc)",
                    r.workload
                ));
            }
            if r.utilisation.is_some() {
                return Err("--utilisation sizes logheap's log; pmdk has none".into());
            }
            continue;
        }
        // `alloc` (the bare heap) was handled above with the persistent heap.
        if let Err(e) = logheap_bench::harness::config_for(engine) {
            let mut known: Vec<String> = MappingConfig::NAMED
                .iter()
                .chain(&MappingConfig::SKIPLIST_LADDER[1..4])
                .map(|&(_, m)| engine_of(m))
                .collect();
            known.dedup();
            return Err(format!(
                "--engine {engine}: {e}; the engines built are {}, {LOG_CLEANING}, {LOG_MIXED}, redo, undo, redo-fastlog, undo-fastlog, undo-nt, undo-uc, undo-adaptive, oop, hoop{}, and for the fragmentation workloads {GLIBC} and {JEMALLOC}",
                known.join(", "),
                if pmdk_available() {
                    ", the peer engine pmdk"
                } else {
                    ""
                }
            ));
        }
    }
    Ok(())
}

/// The results directory: `out` when given (it must not be a file), else a new
/// directory `bench-results/<unix time>[-n]` that no other run uses.
fn results_dir(out: Option<&std::path::Path>) -> Result<PathBuf, String> {
    if let Some(out) = out {
        if out.exists() && !out.is_dir() {
            return Err(format!(
                "--out {}: that is a file; give a directory for the results",
                out.display()
            ));
        }
        std::fs::create_dir_all(out).map_err(|e| format!("--out {}: {e}", out.display()))?;
        return Ok(out.to_path_buf());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let parent = PathBuf::from("bench-results");
    std::fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    // `create_dir` fails when the directory exists, so two runs started in the same
    // second take different names.
    for n in 0u32.. {
        let name = match n {
            0 => now.to_string(),
            n => format!("{now}-{n}"),
        };
        let dir = parent.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        }
    }
    Err("no free results directory name".into())
}

/// The paper's sizes scaled down, if needed, to what this machine's available memory
/// holds (pool data on tmpfs and the DRAM mapping, about 2 KiB per element at 128 B).
fn fit_in_memory(elements: u64, ops: u64, value_size: usize) -> (u64, u64) {
    let per_element = 4 * (value_size as u64 + 384);
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024);
    match available {
        Some(bytes) if (elements + ops) * per_element > bytes / 2 => {
            let scale = (bytes / 2) as f64 / ((elements + ops) * per_element) as f64;
            let (e, o) = (
                (elements as f64 * scale) as u64,
                (ops as f64 * scale) as u64,
            );
            eprintln!(
                "--full: {} MiB available; running {e} elements and {o} transactions per run",
                bytes >> 20
            );
            (e, o)
        }
        _ => (elements, ops),
    }
}

/// Runs a glibc or jemalloc fragmentation run in a child process (`logheap bench
/// --in-process`): glibc's `mallinfo2` and jemalloc's statistics describe the whole
/// heap, which in this process also holds what earlier runs left (the log engine's
/// DRAM mapping is allocated with glibc's malloc, and freeing it leaves the heap
/// large).
fn run_in_child(spec: &RunSpec) -> Result<logheap_bench::RunResult, Box<dyn std::error::Error>> {
    let out = tempfile::tempdir()?;
    let f = spec.frag;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["bench", "--in-process", "--json", "--workload"])
        .arg(spec.workload.name())
        .args(["--engine", &spec.engine])
        .args(["--frag-live", &f.live.to_string()])
        .args(["--frag-ratio", &f.total_ratio.to_string()])
        .args(["--frag-batch", &f.batch.to_string()])
        .args(["--seed", &spec.seed.to_string()])
        .arg("--out")
        .arg(out.path());
    let child = cmd.output()?;
    if !child.status.success() {
        return Err(format!(
            "the child process failed: {}",
            String::from_utf8_lossy(&child.stderr).trim()
        )
        .into());
    }
    let stdout = String::from_utf8_lossy(&child.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .ok_or("the child process printed no result")?;
    Ok(serde_json::from_str(line)?)
}

/// The line printed after a run.
fn summary(r: &logheap_bench::RunResult) -> String {
    let s = &r.space;
    if let Some(f) = s.fragmentation {
        return format!(
            "{:<12} {:<14} fragmentation {:.1}% ({:.1} MiB live, {:.1} MiB held){}",
            r.engine,
            r.workload,
            100.0 * f,
            s.live_bytes.unwrap_or(0) as f64 / (1 << 20) as f64,
            s.held_bytes.unwrap_or(0) as f64 / (1 << 20) as f64,
            match s.chunks_cleaned {
                Some(c) => format!(", {c} chunks cleaned"),
                None => String::new(),
            }
        );
    }
    if let Some(ops) = r.ops_per_s {
        return format!(
            "{:<12} {:<14} {} thread(s): {:>9.0} ops/s, {} fences/op, {} lines flushed/op",
            r.engine,
            r.workload,
            r.threads,
            ops,
            report::fixed(r.fences_per_tx, 2),
            report::fixed(r.lines_flushed_per_tx, 2)
        );
    }
    let mut line = format!(
        "{:<12} {:<14} {} thread(s): {:>9.0} tx/s, {} fences/tx, {} media B/tx",
        r.engine,
        r.workload,
        r.threads,
        r.tx_per_s,
        report::fixed(r.fences_per_tx, 2),
        report::fixed(r.media_bytes_per_tx, 0)
    );
    if let Some(ns) = r.emulated_ns_per_tx {
        line.push_str(&format!(", {ns:.0} ns/tx of emulated NVM writes"));
    }
    if let Some(u) = s.utilisation {
        line.push_str(&format!(
            ", {} B values, {:.1}% utilised, {} chunks cleaned, {:.1} MB/s moved, {} refused{}",
            r.value_size,
            100.0 * u,
            s.chunks_cleaned.unwrap_or(0),
            s.moved_mb_per_s.unwrap_or(0.0),
            s.pool_full.unwrap_or(0),
            if s.time_limited == Some(true) {
                format!(", stopped at the time limit after {} transactions", r.ops)
            } else {
                String::new()
            }
        ));
    } else if let Some(c) = s.chunks_cleaned.filter(|&c| c > 0) {
        line.push_str(&format!(", {c} chunks cleaned"));
    }
    if let (Some(lookups), Some(found)) = (r.lookups, r.lookups_found) {
        line.push_str(&format!(", {found} of {lookups} look-ups found"));
    }
    line
}

/// Runs the benchmarks and writes the reports.
pub fn run_bench(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(dir) = &args.report_only {
        let text = std::fs::read_to_string(dir.join("results.jsonl"))?;
        let results = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect::<Result<Vec<logheap_bench::RunResult>, _>>()?;
        write_reports(
            dir,
            &format!("# logheap bench\n\n{} runs (redrawn).\n\n", results.len()),
            &results,
        )?;
        if let Some(plot) = &args.plot {
            write_plots(plot, &results);
        }
        println!("results in {}", dir.display());
        return Ok(());
    }
    let emulation = match if args.emulate {
        "paper"
    } else {
        args.emulation.as_str()
    } {
        "paper" => Some(Emulation::PAPER),
        "off" => None,
        other => return Err(format!("unknown emulation {other:?} (paper, off)").into()),
    };
    let largest_value = args.value_sizes.iter().copied().max().unwrap_or(128);
    let (elements, ops) = if args.full {
        fit_in_memory(10_000_000, 1_000_000, largest_value)
    } else {
        (args.elements, args.ops)
    };
    let mut runs = plan(args);
    check_plan(&runs)?;
    if !args.alloc_batches.is_empty() && !runs.iter().any(|r| r.workload == Workload::AllocBatch) {
        return Err("--alloc-batch applies only to --workload alloc-batch".into());
    }
    if runs.iter().any(|r| r.engine == pmdk::ENGINE) {
        if !pmdk_available() {
            eprintln!("{}", pmdk::UNAVAILABLE);
            runs.retain(|r| r.engine != pmdk::ENGINE);
            if runs.is_empty() {
                return Err("no other engine was asked for: nothing to run".into());
            }
            eprintln!("running the other engines");
        } else {
            // Before any thread starts: libpmem reads it at the first pool.
            pmdk::prepare_environment();
            if emulation.is_some() {
                eprintln!(
                    "note: pmdk runs without NVM emulation (libpmemobj has no hook at its fences); compare it with --emulation off"
                );
            }
        }
    }
    let out = results_dir(args.out.as_deref())?;
    let mut jsonl = std::fs::File::create(out.join("results.jsonl"))?;
    let mut results = Vec::new();
    let bar = ProgressBar::new(runs.len() as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} runs, {elapsed}, {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let frag = FragOptions {
        live: args.frag_live,
        total_ratio: args.frag_ratio,
        batch: args.frag_batch,
        pool_size: args.frag_pool,
    };
    let mut durability_shown: Option<String> = None;
    for (i, run) in runs.iter().enumerate() {
        let Planned {
            engine,
            workload,
            threads,
            value_size,
            utilisation,
            batch,
        } = run;
        let spec = RunSpec {
            engine: engine.clone(),
            workload: *workload,
            threads: *threads,
            ops,
            elements,
            value_size: *value_size,
            seed: args.seed,
            emulation,
            dir: args.pool_dir.clone(),
            utilisation: *utilisation,
            frag,
            time_limit: args
                .time_limit
                .or(utilisation.map(|_| 60.0))
                .map(std::time::Duration::from_secs_f64),
            cleaner_threads: args.cleaner_threads,
            alloc_batch: *batch,
            home_cache: args.home_cache,
            node_cache: args.node_cache.map(|n| n as usize),
            data_checksums: args.data_checksums,
        };
        let mut what = format!("{engine} {workload} ({threads} thread(s)");
        if !workload.is_fragmentation() && args.value_sizes.len() > 1 {
            what.push_str(&format!(", {value_size} B values"));
        }
        if let Some(u) = utilisation {
            what.push_str(&format!(", {:.0}% utilisation", 100.0 * u));
        }
        if args.data_checksums {
            what.push_str(", data checksums");
        }
        if *workload == Workload::AllocBatch {
            what.push_str(&format!(", {batch} per transaction"));
        }
        what.push(')');
        let measured =
            if is_dram_allocator(engine) && workload.is_fragmentation() && !args.in_process {
                bar.set_message(format!("{what}: in a child process"));
                run_in_child(&spec)
            } else {
                run_reporting(&spec, &|phase| bar.set_message(format!("{what}: {phase}")))
            };
        let r = match measured {
            Ok(r) => r,
            // A utilisation the engine cannot hold is a finding of the sweep, not the
            // end of it.
            Err(e) if utilisation.is_some() => {
                bar.inc(1);
                bar.suspend(|| eprintln!("[{}/{}] {what}: not run: {e}", i + 1, runs.len()));
                continue;
            }
            Err(e) => return Err(format!("{what}: {e}").into()),
        };
        bar.inc(1);
        if r.durability.is_some() && r.durability != durability_shown {
            // Once, and again if it changes: what a commit survives in these runs.
            durability_shown = r.durability.clone();
            let mode = r.durability.as_deref().unwrap_or_default();
            bar.suspend(|| eprintln!("pools run in {mode} durability mode"));
        }
        bar.suspend(|| eprintln!("[{}/{}] {}", i + 1, runs.len(), summary(&r)));
        let line = serde_json::to_string(&r)?;
        writeln!(jsonl, "{line}")?;
        if args.json {
            println!("{line}");
        }
        results.push(r);
    }
    bar.finish_and_clear();
    let sizes: Vec<String> = if args.value_sizes.is_empty() {
        vec!["128".into()]
    } else {
        args.value_sizes.iter().map(|v| v.to_string()).collect()
    };
    let header = format!(
        "# logheap bench\n\n{} runs; {} elements preloaded, {} transactions per run, {}-byte values, emulation {}, seed {}.\n\n",
        results.len(),
        elements,
        ops,
        sizes.join("/"),
        args.emulation,
        args.seed
    );
    write_reports(&out, &header, &results)?;
    if let Some(dir) = &args.plot {
        write_plots(dir, &results);
    }
    println!("results in {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn planned(line: &[&str]) -> Vec<(String, usize, usize, Option<f64>)> {
        let cli = Cli::parse_from(std::iter::once("bench").chain(line.iter().copied()));
        plan(&cli.args)
            .into_iter()
            .map(|r| (r.engine, r.threads, r.value_size, r.utilisation))
            .collect()
    }

    #[test]
    fn allocator_and_fragmentation_workloads_take_their_own_threads_and_no_value_size() {
        let runs = planned(&[
            "--workload",
            "alloc-random",
            "--engine",
            "alloc",
            "--engine",
            "glibc",
        ]);
        let want = |e: &str, t| (e.to_string(), t, 0, None);
        assert_eq!(
            runs,
            [
                want("alloc", 1),
                want("alloc", 2),
                want("glibc", 1),
                want("glibc", 2)
            ]
        );
        let runs = planned(&[
            "--workload",
            "alloc-random",
            "--engine",
            "alloc",
            "--threads",
            "3",
        ]);
        assert_eq!(runs, [want("alloc", 3)]);
        let runs = planned(&["--workload", "frag-w1", "--engine", "log", "--threads", "4"]);
        assert_eq!(runs, [want("log", 1)], "fragmentation is single-threaded");
        let runs = planned(&[
            "--workload",
            "hashtable-ins",
            "--engine",
            "log",
            "--threads",
            "2",
        ]);
        assert_eq!(runs, [("log".to_string(), 2, 128, None)]);
    }

    fn batches(line: &[&str]) -> Vec<(String, usize, usize)> {
        let cli = Cli::parse_from(std::iter::once("bench").chain(line.iter().copied()));
        plan(&cli.args)
            .into_iter()
            .map(|r| (r.engine, r.threads, r.batch))
            .collect()
    }

    #[test]
    fn the_default_run_has_the_read_heavy_workloads_on_every_engine() {
        let cli = Cli::parse_from(["bench"]);
        let runs = plan(&cli.args);
        check_plan(&runs).unwrap();
        for w in Workload::READ_HEAVY {
            let on = |engine: &str, threads| {
                runs.iter()
                    .any(|r| r.workload == w && r.engine == engine && r.threads == threads)
            };
            for engine in [
                "log-base",
                "log",
                "redo",
                "undo",
                "undo-fastlog",
                "oop",
                "hoop",
            ] {
                assert!(on(engine, 1), "{w} on {engine}");
            }
            assert!(on("log", 2) && on("redo", 2) && on("undo", 2), "{w}");
            assert_eq!(on(pmdk::ENGINE, 1), pmdk_available(), "{w}");
        }
        // Named, they run on pmdk too; a read-heavy workload is no allocator's.
        let cli = Cli::parse_from(["bench", "--workload", "rbtree-read95", "--engine", "pmdk"]);
        assert!(check_plan(&plan(&cli.args)).is_ok());
        let cli = Cli::parse_from(["bench", "--workload", "rbtree-lookup", "--engine", "glibc"]);
        assert!(check_plan(&plan(&cli.args)).is_err());
    }

    #[test]
    fn alloc_batch_runs_batches_of_1_8_and_64_on_one_thread_unless_told() {
        let runs = batches(&["--workload", "alloc-batch", "--engine", "redo"]);
        let want = |b| ("redo".to_string(), 1, b);
        assert_eq!(runs, [want(1), want(8), want(64)]);
        let runs = batches(&["--workload", "alloc-batch", "--alloc-batch", "16"]);
        assert_eq!(runs.len(), alloc_batch::engines().len());
        assert!(runs.iter().all(|(_, t, b)| (*t, *b) == (1, 16)), "{runs:?}");
        // Other workloads have no batch, and pmdk does not run alloc-batch.
        assert!(batches(&["--workload", "sps"]).iter().all(|r| r.2 == 1));
        let cli = Cli::parse_from(["bench", "--workload", "alloc-batch", "--engine", "pmdk"]);
        assert!(check_plan(&plan(&cli.args)).is_err());
        let cli = Cli::parse_from(["bench", "--workload", "alloc-batch", "--alloc-batch", "0"]);
        assert!(check_plan(&plan(&cli.args)).is_err());
    }
}
