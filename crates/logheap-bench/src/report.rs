//! Reports: one JSON object per run, and a Markdown table of throughput with ratios to
//! the Base mapping configuration and to the PMDK peer engine.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::harness::RunResult;

/// The Markdown report of a set of runs: throughput per workload and engine (with the
/// ratios to `log-base` and to `pmdk` where they ran), and write traffic per
/// transaction (`-` where an engine does not measure a figure).
pub fn markdown(results: &[RunResult]) -> String {
    let (batches, results): (Vec<RunResult>, Vec<RunResult>) = results
        .iter()
        .cloned()
        .partition(|r| r.workload == crate::Workload::AllocBatch);
    let (special, standard): (Vec<RunResult>, Vec<RunResult>) = results
        .into_iter()
        .partition(|r| r.workload.is_fragmentation() || r.space.utilisation.is_some());
    let mut out = if standard.is_empty() {
        String::new()
    } else {
        standard_tables(&standard)
    };
    for c in &crate::versus::ALL {
        out.push_str(&versus_table(&standard, c));
    }
    out.push_str(&alloc_batch_table(&batches));
    out.push_str(&cleaning_tables(&special));
    out
}

/// The tables of the runs of the paper's workloads in pools with room for everything.
fn standard_tables(results: &[RunResult]) -> String {
    let mut engines: Vec<String> = Vec::new();
    for r in results {
        if !engines.contains(&r.engine) {
            engines.push(r.engine.clone());
        }
    }
    // (workload, threads) -> engine -> result
    let mut rows: BTreeMap<(usize, String, usize), BTreeMap<String, &RunResult>> = BTreeMap::new();
    let order = |w: &str| {
        crate::Workload::DEFAULT_RUN
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
                    if let Some(l) = by_engine
                        .get("log")
                        .map(|l| l.tx_per_s)
                        .filter(|&l| l > 0.0 && e == crate::harness::LOG_CLEANING)
                    {
                        ratios.push(format!("{:.2}x log", r.tx_per_s / l));
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
        "\n### Per transaction (one thread where it ran)\n\n| workload | engine | fences | lines flushed | media bytes | dirty bytes | payload bytes | write amplification | aborts | node-cache hits | mapping DRAM | PM used |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for ((_, w, threads), by_engine) in &rows {
        if *threads != 1 && rows.keys().any(|(_, w2, t)| w2 == w && *t == 1) {
            continue;
        }
        for e in &engines {
            if let Some(r) = by_engine.get(e) {
                let _ = writeln!(
                    out,
                    "| {w} | {e} | {} | {} | {} | {} | {} | {} | {:.3} | {} | {} | {} |",
                    fixed(r.fences_per_tx, 2),
                    fixed(r.lines_flushed_per_tx, 2),
                    fixed(r.media_bytes_per_tx, 0),
                    fixed(r.dirty_bytes_per_tx, 0),
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

/// The tables of the fragmentation runs (Fig. 9) and of the runs in pools sized to a
/// utilisation (Fig. 11); empty without such runs.
fn cleaning_tables(results: &[RunResult]) -> String {
    let mut out = String::new();
    let frag: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.workload.is_fragmentation())
        .collect();
    if !frag.is_empty() {
        let _ = writeln!(
            out,
            "\n### Fragmentation (Fig. 9): 1 - live bytes / bytes held\n\nLog engine, compacted: the same after `Pool::compact` at the end.\n\n| workload | engine | fragmentation | compacted | live MiB | held MiB | held compacted MiB | allocator's in-use MiB | allocations | frees | log pool MiB | chunks cleaned (fast) | MiB moved | seconds |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        let mib_of = |x: Option<u64>| {
            x.map_or("-".into(), |b| {
                format!("{:.1}", b as f64 / (1 << 20) as f64)
            })
        };
        let percent = |f: Option<f64>| f.map_or("-".into(), |f| format!("{:.1}%", 100.0 * f));
        for r in frag {
            let s = &r.space;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} |",
                r.workload,
                r.engine,
                percent(s.fragmentation),
                percent(s.compacted_fragmentation),
                mib_of(s.live_bytes),
                mib_of(s.held_bytes),
                mib_of(s.compacted_held_bytes),
                mib_of(s.allocator_bytes),
                s.allocations.map_or("-".into(), |x| x.to_string()),
                s.frees.map_or("-".into(), |x| x.to_string()),
                mib_of(s.pool_bytes),
                match (s.chunks_cleaned, s.chunks_fast_cleaned) {
                    (Some(c), Some(f)) => format!("{c} ({f})"),
                    _ => "-".into(),
                },
                mib_of(s.cleaner_bytes_moved),
                r.seconds,
            );
        }
    }
    let mut swept: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.space.utilisation.is_some())
        .collect();
    if !swept.is_empty() {
        swept.sort_by(|a, b| {
            (
                &a.engine,
                a.workload.name(),
                a.value_size,
                a.threads,
                a.space.cleaner_threads,
            )
                .cmp(&(
                    &b.engine,
                    b.workload.name(),
                    b.value_size,
                    b.threads,
                    b.space.cleaner_threads,
                ))
                .then(
                    a.space
                        .utilisation
                        .partial_cmp(&b.space.utilisation)
                        .unwrap_or(std::cmp::Ordering::Equal),
                )
        });
        let _ = writeln!(
            out,
            "\n### Throughput against log utilisation (Fig. 11)\n\nUtilisation: live log bytes after the preload / (chunks x chunk size). Relative: to the lowest utilisation of the same engine, workload, value size, threads and background cleaner threads. Turnover: bytes written to the log in the measured phase / the log's size.\n\n| engine | workload | value B | threads | cleaner threads | utilisation | transactions | tx/s | relative | chunks cleaned (fast) | moved MB/s | reclaimed MB/s | refused (PoolFull) | turnover | pool MiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &swept {
            let s = &r.space;
            let lowest = swept
                .iter()
                .filter(|o| {
                    (
                        &o.engine,
                        o.workload,
                        o.value_size,
                        o.threads,
                        o.space.cleaner_threads,
                    ) == (
                        &r.engine,
                        r.workload,
                        r.value_size,
                        r.threads,
                        r.space.cleaner_threads,
                    )
                })
                .min_by(|a, b| {
                    a.space
                        .utilisation
                        .partial_cmp(&b.space.utilisation)
                        .unwrap_or(std::cmp::Ordering::Equal)
                })
                .map_or(r.tx_per_s, |o| o.tx_per_s);
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.1}% | {}{} | {:.0} | {:.2}x | {} ({}) | {} | {} | {} | {} | {:.1} |",
                r.engine,
                r.workload,
                r.value_size,
                r.threads,
                s.cleaner_threads.map_or("-".into(), |t| t.to_string()),
                100.0 * s.utilisation.unwrap_or(0.0),
                r.ops,
                if s.time_limited == Some(true) {
                    " (time limit)"
                } else {
                    ""
                },
                r.tx_per_s,
                r.tx_per_s / lowest.max(1e-9),
                s.chunks_cleaned.unwrap_or(0),
                s.chunks_fast_cleaned.unwrap_or(0),
                fixed(s.moved_mb_per_s, 1),
                fixed(s.reclaimed_mb_per_s, 1),
                s.pool_full.unwrap_or(0),
                fixed(s.log_turnover, 1),
                s.pool_bytes.unwrap_or(0) as f64 / (1 << 20) as f64,
            );
        }
    }
    out
}

