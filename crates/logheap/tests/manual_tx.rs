//! Transactions ended by hand (`Pool::begin`, for bindings), direct pointers
//! (`Pool::direct`), and `Tx::alloc_from`, `Tx::write_changes` and
//! `Tx::allocation_size`, on every engine.

use logheap::{Config, EngineKind, Error, PPtr, Pool};

const ENGINES: [EngineKind; 5] = [
    EngineKind::Log,
    EngineKind::Redo,
    EngineKind::Undo,
    EngineKind::Oop,
    EngineKind::Hoop,
];

fn pool(engine: EngineKind) -> Pool {
    Pool::create_sim(&Config::default().engine(engine), Default::default()).unwrap()
}

#[test]
fn a_transaction_takes_effect_only_when_committed_by_hand() {
    for engine in ENGINES {
        let pool = pool(engine);
        let root: PPtr<u64> = pool.root().unwrap();
        let mut tx = pool.begin(false);
        tx.write(root, &5).unwrap();
        let fresh = tx.alloc(9u64).unwrap();
        tx.abort();
        assert_eq!(
            pool.read(|tx| tx.read(root)).unwrap(),
            0,
            "{engine:?}: aborted"
        );
        {
            let mut tx = pool.begin(false);
            tx.write(root, &6).unwrap();
        } // dropped: aborted
        assert_eq!(
            pool.read(|tx| tx.read(root)).unwrap(),
            0,
            "{engine:?}: dropped"
        );
        assert!(
            pool.allocations().is_empty(),
            "{engine:?}: {fresh:?} leaked"
        );
        let mut tx = pool.begin(false);
        tx.write(root, &7).unwrap();
        tx.commit().unwrap();
        assert_eq!(
            pool.read(|tx| tx.read(root)).unwrap(),
            7,
            "{engine:?}: committed"
        );
        let mut ro = pool.begin(true);
        assert!(ro.is_read_only());
        assert!(matches!(ro.write(root, &1), Err(Error::ReadOnly)));
        assert_eq!(ro.read(root).unwrap(), 7);
        ro.commit().unwrap();
    }
}

#[test]
fn a_conflict_ends_a_transaction_begun_by_hand() {
    for engine in ENGINES {
        let pool = pool(engine);
        let root: PPtr<u64> = pool.root().unwrap();
        let mut first = pool.begin(false);
        let seen = first.read(root).unwrap();
        // Another transaction changes what `first` read before `first` commits.
        std::thread::scope(|s| {
            s.spawn(|| pool.transaction(|tx| tx.write(root, &3)).unwrap());
        });
        first.write(root, &(seen + 10)).unwrap();
        assert!(
            matches!(first.commit(), Err(Error::Conflict { .. })),
            "{engine:?}: a stale read must not commit"
        );
        assert_eq!(pool.read(|tx| tx.read(root)).unwrap(), 3, "{engine:?}");
    }
}

#[test]
fn direct_pointers_show_committed_bytes_where_objects_live_in_place() {
    for engine in ENGINES {
        let pool = pool(engine);
        let root: PPtr<u64> = pool.root().unwrap();
        pool.transaction(|tx| tx.write(root, &0x1234_5678)).unwrap();
        match pool.direct(root.offset(), 8) {
            Ok(p) => {
                assert!(matches!(engine, EngineKind::Redo | EngineKind::Undo));
                // SAFETY: the pool is open and maps the root's 8 bytes there; no
                // transaction writes them meanwhile.
                let v = unsafe { (p as *const u64).read_unaligned() };
                assert_eq!(v, 0x1234_5678, "{engine:?}");
            }
            Err(Error::NoDirectAccess(kind)) => {
                assert_eq!(kind, engine);
                assert!(!matches!(engine, EngineKind::Redo | EngineKind::Undo));
            }
            Err(e) => panic!("{engine:?}: {e}"),
        }
        if matches!(engine, EngineKind::Redo | EngineKind::Undo) {
            assert!(matches!(pool.direct(0, 8), Err(Error::InvalidRange { .. })));
        }
    }
}

#[test]
fn alloc_from_holds_the_bytes_given() {
    for engine in ENGINES {
        let pool = pool(engine);
        let bytes: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let at = pool.transaction(|tx| tx.alloc_from(&bytes)).unwrap();
        let mut back = vec![0u8; 300];
        pool.read(|tx| tx.read_bytes(at, &mut back)).unwrap();
        assert_eq!(back, bytes, "{engine:?}");
    }
}

#[test]
fn write_changes_stores_only_the_words_that_differ() {
    for engine in ENGINES {
        let pool = pool(engine);
        let old = [1u64; 32];
        let p: PPtr<[u64; 32]> = pool.transaction(|tx| tx.alloc(old)).unwrap();
        let mut new = old;
        new[3] = 30;
        new[20] = 200;
        new[21] = 210;
        let payload = pool.stats().media.payload_bytes;
        pool.transaction(|tx| tx.write_changes(p, &old, &new))
            .unwrap();
        assert_eq!(pool.read(|tx| tx.read(p)).unwrap(), new, "{engine:?}");
        // Three changed words of the 256 bytes.
        let written = pool.stats().media.payload_bytes - payload;
        assert_eq!(written, 24, "{engine:?}");
        // A type whose size is not whole words is refused.
        let q: PPtr<[u8; 12]> = pool.transaction(|tx| tx.alloc([0u8; 12])).unwrap();
        let refused = pool.transaction(|tx| tx.write_changes(q, &[0; 12], &[1; 12]));
        assert!(matches!(refused, Err(Error::InvalidSize(12))), "{engine:?}");
    }
}

#[test]
fn allocation_size_knows_own_published_and_freed_objects() {
    for engine in ENGINES {
        let pool = pool(engine);
        let (at, size_in_tx) = pool
            .transaction(|tx| {
                let at = tx.alloc_bytes(1000)?;
                Ok::<_, Error>((at, tx.allocation_size(at)))
            })
            .unwrap();
        assert!(
            size_in_tx.is_some_and(|s| s >= 1000),
            "{engine:?}: {size_in_tx:?}"
        );
        pool.transaction(|tx| {
            assert!(
                tx.allocation_size(at).is_some_and(|s| s >= 1000),
                "{engine:?}"
            );
            // Not the start of an object.
            assert_eq!(tx.allocation_size(at + 8), None, "{engine:?}");
            tx.free(PPtr::<u8>::from_offset(at))?;
            assert_eq!(tx.allocation_size(at), None, "{engine:?}: freed");
            Ok::<_, Error>(())
        })
        .unwrap();
        assert_eq!(
            pool.transaction(|tx| Ok::<_, Error>(tx.allocation_size(at)))
                .unwrap(),
            None
        );
    }
}
