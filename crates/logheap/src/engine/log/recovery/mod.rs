//! Rebuilding the DRAM state from the log ("Log-structured Non-volatile Main Memory",
//! USENIX ATC 2017, §4.5), and telling a torn write from damage.
//!
//! Recovery reads every formatted chunk ([`scan`]), decides what is committed and what
//! may be dropped ([`rules`]), replays the committed transactions in version order
//! ([`replay`]), and only then, once the pool is accepted, erases what it dropped
//! ([`Recovery::repair`]). Nothing is written to a pool it refuses, so a refused pool
//! stays exactly as it was. With more than one thread
//! ([`Config::recovery_threads`](crate::Config::recovery_threads)), the reading and the
//! replay are done map-reduce style by a crew of threads ([`parallel`]), with the same
//! result.
//!
//! # The rules
//!
//! *Committed.* A transaction is committed when every block of it is valid (its CRC, which
//! is seeded with the chunk's index and generation, matches) and each block's peer
//! pointer names a valid block of the same version: the blocks form a closed cycle, so
//! none is missing.
//!
//! *In flight.* A committer appends a transaction to the tails of its log set's logs and
//! fences once; a log set is used by one committer at a time. So a crash can interrupt at
//! most one transaction per log set, and only at the end of that set's logs. Each log's
//! *tail region* is what follows its last committed block: blocks of an uncommitted
//! transaction, bytes that are neither a block nor an end mark (a torn write), a chunk
//! with no block, and blocks of the chunk's generation found after the end of its run
//! of blocks. A torn chunk header (a prefix of a header's words, without the last one)
//! is a new chunk the interrupted transaction was starting.
//!
//! *After a crash* recovery drops, per log set, the one transaction in its tail regions,
//! and reports it ([`RecoveryReport::dropped`]). Everything else invalid is damage, and
//! the pool is refused with [`Error::Corrupt`](crate::Error::Corrupt) naming the offset:
//! a committed block after a tail region (the log is damaged in its middle, not torn at
//! its end), two unfinished transactions in one log set, a damaged chunk header, a log
//! whose chunks do not follow each other, records that contradict each other (a free of
//! something not allocated, overlapping allocations, data outside the home space).
//! Nothing durable can depend on the dropped transaction: its writes were published only
//! after its fence, and a later transaction that freed what it allocated would show up as
//! a free of something not allocated.
//!
//! *After a clean close* nothing can be torn: any tail region, torn header or uncommitted
//! block is damage, and the log must hold exactly what the clean-close record says
//! (transactions, blocks, chunks, largest version). When the close left a sound
//! snapshot with its chunk table ([`snapshot`](super::snapshot)), the open loads it
//! and reads only the chunk headers and each log's last chunk ([`lazy`]); the other
//! chunks are checked later against their records
//! ([`chunk_checks`](super::chunk_checks)), by the same rules. Otherwise the log is read
//! and judged, and a sound snapshot is loaded instead of replaying the log
//! ([`RecoveryReport::snapshot`] says whether it was, or why not).
//!
//! *Moved data* ([`cleaner`](super::cleaner)). The cleaner re-appends the live pieces of
//! a victim chunk, many to a block, as blocks whose version is **the largest version of
//! the source blocks of their pieces** and whose peer pointer is the block itself: each
//! is complete on its own, so the rule above takes it as committed once it is valid.
//! Replaying in version order then maps a moved piece as its original was mapped: the
//! cleaner moves only what the mapping maps, under the STM locks of the range, and only
//! data of versions at most `W` (below every transaction still committing), so no write
//! or free of the piece's bytes has a version between the piece's own and the moved
//! block's (it would have left the piece unmapped), and every later one has a higher
//! version than the moved block and still wins over it. Free records that fold into an
//! allocation checkpoint leave the log with their ranges' data pruned at replay
//! ([`super::checkpoint`]). A crash between the copy and the reclaim leaves both copies,
//! with the same bytes: either may be mapped. The cleaner reclaims a chunk only
//! when all its blocks are at or below the **cleaned-through version** `W` it has made
//! durable in the superblock, and `W` is below every transaction still committing; so
//! blocks of version `W` or lower are committed whatever their peer pointers say (a peer
//! may have been in a reclaimed chunk: 000 §3.4's "peer pointers of moved blocks of
//! committed transactions are ignored"), and a torn transaction is always above `W`.
//!
//! *Chains stay contiguous.* Before a reclaimed chunk's header is erased, the chunk
//! after it in its log is repointed to the chunk before it (one untearable 8-byte
//! store of the header word holding `prev` and the header CRC, fenced:
//! [`ChunkPool::unlink`](super::chunks::ChunkPool::unlink)), so every log is still one
//! chain of exact `prev` links, and a chunk header lost to damage anywhere in a log is
//! a broken chain, as before any cleaning. Only the sequence numbers may then have gaps
//! (they must grow; without gaps while `W` is 0). A crash between the repoint and the
//! erase leaves the victim valid but *off its chain*: the chunk after it names the
//! victim's own predecessor, no chunk names the victim, and all its blocks are at or
//! below `W`. Such an orphan (after a crash only) holds nothing but data the cleaner
//! had moved and made durable before `W`: it is not replayed, and the repair erases
//! it. A changed byte cannot make one (`prev` is under the header CRC).
//!
//! *Peers of blocks at or below `W`.* A block's peer may have been in a reclaimed
//! chunk, so a missing peer is no proof of a torn transaction. It is still damage when
//! the peer's chunk has a valid header of a generation not newer than the block's own
//! chunk: that chunk is the one the peer was written to and was never reclaimed (a
//! chunk reclaimed and taken again gets a newer generation than every chunk of a
//! transaction finished before the reclaim), and the cleaner reclaims whole chunks.
//!
//! What a crash and damage at the very end of a log look alike: after a crash, damage to
//! the last transaction of a log set is indistinguishable from that transaction being
//! torn, and it is dropped (and reported) like one.

