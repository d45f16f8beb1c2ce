//! `logheap crashtest`: runs a mixed transactional workload on the crash-simulation
//! media, opens every crash image the simulator offers at every fence (running
//! recovery), and checks that each recovered pool equals the state before or after the
//! transaction in flight, with exactly the allocations that state references.
//!
//! The workload keeps a table of object slots in the root object. Each transaction does
//! a few of: allocate an object (sizes from 8 bytes to several chunks), free one,
//! overwrite part of one, write a range spanning two adjacent objects, or many small
//! writes; so transactions have blocks in all three logs, span chunks, and split older
//! mappings.

use std::sync::{Arc, Mutex};

use logheap::media::SimConfig;
use logheap::{Config, Error, Fault, PPtr, Pool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Options of `logheap crashtest`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Engine to test: log, or one of the mapping ablation's log-base, log-2l,
    /// log-2l-gu, log-2l-gu-c.
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
    /// Print one JSON object instead of the summary line.
    #[arg(long)]
    json: bool,
    /// Inject a defect (skip-commit-fence), to see the checker fail.
    #[arg(long, hide = true)]
    fault: Option<String>,
}

const SLOTS: usize = 32;

#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Slot {
    ptr: u64,
    len: u64,
}

type Table = [Slot; SLOTS];
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
}

/// The outcome, printed as the last line or as JSON.
#[derive(Debug, serde::Serialize)]
pub struct Outcome {
    engine: String,
    txs: u64,
    seed: u64,
    fences: u64,
    images: u64,
    violations: u64,
    first_violation: Option<String>,
}

/// Runs the crash test and prints its outcome; fails when there were violations.
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

fn crashtest(args: &Args) -> Result<Outcome, Box<dyn std::error::Error>> {
    let fault = match args.fault.as_deref() {
        None => None,
        Some("skip-commit-fence") => Some(Fault::SkipCommitFence),
        Some(other) => return Err(format!("unknown fault {other:?}").into()),
    };
    let config = Config {
        fault,
        ..Config::default()
            .engine_name(&args.engine)?
            .size(2 << 20)
            .chunk_size(4096)
    };
    let sim = SimConfig {
        max_images_per_fence: args.images_per_fence,
        seed: args.seed,
        ..SimConfig::default()
    };
    let mut pool = Pool::create_sim(&config, sim)?;
    let root: PPtr<Table> = pool.root()?;
    let expected = Arc::new(Mutex::new(Expected {
        before: vec![None; SLOTS],
        after: vec![None; SLOTS],
        ..Expected::default()
    }));
    let install_hook = |pool: &Pool| -> Result<(), Box<dyn std::error::Error>> {
        let simulator = pool
            .media()
            .crash_simulator()
            .ok_or("not simulation media")?;
        let hook_expected = expected.clone();
        simulator.set_fence_hook(Box::new(move |point| {
            let mut e = hook_expected.lock().unwrap_or_else(|p| p.into_inner());
            let mut image = Vec::new();
            for i in 0..point.len() {
                point.write_image(i, &mut image);
                check_image(image.clone(), &config, &mut e, point.fence_index());
            }
        }));
        Ok(())
    };
    install_hook(&pool)?;
    let mut fences = 0;

    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut model: Model = vec![None; SLOTS];
    let mut ptrs: Vec<Option<(u64, u64)>> = vec![None; SLOTS];
    for i in 0..args.txs {
        if args.reopen_every > 0 && i > 0 && i % args.reopen_every == 0 && fault.is_none() {
            // Crash now (everything committed is persisted) and go on with the pool
            // recovered from the persisted image, whose logs resume where they ended.
            let simulator = pool
                .media()
                .crash_simulator()
                .ok_or("not simulation media")?;
            fences += simulator.fences();
            simulator.take_fence_hook();
            let image = simulator.persisted_image();
            {
                let mut e = expected.lock().unwrap_or_else(|p| p.into_inner());
                (e.before, e.after) = (model.clone(), model.clone());
                check_image(image.clone(), &config, &mut e, fences);
            }
            pool = Pool::open_image(image, &config, sim)?;
            install_hook(&pool)?;
        }
        let ops = plan(&mut rng, &model, &ptrs);
        let mut after = model.clone();
        for op in &ops {
            apply(&mut after, op);
        }
        {
            let mut e = expected.lock().unwrap_or_else(|p| p.into_inner());
            e.before = model.clone();
            e.after = after.clone();
        }
        let new_ptrs = pool.transaction(|tx| {
            let mut table = tx.read(root)?;
            let mut made = Vec::new();
            for op in &ops {
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
            Ok::<_, Error>(made)
        })?;
        for (slot, p) in new_ptrs {
            ptrs[slot] = p;
        }
        model = after;
    }
    // A crash after the last fence: the final state must recover exactly.
    {
        let mut e = expected.lock().unwrap_or_else(|p| p.into_inner());
        e.before = model.clone();
        e.after = model.clone();
    }
    let simulator = pool
        .media()
        .crash_simulator()
        .ok_or("not simulation media")?;
    let fences = fences + simulator.fences();
    simulator.take_fence_hook();
    simulator.with_crash_point(|point| {
        let mut e = expected.lock().unwrap_or_else(|p| p.into_inner());
        for image in point.images() {
            check_image(image, &config, &mut e, fences + 1);
        }
    });
    let e = expected.lock().unwrap_or_else(|p| p.into_inner());
    Ok(Outcome {
        engine: config.engine_label(),
        txs: args.txs,
        seed: args.seed,
        fences,
        images: e.images,
        violations: e.violations,
        first_violation: e.first_violation.clone(),
    })
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
    if let Err(why) = recovered_matches(image, config, &e.before, &e.after) {
        e.violations += 1;
        if e.first_violation.is_none() {
            e.first_violation = Some(format!("at fence {fence}: {why}"));
        }
    }
}

fn recovered_matches(
    image: Vec<u8>,
    config: &Config,
    before: &Model,
    after: &Model,
) -> Result<(), String> {
    let pool = Pool::open_image(image, config, SimConfig::default())
        .map_err(|e| format!("the image does not open: {e}"))?;
    let root: PPtr<Table> = pool.root().map_err(|e| e.to_string())?;
    let (state, mut referenced) = pool
        .read(|tx| {
            let table = tx.read(root)?;
            let mut state: Model = Vec::with_capacity(SLOTS);
            let mut referenced = Vec::new();
            for s in table {
                if s.ptr == 0 {
                    state.push(None);
                    continue;
                }
                let mut bytes = vec![0u8; s.len.min(1 << 20) as usize];
                tx.read_bytes(s.ptr, &mut bytes)?;
                state.push(Some(bytes));
                referenced.push((s.ptr, s.len));
            }
            Ok::<_, Error>((state, referenced))
        })
        .map_err(|e| format!("reading the recovered pool failed: {e}"))?;
    if state != *before && state != *after {
        let differing: Vec<usize> = (0..SLOTS)
            .filter(|&i| state[i] != before[i] && state[i] != after[i])
            .collect();
        return Err(format!(
            "the recovered state is neither before nor after; slots {differing:?} differ"
        ));
    }
    referenced.sort_unstable();
    let allocations = pool.allocations();
    if allocations != referenced {
        return Err(format!(
            "the recovered allocations ({}) are not the referenced objects ({})",
            allocations.len(),
            referenced.len()
        ));
    }
    Ok(())
}
