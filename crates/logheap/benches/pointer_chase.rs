//! Pointer chasing through a persistent heap in its two addressing modes (004: "lazy
//! swizzling" of offsets against a "constant virtual address"):
//!
//! - `relative`: each node holds the next node's [`PAddr`]; a hop resolves it against
//!   the heap's mapping ([`PersistentHeap::resolve`]: a file and bounds check and an add);
//! - `fixed`: the heap is mapped at the address in its header, so each node also holds
//!   the next node's native address, valid at every open; a hop is one load;
//! - `checked`: the `PAddr` is followed through [`PersistentHeap::read_u64`], which checks
//!   that the word lies in an allocated block's segment (the safe API's cost).
//!
//! One list of 64-byte nodes, linked in a random order, serves all three, so they touch
//! the same lines; with 10 K nodes it stays in cache (the cost of the hop itself), with
//! 1 M nodes (64 MiB) every hop misses (memory latency dominates). The heap lives on
//! `/dev/shm`. Run: `cargo bench -p logheap --bench pointer_chase`

use std::hint::black_box;
use std::time::Duration;

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use logheap::MapAddress;
use logheap::alloc::{HeapOptions, PAddr, PersistentHeap};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// Bytes of a node: the next node's `PAddr`, its native address, and padding to a line.
const NODE: u64 = 64;

struct List {
    _dir: tempfile::TempDir,
    heap: PersistentHeap,
    head: PAddr,
    nodes: u64,
}

fn list(nodes: u64) -> List {
    let dir = common::pool_dir();
    let heap = PersistentHeap::create(
        dir.path().join("chase.heap"),
        &HeapOptions {
            size: (nodes * NODE * 2).max(64 << 20),
            root_size: (nodes * 8).next_multiple_of(64),
            arenas: 1,
            map_address: MapAddress::Fixed,
            ..HeapOptions::default()
        },
    )
    .expect("heap");
    let slot = |i: u64| heap.root().checked_add(8 * i).expect("root slot");
    let mut addrs: Vec<PAddr> = (0..nodes)
        .map(|i| heap.allocate_into(slot(i), NODE).expect("node"))
        .collect();
    addrs.shuffle(&mut ChaCha8Rng::seed_from_u64(7));
    for (i, &a) in addrs.iter().enumerate() {
        let (next, native) = match addrs.get(i + 1) {
            Some(&n) => (n.raw(), heap.direct(n, NODE).expect("node") as u64),
            None => (0, 0),
        };
        heap.write_u64(a, next).expect("store");
        heap.write_u64(a.checked_add(8).expect("word"), native)
            .expect("store");
        heap.persist(a, 16).expect("persist");
    }
    List {
        _dir: dir,
        head: addrs[0],
        heap,
        nodes,
    }
}

fn relative(l: &List) -> u64 {
    let mut p = l.head;
    let mut hops = 0;
    while let Some(node) = l.heap.resolve(p) {
        // SAFETY: `resolve` checked that `p` lies inside the heap's mapping, and every
        // node is an allocated, 8-byte aligned block of 64 bytes.
        p = PAddr::from_raw(unsafe { (node as *const u64).read() });
        hops += 1;
        if p.is_null() {
            break;
        }
    }
    hops
}

fn fixed(l: &List) -> u64 {
    let mut p = l.heap.direct(l.head, NODE).expect("head") as *const u64;
    let mut hops = 0;
    while !p.is_null() {
        // SAFETY: `p` is a node's native address, written by `list` for this mapping
        // (the heap is mapped at its fixed address), pointing at an allocated block.
        p = unsafe { p.add(1).read() } as *const u64;
        hops += 1;
    }
    hops
}

fn checked(l: &List) -> u64 {
    let mut p = l.head;
    let mut hops = 0;
    while !p.is_null() {
        p = PAddr::from_raw(l.heap.read_u64(p).expect("node"));
        hops += 1;
    }
    hops
}

fn bench(c: &mut Criterion) {
    for nodes in [10_000u64, 1_000_000] {
        let l = list(nodes);
        assert_eq!(
            (relative(&l), fixed(&l), checked(&l)),
            (nodes, nodes, nodes)
        );
        let mut g = c.benchmark_group(format!("pointer_chase_{nodes}"));
        g.throughput(Throughput::Elements(l.nodes));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(2));
        g.bench_function("relative", |b| b.iter(|| black_box(relative(&l))));
        g.bench_function("fixed", |b| b.iter(|| black_box(fixed(&l))));
        g.bench_function("checked", |b| b.iter(|| black_box(checked(&l))));
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
