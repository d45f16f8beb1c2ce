//! The log cleaner: a log-structured pool runs for many times its size.

use logheap::{Config, PPtr, Pool};

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
    let stats = pool.stats().log().cloned().unwrap();
    let cleaned = stats.chunks_cleaned;
    assert!(cleaned > 100, "the cleaner reclaimed only {cleaned} chunks");
    assert_eq!(value(&pool, obj), 49_999);
    pool.close().unwrap();
    // Clean reopen: the close record and the snapshot fingerprint must match.
    let pool = Pool::open(&path).unwrap();
    let report = pool.stats().log().cloned().unwrap().recovery;
    assert_eq!(report.snapshot, logheap::SnapshotUse::Loaded);
    assert_eq!(value(&pool, obj), 49_999);
    rewrite(&pool, obj, 20_000);
    assert_eq!(value(&pool, obj), 19_999);
    // Crash: drop without close.
    pool.abandon();
    let pool = Pool::open(&path).unwrap();
    assert_eq!(value(&pool, obj), 19_999);
    rewrite(&pool, obj, 5_000);
    assert_eq!(value(&pool, obj), 4_999);
    pool.close().unwrap();
    let pool = Pool::open(&path).unwrap();
    assert_eq!(value(&pool, obj), 4_999);
}

/// Objects the crash and model tests rewrite.
const OBJECTS: usize = 6;

fn state(pool: &Pool, objs: &[PPtr<[u8; 128]>]) -> Vec<u64> {
    objs.iter().map(|&o| value(pool, o)).collect()
}

/// Crash images at every fence of transactions that run while the cleaner cleans (the
/// pool is full of stale data, so committers clean inline): every image opens, holds a
/// state the transactions went through, and goes on running and reopening.
#[test]
fn crash_images_while_cleaning_hold_states_the_model_went_through() {
    crash_images_while_cleaning(small(96));
}

/// The same with two background cleaner threads and no inline cleaning: their passes'
/// fences come at any moment between the committer's.
#[test]
fn crash_images_while_background_threads_clean_hold_states_the_model_went_through() {
    crash_images_while_cleaning(small(96).cleaner_threads(2).inline_cleaning(false));
}

fn crash_images_while_cleaning(config: Config) {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    let sim_config = logheap::media::SimConfig {
        max_images_per_fence: 3,
        ..Default::default()
    };
    let pool = Pool::create_sim(&config, sim_config).unwrap();
    let objs: Vec<PPtr<[u8; 128]>> = (0..OBJECTS)
        .map(|_| pool.transaction(|tx| tx.alloc([0u8; 128])).unwrap())
        .collect();
    let mut model = vec![0u64; OBJECTS];
    let mut seen: HashSet<Vec<u64>> = HashSet::new();
    let mut i = 0u64;
    let mut step = |pool: &Pool, model: &mut Vec<u64>| {
        i += 1;
        let k = (i as usize * 7 + i as usize / 5) % OBJECTS;
        rewrite_one(pool, objs[k], i);
        model[k] = i;
    };
    for _ in 0..4_000 {
        step(&pool, &mut model);
    }
    let before = pool.stats().log().cloned().unwrap().chunks_cleaned;
    assert!(before > 0, "the warm-up did not make the cleaner run");
    seen.insert(model.clone());
    let images = Arc::new(Mutex::new(Vec::new()));
    let sink = images.clone();
    let sim = pool.media().crash_simulator().unwrap();
    sim.set_fence_hook(Box::new(move |p| sink.lock().unwrap().extend(p.images())));
    // At least 250 transactions, and on until chunks were cleaned meanwhile (background
    // cleaners clean when their thread runs).
    for n in 0..5_000 {
        step(&pool, &mut model);
        seen.insert(model.clone());
        if n >= 250 && pool.stats().log().cloned().unwrap().chunks_cleaned > before {
            break;
        }
    }
    sim.take_fence_hook();
    let cleaned = pool.stats().log().cloned().unwrap().chunks_cleaned - before;
    assert!(cleaned > 0, "nothing was cleaned while images were taken");
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert!(images.len() > 250, "only {} images", images.len());
    for (n, image) in images.into_iter().enumerate() {
        let p = Pool::open_image(image, &config, Default::default())
            .unwrap_or_else(|e| panic!("image {n} does not open: {e}"));
        let s = state(&p, &objs);
        assert!(
            seen.contains(&s),
            "image {n} holds {s:?}, a state never committed"
        );
        if n % 25 == 0 {
            // The recovered pool goes on, cleans, and reopens with its last values.
            for j in 0..1_500u64 {
                rewrite_one(&p, objs[j as usize % OBJECTS], 1_000_000 + j);
            }
            let persisted = p.media().crash_simulator().unwrap().persisted_image();
            p.abandon();
            let q = Pool::open_image(persisted, &config, Default::default()).unwrap();
            let s = state(&q, &objs);
            for (k, v) in s.iter().enumerate() {
                let last = (0..1_500u64)
                    .rev()
                    .find(|j| *j as usize % OBJECTS == k)
                    .unwrap();
                assert_eq!(*v, 1_000_000 + last, "image {n}, object {k}");
            }
        }
    }
}

