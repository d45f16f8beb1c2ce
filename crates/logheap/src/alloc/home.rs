//! The log-structured engine's home-space allocator ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §4.1).
//!
//! Home space is virtual (47-bit offsets), so fragmentation there costs nothing physical.
//! Small objects (up to 4 KiB) come from size classes carved out of 64 KiB-aligned
//! superblocks in the lower half of the heap (Hoard-like); larger ones are page-rounded
//! extents in the upper half, taken best-fit from freed space or from a bump pointer
//! (dlmalloc-like). Nothing here is persisted: the state is rebuilt
//! on recovery from the allocation and free records in the logs (or from the clean-close
//! snapshot's list of allocations).
//!
//! Live small objects are recorded in their superblock, as one 16-bit requested size per
//! slot (0: free), not in a map with an entry per object: that takes 2 bytes per slot
//! instead of about 20 per object, and rebuilding it from a sorted list of allocations
//! writes each superblock's array in order instead of inserting a million hash entries
//! at random places (which was most of the time of loading a snapshot).

use std::collections::{BTreeMap, BTreeSet};

// Home offsets are not attacker-chosen keys (they come from this allocator or from a
// checksummed log), so a fast non-cryptographic hash is safe, and the default SipHash
// was most of the cost of rebuilding the allocator on open.
use rustc_hash::FxHashMap as HashMap;

use std::sync::Mutex;

use super::TxHeap;
use crate::error::{Error, Result};

/// Home offsets are 47-bit.
pub(crate) const HOME_LIMIT: u64 = 1 << 47;
/// Home offset where the heap starts (below it: null page and the root object).
pub(crate) const HEAP_START: u64 = 1 << 20;
/// Home offset where large objects start (superblocks live below it).
const LARGE_START: u64 = 1 << 46;
const SUPERBLOCK: u64 = 64 << 10;
const PAGE: u64 = 4096;
const CLASSES: [u64; 16] = [
    16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
];

fn class_of(size: u64) -> Option<usize> {
    CLASSES.iter().position(|&c| c >= size)
}

/// Why an allocation or free failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AllocError {
    /// The 47-bit home space is exhausted.
    HomeSpaceFull,
    /// Zero-sized or larger than the home space.
    BadSize(u64),
    /// Freeing an address that is not the start of a live allocation.
    NotAllocated(u64),
    /// Allocation records that cannot all be true (found on recovery).
    Inconsistent(String),
}

/// A superblock carved into slots of one size class.
#[derive(Debug, Clone)]
struct HomeSuperblock {
    class: usize,
    /// The requested size of the object in each slot; 0 when the slot is free (sizes of
    /// small objects are 1 to 4096).
    sizes: Box<[u16]>,
}

impl HomeSuperblock {
    fn new(class: usize) -> HomeSuperblock {
        HomeSuperblock {
            class,
            sizes: vec![0; (SUPERBLOCK / CLASSES[class]) as usize].into_boxed_slice(),
        }
    }
}

/// The allocator state.
#[derive(Debug, Default)]
pub(crate) struct HomeAllocator {
    /// Superblocks with a class: start -> its slots.
    superblocks: HashMap<u64, HomeSuperblock>,
    /// Live large allocations: start -> requested size.
    large: HashMap<u64, u64>,
    /// Live allocations, and the sum of their requested sizes.
    count: usize,
    bytes: u64,
    /// Free slots per size class.
    class_free: Vec<Vec<u64>>,
    /// Runs of superblocks with no class (free on recovery), as `(start, end)`, lowest
    /// last. Kept as ranges: a damaged record far up the heap costs nothing.
    free_superblocks: Vec<(u64, u64)>,
    /// Next never-used superblock.
    superblock_bump: u64,
    /// Free page-rounded large extents: start -> length, and (length, start) for best fit.
    free_by_start: BTreeMap<u64, u64>,
    free_by_size: BTreeSet<(u64, u64)>,
    /// Next never-used large extent.
    bump: u64,
}

impl HomeAllocator {
    /// An empty heap.
    pub(crate) fn new() -> HomeAllocator {
        HomeAllocator {
            class_free: vec![Vec::new(); CLASSES.len()],
            superblock_bump: HEAP_START,
            bump: LARGE_START,
            ..HomeAllocator::default()
        }
    }

    /// Number of live allocations.
    pub(crate) fn live_count(&self) -> usize {
        self.count
    }

    /// Sum of the sizes of live allocations.
    pub(crate) fn live_bytes(&self) -> u64 {
        self.bytes
    }

