//! The workloads of "Log-structured Non-volatile Main Memory" (USENIX ATC 2017) §5: SPS (random swaps in a large array),
//! and RBTree, B+Tree, HashTable and KVStore, each with an insert workload (uniform
//! random keys) and an update workload (Zipf keys: look the key up, delete it if found,
//! else insert it). KVStore is the hash table with variable-size values.
//!
//! Besides the paper's, read-heavy workloads on the hash table and the red-black tree
//! ([`Workload::READ_HEAVY`], in the default run): the update workloads' preload and Zipf
//! keys, with each operation a look-up in a read-only transaction (`-lookup`), or a
//! look-up with probability [`LOOKUP_PERCENT`]% and otherwise the update workload's
//! operation in a write transaction (`-read95`).

use std::fmt;
use std::str::FromStr;

use logheap::{Error, Pool, Tx};
use logheap_collections::{Array, BpTree, CritBitTree, HashMap, Queue, RbTree, Vector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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
    /// Fragmentation W1: 100-150 B objects, then 200-250 B ones (live data capped;
    /// [`crate::fragmentation`]).
    FragW1,
    /// Fragmentation W2: as W1, with 90% of the objects freed between the phases.
    FragW2,
    /// Fragmentation W3: 1,000-2,000 B objects, then 1,500-2,500 B ones, with 90% freed
    /// between the phases.
    FragW3,
    /// Random-size allocation and free, 64 B to 128 KiB, on persistent and DRAM
    /// allocators ([`crate::alloc_bench`]; issue 11, 002's benchmark).
    AllocRandom,
    /// Queue, 8 pushes per transaction (003's micro-benchmark).
    QueueIns,
    /// Queue, 8 times a pop and a push per transaction (003).
    QueueUpd,
    /// Vector, 8 appends per transaction (003).
    VectorIns,
    /// Vector, 8 elements set at random per transaction (003).
    VectorUpd,
    /// STREAM's Add kernel over persistent arrays (003's real application): each
    /// transaction sets 8 consecutive elements `a[i] = b[i] + c[i]` from a random start.
    StreamAdd,
    /// Crit-bit tree (001's CTree), inserts and updates mixed.
    CtreeMix,
    /// B+ tree (001's BTree), inserts and updates mixed.
    BtreeMix,
    /// Red-black tree (001's RBTree), inserts and updates mixed.
    RbtreeMix,
    /// Hash table (001's HashMap), inserts and updates mixed.
    HashmapMix,
    /// Allocations and frees batched in transactions of 1, 8 or 64 (`--alloc-batch`)
    /// on the transactional engines, against the persistent heap's standalone calls
    /// ([`crate::alloc_batch`]; issue 11, 004's flush comparison).
    AllocBatch,
    /// Hash table, Zipf keys: 95% look-ups in read-only transactions, 5% the update
    /// workload's operation.
    HashtableRead95,
    /// Red-black tree, Zipf keys: 95% look-ups in read-only transactions, 5% the update
    /// workload's operation.
    RbtreeRead95,
    /// Hash table, Zipf keys: look-ups only, in read-only transactions.
    HashtableLookup,
    /// Red-black tree, Zipf keys: look-ups only, in read-only transactions.
    RbtreeLookup,
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

    /// The fragmentation workloads (Fig. 9), which run on the log engine and on the
    /// DRAM allocators `glibc` and `jemalloc` ([`crate::fragmentation`]).
    pub const FRAGMENTATION: [Workload; 3] = [Self::FragW1, Self::FragW2, Self::FragW3];

    /// 003's micro-benchmarks that the paper's workloads do not cover (Queue and Vector,
    /// insert and update, [`OPS_PER_TX`] operations per transaction, and STREAM's Add).
    pub const DOCUMENT_003: [Workload; 5] = [
        Self::QueueIns,
        Self::QueueUpd,
        Self::VectorIns,
        Self::VectorUpd,
        Self::StreamAdd,
    ];

    /// 001's benchmarks (PMDK's example maps): CTree, BTree, RBTree and HashMap under a
    /// mix of inserts of new keys and updates of present ones (one per transaction).
    pub const DOCUMENT_001: [Workload; 4] = [
        Self::CtreeMix,
        Self::BtreeMix,
        Self::RbtreeMix,
        Self::HashmapMix,
    ];

    /// The workloads of the other source documents ([`DOCUMENT_003`](Self::DOCUMENT_003)
    /// and [`DOCUMENT_001`](Self::DOCUMENT_001)); they run when named, on logheap's
    /// engines (not on `pmdk`).
    pub const OTHER_DOCUMENTS: [Workload; 9] = [
        Self::QueueIns,
        Self::QueueUpd,
        Self::VectorIns,
        Self::VectorUpd,
        Self::StreamAdd,
        Self::CtreeMix,
        Self::BtreeMix,
        Self::RbtreeMix,
        Self::HashmapMix,
    ];

    /// Whether this is one of [`OTHER_DOCUMENTS`](Self::OTHER_DOCUMENTS).
    pub fn is_from_other_documents(self) -> bool {
        Self::OTHER_DOCUMENTS.contains(&self)
    }

    /// Whether this is one of 001's mixed workloads.
    pub fn is_mix(self) -> bool {
        Self::DOCUMENT_001.contains(&self)
    }

    /// Workloads that run only when named (`alloc-random`, `alloc-batch`).
    pub const ON_REQUEST: [Workload; 2] = [Self::AllocRandom, Self::AllocBatch];

    /// Whether this is an allocator workload (`alloc-random`, `alloc-batch`), which
    /// measures allocations and frees rather than the paper's data structures.
    pub fn is_allocator(self) -> bool {
        Self::ON_REQUEST.contains(&self)
    }

    /// The engines an allocator workload runs on (empty for the others).
    pub fn allocator_engines(self) -> Vec<&'static str> {
        match self {
            Self::AllocRandom => crate::alloc_bench::engines().to_vec(),
            Self::AllocBatch => crate::alloc_batch::engines().to_vec(),
            _ => Vec::new(),
        }
    }

    /// The read-heavy workloads: look-ups of the update workloads' Zipf keys in
    /// read-only transactions, with 5% updates (`-read95`) or none (`-lookup`). They run
    /// on every engine and on `pmdk`, and are part of the default run
    /// ([`DEFAULT_RUN`](Self::DEFAULT_RUN)).
    pub const READ_HEAVY: [Workload; 4] = [
        Self::HashtableRead95,
        Self::RbtreeRead95,
        Self::HashtableLookup,
        Self::RbtreeLookup,
    ];

    /// The workloads `logheap bench` runs when none is named: the paper's
    /// ([`ALL`](Self::ALL)), then the read-heavy ones ([`READ_HEAVY`](Self::READ_HEAVY)).
    pub const DEFAULT_RUN: [Workload; 13] = {
        let mut run = [Self::Sps; 13];
        let mut i = 0;
        while i < Self::ALL.len() {
            run[i] = Self::ALL[i];
            i += 1;
        }
        while i < run.len() {
            run[i] = Self::READ_HEAVY[i - Self::ALL.len()];
            i += 1;
        }
        run
    };

    /// Whether this is one of [`READ_HEAVY`](Self::READ_HEAVY).
    pub fn is_read_heavy(self) -> bool {
        Self::READ_HEAVY.contains(&self)
    }

    /// Whether this workload draws Zipf keys over 2n ranks, half of them preloaded:
    /// the paper's update workloads and the read-heavy ones.
    pub fn draws_zipf_keys(self) -> bool {
        (self.is_update() && !self.is_from_other_documents()) || self.is_read_heavy()
    }

    /// Whether this is a fragmentation workload.
    pub fn is_fragmentation(self) -> bool {
        Self::FRAGMENTATION.contains(&self)
    }

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
            Self::FragW1 => "frag-w1",
            Self::FragW2 => "frag-w2",
            Self::FragW3 => "frag-w3",
            Self::QueueIns => "queue-ins",
            Self::QueueUpd => "queue-upd",
            Self::VectorIns => "vector-ins",
            Self::VectorUpd => "vector-upd",
            Self::StreamAdd => "stream-add",
            Self::CtreeMix => "ctree-mix",
            Self::BtreeMix => "btree-mix",
            Self::RbtreeMix => "rbtree-mix",
            Self::HashmapMix => "hashmap-mix",
            Self::AllocRandom => "alloc-random",
            Self::AllocBatch => "alloc-batch",
            Self::HashtableRead95 => "hashtable-read95",
            Self::RbtreeRead95 => "rbtree-read95",
            Self::HashtableLookup => "hashtable-lookup",
            Self::RbtreeLookup => "rbtree-lookup",
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
            .chain(Self::FRAGMENTATION)
            .chain(Self::OTHER_DOCUMENTS)
            .chain(Self::ON_REQUEST)
            .chain(Self::READ_HEAVY)
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL
                    .iter()
                    .chain(&Self::FRAGMENTATION)
                    .chain(&Self::OTHER_DOCUMENTS)
                    .chain(&Self::ON_REQUEST)
                    .chain(&Self::READ_HEAVY)
                    .map(|w| w.name())
                    .collect();
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
    Ct(CritBitTree),
}

