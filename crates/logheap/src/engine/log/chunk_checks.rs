//! Checking a log after an open that did not read it: an open after a clean close loads
//! the snapshot that close left, with a record of every chunk in a log (its header and
//! its book: blocks, largest version, fingerprint share, where its blocks end), and
//! reads none of the log's blocks ("Log-structured Non-volatile Main Memory", §3.5: a
//! restart takes the time of loading the snapshot). Each such chunk is *pending* until
//! its blocks are read and found to be exactly those its record describes: by the
//! first read of data in it (the read waits for the check), by the cleaner before it
//! moves anything out of it, or by the background scrub, which goes through every
//! pending chunk after the open. A chunk whose check fails is *damaged*: every read of
//! data in it fails with [`Error::Corrupt`](crate::Error::Corrupt), the cleaner leaves
//! it alone, and the next clean close records it as it was recorded before (so the
//! damage is found again). Nothing is ever read from a chunk before its check passes,
//! so a damaged log never returns wrong data.
//!
//! A chunk's state only moves from pending to checked or damaged, under the lock the
//! check holds; a chunk that leaves its log (the cleaner or an allocation checkpoint
//! reclaims it: [`ChunkChecks::settle`]) is settled under the same lock first, so a
//! scrub never reads a chunk that is being reused, and its predecessor in its log is
//! checked before it goes (invalid bytes after the predecessor's last block are a lost
//! end mark, not damage, when that block's transaction goes on at the start of the
//! chunk after it: the one leaving). A damaged chunk with live data is never the
//! cleaner's victim; a damaged allocation or deallocation chunk stops allocation
//! checkpoints (their records are never folded from a damaged chunk).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::chunks::{ChunkBook, ChunkGeometry};
use super::damage::Damage;
use super::layout::{ChunkHeader, LogKind};
use super::recovery::check_chunk;
use crate::media::Media;
use crate::sync::lock;

/// What a chunk in a log holds, as a clean close recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkRecord {
    pub index: u32,
    pub header: ChunkHeader,
    pub book: ChunkBook,
}

impl ChunkRecord {
    /// Whether `other` records the same chunk of the same log: all but the entry and
    /// data counts of the book (estimates for the cleaner, unknown in a table an older
    /// version wrote).
    pub(crate) fn same_log(&self, other: &ChunkRecord) -> bool {
        let counts = |r: &ChunkRecord| ChunkRecord {
            book: ChunkBook {
                entries: 0,
                data: 0,
                ..r.book
            },
            ..*r
        };
        counts(self) == counts(other)
    }
}

/// Whether two chunk tables record the same log ([`ChunkRecord::same_log`]).
pub(crate) fn same_tables(a: &[ChunkRecord], b: &[ChunkRecord]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same_log(y))
}

/// Its blocks were read and are those its record describes (or it never needed a
/// check: it was written by this run, or is in no log).
const CHECKED: u8 = 0;
/// Not read since the open.
const PENDING: u8 = 1;
/// Read, and not what its record describes.
const DAMAGED: u8 = 2;

/// What the checks of the pending chunks compare with.
#[derive(Debug, Default)]
struct Expected {
    /// The records of the pending chunks.
    records: HashMap<u32, ChunkRecord>,
    /// The records of the damaged chunks (what they should hold, for the next clean
    /// close's table).
    damaged: HashMap<u32, ChunkRecord>,
    /// Each chunk's successor in its log (the chunk whose header names it as
    /// previous), for the chunks with one: a check needs it to tell a lost end mark
    /// from damage ([`check_chunk`]).
    next: HashMap<u32, u32>,
}

/// The check state of every chunk.
#[derive(Debug)]
pub(crate) struct ChunkChecks {
    state: Box<[AtomicU8]>,
    /// Chunks pending or damaged: while 0, every chunk is readable (one load decides).
    unsettled: AtomicU64,
    pending: AtomicU64,
    damaged: AtomicU64,
    /// The records of the pending chunks; its lock is held while a chunk is checked.
    expected: Mutex<Expected>,
    /// What the checks that failed found, by chunk, in the order found.
    damage: Mutex<Vec<(u32, Damage)>>,
}

