//! The store against a `BTreeMap` model, through random puts, deletes, batches, gets and
//! scans both ways with bounds, with crashes (the persisted image reopened) in between,
//! on every engine; the tree's invariants are checked after every operation.

use std::collections::BTreeMap;
use std::ops::{Bound, ControlFlow};

use logheap::media::SimConfig;
use logheap::{Config, EngineKind, Pool};
use logheap_kv::{Direction, KvStore, WriteBatch};
use proptest::prelude::*;

const ENGINES: [EngineKind; 5] = [
    EngineKind::Log,
    EngineKind::Redo,
    EngineKind::Undo,
    EngineKind::Oop,
    EngineKind::Hoop,
];

fn new_store(engine: EngineKind) -> KvStore {
    let pool = Pool::create_sim(
        &Config::default()
            .size(16 << 20)
            .chunk_size(4096)
            .engine(engine),
        SimConfig::default(),
    )
    .unwrap();
    KvStore::with_pool(pool).unwrap()
}

/// A crash after the last commit: reopen the persisted image.
fn crash(store: KvStore) -> KvStore {
    let pool = store.into_pool();
    let image = pool.media().crash_simulator().unwrap().persisted_image();
    pool.abandon();
    let pool = Pool::open_image(image, &Config::default(), SimConfig::default()).unwrap();
    KvStore::with_pool(pool).unwrap()
}

/// Keys that share prefixes of every length around the 16 bytes a node keeps: short
/// ones, ones that differ only past byte 16, ones with zero bytes (which pad the
/// prefix), and the empty key.
fn key(kind: u8, n: u16) -> Vec<u8> {
    match kind % 5 {
        0 => format!("k{n}").into_bytes(),
        1 => format!("a-shared-prefix-of-20-{n:05}").into_bytes(),
        2 => {
            let mut k = vec![0u8; (n % 20) as usize];
            k.push((n / 20) as u8);
            k
        }
        3 => format!("user{:012}", n as u64 * 7919).into_bytes(),
        _ => b"abcdefghijklmnop"
            .iter()
            .copied()
            .take((n % 17) as usize)
            .collect(),
    }
}

fn value(seed: u16, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed as usize * 31 + i) as u8).collect()
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u16, usize),
    Delete(u8, u16),
    Get(u8, u16),
    Batch(Vec<(u8, u16, Option<usize>)>),
    Scan(Option<(u8, u16, bool)>, Option<(u8, u16, bool)>, bool),
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    let k = (0u8..5, 0u16..120);
    prop_oneof![
        8 => (k.clone(), 0usize..300).prop_map(|((a, b), l)| Op::Put(a, b, l)),
        4 => k.clone().prop_map(|(a, b)| Op::Delete(a, b)),
        2 => k.clone().prop_map(|(a, b)| Op::Get(a, b)),
        1 => prop::collection::vec((0u8..5, 0u16..120, prop::option::of(0usize..64)), 1..20)
            .prop_map(Op::Batch),
        2 => (
            prop::option::of((0u8..5, 0u16..120, any::<bool>())),
            prop::option::of((0u8..5, 0u16..120, any::<bool>())),
            any::<bool>()
        )
            .prop_map(|(s, e, back)| Op::Scan(s, e, back)),
        1 => Just(Op::Crash),
    ]
}

