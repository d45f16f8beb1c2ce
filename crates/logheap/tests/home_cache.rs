//! The log engine's DRAM home cache: reads through it see exactly what reads through
//! the mapping see, under evictions, frees, reallocation, concurrent commits and a
//! reopen.

use logheap::{Config, EngineStats, LogEngineStats, LogOptions, PPtr, Pool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A log-engine pool on the crash-simulation media with a home cache of `pages` pages
/// (0: none).
fn pool(pages: u64) -> Pool {
    let options = LogOptions::default()
        .chunk_size(4096)
        .home_cache(pages * 4096);
    Pool::create_sim(
        &Config::default().size(8 << 20).engine(options),
        Default::default(),
    )
    .unwrap()
}

fn log_stats(pool: &Pool) -> LogEngineStats {
    match pool.stats().engine_stats {
        EngineStats::Log(s) => *s,
        other => panic!("not a log pool: {other:?}"),
    }
}

/// One step of the random workload: allocate, write part of, free, or read an object.
#[derive(Debug, Clone, Copy)]
enum Step {
    Alloc(u64),
    Write {
        obj: usize,
        at: u64,
        len: u64,
        byte: u8,
    },
    Free(usize),
    Read(usize),
}

fn steps(seed: u64, n: usize) -> Vec<Step> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| match rng.random_range(0..10) {
            0..=2 => Step::Alloc(rng.random_range(1..3000)),
            3..=5 => Step::Write {
                obj: rng.random_range(0..64),
                at: rng.random_range(0..3000),
                len: rng.random_range(1..600),
                byte: rng.random(),
            },
            6 => Step::Free(rng.random_range(0..64)),
            _ => Step::Read(rng.random_range(0..64)),
        })
        .collect()
}

/// Runs `steps` (a transaction each) and returns every read's bytes and, at the end,
/// every live object's bytes.
fn run(pool: &Pool, steps: &[Step]) -> Vec<Vec<u8>> {
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut seen = Vec::new();
    for &step in steps {
        match step {
            Step::Alloc(size) => {
                let home = pool.transaction(|tx| tx.alloc_bytes(size)).unwrap();
                live.push((home, size));
            }
            Step::Write { obj, at, len, byte } if !live.is_empty() => {
                let (home, size) = live[obj % live.len()];
                let at = at % size;
                let len = len.min(size - at);
                pool.transaction(|tx| tx.write_bytes(home + at, &vec![byte; len as usize]))
                    .unwrap();
            }
            Step::Free(obj) if !live.is_empty() => {
                let (home, _) = live.swap_remove(obj % live.len());
                pool.transaction(|tx| tx.free(PPtr::<u8>::from_offset(home)))
                    .unwrap();
            }
            Step::Read(obj) if !live.is_empty() => {
                let (home, size) = live[obj % live.len()];
                let mut buf = vec![0; size as usize];
                pool.read(|tx| tx.read_bytes(home, &mut buf)).unwrap();
                seen.push(buf);
            }
            _ => {}
        }
    }
    for &(home, size) in &live {
        let mut buf = vec![0; size as usize];
        pool.read(|tx| tx.read_bytes(home, &mut buf)).unwrap();
        seen.push(buf);
    }
    seen
}

#[test]
fn reads_through_a_small_cache_see_what_reads_through_the_mapping_see() {
    for seed in 0..4 {
        let steps = steps(seed, 600);
        let uncached = run(&pool(0), &steps);
        for pages in [1, 3, 1 << 10] {
            let pool = pool(pages);
            assert_eq!(run(&pool, &steps), uncached, "seed {seed}, {pages} pages");
            let s = log_stats(&pool);
            assert!(
                s.home_cache_pages <= pages && s.home_cache_fills > 0,
                "{s:?}"
            );
            if pages < 4 {
                assert!(s.home_cache_evictions > 0, "{s:?}");
            }
        }
        let s = log_stats(&pool(0));
        assert_eq!((s.home_cache_pages, s.home_cache_fills), (0, 0));
    }
}

#[test]
fn a_freed_and_reallocated_block_reads_as_zeros_through_the_cache() {
    let pool = pool(16);
    let a = pool.transaction(|tx| tx.alloc([7u8; 512])).unwrap();
    assert_eq!(pool.read(|tx| tx.read(a)).unwrap(), [7; 512]);
    pool.transaction(|tx| tx.free(a)).unwrap();
    // Unmapped, the freed bytes read as zeros (as they do without a cache).
    assert_eq!(pool.read(|tx| tx.read(a)).unwrap(), [0; 512]);
    // The space comes back in a later allocation: zero-filled, not the old bytes.
    let mut found_reuse = false;
    for _ in 0..64 {
        let b = pool
            .transaction(|tx| tx.alloc_zeroed::<[u8; 512]>())
            .unwrap();
        assert_eq!(pool.read(|tx| tx.read(b)).unwrap(), [0; 512]);
        found_reuse |= b.offset() == a.offset();
    }
    assert!(found_reuse, "the freed block was never allocated again");
}

/// Accounts spread over many pages; transfers move money, audits sum it.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Account {
    balance: u64,
    pad: [u64; 63],
}

#[test]
fn concurrent_transfers_and_audits_through_an_evicting_cache_keep_the_sum() {
    const ACCOUNTS: usize = 48;
    const START: u64 = 1000;
    let pool = pool(3);
    let accounts: Vec<PPtr<Account>> = (0..ACCOUNTS)
        .map(|_| {
            pool.transaction(|tx| {
                tx.alloc(Account {
                    balance: START,
                    pad: [0; 63],
                })
            })
            .unwrap()
        })
        .collect();
    let balance = |a: PPtr<Account>| logheap::pfield!(a, Account, balance);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (pool, accounts) = (&pool, &accounts);
            s.spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(t);
                for _ in 0..1500 {
                    let from = accounts[rng.random_range(0..ACCOUNTS)];
                    let to = accounts[rng.random_range(0..ACCOUNTS)];
                    let amount = rng.random_range(0..10);
                    pool.transaction(|tx| {
                        let f = tx.read(balance(from))?;
                        if f < amount {
                            return Ok(());
                        }
                        tx.write(balance(from), &(f - amount))?;
                        let g = tx.read(balance(to))?;
                        tx.write(balance(to), &(g + amount))
                    })
                    .unwrap();
                }
            });
        }
        let (pool, accounts) = (&pool, &accounts);
        s.spawn(move || {
            for _ in 0..300 {
                let sum = pool
                    .read(|tx| {
                        accounts
                            .iter()
                            .map(|&a| tx.read(balance(a)))
                            .sum::<logheap::Result<u64>>()
                    })
                    .unwrap();
                assert_eq!(sum, START * ACCOUNTS as u64, "an audit saw a torn state");
            }
        });
    });
    let s = log_stats(&pool);
    assert!(s.home_cache_evictions > 0, "{s:?}");
    let total: u64 = pool
        .read(|tx| accounts.iter().map(|&a| tx.read(balance(a))).sum())
        .unwrap();
    assert_eq!(total, START * ACCOUNTS as u64);
}
