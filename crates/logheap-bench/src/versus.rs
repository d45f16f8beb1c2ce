//! Engine-against-baselines comparisons of the source documents, per workload and
//! thread count and on average over the workloads that ran:
//! - [`LOGGING`]: the log-structured engine (`log`) against the logging engines `redo`
//!   (Mnemosyne) and `undo` (Mnemosyne-Undo), "Log-structured Non-volatile Main
//!   Memory" §5.3, Fig. 7 and 8;
//! - [`OUT_OF_PLACE`]: 003's out-of-place engine (`oop`) against `undo`, `redo` and
//!   `hoop` (003 §4.2, Fig. 9-11);
//! - [`FAST_LOG_REDO`], [`FAST_LOG_UNDO`]: `redo` and `undo` with 001's fast log buffer
//!   against themselves (001 §6);
//! - [`PERSIST_POLICY`]: `undo` with 001's adaptive persist policy against each static
//!   one (001 §6).
//!
//! For each pair the figures are: the subject's throughput advantage
//! (`subject / baseline - 1`), the share of the baseline's time per transaction it
//! saves (`1 - baseline / subject` in throughput: the latency of a transaction on one
//! thread), and the share of the baseline's write traffic and dirty bytes it saves
//! (`1 - subject / baseline`). The report ([`crate::report`]) prints them beside the
//! paper's figures; the plots ([`crate::plots`]) draw them.

use crate::harness::RunResult;
use crate::workload::Workload;

/// One comparison: a subject engine, its baselines, and what the paper reports.
#[derive(Debug, Clone, Copy)]
pub struct Comparison {
    /// The engine compared.
    pub subject: &'static str,
    /// The engines it is compared with, in the paper's order.
    pub baselines: &'static [&'static str],
    /// The report's heading.
    pub heading: &'static str,
    /// The paper's figures: per column group (throughput, latency saved, write traffic
    /// saved, dirty bytes saved), one text per baseline (empty: not reported).
    pub paper: [&'static [&'static str]; 4],
    /// The paper's setting, for the report's paper row.
    pub paper_setting: &'static str,
    /// File stems of the relative-throughput and the traffic figures.
    pub figures: (&'static str, &'static str),
    /// Titles of those figures.
    pub titles: (&'static str, &'static str),
}

/// "Log-structured Non-volatile Main Memory" §5.3, against Mnemosyne and Mnmsyn-Undo
/// (throughput: one thread / four threads).
pub const LOGGING: Comparison = Comparison {
    subject: "log",
    baselines: &["redo", "undo"],
    heading: "log against redo and undo logging (§5.3, Fig. 7 and 8)",
    paper: [
        &["+37.3% / +44.7%", "+66.1% / +80.8%"],
        &["", ""],
        &["82.8%", "82.0%"],
        &["80.1%", "65.1%"],
    ],
    paper_setting: "1 / 4 threads, 500 ns, 1 GB/s",
    figures: ("fig7-vs-logging", "fig8-traffic-vs-logging"),
    titles: (
        "Fig. 7: log throughput relative to redo and undo logging (1 = the same)",
        "Fig. 8: write traffic and dirty bytes per transaction",
    ),
};

/// 003 §4.2 (micro-benchmarks, averages), against undo logging, redo logging and HOOP.
/// Its "write number" is compared with write traffic here (lines written).
pub const OUT_OF_PLACE: Comparison = Comparison {
    subject: "oop",
    baselines: &["undo", "redo", "hoop"],
    heading: "oop against undo, redo and hoop (003 §4.2, Fig. 9-11)",
    paper: [
        &["+95.5%", "+71.2%", "+9.6%"],
        &["46.8%", "28.8%", "3.9%"],
        &["41.5%", "37.8%", "18.5%"],
        &["", "", ""],
    ],
    paper_setting: "McSimA+, PCM timings",
    figures: ("oop-vs-baselines", "oop-writes"),
    titles: (
        "oop throughput relative to undo, redo and hoop (1 = the same)",
        "Write traffic and dirty bytes per transaction",
    ),
};

/// 001 §6 (on-chip logging against logging to off-chip persistent memory): 2.03x to
/// 2.48x. Redo with its log in the fast log buffer against redo.
pub const FAST_LOG_REDO: Comparison = Comparison {
    subject: "redo-fastlog",
    baselines: &["redo"],
    heading: "redo with 001's fast log against redo (001 §6)",
    paper: [&["+103% to +148%"], &[""], &[""], &[""]],
    paper_setting: "on-chip STT-RAM log",
    figures: ("fastlog-redo", "fastlog-redo-traffic"),
    titles: (
        "redo-fastlog throughput relative to redo (1 = the same)",
        "Write traffic and dirty bytes per transaction (fast log bytes not included)",
    ),
};