impl Store {
    fn insert(&self, tx: &mut Tx<'_>, key: u64, value: &[u8]) -> Result<bool, Error> {
        match self {
            Store::Rb(t) => t.insert(tx, key, value),
            Store::Ct(t) => t.insert(tx, key, value),
            Store::Bp(t) => t.insert(tx, key, value),
            Store::Hash(m) => m.insert(tx, key, value),
        }
    }

    fn remove(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        match self {
            Store::Rb(t) => t.remove(tx, key),
            Store::Ct(t) => t.remove(tx, key),
            Store::Bp(t) => t.remove(tx, key),
            Store::Hash(m) => m.remove(tx, key),
        }
    }

    fn contains(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        match self {
            Store::Rb(t) => t.contains(tx, key),
            Store::Ct(t) => t.contains(tx, key),
            Store::Bp(t) => t.contains(tx, key),
            Store::Hash(m) => m.contains(tx, key),
        }
    }

    /// Reads the value of `key` into `out`; whether it is present.
    fn get_into(&self, tx: &mut Tx<'_>, key: u64, out: &mut Vec<u8>) -> Result<bool, Error> {
        match self {
            Store::Rb(t) => t.get_into(tx, key, out),
            Store::Ct(t) => t.get_into(tx, key, out),
            Store::Bp(t) => t.get_into(tx, key, out),
            Store::Hash(m) => m.get_into(tx, key, out),
        }
    }