fn rewrite_one(pool: &Pool, obj: PPtr<[u8; 128]>, i: u64) {
    let mut v = [0u8; 128];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v[120..].copy_from_slice(&i.to_le_bytes());
    pool.transaction(|tx| tx.write(obj, &v)).unwrap();
}

/// The figure: 3,000,000 rewrites of one 128-byte object in a 64 MiB pool (about
/// 500 MiB of log writes), then a clean reopen and a crash reopen. Run it in release:
/// `cargo test --release -p logheap --test cleaner -- --ignored`.
#[test]
#[ignore = "long: run in release"]
fn three_million_rewrites_in_a_64_mib_pool() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let config = Config::default().size(64 << 20);
    let pool = Pool::create(&path, &config).unwrap();
    let obj: PPtr<[u8; 128]> = pool.transaction(|tx| tx.alloc([0u8; 128])).unwrap();
    let started = std::time::Instant::now();
    rewrite(&pool, obj, 3_000_000);
    let stats = pool.stats().log().cloned().unwrap();
    eprintln!(
        "3M rewrites: {:?}; chunks cleaned {} (fast {}), bytes moved {}",
        started.elapsed(),
        stats.chunks_cleaned,
        stats.chunks_fast_cleaned,
        stats.cleaner_bytes_moved
    );
    assert!(stats.chunks_cleaned > 0);
    assert_eq!(value(&pool, obj), 2_999_999);
    // Crash: drop without close.
    pool.abandon();
    let started = std::time::Instant::now();
    let pool = Pool::open(&path).unwrap();
    eprintln!("crash reopen: {:?}", started.elapsed());
    assert_eq!(value(&pool, obj), 2_999_999);
    pool.close().unwrap();
    let started = std::time::Instant::now();
    let pool = Pool::open(&path).unwrap();
    eprintln!("clean reopen: {:?}", started.elapsed());
    assert_eq!(
        pool.stats().log().cloned().unwrap().recovery.snapshot,
        logheap::SnapshotUse::Loaded
    );
    assert_eq!(value(&pool, obj), 2_999_999);
    rewrite(&pool, obj, 100_000);
    pool.abandon();
    let pool = Pool::open(&path).unwrap();
    assert_eq!(value(&pool, obj), 99_999);
}

/// The second figure: 1,000,000 random updates of 100,000 objects of 128 B in a
/// pool twice the size of their payload (25.6 MB), then a crash reopen and a clean
/// reopen, every object checked against the last value written. Run it in release:
/// `cargo test --release -p logheap --test cleaner -- --ignored`.
#[test]
#[ignore = "long: run in release"]
fn a_million_random_updates_of_100k_objects_in_twice_their_payload() {
    use rand::{Rng, SeedableRng};
    const N: usize = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let config = Config::default().size(2 * N as u64 * 128);
    let pool = Pool::create(&path, &config).unwrap();
    let mut objs: Vec<PPtr<[u8; 128]>> = Vec::with_capacity(N);
    for start in (0..N).step_by(1_000) {
        let more: Vec<PPtr<[u8; 128]>> = pool
            .transaction(|tx| {
                (start..start + 1_000)
                    .map(|_| tx.alloc([0u8; 128]))
                    .collect()
            })
            .unwrap();
        objs.extend(more);
    }
    let mut model = vec![0u64; N];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(10);
    let started = std::time::Instant::now();
    for i in 1..=1_000_000u64 {
        let k = rng.random_range(0..N);
        rewrite_one(&pool, objs[k], i);
        model[k] = i;
    }
    let stats = pool.stats().log().cloned().unwrap();
    eprintln!(
        "1M random updates: {:?}; chunks cleaned {} (fast {}), bytes moved {}",
        started.elapsed(),
        stats.chunks_cleaned,
        stats.chunks_fast_cleaned,
        stats.cleaner_bytes_moved
    );
    assert!(stats.chunks_cleaned > 0);
    let check = |pool: &Pool| {
        for (k, &o) in objs.iter().enumerate() {
            assert_eq!(value(pool, o), model[k], "object {k}");
        }
    };
    check(&pool);
    // Crash: drop without close.
    pool.abandon();
    let started = std::time::Instant::now();
    let pool = Pool::open(&path).unwrap();
    eprintln!("crash reopen: {:?}", started.elapsed());
    check(&pool);
    pool.close().unwrap();
    let started = std::time::Instant::now();
    let pool = Pool::open(&path).unwrap();
    // The snapshot needs free chunks for 100,000 pieces and allocations; the log may not
    // leave that many free, and then the clean open replays the log instead.
    eprintln!(
        "clean reopen: {:?} (snapshot {:?})",
        started.elapsed(),
        pool.stats().log().cloned().unwrap().recovery.snapshot
    );
    assert!(pool.stats().log().cloned().unwrap().recovery.was_clean);
    check(&pool);
}

