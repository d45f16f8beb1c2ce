//! A persistent B+ tree: fanout 16, values in leaves (out of line, like the red-black
//! tree's), leaves linked for ordered scans.
//!
//! Insertion splits full nodes on the way down; deletion makes sure every node it
//! descends into has more than the minimum, by borrowing from a sibling or merging with
//! one, so a single top-down pass suffices. A node is edited in DRAM and written back as
//! the 8-byte words that changed, so the log sees only real changes.

use logheap::{Error, PPtr, Tx};

use crate::{striped_count, value_object};

/// Most keys in a node.
const MAX: usize = 16;
/// Fewest keys in a non-root node (so that two merged nodes and a separator fit).
const MIN: usize = (MAX - 1) / 2;

/// The persistent header of a [`BpTree`].
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BpHeader {
    root: u64,
    /// The entry count (a striped count object).
    count: u64,
}

/// A node. Leaves: `ptrs[..count]` are value objects `{len, bytes}`, `next` the next
/// leaf. Inner nodes: `ptrs[..=count]` are children; `ptrs[i]` holds keys below
/// `keys[i]`, `ptrs[i + 1]` keys from `keys[i]` up.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Node {
    leaf: u64,
    count: u64,
    next: u64,
    keys: [u64; MAX],
    ptrs: [u64; MAX + 1],
}

impl Node {
    fn n(&self) -> usize {
        (self.count as usize).min(MAX)
    }

    /// The child to descend into for `key`.
    fn child_index(&self, key: u64) -> usize {
        self.keys[..self.n()].partition_point(|&k| k <= key)
    }

    fn insert_key(&mut self, at: usize, key: u64, ptr: u64, ptr_at: usize) {
        let n = self.n();
        self.keys.copy_within(at..n, at + 1);
        self.keys[at] = key;
        let ptrs = if self.leaf == 1 { n } else { n + 1 };
        self.ptrs.copy_within(ptr_at..ptrs, ptr_at + 1);
        self.ptrs[ptr_at] = ptr;
        self.count += 1;
    }

    fn remove_key(&mut self, at: usize, ptr_at: usize) {
        let n = self.n();
        let ptrs = if self.leaf == 1 { n } else { n + 1 };
        self.keys.copy_within(at + 1..n, at);
        self.ptrs.copy_within(ptr_at + 1..ptrs, ptr_at);
        self.count -= 1;
    }
}

/// A persistent ordered map from `u64` keys to byte-string values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BpTree {
    header: PPtr<BpHeader>,
}

fn read_node(tx: &mut Tx<'_>, at: u64) -> Result<Node, Error> {
    tx.read(PPtr::from_offset(at))
}

/// Writes the words of `new` that differ from `old`.
fn write_node(tx: &mut Tx<'_>, at: u64, old: &Node, new: &Node) -> Result<(), Error> {
    tx.write_changes(PPtr::from_offset(at), old, new)
}

fn new_node(tx: &mut Tx<'_>, node: &Node) -> Result<u64, Error> {
    Ok(tx.alloc(*node)?.offset())
}

impl BpTree {
    /// Creates an empty tree.
    pub fn create(tx: &mut Tx<'_>) -> Result<BpTree, Error> {
        let leaf = Node {
            leaf: 1,
            ..bytemuck::Zeroable::zeroed()
        };
        let root = new_node(tx, &leaf)?;
        let count = striped_count::create(tx)?;
        Ok(BpTree {
            header: tx.alloc(BpHeader { root, count })?,
        })
    }

    /// The tree stored at `header`.
    pub fn from_pointer(header: u64) -> BpTree {
        BpTree {
            header: PPtr::from_offset(header),
        }
    }

    /// The persistent pointer to store to find the tree again.
    pub fn pointer(&self) -> u64 {
        self.header.offset()
    }

    /// Number of entries.
    pub fn len(&self, tx: &mut Tx<'_>) -> Result<u64, Error> {
        let count = tx.read(self.header)?.count;
        striped_count::total(tx, count)
    }

    /// Whether the tree is empty.
    pub fn is_empty(&self, tx: &mut Tx<'_>) -> Result<bool, Error> {
        Ok(self.len(tx)? == 0)
    }

