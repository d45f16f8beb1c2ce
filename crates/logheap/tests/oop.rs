//! The out-of-place engines. `oop` (003's EAOOP): copies alternate between home and an
//! update slot, the collector drops a slot at the fourth update, slots survive a
//! reopen, freed words give their slots up, and a damaged slot-chunk list is refused.
//! `hoop`: collections run while threads commit, and lose nothing.

use logheap::EngineStats;
use logheap::media::SimConfig;
use logheap::{Config, EngineKind, Error, PPtr, Pool};

fn config() -> Config {
    Config::default().size(4 << 20).engine(EngineKind::Oop)
}

fn hoop_stats(pool: &Pool) -> logheap::HoopStats {
    match pool.stats().engine_stats {
        EngineStats::Hoop(s) => s,
        other => panic!("not a hoop pool: {other:?}"),
    }
}

fn stats(pool: &Pool) -> logheap::OopStats {
    match pool.stats().engine_stats {
        EngineStats::Oop(s) => s,
        other => panic!("not an oop pool: {other:?}"),
    }
}

#[test]
fn updates_alternate_and_the_collector_drops_the_slot_at_the_fourth() {
    let pool = Pool::create_sim(&config(), SimConfig::default()).unwrap();
    let root: PPtr<u64> = pool.root().unwrap();
    // The root was never written: its first update takes a slot.
    for (n, slots) in [(1u64, 1), (2, 1), (3, 1), (4, 0)] {
        pool.transaction(|tx| tx.write(root, &n)).unwrap();
        assert_eq!(pool.read(|tx| tx.read(root)).unwrap(), n);
        assert_eq!(stats(&pool).update_slots, slots, "after update {n}");
    }
    assert_eq!(stats(&pool).slots_collected, 1);
    // A word in a block the transaction allocates is written home: no slot.
    let p = pool.transaction(|tx| tx.alloc(7u64)).unwrap();
    assert_eq!(stats(&pool).update_slots, 0);
    pool.transaction(|tx| tx.write(p, &8)).unwrap();
    assert_eq!(stats(&pool).update_slots, 1);
    assert_eq!(pool.read(|tx| tx.read(p)).unwrap(), 8);
}

#[test]
fn the_current_copy_in_a_slot_survives_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("oop.pool");
    let pool = Pool::create(&path, &config()).unwrap();
    let root: PPtr<[u64; 4]> = pool.root().unwrap();
    pool.transaction(|tx| tx.write(root, &[1, 2, 3, 4]))
        .unwrap();
    // Bytes of one word only: the rest of the word comes from its current copy.
    pool.transaction(|tx| tx.write_bytes(root.offset() + 9, &[0xee]))
        .unwrap();
    let want = [1, 2 | 0xee << 8, 3, 4];
    assert_eq!(pool.read(|tx| tx.read(root)).unwrap(), want);
    pool.close().unwrap();
    let pool = Pool::open_with(&path, &config()).unwrap();
    assert_eq!(pool.read(|tx| tx.read(root)).unwrap(), want);
    let s = stats(&pool);
    assert_eq!(
        s.slots_recovered, 3,
        "words 0, 2, 3 are current in their slots; word 1's second update went home"
    );
    // The next update of each word goes home and the one after to the slot again.
    pool.transaction(|tx| tx.write(root, &[5, 6, 7, 8]))
        .unwrap();
    pool.transaction(|tx| tx.write(root, &[9, 10, 11, 12]))
        .unwrap();
    pool.close().unwrap();
    let pool = Pool::open_with(&path, &config()).unwrap();
    assert_eq!(pool.read(|tx| tx.read(root)).unwrap(), [9, 10, 11, 12]);
}

#[test]
fn a_freed_word_gives_up_its_slot_and_its_space_is_reused_safely() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("oop.pool");
    let pool = Pool::create(&path, &config()).unwrap();
    for round in 0..20u64 {
        let a = pool.transaction(|tx| tx.alloc([round; 8])).unwrap();
        pool.transaction(|tx| tx.write(a, &[round + 100; 8]))
            .unwrap();
        assert_eq!(stats(&pool).update_slots, 8);
        pool.transaction(|tx| tx.free(a)).unwrap();
        assert_eq!(stats(&pool).update_slots, 0);
        let b = pool.transaction(|tx| tx.alloc([round + 200; 8])).unwrap();
        assert_eq!(pool.read(|tx| tx.read(b)).unwrap(), [round + 200; 8]);
        pool.transaction(|tx| tx.free(b)).unwrap();
    }
    let b = pool.transaction(|tx| tx.alloc([42u64; 8])).unwrap();
    pool.close().unwrap();
    let pool = Pool::open_with(&path, &config()).unwrap();
    assert_eq!(pool.read(|tx| tx.read(b)).unwrap(), [42; 8]);
    assert_eq!(stats(&pool).slots_recovered, 0);
}

