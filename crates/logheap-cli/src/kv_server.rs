//! `logheap kv-server`: one node of a replicated logheap-kv cluster (logheap-raft) over
//! HTTP on the given address, its storage in one pool file. `scripts/kv-cluster.sh`
//! starts, stops and kills a three-node cluster on the loopback interface.

use std::path::PathBuf;

use crate::size::parse_size;

/// The size of a pool a node creates.
const DEFAULT_SIZE: u64 = 256 << 20;

/// `logheap kv-server` options.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// This node's id (a positive integer, unique in the cluster).
    #[arg(long)]
    id: u64,
    /// Address to listen on, as host:port (the other nodes and clients use it).
    #[arg(long)]
    addr: String,
    /// The node's pool file (created on first use).
    #[arg(long)]
    pool: PathBuf,
    /// Size of the pool when it is created (e.g. 256M, 1G).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Make the cluster at start: `ID=HOST:PORT` for every first member (this node
    /// included), repeated. Only one node of a new cluster is given it.
    #[arg(long = "init", value_name = "ID=HOST:PORT")]
    init: Vec<String>,
    /// Milliseconds between the leader's heartbeats.
    #[arg(long, default_value_t = logheap_raft::server::HEARTBEAT_MS)]
    heartbeat_ms: u64,
    /// A follower's election timeout in milliseconds, MIN-MAX. It stands for election
    /// after a leader lease of MAX plus a random timeout in the range without a word
    /// from a leader (every node of a cluster should be given the same).
    #[arg(long, default_value = "150-300", value_parser = parse_election_ms)]
    election_ms: (u64, u64),
}

/// `MIN-MAX` milliseconds, MIN below MAX.
pub fn parse_election_ms(s: &str) -> Result<(u64, u64), String> {
    let (min, max) = s
        .split_once('-')
        .ok_or_else(|| format!("{s}: not MIN-MAX (e.g. 150-300)"))?;
    let min: u64 = min
        .trim()
        .parse()
        .map_err(|_| format!("{s}: {min} is no number"))?;
    let max: u64 = max
        .trim()
        .parse()
        .map_err(|_| format!("{s}: {max} is no number"))?;
    if min == 0 || min >= max {
        return Err(format!("{s}: MIN must be positive and below MAX"));
    }
    Ok((min, max))
}

/// Runs the node until it is killed.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.id == 0 {
        return Err("--id: node ids start at 1".into());
    }
    let mut members = std::collections::BTreeMap::new();
    for m in &args.init {
        let (id, addr) = m
            .split_once('=')
            .ok_or_else(|| format!("--init {m}: not ID=HOST:PORT"))?;
        let id: u64 = id
            .parse()
            .map_err(|_| format!("--init {m}: {id} is no node id"))?;
        members.insert(
            id,
            openraft::BasicNode {
                addr: addr.to_string(),
            },
        );
    }
    if !members.is_empty() && !members.contains_key(&args.id) {
        return Err(format!("--init does not name this node ({})", args.id).into());
    }
    let raft = logheap_raft::server::raft_config_with(args.heartbeat_ms, args.election_ms)
        .validate()
        .map_err(|e| format!("--heartbeat-ms, --election-ms: {e}"))?;
    let config = logheap::Config::default().size(args.size.unwrap_or(DEFAULT_SIZE));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.addr)
            .await
            .map_err(|e| format!("{}: {e}", args.addr))?;
        let node = logheap_raft::server::start_with(args.id, &args.pool, &config, raft)
            .await
            .map_err(|e| format!("{}: {e}", args.pool.display()))?;
        if !members.is_empty() {
            // A node that was initialised before refuses again: that is no error.
            if let Err(e) = node.raft.initialize(members).await {
                eprintln!("logheap kv-server: not initialised again: {e}");
            }
        }
        eprintln!(
            "logheap kv-server: node {} listening on {} (pool {}; heartbeat {} ms, election timeout {}-{} ms)",
            args.id,
            args.addr,
            args.pool.display(),
            args.heartbeat_ms,
            args.election_ms.0,
            args.election_ms.1
        );
        // SIGTERM or SIGINT: stop serving, stop Raft, and close the pool cleanly (its
        // last handle goes with `node`). SIGKILL is a crash: the next start recovers.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        logheap_raft::server::serve_until(node.clone(), listener, stop).await?;
        node.raft.shutdown().await?;
        drop(node);
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
