//! One partition's mapping as a sorted array of packed entries: the compact partition
//! index of the two-layer mapping.
//!
//! The paper ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §3.2) keeps a
//! skip list per partition. A 4 KiB partition holds a few dozen objects, and there a skip
//! list's nodes (pointers for every level, one heap block each) cost more DRAM than the
//! data they map and a chain of cache misses per lookup. This index keeps the same
//! semantics (non-overlapping byte ranges of any offset and length, each mapped to a log
//! offset) in one array of entries sorted by home, each made of
//!
//! - a **key**: the range's offset within the partition and its length. Partitions of up
//!   to 64 KiB (the default is 4 KiB) use 4-byte keys ([`Narrow`]: offset in the low 16
//!   bits, length − 1 in the high 16); larger ones (up to 2^30 bytes) 8-byte keys
//!   ([`Wide`]: offset in the low 32 bits, length in the high 32). Both are lossless;
//! - the full 64-bit **log offset** of the range's first byte.
//!
//! So an entry costs 12 bytes (16 with wide keys). Keys and log offsets are kept in two
//! separate arrays of one heap block (structure of arrays), so the binary search of a
//! lookup reads only keys: 16 per cache line.
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
//! **Memory**: a partition is two words (the sequence and the block pointer; its base
//! address is passed in by the mapping, which knows it from the partition number). The
//! entries live in one heap block, `[capacity | len << 32, keys..., log offsets...]`,
//! made on the first insert (an empty partition holds none) and replaced by a larger (or
//! smaller) one when it fills (or mostly empties); the old block is freed after a grace
//! period of the pool's epoch ([`PoolEpoch`]), so a reader still holding it (within its
//! guard) stays safe.
//! Growth is by an eighth plus two entries, not by doubling: partitions fill one object
//! at a time and then stay put, so a doubling policy would leave a quarter of every
//! block empty on average. A block shrinks when less than half of it is in use, to the
//! same margin, so alternating inserts and removals never reallocate. Steady-state
//! updates allocate nothing. [`ArrayWriter::load`] builds a block at its exact final
//! size (for loading a snapshot).

use std::alloc::Layout;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::seqlock::SeqLock;

use crossbeam_epoch::Guard;

use super::super::epoch::PoolEpoch;
use super::{Extent, MAX_PARTITION_SIZE, Piece};

/// Extents a reader validates at once (kept on its stack).
const READ_BATCH: usize = 8;

/// How an entry's home range (offset in the partition, length) is packed into a key.
pub(crate) trait Key: Send + Sync + 'static {
    /// Bytes of one key.
    const BYTES: usize;
    /// The largest partition size whose ranges every key can hold.
    const MAX_PARTITION: u64;
    /// The `(offset, length)` in the key (a relaxed load).
    fn get(&self) -> (u64, u64);
    /// Stores `(offset, length)` (relaxed). `length` is at least 1 and `offset + length`
    /// at most [`Key::MAX_PARTITION`].
    fn set(&self, off: u64, len: u64);
    /// Copies `from`'s packed key into `self` as it is (relaxed): moving entries along
    /// the array needs no unpacking.
    fn copy_from(&self, from: &Self);
}

/// 4-byte keys, for partitions of up to 64 KiB: offset (16 bits) | (length − 1) << 16.
pub(crate) type Narrow = AtomicU32;
/// 8-byte keys, for partitions of up to 2^30 bytes: offset (32 bits) | length << 32.
pub(crate) type Wide = AtomicU64;

impl Key for Narrow {
    const BYTES: usize = 4;
    const MAX_PARTITION: u64 = 1 << 16;

    #[inline]
    fn get(&self) -> (u64, u64) {
        let w = self.load(Ordering::Relaxed) as u64;
        (w & 0xFFFF, (w >> 16) + 1)
    }

    #[inline]
    fn set(&self, off: u64, len: u64) {
        debug_assert!(len >= 1 && off + len <= Self::MAX_PARTITION);
        self.store((off | (len - 1) << 16) as u32, Ordering::Relaxed);
    }

