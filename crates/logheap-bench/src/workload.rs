//! The workloads of "Log-structured Non-volatile Main Memory" (USENIX ATC 2017) §5: SPS (random swaps in a large array),
//! and RBTree, B+Tree, HashTable and KVStore, each with an insert workload (uniform
//! random keys) and an update workload (Zipf keys: look the key up, delete it if found,
//! else insert it). KVStore is the hash table with variable-size values.

use std::fmt;
use std::str::FromStr;

use logheap::{Error, Pool, Tx};
use logheap_collections::{Array, BpTree, HashMap, RbTree};
use rand::Rng;

use crate::keys::{ZipfKeys, scramble};

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Workload {
    /// Swap two random elements of a large array per transaction.
    Sps,
    /// Red-black tree, uniform inserts.
    RbtreeIns,
    /// Red-black tree, Zipf look-up-then-delete-or-insert.
    RbtreeUpd,
    /// B+ tree, uniform inserts.
    BptreeIns,
    /// B+ tree, Zipf updates.
    BptreeUpd,
    /// Hash table, uniform inserts.
    HashtableIns,
    /// Hash table, Zipf updates.
    HashtableUpd,
    /// Key-value store (variable-size values), uniform inserts.
    KvstoreIns,
    /// Key-value store, Zipf updates.
    KvstoreUpd,
}

impl Workload {
    /// Every workload, in the paper's order.
    pub const ALL: [Workload; 9] = [
        Self::Sps,
        Self::RbtreeIns,
        Self::RbtreeUpd,
        Self::BptreeIns,
        Self::BptreeUpd,
        Self::HashtableIns,
        Self::HashtableUpd,
        Self::KvstoreIns,
        Self::KvstoreUpd,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sps => "sps",
            Self::RbtreeIns => "rbtree-ins",
            Self::RbtreeUpd => "rbtree-upd",
            Self::BptreeIns => "bptree-ins",
            Self::BptreeUpd => "bptree-upd",
            Self::HashtableIns => "hashtable-ins",
            Self::HashtableUpd => "hashtable-upd",
            Self::KvstoreIns => "kvstore-ins",
            Self::KvstoreUpd => "kvstore-upd",
        }
    }

    /// Whether this is a Zipf update workload.
    pub fn is_update(self) -> bool {
        self.name().ends_with("-upd")
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<Workload> for String {
    fn from(w: Workload) -> String {
        w.name().to_string()
    }
}

impl TryFrom<String> for Workload {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|w| w.name()).collect();
                format!("unknown workload {s:?} ({})", names.join(", "))
            })
    }
}

/// A persistent key-value structure a workload runs on.
#[derive(Debug, Clone, Copy)]
enum Store {
    Rb(RbTree),
    Bp(BpTree),
    Hash(HashMap),
}

impl Store {
    fn insert(&self, tx: &mut Tx<'_>, key: u64, value: &[u8]) -> Result<bool, Error> {
        match self {
            Store::Rb(t) => t.insert(tx, key, value),
            Store::Bp(t) => t.insert(tx, key, value),
            Store::Hash(m) => m.insert(tx, key, value),
        }
    }

    fn remove(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        match self {
            Store::Rb(t) => t.remove(tx, key),
            Store::Bp(t) => t.remove(tx, key),
            Store::Hash(m) => m.remove(tx, key),
        }
    }

    fn contains(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        match self {
            Store::Rb(t) => t.contains(tx, key),
            Store::Bp(t) => t.contains(tx, key),
            Store::Hash(m) => m.contains(tx, key),
        }
    }
}

/// Sizes of a workload.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Elements preloaded (and the size of the SPS array).
    pub elements: u64,
    /// Value size in bytes (KVStore: the mean of sizes from half to one and a half times).
    pub value_size: usize,
}

/// A workload prepared on a pool: its structure and key stream.
#[derive(Debug, Clone)]
pub struct Prepared {
    workload: Workload,
    shape: Shape,
    target: Target,
    zipf: Option<ZipfKeys>,
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Array(Array),
    Store(Store),
}

const PRELOAD_BATCH: u64 = 100;

fn value_for(rng: &mut impl Rng, workload: Workload, size: usize) -> Vec<u8> {
    let len = match workload {
        Workload::KvstoreIns | Workload::KvstoreUpd => rng.random_range(size / 2..=size + size / 2),
        _ => size,
    };
    let fill: u8 = rng.random();
    vec![fill; len]
}

impl Prepared {
    /// Creates the workload's structure on `pool` and preloads it (in transactions of
    /// 100 operations).
    pub fn preload(
        pool: &Pool,
        workload: Workload,
        shape: Shape,
        rng: &mut impl Rng,
    ) -> Result<Prepared, Error> {
        let n = shape.elements.max(2);
        let target = pool.transaction(|tx| {
            Ok::<_, Error>(match workload {
                Workload::Sps => Target::Array(Array::create(tx, n, 8)?),
                Workload::RbtreeIns | Workload::RbtreeUpd => {
                    Target::Store(Store::Rb(RbTree::create(tx)?))
                }
                Workload::BptreeIns | Workload::BptreeUpd => {
                    Target::Store(Store::Bp(BpTree::create(tx)?))
                }
                _ => Target::Store(Store::Hash(HashMap::create(tx, n.next_power_of_two())?)),
            })
        })?;
        // Update workloads draw keys from 2n ranks; exactly half of them are present at
        // the start: one of each pair of neighbouring ranks, chosen at random.
        let universe = 2 * n;
        let mut done = 0;
        while done < n {
            let batch = PRELOAD_BATCH.min(n - done);
            let mut items: Vec<(u64, Vec<u8>)> = Vec::with_capacity(batch as usize);
            for i in 0..batch {
                items.push(match target {
                    Target::Array(_) => (done + i, (done + i).to_le_bytes().to_vec()),
                    Target::Store(_) => {
                        let key = if workload.is_update() {
                            scramble(2 * (done + i) + rng.random_range(0..2u64))
                        } else {
                            rng.random()
                        };
                        (key, value_for(rng, workload, shape.value_size))
                    }
                });
            }
            pool.transaction(|tx| {
                for (k, v) in &items {
                    match target {
                        Target::Array(a) => a.set(tx, *k, v)?,
                        Target::Store(s) => {
                            s.insert(tx, *k, v)?;
                        }
                    }
                }
                Ok::<_, Error>(())
            })?;
            done += batch;
        }
        Ok(Prepared {
            workload,
            shape,
            target,
            zipf: workload.is_update().then(|| ZipfKeys::new(universe)),
        })
    }

    /// Runs one operation of the workload as one transaction.
    pub fn operate(&self, pool: &Pool, rng: &mut impl Rng) -> Result<(), Error> {
        match self.target {
            Target::Array(a) => {
                let n = self.shape.elements.max(2);
                let (i, j) = (rng.random_range(0..n), rng.random_range(0..n));
                pool.transaction(|tx| a.swap(tx, i, j))
            }
            Target::Store(s) => match &self.zipf {
                None => {
                    let key: u64 = rng.random();
                    let value = value_for(rng, self.workload, self.shape.value_size);
                    pool.transaction(|tx| s.insert(tx, key, &value).map(|_| ()))
                }
                Some(zipf) => {
                    let key = zipf.next(rng);
                    let value = value_for(rng, self.workload, self.shape.value_size);
                    pool.transaction(|tx| {
                        if s.contains(tx, key)? {
                            s.remove(tx, key).map(|_| ())
                        } else {
                            s.insert(tx, key, &value).map(|_| ())
                        }
                    })
                }
            },
        }
    }
}
