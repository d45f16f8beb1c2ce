//! `alloc-random` (issue 11, 002's allocator benchmark): random-size allocation and free,
//! 64 B to 128 KiB, on any number of threads, on logheap's persistent heap (`alloc`),
//! PMDK's allocator (`pmdk`: `pmemobj_alloc` / `pmemobj_free`), glibc's malloc and
//! jemalloc.
//!
//! Each thread owns [`SLOTS`] pointer slots, half of them filled by the preload. Each
//! measured operation picks one of its slots at random: it allocates a block of a size
//! drawn uniformly from [`MIN_SIZE`, `MAX_SIZE`] into an empty slot and frees a full
//! one. Every engine runs the same operations, drawn before the clock starts. The
//! persistent engines store the pointer durably through their reference-passing call
//! (`PersistentHeap::allocate_into`, `pmemobj_alloc(pop, &oid, ..)`), so a crash leaks
//! nothing; the DRAM allocators keep theirs in a vector.

use std::alloc::{GlobalAlloc, Layout};
use std::time::Instant;

use logheap::MediaConfig;
use logheap::alloc::{HeapOptions, MetadataPolicy, PAddr, PersistentHeap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tikv_jemallocator::Jemalloc;

use crate::fragmentation::{GLIBC, JEMALLOC};
use crate::harness::{RunResult, RunSpec, pool_dir, run_timed};

/// The engine name of logheap's persistent heap (metadata in place, 002).
pub const ALLOC: &str = "alloc";
/// The engine name of logheap's persistent heap with DRAM state and a metadata log
/// (004).
pub const ALLOC_LOG: &str = "alloc-log";
/// Pointer slots per thread.
pub const SLOTS: u64 = 1000;
/// The smallest block asked for.
pub const MIN_SIZE: u64 = 64;
/// The largest block asked for.
pub const MAX_SIZE: u64 = 128 << 10;

/// The engines `alloc-random` runs on.
pub fn engines() -> [&'static str; 5] {
    [ALLOC, ALLOC_LOG, crate::pmdk::ENGINE, GLIBC, JEMALLOC]
}

/// Whether `engine` is logheap's persistent heap (either metadata policy).
pub fn is_persistent_heap(engine: &str) -> bool {
    engine == ALLOC || engine == ALLOC_LOG
}

/// The metadata policy of a persistent-heap engine name (`alloc-log`: the metadata
/// log; any other: in place).
pub fn policy_of(engine: &str) -> MetadataPolicy {
    if engine == ALLOC_LOG {
        MetadataPolicy::MetadataLog
    } else {
        MetadataPolicy::InPlace
    }
}

/// The operations of one run: the preload (one thread) and each thread's measured ones,
/// as `slot | size << 32` (slots numbered over all threads).
struct Ops {
    preload: Vec<u64>,
    per_thread: Vec<Vec<u64>>,
}

fn draw(spec: &RunSpec) -> Ops {
    let threads = spec.threads.max(1) as u64;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let size = |rng: &mut ChaCha8Rng| rng.random_range(MIN_SIZE..=MAX_SIZE);
    let preload = (0..threads)
        .flat_map(|t| (0..SLOTS / 2).map(move |i| t * SLOTS + i * 2))
        .map(|slot| slot | size(&mut rng) << 32)
        .collect();
    let per_thread = (0..threads)
        .map(|t| {
            let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ (t + 1) << 32);
            (0..spec.ops / threads)
                .map(|_| (t * SLOTS + rng.random_range(0..SLOTS)) | size(&mut rng) << 32)
                .collect()
        })
        .collect();
    Ops {
        preload,
        per_thread,
    }
}

fn split(op: u64) -> (u64, u64) {
    (op & 0xffff_ffff, op >> 32)
}

