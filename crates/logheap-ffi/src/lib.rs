//! The C API of logheap: `liblogheap`, declared in `include/logheap.h` (generated from
//! this file by cbindgen).
//!
//! It has the shape of libpmemobj, which C users of persistent memory know: a pool
//! (create, open, close) on any engine, a root object, object handles ([`lh_oid_t`],
//! offsets in the pool's home space), transactions with reads and writes of byte
//! ranges and transactional allocation and free, and a direct pointer where the engine
//! keeps objects in place.
//!
//! Conventions (after SlateDB's C binding):
//! - names start with `lh_`, types end in `_t`;
//! - every call returns an [`lh_status_t`]; [`lh_errormsg`] gives the calling thread's
//!   last error in words;
//! - a null handle or pointer argument, a handle already closed or ended, or a
//!   transaction used from another thread than the one that began it is
//!   `LH_EINVAL`, never a crash: live handles are registered, and every handle is
//!   looked up before it is used;
//! - every entry point catches panics (`LH_EPANIC`): the library never unwinds into C
//!   or aborts its host on bad input.
//!
//! **Conflicts.** Transactions run concurrently and optimistically. An operation or a
//! commit that meets a conflicting transaction returns `LH_CONFLICT`; the transaction
//! is then over (a later operation returns `LH_CONFLICT` again) and must be begun again
//! and its work repeated. [`lh_pool_transaction`] does that itself: it runs a callback
//! until it commits.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, RwLock};

use logheap::{Config, EngineConfig, Error, Pool, Transaction, Tx};

/// What a call did.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum lh_status_t {
    /// Done.
    LH_OK = 0,
    /// The transaction met a concurrent one and is over: begin it again and repeat its
    /// work ([`lh_pool_transaction`] does so itself).
    LH_CONFLICT = 1,
    /// An invalid argument: a null or unknown handle, a null pointer, a range outside
    /// the usable home space, a free of no allocation, a transaction used from another
    /// thread, a bad configuration.
    LH_EINVAL = 2,
    /// No such pool file.
    LH_ENOENT = 3,
    /// The pool file exists already.
    LH_EEXIST = 4,
    /// The pool is open elsewhere (another process or handle), or has transactions in
    /// progress (close).
    LH_EBUSY = 5,
    /// The pool is full.
    LH_ENOSPC = 6,
    /// A write, allocation or free in a read-only transaction.
    LH_EREADONLY = 7,
    /// The file is not a pool of this library, or its data is damaged (checksums).
    LH_ECORRUPT = 8,
    /// The operation does not apply to the pool's engine (for example a direct
    /// pointer on the log engine).
    LH_ENOTSUP = 9,
    /// An input/output error of the file or its mapping.
    LH_EIO = 10,
    /// A transaction callback returned a status other than `LH_OK` or `LH_CONFLICT`:
    /// the transaction was aborted.
    LH_EABORTED = 11,
    /// A bug in the library (a caught panic); the message says where.
    LH_EPANIC = 12,
}

use lh_status_t::*;

/// A handle of an object: its offset in the pool's home space (0 is null).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct lh_oid_t {
    /// The home offset.
    pub off: u64,
}

/// Counters of a pool ([`lh_pool_stats`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct lh_stats_t {
    /// Committed transactions (read-only ones included).
    pub transactions: u64,
    /// Committed transactions that wrote.
    pub write_transactions: u64,
    /// Aborted attempts (conflicts included).
    pub aborts: u64,
    /// Fences issued.
    pub fences: u64,
    /// Cache lines flushed.
    pub lines_flushed: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Bytes in live allocations.
    pub allocated_bytes: u64,
    /// DRAM the engine holds to find the data.
    pub dram_bytes: u64,
    /// Bytes of the pool's data area in use.
    pub pm_bytes_used: u64,
}

/// Begin a read-only transaction ([`lh_tx_begin`], [`lh_pool_transaction`]): a
/// consistent snapshot; writes, allocations and frees are `LH_EREADONLY`.
pub const LH_TX_READONLY: u32 = 1;

/// An open pool.
pub struct lh_pool_t {
    pool: Pool,
    /// Transactions begun by hand and not yet ended: the pool cannot close under them.
    open_txs: AtomicUsize,
}

