//! The ordered map itself: a B+ tree of byte keys and byte values, every operation
//! inside a caller's transaction (so it runs on every engine, and several operations
//! can be one atomic change).
//!
//! - **Records.** Each entry's key and value are one record (`key ++ value`), written
//!   once when put; the leaf keeps the key's prefix, both lengths and the record's
//!   offset. A value rewritten at the same length is written in place (only its bytes);
//!   at another length it gets a new record and the old one is freed.
//! - **Inserts** descend without changing anything; only a full leaf splits, bottom up
//!   along the path (a full parent splits in turn, the root last, growing the tree by a
//!   level). Appending past the last key splits 32/1 instead of 16/16, so keys loaded in
//!   order fill their leaves.
//! - **Deletes** free the record; a leaf left empty is unlinked and leaves its parent,
//!   an inner node left without children leaves its own, and a root with one child
//!   gives way to it. A leaf below a quarter full merges with a sibling (right, else
//!   left) when both fit in three quarters of a leaf, so deletes do not leave the tree
//!   sparse.
//! - **Nodes** are read whole and written back as the 8-byte words that changed.

use std::cmp::Ordering;
use std::collections::HashSet;
use std::ops::{Bound, ControlFlow};

use bytemuck::Zeroable;
use logheap::{PPtr, Tx};

use crate::Error;
use crate::node::{
    INNER_KEYS, Inner, KeyRef, LEAF_SLOTS, Leaf, PREFIX, SearchKey, check_leaf, child_index,
    lower_bound, prefix_of, read_child, read_inner, read_inner_keys, read_key, read_leaf,
    read_leaf_used, read_value, stored_range, write_changes,
};

/// The persistent header of a tree.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Header {
    root: u64,
    /// Levels of inner nodes above the leaves (0: the root is a leaf).
    height: u64,
    /// The entry count: [`COUNT_SLOTS`] words [`COUNT_SPACING`] bytes apart, the word
    /// chosen by key, so inserts of different keys rarely conflict on it.
    counts: u64,
    _reserved: u64,
}

/// Where a leaf keeps its `prev` and `next` links.
const PREV_FIELD: u64 = std::mem::offset_of!(Leaf, prev) as u64;
const NEXT_FIELD: u64 = std::mem::offset_of!(Leaf, next) as u64;
const COUNT_SLOTS: u64 = 8;
const COUNT_SPACING: u64 = 64;
/// The longest key or value (lengths are 32-bit in the nodes).
pub const MAX_LEN: usize = u32::MAX as usize;
/// The tallest tree a descent accepts: far beyond any real one (32-way nodes), so a
/// taller one means a damaged header.
const MAX_HEIGHT: u64 = 24;

/// Which way a scan goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Ascending key order.
    Forward,
    /// Descending key order.
    Backward,
}

/// An ordered map from byte keys to byte values in a pool: a small `Copy` handle around
/// a persistent pointer to its header. Every operation takes the transaction it runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvTree {
    header: PPtr<Header>,
}

/// One inner node on a descent: where it is and the child taken. The node itself is
/// read whole only when a split or a merge changes it.
struct Step {
    at: u64,
    child: usize,
}

/// A descent from the root to a leaf.
struct Path {
    steps: Vec<Step>,
    leaf_at: u64,
    leaf: Leaf,
}

fn check_len(what: &'static str, len: usize) -> Result<(), Error> {
    if len > MAX_LEN {
        return Err(Error::TooLarge {
            what,
            len: len as u64,
            max: MAX_LEN as u64,
        });
    }
    Ok(())
}

fn count_slot(counts: u64, key: &[u8]) -> PPtr<u64> {
    // FNV-1a over at most the first 64 bytes: only a spread is needed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key.iter().take(64) {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    PPtr::from_offset(counts.wrapping_add((h >> 61) * COUNT_SPACING))
}

impl KvTree {
    /// Creates an empty tree.
    pub fn create(tx: &mut Tx<'_>) -> Result<KvTree, Error> {
        let root = tx.alloc(Leaf::empty())?.offset();
        let counts = tx.alloc_bytes(COUNT_SLOTS * COUNT_SPACING)?;
        let header = tx.alloc(Header {
            root,
            height: 0,
            counts,
            _reserved: 0,
        })?;
        Ok(KvTree { header })
    }