#[cfg(test)]
mod equivalence;
mod examine;
mod held;
mod lazy;
mod parallel;
mod replay;
mod rules;
mod scan;

pub(crate) use examine::{Examination, examine};
pub(crate) use lazy::check_chunk;

use super::checkpoint::Seed;
use super::chunk_checks::{ChunkRecord, same_tables};
use super::chunks::{ChunkBook, ChunkGeometry, TailChunk, payload_start};
use super::damage::Damage;
use super::layout::{CHUNK_HEADER, LogKind, block_digest, header_erase_order};
use super::mapping::{AddressMap, Mapping};
use super::snapshot::Snapshot;
use super::superblock::{CloseRecord, Marks, SnapshotLocator};
use crate::alloc::home::HEAP_START;
use crate::alloc::home::HomeAllocator;
use crate::media::Media;

/// What recovery found when the pool was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryReport {
    /// The pool had been closed cleanly (no recovery needed, and none done).
    pub was_clean: bool,
    /// Chunks with a valid header.
    pub chunks_in_use: u64,
    /// Valid blocks read.
    pub blocks: u64,
    /// Committed transactions replayed.
    pub transactions: u64,
    /// Transactions dropped because a crash interrupted their write (at most one per log
    /// set): the length of [`dropped`](Self::dropped).
    pub dropped_transactions: u64,
    /// The transactions dropped.
    pub dropped: Vec<DroppedTransaction>,
    /// Chunks returned to the free pool because they held nothing committed, or were
    /// orphans of an interrupted reclaim (whose data the cleaner had moved).
    pub chunks_reclaimed: u64,
    /// Largest version seen.
    pub max_version: u64,
    /// Whether the mapping and the allocator were loaded from the clean-close snapshot.
    pub snapshot: SnapshotUse,
    /// A repair ([`check::repair`](crate::check::repair)) dropped every transaction of
    /// this version or newer, so that the pool is as it was before its first damage;
    /// `dropped_transactions` counts them.
    pub salvaged_from: Option<u64>,
    /// Chunks in a log that the open did not read: it loaded the clean-close snapshot
    /// and read only the last chunk of each log. Each is checked before anything is
    /// read from it, and by a background scrub (`LogEngineStats::chunks_unchecked`
    /// says how many are left).
    pub chunks_unchecked: u64,
}

/// Whether an open loaded the clean-close snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotUse {
    /// There was none: the pool was not closed cleanly, or its close had no room for one
    /// (or was written by a version without snapshots). The log was replayed.
    #[default]
    None,
    /// The mapping and the allocator were loaded from it, and the log was not
    /// replayed. With its chunk table (the format written now) the open read only the
    /// chunk headers and each log's last chunk, and every other chunk is checked
    /// before it is read and by a background scrub
    /// ([`RecoveryReport::chunks_unchecked`]); without one the whole log was read and
    /// checked first.
    Loaded,
    /// It could not be used, for the reason given; the log was replayed instead.
    Rejected(String),
}

/// A transaction recovery dropped because a crash interrupted its write.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DroppedTransaction {
    /// The log set it was written to, when known.
    pub log_set: Option<u32>,
    /// Its version, when a block of it was readable.
    pub version: Option<u64>,
    /// Pool offset where what was written of it starts.
    pub offset: u64,
}

/// One log of a pool, as `logheap check` and `inspect` show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogSummary {
    /// The log set (one committer's logs).
    pub log_set: u32,
    /// `update`, `allocation` or `deallocation`.
    pub kind: &'static str,
    /// Chunks in the log.
    pub chunks: u64,
    /// Valid transaction blocks.
    pub blocks: u64,
    /// Bytes of the log's data still mapped (not overwritten or freed since).
    pub live_bytes: u64,
}

