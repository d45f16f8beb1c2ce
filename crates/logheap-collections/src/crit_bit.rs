//! A crit-bit tree (PMDK's `ctree_map`, 001's CTree benchmark): a binary trie of `u64`
//! keys in which each internal node tests the highest bit where the keys below it
//! differ, and leaves hold the entries. No rebalancing: an insert adds one leaf and one
//! internal node, a removal frees one of each.
//!
//! A link is the offset of a leaf with its low bit set, or of an internal node (offsets
//! are 8-aligned); 0 is the empty tree.

use logheap::{Error, PPtr, Tx};

use crate::value_object;

#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Header {
    root: u64,
    len: u64,
}

#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Leaf {
    key: u64,
    value: u64,
}

#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Internal {
    bit: u64,
    child: [u64; 2],
}

const LEAF: u64 = 1;

fn is_leaf(link: u64) -> bool {
    link & LEAF != 0
}

fn side(key: u64, bit: u64) -> usize {
    ((key >> bit) & 1) as usize
}

/// Where the link to child `d` of the internal node at `node` is stored.
fn child_at(node: u64, d: usize) -> u64 {
    node + 8 + 8 * d as u64
}

/// A persistent crit-bit tree (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct CritBitTree {
    header: PPtr<Header>,
}

impl CritBitTree {
    /// Creates an empty tree.
    pub fn create(tx: &mut Tx<'_>) -> Result<CritBitTree, Error> {
        Ok(CritBitTree {
            header: tx.alloc(Header { root: 0, len: 0 })?,
        })
    }

    /// The tree stored at `header`.
    pub fn from_pointer(header: u64) -> CritBitTree {
        CritBitTree {
            header: PPtr::from_offset(header),
        }
    }

    /// The persistent pointer to store to find the tree again.
    pub fn pointer(&self) -> u64 {
        self.header.offset()
    }

    /// Number of entries.
    pub fn len(&self, tx: &mut Tx<'_>) -> Result<u64, Error> {
        Ok(tx.read(self.header)?.len)
    }

    /// Whether the tree is empty.
    pub fn is_empty(&self, tx: &mut Tx<'_>) -> Result<bool, Error> {
        Ok(self.len(tx)? == 0)
    }

    fn leaf(tx: &mut Tx<'_>, link: u64) -> Result<Leaf, Error> {
        tx.read(PPtr::<Leaf>::from_offset(link & !LEAF))
    }

    fn internal(tx: &mut Tx<'_>, link: u64) -> Result<Internal, Error> {
        tx.read(PPtr::<Internal>::from_offset(link))
    }

    /// The leaf `key` leads to (the tree is not empty).
    fn walk(tx: &mut Tx<'_>, mut link: u64, key: u64) -> Result<u64, Error> {
        while !is_leaf(link) {
            let n = Self::internal(tx, link)?;
            link = n.child[side(key, n.bit)];
        }
        Ok(link)
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
        let root = tx.read(self.header)?.root;
        if root == 0 {
            return Ok(false);
        }
        let found = Self::walk(tx, root, key)?;
        let leaf = Self::leaf(tx, found)?;
        if leaf.key != key {
            return Ok(false);
        }
        value_object::read_into(tx, leaf.value, out).map(|()| true)
    }

    /// Whether `key` is present.
    pub fn contains(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        let root = tx.read(self.header)?.root;
        if root == 0 {
            return Ok(false);
        }
        let found = Self::walk(tx, root, key)?;
        Ok(Self::leaf(tx, found)?.key == key)
    }

