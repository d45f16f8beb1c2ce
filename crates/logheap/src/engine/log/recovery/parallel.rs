//! Recovering with several threads, map-reduce style ("Log-structured Non-volatile Main
//! Memory", USENIX ATC 2017, §4.5), with exactly the result of sequential recovery: the
//! same scan and verdict, the same mapping, allocator and live bytes per chunk, the same
//! problems.
//!
//! A crew of threads works through the phases in lockstep ([`Lockstep`]). The opening
//! thread is one of them and leads: between phases it merges what the crew produced and
//! makes the decisions, and it does the parts that are sequential.
//!
//! 1. *Scan*: the crew reads batches of chunks ([`Batches`]); the leader puts them back in
//!    chunk order and judges the logs ([`rules`](super::rules), sequential: it is cheap)
//!    while the others start the next step.
//! 2. *Map* (over chunks): the committed blocks become two lists of steps in replay
//!    order — (version, phase, chunk, block), as the sequential replay sorts them — one of
//!    the allocation and free records, one of the data (frees, initial data, updates);
//!    each step points to its block's entries, copied compactly (home and end of each
//!    record; home, size and log address of each data entry). Each entry is checked on
//!    its own here: in the home space, records of 8 bytes, no tombstone in an update log.
//! 3. *Records* (thread `t` of `n` takes the 64 KiB home regions `r` with `r % n == t`):
//!    each thread replays, in order, every free and allocation record that touches one
//!    of its regions (a record spanning several regions goes to each of their threads)
//!    against its own set of allocations, and checks the initial data that does not lie
//!    inside the allocation record before it in its block (normally none does: a commit
//!    writes each object's record and then its image).
//! 4. *Data* (thread `t` of the `n - 1` besides the leader takes the mapping partitions
//!    `p` with `p % (n - 1) == t`, counted in units of at least 4 KiB): each thread
//!    replays, in order, the pieces of every free and data entry that fall in its
//!    partitions into the shared mapping, whose writers of different partitions do not
//!    wait for each other, counting live bytes per chunk in a vector of its own;
//!    meanwhile the leader rebuilds the allocator from the records' result (a hash map of
//!    every allocation: the longest sequential part). The vectors are added up at the
//!    end.
//!
//! Why it is exact: the operations on a byte of home space all go to one thread (for the
//! mapping: one partition's operations, in version order; a free is cut at partition
//! boundaries, as the mapping itself cuts it), and operations on different partitions
//! commute. For the records: the allocations a thread holds are the global ones that
//! touch its regions, and as long as no record has been refused anywhere, each check a
//! thread makes (a free matches an allocation, an allocation overlaps none, initial data
//! lies inside one) answers as the global check would. So the first record the
//! sequential replay would refuse is refused by some thread too. Whenever anything would
//! be refused or reported (the log is damaged, or holds a record too long for the pool),
//! nothing has been written to the mapping yet, and the sequential replay runs instead,
//! so that the problems are the same, in the same order.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, RwLock};

use super::held::{Held, REGION_SHIFT};
use super::replay::{self, Meaning, Phase, Replayed};
use super::rules::Verdict;
use super::scan::{Batches, Scan};
use crate::alloc::home::{AllocError, HomeAllocator};
use crate::engine::log::checkpoint::Checkpoint;
use crate::engine::log::chunks::ChunkGeometry;
use crate::engine::log::damage::Damage;
use crate::engine::log::layout::{HOME_LIMIT, LogKind};
use crate::engine::log::mapping::{AddressMap, Mapping};
use crate::media::Media;

/// log2 of the smallest unit of home space that threads divide the mapping by (the
/// mapping's partitions when those are larger).
const MIN_DATA_SHIFT: u32 = 12;
/// Most threads that recover together (more are taken as this many).
pub(crate) const MAX_THREADS: usize = 1024;

/// One block's place in the replay, ordered as the sequential replay orders them
/// (version, phase, chunk, block), and where its entries were copied (32 bytes: there
/// is one per block, and they are sorted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Step {
    version: u64,
    phase: Phase,
    /// Index in [`Scan::chunks`].
    chunk: u32,
    /// Index in the chunk's blocks.
    block: u32,
    /// The thread whose lists hold the entries, and their range there (a block has at
    /// most [`MAX_BLOCK_ENTRIES`](crate::engine::log::layout::MAX_BLOCK_ENTRIES)
    /// entries).
    part: u16,
    count: u16,
    first: u64,
}

