//! A persistent FIFO queue (a singly linked list with head and tail).

use logheap::{Error, PPtr, Tx, pfield};

/// The persistent header of a [`Queue`].
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct QueueHeader {
    head: u64,
    tail: u64,
    len: u64,
}

#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Node {
    next: u64,
    len: u64,
}

const NODE: u64 = std::mem::size_of::<Node>() as u64;

/// A persistent first-in first-out queue of byte strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queue {
    header: PPtr<QueueHeader>,
}

impl Queue {
    /// Creates an empty queue.
    pub fn create(tx: &mut Tx<'_>) -> Result<Queue, Error> {
        Ok(Queue {
            header: tx.alloc(QueueHeader {
                head: 0,
                tail: 0,
                len: 0,
            })?,
        })
    }

    /// The queue stored at `header`.
    pub fn from_pointer(header: u64) -> Queue {
        Queue {
            header: PPtr::from_offset(header),
        }
    }

    /// The persistent pointer to store to find the queue again.
    pub fn pointer(&self) -> u64 {
        self.header.offset()
    }

    /// Number of elements.
    pub fn len(&self, tx: &mut Tx<'_>) -> Result<u64, Error> {
        tx.read(pfield!(self.header, QueueHeader, len))
    }

    /// Whether the queue is empty.
    pub fn is_empty(&self, tx: &mut Tx<'_>) -> Result<bool, Error> {
        Ok(self.len(tx)? == 0)
    }

    /// Appends `value` at the back.
    pub fn push(&self, tx: &mut Tx<'_>, value: &[u8]) -> Result<(), Error> {
        let at = tx.alloc_bytes(NODE + value.len() as u64)?;
        tx.write_bytes(
            at,
            bytemuck::bytes_of(&Node {
                next: 0,
                len: value.len() as u64,
            }),
        )?;
        tx.write_bytes(at + NODE, value)?;
        let mut h = tx.read(self.header)?;
        if h.tail == 0 {
            h.head = at;
        } else {
            tx.write(pfield!(PPtr::<Node>::from_offset(h.tail), Node, next), &at)?;
        }
        h.tail = at;
        h.len += 1;
        tx.write(self.header, &h)
    }

    /// Removes and returns the front element.
    pub fn pop(&self, tx: &mut Tx<'_>) -> Result<Option<Vec<u8>>, Error> {
        let mut h = tx.read(self.header)?;
        if h.head == 0 {
            return Ok(None);
        }
        let node: Node = tx.read(PPtr::from_offset(h.head))?;
        let mut v = vec![0u8; node.len as usize];
        tx.read_bytes(h.head + NODE, &mut v)?;
        tx.free(PPtr::<Node>::from_offset(h.head))?;
        h.head = node.next;
        if h.head == 0 {
            h.tail = 0;
        }
        h.len -= 1;
        tx.write(self.header, &h)?;
        Ok(Some(v))
    }
}
