//! `logheap compact`: compacts a pool's log ([`logheap::Pool::compact`]) and closes it
//! cleanly, so that the log holds little more than its live data.

use logheap::Pool;

/// Options of `logheap compact`.
pub use crate::PoolArgs as Args;

/// Opens the pool, compacts it, closes it and prints what changed.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let pool = Pool::open(&args.path)?;
    let live = pool.stats().log.unwrap_or_default().live_log_bytes;
    let c = pool.compact();
    pool.close()?;
    if args.json {
        println!("{}", serde_json::to_string(&c)?);
        return Ok(());
    }
    let mib = |chunks: u64| (chunks * c.chunk_size) as f64 / (1 << 20) as f64;
    println!("pool            {}", args.path.display());
    println!(
        "chunks in use   {} -> {} ({:.1} MiB -> {:.1} MiB; live data {:.1} MiB)",
        c.chunks_before,
        c.chunks_after,
        mib(c.chunks_before),
        mib(c.chunks_after),
        live as f64 / (1 << 20) as f64
    );
    println!("reclaimed       {} chunks", c.chunks_reclaimed);
    println!(
        "moved           {:.1} MiB",
        c.bytes_moved as f64 / (1 << 20) as f64
    );
    if c.chunks_skipped > 0 {
        println!("left as they were: {} chunks", c.chunks_skipped);
    }
    Ok(())
}
