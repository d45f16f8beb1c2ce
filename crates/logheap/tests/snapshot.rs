//! The clean-close snapshot: an open after a clean close loads the mapping and the
//! allocator from it instead of replaying the log, with exactly the state a replay
//! rebuilds; a damaged or stale snapshot is never trusted (the log is replayed), and a
//! crash at any fence around it loses nothing.

use std::sync::{Arc, Mutex};

use logheap::media::SimConfig;
use logheap::{Config, MappingConfig, PPtr, Pool, SnapshotUse};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SLOTS: usize = 24;

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Slot {
    ptr: u64,
    len: u64,
}

type Table = [Slot; SLOTS];
/// What the slots hold.
type Model = Vec<Option<Vec<u8>>>;

fn config(threads: usize) -> Config {
    Config::default()
        .size(2 << 20)
        .chunk_size(4096)
        .recovery_threads(threads)
}

/// Runs `txs` random transactions (allocate, overwrite part of, or free a slot's
/// object) and returns the slots' contents after the last.
fn run(pool: &Pool, txs: usize, seed: u64) -> Model {
    let root: PPtr<Table> = pool.root().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..txs {
        let slot = rng.random_range(0..SLOTS);
        let len = rng.random_range(1..600u64);
        let byte: u8 = rng.random();
        let choice = rng.random_range(0..3);
        pool.transaction(|tx| {
            let mut table = tx.read(root)?;
            let s = table[slot];
            match (choice, s.ptr) {
                (0, _) | (_, 0) => {
                    if s.ptr != 0 {
                        tx.free(PPtr::<u8>::from_offset(s.ptr))?;
                    }
                    let ptr = tx.alloc_bytes(len)?;
                    tx.write_bytes(ptr, &vec![byte; len as usize])?;
                    table[slot] = Slot { ptr, len };
                }
                (1, _) => {
                    let n = s.len.min(len);
                    tx.write_bytes(s.ptr + (s.len - n) / 2, &vec![byte; n as usize])?;
                }
                _ => {
                    tx.free(PPtr::<u8>::from_offset(s.ptr))?;
                    table[slot] = Slot { ptr: 0, len: 0 };
                }
            }
            tx.write(root, &table)
        })
        .unwrap();
    }
    state(pool)
}

fn state(pool: &Pool) -> Model {
    let root: PPtr<Table> = pool.root().unwrap();
    pool.read(|tx| {
        let table = tx.read(root)?;
        let mut out = Vec::new();
        for s in table {
            if s.ptr == 0 {
                out.push(None);
                continue;
            }
            let mut bytes = vec![0u8; s.len as usize];
            tx.read_bytes(s.ptr, &mut bytes)?;
            out.push(Some(bytes));
        }
        Ok::<_, logheap::Error>(out)
    })
    .unwrap()
}

/// What the engine rebuilt at open, beyond the data: allocations, live log bytes,
/// mapped ranges.
fn rebuilt(pool: &Pool) -> (Vec<(u64, u64)>, u64, u64, u64) {
    let s = pool.stats().log().cloned().unwrap();
    (
        pool.allocations(),
        s.live_log_bytes,
        s.allocated_bytes,
        s.mapping_nodes,
    )
}

fn closed_image(pool: Pool) -> Vec<u8> {
    let media = pool.media().clone();
    pool.close().unwrap();
    media.crash_simulator().unwrap().persisted_image()
}

/// Pool offset of the snapshot locator in the superblock, found by its magic.
fn locator_at(image: &[u8]) -> Option<usize> {
    image[..4096].windows(8).position(|w| w == b"LHSNAPLC")
}

/// The image with its snapshot locator erased: its open replays the log.
fn without_snapshot(mut image: Vec<u8>) -> Vec<u8> {
    let at = locator_at(&image).expect("a clean close writes a snapshot");
    image[at..at + 64].fill(0);
    image
}

