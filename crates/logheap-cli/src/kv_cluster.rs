//! A replicated key-value cluster on the loopback interface, as `kv-failover` and
//! `kv-bench` drive it: processes started, killed with SIGKILL and restarted, and the
//! client calls both need (the leader, a write, a learner). The nodes are logheap's own
//! `logheap kv-server`, or, as `kv-bench`'s peer, openraft's RocksDB example
//! (`examples/raft-kv-rocksdb` of openraft, binary `raft-key-value-rocks`), whose API
//! differs: writes are `POST /api/write` with `{"Set": {..}}`, its answers are wrapped in
//! `{"Ok": ..}`, and its nodes listen on a second port for openraft's RPCs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Which server the nodes run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum System {
    /// `logheap kv-server` (this executable).
    Logheap,
    /// openraft's `raft-kv-rocksdb` example, the binary at this path.
    RocksdbExample(PathBuf),
}

impl System {
    /// Its name in reports.
    pub fn name(&self) -> &'static str {
        match self {
            System::Logheap => "logheap-raft",
            System::RocksdbExample(_) => "openraft-rocksdb",
        }
    }
}

/// A node's addresses: the client API, and (the RocksDB example only) openraft's RPCs.
#[derive(Debug, Clone)]
pub struct Addrs {
    /// host:port of the HTTP API.
    pub api: String,
    /// host:port of the RPC listener (the RocksDB example; logheap serves both on `api`).
    pub rpc: String,
}

/// The nodes: their addresses and running processes.
pub struct Cluster {
    /// What the nodes run.
    pub system: System,
    /// Where pools, databases and logs go.
    pub dir: PathBuf,
    /// Every node ever started, by id.
    pub nodes: BTreeMap<u64, Addrs>,
    /// Those running.
    pub children: BTreeMap<u64, Child>,
    /// The ids of the first members (node 1 of them starts the cluster).
    first: Vec<u64>,
    /// More arguments of every `logheap kv-server` (its Raft timing, say).
    pub server_args: Vec<String>,
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

impl Cluster {
    /// A cluster of nodes `1..=members` (none started yet) with their data in `dir`.
    pub fn new(system: System, dir: PathBuf, members: u64) -> std::io::Result<Cluster> {
        let mut cluster = Cluster {
            system,
            dir,
            nodes: BTreeMap::new(),
            children: BTreeMap::new(),
            first: (1..=members).collect(),
            server_args: Vec::new(),
        };
        for id in 1..=members {
            cluster.add_node(id)?;
        }
        Ok(cluster)
    }

    /// Gives node `id` addresses (a node that is to join later).
    pub fn add_node(&mut self, id: u64) -> std::io::Result<()> {
        let ports = free_ports(2)?;
        self.nodes.insert(
            id,
            Addrs {
                api: format!("127.0.0.1:{}", ports[0]),
                rpc: format!("127.0.0.1:{}", ports[1]),
            },
        );
        Ok(())
    }

    /// The API address of node `id`.
    pub fn api(&self, id: u64) -> &str {
        &self.nodes[&id].api
    }

    /// Starts node `id` from its data (new or left by an earlier run). A logheap node
    /// given `init` makes the first members the cluster; the RocksDB example's cluster
    /// is made by [`Cluster::form`] instead.
    pub fn start(&mut self, id: u64, init: bool) -> std::io::Result<()> {
        let addrs = &self.nodes[&id];
        let mut cmd = match &self.system {
            System::Logheap => {
                let mut cmd = Command::new(std::env::current_exe()?);
                cmd.arg("kv-server")
                    .args(["--id", &id.to_string(), "--addr", &addrs.api])
                    .args(["--size", "256M"])
                    .args(&self.server_args)
                    .arg("--pool")
                    .arg(self.dir.join(format!("n{id}.pool")));
                if init {
                    for m in &self.first {
                        cmd.args(["--init", &format!("{m}={}", self.nodes[m].api)]);
                    }
                }
                cmd
            }
            System::RocksdbExample(exe) => {
                // It keeps its database in `<rpc address>.db` of its working directory.
                let cwd = self.dir.join(format!("n{id}"));
                std::fs::create_dir_all(&cwd)?;
                let mut cmd = Command::new(exe);
                cmd.args(["--id", &id.to_string()])
                    .args(["--http-addr", &addrs.api, "--rpc-addr", &addrs.rpc])
                    .current_dir(cwd);
                cmd
            }
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("n{id}.log")))?;
        // The example logs to its standard output.
        cmd.stdout(log.try_clone()?).stderr(log);
        self.children.insert(id, cmd.spawn()?);
        Ok(())
    }

