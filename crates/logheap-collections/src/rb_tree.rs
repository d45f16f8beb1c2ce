//! A persistent red-black tree (CLRS, with a persistent sentinel node for nil).
//!
//! Values live out of line (a node points to a `{len, bytes}` object), so replacing a
//! value with one of another length never moves a node. The left/right mirror cases of
//! rebalancing are written once, over a direction.

use bytemuck::Zeroable;
use logheap::{Error, PPtr, Tx};

use crate::{striped_count, value_object};

/// The persistent header of an [`RbTree`].
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct RbHeader {
    root: u64,
    nil: u64,
    /// The entry count (a striped count object).
    count: u64,
}

#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Node {
    key: u64,
    /// Children: `[left, right]`.
    child: [u64; 2],
    parent: u64,
    red: u64,
    /// The value object: `{len: u64, bytes}`.
    value: u64,
}

const KEY: u64 = 0;
const CHILD: u64 = 8;
const PARENT: u64 = 24;
const RED: u64 = 32;
const VALUE: u64 = 40;

/// A persistent ordered map from `u64` keys to byte-string values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RbTree {
    header: PPtr<RbHeader>,
}

/// Left (0) or right (1).
type Dir = usize;
const LEFT: Dir = 0;
const RIGHT: Dir = 1;

/// One operation's view of the tree: field reads and writes through the transaction.
struct Ops<'a, 't> {
    tx: &'a mut Tx<'t>,
    header: PPtr<RbHeader>,
    nil: u64,
    /// The nodes this operation read last, whole (see [`NodeCache`]).
    nodes: NodeCache,
}

/// Nodes an operation has read, kept whole: a walk reads a node's key, then a child,
/// and rebalancing reads the same few nodes' links and colours again and again; one
/// transactional read of the whole node (one range check, one lock word, one copy)
/// serves them all. Sound within one transaction: reading a node again would give the
/// same bytes (its snapshot is one) or abort it, and the operation's own writes to a
/// node are applied to its copy here as they are made.
struct NodeCache {
    /// The kept nodes' addresses, apart from the nodes so that a search compares one
    /// dense array (0: no node).
    at: [u64; NODE_CACHE],
    nodes: [Node; NODE_CACHE],
    /// The entry the next new node replaces (round robin).
    next: usize,
}

/// Nodes an operation keeps (a rebalancing step touches at most five or six).
const NODE_CACHE: usize = 8;

impl NodeCache {
    fn new() -> NodeCache {
        // Address 0 is never a node's (it is the null pointer).
        NodeCache {
            at: [0; NODE_CACHE],
            nodes: [Node::zeroed(); NODE_CACHE],
            next: 0,
        }
    }

    fn find(&mut self, n: u64) -> Option<&mut Node> {
        let i = self.at.iter().position(|&at| at == n)?;
        Some(&mut self.nodes[i])
    }

    fn keep(&mut self, n: u64, node: Node) {
        self.at[self.next] = n;
        self.nodes[self.next] = node;
        self.next = (self.next + 1) % NODE_CACHE;
    }
}

/// Field `field` (a byte offset, a multiple of 8) of `node`.
fn field_of(node: &mut Node, field: u64) -> &mut u64 {
    &mut bytemuck::cast_mut::<Node, [u64; 6]>(node)[(field / 8) as usize]
}

