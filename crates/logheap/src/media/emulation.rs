//! NVM latency and bandwidth emulation ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §5).
//!
//! DRAM (or tmpfs) stands in for persistent memory. To see how an engine would behave
//! on slower NVM, each persist barrier (fence) waits for what the thread wrote back
//! since its previous fence, as the paper's simulation charges it (§5, "akin to that in
//! Mnemosyne"): "for a standalone NVMM write required to be immediately persisted, we
//! introduce an extra latency. For sequential NVMM writes that are executed together,
//! we consider both write latency and bandwidth [...] the max of the above write
//! latency and total write size / NVMM bandwidth". A sequential write is a run of
//! lines each written from where the last ended (a log append, a cleaner's copy); a
//! write back of lines elsewhere (the scattered home lines of an in-place update) is a
//! standalone write each. So a fence waits
//! `sum over runs of max(write latency, run bytes / bandwidth)`, and at least the
//! latency, by spinning on the time-stamp counter, calibrated once against the
//! monotonic clock. Mnemosyne's emulator does the same: a latency after each `clflush`,
//! a latency per write-combining buffer of scattered non-temporal stores, and
//! `max(latency, size / bandwidth)` for a sequential stream.
//!
//! Until this model, every byte written back before a fence counted as one sequential
//! write (`max(latency, all bytes / bandwidth)`): ten scattered home lines cost an
//! in-place engine no more than one log append of 640 bytes.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::cpu::read_tsc;

/// The fast log buffer's write time per line under [`Emulation::PAPER`]: an STT-RAM
/// write, about 10 ns (001 §5.1: write-optimised STT-RAM beside the cores), twice for
/// the line's two halves.
pub const FAST_LOG_LINE_NS: u64 = 20;

/// Extra cost charged at every fence to emulate NVM (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Emulation {
    /// Minimum time a fence takes, in nanoseconds (the NVM write latency).
    pub write_latency_ns: u64,
    /// NVM write bandwidth in bytes per second; `0` means unlimited.
    pub bandwidth_bytes_per_s: u64,
    /// Time a 64-byte line written to the fast log buffer takes (001's on-chip
    /// non-volatile log memory; [`Media::write_fast_log`](super::Media::write_fast_log)),
    /// in nanoseconds.
    #[serde(default)]
    pub fast_log_line_ns: u64,
}

impl Emulation {
    /// The settings of the paper: 500 ns write latency and 1 GB/s write bandwidth.
    pub const PAPER: Emulation = Emulation {
        write_latency_ns: 500,
        bandwidth_bytes_per_s: 1_000_000_000,
        fast_log_line_ns: FAST_LOG_LINE_NS,
    };

    /// How long one sequential write of `bytes` takes: the latency, or the bytes over
    /// the bandwidth when that is longer.
    pub fn delay_ns(&self, bytes: u64) -> u64 {
        let bandwidth_ns = if self.bandwidth_bytes_per_s == 0 {
            0
        } else {
            (bytes as u128 * 1_000_000_000 / self.bandwidth_bytes_per_s as u128) as u64
        };
        self.write_latency_ns.max(bandwidth_ns)
    }
}

/// A time-stamp counter calibrated against [`Instant`], for cheap busy waiting.
#[derive(Debug, Clone, Copy)]
pub struct TscClock {
    ticks_per_ns: f64,
}

impl TscClock {
    /// The process-wide clock, calibrated on first use (takes about 20 ms once).
    pub fn get() -> &'static TscClock {
        static CLOCK: OnceLock<TscClock> = OnceLock::new();
        CLOCK.get_or_init(TscClock::calibrate)
    }

    fn calibrate() -> TscClock {
        let start = Instant::now();
        let t0 = read_tsc();
        while start.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let t1 = read_tsc();
        let ns = start.elapsed().as_nanos() as f64;
        let ticks_per_ns = (t1.wrapping_sub(t0) as f64 / ns).max(1e-3);
        TscClock { ticks_per_ns }
    }

    /// Ticks of the counter per nanosecond (about the nominal clock in GHz).
    pub fn ticks_per_ns(&self) -> f64 {
        self.ticks_per_ns
    }

    /// Busy-waits `ns` nanoseconds from `start_tick` (a value of the counter taken by the
    /// caller, so that work already done since then counts toward the wait).
    pub fn spin_until(&self, start_tick: u64, ns: u64) {
        let ticks = (ns as f64 * self.ticks_per_ns) as u64;
        let deadline = start_tick.wrapping_add(ticks);
        while read_tsc() < deadline {
            std::hint::spin_loop();
        }
    }

    /// Current tick count.
    pub fn now(&self) -> u64 {
        read_tsc()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_is_latency_or_bandwidth_bound() {
        let e = Emulation::PAPER;
        assert_eq!(e.delay_ns(0), 500);
        assert_eq!(e.delay_ns(64), 500); // 64 ns of transfer < 500 ns latency
        assert_eq!(e.delay_ns(4096), 4096); // 1 GB/s = 1 byte per ns
        let unlimited = Emulation {
            write_latency_ns: 7,
            bandwidth_bytes_per_s: 0,
            fast_log_line_ns: 0,
        };
        assert_eq!(unlimited.delay_ns(1 << 30), 7);
    }

    #[test]
    fn tsc_clock_is_calibrated_to_a_plausible_rate() {
        let c = TscClock::get();
        // Any machine this runs on ticks between 100 MHz and 10 GHz.
        assert!(
            c.ticks_per_ns() > 0.1 && c.ticks_per_ns() < 10.0,
            "{}",
            c.ticks_per_ns()
        );
    }
}
