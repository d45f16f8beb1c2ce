//! One partition's mapping as a sorted array of packed entries: the compact partition
//! index of the two-layer mapping.
//!
//! The paper ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §3.2) keeps a
//! skip list per partition. A 4 KiB partition holds a few dozen objects, and there a skip
//! list's nodes (pointers for every level, one heap block each) cost more DRAM than the
//! data they map and a chain of cache misses per lookup. This index keeps the same
//! semantics (non-overlapping byte ranges of any offset and length, each mapped to a log
//! offset) in one array of 16-byte entries, sorted by home:
//!
//! - word 0: offset of the range within the partition (low 32 bits) and its length (high
//!   32 bits): partitions are at most 2^30 bytes, so both fit;
//! - word 1: the log offset of its first byte.
//!
//! A range's version is not stored: it is the version of the log block the log offset
//! points into, which recovery reads from the log.
//!
//! **Concurrency**: a sequence lock. The single writer of the partition makes the
//! sequence odd (a compare-and-swap from even, which is also the writers' lock), changes
//! the entries in place, and makes it even again. Readers take no lock: they read the
//! sequence, the entries, and the sequence again, and retry if it changed or was odd.
//! Entries are atomics read and written with relaxed ordering, so a reader racing the
//! writer reads stale or mixed values, never undefined ones, and discards them. Readers
//! report nothing until they have validated what they read, so a torn entry is never
//! used (it could point anywhere).
//!
//! **Memory**: the entries live in one heap block, `[capacity, entries...]`, replaced by
//! a larger (or smaller) one when it fills (or empties); the old block is freed after a
//! crossbeam epoch, so a reader still holding it (within its epoch guard) stays safe.
//! Steady-state updates allocate nothing.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering, fence};

use super::{Extent, MAX_PARTITION_SIZE, Piece};

/// Words per entry.
const ENTRY_WORDS: usize = 2;
/// Capacity of a partition's first entry block.
const FIRST_CAPACITY: usize = 2;
/// Extents a reader validates at once (kept on its stack).
const READ_BATCH: usize = 8;

/// A heap block of entries: word 0 is the capacity in entries, then the entries.
struct Block;

impl Block {
    /// A zeroed block for `capacity` entries.
    fn alloc(capacity: usize) -> *mut AtomicU64 {
        let words: Box<[AtomicU64]> = (0..1 + ENTRY_WORDS * capacity)
            .map(|_| AtomicU64::new(0))
            .collect();
        words[0].store(capacity as u64, Ordering::Relaxed);
        Box::into_raw(words) as *mut AtomicU64
    }

    /// The words of the block at `p`.
    ///
    /// # Safety
    /// `p` must come from [`Block::alloc`] and not be freed for the returned lifetime.
    unsafe fn words<'a>(p: *const AtomicU64) -> &'a [AtomicU64] {
        // SAFETY: word 0 holds the capacity the block was made with and is never changed,
        // so the slice covers exactly the allocation (the caller keeps it alive).
        unsafe {
            let capacity = (*p).load(Ordering::Relaxed) as usize;
            std::slice::from_raw_parts(p, 1 + ENTRY_WORDS * capacity)
        }
    }

    /// Frees the block at `p`.
    ///
    /// # Safety
    /// `p` must come from [`Block::alloc`], and nothing may use it afterwards.
    unsafe fn free(p: *mut AtomicU64) {
        // SAFETY: the block is the boxed slice `alloc` leaked, of the length `words` reads.
        unsafe {
            let len = Block::words(p).len();
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len)));
        }
    }
}

/// A packed entry, unpacked: `len` bytes at partition offset `off` live at `log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    off: u64,
    len: u64,
    log: u64,
}

impl Entry {
    fn end(&self) -> u64 {
        self.off + self.len
    }

    fn load(words: &[AtomicU64], i: usize) -> Entry {
        let w0 = words[1 + ENTRY_WORDS * i].load(Ordering::Relaxed);
        Entry {
            off: w0 & 0xFFFF_FFFF,
            len: w0 >> 32,
            log: words[2 + ENTRY_WORDS * i].load(Ordering::Relaxed),
        }
    }