fn bound(b: &Option<(u8, u16, bool)>) -> Bound<Vec<u8>> {
    match b {
        None => Bound::Unbounded,
        Some((kind, n, true)) => Bound::Included(key(*kind, *n)),
        Some((kind, n, false)) => Bound::Excluded(key(*kind, *n)),
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// Whether std's `BTreeMap::range` accepts these bounds (it panics on start > end, and
/// on equal excluded bounds).
fn valid_range(start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>) -> bool {
    match (start, end) {
        (Bound::Excluded(s), Bound::Excluded(e)) => s < e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Included(e) | Bound::Excluded(e)) => {
            s <= e
        }
        _ => true,
    }
}

fn run(engine: EngineKind, ops: Vec<Op>) {
    let mut store = new_store(engine);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Put(kind, n, len) => {
                let (k, v) = (key(kind, n), value(n, len));
                store.put(&k, &v).unwrap();
                model.insert(k, v);
            }
            Op::Delete(kind, n) => {
                let k = key(kind, n);
                assert_eq!(store.delete(&k).unwrap(), model.remove(&k).is_some());
            }
            Op::Get(kind, n) => {
                let k = key(kind, n);
                assert_eq!(store.get(&k).unwrap().as_ref(), model.get(&k), "{step}");
            }
            Op::Batch(entries) => {
                let mut batch = WriteBatch::new();
                for (kind, n, len) in entries {
                    let k = key(kind, n);
                    match len {
                        Some(len) => {
                            let v = value(n.wrapping_add(1), len);
                            batch.put(&k, &v);
                            model.insert(k, v);
                        }
                        None => {
                            batch.delete(&k);
                            model.remove(&k);
                        }
                    }
                }
                store.write(&batch).unwrap();
            }
            Op::Scan(s, e, back) => {
                let (start, end) = (bound(&s), bound(&e));
                let expected: Vec<(Vec<u8>, Vec<u8>)> = if valid_range(&start, &end) {
                    let mut v: Vec<_> = model
                        .range((start.clone(), end.clone()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    if back {
                        v.reverse();
                    }
                    v
                } else {
                    Vec::new()
                };
                // Through the iterator (batches of short transactions)...
                let range = store.range_bounds(as_ref(&start), as_ref(&end));
                let got: Vec<_> = if back {
                    range.rev().collect::<Result<_, _>>().unwrap()
                } else {
                    range.collect::<Result<_, _>>().unwrap()
                };
                assert_eq!(got, expected, "step {step}: scan {s:?}..{e:?} back {back}");
                // ...and within one transaction.
                let direction = if back {
                    Direction::Backward
                } else {
                    Direction::Forward
                };
                let mut inside = Vec::new();
                store
                    .read(|kv| {
                        inside.clear();
                        kv.scan(as_ref(&start), as_ref(&end), direction, |k, v| {
                            inside.push((k.to_vec(), v.to_vec()));
                            ControlFlow::Continue(())
                        })
                    })
                    .unwrap();
                assert_eq!(inside, expected, "step {step}: scan in a transaction");
            }
            Op::Crash => store = crash(store),
        }
        assert_eq!(store.verify().unwrap(), None, "step {step}");
        assert_eq!(store.len().unwrap(), model.len() as u64, "step {step}");
    }
    let all: Vec<_> = store.iter().collect::<Result<_, _>>().unwrap();
    let expected: Vec<_> = model.into_iter().collect();
    assert_eq!(all, expected);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_store_matches_a_model_through_crashes(
        engine in 0usize..ENGINES.len(),
        ops in prop::collection::vec(op(), 1..250),
    ) {
        run(ENGINES[engine], ops);
    }
}

/// Thousands of keys in, most of them out again: leaf splits, inner splits, root
/// growth, merges, empty leaves leaving, the root collapsing; both ends of an iterator
/// meeting in the middle.
#[test]
fn a_tree_grows_and_shrinks_through_every_shape_on_every_engine() {
    for engine in ENGINES {
        let store = new_store(engine);
        let mut model = BTreeMap::new();
        let mut x = 12345u64;
        for i in 0..3000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = format!("key-{:08}", x % 5000).into_bytes();
            let v = i.to_le_bytes().repeat((x % 5) as usize);
            store.put(&k, &v).unwrap();
            model.insert(k, v);
        }
        assert_eq!(store.verify().unwrap(), None, "{engine:?}");
        let levels = store.stats().unwrap().levels;
        assert!(levels >= 3, "{engine:?}: {levels} levels");
        // Both ends at once: every entry exactly once.
        let mut range = store.iter();
        let (mut front, mut back) = (Vec::new(), Vec::new());
        loop {
            match (range.next(), range.next_back()) {
                (None, None) => break,
                (a, b) => {
                    front.extend(a.map(|e| e.unwrap()));
                    back.extend(b.map(|e| e.unwrap()));
                }
            }
        }
        back.reverse();
        front.extend(back);
        assert_eq!(front, model.clone().into_iter().collect::<Vec<_>>());
        let keys: Vec<_> = model.keys().cloned().collect();
        for (i, k) in keys.iter().enumerate() {
            if i % 10 != 0 {
                assert!(store.delete(k).unwrap());
                model.remove(k);
            }
        }
        assert_eq!(store.verify().unwrap(), None, "{engine:?}");
        let stats = store.stats().unwrap();
        assert_eq!(stats.entries, model.len() as u64);
        // Merges keep leaves at least a quarter full on average.
        assert!(
            stats.leaves * 8 <= stats.entries + 8,
            "{engine:?}: {} leaves for {} entries",
            stats.leaves,
            stats.entries
        );
        for k in model.keys() {
            assert!(store.delete(k).unwrap());
        }
        let stats = store.stats().unwrap();
        assert_eq!((stats.entries, stats.levels, stats.leaves), (0, 1, 1));
        assert_eq!(store.verify().unwrap(), None);
    }
}

#[test]
fn prefixes_and_large_values() {
    for engine in ENGINES {
        prefixes_and_large_values_on(engine);
    }
}

fn prefixes_and_large_values_on(engine: EngineKind) {
    let config = Config::default().size(64 << 20).engine(engine);
    let store =
        KvStore::with_pool(Pool::create_sim(&config, SimConfig::default()).unwrap()).unwrap();
    let big = value(7, 3 << 20);
    store.put(b"big", &big).unwrap();
    for k in ["app", "apple", "applet", "apply", "apq", "ap", "b"] {
        store.put(k.as_bytes(), b"v").unwrap();
    }
    let keys: Vec<_> = store
        .prefix(b"appl")
        .map(|e| String::from_utf8(e.unwrap().0).unwrap())
        .collect();
    assert_eq!(keys, ["apple", "applet", "apply"]);
    let mut out = Vec::new();
    assert!(store.get_into(b"big", &mut out).unwrap());
    assert_eq!(out, big);
    // The same length again is written in place; another length moves.
    store.put(b"big", &value(8, 3 << 20)).unwrap();
    store.put(b"big", b"small").unwrap();
    assert_eq!(store.get(b"big").unwrap(), Some(b"small".to_vec()));
    assert_eq!(store.verify().unwrap(), None);
}

