//! The `logheap` command as a user runs it.

use std::process::Command;

fn logheap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_logheap"))
}

/// Runs `logheap ARGS`, which must succeed, and parses its standard output as JSON.
fn json_of(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = logheap().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn calibrate_json_has_every_key_with_plausible_values() {
    let args = [
        "calibrate",
        "--json",
        "--iterations",
        "2000",
        "--latency-ns",
        "300",
    ];
    let v = json_of(&args.map(std::ffi::OsStr::new));
    let instr = v["flush_instruction"].as_str().unwrap();
    assert!(
        ["clwb", "clflushopt", "clflush"].contains(&instr),
        "{instr}"
    );
    for key in [
        "fence_ns",
        "flush_line_ns",
        "flush_4k_ns",
        "nt_copy_gbps",
        "emulated_latency_measured_ns",
    ] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing"));
        assert!(x > 0.0, "{key} = {x}");
    }
    assert_eq!(v["emulated_latency_target_ns"].as_u64(), Some(300));
}

#[test]
fn inspect_reports_bad_files_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk");
    std::fs::write(&path, vec![1u8; 10_000]).unwrap();
    let out = logheap().arg("inspect").arg(&path).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a logheap pool") && err.contains("junk"),
        "{err}"
    );
}

#[test]
fn inspect_prints_a_pool_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.pool");
    let options = logheap::PoolOptions {
        size: 1 << 20,
        ..Default::default()
    };
    logheap::PoolFile::create(&path, &options)
        .unwrap()
        .close()
        .unwrap();
    let v = json_of(&["inspect".as_ref(), "--json".as_ref(), path.as_os_str()]);
    assert_eq!(v["header"]["engine"], "log");
    assert_eq!(v["header"]["pool_size"], 1 << 20);
    assert_eq!(v["state"]["clean"], true);
}

fn crashtest(extra: &[&str]) -> (bool, serde_json::Value) {
    crashtest_engine("log", 200, extra)
}

fn crashtest_engine(engine: &str, txs: u32, extra: &[&str]) -> (bool, serde_json::Value) {
    let txs = txs.to_string();
    let out = logheap()
        .args([
            "crashtest",
            "--engine",
            engine,
            "--txs",
            &txs,
            "--seed",
            "7",
            "--json",
        ])
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{e}: {stdout} {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.success(), v)
}

#[test]
fn crashtest_checks_over_a_thousand_images_without_violation() {
    let (ok, v) = crashtest(&["--reopen-every", "0"]);
    assert!(ok, "{v}");
    assert!(v["images"].as_u64().unwrap() >= 1000, "{v}");
    assert_eq!(v["violations"], 0, "{v}");
    // The error paths ran under the simulator: aborts, and transactions that freed and
    // wrote and then found no room for their log blocks.
    assert!(v["aborted"].as_u64().unwrap() > 0, "{v}");
    assert!(v["pool_full"].as_u64().unwrap() > 0, "{v}");
}

/// Issue 10's figure: the pool is small enough that the workload makes the cleaner
/// reclaim chunks, and every crash image at every fence (cleaning passes included)
/// recovers to a state the workload went through.
#[test]
fn crashtest_runs_the_cleaner_and_checks_over_a_thousand_images() {
    let (ok, v) = crashtest_engine("log", 400, &[]);
    assert!(ok, "{v}");
    assert!(v["chunks_cleaned"].as_u64().unwrap() > 0, "{v}");
    assert!(v["images"].as_u64().unwrap() >= 1000, "{v}");
    assert_eq!(v["violations"], 0, "{v}");
}

#[test]
fn crashtest_goes_on_from_crashes_in_the_middle_of_commits() {
    let (ok, v) = crashtest_engine("log", 120, &["--reopen-every", "25"]);
    assert!(ok, "{v}");
    assert!(v["reopened"].as_u64().unwrap() >= 4, "{v}");
    assert_eq!(v["violations"], 0, "{v}");
}

