//! A transaction's buffered writes.
//!
//! Writes are kept in program order; reads overlay them so a transaction sees its own
//! writes. At commit, [`WriteSet::resolve_into`] turns them into non-overlapping pieces in which
//! later bytes win, so no byte reaches the log twice.

use std::collections::{BTreeSet, BinaryHeap};

/// One buffered write.
#[derive(Debug, Clone, Copy)]
struct Write {
    home: u64,
    len: u64,
    /// Offset of the bytes in `WriteSet::bytes`.
    at: usize,
}

/// Buffered writes of one transaction.
#[derive(Debug, Default)]
pub(crate) struct WriteSet {
    writes: Vec<Write>,
    bytes: Vec<u8>,
    /// Write indices by start address, and the longest write: a read finds the writes
    /// that overlap it without scanning them all. Built only once there are more than
    /// [`SCAN_LIMIT`] writes (small transactions never pay for it).
    by_start: BTreeSet<(u64, u32)>,
    max_len: u64,
    /// The lowest start and highest end of every write: a read outside them has
    /// nothing to overlay (most reads of a transaction).
    lo: u64,
    hi: u64,
    /// A bit per stripe (64 bytes) written, by stripe number modulo its size: a read
    /// none of whose stripes has its bit overlaps no write (scattered writes, as a tree
    /// update's, leave most reads outside it).
    stripes_written: [u64; FILTER_WORDS],
    /// Scratch: the writes a read overlaps, in program order.
    candidates: Vec<u32>,
}

/// Words of the written-stripes filter (512 bits).
const FILTER_WORDS: usize = 8;
const FILTER_BITS: u64 = FILTER_WORDS as u64 * 64;

/// The filter bit of stripe `stripe`: its word and its mask.
#[inline]
fn filter_bit(stripe: u64) -> (usize, u64) {
    let bit = stripe % FILTER_BITS;
    ((bit / 64) as usize, 1 << (bit % 64))
}

/// Below this many writes, a read scans them all (cheaper than the index).
const SCAN_LIMIT: usize = 16;

impl WriteSet {
    /// Whether nothing was written.
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Buffers a write.
    ///
    /// Once the set is indexed, a write inside the latest write that overlaps it is
    /// copied into that write's bytes, and earlier writes that a new write covers whole
    /// are emptied: a transaction that rewrites the same node again and again (a tree's
    /// leaf, one delete after another) keeps one write for it, not one per change, so
    /// its reads of the node do not overlay a growing list.
    pub(crate) fn push(&mut self, home: u64, bytes: &[u8]) {
        if self.writes.len() > SCAN_LIMIT && !bytes.is_empty() && self.absorb(home, bytes) {
            return;
        }
        self.writes.push(Write {
            home,
            len: bytes.len() as u64,
            at: self.bytes.len(),
        });
        self.bytes.extend_from_slice(bytes);
        let end = home + bytes.len() as u64;
        let stripes = super::stripes(home, bytes.len() as u64);
        if stripes.end() - stripes.start() >= FILTER_BITS {
            self.stripes_written = [u64::MAX; FILTER_WORDS];
        } else {
            for stripe in stripes {
                let (w, mask) = filter_bit(stripe);
                self.stripes_written[w] |= mask;
            }
        }
        if self.writes.len() == 1 {
            (self.lo, self.hi) = (home, end);
        } else {
            (self.lo, self.hi) = (self.lo.min(home), self.hi.max(end));
        }
        let n = self.writes.len();
        if n == SCAN_LIMIT + 1 {
            for i in 0..n {
                self.index(i);
            }
        } else if n > SCAN_LIMIT + 1 {
            self.index(n - 1);
            self.empty_covered(home, end, n - 1);
        }
    }

