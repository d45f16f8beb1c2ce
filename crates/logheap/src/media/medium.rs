//! What a pool file lies on, and the durability mode [`Durability::Auto`] chooses for
//! it.
//!
//! A store reaches a power-fail durable place by different means on different media:
//! on persistent memory mapped with `MAP_SYNC` (DAX), a cache-line flush and a fence;
//! on an ordinary file system, whose mapping is the page cache, only `msync` (a flush
//! there survives a process crash, not a power cut); on a file system in memory
//! (tmpfs), nothing survives a power cut, and a flush and a fence are the usual
//! emulation of persistent memory. PMDK makes the same choice (`pmem_is_pmem`).

use std::fs::File;

use serde::{Deserialize, Serialize};

use super::{Durability, MediaError};

/// What a pool's file lies on, as far as durability goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Medium {
    /// A DAX file system (persistent memory): the file is mapped with `MAP_SYNC`, so a
    /// cache-line flush and a fence make a store durable.
    Dax,
    /// A file system in memory (tmpfs, ramfs, hugetlbfs): nothing on it survives a
    /// power cut; what is flushed and fenced survives a crash of the process.
    Memory,
    /// A file system on block storage, mapped through the page cache: a store is
    /// durable once `msync` has written it back.
    PageCache,
    /// The crash simulator's memory, which persists what is flushed and fenced.
    Simulated,
}

/// `f_type` of the file systems whose files live in memory (`linux/magic.h`).
const MEMORY_FILE_SYSTEMS: [(u64, &str); 3] = [
    (0x0102_1994, "tmpfs"),
    (0x8584_58f6, "ramfs"),
    (0x9584_58f6, "hugetlbfs"),
];

/// Whether this target has a cache-line flush instruction that `pmem` mode uses (on
/// other targets the flush is only a compiler fence, which orders stores for a crash of
/// the process but writes nothing back).
pub(crate) const HAS_FLUSH_INSTRUCTION: bool = cfg!(target_arch = "x86_64");

impl Medium {
    /// The lower-case name used in output.
    pub fn name(self) -> &'static str {
        match self {
            Medium::Dax => "dax",
            Medium::Memory => "memory",
            Medium::PageCache => "page-cache",
            Medium::Simulated => "simulated",
        }
    }

    /// The medium of `file`, as far as can be told without mapping it: DAX when the
    /// file has the DAX attribute (`statx`), memory when its file system is one of
    /// tmpfs, ramfs or hugetlbfs, the page cache otherwise. A mapping made with
    /// `MAP_SYNC` is DAX whatever this says.
    pub fn of_file(file: &File) -> Medium {
        let dax = rustix::fs::statx(
            file,
            c"",
            rustix::fs::AtFlags::EMPTY_PATH,
            rustix::fs::StatxFlags::BASIC_STATS,
        )
        .is_ok_and(|stat| {
            let dax = rustix::fs::StatxAttributes::DAX;
            stat.stx_attributes_mask.contains(dax) && stat.stx_attributes.contains(dax)
        });
        if dax {
            return Medium::Dax;
        }
        match file_system_of(file) {
            Some(_) => Medium::Memory,
            None => Medium::PageCache,
        }
    }

    /// The mode [`Durability::Auto`] chooses on this medium: `pmem` on DAX (when the
    /// target has a flush instruction; `msync` otherwise, which the kernel makes
    /// durable on DAX too), on memory and on the simulator; `msync` on the page cache.
    pub fn auto_durability(self) -> Durability {
        match self {
            Medium::Dax if HAS_FLUSH_INSTRUCTION => Durability::Pmem,
            Medium::Dax | Medium::PageCache => Durability::Msync,
            Medium::Memory | Medium::Simulated => Durability::Pmem,
        }
    }

    /// What a store made durable in `mode` on this medium survives, in a few words.
    pub fn survives(self, mode: Durability) -> &'static str {
        match (self, mode) {
            (_, Durability::None) => "nothing: no flush, no fence",
            (_, Durability::Auto) => "not yet chosen",
            (Medium::Simulated, _) => "the crash simulator's crashes",
            (Medium::Memory, _) => "process crashes (the medium is memory)",
            (Medium::Dax, Durability::Pmem) if HAS_FLUSH_INSTRUCTION => "power loss",
            (Medium::Dax, Durability::Pmem) => "process crashes (no flush instruction)",
            (_, Durability::Msync) => "power loss",
            (Medium::PageCache, Durability::Pmem) => {
                "process crashes only (the page cache is written back by msync, not by flushes)"
            }
        }
    }

    /// The durability mode a mapping of this medium runs in, given the one asked for:
    /// [`Durability::Auto`] resolved, an explicit mode checked.
    ///
    /// # Errors
    /// [`MediaError::NotDurable`] for `pmem` where flushes do not make stores durable
    /// and the configuration did not accept process-crash durability: on the page cache
    /// (not DAX, not memory), or on DAX without a flush instruction.
    pub(crate) fn resolve(
        self,
        asked: Durability,
        process_crash_only: bool,
    ) -> Result<Durability, MediaError> {
        match asked {
            Durability::Auto => Ok(self.auto_durability()),
            Durability::Pmem
                if !process_crash_only
                    && (self == Medium::PageCache
                        || (self == Medium::Dax && !HAS_FLUSH_INSTRUCTION)) =>
            {
                Err(MediaError::NotDurable {
                    medium: self,
                    survives: self.survives(Durability::Pmem),
                })
            }
            mode => Ok(mode),
        }
    }
}

impl std::fmt::Display for Medium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The name of `file`'s file system when it is one that lives in memory.
pub(crate) fn file_system_of(file: &File) -> Option<&'static str> {
    let stat = rustix::fs::fstatfs(file).ok()?;
    // `f_type`'s integer type differs between targets; magic numbers fit in 32 bits.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    let kind = (stat.f_type as i64 as u64) & 0xFFFF_FFFF;
    MEMORY_FILE_SYSTEMS
        .iter()
        .find(|&&(magic, _)| magic == kind)
        .map(|&(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_msync_on_the_page_cache_and_pmem_elsewhere() {
        assert_eq!(Medium::PageCache.auto_durability(), Durability::Msync);
        assert_eq!(Medium::Memory.auto_durability(), Durability::Pmem);
        assert_eq!(Medium::Simulated.auto_durability(), Durability::Pmem);
        assert_eq!(
            Medium::Dax.auto_durability(),
            if HAS_FLUSH_INSTRUCTION {
                Durability::Pmem
            } else {
                Durability::Msync
            }
        );
    }

    #[test]
    fn pmem_on_the_page_cache_needs_the_opt_in() {
        assert!(matches!(
            Medium::PageCache.resolve(Durability::Pmem, false),
            Err(MediaError::NotDurable { .. })
        ));
        assert_eq!(
            Medium::PageCache.resolve(Durability::Pmem, true).unwrap(),
            Durability::Pmem
        );
        for medium in [Medium::Memory, Medium::Simulated] {
            assert_eq!(
                medium.resolve(Durability::Pmem, false).unwrap(),
                Durability::Pmem
            );
        }
        for mode in [Durability::Msync, Durability::None] {
            assert_eq!(Medium::PageCache.resolve(mode, false).unwrap(), mode);
        }
    }

    #[test]
    fn files_in_dev_shm_are_in_memory() {
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            return; // no /dev/shm here
        };
        let file = File::create(dir.path().join("f")).unwrap();
        assert_eq!(file_system_of(&file), Some("tmpfs"));
        assert_eq!(Medium::of_file(&file), Medium::Memory);
    }
}