    fn set_header(&self, tx: &mut Tx<'_>, old: &BpHeader, new: &BpHeader) -> Result<(), Error> {
        if old.root != new.root {
            tx.write(PPtr::<u64>::from_offset(self.header.offset()), &new.root)?;
        }
        Ok(())
    }

    /// The leaf that holds (or would hold) `key`.
    fn leaf_for(&self, tx: &mut Tx<'_>, key: u64) -> Result<(u64, Node), Error> {
        let mut at = tx.read(self.header)?.root;
        loop {
            let node = read_node(tx, at)?;
            if node.leaf == 1 {
                return Ok((at, node));
            }
            at = node.ptrs[node.child_index(key)];
        }
    }

    /// The value of `key`, if present.
    pub fn get(&self, tx: &mut Tx<'_>, key: u64) -> Result<Option<Vec<u8>>, Error> {
        let mut v = Vec::new();
        Ok(self.get_into(tx, key, &mut v)?.then_some(v))
    }

    /// Reads the value of `key` into `out` (its capacity reused) and returns whether
    /// the key is present (`out` is left empty when not).
    pub fn get_into(&self, tx: &mut Tx<'_>, key: u64, out: &mut Vec<u8>) -> Result<bool, Error> {
        out.clear();
        let (_, leaf) = self.leaf_for(tx, key)?;
        match leaf.keys[..leaf.n()].binary_search(&key) {
            Ok(i) => value_object::read_into(tx, leaf.ptrs[i], out).map(|()| true),
            Err(_) => Ok(false),
        }
    }

    /// Whether `key` is present.
    pub fn contains(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        let (_, leaf) = self.leaf_for(tx, key)?;
        Ok(leaf.keys[..leaf.n()].binary_search(&key).is_ok())
    }

    /// Splits the full child `i` of `parent` (both already read), writing all three.
    fn split_child(
        &self,
        tx: &mut Tx<'_>,
        parent_at: u64,
        parent: &mut Node,
        i: usize,
    ) -> Result<(), Error> {
        let old_parent = *parent;
        let child_at = parent.ptrs[i];
        let old_child = read_node(tx, child_at)?;
        let mut child = old_child;
        let mut sibling: Node = bytemuck::Zeroable::zeroed();
        sibling.leaf = child.leaf;
        let separator;
        if child.leaf == 1 {
            let half = MAX / 2;
            sibling.keys[..MAX - half].copy_from_slice(&child.keys[half..MAX]);
            sibling.ptrs[..MAX - half].copy_from_slice(&child.ptrs[half..MAX]);
            sibling.count = (MAX - half) as u64;
            sibling.next = child.next;
            child.count = half as u64;
            separator = sibling.keys[0];
        } else {
            let mid = MAX / 2;
            separator = child.keys[mid];
            sibling.keys[..MAX - mid - 1].copy_from_slice(&child.keys[mid + 1..MAX]);
            sibling.ptrs[..MAX - mid].copy_from_slice(&child.ptrs[mid + 1..=MAX]);
            sibling.count = (MAX - mid - 1) as u64;
            child.count = mid as u64;
        }
        let sibling_at = new_node(tx, &sibling)?;
        if child.leaf == 1 {
            child.next = sibling_at;
        }
        write_node(tx, child_at, &old_child, &child)?;
        parent.insert_key(i, separator, sibling_at, i + 1);
        write_node(tx, parent_at, &old_parent, parent)
    }

