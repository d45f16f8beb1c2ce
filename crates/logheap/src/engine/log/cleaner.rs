//! The log cleaner ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §3.4,
//! §4.4): gives the space of stale log data back to the free chunks.
//!
//! A *victim* is a chunk of an update or initial-data log that no log appends to any
//! more (sealed), whose live bytes are below the threshold, and whose blocks are all
//! of a version at most the *cleaned-through version* `W`: every transaction up to `W`
//! had finished its commit when `W` was taken (no committing transaction is at or below
//! it). A victim
//! with no live byte is reclaimed without copying (fast cleaning). Otherwise a
//! quasi-transaction takes the STM stripe locks of the victim's entries, looks each
//! entry up again (its bytes are live where the mapping still points into the victim:
//! a transaction may have overwritten them since), copies the live pieces into the
//! cleaner's own update log — packed many to a block (one preamble for all, as the
//! paper's recalculated block preambles), each block of *the largest version of its
//! pieces' source blocks*, whose peer pointer is the block itself (a transaction of
//! one block, complete by itself), written and fenced one at a time — remaps them, and
//! releases
//! the locks with the versions they had (the data did not change, so no reader needs
//! to retry).
//!
//! A victim is then reclaimed: `W` is made durable in the superblock (if it was not
//! already), the chunk after it in its log is repointed to the chunk before it and the
//! victim's header is erased ([`ChunkPool::unlink`](super::chunks::ChunkPool::unlink):
//! every log's chain of chunks stays contiguous, so a header lost to damage is still
//! a broken chain), and the chunk returns to the free pool after an epoch grace period
//! (a reader that found the old place in the mapping may still be copying from it).
//!
//! Why recovery stays right is said in the recovery rules ([`super::recovery`]).
//! Allocation and deallocation logs are not cleaned chunk by chunk: their records fold
//! into allocation checkpoints ([`super::checkpoint`]), which a pass writes when they
//! pile up. Allocations' initial data is in the initial-data logs (or the update logs),
//! cleaned like any update.
//! A pass works on buffers kept from the last one ([`Work`]), so cleaning allocates
//! only while they grow (and crossbeam-epoch's deferred-function bags, for the grace
//! periods).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use super::LogEngine;
use super::chunks::{ChunkBook, TailChunk, payload_start};
use super::layout::{
    BLOCK_ALIGN, BlockScan, CHUNK_HEADER, ChunkHeader, DecodedEntry, END_MARK, ENTRY_HEADER,
    EntryRef, LogKind, PREAMBLE, block_digest, block_size, decode_block, encode_block, stored_crc,
};
use super::log_writer::LogSet;
use super::mapping::AddressMap;
use crate::stm::{StripeLocks, stripes};
use crate::sync::lock;

/// Data bytes below which the cleaner does not split a moved piece to fill the end of
/// a chunk (the next chunk takes it whole).
const MIN_SPLIT: usize = 64;
/// Victims taken by one cleaning pass at most.
const VICTIMS_PER_PASS: usize = 8;
/// Most background cleaner threads started.
const MAX_CLEANER_THREADS: usize = 64;
/// How often an idle background cleaner looks whether there is work without being
/// woken.
const IDLE_LOOK: Duration = Duration::from_millis(50);

/// How the cleaner runs (from [`Config`](crate::Config)'s `clean_threshold`,
/// `cleaner_threads` and `inline_cleaning`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CleanerSettings {
    /// Live fraction below which a chunk is cleaned.
    pub threshold: f64,
    /// Background cleaner threads.
    pub threads: usize,
    /// Committing threads clean inline.
    pub inline: bool,
    /// Commits between passes run whatever the free chunks (0: none).
    pub every: u64,
}

impl Default for CleanerSettings {
    fn default() -> Self {
        CleanerSettings {
            threshold: 0.2,
            threads: 0,
            inline: true,
            every: 0,
        }
    }
}

