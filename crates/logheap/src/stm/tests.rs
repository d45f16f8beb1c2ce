//! The driver's read validation, step by step, on a model engine whose reads can be
//! interrupted by a commit at a chosen point: each test fails when the validation step
//! it names is skipped (deterministically, not by chance over a long run).

use std::cell::Cell;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::LocalKey;

use super::no_heap::NoHeap;
use super::{CommitSet, Domain, Engine, Persisted, SpareState, Stm};

use crate::error::Result;
use crate::media::{Media, MediaConfig, SimConfig};

/// Where a read is interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before the read's lock-word check (after the reads before it).
    BeforeCheck,
    /// Between the read's lock-word check and its copy.
    BeforeCopy,
}

type Hook = Box<dyn FnOnce() + Send>;

/// A model engine: committed bytes in a DRAM array, and a hook run once inside a read.
struct Model {
    domain: Arc<Domain>,
    media: Arc<Media>,
    heap: NoHeap,
    bytes: Mutex<Vec<u8>>,
    hook: Mutex<Option<(u64, At, Hook)>>,
    /// Run once by a commit after it stored its bytes, its stripes still locked.
    commit_hook: Mutex<Option<Hook>>,
    /// Every committed state of `bytes`, never changed once here (leaked: a test's
    /// few commits): what the model hands out in place, as the log engine hands out
    /// its log.
    versions: Mutex<Vec<&'static [u8]>>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Model")
    }
}

thread_local! {
    static SPARE: SpareState<()> = const { Cell::new(None) };
}

impl Model {
    fn run_hook(&self, home: u64, at: At) {
        let mut hook = self.hook.lock().unwrap();
        if hook.as_ref().is_some_and(|&(h, a, _)| h == home && a == at) {
            let (_, _, f) = hook.take().unwrap();
            drop(hook);
            f();
        }
    }
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
    fn check_range(&self, home: u64, _len: u64) -> Result<()> {
        // The driver checks the range first of all, before the lock words.
        self.run_hook(home, At::BeforeCheck);
        Ok(())
    }
    const KEEPS_COMMITTED_IN_PLACE: bool = true;
    fn committed_in_place<'s>(&'s self, _: &'s (), home: u64, len: u64) -> Option<&'s [u8]> {
        self.run_hook(home, At::BeforeCopy);
        let latest = *self.versions.lock().unwrap().last()?;
        Some(&latest[home as usize..(home + len) as usize])
    }
    fn read_committed(&self, _: &(), home: u64, buf: &mut [u8]) -> bool {
        self.run_hook(home, At::BeforeCopy);
        let bytes = self.bytes.lock().unwrap();
        buf.copy_from_slice(&bytes[home as usize..home as usize + buf.len()]);
        drop(bytes);
        true
    }
    fn before_commit(&self, _: &mut ()) {}
    fn persist(&self, set: &CommitSet<'_>, _: &mut ()) -> Result<Persisted> {
        let mut bytes = self.bytes.lock().unwrap();
        let data = set.writes.bytes();
        for (home, len, at) in set.writes.writes_in_order() {
            bytes[home as usize..(home + len) as usize]
                .copy_from_slice(&data[at..at + len as usize]);
        }
        let version: &'static [u8] = Vec::leak(bytes.clone());
        self.versions.lock().unwrap().push(version);
        drop(bytes);
        if let Some(f) = self.commit_hook.lock().unwrap().take() {
            f();
        }
        Ok(Persisted::Durable { payload: 0 })
    }
    fn publish(&self, _: &CommitSet<'_>, _: &mut ()) {}
    fn make_room(&self, _: &mut (), _since: std::time::Instant) -> bool {
        false
    }
}

/// Two words on different lock stripes, always written together (`x == y`), each the
/// last word of its stripe (so that a read of it and the word after it crosses a
/// stripe boundary).
const X: u64 = 128 + 56;
const Y: u64 = 4096 + 128 + 56;

/// How a test reads a word, one shape for each of the driver's read paths: alone (in
/// one stripe); with the word after it (over two stripes, the word's first); with the
/// stripe before it (over two, the word's last); or with the two stripes before it
/// (over three, the path that keeps the lock words in `stripe_words`); or alone, in
/// place (`read_with` on an engine that keeps its committed bytes in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    InStripe,
    FirstOfTwo,
    SecondOfTwo,
    LastOfThree,
    InPlace,
}

