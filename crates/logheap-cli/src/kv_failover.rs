//! `logheap kv-failover`: the failover test of a replicated logheap-kv cluster. Three
//! `logheap kv-server` processes on the loopback interface; each round a client writes
//! keys one after the other through the leader, keeping a ledger of the writes the
//! cluster acknowledged, then the leader is killed with SIGKILL, a new one is waited
//! for, and the ledger is checked against a linearizable scan of the new leader: every
//! acknowledged write is there with its value, nothing is there that was never sent,
//! and the log indexes of acknowledged writes grow with their order. The killed node is
//! then restarted from its pool. Exits 1 on any violation.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::kv_cluster::{Cluster, Put, System, quantile, temp_dir, wait_for_leader};

/// `logheap kv-failover` options.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rounds: each writes, kills the leader with SIGKILL and checks.
    #[arg(long, default_value_t = 100)]
    rounds: u32,
    /// Writes acknowledged per round before the kill.
    #[arg(long, default_value_t = 50)]
    writes: u32,
    /// Stop after this many seconds even when rounds are left (the rounds done are
    /// reported).
    #[arg(long, default_value_t = 600)]
    time_limit: u64,
    /// Directory for the nodes' pools and logs (default: a temporary one, removed).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// What the run found.
#[derive(Debug, Default)]
struct Tally {
    acknowledged: u64,
    /// Writes whose answer was lost (sent when the leader was killed, or timed out).
    unknown: u64,
    lost: u64,
    phantom: u64,
    reordered: u64,
    elections_ms: Vec<f64>,
    /// Latency of each write acknowledged outside a kill, in microseconds.
    writes_us: Vec<f64>,
    /// Time spent in those writes.
    writing: Duration,
}

/// Runs the test.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let temp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            temp = temp_dir("logheap-kv-failover")?;
            temp.path().to_path_buf()
        }
    };
    let mut cluster = Cluster::new(System::Logheap, dir, 3)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let tally = runtime.block_on(rounds(args, &mut cluster))?;
    drop(cluster);
    let e = &tally.elections_ms;
    let pick = |q: f64| quantile(e, q);
    println!(
        "kv-failover: {} leader kills, {} writes acknowledged, {} unknown (in flight at a kill), {} lost, {} phantom, {} out of order",
        e.len(),
        tally.acknowledged,
        tally.unknown,
        tally.lost,
        tally.phantom,
        tally.reordered
    );
    println!(
        "kv-failover: new leader after a kill in {:.0} ms median, {:.0} ms p99, {:.0} ms max",
        pick(0.5),
        pick(0.99),
        pick(1.0)
    );
    println!(
        "kv-failover: acknowledged writes (one client, one at a time, 3 nodes): {:.0} writes/s, latency {:.0} us median, {:.0} us p99",
        tally.writes_us.len() as f64 / tally.writing.as_secs_f64().max(1e-9),
        quantile(&tally.writes_us, 0.5),
        quantile(&tally.writes_us, 0.99)
    );
    if tally.lost + tally.phantom + tally.reordered > 0 {
        return Err("acknowledged writes were lost, or writes appeared that were never made, or out of order".into());
    }
    Ok(())
}

/// The client's record of its writes.
#[derive(Debug, Default)]
struct Ledger {
    /// Number -> value of every write the cluster acknowledged.
    acked: BTreeMap<u64, String>,
    /// Those whose answer never came: each may or may not have happened.
    unknown: BTreeMap<u64, String>,
    /// The log index of the last acknowledged write.
    last_index: u64,
}

impl Ledger {
    /// Write `seq` of `value` was acknowledged at log index `index` (which must be past
    /// every earlier acknowledged write's).
    fn acknowledged(&mut self, tally: &mut Tally, seq: u64, value: String, index: u64) {
        if index <= self.last_index {
            tally.reordered += 1;
        }
        self.last_index = index;
        self.acked.insert(seq, value);
        tally.acknowledged += 1;
    }

    /// Write `seq` of `value` got no answer.
    fn unanswered(&mut self, tally: &mut Tally, seq: u64, value: String) {
        self.unknown.insert(seq, value);
        tally.unknown += 1;
    }
}

