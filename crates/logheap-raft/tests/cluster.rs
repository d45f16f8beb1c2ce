//! A three-node cluster on the loopback interface, in one process: it elects a leader,
//! replicates writes, answers linearizable reads, sends clients on from followers, and
//! after its leader stops elects another that has every acknowledged write.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use logheap_raft::server::{self, Node};
use reqwest::StatusCode;

fn config() -> logheap::Config {
    logheap::Config::default().size(32 << 20)
}

/// Sends `request` to `addr`, following redirects to the leader (421) a few times.
async fn call(
    client: &reqwest::Client,
    mut addr: String,
    method: reqwest::Method,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    for _ in 0..20 {
        let sent = client
            .request(method.clone(), format!("http://{addr}{path}"))
            // JSON for the cluster routes; the key-value routes take any bytes.
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        let Ok(r) = sent else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let status = r.status();
        let bytes = r.bytes().await.unwrap().to_vec();
        if status == StatusCode::MISDIRECTED_REQUEST {
            let to: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            if let Some(leader) = to["leader_addr"].as_str() {
                addr = leader.to_string();
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            continue;
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        return (status, bytes);
    }
    panic!("{method} {path}: no leader answered");
}

/// Waits until one of `nodes` other than `not` is in the leader's state, and returns
/// its id (a node's view of another may be stale).
async fn leader(nodes: &[&Node], not: Option<u64>) -> u64 {
    let start = Instant::now();
    loop {
        for n in nodes.iter().filter(|n| Some(n.id) != not) {
            let m = n.raft.metrics().borrow().clone();
            if m.current_leader == Some(n.id) && m.state.is_leader() {
                return n.id;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no leader elected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_and_survive_the_loss_of_their_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    let mut addrs = BTreeMap::new();
    let mut servers = BTreeMap::new();
    for id in 1..=3u64 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let node = server::start(id, &dir.path().join(format!("n{id}.pool")), &config())
            .await
            .unwrap();
        servers.insert(id, tokio::spawn(server::serve(node.clone(), listener)));
        addrs.insert(id, addr);
        nodes.push(node);
    }
    let client = reqwest::Client::new();
    let init = serde_json::to_vec(&addrs).unwrap();
    let (status, _) = call(
        &client,
        addrs[&1].clone(),
        reqwest::Method::POST,
        "/cluster/init",
        init,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let first = leader(&nodes.iter().collect::<Vec<_>>(), None).await;

    // Writes through any node (followers send the client on), reads from the leader.
    for i in 0..40 {
        let at = addrs[&(1 + i % 3)].clone();
        let (status, _) = call(
            &client,
            at,
            reqwest::Method::PUT,
            &format!("/kv/key{i:02}"),
            format!("v{i}").into_bytes(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "put {i}");
    }
    let (status, _) = call(
        &client,
        addrs[&2].clone(),
        reqwest::Method::DELETE,
        "/kv/key00",
        Vec::new(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, value) = call(
        &client,
        addrs[&first].clone(),
        reqwest::Method::GET,
        "/kv/key07",
        Vec::new(),
    )
    .await;
    assert_eq!((status, value), (StatusCode::OK, b"v7".to_vec()));
    let (status, _) = call(
        &client,
        addrs[&first].clone(),
        reqwest::Method::GET,
        "/kv/key00",
        Vec::new(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A follower does not answer a read itself: it names the leader.
    let follower = addrs.keys().copied().find(|&id| id != first).unwrap();
    let r = client
        .get(format!("http://{}/kv/key07", addrs[&follower]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::MISDIRECTED_REQUEST);

    // The leader stops: the others elect one of themselves, which has every write.
    servers[&first].abort();
    let stopped = nodes.iter().find(|n| n.id == first).unwrap();
    stopped.raft.shutdown().await.unwrap();
    let rest: Vec<&Node> = nodes.iter().filter(|n| n.id != first).collect();
    let second = leader(&rest, Some(first)).await;
    assert_ne!(second, first);
    let (status, body) = call(
        &client,
        addrs[&second].clone(),
        reqwest::Method::GET,
        "/scan?start=key&limit=100",
        Vec::new(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let pairs: Vec<(String, String)> = serde_json::from_slice(&body).unwrap();
    let expected: Vec<(String, String)> = (1..40)
        .map(|i| (format!("key{i:02}"), format!("v{i}")))
        .collect();
    assert_eq!(pairs, expected);
    let (status, _) = call(
        &client,
        addrs[&second].clone(),
        reqwest::Method::PUT,
        "/kv/after",
        b"failover".to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    for n in rest {
        n.raft.shutdown().await.unwrap();
    }
}

/// With snapshots every 20 entries (and the log purged behind them), a follower that
/// was down while the cluster moved on comes back from its pool and catches up by
/// installing a snapshot of a few MB; then the leader is lost and the others still
/// have every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_back_from_its_pool_catches_up_from_a_snapshot() {
    let raft = || openraft::Config {
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(20),
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..server::raft_config()
    };
    let dir = tempfile::tempdir().unwrap();
    let pool = |id: u64| dir.path().join(format!("n{id}.pool"));
    let mut listeners = BTreeMap::new();
    let mut addrs = BTreeMap::new();
    for id in 1..=3u64 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        addrs.insert(id, listener.local_addr().unwrap().to_string());
        listener.set_nonblocking(true).unwrap();
        listeners.insert(id, listener);
    }
    let mut nodes = BTreeMap::new();
    let mut servers = BTreeMap::new();
    for id in 1..=3u64 {
        let node = server::start_with(id, &pool(id), &config(), raft())
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::from_std(listeners.remove(&id).unwrap()).unwrap();
        servers.insert(id, tokio::spawn(server::serve(node.clone(), listener)));
        nodes.insert(id, node);
    }
    let client = reqwest::Client::new();
    let init = serde_json::to_vec(&addrs).unwrap();
    let (status, _) = call(
        &client,
        addrs[&1].clone(),
        reqwest::Method::POST,
        "/cluster/init",
        init,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let first = leader(&nodes.values().collect::<Vec<_>>(), None).await;
    let down = (1..=3).find(|&id| id != first).unwrap();

    // A follower goes down (its pool closed), the others commit far past it.
    servers.remove(&down).unwrap().abort();
    let node = nodes.remove(&down).unwrap();
    node.raft.shutdown().await.unwrap();
    drop(node);
    // 100 values of 20 KiB: a snapshot of 2 MB of data, sent as JSON arrays of numbers
    // (3-4 bytes per byte), so over axum's default 2 MiB body limit, which the server
    // raises (`server::BODY_LIMIT`).
    for i in 0..100 {
        let value = format!("v{i}-").repeat(20 << 10).into_bytes()[..20 << 10].to_vec();
        let (status, _) = call(
            &client,
            addrs[&first].clone(),
            reqwest::Method::PUT,
            &format!("/kv/k{i:03}"),
            value,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "put {i}");
    }
    let snapshot = nodes[&first].raft.metrics().borrow().snapshot;
    assert!(
        snapshot.is_some_and(|s| s.index >= 80),
        "no snapshot taken: {snapshot:?}"
    );

    // It comes back from its pool on the same address and catches up.
    let mut restarted = None;
    for _ in 0..100 {
        // The old instance lets go of the pool and the port once its tasks end.
        if let Ok(node) = server::start_with(down, &pool(down), &config(), raft()).await {
            restarted = Some(node);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let node = restarted.expect("the follower's pool reopens");
    let listener = tokio::net::TcpListener::bind(&addrs[&down]).await.unwrap();
    servers.insert(down, tokio::spawn(server::serve(node.clone(), listener)));
    nodes.insert(down, node);
    let start = Instant::now();
    loop {
        if nodes[&down].reader.get(b"k099").unwrap().is_some() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the follower did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        nodes[&down].raft.metrics().borrow().snapshot.is_some(),
        "caught up without a snapshot"
    );

    // The leader is lost: the other two (one of them the follower that caught up) go on.
    servers[&first].abort();
    nodes[&first].raft.shutdown().await.unwrap();
    let rest: Vec<&Node> = nodes.values().filter(|n| n.id != first).collect();
    let second = leader(&rest, Some(first)).await;
    let (status, body) = call(
        &client,
        addrs[&second].clone(),
        reqwest::Method::GET,
        "/scan?start=k&limit=1000",
        Vec::new(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let pairs: Vec<(String, String)> = serde_json::from_slice(&body).unwrap();
    assert_eq!(pairs.len(), 100);
    let (status, _) = call(
        &client,
        addrs[&second].clone(),
        reqwest::Method::PUT,
        "/kv/after",
        b"x".to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    for n in rest {
        n.raft.shutdown().await.unwrap();
    }
}
