//! Allocation checkpoints: how the allocation and deallocation logs leave the pool.
//!
//! The update logs are cleaned chunk by chunk ([`super::cleaner`]): a byte is live while
//! the mapping points to it. Allocation and free records cannot be judged one by one so
//! cheaply: a free record may leave the log only once no older record or data of its
//! range can be found by recovery, and knowing that per record would take a DRAM entry
//! per allocation or a search of the log. Instead (as pMem rebuilds its allocator's
//! DRAM state from a small metadata log, and as "Log-structured Non-volatile Main
//! Memory", USENIX ATC 2017, keeps tombstones only while older copies exist) the records
//! are *folded*: the live allocations as of a version `C` — the previous checkpoint's,
//! with every allocation and free record above its version and at or below `C` applied
//! in version order — are written as a checkpoint, and then the allocation and
//! deallocation chunks whose blocks are all at or below `C` may be reclaimed.
//!
//! The records folded are read from the log itself, not from the allocator (which also
//! holds the allocations of transactions still running): `C` is at most the version up
//! to which every transaction had finished its commit, so every record at or below it
//! is durable and committed.
//!
//! A checkpoint's payload has the clean-close snapshot's format
//! ([`Snapshot`]: no pieces, the allocations, and `C` as the record's largest version),
//! written into chunks in no log; where it is, is in one of two superblock slots that
//! take turns ([`CheckpointSlot`]).

use std::collections::BTreeMap;

use super::chunks::{ChunkGeometry, payload_start};
use super::damage::Damage;
use super::layout::{BlockScan, ChunkHeader, DecodedEntry, LogKind, decode_block, u64_at};
use super::snapshot::Snapshot;
use super::superblock::{CheckpointSlot, CloseRecord};
use crate::media::Media;
use crate::sync::lock;

/// The live allocations (home, size; sorted by home, disjoint) as of `version`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Checkpoint {
    pub version: u64,
    pub allocations: Vec<(u64, u64)>,
}

/// The allocation checkpoint a pool has, as recovery takes it: replay starts from its
/// allocations, and its chunks are in no log but not free.
#[derive(Debug, Clone)]
pub(crate) struct Seed {
    pub checkpoint: std::sync::Arc<Checkpoint>,
    pub chunks: Vec<u32>,
}

/// What an allocation or free record does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum RecordKind {
    /// Within a version frees come first, as replay takes them.
    Free,
    Allocation,
}

/// One allocation or free record read from the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Record {
    pub version: u64,
    pub kind: RecordKind,
    pub home: u64,
    pub len: u64,
}

/// Appends to `out` the records of the committed blocks of version in `(above, up_to]`
/// in `bytes`, the contents of chunk `chunk` whose valid header is `header` (an
/// allocation or deallocation log's). `decoded` is scratch.
pub(crate) fn records_of_chunk(
    bytes: &[u8],
    chunk: u32,
    header: &ChunkHeader,
    (above, up_to): (u64, u64),
    out: &mut Vec<Record>,
    decoded: &mut Vec<DecodedEntry>,
) {
    let kind = match header.kind {
        LogKind::Alloc => RecordKind::Allocation,
        LogKind::Dealloc => RecordKind::Free,
        LogKind::Update | LogKind::Initial => return,
    };
    let mut at = payload_start() as usize;
    decoded.clear();
    while let BlockScan::Block(b) = decode_block(bytes, chunk, header.generation, at, decoded) {
        at = b.end as usize;
        if b.version <= above || b.version > up_to {
            continue;
        }
        for e in b
            .entries_in(decoded)
            .iter()
            .filter(|e| e.tombstone && e.size == 8)
        {
            out.push(Record {
                version: b.version,
                kind,
                home: e.home,
                len: u64_at(bytes, e.data as usize),
            });
        }
    }
}

