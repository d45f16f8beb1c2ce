//! Little-endian fields of the byte tables the pool formats are made of.

/// The `u32` stored little-endian at `b[at..at + 4]` (the caller checked the range).
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// The `u64` stored little-endian at `b[at..at + 8]` (the caller checked the range).
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}
