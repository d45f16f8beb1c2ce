//! The PMDK peer engine: the same workloads on PMDK's libpmemobj, run as
//! `logheap bench --engine pmdk` and reported beside logheap's engines.
//!
//! The structures are written in C against libpmemobj (`csrc/pmdk_workloads.c`: an
//! array, a red-black tree, a B+ tree of fanout 16 and a chained hash table, mirroring
//! logheap's collections), each operation one libpmemobj transaction. The operations
//! themselves (keys, value lengths and bytes) are drawn here, in Rust, from the same
//! [`OpStream`](crate::workload::OpStream) as logheap's harness, and handed to C as
//! arrays: the same seed gives both engines the same operations.
//!
//! The read-heavy workloads' look-ups (`hashtable-read95`, `rbtree-read95`,
//! `hashtable-lookup`, `rbtree-lookup`) run outside any libpmemobj transaction, as a PMDK
//! user reads: direct pointer reads of the persistent structure and a copy of the value
//! found. In `-read95` they take the structure's locks as readers (the tree's
//! reader-writer lock, the key's stripe of the hash table), since updates run beside
//! them; `-lookup` runs nothing else and takes no lock.
//!
//! The C code is built by the crate's build script when `pkg-config` finds libpmemobj
//! (Debian: `libpmemobj-dev`), which sets `cfg(logheap_pmdk)`; without it
//! [`pmdk_available`] is false and running the engine is an error saying
//! [`UNAVAILABLE`].
//!
//! What the run measures: transactions per second (the wall time of the measured phase:
//! threads spawned here, each running its own pre-drawn operations in C, under locks, so
//! none is retried) and persistent memory in use (the live objects' usable sizes).
//! Fences, lines flushed, write amplification, node caches and mapping DRAM are
//! logheap's instrumentation and are reported as not measured. PMDK has no NVM
//! emulation: its runs are never emulated.
//!
//! Pools live where logheap's do (`/dev/shm` by default), of the same size (which
//! `pmemobj_create` allocates in full, where logheap's pool file is sparse), and are
//! treated as persistent memory: `PMEM_IS_PMEM_FORCE=1` is set (when unset) before the
//! process's first libpmemobj call, so commits flush cache lines and use non-temporal
//! stores instead of calling `msync` on tmpfs. (libpmem 1.12 reads the variable at its
//! first `pmem_is_pmem`, inside the first `pmemobj_create`; measured on tmpfs: 8 `msync`
//! calls per process, all at pool creation, instead of about 9 per transaction.)

use crate::harness::{RunResult, RunSpec};

/// The engine's name in [`RunSpec::engine`] and reports.
pub const ENGINE: &str = "pmdk";

/// Why `pmdk` cannot run in a build without PMDK.
pub const UNAVAILABLE: &str = "PMDK (libpmemobj) is unavailable in this build: install libpmemobj-dev and pkg-config and rebuild";

/// Whether this build has the PMDK peer engine (libpmemobj was found when it was
/// built).
pub fn pmdk_available() -> bool {
    cfg!(logheap_pmdk)
}

/// Runs `spec` on PMDK; see [`crate::run_reporting`].
#[cfg(not(logheap_pmdk))]
pub(crate) fn run_reporting(
    _spec: &RunSpec,
    _phase: &dyn Fn(&str),
) -> Result<RunResult, Box<dyn std::error::Error>> {
    Err(UNAVAILABLE.into())
}

/// Makes libpmem treat every mapping as persistent memory (`PMEM_IS_PMEM_FORCE=1`,
/// unless the variable is set already), once, before this process's first libpmemobj
/// call. Without PMDK in the build it does nothing.
///
/// libpmem reads the variable at its first `pmem_is_pmem`, which `pmemobj_create` calls:
/// setting it later changes nothing. Call this while the process has one thread (the
/// CLI does, before running anything); creating a `PmdkStore` calls it too.
pub fn prepare_environment() {
    #[cfg(logheap_pmdk)]
    imp::force_pmem();
}

