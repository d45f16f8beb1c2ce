//! Replaying committed transactions in version order into the mapping and the allocator,
//! checking that their allocation records agree with each other.

use std::collections::BTreeMap;

use super::Damage;
use super::rules::{Verdict, log_name};
use super::scan::Scan;
use crate::engine::log::ROOT_HOME;
use crate::engine::log::chunks::ChunkGeometry;
use crate::engine::log::home_alloc::HomeAllocator;
use crate::engine::log::layout::{HOME_LIMIT, LogKind, u64_at};
use crate::engine::log::mapping::Mapping;
use crate::media::Media;

/// The DRAM state rebuilt from the log.
#[derive(Debug)]
pub(crate) struct Replayed {
    pub allocator: HomeAllocator,
    /// Live (mapped) bytes per chunk.
    pub live: Vec<i64>,
}

/// Replays every committed transaction of `scan` into `mapping` (empty on entry).
/// Records that cannot all be true are reported in `problems` and skipped.
pub(crate) fn replay(
    media: &Media,
    geometry: &ChunkGeometry,
    scan: &Scan,
    verdict: &Verdict,
    mapping: &Mapping,
    problems: &mut Vec<Damage>,
) -> Replayed {
    // Within a version: frees, then allocation records, then the allocations' initial
    // data (which may sit in another chunk than its record), then updates.
    let phases = |kind: LogKind| match kind {
        LogKind::Dealloc => [Some(Phase::Frees), None],
        LogKind::Alloc => [Some(Phase::Allocations), Some(Phase::InitialData)],
        LogKind::Update => [Some(Phase::Updates), None],
    };
    let mut order: Vec<(u64, Phase, usize, usize)> = Vec::new();
    for (ci, ch) in scan.chunks.iter().enumerate() {
        for (bi, b) in ch.blocks.iter().enumerate() {
            if !verdict.uncommitted.contains(&b.version) {
                for phase in phases(ch.header.kind).into_iter().flatten() {
                    order.push((b.version, phase, ci, bi));
                }
            }
        }
    }
    order.sort_unstable();

    let mut live = vec![0i64; geometry.count as usize];
    let mut allocations: BTreeMap<u64, u64> = BTreeMap::new();
    for &(_, phase, ci, bi) in &order {
        let ch = &scan.chunks[ci];
        let kind = ch.header.kind;
        let base = geometry.offset(ch.index);
        let entries = ch.blocks[bi].entries.iter().filter(|e| match phase {
            Phase::Allocations => e.tombstone,
            Phase::InitialData => !e.tombstone,
            Phase::Frees | Phase::Updates => true,
        });
        for e in entries {
            let data = base + e.data as u64;
            let damage =
                |reason: String| Damage::in_log(data, log_name(ch.header.owner, kind), reason);
            let mut displaced = |log: u64, bytes: u64| {
                if let Some(l) = live.get_mut(geometry.chunk_of(log) as usize) {
                    *l -= bytes as i64;
                }
            };
            if e.home < ROOT_HOME || e.home + e.size as u64 > HOME_LIMIT {
                problems.push(damage(format!(
                    "entry for home {:#x}+{} is outside the home space",
                    e.home, e.size
                )));
                continue;
            }
            // Free records and allocation records hold one length: the object's.
            let is_record = kind == LogKind::Dealloc || (kind == LogKind::Alloc && e.tombstone);
            let len = if is_record {
                if e.size != 8 {
                    problems.push(damage(format!(
                        "a {kind:?} record holds {} bytes, not 8",
                        e.size
                    )));
                    continue;
                }
                let mut b = [0u8; 8];
                media.read(data as usize, &mut b);
                u64_at(&b, 0)
            } else {
                0
            };
            match (kind, e.tombstone) {
                (LogKind::Dealloc, _) => {
                    if allocations.get(&e.home) != Some(&len) {
                        problems.push(damage(format!(
                            "free record for {:#x}+{len}, which is not allocated",
                            e.home
                        )));
                        continue;
                    }
                    allocations.remove(&e.home);
                    mapping.remove(e.home, len, &mut displaced);
                }
                (LogKind::Alloc, true) => {
                    let end = e
                        .home
                        .checked_add(len)
                        .filter(|&end| len > 0 && end <= HOME_LIMIT);
                    let Some(end) = end else {
                        problems.push(damage(format!(
                            "allocation record {:#x}+{len} is outside the home space",
                            e.home
                        )));
                        continue;
                    };
                    if let Some((s, l)) = overlapping(&allocations, e.home, end) {
                        problems.push(damage(format!(
                            "allocation record {:#x}+{len} overlaps the live allocation {s:#x}+{l}",
                            e.home
                        )));
                        continue;
                    }
                    allocations.insert(e.home, len);
                }
                (LogKind::Alloc, false) => {
                    let end = e.home + e.size as u64;
                    let inside = allocations
                        .range(..=e.home)
                        .next_back()
                        .is_some_and(|(&s, &l)| end <= s + l);
                    if !inside {
                        problems.push(damage(format!(
                            "initial data for {:#x}+{} lies outside any allocation",
                            e.home, e.size
                        )));
                        continue;
                    }
                    mapping.insert(e.home, e.size as u64, data, &mut displaced);
                    live[ch.index as usize] += e.size as i64;
                }
                (LogKind::Update, false) => {
                    mapping.insert(e.home, e.size as u64, data, &mut displaced);
                    live[ch.index as usize] += e.size as i64;
                }
                (LogKind::Update, true) => {
                    problems.push(damage("a tombstone entry in an update log".into()));
                }
            }
        }
    }
    let allocator = HomeAllocator::rebuild(allocations).unwrap_or_else(|e| {
        problems.push(Damage::at(
            geometry.start,
            format!("the allocation records are inconsistent: {e:?}"),
        ));
        HomeAllocator::new()
    });
    Replayed { allocator, live }
}

/// The order of replay within one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Phase {
    Frees,
    Allocations,
    InitialData,
    Updates,
}

/// A live allocation overlapping `[start, end)`, if any.
fn overlapping(allocations: &BTreeMap<u64, u64>, start: u64, end: u64) -> Option<(u64, u64)> {
    let before = allocations
        .range(..=start)
        .next_back()
        .filter(|&(&s, &l)| s + l > start);
    let after = allocations.range(start..end).next();
    before.or(after).map(|(&s, &l)| (s, l))
}
