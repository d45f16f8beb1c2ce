//! The home-to-log address mapping ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §3.2, §4.3), with the
//! paper's optimisations each switchable in [`MappingConfig`]:
//!
//! - **two-layer mapping** ([`directory`]): home space cut into fixed partitions (4 KiB by
//!   default) found by a shift, each with its own small index; off, one skip list covers
//!   the whole space (the paper's *Base*). A partition's index is a compact sorted array
//!   ([`sorted_array`], 12 bytes per mapped range in partitions of up to 64 KiB, 16 in
//!   larger ones) by default, or a skip list as in the paper ([`PartitionIndex`]);
//! - **group update**: applied at commit by the engine (contiguous writes of a
//!   transaction become one log entry and one mapping update);
//! - **tree node caches** ([`node_cache`]): per-thread set-associative caches of nodes;
//! - **lock-free reads** ([`skiplist`]): readers traverse without any lock; off, each
//!   partition has a readers-writer lock (the paper's *2L-GU-C*), boxed beside its index
//!   so that lock-free configurations pay one null pointer for it.
//!
//! Writers of one partition are serialised by the list's writer lock. Mappings that cross
//! a partition boundary are split at it.
//!
//! **DRAM** ([`Mapping::dram_bytes`]): the directory's arrays, 32 bytes per partition
//! (index and lock pointer), the sorted arrays' blocks (an 8-byte header, entries, and at
//! most an eighth plus two entries of slack while growing) or the skip lists' nodes, and
//! the node caches. The allocator's own per-block overhead is not counted.
//!
//! **Bulk load** ([`Mapping::load_sorted`]): an empty mapping filled from sorted pieces
//! (a snapshot), each sorted-array partition built at its final size in one block.
//!
//! **For other engines** ([`AddressMap`]): what an engine needs of a mapping — byte
//! ranges of home space redirected to some other place (here the log; for an
//! out-of-place engine, its update region), lock-free lookups, one writer per range —
//! as a trait that [`Mapping`] implements, with a conformance check
//! (`tests::conforms`) any other implementation can be held to.

mod directory;
pub(crate) mod node_cache;
pub(crate) mod seqlock;
mod skiplist;
mod sorted_array;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crossbeam_epoch::Guard;
use crossbeam_utils::CachePadded;

pub(crate) use self::directory::Directory;
use self::node_cache::{CacheCounters, CacheHandle};
use self::skiplist::SkipList;
use self::sorted_array::{Entry, Key, Narrow, SortedArray, Wide};
use super::epoch::PoolEpoch;
use super::layout::HOME_LIMIT;

/// The largest partition size (sorted-array entries keep offsets and lengths in 32 bits).
const MAX_PARTITION_SIZE: u64 = 1 << 30;

/// Which address-mapping optimisations of the paper are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MappingConfig {
    /// Two-layer mapping: one skip list per home partition (else one for everything).
    pub two_layer: bool,
    /// Partition size in bytes (a power of two from 64 B to 1 GiB) when two-layer.
    pub partition_size: u64,
    /// Group update: merge a transaction's contiguous writes into one entry.
    pub group_update: bool,
    /// Per-thread tree node caches.
    pub node_cache: bool,
    /// Readers take no lock (else a readers-writer lock per partition).
    pub lock_free_reads: bool,
    /// The index of each partition when two-layer (one skip list covers everything
    /// otherwise).
    #[serde(default)]
    pub index: PartitionIndex,
}

/// How one partition of a two-layer mapping indexes its ranges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionIndex {
    /// A sorted array of packed 12-byte entries (16-byte in partitions over 64 KiB)
    /// under a sequence lock: compact, one binary search per lookup, in-place updates
    /// (the default).
    #[default]
    SortedArray,
    /// A skip list of nodes, as in the paper.
    SkipList,
}

