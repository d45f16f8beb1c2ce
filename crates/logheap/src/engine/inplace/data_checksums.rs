//! Data checksums of the in-place engines (an option, [`Config::data_checksums`]): a
//! CRC-32C of every 64-byte line of the heap, kept whenever a line's home bytes are
//! stored (at commit, at a collection, in recovery) and verified on every
//! transactional read of home bytes and by `logheap check`. Without them, damage to
//! user data stored at home is read back as if it were data (as in PMDK); with them it
//! is a typed error ([`Error::Checksum`]).
//!
//! **Layout.** The checksums live in heap blocks of the largest small class, *pages*
//! of [`PAGE_ENTRIES`] entries, one page per [`WINDOW`] bytes of the heap's address
//! span. The pages are named by a chain of directory blocks linked from the engine
//! area (word 40), each `{magic, next, count, crc}` followed by `count` page addresses;
//! every block and page is allocated with `allocate_zeroed_into` on the word that
//! names it, so a crash leaks none. The directory never changes once complete, so its
//! CRC covers it. Word 48 of the engine area says the checksums are on; it is stored
//! after every page holds the checksums of the heap's bytes, so a crash while turning
//! them on leaves them off.
//!
//! **Concurrency and crashes.** A line's checksum is stored under the same stripe lock
//! as its bytes (stripes are lines), so a reader validated by the TL2 driver sees the
//! two together. The engines store the checksum after the bytes and flush both before
//! the fence that makes the store durable; after a crash, recovery stores again the
//! checksum of every line it redoes or undoes (and the `oop` engine those of the homes
//! whose writes it may have cut short), so no line is left torn against its checksum.
//! Lines of engine structures (log areas, slot chunks, these pages) are not kept: no
//! transaction reads them, and a block given to the user is checksummed whole when the
//! transaction that allocates it commits.

use crate::alloc::{PAddr, PersistentHeap};
use crate::error::{Error, Result};
use crate::media::Media;

/// Bytes of a line, the unit of a checksum.
pub(crate) const LINE: u64 = 64;
/// Checksums per page.
pub(crate) const PAGE_ENTRIES: u64 = 1008;
/// Bytes of a page: 1008 four-byte checksums, the largest small class (4032).
const PAGE_BYTES: u64 = PAGE_ENTRIES * 4;
/// Bytes of heap one page covers.
pub(crate) const WINDOW: u64 = PAGE_ENTRIES * LINE;
/// Bytes of a directory block (the largest small class).
const DIR_BYTES: u64 = 4032;
/// A directory block's header: magic, next block, count, CRC.
const DIR_HEADER: u64 = 32;
/// Page addresses per directory block.
const DIR_ENTRIES: u64 = (DIR_BYTES - DIR_HEADER) / 8;
const DIR_MAGIC: u64 = u64::from_le_bytes(*b"LHCSDIR1");
/// The engine area's word naming the first directory block.
pub(crate) const DIRECTORY_AT: u64 = 40;
/// The engine area's word saying the checksums are on ([`ON_MAGIC`]) or off (0).
pub(crate) const STATE_AT: u64 = 48;
const ON_MAGIC: u64 = u64::from_le_bytes(*b"LHCSUMON");

/// The checksums of a pool whose data checksums are on: each window's page.
#[derive(Debug)]
pub(crate) struct DataChecksums {
    /// The page of each window (offsets in the mapping).
    pages: Box<[u64]>,
    /// The directory blocks.
    directory: Box<[u64]>,
}

/// The windows of a heap spanning `span` bytes.
fn windows(span: u64) -> u64 {
    span.div_ceil(WINDOW)
}

/// The CRC-32C of the line at `line` (a multiple of [`LINE`]).
fn line_crc(media: &Media, line: u64) -> u32 {
    let mut bytes = [0u8; LINE as usize];
    media.read(line as usize, &mut bytes);
    crc32c::crc32c(&bytes)
}

/// A directory block's CRC: of its link, count and entries.
fn directory_crc(media: &Media, block: u64, count: u64) -> u64 {
    let link_and_count = media.read_vec(block as usize + 8, 16);
    let entries = media.read_vec((block + DIR_HEADER) as usize, (8 * count) as usize);
    u64::from(crc32c::crc32c_append(
        crc32c::crc32c(&link_and_count),
        &entries,
    ))
}

/// What the directory chain holds: each directory block, and each page address
/// (0 where none is allocated yet).
struct Chain {
    /// `(block, count)` of each directory block.
    blocks: Vec<(u64, u64)>,
    pages: Vec<u64>,
}