    /// Sets `key` to `value`; returns whether it replaced a value.
    pub fn insert(&self, tx: &mut Tx<'_>, key: u64, value: &[u8]) -> Result<bool, Error> {
        let header = tx.read(self.header)?;
        let mut new_header = header;
        let mut at = header.root;
        let mut node = read_node(tx, at)?;
        if node.n() == MAX {
            let mut root: Node = bytemuck::Zeroable::zeroed();
            root.ptrs[0] = at;
            let root_at = new_node(tx, &root)?;
            self.split_child(tx, root_at, &mut root, 0)?;
            new_header.root = root_at;
            at = root_at;
            node = root;
        }
        while node.leaf == 0 {
            let mut i = node.child_index(key);
            let child = read_node(tx, node.ptrs[i])?;
            if child.n() == MAX {
                self.split_child(tx, at, &mut node, i)?;
                i = node.child_index(key);
            }
            at = node.ptrs[i];
            node = read_node(tx, at)?;
        }
        let replaced = match node.keys[..node.n()].binary_search(&key) {
            Ok(i) => {
                let old = node.ptrs[i];
                let now = value_object::replace(tx, old, value)?;
                if now != old {
                    let slot = at + 24 + 8 * MAX as u64 + 8 * i as u64;
                    tx.write(PPtr::<u64>::from_offset(slot), &now)?;
                }
                true
            }
            Err(i) => {
                let old = node;
                let v = value_object::create(tx, value)?;
                node.insert_key(i, key, v, i);
                write_node(tx, at, &old, &node)?;
                striped_count::add(tx, header.count, 1)?;
                false
            }
        };
        self.set_header(tx, &header, &new_header)?;
        Ok(replaced)
    }

    /// Makes child `i` of `parent` hold more than [`MIN`] keys, by borrowing from or
    /// merging with a sibling.
    fn fill_child(
        &self,
        tx: &mut Tx<'_>,
        parent_at: u64,
        parent: &mut Node,
        i: usize,
    ) -> Result<(), Error> {
        let old_parent = *parent;
        let c_at = parent.ptrs[i];
        let old_c = read_node(tx, c_at)?;
        let mut c = old_c;
        let n = parent.n();
        if i > 0 {
            let l_at = parent.ptrs[i - 1];
            let old_l = read_node(tx, l_at)?;
            if old_l.n() > MIN {
                let mut l = old_l;
                let ln = l.n();
                if c.leaf == 1 {
                    c.insert_key(0, l.keys[ln - 1], l.ptrs[ln - 1], 0);
                    l.count -= 1;
                    parent.keys[i - 1] = c.keys[0];
                } else {
                    c.insert_key(0, parent.keys[i - 1], l.ptrs[ln], 0);
                    parent.keys[i - 1] = l.keys[ln - 1];
                    l.count -= 1;
                }
                write_node(tx, l_at, &old_l, &l)?;
                write_node(tx, c_at, &old_c, &c)?;
                write_node(tx, parent_at, &old_parent, parent)?;
                return Ok(());
            }
        }
        if i < n {
            let r_at = parent.ptrs[i + 1];
            let old_r = read_node(tx, r_at)?;
            if old_r.n() > MIN {
                let mut r = old_r;
                let cn = c.n();
                if c.leaf == 1 {
                    c.keys[cn] = r.keys[0];
                    c.ptrs[cn] = r.ptrs[0];
                    c.count += 1;
                    r.remove_key(0, 0);
                    parent.keys[i] = r.keys[0];
                } else {
                    c.keys[cn] = parent.keys[i];
                    c.ptrs[cn + 1] = r.ptrs[0];
                    c.count += 1;
                    parent.keys[i] = r.keys[0];
                    r.remove_key(0, 0);
                }
                write_node(tx, r_at, &old_r, &r)?;
                write_node(tx, c_at, &old_c, &c)?;
                write_node(tx, parent_at, &old_parent, parent)?;
                return Ok(());
            }
            return self.merge(tx, parent_at, parent, i);
        }
        self.merge(tx, parent_at, parent, i - 1)
    }

    /// Merges child `j + 1` of `parent` into child `j` and frees it.
    fn merge(
        &self,
        tx: &mut Tx<'_>,
        parent_at: u64,
        parent: &mut Node,
        j: usize,
    ) -> Result<(), Error> {
        let old_parent = *parent;
        let (l_at, r_at) = (parent.ptrs[j], parent.ptrs[j + 1]);
        let old_l = read_node(tx, l_at)?;
        let r = read_node(tx, r_at)?;
        let mut l = old_l;
        let (ln, rn) = (l.n(), r.n());
        if l.leaf == 1 {
            l.keys[ln..ln + rn].copy_from_slice(&r.keys[..rn]);
            l.ptrs[ln..ln + rn].copy_from_slice(&r.ptrs[..rn]);
            l.count = (ln + rn) as u64;
            l.next = r.next;
        } else {
            l.keys[ln] = parent.keys[j];
            l.keys[ln + 1..ln + 1 + rn].copy_from_slice(&r.keys[..rn]);
            l.ptrs[ln + 1..ln + 2 + rn].copy_from_slice(&r.ptrs[..=rn]);
            l.count = (ln + 1 + rn) as u64;
        }
        parent.remove_key(j, j + 1);
        write_node(tx, l_at, &old_l, &l)?;
        write_node(tx, parent_at, &old_parent, parent)?;
        tx.free(PPtr::<Node>::from_offset(r_at))
    }