    /// The tree whose header is at `header` (from [`pointer`](Self::pointer)).
    pub fn from_pointer(header: u64) -> KvTree {
        KvTree {
            header: PPtr::from_offset(header),
        }
    }

    /// The persistent pointer to keep to find the tree again.
    pub fn pointer(&self) -> u64 {
        self.header.offset()
    }

    fn header(&self, tx: &mut Tx<'_>) -> Result<Header, Error> {
        let h: Header = tx.read(self.header)?;
        if h.height > MAX_HEIGHT {
            return Err(Error::Damaged {
                at: self.header.offset(),
                expected: "a tree header",
            });
        }
        Ok(h)
    }

    /// Number of entries.
    pub fn len(&self, tx: &mut Tx<'_>) -> Result<u64, Error> {
        let counts = self.header(tx)?.counts;
        (0..COUNT_SLOTS).try_fold(0u64, |sum, i| {
            let n: u64 = tx.read(PPtr::from_offset(counts.wrapping_add(i * COUNT_SPACING)))?;
            Ok(sum.wrapping_add(n))
        })
    }

    /// Whether the tree is empty.
    pub fn is_empty(&self, tx: &mut Tx<'_>) -> Result<bool, Error> {
        Ok(self.len(tx)? == 0)
    }

    fn add_count(&self, tx: &mut Tx<'_>, h: &Header, key: &[u8], delta: i64) -> Result<(), Error> {
        let p = count_slot(h.counts, key);
        let n = tx.read(p)?;
        tx.write(p, &n.wrapping_add_signed(delta))?;
        Ok(())
    }

    /// Descends to the leaf for `key`, keeping the inner nodes passed.
    fn descend(
        &self,
        tx: &mut Tx<'_>,
        h: &Header,
        key: &SearchKey<'_>,
        scratch: &mut Vec<u8>,
    ) -> Result<Path, Error> {
        let mut steps = Vec::with_capacity(h.height as usize);
        let mut at = h.root;
        let mut node = Inner::empty();
        for _ in 0..h.height {
            read_inner_keys(tx, at, &mut node)?;
            let child = child_index(tx, &node, key, scratch)?;
            steps.push(Step { at, child });
            at = read_child(tx, at, child)?;
        }
        // The slots past the count are zero in every leaf (removals and splits clear
        // them; `verify` checks it), so the used part read is the whole leaf.
        let mut leaf = Leaf::empty();
        read_leaf_used(tx, at, &mut leaf)?;
        Ok(Path {
            steps,
            leaf_at: at,
            leaf,
        })
    }

    /// Descends to where `key` is or would be: the header, the path, the entry's index
    /// in the leaf and whether it is there.
    fn locate(&self, tx: &mut Tx<'_>, key: &[u8]) -> Result<(Header, Path, usize, bool), Error> {
        let h = self.header(tx)?;
        let search = SearchKey::new(key);
        let mut scratch = Vec::new();
        let path = self.descend(tx, &h, &search, &mut scratch)?;
        let (i, found) = lower_bound(tx, &path.leaf.slots[..path.leaf.n()], &search, &mut scratch)?;
        Ok((h, path, i, found))
    }

    /// The leaf for `key` (its header and entries in use), without keeping the path:
    /// the read-only descent, which reads of each node only what the search needs.
    fn leaf_for(
        &self,
        tx: &mut Tx<'_>,
        key: &SearchKey<'_>,
        scratch: &mut Vec<u8>,
    ) -> Result<(u64, Leaf), Error> {
        let h = self.header(tx)?;
        let mut at = h.root;
        let mut node = Inner::empty();
        for _ in 0..h.height {
            read_inner_keys(tx, at, &mut node)?;
            let child = child_index(tx, &node, key, scratch)?;
            at = read_child(tx, at, child)?;
        }
        let mut leaf = Leaf::empty();
        read_leaf_used(tx, at, &mut leaf)?;
        Ok((at, leaf))
    }

    /// The leftmost (`Forward`) or rightmost leaf.
    fn edge_leaf(&self, tx: &mut Tx<'_>, direction: Direction) -> Result<(u64, Leaf), Error> {
        let h = self.header(tx)?;
        let mut at = h.root;
        let mut node = Inner::empty();
        for _ in 0..h.height {
            let n = read_inner_keys(tx, at, &mut node)?;
            let child = match direction {
                Direction::Forward => 0,
                Direction::Backward => n,
            };
            at = read_child(tx, at, child)?;
        }
        let mut leaf = Leaf::empty();
        read_leaf_used(tx, at, &mut leaf)?;
        Ok((at, leaf))
    }

