//! The home-to-log address mapping (000_70bf7223c84ebbe9.txt §3.2, "Base"): one skip list
//! over the whole home space of non-overlapping nodes `{home, len} -> {log, version}`.
//!
//! Stores fragment the space on demand: mapping a range splits or trims the nodes it
//! overlaps, so writes of any offset and length work, and a read of a range stitches the
//! pieces together. The skip list needs no rebalancing; here it sits behind a
//! readers-writer lock (the lock-free variant and the partitioned layer build on it).

use std::sync::RwLock;

const MAX_LEVEL: usize = 20;
const HEAD: u32 = 0;
const NIL: u32 = u32::MAX;

/// A mapped piece of a looked-up range: `len` bytes at `home` live at pool offset `log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub home: u64,
    pub len: u64,
    pub log: u64,
}

#[derive(Debug, Clone)]
struct Node {
    home: u64,
    len: u64,
    log: u64,
    version: u64,
    level: u8,
    next: [u32; MAX_LEVEL],
}

/// A single-writer skip list of mapping nodes, nodes kept in an arena.
#[derive(Debug)]
pub(crate) struct SkipList {
    nodes: Vec<Node>,
    free: Vec<u32>,
    live: usize,
    rng: u64,
}

impl Default for SkipList {
    fn default() -> Self {
        SkipList {
            nodes: vec![Node {
                home: 0,
                len: 0,
                log: 0,
                version: 0,
                level: MAX_LEVEL as u8,
                next: [NIL; MAX_LEVEL],
            }],
            free: Vec::new(),
            live: 0,
            rng: 0x2545_F491_4F6C_DD1D,
        }
    }
}

impl SkipList {
    /// Number of mapping nodes.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// DRAM held by the nodes.
    pub(crate) fn dram_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>() + self.free.capacity() * 4
    }

    fn random_level(&mut self) -> u8 {
        // xorshift64*; each level with probability 1/4 (as in Pugh's paper).
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let level = 1 + (r.trailing_zeros() / 2) as usize;
        level.min(MAX_LEVEL) as u8
    }

    /// At each level, the last node whose home is below `key`.
    fn predecessors(&self, key: u64) -> [u32; MAX_LEVEL] {
        let mut preds = [HEAD; MAX_LEVEL];
        let mut x = HEAD;
        for level in (0..MAX_LEVEL).rev() {
            loop {
                let n = self.nodes[x as usize].next[level];
                if n != NIL && self.nodes[n as usize].home < key {
                    x = n;
                } else {
                    break;
                }
            }
            preds[level] = x;
        }
        preds
    }

    /// Calls `f` with every mapped piece of `[home, home + len)`, in address order.
    pub(crate) fn lookup(&self, home: u64, len: u64, mut f: impl FnMut(Piece)) {
        let end = home + len;
        let preds = self.predecessors(home);
        let mut x = preds[0];
        if x == HEAD {
            x = self.nodes[HEAD as usize].next[0];
        }
        while x != NIL {
            let n = &self.nodes[x as usize];
            if n.home >= end {
                break;
            }
            let (s, e) = (n.home.max(home), (n.home + n.len).min(end));
            if s < e {
                f(Piece {
                    home: s,
                    len: e - s,
                    log: n.log + (s - n.home),
                });
            }
            x = n.next[0];
        }
    }

    fn new_node(&mut self, home: u64, len: u64, log: u64, version: u64) -> u32 {
        let level = self.random_level();
        let node = Node {
            home,
            len,
            log,
            version,
            level,
            next: [NIL; MAX_LEVEL],
        };
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn link(&mut self, x: u32, preds: &[u32; MAX_LEVEL]) {
        for (level, &p) in preds
            .iter()
            .enumerate()
            .take(self.nodes[x as usize].level as usize)
        {
            self.nodes[x as usize].next[level] = self.nodes[p as usize].next[level];
            self.nodes[p as usize].next[level] = x;
        }
    }

    /// Unmaps `[home, home + len)`, reporting each displaced `(log offset, bytes)`.
    /// Returns the predecessors of `home`, still valid afterwards.
    fn clear(
        &mut self,
        home: u64,
        len: u64,
        displaced: &mut impl FnMut(u64, u64),
    ) -> [u32; MAX_LEVEL] {
        let end = home + len;
        let preds = self.predecessors(home);
        let p = preds[0];
        let mut tail = None;
        if p != HEAD {
            let n = &mut self.nodes[p as usize];
            let n_end = n.home + n.len;
            if n_end > home {
                displaced(n.log + (home - n.home), n_end.min(end) - home);
                if n_end > end {
                    tail = Some((end, n_end - end, n.log + (end - n.home), n.version));
                }
                n.len = home - n.home;
            }
        }
        loop {
            let c = self.nodes[p as usize].next[0];
            if c == NIL || self.nodes[c as usize].home >= end {
                break;
            }
            let n = &mut self.nodes[c as usize];
            let n_end = n.home + n.len;
            if n_end <= end {
                displaced(n.log, n.len);
                let (level, next) = (n.level as usize, n.next);
                for l in 0..level {
                    let pl = preds[l] as usize;
                    if self.nodes[pl].next[l] == c {
                        self.nodes[pl].next[l] = next[l];
                    }
                }
                self.free.push(c);
                self.live -= 1;
            } else {
                displaced(n.log, end - n.home);
                n.log += end - n.home;
                n.len = n_end - end;
                n.home = end;
                break;
            }
        }
        if let Some((h, l, log, v)) = tail {
            let x = self.new_node(h, l, log, v);
            let tail_preds = self.predecessors(h);
            self.link(x, &tail_preds);
        }
        preds
    }

    /// Maps `[home, home + len)` to `log` at `version`, reporting displaced bytes.
    pub(crate) fn insert(
        &mut self,
        home: u64,
        len: u64,
        log: u64,
        version: u64,
        displaced: &mut impl FnMut(u64, u64),
    ) {
        if len == 0 {
            return;
        }
        let preds = self.clear(home, len, displaced);
        // `clear` may have linked a split tail after `home`; predecessors below `home`
        // are unchanged, so they remain correct for the new node.
        let x = self.new_node(home, len, log, version);
        self.link(x, &preds);
    }

    /// Unmaps `[home, home + len)`, reporting displaced bytes.
    pub(crate) fn remove(&mut self, home: u64, len: u64, displaced: &mut impl FnMut(u64, u64)) {
        if len > 0 {
            self.clear(home, len, displaced);
        }
    }
}