    /// Copies `bytes` into the latest write overlapping `[home, home + len)` when that
    /// write holds the whole range (no later write overlaps it, so the bytes read back
    /// are these). Returns whether it did.
    fn absorb(&mut self, home: u64, bytes: &[u8]) -> bool {
        let end = home + bytes.len() as u64;
        let latest = self
            .by_start
            .range((home.saturating_sub(self.max_len), 0)..(end, 0))
            .map(|&(_, i)| i)
            .filter(|&i| {
                let w = &self.writes[i as usize];
                w.len > 0 && w.home < end && home < w.home + w.len
            })
            .max();
        let Some(i) = latest else {
            return false;
        };
        let w = self.writes[i as usize];
        if w.home > home || w.home + w.len < end {
            return false;
        }
        let at = w.at + (home - w.home) as usize;
        self.bytes[at..at + bytes.len()].copy_from_slice(bytes);
        true
    }

    /// Empties the writes before `latest` that lie inside `[home, end)`, which write
    /// `latest` overwrites whole (their bytes stay, unreferenced).
    fn empty_covered(&mut self, home: u64, end: u64, latest: usize) {
        let mut covered = std::mem::take(&mut self.candidates);
        covered.clear();
        covered.extend(
            self.by_start
                .range((home, 0)..(end, 0))
                .map(|&(_, i)| i)
                .filter(|&i| {
                    let w = &self.writes[i as usize];
                    i as usize != latest && w.home + w.len <= end
                }),
        );
        for &i in &covered {
            let w = &mut self.writes[i as usize];
            self.by_start.remove(&(w.home, i));
            w.len = 0;
        }
        self.candidates = covered;
    }

    fn index(&mut self, i: usize) {
        let w = self.writes[i];
        self.by_start.insert((w.home, i as u32));
        self.max_len = self.max_len.max(w.len);
    }

    /// Forgets everything (for a retry).
    pub(crate) fn clear(&mut self) {
        self.writes.clear();
        self.bytes.clear();
        self.by_start.clear();
        self.max_len = 0;
        (self.lo, self.hi) = (0, 0);
        self.stripes_written = [0; FILTER_WORDS];
    }

    /// Whether a write of this set may touch `[home, home + len)` (false: none does;
    /// true may be a false alarm of the stripe filter).
    #[inline]
    pub(crate) fn may_touch(&self, home: u64, len: u64) -> bool {
        let end = home + len;
        if end <= self.lo || home >= self.hi {
            return false;
        }
        let stripes = super::stripes(home, len);
        stripes.end() - stripes.start() >= FILTER_BITS
            || stripes.into_iter().any(|stripe| {
                let (w, mask) = filter_bit(stripe);
                self.stripes_written[w] & mask != 0
            })
    }

    /// Copies this transaction's writes over `buf`, which holds `[home, home + len)`.
    #[inline]
    pub(crate) fn overlay(&mut self, home: u64, buf: &mut [u8]) {
        if !self.may_touch(home, buf.len() as u64) {
            return;
        }
        let end = home + buf.len() as u64;
        if self.writes.len() > SCAN_LIMIT {
            // Candidates start within `max_len` before the range; apply in program order.
            let mut candidates = std::mem::take(&mut self.candidates);
            candidates.clear();
            candidates.extend(
                self.by_start
                    .range((home.saturating_sub(self.max_len), 0)..(end, 0))
                    .map(|&(_, i)| i),
            );
            candidates.sort_unstable();
            for &i in &candidates {
                self.apply(&self.writes[i as usize], home, end, buf);
            }
            self.candidates = candidates;
            return;
        }
        for w in &self.writes {
            self.apply(w, home, end, buf);
        }
    }

    /// Copies the part of `w` inside `[home, end)` into `buf`.
    fn apply(&self, w: &Write, home: u64, end: u64, buf: &mut [u8]) {
        let (s, e) = (w.home.max(home), (w.home + w.len).min(end));
        if s < e {
            let src = w.at + (s - w.home) as usize;
            buf[(s - home) as usize..(e - home) as usize]
                .copy_from_slice(&self.bytes[src..src + (e - s) as usize]);
        }
    }

