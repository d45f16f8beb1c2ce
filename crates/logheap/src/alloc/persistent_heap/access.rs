//! Addresses and access to a heap's contents: persistent addresses ([`PAddr`]) and
//! native pointers, and the checks that keep every read and write in the root area or
//! inside one block's segment, never over allocator metadata.

use std::sync::atomic::Ordering;

use super::PersistentHeap;
use super::state::{USE_BIG, USE_HUGE, USE_HUGE_TAIL, USE_KIND, USE_SMALL, USE_VOLATILE};
use crate::alloc::addr::PAddr;
use crate::alloc::big;
use crate::alloc::files::{FILE_DATA, NO_FILE};
use crate::alloc::layout::{CHUNK, GRANULE};
use crate::alloc::small;
use crate::error::{Error, Result};

impl PersistentHeap {
    /// The native address of `[addr, addr + len)`, checked as [`read`](Self::read)
    /// checks (in the root area or inside one block's segment), for reading through
    /// plain loads. It stays valid while the heap is open; with a fixed
    /// [`map_address`](Self::map_address) it is the same at every open, so it may be
    /// stored in persistent data (through [`write_u64`](Self::write_u64), like every
    /// store) and followed after a restart.
    pub fn direct(&self, addr: PAddr, len: u64) -> Result<*const u8> {
        let at = self.data_range(addr, len)?;
        Ok((self.media.base_address() + at as usize) as *const u8)
    }

    /// The native address of `addr`, checked only against the file's bounds (as a
    /// persistent pointer's dereference in a hot loop is: one compare and one add), or
    /// `None` outside them. Prefer [`direct`](Self::direct) unless the check shows.
    #[inline]
    pub fn resolve(&self, addr: PAddr) -> Option<*const u8> {
        let at = self.span_offset(addr);
        at.map(|o| (self.media.base_address() + o as usize) as *const u8)
    }

    /// The persistent address of a native pointer into this heap's mapping (the inverse
    /// of [`resolve`](Self::resolve)), or `None` when it points elsewhere.
    pub fn addr_of(&self, ptr: *const u8) -> Option<PAddr> {
        let offset = (ptr as usize).checked_sub(self.media.base_address())? as u64;
        match self.sb.region_of(offset) {
            None if offset < self.file.header().pool_size => PAddr::new(0, offset),
            None => None,
            Some(r) => self.paddr(offset, r),
        }
    }

    /// The span offset of `addr` when it lies in one of the heap's files (file 0's
    /// offsets are span offsets; an extension file's count from its start).
    pub(super) fn span_offset(&self, addr: PAddr) -> Option<u64> {
        let (file, offset) = (addr.file(), addr.offset());
        if file == 0 {
            // File 0 ends where its regions end: the span after it is the extension
            // files', reached only through their own ids.
            let end = self.sb.region_offset(self.sb.local_regions);
            return (offset < end).then_some(offset);
        }
        let k = u64::from(file) - 1;
        let bytes = self.file_bytes.get(k as usize)?.load(Ordering::Acquire);
        (FILE_DATA..FILE_DATA + bytes)
            .contains(&offset)
            .then(|| self.sb.region_offset(self.sb.slot_region(k)) + offset - FILE_DATA)
    }

    /// The persistent address of span offset `offset`, in region `r`.
    fn paddr(&self, offset: u64, r: u64) -> Option<PAddr> {
        match self.region_file[r as usize].load(Ordering::Acquire) {
            NO_FILE => None,
            0 => PAddr::new(0, offset),
            id => {
                let base = self
                    .sb
                    .region_offset(self.sb.slot_region(u64::from(id) - 1));
                PAddr::new(id, FILE_DATA + offset - base)
            }
        }
    }

    /// Copies `buf.len()` bytes at `addr` into `buf`.
    pub fn read(&self, addr: PAddr, buf: &mut [u8]) -> Result<()> {
        let at = self.data_range(addr, buf.len() as u64)?;
        self.media.read(at as usize, buf);
        Ok(())
    }

    /// Loads the 8-byte word at `addr` (8-byte aligned) atomically.
    pub fn read_u64(&self, addr: PAddr) -> Result<u64> {
        let at = self.word(addr)?;
        Ok(self.media.read_u64(at as usize))
    }