/// A transaction in progress (registered in the list of the thread that began it,
/// which alone may use it).
pub struct lh_tx_t {
    state: TxState,
}

enum TxState {
    /// Begun by [`lh_tx_begin`]: ended by [`lh_tx_commit`] or [`lh_tx_abort`]. It
    /// borrows the pool, which cannot close meanwhile (`open_txs`).
    Owned {
        tx: Transaction<'static>,
        pool: *const lh_pool_t,
    },
    /// Handed to a callback by [`lh_pool_transaction`], valid during the call.
    Borrowed(*mut Tx<'static>),
}

/// A transaction callback: return `LH_OK` to commit; `LH_CONFLICT` (what an operation
/// returned) to run again; anything else aborts ([`lh_pool_transaction`] then returns
/// `LH_EABORTED`).
pub type lh_tx_fn = Option<unsafe extern "C" fn(tx: *mut lh_tx_t, arg: *mut c_void) -> c_int>;

/// Live pool handles (addresses). A handle is looked up here before it is used, so
/// that a closed or foreign one is an error instead of a crash.
static POOLS: LazyLock<RwLock<HashSet<usize>>> = LazyLock::new(Default::default);

thread_local! {
    /// The thread's last error message.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// The live transaction handles of this thread (a transaction belongs to its
    /// thread): a few at most, so a vector.
    static TXS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A failed call: its status and message.
struct Failure(lh_status_t, String);

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let status = match &e {
            Error::Conflict { .. } => LH_CONFLICT,
            Error::NotFound { .. } => LH_ENOENT,
            Error::AlreadyExists { .. } => LH_EEXIST,
            Error::Locked { .. } => LH_EBUSY,
            Error::PoolFull
            | Error::NoSpace { .. }
            | Error::HomeSpaceFull
            | Error::VersionsExhausted => LH_ENOSPC,
            Error::ReadOnly => LH_EREADONLY,
            Error::InvalidRange { .. }
            | Error::InvalidFree { .. }
            | Error::InvalidSize(_)
            | Error::InvalidConfig(_)
            | Error::InvalidAddress { .. }
            | Error::RootTooLarge { .. }
            | Error::WrongEngine { .. } => LH_EINVAL,
            Error::NoDirectAccess(_) | Error::EngineUnavailable(_) => LH_ENOTSUP,
            Error::Io { .. } | Error::Media { .. } => LH_EIO,
            _ => LH_ECORRUPT,
        };
        Failure(status, e.to_string())
    }
}

fn invalid(what: impl Into<String>) -> Failure {
    Failure(LH_EINVAL, what.into())
}

fn set_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// Runs an entry point's body: its status, its error message kept for
/// [`lh_errormsg`], panics caught.
fn entry(body: impl FnOnce() -> Result<(), Failure>) -> lh_status_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => LH_OK,
        Ok(Err(Failure(status, message))) => {
            set_error(&message);
            status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_error(&format!("internal error (please report): {what}"));
            LH_EPANIC
        }
    }
}

/// The string at `s` (UTF-8), or `None` for a null pointer.
///
/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn string<'a>(s: *const c_char, what: &str) -> Result<Option<&'a str>, Failure> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: not null, and NUL-terminated as the caller promises.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str()
        .map(Some)
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// The pool of a registered handle (an unregistered address is never dereferenced).
fn pool_ref<'a>(pool: *const lh_pool_t) -> Result<&'a lh_pool_t, Failure> {
    pool_in(&POOLS.read().unwrap_or_else(|p| p.into_inner()), pool)
}

/// [`pool_ref`] with the registry `live` already locked.
fn pool_in<'a>(live: &HashSet<usize>, pool: *const lh_pool_t) -> Result<&'a lh_pool_t, Failure> {
    if pool.is_null() {
        return Err(invalid("a null pool handle"));
    }
    if !live.contains(&(pool as usize)) {
        return Err(invalid("not an open pool handle (closed already?)"));
    }
    // SAFETY: registered, so it is a live `Box<lh_pool_t>` made by `register_pool`; it
    // is freed only by `lh_pool_close`, which refuses while transactions borrow it. A
    // close racing this call on another thread is the caller's bug, as with any
    // handle-based C API.
    Ok(unsafe { &*pool })
}

