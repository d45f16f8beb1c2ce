//! `alloc-batch` (issue 11's allocation-flush comparison, 004): persistence traffic per
//! allocation and free when a transaction does many of them, against the persistent
//! heap's standalone calls.
//!
//! Each thread owns two groups of [`RunSpec::alloc_batch`] pointer slots in the root.
//! Operation `i` of a thread works on group `i % 2`: it frees every block in the group
//! (after the first pass) and allocates a new block of a size drawn uniformly from
//! [`MIN_SIZE`, `MAX_SIZE`] into each slot. On the transactional engines (`log`, `redo`,
//! `undo`, `oop`) one operation is one transaction; on the persistent heap's standalone calls
//! (`alloc`: metadata in place, 002; `alloc-log`: DRAM state and a metadata log, 004) it
//! is `alloc_batch` durable `deallocate` and `allocate_into` calls. So a batch of 1
//! compares one allocation per transaction with one call, and batches of 8 and 64 show
//! how much of the metadata traffic a transaction shares among its allocations (004
//! claims 8x fewer cache flushes for its allocator metadata log).
//!
//! The figures are per block operation (one allocation or one free): `fences_per_tx`,
//! `lines_flushed_per_tx` and `media_bytes_per_tx` of the result are divided by the
//! block operations, and `ops_per_s` counts them too; `tx_per_s` is operations
//! (transactions, or batches of calls) per second.

use logheap::alloc::{HeapOptions, PAddr, PersistentHeap};
use logheap::{MediaConfig, MediaCounters, PPtr, Pool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::alloc_bench::{ALLOC, ALLOC_LOG, is_persistent_heap, policy_of};
use crate::harness::{RunResult, RunSpec, config_for, pool_dir, run_timed};

/// The smallest block asked for.
pub const MIN_SIZE: u64 = 64;
/// The largest block asked for.
pub const MAX_SIZE: u64 = 256;
/// The allocations per transaction the bench runs unless told (`--alloc-batch`).
pub const DEFAULT_BATCHES: [usize; 3] = [1, 8, 64];

/// The engines `alloc-batch` runs on by default: the transactional engines and the
/// persistent heap's standalone calls.
pub fn engines() -> [&'static str; 6] {
    [ALLOC, ALLOC_LOG, "log", "redo", "undo", "oop"]
}

/// The block sizes of one thread's operations, in order: `ops x batch` of them.
fn sizes(seed: u64, thread: usize, ops: u64, batch: usize) -> Vec<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (thread as u64 + 1) << 32);
    (0..ops * batch as u64)
        .map(|_| rng.random_range(MIN_SIZE..=MAX_SIZE))
        .collect()
}

/// Operations per thread: `spec.ops` block operations over all threads, each operation
/// doing `batch` allocations and (but for the first two) `batch` frees; at least 2.
fn ops_per_thread(spec: &RunSpec, threads: usize, batch: usize) -> u64 {
    (spec.ops / threads as u64 / (2 * batch as u64)).max(2)
}

/// Runs `alloc-batch` on `spec.engine`.
pub fn run(spec: &RunSpec, phase: &dyn Fn(&str)) -> Result<RunResult, Box<dyn std::error::Error>> {
    let batch = spec.alloc_batch.max(1);
    let threads = spec.threads.max(1);
    let ops = ops_per_thread(spec, threads, batch);
    let slots_per_thread = 2 * batch as u64;
    let root_size = (threads as u64 * slots_per_thread * 8).next_multiple_of(64);
    // Every live block at its largest, plus room for the allocator's classes and logs.
    let pool_size = (threads as u64 * slots_per_thread * MAX_SIZE * 8).max(64 << 20);
    let sizes: Vec<Vec<u64>> = (0..threads)
        .map(|t| sizes(spec.seed, t, ops, batch))
        .collect();
    // Block operations: every operation allocates `batch`; all but each thread's first
    // two also free `batch`.
    let block_ops = threads as u64 * batch as u64 * (2 * ops - 2);
    let dir = pool_dir(spec)?;
    phase(&format!("measuring {ops} batches of {batch} per thread"));
    let (seconds, counters) = if is_persistent_heap(&spec.engine) {
        let heap = PersistentHeap::create(
            dir.path().join("heap"),
            &HeapOptions {
                size: pool_size,
                arenas: threads as u32,
                root_size,
                media: MediaConfig {
                    emulation: spec.emulation,
                    ..MediaConfig::default()
                },
                metadata: policy_of(&spec.engine),
                ..HeapOptions::default()
            },
        )?;
        let before = heap.media().counters();
        let seconds = run_timed(threads, |t| -> Result<(), logheap::Error> {
            let first = t as u64 * slots_per_thread;
            for (i, chunk) in sizes[t].chunks(batch).enumerate() {
                let group = first + (i as u64 % 2) * batch as u64;
                for (s, &size) in chunk.iter().enumerate() {
                    let dst = heap
                        .root()
                        .checked_add((group + s as u64) * 8)
                        .expect("slots are in the root");
                    if !PAddr::from_raw(heap.read_u64(dst)?).is_null() {
                        heap.deallocate(dst)?;
                    }
                    heap.allocate_into(dst, size)?;
                }
            }
            Ok(())
        })?;
        let counters = heap.media().counters().since(&before);
        heap.close()?;
        (seconds, counters)
    } else {
        let mut config = config_for(&spec.engine)?
            .size(pool_size)
            .root_size(root_size)
            .reserve_space(false);
        if let Some(e) = spec.emulation {
            config = config.emulation(e);
        }
        let pool = Pool::create(dir.path().join("bench.pool"), &config)?;
        let root = pool.root::<u64>()?.offset();
        let before = pool.media().counters();
        let seconds = run_timed(threads, |t| -> Result<(), logheap::Error> {
            let first = root + t as u64 * slots_per_thread * 8;
            for (i, chunk) in sizes[t].chunks(batch).enumerate() {
                let group = first + (i as u64 % 2) * batch as u64 * 8;
                pool.transaction(|tx| {
                    for (s, &size) in chunk.iter().enumerate() {
                        let slot = PPtr::<u64>::from_offset(group + s as u64 * 8);
                        let old = tx.read(slot)?;
                        if old != 0 {
                            tx.free(PPtr::<u8>::from_offset(old))?;
                        }
                        let block = tx.alloc_bytes(size)?;
                        tx.write(slot, &block)?;
                    }
                    Ok::<(), logheap::Error>(())
                })?;
            }
            Ok(())
        })?;
        let counters = pool.media().counters().since(&before);
        pool.close()?;
        (seconds, counters)
    };
    let batches = threads as u64 * ops;
    Ok(result(
        spec,
        batch,
        threads,
        seconds,
        (batches, block_ops),
        &counters,
    ))
}

