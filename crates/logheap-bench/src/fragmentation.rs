//! The fragmentation workloads W1-W3 of "Log-structured Non-volatile Main Memory"
//! (USENIX ATC 2017, §5.4, Fig. 9), run on the log engine, on the persistent heap
//! (`alloc`, `alloc-log`: 002's allocator) and, as the paper's DRAM allocator
//! baselines, on glibc's malloc and on jemalloc.
//!
//! The paper takes the workloads from "Log-structured Memory for DRAM-based Storage"
//! (Rumble et al., FAST 2014) and follows its method, which this module follows too:
//! each workload has two phases that each allocate `total` bytes in objects of random
//! sizes; whenever live data would exceed `live` bytes, random live objects are freed
//! until it does not, so objects of phase two gradually displace those of phase one.
//! W2 and W3 free 90% of the live objects, chosen at random, between the phases.
//!
//! | workload | phase one | phase two | freed between |
//! |---|---|---|---|
//! | W1 | 100-150 B | 200-250 B | 0% |
//! | W2 | 100-150 B | 200-250 B | 90% |
//! | W3 | 1,000-2,000 B | 1,500-2,500 B | 90% |
//!
//! At the end, *fragmentation* = 1 - live bytes / held bytes, where live bytes are the
//! sizes the workload asked for of the objects still allocated (so both internal and
//! external fragmentation count), and held bytes are what the allocator holds for them:
//!
//! - `log`: the pool's chunks in use (in any log) times the chunk size;
//! - `alloc`, `alloc-log`: the heap's regions in use (segments and huge blocks) times
//!   the segment size; after the run, [`PersistentHeap::defragment`] punches the free
//!   pages out of them, and what is left is reported as the compacted figure;
//! - `glibc`: `arena + hblkhd` of `mallinfo2` at the end, less the bytes other code had
//!   in use before the run (`uordblks + hblkhd`); `mallinfo2` reports the main arena
//!   only, so the run must be on the process's main thread (it checks that the main
//!   arena saw its allocations);
//! - `jemalloc`: `stats.active` (bytes in pages that hold allocations) after an epoch
//!   advance, less its value before the run; `stats.resident` is reported beside it.
//!
//! Each engine's own count of the bytes in use is reported too (`allocator_bytes`:
//! glibc's `uordblks`, jemalloc's `stats.allocated`, the log engine's mapped live log
//! bytes), so the share of the waste that is per-object overhead can be told apart.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Mutex;
use std::time::Instant;

use logheap::alloc::{HeapOptions, PAddr, PersistentHeap};
use logheap::{Emulation, Error, MediaConfig, Pool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tikv_jemallocator::Jemalloc;

use crate::workload::Workload;

/// The engine name of glibc's malloc.
pub const GLIBC: &str = "glibc";
/// The engine name of jemalloc (used directly, not as the global allocator).
pub const JEMALLOC: &str = "jemalloc";

/// Whether `engine` is one of the DRAM allocator baselines (`glibc`, `jemalloc`).
pub fn is_dram_allocator(engine: &str) -> bool {
    engine == GLIBC || engine == JEMALLOC
}

/// One phase of a fragmentation workload: object sizes drawn uniformly from
/// `sizes`, and the share of live objects freed at random before it starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// Object sizes (inclusive).
    pub sizes: (u64, u64),
    /// Share of the live objects freed, at random, before the phase.
    pub free_before: f64,
}