/// The transaction of a live handle of this thread.
fn tx_mut<'a>(tx: *mut lh_tx_t) -> Result<&'a mut lh_tx_t, Failure> {
    if tx.is_null() {
        return Err(invalid("a null transaction handle"));
    }
    if !TXS.with(|t| t.borrow().contains(&(tx as usize))) {
        return Err(invalid(
            "not a transaction in progress on this thread (ended already, or begun by another thread?)",
        ));
    }
    // SAFETY: registered in this thread's list, so it is a live handle made by
    // `lh_tx_begin` or `lh_pool_transaction` on this thread and not yet ended; the
    // thread uses it only through this call.
    Ok(unsafe { &mut *tx })
}

impl lh_tx_t {
    fn tx(&mut self) -> &mut Tx<'static> {
        match &mut self.state {
            TxState::Owned { tx, .. } => tx,
            // SAFETY: a borrowed handle is registered only while its callback runs, and
            // the `Tx` it points to lives on `lh_pool_transaction`'s frame meanwhile.
            TxState::Borrowed(tx) => unsafe { &mut **tx },
        }
    }
}

fn register_tx(handle: Box<lh_tx_t>) -> *mut lh_tx_t {
    let raw = Box::into_raw(handle);
    TXS.with(|t| t.borrow_mut().push(raw as usize));
    raw
}

fn unregister_tx(tx: *mut lh_tx_t) {
    TXS.with(|t| t.borrow_mut().retain(|&x| x != tx as usize));
}

/// Writes `value` through `out`.
///
/// # Safety
/// `out` is null (an error) or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(invalid(format!("a null {what} pointer")));
    }
    // SAFETY: not null, and valid for writes as the caller promises.
    unsafe { out.write(value) };
    Ok(())
}

/// The calling thread's last error message (empty when none). The string stays valid
/// until the thread's next failing call.
#[unsafe(no_mangle)]
pub extern "C" fn lh_errormsg() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The name of `status` ("LH_OK", "LH_CONFLICT", ...), a static string;
/// "LH_UNKNOWN" for a number that is no status.
#[unsafe(no_mangle)]
pub extern "C" fn lh_status_str(status: c_int) -> *const c_char {
    const NAMES: [&CStr; 13] = [
        c"LH_OK",
        c"LH_CONFLICT",
        c"LH_EINVAL",
        c"LH_ENOENT",
        c"LH_EEXIST",
        c"LH_EBUSY",
        c"LH_ENOSPC",
        c"LH_EREADONLY",
        c"LH_ECORRUPT",
        c"LH_ENOTSUP",
        c"LH_EIO",
        c"LH_EABORTED",
        c"LH_EPANIC",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"LH_UNKNOWN".as_ptr(), |s| s.as_ptr())
}

/// One count in a pool's `open_txs` for as long as it lives: the pool cannot close
/// meanwhile. Taken under the registry's lock (so no close slips in between).
struct Borrow<'a>(&'a lh_pool_t);

impl<'a> Borrow<'a> {
    fn new(pool: &'a lh_pool_t) -> Borrow<'a> {
        pool.open_txs.fetch_add(1, Ordering::AcqRel);
        Borrow(pool)
    }
}

impl Drop for Borrow<'_> {
    fn drop(&mut self) {
        self.0.open_txs.fetch_sub(1, Ordering::AcqRel);
    }
}

fn register_pool(pool: Pool) -> *mut lh_pool_t {
    let raw = Box::into_raw(Box::new(lh_pool_t {
        pool,
        open_txs: AtomicUsize::new(0),
    }));
    POOLS
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(raw as usize);
    raw
}

