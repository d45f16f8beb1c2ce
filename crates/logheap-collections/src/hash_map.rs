//! A persistent hash map with separate chaining.

use logheap::{Error, PPtr, Tx, pfield};

use crate::striped_count;

/// The persistent header of a [`HashMap`].
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct HashHeader {
    buckets: u64,
    /// The entry count (a striped count object).
    count: u64,
    /// Home offset of the bucket array (`buckets` pointers to chain heads).
    table: u64,
}

/// A chain node: key, next node, value length; the value bytes follow.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Entry {
    key: u64,
    next: u64,
    len: u64,
}

const ENTRY: u64 = std::mem::size_of::<Entry>() as u64;

/// Where a key is, or would go, in its chain.
struct Found {
    /// The link (bucket slot or a node's `next`) pointing at the entry.
    link: PPtr<u64>,
    /// The entry's home offset and contents, when the key is present.
    entry: Option<(u64, Entry)>,
}

/// A persistent map from `u64` keys to byte-string values (separate chaining, a fixed
/// number of buckets chosen at creation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashMap {
    header: PPtr<HashHeader>,
}

fn bucket_of(key: u64, buckets: u64) -> u64 {
    // A 64-bit mix (splitmix64's finaliser), so sequential keys spread.
    let mut x = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) % buckets
}

impl HashMap {
    /// Creates an empty map with `buckets` chains.
    pub fn create(tx: &mut Tx<'_>, buckets: u64) -> Result<HashMap, Error> {
        let buckets = buckets.max(1);
        let table = tx.alloc_bytes(buckets * 8)?;
        let count = striped_count::create(tx)?;
        let header = tx.alloc(HashHeader {
            buckets,
            count,
            table,
        })?;
        Ok(HashMap { header })
    }

    /// The map stored at `header` (from [`pointer`](Self::pointer) of an earlier run).
    pub fn from_pointer(header: u64) -> HashMap {
        HashMap {
            header: PPtr::from_offset(header),
        }
    }

    /// The persistent pointer to store to find the map again.
    pub fn pointer(&self) -> u64 {
        self.header.offset()
    }

    /// Number of entries.
    pub fn len(&self, tx: &mut Tx<'_>) -> Result<u64, Error> {
        let count = tx.read(pfield!(self.header, HashHeader, count))?;
        striped_count::total(tx, count)
    }

    /// Whether the map is empty.
    pub fn is_empty(&self, tx: &mut Tx<'_>) -> Result<bool, Error> {
        Ok(self.len(tx)? == 0)
    }

    fn slot(&self, tx: &mut Tx<'_>, key: u64) -> Result<PPtr<u64>, Error> {
        let h = tx.read(self.header)?;
        Ok(PPtr::from_offset(h.table + 8 * bucket_of(key, h.buckets)))
    }

    /// Finds `key`: the link that points (or would point) at its entry, and the entry.
    fn find(&self, tx: &mut Tx<'_>, key: u64) -> Result<Found, Error> {
        let mut link = self.slot(tx, key)?;
        loop {
            let at = tx.read(link)?;
            if at == 0 {
                return Ok(Found { link, entry: None });
            }
            let e: Entry = tx.read(PPtr::from_offset(at))?;
            if e.key == key {
                return Ok(Found {
                    link,
                    entry: Some((at, e)),
                });
            }
            link = pfield!(PPtr::<Entry>::from_offset(at), Entry, next);
        }
    }

    /// The value of `key`, if present.
    pub fn get(&self, tx: &mut Tx<'_>, key: u64) -> Result<Option<Vec<u8>>, Error> {
        let mut v = Vec::new();
        Ok(self.get_into(tx, key, &mut v)?.then_some(v))
    }

    /// Reads the value of `key` into `out` (its capacity reused) and returns whether
    /// the key is present (`out` is left empty when not).
    pub fn get_into(&self, tx: &mut Tx<'_>, key: u64, out: &mut Vec<u8>) -> Result<bool, Error> {
        out.clear();
        match self.find(tx, key)?.entry {
            None => Ok(false),
            Some((at, e)) => {
                out.resize(e.len as usize, 0);
                tx.read_bytes(at + ENTRY, out)?;
                Ok(true)
            }
        }
    }

    /// Whether `key` is present.
    pub fn contains(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        Ok(self.find(tx, key)?.entry.is_some())
    }

    /// Sets `key` to `value`; returns whether it replaced a value. A value of the same
    /// length is overwritten in place; otherwise the entry is reallocated.
    pub fn insert(&self, tx: &mut Tx<'_>, key: u64, value: &[u8]) -> Result<bool, Error> {
        let Found { link, entry } = self.find(tx, key)?;
        if let Some((at, e)) = entry {
            if e.len == value.len() as u64 {
                tx.write_bytes(at + ENTRY, value)?;
            } else {
                let fresh = self.new_entry(tx, key, e.next, value)?;
                tx.write(link, &fresh)?;
                tx.free(PPtr::<Entry>::from_offset(at))?;
            }
            return Ok(true);
        }
        let slot = self.slot(tx, key)?;
        let head = tx.read(slot)?;
        let fresh = self.new_entry(tx, key, head, value)?;
        tx.write(slot, &fresh)?;
        let count = tx.read(pfield!(self.header, HashHeader, count))?;
        striped_count::add(tx, count, 1)?;
        Ok(false)
    }

    fn new_entry(&self, tx: &mut Tx<'_>, key: u64, next: u64, value: &[u8]) -> Result<u64, Error> {
        let at = tx.alloc_bytes(ENTRY + value.len() as u64)?;
        let e = Entry {
            key,
            next,
            len: value.len() as u64,
        };
        tx.write_bytes(at, bytemuck::bytes_of(&e))?;
        tx.write_bytes(at + ENTRY, value)?;
        Ok(at)
    }

    /// Removes `key`; returns whether it was present.
    pub fn remove(&self, tx: &mut Tx<'_>, key: u64) -> Result<bool, Error> {
        let Found { link, entry } = self.find(tx, key)?;
        let Some((at, e)) = entry else {
            return Ok(false);
        };
        tx.write(link, &e.next)?;
        tx.free(PPtr::<Entry>::from_offset(at))?;
        let count = tx.read(pfield!(self.header, HashHeader, count))?;
        striped_count::add(tx, count, -1)?;
        Ok(true)
    }
}
