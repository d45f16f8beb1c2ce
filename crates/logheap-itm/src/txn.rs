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

/// `_ITM_beginTransaction`'s properties (libitm.h's `_ITM_codeProperties`) read here.
const PR_INSTRUMENTED_CODE: u32 = 0x0001;
const PR_DOES_GO_IRREVOCABLE: u32 = 0x0040;
/// Run the code GCC left without barriers.
const RUN_UNINSTRUMENTED: u32 = 0x02;

/// `_ITM_beginTransaction`'s work, called by its assembly with the caller's context.
///
/// A transaction that goes irrevocable, or that GCC compiled without barriers at all
/// (a `__transaction_relaxed` block calling unsafe code), runs serially: alone, holding
/// the serial lock exclusively. Without barriers its stores, to the pool too, are
/// plain stores: isolated (nothing else runs) but not part of the pool transaction, so
/// not undone by a crash before they are written back.
pub(crate) extern "C" fn begin_transaction(properties: u32, jb: *const JmpBuf) -> u32 {
    let instrumented = properties & PR_INSTRUMENTED_CODE != 0;
    let goes_serial = !instrumented || properties & PR_DOES_GO_IRREVOCABLE != 0;
    let (action, must_restart) = with_desc(|d| {
        if d.nesting > 0 {
            d.nesting += 1;
            if goes_serial && !d.serial {
                // The outermost must start again, alone.
                d.want_serial = true;
                return (0, true);
            }
            let action = if instrumented {
                RUN_INSTRUMENTED
            } else {
                RUN_UNINSTRUMENTED
            };
            return (action, false);
        }
        // SAFETY: the assembly passes its stack copy of the context, valid now.
        d.jb = unsafe { *jb };
        d.nesting = 1;
        d.attempts = 0;
        d.id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        d.want_serial |= goes_serial;
        start_attempt(d);
        if instrumented {
            (RUN_INSTRUMENTED | SAVE_LIVE_VARIABLES, false)
        } else {
            (RUN_UNINSTRUMENTED, false)
        }
    });
    if must_restart {
        restart();
    }
    action
}

/// The lowest address of the calling thread's stack (from its attributes; 0 when
/// they cannot be read, which makes the restore keep away from nothing below `cfa`
/// but the frames above it, see `restore_undo`).
fn stack_low() -> usize {
    thread_local! {
        static LOW: usize = {
            // SAFETY: `attr` is initialised by `pthread_getattr_np` before it is read
            // and destroyed after; the out-pointers are valid locals.
            unsafe {
                let mut attr: libc::pthread_attr_t = std::mem::zeroed();
                let mut addr: *mut c_void = std::ptr::null_mut();
                let mut size: libc::size_t = 0;
                let ok = libc::pthread_getattr_np(libc::pthread_self(), &mut attr) == 0;
                let got = ok && libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
                if ok {
                    libc::pthread_attr_destroy(&mut attr);
                }
                if got { addr as usize } else { 0 }
            }
        };
    }
    LOW.with(|l| *l)
}

/// Puts memory outside the pool back as it was (newest first). The thread's stack
/// below the CFA of `_ITM_beginTransaction`'s caller is left alone: the frames there
/// are the transaction's own callees, gone after the jump, or the runtime's, in use
/// now (an entry reaching above the CFA has only that part restored).
fn restore_undo(d: &mut Desc) {
    let cfa = d.jb.cfa as usize;
    let low = match stack_low() {
        0 => cfa.saturating_sub(8 << 20),
        l => l,
    };
    for &(addr, len, at) in d.undo.iter().rev() {
        let end = addr + len;
        // The part of [addr, end) outside [low, cfa).
        let (from, to) = if end <= low || addr >= cfa {
            (addr, end)
        } else if addr >= low && end <= cfa {
            continue;
        } else if addr < low {
            (addr, low.min(end))
        } else {
            (cfa, end)
        };
        // SAFETY: the bytes were read from there when first written in this
        // transaction; the program still owns that memory (outside the discarded and
        // in-use stack frames).
        unsafe {
            std::ptr::copy_nonoverlapping(
                d.undo_bytes.as_ptr().add(at + (from - addr)),
                from as *mut u8,
                to - from,
            )
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
    // Newest first, as libitm runs them.
    let mut undo = std::mem::take(&mut d.undo_actions);
    undo.reverse();
    undo
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
    let (undo, attempts, jb) = with_desc(|d| {
        let undo = roll_back(d);
        // The user undo actions run outside any transaction (they may run their own).
        d.nesting = 0;
        d.attempts += 1;
        // Many conflicts in a row: run alone, where nothing conflicts.
        if d.attempts >= 100 {
            d.want_serial = true;
        }
        (undo, d.attempts, d.jb)
    });
    run(undo);
    backoff(attempts);
    with_desc(|d| {
        d.jb = jb;
        d.nesting = 1;
        start_attempt(d);
    });
    // SAFETY: the context of the outermost `_ITM_beginTransaction`, whose caller's
    // frame is live (the transaction runs inside it), read whole before the jump leaves
    // this frame; nothing with a destructor is live in the frames left (see the
    // module's documentation).
    unsafe { jump::longjmp(RUN_INSTRUMENTED | RESTORE_LIVE_VARIABLES, &jb) }
}

/// Cancels the outermost transaction (`__transaction_cancel`): rolls it back and
/// returns to `_ITM_beginTransaction`'s caller, which skips the transaction.
pub(crate) fn cancel() -> ! {
    let (undo, jb) = with_desc(|d| {
        if d.serial {
            fatal("__transaction_cancel in a serial irrevocable transaction");
        }
        let undo = roll_back(d);
        d.nesting = 0;
        d.want_serial = false;
        (undo, d.jb)
    });
    // The context is kept here: an undo action may run a transaction of its own.
    run(undo);
    // SAFETY: as in `restart`; `jb` is read whole before the jump leaves this frame.
    unsafe { jump::longjmp(ABORT_TRANSACTION | RESTORE_LIVE_VARIABLES, &jb) }
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
