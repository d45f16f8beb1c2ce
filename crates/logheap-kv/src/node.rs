//! The B+ tree's persistent node formats, and the key comparison they need.
//!
//! A key is found through a [`KeyRef`]: its first [`PREFIX`] bytes (zero padded), its
//! length and the home offset of the bytes that hold it whole. Most comparisons end at
//! the prefix, so a descent reads one node per level and only now and then a key's tail.
//! Leaf entries point to a record (the key's bytes, then the value's); inner separators
//! to a key blob of their own.

use std::cmp::Ordering;

use logheap::{PPtr, Tx};

use crate::Error;

/// Bytes of a key kept in the node.
pub(crate) const PREFIX: usize = 16;
/// Entries in a leaf.
pub(crate) const LEAF_SLOTS: usize = 32;
/// Separators in an inner node (children: one more).
pub(crate) const INNER_KEYS: usize = 32;

/// The tag word of a leaf.
pub(crate) const LEAF_TAG: u64 = u64::from_le_bytes(*b"kvleaf01");
/// The tag word of an inner node.
pub(crate) const INNER_TAG: u64 = u64::from_le_bytes(*b"kvinnr01");

/// A key in a node: prefix, lengths and where the whole key is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct KeyRef {
    /// The key's first bytes, zero padded.
    pub prefix: [u8; PREFIX],
    /// The key's length.
    pub key_len: u32,
    /// The value's length (leaves; 0 in inner nodes).
    pub value_len: u32,
    /// The record (leaves: key then value) or key blob (inner nodes); 0 when both
    /// lengths are 0.
    pub at: u64,
}

/// A leaf: entries in key order, linked both ways for scans.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct Leaf {
    pub tag: u64,
    pub count: u64,
    pub prev: u64,
    pub next: u64,
    pub slots: [KeyRef; LEAF_SLOTS],
}

/// An inner node: `children[i]` holds keys below `keys[i]`, `children[i + 1]` keys from
/// `keys[i]` up.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct Inner {
    pub tag: u64,
    pub count: u64,
    pub keys: [KeyRef; INNER_KEYS],
    pub children: [u64; INNER_KEYS + 1],
    pub _reserved: u64,
}

impl Leaf {
    pub(crate) fn empty() -> Leaf {
        Leaf {
            tag: LEAF_TAG,
            ..bytemuck::Zeroable::zeroed()
        }
    }

    /// The entry count, never more than fits (the stored word may be damaged).
    pub(crate) fn n(&self) -> usize {
        (self.count as usize).min(LEAF_SLOTS)
    }

    pub(crate) fn insert(&mut self, at: usize, key: KeyRef) {
        let n = self.n();
        self.slots.copy_within(at..n, at + 1);
        self.slots[at] = key;
        self.count = n as u64 + 1;
    }

    pub(crate) fn remove(&mut self, at: usize) {
        let n = self.n();
        self.slots.copy_within(at + 1..n, at);
        self.slots[n - 1] = bytemuck::Zeroable::zeroed();
        self.count = n as u64 - 1;
    }
}

impl Inner {
    pub(crate) fn empty() -> Inner {
        Inner {
            tag: INNER_TAG,
            ..bytemuck::Zeroable::zeroed()
        }
    }

    /// The separator count, never more than fits.
    pub(crate) fn n(&self) -> usize {
        (self.count as usize).min(INNER_KEYS)
    }

    /// Inserts separator `key` at `at` with `child` to its right.
    pub(crate) fn insert(&mut self, at: usize, key: KeyRef, child: u64) {
        let n = self.n();
        self.keys.copy_within(at..n, at + 1);
        self.keys[at] = key;
        self.children.copy_within(at + 1..n + 1, at + 2);
        self.children[at + 1] = child;
        self.count = n as u64 + 1;
    }

    /// Removes child `child` and one separator beside it (the one to its left, or the
    /// first when it is the first child); returns that separator (`None` when the node
    /// had none).
    pub(crate) fn remove_child(&mut self, child: usize) -> Option<KeyRef> {
        let n = self.n();
        self.children.copy_within(child + 1..n + 1, child);
        self.children[n] = 0;
        if n == 0 {
            return None;
        }
        let key_at = child.saturating_sub(1);
        let removed = self.keys[key_at];
        self.keys.copy_within(key_at + 1..n, key_at);
        self.keys[n - 1] = bytemuck::Zeroable::zeroed();
        self.count = n as u64 - 1;
        Some(removed)
    }
}

/// The prefix of `key` as stored.
pub(crate) fn prefix_of(key: &[u8]) -> [u8; PREFIX] {
    let mut p = [0u8; PREFIX];
    let n = key.len().min(PREFIX);
    p[..n].copy_from_slice(&key[..n]);
    p
}

/// A key being looked for, with its prefix computed once.
pub(crate) struct SearchKey<'k> {
    pub bytes: &'k [u8],
    pub prefix: [u8; PREFIX],
}

