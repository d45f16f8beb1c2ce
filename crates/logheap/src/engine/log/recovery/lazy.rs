//! Opening after a clean close without reading the log: the clean-close snapshot's
//! chunk table says which chunks are in which log, where each log ends and what each
//! chunk's blocks add up to, so the open loads the snapshot (mapping, allocator, chunk
//! books) and reads of the log only the header lines of the chunks in no log (which
//! must be free) and the last chunk of each log (where appends go on).
//! Every other chunk in a log is checked later, before anything is read from it
//! ([`super::super::chunk_checks`]), with [`check_chunk`].
//!
//! The table is trusted only as far as the snapshot is (its CRC, its close record equal
//! to the superblock's) and only when it adds up: to the close record (chunks, blocks,
//! largest version) and to the snapshot's log fingerprint, with chains whose sequence
//! numbers grow and whose `prev` links name the chunk before, inside the formatted
//! chunks. Otherwise, or when a tail chunk's check fails, the open reads and judges the
//! whole log as before (which finds and reports any damage).

use super::scan::{self, Stop};
use super::{Recovery, RecoveryReport, ResumedTail, SnapshotUse, beside};
use crate::alloc::home::HomeAllocator;
use crate::engine::log::checkpoint::Seed;
use crate::engine::log::chunk_checks::ChunkRecord;
use crate::engine::log::chunks::{ChunkBook, ChunkGeometry, TailChunk, payload_start};
use crate::engine::log::damage::Damage;
use crate::engine::log::layout::{CHUNK_HEADER, HeaderState, LogKind};
use crate::engine::log::mapping::Mapping;
use crate::engine::log::snapshot::Snapshot;
use crate::engine::log::superblock::{CloseRecord, Marks, SnapshotLocator};
use crate::media::Media;