    /// Reads the value of `key` into `out` (its capacity reused) and returns whether the
    /// key is present (`out` is left empty when not).
    pub fn get_into(&self, tx: &mut Tx<'_>, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        out.clear();
        let key = SearchKey::new(key);
        let mut scratch = Vec::new();
        let (_, leaf) = self.leaf_for(tx, &key, &mut scratch)?;
        let (i, found) = lower_bound(tx, &leaf.slots[..leaf.n()], &key, &mut scratch)?;
        if found {
            read_value(tx, &leaf.slots[i], out)?;
        }
        Ok(found)
    }

    /// The value of `key`, if present.
    pub fn get(&self, tx: &mut Tx<'_>, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let mut out = Vec::new();
        Ok(self.get_into(tx, key, &mut out)?.then_some(out))
    }

    /// Whether `key` is present.
    pub fn contains(&self, tx: &mut Tx<'_>, key: &[u8]) -> Result<bool, Error> {
        let key = SearchKey::new(key);
        let mut scratch = Vec::new();
        let (_, leaf) = self.leaf_for(tx, &key, &mut scratch)?;
        Ok(lower_bound(tx, &leaf.slots[..leaf.n()], &key, &mut scratch)?.1)
    }

    /// Sets `key` to `value`; returns whether the key is new.
    pub fn put(&self, tx: &mut Tx<'_>, key: &[u8], value: &[u8]) -> Result<bool, Error> {
        check_len("key", key.len())?;
        check_len("value", value.len())?;
        let (h, mut path, i, found) = self.locate(tx, key)?;
        let n = path.leaf.n();
        if found {
            replace_value(tx, &mut path, i, key, value)?;
            return Ok(false);
        }
        let entry = KeyRef {
            prefix: prefix_of(key),
            key_len: key.len() as u32,
            value_len: value.len() as u32,
            at: new_record(tx, key, value)?,
        };
        self.add_count(tx, &h, key, 1)?;
        if n < LEAF_SLOTS {
            let old = path.leaf;
            path.leaf.insert(i, entry);
            write_changes(tx, path.leaf_at, &old, &path.leaf)?;
            return Ok(true);
        }
        self.split_leaf_and_insert(tx, h, path, i, entry, key)?;
        Ok(true)
    }

    /// Reads the value of `key` into `value`, lets `change` alter it, and stores the
    /// result (in place when its length is unchanged): a read-modify-write with one
    /// descent. Returns whether the key was present (`change` is not called when not).
    pub fn update(
        &self,
        tx: &mut Tx<'_>,
        key: &[u8],
        value: &mut Vec<u8>,
        change: impl FnOnce(&mut Vec<u8>),
    ) -> Result<bool, Error> {
        let (_, mut path, i, found) = self.locate(tx, key)?;
        if !found {
            return Ok(false);
        }
        read_value(tx, &path.leaf.slots[i], value)?;
        change(value);
        check_len("value", value.len())?;
        replace_value(tx, &mut path, i, key, value)?;
        Ok(true)
    }

    /// Inserts `entry` at `i` of the full leaf at the end of `path` by splitting it,
    /// then carries the split up the path.
    fn split_leaf_and_insert(
        &self,
        tx: &mut Tx<'_>,
        h: Header,
        path: Path,
        i: usize,
        entry: KeyRef,
        key: &[u8],
    ) -> Result<(), Error> {
        let old = path.leaf;
        let mut left = path.leaf;
        let mut right = Leaf::empty();
        // Appending past the last key of the last leaf: keep the left leaf full.
        let keep = if i == LEAF_SLOTS && left.next == 0 {
            LEAF_SLOTS
        } else {
            LEAF_SLOTS / 2
        };
        let moved = LEAF_SLOTS - keep;
        right.slots[..moved].copy_from_slice(&left.slots[keep..]);
        right.count = moved as u64;
        left.slots[keep..].fill(bytemuck::Zeroable::zeroed());
        left.count = keep as u64;
        if i <= keep && keep != LEAF_SLOTS {
            left.insert(i, entry);
        } else {
            right.insert(i - keep, entry);
        }
        right.prev = path.leaf_at;
        right.next = left.next;
        let right_at = tx.alloc(right)?.offset();
        if right.next != 0 {
            check_leaf(tx, right.next)?;
            tx.write(PPtr::<u64>::from_offset(right.next + PREV_FIELD), &right_at)?;
        }
        left.next = right_at;
        write_changes(tx, path.leaf_at, &old, &left)?;
        // The separator: the right leaf's first key, in a blob of its own.
        let first = right.slots[0];
        let mut sep_key = Vec::new();
        if first == entry {
            sep_key.extend_from_slice(key);
        } else {
            read_key(tx, &first, &mut sep_key)?;
        }
        let sep = new_separator(tx, &sep_key)?;
        self.insert_separator(tx, h, path.steps, path.leaf_at, sep, right_at)
    }

