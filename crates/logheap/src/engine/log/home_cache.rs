//! The DRAM home cache: a copy of the home space in DRAM, page by page, so that a read
//! is a lookup of its page and a copy, as in an in-place engine, instead of a walk of
//! the address mapping and a copy out of the log.
//!
//! It is DudeTM's shadow memory ("DudeTM: Building Durable Transactions with Decoupling
//! for Persistent Memory", ASPLOS 2017) in the log engine's own situation: the log is
//! the only durable home of the data, so a page is filled from the log (through the
//! mapping) when a read first meets it, kept up to date by every commit that changes
//! it, and evicted without being written back. The mapping stays the durable index:
//! misses, cleaning and recovery go through it. After an open the cache is empty.
//!
//! **Concurrency.** A page is changed only under the stripe locks of the bytes changed:
//! a commit's publish writes its new bytes into the pages that are cached (frees
//! write zeros), while it holds the locks of every stripe it writes or frees. Filling
//! and evicting a page take the locks of all its stripes (trying, never waiting: a
//! read that cannot get them reads through the mapping) and give them back with their
//! versions unchanged, so they exclude every commit that changes the page and are
//! invisible to the transactions' validation. Readers take no lock: they copy a page's
//! words with atomic loads (a commit may be storing them) between the driver's checks
//! of the stripes' lock words, which reject any read that overlapped a commit. A page
//! evicted while a reader copies from it is freed only after the pool's epoch has
//! moved past every transaction pinned when it was unlinked.
//!
//! **Budget.** [`LogOptions::home_cache`](super::LogOptions::home_cache) bytes of pages
//! at most. Past it, one miss in 16 fills its page, evicting one that CLOCK chooses (a
//! read sets its page's reference bit, only if clear; the hand gives a referenced page
//! a second chance); the other misses read through the mapping. A working set larger
//! than the budget thus does not churn the cache: a cache too small costs little more
//! than none. Pages are whole 4 KiB of home space, so a budget holds the hot objects
//! only as far as they share pages.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use crossbeam_epoch::Guard;

use super::LogEngine;
use super::commit_data::CommitBuffers;
use super::mapping::{AddressMap, Extent};
use crate::media::word_copy;
use crate::stm::{CommitSet, StripeLocks, stripes};
use crate::sync::lock;
use crate::zeroed::ZeroedTable;

/// Bytes of a page.
pub(crate) const PAGE: u64 = 4096;
const WORDS: usize = (PAGE / 8) as usize;

/// One cached page of home space, as words (stored by commits while readers copy),
/// and its reference bit (set by reads, cleared by the eviction's clock hand).
pub(crate) struct Page {
    referenced: AtomicBool,
    words: [AtomicU64; WORDS],
}

impl Page {
    /// A page holding `bytes`.
    fn from_bytes(bytes: &[u8; PAGE as usize]) -> Box<Page> {
        let page = Box::new(Page {
            referenced: AtomicBool::new(false),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        });
        page.store(0, bytes);
        page
    }

    /// Copies the bytes at `at..at + out.len()` of the page into `out`.
    #[inline]
    pub(crate) fn load(&self, at: usize, out: &mut [u8]) {
        // A store only when the bit is clear: a hot page's line stays shared.
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
        assert!(at + out.len() <= PAGE as usize, "a load past the page");
        // SAFETY: the range is inside the page's words (checked above), which are only
        // ever accessed as whole atomic words (here, `store` and `zero`).
        unsafe { word_copy::load(self.base().add(at), out) }
    }

