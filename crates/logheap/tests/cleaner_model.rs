//! A model test of the log cleaner: random updates, allocations and frees across crash
//! and clean reopens in a small pool. In a file of its own (a process of its own): run
//! in one process with `tests/cleaner.rs`'s crash-image test it fails with `PoolFull`
//! (an interaction through process-wide state, most likely crossbeam-epoch grace
//! periods of reclaimed chunks; see issue 10).

use logheap::{Config, PPtr, Pool};

fn small(kib: u64) -> Config {
    Config::default()
        .size(kib << 10)
        .chunk_size(4 << 10)
        .recovery_threads(1)
}

/// A model test: random updates, allocations and frees of objects of random sizes in a
/// 256 KiB pool, with a crash reopen or a clean reopen every 4,000 transactions,
/// compared with a model after every reopen and at the end. Updates write over ten
/// times the pool's size; allocations and frees are rarer (their records stay in the
/// allocation and deallocation logs, which are not cleaned yet: issue 10).
#[test]
fn random_updates_allocations_and_frees_across_reopens_match_a_model() {
    use rand::{Rng, SeedableRng};
    const SLOTS: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let config = small(256);
    let mut pool = Pool::create(&path, &config).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let mut model: Vec<Option<(u64, Vec<u8>)>> = vec![None; SLOTS];
    let check = |pool: &Pool, model: &[Option<(u64, Vec<u8>)>]| {
        let mut allocations = 0;
        for (slot, m) in model.iter().enumerate() {
            if let Some((home, data)) = m {
                allocations += 1;
                let mut buf = vec![0u8; data.len()];
                pool.read(|tx| tx.read_bytes(*home, &mut buf)).unwrap();
                assert_eq!(&buf, data, "slot {slot}");
            }
        }
        assert_eq!(pool.allocations().len(), allocations, "allocations");
    };
    let mut written = 0u64;
    let mut cleaned = 0;
    for i in 0..80_000u64 {
        let slot = rng.random_range(0..SLOTS);
        let churn = rng.random_ratio(1, 60);
        match model[slot].clone() {
            None => {
                let len = rng.random_range(16..=256usize);
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let home = pool
                    .transaction(|tx| {
                        let home = tx.alloc_bytes(len as u64)?;
                        tx.write_bytes(home, &data)?;
                        Ok::<_, logheap::Error>(home)
                    })
                    .unwrap();
                written += len as u64;
                model[slot] = Some((home, data));
            }
            Some((home, _)) if churn => {
                pool.transaction(|tx| tx.free(PPtr::<u8>::from_offset(home)))
                    .unwrap();
                model[slot] = None;
            }
            Some((home, mut data)) => {
                let at = if rng.random() {
                    0
                } else {
                    rng.random_range(0..data.len())
                };
                let len = rng.random_range(1..=data.len() - at);
                let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                pool.transaction(|tx| tx.write_bytes(home + at as u64, &bytes))
                    .unwrap();
                data[at..at + len].copy_from_slice(&bytes);
                written += len as u64;
                model[slot] = Some((home, data));
            }
        }
        if i % 4_000 == 3_999 {
            cleaned += pool.stats().log.chunks_cleaned;
            if (i / 4_000) % 2 == 0 {
                drop(pool); // crash
            } else {
                pool.close().unwrap();
            }
            pool = Pool::open(&path).unwrap();
            check(&pool, &model);
        }
    }
    check(&pool, &model);
    cleaned += pool.stats().log.chunks_cleaned;
    assert!(cleaned > 100, "the cleaner reclaimed only {cleaned} chunks");
    assert!(
        written > 10 * (256 << 10),
        "only {written} bytes written: not many times the pool"
    );
}
