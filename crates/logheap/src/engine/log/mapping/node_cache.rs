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

const SET_BITS: u32 = 11;
const WAYS: usize = 4;
/// DRAM of one thread's cache.
pub(crate) const CACHE_BYTES: usize = (1 << SET_BITS) * (WAYS * std::mem::size_of::<Entry>() + 1);

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

fn set_of(addr: u64) -> usize {
    ((addr >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SET_BITS)) as usize
}

fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// Runs `f` with the calling thread's cache for the mapping `id` (made on first use;
/// `alive` is the mapping's liveness token, `register` makes its counter block).
fn with_cache<R>(
    id: u64,
    alive: &Arc<()>,
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
                    sets: vec![[EMPTY; WAYS]; 1 << SET_BITS].into_boxed_slice(),
                    next_way: vec![0u8; 1 << SET_BITS].into_boxed_slice(),
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
    pub register: &'m dyn Fn() -> Arc<CachePadded<CacheCounters>>,
}

impl CacheHandle<'_> {
    /// The cached range covering `addr`, validated, or `None` (a miss).
    pub(crate) fn get(&self, addr: u64) -> Option<Piece> {
        with_cache(self.id, self.alive, self.register, |c| {
            let set = set_of(addr);
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
        with_cache(self.id, self.alive, self.register, |c| {
            let set = set_of(addr);
            let way = c.next_way[set] as usize % WAYS;
            c.sets[set][way] = Entry { word, seq, range };
            c.next_way[set] = ((way + 1) % WAYS) as u8;
        })
    }
}