/// Objects of a model test: per slot, the object's home and its bytes.
type Model = Vec<Option<(u64, Vec<u8>)>>;

/// Checks that `pool` holds exactly the model's objects: each one's bytes, and no
/// other allocation.
fn check_model(pool: &Pool, model: &Model) {
    let mut expected = Vec::new();
    for (slot, (home, data)) in model
        .iter()
        .enumerate()
        .filter_map(|(k, m)| Some((k, m.as_ref()?)))
    {
        let mut buf = vec![0u8; data.len()];
        pool.read(|tx| tx.read_bytes(*home, &mut buf)).unwrap();
        assert_eq!(&buf, data, "slot {slot}");
        expected.push((*home, data.len() as u64));
    }
    expected.sort_unstable();
    assert_eq!(pool.allocations(), expected, "allocations");
}

/// Allocates an object holding `data` in one transaction, which also frees `free`
/// first when given; returns the new object's home.
fn put_object(pool: &Pool, free: Option<u64>, data: &[u8]) -> logheap::Result<u64> {
    pool.transaction(|tx| {
        if let Some(home) = free {
            tx.free(PPtr::<u8>::from_offset(home))?;
        }
        let home = tx.alloc_bytes(data.len() as u64)?;
        tx.write_bytes(home, data)?;
        Ok(home)
    })
}

/// A model test: random updates, allocations and frees of objects of random sizes in a
/// 256 KiB pool, with a crash reopen or a clean reopen every 4,000 transactions,
/// compared with a model after every reopen and at the end. Updates write over ten
/// times the pool's size; allocations and frees are rarer.
#[test]
fn random_updates_allocations_and_frees_across_reopens_match_a_model() {
    use rand::{Rng, SeedableRng};
    const SLOTS: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let config = small(256);
    let mut pool = Pool::create(&path, &config).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let mut model: Model = vec![None; SLOTS];
    let mut written = 0u64;
    let mut cleaned = 0;
    for i in 0..80_000u64 {
        let slot = rng.random_range(0..SLOTS);
        let churn = rng.random_ratio(1, 60);
        match model[slot].clone() {
            None => {
                let len = rng.random_range(16..=256usize);
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let home = put_object(&pool, None, &data).unwrap();
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
            cleaned += pool.stats().log().cloned().unwrap().chunks_cleaned;
            if (i / 4_000) % 2 == 0 {
                pool.abandon(); // crash
            } else {
                pool.close().unwrap();
            }
            pool = Pool::open(&path).unwrap();
            check_model(&pool, &model);
        }
    }
    check_model(&pool, &model);
    cleaned += pool.stats().log().cloned().unwrap().chunks_cleaned;
    assert!(cleaned > 100, "the cleaner reclaimed only {cleaned} chunks");
    assert!(
        written > 10 * (256 << 10),
        "only {written} bytes written: not many times the pool"
    );
}

/// The chunk headers in a pool image of 4 KiB chunks: (file offset, previous chunk
/// named, or `None`), and the file offset of chunk 0 (the one placement of chunk 0
/// under which the most named predecessors are headers).
fn chunk_headers(image: &[u8]) -> (Vec<(usize, Option<u32>)>, usize) {
    const CHUNK: usize = 4096;
    let headers: Vec<(usize, Option<u32>)> = (0..image.len() / CHUNK)
        .map(|k| k * CHUNK)
        .filter(|&at| &image[at..at + 4] == b"LHC1")
        .map(|at| {
            let prev = u32::from_le_bytes(image[at + 56..at + 60].try_into().unwrap());
            (at, (prev != u32::MAX).then_some(prev))
        })
        .collect();
    let first = headers.first().map_or(0, |h| h.0);
    let start = (0..=first / CHUNK)
        .map(|k| k * CHUNK)
        .max_by_key(|&start| {
            headers
                .iter()
                .filter_map(|h| h.1)
                .filter(|&p| headers.iter().any(|h| h.0 == start + p as usize * CHUNK))
                .count()
        })
        .unwrap();
    (headers, start)
}

/// After a crash of a pool the cleaner has been reclaiming chunks from, a chunk
/// header lost in the middle of a log (zeroed, or one byte changed) is still refused:
/// the cleaner keeps each log's chain of chunks contiguous, so no committed data can
/// vanish with it unnoticed.
#[test]
fn after_cleaning_and_a_crash_a_lost_chunk_header_in_a_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let pool = Pool::create(&path, &small(256)).unwrap();
    let objs: Vec<PPtr<[u8; 128]>> = (0..OBJECTS)
        .map(|_| pool.transaction(|tx| tx.alloc([0u8; 128])).unwrap())
        .collect();
    for i in 0..6_000u64 {
        rewrite_one(&pool, objs[(i * 7 % OBJECTS as u64) as usize], i);
    }
    let expected = state(&pool, &objs);
    assert!(pool.stats().log().cloned().unwrap().chunks_cleaned > 20);
    pool.abandon(); // crash
    let image = std::fs::read(&path).unwrap();
    let (headers, start) = chunk_headers(&image);
    let named: Vec<usize> = headers
        .iter()
        .filter(|h| {
            headers
                .iter()
                .any(|o| o.1.is_some_and(|p| start + p as usize * 4096 == h.0))
        })
        .map(|h| h.0)
        .collect();
    assert!(
        named.len() >= 8,
        "only {} chunks are another's predecessor",
        named.len()
    );
    let damaged = dir.path().join("damaged");
    let opens = |image: &[u8]| {
        std::fs::write(&damaged, image).unwrap();
        Pool::open(&damaged).map(|pool| state(&pool, &objs))
    };
    assert_eq!(opens(&image).unwrap(), expected);
    for &at in &named {
        let mut zeroed = image.clone();
        zeroed[at..at + 64].fill(0);
        assert!(
            opens(&zeroed).is_err(),
            "a zeroed header at {at:#x} was accepted"
        );
        let mut flipped = image.clone();
        flipped[at + 40] ^= 1;
        assert!(
            opens(&flipped).is_err(),
            "a changed header at {at:#x} was accepted"
        );
    }
}

