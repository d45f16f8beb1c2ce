//! Reports: one JSON object per run, and a Markdown table of throughput with ratios to
//! the Base mapping configuration.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::harness::RunResult;

/// The Markdown report of a set of runs: throughput per workload and engine (with the
/// ratio to `log-base` where it ran), and write traffic per transaction.
pub fn markdown(results: &[RunResult]) -> String {
    let mut engines: Vec<String> = Vec::new();
    for r in results {
        if !engines.contains(&r.engine) {
            engines.push(r.engine.clone());
        }
    }
    // (workload, threads) -> engine -> result
    let mut rows: BTreeMap<(usize, String, usize), BTreeMap<String, &RunResult>> = BTreeMap::new();
    let order = |w: &str| {
        crate::Workload::ALL
            .iter()
            .position(|x| x.name() == w)
            .unwrap_or(usize::MAX)
    };
    for r in results {
        let w = r.workload.name().to_string();
        rows.entry((order(&w), w, r.threads))
            .or_default()
            .insert(r.engine.clone(), r);
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Throughput (transactions per second; ratio to log-base)\n"
    );
    let _ = writeln!(out, "| workload | threads | {} |", engines.join(" | "));
    let _ = writeln!(out, "|---|---|{}", "---|".repeat(engines.len()));
    for ((_, w, threads), by_engine) in &rows {
        let base = by_engine.get("log-base").map(|r| r.tx_per_s);
        let cells: Vec<String> = engines
            .iter()
            .map(|e| match by_engine.get(e) {
                None => "".into(),
                Some(r) => match base {
                    Some(b) if b > 0.0 => format!("{:.0} ({:.2}x)", r.tx_per_s, r.tx_per_s / b),
                    _ => format!("{:.0}", r.tx_per_s),
                },
            })
            .collect();
        let _ = writeln!(out, "| {w} | {threads} | {} |", cells.join(" | "));
    }
    let _ = writeln!(
        out,
        "\n### Per transaction (one thread where it ran)\n\n| workload | engine | fences | lines flushed | media bytes | payload bytes | write amplification | aborts | node-cache hits | mapping DRAM | PM used |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for ((_, w, threads), by_engine) in &rows {
        if *threads != 1 && rows.keys().any(|(_, w2, t)| w2 == w && *t == 1) {
            continue;
        }
        for e in &engines {
            if let Some(r) = by_engine.get(e) {
                let _ = writeln!(
                    out,
                    "| {w} | {e} | {:.2} | {:.2} | {:.0} | {:.0} | {} | {:.3} | {} | {} | {} |",
                    r.fences_per_tx,
                    r.lines_flushed_per_tx,
                    r.media_bytes_per_tx,
                    r.payload_bytes_per_tx,
                    r.write_amplification
                        .map_or("-".into(), |x| format!("{x:.2}")),
                    r.aborts_per_tx,
                    r.node_cache_hit_ratio
                        .map_or("-".into(), |x| format!("{:.1}%", 100.0 * x)),
                    mib(r.dram_bytes),
                    mib(r.pm_bytes_used),
                );
            }
        }
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}
