//! Crash-simulation media.
//!
//! The model is Vinter's (and the x86 persistence model's): stores to one 64-byte cache
//! line reach persistent memory in program order, whole aligned 8-byte words at a time;
//! a flush of a line marks every store made to it so far; a fence by a thread makes the
//! stores that thread flushed persistent. A crash therefore leaves every line at some
//! *prefix* of its pending (not yet persistent) stores.
//!
//! The simulator keeps the persisted image (the shadow) and, per line, the ordered pending
//! 8-byte stores. At every fence, before the fence takes effect, it offers a
//! [`CrashPoint`]: the set of images a crash at any moment since the previous fence could
//! leave. Because pending lists only grow between fences, every crash state since the
//! previous fence is a prefix choice at this one, so checking at fences covers them all.
//!
//! Images offered at a crash point: nothing pending persisted, everything persisted, and
//! when there are at most [`SimConfig::exhaustive_limit`] combinations, all of them;
//! otherwise one-line variations (one line at each prefix, the others at none or at all)
//! plus [`SimConfig::random_images`] seeded random choices. Images with equal contents are
//! offered once.
//!
//! Users drive it over their own code: create a [`Media::sim`](super::Media::sim), install
//! a hook with [`CrashSimulator::set_fence_hook`], run the code, and check in the hook
//! that every image recovers to an acceptable state.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::cpu::CACHE_LINE;

const WORD: usize = 8;

/// How many crash images the simulator offers at each fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConfig {
    /// Enumerate every combination of per-line prefixes when there are at most this many.
    pub exhaustive_limit: u64,
    /// Otherwise, offer each line at each of its prefixes with the others at none or all.
    pub line_variations: bool,
    /// Otherwise, also offer this many random combinations.
    pub random_images: usize,
    /// Upper bound on images offered at one fence (nothing and everything always count).
    pub max_images_per_fence: usize,
    /// Seed of the random choices, so a failing run can be replayed.
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            exhaustive_limit: 64,
            line_variations: true,
            random_images: 16,
            max_images_per_fence: 512,
            seed: 0,
        }
    }
}

/// One store waiting to become persistent.
#[derive(Debug, Clone, Copy)]
struct PendingWrite {
    /// Index of the 8-byte word within its line.
    word: u8,
    /// The word's whole value after the store.
    value: u64,
    /// Token of the thread that last flushed the line after this store, or 0.
    flushed_by: u64,
}

/// A callback run at every fence, before the fence takes effect.
pub type FenceHook = Box<dyn FnMut(&CrashPoint<'_>) + Send>;

/// A callback run by every thread that fences, as it arrives at the fence and before
/// anything else (outside the simulator's lock): a test can hold a thread there, between
/// its stores and their fence, while other threads run.
pub type FenceGate = std::sync::Arc<dyn Fn() + Send + Sync>;

/// A callback run by every thread that fences, as it arrives at the fence (before the
/// gate, outside the simulator's lock): when it returns false, the fence is dropped, as
/// if the code had left it out. A dropped fence persists nothing, offers no crash point
/// and is not counted by the simulator; the thread's flushed stores stay pending until
/// its next fence that is kept. Tests inject a missing fence with it, into any engine,
/// to show that the crash checks catch the defect.
pub type FenceFilter = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;

pub(crate) struct SimState {
    persisted: Vec<u8>,
    pending: BTreeMap<usize, Vec<PendingWrite>>,
    fences: u64,
    images_offered: u64,
    hook: Option<FenceHook>,
    rng: ChaCha8Rng,
    config: SimConfig,
}

/// The simulated persistence domain of a [`Media::sim`](super::Media::sim): the persisted
/// image, pending stores, and crash points.
pub struct CrashSimulator {
    /// The volatile view (what loads see); the media's base pointer points here.
    memory: Box<[AtomicU64]>,
    state: Mutex<SimState>,
    gate: Mutex<Option<FenceGate>>,
    filter: Mutex<Option<FenceFilter>>,
}

impl std::fmt::Debug for CrashSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrashSimulator")
            .field("len", &(self.memory.len() * WORD))
            .finish_non_exhaustive()
    }
}

