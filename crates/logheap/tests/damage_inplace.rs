//! Single-byte damage to a cleanly closed pool of an in-place engine (`redo`, `undo`,
//! `oop`, `hoop`) is never silent outside user data: a flip in the header, the engine
//! area, a log record, a slot or the allocator's metadata is refused at open or at the
//! first read that meets it, or changes nothing a transaction reads. A flip in user data
//! stored at home is caught only with data checksums on
//! ([`Config::data_checksums`]); with them, no flip is silent at all.
//!
//! The tests flip every third (fifth, with checksums) used byte; `full_flip_survey`
//! (ignored) flips every one and prints the figures given in docs/benchmarks.md.

use std::panic::AssertUnwindSafe;

use logheap::media::SimConfig;
use logheap::{Config, EngineKind, Error, PPtr, Pool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SLOTS: usize = 16;
const PAGE: usize = 4096;

#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Slot {
    ptr: u64,
    len: u64,
}

type Table = [Slot; SLOTS];
type Model = Vec<Option<Vec<u8>>>;

fn config(engine: EngineKind, checksums: bool) -> Config {
    Config::default()
        .engine(engine)
        .size(1 << 20)
        .data_checksums(checksums)
}

/// Runs `txs` transactions of 128-byte allocations, partial rewrites and frees; returns
/// the final state.
fn run(pool: &Pool, txs: usize, seed: u64) -> Model {
    let root: PPtr<Table> = pool.root().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut model: Model = vec![None; SLOTS];
    for _ in 0..txs {
        let mut next = model.clone();
        pool.transaction(|tx| {
            next.clone_from(&model);
            let mut table = tx.read(root)?;
            for _ in 0..rng.random_range(1..=3) {
                let slot = rng.random_range(0..SLOTS);
                match &mut next[slot] {
                    None => {
                        let data: Vec<u8> = (0..128).map(|_| rng.random()).collect();
                        let home = tx.alloc_bytes(128)?;
                        tx.write_bytes(home, &data)?;
                        table[slot] = Slot {
                            ptr: home,
                            len: 128,
                        };
                        next[slot] = Some(data);
                    }
                    Some(_) if rng.random_ratio(1, 6) => {
                        tx.free(PPtr::<u8>::from_offset(table[slot].ptr))?;
                        table[slot] = Slot::default();
                        next[slot] = None;
                    }
                    Some(obj) => {
                        let at = rng.random_range(0..obj.len());
                        let len = rng.random_range(1..=(obj.len() - at).min(40));
                        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                        tx.write_bytes(table[slot].ptr + at as u64, &data)?;
                        obj[at..at + len].copy_from_slice(&data);
                    }
                }
            }
            tx.write(root, &table)
        })
        .unwrap();
        model = next;
    }
    model
}

/// What opening a damaged image and reading everything back gave.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The open, or a read, failed with a typed error.
    Refused,
    /// Everything read back as committed.
    Harmless,
    /// A read returned something that was not committed.
    Silent,
    /// The open or a read panicked.
    Panicked,
}

fn open_and_read(image: Vec<u8>, config: &Config, expected: &Model) -> Outcome {
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let pool = match Pool::open_image(image, config, SimConfig::default()) {
            Ok(pool) => pool,
            Err(e) => {
                if std::env::var("DEBUG_FLIPS").is_ok() {
                    eprintln!("open: {e}");
                }
                return Outcome::Refused;
            }
        };
        let root: PPtr<Table> = pool.root().unwrap();
        let read = pool.read(|tx| {
            let table = tx.read(root)?;
            let mut state = Model::new();
            for s in table {
                if s.ptr == 0 {
                    state.push(None);
                    continue;
                }
                let mut bytes = vec![0u8; s.len.min(1 << 16) as usize];
                tx.read_bytes(s.ptr, &mut bytes)?;
                state.push(Some(bytes));
            }
            Ok::<_, Error>(state)
        });
        let outcome = match read {
            Err(e) => {
                if std::env::var("DEBUG_FLIPS").is_ok() {
                    eprintln!("read: {e}");
                }
                Outcome::Refused
            }
            Ok(state) if state == *expected => Outcome::Harmless,
            Ok(_) => Outcome::Silent,
        };
        pool.abandon();
        outcome
    }));
    outcome.unwrap_or(Outcome::Panicked)
}