    /// The update workloads' operation: look `key` up, delete it if found, else insert
    /// it.
    fn toggle(&self, tx: &mut Tx<'_>, key: u64, value: &[u8]) -> Result<(), Error> {
        if self.contains(tx, key)? {
            self.remove(tx, key).map(|_| ())
        } else {
            self.insert(tx, key, value).map(|_| ())
        }
    }
}

/// Sizes of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Elements preloaded (and the size of the SPS array).
    pub elements: u64,
    /// Value size in bytes (KVStore: the mean of sizes from half to one and a half times).
    pub value_size: usize,
}

/// A workload prepared on a pool: its structure and key stream.
#[derive(Debug, Clone)]
pub struct Prepared {
    stream: OpStream,
    target: Target,
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Array(Array),
    Store(Store),
    Queue(Queue),
    Vector(Vector),
    /// STREAM's arrays a, b and c, one array of 3n 8-byte elements.
    Stream(Array),
}

/// Operations per transaction of 003's micro-benchmarks (Queue, Vector).
pub const OPS_PER_TX: u64 = 8;

/// Operations per transaction of the preload.
pub const PRELOAD_BATCH: u64 = 100;

/// The share of the `-read95` workloads' operations that are look-ups, in percent (the
/// others are the update workloads' operation).
pub const LOOKUP_PERCENT: u64 = 95;

/// What the look-ups of a read-heavy workload found, counted alike by logheap's harness
/// and the PMDK peer engine (`#[repr(C)]`: the C side fills one, `struct lh_lookups`), so
/// that runs of the same operations on different engines can be checked against each
/// other and against a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Lookups {
    /// Look-ups run.
    pub lookups: u64,
    /// Of those, the look-ups that found their key.
    pub found: u64,
    /// The sum of the first byte of every value found (0 for an empty value): the
    /// values read are the values written.
    pub fill_sum: u64,
}

impl Lookups {
    /// Counts one look-up that found `value` (`None`: the key was absent).
    pub fn record(&mut self, value: Option<&[u8]>) {
        self.lookups += 1;
        if let Some(v) = value {
            self.found += 1;
            self.fill_sum += u64::from(v.first().copied().unwrap_or(0));
        }
    }

    /// Adds the counts of `other` (another thread's, or another part of a run's).
    pub fn add(&mut self, other: Lookups) {
        self.lookups += other.lookups;
        self.found += other.found;
        self.fill_sum += other.fill_sum;
    }
}

