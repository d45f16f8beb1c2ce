//! Thread-local tree node caches ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §3.2).
//!
//! A set-associative cache from home addresses to mapped ranges. The set is chosen from
//! the address's high bits (`addr >> 6`), so addresses in one 64-byte neighbourhood share
//! a set and are checked against the ranges cached there: a plain hash of the address
//! would send `0x1008` and `0x1000` to different buckets and miss the range covering both.
//!
//! An entry keeps the range it maps and the *sequence word* that guards it: a skip-list
//! node's (unchanged while the node lives) or a sorted-array partition's (unchanged while
//! none of its entries change). A hit is validated by reading that one word: equal to the
//! cached value, the range is still mapped as cached. Sequence words live as long as the
//! mapping (nodes are type-stable, partitions are never freed before it).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_utils::CachePadded;

use super::Piece;
use crate::stm::atomic::AtomicU64 as SeqWord;

/// Entries per set.
pub(crate) const WAYS: usize = 4;
/// Entries of one thread's cache by default: 2,048 sets.
pub(crate) const DEFAULT_ENTRIES: usize = 8192;
/// Most entries of one thread's cache (the paper's largest, 4 M).
pub(crate) const MAX_ENTRIES: usize = 4 << 20;

/// The set bits of a cache of `entries` entries (rounded down to a power of two sets;
/// `entries` is at least [`WAYS`]).
pub(crate) fn set_bits(entries: usize) -> u32 {
    (entries / WAYS).max(1).ilog2()
}

/// DRAM of one thread's cache of `1 << set_bits` sets.
pub(crate) fn cache_bytes(set_bits: u32) -> usize {
    (1usize << set_bits) * (WAYS * std::mem::size_of::<Entry>() + 1)
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// A sequence word (the STM protocol's atomic type, as the partitions' seqlocks
    /// have it).
    word: *const SeqWord,
    seq: u64,
    range: Piece,
}

const EMPTY: Entry = Entry {
    word: std::ptr::null(),
    seq: 1,
    range: Piece {
        home: 0,
        len: 0,
        log: 0,
    },
};

/// Hit and miss counts of one thread's cache, summed by the mapping.
#[derive(Debug, Default)]
pub(crate) struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

/// One thread's cache for one mapping.
struct NodeCache {
    mapping: Weak<()>,
    mapping_id: u64,
    sets: Box<[[Entry; WAYS]]>,
    next_way: Box<[u8]>,
    counters: Arc<CachePadded<CacheCounters>>,
}

thread_local! {
    static CACHES: RefCell<Vec<NodeCache>> = const { RefCell::new(Vec::new()) };
}

fn set_of(addr: u64, set_bits: u32) -> usize {
    // A set of one (no bits) is set 0 (a shift by 64 would overflow).
    ((addr >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (63 - set_bits) >> 1) as usize
}

fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// Runs `f` with the calling thread's cache for the mapping `id` (made on first use,
/// of `1 << set_bits` sets; `alive` is the mapping's liveness token, `register` makes
/// its counter block).
fn with_cache<R>(
    id: u64,
    alive: &Arc<()>,
    set_bits: u32,
    register: impl FnOnce() -> Arc<CachePadded<CacheCounters>>,
    f: impl FnOnce(&mut NodeCache) -> R,
) -> R {
    CACHES.with(|caches| {
        let mut caches = caches.borrow_mut();
        let i = match caches.iter().position(|c| c.mapping_id == id) {
            Some(i) => i,
            None => {
                caches.retain(|c| c.mapping.strong_count() > 0);
                caches.push(NodeCache {
                    mapping: Arc::downgrade(alive),
                    mapping_id: id,
                    sets: vec![[EMPTY; WAYS]; 1 << set_bits].into_boxed_slice(),
                    next_way: vec![0u8; 1 << set_bits].into_boxed_slice(),
                    counters: register(),
                });
                caches.len() - 1
            }
        };
        f(&mut caches[i])
    })
}

/// The cache front used by the mapping.
pub(crate) struct CacheHandle<'m> {
    pub id: u64,
    pub alive: &'m Arc<()>,
    /// The cache has `1 << set_bits` sets.
    pub set_bits: u32,
    pub register: &'m dyn Fn() -> Arc<CachePadded<CacheCounters>>,
}

impl CacheHandle<'_> {
    /// The cached range covering `addr`, validated, or `None` (a miss).
    pub(crate) fn get(&self, addr: u64) -> Option<Piece> {
        with_cache(self.id, self.alive, self.set_bits, self.register, |c| {
            let set = set_of(addr, self.set_bits);
            for e in &c.sets[set] {
                if e.word.is_null() || addr < e.range.home || addr >= e.range.home + e.range.len {
                    continue;
                }
                // SAFETY: cached words belong to type-stable nodes or to partitions of
                // this mapping, which is alive (we were called through it).
                let seq = unsafe { &*e.word }.load(crate::stm::atomic::Ordering::Acquire);
                if seq == e.seq {
                    bump(&c.counters.hits);
                    return Some(e.range);
                }
            }
            bump(&c.counters.misses);
            None
        })
    }

    /// Caches `range`, valid while `word` holds `seq`, for the neighbourhood of `addr`
    /// (FIFO).
    pub(crate) fn put(&self, addr: u64, word: &SeqWord, seq: u64, range: Piece) {
        with_cache(self.id, self.alive, self.set_bits, self.register, |c| {
            let set = set_of(addr, self.set_bits);
            let way = c.next_way[set] as usize % WAYS;
            c.sets[set][way] = Entry { word, seq, range };
            c.next_way[set] = ((way + 1) % WAYS) as u8;
        })
    }
}
