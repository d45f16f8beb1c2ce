//! One node of a replicated logheap-kv cluster over HTTP: openraft's RPCs between
//! nodes, and a small client API (`get`, `put`, `delete`, `scan`, cluster membership,
//! metrics), with linearizable reads (openraft's read index: the leader confirms its
//! leadership with a quorum and waits until it has applied up to then).
//!
//! Routes (bodies JSON unless said):
//!
//! | route | what |
//! |---|---|
//! | `GET /kv/{key}` | the value (raw bytes), 404 when absent; linearizable |
//! | `PUT /kv/{key}` (raw bytes) | sets it; answers `{"log_index": n}` once committed and applied |
//! | `DELETE /kv/{key}` | removes it; as `PUT` |
//! | `GET /scan?start=&end=&limit=` | `[[key, value], ...]` (UTF-8, lossy), linearizable |
//! | `POST /cluster/init` `{"1": "127.0.0.1:21001", ...}` | makes these nodes the first cluster |
//! | `POST /cluster/learner` `{"id": 4, "addr": "..."}` | adds a learner, once caught up |
//! | `POST /cluster/members` `[1, 2, 3]` | changes the voters |
//! | `GET /cluster/metrics` | openraft's metrics of this node |
//! | `POST /raft/append`, `/raft/vote`, `/raft/snapshot` | between nodes |
//!
//! A write or read sent to a follower answers 421 with `{"leader_id": .., "leader_addr": ..}`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use openraft::error::{
    CheckIsLeaderError, ClientWriteError, ForwardToLeader, InstallSnapshotError, NetworkError,
    RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{NodeId, Request, StateMachine, TypeConfig};

/// The largest request body a node takes: a snapshot chunk as JSON, or a value.
pub const BODY_LIMIT: usize = 64 << 20;

/// A running node: its Raft instance and a reader of its state machine.
#[derive(Clone)]
pub struct Node {
    /// This node's id.
    pub id: NodeId,
    /// Its Raft instance.
    pub raft: Raft<TypeConfig>,
    /// Reads of the applied data (shares the pool with the state machine Raft drives).
    pub reader: StateMachine,
}

/// Milliseconds between a leader's heartbeats, by default (openraft's default).
pub const HEARTBEAT_MS: u64 = 50;

/// The range of a follower's random election timeout in milliseconds, by default
/// (openraft's default). openraft also gives a leader a lease of the range's top: a
/// follower that heard from a leader refuses votes until the lease has passed, and
/// stands for election only after the lease and its own timeout, so a leader's crash is
/// followed by a new leader after 450-600 ms of silence here.
pub const ELECTION_TIMEOUT_MS: (u64, u64) = (150, 300);

/// The Raft settings of a node: heartbeats every [`HEARTBEAT_MS`], elections after
/// [`ELECTION_TIMEOUT_MS`] (loopback and local clusters; a wide-area one wants more).
pub fn raft_config() -> openraft::Config {
    raft_config_with(HEARTBEAT_MS, ELECTION_TIMEOUT_MS)
}

/// [`raft_config`] with other timing: heartbeats every `heartbeat_ms`, election
/// timeouts drawn from `election_ms` (min, max). [`start_with`] refuses timing where
/// the heartbeat is not shorter than the least election timeout.
pub fn raft_config_with(heartbeat_ms: u64, election_ms: (u64, u64)) -> openraft::Config {
    openraft::Config {
        cluster_name: "logheap-kv".into(),
        heartbeat_interval: heartbeat_ms,
        election_timeout_min: election_ms.0,
        election_timeout_max: election_ms.1,
        ..Default::default()
    }
}

/// Starts node `id` on the storage in the pool at `pool` (created with `config` on first
/// use). Serve it with [`serve`].
pub async fn start(
    id: NodeId,
    pool: &std::path::Path,
    config: &logheap::Config,
) -> Result<Node, Box<dyn std::error::Error + Send + Sync>> {
    start_with(id, pool, config, raft_config()).await
}

