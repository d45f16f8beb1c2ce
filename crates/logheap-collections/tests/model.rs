//! Each collection against a std model, through random operations with crashes (the
//! persisted image reopened) in between; the red-black tree's invariants are checked
//! after every operation.

use std::collections::{BTreeMap, HashMap as StdMap, VecDeque};

use logheap::media::SimConfig;
use logheap::{Config, EngineKind, Error, Pool};
use logheap_collections::{Array, BpTree, CritBitTree, HashMap, Queue, RbTree, Vector};
use proptest::prelude::*;

/// Every engine the collections run on.
const ENGINES: [EngineKind; 5] = [
    EngineKind::Log,
    EngineKind::Redo,
    EngineKind::Undo,
    EngineKind::Oop,
    EngineKind::Hoop,
];

fn new_pool(engine: usize) -> Pool {
    Pool::create_sim(
        &Config::default()
            .size(8 << 20)
            .chunk_size(4096)
            .engine(ENGINES[engine % ENGINES.len()]),
        SimConfig::default(),
    )
    .unwrap()
}

/// A crash after the last commit: reopen the persisted image.
fn crash(pool: Pool) -> Pool {
    let image = pool.media().crash_simulator().unwrap().persisted_image();
    pool.abandon();
    Pool::open_image(image, &Config::default(), SimConfig::default()).unwrap()
}

