//! `logheap create`: creates an empty pool file.

use std::path::PathBuf;

use logheap::{Config, EngineConfig, Pool};

use crate::size::parse_size;

/// Options of `logheap create`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pool file to create (it must not exist).
    path: PathBuf,
    /// Pool size: bytes, or with a unit (64M, 1G).
    #[arg(long, value_parser = parse_size)]
    size: u64,
    /// Engine: log (the default), one of the mapping ablation's log-base, log-2l,
    /// log-2l-gu, log-2l-gu-c (the mapping is chosen again at each open), redo, undo,
    /// oop or hoop (and the fast-log and persist-policy names of redo and undo).
    #[arg(long, default_value = "log")]
    engine: String,
    /// Log chunk size of the log engine (a power of two, 4K to 64M; default 32K).
    /// Refused on the other engines, which have no chunks.
    #[arg(long, value_parser = parse_size)]
    chunk_size: Option<u64>,
    /// Make a sparse file instead of claiming the whole size from the file system now
    /// (space is then taken as the pool is written, and a full file system is found
    /// only then).
    #[arg(long)]
    sparse: bool,
    /// Data checksums on an in-place engine (redo, undo, oop, hoop): a CRC-32C of every
    /// 64-byte line of user data, checked on every read and by `logheap check` (refused
    /// on the log engine, whose blocks carry CRCs).
    #[arg(long)]
    data_checksums: bool,
}

/// Creates the pool and closes it cleanly.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let engine: EngineConfig = args.engine.parse()?;
    let mut config = Config::default()
        .engine(engine)
        .size(args.size)
        .reserve_space(!args.sparse);
    if let Some(bytes) = args.chunk_size {
        config = config.chunk_size(bytes);
    }
    if args.data_checksums {
        config = config.data_checksums(true);
    }
    let pool = Pool::create(&args.path, &config)?;
    let chunks = match pool.stats().log() {
        Some(log) => format!(
            ", {} chunks of {} bytes",
            log.chunks_total,
            pool.header().chunk_size
        ),
        None => String::new(),
    };
    pool.close()?;
    println!(
        "created {} ({} bytes, {} engine{chunks})",
        args.path.display(),
        args.size,
        config.engine,
    );
    Ok(())
}
