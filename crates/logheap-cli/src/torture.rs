//! `logheap torture`: kill tests on a real pool file. A child process runs transactions
//! on a file-backed pool and reports each one the library acknowledged; the parent kills
//! it with `SIGKILL` at a random moment (also in the middle of its recovery), reopens the
//! pool, and checks that every acknowledged transaction is there and the data structure
//! (a persistent hash map) is exactly what that many transactions make.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use logheap::{Config, Durability, EngineConfig, Error, PPtr, Pool};
use logheap_collections::HashMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Options of `logheap torture`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many times to kill the child.
    #[arg(long, default_value_t = 100)]
    kills: u64,
    /// Directory for the pool file (default: /dev/shm for pmem, the temporary directory
    /// for msync).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// How the pool persists: auto (chosen by the file system: pmem on tmpfs, msync on
    /// an ordinary one), pmem (flush and fence) or msync.
    #[arg(long, default_value = "auto")]
    durability: Durability,
    /// Accept pmem on an ordinary file system, where it survives process crashes (what
    /// this test makes) but not power loss.
    #[arg(long)]
    process_crash_only: bool,
    /// The engine (log, redo, undo, oop, hoop, or any variant `bench --engine` names).
    #[arg(long, default_value = "log")]
    engine: EngineConfig,
    /// Seed of the kill moments.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of the summary line.
    #[arg(long)]
    json: bool,
}

/// Options of the hidden child command.
#[derive(Debug, clap::Args)]
pub struct ChildArgs {
    pool: PathBuf,
    #[arg(long)]
    durability: Durability,
    #[arg(long)]
    process_crash_only: bool,
    #[arg(long)]
    engine: EngineConfig,
}

#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Root {
    /// Transactions committed.
    count: u64,
    /// The hash map's header.
    map: u64,
}

/// The outcome.
#[derive(Debug, serde::Serialize)]
struct Outcome {
    engine: String,
    durability: String,
    kills: u64,
    /// Kills that hit the child before its first acknowledgement (often in recovery).
    kills_before_first_ack: u64,
    acknowledged: u64,
    committed: u64,
    lost: u64,
    seconds: f64,
}

/// What transaction `i` (from 0) does to the map, as (key, Some(value)) or (key, None).
fn transaction_ops(i: u64) -> Vec<(u64, Option<Vec<u8>>)> {
    let value = |key: u64| -> Vec<u8> {
        let text = format!("key {key} written by transaction {i};");
        text.repeat(1 + (i % 4) as usize).into_bytes()
    };
    let mut ops = vec![(i, Some(value(i)))];
    if i % 3 == 2 {
        ops.push((i / 2, None));
    }
    if i % 5 == 4 {
        ops.push((i / 3, Some(value(i / 3))));
    }
    ops
}

/// The map after `n` transactions.
fn model(n: u64) -> BTreeMap<u64, Vec<u8>> {
    let mut m = BTreeMap::new();
    for i in 0..n {
        for (key, value) in transaction_ops(i) {
            match value {
                Some(v) => m.insert(key, v),
                None => m.remove(&key),
            };
        }
    }
    m
}

fn config(engine: EngineConfig, durability: Durability, process_crash_only: bool) -> Config {
    let config = Config::default()
        .size(64 << 20)
        .engine(engine)
        .durability(durability);
    if process_crash_only {
        config.accept_process_crash_only()
    } else {
        config
    }
}

