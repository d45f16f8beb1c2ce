//! `logheap kv`: the ordered key-value store (logheap-kv) from the command line, for
//! scripts and people.
//!
//! Keys and values are UTF-8 text, or hex with `--hex`. Output is text (`key<TAB>value`
//! lines for scans; bytes that are not UTF-8 shown as `hex:…`) or JSON with `--json`.
//! `verify` checks the tree. Commands that write create the pool on first use (`--size`, default 256M, and
//! `--engine`, default log); commands that only read need it to exist.

use std::io::{BufRead, Write};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use logheap::{Config, EngineConfig};
use logheap_kv::{KvStore, WriteBatch};
use serde_json::json;

use crate::size::parse_size;

/// The size of a pool `logheap kv` creates.
pub const DEFAULT_SIZE: u64 = 256 << 20;

/// Options of `logheap kv`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pool file holding the store.
    pool: PathBuf,
    /// Keys and values in hex (both given and shown), for bytes that are not text.
    #[arg(long, global = true)]
    hex: bool,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Size of the pool when a write creates it: bytes, or with a unit (64M, 1G);
    /// default 256M. Refused when the pool exists.
    #[arg(long, global = true, value_parser = parse_size)]
    size: Option<u64>,
    /// Engine of the pool when a write creates it (default log; redo, undo, oop, hoop).
    /// Refused when the pool exists.
    #[arg(long, global = true)]
    engine: Option<String>,
    #[command(subcommand)]
    command: KvCommand,
}

#[derive(Debug, clap::Subcommand)]
enum KvCommand {
    /// Print the value of KEY (exit 1 when absent).
    Get {
        /// The key.
        key: String,
    },
    /// Set KEY to VALUE, durably (creates the pool on first use).
    Put {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// Remove KEY (exit 1 when absent).
    #[command(alias = "delete")]
    Del {
        /// The key.
        key: String,
    },
    /// Print entries in key order, within bounds or under a prefix.
    Scan {
        /// The first key (included).
        #[arg(long)]
        start: Option<String>,
        /// The key to stop before (excluded).
        #[arg(long)]
        end: Option<String>,
        /// Only keys beginning with this (refused with --start or --end).
        #[arg(long, conflicts_with_all = ["start", "end"])]
        prefix: Option<String>,
        /// Descending order.
        #[arg(long)]
        reverse: bool,
        /// At most this many entries.
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Put `key<TAB>value` lines from FILE (or standard input, `-`), BATCH lines per
    /// transaction (creates the pool on first use).
    Load {
        /// The file, or `-` for standard input.
        #[arg(default_value = "-")]
        file: PathBuf,
        /// Lines per transaction.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// Print each key once its batch is durable (for scripts that must know).
        #[arg(long)]
        ack: bool,
    },
    /// Print the store's figures: entries, tree levels, leaves, payload, pool.
    Stats,
    /// Check the tree's invariants (node tags, key order within nodes and between
    /// separators, leaf links both ways, one depth, the entry count): exit 0 when
    /// sound, 1 with the first violation when not, 2 when it cannot be read.
    Verify,
}

/// Runs `logheap kv`: exit 0 on success, 1 when a key asked for is absent, 2 on an
/// error (said on standard error).
pub fn run(args: &Args) -> ExitCode {
    match run_command(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("logheap kv: {e}");
            ExitCode::from(2)
        }
    }
}

type Failure = Box<dyn std::error::Error>;

fn run_command(args: &Args) -> Result<bool, Failure> {
    let writes = matches!(
        args.command,
        KvCommand::Put { .. } | KvCommand::Del { .. } | KvCommand::Load { .. }
    );
    let store = open(args, writes)?;
    let found = match &args.command {
        KvCommand::Get { key } => {
            let key = decode(args, key)?;
            let value = store.get(&key)?;
            if args.json {
                println!(
                    "{}",
                    json!({"key": encode(args, &key), "found": value.is_some(),
                           "value": value.as_ref().map(|v| encode(args, v))})
                );
            } else if let Some(v) = &value {
                println!("{}", encode(args, v));
            } else {
                eprintln!("logheap kv: {} is absent", encode(args, &key));
            }
            value.is_some()
        }
        KvCommand::Put { key, value } => {
            store.put(&decode(args, key)?, &decode(args, value)?)?;
            if args.json {
                println!("{}", json!({"ok": true}));
            }
            true
        }
        KvCommand::Del { key } => {
            let key = decode(args, key)?;
            let deleted = store.delete(&key)?;
            if args.json {
                println!("{}", json!({"key": encode(args, &key), "deleted": deleted}));
            } else if !deleted {
                eprintln!("logheap kv: {} is absent", encode(args, &key));
            }
            deleted
        }
        KvCommand::Scan {
            start,
            end,
            prefix,
            reverse,
            limit,
        } => {
            scan(args, &store, start, end, prefix, *reverse, *limit)?;
            true
        }
        KvCommand::Load { file, batch, ack } => {
            let n = load(args, &store, file, (*batch).max(1), *ack)?;
            if args.json {
                println!("{}", json!({"loaded": n}));
            } else if !ack {
                println!("loaded {n} entries");
            }
            true
        }
        KvCommand::Stats => {
            stats(args, &store)?;
            true
        }
        KvCommand::Verify => {
            let problem = store.verify()?;
            if args.json {
                println!(
                    "{}",
                    json!({"sound": problem.is_none(), "problem": problem})
                );
            } else {
                match &problem {
                    None => println!("sound"),
                    Some(p) => println!("damaged: {p}"),
                }
            }
            problem.is_none()
        }
    };
    store.close()?;
    Ok(found)
}

/// Opens the store; a write creates the pool when there is none.
fn open(args: &Args, writes: bool) -> Result<KvStore, Failure> {
    let exists = args.pool.exists();
    if exists && (args.size.is_some() || args.engine.is_some()) {
        return Err(format!(
            "{} exists: --size and --engine apply only when a write creates the pool",
            args.pool.display()
        )
        .into());
    }
    if exists {
        return Ok(KvStore::open_existing(&args.pool)?);
    }
    if !writes {
        return Err(format!(
            "{}: no such pool (a put or load creates it)",
            args.pool.display()
        )
        .into());
    }
    let engine: EngineConfig = args.engine.as_deref().unwrap_or("log").parse()?;
    let config = Config::default()
        .engine(engine)
        .size(args.size.unwrap_or(DEFAULT_SIZE));
    Ok(KvStore::open(&args.pool, &config)?)
}

fn decode(args: &Args, text: &str) -> Result<Vec<u8>, Failure> {
    if !args.hex {
        return Ok(text.as_bytes().to_vec());
    }
    let digits = text.strip_prefix("0x").unwrap_or(text);
    if !digits.len().is_multiple_of(2) {
        return Err(format!("{text:?} is not hex: an odd number of digits").into());
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&digits[i..i + 2], 16)
                .map_err(|_| format!("{text:?} is not hex").into())
        })
        .collect()
}