impl DataChecksums {
    /// The checksums of the pool whose engine area starts at `base`, or `None` when
    /// they are off. `in_heap` says whether a range lies in the heap; damage to the
    /// directory or the state word is `corrupt(offset, reason)`.
    pub(crate) fn load(
        media: &Media,
        base: u64,
        span: u64,
        in_heap: &dyn Fn(u64, u64) -> bool,
        corrupt: &dyn Fn(u64, String) -> Error,
    ) -> Result<Option<DataChecksums>> {
        match media.read_u64((base + STATE_AT) as usize) {
            0 => return Ok(None),
            ON_MAGIC => {}
            other => {
                return Err(corrupt(
                    base + STATE_AT,
                    format!("the data-checksum state word holds {other:#x}"),
                ));
            }
        }
        let chain = read_chain(media, base, in_heap, corrupt, true)?;
        let needed = windows(span) as usize;
        if chain.pages.len() < needed || chain.pages[..needed].contains(&0) {
            return Err(corrupt(
                base + DIRECTORY_AT,
                "the data-checksum directory does not cover the heap".into(),
            ));
        }
        Ok(Some(DataChecksums {
            pages: chain.pages[..needed].into(),
            directory: chain.blocks.iter().map(|&(b, _)| b).collect(),
        }))
    }

    /// The heap blocks they take: pages and directory blocks.
    pub(crate) fn own_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.pages.iter().chain(self.directory.iter()).copied()
    }

    /// Where the checksum of the line at `line` is.
    #[inline]
    fn entry(&self, line: u64) -> Option<usize> {
        let page = *self.pages.get((line / WINDOW) as usize)?;
        Some((page + (line % WINDOW) / LINE * 4) as usize)
    }

    fn stored(&self, media: &Media, line: u64) -> Option<u32> {
        let at = self.entry(line)?;
        let mut bytes = [0u8; 4];
        media.read(at, &mut bytes);
        Some(u32::from_le_bytes(bytes))
    }

    /// Stores the checksums of the lines of `[home, home + len)` from their bytes now,
    /// flushed (the caller fences); `flushed` is told each checksum's offset.
    pub(crate) fn seal(&self, media: &Media, home: u64, len: u64, mut flushed: impl FnMut(u64)) {
        if len == 0 {
            return;
        }
        let mut line = home - home % LINE;
        while line < home + len {
            if let Some(at) = self.entry(line) {
                media.write(at, &line_crc(media, line).to_le_bytes());
                media.flush(at, 4);
                flushed(at as u64);
            }
            line += LINE;
        }
    }

    /// Copies `[home, home + buf.len())` into `buf` and returns whether every line it
    /// touches matches its checksum.
    #[inline]
    pub(crate) fn read_verified(&self, media: &Media, home: u64, buf: &mut [u8]) -> bool {
        let end = home + buf.len() as u64;
        let mut line = home - home % LINE;
        let mut intact = true;
        while line < end {
            let mut bytes = [0u8; LINE as usize];
            media.read(line as usize, &mut bytes);
            if let Some(stored) = self.stored(media, line) {
                intact &= crc32c::crc32c(&bytes) == stored;
            }
            let (from, to) = (home.max(line), end.min(line + LINE));
            buf[(from - home) as usize..(to - home) as usize]
                .copy_from_slice(&bytes[(from - line) as usize..(to - line) as usize]);
            line += LINE;
        }
        intact
    }

    /// The first line of `[home, home + len)` whose bytes do not match its checksum:
    /// `(line, stored, computed)`.
    pub(crate) fn first_damaged(
        &self,
        media: &Media,
        home: u64,
        len: u64,
    ) -> Option<(u64, u32, u32)> {
        let mut line = home - home % LINE;
        while line < home + len {
            let computed = line_crc(media, line);
            match self.stored(media, line) {
                Some(stored) if stored != computed => return Some((line, stored, computed)),
                _ => {}
            }
            line += LINE;
        }
        None
    }
}

/// Reads the directory chain from the engine area at `base`. `complete`: it must be
/// sealed (every block's CRC holds); else blocks of a crashed `turn_on` may be partly
/// filled (their pages are then 0 or allocated, never anything else).
fn read_chain(
    media: &Media,
    base: u64,
    in_heap: &dyn Fn(u64, u64) -> bool,
    corrupt: &dyn Fn(u64, String) -> Error,
    complete: bool,
) -> Result<Chain> {
    let mut chain = Chain {
        blocks: Vec::new(),
        pages: Vec::new(),
    };
    let mut link = base + DIRECTORY_AT;
    loop {
        let raw = media.read_u64(link as usize);
        if raw == 0 {
            return Ok(chain);
        }
        let addr = PAddr::from_raw(raw);
        let block = addr.offset();
        if addr.file() != 0
            || !block.is_multiple_of(16)
            || !in_heap(block, DIR_BYTES)
            || chain.blocks.iter().any(|&(b, _)| b == block)
        {
            return Err(corrupt(
                link,
                format!("a data-checksum directory link holds {raw:#x}"),
            ));
        }
        let magic = media.read_u64(block as usize);
        let count = media.read_u64(block as usize + 16);
        // A block a crashed `turn_on` allocated (zeroed, linked) before it stored the
        // magic: it is taken up again as it is.
        if !complete && magic == 0 && count == 0 {
            chain.blocks.push((block, 0));
            link = block + 8;
            continue;
        }
        if magic != DIR_MAGIC || count > DIR_ENTRIES {
            return Err(corrupt(
                block,
                "a data-checksum directory block's header is damaged".into(),
            ));
        }
        if complete && media.read_u64(block as usize + 24) != directory_crc(media, block, count) {
            return Err(corrupt(
                block,
                "a data-checksum directory block fails its checksum".into(),
            ));
        }
        for i in 0..count {
            let at = block + DIR_HEADER + 8 * i;
            let raw = media.read_u64(at as usize);
            let page = PAddr::from_raw(raw);
            if raw != 0
                && (page.file() != 0
                    || !page.offset().is_multiple_of(16)
                    || !in_heap(page.offset(), PAGE_BYTES))
            {
                return Err(corrupt(
                    at,
                    format!("a data-checksum page address holds {raw:#x}"),
                ));
            }
            chain.pages.push(page.offset());
        }
        chain.blocks.push((block, count));
        link = block + 8;
    }
}