    /// The superblock holding small-object home `home`, and its slot there, if `home`
    /// is the start of a slot of a superblock with a class.
    fn slot_of(&self, home: u64) -> Option<(u64, usize)> {
        if !(HEAP_START..LARGE_START).contains(&home) {
            return None;
        }
        let sb = home - (home - HEAP_START) % SUPERBLOCK;
        let superblock = self.superblocks.get(&sb)?;
        let size = CLASSES[superblock.class];
        let slot = ((home - sb) / size) as usize;
        // A class that does not divide the superblock leaves a tail with no slot.
        ((home - sb).is_multiple_of(size) && slot < superblock.sizes.len()).then_some((sb, slot))
    }

    /// The size of the live allocation starting at `home`.
    pub(crate) fn size_of(&self, home: u64) -> Option<u64> {
        match self.slot_of(home) {
            Some((sb, slot)) => {
                let size = self.superblocks[&sb].sizes[slot];
                (size != 0).then_some(size as u64)
            }
            None => self.large.get(&home).copied(),
        }
    }

    /// Every live allocation `(home, size)`, sorted.
    pub(crate) fn allocations(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = Vec::with_capacity(self.count);
        let mut sbs: Vec<(&u64, &HomeSuperblock)> = self.superblocks.iter().collect();
        sbs.sort_unstable_by_key(|&(&start, _)| start);
        for (&start, sb) in sbs {
            let size = CLASSES[sb.class];
            v.extend(
                sb.sizes
                    .iter()
                    .enumerate()
                    .filter(|&(_, &s)| s != 0)
                    .map(|(i, &s)| (start + i as u64 * size, s as u64)),
            );
        }
        let small = v.len();
        v.extend(self.large.iter().map(|(&h, &s)| (h, s)));
        v[small..].sort_unstable();
        v
    }

    /// Allocates `size` bytes.
    pub(crate) fn alloc(&mut self, size: u64) -> Result<u64, AllocError> {
        if size == 0 || size >= HOME_LIMIT - HEAP_START {
            return Err(AllocError::BadSize(size));
        }
        let home = match class_of(size) {
            Some(class) => {
                let home = self.alloc_small(class)?;
                let (sb, slot) = self.slot_of(home).expect("a slot of a carved superblock");
                self.superblocks.get_mut(&sb).expect("carved").sizes[slot] = size as u16;
                home
            }
            None => {
                let home = self.alloc_extent(size.next_multiple_of(PAGE))?;
                self.large.insert(home, size);
                home
            }
        };
        self.count += 1;
        self.bytes += size;
        Ok(home)
    }

    fn alloc_small(&mut self, class: usize) -> Result<u64, AllocError> {
        if let Some(home) = self.class_free[class].pop() {
            return Ok(home);
        }
        let sb = match self.free_superblocks.pop() {
            Some((start, end)) => {
                if start + SUPERBLOCK < end {
                    self.free_superblocks.push((start + SUPERBLOCK, end));
                }
                start
            }
            None if self.superblock_bump + SUPERBLOCK <= LARGE_START => {
                self.superblock_bump += SUPERBLOCK;
                self.superblock_bump - SUPERBLOCK
            }
            None => return Err(AllocError::HomeSpaceFull),
        };
        self.superblocks.insert(sb, HomeSuperblock::new(class));
        let size = CLASSES[class];
        let slots = SUPERBLOCK / size;
        // Hand out low addresses first: push in reverse.
        self.class_free[class].extend((1..slots).rev().map(|i| sb + i * size));
        Ok(sb)
    }

    fn alloc_extent(&mut self, len: u64) -> Result<u64, AllocError> {
        if let Some(&(flen, start)) = self.free_by_size.range((len, 0)..).next() {
            self.take_free(start, flen);
            if flen > len {
                self.put_free(start + len, flen - len);
            }
            return Ok(start);
        }
        let start = self.bump;
        if start + len > HOME_LIMIT {
            return Err(AllocError::HomeSpaceFull);
        }
        self.bump = start + len;
        Ok(start)
    }

    fn take_free(&mut self, start: u64, len: u64) {
        self.free_by_start.remove(&start);
        self.free_by_size.remove(&(len, start));
    }

    fn put_free(&mut self, start: u64, len: u64) {
        self.free_by_start.insert(start, len);
        self.free_by_size.insert((len, start));
    }

