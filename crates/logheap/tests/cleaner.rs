//! The log cleaner: a log-structured pool runs for many times its size.

use logheap::{Config, Pool, PPtr};

fn small(kib: u64) -> Config {
    Config::default()
        .size(kib << 10)
        .chunk_size(4 << 10)
        .recovery_threads(1)
}

fn rewrite(pool: &Pool, obj: PPtr<[u8; 128]>, n: u64) {
    for i in 0..n {
        let mut v = [0u8; 128];
        v[..8].copy_from_slice(&i.to_le_bytes());
        v[120..].copy_from_slice(&i.to_le_bytes());
        pool.transaction(|tx| tx.write(obj, &v)).unwrap();
    }
}

fn value(pool: &Pool, obj: PPtr<[u8; 128]>) -> u64 {
    let v = pool.read(|tx| tx.read(obj)).unwrap();
    let a = u64::from_le_bytes(v[..8].try_into().unwrap());
    let b = u64::from_le_bytes(v[120..].try_into().unwrap());
    assert_eq!(a, b, "torn object");
    a
}

/// One 128-byte object rewritten 50,000 times in a 512 KiB pool (about 12 MiB of log
/// writes): without the cleaner this fails with `PoolFull` after about 3,000.
#[test]
fn rewriting_one_object_runs_far_beyond_the_pool_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let pool = Pool::create(&path, &small(512)).unwrap();
    let obj: PPtr<[u8; 128]> = pool.transaction(|tx| tx.alloc([0u8; 128])).unwrap();
    rewrite(&pool, obj, 50_000);
    let stats = pool.stats();
    let cleaned = stats.log.chunks_cleaned;
    assert!(cleaned > 100, "the cleaner reclaimed only {cleaned} chunks");
    assert_eq!(value(&pool, obj), 49_999);
    pool.close().unwrap();
    // Clean reopen: the close record and the snapshot fingerprint must match.
    let pool = Pool::open(&path).unwrap();
    let report = pool.stats().log.recovery;
    assert_eq!(report.snapshot, logheap::SnapshotUse::Loaded);
    assert_eq!(value(&pool, obj), 49_999);
    rewrite(&pool, obj, 20_000);
    assert_eq!(value(&pool, obj), 19_999);
    // Crash: drop without close.
    drop(pool);
    let pool = Pool::open(&path).unwrap();
    assert_eq!(value(&pool, obj), 19_999);
    rewrite(&pool, obj, 5_000);
    assert_eq!(value(&pool, obj), 4_999);
    pool.close().unwrap();
    let pool = Pool::open(&path).unwrap();
    assert_eq!(value(&pool, obj), 4_999);
}
