//! Examining a pool's log read-only, for `logheap check` and `inspect`: what recovery
//! would find, every problem (up to a bound), and whether the clean-close snapshot
//! holds exactly what replaying the log rebuilds.

use super::rules::log_kind_name;
use super::{
    Committed, LogSummary, MAX_PROBLEMS, RecoveryReport, STALE_LOG, SnapshotUse, changed_log,
    chunk_table, read_judge_replay,
};
use crate::engine::log::checkpoint::Seed;
use crate::engine::log::chunk_checks::same_tables;
use crate::engine::log::chunks::ChunkGeometry;
use crate::engine::log::damage::Damage;
use crate::engine::log::layout::CHUNK_HEADER;
use crate::engine::log::mapping::{AddressMap, Mapping, Piece};
use crate::engine::log::snapshot::Snapshot;
use crate::engine::log::superblock::{CloseRecord, Marks, SnapshotLocator};
use crate::media::Media;

/// What a read-only examination of a pool found (for `logheap check` and `inspect`).
#[derive(Debug)]
pub(crate) struct Examination {
    pub report: RecoveryReport,
    pub logs: Vec<LogSummary>,
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub live_log_bytes: u64,
    pub problems: Vec<Damage>,
}

/// Examines the log read-only (for `logheap check` and `inspect`), collecting every
/// problem (up to a bound): the recovery rules, the replay (from the allocation
/// checkpoint `seed`, as an open does), and the consistency of the mapping it implies;
/// after a clean close (`close`) also whether the snapshot at `snapshot` would be
/// loaded, and whether it holds exactly what replaying the log rebuilds. `threads` as
/// for [`recover`] (the result is the same whatever the number).
pub(crate) fn examine(
    media: &Media,
    geometry: &ChunkGeometry,
    marks: Marks,
    close: Option<CloseRecord>,
    snapshot: Result<Option<SnapshotLocator>, String>,
    mapping: &Mapping,
    (threads, seed): (usize, Option<&Seed>),
) -> Examination {
    let (scan, verdict, mut problems, replayed) = read_judge_replay(
        media,
        geometry,
        marks,
        close.as_ref(),
        mapping,
        (threads, seed, false),
        true,
    );
    let replayed = replayed.expect("replayed whatever the problems");
    // The mapping the log implies: pieces that do not overlap, each inside the payload
    // of a chunk in a log, adding up to each chunk's live bytes.
    let mut pieces = Vec::new();
    mapping.for_each_piece(|p| pieces.push(p));
    pieces.sort_unstable_by_key(|p| p.home);
    let in_use: std::collections::HashSet<u32> = scan.chunks.iter().map(|c| c.index).collect();
    let mut live = vec![0i64; geometry.count as usize];
    for w in pieces.windows(2) {
        if w[0].home + w[0].len > w[1].home {
            problems.push(Damage::at(
                w[1].log,
                format!("the mapping overlaps itself at home {:#x}", w[1].home),
            ));
        }
    }
    for p in &pieces {
        let inside = p.log >= geometry.start
            && p.log < geometry.offset(geometry.count)
            && in_use.contains(&geometry.chunk_of(p.log))
            && p.log - geometry.offset(geometry.chunk_of(p.log)) >= CHUNK_HEADER as u64
            && p.log + p.len <= geometry.offset(geometry.chunk_of(p.log)) + geometry.size;
        if inside {
            live[geometry.chunk_of(p.log) as usize] += p.len as i64;
        } else {
            problems.push(Damage::at(
                p.log,
                format!("home {:#x}+{} maps outside the log", p.home, p.len),
            ));
        }
    }
    if live != replayed.live {
        problems.push(Damage::at(
            geometry.start,
            "the mapping does not account for every live byte of the log".into(),
        ));
    }
    problems.truncate(MAX_PROBLEMS);
    let logs = verdict
        .logs
        .iter()
        .map(|log| {
            let chunks = log.chunks.iter().map(|&ci| &scan.chunks[ci]);
            let blocks = chunks.clone().map(|c| c.blocks.len() as u64).sum();
            let live_bytes: i64 = chunks.clone().map(|c| live[c.index as usize]).sum();
            LogSummary {
                log_set: log.owner,
                kind: log_kind_name(log.kind),
                chunks: log.chunks.len() as u64,
                blocks,
                live_bytes: live_bytes.max(0) as u64,
            }
        })
        .collect();
    let allocations = replayed.allocator.allocations();
    let mut report = RecoveryReport::of(close.is_some(), &scan, &verdict);
    report.snapshot = match (close.as_ref(), snapshot) {
        (None, _) | (Some(_), Ok(None)) => SnapshotUse::None,
        (Some(_), Err(why)) => SnapshotUse::Rejected(why),
        (Some(close), Ok(Some(locator))) => match Snapshot::read(media, geometry, &locator) {
            Err(why) => SnapshotUse::Rejected(why),
            Ok(s) if s.record() != *close => {
                SnapshotUse::Rejected("the snapshot was written at another close".into())
            }
            Ok(s) if s.log_digest() != Committed::of(&scan, &verdict).digest => {
                problems.push(changed_log(geometry));
                SnapshotUse::Rejected(STALE_LOG.into())
            }
            Ok(s)
                if s.chunk_records()
                    .is_some_and(|t| !same_tables(&t, &chunk_table(&scan, &verdict))) =>
            {
                problems.push(changed_log(geometry));
                SnapshotUse::Rejected("the snapshot's chunk table disagrees with the log".into())
            }
            Ok(s)
                if joined(s.pieces()) == joined(pieces.iter().copied())
                    && s.allocations().eq(allocations.iter().copied()) =>
            {
                SnapshotUse::Loaded
            }
            Ok(_) => {
                problems.push(Damage::at(
                    geometry.offset(locator.first),
                    "the clean-close snapshot disagrees with the log".into(),
                ));
                SnapshotUse::Rejected("the snapshot disagrees with the log".into())
            }
        },
    };
    Examination {
        report,
        logs,
        allocations: allocations.len() as u64,
        allocated_bytes: allocations.iter().map(|a| a.1).sum(),
        live_log_bytes: live.iter().sum::<i64>().max(0) as u64,
        problems,
    }
}

/// `pieces` (sorted by home) with neighbours joined when they continue each other in
/// home space and in the log: how a mapping cuts its ranges (at its partitions) does not
/// change what it maps.
fn joined(pieces: impl Iterator<Item = Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for p in pieces {
        match out.last_mut() {
            Some(last) if last.home + last.len == p.home && last.log + last.len == p.log => {
                last.len += p.len
            }
            _ => out.push(p),
        }
    }
    out
}
