//! The `logheap` command: benchmark the engines side by side, create, check, inspect and
//! compact pools, crash-test and kill-test engines, time recovery, calibrate the NVM
//! emulation.

mod bench;
mod calibrate;
mod check;
mod compact;
mod crashtest;
mod create;
mod dump;
mod inspect;
mod kv;
mod kv_bench;
mod kv_cluster;
mod kv_failover;
mod kv_server;
mod recovery_bench;
mod rm;
mod size;
mod torture;
mod ycsb;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Options of the commands that take one pool file (`check`, `compact`, `inspect`).
#[derive(Debug, clap::Args)]
pub struct PoolArgs {
    /// The pool file.
    path: std::path::PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// logheap: persistent transactional memory with a log-structured heap and its baselines
/// (redo, undo, oop, hoop) behind one API.
#[derive(Debug, Parser)]
#[command(name = "logheap", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the paper's workloads on every mapping configuration and report.
    Bench(Box<bench::Args>),
    /// Measure fence, flush and non-temporal copy costs, and the NVM emulation's accuracy.
    Calibrate(calibrate::Args),
    /// Create an empty pool file.
    Create(create::Args),
    /// Verify a pool read-only: header, every chunk and block, allocations, mapping.
    /// Exits 0 when sound, 1 when damaged, 2 when the pool cannot be checked.
    Check(check::Args),
    /// Compact a pool's log (copy its live data into as few chunks as it fits) and
    /// close it cleanly; on a pool of an in-place engine or a persistent-heap pool, punch
    /// its heap's free pages out of the file.
    Compact(compact::Args),
    /// Print a pool file's header, state, logs and the durability mode an open would
    /// use, without opening it (`info` is another name for it).
    #[command(alias = "info")]
    Inspect(inspect::Args),
    /// The ordered key-value store (logheap-kv) in a pool: get, put, del, scan, load,
    /// stats. Writes create the pool on first use.
    Kv(kv::Args),
    /// One node of a replicated logheap-kv cluster (Raft, openraft) serving HTTP: get,
    /// put, delete, scan (linearizable), cluster membership and metrics.
    KvServer(kv_server::Args),
    /// The failover test of a replicated logheap-kv cluster: three `kv-server`
    /// processes; each round writes through the leader, kills it with SIGKILL and checks
    /// that the new leader has every acknowledged write. Exits 1 on a violation.
    KvFailover(kv_failover::Args),
    /// The replicated key-value store on three nodes: put throughput and latency, time to
    /// elect a new leader, time for a new node to catch up from a snapshot; beside
    /// openraft's RocksDB example when `--peer` gives its binary.
    KvBench(kv_bench::Args),
    /// Print a pool's root area and every live allocation with their bytes (hex lines,
    /// or JSON).
    Dump(dump::Args),
    /// Remove a pool file with its extension files (`<pool>.d/`); a file that is no pool
    /// and a pool open in any process are refused and left as they are.
    #[command(alias = "remove")]
    Rm(rm::Args),
    /// Kill tests: kill a child running transactions on a pool file with SIGKILL, again
    /// and again, and check every acknowledged transaction survives.
    Torture(torture::Args),
    #[command(hide = true)]
    TortureChild(torture::ChildArgs),
    /// Check crash consistency: every crash image of a workload must recover to the
    /// state before or after the transaction in flight.
    Crashtest(crashtest::Args),
    /// YCSB core workloads A-F on logheap-kv and its peers (LMDB, redb, fjall, RocksDB
    /// when built in), durable commits everywhere; writes results.jsonl, results.md and
    /// plots.
    Ycsb(Box<ycsb::Args>),
    /// Time opening a pool (recovery from the log after a crash, and after a clean
    /// close) with each number of recovery threads.
    RecoveryBench(recovery_bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check(args) => return check::run(&args),
        Command::Create(args) => create::run(&args),
        Command::Kv(args) => return kv::run(&args),
        Command::KvServer(args) => kv_server::run(&args),
        Command::KvFailover(args) => kv_failover::run(&args),
        Command::KvBench(args) => kv_bench::run(&args),
        Command::Compact(args) => compact::run(&args),
        Command::Bench(args) => bench::run_bench(&args),
        Command::Calibrate(args) => calibrate::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Rm(args) => rm::run(&args),
        Command::Dump(args) => dump::run(&args),
        Command::Crashtest(args) => crashtest::run(&args),
        Command::RecoveryBench(args) => recovery_bench::run(&args),
        Command::Torture(args) => torture::run(&args),
        Command::Ycsb(args) => ycsb::run(&args),
        Command::TortureChild(args) => torture::child(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("logheap: {e}");
            ExitCode::FAILURE
        }
    }
}