    /// Stores `bytes` at `at` (the caller holds the locks of their stripes, so no other
    /// thread stores into the words it changes).
    fn store(&self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= PAGE as usize, "a store past the page");
        // SAFETY: as in `load`.
        unsafe { word_copy::store(self.base().add(at), bytes) }
    }

    /// Stores zeros over `at..at + len`.
    fn zero(&self, at: usize, len: usize) {
        assert!(at + len <= PAGE as usize, "a store past the page");
        // SAFETY: as in `load`.
        unsafe { word_copy::fill(self.base().add(at), len, 0) }
    }

    /// The page's first byte (its words, seen as bytes by the word copies).
    fn base(&self) -> *mut u8 {
        self.words.as_ptr() as *mut u8
    }
}

/// Where each cached page is: a two-level radix table of page pointers (null: not
/// cached). Written by hand rather than on the mapping's [`Directory`], whose
/// partitions are boxed and never freed: here a read finds its page in three dependent
/// loads (the leaf pointer, the page pointer, the data), and a page is unlinked and
/// freed through the epoch while its slot stays.
struct PageTable {
    /// One pointer per leaf of [`LEAF_PAGES`] pages, the leaf made when a page in it is
    /// first installed.
    leaves: ZeroedTable<AtomicPtr<Leaf>>,
    /// The indexes of the leaves made, so that counting and freeing them does not go
    /// through every leaf pointer (a million of them over the whole home space: walking
    /// them made each open and close of a pool, and each figure of its DRAM, cost
    /// milliseconds).
    made: Mutex<Vec<usize>>,
}

/// Pages per leaf of the [`PageTable`] (128 MiB of home space, 256 KiB of pointers).
const LEAF_PAGES: usize = 1 << 15;

/// A leaf of the [`PageTable`].
struct Leaf {
    pages: [AtomicPtr<Page>; LEAF_PAGES],
}

impl PageTable {
    /// A table over `2^page_bits` pages.
    fn new(page_bits: u32) -> PageTable {
        let leaves = 1usize << page_bits.saturating_sub(LEAF_PAGES.trailing_zeros());
        // SAFETY: a zero `AtomicPtr` is null, and it needs no drop.
        let leaves = unsafe { ZeroedTable::new(leaves) };
        PageTable {
            leaves,
            made: Mutex::default(),
        }
    }

    /// Page `n`'s slot, if its leaf exists.
    #[inline]
    fn slot(&self, n: u64) -> Option<&AtomicPtr<Page>> {
        let leaf = self.leaves[n as usize / LEAF_PAGES].load(Ordering::Acquire);
        // SAFETY: a non-null leaf pointer was made by `slot_or_make` and is freed only
        // when the table drops.
        let leaf = (!leaf.is_null()).then(|| unsafe { &*leaf })?;
        Some(&leaf.pages[n as usize % LEAF_PAGES])
    }

    /// Page `n`'s slot, its leaf made if need be.
    fn slot_or_make(&self, n: u64) -> &AtomicPtr<Page> {
        if let Some(slot) = self.slot(n) {
            return slot;
        }
        let words = vec![0usize; LEAF_PAGES].into_boxed_slice();
        // SAFETY: as in `new`, for a slice of `LEAF_PAGES` null page pointers, which has
        // the layout of a `Leaf` (its one field is that array).
        let fresh = Box::into_raw(words) as *mut AtomicPtr<Page> as *mut Leaf;
        let at = &self.leaves[n as usize / LEAF_PAGES];
        let raced = at
            .compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err();
        if raced {
            // SAFETY: `fresh` was not published (another thread made the leaf first); it
            // is the box made above.
            drop(unsafe { Box::from_raw(fresh) });
        } else {
            lock(&self.made).push(n as usize / LEAF_PAGES);
        }
        self.slot(n).expect("the leaf was just made")
    }

    /// Leaves made.
    fn leaves_made(&self) -> usize {
        lock(&self.made).len()
    }
}

impl std::fmt::Debug for PageTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageTable")
            .field("leaves_made", &self.leaves_made())
            .finish()
    }
}