/// The allocations `previous` (sorted, disjoint) with `records` applied in replay
/// order; an error when they cannot all be true (a free of what is not allocated, an
/// allocation over a live one).
pub(crate) fn fold(
    previous: &[(u64, u64)],
    mut records: Vec<Record>,
) -> Result<Vec<(u64, u64)>, String> {
    records.sort_unstable();
    let mut live: BTreeMap<u64, u64> = previous.iter().copied().collect();
    for r in records {
        match r.kind {
            RecordKind::Free => {
                if live.remove(&r.home) != Some(r.len) {
                    return Err(format!(
                        "free record {:#x}+{} (version {}) of what is not allocated",
                        r.home, r.len, r.version
                    ));
                }
            }
            RecordKind::Allocation => {
                let end = r.home.checked_add(r.len).ok_or("an allocation past 2^64")?;
                let before = live.range(..end).next_back();
                if r.len == 0 || before.is_some_and(|(&s, &l)| s + l > r.home) {
                    return Err(format!(
                        "allocation record {:#x}+{} (version {}) overlaps a live allocation",
                        r.home, r.len, r.version
                    ));
                }
                live.insert(r.home, r.len);
            }
        }
    }
    Ok(live.into_iter().collect())
}

impl Checkpoint {
    /// Its payload: the snapshot format with no pieces, the allocations, and its
    /// version as the record's largest version ([`Snapshot::chunks_needed`] and
    /// [`Snapshot::write`] then place it).
    pub(crate) fn encode(&self) -> Snapshot {
        let record = CloseRecord {
            max_version: self.version,
            ..CloseRecord::default()
        };
        let mut snapshot = Snapshot::new(record, 0);
        for &(home, size) in &self.allocations {
            snapshot.push_allocation(home, size);
        }
        snapshot
    }

    /// Reads the checkpoint `slot` names, with the chunks it is written in; the error
    /// says why it cannot be used.
    pub(crate) fn read(
        media: &Media,
        geometry: &ChunkGeometry,
        slot: &CheckpointSlot,
    ) -> Result<(Checkpoint, Vec<u32>), String> {
        let (snapshot, chunks) = Snapshot::read_with_chunks(media, geometry, &slot.locator)
            .map_err(|e| format!("allocation checkpoint: {e}"))?;
        if snapshot.pieces().next().is_some() || snapshot.record().max_version != slot.version {
            return Err("the allocation checkpoint is not the one its slot names".into());
        }
        let allocations: Vec<(u64, u64)> = snapshot.allocations().collect();
        let mut end = 0;
        for &(home, size) in &allocations {
            match home.checked_add(size) {
                Some(e) if size > 0 && home >= end => end = e,
                _ => {
                    return Err(format!(
                        "the allocation checkpoint's allocation {home:#x}+{size} is empty, unsorted or overlapping"
                    ));
                }
            }
        }
        Ok((
            Checkpoint {
                version: slot.version,
                allocations,
            },
            chunks,
        ))
    }
}

/// The pool's current allocation checkpoint, read and checked: its slot, and the seed
/// recovery starts from. A damaged slot with no valid partner, or a payload that does
/// not check, is damage (the records it folded may have left the log).
pub(crate) fn read_current(
    media: &Media,
    geometry: &ChunkGeometry,
    superblock: &super::superblock::LogSuperblock,
) -> Result<Option<(CheckpointSlot, Seed)>, Damage> {
    let Some(slot) = superblock.read_checkpoint(media)? else {
        return Ok(None);
    };
    let (checkpoint, chunks) = Checkpoint::read(media, geometry, &slot)
        .map_err(|why| Damage::at(superblock.at as u64, why))?;
    Ok(Some((
        slot,
        Seed {
            checkpoint: std::sync::Arc::new(checkpoint),
            chunks,
        },
    )))
}