thread_local! {
    /// The value buffer of a thread's look-ups.
    static LOOKUP_VALUE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One operation of a workload, as drawn from its random stream: what one transaction
/// of the measured phase (or one insertion of the preload) does. `#[repr(C)]`: the PMDK
/// peer engine reads arrays of these in C (`struct lh_op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Op {
    /// The key; SPS: the first element swapped (the preload: the element set).
    pub key: u64,
    /// SPS: the second element swapped (the preload: the value, the element's index);
    /// the read-heavy workloads: [`Op::LOOKUP`] or [`Op::UPDATE`]; 0 otherwise.
    pub other: u64,
    /// The value's length in bytes (0 for SPS).
    pub len: u64,
    /// The value's bytes, all equal to this one.
    pub fill: u8,
}

impl Op {
    /// [`other`](Self::other) of a read-heavy workload's look-up (in a read-only
    /// transaction).
    pub const LOOKUP: u64 = 0;
    /// [`other`](Self::other) of a read-heavy workload's update (the update workloads'
    /// operation: look the key up, delete it if found, else insert it).
    pub const UPDATE: u64 = 1;

    /// The value this operation writes (`len` bytes of `fill`; not for SPS).
    pub fn value(&self) -> Vec<u8> {
        vec![self.fill; self.len as usize]
    }
}

/// The random stream of a workload's operations: the single definition of its keys,
/// value lengths and value bytes, which logheap's harness and the PMDK peer engine both
/// draw from (the same seed gives the same operations on every engine).
#[derive(Debug, Clone)]
pub struct OpStream {
    workload: Workload,
    shape: Shape,
    zipf: Option<ZipfKeys>,
}

impl OpStream {
    /// The stream of `workload` at `shape`.
    pub fn new(workload: Workload, shape: Shape) -> OpStream {
        let n = shape.elements.max(2);
        OpStream {
            workload,
            shape,
            // Update and read-heavy workloads draw keys from 2n ranks (see
            // `preload_op`); 003's Vector updates draw their elements uniformly.
            zipf: workload.draws_zipf_keys().then(|| ZipfKeys::new(2 * n)),
        }
    }

    /// The workload.
    pub fn workload(&self) -> Workload {
        self.workload
    }

    /// Elements preloaded (and the SPS array's length): at least 2.
    pub fn elements(&self) -> u64 {
        self.shape.elements.max(2)
    }

    /// The hash table's bucket count (HashTable and KVStore): the elements rounded up to
    /// a power of two.
    pub fn buckets(&self) -> u64 {
        self.elements().next_power_of_two()
    }

    /// Preload operation `i` (of [`elements`](Self::elements), drawn in order).
    pub fn preload_op(&self, i: u64, rng: &mut impl Rng) -> Op {
        if matches!(self.workload, Workload::Sps | Workload::StreamAdd) {
            return Op {
                key: i,
                other: i,
                len: 0,
                fill: 0,
            };
        }
        // Update (and read-heavy) workloads draw keys from 2n ranks; exactly half of them
        // are present at the start: one of each pair of neighbouring ranks, chosen at
        // random.
        let key =
            if self.workload.is_update() || self.workload.is_mix() || self.workload.is_read_heavy()
            {
                scramble(2 * i + rng.random_range(0..2u64))
            } else {
                rng.random()
            };
        self.with_value(key, rng)
    }

    /// The next operation of the measured phase.
    pub fn next_op(&self, rng: &mut impl Rng) -> Op {
        if self.workload == Workload::StreamAdd {
            return Op {
                key: rng.random_range(0..self.elements()),
                other: 0,
                len: 0,
                fill: 0,
            };
        }
        if self.workload.is_mix() {
            // A rank of 2n, half of them present at the start: an insert of a new key
            // or an update of a present one, about evenly at first.
            let key = scramble(rng.random_range(0..2 * self.elements()));
            return self.with_value(key, rng);
        }
        if self.workload == Workload::Sps {
            let n = self.elements();
            let (i, j) = (rng.random_range(0..n), rng.random_range(0..n));
            return Op {
                key: i,
                other: j,
                len: 0,
                fill: 0,
            };
        }
        let key = match &self.zipf {
            None => rng.random(),
            Some(zipf) => zipf.next(rng),
        };
        let mut op = self.with_value(key, rng);
        if matches!(
            self.workload,
            Workload::HashtableRead95 | Workload::RbtreeRead95
        ) && rng.random_range(0..100) >= LOOKUP_PERCENT
        {
            op.other = Op::UPDATE;
        }
        op
    }

