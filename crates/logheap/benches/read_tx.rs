//! A one-word read-only transaction on each engine: `pool.read(|tx| tx.read(p))` of a
//! `u64`, the fixed cost of a read in logheap where PMDK reads through a pointer with no
//! instrumentation at all (the read-heavy workloads of `logheap bench`,
//! `hashtable-read95` and friends, measure the same gap on whole look-ups).
//!
//! - `hot`: the same word every time (in cache; on `log` a node-cache hit);
//! - `random`: the first word of one of 100 000 objects of 64 bytes allocated beforehand
//!   (in transactions of 1 000), chosen at random each time (6.4 MB of objects: they
//!   stay in this machine's L3, so this is the cost of the lookup path, not of DRAM).
//!
//! Engines `log`, `redo`, `undo`, `oop` and `hoop`, each on a fresh pool on `/dev/shm`
//! (`pmem` durability: nothing here writes, so it does not matter). Run:
//! `cargo bench -p logheap --bench read_tx`

use std::hint::black_box;

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use logheap::{Config, EngineKind, PPtr, Pool};

/// Objects allocated for the `random` benchmark.
const OBJECTS: usize = 100_000;

/// Objects per allocating transaction.
const BATCH: usize = 1_000;

/// An object: 64 bytes, one cache line on the in-place engines' heap.
type Object = [u64; 8];

struct Fixture {
    _dir: tempfile::TempDir,
    pool: Pool,
    objects: Vec<PPtr<Object>>,
    /// Write transactions committed by the setup.
    setup_writes: u64,
}

fn fixture(engine: EngineKind) -> Fixture {
    let dir = common::pool_dir();
    // Generous: 100 000 objects are 6.4 MB; the log engine's log and the in-place
    // engines' logs take a little more. Sparse, so only what is written takes memory.
    let config = Config::default()
        .size(512 << 20)
        .reserve_space(false)
        .engine(engine);
    let pool = Pool::create(dir.path().join("read.pool"), &config).expect("pool");
    let mut objects = Vec::with_capacity(OBJECTS);
    for batch in 0..OBJECTS / BATCH {
        let first = (batch * BATCH) as u64;
        let allocated = pool
            .transaction(|tx| {
                (0..BATCH as u64)
                    .map(|i| tx.alloc([first + i; 8]))
                    .collect::<Result<Vec<_>, _>>()
            })
            .expect("allocations");
        objects.extend(allocated);
    }
    let setup_writes = pool.stats().media.write_transactions;
    Fixture {
        _dir: dir,
        pool,
        objects,
        setup_writes,
    }
}

/// The first word of `object`.
fn word(object: PPtr<Object>) -> PPtr<u64> {
    PPtr::from_offset(object.offset())
}

/// xorshift64: a random sequence at the cost of three shifts.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn benches(c: &mut Criterion) {
    for (name, engine) in [
        ("log", EngineKind::Log),
        ("redo", EngineKind::Redo),
        ("undo", EngineKind::Undo),
        ("oop", EngineKind::Oop),
        ("hoop", EngineKind::Hoop),
    ] {
        let f = fixture(engine);
        let mut group = c.benchmark_group(format!("read_tx/{name}"));
        let hot = word(f.objects[OBJECTS / 2]);
        let want = (OBJECTS / 2) as u64;
        assert_eq!(f.pool.read(|tx| tx.read(hot)).expect("read"), want);
        group.bench_function("hot", |b| {
            b.iter(|| f.pool.read(|tx| tx.read(black_box(hot))).expect("read"))
        });
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        group.bench_function("random", |b| {
            b.iter(|| {
                let i = (next(&mut state) % OBJECTS as u64) as usize;
                let v = f
                    .pool
                    .read(|tx| tx.read(black_box(word(f.objects[i]))))
                    .expect("read");
                debug_assert_eq!(v, i as u64);
                v
            })
        });
        group.finish();
        // Every transaction above was read-only: none of them wrote.
        let media = f.pool.stats().media;
        assert_eq!(
            media.write_transactions, f.setup_writes,
            "{name}: a read wrote"
        );
        assert!(
            media.transactions > f.setup_writes,
            "{name}: reads are counted"
        );
        f.pool.close().expect("close");
    }
}

criterion_group! {
    name = read_tx;
    config = common::short_runs();
    targets = benches
}
criterion_main!(read_tx);
