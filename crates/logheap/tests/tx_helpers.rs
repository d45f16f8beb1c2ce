//! `Tx::alloc_from` and `Tx::write_changes` on every engine.

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
