//! `logheap ycsb`: the YCSB core workloads A–F on logheap-kv and its peers (LMDB, redb,
//! fjall, RocksDB when built in), every store with durable commits, in one run; writes
//! `results.jsonl`, `results.md` and plots.

use std::path::{Path, PathBuf};

use logheap_ycsb::generator::RecordShape;
use logheap_ycsb::{RunConfig, StoreKind, Workload};

/// Options of `logheap ycsb`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Workloads (repeat; default A, B, C, D, E, F).
    #[arg(long = "workload")]
    workloads: Vec<Workload>,
    /// Stores (repeat; default logheap-log, logheap-undo, lmdb, redb, fjall, and rocksdb
    /// when built with `--features logheap-ycsb/rocksdb`). logheap-ENGINE takes any
    /// engine: log, redo, undo, oop, hoop.
    #[arg(long = "store")]
    stores: Vec<StoreKind>,
    /// Thread counts (repeat; default 1 and 2).
    #[arg(long = "threads")]
    threads: Vec<usize>,
    /// Records of the load phase (YCSB's recordcount).
    #[arg(long, default_value_t = 100_000)]
    records: u64,
    /// Operations of the run phase (YCSB's operationcount).
    #[arg(long, default_value_t = 100_000)]
    operations: u64,
    /// Fields per record.
    #[arg(long, default_value_t = 10)]
    fields: usize,
    /// Bytes per field.
    #[arg(long, default_value_t = 100)]
    field_len: usize,
    /// The longest scan (lengths uniform from 1).
    #[arg(long, default_value_t = 100)]
    max_scan_len: usize,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory the stores live in (default /dev/shm when present, else the
    /// temporary directory); an ordinary disk directory measures fsync for real.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Results directory (default: ycsb-results/<unix time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print one JSON object per run on standard output.
    #[arg(long)]
    json: bool,
}

/// Runs every workload on every store at every thread count and writes the report.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.fields == 0 || args.field_len == 0 || args.records == 0 {
        return Err("--records, --fields and --field-len must be at least 1".into());
    }
    let workloads = if args.workloads.is_empty() {
        logheap_ycsb::workload::ALL.to_vec()
    } else {
        args.workloads.clone()
    };
    let stores = if args.stores.is_empty() {
        StoreKind::defaults()
    } else {
        args.stores.clone()
    };
    let threads = if args.threads.is_empty() {
        vec![1, 2]
    } else {
        args.threads.clone()
    };
    if threads.contains(&0) {
        return Err("--threads must be at least 1".into());
    }
    let parent = match &args.dir {
        Some(d) => d.clone(),
        None if Path::new("/dev/shm").is_dir() => "/dev/shm".into(),
        None => std::env::temp_dir(),
    };
    let out = match &args.out {
        Some(o) => o.clone(),
        None => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs();
            PathBuf::from("ycsb-results").join(now.to_string())
        }
    };
    let mut results = Vec::new();
    for &t in &threads {
        for &w in &workloads {
            for &s in &stores {
                let config = RunConfig {
                    records: args.records,
                    operations: args.operations,
                    threads: t,
                    shape: RecordShape {
                        fields: args.fields,
                        field_len: args.field_len,
                    },
                    max_scan_len: args.max_scan_len,
                    seed: args.seed,
                };
                eprint!("ycsb: workload {w}, {s}, {t} thread(s): ");
                let r = logheap_ycsb::run(s, w, &config, &parent)?;
                eprintln!(
                    "load {:.1} K/s, run {:.1} K/s",
                    r.load.throughput / 1000.0,
                    r.run.throughput / 1000.0
                );
                if args.json {
                    println!("{}", serde_json::to_string(&r)?);
                }
                results.push(r);
            }
        }
    }
    let (files, plot_problem) = logheap_ycsb::report::write(&out, &results)?;
    if !args.json {
        print!("{}", logheap_ycsb::report::markdown(&results));
    }
    for f in files {
        eprintln!("wrote {}", f.display());
    }
    if let Some(why) = plot_problem {
        eprintln!("ycsb: no plots: {why}");
    }
    Ok(())
}