    #[inline]
    fn copy_from(&self, from: &Self) {
        self.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl Key for Wide {
    const BYTES: usize = 8;
    const MAX_PARTITION: u64 = MAX_PARTITION_SIZE;

    #[inline]
    fn get(&self) -> (u64, u64) {
        let w = self.load(Ordering::Relaxed);
        (w & 0xFFFF_FFFF, w >> 32)
    }

    #[inline]
    fn set(&self, off: u64, len: u64) {
        debug_assert!(off + len <= Self::MAX_PARTITION);
        self.store(off | len << 32, Ordering::Relaxed);
    }

    #[inline]
    fn copy_from(&self, from: &Self) {
        self.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// A packed entry, unpacked: `len` bytes at partition offset `off` live at `log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Offset of the range's first byte in the partition.
    pub off: u64,
    /// Length of the range (at least 1).
    pub len: u64,
    /// Log offset of the range's first byte.
    pub log: u64,
}

impl Entry {
    fn end(&self) -> u64 {
        self.off + self.len
    }
}

/// The header word of an empty array (no block): capacity 0, length 0. Never written.
static NO_BLOCK: AtomicU64 = AtomicU64::new(0);

/// A view of an entry block: its header word (`capacity | len << 32`), keys and log
/// offsets.
struct Block<'a, K> {
    header: &'a AtomicU64,
    keys: &'a [K],
    logs: &'a [AtomicU64],
}

/// Byte offset of the log offsets in a block of `capacity` entries, and the block's
/// layout.
fn block_layout<K: Key>(capacity: usize) -> (usize, Layout) {
    let logs_at = 8 + (capacity * K::BYTES).next_multiple_of(8);
    let bytes = logs_at + 8 * capacity;
    // Capacities are at most the partition size (2^30), so this never fails.
    let layout = Layout::from_size_align(bytes, 8).unwrap_or_else(|_| unreachable_layout());
    (logs_at, layout)
}

#[cold]
fn unreachable_layout() -> ! {
    unreachable!("an entry block of at most 2^30 entries has a valid layout")
}

impl<'a, K: Key> Block<'a, K> {
    /// A zeroed block for `capacity` (at least 1) entries, holding none.
    fn alloc(capacity: usize) -> *mut AtomicU64 {
        debug_assert!(capacity >= 1 && capacity as u64 <= MAX_PARTITION_SIZE);
        let (_, layout) = block_layout::<K>(capacity);
        // SAFETY: the layout has a non-zero size (at least the header word).
        let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut AtomicU64;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `p` is a fresh, 8-aligned, zeroed allocation (a valid AtomicU64).
        unsafe { &*p }.store(capacity as u64, Ordering::Relaxed);
        p
    }

    /// The block at `p` (the empty block when `p` is null).
    ///
    /// # Safety
    /// `p` must be null or come from [`Block::alloc`] with the same `K`, and not be freed
    /// for `'a`.
    unsafe fn at(p: *const AtomicU64) -> Block<'a, K> {
        if p.is_null() {
            return Block {
                header: &NO_BLOCK,
                keys: &[],
                logs: &[],
            };
        }
        // SAFETY: the header's capacity is the one the block was made with and never
        // changes, so the slices cover exactly the allocation's keys and log offsets
        // (laid out by `block_layout`, suitably aligned: keys at byte 8, log offsets at a
        // multiple of 8). The bytes were zeroed, a valid value for every atomic, and are
        // only ever accessed as these atomics. The caller keeps the block alive.
        unsafe {
            let header = &*p;
            let capacity = (header.load(Ordering::Relaxed) & 0xFFFF_FFFF) as usize;
            let (logs_at, _) = block_layout::<K>(capacity);
            let bytes = p as *const u8;
            Block {
                header,
                keys: std::slice::from_raw_parts(bytes.add(8) as *const K, capacity),
                logs: std::slice::from_raw_parts(bytes.add(logs_at) as *const AtomicU64, capacity),
            }
        }
    }

    /// Frees the block at `p` (nothing when null).
    ///
    /// # Safety
    /// `p` must be null or come from [`Block::alloc`] with the same `K`, and nothing may
    /// use it afterwards.
    unsafe fn free(p: *mut AtomicU64) {
        if p.is_null() {
            return;
        }
        // SAFETY: the caller hands over a live block; its layout follows from its
        // capacity, exactly as `alloc` made it.
        unsafe {
            let capacity = ((*p).load(Ordering::Relaxed) & 0xFFFF_FFFF) as usize;
            std::alloc::dealloc(p as *mut u8, block_layout::<K>(capacity).1);
        }
    }

    fn capacity(&self) -> usize {
        self.keys.len()
    }

    /// Entries in use (clamped to the capacity: a racing reader may read any value).
    fn len(&self) -> usize {
        ((self.header.load(Ordering::Relaxed) >> 32) as usize).min(self.capacity())
    }

    fn set_len(&self, len: usize) {
        self.header.store(
            self.capacity() as u64 | (len as u64) << 32,
            Ordering::Relaxed,
        );
    }

    #[inline]
    fn entry(&self, i: usize) -> Entry {
        let (off, len) = self.keys[i].get();
        Entry {
            off,
            len,
            log: self.logs[i].load(Ordering::Relaxed),
        }
    }

    #[inline]
    fn set(&self, i: usize, e: Entry) {
        self.keys[i].set(e.off, e.len);
        self.logs[i].store(e.log, Ordering::Relaxed);
    }

    /// Moves entries `from` to `to` (indices `from.start..from.end`, each as it is
    /// packed) to start at index `to`, in the order that never overwrites an entry
    /// before it has moved. One pass over zipped slices: no bounds check per entry (the
    /// insert that splits an entry in a crowded partition shifts hundreds of them).
    fn shift(&self, from: std::ops::Range<usize>, to: usize) {
        let n = from.len();
        let (src_keys, dst_keys) = (&self.keys[from.clone()], &self.keys[to..to + n]);
        let (src_logs, dst_logs) = (&self.logs[from.clone()], &self.logs[to..to + n]);
        let pairs = src_keys
            .iter()
            .zip(dst_keys)
            .zip(src_logs.iter().zip(dst_logs));
        let step = |((sk, dk), (sl, dl)): ((&K, &K), (&AtomicU64, &AtomicU64))| {
            dk.copy_from(sk);
            dl.store(sl.load(Ordering::Relaxed), Ordering::Relaxed);
        };
        if to > from.start {
            pairs.rev().for_each(step);
        } else {
            pairs.for_each(step);
        }
    }

    /// Index of the first of the first `len` entries (sorted, non-overlapping) ending
    /// after `off`: a binary search over keys only.
    #[inline]
    fn first_ending_after(&self, len: usize, off: u64) -> usize {
        let keys = &self.keys[..len];
        keys.partition_point(|k| {
            let (o, l) = k.get();
            o + l <= off
        })
    }

    /// The bytes this block holds.
    fn bytes(&self) -> usize {
        if self.capacity() == 0 {
            0
        } else {
            block_layout::<K>(self.capacity()).1.size()
        }
    }
}

/// One partition's entries (see the module documentation), with keys of type `K`.
#[derive(Debug)]
pub(crate) struct SortedArray<K: Key> {
    /// Even while the entries are stable, odd while the writer changes them.
    seq: SeqLock,
    /// The entry block, or null while the partition has never held an entry.
    block: AtomicPtr<AtomicU64>,
    keys: PhantomData<K>,
}

// SAFETY: the block pointer is owned by the array and only freed through an epoch (or on
// drop, when no reader can exist); all shared fields are atomics.
unsafe impl<K: Key> Send for SortedArray<K> {}
// SAFETY: as above.
unsafe impl<K: Key> Sync for SortedArray<K> {}

impl<K: Key> Drop for SortedArray<K> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader or writer holds the block any more.
        unsafe { Block::<K>::free(*self.block.get_mut()) }
    }
}