    /// Frees the allocation at `home`, returning its size.
    pub(crate) fn free(&mut self, home: u64) -> Result<u64, AllocError> {
        let size = match self.slot_of(home) {
            Some((sb, slot)) => {
                let sb = self.superblocks.get_mut(&sb).expect("found above");
                let size = std::mem::take(&mut sb.sizes[slot]);
                if size == 0 {
                    return Err(AllocError::NotAllocated(home));
                }
                self.class_free[sb.class].push(home);
                size as u64
            }
            None => {
                let size = self
                    .large
                    .remove(&home)
                    .ok_or(AllocError::NotAllocated(home))?;
                self.free_extent(home, size.next_multiple_of(PAGE));
                size
            }
        };
        self.count -= 1;
        self.bytes -= size;
        Ok(size)
    }

    fn free_extent(&mut self, mut start: u64, mut len: u64) {
        if let Some((&s, &l)) = self.free_by_start.range(..start).next_back()
            && s + l == start
        {
            self.take_free(s, l);
            start = s;
            len += l;
        }
        if let Some(&l) = self.free_by_start.get(&(start + len)) {
            self.take_free(start + len, l);
            len += l;
        }
        if start + len == self.bump {
            self.bump = start;
        } else {
            self.put_free(start, len);
        }
    }

    /// Rebuilds the allocator from the live allocations found in the logs (in any
    /// order; fastest sorted by home).
    pub(crate) fn rebuild(
        live: impl IntoIterator<Item = (u64, u64)>,
    ) -> Result<HomeAllocator, AllocError> {
        let mut a = HomeAllocator::new();
        // The superblock of the previous small allocation, taken out of the map while
        // allocations fall in it (they come mostly in address order).
        let mut current: Option<(u64, HomeSuperblock)> = None;
        let mut extents: Vec<(u64, u64)> = Vec::new();
        let outside = |home: u64, size: u64| {
            AllocError::Inconsistent(format!("allocation {home:#x}+{size} is outside its region"))
        };
        let twice = |home: u64| AllocError::Inconsistent(format!("two allocations at {home:#x}"));
        for (home, size) in live {
            if size == 0
                || home < HEAP_START
                || home.checked_add(size).is_none_or(|e| e > HOME_LIMIT)
            {
                return Err(AllocError::Inconsistent(format!(
                    "allocation {home:#x}+{size} is outside the heap"
                )));
            }
            match class_of(size) {
                Some(class) => {
                    if home + size > LARGE_START {
                        return Err(outside(home, size));
                    }
                    let start = home - (home - HEAP_START) % SUPERBLOCK;
                    if !(home - start).is_multiple_of(CLASSES[class])
                        || home - start + CLASSES[class] > SUPERBLOCK
                    {
                        return Err(AllocError::Inconsistent(format!(
                            "{home:#x} is not a slot of size {}",
                            CLASSES[class]
                        )));
                    }
                    if current.as_ref().is_none_or(|(s, _)| *s != start) {
                        if let Some((s, sb)) = current.take() {
                            a.superblocks.insert(s, sb);
                        }
                        let sb = a
                            .superblocks
                            .remove(&start)
                            .unwrap_or_else(|| HomeSuperblock::new(class));
                        current = Some((start, sb));
                    }
                    let sb = &mut current.as_mut().expect("set above").1;
                    if sb.class != class {
                        return Err(AllocError::Inconsistent(format!(
                            "superblock {start:#x} holds objects of sizes {} and {}",
                            CLASSES[sb.class], CLASSES[class]
                        )));
                    }
                    let slot = &mut sb.sizes[((home - start) / CLASSES[class]) as usize];
                    if *slot != 0 {
                        return Err(twice(home));
                    }
                    *slot = size as u16;
                }
                None => {
                    if home < LARGE_START {
                        return Err(outside(home, size));
                    }
                    if !(home - LARGE_START).is_multiple_of(PAGE) {
                        return Err(AllocError::Inconsistent(format!(
                            "large allocation {home:#x} is not page aligned"
                        )));
                    }
                    if a.large.insert(home, size).is_some() {
                        return Err(twice(home));
                    }
                    extents.push((home, size.next_multiple_of(PAGE)));
                }
            }
            a.count += 1;
            a.bytes += size;
        }
        if let Some((s, sb)) = current {
            a.superblocks.insert(s, sb);
        }
        extents.sort_unstable();
        let mut cursor = LARGE_START;
        for &(start, len) in &extents {
            if start < cursor {
                return Err(AllocError::Inconsistent(format!(
                    "allocations overlap at {start:#x}"
                )));
            }
            if start > cursor {
                a.put_free(cursor, start - cursor);
            }
            cursor = start + len;
        }
        a.bump = cursor;
        let mut sbs: Vec<(u64, &HomeSuperblock)> =
            a.superblocks.iter().map(|(&s, sb)| (s, sb)).collect();
        sbs.sort_unstable_by_key(|&(s, _)| s);
        let mut sb_cursor = HEAP_START;
        let mut free_superblocks = Vec::new();
        for &(start, sb) in &sbs {
            if start > sb_cursor {
                free_superblocks.push((sb_cursor, start));
            }
            sb_cursor = start + SUPERBLOCK;
            // Free slots from the highest down, so the lowest is handed out first.
            let size = CLASSES[sb.class];
            a.class_free[sb.class].extend(
                (0..sb.sizes.len())
                    .rev()
                    .filter(|&i| sb.sizes[i] == 0)
                    .map(|i| start + i as u64 * size),
            );
        }
        free_superblocks.reverse();
        a.free_superblocks = free_superblocks;
        a.superblock_bump = sb_cursor;
        Ok(a)
    }
}

