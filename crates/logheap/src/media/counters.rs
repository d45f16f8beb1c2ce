//! Persistence traffic counters.
//!
//! Each thread that touches a [`Media`](super::Media) gets its own cache-padded block of
//! counters, written only by that thread (a plain load and store, no locked instruction,
//! no shared cache line); [`CounterRegistry::sum`] adds the blocks up on demand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;

use super::cpu::CACHE_LINE;
use super::emulation::Emulation;

/// A snapshot of persistence traffic, summed over threads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MediaCounters {
    /// Persist barriers issued.
    pub fences: u64,
    /// Cache lines written back.
    pub lines_flushed: u64,
    /// Bytes stored with non-temporal instructions.
    pub nt_bytes: u64,
    /// Bytes stored to the media (cached or non-temporal): the modified bytes that wear
    /// NVM, the paper's "dirty bytes" (§5.3, Fig. 8). Write traffic ([`media_bytes`])
    /// is whole lines; this is the part of it that changed. A byte stored twice before
    /// it is written back counts twice. Not counted on media without durability.
    ///
    /// [`media_bytes`]: MediaCounters::media_bytes
    #[serde(default)]
    pub dirty_bytes: u64,
    /// Bytes written to the fast log buffer (001's on-chip log; not in `media_bytes`).
    #[serde(default)]
    pub fast_log_bytes: u64,
    /// Bytes the application asked to make persistent (reported by the layers above).
    pub payload_bytes: u64,
    /// Nanoseconds spent in NVM emulation delays.
    pub emulated_delay_ns: u64,
    /// Transactions committed (reported by the layers above).
    pub transactions: u64,
    /// Transactions that wrote something, among `transactions`.
    pub write_transactions: u64,
    /// Transaction attempts aborted (conflicts and errors).
    pub aborts: u64,
    /// Reads handed to the caller where the bytes lie, without a copy
    /// ([`Tx::read_with`](crate::Tx::read_with) on an engine that keeps committed bytes
    /// in place; reported by the layers above).
    #[serde(default)]
    pub reads_in_place: u64,
}

impl MediaCounters {
    /// Bytes that reached the media: `64 x lines flushed + non-temporal bytes`.
    pub fn media_bytes(&self) -> u64 {
        self.lines_flushed * CACHE_LINE as u64 + self.nt_bytes
    }

    /// Media bytes per payload byte, or `None` when no payload was written.
    pub fn write_amplification(&self) -> Option<f64> {
        (self.payload_bytes > 0).then(|| self.media_bytes() as f64 / self.payload_bytes as f64)
    }

    /// The traffic between an earlier snapshot and this one.
    pub fn since(&self, earlier: &MediaCounters) -> MediaCounters {
        MediaCounters {
            fences: self.fences.saturating_sub(earlier.fences),
            lines_flushed: self.lines_flushed.saturating_sub(earlier.lines_flushed),
            nt_bytes: self.nt_bytes.saturating_sub(earlier.nt_bytes),
            dirty_bytes: self.dirty_bytes.saturating_sub(earlier.dirty_bytes),
            fast_log_bytes: self.fast_log_bytes.saturating_sub(earlier.fast_log_bytes),
            payload_bytes: self.payload_bytes.saturating_sub(earlier.payload_bytes),
            emulated_delay_ns: self
                .emulated_delay_ns
                .saturating_sub(earlier.emulated_delay_ns),
            transactions: self.transactions.saturating_sub(earlier.transactions),
            write_transactions: self
                .write_transactions
                .saturating_sub(earlier.write_transactions),
            aborts: self.aborts.saturating_sub(earlier.aborts),
            reads_in_place: self.reads_in_place.saturating_sub(earlier.reads_in_place),
        }
    }
}

/// One thread's counters. Only the owning thread writes them.
#[derive(Debug, Default)]
pub(crate) struct ThreadCounters {
    fences: AtomicU64,
    lines_flushed: AtomicU64,
    nt_bytes: AtomicU64,
    dirty_bytes: AtomicU64,
    fast_log_bytes: AtomicU64,
    payload_bytes: AtomicU64,
    emulated_delay_ns: AtomicU64,
    transactions: AtomicU64,
    write_transactions: AtomicU64,
    aborts: AtomicU64,
    reads_in_place: AtomicU64,
    /// The owning thread's writes since its last fence, for NVM emulation (state of the
    /// thread, not counters of the sum): the emulated time of the sequential runs
    /// already ended, and the current run's first line and length in lines.
    ended_runs_ns: AtomicU64,
    run_start_line: AtomicU64,
    run_lines: AtomicU64,
}

