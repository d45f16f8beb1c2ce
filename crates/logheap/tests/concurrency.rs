//! Transactions from several threads with real contention: no update is lost and no
//! reader ever sees a torn state.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use logheap::{
    Config, EngineConfig, EngineKind, Error, MappingConfig, PPtr, Pool, RedoOptions, UndoOptions,
    pfield,
};

/// Every engine, the log engine with each mapping configuration, and in-place engines
/// with data checksums.
fn configs() -> Vec<Config> {
    let mut configs: Vec<Config> = MappingConfig::NAMED
        .iter()
        .map(|&(_, mapping)| Config::default().mapping(mapping))
        .collect();
    configs.push(Config::default().engine(EngineKind::Redo));
    configs.push(Config::default().engine(EngineKind::Undo));
    configs.push(Config::default().engine(EngineKind::Oop));
    configs.push(Config::default().engine(EngineKind::Hoop));
    configs.push(Config::default().engine(EngineKind::Redo).fast_log(true));
    configs.push(Config::default().engine(EngineKind::Undo).fast_log(true));
    configs.push(Config::default().engine("undo-nt".parse::<EngineConfig>().unwrap()));
    // Data checksums: every read checks its lines while other threads commit.
    for kind in [EngineKind::Redo, EngineKind::Undo, EngineKind::Oop] {
        configs.push(Config::default().engine(kind).data_checksums(true));
    }
    configs
}

fn pool(config: Config) -> (tempfile::TempDir, Pool) {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path().join("c.pool"), &config.size(32 << 20)).unwrap();
    (dir, pool)
}

#[test]
fn shared_counter_loses_no_increment() {
    for config in configs() {
        let (dir, pool) = pool(config);
        let counter: PPtr<u64> = pool.root().unwrap();
        let threads = 4;
        let per_thread = 1000;
        let before = pool.media().counters();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..per_thread {
                        pool.transaction(|tx| {
                            let n = tx.read(counter)?;
                            tx.write(counter, &(n + 1))
                        })
                        .unwrap();
                    }
                });
            }
        });
        assert_eq!(
            pool.read(|tx| tx.read(counter)).unwrap(),
            threads * per_thread
        );
        let c = pool.media().counters().since(&before);
        assert_eq!(c.write_transactions, threads * per_thread);
        let txs = threads * per_thread;
        let fast_log = matches!(
            config.engine,
            EngineConfig::Redo(RedoOptions { fast_log: true })
                | EngineConfig::Undo(UndoOptions { fast_log: true, .. })
        );
        match config.engine.kind() {
            // 001's fast log: redo commits with no fence (truncations fence, and each
            // thread's first commit allocates its log area); undo with one.
            EngineKind::Redo if fast_log => assert!(
                c.fences < txs / 10,
                "{} fences for {txs} transactions",
                c.fences
            ),
            EngineKind::Undo if fast_log => assert!(
                (txs..txs + 64).contains(&c.fences),
                "{} fences for {txs} transactions",
                c.fences
            ),
            // One fence per committed write transaction (redo: plus two per
            // truncation, once per log-full of records).
            EngineKind::Log => assert_eq!(c.fences, txs, "one fence per transaction"),
            // hoop: plus two per collection.
            EngineKind::Redo | EngineKind::Hoop => assert!(
                (txs..txs + txs / 10).contains(&c.fences),
                "{} fences for {txs} transactions",
                c.fences
            ),
            // Copies out of place, commit word (and a few, once, for slot chunks).
            EngineKind::Oop => assert!(
                (2 * txs..2 * txs + 64).contains(&c.fences),
                "{} fences for {txs} transactions",
                c.fences
            ),
            // Undo log, in place, invalidation (and a few, once, for the allocation of
            // each thread's log area).
            _ => assert!(
                (3 * txs..3 * txs + 64).contains(&c.fences),
                "{} fences for {txs} transactions",
                c.fences
            ),
        }
        // The clean-close record counts what every thread appended: the pool reopens.
        pool.close().unwrap();
        let pool = Pool::open_with(dir.path().join("c.pool"), &config).unwrap();
        assert!(pool.was_clean());
        if let Some(log) = pool.stats().log().cloned() {
            assert_eq!(log.recovery.transactions, threads * per_thread);
        }
        assert_eq!(
            pool.read(|tx| tx.read(counter)).unwrap(),
            threads * per_thread
        );
    }
}

const ACCOUNTS: usize = 32;
const INITIAL: u64 = 1000;