impl Ops<'_, '_> {
    /// Node `n` as this operation sees it (kept for its later reads).
    fn node(&mut self, n: u64) -> Result<Node, Error> {
        if let Some(node) = self.nodes.find(n) {
            return Ok(*node);
        }
        let node: Node = self.tx.read(PPtr::from_offset(n))?;
        self.nodes.keep(n, node);
        Ok(node)
    }
    fn get(&mut self, n: u64, field: u64) -> Result<u64, Error> {
        let mut node = self.node(n)?;
        Ok(*field_of(&mut node, field))
    }
    fn put(&mut self, n: u64, field: u64, v: u64) -> Result<(), Error> {
        self.tx.write(PPtr::<u64>::from_offset(n + field), &v)?;
        if let Some(node) = self.nodes.find(n) {
            *field_of(node, field) = v;
        }
        Ok(())
    }
    fn child(&mut self, n: u64, d: Dir) -> Result<u64, Error> {
        self.get(n, CHILD + 8 * d as u64)
    }
    fn set_child(&mut self, n: u64, d: Dir, v: u64) -> Result<(), Error> {
        self.put(n, CHILD + 8 * d as u64, v)
    }
    fn parent(&mut self, n: u64) -> Result<u64, Error> {
        self.get(n, PARENT)
    }
    fn set_parent(&mut self, n: u64, v: u64) -> Result<(), Error> {
        if self.parent(n)? != v {
            self.put(n, PARENT, v)?;
        }
        Ok(())
    }
    fn is_red(&mut self, n: u64) -> Result<bool, Error> {
        Ok(self.get(n, RED)? == 1)
    }
    fn set_red(&mut self, n: u64, red: bool) -> Result<(), Error> {
        // Colours are often rewritten unchanged (the root, nil): writing them anyway
        // would make unrelated transactions conflict on those nodes.
        if self.is_red(n)? != red {
            self.put(n, RED, red as u64)?;
        }
        Ok(())
    }
    fn root(&mut self) -> Result<u64, Error> {
        self.tx.read(PPtr::<u64>::from_offset(self.header.offset()))
    }
    fn set_root(&mut self, v: u64) -> Result<(), Error> {
        self.tx
            .write(PPtr::<u64>::from_offset(self.header.offset()), &v)
    }
    /// Which side of its parent `n` is on.
    fn side(&mut self, n: u64) -> Result<Dir, Error> {
        let p = self.parent(n)?;
        Ok(if self.child(p, LEFT)? == n {
            LEFT
        } else {
            RIGHT
        })
    }

    /// Puts `v` where `u` was under `u`'s parent (or as root).
    fn transplant(&mut self, u: u64, v: u64) -> Result<(), Error> {
        let p = self.parent(u)?;
        if p == self.nil {
            self.set_root(v)?;
        } else {
            let d = self.side(u)?;
            self.set_child(p, d, v)?;
        }
        self.set_parent(v, p)
    }

    /// Rotates `x` down in direction `d` (LEFT: its right child rises).
    fn rotate(&mut self, x: u64, d: Dir) -> Result<(), Error> {
        let y = self.child(x, 1 - d)?;
        let inner = self.child(y, d)?;
        self.set_child(x, 1 - d, inner)?;
        if inner != self.nil {
            self.set_parent(inner, x)?;
        }
        self.transplant(x, y)?;
        self.set_child(y, d, x)?;
        self.set_parent(x, y)
    }

    fn find(&mut self, key: u64) -> Result<Option<u64>, Error> {
        let mut x = self.root()?;
        while x != self.nil {
            let node = self.node(x)?;
            if key == node.key {
                return Ok(Some(x));
            }
            x = node.child[(key > node.key) as Dir];
        }
        Ok(None)
    }

    fn insert_fixup(&mut self, mut z: u64) -> Result<(), Error> {
        loop {
            let p = self.parent(z)?;
            if !self.is_red(p)? {
                break;
            }
            let g = self.parent(p)?;
            let d = self.side(p)?;
            let uncle = self.child(g, 1 - d)?;
            if self.is_red(uncle)? {
                self.set_red(p, false)?;
                self.set_red(uncle, false)?;
                self.set_red(g, true)?;
                z = g;
            } else {
                if self.child(p, 1 - d)? == z {
                    z = p;
                    self.rotate(z, d)?;
                }
                let p = self.parent(z)?;
                let g = self.parent(p)?;
                self.set_red(p, false)?;
                self.set_red(g, true)?;
                self.rotate(g, 1 - d)?;
            }
        }
        let root = self.root()?;
        self.set_red(root, false)
    }