/// What one map worker copied: records as (home, end); data entries as (home | size
/// << 47, log address).
#[derive(Debug, Default)]
struct Part {
    records: Vec<(u64, u64)>,
    data: Vec<(u64, u64)>,
}

/// The steps in replay order, and the entries they point to.
#[derive(Debug)]
struct Steps<'a> {
    /// The entries each thread of the map step copied, by thread.
    parts: &'a [Part],
    /// The steps of the records, in replay order: the slices one after the other.
    records: Vec<Vec<Step>>,
    /// The steps of the data, in replay order: the slices one after the other.
    data: Vec<Vec<Step>>,
}

impl Step {
    /// The replay order as one number: version, phase, chunk, block (a chunk holds fewer
    /// than 2^30 blocks: a block takes at least 16 bytes, a chunk at most 64 MiB).
    fn key(&self) -> u128 {
        debug_assert!(self.block < 1 << 30);
        (self.version as u128) << 64
            | (self.phase as u128) << 62
            | (self.chunk as u128) << 30
            | self.block as u128
    }
}

impl Steps<'_> {
    /// The steps of the records, in replay order.
    fn records(&self) -> impl Iterator<Item = &Step> {
        self.records.iter().flatten()
    }

    /// The steps of the data, in replay order.
    fn data(&self) -> impl Iterator<Item = &Step> {
        self.data.iter().flatten()
    }

    fn records_of(&self, s: &Step) -> &[(u64, u64)] {
        let first = s.first as usize;
        &self.parts[s.part as usize].records[first..first + s.count as usize]
    }

    fn data_of(&self, s: &Step) -> &[(u64, u64)] {
        let first = s.first as usize;
        &self.parts[s.part as usize].data[first..first + s.count as usize]
    }
}

/// Threads that work through phases together, each waiting at the end of a phase until
/// all have finished it. When one of them panics, the others stop waiting (and stop), so
/// that the panic reaches the opening thread instead of leaving it waiting forever.
#[derive(Debug)]
struct Lockstep {
    members: usize,
    /// Members arrived at the current meeting point, the number of meetings passed, and
    /// whether a member panicked.
    state: Mutex<(usize, u64, bool)>,
    all_there: Condvar,
}

impl Lockstep {
    fn new(members: usize) -> Lockstep {
        Lockstep {
            members,
            state: Mutex::new((0, 0, false)),
            all_there: Condvar::new(),
        }
    }

    /// Waits until every member has come here. False when a member panicked.
    fn meet(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let meeting = state.1;
        state.0 += 1;
        if state.0 == self.members {
            *state = (0, meeting + 1, state.2);
            self.all_there.notify_all();
        }
        while state.1 == meeting && !state.2 {
            state = self
                .all_there
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        !state.2
    }
}

/// Tells the other members of a [`Lockstep`] to stop when its thread panics.
struct StopOthersOnPanic<'a>(&'a Lockstep);

impl Drop for StopOthersOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut state = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
            state.2 = true;
            self.0.all_there.notify_all();
        }
    }
}

/// What the leader decided at the end of the crew's work.
enum Led {
    /// A crew member panicked (the scope passes the panic on).
    Broken,
    /// The log is not replayed (problems, and `replay_anyway` is false).
    Judged(Vec<Damage>),
    /// The log is replayed sequentially (the parallel replay would not be exact).
    Sequential(Vec<Damage>),
    /// The crew replayed the data; the allocator as rebuilt.
    Replayed(Vec<Damage>, Box<Result<HomeAllocator, AllocError>>),
}

