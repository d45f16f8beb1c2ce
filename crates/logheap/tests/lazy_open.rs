//! An open after a clean close reads no block of the log: it loads the clean-close
//! snapshot (with its table of every chunk in a log) and checks each chunk's blocks
//! later, before anything is read from it, and in a background scrub. Damage found
//! then fails the reads that meet it with `Error::Corrupt` (and only those), is never
//! moved elsewhere by the cleaner, and is found again after the next clean close.

use logheap::media::SimConfig;
use logheap::{Config, Error, LogEngineStats, PPtr, Pool, SnapshotUse};

const OBJECTS: usize = 48;
const LEN: usize = 700;

#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Table {
    homes: [u64; OBJECTS],
}

fn config(threads: usize) -> Config {
    Config::default()
        .size(2 << 20)
        .chunk_size(4096)
        .recovery_threads(threads)
}

/// Object `i`'s bytes: a pattern found nowhere else in the pool.
fn value(i: usize) -> Vec<u8> {
    (0..LEN)
        .map(|k| (k as u8).wrapping_mul(31) ^ (i as u8).wrapping_mul(113) ^ 0x5a)
        .collect()
}

/// A pool of `OBJECTS` objects (each written once, in its own transaction), closed
/// cleanly: its persisted image.
fn closed_image(threads: usize) -> Vec<u8> {
    let pool = Pool::create_sim(&config(threads), SimConfig::default()).unwrap();
    let root: PPtr<Table> = pool.root().unwrap();
    for i in 0..OBJECTS {
        pool.transaction(|tx| {
            let home = tx.alloc_bytes(LEN as u64)?;
            tx.write_bytes(home, &value(i))?;
            let mut table = tx.read(root)?;
            table.homes[i] = home;
            tx.write(root, &table)
        })
        .unwrap();
    }
    let media = pool.media().clone();
    pool.close().unwrap();
    media.crash_simulator().unwrap().persisted_image()
}

/// Where object `i`'s bytes lie in `image` (its only copy in the log), when they lie
/// in one piece (a commit may split an object's bytes over two chunks).
fn place_of(image: &[u8], i: usize) -> Option<usize> {
    let v = value(i);
    let at = image.windows(LEN).position(|w| w == v)?;
    assert!(
        !image[at + 1..].windows(LEN).any(|w| w == v),
        "one copy only"
    );
    Some(at)
}

/// The objects whose bytes lie in one piece, with where: (object, offset), by object.
fn placed(image: &[u8]) -> Vec<(usize, usize)> {
    (0..OBJECTS)
        .filter_map(|i| place_of(image, i).map(|at| (i, at)))
        .collect()
}

/// The chunk holding image offset `at` (chunks of 4096 bytes start at 8192).
fn chunk_of(at: usize) -> usize {
    (at - 8192) / 4096
}

/// An object (the last such) whose bytes lie in one piece in another chunk than `at`.
fn other_than(image: &[u8], at: usize) -> usize {
    placed(image)
        .into_iter()
        .rev()
        .find(|&(_, o)| chunk_of(o) != chunk_of(at))
        .unwrap()
        .0
}

/// Reads object `i`, by copy or in place.
fn read(pool: &Pool, i: usize, in_place: bool) -> Result<Vec<u8>, Error> {
    let root: PPtr<Table> = pool.root().unwrap();
    pool.read(|tx| {
        let home = tx.read(root)?.homes[i];
        if in_place {
            tx.read_with(home, LEN, |b| b.to_vec())
        } else {
            let mut out = vec![0u8; LEN];
            tx.read_bytes(home, &mut out)?;
            Ok(out)
        }
    })
}

fn log_stats(pool: &Pool) -> LogEngineStats {
    pool.stats().log().cloned().unwrap()
}

