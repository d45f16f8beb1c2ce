//! Times opening a persistent heap holding a million blocks (issue 11: "recovers a
//! million blocks faster than PMDK opens the same heap"): after a clean close, and after
//! a crash (the heap dropped without closing), each followed by one allocation per size
//! class, as PMDK's open is lazy and pays at its first allocations.
//!
//! `cargo run --release -p logheap --example heap_recovery -- [BLOCKS] [DIR]`
//! (default 1,000,000 blocks of 64 B-1 KiB, in /dev/shm). Each open runs in a fresh
//! process (this program again, with `--open PATH`), as PMDK's open was timed.

use std::time::Instant;

use logheap::alloc::{HeapOptions, PAddr, PersistentHeap};
use rand::{Rng, SeedableRng};

/// Opens the heap at `path`, allocates and frees one block per size class, and prints
/// the times; the heap is closed cleanly when `close`, else dropped (as a crash).
fn open_and_time(path: &str, close: bool) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let heap = PersistentHeap::open(path)?;
    let opened = start.elapsed().as_secs_f64();
    let scratch = heap.root().checked_add(8).expect("in the root");
    for size in [32, 64, 128, 256, 512, 1024, 2048, 4000, 8192] {
        heap.allocate_into(scratch, size)?;
        heap.deallocate(scratch)?;
    }
    let first = start.elapsed().as_secs_f64();
    let r = heap.stats().recovery;
    println!(
        "{}: open {:.1} ms, open + one allocation per class {:.1} ms ({} blocks, {} segments)",
        if r.was_clean {
            "after a clean close"
        } else {
            "after a crash"
        },
        opened * 1e3,
        first * 1e3,
        r.blocks,
        r.segments
    );
    let array = PAddr::from_raw(heap.read_u64(heap.root())?);
    assert!(heap.usable_size(array)? >= 8 * (r.blocks - 1));
    if close {
        heap.close()?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    if let Some(mode @ ("--open" | "--open-and-crash")) = args.next().as_deref().map(|a| match a {
        "--open" => "--open",
        "--open-and-crash" => "--open-and-crash",
        _ => "",
    }) {
        let path = std::env::args().nth(2).ok_or("--open PATH")?;
        return open_and_time(&path, mode == "--open");
    }
    let mut args = std::env::args().skip(1);
    let blocks: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let dir = args.next().unwrap_or_else(|| "/dev/shm".into());
    let dir = tempfile::tempdir_in(dir)?;
    let path = dir.path().join("heap");
    let options = HeapOptions {
        size: blocks * 1200 + (256 << 20),
        ..HeapOptions::default()
    };
    let heap = PersistentHeap::create(&path, &options)?;
    // The pointers live in one huge block whose address is in the root.
    let array = heap.allocate_zeroed_into(heap.root(), blocks * 8)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let start = Instant::now();
    for i in 0..blocks {
        let dst = array.checked_add(i * 8).expect("in the array");
        heap.allocate_into(dst, rng.random_range(64..=1024))?;
    }
    println!(
        "allocated {blocks} blocks in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    heap.close()?;

    let me = std::env::current_exe()?;
    for mode in [
        "--open",
        "--open",
        "--open-and-crash",
        "--open",
        "--open",
        "--open",
    ] {
        let out = std::process::Command::new(&me)
            .arg(mode)
            .arg(&path)
            .output()?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
        }
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
    Ok(())
}