/// The same for undo.
pub const FAST_LOG_UNDO: Comparison = Comparison {
    subject: "undo-fastlog",
    baselines: &["undo"],
    heading: "undo with 001's fast log against undo (001 §6)",
    paper: [&["+103% to +148%"], &[""], &[""], &[""]],
    paper_setting: "on-chip STT-RAM log",
    figures: ("fastlog-undo", "fastlog-undo-traffic"),
    titles: (
        "undo-fastlog throughput relative to undo (1 = the same)",
        "Write traffic and dirty bytes per transaction (fast log bytes not included)",
    ),
};

/// 001 §6 (adaptive caching mode against a single write-back mode): up to 4.10x.
/// undo with 001's adaptive persist policy against undo with each static one.
pub const PERSIST_POLICY: Comparison = Comparison {
    subject: "undo-adaptive",
    baselines: &["undo", "undo-nt", "undo-uc"],
    heading: "undo with 001's adaptive persist policy against each static policy (001 §6)",
    paper: [
        &["up to +310%", "", ""],
        &["", "", ""],
        &["", "", ""],
        &["", "", ""],
    ],
    paper_setting: "against write-back only",
    figures: ("persist-policy", "persist-policy-traffic"),
    titles: (
        "undo-adaptive throughput relative to write-back, non-temporal and uncached",
        "Write traffic and dirty bytes per transaction",
    ),
};

/// Every comparison the report and the plots draw.
pub const ALL: [Comparison; 5] = [
    LOGGING,
    OUT_OF_PLACE,
    FAST_LOG_REDO,
    FAST_LOG_UNDO,
    PERSIST_POLICY,
];

/// The subject against one baseline on one workload and thread count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Versus {
    /// `subject / baseline - 1` in transactions per second.
    pub speedup: f64,
    /// `1 - subject / baseline` in media bytes per transaction (`None`: not measured).
    pub traffic_saved: Option<f64>,
    /// `1 - subject / baseline` in dirty bytes per transaction (`None`: not measured).
    pub dirty_saved: Option<f64>,
}

impl Versus {
    /// The share of the baseline's time per transaction the subject saves:
    /// `1 - baseline / subject` in throughput.
    pub fn latency_saved(&self) -> f64 {
        1.0 - 1.0 / (1.0 + self.speedup)
    }
}

/// One row of a comparison: a workload on a thread count, against each baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The workload.
    pub workload: Workload,
    /// Threads.
    pub threads: usize,
    /// Value size of the runs.
    pub value_size: usize,
    /// Whether the subject's run was emulated (a baseline is compared with it only when
    /// it was run the same way).
    pub emulated: bool,
    /// Against each baseline, in the comparison's order (`None`: that one did not run).
    pub against: Vec<Option<Versus>>,
}

/// `1 - log / base`, when both were measured and the base is not zero.
fn saved(log: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (log, base) {
        (Some(l), Some(b)) if b > 0.0 => Some(1.0 - l / b),
        _ => None,
    }
}

fn versus(subject: &RunResult, base: &RunResult) -> Option<Versus> {
    (base.tx_per_s > 0.0 && subject.tx_per_s > 0.0 && subject.emulated == base.emulated).then(
        || Versus {
            speedup: subject.tx_per_s / base.tx_per_s - 1.0,
            traffic_saved: saved(subject.media_bytes_per_tx, base.media_bytes_per_tx),
            dirty_saved: saved(subject.dirty_bytes_per_tx, base.dirty_bytes_per_tx),
        },
    )
}

/// Every (value size, threads, workload) on which the subject of `c` and at least one
/// of its baselines ran the same way (emulated or not), smaller values and fewer
/// threads first, workloads in the paper's order. Runs in pools sized to a utilisation
/// and allocator or fragmentation runs are not part of it.
pub fn rows(results: &[RunResult], c: &Comparison) -> Vec<Row> {
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
        for w in Workload::ALL.into_iter().chain(Workload::OTHER_DOCUMENTS) {
            let Some(subject) = find(c.subject, w, t, size) else {
                continue;
            };
            let against: Vec<Option<Versus>> = c
                .baselines
                .iter()
                .map(|b| find(b, w, t, size).and_then(|base| versus(subject, base)))
                .collect();
            if against.iter().any(Option::is_some) {
                out.push(Row {
                    workload: w,
                    threads: t,
                    value_size: size,
                    emulated: subject.emulated,
                    against,
                });
            }
        }
    }
    out
}

/// The mean over `rows` of one figure against baseline `b` (an index into the
/// comparison's baselines), over the rows where it was measured; `None` when none was.
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
            durability: None,
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
        let rows = rows(&results, &LOGGING);
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
        let rows = rows(&results, &LOGGING);
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
        assert!(rows(&results, &LOGGING).is_empty());
    }
}