/// Creates a pool file at `path` and opens it into `*pool`.
///
/// `engine` names the engine (`"log"`, `"redo"`, `"undo"`, `"oop"`, `"hoop"`, or one
/// of their variants as `logheap bench` names them; NULL: the default, `log`); `size`
/// is the file's size in bytes (0: the default, 64 MiB). An existing file is
/// `LH_EEXIST`.
///
/// # Safety
/// `path` and `engine` are null or NUL-terminated strings; `pool` is null or valid for
/// a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_pool_create(
    path: *const c_char,
    engine: *const c_char,
    size: u64,
    pool: *mut *mut lh_pool_t,
) -> lh_status_t {
    entry(|| {
        // SAFETY: as the caller promises.
        let path = unsafe { string(path, "the path") }?.ok_or_else(|| invalid("a null path"))?;
        // SAFETY: as the caller promises.
        let engine = unsafe { string(engine, "the engine name") }?;
        if pool.is_null() {
            return Err(invalid("a null pool pointer"));
        }
        let mut config = Config::default();
        if let Some(name) = engine {
            let engine: EngineConfig = name.parse().map_err(invalid)?;
            config = config.engine(engine);
        }
        if size != 0 {
            config = config.size(size);
        }
        let opened = Pool::create(path, &config)?;
        // SAFETY: checked not null above; valid for a write as the caller promises.
        unsafe { put(pool, register_pool(opened), "pool") }
    })
}

/// Opens the pool file at `path` into `*pool` (recovering it if it was not closed
/// cleanly). A pool open in another process or handle is `LH_EBUSY`; a file that is
/// no pool, or a damaged one, is `LH_ECORRUPT`.
///
/// # Safety
/// `path` is null or a NUL-terminated string; `pool` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_pool_open(
    path: *const c_char,
    pool: *mut *mut lh_pool_t,
) -> lh_status_t {
    entry(|| {
        // SAFETY: as the caller promises.
        let path = unsafe { string(path, "the path") }?.ok_or_else(|| invalid("a null path"))?;
        if pool.is_null() {
            return Err(invalid("a null pool pointer"));
        }
        let opened = Pool::open(path)?;
        // SAFETY: checked not null above; valid for a write as the caller promises.
        unsafe { put(pool, register_pool(opened), "pool") }
    })
}

/// Closes `pool` cleanly and frees the handle. `LH_EBUSY` (the pool stays open) while
/// transactions begun with [`lh_tx_begin`] are in progress on it.
#[unsafe(no_mangle)]
pub extern "C" fn lh_pool_close(pool: *mut lh_pool_t) -> lh_status_t {
    entry(|| {
        take_pool(pool)?.pool.close()?;
        Ok(())
    })
}

/// Unregisters a live pool handle with no transaction in progress and gives back its
/// box.
fn take_pool(pool: *mut lh_pool_t) -> Result<Box<lh_pool_t>, Failure> {
    let mut live = POOLS.write().unwrap_or_else(|p| p.into_inner());
    // Under the registry's write lock no `lh_tx_begin` can count a new transaction.
    if pool_in(&live, pool)?.open_txs.load(Ordering::Acquire) != 0 {
        return Err(Failure(
            LH_EBUSY,
            "transactions are in progress on the pool: commit or abort them first".into(),
        ));
    }
    live.remove(&(pool as usize));
    // SAFETY: made by `register_pool` from a box (it was registered), now unregistered:
    // this is its only owner.
    Ok(unsafe { Box::from_raw(pool) })
}

/// The pool's root object: its handle into `*root` and its size in bytes into
/// `*size` (either may be null). The root area is zeros in a new pool.
///
/// # Safety
/// `root` and `size` are null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_pool_root(
    pool: *const lh_pool_t,
    root: *mut lh_oid_t,
    size: *mut u64,
) -> lh_status_t {
    entry(|| {
        let range = pool_ref(pool)?.pool.root_range();
        if !root.is_null() {
            // SAFETY: not null; valid for a write as the caller promises.
            unsafe { root.write(lh_oid_t { off: range.start }) };
        }
        if !size.is_null() {
            // SAFETY: not null; valid for a write as the caller promises.
            unsafe { size.write(range.end - range.start) };
        }
        Ok(())
    })
}