    fn delete_fixup(&mut self, mut x: u64) -> Result<(), Error> {
        while x != self.root()? && !self.is_red(x)? {
            let p = self.parent(x)?;
            let d = if self.child(p, LEFT)? == x {
                LEFT
            } else {
                RIGHT
            };
            let mut w = self.child(p, 1 - d)?;
            if self.is_red(w)? {
                self.set_red(w, false)?;
                self.set_red(p, true)?;
                self.rotate(p, d)?;
                w = self.child(p, 1 - d)?;
            }
            let near = self.child(w, d)?;
            let far = self.child(w, 1 - d)?;
            if !self.is_red(near)? && !self.is_red(far)? {
                self.set_red(w, true)?;
                x = p;
            } else {
                if !self.is_red(far)? {
                    self.set_red(near, false)?;
                    self.set_red(w, true)?;
                    self.rotate(w, 1 - d)?;
                    w = self.child(p, 1 - d)?;
                }
                let p_red = self.is_red(p)?;
                self.set_red(w, p_red)?;
                self.set_red(p, false)?;
                let far = self.child(w, 1 - d)?;
                self.set_red(far, false)?;
                self.rotate(p, d)?;
                x = self.root()?;
            }
        }
        self.set_red(x, false)
    }

    fn minimum(&mut self, mut x: u64) -> Result<u64, Error> {
        loop {
            let l = self.child(x, LEFT)?;
            if l == self.nil {
                return Ok(x);
            }
            x = l;
        }
    }

    fn add_len(&mut self, delta: i64) -> Result<(), Error> {
        let count = self
            .tx
            .read(PPtr::<u64>::from_offset(self.header.offset() + 16))?;
        striped_count::add(self.tx, count, delta)
    }
}

impl RbTree {
    /// Creates an empty tree.
    pub fn create(tx: &mut Tx<'_>) -> Result<RbTree, Error> {
        let nil = tx.alloc(Node {
            key: 0,
            child: [0, 0],
            parent: 0,
            red: 0,
            value: 0,
        })?;
        let count = striped_count::create(tx)?;
        let header = tx.alloc(RbHeader {
            root: nil.offset(),
            nil: nil.offset(),
            count,
        })?;
        Ok(RbTree { header })
    }

    /// The tree stored at `header`.
    pub fn from_pointer(header: u64) -> RbTree {
        RbTree {
            header: PPtr::from_offset(header),
        }
    }

    /// The persistent pointer to store to find the tree again.
    pub fn pointer(&self) -> u64 {
        self.header.offset()
    }

