//! Micro-benchmarks of the hot paths, for each address-mapping configuration of the
//! paper's ablation ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §5.2):
//!
//! - `lookup_hit`: reading 8 bytes just read before (a node-cache hit where caches are on);
//! - `lookup_miss`: reading 8 bytes of one of 100 000 objects in a scattered order (node
//!   caches mostly miss; the partition skip list, or the one big list, is searched);
//! - `commit_1`: a transaction writing one 8-byte field;
//! - `commit_16`: a transaction writing 16 contiguous 8-byte fields (group update merges
//!   them into one log entry and one mapping update).
//!
//! Pools live on `/dev/shm` in `pmem` mode (flush + fence). Run:
//! `cargo bench -p logheap --bench mapping`

use std::hint::black_box;
use std::time::Duration;

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use logheap::{Config, MappingConfig, PPtr, Pool};

const OBJECTS: u64 = 100_000;

struct Fixture {
    _dir: tempfile::TempDir,
    pool: Pool,
    objs: Vec<PPtr<[u64; 16]>>,
}

fn fixture(mapping: MappingConfig) -> Fixture {
    let dir = common::pool_dir();
    let config = Config::default().size(4 << 30).mapping(mapping);
    let pool = Pool::create(dir.path().join("bench.pool"), &config).expect("pool");
    let mut objs = Vec::new();
    for chunk in 0..OBJECTS / 1000 {
        let batch = pool
            .transaction(|tx| {
                (0..1000)
                    .map(|i| tx.alloc([chunk * 1000 + i; 16]))
                    .collect::<Result<Vec<_>, _>>()
            })
            .expect("preload");
        objs.extend(batch);
    }
    Fixture {
        _dir: dir,
        pool,
        objs,
    }
}

fn benches(c: &mut Criterion) {
    for (name, mapping) in MappingConfig::NAMED {
        let f = fixture(mapping);
        let mut group = c.benchmark_group(name);
        let hot = PPtr::<u64>::from_offset(f.objs[42].offset() + 8);
        group.bench_function("lookup_hit", |b| {
            b.iter(|| f.pool.read(|tx| tx.read(black_box(hot))).unwrap())
        });
        let mut k = 0u64;
        group.bench_function("lookup_miss", |b| {
            b.iter(|| {
                k = (k + 7919) % OBJECTS;
                let p = PPtr::<u64>::from_offset(f.objs[k as usize].offset() + 8);
                f.pool.read(|tx| tx.read(black_box(p))).unwrap()
            })
        });
        let mut n = 0u64;
        group.bench_function("commit_1", |b| {
            b.iter(|| {
                n += 1;
                let p = PPtr::<u64>::from_offset(f.objs[(n % OBJECTS) as usize].offset());
                f.pool.transaction(|tx| tx.write(p, &n)).unwrap()
            })
        });
        group.bench_function("commit_16", |b| {
            b.iter(|| {
                n += 1;
                let base = f.objs[(n % OBJECTS) as usize].offset();
                f.pool
                    .transaction(|tx| {
                        for i in 0..16 {
                            tx.write(PPtr::<u64>::from_offset(base + 8 * i), &(n + i))?;
                        }
                        Ok::<_, logheap::Error>(())
                    })
                    .unwrap()
            })
        });
        group.finish();
        let s = f.pool.stats().log().cloned().unwrap();
        eprintln!(
            "{name}: mapping nodes {}, node-cache hit ratio {:?}, mapping DRAM {} bytes",
            s.mapping_nodes, s.node_cache_hit_ratio, s.mapping_dram_bytes
        );
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

criterion_group! {
    name = mapping;
    config = config();
    targets = benches
}
criterion_main!(mapping);