impl MappingConfig {
    /// One skip list, no optimisation (the paper's *Base*).
    pub const BASE: MappingConfig = MappingConfig {
        two_layer: false,
        partition_size: 4096,
        group_update: false,
        node_cache: false,
        lock_free_reads: false,
        index: PartitionIndex::SortedArray,
    };
    /// Base + two-layer mapping (*2L*).
    pub const TWO_LAYER: MappingConfig = MappingConfig {
        two_layer: true,
        ..Self::BASE
    };
    /// 2L + group update (*2L-GU*).
    pub const TWO_LAYER_GU: MappingConfig = MappingConfig {
        group_update: true,
        ..Self::TWO_LAYER
    };
    /// 2L-GU + node caches (*2L-GU-C*).
    pub const TWO_LAYER_GU_C: MappingConfig = MappingConfig {
        node_cache: true,
        ..Self::TWO_LAYER_GU
    };
    /// Everything, lock-free reads included (the paper's *LSNVMM*; the default).
    pub const FULL: MappingConfig = MappingConfig {
        lock_free_reads: true,
        ..Self::TWO_LAYER_GU_C
    };
    /// Everything, with the paper's skip list in each partition instead of the sorted
    /// array (*full-skiplist*).
    pub const FULL_SKIPLIST: MappingConfig = MappingConfig {
        index: PartitionIndex::SkipList,
        ..Self::FULL
    };
    /// The named configurations of the paper's ablation, in its order.
    pub const LADDER: [(&'static str, MappingConfig); 5] = [
        ("base", Self::BASE),
        ("2l", Self::TWO_LAYER),
        ("2l-gu", Self::TWO_LAYER_GU),
        ("2l-gu-c", Self::TWO_LAYER_GU_C),
        ("full", Self::FULL),
    ];
    /// The paper's ablation ladder as the paper ran it, with a skip list in each
    /// partition (the `LADDER` above uses sorted arrays, our own index): `base`,
    /// `2l-skiplist`, `2l-gu-skiplist`, `2l-gu-c-skiplist`, `full-skiplist`.
    pub const SKIPLIST_LADDER: [(&'static str, MappingConfig); 5] = [
        ("base", Self::BASE),
        (
            "2l-skiplist",
            MappingConfig {
                index: PartitionIndex::SkipList,
                ..Self::TWO_LAYER
            },
        ),
        (
            "2l-gu-skiplist",
            MappingConfig {
                index: PartitionIndex::SkipList,
                ..Self::TWO_LAYER_GU
            },
        ),
        (
            "2l-gu-c-skiplist",
            MappingConfig {
                index: PartitionIndex::SkipList,
                ..Self::TWO_LAYER_GU_C
            },
        ),
        ("full-skiplist", Self::FULL_SKIPLIST),
    ];
    /// Every named configuration the tests go through: the ladder, then
    /// `full-skiplist` (the other rows of [`SKIPLIST_LADDER`](Self::SKIPLIST_LADDER)
    /// have names too, for [`named`](Self::named)).
    pub const NAMED: [(&'static str, MappingConfig); 6] = [
        Self::LADDER[0],
        Self::LADDER[1],
        Self::LADDER[2],
        Self::LADDER[3],
        Self::LADDER[4],
        ("full-skiplist", Self::FULL_SKIPLIST),
    ];

    /// The configuration called `name` (`base`, `2l`, `2l-gu`, `2l-gu-c`, `full`,
    /// `full-skiplist`, `2l-skiplist`, `2l-gu-skiplist`, `2l-gu-c-skiplist`).
    pub fn named(name: &str) -> Option<MappingConfig> {
        Self::NAMED
            .iter()
            .chain(&Self::SKIPLIST_LADDER)
            .find(|(n, _)| *n == name)
            .map(|&(_, c)| c)
    }

    /// The configuration's name, or a description of its switches when it is not one
    /// of the named ones.
    pub fn label(&self) -> String {
        match Self::NAMED
            .iter()
            .chain(&Self::SKIPLIST_LADDER)
            .find(|(_, c)| c == self)
        {
            Some((n, _)) => (*n).to_string(),
            None => format!(
                "2l={}({}B,{:?}),gu={},c={},lf={}",
                self.two_layer,
                self.partition_size,
                self.index,
                self.group_update,
                self.node_cache,
                self.lock_free_reads
            ),
        }
    }

    /// Whether partitions are sorted arrays (two-layer with that index).
    fn sorted_arrays(&self) -> bool {
        self.two_layer && self.index == PartitionIndex::SortedArray
    }

    /// Why this configuration is invalid, if it is.
    pub fn check(&self) -> Result<(), String> {
        let p = self.partition_size;
        if !p.is_power_of_two() || !(64..=MAX_PARTITION_SIZE).contains(&p) {
            return Err(format!(
                "partition size {p} is not a power of two from 64 to 2^30"
            ));
        }
        Ok(())
    }
}

impl Default for MappingConfig {
    fn default() -> Self {
        Self::FULL
    }
}

impl fmt::Display for MappingConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// An address mapping as an engine uses it: byte ranges of home space (any offset and
/// length) mapped to locations elsewhere, with lookups that take no lock and updates
/// serialised per range by the caller's locks (the STM's). Implemented by [`Mapping`];
/// the log engine calls its inherent methods, which are the same.
pub(crate) trait AddressMap: Send + Sync {
    /// Calls `f` with every byte of `[home, home + len)`, in address order, as mapped
    /// extents and unmapped holes. Each byte is reported once, except when a writer
    /// races the lookup: then a later report of the same bytes supersedes the earlier
    /// (the caller's STM validation then rejects the read anyway).
    fn lookup(&self, home: u64, len: u64, f: impl FnMut(Extent));
    /// Maps `[home, home + len)` to `target..target + len`, calling `displaced(target,
    /// len)` for every mapped piece it replaces.
    fn insert(&self, home: u64, len: u64, target: u64, displaced: &mut impl FnMut(u64, u64));
    /// Unmaps `[home, home + len)`, calling `displaced` for what was mapped there.
    fn remove(&self, home: u64, len: u64, displaced: &mut impl FnMut(u64, u64));
    /// Calls `f` with every mapped piece.
    fn for_each_piece(&self, f: impl FnMut(Piece));
    /// DRAM the mapping holds.
    fn dram_bytes(&self) -> u64;
}

impl AddressMap for Mapping {
    /// Calls `f` with every byte of `[home, home + len)`, in address order, as mapped
    /// extents and unmapped holes. Each byte is reported once, except when a writer
    /// races the lookup: then a later report of the same bytes supersedes the earlier.
    fn lookup(&self, home: u64, len: u64, f: impl FnMut(Extent)) {
        if len != 0 {
            self.lookup_pinned(&self.epoch.pin(), home, len, f);
        }
    }

    /// Maps `[home, home + len)` to `log`, reporting displaced bytes.
    fn insert(&self, home: u64, len: u64, log: u64, displaced: &mut impl FnMut(u64, u64)) {
        if len == 0 {
            return;
        }
        for (p, s, e) in self.split(home, home + len) {
            let part = self.partition(p);
            let _excl = part.write_lock();
            let log = log + (s - home);
            let base = p << self.shift;
            match &part.index {
                Index::Narrow(array) => {
                    array
                        .writer(base, &self.epoch)
                        .insert(s, e - s, log, displaced)
                }
                Index::Wide(array) => {
                    array
                        .writer(base, &self.epoch)
                        .insert(s, e - s, log, displaced)
                }
                Index::Skip(list) => list.writer(&self.epoch).insert(s, e - s, log, displaced),
            }
        }
    }

    /// Unmaps `[home, home + len)`, reporting displaced bytes.
    fn remove(&self, home: u64, len: u64, displaced: &mut impl FnMut(u64, u64)) {
        if len == 0 {
            return;
        }
        for (p, s, e) in self.split(home, home + len) {
            if let Some(part) = self.partitions.get(p) {
                let _excl = part.write_lock();
                let base = p << self.shift;
                match &part.index {
                    Index::Narrow(array) => array.writer(base, &self.epoch).clear(s, e, displaced),
                    Index::Wide(array) => array.writer(base, &self.epoch).clear(s, e, displaced),
                    Index::Skip(list) => {
                        list.writer(&self.epoch).clear(s, e, displaced);
                    }
                }
            }
        }
    }

    /// Calls `f` with every mapped piece (for checking tools).
    fn for_each_piece(&self, mut f: impl FnMut(Piece)) {
        let guard = self.epoch.pin();
        for (p, part) in self.partitions.numbered() {
            let _read = part.read_lock();
            let base = p << self.shift;
            match &part.index {
                Index::Narrow(array) => {
                    array.for_each(base, &mut |home, len, log| f(Piece { home, len, log }))
                }
                Index::Wide(array) => {
                    array.for_each(base, &mut |home, len, log| f(Piece { home, len, log }))
                }
                Index::Skip(list) => list.for_each_overlapping(&guard, 0, u64::MAX, |_, v| {
                    f(Piece {
                        home: v.home,
                        len: v.len,
                        log: v.log,
                    })
                }),
            }
        }
    }

    /// DRAM held by the mapping: directory, partitions, nodes or entries, and node
    /// caches.
    fn dram_bytes(&self) -> u64 {
        let guard = self.epoch.pin();
        let parts: usize = self
            .partitions
            .partitions()
            .map(|p| {
                std::mem::size_of::<Partition>()
                    + p.rw
                        .as_ref()
                        .map_or(0, |_| std::mem::size_of::<RwLock<()>>())
                    + match &p.index {
                        Index::Narrow(array) => array.dram_bytes(&guard),
                        Index::Wide(array) => array.dram_bytes(&guard),
                        Index::Skip(list) => std::mem::size_of::<SkipList>() + list.dram_bytes(),
                    }
            })
            .sum();
        let caches =
            self.cache_figures().caches as usize * node_cache::cache_bytes(self.cache_set_bits);
        (self.partitions.dram_bytes() + parts + caches) as u64
    }
}

/// A mapped piece of a range: `len` bytes at `home` live at pool offset `log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub home: u64,
    pub len: u64,
    pub log: u64,
}

/// A piece of a looked-up range: `len` bytes at `home`, mapped to pool offset `log`, or
/// unmapped (`None`: they read as zeros).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Extent {
    pub home: u64,
    pub len: u64,
    pub log: Option<u64>,
}

/// Which sorted array a mapping's partitions are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Narrow,
    Wide,
}