    /// Kills node `id` with SIGKILL (a crash) and reaps it.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.children.remove(&id) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the first members and makes them a cluster with a leader, within `bound`.
    pub async fn form(&mut self, client: &reqwest::Client, bound: Duration) -> Result<u64, String> {
        for id in self.first.clone() {
            self.start(id, id == 1).map_err(|e| e.to_string())?;
        }
        if self.system == System::Logheap {
            return wait_for_leader(client, self, bound).await;
        }
        // The example: node 1 alone, then the others as learners, then all voters.
        let started = Instant::now();
        let call = |path: &'static str, body: serde_json::Value| {
            let url = format!("http://{}{path}", self.api(1));
            let request = client.post(url).json(&body);
            async move {
                loop {
                    match request.try_clone().expect("a JSON body").send().await {
                        Ok(r) if r.status().is_success() => return Ok(()),
                        Ok(r) => {
                            return Err(format!(
                                "{path}: {}: {}",
                                r.status(),
                                r.text().await.unwrap_or_default()
                            ));
                        }
                        // Not listening yet.
                        Err(_) if started.elapsed() < bound => {
                            tokio::time::sleep(Duration::from_millis(50)).await
                        }
                        Err(e) => return Err(format!("{path}: {e}")),
                    }
                }
            }
        };
        call("/cluster/init", serde_json::json!({})).await?;
        wait_for_leader(client, self, bound).await?;
        for &id in &self.first[1..] {
            let a = &self.nodes[&id];
            call(
                "/cluster/add-learner",
                serde_json::json!([id, a.api, a.rpc]),
            )
            .await?;
        }
        call("/cluster/change-membership", serde_json::json!(self.first)).await?;
        wait_for_leader(client, self, bound).await
    }

    /// Adds running node `id` as a learner through node `leader`; returns once the
    /// leader has brought it up to date (both systems' calls block until then), or
    /// fails after `bound`.
    pub async fn add_learner(
        &self,
        client: &reqwest::Client,
        leader: u64,
        id: u64,
        bound: Duration,
    ) -> Result<(), String> {
        let a = &self.nodes[&id];
        let request = match &self.system {
            System::Logheap => client
                .post(format!("http://{}/cluster/learner", self.api(leader)))
                .json(&serde_json::json!({"id": id, "addr": a.api})),
            System::RocksdbExample(_) => client
                .post(format!("http://{}/cluster/add-learner", self.api(leader)))
                .json(&serde_json::json!([id, a.api, a.rpc])),
        };
        let request = request.timeout(bound);
        let started = Instant::now();
        loop {
            match request.try_clone().expect("a JSON body").send().await {
                Ok(r) if r.status().is_success() => {
                    let body: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
                    if body.get("Err").is_some() {
                        return Err(format!("adding learner {id}: {body}"));
                    }
                    return Ok(());
                }
                Ok(r) => {
                    return Err(format!(
                        "adding learner {id}: {}: {}",
                        r.status(),
                        r.text().await.unwrap_or_default()
                    ));
                }
                // Not listening yet.
                Err(e) if e.is_connect() && started.elapsed() < bound => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => return Err(format!("adding learner {id}: {e}")),
            }
        }
    }

    /// Writes `key` = `value` through node `id`.
    pub async fn put(
        &self,
        client: &reqwest::Client,
        id: u64,
        key: &str,
        value: String,
        timeout: Duration,
    ) -> Result<Put, reqwest::Error> {
        let request = match &self.system {
            System::Logheap => client
                .put(format!("http://{}/kv/{key}", self.api(id)))
                .body(value),
            System::RocksdbExample(_) => client
                .post(format!("http://{}/api/write", self.api(id)))
                .json(&serde_json::json!({"Set": {"key": key, "value": value}})),
        };
        let r = request.timeout(timeout).send().await?;
        if r.status() == reqwest::StatusCode::MISDIRECTED_REQUEST {
            return Ok(Put::NotLeader);
        }
        if !r.status().is_success() {
            return Ok(Put::Refused(r.status().to_string()));
        }
        let body: serde_json::Value = r.json().await?;
        let index = match &self.system {
            System::Logheap => body["log_index"].as_u64(),
            System::RocksdbExample(_) => {
                if body["Err"]["APIError"].get("ForwardToLeader").is_some() {
                    return Ok(Put::NotLeader);
                }
                body["Ok"]["log_id"]["index"].as_u64()
            }
        };
        Ok(index.map_or_else(|| Put::Refused(body.to_string()), Put::Acknowledged))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for id in self.children.keys().copied().collect::<Vec<_>>() {
            self.kill(id);
        }
    }
}

/// The answer to a write.
#[derive(Debug)]
pub enum Put {
    /// Committed and applied at this log index.
    Acknowledged(u64),
    /// Sent to a node that is not the leader: nothing was written.
    NotLeader,
    /// Any other answer (the status or body).
    Refused(String),
}

/// Openraft's metrics of node `id` (`None` when it does not answer).
pub async fn metrics(
    client: &reqwest::Client,
    cluster: &Cluster,
    id: u64,
) -> Option<serde_json::Value> {
    let url = format!("http://{}/cluster/metrics", cluster.api(id));
    let r = client
        .get(url)
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .ok()?;
    let m: serde_json::Value = r.json().await.ok()?;
    // The example wraps its answers in `{"Ok": ..}`.
    Some(m.get("Ok").cloned().unwrap_or(m))
}

/// A running node in the leader's state (`None` yet). Another node's view may be
/// stale (a restarted node's, say); a node's own state is not for long.
pub async fn leader(client: &reqwest::Client, cluster: &Cluster) -> Option<u64> {
    for &id in cluster.children.keys() {
        let Some(m) = metrics(client, cluster, id).await else {
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

/// The leader, polled every 10 ms, within `bound`.
pub async fn wait_for_leader(
    client: &reqwest::Client,
    cluster: &Cluster,
    bound: Duration,
) -> Result<u64, String> {
    let start = Instant::now();
    while start.elapsed() < bound {
        if let Some(l) = leader(client, cluster).await {
            return Ok(l);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(format!("no leader within {bound:?}"))
}

/// The `q` quantile of `v` (0 when empty).
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

/// A temporary directory for a cluster's data: on `/dev/shm` when there is one (the
/// pools are then memory, as on persistent memory), else `/tmp`.
pub fn temp_dir(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix(prefix).tempdir_in(
        if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        },
    )
}
