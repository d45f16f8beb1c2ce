//! Crash simulation of the persistent heap: at every fence of a random run of
//! allocations and frees of every size policy, every crash image must open (recovery
//! runs) and show no leak, no double allocation and no dangling pointer, checked by
//! walking every block of the persistent metadata against the pointers in the root.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use logheap::PoolFile;
use logheap::alloc::{Block, HeapOptions, MetadataPolicy, PAddr, PersistentHeap};
use logheap::media::{CrashPoint, SimConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Pointer slots the workload uses (root words 0..SLOTS); the checker allocates into
/// the next ones.
const SLOTS: u64 = 24;
const SPARE: u64 = 8;

fn options() -> HeapOptions {
    HeapOptions {
        size: 2 << 20,
        segment_size: 64 << 10,
        arenas: 2,
        root_size: 4096,
        ..HeapOptions::default()
    }
}

/// A heap of 1 MiB that grows by files of 256 KiB (four segments) up to 3 MiB, so the
/// run creates and removes extension files, and huge blocks larger than a file get files
/// of their own.
fn growing_options() -> HeapOptions {
    HeapOptions {
        size: 1 << 20,
        max_size: 3 << 20,
        file_size: 256 << 10,
        ..options()
    }
}

/// With a metadata log of 16 records per arena, so the run checkpoints (ring full,
/// segments given back) many times.
fn log_options() -> HeapOptions {
    HeapOptions {
        metadata: MetadataPolicy::MetadataLog,
        log_records: 16,
        ..options()
    }
}

fn slot(heap: &PersistentHeap, i: u64) -> PAddr {
    heap.root().checked_add(8 * i).unwrap()
}

/// What the workload has made durable, and the operation in flight.
#[derive(Debug, Clone, Default)]
struct Model {
    slots: Vec<u64>,
    /// The slot the operation in flight changes, and whether it allocates.
    in_flight: Option<(u64, bool)>,
}

#[derive(Debug, Default)]
struct Tally {
    images: AtomicU64,
    /// Images whose recovery redid an unfinished operation.
    redone: AtomicU64,
    /// Images whose heap had extension files.
    with_files: AtomicU64,
    /// Images whose recovery removed half-made or empty files.
    files_removed: AtomicU64,
    violations: AtomicU64,
    first: Mutex<Option<String>>,
}

impl Tally {
    fn violation(&self, why: String) {
        self.violations.fetch_add(1, Ordering::Relaxed);
        self.first.lock().unwrap().get_or_insert(why);
    }
}

/// Opens `image` and checks it against `model`; the reason it fails, if it does.
fn check_image(image: Vec<u8>, model: &Model, tally: &Tally) -> Result<(), String> {
    let heap = PersistentHeap::open_image(image, &Default::default(), SimConfig::default())
        .map_err(|e| format!("does not open: {e}"))?;
    let stats = heap.stats();
    if stats.recovery.redone > 0 {
        tally.redone.fetch_add(1, Ordering::Relaxed);
    }
    if stats.files > 0 {
        tally.with_files.fetch_add(1, Ordering::Relaxed);
    }
    if stats.recovery.files_removed > 0 {
        tally.files_removed.fetch_add(1, Ordering::Relaxed);
    }
    if stats.recovery.orphan_files > 0 {
        // A file the table does not name is leaked space: the protocol never makes one.
        return Err(format!("{} orphan files", stats.recovery.orphan_files));
    }
    let blocks = heap.blocks().map_err(|e| format!("blocks: {e}"))?;
    for w in blocks.windows(2) {
        if overlap(&w[0], &w[1]) {
            return Err(format!("double allocation: {:?} overlaps {:?}", w[0], w[1]));
        }
    }
    let mut referenced = BTreeSet::new();
    for i in 0..SLOTS {
        let v = heap.read_u64(slot(&heap, i)).unwrap();
        let expected = model.slots[i as usize];
        match model.in_flight {
            Some((s, _)) if s == i => {}
            _ if v != expected => return Err(format!("slot {i} is {v:#x}, not {expected:#x}")),
            _ => {}
        }
        if let Some((s, allocating)) = model.in_flight
            && s == i
            && v != expected
            && (allocating == (v == 0))
        {
            return Err(format!("slot {i} in flight is {v:#x}"));
        }
        if v != 0 && !referenced.insert(v) {
            return Err(format!("two slots hold {v:#x}"));
        }
    }
    let allocated: BTreeSet<u64> = blocks.iter().map(|b| b.addr.raw()).collect();
    if allocated != referenced {
        let leaked: Vec<_> = allocated.difference(&referenced).collect();
        let dangling: Vec<_> = referenced.difference(&allocated).collect();
        return Err(format!("leaked {leaked:x?}, dangling {dangling:x?}"));
    }
    // The rebuilt DRAM state must hand out only free space.
    for (k, size) in [40u64, 3000, 9000, 70_000].into_iter().enumerate() {
        let _ = heap.allocate_into(slot(&heap, SLOTS + k as u64), size);
    }
    let after = heap
        .blocks()
        .map_err(|e| format!("blocks after allocating: {e}"))?;
    for w in after.windows(2) {
        if overlap(&w[0], &w[1]) {
            return Err(format!(
                "recovered state allocated over a block: {:?} overlaps {:?}",
                w[0], w[1]
            ));
        }
    }
    Ok(())
}

/// Whether block `a` overlaps block `b`, which follows it in address order.
fn overlap(a: &Block, b: &Block) -> bool {
    a.addr.file() == b.addr.file() && a.addr.offset() + a.size > b.addr.offset()
}

fn check_point(point: &CrashPoint<'_>, model: &Model, tally: &Tally) {
    for image in point.images() {
        let n = tally.images.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(4) {
            check_recovery_crashes(image.clone(), model, tally);
        }
        if let Err(why) = check_image(image, model, tally) {
            tally.violation(format!("fence {}: {why}", point.fence_index()));
        }
    }
}

/// Opens `image` with a crash image taken at every fence of its recovery (the redo of
/// an unfinished operation, marking the pool open), and checks those too: recovery must
/// survive crashing itself.
fn check_recovery_crashes(image: Vec<u8>, model: &Model, tally: &Tally) {
    // A replay of a metadata log flushes a line per record under one fence: 32 images
    // of each such fence, not 512, keep the run short.
    let sim = SimConfig {
        max_images_per_fence: 32,
        ..SimConfig::default()
    };
    let file = match PoolFile::open_image(image, &Default::default(), sim) {
        Ok(f) => f,
        Err(e) => return tally.violation(format!("does not open: {e}")),
    };
    let nested = Arc::new(Mutex::new(Vec::new()));
    let n = nested.clone();
    file.media()
        .crash_simulator()
        .unwrap()
        .set_fence_hook(Box::new(move |point| {
            n.lock().unwrap().extend(point.images())
        }));
    if let Err(e) = PersistentHeap::from_file(file) {
        return tally.violation(format!("recovery failed: {e}"));
    }
    for image in nested.lock().unwrap().drain(..) {
        tally.images.fetch_add(1, Ordering::Relaxed);
        if let Err(why) = check_image(image, model, tally) {
            tally.violation(format!("crash during recovery: {why}"));
        }
    }
}

/// Runs `ops` random operations (in batches on fresh threads, so both arenas work),
/// keeping the model up to date, with volatile blocks taken and freed between them, and
/// defragmenting every third batch.
fn run_workload(
    heap: &PersistentHeap,
    model: &Arc<Mutex<Model>>,
    seed: u64,
    ops: u32,
    largest: u64,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut done = 0;
    while done < ops {
        let batch: Vec<(u64, u64)> = (0..10)
            .map(|_| {
                let size = match rng.random_range(0..10) {
                    0..5 => rng.random_range(1..=4032),
                    5..9 => rng.random_range(4033..50_000),
                    _ => rng.random_range(60_000..largest),
                };
                (rng.random_range(0..SLOTS), size)
            })
            .collect();
        std::thread::scope(|s| {
            s.spawn(|| {
                // Volatile blocks beside the persistent ones: never in a crash image.
                let mut scratch = Vec::new();
                for &(i, size) in &batch {
                    if size % 3 == 0 {
                        // (Not written: stores never flushed would stay pending in the
                        // simulator and multiply every later fence's crash images.)
                        scratch.push(heap.allocate_volatile(size).unwrap());
                    }
                    if size % 4 == 0
                        && let Some(v) = scratch.pop()
                    {
                        heap.deallocate_volatile(v).unwrap();
                    }
                    let p = slot(heap, i);
                    let current = heap.read_u64(p).unwrap();
                    model.lock().unwrap().in_flight = Some((i, current == 0));
                    if current == 0 {
                        heap.allocate_into(p, size).unwrap();
                    } else {
                        heap.deallocate(p).unwrap();
                    }
                    let mut m = model.lock().unwrap();
                    m.slots[i as usize] = heap.read_u64(p).unwrap();
                    m.in_flight = None;
                }
                for v in scratch {
                    heap.deallocate_volatile(v).unwrap();
                }
            });
        });
        done += batch.len() as u32;
        // Punch holes in the free space now and then: later crash images hold them.
        if done % 30 == 0 {
            heap.defragment(u64::MAX).unwrap();
        }
    }
}

#[test]
fn every_crash_image_of_allocations_and_frees_has_no_leak_and_no_double_allocation() {
    crash_test(&options(), SimConfig::default(), 300, 200_000);
}

#[test]
fn a_heap_of_several_files_has_no_leak_and_no_double_allocation_in_any_crash_image() {
    // Huge blocks up to 400 KB: those over 256 KiB get a file of their own. `crash_test`
    // asserts that images with extension files, and recoveries removing files, occurred.
    crash_test(&growing_options(), SimConfig::default(), 200, 400_000);
}

#[test]
fn with_a_metadata_log_every_crash_image_has_no_leak_and_no_double_allocation() {
    // A checkpoint flushes many lines under one fence; at most 24 images of each fence
    // keep the run short.
    let sim = SimConfig {
        max_images_per_fence: 24,
        ..SimConfig::default()
    };
    let stats = crash_test(&log_options(), sim, 120, 200_000);
    assert!(
        stats.checkpoints > 5,
        "only {} checkpoints",
        stats.checkpoints
    );
}

/// Runs `ops` operations on a heap made with `options` on simulation media set by
/// `sim`, checking every crash image.
fn crash_test(
    options: &HeapOptions,
    sim: SimConfig,
    ops: u32,
    largest: u64,
) -> logheap::alloc::HeapStats {
    let heap = PersistentHeap::create_sim(options, sim).unwrap();
    let model = Arc::new(Mutex::new(Model {
        slots: vec![0; (SLOTS + SPARE) as usize],
        in_flight: None,
    }));
    let tally = Arc::new(Tally::default());
    let sim = heap.media().crash_simulator().unwrap();
    let (m, t) = (model.clone(), tally.clone());
    sim.set_fence_hook(Box::new(move |point| {
        let model = m.lock().unwrap().clone();
        check_point(point, &model, &t);
    }));
    run_workload(&heap, &model, 7, ops, largest);
    let images = tally.images.load(Ordering::Relaxed);
    let with_files = tally.with_files.load(Ordering::Relaxed);
    let violations = tally.violations.load(Ordering::Relaxed);
    let redone = tally.redone.load(Ordering::Relaxed);
    eprintln!(
        "persistent heap crash test ({:?}, growing to {}): {images} images ({redone} redoing an unfinished operation, {with_files} with extension files), {violations} violations",
        options.metadata, options.max_size
    );
    assert_eq!(
        violations,
        0,
        "first: {}",
        tally.first.lock().unwrap().clone().unwrap_or_default()
    );
    assert!(images >= 1000, "only {images} images");
    assert!(redone > 100, "only {redone} images needed a redo");
    if options.max_size > options.size {
        assert!(with_files > 100, "only {with_files} images had files");
        let recovered = tally.files_removed.load(Ordering::Relaxed);
        assert!(
            recovered > 10,
            "only {recovered} images had files to remove"
        );
    }
    let stats = heap.stats();
    assert!(
        stats.small_segments > 0 && stats.big_segments > 0,
        "{stats:?}"
    );
    stats
}

thread_local! {
    static DROP_FENCES: Cell<bool> = const { Cell::new(false) };
}

#[test]
fn without_its_fences_an_allocation_can_leak_and_the_check_sees_it() {
    let heap = PersistentHeap::create_sim(&options(), SimConfig::default()).unwrap();
    let sim = heap.media().crash_simulator().unwrap();
    sim.set_fence_filter(Arc::new(|| !DROP_FENCES.with(|d| d.get())));
    let tally = Tally::default();
    let mut model = Model {
        slots: vec![0; (SLOTS + SPARE) as usize],
        in_flight: None,
    };
    for i in 0..6 {
        let p = slot(&heap, i);
        DROP_FENCES.with(|d| d.set(true));
        model.in_flight = Some((i, true));
        heap.allocate_into(p, 100 + 5000 * i).unwrap();
        DROP_FENCES.with(|d| d.set(false));
        // A crash now: the micro-log record, the bitmap and the pointer were all
        // flushed but never fenced, so any of them may be missing.
        sim.with_crash_point(|point| check_point(point, &model, &tally));
        heap.media().fence();
        model.slots[i as usize] = heap.read_u64(p).unwrap();
        model.in_flight = None;
    }
    assert!(
        tally.violations.load(Ordering::Relaxed) > 0,
        "dropping the fences went unnoticed in {} images",
        tally.images.load(Ordering::Relaxed)
    );
}
