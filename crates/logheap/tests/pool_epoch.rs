//! Each pool's grace periods depend on that pool's threads only: a transaction held
//! open on one pool does not stop the cleaner of another pool from handing reclaimed
//! chunks back to its committers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use logheap::{Config, Error, PPtr, Pool};

fn small(kib: u64) -> Config {
    Config::default()
        .size(kib << 10)
        .chunk_size(4 << 10)
        .recovery_threads(1)
}

/// Rewrites one 128-byte object of pool B 20,000 times (about 5 MiB of log, twenty
/// times the pool) while another thread holds a read transaction open on pool A from
/// start to end. With one process-wide epoch, A's pinned reader held back every grace
/// period of B, B's reclaimed chunks never came back, and its commits failed with
/// `PoolFull`.
#[test]
fn a_transaction_held_open_on_another_pool_does_not_hold_back_the_cleaner() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(Pool::create(dir.path().join("a"), &small(256)).unwrap());
    let b = Pool::create(dir.path().join("b"), &small(256)).unwrap();
    let root_a: PPtr<u64> = a.root().unwrap();
    let obj: PPtr<[u8; 128]> = b.transaction(|tx| tx.alloc([0u8; 128])).unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Barrier::new(2));
    let holder = {
        let (a, done, started) = (a.clone(), done.clone(), started.clone());
        std::thread::spawn(move || {
            a.read(|tx| {
                tx.read(root_a)?;
                started.wait();
                // Pinned (inside a transaction of A) until the writer has finished.
                let start = Instant::now();
                while !done.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(120) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok::<_, Error>(())
            })
            .unwrap();
        })
    };
    started.wait();
    let rounds = 20_000u64;
    let mut failed = None;
    for i in 0..rounds {
        let mut v = [0u8; 128];
        v[..8].copy_from_slice(&i.to_le_bytes());
        v[120..].copy_from_slice(&i.to_le_bytes());
        if let Err(e) = b.transaction(|tx| tx.write(obj, &v)) {
            failed = Some((i, e));
            break;
        }
    }
    done.store(true, Ordering::Relaxed);
    holder.join().unwrap();
    if let Some((i, e)) = failed {
        panic!(
            "rewrite {i} of {rounds} failed with {e:?} (chunks cleaned: {})",
            b.stats().log().cloned().unwrap().chunks_cleaned
        );
    }
    let v = b.read(|tx| tx.read(obj)).unwrap();
    assert_eq!(v[..8], (rounds - 1).to_le_bytes());
    assert!(b.stats().log().cloned().unwrap().chunks_cleaned > 100);
}
