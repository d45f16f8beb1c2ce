//! Best fit in 4 KiB granules (002's big allocator, for [4 KiB, huge)).
//!
//! A big segment starts with its *page table*: one word per granule of the segment. The
//! word at an allocated block's first granule is
//! `len (bits 0..40) | 2 << 40 | check << 42`, where `check` is 22 bits of a CRC of the
//! block's place and length (stray or flipped bytes do not pass it); every other word is
//! 0. Only allocated blocks are recorded, so an allocation is one word stored and a free
//! one word cleared; free blocks, their splitting and coalescing, live in DRAM alone and
//! are rebuilt from the table at open. This is 002's "global block index sorted by block
//! offset" as an array (ours; 002 uses FPTrees); the DRAM side keeps the by-size index
//! (002's "free blocks index sorted by block size").

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::layout::GRANULE;
use crate::media::Media;

const ALLOCATED: u64 = 2 << 40;
const LEN_MASK: u64 = (1 << 40) - 1;

/// Granules of a big segment of `segment_size` bytes taken by its page table.
pub(crate) fn table_granules(segment_size: u64) -> u64 {
    (segment_size / GRANULE * 8).div_ceil(GRANULE)
}

fn check(region: u64, granule: u64, len: u64) -> u64 {
    let mut b = [0u8; 24];
    b[0..8].copy_from_slice(&region.to_le_bytes());
    b[8..16].copy_from_slice(&granule.to_le_bytes());
    b[16..24].copy_from_slice(&len.to_le_bytes());
    u64::from(crc32c::crc32c(&b) & 0x3f_ffff)
}

/// The page-table word of a block of `len` granules at `granule` of region `region`.
pub(crate) fn entry(region: u64, granule: u64, len: u64) -> u64 {
    len | ALLOCATED | check(region, granule, len) << 42
}

/// Decodes the page-table word at `granule` of region `region` (with `granules` in all):
/// `Ok(None)` for 0, the block's length in granules, or why the word is damaged.
pub(crate) fn decode_entry(
    word: u64,
    region: u64,
    granule: u64,
    granules: u64,
) -> Result<Option<u64>, String> {
    if word == 0 {
        return Ok(None);
    }
    let len = word & LEN_MASK;
    if word & (3 << 40) != ALLOCATED
        || word >> 42 != check(region, granule, len)
        || len == 0
        || len > granules - granule
    {
        return Err(format!(
            "page-table word {word:#018x} at granule {granule} is not a valid block"
        ));
    }
    Ok(Some(len))
}

/// Records the block of `len` granules at `granule` of the big segment at `base` as
/// allocated, unflushed (the caller flushes the word, at once or at a checkpoint).
/// Idempotent.
pub(crate) fn store_set(media: &Media, base: u64, region: u64, granule: u64, len: u64) {
    media.write_u64((base + granule * 8) as usize, entry(region, granule, len));
}

/// Clears the block at `granule` of the big segment at `base`, unflushed. Idempotent.
pub(crate) fn store_clear(media: &Media, base: u64, granule: u64) {
    media.write_u64((base + granule * 8) as usize, 0);
}

/// A big block: its segment's region, first granule and length in granules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BigBlock {
    /// The region of its segment.
    pub region: u32,
    /// Its first granule in the segment.
    pub granule: u32,
    /// Its length in granules.
    pub len: u32,
}

/// Free runs of at most this many granules are indexed by exact length (a bin per
/// length); longer ones in one set by length. 64 granules is 256 KiB.
const BINS: u32 = 64;

/// One big segment's free runs, as DRAM boundary tags: a run is found from either end
/// in one step, so a free coalesces with its neighbours without a search.
#[derive(Debug)]
struct BigSegment {
    /// At a free run's first granule, its length; 0 elsewhere.
    len_at_start: Box<[u32]>,
    /// At a free run's last granule, its first granule + 1; 0 elsewhere.
    start_at_end: Box<[u32]>,
    /// At an allocated block's first granule, its length; 0 elsewhere (so a free is
    /// checked against DRAM, which is the truth under either metadata policy).
    len_at_block: Box<[u32]>,
}