impl Shape {
    const ALL: [Shape; 5] = [
        Shape::InStripe,
        Shape::FirstOfTwo,
        Shape::SecondOfTwo,
        Shape::LastOfThree,
        Shape::InPlace,
    ];

    /// Where the read of the word at `home` starts, its length, and the word's offset
    /// in it.
    fn start(self, home: u64) -> (u64, usize, usize) {
        assert_eq!(home % 64, 56, "the word ends its stripe");
        match self {
            Shape::InStripe | Shape::InPlace => (home, 8, 0),
            Shape::FirstOfTwo => (home, 16, 0),
            Shape::SecondOfTwo => (home - 64, 72, 64),
            Shape::LastOfThree => (home - 128, 136, 128),
        }
    }
}

/// Reads the word at `home` in `tx`, as `shape` says.
fn read_word(
    stm: &Stm<Model>,
    tx: &mut super::TxState<()>,
    home: u64,
    shape: Shape,
) -> Result<u64> {
    let (start, len, at) = shape.start(home);
    if shape == Shape::InPlace {
        return stm.read_with(tx, start, len, |b| {
            u64::from_le_bytes(b.try_into().unwrap())
        });
    }
    let mut buf = [0u8; 136];
    stm.read(tx, start, &mut buf[..len])?;
    Ok(u64::from_le_bytes(buf[at..at + 8].try_into().unwrap()))
}

fn model() -> Arc<Stm<Model>> {
    model_after(0)
}

/// A model whose clock starts after `last_version`.
fn model_after(last_version: u64) -> Arc<Stm<Model>> {
    let media = Media::sim(4096, &MediaConfig::default(), SimConfig::default()).unwrap();
    Arc::new(Stm::new(Arc::new(Model {
        domain: Arc::new(Domain::new(1 << 20, last_version)),
        media: Arc::new(media),
        heap: NoHeap,
        bytes: Mutex::new(vec![0; 8192]),
        hook: Mutex::new(None),
        commit_hook: Mutex::new(None),
        versions: Mutex::new(vec![Vec::leak(vec![0; 8192])]),
    })))
}

/// Sets both words to `value` in one transaction.
fn write_both(stm: &Stm<Model>, value: u64) {
    let mut tx = stm.begin(false);
    stm.write(&mut tx, X, &value.to_le_bytes()).unwrap();
    stm.write(&mut tx, Y, &value.to_le_bytes()).unwrap();
    stm.commit(&mut tx).unwrap();
    Stm::<Model>::finish(tx);
}

/// Reads both words in a transaction (read-only or not) whose read of `home` is
/// interrupted at `at` by a commit of another thread setting both to 1; retries on
/// conflict as the pool does, and returns what the committed attempt read and how many
/// attempts conflicted.
fn read_both_interrupted(read_only: bool, shape: Shape, home: u64, at: At) -> ((u64, u64), u32) {
    let stm = model();
    let (go, wait_go) = mpsc::channel::<()>();
    let (done, wait_done) = mpsc::channel::<()>();
    let writer = {
        let stm = stm.clone();
        std::thread::spawn(move || {
            wait_go.recv().unwrap();
            write_both(&stm, 1);
            done.send(()).unwrap();
        })
    };
    *stm.engine().hook.lock().unwrap() = Some((
        shape.start(home).0,
        at,
        Box::new(move || {
            go.send(()).unwrap();
            wait_done.recv().unwrap();
        }),
    ));
    let mut conflicts = 0;
    let mut tx = stm.begin(read_only);
    let read = loop {
        let attempt = (|| {
            let x = read_word(&stm, &mut tx, X, shape)?;
            let y = read_word(&stm, &mut tx, Y, shape)?;
            stm.commit(&mut tx)?;
            Ok((x, y))
        })();
        match attempt {
            Ok(read) => break read,
            Err(crate::Error::Conflict) => {
                conflicts += 1;
                stm.abort(&mut tx);
                stm.restart(&mut tx);
            }
            Err(e) => panic!("{e}"),
        }
    };
    Stm::<Model>::finish(tx);
    writer.join().unwrap();
    (read, conflicts)
}

