//! `logheap crashtest`: runs a mixed transactional workload on the crash-simulation
//! media, opens every crash image the simulator offers at every fence (running
//! recovery), and checks that each recovered pool equals the state before or after the
//! transaction in flight, with exactly the allocations that state references.
//!
//! The workload keeps a table of object slots in the root object. Each transaction does
//! a few of: allocate an object (sizes from 8 bytes to several chunks), free one,
//! overwrite part of one, write a range spanning two adjacent objects, or many small
//! writes; so transactions have blocks in all four logs, span chunks, and split older
//! mappings.

use std::sync::{Arc, Mutex};

use logheap::media::SimConfig;
use logheap::{Config, EngineConfig, Error, PPtr, Pool, PoolFile};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Options of `logheap crashtest`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Engine to test: log, redo, undo, oop, or one of the mapping ablation's log-base,
    /// log-2l, log-2l-gu, log-2l-gu-c.
    #[arg(long, default_value = "log")]
    engine: String,
    /// Transactions to run.
    #[arg(long, default_value_t = 200)]
    txs: u64,
    /// Seed of the workload and of the simulator's sampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Most crash images checked per fence (sampled when there are more).
    #[arg(long, default_value_t = 24)]
    images_per_fence: usize,
    /// Every this many transactions, crash and go on with the recovered pool, so that
    /// logs resumed after recovery are crash-tested too (0: never).
    #[arg(long, default_value_t = 40)]
    reopen_every: u64,
    /// Crash-test recovery itself on every this many images where recovery had
    /// something to erase: every crash image of its fences must recover to the same
    /// state again (0: never).
    #[arg(long, default_value_t = 8)]
    recovery_crashes_every: u64,
    /// Print one JSON object instead of the summary line.
    #[arg(long)]
    json: bool,
    /// Inject a defect, to see the checker fail: `skip-commit-fence` drops every second
    /// fence of the workload's thread (in the simulation media, so it works on any
    /// engine), so some acknowledged commits are not durable.
    #[arg(long, hide = true)]
    fault: Option<String>,
    /// Background cleaner threads of the log engine (their passes' fences come at any
    /// moment between the workload's), besides the committers' inline cleaning.
    #[arg(long, default_value_t = 0)]
    cleaner_threads: usize,
    /// Write the crash image of the first violation to this file (a pool file that
    /// `logheap check` and `logheap inspect` can read), for debugging.
    #[arg(long)]
    save_violation: Option<std::path::PathBuf>,
}

const SLOTS: usize = 32;
/// The pool's size: a few times the workload's live data (about 50 KiB), so that
/// within a few hundred transactions the log fills with stale data and the cleaner
/// runs (`chunks_cleaned` in the outcome).
const POOL_SIZE: u64 = 256 << 10;
/// The log engine's chunk size in the crash test's pools.
const CHUNK_SIZE: u64 = 4096;
/// The pool's size for the in-place engines (`redo`, `undo`, `oop`): their allocator takes
/// 64 KiB segments, a few per arena, and each committing thread a log area.
const IN_PLACE_POOL_SIZE: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Slot {
    ptr: u64,
    len: u64,
}

type Table = [Slot; SLOTS];
/// Each slot's object as (home, length), or empty.
type Placement = Vec<Option<(u64, u64)>>;
/// The logical state: each slot's object bytes, or empty.
type Model = Vec<Option<Vec<u8>>>;

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        slot: usize,
        data: Vec<u8>,
    },
    Free {
        slot: usize,
    },
    Write {
        slot: usize,
        offset: usize,
        data: Vec<u8>,
    },
    /// Bytes spanning the end of `first` and the start of `second` (adjacent objects).
    Span {
        first: usize,
        second: usize,
        from_end: usize,
        data: Vec<u8>,
    },
}

/// What the fence hook compares crash images against.
#[derive(Default)]
struct Expected {
    before: Model,
    after: Model,
    images: u64,
    violations: u64,
    first_violation: Option<String>,
    /// Keep a crash image of each fence (for the transaction before a reopen).
    capture: bool,
    /// The crash image kept at the latest fence.
    captured: Option<Vec<u8>>,
    /// Crash-test recovery on every this many images where it erased something.
    recovery_crashes_every: u64,
    /// Images so far where recovery erased something.
    repairs: u64,
    /// Where to save the image of the first violation.
    save: Option<std::path::PathBuf>,
    /// Sessions reopened so far.
    session: u64,
}

