//! The paper's §5.3 comparison (Fig. 7 and 8): the log-structured engine (`log`)
//! against the logging engines `redo` (Mnemosyne) and `undo` (Mnemosyne-Undo), per
//! workload and thread count, and on average over the workloads that ran.
//!
//! For each pair the figures are: the log engine's throughput advantage
//! (`log / baseline - 1`, Fig. 7), and the share of the baseline's write traffic and of
//! its dirty bytes that the log engine saves (`1 - log / baseline`, Fig. 8). The report
//! ([`crate::report`]) prints them beside the paper's figures ([`PAPER`]); the plots
//! ([`crate::plots`]) draw them.

use crate::harness::RunResult;
use crate::workload::Workload;

/// The log-structured engine of the comparison.
pub const LOG: &str = "log";
/// The logging engines it is compared with, in the paper's order.
pub const BASELINES: [&str; 2] = ["redo", "undo"];

/// The paper's averages, per baseline (redo, undo).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaperFigures {
    /// Throughput advantage with one thread (Fig. 7 a): +37.3% / +66.1%.
    pub speedup_one_thread: [f64; 2],
    /// Throughput advantage with four threads (Fig. 7 b): +44.7% / +80.8%.
    pub speedup_four_threads: [f64; 2],
    /// Write traffic saved (Fig. 8): 82.8% / 82.0%.
    pub traffic_saved: [f64; 2],
    /// Dirty bytes saved (Fig. 8): 80.1% / 65.1%.
    pub dirty_saved: [f64; 2],
}

/// "Log-structured Non-volatile Main Memory" §5.3, against Mnemosyne and Mnmsyn-Undo.
pub const PAPER: PaperFigures = PaperFigures {
    speedup_one_thread: [0.373, 0.661],
    speedup_four_threads: [0.447, 0.808],
    traffic_saved: [0.828, 0.820],
    dirty_saved: [0.801, 0.651],
};

/// The log engine against one baseline on one workload and thread count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Versus {
    /// `log / baseline - 1` in transactions per second.
    pub speedup: f64,
    /// `1 - log / baseline` in media bytes per transaction (`None`: not measured).
    pub traffic_saved: Option<f64>,
    /// `1 - log / baseline` in dirty bytes per transaction (`None`: not measured).
    pub dirty_saved: Option<f64>,
}

/// One row of the comparison: a workload on a thread count, against each baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The workload.
    pub workload: Workload,
    /// Threads.
    pub threads: usize,
    /// Value size of the runs.
    pub value_size: usize,
    /// Whether the `log` run was emulated (a baseline is compared with it only when it
    /// was run the same way).
    pub emulated: bool,
    /// Against `redo` and `undo`, in [`BASELINES`] order (`None`: that one did not run).
    pub against: [Option<Versus>; 2],
}

/// `1 - log / base`, when both were measured and the base is not zero.
fn saved(log: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (log, base) {
        (Some(l), Some(b)) if b > 0.0 => Some(1.0 - l / b),
        _ => None,
    }
}

fn versus(log: &RunResult, base: &RunResult) -> Option<Versus> {
    (base.tx_per_s > 0.0 && log.emulated == base.emulated).then(|| Versus {
        speedup: log.tx_per_s / base.tx_per_s - 1.0,
        traffic_saved: saved(log.media_bytes_per_tx, base.media_bytes_per_tx),
        dirty_saved: saved(log.dirty_bytes_per_tx, base.dirty_bytes_per_tx),
    })
}