/// Pool offsets of the written bytes of every snapshot chunk (its own header and
/// payload), found by the chunk magic.
fn snapshot_bytes(image: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    for chunk in (4096..image.len()).step_by(4096) {
        let at = chunk + 64;
        if image.get(at..at + 8) == Some(b"LHSNAPCH") {
            let len = u32::from_le_bytes(image[at + 16..at + 20].try_into().unwrap()) as usize;
            out.extend(at..at + 24 + len);
        }
    }
    out
}

/// `image` with one bit of byte `at` flipped.
fn image_with_flip(image: &[u8], at: usize) -> Vec<u8> {
    let mut damaged = image.to_vec();
    damaged[at] ^= 1 << (at % 8);
    damaged
}

fn open(image: Vec<u8>, config: &Config) -> Pool {
    Pool::open_image(image, config, SimConfig::default()).unwrap()
}

#[test]
fn a_clean_open_loads_the_snapshot_and_rebuilds_what_a_replay_would() {
    for (name, mapping) in MappingConfig::NAMED {
        for threads in [1, 3] {
            let config = config(threads).mapping(mapping);
            let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
            let expected = run(&pool, 300, 7);
            let image = closed_image(pool);
            // `logheap check` finds that the snapshot holds what the log does.
            let checked = logheap::check::check_image(image.clone()).unwrap();
            assert!(checked.is_sound(), "{name}: {:?}", checked.problems);
            assert_eq!(checked.recovery.unwrap().snapshot, SnapshotUse::Loaded);
            let loaded = open(image.clone(), &config);
            let replayed = open(without_snapshot(image), &config);
            let report = loaded.stats().log().cloned().unwrap().recovery;
            assert_eq!(report.snapshot, SnapshotUse::Loaded, "{name}/{threads}");
            assert_eq!(
                replayed.stats().log().cloned().unwrap().recovery.snapshot,
                SnapshotUse::None
            );
            assert!(report.was_clean);
            assert!(state(&loaded) == expected, "{name}/{threads}");
            assert!(state(&replayed) == expected);
            assert_eq!(rebuilt(&loaded), rebuilt(&replayed), "{name}/{threads}");
            // Both go on alike: the allocators hand out the same homes.
            let after = run(&loaded, 150, 8);
            assert!(run(&replayed, 150, 8) == after);
            assert_eq!(rebuilt(&loaded), rebuilt(&replayed));
            // And the snapshot of the snapshot-loaded pool is sound too.
            let again = open(closed_image(loaded), &config);
            assert_eq!(
                again.stats().log().cloned().unwrap().recovery.snapshot,
                SnapshotUse::Loaded
            );
            assert!(state(&again) == after);
            assert_eq!(rebuilt(&again), rebuilt(&replayed));
        }
    }
}

#[test]
fn a_damaged_snapshot_is_rejected_and_the_log_replayed() {
    let config = config(2);
    let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
    let expected = run(&pool, 200, 3);
    let image = closed_image(pool);
    let reference = rebuilt(&open(without_snapshot(image.clone()), &config));
    let locator = locator_at(&image).unwrap();
    let mut offsets: Vec<usize> = snapshot_bytes(&image);
    assert!(offsets.len() > 200, "{} snapshot bytes", offsets.len());
    // Every byte of the locator and of the snapshot chunks' headers, and a sample of
    // the payload.
    offsets = offsets
        .into_iter()
        .enumerate()
        .filter(|&(i, _)| i % 3 == 0 || i < 24)
        .map(|(_, at)| at)
        .chain(locator..locator + 64)
        .collect();
    for at in offsets {
        let pool = open(image_with_flip(&image, at), &config);
        let report = pool.stats().log().cloned().unwrap().recovery;
        assert!(
            matches!(report.snapshot, SnapshotUse::Rejected(_)),
            "a flip at {at} was not noticed: {:?}",
            report.snapshot
        );
        assert!(state(&pool) == expected, "flip at {at}");
        assert_eq!(rebuilt(&pool), reference, "flip at {at}");
        if at % 5 == 0 {
            let checked = logheap::check::check_image(image_with_flip(&image, at)).unwrap();
            assert!(checked.is_sound(), "flip at {at}: {:?}", checked.problems);
            assert!(matches!(
                checked.recovery.unwrap().snapshot,
                SnapshotUse::Rejected(_)
            ));
        }
    }
}

