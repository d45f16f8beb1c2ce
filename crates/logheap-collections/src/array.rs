//! A persistent fixed-size array of fixed-size elements (the SPS benchmark's array).

use logheap::{Error, PPtr, Tx};

/// The persistent header of an [`Array`].
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct ArrayHeader {
    len: u64,
    element_size: u64,
    data: u64,
}

/// A persistent array of `len` elements of `element_size` bytes each, zero-filled at
/// creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Array {
    header: PPtr<ArrayHeader>,
}

impl Array {
    /// Creates a zero-filled array.
    pub fn create(tx: &mut Tx<'_>, len: u64, element_size: u64) -> Result<Array, Error> {
        let bytes = len
            .checked_mul(element_size)
            .ok_or(Error::InvalidSize(u64::MAX))?;
        let data = tx.alloc_bytes(bytes.max(1))?;
        let header = tx.alloc(ArrayHeader {
            len,
            element_size,
            data,
        })?;
        Ok(Array { header })
    }

    /// The array stored at `header`.
    pub fn from_pointer(header: u64) -> Array {
        Array {
            header: PPtr::from_offset(header),
        }
    }

    /// The persistent pointer to store to find the array again.
    pub fn pointer(&self) -> u64 {
        self.header.offset()
    }

    /// Number of elements and element size.
    pub fn shape(&self, tx: &mut Tx<'_>) -> Result<(u64, u64), Error> {
        let h = tx.read(self.header)?;
        Ok((h.len, h.element_size))
    }

    fn at(&self, tx: &mut Tx<'_>, i: u64) -> Result<(u64, u64), Error> {
        let h = tx.read(self.header)?;
        if i >= h.len {
            return Err(Error::InvalidRange {
                home: h.data,
                len: h.element_size,
            });
        }
        Ok((h.data + i * h.element_size, h.element_size))
    }

    /// Element `i`.
    pub fn get(&self, tx: &mut Tx<'_>, i: u64) -> Result<Vec<u8>, Error> {
        let (at, size) = self.at(tx, i)?;
        let mut v = vec![0u8; size as usize];
        tx.read_bytes(at, &mut v)?;
        Ok(v)
    }

    /// Sets element `i` (`value` must be exactly one element long).
    pub fn set(&self, tx: &mut Tx<'_>, i: u64, value: &[u8]) -> Result<(), Error> {
        let (at, size) = self.at(tx, i)?;
        if value.len() as u64 != size {
            return Err(Error::InvalidRange {
                home: at,
                len: value.len() as u64,
            });
        }
        tx.write_bytes(at, value)
    }

    /// Swaps elements `i` and `j` (the SPS operation).
    pub fn swap(&self, tx: &mut Tx<'_>, i: u64, j: u64) -> Result<(), Error> {
        let a = self.get(tx, i)?;
        let b = self.get(tx, j)?;
        self.set(tx, i, &b)?;
        self.set(tx, j, &a)
    }
}
