//! `check::repair` (`logheap check --repair`): a damaged pool is made sound again by
//! dropping exactly what cannot be trusted, after a backup; what it dropped is said.

use logheap::check::{check, repair};
use logheap::{Config, EngineKind, Error, PPtr, Pool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SLOTS: usize = 8;
type Table = [u64; SLOTS];

/// Runs `txs` transactions, each allocating or rewriting one 64-byte object named from
/// the root table; returns every state (the root table and the objects' bytes), the
/// first being the empty pool's.
fn run(pool: &Pool, txs: usize) -> Vec<Vec<Vec<u8>>> {
    let root: PPtr<Table> = pool.root().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut states = vec![vec![Vec::new(); SLOTS]];
    for _ in 0..txs {
        let slot = rng.random_range(0..SLOTS);
        let data: Vec<u8> = (0..64).map(|_| rng.random()).collect();
        pool.transaction(|tx| {
            let mut table = tx.read(root)?;
            if table[slot] == 0 {
                table[slot] = tx.alloc_bytes(64)?;
                tx.write(root, &table)?;
            }
            tx.write_bytes(table[slot], &data)
        })
        .unwrap();
        let mut next = states.last().unwrap().clone();
        next[slot] = data;
        states.push(next);
    }
    states
}

/// What the pool holds now, as `run` records it.
fn state_of(pool: &Pool) -> Vec<Vec<u8>> {
    let root: PPtr<Table> = pool.root().unwrap();
    pool.read(|tx| {
        let table = tx.read(root)?;
        let mut state = Vec::new();
        for home in table {
            let mut bytes = vec![0u8; if home == 0 { 0 } else { 64 }];
            if home != 0 {
                tx.read_bytes(home, &mut bytes)?;
            }
            state.push(bytes);
        }
        Ok::<_, Error>(state)
    })
    .unwrap()
}

#[test]
fn a_damaged_log_is_cut_back_to_before_its_damage() {
    let (repaired, refused) = repair_random_flips(40, 9);
    assert!(repaired >= 20, "{repaired} repaired, {refused} refused");
}

/// 2,000 random flips of the used log (a minute or two): the figures of the notes.
#[test]
#[ignore]
fn repair_survey() {
    let (repaired, refused) = repair_random_flips(2000, 11);
    eprintln!("survey: {repaired} repaired, {refused} refused");
}

/// Flips one byte of the used log of a closed pool `rounds` times (a fresh copy each
/// time), repairs each damaged one and checks the outcome; returns (repaired, refused).
fn repair_random_flips(rounds: usize, seed: u64) -> (usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let config = Config::default().size(4 << 20).chunk_size(64 << 10);
    let pool = Pool::create(&path, &config).unwrap();
    let states = run(&pool, 300);
    let data = pool.header().layout.data.clone();
    pool.close().unwrap();
    let pristine = std::fs::read(&path).unwrap();
    // The used part of the log: the chunks with a non-zero header.
    let used: Vec<usize> = (data.start as usize..pristine.len())
        .step_by(64 << 10)
        .filter(|&c| pristine[c..c + 64].iter().any(|&b| b != 0))
        .flat_map(|c| c..c + (64 << 10))
        .filter(|&at| pristine[at] != 0)
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut repaired, mut refused) = (0, 0);
    for _ in 0..rounds {
        let at = used[rng.random_range(0..used.len())];
        let mut damaged = pristine.clone();
        damaged[at] ^= 0x5a;
        std::fs::write(&path, &damaged).unwrap();
        let backup = dir.path().join("backup");
        let _ = std::fs::remove_file(&backup);
        if check(&path).unwrap().is_sound() {
            continue; // a byte no one reads (padding)
        }
        match repair(&path, &backup) {
            Ok(report) => {
                repaired += 1;
                assert!(!report.before.is_sound());
                assert!(
                    report.after.is_sound(),
                    "offset {at}: {:?}",
                    report.after.problems
                );
                assert!(!report.dropped.is_empty(), "offset {at}: nothing said");
                assert_eq!(std::fs::read(&backup).unwrap(), damaged, "the backup");
                // What stays is the pool as it was at some earlier point.
                let pool = Pool::open(&path).unwrap();
                let state = state_of(&pool);
                assert!(
                    states.contains(&state),
                    "offset {at}: the repaired pool holds no state the pool ever had"
                );
                pool.close().unwrap();
                assert!(check(&path).unwrap().is_sound());
            }
            Err(Error::CannotRepair { .. }) => {
                refused += 1;
                assert_eq!(
                    std::fs::read(&path).unwrap(),
                    damaged,
                    "offset {at}: changed"
                );
            }
            Err(e) => panic!("offset {at}: {e}"),
        }
    }
    (repaired, refused)
}

