//! Damage inside a store's tree (a node's tag, an entry's lengths and offset, a leaf
//! chain that loops) is an error in words, never a panic, a huge allocation or a hang.

use logheap::{Config, PPtr, Pool};
use logheap_kv::{Error, KvStore};

/// Offsets in the tree's persistent formats (see `node.rs`): the header's root and
/// height; a leaf's tag, prev, next and first entry; an inner node's children.
const HEADER_ROOT: u64 = 0;
const LEAF_PREV: u64 = 16;
const LEAF_NEXT: u64 = 24;
const LEAF_FIRST_SLOT: u64 = 32;
const SLOT_KEY_LEN: u64 = 16;
const SLOT_AT: u64 = 24;
const INNER_CHILDREN: u64 = 16 + 32 * 32;

fn store_with(keys: u32) -> KvStore {
    let pool = Pool::create_sim(&Config::default().size(16 << 20), Default::default()).unwrap();
    let store = KvStore::with_pool(pool).unwrap();
    for i in 0..keys {
        store
            .put(format!("key-{i:04}").as_bytes(), b"value")
            .unwrap();
    }
    store
}

fn word(store: &KvStore, at: u64) -> u64 {
    store
        .pool()
        .read(|tx| tx.read(PPtr::<u64>::from_offset(at)))
        .unwrap()
}

fn set(store: &KvStore, at: u64, bytes: &[u8]) {
    store
        .pool()
        .transaction(|tx| tx.write_bytes(at, bytes))
        .unwrap();
}

fn root_node(store: &KvStore) -> u64 {
    word(store, store.tree().pointer() + HEADER_ROOT)
}

#[test]
fn a_wrong_node_tag_is_damage() {
    let store = store_with(5);
    set(&store, root_node(&store), b"garbage!");
    let err = store.get(b"key-0001").unwrap_err();
    assert!(matches!(err, Error::Damaged { .. }), "{err}");
    assert!(err.to_string().contains("damaged"));
    assert!(store.put(b"x", b"y").is_err());
    assert!(store.iter().next().unwrap().is_err());
}

#[test]
fn impossible_lengths_and_offsets_are_errors() {
    let store = store_with(5);
    let slot = root_node(&store) + LEAF_FIRST_SLOT;
    // A 4 GiB key past the end of the address space.
    let mut bad = Vec::new();
    bad.extend_from_slice(&u32::MAX.to_le_bytes());
    bad.extend_from_slice(&u32::MAX.to_le_bytes());
    bad.extend_from_slice(&(u64::MAX - 8).to_le_bytes());
    set(&store, slot + SLOT_KEY_LEN, &bad);
    assert!(store.iter().next().unwrap().is_err());
    assert!(store.get(b"key-0000").is_err() || store.get(b"key-0000").unwrap().is_none());
    assert!(store.verify().is_err() || store.verify().unwrap().is_some());
    // A 4 GiB value at an offset inside the pool: refused before it is allocated.
    let mut bad = Vec::new();
    bad.extend_from_slice(&8u32.to_le_bytes());
    bad.extend_from_slice(&u32::MAX.to_le_bytes());
    set(&store, slot + SLOT_KEY_LEN, &bad);
    set(&store, slot + SLOT_AT, &4096u64.to_le_bytes());
    assert!(store.iter().next().unwrap().is_err());
}

#[test]
fn a_leaf_chain_that_loops_is_damage_not_a_hang() {
    let store = store_with(100);
    assert!(store.stats().unwrap().levels >= 2);
    let root = root_node(&store);
    let first = word(&store, root + INNER_CHILDREN);
    let second = word(&store, first + LEAF_NEXT);
    // first <-> second, both ways, and nothing else.
    set(&store, second + LEAF_NEXT, &first.to_le_bytes());
    set(&store, first + LEAF_PREV, &second.to_le_bytes());
    assert!(matches!(store.stats(), Err(Error::Damaged { .. })));
    let scanned: Result<Vec<_>, _> = store.iter().collect();
    assert!(scanned.is_err());
    assert!(store.verify().unwrap().is_some());
}