/// Waits for the background scrub to have checked every chunk.
fn scrubbed(pool: &Pool) -> LogEngineStats {
    let start = std::time::Instant::now();
    loop {
        let s = log_stats(pool);
        if s.chunks_unchecked == 0 {
            return s;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the scrub did not finish"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn a_clean_open_reads_only_the_tails_and_checks_every_other_chunk_after() {
    for threads in [1, 2] {
        let image = closed_image(threads);
        let pool = Pool::open_image(image, &config(threads), SimConfig::default()).unwrap();
        let report = log_stats(&pool).recovery;
        assert!(report.was_clean);
        assert_eq!(report.snapshot, SnapshotUse::Loaded);
        // Every chunk in a log but the update, allocation and deallocation logs'
        // last ones.
        assert!(
            report.chunks_unchecked + 3 >= report.chunks_in_use && report.chunks_unchecked > 5,
            "{report:?}"
        );
        let s = scrubbed(&pool);
        assert_eq!(s.chunks_damaged, 0);
        for i in 0..OBJECTS {
            assert_eq!(read(&pool, i, false).unwrap(), value(i));
        }
        // Closing again and opening again: the same.
        let media = pool.media().clone();
        pool.close().unwrap();
        let image = media.crash_simulator().unwrap().persisted_image();
        let pool = Pool::open_image(image, &config(threads), SimConfig::default()).unwrap();
        assert!(log_stats(&pool).recovery.chunks_unchecked > 5);
        for i in 0..OBJECTS {
            assert_eq!(read(&pool, i, i % 2 == 0).unwrap(), value(i));
        }
    }
}

#[test]
fn a_damaged_block_found_after_the_open_fails_only_the_reads_that_meet_it() {
    let image = closed_image(1);
    // Object 3's bytes, and an object whose bytes lie in another chunk.
    let (victim, at) = placed(&image)[0];
    let other = other_than(&image, at);
    let mut damaged = image.clone();
    damaged[at + 100] ^= 0x10;
    for in_place in [false, true] {
        let pool = Pool::open_image(damaged.clone(), &config(1), SimConfig::default()).unwrap();
        assert!(log_stats(&pool).recovery.chunks_unchecked > 0);
        // The first read of the damaged chunk checks it, and fails; a read of another
        // chunk does not.
        match read(&pool, victim, in_place) {
            Err(Error::Corrupt { reason, .. }) => {
                assert!(reason.contains("damaged"), "{reason}")
            }
            other => panic!("read of a damaged chunk gave {other:?}"),
        }
        assert_eq!(read(&pool, other, in_place).unwrap(), value(other));
        let s = scrubbed(&pool);
        assert_eq!(s.chunks_damaged, 1);
        // The cleaner moves nothing out of it: compaction leaves it, and it still fails.
        pool.compact();
        assert!(matches!(
            read(&pool, victim, in_place),
            Err(Error::Corrupt { .. })
        ));
        assert_eq!(read(&pool, other, in_place).unwrap(), value(other));
        // A clean close keeps what the chunk should hold, so the next open finds the
        // damage again.
        let media = pool.media().clone();
        pool.close().unwrap();
        let again = media.crash_simulator().unwrap().persisted_image();
        let pool = Pool::open_image(again, &config(1), SimConfig::default()).unwrap();
        assert!(matches!(
            read(&pool, victim, in_place),
            Err(Error::Corrupt { .. })
        ));
        assert_eq!(scrubbed(&pool).chunks_damaged, 1);
        drop(pool);
    }
    // `logheap check` (which reads the whole log) finds it too.
    let report = logheap::check::check_image(damaged).unwrap();
    assert!(!report.is_sound());
}

#[test]
fn the_scrub_finds_damage_that_no_read_meets() {
    let image = closed_image(2);
    let (i, at) = placed(&image)[0];
    let mut damaged = image;
    damaged[at] ^= 1;
    let pool = Pool::open_image(damaged, &config(2), SimConfig::default()).unwrap();
    let s = scrubbed(&pool);
    assert_eq!(s.chunks_damaged, 1, "{s:?}");
    assert!(matches!(read(&pool, i, false), Err(Error::Corrupt { .. })));
}

#[test]
fn a_damaged_chunk_header_found_after_the_open_costs_that_chunk_only_and_is_found_again() {
    let image = closed_image(1);
    let (victim, at) = placed(&image)[0];
    // The header of the chunk holding it.
    let chunk_start = 8192 + chunk_of(at) * 4096;
    assert_eq!(&image[chunk_start..chunk_start + 4], b"LHC1");
    let other = other_than(&image, at);
    let mut damaged = image;
    damaged[chunk_start + 9] ^= 4;
    let mut next = damaged;
    for round in 0..2 {
        let pool = Pool::open_image(next, &config(1), SimConfig::default()).unwrap();
        assert_eq!(log_stats(&pool).recovery.snapshot, SnapshotUse::Loaded);
        assert!(
            matches!(read(&pool, victim, false), Err(Error::Corrupt { .. })),
            "round {round}"
        );
        assert_eq!(read(&pool, other, true).unwrap(), value(other));
        assert_eq!(scrubbed(&pool).chunks_damaged, 1);
        let media = pool.media().clone();
        pool.close().unwrap();
        next = media.crash_simulator().unwrap().persisted_image();
    }
}

#[test]
fn a_read_of_a_damaged_chunk_names_that_chunk() {
    let image = closed_image(1);
    let placed = placed(&image);
    let (a, at_a) = placed[0];
    let (b, at_b) = placed
        .iter()
        .copied()
        .find(|&(_, at)| chunk_of(at) != chunk_of(at_a))
        .unwrap();
    let mut damaged = image;
    damaged[at_a + 10] ^= 1;
    damaged[at_b + 10] ^= 1;
    let pool = Pool::open_image(damaged, &config(1), SimConfig::default()).unwrap();
    // `b`'s chunk is found damaged first, then `a`'s: each read names its own.
    for (i, at) in [(b, at_b), (a, at_a)] {
        match read(&pool, i, false) {
            Err(Error::Corrupt { offset, .. }) => {
                assert_eq!(chunk_of(offset as usize), chunk_of(at), "object {i}")
            }
            other => panic!("object {i}: {other:?}"),
        }
    }
}
