//! Defragmentation by punching holes (002): "Punch holes in free blocks … Find largest
//! free block, punch hole using fallocate … Iterate until target size reached … Must
//! keep file size unchanged."
//!
//! The heap gathers its free ranges (free regions, free runs of big segments, empty
//! chunks of small segments) while every arena is locked, so none of them can be handed
//! out meanwhile, and [`punch_largest_first`] gives their pages back to the file system
//! through [`Media::discard`]. Nothing persistent changes: the ranges were free, and
//! their contents mean nothing to the allocator, whose metadata (segment table, chunk
//! headers, page tables) lies outside every free range.

use std::ops::Range;

use crate::media::Media;

/// What [`PersistentHeap::defragment`](super::PersistentHeap::defragment) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Defragmentation {
    /// Free bytes the heap had (in ranges of at least one whole page).
    pub free_bytes: u64,
    /// Free ranges punched.
    pub holes: u64,
    /// Bytes of whole pages given back to the file system (a page punched before and
    /// not written since is counted again; it costs nothing).
    pub punched_bytes: u64,
    /// Empty extension files removed first (see
    /// [`PersistentHeap::shrink`](super::PersistentHeap::shrink)).
    pub files_removed: u64,
    /// Their data bytes.
    pub file_bytes_removed: u64,
    /// Bytes the pool's files occupied on their file system before and after, when they
    /// are files (`st_blocks × 512`).
    pub disk_bytes_before: Option<u64>,
    /// See [`disk_bytes_before`](Defragmentation::disk_bytes_before).
    pub disk_bytes_after: Option<u64>,
}

/// Joins ranges that touch (the input is sorted by start and has no overlaps).
pub(super) fn coalesce(sorted: impl IntoIterator<Item = Range<u64>>) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for r in sorted {
        match out.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => out.push(r),
        }
    }
    out
}

/// Punches the largest free ranges first until `target` bytes are given back or no
/// range is left; fills in `free_bytes`, `holes` and `punched_bytes`.
pub(super) fn punch_largest_first(
    media: &Media,
    mut free: Vec<Range<u64>>,
    target: u64,
) -> std::io::Result<Defragmentation> {
    free.sort_unstable_by_key(|r| std::cmp::Reverse(r.end - r.start));
    let page = rustix::param::page_size() as u64;
    let whole_pages =
        |r: &Range<u64>| (r.end / page * page).saturating_sub(r.start.next_multiple_of(page));
    let mut done = Defragmentation {
        free_bytes: free.iter().map(whole_pages).sum(),
        ..Defragmentation::default()
    };
    for r in free {
        if done.punched_bytes >= target {
            break;
        }
        let bytes = media.discard(r.start as usize, (r.end - r.start) as usize)?;
        if bytes > 0 {
            done.holes += 1;
            done.punched_bytes += bytes;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{MediaConfig, SimConfig};

    #[test]
    fn touching_ranges_join_and_others_stay_apart() {
        assert_eq!(
            coalesce([0..8, 8..16, 20..24, 24..30, 40..41]),
            vec![0..16, 20..30, 40..41]
        );
        assert!(coalesce(std::iter::empty()).is_empty());
    }

    #[test]
    fn the_largest_ranges_go_first_and_stop_at_the_target() {
        let page = rustix::param::page_size() as u64;
        let media = Media::sim(
            (64 * page) as usize,
            &MediaConfig::default(),
            SimConfig::default(),
        )
        .unwrap();
        media.fill(0, (64 * page) as usize, 0xAB);
        media.persist(0, (64 * page) as usize);
        // 2 pages, 8 pages, 4 pages, and a sub-page range that holds no whole page.
        let free = vec![
            page..3 * page,
            10 * page..18 * page,
            30 * page..34 * page,
            40 * page + 8..41 * page,
        ];
        let done = punch_largest_first(&media, free, 9 * page).unwrap();
        assert_eq!(done.free_bytes, 14 * page);
        assert_eq!((done.holes, done.punched_bytes), (2, 12 * page));
        let read = |at: u64| media.read_vec(at as usize, 1)[0];
        assert_eq!(read(10 * page), 0, "the largest range was punched");
        assert_eq!(read(33 * page), 0, "then the next largest");
        assert_eq!(
            read(2 * page),
            0xAB,
            "the target was reached before the smallest"
        );
        assert_eq!(read(9 * page), 0xAB, "bytes outside the ranges are kept");
        let image = media.crash_simulator().unwrap().persisted_image();
        assert_eq!(
            image[(10 * page) as usize],
            0,
            "the hole is durable at once"
        );
        assert_eq!(image[(2 * page) as usize], 0xAB);
    }
}