    /// Every write `(home, len, offset in bytes())`, in program order.
    #[cfg(test)]
    pub(crate) fn writes_in_order(&self) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
        self.writes.iter().map(|w| (w.home, w.len, w.at))
    }

    /// Every written range, in program order (for locking; emptied writes left out).
    pub(crate) fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.writes
            .iter()
            .filter(|w| w.len > 0)
            .map(|w| (w.home, w.len))
    }

    /// The bytes of every write, in program order (spans index into them).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The final bytes of the transaction as non-overlapping spans sorted by address,
    /// into `out` (cleared first); later writes win. Allocates nothing once `scratch`
    /// and `out` have grown to the transaction sizes seen before.
    pub(crate) fn resolve_into(&self, scratch: &mut ResolveScratch, out: &mut Vec<Span>) {
        out.clear();
        let writes = &self.writes;
        let order = &mut scratch.order;
        order.clear();
        order.extend((0..writes.len() as u32).filter(|&i| writes[i as usize].len > 0));
        order.sort_unstable_by_key(|&i| (writes[i as usize].home, i));
        let end = |i: u32| writes[i as usize].home + writes[i as usize].len;
        if order
            .windows(2)
            .all(|w| end(w[0]) <= writes[w[1] as usize].home)
        {
            // No two writes overlap (the common case): each is a span.
            out.extend(order.iter().map(|&i| {
                let w = writes[i as usize];
                Span {
                    home: w.home,
                    len: w.len,
                    at: w.at,
                }
            }));
            return;
        }
        // Sweep the boundaries of all writes; between two neighbouring boundaries the
        // bytes are the latest covering write's (the top of a heap keyed by program
        // order, from which writes that ended are dropped when they surface).
        let bounds = &mut scratch.bounds;
        bounds.clear();
        for &i in order.iter() {
            bounds.push(writes[i as usize].home);
            bounds.push(end(i));
        }
        bounds.sort_unstable();
        bounds.dedup();
        let active = &mut scratch.active;
        active.clear();
        let mut next = 0;
        let mut last: Option<u32> = None;
        for pair in bounds.windows(2) {
            let (b, c) = (pair[0], pair[1]);
            while next < order.len() && writes[order[next] as usize].home == b {
                active.push(order[next]);
                next += 1;
            }
            while active.peek().is_some_and(|&i| end(i) <= b) {
                active.pop();
            }
            let Some(&i) = active.peek() else {
                last = None;
                continue;
            };
            let w = writes[i as usize];
            match out.last_mut() {
                Some(prev) if last == Some(i) && prev.home + prev.len == b => prev.len += c - b,
                _ => out.push(Span {
                    home: b,
                    len: c - b,
                    at: w.at + (b - w.home) as usize,
                }),
            }
            last = Some(i);
        }
    }
}

/// A resolved, non-overlapping span of the write set: `len` bytes for `home`, at offset
/// `at` of [`WriteSet::bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub home: u64,
    pub len: u64,
    pub at: usize,
}

