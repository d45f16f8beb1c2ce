//! The DRAM state the heap's parts share: what each region is used as (`USE_*`), the
//! arenas and the free regions, the blocks an arena holds, and how a block of some size
//! is served.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::steps::Step;
use crate::alloc::big::{self, BigBlock, BigRuns};
use crate::alloc::files::Slot;
use crate::alloc::layout::{GRANULE, HUGE_THRESHOLD, MicroOp, SMALL_MAX, class_of};
use crate::alloc::metadata_log::RingState;
use crate::alloc::small::{SmallBlock, SmallChunks};

/// What a region is used as, as seen without a lock: `kind << 24 | arena`, or a huge
/// block's continuation, or 0 (free).
pub(super) const USE_SMALL: u32 = 1 << 24;
pub(super) const USE_BIG: u32 = 2 << 24;
pub(super) const USE_HUGE: u32 = 3 << 24;
pub(super) const USE_HUGE_TAIL: u32 = 4 << 24;
pub(super) const USE_KIND: u32 = 0xff << 24;
/// Set beside the kind for a region of the volatile heap.
pub(super) const USE_VOLATILE: u32 = 1 << 23;
/// The arena bits of a region's use.
pub(super) const USE_ARENA: u32 = 0xffff;

/// An arena: its segments' DRAM state and its micro-log slot.
#[derive(Debug, Default)]
pub(super) struct Arena {
    pub(super) small: SmallChunks,
    pub(super) big: BigRuns,
    /// Its small segments' regions.
    pub(super) small_segments: BTreeSet<u32>,
    /// The sequence number of its micro-log slot.
    pub(super) seq: u64,
    /// Its metadata-log ring
    /// ([`MetadataPolicy::MetadataLog`](crate::alloc::MetadataPolicy::MetadataLog)).
    pub(super) ring: RingState,
    /// The metadata steps of the ring's records, not yet stored in place.
    pub(super) pending: Vec<(Step, MicroOp)>,
    /// Checkpoints taken.
    pub(super) checkpoints: u64,
}

impl Arena {
    /// Its live small and big blocks and their usable bytes.
    pub(super) fn live(&self) -> (u64, u64) {
        let (n, b) = self.small.live();
        let (m, c) = self.big.live();
        (n + m, b + c)
    }

    /// DRAM held by its indexes (approximate).
    pub(super) fn dram_bytes(&self) -> u64 {
        self.small.dram_bytes() + self.big.dram_bytes()
    }

    /// Gives back a block it holds (DRAM only); whether its segment may now be empty (a
    /// small block's chunk emptied, or any big block: checking a big segment costs one
    /// look, a small one a look at every chunk).
    pub(super) fn give_back(&mut self, held: Held) -> bool {
        match held {
            Held::Small(b) => self.small.give_back(b),
            Held::Big(b) => {
                self.big.give_back(b);
                true
            }
        }
    }
}

/// Which regions are free, and how often each was taken.
#[derive(Debug)]
pub(super) struct Regions {
    /// Free regions (only regions of files that exist).
    pub(super) free: BTreeSet<u32>,
    /// What each extension slot holds.
    pub(super) slots: Vec<Slot>,
    /// Per region, how often it was taken as a segment (its table entry's generation).
    pub(super) generation: Vec<u64>,
    /// The volatile heap's huge blocks: their first region and their count of regions
    /// (a persistent huge block's count is in its table entry).
    pub(super) volatile_huge: BTreeMap<u32, u64>,
}

/// The arena of this thread: threads are spread round-robin over the arenas as they
/// first allocate (002 keeps one allocator per core; a thread keeps its arena, so its
/// blocks stay together and its frees find their arena's lock uncontended).
pub(super) fn arena_hint() -> usize {
    thread_local! {
        static HINT: usize = {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            NEXT.fetch_add(1, Ordering::Relaxed)
        };
    }
    HINT.with(|h| *h)
}

/// A block an arena holds.
#[derive(Debug, Clone, Copy)]
pub(super) enum Held {
    Small(SmallBlock),
    Big(BigBlock),
}

/// How a block of some size is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SizePolicy {
    /// By the small allocator, in this class.
    Small(usize),
    /// By the big allocator, in this many granules.
    Big(u32),
    /// As a huge block over this many regions.
    Huge(u64),
}

impl SizePolicy {
    /// How a heap with `segment_size` regions serves `size` bytes (`None`: zero bytes).
    pub(super) fn of(segment_size: u64, size: u64) -> Option<SizePolicy> {
        let big_max = segment_size - big::table_granules(segment_size) * GRANULE;
        match size {
            0 => None,
            s if s <= SMALL_MAX => Some(SizePolicy::Small(class_of(s))),
            s if s <= big_max && s < HUGE_THRESHOLD => {
                Some(SizePolicy::Big(s.div_ceil(GRANULE) as u32))
            }
            s => Some(SizePolicy::Huge(s.div_ceil(segment_size))),
        }
    }
}
