//! The log-structured engine through the public API.

use logheap::{Config, Error, PPtr, Pool};

use logheap::MappingConfig;

/// Reopened pools recover on three threads (the parallel path).
fn config() -> Config {
    Config::default()
        .size(8 << 20)
        .chunk_size(4096)
        .recovery_threads(3)
}

/// A new pool file in a fresh temporary directory (removed when the guard drops).
fn file_pool(config: Config) -> (tempfile::TempDir, std::path::PathBuf, Pool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("test.pool");
    let pool = Pool::create(&path, &config).unwrap();
    (dir, path, pool)
}

/// Runs `test` once per mapping configuration of the paper's ablation.
fn each_mapping(test: impl Fn(Config)) {
    for (_, mapping) in MappingConfig::NAMED {
        test(config().mapping(mapping));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Obj {
    a: u64,
    b: [u8; 120],
}

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Root {
    obj: PPtr<Obj>,
    big: u64,
    counter: u64,
}

#[test]
fn data_survives_clean_close_and_crash() {
    each_mapping(|config| {
        let (_dir, path, pool) = file_pool(config);
        let root: PPtr<Root> = pool.root().unwrap();
        assert_eq!(
            pool.read(|tx| tx.read(root)).unwrap().counter,
            0,
            "the root starts zeroed"
        );
        let obj = pool
            .transaction(|tx| {
                let o = tx.alloc(Obj { a: 1, b: [2; 120] })?;
                tx.write(
                    root,
                    &Root {
                        obj: o,
                        big: 0,
                        counter: 5,
                    },
                )?;
                Ok::<_, Error>(o)
            })
            .unwrap();
        pool.close().unwrap();

        let pool = Pool::open_with(&path, &config).unwrap();
        assert!(pool.was_clean());
        assert_eq!(
            pool.read(|tx| tx.read(obj)).unwrap(),
            Obj { a: 1, b: [2; 120] }
        );
        pool.transaction(|tx| tx.write(logheap::pfield!(obj, Obj, a), &9u64))
            .unwrap();
        pool.abandon(); // a crash: no clean close

        let pool = Pool::open_with(&path, &config).unwrap();
        assert!(!pool.was_clean());
        let r = pool.read(|tx| tx.read(root)).unwrap();
        assert_eq!((r.obj, r.counter), (obj, 5));
        assert_eq!(pool.read(|tx| tx.read(obj)).unwrap().a, 9);
        assert_eq!(pool.allocations(), vec![(obj.offset(), 128)]);
        assert!(pool.stats().log().cloned().unwrap().recovery.transactions >= 2);
    });
}

#[test]
fn partial_overwrites_across_object_boundaries() {
    each_mapping(|config| {
        let pool = Pool::create_sim(&config, Default::default()).unwrap();
        // Two consecutive 64-byte slots of one size class are adjacent in home space.
        let (a, b) = pool
            .transaction(|tx| Ok::<_, Error>((tx.alloc([1u8; 64])?, tx.alloc([2u8; 64])?)))
            .unwrap();
        assert_eq!(b.offset(), a.offset() + 64);
        pool.transaction(|tx| tx.write_bytes(a.offset() + 60, &[9u8; 10]))
            .unwrap();
        pool.transaction(|tx| tx.write_bytes(a.offset() + 2, &[7u8; 3]))
            .unwrap();
        let mut bytes = [0u8; 128];
        pool.read(|tx| tx.read_bytes(a.offset(), &mut bytes))
            .unwrap();
        let mut expected = [1u8; 128];
        expected[64..].fill(2);
        expected[60..70].fill(9);
        expected[2..5].fill(7);
        assert_eq!(bytes, expected);
        // A transaction sees its own writes, over committed data.
        pool.transaction(|tx| {
            tx.write_bytes(a.offset() + 1, &[5u8; 2])?;
            let mut seen = [0u8; 6];
            tx.read_bytes(a.offset(), &mut seen)?;
            assert_eq!(seen, [1, 5, 5, 7, 7, 1]);
            Ok::<_, Error>(())
        })
        .unwrap();
    });
}

#[test]
fn large_objects_span_chunks_and_survive_reopen() {
    each_mapping(|config| {
        let (_dir, path, pool) = file_pool(config);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let home = pool
            .transaction(|tx| {
                let h = tx.alloc_bytes(data.len() as u64)?;
                tx.write_bytes(h, &data)?;
                Ok::<_, Error>(h)
            })
            .unwrap();
        pool.transaction(|tx| tx.write_bytes(home + 70_000, &[0xee; 5000]))
            .unwrap();
        pool.abandon();
        let pool = Pool::open_with(&path, &config).unwrap();
        let mut back = vec![0u8; data.len()];
        pool.read(|tx| tx.read_bytes(home, &mut back)).unwrap();
        let mut expected = data.clone();
        expected[70_000..75_000].fill(0xee);
        assert!(back == expected, "large object differs after reopen");
        assert_eq!(pool.allocations(), vec![(home, 200_000)]);
    });
}

#[test]
fn one_fence_per_write_transaction_and_low_write_amplification() {
    each_mapping(|config| {
        let pool = Pool::create_sim(&config.size(16 << 20), Default::default()).unwrap();
        let objs: Vec<PPtr<Obj>> = (0..100)
            .map(|i| {
                pool.transaction(|tx| tx.alloc(Obj { a: i, b: [0; 120] }))
                    .unwrap()
            })
            .collect();
        let before = pool.media().counters();
        for round in 0..10u8 {
            for &o in &objs {
                pool.transaction(|tx| {
                    tx.write(
                        o,
                        &Obj {
                            a: round as u64,
                            b: [round; 120],
                        },
                    )
                })
                .unwrap();
            }
        }
        let c = pool.media().counters().since(&before);
        assert_eq!(c.write_transactions, 1000);
        assert_eq!(
            c.fences, 1000,
            "exactly one fence per committed write transaction"
        );
        assert_eq!(c.payload_bytes, 128 * 1000);
        let wa = c.write_amplification().unwrap();
        assert!(wa <= 1.3, "write amplification {wa} for 128-byte updates");
        // Read-only transactions issue no fence.
        pool.read(|tx| tx.read(objs[0])).unwrap();
        assert_eq!(pool.media().counters().since(&before).fences, 1000);
        let s = pool.stats();
        assert!(s.fences_per_write_tx > 0.99 && s.write_amplification.is_some());
    });
}

#[test]
fn a_full_pool_fails_the_transaction_and_stays_usable() {
    each_mapping(|config| {
        let (_dir, path, pool) = file_pool(config.size(256 << 10));
        let root: PPtr<Root> = pool.root().unwrap();
        let mut last = 0;
        let err = loop {
            // Each transaction also keeps 512 live bytes: the cleaner reclaims stale
            // data, so only live data fills the pool.
            match pool.transaction(|tx| {
                tx.alloc([1u8; 512])?;
                tx.write(
                    root,
                    &Root {
                        obj: PPtr::null(),
                        big: last + 1,
                        counter: 7,
                    },
                )
            }) {
                Ok(()) => last += 1,
                Err(e) => break e,
            }
            assert!(last < 100_000, "the pool never filled");
        };
        assert!(matches!(err, Error::PoolFull), "{err}");
        assert!(last > 100);
        assert_eq!(pool.read(|tx| tx.read(root)).unwrap().big, last);
        // A failed transaction leaves no allocation behind.
        let before = pool.allocations();
        assert!(
            pool.transaction(|tx| tx.alloc([0u8; 500]).map(|_| ()))
                .is_err()
        );
        assert_eq!(pool.allocations(), before);
        pool.abandon();
        let pool = Pool::open_with(&path, &config).unwrap();
        assert_eq!(pool.read(|tx| tx.read(root)).unwrap().big, last);
    });
}

#[derive(Debug)]
enum AppError {
    #[allow(dead_code)]
    Pool(Error),
    Refused,
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Pool(e)
    }
}

#[test]
fn user_errors_abort_and_come_back_unchanged() {
    each_mapping(|config| {
        let pool = Pool::create_sim(&config, Default::default()).unwrap();
        let root: PPtr<Root> = pool.root().unwrap();
        let r = pool.transaction(|tx| {
            tx.write(
                root,
                &Root {
                    obj: PPtr::null(),
                    big: 1,
                    counter: 1,
                },
            )?;
            tx.alloc([1u8; 100])?;
            Err::<(), _>(AppError::Refused)
        });
        assert!(matches!(r, Err(AppError::Refused)), "{r:?}");
        assert_eq!(pool.read(|tx| tx.read(root)).unwrap().counter, 0);
        assert!(
            pool.allocations().is_empty(),
            "the aborted allocation was released"
        );
        assert_eq!(pool.media().counters().aborts, 1);
    });
}

#[test]
fn invalid_operations_are_refused() {
    each_mapping(|config| {
        let pool = Pool::create_sim(&config, Default::default()).unwrap();
        let root: PPtr<u64> = pool.root().unwrap();
        assert!(matches!(
            pool.read(|tx| tx.write(root, &1)),
            Err(Error::ReadOnly)
        ));
        assert!(matches!(
            pool.read(|tx| tx.alloc(1u64)),
            Err(Error::ReadOnly)
        ));
        assert!(matches!(
            pool.transaction(|tx| tx.free(PPtr::<u64>::from_offset(1 << 21))),
            Err(Error::InvalidFree { .. })
        ));
        assert!(matches!(
            pool.transaction(|tx| tx.read(PPtr::<u64>::null())),
            Err(Error::InvalidRange { .. })
        ));
        assert!(matches!(
            pool.transaction(|tx| tx.write_bytes(1 << 47, &[1])),
            Err(Error::InvalidRange { .. })
        ));
        assert!(matches!(
            pool.transaction(|tx| tx.alloc_bytes(0)),
            Err(Error::InvalidSize(0))
        ));
        assert!(matches!(
            pool.root::<[u8; 8192]>(),
            Err(Error::RootTooLarge { .. })
        ));
        let p = pool.transaction(|tx| tx.alloc(5u64)).unwrap();
        pool.transaction(|tx| tx.free(p)).unwrap();
        assert!(
            matches!(
                pool.transaction(|tx| tx.free(p)),
                Err(Error::InvalidFree { .. })
            ),
            "double free"
        );
        assert!(matches!(
            Pool::create_sim(
                &config.engine(logheap::EngineKind::Alloc),
                Default::default()
            ),
            Err(Error::InvalidConfig(_))
        ));
    });
}

#[test]
fn alloc_and_free_in_one_transaction_leave_nothing() {
    each_mapping(|config| {
        let pool = Pool::create_sim(&config, Default::default()).unwrap();
        let before = pool.media().counters();
        pool.transaction(|tx| {
            let p = tx.alloc([3u8; 300])?;
            tx.write_bytes(p.offset() + 10, &[4; 10])?;
            tx.free(p)
        })
        .unwrap();
        assert!(pool.allocations().is_empty());
        assert_eq!(pool.stats().log().cloned().unwrap().live_log_bytes, 0);
        assert_eq!(
            pool.media().counters().since(&before).fences,
            0,
            "nothing to log"
        );
    });
}

#[test]
fn frees_unmap_and_live_bytes_are_tracked() {
    each_mapping(|config| {
        let pool = Pool::create_sim(&config, Default::default()).unwrap();
        let p = pool.transaction(|tx| tx.alloc([1u8; 1000])).unwrap();
        assert_eq!(pool.stats().log().cloned().unwrap().live_log_bytes, 1000);
        pool.transaction(|tx| tx.write_bytes(p.offset(), &[2u8; 100]))
            .unwrap();
        assert_eq!(
            pool.stats().log().cloned().unwrap().live_log_bytes,
            1000,
            "overwritten bytes are no longer live"
        );
        pool.transaction(|tx| tx.free(p)).unwrap();
        assert_eq!(pool.stats().log().cloned().unwrap().live_log_bytes, 0);
        let mut buf = [9u8; 8];
        pool.read(|tx| tx.read_bytes(p.offset(), &mut buf)).unwrap();
        assert_eq!(buf, [0; 8], "freed memory reads as zero");
    });
}

#[test]
fn stale_bytes_in_free_chunks_do_not_break_recovery() {
    each_mapping(|config| {
        // Small chunks, so most of them are beyond the first batch a new pool formats.
        let config = config.size(4 << 20).chunk_size(4096);
        let (_dir, path, pool) = file_pool(config);
        let data = pool.header().layout.data.clone();
        pool.close().unwrap();
        // Leftovers of a former life: stale bytes in the payload of every chunk (whose
        // headers are zero, as in chunks that left their log), and garbage even in the
        // headers of chunks never formatted.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        for (i, at) in (data.start..data.end).step_by(4096).enumerate() {
            let from = if i < 64 { 64 } else { 0 };
            std::os::unix::fs::FileExt::write_all_at(&f, &[0xab; 4096][from..], at + from as u64)
                .unwrap();
        }
        drop(f);
        let pool = Pool::open_with(&path, &config).unwrap();
        let objs: Vec<PPtr<[u8; 500]>> = (0..600u16)
            .map(|i| pool.transaction(|tx| tx.alloc([i as u8; 500])).unwrap())
            .collect();
        assert!(
            pool.stats().log().cloned().unwrap().chunks_total
                - pool.stats().log().cloned().unwrap().chunks_free
                > 64
        );
        pool.abandon(); // a crash, after the logs went through many chunks
        let pool = Pool::open_with(&path, &config).unwrap();
        assert_eq!(
            pool.stats()
                .log()
                .cloned()
                .unwrap()
                .recovery
                .dropped_transactions,
            0
        );
        for (i, o) in objs.iter().enumerate() {
            assert_eq!(pool.read(|tx| tx.read(*o)).unwrap(), [i as u8; 500]);
        }
        pool.close().unwrap();
        let pool = Pool::open_with(&path, &config).unwrap();
        assert!(pool.was_clean());
        assert_eq!(
            pool.read(|tx| tx.read(objs[599])).unwrap(),
            [599u16 as u8; 500]
        );
    });
}