impl CrashSimulator {
    /// A simulator whose memory and persisted image both start as `image` (padded to a
    /// whole number of cache lines with zeros).
    pub(crate) fn new(mut image: Vec<u8>, config: SimConfig) -> CrashSimulator {
        let len = image.len().div_ceil(CACHE_LINE) * CACHE_LINE;
        image.resize(len, 0);
        let memory: Box<[AtomicU64]> = image
            .chunks_exact(WORD)
            .map(|w| AtomicU64::new(u64::from_le_bytes(word_bytes(w))))
            .collect();
        CrashSimulator {
            memory,
            state: Mutex::new(SimState {
                persisted: image,
                pending: BTreeMap::new(),
                fences: 0,
                images_offered: 0,
                hook: None,
                rng: ChaCha8Rng::seed_from_u64(config.seed),
                config,
            }),
            gate: Mutex::new(None),
            filter: Mutex::new(None),
        }
    }

    /// Length of the simulated media in bytes.
    pub fn len(&self) -> usize {
        self.memory.len() * WORD
    }

    /// Whether the media is empty (never: media have at least one line).
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.memory.as_ptr() as *mut u8
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `store` (which writes `[offset, offset + len)` of the volatile view) and
    /// records the words it changed as pending, atomically with respect to other threads.
    pub(crate) fn store(&self, offset: usize, len: usize, flushed_by: u64, store: impl FnOnce()) {
        let mut st = self.lock();
        store();
        if len == 0 {
            return;
        }
        let first = offset / WORD;
        let last = (offset + len - 1) / WORD;
        for w in first..=last {
            let value = self.memory[w].load(Ordering::Relaxed);
            st.pending
                .entry(w * WORD / CACHE_LINE)
                .or_default()
                .push(PendingWrite {
                    word: (w % (CACHE_LINE / WORD)) as u8,
                    value,
                    flushed_by,
                });
        }
    }

    /// A store to memory that is non-volatile where it sits (001's on-chip log buffer):
    /// offers the crash point just before it to the hook (as a fence does), then runs
    /// `store` and makes the lines it touched persistent at once, their earlier pending
    /// stores first.
    pub(crate) fn store_persistent(&self, offset: usize, len: usize, store: impl FnOnce()) {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.offer_crash_point();
        store();
        if len == 0 {
            return;
        }
        let lines = offset / CACHE_LINE..=(offset + len - 1) / CACHE_LINE;
        for line in lines.clone() {
            if let Some(writes) = st.pending.remove(&line) {
                for w in writes {
                    let at = line * CACHE_LINE + w.word as usize * WORD;
                    st.persisted[at..at + WORD].copy_from_slice(&w.value.to_le_bytes());
                }
            }
        }
        let (start, end) = (offset / WORD * WORD, (offset + len).next_multiple_of(WORD));
        for at in (start..end).step_by(WORD) {
            let value = self.memory[at / WORD].load(Ordering::Relaxed);
            st.persisted[at..at + WORD].copy_from_slice(&value.to_le_bytes());
        }
    }

    /// Zeroes `[offset, offset + len)` (whole lines) in memory and in the persisted image,
    /// dropping the stores pending there: a punched hole, durable at once.
    pub(crate) fn discard(&self, offset: usize, len: usize) {
        let mut st = self.lock();
        for w in &self.memory[offset / WORD..(offset + len) / WORD] {
            w.store(0, Ordering::Relaxed);
        }
        st.persisted[offset..offset + len].fill(0);
        let lines = offset / CACHE_LINE..(offset + len) / CACHE_LINE;
        st.pending.retain(|l, _| !lines.contains(l));
    }

    /// Marks every store so far to the lines overlapping the range as flushed by `thread`.
    pub(crate) fn flush(&self, offset: usize, len: usize, thread: u64) {
        if len == 0 {
            return;
        }
        let mut st = self.lock();
        let first = offset / CACHE_LINE;
        let last = (offset + len - 1) / CACHE_LINE;
        for (_, writes) in st.pending.range_mut(first..=last) {
            for w in writes.iter_mut() {
                w.flushed_by = thread;
            }
        }
    }