/// Background cleaner threads alone (no inline cleaning) keep a pool running far
/// beyond its size, with several committing threads; the values survive a crash.
#[test]
fn background_cleaners_alone_keep_a_pool_running() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let config = small(512).cleaner_threads(2).inline_cleaning(false);
    let pool = Pool::create(&path, &config).unwrap();
    let objs: Vec<PPtr<[u8; 128]>> = (0..4)
        .map(|_| pool.transaction(|tx| tx.alloc([0u8; 128])).unwrap())
        .collect();
    std::thread::scope(|s| {
        for &obj in &objs {
            let pool = &pool;
            s.spawn(move || rewrite(pool, obj, 12_000));
        }
    });
    let stats = pool.stats().log().cloned().unwrap();
    assert!(
        stats.chunks_cleaned > 50,
        "the background cleaners reclaimed only {} chunks",
        stats.chunks_cleaned
    );
    for &obj in &objs {
        assert_eq!(value(&pool, obj), 11_999);
    }
    pool.abandon(); // crash
    let pool = Pool::open_with(&path, &config).unwrap();
    for &obj in &objs {
        assert_eq!(value(&pool, obj), 11_999);
    }
    pool.close().unwrap();
}

/// With neither inline cleaning nor background threads nothing is cleaned: the log
/// fills up and commits fail with `PoolFull` (the "no cleaning" setting).
#[test]
fn without_any_cleaner_the_log_fills_up() {
    let dir = tempfile::tempdir().unwrap();
    let config = small(256).inline_cleaning(false);
    let pool = Pool::create(dir.path().join("p"), &config).unwrap();
    let obj: PPtr<[u8; 128]> = pool.transaction(|tx| tx.alloc([0u8; 128])).unwrap();
    let mut failed = None;
    for i in 0..50_000u64 {
        let v = [i as u8; 128];
        if let Err(e) = pool.transaction(|tx| tx.write(obj, &v)) {
            failed = Some((i, e));
            break;
        }
    }
    let (i, e) = failed.expect("a 256 KiB log took 50,000 rewrites without a cleaner");
    assert!(matches!(e, logheap::Error::PoolFull), "{e}");
    assert!(i > 500, "full after only {i} rewrites");
    assert_eq!(pool.stats().log().cloned().unwrap().chunks_cleaned, 0);
}

/// Allocations and frees without end in a small pool: their records leave the log
/// through allocation checkpoints, and every crash and clean reopen finds the model's
/// objects (without checkpoints the allocation and deallocation logs fill the pool).
#[test]
fn allocation_churn_runs_far_beyond_the_pool_size_across_reopens() {
    use rand::{Rng, SeedableRng};
    const SLOTS: usize = 32;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let config = small(256);
    let mut pool = Pool::create(&path, &config).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let mut model: Model = vec![None; SLOTS];
    let mut checkpoints = 0;
    for i in 0..60_000u64 {
        let slot = rng.random_range(0..SLOTS);
        match model[slot].take() {
            Some((home, _)) => {
                pool.transaction(|tx| tx.free(PPtr::<u8>::from_offset(home)))
                    .unwrap();
            }
            None => {
                let len = rng.random_range(16..=200usize);
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let home = put_object(&pool, None, &data)
                    .unwrap_or_else(|e| panic!("transaction {i}: {e}"));
                model[slot] = Some((home, data));
            }
        }
        if i % 10_000 == 9_999 {
            checkpoints += pool.stats().log().cloned().unwrap().allocation_checkpoints;
            if (i / 10_000) % 2 == 0 {
                pool.abandon(); // crash
            } else {
                pool.close().unwrap();
                // `check` replays from the checkpoint as an open does (the data of
                // ranges whose free records folded into it is not live).
                let report = logheap::check::check(&path).unwrap();
                assert!(report.is_sound(), "{:?}", report.problems);
            }
            pool = Pool::open(&path).unwrap();
            check_model(&pool, &model);
        }
    }
    assert!(checkpoints > 5, "{checkpoints} allocation checkpoints");
}

