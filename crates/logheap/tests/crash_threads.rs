//! Crash simulation with several threads committing at once: crash images are taken at
//! every thread's fence while the other threads are anywhere between writing their log
//! blocks, fencing, publishing and releasing their locks.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use logheap::media::SimConfig;
use logheap::{Config, EngineKind, Error, PPtr, Pool};

thread_local! {
    static HELD_AT_FENCE: Cell<bool> = const { Cell::new(false) };
}

/// Crash images recover on three threads: the parallel path is the one under test.
fn recovery() -> Config {
    Config::default().recovery_threads(3)
}

#[derive(Debug)]
enum Outcome {
    Pool(#[allow(dead_code)] Error),
    GaveUp,
}

impl From<Error> for Outcome {
    fn from(e: Error) -> Self {
        Outcome::Pool(e)
    }
}

/// Thread A allocates an object and writes x = 1, and is held at its commit fence (by a
/// fence gate) while thread B tries to commit y = x + 10. Every crash image at every
/// fence must open and satisfy "y is 0, or y = x + 10": B may depend on A only once A is
/// durable. With `drop_fences_of_a`, the media drops A's fences instead (a defect: A
/// publishes a commit that is not durable), and nothing holds A. Returns (violations,
/// whether B committed).
fn dependent_commit_while_another_waits_at_its_fence(drop_fences_of_a: bool) -> (u64, bool) {
    let config = Config::default().size(1 << 20).chunk_size(4096);
    let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
    let root: PPtr<[u64; 2]> = pool.root().unwrap();
    let sim = pool.media().crash_simulator().unwrap();
    let violations = Arc::new(AtomicU64::new(0));
    let v = violations.clone();
    sim.set_fence_hook(Box::new(move |point| {
        for image in point.images() {
            // An image that does not open, or shows y without the x it was made from.
            let consistent = Pool::open_image(image, &recovery(), SimConfig::default())
                .and_then(|p| p.read(|tx| tx.read(root)))
                .is_ok_and(|[x, y]| y == 0 || y == x + 10);
            if !consistent {
                v.fetch_add(1, Ordering::Relaxed);
            }
        }
    }));
    let at_fence = Arc::new(AtomicBool::new(false));
    let release = Arc::new(AtomicBool::new(false));
    let (a, r) = (at_fence.clone(), release.clone());
    if drop_fences_of_a {
        sim.set_fence_filter(Arc::new(|| !HELD_AT_FENCE.with(|h| h.get())));
    } else {
        sim.set_fence_gate(Arc::new(move || {
            if HELD_AT_FENCE.with(|h| h.get()) {
                a.store(true, Ordering::SeqCst);
                while !r.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
            }
        }));
    }
    let mut b_committed = false;
    std::thread::scope(|s| {
        s.spawn(|| {
            HELD_AT_FENCE.with(|h| h.set(true));
            pool.transaction(|tx| {
                tx.alloc([5u8; 300])?;
                tx.write(root, &[1, 0])
            })
            .unwrap();
            if drop_fences_of_a {
                // A has committed and published, its fence dropped: B goes now.
                at_fence.store(true, Ordering::SeqCst);
            }
        });
        while !at_fence.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // A's blocks are written, not yet (durably) fenced. B reads x and writes y.
        let mut attempts = 0;
        let outcome = pool.transaction(|tx| {
            attempts += 1;
            if attempts > 200 {
                return Err(Outcome::GaveUp);
            }
            let [x, _] = tx.read(root)?;
            tx.write(PPtr::<u64>::from_offset(root.offset() + 8), &(x + 10))?;
            Ok(())
        });
        b_committed = outcome.is_ok();
        release.store(true, Ordering::SeqCst);
    });
    sim.clear_fence_gate();
    sim.clear_fence_filter();
    (violations.load(Ordering::Relaxed), b_committed)
}

#[test]
fn a_dependent_transaction_waits_for_the_fence_of_the_one_it_reads() {
    let (violations, b_committed) = dependent_commit_while_another_waits_at_its_fence(false);
    assert_eq!(violations, 0);
    assert!(
        !b_committed,
        "B read data whose commit had not reached its fence"
    );
}

#[test]
fn publishing_a_commit_that_is_not_durable_is_caught_every_time() {
    let (violations, b_committed) = dependent_commit_while_another_waits_at_its_fence(true);
    assert!(b_committed);
    assert!(
        violations > 0,
        "a crash image must show B's commit without A's, which B read"
    );
}

const ACCOUNTS: usize = 8;
const THREADS: usize = 3;
const TOTAL: u64 = 8_000;

#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Bank {
    balance: [u64; ACCOUNTS],
    /// Each thread's latest receipt object.
    receipt: [u64; THREADS],
}

