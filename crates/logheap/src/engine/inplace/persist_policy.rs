//! How the undo engine persists its home stores, per page (001 §5.2, "adaptive caching
//! mode", in software).
//!
//! 001 sets a caching mode per page in the page table: write-back (stores cached, then
//! flushed), write-combining (stores bypass the cache and drain with the next sync) or
//! uncached (each store goes to memory at once, in order, with no sync needed). Its
//! adaptive policy starts every page write-combining, counts the writes to each page
//! during a sampling phase, then makes the pages written less than the average
//! uncached and the others write-combining, until the next sampling phase.
//!
//! Software cannot change a page's caching mode, so each mode becomes the way the
//! engine stores to that page:
//! - [`PersistPolicy::WriteBack`]: cached stores, then `clwb` of each line written (the
//!   engines' default);
//! - [`PersistPolicy::NonTemporal`]: non-temporal stores (write-combining), made
//!   durable by the transaction's fence without a flush;
//! - [`PersistPolicy::Uncached`]: each store persisted on its own (a non-temporal store
//!   and a fence: what an uncached store costs on NVM is its write latency, which the
//!   emulation charges at that fence);
//! - [`PersistPolicy::Adaptive`]: 001's policy over the last two, with phases counted
//!   in transactions instead of seconds (10,000 sampled, then 30,000 decided).
//!
//! Only `undo` takes a policy: its home stores are fenced by the committing thread
//! itself. `redo` leaves its home stores for a later fence, possibly another thread's,
//! which can write back a cached line (`clwb` works from any core) but cannot drain a
//! non-temporal store of another core.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use crate::media::Media;

/// How the undo engine persists its home stores (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PersistPolicy {
    /// Cached stores and a flush of each line written (write-back).
    #[default]
    WriteBack,
    /// Non-temporal stores (write-combining).
    NonTemporal,
    /// Each store persisted on its own (uncached).
    Uncached,
    /// 001's adaptive choice, per page, between non-temporal and uncached.
    Adaptive,
}

impl PersistPolicy {
    /// Every policy.
    pub const ALL: [PersistPolicy; 4] = [
        Self::WriteBack,
        Self::NonTemporal,
        Self::Uncached,
        Self::Adaptive,
    ];

    /// The suffix of the engine name (`undo`, `undo-nt`, `undo-uc`, `undo-adaptive`).
    pub fn suffix(self) -> &'static str {
        match self {
            Self::WriteBack => "",
            Self::NonTemporal => "-nt",
            Self::Uncached => "-uc",
            Self::Adaptive => "-adaptive",
        }
    }
}

/// Bytes of a page, the unit of a policy.
const PAGE: u64 = 4096;
/// Transactions of a sampling phase, and of the phase that follows it.
const SAMPLE_TXS: u64 = 10_000;
const DECIDED_TXS: u64 = 30_000;
/// Pages tracked (a larger pool shares counters between pages).
const MAX_PAGES: u64 = 1 << 22;
const NON_TEMPORAL: u8 = 0;
const UNCACHED: u8 = 1;

/// The home stores of an undo pool under a policy.
#[derive(Debug)]
pub(crate) struct HomeStores {
    policy: PersistPolicy,
    /// Adaptive: writes per page in this sampling phase, and each page's mode.
    writes: Box<[AtomicU32]>,
    modes: Box<[AtomicU8]>,
    /// Adaptive: transactions since the pool opened.
    transactions: AtomicU64,
}

impl HomeStores {
    pub(crate) fn new(policy: PersistPolicy, pool_size: u64) -> HomeStores {
        let pages = if policy == PersistPolicy::Adaptive {
            pool_size.div_ceil(PAGE).clamp(1, MAX_PAGES) as usize
        } else {
            0
        };
        HomeStores {
            policy,
            writes: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            modes: (0..pages).map(|_| AtomicU8::new(NON_TEMPORAL)).collect(),
            transactions: AtomicU64::new(0),
        }
    }

    fn page(&self, home: u64) -> usize {
        ((home / PAGE) % self.writes.len() as u64) as usize
    }