/// Many live allocations churned in a pool with few free chunks: an allocation
/// checkpoint then needs more free chunks than the cleaner's reserve, and committers
/// leave them free (cleaning instead) until it fits, rather than filling the pool with
/// allocation and free records that nothing can fold.
#[test]
fn a_large_checkpoint_gets_its_chunks_in_a_nearly_full_pool() {
    use rand::{Rng, SeedableRng};
    const LIVE: usize = 6_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let mut pool = Pool::create(&path, &small(1024)).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let mut model: Model = Vec::with_capacity(LIVE);
    let alloc = |pool: &Pool, rng: &mut rand_chacha::ChaCha8Rng, free: Option<u64>| {
        let len = rng.random_range(40..=80usize);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let home = put_object(pool, free, &data).unwrap();
        Some((home, data))
    };
    for _ in 0..LIVE {
        let obj = alloc(&pool, &mut rng, None);
        model.push(obj);
    }
    for i in 0..150_000u64 {
        let k = rng.random_range(0..LIVE);
        let old = model[k].as_ref().map(|(h, _)| *h);
        model[k] = alloc(&pool, &mut rng, old);
        if i == 75_000 {
            pool.close().unwrap();
            pool = Pool::open(&path).unwrap();
            check_model(&pool, &model);
        }
    }
    assert!(pool.stats().log().cloned().unwrap().allocation_checkpoints > 10);
    check_model(&pool, &model);
    pool.close().unwrap();
    let report = logheap::check::check(&path).unwrap();
    assert!(report.is_sound(), "{:?}", report.problems);
}