/// The Base mapping: a skip list behind a readers-writer lock.
#[derive(Debug, Default)]
pub(crate) struct Mapping {
    list: RwLock<SkipList>,
}

impl Mapping {
    /// Read access.
    pub(crate) fn read(&self) -> std::sync::RwLockReadGuard<'_, SkipList> {
        self.list.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Write access.
    pub(crate) fn write(&self) -> std::sync::RwLockWriteGuard<'_, SkipList> {
        self.list.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A byte-per-home model: which log offset each home byte maps to.
    fn model_lookup(model: &[Option<u64>], home: u64, len: u64) -> Vec<Option<u64>> {
        model[home as usize..(home + len) as usize].to_vec()
    }

    fn list_lookup(list: &SkipList, home: u64, len: u64) -> Vec<Option<u64>> {
        let mut out = vec![None; len as usize];
        let mut last_end = home;
        list.lookup(home, len, |p| {
            assert!(p.home >= last_end, "pieces overlap or are out of order");
            last_end = p.home + p.len;
            for i in 0..p.len {
                out[(p.home - home + i) as usize] = Some(p.log + i);
            }
        });
        out
    }

    proptest! {
        #[test]
        fn skip_list_matches_a_byte_model(ops in prop::collection::vec((any::<bool>(), 0u64..500, 1u64..80), 1..200)) {
            let mut list = SkipList::default();
            let mut model: Vec<Option<u64>> = vec![None; 600];
            let mut live: i64 = 0;
            for (i, (is_insert, home, len)) in ops.into_iter().enumerate() {
                let mut displaced_bytes = 0i64;
                let mut displaced = |_log: u64, bytes: u64| displaced_bytes += bytes as i64;
                let mapped_before = model[home as usize..(home + len) as usize].iter().filter(|m| m.is_some()).count() as i64;
                if is_insert {
                    let log = 10_000 * (i as u64 + 1);
                    list.insert(home, len, log, i as u64, &mut displaced);
                    for k in 0..len {
                        model[(home + k) as usize] = Some(log + k);
                    }
                    live += len as i64;
                } else {
                    list.remove(home, len, &mut displaced);
                    for k in 0..len {
                        model[(home + k) as usize] = None;
                    }
                }
                prop_assert_eq!(displaced_bytes, mapped_before);
                live -= displaced_bytes;
                prop_assert_eq!(list_lookup(&list, 0, 600), model_lookup(&model, 0, 600));
                prop_assert_eq!(list_lookup(&list, home, len), model_lookup(&model, home, len));
            }
            let mapped = model.iter().filter(|m| m.is_some()).count() as i64;
            prop_assert_eq!(live, mapped);
        }
    }
}