/// The outcome, printed as the last line or as JSON.
#[derive(Debug, serde::Serialize)]
pub struct Outcome {
    engine: String,
    txs: u64,
    seed: u64,
    fences: u64,
    /// Transactions abandoned by their own error.
    aborted: u64,
    /// Transactions that failed for want of log space, after freeing and writing.
    pool_full: u64,
    /// Crashes in the middle of a commit the workload went on from.
    reopened: u64,
    /// Chunks the log engine's cleaner reclaimed over the run (the pool is small enough
    /// for the workload to make it run).
    chunks_cleaned: u64,
    images: u64,
    violations: u64,
    first_violation: Option<String>,
}

/// Runs the crash test and prints its outcome (the summary line always comes last);
/// fails when there were violations.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let outcome = crashtest(args)?;
    if args.json {
        println!("{}", serde_json::to_string(&outcome)?);
    } else {
        if let Some(v) = &outcome.first_violation {
            println!("first violation: {v}");
        }
        println!(
            "images={} violations={}",
            outcome.images, outcome.violations
        );
    }
    if outcome.violations > 0 {
        return Err(format!(
            "{} crash images recovered to a wrong state",
            outcome.violations
        )
        .into());
    }
    Ok(())
}

/// Why a transaction of the workload is abandoned on purpose.
#[derive(Debug)]
enum Abandon {
    /// The closure returns an error: the transaction aborts.
    UserAbort,
    Pool(Error),
}

impl From<Error> for Abandon {
    fn from(e: Error) -> Self {
        Abandon::Pool(e)
    }
}

/// The live pool and what the workload knows about it.
struct Run {
    pool: Pool,
    model: Model,
    ptrs: Vec<Option<(u64, u64)>>,
    /// Fences of the pools replaced by reopening.
    fences: u64,
    aborted: u64,
    pool_full: u64,
    reopened: u64,
    /// Chunks the cleaner reclaimed in the sessions before the current one.
    chunks_cleaned: u64,
    /// The size of an object a failed transaction freed, for the next to allocate.
    reuse_size: Option<usize>,
}

