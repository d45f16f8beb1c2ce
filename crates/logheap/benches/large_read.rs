//! Reading a large value in a read-only transaction: `Tx::read_bytes` into a buffer the
//! caller keeps (a copy) against `Tx::read_with`, which on the `log` engine hands over
//! the bytes where they lie in the log (no copy) and elsewhere copies into the
//! transaction's buffer. Each read sums the value's bytes, so both do the same work on
//! them. Values of 1 KiB and 16 KiB, each written whole in one transaction; engines
//! `log` and `redo`, on `/dev/shm`. Run: `cargo bench -p logheap --bench large_read`

use std::hint::black_box;

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use logheap::{Config, EngineKind, Pool};

fn sum(bytes: &[u8]) -> u64 {
    bytes.iter().map(|&b| u64::from(b)).sum()
}

fn benches(c: &mut Criterion) {
    for (name, engine) in [("log", EngineKind::Log), ("redo", EngineKind::Redo)] {
        let dir = common::pool_dir();
        let config = Config::default()
            .size(64 << 20)
            .reserve_space(false)
            .engine(engine);
        let pool = Pool::create(dir.path().join("large.pool"), &config).expect("pool");
        let mut group = c.benchmark_group(format!("large_read/{name}"));
        for len in [1usize << 10, 16 << 10] {
            let value: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let want = sum(&value);
            let home = pool.transaction(|tx| tx.alloc_from(&value)).expect("value");
            let mut buf = vec![0u8; len];
            group.bench_function(format!("read_bytes/{len}"), |b| {
                b.iter(|| {
                    let s = pool
                        .read(|tx| {
                            tx.read_bytes(black_box(home), &mut buf)?;
                            Ok::<_, logheap::Error>(sum(&buf))
                        })
                        .expect("read");
                    assert_eq!(s, want);
                })
            });
            group.bench_function(format!("read_with/{len}"), |b| {
                b.iter(|| {
                    let s = pool
                        .read(|tx| tx.read_with(black_box(home), len, sum))
                        .expect("read");
                    assert_eq!(s, want);
                })
            });
        }
        group.finish();
        let in_place = pool.stats().media.reads_in_place;
        assert_eq!(
            in_place > 0,
            engine == EngineKind::Log,
            "{name}: {in_place}"
        );
        pool.close().expect("close");
    }
}

criterion_group! {
    name = large_read;
    config = common::short_runs();
    targets = benches
}
criterion_main!(large_read);