    /// Puts separator `sep` with `right` to its right into the parent of `left` (the
    /// last of `steps`), splitting full parents up the path and growing a new root.
    fn insert_separator(
        &self,
        tx: &mut Tx<'_>,
        h: Header,
        mut steps: Vec<Step>,
        mut left: u64,
        mut sep: KeyRef,
        mut right: u64,
    ) -> Result<(), Error> {
        while let Some(Step { at, child }) = steps.pop() {
            let old = read_inner(tx, at)?;
            let mut node = old;
            if node.n() < INNER_KEYS {
                node.insert(child, sep, right);
                return write_changes(tx, at, &old, &node);
            }
            // Split: the middle separator of the 33 goes up.
            let mut keys = [<KeyRef as bytemuck::Zeroable>::zeroed(); INNER_KEYS + 1];
            let mut children = [0u64; INNER_KEYS + 2];
            keys[..child].copy_from_slice(&node.keys[..child]);
            keys[child] = sep;
            keys[child + 1..].copy_from_slice(&node.keys[child..]);
            children[..=child].copy_from_slice(&node.children[..=child]);
            children[child + 1] = right;
            children[child + 2..].copy_from_slice(&node.children[child + 1..]);
            // 33 separators: 16 stay, the 17th goes up, 16 move right.
            let mid = INNER_KEYS / 2;
            let mut l = Inner::empty();
            l.keys[..mid].copy_from_slice(&keys[..mid]);
            l.children[..=mid].copy_from_slice(&children[..=mid]);
            l.count = mid as u64;
            let mut r = Inner::empty();
            let rn = INNER_KEYS - mid;
            r.keys[..rn].copy_from_slice(&keys[mid + 1..]);
            r.children[..=rn].copy_from_slice(&children[mid + 1..]);
            r.count = rn as u64;
            write_changes(tx, at, &old, &l)?;
            left = at;
            sep = keys[mid];
            right = tx.alloc(r)?.offset();
        }
        // The root split: a new root above it.
        let mut root = Inner::empty();
        root.keys[0] = sep;
        root.children[0] = left;
        root.children[1] = right;
        root.count = 1;
        let root_at = tx.alloc(root)?.offset();
        let new = Header {
            root: root_at,
            height: h.height + 1,
            ..h
        };
        write_changes(tx, self.header.offset(), &h, &new)
    }

    /// Removes `key`; returns whether it was present.
    pub fn delete(&self, tx: &mut Tx<'_>, key: &[u8]) -> Result<bool, Error> {
        let (h, mut path, i, found) = self.locate(tx, key)?;
        if !found {
            return Ok(false);
        }
        free_record(tx, &path.leaf.slots[i])?;
        self.add_count(tx, &h, key, -1)?;
        let old = path.leaf;
        path.leaf.remove(i);
        if path.steps.is_empty() {
            write_changes(tx, path.leaf_at, &old, &path.leaf)?;
            return Ok(true);
        }
        if path.leaf.n() == 0 {
            self.unlink_leaf(tx, &path.leaf)?;
            tx.free(PPtr::<Leaf>::from_offset(path.leaf_at))?;
            self.remove_child(tx, path.steps)?;
            return Ok(true);
        }
        if path.leaf.n() < LEAF_SLOTS / 4 && self.merge_with_sibling(tx, &mut path)? {
            return Ok(true);
        }
        write_changes(tx, path.leaf_at, &old, &path.leaf)?;
        Ok(true)
    }

