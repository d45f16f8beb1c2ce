//! `logheap kv-bench`: the replicated key-value store measured on three nodes on the
//! loopback interface, and, side by side in the same run, openraft's RocksDB example
//! (`examples/raft-kv-rocksdb`) when its binary is given with `--peer`. For each system:
//!
//! 1. **Puts**: for each `--clients` level, that many concurrent clients write
//!    `--writes` new keys of `--value-size` bytes through the leader, one write at a time
//!    each; writes per second, and latency p50 and p99 of acknowledged writes.
//! 2. **Elections**: `--kills` times, the leader is killed with SIGKILL on an idle
//!    cluster, the time until another node is leader is taken, and the killed node is
//!    restarted and waited for.
//! 3. **Catch-up**: a fourth node starts empty and, once it answers, is added as a
//!    learner; the time until it has applied everything the leader had. The leader has
//!    by then purged the log it snapshotted (openraft's default policy: a snapshot every
//!    5,000 entries), so the learner is sent a snapshot and then the entries after it.
//!
//! Both systems write every put through openraft; they differ in the server (axum or
//! tide), the RPC transport (HTTP or websockets), and the storage: logheap keeps the log
//! and the applied data in one pool, each call one transaction; the example keeps its log
//! in RocksDB (appends not synced, the write-ahead log flushed on votes and commits) and
//! applies to a `BTreeMap` in DRAM, persisted only in snapshots. Its Raft timing is
//! fixed (heartbeat 250 ms, election timeout 299-300 ms); `--heartbeat-ms 250
//! --election-ms 299-300` gives logheap's nodes the same. Its websocket RPCs leave
//! Nagle's algorithm on, which costs each replication round about 176 ms on loopback;
//! `docs/benchmarks.md` §24 shows it as shipped and with `TCP_NODELAY` set on every
//! socket by a preloaded library (`scripts/nodelay-shim.c`). The systems' rounds alternate
//! (`--rounds`), so compare them as ratios within one run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::kv_cluster::{self, Cluster, Put, System, quantile, temp_dir, wait_for_leader};

/// `logheap kv-bench` options.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// openraft's RocksDB example binary (`raft-key-value-rocks`, built from openraft's
    /// `examples/raft-kv-rocksdb`), measured beside logheap in the same run.
    #[arg(long)]
    peer: Option<PathBuf>,
    /// Concurrent clients of a put run, repeated for several runs.
    #[arg(long = "clients", default_values_t = vec![1, 16])]
    clients: Vec<u32>,
    /// Puts per run (new keys), shared among the clients.
    #[arg(long, default_value_t = 20_000)]
    writes: u32,
    /// Bytes of each value.
    #[arg(long, default_value_t = 100)]
    value_size: usize,
    /// Leader kills timed per round.
    #[arg(long, default_value_t = 5)]
    kills: u32,
    /// Rounds; each runs every system once, in turn.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Milliseconds between heartbeats of logheap's nodes (`kv-server --heartbeat-ms`;
    /// the RocksDB example's are fixed at 250).
    #[arg(long, default_value_t = logheap_raft::server::HEARTBEAT_MS)]
    heartbeat_ms: u64,
    /// Election timeout of logheap's nodes, MIN-MAX milliseconds (`kv-server
    /// --election-ms`; the RocksDB example's is fixed at 299-300).
    #[arg(long, default_value = "150-300", value_parser = crate::kv_server::parse_election_ms)]
    election_ms: (u64, u64),
    /// Directory for the nodes' data and logs (default: a temporary one on /dev/shm,
    /// removed; a round's data is removed before the next).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// One system's figures in one round.
#[derive(Debug)]
struct Figures {
    /// Per clients level: (clients, writes/s, p50 µs, p99 µs).
    puts: Vec<(u32, f64, f64, f64)>,
    /// Milliseconds from each kill to a new leader.
    elections_ms: Vec<f64>,
    /// Milliseconds for the new learner to catch up, and the log index it caught up to.
    /// Or why it did not within the bound.
    catch_up: Result<(f64, u64), String>,
    /// Whether the leader had purged its log, so the learner needed a snapshot.
    from_snapshot: bool,
}