    fn ops<'a, 't>(&self, tx: &'a mut Tx<'t>) -> Result<Ops<'a, 't>, Error> {
        let nil = tx.read(self.header)?.nil;
        Ok(Ops {
            tx,
            header: self.header,
            nil,
            nodes: NodeCache::new(),
        })
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

    /// The value of `key`, if present.
    pub fn get(&self, tx: &mut Tx<'_>, key: u64) -> Result<Option<Vec<u8>>, Error> {
        let mut v = Vec::new();
        Ok(self.get_into(tx, key, &mut v)?.then_some(v))
    }

    /// Reads the value of `key` into `out` (its capacity reused) and returns whether
    /// the key is present (`out` is left empty when not).
    pub fn get_into(&self, tx: &mut Tx<'_>, key: u64, out: &mut Vec<u8>) -> Result<bool, Error> {
        out.clear();
        let mut ops = self.ops(tx)?;
        match ops.find(key)? {
            Some(n) => {
                let at = ops.get(n, VALUE)?;
                value_object::read_into(ops.tx, at, out)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Whether `key` is present.
    pub fn contains(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        Ok(self.ops(tx)?.find(key)?.is_some())
    }

    /// Sets `key` to `value`; returns whether it replaced a value.
    pub fn insert(&self, tx: &mut Tx<'_>, key: u64, value: &[u8]) -> Result<bool, Error> {
        let mut ops = self.ops(tx)?;
        let nil = ops.nil;
        let mut y = nil;
        let mut x = ops.root()?;
        while x != nil {
            y = x;
            let node = ops.node(x)?;
            if key == node.key {
                let old = node.value;
                let now = value_object::replace(ops.tx, old, value)?;
                if now != old {
                    ops.put(x, VALUE, now)?;
                }
                return Ok(true);
            }
            x = node.child[(key > node.key) as Dir];
        }
        let value = value_object::create(ops.tx, value)?;
        let z = ops
            .tx
            .alloc(Node {
                key,
                child: [nil, nil],
                parent: y,
                red: 1,
                value,
            })?
            .offset();
        if y == nil {
            ops.set_root(z)?;
        } else {
            let d = (key > ops.get(y, KEY)?) as Dir;
            ops.set_child(y, d, z)?;
        }
        ops.insert_fixup(z)?;
        ops.add_len(1)?;
        Ok(false)
    }

    /// Removes `key`; returns whether it was present.
    pub fn remove(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        let mut ops = self.ops(tx)?;
        let nil = ops.nil;
        let Some(z) = ops.find(key)? else {
            return Ok(false);
        };
        let mut removed_red = ops.is_red(z)?;
        let x;
        let zl = ops.child(z, LEFT)?;
        let zr = ops.child(z, RIGHT)?;
        if zl == nil {
            x = zr;
            ops.transplant(z, zr)?;
        } else if zr == nil {
            x = zl;
            ops.transplant(z, zl)?;
        } else {
            let y = ops.minimum(zr)?;
            removed_red = ops.is_red(y)?;
            x = ops.child(y, RIGHT)?;
            if ops.parent(y)? == z {
                ops.set_parent(x, y)?;
            } else {
                ops.transplant(y, x)?;
                ops.set_child(y, RIGHT, zr)?;
                ops.set_parent(zr, y)?;
            }
            ops.transplant(z, y)?;
            ops.set_child(y, LEFT, zl)?;
            ops.set_parent(zl, y)?;
            let z_red = ops.is_red(z)?;
            ops.set_red(y, z_red)?;
        }
        if !removed_red {
            ops.delete_fixup(x)?;
        }
        let value = ops.get(z, VALUE)?;
        value_object::free(ops.tx, value)?;
        ops.tx.free(PPtr::<Node>::from_offset(z))?;
        ops.add_len(-1)?;
        Ok(true)
    }

    /// Every key in ascending order.
    pub fn keys(&self, tx: &mut Tx<'_>) -> Result<Vec<u64>, Error> {
        let mut ops = self.ops(tx)?;
        let mut out = Vec::new();
        let mut stack = Vec::new();
        let mut x = ops.root()?;
        while x != ops.nil || !stack.is_empty() {
            while x != ops.nil {
                stack.push(x);
                x = ops.child(x, LEFT)?;
            }
            let n = stack
                .pop()
                .expect("the loop condition guarantees an element");
            out.push(ops.get(n, KEY)?);
            x = ops.child(n, RIGHT)?;
        }
        Ok(out)
    }

    /// Checks the red-black invariants (ordered keys, no red node with a red child,
    /// equal black height on every path, consistent parent links and count). Returns
    /// what is wrong, if anything.
    pub fn verify(&self, tx: &mut Tx<'_>) -> Result<Option<String>, Error> {
        let count = self.len(tx)?;
        let mut ops = self.ops(tx)?;
        let root = ops.root()?;
        if ops.is_red(root)? {
            return Ok(Some("the root is red".into()));
        }
        let mut nodes = 0u64;
        // (node, low bound, high bound, black height so far)
        let mut stack = vec![(root, None::<u64>, None::<u64>, 0u64)];
        let mut black_height = None;
        while let Some((n, lo, hi, blacks)) = stack.pop() {
            if n == ops.nil {
                match black_height {
                    None => black_height = Some(blacks),
                    Some(b) if b != blacks => return Ok(Some("black heights differ".into())),
                    _ => {}
                }
                continue;
            }
            nodes += 1;
            let k = ops.get(n, KEY)?;
            if lo.is_some_and(|l| k <= l) || hi.is_some_and(|h| k >= h) {
                return Ok(Some(format!("key {k} is out of order")));
            }
            let red = ops.is_red(n)?;
            for d in [LEFT, RIGHT] {
                let c = ops.child(n, d)?;
                if c != ops.nil {
                    if ops.parent(c)? != n {
                        return Ok(Some(format!("a child of {k} has a wrong parent")));
                    }
                    if red && ops.is_red(c)? {
                        return Ok(Some(format!("red node {k} has a red child")));
                    }
                }
                let (l, h) = if d == LEFT {
                    (lo, Some(k))
                } else {
                    (Some(k), hi)
                };
                stack.push((c, l, h, blacks + (!red) as u64));
            }
        }
        if nodes != count {
            return Ok(Some(format!("{nodes} nodes but a count of {count}")));
        }
        Ok(None)
    }
}