async fn rounds(args: &Args, cluster: &mut Cluster) -> Result<Tally, Box<dyn std::error::Error>> {
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut ledger = Ledger::default();
    let mut seq = 0u64;
    let mut leader_id = cluster.form(&client, Duration::from_secs(30)).await?;
    for round in 0..args.rounds {
        if started.elapsed() > Duration::from_secs(args.time_limit) {
            eprintln!("kv-failover: time limit reached after {round} rounds");
            break;
        }
        let mut written = 0;
        while written < args.writes {
            seq += 1;
            let value = format!("value-{seq}-round-{round}");
            let key = format!("w{seq:08}");
            let sent = Instant::now();
            let answer = cluster
                .put(
                    &client,
                    leader_id,
                    &key,
                    value.clone(),
                    Duration::from_secs(5),
                )
                .await;
            match answer {
                // Not the leader (any more): nothing was written; the same write again
                // through the leader, under the next number.
                Ok(Put::NotLeader) => {
                    leader_id = wait_for_leader(&client, cluster, Duration::from_secs(30)).await?;
                }
                Ok(Put::Acknowledged(index)) => {
                    written += 1;
                    tally.writes_us.push(sent.elapsed().as_secs_f64() * 1e6);
                    tally.writing += sent.elapsed();
                    ledger.acknowledged(&mut tally, seq, value, index);
                }
                _ => {
                    ledger.unanswered(&mut tally, seq, value);
                    leader_id = wait_for_leader(&client, cluster, Duration::from_secs(30)).await?;
                }
            }
        }
        // Kill the leader while one more write is in flight (its answer may come or
        // not: either way the write may or may not be there); time the next election.
        seq += 1;
        let value = format!("value-{seq}-round-{round}-at-the-kill");
        let key = format!("w{seq:08}");
        let killed = leader_id;
        let mut process = cluster
            .children
            .remove(&killed)
            .ok_or("the leader is not running")?;
        let in_flight = cluster.put(&client, killed, &key, value.clone(), Duration::from_secs(5));
        let kill = async {
            tokio::time::sleep(Duration::from_micros(200 * u64::from(round % 10))).await;
            let _ = process.kill(); // SIGKILL
            Instant::now()
        };
        let (answer, t) = tokio::join!(in_flight, kill);
        let _ = process.wait();
        match answer {
            Ok(Put::Acknowledged(index)) => ledger.acknowledged(&mut tally, seq, value, index),
            _ => ledger.unanswered(&mut tally, seq, value),
        }
        leader_id = loop {
            let l = wait_for_leader(&client, cluster, Duration::from_secs(30)).await?;
            if l != killed {
                break l;
            }
        };
        tally.elections_ms.push(t.elapsed().as_secs_f64() * 1e3);
        // Check the ledger against a linearizable scan of the new leader.
        let mut found: Option<Vec<(String, String)>> = None;
        let mut last_answer = String::new();
        for _ in 0..100 {
            // The leader as it is now (it may change while the scan is retried).
            let url = format!(
                "http://{}/scan?start=w&limit=100000000",
                cluster.api(leader_id)
            );
            match client
                .get(&url)
                .timeout(Duration::from_secs(5))
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => {
                    found = Some(r.json().await?);
                    break;
                }
                Ok(r) => {
                    last_answer = format!("{}: {}", r.status(), r.text().await.unwrap_or_default())
                }
                Err(e) => last_answer = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            leader_id = wait_for_leader(&client, cluster, Duration::from_secs(30)).await?;
        }
        let found = found.ok_or_else(|| {
            format!("round {round}: the new leader (node {leader_id}) never answered a scan; last: {last_answer}")
        })?;
        let found: BTreeMap<u64, String> = found
            .into_iter()
            .filter_map(|(k, v)| Some((k.strip_prefix('w')?.parse().ok()?, v)))
            .collect();
        let lost = ledger
            .acked
            .iter()
            .filter(|(s, v)| found.get(s) != Some(v))
            .count() as u64;
        let phantom = found
            .iter()
            .filter(|(s, v)| ledger.acked.get(s) != Some(v) && ledger.unknown.get(s) != Some(v))
            .count() as u64;
        if lost + phantom > 0 {
            eprintln!(
                "kv-failover: round {round}: {lost} acknowledged writes lost, {phantom} phantom"
            );
        }
        tally.lost = tally.lost.max(lost);
        tally.phantom = tally.phantom.max(phantom);
        // The killed node comes back from its pool, as a follower.
        cluster.start(killed, false)?;
    }
    Ok(tally)
}