/// Runs the benchmark.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.clients.contains(&0) || args.writes == 0 {
        return Err("--clients and --writes must be positive".into());
    }
    let mut systems = vec![System::Logheap];
    if let Some(peer) = &args.peer {
        if !peer.is_file() {
            return Err(format!(
                "--peer {}: no such file (build openraft's examples/raft-kv-rocksdb)",
                peer.display()
            )
            .into());
        }
        systems.push(System::RocksdbExample(peer.canonicalize()?));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut results: Vec<(String, u32, Figures)> = Vec::new();
    for round in 1..=args.rounds {
        for system in &systems {
            let temp;
            let dir = match &args.dir {
                Some(d) => {
                    let d = d.join(format!("{}-{round}", system.name()));
                    if d.exists() {
                        std::fs::remove_dir_all(&d)?;
                    }
                    std::fs::create_dir_all(&d)?;
                    d
                }
                None => {
                    temp = temp_dir("logheap-kv-bench")?;
                    temp.path().to_path_buf()
                }
            };
            let mut cluster = Cluster::new(system.clone(), dir, 3)?;
            cluster.server_args = vec![
                format!("--heartbeat-ms={}", args.heartbeat_ms),
                format!(
                    "--election-ms={}-{}",
                    args.election_ms.0, args.election_ms.1
                ),
            ];
            let figures = runtime
                .block_on(measure(args, &mut cluster))
                .map_err(|e| format!("{} (round {round}): {e}", system.name()))?;
            drop(cluster);
            report(system.name(), round, &figures);
            results.push((system.name().to_string(), round, figures));
        }
    }
    if systems.len() > 1 {
        println!("\nlogheap-raft / openraft-rocksdb, per round:");
        for pair in results.chunks(2) {
            let [(_, round, ours), (_, _, peer)] = pair else {
                continue;
            };
            for ((c, w, p50, p99), (_, pw, pp50, pp99)) in ours.puts.iter().zip(&peer.puts) {
                println!(
                    "  round {round}, {c} clients: throughput {:.2}x, p50 latency {:.2}x, p99 latency {:.2}x",
                    w / pw,
                    p50 / pp50,
                    p99 / pp99
                );
            }
            let catch_up = match (&ours.catch_up, &peer.catch_up) {
                (Ok((o, _)), Ok((p, _))) => format!("{:.2}x", o / p),
                _ => "not both caught up".to_string(),
            };
            println!(
                "  round {round}: election median {:.2}x, catch-up {catch_up}",
                quantile(&ours.elections_ms, 0.5) / quantile(&peer.elections_ms, 0.5),
            );
        }
    }
    Ok(())
}

fn report(name: &str, round: u32, f: &Figures) {
    for (c, w, p50, p99) in &f.puts {
        println!(
            "{name} round {round}: {c} clients: {w:.0} puts/s, latency p50 {p50:.0} us, p99 {p99:.0} us"
        );
    }
    println!(
        "{name} round {round}: new leader after a kill: median {:.0} ms, max {:.0} ms ({} kills)",
        quantile(&f.elections_ms, 0.5),
        quantile(&f.elections_ms, 1.0),
        f.elections_ms.len()
    );
    let how = if f.from_snapshot {
        "from a snapshot: the leader had purged its log"
    } else {
        "from the log: the leader had purged nothing"
    };
    match &f.catch_up {
        Ok((ms, index)) => println!(
            "{name} round {round}: a new learner caught up to log index {index} in {ms:.0} ms ({how})"
        ),
        Err(why) => println!("{name} round {round}: a new learner did not catch up ({how}): {why}"),
    }
}

