//! The logged metadata steps: where a standalone allocation's or free's metadata
//! stores ([`Step`]), the micro-log and metadata-log paths that run one (three fences;
//! see the parent module's docs), and the checkpoint that stores a metadata-log ring's
//! pending steps in place, at run time and in recovery alike.

use super::PersistentHeap;
use super::state::{Arena, Held};
use crate::alloc::big;
use crate::alloc::layout::{
    ENTRY_STATE, LINE, LIVE, MetadataPolicy, MicroLogSlot, MicroOp, SLOT_OP, SegmentKind,
    Superblock, TableEntry,
};
use crate::alloc::metadata_log::{self, DirtyLines};
use crate::alloc::small;
use crate::media::Media;

/// Where a micro-log record's metadata step stores.
#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    /// A small block's bit in the bitmap of its chunk's header (at `header`).
    Small {
        header: u64,
        class: usize,
        block: u32,
    },
    /// A big block's page-table word in its segment.
    Big { region: u64, granule: u64, len: u64 },
    /// A huge block's table entry (its first region's).
    Huge { region: u64, count: u64 },
}

impl Step {
    /// Stores a small or big step's bit or word in place, unflushed, and returns where
    /// (a huge step is never in a metadata log: it stores nothing).
    pub(super) fn store(self, media: &Media, sb: &Superblock, op: MicroOp) -> u64 {
        match (self, op) {
            (
                Step::Small {
                    header,
                    class,
                    block,
                },
                MicroOp::Allocate,
            ) => {
                small::store_set(media, header, class, block);
                header
            }
            (Step::Small { header, block, .. }, MicroOp::Free) => {
                small::store_clear(media, header, block);
                header
            }
            (
                Step::Big {
                    region,
                    granule,
                    len,
                },
                MicroOp::Allocate,
            ) => {
                let base = sb.region_offset(region);
                big::store_set(media, base, region, granule, len);
                base + granule * 8
            }
            (
                Step::Big {
                    region, granule, ..
                },
                MicroOp::Free,
            ) => {
                let base = sb.region_offset(region);
                big::store_clear(media, base, granule);
                base + granule * 8
            }
            (Step::Huge { region, .. }, _) => {
                debug_assert!(false, "a huge step in a metadata log");
                sb.entry_offset(region)
            }
        }
    }

    /// Applies the metadata step of `op` on the block at this step of `size` requested
    /// bytes (flushed, not fenced). Idempotent, so recovery may redo it.
    pub(super) fn apply(self, media: &Media, sb: &Superblock, op: MicroOp, size: u64) {
        let (at, len) = self.store_unflushed(media, sb, op, size);
        media.flush(at as usize, len as usize);
    }

    /// Stores `op` of this step (a block of `size` requested bytes), without flushing
    /// it; returns the bytes stored (inside one cache line), for the caller to flush.
    pub(super) fn store_unflushed(
        self,
        media: &Media,
        sb: &Superblock,
        op: MicroOp,
        size: u64,
    ) -> (u64, u64) {
        match (self, op) {
            (Step::Huge { region, count }, MicroOp::Allocate) => {
                let e = TableEntry {
                    index: region as u32,
                    kind: SegmentKind::Huge,
                    owner: 0,
                    size: count * sb.segment_size,
                    generation: 0,
                    requested: size,
                };
                let at = sb.entry_offset(region) as usize;
                media.write(at, &e.encode_body(sb.region_offset(region)));
                media.write_u64(at + ENTRY_STATE as usize, LIVE);
                (at as u64, LINE)
            }
            (Step::Huge { region, .. }, MicroOp::Free) => {
                let at = sb.entry_offset(region) as usize + ENTRY_STATE as usize;
                media.write_u64(at, 0);
                (at as u64, 8)
            }
            _ => {
                // A bit in a chunk header, or a page-table word: one line either way.
                (self.store(media, sb, op), 8)
            }
        }
    }
}

/// Stores `steps` of arena `a`'s ring in place, flushes each line they dirtied (and
/// the lines already in `lines`) once, fences, and starts the ring over after record
/// `last` (the checkpoint of [`metadata_log`], at run time and in recovery alike).
pub(super) fn checkpoint_ring(
    media: &Media,
    sb: &Superblock,
    a: u32,
    steps: impl IntoIterator<Item = (Step, MicroOp)>,
    mut lines: DirtyLines,
    last: u64,
) {
    for (step, op) in steps {
        lines.add(step.store(media, sb, op));
    }
    lines.flush(media);
    media.fence();
    metadata_log::restart(media, sb, a, last + 1, last);
}

