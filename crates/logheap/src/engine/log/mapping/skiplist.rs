//! One partition's skip list of mapping nodes ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §3.2, §4.3):
//! non-overlapping `{home, len} -> log` nodes sorted by home.
//!
//! One writer at a time (the partition's writer lock); readers need no lock:
//! - a node's fields never change while it is reachable: trimming or splitting a node
//!   *replaces* it with new nodes, swung in at the bottom level by one atomic store, so
//!   a reader sees either the old node or the new one, never a torn mapping;
//! - insertion links a node bottom-up, so it is effective once in the bottom level;
//! - removed nodes are recycled only after a grace period of the pool's epoch
//!   ([`PoolEpoch`]), so no reader can be standing on a node when it is reused. Nodes
//!   are type-stable (their memory is never freed while the list lives), so a
//!   per-thread node cache may keep pointers to them and validate a hit by the node's
//!   sequence word.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex};

use super::super::epoch::PoolEpoch;

/// Most levels a node can have (with p = 1/4, enough for 16 M nodes in one list).
pub(crate) const MAX_LEVEL: usize = 12;
/// Node slabs start small (a 4 KiB partition holds a few dozen nodes) and double.
const FIRST_SLAB: usize = 8;
const MAX_SLAB: usize = 1024;

/// A mapping node. Fields are atomics so that racing reads (by node caches) are defined;
/// `seq` is even while the node is live and odd once it is removed.
#[derive(Debug, Default)]
pub(crate) struct Node {
    /// The STM protocol's atomic type, as node caches keep it (see `node_cache`).
    seq: crate::stm::atomic::AtomicU64,
    home: AtomicU64,
    len: AtomicU64,
    log: AtomicU64,
    level: AtomicUsize,
    next: [AtomicPtr<Node>; MAX_LEVEL],
}

/// What a node maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeView {
    pub home: u64,
    pub len: u64,
    pub log: u64,
}

impl NodeView {
    pub(crate) fn end(&self) -> u64 {
        self.home + self.len
    }
}

impl Node {
    fn fields(&self) -> NodeView {
        NodeView {
            home: self.home.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
            log: self.log.load(Ordering::Relaxed),
        }
    }

    /// A consistent view of the node, if it is live: `(sequence, view)`.
    pub(crate) fn snapshot(&self) -> Option<(u64, NodeView)> {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return None;
        }
        let v = self.fields();
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == s1).then_some((s1, v))
    }

    /// The sequence word: unchanged exactly as long as the node maps the same range.
    pub(crate) fn seq_word(&self) -> &crate::stm::atomic::AtomicU64 {
        &self.seq
    }

    fn next(&self, level: usize) -> *mut Node {
        self.next[level].load(Ordering::Acquire)
    }
}

/// A node pointer that may cross threads (to the deferred recycler).
#[derive(Debug, Clone, Copy)]
struct NodePtr(*mut Node);
// SAFETY: nodes are type-stable and owned by their list's arena; the pointer is only
// dereferenced by the list's writer.
unsafe impl Send for NodePtr {}

/// Writer-only state: node arena and free nodes.
#[derive(Debug, Default)]
struct Arena {
    slabs: Vec<Box<[Node]>>,
    free: Vec<NodePtr>,
    rng: u64,
}

/// A skip list with one writer at a time and lock-free readers.
#[derive(Debug)]
pub(crate) struct SkipList {
    head: Box<Node>,
    arena: Mutex<Arena>,
    /// Nodes whose epoch has passed, ready for reuse (filled by deferred closures).
    recycled: Arc<Mutex<Vec<NodePtr>>>,
    live: AtomicUsize,
}

// SAFETY: all shared state is atomics or behind mutexes; raw node pointers point into the
// arena, which lives as long as the list.
unsafe impl Send for SkipList {}
// SAFETY: as above.
unsafe impl Sync for SkipList {}

impl Default for SkipList {
    fn default() -> Self {
        let head = Box::<Node>::default();
        head.level.store(MAX_LEVEL, Ordering::Relaxed);
        SkipList {
            head,
            arena: Mutex::new(Arena {
                rng: 0x2545_F491_4F6C_DD1D,
                ..Arena::default()
            }),
            recycled: Arc::new(Mutex::new(Vec::new())),
            live: AtomicUsize::new(0),
        }
    }
}

/// The writer's handle: holds the arena lock for the duration of one update.
pub(crate) struct Writer<'l> {
    list: &'l SkipList,
    arena: std::sync::MutexGuard<'l, Arena>,
    guard: crossbeam_epoch::Guard,
}

