//! The epoch-based reclamation domain of one pool: its own crossbeam-epoch
//! [`Collector`], so that its grace periods wait for its own threads only.
//!
//! **What it protects.** Everything of a pool that is freed or reused while readers may
//! still hold it is handed over through this pool's collector, and everything that reads
//! it pins this collector:
//!
//! - the mapping's sorted-array blocks (freed after a grace period when replaced) and
//!   skip-list nodes (recycled after one); node caches validate hits against the
//!   sequence words of those, so they are read under the same pin;
//! - log chunks reclaimed by the cleaner (back in the free pool after a grace period:
//!   [`ChunkPool::release`](super::chunks::ChunkPool::release)), read by every lookup's
//!   caller while it copies the bytes the mapping pointed it to.
//!
//! A transaction pins from begin to finish ([`LogScratch`](super::LogScratch)'s `pin`); every
//! other pin of the pool (the mapping's, for updates, recovery's replay, the bulk load,
//! the cleaner, statistics, the snapshot at close) is taken from the same collector,
//! nested (a counter increment) when the thread is already in a transaction.
//!
//! With crossbeam's process-wide default collector instead, a thread pinned *anywhere*
//! (a transaction held open on another pool, another pool's recovery, any other crate's
//! crossbeam user) held back every pool's grace periods: committers waiting for a
//! reclaimed chunk waited for threads that could never touch their pool.
//!
//! **Per-thread handles, and the hot path.** A thread takes part in a collector through
//! a [`LocalHandle`], one per (thread, collector). [`PoolEpoch::pin`] finds the calling
//! thread's handle for this pool in a thread-local list (registering one on first use)
//! and pins it. Measured (`pin_timing` below, release build, on the 2-core development
//! machine while another build ran, so to within a nanosecond or two): a nested pin of
//! the default collector costs 3.3-4.6 ns; one of [`PoolEpoch::pin`] 4.8-5.1 ns when
//! the thread uses one pool, 7.3-7.5 ns when this is the fourth it uses (the list is
//! searched in order); handing a `&Guard` down costs 0.3-0.5 ns. An outermost pin (a
//! transaction's begin) costs 6-9 ns either way, its fence dominating. So:
//!
//! - the transaction's read path, the one hot caller, hands its guard down
//!   ([`Mapping::lookup_pinned`](super::mapping::Mapping::lookup_pinned) under
//!   [`LogScratch`](super::LogScratch)'s `pin`): cheaper than the default collector's nested
//!   pin it replaces;
//! - everything else pins through [`PoolEpoch::pin`]: the mapping's updates (a sorted
//!   array pins only when it replaces its block; a skip-list update once, next to a
//!   commit's fence), recovery's replay, the bulk load, the cleaner, statistics, the
//!   snapshot at close. There a few nanoseconds do not show, and the mapping keeps its
//!   [`AddressMap`](super::mapping::AddressMap) API, so its callers (recovery's replay
//!   among them) need not carry guards around.
//!
//! **Pools that are gone.** A cached handle keeps its collector alive, and with it the
//! garbage its bag holds. When the last [`PoolEpoch`] of a pool is dropped (the engine
//! and its mapping), the dropping thread's handle for it is dropped at once; every other
//! thread drops its handles of dead pools the next time it registers a handle for
//! another pool, or when it exits. Then the collector's last reference goes and crossbeam
//! runs every deferred function it still holds. So a thread that opens many short-lived
//! pools keeps at most the handles of the pools it used since its last registration.
//!
//! **Deferred work** must own what it touches (an `Arc`, a heap block): it may run in
//! any thread that pins the pool, or after the engine is gone, when the last handle
//! drops. Every deferred function of the log engine does: block frees, the skip list's
//! recycled-node list, the chunk pool's released list.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_epoch::{Collector, Guard, LocalHandle};

/// One pool's reclamation domain: its collector. Clones share it.
#[derive(Debug, Clone)]
pub(crate) struct PoolEpoch {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Unique among all domains ever made in the process (the thread-local key).
    id: u64,
    collector: Collector,
}

/// A thread's handle for one pool's collector.
struct Cached {
    id: u64,
    /// Dead once every [`PoolEpoch`] of the pool is dropped.
    pool: Weak<Inner>,
    handle: LocalHandle,
}

thread_local! {
    /// The calling thread's handles, one per pool it has pinned.
    static HANDLES: RefCell<Vec<Cached>> = const { RefCell::new(Vec::new()) };
}

