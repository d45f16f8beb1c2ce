//! Reports: one JSON object per run, and a Markdown table of throughput with ratios to
//! the Base mapping configuration and to the PMDK peer engine.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::harness::RunResult;

/// The Markdown report of a set of runs: throughput per workload and engine (with the
/// ratios to `log-base` and to `pmdk` where they ran), and write traffic per
/// transaction (`-` where an engine does not measure a figure).
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
    let pmdk = crate::pmdk::ENGINE;
    let pmdk_ran = engines.iter().any(|e| e == pmdk);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Throughput (transactions per second; {})\n",
        if pmdk_ran {
            "ratios to log-base and to pmdk"
        } else {
            "ratio to log-base"
        }
    );
    let _ = writeln!(out, "| workload | threads | {} |", engines.join(" | "));
    let _ = writeln!(out, "|---|---|{}", "---|".repeat(engines.len()));
    for ((_, w, threads), by_engine) in &rows {
        let base = by_engine.get("log-base").map(|r| r.tx_per_s);
        let peer = by_engine.get(pmdk).map(|r| r.tx_per_s);
        let cells: Vec<String> = engines
            .iter()
            .map(|e| match by_engine.get(e) {
                None => "".into(),
                Some(r) => {
                    let mut ratios = Vec::new();
                    if let Some(b) = base.filter(|&b| b > 0.0) {
                        let label = if pmdk_ran { " log-base" } else { "" };
                        ratios.push(format!("{:.2}x{label}", r.tx_per_s / b));
                    }
                    if let Some(p) = peer.filter(|&p| p > 0.0 && e != pmdk) {
                        ratios.push(format!("{:.2}x pmdk", r.tx_per_s / p));
                    }
                    if ratios.is_empty() {
                        format!("{:.0}", r.tx_per_s)
                    } else {
                        format!("{:.0} ({})", r.tx_per_s, ratios.join(", "))
                    }
                }
            })
            .collect();
        let _ = writeln!(out, "| {w} | {threads} | {} |", cells.join(" | "));
    }
    if pmdk_ran && results.iter().any(|r| r.emulated) {
        let _ = writeln!(
            out,
            "\npmdk ran without NVM emulation (libpmemobj has no hook at its fences), the other engines with it: compare them with `--emulation off`."
        );
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
                    "| {w} | {e} | {} | {} | {} | {} | {} | {:.3} | {} | {} | {} |",
                    fixed(r.fences_per_tx, 2),
                    fixed(r.lines_flushed_per_tx, 2),
                    fixed(r.media_bytes_per_tx, 0),
                    fixed(r.payload_bytes_per_tx, 0),
                    fixed(r.write_amplification, 2),
                    r.aborts_per_tx,
                    r.node_cache_hit_ratio
                        .map_or("-".into(), |x| format!("{:.1}%", 100.0 * x)),
                    r.dram_bytes.map_or("-".into(), mib),
                    r.pm_bytes_used.map_or("-".into(), mib),
                );
            }
        }
    }
    out
}

/// `x` with `digits` decimals, or `-` when not measured.
fn fixed(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}