impl SkipList {
    /// Number of live nodes.
    pub(crate) fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// DRAM held by node slabs.
    pub(crate) fn dram_bytes(&self) -> usize {
        let arena = self.arena.lock().unwrap_or_else(|p| p.into_inner());
        let nodes: usize = arena.slabs.iter().map(|s| s.len()).sum::<usize>() + 1;
        nodes * std::mem::size_of::<Node>()
    }

    fn head(&self) -> *mut Node {
        &*self.head as *const Node as *mut Node
    }

    /// At each level, the last node whose home is below `key`.
    fn predecessors(&self, key: u64) -> [*mut Node; MAX_LEVEL] {
        let mut preds = [self.head(); MAX_LEVEL];
        let mut x = self.head();
        for (level, pred) in preds.iter_mut().enumerate().rev() {
            loop {
                // SAFETY: `x` is the head or a node reached through the list; nodes are
                // type-stable and not reused while the caller's epoch guard is pinned.
                let n = unsafe { &*x }.next(level);
                // SAFETY: as above, for `n`.
                if !n.is_null() && unsafe { &*n }.home.load(Ordering::Relaxed) < key {
                    x = n;
                } else {
                    break;
                }
            }
            *pred = x;
        }
        preds
    }

    /// Calls `f` with every node overlapping `[home, end)`, in order, under `_guard`,
    /// a pin of the pool's epoch (as crossbeam-skiplist's readers take one): removed
    /// nodes are recycled only once every guard pinned before their removal is gone, so
    /// the nodes the walk reaches stay nodes of this list's arena while it runs.
    pub(crate) fn for_each_overlapping(
        &self,
        _guard: &crossbeam_epoch::Guard,
        home: u64,
        end: u64,
        mut f: impl FnMut(&Node, NodeView),
    ) {
        let preds = self.predecessors(home);
        let mut x = preds[0];
        if x == self.head() {
            // SAFETY: the head is always valid.
            x = unsafe { &*x }.next(0);
        }
        while !x.is_null() {
            // SAFETY: reached through the list under the caller's guard.
            let n = unsafe { &*x };
            let v = n.fields();
            if v.home >= end {
                break;
            }
            if v.end() > home {
                f(n, v);
            }
            x = n.next(0);
        }
    }

    /// Starts an update; blocks other writers until the returned handle is dropped.
    /// Removed nodes are recycled through `epoch`, the pool's.
    pub(crate) fn writer(&self, epoch: &PoolEpoch) -> Writer<'_> {
        Writer {
            list: self,
            arena: self.arena.lock().unwrap_or_else(|p| p.into_inner()),
            guard: epoch.pin(),
        }
    }
}