#[test]
fn freeing_twice_in_one_transaction_is_refused() {
    each_mapping(|config| {
        let pool = Pool::create_sim(&config, Default::default()).unwrap();
        let r = pool.transaction(|tx| {
            let p = tx.alloc(1u64)?;
            tx.free(p)?;
            tx.free(p)
        });
        assert!(matches!(r, Err(Error::InvalidFree { .. })), "{r:?}");
        assert!(pool.allocations().is_empty());
        let p = pool.transaction(|tx| tx.alloc(2u64)).unwrap();
        let r = pool.transaction(|tx| {
            tx.free(p)?;
            tx.free(p)
        });
        assert!(matches!(r, Err(Error::InvalidFree { .. })), "{r:?}");
        assert_eq!(pool.allocations().len(), 1);
        assert!(matches!(
            pool.transaction(|tx| tx.alloc_bytes(1 << 40)),
            Err(Error::PoolFull)
        ));
    });
}

#[test]
fn reopening_resumes_the_logs_instead_of_abandoning_chunks() {
    each_mapping(|config| {
        let (_dir, path, pool) = file_pool(config.size(1 << 20));
        let counter: PPtr<u64> = pool.root().unwrap();
        let free_at_start = pool.stats().log().cloned().unwrap().chunks_free;
        pool.close().unwrap();
        // One small transaction per open, alternating clean closes and crashes.
        for i in 0..100u64 {
            let pool = Pool::open_with(&path, &config).unwrap();
            pool.transaction(|tx| tx.write(counter, &(i + 1))).unwrap();
            if i % 2 == 0 {
                pool.close().unwrap();
            }
        }
        let pool = Pool::open_with(&path, &config).unwrap();
        assert_eq!(pool.read(|tx| tx.read(counter)).unwrap(), 100);
        let used = free_at_start - pool.stats().log().cloned().unwrap().chunks_free;
        assert!(
            used <= 3,
            "{used} chunks used by 100 tiny transactions across 100 opens"
        );
    });
}