/// The append position of one log of a previous run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResumedTail {
    pub owner: u32,
    pub kind: LogKind,
    pub tail: TailChunk,
}

/// What recovery decided: the rebuilt state, and the writes that make the log match it.
/// Nothing has been written yet.
#[derive(Debug)]
pub(crate) struct Recovery {
    pub allocator: crate::alloc::home::HomeAllocator,
    /// Formatted chunks in no log (after the repair).
    pub free_chunks: Vec<u32>,
    /// Live bytes per chunk.
    pub live: Vec<i64>,
    pub max_generation: u64,
    pub max_owner: u32,
    /// Where each log of the previous run goes on appending.
    pub tails: Vec<ResumedTail>,
    pub report: RecoveryReport,
    /// What the log holds after the repair: the committed transactions.
    pub in_log: CloseRecord,
    /// The fingerprint of the committed blocks ([`Committed`]).
    pub log_digest: u64,
    /// The committed blocks of each chunk in a log, for the chunk books.
    pub books: Vec<(u32, ChunkBook)>,
    /// The chunks of each log, in order (after the repair), with the log's kind.
    pub chains: Vec<(LogKind, Vec<u32>)>,
    /// Chunks in a log the open did not read, to be checked before they are read.
    pub pending: Vec<ChunkRecord>,
    /// Byte ranges (pool offsets) to zero: what the dropped transactions left.
    erase: Vec<(u64, u64)>,
    /// Chunks whose header is erased: they held nothing committed, or are orphans
    /// (whose data the cleaner had moved).
    reclaim: Vec<u32>,
}

impl RecoveryReport {
    /// The report of what `scan` read and `verdict` judged (no chunk reclaimed yet).
    fn of(was_clean: bool, scan: &scan::Scan, verdict: &rules::Verdict) -> RecoveryReport {
        let dropped_transactions = match verdict.salvage_cut {
            None => verdict.dropped.len() as u64,
            Some(cut) => {
                let mut dropped: Vec<u64> = scan
                    .chunks
                    .iter()
                    .flat_map(|c| c.blocks.iter().map(|b| b.version))
                    .filter(|&v| v >= cut)
                    .collect();
                dropped.sort_unstable();
                dropped.dedup();
                dropped.len() as u64
            }
        };
        RecoveryReport {
            was_clean,
            chunks_in_use: scan.chunks.len() as u64,
            blocks: verdict.blocks,
            transactions: verdict.transactions,
            dropped_transactions,
            dropped: verdict.dropped.clone(),
            chunks_reclaimed: 0,
            max_version: verdict.max_version,
            snapshot: SnapshotUse::None,
            salvaged_from: verdict.salvage_cut,
            chunks_unchecked: 0,
        }
    }
}

/// Most problems collected by one examination (a hostile file could have millions).
const MAX_PROBLEMS: usize = 1000;

/// Log bytes per recovery thread below which an automatic choice ([`threads_for`] of
/// 0) uses fewer threads: starting and meeting threads costs more than it saves on a
/// small log.
const AUTO_BYTES_PER_THREAD: u64 = 4 << 20;

/// The number of distinct versions of the blocks in the log's chunks (the first
/// `formatted`), for the clean-close record: what recovery counts as committed
/// transactions in a log that nothing tore. Reads the whole log (as the next open will);
/// run only when nothing is appended.
pub(crate) fn committed_transactions(
    media: &Media,
    geometry: &ChunkGeometry,
    formatted: u32,
) -> u64 {
    let scan = scan::scan(media, geometry, formatted);
    let mut versions: Vec<u64> = scan
        .chunks
        .iter()
        .flat_map(|c| &c.blocks[..c.run])
        .map(|b| b.version)
        .collect();
    rules::distinct(&mut versions) as u64
}

/// The number of threads to recover `formatted` chunks with: `requested`, or when it is
/// 0, one per core but no more than one per [`AUTO_BYTES_PER_THREAD`] of log.
pub(crate) fn threads_for(requested: usize, geometry: &ChunkGeometry, formatted: u32) -> usize {
    match requested {
        0 => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let log_bytes = formatted as u64 * geometry.size;
            cores.min((log_bytes / AUTO_BYTES_PER_THREAD).max(1) as usize)
        }
        n => n,
    }
}

