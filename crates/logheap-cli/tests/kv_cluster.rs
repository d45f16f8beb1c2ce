//! The replicated key-value store as a user runs it: `logheap kv-failover` starts three
//! `logheap kv-server` processes on the loopback interface and kills the leader with
//! SIGKILL round after round; no acknowledged write may be lost. (The 100-kill run of
//! issue 34 is `logheap kv-failover`, its figures in `docs/benchmarks.md`.)

use std::process::Command;

#[test]
fn leader_kills_lose_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_logheap"))
        .args([
            "kv-failover",
            "--rounds",
            "3",
            "--writes",
            "10",
            "--time-limit",
            "120",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("3 leader kills") && stdout.contains(" 0 lost, 0 phantom, 0 out of order"),
        "{stdout}"
    );
    // Each node kept its pool and its log.
    for n in 1..=3 {
        assert!(dir.path().join(format!("n{n}.pool")).exists());
    }
}

#[test]
fn a_node_refuses_an_init_that_leaves_it_out_a_zero_id_and_bad_timing() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("n.pool");
    for args in [
        vec!["--id", "1", "--init", "2=127.0.0.1:1"],
        vec!["--id", "0"],
        vec!["--id", "1", "--init", "two=127.0.0.1:1"],
        // Raft timing openraft would refuse, or that is no range.
        vec!["--id", "1", "--heartbeat-ms", "300"],
        vec!["--id", "1", "--election-ms", "600-300"],
        vec!["--id", "1", "--election-ms", "300"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_logheap"))
            .arg("kv-server")
            .args(["--addr", "127.0.0.1:0", "--pool"])
            .arg(&pool)
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
        assert!(!pool.exists(), "{args:?} created the pool");
    }
}

#[test]
fn kv_bench_measures_puts_elections_and_a_catch_up_from_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    // 6,000 puts: past openraft's snapshot every 5,000 entries, so the leader has purged
    // its log and the new learner needs the snapshot.
    let out = Command::new(env!("CARGO_BIN_EXE_logheap"))
        .args([
            "kv-bench",
            "--clients",
            "4",
            "--writes",
            "6000",
            "--value-size",
            "64",
            "--kills",
            "1",
            "--heartbeat-ms",
            "60",
            "--election-ms",
            "180-360",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("logheap-raft round 1: 4 clients: "),
        "{stdout}"
    );
    assert!(stdout.contains("(1 kills)"), "{stdout}");
    // Caught up past every put (and the membership entries), from a snapshot.
    let caught_up = stdout
        .split("caught up to log index ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(caught_up >= 6000, "{stdout}");
    assert!(stdout.contains("from a snapshot"), "{stdout}");
    // The nodes ran with the timing given (not the defaults).
    let log = std::fs::read_to_string(dir.path().join("logheap-raft-1/n1.log")).unwrap();
    assert!(
        log.contains("heartbeat 60 ms, election timeout 180-360 ms"),
        "{log}"
    );
    // A peer that is not there is refused before anything runs.
    let out = Command::new(env!("CARGO_BIN_EXE_logheap"))
        .args(["kv-bench", "--peer", "/nonexistent/raft-key-value-rocks"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--peer"));
}
