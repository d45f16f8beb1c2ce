//! `logheap recovery-bench`: how fast opening a pool rebuilds the mapping and the
//! allocator from the log ("Log-structured Non-volatile Main Memory", USENIX ATC 2017,
//! §4.5 and Fig. 12), with each number of recovery threads.
//!
//! It fills a pool on `/dev/shm` with `--objects` objects of `--value-size` bytes
//! (allocated and written in transactions of `--batch` objects by `--writers` threads),
//! then overwrites a share of them (`--update-share`), and then:
//!
//! - *crashed*: drops the pool without closing it, so every open runs recovery from the
//!   log; it times each open, with each thread count, `--repeat` times (each open drops
//!   the pool again without closing it);
//! - *clean*: closes the pool cleanly and times each open the same way (closing
//!   cleanly again after each). A clean close leaves a snapshot of the mapping, the
//!   allocator and the chunks in a log (§3.5), so this open loads the snapshot and
//!   reads only the chunk headers and each log's last chunk (the others are checked
//!   after the open, by their first read and a background scrub); each run says
//!   whether it loaded the snapshot and how many chunks it left to check.
//!
//! Each run reports the log bytes read (chunks in use times the chunk size), the
//! seconds the open took, their ratio in GB/s, and the DRAM the mapping holds after the
//! open beside the payload (objects times value size). The first open of each thread
//! count also reads every object back and compares it with what was written. With
//! several `--value-size`s, each gets its own pool. The summary tables give the
//! figures of the paper's Fig. 12 (recovery against threads and value size), Fig. 13
//! (mapping DRAM against value size) and the clean-open speedup; `--plot DIR` draws
//! them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use logheap::{Config, Pool, SnapshotUse};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::size::parse_size;

/// Options of `logheap recovery-bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Objects to allocate and write.
    #[arg(long, default_value_t = 1_000_000)]
    objects: u64,
    /// Value sizes in bytes, 1 to 65535 (repeat the option; default 128).
    #[arg(long = "value-size")]
    value_size: Vec<u64>,
    /// Recovery thread counts to measure (repeat the option; default 1 and 2).
    #[arg(long = "threads")]
    threads: Vec<usize>,
    /// Share of the objects overwritten (whole values, in random order) after they are
    /// all written.
    #[arg(long, default_value_t = 0.25)]
    update_share: f64,
    /// Objects allocated (or overwritten) per transaction.
    #[arg(long, default_value_t = 16)]
    batch: u64,
    /// Threads writing the pool (each commits through its own log set, so their logs
    /// interleave in the pool as they would in an application).
    #[arg(long, default_value_t = 2)]
    writers: usize,
    /// Timed opens per thread count and pool state.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Log chunk size.
    #[arg(long, value_parser = parse_size, default_value = "32K")]
    chunk_size: u64,
    /// Pool size (default: twice the log the objects need, plus 256 MiB). The file is
    /// sparse: only the chunks the log formats are ever touched.
    #[arg(long, value_parser = parse_size)]
    pool_size: Option<u64>,
    /// Directory for the pool file (default: /dev/shm when present, else the temporary
    /// directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seed of the update order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object per run instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw the figures (SVG and PNG) into this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// One timed open.
#[derive(Debug, Clone, serde::Serialize)]
struct Run {
    /// `crashed` (recovery after a crash) or `clean` (open after a clean close).
    state: &'static str,
    threads: usize,
    run: usize,
    /// Whether the pool had been closed cleanly (as the engine saw it).
    was_clean: bool,
    /// Whether the open loaded the clean-close snapshot (`loaded`), found none (`none`),
    /// or could not use it (`rejected: why`).
    snapshot: String,
    objects: u64,
    value_size: u64,
    chunks_in_use: u64,
    /// Chunks in a log the open did not read (checked after it).
    chunks_unchecked: u64,
    transactions: u64,
    log_bytes: u64,
    seconds: f64,
    gb_per_s: f64,
    /// Objects times value size.
    payload_bytes: u64,
    /// DRAM the mapping holds after the open.
    mapping_dram_bytes: u64,
    /// Seconds the clean close after this open took (it writes the snapshot), for the
    /// clean state.
    close_seconds: Option<f64>,
}

