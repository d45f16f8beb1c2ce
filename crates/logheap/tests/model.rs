//! Property test: random sequences of allocations, writes, frees, reads, aborted
//! transactions and crashes (reopening a crash image) agree with an in-memory model.

use logheap::media::SimConfig;
use logheap::{Config, EngineKind, Error, Pool};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: usize,
        fill: u8,
    },
    Write {
        obj: usize,
        offset: usize,
        len: usize,
        fill: u8,
    },
    /// Several writes in one transaction, possibly overlapping.
    Batch(Vec<(usize, usize, usize, u8)>),
    Free {
        obj: usize,
    },
    Read {
        obj: usize,
    },
    /// A transaction that writes and allocates, then fails.
    Abort {
        obj: usize,
    },
    /// Crash now, and reopen one of the crash images.
    Crash {
        image: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..3000, any::<u8>()).prop_map(|(size, fill)| Op::Alloc { size, fill }),
        4 => (any::<usize>(), any::<usize>(), 1usize..600, any::<u8>())
            .prop_map(|(obj, offset, len, fill)| Op::Write { obj, offset, len, fill }),
        2 => prop::collection::vec((any::<usize>(), any::<usize>(), 1usize..100, any::<u8>()), 1..12).prop_map(Op::Batch),
        1 => any::<usize>().prop_map(|obj| Op::Free { obj }),
        2 => any::<usize>().prop_map(|obj| Op::Read { obj }),
        1 => any::<usize>().prop_map(|obj| Op::Abort { obj }),
        1 => any::<usize>().prop_map(|image| Op::Crash { image }),
    ]
}

/// Live objects: (home, bytes).
type Model = Vec<(u64, Vec<u8>)>;

fn clamp(model: &Model, obj: usize, offset: usize, len: usize) -> Option<(usize, usize, usize)> {
    if model.is_empty() {
        return None;
    }
    let i = obj % model.len();
    let size = model[i].1.len();
    let offset = offset % size;
    Some((i, offset, len.min(size - offset)))
}

fn check_all(pool: &Pool, model: &Model) -> Result<(), TestCaseError> {
    for (home, bytes) in model {
        let mut back = vec![0u8; bytes.len()];
        pool.read(|tx| tx.read_bytes(*home, &mut back)).unwrap();
        prop_assert!(&back == bytes, "object at {home:#x} differs");
    }
    let mut expected: Vec<(u64, u64)> = model.iter().map(|(h, b)| (*h, b.len() as u64)).collect();
    expected.sort_unstable();
    let found = pool.allocations();
    if pool.header().engine == EngineKind::Log {
        prop_assert_eq!(found, expected);
    } else {
        // The in-place engines report usable sizes.
        prop_assert_eq!(found.len(), expected.len());
        for (f, e) in found.iter().zip(&expected) {
            prop_assert!(
                f.0 == e.0 && f.1 >= e.1,
                "allocation {:?}, expected {:?}",
                f,
                e
            );
        }
    }
    Ok(())
}

fn run(ops: Vec<Op>, config: Config) -> Result<(), TestCaseError> {
    let mut pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
    let mut model: Model = Vec::new();
    for op in ops {
        match op {
            Op::Alloc { size, fill } => {
                let home = pool
                    .transaction(|tx| {
                        let h = tx.alloc_bytes(size as u64)?;
                        tx.write_bytes(h, &vec![fill; size])?;
                        Ok::<_, Error>(h)
                    })
                    .unwrap();
                model.push((home, vec![fill; size]));
            }
            Op::Write {
                obj,
                offset,
                len,
                fill,
            } => {
                let Some((i, offset, len)) = clamp(&model, obj, offset, len) else {
                    continue;
                };
                let home = model[i].0 + offset as u64;
                pool.transaction(|tx| tx.write_bytes(home, &vec![fill; len]))
                    .unwrap();
                model[i].1[offset..offset + len].fill(fill);
            }
            Op::Batch(writes) => {
                let writes: Vec<(usize, usize, usize, u8)> = writes
                    .into_iter()
                    .filter_map(|(o, off, len, fill)| {
                        clamp(&model, o, off, len).map(|(i, off, len)| (i, off, len, fill))
                    })
                    .collect();
                pool.transaction(|tx| {
                    for &(i, off, len, fill) in &writes {
                        tx.write_bytes(model[i].0 + off as u64, &vec![fill; len])?;
                    }
                    Ok::<_, Error>(())
                })
                .unwrap();
                for (i, off, len, fill) in writes {
                    model[i].1[off..off + len].fill(fill);
                }
            }
            Op::Free { obj } => {
                if model.is_empty() {
                    continue;
                }
                let (home, _) = model.swap_remove(obj % model.len());
                pool.transaction(|tx| tx.free(logheap::PPtr::<u8>::from_offset(home)))
                    .unwrap();
            }
            Op::Read { obj } => {
                let Some((i, _, _)) = clamp(&model, obj, 0, 1) else {
                    continue;
                };
                let mut back = vec![0u8; model[i].1.len()];
                pool.read(|tx| tx.read_bytes(model[i].0, &mut back))
                    .unwrap();
                prop_assert!(back == model[i].1);
            }
            Op::Abort { obj } => {
                let target = clamp(&model, obj, 0, 1).map(|(i, _, _)| model[i].0);
                let r: Result<(), Error> = pool.transaction(|tx| {
                    if let Some(h) = target {
                        tx.write_bytes(h, &[0xab; 1])?;
                    }
                    tx.alloc_bytes(100)?;
                    Err(Error::InvalidConfig("deliberate abort".into()))
                });
                prop_assert!(r.is_err());
            }
            Op::Crash { image } => {
                let sim = pool.media().crash_simulator().unwrap();
                let image = sim.with_crash_point(|p| p.image(image % p.len()));
                pool.abandon();
                pool = Pool::open_image(image, &config, SimConfig::default()).unwrap();
                prop_assert!(!pool.was_clean());
                check_all(&pool, &model)?;
            }
        }
    }
    check_all(&pool, &model)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_with_crashes_agree_with_the_model(
        ops in prop::collection::vec(op(), 1..60),
        mapping in 0usize..logheap::MappingConfig::NAMED.len(),
    ) {
        // Reopened pools recover on three threads (the parallel path).
        let config = Config::default()
            .size(4 << 20)
            .chunk_size(4096)
            .mapping(logheap::MappingConfig::NAMED[mapping].1)
            .recovery_threads(3);
        run(ops, config)?;
    }

    #[test]
    fn random_operations_with_crashes_agree_with_the_model_on_the_in_place_engines(
        ops in prop::collection::vec(op(), 1..60),
        which in 0..9usize,
    ) {
        // redo, undo, oop, hoop, redo and undo with 001's fast log, and undo with
        // 001's non-temporal, uncached and adaptive persist policies.
        let names = [
            "redo", "undo", "oop", "hoop", "redo-fastlog", "undo-fastlog", "undo-nt", "undo-uc",
            "undo-adaptive",
        ];
        let config = Config::default()
            .size(4 << 20)
            .engine(names[which].parse::<logheap::EngineConfig>().unwrap());
        run(ops, config)?;
    }
}
