//! The first mapping layer: partition number -> partition, in O(1) (a shift and three
//! array lookups). Home space is 47-bit and virtual, so a flat array of every partition
//! would be huge; a three-level radix directory of lazily made arrays holds only the
//! partitions that stores have touched.

use std::sync::atomic::{AtomicPtr, Ordering};

/// A fixed-size array of lazily made, never-moved `T`s.
#[derive(Debug)]
struct Slots<T> {
    slots: Box<[AtomicPtr<T>]>,
}

impl<T> Slots<T> {
    fn new(n: usize) -> Self {
        Slots {
            slots: (0..n)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        }
    }

    fn get(&self, i: usize) -> Option<&T> {
        let p = self.slots[i].load(Ordering::Acquire);
        // SAFETY: non-null slots hold a leaked Box that lives until `self` drops.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    fn get_or_make(&self, i: usize, make: impl FnOnce() -> T) -> &T {
        if let Some(t) = self.get(i) {
            return t;
        }
        let fresh = Box::into_raw(Box::new(make()));
        match self.slots[i].compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: we just installed `fresh`; it lives until `self` drops.
            Ok(_) => unsafe { &*fresh },
            Err(existing) => {
                // SAFETY: `fresh` lost the race and was never shared.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: the winner's Box lives until `self` drops.
                unsafe { &*existing }
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        (0..self.slots.len()).filter_map(|i| self.get(i))
    }

    /// The made `T`s with their slot numbers.
    fn numbered(&self) -> impl Iterator<Item = (usize, &T)> {
        (0..self.slots.len()).filter_map(|i| Some((i, self.get(i)?)))
    }
}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        for s in self.slots.iter() {
            let p = s.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: each non-null slot owns one Box made by `get_or_make`.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

/// Partitions indexed by number, in three radix levels.
#[derive(Debug)]
pub(crate) struct Directory<P> {
    bits: [u32; 3],
    root: Slots<Slots<Slots<P>>>,
}

impl<P> Directory<P> {
    /// A directory for partition numbers below `2^index_bits`.
    pub(crate) fn new(index_bits: u32) -> Self {
        let low = index_bits / 3;
        let bits = [index_bits - 2 * low, low, low];
        Directory {
            bits,
            root: Slots::new(1 << bits[0]),
        }
    }

    fn split(&self, p: u64) -> [usize; 3] {
        let [_, b1, b2] = self.bits;
        [
            (p >> (b1 + b2)) as usize,
            ((p >> b2) & ((1 << b1) - 1)) as usize,
            (p & ((1 << b2) - 1)) as usize,
        ]
    }

    /// Partition `p`, if it was ever made.
    #[inline]
    pub(crate) fn get(&self, p: u64) -> Option<&P> {
        let [a, b, c] = self.split(p);
        self.root.get(a)?.get(b)?.get(c)
    }

    /// Partition `p`, made on first use.
    pub(crate) fn get_or_make(&self, p: u64, make: impl FnOnce() -> P) -> &P {
        let [a, b, c] = self.split(p);
        let [_, b1, b2] = self.bits;
        self.root
            .get_or_make(a, || Slots::new(1 << b1))
            .get_or_make(b, || Slots::new(1 << b2))
            .get_or_make(c, make)
    }

    /// Every partition made so far, in order.
    pub(crate) fn partitions(&self) -> impl Iterator<Item = &P> {
        self.root
            .iter()
            .flat_map(|m| m.iter())
            .flat_map(|l| l.iter())
    }

    /// Every partition made so far with its number, in order.
    pub(crate) fn numbered(&self) -> impl Iterator<Item = (u64, &P)> {
        let [_, b1, b2] = self.bits;
        self.root.numbered().flat_map(move |(a, m)| {
            m.numbered().flat_map(move |(b, l)| {
                l.numbered()
                    .map(move |(c, p)| ((((a as u64) << b1 | b as u64) << b2) | c as u64, p))
            })
        })
    }

    /// DRAM held by the directory arrays.
    pub(crate) fn dram_bytes(&self) -> usize {
        let ptr = std::mem::size_of::<usize>();
        let mids = self.root.iter().count();
        let leaves: usize = self.root.iter().map(|m| m.iter().count()).sum();
        ptr * ((1 << self.bits[0]) + mids * (1 << self.bits[1]) + leaves * (1 << self.bits[2]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_made_once_and_found_again() {
        let d: Directory<u64> = Directory::new(35);
        assert!(d.get(12345).is_none());
        assert_eq!(*d.get_or_make(12345, || 7), 7);
        assert_eq!(*d.get_or_make(12345, || 8), 7);
        assert_eq!(*d.get_or_make((1 << 35) - 1, || 9), 9);
        assert_eq!(d.get(12345), Some(&7));
        assert_eq!(d.partitions().count(), 2);
        let numbered: Vec<(u64, u64)> = d.numbered().map(|(p, v)| (p, *v)).collect();
        assert_eq!(numbered, [(12345, 7), ((1 << 35) - 1, 9)]);
        let single: Directory<u64> = Directory::new(0);
        assert_eq!(*single.get_or_make(0, || 1), 1);
    }
}
