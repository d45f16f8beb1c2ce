//! The stores YCSB runs on, behind one trait: logheap-kv (on any engine), LMDB (heed),
//! redb, fjall and, with the `rocksdb` feature, RocksDB. Each makes every commit durable
//! before it returns; [`Store::durability`] says how.

use std::fmt;

use redb::{ReadableDatabase, ReadableTable};
use std::ops::Bound;
use std::path::Path;
use std::str::FromStr;

/// An error of a store, in words.
#[derive(Debug, thiserror::Error)]
#[error("{store}: {message}")]
pub struct StoreError {
    /// Which store.
    pub store: &'static str,
    /// What went wrong.
    pub message: String,
}

fn err(store: &'static str) -> impl Fn(&dyn fmt::Display) -> StoreError {
    move |e| StoreError {
        store,
        message: e.to_string(),
    }
}

/// A key-value store under test. Every method is one durable operation (or read);
/// `update` replaces one field of a record inside one write transaction where the
/// store has them.
pub trait Store: Send + Sync {
    /// Reads the whole value of `key` into `out`; whether it is there.
    fn read(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, StoreError>;
    /// Adds (or replaces) a record, durably.
    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError>;
    /// Replaces `field.len()` bytes at `offset` of the record of `key` (read, change,
    /// write back), durably; whether the record was there.
    fn update(&self, key: &[u8], offset: usize, field: &[u8]) -> Result<bool, StoreError>;
    /// Reads up to `count` records in key order from `start`; how many it read.
    fn scan(&self, start: &[u8], count: usize) -> Result<usize, StoreError>;
    /// How a commit is made durable here.
    fn durability(&self) -> String;
}

/// Which store, with its settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum StoreKind {
    /// logheap-kv on a logheap engine.
    Logheap(logheap::EngineKind),
    /// LMDB through heed.
    Lmdb,
    /// redb.
    Redb,
    /// fjall.
    Fjall,
    /// RocksDB (the `rocksdb` feature).
    RocksDb,
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreKind::Logheap(engine) => write!(f, "logheap-{engine}"),
            StoreKind::Lmdb => f.write_str("lmdb"),
            StoreKind::Redb => f.write_str("redb"),
            StoreKind::Fjall => f.write_str("fjall"),
            StoreKind::RocksDb => f.write_str("rocksdb"),
        }
    }
}

impl FromStr for StoreKind {
    type Err = String;
    fn from_str(s: &str) -> Result<StoreKind, String> {
        Ok(match s {
            "lmdb" => StoreKind::Lmdb,
            "redb" => StoreKind::Redb,
            "fjall" => StoreKind::Fjall,
            "rocksdb" => StoreKind::RocksDb,
            _ => match s.strip_prefix("logheap-") {
                Some(engine) => StoreKind::Logheap(
                    engine
                        .parse::<logheap::EngineKind>()
                        .map_err(|e| e.to_string())?,
                ),
                None => {
                    return Err(format!(
                        "unknown store {s:?}: logheap-ENGINE (log, redo, undo, oop, hoop), lmdb, redb, fjall or rocksdb"
                    ));
                }
            },
        })
    }
}

impl StoreKind {
    /// The stores run when none is named: logheap-kv on the log engine and on the
    /// fastest in-place engine, and every peer built in.
    pub fn defaults() -> Vec<StoreKind> {
        let mut v = vec![
            StoreKind::Logheap(logheap::EngineKind::Log),
            StoreKind::Logheap(logheap::EngineKind::Undo),
            StoreKind::Lmdb,
            StoreKind::Redb,
            StoreKind::Fjall,
        ];
        if cfg!(feature = "rocksdb") {
            v.push(StoreKind::RocksDb);
        }
        v
    }

    /// Opens a new, empty store of this kind in the empty directory `dir`, sized for
    /// about `payload` bytes of records.
    pub fn open(self, dir: &Path, payload: u64) -> Result<Box<dyn Store>, StoreError> {
        match self {
            StoreKind::Logheap(engine) => Ok(Box::new(LogheapStore::open(dir, engine, payload)?)),
            StoreKind::Lmdb => Ok(Box::new(LmdbStore::open(dir, payload)?)),
            StoreKind::Redb => Ok(Box::new(RedbStore::open(dir)?)),
            StoreKind::Fjall => Ok(Box::new(FjallStore::open(dir)?)),
            StoreKind::RocksDb => open_rocksdb(dir),
        }
    }
}

/// Replaces `field` at `offset` of `value` (growing it when short).
fn patch(value: &mut Vec<u8>, offset: usize, field: &[u8]) {
    if value.len() < offset + field.len() {
        value.resize(offset + field.len(), 0);
    }
    value[offset..offset + field.len()].copy_from_slice(field);
}