/// The crash test opens thousands of pool images of a few MiB each. glibc's malloc
/// gives such blocks back to the kernel as soon as they are freed and takes them again
/// for the next image, so most of the run went to page faults (41 s against 10 s for
/// 200 transactions). Keep freed memory instead.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: the declaration matches glibc's `int mallopt(int param, int value)`.
    unsafe extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    // SAFETY: `mallopt` is glibc's documented tuning call; these parameters take a byte
    // count, and changing them at any time is allowed.
    unsafe {
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
        mallopt(M_MMAP_THRESHOLD, 32 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn crashtest(args: &Args) -> Result<Outcome, Box<dyn std::error::Error>> {
    keep_freed_memory();
    match args.fault.as_deref() {
        None | Some("skip-commit-fence") => {}
        Some(other) => return Err(format!("unknown fault {other:?}").into()),
    }
    let engine: EngineConfig = args.engine.parse()?;
    let config = match engine {
        EngineConfig::Log(options) => Config::default().size(POOL_SIZE).engine(
            options
                .chunk_size(CHUNK_SIZE)
                .cleaner_threads(args.cleaner_threads),
        ),
        _ => Config::default()
            .size(IN_PLACE_POOL_SIZE)
            .engine(engine)
            .cleaner_threads(args.cleaner_threads),
    };
    let sim = SimConfig {
        max_images_per_fence: args.images_per_fence,
        seed: args.seed,
        ..SimConfig::default()
    };
    let expected = Arc::new(Mutex::new(Expected {
        before: vec![None; SLOTS],
        after: vec![None; SLOTS],
        recovery_crashes_every: args.recovery_crashes_every,
        save: args.save_violation.clone(),
        ..Expected::default()
    }));
    let pool = Pool::create_sim(&config, sim)?;
    install_hook(&pool, &expected, &config)?;
    if args.fault.is_some() {
        skip_every_second_fence_of_this_thread(&pool)?;
    }
    let mut run = Run {
        pool,
        model: vec![None; SLOTS],
        ptrs: vec![None; SLOTS],
        fences: 0,
        aborted: 0,
        pool_full: 0,
        reopened: 0,
        chunks_cleaned: 0,
        reuse_size: None,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    // A failure of the workload itself (an image that cannot be reopened, a transaction
    // that fails) is a violation too; the summary is printed all the same.
    if let Err(why) = workload(args, &config, sim, &expected, &mut run, &mut rng) {
        let mut e = lock(&expected);
        e.violations += 1;
        e.first_violation
            .get_or_insert(format!("the workload stopped: {why}"));
    }
    // A crash after the last fence: the final state must recover exactly.
    {
        let mut e = lock(&expected);
        e.before = run.model.clone();
        e.after = run.model.clone();
    }
    let simulator = run
        .pool
        .media()
        .crash_simulator()
        .ok_or("not simulation media")?;
    let fences = run.fences + simulator.fences();
    simulator.take_fence_hook();
    simulator.with_crash_point(|point| {
        let mut e = lock(&expected);
        for image in point.images() {
            check_image(image, &config, &mut e, fences + 1);
        }
    });
    let e = lock(&expected);
    Ok(Outcome {
        engine: config.engine.to_string(),
        txs: args.txs,
        seed: args.seed,
        fences,
        aborted: run.aborted,
        pool_full: run.pool_full,
        reopened: run.reopened,
        chunks_cleaned: run.chunks_cleaned
            + run
                .pool
                .stats()
                .log()
                .cloned()
                .unwrap_or_default()
                .chunks_cleaned,
        images: e.images,
        violations: e.violations,
        first_violation: e.first_violation.clone(),
    })
}

fn lock(expected: &Mutex<Expected>) -> std::sync::MutexGuard<'_, Expected> {
    expected.lock().unwrap_or_else(|p| p.into_inner())
}

/// Checks every crash image the pool's simulator offers against `expected`.
/// The defect `--fault skip-commit-fence`: the simulation media drops every second fence
/// of the calling thread, as an engine that left out its commit fence would.
fn skip_every_second_fence_of_this_thread(pool: &Pool) -> Result<(), String> {
    let simulator = pool
        .media()
        .crash_simulator()
        .ok_or("not simulation media")?;
    let workload = std::thread::current().id();
    let fences = std::sync::atomic::AtomicU64::new(0);
    simulator.set_fence_filter(Arc::new(move || {
        std::thread::current().id() != workload
            || fences
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .is_multiple_of(2)
    }));
    Ok(())
}

fn install_hook(
    pool: &Pool,
    expected: &Arc<Mutex<Expected>>,
    config: &Config,
) -> Result<(), String> {
    let simulator = pool
        .media()
        .crash_simulator()
        .ok_or("not simulation media")?;
    let hook_expected = expected.clone();
    let config = *config;
    simulator.set_fence_hook(Box::new(move |point| {
        let mut e = lock(&hook_expected);
        for i in 0..point.len() {
            check_image(point.image(i), &config, &mut e, point.fence_index());
        }
        if e.capture {
            // The image a crash in the middle of this fence leaves (for reopening).
            e.captured = Some(point.image(point.len() / 2));
        }
    }));
    Ok(())
}

fn workload(
    args: &Args,
    config: &Config,
    sim: SimConfig,
    expected: &Arc<Mutex<Expected>>,
    run: &mut Run,
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let root: PPtr<Table> = run.pool.root().map_err(|e| e.to_string())?;
    for i in 0..args.txs {
        let reopen =
            args.reopen_every > 0 && i > 0 && i % args.reopen_every == 0 && args.fault.is_none();
        // Now and then a transaction that is abandoned after doing its work: by its own
        // error, or because the pool has no room for an allocation it makes after
        // freeing an object and writing. Either way nothing of it may take effect; the
        // next transaction allocates an object of the size that was freed, which would
        // land on the still live object if the failed free had been let through.
        let abandon = match rng.random_range(0..12) {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        };
        let mut ops = plan(rng, &run.model, &run.ptrs);
        if let Some(size) = run.reuse_size.take()
            && let Some(slot) =
                (0..SLOTS).find(|&s| run.model[s].is_none() && !ops.iter().any(|o| o.slot() == s))
        {
            ops.push(Op::Alloc {
                slot,
                data: random_bytes(rng, size),
            });
        }
        if abandon == Some(true)
            && let Some(slot) =
                (0..SLOTS).find(|&s| run.model[s].is_some() && !ops.iter().any(|o| o.slot() == s))
        {
            ops.push(Op::Free { slot });
            run.reuse_size = run.model[slot].as_ref().map(|o| o.len());
        }
        let mut after = run.model.clone();
        for op in &ops {
            apply(&mut after, op);
        }
        {
            let mut e = lock(expected);
            e.capture = reopen;
            e.captured = None;
            e.before = run.model.clone();
            e.after = if abandon.is_some() {
                run.model.clone()
            } else {
                after.clone()
            };
        }
        // More than the log engine's whole log, or (in-place engines) the whole pool.
        let log_bytes = match run.pool.stats().log().cloned() {
            Some(log) => log.chunks_total * CHUNK_SIZE,
            None => config.size,
        };
        let result = run.pool.transaction(|tx| {
            let made = apply_in_tx(tx, root, &ops)?;
            match abandon {
                Some(false) => Err(Abandon::UserAbort),
                Some(true) => {
                    // More than the whole log: it fails at commit, even after cleaning.
                    tx.alloc_bytes(log_bytes)?;
                    Ok(made)
                }
                None => Ok(made),
            }
        });
        match (result, abandon) {
            (Ok(made), None) => {
                for (slot, p) in made {
                    run.ptrs[slot] = p;
                }
                run.model = after;
            }
            (Err(Abandon::UserAbort), Some(false)) => run.aborted += 1,
            (Err(Abandon::Pool(Error::PoolFull)), _) => run.pool_full += 1,
            (Err(Abandon::Pool(Error::InvalidSize(_))), Some(true)) => run.pool_full += 1,
            (Ok(_), Some(_)) => return Err(format!("transaction {i} should have failed")),
            (Err(e), _) => return Err(format!("transaction {i} failed: {e:?}")),
        }
        if reopen {
            crash_mid_commit(config, sim, expected, run)?;
        }
    }
    Ok(())
}

/// Crashes in the middle of the last commit: goes on with a pool recovered from one of
/// the crash images of its last fence, chosen so that recovery has something to drop
/// when there is one. Logs resume where they ended, and chunks the crashed commit had
/// taken are reused later with its stale bytes in them.
fn crash_mid_commit(
    config: &Config,
    sim: SimConfig,
    expected: &Arc<Mutex<Expected>>,
    run: &mut Run,
) -> Result<(), String> {
    let simulator = run
        .pool
        .media()
        .crash_simulator()
        .ok_or("not simulation media")?;
    run.fences += simulator.fences();
    simulator.take_fence_hook();
    let captured = lock(expected).captured.take();
    let image = captured.unwrap_or_else(|| simulator.persisted_image());
    let pool = Pool::open_image(image, config, sim).map_err(|e| format!("reopen: {e}"))?;
    let (state, ptrs) = read_state(&pool)?;
    let e = lock(expected);
    if state != e.before && state != e.after {
        return Err("the reopened pool is neither before nor after its last commit".into());
    }
    drop(e);
    run.model = state;
    run.ptrs = ptrs;
    install_hook(&pool, expected, config)?;
    run.chunks_cleaned += run
        .pool
        .stats()
        .log()
        .cloned()
        .unwrap_or_default()
        .chunks_cleaned;
    run.pool = pool;
    run.reopened += 1;
    lock(expected).session = run.reopened;
    Ok(())
}

/// Runs the operations in a transaction; returns the slots whose object changed.
#[allow(clippy::type_complexity)]
fn apply_in_tx(
    tx: &mut logheap::Tx<'_>,
    root: PPtr<Table>,
    ops: &[Op],
) -> Result<Vec<(usize, Option<(u64, u64)>)>, Abandon> {
    let mut table = tx.read(root)?;
    let mut made = Vec::new();
    for op in ops {
        match op {
            Op::Alloc { slot, data } => {
                let home = tx.alloc_bytes(data.len() as u64)?;
                tx.write_bytes(home, data)?;
                table[*slot] = Slot {
                    ptr: home,
                    len: data.len() as u64,
                };
                made.push((*slot, Some((home, data.len() as u64))));
            }
            Op::Free { slot } => {
                tx.free(PPtr::<u8>::from_offset(table[*slot].ptr))?;
                table[*slot] = Slot::default();
                made.push((*slot, None));
            }
            Op::Write { slot, offset, data } => {
                tx.write_bytes(table[*slot].ptr + *offset as u64, data)?;
            }
            Op::Span {
                first,
                from_end,
                data,
                ..
            } => {
                let s = table[*first];
                tx.write_bytes(s.ptr + s.len - *from_end as u64, data)?;
            }
        }
    }
    tx.write(root, &table)?;
    Ok(made)
}

impl Op {
    /// The slot the operation changes first.
    fn slot(&self) -> usize {
        match self {
            Op::Alloc { slot, .. } | Op::Free { slot } | Op::Write { slot, .. } => *slot,
            Op::Span { first, .. } => *first,
        }
    }
}

/// Chooses one transaction's operations from the current state.
fn plan(rng: &mut ChaCha8Rng, model: &Model, ptrs: &[Option<(u64, u64)>]) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut touched = [false; SLOTS];
    let many = rng.random_ratio(1, 10);
    let n = if many { 40 } else { rng.random_range(1..=4) };
    for _ in 0..n {
        let slot = rng.random_range(0..SLOTS);
        let choice = if many { 2 } else { rng.random_range(0..10) };
        match (&model[slot], touched[slot]) {
            (None, false) if !many => {
                let len = match rng.random_range(0..10) {
                    0 => rng.random_range(5_000..20_000),
                    1..=3 => [64, 128][rng.random_range(0..2)],
                    _ => rng.random_range(8..300),
                };
                ops.push(Op::Alloc {
                    slot,
                    data: random_bytes(rng, len),
                });
                touched[slot] = true;
            }
            (Some(obj), false) if choice == 0 => {
                let _ = obj;
                ops.push(Op::Free { slot });
                touched[slot] = true;
            }
            (Some(obj), false) if choice == 1 => {
                // Adjacent neighbour in home space? Write across the boundary.
                let (p, l) = ptrs[slot].unwrap_or((0, 0));
                let next = (0..SLOTS).find(|&j| {
                    !touched[j] && j != slot && ptrs[j].is_some_and(|(q, _)| q == p + l)
                });
                if let Some(second) = next {
                    let second_len = ptrs[second].map_or(0, |(_, l)| l) as usize;
                    let from_end = rng.random_range(1..=obj.len().min(40));
                    let into = rng.random_range(1..=second_len.min(40));
                    ops.push(Op::Span {
                        first: slot,
                        second,
                        from_end,
                        data: random_bytes(rng, from_end + into),
                    });
                }
            }
            (Some(obj), false) => {
                let offset = rng.random_range(0..obj.len());
                let len =
                    rng.random_range(1..=(obj.len() - offset).min(if many { 16 } else { 400 }));
                ops.push(Op::Write {
                    slot,
                    offset,
                    data: random_bytes(rng, len),
                });
            }
            _ => {}
        }
    }
    ops
}

fn random_bytes(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.random()).collect()
}