impl Default for PoolEpoch {
    fn default() -> Self {
        Self::new()
    }
}

impl PoolEpoch {
    /// A new domain with its own collector.
    pub(crate) fn new() -> PoolEpoch {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        PoolEpoch {
            inner: Arc::new(Inner {
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                collector: Collector::new(),
            }),
        }
    }

    /// Pins the calling thread in this pool's collector: until the guard is dropped, no
    /// memory this pool defers after now is freed or reused. Nested pins are cheap.
    #[inline]
    pub(crate) fn pin(&self) -> Guard {
        let id = self.inner.id;
        let found = HANDLES.try_with(|handles| {
            let handles = handles.try_borrow().ok()?;
            handles.iter().find(|c| c.id == id).map(|c| c.handle.pin())
        });
        match found {
            Ok(Some(guard)) => guard,
            Ok(None) => self.register_and_pin(),
            // The thread is exiting (its handles are gone): a handle of its own for this
            // guard, released with it.
            Err(_) => self.inner.collector.register().pin(),
        }
    }

    /// Whether `guard` pins this pool's collector.
    pub(crate) fn guards(&self, guard: &Guard) -> bool {
        guard.collector() == Some(&self.inner.collector)
    }

    /// Registers the calling thread with this pool's collector (dropping its handles
    /// of pools that are gone first), and pins.
    #[cold]
    fn register_and_pin(&self) -> Guard {
        let handle = self.inner.collector.register();
        let guard = handle.pin();
        let cached = Cached {
            id: self.inner.id,
            pool: Arc::downgrade(&self.inner),
            handle,
        };
        let dead = HANDLES.try_with(|handles| {
            let Ok(mut handles) = handles.try_borrow_mut() else {
                // Re-entered from within a pin (a deferred function pinning): the
                // guard keeps its handle's participant alive by itself.
                return Vec::new();
            };
            let (live, dead): (Vec<Cached>, Vec<Cached>) = std::mem::take(&mut *handles)
                .into_iter()
                .partition(|c| c.pool.strong_count() > 0);
            *handles = live;
            handles.push(cached);
            dead
        });
        // Outside the borrow: dropping a handle may run deferred functions.
        drop(dead);
        guard
    }