/// The two phases of a fragmentation workload (`None` for other workloads).
pub fn phases(workload: Workload) -> Option<[Phase; 2]> {
    let p = |sizes, free_before| Phase { sizes, free_before };
    match workload {
        Workload::FragW1 => Some([p((100, 150), 0.0), p((200, 250), 0.0)]),
        Workload::FragW2 => Some([p((100, 150), 0.0), p((200, 250), 0.9)]),
        Workload::FragW3 => Some([p((1000, 2000), 0.0), p((1500, 2500), 0.9)]),
        _ => None,
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct FragSpec {
    /// `log` (or another log-engine name), `glibc` or `jemalloc`.
    pub engine: String,
    /// `frag-w1`, `frag-w2` or `frag-w3`.
    pub workload: Workload,
    /// Live bytes at most.
    pub live: u64,
    /// Bytes allocated by each phase.
    pub total: u64,
    /// Allocations per transaction (log engine).
    pub batch: u64,
    /// Pool size for the log engine; `None`: the smallest of the sizes tried in which
    /// the workload runs to its end without [`Error::PoolFull`], starting from the live
    /// bytes (allocation and free records fold into allocation checkpoints, so they
    /// take little room for long; 16 chunks at least) and 5% more each time.
    pub pool_size: Option<u64>,
    /// Seed of the sizes and of the objects freed.
    pub seed: u64,
    /// NVM emulation (log engine).
    pub emulation: Option<Emulation>,
    /// Directory for the pool file (default: `/dev/shm` when present).
    pub dir: Option<std::path::PathBuf>,
    /// Background cleaner threads (log engine; 0: cleaning inline only).
    pub cleaner_threads: usize,
}

/// What one fragmentation run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct FragOutcome {
    /// Allocations made.
    pub allocations: u64,
    /// Frees made.
    pub frees: u64,
    /// Wall time of both phases.
    pub seconds: f64,
    /// Bytes the workload has allocated at the end (the sizes it asked for).
    pub live_bytes: u64,
    /// Bytes the allocator holds for them (see the module docs).
    pub held_bytes: u64,
    /// The allocator's own count of the bytes in use.
    pub allocator_bytes: u64,
    /// jemalloc's `stats.resident` growth over the run.
    pub resident_bytes: Option<u64>,
    /// Log engine: the pool size the workload ran in.
    pub pool_bytes: Option<u64>,
    /// Log engine: the pool sizes that ended in `PoolFull` before it.
    pub pools_too_small: Vec<u64>,
    /// Log engine: the bytes held after [`Pool::compact`] at the end (the chunks in
    /// use times the chunk size, as `held_bytes`).
    pub compacted_held_bytes: Option<u64>,
    /// Log engine: the engine's figures at the end.
    pub log: Option<logheap::LogEngineStats>,
    /// Log engine: the persistence counters over the run.
    pub media: Option<logheap::MediaCounters>,
}

impl FragOutcome {
    /// 1 - live bytes / held bytes (0 when nothing is held).
    pub fn fragmentation(&self) -> f64 {
        if self.held_bytes == 0 {
            0.0
        } else {
            1.0 - self.live_bytes as f64 / self.held_bytes as f64
        }
    }

    /// Log engine: 1 - live bytes / bytes held after compaction.
    pub fn compacted_fragmentation(&self) -> Option<f64> {
        self.compacted_held_bytes
            .filter(|&h| h > 0)
            .map(|h| 1.0 - self.live_bytes as f64 / h as f64)
    }
}

/// An allocator the workload runs on: allocate `size` bytes filled with `fill`, free.
trait Heap {
    type Handle: Copy;
    /// Allocates and fills the objects of `sizes`, and frees `victims`, together (one
    /// transaction for the log engine); the handles of the new objects go to `out`.
    fn step(
        &mut self,
        sizes: &[(u64, u8)],
        victims: &[Self::Handle],
        out: &mut Vec<Self::Handle>,
    ) -> Result<(), Error>;
}

/// The workload, on `heap`: both phases; returns the live objects at the end with
/// their sizes, and the allocations and frees made.
fn drive<H: Heap>(
    heap: &mut H,
    spec: &FragSpec,
    live_objects: &mut Vec<(H::Handle, u64)>,
) -> Result<(u64, u64), Error> {
    let phases = phases(spec.workload).ok_or_else(|| {
        Error::InvalidConfig(format!("{} is no fragmentation workload", spec.workload))
    })?;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let mut live = 0u64;
    let (mut allocations, mut frees) = (0u64, 0u64);
    let batch = spec.batch.max(1) as usize;
    let mut sizes: Vec<(u64, u8)> = Vec::with_capacity(batch);
    let mut victims: Vec<H::Handle> = Vec::with_capacity(batch * 64);
    let mut made: Vec<H::Handle> = Vec::with_capacity(batch);
    for phase in phases {
        if phase.free_before > 0.0 {
            let n = (live_objects.len() as f64 * phase.free_before) as usize;
            let mut k = 0;
            while k < n {
                victims.clear();
                while victims.len() < batch * 16 && k < n {
                    let i = rng.random_range(0..live_objects.len());
                    let (h, size) = live_objects.swap_remove(i);
                    live -= size;
                    victims.push(h);
                    k += 1;
                }
                heap.step(&[], &victims, &mut made)?;
                frees += victims.len() as u64;
            }
        }
        let mut allocated = 0u64;
        while allocated < spec.total {
            sizes.clear();
            victims.clear();
            let mut incoming = 0;
            while sizes.len() < batch && allocated < spec.total {
                let size = rng.random_range(phase.sizes.0..=phase.sizes.1);
                sizes.push((size, rng.random()));
                allocated += size;
                incoming += size;
            }
            // Free random live objects (of either phase) until the new ones fit under
            // the cap, as the FAST 2014 workloads do.
            while live + incoming > spec.live && !live_objects.is_empty() {
                let i = rng.random_range(0..live_objects.len());
                let (h, size) = live_objects.swap_remove(i);
                live -= size;
                victims.push(h);
            }
            made.clear();
            heap.step(&sizes, &victims, &mut made)?;
            allocations += sizes.len() as u64;
            frees += victims.len() as u64;
            live += incoming;
            live_objects.extend(made.iter().zip(&sizes).map(|(&h, &(s, _))| (h, s)));
        }
    }
    Ok((allocations, frees))
}

/// The most objects live at once, for reserving the bookkeeping before measuring.
fn most_live(spec: &FragSpec) -> usize {
    let smallest = phases(spec.workload)
        .map(|p| p[0].sizes.0.min(p[1].sizes.0))
        .unwrap_or(1);
    (spec.live / smallest) as usize + spec.batch as usize + 1
}

/// Runs `spec` and measures its fragmentation.
pub fn run(spec: &FragSpec) -> Result<FragOutcome, Box<dyn std::error::Error>> {
    match spec.engine.as_str() {
        GLIBC => run_glibc(spec),
        JEMALLOC => run_jemalloc(spec),
        e if crate::alloc_bench::is_persistent_heap(e) => run_persistent_heap(spec),
        _ => run_log(spec),
    }
}

/// Tries pool sizes from `first` up, 5% more each time, until `attempt` runs to its end
/// (`Some`): the smallest pool the workload fits in, with the sizes that did not.
fn smallest_fitting(
    spec: &FragSpec,
    first: u64,
    attempt: impl Fn(u64) -> Result<Option<FragOutcome>, Box<dyn std::error::Error>>,
) -> Result<FragOutcome, Box<dyn std::error::Error>> {
    let mut tried = Vec::new();
    let mut size = spec.pool_size.unwrap_or(first);
    loop {
        match attempt(size)? {
            Some(mut outcome) => {
                outcome.pools_too_small = tried;
                return Ok(outcome);
            }
            None if spec.pool_size.is_some() => {
                return Err(format!(
                    "{} on {}: the pool of {size} bytes filled up",
                    spec.workload, spec.engine
                )
                .into());
            }
            None if size > 64 * spec.total.max(1 << 20) => {
                return Err(format!(
                    "{} on {}: full even in a pool of {size} bytes",
                    spec.workload, spec.engine
                )
                .into());
            }
            None => {
                tried.push(size);
                size += size / 20;
            }
        }
    }
}

// ---------------------------------------------------------------- the log engine

struct LogHeap<'p> {
    pool: &'p Pool,
    buf: Vec<u8>,
}

