//! The B+Tree update workload in a pool of a given size, with the log engine's figures
//! every 10,000 transactions: how the cleaner keeps up over time, and how the pool's
//! chunks end up shared among the logs (run `logheap inspect POOL` afterwards).
//!
//! ```sh
//! cargo run --release -p logheap-bench --example cleaning_timeline -- \
//!     16449536 100000 /dev/shm/timeline.pool [elements] [value-size]
//! ```
//!
//! Arguments: pool size in bytes, transactions, pool file (replaced), elements preloaded
//! (default 50,000), value size (default 128). 16,449,536 bytes is the pool in which the
//! default preload fills 50% of the log (`logheap bench --workload bptree-upd
//! --utilisation 0.5` prints it as `pool_bytes`).

use std::time::Instant;

use logheap::{Config, Error, Pool};
use logheap_bench::Workload;
use logheap_bench::workload::{Prepared, Shape, preload_rng};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return Err(
            "usage: cleaning_timeline POOL_BYTES TRANSACTIONS POOL_FILE [ELEMENTS] [VALUE_SIZE]"
                .into(),
        );
    }
    let size: u64 = args[0].parse()?;
    let ops: u64 = args[1].parse()?;
    let path = &args[2];
    let elements: u64 = args.get(3).map_or(Ok(50_000), |a| a.parse())?;
    let value_size: usize = args.get(4).map_or(Ok(128), |a| a.parse())?;
    let _ = std::fs::remove_file(path);
    let pool = Pool::create(path, &Config::default().size(size).reserve_space(false))?;
    let shape = Shape {
        elements,
        value_size,
    };
    let prepared = Prepared::preload(&pool, Workload::BptreeUpd, shape, &mut preload_rng(1))?;
    let ops = prepared.stream().thread_ops(1, ops, 1, 0);
    let chunk = pool.header().chunk_size as f64;
    println!(
        "transactions\tseconds\ttx/s\tlog utilisation\tfree chunks\tchunks cleaned\tMB moved\trefused"
    );
    let (start, mut last, mut refused) = (Instant::now(), Instant::now(), 0u64);
    for (i, op) in ops.iter().enumerate() {
        match prepared.apply(&pool, op) {
            Err(Error::PoolFull) => refused += 1,
            other => other?,
        }
        if (i + 1) % 10_000 == 0 {
            let s = pool.stats().log().cloned().unwrap();
            println!(
                "{}\t{:.2}\t{:.0}\t{:.1}%\t{}\t{}\t{:.1}\t{refused}",
                i + 1,
                start.elapsed().as_secs_f64(),
                10_000.0 / last.elapsed().as_secs_f64(),
                100.0 * s.live_log_bytes as f64 / (s.chunks_total as f64 * chunk),
                s.chunks_free,
                s.chunks_cleaned,
                s.cleaner_bytes_moved as f64 / 1e6,
            );
            last = Instant::now();
        }
    }
    pool.close()?;
    Ok(())
}
