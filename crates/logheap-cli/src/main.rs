//! The `logheap` command: calibrate the machine, inspect pools, crash-test engines.

mod bench;
mod calibrate;
mod crashtest;
mod inspect;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// logheap: persistent transactional memory with a log-structured heap.
#[derive(Debug, Parser)]
#[command(name = "logheap", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the paper's workloads on every mapping configuration and report.
    Bench(bench::Args),
    /// Measure fence, flush and non-temporal copy costs, and the NVM emulation's accuracy.
    Calibrate(calibrate::Args),
    /// Print a pool file's header and state without opening it.
    Inspect(inspect::Args),
    /// Check crash consistency: every crash image of a workload must recover to the
    /// state before or after the transaction in flight.
    Crashtest(crashtest::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run_bench(&args),
        Command::Calibrate(args) => calibrate::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Crashtest(args) => crashtest::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("logheap: {e}");
            ExitCode::FAILURE
        }
    }
}
