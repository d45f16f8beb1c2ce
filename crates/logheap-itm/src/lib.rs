//! `liblogheap_itm`: a GNU TM runtime (the ABI of GCC's libitm) whose transactions
//! persist in a logheap pool.
//!
//! C code with `__transaction_atomic { ... }`, compiled with `gcc -fgnu-tm` and linked
//! against this library instead of libitm (link without `-fgnu-tm`, which would add
//! `-litm`), runs its transactions as logheap transactions on the process's TM pool
//! (`lh_tm_open`, in `include/logheap_tm.h`): the "Log-structured Non-volatile Main
//! Memory" paper's own way of use (§4.1: compiler-instrumented transactions, a
//! runtime that makes them persistent), and Mnemosyne's.
//!
//! - Bytes in the pool are read and written through the pool's transaction: isolated
//!   from other threads' transactions, durable when the transaction commits, undone
//!   by a crash before. A conflict restarts the transaction (`_ITM_beginTransaction`
//!   returns again).
//! - Other memory (the stack, the C heap) is written in place, its old bytes kept in
//!   an undo log for a restart or `__transaction_cancel`, as Mnemosyne does. It is
//!   *not* isolated: it should be private to the thread while a transaction runs.
//! - The pool is mapped at a fixed address, the same at every open, so it may hold
//!   plain pointers into itself. Its engine is `redo` or `undo`, whose objects live at
//!   their home: outside transactions, plain loads read the committed bytes. (The
//!   other engines keep the newest bytes in a log or an update slot; `lh_tm_open`
//!   refuses them.)
//! - Allocation in the pool: `lh_tm_alloc` and `lh_tm_free`, `transaction_pure`, part
//!   of the transaction that calls them.
//! - Nesting is flat; `_ITM_changeTransactionMode` (a call of a function without a
//!   transactional clone) restarts the transaction serially: alone, so it cannot
//!   conflict with another GNU TM transaction and never restarts after the call.
//!
//! The whole exported set of libitm's `libitm.map` is here (barriers of every type,
//! including the 256-bit vectors `-O3 -mavx` code uses, the `memcpy`, `memmove` and
//! `memset` families, allocation, user actions, the clone tables, the C++ hooks).
//! x86-64 only.

#![cfg(target_arch = "x86_64")]

pub mod abi;
pub mod barriers;
pub mod jump;
pub mod pool;
mod serial;
mod txn;