fn value(key: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (key as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

#[derive(Debug, Clone)]
enum MapOp {
    Insert(u64, usize),
    Remove(u64),
    Get(u64),
    Crash,
}

fn map_op() -> impl Strategy<Value = MapOp> {
    prop_oneof![
        5 => (0u64..64, 0usize..200).prop_map(|(k, l)| MapOp::Insert(k, l)),
        3 => (0u64..64).prop_map(MapOp::Remove),
        2 => (0u64..64).prop_map(MapOp::Get),
        1 => Just(MapOp::Crash),
    ]
}

/// Map operations on keys spread over all 64 bits (so a crit-bit tree tests high bits).
fn wide_op() -> impl Strategy<Value = MapOp> {
    let key = prop_oneof![0u64..64, any::<u64>(), (0u64..64).prop_map(|k| k << 58)];
    prop_oneof![
        5 => (key.clone(), 0usize..200).prop_map(|(k, l)| MapOp::Insert(k, l)),
        3 => key.clone().prop_map(MapOp::Remove),
        2 => key.prop_map(MapOp::Get),
        1 => Just(MapOp::Crash),
    ]
}

/// The operations the two ordered maps share, for one model test over both.
trait OrderedMap: Copy {
    fn create(tx: &mut logheap::Tx<'_>) -> Result<Self, Error>;
    fn insert(&self, tx: &mut logheap::Tx<'_>, key: u64, value: &[u8]) -> Result<bool, Error>;
    fn remove(&self, tx: &mut logheap::Tx<'_>, key: u64) -> Result<bool, Error>;
    fn get(&self, tx: &mut logheap::Tx<'_>, key: u64) -> Result<Option<Vec<u8>>, Error>;
    fn keys(&self, tx: &mut logheap::Tx<'_>) -> Result<Vec<u64>, Error>;
    fn verify(&self, tx: &mut logheap::Tx<'_>) -> Result<Option<String>, Error>;
}

macro_rules! ordered_map {
    ($t:ty) => {
        impl OrderedMap for $t {
            fn create(tx: &mut logheap::Tx<'_>) -> Result<Self, Error> {
                <$t>::create(tx)
            }
            fn insert(
                &self,
                tx: &mut logheap::Tx<'_>,
                key: u64,
                value: &[u8],
            ) -> Result<bool, Error> {
                <$t>::insert(self, tx, key, value)
            }
            fn remove(&self, tx: &mut logheap::Tx<'_>, key: u64) -> Result<bool, Error> {
                <$t>::remove(self, tx, key)
            }
            fn get(&self, tx: &mut logheap::Tx<'_>, key: u64) -> Result<Option<Vec<u8>>, Error> {
                <$t>::get(self, tx, key)
            }
            fn keys(&self, tx: &mut logheap::Tx<'_>) -> Result<Vec<u64>, Error> {
                <$t>::keys(self, tx)
            }
            fn verify(&self, tx: &mut logheap::Tx<'_>) -> Result<Option<String>, Error> {
                <$t>::verify(self, tx)
            }
        }
    };
}
ordered_map!(RbTree);
ordered_map!(BpTree);
ordered_map!(CritBitTree);

/// Runs `ops` on a fresh `M` and a `BTreeMap`, checking answers and the structure's
/// invariants after every operation.
fn ordered_map_agrees<M: OrderedMap>(ops: Vec<MapOp>, engine: usize) -> Result<(), TestCaseError> {
    let mut pool = new_pool(engine);
    let tree = pool.transaction(M::create).unwrap();
    let mut model = BTreeMap::new();
    for op in ops {
        match op {
            MapOp::Insert(k, l) => {
                let replaced = pool
                    .transaction(|tx| tree.insert(tx, k, &value(k, l)))
                    .unwrap();
                prop_assert_eq!(replaced, model.insert(k, value(k, l)).is_some());
            }
            MapOp::Remove(k) => {
                prop_assert_eq!(
                    pool.transaction(|tx| tree.remove(tx, k)).unwrap(),
                    model.remove(&k).is_some()
                );
            }
            MapOp::Get(k) => prop_assert_eq!(
                pool.read(|tx| tree.get(tx, k)).unwrap(),
                model.get(&k).cloned()
            ),
            MapOp::Crash => pool = crash(pool),
        }
        let problem = pool.read(|tx| tree.verify(tx)).unwrap();
        prop_assert!(problem.is_none(), "{:?}", problem);
    }
    let keys: Vec<u64> = model.keys().copied().collect();
    prop_assert_eq!(pool.read(|tx| tree.keys(tx)).unwrap(), keys);
    Ok(())
}

/// B+ tree operations over enough keys to build a few levels of fanout-16 nodes.
fn bp_op() -> impl Strategy<Value = MapOp> {
    prop_oneof![
        6 => (0u64..600, 0usize..40).prop_map(|(k, l)| MapOp::Insert(k, l)),
        4 => (0u64..600).prop_map(MapOp::Remove),
        1 => (0u64..600).prop_map(MapOp::Get),
        1 => Just(MapOp::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn hash_map_agrees_with_std(ops in prop::collection::vec(map_op(), 1..120), engine in 0..ENGINES.len()) {
        let mut pool = new_pool(engine);
        let map = pool.transaction(|tx| HashMap::create(tx, 8)).unwrap();
        let mut model = StdMap::new();
        for op in ops {
            match op {
                MapOp::Insert(k, l) => {
                    let replaced = pool.transaction(|tx| map.insert(tx, k, &value(k + l as u64, l))).unwrap();
                    prop_assert_eq!(replaced, model.insert(k, value(k + l as u64, l)).is_some());
                }
                MapOp::Remove(k) => {
                    prop_assert_eq!(pool.transaction(|tx| map.remove(tx, k)).unwrap(), model.remove(&k).is_some());
                }
                MapOp::Get(k) => prop_assert_eq!(pool.read(|tx| map.get(tx, k)).unwrap(), model.get(&k).cloned()),
                MapOp::Crash => pool = crash(pool),
            }
        }
        let map = HashMap::from_pointer(map.pointer());
        prop_assert_eq!(pool.read(|tx| map.len(tx)).unwrap(), model.len() as u64);
        for (k, v) in &model {
            prop_assert_eq!(pool.read(|tx| map.get(tx, *k)).unwrap(), Some(v.clone()));
        }
    }

    #[test]
    fn crit_bit_tree_agrees_with_std_and_keeps_its_bits(ops in prop::collection::vec(wide_op(), 1..150), engine in 0..ENGINES.len()) {
        ordered_map_agrees::<CritBitTree>(ops, engine)?;
    }

    #[test]
    fn rb_tree_agrees_with_std_and_stays_balanced(ops in prop::collection::vec(map_op(), 1..150), engine in 0..ENGINES.len()) {
        ordered_map_agrees::<RbTree>(ops, engine)?;
    }

    #[test]
    fn bp_tree_agrees_with_std_and_keeps_its_shape(ops in prop::collection::vec(bp_op(), 1..400), engine in 0..ENGINES.len()) {
        ordered_map_agrees::<BpTree>(ops, engine)?;
    }

    #[test]
    fn queue_and_vector_agree_with_std(ops in prop::collection::vec((0u8..5, 0u64..1000), 1..150), engine in 0..ENGINES.len()) {
        let mut pool = new_pool(engine);
        let (queue, vector) = pool
            .transaction(|tx| Ok::<_, Error>((Queue::create(tx)?, Vector::create(tx, 16)?)))
            .unwrap();
        let mut q = VecDeque::new();
        let mut v: Vec<Vec<u8>> = Vec::new();
        for (op, x) in ops {
            let item = value(x, 16);
            match op {
                0 => {
                    pool.transaction(|tx| { queue.push(tx, &item[..(x % 17) as usize])?; vector.push(tx, &item) }).unwrap();
                    q.push_back(item[..(x % 17) as usize].to_vec());
                    v.push(item);
                }
                1 => {
                    let (a, b) = pool.transaction(|tx| Ok::<_, Error>((queue.pop(tx)?, vector.pop(tx)?))).unwrap();
                    prop_assert_eq!(a, q.pop_front());
                    prop_assert_eq!(b, v.pop());
                }
                2 if !v.is_empty() => {
                    let i = x % v.len() as u64;
                    pool.transaction(|tx| vector.set(tx, i, &item)).unwrap();
                    v[i as usize] = item;
                }
                3 => pool = crash(pool),
                _ => {}
            }
        }
        prop_assert_eq!(pool.read(|tx| queue.len(tx)).unwrap(), q.len() as u64);
        for (i, e) in v.iter().enumerate() {
            prop_assert_eq!(&pool.read(|tx| vector.get(tx, i as u64)).unwrap(), e);
        }
    }
}

#[test]
fn array_swaps_like_a_vec() {
    for engine in 0..ENGINES.len() {
        array_swaps_like_a_vec_on(engine);
    }
}

fn array_swaps_like_a_vec_on(engine: usize) {
    let pool = new_pool(engine);
    let array = pool.transaction(|tx| Array::create(tx, 100, 8)).unwrap();
    let mut model: Vec<[u8; 8]> = (0..100u64).map(|i| i.to_le_bytes()).collect();
    pool.transaction(|tx| {
        for (i, e) in model.iter().enumerate() {
            array.set(tx, i as u64, e)?;
        }
        Ok::<_, Error>(())
    })
    .unwrap();
    let mut x = 7u64;
    for _ in 0..500 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        let (i, j) = ((x >> 33) % 100, (x >> 13) % 100);
        pool.transaction(|tx| array.swap(tx, i, j)).unwrap();
        model.swap(i as usize, j as usize);
    }
    let pool = crash(pool);
    for (i, e) in model.iter().enumerate() {
        assert_eq!(pool.read(|tx| array.get(tx, i as u64)).unwrap(), e.to_vec());
    }
    assert!(
        pool.read(|tx| array.get(tx, 100)).is_err(),
        "out of bounds is an error"
    );
    assert_eq!(pool.read(|tx| array.shape(tx)).unwrap(), (100, 8));
}

#[test]
fn bp_tree_grows_deep_and_shrinks_back_to_a_leaf() {
    for engine in 0..ENGINES.len() {
        bp_tree_grows_deep_and_shrinks_back_to_a_leaf_on(engine);
    }
}

fn bp_tree_grows_deep_and_shrinks_back_to_a_leaf_on(engine: usize) {
    let pool = new_pool(engine);
    let tree = pool.transaction(BpTree::create).unwrap();
    let n = 5000u64;
    let scrambled = |i: u64| (i * 2654435761) % n;
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        pool.transaction(|tx| {
            for &i in chunk {
                tree.insert(tx, scrambled(i), &i.to_le_bytes())?;
            }
            Ok::<_, Error>(())
        })
        .unwrap();
    }
    assert_eq!(pool.read(|tx| tree.verify(tx)).unwrap(), None);
    assert_eq!(
        pool.read(|tx| tree.keys(tx)).unwrap(),
        (0..n).collect::<Vec<_>>()
    );
    for (round, chunk) in (0..n).rev().collect::<Vec<_>>().chunks(250).enumerate() {
        pool.transaction(|tx| {
            for &i in chunk {
                assert!(tree.remove(tx, scrambled(i))?);
            }
            Ok::<_, Error>(())
        })
        .unwrap();
        assert_eq!(
            pool.read(|tx| tree.verify(tx)).unwrap(),
            None,
            "after round {round}"
        );
    }
    assert_eq!(pool.read(|tx| tree.len(tx)).unwrap(), 0);
    // Every node but the (leaf) root and every value was freed.
    let allocations = pool.allocations().len();
    assert_eq!(
        allocations, 3,
        "header, count and root leaf remain, found {allocations}"
    );
}
