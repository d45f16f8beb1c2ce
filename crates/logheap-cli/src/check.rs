//! `logheap check`: verifies a pool read-only and lists every problem found; with
//! `--repair`, makes a damaged pool sound again (after a backup) and says what it
//! dropped.
//!
//! Exit status: 0 when the pool is sound (after the repair, with `--repair`), 1 when it
//! is damaged, 2 when it cannot be checked or repaired (no such file, in use by another
//! process, a format this build cannot read, damage a repair cannot drop, a backup
//! path that exists) or the command line is wrong.

use std::path::PathBuf;
use std::process::ExitCode;

use logheap::check::{CheckReport, RepairReport, check, repair};

/// Options of `logheap check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pool file.
    path: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Make a damaged pool sound again, dropping exactly what cannot be trusted: on the
    /// log engine, every transaction from the first one the damage hides (the pool as
    /// it was before the damage); on an in-place engine with data checksums, each
    /// damaged line of user data (zeroed). The pool is copied first (see --backup).
    #[arg(long)]
    repair: bool,
    /// Where --repair copies the pool (and its extension files, to <FILE>.d/) before
    /// changing it; refused when it exists. Default: <pool>.backup.
    #[arg(long, requires = "repair", value_name = "FILE")]
    backup: Option<PathBuf>,
}

/// Checks (or repairs) the pool and prints what was found.
pub fn run(args: &Args) -> ExitCode {
    if args.repair {
        return run_repair(args);
    }
    let report = match check(&args.path) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("logheap: cannot check: {e}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        if let Err(code) = print_json(&report) {
            return code;
        }
    } else {
        print_report(&report);
    }
    if report.is_sound() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn print_report(r: &CheckReport) {
    println!("pool          {}", r.path.display());
    if let Some(h) = &r.header {
        println!("engine        {} (format {})", h.engine, h.format_version);
    }
    if let Some(clean) = r.clean {
        println!(
            "state         {}",
            if clean {
                "closed cleanly"
            } else {
                "not closed cleanly (recovery runs at the next open)"
            }
        );
    }
    if let Some(rec) = &r.recovery {
        println!(
            "log           {} chunks in use, {} blocks, {} committed transactions (largest version {})",
            rec.chunks_in_use, rec.blocks, rec.transactions, rec.max_version
        );
        if rec.dropped_transactions > 0 {
            println!(
                "in flight     {} unfinished transaction(s) a crash interrupted; the next open drops them",
                rec.dropped_transactions
            );
        }
        println!(
            "heap          {} allocations, {} bytes; {} log bytes live",
            r.allocations, r.allocated_bytes, r.live_log_bytes
        );
        match &rec.snapshot {
            logheap::SnapshotUse::None => {}
            logheap::SnapshotUse::Loaded => {
                println!("snapshot      sound: the next open loads it instead of replaying the log")
            }
            logheap::SnapshotUse::Rejected(why) => {
                println!("snapshot      not usable ({why}): the next open replays the log")
            }
        }
    }
    if r.recovery.is_none() && r.header.is_some() {
        // An in-place engine or a persistent heap: a copy was recovered in memory.
        println!(
            "heap          {} allocations, {} bytes",
            r.allocations, r.allocated_bytes
        );
    }
    if r.problems.is_empty() {
        println!("result        sound");
    } else {
        println!("result        damaged: {} problem(s)", r.problems.len());
        for p in &r.problems {
            println!("  {p}");
        }
    }
}

/// Prints `value` as one line of JSON (exit status 2 when it cannot be).
fn print_json(value: &impl serde::Serialize) -> Result<(), ExitCode> {
    match serde_json::to_string(value) {
        Ok(line) => {
            println!("{line}");
            Ok(())
        }
        Err(e) => {
            eprintln!("logheap: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// `check --repair`.
fn run_repair(args: &Args) -> ExitCode {
    let backup = args.backup.clone().unwrap_or_else(|| {
        let mut name = args.path.as_os_str().to_owned();
        name.push(".backup");
        name.into()
    });
    let report = match repair(&args.path, &backup) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("logheap: {e}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        if let Err(code) = print_json(&report) {
            return code;
        }
    } else {
        print_repair(&report);
    }
    if report.after.is_sound() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn print_repair(r: &RepairReport) {
    let Some(backup) = &r.backup else {
        print_report(&r.after);
        println!("repair        nothing to do: the pool is sound");
        return;
    };
    println!("before        {} problem(s)", r.before.problems.len());
    for p in &r.before.problems {
        println!("  {p}");
    }
    println!("backup        {}", backup.display());
    if r.dropped.is_empty() {
        println!("dropped       nothing");
    }
    for d in &r.dropped {
        println!("dropped       {d}");
    }
    println!("after:");
    print_report(&r.after);
}