impl Heap for LogHeap<'_> {
    type Handle = u64;

    fn step(
        &mut self,
        sizes: &[(u64, u8)],
        victims: &[u64],
        out: &mut Vec<u64>,
    ) -> Result<(), Error> {
        let buf = &mut self.buf;
        self.pool.transaction(|tx| {
            out.clear();
            for &home in victims {
                tx.free(logheap::PPtr::<u8>::from_offset(home))?;
            }
            for &(size, fill) in sizes {
                let home = tx.alloc_bytes(size)?;
                buf.clear();
                buf.resize(size as usize, fill);
                tx.write_bytes(home, buf)?;
                out.push(home);
            }
            Ok::<_, Error>(())
        })
    }
}

fn run_log(spec: &FragSpec) -> Result<FragOutcome, Box<dyn std::error::Error>> {
    let chunk = logheap::LogOptions::default().chunk_size;
    smallest_fitting(spec, spec.live.max(16 * chunk), |size| {
        run_log_in(spec, size)
    })
}

/// One log-engine run in a pool of `size` bytes; `None` when it filled up.
fn run_log_in(
    spec: &FragSpec,
    size: u64,
) -> Result<Option<FragOutcome>, Box<dyn std::error::Error>> {
    let dir = crate::harness::pool_dir_in(spec.dir.as_deref())?;
    let mut config = crate::harness::config_with_cleaners(&spec.engine, spec.cleaner_threads)?
        .size(size)
        .reserve_space(false);
    if let Some(e) = spec.emulation {
        config = config.emulation(e);
    }
    let pool = Pool::create(dir.path().join("frag.pool"), &config)?;
    let mut objects = Vec::with_capacity(most_live(spec));
    let before = pool.stats();
    let start = Instant::now();
    let mut heap = LogHeap {
        pool: &pool,
        buf: Vec::new(),
    };
    let (allocations, frees) = match drive(&mut heap, spec, &mut objects) {
        Ok(n) => n,
        Err(Error::PoolFull) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let seconds = start.elapsed().as_secs_f64();
    let after = pool.stats();
    let chunk = pool.header().chunk_size;
    let live_bytes: u64 = objects.iter().map(|&(_, s)| s).sum();
    let compacted = pool.compact();
    let outcome = FragOutcome {
        allocations,
        frees,
        seconds,
        live_bytes,
        held_bytes: after.pm_bytes_used,
        allocator_bytes: after.log().map_or(0, |l| l.live_log_bytes),
        resident_bytes: None,
        pool_bytes: Some(size),
        pools_too_small: Vec::new(),
        compacted_held_bytes: Some(compacted.chunks_after * chunk),
        media: Some(after.media.since(&before.media)),
        log: after.log().cloned(),
    };
    pool.close()?;
    Ok(Some(outcome))
}

// ---------------------------------------------------------------- the persistent heap

/// The persistent heap: each object's pointer lives in a root slot (002's reference
/// passing), the handle is the slot's number, and every object is filled and persisted.
struct HeapRun<'h> {
    heap: &'h PersistentHeap,
    free_slots: Vec<u64>,
    buf: Vec<u8>,
}

