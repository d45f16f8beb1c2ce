//! A transaction in steady state allocates nothing on the heap: its reads, writes,
//! allocations, frees and commit run on buffers the thread's earlier transactions left
//! (counted by a global allocator that counts the calls of the measuring thread only).
//! That holds for the default mapping (sorted-array partitions); the skip-list mappings
//! allocate a little for epoch-based reclamation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use logheap::{Config, MappingConfig, PPtr, PartitionIndex, Pool};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

fn note_call() {
    // `try_with`: thread-locals may be gone while a thread exits.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = CALLS.try_with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_call();
        // SAFETY: the caller's contract is passed on to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_call();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap allocations made by `f` on this thread.
fn allocations_in(f: impl FnOnce()) -> u64 {
    CALLS.set(0);
    COUNTING.set(true);
    f();
    COUNTING.set(false);
    CALLS.get()
}

type Object = [u64; 16];

/// One transaction of the workload: reads three objects, updates two fields, allocates
/// an object and frees the oldest one it allocated before.
fn step(pool: &Pool, objects: &[PPtr<Object>], ring: &mut [PPtr<Object>], i: usize) {
    let n = objects.len();
    let slot = i % ring.len();
    let old = ring[slot];
    let fresh = pool
        .transaction(|tx| {
            let mut sum = 0;
            for k in 0..3 {
                sum += tx.read(objects[(i * 7 + k * 13) % n])?[k];
            }
            let target = objects[(i * 31) % n];
            let field = PPtr::<u64>::from_offset(target.offset() + 8 * (i as u64 % 16));
            tx.write(field, &sum)?;
            tx.write(PPtr::<u64>::from_offset(target.offset()), &(i as u64))?;
            let fresh = tx.alloc([i as u64; 16])?;
            tx.free(old)?;
            Ok::<_, logheap::Error>(fresh)
        })
        .expect("transaction");
    ring[slot] = fresh;
}

/// Heap allocations of 2,000 steps on a pool of `config` (64 MiB), after 3,000 that
/// warm up: buffers, node caches, mapping partitions and allocator classes grow to their
/// working sizes.
fn steady_state_allocations(config: Config) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(dir.path().join("p.pool"), &config.size(64 << 20)).unwrap();
    let objects: Vec<PPtr<Object>> = pool
        .transaction(|tx| (0..256u64).map(|i| tx.alloc([i; 16])).collect())
        .unwrap();
    let mut ring: Vec<PPtr<Object>> = pool
        .transaction(|tx| (0..64u64).map(|i| tx.alloc([i; 16])).collect())
        .unwrap();
    for i in 0..3000 {
        step(&pool, &objects, &mut ring, i);
    }
    allocations_in(|| {
        for i in 3000..5000 {
            step(&pool, &objects, &mut ring, i);
        }
    })
}

#[test]
fn steady_state_transactions_allocate_nothing() {
    for (name, mapping) in MappingConfig::NAMED {
        let calls = steady_state_allocations(Config::default().mapping(mapping));
        if mapping.two_layer && mapping.index == PartitionIndex::SortedArray {
            assert_eq!(
                calls, 0,
                "{name}: {calls} heap allocations in 2000 transactions"
            );
        } else {
            // Skip-list nodes are retired through crossbeam-epoch, whose per-thread bag
            // of deferred functions, when full (64), moves to a global queue in a new
            // heap block: about one allocation per 20 transactions here.
            assert!(
                calls <= 200,
                "{name}: {calls} heap allocations in 2000 transactions"
            );
        }
    }
}

/// The in-place engines: the same workload allocates nothing either (outside `hoop`'s
/// rare collections).
#[test]
fn steady_state_transactions_allocate_nothing_on_the_in_place_engines() {
    for engine in [
        logheap::EngineKind::Redo,
        logheap::EngineKind::Undo,
        logheap::EngineKind::Oop,
        logheap::EngineKind::Hoop,
    ] {
        let calls = steady_state_allocations(Config::default().engine(engine));
        // hoop's collection (every few thousand transactions here) sizes its buffers
        // to the word table the first time it meets it: a few allocations, kept for
        // the later collections.
        let most = if engine == logheap::EngineKind::Hoop {
            8
        } else {
            0
        };
        assert!(
            calls <= most,
            "{engine}: {calls} heap allocations in 2000 transactions"
        );
    }
}