/// Three threads move money between accounts and each keeps one receipt object (freed
/// and reallocated by every transfer), so they conflict, abort, retry, allocate and free
/// at once. At every fence of every thread, every crash image (sampled) must recover to
/// a bank whose total is unchanged and whose only allocations are the receipts.
#[test]
fn concurrent_transfers_survive_every_crash_image() {
    for (engine, fast_log) in [
        (EngineKind::Log, false),
        (EngineKind::Redo, false),
        (EngineKind::Undo, false),
        (EngineKind::Oop, false),
        (EngineKind::Hoop, false),
        (EngineKind::Redo, true),
        (EngineKind::Undo, true),
    ] {
        concurrent_transfers_survive_every_crash_image_on(engine, fast_log, false);
    }
}

/// The same with data checksums: no crash image leaves a line and its checksum apart.
#[test]
fn concurrent_transfers_with_data_checksums_survive_every_crash_image() {
    for engine in [
        EngineKind::Redo,
        EngineKind::Undo,
        EngineKind::Oop,
        EngineKind::Hoop,
    ] {
        concurrent_transfers_survive_every_crash_image_on(engine, false, true);
    }
}

fn concurrent_transfers_survive_every_crash_image_on(
    engine: EngineKind,
    fast_log: bool,
    checksums: bool,
) {
    let mut config = Config::default()
        .size(2 << 20)
        .chunk_size(4096)
        .engine(engine)
        .fast_log(fast_log);
    if checksums {
        config = config.data_checksums(true);
    }
    let sim_config = SimConfig {
        max_images_per_fence: 6,
        random_images: 2,
        ..SimConfig::default()
    };
    let pool = Pool::create_sim(&config, sim_config).unwrap();
    let root: PPtr<Bank> = pool.root().unwrap();
    pool.transaction(|tx| {
        tx.write(
            root,
            &Bank {
                balance: [TOTAL / ACCOUNTS as u64; ACCOUNTS],
                receipt: [0; THREADS],
            },
        )
    })
    .unwrap();
    let sim = pool.media().crash_simulator().unwrap();
    let found = Arc::new(Mutex::new((0u64, Vec::<String>::new())));
    let f = found.clone();
    sim.set_fence_hook(Box::new(move |point| {
        let mut f = f.lock().unwrap();
        for image in point.images() {
            f.0 += 1;
            if let Err(why) = bank_is_consistent(image) {
                f.1.push(format!("fence {}: {why}", point.fence_index()));
            }
        }
    }));
    // Threads pause now and then at their fences, so others run between their log
    // writes and their fences.
    sim.set_fence_gate(Arc::new(|| {
        if rand::random_ratio(1, 3) {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }));
    let before = pool.media().counters();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let pool = &pool;
            s.spawn(move || {
                for i in 0..40u64 {
                    let (from, to) = (
                        (t * 3 + i as usize) % ACCOUNTS,
                        (t + i as usize * 5) % ACCOUNTS,
                    );
                    pool.transaction(|tx| {
                        let mut bank = tx.read(root)?;
                        let amount = (i + 1).min(bank.balance[from]);
                        bank.balance[from] -= amount;
                        bank.balance[to] += amount;
                        if bank.receipt[t] != 0 {
                            tx.free(PPtr::<[u64; 8]>::from_offset(bank.receipt[t]))?;
                        }
                        bank.receipt[t] = tx
                            .alloc([t as u64, i, from as u64, to as u64, amount, 0, 0, 0])?
                            .offset();
                        tx.write(root, &bank)
                    })
                    .unwrap();
                }
            });
        }
    });
    sim.clear_fence_gate();
    sim.take_fence_hook();
    let c = pool.media().counters().since(&before);
    assert_eq!(c.write_transactions, (THREADS * 40) as u64);
    assert!(c.aborts > 0, "the threads never conflicted");
    let (images, problems) = found.lock().unwrap().clone();
    assert!(images >= 500, "{images} images");
    assert!(
        problems.is_empty(),
        "{} bad images, first {:?}",
        problems.len(),
        &problems[..problems.len().min(3)]
    );
    let last = pool.media().crash_simulator().unwrap().persisted_image();
    bank_is_consistent(last).unwrap();
}

fn bank_is_consistent(image: Vec<u8>) -> Result<(), String> {
    let pool = Pool::open_image(image, &recovery(), SimConfig::default())
        .map_err(|e| format!("does not open: {e}"))?;
    let root: PPtr<Bank> = pool.root().map_err(|e| e.to_string())?;
    let bank = pool.read(|tx| tx.read(root)).map_err(|e| e.to_string())?;
    let total: u64 = bank.balance.iter().sum();
    if total != TOTAL {
        return Err(format!("total {total}"));
    }
    let mut receipts: Vec<u64> = bank.receipt.iter().copied().filter(|&r| r != 0).collect();
    receipts.sort_unstable();
    let allocations: Vec<u64> = pool.allocations().iter().map(|a| a.0).collect();
    if allocations != receipts {
        return Err(format!(
            "allocations {allocations:x?}, receipts {receipts:x?}"
        ));
    }
    for r in receipts {
        let receipt = pool
            .read(|tx| tx.read(PPtr::<[u64; 8]>::from_offset(r)))
            .map_err(|e| e.to_string())?;
        if receipt[0] as usize >= THREADS {
            return Err(format!("receipt {r:#x} holds {receipt:?}"));
        }
    }
    Ok(())
}