    fn store(self, words: &[AtomicU64], i: usize) {
        words[1 + ENTRY_WORDS * i].store(self.off | (self.len << 32), Ordering::Relaxed);
        words[2 + ENTRY_WORDS * i].store(self.log, Ordering::Relaxed);
    }
}

/// One partition's entries (see the module documentation).
#[derive(Debug)]
pub(crate) struct SortedArray {
    /// Home address of the partition's first byte.
    base: u64,
    /// Even while the entries are stable, odd while the writer changes them.
    seq: AtomicU64,
    /// Entries in use.
    len: AtomicU64,
    /// The entry block.
    block: AtomicPtr<AtomicU64>,
}

// SAFETY: the block pointer is owned by the array and only freed through an epoch (or on
// drop, when no reader can exist); all shared fields are atomics.
unsafe impl Send for SortedArray {}
// SAFETY: as above.
unsafe impl Sync for SortedArray {}

impl Drop for SortedArray {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader or writer holds the block any more.
        unsafe { Block::free(*self.block.get_mut()) }
    }
}

/// Index of the first of `len` entries (sorted, non-overlapping) ending after `off`.
fn first_ending_after(words: &[AtomicU64], len: usize, off: u64) -> usize {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if Entry::load(words, mid).end() <= off {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

impl SortedArray {
    /// An empty index for the partition starting at home address `base`.
    pub(crate) fn new(base: u64) -> SortedArray {
        SortedArray {
            base,
            seq: AtomicU64::new(0),
            len: AtomicU64::new(0),
            block: AtomicPtr::new(Block::alloc(FIRST_CAPACITY)),
        }
    }

    /// The sequence word, whose value is unchanged exactly as long as the entries are
    /// (for node caches).
    pub(crate) fn seq_word(&self) -> &AtomicU64 {
        &self.seq
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed) as usize
    }

    /// DRAM held by the entry block.
    pub(crate) fn dram_bytes(&self) -> usize {
        let _guard = crossbeam_epoch::pin();
        // SAFETY: the block is freed only after an epoch, and we hold a guard.
        let words = unsafe { Block::words(self.block.load(Ordering::Acquire)) };
        std::mem::size_of_val(words)
    }

    /// Reports every byte of `[home, end)` (within this partition) in address order, as
    /// mapped extents and unmapped holes, from one consistent state of the entries.
    /// Calls `f` only with validated extents; when a writer races the read, the extents
    /// from the first not yet reported are read again. Calls `first` once with the whole
    /// entry of the first mapped extent reported and the sequence it was valid at (for
    /// node caches).
    ///
    /// The caller must hold an epoch guard.
    pub(crate) fn read(
        &self,
        home: u64,
        end: u64,
        f: &mut impl FnMut(Extent),
        first: &mut impl FnMut(Piece, u64),
    ) {
        let (mut at, stop) = (home - self.base, end - self.base);
        let mut batch = [Extent::default(); READ_BATCH];
        let mut first_reported = false;
        while at < stop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            // SAFETY: blocks are freed only after an epoch; the caller holds a guard.
            let words = unsafe { Block::words(self.block.load(Ordering::Acquire)) };
            let capacity = (words.len() - 1) / ENTRY_WORDS;
            let len = (self.len.load(Ordering::Relaxed) as usize).min(capacity);
            let mut i = first_ending_after(words, len, at);
            let mut n = 0;
            let mut pos = at;
            let mut whole = None;
            while n < READ_BATCH && pos < stop {
                let e = (i < len).then(|| Entry::load(words, i));
                batch[n] = match e {
                    Some(e) if e.off <= pos => {
                        i += 1;
                        if whole.is_none() {
                            whole = Some(Piece {
                                home: self.base + e.off,
                                len: e.len,
                                log: e.log,
                            });
                        }
                        let to = e.end().min(stop);
                        Extent {
                            home: self.base + pos,
                            len: to.saturating_sub(pos),
                            log: Some(e.log.wrapping_add(pos - e.off)),
                        }
                    }
                    Some(e) => Extent {
                        home: self.base + pos,
                        len: e.off.min(stop) - pos,
                        log: None,
                    },
                    None => Extent {
                        home: self.base + pos,
                        len: stop - pos,
                        log: None,
                    },
                };
                pos += batch[n].len.max(1);
                n += 1;
            }
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            if !first_reported && let Some(w) = whole {
                first(w, s1);
                first_reported = true;
            }
            for x in &batch[..n] {
                f(*x);
            }
            at = pos;
        }
    }

    /// Every entry as `(home, len, log)`, in order. The caller must hold an epoch guard.
    pub(crate) fn for_each(&self, f: &mut impl FnMut(u64, u64, u64)) {
        self.read(
            self.base,
            self.base + MAX_PARTITION_SIZE,
            &mut |x: Extent| {
                if let Some(log) = x.log {
                    f(x.home, x.len, log);
                }
            },
            &mut |_, _| {},
        );
    }

    /// Starts an update: waits for and takes the writers' lock (the odd sequence).
    pub(crate) fn writer(&self) -> ArrayWriter<'_> {
        loop {
            let s = self.seq.load(Ordering::Relaxed);
            if s & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // Entry stores must not be seen before the odd sequence.
                fence(Ordering::Release);
                return ArrayWriter { array: self };
            }
            std::hint::spin_loop();
        }
    }
}