/// Reads the first `formatted` chunks, judges them with `judge` (given the scan and its
/// own problems, taken out of it; it puts `checkpoint` in the verdict) and, when that
/// finds nothing wrong or `replay_anyway`, replays every committed transaction into
/// `mapping` (empty on entry) from the allocation checkpoint `checkpoint` if any,
/// with `threads` threads in all (at least 2, at most [`MAX_THREADS`]; the calling
/// thread leads the others and works with them). The same result as reading, judging
/// and replaying sequentially.
pub(crate) fn recover(
    media: &Media,
    geometry: &ChunkGeometry,
    formatted: u32,
    mapping: &Mapping,
    (threads, checkpoint): (usize, Option<&Checkpoint>),
    judge: impl FnOnce(&Scan, Vec<Damage>) -> (Verdict, Vec<Damage>),
    replay_anyway: bool,
) -> (Scan, Verdict, Vec<Damage>, Option<Replayed>) {
    let threads = threads.clamp(2, MAX_THREADS);
    // Records at or below the checkpoint's version are in it: replay skips them and
    // starts from its allocations (as the sequential replay does).
    let start = Start {
        folded: checkpoint.map_or(0, |c| c.version),
        allocations: checkpoint.map_or(&[], |c| &c.allocations),
    };
    // The leader is the last of the threads; the others replay the data while it
    // rebuilds the allocator.
    let leader = threads - 1;
    let crew = Lockstep::new(threads);
    // What each phase hands to the next. The leader decides, between phases, whether the
    // crew goes on (`go`).
    let go = AtomicBool::new(false);
    let batches = Batches::new(geometry, formatted, threads);
    let scanned: OnceLock<Scan> = OnceLock::new();
    let verdict: OnceLock<Verdict> = OnceLock::new();
    let map = MapWork::default();
    // The entries copied by the map step, and its steps, by thread (dropped once sorted),
    // and how their versions are sliced.
    let parts: OnceLock<Vec<Part>> = OnceLock::new();
    let unsorted: RwLock<Vec<Unsorted>> = RwLock::new(Vec::new());
    let slices: OnceLock<Slices> = OnceLock::new();
    let sorted: Mutex<Vec<(usize, SortedSlice)>> = Mutex::new(Vec::new());
    let steps: OnceLock<Steps<'_>> = OnceLock::new();
    let held: Mutex<Vec<Vec<(u64, u64)>>> = Mutex::new(Vec::new());
    let refused = AtomicBool::new(false);
    let lives: Mutex<Vec<Vec<i64>>> = Mutex::new(Vec::new());
    let goes_on = |crew: &Lockstep| crew.meet() && go.load(Ordering::Relaxed);
    // The steps of thread `t`: mapping (its share of the chunks), sorting (its slice of
    // the versions), checking records (its regions).
    let map_mine = |scan: &Scan, t: usize| {
        let mine = map_part(media, geometry, scan, (t, threads, start.folded), &map);
        let mut parts = map.parts.lock().unwrap_or_else(|p| p.into_inner());
        parts.push((t, mine));
    };
    let sort_mine = |t: usize| {
        let slices = slices.get().expect("set before the crew goes on");
        let verdict = verdict.get().expect("judged before");
        let unsorted = unsorted.read().unwrap_or_else(|p| p.into_inner());
        let (records, data) = sort_slice(&unsorted, *slices, t, verdict);
        let mut sorted = sorted.lock().unwrap_or_else(|p| p.into_inner());
        sorted.push((t, (records, data)));
    };
    let check_mine = |scan: &Scan, steps: &Steps<'_>, t: usize| {
        let mine = check_records(media, geometry, scan, steps, (t, threads, start), &refused);
        held.lock().unwrap_or_else(|p| p.into_inner()).push(mine);
    };
    let member = |t: usize| {
        let _stop = StopOthersOnPanic(&crew);
        batches.take(media, geometry);
        if !crew.meet() || !goes_on(&crew) {
            return;
        }
        // Mapped while the leader judges (so uncommitted blocks too: their steps are left
        // out when sorted).
        let scan = scanned.get().expect("set before the crew goes on");
        map_mine(scan, t);
        if !crew.meet() || !goes_on(&crew) {
            return;
        }
        sort_mine(t);
        if !crew.meet() || !goes_on(&crew) {
            return;
        }
        let steps = steps.get().expect("set before the crew goes on");
        check_mine(scan, steps, t);
        if !crew.meet() || !goes_on(&crew) {
            return;
        }
        let live = replay_data(geometry, steps, mapping, (t, leader, start.folded));
        lives.lock().unwrap_or_else(|p| p.into_inner()).push(live);
    };
    let lead = || {
        let _stop = StopOthersOnPanic(&crew);
        // The crew decides nothing: whatever the leader stops at, it meets the crew there
        // (and the crew then stops too).
        let meet_and_stop = |led: Led| {
            go.store(false, Ordering::Relaxed);
            match crew.meet() {
                true => led,
                false => Led::Broken,
            }
        };
        batches.take(media, geometry);
        if !crew.meet() {
            return Led::Broken;
        }
        let mut scan = batches.merge();
        let scan_problems = std::mem::take(&mut scan.problems);
        let scan = scanned.get_or_init(|| scan);
        go.store(true, Ordering::Relaxed);
        if !crew.meet() {
            return Led::Broken;
        }
        // The crew maps the blocks while the leader judges them, then the leader maps
        // what is left.
        let (judged, problems) = judge(scan, scan_problems);
        verdict.get_or_init(|| judged);
        map_mine(scan, leader);
        if !crew.meet() {
            return Led::Broken;
        }
        if !replay_anyway && !problems.is_empty() {
            return meet_and_stop(Led::Judged(problems));
        }
        let Some(all) = map.take() else {
            return meet_and_stop(Led::Sequential(problems));
        };
        let (copied, steps_of): (Vec<Part>, Vec<Unsorted>) =
            all.into_iter().map(|(part, r, d)| (part, (r, d))).unzip();
        slices.get_or_init(|| Slices::of(&steps_of, threads));
        *unsorted.write().unwrap_or_else(|p| p.into_inner()) = steps_of;
        let parts = parts.get_or_init(|| copied);
        if !crew.meet() {
            return Led::Broken;
        }
        sort_mine(leader);
        if !crew.meet() {
            return Led::Broken;
        }
        *unsorted.write().unwrap_or_else(|p| p.into_inner()) = Vec::new();
        let mut sliced = std::mem::take(&mut *sorted.lock().unwrap_or_else(|p| p.into_inner()));
        sliced.sort_unstable_by_key(|&(k, _)| k);
        let (records, data) = sliced.into_iter().map(|(_, slice)| slice).unzip();
        let steps = steps.get_or_init(|| Steps {
            parts,
            records,
            data,
        });
        if !crew.meet() {
            return Led::Broken;
        }
        check_mine(scan, steps, leader);
        if !crew.meet() {
            return Led::Broken;
        }
        if refused.load(Ordering::Relaxed) {
            return meet_and_stop(Led::Sequential(problems));
        }
        // Nothing is refused: the others replay the data while the leader rebuilds the
        // allocator.
        if !crew.meet() {
            return Led::Broken;
        }
        let parts = std::mem::take(&mut *held.lock().unwrap_or_else(|p| p.into_inner()));
        let mut allocations: Vec<(u64, u64)> = parts.concat();
        // One sorted run per thread: the stable sort merges them (in the order the
        // sequential replay gives them, so that a problem is reported as it does).
        allocations.sort();
        let allocator = HomeAllocator::rebuild(allocations);
        Led::Replayed(problems, Box::new(allocator))
    };
    let led = std::thread::scope(|s| {
        for t in 0..leader {
            let member = &member;
            s.spawn(move || member(t));
        }
        lead()
    });
    let scan = scanned.into_inner().expect("scanned before the crew stops");
    let verdict = verdict.into_inner().expect("judged before the crew stops");
    let (problems, replayed) = match led {
        Led::Broken => unreachable!("the scope passes a crew member's panic on"),
        Led::Judged(problems) => (problems, None),
        Led::Sequential(mut problems) => {
            let r = sequential(media, geometry, &scan, &verdict, mapping, &mut problems);
            (problems, Some(r))
        }
        Led::Replayed(mut problems, allocator) => {
            let mut live = vec![0i64; geometry.count as usize];
            for mine in lives.into_inner().unwrap_or_else(|p| p.into_inner()) {
                for (l, m) in live.iter_mut().zip(mine) {
                    *l += m;
                }
            }
            let allocator = (*allocator).unwrap_or_else(|e| {
                problems.push(Damage::at(
                    geometry.start,
                    format!("the allocation records are inconsistent: {e:?}"),
                ));
                HomeAllocator::new()
            });
            (problems, Some(Replayed { allocator, live }))
        }
    };
    (scan, verdict, problems, replayed)
}

