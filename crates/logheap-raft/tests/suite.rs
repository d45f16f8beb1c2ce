//! openraft's own storage test suite on logheap storage, and what survives a crash.

use logheap_raft::{LogStore, NodeId, Request, StateMachine, TypeConfig};
use openraft::StorageError;
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{Entry, EntryPayload, LogId, RaftLogReader, Vote};
use tempfile::TempDir;

fn config() -> logheap::Config {
    logheap::Config::default().size(16 << 20)
}

/// Each store of the suite in a pool of its own, in a directory removed after.
struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (log, sm) =
            logheap_raft::open(dir.path().join("node.pool"), &config()).expect("a new pool opens");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    if let Err(e) = Suite::test_all(Builder) {
        panic!("openraft's storage suite failed: {e}");
    }
}

fn entry(term: u64, index: u64, request: Request) -> Entry<TypeConfig> {
    Entry {
        log_id: openraft::testing::log_id(term, 1, index),
        payload: EntryPayload::Normal(request),
    }
}

fn put(key: &str, value: &str) -> Request {
    Request::Put {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

/// The log, the vote and the state machine are in the pool when `append_entries`,
/// `save_vote` and `apply` return: a copy of the pool file taken while the node runs
/// (as a crash leaves it: no clean close) opens with them, and so does the pool after
/// its clean close; the applied data answers reads.
#[tokio::test(flavor = "current_thread")]
async fn what_was_stored_survives_a_crash_and_a_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.pool");
    let crashed = dir.path().join("crashed.pool");
    let entries: Vec<_> = (1..=5)
        .map(|i| entry(1, i, put(&format!("k{i}"), &format!("v{i}"))))
        .collect();
    {
        let (mut log, mut sm) = logheap_raft::open(&path, &config()).unwrap();
        log.append_entries(entries.clone()).unwrap();
        log.save_vote(&Vote::new(2, 1)).await.unwrap();
        let responses = sm.apply(entries[..3].to_vec()).await.unwrap();
        assert_eq!(responses.len(), 3);
        assert!(responses.iter().all(|r| r.previous.is_none()));
        let again = sm
            .apply(vec![entry(1, 6, put("k1", "again"))])
            .await
            .unwrap();
        assert_eq!(again[0].previous.as_deref(), Some(&b"v1"[..]));
        std::fs::copy(&path, &crashed).unwrap();
    }
    for pool in [&crashed, &path] {
        let (mut log, mut sm) = logheap_raft::open(pool, &config()).unwrap();
        let found = log.try_get_log_entries(1..=5).await.unwrap();
        assert_eq!(found, entries, "{}", pool.display());
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(2, 1)));
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(
            applied,
            Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), 6))
        );
        assert_eq!(sm.get(b"k1").unwrap().as_deref(), Some(&b"again"[..]));
        assert_eq!(sm.get(b"k3").unwrap().as_deref(), Some(&b"v3"[..]));
        assert_eq!(sm.get(b"k4").unwrap(), None, "entry 4 was never applied");
        assert_eq!(sm.scan(b"k", None, 10).unwrap().len(), 3);
    }
}

/// A snapshot built on one node installs on another, replacing what it had, and a
/// snapshot that does not decode is refused and changes nothing.
#[tokio::test(flavor = "current_thread")]
async fn a_snapshot_replaces_the_data_of_the_node_that_installs_it() {
    use openraft::RaftSnapshotBuilder;
    let dir = tempfile::tempdir().unwrap();
    let (_, mut leader) = logheap_raft::open(dir.path().join("a.pool"), &config()).unwrap();
    let (_, mut follower) = logheap_raft::open(dir.path().join("b.pool"), &config()).unwrap();
    leader
        .apply((1..=50).map(|i| entry(1, i, put(&format!("key{i:03}"), &"x".repeat(i as usize)))))
        .await
        .unwrap();
    follower
        .apply(vec![entry(1, 1, put("stale", "gone after the install"))])
        .await
        .unwrap();
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let data = snapshot.snapshot.get_ref().clone();

    let mut bad = data.clone();
    bad.truncate(bad.len() - 1);
    let refused = follower
        .install_snapshot(&snapshot.meta, Box::new(std::io::Cursor::new(bad)))
        .await;
    assert!(refused.is_err());
    assert!(
        follower.get(b"stale").unwrap().is_some(),
        "a refused snapshot changed data"
    );

    follower
        .install_snapshot(&snapshot.meta, Box::new(std::io::Cursor::new(data)))
        .await
        .unwrap();
    assert_eq!(follower.get(b"stale").unwrap(), None);
    assert_eq!(
        follower.scan(b"", None, 1000).unwrap(),
        leader.scan(b"", None, 1000).unwrap()
    );
    assert_eq!(follower.last_applied(), leader.last_applied());
    let current = follower.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, snapshot.meta);
}