impl HeapRun<'_> {
    fn slot(&self, i: u64) -> PAddr {
        self.heap
            .root()
            .checked_add(8 * i)
            .expect("slots are inside the root area")
    }
}

impl Heap for HeapRun<'_> {
    type Handle = u64;

    fn step(
        &mut self,
        sizes: &[(u64, u8)],
        victims: &[u64],
        out: &mut Vec<u64>,
    ) -> Result<(), Error> {
        for &s in victims {
            self.heap.deallocate(self.slot(s))?;
            self.free_slots.push(s);
        }
        for &(size, fill) in sizes {
            let s = self.free_slots.pop().ok_or(Error::PoolFull)?;
            let block = self.heap.allocate_into(self.slot(s), size)?;
            self.buf.clear();
            self.buf.resize(size as usize, fill);
            self.heap.write(block, &self.buf)?;
            self.heap.persist(block, size)?;
            out.push(s);
        }
        Ok(())
    }
}

fn run_persistent_heap(spec: &FragSpec) -> Result<FragOutcome, Box<dyn std::error::Error>> {
    let segment = HeapOptions::default().segment_size;
    smallest_fitting(spec, spec.live.max(16 * segment), |size| {
        run_persistent_heap_in(spec, size)
    })
}

/// One persistent-heap run in a heap of `size` bytes; `None` when it filled up.
fn run_persistent_heap_in(
    spec: &FragSpec,
    size: u64,
) -> Result<Option<FragOutcome>, Box<dyn std::error::Error>> {
    let dir = crate::harness::pool_dir_in(spec.dir.as_deref())?;
    let slots = most_live(spec) as u64;
    let heap = PersistentHeap::create(
        dir.path().join("frag.heap"),
        &HeapOptions {
            size,
            arenas: 1,
            root_size: (slots * 8).next_multiple_of(64),
            media: MediaConfig {
                emulation: spec.emulation,
                ..MediaConfig::default()
            },
            metadata: crate::alloc_bench::policy_of(&spec.engine),
            reserve_space: false,
            ..HeapOptions::default()
        },
    )?;
    let mut objects = Vec::with_capacity(slots as usize);
    let before = heap.stats();
    let start = Instant::now();
    let mut run = HeapRun {
        heap: &heap,
        free_slots: (0..slots).rev().collect(),
        buf: Vec::new(),
    };
    let (allocations, frees) = match drive(&mut run, spec, &mut objects) {
        Ok(n) => n,
        Err(Error::PoolFull) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let seconds = start.elapsed().as_secs_f64();
    let after = heap.stats();
    let live_bytes: u64 = objects.iter().map(|&(_, s)| s).sum();
    // The free pages inside the regions in use, punched: what the heap still holds.
    let punched = heap.defragment(u64::MAX)?;
    let free_regions = (after.regions - after.regions_used) * after.segment_size;
    let compacted = after.pm_bytes_used - punched.free_bytes.saturating_sub(free_regions);
    let outcome = FragOutcome {
        allocations,
        frees,
        seconds,
        live_bytes,
        held_bytes: after.pm_bytes_used,
        allocator_bytes: after.allocated_bytes,
        resident_bytes: None,
        pool_bytes: Some(size),
        pools_too_small: Vec::new(),
        compacted_held_bytes: Some(compacted),
        log: None,
        media: Some(after.media.since(&before.media)),
    };
    heap.close()?;
    Ok(Some(outcome))
}

// ---------------------------------------------------------------- glibc malloc

struct Glibc;

impl Heap for Glibc {
    type Handle = usize;

    fn step(
        &mut self,
        sizes: &[(u64, u8)],
        victims: &[usize],
        out: &mut Vec<usize>,
    ) -> Result<(), Error> {
        for &p in victims {
            // SAFETY: `p` came from `libc::malloc` below and is freed once (the
            // workload forgets a handle when it frees it).
            unsafe { libc::free(p as *mut libc::c_void) };
        }
        for &(size, fill) in sizes {
            // SAFETY: plain malloc of a non-zero size; the result is checked for null.
            let p = unsafe { libc::malloc(size as usize) } as *mut u8;
            if p.is_null() {
                return Err(Error::InvalidSize(size));
            }
            // SAFETY: `p` points to `size` writable bytes just allocated.
            unsafe { std::ptr::write_bytes(p, fill, size as usize) };
            out.push(p as usize);
        }
        Ok(())
    }
}

/// glibc's `mallinfo2` figures: (arena + hblkhd, uordblks + hblkhd).
fn mallinfo() -> (u64, u64) {
    // SAFETY: mallinfo2 only reads the allocator's state.
    let m = unsafe { libc::mallinfo2() };
    ((m.arena + m.hblkhd) as u64, (m.uordblks + m.hblkhd) as u64)
}

fn run_glibc(spec: &FragSpec) -> Result<FragOutcome, Box<dyn std::error::Error>> {
    let mut objects: Vec<(usize, u64)> = Vec::with_capacity(most_live(spec));
    // SAFETY: malloc_trim only gives free memory back to the system.
    unsafe { libc::malloc_trim(0) };
    let (_, in_use_before) = mallinfo();
    let start = Instant::now();
    let result = drive(&mut Glibc, spec, &mut objects);
    let seconds = start.elapsed().as_secs_f64();
    let (held_after, in_use_after) = mallinfo();
    let live_bytes: u64 = objects.iter().map(|&(_, s)| s).sum();
    let victims: Vec<usize> = objects.iter().map(|&(p, _)| p).collect();
    Glibc.step(&[], &victims, &mut Vec::new())?;
    let (allocations, frees) = result?;
    let allocator_bytes = in_use_after.saturating_sub(in_use_before);
    if allocator_bytes < live_bytes {
        return Err(format!(
            "glibc's main arena did not see the workload's allocations ({allocator_bytes} bytes in use for {live_bytes} live): mallinfo2 reports the main arena only, so run it on the process's main thread"
        )
        .into());
    }
    Ok(FragOutcome {
        allocations,
        frees,
        seconds,
        live_bytes,
        held_bytes: held_after.saturating_sub(in_use_before),
        allocator_bytes,
        resident_bytes: None,
        pool_bytes: None,
        pools_too_small: Vec::new(),
        compacted_held_bytes: None,
        log: None,
        media: None,
    })
}

// ---------------------------------------------------------------- jemalloc

struct Jem;

impl Heap for Jem {
    type Handle = (usize, u64);

    fn step(
        &mut self,
        sizes: &[(u64, u8)],
        victims: &[(usize, u64)],
        out: &mut Vec<(usize, u64)>,
    ) -> Result<(), Error> {
        for &(p, size) in victims {
            let layout =
                Layout::from_size_align(size as usize, 8).map_err(|_| Error::InvalidSize(size))?;
            // SAFETY: `p` came from `Jemalloc.alloc` with this layout and is freed once.
            unsafe { Jemalloc.dealloc(p as *mut u8, layout) };
        }
        for &(size, fill) in sizes {
            let layout =
                Layout::from_size_align(size as usize, 8).map_err(|_| Error::InvalidSize(size))?;
            // SAFETY: the layout has a non-zero size; the result is checked for null.
            let p = unsafe { Jemalloc.alloc(layout) };
            if p.is_null() {
                return Err(Error::InvalidSize(size));
            }
            // SAFETY: `p` points to `size` writable bytes just allocated.
            unsafe { std::ptr::write_bytes(p, fill, size as usize) };
            out.push((p as usize, size));
        }
        Ok(())
    }
}

/// jemalloc's statistics after an epoch advance: (allocated, active, resident).
pub fn jemalloc_stats() -> Result<(u64, u64, u64), String> {
    use tikv_jemalloc_ctl::{epoch, stats};
    let e = |e: tikv_jemalloc_ctl::Error| format!("jemalloc statistics: {e}");
    epoch::advance().map_err(e)?;
    Ok((
        stats::allocated::read().map_err(e)? as u64,
        stats::active::read().map_err(e)? as u64,
        stats::resident::read().map_err(e)? as u64,
    ))
}

/// jemalloc's statistics are process-wide: one jemalloc run at a time.
static JEMALLOC_RUN: Mutex<()> = Mutex::new(());

fn run_jemalloc(spec: &FragSpec) -> Result<FragOutcome, Box<dyn std::error::Error>> {
    let _one = JEMALLOC_RUN.lock().unwrap_or_else(|p| p.into_inner());
    let mut objects: Vec<((usize, u64), u64)> = Vec::with_capacity(most_live(spec));
    let (allocated_before, active_before, resident_before) = jemalloc_stats()?;
    let start = Instant::now();
    let result = drive(&mut Jem, spec, &mut objects);
    let seconds = start.elapsed().as_secs_f64();
    let (allocated, active, resident) = jemalloc_stats()?;
    let live_bytes: u64 = objects.iter().map(|&(_, s)| s).sum();
    let victims: Vec<(usize, u64)> = objects.iter().map(|&(h, _)| h).collect();
    Jem.step(&[], &victims, &mut Vec::new())?;
    let (allocations, frees) = result?;
    Ok(FragOutcome {
        allocations,
        frees,
        seconds,
        live_bytes,
        held_bytes: active.saturating_sub(active_before),
        allocator_bytes: allocated.saturating_sub(allocated_before),
        resident_bytes: Some(resident.saturating_sub(resident_before)),
        pool_bytes: None,
        pools_too_small: Vec::new(),
        compacted_held_bytes: None,
        log: None,
        media: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(engine: &str, workload: Workload) -> FragSpec {
        FragSpec {
            engine: engine.into(),
            workload,
            live: 256 << 10,
            total: 1 << 20,
            batch: 4,
            pool_size: None,
            seed: 3,
            emulation: None,
            dir: Some(std::env::temp_dir()),
            cleaner_threads: 0,
        }
    }

    #[test]
    fn the_log_engine_cleans_during_w2_and_its_figures_add_up() {
        let out = run(&spec("log", Workload::FragW2)).unwrap();
        let log = out.log.as_ref().unwrap();
        assert!(log.chunks_cleaned > 0, "{out:?}");
        assert!(out.live_bytes > 0 && out.live_bytes <= 256 << 10, "{out:?}");
        // The engine's count of live allocated bytes is the workload's.
        assert_eq!(log.allocated_bytes, out.live_bytes, "{out:?}");
        let f = out.fragmentation();
        assert!((0.0..1.0).contains(&f), "{f}");
        // It ran in a pool smaller than all it allocated (2 MiB).
        assert!(out.pool_bytes.unwrap() < 2 << 20, "{out:?}");
    }

    #[test]
    fn the_persistent_heap_runs_every_workload_and_defragmenting_holds_less() {
        for engine in [crate::alloc_bench::ALLOC, crate::alloc_bench::ALLOC_LOG] {
            for w in [Workload::FragW1, Workload::FragW2, Workload::FragW3] {
                let out = run(&spec(engine, w)).unwrap();
                assert!(out.live_bytes > 0 && out.live_bytes <= 256 << 10, "{out:?}");
                // Usable sizes round the asked-for ones up, never down.
                assert!(out.allocator_bytes >= out.live_bytes, "{out:?}");
                assert!(out.held_bytes >= out.allocator_bytes, "{out:?}");
                let compacted = out.compacted_held_bytes.unwrap();
                assert!(
                    compacted >= out.live_bytes && compacted < out.held_bytes,
                    "{out:?}"
                );
                assert!((0.0..1.0).contains(&out.fragmentation()), "{out:?}");
                // Every allocation persisted its pointer and its bytes.
                assert!(out.media.unwrap().fences >= 2 * out.allocations, "{out:?}");
            }
        }
    }

    #[test]
    fn jemalloc_figures_are_read_and_fragmentation_is_a_fraction() {
        for w in [Workload::FragW1, Workload::FragW3] {
            let out = run(&spec(JEMALLOC, w)).unwrap();
            assert!(out.held_bytes >= out.live_bytes, "{w}: {out:?}");
            assert!(out.allocator_bytes >= out.live_bytes, "{w}: {out:?}");
            assert!(out.resident_bytes.is_some());
            let f = out.fragmentation();
            assert!((0.0..1.0).contains(&f), "{w}: {f}");
            assert!(
                out.frees > 0 && out.allocations > out.frees / 2,
                "{w}: {out:?}"
            );
        }
    }

    #[test]
    fn phases_follow_the_paper() {
        let [a, b] = phases(Workload::FragW3).unwrap();
        assert_eq!(
            (a.sizes, b.sizes, b.free_before),
            ((1000, 2000), (1500, 2500), 0.9)
        );
        assert_eq!(phases(Workload::FragW1).unwrap()[1].free_before, 0.0);
        assert!(phases(Workload::Sps).is_none());
    }
}