/// A pointer to the `len` bytes of object `oid` in this process, for reads outside
/// transactions, on the engines that keep objects in place (`redo`, `undo`); the
/// others are `LH_ENOTSUP`. Writes must go through a transaction.
///
/// # Safety
/// `ptr` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_pool_direct(
    pool: *const lh_pool_t,
    oid: lh_oid_t,
    len: u64,
    ptr: *mut *const c_void,
) -> lh_status_t {
    entry(|| {
        let p = pool_ref(pool)?.pool.direct(oid.off, len)?;
        // SAFETY: as the caller promises.
        unsafe { put(ptr, p.cast::<c_void>(), "result") }
    })
}

/// The pool's counters into `*stats`.
///
/// # Safety
/// `stats` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_pool_stats(
    pool: *const lh_pool_t,
    stats: *mut lh_stats_t,
) -> lh_status_t {
    entry(|| {
        let s = pool_ref(pool)?.pool.stats();
        let out = lh_stats_t {
            transactions: s.media.transactions,
            write_transactions: s.media.write_transactions,
            aborts: s.media.aborts,
            fences: s.media.fences,
            lines_flushed: s.media.lines_flushed,
            allocations: s.allocations,
            allocated_bytes: s.allocated_bytes,
            dram_bytes: s.dram_bytes,
            pm_bytes_used: s.pm_bytes_used,
        };
        // SAFETY: as the caller promises.
        unsafe { put(stats, out, "stats") }
    })
}

/// Begins a transaction on `pool` into `*tx` (`flags`: 0, or [`LH_TX_READONLY`]). It
/// belongs to the calling thread, and ends with [`lh_tx_commit`] or [`lh_tx_abort`];
/// the pool cannot close meanwhile.
///
/// # Safety
/// `tx` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_tx_begin(
    pool: *mut lh_pool_t,
    flags: u32,
    tx: *mut *mut lh_tx_t,
) -> lh_status_t {
    entry(|| {
        if flags & !LH_TX_READONLY != 0 {
            return Err(invalid(format!("unknown transaction flags {flags:#x}")));
        }
        if tx.is_null() {
            return Err(invalid("a null transaction pointer"));
        }
        let handle = {
            // Held while counting, so that a close cannot slip in between.
            let live = POOLS.read().unwrap_or_else(|p| p.into_inner());
            let p = pool_in(&live, pool)?;
            // Kept (forgotten) once the transaction is made; given back if that panics.
            let borrow = Borrow::new(p);
            // SAFETY: the pool stays open (and its box in place) while `open_txs`
            // counts this transaction: `lh_pool_close` refuses until it ends.
            let pool_static: &'static Pool = unsafe { &*(&p.pool as *const Pool) };
            let handle = Box::new(lh_tx_t {
                state: TxState::Owned {
                    tx: pool_static.begin(flags & LH_TX_READONLY != 0),
                    pool,
                },
            });
            // The count is the transaction's now: `end_owned` gives it back.
            std::mem::forget(borrow);
            handle
        };
        // SAFETY: checked not null above; valid for a write as the caller promises.
        unsafe { put(tx, register_tx(handle), "transaction") }
    })
}

/// Ends a transaction of [`lh_tx_begin`] and frees its handle, with `commit`'s outcome.
fn end_owned(tx: *mut lh_tx_t, commit: bool) -> Result<(), Failure> {
    let handle = tx_mut(tx)?;
    if matches!(handle.state, TxState::Borrowed(_)) {
        return Err(invalid(
            "a callback's transaction ends when the callback returns (commit: return LH_OK)",
        ));
    }
    unregister_tx(tx);
    // SAFETY: made by `register_tx` from a box and now unregistered: this is its only
    // owner.
    let handle = unsafe { Box::from_raw(tx) };
    let TxState::Owned { tx, pool } = handle.state else {
        unreachable!("checked above")
    };
    // SAFETY: the pool is still open: it cannot close while this transaction counts in
    // `open_txs`; the count is given back when `_count` drops (a panic included).
    let _count = Borrow(unsafe { &*pool });
    let result = if commit {
        tx.commit()
    } else {
        tx.abort();
        Ok(())
    };
    result.map_err(Failure::from)
}

/// Commits a transaction of [`lh_tx_begin`] (durable on `LH_OK`) and frees its handle,
/// whatever the outcome. `LH_CONFLICT`: nothing of it took effect; begin again.
#[unsafe(no_mangle)]
pub extern "C" fn lh_tx_commit(tx: *mut lh_tx_t) -> lh_status_t {
    entry(|| end_owned(tx, true))
}