    /// Handles the calling thread holds (for tests).
    #[cfg(test)]
    fn thread_handles() -> usize {
        HANDLES.with(|h| h.borrow().len())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The pool is gone: drop this thread's handle now, so that, when no other thread
        // holds one, the collector goes and runs what it still defers.
        let id = self.id;
        let mine = HANDLES.try_with(|handles| {
            let mut handles = handles.try_borrow_mut().ok()?;
            let k = handles.iter().position(|c| c.id == id)?;
            Some(handles.swap_remove(k))
        });
        drop(mine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the drops of what a deferred function owned.
    struct Token(Arc<AtomicUsize>);
    impl Drop for Token {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn defer_token(epoch: &PoolEpoch, drops: &Arc<AtomicUsize>) {
        let token = Token(drops.clone());
        epoch.pin().defer(move || drop(token));
    }

    #[test]
    fn a_thread_pinned_in_one_pool_does_not_hold_back_another() {
        let (a, b) = (PoolEpoch::new(), PoolEpoch::new());
        let drops = Arc::new(AtomicUsize::new(0));
        let held = std::sync::Barrier::new(2);
        let done = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _pinned = a.pin();
                held.wait();
                done.wait();
            });
            held.wait();
            defer_token(&b, &drops);
            for _ in 0..100 {
                if drops.load(Ordering::Relaxed) == 1 {
                    break;
                }
                b.pin().flush();
            }
            assert_eq!(
                drops.load(Ordering::Relaxed),
                1,
                "b's grace period never ended"
            );
            // While a's garbage waits for the pinned thread.
            defer_token(&a, &drops);
            for _ in 0..100 {
                a.pin().flush();
            }
            assert_eq!(
                drops.load(Ordering::Relaxed),
                1,
                "a's grace period ended early"
            );
            done.wait();
        });
    }

    #[test]
    fn nested_pins_share_the_outer_one() {
        let a = PoolEpoch::new();
        let outer = a.pin();
        let inner = a.pin();
        assert_eq!(outer.collector(), inner.collector());
        assert_eq!(outer.collector(), Some(&a.inner.collector));
    }

    /// A thread that pinned many pools, each dropped afterwards, keeps none of their
    /// handles, and each pool's deferred functions ran (or were dropped) by then.
    #[test]
    fn handles_of_dropped_pools_are_pruned_and_their_garbage_goes() {
        let drops = Arc::new(AtomicUsize::new(0));
        let before = PoolEpoch::thread_handles();
        for i in 0..200 {
            let epoch = PoolEpoch::new();
            // Garbage left in this thread's bag, never flushed.
            defer_token(&epoch, &drops);
            drop(epoch);
            assert_eq!(
                drops.load(Ordering::Relaxed),
                i + 1,
                "pool {i}'s garbage is kept"
            );
        }
        assert_eq!(PoolEpoch::thread_handles(), before);

        // Pools used by another thread, which exits or registers again.
        // (`spawn` and `join`, not a scope: a scope may end before the thread's
        // thread-locals are destroyed.)
        let drops = Arc::new(AtomicUsize::new(0));
        let pools: Vec<PoolEpoch> = (0..50).map(|_| PoolEpoch::new()).collect();
        let (theirs, their_drops) = (pools.clone(), drops.clone());
        std::thread::spawn(move || {
            for p in &theirs {
                defer_token(p, &their_drops);
            }
        })
        .join()
        .unwrap();
        drop(pools);
        assert_eq!(
            drops.load(Ordering::Relaxed),
            50,
            "an exited thread kept garbage"
        );

        let drops = Arc::new(AtomicUsize::new(0));
        let pools: Vec<PoolEpoch> = (0..50).map(|_| PoolEpoch::new()).collect();
        let theirs = pools.clone();
        let used = std::sync::Barrier::new(2);
        let dropped = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                for p in &theirs {
                    defer_token(p, &drops);
                }
                assert_eq!(PoolEpoch::thread_handles(), 50);
                drop(theirs);
                used.wait();
                dropped.wait();
                // Registering with a new pool drops the handles of the dead ones.
                let fresh = PoolEpoch::new();
                drop(fresh.pin());
                assert_eq!(PoolEpoch::thread_handles(), 1);
                assert_eq!(
                    drops.load(Ordering::Relaxed),
                    50,
                    "dead pools' garbage is kept"
                );
            });
            used.wait();
            drop(pools);
            // The other thread still holds their handles (and their garbage).
            assert_eq!(drops.load(Ordering::Relaxed), 0);
            dropped.wait();
        });
    }

    /// Times pins: nested ones (inside an outer guard of the same collector, as the
    /// mapping's pins inside a transaction are) of the default collector, of a pool
    /// epoch that is the thread's only one and its fourth, and a guard handed down
    /// instead; and outermost ones (a transaction's begin). Run by hand, in release
    /// mode: `cargo test --release -p logheap --lib pin_timing -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing, run by hand"]
    fn pin_timing() {
        const N: u64 = 20_000_000;
        fn ns(n: u64, mut f: impl FnMut()) -> f64 {
            let start = std::time::Instant::now();
            for _ in 0..n {
                f();
            }
            start.elapsed().as_secs_f64() * 1e9 / n as f64
        }
        std::thread::spawn(|| {
            let first = PoolEpoch::new();
            let others: Vec<PoolEpoch> = (0..3).map(|_| PoolEpoch::new()).collect();
            let fourth = PoolEpoch::new();
            drop(first.pin());
            for o in &others {
                drop(o.pin()); // a thread that uses a few pools
            }
            for _ in 0..3 {
                let outer = crossbeam_epoch::pin();
                let default = ns(N, || drop(std::hint::black_box(crossbeam_epoch::pin())));
                drop(outer);
                let outer = first.pin();
                let only = ns(N, || drop(std::hint::black_box(first.pin())));
                drop(outer);
                let outer = fourth.pin();
                let fourth_nested = ns(N, || drop(std::hint::black_box(fourth.pin())));
                let handed = ns(N, || {
                    std::hint::black_box(&outer);
                });
                drop(outer);
                let default_outer = ns(N / 10, || {
                    drop(std::hint::black_box(crossbeam_epoch::pin()))
                });
                let pool_outer = ns(N / 10, || drop(std::hint::black_box(fourth.pin())));
                println!(
                    "nested pin: default collector {default:.2} ns, pool epoch {only:.2} ns \
                     (the thread's only one) / {fourth_nested:.2} ns (its 4th), guard handed \
                     down {handed:.2} ns; outermost: default {default_outer:.2} ns, pool \
                     epoch {pool_outer:.2} ns"
                );
            }
        })
        .join()
        .unwrap();
    }
}
