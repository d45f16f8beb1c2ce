//! The metadata log of [`MetadataPolicy::MetadataLog`](super::MetadataPolicy) (004,
//! pMem: "complex allocator state in DRAM ... metadata log in PCM").
//!
//! Each arena has a ring in file 0: a header line, then `HeapOptions::log_records` records of one
//! line each, in the micro-log slot's format ([`MicroLogSlot`]: `{seq, op, dst, addr,
//! size}` with a CRC). A standalone allocation or free of a small or big block:
//! 1. appends its record at the ring's tail, flush, **fence** (the commit point);
//! 2. stores `*dst`, flush, **fence**;
//! 3. stores the record's sequence number in the header's `done` word, **fence** (so
//!    recovery never redoes `*dst` once the call has returned and the caller may have
//!    moved the pointer).
//!
//! The bitmap bit or page-table word is not stored then: the DRAM state is the truth
//! while the heap is open. A *checkpoint* (the ring full, an empty segment given back,
//! close) stores every pending record's metadata in place, flushes each dirtied line
//! once, fences, and then moves the header's `base` past the records, which makes them
//! stale. Record `i` of a ring is valid only if it decodes and its `seq` is
//! `base + i`; so records of earlier laps, and anything after the first torn or
//! missing record, never count.
//!
//! Recovery replays the valid records in order into the in-place metadata (every step
//! is idempotent, and the last record touching a bit or word decides it), redoes
//! `*dst` for the one record past `done`, and then reads the metadata as the in-place
//! policy does.

use std::collections::BTreeSet;

use super::layout::{LINE, MicroLogSlot, RING_BASE, RING_DONE, Superblock};
use crate::media::Media;

/// The DRAM side of one arena's ring.
#[derive(Debug, Default)]
pub(crate) struct RingState {
    /// The sequence number of the record at position 0.
    pub base: u64,
    /// Records appended since the last checkpoint.
    pub tail: u64,
}

impl RingState {
    /// The next record's sequence number.
    pub(crate) fn next_seq(&self) -> u64 {
        self.base + self.tail
    }

    /// Whether a checkpoint must come before the next record in a ring of `records`.
    pub(crate) fn is_full(&self, records: u64) -> bool {
        self.tail == records
    }
}

/// What one arena's ring holds, as read at open.
#[derive(Debug)]
pub(crate) struct RingContents {
    /// The header's `base`.
    pub base: u64,
    /// The header's `done`.
    pub done: u64,
    /// The valid records, in order, each with its file-0 offset.
    pub records: Vec<(u64, MicroLogSlot)>,
}

/// Writes every arena's empty ring header (`base` 1, `done` 0) and flushes it (not
/// fenced): a new heap's.
pub(crate) fn format(media: &Media, sb: &Superblock) {
    for a in 0..sb.arenas {
        restart_unfenced(media, sb, a, 1, 0);
    }
}

fn restart_unfenced(media: &Media, sb: &Superblock, a: u32, base: u64, done: u64) {
    let at = sb.ring_header(a) as usize;
    media.write_u64(at + RING_BASE as usize, base);
    media.write_u64(at + RING_DONE as usize, done);
    media.flush(at, LINE as usize);
}

/// Appends `record` at position `tail` of arena `a`'s ring, durably (flush, fence).
pub(crate) fn append(media: &Media, sb: &Superblock, a: u32, tail: u64, record: &MicroLogSlot) {
    let at = sb.ring_record(a, tail) as usize;
    media.write(at, &record.encode());
    media.flush(at, LINE as usize);
    media.fence();
}

/// Records that `*dst` of the record `seq` is durable, durably.
pub(crate) fn set_done(media: &Media, sb: &Superblock, a: u32, seq: u64) {
    let at = (sb.ring_header(a) + RING_DONE) as usize;
    media.write_u64(at, seq);
    media.persist(at, 8);
}

/// Starts arena `a`'s ring over at `base` (every record before it is stale), durably.
pub(crate) fn restart(media: &Media, sb: &Superblock, a: u32, base: u64, done: u64) {
    restart_unfenced(media, sb, a, base, done);
    media.fence();
}

/// Reads arena `a`'s ring: its header and its valid records.
pub(crate) fn read(media: &Media, sb: &Superblock, a: u32) -> RingContents {
    let header = sb.ring_header(a) as usize;
    let base = media.read_u64(header + RING_BASE as usize);
    let done = media.read_u64(header + RING_DONE as usize);
    let mut records = Vec::new();
    for i in 0..sb.ring_records {
        let at = sb.ring_record(a, i);
        let mut b = [0u8; LINE as usize];
        media.read(at as usize, &mut b);
        match MicroLogSlot::decode(&b) {
            Some(r) if Some(r.seq) == base.checked_add(i) => records.push((at, r)),
            _ => break,
        }
    }
    RingContents {
        base,
        done,
        records,
    }
}

/// The cache lines a checkpoint stored to, each flushed once.
#[derive(Debug, Default)]
pub(crate) struct DirtyLines(BTreeSet<u64>);

impl DirtyLines {
    /// Notes a store at file-0 offset `at`.
    pub(crate) fn add(&mut self, at: u64) {
        self.0.insert(at / LINE);
    }

    /// Flushes every noted line (not fenced) and forgets them.
    pub(crate) fn flush(&mut self, media: &Media) {
        for line in std::mem::take(&mut self.0) {
            media.flush((line * LINE) as usize, LINE as usize);
        }
    }
}
