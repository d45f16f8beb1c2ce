//! Log sets ([`LogSet`]: one committer's four logs), and appending a transaction to
//! its log set ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §4.2): the
//! entries of each log are packed into transaction blocks, splitting an entry where a
//! chunk ends and continuing in a new chunk; all blocks of the transaction, in all four
//! logs, are linked into one cycle by their peer pointers. Blocks, the end mark after
//! the last block in each chunk, and new chunk headers are written with non-temporal
//! stores and made durable by a single fence.

use super::chunks::{ChunkBook, ChunkGeometry, ChunkPool, TailChunk, TakenChunk, payload_start};
use super::commit_data::{Placed, Staged};
use super::layout::{
    ChunkHeader, END_MARK, ENTRY_HEADER, LogKind, MAX_BLOCK_ENTRIES, PREAMBLE, block_digest,
    block_size, encode_block, stored_crc,
};
use crate::media::Media;

/// Entries shorter than this are moved whole to the next chunk rather than split.
const MIN_SPLIT: usize = 64;

/// The pool has no free chunk for the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfChunks {
    /// Free chunks the transaction needs at least (those it had taken when it found
    /// none, and one more).
    pub needed: u64,
}

#[derive(Debug)]
struct PlannedBlock {
    kind: LogKind,
    chunk: u32,
    generation: u64,
    offset: u32,
    /// The rest of the chunk after the block is known to be zero.
    zero_rest: bool,
    new_header: Option<ChunkHeader>,
    /// The block's entries: `Plan::entries[first..first + count]`, holding `data` bytes.
    first: usize,
    count: usize,
    data: usize,
}

impl PlannedBlock {
    fn size(&self) -> usize {
        block_size(self.count, self.data)
    }
}

/// What planning a transaction produces; kept in its log set and reused.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    blocks: Vec<PlannedBlock>,
    /// Entries of all blocks, block after block (split entries in their parts).
    entries: Vec<Staged>,
    /// Chunks taken from the pool.
    taken: Vec<TakenChunk>,
    /// Each block's share of the log's fingerprint.
    digests: Vec<u64>,
}

/// The append position of one log.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LogTail {
    /// Current chunk, its generation and sequence number in the log, and the offset of
    /// the next block within it.
    pub current: Option<TailChunk>,
}

/// One committer's four logs (update, allocation, deallocation, initial data). A committing
/// transaction checks a log set out, so concurrent commits append to different logs.
#[derive(Debug)]
pub(crate) struct LogSet {
    pub id: u32,
    pub tails: [LogTail; 4],
    /// Where blocks are encoded before they are written (reused by every commit).
    pub scratch: Vec<u8>,
    /// Where commits are planned (reused by every commit).
    pub plan: Plan,
}

/// The log sets of a pool that no thread holds now (see [`HeldLogSet`]).
pub(crate) type FreeLogSets = std::sync::Mutex<Vec<LogSet>>;

/// A log set a committing thread keeps from one of its transactions to the next, so a
/// commit takes no pool-wide lock to find its logs. It goes back to its pool's free
/// sets when the thread lets it go: when it commits on another pool, or ends (its
/// transaction state is dropped), so no set's tail chunks are left unsealed for good.
#[derive(Debug)]
pub(crate) struct HeldLogSet {
    set: Option<LogSet>,
    home: std::sync::Weak<FreeLogSets>,
}

impl HeldLogSet {
    /// `set`, held for the pool whose free sets are `home`.
    pub(crate) fn new(set: LogSet, home: &std::sync::Arc<FreeLogSets>) -> HeldLogSet {
        HeldLogSet {
            set: Some(set),
            home: std::sync::Arc::downgrade(home),
        }
    }

    /// The set, if it belongs to the pool whose free sets are `home` (else it goes
    /// back to its own pool, if that is still open).
    pub(crate) fn take_for(mut self, home: &std::sync::Arc<FreeLogSets>) -> Option<LogSet> {
        if std::ptr::eq(self.home.as_ptr(), std::sync::Arc::as_ptr(home)) {
            self.set.take()
        } else {
            None
        }
    }
}

impl Drop for HeldLogSet {
    fn drop(&mut self) {
        if let (Some(set), Some(home)) = (self.set.take(), self.home.upgrade()) {
            crate::sync::lock(&home).push(set);
        }
    }
}

impl LogSet {
    /// Log set `id`, whose logs have no chunk yet.
    pub(crate) fn new(id: u32) -> LogSet {
        LogSet {
            id,
            tails: [LogTail::default(); 4],
            scratch: Vec::new(),
            plan: Plan::default(),
        }
    }

