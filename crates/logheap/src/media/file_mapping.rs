//! Shared memory mappings of pool files.
//!
//! memmap2 does not offer `MAP_SYNC`, which DAX file systems need for user-space flushing
//! to be durable, so the mapping is made here with rustix: `MAP_SHARED_VALIDATE | MAP_SYNC`
//! first, and plain `MAP_SHARED` where the file system refuses it (tmpfs, ext4 without
//! DAX, ...).

use std::fs::File;
use std::ptr::NonNull;

use rustix::mm::{MapFlags, MsyncFlags, ProtFlags};

/// How a pool file is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MapMode {
    /// `MAP_SYNC` on a DAX file system: CPU flushes alone make stores durable.
    Sync,
    /// `MAP_SHARED` through the page cache (tmpfs, or block storage with `msync`).
    Shared,
    /// Not a file: process memory (the crash-simulation media).
    Memory,
}

/// A read-write shared mapping of a whole file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct FileMapping {
    ptr: NonNull<u8>,
    len: usize,
    mode: MapMode,
}

// SAFETY: the mapping is plain shared memory; all access goes through raw pointers whose
// synchronisation is the responsibility of the media layer's users.
unsafe impl Send for FileMapping {}
// SAFETY: as above.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Maps the first `len` bytes of `file` (which must be at least that long), at
    /// address `at` when given (an error of kind `AlreadyExists` when something is
    /// mapped in that range already), else where the kernel picks.
    pub(crate) fn new(file: &File, len: usize, at: Option<usize>) -> std::io::Result<FileMapping> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "cannot map an empty range",
            ));
        }
        let prot = ProtFlags::READ | ProtFlags::WRITE;
        // A fixed address is first reserved with an anonymous MAP_FIXED_NOREPLACE
        // mapping (which fails when anything is there), then the file is mapped over the
        // reservation with MAP_FIXED. MAP_FIXED_NOREPLACE cannot go with the file
        // mapping itself: under MAP_SHARED_VALIDATE the kernel refuses it as unknown, so
        // a fixed pool would lose MAP_SYNC.
        let (hint, fixed) = match at {
            Some(a) => (reserve(a, len)?, MapFlags::FIXED),
            None => (std::ptr::null_mut(), MapFlags::empty()),
        };
        // SAFETY: a fresh mapping at an address the kernel picks, or exactly over this
        // process's own reservation of `[at, at + len)` made just above (MAP_FIXED
        // replaces only that): no other memory is affected. The mapping stays valid
        // after the descriptor is closed.
        let sync = unsafe {
            rustix::mm::mmap(
                hint,
                len,
                prot,
                MapFlags::SHARED_VALIDATE | MapFlags::SYNC | fixed,
                file,
                0,
            )
        };
        let mapped = match sync {
            Ok(addr) => Ok((addr, MapMode::Sync)),
            Err(_) => {
                // SAFETY: as above, without MAP_SYNC.
                unsafe { rustix::mm::mmap(hint, len, prot, MapFlags::SHARED | fixed, file, 0) }
                    .map(|addr| (addr, MapMode::Shared))
            }
        };
        let (addr, mode) = match mapped {
            Ok(m) => m,
            Err(e) => {
                if !hint.is_null() {
                    // SAFETY: unmaps exactly the reservation made above, which nothing
                    // uses.
                    let _ = unsafe { rustix::mm::munmap(hint, len) };
                }
                return Err(e.into());
            }
        };
        let ptr = NonNull::new(addr.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned a null address"))?;
        Ok(FileMapping { ptr, len, mode })
    }

    /// Maps the first `len` bytes of `file` for reading only.
    pub(crate) fn read_only(file: &File, len: usize) -> std::io::Result<FileMapping> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "cannot map an empty range",
            ));
        }
        // SAFETY: a fresh read-only mapping at an address the kernel picks; no existing
        // memory is affected.
        let addr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                file,
                0,
            )
        }?;
        let ptr = NonNull::new(addr.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned a null address"))?;
        Ok(FileMapping {
            ptr,
            len,
            mode: MapMode::Shared,
        })
    }

    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub(crate) fn mode(&self) -> MapMode {
        self.mode
    }

    /// Synchronously writes the pages overlapping `[offset, offset + len)` to the file.
    pub(crate) fn msync(&self, offset: usize, len: usize) -> std::io::Result<()> {
        let page = rustix::param::page_size();
        let start = offset / page * page;
        let end = (offset + len).min(self.len);
        if end <= start {
            return Ok(());
        }
        // SAFETY: `start..end` lies inside this mapping and `start` is page aligned.
        unsafe {
            rustix::mm::msync(
                self.ptr.as_ptr().add(start).cast(),
                end - start,
                MsyncFlags::SYNC,
            )
        }?;
        Ok(())
    }
}

/// Reserves `[at, at + len)` with an inaccessible anonymous mapping, or fails with
/// [`address_taken`] when anything is mapped in that range.
fn reserve(at: usize, len: usize) -> std::io::Result<*mut std::ffi::c_void> {
    let want = at as *mut std::ffi::c_void;
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the new one is
    // inaccessible and reserves no memory.
    let got = unsafe {
        rustix::mm::mmap_anonymous(
            want,
            len,
            ProtFlags::empty(),
            MapFlags::PRIVATE | MapFlags::FIXED_NOREPLACE | MapFlags::NORESERVE,
        )
    }
    .map_err(|e| {
        if e == rustix::io::Errno::EXIST {
            address_taken(at)
        } else {
            e.into()
        }
    })?;
    if got != want {
        // A kernel older than 4.17 takes MAP_FIXED_NOREPLACE as a hint only.
        // SAFETY: unmaps exactly the fresh mapping made above, which nothing uses.
        let _ = unsafe { rustix::mm::munmap(got, len) };
        return Err(address_taken(at));
    }
    Ok(want)
}

/// The error of a fixed mapping whose address range is taken.
fn address_taken(at: usize) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("the address {at:#x} is taken by another mapping"),
    )
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range mapped in `new`; no references into it outlive
        // the owning media, which holds this mapping.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