    /// Merges the path's leaf (below a quarter full, its entry already removed in
    /// `path.leaf`, not yet written) with a sibling under the same parent, the right
    /// one first, when both fit in three quarters of a leaf. Returns whether it did (the
    /// leaf's changes are then written).
    fn merge_with_sibling(&self, tx: &mut Tx<'_>, path: &mut Path) -> Result<bool, Error> {
        let Some(step) = path.steps.last() else {
            return Ok(false);
        };
        let child = step.child;
        let parent = read_inner(tx, step.at)?;
        let siblings = [
            (child < parent.n()).then(|| (parent.children[child + 1], true)),
            (child > 0).then(|| (parent.children[child - 1], false)),
        ];
        for (sibling_at, right_of_it) in siblings.into_iter().flatten() {
            let linked = if right_of_it {
                path.leaf.next
            } else {
                path.leaf.prev
            };
            if sibling_at != linked {
                return Err(Error::Damaged {
                    at: path.leaf_at,
                    expected: "a leaf linked to its siblings",
                });
            }
            let sibling = read_leaf(tx, sibling_at)?;
            if path.leaf.n() + sibling.n() > LEAF_SLOTS * 3 / 4 {
                continue;
            }
            // Into the left one of the two; the right one leaves the tree.
            let (left_at, right_at, removed_child) = if right_of_it {
                (path.leaf_at, sibling_at, child + 1)
            } else {
                (sibling_at, path.leaf_at, child)
            };
            let (mut left, right) = if right_of_it {
                (path.leaf, sibling)
            } else {
                (sibling, path.leaf)
            };
            let old_left: Leaf = tx.read(PPtr::from_offset(left_at))?;
            let (n, m) = (left.n(), right.n());
            left.slots[n..n + m].copy_from_slice(&right.slots[..m]);
            left.count = (n + m) as u64;
            left.next = right.next;
            if right.next != 0 {
                check_leaf(tx, right.next)?;
                tx.write(PPtr::<u64>::from_offset(right.next + PREV_FIELD), &left_at)?;
            }
            write_changes(tx, left_at, &old_left, &left)?;
            tx.free(PPtr::<Leaf>::from_offset(right_at))?;
            let mut steps = std::mem::take(&mut path.steps);
            if let Some(last) = steps.last_mut() {
                last.child = removed_child;
            }
            self.remove_child(tx, steps)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Points `leaf`'s neighbours at each other.
    fn unlink_leaf(&self, tx: &mut Tx<'_>, leaf: &Leaf) -> Result<(), Error> {
        if leaf.prev != 0 {
            check_leaf(tx, leaf.prev)?;
            tx.write(PPtr::<u64>::from_offset(leaf.prev + NEXT_FIELD), &leaf.next)?;
        }
        if leaf.next != 0 {
            check_leaf(tx, leaf.next)?;
            tx.write(PPtr::<u64>::from_offset(leaf.next + PREV_FIELD), &leaf.prev)?;
        }
        Ok(())
    }

    /// Removes the child taken by the last of `steps` (already freed) from its node:
    /// a node left without children goes too, and the root then gives way to a single
    /// child.
    fn remove_child(&self, tx: &mut Tx<'_>, mut steps: Vec<Step>) -> Result<(), Error> {
        while let Some(Step { at, child }) = steps.pop() {
            let old = read_inner(tx, at)?;
            let mut node = old;
            let had_children = node.n() + 1;
            if let Some(sep) = node.remove_child(child) {
                free_record(tx, &sep)?;
            }
            if had_children > 1 {
                write_changes(tx, at, &old, &node)?;
                break;
            }
            // Its only child went: the node goes (the root never gets here, as some
            // other leaf remains below it).
            tx.free(PPtr::<Inner>::from_offset(at))?;
        }
        self.collapse_root(tx)
    }

    /// While the root is an inner node with a single child, makes that child the root.
    fn collapse_root(&self, tx: &mut Tx<'_>) -> Result<(), Error> {
        let old = self.header(tx)?;
        let mut new = old;
        while new.height > 0 {
            let root = read_inner(tx, new.root)?;
            if root.n() > 0 {
                break;
            }
            tx.free(PPtr::<Inner>::from_offset(new.root))?;
            new.root = root.children[0];
            new.height -= 1;
        }
        write_changes(tx, self.header.offset(), &old, &new)
    }

    /// Calls `f` with each entry whose key is within `(start, end)`, in `direction`,
    /// until it returns [`ControlFlow::Break`]. All of it sees the transaction's
    /// snapshot.
    pub fn scan(
        &self,
        tx: &mut Tx<'_>,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        direction: Direction,
        mut f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> Result<(), Error> {
        let mut scratch = Vec::new();
        let mut record = Vec::new();
        // Where to begin, and the bound that ends the scan.
        let (from, until) = match direction {
            Direction::Forward => (start, end),
            Direction::Backward => (end, start),
        };
        let (mut leaf_at, mut leaf, mut i) = match from {
            Bound::Unbounded => {
                let (at, leaf) = self.edge_leaf(tx, direction)?;
                let i = match direction {
                    Direction::Forward => 0,
                    Direction::Backward => leaf.n() as isize - 1,
                };
                (at, leaf, i)
            }
            Bound::Included(k) | Bound::Excluded(k) => {
                let search = SearchKey::new(k);
                let (at, leaf) = self.leaf_for(tx, &search, &mut scratch)?;
                let (pos, found) = lower_bound(tx, &leaf.slots[..leaf.n()], &search, &mut scratch)?;
                let pos = pos as isize;
                let excluded = matches!(from, Bound::Excluded(_));
                let i = match direction {
                    Direction::Forward if found && excluded => pos + 1,
                    Direction::Forward => pos,
                    Direction::Backward if found && !excluded => pos,
                    Direction::Backward => pos - 1,
                };
                (at, leaf, i)
            }
        };
        let until_search = match until {
            Bound::Included(k) | Bound::Excluded(k) => Some(SearchKey::new(k)),
            Bound::Unbounded => None,
        };
        // Keys must come out strictly in order, the first one within the starting
        // bound: a damaged leaf chain that loops, or goes back, is caught by that.
        let (mut last, mut checked, mut equal_allowed) = match from {
            Bound::Included(k) => (k.to_vec(), true, true),
            Bound::Excluded(k) => (k.to_vec(), true, false),
            Bound::Unbounded => (Vec::new(), false, false),
        };
        loop {
            if i < 0 || i as usize >= leaf.n() {
                let next = match direction {
                    Direction::Forward => leaf.next,
                    Direction::Backward => leaf.prev,
                };
                if next == 0 {
                    return Ok(());
                }
                let from_at = leaf_at;
                leaf_at = next;
                read_leaf_used(tx, leaf_at, &mut leaf)?;
                let back = match direction {
                    Direction::Forward => leaf.prev,
                    Direction::Backward => leaf.next,
                };
                if back != from_at || leaf.n() == 0 {
                    return Err(Error::Damaged {
                        at: leaf_at,
                        expected: "a leaf linked back to its neighbour",
                    });
                }
                i = match direction {
                    Direction::Forward => 0,
                    Direction::Backward => leaf.n() as isize - 1,
                };
                continue;
            }
            let slot = leaf.slots[i as usize];
            if let Some(bound) = &until_search {
                let ord = bound.cmp(tx, &slot, &mut scratch)?;
                let past = match (direction, until) {
                    (Direction::Forward, Bound::Included(_)) => ord == Ordering::Less,
                    (Direction::Forward, _) => ord != Ordering::Greater,
                    (Direction::Backward, Bound::Included(_)) => ord == Ordering::Greater,
                    (Direction::Backward, _) => ord != Ordering::Less,
                };
                if past {
                    return Ok(());
                }
            }
            // The record holds the key and the value: one read for both.
            let key_len = slot.key_len as usize;
            let len = key_len + slot.value_len as usize;
            record.clear();
            if len > 0 {
                stored_range(tx, slot.at, 0, len)?;
                record.resize(len, 0);
                tx.read_bytes(slot.at, &mut record)?;
            }
            let (key, value) = record.split_at(key_len);
            let ord = key.cmp(&last[..]);
            let in_order = match direction {
                Direction::Forward => ord == Ordering::Greater,
                Direction::Backward => ord == Ordering::Less,
            } || (equal_allowed && ord == Ordering::Equal);
            if checked && !in_order {
                return Err(Error::Damaged {
                    at: leaf_at,
                    expected: "keys in order along the leaf chain",
                });
            }
            if f(key, value).is_break() {
                return Ok(());
            }
            last.clear();
            last.extend_from_slice(key);
            (checked, equal_allowed) = (true, false);
            i += match direction {
                Direction::Forward => 1,
                Direction::Backward => -1,
            };
        }
    }

    /// Figures of the tree: a walk along every leaf.
    pub fn stats(&self, tx: &mut Tx<'_>) -> Result<crate::KvStats, Error> {
        let h = self.header(tx)?;
        let (mut at, mut leaf) = self.edge_leaf(tx, Direction::Forward)?;
        let mut stats = crate::KvStats {
            entries: 0,
            levels: h.height + 1,
            leaves: 0,
            payload_bytes: 0,
        };
        // A damaged chain could loop: no leaf is visited twice.
        let mut seen = HashSet::new();
        loop {
            if !seen.insert(at) {
                return Err(Error::Damaged {
                    at,
                    expected: "a leaf chain without a cycle",
                });
            }
            stats.leaves += 1;
            stats.entries += leaf.n() as u64;
            for slot in &leaf.slots[..leaf.n()] {
                stats.payload_bytes += slot.key_len as u64 + slot.value_len as u64;
            }
            if leaf.next == 0 {
                return Ok(stats);
            }
            let next = read_leaf(tx, leaf.next)?;
            if next.prev != at {
                return Err(Error::Damaged {
                    at: leaf.next,
                    expected: "a leaf linked back to its neighbour",
                });
            }
            at = leaf.next;
            leaf = next;
        }
    }

    /// Checks the tree's invariants: node tags, key order within nodes and between
    /// separators, every leaf at one depth, the leaf chain in key order both ways, the
    /// entry count. Returns the first violation found.
    pub fn verify(&self, tx: &mut Tx<'_>) -> Result<Option<String>, Error> {
        let h = self.header(tx)?;
        let mut leaves = Vec::new();
        let mut seen = HashSet::new();
        if let Some(problem) =
            self.verify_node(tx, h.root, h.height, (None, None), &mut leaves, &mut seen)?
        {
            return Ok(Some(problem));
        }
        let mut entries = 0u64;
        for (k, &at) in leaves.iter().enumerate() {
            let leaf = read_leaf(tx, at)?;
            entries += leaf.n() as u64;
            let prev = if k == 0 { 0 } else { leaves[k - 1] };
            let next = leaves.get(k + 1).copied().unwrap_or(0);
            if leaf.prev != prev || leaf.next != next {
                return Ok(Some(format!(
                    "leaf {at:#x} links to {:#x}/{:#x}, its neighbours are {prev:#x}/{next:#x}",
                    leaf.prev, leaf.next
                )));
            }
            if leaf.n() == 0 && leaves.len() > 1 {
                return Ok(Some(format!("leaf {at:#x} is empty but not the only leaf")));
            }
        }
        let counted = self.len(tx)?;
        if counted != entries {
            return Ok(Some(format!(
                "the count says {counted} entries, the leaves hold {entries}"
            )));
        }
        Ok(None)
    }

    fn verify_node(
        &self,
        tx: &mut Tx<'_>,
        at: u64,
        level: u64,
        bounds: (Option<&[u8]>, Option<&[u8]>),
        leaves: &mut Vec<u64>,
        seen: &mut HashSet<u64>,
    ) -> Result<Option<String>, Error> {
        // A damaged tree could share a node between parents (or loop back up).
        if !seen.insert(at) {
            return Ok(Some(format!("node {at:#x} is reached twice")));
        }
        let (keys, children): (Vec<KeyRef>, Vec<u64>) = if level == 0 {
            let leaf = read_leaf(tx, at)?;
            if leaf.count as usize > LEAF_SLOTS {
                return Ok(Some(format!("leaf {at:#x} counts {}", leaf.count)));
            }
            if leaf.slots[leaf.n()..]
                .iter()
                .any(|k| *k != KeyRef::zeroed())
            {
                return Ok(Some(format!("leaf {at:#x}: an unused slot is not zero")));
            }
            leaves.push(at);
            (leaf.slots[..leaf.n()].to_vec(), Vec::new())
        } else {
            let node = read_inner(tx, at)?;
            if node.count as usize > INNER_KEYS {
                return Ok(Some(format!("inner node {at:#x} counts {}", node.count)));
            }
            if node.keys[node.n()..].iter().any(|k| *k != KeyRef::zeroed())
                || node.children[node.n() + 1..].iter().any(|&c| c != 0)
            {
                return Ok(Some(format!(
                    "inner node {at:#x}: an unused slot is not zero"
                )));
            }
            (
                node.keys[..node.n()].to_vec(),
                node.children[..=node.n()].to_vec(),
            )
        };
        let mut full: Vec<Vec<u8>> = Vec::with_capacity(keys.len());
        for k in &keys {
            let mut bytes = Vec::new();
            read_key(tx, k, &mut bytes)?;
            if prefix_of(&bytes) != k.prefix {
                return Ok(Some(format!(
                    "node {at:#x}: a key's prefix does not match it"
                )));
            }
            if level > 0 && k.value_len != 0 {
                return Ok(Some(format!("inner node {at:#x}: a separator has a value")));
            }
            full.push(bytes);
        }
        for w in full.windows(2) {
            if w[0] >= w[1] {
                return Ok(Some(format!("node {at:#x}: keys out of order")));
            }
        }
        if let (Some(lo), Some(first)) = (bounds.0, full.first())
            && first.as_slice() < lo
        {
            return Ok(Some(format!("node {at:#x}: a key below its separator")));
        }
        if let (Some(hi), Some(last)) = (bounds.1, full.last())
            && last.as_slice() >= hi
        {
            return Ok(Some(format!(
                "node {at:#x}: a key at or above its separator"
            )));
        }
        for (c, &child) in children.iter().enumerate() {
            let lo = if c == 0 {
                bounds.0
            } else {
                Some(full[c - 1].as_slice())
            };
            let hi = full.get(c).map(|k| k.as_slice()).or(bounds.1);
            if let Some(p) = self.verify_node(tx, child, level - 1, (lo, hi), leaves, seen)? {
                return Ok(Some(p));
            }
        }
        Ok(None)
    }
}

/// Sets the value of entry `i` of the path's leaf (whose key is `key`): in place when
/// the length is the same, else in a new record (the old one freed).
fn replace_value(
    tx: &mut Tx<'_>,
    path: &mut Path,
    i: usize,
    key: &[u8],
    value: &[u8],
) -> Result<(), Error> {
    let old = path.leaf;
    let slot = &mut path.leaf.slots[i];
    if slot.value_len as usize == value.len() {
        if !value.is_empty() {
            let from = stored_range(tx, slot.at, slot.key_len as u64, value.len())?;
            tx.write_bytes(from, value)?;
        }
        return Ok(());
    }
    let fresh = new_record(tx, key, value)?;
    free_record(tx, slot)?;
    slot.at = fresh;
    slot.value_len = value.len() as u32;
    write_changes(tx, path.leaf_at, &old, &path.leaf)
}

/// Allocates the record `key ++ value`; 0 when both are empty.
fn new_record(tx: &mut Tx<'_>, key: &[u8], value: &[u8]) -> Result<u64, Error> {
    if key.is_empty() && value.is_empty() {
        return Ok(0);
    }
    if key.is_empty() {
        return Ok(tx.alloc_from(value)?);
    }
    if value.is_empty() {
        return Ok(tx.alloc_from(key)?);
    }
    // One allocation written once: the engine copies the record into its write set
    // (or log) either way, and a zero-filled object written over would cost more.
    let mut record = Vec::with_capacity(key.len() + value.len());
    record.extend_from_slice(key);
    record.extend_from_slice(value);
    Ok(tx.alloc_from(&record)?)
}

/// A separator: `key` in a blob of its own.
fn new_separator(tx: &mut Tx<'_>, key: &[u8]) -> Result<KeyRef, Error> {
    // A key that fits its prefix is never read from its blob: it needs none.
    let at = if key.len() <= PREFIX {
        0
    } else {
        new_record(tx, key, &[])?
    };
    Ok(KeyRef {
        prefix: prefix_of(key),
        key_len: key.len() as u32,
        value_len: 0,
        at,
    })
}

/// Frees the record (or separator blob) of `stored`, if it has one.
fn free_record(tx: &mut Tx<'_>, stored: &KeyRef) -> Result<(), Error> {
    if stored.at != 0 {
        tx.free(PPtr::<u8>::from_offset(stored.at))?;
    }
    Ok(())
}
