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
fn a_node_refuses_an_init_that_leaves_it_out_and_a_zero_id() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("n.pool");
    for args in [
        vec!["--id", "1", "--init", "2=127.0.0.1:1"],
        vec!["--id", "0"],
        vec!["--id", "1", "--init", "two=127.0.0.1:1"],
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