/// The cleaner's state: the passes' log sets (where moved data goes) and buffers, the
/// chunks passes are working on, and its figures.
#[derive(Debug)]
pub(crate) struct Cleaner {
    /// How it runs.
    pub settings: CleanerSettings,
    /// One per pass that may run at once (each background thread, and one for the
    /// committing threads): a pass holds the lock of one while it runs.
    works: Box<[Mutex<Work>]>,
    /// Per chunk: a pass is working on it (so two passes never take one victim).
    claimed: Box<[AtomicBool]>,
    /// Held while the durable cleaned-through version is raised (so it only grows).
    mark: Mutex<()>,
    /// Wakes the background threads.
    pub wakeup: Arc<Wakeup>,
    /// A background pass found nothing to reclaim since a committer last asked for
    /// chunks: waiting for the background cleaners is pointless.
    pub stalled: AtomicBool,
    /// Background passes running now.
    running: std::sync::atomic::AtomicUsize,
    /// Free chunks a committer waits for (the most any asked for since the background
    /// cleaners last had them ready; a commit may need chunks in several logs).
    pub wanted: AtomicU64,
    /// A compaction is running: it holds the committers' pass (so their inline passes
    /// find nothing to do) and reclaims chunks as it goes, so a committer that waits for
    /// a chunk has one coming.
    pub compacting: AtomicBool,
    /// Commits counted towards the next pass of [`CleanerSettings::every`].
    pub commits: AtomicU64,
    /// Chunks reclaimed.
    pub chunks_cleaned: AtomicU64,
    /// Allocation checkpoints written.
    pub checkpoints: AtomicU64,
    /// Chunks reclaimed without copying.
    pub chunks_fast_cleaned: AtomicU64,
    /// Live bytes moved.
    pub bytes_moved: AtomicU64,
    /// The cleaned-through version made durable so far.
    pub cleaned_through: AtomicU64,
}

impl Cleaner {
    /// A cleaner for a pool of `chunks` chunks whose durable cleaned-through version is
    /// `cleaned`.
    pub(crate) fn new(settings: CleanerSettings, chunks: u32, cleaned: u64) -> Cleaner {
        let passes = settings.threads.min(MAX_CLEANER_THREADS) + 1;
        Cleaner {
            settings,
            works: (0..passes).map(|_| Mutex::default()).collect(),
            claimed: (0..chunks).map(|_| AtomicBool::new(false)).collect(),
            mark: Mutex::new(()),
            wakeup: Arc::default(),
            stalled: AtomicBool::new(false),
            running: std::sync::atomic::AtomicUsize::new(0),
            wanted: AtomicU64::new(0),
            compacting: AtomicBool::new(false),
            commits: AtomicU64::new(0),
            chunks_cleaned: AtomicU64::new(0),
            chunks_fast_cleaned: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            bytes_moved: AtomicU64::new(0),
            cleaned_through: AtomicU64::new(cleaned),
        }
    }

    /// Whether any cleaning runs at all (inline or in the background).
    pub(crate) fn enabled(&self) -> bool {
        self.settings.inline || self.settings.threads > 0
    }
}

/// How committing threads wake the background cleaners, and how closing stops them.
#[derive(Debug, Default)]
pub(crate) struct Wakeup {
    /// Work was asked for since the threads last looked.
    pending: AtomicBool,
    /// The pool is closing.
    stop: AtomicBool,
    lock: Mutex<()>,
    cond: Condvar,
}

impl Wakeup {
    /// Asks the background cleaners to look for work (cheap when already asked).
    pub(crate) fn notify(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            let _held = lock(&self.lock);
            self.cond.notify_one();
        }
    }

    /// Waits until asked, or for `timeout`; `false` once the pool is closing.
    fn wait(&self, timeout: Duration) -> bool {
        let held = lock(&self.lock);
        if !self.pending.load(Ordering::Acquire) && !self.stopped() {
            let _woken = self
                .cond
                .wait_timeout(held, timeout)
                .unwrap_or_else(|p| p.into_inner());
        }
        self.pending.store(false, Ordering::Release);
        !self.stopped()
    }

    /// Whether the pool is closing.
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _held = lock(&self.lock);
        self.cond.notify_all();
    }
}

