//! `logheap compact`: compacts a pool's log ([`logheap::Pool::compact`]) and closes it
//! cleanly, so that the log holds little more than its live data. On a pool of an
//! in-place engine (redo, undo, oop, hoop) or a persistent-heap pool (engine `alloc`),
//! which keep no log of data, it defragments the heap instead
//! ([`PersistentHeap::defragment`](logheap::alloc::PersistentHeap::defragment)): every
//! free page is punched out of the file, which keeps its size.

use logheap::alloc::{Defragmentation, PersistentHeap};
use logheap::{EngineKind, Error, Pool};

/// Options of `logheap compact`.
pub use crate::PoolArgs as Args;

/// Opens the pool, compacts it, closes it and prints what changed.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let pool = match Pool::open(&args.path) {
        Err(Error::WrongEngine {
            found: EngineKind::Alloc,
            ..
        }) => return defragment(args),
        opened => opened?,
    };
    let live = pool
        .stats()
        .log()
        .cloned()
        .unwrap_or_default()
        .live_log_bytes;
    let engine = pool.header().engine;
    let c = pool.compact();
    pool.close()?;
    if engine != EngineKind::Log && c.defragmentation.is_none() {
        return Err(format!(
            "{}: the {engine} engine keeps no log to compact, and this file system cannot punch its heap's free pages out",
            args.path.display()
        )
        .into());
    }
    if args.json {
        println!("{}", serde_json::to_string(&c)?);
        return Ok(());
    }
    if let Some(d) = c.defragmentation {
        // An in-place engine: its heap was defragmented.
        print_defragmentation(args, &d);
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

/// Opens the persistent heap, punches out every free page, closes it and prints what
/// changed.
fn defragment(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let heap = PersistentHeap::open(&args.path)?;
    let d = heap.defragment(u64::MAX)?;
    heap.close()?;
    if args.json {
        println!("{}", serde_json::to_string(&d)?);
        return Ok(());
    }
    print_defragmentation(args, &d);
    Ok(())
}

/// Prints what a defragmentation did.
fn print_defragmentation(args: &Args, d: &Defragmentation) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!("pool            {}", args.path.display());
    if d.files_removed > 0 {
        println!(
            "removed         {} empty extension files ({:.1} MiB)",
            d.files_removed,
            mib(d.file_bytes_removed)
        );
    }
    println!(
        "punched         {:.1} MiB of free space in {} holes",
        mib(d.punched_bytes),
        d.holes
    );
    if let (Some(before), Some(after)) = (d.disk_bytes_before, d.disk_bytes_after) {
        println!(
            "on disk         {:.1} MiB -> {:.1} MiB",
            mib(before),
            mib(after)
        );
    }
}
