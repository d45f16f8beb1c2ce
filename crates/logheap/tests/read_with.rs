//! `Tx::read_with`: the same bytes as `Tx::read_bytes` on every engine, handed over in
//! place (no copy) where the log engine holds a range in one piece, and never a torn or
//! reclaimed value while writers rewrite, free and reallocate what readers hold.

use std::sync::atomic::{AtomicBool, Ordering};

use logheap::{Config, EngineKind, PPtr, Pool};

fn engines() -> impl Iterator<Item = EngineKind> {
    EngineKind::ALL
        .into_iter()
        .filter(|&e| e != EngineKind::Alloc)
}

fn pool(engine: EngineKind, size: u64) -> Pool {
    Pool::create_sim(
        &Config::default().engine(engine).size(size),
        Default::default(),
    )
    .unwrap()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

#[test]
fn read_with_sees_what_read_bytes_sees_on_every_engine() {
    for engine in engines() {
        let pool = pool(engine, 64 << 20);
        let sizes = [1usize, 7, 8, 48, 64, 100, 1000, 4096, 10_000];
        let homes: Vec<u64> = pool
            .transaction(|tx| {
                sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| tx.alloc_from(&pattern(i as u8, n)))
                    .collect()
            })
            .unwrap();
        // A later transaction rewrites part of the last object: the log then holds it in
        // three pieces.
        let last = *homes.last().unwrap();
        pool.transaction(|tx| tx.write_bytes(last + 100, &[0xEE; 50]))
            .unwrap();
        let before = pool.stats().media.reads_in_place;
        for read_only in [true, false] {
            let run = |tx: &mut logheap::Tx<'_>| {
                for (&home, &n) in homes.iter().zip(&sizes) {
                    for (from, len) in [(0, n), (0, n / 2), (n / 3, n - n / 3), (n - 1, 1)] {
                        let mut copy = vec![0u8; len];
                        tx.read_bytes(home + from as u64, &mut copy)?;
                        let seen = tx.read_with(home + from as u64, len, |b| b.to_vec())?;
                        assert_eq!(seen, copy, "{engine:?} {n} {from}+{len}");
                    }
                }
                assert_eq!(tx.read_with(homes[0], 0, |b| b.len())?, 0);
                Ok::<_, logheap::Error>(())
            };
            if read_only {
                pool.read(run).unwrap();
            } else {
                pool.transaction(run).unwrap();
            }
        }
        let in_place = pool.stats().media.reads_in_place - before;
        if engine == EngineKind::Log {
            // Every whole, untouched object of both passes, at least.
            assert!(
                in_place >= 2 * (sizes.len() as u64 - 1),
                "{engine:?}: {in_place}"
            );
        } else {
            assert_eq!(in_place, 0, "{engine:?} copies");
        }
        // A writer's own writes are seen, in place or not.
        pool.transaction(|tx| {
            let home = homes[5];
            tx.write_bytes(home + 10, &[7; 20])?;
            let seen = tx.read_with(home, 100, |b| b.to_vec())?;
            let mut want = pattern(5, 100);
            want[10..30].fill(7);
            assert_eq!(seen, want, "{engine:?}: own writes");
            let fresh = tx.alloc_from(&[3; 300])?;
            assert_eq!(tx.read_with(fresh, 300, |b| b.to_vec())?, vec![3; 300]);
            Ok::<_, logheap::Error>(())
        })
        .unwrap();
        // A range outside the home space is refused, as by `read_bytes`.
        assert!(matches!(
            pool.read(|tx| tx.read_with(0, 8, |_| ())),
            Err(logheap::Error::InvalidRange { .. })
        ));
    }
}

/// Values of `LEN` bytes, each all one byte, behind a root pointer: writers rewrite them
/// in place, or free them and point the root at a new one, in a pool small enough that
/// the log engine's cleaner reclaims chunks while readers hold values in place.
#[test]
fn values_read_in_place_are_never_torn_or_reclaimed_under_writers() {
    const LEN: usize = 2048;
    const SLOTS: u64 = 8;
    for engine in engines() {
        let pool = pool(engine, 8 << 20);
        let roots: PPtr<[u64; SLOTS as usize]> = pool.root().unwrap();
        pool.transaction(|tx| {
            let mut r = [0u64; SLOTS as usize];
            for (i, slot) in r.iter_mut().enumerate() {
                *slot = tx.alloc_from(&[i as u8; LEN])?;
            }
            tx.write(roots, &r)
        })
        .unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let writer = s.spawn(|| {
                for round in 0..6000u32 {
                    let slot = u64::from(round) % SLOTS;
                    let fill = (round % 251) as u8;
                    pool.transaction(|tx| {
                        let at = PPtr::<u64>::from_offset(roots.offset() + 8 * slot);
                        let old = tx.read(at)?;
                        if round % 3 == 0 {
                            tx.free(PPtr::<u8>::from_offset(old))?;
                            let fresh = tx.alloc_from(&[fill; LEN])?;
                            tx.write(at, &fresh)
                        } else {
                            tx.write_bytes(old, &[fill; LEN])
                        }
                    })
                    .unwrap();
                }
                stop.store(true, Ordering::Relaxed);
            });
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let mut reads = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            for slot in 0..SLOTS {
                                let uniform = pool
                                    .read(|tx| {
                                        let at = tx.read(PPtr::<u64>::from_offset(
                                            roots.offset() + 8 * slot,
                                        ))?;
                                        tx.read_with(at, LEN, |b| b.iter().all(|&x| x == b[0]))
                                    })
                                    .unwrap();
                                assert!(uniform, "{engine:?}: a torn value");
                                reads += 1;
                            }
                        }
                        reads
                    })
                })
                .collect();
            writer.join().unwrap();
            for r in readers {
                assert!(r.join().unwrap() > 0);
            }
        });
        if engine == EngineKind::Log {
            let stats = pool.stats();
            assert!(stats.media.reads_in_place > 0);
            assert!(
                stats.log().unwrap().chunks_cleaned > 0,
                "the cleaner reclaimed nothing: the test did not test it"
            );
        }
    }
}