/// Reads the log and rebuilds `mapping` (empty on entry), the allocator and the chunk
/// state with `threads` threads, writing nothing. `close` is the clean-close record when
/// the pool was closed cleanly; then the mapping and the allocator come from the snapshot
/// that close left (`snapshot`: where it is, if there is one; `Err`: why the locator
/// cannot be used) when it is sound, else from replaying the log. Refuses (with every
/// problem found) when the log is damaged.
pub(crate) fn recover(
    media: &Media,
    geometry: &ChunkGeometry,
    marks: Marks,
    close: Option<CloseRecord>,
    snapshot: Result<Option<SnapshotLocator>, String>,
    mapping: &Mapping,
    (threads, seed, salvage): (usize, Option<&Seed>, bool),
) -> Result<Recovery, Vec<Damage>> {
    // A salvaging open replays the log (the snapshot describes what it drops) on one
    // thread.
    let (snapshot, threads) = match salvage {
        true => (Ok(None), 1),
        false => (snapshot, threads),
    };
    let mut snapshot_use = SnapshotUse::None;
    let mut loaded = None;
    let mut summary = None;
    match (close.as_ref(), snapshot) {
        (None, _) | (Some(_), Ok(None)) => {}
        (Some(_), Err(why)) => snapshot_use = SnapshotUse::Rejected(why),
        (Some(close), Ok(Some(locator))) => {
            // Without reading the log, when the snapshot has a sound chunk table.
            if let Ok(recovery) = lazy::recover(
                media,
                geometry,
                marks,
                close,
                &locator,
                mapping,
                (threads, seed),
            ) {
                return Ok(recovery);
            }
            let (prepared, (scan, verdict, problems)) =
                read_judge_and_prepare(media, geometry, marks, close, &locator, threads);
            if !problems.is_empty() {
                return Err(problems);
            }
            let committed = Committed::of(&scan, &verdict);
            summary = Some(committed);
            // A sound snapshot of this close is a second witness of the log: a log
            // whose fingerprint differs from it was changed while the pool was closed
            // (blocks rewritten with valid checksums of their own), which an open that
            // reads only the chunks it needs would refuse too.
            if let Ok((snapshot, _)) = &prepared
                && (snapshot.log_digest() != committed.digest
                    || snapshot
                        .chunk_records()
                        .is_some_and(|t| !same_tables(&t, &chunk_table(&scan, &verdict))))
            {
                return Err(vec![changed_log(geometry)]);
            }
            match prepared.and_then(|(snapshot, allocator)| {
                load_snapshot(&snapshot, allocator, geometry, &scan, mapping)
            }) {
                Ok(replayed) => {
                    snapshot_use = SnapshotUse::Loaded;
                    loaded = Some((scan, verdict, problems, Some(replayed)));
                }
                Err(why) => snapshot_use = SnapshotUse::Rejected(why),
            }
        }
    }
    let (scan, verdict, problems, replayed) = loaded.unwrap_or_else(|| {
        read_judge_replay(
            media,
            geometry,
            marks,
            close.as_ref(),
            mapping,
            (threads, seed, salvage),
            false,
        )
    });
    if verdict.salvage_cut.is_some() && marks.cleaned > 0 {
        // The cleaner reclaimed chunks: the older data a dropped transaction overwrote
        // (or a moved block carried) may be gone, so dropping cannot give back the pool
        // as it was before the damage.
        return Err(vec![Damage::at(
            geometry.start,
            format!(
                "the cleaner has reclaimed chunks (cleaned through version {}): what the damaged transactions overwrote may be gone with them",
                marks.cleaned
            ),
        )]);
    }
    if let (Some(cut), Some(seed)) = (verdict.salvage_cut, seed)
        && cut <= seed.checkpoint.version
    {
        return Err(vec![Damage::at(
            geometry.start,
            format!(
                "the damage lies before the allocation checkpoint (version {}): dropping from version {cut} on cannot be done without it",
                seed.checkpoint.version
            ),
        )]);
    }
    let Some(replayed) = replayed.filter(|_| problems.is_empty()) else {
        return Err(problems);
    };

    let mut report = RecoveryReport::of(close.is_some(), &scan, &verdict);
    report.snapshot = snapshot_use;
    let mut free_chunks = scan.free.clone();
    // The checkpoint's chunks read as free (their header line is zero) but are not.
    if let Some(seed) = seed {
        free_chunks.retain(|c| !seed.chunks.contains(c));
    }
    let mut erase = Vec::new();
    let mut reclaim: Vec<u32> = scan.torn_headers.iter().map(|t| t.index).collect();
    reclaim.extend(verdict.orphans.iter().map(|&ci| scan.chunks[ci].index));
    if verdict.salvage_cut.is_some() {
        // A damaged header: the chunk is in no log any more.
        reclaim.extend(&scan.damaged_headers);
    }
    let mut tails = Vec::new();
    let mut chains = Vec::new();
    for log in &verdict.logs {
        // Chunks from the tail region on are dropped when they hold nothing committed;
        // the log resumes after its last committed block.
        let (keep, resume_at) = match log.tail {
            None => (log.chunks.len(), None),
            Some((pos, offset)) if offset > payload_start() => (pos + 1, Some(offset)),
            Some((pos, _)) => (pos, None),
        };
        reclaim.extend(log.chunks[keep..].iter().map(|&ci| scan.chunks[ci].index));
        chains.push((
            log.kind,
            log.chunks[..keep]
                .iter()
                .map(|&ci| scan.chunks[ci].index)
                .collect::<Vec<u32>>(),
        ));
        let Some(&last) = keep.checked_sub(1).and_then(|k| log.chunks.get(k)) else {
            continue;
        };
        let ch = &scan.chunks[last];
        let offset = resume_at.unwrap_or(ch.stop.offset());
        let chunk_at = geometry.offset(ch.index);
        // After a crash the rest of the chunk the log resumes in is erased even when
        // the log ends in an end mark: a commit the crash interrupted may have left
        // some of its cache lines there (lines persist independently; the one with
        // the block's start may be the one that did not), and such bytes past the end
        // would later read as torn data after a zeroed chunk's end.
        let erase_rest = resume_at.is_some() || close.is_none();
        if erase_rest && (offset as u64) < geometry.size {
            erase.push((chunk_at + offset as u64, chunk_at + geometry.size));
        }
        tails.push(ResumedTail {
            owner: log.owner,
            kind: log.kind,
            tail: TailChunk {
                chunk: ch.index,
                generation: ch.header.generation,
                seq: ch.header.seq,
                offset,
                // The repair zeroes the rest of a chunk whose tail it erases.
                zero_rest: erase_rest,
            },
        });
    }
    report.chunks_reclaimed = reclaim.len() as u64;
    free_chunks.extend(&reclaim);
    let committed = summary.unwrap_or_else(|| Committed::of(&scan, &verdict));
    let in_log = CloseRecord {
        max_version: committed.max_version,
        transactions: verdict.transactions,
        blocks: committed.blocks,
        chunks_in_use: (scan.chunks.len() - (reclaim.len() - scan.torn_headers.len())) as u64,
    };
    let max_generation = scan.chunks.iter().map(|c| c.header.generation).max();
    let max_owner = scan.chunks.iter().map(|c| c.header.owner).max();
    let books = scan
        .chunks
        .iter()
        .filter(|c| !reclaim.contains(&c.index))
        .map(|c| (c.index, book_of(c, &verdict)))
        .collect();
    Ok(Recovery {
        allocator: replayed.allocator,
        free_chunks,
        live: replayed.live,
        max_generation: max_generation.unwrap_or(0),
        max_owner: max_owner.unwrap_or(0),
        tails,
        report,
        in_log,
        log_digest: committed.digest,
        books,
        chains,
        pending: Vec::new(),
        erase,
        reclaim,
    })
}