#[test]
fn crashtest_catches_a_commit_without_its_fence() {
    let (ok, v) = crashtest(&["--fault", "skip-commit-fence"]);
    assert!(!ok, "a broken engine must fail the crash test: {v}");
    assert!(v["violations"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn crashtest_prints_the_summary_line_last() {
    let out = logheap()
        .args(["crashtest", "--txs", "20"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap();
    assert!(
        last.starts_with("images=") && last.ends_with("violations=0"),
        "{last}"
    );
}

#[test]
fn crashtest_passes_in_every_mapping_configuration() {
    for engine in ["log-base", "log-2l", "log-2l-gu", "log-2l-gu-c"] {
        let (ok, v) = crashtest_engine(engine, 60, &[]);
        assert!(ok, "{engine}: {v}");
        assert_eq!(v["engine"], engine);
        assert_eq!(v["violations"], 0, "{v}");
        assert!(v["images"].as_u64().unwrap() > 300, "{v}");
    }
}

#[test]
fn crashtest_passes_on_every_in_place_engine() {
    for engine in ["redo", "undo", "oop", "hoop"] {
        let (ok, v) = crashtest_engine(engine, 40, &[]);
        assert!(ok, "{engine}: {v}");
        assert_eq!(v["engine"], engine);
        assert_eq!(v["violations"], 0, "{v}");
        assert!(v["images"].as_u64().unwrap() > 40, "{v}");
    }
}

#[test]
fn bench_runs_pmdk_beside_log_or_says_it_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("results");
    let run = small_bench(
        &[
            "--workload",
            "rbtree-upd",
            "--engine",
            "log",
            "--engine",
            "pmdk",
        ],
        &out,
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let jsonl = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    let runs: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |engine: &str| {
        runs.iter()
            .filter(|v| v["engine"].as_str() == Some(engine))
            .count()
    };
    let table = std::fs::read_to_string(out.join("results.md")).unwrap();
    if logheap_bench::pmdk::pmdk_available() {
        // One and two threads for each engine (an update workload).
        assert_eq!(count("pmdk"), 2, "{jsonl}");
        assert!(table.contains("x pmdk)"), "{table}");
        for v in runs.iter().filter(|v| v["engine"] == "pmdk") {
            assert!(v["fences_per_tx"].is_null(), "{v}");
            assert!(v["tx_per_s"].as_f64().unwrap() > 0.0, "{v}");
        }
    } else {
        assert!(
            stderr.contains("PMDK (libpmemobj) is unavailable in this build"),
            "{stderr}"
        );
        assert_eq!((count("log"), runs.len()), (2, 2), "{jsonl}");
    }
}

/// `logheap bench` with `args`, on small sizes without emulation, writing into `out`.
fn small_bench(args: &[&str], out: &std::path::Path) -> std::process::Output {
    logheap()
        .arg("bench")
        .args(args)
        .args([
            "--ops",
            "300",
            "--elements",
            "500",
            "--emulation",
            "off",
            "--out",
        ])
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn bench_writes_jsonl_table_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("results");
    let run = small_bench(
        &[
            "--workload",
            "sps",
            "--workload",
            "hashtable-upd",
            "--engine",
            "log-base",
            "--engine",
            "log",
        ],
        &out,
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(
        stdout.lines().last().unwrap(),
        format!("results in {}", out.display())
    );
    let jsonl = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    // 2 workloads x 2 engines on one thread, plus both on two threads for log.
    assert_eq!(jsonl.lines().count(), 6);
    for line in jsonl.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for key in [
            "engine",
            "config",
            "workload",
            "threads",
            "ops",
            "seconds",
            "tx_per_s",
            "fences_per_tx",
            "lines_flushed_per_tx",
            "media_bytes_per_tx",
            "payload_bytes_per_tx",
            "write_amplification",
            "aborts_per_tx",
            "node_cache_hit_ratio",
            "dram_bytes",
            "pm_bytes_used",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {line}");
        }
        assert_eq!(v["fences_per_write_tx"], 1.0, "{line}");
        assert!(v["tx_per_s"].as_f64().unwrap() > 0.0);
    }
    let table = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(
        table.contains("| hashtable-upd | 1 |") && table.contains("(1.00x)"),
        "{table}"
    );
    for stem in [
        "fig4-mapping-optimisations",
        "fig6-threads",
        "write-traffic",
    ] {
        for ext in ["svg", "png"] {
            let f = out.join(format!("{stem}.{ext}"));
            assert!(
                std::fs::metadata(&f)
                    .map(|m| m.len() > 1000)
                    .unwrap_or(false),
                "{} missing",
                f.display()
            );
        }
    }
}

#[test]
fn recovery_bench_times_crashed_and_clean_opens_per_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let run = logheap()
        .args(["recovery-bench", "--objects", "3000", "--value-size", "100"])
        .args(["--value-size", "700", "--plot"])
        .arg(&plots)
        .args([
            "--threads",
            "1",
            "--threads",
            "3",
            "--repeat",
            "2",
            "--json",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let runs: Vec<serde_json::Value> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // 2 value sizes x 2 pool states x 2 thread counts x 2 runs (the first of each reads
    // every object back).
    assert_eq!(runs.len(), 16);
    for r in &runs {
        assert_eq!(r["was_clean"], r["state"] == "clean", "{r}");
        // A clean open loads the snapshot its close wrote; a crashed one has none.
        let snapshot = if r["state"] == "clean" {
            "loaded"
        } else {
            "none"
        };
        assert_eq!(r["snapshot"], snapshot, "{r}");
        assert!(r["log_bytes"].as_u64().unwrap() > 300_000, "{r}");
        assert!(r["seconds"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["transactions"], runs[0]["transactions"], "{r}");
        let dram = r["mapping_dram_bytes"].as_u64().unwrap();
        assert!(
            dram > 0 && dram < r["payload_bytes"].as_u64().unwrap(),
            "{r}"
        );
    }
    assert_eq!(runs[2]["threads"], 3);
    assert_eq!(runs[8]["value_size"], 700);
    assert_eq!(runs[8]["payload_bytes"], 3000 * 700);
    // The figures are drawn when a font is there (CI installs one).
    if std::path::Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
        for fig in [
            "fig12a-open-time-vs-threads",
            "fig12b-recovery-rate-vs-value-size",
            "fig13-mapping-dram-vs-value-size",
        ] {
            assert!(plots.join(format!("{fig}.svg")).is_file(), "{fig}");
        }
    }
}

/// The JSON lines `logheap bench ... --json` printed.
fn bench_json(args: &[&str], out: &std::path::Path) -> Vec<serde_json::Value> {
    let run = logheap()
        .arg("bench")
        .args(args)
        .args(["--emulation", "off", "--json", "--out"])
        .arg(out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn bench_fragmentation_runs_on_log_the_persistent_heap_glibc_and_jemalloc() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let plot = plots.to_str().unwrap();
    let runs = bench_json(
        &[
            "--workload",
            "frag-w2",
            "--frag-live",
            "256K",
            "--frag-ratio",
            "4",
            "--plot",
            plot,
        ],
        &dir.path().join("results"),
    );
    let engines: Vec<&str> = runs.iter().map(|r| r["engine"].as_str().unwrap()).collect();
    assert_eq!(engines, ["log", "alloc", "glibc", "jemalloc"]);
    for r in &runs {
        let f = r["fragmentation"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&f), "{r}");
        let live = r["live_bytes"].as_u64().unwrap();
        let held = r["held_bytes"].as_u64().unwrap();
        assert!(live > 200 << 10 && live <= 256 << 10, "{r}");
        assert!(held >= live, "{r}");
        // The allocator's own figure was read: at least what the workload holds.
        assert!(r["allocator_bytes"].as_u64().unwrap() >= live, "{r}");
        assert!(r["frees"].as_u64().unwrap() > 1000, "{r}");
    }
    // The log engine ran in a pool smaller than all it allocated, so it cleaned.
    assert!(
        runs[0]["chunks_cleaned"].as_u64().unwrap() > 0,
        "{}",
        runs[0]
    );
    assert!(runs[0]["pool_bytes"].as_u64().unwrap() < 2 * 4 * (256 << 10));
    // Compacted at the end, the log holds less, and still all the live data.
    let compacted = runs[0]["compacted_held_bytes"].as_u64().unwrap();
    assert!(
        compacted >= runs[0]["live_bytes"].as_u64().unwrap(),
        "{}",
        runs[0]
    );
    assert!(
        compacted < runs[0]["held_bytes"].as_u64().unwrap(),
        "{}",
        runs[0]
    );
    assert!(
        runs[0]["compacted_fragmentation"].as_f64().unwrap()
            < runs[0]["fragmentation"].as_f64().unwrap()
    );
    // The persistent heap's free pages, punched out at the end, hold less too.
    let punched = runs[1]["compacted_held_bytes"].as_u64().unwrap();
    assert!(
        punched >= runs[1]["live_bytes"].as_u64().unwrap()
            && punched < runs[1]["held_bytes"].as_u64().unwrap(),
        "{}",
        runs[1]
    );
    assert!(runs[2]["compacted_fragmentation"].is_null(), "{}", runs[2]);
    assert!(runs[3]["resident_bytes"].as_u64().is_some(), "{}", runs[3]);
    let table = std::fs::read_to_string(dir.path().join("results/results.md")).unwrap();
    assert!(table.contains("### Fragmentation (Fig. 9)"), "{table}");
    if std::path::Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
        assert!(plots.join("fig9-fragmentation.svg").is_file());
    }
}

#[test]
fn bench_refuses_dram_allocators_on_other_workloads() {
    let dir = tempfile::tempdir().unwrap();
    let run = small_bench(&["--workload", "sps", "--engine", "glibc"], dir.path());
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("runs only the fragmentation workloads"),
        "{stderr}"
    );
}

#[test]
fn bench_utilisation_sizes_the_pool_so_the_cleaner_works() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let runs = bench_json(
        &[
            "--workload",
            "bptree-upd",
            "--engine",
            "log",
            "--utilisation",
            "0.5",
            "--utilisation",
            "0.6",
            "--ops",
            "6000",
            "--elements",
            "10000",
            "--time-limit",
            "30",
            "--plot",
            plots.to_str().unwrap(),
        ],
        &dir.path().join("results"),
    );
    assert_eq!(runs.len(), 2);
    for (r, target) in runs.iter().zip([0.5, 0.6]) {
        let u = r["utilisation"].as_f64().unwrap();
        // The pool is a whole number of chunks: at most one chunk's share below.
        assert!(u <= target && u > target - 0.02, "{r}");
        assert!(r["chunks_cleaned"].as_u64().unwrap() > 0, "{r}");
        assert!(r["cleaner_bytes_moved"].as_u64().unwrap() > 0, "{r}");
        assert!(r["log_turnover"].as_f64().unwrap() > 0.5, "{r}");
        assert!(r["pool_full"].is_u64(), "{r}");
    }
    // The smaller pool (higher utilisation) is the one at 60%.
    assert!(runs[1]["pool_bytes"].as_u64().unwrap() < runs[0]["pool_bytes"].as_u64().unwrap());
    let table = std::fs::read_to_string(dir.path().join("results/results.md")).unwrap();
    assert!(
        table.contains("### Throughput against log utilisation"),
        "{table}"
    );
    if std::path::Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
        assert!(plots.join("fig11a-txn-vs-utilisation.svg").is_file());
        assert!(plots.join("fig11b-cleaner-vs-utilisation.svg").is_file());
    }
}

#[test]
fn bench_log_cleaning_cleans_where_log_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let runs = bench_json(
        &[
            "--workload",
            "rbtree-upd",
            "--threads",
            "1",
            "--engine",
            "log",
            "--engine",
            "log-cleaning",
            "--ops",
            "4000",
            "--elements",
            "500",
        ],
        &dir.path().join("results"),
    );
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["engine"], "log");
    assert_eq!(runs[0]["chunks_cleaned"], 0, "{}", runs[0]);
    assert_eq!(runs[1]["engine"], "log-cleaning");
    assert!(
        runs[1]["chunks_cleaned"].as_u64().unwrap() > 0,
        "{}",
        runs[1]
    );
    let table = std::fs::read_to_string(dir.path().join("results/results.md")).unwrap();
    assert!(table.contains("x log)"), "{table}");
}
