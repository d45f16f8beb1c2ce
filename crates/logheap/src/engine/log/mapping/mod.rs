//! The home-to-log address mapping ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §3.2, §4.3), with the
//! paper's optimisations each switchable in [`MappingConfig`]:
//!
//! - **two-layer mapping** ([`directory`]): home space cut into fixed partitions (4 KiB by
//!   default) found by a shift, each with its own small index; off, one skip list covers
//!   the whole space (the paper's *Base*). A partition's index is a compact sorted array
//!   ([`sorted_array`], 16 bytes per mapped range) by default, or a skip list as in the
//!   paper ([`PartitionIndex`]);
//! - **group update**: applied at commit by the engine (contiguous writes of a
//!   transaction become one log entry and one mapping update);
//! - **tree node caches** ([`node_cache`]): per-thread set-associative caches of nodes;
//! - **lock-free reads** ([`skiplist`]): readers traverse without any lock; off, each
//!   partition has a readers-writer lock (the paper's *2L-GU-C*).
//!
//! Writers of one partition are serialised by the list's writer lock. Mappings that cross
//! a partition boundary are split at it.

mod directory;
mod node_cache;
mod skiplist;
mod sorted_array;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crossbeam_utils::CachePadded;

use self::directory::Directory;
use self::node_cache::{CacheCounters, CacheHandle};
use self::skiplist::SkipList;
use self::sorted_array::SortedArray;
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
    /// A sorted array of packed 16-byte entries under a sequence lock: compact, one
    /// binary search per lookup, in-place updates (the default).
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
    /// Every named configuration: the ladder, then `full-skiplist`.
    pub const NAMED: [(&'static str, MappingConfig); 6] = [
        Self::LADDER[0],
        Self::LADDER[1],
        Self::LADDER[2],
        Self::LADDER[3],
        Self::LADDER[4],
        ("full-skiplist", Self::FULL_SKIPLIST),
    ];

    /// The configuration called `name` (`base`, `2l`, `2l-gu`, `2l-gu-c`, `full`,
    /// `full-skiplist`).
    pub fn named(name: &str) -> Option<MappingConfig> {
        Self::NAMED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, c)| c)
    }

    /// The configuration's name, or a description of its switches when it is not one
    /// of the named ones.
    pub fn label(&self) -> String {
        match Self::NAMED.iter().find(|(_, c)| c == self) {
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

/// A partition's index.
#[derive(Debug)]
enum Index {
    Sorted(SortedArray),
    Skip(Box<SkipList>),
}

/// One partition: its index and, for locked reads, its readers-writer lock.
#[derive(Debug)]
struct Partition {
    index: Index,
    rw: RwLock<()>,
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
    /// An empty mapping.
    pub(crate) fn new(config: MappingConfig) -> Mapping {
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
            index: if self.config.sorted_arrays() {
                Index::Sorted(SortedArray::new(p << self.shift))
            } else {
                Index::Skip(Box::default())
            },
            rw: RwLock::new(()),
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

    /// Calls `f` with every byte of `[home, home + len)`, in address order, as mapped
    /// extents and unmapped holes. Each byte is reported once, except when a writer
    /// races the lookup: then a later report of the same bytes supersedes the earlier.
    pub(crate) fn lookup(&self, home: u64, len: u64, mut f: impl FnMut(Extent)) {
        if len == 0 {
            return;
        }
        let end = home + len;
        let _guard = crossbeam_epoch::pin();
        let register = || self.register_cache();
        let cache = self.config.node_cache.then_some(CacheHandle {
            id: self.id,
            alive: &self.alive,
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
            let _read = (!self.config.lock_free_reads)
                .then(|| part.rw.read().unwrap_or_else(|e| e.into_inner()));
            match &part.index {
                Index::Sorted(array) => array.read(at, stop, &mut f, &mut |whole, seq| {
                    if let Some(c) = &cache {
                        c.put(at.max(whole.home), array.seq_word(), seq, whole);
                    }
                }),
                Index::Skip(list) => {
                    let mut first = true;
                    let mut pos = at;
                    list.for_each_overlapping(at, stop, |node, v| {
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

    /// Maps `[home, home + len)` to `log`, reporting displaced bytes.
    pub(crate) fn insert(
        &self,
        home: u64,
        len: u64,
        log: u64,
        displaced: &mut impl FnMut(u64, u64),
    ) {
        if len == 0 {
            return;
        }
        for (p, s, e) in self.split(home, home + len) {
            let part = self.partition(p);
            let _excl = (!self.config.lock_free_reads)
                .then(|| part.rw.write().unwrap_or_else(|e| e.into_inner()));
            let log = log + (s - home);
            match &part.index {
                Index::Sorted(array) => array.writer().insert(s, e - s, log, displaced),
                Index::Skip(list) => list.writer().insert(s, e - s, log, displaced),
            }
        }
    }

    /// Unmaps `[home, home + len)`, reporting displaced bytes.
    pub(crate) fn remove(&self, home: u64, len: u64, displaced: &mut impl FnMut(u64, u64)) {
        if len == 0 {
            return;
        }
        for (p, s, e) in self.split(home, home + len) {
            if let Some(part) = self.partitions.get(p) {
                let _excl = (!self.config.lock_free_reads)
                    .then(|| part.rw.write().unwrap_or_else(|e| e.into_inner()));
                match &part.index {
                    Index::Sorted(array) => array.writer().clear(s, e, displaced),
                    Index::Skip(list) => {
                        list.writer().clear(s, e, displaced);
                    }
                }
            }
        }
    }

    /// Calls `f` with every mapped piece (for checking tools).
    pub(crate) fn for_each_piece(&self, mut f: impl FnMut(Piece)) {
        let _guard = crossbeam_epoch::pin();
        for part in self.partitions.partitions() {
            let _read = (!self.config.lock_free_reads)
                .then(|| part.rw.read().unwrap_or_else(|e| e.into_inner()));
            match &part.index {
                Index::Sorted(array) => {
                    array.for_each(&mut |home, len, log| f(Piece { home, len, log }))
                }
                Index::Skip(list) => list.for_each_overlapping(0, u64::MAX, |_, v| {
                    f(Piece {
                        home: v.home,
                        len: v.len,
                        log: v.log,
                    })
                }),
            }
        }
    }

    /// Number of mapped ranges (skip-list nodes or sorted-array entries).
    pub(crate) fn nodes(&self) -> u64 {
        self.partitions
            .partitions()
            .map(|p| match &p.index {
                Index::Sorted(array) => array.len() as u64,
                Index::Skip(list) => list.len() as u64,
            })
            .sum()
    }

    /// Number of partitions made.
    pub(crate) fn partition_count(&self) -> u64 {
        self.partitions.partitions().count() as u64
    }

    /// DRAM held by the mapping: directory, partitions, nodes or entries, and node
    /// caches.
    pub(crate) fn dram_bytes(&self) -> u64 {
        let parts: usize = self
            .partitions
            .partitions()
            .map(|p| {
                std::mem::size_of::<Partition>()
                    + match &p.index {
                        Index::Sorted(array) => array.dram_bytes(),
                        Index::Skip(list) => std::mem::size_of::<SkipList>() + list.dram_bytes(),
                    }
            })
            .sum();
        let caches = self.cache_figures().caches as usize * node_cache::CACHE_BYTES;
        (self.partitions.dram_bytes() + parts + caches) as u64
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
mod tests {
    use super::*;
    use proptest::prelude::*;

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