/// A comparison of the source documents ([`crate::versus`]), per workload and on
/// average, beside the paper's averages; empty when its engines did not run together.
fn versus_table(results: &[RunResult], c: &crate::versus::Comparison) -> String {
    use crate::versus::{self, Versus};
    let rows = versus::rows(results, c);
    let mut out = String::new();
    if rows.is_empty() {
        return out;
    }
    let signed = |x: Option<f64>| x.map_or("-".into(), |x| format!("{:+.1}%", 100.0 * x));
    let share = |x: Option<f64>| x.map_or("-".into(), |x| format!("{:.1}%", 100.0 * x));
    // Column groups: (label, figure, format as a signed change).
    type Figure = fn(&Versus) -> Option<f64>;
    let groups: [(&str, Figure, bool); 4] = [
        ("throughput", |v| Some(v.speedup), true),
        ("latency saved", |v| Some(v.latency_saved()), false),
        ("write traffic saved", |v| v.traffic_saved, false),
        ("dirty bytes saved", |v| v.dirty_saved, false),
    ];
    let nb = c.baselines.len();
    let mut header = String::from("| workload | threads | emulated |");
    for (label, _, _) in &groups {
        for (k, b) in c.baselines.iter().enumerate() {
            if k == 0 {
                let _ = write!(header, " {label} vs {b} |");
            } else {
                let _ = write!(header, " vs {b} |");
            }
        }
    }
    let _ = writeln!(
        out,
        "\n### {}\n\nThroughput: `{s} / baseline - 1`; latency saved: `1 - baseline / {s}` in throughput (time per transaction); write traffic and dirty bytes saved: `1 - {s} / baseline`, per transaction.\n\n{header}\n|---|---|---|{}",
        c.heading,
        "---|".repeat(4 * nb),
        s = c.subject,
    );
    let cells = |value: &dyn Fn(usize, Figure) -> Option<f64>| -> String {
        let mut cells = Vec::new();
        for &(_, figure, signed_change) in &groups {
            for b in 0..nb {
                let x = value(b, figure);
                cells.push(if signed_change { signed(x) } else { share(x) });
            }
        }
        cells.join(" | ")
    };
    let mut shapes: Vec<(usize, usize)> = rows.iter().map(|r| (r.value_size, r.threads)).collect();
    shapes.dedup();
    let sizes_differ = shapes.iter().any(|s| s.0 != shapes[0].0);
    for (size, t) in shapes {
        let of_t: Vec<&versus::Row> = rows
            .iter()
            .filter(|r| (r.value_size, r.threads) == (size, t))
            .collect();
        let sized = |w: String| {
            if sizes_differ {
                format!("{w} ({size} B)")
            } else {
                w
            }
        };
        for r in &of_t {
            let _ = writeln!(
                out,
                "| {} | {t} | {} | {} |",
                sized(r.workload.to_string()),
                if r.emulated { "yes" } else { "no" },
                cells(&|b, f| r.against[b].as_ref().and_then(f))
            );
        }
        let means = cells(&|b, f| versus::mean(&of_t, b, f));
        let bold: Vec<String> = means.split(" | ").map(|m| format!("**{m}**")).collect();
        let _ = writeln!(
            out,
            "| **{}** | {t} | | {} |",
            sized("mean".into()),
            bold.join(" | ")
        );
    }
    let paper: Vec<String> = c
        .paper
        .iter()
        .flat_map(|group| {
            group.iter().map(|x| {
                if x.is_empty() {
                    String::new()
                } else {
                    format!("*{x}*")
                }
            })
        })
        .collect();
    let _ = writeln!(
        out,
        "| *paper* | | {} | {} |",
        c.paper_setting,
        paper.join(" | ")
    );
    out
}

