//! Replaying committed transactions in version order into the mapping and the allocator,
//! checking that their allocation records agree with each other.

use super::held::Held;
use super::rules::{Verdict, log_kind_name, log_name};
use super::scan::Scan;
use crate::alloc::home::HomeAllocator;
use crate::engine::log::ROOT_HOME;
use crate::engine::log::chunks::ChunkGeometry;
use crate::engine::log::damage::Damage;
use crate::engine::log::layout::{DecodedEntry, HOME_LIMIT, LogKind, u64_at};
use crate::engine::log::mapping::AddressMap;
use crate::media::Media;

/// The DRAM state rebuilt from the log.
#[derive(Debug)]
pub(crate) struct Replayed {
    pub allocator: HomeAllocator,
    /// Live (mapped) bytes per chunk.
    pub live: Vec<i64>,
}

/// What a log entry says, checked on its own (before the allocation state is looked at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Meaning {
    /// A free record of an object of `len` bytes.
    Free { len: u64 },
    /// An allocation record of an object of `len` bytes (non-zero, inside home space).
    Allocation { len: u64 },
    /// Data: an update, or an allocation's initial bytes.
    Data,
}

/// Checks what entry `e` of a `kind` log in the chunk at `base` says on its own: inside
/// home space, records of 8 bytes, allocations of a non-zero length inside home space,
/// no tombstone in the update or initial-data log. Both replays (sequential and
/// parallel) judge entries with it. The error is the reason the entry is damage.
pub(super) fn check_entry(
    media: &Media,
    base: u64,
    kind: LogKind,
    e: &DecodedEntry,
) -> Result<Meaning, String> {
    if e.home < ROOT_HOME || e.home + e.size as u64 > HOME_LIMIT {
        return Err(format!(
            "entry for home {:#x}+{} is outside the home space",
            e.home, e.size
        ));
    }
    let record_len = || {
        // Free records and allocation records hold one length: the object's.
        if e.size != 8 {
            return Err(format!("a {kind:?} record holds {} bytes, not 8", e.size));
        }
        let mut b = [0u8; 8];
        media.read((base + e.data as u64) as usize, &mut b);
        Ok(u64_at(&b, 0))
    };
    match (kind, e.tombstone) {
        (LogKind::Dealloc, _) => Ok(Meaning::Free { len: record_len()? }),
        (LogKind::Alloc, true) => {
            let len = record_len()?;
            match e.home.checked_add(len) {
                Some(end) if len > 0 && end <= HOME_LIMIT => Ok(Meaning::Allocation { len }),
                _ => Err(format!(
                    "allocation record {:#x}+{len} is outside the home space",
                    e.home
                )),
            }
        }
        (LogKind::Alloc | LogKind::Update | LogKind::Initial, false) => Ok(Meaning::Data),
        (LogKind::Update | LogKind::Initial, true) => Err(format!(
            "a tombstone entry in an {} log",
            log_kind_name(kind)
        )),
    }
}

/// Replays every committed transaction of `scan` into `mapping` (empty on entry; any
/// [`AddressMap`]).
/// Records that cannot all be true are reported in `problems` and skipped.
pub(crate) fn replay(
    media: &Media,
    geometry: &ChunkGeometry,
    scan: &Scan,
    verdict: &Verdict,
    mapping: &impl AddressMap,
    problems: &mut Vec<Damage>,
) -> Replayed {
    // Within a version: frees, then allocation records, then the allocations' initial
    // data (which may sit in another chunk than its record), then updates.
    let phases = |kind: LogKind| match kind {
        LogKind::Dealloc => [Some(Phase::Frees), None],
        LogKind::Alloc => [Some(Phase::Allocations), Some(Phase::InitialData)],
        // Initial data in its own log is replayed as the update log's is (a
        // transaction's stores into its new objects are part of their images, so the
        // two never overlap within a version).
        LogKind::Update | LogKind::Initial => [Some(Phase::Updates), None],
    };
    // Every replayed chunk is in one log (orphans are in none). Listed log by log, in
    // chain order, the steps come as a few long runs already in version order (a log
    // set commits one transaction at a time), which a stable sort finds and merges:
    // far cheaper than sorting millions of steps from scratch.
    let mut order: Vec<(u64, Phase, u32, u32)> = Vec::new();
    for log in &verdict.logs {
        for &ci in &log.chunks {
            let ch = &scan.chunks[ci];
            for (bi, b) in ch.blocks.iter().enumerate() {
                if !verdict.uncommitted.contains(&b.version) {
                    for phase in phases(ch.header.kind).into_iter().flatten() {
                        // Chunks and blocks number far fewer than 2^32.
                        order.push((b.version, phase, ci as u32, bi as u32));
                    }
                }
            }
        }
    }
    order.sort();

    let mut live = vec![0i64; geometry.count as usize];
    let mut held = Held::new();
    // Records at or below the checkpoint's version are in it.
    let folded = verdict.seed.as_ref().map_or(0, |c| c.version);
    if let Some(checkpoint) = &verdict.seed {
        for &(home, size) in &checkpoint.allocations {
            held.insert(home, home + size);
        }
    }
    for &(version, phase, ci, bi) in &order {
        if version <= folded && matches!(phase, Phase::Frees | Phase::Allocations) {
            continue;
        }
        let ch = &scan.chunks[ci as usize];
        let kind = ch.header.kind;
        let base = geometry.offset(ch.index);
        let entries = ch
            .entries_of(&ch.blocks[bi as usize])
            .iter()
            .filter(|e| match phase {
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
            let meaning = match check_entry(media, base, kind, e) {
                Ok(m) => m,
                Err(reason) => {
                    problems.push(damage(reason));
                    continue;
                }
            };
            match meaning {
                Meaning::Free { len } => {
                    match held.remove(e.home) {
                        // Held allocations end after they start; `len` comes from the
                        // file and may be anything, so no sum.
                        Some(end) if end - e.home == len => {}
                        other => {
                            if let Some(end) = other {
                                held.insert(e.home, end);
                            }
                            problems.push(damage(format!(
                                "free record for {:#x}+{len}, which is not allocated",
                                e.home
                            )));
                            continue;
                        }
                    }
                    mapping.remove(e.home, len, &mut displaced);
                }
                Meaning::Allocation { len } => {
                    let end = e.home + len;
                    if let Some((s, end)) = held.overlapping(e.home, end) {
                        problems.push(damage(format!(
                            "allocation record {:#x}+{len} overlaps the live allocation {s:#x}+{}",
                            e.home,
                            end - s
                        )));
                        continue;
                    }
                    held.insert(e.home, end);
                }
                Meaning::Data if kind == LogKind::Alloc => {
                    let end = e.home + e.size as u64;
                    if !held.holds(e.home, end) {
                        problems.push(damage(format!(
                            "initial data for {:#x}+{} lies outside any allocation",
                            e.home, e.size
                        )));
                        continue;
                    }
                    mapping.insert(e.home, e.size as u64, data, &mut displaced);
                    live[ch.index as usize] += e.size as i64;
                }
                Meaning::Data => {
                    mapping.insert(e.home, e.size as u64, data, &mut displaced);
                    live[ch.index as usize] += e.size as i64;
                }
            }
        }
    }
    let allocations = held.into_sorted().into_iter().map(|(s, e)| (s, e - s));
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
