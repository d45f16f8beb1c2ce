//! Media counters, durability modes, non-temporal copies and NVM emulation.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use logheap::media::{Durability, Emulation, MapMode, Media, MediaConfig, SimConfig};

const LEN: usize = 1 << 20;

fn file_media(durability: Durability) -> (tempfile::TempDir, std::fs::File, Media) {
    let dir = tempfile::tempdir().unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.path().join("m"))
        .unwrap();
    file.set_len(LEN as u64).unwrap();
    // These tests count the instructions of each mode, whatever the medium.
    let config = MediaConfig::default()
        .durability(durability)
        .accept_process_crash_only();
    let media = Media::map_file(&file, LEN, &config).unwrap();
    (dir, file, media)
}

/// Writes three whole lines, flushes them and fences once.
fn three_lines_one_fence(media: &Media) {
    media.write(4096, &[0xab; 192]);
    media.add_payload(192);
    media.flush(4096, 192);
    media.fence();
}

#[test]
fn pmem_counts_three_lines_and_one_fence() {
    let (_dir, _file, media) = file_media(Durability::Pmem);
    assert_ne!(media.map_mode(), MapMode::Memory);
    three_lines_one_fence(&media);
    let c = media.counters();
    assert_eq!((c.lines_flushed, c.fences, c.nt_bytes), (3, 1, 0));
    assert_eq!(c.media_bytes(), 192);
    assert_eq!(c.write_amplification(), Some(1.0));
    assert_eq!(c.dirty_bytes, 192);
}

#[test]
fn dirty_bytes_count_every_byte_stored_not_whole_lines() {
    let (_dir, _file, media) = file_media(Durability::Pmem);
    media.write(100, &[1; 10]);
    media.write_u64(256, 7);
    media.fill(1000, 5, 0xff);
    media.write_nt(8192 + 3, &[2; 100]);
    media.flush(0, 2048);
    media.fence();
    let c = media.counters();
    assert_eq!(c.dirty_bytes, 10 + 8 + 5 + 100);
    assert!(
        c.media_bytes() > c.dirty_bytes,
        "whole lines are written back"
    );
    // Stores to a volatile media wear nothing.
    let (_dir2, _file2, volatile) = file_media(Durability::None);
    volatile.write(0, &[1; 64]);
    assert_eq!(volatile.counters().dirty_bytes, 0);
}

#[test]
fn none_counts_nothing() {
    let (_dir, _file, media) = file_media(Durability::None);
    three_lines_one_fence(&media);
    let c = media.counters();
    assert_eq!((c.lines_flushed, c.fences), (0, 0));
    assert_eq!(
        c.payload_bytes, 192,
        "payload is what the application wrote, in any mode"
    );
}

#[test]
fn msync_counts_and_writes_the_file() {
    let (_dir, file, media) = file_media(Durability::Msync);
    three_lines_one_fence(&media);
    let c = media.counters();
    assert_eq!((c.lines_flushed, c.fences), (3, 1));
    assert_eq!(media.msync_errors(), 0);
    let mut back = [0u8; 192];
    file.read_exact_at(&mut back, 4096).unwrap();
    assert!(back.iter().all(|&b| b == 0xab));
}

#[test]
fn unaligned_flush_counts_every_touched_line() {
    let (_dir, _file, media) = file_media(Durability::Pmem);
    media.write(60, &[1; 10]); // bytes 60..70 touch lines 0 and 1
    media.flush(60, 10);
    assert_eq!(media.counters().lines_flushed, 2);
}

#[test]
fn counters_are_summed_over_threads() {
    let (_dir, _file, media) = file_media(Durability::Pmem);
    std::thread::scope(|s| {
        for t in 0..4 {
            let media = &media;
            s.spawn(move || {
                for i in 0..100 {
                    let at = (t * 100 + i) * 64;
                    media.write_u64(at, i as u64);
                    media.persist(at, 8);
                }
            });
        }
    });
    let c = media.counters();
    assert_eq!((c.lines_flushed, c.fences), (400, 400));
}