impl Writer<'_> {
    fn random_level(&mut self) -> usize {
        let a = &mut self.arena;
        a.rng ^= a.rng >> 12;
        a.rng ^= a.rng << 25;
        a.rng ^= a.rng >> 27;
        let r = a.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (1 + (r.trailing_zeros() / 2) as usize).min(MAX_LEVEL)
    }

    /// A fresh node (not yet reachable) mapping `v`.
    fn new_node(&mut self, v: NodeView) -> *mut Node {
        if self.arena.free.is_empty() {
            let mut recycled = self.list.recycled.lock().unwrap_or_else(|p| p.into_inner());
            self.arena.free.append(&mut recycled);
        }
        if self.arena.free.is_empty() {
            let size = (FIRST_SLAB << self.arena.slabs.len().min(16)).min(MAX_SLAB);
            let slab: Box<[Node]> = (0..size)
                .map(|_| {
                    let n = Node::default();
                    n.seq.store(1, Ordering::Relaxed); // not live until initialised
                    n
                })
                .collect();
            let base = slab.as_ptr() as *mut Node;
            // SAFETY: `base + i` for i < size lies inside the slab just made.
            self.arena
                .free
                .extend((0..size).rev().map(|i| NodePtr(unsafe { base.add(i) })));
            self.arena.slabs.push(slab);
        }
        let level = self.random_level();
        let p = self
            .arena
            .free
            .pop()
            .expect("the free list was just refilled")
            .0;
        // SAFETY: `p` is an arena node that no reader can reach (free, or recycled after
        // its epoch); caches may read it concurrently, which the odd `seq` makes them
        // ignore until the final store below.
        let n = unsafe { &*p };
        // A seqlock writer's fence: the odd stamp `retire` left comes before the new
        // fields, so a reader that read the node's old, even sequence and then any new
        // field finds the sequence changed when it checks again (the stamp's own
        // release orders only what came before it).
        fence(Ordering::Release);
        n.home.store(v.home, Ordering::Relaxed);
        n.len.store(v.len, Ordering::Relaxed);
        n.log.store(v.log, Ordering::Relaxed);
        n.level.store(level, Ordering::Relaxed);
        for l in &n.next {
            l.store(std::ptr::null_mut(), Ordering::Relaxed);
        }
        let seq = n.seq.load(Ordering::Relaxed);
        n.seq.store(seq + 1, Ordering::Release); // odd -> even: live
        self.list.live.fetch_add(1, Ordering::Relaxed);
        p
    }

    /// Marks `p` removed and hands it to the recycler once no reader can see it.
    fn retire(&mut self, p: *mut Node) {
        // SAFETY: `p` is a node of this list, just unlinked by this writer.
        let n = unsafe { &*p };
        n.seq.fetch_add(1, Ordering::Release); // even -> odd: removed
        self.list.live.fetch_sub(1, Ordering::Relaxed);
        let recycled = self.list.recycled.clone();
        let ptr = NodePtr(p);
        self.guard.defer(move || {
            // Only moves the pointer to a list the closure owns a reference to; the node
            // itself is never freed here (so it may run after the list is gone).
            let ptr = ptr;
            recycled.lock().unwrap_or_else(|p| p.into_inner()).push(ptr);
        });
    }

    /// Links `x` (not yet reachable) after `preds`, bottom level first.
    fn link(&self, x: *mut Node, preds: &[*mut Node; MAX_LEVEL]) {
        // SAFETY: `x` and `preds` are nodes of this list; only this writer mutates links.
        let n = unsafe { &*x };
        let level = n.level.load(Ordering::Relaxed);
        for (l, &p) in preds.iter().enumerate().take(level) {
            // SAFETY: as above.
            let p = unsafe { &*p };
            n.next[l].store(p.next(l), Ordering::Relaxed);
            p.next[l].store(x, Ordering::Release);
        }
    }

    /// Replaces `old` (whose predecessors are `preds`) by `new`, which maps a sub-range
    /// of it: a reader sees one or the other at the bottom level, never neither.
    fn replace(&mut self, old: *mut Node, new: *mut Node, preds: &[*mut Node; MAX_LEVEL]) {
        // SAFETY: both are nodes of this list; only this writer mutates links.
        let (o, n) = unsafe { (&*old, &*new) };
        let old_level = o.level.load(Ordering::Relaxed);
        let new_level = n.level.load(Ordering::Relaxed);
        // Upper levels: unlink the old node, then prepare the new one's links.
        for l in (1..old_level).rev() {
            // SAFETY: preds are nodes of this list.
            let p = unsafe { &*preds[l] };
            if p.next(l) == old {
                p.next[l].store(o.next(l), Ordering::Release);
            }
        }
        n.next[0].store(o.next(0), Ordering::Relaxed);
        for (l, &p) in preds.iter().enumerate().take(new_level).skip(1) {
            // SAFETY: as above.
            n.next[l].store(unsafe { &*p }.next(l), Ordering::Relaxed);
        }
        // The swing: one store at the bottom level.
        // SAFETY: as above.
        unsafe { &*preds[0] }.next[0].store(new, Ordering::Release);
        for (l, &p) in preds.iter().enumerate().take(new_level).skip(1) {
            // SAFETY: as above.
            unsafe { &*p }.next[l].store(new, Ordering::Release);
        }
        self.retire(old);
    }

    /// Replaces `old` by the pair `left` (same start) and `right` (a later start), both
    /// sub-ranges of it, with one bottom-level store: readers see either `old` or both.
    fn replace_with_pair(
        &mut self,
        old: *mut Node,
        left: *mut Node,
        right: *mut Node,
        preds: &[*mut Node; MAX_LEVEL],
    ) {
        // SAFETY: all are nodes of this list; only this writer mutates links.
        let (o, l, r) = unsafe { (&*old, &*left, &*right) };
        let (old_level, l_level, r_level) = (
            o.level.load(Ordering::Relaxed),
            l.level.load(Ordering::Relaxed),
            r.level.load(Ordering::Relaxed),
        );
        for lvl in (1..old_level).rev() {
            // SAFETY: preds are nodes of this list.
            let p = unsafe { &*preds[lvl] };
            if p.next(lvl) == old {
                p.next[lvl].store(o.next(lvl), Ordering::Release);
            }
        }
        r.next[0].store(o.next(0), Ordering::Relaxed);
        l.next[0].store(right, Ordering::Relaxed);
        for (lvl, &p) in preds.iter().enumerate().take(r_level).skip(1) {
            // SAFETY: preds are nodes of this list.
            r.next[lvl].store(unsafe { &*p }.next(lvl), Ordering::Relaxed);
        }
        for (lvl, &p) in preds.iter().enumerate().take(l_level).skip(1) {
            let next = if lvl < r_level {
                right
            } else {
                // SAFETY: preds are nodes of this list.
                unsafe { &*p }.next(lvl)
            };
            l.next[lvl].store(next, Ordering::Relaxed);
        }
        // The swing.
        // SAFETY: preds are nodes of this list.
        unsafe { &*preds[0] }.next[0].store(left, Ordering::Release);
        for (lvl, &p) in preds.iter().enumerate().take(l_level.max(r_level)).skip(1) {
            let first = if lvl < l_level { left } else { right };
            // SAFETY: preds are nodes of this list.
            unsafe { &*p }.next[lvl].store(first, Ordering::Release);
        }
        self.retire(old);
    }

    /// Unlinks `x` (whose predecessors are `preds`) from every level.
    fn unlink(&mut self, x: *mut Node, preds: &[*mut Node; MAX_LEVEL]) {
        // SAFETY: `x` and preds are nodes of this list; only this writer mutates links.
        let n = unsafe { &*x };
        for l in (0..n.level.load(Ordering::Relaxed)).rev() {
            // SAFETY: as above.
            let p = unsafe { &*preds[l] };
            if p.next(l) == x {
                p.next[l].store(n.next(l), Ordering::Release);
            }
        }
        self.retire(x);
    }

    /// Unmaps `[home, end)`, reporting each displaced `(log offset, bytes)`.
    ///
    /// Returns the predecessors of `home` as they are afterwards (for linking a node
    /// there).
    pub(crate) fn clear(
        &mut self,
        home: u64,
        end: u64,
        displaced: &mut impl FnMut(u64, u64),
    ) -> [*mut Node; MAX_LEVEL] {
        let list = self.list;
        let preds = list.predecessors(home);
        let p = preds[0];
        if p != list.head() {
            // SAFETY: a node of this list.
            let v = unsafe { &*p }.fields();
            if v.end() > home {
                displaced(v.log + (home - v.home), v.end().min(end) - home);
                let left = self.new_node(NodeView {
                    len: home - v.home,
                    ..v
                });
                let p_preds = list.predecessors(v.home);
                if v.end() > end {
                    // The range is inside this one node: keep both its ends, swapped in
                    // together so that no reader finds the tail unmapped.
                    let right = self.new_node(NodeView {
                        home: end,
                        len: v.end() - end,
                        log: v.log + (end - v.home),
                    });
                    self.replace_with_pair(p, left, right, &p_preds);
                    return list.predecessors(home);
                }
                self.replace(p, left, &p_preds);
            }
        }
        // Nodes starting in [home, end) are removed front to back: each one's
        // predecessors are those of `home` (nothing lies between), which stay valid.
        let preds = list.predecessors(home);
        loop {
            // SAFETY: the head or a node of this list.
            let c = unsafe { &*preds[0] }.next(0);
            if c.is_null() {
                break;
            }
            // SAFETY: a node of this list.
            let v = unsafe { &*c }.fields();
            if v.home >= end {
                break;
            }
            if v.end() <= end {
                displaced(v.log, v.len);
                self.unlink(c, &preds);
            } else {
                displaced(v.log, end - v.home);
                let right = self.new_node(NodeView {
                    home: end,
                    len: v.end() - end,
                    log: v.log + (end - v.home),
                });
                self.replace(c, right, &preds);
                break;
            }
        }
        preds
    }

    /// Maps `[home, home + len)` to `log`, reporting displaced bytes.
    pub(crate) fn insert(
        &mut self,
        home: u64,
        len: u64,
        log: u64,
        displaced: &mut impl FnMut(u64, u64),
    ) {
        if len == 0 {
            return;
        }
        let preds = self.clear(home, home + len, displaced);
        let x = self.new_node(NodeView { home, len, log });
        self.link(x, &preds);
    }
}