/// An update as a read, a change and a write (`insert`), for stores without write
/// transactions to put them in.
fn read_change_write(
    store: &dyn Store,
    key: &[u8],
    offset: usize,
    field: &[u8],
) -> Result<bool, StoreError> {
    let mut value = Vec::new();
    if !store.read(key, &mut value)? {
        return Ok(false);
    }
    patch(&mut value, offset, field);
    store.insert(key, &value)?;
    Ok(true)
}

/// What a scan does with each value it reads: copies it out, as a YCSB binding does
/// into its result (logheap-kv's scan copies each record too).
fn copy_out(out: &mut Vec<u8>, value: &[u8]) {
    out.clear();
    out.extend_from_slice(value);
    std::hint::black_box(&out);
}

/// logheap-kv in a pool file, on one engine.
pub struct LogheapStore {
    store: logheap_kv::KvStore,
}

impl LogheapStore {
    fn open(dir: &Path, engine: logheap::EngineKind, payload: u64) -> Result<Self, StoreError> {
        let e = err("logheap-kv");
        // Room for the records, the tree and, on the log engine, the cleaner's headroom.
        let size = (payload * 4).max(64 << 20);
        let config = logheap::Config::default().engine(engine).size(size);
        let store = logheap_kv::KvStore::open(dir.join("ycsb.pool"), &config).map_err(|x| e(&x))?;
        Ok(LogheapStore { store })
    }
}

impl Store for LogheapStore {
    fn read(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, StoreError> {
        self.store
            .get_into(key, out)
            .map_err(|x| err("logheap-kv")(&x))
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.store
            .put(key, value)
            .map_err(|x| err("logheap-kv")(&x))
    }

    fn update(&self, key: &[u8], offset: usize, field: &[u8]) -> Result<bool, StoreError> {
        let mut value = Vec::new();
        self.store
            .transaction(|kv| kv.update(key, &mut value, |v| patch(v, offset, field)))
            .map_err(|x| err("logheap-kv")(&x))
    }

    fn scan(&self, start: &[u8], count: usize) -> Result<usize, StoreError> {
        let mut n = 0;
        self.store
            .read(|kv| {
                n = 0;
                kv.scan(
                    Bound::Included(start),
                    Bound::Unbounded,
                    logheap_kv::Direction::Forward,
                    |_, _| {
                        n += 1;
                        if n == count {
                            std::ops::ControlFlow::Break(())
                        } else {
                            std::ops::ControlFlow::Continue(())
                        }
                    },
                )
            })
            .map_err(|x| err("logheap-kv")(&x))?;
        Ok(n)
    }

    fn durability(&self) -> String {
        let stats = self.store.pool().stats();
        format!(
            "every commit persisted before it returns: {} ({} medium)",
            stats.durability, stats.medium
        )
    }
}

type LmdbDb = heed::Database<heed::types::Bytes, heed::types::Bytes>;

/// LMDB through heed, with its default (durable) flags.
pub struct LmdbStore {
    env: heed::Env<heed::WithoutTls>,
    db: LmdbDb,
}

impl LmdbStore {
    fn open(dir: &Path, payload: u64) -> Result<Self, StoreError> {
        let e = err("lmdb");
        let map_size = ((payload * 4).max(256 << 20) as usize).next_multiple_of(4096);
        // SAFETY: the environment is opened once, in a directory of its own that no other
        // process or handle uses, and nothing truncates its file while it is mapped
        // (heed's condition for this unsafe open).
        let env = unsafe {
            heed::EnvOpenOptions::new()
                .read_txn_without_tls()
                .map_size(map_size)
                .max_dbs(1)
                .open(dir)
        }
        .map_err(|x| e(&x))?;
        let mut w = env.write_txn().map_err(|x| e(&x))?;
        let db: LmdbDb = env.create_database(&mut w, None).map_err(|x| e(&x))?;
        w.commit().map_err(|x| e(&x))?;
        Ok(LmdbStore { env, db })
    }
}

impl Store for LmdbStore {
    fn read(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, StoreError> {
        let e = err("lmdb");
        let r = self.env.read_txn().map_err(|x| e(&x))?;
        match self.db.get(&r, key).map_err(|x| e(&x))? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(v);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let e = err("lmdb");
        let mut w = self.env.write_txn().map_err(|x| e(&x))?;
        self.db.put(&mut w, key, value).map_err(|x| e(&x))?;
        w.commit().map_err(|x| e(&x))
    }

    fn update(&self, key: &[u8], offset: usize, field: &[u8]) -> Result<bool, StoreError> {
        let e = err("lmdb");
        let mut w = self.env.write_txn().map_err(|x| e(&x))?;
        let Some(old) = self.db.get(&w, key).map_err(|x| e(&x))? else {
            return Ok(false);
        };
        let mut value = old.to_vec();
        patch(&mut value, offset, field);
        self.db.put(&mut w, key, &value).map_err(|x| e(&x))?;
        w.commit().map_err(|x| e(&x))?;
        Ok(true)
    }

    fn scan(&self, start: &[u8], count: usize) -> Result<usize, StoreError> {
        let e = err("lmdb");
        let r = self.env.read_txn().map_err(|x| e(&x))?;
        let range = (Bound::Included(start), Bound::Unbounded);
        let (mut n, mut out) = (0, Vec::new());
        for entry in self.db.range(&r, &range).map_err(|x| e(&x))?.take(count) {
            let (_k, v) = entry.map_err(|x| e(&x))?;
            copy_out(&mut out, v);
            n += 1;
        }
        Ok(n)
    }

    fn durability(&self) -> String {
        "default flags: every write transaction's commit syncs the data file (fdatasync)".into()
    }
}

const REDB_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("ycsb");

/// redb, with its default durability (immediate).
pub struct RedbStore {
    db: redb::Database,
}

impl RedbStore {
    fn open(dir: &Path) -> Result<Self, StoreError> {
        let e = err("redb");
        let db = redb::Database::create(dir.join("ycsb.redb")).map_err(|x| e(&x))?;
        let w = db.begin_write().map_err(|x| e(&x))?;
        w.open_table(REDB_TABLE).map_err(|x| e(&x))?;
        w.commit().map_err(|x| e(&x))?;
        Ok(RedbStore { db })
    }