impl super::LogEngine {
    /// When sealed allocation and deallocation chunks have piled up (at least four, and
    /// as many as the current checkpoint takes) and their space is wanted (free chunks
    /// are below twice the committers' low-water mark, or the records fill an eighth of
    /// the pool), writes a new allocation
    /// checkpoint and reclaims the chunks of those logs whose blocks are all at or below
    /// its version; returns how many. Does nothing when another checkpoint is being
    /// written.
    ///
    /// Order: the records of version in (previous, `C`] are read from the log and folded
    /// onto the previous checkpoint; the new one is written into chunks taken for it and
    /// made durable; its slot is written, and the other slot erased; the cleaned-through
    /// version is raised to `C` (the chunks about to go may hold peers of update blocks);
    /// then the previous checkpoint's chunks are free again, and the chunks it replaces
    /// are reclaimed as the cleaner reclaims any ([`ChunkPool::unlink`]).
    ///
    /// [`ChunkPool::unlink`]: super::chunks::ChunkPool::unlink
    pub(super) fn checkpoint_if_due(&self) -> usize {
        self.write_checkpoint(false)
    }

    /// Writes an allocation checkpoint now if any allocation or deallocation chunk is
    /// sealed, whatever [`checkpoint_if_due`](Self::checkpoint_if_due) would decide
    /// (waiting for a checkpoint being written); returns the chunks it reclaimed.
    pub(super) fn checkpoint_now(&self) -> usize {
        self.write_checkpoint(true)
    }

