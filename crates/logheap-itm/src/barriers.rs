//! The read, write and log barriers of GNU TM's ABI for every type it names (`U1`..`U8`,
//! `F`, `D`, `CF`, `CD`, `M64`, `M128`, `M256`; `E` and `CE` are in [`crate::jump`]),
//! and the byte-range functions (`memcpy`, `memmove`, `memset` and `_ITM_LB`).
//!
//! Every access goes through two functions: [`lh_itm_read`] and [`lh_itm_write`].
//! Inside a transaction, bytes in the TM pool are read and written through the
//! pool's transaction (a conflict restarts it); other memory (the stack, the C heap)
//! is read in place and written in place, its old bytes kept in the undo log for a
//! restart or a cancel. Outside a transaction (a transactional clone called from
//! ordinary code) every access is a plain one.
//!
//! The variants `RaR`, `RaW`, `RfW`, `WaR` and `WaW` are hints of what the
//! transaction did to the same address before; they all do what `R` and `W` do.

// `__m128` and `__m256` travel in xmm and ymm registers in the C ABI, as GCC's vector
// types do: the lint's "unspecified layout" does not apply to them.
#![allow(improper_ctypes_definitions)]

use std::arch::x86_64::{__m128, __m256};

use logheap::Error;

use crate::pool;
use crate::txn::{self, fatal, with_desc};

/// What a pool access found.
enum Outcome {
    Done,
    Conflict,
    Failed(Error),
}

/// Reads `n` bytes at `src` into `dst`, transactionally where `src` is in the pool.
///
/// # Safety
/// `dst` is valid for `n` bytes of writes; `src` for `n` bytes of reads.
pub(crate) unsafe extern "C" fn lh_itm_read(dst: *mut u8, src: *const u8, n: usize) {
    if n == 0 {
        return;
    }
    let outcome = with_desc(|d| {
        let Some(tx) = d.tx.as_mut().filter(|_| d.nesting > 0) else {
            // SAFETY: as the caller promises.
            unsafe { std::ptr::copy(src, dst, n) };
            return Outcome::Done;
        };
        for (at, len, home) in pool::pieces(src as usize, n) {
            // SAFETY: a part of the caller's ranges.
            let out = unsafe { std::slice::from_raw_parts_mut(dst.add(at), len) };
            match home {
                Some(home) => match tx.read_bytes(home, out) {
                    Ok(()) => {}
                    Err(Error::Conflict { .. }) => return Outcome::Conflict,
                    Err(e) => return Outcome::Failed(e),
                },
                // SAFETY: a part of the caller's ranges (memory outside the pool).
                None => unsafe { std::ptr::copy(src.add(at), out.as_mut_ptr(), len) },
            }
        }
        Outcome::Done
    });
    finish(outcome, "read");
}

/// Writes the `n` bytes at `src` at `dst`, transactionally where `dst` is in the pool.
///
/// # Safety
/// `dst` is valid for `n` bytes of writes; `src` for `n` bytes of reads.
pub(crate) unsafe extern "C" fn lh_itm_write(dst: *mut u8, src: *const u8, n: usize) {
    if n == 0 {
        return;
    }
    let outcome = with_desc(|d| {
        if d.nesting == 0 {
            // SAFETY: as the caller promises.
            unsafe { std::ptr::copy(src, dst, n) };
            return Outcome::Done;
        }
        for (at, len, home) in pool::pieces(dst as usize, n) {
            // SAFETY: a part of the caller's ranges.
            let bytes = unsafe { std::slice::from_raw_parts(src.add(at), len) };
            match (home, d.tx.as_mut()) {
                (Some(home), Some(tx)) => match tx.write_bytes(home, bytes) {
                    Ok(()) => {}
                    Err(Error::Conflict { .. }) => return Outcome::Conflict,
                    Err(e) => return Outcome::Failed(e),
                },
                _ => {
                    txn::log_volatile(d, dst as usize + at, len);
                    // SAFETY: a part of the caller's ranges (memory outside the pool).
                    unsafe { std::ptr::copy(bytes.as_ptr(), dst.add(at), len) };
                }
            }
        }
        Outcome::Done
    });
    finish(outcome, "write");
}

/// Saves the `n` bytes at `addr` for a restart (`_ITM_L*`: memory the program will
/// write without a barrier, which GCC takes for the thread's own). Pool memory written
/// without barriers would escape the pool transaction: that ends the process.
fn log(addr: *const u8, n: usize) {
    let in_pool = with_desc(|d| {
        if d.nesting == 0 {
            return false;
        }
        for (at, len, home) in pool::pieces(addr as usize, n) {
            if home.is_some() {
                return true;
            }
            txn::log_volatile(d, addr as usize + at, len);
        }
        false
    });
    if in_pool {
        fatal(
            "GCC logs pool memory it will write without barriers (is an allocator of pool memory declared __attribute__((malloc))?)",
        );
    }
}

