//! `Tx::alloc_from`, `Tx::write_changes` and `Tx::allocation_size` on every engine.

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
