//! `logheap calibrate`: what persistence costs on this machine.

use std::path::PathBuf;

use logheap::FlushInstruction;
use logheap::media::{CalibrationOptions, calibrate};

/// Options of `logheap calibrate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Emulated NVM write latency to check, in nanoseconds.
    #[arg(long, default_value_t = 500)]
    latency_ns: u64,
    /// Emulated NVM write bandwidth, in GB/s (0 = unlimited).
    #[arg(long, default_value_t = 1.0)]
    bandwidth_gbps: f64,
    /// Force a flush instruction (clwb, clflushopt, clflush).
    #[arg(long)]
    flush: Option<FlushInstruction>,
    /// Directory for the scratch file (default: /dev/shm, else the temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Repetitions of each small measurement.
    #[arg(long, default_value_t = 100_000)]
    iterations: usize,
}

/// Runs the calibration and prints it.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let options = CalibrationOptions {
        dir: args.dir.clone(),
        flush: args.flush,
        latency_ns: args.latency_ns,
        bandwidth_bytes_per_s: (args.bandwidth_gbps * 1e9) as u64,
        iterations: args.iterations,
    };
    let c = calibrate(&options)?;
    if args.json {
        println!("{}", serde_json::to_string(&c)?);
        return Ok(());
    }
    println!("| measure | value |");
    println!("|---|---|");
    println!("| flush instruction | {} |", c.flush_instruction);
    println!("| fence | {:.1} ns |", c.fence_ns);
    println!("| flush 1 line + fence | {:.1} ns |", c.flush_line_ns);
    println!("| flush 4 KiB + fence | {:.1} ns |", c.flush_4k_ns);
    println!("| non-temporal copy | {:.2} GB/s |", c.nt_copy_gbps);
    println!(
        "| emulated fence latency, target | {} ns |",
        c.emulated_latency_target_ns
    );
    println!(
        "| emulated fence latency, measured | {:.1} ns |",
        c.emulated_latency_measured_ns
    );
    println!("| TSC | {:.3} GHz |", c.tsc_ghz);
    println!("| scratch file | {} ({:?}) |", c.dir.display(), c.map_mode);
    Ok(())
}