/// The background cleaner threads of one pool: started after it opens, stopped (and
/// joined) before it closes or is dropped.
#[derive(Debug)]
pub(crate) struct CleanerThreads {
    wakeup: Arc<Wakeup>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl CleanerThreads {
    /// Starts `engine`'s background cleaners (as many as its settings say). Each holds
    /// the engine only while it cleans.
    pub(crate) fn start(engine: &Arc<LogEngine>) -> CleanerThreads {
        let wakeup = engine.cleaner.wakeup.clone();
        let handles = (0..engine.cleaner.settings.threads.min(MAX_CLEANER_THREADS))
            .filter_map(|k| {
                let engine: Weak<LogEngine> = Arc::downgrade(engine);
                let wakeup = wakeup.clone();
                std::thread::Builder::new()
                    .name(format!("logheap-cleaner-{k}"))
                    .spawn(move || {
                        while wakeup.wait(IDLE_LOOK) {
                            let Some(engine) = engine.upgrade() else {
                                return;
                            };
                            engine.clean_in_background();
                        }
                    })
                    // A thread that cannot start leaves the cleaning to the others and
                    // to the committers.
                    .ok()
            })
            .collect();
        CleanerThreads { wakeup, handles }
    }
}

impl Drop for CleanerThreads {
    fn drop(&mut self) {
        self.wakeup.stop();
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

/// What one cleaning pass works with: the cleaner's log set, and buffers kept from one
/// pass to the next (so that cleaning allocates only while they grow to their working
/// sizes).
#[derive(Debug, Default)]
struct Work {
    /// The cleaner's log set (made on the first pass that moves data).
    set: Option<LogSet>,
    /// Victims of the pass: (live bytes with their entry headers, chunk).
    victims: Vec<(i64, u32)>,
    /// The victim's bytes.
    bytes: Vec<u8>,
    /// The victim's entries: (home, length, pool offset, version of their block).
    entries: Vec<(u64, u64, u64, u64)>,
    /// Entries of a decoded block.
    decoded: Vec<DecodedEntry>,
    /// Lock indices of the entries' stripes.
    indices: Vec<usize>,
    /// The lock words held.
    held: Vec<(usize, u64)>,
    /// Live pieces of the victim.
    pieces: Vec<LivePiece>,
    /// The pieces of the block being written.
    batch: Vec<LivePiece>,
    /// Moved pieces and their new places.
    placed: Vec<(LivePiece, u64)>,
    /// Chunks of the cleaner's log it has moved on from, sealed (so that passes may
    /// take them) only once what was moved into them is remapped: before, they look
    /// empty to the live-byte counts, and another pass would reclaim them.
    to_seal: Vec<u32>,
    /// The data of one block being written, and where each entry's starts in it.
    data: Vec<u8>,
    offsets: Vec<usize>,
}

/// A live piece found in a victim: `len` bytes for `home`, now at pool offset `from`.
#[derive(Debug, Clone, Copy)]
struct LivePiece {
    home: u64,
    len: u64,
    from: u64,
    /// The version of the block it was found in.
    version: u64,
}

/// What [`Pool::compact`](crate::Pool::compact) did: the log's chunks in use before and
/// after, what it reclaimed and what it copied; on the in-place engines, what their
/// heap's defragmentation punched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Compaction {
    /// Chunks in use (in any log, allocation checkpoints included) before.
    pub chunks_before: u64,
    /// Chunks in use after.
    pub chunks_after: u64,
    /// Chunks reclaimed (some of which the moved data then filled again).
    pub chunks_reclaimed: u64,
    /// Live bytes copied to new places.
    pub bytes_moved: u64,
    /// Chunks left as they were because a transaction held locks on their data or
    /// was still committing into them, or because no free chunk came to copy into.
    pub chunks_skipped: u64,
    /// Bytes per chunk.
    pub chunk_size: u64,
    /// The in-place engines, which keep no log of data: the free space their heap
    /// punched out of the pool's files instead
    /// ([`PersistentHeap::defragment`](crate::alloc::PersistentHeap::defragment)).
    /// `None` on the log engine, and when the file system cannot punch holes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub defragmentation: Option<crate::alloc::Defragmentation>,
}

/// How long [`LogEngine::compact`] waits for reclaimed chunks to come back when it has
/// nothing left to copy into.
const COMPACT_WAIT: Duration = Duration::from_secs(2);

/// The most data bytes a block of `entries` entries, `bytes` of which are taken, can
/// have for its last entry within `room` bytes.
fn data_room(room: usize, entries: usize, bytes: usize) -> usize {
    (room / BLOCK_ALIGN * BLOCK_ALIGN).saturating_sub(PREAMBLE + entries * ENTRY_HEADER + bytes)
}

impl LogEngine {
    /// Makes the durable cleaned-through version at least `needed` (the largest version
    /// in chunks about to be reclaimed), raising it to `w` (at most the version up to
    /// which every transaction had finished its commit). Passes run at once, each with
    /// its own `w`: the durable mark only grows.
    pub(super) fn raise_cleaned_through(&self, needed: u64, w: u64) {
        if needed > self.cleaner.cleaned_through.load(Ordering::Acquire) {
            let _mark = lock(&self.cleaner.mark);
            let durable = self.cleaner.cleaned_through.load(Ordering::Acquire);
            if needed > durable {
                let to = w.max(durable);
                self.superblock.write_cleaned(&self.media, to);
                self.cleaner.cleaned_through.store(to, Ordering::Release);
            }
        }
    }