#[cfg(test)]
thread_local! {
    /// How many times this thread fell back to the sequential replay (for tests).
    pub(super) static FALLBACKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Where replay starts: records of versions up to `folded` are in an allocation
/// checkpoint, whose live allocations are `allocations` (none and 0 without one).
#[derive(Debug, Clone, Copy)]
struct Start<'a> {
    folded: u64,
    allocations: &'a [(u64, u64)],
}

/// The sequential replay, for a log that the parallel one would not replay exactly as
/// it does (nothing has been written to `mapping` yet).
fn sequential(
    media: &Media,
    geometry: &ChunkGeometry,
    scan: &Scan,
    verdict: &Verdict,
    mapping: &Mapping,
    problems: &mut Vec<Damage>,
) -> Replayed {
    #[cfg(test)]
    FALLBACKS.with(|f| f.set(f.get() + 1));
    replay::replay(media, geometry, scan, verdict, mapping, problems)
}

/// Whether `[s, s + size)` lies inside `record` (start, end).
fn covered(record: Option<(u64, u64)>, s: u64, size: u64) -> bool {
    record.is_some_and(|(start, end)| start <= s && s + size <= end)
}

/// What one thread of the map step produced: its copies of entries, and its steps of
/// the records and of the data.
type Mapped = (Part, Vec<Step>, Vec<Step>);