#[test]
fn a_dropped_transaction_is_erased_not_met_again() {
    use std::sync::{Arc, Mutex};
    let config = config().size(1 << 20);
    let sim_config = logheap::media::SimConfig {
        max_images_per_fence: 40,
        ..Default::default()
    };
    let pool = Pool::create_sim(&config, sim_config).unwrap();
    let root: PPtr<Root> = pool.root().unwrap();
    pool.transaction(|tx| {
        tx.write(
            root,
            &Root {
                obj: PPtr::null(),
                big: 1,
                counter: 1,
            },
        )
    })
    .unwrap();
    // Keep the crash images of the next commit's fence: some hold part of its blocks.
    let images = Arc::new(Mutex::new(Vec::new()));
    let sink = images.clone();
    let sim = pool.media().crash_simulator().unwrap();
    sim.set_fence_hook(Box::new(move |p| sink.lock().unwrap().extend(p.images())));
    pool.transaction(|tx| {
        tx.alloc([7u8; 3000])?;
        tx.write(
            root,
            &Root {
                obj: PPtr::null(),
                big: 2,
                counter: 2,
            },
        )
    })
    .unwrap();
    sim.take_fence_hook();
    let images = images.lock().unwrap().clone();
    let mut tried = 0;
    for image in images {
        let first = Pool::open_image(image, &config, Default::default()).unwrap();
        if first
            .stats()
            .log()
            .cloned()
            .unwrap()
            .recovery
            .dropped_transactions
            == 0
        {
            continue;
        }
        tried += 1;
        if tried > 5 {
            break;
        }
        assert_eq!(first.read(|tx| tx.read(root)).unwrap().big, 1);
        let persisted = first.media().crash_simulator().unwrap().persisted_image();
        drop(first);
        let second = Pool::open_image(persisted, &config, Default::default()).unwrap();
        assert_eq!(
            second
                .stats()
                .log()
                .cloned()
                .unwrap()
                .recovery
                .dropped_transactions,
            0,
            "the torn commit was met again"
        );
        assert_eq!(second.read(|tx| tx.read(root)).unwrap().big, 1);
    }
    assert!(tried > 0, "no crash image held a partial commit");
}

