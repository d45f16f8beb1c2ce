//! Transactions ended by hand (`Pool::begin`, for bindings) and direct pointers
//! (`Pool::direct`), on every engine.

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
