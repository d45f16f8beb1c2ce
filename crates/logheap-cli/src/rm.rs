//! `logheap rm`: removes a pool file with its extension files (`<pool>.d/`), refusing a
//! file that is no pool and a pool open in any process
//! ([`PoolFile::remove`](logheap::PoolFile::remove)).

use logheap::PoolFile;

/// Options of `logheap rm`.
pub use crate::PoolArgs as Args;

/// Removes the pool and prints what went.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let removal = PoolFile::remove(&args.path)?;
    if args.json {
        println!("{}", serde_json::to_string(&removal)?);
        return Ok(());
    }
    println!(
        "removed {} and {} extension files ({:.1} MiB)",
        args.path.display(),
        removal.extension_files,
        removal.bytes as f64 / (1 << 20) as f64
    );
    if removal.left_in_directory > 0 {
        println!(
            "left {} other files in {}.d/",
            removal.left_in_directory,
            args.path.display()
        );
    }
    Ok(())
}