async fn measure(
    args: &Args,
    cluster: &mut Cluster,
) -> Result<Figures, Box<dyn std::error::Error>> {
    let client = reqwest::Client::new();
    let bound = Duration::from_secs(30);
    let mut leader = cluster.form(&client, bound).await?;
    let mut puts = Vec::new();
    for (level, &clients) in args.clients.iter().enumerate() {
        let started = Instant::now();
        let tasks = (0..clients).map(|c| {
            let cluster = &*cluster;
            let client = &client;
            async move {
                let mut latencies = Vec::new();
                for n in (c..args.writes).step_by(clients as usize) {
                    let key = format!("r{level}-{n:09}");
                    let mut value = format!("{n}-");
                    value.extend(std::iter::repeat_n(
                        'v',
                        args.value_size.saturating_sub(value.len()),
                    ));
                    let sent = Instant::now();
                    match cluster.put(client, leader, &key, value, bound).await {
                        Ok(Put::Acknowledged(_)) => {
                            latencies.push(sent.elapsed().as_secs_f64() * 1e6)
                        }
                        Ok(Put::NotLeader) => {
                            return Err(format!(
                                "put {key}: node {leader} is no longer the leader"
                            ));
                        }
                        Ok(Put::Refused(why)) => return Err(format!("put {key}: refused: {why}")),
                        Err(e) => return Err(format!("put {key}: {e}")),
                    }
                }
                Ok(latencies)
            }
        });
        let mut latencies = Vec::new();
        for l in futures::future::join_all(tasks).await {
            latencies.extend(l?);
        }
        let seconds = started.elapsed().as_secs_f64();
        puts.push((
            clients,
            latencies.len() as f64 / seconds,
            quantile(&latencies, 0.5),
            quantile(&latencies, 0.99),
        ));
    }
    let mut elections_ms = Vec::new();
    for _ in 0..args.kills {
        let killed = leader;
        cluster.kill(killed);
        let t = Instant::now();
        leader = loop {
            let l = wait_for_leader(&client, cluster, bound).await?;
            if l != killed {
                break l;
            }
        };
        elections_ms.push(t.elapsed().as_secs_f64() * 1e3);
        cluster.start(killed, false)?;
        // Back, following the new leader and as far as it before the next kill (a
        // node still behind would stand for election later than the others), then a
        // second of steady heartbeats.
        let target = kv_cluster::metrics(&client, cluster, leader)
            .await
            .and_then(|m| m["last_log_index"].as_u64())
            .unwrap_or(0);
        let started = Instant::now();
        loop {
            let m = kv_cluster::metrics(&client, cluster, killed).await;
            let follows = m.as_ref().and_then(|m| m["current_leader"].as_u64()) == Some(leader);
            let index = m.as_ref().and_then(|m| m["last_log_index"].as_u64());
            if follows && index >= Some(target) {
                break;
            }
            if started.elapsed() > bound {
                return Err(format!("node {killed} did not rejoin within {bound:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let learner = cluster.nodes.keys().max().map_or(1, |m| m + 1);
    cluster.add_node(learner)?;
    let m = kv_cluster::metrics(&client, cluster, leader)
        .await
        .ok_or("the leader does not answer")?;
    let from_snapshot = m["purged"]["index"].as_u64().is_some_and(|i| i > 0);
    let target = m["last_log_index"].as_u64().unwrap_or(0);
    // Timed from when the new node answers (its start, a new pool or database, is not
    // catching up).
    cluster.start(learner, false)?;
    let started = Instant::now();
    while kv_cluster::metrics(&client, cluster, learner)
        .await
        .is_none()
    {
        if started.elapsed() > bound {
            return Err(format!("node {learner} did not start within {bound:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let catch_up = catch_up(&client, cluster, leader, learner, target, bound).await;
    Ok(Figures {
        puts,
        elections_ms,
        catch_up,
        from_snapshot,
    })
}

/// Adds running node `learner` through `leader` and times it until it has applied up
/// to `target` (its reads see everything the leader had; it hears how far the log is
/// committed only with the leader's next message): milliseconds and the index reached.
async fn catch_up(
    client: &reqwest::Client,
    cluster: &Cluster,
    leader: u64,
    learner: u64,
    target: u64,
    bound: Duration,
) -> Result<(f64, u64), String> {
    let t = Instant::now();
    cluster.add_learner(client, leader, learner, bound).await?;
    loop {
        let m = kv_cluster::metrics(client, cluster, learner).await;
        let applied = m
            .and_then(|m| m["last_applied"]["index"].as_u64())
            .unwrap_or(0);
        if applied >= target {
            return Ok((t.elapsed().as_secs_f64() * 1e3, applied));
        }
        if t.elapsed() > bound {
            return Err(format!(
                "it applied up to log index {applied} of {target} in {bound:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
