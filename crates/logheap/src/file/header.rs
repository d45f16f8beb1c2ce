//! The pool header: what a pool file is, which engine owns it, its geometry, and whether
//! it was closed cleanly.
//!
//! Layout of the first page (all integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `LOGHEAP\0` |
//! | 8 | 4 | format version |
//! | 12 | 4 | bytes covered by the header CRC (104) |
//! | 16 | 16 | UUID |
//! | 32 | 4 | engine kind code |
//! | 36 | 4 | reserved (0) |
//! | 40 | 8 | pool size |
//! | 48 | 8 | root area offset |
//! | 56 | 8 | root area size |
//! | 64 | 8 | data area offset |
//! | 72 | 8 | data area size |
//! | 80 | 8 | chunk size |
//! | 88 | 8 | creation time (Unix seconds) |
//! | 96 | 8 | fixed mapping address (0: the pool may be mapped anywhere) |
//! | 104 | 4 | CRC32C of bytes 0..104 |
//! | 128 | 8 | state word: flags (low 32 bits) and CRC32C of the flags (high 32 bits) |
//! | 512..4096 | | superblock: engine-owned metadata |
//!
//! The immutable part is written once, at creation, before the file appears under its
//! name. The only field that changes afterwards is the state word, written with one
//! atomic 8-byte store, so a crash can never tear it; its own checksum still catches a
//! flipped bit.

use std::ops::Range;
use std::path::Path;

use super::EngineKind;
use crate::error::{Error, Result};

/// First eight bytes of every pool file.
pub const MAGIC: [u8; 8] = *b"LOGHEAP\0";
/// The pool format this build writes for a relocatable pool (and reads).
pub const FORMAT_VERSION: u32 = 3;
/// The format of a pool with a fixed mapping address (header word 96): a format of its
/// own, so a build that does not know the word refuses the pool instead of mapping it
/// elsewhere and following native pointers into the wrong memory.
pub const FIXED_FORMAT_VERSION: u32 = 4;
/// Size of the header page; the root area starts here.
pub const HEADER_SIZE: u64 = 4096;
/// Offset of the state word.
pub const STATE_OFFSET: u64 = 128;
/// Engine-owned metadata area inside the header page.
pub const SUPERBLOCK: Range<u64> = 512..HEADER_SIZE;

const CRC_COVERED: usize = 104;
/// The end of the user address space a fixed mapping may use (x86-64 and AArch64 with
/// 4-level page tables: 128 TiB).
pub(crate) const MAX_USER_ADDRESS: u64 = 1 << 47;
/// The lowest fixed mapping address accepted (below it lie the program, its heap and
/// the null-pointer guard).
pub(crate) const MIN_FIXED_ADDRESS: u64 = 4 << 30;
const STATE_CLEAN: u32 = 1;
const MAX_ROOT_SIZE: u64 = 1 << 30;
const MIN_CHUNK: u64 = 4096;
const MAX_CHUNK: u64 = 64 << 20;

/// Where things are in a pool file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolLayout {
    /// Engine-owned metadata inside the header page.
    pub superblock: Range<u64>,
    /// The fixed root area (zeroed at creation).
    pub root: Range<u64>,
    /// The data area the engine manages.
    pub data: Range<u64>,
}

/// The decoded, validated pool header.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Header {
    /// Format version.
    pub format_version: u32,
    /// Unique identity of the pool, fixed at creation.
    pub uuid: uuid::Uuid,
    /// The engine that owns the pool.
    pub engine: EngineKind,
    /// Size of the pool in bytes (the file may be longer, never shorter).
    pub pool_size: u64,
    /// Size of the engine's allocation chunks.
    pub chunk_size: u64,
    /// Creation time in Unix seconds.
    pub created_unix_secs: u64,
    /// Where things are.
    pub layout: PoolLayout,
    /// The address the pool is always mapped at, or 0 when it may be mapped anywhere
    /// (see [`MapAddress`](super::MapAddress)).
    pub map_address: u64,
}

/// Geometry asked for at creation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub pool_size: u64,
    pub root_size: u64,
    pub chunk_size: u64,
}

impl Header {
    /// A new header for a pool with `geometry`, or why the geometry is invalid.
    pub(crate) fn new(
        engine: EngineKind,
        geometry: Geometry,
    ) -> std::result::Result<Header, String> {
        let root = HEADER_SIZE..HEADER_SIZE.saturating_add(geometry.root_size);
        let data_offset = root.end.div_ceil(HEADER_SIZE) * HEADER_SIZE;
        let header = Header {
            format_version: FORMAT_VERSION,
            uuid: uuid::Uuid::new_v4(),
            engine,
            pool_size: geometry.pool_size,
            chunk_size: geometry.chunk_size,
            created_unix_secs: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            layout: PoolLayout {
                superblock: SUPERBLOCK,
                root,
                data: data_offset..geometry.pool_size.max(data_offset),
            },
            map_address: 0,
        };
        header.check_geometry()?;
        Ok(header)
    }