/// The home allocator as transactions use it ([`TxHeap`]): shared under a lock, and
/// refusing objects larger than `largest` (which could never be logged) before a
/// transaction builds their image.
#[derive(Debug)]
pub(crate) struct HomeHeap {
    allocator: Mutex<HomeAllocator>,
    largest: u64,
}

impl HomeHeap {
    /// The heap over `allocator`, for objects of at most `largest` bytes.
    pub(crate) fn new(allocator: HomeAllocator, largest: u64) -> HomeHeap {
        HomeHeap {
            allocator: Mutex::new(allocator),
            largest,
        }
    }

    /// The allocator itself.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HomeAllocator> {
        self.allocator.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl TxHeap for HomeHeap {
    fn reserve(&self, size: u64) -> Result<u64> {
        if size > self.largest {
            // It could never be logged: fail before building a huge image.
            return Err(Error::PoolFull);
        }
        self.lock().alloc(size).map_err(|e| match e {
            AllocError::HomeSpaceFull => Error::HomeSpaceFull,
            _ => Error::InvalidSize(size),
        })
    }

    fn size_of(&self, home: u64) -> Option<u64> {
        self.lock().size_of(home)
    }

    fn cancel(&self, reserved: &[(u64, u64)]) {
        if reserved.is_empty() {
            return;
        }
        let mut a = self.lock();
        for &(home, _) in reserved {
            let _ = a.free(home);
        }
    }

    fn publish(&self, _allocs: &[(u64, u64)], frees: &[(u64, u64)]) {
        if frees.is_empty() {
            return;
        }
        let mut a = self.lock();
        for &(home, _) in frees {
            let freed = a.free(home);
            debug_assert!(
                freed.is_ok(),
                "a committed free of {home:#x} was not allocated"
            );
        }
    }

    fn allocations(&self) -> Vec<(u64, u64)> {
        self.lock().allocations()
    }

    fn live(&self) -> (u64, u64) {
        let a = self.lock();
        (a.live_count() as u64, a.live_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_never_overlap_and_frees_are_reused() {
        let mut a = HomeAllocator::new();
        let mut live = Vec::new();
        for i in 0..2000u64 {
            let size = [8, 100, 128, 5000, 70_000, 4096][(i % 6) as usize];
            live.push((a.alloc(size).unwrap(), size));
        }
        let mut sorted = live.clone();
        sorted.sort();
        for w in sorted.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?} overlap");
        }
        let (h, s) = live[4];
        assert_eq!(a.free(h), Ok(s));
        assert_eq!(a.free(h), Err(AllocError::NotAllocated(h)));
        assert_eq!(a.alloc(s).unwrap(), h, "a freed extent is reused best-fit");
    }

    #[test]
    fn the_tail_past_the_last_slot_of_a_superblock_is_no_allocation() {
        let mut a = HomeAllocator::new();
        let home = a.alloc(3000).unwrap(); // class 3072: 21 slots, 1,024 bytes left over
        let sb = home - (home - HEAP_START) % SUPERBLOCK;
        let tail = sb + (SUPERBLOCK / 3072) * 3072;
        assert_eq!(a.size_of(tail), None);
        assert!(a.free(tail).is_err());
        assert_eq!(a.size_of(home), Some(3000));
    }

    #[test]
    fn sizes_and_counts_are_kept_per_slot() {
        let mut a = HomeAllocator::new();
        let sizes = [1u64, 15, 16, 17, 100, 4095, 4096, 4097, 70_000];
        let homes: Vec<u64> = sizes.iter().map(|&s| a.alloc(s).unwrap()).collect();
        for (&h, &s) in homes.iter().zip(&sizes) {
            assert_eq!(a.size_of(h), Some(s));
            assert_eq!(a.size_of(h + 1), None, "not the start of an allocation");
        }
        assert_eq!(a.live_count(), sizes.len());
        assert_eq!(a.live_bytes(), sizes.iter().sum::<u64>());
        assert_eq!(
            a.free(homes[4] + 8),
            Err(AllocError::NotAllocated(homes[4] + 8))
        );
        assert_eq!(a.free(homes[4]), Ok(100));
        assert_eq!(a.size_of(homes[4]), None);
        assert_eq!(a.free(homes[4]), Err(AllocError::NotAllocated(homes[4])));
        assert_eq!(a.free(homes[8]), Ok(70_000));
        assert_eq!(a.live_count(), sizes.len() - 2);
        assert_eq!(a.live_bytes(), sizes.iter().sum::<u64>() - 70_100);
        let mut expected: Vec<(u64, u64)> = homes
            .iter()
            .zip(sizes)
            .enumerate()
            .filter(|&(i, _)| i != 4 && i != 8)
            .map(|(_, (&h, s))| (h, s))
            .collect();
        expected.sort_unstable();
        assert_eq!(a.allocations(), expected);
    }

    #[test]
    fn rebuild_reproduces_the_allocator_state() {
        let mut a = HomeAllocator::new();
        let mut live = Vec::new();
        for i in 0..500u64 {
            let size = 1 + (i * 37) % 9000;
            live.push((a.alloc(size).unwrap(), size));
        }
        for (h, _) in live.iter().step_by(3) {
            a.free(*h).unwrap();
        }
        let kept: Vec<(u64, u64)> = a.allocations();
        let mut b = HomeAllocator::rebuild(kept.clone()).unwrap();
        assert_eq!(b.allocations(), kept);
        // New allocations in the rebuilt heap never overlap the survivors.
        let mut all = kept.clone();
        for i in 0..300u64 {
            let size = 1 + (i * 53) % 9000;
            all.push((b.alloc(size).unwrap(), size));
        }
        all.sort();
        for w in all.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?} overlap");
        }
    }

    /// The free slots a rebuild must leave for `live`, by class: in every superblock
    /// (ascending), its slots from the highest down, less the used ones.
    fn expected_class_free(live: &[(u64, u64)]) -> Vec<Vec<u64>> {
        let mut used: BTreeMap<u64, (usize, BTreeSet<u64>)> = BTreeMap::new();
        for &(home, size) in live {
            if let Some(class) = class_of(size) {
                let sb = home - (home - HEAP_START) % SUPERBLOCK;
                used.entry(sb)
                    .or_insert((class, BTreeSet::new()))
                    .1
                    .insert(home);
            }
        }
        let mut free = vec![Vec::new(); CLASSES.len()];
        for (sb, (class, slots)) in used {
            let size = CLASSES[class];
            free[class].extend(
                (0..SUPERBLOCK / size)
                    .rev()
                    .map(|i| sb + i * size)
                    .filter(|slot| !slots.contains(slot)),
            );
        }
        free
    }

    #[test]
    fn rebuild_leaves_exactly_the_free_slots() {
        let mut a = HomeAllocator::new();
        let mut live = Vec::new();
        for i in 0..6000u64 {
            let size = [8, 100, 128, 5000, 70_000, 4096, 16, 3000][(i % 8) as usize];
            live.push((a.alloc(size).unwrap(), size));
        }
        for (k, (h, _)) in live.iter().enumerate() {
            if k % 3 == 0 || k % 7 == 0 {
                a.free(*h).unwrap();
            }
        }
        let mut kept = a.allocations();
        // Unsorted input too: the rebuild must not depend on the order.
        kept.swap(0, 100);
        kept.swap(7, 3000);
        let rebuilt = HomeAllocator::rebuild(kept.clone()).unwrap();
        assert_eq!(rebuilt.class_free, expected_class_free(&kept));
        kept.sort_unstable();
        assert_eq!(rebuilt.allocations(), kept);
    }

    #[test]
    fn rebuild_refuses_impossible_records() {
        assert!(HomeAllocator::rebuild([(HEAP_START, 100), (HEAP_START, 100)]).is_err());
        assert!(HomeAllocator::rebuild([(HEAP_START, 100), (HEAP_START + 16, 16)]).is_err());
        assert!(HomeAllocator::rebuild([(HEAP_START + 8, 100)]).is_err());
        assert!(HomeAllocator::rebuild([(16, 8)]).is_err());
        assert!(HomeAllocator::rebuild([(LARGE_START, 9000), (LARGE_START + 4096, 9000)]).is_err());
        assert!(HomeAllocator::rebuild([(HEAP_START, 9000)]).is_err());
        assert!(HomeAllocator::rebuild([(LARGE_START, 90)]).is_err());
    }
}