/// A closed pool's image with one update slot in use, and the offset of its engine
/// area (the 4 KiB before the user's root).
fn image_with_a_slot() -> (Vec<u8>, usize) {
    let pool = Pool::create_sim(&config(), SimConfig::default()).unwrap();
    let root: PPtr<u64> = pool.root().unwrap();
    pool.transaction(|tx| tx.write(root, &1)).unwrap();
    let media = pool.media().clone();
    pool.close().unwrap();
    let image = media.crash_simulator().unwrap().persisted_image();
    (image, root.offset() as usize - 4096)
}

fn open(image: Vec<u8>) -> Result<Pool, Error> {
    Pool::open_image(image, &config(), SimConfig::default())
}

#[test]
fn a_damaged_slot_chunk_list_is_refused_and_never_panics() {
    let (image, area) = image_with_a_slot();
    let pool = open(image.clone()).unwrap();
    assert_eq!(pool.read(|tx| tx.read(pool.root::<u64>()?)).unwrap(), 1);
    pool.abandon();
    let link = u64::from_le_bytes(image[area + 16..area + 24].try_into().unwrap());
    assert_ne!(link, 0, "the pool has a slot chunk");
    let chunk = link as usize; // file 0: the raw address is the offset
    let mut damaged = Vec::new();
    for bad_link in [link + 4, link + 64 * 1024 * 1024, area as u64 + 64, 1] {
        let mut img = image.clone();
        img[area + 16..area + 24].copy_from_slice(&bad_link.to_le_bytes());
        damaged.push(img);
    }
    // A chunk linking to itself.
    let mut img = image.clone();
    img[chunk + 8..chunk + 16].copy_from_slice(&link.to_le_bytes());
    damaged.push(img);
    // A damaged chunk header.
    let mut img = image.clone();
    img[chunk] ^= 1;
    damaged.push(img);
    for (i, img) in damaged.into_iter().enumerate() {
        assert!(open(img).is_err(), "damage {i} was not refused");
    }
}

#[test]
fn hoop_collects_while_threads_commit_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hoop.pool");
    // A small pool: 16 KiB logs, so the threads fill them and collect many times.
    let config = Config::default().size(1 << 20).engine(EngineKind::Hoop);
    let pool = Pool::create(&path, &config).unwrap();
    let root: PPtr<[u64; 16]> = pool.root().unwrap();
    let (threads, per_thread) = (4u64, 1500u64);
    std::thread::scope(|s| {
        for t in 0..threads {
            let pool = &pool;
            s.spawn(move || {
                for i in 0..per_thread {
                    pool.transaction(|tx| {
                        let mut a = tx.read(root)?;
                        // A counter every thread adds to, and a word of its own.
                        a[0] += 1;
                        a[1 + t as usize] = i + 1;
                        a[8 + (i % 8) as usize] ^= 1 << t;
                        tx.write(root, &a)
                    })
                    .unwrap();
                }
            });
        }
    });
    let s = hoop_stats(&pool);
    assert!(s.collections > 0, "{s:?}");
    let a = pool.read(|tx| tx.read(root)).unwrap();
    assert_eq!(a[0], threads * per_thread);
    for t in 0..threads as usize {
        assert_eq!(a[1 + t], per_thread);
    }
    // 1500 = 8 x 187 + 4: words 8-11 were toggled 188 times by each thread, 12-15 187.
    assert_eq!(a[8..12], [0; 4]);
    assert_eq!(a[12..16], [0b1111; 4]);
    pool.close().unwrap();
    let pool = Pool::open_with(&path, &config).unwrap();
    assert_eq!(pool.read(|tx| tx.read(root)).unwrap(), a);
    assert_eq!(
        hoop_stats(&pool).update_slots,
        0,
        "after an open every word is home"
    );
}
