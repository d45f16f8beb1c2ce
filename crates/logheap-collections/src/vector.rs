//! A persistent growable vector of fixed-size elements.

use logheap::{Error, PPtr, Tx};

/// The persistent header of a [`Vector`].
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct VectorHeader {
    len: u64,
    capacity: u64,
    element_size: u64,
    data: u64,
}

/// A persistent vector of `element_size`-byte elements that doubles its storage when
/// full (the old storage is freed in the same transaction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vector {
    header: PPtr<VectorHeader>,
}

impl Vector {
    /// Creates an empty vector.
    pub fn create(tx: &mut Tx<'_>, element_size: u64) -> Result<Vector, Error> {
        let element_size = element_size.max(1);
        let capacity = 4;
        let data = tx.alloc_bytes(capacity * element_size)?;
        let header = tx.alloc(VectorHeader {
            len: 0,
            capacity,
            element_size,
            data,
        })?;
        Ok(Vector { header })
    }

    /// The vector stored at `header`.
    pub fn from_pointer(header: u64) -> Vector {
        Vector {
            header: PPtr::from_offset(header),
        }
    }

    /// The persistent pointer to store to find the vector again.
    pub fn pointer(&self) -> u64 {
        self.header.offset()
    }

    /// Number of elements.
    pub fn len(&self, tx: &mut Tx<'_>) -> Result<u64, Error> {
        Ok(tx.read(self.header)?.len)
    }

    /// Whether the vector is empty.
    pub fn is_empty(&self, tx: &mut Tx<'_>) -> Result<bool, Error> {
        Ok(self.len(tx)? == 0)
    }

    fn check(h: &VectorHeader, i: u64, value_len: Option<usize>) -> Result<(), Error> {
        let bad_len = value_len.is_some_and(|l| l as u64 != h.element_size);
        if i >= h.len || bad_len {
            return Err(Error::InvalidRange {
                home: h.data,
                len: h.element_size,
            });
        }
        Ok(())
    }

    /// Element `i`.
    pub fn get(&self, tx: &mut Tx<'_>, i: u64) -> Result<Vec<u8>, Error> {
        let h = tx.read(self.header)?;
        Self::check(&h, i, None)?;
        let mut v = vec![0u8; h.element_size as usize];
        tx.read_bytes(h.data + i * h.element_size, &mut v)?;
        Ok(v)
    }

    /// Sets element `i`.
    pub fn set(&self, tx: &mut Tx<'_>, i: u64, value: &[u8]) -> Result<(), Error> {
        let h = tx.read(self.header)?;
        Self::check(&h, i, Some(value.len()))?;
        tx.write_bytes(h.data + i * h.element_size, value)
    }

    /// Appends an element.
    pub fn push(&self, tx: &mut Tx<'_>, value: &[u8]) -> Result<(), Error> {
        let mut h = tx.read(self.header)?;
        if value.len() as u64 != h.element_size {
            return Err(Error::InvalidRange {
                home: h.data,
                len: value.len() as u64,
            });
        }
        if h.len == h.capacity {
            let capacity = h
                .capacity
                .checked_mul(2)
                .ok_or(Error::InvalidSize(u64::MAX))?;
            let bytes = capacity
                .checked_mul(h.element_size)
                .ok_or(Error::InvalidSize(u64::MAX))?;
            let data = tx.alloc_bytes(bytes)?;
            let mut old = vec![0u8; (h.len * h.element_size) as usize];
            tx.read_bytes(h.data, &mut old)?;
            tx.write_bytes(data, &old)?;
            tx.free(PPtr::<u8>::from_offset(h.data))?;
            h.data = data;
            h.capacity = capacity;
        }
        tx.write_bytes(h.data + h.len * h.element_size, value)?;
        h.len += 1;
        tx.write(self.header, &h)
    }

    /// Removes and returns the last element.
    pub fn pop(&self, tx: &mut Tx<'_>) -> Result<Option<Vec<u8>>, Error> {
        let mut h = tx.read(self.header)?;
        if h.len == 0 {
            return Ok(None);
        }
        h.len -= 1;
        let mut v = vec![0u8; h.element_size as usize];
        tx.read_bytes(h.data + h.len * h.element_size, &mut v)?;
        tx.write(self.header, &h)?;
        Ok(Some(v))
    }
}