impl Drop for PageTable {
    fn drop(&mut self) {
        let made = std::mem::take(self.made.get_mut().unwrap_or_else(|e| e.into_inner()));
        for at in made {
            let leaf = self.leaves[at].swap(std::ptr::null_mut(), Ordering::AcqRel);
            if leaf.is_null() {
                continue;
            }
            // SAFETY: the table is going away with its pool: no transaction is left to
            // read a page; leaves and pages were made with `Box::into_raw`.
            let mut leaf = unsafe { Box::from_raw(leaf) };
            for page in leaf.pages.iter_mut() {
                let p = *page.get_mut();
                if !p.is_null() {
                    // SAFETY: as above.
                    drop(unsafe { Box::from_raw(p) });
                }
            }
        }
    }
}

/// Counters of the cache (see [`HomeCache::figures`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HomeCacheFigures {
    /// Pages cached now.
    pub pages: u64,
    /// Pages filled from the log since the pool was opened.
    pub fills: u64,
    /// Pages evicted since the pool was opened.
    pub evictions: u64,
    /// Reads of a page that could not be cached (its stripes were locked, or the
    /// budget is full of pages that could not be evicted) and went through the mapping.
    pub bypasses: u64,
}

/// The home cache (see the module docs).
#[derive(Debug)]
pub(crate) struct HomeCache {
    table: PageTable,
    /// Most pages cached at once.
    budget: u64,
    /// The pages cached, in the order the clock hand visits them.
    cached: Mutex<VecDeque<u64>>,
    pages: AtomicU64,
    full_misses: AtomicU64,
    fills: AtomicU64,
    evictions: AtomicU64,
    bypasses: AtomicU64,
}

impl HomeCache {
    /// A cache of at most `budget_bytes` (rounded down to whole pages, at least one)
    /// over a home space of `2^home_bits` bytes.
    pub(crate) fn new(budget_bytes: u64, home_bits: u32) -> HomeCache {
        HomeCache {
            table: PageTable::new(home_bits - PAGE.trailing_zeros()),
            budget: (budget_bytes / PAGE).max(1),
            cached: Mutex::default(),
            pages: AtomicU64::new(0),
            full_misses: AtomicU64::new(0),
            fills: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            bypasses: AtomicU64::new(0),
        }
    }

