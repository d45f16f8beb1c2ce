//! Plots in the style of the paper's figures, as SVG and PNG (plotters): grouped bar
//! charts of throughput relative to Base (Fig. 4), node-cache hit ratios (Fig. 5),
//! one against two threads (Fig. 6), and write traffic per transaction; and, with the
//! PMDK peer engine, throughput of every engine relative to PMDK's. Every engine that
//! ran, `pmdk` included, is a series of each chart that has its figure. The cleaning
//! benchmarks have their own ([`draw_cleaning`]): fragmentation per engine (Fig. 9),
//! transaction and cleaner throughput against log utilisation (Fig. 11), and the
//! LSNVMM-Cleaning setting against `log`.
//!
//! Text needs a TrueType font: the first of a few usual system fonts that exists is
//! loaded once (Debian: `fonts-dejavu-core`). Without one no plot is drawn and the
//! caller is told why; the JSON and Markdown reports do not depend on it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::harness::RunResult;
use crate::workload::Workload;

const FONT: &str = "sans-serif";
const FONT_FILES: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers a system font for plot text, once; `false` if none was found.
fn font() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        FONT_FILES.iter().any(|path| {
            let Ok(bytes) = std::fs::read(path) else {
                return false;
            };
            // plotters keeps registered fonts for the whole process: the bytes must be
            // 'static, so this one font file is leaked, once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_ok()
        })
    })
}

/// One grouped bar chart: a bar per series in each category.
struct Bars<'a> {
    title: &'a str,
    y_label: &'a str,
    categories: Vec<String>,
    series: Vec<(String, Vec<Option<f64>>)>,
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn draw<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, bars: &Bars<'_>) -> DrawResult
where
    DB::ErrorType: 'static,
{
    area.fill(&WHITE)?;
    let n = bars.categories.len().max(1);
    let top = bars
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .fold(0.0f64, |m, &x| m.max(x))
        .max(1e-9)
        * 1.35;
    let mut chart = ChartBuilder::on(area)
        .caption(bars.title, (FONT, 22))
        .margin(12)
        .x_label_area_size(70)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)?;
    let categories = bars.categories.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(2 * n + 1)
        .x_label_formatter(&move |x| {
            let half = x - x.floor();
            if (half - 0.5).abs() < 1e-6 {
                categories
                    .get(x.floor() as usize)
                    .cloned()
                    .unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style((FONT, 13))
        .y_label_formatter(&|y| {
            if top > 100.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.1}")
            }
        })
        .y_desc(bars.y_label)
        .y_label_style((FONT, 13))
        .draw()?;
    let groups = bars.series.len().max(1) as f64;
    let width = 0.8 / groups;
    for (s, (name, values)) in bars.series.iter().enumerate() {
        let color = Palette99::pick(s).to_rgba();
        let rects = values.iter().enumerate().filter_map(|(i, v)| {
            v.map(|v| {
                let x0 = i as f64 + 0.1 + s as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.95, v)], color.filled())
            })
        });
        chart
            .draw_series(rects)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    area.present()?;
    Ok(())
}

/// Writes `<stem>.svg` and `<stem>.png`. Returns the files.
fn save(
    dir: &Path,
    stem: &str,
    bars: &Bars<'_>,
) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    let size = (1200, 560);
    let svg = dir.join(format!("{stem}.svg"));
    draw(&SVGBackend::new(&svg, size).into_drawing_area(), bars)?;
    let png = dir.join(format!("{stem}.png"));
    draw(&BitMapBackend::new(&png, size).into_drawing_area(), bars)?;
    Ok(vec![svg, png])
}

/// Draws one grouped bar chart (a bar per series in each category; `None`: no bar) as
/// `<stem>.svg` and `<stem>.png` in `dir`, for figures other than the bench's own (e.g.
/// `logheap recovery-bench`'s). Returns the files, or why none was drawn.
pub fn draw_bars(
    dir: &Path,
    stem: &str,
    title: &str,
    y_label: &str,
    categories: Vec<String>,
    series: Vec<(String, Vec<Option<f64>>)>,
) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    if !font() {
        return Err(Box::new(NoFont));
    }
    save(
        dir,
        stem,
        &Bars {
            title,
            y_label,
            categories,
            series,
        },
    )
}

