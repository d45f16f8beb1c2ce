//! The rest of GNU TM's ABI (libitm's `libitm.map`): commit and abort, the clone
//! tables, user actions, memory allocation, the transaction mode, queries, errors, and
//! the C++ exception and `operator new`/`delete` hooks.

use std::ffi::{c_char, c_int, c_void};
use std::sync::RwLock;

use crate::txn::{self, Action, fatal, with_desc};

/// `_ITM_commitTransaction`: commits the transaction (an inner one only leaves). A
/// conflict restarts it.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_commitTransaction() {
    txn::commit();
}

/// `_ITM_commitTransactionEH`: commits while a C++ exception is in flight.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_commitTransactionEH(_exception: *mut c_void) {
    txn::commit();
}

/// `_ITM_abortTransaction`: `__transaction_cancel`. Flat nesting cancels the
/// outermost transaction; cancelling only an inner one is not supported (as in
/// libitm for flat nesting) and ends the process.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_abortTransaction(reason: c_int) {
    const USER_ABORT: c_int = 1;
    const OUTER_ABORT: c_int = 16;
    let nesting = with_desc(|d| d.nesting);
    if nesting == 0 {
        fatal("_ITM_abortTransaction outside a transaction");
    }
    if reason & USER_ABORT == 0 {
        fatal("_ITM_abortTransaction for a reason other than __transaction_cancel");
    }
    if nesting > 1 && reason & OUTER_ABORT == 0 {
        fatal(
            "cancelling a nested transaction alone is not supported (flat nesting): use __transaction_cancel [[outer]]",
        );
    }
    txn::cancel();
}

/// Transactional clones of functions: `(original, clone)` pairs of every table
/// registered.
static CLONES: RwLock<Vec<(usize, usize, usize)>> = RwLock::new(Vec::new());

/// `_ITM_registerTMCloneTable`: registers `n` pairs `(original, clone)` at `table`.
///
/// # Safety
/// `table` holds `n` pairs of pointers (as GCC's startup code passes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ITM_registerTMCloneTable(table: *const *const c_void, n: usize) {
    let mut clones = CLONES.write().unwrap_or_else(|p| p.into_inner());
    for i in 0..n {
        // SAFETY: `table` has `2 n` pointers.
        let (orig, clone) = unsafe { (*table.add(2 * i), *table.add(2 * i + 1)) };
        clones.push((orig as usize, clone as usize, table as usize));
    }
}

/// `_ITM_deregisterTMCloneTable`: forgets the pairs of `table`.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_deregisterTMCloneTable(table: *const *const c_void) {
    CLONES
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|&(_, _, t)| t != table as usize);
}

fn clone_of(f: *const c_void) -> Option<*const c_void> {
    CLONES
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|&&(orig, _, _)| orig == f as usize)
        .map(|&(_, clone, _)| clone as *const c_void)
}

/// `_ITM_getTMCloneOrIrrevocable`: the transactional clone of `f`; without one, the
/// transaction goes serial irrevocable and `f` itself runs.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_getTMCloneOrIrrevocable(f: *const c_void) -> *const c_void {
    match clone_of(f) {
        Some(clone) => clone,
        None => {
            _ITM_changeTransactionMode(0);
            f
        }
    }
}

/// `_ITM_getTMCloneSafe`: the transactional clone of `f`, which must exist.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_getTMCloneSafe(f: *const c_void) -> *const c_void {
    clone_of(f).unwrap_or_else(|| fatal("a transaction_safe function has no transactional clone"))
}

/// `_ITM_changeTransactionMode`: to serial irrevocable (the only mode asked for):
/// the transaction restarts holding the serial lock alone, where nothing can conflict
/// with it (unless a thread writes the pool outside GNU TM), so it never aborts once
/// it has run code without barriers.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_changeTransactionMode(_mode: c_int) {
    let serial = with_desc(|d| {
        if d.nesting == 0 {
            fatal("_ITM_changeTransactionMode outside a transaction");
        }
        d.serial
    });
    if !serial {
        with_desc(|d| d.want_serial = true);
        txn::restart();
    }
}