/// A partition's index.
#[derive(Debug)]
enum Index {
    /// A sorted array with 4-byte keys (partitions of up to 64 KiB).
    Narrow(SortedArray<Narrow>),
    /// A sorted array with 8-byte keys (larger partitions).
    Wide(SortedArray<Wide>),
    /// A skip list.
    Skip(Box<SkipList>),
}

/// One partition: its index and, only for locked reads, its readers-writer lock (made
/// with the partition; lock-free configurations carry just a null pointer).
#[derive(Debug)]
struct Partition {
    index: Index,
    rw: Option<Box<RwLock<()>>>,
}

impl Partition {
    /// Its read lock, when reads lock.
    fn read_lock(&self) -> Option<RwLockReadGuard<'_, ()>> {
        self.rw
            .as_ref()
            .map(|l| l.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Its write lock, when reads lock.
    fn write_lock(&self) -> Option<RwLockWriteGuard<'_, ()>> {
        self.rw
            .as_ref()
            .map(|l| l.write().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The home-to-log mapping of one pool.
#[derive(Debug)]
pub(crate) struct Mapping {
    config: MappingConfig,
    shift: u32,
    partitions: Directory<Partition>,
    id: u64,
    alive: Arc<()>,
    cache_counters: Mutex<Vec<Arc<CachePadded<CacheCounters>>>>,
    /// Each thread's node cache has `1 << cache_set_bits` sets.
    cache_set_bits: u32,
    /// The pool's reclamation domain: every pin of the mapping (and of its callers
    /// reading what it maps) and every deferred free of its blocks and nodes.
    epoch: PoolEpoch,
}

/// Node-cache figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CacheFigures {
    pub hits: u64,
    pub misses: u64,
    pub caches: u64,
}

fn next_mapping_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Mapping {
    /// An empty mapping with a reclamation domain of its own.
    pub(crate) fn new(config: MappingConfig) -> Mapping {
        Mapping::with_epoch(config, PoolEpoch::new())
    }

    /// An empty mapping whose pins and deferred frees go through `epoch` (its pool's).
    pub(crate) fn with_epoch(config: MappingConfig, epoch: PoolEpoch) -> Mapping {
        let shift = if config.two_layer {
            config.partition_size.trailing_zeros()
        } else {
            HOME_LIMIT.trailing_zeros()
        };
        Mapping {
            config,
            shift,
            partitions: Directory::new(HOME_LIMIT.trailing_zeros() - shift),
            id: next_mapping_id(),
            alive: Arc::new(()),
            cache_counters: Mutex::new(Vec::new()),
            cache_set_bits: node_cache::set_bits(node_cache::DEFAULT_ENTRIES),
            epoch,
        }
    }

    /// The same mapping with node caches of `entries` entries per thread (rounded down
    /// to a power of two sets of four; at least four), before any thread uses it.
    pub(crate) fn with_node_cache_entries(mut self, entries: usize) -> Mapping {
        self.cache_set_bits = node_cache::set_bits(entries);
        self
    }

    /// [`AddressMap::lookup`] under `guard`, a guard of this mapping's pool epoch
    /// that the caller holds (a transaction's), so with no pin of its own. `len` is
    /// not 0.
    pub(crate) fn lookup_pinned(
        &self,
        guard: &Guard,
        home: u64,
        len: u64,
        mut f: impl FnMut(Extent),
    ) {
        debug_assert!(self.epoch.guards(guard), "a guard of another epoch");
        let end = home + len;
        let register = || self.register_cache();
        let cache = self.config.node_cache.then_some(CacheHandle {
            id: self.id,
            alive: &self.alive,
            set_bits: self.cache_set_bits,
            register: &register,
        });
        let mut at = home;
        while at < end {
            if let Some(v) = cache.as_ref().and_then(|c| c.get(at)) {
                let stop = (v.home + v.len).min(end);
                f(Extent {
                    home: at,
                    len: stop - at,
                    log: Some(v.log + (at - v.home)),
                });
                at = stop;
                continue;
            }
            let p = at >> self.shift;
            let stop = ((p + 1) << self.shift).min(end);
            let Some(part) = self.partitions.get(p) else {
                f(Extent {
                    home: at,
                    len: stop - at,
                    log: None,
                });
                at = stop;
                continue;
            };
            let _read = part.read_lock();
            let base = p << self.shift;
            match &part.index {
                Index::Narrow(array) => array.read(base, at, stop, &mut f, &mut |whole, seq| {
                    if let Some(c) = &cache {
                        c.put(at.max(whole.home), array.seq_word(), seq, whole);
                    }
                }),
                Index::Wide(array) => array.read(base, at, stop, &mut f, &mut |whole, seq| {
                    if let Some(c) = &cache {
                        c.put(at.max(whole.home), array.seq_word(), seq, whole);
                    }
                }),
                Index::Skip(list) => {
                    let mut first = true;
                    let mut pos = at;
                    list.for_each_overlapping(guard, at, stop, |node, v| {
                        if first && let Some(c) = &cache {
                            if let Some((seq, sv)) = node.snapshot()
                                && sv == v
                            {
                                c.put(
                                    at.max(v.home),
                                    node.seq_word(),
                                    seq,
                                    Piece {
                                        home: v.home,
                                        len: v.len,
                                        log: v.log,
                                    },
                                );
                            }
                            first = false;
                        }
                        let s = v.home.max(at);
                        let e = v.end().min(stop);
                        if s > pos {
                            f(Extent {
                                home: pos,
                                len: s - pos,
                                log: None,
                            });
                        }
                        f(Extent {
                            home: s,
                            len: e - s,
                            log: Some(v.log + (s - v.home)),
                        });
                        pos = e;
                    });
                    if pos < stop {
                        f(Extent {
                            home: pos,
                            len: stop - pos,
                            log: None,
                        });
                    }
                }
            }
            at = stop;
        }
    }

    /// The configuration.
    pub(crate) fn config(&self) -> MappingConfig {
        self.config
    }

    /// log2 of the partition size (home space is one partition without two layers).
    pub(crate) fn partition_shift(&self) -> u32 {
        self.shift
    }

    fn register_cache(&self) -> Arc<CachePadded<CacheCounters>> {
        let c = Arc::new(CachePadded::new(CacheCounters::default()));
        self.cache_counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(c.clone());
        c
    }

    /// Partition `p`, made empty on first use.
    fn partition(&self, p: u64) -> &Partition {
        self.partitions.get_or_make(p, || Partition {
            index: match self.partitions_kind() {
                None => Index::Skip(Box::default()),
                Some(Kind::Narrow) => Index::Narrow(SortedArray::new()),
                Some(Kind::Wide) => Index::Wide(SortedArray::new()),
            },
            rw: (!self.config.lock_free_reads).then(Box::default),
        })
    }

    /// The partitions overlapping `[home, end)` as `(partition, start, end)`.
    fn split(&self, home: u64, end: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let shift = self.shift;
        (home >> shift..=(end - 1) >> shift).map(move |p| {
            let start = (p << shift).max(home);
            let stop = ((p + 1) << shift).min(end);
            (p, start, stop)
        })
    }

    /// Fills this mapping, which must be empty and have no other writer meanwhile, with
    /// `pieces`: sorted by home, non-overlapping, each of non-zero length within the home
    /// space, with no log range running past `u64::MAX` (as a snapshot of a mapping,
    /// taken by [`Mapping::for_each_piece`], lists them). A piece may cross partition
    /// boundaries; it is split there.
    ///
    /// The pieces are iterated twice: first they are all checked, and any that breaks
    /// the rules is refused with an `Err` saying which and why, with the mapping left
    /// untouched (empty); then they are loaded. Sorted-array partitions are built
    /// directly at their final size, one block each, with no per-entry insertion; skip
    /// lists get plain inserts. The mapping not being empty is an error too.
    pub(crate) fn load_sorted<I>(&self, pieces: I) -> Result<(), String>
    where
        I: IntoIterator<Item = Piece>,
        I::IntoIter: Clone,
    {
        let pieces = pieces.into_iter();
        if self.nodes() != 0 {
            return Err("the mapping to load pieces into is not empty".into());
        }
        let mut end = 0u64;
        for (i, x) in pieces.clone().enumerate() {
            if x.len == 0 {
                return Err(format!("piece {i} ({x:?}) is empty"));
            }
            if x.home.checked_add(x.len).is_none_or(|e| e > HOME_LIMIT) {
                return Err(format!(
                    "piece {i} ({x:?}) runs past the home space (2^47 bytes)"
                ));
            }
            if x.log.checked_add(x.len).is_none() {
                return Err(format!("piece {i} ({x:?}) runs past the last log offset"));
            }
            if x.home < end {
                return Err(format!(
                    "piece {i} ({x:?}) is out of order or overlaps the one before \
                     (which ends at home {end})"
                ));
            }
            end = x.home + x.len;
        }
        self.load_sorted_checked(pieces)
    }

    /// [`load_sorted`](Self::load_sorted) of pieces already checked against its rules
    /// (as [`Snapshot::check_pieces`](super::snapshot::Snapshot::check_pieces) does):
    /// one pass over them. Only the mapping not being empty is an error.
    pub(crate) fn load_sorted_checked(
        &self,
        pieces: impl Iterator<Item = Piece>,
    ) -> Result<(), String> {
        if self.nodes() != 0 {
            return Err("the mapping to load pieces into is not empty".into());
        }
        match self.partitions_kind() {
            Some(Kind::Narrow) => self.load_arrays::<Narrow>(pieces, |i| match i {
                Index::Narrow(a) => Some(a),
                _ => None,
            }),
            Some(Kind::Wide) => self.load_arrays::<Wide>(pieces, |i| match i {
                Index::Wide(a) => Some(a),
                _ => None,
            }),
            None => {
                for x in pieces {
                    self.insert(x.home, x.len, x.log, &mut |_, _| {});
                }
            }
        }
        Ok(())
    }

    /// The kind of sorted array partitions are, or `None` for skip lists.
    fn partitions_kind(&self) -> Option<Kind> {
        if !self.config.sorted_arrays() {
            None
        } else if 1u64 << self.shift <= Narrow::MAX_PARTITION {
            Some(Kind::Narrow)
        } else {
            Some(Kind::Wide)
        }
    }

    /// [`Mapping::load_sorted`] for sorted arrays with keys `K` (`array` picks a
    /// partition's array), once the pieces are checked.
    fn load_arrays<K: Key>(
        &self,
        pieces: impl Iterator<Item = Piece>,
        array: impl Fn(&Index) -> Option<&SortedArray<K>>,
    ) {
        let mut current: Option<u64> = None;
        let mut entries: Vec<Entry> = Vec::new();
        let flush = |p: u64, entries: &mut Vec<Entry>| {
            let part = self.partition(p);
            let base = p << self.shift;
            let loaded = array(&part.index).is_some_and(|a| {
                let _excl = part.write_lock();
                a.writer(base, &self.epoch).load(entries)
            });
            if !loaded {
                // Another writer raced the load (which its caller rules out): insert.
                for e in entries.iter() {
                    self.insert(base + e.off, e.len, e.log, &mut |_, _| {});
                }
            }
            entries.clear();
        };
        for x in pieces {
            for (p, s, e) in self.split(x.home, x.home + x.len) {
                if current != Some(p) {
                    if let Some(c) = current {
                        flush(c, &mut entries);
                    }
                    current = Some(p);
                }
                entries.push(Entry {
                    off: s - (p << self.shift),
                    len: e - s,
                    log: x.log + (s - x.home),
                });
            }
        }
        if let Some(c) = current {
            flush(c, &mut entries);
        }
    }

    /// Number of mapped ranges (skip-list nodes or sorted-array entries).
    pub(crate) fn nodes(&self) -> u64 {
        let guard = self.epoch.pin();
        self.partitions
            .partitions()
            .map(|p| match &p.index {
                Index::Narrow(array) => array.len(&guard) as u64,
                Index::Wide(array) => array.len(&guard) as u64,
                Index::Skip(list) => list.len() as u64,
            })
            .sum()
    }

    /// Number of partitions made.
    pub(crate) fn partition_count(&self) -> u64 {
        self.partitions.partitions().count() as u64
    }

    /// Node-cache hits and misses over all threads.
    pub(crate) fn cache_figures(&self) -> CacheFigures {
        let all = self
            .cache_counters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        CacheFigures {
            hits: all.iter().map(|c| c.hits.load(Ordering::Relaxed)).sum(),
            misses: all.iter().map(|c| c.misses.load(Ordering::Relaxed)).sum(),
            // A cache's thread holds the other reference; exited threads' caches are gone.
            caches: all.iter().filter(|c| Arc::strong_count(c) > 1).count() as u64,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Holds an [`AddressMap`] made by `make` to the trait's contract: random inserts
    /// and removes of byte ranges (some crossing 4 KiB boundaries) against a byte-level
    /// model, checking every lookup (each byte reported once, in order, with its target
    /// or as a hole), the displaced bytes of every update, and the pieces.
    pub(crate) fn conforms<M: AddressMap>(make: impl Fn() -> M, seed: u64) {
        use rand::{Rng, SeedableRng};
        let m = make();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut model: std::collections::BTreeMap<u64, u64> = Default::default();
        let base = 1u64 << 20;
        for step in 0..2000 {
            let home = base + rng.random_range(0..3 * 4096u64);
            let len = rng.random_range(1..700u64);
            let mut displaced = 0;
            let expected: u64 = model.range(home..home + len).count() as u64;
            if rng.random_bool(0.75) {
                let target = rng.random_range(1u64 << 30..1u64 << 40);
                m.insert(home, len, target, &mut |_, n| displaced += n);
                for i in 0..len {
                    model.insert(home + i, target + i);
                }
            } else {
                m.remove(home, len, &mut |_, n| displaced += n);
                for i in 0..len {
                    model.remove(&(home + i));
                }
            }
            assert_eq!(displaced, expected, "step {step}: displaced bytes");
            let (from, n) = (home.saturating_sub(300), len + 600);
            let mut next = from;
            m.lookup(from, n, |x| {
                assert_eq!(x.home, next, "step {step}: extents out of order");
                for i in 0..x.len {
                    let want = model.get(&(x.home + i)).copied();
                    assert_eq!(
                        x.log.map(|t| t + i),
                        want,
                        "step {step}: byte {}",
                        x.home + i
                    );
                }
                next = x.home + x.len;
            });
            assert_eq!(next, from + n, "step {step}: lookup stopped short");
        }
        let mut mapped = 0;
        m.for_each_piece(|p| {
            for i in 0..p.len {
                assert_eq!(model.get(&(p.home + i)), Some(&(p.log + i)));
            }
            mapped += p.len;
        });
        assert_eq!(mapped, model.len() as u64);
        assert!(m.dram_bytes() > 0);
    }

    #[test]
    fn every_mapping_configuration_conforms_to_the_address_map_contract() {
        for (name, config) in MappingConfig::NAMED {
            conforms(|| Mapping::new(config), name.len() as u64);
        }
    }

    fn lookup_bytes(m: &Mapping, home: u64, len: u64) -> Vec<Option<u64>> {
        let mut out = vec![None; len as usize];
        let mut next = home;
        m.lookup(home, len, |x| {
            assert_eq!(x.home, next, "extents leave a gap or overlap");
            assert!(x.len > 0, "an empty extent");
            next = x.home + x.len;
            for i in 0..x.len {
                out[(x.home - home + i) as usize] = x.log.map(|l| l + i);
            }
        });
        assert_eq!(next, home + len, "extents stop short");
        out
    }

    proptest! {
        /// Every configuration agrees with a byte-per-address model, and displaced byte
        /// counts are exact.
        #[test]
        fn mapping_matches_a_byte_model(
            ops in prop::collection::vec((any::<bool>(), 0u64..2000, 1u64..300), 1..150),
            config in 0usize..MappingConfig::NAMED.len(),
        ) {
            let mut cfg = MappingConfig::NAMED[config].1;
            cfg.partition_size = 256; // small partitions, so ranges cross them
            let m = Mapping::new(cfg);
            let base = 1u64 << 20;
            let mut model: Vec<Option<u64>> = vec![None; 2400];
            for (i, (is_insert, home, len)) in ops.into_iter().enumerate() {
                let mut displaced_bytes = 0u64;
                let mut displaced = |_log: u64, bytes: u64| displaced_bytes += bytes;
                let before = model[home as usize..(home + len) as usize].iter().filter(|x| x.is_some()).count() as u64;
                if is_insert {
                    let log = 1_000_000 * (i as u64 + 1);
                    m.insert(base + home, len, log, &mut displaced);
                    for k in 0..len {
                        model[(home + k) as usize] = Some(log + k);
                    }
                } else {
                    m.remove(base + home, len, &mut displaced);
                    for k in 0..len {
                        model[(home + k) as usize] = None;
                    }
                }
                prop_assert_eq!(displaced_bytes, before);
                // Twice: the second lookup exercises the node cache's hits.
                for _ in 0..2 {
                    prop_assert_eq!(lookup_bytes(&m, base, 2400), model.clone());
                    prop_assert_eq!(lookup_bytes(&m, base + home, len), model[home as usize..(home + len) as usize].to_vec());
                }
            }
        }
    }

    fn pieces_of(m: &Mapping) -> Vec<Piece> {
        let mut out = Vec::new();
        m.for_each_piece(|p| out.push(p));
        out
    }

    /// Configurations covering every index kind: skip lists (one and per partition),
    /// narrow and wide sorted arrays, with and without read locks.
    fn load_configs() -> Vec<MappingConfig> {
        let mut out: Vec<MappingConfig> = MappingConfig::NAMED.iter().map(|&(_, c)| c).collect();
        for size in [256, 1 << 16, 1 << 17] {
            out.push(MappingConfig {
                partition_size: size,
                ..MappingConfig::FULL
            });
        }
        out
    }

    proptest! {
        /// A mapping loaded from sorted pieces equals one built by inserting them: the
        /// same pieces (split at partition boundaries), the same lookups, and it keeps
        /// working under later updates.
        #[test]
        fn load_sorted_equals_inserting(
            gaps in prop::collection::vec((0u64..300, 1u64..700, any::<bool>()), 0..120),
            config in 0usize..9,
        ) {
            let cfg = load_configs()[config];
            let mut pieces = Vec::new();
            let mut home = (1u64 << 20) - 500;
            for (i, (gap, len, contiguous)) in gaps.into_iter().enumerate() {
                home += gap;
                let log = match pieces.last() {
                    Some(&Piece { log, len: l, .. }) if contiguous => log + l,
                    _ => 1_000_000 * (i as u64 + 1),
                };
                pieces.push(Piece { home, len, log });
                home += len;
            }
            let loaded = Mapping::new(cfg);
            prop_assert_eq!(loaded.load_sorted(pieces.iter().copied()), Ok(()));
            let inserted = Mapping::new(cfg);
            for x in &pieces {
                inserted.insert(x.home, x.len, x.log, &mut |_, _| {});
            }
            prop_assert_eq!(pieces_of(&loaded), pieces_of(&inserted));
            prop_assert_eq!(loaded.nodes(), inserted.nodes());
            prop_assert_eq!(loaded.partition_count(), inserted.partition_count());
            let start = (1u64 << 20) - 600;
            let span = home - start + 100;
            prop_assert_eq!(lookup_bytes(&loaded, start, span), lookup_bytes(&inserted, start, span));
            // Loaded blocks are exact; updates after the load grow them as usual.
            for m in [&loaded, &inserted] {
                m.insert(1 << 20, 1000, 77, &mut |_, _| {});
                m.remove((1 << 20) + 2000, 10, &mut |_, _| {});
            }
            prop_assert_eq!(lookup_bytes(&loaded, start, span), lookup_bytes(&inserted, start, span));
        }
    }

    #[test]
    fn load_sorted_refuses_bad_pieces_and_changes_nothing() {
        let p = |home: u64, len: u64, log: u64| Piece { home, len, log };
        let bad: [(&str, Vec<Piece>); 6] = [
            ("empty", vec![p(4096, 8, 1), p(8192, 0, 2)]),
            ("out of order", vec![p(8192, 8, 1), p(4096, 8, 2)]),
            ("overlaps", vec![p(4096, 100, 1), p(4196 - 1, 8, 2)]),
            ("home space", vec![p(HOME_LIMIT - 8, 16, 1)]),
            ("home space", vec![p(u64::MAX - 4, 8, 1)]),
            ("log offset", vec![p(4096, 16, u64::MAX - 8)]),
        ];
        for cfg in load_configs() {
            for (why, pieces) in &bad {
                let m = Mapping::new(cfg);
                let err = m.load_sorted(pieces.iter().copied()).unwrap_err();
                assert!(err.contains(why), "{cfg}: {err}");
                assert_eq!((m.nodes(), m.partition_count()), (0, 0), "{cfg}: {why}");
            }
            // Pieces that only touch are fine; a mapping holding anything is refused.
            let m = Mapping::new(cfg);
            let touching = [p(4096, 8, 1), p(4104, 8, 2), p(HOME_LIMIT - 8, 8, 3)];
            assert_eq!(m.load_sorted(touching), Ok(()));
            assert_eq!(pieces_of(&m), touching);
            let err = m.load_sorted([p(1 << 30, 8, 1)]).unwrap_err();
            assert!(err.contains("not empty"), "{err}");
            assert_eq!(pieces_of(&m), touching);
            assert_eq!(
                m.load_sorted([]),
                Err("the mapping to load pieces into is not empty".into())
            );
        }
    }

    /// Times loading 2 M pieces (about the hashtable benchmark's mapping) into the
    /// default configuration. Run by hand, in release mode:
    /// `cargo test --release -p logheap --lib load_sorted_timing -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing, run by hand"]
    fn load_sorted_timing() {
        let pieces: Vec<Piece> = (0..2_000_000u64)
            .map(|i| Piece {
                home: (1 << 20) + i * 186,
                len: 152,
                log: (1 << 22) + i * 200,
            })
            .collect();
        for _ in 0..3 {
            let m = Mapping::new(MappingConfig::FULL);
            let start = std::time::Instant::now();
            m.load_sorted(pieces.iter().copied()).unwrap();
            let took = start.elapsed();
            println!(
                "load_sorted: 2 M pieces in {:?} ({} entries, {} partitions, {} bytes of DRAM)",
                took,
                m.nodes(),
                m.partition_count(),
                m.dram_bytes()
            );
            let mut bytes = 0;
            m.for_each_piece(|x| bytes += x.len);
            assert_eq!(bytes, 2_000_000 * 152);
        }
    }

    #[test]
    fn names_round_trip_and_the_cache_hits() {
        for (name, c) in MappingConfig::NAMED {
            assert_eq!(MappingConfig::named(name), Some(c));
            assert_eq!(c.label(), name);
        }
        let m = Mapping::new(MappingConfig::FULL);
        m.insert(1 << 20, 128, 5000, &mut |_, _| {});
        for _ in 0..10 {
            m.lookup((1 << 20) + 8, 8, |_| {});
        }
        let f = m.cache_figures();
        assert_eq!((f.hits, f.misses), (9, 1));
        assert!(m.dram_bytes() > 0);
    }
}
