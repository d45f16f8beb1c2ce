//! `Pool::compact` on every engine: the log engine copies its live data together; the
//! in-place engines, which keep no log of data, punch their heap's free pages out.

use logheap::{Config, EngineKind, Pool};

#[test]
fn compact_on_an_in_place_engine_punches_the_free_space_out() {
    for engine in [
        EngineKind::Redo,
        EngineKind::Undo,
        EngineKind::Oop,
        EngineKind::Hoop,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::default().size(32 << 20).engine(engine);
        let pool = Pool::create(dir.path().join("p"), &config).unwrap();
        // 8 MiB of 64 KiB objects, then all but one freed: whole free pages.
        let mut homes = Vec::new();
        for _ in 0..128 {
            homes.push(pool.transaction(|tx| tx.alloc_bytes(64 << 10)).unwrap());
        }
        for &home in &homes[1..] {
            pool.transaction(|tx| tx.free(logheap::PPtr::<u8>::from_offset(home)))
                .unwrap();
        }
        let c = pool.compact();
        let d = c
            .defragmentation
            .unwrap_or_else(|| panic!("{engine}: tmpfs punches holes"));
        assert!(d.punched_bytes >= 4 << 20, "{engine}: {d:?}");
        assert_eq!(c.chunks_before, 0, "{engine}: no log chunks");
        // The pool goes on: the survivor reads back, new objects fit.
        let kept = homes[0];
        pool.transaction(|tx| {
            tx.write_bytes(kept, &[7; 8])?;
            tx.alloc_bytes(64 << 10).map(|_| ())
        })
        .unwrap();
        let mut b = [0u8; 8];
        pool.read(|tx| tx.read_bytes(kept, &mut b)).unwrap();
        assert_eq!(b, [7; 8], "{engine}");
        pool.close().unwrap();
    }
}

#[test]
fn compact_on_the_log_engine_reports_chunks_not_holes() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path().join("p"), &Config::default().size(16 << 20)).unwrap();
    let root = pool.root::<u64>().unwrap();
    for i in 0..100u64 {
        pool.transaction(|tx| tx.write(root, &i)).unwrap();
    }
    let c = pool.compact();
    assert!(c.defragmentation.is_none());
    assert!(c.chunks_before >= c.chunks_after);
    pool.close().unwrap();
}