/// Turns the data checksums of the heap on (the engine area at `base`, a span of
/// `span` bytes): allocates the directory and the pages (reusing those of an earlier
/// attempt a crash cut short), stores the checksum of every line as its bytes are now,
/// then the state word. Runs at open, before any transaction.
pub(crate) fn turn_on(
    heap: &PersistentHeap,
    media: &Media,
    base: u64,
    span: u64,
    corrupt: &dyn Fn(u64, String) -> Error,
) -> Result<DataChecksums> {
    let in_heap = |at: u64, len: u64| at.checked_add(len).is_some_and(|end| end <= span);
    let chain = read_chain(media, base, &in_heap, corrupt, false)?;
    let needed = windows(span);
    let addr = |offset: u64| PAddr::new(0, offset).expect("an offset in the heap");
    // The directory blocks: those there are, then new ones.
    let mut blocks = chain.blocks;
    for &(block, _) in &blocks {
        if media.read_u64(block as usize) != DIR_MAGIC {
            media.write_u64(block as usize, DIR_MAGIC);
            media.persist(block as usize, 8);
        }
    }
    let mut link = blocks.last().map_or(base + DIRECTORY_AT, |&(b, _)| b + 8);
    while (blocks.len() as u64) * DIR_ENTRIES < needed {
        let block = heap.allocate_zeroed_into(addr(link), DIR_BYTES)?.offset();
        media.write_u64(block as usize, DIR_MAGIC);
        media.persist(block as usize, 8);
        blocks.push((block, 0));
        link = block + 8;
    }
    // Each block's count, then its pages.
    let mut window = 0;
    let mut pages = Vec::with_capacity(needed as usize);
    for &(block, _) in &blocks {
        let count = (needed - window).min(DIR_ENTRIES);
        media.write_u64(block as usize + 16, count);
        media.persist(block as usize + 16, 8);
        for i in 0..count {
            let at = block + DIR_HEADER + 8 * i;
            let mut page = media.read_u64(at as usize);
            if page == 0 {
                page = heap.allocate_zeroed_into(addr(at), PAGE_BYTES)?.raw();
            }
            pages.push(PAddr::from_raw(page).offset());
        }
        window += count;
        let crc = directory_crc(media, block, count);
        media.write_u64(block as usize + 24, crc);
        media.persist(block as usize + 24, 8);
    }
    let sums = DataChecksums {
        pages: pages.into(),
        directory: blocks.iter().map(|&(b, _)| b).collect(),
    };
    // Every line's checksum as its bytes are now.
    for w in 0..needed {
        let start = w * WINDOW;
        let end = (start + WINDOW).min(span);
        let page = sums.pages[w as usize];
        let mut entries = Vec::with_capacity(((end - start) / LINE * 4) as usize);
        let mut line = start;
        while line < end {
            entries.extend_from_slice(&line_crc(media, line).to_le_bytes());
            line += LINE;
        }
        media.write(page as usize, &entries);
        media.flush(page as usize, entries.len());
    }
    media.fence();
    media.write_u64((base + STATE_AT) as usize, ON_MAGIC);
    media.persist((base + STATE_AT) as usize, 8);
    Ok(sums)
}

/// Turns the data checksums off: the state word first, then the pages and the
/// directory are freed (a crash between leaves them allocated and linked, to be reused
/// by the next [`turn_on`]).
pub(crate) fn turn_off(
    heap: &PersistentHeap,
    media: &Media,
    base: u64,
    span: u64,
    corrupt: &dyn Fn(u64, String) -> Error,
) -> Result<()> {
    media.write_u64((base + STATE_AT) as usize, 0);
    media.persist((base + STATE_AT) as usize, 8);
    let in_heap = |at: u64, len: u64| at.checked_add(len).is_some_and(|end| end <= span);
    let chain = read_chain(media, base, &in_heap, corrupt, false)?;
    let addr = |offset: u64| PAddr::new(0, offset).expect("an offset in the heap");
    for &(block, count) in chain.blocks.iter().rev() {
        for i in 0..count {
            heap.deallocate(addr(block + DIR_HEADER + 8 * i))?;
        }
    }
    let mut links: Vec<u64> = vec![base + DIRECTORY_AT];
    links.extend(chain.blocks.iter().map(|&(b, _)| b + 8));
    links.pop();
    for &link in links.iter().rev() {
        heap.deallocate(addr(link))?;
    }
    Ok(())
}