/// Every (value size, threads, workload) on which `log` and at least one baseline ran
/// the same way (emulated or not), smaller values and fewer threads first, workloads
/// in the paper's order. Runs in pools sized to a utilisation and allocator or
/// fragmentation runs are not part of it.
pub fn rows(results: &[RunResult]) -> Vec<Row> {
    let standard: Vec<&RunResult> = results
        .iter()
        .filter(|r| {
            r.space.utilisation.is_none()
                && !r.workload.is_fragmentation()
                && !r.workload.is_allocator()
        })
        .collect();
    let find = |engine: &str, workload: Workload, threads: usize, size: usize| {
        standard.iter().copied().find(|r| {
            r.engine == engine
                && r.workload == workload
                && r.threads == threads
                && r.value_size == size
        })
    };
    let mut shapes: Vec<(usize, usize)> =
        standard.iter().map(|r| (r.value_size, r.threads)).collect();
    shapes.sort_unstable();
    shapes.dedup();
    let mut out = Vec::new();
    for &(size, t) in &shapes {
        for w in Workload::ALL {
            let Some(log) = find(LOG, w, t, size) else {
                continue;
            };
            let against = BASELINES.map(|b| find(b, w, t, size).and_then(|base| versus(log, base)));
            if against.iter().any(Option::is_some) {
                out.push(Row {
                    workload: w,
                    threads: t,
                    value_size: size,
                    emulated: log.emulated,
                    against,
                });
            }
        }
    }
    out
}

/// The mean over `rows` of one figure against baseline `b` (an index into
/// [`BASELINES`]), over the rows where it was measured; `None` when none was.
pub fn mean(rows: &[&Row], b: usize, figure: impl Fn(&Versus) -> Option<f64>) -> Option<f64> {
    let values: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.against[b].as_ref().and_then(&figure))
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(engine: &str, workload: Workload, threads: usize, tx: f64, media: f64) -> RunResult {
        RunResult {
            tx_per_s: tx,
            emulated: true,
            media_bytes_per_tx: Some(media),
            dirty_bytes_per_tx: Some(media / 2.0),
            ..RunResult::unmeasured(engine, workload, threads)
        }
    }

    #[test]
    fn rows_compare_log_with_each_baseline_and_average_them() {
        let results = vec![
            run("log", Workload::Sps, 1, 150.0, 100.0),
            run("redo", Workload::Sps, 1, 100.0, 400.0),
            run("undo", Workload::Sps, 1, 200.0, 200.0),
            run("log", Workload::RbtreeIns, 1, 100.0, 100.0),
            run("redo", Workload::RbtreeIns, 1, 50.0, 200.0),
            // No undo run for rbtree-ins; no baseline at all on two threads.
            run("log", Workload::Sps, 2, 100.0, 100.0),
        ];
        let rows = rows(&results);
        assert_eq!(rows.len(), 2, "{rows:?}");
        let sps = &rows[0];
        assert_eq!((sps.workload, sps.threads), (Workload::Sps, 1));
        let redo = sps.against[0].unwrap();
        assert!((redo.speedup - 0.5).abs() < 1e-9);
        assert_eq!(redo.traffic_saved, Some(0.75));
        assert_eq!(redo.dirty_saved, Some(0.75));
        let undo = sps.against[1].unwrap();
        assert!((undo.speedup + 0.25).abs() < 1e-9);
        assert_eq!(undo.traffic_saved, Some(0.5));
        assert_eq!(rows[1].against[1], None);
        let all: Vec<&Row> = rows.iter().collect();
        let speedup = |v: &Versus| Some(v.speedup);
        assert!((mean(&all, 0, speedup).unwrap() - 0.75).abs() < 1e-9);
        assert!((mean(&all, 1, speedup).unwrap() + 0.25).abs() < 1e-9);
        assert_eq!(mean(&[], 0, speedup), None);
    }

    #[test]
    fn each_value_size_is_compared_with_its_own_runs() {
        let mut results = Vec::new();
        for (size, redo_tx) in [(64, 100.0), (1024, 300.0)] {
            for (engine, tx) in [("log", 150.0), ("redo", redo_tx)] {
                let mut r = run(engine, Workload::Sps, 1, tx, 100.0);
                r.value_size = size;
                results.push(r);
            }
        }
        let rows = rows(&results);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].value_size, rows[1].value_size), (64, 1024));
        assert!((rows[0].against[0].unwrap().speedup - 0.5).abs() < 1e-9);
        assert!((rows[1].against[0].unwrap().speedup + 0.5).abs() < 1e-9);
    }

    #[test]
    fn an_emulated_run_is_not_compared_with_one_that_was_not() {
        let mut redo = run("redo", Workload::Sps, 1, 100.0, 400.0);
        redo.emulated = false;
        let results = vec![run("log", Workload::Sps, 1, 150.0, 100.0), redo];
        assert!(rows(&results).is_empty());
    }
}
