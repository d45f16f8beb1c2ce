//! Measures what persistence costs on this machine: fence, flush, non-temporal copy, and
//! what the NVM emulation really adds per fence.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{
    Durability, Emulation, FlushInstruction, MapMode, Media, MediaConfig, MediaError, TscClock,
};

/// What to measure with.
#[derive(Debug, Clone)]
pub struct CalibrationOptions {
    /// Directory for the scratch file; `None` uses `/dev/shm` when present, else the
    /// system temporary directory.
    pub dir: Option<PathBuf>,
    /// Force a flush instruction; `None` uses the best the CPU has.
    pub flush: Option<FlushInstruction>,
    /// Emulated NVM write latency to check, in nanoseconds.
    pub latency_ns: u64,
    /// Emulated NVM bandwidth in bytes per second (0 = unlimited).
    pub bandwidth_bytes_per_s: u64,
    /// Repetitions of each small measurement.
    pub iterations: usize,
}

impl Default for CalibrationOptions {
    fn default() -> Self {
        CalibrationOptions {
            dir: None,
            flush: None,
            latency_ns: Emulation::PAPER.write_latency_ns,
            bandwidth_bytes_per_s: Emulation::PAPER.bandwidth_bytes_per_s,
            iterations: 100_000,
        }
    }
}

/// The measured costs. Times are averages per operation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Calibration {
    /// Flush instruction used.
    pub flush_instruction: FlushInstruction,
    /// One fence with nothing to write back.
    pub fence_ns: f64,
    /// Flush of one dirty cache line plus the fence that makes it durable.
    pub flush_line_ns: f64,
    /// Flush of a dirty 4 KiB page (64 lines) plus one fence.
    pub flush_4k_ns: f64,
    /// Non-temporal copy bandwidth into the mapping, including the final fence.
    pub nt_copy_gbps: f64,
    /// The emulated write latency asked for.
    pub emulated_latency_target_ns: u64,
    /// What a fence with emulation on costs beyond a plain fence, measured.
    pub emulated_latency_measured_ns: f64,
    /// Time-stamp counter rate used for emulation spins.
    pub tsc_ghz: f64,
    /// How the scratch file was mapped.
    pub map_mode: MapMode,
    /// The scratch file's directory.
    pub dir: PathBuf,
}

const SCRATCH_LEN: usize = 64 << 20;

/// Runs the measurements on a 64 MiB scratch file (deleted afterwards).
pub fn calibrate(options: &CalibrationOptions) -> Result<Calibration, MediaError> {
    let dir = options.dir.clone().unwrap_or_else(default_scratch_dir);
    let (file, path) = scratch_file(&dir).map_err(|source| MediaError::Map {
        len: SCRATCH_LEN,
        source,
    })?;
    let _ = std::fs::remove_file(&path);
    // The instructions' cost is measured, whatever the medium: pmem mode anywhere.
    let config = MediaConfig {
        durability: Durability::Pmem,
        process_crash_only: true,
        flush: options.flush,
        emulation: None,
    };
    let media = Media::map_file(&file, SCRATCH_LEN, &config)?;
    let clock = TscClock::get();
    let n = options.iterations.max(1000);
    let lines = SCRATCH_LEN / 64;

    let fence_ns = timed_ns(clock, n, |_| {}, |_| media.fence());
    let flush_line_ns = timed_ns(
        clock,
        n,
        |i| media.write_u64((i * 8191 % lines) * 64, i as u64),
        |i| media.persist((i * 8191 % lines) * 64, 64),
    );
    let pages = SCRATCH_LEN / 4096;
    let page = vec![0x5au8; 4096];
    let flush_4k_ns = timed_ns(
        clock,
        (n / 16).max(100),
        |i| media.write((i * 131 % pages) * 4096, &page),
        |i| media.persist((i * 131 % pages) * 4096, 4096),
    );

    let src = vec![0xa5u8; 1 << 20];
    let start = Instant::now();
    let rounds = 4;
    for _ in 0..rounds {
        for (k, chunk_start) in (0..SCRATCH_LEN).step_by(src.len()).enumerate() {
            media.write_nt(
                chunk_start,
                &src[..src.len().min(SCRATCH_LEN - chunk_start)],
            );
            if k % 16 == 15 {
                media.fence();
            }
        }
        media.fence();
    }
    let nt_copy_gbps = (rounds * SCRATCH_LEN) as f64 / start.elapsed().as_secs_f64() / 1e9;

    let emulated = Media::map_file(
        &file,
        SCRATCH_LEN,
        &config.emulation(Emulation {
            write_latency_ns: options.latency_ns,
            bandwidth_bytes_per_s: options.bandwidth_bytes_per_s,
            fast_log_line_ns: 0,
        }),
    )?;
    let m = (n / 5).max(1000);
    let plain = timed_ns(clock, m, |_| {}, |_| media.fence());
    let with_emulation = timed_ns(clock, m, |_| {}, |_| emulated.fence());

    Ok(Calibration {
        flush_instruction: media.flush_instruction(),
        fence_ns,
        flush_line_ns,
        flush_4k_ns,
        nt_copy_gbps,
        emulated_latency_target_ns: options.latency_ns,
        emulated_latency_measured_ns: (with_emulation - plain).max(0.0),
        tsc_ghz: clock.ticks_per_ns(),
        map_mode: media.map_mode(),
        dir,
    })
}

/// Average nanoseconds of `measured(i)` over `n` iterations, each after an untimed
/// `prepare(i)`, net of the cost of reading the clock.
fn timed_ns(
    clock: &TscClock,
    n: usize,
    mut prepare: impl FnMut(usize),
    mut measured: impl FnMut(usize),
) -> f64 {
    let mut ticks = 0u64;
    let mut overhead = 0u64;
    for i in 0..n {
        prepare(i);
        let t0 = clock.now();
        measured(i);
        let t1 = clock.now();
        let t2 = clock.now();
        ticks += t1.wrapping_sub(t0);
        overhead += t2.wrapping_sub(t1);
    }
    let net = ticks.saturating_sub(overhead).max(1);
    net as f64 / n as f64 / clock.ticks_per_ns()
}

/// `/dev/shm` (tmpfs) when it exists, else the system temporary directory.
pub(crate) fn default_scratch_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn scratch_file(dir: &Path) -> std::io::Result<(File, PathBuf)> {
    let path = dir.join(format!(
        "logheap-calibrate-{}-{}",
        std::process::id(),
        TscClock::get().now()
    ));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    file.set_len(SCRATCH_LEN as u64)?;
    Ok((file, path))
}