/// The `alloc-batch` runs: persistence traffic per allocation or free, by engine,
/// threads and allocations per transaction; empty without such runs.
fn alloc_batch_table(results: &[RunResult]) -> String {
    let mut out = String::new();
    if results.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\n### Allocations batched in transactions (alloc-batch; per allocation or free)\n\n| engine | threads | allocations per transaction | fences | lines flushed | media bytes | dirty bytes | allocations and frees / s |\n|---|---|---|---|---|---|---|---|"
    );
    for r in results {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.engine,
            r.threads,
            r.alloc_batch.map_or("-".into(), |b| b.to_string()),
            fixed(r.fences_per_tx, 3),
            fixed(r.lines_flushed_per_tx, 3),
            fixed(r.media_bytes_per_tx, 1),
            fixed(r.dirty_bytes_per_tx, 1),
            fixed(r.ops_per_s, 0),
        );
    }
    out
}

/// `x` with `digits` decimals, or `-` when it was not measured.
pub fn fixed(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Workload;

    fn result(engine: &str, workload: Workload, threads: usize, tx_per_s: f64) -> RunResult {
        let pmdk = engine == crate::pmdk::ENGINE;
        let measured = |x: f64| (!pmdk).then_some(x);
        RunResult {
            engine: engine.into(),
            config: engine.into(),
            workload,
            threads,
            ops: 1000,
            elements: 500,
            value_size: 128,
            durability: None,
            emulated: false,
            seconds: 1000.0 / tx_per_s,
            tx_per_s,
            ops_per_s: None,
            alloc_batch: None,
            fences_per_tx: measured(1.0),
            fences_per_write_tx: measured(1.0),
            lines_flushed_per_tx: measured(3.0),
            nt_bytes_per_tx: measured(256.0),
            media_bytes_per_tx: measured(448.0),
            dirty_bytes_per_tx: measured(300.0),
            payload_bytes_per_tx: measured(150.0),
            write_amplification: measured(2.99),
            emulated_ns_per_tx: None,
            aborts_per_tx: 0.0,
            lookups: None,
            lookups_found: None,
            node_cache_hit_ratio: None,
            dram_bytes: (!pmdk).then_some(1 << 20),
            pm_bytes_used: Some(2 << 20),
            preload_seconds: 0.1,
            space: Default::default(),
        }
    }

    #[test]
    fn throughput_cells_carry_ratios_to_log_base_and_to_pmdk() {
        let w = Workload::HashtableUpd;
        let results = [
            result("log-base", w, 1, 100_000.0),
            result("log", w, 1, 200_000.0),
            result("pmdk", w, 1, 400_000.0),
            result("log", w, 2, 300_000.0),
            result("pmdk", w, 2, 150_000.0),
        ];
        let md = markdown(&results);
        assert!(md.contains("ratios to log-base and to pmdk"), "{md}");
        assert!(
            md.contains(
                "| hashtable-upd | 1 | 100000 (1.00x log-base, 0.25x pmdk) | 200000 (2.00x log-base, 0.50x pmdk) | 400000 (4.00x log-base) |"
            ),
            "{md}"
        );
        // No log-base on two threads: the ratio to pmdk alone.
        assert!(
            md.contains("| hashtable-upd | 2 |  | 300000 (2.00x pmdk) | 150000 |"),
            "{md}"
        );
        // What pmdk does not measure is "-", not 0.
        assert!(
            md.contains(
                "| hashtable-upd | pmdk | - | - | - | - | - | - | 0.000 | - | - | 2.0 MiB |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| hashtable-upd | log | 1.00 | 3.00 | 448 | 300 | 150 | 2.99 |"),
            "{md}"
        );
    }

    #[test]
    fn without_pmdk_the_table_is_as_before() {
        let w = Workload::Sps;
        let md = markdown(&[result("log-base", w, 1, 100.0), result("log", w, 1, 150.0)]);
        assert!(
            md.contains("| sps | 1 | 100 (1.00x) | 150 (1.50x) |"),
            "{md}"
        );
        assert!(!md.contains("pmdk"), "{md}");
        assert!(!md.contains("against redo and undo"), "{md}");
    }

    #[test]
    fn log_against_redo_and_undo_is_reported_per_workload_on_average_and_beside_the_paper() {
        let mut results = Vec::new();
        for (w, log, redo, undo) in [
            (Workload::Sps, 150.0, 100.0, 200.0),
            (Workload::HashtableUpd, 100.0, 50.0, 100.0),
        ] {
            for (engine, tx) in [("log", log), ("redo", redo), ("undo", undo)] {
                let mut r = result(engine, w, 1, tx);
                if engine != "log" {
                    r.media_bytes_per_tx = Some(896.0);
                    r.dirty_bytes_per_tx = Some(1200.0);
                }
                results.push(r);
            }
        }
        let md = markdown(&results);
        assert!(
            md.contains(
                "| sps | 1 | no | +50.0% | -25.0% | 33.3% | -33.3% | 50.0% | 50.0% | 75.0% | 75.0% |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| hashtable-upd | 1 | no | +100.0% | +0.0% |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| **mean** | 1 | | **+75.0%** | **-12.5%** | **41.7%** | **-16.7%** | **50.0%** |"
            ),
            "{md}"
        );
        assert!(md.contains("*+37.3% / +44.7%*"), "{md}");
        assert!(!md.contains("oop against"), "no oop run: no oop table");
    }

    #[test]
    fn alloc_batch_runs_get_their_own_table_per_batch() {
        let mut results = Vec::new();
        for batch in [1, 8] {
            let mut r = result("redo", Workload::AllocBatch, 1, 10.0);
            r.alloc_batch = Some(batch);
            r.fences_per_tx = Some(1.0 / batch as f64);
            r.ops_per_s = Some(1000.0);
            results.push(r);
        }
        let md = markdown(&results);
        assert!(
            md.contains("| redo | 1 | 1 | 1.000 | 3.000 | 448.0 | 300.0 | 1000 |"),
            "{md}"
        );
        assert!(md.contains("| redo | 1 | 8 | 0.125 |"), "{md}");
        assert!(!md.contains("### Throughput"), "{md}");
    }

    #[test]
    fn mixing_emulated_runs_with_pmdk_says_so() {
        let w = Workload::Sps;
        let mut log = result("log", w, 1, 100.0);
        log.emulated = true;
        let md = markdown(&[log, result("pmdk", w, 1, 150.0)]);
        assert!(md.contains("pmdk ran without NVM emulation"), "{md}");
    }

    #[test]
    fn results_written_before_pmdk_and_by_pmdk_both_parse() {
        // A line from a results.jsonl of before this change: every figure a number.
        let old = r#"{"engine":"log","config":"full","workload":"sps","threads":1,"ops":20000,"elements":50000,"value_size":128,"emulated":true,"seconds":0.5,"tx_per_s":40000.0,"fences_per_tx":1.0,"fences_per_write_tx":1.0,"lines_flushed_per_tx":0.5,"nt_bytes_per_tx":192.0,"media_bytes_per_tx":224.0,"payload_bytes_per_tx":16.0,"write_amplification":14.0,"aborts_per_tx":0.0,"node_cache_hit_ratio":0.9,"dram_bytes":1048576,"pm_bytes_used":2097152,"preload_seconds":0.3}"#;
        let r: RunResult = serde_json::from_str(old).unwrap();
        assert_eq!(r.fences_per_tx, Some(1.0));
        assert_eq!(r.dram_bytes, Some(1 << 20));
        let pmdk = result("pmdk", Workload::Sps, 1, 10.0);
        let line = serde_json::to_string(&pmdk).unwrap();
        assert!(line.contains(r#""fences_per_tx":null"#), "{line}");
        let back: RunResult = serde_json::from_str(&line).unwrap();
        assert_eq!(back.fences_per_tx, None);
        assert_eq!(back.pm_bytes_used, Some(2 << 20));
        // A figure left out reads as not measured.
        let trimmed = old.replace(r#""dram_bytes":1048576,"#, "");
        let r: RunResult = serde_json::from_str(&trimmed).unwrap();
        assert_eq!(r.dram_bytes, None);
    }
}