/// Aborts a transaction of [`lh_tx_begin`] (nothing of it takes effect) and frees its
/// handle.
#[unsafe(no_mangle)]
pub extern "C" fn lh_tx_abort(tx: *mut lh_tx_t) -> lh_status_t {
    entry(|| end_owned(tx, false))
}

fn home_of(oid: lh_oid_t, offset: u64) -> Result<u64, Failure> {
    oid.off
        .checked_add(offset)
        .ok_or_else(|| invalid("the object offset overflows"))
}

/// Reads `len` bytes at byte `offset` of object `oid` into `buf`, as of the
/// transaction's snapshot with its own writes.
///
/// # Safety
/// `buf` is valid for writes of `len` bytes (it may be null when `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_tx_read(
    tx: *mut lh_tx_t,
    oid: lh_oid_t,
    offset: u64,
    buf: *mut c_void,
    len: usize,
) -> lh_status_t {
    entry(|| {
        let handle = tx_mut(tx)?;
        if len == 0 {
            return Ok(());
        }
        if buf.is_null() {
            return Err(invalid("a null buffer"));
        }
        // SAFETY: not null, valid for `len` bytes of writes as the caller promises.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        handle.tx().read_bytes(home_of(oid, offset)?, out)?;
        Ok(())
    })
}

/// Writes the `len` bytes at `buf` at byte `offset` of object `oid` (buffered until
/// commit).
///
/// # Safety
/// `buf` is valid for reads of `len` bytes (it may be null when `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_tx_write(
    tx: *mut lh_tx_t,
    oid: lh_oid_t,
    offset: u64,
    buf: *const c_void,
    len: usize,
) -> lh_status_t {
    entry(|| {
        let handle = tx_mut(tx)?;
        if len == 0 {
            return Ok(());
        }
        if buf.is_null() {
            return Err(invalid("a null buffer"));
        }
        // SAFETY: not null, valid for `len` bytes of reads as the caller promises.
        let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
        handle.tx().write_bytes(home_of(oid, offset)?, bytes)?;
        Ok(())
    })
}

/// Allocates `size` zeroed bytes, into `*oid`. If the transaction does not commit, the
/// allocation never happened: nothing leaks.
///
/// # Safety
/// `oid` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_tx_alloc(
    tx: *mut lh_tx_t,
    size: u64,
    oid: *mut lh_oid_t,
) -> lh_status_t {
    entry(|| {
        let handle = tx_mut(tx)?;
        if oid.is_null() {
            return Err(invalid("a null oid pointer"));
        }
        let home = handle.tx().alloc_bytes(size)?;
        // SAFETY: checked not null; valid for a write as the caller promises.
        unsafe { oid.write(lh_oid_t { off: home }) };
        Ok(())
    })
}

/// Allocates `size` zeroed bytes and stores the new object's handle (8 bytes, little
/// endian) at byte `dest_offset` of object `dest`, in the same transaction: the new
/// object is reachable exactly when the transaction commits (002's allocate-into). Its
/// handle also goes to `*oid` unless `oid` is null.
///
/// # Safety
/// `oid` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_tx_alloc_into(
    tx: *mut lh_tx_t,
    size: u64,
    dest: lh_oid_t,
    dest_offset: u64,
    oid: *mut lh_oid_t,
) -> lh_status_t {
    entry(|| {
        let handle = tx_mut(tx)?;
        let at = home_of(dest, dest_offset)?;
        let home = handle.tx().alloc_bytes(size)?;
        handle.tx().write_bytes(at, &home.to_le_bytes())?;
        if !oid.is_null() {
            // SAFETY: not null; valid for a write as the caller promises.
            unsafe { oid.write(lh_oid_t { off: home }) };
        }
        Ok(())
    })
}