/// The figures of a run: `batches` operations (transactions, or batches of calls) of
/// `block_ops` allocations and frees in all.
fn result(
    spec: &RunSpec,
    batch: usize,
    threads: usize,
    seconds: f64,
    (batches, block_ops): (u64, u64),
    c: &MediaCounters,
) -> RunResult {
    let per_op = |x: u64| Some(x as f64 / block_ops.max(1) as f64);
    RunResult {
        ops: block_ops,
        durability: None,
        emulated: spec.emulation.is_some(),
        seconds,
        tx_per_s: batches as f64 / seconds.max(1e-9),
        ops_per_s: Some(block_ops as f64 / seconds.max(1e-9)),
        alloc_batch: Some(batch),
        fences_per_tx: per_op(c.fences),
        fences_per_write_tx: per_op(c.fences),
        lines_flushed_per_tx: per_op(c.lines_flushed),
        nt_bytes_per_tx: per_op(c.nt_bytes),
        media_bytes_per_tx: per_op(c.media_bytes()),
        dirty_bytes_per_tx: per_op(c.dirty_bytes),
        aborts_per_tx: c.aborts as f64 / block_ops.max(1) as f64,
        ..RunResult::unmeasured(&spec.engine, spec.workload, threads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Workload;
    use crate::harness::FragOptions;

    fn spec(engine: &str, batch: usize) -> RunSpec {
        RunSpec {
            engine: engine.into(),
            workload: Workload::AllocBatch,
            threads: 2,
            ops: 2_000,
            elements: 0,
            value_size: 0,
            seed: 7,
            emulation: None,
            dir: None,
            utilisation: None,
            frag: FragOptions::default(),
            time_limit: None,
            cleaner_threads: 0,
            alloc_batch: batch,
            home_cache: None,
            node_cache: None,
            data_checksums: false,
        }
    }

    #[test]
    fn every_engine_runs_and_a_transaction_shares_its_fence_among_its_allocations() {
        for engine in engines() {
            let one = run(&spec(engine, 1), &|_| {}).unwrap();
            let many = run(&spec(engine, 8), &|_| {}).unwrap();
            assert_eq!(one.alloc_batch, Some(1));
            // 2,000 block operations on 2 threads in batches of 8: 62 operations per
            // thread (each 8 allocations, all but the first two 8 frees).
            assert_eq!(many.ops, 2 * 8 * (2 * 62 - 2), "{engine}");
            let per_s = many.tx_per_s * many.seconds;
            assert!((per_s - 124.0).abs() < 1e-6, "{engine}: {per_s} operations");
            assert!(one.ops_per_s.unwrap() > 0.0, "{engine}");
            let (f1, f8) = (one.fences_per_tx.unwrap(), many.fences_per_tx.unwrap());
            if is_persistent_heap(engine) {
                // Standalone calls are each durable: batching changes nothing.
                assert!(f1 >= 1.0 && (f1 - f8).abs() < 0.1, "{engine}: {f1} {f8}");
            } else {
                // A transaction of 8 allocations and 8 frees pays its fences once.
                assert!(f8 < f1 / 4.0, "{engine}: {f1} {f8}");
            }
        }
    }

    #[test]
    fn block_sizes_are_in_range_and_differ_between_threads() {
        let a = sizes(1, 0, 10, 8);
        assert_eq!(a.len(), 80);
        assert!(a.iter().all(|s| (MIN_SIZE..=MAX_SIZE).contains(s)));
        assert_ne!(a, sizes(1, 1, 10, 8));
    }
}