    fn write(
        &self,
        f: impl FnOnce(&mut redb::Table<&[u8], &[u8]>) -> Result<bool, redb::StorageError>,
    ) -> Result<bool, StoreError> {
        let e = err("redb");
        let w = self.db.begin_write().map_err(|x| e(&x))?;
        let done = {
            let mut t = w.open_table(REDB_TABLE).map_err(|x| e(&x))?;
            f(&mut t).map_err(|x| e(&x))?
        };
        w.commit().map_err(|x| e(&x))?;
        Ok(done)
    }
}

impl Store for RedbStore {
    fn read(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, StoreError> {
        let e = err("redb");
        let r = self.db.begin_read().map_err(|x| e(&x))?;
        let t = r.open_table(REDB_TABLE).map_err(|x| e(&x))?;
        match t.get(key).map_err(|x| e(&x))? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(v.value());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.write(|t| t.insert(key, value).map(|_| true)).map(drop)
    }

    fn update(&self, key: &[u8], offset: usize, field: &[u8]) -> Result<bool, StoreError> {
        self.write(|t| {
            let Some(mut value) = t.get(key)?.map(|v| v.value().to_vec()) else {
                return Ok(false);
            };
            patch(&mut value, offset, field);
            t.insert(key, value.as_slice())?;
            Ok(true)
        })
    }

    fn scan(&self, start: &[u8], count: usize) -> Result<usize, StoreError> {
        let e = err("redb");
        let r = self.db.begin_read().map_err(|x| e(&x))?;
        let t = r.open_table(REDB_TABLE).map_err(|x| e(&x))?;
        let (mut n, mut out) = (0, Vec::new());
        for entry in t.range(start..).map_err(|x| e(&x))?.take(count) {
            let (_k, v) = entry.map_err(|x| e(&x))?;
            copy_out(&mut out, v.value());
            n += 1;
        }
        Ok(n)
    }

    fn durability(&self) -> String {
        "Durability::Immediate (the default): every commit fsyncs".into()
    }
}

/// fjall, its journal persisted (fsync) after every write.
pub struct FjallStore {
    keyspace: fjall::Keyspace,
    partition: fjall::PartitionHandle,
}

impl FjallStore {
    fn open(dir: &Path) -> Result<Self, StoreError> {
        let e = err("fjall");
        let keyspace = fjall::Config::new(dir).open().map_err(|x| e(&x))?;
        let partition = keyspace
            .open_partition("ycsb", fjall::PartitionCreateOptions::default())
            .map_err(|x| e(&x))?;
        Ok(FjallStore {
            keyspace,
            partition,
        })
    }