fn workloads_in(results: &[RunResult]) -> Vec<Workload> {
    Workload::ALL
        .into_iter()
        .filter(|w| results.iter().any(|r| r.workload == *w))
        .collect()
}

fn engines_in(results: &[RunResult], threads: usize) -> Vec<String> {
    let mut engines: Vec<String> = Vec::new();
    for r in results.iter().filter(|r| r.threads == threads) {
        if !engines.contains(&r.engine) {
            engines.push(r.engine.clone());
        }
    }
    engines
}

fn find<'r>(
    results: &'r [RunResult],
    engine: &str,
    workload: Workload,
    threads: usize,
) -> Option<&'r RunResult> {
    results
        .iter()
        .find(|r| r.engine == engine && r.workload == workload && r.threads == threads)
}

/// Why no plot could be drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoFont;

impl std::fmt::Display for NoFont {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no TrueType font found (looked for {}); install fonts-dejavu-core",
            FONT_FILES.join(", ")
        )
    }
}

impl std::error::Error for NoFont {}

/// Draws every figure the results allow into `dir` (SVG and PNG); returns the files.
pub fn draw_all(
    results: &[RunResult],
    dir: &Path,
) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    if !font() {
        return Err(Box::new(NoFont));
    }
    let mut files = draw_cleaning(results, dir)?;
    // Runs in pools sized to a utilisation are drawn by `draw_cleaning` only.
    let results: Vec<RunResult> = results
        .iter()
        .filter(|r| r.space.utilisation.is_none())
        .cloned()
        .collect();
    let results = &results[..];
    let workloads = workloads_in(results);
    let names: Vec<String> = workloads.iter().map(|w| w.name().to_string()).collect();
    let engines = engines_in(results, 1);
    let per_engine =
        |value: &dyn Fn(&RunResult) -> Option<f64>| -> Vec<(String, Vec<Option<f64>>)> {
            engines
                .iter()
                .map(|e| {
                    let v = workloads
                        .iter()
                        .map(|&w| find(results, e, w, 1).and_then(value))
                        .collect();
                    (e.clone(), v)
                })
                .collect()
        };
    // (a) Fig. 4: throughput relative to Base.
    let relative = per_engine(&|r: &RunResult| {
        find(results, "log-base", r.workload, 1).map(|b| r.tx_per_s / b.tx_per_s.max(1e-9))
    });
    if relative.iter().any(|(_, v)| v.iter().any(Option::is_some)) {
        files.extend(save(
            dir,
            "fig4-mapping-optimisations",
            &Bars {
                title: "Mapping optimisations, one thread (throughput relative to Base)",
                y_label: "throughput / Base",
                categories: names.clone(),
                series: relative,
            },
        )?);
    }
    // (b) Fig. 5: node-cache hit ratio.
    let hits: Vec<(String, Vec<Option<f64>>)> =
        per_engine(&|r: &RunResult| r.node_cache_hit_ratio.map(|h| 100.0 * h))
            .into_iter()
            .filter(|(_, v)| v.iter().any(Option::is_some))
            .collect();
    if !hits.is_empty() {
        files.extend(save(
            dir,
            "fig5-node-cache-hits",
            &Bars {
                title: "Tree node cache hit ratio",
                y_label: "hits (%)",
                categories: names.clone(),
                series: hits,
            },
        )?);
    }
    // (c) Fig. 6: one against two threads.
    let two = engines_in(results, 2);
    let multi: Vec<Workload> = workloads
        .iter()
        .copied()
        .filter(|&w| two.iter().any(|e| find(results, e, w, 2).is_some()))
        .collect();
    if !multi.is_empty() {
        let mut series = Vec::new();
        for e in &two {
            for t in [1, 2] {
                let v = multi
                    .iter()
                    .map(|&w| find(results, e, w, t).map(|r| r.tx_per_s))
                    .collect();
                series.push((format!("{e} ({t})"), v));
            }
        }
        files.extend(save(
            dir,
            "fig6-threads",
            &Bars {
                title: "One and two threads (transactions per second)",
                y_label: "transactions / s",
                categories: multi.iter().map(|w| w.name().to_string()).collect(),
                series,
            },
        )?);
    }
    // (d) Write traffic per transaction (engines that measure it).
    let traffic: Vec<(String, Vec<Option<f64>>)> =
        per_engine(&|r: &RunResult| r.media_bytes_per_tx)
            .into_iter()
            .filter(|(_, v)| v.iter().any(Option::is_some))
            .collect();
    if !traffic.is_empty() {
        files.extend(save(
            dir,
            "write-traffic",
            &Bars {
                title: "Write traffic per transaction (64 B x lines flushed + non-temporal bytes)",
                y_label: "media bytes / transaction",
                categories: names.clone(),
                series: traffic,
            },
        )?);
    }
    // (e) Fig. 7 and 8: log against the redo and undo logging engines.
    for c in crate::versus::ALL {
        files.extend(draw_versus(results, dir, &c)?);
    }
    // (f) Throughput relative to the PMDK peer engine.
    let pmdk = crate::pmdk::ENGINE;
    let versus = per_engine(&|r: &RunResult| {
        find(results, pmdk, r.workload, 1).map(|p| r.tx_per_s / p.tx_per_s.max(1e-9))
    });
    if versus.iter().any(|(_, v)| v.iter().any(Option::is_some)) {
        files.extend(save(
            dir,
            "vs-pmdk",
            &Bars {
                title: "Throughput relative to PMDK (libpmemobj), one thread",
                y_label: "throughput / PMDK",
                categories: names,
                series: versus,
            },
        )?);
    }
    Ok(files)
}