impl Recovery {
    /// Makes the log match the recovered state, durably: erases what the dropped
    /// transactions left (so no later open meets it again, and no later append can bring
    /// it back into view) and the headers of chunks that held nothing committed. A crash
    /// in the middle leaves a log that recovers the same way.
    pub(crate) fn repair(&self, media: &Media, geometry: &ChunkGeometry) {
        let mut wrote = false;
        let mut buf = vec![0u8; geometry.size as usize];
        for &(start, end) in &self.erase {
            let rest = &mut buf[..(end - start) as usize];
            media.read(start as usize, rest);
            for (i, piece) in rest.chunks(64).enumerate() {
                if piece.iter().any(|&b| b != 0) {
                    let at = start as usize + i * 64;
                    media.write(at, &[0u8; 64][..piece.len()]);
                    media.flush(at, piece.len());
                    wrote = true;
                }
            }
        }
        for &c in &self.reclaim {
            let at = geometry.offset(c) as usize;
            for word in header_erase_order() {
                media.write_u64(at + word, 0);
            }
            media.flush(at, CHUNK_HEADER);
            wrote = true;
        }
        if wrote {
            media.fence();
        }
    }
}

/// The record of every chunk in a log as read (what a clean close's chunk table holds):
/// its header and the book of its committed blocks.
fn chunk_table(scan: &scan::Scan, verdict: &rules::Verdict) -> Vec<ChunkRecord> {
    scan.chunks
        .iter()
        .map(|c| ChunkRecord {
            index: c.index,
            header: c.header,
            book: book_of(c, verdict),
        })
        .collect()
}

/// The book of chunk `c`'s committed blocks.
fn book_of(c: &scan::ScannedChunk, verdict: &rules::Verdict) -> ChunkBook {
    let mut book = ChunkBook::default();
    for b in &c.blocks {
        if !verdict.uncommitted.contains(&b.version) {
            book.add(ChunkBook::of_block(c.index, b, c.entries_of(b)));
        }
    }
    book
}

/// Why a snapshot whose log fingerprint does not match is not loaded.
const STALE_LOG: &str = "the log is not the one the snapshot was written for";

