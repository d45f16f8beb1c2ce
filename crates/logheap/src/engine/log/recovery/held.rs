//! The live allocations during a replay, kept so that the checks a record needs
//! (overlap, containment, exact start) are cheap when records come in address order, as
//! they mostly do.

use std::collections::BTreeMap;

/// log2 of the home-space regions that allocations are kept by here, and that the
/// threads of the parallel replay divide the allocation records by ([`super::parallel`]):
/// the allocator's superblock, which small objects never cross.
pub(super) const REGION_SHIFT: u32 = 16;

/// Live allocations as `(start, end)`: all of them (the sequential replay) or those that
/// touch one thread's regions (the parallel one). They never overlap each other (an
/// allocation that would is refused).
#[derive(Debug)]
pub(super) struct Held {
    /// Allocations inside one region, by region, each list sorted by start, none empty
    /// (except the focused region's, which is kept apart).
    small: BTreeMap<u64, Vec<(u64, u64)>>,
    /// The region most recently used and its list, taken out of `small` (records in a
    /// row mostly fall in one region).
    focus: (u64, Vec<(u64, u64)>),
    /// Allocations across a region boundary: start -> end.
    large: BTreeMap<u64, u64>,
}

impl Held {
    pub(super) fn new() -> Held {
        Held {
            small: BTreeMap::new(),
            focus: (u64::MAX, Vec::new()),
            large: BTreeMap::new(),
        }
    }

    /// The list of `region`, which becomes the focused one.
    fn list(&mut self, region: u64) -> &mut Vec<(u64, u64)> {
        if self.focus.0 != region {
            let list = self.small.remove(&region).unwrap_or_default();
            let (old, old_list) = std::mem::replace(&mut self.focus, (region, list));
            if !old_list.is_empty() {
                self.small.insert(old, old_list);
            }
        }
        &mut self.focus.1
    }

    /// Whether an allocation overlaps `[s, e)` (`s < e`).
    pub(super) fn overlaps(&mut self, s: u64, e: u64) -> bool {
        self.overlapping(s, e).is_some()
    }

    /// An allocation overlapping `[s, e)` (`s < e`), as `(start, end)`, if any.
    pub(super) fn overlapping(&mut self, s: u64, e: u64) -> Option<(u64, u64)> {
        // Allocations do not overlap: the last one starting before `e` ends last.
        let ends_after_s = |list: &[(u64, u64)]| {
            let pos = list.partition_point(|&(start, _)| start < e);
            (pos > 0 && list[pos - 1].1 > s).then(|| list[pos - 1])
        };
        if let Some((&start, &end)) = self.large.range(..e).next_back().filter(|e| *e.1 > s) {
            return Some((start, end));
        }
        let (first, last) = (s >> REGION_SHIFT, (e - 1) >> REGION_SHIFT);
        if first == last {
            return ends_after_s(self.list(first));
        }
        let focused = (first..=last)
            .contains(&self.focus.0)
            .then(|| ends_after_s(&self.focus.1))
            .flatten();
        focused.or_else(|| {
            self.small
                .range(first..=last)
                .find_map(|(_, list)| ends_after_s(list))
        })
    }

    /// Whether one allocation holds all of `[s, e)`.
    pub(super) fn holds(&mut self, s: u64, e: u64) -> bool {
        let list = self.list(s >> REGION_SHIFT);
        let pos = list.partition_point(|&(start, _)| start <= s);
        let in_small = pos > 0 && list[pos - 1].1 >= e;
        in_small
            || self
                .large
                .range(..=s)
                .next_back()
                .is_some_and(|(_, &end)| end >= e)
    }

    /// Removes the allocation starting at `s` and returns its end, if there is one.
    pub(super) fn remove(&mut self, s: u64) -> Option<u64> {
        let list = self.list(s >> REGION_SHIFT);
        let pos = list.partition_point(|&(start, _)| start < s);
        if list.get(pos).is_some_and(|&(start, _)| start == s) {
            return Some(list.remove(pos).1);
        }
        self.large.remove(&s)
    }

    /// Adds `[s, e)`, which overlaps nothing held.
    pub(super) fn insert(&mut self, s: u64, e: u64) {
        let region = s >> REGION_SHIFT;
        if (e - 1) >> REGION_SHIFT == region {
            let list = self.list(region);
            let pos = list.partition_point(|&(start, _)| start < s);
            list.insert(pos, (s, e));
        } else {
            self.large.insert(s, e);
        }
    }

    /// Every allocation held, sorted, as (start, end).
    pub(super) fn into_sorted(mut self) -> Vec<(u64, u64)> {
        self.list(u64::MAX);
        let mut all: Vec<(u64, u64)> = self.small.into_values().flatten().collect();
        all.extend(self.large);
        // Two sorted runs: the stable sort merges them.
        all.sort();
        all
    }
}