/// The steps of the records and of the data one thread of the map step produced.
type Unsorted = (Vec<Step>, Vec<Step>);

/// The map step, shared by the crew.
#[derive(Debug, Default)]
struct MapWork {
    /// The next chunk (index in [`Scan::chunks`]) to take.
    next: AtomicUsize,
    /// An entry is wrong on its own, or a record is too long for the pool.
    refuse: AtomicBool,
    /// What each thread produced, with the thread's number.
    parts: Mutex<Vec<(usize, Mapped)>>,
}

impl MapWork {
    /// What each thread produced, by thread; `None` when an entry is wrong on its own
    /// (the sequential replay then reports it) or a record is longer than the pool's log
    /// could hold (no allocation can be: the sequential replay then handles it).
    fn take(&self) -> Option<Vec<Mapped>> {
        if self.refuse.load(Ordering::Relaxed) {
            return None;
        }
        let mut parts = std::mem::take(&mut *self.parts.lock().unwrap_or_else(|p| p.into_inner()));
        // Steps name their part by the thread's number.
        parts.sort_unstable_by_key(|&(t, _)| t);
        Some(parts.into_iter().map(|(_, mapped)| mapped).collect())
    }
}

/// The versions of committed steps, cut into `slices` ranges of about the same size (a
/// clock that every commit ticks makes versions nearly dense): slice `k` is
/// `[first + span * k / slices, first + span * (k + 1) / slices)`.
#[derive(Debug, Clone, Copy)]
struct Slices {
    first: u64,
    span: u128,
    slices: usize,
}

impl Slices {
    fn of(unsorted: &[Unsorted], slices: usize) -> Slices {
        let versions = || {
            unsorted
                .iter()
                .flat_map(|(records, data)| records.iter().chain(data))
                .map(|s| s.version)
        };
        let first = versions().min().unwrap_or(0);
        let last = versions().max().unwrap_or(0);
        Slices {
            first,
            span: (last - first) as u128 + 1,
            slices,
        }
    }

    /// The versions of slice `k`, as `[start, end)` (`end` may be 2^64).
    fn range(&self, k: usize) -> (u128, u128) {
        let at = |k: usize| self.first as u128 + self.span * k as u128 / self.slices as u128;
        (at(k), at(k + 1))
    }
}

/// One slice of the versions' steps of the records and of the data, each in replay order.
type SortedSlice = (Vec<Step>, Vec<Step>);

/// Slice `k` of the steps of the records and of the data, sorted into replay order;
/// the steps of uncommitted transactions and of orphaned chunks left out.
fn sort_slice(unsorted: &[Unsorted], slices: Slices, k: usize, verdict: &Verdict) -> SortedSlice {
    let (start, end) = slices.range(k);
    let uncommitted = &verdict.uncommitted;
    let mine = |s: &&Step| {
        (start..end).contains(&(s.version as u128))
            && (uncommitted.is_empty() || !uncommitted.contains(&s.version))
            && verdict.replays_chunk(s.chunk as usize)
    };
    let mut records: Vec<Step> = unsorted
        .iter()
        .flat_map(|(records, _)| records)
        .filter(mine)
        .copied()
        .collect();
    let mut data: Vec<Step> = unsorted
        .iter()
        .flat_map(|(_, data)| data)
        .filter(mine)
        .copied()
        .collect();
    sort_steps(&mut records);
    sort_steps(&mut data);
    (records, data)
}