/// Runs `alloc-random` on `spec.engine`.
pub fn run(spec: &RunSpec, phase: &dyn Fn(&str)) -> Result<RunResult, Box<dyn std::error::Error>> {
    let ops = draw(spec);
    let threads = ops.per_thread.len();
    let total: u64 = ops.per_thread.iter().map(|o| o.len() as u64).sum();
    let slots = SLOTS * threads as u64;
    // Room for every slot full of the largest block, twice over: PMDK refuses
    // allocations in a pool 1.25x that size (its runs and chunks waste more).
    let pool_size = (slots * MAX_SIZE * 2).max(64 << 20);
    let mut result = RunResult {
        ops: total,
        durability: None,
        emulated: spec.emulation.is_some() && is_persistent_heap(&spec.engine),
        ..RunResult::unmeasured(&spec.engine, spec.workload, threads)
    };
    let start = Instant::now();
    phase("preloading");
    match spec.engine.as_str() {
        engine @ (ALLOC | ALLOC_LOG) => {
            let dir = pool_dir(spec)?;
            let heap = PersistentHeap::create(
                dir.path().join("heap"),
                &HeapOptions {
                    size: pool_size,
                    arenas: threads as u32,
                    root_size: (slots * 8).next_multiple_of(64),
                    media: MediaConfig {
                        emulation: spec.emulation,
                        ..MediaConfig::default()
                    },
                    metadata: policy_of(engine),
                    ..HeapOptions::default()
                },
            )?;
            let run_ops = |list: &[u64]| -> Result<(), logheap::Error> {
                for &op in list {
                    let (slot, size) = split(op);
                    let dst = heap.root().checked_add(slot * 8).expect("in the root");
                    if heap.read_u64(dst)? == 0 {
                        heap.allocate_into(dst, size)?;
                    } else {
                        heap.deallocate(dst)?;
                    }
                }
                Ok(())
            };
            run_ops(&ops.preload)?;
            result.preload_seconds = start.elapsed().as_secs_f64();
            phase("measuring");
            let before = heap.media().counters();
            result.seconds = run_timed(threads, |t| run_ops(&ops.per_thread[t]))?;
            let c = heap.media().counters().since(&before);
            let per_op = |x: u64| Some(x as f64 / total.max(1) as f64);
            result.fences_per_tx = per_op(c.fences);
            result.fences_per_write_tx = per_op(c.fences);
            result.lines_flushed_per_tx = per_op(c.lines_flushed);
            result.media_bytes_per_tx = per_op(c.media_bytes());
            result.dirty_bytes_per_tx = per_op(c.dirty_bytes);
            let stats = heap.stats();
            result.dram_bytes = Some(stats.dram_bytes);
            result.pm_bytes_used = Some(stats.pm_bytes_used);
            check_slots(ops_final_state(&ops), |slot| {
                heap.read_u64(heap.root().checked_add(slot * 8).expect("in the root"))
                    .map(|v| !PAddr::from_raw(v).is_null())
                    .unwrap_or(false)
            })?;
            heap.close()?;
        }
        e if e == crate::pmdk::ENGINE => {
            let dir = pool_dir(spec)?;
            let path = dir.path().join("pool");
            let clock = Instant::now();
            result.seconds =
                crate::pmdk::alloc_random(&path, pool_size, slots, &ops.preload, &ops.per_thread)?;
            result.preload_seconds = clock.elapsed().as_secs_f64() - result.seconds;
        }
        GLIBC | JEMALLOC => {
            let jemalloc = spec.engine == JEMALLOC;
            let mut table: Vec<(usize, u64)> = vec![(0, 0); slots as usize];
            let run_ops = |table: &mut [(usize, u64)], list: &[u64], first: u64| {
                for &op in list {
                    let (slot, size) = split(op);
                    let entry = &mut table[(slot - first) as usize];
                    if entry.0 == 0 {
                        *entry = (dram_alloc(jemalloc, size), size);
                    } else {
                        dram_free(jemalloc, entry.0, entry.1);
                        *entry = (0, 0);
                    }
                }
            };
            run_ops(&mut table, &ops.preload, 0);
            result.preload_seconds = start.elapsed().as_secs_f64();
            phase("measuring");
            let mut parts: Vec<&mut [(usize, u64)]> = table.chunks_mut(SLOTS as usize).collect();
            let parts: Vec<std::sync::Mutex<&mut [(usize, u64)]>> =
                parts.drain(..).map(std::sync::Mutex::new).collect();
            result.seconds = run_timed(threads, |t| -> Result<(), String> {
                let mut part = parts[t].lock().map_err(|_| "poisoned")?;
                run_ops(&mut part, &ops.per_thread[t], t as u64 * SLOTS);
                Ok(())
            })?;
            drop(parts);
            for &(p, size) in &table {
                if p != 0 {
                    dram_free(jemalloc, p, size);
                }
            }
        }
        other => {
            return Err(
                format!("alloc-random runs on {}, not {other}", engines().join(", ")).into(),
            );
        }
    }
    result.tx_per_s = total as f64 / result.seconds.max(1e-9);
    result.ops_per_s = Some(result.tx_per_s);
    Ok(result)
}

