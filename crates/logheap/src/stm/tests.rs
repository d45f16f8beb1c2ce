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
        Ok(Persisted::Durable { payload: 0 })
    }
    fn publish(&self, _: &CommitSet<'_>, _: &mut ()) {}
    fn make_room(&self, _: &mut (), _since: std::time::Instant) -> bool {
        false
    }
}

/// Two words on different lock stripes, always written together (`x == y`).
const X: u64 = 64;
const Y: u64 = 4096 + 64;

/// How a test reads a word: alone (in one stripe, the driver's one-lock-word path), or
/// with the 8 bytes before it, which lie in the stripe before (its path over several).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    InStripe,
    AcrossStripes,
}

impl Shape {
    const BOTH: [Shape; 2] = [Shape::InStripe, Shape::AcrossStripes];

    /// Where the read of the word at `home` starts, and the word's offset in it.
    fn start(self, home: u64) -> (u64, usize) {
        match self {
            Shape::InStripe => (home, 0),
            Shape::AcrossStripes => (home - 8, 8),
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
    let (start, at) = shape.start(home);
    let mut buf = [0u8; 16];
    stm.read(tx, start, &mut buf[..at + 8])?;
    Ok(u64::from_le_bytes(buf[at..at + 8].try_into().unwrap()))
}

fn model() -> Arc<Stm<Model>> {
    let media = Media::sim(4096, &MediaConfig::default(), SimConfig::default()).unwrap();
    Arc::new(Stm::new(Arc::new(Model {
        domain: Arc::new(Domain::new(1 << 20, 0)),
        media: Arc::new(media),
        heap: NoHeap,
        bytes: Mutex::new(vec![0; 8192]),
        hook: Mutex::new(None),
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
        .flat_map(|r| Shape::BOTH.map(|s| (r, s)))
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
        .flat_map(|r| Shape::BOTH.map(|s| (r, s)))
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
    for shape in Shape::BOTH {
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