fn apply(model: &mut Model, op: &Op) {
    match op {
        Op::Alloc { slot, data } => model[*slot] = Some(data.clone()),
        Op::Free { slot } => model[*slot] = None,
        Op::Write { slot, offset, data } => {
            if let Some(obj) = &mut model[*slot] {
                obj[*offset..*offset + data.len()].copy_from_slice(data);
            }
        }
        Op::Span {
            first,
            second,
            from_end,
            data,
        } => {
            if let Some(a) = &mut model[*first] {
                let start = a.len() - from_end;
                a[start..].copy_from_slice(&data[..*from_end]);
            }
            if let Some(b) = &mut model[*second] {
                b[..data.len() - from_end].copy_from_slice(&data[*from_end..]);
            }
        }
    }
}

/// Opens one crash image and compares it with the expected states.
fn check_image(image: Vec<u8>, config: &Config, e: &mut Expected, fence: u64) {
    e.images += 1;
    let keep = (e.save.is_some() && e.first_violation.is_none()).then(|| image.clone());
    if let Err(why) = recovered_matches(image, config, e) {
        e.violations += 1;
        if e.first_violation.is_none() {
            let mut what = format!("at fence {fence} (session {}): {why}", e.session);
            if let (Some(path), Some(image)) = (&e.save, keep) {
                match std::fs::write(path, image) {
                    Ok(()) => what += &format!(" (image saved to {})", path.display()),
                    Err(err) => what += &format!(" (image not saved: {err})"),
                }
            }
            e.first_violation = Some(what);
        }
    }
}