/// The damage of a cleanly closed log that is not what its sound clean-close snapshot
/// recorded (the fingerprint of its blocks, or its chunk table, differs).
fn changed_log(geometry: &ChunkGeometry) -> Damage {
    Damage::at(
        geometry.start,
        "the log is not what the clean close left (its blocks or chunk headers differ from what the clean-close snapshot recorded): it was changed since"
            .into(),
    )
}

/// The committed blocks of a log as read: how many, their largest version, and the
/// log's fingerprint (the XOR of their [`block_digest`]s), taken in one pass.
#[derive(Debug, Clone, Copy)]
struct Committed {
    blocks: u64,
    max_version: u64,
    digest: u64,
}

impl Committed {
    fn of(scan: &scan::Scan, verdict: &rules::Verdict) -> Committed {
        let mut out = Committed {
            blocks: 0,
            max_version: 0,
            digest: 0,
        };
        let committed = scan
            .chunks
            .iter()
            .enumerate()
            .filter(|&(ci, _)| verdict.replays_chunk(ci))
            .flat_map(|(_, c)| c.blocks.iter().map(move |b| (c.index, b)))
            .filter(|(_, b)| {
                verdict.uncommitted.is_empty() || !verdict.uncommitted.contains(&b.version)
            });
        for (chunk, b) in committed {
            out.blocks += 1;
            out.max_version = out.max_version.max(b.version);
            out.digest ^= block_digest(chunk, b.offset, b.crc);
        }
        out
    }
}

/// Removes from `mapping` what lies in the heap outside every allocation of
/// `allocations` (sorted, disjoint), adjusting the live bytes per chunk: after replay
/// from a checkpoint, the data of ranges freed at or below its version, whose free
/// records left the log with it.
fn prune(
    mapping: &Mapping,
    allocations: &[(u64, u64)],
    geometry: &ChunkGeometry,
    live: &mut [i64],
) {
    let mut pieces = Vec::new();
    mapping.for_each_piece(|p| pieces.push((p.home, p.home + p.len)));
    pieces.sort_unstable();
    let mut outside = Vec::new();
    let mut k = 0;
    for (start, end) in pieces {
        let mut s = start.max(HEAP_START);
        while k < allocations.len() && allocations[k].0 + allocations[k].1 <= s {
            k += 1;
        }
        let mut j = k;
        while s < end {
            match allocations.get(j) {
                Some(&(a, len)) if a < end => {
                    if a > s {
                        outside.push((s, a - s));
                    }
                    s = s.max(a + len);
                    j += 1;
                }
                _ => {
                    outside.push((s, end - s));
                    break;
                }
            }
        }
    }
    for (home, len) in outside {
        mapping.remove(home, len, &mut |log: u64, n: u64| {
            if let Some(l) = live.get_mut(geometry.chunk_of(log) as usize) {
                *l -= n as i64;
            }
        });
    }
}

/// The log as read and judged, and the problems found.
type Judged = (scan::Scan, rules::Verdict, Vec<Damage>);
/// A snapshot read, and the allocator rebuilt from it; or why it cannot be used.
type Prepared = Result<(Snapshot, HomeAllocator), String>;

/// Reads and judges the log, and meanwhile (on a thread of its own, when there are
/// several) reads the snapshot at `locator` and rebuilds the allocator from it: the
/// snapshot's part fails if it is damaged, was written at another close than `close`, or
/// holds allocations that cannot all be true.
fn read_judge_and_prepare(
    media: &Media,
    geometry: &ChunkGeometry,
    marks: Marks,
    close: &CloseRecord,
    locator: &SnapshotLocator,
    threads: usize,
) -> (Prepared, Judged) {
    let prepare = || {
        let snapshot = Snapshot::read(media, geometry, locator)?;
        if snapshot.record() != *close {
            return Err("the snapshot was written at another close".to_string());
        }
        let allocator = HomeAllocator::rebuild(snapshot.allocations())
            .map_err(|e| format!("the snapshot's allocations are inconsistent: {e:?}"))?;
        Ok((snapshot, allocator))
    };
    // The reading gets the threads but the preparing one.
    let readers = threads.saturating_sub(1).max(1);
    beside(threads, prepare, || {
        read_judge(media, geometry, marks, Some(close), readers, false)
    })
}

/// Runs `helper` on a thread of its own beside `main` when `threads` allows two, else
/// one after the other.
fn beside<H: Send, M>(
    threads: usize,
    helper: impl FnOnce() -> H + Send,
    main: impl FnOnce() -> M,
) -> (H, M) {
    if threads < 2 {
        return (helper(), main());
    }
    std::thread::scope(|s| {
        let helping = s.spawn(helper);
        let m = main();
        let h = helping
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (h, m)
    })
}