    /// Removes `key`; returns whether it was present.
    pub fn remove(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        let header = tx.read(self.header)?;
        let mut new_header = header;
        let mut at = header.root;
        let mut node = read_node(tx, at)?;
        while node.leaf == 0 {
            let mut i = node.child_index(key);
            let child = read_node(tx, node.ptrs[i])?;
            if child.n() <= MIN {
                self.fill_child(tx, at, &mut node, i)?;
                // Separators moved or children merged: choose again.
                i = node.child_index(key);
            }
            if at == new_header.root && node.n() == 0 {
                // The root lost its last key in a merge: its only child is the new root.
                new_header.root = node.ptrs[0];
                tx.free(PPtr::<Node>::from_offset(at))?;
            }
            at = node.ptrs[i];
            node = read_node(tx, at)?;
        }
        let found = match node.keys[..node.n()].binary_search(&key) {
            Ok(i) => {
                let old = node;
                value_object::free(tx, node.ptrs[i])?;
                node.remove_key(i, i);
                write_node(tx, at, &old, &node)?;
                striped_count::add(tx, header.count, -1)?;
                true
            }
            Err(_) => false,
        };
        self.set_header(tx, &header, &new_header)?;
        Ok(found)
    }

    /// Every key in ascending order (walking the leaf chain).
    pub fn keys(&self, tx: &mut Tx<'_>) -> Result<Vec<u64>, Error> {
        let mut at = tx.read(self.header)?.root;
        loop {
            let node = read_node(tx, at)?;
            if node.leaf == 1 {
                break;
            }
            at = node.ptrs[0];
        }
        let mut out = Vec::new();
        while at != 0 {
            let leaf = read_node(tx, at)?;
            out.extend_from_slice(&leaf.keys[..leaf.n()]);
            at = leaf.next;
        }
        Ok(out)
    }

    /// Checks the B+ tree invariants (key order and bounds, node fill, equal leaf depth,
    /// count). Returns what is wrong, if anything.
    pub fn verify(&self, tx: &mut Tx<'_>) -> Result<Option<String>, Error> {
        let header = tx.read(self.header)?;
        let mut leaf_depth = None;
        let mut entries = 0u64;
        // (node, low bound, high bound, depth)
        let mut stack = vec![(header.root, None::<u64>, None::<u64>, 0usize)];
        while let Some((at, lo, hi, depth)) = stack.pop() {
            let node = read_node(tx, at)?;
            let n = node.count as usize;
            if n > MAX || (at != header.root && n < MIN) {
                return Ok(Some(format!("node {at:#x} holds {n} keys")));
            }
            let keys = &node.keys[..n];
            if keys.windows(2).any(|w| w[0] >= w[1])
                || keys
                    .iter()
                    .any(|&k| lo.is_some_and(|l| k < l) || hi.is_some_and(|h| k >= h))
            {
                return Ok(Some(format!(
                    "keys of node {at:#x} are out of order or bounds"
                )));
            }
            if node.leaf == 1 {
                match leaf_depth {
                    None => leaf_depth = Some(depth),
                    Some(d) if d != depth => return Ok(Some("leaves at different depths".into())),
                    _ => {}
                }
                entries += n as u64;
                continue;
            }
            for i in 0..=n {
                let l = if i == 0 { lo } else { Some(keys[i - 1]) };
                let h = if i == n { hi } else { Some(keys[i]) };
                stack.push((node.ptrs[i], l, h, depth + 1));
            }
        }
        let count = striped_count::total(tx, header.count)?;
        if entries != count {
            return Ok(Some(format!("{entries} entries but a count of {count}")));
        }
        Ok(None)
    }
}