/// The writer of one partition: entries change only through it.
pub(crate) struct ArrayWriter<'a> {
    array: &'a SortedArray,
}

impl Drop for ArrayWriter<'_> {
    fn drop(&mut self) {
        self.array.seq.fetch_add(1, Ordering::Release); // odd -> even: stable
    }
}

impl ArrayWriter<'_> {
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: only the writer replaces or frees the block, and we are the writer.
        unsafe { Block::words(self.array.block.load(Ordering::Relaxed)) }
    }

    /// Moves the entries into a block of `capacity` entries (at least as many as are in
    /// use).
    fn reallocate(&mut self, capacity: usize) {
        let len = self.array.len();
        let old = self.array.block.load(Ordering::Relaxed);
        let fresh = Block::alloc(capacity);
        // SAFETY: `fresh` was just made and is not shared yet.
        let new_words = unsafe { Block::words(fresh) };
        let old_words = self.words();
        for i in 0..len {
            Entry::load(old_words, i).store(new_words, i);
        }
        self.array.block.store(fresh, Ordering::Release);
        let guard = crossbeam_epoch::pin();
        let old = OldBlock(old);
        // SAFETY: the old block is unreachable now; readers that loaded it hold epoch
        // guards, so it is freed only after they are gone.
        unsafe {
            guard.defer_unchecked(move || {
                let old = old;
                Block::free(old.0)
            })
        };
    }

    /// Replaces the entries overlapping `[home, end)` by their parts outside it and, if
    /// given, `(home, end) -> log`. Reports each displaced `(log offset, bytes)`.
    fn replace(
        &mut self,
        home: u64,
        end: u64,
        new_log: Option<u64>,
        displaced: &mut impl FnMut(u64, u64),
    ) {
        let (s, e) = (home - self.array.base, end - self.array.base);
        let len = self.array.len();
        let words = self.words();
        let i = first_ending_after(words, len, s);
        let mut j = i;
        let mut fresh = [Entry {
            off: 0,
            len: 0,
            log: 0,
        }; 3];
        let mut n = 0;
        while j < len {
            let x = Entry::load(words, j);
            if x.off >= e {
                break;
            }
            let (lo, hi) = (x.off.max(s), x.end().min(e));
            displaced(x.log + (lo - x.off), hi - lo);
            if x.off < s {
                fresh[n] = Entry {
                    len: s - x.off,
                    ..x
                };
                n += 1;
            }
            if x.end() > e {
                if let Some(log) = new_log {
                    fresh[n] = Entry {
                        off: s,
                        len: e - s,
                        log,
                    };
                    n += 1;
                }
                fresh[n] = Entry {
                    off: e,
                    len: x.end() - e,
                    log: x.log + (e - x.off),
                };
                n += 1;
            }
            j += 1;
        }
        if let Some(log) = new_log
            && !fresh[..n].iter().any(|f| f.off == s)
        {
            // Not placed before a right remainder: it goes after any left remainder.
            fresh[n] = Entry {
                off: s,
                len: e - s,
                log,
            };
            n += 1;
        }
        let new_len = len - (j - i) + n;
        let capacity = (words.len() - 1) / ENTRY_WORDS;
        if new_len > capacity {
            self.reallocate(grown_capacity(new_len));
        }
        let words = self.words();
        // Shift the entries after the replaced ones, then write the new ones.
        if n > j - i {
            for k in (j..len).rev() {
                Entry::load(words, k).store(words, k + n - (j - i));
            }
        } else if n < j - i {
            for k in j..len {
                Entry::load(words, k).store(words, k + n - (j - i));
            }
        }
        for (k, x) in fresh[..n].iter().enumerate() {
            x.store(words, i + k);
        }
        self.array.len.store(new_len as u64, Ordering::Relaxed);
        if new_len < capacity / 4 && capacity > FIRST_CAPACITY {
            self.reallocate((2 * new_len).max(FIRST_CAPACITY));
        }
    }

    /// Maps `[home, home + len)` to `log`, reporting displaced bytes.
    pub(crate) fn insert(
        &mut self,
        home: u64,
        len: u64,
        log: u64,
        displaced: &mut impl FnMut(u64, u64),
    ) {
        if len > 0 {
            self.replace(home, home + len, Some(log), displaced);
        }
    }

    /// Unmaps `[home, end)`, reporting displaced bytes.
    pub(crate) fn clear(&mut self, home: u64, end: u64, displaced: &mut impl FnMut(u64, u64)) {
        if end > home {
            self.replace(home, end, None, displaced);
        }
    }
}