impl<K: Key> SortedArray<K> {
    /// An empty index (it allocates nothing until its first insert).
    pub(crate) fn new() -> SortedArray<K> {
        SortedArray {
            seq: SeqLock::new(),
            block: AtomicPtr::new(std::ptr::null_mut()),
            keys: PhantomData,
        }
    }

    /// The sequence word, whose value is unchanged exactly as long as the entries are
    /// (for node caches).
    pub(crate) fn seq_word(&self) -> &crate::stm::atomic::AtomicU64 {
        self.seq.word()
    }

    /// The current block. The caller must hold a guard of the pool's epoch or be the
    /// writer, and not keep the view past either.
    fn block(&self) -> Block<'_, K> {
        // SAFETY: blocks are freed only after a grace period of the pool's epoch, or by
        // the writer after replacing them (see the caller's obligation).
        unsafe { Block::at(self.block.load(Ordering::Acquire)) }
    }

    /// Number of entries. `_guard`: one of the pool's epoch, held by the caller.
    pub(crate) fn len(&self, _guard: &Guard) -> usize {
        self.block().len()
    }

    /// DRAM held by the entry block. `_guard`: one of the pool's epoch, held by the
    /// caller.
    pub(crate) fn dram_bytes(&self, _guard: &Guard) -> usize {
        self.block().bytes()
    }

    /// Reports every byte of `[home, end)` (within this partition, whose first byte is
    /// at home address `base`) in address order, as mapped extents and unmapped holes,
    /// from one consistent state of the entries. Calls `f` only with validated extents;
    /// when a writer races the read, the extents from the first not yet reported are
    /// read again. Calls `first` once with the whole entry of the first mapped extent
    /// reported and the sequence it was valid at (for node caches).
    ///
    /// The caller must hold a guard of the pool's epoch.
    pub(crate) fn read(
        &self,
        base: u64,
        home: u64,
        end: u64,
        f: &mut impl FnMut(Extent),
        first: &mut impl FnMut(Piece, u64),
    ) {
        let (mut at, stop) = (home - base, end - base);
        let mut batch = [Extent::default(); READ_BATCH];
        let mut first_reported = false;
        while at < stop {
            let Some(s1) = self.seq.read_begin() else {
                std::hint::spin_loop();
                continue;
            };
            let block = self.block();
            let len = block.len();
            let mut i = block.first_ending_after(len, at);
            let mut n = 0;
            let mut pos = at;
            let mut whole = None;
            while n < READ_BATCH && pos < stop {
                let e = (i < len).then(|| block.entry(i));
                batch[n] = match e {
                    Some(e) if e.off <= pos => {
                        i += 1;
                        if whole.is_none() {
                            whole = Some(Piece {
                                home: base + e.off,
                                len: e.len,
                                log: e.log,
                            });
                        }
                        let to = e.end().min(stop);
                        Extent {
                            home: base + pos,
                            len: to.saturating_sub(pos),
                            log: Some(e.log.wrapping_add(pos - e.off)),
                        }
                    }
                    Some(e) => Extent {
                        home: base + pos,
                        len: e.off.min(stop) - pos,
                        log: None,
                    },
                    None => Extent {
                        home: base + pos,
                        len: stop - pos,
                        log: None,
                    },
                };
                pos += batch[n].len.max(1);
                n += 1;
            }
            if !self.seq.read_valid(s1) {
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

    /// Every entry as `(home, len, log)`, in order, for the partition at `base`. The
    /// caller must hold a guard of the pool's epoch.
    pub(crate) fn for_each(&self, base: u64, f: &mut impl FnMut(u64, u64, u64)) {
        self.read(
            base,
            base,
            base + K::MAX_PARTITION,
            &mut |x: Extent| {
                if let Some(log) = x.log {
                    f(x.home, x.len, log);
                }
            },
            &mut |_, _| {},
        );
    }

    /// Starts an update of the partition at `base`: waits for and takes the writers'
    /// lock (the odd sequence). Blocks it replaces are freed through `epoch`, the
    /// pool's.
    pub(crate) fn writer<'a>(&'a self, base: u64, epoch: &'a PoolEpoch) -> ArrayWriter<'a, K> {
        self.seq.write_lock();
        ArrayWriter {
            array: self,
            base,
            epoch,
        }
    }
}

/// The writer of one partition: entries change only through it.
pub(crate) struct ArrayWriter<'a, K: Key> {
    array: &'a SortedArray<K>,
    /// Home address of the partition's first byte.
    base: u64,
    /// The pool's epoch, through which replaced blocks are freed.
    epoch: &'a PoolEpoch,
}

impl<K: Key> Drop for ArrayWriter<'_, K> {
    fn drop(&mut self) {
        self.array.seq.write_unlock();
    }
}