#[test]
fn a_snapshot_is_used_by_one_open_only() {
    let config = config(1);
    let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
    run(&pool, 100, 1);
    let image = closed_image(pool);
    let reopened = open(image.clone(), &config);
    assert_eq!(
        reopened.stats().log().cloned().unwrap().recovery.snapshot,
        SnapshotUse::Loaded
    );
    // Opening erased the locator before anything else was written.
    let media = reopened.media().clone();
    let persisted = media.crash_simulator().unwrap().persisted_image();
    assert_eq!(locator_at(&persisted), None);
    // A crash after more work: recovery replays the log, and nothing is lost.
    let expected = run(&reopened, 100, 2);
    let crashed = media.crash_simulator().unwrap().persisted_image();
    reopened.abandon();
    let recovered = open(crashed, &config);
    assert_eq!(
        recovered.stats().log().cloned().unwrap().recovery.snapshot,
        SnapshotUse::None
    );
    assert!(state(&recovered) == expected);
    // A stale locator (the first close's) put into a later clean close's image is not
    // trusted: its chunks hold other bytes by now.
    let later = closed_image(recovered);
    let (old, new) = (locator_at(&image).unwrap(), locator_at(&later).unwrap());
    let mut stale = later.clone();
    stale[new..new + 64].copy_from_slice(&image[old..old + 64]);
    if stale != later {
        let pool = open(stale, &config);
        assert!(matches!(
            pool.stats().log().cloned().unwrap().recovery.snapshot,
            SnapshotUse::Rejected(_)
        ));
        assert!(state(&pool) == expected);
    }
}

/// Crash images at every fence of a session that opens from a snapshot, works, and
/// closes (writing the next snapshot): each opens with a state the session committed,
/// and the ones taken after the close completed load the snapshot.
#[test]
fn a_crash_at_any_fence_around_a_snapshot_loses_nothing() {
    let config = config(2);
    let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
    let first = run(&pool, 60, 11);
    let image = closed_image(pool);
    let sim_config = SimConfig {
        max_images_per_fence: 8,
        ..Default::default()
    };
    let file = logheap::PoolFile::open_image(image, &config.media, sim_config).unwrap();
    let images = Arc::new(Mutex::new(Vec::new()));
    let sink = images.clone();
    file.media()
        .crash_simulator()
        .unwrap()
        .set_fence_hook(Box::new(move |p| sink.lock().unwrap().extend(p.images())));
    let pool = Pool::from_file(file, &config).unwrap();
    let mut states = vec![first];
    for seed in 0..25 {
        states.push(run(&pool, 1, 100 + seed));
    }
    let media = pool.media().clone();
    pool.close().unwrap();
    let sim = media.crash_simulator().unwrap();
    sim.take_fence_hook();
    let images = images.lock().unwrap().clone();
    assert!(images.len() > 50, "{} crash images", images.len());
    let mut loaded = 0;
    for (i, image) in images.into_iter().enumerate() {
        let pool = open(image, &config);
        // Whatever the crash, the state is one the session committed.
        assert!(
            states.contains(&state(&pool)),
            "image {i}: a state never committed"
        );
        // Loaded: before the open marked the pool open, or after the close.
        loaded += (pool.stats().log().cloned().unwrap().recovery.snapshot == SnapshotUse::Loaded)
            as usize;
    }
    let pool = open(sim.persisted_image(), &config);
    assert_eq!(
        pool.stats().log().cloned().unwrap().recovery.snapshot,
        SnapshotUse::Loaded
    );
    assert!(state(&pool) == *states.last().unwrap());
    assert!(
        loaded >= 1,
        "a crash image before the open loads the first snapshot"
    );
}