/// A block pointer handed to the epoch's deferred free.
struct OldBlock(*mut AtomicU64);
// SAFETY: the block is unreachable; the deferred closure is its only user.
unsafe impl Send for OldBlock {}

/// The capacity for `needed` entries: powers of two while small, then a quarter more,
/// so that a full partition wastes little.
fn grown_capacity(needed: usize) -> usize {
    if needed <= 32 {
        needed.next_power_of_two().max(FIRST_CAPACITY)
    } else {
        needed + needed / 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader racing a writer sees every byte mapped as before or after each update,
    /// never a torn entry, a hole, or a byte reported twice within one state.
    #[test]
    fn readers_never_see_a_torn_state() {
        let array = SortedArray::new(1 << 20);
        let base = 1u64 << 20;
        // State A: [0, 256) -> 10_000; state B: [0, 128) -> 20_000, [128, 256) -> 30_128.
        let a = |k: u64| 10_000 + k;
        let b = |k: u64| if k < 128 { 20_000 + k } else { 30_000 + k };
        array.writer().insert(base, 256, a(0), &mut |_, _| {});
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..20_000u64 {
                    let mut w = array.writer();
                    if round % 2 == 0 {
                        w.insert(base, 128, b(0), &mut |_, _| {});
                        w.insert(base + 128, 128, b(128), &mut |_, _| {});
                    } else {
                        w.insert(base, 256, a(0), &mut |_, _| {});
                    }
                }
                stop.store(true, Ordering::Relaxed);
            });
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) || reads < 100 {
                let _guard = crossbeam_epoch::pin();
                let mut seen = [None; 256];
                array.read(
                    base,
                    base + 256,
                    &mut |x: Extent| {
                        for i in 0..x.len {
                            seen[(x.home - base + i) as usize] = x.log.map(|l| l + i);
                        }
                    },
                    &mut |_, _| {},
                );
                for (k, v) in seen.iter().enumerate() {
                    let k = k as u64;
                    assert!(*v == Some(a(k)) || *v == Some(b(k)), "byte {k}: {v:?}");
                }
                reads += 1;
            }
        });
    }

    #[test]
    fn blocks_grow_and_shrink_with_their_entries() {
        let array = SortedArray::new(0);
        for i in 0..100u64 {
            array.writer().insert(i * 16, 8, 1000 + i, &mut |_, _| {});
        }
        assert_eq!(array.len(), 100);
        let grown = array.dram_bytes();
        assert!(grown >= 100 * 16, "{grown} bytes for 100 entries");
        assert!(grown <= 2 * 100 * 16 + 8, "{grown} bytes for 100 entries");
        let mut freed = 0;
        array.writer().clear(0, 1600, &mut |_, b| freed += b);
        assert_eq!((array.len(), freed), (0, 800));
        assert!(array.dram_bytes() <= 8 + 16 * FIRST_CAPACITY);
    }
}