    /// Stores `bytes` at `addr` through the cache: durable after
    /// [`persist`](PersistentHeap::persist) of the range.
    pub fn write(&self, addr: PAddr, bytes: &[u8]) -> Result<()> {
        let at = self.data_range(addr, bytes.len() as u64)?;
        self.media.write(at as usize, bytes);
        Ok(())
    }

    /// Stores the 8-byte word at `addr` (8-byte aligned) atomically, through the cache.
    pub fn write_u64(&self, addr: PAddr, value: u64) -> Result<()> {
        let at = self.word(addr)?;
        self.media.write_u64(at as usize, value);
        Ok(())
    }

    /// Makes `[addr, addr + len)` durable (flush, then fence).
    pub fn persist(&self, addr: PAddr, len: u64) -> Result<()> {
        let at = self.data_range(addr, len)?;
        self.media.persist(at as usize, len as usize);
        Ok(())
    }

    /// The region holding `addr`, if it is in one.
    pub(super) fn region_at(&self, addr: PAddr) -> Option<u32> {
        let r = self.sb.region_of(self.span_offset(addr)?)?;
        (self.region_file[r as usize].load(Ordering::Acquire) != NO_FILE).then_some(r as u32)
    }

    /// The file-0 offset of the aligned word at `addr` (see `data_range`).
    fn word(&self, addr: PAddr) -> Result<u64> {
        if !addr.offset().is_multiple_of(8) {
            return Err(Error::InvalidAddress {
                addr,
                reason: "a pointer or word must be 8-byte aligned",
            });
        }
        self.data_range(addr, 8)
    }

    /// [`word`](Self::word), for a word that will hold a persistent pointer: never in the
    /// volatile heap, which recovery does not know.
    pub(super) fn persistent_word(&self, addr: PAddr) -> Result<u64> {
        let at = self.word(addr)?;
        let region = self.sb.region_of(at);
        if region.is_some_and(|r| self.uses[r as usize].load(Ordering::Acquire) & USE_VOLATILE != 0)
        {
            return Err(Error::InvalidAddress {
                addr,
                reason: "a persistent pointer cannot live in the volatile heap",
            });
        }
        Ok(at)
    }

    /// The file-0 offset of `[addr, addr + len)` when it lies in the root area or in the
    /// data part of one region in use (never over allocator metadata).
    pub(super) fn data_range(&self, addr: PAddr, len: u64) -> Result<u64> {
        let bad = |reason| Err(Error::InvalidAddress { addr, reason });
        let Some(start) = self.span_offset(addr) else {
            return bad("no such file in this heap, or outside it");
        };
        let Some(end) = start.checked_add(len) else {
            return bad("the range wraps around");
        };
        if addr.file() == 0 && self.root.start <= start && end <= self.root.end {
            return Ok(start);
        }
        let Some(region) = self.sb.region_of(start) else {
            return bad("outside the root area and the heap's regions");
        };
        let base = self.sb.region_offset(region);
        let used = self.uses[region as usize].load(Ordering::Acquire);
        let (lo, hi) = match used & USE_KIND {
            USE_SMALL => {
                let g = small::Geometry::of(base, self.sb.segment_size);
                match g.chunk_containing(start) {
                    Some(chunk) => (chunk, chunk + CHUNK),
                    None => return bad("over allocator metadata"),
                }
            }
            USE_BIG => (
                base + big::table_granules(self.sb.segment_size) * GRANULE,
                base + self.sb.segment_size,
            ),
            USE_HUGE | USE_HUGE_TAIL => {
                // The huge block this region belongs to ends where its run ends.
                let mut head = region;
                while self.uses[head as usize].load(Ordering::Acquire) & USE_KIND == USE_HUGE_TAIL
                    && head > 0
                {
                    head -= 1;
                }
                let run = self.huge_size(head as u32, used).unwrap_or(0);
                let head_base = self.sb.region_offset(head);
                (head_base, head_base + run)
            }
            _ => return bad("in a region that holds no blocks"),
        };
        if start < lo || end > hi {
            return bad("over allocator metadata or across segments");
        }
        Ok(start)
    }
}
