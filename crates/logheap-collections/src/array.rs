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
        tx.read(self.header)?.element(i)
    }

    /// Element `i`.
    pub fn get(&self, tx: &mut Tx<'_>, i: u64) -> Result<Vec<u8>, Error> {
        let (at, size) = self.at(tx, i)?;
        let mut v = vec![0u8; size as usize];
        tx.read_bytes(at, &mut v)?;
        Ok(v)
    }

    /// Reads element `i` into `out`, which must be exactly one element long: a read
    /// without a heap allocation.
    pub fn get_into(&self, tx: &mut Tx<'_>, i: u64, out: &mut [u8]) -> Result<(), Error> {
        let at = self.at_len(tx, i, out.len())?;
        tx.read_bytes(at, out)
    }

    /// Sets element `i` (`value` must be exactly one element long).
    pub fn set(&self, tx: &mut Tx<'_>, i: u64, value: &[u8]) -> Result<(), Error> {
        let at = self.at_len(tx, i, value.len())?;
        tx.write_bytes(at, value)
    }

    /// Where element `i` is, for a buffer of `len` bytes, which must be one element.
    fn at_len(&self, tx: &mut Tx<'_>, i: u64, len: usize) -> Result<u64, Error> {
        let (at, size) = self.at(tx, i)?;
        if len as u64 != size {
            return Err(Error::InvalidRange {
                home: at,
                len: len as u64,
            });
        }
        Ok(at)
    }

    /// Swaps elements `i` and `j` (the SPS operation): one read of the header, and
    /// elements of up to [`SWAP_INLINE`] bytes through buffers on the stack.
    pub fn swap(&self, tx: &mut Tx<'_>, i: u64, j: u64) -> Result<(), Error> {
        let header = tx.read(self.header)?;
        let ((a, size), (b, _)) = (header.element(i)?, header.element(j)?);
        let size = size as usize;
        if size > SWAP_INLINE {
            let (mut x, mut y) = (vec![0u8; size], vec![0u8; size]);
            return swap_through(tx, a, b, &mut x, &mut y);
        }
        let (mut x, mut y) = ([0u8; SWAP_INLINE], [0u8; SWAP_INLINE]);
        swap_through(tx, a, b, &mut x[..size], &mut y[..size])
    }
}

/// Elements up to this size are swapped without a heap allocation.
pub const SWAP_INLINE: usize = 64;

/// Swaps the equal-length ranges at `a` and `b` through the buffers `x` and `y`.
fn swap_through(tx: &mut Tx<'_>, a: u64, b: u64, x: &mut [u8], y: &mut [u8]) -> Result<(), Error> {
    tx.read_bytes(a, x)?;
    tx.read_bytes(b, y)?;
    tx.write_bytes(a, y)?;
    tx.write_bytes(b, x)
}

impl ArrayHeader {
    /// The home offset and size of element `i`.
    fn element(&self, i: u64) -> Result<(u64, u64), Error> {
        if i >= self.len {
            return Err(Error::InvalidRange {
                home: self.data,
                len: self.element_size,
            });
        }
        Ok((self.data + i * self.element_size, self.element_size))
    }
}