    /// Page `n`, if it is cached. The reference is valid while `_guard` pins the pool's
    /// epoch (an evicted page is freed only after that).
    #[inline]
    pub(crate) fn page<'g>(&self, n: u64, _guard: &'g Guard) -> Option<&'g Page> {
        let p = self.table.slot(n)?.load(Ordering::Acquire);
        // SAFETY: a non-null slot points to a page installed by `install` and freed only
        // through the epoch after it was unlinked, which `_guard` holds off.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Whether a fill would need an eviction first.
    pub(crate) fn is_full(&self) -> bool {
        self.pages.load(Ordering::Relaxed) >= self.budget
    }

    /// Whether a miss on a full cache may fill its page (evicting another): one miss
    /// in [`ADMIT_WHEN_FULL`], so a working set larger than the budget does not churn
    /// the cache on every miss (the others read through the mapping, as without a
    /// cache: a cache too small costs little more than none).
    pub(crate) fn admits_when_full(&self) -> bool {
        self.full_misses
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(ADMIT_WHEN_FULL)
    }

    /// The next page the clock hand finds unreferenced, taken off the eviction queue
    /// (the caller evicts it with [`evict`](Self::evict) or hands it back with
    /// [`keep`](Self::keep)); referenced pages it passes lose their bit and go round
    /// again (CLOCK's second chance).
    pub(crate) fn victim(&self, guard: &Guard) -> Option<u64> {
        let mut queue = lock(&self.cached);
        for _ in 0..queue.len() {
            let n = queue.pop_front()?;
            match self.page(n, guard) {
                Some(page) if page.referenced.swap(false, Ordering::Relaxed) => {
                    queue.push_back(n);
                }
                _ => return Some(n),
            }
        }
        queue.pop_front()
    }

    /// Puts page `n` back at the young end of the eviction queue.
    pub(crate) fn keep(&self, n: u64) {
        lock(&self.cached).push_back(n);
    }

    /// Installs page `n` holding `bytes` (the caller holds the locks of all its stripes)
    /// and returns it; if it is cached already, returns that copy.
    pub(crate) fn install<'g>(
        &self,
        n: u64,
        bytes: &[u8; PAGE as usize],
        _guard: &'g Guard,
    ) -> &'g Page {
        let slot = self.table.slot_or_make(n);
        let existing = slot.load(Ordering::Acquire);
        if !existing.is_null() {
            // SAFETY: as in `page`; unlinking needs the stripe locks the caller holds.
            return unsafe { &*existing };
        }
        let fresh = Box::into_raw(Page::from_bytes(bytes));
        slot.store(fresh, Ordering::Release);
        self.pages.fetch_add(1, Ordering::Relaxed);
        self.fills.fetch_add(1, Ordering::Relaxed);
        lock(&self.cached).push_back(n);
        // SAFETY: just installed; freed only through the epoch after unlinking.
        unsafe { &*fresh }
    }

    /// Unlinks page `n` (the caller holds the locks of all its stripes) and frees it
    /// once no transaction pinned now can still be copying from it.
    pub(crate) fn evict(&self, n: u64, guard: &Guard) {
        let Some(slot) = self.table.slot(n) else {
            return;
        };
        let p = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if p.is_null() {
            return;
        }
        self.pages.fetch_sub(1, Ordering::Relaxed);
        self.evictions.fetch_add(1, Ordering::Relaxed);
        let p = p as usize;
        // SAFETY: the page is unlinked, so no reader finds it any more; the ones that
        // found it before are pinned, and the deferred drop runs after they unpin.
        unsafe {
            guard.defer_unchecked(move || drop(Box::from_raw(p as *mut Page)));
        }
    }

    /// A read of a page that could not be cached.
    pub(crate) fn count_bypass(&self) {
        self.bypasses.fetch_add(1, Ordering::Relaxed);
    }

    /// Stores `bytes` at home offset `home` into the pages cached (the caller, a
    /// commit's publish, holds the locks of their stripes).
    pub(crate) fn write(&self, home: u64, bytes: &[u8], guard: &Guard) {
        self.for_each_page(home, bytes.len() as u64, guard, |page, at, from, len| {
            page.store(at, &bytes[from..from + len]);
        });
    }

    /// Stores zeros over `[home, home + len)` in the pages cached (a freed block reads
    /// as zeros, as the unmapped log does; the caller holds the stripes' locks).
    pub(crate) fn zero(&self, home: u64, len: u64, guard: &Guard) {
        self.for_each_page(home, len, guard, |page, at, _, n| page.zero(at, n));
    }

    /// Calls `f(page, offset in page, offset in the range, bytes)` for each cached page
    /// over `[home, home + len)`.
    fn for_each_page(
        &self,
        home: u64,
        len: u64,
        guard: &Guard,
        mut f: impl FnMut(&Page, usize, usize, usize),
    ) {
        let end = home + len;
        let mut at = home;
        while at < end {
            let n = at / PAGE;
            let stop = ((n + 1) * PAGE).min(end);
            if let Some(page) = self.page(n, guard) {
                f(
                    page,
                    (at % PAGE) as usize,
                    (at - home) as usize,
                    (stop - at) as usize,
                );
            }
            at = stop;
        }
    }

    /// The cache's counters.
    pub(crate) fn figures(&self) -> HomeCacheFigures {
        HomeCacheFigures {
            pages: self.pages.load(Ordering::Relaxed),
            fills: self.fills.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            bypasses: self.bypasses.load(Ordering::Relaxed),
        }
    }

    /// DRAM the cache holds: its pages, its directory and its queue.
    pub(crate) fn dram_bytes(&self) -> u64 {
        let pages = self.pages.load(Ordering::Relaxed);
        let leaves = self.table.leaves_made() as u64;
        pages * (PAGE + 16) + leaves * std::mem::size_of::<Leaf>() as u64
    }
}

