//! `logheap inspect`: a pool file's header and state.

use std::path::PathBuf;

use logheap::PoolFile;

/// Options of `logheap inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pool file.
    path: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Reads the header, validates it and prints it.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let (header, state) = PoolFile::inspect(&args.path)?;
    if args.json {
        let value = serde_json::json!({ "header": header, "state": state });
        println!("{value}");
        return Ok(());
    }
    let l = &header.layout;
    println!("pool        {}", args.path.display());
    println!("uuid        {}", header.uuid);
    println!("format      {}", header.format_version);
    println!("engine      {}", header.engine);
    println!("size        {} bytes", header.pool_size);
    println!("chunk size  {} bytes", header.chunk_size);
    println!("root area   {}..{}", l.root.start, l.root.end);
    println!("data area   {}..{}", l.data.start, l.data.end);
    println!("created     {} (Unix seconds)", header.created_unix_secs);
    println!(
        "state       {}",
        if state.clean {
            "closed cleanly"
        } else {
            "open, or not closed cleanly"
        }
    );
    Ok(())
}