/// Opens from the snapshot at `locator` without reading the log beyond its tail
/// chunks, loading `mapping` (empty on entry; left empty on `Err`) with up to
/// `threads` threads; `seed` is the allocation checkpoint (its chunks are in no log). `Err` says why this cannot be done; then the caller reads the
/// log.
pub(super) fn recover(
    media: &Media,
    geometry: &ChunkGeometry,
    marks: Marks,
    close: &CloseRecord,
    locator: &SnapshotLocator,
    mapping: &Mapping,
    (threads, seed): (usize, Option<&Seed>),
) -> Result<Recovery, String> {
    let formatted = marks.formatted.min(geometry.count);
    let snapshot = Snapshot::read(media, geometry, locator)?;
    if snapshot.record() != *close {
        return Err("the snapshot was written at another close".into());
    }
    let records = snapshot
        .chunk_records()
        .ok_or("the snapshot has no chunk table")?;
    let mut total = ChunkBook::default();
    for r in &records {
        // A hostile count that overflows cannot add up to the record.
        total.blocks = total.blocks.saturating_add(r.book.blocks);
        total.max_version = total.max_version.max(r.book.max_version);
        total.digest ^= r.book.digest;
    }
    if records.len() as u64 != close.chunks_in_use
        || total.blocks != close.blocks
        || total.max_version != close.max_version
        || total.digest != snapshot.log_digest()
    {
        return Err("the snapshot's chunk table does not add up to its close record".into());
    }
    let checkpoint_chunks: &[u32] = seed.map_or(&[], |s| &s.chunks);
    for r in &records {
        let sound = r.index < formatted
            && !checkpoint_chunks.contains(&r.index)
            && r.header.generation <= u64::MAX >> 2
            && r.header.owner < u32::MAX
            && r.book.max_version <= u64::MAX >> 3
            && (r.book.end == 0 || (payload_start()..=geometry.size as u32).contains(&r.book.end));
        if !sound {
            return Err(format!(
                "the snapshot's record of chunk {} cannot be true",
                r.index
            ));
        }
    }
    let chains = chains(&records)?;
    // The tails: appends go on there, so they are checked now.
    let mut tails = Vec::with_capacity(chains.len());
    for (kind, chain) in &chains {
        let Some(&last) = chain.last() else { continue };
        let r = &records[last];
        check_chunk(media, geometry, r, None).map_err(|d| d.to_string())?;
        tails.push(ResumedTail {
            owner: r.header.owner,
            kind: *kind,
            tail: TailChunk {
                chunk: r.index,
                generation: r.header.generation,
                seq: r.header.seq,
                offset: end_of(r),
                zero_rest: false,
            },
        });
    }
    let mut run_end = vec![None; geometry.count as usize];
    for r in &records {
        run_end[r.index as usize] = Some(geometry.offset(r.index) + end_of(r) as u64);
    }
    let mut in_table = vec![false; geometry.count as usize];
    for r in &records {
        in_table[r.index as usize] = true;
    }
    // The header line of every other formatted chunk must be free (zero), so that a
    // damaged or torn header in no log is found by the open, as when it reads the log
    // (those of the table's chunks are compared with it when each is checked). The
    // allocator is rebuilt after, beside the pieces' check; the mapping is loaded once
    // all passed.
    let mut live = vec![0i64; geometry.count as usize];
    let (allocator, checked) = beside(
        threads,
        || {
            free_headers(
                media,
                geometry,
                (0..formatted).filter(|&c| !in_table[c as usize]),
            )?;
            HomeAllocator::rebuild(snapshot.allocations())
                .map_err(|e| format!("the snapshot's allocations are inconsistent: {e:?}"))
        },
        || {
            snapshot.check_pieces(
                geometry,
                |c| run_end.get(c as usize).copied().flatten(),
                // Inside a chunk in a log: checked.
                |p| live[geometry.chunk_of(p.log) as usize] += p.len as i64,
            )
        },
    );
    checked?;
    let allocator = allocator?;
    // Checked just now: loaded without a second pass of checks.
    mapping.load_sorted_checked(snapshot.pieces())?;
    let free_chunks = (0..formatted)
        .filter(|&c| !in_table[c as usize] && !checkpoint_chunks.contains(&c))
        .collect();
    let pending: Vec<ChunkRecord> = records
        .iter()
        .filter(|r| !tails.iter().any(|t| t.tail.chunk == r.index))
        .copied()
        .collect();
    let report = RecoveryReport {
        was_clean: true,
        chunks_in_use: records.len() as u64,
        blocks: close.blocks,
        transactions: close.transactions,
        max_version: close.max_version,
        snapshot: SnapshotUse::Loaded,
        chunks_unchecked: pending.len() as u64,
        ..RecoveryReport::default()
    };
    Ok(Recovery {
        allocator,
        free_chunks,
        live,
        max_generation: records
            .iter()
            .map(|r| r.header.generation)
            .max()
            .unwrap_or(0),
        max_owner: records.iter().map(|r| r.header.owner).max().unwrap_or(0),
        tails,
        report,
        in_log: *close,
        log_digest: snapshot.log_digest(),
        books: records.iter().map(|r| (r.index, r.book)).collect(),
        chains: chains
            .into_iter()
            .map(|(kind, chain)| (kind, chain.iter().map(|&i| records[i].index).collect()))
            .collect(),
        pending,
        erase: Vec::new(),
        reclaim: Vec::new(),
    })
}

/// `Err` unless the header line of each of `chunks` is free (zero).
fn free_headers(
    media: &Media,
    geometry: &ChunkGeometry,
    chunks: impl Iterator<Item = u32>,
) -> Result<(), String> {
    let mut head = [0u8; CHUNK_HEADER];
    for c in chunks {
        media.read(geometry.offset(c) as usize, &mut head);
        if !matches!(HeaderState::of(&head), HeaderState::Free) {
            return Err(format!(
                "chunk {c} is in no log by the snapshot, but its header line is not free"
            ));
        }
    }
    Ok(())
}

/// Where the blocks of the recorded chunk end (the payload's start when it has none).
fn end_of(r: &ChunkRecord) -> u32 {
    r.book.end.max(payload_start())
}