/// A full cache fills one miss in this many (see [`HomeCache::admits_when_full`]).
const ADMIT_WHEN_FULL: u64 = 16;

/// How many cached pages a fill that finds the cache full tries to evict (each may be
/// locked by a commit) before it reads through the mapping instead.
const EVICTION_TRIES: usize = 4;

impl LogEngine {
    /// Reads `[home, home + buf.len())` through the home cache: each page from its copy,
    /// filled first when it is not cached (or through the mapping when it cannot be).
    #[inline]
    pub(super) fn read_cached(
        &self,
        cache: &HomeCache,
        guard: &Guard,
        home: u64,
        buf: &mut [u8],
    ) -> bool {
        let end = home + buf.len() as u64;
        let mut at = home;
        let mut intact = true;
        while at < end {
            let n = at / PAGE;
            let stop = ((n + 1) * PAGE).min(end);
            let out = &mut buf[(at - home) as usize..(stop - home) as usize];
            match cache
                .page(n, guard)
                .or_else(|| self.fill_page(cache, guard, n))
            {
                Some(page) => page.load((at % PAGE) as usize, out),
                None => {
                    cache.count_bypass();
                    intact &= self.read_mapped(Some(guard), at, out);
                }
            }
            at = stop;
        }
        intact
    }

    /// Reads `[home, home + buf.len())` through the mapping (under `guard` when given);
    /// `false` when some of it lies in a chunk whose check failed (those bytes read as
    /// zeros).
    pub(super) fn read_mapped(&self, guard: Option<&Guard>, home: u64, buf: &mut [u8]) -> bool {
        let len = buf.len() as u64;
        let mut intact = true;
        let copy = |x: Extent| {
            let at = (x.home - home) as usize;
            let dst = &mut buf[at..at + x.len as usize];
            match x.log {
                // A mapped extent lies in one block, so in one chunk.
                Some(log) if self.chunks.readable(self.geometry.chunk_of(log)) => {
                    self.media.read(log as usize, dst)
                }
                Some(_) => {
                    intact = false;
                    dst.fill(0);
                }
                None => dst.fill(0),
            }
        };
        match guard {
            Some(guard) => self.mapping.lookup_pinned(guard, home, len, copy),
            None => self.mapping.lookup(home, len, copy),
        }
        intact
    }

    /// The stripe locks of page `n`, taken (trying) for an engine owner; `None` when a
    /// commit holds one of them.
    fn lock_page(&self, n: u64) -> Option<StripeLocks> {
        let locks = &self.stm.locks;
        let mut indices: Vec<usize> = stripes(n * PAGE, PAGE).map(|s| locks.index(s)).collect();
        indices.sort_unstable();
        indices.dedup();
        StripeLocks::acquire(locks, &indices, self.stm.new_owner(), Vec::new()).ok()
    }