/// Crash images at every fence of allocation and free transactions that make the
/// cleaner write allocation checkpoints: each opens and holds a state the transactions
/// went through (slots in the root object name the objects).
#[test]
fn crash_images_while_checkpointing_hold_states_the_model_went_through() {
    use rand::{Rng, SeedableRng};
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    const SLOTS: usize = 8;
    type Table = [[u64; 2]; SLOTS];
    let config = small(128);
    let sim_config = logheap::media::SimConfig {
        max_images_per_fence: 3,
        ..Default::default()
    };
    let pool = Pool::create_sim(&config, sim_config).unwrap();
    let root: PPtr<Table> = pool.root().unwrap();
    let state = |pool: &Pool| -> Vec<Option<Vec<u8>>> {
        pool.read(|tx| {
            let table = tx.read(root)?;
            let mut out = Vec::new();
            for [home, len] in table {
                if home == 0 {
                    out.push(None);
                    continue;
                }
                let mut buf = vec![0u8; len as usize];
                tx.read_bytes(home, &mut buf)?;
                out.push(Some(buf));
            }
            Ok::<_, logheap::Error>(out)
        })
        .unwrap()
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let mut step = |pool: &Pool| {
        let slot = rng.random_range(0..SLOTS);
        let len = rng.random_range(16..=120u64);
        let fill: u8 = rng.random();
        pool.transaction(|tx| {
            let mut table = tx.read(root)?;
            let [home, _] = table[slot];
            if home != 0 {
                tx.free(PPtr::<u8>::from_offset(home))?;
                table[slot] = [0, 0];
            } else {
                let h = tx.alloc_bytes(len)?;
                tx.write_bytes(h, &vec![fill; len as usize])?;
                table[slot] = [h, len];
            }
            tx.write(root, &table)
        })
        .unwrap();
    };
    for _ in 0..100_000 {
        if pool.stats().log().cloned().unwrap().allocation_checkpoints > 0 {
            break;
        }
        step(&pool);
    }
    assert!(
        pool.stats().log().cloned().unwrap().allocation_checkpoints > 0,
        "no checkpoint at all"
    );
    let before = pool.stats().log().cloned().unwrap().allocation_checkpoints;
    let mut seen: HashSet<Vec<Option<Vec<u8>>>> = HashSet::new();
    seen.insert(state(&pool));
    let images = Arc::new(Mutex::new(Vec::new()));
    let sink = images.clone();
    let sim = pool.media().crash_simulator().unwrap();
    sim.set_fence_hook(Box::new(move |p| sink.lock().unwrap().extend(p.images())));
    for n in 0..20_000 {
        step(&pool);
        seen.insert(state(&pool));
        if n >= 300 && pool.stats().log().cloned().unwrap().allocation_checkpoints > before + 1 {
            break;
        }
    }
    sim.take_fence_hook();
    assert!(
        pool.stats().log().cloned().unwrap().allocation_checkpoints > before + 1,
        "fewer than two checkpoints while images were taken"
    );
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert!(images.len() > 300, "only {} images", images.len());
    for (n, image) in images.into_iter().enumerate() {
        let p = Pool::open_image(image, &config, Default::default())
            .unwrap_or_else(|e| panic!("image {n} does not open: {e}"));
        let s = state(&p);
        assert!(seen.contains(&s), "image {n} holds a state never committed");
        assert_eq!(
            p.allocations().len(),
            s.iter().flatten().count(),
            "image {n}: allocations"
        );
    }
}

/// Skewed updates (most to a few hot objects) in a small pool, with a crash reopen
/// every 3,000 transactions: cold chunks stay nearly full and keep stale copies of hot
/// objects for long, while the hot objects pass through the cleaner's own log many
/// times, so victims mix pieces of very different versions. A moved block must take the
/// newest of its pieces' versions: with an older one, a stale copy of a newer piece left
/// in a cold chunk would win over it at replay.
#[test]
fn skewed_updates_across_crashes_never_bring_back_an_older_value() {
    use rand::{Rng, SeedableRng};
    const OBJECTS: usize = 400;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let mut pool = Pool::create(&path, &small(192)).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut model: Model = Vec::with_capacity(OBJECTS);
    for k in 0..OBJECTS {
        let data = vec![k as u8; 48];
        let home = put_object(&pool, None, &data).unwrap();
        model.push(Some((home, data)));
    }
    let mut cleaned = 0;
    for i in 0..60_000u64 {
        // Nine in ten to the 20 hot objects; a few objects per transaction.
        let n = rng.random_range(1..=3);
        let mut picked = Vec::with_capacity(n);
        for _ in 0..n {
            let k = if rng.random_bool(0.9) {
                rng.random_range(0..20)
            } else {
                rng.random_range(20..OBJECTS)
            };
            if !picked.contains(&k) {
                picked.push(k);
            }
        }
        let values: Vec<(u64, Vec<u8>)> = picked
            .iter()
            .map(|&k| {
                let home = model[k].as_ref().unwrap().0;
                let mut v = i.to_le_bytes().repeat(6);
                v[0] = k as u8;
                (home, v)
            })
            .collect();
        pool.transaction(|tx| {
            for (home, v) in &values {
                tx.write_bytes(*home, v)?;
            }
            Ok::<_, logheap::Error>(())
        })
        .unwrap();
        for (&k, (home, v)) in picked.iter().zip(values) {
            model[k] = Some((home, v));
        }
        if i % 3_000 == 2_999 {
            cleaned += pool.stats().log().cloned().unwrap().chunks_cleaned;
            pool.abandon(); // crash
            pool = Pool::open(&path).unwrap();
            check_model(&pool, &model);
        }
    }
    assert!(cleaned > 1_000, "{cleaned} chunks cleaned");
    check_model(&pool, &model);
}

/// Fills `model`'s slots with objects of 64-1,200 bytes (spanning 4 KiB chunks once
/// moved) and churns them `steps` times: replaced by new objects, freed, or partly
/// rewritten, so that the log holds a lot of stale data.
fn churn(pool: &Pool, model: &mut Model, rng: &mut rand_chacha::ChaCha8Rng, steps: usize) {
    use rand::Rng;
    let random_bytes = |rng: &mut rand_chacha::ChaCha8Rng, len: usize| -> Vec<u8> {
        (0..len).map(|_| rng.random()).collect()
    };
    for _ in 0..steps {
        let slot = rng.random_range(0..model.len());
        match model[slot].clone() {
            None => {
                let len = rng.random_range(64..=1_200);
                let data = random_bytes(rng, len);
                model[slot] = Some((put_object(pool, None, &data).unwrap(), data));
            }
            Some((home, _)) if rng.random_ratio(1, 4) => {
                let len = rng.random_range(64..=1_200);
                let data = random_bytes(rng, len);
                model[slot] = Some((put_object(pool, Some(home), &data).unwrap(), data));
            }
            Some((home, _)) if rng.random_ratio(1, 10) => {
                pool.transaction(|tx| tx.free(PPtr::<u8>::from_offset(home)))
                    .unwrap();
                model[slot] = None;
            }
            Some((home, mut data)) => {
                let at = rng.random_range(0..data.len());
                let len = rng.random_range(1..=data.len() - at);
                let bytes = random_bytes(rng, len);
                pool.transaction(|tx| tx.write_bytes(home + at as u64, &bytes))
                    .unwrap();
                data[at..at + bytes.len()].copy_from_slice(&bytes);
                model[slot] = Some((home, data));
            }
        }
    }
}

fn model_bytes(model: &Model) -> u64 {
    model.iter().flatten().map(|(_, d)| d.len() as u64).sum()
}

/// `Pool::compact` brings a log full of stale data down to its live data, their
/// entry headers and the logs' last chunks; nothing is lost, across a crash, a second
/// compaction and a clean reopen, and the pool checks sound.
#[test]
fn compaction_leaves_little_beyond_the_live_data_and_loses_nothing() {
    use rand::SeedableRng;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let config = small(1024);
    let pool = Pool::create(&path, &config).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut model: Model = vec![None; 200];
    churn(&pool, &mut model, &mut rng, 20_000);
    let live = model_bytes(&model);
    let c = pool.compact();
    assert_eq!(c.chunk_size, 4096);
    assert_eq!(c.chunks_skipped, 0, "{c:?}");
    assert!(c.bytes_moved >= live / 2, "{c:?}: moved little of {live}");
    // The update chunks hold the live data with an 8-byte header per piece and a
    // preamble per block; the committer's and the cleaner's logs each keep a last
    // chunk per kind, and the allocation checkpoint takes a chunk or two.
    let held = c.chunks_after * c.chunk_size;
    assert!(
        held <= live + live / 12 + 10 * c.chunk_size,
        "{c:?}: {held} bytes held for {live} live"
    );
    assert!(c.chunks_after < c.chunks_before, "{c:?}");
    check_model(&pool, &model);
    pool.abandon(); // crash
    let pool = Pool::open(&path).unwrap();
    check_model(&pool, &model);
    churn(&pool, &mut model, &mut rng, 2_000);
    let again = pool.compact();
    assert!(again.chunks_after <= again.chunks_before, "{again:?}");
    check_model(&pool, &model);
    pool.close().unwrap();
    let report = logheap::check::check(&path).unwrap();
    assert!(report.is_sound(), "{report:?}");
    let pool = Pool::open(&path).unwrap();
    check_model(&pool, &model);
}

/// Crash images at every fence of a compaction: each opens with exactly the objects
/// committed before it (no freed object comes back, no older bytes), and a recovered
/// image compacts again and still holds them.
#[test]
fn crash_images_during_compaction_hold_every_committed_object() {
    use rand::SeedableRng;
    use std::sync::{Arc, Mutex};
    let config = small(256);
    let sim_config = logheap::media::SimConfig {
        max_images_per_fence: 2,
        ..Default::default()
    };
    let pool = Pool::create_sim(&config, sim_config).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    let mut model: Model = vec![None; 48];
    churn(&pool, &mut model, &mut rng, 4_000);
    let images = Arc::new(Mutex::new(Vec::new()));
    let sink = images.clone();
    let sim = pool.media().crash_simulator().unwrap();
    sim.set_fence_hook(Box::new(move |p| sink.lock().unwrap().extend(p.images())));
    let c = pool.compact();
    sim.take_fence_hook();
    assert!(c.chunks_reclaimed > 10 && c.bytes_moved > 0, "{c:?}");
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert!(images.len() > 100, "only {} images", images.len());
    for (n, image) in images.into_iter().enumerate() {
        let p = Pool::open_image(image, &config, Default::default())
            .unwrap_or_else(|e| panic!("image {n} does not open: {e}"));
        check_model(&p, &model);
        if n % 20 == 0 {
            p.compact();
            check_model(&p, &model);
        }
    }
}

/// Compaction while another thread commits: every chunk is either compacted or left
/// alone (locked), and the last values written are what the pool holds.
#[test]
fn compaction_beside_running_transactions_keeps_the_last_values() {
    let pool = Pool::create_sim(&small(512), Default::default()).unwrap();
    let objs: Vec<PPtr<[u8; 128]>> = (0..OBJECTS * 4)
        .map(|_| pool.transaction(|tx| tx.alloc([0u8; 128])).unwrap())
        .collect();
    let last = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            for i in 1..=20_000u64 {
                rewrite_one(&pool, objs[i as usize % objs.len()], i);
            }
        });
        let mut compactions = 0;
        while !writer.is_finished() {
            pool.compact();
            compactions += 1;
        }
        writer.join().unwrap();
        compactions
    });
    assert!(last > 0);
    for (k, &o) in objs.iter().enumerate() {
        let expected = (1..=20_000u64)
            .rev()
            .find(|i| *i as usize % objs.len() == k)
            .unwrap();
        assert_eq!(value(&pool, o), expected, "object {k}");
    }
    let c = pool.compact();
    assert_eq!(c.chunks_skipped, 0, "{c:?}");
}