    /// What a background cleaner thread does when woken: passes while free chunks are
    /// below twice the committers' low-water mark (or what a committer waits for) and
    /// a pass gains something (with the urgent threshold while fewer are left than a
    /// committer waits for).
    fn clean_in_background(&self) {
        loop {
            let wanted = self.cleaner.wanted.load(Ordering::Acquire).max(1);
            let available = self.chunks.available();
            if available >= wanted {
                // Ready for whoever asked (a later ask raises it again).
                let _ = self.cleaner.wanted.compare_exchange(
                    wanted,
                    0,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            if self.cleaner.wakeup.stopped() || available >= (2 * self.low_water()).max(wanted) {
                break;
            }
            let threshold = if available < wanted {
                super::URGENT_THRESHOLD.max(self.cleaner.settings.threshold)
            } else {
                self.cleaner.settings.threshold
            };
            self.cleaner.running.fetch_add(1, Ordering::AcqRel);
            let reclaimed = self.clean(threshold);
            let others = self.cleaner.running.fetch_sub(1, Ordering::AcqRel) - 1;
            // Reclaimed chunks come back after a grace period: move the epoch on.
            self.epoch.pin().flush();
            if reclaimed > 0 {
                self.cleaner.stalled.store(false, Ordering::Release);
            } else {
                // Stalled only when no other pass may still gain (this one may have
                // found the victims taken by another).
                if others == 0 {
                    self.cleaner.stalled.store(true, Ordering::Release);
                }
                break;
            }
        }
    }

    /// Runs one cleaning pass: writes an allocation checkpoint when one is due
    /// ([`checkpoint_if_due`](Self::checkpoint_if_due)), then takes up to
    /// [`VICTIMS_PER_PASS`] victims whose live bytes are below `threshold` (a fraction of
    /// a chunk's payload) and that no other pass is working on, and reclaims them.
    /// Returns the number of chunks reclaimed (the checkpoint's included); no victim is
    /// taken when as many passes as there are cleaners run already.
    pub(crate) fn clean(&self, threshold: f64) -> usize {
        let records = self.checkpoint_if_due();
        let Some(mut work) = self.cleaner.works.iter().find_map(|w| w.try_lock().ok()) else {
            return records;
        };
        let work = &mut *work;
        let w = self
            .stm
            .committed_through()
            .min(super::superblock::CLEANED_LIMIT);
        let payload = (self.geometry.size - CHUNK_HEADER as u64) as f64;
        let limit = (payload * threshold) as i64;
        let mut victims = std::mem::take(&mut work.victims);
        victims.clear();
        // Only formatted chunks can be sealed (a large pool has many more).
        for c in 0..self.chunks.formatted() {
            // Allocation and deallocation chunks leave through checkpoints.
            if !self.chunks.is_sealed(c)
                || self.chunks.holds_records(c)
                || self.cleaner.claimed[c as usize].load(Ordering::Relaxed)
            {
                continue;
            }
            let live = self.chunks.live_of(c);
            // A damaged chunk with live data is never a victim (its data is not
            // moved); one with none is reclaimed like any other. What moving its live
            // data costs counts the entry headers that go with it.
            if live <= limit
                && self.chunks.max_version_in(c) <= w
                && !(live > 0 && self.chunks.checks().is_damaged(c))
            {
                let cost = self.chunks.live_with_headers(c);
                if cost <= limit {
                    victims.push((cost, c));
                }
            }
        }
        victims.sort_unstable();
        victims.truncate(VICTIMS_PER_PASS);
        let mut reclaimed = 0;
        for &(_, victim) in &victims {
            // Another pass may have reclaimed it between the choice and the claim.
            let cleaned = self.claimed(victim, || {
                self.chunks.is_sealed(victim) && self.clean_victim(work, victim, w)
            });
            if cleaned == Some(true) {
                reclaimed += 1;
            }
        }
        work.victims = victims;
        reclaimed + records
    }

    /// Runs `clean` with chunk `victim` claimed (so no other pass takes it meanwhile);
    /// `None` when another pass has it claimed.
    fn claimed(&self, victim: u32, clean: impl FnOnce() -> bool) -> Option<bool> {
        let claim = &self.cleaner.claimed[victim as usize];
        claim
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        let cleaned = clean();
        claim.store(false, Ordering::Release);
        Some(cleaned)
    }

    /// Compacts the log ([`Pool::compact`](crate::Pool::compact)): writes an allocation
    /// checkpoint when any allocation or deallocation chunk is sealed (folding their
    /// records), then cleans every update chunk that is sealed when it starts, least
    /// live first, whatever its live share: each is copied at most once, and the
    /// chunks the copies fill are not taken again. Transactions may run meanwhile;
    /// a chunk whose data one of them has locked, or that holds a version not yet
    /// committed through, is left as it is (and counted).
    pub(crate) fn compact(&self) -> Compaction {
        let before = self.chunks.in_use();
        let moved = self.cleaner.bytes_moved.load(Ordering::Relaxed);
        let mut reclaimed = self.checkpoint_now() as u64;
        let mut targets: Vec<(i64, u32)> = (0..self.geometry.count)
            .filter(|&c| self.chunks.is_sealed(c) && !self.chunks.holds_records(c))
            .map(|c| (self.chunks.live_of(c), c))
            .collect();
        targets.sort_unstable();
        let mut skipped = 0;
        // The last pass slot: background threads take the first ones.
        let mut work = lock(&self.cleaner.works[self.cleaner.works.len() - 1]);
        self.cleaner.compacting.store(true, Ordering::Release);
        for (_, victim) in targets {
            let cleaned = self.claimed(victim, || {
                let start = std::time::Instant::now();
                loop {
                    let w = self
                        .stm
                        .committed_through()
                        .min(super::superblock::CLEANED_LIMIT);
                    // Reclaimed meanwhile by a background pass: nothing is left to do.
                    if !self.chunks.is_sealed(victim) {
                        return false;
                    }
                    if self.clean_victim(&mut work, victim, w) {
                        return true;
                    }
                    // Out of room: chunks reclaimed so far come back after a grace
                    // period.
                    if self.chunks.available() > 0 || start.elapsed() > COMPACT_WAIT {
                        return false;
                    }
                    self.epoch.pin().flush();
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            if cleaned == Some(true) {
                reclaimed += 1;
            } else if self.chunks.is_sealed(victim) {
                skipped += 1;
            }
        }
        self.cleaner.compacting.store(false, Ordering::Release);
        drop(work);
        // Let the reclaimed chunks pass their grace period (no reader of this thread
        // holds them), so that what is in use is what the log holds.
        self.epoch.pin().flush();
        Compaction {
            chunks_before: before,
            chunks_after: self.chunks.in_use(),
            chunks_reclaimed: reclaimed,
            bytes_moved: self.cleaner.bytes_moved.load(Ordering::Relaxed) - moved,
            chunks_skipped: skipped,
            chunk_size: self.geometry.size,
            defragmentation: None,
        }
    }

    /// The valid header of chunk `c`, if it has one.
    fn header_of(&self, c: u32) -> Option<ChunkHeader> {
        let mut head = [0u8; CHUNK_HEADER];
        self.media.read(self.geometry.offset(c) as usize, &mut head);
        ChunkHeader::decode(&head)
    }

    /// Moves the live data out of `victim` and reclaims it; `false` when it could not
    /// (a lock was busy, or the cleaner has no room) or it is no victim now: between
    /// its choice and its claim another pass may have reclaimed it, and a log taken it
    /// again, holding records or versions above `w`.
    fn clean_victim(&self, work: &mut Work, victim: u32, w: u64) -> bool {
        let Some(header) = self
            .header_of(victim)
            .filter(|h| h.kind.holds_data() && self.chunks.max_version_in(victim) <= w)
        else {
            return false;
        };
        let base = self.geometry.offset(victim);
        let fast = self.chunks.live_of(victim) == 0;
        // Live data is moved only out of a chunk found as the clean close left it
        // (after an open that did not read the log): a damaged one stays where it is.
        if !fast && !self.chunks.readable(victim) {
            return false;
        }
        if !fast {
            work.bytes.resize(self.geometry.size as usize, 0);
            self.media.read(base as usize, &mut work.bytes);
            work.entries.clear();
            let mut at = payload_start() as usize;
            work.decoded.clear();
            while let BlockScan::Block(b) = decode_block(
                &work.bytes,
                victim,
                header.generation,
                at,
                &mut work.decoded,
            ) {
                at = b.end as usize;
                work.entries.extend(
                    b.entries_in(&work.decoded)
                        .iter()
                        .filter(|e| !e.tombstone && e.size > 0)
                        .map(|e| (e.home, e.size as u64, base + e.data as u64, b.version)),
                );
            }
            work.indices.clear();
            for &(home, len, _, _) in &work.entries {
                for s in stripes(home, len) {
                    work.indices.push(self.stm.locks.index(s));
                }
            }
            work.indices.sort_unstable();
            work.indices.dedup();
            let owner = self.stm.new_owner();
            let buffer = std::mem::take(&mut work.held);
            let Ok(held) = StripeLocks::acquire(&self.stm.locks, &work.indices, owner, buffer)
            else {
                return false;
            };
            // Under the locks no transaction changes these ranges: what maps into the
            // victim now is live, and stays so until the locks are released.
            let ok = self.move_live(work);
            if ok {
                let chunks = &self.chunks;
                let geometry = &self.geometry;
                let mut displaced =
                    |log: u64, n: u64| chunks.add_live(geometry.chunk_of(log), -(n as i64));
                for &(p, to) in &work.placed {
                    self.mapping.insert(p.home, p.len, to, &mut displaced);
                    chunks.add_live(geometry.chunk_of(to), p.len as i64);
                    self.cleaner.bytes_moved.fetch_add(p.len, Ordering::Relaxed);
                }
            }
            work.held = held.restore(&self.stm.locks);
            for c in work.to_seal.drain(..) {
                self.chunks.seal(c);
            }
            if !ok {
                return false;
            }
        }
        // The victim holds nothing live. Blocks elsewhere may point to its blocks:
        // recovery takes them as committed if their version is at most the durable
        // cleaned-through version.
        self.raise_cleaned_through(self.chunks.max_version_in(victim), w);
        if !self.chunks.unlink(victim) {
            return false;
        }
        self.chunks.release(victim, &self.epoch.pin());
        self.cleaner.chunks_cleaned.fetch_add(1, Ordering::Relaxed);
        if fast {
            self.cleaner
                .chunks_fast_cleaned
                .fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Copies the live pieces of the victim's entries (`work.entries`, with the STM locks of their ranges held) into the cleaner's update
    /// log, durably, leaving each piece with its new place in `work.placed`; `false` when
    /// the cleaner has no room (then nothing written is mapped: the copies are harmless
    /// duplicates of what the victim holds). Each block is fenced before the next is
    /// written: a moved block is committed on its own (its version is at most `W`), so
    /// a torn one before a valid one in a chunk would read as damage.
    fn move_live(&self, work: &mut Work) -> bool {
        let Work {
            set,
            entries,
            pieces,
            batch,
            placed,
            data,
            offsets,
            to_seal,
            ..
        } = work;
        // The cleaner adopts a log set the committers left (after a reopen, one whose
        // logs go on from the last session) rather than making one per session: a set
        // nobody appends to would keep its tail chunks unsealed, never cleaned. (Its
        // other logs' tails stay as they are: a log's last chunk cannot be unlinked, so
        // sealing one would only make it a victim that is never reclaimed.)
        let set = set.get_or_insert_with(|| self.checkout_log_set());
        placed.clear();
        pieces.clear();
        for &(home, len, log, version) in entries.iter() {
            self.mapping.lookup(home, len, |x| {
                if x.log == Some(log + (x.home - home)) {
                    pieces.push(LivePiece {
                        home: x.home,
                        len: x.len,
                        from: log + (x.home - home),
                        version,
                    });
                }
            });
        }
        // Blocks of as many pieces as the room of the tail allows, each of the largest
        // version among its pieces. The piece that does not fit whole is split, its
        // head filling the chunk (a piece is a range of home bytes, which may be mapped
        // in parts), unless the room is less than `MIN_SPLIT`.
        let mut next = 0;
        while next < pieces.len() {
            let first = pieces[next].len as usize;
            let Some((tail, room)) = self.cleaner_tail(set, first.min(MIN_SPLIT), to_seal) else {
                return false;
            };
            batch.clear();
            let mut bytes = 0;
            while next < pieces.len() && batch.len() < super::layout::MAX_BLOCK_ENTRIES {
                let p = pieces[next];
                if block_size(batch.len() + 1, bytes + p.len as usize) <= room {
                    batch.push(p);
                    bytes += p.len as usize;
                    next += 1;
                    continue;
                }
                let fit = data_room(room, batch.len() + 1, bytes) as u64;
                if fit >= (MIN_SPLIT as u64).min(p.len) {
                    batch.push(LivePiece { len: fit, ..p });
                    pieces[next] = LivePiece {
                        home: p.home + fit,
                        len: p.len - fit,
                        from: p.from + fit,
                        version: p.version,
                    };
                }
                break;
            }
            if batch.is_empty() {
                return false; // cannot happen: the tail has room for `MIN_SPLIT` bytes
            }
            let now = &batch[..];
            let version = now.iter().map(|p| p.version).max().unwrap_or(0);
            data.clear();
            offsets.clear();
            for p in now {
                let at = data.len();
                offsets.push(at);
                data.resize(at + p.len as usize, 0);
                self.media.read(p.from as usize, &mut data[at..]);
            }
            let data = &data[..];
            let chunk_at = self.geometry.offset(tail.chunk);
            let block_at = chunk_at + tail.offset as u64;
            encode_block(
                &mut set.scratch,
                tail.chunk,
                tail.generation,
                version,
                block_at,
                now.iter().zip(offsets.iter()).map(|(p, &at)| EntryRef {
                    home: p.home,
                    tombstone: false,
                    data: &data[at..at + p.len as usize],
                }),
            );
            let block_len = set.scratch.len();
            let end = tail.offset as usize + block_len;
            if !tail.zero_rest && end + END_MARK <= self.geometry.size as usize {
                set.scratch.extend_from_slice(&[0u8; END_MARK]);
            }
            let digest = block_digest(tail.chunk, tail.offset, stored_crc(&set.scratch));
            self.media.write_nt(block_at as usize, &set.scratch);
            self.media.fence();
            let moved = now.iter().map(|p| p.len).sum();
            let book = ChunkBook::block(version, digest, end as u32, now.len() as u64, moved);
            self.chunks.record_book(tail.chunk, book);
            let mut to = block_at + PREAMBLE as u64;
            for p in now {
                to += ENTRY_HEADER as u64;
                placed.push((*p, to));
                to += p.len;
            }
            let Some(t) = set.tails[LogKind::Update.index()].current.as_mut() else {
                return false; // cannot happen: the cleaner's tail was just ensured
            };
            t.offset = end as u32;
        }
        true
    }

    /// The cleaner's update-log tail with room for a block of one entry of `len`
    /// bytes (taking a new chunk, whose header is written and made durable
    /// at once, when the current one is short: the old tail goes to `to_seal`); and its
    /// room in bytes.
    fn cleaner_tail(
        &self,
        set: &mut LogSet,
        len: usize,
        to_seal: &mut Vec<u32>,
    ) -> Option<(TailChunk, usize)> {
        let size = self.geometry.size as usize;
        let need = block_size(1, len);
        let tail = &mut set.tails[LogKind::Update.index()].current;
        if let Some(t) = tail.filter(|t| t.offset as usize + need <= size) {
            return Some((t, size - t.offset as usize));
        }
        let taken = self.chunks.take_for_cleaner()?;
        let header = ChunkHeader {
            kind: LogKind::Update,
            zeroed: taken.zero_payload,
            owner: set.id,
            generation: taken.generation,
            prev: tail.map(|t| t.chunk),
            seq: tail.map_or(0, |t| t.seq + 1),
        };
        // The header is made durable before the old tail is sealed (and may become a
        // victim, whose reclaim repoints this header).
        self.media
            .write_nt(self.geometry.offset(taken.chunk) as usize, &header.encode());
        self.media.fence();
        self.chunks.link(header.prev, taken.chunk, LogKind::Update);
        if let Some(old) = *tail {
            to_seal.push(old.chunk);
        }
        let t = TailChunk {
            chunk: taken.chunk,
            generation: taken.generation,
            seq: header.seq,
            offset: payload_start(),
            zero_rest: taken.zero_payload,
        };
        *tail = Some(t);
        Some((t, size - t.offset as usize))
    }
}