    /// Copies page `n` from the log into the cache (evicting the oldest page when the
    /// cache is full), under the locks of all its stripes; `None` when it cannot.
    #[cold]
    fn fill_page<'g>(&self, cache: &HomeCache, guard: &'g Guard, n: u64) -> Option<&'g Page> {
        if cache.is_full() && !(cache.admits_when_full() && self.evict_one(cache, guard)) {
            return None;
        }
        let held = self.lock_page(n)?;
        let mut bytes = [0u8; PAGE as usize];
        if !self.read_mapped(Some(guard), n * PAGE, &mut bytes) {
            // A damaged chunk's bytes are never cached: the read goes on through the
            // mapping and fails.
            held.restore(&self.stm.locks);
            return None;
        }
        let page = cache.install(n, &bytes, guard);
        held.restore(&self.stm.locks);
        Some(page)
    }

    /// Evicts a page the clock hand chose that no commit is changing; whether one was.
    fn evict_one(&self, cache: &HomeCache, guard: &Guard) -> bool {
        for _ in 0..EVICTION_TRIES {
            let Some(victim) = cache.victim(guard) else {
                return false;
            };
            match self.lock_page(victim) {
                Some(held) => {
                    cache.evict(victim, guard);
                    held.restore(&self.stm.locks);
                    return true;
                }
                None => cache.keep(victim),
            }
        }
        false
    }

    /// Brings the cached pages a commit changed up to date (from its publish, under its
    /// locks): frees read as zeros, then the data it logged.
    pub(super) fn publish_to_cache(
        &self,
        cache: &HomeCache,
        guard: &Guard,
        set: &CommitSet<'_>,
        buffers: &CommitBuffers,
    ) {
        for &(home, size) in &set.allocs.frees {
            cache.zero(home, size, guard);
        }
        for staged in buffers.logs.iter().flatten().filter(|e| !e.tombstone) {
            let entry = staged.entry(&buffers.staging);
            cache.write(entry.home, entry.data, guard);
        }
    }
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Page")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_store_and_load_any_byte_range() {
        let mut bytes = [0u8; PAGE as usize];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = i as u8;
        }
        let page = Page::from_bytes(&bytes);
        let mut out = [0u8; 13];
        page.load(5, &mut out);
        assert_eq!(out[..], bytes[5..18]);
        page.store(7, &[0xAA; 10]);
        page.zero(20, 3);
        let mut all = [0u8; PAGE as usize];
        page.load(0, &mut all);
        bytes[7..17].fill(0xAA);
        bytes[20..23].fill(0);
        assert_eq!(all, bytes);
    }

    #[test]
    fn a_cache_installs_writes_zeroes_and_evicts() {
        let epoch = crossbeam_epoch::Collector::new().register();
        let guard = epoch.pin();
        let cache = HomeCache::new(2 * PAGE, 47);
        assert!(cache.page(3, &guard).is_none());
        let page = cache.install(3, &[1; PAGE as usize], &guard);
        let mut out = [0u8; 4];
        page.load(100, &mut out);
        assert_eq!(out, [1; 4]);
        // A write across pages 3 and 4 reaches the cached one only.
        cache.write(3 * PAGE + PAGE - 2, &[9; 4], &guard);
        cache.zero(3 * PAGE, 2, &guard);
        let page = cache.page(3, &guard).unwrap();
        let mut edge = [0u8; 2];
        page.load(PAGE as usize - 2, &mut edge);
        assert_eq!(edge, [9, 9]);
        page.load(0, &mut out);
        assert_eq!(out, [0, 0, 1, 1]);
        assert!(cache.page(4, &guard).is_none());
        assert!(!cache.is_full());
        cache.install(4, &[2; PAGE as usize], &guard);
        assert!(cache.is_full());
        // Two pages and the one leaf of pointers they share; a page in another leaf
        // makes a second one.
        let leaf = std::mem::size_of::<Leaf>() as u64;
        assert_eq!(cache.dram_bytes(), 2 * (PAGE + 16) + leaf);
        cache.table.slot_or_make(LEAF_PAGES as u64 * 5 + 1);
        assert_eq!(cache.dram_bytes(), 2 * (PAGE + 16) + 2 * leaf);
        // Page 3 was read (referenced), 4 not: the hand spares 3, clearing its bit, and
        // takes 4; then, 3 unread since, 3.
        assert_eq!(cache.victim(&guard), Some(4));
        cache.evict(4, &guard);
        assert!(cache.page(4, &guard).is_none());
        assert_eq!(cache.victim(&guard), Some(3));
        cache.evict(3, &guard);
        let f = cache.figures();
        assert_eq!((f.pages, f.fills, f.evictions), (0, 2, 2));
    }
}