/// A cleanly closed pool after a few hundred transactions: its image, its final state
/// and the ranges holding user data (the root and every live allocation).
struct Subject {
    image: Vec<u8>,
    expected: Model,
    user_data: Vec<(u64, u64)>,
    config: Config,
}

fn subject(engine: EngineKind, checksums: bool) -> Subject {
    let config = config(engine, checksums);
    let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
    let expected = run(&pool, 300, engine as u64);
    let mut user_data = pool.allocations();
    let root = pool.root_range();
    user_data.push((root.start, root.end - root.start));
    let media = pool.media().clone();
    pool.close().unwrap();
    let image = media.crash_simulator().unwrap().persisted_image();
    assert_eq!(
        open_and_read(image.clone(), &config, &expected),
        Outcome::Harmless,
        "the undamaged {engine} pool does not read back"
    );
    Subject {
        image,
        expected,
        user_data,
        config,
    }
}

/// Every byte of every page that holds a non-zero byte.
fn used_offsets(image: &[u8]) -> Vec<usize> {
    image
        .chunks(PAGE)
        .enumerate()
        .filter(|(_, page)| page.iter().any(|&b| b != 0))
        .flat_map(|(p, page)| p * PAGE..p * PAGE + page.len())
        .collect()
}

#[derive(Debug, Default)]
struct Survey {
    flips: usize,
    refused: usize,
    harmless: usize,
    silent_in_user_data: usize,
    /// Offsets of silent changes outside user data (or of panics).
    silent_elsewhere: Vec<usize>,
}