    fn with_value(&self, key: u64, rng: &mut impl Rng) -> Op {
        let size = self.shape.value_size;
        let len = match self.workload {
            Workload::KvstoreIns | Workload::KvstoreUpd => {
                rng.random_range(size / 2..=size + size / 2)
            }
            _ => size,
        };
        let fill: u8 = rng.random();
        Op {
            key,
            other: 0,
            len: len as u64,
            fill,
        }
    }

    /// The operations of thread `t` of `threads` in a measured phase of `ops`
    /// transactions started from `seed` (each thread draws from its own generator).
    pub fn thread_ops(&self, seed: u64, ops: u64, threads: usize, t: usize) -> Vec<Op> {
        let mut rng = thread_rng(seed, t);
        (0..thread_share(ops, threads, t))
            .map(|_| self.next_op(&mut rng))
            .collect()
    }
}

/// How many of `ops` transactions thread `t` of `threads` runs.
pub fn thread_share(ops: u64, threads: usize, t: usize) -> u64 {
    let threads = threads.max(1) as u64;
    ops / threads + u64::from((t as u64) < ops % threads)
}

/// The generator of thread `t` in a measured phase started from `seed`.
pub fn thread_rng(seed: u64, t: usize) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed.wrapping_add(1 + t as u64))
}

/// The generator of a run's preload.
pub fn preload_rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

impl Prepared {
    /// Creates the workload's structure on `pool` and preloads it (in transactions of
    /// [`PRELOAD_BATCH`] operations).
    pub fn preload(
        pool: &Pool,
        workload: Workload,
        shape: Shape,
        rng: &mut impl Rng,
    ) -> Result<Prepared, Error> {
        if workload.is_fragmentation() {
            return Err(Error::InvalidConfig(format!(
                "{workload} is run by logheap_bench::fragmentation, not preloaded"
            )));
        }
        let stream = OpStream::new(workload, shape);
        let n = stream.elements();
        let target = pool.transaction(|tx| {
            Ok::<_, Error>(match workload {
                Workload::Sps => Target::Array(Array::create(tx, n, 8)?),
                Workload::QueueIns | Workload::QueueUpd => Target::Queue(Queue::create(tx)?),
                Workload::StreamAdd => Target::Stream(Array::create(tx, 3 * n, 8)?),
                Workload::VectorIns | Workload::VectorUpd => {
                    Target::Vector(Vector::create(tx, shape.value_size.max(1) as u64)?)
                }
                Workload::RbtreeIns
                | Workload::RbtreeUpd
                | Workload::RbtreeMix
                | Workload::RbtreeRead95
                | Workload::RbtreeLookup => Target::Store(Store::Rb(RbTree::create(tx)?)),
                Workload::BptreeIns | Workload::BptreeUpd | Workload::BtreeMix => {
                    Target::Store(Store::Bp(BpTree::create(tx)?))
                }
                Workload::CtreeMix => Target::Store(Store::Ct(CritBitTree::create(tx)?)),
                _ => Target::Store(Store::Hash(HashMap::create(tx, stream.buckets())?)),
            })
        })?;
        let mut done = 0;
        while done < n {
            let batch = PRELOAD_BATCH.min(n - done);
            let items: Vec<Op> = (0..batch)
                .map(|i| stream.preload_op(done + i, rng))
                .collect();
            pool.transaction(|tx| {
                for op in &items {
                    match target {
                        Target::Array(a) => a.set(tx, op.key, &op.other.to_le_bytes())?,
                        Target::Store(s) => {
                            s.insert(tx, op.key, &op.value())?;
                        }
                        Target::Queue(q) => q.push(tx, &op.value())?,
                        Target::Vector(v) => v.push(tx, &op.value())?,
                        // b[i] = i, c[i] = 2i (a starts zero).
                        Target::Stream(s) => {
                            let i = op.key;
                            s.set(tx, n + i, &i.to_le_bytes())?;
                            s.set(tx, 2 * n + i, &(2 * i).to_le_bytes())?;
                        }
                    }
                }
                Ok::<_, Error>(())
            })?;
            done += batch;
        }
        Ok(Prepared { stream, target })
    }

    /// The workload's operation stream.
    pub fn stream(&self) -> &OpStream {
        &self.stream
    }