/// Acts on a pool access's outcome: a conflict restarts the transaction; an error
/// (a range of the pool a transaction may not touch) ends the process.
fn finish(outcome: Outcome, what: &str) {
    match outcome {
        Outcome::Done => {}
        Outcome::Conflict => txn::restart(),
        Outcome::Failed(e) => fatal(&format!("a transactional {what} failed: {e}")),
    }
}

/// A plain value read through [`lh_itm_read`].
fn read<T: Copy>(p: *const T) -> T {
    let mut v = std::mem::MaybeUninit::<T>::uninit();
    // SAFETY: GCC passes the address of a `T`; `v` has room for one.
    unsafe {
        lh_itm_read(v.as_mut_ptr().cast(), p.cast(), size_of::<T>());
        v.assume_init()
    }
}

/// A plain value written through [`lh_itm_write`].
fn write<T: Copy>(p: *mut T, v: T) {
    // SAFETY: GCC passes the address of a `T`; `v` is one.
    unsafe { lh_itm_write(p.cast(), (&raw const v).cast(), size_of::<T>()) }
}

/// `float _Complex` (returned and passed in one SSE register, as a struct of two
/// floats is).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ComplexF {
    re: f32,
    im: f32,
}

/// `double _Complex` (two SSE registers, as a struct of two doubles).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ComplexD {
    re: f64,
    im: f64,
}

/// `__m64` (one SSE register, as a struct of one double; its bits are only moved).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct M64 {
    bits: f64,
}

macro_rules! barriers {
    ($($t:ty => $r:ident $rar:ident $raw:ident $rfw:ident, $w:ident $war:ident $waw:ident, $l:ident;)+) => {$(
        barriers!(@read $t, $r, $rar, $raw, $rfw);
        barriers!(@write $t, $w, $war, $waw);
        #[doc = concat!("`", stringify!($l), "`: saves the value at `p` for a restart.")]
        ///
        /// # Safety
        /// Called by GCC-instrumented code.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $l(p: *const $t) {
            log(p.cast(), size_of::<$t>());
        }
    )+};
    (@read $t:ty, $($name:ident),+) => {$(
        #[doc = concat!("`", stringify!($name), "`: a transactional read of a `", stringify!($t), "`.")]
        ///
        /// # Safety
        /// Called by GCC-instrumented code with a readable address.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(p: *const $t) -> $t {
            read(p)
        }
    )+};
    (@write $t:ty, $($name:ident),+) => {$(
        #[doc = concat!("`", stringify!($name), "`: a transactional write of a `", stringify!($t), "`.")]
        ///
        /// # Safety
        /// Called by GCC-instrumented code with a writable address.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(p: *mut $t, v: $t) {
            write(p, v)
        }
    )+};
}

barriers! {
    u8 => _ITM_RU1 _ITM_RaRU1 _ITM_RaWU1 _ITM_RfWU1, _ITM_WU1 _ITM_WaRU1 _ITM_WaWU1, _ITM_LU1;
    u16 => _ITM_RU2 _ITM_RaRU2 _ITM_RaWU2 _ITM_RfWU2, _ITM_WU2 _ITM_WaRU2 _ITM_WaWU2, _ITM_LU2;
    u32 => _ITM_RU4 _ITM_RaRU4 _ITM_RaWU4 _ITM_RfWU4, _ITM_WU4 _ITM_WaRU4 _ITM_WaWU4, _ITM_LU4;
    u64 => _ITM_RU8 _ITM_RaRU8 _ITM_RaWU8 _ITM_RfWU8, _ITM_WU8 _ITM_WaRU8 _ITM_WaWU8, _ITM_LU8;
    f32 => _ITM_RF _ITM_RaRF _ITM_RaWF _ITM_RfWF, _ITM_WF _ITM_WaRF _ITM_WaWF, _ITM_LF;
    f64 => _ITM_RD _ITM_RaRD _ITM_RaWD _ITM_RfWD, _ITM_WD _ITM_WaRD _ITM_WaWD, _ITM_LD;
    ComplexF => _ITM_RCF _ITM_RaRCF _ITM_RaWCF _ITM_RfWCF, _ITM_WCF _ITM_WaRCF _ITM_WaWCF, _ITM_LCF;
    ComplexD => _ITM_RCD _ITM_RaRCD _ITM_RaWCD _ITM_RfWCD, _ITM_WCD _ITM_WaRCD _ITM_WaWCD, _ITM_LCD;
    M64 => _ITM_RM64 _ITM_RaRM64 _ITM_RaWM64 _ITM_RfWM64, _ITM_WM64 _ITM_WaRM64 _ITM_WaWM64, _ITM_LM64;
    __m128 => _ITM_RM128 _ITM_RaRM128 _ITM_RaWM128 _ITM_RfWM128, _ITM_WM128 _ITM_WaRM128 _ITM_WaWM128, _ITM_LM128;
}

