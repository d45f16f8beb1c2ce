//! A persistent linked list: insert, update and delete in transactions, survive a crash,
//! and print what the commits cost.
//!
//! Run: `cargo run --release -p logheap --example linked_list [POOL_PATH]`

use logheap::{Config, Error, PPtr, Pool, pfield};

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Node {
    key: u64,
    next: PPtr<Node>,
    value: [u8; 112],
}

/// The root object: the list head and a count.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Root {
    head: PPtr<Node>,
    len: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().join("list.pool"));
    let pool = if path.exists() {
        Pool::open(&path)?
    } else {
        Pool::create(&path, &Config::default().size(64 << 20))?
    };
    let root: PPtr<Root> = pool.root()?;

    // Insert 1000 nodes, one transaction each.
    for key in 0..1000u64 {
        pool.transaction(|tx| {
            let mut r = tx.read(root)?;
            let node = tx.alloc(Node {
                key,
                next: r.head,
                value: [key as u8; 112],
            })?;
            r.head = node;
            r.len += 1;
            tx.write(root, &r)
        })?;
    }
    // Rewrite every node's value (128-byte objects updated in place, logically).
    let before = pool.media().counters();
    let mut node = pool.read(|tx| tx.read(root))?.head;
    while !node.is_null() {
        node = pool.transaction(|tx| {
            let mut n = tx.read(node)?;
            n.value = [0xee; 112];
            tx.write(node, &n)?;
            Ok::<_, Error>(n.next)
        })?;
    }
    let updates = pool.media().counters().since(&before);
    // Delete every second node.
    pool.transaction(|tx| {
        let mut r = tx.read(root)?;
        let mut prev: Option<PPtr<Node>> = None;
        let mut cur = r.head;
        let mut i = 0;
        while !cur.is_null() {
            let next = tx.read(pfield!(cur, Node, next))?;
            if i % 2 == 0 {
                match prev {
                    Some(p) => tx.write(pfield!(p, Node, next), &next)?,
                    None => r.head = next,
                }
                tx.free(cur)?;
                r.len -= 1;
            } else {
                prev = Some(cur);
            }
            cur = next;
            i += 1;
        }
        tx.write(root, &r)
    })?;
    // A crash: drop without close, then reopen (recovery replays the log).
    pool.abandon();
    let pool = Pool::open(&path)?;
    let r = pool.read(|tx| tx.read(root))?;
    println!(
        "after crash and recovery: {} nodes, {} allocations",
        r.len,
        pool.allocations().len()
    );
    println!(
        "128-byte node updates: {} transactions, {:.2} fences each, write amplification {:.3}",
        updates.write_transactions,
        updates.fences as f64 / updates.write_transactions as f64,
        updates.write_amplification().unwrap_or(0.0)
    );
    println!(
        "recovery: {:?}",
        pool.stats().log().cloned().unwrap().recovery
    );
    pool.close()?;
    Ok(())
}
