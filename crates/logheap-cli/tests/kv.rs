//! `logheap kv` as scripts and people use it, and its kill loop: SIGKILL during puts, 200
//! times, and no acknowledged put lost.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use logheap_kv::KvStore;

fn logheap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_logheap"))
}

fn kv(pool: &std::path::Path, args: &[&str]) -> Output {
    logheap().arg("kv").arg(pool).args(args).output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn get_put_del_scan_and_stats_in_text_json_and_hex() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("store.pool");
    // Reads need the pool; a write creates it.
    let out = kv(&pool, &["get", "a"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no such pool"), "{}", stderr(&out));
    let out = kv(&pool, &["--size", "16M", "put", "b", "two"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut load = logheap()
        .args(["kv", pool.to_str().unwrap(), "load", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    load.stdin
        .take()
        .unwrap()
        .write_all(b"a\tone\nc\tthree\nd\tfour\n")
        .unwrap();
    let out = load.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(stdout(&out), "loaded 3 entries\n");
    assert_eq!(stdout(&kv(&pool, &["get", "b"])), "two\n");
    let out = kv(&pool, &["get", "zz"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("absent"));
    assert_eq!(
        stdout(&kv(&pool, &["scan", "--start", "b", "--end", "d"])),
        "b\ttwo\nc\tthree\n"
    );
    assert_eq!(
        stdout(&kv(&pool, &["scan", "--reverse", "--limit", "2"])),
        "d\tfour\nc\tthree\n"
    );
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&kv(&pool, &["scan", "--json"]))).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 4);
    assert_eq!(v[0]["key"], "a");
    assert_eq!(v[0]["value"], "one");
    // Hex in and out; bytes that are not UTF-8 shown as hex in text.
    assert!(
        kv(&pool, &["--hex", "put", "00ff", "6869"])
            .status
            .success()
    );
    assert_eq!(stdout(&kv(&pool, &["get", "--hex", "00ff"])), "6869\n");
    assert_eq!(
        stdout(&kv(&pool, &["scan", "--limit", "1"])),
        "hex:00ff\thi\n"
    );
    let out = kv(&pool, &["--hex", "get", "0g"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not hex"), "{}", stderr(&out));
    // Delete, then figures.
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&kv(&pool, &["del", "c", "--json"]))).unwrap();
    assert_eq!(v["deleted"], true);
    assert_eq!(kv(&pool, &["del", "c"]).status.code(), Some(1));
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&kv(&pool, &["stats", "--json"]))).unwrap();
    assert_eq!(v["entries"], 4);
    assert_eq!(v["levels"], 1);
    assert_eq!(v["engine"], "log");
    assert_eq!(v["pool_size"], 16 << 20);
    assert_eq!(stdout(&kv(&pool, &["verify"])), "sound\n");
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&kv(&pool, &["verify", "--json"]))).unwrap();
    assert_eq!(v["sound"], true);
    // Creation options on an existing pool are refused, not ignored.
    let out = kv(&pool, &["--engine", "redo", "put", "x", "y"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("apply only when"), "{}", stderr(&out));
    let out = kv(&pool, &["scan", "--prefix", "a", "--start", "b"]);
    assert!(!out.status.success());
}

#[test]
fn wrong_and_busy_pools_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![7u8; 100_000]).unwrap();
    let out = kv(&junk, &["put", "a", "b"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("not a logheap pool"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(&junk).unwrap(), vec![7u8; 100_000]);
    // A pool holding other data.
    let other = dir.path().join("other.pool");
    let pool = logheap::Pool::create(&other, &logheap::Config::default().size(8 << 20)).unwrap();
    let root = pool.root::<u64>().unwrap();
    pool.transaction(|tx| tx.write(root, &99u64)).unwrap();
    // While it is open here, another process is refused.
    let out = kv(&other, &["get", "a"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("already open"), "{}", stderr(&out));
    pool.close().unwrap();
    let out = kv(&other, &["get", "a"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("not a logheap-kv store"),
        "{}",
        stderr(&out)
    );
}

/// One kill round: a child loads `key<TAB>value` lines one per transaction, printing
/// each key once durable; it is killed after `run_for`. Returns how many lines it
/// acknowledged.
fn kill_round(pool: &std::path::Path, engine: &str, round: u32, run_for: Duration) -> usize {
    let mut cmd = logheap();
    cmd.arg("kv").arg(pool);
    if !pool.exists() {
        cmd.args(["--size", "32M", "--engine", engine]);
    }
    let mut child = cmd
        .args(["load", "--batch", "1", "--ack", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0.. {
            if stdin.write_all(line(round, i).as_bytes()).is_err() {
                return;
            }
        }
    });
    let reader = BufReader::new(child.stdout.take().unwrap());
    let acks = std::thread::spawn(move || reader.lines().map_while(Result::ok).count());
    std::thread::sleep(run_for);
    child.kill().unwrap();
    child.wait().unwrap();
    writer.join().unwrap();
    acks.join().unwrap()
}

/// Line `i` of round `round`: 300 keys rewritten over and over, values of varying length.
fn line(round: u32, i: usize) -> String {
    let value = format!("{round}:{i}:").repeat(1 + i % 7);
    format!("key-{:04}\t{value}\n", (i * 7 + round as usize) % 300)
}

fn apply(model: &mut BTreeMap<Vec<u8>, Vec<u8>>, round: u32, i: usize) {
    let l = line(round, i);
    let (k, v) = l.trim_end().split_once('\t').unwrap();
    model.insert(k.as_bytes().to_vec(), v.as_bytes().to_vec());
}

/// 200 SIGKILLs during puts, over three engines: after each, the store opens, its tree is
/// sound, a scan returns every key in order, and the state holds every acknowledged
/// put (and at most the one in flight past them).
#[test]
fn kill_loop_loses_no_acknowledged_put() {
    let dir = tempfile::tempdir().unwrap();
    let mut kills = 0;
    for (engine, rounds) in [("log", 120u32), ("redo", 40), ("undo", 40)] {
        let pool = dir.path().join(format!("{engine}.pool"));
        let mut model = BTreeMap::new();
        let mut acked_total = 0;
        for round in 0..rounds {
            let run_for = Duration::from_millis(5 + (round as u64 * 37) % 40);
            let acked = kill_round(&pool, engine, round, run_for);
            kills += 1;
            acked_total += acked;
            if !pool.exists() {
                continue;
            }
            for i in 0..acked {
                apply(&mut model, round, i);
            }
            let mut with_next = model.clone();
            apply(&mut with_next, round, acked);
            let store = KvStore::open_existing(&pool).unwrap();
            assert_eq!(store.verify().unwrap(), None, "{engine} round {round}");
            let entries: BTreeMap<_, _> = store
                .iter()
                .collect::<Result<Vec<_>, _>>()
                .unwrap()
                .into_iter()
                .collect();
            let keys: Vec<_> = store.iter().map(|e| e.unwrap().0).collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]));
            assert_eq!(keys.len(), entries.len());
            if entries == with_next {
                model = with_next;
            } else {
                assert!(
                    entries == model,
                    "{engine} round {round}: {acked} acknowledged puts, the store differs"
                );
            }
            store.close().unwrap();
        }
        eprintln!("{engine}: {rounds} kills, {acked_total} acknowledged puts, all kept");
        assert!(
            acked_total > 0,
            "{engine}: no put acknowledged in any round"
        );
    }
    assert_eq!(kills, 200);
}