impl ChunkChecks {
    /// `count` chunks, all checked.
    pub(crate) fn new(count: u32) -> ChunkChecks {
        ChunkChecks {
            state: (0..count).map(|_| AtomicU8::new(CHECKED)).collect(),
            unsettled: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            damaged: AtomicU64::new(0),
            expected: Mutex::new(Expected::default()),
            damage: Mutex::new(Vec::new()),
        }
    }

    /// Makes the chunks of `records` pending (before the pool is used); `chains` are
    /// the logs' chunks, in order.
    pub(crate) fn expect(
        &self,
        records: impl IntoIterator<Item = ChunkRecord>,
        chains: &[(LogKind, Vec<u32>)],
    ) {
        let mut records = records.into_iter().peekable();
        if records.peek().is_none() {
            // Nothing pending (an open that read the log): no successor is ever asked.
            return;
        }
        let mut expected = lock(&self.expected);
        for (_, chain) in chains {
            for pair in chain.windows(2) {
                expected.next.insert(pair[0], pair[1]);
            }
        }
        for r in records {
            let Some(state) = self.state.get(r.index as usize) else {
                continue;
            };
            if state.swap(PENDING, Ordering::AcqRel) == CHECKED {
                self.pending.fetch_add(1, Ordering::Relaxed);
                self.unsettled.fetch_add(1, Ordering::Release);
            }
            expected.records.insert(r.index, r);
        }
    }

    /// Whether the data in chunk `c` may be read: it is checked, or checking it now
    /// (reading it from `media`) finds it as its record says.
    #[inline]
    pub(crate) fn readable(&self, media: &Media, geometry: &ChunkGeometry, c: u32) -> bool {
        if self.unsettled.load(Ordering::Acquire) == 0 {
            return true;
        }
        match self
            .state
            .get(c as usize)
            .map(|s| s.load(Ordering::Acquire))
        {
            Some(CHECKED) | None => true,
            Some(DAMAGED) => false,
            _ => self.check(media, geometry, c),
        }
    }

    /// Checks chunk `c` if it is pending; whether it is readable.
    #[cold]
    pub(crate) fn check(&self, media: &Media, geometry: &ChunkGeometry, c: u32) -> bool {
        let mut expected = lock(&self.expected);
        let Some(state) = self.state.get(c as usize) else {
            return true;
        };
        match state.load(Ordering::Acquire) {
            CHECKED => return true,
            DAMAGED => return false,
            _ => {}
        }
        let Some(record) = expected.records.remove(&c) else {
            // Pending chunks always have a record; settle as checked if not.
            self.finish(state, CHECKED);
            return true;
        };
        match check_chunk(media, geometry, &record, expected.next.get(&c).copied()) {
            Ok(()) => {
                self.finish(state, CHECKED);
                true
            }
            Err(d) => {
                expected.damaged.insert(c, record);
                lock(&self.damage).push((c, d));
                self.damaged.fetch_add(1, Ordering::Relaxed);
                self.unsettled.fetch_add(1, Ordering::Relaxed);
                self.finish(state, DAMAGED);
                false
            }
        }
    }

    /// Moves a pending chunk to `to` (with the lock of `expected` held).
    fn finish(&self, state: &AtomicU8, to: u8) {
        state.store(to, Ordering::Release);
        self.pending.fetch_sub(1, Ordering::Relaxed);
        self.unsettled.fetch_sub(1, Ordering::Release);
    }

    /// Chunk `c` leaves its log (its data is elsewhere or dead): whatever it held is
    /// never read again, so it needs no check, and it is checked from now on (a log
    /// that takes it again writes it afresh). Waits for a check of it in progress.
    pub(crate) fn settle(&self, c: u32) {
        let Some(state) = self.state.get(c as usize) else {
            return;
        };
        if self.unsettled.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut expected = lock(&self.expected);
        expected.next.remove(&c);
        expected.damaged.remove(&c);
        match state.load(Ordering::Acquire) {
            PENDING => {
                expected.records.remove(&c);
                self.finish(state, CHECKED);
            }
            DAMAGED => {
                state.store(CHECKED, Ordering::Release);
                self.damaged.fetch_sub(1, Ordering::Relaxed);
                self.unsettled.fetch_sub(1, Ordering::Release);
            }
            _ => {}
        }
    }