impl<'k> SearchKey<'k> {
    pub(crate) fn new(bytes: &'k [u8]) -> SearchKey<'k> {
        SearchKey {
            bytes,
            prefix: prefix_of(bytes),
        }
    }

    /// How this key compares with the stored key `stored`. When prefixes and lengths
    /// cannot decide, the stored key's tail is read into `scratch`.
    pub(crate) fn cmp(
        &self,
        tx: &mut Tx<'_>,
        stored: &KeyRef,
        scratch: &mut Vec<u8>,
    ) -> Result<Ordering, Error> {
        match self.prefix.cmp(&stored.prefix) {
            Ordering::Equal => {}
            other => return Ok(other),
        }
        let (mine, theirs) = (self.bytes.len(), stored.key_len as usize);
        if mine.min(theirs) <= PREFIX {
            // The shorter key lies within its prefix, so it is a prefix of the longer.
            return Ok(mine.cmp(&theirs));
        }
        let from = stored_range(tx, stored.at, PREFIX as u64, theirs - PREFIX)?;
        scratch.clear();
        scratch.resize(theirs - PREFIX, 0);
        tx.read_bytes(from, scratch)?;
        Ok(self.bytes[PREFIX..].cmp(&scratch[..]))
    }
}

/// The first index of `keys` whose key is not below `key`, and whether it is equal.
pub(crate) fn lower_bound(
    tx: &mut Tx<'_>,
    keys: &[KeyRef],
    key: &SearchKey<'_>,
    scratch: &mut Vec<u8>,
) -> Result<(usize, bool), Error> {
    let (mut lo, mut hi) = (0, keys.len());
    let mut equal = false;
    while lo < hi {
        let mid = (lo + hi) / 2;
        match key.cmp(tx, &keys[mid], scratch)? {
            Ordering::Greater => lo = mid + 1,
            Ordering::Equal => {
                hi = mid;
                equal = true;
            }
            Ordering::Less => hi = mid,
        }
    }
    // Keys are distinct, so an equal key met on the way is the one at `lo`.
    Ok((lo, equal))
}

/// The child of `node` to descend into for `key`: past every separator not above it.
pub(crate) fn child_index(
    tx: &mut Tx<'_>,
    node: &Inner,
    key: &SearchKey<'_>,
    scratch: &mut Vec<u8>,
) -> Result<usize, Error> {
    let (i, equal) = lower_bound(tx, &node.keys[..node.n()], key, scratch)?;
    Ok(if equal { i + 1 } else { i })
}

/// Reads the whole key of `stored` into `out`.
pub(crate) fn read_key(tx: &mut Tx<'_>, stored: &KeyRef, out: &mut Vec<u8>) -> Result<(), Error> {
    out.clear();
    let len = stored.key_len as usize;
    if len <= PREFIX {
        out.extend_from_slice(&stored.prefix[..len]);
        return Ok(());
    }
    let from = stored_range(tx, stored.at, PREFIX as u64, len - PREFIX)?;
    out.resize(len, 0);
    out[..PREFIX].copy_from_slice(&stored.prefix);
    Ok(tx.read_bytes(from, &mut out[PREFIX..])?)
}

/// Reads the value of the leaf entry `stored` into `out`.
pub(crate) fn read_value(tx: &mut Tx<'_>, stored: &KeyRef, out: &mut Vec<u8>) -> Result<(), Error> {
    out.clear();
    let len = stored.value_len as usize;
    if len == 0 {
        return Ok(());
    }
    let from = stored_range(tx, stored.at, stored.key_len as u64, len)?;
    out.resize(len, 0);
    Ok(tx.read_bytes(from, out)?)
}

/// Lengths above which a read of stored bytes first checks them against the size of
/// the object they lie in, so that a damaged length is an error before a buffer that
/// large is allocated (the log engine's home space reads as zeros far past what was
/// written, so a range check alone would not catch it).
const CHECK_ABOVE: usize = 64 << 10;

/// The home offset `at + skip` where `len` stored bytes of the record (or key blob) at
/// `at` begin, checked: an offset past the end of the address space is damage, and so
/// is a long range that does not fit the object.
pub(crate) fn stored_range(tx: &mut Tx<'_>, at: u64, skip: u64, len: usize) -> Result<u64, Error> {
    let damaged = || corrupt(at, "a record as long as its entry says");
    let from = at.checked_add(skip).ok_or_else(damaged)?;
    let needed = skip.checked_add(len as u64).ok_or_else(damaged)?;
    from.checked_add(len as u64).ok_or_else(damaged)?;
    if len > CHECK_ABOVE && tx.allocation_size(at).is_none_or(|size| size < needed) {
        return Err(damaged());
    }
    Ok(from)
}

/// Checks that `at` holds a leaf, reading only its tag (so the read does not take in
/// the leaf's entries, which concurrent writers change).
pub(crate) fn check_leaf(tx: &mut Tx<'_>, at: u64) -> Result<(), Error> {
    let tag: u64 = tx.read(PPtr::from_offset(at))?;
    if tag != LEAF_TAG {
        return Err(corrupt(at, "a leaf"));
    }
    Ok(())
}

pub(crate) fn read_leaf(tx: &mut Tx<'_>, at: u64) -> Result<Leaf, Error> {
    let leaf: Leaf = tx.read(PPtr::from_offset(at))?;
    if leaf.tag != LEAF_TAG {
        return Err(corrupt(at, "a leaf"));
    }
    Ok(leaf)
}

pub(crate) fn read_inner(tx: &mut Tx<'_>, at: u64) -> Result<Inner, Error> {
    let inner: Inner = tx.read(PPtr::from_offset(at))?;
    if inner.tag != INNER_TAG {
        return Err(corrupt(at, "an inner node"));
    }
    Ok(inner)
}

/// Where an inner node's separators and children begin.
const INNER_KEYS_AT: u64 = std::mem::offset_of!(Inner, keys) as u64;
const INNER_CHILDREN_AT: u64 = std::mem::offset_of!(Inner, children) as u64;
/// Where a leaf's entries begin (after tag, count, prev, next).
const LEAF_SLOTS_AT: u64 = std::mem::offset_of!(Leaf, slots) as u64;

/// Reads what a search of the inner node at `at` needs, its count and its separators
/// (not the unused ones, nor the children), into `node`; returns the count. Searches
/// read a node in parts: a whole one is 1.3 KB over 21 lock stripes.
pub(crate) fn read_inner_keys(tx: &mut Tx<'_>, at: u64, node: &mut Inner) -> Result<usize, Error> {
    let mut head = [0u64; 2];
    tx.read_bytes(at, bytemuck::cast_slice_mut(&mut head))?;
    if head[0] != INNER_TAG {
        return Err(corrupt(at, "an inner node"));
    }
    let n = (head[1] as usize).min(INNER_KEYS);
    node.count = n as u64;
    tx.read_bytes(
        at + INNER_KEYS_AT,
        bytemuck::cast_slice_mut(&mut node.keys[..n]),
    )?;
    Ok(n)
}

/// Child `i` of the inner node at `at`.
pub(crate) fn read_child(tx: &mut Tx<'_>, at: u64, i: usize) -> Result<u64, Error> {
    Ok(tx.read(PPtr::<u64>::from_offset(
        at + INNER_CHILDREN_AT + 8 * i as u64,
    ))?)
}

/// Reads a leaf's header and its entries in use (not the unused slots) into `leaf`.
pub(crate) fn read_leaf_used(tx: &mut Tx<'_>, at: u64, leaf: &mut Leaf) -> Result<(), Error> {
    let mut head = [0u64; 4];
    tx.read_bytes(at, bytemuck::cast_slice_mut(&mut head))?;
    if head[0] != LEAF_TAG {
        return Err(corrupt(at, "a leaf"));
    }
    let n = (head[1] as usize).min(LEAF_SLOTS);
    (leaf.tag, leaf.count, leaf.prev, leaf.next) = (head[0], n as u64, head[2], head[3]);
    tx.read_bytes(
        at + LEAF_SLOTS_AT,
        bytemuck::cast_slice_mut(&mut leaf.slots[..n]),
    )?;
    Ok(())
}

/// The error for a node whose tag is wrong: damage, or a pointer that is not a node.
pub(crate) fn corrupt(at: u64, expected: &'static str) -> Error {
    Error::Damaged { at, expected }
}

/// Writes the words of the node `new` at `at` that differ from `old`.
pub(crate) fn write_changes<T: bytemuck::Pod>(
    tx: &mut Tx<'_>,
    at: u64,
    old: &T,
    new: &T,
) -> Result<(), Error> {
    Ok(tx.write_changes(PPtr::from_offset(at), old, new)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_sizes_are_whole_words() {
        assert_eq!(std::mem::size_of::<KeyRef>(), 32);
        assert_eq!(std::mem::size_of::<Leaf>() % 8, 0);
        assert_eq!(std::mem::size_of::<Inner>() % 8, 0);
    }

    #[test]
    fn inner_remove_child_drops_the_separator_beside_it() {
        let key = |b: u8| KeyRef {
            prefix: prefix_of(&[b]),
            key_len: 1,
            value_len: 0,
            at: b as u64,
        };
        let mut node = Inner::empty();
        node.children[0] = 100;
        node.insert(0, key(10), 101);
        node.insert(1, key(20), 102);
        assert_eq!(&node.children[..3], &[100, 101, 102]);
        // The first child takes the first separator with it.
        assert_eq!(node.clone().remove_child(0), Some(key(10)));
        let mut m = node;
        assert_eq!(m.remove_child(2), Some(key(20)));
        assert_eq!(&m.children[..2], &[100, 101]);
        assert_eq!(m.n(), 1);
    }
}