    /// A fence by `thread`: asks the filter whether the fence happens at all, passes the
    /// gate, offers the crash point to the hook, then persists every line's stores up to
    /// the last one `thread` flushed.
    pub(crate) fn fence(&self, thread: u64) {
        let filter = self
            .filter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if filter.is_some_and(|keep| !keep()) {
            return;
        }
        let gate = self.gate.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(gate) = gate {
            gate();
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        st.fences += 1;
        st.offer_crash_point();
        let mut emptied = Vec::new();
        for (&line, writes) in st.pending.iter_mut() {
            if let Some(last) = writes.iter().rposition(|w| w.flushed_by == thread) {
                for w in writes.drain(..=last) {
                    let at = line * CACHE_LINE + w.word as usize * WORD;
                    st.persisted[at..at + WORD].copy_from_slice(&w.value.to_le_bytes());
                }
                if writes.is_empty() {
                    emptied.push(line);
                }
            }
        }
        for line in emptied {
            st.pending.remove(&line);
        }
    }

    /// Installs `hook`, run at every later fence with that fence's crash point. The hook
    /// runs while the simulator is locked: it must not use this media (it may freely
    /// open crash images on other media).
    pub fn set_fence_hook(&self, hook: FenceHook) {
        self.lock().hook = Some(hook);
    }

    /// Installs `gate`, run by every thread that fences as it arrives at the fence, before
    /// the fence takes effect and outside the simulator's lock (so other threads go on
    /// storing and fencing meanwhile). A gate that blocks holds its thread between its
    /// stores and their fence: with it a test chooses an interleaving instead of hoping
    /// for one.
    pub fn set_fence_gate(&self, gate: FenceGate) {
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = Some(gate);
    }

    /// Removes the fence gate.
    pub fn clear_fence_gate(&self) {
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Installs `filter`, asked by every thread that fences whether its fence happens
    /// (see [`FenceFilter`]).
    pub fn set_fence_filter(&self, filter: FenceFilter) {
        *self.filter.lock().unwrap_or_else(|p| p.into_inner()) = Some(filter);
    }

    /// Removes the fence filter.
    pub fn clear_fence_filter(&self) {
        *self.filter.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Removes and returns the fence hook.
    pub fn take_fence_hook(&self) -> Option<FenceHook> {
        self.lock().hook.take()
    }

    /// Runs `f` on the crash point of "a crash right now" (covering every moment since
    /// the last fence). `f` must not use this media.
    pub fn with_crash_point<R>(&self, f: impl FnOnce(&CrashPoint<'_>) -> R) -> R {
        let mut guard = self.lock();
        let point = guard.crash_point();
        f(&point)
    }

    /// The persisted image: what a crash now leaves if no pending store made it.
    pub fn persisted_image(&self) -> Vec<u8> {
        self.lock().persisted.clone()
    }

    /// Fences seen so far.
    pub fn fences(&self) -> u64 {
        self.lock().fences
    }

    /// Crash images offered to the fence hook so far.
    pub fn images_offered(&self) -> u64 {
        self.lock().images_offered
    }

    /// Lines with stores that are not yet persistent.
    pub fn pending_lines(&self) -> usize {
        self.lock().pending.len()
    }
}

impl SimState {
    /// Offers the crash point of now to the hook, if one is installed.
    fn offer_crash_point(&mut self) {
        if let Some(mut hook) = self.hook.take() {
            let point = self.crash_point();
            let offered = point.len() as u64;
            hook(&point);
            drop(point);
            self.images_offered += offered;
            self.hook = Some(hook);
        }
    }

    /// The crash point of now.
    fn crash_point(&mut self) -> CrashPoint<'_> {
        CrashPoint::new(
            self.fences,
            &self.persisted,
            &self.pending,
            &self.config,
            &mut self.rng,
        )
    }
}

fn word_bytes(w: &[u8]) -> [u8; WORD] {
    let mut b = [0u8; WORD];
    b.copy_from_slice(w);
    b
}

/// The crash images possible at one moment: the persisted image plus, for every line with
/// pending stores, a chosen prefix of them.
pub struct CrashPoint<'a> {
    fence: u64,
    persisted: &'a [u8],
    lines: Vec<(usize, &'a [PendingWrite])>,
    /// Per image, the number of pending stores applied to each line of `lines`.
    selections: Vec<Vec<u16>>,
}

impl<'a> CrashPoint<'a> {
    fn new(
        fence: u64,
        persisted: &'a [u8],
        pending: &'a BTreeMap<usize, Vec<PendingWrite>>,
        config: &SimConfig,
        rng: &mut ChaCha8Rng,
    ) -> CrashPoint<'a> {
        let lines: Vec<(usize, &'a [PendingWrite])> = pending
            .iter()
            .map(|(&line, w)| (line, w.as_slice()))
            .collect();
        let candidates = candidate_selections(&lines, config, rng);
        let mut seen = HashSet::new();
        let mut selections = Vec::new();
        for sel in candidates {
            let mut key = Vec::with_capacity(lines.len() * CACHE_LINE);
            for (i, &(line, writes)) in lines.iter().enumerate() {
                key.extend_from_slice(&line_after(persisted, line, &writes[..sel[i] as usize]));
            }
            if seen.insert(key) {
                selections.push(sel);
            }
        }
        CrashPoint {
            fence,
            persisted,
            lines,
            selections,
        }
    }

    /// The number of the fence this crash point precedes (1-based; the number of fences
    /// so far for a crash point taken with [`CrashSimulator::with_crash_point`]).
    pub fn fence_index(&self) -> u64 {
        self.fence
    }

    /// Number of distinct crash images.
    pub fn len(&self) -> usize {
        self.selections.len()
    }

    /// Whether there are no images (never: the persisted image is always one).
    pub fn is_empty(&self) -> bool {
        self.selections.is_empty()
    }

    /// Lines with pending stores at this point.
    pub fn pending_lines(&self) -> usize {
        self.lines.len()
    }

    /// Writes crash image `index` into `out` (replacing its contents).
    pub fn write_image(&self, index: usize, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(self.persisted);
        for (i, &(line, writes)) in self.lines.iter().enumerate() {
            let applied = &writes[..self.selections[index][i] as usize];
            let bytes = line_after(self.persisted, line, applied);
            out[line * CACHE_LINE..(line + 1) * CACHE_LINE].copy_from_slice(&bytes);
        }
    }

    /// Crash image `index` as a new buffer.
    pub fn image(&self, index: usize) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_image(index, &mut out);
        out
    }

    /// Every crash image, one after another.
    pub fn images(&self) -> impl Iterator<Item = Vec<u8>> + '_ {
        (0..self.len()).map(|i| self.image(i))
    }
}

/// The bytes of `line` after applying `writes` to its persisted contents.
fn line_after(persisted: &[u8], line: usize, writes: &[PendingWrite]) -> [u8; CACHE_LINE] {
    let mut bytes = [0u8; CACHE_LINE];
    bytes.copy_from_slice(&persisted[line * CACHE_LINE..(line + 1) * CACHE_LINE]);
    for w in writes {
        let at = w.word as usize * WORD;
        bytes[at..at + WORD].copy_from_slice(&w.value.to_le_bytes());
    }
    bytes
}

fn candidate_selections(
    lines: &[(usize, &[PendingWrite])],
    config: &SimConfig,
    rng: &mut ChaCha8Rng,
) -> Vec<Vec<u16>> {
    let full: Vec<u16> = lines
        .iter()
        .map(|(_, w)| w.len().min(u16::MAX as usize) as u16)
        .collect();
    let none = vec![0u16; lines.len()];
    let combinations = full
        .iter()
        .try_fold(1u64, |acc, &n| acc.checked_mul(n as u64 + 1));
    if let Some(total) = combinations.filter(|&t| t <= config.exhaustive_limit) {
        // Mixed-radix counting over every line's prefix length.
        let mut all = Vec::with_capacity(total as usize);
        let mut sel = none.clone();
        for _ in 0..total {
            all.push(sel.clone());
            for (digit, &max) in sel.iter_mut().zip(&full) {
                if *digit < max {
                    *digit += 1;
                    break;
                }
                *digit = 0;
            }
        }
        return all;
    }
    let cap = config.max_images_per_fence.max(2);
    let mut out = vec![none.clone(), full.clone()];
    let mut variations = Vec::new();
    if config.line_variations {
        for (i, &n) in full.iter().enumerate() {
            for k in 0..=n {
                for base in [&none, &full] {
                    if base[i] != k {
                        let mut sel = base.clone();
                        sel[i] = k;
                        variations.push(sel);
                    }
                }
            }
        }
    }
    // Leave room for the random combinations; when the variations do not all fit, take a
    // seeded random subset of them, so every line has its chance.
    let room = cap.saturating_sub(out.len() + config.random_images.min(cap / 2));
    if variations.len() > room {
        for k in 0..room {
            let j = rng.random_range(k..variations.len());
            variations.swap(k, j);
        }
        variations.truncate(room);
    }
    out.extend(variations);
    for _ in 0..config.random_images {
        if out.len() >= cap {
            break;
        }
        out.push(full.iter().map(|&n| rng.random_range(0..=n)).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(len: usize, config: SimConfig) -> CrashSimulator {
        CrashSimulator::new(vec![0u8; len], config)
    }

    fn store_u64(s: &CrashSimulator, offset: usize, v: u64) {
        let p = s.base();
        // SAFETY: offset is in bounds and 8-aligned in every call of this test helper.
        s.store(offset, 8, 0, || unsafe {
            (p.add(offset) as *mut u64).write(v)
        });
    }

    #[test]
    fn crash_leaves_each_line_at_a_prefix_of_its_stores() {
        let s = sim(128, SimConfig::default());
        store_u64(&s, 0, 1);
        store_u64(&s, 8, 2);
        store_u64(&s, 64, 3);
        let images: Vec<Vec<u8>> = s.with_crash_point(|p| p.images().collect());
        // Line 0 has 3 prefixes, line 1 has 2: all 6 combinations, all distinct.
        assert_eq!(images.len(), 6);
        for img in &images {
            let w = |o: usize| u64::from_le_bytes(img[o..o + 8].try_into().unwrap());
            // Prefix order: the second store of line 0 never persists without the first.
            assert!(!(w(8) == 2 && w(0) != 1));
        }
        assert!(images.iter().any(|i| i.iter().all(|&b| b == 0)));
    }

    #[test]
    fn fence_persists_only_flushed_stores_of_the_fencing_thread() {
        let s = sim(192, SimConfig::default());
        store_u64(&s, 0, 7);
        store_u64(&s, 64, 8);
        store_u64(&s, 128, 9);
        s.flush(0, 8, 1);
        s.flush(64, 8, 2);
        s.fence(1);
        let img = s.persisted_image();
        assert_eq!(img[0], 7);
        assert_eq!(
            img[64], 0,
            "flushed by another thread, not yet fenced by it"
        );
        assert_eq!(img[128], 0, "never flushed");
        s.fence(2);
        assert_eq!(s.persisted_image()[64], 8);
        assert_eq!(s.pending_lines(), 1);
    }

    #[test]
    fn a_filtered_fence_persists_nothing_until_a_kept_one() {
        let s = sim(128, SimConfig::default());
        let keep = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let k = keep.clone();
        s.set_fence_filter(std::sync::Arc::new(move || {
            k.load(std::sync::atomic::Ordering::SeqCst)
        }));
        store_u64(&s, 0, 7);
        s.flush(0, 8, 1);
        s.fence(1);
        assert_eq!(s.persisted_image()[0], 0, "the fence was dropped");
        assert_eq!(s.fences(), 0);
        keep.store(true, std::sync::atomic::Ordering::SeqCst);
        s.fence(1);
        assert_eq!(s.persisted_image()[0], 7, "the next kept fence persists it");
        s.clear_fence_filter();
        assert_eq!(s.fences(), 1);
    }

    #[test]
    fn large_crash_points_are_sampled_and_capped() {
        let config = SimConfig {
            max_images_per_fence: 40,
            ..SimConfig::default()
        };
        let s = sim(64 * 64, config);
        for line in 0..64 {
            store_u64(&s, line * 64, line as u64 + 1);
        }
        let n = s.with_crash_point(|p| {
            assert_eq!(p.pending_lines(), 64);
            p.len()
        });
        assert!(n > 2 && n <= 40, "{n}");
    }
}