/// The value of object `i` after `round` overwrites.
fn value(i: u64, round: u64, size: usize, buf: &mut Vec<u8>) {
    buf.clear();
    let mut x =
        (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ round.wrapping_mul(0xd6e8_feb8_6659_fd93);
    while buf.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf.extend_from_slice(&x.to_le_bytes()[..(size - buf.len()).min(8)]);
    }
}

/// Fills the pool: every object allocated with its first value, then `updates` of
/// them overwritten once. Returns each object's home and number of overwrites.
fn fill(pool: &Pool, args: &Args, size: usize) -> Result<(Vec<u64>, Vec<u64>), String> {
    let n = args.objects;
    let batch = args.batch.max(1);
    let writers = args.writers.max(1) as u64;
    // Writer w allocates the objects w, w + writers, ...
    let homes: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .map(|w| {
                s.spawn(move || -> Result<Vec<u64>, String> {
                    let mine: Vec<u64> = (w..n).step_by(writers as usize).collect();
                    let mut homes = Vec::with_capacity(mine.len());
                    let mut buf = Vec::new();
                    for part in mine.chunks(batch as usize) {
                        let got = pool
                            .transaction(|tx| {
                                let mut got = Vec::with_capacity(part.len());
                                for &i in part {
                                    value(i, 0, size, &mut buf);
                                    let home = tx.alloc_bytes(size as u64)?;
                                    tx.write_bytes(home, &buf)?;
                                    got.push(home);
                                }
                                Ok::<_, logheap::Error>(got)
                            })
                            .map_err(|e| format!("writing the pool: {e}"))?;
                        homes.extend(got);
                    }
                    Ok(homes)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a writer panicked"))
            .collect::<Result<_, _>>()
    })?;
    let mut by_object = vec![0u64; n as usize];
    for (w, list) in homes.iter().enumerate() {
        for (k, &home) in list.iter().enumerate() {
            by_object[w + k * writers as usize] = home;
        }
    }
    // Overwrites, in random order, split between the writers.
    let updates = ((n as f64) * args.update_share.clamp(0.0, 1.0)) as usize;
    let mut order: Vec<u64> = (0..n).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(args.seed));
    order.truncate(updates);
    let by_object_ref = &by_object;
    std::thread::scope(|s| {
        let handles: Vec<_> = order
            .chunks(updates.div_ceil(writers as usize).max(1))
            .map(|mine| {
                s.spawn(move || -> Result<(), String> {
                    let mut buf = Vec::new();
                    for part in mine.chunks(batch as usize) {
                        pool.transaction(|tx| {
                            for &i in part {
                                value(i, 1, size, &mut buf);
                                tx.write_bytes(by_object_ref[i as usize], &buf)?;
                            }
                            Ok::<_, logheap::Error>(())
                        })
                        .map_err(|e| format!("updating the pool: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("an updater panicked"))
    })?;
    let mut rounds = vec![0u64; n as usize];
    for &i in &order {
        rounds[i as usize] = 1;
    }
    Ok((by_object, rounds))
}

/// Reads every object back and compares it with what was written.
fn verify(pool: &Pool, homes: &[u64], rounds: &[u64], size: usize) -> Result<(), String> {
    if pool.stats().allocations != homes.len() as u64 {
        return Err(format!(
            "{} allocations after recovery, {} written",
            pool.stats().allocations,
            homes.len()
        ));
    }
    let mut expected = Vec::new();
    let mut got = vec![0u8; size];
    for part in (0..homes.len()).collect::<Vec<_>>().chunks(4096) {
        let wrong = pool
            .read(|tx| {
                for &i in part {
                    tx.read_bytes(homes[i], &mut got)?;
                    value(i as u64, rounds[i], size, &mut expected);
                    if got != expected {
                        return Ok(Some(i));
                    }
                }
                Ok::<_, logheap::Error>(None)
            })
            .map_err(|e| format!("verifying: {e}"))?;
        if let Some(i) = wrong {
            return Err(format!(
                "object {i} at {:#x} does not hold what was written",
                homes[i]
            ));
        }
    }
    Ok(())
}

/// Opens the pool with `threads` recovery threads and times the open.
fn timed_open(path: &Path, threads: usize) -> Result<(Pool, f64), String> {
    let config = Config::default().recovery_threads(threads);
    let start = Instant::now();
    let pool = Pool::open_with(path, &config).map_err(|e| format!("opening: {e}"))?;
    Ok((pool, start.elapsed().as_secs_f64()))
}

/// Runs the benchmark and prints its results.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let sizes = if args.value_size.is_empty() {
        vec![128]
    } else {
        args.value_size.clone()
    };
    if sizes.iter().any(|s| !(1..=65535).contains(s)) {
        return Err("--value-size must be 1 to 65535".into());
    }
    let threads = if args.threads.is_empty() {
        vec![1, 2]
    } else {
        args.threads.clone()
    };
    let base = match &args.dir {
        Some(d) => d.clone(),
        None if Path::new("/dev/shm").is_dir() => "/dev/shm".into(),
        None => std::env::temp_dir(),
    };
    let dir = tempfile::Builder::new()
        .prefix("logheap-recovery-bench-")
        .tempdir_in(&base)
        .map_err(|e| format!("{}: {e}", base.display()))?;
    let mut runs = Vec::new();
    for &value_size in &sizes {
        let path = dir.path().join(format!("recovery-{value_size}.pool"));
        runs.extend(measure(args, &path, value_size, &threads)?);
        std::fs::remove_file(&path)?;
    }
    if !args.json {
        print_tables(&runs, &sizes, &threads);
    }
    if let Some(out) = &args.plot {
        std::fs::create_dir_all(out)?;
        match plot(&runs, &sizes, &threads, out) {
            Ok(files) => eprintln!("plots: {} files in {}", files.len(), out.display()),
            Err(e) => eprintln!("plots not drawn: {e}"),
        }
    }
    Ok(())
}

/// Fills a pool of `value_size`-byte objects at `path` and times its opens after a
/// crash and after a clean close with each thread count.
fn measure(
    args: &Args,
    path: &Path,
    value_size: u64,
    threads: &[usize],
) -> Result<Vec<Run>, Box<dyn std::error::Error>> {
    // Each object: a block preamble share, an allocation record and its image; each
    // overwrite: an entry and its data. Sparse, so the slack costs nothing.
    let per_object = value_size + 64;
    let log_estimate = (args.objects as f64
        * per_object as f64
        * (1.0 + args.update_share.clamp(0.0, 1.0))) as u64;
    let size = args
        .pool_size
        .unwrap_or(log_estimate * 2 + (256 << 20))
        .next_multiple_of(args.chunk_size);
    let config = Config::default()
        .size(size)
        .chunk_size(args.chunk_size)
        .reserve_space(false);
    let started = Instant::now();
    let pool = Pool::create(path, &config)?;
    let (homes, rounds) = fill(&pool, args, value_size as usize)?;
    let written = pool.stats().log().cloned().unwrap_or_default();
    eprintln!(
        "wrote {} objects of {value_size} B ({} overwritten) in {:.1} s: {} chunks of {} B in use",
        args.objects,
        rounds.iter().filter(|&&r| r > 0).count(),
        started.elapsed().as_secs_f64(),
        written.chunks_total - written.chunks_free,
        args.chunk_size
    );
    // A crash: the pool is dropped without its clean close.
    pool.abandon();

    let mut runs = Vec::new();
    for state in ["crashed", "clean"] {
        if state == "clean" {
            let (pool, _) = timed_open(path, 0)?;
            pool.close()?;
        }
        for &t in threads {
            for r in 0..args.repeat.max(1) {
                let (pool, seconds) = timed_open(path, t)?;
                let stats = pool.stats().log().cloned().unwrap_or_default();
                let report = &stats.recovery;
                if r == 0 {
                    verify(&pool, &homes, &rounds, value_size as usize)?;
                }
                let log_bytes = report.chunks_in_use * args.chunk_size;
                let mut run = Run {
                    state,
                    threads: t,
                    run: r + 1,
                    was_clean: report.was_clean,
                    snapshot: match &report.snapshot {
                        SnapshotUse::None => "none".into(),
                        SnapshotUse::Loaded => "loaded".into(),
                        SnapshotUse::Rejected(why) => format!("rejected: {why}"),
                    },
                    objects: args.objects,
                    value_size,
                    chunks_in_use: report.chunks_in_use,
                    chunks_unchecked: report.chunks_unchecked,
                    transactions: report.transactions,
                    log_bytes,
                    seconds,
                    gb_per_s: log_bytes as f64 / seconds / 1e9,
                    payload_bytes: args.objects * value_size,
                    mapping_dram_bytes: stats.mapping_dram_bytes,
                    close_seconds: None,
                };
                if run.was_clean != (state == "clean") {
                    return Err(format!(
                        "the {state} pool opened with was_clean = {}",
                        run.was_clean
                    )
                    .into());
                }
                if state == "clean" {
                    let closing = Instant::now();
                    pool.close()?;
                    run.close_seconds = Some(closing.elapsed().as_secs_f64());
                } else {
                    pool.abandon();
                }
                if args.json {
                    println!("{}", serde_json::to_string(&run)?);
                } else {
                    eprintln!(
                        "{state:>7}  {value_size} B  threads {t:>2}  run {}: {:.3} s, {:.1} MB of log, {:.3} GB/s, snapshot {}, {} of {} chunks left to check",
                        run.run,
                        run.seconds,
                        run.log_bytes as f64 / 1e6,
                        run.gb_per_s,
                        run.snapshot,
                        run.chunks_unchecked,
                        run.chunks_in_use
                    );
                }
                runs.push(run);
            }
        }
    }
    Ok(runs)
}

/// The runs of one value size, pool state and thread count.
fn runs_of<'r>(runs: &'r [Run], size: u64, state: &str, threads: usize) -> Vec<&'r Run> {
    runs.iter()
        .filter(|r| r.value_size == size && r.state == state && r.threads == threads)
        .collect()
}

/// The shortest open of `runs` in seconds.
fn best(runs: &[&Run]) -> f64 {
    runs.iter().map(|r| r.seconds).fold(f64::INFINITY, f64::min)
}

/// The per-run table, the clean-open speedup and the mapping's DRAM, as Markdown.
fn print_tables(runs: &[Run], sizes: &[u64], threads: &[usize]) {
    println!(
        "| value B | pool state | threads | log MB | transactions | best s | best GB/s | median GB/s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &size in sizes {
        for state in ["crashed", "clean"] {
            for &t in threads {
                let mine = runs_of(runs, size, state, t);
                let mut rates: Vec<f64> = mine.iter().map(|r| r.gb_per_s).collect();
                rates.sort_by(f64::total_cmp);
                println!(
                    "| {size} | {state} | {t} | {:.1} | {} | {:.3} | {:.3} | {:.3} |",
                    mine[0].log_bytes as f64 / 1e6,
                    mine[0].transactions,
                    best(&mine),
                    rates[rates.len() - 1],
                    rates[rates.len() / 2]
                );
            }
        }
    }
    println!();
    println!(
        "| value B | threads | after a crash, best s | after a clean close, best s | clean open faster by | clean close (writes the snapshot), best s |"
    );
    println!("|---|---|---|---|---|---|");
    for &size in sizes {
        for &t in threads {
            let crashed = best(&runs_of(runs, size, "crashed", t));
            let clean_runs = runs_of(runs, size, "clean", t);
            let clean = best(&clean_runs);
            let close = clean_runs
                .iter()
                .filter_map(|r| r.close_seconds)
                .fold(f64::INFINITY, f64::min);
            println!(
                "| {size} | {t} | {crashed:.3} | {clean:.3} | {:.1}x | {close:.3} |",
                crashed / clean
            );
        }
    }
    println!();
    println!(
        "| value B | payload MB | mapping DRAM MB after a crash | after a clean close | DRAM / payload |"
    );
    println!("|---|---|---|---|---|");
    for &size in sizes {
        let crashed = runs_of(runs, size, "crashed", threads[0])[0];
        let clean = runs_of(runs, size, "clean", threads[0])[0];
        println!(
            "| {size} | {:.1} | {:.1} | {:.1} | {:.3} |",
            crashed.payload_bytes as f64 / 1e6,
            crashed.mapping_dram_bytes as f64 / 1e6,
            clean.mapping_dram_bytes as f64 / 1e6,
            crashed.mapping_dram_bytes as f64 / crashed.payload_bytes as f64
        );
    }
}

/// Draws Fig. 12 (open time against threads, for each value size and pool state; log
/// read per second against value size) and Fig. 13 (mapping DRAM over payload against
/// value size).
fn plot(
    runs: &[Run],
    sizes: &[u64],
    threads: &[usize],
    out: &Path,
) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    use logheap_bench::plots::draw_bars;
    let mut files = Vec::new();
    let thread_names: Vec<String> = threads.iter().map(|t| format!("{t} threads")).collect();
    let size_names: Vec<String> = sizes.iter().map(|s| format!("{s} B")).collect();
    let mut by_threads = Vec::new();
    for &size in sizes {
        for state in ["crashed", "clean"] {
            let v = threads
                .iter()
                .map(|&t| Some(best(&runs_of(runs, size, state, t))))
                .collect();
            by_threads.push((format!("{size} B, {state}"), v));
        }
    }
    files.extend(draw_bars(
        out,
        "fig12a-open-time-vs-threads",
        "Open time after a crash and after a clean close",
        "seconds (best)",
        thread_names,
        by_threads,
    )?);
    let by_size = threads
        .iter()
        .map(|&t| {
            let v = sizes
                .iter()
                .map(|&s| {
                    let mine = runs_of(runs, s, "crashed", t);
                    Some(mine[0].log_bytes as f64 / best(&mine) / 1e9)
                })
                .collect();
            (format!("{t} threads"), v)
        })
        .collect();
    files.extend(draw_bars(
        out,
        "fig12b-recovery-rate-vs-value-size",
        "Crash recovery: log read per second",
        "GB/s (best)",
        size_names.clone(),
        by_size,
    )?);
    let dram = vec![(
        "mapping DRAM / payload".to_string(),
        sizes
            .iter()
            .map(|&s| {
                let r = runs_of(runs, s, "crashed", threads[0])[0];
                Some(r.mapping_dram_bytes as f64 / r.payload_bytes as f64)
            })
            .collect(),
    )];
    files.extend(draw_bars(
        out,
        "fig13-mapping-dram-vs-value-size",
        "Mapping DRAM against value size",
        "DRAM / payload",
        size_names,
        dram,
    )?);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_differ_by_object_and_round_and_have_the_size() {
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        value(1, 0, 13, &mut a);
        value(2, 0, 13, &mut b);
        value(1, 1, 13, &mut c);
        assert_eq!(a.len(), 13);
        assert_ne!(a, b);
        assert_ne!(a, c);
    }
}