/// Loads `snapshot` (written for the log just read, `scan`: its fingerprint was
/// checked) into the empty `mapping`, after checking that its pieces agree with the
/// log; returns the state as replay would have, with `allocator` (rebuilt from the
/// snapshot). Nothing is loaded when they do not agree.
fn load_snapshot(
    snapshot: &Snapshot,
    allocator: HomeAllocator,
    geometry: &ChunkGeometry,
    scan: &scan::Scan,
    mapping: &Mapping,
) -> Result<replay::Replayed, String> {
    let mut run_end = vec![None; geometry.count as usize];
    for c in &scan.chunks {
        run_end[c.index as usize] = Some(geometry.offset(c.index) + c.stop.offset() as u64);
    }
    let mut live = vec![0i64; geometry.count as usize];
    snapshot.check_pieces(
        geometry,
        |c| run_end.get(c as usize).copied().flatten(),
        // Inside a chunk in a log: checked.
        |p| live[geometry.chunk_of(p.log) as usize] += p.len as i64,
    )?;
    mapping.load_sorted(snapshot.pieces())?;
    Ok(replay::Replayed { allocator, live })
}

/// Reads the log (with `threads` threads) and judges it, without replaying it.
fn read_judge(
    media: &Media,
    geometry: &ChunkGeometry,
    marks: Marks,
    close: Option<&CloseRecord>,
    threads: usize,
    salvage: bool,
) -> Judged {
    let mut scan = if threads > 1 {
        let batches = scan::Batches::new(geometry, marks.formatted, threads);
        std::thread::scope(|s| {
            for _ in 1..threads.min(parallel::MAX_THREADS) {
                s.spawn(|| batches.take(media, geometry));
            }
            batches.take(media, geometry);
        });
        batches.merge()
    } else {
        scan::scan(media, geometry, marks.formatted)
    };
    let scan_problems = std::mem::take(&mut scan.problems);
    let (verdict, problems) = judge(geometry, marks, close, &scan, scan_problems, salvage);
    (scan, verdict, problems)
}

/// Reads the log, judges it and, when nothing is wrong or `replay_anyway`, replays the
/// committed transactions into `mapping`, starting from the allocation checkpoint
/// `seed` if there is one: on this thread alone when `threads` is 1 or the open
/// salvages, else with a crew of threads ([`parallel`]), with the same result. After
/// replay from a checkpoint, what lies outside every final allocation is pruned from
/// the mapping ([`prune`]).
fn read_judge_replay(
    media: &Media,
    geometry: &ChunkGeometry,
    marks: Marks,
    close: Option<&CloseRecord>,
    mapping: &Mapping,
    (threads, seed, salvage): (usize, Option<&Seed>, bool),
    replay_anyway: bool,
) -> (
    scan::Scan,
    rules::Verdict,
    Vec<Damage>,
    Option<replay::Replayed>,
) {
    let checkpoint = seed.map(|s| s.checkpoint.clone());
    let (scan, verdict, problems, mut replayed) = if threads > 1 && !salvage {
        let judged = |scan: &scan::Scan, problems| {
            let (mut verdict, problems) = judge(geometry, marks, close, scan, problems, false);
            verdict.seed = checkpoint.clone();
            (verdict, problems)
        };
        parallel::recover(
            media,
            geometry,
            marks.formatted,
            mapping,
            (threads, checkpoint.as_deref()),
            judged,
            replay_anyway,
        )
    } else {
        let (scan, mut verdict, mut problems) =
            read_judge(media, geometry, marks, close, 1, salvage);
        verdict.seed = checkpoint;
        let replayed = (replay_anyway || problems.is_empty())
            .then(|| replay::replay(media, geometry, &scan, &verdict, mapping, &mut problems));
        (scan, verdict, problems, replayed)
    };
    if let Some(r) = replayed.as_mut().filter(|_| seed.is_some()) {
        prune(mapping, &r.allocator.allocations(), geometry, &mut r.live);
    }
    (scan, verdict, problems, replayed)
}