#[cfg(logheap_pmdk)]
pub use imp::PmdkStore;
#[cfg(logheap_pmdk)]
pub(crate) use imp::{alloc_random, run_reporting};

/// Runs the random allocation workload on PMDK's allocator; see
/// [`crate::alloc_bench`].
#[cfg(not(logheap_pmdk))]
pub(crate) fn alloc_random(
    _path: &std::path::Path,
    _size: u64,
    _slots: u64,
    _preload: &[u64],
    _per_thread: &[Vec<u64>],
) -> Result<f64, String> {
    Err(UNAVAILABLE.into())
}

#[cfg(logheap_pmdk)]
mod imp {
    use std::ffi::{CStr, CString, c_char, c_int};
    use std::path::Path;
    use std::ptr::NonNull;
    use std::sync::Once;
    use std::time::Instant;

    use super::{ENGINE, RunResult, RunSpec};
    use crate::harness::{pool_dir, pool_size};
    use crate::workload::{Lookups, Op, OpStream, PRELOAD_BATCH, Shape, Workload, preload_rng};

    /// The C side's interface (`csrc/pmdk_workloads.c`, "Exported functions").
    mod ffi {
        use std::ffi::{c_char, c_int};
        use std::marker::{PhantomData, PhantomPinned};

        use crate::workload::{Lookups, Op};

        /// `struct lh_ctx`: a pool and its structure (opaque).
        #[repr(C)]
        pub struct LhCtx {
            _data: (),
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }

        unsafe extern "C" {
            pub fn lh_op_size() -> usize;
            pub fn lh_errormsg() -> *const c_char;
            pub fn lh_create(
                path: *const c_char,
                size: u64,
                kind: c_int,
                mode: c_int,
                elements: u64,
                buckets: u64,
            ) -> *mut LhCtx;
            pub fn lh_close(c: *mut LhCtx);
            pub fn lh_preload(c: *mut LhCtx, ops: *const Op, n: usize, per_tx: usize) -> c_int;
            pub fn lh_run(c: *mut LhCtx, ops: *const Op, n: usize, found: *mut Lookups) -> c_int;
            pub fn lh_count(c: *mut LhCtx) -> u64;
            pub fn lh_lookup(c: *mut LhCtx, key: u64, len: *mut u64, fill: *mut u8) -> c_int;
            pub fn lh_verify(c: *mut LhCtx, msg: *mut c_char, cap: usize) -> i64;
            pub fn lh_pm_used(c: *mut LhCtx) -> u64;
            pub fn lh_alloc_create(path: *const c_char, size: u64, nslots: u64) -> *mut LhCtx;
            pub fn lh_alloc_close(p: *mut LhCtx);
            pub fn lh_alloc_run(p: *mut LhCtx, ops: *const u64, n: usize) -> c_int;
        }
    }

    static FORCE_PMEM: Once = Once::new();

    pub(super) fn force_pmem() {
        FORCE_PMEM.call_once(|| {
            if std::env::var_os("PMEM_IS_PMEM_FORCE").is_none() {
                // SAFETY: setting a variable races with threads reading the environment
                // through libc without std's lock. This runs once, and every caller of
                // libpmemobj in this process comes through here first (`call_once`
                // blocks them until it is done), so libpmem has not read the
                // environment yet; std's own readers take the lock `set_var` takes. The
                // CLI calls it before starting any thread; in the test harness the other
                // threads read the environment only through std.
                unsafe { std::env::set_var("PMEM_IS_PMEM_FORCE", "1") };
            }
        });
    }

    /// A pool of persistent pointers for the random allocation workload
    /// (`struct lh_alloc_pool`, behind the same opaque type), closed when dropped.
    struct AllocPool(NonNull<ffi::LhCtx>);

