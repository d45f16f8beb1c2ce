//! Model checks of the TL2 protocol with loom: every interleaving (up to a preemption
//! bound) of a few transactions on a model engine, whose committed bytes are atomic words
//! accessed relaxed, as the media's are. Loom then checks the protocol's fences and
//! orderings too: a read must see a commit's bytes whole or not at all, and two
//! read-modify-write transactions must not lose an update.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p logheap --lib --release stm::loom_tests`
//! (`.ci/run` does, in a target directory of its own).

use std::cell::Cell;
use std::sync::Arc;
use std::thread::LocalKey;

use loom::sync::atomic::AtomicU64;

use super::atomic::Ordering;
use super::no_heap::NoHeap;
use super::{CommitSet, Domain, Engine, Persisted, SpareState, Stm};
use crate::error::{Error, Result};
use crate::media::{Media, MediaConfig, SimConfig};

/// Two words on different lock stripes (the model's lock table has 16 locks).
const X: u64 = 64;
const Y: u64 = 128;
const WORDS: usize = 32;

/// A model engine: committed bytes as atomic words.
struct Model {
    domain: Arc<Domain>,
    media: Arc<Media>,
    heap: NoHeap,
    words: Vec<AtomicU64>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Model")
    }
}

std::thread_local! {
    static SPARE: SpareState<()> = const { Cell::new(None) };
}

impl Engine for Model {
    type Scratch = ();
    type Heap = NoHeap;
    const FRESH_BLOCKS_READ_ZERO: bool = true;

    fn spare() -> &'static LocalKey<SpareState<()>> {
        &SPARE
    }
    fn shared(&self) -> &Arc<Domain> {
        &self.domain
    }
    fn media(&self) -> &Arc<Media> {
        &self.media
    }
    fn heap(&self) -> &NoHeap {
        &self.heap
    }
    fn begin(&self, _: &mut ()) {}
    fn end(_: &mut ()) {}
    fn check_range(&self, home: u64, len: u64) -> Result<()> {
        // Whole aligned words only, in the model's range.
        assert!(home.is_multiple_of(8) && len == 8 && (home / 8) < WORDS as u64);
        Ok(())
    }
    fn read_committed(&self, _: &(), home: u64, buf: &mut [u8]) -> bool {
        let word = self.words[home as usize / 8].load(Ordering::Relaxed);
        buf.copy_from_slice(&word.to_le_bytes());
        true
    }
    fn before_commit(&self, _: &mut ()) {}
    fn persist(&self, set: &CommitSet<'_>, _: &mut ()) -> Result<Persisted> {
        let data = set.writes.bytes();
        for (home, len, at) in set.writes.writes_in_order() {
            assert_eq!(len, 8);
            let word = u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
            self.words[home as usize / 8].store(word, Ordering::Relaxed);
        }
        Ok(Persisted::Durable { payload: 0 })
    }
    fn publish(&self, _: &CommitSet<'_>, _: &mut ()) {}
    fn make_room(&self, _: &mut (), _since: std::time::Instant) -> bool {
        false
    }
}

fn model() -> Arc<Stm<Model>> {
    let media = Media::sim(4096, &MediaConfig::default(), SimConfig::default()).unwrap();
    Arc::new(Stm::new(Arc::new(Model {
        domain: Arc::new(Domain::new(4096, 0)),
        media: Arc::new(media),
        heap: NoHeap,
        words: (0..WORDS).map(|_| AtomicU64::new(0)).collect(),
    })))
}