    /// The header of chunk `taken` when it follows `tail` in log `kind`.
    pub(crate) fn next_header(
        &self,
        kind: LogKind,
        tail: Option<TailChunk>,
        taken: &TakenChunk,
    ) -> ChunkHeader {
        ChunkHeader {
            kind,
            zeroed: taken.zero_payload,
            owner: self.id,
            generation: taken.generation,
            prev: tail.map(|t| t.chunk),
            seq: tail.map_or(0, |t| t.seq + 1),
        }
    }
}

/// Appends transactions to log sets on one media.
pub(crate) struct LogWriter<'e> {
    pub media: &'e Media,
    pub geometry: &'e ChunkGeometry,
    pub pool: &'e ChunkPool,
}

/// Ends appends to `t`'s chunk (its written part already ends in an end mark).
fn seal(geometry: &ChunkGeometry, t: &mut TailChunk) {
    t.offset = geometry.size as u32;
}

impl LogWriter<'_> {
    /// Plans one log's blocks, advancing `tail`; new chunks and seals go into `plan`.
    fn plan_log(
        &self,
        kind: LogKind,
        set: &LogSet,
        tail: &mut Option<TailChunk>,
        entries: &[Staged],
        plan: &mut Plan,
    ) -> Result<(), OutOfChunks> {
        let (geometry, pool) = (self.geometry, self.pool);
        let chunk_size = geometry.size as usize;
        let mut block: Option<PlannedBlock> = None;
        let mut new_header: Option<ChunkHeader> = None;
        let close = |block: &mut Option<PlannedBlock>,
                     tail: &mut Option<TailChunk>,
                     out: &mut Vec<PlannedBlock>| {
            if let Some(b) = block.take() {
                if let Some(t) = tail.as_mut() {
                    t.offset += b.size() as u32;
                }
                out.push(b);
            }
        };
        for entry in entries {
            let mut e = *entry;
            loop {
                if block.is_none() {
                    let need = block_size(1, e.len.min(MIN_SPLIT));
                    let fits = tail.is_some_and(|t| t.offset as usize + need <= chunk_size);
                    if !fits {
                        let taken = pool.take().ok_or(OutOfChunks {
                            needed: plan.taken.len() as u64 + 1,
                        })?;
                        plan.taken.push(taken);
                        if let Some(t) = tail {
                            seal(geometry, t);
                        }
                        let header = set.next_header(kind, *tail, &taken);
                        *tail = Some(TailChunk {
                            chunk: taken.chunk,
                            generation: taken.generation,
                            seq: header.seq,
                            offset: payload_start(),
                            zero_rest: taken.zero_payload,
                        });
                        new_header = Some(header);
                    }
                    let t = tail.expect("a tail chunk was just ensured");
                    block = Some(PlannedBlock {
                        kind,
                        chunk: t.chunk,
                        generation: t.generation,
                        offset: t.offset,
                        zero_rest: t.zero_rest,
                        new_header: new_header.take(),
                        first: plan.entries.len(),
                        count: 0,
                        data: 0,
                    });
                }
                let b = block.as_mut().expect("a block was just opened");
                let room = chunk_size - b.offset as usize;
                let (n, data) = (b.count, b.data);
                if n < MAX_BLOCK_ENTRIES && block_size(n + 1, data + e.len) <= room {
                    plan.entries.push(e);
                    b.count += 1;
                    b.data += e.len;
                    break;
                }
                if n >= MAX_BLOCK_ENTRIES {
                    // The block is full by count; a new block may still fit in this chunk.
                    close(&mut block, tail, &mut plan.blocks);
                    continue;
                }
                // Out of room: split the entry if a useful part fits, then go to a new chunk
                // (a new block here would only have less room than this one had).
                let fixed = PREAMBLE + (n + 1) * ENTRY_HEADER + data;
                let split = room.saturating_sub(fixed);
                if !e.tombstone && split >= MIN_SPLIT && split < e.len {
                    plan.entries.push(Staged { len: split, ..e });
                    b.count += 1;
                    b.data += split;
                    e = Staged {
                        home: e.home + split as u64,
                        tombstone: false,
                        at: e.at + split,
                        len: e.len - split,
                    };
                }
                close(&mut block, tail, &mut plan.blocks);
                if let Some(t) = tail.as_mut() {
                    seal(geometry, t);
                }
            }
        }
        close(&mut block, tail, &mut plan.blocks);
        Ok(())
    }

    /// Writes one transaction's staged entries (per log, in [`LogKind`] order; their
    /// bytes in `staging`) at `version` and makes them durable with
    /// one fence. Puts where each data
    /// entry's bytes went into `placed` (cleared first) and returns the number of blocks
    /// written and their share of the log's fingerprint
    /// ([`block_digest`](super::layout::block_digest)). On [`OutOfChunks`] nothing was
    /// written and the log set is unchanged.
    pub(crate) fn append(
        &self,
        set: &mut LogSet,
        logs: [&[Staged]; 4],
        staging: &[u8],
        version: u64,
        placed: &mut Vec<Placed>,
    ) -> Result<(usize, u64), OutOfChunks> {
        let (media, geometry, pool) = (self.media, self.geometry, self.pool);
        let mut tails = set.tails.map(|t| t.current);
        let mut plan = std::mem::take(&mut set.plan);
        plan.blocks.clear();
        plan.entries.clear();
        plan.taken.clear();
        plan.digests.clear();
        placed.clear();
        for kind in LogKind::ALL {
            let entries = logs[kind.index()];
            if entries.is_empty() {
                continue;
            }
            let tail = &mut tails[kind.index()];
            if let Err(e) = self.plan_log(kind, set, tail, entries, &mut plan) {
                pool.give_back(plan.taken.drain(..).map(|t| t.chunk));
                set.plan = plan;
                return Err(e);
            }
        }
        let blocks = &plan.blocks;
        let mut digest = 0;
        let address = |b: &PlannedBlock| geometry.offset(b.chunk) + b.offset as u64;
        for (i, b) in blocks.iter().enumerate() {
            let chunk_at = geometry.offset(b.chunk);
            if let Some(h) = &b.new_header {
                media.write_nt(chunk_at as usize, &h.encode());
            }
            let at = address(b);
            let peer = address(&blocks[(i + 1) % blocks.len()]);
            let entries = &plan.entries[b.first..b.first + b.count];
            encode_block(
                &mut set.scratch,
                b.chunk,
                b.generation,
                version,
                peer,
                entries.iter().map(|s| s.entry(staging)),
            );
            // The last block of the commit in a chunk is followed by an end mark, unless
            // it fills the chunk or the rest of the chunk is zeros. (The blocks of one log
            // are planned in order, and logs never share a chunk.)
            let last_in_chunk = blocks.get(i + 1).is_none_or(|n| n.chunk != b.chunk);
            let end = b.offset as usize + set.scratch.len();
            if last_in_chunk && !b.zero_rest && end + END_MARK <= geometry.size as usize {
                set.scratch.extend_from_slice(&[0u8; END_MARK]);
            }
            let d = block_digest(b.chunk, b.offset, stored_crc(&set.scratch));
            plan.digests.push(d);
            digest ^= d;
            media.write_nt(at as usize, &set.scratch);
            let mut data_at = at + PREAMBLE as u64;
            for e in entries {
                data_at += ENTRY_HEADER as u64;
                if !e.tombstone {
                    placed.push(Placed {
                        kind: b.kind,
                        home: e.home,
                        len: e.len as u64,
                        log: data_at,
                    });
                }
                data_at += e.len as u64;
            }
        }
        media.fence();
        // The blocks are durable: book them, and let the cleaner have the chunks no log
        // appends to any more.
        for (b, &d) in plan.blocks.iter().zip(&plan.digests) {
            let end = b.offset + b.size() as u32;
            let book = ChunkBook::block(version, d, end, b.count as u64, b.data as u64);
            pool.record_book(b.chunk, book);
            if let Some(h) = &b.new_header {
                pool.link(h.prev, b.chunk, h.kind);
            }
        }
        for kind in LogKind::ALL {
            let (old, new) = (set.tails[kind.index()].current, tails[kind.index()]);
            if let Some(old) = old.filter(|o| new.is_none_or(|n| n.chunk != o.chunk)) {
                pool.seal(old.chunk);
            }
        }
        for t in &plan.taken {
            if !tails.iter().flatten().any(|n| n.chunk == t.chunk) {
                pool.seal(t.chunk);
            }
        }
        for kind in LogKind::ALL {
            set.tails[kind.index()].current = tails[kind.index()];
        }
        let count = plan.blocks.len();
        set.plan = plan;
        Ok((count, digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_log_set_goes_back_to_its_own_pool() {
        use std::sync::{Arc, Mutex};
        let a: Arc<FreeLogSets> = Arc::new(Mutex::new(Vec::new()));
        let b: Arc<FreeLogSets> = Arc::new(Mutex::new(Vec::new()));
        // Taken for its own pool: handed over, nothing goes back.
        let set = HeldLogSet::new(LogSet::new(1), &a).take_for(&a).unwrap();
        assert_eq!(set.id, 1);
        assert!(a.lock().unwrap().is_empty());
        // Asked for by another pool: it goes back to its own.
        assert!(HeldLogSet::new(set, &a).take_for(&b).is_none());
        assert_eq!(a.lock().unwrap().len(), 1);
        assert!(b.lock().unwrap().is_empty());
        // Dropped (its thread ended): back to its pool; a closed pool takes nothing.
        drop(HeldLogSet::new(LogSet::new(2), &b));
        assert_eq!(b.lock().unwrap()[0].id, 2);
        let gone = HeldLogSet::new(LogSet::new(3), &b);
        drop(b);
        drop(gone);
    }
}
