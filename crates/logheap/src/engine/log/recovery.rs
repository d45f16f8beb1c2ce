//! Rebuilding the DRAM state from the log (000_70bf7223c84ebbe9.txt §4.5).
//!
//! Every chunk is scanned; a chunk with a valid header is read block by block until the
//! written part ends or a block fails its checks (a torn write). A transaction is
//! committed when every one of its blocks is valid and each block's peer is a valid block
//! of the same transaction (so none is missing). Committed transactions are replayed in
//! version order: free records unmap and release, allocation records allocate, data
//! entries map. Newer versions override older ones, byte range by byte range.
//!
//! A damaged block followed, later in the same log, by committed transactions is not a
//! torn tail but damage: recovery refuses the pool rather than silently drop committed
//! data.

use std::collections::{HashMap, HashSet};

use super::ROOT_HOME;
use super::chunks::{ChunkGeometry, TailChunk, payload_start};
use super::home_alloc::HomeAllocator;
use super::layout::{
    BlockScan, CHUNK_HEADER, ChunkHeader, DecodedBlock, HOME_LIMIT, LogKind, decode_block, u64_at,
};
use super::mapping::Mapping;
use crate::media::Media;

/// What recovery found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryReport {
    /// Chunks with a valid header.
    pub chunks_in_use: u64,
    /// Valid blocks read.
    pub blocks: u64,
    /// Committed transactions replayed.
    pub transactions: u64,
    /// Transactions dropped because a block was torn or missing (at most one per log set
    /// in flight at the crash).
    pub dropped_transactions: u64,
    /// Chunks reclaimed because they held nothing committed.
    pub chunks_reclaimed: u64,
    /// Largest version seen.
    pub max_version: u64,
}

/// Recovery refused the pool: the log is damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    pub offset: u64,
    pub reason: String,
}

pub(crate) struct Recovered {
    pub allocator: HomeAllocator,
    pub free_chunks: Vec<u32>,
    /// Live bytes per chunk.
    pub live: Vec<i64>,
    pub max_generation: u64,
    pub max_owner: u32,
    /// Where each log of the previous run can go on appending.
    pub tails: Vec<ResumedTail>,
    pub report: RecoveryReport,
}

/// The append position of one log of a previous run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResumedTail {
    pub owner: u32,
    pub kind: LogKind,
    pub tail: TailChunk,
}

struct ScannedChunk {
    index: u32,
    header: ChunkHeader,
    blocks: Vec<DecodedBlock>,
    /// Offset of an invalid block that ended the scan, if any.
    torn_at: Option<u32>,
}

fn scan(media: &Media, geometry: &ChunkGeometry) -> (Vec<ScannedChunk>, Vec<u32>) {
    let mut chunks = Vec::new();
    let mut free = Vec::new();
    let mut buf = vec![0u8; geometry.size as usize];
    let mut head = [0u8; CHUNK_HEADER];
    for c in 0..geometry.count {
        let at = geometry.offset(c) as usize;
        media.read(at, &mut head);
        let Some(header) = ChunkHeader::decode(&head) else {
            free.push(c);
            continue;
        };
        media.read(at, &mut buf);
        let mut blocks = Vec::new();
        let mut offset = payload_start() as usize;
        let mut torn_at = None;
        loop {
            match decode_block(&buf, c, header.generation, offset) {
                BlockScan::Block(b) => {
                    offset = b.end as usize;
                    blocks.push(b);
                }
                BlockScan::End => break,
                BlockScan::Invalid => {
                    torn_at = Some(offset as u32);
                    break;
                }
            }
        }
        chunks.push(ScannedChunk {
            index: c,
            header,
            blocks,
            torn_at,
        });
    }
    (chunks, free)
}