    /// Sets `key` to `value`; returns whether it replaced a value.
    pub fn insert(&self, tx: &mut Tx<'_>, key: u64, value: &[u8]) -> Result<bool, Error> {
        let h = tx.read(self.header)?;
        let root_at = self.header.offset();
        let new_leaf = |tx: &mut Tx<'_>| -> Result<u64, Error> {
            let value = value_object::create(tx, value)?;
            Ok(tx.alloc(Leaf { key, value })?.offset() | LEAF)
        };
        if h.root == 0 {
            let leaf = new_leaf(tx)?;
            tx.write(self.header, &Header { root: leaf, len: 1 })?;
            return Ok(false);
        }
        let found = Self::walk(tx, h.root, key)?;
        let leaf = Self::leaf(tx, found)?;
        if leaf.key == key {
            let value = value_object::replace(tx, leaf.value, value)?;
            tx.write(
                PPtr::<Leaf>::from_offset(found & !LEAF),
                &Leaf { key, value },
            )?;
            return Ok(true);
        }
        let diff = 63 - u64::from((leaf.key ^ key).leading_zeros());
        // The link to replace: the first on the path whose node tests a lower bit.
        let mut link_at = root_at;
        let mut link = h.root;
        while !is_leaf(link) {
            let n = Self::internal(tx, link)?;
            if n.bit < diff {
                break;
            }
            link_at = child_at(link, side(key, n.bit));
            link = n.child[side(key, n.bit)];
        }
        let leaf = new_leaf(tx)?;
        let mut child = [link; 2];
        child[side(key, diff)] = leaf;
        let node = tx.alloc(Internal { bit: diff, child })?.offset();
        if link_at != root_at {
            tx.write(PPtr::<u64>::from_offset(link_at), &node)?;
        }
        tx.write(
            self.header,
            &Header {
                root: if link_at == root_at { node } else { h.root },
                len: h.len + 1,
            },
        )?;
        Ok(false)
    }

    /// Removes `key`; returns whether it was present.
    pub fn remove(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        let h = tx.read(self.header)?;
        if h.root == 0 {
            return Ok(false);
        }
        let root_at = self.header.offset();
        // The link to the current node, and the parent with the link to it.
        let mut link_at = root_at;
        let mut link = h.root;
        // The parent, the link to it, and the leaf's sibling under it.
        let mut parent: Option<(u64, u64, u64)> = None;
        while !is_leaf(link) {
            let n = Self::internal(tx, link)?;
            let d = side(key, n.bit);
            parent = Some((link, link_at, n.child[1 - d]));
            link_at = child_at(link, d);
            link = n.child[d];
        }
        let leaf = Self::leaf(tx, link)?;
        if leaf.key != key {
            return Ok(false);
        }
        let mut root = h.root;
        match parent {
            None => root = 0,
            Some((p, p_at, sibling)) => {
                if p_at == root_at {
                    root = sibling;
                } else {
                    tx.write(PPtr::<u64>::from_offset(p_at), &sibling)?;
                }
                tx.free(PPtr::<Internal>::from_offset(p))?;
            }
        }
        value_object::free(tx, leaf.value)?;
        tx.free(PPtr::<Leaf>::from_offset(link & !LEAF))?;
        tx.write(
            self.header,
            &Header {
                root,
                len: h.len - 1,
            },
        )?;
        Ok(true)
    }

    /// Every key, in order.
    pub fn keys(&self, tx: &mut Tx<'_>) -> Result<Vec<u64>, Error> {
        let mut out = Vec::new();
        let root = tx.read(self.header)?.root;
        let mut stack = if root == 0 { vec![] } else { vec![root] };
        while let Some(link) = stack.pop() {
            if is_leaf(link) {
                out.push(Self::leaf(tx, link)?.key);
            } else {
                let n = Self::internal(tx, link)?;
                stack.push(n.child[1]);
                stack.push(n.child[0]);
            }
        }
        Ok(out)
    }

    /// Checks the tree's invariants: bits fall strictly along every path, every key is
    /// on the side its bits say, and the count is right. `Some(problem)` if one fails.
    pub fn verify(&self, tx: &mut Tx<'_>) -> Result<Option<String>, Error> {
        let h = tx.read(self.header)?;
        let mut leaves = 0u64;
        // (link, bit of the parent, constraints: mask and value of the key's bits)
        let mut stack = if h.root == 0 {
            vec![]
        } else {
            vec![(h.root, 64u64, 0u64, 0u64)]
        };
        while let Some((link, above, mask, want)) = stack.pop() {
            if is_leaf(link) {
                let key = Self::leaf(tx, link)?.key;
                if key & mask != want {
                    return Ok(Some(format!("key {key:#x} on the wrong side")));
                }
                leaves += 1;
                continue;
            }
            let n = Self::internal(tx, link)?;
            if n.bit >= above {
                return Ok(Some(format!("bit {} below bit {above}", n.bit)));
            }
            for d in 0..2u64 {
                stack.push((
                    n.child[d as usize],
                    n.bit,
                    mask | 1 << n.bit,
                    want | d << n.bit,
                ));
            }
        }
        Ok((leaves != h.len).then(|| format!("{leaves} leaves, length {}", h.len)))
    }
}