#[test]
fn transfers_keep_the_total_and_readers_never_see_a_torn_state() {
    for config in configs() {
        let (_dir, pool) = pool(config);
        let accounts: PPtr<[u64; ACCOUNTS]> = pool.root().unwrap();
        pool.transaction(|tx| tx.write(accounts, &[INITIAL; ACCOUNTS]))
            .unwrap();
        let account = |i: usize| PPtr::<u64>::from_offset(accounts.offset() + 8 * i as u64);
        let done = AtomicBool::new(false);
        let writers_finished = AtomicUsize::new(0);
        let snapshots = std::thread::scope(|s| {
            for t in 0..3u64 {
                let pool = &pool;
                let writers_finished = &writers_finished;
                s.spawn(move || {
                    let mut x = t * 7919 + 1;
                    for _ in 0..2000 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let from = (x >> 33) as usize % ACCOUNTS;
                        let to = (x >> 17) as usize % ACCOUNTS;
                        let amount = (x >> 50) % 50;
                        pool.transaction(|tx| {
                            let a = tx.read(account(from))?;
                            if a < amount || from == to {
                                return Ok(());
                            }
                            let b = tx.read(account(to))?;
                            tx.write(account(from), &(a - amount))?;
                            tx.write(account(to), &(b + amount))
                        })
                        .unwrap();
                    }
                    writers_finished.fetch_add(1, Ordering::Relaxed);
                });
            }
            let reader = s.spawn(|| {
                let mut checked = 0u64;
                while !done.load(Ordering::Relaxed) || checked < 10 {
                    // Read accounts one at a time: the snapshot must hold across reads.
                    let total = pool
                        .read(|tx| {
                            (0..ACCOUNTS)
                                .map(|i| tx.read(account(i)))
                                .sum::<Result<u64, Error>>()
                        })
                        .unwrap();
                    assert_eq!(
                        total,
                        INITIAL * ACCOUNTS as u64,
                        "a reader saw a torn state"
                    );
                    checked += 1;
                }
                checked
            });
            while writers_finished.load(Ordering::Relaxed) < 3 {
                std::thread::yield_now();
            }
            done.store(true, Ordering::Relaxed);
            reader.join().unwrap()
        });
        assert!(snapshots >= 10);
        let all = pool.read(|tx| tx.read(accounts)).unwrap();
        assert_eq!(all.iter().sum::<u64>(), INITIAL * ACCOUNTS as u64);
    }
}

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Node {
    key: u64,
    next: PPtr<Node>,
}

#[test]
fn concurrent_inserts_into_one_list_lose_none() {
    for config in configs() {
        let (_dir, pool) = pool(config);
        let head: PPtr<PPtr<Node>> = pool.root().unwrap();
        let per_thread = 300u64;
        std::thread::scope(|s| {
            for t in 0..3u64 {
                let pool = &pool;
                s.spawn(move || {
                    for i in 0..per_thread {
                        pool.transaction(|tx| {
                            let old = tx.read(head)?;
                            let n = tx.alloc(Node {
                                key: t * 1_000_000 + i,
                                next: old,
                            })?;
                            tx.write(head, &n)
                        })
                        .unwrap();
                    }
                });
            }
        });
        let keys = pool
            .read(|tx| {
                let mut keys = Vec::new();
                let mut p = tx.read(head)?;
                while !p.is_null() {
                    keys.push(tx.read(pfield!(p, Node, key))?);
                    p = tx.read(pfield!(p, Node, next))?;
                }
                Ok::<_, Error>(keys)
            })
            .unwrap();
        assert_eq!(keys.len() as u64, 3 * per_thread);
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "every node once");
        assert_eq!(
            pool.allocations().len(),
            keys.len(),
            "no leaked allocation from retries"
        );
    }
}

/// A transaction that read x, then finds y changed by a commit that also changed x,
/// cannot extend its snapshot: it must restart rather than see the old x with the new y.
/// The interleaving is forced (no timing), so this runs the same way every time.
#[test]
fn a_snapshot_is_extended_only_while_what_it_read_is_unchanged() {
    use std::sync::Barrier;
    let (_dir, pool) = pool(Config::default());
    // Two words in different 64-byte stripes: different locks.
    let x: PPtr<u64> = pool.root().unwrap();
    let y = PPtr::<u64>::from_offset(x.offset() + 128);
    let (read_x, committed) = (Barrier::new(2), Barrier::new(2));
    let mut attempts = 0;
    let seen = std::thread::scope(|s| {
        s.spawn(|| {
            read_x.wait();
            pool.transaction(|tx| {
                tx.write(x, &1)?;
                tx.write(y, &1)
            })
            .unwrap();
            committed.wait();
        });
        pool.read(|tx| {
            attempts += 1;
            let a = tx.read(x)?;
            if attempts == 1 {
                read_x.wait();
                committed.wait();
            }
            let b = tx.read(y)?;
            Ok::<_, Error>((a, b))
        })
        .unwrap()
    });
    assert_eq!(seen, (1, 1), "a torn snapshot");
    assert_eq!(attempts, 2, "the first attempt had to restart");
}
