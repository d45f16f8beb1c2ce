//! `logheap check`: verifies a pool read-only and lists every problem found.
//!
//! Exit status: 0 when the pool is sound, 1 when it is damaged, 2 when it cannot be
//! checked (no such file, in use by another process, a format this build cannot read)
//! or the command line is wrong.

use std::process::ExitCode;

use logheap::check::{CheckReport, check};

/// Options of `logheap check`.
pub use crate::PoolArgs as Args;

/// Checks the pool and prints what was found.
pub fn run(args: &Args) -> ExitCode {
    let report = match check(&args.path) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("logheap: cannot check: {e}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        match serde_json::to_string(&report) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("logheap: {e}");
                return ExitCode::from(2);
            }
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