/// Adds to a counter that only the calling thread writes: a load and a store, no RMW.
#[inline]
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

impl ThreadCounters {
    #[inline]
    pub(crate) fn add_fence(&self) {
        bump(&self.fences, 1);
    }
    #[inline]
    pub(crate) fn add_lines(&self, n: u64) {
        bump(&self.lines_flushed, n);
    }
    #[inline]
    pub(crate) fn add_nt_bytes(&self, n: u64) {
        bump(&self.nt_bytes, n);
    }
    #[inline]
    pub(crate) fn add_dirty_bytes(&self, n: u64) {
        bump(&self.dirty_bytes, n);
    }
    #[inline]
    pub(crate) fn add_fast_log_bytes(&self, n: u64) {
        bump(&self.fast_log_bytes, n);
    }
    #[inline]
    pub(crate) fn add_payload(&self, n: u64) {
        bump(&self.payload_bytes, n);
    }
    #[inline]
    pub(crate) fn add_emulated_delay(&self, ns: u64) {
        bump(&self.emulated_delay_ns, ns);
    }

    #[inline]
    pub(crate) fn add_transaction(&self, wrote: bool) {
        bump(&self.transactions, 1);
        bump(&self.write_transactions, wrote as u64);
    }
    #[inline]
    pub(crate) fn add_abort(&self) {
        bump(&self.aborts, 1);
    }
    #[inline]
    pub(crate) fn add_read_in_place(&self) {
        bump(&self.reads_in_place, 1);
    }
    /// Notes a write back of the lines `first_line .. first_line + lines` for NVM
    /// emulation ("Log-structured Non-volatile Main Memory" §5, after Mnemosyne): lines
    /// that overlap the current run or touch it (continuing it from its last line or the
    /// next one, or ending where it begins) join it, as a log append's blocks do; any
    /// other write ends it and starts a run of its own,
    /// as a write back of scattered home lines does, each a write of its own to NVM.
    #[inline]
    pub(crate) fn add_unfenced(&self, first_line: u64, lines: u64, emulation: &Emulation) {
        let start = self.run_start_line.load(Ordering::Relaxed);
        let run = self.run_lines.load(Ordering::Relaxed);
        let end = start + run;
        if run > 0 && first_line <= end && first_line + lines >= start {
            let new_start = start.min(first_line);
            let new_end = end.max(first_line + lines);
            self.run_start_line.store(new_start, Ordering::Relaxed);
            self.run_lines.store(new_end - new_start, Ordering::Relaxed);
            return;
        }
        if run > 0 {
            bump(
                &self.ended_runs_ns,
                emulation.delay_ns(run * CACHE_LINE as u64),
            );
        }
        self.run_start_line.store(first_line, Ordering::Relaxed);
        self.run_lines.store(lines, Ordering::Relaxed);
    }

    /// The emulated time of the writes since the last call (the last fence), which
    /// start again from none: each sequential run costs the NVM write latency or its
    /// length over the bandwidth, whichever is longer, and a fence with nothing to
    /// write back still costs the latency.
    #[inline]
    pub(crate) fn take_unfenced_ns(&self, emulation: &Emulation) -> u64 {
        let run = self.run_lines.load(Ordering::Relaxed);
        let ended = self.ended_runs_ns.load(Ordering::Relaxed);
        self.run_lines.store(0, Ordering::Relaxed);
        self.ended_runs_ns.store(0, Ordering::Relaxed);
        let current = if run > 0 {
            emulation.delay_ns(run * CACHE_LINE as u64)
        } else {
            0
        };
        (ended + current).max(emulation.write_latency_ns)
    }

    fn snapshot(&self) -> MediaCounters {
        MediaCounters {
            fences: self.fences.load(Ordering::Relaxed),
            lines_flushed: self.lines_flushed.load(Ordering::Relaxed),
            nt_bytes: self.nt_bytes.load(Ordering::Relaxed),
            dirty_bytes: self.dirty_bytes.load(Ordering::Relaxed),
            fast_log_bytes: self.fast_log_bytes.load(Ordering::Relaxed),
            payload_bytes: self.payload_bytes.load(Ordering::Relaxed),
            emulated_delay_ns: self.emulated_delay_ns.load(Ordering::Relaxed),
            transactions: self.transactions.load(Ordering::Relaxed),
            write_transactions: self.write_transactions.load(Ordering::Relaxed),
            aborts: self.aborts.load(Ordering::Relaxed),
            reads_in_place: self.reads_in_place.load(Ordering::Relaxed),
        }
    }
}

