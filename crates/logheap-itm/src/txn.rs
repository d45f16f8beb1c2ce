//! A thread's transaction: its logheap transaction on the TM pool, the undo log of the
//! other memory it writes, its user actions and allocations, and the context
//! (`JmpBuf`) its outermost `_ITM_beginTransaction` returns to on a restart.
//!
//! Nesting is flat (as in libitm for transactions that cannot be cancelled alone): an
//! inner transaction joins the outermost, and a conflict anywhere restarts the
//! outermost.
//!
//! **Jumps.** A restart or a cancel returns to `_ITM_beginTransaction`'s caller with
//! [`jump::longjmp`], from inside a barrier or a commit: the Rust frames it leaves
//! (the barrier's and this module's) hold nothing with a destructor at that point:
//! every borrow and owned value is dropped or forgotten first (`restart` and `cancel`
//! end in the jump with only plain values live).

use std::cell::UnsafeCell;
use std::ffi::c_void;

use logheap::{Error, Transaction};

use crate::jump::{self, JmpBuf};
use crate::pool;
use crate::serial::SERIAL;

/// `_ITM_beginTransaction`'s answers (libitm.h's `_ITM_actions`).
pub(crate) const RUN_INSTRUMENTED: u32 = 0x01;
const SAVE_LIVE_VARIABLES: u32 = 0x04;
const RESTORE_LIVE_VARIABLES: u32 = 0x08;
const ABORT_TRANSACTION: u32 = 0x10;

/// A user action: a function and its argument.
pub(crate) type Action = (unsafe extern "C" fn(*mut c_void), *mut c_void);

/// The thread's transaction state.
pub(crate) struct Desc {
    /// Depth of flat nesting (0: no transaction).
    pub nesting: u32,
    /// Where a restart returns: the outermost `_ITM_beginTransaction`'s context.
    jb: JmpBuf,
    /// The transaction on the TM pool.
    pub tx: Option<Transaction<'static>>,
    /// Holding the serial lock exclusively (irrevocable: nothing else runs).
    pub serial: bool,
    /// The next attempt runs serially.
    pub want_serial: bool,
    /// Undo log of memory outside the pool: (address, length, offset in `undo_bytes`).
    undo: Vec<(usize, usize, usize)>,
    undo_bytes: Vec<u8>,
    /// `_ITM_malloc`'d blocks (freed if the transaction does not commit) and
    /// `_ITM_free`'d ones (freed when it commits).
    pub mallocs: Vec<*mut c_void>,
    pub frees: Vec<*mut c_void>,
    pub commit_actions: Vec<Action>,
    pub undo_actions: Vec<Action>,
    /// Attempts of the current transaction (for the backoff).
    attempts: u32,
    /// The transaction's id (`_ITM_getTransactionId`).
    pub id: u64,
}

thread_local! {
    static DESC: UnsafeCell<Desc> = const {
        UnsafeCell::new(Desc {
            nesting: 0,
            jb: JmpBuf::ZERO,
            tx: None,
            serial: false,
            want_serial: false,
            undo: Vec::new(),
            undo_bytes: Vec::new(),
            mallocs: Vec::new(),
            frees: Vec::new(),
            commit_actions: Vec::new(),
            undo_actions: Vec::new(),
            attempts: 0,
            id: 0,
        })
    };
}

/// Runs `f` on the thread's descriptor. `f` must not call back into the runtime (no
/// user code, no barrier): the descriptor is borrowed only for its duration.
pub(crate) fn with_desc<R>(f: impl FnOnce(&mut Desc) -> R) -> R {
    // SAFETY: thread-local, and never borrowed twice: `f` does not re-enter (the
    // runtime calls user code, which may run transactions, only outside `with_desc`).
    DESC.with(|d| f(unsafe { &mut *d.get() }))
}

/// The thread's descriptor's raw address (for the jump buffer, read by the jump
/// after every borrow is gone).
fn desc_ptr() -> *mut Desc {
    DESC.with(|d| d.get())
}