/// The table's objects, and their (home, length), of a recovered pool.
fn read_state(pool: &Pool) -> Result<(Model, Placement), String> {
    let root: PPtr<Table> = pool.root().map_err(|e| e.to_string())?;
    pool.read(|tx| {
        let table = tx.read(root)?;
        let mut state: Model = Vec::with_capacity(SLOTS);
        let mut ptrs = Vec::with_capacity(SLOTS);
        for s in table {
            if s.ptr == 0 {
                state.push(None);
                ptrs.push(None);
                continue;
            }
            let mut bytes = vec![0u8; s.len.min(1 << 20) as usize];
            tx.read_bytes(s.ptr, &mut bytes)?;
            state.push(Some(bytes));
            ptrs.push(Some((s.ptr, s.len)));
        }
        Ok::<_, Error>((state, ptrs))
    })
    .map_err(|e| format!("reading the recovered pool failed: {e}"))
}

/// Opens `image` (running recovery) and checks it holds `before` or `after` with exactly
/// the allocations that state references. Recovery's own writes are crash-tested too:
/// when it wrote something (erased a torn commit), every crash image of its fences (a
/// sample) must recover to the same state again.
fn recovered_matches(image: Vec<u8>, config: &Config, e: &mut Expected) -> Result<(), String> {
    let (before, after) = (&e.before, &e.after);
    let nested = SimConfig {
        max_images_per_fence: 6,
        random_images: 2,
        ..SimConfig::default()
    };
    let file = PoolFile::open_image(image, &config.media, nested)
        .map_err(|e| format!("the image does not open: {e}"))?;
    let during_recovery = Arc::new(Mutex::new(Vec::new()));
    let sink = during_recovery.clone();
    if let Some(simulator) = file.media().crash_simulator() {
        simulator.set_fence_hook(Box::new(move |point| {
            sink.lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(point.images())
        }));
    }
    let pool =
        Pool::from_file(file, config).map_err(|e| format!("the image does not open: {e}"))?;
    if let Some(simulator) = pool.media().crash_simulator() {
        simulator.take_fence_hook();
    }
    let state = matches_model(&pool, before, after)?;
    let stats = pool.stats();
    let repaired = match stats.log() {
        Some(log) => log.recovery.dropped_transactions + log.recovery.chunks_reclaimed > 0,
        None => stats.engine_stats.records_recovered() > 0,
    };
    e.repairs += repaired as u64;
    if repaired
        && e.recovery_crashes_every > 0
        && e.repairs.is_multiple_of(e.recovery_crashes_every)
    {
        let images =
            std::mem::take(&mut *during_recovery.lock().unwrap_or_else(|p| p.into_inner()));
        for image in images {
            let again = Pool::open_image(image, config, SimConfig::default()).map_err(|e| {
                format!("a crash during recovery left an image that does not open: {e}")
            })?;
            let second = matches_model(&again, before, after)
                .map_err(|e| format!("after a crash during recovery: {e}"))?;
            if second != state {
                return Err("a crash during recovery changed what recovery recovers".into());
            }
        }
    }
    Ok(())
}

/// Checks a recovered pool holds `before` or `after`, with exactly the allocations that
/// state references; returns the state.
fn matches_model(pool: &Pool, before: &Model, after: &Model) -> Result<Model, String> {
    let (state, ptrs) = read_state(pool)?;
    if state != *before && state != *after {
        let differing: Vec<usize> = (0..SLOTS)
            .filter(|&i| state[i] != before[i] && state[i] != after[i])
            .collect();
        return Err(format!(
            "the recovered state is neither before nor after; slots {differing:?} differ"
        ));
    }
    let mut referenced: Vec<(u64, u64)> = ptrs.into_iter().flatten().collect();
    referenced.sort_unstable();
    let mut allocations = pool.allocations();
    if pool.header().engine != logheap::EngineKind::Log {
        // The in-place engines report usable sizes: compare them as allocated.
        for (a, r) in allocations.iter_mut().zip(&referenced) {
            if a.0 == r.0 && a.1 >= r.1 {
                a.1 = r.1;
            }
        }
    }
    if allocations != referenced {
        return Err(format!(
            "the recovered allocations ({}) are not the referenced objects ({})",
            allocations.len(),
            referenced.len()
        ));
    }
    Ok(state)
}