/// The logs of the table: positions in `records` of each log's chunks, in sequence
/// order, with the log's kind; each chunk's `prev` names the chunk before it in its
/// log (none for the first), and sequence numbers grow.
fn chains(records: &[ChunkRecord]) -> Result<Vec<(LogKind, Vec<usize>)>, String> {
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_unstable_by_key(|&i| {
        let h = &records[i].header;
        (h.owner, h.kind as u8, h.seq)
    });
    let mut out: Vec<(u32, LogKind, Vec<usize>)> = Vec::new();
    for i in order {
        let h = &records[i].header;
        match out.last_mut() {
            Some((owner, kind, chain)) if *owner == h.owner && *kind == h.kind => {
                let before = &records[*chain.last().expect("chains are not empty")];
                if h.seq == before.header.seq || h.prev != Some(before.index) {
                    return Err(format!(
                        "the snapshot's chunk table breaks a log's chain at chunk {}",
                        records[i].index
                    ));
                }
                chain.push(i);
            }
            _ => {
                if h.prev.is_some() {
                    return Err(format!(
                        "the snapshot's chunk table starts a log at chunk {}, which names a chunk before it",
                        records[i].index
                    ));
                }
                out.push((h.owner, h.kind, vec![i]));
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|(_, kind, chain)| (kind, chain))
        .collect())
}

/// Reads chunk `r.index` and checks that it holds what its record says: the same
/// header, a run of valid blocks from the payload's start to the recorded end and
/// nothing valid after it, and blocks that add up to the recorded book (count,
/// largest version, fingerprint share: a block changed since, even with a valid
/// checksum of its own, changes the share). `next` is its successor in its log.
///
/// The end of the run is judged as recovery judges it: bytes that are neither a block
/// nor an end mark right after the last block are damage, unless that block's
/// transaction goes on at the start of the successor (then the end mark may never
/// have reached the media, and nothing is lost: see `rules::end_mark_lost`).
pub(crate) fn check_chunk(
    media: &Media,
    geometry: &ChunkGeometry,
    r: &ChunkRecord,
    next: Option<u32>,
) -> Result<(), Damage> {
    let at = geometry.offset(r.index);
    let read = scan::scan_range(media, geometry, r.index..r.index + 1, &mut Vec::new());
    let damage = |offset: u32, why: String| {
        Err(Damage::at(
            at + offset as u64,
            format!("chunk {}: {why}", r.index),
        ))
    };
    let Some(c) = read.chunks.first() else {
        return damage(0, "its header is damaged or gone".into());
    };
    if c.header != r.header {
        return damage(
            0,
            "its header is not the one the clean close recorded".into(),
        );
    }
    let end = end_of(r);
    let goes_on = |last: u64| {
        next.is_some_and(|n| {
            let read = scan::scan_range(media, geometry, n..n + 1, &mut Vec::new());
            read.chunks.first().is_some_and(|s| {
                s.run > 0 && s.blocks[0].offset == payload_start() && s.blocks[0].version == last
            })
        })
    };
    match c.stop {
        Stop::End(stop) if stop == end && c.run == c.blocks.len() => {}
        Stop::Invalid(stop)
            if stop == end
                && c.run == c.blocks.len()
                && c.blocks.last().is_some_and(|b| goes_on(b.version)) => {}
        Stop::Invalid(stop) => {
            return damage(
                stop,
                "bytes that are neither a block nor an end mark".into(),
            );
        }
        stop => {
            return damage(
                stop.offset(),
                format!(
                    "its blocks end at offset {} (with {} valid after), not at {end} as the clean close recorded",
                    stop.offset(),
                    c.blocks.len() - c.run
                ),
            );
        }
    }
    let mut book = ChunkBook::default();
    for b in &c.blocks {
        book.add(ChunkBook::of_block(r.index, b, c.entries_of(b)));
    }
    if (book.blocks, book.max_version, book.digest)
        != (r.book.blocks, r.book.max_version, r.book.digest)
    {
        return damage(
            payload_start(),
            "its blocks are not those the clean close recorded (a block was changed or lost)"
                .into(),
        );
    }
    Ok(())
}
