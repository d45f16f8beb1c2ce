//! A transaction's buffered writes.
//!
//! Writes are kept in program order; reads overlay them so a transaction sees its own
//! writes. At commit, [`WriteSet::resolve`] turns them into non-overlapping pieces in which
//! later bytes win, so no byte reaches the log twice.

use std::collections::BTreeMap;

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
    by_start: BTreeMap<u64, Vec<u32>>,
    max_len: u64,
}

/// Below this many writes, a read scans them all (cheaper than the index).
const SCAN_LIMIT: usize = 16;

/// A resolved, non-overlapping piece of the write set: `bytes` go to `home`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece<'a> {
    pub home: u64,
    pub bytes: &'a [u8],
}

impl WriteSet {
    /// Whether nothing was written.
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Buffers a write.
    pub(crate) fn push(&mut self, home: u64, bytes: &[u8]) {
        self.writes.push(Write {
            home,
            len: bytes.len() as u64,
            at: self.bytes.len(),
        });
        self.bytes.extend_from_slice(bytes);
        let n = self.writes.len();
        if n == SCAN_LIMIT + 1 {
            for i in 0..n {
                self.index(i);
            }
        } else if n > SCAN_LIMIT + 1 {
            self.index(n - 1);
        }
    }

    fn index(&mut self, i: usize) {
        let w = self.writes[i];
        self.by_start.entry(w.home).or_default().push(i as u32);
        self.max_len = self.max_len.max(w.len);
    }

    /// Forgets everything (for a retry).
    pub(crate) fn clear(&mut self) {
        self.writes.clear();
        self.bytes.clear();
        self.by_start.clear();
        self.max_len = 0;
    }

    /// Copies this transaction's writes over `buf`, which holds `[home, home + len)`.
    pub(crate) fn overlay(&self, home: u64, buf: &mut [u8]) {
        let end = home + buf.len() as u64;
        if self.writes.len() > SCAN_LIMIT {
            // Candidates start within `max_len` before the range; apply in program order.
            let mut candidates: Vec<u32> = self
                .by_start
                .range(home.saturating_sub(self.max_len)..end)
                .flat_map(|(_, v)| v.iter().copied())
                .collect();
            candidates.sort_unstable();
            for i in candidates {
                self.apply(&self.writes[i as usize], home, end, buf);
            }
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

    /// Every written range, in program order (for locking).
    pub(crate) fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.writes.iter().map(|w| (w.home, w.len))
    }

    /// The final bytes of the transaction as non-overlapping pieces sorted by address;
    /// later writes win.
    pub(crate) fn resolve(&self) -> Vec<Piece<'_>> {
        // start -> (end, offset of `start` in bytes)
        let mut map: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
        for w in &self.writes {
            if w.len == 0 {
                continue;
            }
            let (start, end) = (w.home, w.home + w.len);
            // Trim or split the piece that starts before `start` and reaches into it.
            if let Some((&s, &(e, at))) = map.range(..start).next_back()
                && e > start
            {
                map.insert(s, (start, at));
                if e > end {
                    map.insert(end, (e, at + (end - s) as usize));
                }
            }
            // Remove or trim pieces starting inside [start, end).
            let inside: Vec<u64> = map.range(start..end).map(|(&s, _)| s).collect();
            for s in inside {
                if let Some((e, at)) = map.remove(&s)
                    && e > end
                {
                    map.insert(end, (e, at + (end - s) as usize));
                }
            }
            map.insert(start, (end, w.at));
        }
        map.into_iter()
            .map(|(s, (e, at))| Piece {
                home: s,
                bytes: &self.bytes[at..at + (e - s) as usize],
            })
            .collect()
    }
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

    fn image(pieces: &[Piece<'_>], len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        for p in pieces {
            v[p.home as usize..p.home as usize + p.bytes.len()].copy_from_slice(p.bytes);
        }
        v
    }

    #[test]
    fn resolve_matches_overlay_and_never_overlaps() {
        let mut ws = WriteSet::default();
        ws.push(10, &[1; 20]); // 10..30
        ws.push(15, &[2; 5]); // splits it
        ws.push(25, &[3; 10]); // trims the tail, extends
        ws.push(0, &[4; 12]); // trims the head
        ws.push(40, &[5; 4]);
        let pieces = ws.resolve();
        for pair in pieces.windows(2) {
            assert!(pair[0].home + pair[0].bytes.len() as u64 <= pair[1].home);
        }
        let mut expected = vec![0u8; 50];
        ws.overlay(0, &mut expected);
        assert_eq!(image(&pieces, 50), expected);
        assert_eq!(&expected[..12], &[4; 12]);
        assert_eq!(&expected[12..15], &[1; 3]);
        assert_eq!(&expected[15..20], &[2; 5]);
        assert_eq!(&expected[20..25], &[1; 5]);
        assert_eq!(&expected[25..35], &[3; 10]);
    }
}