#[test]
fn nontemporal_writes_count_as_nt_bytes_and_land() {
    let (_dir, _file, media) = file_media(Durability::Pmem);
    let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    media.write_nt(8192, &data);
    media.fence();
    let c = media.counters();
    assert_eq!(
        c.nt_bytes, 4096,
        "an aligned copy goes out entirely non-temporally"
    );
    assert_eq!(c.lines_flushed, 0);
    assert_eq!(media.read_vec(8192, 4096), data);
    // Unaligned: head and tail go through the cache and are flushed.
    media.write_nt(8192 + 3, &data[..100]);
    let c2 = media.counters().since(&c);
    // The destination starts 3 bytes past a page: 13 cached head bytes, 80 bytes of
    // aligned 16-byte stores, 7 cached tail bytes.
    assert_eq!(c2.nt_bytes, 80);
    assert!(c2.lines_flushed >= 1);
    assert_eq!(media.read_vec(8192 + 3, 100), &data[..100]);
}

#[test]
fn emulation_charges_latency_or_bandwidth_for_each_run_written_before_a_fence() {
    let (_dir, file, _media) = file_media(Durability::Pmem);
    let emulation = Emulation::PAPER;
    let media = Media::map_file(&file, LEN, &MediaConfig::default().emulation(emulation)).unwrap();
    media.fence();
    assert_eq!(media.counters().emulated_delay_ns, 500);
    media.write(0, &[7; 8192]);
    media.flush(0, 8192); // 128 lines = 8192 bytes at 1 GB/s = 8192 ns
    media.fence();
    assert_eq!(media.counters().emulated_delay_ns, 500 + 8192);
    // Scattered lines are standalone writes: each costs the latency (the paper's
    // simulation, after Mnemosyne), where one sequential run of as many bytes would
    // cost it once.
    for line in [3, 40, 17, 90] {
        media.write(line * 64, &[1; 8]);
        media.flush(line * 64, 8);
    }
    media.fence();
    assert_eq!(media.counters().emulated_delay_ns, 500 + 8192 + 4 * 500);
    // A sequential append in pieces (non-temporal, then the next piece where the last
    // ended) is one run.
    media.write_nt(16384, &[2; 200]);
    media.write_nt(0, &[]); // writes nothing back, so ends no run
    media.write_nt(16384 + 200, &[3; 104]);
    media.fence();
    assert_eq!(
        media.counters().emulated_delay_ns,
        500 + 8192 + 4 * 500 + 500
    );
}

#[test]
fn reads_see_writes_and_words_are_atomic() {
    let media = Media::sim(4096, &MediaConfig::default(), SimConfig::default()).unwrap();
    media.write_u64(64, 0x0102_0304_0506_0708);
    assert_eq!(media.read_u64(64), 0x0102_0304_0506_0708);
    media.fill(128, 16, 0xee);
    assert_eq!(media.read_vec(127, 18)[1..17], [0xee; 16]);
    let c = media.counters();
    media.persist(64, 8);
    assert_eq!(media.counters().since(&c).fences, 1);
}

#[test]
#[should_panic(expected = "outside")]
fn out_of_range_writes_are_refused() {
    let media = Media::sim(4096, &MediaConfig::default(), SimConfig::default()).unwrap();
    media.write(4090, &[0; 8]);
}

#[test]
fn the_fast_log_buffer_is_persistent_at_once_and_offers_a_crash_point_before() {
    let media = Media::sim(LEN, &MediaConfig::default(), SimConfig::default()).unwrap();
    let sim = media.crash_simulator().unwrap();
    let offered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = offered.clone();
    sim.set_fence_hook(Box::new(move |point| {
        // The crash just before the fast store: none of it is in any image.
        assert!(point.images().all(|img| img[4096..4104] == [0; 8]));
        seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }));
    media.write(64, &[9; 8]); // an ordinary store, pending
    media.write_fast_log(4096, &[7; 100]);
    assert_eq!(offered.load(std::sync::atomic::Ordering::Relaxed), 1);
    let image = sim.persisted_image();
    assert_eq!(
        &image[4096..4196],
        &[7; 100][..],
        "persistent with no fence"
    );
    assert_eq!(
        image[64], 0,
        "an ordinary store still needs its flush and fence"
    );
    let c = media.counters();
    assert_eq!((c.fences, c.lines_flushed, c.fast_log_bytes), (0, 0, 100));
    assert_eq!(
        c.media_bytes(),
        0,
        "fast log bytes are not NVM write traffic"
    );
}

#[test]
fn fast_log_stores_to_a_volatile_media_wear_nothing() {
    let (_dir, _file, volatile) = file_media(Durability::None);
    volatile.write_fast_log(0, &[1; 8]);
    let c = volatile.counters();
    assert_eq!((c.fast_log_bytes, c.dirty_bytes), (8, 0));
}