/// A pool whose live data, with the entry headers that go with it, leaves the cleaner
/// nothing worth cleaning refuses commits with `PoolFull` at once: a refused commit
/// writes next to nothing (it does not grind through cleaning passes that gain
/// nothing), and the pool stays usable once objects are freed. The objects are small
/// and written in 8-byte pieces, so entry headers are a large share of the log.
#[test]
fn a_pool_too_full_to_clean_refuses_rather_than_thrashes() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path().join("p"), &small(1024)).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut objs: Vec<PPtr<[u64; 6]>> = Vec::new();
    // Fill: each transaction allocates an object and stores a word into an older one.
    let mut refused = 0;
    while refused < 50 {
        let old = (!objs.is_empty()).then(|| objs[rng.random_range(0..objs.len())]);
        let word: u64 = rng.random();
        let made = pool.transaction(|tx| {
            if let Some(o) = old {
                tx.write_bytes(o.offset() + 8 * (word % 6), &word.to_le_bytes())?;
            }
            tx.alloc([word; 6])
        });
        match made {
            Ok(p) => objs.push(p),
            Err(logheap::Error::PoolFull) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(objs.len() > 5_000, "full after only {} objects", objs.len());
    // Updates of one word each in the full pool: some may still commit; the refused
    // ones write (almost) nothing.
    let before = pool.stats().media;
    let mut refusals = 0u64;
    for _ in 0..300 {
        let o = objs[rng.random_range(0..objs.len())];
        let word: u64 = rng.random();
        match pool
            .transaction(|tx| tx.write_bytes(o.offset() + 8 * (word % 6), &word.to_le_bytes()))
        {
            Ok(()) => {}
            Err(logheap::Error::PoolFull) => refusals += 1,
            Err(e) => panic!("{e}"),
        }
    }
    let after = pool.stats().media;
    let per_attempt = (after.nt_bytes - before.nt_bytes) / 300;
    assert!(
        per_attempt < 16 << 10,
        "each update attempt wrote {per_attempt} bytes on average ({refusals} of 300 refused): the cleaner thrashes"
    );
    // Frees commit in the full pool, and make room again.
    for o in objs.drain(..objs.len() / 4) {
        pool.transaction(|tx| tx.free(o)).unwrap();
    }
    for _ in 0..200 {
        pool.transaction(|tx| tx.alloc([7u64; 6])).unwrap();
    }
    for i in 0..500u64 {
        let o = objs[i as usize % objs.len()];
        pool.transaction(|tx| tx.write_bytes(o.offset(), &i.to_le_bytes()))
            .unwrap();
    }
}

/// Runs 20,000 transactions, each rewriting a hot counter four times over and
/// allocating a 64-byte object (a random one of 3,000 freed once there are that many),
/// in a 1 MiB pool; checks the objects after a reopen and returns the chunks reclaimed
/// without copying and the bytes the cleaner moved.
fn churn_beside_a_hot_counter(separate: bool) -> (u64, u64) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let config = small(1024).separate_initial_data(separate);
    let pool = Pool::create(&path, &config).unwrap();
    let hot: PPtr<[u64; 8]> = pool.transaction(|tx| tx.alloc([0u64; 8])).unwrap();
    let mut objs: Vec<(PPtr<[u64; 8]>, u64)> = Vec::new();
    for i in 0..20_000u64 {
        let old = (objs.len() == 3_000).then(|| objs.swap_remove(rng.random_range(0..3_000)));
        let made = pool
            .transaction(|tx| {
                for k in 0..4 {
                    tx.write(hot, &[i * 4 + k; 8])?;
                }
                if let Some((o, _)) = old {
                    tx.free(o)?;
                }
                tx.alloc([i; 8])
            })
            .unwrap();
        objs.push((made, i));
    }
    let log = pool.stats().log().cloned().unwrap();
    pool.close().unwrap();
    let pool = Pool::open_with(&path, &config).unwrap();
    assert_eq!(pool.read(|tx| tx.read(hot)).unwrap(), [19_999 * 4 + 3; 8]);
    for &(o, i) in &objs {
        assert_eq!(pool.read(|tx| tx.read(o)).unwrap(), [i; 8]);
    }
    (log.chunks_fast_cleaned, log.cleaner_bytes_moved)
}

/// Separate logs ("Log-structured Non-volatile Main Memory", §3.4): with new objects'
/// data apart from the stores, the chunks of stores die whole and are reclaimed
/// without copying; in one log the long-lived new objects keep every chunk partly live,
/// so the cleaner copies them.
#[test]
fn separate_logs_let_fast_cleaning_reclaim_the_stores() {
    let (fast_separate, moved_separate) = churn_beside_a_hot_counter(true);
    let (fast_mixed, moved_mixed) = churn_beside_a_hot_counter(false);
    assert!(
        fast_separate > 2 * fast_mixed.max(10),
        "fast cleaning reclaimed {fast_separate} chunks with separate logs, {fast_mixed} with one"
    );
    assert!(
        moved_separate < moved_mixed,
        "the cleaner moved {moved_separate} bytes with separate logs, {moved_mixed} with one"
    );
}