    // SAFETY: the C side keeps no thread-local state for the pool; threads calling
    // `lh_alloc_run` at once work on disjoint slots (libpmemobj's allocator is
    // thread-safe), and closing takes the pool by value.
    unsafe impl Send for AllocPool {}
    // SAFETY: as above.
    unsafe impl Sync for AllocPool {}

    impl AllocPool {
        fn run(&self, ops: &[u64]) -> Result<(), String> {
            // SAFETY: the pool is live (owned by self); `ops` points at `ops.len()`
            // words, only read during the call.
            match unsafe { ffi::lh_alloc_run(self.0.as_ptr(), ops.as_ptr(), ops.len()) } {
                0 => Ok(()),
                code => Err(pmdk_error("pmemobj_alloc", code)),
            }
        }
    }

    impl Drop for AllocPool {
        fn drop(&mut self) {
            // SAFETY: the pool is live and closed once, here.
            unsafe { ffi::lh_alloc_close(self.0.as_ptr()) }
        }
    }

    /// Runs the random allocation workload on PMDK's allocator in a new pool at `path`
    /// of `size` bytes with `slots` persistent pointers: `preload` on one thread, then
    /// `per_thread[t]` on thread `t` (operations as `slot | size << 32`). The measured
    /// phase's seconds.
    pub(crate) fn alloc_random(
        path: &Path,
        size: u64,
        slots: u64,
        preload: &[u64],
        per_thread: &[Vec<u64>],
    ) -> Result<f64, String> {
        force_pmem();
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("{}: a NUL in the path", path.display()))?;
        // SAFETY: `c_path` is NUL-terminated and outlives the call.
        let pool = unsafe { ffi::lh_alloc_create(c_path.as_ptr(), size, slots) };
        let pool = AllocPool(NonNull::new(pool).ok_or_else(|| {
            pmdk_error(
                &format!("pmemobj_create {}", path.display()),
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            )
        })?);
        pool.run(preload)?;
        crate::harness::run_timed(per_thread.len(), |t| pool.run(&per_thread[t]))
            .map_err(|e| e.to_string())
    }

    /// libpmemobj's last error message on this thread, with `code` (an errno value).
    fn pmdk_error(what: &str, code: c_int) -> String {
        // SAFETY: lh_errormsg returns pmemobj_errormsg(): a NUL-terminated thread-local
        // buffer that stays valid until this thread's next libpmemobj call; it is copied
        // out at once.
        let msg = unsafe { CStr::from_ptr(ffi::lh_errormsg()) }
            .to_string_lossy()
            .into_owned();
        let os = (code != 0).then(|| std::io::Error::from_raw_os_error(code).to_string());
        match (msg.is_empty(), os) {
            (false, _) => format!("{what}: {msg}"),
            (true, Some(os)) => format!("{what}: {os}"),
            (true, None) => what.to_string(),
        }
    }

    /// A libpmemobj pool holding one workload's structure, closed when dropped (the
    /// caller removes the file).
    ///
    /// [`run`](Self::run) may be called from any number of threads at once: the C side
    /// serialises operations with locks (one per tree, a reader-writer one in the
    /// `-read95` workloads; stripes of buckets or of array elements; none in the
    /// `-lookup` workloads, which write nothing). The other methods take `&mut self`, so none of them runs beside it.
    pub struct PmdkStore {
        ctx: NonNull<ffi::LhCtx>,
        workload: Workload,
    }

    // SAFETY: the context is a heap object of the C side, used by no thread-local state;
    // concurrent `lh_run` calls are serialised by its locks (look-ups in the look-ups-only
    // mode take none: nothing writes then), and every other function is reached only
    // through `&mut self`.
    unsafe impl Send for PmdkStore {}
    // SAFETY: through `&self` only `lh_run` is reachable, which is safe to call from
    // several threads at once (see above).
    unsafe impl Sync for PmdkStore {}

    impl PmdkStore {
        /// Creates a pool file of `size` bytes at `path` (which must not exist) holding
        /// the empty structure of `stream`'s workload (SPS: the zeroed array; the hash
        /// table with [`OpStream::buckets`] buckets).
        pub fn create(path: &Path, size: u64, stream: &OpStream) -> Result<PmdkStore, String> {
            force_pmem();
            // SAFETY: lh_op_size only returns a constant.
            let c_size = unsafe { ffi::lh_op_size() };
            if c_size != size_of::<Op>() {
                return Err(format!(
                    "the C operation is {c_size} bytes, Rust's Op {}",
                    size_of::<Op>()
                ));
            }
            let workload = stream.workload();
            let kind: c_int = match workload {
                Workload::Sps => 0,
                Workload::RbtreeIns
                | Workload::RbtreeUpd
                | Workload::RbtreeRead95
                | Workload::RbtreeLookup => 1,
                Workload::BptreeIns | Workload::BptreeUpd => 2,
                _ => 3,
            };
            // `enum lh_mode`: insert, update, read-mostly, look-ups only.
            let mode: c_int = match workload {
                Workload::HashtableLookup | Workload::RbtreeLookup => 3,
                Workload::HashtableRead95 | Workload::RbtreeRead95 => 2,
                w if w.is_update() => 1,
                _ => 0,
            };
            let c_path = CString::new(path.as_os_str().as_encoded_bytes())
                .map_err(|_| format!("{}: a NUL in the path", path.display()))?;
            // SAFETY: `c_path` is a NUL-terminated string that outlives the call; the
            // other arguments are plain values.
            let ctx = unsafe {
                ffi::lh_create(
                    c_path.as_ptr(),
                    size,
                    kind,
                    mode,
                    stream.elements(),
                    stream.buckets(),
                )
            };
            match NonNull::new(ctx) {
                Some(ctx) => Ok(PmdkStore { ctx, workload }),
                None => Err(pmdk_error(
                    &format!("pmemobj_create {}", path.display()),
                    std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
                )),
            }
        }

        /// The workload the structure is for.
        pub fn workload(&self) -> Workload {
            self.workload
        }

        /// Preloads `ops` ([`OpStream::preload_op`]) in transactions of
        /// [`PRELOAD_BATCH`] operations.
        pub fn preload(&mut self, ops: &[Op]) -> Result<(), String> {
            // SAFETY: the context is live (owned by self, exclusively borrowed); `ops`
            // points at `ops.len()` initialised `Op`s, the layout of `struct lh_op`
            // (checked in `create`), only read during the call.
            let code = unsafe {
                ffi::lh_preload(
                    self.ctx.as_ptr(),
                    ops.as_ptr(),
                    ops.len(),
                    PRELOAD_BATCH as usize,
                )
            };
            match code {
                0 => Ok(()),
                code => Err(pmdk_error("preload transaction aborted", code)),
            }
        }

        /// Runs `ops` ([`OpStream::next_op`]), one transaction each, or for the
        /// read-heavy workloads' look-ups a look-up outside any transaction; returns
        /// what the look-ups found. Under the structure's locks no transaction aborts
        /// for a conflict: an abort is a failure (out of space), which ends the run with
        /// its error.
        pub fn run(&self, ops: &[Op]) -> Result<Lookups, String> {
            let mut found = Lookups::default();
            // SAFETY: the context is live while self is; lh_run may run on several
            // threads at once (its locks serialise the operations). `ops` points at
            // `ops.len()` `Op`s in the layout of `struct lh_op`, only read; `found` is a
            // local `Lookups` in the layout of `struct lh_lookups` (#[repr(C)], three
            // u64), which the call adds to.
            let code =
                unsafe { ffi::lh_run(self.ctx.as_ptr(), ops.as_ptr(), ops.len(), &raw mut found) };
            match code {
                0 => Ok(found),
                code => Err(pmdk_error("transaction aborted", code)),
            }
        }

        /// The entry count the structure keeps (SPS: the array's length).
        pub fn count(&mut self) -> u64 {
            // SAFETY: the context is live and exclusively borrowed.
            unsafe { ffi::lh_count(self.ctx.as_ptr()) }
        }

        /// Whether `key` is present, and its value's length and byte (SPS: element
        /// `key`'s value, as the length, and 0). An error when the value's bytes differ.
        pub fn lookup(&mut self, key: u64) -> Result<Option<(u64, u8)>, String> {
            let (mut len, mut fill) = (0u64, 0u8);
            // SAFETY: the context is live and exclusively borrowed; `len` and `fill`
            // are locals the call writes.
            let found =
                unsafe { ffi::lh_lookup(self.ctx.as_ptr(), key, &raw mut len, &raw mut fill) };
            match found {
                0 => Ok(None),
                1 => Ok(Some((len, fill))),
                _ => Err(format!("the value of key {key} is not {len} equal bytes")),
            }
        }

        /// Checks the structure's invariants (SPS: the array is a permutation of its
        /// indices; trees: order, balance, links, count; hash table: each key in its
        /// bucket, once, and the count); returns the entries found.
        pub fn verify(&mut self) -> Result<u64, String> {
            let mut msg = [0 as c_char; 256];
            // SAFETY: the context is live and exclusively borrowed; `msg` is a buffer
            // of `msg.len()` bytes that the call NUL-terminates when it writes it.
            let n = unsafe { ffi::lh_verify(self.ctx.as_ptr(), msg.as_mut_ptr(), msg.len()) };
            if n >= 0 {
                return Ok(n as u64);
            }
            // SAFETY: lh_verify wrote a NUL-terminated message into `msg` (snprintf).
            Err(unsafe { CStr::from_ptr(msg.as_ptr()) }
                .to_string_lossy()
                .into_owned())
        }

        /// Persistent memory held by live objects (their usable sizes, by a heap walk).
        pub fn pm_used(&mut self) -> u64 {
            // SAFETY: the context is live and exclusively borrowed.
            unsafe { ffi::lh_pm_used(self.ctx.as_ptr()) }
        }
    }

    impl Drop for PmdkStore {
        fn drop(&mut self) {
            // SAFETY: the context is live and dropped only here, once; no `run` is in
            // flight (they borrow self).
            unsafe { ffi::lh_close(self.ctx.as_ptr()) };
        }
    }

    /// Preload operations drawn and handed to C at a time (a multiple of the
    /// transaction size, so transactions are the same as logheap's).
    const PRELOAD_CHUNK: u64 = PRELOAD_BATCH * 1000;

    /// Preloads `store` with `stream`'s preload operations drawn from `rng`.
    pub(crate) fn preload(
        store: &mut PmdkStore,
        stream: &OpStream,
        rng: &mut impl rand::Rng,
    ) -> Result<(), String> {
        let n = stream.elements();
        let mut done = 0;
        while done < n {
            let chunk = PRELOAD_CHUNK.min(n - done);
            let ops: Vec<Op> = (done..done + chunk)
                .map(|i| stream.preload_op(i, rng))
                .collect();
            store.preload(&ops)?;
            done += chunk;
        }
        Ok(())
    }

    /// Runs `spec` on PMDK: a fresh pool in the harness's pool directory, the same
    /// preload and measured operations as logheap's harness, on `spec.threads` threads.
    pub(crate) fn run_reporting(
        spec: &RunSpec,
        phase: &dyn Fn(&str),
    ) -> Result<RunResult, Box<dyn std::error::Error>> {
        let dir = pool_dir(spec)?;
        let shape = Shape {
            elements: spec.elements,
            value_size: spec.value_size,
        };
        let start = Instant::now();
        let stream = OpStream::new(spec.workload, shape);
        let mut store =
            PmdkStore::create(&dir.path().join("bench.pool"), pool_size(spec), &stream)?;
        let mut rng = preload_rng(spec.seed);
        phase(&format!("preloading {} elements", spec.elements));
        preload(&mut store, &stream, &mut rng)?;
        let preload_seconds = start.elapsed().as_secs_f64();

        let threads = spec.threads.max(1);
        // Each thread's operations are drawn before the clock starts, as logheap's
        // harness draws them.
        let per_thread: Vec<Vec<Op>> = (0..threads)
            .map(|t| stream.thread_ops(spec.seed, spec.ops, threads, t))
            .collect();
        phase(&format!("measuring {} transactions", spec.ops));
        let lookups = std::sync::Mutex::new(Lookups::default());
        let seconds = crate::harness::run_timed(threads, |t| {
            let found = store.run(&per_thread[t])?;
            lookups.lock().unwrap_or_else(|p| p.into_inner()).add(found);
            Ok::<_, String>(())
        })?;
        let lookups = lookups.into_inner().unwrap_or_else(|p| p.into_inner());
        let ops: u64 = per_thread.iter().map(|o| o.len() as u64).sum();
        let pm_bytes_used = store.pm_used();
        drop(store);
        // Operations run under locks and are never retried (see `PmdkStore::run`), so
        // aborts stay 0; fences and flushes are not counted on PMDK.
        Ok(RunResult {
            ops,
            elements: spec.elements,
            value_size: spec.value_size,
            seconds,
            tx_per_s: ops as f64 / seconds.max(1e-9),
            pm_bytes_used: Some(pm_bytes_used),
            preload_seconds,
            lookups: spec.workload.is_read_heavy().then_some(lookups.lookups),
            lookups_found: spec.workload.is_read_heavy().then_some(lookups.found),
            ..RunResult::unmeasured(ENGINE, spec.workload, threads)
        })
    }
}