    /// Whether the adaptive policy is sampling now.
    fn sampling(&self) -> bool {
        self.transactions.load(Ordering::Relaxed) % (SAMPLE_TXS + DECIDED_TXS) < SAMPLE_TXS
    }

    /// Stores `data` at `home` under the policy. Write-back stores leave the lines to
    /// flush in `lines`; the transaction's fence makes every store durable.
    pub(crate) fn store(&self, media: &Media, home: u64, data: &[u8], lines: &mut Vec<u64>) {
        let uncached = match self.policy {
            PersistPolicy::WriteBack => {
                media.write(home as usize, data);
                let line = home / 64 * 64;
                lines.extend((line..home + data.len() as u64).step_by(64));
                return;
            }
            PersistPolicy::NonTemporal => false,
            PersistPolicy::Uncached => true,
            PersistPolicy::Adaptive => {
                let page = self.page(home);
                if self.sampling() {
                    self.writes[page].fetch_add(1, Ordering::Relaxed);
                    false
                } else {
                    self.modes[page].load(Ordering::Relaxed) == UNCACHED
                }
            }
        };
        media.write_nt(home as usize, data);
        if uncached {
            media.fence();
        }
    }

    /// A transaction that stored at home has committed: the adaptive policy decides
    /// the pages' modes when a sampling phase ends.
    pub(crate) fn transaction_done(&self) {
        if self.policy != PersistPolicy::Adaptive {
            return;
        }
        let n = self.transactions.fetch_add(1, Ordering::Relaxed) + 1;
        if n % (SAMPLE_TXS + DECIDED_TXS) != SAMPLE_TXS {
            return;
        }
        // The end of a sampling phase: pages written less than the average of the
        // pages written become uncached, the others (and those not written)
        // write-combining; the counts start again.
        let (sum, written) = self
            .writes
            .iter()
            .map(|w| w.load(Ordering::Relaxed) as u64)
            .filter(|&w| w > 0)
            .fold((0u64, 0u64), |(s, n), w| (s + w, n + 1));
        let average = sum as f64 / written.max(1) as f64;
        for (w, mode) in self.writes.iter().zip(self.modes.iter()) {
            let count = w.swap(0, Ordering::Relaxed);
            let uncached = count > 0 && (count as f64) < average;
            mode.store(
                if uncached { UNCACHED } else { NON_TEMPORAL },
                Ordering::Relaxed,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{MediaConfig, SimConfig};

    #[test]
    fn adaptive_makes_the_pages_written_less_than_average_uncached_after_sampling() {
        let media = Media::sim(
            64 * PAGE as usize,
            &MediaConfig::default(),
            SimConfig::default(),
        )
        .unwrap();
        let stores = HomeStores::new(PersistPolicy::Adaptive, 64 * PAGE);
        let mut lines = Vec::new();
        // Sampling: page 1 written 9 times per transaction, page 2 once.
        for _ in 0..SAMPLE_TXS {
            for _ in 0..9 {
                stores.store(&media, PAGE, &[1; 8], &mut lines);
            }
            stores.store(&media, 2 * PAGE, &[2; 8], &mut lines);
            stores.transaction_done();
        }
        assert!(lines.is_empty(), "no write-back stores");
        assert_eq!(stores.modes[1].load(Ordering::Relaxed), NON_TEMPORAL);
        assert_eq!(stores.modes[2].load(Ordering::Relaxed), UNCACHED);
        // Decided: a store to page 2 is persisted on its own (a fence), one to page 1
        // waits for the transaction's.
        let fences = media.counters().fences;
        stores.store(&media, 2 * PAGE, &[3; 8], &mut lines);
        assert_eq!(media.counters().fences, fences + 1);
        stores.store(&media, PAGE, &[3; 8], &mut lines);
        assert_eq!(media.counters().fences, fences + 1);
        // Write-back leaves every line written to flush.
        let wb = HomeStores::new(PersistPolicy::WriteBack, 64 * PAGE);
        wb.store(&media, 60, &[0; 10], &mut lines);
        assert_eq!(lines, [0, 64]);
    }
}