/// The counter blocks of every thread that used one media.
#[derive(Debug, Default)]
pub(crate) struct CounterRegistry {
    blocks: Mutex<Vec<Arc<CachePadded<ThreadCounters>>>>,
}

impl CounterRegistry {
    /// Registers a new block for the calling thread.
    pub(crate) fn register(&self) -> Arc<CachePadded<ThreadCounters>> {
        let block = Arc::new(CachePadded::new(ThreadCounters::default()));
        self.blocks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(block.clone());
        block
    }

    /// The sum over all threads, now.
    pub(crate) fn sum(&self) -> MediaCounters {
        let blocks = self
            .blocks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        blocks
            .iter()
            .map(|b| b.snapshot())
            .fold(MediaCounters::default(), |acc, c| MediaCounters {
                fences: acc.fences + c.fences,
                lines_flushed: acc.lines_flushed + c.lines_flushed,
                nt_bytes: acc.nt_bytes + c.nt_bytes,
                dirty_bytes: acc.dirty_bytes + c.dirty_bytes,
                fast_log_bytes: acc.fast_log_bytes + c.fast_log_bytes,
                payload_bytes: acc.payload_bytes + c.payload_bytes,
                emulated_delay_ns: acc.emulated_delay_ns + c.emulated_delay_ns,
                transactions: acc.transactions + c.transactions,
                write_transactions: acc.write_transactions + c.write_transactions,
                aborts: acc.aborts + c.aborts,
                reads_in_place: acc.reads_in_place + c.reads_in_place,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_sums_threads_and_amplification_is_derived() {
        let reg = Arc::new(CounterRegistry::default());
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let reg = reg.clone();
                std::thread::spawn(move || {
                    let c = reg.register();
                    c.add_fence();
                    c.add_lines(2);
                    c.add_payload(64);
                    c.add_dirty_bytes(10);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let sum = reg.sum();
        assert_eq!(sum.fences, 3);
        assert_eq!(sum.lines_flushed, 6);
        assert_eq!(sum.dirty_bytes, 30);
        assert_eq!(sum.media_bytes(), 6 * 64);
        assert_eq!(sum.write_amplification(), Some(2.0));
        assert_eq!(sum.since(&sum), MediaCounters::default());
        assert_eq!(MediaCounters::default().write_amplification(), None);
    }

    #[test]
    fn emulation_charges_each_sequential_run_once_and_each_scattered_line_alone() {
        let e = Emulation::PAPER; // 500 ns, 1 byte per ns
        let c = ThreadCounters::default();
        // Nothing written: a fence still costs the latency.
        assert_eq!(c.take_unfenced_ns(&e), 500);
        // A log append of 64 lines in four pieces, each from the line where the last
        // ended or the next one: one run of 4 KiB.
        for (first, lines) in [(100, 16), (116, 16), (131, 17), (148, 16)] {
            c.add_unfenced(first, lines, &e);
        }
        assert_eq!(c.take_unfenced_ns(&e), 4096);
        // Three scattered home lines: three writes of their own.
        for first in [7, 900, 40] {
            c.add_unfenced(first, 1, &e);
        }
        assert_eq!(c.take_unfenced_ns(&e), 1500);
        // A run, a line inside it again (the flushed head of a non-temporal copy),
        // then a line elsewhere: two.
        c.add_unfenced(10, 4, &e);
        c.add_unfenced(10, 1, &e);
        c.add_unfenced(14, 1, &e);
        c.add_unfenced(30, 1, &e);
        assert_eq!(c.take_unfenced_ns(&e), 1000);
        // A long run beside scattered lines: its bandwidth time and their latencies.
        c.add_unfenced(0, 16, &e);
        c.add_unfenced(1000, 1, &e);
        c.add_unfenced(2000, 1, &e);
        assert_eq!(c.take_unfenced_ns(&e), 1024 + 500 + 500);
    }
}
