//! Copies into and out of the mapping (and the log engine's DRAM home cache pages) as
//! atomic 8-byte word accesses.
//!
//! The mapping is shared memory that threads read optimistically while others store
//! into it: an in-place engine's transaction copies an object's bytes while a committer
//! may be writing them, then throws the copy away when the stripe's lock word says so
//! (a seqlock). With plain `memcpy` on both sides that is a data race, undefined
//! behaviour in Rust's memory model however the copy is used afterwards. With atomic
//! accesses on both sides it is a race the model defines: the reader gets some mix of
//! old and new words, which its validation discards (crossbeam's `AtomicCell` and
//! `seqlock` crates reason the same way).
//!
//! Every access here is a relaxed load or store of a whole aligned `AtomicU64`, so
//! accesses of different sizes never race (the model leaves those undefined too): a
//! load covers the words its range touches, a store of part of a word updates the word
//! with a compare-and-swap that keeps its other bytes. [`super::Media::read_u64`] and
//! [`super::Media::write_u64`] are whole-word accesses as well.
//!
//! Written by hand: no crate copies a runtime-length range this way (`atomic-memcpy`
//! copies one value of a static type).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const WORD: usize = 8;

/// The word containing byte `p`.
///
/// # Safety
/// The aligned word around `p` must be valid for atomic access.
unsafe fn word_at<'a>(p: *const u8) -> &'a AtomicU64 {
    let aligned = p.wrapping_sub(p as usize % WORD);
    // SAFETY: aligned, and valid as the caller promises; `AtomicU64` has the size and
    // alignment of `u64`, and any bit pattern is valid.
    unsafe { &*(aligned as *const AtomicU64) }
}

/// Copies `out.len()` bytes at `src` into `out`.
///
/// # Safety
/// Every aligned word that `src..src + out.len()` touches must be valid for reads, and
/// every concurrent store to those words must be an atomic 8-byte one (this module's,
/// or [`super::Media::write_u64`]'s).
#[inline]
pub(crate) unsafe fn load(src: *const u8, out: &mut [u8]) {
    let word = |p: *const u8| {
        // SAFETY: the word holds a byte of the range, which the caller vouches for.
        unsafe { word_at(p) }.load(Relaxed).to_ne_bytes()
    };
    // A partial first word, whole words (a fixed-size copy each), a partial last word.
    let skip = src as usize % WORD;
    let mut rest = out;
    let mut p = src;
    if skip != 0 {
        let n = (WORD - skip).min(rest.len());
        let (head, tail) = rest.split_at_mut(n);
        head.copy_from_slice(&word(p)[skip..skip + n]);
        rest = tail;
        p = p.wrapping_add(n);
    }
    let mut words = rest.chunks_exact_mut(WORD);
    for chunk in &mut words {
        chunk.copy_from_slice(&word(p));
        p = p.wrapping_add(WORD);
    }
    let last = words.into_remainder();
    if !last.is_empty() {
        let n = last.len();
        last.copy_from_slice(&word(p)[..n]);
    }
}

/// Stores `bytes` at `dst`.
///
/// # Safety
/// Every aligned word that `dst..dst + bytes.len()` touches must be valid for reads and
/// writes, and every concurrent access to those words must be an atomic 8-byte one.
#[inline]
pub(crate) unsafe fn store(dst: *mut u8, bytes: &[u8]) {
    // Part of a word: keep the bytes around it, which another thread may store.
    let store_part = |p: *mut u8, part: &[u8]| {
        let skip = p as usize % WORD;
        // SAFETY: the word holds a byte of the range, which the caller vouches for.
        let _ = unsafe { word_at(p) }.fetch_update(Relaxed, Relaxed, |old| {
            let mut w = old.to_ne_bytes();
            w[skip..skip + part.len()].copy_from_slice(part);
            Some(u64::from_ne_bytes(w))
        });
    };
    let skip = dst as usize % WORD;
    let mut rest = bytes;
    let mut p = dst;
    if skip != 0 {
        let n = (WORD - skip).min(rest.len());
        store_part(p, &rest[..n]);
        rest = &rest[n..];
        p = p.wrapping_add(n);
    }
    let mut words = rest.chunks_exact(WORD);
    for chunk in &mut words {
        let mut w = [0u8; WORD];
        w.copy_from_slice(chunk);
        // SAFETY: as in `store_part`.
        unsafe { word_at(p) }.store(u64::from_ne_bytes(w), Relaxed);
        p = p.wrapping_add(WORD);
    }
    let last = words.remainder();
    if !last.is_empty() {
        store_part(p, last);
    }
}

/// Stores `len` copies of `byte` at `dst`.
///
/// # Safety
/// As [`store`].
pub(crate) unsafe fn fill(dst: *mut u8, len: usize, byte: u8) {
    let piece = [byte; 512];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(piece.len());
        // SAFETY: a part of the caller's range.
        unsafe { store(dst.wrapping_add(done), &piece[..n]) };
        done += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_range_round_trips_and_leaves_its_neighbours_alone() {
        let mut backing = vec![0u64; 8];
        let base = backing.as_mut_ptr() as *mut u8;
        for start in 0..20 {
            for len in 0..30 {
                let before: Vec<u8> = (0..64).map(|i| i as u8).collect();
                // SAFETY: the test's own buffer, 64 bytes, whole words, one thread.
                unsafe { store(base, &before) };
                let bytes: Vec<u8> = (0..len).map(|i| 200 + i as u8).collect();
                // SAFETY: as above; `start + len` stays under 64.
                unsafe { store(base.add(start), &bytes) };
                let mut all = [0u8; 64];
                // SAFETY: as above.
                unsafe { load(base, &mut all) };
                let mut want = before.clone();
                want[start..start + len].copy_from_slice(&bytes);
                assert_eq!(all.to_vec(), want, "start {start} len {len}");
                let mut part = vec![0u8; len];
                // SAFETY: as above.
                unsafe { load(base.add(start), &mut part) };
                assert_eq!(part, bytes);
                // SAFETY: as above.
                unsafe { fill(base.add(start), len, 0xEE) };
                // SAFETY: as above.
                unsafe { load(base, &mut all) };
                want[start..start + len].fill(0xEE);
                assert_eq!(all.to_vec(), want, "fill: start {start} len {len}");
            }
        }
        drop(backing);
    }
}
