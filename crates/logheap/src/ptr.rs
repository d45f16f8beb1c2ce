//! Persistent pointers.

use std::fmt;
use std::marker::PhantomData;

/// A pointer into a pool's home space: a 64-bit offset, valid across runs and mapping
/// addresses. Null is 0. `PPtr<T>` is itself plain data, so it can be stored in
/// persistent objects.
#[repr(transparent)]
pub struct PPtr<T> {
    offset: u64,
    _type: PhantomData<fn() -> T>,
}

impl<T> PPtr<T> {
    /// The null pointer.
    pub const fn null() -> Self {
        PPtr {
            offset: 0,
            _type: PhantomData,
        }
    }

    /// A pointer to the home offset `offset`.
    pub const fn from_offset(offset: u64) -> Self {
        PPtr {
            offset,
            _type: PhantomData,
        }
    }

    /// The home offset.
    pub const fn offset(self) -> u64 {
        self.offset
    }

    /// Whether this is the null pointer.
    pub const fn is_null(self) -> bool {
        self.offset == 0
    }

    /// The same offset viewed as another type.
    pub const fn cast<U>(self) -> PPtr<U> {
        PPtr::from_offset(self.offset)
    }

    /// A pointer to a field at `field_offset` within `*self`; use the [`pfield!`](crate::pfield)
    /// macro, which computes the offset and the field type for you.
    #[doc(hidden)]
    pub fn project<F>(self, field_offset: usize, _field: fn(&T) -> &F) -> PPtr<F> {
        PPtr::from_offset(self.offset + field_offset as u64)
    }
}

/// A typed pointer to a field of a persistent object, without `unsafe`:
/// `pfield!(node, Node, next)` is a `PPtr` to `node`'s `next` field.
#[macro_export]
macro_rules! pfield {
    ($ptr:expr, $Type:ty, $field:ident) => {{
        let base: $crate::PPtr<$Type> = $ptr;
        base.project(::core::mem::offset_of!($Type, $field), |t: &$Type| {
            &t.$field
        })
    }};
}

impl<T> Clone for PPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for PPtr<T> {}
impl<T> PartialEq for PPtr<T> {
    fn eq(&self, other: &Self) -> bool {
        self.offset == other.offset
    }
}
impl<T> Eq for PPtr<T> {}
impl<T> std::hash::Hash for PPtr<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.offset.hash(state)
    }
}
impl<T> PartialOrd for PPtr<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for PPtr<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.offset.cmp(&other.offset)
    }
}
impl<T> Default for PPtr<T> {
    fn default() -> Self {
        Self::null()
    }
}
impl<T> fmt::Debug for PPtr<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PPtr({:#x})", self.offset)
    }
}

// SAFETY: PPtr is a transparent u64 (PhantomData is a zero-sized, alignment-1 field), so
// every bit pattern is valid and all-zero is the null pointer.
unsafe impl<T: 'static> bytemuck::Zeroable for PPtr<T> {}
// SAFETY: as above; no padding, no interior pointers, Copy.
unsafe impl<T: 'static> bytemuck::Pod for PPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    struct Node {
        key: u64,
        next: PPtr<Node>,
        val: [u8; 16],
    }

    #[test]
    fn field_projection_has_the_right_offset_and_type() {
        let n: PPtr<Node> = PPtr::from_offset(4096);
        let next: PPtr<PPtr<Node>> = pfield!(n, Node, next);
        assert_eq!(next.offset(), 4104);
        let val: PPtr<[u8; 16]> = pfield!(n, Node, val);
        assert_eq!(val.offset(), 4112);
        assert!(PPtr::<Node>::null().is_null());
        assert_eq!(bytemuck::bytes_of(&n), &4096u64.to_le_bytes());
    }
}