/// `_ITM_addUserCommitAction`: runs `f(arg)` when the transaction commits.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_addUserCommitAction(
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    _resuming: u64,
    arg: *mut c_void,
) {
    if let Some(f) = f {
        with_desc(|d| d.commit_actions.push((f, arg) as Action));
    }
}

/// `_ITM_addUserUndoAction`: runs `f(arg)` if the transaction does not commit.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_addUserUndoAction(
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    arg: *mut c_void,
) {
    if let Some(f) = f {
        with_desc(|d| d.undo_actions.push((f, arg) as Action));
    }
}

/// `_ITM_dropReferences`: nothing to drop (no reference is kept past a transaction).
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_dropReferences(_p: *const c_void, _n: usize) {}

/// `_ITM_malloc`: `malloc`, undone if the transaction does not commit.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_malloc(size: usize) -> *mut c_void {
    // SAFETY: plain `malloc`.
    let p = unsafe { libc::malloc(size) };
    if !p.is_null() {
        with_desc(|d| {
            if d.nesting > 0 {
                d.mallocs.push(p);
            }
        });
    }
    p
}

/// `_ITM_calloc`: `calloc`, undone if the transaction does not commit.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_calloc(n: usize, size: usize) -> *mut c_void {
    // SAFETY: plain `calloc`.
    let p = unsafe { libc::calloc(n, size) };
    if !p.is_null() {
        with_desc(|d| {
            if d.nesting > 0 {
                d.mallocs.push(p);
            }
        });
    }
    p
}

/// `_ITM_free`: `free` when the transaction commits (at once outside one).
///
/// # Safety
/// `p` is null or a block of `malloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ITM_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    let deferred = with_desc(|d| {
        if d.nesting > 0 {
            d.frees.push(p);
            true
        } else {
            false
        }
    });
    if !deferred {
        // SAFETY: as the caller promises.
        unsafe { libc::free(p) };
    }
}

/// `_ITM_inTransaction`: 0 outside a transaction, 1 in one that may restart, 2 in a
/// serial irrevocable one.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_inTransaction() -> c_int {
    with_desc(|d| match (d.nesting, d.serial) {
        (0, _) => 0,
        (_, false) => 1,
        (_, true) => 2,
    })
}

/// `_ITM_getTransactionId`: the transaction's id (1, `_ITM_noTransactionId`, outside
/// one).
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_getTransactionId() -> u64 {
    with_desc(|d| if d.nesting == 0 { 1 } else { d.id })
}

/// The ABI version this runtime implements (libitm.h's `_ITM_VERSION_NO`).
const VERSION_NO: c_int = 90;

/// `_ITM_versionCompatible`: whether code built for ABI `version` runs here.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_versionCompatible(version: c_int) -> c_int {
    (version == VERSION_NO) as c_int
}

/// `_ITM_libraryVersion`: this runtime's name and version.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_libraryVersion() -> *const c_char {
    concat!(
        "logheap-itm ",
        env!("CARGO_PKG_VERSION"),
        " (GNU TM ABI 1)\0"
    )
    .as_ptr()
    .cast()
}

/// `_ITM_error`: an error the compiled code found; ends the process.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_error(_location: *const c_void, code: c_int) {
    fatal(&format!("_ITM_error {code}"))
}

/// A function of the C++ runtime, found when first needed (a C program has none).
fn cxx<F: Copy>(name: &std::ffi::CStr) -> F {
    // SAFETY: looks a symbol up in the process.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if f.is_null() {
        fatal(&format!(
            "{} is not in the process (no C++ runtime)",
            name.to_string_lossy()
        ));
    }
    assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
    // SAFETY: `F` is the symbol's function pointer type (each caller names it).
    unsafe { std::mem::transmute_copy(&f) }
}