    /// Runs `op` as one transaction: SPS swaps two elements; insert workloads insert;
    /// update workloads look the key up, then delete it if found, else insert it; the
    /// Queue and Vector workloads do [`OPS_PER_TX`] operations (pushes; pops and
    /// pushes; appends; sets of elements drawn from `op.key`); the read-heavy workloads
    /// look the key up in a read-only transaction ([`Op::LOOKUP`]) or do the update
    /// workloads' operation ([`Op::UPDATE`]).
    pub fn apply(&self, pool: &Pool, op: &Op) -> Result<(), Error> {
        self.apply_counting(pool, op, &mut Lookups::default())
    }

    /// [`apply`](Self::apply), counting a look-up and what it found in `lookups`.
    pub fn apply_counting(&self, pool: &Pool, op: &Op, lookups: &mut Lookups) -> Result<(), Error> {
        let value = || op.value();
        match self.target {
            Target::Queue(q) => pool.transaction(|tx| {
                let value = value();
                for _ in 0..OPS_PER_TX {
                    if self.stream.workload == Workload::QueueUpd {
                        q.pop(tx)?;
                    }
                    q.push(tx, &value)?;
                }
                Ok(())
            }),
            Target::Stream(s) => pool.transaction(|tx| {
                let n = self.stream.elements();
                for k in 0..OPS_PER_TX {
                    let i = (op.key + k) % n;
                    let (mut b, mut c) = ([0u8; 8], [0u8; 8]);
                    s.get_into(tx, n + i, &mut b)?;
                    s.get_into(tx, 2 * n + i, &mut c)?;
                    let (b, c) = (u64::from_le_bytes(b), u64::from_le_bytes(c));
                    s.set(tx, i, &b.wrapping_add(c).to_le_bytes())?;
                }
                Ok(())
            }),
            Target::Vector(v) => pool.transaction(|tx| {
                let value = value();
                if self.stream.workload == Workload::VectorIns {
                    for _ in 0..OPS_PER_TX {
                        v.push(tx, &value)?;
                    }
                    return Ok(());
                }
                let len = v.len(tx)?.max(1);
                for k in 0..OPS_PER_TX {
                    v.set(tx, scramble(op.key.wrapping_add(k)) % len, &value)?;
                }
                Ok(())
            }),
            Target::Array(a) => pool.transaction(|tx| a.swap(tx, op.key, op.other)),
            Target::Store(s) => {
                let workload = self.stream.workload;
                if workload.is_read_heavy() && op.other == Op::LOOKUP {
                    // Into a buffer the thread keeps, as the C look-up copies into one
                    // it reuses: the figure is the look-up's, not an allocator's.
                    return LOOKUP_VALUE.with_borrow_mut(|value| {
                        let found = pool.read(|tx| s.get_into(tx, op.key, value))?;
                        lookups.record(found.then_some(&value[..]));
                        Ok(())
                    });
                }
                let value = op.value();
                if workload.is_update() || workload.is_read_heavy() {
                    pool.transaction(|tx| s.toggle(tx, op.key, &value))
                } else {
                    pool.transaction(|tx| s.insert(tx, op.key, &value).map(|_| ()))
                }
            }
        }
    }
}

/// A model of the key-value workloads in std collections, for tests.
#[cfg(test)]
pub(crate) mod model {
    use std::collections::BTreeMap;

    use super::{Op, Workload};

    /// The keys present, with their values' length and byte.
    pub(crate) type Map = BTreeMap<u64, (u64, u8)>;

    /// The model after `preload` (every preload operation inserts).
    pub(crate) fn preloaded(preload: &[Op]) -> Map {
        preload
            .iter()
            .map(|op| (op.key, (op.len, op.fill)))
            .collect()
    }

    /// Applies one measured operation of `workload` (a key-value one) to `m`: a
    /// look-up returns `Some` of what it finds; an insert or an update changes `m` and
    /// returns `None`.
    pub(crate) fn apply(workload: Workload, m: &mut Map, op: &Op) -> Option<Option<(u64, u8)>> {
        if workload.is_read_heavy() && op.other == Op::LOOKUP {
            return Some(m.get(&op.key).copied());
        }
        let toggles = workload.is_update() || workload.is_read_heavy();
        if !(toggles && m.remove(&op.key).is_some()) {
            m.insert(op.key, (op.len, op.fill));
        }
        None
    }