/// `logheap ycsb` as documented: a small run of two workloads on two stores writes one
/// JSON line per run, the Markdown report and, with `--json`, the same lines on
/// standard output; a store that is not built in is refused in words.
#[test]
fn ycsb_runs_workloads_on_stores_and_writes_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let run = logheap()
        .args([
            "ycsb",
            "--records",
            "500",
            "--operations",
            "500",
            "--threads",
            "1",
            "--threads",
            "2",
            "--workload",
            "A",
            "--workload",
            "E",
            "--store",
            "logheap-log",
            "--store",
            "lmdb",
            "--json",
            "--dir",
        ])
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    let lines: Vec<serde_json::Value> = stdout(&run)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 8);
    for r in &lines {
        assert_eq!(r["load"]["operations"], 500);
        assert_eq!(r["run"]["operations"], 500);
        assert_eq!(r["run"]["misses"], 0);
        assert!(r["run"]["throughput"].as_f64().unwrap() > 0.0);
        assert!(r["durability"].as_str().unwrap().len() > 10);
    }
    assert!(
        lines
            .iter()
            .any(|r| r["store"] == "lmdb" && r["workload"] == "E")
    );
    let e = lines.iter().find(|r| r["workload"] == "E").unwrap();
    assert!(e["run"]["latency"]["SCAN"]["p99_us"].as_f64().is_some());
    let jsonl = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    assert_eq!(jsonl.lines().count(), 8);
    let md = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(
        md.contains("## Throughput, 2 thread(s)") && md.contains("lmdb"),
        "{md}"
    );
    // Nothing is left in the store directory.
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "only the report directory remains"
    );
    let refused = logheap()
        .args(["ycsb", "--store", "mongodb"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("unknown store"),
        "{}",
        stderr(&refused)
    );
}

/// `logheap kv verify` finds a damaged leaf link and says so, exit 1.
#[test]
fn verify_reports_a_damaged_tree() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("store.pool");
    let lines: String = (0..100).map(|i| format!("key-{i:03}\tv\n")).collect();
    let file = dir.path().join("lines");
    std::fs::write(&file, lines).unwrap();
    let out = kv(&pool, &["--size", "16M", "load", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&kv(&pool, &["verify"])), "sound\n");
    // The first leaf's `prev` link (offset 16 in a leaf) made to point elsewhere.
    let store = KvStore::open_existing(&pool).unwrap();
    let word = |at: u64| {
        store
            .pool()
            .read(|tx| tx.read(logheap::PPtr::<u64>::from_offset(at)))
            .unwrap()
    };
    let root = word(store.tree().pointer());
    let first_leaf = word(root + 16 + 32 * 32);
    store
        .pool()
        .transaction(|tx| tx.write(logheap::PPtr::<u64>::from_offset(first_leaf + 16), &8u64))
        .unwrap();
    store.close().unwrap();
    let out = kv(&pool, &["verify"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("damaged: leaf"),
        "{}",
        stdout(&out)
    );
}
