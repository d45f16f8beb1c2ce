//! Words and where their newest copies are: the DRAM mapping table of the out-of-place
//! engines (`oop`: a word's update slot and count; `hoop`: its newest copy in a log),
//! and the split of a transaction's byte spans into whole words.

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHashMap;

use crate::media::{CACHE_LINE, Media};
use crate::stm::Span;

/// Bytes of a word.
pub(crate) const WORD: u64 = 8;
const LINE: u64 = CACHE_LINE as u64;
const SHARDS: usize = 64;

/// Where a mapped word's copies are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WordMap {
    /// oop: offset of the word's slot; hoop: offset of its newest value in a log.
    pub slot: u64,
    /// oop: updates since the word got its slot (odd: the slot holds the current copy).
    pub count: u32,
}

/// One shard of the mapping: home line → its 8 words.
type Shard = FxHashMap<u64, [Option<WordMap>; 8]>;

/// The DRAM mapping table of the out-of-place engines, by home line (one lookup per
/// line read).
#[derive(Debug)]
pub(crate) struct WordTable {
    shards: Box<[RwLock<Shard>]>,
    /// Words mapped (reads skip the table while it is 0).
    words: AtomicU64,
}

impl WordTable {
    pub(crate) fn new() -> WordTable {
        WordTable {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            words: AtomicU64::new(0),
        }
    }

    fn shard(&self, line: u64) -> &RwLock<Shard> {
        &self.shards[(line / LINE) as usize % SHARDS]
    }

    pub(crate) fn get(&self, word: u64) -> Option<WordMap> {
        if self.words.load(Ordering::Acquire) == 0 {
            return None;
        }
        let line = word & !(LINE - 1);
        let shard = self.shard(line).read().unwrap_or_else(|p| p.into_inner());
        shard
            .get(&line)
            .and_then(|w| w[((word - line) / WORD) as usize])
    }

    pub(crate) fn set(&self, word: u64, map: Option<WordMap>) {
        let line = word & !(LINE - 1);
        let i = ((word - line) / WORD) as usize;
        let mut shard = self.shard(line).write().unwrap_or_else(|p| p.into_inner());
        let words = shard.entry(line).or_default();
        match (words[i].is_some(), map.is_some()) {
            (false, true) => {
                self.words.fetch_add(1, Ordering::AcqRel);
            }
            (true, false) => {
                self.words.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {}
        }
        words[i] = map;
        if words.iter().all(Option::is_none) {
            shard.remove(&line);
        }
    }

    /// Appends the mapped words of `[home, home + len)` to `out`.
    pub(crate) fn mapped_in(&self, home: u64, len: u64, out: &mut Vec<(u64, WordMap)>) {
        if self.words.load(Ordering::Acquire) == 0 {
            return;
        }
        let end = home + len;
        let mut line = home & !(LINE - 1);
        while line < end {
            let shard = self.shard(line).read().unwrap_or_else(|p| p.into_inner());
            if let Some(words) = shard.get(&line) {
                for (i, m) in words.iter().enumerate() {
                    let w = line + i as u64 * WORD;
                    if let Some(m) = m.filter(|_| w >= home && w + WORD <= end) {
                        out.push((w, m));
                    }
                }
            }
            line += LINE;
        }
    }

    /// Words mapped now.
    pub(crate) fn len(&self) -> u64 {
        self.words.load(Ordering::Relaxed)
    }

    /// Every mapped word (for a collection that moves them all).
    pub(crate) fn all(&self, out: &mut Vec<(u64, WordMap)>) {
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|p| p.into_inner());
            for (&line, words) in shard.iter() {
                for (i, m) in words.iter().enumerate() {
                    if let Some(m) = m {
                        out.push((line + i as u64 * WORD, *m));
                    }
                }
            }
        }
    }

    /// Overlays on `buf` (the home bytes at `home`) each mapped word whose current
    /// copy is elsewhere: at `value_at(map)`, when it says so.
    pub(crate) fn overlay(
        &self,
        media: &Media,
        home: u64,
        buf: &mut [u8],
        value_at: impl Fn(WordMap) -> Option<u64>,
    ) {
        if self.words.load(Ordering::Acquire) == 0 {
            return;
        }
        let end = home + buf.len() as u64;
        let mut line = home & !(LINE - 1);
        while line < end {
            let shard = self.shard(line).read().unwrap_or_else(|p| p.into_inner());
            if let Some(words) = shard.get(&line) {
                for (i, m) in words.iter().enumerate() {
                    let Some(at) = m.and_then(&value_at) else {
                        continue;
                    };
                    let w = line + i as u64 * WORD;
                    let (lo, hi) = (w.max(home), (w + WORD).min(end));
                    if lo < hi {
                        let value = media.read_u64(at as usize).to_le_bytes();
                        buf[(lo - home) as usize..(hi - home) as usize]
                            .copy_from_slice(&value[(lo - w) as usize..(hi - w) as usize]);
                    }
                }
            }
            line += LINE;
        }
    }
}

/// Turns resolved byte spans into whole words `(word, value)`, in order; a word's
/// bytes the spans leave out come from `current`.
pub(crate) fn words_of(
    spans: &[Span],
    bytes: &[u8],
    out: &mut Vec<(u64, u64)>,
    current: impl Fn(u64) -> u64,
) {
    out.clear();
    for sp in spans {
        let data = &bytes[sp.at..sp.at + sp.len as usize];
        let mut at = sp.home;
        let end = sp.home + sp.len;
        while at < end {
            let word = at & !(WORD - 1);
            let lo = (at - word) as usize;
            let n = ((word + WORD).min(end) - at) as usize;
            let mut value = match out.last() {
                Some(&(w, v)) if w == word => {
                    out.pop();
                    v
                }
                _ if lo == 0 && n == WORD as usize => 0,
                _ => current(word),
            }
            .to_le_bytes();
            let from = (at - sp.home) as usize;
            value[lo..lo + n].copy_from_slice(&data[from..from + n]);
            out.push((word, u64::from_le_bytes(value)));
            at += n as u64;
        }
    }
}