/// Frees object `oid` when the transaction commits. A handle that is no live
/// allocation is `LH_EINVAL`.
#[unsafe(no_mangle)]
pub extern "C" fn lh_tx_free(tx: *mut lh_tx_t, oid: lh_oid_t) -> lh_status_t {
    entry(|| {
        let handle = tx_mut(tx)?;
        handle
            .tx()
            .free(logheap::PPtr::<u8>::from_offset(oid.off))?;
        Ok(())
    })
}

/// Runs `fn(tx, arg)` as one transaction on `pool` (`flags`: 0, or
/// [`LH_TX_READONLY`]) until it commits: `LH_OK` once it is durable. The callback
/// returns `LH_OK` to commit; when it returns anything else after an operation
/// reported `LH_CONFLICT`, it runs again on a new attempt; otherwise the transaction
/// is aborted and this returns `LH_EABORTED`. An error of the commit itself is
/// returned. The callback may run several times: keep its effects outside the pool
/// idempotent. `tx` is valid only during the call (commit and abort are the
/// callback's return, not calls).
///
/// # Safety
/// `fn` is a function that may be called with `arg`, any number of times.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_pool_transaction(
    pool: *const lh_pool_t,
    flags: u32,
    r#fn: lh_tx_fn,
    arg: *mut c_void,
) -> lh_status_t {
    entry(|| {
        // Counted while the transaction runs (the callback, or another thread, may try
        // to close the pool meanwhile: it gets LH_EBUSY). The registry's lock is not
        // held during the call, so the callback may create, open and close pools.
        let (p, _count) = {
            let live = POOLS.read().unwrap_or_else(|p| p.into_inner());
            let p = pool_in(&live, pool)?;
            (p, Borrow::new(p))
        };
        let Some(callback) = r#fn else {
            return Err(invalid("a null callback"));
        };
        if flags & !LH_TX_READONLY != 0 {
            return Err(invalid(format!("unknown transaction flags {flags:#x}")));
        }
        let body = |tx: &mut Tx<'_>| -> Result<(), Failure> {
            // The handle lends the callback this attempt's `Tx` (its lifetime erased:
            // the handle is unregistered before the attempt ends).
            let tx_ptr = (tx as *mut Tx<'_>).cast::<Tx<'static>>();
            let raw = register_tx(Box::new(lh_tx_t {
                state: TxState::Borrowed(tx_ptr),
            }));
            // SAFETY: the caller promises `callback` may be called with `arg`.
            let returned = unsafe { callback(raw, arg) };
            unregister_tx(raw);
            // SAFETY: made by `register_tx` from a box, now unregistered.
            drop(unsafe { Box::from_raw(raw) });
            match returned {
                0 => Ok(()),
                r if r == LH_CONFLICT as c_int => Err(Failure(LH_CONFLICT, String::new())),
                r => Err(Failure(
                    LH_EABORTED,
                    format!("the transaction callback returned {r}: aborted"),
                )),
            }
        };
        let run = |tx: &mut Tx<'_>| match body(tx) {
            // A callback that gives up after a conflict is run again (the
            // transaction's own state says whether there was one).
            Err(f) if f.0 == LH_CONFLICT => Err(CallbackError::Retry),
            Err(f) => Err(CallbackError::Failed(f)),
            Ok(()) => Ok(()),
        };
        let result = if flags & LH_TX_READONLY != 0 {
            p.pool.read(run)
        } else {
            p.pool.transaction(run)
        };
        match result {
            Ok(()) => Ok(()),
            Err(CallbackError::Failed(f)) => Err(f),
            Err(CallbackError::Retry) => Err(Failure(
                LH_EABORTED,
                "the transaction callback returned LH_CONFLICT, but no conflict happened".into(),
            )),
            Err(CallbackError::Engine(e)) => Err(Failure::from(e)),
        }
    })
}

/// How a callback's attempt ended, for [`Pool::transaction`].
enum CallbackError {
    /// A conflict: the transaction retries (it knows it conflicted).
    Retry,
    /// The callback failed: the transaction aborts with this.
    Failed(Failure),
    /// The engine's error (a commit's).
    Engine(Error),
}

impl From<Error> for CallbackError {
    fn from(e: Error) -> CallbackError {
        match e {
            Error::Conflict { .. } => CallbackError::Retry,
            e => CallbackError::Engine(e),
        }
    }
}