/// Runs the kill test and prints its outcome.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let base = match (&args.dir, args.durability) {
        (Some(d), _) => d.clone(),
        (None, Durability::Pmem | Durability::Auto) if Path::new("/dev/shm").is_dir() => {
            "/dev/shm".into()
        }
        (None, _) => std::env::temp_dir(),
    };
    let dir = tempfile::Builder::new()
        .prefix("logheap-torture-")
        .tempdir_in(&base)
        .map_err(|e| format!("{}: {e}", base.display()))?;
    let path = dir.path().join("torture.pool");
    let mode = {
        let pool = Pool::create(
            &path,
            &config(args.engine, args.durability, args.process_crash_only),
        )?;
        let root: PPtr<Root> = pool.root()?;
        pool.transaction(|tx| {
            let map = HashMap::create(tx, 257)?;
            tx.write(
                root,
                &Root {
                    count: 0,
                    map: map.pointer(),
                },
            )
        })?;
        let stats = pool.stats();
        pool.close()?;
        format!("{} ({} medium)", stats.durability, stats.medium)
    };
    let start = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut out = Outcome {
        engine: args.engine.to_string(),
        durability: mode,
        kills: 0,
        kills_before_first_ack: 0,
        acknowledged: 0,
        committed: 0,
        lost: 0,
        seconds: 0.0,
    };
    let exe = std::env::current_exe()?;
    for k in 0..args.kills {
        let mut child = Command::new(&exe)
            .arg("torture-child")
            .arg(&path)
            .arg("--durability")
            .arg(args.durability.name())
            .arg("--engine")
            .arg(args.engine.to_string())
            .args(args.process_crash_only.then_some("--process-crash-only"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no child output")?;
        let mut lines = BufReader::new(stdout).lines();
        // Kill right away (in the middle of opening and recovery), or after some acks.
        let target = if rng.random_ratio(1, 5) {
            0
        } else {
            rng.random_range(1..=40)
        };
        let mut acked = None;
        for _ in 0..target {
            match lines.next() {
                Some(Ok(line)) => acked = Some(line.trim().parse::<u64>()?),
                _ => return Err(format!("kill {k}: the child stopped on its own").into()),
            }
        }
        child.kill()?;
        child.wait()?;
        // Acknowledgements already written by the child count too.
        for line in lines.map_while(Result::ok) {
            acked = Some(line.trim().parse::<u64>()?);
        }
        out.kills += 1;
        match acked {
            None => out.kills_before_first_ack += 1,
            Some(n) => out.acknowledged = out.acknowledged.max(n),
        }
        let pool = Pool::open_with(
            &path,
            &config(args.engine, args.durability, args.process_crash_only),
        )
        .map_err(|e| format!("kill {k}: the pool does not reopen: {e}"))?;
        let count = verify(&pool).map_err(|e| format!("kill {k}: {e}"))?;
        if count < out.acknowledged {
            out.lost += out.acknowledged - count;
            return Err(format!(
                "kill {k}: {} acknowledged transactions, {count} in the pool",
                out.acknowledged
            )
            .into());
        }
        out.committed = count;
        // Leave it closed cleanly now and then, and crashed otherwise.
        if rng.random_ratio(1, 2) {
            pool.close()?;
        }
    }
    out.seconds = start.elapsed().as_secs_f64();
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!(
            "kills={} acknowledged={} committed={} lost={} ({} s, engine {}, {})",
            out.kills,
            out.acknowledged,
            out.committed,
            out.lost,
            out.seconds.round(),
            out.engine,
            out.durability
        );
    }
    Ok(())
}

/// Checks the map holds exactly what `count` transactions make; returns `count`.
fn verify(pool: &Pool) -> Result<u64, String> {
    let root: PPtr<Root> = pool.root().map_err(|e| e.to_string())?;
    let (count, found) = pool
        .read(|tx| {
            let r = tx.read(root)?;
            let map = HashMap::from_pointer(r.map);
            let mut found = BTreeMap::new();
            for key in 0..r.count {
                if let Some(v) = map.get(tx, key)? {
                    found.insert(key, v);
                }
            }
            if map.len(tx)? != found.len() as u64 {
                return Err(Error::InvalidRange {
                    home: r.map,
                    len: 0,
                });
            }
            Ok((r.count, found))
        })
        .map_err(|e| format!("the map is inconsistent: {e}"))?;
    if found != model(count) {
        return Err(format!(
            "the map differs from what {count} transactions make"
        ));
    }
    let allocations = pool.allocations().len();
    // Header, bucket table, striped count, and one node plus one value per key (at most).
    if allocations > 3 + 2 * found.len() + 16 {
        return Err(format!(
            "{allocations} allocations for {} keys: a leak",
            found.len()
        ));
    }
    Ok(count)
}

/// The child: opens the pool and runs transactions, printing each acknowledged count.
pub fn child(args: &ChildArgs) -> Result<(), Box<dyn std::error::Error>> {
    let pool = Pool::open_with(
        &args.pool,
        &config(args.engine, args.durability, args.process_crash_only),
    )?;
    let root: PPtr<Root> = pool.root()?;
    let mut stdout = std::io::stdout().lock();
    loop {
        let count = pool.transaction(|tx| {
            let mut r = tx.read(root)?;
            let map = HashMap::from_pointer(r.map);
            for (key, value) in transaction_ops(r.count) {
                match value {
                    Some(v) => {
                        map.insert(tx, key, &v)?;
                    }
                    None => {
                        map.remove(tx, key)?;
                    }
                }
            }
            r.count += 1;
            tx.write(root, &r)?;
            Ok::<_, Error>(r.count)
        })?;
        writeln!(stdout, "{count}")?;
        stdout.flush()?;
    }
}
