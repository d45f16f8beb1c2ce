//! `logheap dump`: a pool's root area and every live allocation, with their bytes, as
//! hex lines or JSON (what `pmempool dump` shows of a pool).

use std::fmt::Write as _;

use logheap::{Error, Pool};

/// Options of `logheap dump`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pool file.
    path: std::path::PathBuf,
    /// Print one JSON object instead of text (each object's bytes as a hex string).
    #[arg(long)]
    json: bool,
    /// Bytes shown of each object (0: all of them).
    #[arg(long, default_value_t = 64)]
    bytes: u64,
}

/// One object: its home offset, size and the bytes shown.
#[derive(Debug, serde::Serialize)]
struct Object {
    home: u64,
    size: u64,
    /// The first bytes (all when `--bytes 0`), in hex.
    bytes: String,
}

/// Opens the pool, reads the root and every live allocation in one read-only
/// transaction, closes the pool and prints them.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let pool = Pool::open(&args.path)?;
    let root = pool.root_range();
    let allocations = pool.allocations();
    let shown = |size: u64| match args.bytes {
        0 => size,
        n => size.min(n),
    };
    let (root, objects) = pool.read(|tx| {
        let mut read = |home: u64, size: u64| -> Result<Object, Error> {
            let mut buf = vec![0u8; shown(size) as usize];
            tx.read_bytes(home, &mut buf)?;
            Ok(Object {
                home,
                size,
                bytes: hex(&buf),
            })
        };
        let root = read(root.start, root.end - root.start)?;
        let objects = allocations
            .iter()
            .map(|&(home, size)| read(home, size))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok::<_, Error>((root, objects))
    })?;
    pool.close()?;
    if args.json {
        let value = serde_json::json!({ "root": root, "allocations": objects });
        println!("{value}");
        return Ok(());
    }
    println!("pool        {}", args.path.display());
    println!("root        {:#x}, {} bytes", root.home, root.size);
    print_bytes(&root.bytes, root.home);
    println!("allocations {}", objects.len());
    for o in &objects {
        println!("object      {:#x}, {} bytes", o.home, o.size);
        print_bytes(&o.bytes, o.home);
    }
    Ok(())
}

/// `bytes` as lower-case hex.
fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Prints hex digits `hex` as lines of 16 bytes, each with its home offset.
fn print_bytes(hex: &str, home: u64) {
    for (i, line) in hex.as_bytes().chunks(32).enumerate() {
        let pairs: Vec<&str> = line
            .chunks(2)
            .map(|p| std::str::from_utf8(p).unwrap_or("??"))
            .collect();
        println!("  {:#012x}  {}", home + 16 * i as u64, pairs.join(" "));
    }
}