#[cfg(all(test, logheap_pmdk))]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;
    use crate::workload::{Lookups, Op, OpStream, Shape, Workload, model, preload_rng};

    const ELEMENTS: u64 = 600;
    const OPS: u64 = 1500;
    const SEED: u64 = 7;

    /// A structure on PMDK after the preload and a measured phase on `threads` threads,
    /// with the operations it ran (preload, then each thread's) and what the look-ups
    /// found.
    fn run_on_pmdk(
        workload: Workload,
        threads: usize,
    ) -> (PmdkStore, Vec<Op>, Vec<Vec<Op>>, Lookups) {
        let dir = match std::path::Path::new("/dev/shm") {
            shm if shm.is_dir() => tempfile::tempdir_in(shm),
            _ => tempfile::tempdir(),
        }
        .unwrap();
        let stream = OpStream::new(
            workload,
            Shape {
                elements: ELEMENTS,
                value_size: 64,
            },
        );
        let mut store =
            PmdkStore::create(&dir.path().join("test.pool"), 64 << 20, &stream).unwrap();
        let mut rng = preload_rng(SEED);
        let preload: Vec<Op> = (0..stream.elements())
            .map(|i| stream.preload_op(i, &mut rng))
            .collect();
        store.preload(&preload).unwrap();
        let per_thread: Vec<Vec<Op>> = (0..threads)
            .map(|t| stream.thread_ops(SEED, OPS, threads, t))
            .collect();
        let mut found = Lookups::default();
        std::thread::scope(|s| {
            let store = &store;
            let workers: Vec<_> = per_thread
                .iter()
                .map(|ops| s.spawn(move || store.run(ops)))
                .collect();
            for w in workers {
                found.add(w.join().unwrap().expect("the run"));
            }
        });
        // The pool file is unlinked now; the mapping stays until the store is dropped.
        drop(dir);
        (store, preload, per_thread, found)
    }

    fn check_one_thread(workload: Workload) {
        let (mut store, preload, ops, found) = run_on_pmdk(workload, 1);
        let ops = &ops[0];
        assert_eq!(ops.len() as u64, OPS);
        if workload == Workload::Sps {
            let mut a: Vec<u64> = (0..ELEMENTS).collect();
            for op in ops {
                a.swap(op.key as usize, op.other as usize);
            }
            assert_eq!(store.verify(), Ok(ELEMENTS));
            for (i, &v) in a.iter().enumerate() {
                assert_eq!(store.lookup(i as u64), Ok(Some((v, 0))), "element {i}");
            }
            return;
        }
        // The model: the preload inserts; then inserts, or toggles for updates; the
        // look-ups find what it holds.
        let (want, m) = model::lookups(workload, &preload, ops);
        assert_eq!(model::preloaded(&preload).len() as u64, ELEMENTS);
        assert_eq!(found, want, "{workload}: what the look-ups found");
        assert_eq!(found.lookups > 0, workload.is_read_heavy(), "{workload}");
        if workload.is_read_heavy() {
            assert!(0 < found.found && found.found < found.lookups, "{found:?}");
        }
        let mut replay = model::preloaded(&preload);
        let mut removed = 0;
        for op in ops {
            let before = replay.len();
            model::apply(workload, &mut replay, op);
            removed += usize::from(replay.len() < before);
        }
        let toggles = matches!(workload, Workload::HashtableRead95 | Workload::RbtreeRead95)
            || workload.is_update();
        assert_eq!(removed > 0, toggles, "{workload}");
        assert_eq!(store.count(), m.len() as u64, "{workload}");
        assert_eq!(store.verify(), Ok(m.len() as u64), "{workload}");
        for op in preload.iter().chain(ops) {
            assert_eq!(
                store.lookup(op.key),
                Ok(m.get(&op.key).copied()),
                "{workload}: key {}",
                op.key
            );
        }
    }

    fn check_two_threads(workload: Workload) {
        let (mut store, preload, per_thread, found) = run_on_pmdk(workload, 2);
        assert_eq!(per_thread.iter().map(Vec::len).sum::<usize>() as u64, OPS);
        assert!(per_thread.iter().all(|o| !o.is_empty()));
        if workload == Workload::Sps {
            // Swaps in any order leave a permutation.
            assert_eq!(store.verify(), Ok(ELEMENTS));
            assert_eq!(store.count(), ELEMENTS);
            return;
        }
        // The order of the threads' operations is unknown, but a key's final presence is
        // not: insert workloads insert every key; update workloads toggle it, so it is
        // present when it was preloaded xor it occurs an odd number of times.
        let mut occurrences: HashMap<u64, (u64, Op)> = HashMap::new();
        let lookup = |op: &Op| workload.is_read_heavy() && op.other == Op::LOOKUP;
        let lookups = per_thread.iter().flatten().filter(|op| lookup(op)).count();
        assert_eq!(found.lookups, lookups as u64, "{workload}");
        if matches!(workload, Workload::HashtableLookup | Workload::RbtreeLookup) {
            // Nothing changes: each look-up finds what the preload left, in any order.
            let all: Vec<Op> = per_thread.concat();
            assert_eq!(found, model::lookups(workload, &preload, &all).0);
        }
        for op in per_thread.iter().flatten().filter(|op| !lookup(op)) {
            let e = occurrences.entry(op.key).or_insert((0, *op));
            e.0 += 1;
        }
        let preloaded: BTreeMap<u64, Op> = preload.iter().map(|op| (op.key, *op)).collect();
        let mut keys: Vec<u64> = preloaded.keys().copied().collect();
        keys.extend(occurrences.keys());
        keys.sort_unstable();
        keys.dedup();
        let mut present = 0u64;
        for &key in &keys {
            let before = preloaded.contains_key(&key);
            let (times, only) = occurrences
                .get(&key)
                .copied()
                .map_or((0, None), |(n, op)| (n, Some(op)));
            let expected = if workload.is_update() || workload.is_read_heavy() {
                before ^ (times % 2 == 1)
            } else {
                true
            };
            let found = store.lookup(key).unwrap();
            assert_eq!(found.is_some(), expected, "{workload}: key {key}");
            present += u64::from(expected);
            // A value written once is known whatever the interleaving.
            match (before, times, only) {
                (true, 0, _) if expected => {
                    let op = preloaded[&key];
                    assert_eq!(found, Some((op.len, op.fill)), "{workload}: key {key}");
                }
                (false, 1, Some(op)) => {
                    assert_eq!(found, Some((op.len, op.fill)), "{workload}: key {key}");
                }
                _ => {}
            }
        }
        assert_eq!(store.count(), present, "{workload}");
        assert_eq!(store.verify(), Ok(present), "{workload}");
    }

    #[test]
    fn every_workload_on_one_thread_matches_a_model_of_its_operations() {
        for w in Workload::ALL.into_iter().chain(Workload::READ_HEAVY) {
            check_one_thread(w);
        }
    }

    #[test]
    fn every_workload_on_two_threads_matches_the_model_of_both_streams() {
        for w in Workload::ALL.into_iter().chain(Workload::READ_HEAVY) {
            check_two_threads(w);
        }
    }

    #[test]
    fn each_pmdk_lookup_finds_exactly_what_the_model_holds() {
        for w in Workload::READ_HEAVY {
            let dir = tempfile::tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
                "/dev/shm"
            } else {
                "/tmp"
            })
            .unwrap();
            let shape = Shape {
                elements: 200,
                value_size: 40,
            };
            let stream = OpStream::new(w, shape);
            let mut store =
                PmdkStore::create(&dir.path().join("test.pool"), 32 << 20, &stream).unwrap();
            let mut rng = preload_rng(SEED);
            let preload: Vec<Op> = (0..stream.elements())
                .map(|i| stream.preload_op(i, &mut rng))
                .collect();
            store.preload(&preload).unwrap();
            let mut m = model::preloaded(&preload);
            for op in stream.thread_ops(SEED, 600, 1, 0) {
                let found = store.run(std::slice::from_ref(&op)).unwrap();
                let want = match model::apply(w, &mut m, &op) {
                    None => Lookups::default(),
                    Some(v) => Lookups {
                        lookups: 1,
                        found: u64::from(v.is_some()),
                        fill_sum: v.map_or(0, |(_, fill)| u64::from(fill)),
                    },
                };
                assert_eq!(found, want, "{w}: key {:#x}", op.key);
            }
            assert_eq!(store.verify(), Ok(m.len() as u64), "{w}");
        }
    }

    #[test]
    fn a_bench_run_on_pmdk_reports_what_it_measured_and_nothing_else() {
        assert!(pmdk_available());
        for (workload, threads) in [(Workload::HashtableUpd, 2), (Workload::KvstoreIns, 1)] {
            let spec = RunSpec {
                engine: ENGINE.into(),
                workload,
                threads,
                ops: 400,
                elements: 300,
                value_size: 128,
                seed: 3,
                emulation: Some(logheap::Emulation::PAPER),
                dir: None,
                utilisation: None,
                frag: Default::default(),
                time_limit: None,
                cleaner_threads: 0,
                alloc_batch: 1,
                home_cache: None,
                node_cache: None,
                data_checksums: false,
            };
            let r = crate::run(&spec).unwrap();
            assert_eq!((r.engine.as_str(), r.config.as_str()), ("pmdk", "pmdk"));
            assert_eq!((r.ops, r.threads, r.emulated), (400, threads, false));
            assert!(r.tx_per_s > 0.0 && r.seconds > 0.0);
            assert_eq!(r.fences_per_tx, None);
            assert_eq!(r.media_bytes_per_tx, None);
            assert_eq!(r.dram_bytes, None);
            // At least the preloaded entries' values.
            assert!(r.pm_bytes_used.unwrap() > 300 * 64, "{r:?}");
        }
    }
}
