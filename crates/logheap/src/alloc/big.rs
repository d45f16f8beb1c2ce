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

use std::collections::{BTreeMap, BTreeSet};

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
/// allocated, and flushes the word (not fenced). Idempotent.
pub(crate) fn persist_set(media: &Media, base: u64, region: u64, granule: u64, len: u64) {
    let at = (base + granule * 8) as usize;
    media.write_u64(at, entry(region, granule, len));
    media.flush(at, 8);
}

/// Clears the block at `granule` of the big segment at `base` and flushes the word (not
/// fenced). Idempotent.
pub(crate) fn persist_clear(media: &Media, base: u64, granule: u64) {
    let at = (base + granule * 8) as usize;
    media.write_u64(at, 0);
    media.flush(at, 8);
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

/// The DRAM state of one arena's big segments: free runs by place and by size.
#[derive(Debug, Default)]
pub(crate) struct BigRuns {
    /// Per region, its free runs `start -> len`.
    by_place: BTreeMap<u32, BTreeMap<u32, u32>>,
    /// Every free run as `(len, region, start)`: best fit is the first at or above a length.
    by_size: BTreeSet<(u32, u32, u32)>,
    /// Granules allocated.
    used_granules: u64,
    /// Blocks allocated.
    used_blocks: u64,
}

impl BigRuns {
    /// Adds a segment whose free runs are `free` (from its page table) and which holds
    /// `blocks` blocks of `granules` granules in all.
    pub(crate) fn add_segment(
        &mut self,
        region: u32,
        free: &[(u32, u32)],
        blocks: u64,
        granules: u64,
    ) {
        let map = self.by_place.entry(region).or_default();
        for &(start, len) in free {
            map.insert(start, len);
            self.by_size.insert((len, region, start));
        }
        self.used_blocks += blocks;
        self.used_granules += granules;
    }

    /// Removes an empty segment (being given back).
    pub(crate) fn remove_segment(&mut self, region: u32) {
        if let Some(map) = self.by_place.remove(&region) {
            for (start, len) in map {
                self.by_size.remove(&(len, region, start));
            }
        }
    }

    /// Whether the segment of `region` has no allocated block (one free run, starting
    /// right after the page table, of `usable` granules).
    pub(crate) fn is_empty(&self, region: u32, first: u32, usable: u32) -> bool {
        self.by_place
            .get(&region)
            .is_some_and(|m| m.len() == 1 && m.get(&first) == Some(&usable))
    }

    /// The number of segments.
    pub(crate) fn segments(&self) -> usize {
        self.by_place.len()
    }

    /// Takes the best-fitting free run for `len` granules (DRAM only), or `None`.
    pub(crate) fn take(&mut self, len: u32) -> Option<BigBlock> {
        let &(run, region, start) = self.by_size.range((len, 0, 0)..).next()?;
        self.by_size.remove(&(run, region, start));
        let map = self
            .by_place
            .get_mut(&region)
            .expect("a run's segment is known");
        map.remove(&start);
        if run > len {
            map.insert(start + len, run - len);
            self.by_size.insert((run - len, region, start + len));
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
        let map = self
            .by_place
            .get_mut(&b.region)
            .expect("the block's segment is known");
        let (mut start, mut len) = (b.granule, b.len);
        if let Some((&s, &l)) = map.range(..start).next_back()
            && s + l == start
        {
            map.remove(&s);
            self.by_size.remove(&(l, b.region, s));
            start = s;
            len += l;
        }
        if let Some(l) = map.remove(&(b.granule + b.len)) {
            self.by_size.remove(&(l, b.region, b.granule + b.len));
            len += l;
        }
        map.insert(start, len);
        self.by_size.insert((len, b.region, start));
        self.used_blocks -= 1;
        self.used_granules -= u64::from(b.len);
    }

    /// Live blocks and their bytes.
    pub(crate) fn live(&self) -> (u64, u64) {
        (self.used_blocks, self.used_granules * GRANULE)
    }

    /// DRAM held (approximate).
    pub(crate) fn dram_bytes(&self) -> u64 {
        // A B-tree entry costs about its key and value plus a share of a node.
        (self.by_size.len() * 24 + self.by_place.values().map(BTreeMap::len).sum::<usize>() * 16)
            as u64
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
        r.add_segment(0, &[(1, 15)], 0, 0);
        r.add_segment(1, &[(1, 4)], 0, 0);
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
}
