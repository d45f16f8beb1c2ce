//! The report of a YCSB run: `results.jsonl` (one line per run), `results.md`
//! (throughput per workload and store, latency percentiles, how each store was made
//! durable) and throughput plots.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::runner::RunResult;
use crate::workload::Workload;

/// Writes `results.jsonl`, `results.md` and the plots into `dir`; returns the files
/// written (and, when plots could not be drawn, why).
pub fn write(dir: &Path, results: &[RunResult]) -> std::io::Result<(Vec<PathBuf>, Option<String>)> {
    std::fs::create_dir_all(dir)?;
    let mut files = Vec::new();
    let jsonl = dir.join("results.jsonl");
    let mut text = String::new();
    for r in results {
        text.push_str(&serde_json::to_string(r).map_err(std::io::Error::other)?);
        text.push('\n');
    }
    std::fs::write(&jsonl, text)?;
    files.push(jsonl);
    let md = dir.join("results.md");
    std::fs::write(&md, markdown(results))?;
    files.push(md);
    let mut plot_problem = None;
    for threads in thread_counts(results) {
        let stores = stores_in(results);
        let workloads = workloads_in(results);
        let series = stores
            .iter()
            .map(|s| {
                let values = workloads
                    .iter()
                    .map(|w| find(results, s, *w, threads).map(|r| r.run.throughput / 1000.0))
                    .collect();
                (s.clone(), values)
            })
            .collect();
        match logheap_bench::plots::draw_bars(
            dir,
            &format!("ycsb-throughput-{threads}t"),
            &format!("YCSB throughput, {threads} thread(s)"),
            "K operations per second",
            workloads.iter().map(|w| format!("workload {w}")).collect(),
            series,
        ) {
            Ok(mut drawn) => files.append(&mut drawn),
            Err(e) => plot_problem = Some(e.to_string()),
        }
    }
    Ok((files, plot_problem))
}

fn thread_counts(results: &[RunResult]) -> Vec<usize> {
    let mut t: Vec<usize> = results.iter().map(|r| r.threads).collect();
    t.sort_unstable();
    t.dedup();
    t
}

fn stores_in(results: &[RunResult]) -> Vec<String> {
    let mut stores: Vec<String> = Vec::new();
    for r in results {
        if !stores.contains(&r.store) {
            stores.push(r.store.clone());
        }
    }
    stores
}

fn workloads_in(results: &[RunResult]) -> Vec<Workload> {
    crate::workload::ALL
        .into_iter()
        .filter(|w| results.iter().any(|r| r.workload == *w))
        .collect()
}

fn find<'r>(
    results: &'r [RunResult],
    store: &str,
    workload: Workload,
    threads: usize,
) -> Option<&'r RunResult> {
    results
        .iter()
        .find(|r| r.store == store && r.workload == workload && r.threads == threads)
}

/// The Markdown report.
pub fn markdown(results: &[RunResult]) -> String {
    let mut md = String::from("# YCSB\n\n");
    let Some(first) = results.first() else {
        md.push_str("No runs.\n");
        return md;
    };
    let c = &first.config;
    let _ = writeln!(
        md,
        "{} records of {} fields × {} B, {} operations per run, scans of 1–{} records; \
         stores in `{}`. Each run: a fresh store, the load phase, the run phase.\n",
        c.records, c.shape.fields, c.shape.field_len, c.operations, c.max_scan_len, first.dir
    );
    let stores = stores_in(results);
    let workloads = workloads_in(results);
    for threads in thread_counts(results) {
        let _ = writeln!(
            md,
            "## Throughput, {threads} thread(s) (K operations/s; × = against the best peer that is not logheap)\n"
        );
        let _ = write!(md, "| workload |");
        for s in &stores {
            let _ = write!(md, " {s} |");
        }
        let _ = writeln!(md, " best logheap × best peer |");
        let _ = writeln!(md, "|---|{}---|", "---|".repeat(stores.len()));
        for w in &workloads {
            let _ = write!(md, "| {w}: {} |", w.describe());
            let (mut best_logheap, mut best_peer) = (None::<f64>, None::<f64>);
            for s in &stores {
                match find(results, s, *w, threads) {
                    Some(r) => {
                        let t = r.run.throughput;
                        let slot = if s.starts_with("logheap-") {
                            &mut best_logheap
                        } else {
                            &mut best_peer
                        };
                        *slot = Some(slot.map_or(t, |b| b.max(t)));
                        let _ = write!(md, " {:.1} |", t / 1000.0);
                    }
                    None => md.push_str(" — |"),
                }
            }
            match (best_logheap, best_peer) {
                (Some(l), Some(p)) => {
                    let _ = writeln!(md, " {:.2} |", l / p);
                }
                _ => md.push_str(" — |\n"),
            }
        }
        md.push('\n');
    }
    md.push_str("## Latency (µs: p50 / p99 / p99.9)\n\n");
    md.push_str(
        "| workload | threads | store | load INSERT | run operations |\n|---|---|---|---|---|\n",
    );
    for r in results {
        let pct = |l: &crate::runner::Latency| {
            format!("{:.1} / {:.1} / {:.1}", l.p50_us, l.p99_us, l.p999_us)
        };
        let load = r.load.latency.get("INSERT").map(pct).unwrap_or_default();
        let run: Vec<String> = r
            .run
            .latency
            .iter()
            .map(|(op, l)| format!("{op} {}", pct(l)))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {load} | {} |",
            r.workload,
            r.threads,
            r.store,
            run.join("; ")
        );
    }
    md.push_str(
        "\n## Load phase (K inserts/s)\n\n| store | threads | throughput |\n|---|---|---|\n",
    );
    let mut seen = Vec::new();
    for r in results {
        if seen.contains(&(&r.store, r.threads)) {
            continue;
        }
        seen.push((&r.store, r.threads));
        let loads: Vec<f64> = results
            .iter()
            .filter(|x| x.store == r.store && x.threads == r.threads)
            .map(|x| x.load.throughput)
            .collect();
        let mean = loads.iter().sum::<f64>() / loads.len() as f64;
        let _ = writeln!(md, "| {} | {} | {:.1} |", r.store, r.threads, mean / 1000.0);
    }
    md.push_str("\n## How each store made commits durable\n\n");
    for s in &stores {
        if let Some(r) = results.iter().find(|r| &r.store == s) {
            let _ = writeln!(md, "- **{s}**: {}", r.durability);
        }
    }
    let misses: u64 = results.iter().map(|r| r.run.misses).sum();
    let _ = writeln!(
        md,
        "\nRecords not found by reads, updates and read-modify-writes: {misses}."
    );
    md
}