/// The figures of a comparison ([`crate::versus`]): the subject's throughput relative
/// to each baseline, per thread count (Fig. 7 for [`LOGGING`](crate::versus::LOGGING)),
/// and write traffic and dirty bytes per transaction of every engine, one thread (Fig.
/// 8), when the subject ran beside a baseline; returns the files.
fn draw_versus(
    results: &[RunResult],
    dir: &Path,
    c: &crate::versus::Comparison,
) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    // One value size per figure: the smallest that ran.
    let mut rows = crate::versus::rows(results, c);
    let mut files = Vec::new();
    let Some(size) = rows.iter().map(|r| r.value_size).min() else {
        return Ok(files);
    };
    rows.retain(|r| r.value_size == size);
    let mut workloads: Vec<Workload> = Vec::new();
    let mut threads: Vec<usize> = Vec::new();
    for r in &rows {
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload);
        }
        if !threads.contains(&r.threads) {
            threads.push(r.threads);
        }
    }
    workloads.sort_by_key(|w| Workload::ALL.iter().position(|x| x == w));
    let names: Vec<String> = workloads.iter().map(|w| w.name().to_string()).collect();
    let mut relative = Vec::new();
    for &t in &threads {
        for (b, base) in c.baselines.iter().enumerate() {
            let v: Vec<Option<f64>> = workloads
                .iter()
                .map(|&w| {
                    rows.iter()
                        .find(|r| r.workload == w && r.threads == t)
                        .and_then(|r| r.against[b])
                        .map(|v| 1.0 + v.speedup)
                })
                .collect();
            if v.iter().any(Option::is_some) {
                relative.push((
                    format!("vs {base} ({t} thread{})", if t == 1 { "" } else { "s" }),
                    v,
                ));
            }
        }
    }
    let y_label = format!("{} / baseline", c.subject);
    files.extend(save(
        dir,
        c.figures.0,
        &Bars {
            title: c.titles.0,
            y_label: &y_label,
            categories: names.clone(),
            series: relative,
        },
    )?);
    let one = threads.iter().copied().min().unwrap_or(1);
    let mut traffic = Vec::new();
    for &engine in std::iter::once(&c.subject).chain(c.baselines) {
        for (label, figure) in [
            (
                "write traffic",
                (|r: &RunResult| r.media_bytes_per_tx) as fn(&RunResult) -> Option<f64>,
            ),
            ("dirty bytes", |r: &RunResult| r.dirty_bytes_per_tx),
        ] {
            let v: Vec<Option<f64>> = workloads
                .iter()
                .map(|&w| {
                    results
                        .iter()
                        .find(|r| {
                            r.engine == engine
                                && r.workload == w
                                && r.threads == one
                                && r.value_size == size
                                && r.space.utilisation.is_none()
                        })
                        .and_then(figure)
                })
                .collect();
            if v.iter().any(Option::is_some) {
                traffic.push((format!("{engine} {label}"), v));
            }
        }
    }
    if !traffic.is_empty() {
        let title = format!(
            "{}, {one} thread{}",
            c.titles.1,
            if one == 1 { "" } else { "s" }
        );
        files.extend(save(
            dir,
            c.figures.1,
            &Bars {
                title: &title,
                y_label: "bytes / transaction",
                categories: names,
                series: traffic,
            },
        )?);
    }
    Ok(files)
}