/// Applies the rules to what was read (whose own problems, taken out of it, are
/// `scan_problems`), including the bounds on what a log can reach. Returns the verdict
/// and every problem found.
fn judge(
    geometry: &ChunkGeometry,
    marks: Marks,
    close: Option<&CloseRecord>,
    scan: &scan::Scan,
    mut scan_problems: Vec<Damage>,
    salvage: bool,
) -> (rules::Verdict, Vec<Damage>) {
    let mut problems = Vec::new();
    if marks.formatted > geometry.count {
        problems.push(Damage::at(
            geometry.start,
            format!(
                "the superblock says {} chunks are formatted, but the pool has {}",
                marks.formatted, geometry.count
            ),
        ));
    }
    let mut verdict = rules::judge(scan, geometry, close, marks.cleaned);
    if salvage && !(scan_problems.is_empty() && verdict.problems.is_empty()) {
        let mut found = scan_problems.clone();
        found.extend(verdict.problems.iter().cloned());
        if let Some(cut) = rules::salvage_cut(scan, geometry, &verdict, &found) {
            verdict = rules::judge_with(scan, geometry, close, marks.cleaned, Some(cut));
            verdict.salvage_cut = Some(cut);
            // The chunks with damaged headers are reclaimed.
            scan_problems.clear();
        }
    }
    problems.append(&mut scan_problems);
    problems.append(&mut verdict.problems);
    let limit = |what: &str, value: u64, max: u64| {
        (value > max).then(|| {
            Damage::at(
                geometry.start,
                format!("{what} {value} is beyond what a log can reach ({max})"),
            )
        })
    };
    let max_generation = scan.chunks.iter().map(|c| c.header.generation).max();
    let max_owner = scan.chunks.iter().map(|c| c.header.owner).max();
    problems.extend(
        [
            limit(
                "a chunk generation",
                max_generation.unwrap_or(0),
                u64::MAX >> 2,
            ),
            limit(
                "a log-set id",
                max_owner.unwrap_or(0) as u64,
                u32::MAX as u64 - 1,
            ),
            limit("a transaction version", verdict.max_version, u64::MAX >> 3),
            limit("the cleaned-through version", marks.cleaned, u64::MAX >> 3),
        ]
        .into_iter()
        .flatten(),
    );
    problems.truncate(MAX_PROBLEMS);
    (verdict, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::log::layout::{ChunkHeader, EntryRef, HOME_LIMIT, encode_block};
    use crate::engine::log::mapping::MappingConfig;
    use crate::media::{MediaConfig, SimConfig};

    fn recovered_geometry() -> ChunkGeometry {
        ChunkGeometry {
            start: 0,
            size: 4096,
            count: 2,
        }
    }

    /// A pool whose only chunk holds one checksum-valid block with `entries`.
    fn recover_block(kind: LogKind, entries: &[EntryRef<'_>]) -> Result<Recovery, Vec<Damage>> {
        recover_block_then(kind, entries, |_| {}).0
    }

    /// [`recover_block`] with `change` made to the media before recovery, which is
    /// returned too.
    fn recover_block_then(
        kind: LogKind,
        entries: &[EntryRef<'_>],
        change: impl FnOnce(&Media),
    ) -> (Result<Recovery, Vec<Damage>>, Media) {
        let geometry = recovered_geometry();
        let media = Media::sim(8192, &MediaConfig::default(), SimConfig::default()).unwrap();
        let header = ChunkHeader {
            kind,
            zeroed: false,
            owner: 1,
            generation: 5,
            prev: None,
            seq: 0,
        };
        media.write(0, &header.encode());
        let mut block = Vec::new();
        encode_block(&mut block, 0, 5, 9, 64, entries.iter().copied());
        media.write(64, &block);
        change(&media);
        let marks = Marks {
            generation: 0,
            formatted: 2,
            cleaned: 0,
        };
        let recovered = recover(
            &media,
            &geometry,
            marks,
            None,
            Ok(None),
            &Mapping::new(MappingConfig::FULL),
            (1, None, false),
        );
        (recovered, media)
    }

    /// After a crash, bytes past the end mark of the chunk a log resumes in (what an
    /// interrupted commit's later cache lines left) are erased, and the log resumes
    /// there knowing the rest of the chunk is zeros.
    #[test]
    fn after_a_crash_the_rest_of_the_chunk_a_log_resumes_in_is_erased() {
        let data = [7u8; 40];
        let recovered = recover_block_then(
            LogKind::Update,
            &[EntryRef {
                home: 1 << 20,
                tombstone: false,
                data: &data,
            }],
            |media| media.write(1024, &[0xAB; 48]),
        );
        let (recovered, media) = recovered;
        let recovered = recovered.expect("a crashed log with stray bytes past its end opens");
        let tail = recovered.tails[0].tail;
        assert!(tail.zero_rest);
        assert!(tail.offset < 1024);
        recovered.repair(&media, &recovered_geometry());
        let mut rest = vec![0u8; 4096 - tail.offset as usize];
        media.read(tail.offset as usize, &mut rest);
        assert!(rest.iter().all(|&b| b == 0), "stray bytes left");
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
            // Two allocations that overlap.
            (
                LogKind::Alloc,
                vec![
                    EntryRef {
                        home: 1 << 20,
                        tombstone: true,
                        data: &eight,
                    },
                    EntryRef {
                        home: (1 << 20) + 4,
                        tombstone: true,
                        data: &eight,
                    },
                ],
            ),
            // Initial data outside the allocation it follows.
            (
                LogKind::Alloc,
                vec![
                    EntryRef {
                        home: 1 << 20,
                        tombstone: true,
                        data: &eight,
                    },
                    EntryRef {
                        home: 1 << 20,
                        tombstone: false,
                        data: &data,
                    },
                ],
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
