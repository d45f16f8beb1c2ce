//! The `hoop` engine: HOOP (Cai et al., ISCA 2020; 003's strongest baseline) in
//! software. It is the redo engine (`redo`) with the home stores taken off the commit
//! path: a transaction's words go out of place, into its thread's log (HOOP's OOP
//! region), in one record made durable by one fence; a DRAM mapping table sends reads
//! of those words to their newest copy in the logs; and a periodic garbage collection
//! writes the newest copy of every mapped word back home, after which the logs are
//! reused. Repeated updates of a word between two collections reach home once.
//!
//! **What the software version keeps and what it cannot.** HOOP packs the words a
//! transaction updates into 64-byte memory slices in the memory controller's OOP buffer
//! and writes them to a log-structured OOP region; its mapping table and collection are
//! in the controller too. Here the "slices" are the record's data entries (a run of
//! consecutive words per entry: a 16-byte entry header, then the words), the OOP region
//! is the per-thread logs of the redo engine, and the collection is run by the thread
//! whose log is full (outside its transaction's locks: it takes the stripe locks of the
//! words it moves, so readers that went through the old mapping revalidate). Recovery
//! is the redo engine's: every record above the collected version is replayed home in
//! version order, so after an open every word is home and the table is empty.

use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::LocalKey;

use super::Start;
use super::flush_lines_once;
use super::record::{ENTRY_HEADER, RecordBuilder};
use super::redo::{HomePath, RedoLogging, RedoScratch};
use super::stats::HoopStats;
use super::words::{WORD, WordMap, WordTable, words_of};
use crate::engine::{EngineConfig, EngineFigures, EngineLifecycle, EngineStats};
use crate::error::Result;
use crate::file::EngineKind;
use crate::media::Media;
use crate::stm::SpareState;
use crate::stm::{Committing, Domain, StripeLocks, stripes};
use crate::sync::lock;

/// The `hoop` engine: the redo engine's logs and recovery, with [`Hoop`] as its home
/// path.
pub(crate) type HoopEngine = RedoLogging<Hoop>;

thread_local! {
    static SPARE_STATE: SpareState<RedoScratch> = const { Cell::new(None) };
}

impl HomePath for Hoop {
    const KIND: EngineKind = EngineKind::Hoop;
    const DEFERS_HOME: bool = true;
    type Collection = Collection;

    fn spare() -> &'static LocalKey<SpareState<RedoScratch>> {
        &SPARE_STATE
    }

    #[inline]
    fn overlay(&self, media: &Media, home: u64, buf: &mut [u8]) {
        self.mapping.overlay(media, home, buf, |m| Some(m.slot));
    }

    fn record(&self, media: &Media, bytes: &[u8], s: &mut RedoScratch) -> u64 {
        // Whole words, so the table can point at each one's newest copy.
        words_of(&s.spans, bytes, &mut s.words, |w| {
            self.current_word(media, w)
        });
        Hoop::record_words(&mut s.record, &s.words, &mut s.locs, &mut s.run);
        s.spans.iter().map(|sp| sp.len).sum()
    }

    fn publish(&self, _media: &Media, _bytes: &[u8], frees: &[(u64, u64)], s: &mut RedoScratch) {
        Hoop::publish(self, s.record_at, &s.locs, frees, &mut s.mapped);
    }

    fn collect_begin(
        &self,
        shared: &Domain,
        media: &Media,
        seal: &dyn Fn(u64, u64),
    ) -> Option<Collection> {
        Some(Hoop::collect_begin(self, shared, media, seal))
    }

    fn collect_end(&self, shared: &Domain, collection: Option<Collection>) {
        if let Some(c) = collection {
            Hoop::collect_end(self, shared, c);
        }
    }
}

impl HoopEngine {
    fn start(how: Start<'_>, config: &crate::Config, _options: ()) -> Result<Self> {
        Self::start_with(how, config, false, Hoop::new())
    }
}

impl EngineLifecycle for HoopEngine {
    const KIND: EngineKind = EngineKind::Hoop;
    type Options = ();

    fn options(config: &EngineConfig) -> Option<()> {
        matches!(config, EngineConfig::Hoop).then_some(())
    }

    in_place_lifecycle_common!();

    fn figures(&self) -> EngineFigures {
        let redo = self.redo_stats();
        self.core.figures(EngineStats::Hoop(HoopStats {
            logs: redo.logs,
            truncations: redo.truncations,
            update_slots: self.path.mapping.len(),
            collections: self.path.collections.load(Ordering::Relaxed),
            words_collected: self.path.migrated.load(Ordering::Relaxed),
        }))
    }

    fn close(self) -> Result<()> {
        self.close_retired()
    }
}

/// The out-of-place state of a `hoop` pool (see the module docs).
#[derive(Debug)]
pub(crate) struct Hoop {
    /// Home word → offset of its newest copy in a log.
    pub mapping: WordTable,
    /// Collections run.
    pub collections: AtomicU64,
    /// Words written home by collections.
    pub migrated: AtomicU64,
    /// The buffers of the last collection, for the next (a collection then allocates
    /// nothing once they have grown to the table's size).
    buffers: Mutex<CollectBuffers>,
}

/// What a collection works in (see [`Hoop::buffers`]).
#[derive(Debug, Default)]
struct CollectBuffers {
    words: Vec<(u64, WordMap)>,
    indices: Vec<usize>,
    lines: Vec<u64>,
    held: Vec<(usize, u64)>,
}

/// The locks and version of a collection in progress (see [`Hoop::collect_begin`]).
pub(crate) struct Collection {
    locks: StripeLocks,
    committing: Committing,
    words: Vec<(u64, WordMap)>,
    indices: Vec<usize>,
    lines: Vec<u64>,
}