/// A transaction with more entries than one block can count (65,535) and entries of the
/// largest size: it spans several blocks, survives every sampled crash image of its
/// commit as all or nothing, and reads back whole after a crash and after a clean close.
#[test]
fn the_largest_transactions_fill_blocks_to_their_limits() {
    use std::sync::{Arc, Mutex};
    let config = config().size(64 << 20).chunk_size(2 << 20);
    let sim = logheap::media::SimConfig {
        max_images_per_fence: 8,
        random_images: 2,
        ..Default::default()
    };
    let pool = Pool::create_sim(&config, sim).unwrap();
    let (scattered, big) = pool
        .transaction(|tx| Ok::<_, Error>((tx.alloc_bytes(160_000)?, tx.alloc_bytes(200_000)?)))
        .unwrap();
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let o = outcomes.clone();
    let simulator = pool.media().crash_simulator().unwrap();
    simulator.set_fence_hook(Box::new(move |point| {
        for image in point.images() {
            let p = Pool::open_image(image, &config, Default::default()).unwrap();
            let mut a = vec![0u8; 160_000];
            let mut b = vec![0u8; 200_000];
            p.read(|tx| {
                tx.read_bytes(scattered, &mut a)?;
                tx.read_bytes(big, &mut b)
            })
            .unwrap();
            o.lock().unwrap().push((a, b));
        }
    }));
    // 70,000 one-byte writes two bytes apart: entries that cannot merge. And one write of
    // 200,000 bytes: entries of the largest size.
    let byte = |i: usize| (i % 251) as u8 + 1;
    pool.transaction(|tx| {
        for i in 0..70_000usize {
            tx.write_bytes(scattered + 2 * i as u64, &[byte(i)])?;
        }
        let data: Vec<u8> = (0..200_000).map(byte).collect();
        tx.write_bytes(big, &data)
    })
    .unwrap();
    simulator.take_fence_hook();
    let mut want_a = vec![0u8; 160_000];
    for i in 0..70_000 {
        want_a[2 * i] = byte(i);
    }
    let want_b: Vec<u8> = (0..200_000).map(byte).collect();
    let outcomes = outcomes.lock().unwrap();
    assert!(outcomes.len() >= 4, "{} images", outcomes.len());
    for (a, b) in outcomes.iter() {
        let none = a.iter().all(|&x| x == 0) && b.iter().all(|&x| x == 0);
        let all = *a == want_a && *b == want_b;
        assert!(none || all, "a crash image holds part of the transaction");
    }
    assert!(outcomes.iter().any(|(a, _)| *a == want_a));
    // After a crash, and after a clean close.
    let image = pool.media().crash_simulator().unwrap().persisted_image();
    let reopened = Pool::open_image(image, &config, Default::default()).unwrap();
    let mut a = vec![0u8; 160_000];
    reopened
        .read(|tx| tx.read_bytes(scattered, &mut a))
        .unwrap();
    assert!(a == want_a);
    let media = reopened.media().clone();
    reopened.close().unwrap();
    let image = media.crash_simulator().unwrap().persisted_image();
    let clean = Pool::open_image(image, &config, Default::default()).unwrap();
    assert!(clean.was_clean());
    let mut b = vec![0u8; 200_000];
    assert!(
        !clean
            .read(|tx| Ok::<_, Error>(tx.is_read_only()))
            .map(|r| !r)
            .unwrap()
    );
    clean.read(|tx| tx.read_bytes(big, &mut b)).unwrap();
    assert!(b == want_b);
    assert!(
        !clean
            .transaction(|tx| Ok::<_, Error>(tx.is_read_only()))
            .unwrap()
    );
}