    /// What the look-ups among `ops` find when they run in order on one thread after
    /// `preload` (and the model after them).
    pub(crate) fn lookups(workload: Workload, preload: &[Op], ops: &[Op]) -> (super::Lookups, Map) {
        let mut m = preloaded(preload);
        let mut found = super::Lookups::default();
        for op in ops {
            if let Some(v) = apply(workload, &mut m, op) {
                found.lookups += 1;
                if let Some((len, fill)) = v {
                    found.found += 1;
                    found.fill_sum += if len == 0 { 0 } else { u64::from(fill) };
                }
            }
        }
        (found, m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logheap::{Config, Pool};

    fn pool(engine: &str) -> Pool {
        let config = Config::default()
            .size(16 << 20)
            .engine(engine.parse::<logheap::EngineConfig>().unwrap());
        Pool::create_sim(&config, logheap::media::SimConfig::default()).unwrap()
    }

    #[test]
    fn the_out_of_place_workloads_do_eight_operations_per_transaction() {
        let shape = Shape {
            elements: 40,
            value_size: 16,
        };
        for engine in ["oop", "undo"] {
            for w in Workload::DOCUMENT_003 {
                let pool = pool(engine);
                let mut rng = preload_rng(1);
                let prepared = Prepared::preload(&pool, w, shape, &mut rng).unwrap();
                let ops = prepared.stream().thread_ops(1, 5, 1, 0);
                for op in &ops {
                    prepared.apply(&pool, op).unwrap();
                }
                let len = |pool: &Pool| {
                    pool.read(|tx| match prepared.target {
                        Target::Queue(q) => q.len(tx),
                        Target::Vector(v) => v.len(tx),
                        Target::Stream(s) => {
                            // Every element STREAM wrote is b + c = 3i; the others 0.
                            let mut set = 0;
                            for i in 0..40 {
                                let a = u64::from_le_bytes(s.get(tx, i)?.try_into().unwrap());
                                assert!(a == 0 || a == 3 * i, "{engine}: a[{i}] = {a}");
                                set += u64::from(a != 0);
                            }
                            Ok(set)
                        }
                        _ => unreachable!("an out-of-place workload"),
                    })
                    .unwrap()
                };
                let want = match w {
                    Workload::QueueIns | Workload::VectorIns => 40 + 5 * OPS_PER_TX,
                    Workload::QueueUpd | Workload::VectorUpd => 40,
                    // Five runs of 8 consecutive elements (they may overlap; a[0] = 3 * 0
                    // reads as not set).
                    _ => {
                        let set: std::collections::BTreeSet<u64> = ops
                            .iter()
                            .flat_map(|op| (0..OPS_PER_TX).map(move |k| (op.key + k) % 40))
                            .filter(|&i| i != 0)
                            .collect();
                        set.len() as u64
                    }
                };
                assert_eq!(len(&pool), want, "{engine} {w}");
            }
        }
    }

    #[test]
    fn the_mixed_workloads_insert_new_keys_and_update_present_ones() {
        let shape = Shape {
            elements: 40,
            value_size: 16,
        };
        for w in Workload::DOCUMENT_001 {
            let pool = pool("undo");
            let mut rng = preload_rng(1);
            let prepared = Prepared::preload(&pool, w, shape, &mut rng).unwrap();
            let Target::Store(store) = prepared.target else {
                panic!("{w}: a map");
            };
            let ops = prepared.stream().thread_ops(1, 30, 1, 0);
            for op in &ops {
                prepared.apply(&pool, op).unwrap();
            }
            pool.read(|tx| {
                for op in &ops {
                    assert!(store.contains(tx, op.key)?, "{w}: {:#x} missing", op.key);
                }
                Ok::<_, Error>(())
            })
            .unwrap();
        }
    }

    #[test]
    fn read_heavy_workloads_draw_the_update_workloads_keys_and_5_percent_updates() {
        let shape = Shape {
            elements: 1000,
            value_size: 32,
        };
        let upd = OpStream::new(Workload::HashtableUpd, shape);
        for w in Workload::READ_HEAVY {
            assert_eq!(w.name().parse::<Workload>(), Ok(w));
            assert!(
                w.is_read_heavy() && w.draws_zipf_keys() && !w.is_update(),
                "{w}"
            );
            let stream = OpStream::new(w, shape);
            // The same preload as the update workloads.
            let (mut a, mut b) = (preload_rng(3), preload_rng(3));
            for i in 0..stream.elements() {
                assert_eq!(
                    stream.preload_op(i, &mut a),
                    upd.preload_op(i, &mut b),
                    "{w}"
                );
            }
            let ops = stream.thread_ops(3, 20_000, 1, 0);
            // Zipf keys over the same 2n ranks: 90% of them on the hottest 15%.
            let hot: std::collections::HashSet<u64> =
                (0..2 * 1000 * 15 / 100).map(scramble).collect();
            let on_hot = ops.iter().filter(|op| hot.contains(&op.key)).count();
            assert!(on_hot > 17_000, "{w}: {on_hot} of 20000 on hot keys");
            let updates = ops.iter().filter(|op| op.other == Op::UPDATE).count();
            assert!(ops.iter().all(|op| op.other <= Op::UPDATE));
            match w {
                Workload::HashtableLookup | Workload::RbtreeLookup => assert_eq!(updates, 0),
                _ => assert!((800..1200).contains(&updates), "{w}: {updates} updates"),
            }
        }
        assert!(!Workload::ALL.iter().any(|w| w.is_read_heavy()));
        let default: Vec<Workload> = Workload::ALL
            .into_iter()
            .chain(Workload::READ_HEAVY)
            .collect();
        assert_eq!(Workload::DEFAULT_RUN.to_vec(), default);
    }

    /// Runs `w` on `engine` one operation at a time and checks each look-up against the
    /// model: found exactly when the model holds the key, with the model's value; and
    /// that look-ups are read-only transactions and updates write ones.
    fn check_read_heavy(engine: &str, w: Workload) {
        let shape = Shape {
            elements: 120,
            value_size: 24,
        };
        let pool = pool(engine);
        let stream = OpStream::new(w, shape);
        let preload: Vec<Op> = {
            let mut rng = preload_rng(5);
            (0..stream.elements())
                .map(|i| stream.preload_op(i, &mut rng))
                .collect()
        };
        let prepared = Prepared::preload(&pool, w, shape, &mut preload_rng(5)).unwrap();
        let Target::Store(store) = prepared.target else {
            panic!("{w}: a map");
        };
        // Enough operations for some updates among the -read95 ones.
        let ops = prepared.stream().thread_ops(5, 400, 1, 0);
        let mut m = model::preloaded(&preload);
        let before = pool.stats().media;
        let mut total = Lookups::default();
        let (mut hits, mut misses, mut updates) = (0, 0, 0);
        for op in &ops {
            let mut found = Lookups::default();
            prepared.apply_counting(&pool, op, &mut found).unwrap();
            total.add(found);
            match model::apply(w, &mut m, op) {
                Some(want) => {
                    let fill = want.map_or(0, |(_, fill)| u64::from(fill));
                    let want = Lookups {
                        lookups: 1,
                        found: u64::from(want.is_some()),
                        fill_sum: fill,
                    };
                    assert_eq!(found, want, "{engine} {w}: look-up of {:#x}", op.key);
                    if want.found == 1 {
                        hits += 1;
                    } else {
                        misses += 1;
                    }
                }
                None => {
                    assert_eq!(found, Lookups::default(), "{engine} {w}: an update");
                    updates += 1;
                }
            }
        }
        assert!(
            hits > 0 && misses > 0,
            "{engine} {w}: {hits} hits, {misses} misses"
        );
        let lookup_only = matches!(w, Workload::HashtableLookup | Workload::RbtreeLookup);
        assert_eq!(updates == 0, lookup_only, "{engine} {w}: {updates} updates");
        assert_eq!(total, model::lookups(w, &preload, &ops).0, "{engine} {w}");
        let c = pool.stats().media.since(&before);
        assert_eq!(c.transactions, ops.len() as u64, "{engine} {w}");
        assert_eq!(c.write_transactions, updates, "{engine} {w}");
        // The structure holds the model's keys and values after the run.
        pool.read(|tx| {
            for op in preload.iter().chain(&ops) {
                let mut value = Vec::new();
                let v = store.get_into(tx, op.key, &mut value)?.then_some(value);
                let want = m.get(&op.key).map(|&(len, fill)| vec![fill; len as usize]);
                assert_eq!(v, want, "{engine} {w}: key {:#x}", op.key);
            }
            Ok::<_, Error>(())
        })
        .unwrap();
    }

    #[test]
    fn read_heavy_lookups_find_exactly_the_keys_the_model_holds() {
        for engine in ["log", "undo", "oop"] {
            for w in Workload::READ_HEAVY {
                check_read_heavy(engine, w);
            }
        }
    }
}