impl<K: Key> ArrayWriter<'_, K> {
    fn block(&self) -> Block<'_, K> {
        // SAFETY: only the writer replaces or frees the block, and we are the writer.
        unsafe { Block::at(self.array.block.load(Ordering::Relaxed)) }
    }

    /// Publishes `fresh` (holding the entries) in place of the current block, which is
    /// freed after a grace period of the pool's epoch.
    fn publish(&mut self, fresh: *mut AtomicU64) {
        let old = self.array.block.load(Ordering::Relaxed);
        self.array.block.store(fresh, Ordering::Release);
        if old.is_null() {
            return;
        }
        let guard = self.epoch.pin();
        let old = OldBlock::<K>(old, PhantomData);
        // SAFETY: the old block is unreachable now; readers that loaded it hold guards of
        // the pool's epoch, so it is freed only after they are gone. The closure owns the
        // block alone, so it may run in any thread, or when the epoch's collector goes
        // after the mapping.
        unsafe {
            guard.defer_unchecked(move || {
                let old = old;
                Block::<K>::free(old.0)
            })
        };
    }

    /// Moves the entries into a block of `capacity` entries (at least as many as are in
    /// use, and at least 1).
    fn reallocate(&mut self, capacity: usize) {
        let old = self.block();
        let len = old.len();
        debug_assert!(len <= capacity);
        let fresh = Block::<K>::alloc(capacity);
        // SAFETY: `fresh` was just made and is not shared yet.
        let new = unsafe { Block::<K>::at(fresh) };
        // SAFETY: both ranges hold `len` entries of their blocks, which are distinct
        // allocations. Only this writer ever stores into the old block, and readers only
        // load from it, so reading it with plain loads races with no store; nobody else
        // can see the new block before `publish`.
        unsafe {
            std::ptr::copy_nonoverlapping(old.keys.as_ptr(), new.keys.as_ptr() as *mut K, len);
            std::ptr::copy_nonoverlapping(
                old.logs.as_ptr(),
                new.logs.as_ptr() as *mut AtomicU64,
                len,
            );
        }
        new.set_len(len);
        self.publish(fresh);
    }

    /// Fills the (empty) partition with `entries`, sorted and non-overlapping, in one
    /// block of exactly their number. Returns `false`, changing nothing, if the
    /// partition is not empty.
    pub(crate) fn load(&mut self, entries: &[Entry]) -> bool {
        if self.block().len() != 0 {
            return false;
        }
        if entries.is_empty() {
            return true;
        }
        let fresh = Block::<K>::alloc(entries.len());
        // SAFETY: `fresh` was just made and is not shared yet.
        let new = unsafe { Block::<K>::at(fresh) };
        for (i, e) in entries.iter().enumerate() {
            debug_assert!(i == 0 || entries[i - 1].end() <= e.off);
            new.set(i, *e);
        }
        new.set_len(entries.len());
        self.publish(fresh);
        true
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
        let (s, e) = (home - self.base, end - self.base);
        let block = self.block();
        let len = block.len();
        let i = block.first_ending_after(len, s);
        let mut j = i;
        let mut fresh = [Entry {
            off: 0,
            len: 0,
            log: 0,
        }; 3];
        let mut n = 0;
        while j < len {
            let x = block.entry(j);
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
        if n == 0 && j == i {
            return; // nothing mapped there, nothing to map
        }
        let new_len = len - (j - i) + n;
        if new_len > block.capacity() {
            self.reallocate(grown_capacity(new_len));
        }
        let block = self.block();
        // Shift the entries after the replaced ones, then write the new ones.
        if n != j - i {
            block.shift(j..len, i + n);
        }
        for (k, x) in fresh[..n].iter().enumerate() {
            block.set(i + k, *x);
        }
        block.set_len(new_len);
        if new_len < block.capacity() / 2 && grown_capacity(new_len) < block.capacity() {
            self.reallocate(grown_capacity(new_len));
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
struct OldBlock<K>(*mut AtomicU64, PhantomData<K>);
// SAFETY: the block is unreachable; the deferred closure is its only user.
unsafe impl<K> Send for OldBlock<K> {}

/// The capacity for `needed` entries, growing or shrinking: an eighth more, plus two (so
/// a full block wastes little, growth stays amortised, and after a shrink the next
/// insert has room).
fn grown_capacity(needed: usize) -> usize {
    needed + needed / 8 + 2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader racing a writer sees every byte mapped as before or after each update,
    /// never a torn entry, a hole, or a byte reported twice within one state.
    #[test]
    fn readers_never_see_a_torn_state() {
        let array = SortedArray::<Narrow>::new();
        let epoch = PoolEpoch::new();
        let base = 1u64 << 20;
        // State A: [0, 256) -> 10_000; state B: [0, 128) -> 20_000, [128, 256) -> 30_128.
        let a = |k: u64| 10_000 + k;
        let b = |k: u64| if k < 128 { 20_000 + k } else { 30_000 + k };
        array
            .writer(base, &epoch)
            .insert(base, 256, a(0), &mut |_, _| {});
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..20_000u64 {
                    let mut w = array.writer(base, &epoch);
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
                let _guard = epoch.pin();
                let mut seen = [None; 256];
                array.read(
                    base,
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

    fn entries<K: Key>(
        array: &SortedArray<K>,
        base: u64,
        epoch: &PoolEpoch,
    ) -> Vec<(u64, u64, u64)> {
        let _guard = epoch.pin();
        let mut out = Vec::new();
        array.for_each(base, &mut |h, l, g| out.push((h, l, g)));
        out
    }

    #[test]
    fn blocks_grow_and_shrink_with_their_entries() {
        let array = SortedArray::<Narrow>::new();
        let epoch = PoolEpoch::new();
        assert_eq!(
            (array.len(&epoch.pin()), array.dram_bytes(&epoch.pin())),
            (0, 0)
        );
        for i in 0..100u64 {
            array
                .writer(0, &epoch)
                .insert(i * 16, 8, 1000 + i, &mut |_, _| {});
        }
        assert_eq!(array.len(&epoch.pin()), 100);
        let grown = array.dram_bytes(&epoch.pin());
        assert!(grown >= 8 + 100 * 12, "{grown} bytes for 100 entries");
        assert!(grown <= 8 + 116 * 12, "{grown} bytes for 100 entries");
        let mut freed = 0;
        array
            .writer(0, &epoch)
            .clear(0, 1600, &mut |_, b| freed += b);
        assert_eq!((array.len(&epoch.pin()), freed), (0, 800));
        assert!(array.dram_bytes(&epoch.pin()) <= 8 + 8 + 2 * 12);
        // Alternating an insert and a removal at the shrunk size moves no block.
        let block = array.block.load(Ordering::Relaxed);
        for i in 0..10u64 {
            array.writer(0, &epoch).insert(64, 8, i, &mut |_, _| {});
            array.writer(0, &epoch).clear(64, 72, &mut |_, _| {});
        }
        assert_eq!(array.block.load(Ordering::Relaxed), block);
    }

    #[test]
    fn narrow_keys_hold_whole_64_kib_partitions() {
        let array = SortedArray::<Narrow>::new();
        let epoch = PoolEpoch::new();
        let base = 5 << 16;
        array
            .writer(base, &epoch)
            .insert(base, 1 << 16, u64::MAX - (1 << 16), &mut |_, _| {});
        assert_eq!(
            entries(&array, base, &epoch),
            [(base, 1 << 16, u64::MAX - (1 << 16))]
        );
        array
            .writer(base, &epoch)
            .insert(base + 0xFFFF, 1, 7, &mut |_, _| {});
        assert_eq!(
            entries(&array, base, &epoch),
            [(base, 0xFFFF, u64::MAX - (1 << 16)), (base + 0xFFFF, 1, 7)]
        );
    }

    #[test]
    fn wide_keys_hold_whole_2_30_partitions() {
        let array = SortedArray::<Wide>::new();
        let epoch = PoolEpoch::new();
        let base = 3 << 30;
        array
            .writer(base, &epoch)
            .insert(base, 1 << 30, 1 << 50, &mut |_, _| {});
        array
            .writer(base, &epoch)
            .insert(base + 10, 5, 99, &mut |_, _| {});
        assert_eq!(
            entries(&array, base, &epoch),
            [
                (base, 10, 1 << 50),
                (base + 10, 5, 99),
                (base + 15, (1 << 30) - 15, (1 << 50) + 15)
            ]
        );
    }

    #[test]
    fn load_builds_an_exact_block_and_refuses_a_full_partition() {
        let array = SortedArray::<Narrow>::new();
        let epoch = PoolEpoch::new();
        let list: Vec<Entry> = (0..22u64)
            .map(|i| Entry {
                off: i * 186,
                len: 152,
                log: 10_000 + i * 200,
            })
            .collect();
        assert!(array.writer(4096, &epoch).load(&list));
        assert_eq!(array.dram_bytes(&epoch.pin()), 8 + 22 * 4 + 22 * 8);
        let want: Vec<_> = list.iter().map(|e| (4096 + e.off, e.len, e.log)).collect();
        assert_eq!(entries(&array, 4096, &epoch), want);
        assert!(!array.writer(4096, &epoch).load(&list[..1]));
        assert_eq!(entries(&array, 4096, &epoch), want);
    }
}