/// Runs `body` as a transaction until it commits (yielding to the other threads after
/// each conflict), and returns what the committed attempt returned.
fn run<R>(
    stm: &Stm<Model>,
    read_only: bool,
    mut body: impl FnMut(&Stm<Model>, &mut super::TxState<()>) -> Result<R>,
) -> R {
    let mut tx = stm.begin(read_only);
    let out = loop {
        match body(stm, &mut tx).and_then(|r| stm.commit(&mut tx).map(|()| r)) {
            Ok(r) => break r,
            Err(Error::Conflict) => {
                stm.abort(&mut tx);
                stm.restart(&mut tx);
                loom::thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    };
    Stm::<Model>::finish(tx);
    out
}

fn read(stm: &Stm<Model>, tx: &mut super::TxState<()>, home: u64) -> Result<u64> {
    let mut b = [0u8; 8];
    stm.read(tx, home, &mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn write(stm: &Stm<Model>, tx: &mut super::TxState<()>, home: u64, v: u64) -> Result<()> {
    stm.write(tx, home, &v.to_le_bytes())
}

fn checked(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

#[test]
fn a_reader_sees_a_commit_whole_or_not_at_all() {
    for read_only in [true, false] {
        checked(move || {
            let stm = model();
            let writer = {
                let stm = stm.clone();
                loom::thread::spawn(move || {
                    run(&stm, false, |stm, tx| {
                        write(stm, tx, X, 1)?;
                        write(stm, tx, Y, 1)
                    })
                })
            };
            let (x, y) = run(&stm, read_only, |stm, tx| {
                Ok((read(stm, tx, X)?, read(stm, tx, Y)?))
            });
            assert_eq!(x, y, "read-only {read_only}: a torn snapshot");
            writer.join().unwrap();
        });
    }
}

#[test]
fn two_increments_are_never_lost() {
    checked(|| {
        let stm = model();
        let increment = |stm: &Stm<Model>| {
            run(stm, false, |stm, tx| {
                let x = read(stm, tx, X)?;
                write(stm, tx, X, x + 1)
            })
        };
        let other = {
            let stm = stm.clone();
            loom::thread::spawn(move || increment(&stm))
        };
        increment(&stm);
        other.join().unwrap();
        let x = run(&stm, true, |stm, tx| read(stm, tx, X));
        assert_eq!(x, 2, "an increment was lost");
    });
}

/// The mapping partitions' sequence lock (`engine::log::mapping::seqlock`, the code the
/// sorted arrays run): a read that validates saw one writer's words whole, never a mix
/// of two states; and a writer that took the lock cannot be joined by another.
#[test]
fn a_validated_seqlock_read_sees_the_words_whole() {
    use crate::engine::log::mapping::seqlock::SeqLock;
    checked(|| {
        let lock = Arc::new(SeqLock::new());
        let words = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let writer = {
            let (lock, words) = (lock.clone(), words.clone());
            loom::thread::spawn(move || {
                for v in 1..=2 {
                    lock.write_lock();
                    words[0].store(v, Ordering::Relaxed);
                    words[1].store(v, Ordering::Relaxed);
                    lock.write_unlock();
                }
            })
        };
        for _ in 0..2 {
            let Some(begun) = lock.read_begin() else {
                loom::thread::yield_now();
                continue;
            };
            let (a, b) = (
                words[0].load(Ordering::Relaxed),
                words[1].load(Ordering::Relaxed),
            );
            if lock.read_valid(begun) {
                assert_eq!(a, b, "a validated read saw a torn state");
            }
        }
        writer.join().unwrap();
        // With the writer gone, a read always validates and sees its last state.
        let begun = lock.read_begin().expect("no writer is in");
        assert_eq!(words[0].load(Ordering::Relaxed), 2);
        assert!(lock.read_valid(begun));
    });
}

#[test]
fn seqlock_writers_exclude_each_other() {
    use crate::engine::log::mapping::seqlock::SeqLock;
    checked(|| {
        let lock = Arc::new(SeqLock::new());
        let word = Arc::new(AtomicU64::new(0));
        let add = |lock: &SeqLock, word: &AtomicU64| {
            lock.write_lock();
            // A plain read-modify-write: only mutual exclusion keeps both.
            let v = word.load(Ordering::Relaxed);
            word.store(v + 1, Ordering::Relaxed);
            lock.write_unlock();
        };
        let other = {
            let (lock, word) = (lock.clone(), word.clone());
            loom::thread::spawn(move || add(&lock, &word))
        };
        add(&lock, &word);
        other.join().unwrap();
        assert_eq!(word.load(Ordering::Relaxed), 2);
    });
}