#[test]
fn a_commit_during_a_read_is_caught_by_the_check_after_the_copy() {
    for (read_only, shape) in [true, false]
        .into_iter()
        .flat_map(|r| Shape::ALL.map(|s| (r, s)))
    {
        // The read of Y passed its lock-word check and then copies Y = 1: only the
        // re-check of the lock word after the copy sees that X = 0 is stale.
        let (read, conflicts) = read_both_interrupted(read_only, shape, Y, At::BeforeCopy);
        assert_eq!(read, (1, 1), "read-only: {read_only}, {shape:?}");
        assert_eq!(conflicts, 1, "read-only: {read_only}, {shape:?}");
    }
}

#[test]
fn a_commit_between_two_reads_is_caught_by_the_check_before_the_copy() {
    for (read_only, shape) in [true, false]
        .into_iter()
        .flat_map(|r| Shape::ALL.map(|s| (r, s)))
    {
        // X = 0 was read; Y's lock word now has a version past the snapshot: only its
        // check before the copy (and, for a writer, the failed extension) sees it.
        let (read, conflicts) = read_both_interrupted(read_only, shape, Y, At::BeforeCheck);
        assert_eq!(read, (1, 1), "read-only: {read_only}, {shape:?}");
        assert_eq!(conflicts, 1, "read-only: {read_only}, {shape:?}");
    }
}

#[test]
fn a_commit_of_nothing_read_lets_a_writer_extend_its_snapshot() {
    // A writer read X; another transaction then commits Y alone. Y is newer than the
    // snapshot, but X did not change: the snapshot extends and nothing conflicts.
    for shape in Shape::ALL {
        let stm = model();
        let mut tx = stm.begin(false);
        assert_eq!(read_word(&stm, &mut tx, X, shape).unwrap(), 0);
        let other = stm.clone();
        std::thread::spawn(move || {
            let mut t = other.begin(false);
            other.write(&mut t, Y, &7u64.to_le_bytes()).unwrap();
            other.commit(&mut t).unwrap();
            Stm::<Model>::finish(t);
        })
        .join()
        .unwrap();
        assert_eq!(read_word(&stm, &mut tx, Y, shape).unwrap(), 7, "{shape:?}");
        stm.commit(&mut tx).unwrap();
        Stm::<Model>::finish(tx);
    }
}

#[test]
fn a_read_of_a_stripe_a_commit_holds_locked_conflicts() {
    for (read_only, shape) in [true, false]
        .into_iter()
        .flat_map(|r| Shape::ALL.map(|s| (r, s)))
    {
        // Snapshots far above every lock owner id: a held lock word's owner, read as a
        // version, is then within the snapshot, so only the check for a held lock (not
        // the version check) sees that Y's stripe is being committed.
        let stm = model_after(1 << 40);
        let (locked, wait_locked) = mpsc::channel::<()>();
        let (read, wait_read) = mpsc::channel::<()>();
        *stm.engine().commit_hook.lock().unwrap() = Some(Box::new(move || {
            locked.send(()).unwrap();
            wait_read.recv().unwrap();
        }));
        let writer = {
            let stm = stm.clone();
            std::thread::spawn(move || write_both(&stm, 1))
        };
        // The commit has stored X = Y = 1 and holds their stripes.
        wait_locked.recv().unwrap();
        let mut tx = stm.begin(read_only);
        let y = read_word(&stm, &mut tx, Y, shape);
        assert!(
            matches!(y, Err(crate::Error::Conflict)),
            "read-only: {read_only}, {shape:?}: {y:?}"
        );
        stm.abort(&mut tx);
        Stm::<Model>::finish(tx);
        read.send(()).unwrap();
        writer.join().unwrap();
    }
}
