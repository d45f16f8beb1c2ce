//! The crash simulator must catch a persistence protocol that is missing a flush or a
//! fence, and pass a correct one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use logheap::media::{CrashPoint, Media, MediaConfig, SimConfig};

const DATA: usize = 0;
const DATA_LEN: usize = 256;
const FLAG: usize = 1024;
const PATTERN: u8 = 0x5a;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Protocol {
    Correct,
    MissingFlush,
    MissingFence,
}

/// Publishes a record: data, then a valid flag. The invariant after any crash: if the
/// flag is set, the data is complete.
fn publish(media: &Media, protocol: Protocol) {
    media.write(DATA, &[PATTERN; DATA_LEN]);
    if protocol != Protocol::MissingFlush {
        media.flush(DATA, DATA_LEN);
    }
    if protocol != Protocol::MissingFence {
        media.fence();
    }
    media.write_u64(FLAG, 1);
    media.persist(FLAG, 8);
}

fn violations(point: &CrashPoint<'_>) -> u64 {
    let mut bad = 0;
    for image in point.images() {
        let flag = u64::from_le_bytes(image[FLAG..FLAG + 8].try_into().unwrap());
        let complete = image[DATA..DATA + DATA_LEN].iter().all(|&b| b == PATTERN);
        if flag == 1 && !complete {
            bad += 1;
        }
    }
    bad
}

/// Runs `protocol` on simulated media; returns (images checked, violations found).
fn check(protocol: Protocol) -> (u64, u64) {
    let media = Media::sim(4096, &MediaConfig::default(), SimConfig::default()).unwrap();
    let sim = media.crash_simulator().unwrap();
    let found = Arc::new(AtomicU64::new(0));
    let f = found.clone();
    sim.set_fence_hook(Box::new(move |point| {
        f.fetch_add(violations(point), Ordering::Relaxed);
    }));
    publish(&media, protocol);
    // The state after the last fence is a crash point too.
    let last = sim.with_crash_point(violations);
    let images = sim.images_offered() + sim.with_crash_point(|p| p.len() as u64);
    (images, found.load(Ordering::Relaxed) + last)
}

#[test]
fn correct_protocol_passes() {
    let (images, bad) = check(Protocol::Correct);
    assert!(images >= 3, "{images}");
    assert_eq!(bad, 0);
}

#[test]
fn missing_flush_is_caught() {
    let (_, bad) = check(Protocol::MissingFlush);
    assert!(bad > 0, "a protocol without the data flush must be caught");
}

#[test]
fn missing_fence_is_caught() {
    let (_, bad) = check(Protocol::MissingFence);
    assert!(
        bad > 0,
        "a protocol without the ordering fence must be caught"
    );
}

#[test]
fn fence_hook_sees_every_fence_and_images_are_deduplicated() {
    let media = Media::sim(4096, &MediaConfig::default(), SimConfig::default()).unwrap();
    let sim = media.crash_simulator().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    sim.set_fence_hook(Box::new(move |p| {
        s.lock().unwrap().push((p.fence_index(), p.len()))
    }));
    // Writing the same value twice gives identical images: they are offered once.
    media.write_u64(0, 9);
    media.write_u64(0, 9);
    media.flush(0, 8);
    media.fence();
    media.fence();
    let seen = seen.lock().unwrap().clone();
    // Fence 1: word 0 holds 0, 9 or 9 -> two distinct images. Fence 2: nothing pending.
    assert_eq!(seen, vec![(1, 2), (2, 1)]);
    assert_eq!(sim.persisted_image()[0], 9);
}

#[test]
fn unflushed_stores_of_another_thread_stay_pending() {
    let media = Media::sim(4096, &MediaConfig::default(), SimConfig::default()).unwrap();
    let sim = media.crash_simulator().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            media.write_u64(64, 5);
            media.flush(64, 8); // flushed by this thread, but never fenced by it
        });
    });
    media.fence();
    assert_eq!(sim.persisted_image()[64], 0);
    assert_eq!(sim.pending_lines(), 1);
}