/// Retires a micro-log slot (its op word becomes 0), durably.
pub(super) fn retire(media: &Media, slot: u64) {
    let at = (slot + SLOT_OP) as usize;
    media.write_u64(at, 0);
    media.persist(at, 8);
}

impl PersistentHeap {
    /// Where the metadata step of the small or big block `held` (in `region`) stores.
    pub(super) fn step_of(&self, held: Held, region: u32) -> Step {
        match held {
            Held::Small(b) => Step::Small {
                header: self.small_geometry(region).header_of(b.chunk),
                class: b.class,
                block: b.block,
            },
            Held::Big(b) => Step::Big {
                region: u64::from(region),
                granule: u64::from(b.granule),
                len: u64::from(b.len),
            },
        }
    }

    /// Runs one logged standalone step for arena `a`: the record, fence; its metadata
    /// step and `*dst` (the block, or null for a free), fence; retire, fence.
    /// `record` gets its sequence number here, from the log it goes to.
    pub(super) fn run_logged(
        &self,
        a: u32,
        arena: &mut Arena,
        record: MicroLogSlot,
        step: Step,
        dst_off: u64,
    ) {
        if self.sb.policy == MetadataPolicy::MetadataLog && !matches!(step, Step::Huge { .. }) {
            self.run_ring_logged(a, arena, record, step, dst_off);
            return;
        }
        let record = MicroLogSlot {
            seq: arena.seq + 1,
            ..record
        };
        let slot = self.sb.slot_offset(a) as usize;
        self.media.write(slot, &record.encode());
        self.media.flush(slot, LINE as usize);
        self.media.fence();
        step.apply(&self.media, &self.sb, record.op, record.size);
        self.media
            .write_u64(dst_off as usize, record.dst_value(&self.sb));
        self.media.flush(dst_off as usize, 8);
        self.media.fence();
        retire(&self.media, slot as u64);
        arena.seq = record.seq;
    }

    /// Runs one standalone small or big step through arena `a`'s metadata-log ring
    /// (see [`metadata_log`]): the record, fence; `*dst`, fence; `done`, fence. The
    /// metadata step waits in DRAM for the next checkpoint.
    fn run_ring_logged(
        &self,
        a: u32,
        arena: &mut Arena,
        record: MicroLogSlot,
        step: Step,
        dst_off: u64,
    ) {
        if arena.ring.is_full(self.sb.ring_records) {
            self.checkpoint(a, arena);
        }
        let record = MicroLogSlot {
            seq: arena.ring.next_seq(),
            ..record
        };
        metadata_log::append(&self.media, &self.sb, a, arena.ring.tail, &record);
        self.media
            .write_u64(dst_off as usize, record.dst_value(&self.sb));
        self.media.flush(dst_off as usize, 8);
        self.media.fence();
        metadata_log::set_done(&self.media, &self.sb, a, record.seq);
        arena.ring.tail += 1;
        arena.pending.push((step, record.op));
    }

    /// Stores arena `a`'s pending metadata steps in place, flushing each dirtied line
    /// once, fences, and starts its ring over (a no-op for an empty ring).
    pub(super) fn checkpoint(&self, a: u32, arena: &mut Arena) {
        if arena.ring.tail == 0 {
            return;
        }
        let last = arena.ring.next_seq() - 1;
        let steps = std::mem::take(&mut arena.pending);
        checkpoint_ring(&self.media, &self.sb, a, steps, DirtyLines::default(), last);
        arena.ring.base = last + 1;
        arena.ring.tail = 0;
        arena.checkpoints += 1;
    }

    /// Checkpoints every arena (with a metadata log; else nothing to do).
    pub(super) fn checkpoint_all(&self) {
        if self.sb.policy != MetadataPolicy::MetadataLog {
            return;
        }
        for (a, arena) in self.arenas.iter().enumerate() {
            self.checkpoint(a as u32, &mut arena.lock().expect("arena lock"));
        }
    }
}