/// Sorts steps into replay order. A clock that every commit ticks makes versions nearly
/// as many as the transactions, and a transaction has few steps: a radix sort by
/// version (11 bits at a time) and then a sort of each transaction's steps take a few
/// passes where a comparison sort takes twenty. Versions spread far apart (in a hostile
/// log) are sorted by comparison.
fn sort_steps(steps: &mut Vec<Step>) {
    const DIGIT: u32 = 11;
    let (Some(low), Some(high)) = (
        steps.iter().map(|s| s.version).min(),
        steps.iter().map(|s| s.version).max(),
    ) else {
        return;
    };
    let range = high - low;
    if steps.len() < 1024 || range / 16 > steps.len() as u64 {
        steps.sort_unstable_by_key(Step::key);
        return;
    }
    let bits = u64::BITS - range.leading_zeros();
    let mut from = std::mem::take(steps);
    let mut to = from.clone();
    for shift in (0..bits).step_by(DIGIT as usize) {
        let digit = |s: &Step| ((s.version - low) >> shift) as usize & ((1 << DIGIT) - 1);
        // Where each digit's steps start (stable: in the order they come).
        let mut start = vec![0usize; (1 << DIGIT) + 1];
        for s in &from {
            start[digit(s) + 1] += 1;
        }
        for d in 1..start.len() {
            start[d] += start[d - 1];
        }
        for s in &from {
            let at = &mut start[digit(s)];
            to[*at] = *s;
            *at += 1;
        }
        std::mem::swap(&mut from, &mut to);
    }
    for transaction in from.chunk_by_mut(|a, b| a.version == b.version) {
        if transaction.len() > 1 {
            transaction.sort_unstable_by_key(Step::key);
        }
    }
    *steps = from;
}

/// The map step of thread `t` of `threads`: takes batches of chunks from `work` until
/// none is left (or an entry is wrong on its own).
fn map_part(
    media: &Media,
    geometry: &ChunkGeometry,
    scan: &Scan,
    (t, threads, folded): (usize, usize, u64),
    work: &MapWork,
) -> Mapped {
    let mut mapped: Mapped = Default::default();
    let batch = (scan.chunks.len() / (threads * 8)).clamp(1, 64);
    loop {
        let first = work.next.fetch_add(batch, Ordering::Relaxed);
        if first >= scan.chunks.len() || work.refuse.load(Ordering::Relaxed) {
            break;
        }
        for ci in first..(first + batch).min(scan.chunks.len()) {
            if map_chunk(media, geometry, scan, (ci, t, folded), &mut mapped).is_none() {
                work.refuse.store(true, Ordering::Relaxed);
                return mapped;
            }
        }
    }
    mapped
}

/// Maps the blocks of chunk `ci` into `mapped` (by thread `t`); `None` when an entry is
/// wrong on its own or a record is longer than the pool's log could hold. Records up
/// to version `folded` are in the allocation checkpoint, not replayed: initial data of
/// those versions is checked against the allocations, not against its block's records.
fn map_chunk(
    media: &Media,
    geometry: &ChunkGeometry,
    scan: &Scan,
    (ci, t, folded): (usize, usize, u64),
    (part, records, data): &mut Mapped,
) -> Option<()> {
    let longest = geometry.count as u64 * geometry.size;
    let ch = &scan.chunks[ci];
    let kind = ch.header.kind;
    let base = geometry.offset(ch.index);
    for (bi, b) in ch.blocks.iter().enumerate() {
        let (first_record, first_data) = (part.records.len(), part.data.len());
        // The allocation record before each entry, as (start, end).
        let mut record: Option<(u64, u64)> = None;
        let mut uncovered = false;
        for e in ch.entries_of(b) {
            let size = e.size as u64;
            match replay::check_entry(media, base, kind, e).ok()? {
                Meaning::Free { len } | Meaning::Allocation { len } => {
                    // A free of what was never allocated is damage the sequential replay
                    // reports; so is a record longer than the log could hold.
                    let end = e.home.checked_add(len).filter(|&end| end <= HOME_LIMIT)?;
                    if len == 0 || len > longest {
                        return None;
                    }
                    record = Some((e.home, end));
                    part.records.push((e.home, end));
                }
                Meaning::Data => {
                    uncovered |= kind == LogKind::Alloc
                        && (b.version <= folded || !covered(record, e.home, size));
                    part.data.push((e.home | size << 47, base + e.data as u64));
                }
            }
        }
        let step = |phase: Phase, first: usize, count: usize| Step {
            version: b.version,
            phase,
            chunk: ci as u32,
            block: bi as u32,
            part: t as u16,
            count: count as u16,
            first: first as u64,
        };
        let records_here = part.records.len() - first_record;
        let data_here = part.data.len() - first_data;
        if records_here > 0 {
            let phase = match kind {
                LogKind::Dealloc => Phase::Frees,
                _ => Phase::Allocations,
            };
            records.push(step(phase, first_record, records_here));
            if phase == Phase::Frees {
                data.push(step(phase, first_record, records_here));
            }
        }
        if uncovered {
            records.push(step(Phase::InitialData, 0, 0));
        }
        if data_here > 0 {
            let phase = match kind {
                LogKind::Alloc => Phase::InitialData,
                _ => Phase::Updates,
            };
            data.push(step(phase, first_data, data_here));
        }
    }
    Some(())
}

