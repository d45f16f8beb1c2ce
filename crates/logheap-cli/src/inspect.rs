//! `logheap inspect`: a pool file's header, state and logs.

use logheap::check::check;
use logheap::{Medium, PoolFile};

/// Options of `logheap inspect`.
pub use crate::PoolArgs as Args;

/// Reads the header, validates it and prints it, with the logs when the pool is not in
/// use by another process.
pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let (header, state) = PoolFile::inspect(&args.path)?;
    // The logs are read only when no process has the pool open for writing.
    let logs = check(&args.path).ok();
    // The mode an open with the default configuration would run in.
    let medium = Medium::of_file(&std::fs::File::open(&args.path)?);
    let durability = medium.auto_durability();
    if args.json {
        let value = serde_json::json!({
            "header": header,
            "state": state,
            "durability": {
                "mode": durability,
                "medium": medium,
                "survives": medium.survives(durability),
            },
            "logs": logs.as_ref().map(|r| &r.logs),
            "live_log_bytes": logs.as_ref().map(|r| r.live_log_bytes),
            "allocations": logs.as_ref().map(|r| r.allocations),
            "structures": logs.as_ref().and_then(|r| r.structures.as_ref()),
            "problems": logs.as_ref().map(|r| r.problems.len()),
        });
        println!("{value}");
        return Ok(());
    }
    let l = &header.layout;
    println!("pool        {}", args.path.display());
    println!("uuid        {}", header.uuid);
    println!("format      {}", header.format_version);
    println!("engine      {}", header.engine);
    println!("size        {}", bytes(header.pool_size));
    let log_engine = header.engine == logheap::EngineKind::Log;
    if log_engine {
        println!("chunk size  {}", bytes(header.chunk_size));
    }
    println!("root area   {}..{}", l.root.start, l.root.end);
    println!("data area   {}..{}", l.data.start, l.data.end);
    println!("created     {} (Unix seconds)", header.created_unix_secs);
    println!(
        "durability  {durability} by default ({medium} medium: a commit survives {})",
        medium.survives(durability)
    );
    match header.map_address {
        0 => println!("mapped at   anywhere (relocatable)"),
        at => println!("mapped at   {at:#x} (fixed)"),
    }
    println!(
        "state       {}",
        if state.clean {
            "closed cleanly"
        } else {
            "open, or not closed cleanly"
        }
    );
    match logs {
        None => println!("logs        not read: the pool is open in another process"),
        Some(r) if !log_engine => {
            println!(
                "heap        {} allocations, {} bytes",
                r.allocations, r.allocated_bytes
            );
            if let Some(s) = &r.structures {
                print_structures(s);
            }
            if !r.is_sound() {
                println!(
                    "damage      {} problem(s): run `logheap check` for the list",
                    r.problems.len()
                );
            }
        }
        Some(r) => {
            println!(
                "heap        {} allocations, {} bytes; {} log bytes live",
                r.allocations, r.allocated_bytes, r.live_log_bytes
            );
            println!(
                "logs        {:>7} {:>13} {:>7} {:>8} {:>12}",
                "set", "kind", "chunks", "blocks", "live bytes"
            );
            for log in &r.logs {
                println!(
                    "            {:>7} {:>13} {:>7} {:>8} {:>12}",
                    log.log_set, log.kind, log.chunks, log.blocks, log.live_bytes
                );
            }
            if !r.is_sound() {
                println!(
                    "damage      {} problem(s): run `logheap check` for the list",
                    r.problems.len()
                );
            }
        }
    }
    Ok(())
}

/// The structures of an in-place engine's pool or a persistent heap.
fn print_structures(s: &logheap::check::Structures) {
    use logheap::EngineStats;
    println!("segments    {} in use", bytes(s.pm_bytes_used));
    let logs = match &s.engine {
        Some(EngineStats::Redo(r)) => Some(&r.logs),
        Some(EngineStats::Undo(u)) => Some(&u.logs),
        Some(EngineStats::Oop(o)) => Some(&o.logs),
        Some(EngineStats::Hoop(h)) => Some(&h.logs),
        _ => None,
    };
    if let Some(l) = logs {
        println!(
            "log areas   {} (one per thread that committed), {}",
            l.logs,
            bytes(l.log_bytes)
        );
    }
    match &s.engine {
        Some(EngineStats::Oop(o)) => println!(
            "slots       {} words with an update slot ({} current in theirs), slot chunks {}",
            o.update_slots,
            o.slots_recovered,
            bytes(o.slot_bytes)
        ),
        Some(EngineStats::Hoop(h)) => println!(
            "mapped      {} words whose newest copy is in a log (written home by the next collection)",
            h.update_slots
        ),
        _ => {}
    }
    if s.engine.is_some() {
        println!(
            "checksums   {}",
            if s.data_checksums {
                "a CRC-32C per 64-byte line of user data (data checksums on)"
            } else {
                "none on user data (data checksums off)"
            }
        );
    }
}

/// `n` bytes, and in binary units when that is shorter to read (`67108864 bytes (64 MiB)`).
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = None;
    let mut value = n as f64;
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = Some(u);
    }
    match unit {
        None => format!("{n} bytes"),
        Some(u) if value.fract() == 0.0 => format!("{n} bytes ({value:.0} {u})"),
        Some(u) => format!("{n} bytes ({value:.1} {u})"),
    }
}
