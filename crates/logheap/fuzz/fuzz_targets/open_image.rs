//! Coverage-guided fuzzing of opening a pool image (header validation, recovery,
//! `check`): any input must open as a sound pool or be refused with a typed error,
//! never panic. Run from `crates/logheap`: `cargo fuzz run open_image` (see the README).
#![no_main]

use libfuzzer_sys::fuzz_target;
use logheap::media::SimConfig;
use logheap::{Config, Pool};

fuzz_target!(|data: &[u8]| {
    // Bound the image so one input cannot ask for gigabytes of simulated media.
    if data.len() > 4 << 20 {
        return;
    }
    let _ = logheap::check::check_image(data.to_vec());
    if let Ok(pool) = Pool::open_image(data.to_vec(), &Config::default(), SimConfig::default()) {
        let allocations = pool.allocations();
        let _ = pool.read(|tx| {
            let mut buf = Vec::new();
            for &(home, len) in &allocations {
                buf.resize(len.min(1 << 16) as usize, 0);
                tx.read_bytes(home, &mut buf)?;
            }
            Ok::<_, logheap::Error>(())
        });
    }
});
