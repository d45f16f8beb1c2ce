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
    /// mapped in that range already), else where the kernel picks, inside `span` bytes
    /// of address space (at least `len`) reserved for the mapping: the bytes past `len`
    /// are private zero pages (never persisted) until other files are
    /// [`attach`](FileMapping::attach)ed there (a
    /// pool of several files seen as one range, as PMDK maps the parts of a pool set).
    pub(crate) fn spanning(
        file: &File,
        len: usize,
        span: usize,
        at: Option<usize>,
    ) -> std::io::Result<FileMapping> {
        if len == 0 || span < len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "cannot map an empty range, or a file longer than its span",
            ));
        }
        // A fixed address, or a span longer than the file, is first reserved with an
        // anonymous mapping (MAP_FIXED_NOREPLACE at a fixed address, which fails when
        // anything is there), then the file is mapped over the reservation with
        // MAP_FIXED. MAP_FIXED_NOREPLACE cannot go with the file mapping itself: under
        // MAP_SHARED_VALIDATE the kernel refuses it as unknown, so a fixed pool would
        // lose MAP_SYNC.
        let hint = match at {
            Some(a) => reserve(a, span)?,
            None if span > len => reserve_anywhere(span)?,
            None => std::ptr::null_mut(),
        };
        // SAFETY: a fresh mapping at an address the kernel picks, or exactly over the
        // start of this process's own reservation made just above (MAP_FIXED replaces
        // only that): no other memory is affected. The mapping stays valid after the
        // descriptor is closed.
        let mapped = unsafe { map_shared(hint, len, file, 0) };
        let (addr, mode) = match mapped {
            Ok(m) => m,
            Err(e) => {
                if !hint.is_null() {
                    // SAFETY: unmaps exactly the reservation made above, which nothing
                    // uses.
                    let _ = unsafe { rustix::mm::munmap(hint, span) };
                }
                return Err(e);
            }
        };
        let ptr = NonNull::new(addr.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned a null address"))?;
        Ok(FileMapping {
            ptr,
            len: span,
            mode,
        })
    }

    /// Grows the span to `span` bytes, keeping the first `len` bytes (mapped from `file`)
    /// where they are when the address space after the span is free, else (unless
    /// `fixed`) moving the whole mapping to a fresh reservation. Nothing past `len` may be
    /// attached yet.
    pub(crate) fn extend(
        &mut self,
        file: &File,
        len: usize,
        span: usize,
        fixed: bool,
    ) -> std::io::Result<()> {
        let page = rustix::param::page_size();
        let end = self.len.next_multiple_of(page);
        if span <= end {
            self.len = self.len.max(span);
            return Ok(());
        }
        let tail = self.ptr.as_ptr() as usize + end;
        match reserve(tail, span - end) {
            Ok(_) => {
                self.len = span;
                Ok(())
            }
            Err(e) if fixed => Err(e),
            Err(_) => {
                *self = FileMapping::spanning(file, len, span, None)?;
                Ok(())
            }
        }
    }

    /// Maps `len` bytes of `file` from `file_offset` (page aligned) at `offset` of this
    /// mapping's span, replacing what was there (a reservation, or a file detached
    /// before).
    ///
    /// # Safety
    /// Nothing may use `[offset, offset + len)` of the span meanwhile: its contents
    /// change to the file's.
    pub(crate) unsafe fn attach(
        &self,
        offset: usize,
        file: &File,
        file_offset: u64,
        len: usize,
    ) -> std::io::Result<()> {
        self.check_page_range(offset, len)?;
        // SAFETY: the range lies inside this mapping's span (checked above) and the
        // caller promises nothing uses it, so MAP_FIXED replaces only memory we own.
        unsafe { map_shared(self.ptr.as_ptr().add(offset).cast(), len, file, file_offset) }?;
        Ok(())
    }

    /// Makes `[offset, offset + len)` of the span private zero pages again (reserved, backed by
    /// nothing), unmapping the file that was attached there.
    ///
    /// # Safety
    /// Nothing may use the range afterwards, until a file is attached there again.
    pub(crate) unsafe fn detach(&self, offset: usize, len: usize) -> std::io::Result<()> {
        self.check_page_range(offset, len)?;
        // SAFETY: the range lies inside this mapping's span and the caller promises no
        // one uses it; the new mapping is private anonymous memory that takes none until
        // touched.
        unsafe {
            rustix::mm::mmap_anonymous(
                self.ptr.as_ptr().add(offset).cast(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::FIXED | MapFlags::NORESERVE,
            )
        }?;
        Ok(())
    }

    fn check_page_range(&self, offset: usize, len: usize) -> std::io::Result<()> {
        let page = rustix::param::page_size();
        if len == 0
            || !offset.is_multiple_of(page)
            || !len.is_multiple_of(page)
            || offset.checked_add(len).is_none_or(|end| end > self.len)
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{len} is not page aligned inside a span of {} bytes",
                    self.len
                ),
            ));
        }
        Ok(())
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

/// Maps `len` bytes of `file` from `file_offset` shared and writable, `MAP_SYNC` where
/// the file system allows it: at `hint` with `MAP_FIXED` when it is not null, else
/// where the kernel picks.
///
/// # Safety
/// A non-null `hint` must start `len` bytes of this process's address space that
/// nothing uses (MAP_FIXED replaces whatever is there).
unsafe fn map_shared(
    hint: *mut std::ffi::c_void,
    len: usize,
    file: &File,
    file_offset: u64,
) -> std::io::Result<(*mut std::ffi::c_void, MapMode)> {
    let prot = ProtFlags::READ | ProtFlags::WRITE;
    let fixed = if hint.is_null() {
        MapFlags::empty()
    } else {
        MapFlags::FIXED
    };
    // SAFETY: as the caller promises.
    let sync = unsafe {
        rustix::mm::mmap(
            hint,
            len,
            prot,
            MapFlags::SHARED_VALIDATE | MapFlags::SYNC | fixed,
            file,
            file_offset,
        )
    };
    match sync {
        Ok(addr) => Ok((addr, MapMode::Sync)),
        // SAFETY: as above, without MAP_SYNC.
        Err(_) => unsafe {
            rustix::mm::mmap(hint, len, prot, MapFlags::SHARED | fixed, file, file_offset)
        }
        .map(|addr| (addr, MapMode::Shared))
        .map_err(Into::into),
    }
}

/// Reserves `span` bytes of address space wherever the kernel picks (private zero pages,
/// readable so a stray read of a part no file backs never faults; no
/// memory taken).
fn reserve_anywhere(span: usize) -> std::io::Result<*mut std::ffi::c_void> {
    // SAFETY: a fresh private mapping at an address the kernel picks; no existing
    // memory is affected.
    let got = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            span,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::NORESERVE,
        )
    }?;
    Ok(got)
}

/// Reserves `[at, at + len)` with a private anonymous mapping, or fails with
/// [`address_taken`] when anything is mapped in that range.
fn reserve(at: usize, len: usize) -> std::io::Result<*mut std::ffi::c_void> {
    let want = at as *mut std::ffi::c_void;
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the new one is
    // private and takes no memory until touched.
    let got = unsafe {
        rustix::mm::mmap_anonymous(
            want,
            len,
            ProtFlags::READ | ProtFlags::WRITE,
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