    pub(crate) fn check_geometry(&self) -> std::result::Result<(), String> {
        let l = &self.layout;
        if l.root.start != HEADER_SIZE {
            return Err(format!(
                "root area starts at {}, not {HEADER_SIZE}",
                l.root.start
            ));
        }
        let root_size = l.root.end.saturating_sub(l.root.start);
        if root_size == 0 || !root_size.is_multiple_of(64) || root_size > MAX_ROOT_SIZE {
            return Err(format!(
                "root area size {root_size} is not a non-zero multiple of 64 up to {MAX_ROOT_SIZE}"
            ));
        }
        if !self.chunk_size.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&self.chunk_size)
        {
            return Err(format!(
                "chunk size {} is not a power of two between {MIN_CHUNK} and {MAX_CHUNK}",
                self.chunk_size
            ));
        }
        let data_offset = l.root.end.div_ceil(HEADER_SIZE) * HEADER_SIZE;
        let min = data_offset + self.chunk_size;
        if self.pool_size < min {
            return Err(format!(
                "a pool of {} bytes is too small: with {} chunks and a {} root area the smallest pool is {min} bytes ({})",
                self.pool_size,
                human_bytes(self.chunk_size),
                human_bytes(root_size),
                human_bytes(min)
            ));
        }
        if l.data.start != data_offset {
            return Err(format!(
                "data area starts at {}, not {data_offset}",
                l.data.start
            ));
        }
        if l.data.end != self.pool_size {
            return Err(format!(
                "data area ends at {}, not at the pool size {}",
                l.data.end, self.pool_size
            ));
        }
        if self.pool_size > isize::MAX as u64 {
            return Err(format!("pool size {} cannot be mapped", self.pool_size));
        }
        let fixed_format = self.format_version == FIXED_FORMAT_VERSION;
        if fixed_format != (self.map_address != 0) {
            return Err(format!(
                "format {} with fixed mapping address {:#x}: format {FIXED_FORMAT_VERSION} and a fixed address go together",
                self.format_version, self.map_address
            ));
        }
        if self.map_address != 0 {
            let end = self.map_address.checked_add(self.pool_size);
            if !self.map_address.is_multiple_of(HEADER_SIZE)
                || self.map_address < MIN_FIXED_ADDRESS
                || end.is_none_or(|e| e > MAX_USER_ADDRESS)
            {
                return Err(format!(
                    "fixed mapping address {:#x} is not page aligned between {MIN_FIXED_ADDRESS:#x} and {MAX_USER_ADDRESS:#x} with room for {} bytes",
                    self.map_address, self.pool_size
                ));
            }
        }
        Ok(())
    }

    /// The header's bytes (the first [`STATE_OFFSET`] bytes of the file).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; STATE_OFFSET as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.format_version.to_le_bytes());
        b[12..16].copy_from_slice(&(CRC_COVERED as u32).to_le_bytes());
        b[16..32].copy_from_slice(self.uuid.as_bytes());
        b[32..36].copy_from_slice(&self.engine.code().to_le_bytes());
        let l = &self.layout;
        for (at, v) in [
            (40, self.pool_size),
            (48, l.root.start),
            (56, l.root.end - l.root.start),
            (64, l.data.start),
            (72, l.data.end - l.data.start),
            (80, self.chunk_size),
            (88, self.created_unix_secs),
            (96, self.map_address),
        ] {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b[..CRC_COVERED]);
        b[CRC_COVERED..CRC_COVERED + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and validates the header in `page` (at least [`STATE_OFFSET`] + 8 bytes
    /// read from the start of `path`), in the order that gives the most telling error.
    pub(crate) fn decode(page: &[u8], path: &Path) -> Result<Header> {
        let min = STATE_OFFSET + 8;
        if (page.len() as u64) < min {
            return Err(Error::TooSmall {
                path: path.into(),
                len: page.len() as u64,
                min: HEADER_SIZE,
            });
        }
        let u32_at =
            |at: usize| u32::from_le_bytes([page[at], page[at + 1], page[at + 2], page[at + 3]]);
        let u64_at = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&page[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&page[0..8]);
        if magic != MAGIC {
            return Err(Error::BadMagic {
                path: path.into(),
                found: magic,
                expected: MAGIC,
            });
        }
        let version = u32_at(8);
        let stored = u32_at(CRC_COVERED);
        let computed = crc32c::crc32c(&page[..CRC_COVERED]);
        // Another version with an intact header is another format; a version that fails
        // the checksum is damage.
        if version != FORMAT_VERSION && version != FIXED_FORMAT_VERSION && stored == computed {
            return Err(Error::UnsupportedVersion {
                path: path.into(),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        if stored != computed || u32_at(12) as usize != CRC_COVERED {
            return Err(Error::Checksum {
                path: path.into(),
                what: "pool header",
                offset: 0,
                stored,
                computed,
            });
        }
        let bad = |reason: String| Error::BadHeader {
            path: path.into(),
            reason,
        };
        let engine_code = u32_at(32);
        let engine = EngineKind::from_code(engine_code)
            .ok_or_else(|| bad(format!("unknown engine code {engine_code} at offset 32")))?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&page[16..32]);
        let root_offset = u64_at(48);
        let data_offset = u64_at(64);
        let header = Header {
            format_version: version,
            uuid: uuid::Uuid::from_bytes(uuid),
            engine,
            pool_size: u64_at(40),
            chunk_size: u64_at(80),
            created_unix_secs: u64_at(88),
            map_address: u64_at(96),
            layout: PoolLayout {
                superblock: SUPERBLOCK,
                root: root_offset..root_offset.saturating_add(u64_at(56)),
                data: data_offset..data_offset.saturating_add(u64_at(72)),
            },
        };
        header.check_geometry().map_err(bad)?;
        Ok(header)
    }
}

/// `bytes` in the largest binary unit that keeps it whole or to one decimal ("40 KiB",
/// "1.5 MiB").
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else if value.fract() == 0.0 {
        format!("{value} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The mutable state of a pool: whether its last close was clean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PoolState {
    /// The pool was closed cleanly (no recovery needed).
    pub clean: bool,
}

impl PoolState {
    /// The state word: flags in the low half, their CRC32C in the high half.
    pub(crate) fn encode(self) -> u64 {
        let flags = if self.clean { STATE_CLEAN } else { 0 };
        let crc = crc32c::crc32c(&flags.to_le_bytes());
        (crc as u64) << 32 | flags as u64
    }

    /// Decodes a state word.
    pub(crate) fn decode(word: u64, path: &Path) -> Result<PoolState> {
        let flags = word as u32;
        let stored = (word >> 32) as u32;
        let computed = crc32c::crc32c(&flags.to_le_bytes());
        if stored != computed {
            return Err(Error::Checksum {
                path: path.into(),
                what: "pool state word",
                offset: STATE_OFFSET,
                stored,
                computed,
            });
        }
        if flags & !STATE_CLEAN != 0 {
            return Err(Error::BadHeader {
                path: path.into(),
                reason: format!("unknown state flags {flags:#x} at offset {STATE_OFFSET}"),
            });
        }
        Ok(PoolState {
            clean: flags & STATE_CLEAN != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> Geometry {
        Geometry {
            pool_size: 1 << 20,
            root_size: 4096,
            chunk_size: 32 << 10,
        }
    }

    fn page_of(h: &Header) -> Vec<u8> {
        let mut page = h.encode();
        page.resize(HEADER_SIZE as usize, 0);
        page[STATE_OFFSET as usize..STATE_OFFSET as usize + 8]
            .copy_from_slice(&PoolState { clean: true }.encode().to_le_bytes());
        page
    }

    #[test]
    fn header_round_trips() {
        let h = Header::new(EngineKind::Log, geometry()).unwrap();
        assert_eq!(h.layout.root, 4096..8192);
        assert_eq!(h.layout.data, 8192..1 << 20);
        let back = Header::decode(&page_of(&h), Path::new("p")).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn every_flipped_bit_of_the_header_is_caught() {
        let h = Header::new(EngineKind::Undo, geometry()).unwrap();
        let page = page_of(&h);
        for bit in 0..(CRC_COVERED + 4) * 8 {
            let mut damaged = page.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(
                Header::decode(&damaged, Path::new("p")).is_err(),
                "bit {bit} not caught"
            );
        }
    }

    #[test]
    fn state_word_detects_damage() {
        for clean in [true, false] {
            let w = PoolState { clean }.encode();
            assert_eq!(PoolState::decode(w, Path::new("p")).unwrap().clean, clean);
            for bit in 0..64 {
                assert!(PoolState::decode(w ^ (1 << bit), Path::new("p")).is_err());
            }
        }
        assert!(
            PoolState::decode(0, Path::new("p")).is_err(),
            "a zeroed state word is invalid"
        );
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(100), "100 bytes");
        assert_eq!(human_bytes(40 << 10), "40 KiB");
        assert_eq!(human_bytes(3 << 19), "1.5 MiB");
        assert_eq!(human_bytes(64 << 30), "64 GiB");
    }

    #[test]
    fn a_tiny_pool_is_refused_in_plain_words() {
        let g = Geometry {
            pool_size: 8192,
            ..geometry()
        };
        let err = Header::new(EngineKind::Log, g).unwrap_err();
        assert!(
            err.contains("too small") && err.contains("40960 bytes (40 KiB)"),
            "{err}"
        );
    }

    #[test]
    fn bad_geometry_is_refused() {
        let g = geometry();
        for bad in [
            Geometry {
                chunk_size: 1000,
                ..g
            },
            Geometry { root_size: 0, ..g },
            Geometry {
                root_size: 100,
                ..g
            },
            Geometry {
                pool_size: 8192,
                ..g
            },
        ] {
            assert!(Header::new(EngineKind::Log, bad).is_err(), "{bad:?}");
        }
    }
}