/// `_ITM_cxa_allocate_exception`: the C++ runtime's, undone if the transaction does
/// not commit.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_cxa_allocate_exception(size: usize) -> *mut c_void {
    let f: unsafe extern "C" fn(usize) -> *mut c_void = cxx(c"__cxa_allocate_exception");
    // SAFETY: the C++ runtime's function.
    unsafe { f(size) }
}

/// `_ITM_cxa_free_exception`: the C++ runtime's.
///
/// # Safety
/// As the C++ runtime's function, which it calls.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ITM_cxa_free_exception(p: *mut c_void) {
    let f: unsafe extern "C" fn(*mut c_void) = cxx(c"__cxa_free_exception");
    // SAFETY: the C++ runtime's function.
    unsafe { f(p) }
}

/// `_ITM_cxa_throw`: the C++ runtime's `__cxa_throw` (the transaction commits as the
/// exception leaves it: `_ITM_commitTransactionEH`).
///
/// # Safety
/// As the C++ runtime's function, which it calls.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ITM_cxa_throw(obj: *mut c_void, tinfo: *mut c_void, dest: *mut c_void) {
    let f: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void) = cxx(c"__cxa_throw");
    // SAFETY: the C++ runtime's function.
    unsafe { f(obj, tinfo, dest) }
}

/// `_ITM_cxa_begin_catch`: the C++ runtime's.
///
/// # Safety
/// As the C++ runtime's function, which it calls.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ITM_cxa_begin_catch(p: *mut c_void) -> *mut c_void {
    let f: unsafe extern "C" fn(*mut c_void) -> *mut c_void = cxx(c"__cxa_begin_catch");
    // SAFETY: the C++ runtime's function.
    unsafe { f(p) }
}

/// `_ITM_cxa_end_catch`: the C++ runtime's.
#[unsafe(no_mangle)]
pub extern "C" fn _ITM_cxa_end_catch() {
    let f: unsafe extern "C" fn() = cxx(c"__cxa_end_catch");
    // SAFETY: the C++ runtime's function.
    unsafe { f() }
}

/// Transactional clones of C++ `operator new` (`_ZGTtnwm`, `_ZGTtnam` and their
/// `nothrow` forms): `_ITM_malloc`.
macro_rules! news {
    ($($name:ident ($($extra:ident),*)),+) => {$(
        #[doc = concat!("`", stringify!($name), "`: a transactional `operator new`.")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name(size: usize $(, $extra: *const c_void)*) -> *mut c_void {
            $(let _ = $extra;)*
            _ITM_malloc(size.max(1))
        }
    )+};
}
news!(
    _ZGTtnwm(),
    _ZGTtnam(),
    _ZGTtnwmRKSt9nothrow_t(nothrow),
    _ZGTtnamRKSt9nothrow_t(nothrow)
);

/// Transactional clones of C++ `operator delete` (sized, `nothrow` and array forms):
/// `_ITM_free`.
macro_rules! deletes {
    ($($name:ident ($($extra:ident: $t:ty),*)),+) => {$(
        #[doc = concat!("`", stringify!($name), "`: a transactional `operator delete`.")]
        ///
        /// # Safety
        /// `p` is null or a block of a transactional `operator new`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(p: *mut c_void $(, $extra: $t)*) {
            $(let _ = $extra;)*
            // SAFETY: as the caller promises.
            unsafe { _ITM_free(p) }
        }
    )+};
}
deletes!(
    _ZGTtdlPv(),
    _ZGTtdaPv(),
    _ZGTtdlPvm(size: usize),
    _ZGTtdlPvRKSt9nothrow_t(nothrow: *const c_void),
    _ZGTtdaPvRKSt9nothrow_t(nothrow: *const c_void),
    _ZGTtdlPvmRKSt9nothrow_t(size: usize, nothrow: *const c_void)
);