/// Which slots are full after every operation of `ops`.
fn ops_final_state(ops: &Ops) -> Vec<bool> {
    let slots = ops.per_thread.len() * SLOTS as usize;
    let mut full = vec![false; slots];
    for &op in ops.preload.iter().chain(ops.per_thread.iter().flatten()) {
        let slot = split(op).0 as usize;
        full[slot] = !full[slot];
    }
    full
}

/// Checks that the heap's slots are full exactly where the operations left them full.
fn check_slots(expected: Vec<bool>, is_full: impl Fn(u64) -> bool) -> Result<(), String> {
    match (0..expected.len()).find(|&s| is_full(s as u64) != expected[s]) {
        Some(s) => Err(format!("slot {s}: the run left it in the wrong state")),
        None => Ok(()),
    }
}

fn dram_alloc(jemalloc: bool, size: u64) -> usize {
    let p = if jemalloc {
        let layout = Layout::from_size_align(size as usize, 16).expect("a valid layout");
        // SAFETY: a non-zero size with a valid alignment.
        unsafe { Jemalloc.alloc(layout) }
    } else {
        // SAFETY: plain malloc of a non-zero size.
        unsafe { libc::malloc(size as usize) as *mut u8 }
    };
    assert!(!p.is_null(), "out of memory allocating {size} bytes");
    // Touch the block, as a persistent allocator's caller would write it.
    // SAFETY: `p` is a fresh block of at least 1 byte.
    unsafe { p.write_volatile(1) };
    p as usize
}

fn dram_free(jemalloc: bool, p: usize, size: u64) {
    if jemalloc {
        let layout = Layout::from_size_align(size as usize, 16).expect("a valid layout");
        // SAFETY: `p` came from `Jemalloc.alloc` with this layout and is freed once.
        unsafe { Jemalloc.dealloc(p as *mut u8, layout) };
    } else {
        // SAFETY: `p` came from `libc::malloc` and is freed once.
        unsafe { libc::free(p as *mut libc::c_void) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Workload;

    fn spec(engine: &str, threads: usize) -> RunSpec {
        RunSpec {
            engine: engine.into(),
            workload: Workload::AllocRandom,
            threads,
            ops: 4000,
            elements: 0,
            value_size: 0,
            seed: 3,
            emulation: None,
            dir: None,
            utilisation: None,
            frag: Default::default(),
            time_limit: None,
            cleaner_threads: 0,
            alloc_batch: 1,
            home_cache: None,
            node_cache: None,
            data_checksums: false,
        }
    }

    #[test]
    fn every_engine_runs_the_same_operations_and_reports_ops_per_second() {
        for engine in engines() {
            if engine == crate::pmdk::ENGINE && !crate::pmdk::pmdk_available() {
                continue;
            }
            for threads in [1, 2] {
                let r = run(&spec(engine, threads), &|_| {}).unwrap();
                assert_eq!(r.ops, 4000, "{engine}");
                assert!(r.ops_per_s.is_some_and(|x| x > 0.0), "{engine}");
            }
        }
        let r = run(&spec(ALLOC, 1), &|_| {}).unwrap();
        // Three fences per operation, and a few more when an arena takes a segment.
        let fences = r.fences_per_tx.unwrap();
        assert!(
            (3.0..3.2).contains(&fences),
            "{fences} fences per operation"
        );
        // The metadata log takes the bitmap or page-table line out of every call.
        let log = run(&spec(ALLOC_LOG, 1), &|_| {}).unwrap();
        let (lines, log_lines) = (
            r.lines_flushed_per_tx.unwrap(),
            log.lines_flushed_per_tx.unwrap(),
        );
        assert!(
            log_lines < lines - 0.5,
            "{log_lines} lines per operation with a metadata log, {lines} in place"
        );
    }

    #[test]
    fn the_operations_alternate_each_slot_and_stay_in_their_threads_slots() {
        let ops = draw(&spec(ALLOC, 2));
        assert_eq!(ops.preload.len() as u64, SLOTS);
        for (t, list) in ops.per_thread.iter().enumerate() {
            assert_eq!(list.len(), 2000);
            for &op in list {
                let (slot, size) = split(op);
                assert_eq!(slot / SLOTS, t as u64);
                assert!((MIN_SIZE..=MAX_SIZE).contains(&size));
            }
        }
        assert_eq!(check_slots(vec![true, false], |s| s == 0), Ok(()));
        assert!(check_slots(vec![true, false], |_| true).is_err());
    }
}