/// Rebuilds `mapping` (empty on entry), the allocator and chunk state from `media`'s log.
pub(crate) fn recover(
    media: &Media,
    geometry: &ChunkGeometry,
    mapping: &Mapping,
) -> Result<Recovered, Damage> {
    let (chunks, mut free_chunks) = scan(media, geometry);
    let mut report = RecoveryReport {
        chunks_in_use: chunks.len() as u64,
        ..RecoveryReport::default()
    };

    // Which version each valid block address holds.
    let mut version_at: HashMap<u64, u64> = HashMap::new();
    for ch in &chunks {
        for b in &ch.blocks {
            version_at.insert(geometry.offset(ch.index) + b.offset as u64, b.version);
            report.blocks += 1;
            report.max_version = report.max_version.max(b.version);
        }
    }
    let mut uncommitted: HashSet<u64> = HashSet::new();
    let mut all_versions: HashSet<u64> = HashSet::new();
    for ch in &chunks {
        for b in &ch.blocks {
            all_versions.insert(b.version);
            if version_at.get(&b.peer) != Some(&b.version) {
                uncommitted.insert(b.version);
            }
        }
    }
    report.dropped_transactions = uncommitted.len() as u64;

    // A torn block with committed data after it in the same log is damage, not a tail.
    let mut last_committed_seq: HashMap<(u32, LogKind), u32> = HashMap::new();
    for ch in &chunks {
        if ch.blocks.iter().any(|b| !uncommitted.contains(&b.version)) {
            let e = last_committed_seq
                .entry((ch.header.owner, ch.header.kind))
                .or_insert(0);
            *e = (*e).max(ch.header.seq);
        }
    }
    for ch in &chunks {
        if let Some(at) = ch.torn_at {
            let later = last_committed_seq
                .get(&(ch.header.owner, ch.header.kind))
                .is_some_and(|&s| s > ch.header.seq);
            if later {
                return Err(Damage {
                    offset: geometry.offset(ch.index) + at as u64,
                    reason: "a damaged transaction block is followed by committed transactions in the same log"
                        .into(),
                });
            }
        }
    }

    // Replay committed transactions in version order.
    let mut by_version: Vec<(u64, LogKind, u32, usize)> = Vec::new();
    for (ci, ch) in chunks.iter().enumerate() {
        for (bi, b) in ch.blocks.iter().enumerate() {
            if !uncommitted.contains(&b.version) {
                by_version.push((b.version, ch.header.kind, ci as u32, bi));
            }
        }
    }
    // Within a version: frees, then allocations, then updates.
    by_version
        .sort_unstable_by_key(|&(v, kind, ci, bi)| (v, std::cmp::Reverse(kind as u8), ci, bi));
    report.transactions = all_versions.len() as u64 - report.dropped_transactions;

    let mut live = vec![0i64; geometry.count as usize];
    let mut allocations: HashMap<u64, u64> = HashMap::new();
    let mut chunk_buf = vec![0u8; 8];
    for &(version, kind, ci, bi) in &by_version {
        let ch = &chunks[ci as usize];
        let base = geometry.offset(ch.index);
        for e in &ch.blocks[bi].entries {
            let data = base + e.data as u64;
            let mut displaced = |log: u64, bytes: u64| {
                if let Some(l) = live.get_mut(geometry.chunk_of(log) as usize) {
                    *l -= bytes as i64;
                }
            };
            let record_len = |buf: &mut Vec<u8>| -> Result<u64, Damage> {
                if e.size != 8 {
                    return Err(Damage {
                        offset: data,
                        reason: format!("a {kind:?} record holds {} bytes, not 8", e.size),
                    });
                }
                media.read(data as usize, &mut buf[..8]);
                Ok(u64_at(buf, 0))
            };
            let damage = |reason: String| Damage {
                offset: data,
                reason,
            };
            if e.home < ROOT_HOME || e.home + e.size as u64 > HOME_LIMIT {
                return Err(damage(format!(
                    "entry for home {:#x}+{} is outside the home space",
                    e.home, e.size
                )));
            }
            match (kind, e.tombstone) {
                (LogKind::Dealloc, _) => {
                    let len = record_len(&mut chunk_buf)?;
                    if allocations.remove(&e.home) != Some(len) {
                        return Err(damage(format!(
                            "free record for {:#x}+{len}, which is not allocated",
                            e.home
                        )));
                    }
                    mapping.remove(e.home, len, &mut displaced);
                }
                (LogKind::Alloc, true) => {
                    let len = record_len(&mut chunk_buf)?;
                    if len == 0 || e.home.checked_add(len).is_none_or(|end| end > HOME_LIMIT) {
                        return Err(damage(format!(
                            "allocation record {:#x}+{len} is outside the home space",
                            e.home
                        )));
                    }
                    allocations.insert(e.home, len);
                }
                (_, false) => {
                    mapping.insert(e.home, e.size as u64, data, version, &mut displaced);
                    live[ch.index as usize] += e.size as i64;
                }
                (LogKind::Update, true) => {
                    return Err(Damage {
                        offset: data,
                        reason: "a tombstone entry in an update log".into(),
                    });
                }
            }
        }
    }
    let allocator = HomeAllocator::rebuild(allocations).map_err(|e| Damage {
        offset: geometry.start,
        reason: format!("allocation records are inconsistent: {e:?}"),
    })?;

    let max_generation = chunks
        .iter()
        .map(|c| c.header.generation)
        .max()
        .unwrap_or(0);
    let max_owner = chunks.iter().map(|c| c.header.owner).max().unwrap_or(0);
    let limit = |what: &str, value: u64, max: u64| {
        if value > max {
            Err(Damage {
                offset: geometry.start,
                reason: format!("{what} {value} is beyond what a log can reach ({max})"),
            })
        } else {
            Ok(())
        }
    };
    limit("a chunk generation", max_generation, u64::MAX >> 2)?;
    limit("a log-set id", max_owner as u64, u32::MAX as u64 - 1)?;
    limit("a transaction version", report.max_version, u64::MAX >> 3)?;
    // Chunks with nothing committed are reclaimed: their header is erased durably so
    // their stale blocks can never be read again.
    let mut wrote = false;
    let mut last: HashMap<(u32, LogKind), &ScannedChunk> = HashMap::new();
    for ch in &chunks {
        if ch.blocks.iter().all(|b| uncommitted.contains(&b.version)) {
            let at = geometry.offset(ch.index) as usize;
            media.write(at, &[0u8; CHUNK_HEADER]);
            media.flush(at, CHUNK_HEADER);
            free_chunks.push(ch.index);
            report.chunks_reclaimed += 1;
            wrote = true;
        } else {
            let e = last.entry((ch.header.owner, ch.header.kind)).or_insert(ch);
            if ch.header.seq > e.header.seq {
                *e = ch;
            }
        }
    }
    // Each log goes on appending in its last chunk, after its last committed block.
    // What follows is the remains of the commit the crash interrupted (torn blocks, and
    // complete blocks of a transaction that is missing others): blocks of this chunk's
    // generation that a later append could bring back into view. They are erased
    // (durably) first, so no later open meets them again.
    let mut tails = Vec::new();
    let mut rest = vec![0u8; geometry.size as usize];
    for (&(owner, kind), ch) in &last {
        let offset = ch
            .blocks
            .iter()
            .rev()
            .find(|b| !uncommitted.contains(&b.version))
            .map_or(payload_start(), |b| b.end);
        let chunk_at = geometry.offset(ch.index) as usize;
        let rest = &mut rest[..geometry.size as usize - offset as usize];
        media.read(chunk_at + offset as usize, rest);
        for (i, line) in rest.chunks(64).enumerate() {
            if line.iter().any(|&b| b != 0) {
                let at = chunk_at + offset as usize + i * 64;
                media.write(at, &[0u8; 64][..line.len()]);
                media.flush(at, line.len());
                wrote = true;
            }
        }
        tails.push(ResumedTail {
            owner,
            kind,
            tail: TailChunk {
                chunk: ch.index,
                generation: ch.header.generation,
                seq: ch.header.seq,
                offset,
            },
        });
    }
    if wrote {
        media.fence();
    }
    Ok(Recovered {
        allocator,
        free_chunks,
        live,
        max_generation,
        max_owner,
        tails,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::log::layout::{EntryRef, encode_block};
    use crate::engine::log::mapping::MappingConfig;
    use crate::media::{MediaConfig, SimConfig};

    /// A pool whose only chunk holds one checksum-valid block with `entries`.
    fn recover_block(kind: LogKind, entries: &[EntryRef<'_>]) -> Result<Recovered, Damage> {
        let geometry = ChunkGeometry {
            start: 0,
            size: 4096,
            count: 2,
        };
        let media = Media::sim(8192, &MediaConfig::default(), SimConfig::default()).unwrap();
        let header = ChunkHeader {
            kind,
            owner: 1,
            generation: 5,
            prev: None,
            seq: 0,
        };
        media.write(0, &header.encode());
        let mut block = Vec::new();
        encode_block(&mut block, 0, 5, 9, 64, entries);
        media.write(64, &block);
        recover(&media, &geometry, &Mapping::new(MappingConfig::FULL))
    }

    #[test]
    fn hostile_but_checksum_valid_records_are_damage_not_panics() {
        let data = [1u8; 100];
        let len = |n: u64| n.to_le_bytes();
        let huge = len(1 << 46);
        let eight = len(8);
        let cases: Vec<(LogKind, Vec<EntryRef<'_>>)> = vec![
            // Data running past the end of the home space.
            (
                LogKind::Update,
                vec![EntryRef {
                    home: HOME_LIMIT - 8,
                    tombstone: false,
                    data: &data,
                }],
            ),
            // Data in the null page.
            (
                LogKind::Update,
                vec![EntryRef {
                    home: 8,
                    tombstone: false,
                    data: &data,
                }],
            ),
            // An allocation past the end of the home space.
            (
                LogKind::Alloc,
                vec![EntryRef {
                    home: HOME_LIMIT - 4096,
                    tombstone: true,
                    data: &huge,
                }],
            ),
            // A free of something never allocated, with an absurd length.
            (
                LogKind::Dealloc,
                vec![EntryRef {
                    home: 1 << 20,
                    tombstone: true,
                    data: &huge,
                }],
            ),
            // A tombstone in an update log.
            (
                LogKind::Update,
                vec![EntryRef {
                    home: 1 << 20,
                    tombstone: true,
                    data: &eight,
                }],
            ),
        ];
        for (kind, entries) in cases {
            assert!(
                recover_block(kind, &entries).is_err(),
                "{kind:?} {entries:?} was accepted"
            );
        }
        let fine = recover_block(
            LogKind::Update,
            &[EntryRef {
                home: 1 << 20,
                tombstone: false,
                data: &data,
            }],
        );
        assert_eq!(fine.unwrap().report.transactions, 1);
    }
}