/// Flips one byte (all its bits) at every `step`-th used offset, on two threads.
fn survey(s: &Subject, step: usize) -> Survey {
    let offsets: Vec<usize> = used_offsets(&s.image).into_iter().step_by(step).collect();
    let in_user_data = |at: usize| {
        s.user_data
            .iter()
            .any(|&(start, len)| (start..start + len).contains(&(at as u64)))
    };
    let parts: Vec<Survey> = std::thread::scope(|scope| {
        let handles: Vec<_> = offsets
            .chunks(offsets.len().div_ceil(2).max(1))
            .map(|part| {
                scope.spawn(move || {
                    let mut out = Survey::default();
                    for &at in part {
                        let mut damaged = s.image.clone();
                        damaged[at] ^= 0xff;
                        out.flips += 1;
                        match open_and_read(damaged, &s.config, &s.expected) {
                            Outcome::Refused => out.refused += 1,
                            Outcome::Harmless => out.harmless += 1,
                            Outcome::Silent if in_user_data(at) => out.silent_in_user_data += 1,
                            Outcome::Silent | Outcome::Panicked => out.silent_elsewhere.push(at),
                        }
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    parts.into_iter().fold(Survey::default(), |mut all, p| {
        all.flips += p.flips;
        all.refused += p.refused;
        all.harmless += p.harmless;
        all.silent_in_user_data += p.silent_in_user_data;
        all.silent_elsewhere.extend(p.silent_elsewhere);
        all
    })
}

const ENGINES: [EngineKind; 4] = [
    EngineKind::Redo,
    EngineKind::Undo,
    EngineKind::Oop,
    EngineKind::Hoop,
];

fn assert_never_silent_outside_user_data(engine: EngineKind, step: usize) {
    let s = subject(engine, false);
    let found = survey(&s, step);
    eprintln!("{engine} without data checksums: {found:?}");
    assert!(
        found.silent_elsewhere.is_empty(),
        "{engine}: {} flips outside user data changed what was read (or panicked), at {:?}",
        found.silent_elsewhere.len(),
        &found.silent_elsewhere[..found.silent_elsewhere.len().min(8)]
    );
    assert!(found.refused > 0 && found.flips > 500, "{found:?}");
}

fn assert_never_silent_with_checksums(engine: EngineKind, step: usize) {
    let s = subject(engine, true);
    let found = survey(&s, step);
    eprintln!("{engine} with data checksums: {found:?}");
    assert!(
        found.silent_elsewhere.is_empty() && found.silent_in_user_data == 0,
        "{engine} with data checksums: {} silent in user data, {} elsewhere (first {:?})",
        found.silent_in_user_data,
        found.silent_elsewhere.len(),
        &found.silent_elsewhere[..found.silent_elsewhere.len().min(8)]
    );
}

#[test]
fn redo_damage_outside_user_data_is_never_silent() {
    assert_never_silent_outside_user_data(EngineKind::Redo, 3);
}

#[test]
fn undo_damage_outside_user_data_is_never_silent() {
    assert_never_silent_outside_user_data(EngineKind::Undo, 3);
}

#[test]
fn oop_damage_outside_user_data_is_never_silent() {
    assert_never_silent_outside_user_data(EngineKind::Oop, 3);
}

#[test]
fn hoop_damage_outside_user_data_is_never_silent() {
    assert_never_silent_outside_user_data(EngineKind::Hoop, 3);
}

#[test]
fn with_data_checksums_no_damage_is_silent() {
    for engine in ENGINES {
        assert_never_silent_with_checksums(engine, 5);
    }
}

/// Every used byte of every engine, with and without data checksums (minutes).
#[test]
#[ignore]
fn full_flip_survey() {
    for engine in ENGINES {
        for checksums in [false, true] {
            let found = survey(&subject(engine, checksums), 1);
            eprintln!(
                "{engine} checksums={checksums}: {} flips, {} refused, {} harmless, \
                 {} silent in user data, {} silent elsewhere",
                found.flips,
                found.refused,
                found.harmless,
                found.silent_in_user_data,
                found.silent_elsewhere.len()
            );
        }
    }
}

/// Data checksums survive crashes: every crash image taken at the fences of a
/// workload (a sample of each fence's) opens and reads back with no checksum error,
/// and `check` calls it sound.
#[test]
fn with_data_checksums_every_crash_image_reads_back() {
    for engine in ENGINES {
        let config = config(engine, true);
        let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
        run(&pool, 20, 7);
        let sink = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let images = sink.clone();
        let sim = pool.media().crash_simulator().unwrap();
        sim.set_fence_hook(Box::new(move |p| {
            sink.lock().unwrap().extend(p.images().step_by(5).take(4))
        }));
        let model = run(&pool, 60, 8);
        sim.take_fence_hook();
        let images = images.lock().unwrap().clone();
        assert!(
            images.len() > 100,
            "{engine}: {} crash images",
            images.len()
        );
        for (n, image) in images.into_iter().enumerate() {
            let checked = logheap::check::check_image(image.clone()).unwrap();
            assert!(
                checked.is_sound(),
                "{engine}: crash image {n}: {:?}",
                checked.problems
            );
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let pool = Pool::open_image(image, &config, SimConfig::default()).unwrap();
                let root: PPtr<Table> = pool.root().unwrap();
                pool.read(|tx| {
                    for s in tx.read(root)? {
                        if s.ptr != 0 {
                            let mut bytes = vec![0u8; s.len as usize];
                            tx.read_bytes(s.ptr, &mut bytes)?;
                        }
                    }
                    Ok::<_, Error>(())
                })
                .unwrap();
                pool.abandon();
            }));
            assert!(
                outcome.is_ok(),
                "{engine}: crash image {n} does not read back"
            );
        }
        let _ = model;
        pool.abandon();
    }
}

/// Data checksums over a heap filled end to end: every window of checksums is in use,
/// so a checksum stored in the wrong place (another window's, another block's) shows.
/// Each object is then damaged in one byte: `check` lists exactly those lines.
#[test]
fn data_checksums_hold_over_a_full_heap_and_find_each_damaged_line() {
    for engine in [EngineKind::Redo, EngineKind::Undo] {
        let config = Config::default()
            .engine(engine)
            .size(2 << 20)
            .data_checksums(true);
        let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
        let mut homes = Vec::new();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        loop {
            let len = rng.random_range(16..2000u64);
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            match pool.transaction(|tx| {
                let home = tx.alloc_bytes(len)?;
                tx.write_bytes(home, &data)?;
                Ok(home)
            }) {
                Ok(home) => homes.push((home, data)),
                Err(Error::PoolFull) => break,
                Err(e) => panic!("{engine}: {e}"),
            }
        }
        assert!(homes.len() > 500, "{engine}: {} objects", homes.len());
        let media = pool.media().clone();
        pool.close().unwrap();
        let mut image = media.crash_simulator().unwrap().persisted_image();
        let pool = Pool::open_image(image.clone(), &config, SimConfig::default()).unwrap();
        pool.read(|tx| {
            for (home, data) in &homes {
                let mut back = vec![0u8; data.len()];
                tx.read_bytes(*home, &mut back)?;
                assert!(
                    back == *data,
                    "{engine}: the object at {home:#x} reads back changed"
                );
            }
            Ok::<_, Error>(())
        })
        .unwrap();
        assert!(pool.damaged_data().is_empty(), "{engine}");
        pool.abandon();
        // One byte of every 50th object damaged: each one's line is found, no other.
        let mut lines: Vec<u64> = homes
            .iter()
            .step_by(50)
            .map(|(home, _)| {
                image[*home as usize] ^= 0x20;
                home - home % 64
            })
            .collect();
        lines.sort_unstable();
        lines.dedup();
        let report = logheap::check::check_image(image).unwrap();
        let mut found: Vec<u64> = report.problems.iter().map(|p| p.offset).collect();
        found.sort_unstable();
        assert_eq!(found, lines, "{engine}");
    }
}

/// Data checksums are kept by an open that does not ask (the default), turned off by
/// `data_checksums(false)` (their pages freed) and on again by `data_checksums(true)`
/// at a later open, over the data as it is then.
#[test]
fn data_checksums_can_be_turned_off_and_on_at_an_open() {
    let on = config(EngineKind::Redo, true);
    let pool = Pool::create_sim(&on, SimConfig::default()).unwrap();
    let expected = run(&pool, 50, 4);
    let (allocations, used) = (pool.allocations(), pool.stats().pm_bytes_used);
    assert!(pool.stats().data_checksums);
    let reopen = |pool: Pool, config: &Config| {
        let media = pool.media().clone();
        pool.close().unwrap();
        let image = media.crash_simulator().unwrap().persisted_image();
        Pool::open_image(image, config, SimConfig::default()).unwrap()
    };
    let plain = Config::default();
    let pool = reopen(pool, &plain);
    assert!(
        pool.stats().data_checksums,
        "an open that does not ask keeps them"
    );
    let pool = reopen(pool, &plain.data_checksums(false));
    assert!(!pool.stats().data_checksums);
    assert_eq!(
        pool.allocations(),
        allocations,
        "the pages were no user allocation"
    );
    assert!(pool.stats().pm_bytes_used <= used);
    let pool = reopen(pool, &plain);
    assert!(!pool.stats().data_checksums, "off stays off");
    let pool = reopen(pool, &plain.data_checksums(true));
    assert!(pool.stats().data_checksums);
    assert!(pool.damaged_data().is_empty());
    let media = pool.media().clone();
    pool.close().unwrap();
    let image = media.crash_simulator().unwrap().persisted_image();
    assert_eq!(open_and_read(image, &plain, &expected), Outcome::Harmless);
}
