//! `logheap bench`: the paper's evaluation, run and reported in one command.
//!
//! Without arguments it runs every workload on every configuration of the address-mapping
//! ablation (Base, 2L, 2L-GU, 2L-GU-C, full) on one thread, and the update workloads of
//! 2L-GU-C and full on two threads (the paper's Fig. 6), with the paper's NVM emulation
//! (500 ns, 1 GB/s); and, when this build has PMDK, the same on the peer engine `pmdk`
//! (libpmemobj: every workload on one thread, the update workloads on two). It writes
//! `results.jsonl` and `results.md` into a results directory named on its last line.

use std::io::Write as _;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use logheap::{Emulation, MappingConfig};
use logheap_bench::pmdk::{self, pmdk_available};
use logheap_bench::{RunSpec, Workload, report, run_reporting};

/// Options of `logheap bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Workloads to run (repeat the option; default: all).
    #[arg(long = "workload")]
    workloads: Vec<Workload>,
    /// Engines to run (repeat; default: log-base, log-2l, log-2l-gu, log-2l-gu-c, log,
    /// and pmdk when this build has PMDK's libpmemobj).
    #[arg(long = "engine")]
    engines: Vec<String>,
    /// Thread counts (repeat; default: 1, plus 2 threads for the update workloads of
    /// log-2l-gu-c, log and pmdk).
    #[arg(long = "threads")]
    threads: Vec<usize>,
    /// Transactions per run.
    #[arg(long, default_value_t = 20_000)]
    ops: u64,
    /// Elements preloaded per run.
    #[arg(long, default_value_t = 50_000)]
    elements: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 128)]
    value_size: usize,
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

/// The engine name of the log engine with `mapping` (`log`, `log-base`, ...).
fn engine_of(mapping: MappingConfig) -> String {
    logheap::Config::default().mapping(mapping).engine_label()
}

fn plan(args: &Args) -> Vec<(String, Workload, usize)> {
    let workloads = if args.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        args.workloads.clone()
    };
    let engines: Vec<String> = if args.engines.is_empty() {
        let mut engines: Vec<String> = MappingConfig::LADDER
            .iter()
            .map(|&(_, m)| engine_of(m))
            .collect();
        if pmdk_available() {
            engines.push(pmdk::ENGINE.to_string());
        }
        engines
    } else {
        args.engines.clone()
    };
    let mut runs = Vec::new();
    let threads = if args.threads.is_empty() {
        vec![1]
    } else {
        args.threads.clone()
    };
    for &w in &workloads {
        for e in &engines {
            for &t in &threads {
                runs.push((e.clone(), w, t));
            }
        }
    }
    if args.threads.is_empty() {
        for &w in workloads.iter().filter(|w| w.is_update()) {
            for e in engines
                .iter()
                .filter(|e| *e == "log" || *e == "log-2l-gu-c" || *e == pmdk::ENGINE)
            {
                runs.push((e.clone(), w, 2));
            }
        }
    }
    runs
}

/// Refuses a plan that cannot run, before anything runs: no threads, or an engine that
/// does not exist (naming those that do).
fn check_plan(runs: &[(String, Workload, usize)]) -> Result<(), String> {
    for (engine, _, threads) in runs {
        if *threads == 0 {
            return Err("--threads 0: a run needs at least one thread".into());
        }
        if engine == pmdk::ENGINE {
            continue;
        }
        match logheap::Config::default().engine_name(engine) {
            Err(e) => {
                let known: Vec<String> = MappingConfig::NAMED
                    .iter()
                    .map(|&(_, m)| engine_of(m))
                    .collect();
                return Err(format!(
                    "--engine {engine}: {e}; the engines built are {}{}",
                    known.join(", "),
                    if pmdk_available() {
                        ", and the peer engine pmdk"
                    } else {
                        ""
                    }
                ));
            }
            Ok(c) if c.engine != logheap::EngineKind::Log => {
                return Err(format!(
                    "--engine {engine}: that engine is not built yet (log and its ablation are)"
                ));
            }
            Ok(_) => {}
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
    let (elements, ops) = if args.full {
        fit_in_memory(10_000_000, 1_000_000, args.value_size)
    } else {
        (args.elements, args.ops)
    };
    let mut runs = plan(args);
    check_plan(&runs)?;
    if runs.iter().any(|(e, _, _)| e == pmdk::ENGINE) {
        if !pmdk_available() {
            eprintln!("{}", pmdk::UNAVAILABLE);
            runs.retain(|(e, _, _)| e != pmdk::ENGINE);
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
    for (i, (engine, workload, threads)) in runs.iter().enumerate() {
        let spec = RunSpec {
            engine: engine.clone(),
            workload: *workload,
            threads: *threads,
            ops,
            elements,
            value_size: args.value_size,
            seed: args.seed,
            emulation,
            dir: args.pool_dir.clone(),
        };
        let what = format!("{engine} {workload} ({threads} thread(s))");
        let r = run_reporting(&spec, &|phase| bar.set_message(format!("{what}: {phase}")))
            .map_err(|e| format!("{what}: {e}"))?;
        bar.inc(1);
        bar.suspend(|| {
            eprintln!(
                "[{}/{}] {:<12} {:<14} {} thread(s): {:>9.0} tx/s, {} fences/tx, {} media B/tx",
                i + 1,
                runs.len(),
                r.engine,
                r.workload,
                r.threads,
                r.tx_per_s,
                report::fixed(r.fences_per_tx, 2),
                report::fixed(r.media_bytes_per_tx, 0)
            )
        });
        let line = serde_json::to_string(&r)?;
        writeln!(jsonl, "{line}")?;
        if args.json {
            println!("{line}");
        }
        results.push(r);
    }
    bar.finish_and_clear();
    let header = format!(
        "# logheap bench\n\n{} runs; {} elements preloaded, {} transactions per run, {}-byte values, emulation {}, seed {}.\n\n",
        results.len(),
        elements,
        ops,
        args.value_size,
        args.emulation,
        args.seed
    );
    write_reports(&out, &header, &results)?;
    println!("results in {}", out.display());
    Ok(())
}
