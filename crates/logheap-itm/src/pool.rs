//! The TM pool: the one pool of the process whose bytes GNU TM transactions change
//! through logheap, mapped at a fixed address so that it may hold plain pointers
//! into itself; and the C functions that open, close and allocate in it.
//!
//! Engines: `redo` and `undo`, whose home is the data itself, so that the mapping
//! holds every committed byte and plain loads outside transactions read them. The
//! others keep the newest bytes elsewhere (the log engine's home space is not even
//! memory); `lh_tm_open` refuses them.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use logheap::{Config, EngineConfig, EngineKind, MapAddress, Pool, Transaction};

use crate::serial::Held;
use crate::txn::{self, fatal, with_desc};

/// The open TM pool (null: none), and the addresses its mapping spans.
static POOL: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());
static BASE: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static LAST_ERROR: std::cell::RefCell<std::ffi::CString> = Default::default();
}

/// Begins a transaction on the TM pool, if one is open (the caller holds the serial
/// lock, so the pool cannot close meanwhile).
pub(crate) fn begin() -> Option<Transaction<'static>> {
    let pool = POOL.load(Ordering::Acquire);
    // SAFETY: a pool is freed only by `lh_tm_close`, under the serial lock held
    // exclusively; the caller holds it shared until this transaction ends.
    (!pool.is_null()).then(|| unsafe { &*pool }.begin(false))
}

/// Splits `[addr, addr + n)` at the pool's bounds: `(offset in the range, length,
/// home offset if in the pool)`.
pub(crate) fn pieces(addr: usize, n: usize) -> impl Iterator<Item = (usize, usize, Option<u64>)> {
    let (base, end) = (BASE.load(Ordering::Acquire), END.load(Ordering::Acquire));
    let stop = addr.saturating_add(n);
    // Before the pool, in it, after it (each empty when the range misses it).
    let (lo, hi) = (base.clamp(addr, stop), end.clamp(addr, stop));
    let parts = [(addr, lo), (lo, hi), (hi, stop)];
    parts
        .into_iter()
        .filter(|&(s, e)| s < e)
        .map(move |(s, e)| {
            let home = (s >= base && e <= end && base < end).then(|| (s - base) as u64);
            (s - addr, e - s, home)
        })
}

fn set_error(message: String) {
    let text = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// The calling thread's last error message of an `lh_tm_` call.
#[unsafe(no_mangle)]
pub extern "C" fn lh_tm_errormsg() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Opens (or, when missing, creates with `engine` and `size` bytes) the pool at `path`
/// as the process's TM pool, at a fixed address: 0 on success, -1 on an error
/// ([`lh_tm_errormsg`] says which). `engine` is `"redo"` (NULL: the default) or
/// `"undo"`; `size` 0 is 64 MiB. One TM pool at a time.
///
/// # Safety
/// `path` and `engine` are null or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_tm_open(
    path: *const c_char,
    engine: *const c_char,
    size: u64,
) -> c_int {
    let result = std::panic::catch_unwind(|| -> Result<(), String> {
        if path.is_null() {
            return Err("a null path".into());
        }
        // SAFETY: not null, NUL-terminated as the caller promises.
        let path = unsafe { CStr::from_ptr(path) }
            .to_str()
            .map_err(|_| "the path is not UTF-8".to_string())?;
        let engine = if engine.is_null() {
            "redo"
        } else {
            // SAFETY: not null, NUL-terminated as the caller promises.
            unsafe { CStr::from_ptr(engine) }
                .to_str()
                .map_err(|_| "the engine name is not UTF-8".to_string())?
        };
        let engine: EngineConfig = engine.parse()?;
        if !matches!(engine.kind(), EngineKind::Redo | EngineKind::Undo) {
            return Err(format!(
                "GNU TM transactions need an engine whose objects live at their home \
                 (redo, undo); {} keeps the newest bytes elsewhere",
                engine.kind().name()
            ));
        }
        let mut config = Config::default()
            .engine(engine)
            .map_address(MapAddress::Fixed);
        if size != 0 {
            config = config.size(size);
        }
        if txn::in_transaction() {
            return Err("lh_tm_open inside a transaction".into());
        }
        let _alone = Held::exclusive();
        if !POOL.load(Ordering::Acquire).is_null() {
            return Err("a TM pool is open already (lh_tm_close it first)".to_string());
        }
        {
            let pool = Pool::open_or_create(path, &config).map_err(|e| e.to_string())?;
            if pool.header().engine != engine.kind() {
                return Err(format!(
                    "{path} is a {} pool, not {}",
                    pool.header().engine.name(),
                    engine.kind().name()
                ));
            }
            let base = pool
                .direct(pool.root_range().start, 1)
                .map_err(|e| e.to_string())? as usize
                - pool.root_range().start as usize;
            BASE.store(base, Ordering::Release);
            END.store(base + pool.header().pool_size as usize, Ordering::Release);
            POOL.store(Box::into_raw(Box::new(pool)), Ordering::Release);
            Ok(())
        }
    });
    report(result)
}

fn report(result: std::thread::Result<Result<(), String>>) -> c_int {
    match result {
        Ok(Ok(())) => 0,
        Ok(Err(message)) => {
            set_error(message);
            -1
        }
        Err(_) => {
            set_error("internal error (a panic)".into());
            -1
        }
    }
}