    fn persist(&self) -> Result<(), StoreError> {
        self.keyspace
            .persist(fjall::PersistMode::SyncAll)
            .map_err(|x| err("fjall")(&x))
    }
}

impl Store for FjallStore {
    fn read(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, StoreError> {
        match self.partition.get(key).map_err(|x| err("fjall")(&x))? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(&v);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.partition
            .insert(key, value)
            .map_err(|x| err("fjall")(&x))?;
        self.persist()
    }

    fn update(&self, key: &[u8], offset: usize, field: &[u8]) -> Result<bool, StoreError> {
        // fjall's plain keyspace has no transactions: read, change, write, persist.
        read_change_write(self, key, offset, field)
    }

    fn scan(&self, start: &[u8], count: usize) -> Result<usize, StoreError> {
        let (mut n, mut out) = (0, Vec::new());
        for entry in self.partition.range(start.to_vec()..).take(count) {
            let (_k, v) = entry.map_err(|x| err("fjall")(&x))?;
            copy_out(&mut out, &v);
            n += 1;
        }
        Ok(n)
    }

    fn durability(&self) -> String {
        "journal persisted with PersistMode::SyncAll (fsync) after every write".into()
    }
}

#[cfg(feature = "rocksdb")]
fn open_rocksdb(dir: &Path) -> Result<Box<dyn Store>, StoreError> {
    Ok(Box::new(rocks::RocksStore::open(dir)?))
}

#[cfg(not(feature = "rocksdb"))]
fn open_rocksdb(_dir: &Path) -> Result<Box<dyn Store>, StoreError> {
    Err(StoreError {
        store: "rocksdb",
        message: "not built in: build with `--features logheap-ycsb/rocksdb` (a long C++ build)"
            .into(),
    })
}

#[cfg(feature = "rocksdb")]
mod rocks {
    use super::*;

    /// RocksDB, every write synced (`WriteOptions::set_sync(true)`, WAL on).
    pub struct RocksStore {
        db: rocksdb::DB,
        sync: rocksdb::WriteOptions,
    }

    impl RocksStore {
        pub(super) fn open(dir: &Path) -> Result<Self, StoreError> {
            let mut options = rocksdb::Options::default();
            options.create_if_missing(true);
            let db = rocksdb::DB::open(&options, dir).map_err(|x| err("rocksdb")(&x))?;
            let mut sync = rocksdb::WriteOptions::default();
            sync.set_sync(true);
            Ok(RocksStore { db, sync })
        }
    }

    impl Store for RocksStore {
        fn read(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, StoreError> {
            match self.db.get_pinned(key).map_err(|x| err("rocksdb")(&x))? {
                Some(v) => {
                    out.clear();
                    out.extend_from_slice(&v);
                    Ok(true)
                }
                None => Ok(false),
            }
        }

        fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
            self.db
                .put_opt(key, value, &self.sync)
                .map_err(|x| err("rocksdb")(&x))
        }

        fn update(&self, key: &[u8], offset: usize, field: &[u8]) -> Result<bool, StoreError> {
            read_change_write(self, key, offset, field)
        }

        fn scan(&self, start: &[u8], count: usize) -> Result<usize, StoreError> {
            let mode = rocksdb::IteratorMode::From(start, rocksdb::Direction::Forward);
            let (mut n, mut out) = (0, Vec::new());
            for entry in self.db.iterator(mode).take(count) {
                let (_k, v) = entry.map_err(|x| err("rocksdb")(&x))?;
                copy_out(&mut out, &v);
                n += 1;
            }
            Ok(n)
        }

        fn durability(&self) -> String {
            "WriteOptions::set_sync(true): the WAL is fsynced on every write".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every built-in store reads back what it was given, updates a field in place of
    /// the old bytes, and scans in key order from a start key.
    #[test]
    fn every_store_reads_updates_and_scans() {
        for kind in StoreKind::defaults() {
            let dir = tempfile::tempdir().unwrap();
            let store = kind.open(dir.path(), 1 << 20).unwrap();
            for i in 0..50u32 {
                store
                    .insert(format!("k{i:03}").as_bytes(), &[i as u8; 20])
                    .unwrap();
            }
            let mut out = Vec::new();
            assert!(store.read(b"k007", &mut out).unwrap(), "{kind}");
            assert_eq!(out, [7u8; 20]);
            assert!(!store.read(b"nope", &mut out).unwrap());
            assert!(store.update(b"k007", 5, b"abc").unwrap());
            assert!(!store.update(b"nope", 0, b"x").unwrap());
            store.read(b"k007", &mut out).unwrap();
            assert_eq!(&out[4..9], &[7, b'a', b'b', b'c', 7], "{kind}");
            assert_eq!(store.scan(b"k045", 100).unwrap(), 5, "{kind}");
            assert_eq!(store.scan(b"k", 10).unwrap(), 10, "{kind}");
            assert!(!store.durability().is_empty());
        }
    }

    #[test]
    fn store_names_round_trip() {
        for kind in StoreKind::defaults() {
            assert_eq!(kind.to_string().parse::<StoreKind>(), Ok(kind));
        }
        assert!("mongo".parse::<StoreKind>().is_err());
    }
}
