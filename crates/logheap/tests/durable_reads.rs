//! Lock-free readers racing writers on the same partitions never see a torn, stale or
//! not-yet-durable mapping.

use std::sync::atomic::{AtomicBool, Ordering};

use logheap::media::SimConfig;
use logheap::{Config, MappingConfig, PPtr, Pool};

const OBJECTS: usize = 24;
const SIZE: usize = 192;

/// Writers rewrite whole objects (in pieces that split older mappings) with a stamp
/// that grows per object; readers check each object holds one stamp (not torn) that
/// never goes backwards (not stale).
#[test]
fn racing_readers_see_no_torn_or_stale_object() {
    for (_, mapping) in MappingConfig::NAMED {
        eprintln!("mapping {mapping}");
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::create(
            dir.path().join("r.pool"),
            &Config::default().size(64 << 20).mapping(mapping),
        )
        .unwrap();
        // Consecutive 192-byte objects: a few 4 KiB partitions, shared by all threads.
        let objs: Vec<u64> = (0..OBJECTS)
            .map(|_| pool.transaction(|tx| tx.alloc_bytes(SIZE as u64)).unwrap())
            .collect();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let mut writers = Vec::new();
            for w in 0..2u64 {
                let (pool, objs) = (&pool, &objs);
                writers.push(s.spawn(move || {
                    for i in 0..1500u64 {
                        let h = objs[((i * 7 + w * 5) % OBJECTS as u64) as usize];
                        let split = 8 * (1 + (i % 20) as usize);
                        pool.transaction(|tx| {
                            let stamp = tx.read(PPtr::<u64>::from_offset(h))? + 1;
                            let bytes = [stamp as u8; SIZE];
                            // Two pieces (and a rewrite of the middle): splits old nodes.
                            tx.write_bytes(h + 8, &bytes[8..split])?;
                            tx.write_bytes(h + split as u64, &bytes[split..])?;
                            tx.write_bytes(h + 40, &bytes[40..72])?;
                            tx.write(PPtr::<u64>::from_offset(h), &stamp)
                        })
                        .unwrap();
                    }
                }));
            }
            for _ in 0..2 {
                let (pool, objs, stop) = (&pool, &objs, &stop);
                s.spawn(move || {
                    let mut last = [0u64; OBJECTS];
                    let mut i = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let k = i % OBJECTS;
                        let mut buf = [0u8; SIZE];
                        pool.read(|tx| tx.read_bytes(objs[k], &mut buf)).unwrap();
                        let stamp = u64::from_le_bytes(buf[..8].try_into().unwrap());
                        assert!(stamp >= last[k], "stale read: {stamp} after {}", last[k]);
                        last[k] = stamp;
                        if stamp > 0 {
                            assert!(
                                buf[8..].iter().all(|&b| b == stamp as u8),
                                "torn read of stamp {stamp}"
                            );
                        }
                        i += 1;
                    }
                });
            }
            // Let the readers run until the writers are done (or one failed).
            for w in writers {
                let outcome = w.join();
                if outcome.is_err() {
                    stop.store(true, Ordering::Relaxed);
                    panic!("{mapping}: a writer failed");
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}

/// A reader that sees a value must find it in the persisted image: what a transaction
/// can read has to be durable already.
#[test]
fn readers_only_see_durable_data() {
    let config = Config::default().size(1 << 20).chunk_size(4096);
    let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
    let counter: PPtr<u64> = pool.root().unwrap();
    let sim = pool.media().crash_simulator().unwrap();
    let done = AtomicBool::new(false);
    let mut not_durable = 0;
    let mut reads = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..300 {
                pool.transaction(|tx| {
                    let n = tx.read(counter)?;
                    tx.write(counter, &(n + 1))
                })
                .unwrap();
            }
            done.store(true, Ordering::Relaxed);
        });
        loop {
            let finished = done.load(Ordering::Relaxed);
            let seen = pool.read(|tx| tx.read(counter)).unwrap();
            let image = sim.persisted_image();
            let recovered =
                Pool::open_image(image, &Config::default(), SimConfig::default()).unwrap();
            let durable = recovered.read(|tx| tx.read(counter)).unwrap();
            reads += 1;
            if durable < seen {
                not_durable += 1;
            }
            if finished {
                break;
            }
        }
    });
    assert_eq!(
        not_durable, 0,
        "{not_durable} of {reads} reads saw data not yet durable"
    );
}

/// A small write in the middle of a large mapping node splits it; readers of the
/// untouched tail (whose stripes the writer does not lock) must never find it unmapped.
#[test]
fn splitting_a_node_never_hides_its_tail_from_readers() {
    for (_, mapping) in MappingConfig::NAMED {
        let pool = Pool::create_sim(
            &Config::default().size(32 << 20).mapping(mapping),
            SimConfig::default(),
        )
        .unwrap();
        let big = pool
            .transaction(|tx| {
                let h = tx.alloc_bytes(4096)?;
                tx.write_bytes(h, &[0x5a; 4096])?;
                Ok::<_, logheap::Error>(h)
            })
            .unwrap();
        let stop = AtomicBool::new(false);
        let reading = AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut tail = [0u8; 64];
                    pool.read(|tx| tx.read_bytes(big + 3000, &mut tail))
                        .unwrap();
                    assert_eq!(
                        tail, [0x5a; 64],
                        "{mapping}: the tail of a split node read as unmapped"
                    );
                    reads += 1;
                    reading.store(true, Ordering::Relaxed);
                }
                reads
            });
            // The writer starts once the reader runs (on a loaded machine it may not
            // get a core before the writes are done).
            while !reading.load(Ordering::Relaxed) && !reader.is_finished() {
                std::thread::yield_now();
            }
            for i in 0..3000u64 {
                // Rewrite the whole object now and then, so there is a big node to split.
                if i % 50 == 0 {
                    pool.transaction(|tx| tx.write_bytes(big, &[0x5a; 4096]))
                        .unwrap();
                }
                pool.transaction(|tx| tx.write_bytes(big + 100 + (i % 64) * 8, &[0x5a; 8]))
                    .unwrap();
            }
            stop.store(true, Ordering::Relaxed);
            assert!(reader.join().unwrap() > 0);
        });
    }
}