impl Hoop {
    pub(crate) fn new() -> Hoop {
        Hoop {
            mapping: WordTable::new(),
            collections: AtomicU64::new(0),
            migrated: AtomicU64::new(0),
            buffers: Mutex::default(),
        }
    }

    /// The committed value of the word at `word`: its newest copy.
    pub(crate) fn current_word(&self, media: &Media, word: u64) -> u64 {
        let at = self.mapping.get(word).map_or(word, |m| m.slot);
        media.read_u64(at as usize)
    }

    /// Adds `words` (sorted, whole words) to the record as data entries, one per run of
    /// consecutive words, and records in `locs` each word's offset in the record.
    pub(crate) fn record_words(
        b: &mut RecordBuilder,
        words: &[(u64, u64)],
        locs: &mut Vec<(u64, u64)>,
        run: &mut Vec<u8>,
    ) {
        locs.clear();
        let mut i = 0;
        while i < words.len() {
            let start = words[i].0;
            let mut j = i;
            run.clear();
            while j < words.len() && words[j].0 == start + (j - i) as u64 * WORD {
                run.extend_from_slice(&words[j].1.to_le_bytes());
                j += 1;
            }
            let data_at = (b.len() + ENTRY_HEADER) as u64;
            for (k, &(w, _)) in words[i..j].iter().enumerate() {
                locs.push((w, data_at + k as u64 * WORD));
            }
            b.data(start, run);
            i = j;
        }
    }

    /// Points the mapping at a committed record's words (`locs` from
    /// [`record_words`](Self::record_words), the record at `record_at`), and forgets
    /// the words of the blocks it freed.
    pub(crate) fn publish(
        &self,
        record_at: u64,
        locs: &[(u64, u64)],
        frees: &[(u64, u64)],
        scratch: &mut Vec<(u64, WordMap)>,
    ) {
        for &(w, off) in locs {
            self.mapping.set(
                w,
                Some(WordMap {
                    slot: record_at + off,
                    count: 1,
                }),
            );
        }
        for &(home, size) in frees {
            scratch.clear();
            self.mapping.mapped_in(home, size, scratch);
            for &(w, _) in scratch.iter() {
                self.mapping.set(w, None);
            }
        }
    }

    /// Starts a collection: takes the stripe locks of every word mapped now (waiting
    /// for committing transactions to let them go) and stores each one's newest copy
    /// home, each home line flushed once. The caller fences, retires the logs up to a
    /// version it computed *before* this call, then calls
    /// [`collect_end`](Self::collect_end). Must be called with no stripe lock held.
    ///
    /// A word mapped after the table was read here was published by a transaction
    /// still committing when the caller's version was computed: its record is above
    /// that version, stays in the logs, and the word stays mapped.
    pub(crate) fn collect_begin(
        &self,
        shared: &Domain,
        media: &Media,
        seal: &dyn Fn(u64, u64),
    ) -> Collection {
        let CollectBuffers {
            mut words,
            mut indices,
            mut lines,
            mut held,
        } = std::mem::take(&mut *lock(&self.buffers));
        words.clear();
        // One allocation at most, the first time the table is this large.
        words.reserve(self.mapping.len() as usize);
        self.mapping.all(&mut words);
        indices.clear();
        indices.reserve(2 * words.len());
        indices.extend(
            words
                .iter()
                .flat_map(|&(w, _)| stripes(w, WORD).map(|s| shared.locks.index(s))),
        );
        indices.sort_unstable();
        indices.dedup();
        held.clear();
        held.reserve(indices.len());
        let locks = StripeLocks::acquire_waiting(&shared.locks, &indices, shared.new_owner(), held);
        // Under the locks these words' copies cannot move: read where they are now.
        let held = |w: u64| {
            stripes(w, WORD).all(|s| indices.binary_search(&shared.locks.index(s)).is_ok())
        };
        words.clear();
        self.mapping.all(&mut words);
        words.retain(|&(w, _)| held(w));
        let committing = shared.tick_committing();
        lines.clear();
        lines.reserve(words.len());
        for &(w, m) in &words {
            let value = media.read_u64(m.slot as usize);
            media.write_u64(w as usize, value);
            seal(w, WORD);
            lines.push(w);
        }
        // Words of one line go back together (HOOP packs them too).
        flush_lines_once(media, &mut lines);
        Collection {
            locks,
            committing,
            words,
            indices,
            lines,
        }
    }

    /// Ends a collection whose stores are durable: drops the moved words from the
    /// table and lets their locks go with a new version (so a reader that went through
    /// the old mapping revalidates).
    pub(crate) fn collect_end(&self, shared: &Domain, c: Collection) {
        for &(w, _) in &c.words {
            self.mapping.set(w, None);
        }
        self.migrated
            .fetch_add(c.words.len() as u64, Ordering::Relaxed);
        self.collections.fetch_add(1, Ordering::Relaxed);
        let held = c.locks.release(&shared.locks, c.committing.version);
        shared.done_committing(c.committing);
        *lock(&self.buffers) = CollectBuffers {
            words: c.words,
            indices: c.indices,
            lines: c.lines,
            held,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_words_share_an_entry_and_each_word_knows_its_offset() {
        let mut b = RecordBuilder::default();
        b.start();
        let mut locs = Vec::new();
        let mut run = Vec::new();
        Hoop::record_words(&mut b, &[(64, 1), (72, 2), (200, 3)], &mut locs, &mut run);
        // Header 32, entry header 16, two words; entry header 16, one word.
        assert_eq!(locs, vec![(64, 48), (72, 56), (200, 80)]);
        assert_eq!(b.len(), 88);
    }
}