/// [`start`] with other Raft settings (`raft`: timing, snapshot policy).
pub async fn start_with(
    id: NodeId,
    pool: &std::path::Path,
    config: &logheap::Config,
    raft: openraft::Config,
) -> Result<Node, Box<dyn std::error::Error + Send + Sync>> {
    let (log, state_machine) = crate::open(pool, config)?;
    let reader = state_machine.clone();
    let raft_config = Arc::new(raft.validate()?);
    let raft = Raft::new(id, raft_config, Network::default(), log, state_machine).await?;
    Ok(Node { id, raft, reader })
}

/// Serves `node` on `listener` until the task is dropped or the listener fails.
pub async fn serve(node: Node, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    axum::serve(listener, router(node)).await
}

/// [`serve`] until `stop` completes (requests in progress are finished).
pub async fn serve_until(
    node: Node,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(node))
        .with_graceful_shutdown(stop)
        .await
}

/// The node's HTTP routes.
pub fn router(node: Node) -> Router {
    Router::new()
        .route("/kv/{key}", get(kv_get).put(kv_put).delete(kv_delete))
        .route("/scan", get(scan))
        .route("/cluster/init", post(init))
        .route("/cluster/learner", post(add_learner))
        .route("/cluster/members", post(change_members))
        .route("/cluster/metrics", get(metrics))
        .route("/raft/append", post(raft_append))
        .route("/raft/vote", post(raft_vote))
        .route("/raft/snapshot", post(raft_snapshot))
        // A snapshot chunk (3 MiB of data by default) is about four times that as JSON,
        // over axum's 2 MiB default: refused, a follower behind the purged log could
        // never catch up (and two nodes of three, one of them lagging, never commit).
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(node)
}

/// Where the leader is, for a client that asked a follower (503 while no leader is
/// known, or the one known is this node, not established yet: its vote read back
/// after a restart, or an election under way).
fn forward(node: &Node, to: &ForwardToLeader<NodeId, BasicNode>) -> HttpResponse {
    if to.leader_id.is_none_or(|l| l == node.id) {
        return failure("no leader is established yet: try again");
    }
    let body = serde_json::json!({
        "leader_id": to.leader_id,
        "leader_addr": to.leader_node.as_ref().map(|n| n.addr.clone()),
    });
    (StatusCode::MISDIRECTED_REQUEST, Json(body)).into_response()
}

fn failure(e: impl std::fmt::Display) -> HttpResponse {
    (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
}

/// Confirms this node leads and has applied everything committed before the read.
async fn linearizable(node: &Node) -> Result<(), HttpResponse> {
    match node.raft.ensure_linearizable().await {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(to))) => {
            Err(forward(node, &to))
        }
        Err(e) => Err(failure(e)),
    }
}

async fn write(node: &Node, request: Request) -> HttpResponse {
    match node.raft.client_write(request).await {
        Ok(r) => Json(serde_json::json!({ "log_index": r.log_id.index })).into_response(),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(to))) => forward(node, &to),
        Err(e) => failure(e),
    }
}

async fn kv_get(State(node): State<Node>, Path(key): Path<String>) -> HttpResponse {
    if let Err(r) = linearizable(&node).await {
        return r;
    }
    match node.reader.get(key.as_bytes()) {
        Ok(Some(v)) => v.into_response(),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(e) => failure(e),
    }
}

async fn kv_put(State(node): State<Node>, Path(key): Path<String>, value: Bytes) -> HttpResponse {
    let request = Request::Put {
        key: key.into_bytes(),
        value: value.to_vec(),
    };
    write(&node, request).await
}

async fn kv_delete(State(node): State<Node>, Path(key): Path<String>) -> HttpResponse {
    write(
        &node,
        Request::Delete {
            key: key.into_bytes(),
        },
    )
    .await
}

/// A scan's bounds and size.
#[derive(Debug, serde::Deserialize)]
struct ScanQuery {
    #[serde(default)]
    start: String,
    end: Option<String>,
    limit: Option<usize>,
}

