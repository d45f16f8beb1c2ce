//! Opening and closing a pool: `Pool::open` then `Pool::close` of a 1 GiB pool with a
//! few objects in it, on each of the engines `log`, `redo` and `undo`, on `/dev/shm`.
//! What an application that opens pools often (a tool, a test suite, a server per
//! tenant) pays each time. Run: `cargo bench -p logheap --bench open_close`

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use logheap::{Config, EngineKind, Pool};

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("open_close");
    for engine in [EngineKind::Log, EngineKind::Redo, EngineKind::Undo] {
        let dir = common::pool_dir();
        let path = dir.path().join("open.pool");
        let config = Config::default()
            .size(1 << 30)
            .reserve_space(false)
            .engine(engine);
        let pool = Pool::create(&path, &config).expect("pool");
        for i in 0..100u64 {
            pool.transaction(|tx| tx.alloc_from(&i.to_le_bytes()))
                .expect("object");
        }
        pool.close().expect("close");
        group.bench_function(engine.to_string(), |b| {
            b.iter(|| Pool::open(&path).expect("open").close().expect("close"))
        });
    }
    group.finish();
}

criterion_group! {
    name = open_close;
    config = common::short_runs();
    targets = benches
}
criterion_main!(open_close);