/// Closes the TM pool cleanly (waiting for transactions in progress): 0, or -1 when
/// none is open or closing fails. Not inside a transaction.
#[unsafe(no_mangle)]
pub extern "C" fn lh_tm_close() -> c_int {
    let result = std::panic::catch_unwind(|| -> Result<(), String> {
        if txn::in_transaction() {
            return Err("lh_tm_close inside a transaction".into());
        }
        let pool = {
            let _alone = Held::exclusive();
            BASE.store(0, Ordering::Release);
            END.store(0, Ordering::Release);
            POOL.swap(std::ptr::null_mut(), Ordering::AcqRel)
        };
        if pool.is_null() {
            return Err("no TM pool is open".into());
        }
        // SAFETY: made by `lh_tm_open` with `Box::into_raw`, unpublished above under the
        // exclusive serial lock: no transaction holds it.
        unsafe { Box::from_raw(pool) }
            .close()
            .map_err(|e| e.to_string())
    });
    report(result)
}

/// The address of the TM pool's root object (zeros in a new pool), its size into
/// `*size` unless `size` is null; NULL when no pool is open.
///
/// # Safety
/// `size` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_tm_root(size: *mut usize) -> *mut c_void {
    let pool = POOL.load(Ordering::Acquire);
    if pool.is_null() {
        set_error("no TM pool is open".into());
        return std::ptr::null_mut();
    }
    // SAFETY: open (see `begin`); closing while other threads use the pool is the
    // program's bug.
    let root = unsafe { &*pool }.root_range();
    if !size.is_null() {
        // SAFETY: not null; valid as the caller promises.
        unsafe { size.write((root.end - root.start) as usize) };
    }
    (BASE.load(Ordering::Acquire) + root.start as usize) as *mut c_void
}

/// Allocates `size` zeroed bytes in the TM pool: inside a transaction, as part of it
/// (gone if it does not commit); outside, in a transaction of its own. NULL when the
/// pool is full or none is open. Declared `transaction_pure` in `logheap_tm.h`.
#[unsafe(no_mangle)]
pub extern "C" fn lh_tm_alloc(size: usize) -> *mut c_void {
    let base = BASE.load(Ordering::Acquire);
    let home = if txn::in_transaction() {
        let result = with_desc(|d| d.tx.as_mut().map(|tx| tx.alloc_bytes(size as u64)));
        match result {
            Some(Ok(home)) => home,
            Some(Err(logheap::Error::Conflict { .. })) => txn::restart(),
            Some(Err(e)) => {
                set_error(e.to_string());
                return std::ptr::null_mut();
            }
            None => {
                set_error("no TM pool is open".into());
                return std::ptr::null_mut();
            }
        }
    } else {
        // Shared: the pool cannot close meanwhile, nor a serial transaction run.
        let _held = Held::shared();
        let pool = POOL.load(Ordering::Acquire);
        if pool.is_null() {
            set_error("no TM pool is open".into());
            return std::ptr::null_mut();
        }
        // SAFETY: open (see `lh_tm_root`).
        match unsafe { &*pool }.transaction(|tx| tx.alloc_bytes(size as u64)) {
            Ok(home) => home,
            Err(e) => {
                set_error(e.to_string());
                return std::ptr::null_mut();
            }
        }
    };
    (base + home as usize) as *mut c_void
}

/// Frees a block of the TM pool that [`lh_tm_alloc`] gave: inside a transaction, when
/// it commits; outside, at once. A pointer that is no such block ends the process
/// inside a transaction (there is no way to report it) and is ignored outside, with
/// the error kept for [`lh_tm_errormsg`].
///
/// # Safety
/// `p` is null or a block of the TM pool.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lh_tm_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    let base = BASE.load(Ordering::Acquire);
    let Some(home) = (p as usize).checked_sub(base).map(|h| h as u64) else {
        set_error("not a block of the TM pool".into());
        return;
    };
    let ptr = logheap::PPtr::<u8>::from_offset(home);
    if txn::in_transaction() {
        let result = with_desc(|d| d.tx.as_mut().map(|tx| tx.free(ptr)));
        match result {
            Some(Ok(())) | None => {}
            Some(Err(logheap::Error::Conflict { .. })) => txn::restart(),
            Some(Err(e)) => fatal(&format!("lh_tm_free: {e}")),
        }
    } else {
        let _held = Held::shared();
        let pool = POOL.load(Ordering::Acquire);
        if pool.is_null() {
            set_error("no TM pool is open".into());
            return;
        }
        // SAFETY: open (see `lh_tm_root`).
        if let Err(e) = unsafe { &*pool }.transaction(|tx| tx.free(ptr)) {
            set_error(e.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_cut_at_the_pool_bounds() {
        BASE.store(1000, Ordering::SeqCst);
        END.store(2000, Ordering::SeqCst);
        let all: Vec<_> = pieces(900, 1200).collect();
        assert_eq!(
            all,
            vec![(0, 100, None), (100, 1000, Some(0)), (1100, 100, None)]
        );
        assert_eq!(
            pieces(1500, 10).collect::<Vec<_>>(),
            vec![(0, 10, Some(500))]
        );
        assert_eq!(pieces(10, 10).collect::<Vec<_>>(), vec![(0, 10, None)]);
        assert_eq!(
            pieces(1990, 20).collect::<Vec<_>>(),
            vec![(0, 10, Some(990)), (10, 10, None)]
        );
        BASE.store(0, Ordering::SeqCst);
        END.store(0, Ordering::SeqCst);
        assert_eq!(pieces(10, 10).collect::<Vec<_>>(), vec![(0, 10, None)]);
    }
}