async fn scan(State(node): State<Node>, Query(q): Query<ScanQuery>) -> HttpResponse {
    if let Err(r) = linearizable(&node).await {
        return r;
    }
    let found = node.reader.scan(
        q.start.as_bytes(),
        q.end.as_deref().map(str::as_bytes),
        q.limit.unwrap_or(1000),
    );
    match found {
        Ok(pairs) => {
            let text: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(k).into(),
                        String::from_utf8_lossy(v).into(),
                    )
                })
                .collect();
            Json(text).into_response()
        }
        Err(e) => failure(e),
    }
}

async fn init(
    State(node): State<Node>,
    Json(nodes): Json<BTreeMap<NodeId, String>>,
) -> HttpResponse {
    let members: BTreeMap<NodeId, BasicNode> = nodes
        .into_iter()
        .map(|(id, addr)| (id, BasicNode { addr }))
        .collect();
    match node.raft.initialize(members).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => failure(e),
    }
}

/// A learner to add.
#[derive(Debug, serde::Deserialize)]
struct Learner {
    id: NodeId,
    addr: String,
}

async fn add_learner(State(node): State<Node>, Json(l): Json<Learner>) -> HttpResponse {
    match node
        .raft
        .add_learner(l.id, BasicNode { addr: l.addr }, true)
        .await
    {
        Ok(r) => Json(serde_json::json!({ "log_index": r.log_id.index })).into_response(),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(to))) => forward(&node, &to),
        Err(e) => failure(e),
    }
}

async fn change_members(State(node): State<Node>, Json(ids): Json<Vec<NodeId>>) -> HttpResponse {
    let ids: std::collections::BTreeSet<NodeId> = ids.into_iter().collect();
    match node.raft.change_membership(ids, false).await {
        Ok(r) => Json(serde_json::json!({ "log_index": r.log_id.index })).into_response(),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(to))) => forward(&node, &to),
        Err(e) => failure(e),
    }
}

async fn metrics(State(node): State<Node>) -> HttpResponse {
    let m = node.raft.metrics().borrow().clone();
    Json(m).into_response()
}

async fn raft_append(
    State(node): State<Node>,
    Json(req): Json<AppendEntriesRequest<TypeConfig>>,
) -> Json<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>> {
    Json(node.raft.append_entries(req).await)
}

async fn raft_vote(
    State(node): State<Node>,
    Json(req): Json<VoteRequest<NodeId>>,
) -> Json<Result<VoteResponse<NodeId>, RaftError<NodeId>>> {
    Json(node.raft.vote(req).await)
}

async fn raft_snapshot(
    State(node): State<Node>,
    Json(req): Json<InstallSnapshotRequest<TypeConfig>>,
) -> Json<Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>> {
    Json(node.raft.install_snapshot(req).await)
}

/// Connections to the other nodes, over HTTP (one pooled client for all).
#[derive(Clone, Default)]
pub struct Network {
    client: reqwest::Client,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Connection {
        Connection {
            client: self.client.clone(),
            target,
            addr: node.addr.clone(),
        }
    }
}

/// A connection to one node.
pub struct Connection {
    client: reqwest::Client,
    target: NodeId,
    addr: String,
}

impl Connection {
    async fn send<Req, Resp, Err>(
        &self,
        route: &str,
        req: Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, Err>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        Err: std::error::Error + DeserializeOwned,
    {
        let url = format!("http://{}/raft/{route}", self.addr);
        let sent = self
            .client
            .post(url)
            .timeout(option.hard_ttl())
            .json(&req)
            .send()
            .await
            .map_err(|e| match e.is_connect() {
                // Not retried at once.
                true => RPCError::Unreachable(Unreachable::new(&e)),
                false => RPCError::Network(NetworkError::new(&e)),
            })?;
        let answer: Result<Resp, Err> = sent
            .json()
            .await
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        req: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.send("append", req, &option).await
    }

    async fn install_snapshot(
        &mut self,
        req: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.send("snapshot", req, &option).await
    }

    async fn vote(
        &mut self,
        req: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.send("vote", req, &option).await
    }
}