/// Buffers of [`WriteSet::resolve_into`], reused from one commit to the next.
#[derive(Debug, Default)]
pub(crate) struct ResolveScratch {
    order: Vec<u32>,
    bounds: Vec<u64>,
    active: BinaryHeap<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexed_overlay_matches_a_byte_model() {
        // Enough writes to use the index; overlapping, of mixed lengths.
        let mut ws = WriteSet::default();
        let mut model = vec![0u8; 4096];
        let mut x = 12345u64;
        for i in 0..500u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let home = (x >> 33) % 4000;
            let len = 1 + (x >> 20) % if i % 50 == 0 { 90 } else { 12 };
            let fill = (i % 251) as u8 + 1;
            ws.push(home, &vec![fill; len as usize]);
            model[home as usize..(home + len) as usize].fill(fill);
        }
        for start in (0..4000u64).step_by(37) {
            let mut buf = vec![0u8; 61];
            ws.overlay(start, &mut buf);
            assert_eq!(
                buf,
                model[start as usize..start as usize + 61],
                "at {start}"
            );
        }
    }

    fn resolve(ws: &WriteSet) -> Vec<Span> {
        let mut out = Vec::new();
        ws.resolve_into(&mut ResolveScratch::default(), &mut out);
        for pair in out.windows(2) {
            assert!(pair[0].home + pair[0].len <= pair[1].home, "{pair:?}");
        }
        assert!(out.iter().all(|s| s.len > 0));
        out
    }

    fn image(ws: &WriteSet, spans: &[Span], len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        for s in spans {
            v[s.home as usize..(s.home + s.len) as usize]
                .copy_from_slice(&ws.bytes()[s.at..s.at + s.len as usize]);
        }
        v
    }

    #[test]
    fn resolve_matches_a_byte_model_for_random_overlaps() {
        let mut x = 99u64;
        for round in 0..200u64 {
            let mut ws = WriteSet::default();
            let mut model = vec![0u8; 300];
            for i in 0..(1 + round % 40) {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let home = (x >> 33) % 250;
                let len = (x >> 20) % 50;
                let fill = (i % 250) as u8 + 1;
                ws.push(home, &vec![fill; len as usize]);
                model[home as usize..(home + len) as usize].fill(fill);
            }
            let spans = resolve(&ws);
            assert_eq!(image(&ws, &spans, 300), model, "round {round}");
            // Written bytes are exactly the spans' bytes.
            let covered: u64 = spans.iter().map(|s| s.len).sum();
            assert_eq!(covered, model.iter().filter(|&&b| b != 0).count() as u64);
        }
    }

    #[test]
    fn rewriting_a_node_again_and_again_keeps_few_writes_and_the_right_bytes() {
        // A leaf rewritten field by field and whole, as deletes from a tree do, beside
        // scattered writes elsewhere; the set must read back the model and resolve to
        // it, and keep about one write per node, not one per change.
        let mut ws = WriteSet::default();
        let mut model = vec![0u8; 8192];
        let mut x = 7u64;
        for i in 0..3000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let fill = (i % 251) as u8 + 1;
            let (home, len) = match i % 4 {
                // The whole node.
                0 => (1024, 512),
                // A field inside it.
                1 => (1024 + (x >> 33) % 500, 1 + (x >> 20) % 12),
                // A tail from some slot to the end: covers or is inside the last.
                2 => {
                    let start = 1024 + (x >> 33) % 512;
                    (start, 1536 - start)
                }
                // Elsewhere, partly overlapping the node's edges now and then.
                _ => ((x >> 33) % 8000, 1 + (x >> 20) % 64),
            };
            ws.push(home, &vec![fill; len as usize]);
            model[home as usize..(home + len) as usize].fill(fill);
            if i % 97 == 0 {
                let mut buf = vec![0u8; 700];
                ws.overlay(1000, &mut buf);
                assert_eq!(buf, model[1000..1700], "after write {i}");
            }
        }
        let mut buf = vec![0u8; 8192];
        ws.overlay(0, &mut buf);
        assert_eq!(buf, model);
        let spans = resolve(&ws);
        let mut image_of = vec![0u8; 8192];
        for s in &spans {
            image_of[s.home as usize..(s.home + s.len) as usize]
                .copy_from_slice(&ws.bytes()[s.at..s.at + s.len as usize]);
        }
        assert_eq!(image_of, model);
        // Writes inside the node: the whole-node writes empty the ones before them.
        let in_node = ws
            .ranges()
            .filter(|&(h, l)| h >= 1024 && h + l <= 1536)
            .count();
        assert!(in_node <= 4, "{in_node} live writes inside one node");
    }

    #[test]
    fn resolve_matches_overlay_and_never_overlaps() {
        let mut ws = WriteSet::default();
        ws.push(10, &[1; 20]); // 10..30
        ws.push(15, &[2; 5]); // splits it
        ws.push(25, &[3; 10]); // trims the tail, extends
        ws.push(0, &[4; 12]); // trims the head
        ws.push(40, &[5; 4]);
        let spans = resolve(&ws);
        let mut expected = vec![0u8; 50];
        ws.overlay(0, &mut expected);
        assert_eq!(image(&ws, &spans, 50), expected);
        assert_eq!(&expected[..12], &[4; 12]);
        assert_eq!(&expected[12..15], &[1; 3]);
        assert_eq!(&expected[15..20], &[2; 5]);
        assert_eq!(&expected[20..25], &[1; 5]);
        assert_eq!(&expected[25..35], &[3; 10]);
    }
}