    fn write_checkpoint(&self, forced: bool) -> usize {
        let mut current = if forced {
            lock(&self.checkpoint)
        } else {
            let Ok(current) = self.checkpoint.try_lock() else {
                return 0;
            };
            current
        };
        let held = current
            .as_ref()
            .map_or(0, |(_, chunks)| chunks.len() as u64);
        let records = self.chunks.sealed_record_chunks();
        // Worth its cost (every live allocation rewritten) only when the space is
        // wanted: free chunks are running low, or the records hold an eighth of the pool.
        let wanted = self.chunks.available() < 2 * self.low_water()
            || records >= self.geometry.count as u64 / 8;
        let due = if forced {
            records > 0
        } else {
            records >= held.max(4) && wanted
        };
        // One that found too few free chunks is tried again once they are there.
        if !due || !self.chunks.checkpoint_fits() {
            return 0;
        }
        let version = self
            .stm
            .committed_through()
            .min(super::superblock::CLEANED_LIMIT);
        let (above, previous) = match &*current {
            Some((slot, _)) => match Checkpoint::read(&self.media, &self.geometry, slot) {
                Ok((previous, _)) => (slot.version, previous.allocations),
                Err(_) => {
                    self.chunks.hold_for_checkpoint(0);
                    return 0;
                }
            },
            None => (0, Vec::new()),
        };
        let size = self.geometry.size as usize;
        let (mut bytes, mut decoded, mut records) = (vec![0u8; size], Vec::new(), Vec::new());
        let mut replaced = Vec::new();
        for c in 0..self.geometry.count {
            if !self.chunks.holds_records(c) {
                continue;
            }
            // Records are folded only from a chunk found as the clean close left it
            // (after an open that did not read the log); a damaged one stops them.
            if !self.chunks.readable(c) {
                self.chunks.hold_for_checkpoint(0);
                return 0;
            }
            let at = self.geometry.offset(c) as usize;
            self.media.read(at, &mut bytes);
            let Some(header) = ChunkHeader::decode(&bytes) else {
                continue;
            };
            records_of_chunk(
                &bytes,
                c,
                &header,
                (above, version),
                &mut records,
                &mut decoded,
            );
            if self.chunks.is_sealed(c) && self.chunks.max_version_in(c) <= version {
                replaced.push(c);
            }
        }
        if replaced.is_empty() {
            return 0;
        }
        let Ok(allocations) = fold(&previous, records) else {
            self.chunks.hold_for_checkpoint(0);
            return 0;
        };
        let checkpoint = Checkpoint {
            version,
            allocations,
        };
        let payload = checkpoint.encode();
        let needed = payload.chunks_needed(&self.geometry);
        let taken: Vec<_> = (0..needed)
            .map_while(|_| self.chunks.take_for_cleaner())
            .collect();
        let chunks: Vec<u32> = taken.iter().map(|t| t.chunk).collect();
        let Some(locator) = (taken.len() == needed)
            .then(|| payload.write(&self.media, &self.geometry, &chunks))
            .flatten()
        else {
            // Too few free chunks: committers leave the next ones alone (cleaning
            // instead) until the checkpoint, which frees more than it takes, fits.
            self.chunks.give_back(chunks);
            self.chunks.hold_for_checkpoint(needed as u64);
            return 0;
        };
        self.chunks.hold_for_checkpoint(0);
        let seq = current
            .as_ref()
            .map_or(1, |(slot, _)| slot.seq.wrapping_add(1));
        let slot = CheckpointSlot {
            seq,
            version,
            locator,
        };
        self.superblock.write_checkpoint(&self.media, &slot);
        self.superblock.erase_other_checkpoint(&self.media, seq);
        self.cleaner
            .checkpoints
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let newest = replaced
            .iter()
            .map(|&c| self.chunks.max_version_in(c))
            .max()
            .unwrap_or(0);
        self.raise_cleaned_through(newest, version);
        if let Some((_, old)) = current.replace((slot, chunks)) {
            self.chunks.give_back(old);
        }
        // Still under the checkpoint's lock: a pass that took it in between would see
        // the replaced chunks as due again and could unlink one already reclaimed and
        // taken by another log.
        let mut reclaimed = 0;
        for c in replaced {
            if self.chunks.unlink(c) {
                self.chunks.release(c, &self.epoch.pin());
                reclaimed += 1;
            }
        }
        drop(current);
        reclaimed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{MediaConfig, SimConfig};

    fn record(version: u64, kind: RecordKind, home: u64, len: u64) -> Record {
        Record {
            version,
            kind,
            home,
            len,
        }
    }

    #[test]
    fn records_fold_in_version_order_onto_the_previous_allocations() {
        use RecordKind::*;
        let previous = [(4096, 64), (8192, 128)];
        // Out of order on purpose; within version 7 the free goes first, so the
        // allocation of the same place is no overlap.
        let records = vec![
            record(7, Allocation, 4096, 32),
            record(5, Allocation, 16384, 16),
            record(7, Free, 4096, 64),
            record(6, Free, 8192, 128),
        ];
        assert_eq!(fold(&previous, records), Ok(vec![(4096, 32), (16384, 16)]));
        assert!(fold(&previous, vec![record(3, Free, 8192, 64)]).is_err());
        assert!(fold(&previous, vec![record(3, Allocation, 4100, 8)]).is_err());
        assert!(fold(&previous, vec![record(3, Allocation, 4000, 100)]).is_err());
    }

    #[test]
    fn a_checkpoint_round_trips_and_must_match_its_slot() {
        let geometry = ChunkGeometry {
            start: 0,
            size: 4096,
            count: 8,
        };
        let media = Media::sim(8 * 4096, &MediaConfig::default(), SimConfig::default()).unwrap();
        let checkpoint = Checkpoint {
            version: 42,
            allocations: (0..4000).map(|k| (4096 + k * 64, 48)).collect(),
        };
        let needed = checkpoint.encode().chunks_needed(&geometry);
        assert!(needed >= 2, "{needed}");
        let chunks: Vec<u32> = (2..2 + needed as u32).collect();
        let locator = checkpoint
            .encode()
            .write(&media, &geometry, &chunks)
            .unwrap();
        let slot = CheckpointSlot {
            seq: 1,
            version: 42,
            locator,
        };
        assert_eq!(
            Checkpoint::read(&media, &geometry, &slot),
            Ok((checkpoint, chunks))
        );
        let other = CheckpointSlot {
            version: 41,
            ..slot
        };
        assert!(Checkpoint::read(&media, &geometry, &other).is_err());
    }
}