#[test]
fn a_transaction_spans_operations_and_an_error_undoes_it() {
    let store = new_store(EngineKind::Redo);
    store.put(b"a", b"1").unwrap();
    let failed: Result<(), logheap_kv::Error> = store.transaction(|kv| {
        kv.put(b"b", b"2")?;
        kv.delete(b"a")?;
        assert_eq!(kv.get(b"b")?, Some(b"2".to_vec()));
        Err(logheap_kv::Error::TooLarge {
            what: "key",
            len: 0,
            max: 0,
        })
    });
    assert!(failed.is_err());
    assert_eq!(store.get(b"a").unwrap(), Some(b"1".to_vec()));
    assert_eq!(store.get(b"b").unwrap(), None);
    store
        .transaction(|kv| {
            let v = kv.get(b"a")?.unwrap();
            kv.put(b"b", &v)?;
            kv.delete(b"a").map(drop)
        })
        .unwrap();
    assert_eq!(store.get(b"a").unwrap(), None);
    assert_eq!(store.get(b"b").unwrap(), Some(b"1".to_vec()));
}

/// Two threads insert and delete their own keys while two scan: every scan sees the
/// keys no one touches, in order; at the end the tree is sound and holds what the
/// writers left.
#[test]
fn threads_write_and_scan_at_once() {
    for engine in [EngineKind::Log, EngineKind::Undo] {
        let store = new_store(engine);
        for i in 0..200u32 {
            store
                .put(format!("stable-{i:04}").as_bytes(), b"s")
                .unwrap();
        }
        std::thread::scope(|s| {
            for t in 0..2u32 {
                let store = &store;
                s.spawn(move || {
                    for i in 0..600u32 {
                        let k = format!("t{t}-{:04}", i % 150);
                        if i % 3 == 2 {
                            store.delete(k.as_bytes()).unwrap();
                        } else {
                            store.put(k.as_bytes(), &i.to_le_bytes()).unwrap();
                        }
                    }
                });
                s.spawn(move || {
                    for _ in 0..20 {
                        let stable: Vec<_> =
                            store.prefix(b"stable-").map(|e| e.unwrap().0).collect();
                        assert_eq!(stable.len(), 200);
                        assert!(stable.windows(2).all(|w| w[0] < w[1]));
                        let all: Vec<_> = store.iter().map(|e| e.unwrap().0).collect();
                        assert!(all.windows(2).all(|w| w[0] < w[1]));
                    }
                });
            }
        });
        assert_eq!(store.verify().unwrap(), None);
        for t in 0..2 {
            for i in 0..150u32 {
                // Key i was last touched at the largest j < 600 with j % 150 == i.
                let last = (0..600u32).filter(|j| j % 150 == i).max().unwrap();
                let present = store.get(format!("t{t}-{i:04}").as_bytes()).unwrap();
                if last % 3 == 2 {
                    assert_eq!(present, None);
                } else {
                    assert_eq!(present, Some(last.to_le_bytes().to_vec()));
                }
            }
        }
    }
}

#[test]
fn a_pool_holding_other_data_is_refused() {
    let pool = Pool::create_sim(&Config::default().size(8 << 20), SimConfig::default()).unwrap();
    let root = pool.root::<u64>().unwrap();
    pool.transaction(|tx| tx.write(root, &42u64)).unwrap();
    let err = KvStore::with_pool(pool).unwrap_err();
    assert!(
        matches!(err, logheap_kv::Error::NotAStore { found: 42, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("not a logheap-kv store"));
}

#[test]
fn update_changes_a_value_in_one_step_in_place_or_moved() {
    for engine in ENGINES {
        let store = new_store(engine);
        store.put(b"k", b"hello").unwrap();
        let mut buf = Vec::new();
        let present = store
            .transaction(|kv| kv.update(b"k", &mut buf, |v| v[0] = b'j'))
            .unwrap();
        assert!(present);
        assert_eq!(store.get(b"k").unwrap(), Some(b"jello".to_vec()));
        store
            .transaction(|kv| kv.update(b"k", &mut buf, |v| v.extend_from_slice(b" world")))
            .unwrap();
        assert_eq!(store.get(b"k").unwrap(), Some(b"jello world".to_vec()));
        let absent = store
            .transaction(|kv| kv.update(b"nope", &mut buf, |_| panic!("not called")))
            .unwrap();
        assert!(!absent);
        assert_eq!(store.verify().unwrap(), None, "{engine:?}");
    }
}