/// One line of the Fig. 11 plots: the runs that differ only in utilisation.
#[derive(Debug, Clone, PartialEq)]
struct SweepLine {
    engine: String,
    workload: Workload,
    value_size: usize,
    threads: usize,
    cleaner_threads: Option<usize>,
}

impl SweepLine {
    fn of(r: &RunResult) -> SweepLine {
        SweepLine {
            engine: r.engine.clone(),
            workload: r.workload,
            value_size: r.value_size,
            threads: r.threads,
            cleaner_threads: r.space.cleaner_threads,
        }
    }
}

/// The utilisation point of a run in a pool sized to one, in whole percent.
fn percent(u: f64) -> u32 {
    (100.0 * u).round() as u32
}

/// Draws the figures of the cleaning benchmarks that `results` hold into `dir`:
/// `fig9-fragmentation` (fragmentation per workload and engine), `fig11a-txn-vs-utilisation`
/// and `fig11b-cleaner-vs-utilisation` (transaction throughput, and live bytes the
/// cleaner moved per second, against the log's utilisation, one series per value
/// size), and `cleaning-overhead` (the `log-cleaning` engine's throughput relative to
/// `log`'s). Returns the files.
pub fn draw_cleaning(
    results: &[RunResult],
    dir: &Path,
) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    if !font() {
        return Err(Box::new(NoFont));
    }
    let mut files = Vec::new();
    // Fig. 9.
    let frag: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.space.fragmentation.is_some())
        .collect();
    if !frag.is_empty() {
        let workloads: Vec<Workload> = Workload::FRAGMENTATION
            .into_iter()
            .filter(|w| frag.iter().any(|r| r.workload == *w))
            .collect();
        let mut engines: Vec<String> = Vec::new();
        for r in &frag {
            if !engines.contains(&r.engine) {
                engines.push(r.engine.clone());
            }
        }
        let value_of = |e: &String, w: Workload, figure: &dyn Fn(&RunResult) -> Option<f64>| {
            frag.iter()
                .find(|r| &r.engine == e && r.workload == w)
                .and_then(|r| figure(r))
                .map(|f| 100.0 * f)
        };
        let mut series: Vec<(String, Vec<Option<f64>>)> = Vec::new();
        for e in &engines {
            let at_end = |r: &RunResult| r.space.fragmentation;
            series.push((
                e.clone(),
                workloads.iter().map(|&w| value_of(e, w, &at_end)).collect(),
            ));
            let compacted = |r: &RunResult| r.space.compacted_fragmentation;
            let after: Vec<Option<f64>> = workloads
                .iter()
                .map(|&w| value_of(e, w, &compacted))
                .collect();
            if after.iter().any(Option::is_some) {
                series.push((format!("{e}, compacted"), after));
            }
        }
        files.extend(save(
            dir,
            "fig9-fragmentation",
            &Bars {
                title: "Fragmentation: 1 - live bytes / bytes held (Fig. 9)",
                y_label: "fragmentation (%)",
                categories: workloads
                    .iter()
                    .map(|w| w.name().trim_start_matches("frag-").to_uppercase())
                    .collect(),
                series,
            },
        )?);
    }
    // Fig. 11.
    let swept: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.space.utilisation.is_some())
        .collect();
    if !swept.is_empty() {
        let mut points: Vec<u32> = swept
            .iter()
            .filter_map(|r| r.space.utilisation.map(percent))
            .collect();
        points.sort_unstable();
        points.dedup();
        let mut lines: Vec<SweepLine> = Vec::new();
        for r in &swept {
            let key = SweepLine::of(r);
            if !lines.contains(&key) {
                lines.push(key);
            }
        }
        let several_engines = lines.iter().any(|l| l.engine != lines[0].engine);
        let several_workloads = lines.iter().any(|l| l.workload != lines[0].workload);
        let label = |kind: &str, line: &SweepLine| {
            let (e, w, v, t) = (
                &line.engine,
                &line.workload,
                &line.value_size,
                &line.threads,
            );
            let mut s = format!(
                "{kind}-{}",
                if *v >= 1024 && v % 1024 == 0 {
                    format!("{}KB", v / 1024)
                } else {
                    format!("{v}B")
                }
            );
            if several_engines {
                s.push_str(&format!(" {e}"));
            }
            if several_workloads {
                s.push_str(&format!(" {w}"));
            }
            if *t != 1 {
                s.push_str(&format!(" ({t} threads)"));
            }
            match line.cleaner_threads {
                Some(1) => s.push_str(" (1 cleaner thread)"),
                Some(c) if c > 1 => s.push_str(&format!(" ({c} cleaner threads)")),
                _ => {}
            }
            s
        };
        let series_of = |kind: &str, value: &dyn Fn(&RunResult) -> Option<f64>| {
            lines
                .iter()
                .map(|line| {
                    let v = points
                        .iter()
                        .map(|&p| {
                            swept
                                .iter()
                                .find(|r| {
                                    SweepLine::of(r) == *line
                                        && r.space.utilisation.map(percent) == Some(p)
                                })
                                .and_then(|r| value(r))
                        })
                        .collect();
                    (label(kind, line), v)
                })
                .collect::<Vec<_>>()
        };
        let categories: Vec<String> = points.iter().map(|p| format!("{p}%")).collect();
        files.extend(save(
            dir,
            "fig11a-txn-vs-utilisation",
            &Bars {
                title: "Transaction throughput against log utilisation (Fig. 11)",
                y_label: "transactions / s",
                categories: categories.clone(),
                series: series_of("Txn", &|r| Some(r.tx_per_s)),
            },
        )?);
        files.extend(save(
            dir,
            "fig11b-cleaner-vs-utilisation",
            &Bars {
                title: "Cleaner throughput against log utilisation (Fig. 11): live bytes moved",
                y_label: "MB / s moved",
                categories,
                series: series_of("Cln", &|r| r.space.moved_mb_per_s),
            },
        )?);
    }
    // LSNVMM-Cleaning against log.
    let cleaning = crate::harness::LOG_CLEANING;
    let paired: Vec<Workload> = Workload::ALL
        .into_iter()
        .filter(|&w| {
            results
                .iter()
                .any(|r| r.engine == cleaning && r.workload == w && r.space.utilisation.is_none())
                && results
                    .iter()
                    .any(|r| r.engine == "log" && r.workload == w && r.space.utilisation.is_none())
        })
        .collect();
    if !paired.is_empty() {
        let mut threads: Vec<usize> = results
            .iter()
            .filter(|r| r.engine == cleaning)
            .map(|r| r.threads)
            .collect();
        threads.sort_unstable();
        threads.dedup();
        let series = threads
            .iter()
            .map(|&t| {
                let v = paired
                    .iter()
                    .map(|&w| {
                        let of = |e: &str| {
                            results.iter().find(|r| {
                                r.engine == e
                                    && r.workload == w
                                    && r.threads == t
                                    && r.space.utilisation.is_none()
                            })
                        };
                        Some(of(cleaning)?.tx_per_s / of("log")?.tx_per_s.max(1e-9))
                    })
                    .collect();
                (format!("{cleaning} / log ({t} thread(s))"), v)
            })
            .collect();
        files.extend(save(
            dir,
            "cleaning-overhead",
            &Bars {
                title: "LSNVMM-Cleaning: throughput relative to no cleaning",
                y_label: "throughput / log",
                categories: paired.iter().map(|w| w.name().to_string()).collect(),
                series,
            },
        )?);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(engine: &str, workload: Workload, tx_per_s: f64) -> RunResult {
        let json = format!(
            r#"{{"engine":"{engine}","config":"{engine}","workload":"{workload}","threads":1,"ops":100,"elements":100,"value_size":8,"emulated":false,"seconds":1.0,"tx_per_s":{tx_per_s},"aborts_per_tx":0.0,"preload_seconds":0.1}}"#
        );
        let mut r: RunResult = serde_json::from_str(&json).unwrap();
        if engine != "pmdk" {
            r.media_bytes_per_tx = Some(300.0);
        }
        r
    }

    #[test]
    fn pmdk_is_a_series_and_has_its_own_relative_chart() {
        let results: Vec<RunResult> = [Workload::Sps, Workload::RbtreeIns]
            .into_iter()
            .flat_map(|w| {
                [
                    result("log-base", w, 100.0),
                    result("log", w, 150.0),
                    result("pmdk", w, 120.0),
                ]
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let files = match draw_all(&results, dir.path()) {
            Err(e) if e.is::<NoFont>() => return,
            other => other.unwrap(),
        };
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for stem in ["fig4-mapping-optimisations", "vs-pmdk", "write-traffic"] {
            assert!(names.contains(&format!("{stem}.svg")), "{names:?}");
        }
        assert!(
            !names.iter().any(|n| n.starts_with("fig7")),
            "no redo or undo ran: no Fig. 7"
        );
        let fig4 =
            std::fs::read_to_string(dir.path().join("fig4-mapping-optimisations.svg")).unwrap();
        assert!(fig4.contains("pmdk"), "pmdk is a series of Fig. 4");
        // pmdk measures no write traffic: it is not a series there.
        let traffic = std::fs::read_to_string(dir.path().join("write-traffic.svg")).unwrap();
        assert!(!traffic.contains("pmdk") && traffic.contains("log-base"));
    }

    #[test]
    fn log_beside_redo_and_undo_draws_fig_7_and_fig_8() {
        let mut results = Vec::new();
        for w in [Workload::Sps, Workload::HashtableUpd] {
            for (engine, tx) in [("log", 150.0), ("redo", 100.0), ("undo", 120.0)] {
                let mut r = result(engine, w, tx);
                r.dirty_bytes_per_tx = Some(100.0);
                results.push(r);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let files = match draw_all(&results, dir.path()) {
            Err(e) if e.is::<NoFont>() => return,
            other => other.unwrap(),
        };
        for stem in ["fig7-vs-logging", "fig8-traffic-vs-logging"] {
            assert!(
                files.iter().any(|f| f.ends_with(format!("{stem}.png"))),
                "{files:?}"
            );
        }
        let fig7 = std::fs::read_to_string(dir.path().join("fig7-vs-logging.svg")).unwrap();
        assert!(fig7.contains("vs redo (1 thread)") && fig7.contains("vs undo (1 thread)"));
        let fig8 = std::fs::read_to_string(dir.path().join("fig8-traffic-vs-logging.svg")).unwrap();
        assert!(fig8.contains("undo dirty bytes") && fig8.contains("log write traffic"));
    }
}