impl BigSegment {
    fn new(granules: usize) -> BigSegment {
        BigSegment {
            len_at_start: vec![0; granules].into_boxed_slice(),
            start_at_end: vec![0; granules].into_boxed_slice(),
            len_at_block: vec![0; granules].into_boxed_slice(),
        }
    }

    fn mark(&mut self, start: u32, len: u32) {
        self.len_at_start[start as usize] = len;
        self.start_at_end[(start + len - 1) as usize] = start + 1;
    }

    fn unmark(&mut self, start: u32, len: u32) {
        self.len_at_start[start as usize] = 0;
        self.start_at_end[(start + len - 1) as usize] = 0;
    }

    /// The free runs `(start, len)`, in address order.
    fn runs(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let mut g = 0usize;
        std::iter::from_fn(move || {
            while g < self.len_at_start.len() {
                let len = self.len_at_start[g];
                let start = g;
                g += len.max(1) as usize;
                if len > 0 {
                    return Some((start as u32, len));
                }
            }
            None
        })
    }
}

/// The DRAM state of one arena's big segments: each segment's free runs (boundary tags),
/// and a by-size index of every free run: a set per exact length up to [`BINS`]
/// granules with a bitmap of the non-empty ones, and one set by length above. Best fit
/// takes the shortest run that is long enough, the lowest `(region, start)` among equals.
///
/// (One B-tree set of `(len, region, start)` and a B-tree of runs by place, as before,
/// put a fifth of the time of random allocation and free in B-tree code.)
#[derive(Debug)]
pub(crate) struct BigRuns {
    /// The arena's big segments, by region.
    segments: FxHashMap<u32, BigSegment>,
    /// `bins[n - 1]`: the free runs of `n` granules, as `(region, start)`.
    bins: Vec<BTreeSet<(u32, u32)>>,
    /// Bit `n - 1` set when `bins[n - 1]` is not empty.
    nonempty: u64,
    /// Free runs longer than [`BINS`] granules, as `(len, region, start)`.
    long: BTreeSet<(u32, u32, u32)>,
    /// Granules allocated.
    used_granules: u64,
    /// Blocks allocated.
    used_blocks: u64,
}

impl Default for BigRuns {
    fn default() -> Self {
        BigRuns {
            segments: FxHashMap::default(),
            bins: vec![BTreeSet::new(); BINS as usize],
            nonempty: 0,
            long: BTreeSet::new(),
            used_granules: 0,
            used_blocks: 0,
        }
    }
}

impl BigRuns {
    /// Adds a segment of `granules` granules whose free runs are `free` and whose
    /// allocated blocks are `allocated` (both `(start, len)`, from its page table).
    pub(crate) fn add_segment(
        &mut self,
        region: u32,
        granules: u32,
        free: &[(u32, u32)],
        allocated: &[(u32, u32)],
    ) {
        let mut seg = BigSegment::new(granules as usize);
        for &(start, len) in free {
            seg.mark(start, len);
            self.index(region, start, len);
        }
        for &(start, len) in allocated {
            seg.len_at_block[start as usize] = len;
            self.used_granules += u64::from(len);
        }
        self.used_blocks += allocated.len() as u64;
        self.segments.insert(region, seg);
    }

    /// The length of the allocated block starting at `granule` of `region`, if one does.
    pub(crate) fn allocated_len(&self, region: u32, granule: u32) -> Option<u32> {
        let seg = self.segments.get(&region)?;
        seg.len_at_block
            .get(granule as usize)
            .copied()
            .filter(|&l| l != 0)
    }

    /// Removes an empty segment (being given back).
    pub(crate) fn remove_segment(&mut self, region: u32) {
        if let Some(seg) = self.segments.remove(&region) {
            for (start, len) in seg.runs() {
                self.unindex(region, start, len);
            }
        }
    }

    /// Whether the segment of `region` has no allocated block (one free run, starting
    /// right after the page table, of `usable` granules).
    pub(crate) fn is_empty(&self, region: u32, first: u32, usable: u32) -> bool {
        self.segments
            .get(&region)
            .is_some_and(|s| s.len_at_start[first as usize] == usable)
    }