/// The 256-bit vector barriers: their values travel in AVX registers, so they are
/// compiled for AVX (only code built for AVX calls them).
macro_rules! avx_barriers {
    (read $($name:ident),+; write $($wname:ident),+; log $l:ident) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: a transactional read of an `__m256`.")]
            ///
            /// # Safety
            /// Called by GCC-instrumented code built for AVX, with a readable address.
            #[unsafe(no_mangle)]
            #[target_feature(enable = "avx")]
            pub unsafe extern "C" fn $name(p: *const __m256) -> __m256 {
                read(p)
            }
        )+
        $(
            #[doc = concat!("`", stringify!($wname), "`: a transactional write of an `__m256`.")]
            ///
            /// # Safety
            /// Called by GCC-instrumented code built for AVX, with a writable address.
            #[unsafe(no_mangle)]
            #[target_feature(enable = "avx")]
            pub unsafe extern "C" fn $wname(p: *mut __m256, v: __m256) {
                write(p, v)
            }
        )+
        /// `_ITM_LM256`: saves the `__m256` at `p` for a restart.
        ///
        /// # Safety
        /// Called by GCC-instrumented code.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $l(p: *const __m256) {
            log(p.cast(), 32);
        }
    };
}

avx_barriers!(
    read _ITM_RM256, _ITM_RaRM256, _ITM_RaWM256, _ITM_RfWM256;
    write _ITM_WM256, _ITM_WaRM256, _ITM_WaWM256;
    log _ITM_LM256
);

/// `_ITM_LB`: saves `len` bytes at `p` for a restart.
///
/// # Safety
/// Called by GCC-instrumented code.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ITM_LB(p: *const u8, len: usize) {
    log(p, len);
}

/// Copies `n` bytes from `src` to `dst` through the barriers (in pieces, through a
/// buffer, so that overlapping ranges copy as `memmove` does).
///
/// # Safety
/// The ranges are valid as for `memmove`.
unsafe fn copy_through(dst: *mut u8, src: *const u8, n: usize) {
    const PIECE: usize = 256;
    let mut buf = [0u8; PIECE];
    let forward = (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize) + n;
    let mut done = 0;
    while done < n {
        let len = (n - done).min(PIECE);
        let at = if forward { done } else { n - done - len };
        // SAFETY: parts of the caller's ranges; `buf` holds `len` bytes.
        unsafe {
            lh_itm_read(buf.as_mut_ptr(), src.add(at), len);
            lh_itm_write(dst.add(at), buf.as_ptr(), len);
        }
        done += len;
    }
}

macro_rules! copies {
    ($($name:ident),+ $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: a transactional `memcpy`/`memmove` (the hints in its name change nothing).")]
        ///
        /// # Safety
        /// The ranges are valid as for `memmove`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dst: *mut u8, src: *const u8, n: usize) {
            // SAFETY: as the caller promises.
            unsafe { copy_through(dst, src, n) }
        }
    )+};
}

copies!(
    _ITM_memcpyRnWt,
    _ITM_memcpyRnWtaR,
    _ITM_memcpyRnWtaW,
    _ITM_memcpyRtWn,
    _ITM_memcpyRtWt,
    _ITM_memcpyRtWtaR,
    _ITM_memcpyRtWtaW,
    _ITM_memcpyRtaRWn,
    _ITM_memcpyRtaRWt,
    _ITM_memcpyRtaRWtaR,
    _ITM_memcpyRtaRWtaW,
    _ITM_memcpyRtaWWn,
    _ITM_memcpyRtaWWt,
    _ITM_memcpyRtaWWtaR,
    _ITM_memcpyRtaWWtaW,
    _ITM_memmoveRnWt,
    _ITM_memmoveRnWtaR,
    _ITM_memmoveRnWtaW,
    _ITM_memmoveRtWn,
    _ITM_memmoveRtWt,
    _ITM_memmoveRtWtaR,
    _ITM_memmoveRtWtaW,
    _ITM_memmoveRtaRWn,
    _ITM_memmoveRtaRWt,
    _ITM_memmoveRtaRWtaR,
    _ITM_memmoveRtaRWtaW,
    _ITM_memmoveRtaWWn,
    _ITM_memmoveRtaWWt,
    _ITM_memmoveRtaWWtaR,
    _ITM_memmoveRtaWWtaW,
);

macro_rules! sets {
    ($($name:ident),+ $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: a transactional `memset`.")]
        ///
        /// # Safety
        /// `dst` is valid for `n` bytes of writes.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dst: *mut u8, c: i32, n: usize) {
            let buf = [c as u8; 256];
            let mut done = 0;
            while done < n {
                let len = (n - done).min(buf.len());
                // SAFETY: a part of the caller's range.
                unsafe { lh_itm_write(dst.add(done), buf.as_ptr(), len) };
                done += len;
            }
        }
    )+};
}

sets!(_ITM_memsetW, _ITM_memsetWaR, _ITM_memsetWaW);

/// `_ITM_LE`: saves the `long double` at `p` for a restart.
///
/// # Safety
/// Called by GCC-instrumented code.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ITM_LE(p: *const u8) {
    log(p, 16);
}

/// `_ITM_LCE`: saves the `long double _Complex` at `p` for a restart.
///
/// # Safety
/// Called by GCC-instrumented code.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ITM_LCE(p: *const u8) {
    log(p, 32);
}