/// Whether `[start, end)` touches a region of thread `t` of `threads`.
fn touches(start: u64, end: u64, t: usize, threads: usize) -> bool {
    let first = start >> REGION_SHIFT;
    let last = (end.max(start + 1) - 1) >> REGION_SHIFT;
    last - first + 1 >= threads as u64 || (first..=last).any(|r| r % threads as u64 == t as u64)
}

/// The records step of thread `t` of `threads`: replays the records of its regions
/// from `start`. Returns the allocations that start in its regions at the end, sorted,
/// as (start, length); sets `refused` (and stops) when the sequential replay would
/// refuse a record, and stops when another thread did.
fn check_records(
    media: &Media,
    geometry: &ChunkGeometry,
    scan: &Scan,
    steps: &Steps<'_>,
    (t, threads, start): (usize, usize, Start<'_>),
    refused: &AtomicBool,
) -> Vec<(u64, u64)> {
    let mut held = Held::new();
    for &(home, size) in start.allocations {
        // A checkpoint's allocations end inside home space (checked when it was read).
        if touches(home, home + size, t, threads) {
            held.insert(home, home + size);
        }
    }
    for step in steps.records() {
        if refused.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let in_checkpoint = step.version <= start.folded;
        let ok = match step.phase {
            Phase::Frees | Phase::Allocations if in_checkpoint => true,
            Phase::Frees => steps.records_of(step).iter().all(|&(home, end)| {
                !touches(home, end, t, threads) || held.remove(home) == Some(end)
            }),
            Phase::Allocations => steps.records_of(step).iter().all(|&(home, end)| {
                if !touches(home, end, t, threads) {
                    return true;
                }
                if held.overlaps(home, end) {
                    return false;
                }
                held.insert(home, end);
                true
            }),
            Phase::InitialData => {
                // Initial data that does not follow its allocation record (rare).
                let ch = &scan.chunks[step.chunk as usize];
                let base = geometry.offset(ch.index);
                let mut record = None;
                ch.entries_of(&ch.blocks[step.block as usize])
                    .iter()
                    .all(|e| {
                        let size = e.size as u64;
                        if e.tombstone {
                            // Checked in the map step; checked again, as the bytes are read
                            // again (the end is inside home space, so the sum cannot wrap).
                            let Ok(Meaning::Allocation { len }) =
                                replay::check_entry(media, base, LogKind::Alloc, e)
                            else {
                                return false;
                            };
                            record = Some((e.home, e.home + len));
                            return true;
                        }
                        let mine = (e.home >> REGION_SHIFT) % threads as u64 == t as u64;
                        // A folded record is not replayed: its data is checked against
                        // what is held, as the sequential replay checks it.
                        (!in_checkpoint && covered(record, e.home, size))
                            || !mine
                            || held.holds(e.home, e.home + size)
                    })
            }
            Phase::Updates => true,
        };
        if !ok {
            refused.store(true, Ordering::Relaxed);
            return Vec::new();
        }
    }
    // The allocations that start in this thread's regions (the others are another
    // thread's too), as (start, length).
    let mine = |&(s, _): &(u64, u64)| (s >> REGION_SHIFT) % threads as u64 == t as u64;
    held.into_sorted()
        .into_iter()
        .filter(mine)
        .map(|(s, e)| (s, e - s))
        .collect()
}

/// log2 of the units of home space the data step divides between threads: the
/// mapping's partitions, or [`MIN_DATA_SHIFT`] when those are smaller. A unit is always
/// whole partitions, so cutting an entry at unit boundaries cuts it where the mapping
/// would.
fn data_shift(mapping: &Mapping) -> u32 {
    mapping.partition_shift().max(MIN_DATA_SHIFT)
}

/// The data step of thread `t` of `threads`: the pieces of frees and data entries in
/// its units of home space, in replay order (frees up to version `folded` are in the
/// allocation checkpoint, not replayed). Returns the live bytes it added (and
/// displaced) per chunk.
fn replay_data(
    geometry: &ChunkGeometry,
    steps: &Steps<'_>,
    mapping: &Mapping,
    (t, threads, folded): (usize, usize, u64),
) -> Vec<i64> {
    let shift = data_shift(mapping);
    let (t, n) = (t as u64, threads as u64);
    let mut live = vec![0i64; geometry.count as usize];
    // The units of `[start, end)` that are this thread's, as (start, end) pieces.
    let mine = |start: u64, end: u64| {
        let (first, last) = (start >> shift, (end - 1) >> shift);
        let own = first + (t + n - first % n) % n;
        (own..=last).step_by(n as usize).map(move |u| {
            let s = (u << shift).max(start);
            let e = ((u + 1) << shift).min(end);
            (s, e)
        })
    };
    for step in steps.data() {
        let mut displaced = |log: u64, bytes: u64| {
            if let Some(l) = live.get_mut(geometry.chunk_of(log) as usize) {
                *l -= bytes as i64;
            }
        };
        if step.phase == Phase::Frees {
            if step.version <= folded {
                continue;
            }
            for &(home, end) in steps.records_of(step) {
                for (s, e) in mine(home, end) {
                    mapping.remove(s, e - s, &mut displaced);
                }
            }
            continue;
        }
        let mut added = 0i64;
        for &(packed, log) in steps.data_of(step) {
            let home = packed & (HOME_LIMIT - 1);
            let end = home + (packed >> 47);
            if end == home {
                continue;
            }
            if home >> shift == (end - 1) >> shift {
                if (home >> shift) % n == t {
                    mapping.insert(home, end - home, log, &mut displaced);
                    added += (end - home) as i64;
                }
            } else {
                for (s, e) in mine(home, end) {
                    mapping.insert(s, e - s, log + (s - home), &mut displaced);
                    added += (e - s) as i64;
                }
            }
        }
        if added != 0 {
            let chunk = geometry.chunk_of(steps.data_of(step)[0].1) as usize;
            live[chunk] += added;
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_member_stops_the_others_and_the_panic_reaches_the_caller() {
        // On a thread of its own, watched: a crew that fails to stop hangs, and the
        // watchdog turns that into a failure.
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let crew = Lockstep::new(4);
            let outcome = std::panic::catch_unwind(|| {
                std::thread::scope(|s| {
                    for t in 0..3 {
                        let crew = &crew;
                        s.spawn(move || {
                            let _stop = StopOthersOnPanic(crew);
                            assert!(crew.meet());
                            if t == 1 {
                                panic!("member 1 fails between two meetings");
                            }
                            assert!(!crew.meet(), "a meeting without member 1 cannot happen");
                        });
                    }
                    let _stop = StopOthersOnPanic(&crew);
                    assert!(crew.meet());
                    assert!(!crew.meet(), "a meeting without member 1 cannot happen");
                })
            });
            let _ = done.send(outcome.is_err());
        });
        let reached = finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the crew did not stop after a member panicked");
        assert!(reached, "the member's panic reaches the caller");
    }

    #[test]
    fn steps_sort_into_replay_order_by_radix_and_by_comparison() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let phases = [
            Phase::Frees,
            Phase::Allocations,
            Phase::InitialData,
            Phase::Updates,
        ];
        // Dense versions (radix), versions far apart (comparison), and few steps.
        for (n, spread) in [(50_000, 1), (50_000, 3), (20_000, 1 << 40), (500, 1)] {
            let mut steps: Vec<Step> = (0..n)
                .map(|i| Step {
                    version: 1000 + rng.random_range(0..n as u64 / 3 + 1) * spread,
                    phase: phases[rng.random_range(0..4)],
                    chunk: rng.random_range(0..50),
                    block: i as u32, // unique
                    part: 0,
                    count: 0,
                    first: i as u64,
                })
                .collect();
            let mut expected = steps.clone();
            expected.sort_unstable();
            sort_steps(&mut steps);
            assert!(steps == expected, "{n} steps, spread {spread}");
        }
    }

    #[test]
    fn meetings_follow_each_other() {
        let crew = Lockstep::new(3);
        let count = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for round in 0..100 {
                        count.fetch_add(1, Ordering::Relaxed);
                        assert!(crew.meet());
                        assert!(count.load(Ordering::Relaxed) >= 2 * (round + 1));
                        assert!(crew.meet());
                    }
                });
            }
            for round in 0..100 {
                assert!(crew.meet());
                assert_eq!(count.load(Ordering::Relaxed), 2 * (round + 1));
                assert!(crew.meet());
            }
        });
    }
}