    /// Repoints chunk `c`'s header to the previous chunk `prev` (`write` does it):
    /// a pending check of `c` expects that previous chunk from then on (and the rest of
    /// the header as recorded), and `c` is `prev`'s successor. A check in progress
    /// finishes first.
    pub(crate) fn repoint(&self, c: u32, prev: Option<u32>, write: impl FnOnce()) {
        if self.unsettled.load(Ordering::Acquire) == 0 {
            return write();
        }
        let mut expected = lock(&self.expected);
        let Expected {
            records, damaged, ..
        } = &mut *expected;
        if let Some(r) = records.get_mut(&c).or(damaged.get_mut(&c)) {
            r.header.prev = prev;
        }
        if let Some(prev) = prev {
            expected.next.insert(prev, c);
        }
        write();
    }

    /// Whether chunk `c`'s check failed.
    pub(crate) fn is_damaged(&self, c: u32) -> bool {
        self.unsettled.load(Ordering::Acquire) != 0
            && self
                .state
                .get(c as usize)
                .is_some_and(|s| s.load(Ordering::Acquire) == DAMAGED)
    }

    /// The header chunk `c` should have when it is pending or damaged (what the clean
    /// close recorded, as its log has changed it since); `None` for a checked chunk.
    pub(crate) fn recorded_header(&self, c: u32) -> Option<ChunkHeader> {
        if self.unsettled.load(Ordering::Acquire) == 0 {
            return None;
        }
        let expected = lock(&self.expected);
        expected
            .records
            .get(&c)
            .or(expected.damaged.get(&c))
            .map(|r| r.header)
    }

    /// The chunks still pending, lowest first (for the scrub).
    pub(crate) fn pending_chunks(&self) -> Vec<u32> {
        let mut out: Vec<u32> = lock(&self.expected).records.keys().copied().collect();
        out.sort_unstable();
        out
    }

    /// Chunks not checked yet.
    pub(crate) fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// Chunks whose check failed (and are still in a log).
    pub(crate) fn damaged(&self) -> u64 {
        self.damaged.load(Ordering::Relaxed)
    }

    /// What the check of chunk `c` found, if it failed (the first failed check's
    /// finding for `None`).
    pub(crate) fn damage_of(&self, c: Option<u32>) -> Option<Damage> {
        let damage = lock(&self.damage);
        damage
            .iter()
            .find(|(d, _)| c.is_none_or(|c| c == *d))
            .map(|(_, d)| d.clone())
    }
}

/// The background scrub: one thread that checks every chunk pending after the open,
/// lowest first, then ends. Stopped (and joined) before the pool closes or is dropped.
#[derive(Debug)]
pub(crate) struct Scrub {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Scrub {
    /// Starts checking `chunks` with `check` (which returns `false` once the pool is
    /// gone); `None` when there is nothing to check or no thread can start (then each
    /// chunk is checked by its first read).
    pub(crate) fn start(
        chunks: Vec<u32>,
        check: impl Fn(u32) -> bool + Send + 'static,
    ) -> Option<Scrub> {
        if chunks.is_empty() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let handle = std::thread::Builder::new()
            .name("logheap-scrub".into())
            .spawn(move || {
                for c in chunks {
                    if stopping.load(Ordering::Acquire) || !check(c) {
                        return;
                    }
                }
            })
            .ok()?;
        Some(Scrub {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for Scrub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table whose records lack the entry and data counts (an `LHSNAP03` snapshot's)
    /// records the same log as one with them; any other difference is another log.
    #[test]
    fn tables_agree_whatever_their_counts() {
        let record = ChunkRecord {
            index: 3,
            header: ChunkHeader {
                kind: LogKind::Initial,
                zeroed: false,
                owner: 2,
                generation: 9,
                prev: None,
                seq: 0,
            },
            book: ChunkBook::block(7, 0xabc, 4000, 30, 3000),
        };
        let without = ChunkRecord {
            book: ChunkBook {
                entries: 0,
                data: 0,
                ..record.book
            },
            ..record
        };
        assert!(same_tables(&[record], &[without]));
        let moved = ChunkRecord {
            book: ChunkBook {
                end: 4016,
                ..record.book
            },
            ..record
        };
        assert!(!same_tables(&[record], &[moved]));
        assert!(!same_tables(&[record], &[record, record]));
    }
}
