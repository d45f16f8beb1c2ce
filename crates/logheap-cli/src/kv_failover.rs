//! `logheap kv-failover`: the failover test of a replicated logheap-kv cluster. Three
//! `logheap kv-server` processes on the loopback interface; each round a client writes
//! keys one after the other through the leader, keeping a ledger of the writes the
//! cluster acknowledged, then the leader is killed with SIGKILL, a new one is waited
//! for, and the ledger is checked against a linearizable scan of the new leader: every
//! acknowledged write is there with its value, nothing is there that was never sent,
//! and the log indexes of acknowledged writes grow with their order. The killed node is
//! then restarted from its pool. Exits 1 on any violation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// The three nodes: their addresses and processes.
struct Cluster {
    exe: PathBuf,
    dir: PathBuf,
    addrs: BTreeMap<u64, String>,
    children: BTreeMap<u64, Child>,
}

impl Cluster {
    fn start(&mut self, id: u64, init: bool) -> std::io::Result<()> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("kv-server")
            .args([
                "--id",
                &id.to_string(),
                "--addr",
                &self.addrs[&id],
                "--size",
                "64M",
            ])
            .arg("--pool")
            .arg(self.dir.join(format!("n{id}.pool")));
        if init {
            for (m, addr) in &self.addrs {
                cmd.args(["--init", &format!("{m}={addr}")]);
            }
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("n{id}.log")))?;
        cmd.stdout(Stdio::null()).stderr(log);
        self.children.insert(id, cmd.spawn()?);
        Ok(())
    }

    fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.children.remove(&id) {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for id in self.children.keys().copied().collect::<Vec<_>>() {
            self.kill(id);
        }
    }
}

/// Free loopback ports (bound and released: another process could take one meanwhile,
/// which then fails the start loudly).
fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
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
            temp = tempfile::Builder::new()
                .prefix("logheap-kv-failover")
                .tempdir_in(if Path::new("/dev/shm").is_dir() {
                    "/dev/shm"
                } else {
                    "/tmp"
                })?;
            temp.path().to_path_buf()
        }
    };
    let ports = free_ports(3)?;
    let mut cluster = Cluster {
        exe: std::env::current_exe()?,
        dir: dir.clone(),
        addrs: (1..=3)
            .zip(ports)
            .map(|(id, p)| (id, format!("127.0.0.1:{p}")))
            .collect(),
        children: BTreeMap::new(),
    };
    for id in 1..=3 {
        cluster.start(id, id == 1)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let tally = runtime.block_on(rounds(args, &mut cluster))?;
    drop(cluster);
    let quantile = |v: &[f64], q: f64| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
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

/// A running node in the leader's state (`None` yet). Another node's view may be
/// stale (a restarted node's, say); a node's own state is not for long.
async fn leader(client: &reqwest::Client, cluster: &Cluster) -> Option<u64> {
    for &id in cluster.children.keys() {
        let url = format!("http://{}/cluster/metrics", cluster.addrs[&id]);
        let Ok(r) = client
            .get(url)
            .timeout(Duration::from_millis(300))
            .send()
            .await
        else {
            continue;
        };
        let Ok(m) = r.json::<serde_json::Value>().await else {
            continue;
        };
        // Its state too: a node restarted from its pool reads its last vote back, which
        // may name itself, before it hears of the newer term.
        if m["current_leader"].as_u64() == Some(id) && m["state"].as_str() == Some("Leader") {
            return Some(id);
        }
    }
    None
}

async fn wait_for_leader(
    client: &reqwest::Client,
    cluster: &Cluster,
    bound: Duration,
) -> Result<u64, String> {
    let start = Instant::now();
    while start.elapsed() < bound {
        if let Some(l) = leader(client, cluster).await {
            return Ok(l);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("no leader within {bound:?}"))
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
    /// Write `seq` of `value` was acknowledged with answer `r` (its log index must be
    /// past every earlier acknowledged write's).
    async fn acknowledged(
        &mut self,
        tally: &mut Tally,
        seq: u64,
        value: String,
        r: reqwest::Response,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let body: serde_json::Value = r.json().await?;
        let index = body["log_index"]
            .as_u64()
            .ok_or("no log index in the answer")?;
        if index <= self.last_index {
            tally.reordered += 1;
        }
        self.last_index = index;
        self.acked.insert(seq, value);
        tally.acknowledged += 1;
        Ok(())
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
    let mut leader_id = wait_for_leader(&client, cluster, Duration::from_secs(30)).await?;
    for round in 0..args.rounds {
        if started.elapsed() > Duration::from_secs(args.time_limit) {
            eprintln!("kv-failover: time limit reached after {round} rounds");
            break;
        }
        let mut written = 0;
        while written < args.writes {
            seq += 1;
            let value = format!("value-{seq}-round-{round}");
            let url = format!("http://{}/kv/w{seq:08}", cluster.addrs[&leader_id]);
            let sent = Instant::now();
            let answer = client
                .put(url)
                .body(value.clone())
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            match answer {
                // Not the leader (any more): nothing was written; the same write again
                // through the leader, under the next number.
                Ok(r) if r.status() == reqwest::StatusCode::MISDIRECTED_REQUEST => {
                    leader_id = wait_for_leader(&client, cluster, Duration::from_secs(30)).await?;
                }
                Ok(r) if r.status().is_success() => {
                    written += 1;
                    tally.writes_us.push(sent.elapsed().as_secs_f64() * 1e6);
                    tally.writing += sent.elapsed();
                    ledger.acknowledged(&mut tally, seq, value, r).await?;
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
        let in_flight = client
            .put(format!("http://{}/kv/w{seq:08}", cluster.addrs[&leader_id]))
            .body(value.clone())
            .timeout(Duration::from_secs(5))
            .send();
        let in_flight = tokio::spawn(in_flight);
        tokio::time::sleep(Duration::from_micros(200 * u64::from(round % 10))).await;
        let killed = leader_id;
        cluster.kill(killed);
        let t = Instant::now();
        match in_flight.await {
            Ok(Ok(r)) if r.status().is_success() => {
                ledger.acknowledged(&mut tally, seq, value, r).await?
            }
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
                cluster.addrs[&leader_id]
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
