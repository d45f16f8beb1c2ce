//! The two pieces of GNU TM's ABI that need assembly (x86-64 only): saving the caller's
//! context in `_ITM_beginTransaction`, which returns more than once, like `setjmp`,
//! and jumping back to it; and the barriers of `long double` values, which travel on
//! the x87 stack and the call stack, where Rust has no type for them.
//!
//! The context and its layout follow libitm's (`config/x86/sjlj.S`): the caller's
//! stack pointer as it will be after the return (its CFA), the callee-saved
//! registers, and the return address, which is already on the stack where the buffer
//! ends.

use core::arch::naked_asm;

/// A saved context: the CFA, `rbx`, `rbp`, `r12`..`r15`, the return address.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct JmpBuf {
    pub cfa: u64,
    rbx: u64,
    rbp: u64,
    r12: u64,
    r13: u64,
    r14: u64,
    r15: u64,
    rip: u64,
}

impl JmpBuf {
    /// No context.
    pub(crate) const ZERO: JmpBuf = JmpBuf {
        cfa: 0,
        rbx: 0,
        rbp: 0,
        r12: 0,
        r13: 0,
        r14: 0,
        r15: 0,
        rip: 0,
    };
}

/// Begins a transaction: saves the caller's context and returns what to run
/// (`_ITM_actions`); returns again, with other actions, when the transaction restarts
/// or is cancelled. (GCC declares it variadic; only the first argument is read.)
///
/// # Safety
/// Called by code GCC generates for `__transaction_atomic`.
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn _ITM_beginTransaction(properties: u32) -> u32 {
    naked_asm!(
        // rax: the CFA; the buffer is the 64 bytes below it (its last word is the
        // return address, in place). 72 bytes keep the stack 16-byte aligned.
        "lea rax, [rsp + 8]",
        "sub rsp, 72",
        "mov [rax - 64], rax",
        "mov [rax - 56], rbx",
        "mov [rax - 48], rbp",
        "mov [rax - 40], r12",
        "mov [rax - 32], r13",
        "mov [rax - 24], r14",
        "mov [rax - 16], r15",
        "lea rsi, [rax - 64]",
        "call {begin}",
        "add rsp, 72",
        "ret",
        begin = sym crate::txn::begin_transaction,
    )
}

/// Returns `action` from the `_ITM_beginTransaction` whose context `jb` holds.
///
/// # Safety
/// `jb` holds the context of an `_ITM_beginTransaction` whose caller's frame is still
/// live; the frames jumped over hold nothing with a destructor.
#[unsafe(naked)]
pub(crate) unsafe extern "C" fn longjmp(action: u32, jb: *const JmpBuf) -> ! {
    naked_asm!(
        "mov rcx, [rsi]",
        "mov rbx, [rsi + 8]",
        "mov rbp, [rsi + 16]",
        "mov r12, [rsi + 24]",
        "mov r13, [rsi + 32]",
        "mov r14, [rsi + 40]",
        "mov r15, [rsi + 48]",
        "mov rdx, [rsi + 56]",
        "mov eax, edi",
        "mov rsp, rcx",
        "jmp rdx",
    )
}

/// Read barriers of `long double` (`E`, returned in `st(0)`) and `long double
/// _Complex` (`CE`, in `st(0)` and `st(1)`), by name.
macro_rules! x87_reads {
    ($($name:ident: $bytes:literal),+ $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: a transactional read of a `long double` (or its complex).")]
        ///
        /// # Safety
        /// Called by GCC-instrumented code with a readable address.
        #[unsafe(no_mangle)]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name(address: *const u8) {
            naked_asm!(
                "sub rsp, 40",
                "mov rsi, rdi",
                "mov rdi, rsp",
                concat!("mov edx, ", $bytes),
                "call {read}",
                concat!(".if ", $bytes, " == 32"),
                "fld tbyte ptr [rsp + 16]",
                ".endif",
                "fld tbyte ptr [rsp]",
                "add rsp, 40",
                "ret",
                read = sym crate::barriers::lh_itm_read,
            )
        }
    )+};
}

/// Write barriers of `long double` and its complex, whose value is on the stack.
macro_rules! x87_writes {
    ($($name:ident: $bytes:literal),+ $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: a transactional write of a `long double` (or its complex).")]
        ///
        /// # Safety
        /// Called by GCC-instrumented code with a writable address.
        #[unsafe(no_mangle)]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name(address: *mut u8) {
            naked_asm!(
                // The value is at rsp + 8 (passed in memory).
                "lea rsi, [rsp + 8]",
                concat!("mov edx, ", $bytes),
                "sub rsp, 8",
                "call {write}",
                "add rsp, 8",
                "ret",
                write = sym crate::barriers::lh_itm_write,
            )
        }
    )+};
}

x87_reads!(
    _ITM_RE: 16, _ITM_RaRE: 16, _ITM_RaWE: 16, _ITM_RfWE: 16,
    _ITM_RCE: 32, _ITM_RaRCE: 32, _ITM_RaWCE: 32, _ITM_RfWCE: 32,
);
x87_writes!(
    _ITM_WE: 16, _ITM_WaRE: 16, _ITM_WaWE: 16,
    _ITM_WCE: 32, _ITM_WaRCE: 32, _ITM_WaWCE: 32,
);