fn encode(args: &Args, bytes: &[u8]) -> String {
    let hex = || bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    if args.hex {
        return hex();
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_string(),
        Err(_) => format!("hex:{}", hex()),
    }
}

fn scan(
    args: &Args,
    store: &KvStore,
    start: &Option<String>,
    end: &Option<String>,
    prefix: &Option<String>,
    reverse: bool,
    limit: Option<u64>,
) -> Result<(), Failure> {
    let range = match prefix {
        Some(p) => store.prefix(&decode(args, p)?),
        None => {
            let start = start.as_deref().map(|k| decode(args, k)).transpose()?;
            let end = end.as_deref().map(|k| decode(args, k)).transpose()?;
            store.range_bounds(
                start.as_deref().map_or(Bound::Unbounded, Bound::Included),
                end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
            )
        }
    };
    let entries: Box<dyn Iterator<Item = _>> = if reverse {
        Box::new(range.rev())
    } else {
        Box::new(range)
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut listed = Vec::new();
    for entry in entries.take(limit.map_or(usize::MAX, |n| n as usize)) {
        let (k, v) = entry?;
        if args.json {
            listed.push(json!({"key": encode(args, &k), "value": encode(args, &v)}));
        } else {
            writeln!(out, "{}\t{}", encode(args, &k), encode(args, &v))?;
        }
    }
    if args.json {
        writeln!(out, "{}", serde_json::Value::Array(listed))?;
    }
    out.flush()?;
    Ok(())
}

fn load(
    args: &Args,
    store: &KvStore,
    file: &Path,
    batch_lines: usize,
    ack: bool,
) -> Result<u64, Failure> {
    let input: Box<dyn BufRead> = if file == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?,
        ))
    };
    let mut out = std::io::stdout().lock();
    let mut batch = WriteBatch::new();
    let mut keys = Vec::new();
    let mut loaded = 0u64;
    let mut commit = |batch: &mut WriteBatch, keys: &mut Vec<String>| -> Result<(), Failure> {
        store.write(batch)?;
        loaded += batch.len() as u64;
        batch.clear();
        if ack {
            for k in keys.drain(..) {
                writeln!(out, "{k}")?;
            }
            out.flush()?;
        }
        keys.clear();
        Ok(())
    };
    for (n, line) in input.lines().enumerate() {
        let line = line?;
        if line.is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once('\t') else {
            return Err(format!("line {}: no tab between key and value", n + 1).into());
        };
        batch.put(&decode(args, key)?, &decode(args, value)?);
        if ack {
            keys.push(key.to_string());
        }
        if batch.len() >= batch_lines {
            commit(&mut batch, &mut keys)?;
        }
    }
    if !batch.is_empty() {
        commit(&mut batch, &mut keys)?;
    }
    Ok(loaded)
}

fn stats(args: &Args, store: &KvStore) -> Result<(), Failure> {
    let s = store.stats()?;
    let header = store.pool().header();
    let pool = store.pool().stats();
    if args.json {
        println!(
            "{}",
            json!({
                "entries": s.entries,
                "levels": s.levels,
                "leaves": s.leaves,
                "payload_bytes": s.payload_bytes,
                "engine": header.engine.to_string(),
                "pool_size": header.pool_size,
                "durability": pool.durability.to_string(),
                "pool_bytes_used": pool.pm_bytes_used,
                "allocated_bytes": pool.allocated_bytes,
            })
        );
    } else {
        println!("entries     {}", s.entries);
        println!("levels      {}", s.levels);
        println!("leaves      {}", s.leaves);
        println!("payload     {} bytes", s.payload_bytes);
        println!("engine      {}", header.engine);
        println!("pool size   {} bytes", header.pool_size);
        println!("pool used   {} bytes", pool.pm_bytes_used);
        println!("allocated   {} bytes", pool.allocated_bytes);
        println!("durability  {}", pool.durability);
    }
    Ok(())
}
