//! CPU persistence primitives: cache-line write-back, store fence, non-temporal copy and
//! the time-stamp counter.
//!
//! Rust exposes `clflush` and `sfence` as intrinsics but not `clwb` or `clflushopt`, so
//! those two are issued with inline assembly. The instruction is chosen at run time from
//! CPUID leaf 7 (EBX bit 24 = clwb, bit 23 = clflushopt) unless a configuration forces one.

use std::fmt;
use std::str::FromStr;

/// Size of a CPU cache line, the unit of write-back and of the crash model.
pub const CACHE_LINE: usize = 64;

/// The instruction used to write a cache line back to the persistence domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushInstruction {
    /// `clwb`: writes the line back and may keep it cached (best).
    Clwb,
    /// `clflushopt`: writes back and invalidates; weakly ordered (needs a fence).
    Clflushopt,
    /// `clflush`: writes back and invalidates; strongly ordered (oldest, slowest).
    Clflush,
}

impl FlushInstruction {
    /// Every instruction, best first.
    pub const ALL: [FlushInstruction; 3] = [Self::Clwb, Self::Clflushopt, Self::Clflush];

    /// The lower-case mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            Self::Clwb => "clwb",
            Self::Clflushopt => "clflushopt",
            Self::Clflush => "clflush",
        }
    }

    /// Whether this CPU executes the instruction.
    pub fn is_supported(self) -> bool {
        let caps = cpu_caps();
        match self {
            Self::Clwb => caps.clwb,
            Self::Clflushopt => caps.clflushopt,
            Self::Clflush => caps.clflush,
        }
    }

    /// The best instruction this CPU offers (`clwb` > `clflushopt` > `clflush`).
    ///
    /// On a CPU without any of them (not x86-64) this returns `Clflush`, which then
    /// degrades to a compiler fence: such machines have no user-level line write-back.
    pub fn detect() -> FlushInstruction {
        Self::ALL
            .into_iter()
            .find(|i| i.is_supported())
            .unwrap_or(Self::Clflush)
    }
}

impl fmt::Display for FlushInstruction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FlushInstruction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|i| i.name() == s)
            .ok_or_else(|| format!("unknown flush instruction {s:?} (clwb, clflushopt, clflush)"))
    }
}

#[derive(Debug, Clone, Copy)]
struct CpuCaps {
    clwb: bool,
    clflushopt: bool,
    clflush: bool,
}

fn cpu_caps() -> CpuCaps {
    static CAPS: std::sync::OnceLock<CpuCaps> = std::sync::OnceLock::new();
    *CAPS.get_or_init(read_cpu_caps)
}

#[cfg(target_arch = "x86_64")]
fn read_cpu_caps() -> CpuCaps {
    use std::arch::x86_64::__cpuid_count;
    // SAFETY: CPUID exists on every x86-64 CPU; leaves 0, 1 and 7 are architectural.
    #[allow(unused_unsafe)]
    let (max_leaf, leaf1_edx) = unsafe { (__cpuid_count(0, 0).eax, __cpuid_count(1, 0).edx) };
    let leaf7_ebx = if max_leaf >= 7 {
        // SAFETY: leaf 7 is below the maximum leaf reported by leaf 0.
        #[allow(unused_unsafe)]
        unsafe {
            __cpuid_count(7, 0).ebx
        }
    } else {
        0
    };
    CpuCaps {
        clwb: leaf7_ebx & (1 << 24) != 0,
        clflushopt: leaf7_ebx & (1 << 23) != 0,
        clflush: leaf1_edx & (1 << 19) != 0,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn read_cpu_caps() -> CpuCaps {
    CpuCaps {
        clwb: false,
        clflushopt: false,
        clflush: false,
    }
}

/// Writes back every cache line that overlaps `[ptr, ptr + len)`.
///
/// # Safety
/// The range must lie inside one live mapping owned by the caller.
#[inline]
pub(crate) unsafe fn flush_range(instr: FlushInstruction, ptr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let start = (ptr as usize) & !(CACHE_LINE - 1);
    let end = ptr as usize + len;
    let mut line = start;
    while line < end {
        // SAFETY: `line` is the start of a cache line overlapping the caller's mapped range.
        unsafe { flush_line(instr, line as *const u8) };
        line += CACHE_LINE;
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn flush_line(instr: FlushInstruction, line: *const u8) {
    match instr {
        // SAFETY: clwb only reads the address; the caller guarantees it is mapped.
        FlushInstruction::Clwb => unsafe {
            std::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags));
        },
        // SAFETY: as above, for clflushopt.
        FlushInstruction::Clflushopt => unsafe {
            std::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags));
        },
        // SAFETY: clflush of a mapped address; the intrinsic is available on all x86-64.
        FlushInstruction::Clflush => unsafe { std::arch::x86_64::_mm_clflush(line) },
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
unsafe fn flush_line(_instr: FlushInstruction, _line: *const u8) {
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Store fence: orders earlier flushes and non-temporal stores before later stores.
#[inline]
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no operands and no memory-safety preconditions.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Copies `src` to `dst` with non-temporal (cache-bypassing) stores where alignment allows.
/// Returns how many bytes went out non-temporally; the rest (an unaligned head and tail of
/// less than 16 bytes each) was stored through the cache and must be flushed by the caller.
///
/// # Safety
/// `dst..dst + src.len()` must be writable mapped memory that does not overlap `src`.
pub(crate) unsafe fn copy_nontemporal(dst: *mut u8, src: &[u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let len = src.len();
        let head = ((16 - (dst as usize) % 16) % 16).min(len);
        // SAFETY: the head lies within the caller's destination range.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head) };
        let mut done = head;
        while len - done >= 16 {
            // SAFETY: `dst + done` is 16-aligned and 16 bytes of both buffers remain;
            // the unaligned load reads inside `src`.
            unsafe {
                let v = _mm_loadu_si128(src.as_ptr().add(done) as *const __m128i);
                _mm_stream_si128(dst.add(done) as *mut __m128i, v);
            }
            done += 16;
        }
        // SAFETY: the tail lies within the caller's destination range.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(done), dst.add(done), len - done) };
        len - head - (len - done)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller guarantees the destination range.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        0
    }
}

/// Reads the time-stamp counter (a cheap monotonic tick count on invariant-TSC CPUs).
#[inline]
pub(crate) fn read_tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no memory-safety preconditions.
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detect_returns_a_supported_instruction_on_x86() {
        let i = FlushInstruction::detect();
        if cfg!(target_arch = "x86_64") {
            assert!(i.is_supported(), "{i} is not supported");
        }
        assert_eq!(i.name().parse::<FlushInstruction>().unwrap(), i);
        assert!("clzero".parse::<FlushInstruction>().is_err());
    }

    #[test]
    fn nontemporal_copy_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for offset in 0..17 {
            for len in [0, 1, 15, 16, 17, 63, 64, 65, 200, 283] {
                let mut dst = vec![0u8; 320];
                // SAFETY: dst has room for offset + len <= 300 bytes; no overlap.
                let nt = unsafe { copy_nontemporal(dst.as_mut_ptr().add(offset), &src[..len]) };
                store_fence();
                assert_eq!(&dst[offset..offset + len], &src[..len]);
                assert!(dst[..offset].iter().all(|&b| b == 0));
                assert!(nt <= len && nt % 16 == 0);
            }
        }
    }
}