#[test]
fn a_zeroed_allocation_reads_zero_on_every_engine_even_where_a_freed_block_was() {
    for engine in ["log", "redo", "undo", "oop", "hoop"] {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::default()
            .size(8 << 20)
            .engine(engine.parse::<logheap::EngineConfig>().unwrap());
        let pool = Pool::create(dir.path().join("p"), &config).unwrap();
        for round in 0..50u64 {
            let home = pool
                .transaction(|tx| tx.alloc([0xa5u8 ^ round as u8; 200]))
                .unwrap();
            pool.transaction(|tx| tx.free(home)).unwrap();
            let fresh = pool.transaction(|tx| tx.alloc_bytes(200)).unwrap();
            let bytes = pool
                .read(|tx| {
                    let mut b = vec![0u8; 200];
                    tx.read_bytes(fresh, &mut b)?;
                    Ok::<_, Error>(b)
                })
                .unwrap();
            assert!(
                bytes.iter().all(|&b| b == 0),
                "{engine} round {round}: {bytes:?}"
            );
            pool.transaction(|tx| tx.free(PPtr::<u8>::from_offset(fresh)))
                .unwrap();
        }
    }
}

/// The node cache's size is an option: out of range, or on a mapping without the
/// cache, it is refused; in range, a bigger cache holds more of a large working set
/// (its DRAM is counted) and the hit ratio is reported.
#[test]
fn the_node_cache_size_is_an_option_that_is_checked() {
    for bad in [0, 3, (4 << 20) + 4] {
        let config = config().node_cache_entries(bad);
        assert!(
            matches!(
                Pool::create_sim(&config, Default::default()),
                Err(Error::InvalidConfig(_))
            ),
            "{bad} entries"
        );
    }
    let no_cache = config()
        .mapping(MappingConfig::NAMED[2].1)
        .node_cache_entries(1 << 16);
    assert!(!MappingConfig::NAMED[2].1.node_cache);
    assert!(matches!(
        Pool::create_sim(&no_cache, Default::default()),
        Err(Error::InvalidConfig(_))
    ));
    // 20,000 objects read over and over (through the mapping: no home cache): a
    // 64-entry cache misses most, one of 64 K entries keeps them all.
    let run = |entries: usize| {
        let log = logheap::LogOptions::default()
            .chunk_size(4096)
            .home_cache(0)
            .node_cache_entries(entries);
        let config = config().engine(logheap::EngineConfig::Log(log));
        let pool = Pool::create_sim(&config, Default::default()).unwrap();
        let objs: Vec<PPtr<u64>> = (0..20)
            .map(|k| {
                pool.transaction(|tx| (0..1000).map(|i| tx.alloc(k * 1000 + i)).collect())
                    .unwrap()
            })
            .collect::<Vec<Vec<_>>>()
            .concat();
        for round in 0..3 {
            for (i, &o) in objs.iter().enumerate().rev() {
                let v = pool.read(|tx| tx.read(o)).unwrap();
                assert_eq!(v, i as u64, "round {round}");
            }
        }
        pool.stats().log().cloned().unwrap()
    };
    let (small, large) = (run(64), run(1 << 16));
    let (s, l) = (
        small.node_cache_hit_ratio.unwrap(),
        large.node_cache_hit_ratio.unwrap(),
    );
    assert!(l > s + 0.2, "hit ratio {l} with 64 K entries, {s} with 64");
    assert!(large.mapping_dram_bytes > small.mapping_dram_bytes + (1 << 20));
}