#[test]
fn a_sound_pool_is_left_alone_and_a_backup_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let pool = Pool::create(&path, &Config::default().size(4 << 20)).unwrap();
    run(&pool, 10);
    let data = pool.header().layout.data.start as usize;
    pool.close().unwrap();
    let backup = dir.path().join("backup");
    let report = repair(&path, &backup).unwrap();
    assert!(report.backup.is_none() && report.dropped.is_empty());
    assert!(!backup.exists());
    // Damage (a byte of the first log block), with a file already where the backup
    // would go: refused, nothing changed.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = data + 64 + bytes[data + 64..].iter().position(|&b| b != 0).unwrap();
    bytes[at] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    std::fs::write(&backup, b"keep me").unwrap();
    assert!(
        !check(&path).unwrap().is_sound(),
        "the flip at {at} is damage"
    );
    assert!(matches!(
        repair(&path, &backup),
        Err(Error::AlreadyExists { .. })
    ));
    assert_eq!(std::fs::read(&backup).unwrap(), b"keep me");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn damaged_user_data_of_an_in_place_pool_with_checksums_is_zeroed_and_said() {
    for engine in [
        EngineKind::Redo,
        EngineKind::Undo,
        EngineKind::Oop,
        EngineKind::Hoop,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool");
        let config = Config::default()
            .engine(engine)
            .size(4 << 20)
            .data_checksums(true);
        let pool = Pool::create(&path, &config).unwrap();
        run(&pool, 50);
        let root: PPtr<Table> = pool.root().unwrap();
        let home = pool.read(|tx| tx.read(root)).unwrap()[0];
        assert_ne!(home, 0);
        pool.close().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[home as usize + 3] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let before = check(&path).unwrap();
        assert!(!before.is_sound(), "{engine}: the damage is not seen");
        // A read meets it as an error, not as data.
        let pool = Pool::open(&path).unwrap();
        let read = pool.read(|tx| {
            let mut buf = [0u8; 64];
            tx.read_bytes(home, &mut buf)
        });
        assert!(
            matches!(read, Err(Error::Checksum { .. })),
            "{engine}: {read:?}"
        );
        pool.close().unwrap();
        let report = repair(&path, dir.path().join("backup")).unwrap();
        assert!(
            report.after.is_sound(),
            "{engine}: {:?}",
            report.after.problems
        );
        assert_eq!(report.dropped.len(), 1, "{engine}: {:?}", report.dropped);
        let pool = Pool::open(&path).unwrap();
        let line = home - home % 64;
        let mut buf = [1u8; 64];
        pool.read(|tx| tx.read_bytes(line, &mut buf)).unwrap();
        // The home line is zeros; on oop and hoop a word whose current copy is in a
        // slot or the log reads as that copy.
        if matches!(engine, EngineKind::Redo | EngineKind::Undo) {
            assert_eq!(buf, [0u8; 64], "{engine}: the damaged line is dropped");
        }
        pool.close().unwrap();
    }
}

/// Flips bytes of the used metadata of an in-place pool (every `step`-th used byte
/// outside user data) and repairs each damaged image: the repair makes it sound, or
/// refuses with the file unchanged. Returns (repaired, refused).
fn repair_in_place_flips(engine: EngineKind, checksums: bool, step: usize) -> (usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let config = Config::default()
        .engine(engine)
        .size(1 << 20)
        .data_checksums(checksums);
    let pool = Pool::create(&path, &config).unwrap();
    run(&pool, 100);
    let mut user = pool.allocations();
    let root = pool.root_range();
    user.push((root.start, root.end - root.start));
    pool.close().unwrap();
    let pristine = std::fs::read(&path).unwrap();
    let in_user = |at: usize| user.iter().any(|&(s, l)| (s..s + l).contains(&(at as u64)));
    let used: Vec<usize> = pristine
        .chunks(4096)
        .enumerate()
        .filter(|(_, page)| page.iter().any(|&b| b != 0))
        .flat_map(|(p, page)| p * 4096..p * 4096 + page.len())
        .filter(|&at| !in_user(at))
        .step_by(step)
        .collect();
    let backup = dir.path().join("backup");
    let (mut repaired, mut refused) = (0, 0);
    for at in used {
        let mut damaged = pristine.clone();
        damaged[at] ^= 0xff;
        std::fs::write(&path, &damaged).unwrap();
        if check(&path).unwrap().is_sound() {
            continue;
        }
        let _ = std::fs::remove_file(&backup);
        match repair(&path, &backup) {
            Ok(report) => {
                assert!(
                    report.after.is_sound(),
                    "{engine} offset {at}: {:?}",
                    report.after.problems
                );
                assert!(
                    !report.dropped.is_empty(),
                    "{engine} offset {at}: {:?}",
                    report.before.problems
                );
                // It opens, and every object still named reads (or is refused, when
                // it was dropped), with no panic.
                let pool = Pool::open(&path).unwrap();
                let root: PPtr<Table> = pool.root().unwrap();
                let _ = pool.read(|tx| {
                    for home in tx.read(root)? {
                        if home != 0 {
                            let mut b = [0u8; 64];
                            let _ = tx.read_bytes(home, &mut b);
                        }
                    }
                    Ok::<_, Error>(())
                });
                pool.close().unwrap();
                repaired += 1;
            }
            Err(e @ Error::CannotRepair { .. }) => {
                if std::env::var("DEBUG_REPAIR").is_ok() {
                    eprintln!("{engine} offset {at}: {e}");
                }
                assert_eq!(
                    std::fs::read(&path).unwrap(),
                    damaged,
                    "{engine} offset {at}"
                );
                refused += 1;
            }
            Err(e) => panic!("{engine} offset {at}: {e}"),
        }
    }
    (repaired, refused)
}

#[test]
fn damaged_metadata_of_in_place_pools_is_repaired_or_refused_unchanged() {
    for engine in [
        EngineKind::Redo,
        EngineKind::Undo,
        EngineKind::Oop,
        EngineKind::Hoop,
    ] {
        for checksums in [false, true] {
            let (repaired, refused) = repair_in_place_flips(engine, checksums, 97);
            eprintln!("{engine} checksums={checksums}: {repaired} repaired, {refused} refused");
            assert!(
                repaired > 0,
                "{engine}: nothing repaired ({refused} refused)"
            );
        }
    }
}