    /// Every free run, as `(region, first granule, granules)`.
    pub(crate) fn free_runs(&self) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        self.segments
            .iter()
            .flat_map(|(&region, seg)| seg.runs().map(move |(start, len)| (region, start, len)))
    }

    /// The number of segments.
    pub(crate) fn segments(&self) -> usize {
        self.segments.len()
    }

    fn index(&mut self, region: u32, start: u32, len: u32) {
        if len <= BINS {
            self.bins[len as usize - 1].insert((region, start));
            self.nonempty |= 1 << (len - 1);
        } else {
            self.long.insert((len, region, start));
        }
    }

    fn unindex(&mut self, region: u32, start: u32, len: u32) {
        if len <= BINS {
            let bin = &mut self.bins[len as usize - 1];
            bin.remove(&(region, start));
            if bin.is_empty() {
                self.nonempty &= !(1 << (len - 1));
            }
        } else {
            self.long.remove(&(len, region, start));
        }
    }

    /// The shortest free run of at least `len` granules, lowest place first.
    fn best_fit(&self, len: u32) -> Option<(u32, u32, u32)> {
        if len <= BINS {
            let candidates = self.nonempty & (u64::MAX << (len - 1));
            if candidates != 0 {
                let n = candidates.trailing_zeros() + 1;
                let &(region, start) = self.bins[n as usize - 1].first()?;
                return Some((n, region, start));
            }
        }
        self.long.range((len, 0, 0)..).next().copied()
    }

    /// Takes the best-fitting free run for `len` granules (DRAM only), or `None`.
    pub(crate) fn take(&mut self, len: u32) -> Option<BigBlock> {
        let (run, region, start) = self.best_fit(len)?;
        self.unindex(region, start, run);
        let seg = self
            .segments
            .get_mut(&region)
            .expect("a run's segment is known");
        seg.unmark(start, run);
        seg.len_at_block[start as usize] = len;
        if run > len {
            seg.mark(start + len, run - len);
            self.index(region, start + len, run - len);
        }
        self.used_blocks += 1;
        self.used_granules += u64::from(len);
        Some(BigBlock {
            region,
            granule: start,
            len,
        })
    }

    /// Gives back a block, coalescing it with free neighbours.
    pub(crate) fn give_back(&mut self, b: BigBlock) {
        let seg = self
            .segments
            .get_mut(&b.region)
            .expect("the block's segment is known");
        debug_assert_eq!(seg.len_at_block[b.granule as usize], b.len);
        seg.len_at_block[b.granule as usize] = 0;
        let (mut start, mut len) = (b.granule, b.len);
        let mut merged = [None, None];
        if let Some(&before) = start.checked_sub(1).map(|g| &seg.start_at_end[g as usize])
            && before != 0
        {
            let s = before - 1;
            let l = seg.len_at_start[s as usize];
            seg.unmark(s, l);
            merged[0] = Some((s, l));
            start = s;
            len += l;
        }
        let after = b.granule + b.len;
        if let Some(&l) = seg.len_at_start.get(after as usize)
            && l != 0
        {
            seg.unmark(after, l);
            merged[1] = Some((after, l));
            len += l;
        }
        seg.mark(start, len);
        for (s, l) in merged.into_iter().flatten() {
            self.unindex(b.region, s, l);
        }
        self.index(b.region, start, len);
        self.used_blocks -= 1;
        self.used_granules -= u64::from(b.len);
    }

    /// Live blocks and their bytes.
    pub(crate) fn live(&self) -> (u64, u64) {
        (self.used_blocks, self.used_granules * GRANULE)
    }

    /// DRAM held (approximate).
    pub(crate) fn dram_bytes(&self) -> u64 {
        // A B-tree entry costs about its key plus a share of a node.
        let tags: usize = self
            .segments
            .values()
            .map(|s| s.len_at_start.len() * 12)
            .sum();
        let runs: usize = self.bins.iter().map(BTreeSet::len).sum::<usize>() * 12;
        (tags + runs + self.long.len() * 16) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_check_their_place_and_length() {
        let w = entry(3, 10, 4);
        assert_eq!(decode_entry(w, 3, 10, 64), Ok(Some(4)));
        assert_eq!(decode_entry(0, 3, 10, 64), Ok(None));
        assert!(decode_entry(w, 3, 11, 64).is_err(), "moved");
        assert!(decode_entry(w, 4, 10, 64).is_err(), "another segment");
        assert!(decode_entry(w ^ 1, 3, 10, 64).is_err(), "length flipped");
        assert!(
            decode_entry(entry(3, 62, 4), 3, 62, 64).is_err(),
            "past the end"
        );
        assert_eq!(table_granules(64 << 10), 1);
        assert_eq!(table_granules(4 << 20), 2);
    }

    #[test]
    fn best_fit_splits_and_frees_coalesce() {
        let mut r = BigRuns::default();
        r.add_segment(0, 16, &[(1, 15)], &[]);
        r.add_segment(1, 5, &[(1, 4)], &[]);
        let a = r.take(4).unwrap();
        assert_eq!((a.region, a.granule), (1, 1), "the exact fit wins");
        let b = r.take(3).unwrap();
        let c = r.take(3).unwrap();
        assert_eq!((b.region, b.granule, c.granule), (0, 1, 4));
        assert_eq!(r.live(), (3, 10 * GRANULE));
        r.give_back(b);
        r.give_back(c);
        assert!(
            r.is_empty(0, 1, 15),
            "both coalesced into the whole segment"
        );
        assert!(r.take(16).is_none());
        r.give_back(a);
        assert!(r.is_empty(1, 1, 4));
        r.remove_segment(1);
        assert_eq!(r.segments(), 1);
        assert!(r.take(4).is_some_and(|b| b.region == 0));
    }

    /// Random takes and frees over three segments, against a model that keeps one flag
    /// per granule: every take is the model's best fit (shortest free run long enough,
    /// lowest place among equals), and free runs are always fully coalesced.
    #[test]
    fn takes_and_frees_agree_with_a_granule_by_granule_model() {
        use rand::{Rng, SeedableRng};
        const SIZE: u32 = 300; // granules per segment; granule 0 is the page table
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut r = BigRuns::default();
        let mut free = vec![vec![true; SIZE as usize]; 3];
        for (region, f) in free.iter_mut().enumerate() {
            f[0] = false;
            r.add_segment(region as u32, SIZE, &[(1, SIZE - 1)], &[]);
        }
        let runs = |free: &Vec<Vec<bool>>| {
            let mut out = Vec::new();
            for (region, f) in free.iter().enumerate() {
                let mut g = 0;
                while g < f.len() {
                    if f[g] {
                        let s = g;
                        while g < f.len() && f[g] {
                            g += 1;
                        }
                        out.push((region as u32, s as u32, (g - s) as u32));
                    } else {
                        g += 1;
                    }
                }
            }
            out
        };
        let mut held: Vec<BigBlock> = Vec::new();
        for step in 0..20_000 {
            if held.is_empty() || rng.random_bool(0.55) {
                let len = if rng.random_bool(0.9) {
                    rng.random_range(1..=40)
                } else {
                    rng.random_range(41..=120)
                };
                let want = runs(&free)
                    .into_iter()
                    .filter(|&(_, _, l)| l >= len)
                    .min_by_key(|&(region, s, l)| (l, region, s));
                let got = r.take(len);
                assert_eq!(
                    got.map(|b| (b.region, b.granule)),
                    want.map(|(region, s, _)| (region, s)),
                    "step {step}: take {len}"
                );
                if let Some(b) = got {
                    assert_eq!(r.allocated_len(b.region, b.granule), Some(b.len));
                    for g in b.granule..b.granule + b.len {
                        free[b.region as usize][g as usize] = false;
                    }
                    held.push(b);
                }
            } else {
                let b = held.swap_remove(rng.random_range(0..held.len()));
                if b.len > 1 {
                    assert_eq!(r.allocated_len(b.region, b.granule + 1), None, "inside");
                }
                for g in b.granule..b.granule + b.len {
                    free[b.region as usize][g as usize] = true;
                }
                r.give_back(b);
            }
            if step % 500 == 0 {
                let mut indexed: Vec<(u32, u32, u32)> = r
                    .segments
                    .iter()
                    .flat_map(|(&region, s)| s.runs().map(move |(st, l)| (region, st, l)))
                    .collect();
                indexed.sort_unstable();
                assert_eq!(indexed, runs(&free), "step {step}: the runs are coalesced");
            }
        }
        for b in held.drain(..) {
            r.give_back(b);
        }
        for region in 0..3 {
            assert!(r.is_empty(region, 1, SIZE - 1));
        }
        assert_eq!(r.live(), (0, 0));
    }
}