/// Ends the process on an error a transaction cannot report (no return path exists
/// out of `__transaction_atomic` but commit, restart or cancel), as libitm does.
#[cold]
pub(crate) fn fatal(what: &str) -> ! {
    eprintln!("logheap-itm: {what}");
    std::process::abort()
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(2);

/// Starts an attempt of an outermost transaction: takes the serial lock, begins the
/// pool transaction.
fn start_attempt(d: &mut Desc) {
    if d.want_serial {
        SERIAL.lock_exclusive();
        d.serial = true;
    } else {
        SERIAL.lock_shared();
    }
    d.tx = pool::begin();
}

/// `_ITM_beginTransaction`'s work, called by its assembly with the caller's context.
pub(crate) extern "C" fn begin_transaction(_properties: u32, jb: *const JmpBuf) -> u32 {
    with_desc(|d| {
        if d.nesting > 0 {
            d.nesting += 1;
            return RUN_INSTRUMENTED;
        }
        // SAFETY: the assembly passes its stack copy of the context, valid now.
        d.jb = unsafe { *jb };
        d.nesting = 1;
        d.attempts = 0;
        d.id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        start_attempt(d);
        RUN_INSTRUMENTED | SAVE_LIVE_VARIABLES
    })
}

/// Puts memory outside the pool back as it was (newest first), skipping what lay in
/// the stack frames the jump discards (below `_ITM_beginTransaction`'s caller's frame
/// and above this one: those frames are gone after the jump, or being used now).
fn restore_undo(d: &mut Desc) {
    let here = &d as *const _ as usize;
    let cfa = d.jb.cfa as usize;
    for &(addr, len, at) in d.undo.iter().rev() {
        if addr >= here && addr < cfa {
            continue;
        }
        // SAFETY: the bytes were read from `addr` when it was first written in this
        // transaction; the program still owns that memory (it is not in a discarded
        // frame).
        unsafe {
            std::ptr::copy_nonoverlapping(d.undo_bytes.as_ptr().add(at), addr as *mut u8, len)
        };
    }
    d.undo.clear();
    d.undo_bytes.clear();
}

/// Undoes an attempt: the pool transaction aborted, other memory restored, blocks it
/// allocated freed, the serial lock given back. Returns the user undo actions to run
/// (outside the descriptor's borrow).
fn roll_back(d: &mut Desc) -> Vec<Action> {
    if let Some(tx) = d.tx.take() {
        tx.abort();
    }
    restore_undo(d);
    for p in d.mallocs.drain(..) {
        // SAFETY: allocated by `_ITM_malloc` in this attempt and not freed.
        unsafe { libc::free(p) };
    }
    d.frees.clear();
    d.commit_actions.clear();
    release_serial(d);
    std::mem::take(&mut d.undo_actions)
}

fn release_serial(d: &mut Desc) {
    if d.serial {
        d.serial = false;
        SERIAL.unlock_exclusive();
    } else {
        SERIAL.unlock_shared();
    }
}

/// Runs user actions (outside any borrow of the descriptor).
fn run(actions: Vec<Action>) {
    for (f, arg) in actions {
        // SAFETY: registered by the program with this argument, for this moment.
        unsafe { f(arg) };
    }
}

/// Waits before attempt `n` of a transaction.
fn backoff(n: u32) {
    if n < 8 {
        for _ in 0..(1u32 << n) * 16 {
            std::hint::spin_loop();
        }
    } else {
        std::thread::yield_now();
    }
}

/// Restarts the outermost transaction after a conflict (or to run it serially): rolls
/// the attempt back, begins the next, and returns to `_ITM_beginTransaction`'s caller.
#[cold]
pub(crate) fn restart() -> ! {
    let (undo, attempts) = with_desc(|d| {
        let undo = roll_back(d);
        d.nesting = 1;
        d.attempts += 1;
        // Many conflicts in a row: run alone, where nothing conflicts.
        if d.attempts >= 100 {
            d.want_serial = true;
        }
        (undo, d.attempts)
    });
    run(undo);
    backoff(attempts);
    with_desc(start_attempt);
    let jb: *const JmpBuf = desc_jb();
    // SAFETY: the context of the outermost `_ITM_beginTransaction`, whose caller's
    // frame is live (the transaction runs inside it); nothing with a destructor is
    // live in the frames left (see the module's documentation).
    unsafe { jump::longjmp(RUN_INSTRUMENTED | RESTORE_LIVE_VARIABLES, jb) }
}

/// Cancels the outermost transaction (`__transaction_cancel`): rolls it back and
/// returns to `_ITM_beginTransaction`'s caller, which skips the transaction.
pub(crate) fn cancel() -> ! {
    let undo = with_desc(|d| {
        let undo = roll_back(d);
        d.nesting = 0;
        d.want_serial = false;
        undo
    });
    run(undo);
    let jb = desc_jb();
    // SAFETY: as in `restart`.
    unsafe { jump::longjmp(ABORT_TRANSACTION | RESTORE_LIVE_VARIABLES, jb) }
}

fn desc_jb() -> *const JmpBuf {
    // SAFETY: a field address of the thread's descriptor; read by the jump only.
    unsafe { &raw const (*desc_ptr()).jb }
}

/// Commits (the outermost transaction; an inner one only leaves). A conflict
/// restarts the transaction; any other error of the pool ends the process.
pub(crate) fn commit() {
    enum Outcome {
        Inner,
        Committed(Vec<Action>, Vec<*mut c_void>),
        Conflict,
        Failed(Error),
    }
    let outcome = with_desc(|d| {
        if d.nesting == 0 {
            fatal("_ITM_commitTransaction outside a transaction");
        }
        if d.nesting > 1 {
            d.nesting -= 1;
            return Outcome::Inner;
        }
        let result = d.tx.take().map_or(Ok(()), |tx| tx.commit());
        match result {
            Ok(()) => {
                d.undo.clear();
                d.undo_bytes.clear();
                d.mallocs.clear();
                d.undo_actions.clear();
                d.nesting = 0;
                d.want_serial = false;
                release_serial(d);
                Outcome::Committed(
                    std::mem::take(&mut d.commit_actions),
                    std::mem::take(&mut d.frees),
                )
            }
            Err(Error::Conflict { .. }) => Outcome::Conflict,
            Err(e) => Outcome::Failed(e),
        }
    });
    match outcome {
        Outcome::Inner => {}
        Outcome::Committed(actions, frees) => {
            for p in frees {
                // SAFETY: freed by the program in the transaction, which committed.
                unsafe { libc::free(p) };
            }
            run(actions);
        }
        Outcome::Conflict => restart(),
        Outcome::Failed(e) => fatal(&format!("a transaction cannot commit: {e}")),
    }
}

/// Saves `len` bytes at `addr` (outside the pool) in the undo log before they are
/// written.
pub(crate) fn log_volatile(d: &mut Desc, addr: usize, len: usize) {
    let at = d.undo_bytes.len();
    d.undo_bytes.resize(at + len, 0);
    // SAFETY: the program is about to write these bytes, so it may read them.
    unsafe {
        std::ptr::copy_nonoverlapping(addr as *const u8, d.undo_bytes.as_mut_ptr().add(at), len)
    };
    d.undo.push((addr, len, at));
}

/// Whether the thread runs a transaction.
pub(crate) fn in_transaction() -> bool {
    with_desc(|d| d.nesting > 0)
}
