//! Structure-aware fuzzing of opening and recovery, bounded so it runs in the test
//! suite on stable Rust: pool images with damaged or hostile headers, chunk headers,
//! blocks and entries — many with their checksums recomputed, so the contents themselves
//! are checked — and truncated files. Every one must open as a sound pool or be refused
//! with a typed error (by the open, or, for a chunk an open after a clean close checks
//! later, by the reads of it and the scrub): no panic, no hang, and no allocation
//! beyond a fixed bound.

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};

use logheap::media::SimConfig;
use logheap::{Config, Error, PPtr, Pool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Counts the bytes live on the heap, and the most ever live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CHUNK: usize = 4096;
const DATA: usize = 8192;
const POOL: usize = DATA + 64 * CHUNK;

/// Recovery runs on three threads: the parallel path is the one under test.
fn config() -> Config {
    Config::default()
        .size(POOL as u64)
        .chunk_size(CHUNK as u64)
        .recovery_threads(3)
}

/// A pool with allocations, updates and frees: cleanly closed, or crashed.
fn base_image(clean: bool) -> Vec<u8> {
    let pool = Pool::create_sim(&config(), SimConfig::default()).unwrap();
    let root: PPtr<[u64; 8]> = pool.root().unwrap();
    for i in 0..120u64 {
        pool.transaction(|tx| {
            let mut r = tx.read(root)?;
            let slot = (i % 8) as usize;
            if r[slot] != 0 && i % 3 == 0 {
                tx.free(PPtr::<u8>::from_offset(r[slot]))?;
                r[slot] = 0;
            } else if r[slot] == 0 {
                r[slot] = tx.alloc_bytes(16 + (i * 37) % 700)?;
            } else {
                tx.write_bytes(r[slot] + 3, &[i as u8; 9])?;
            }
            tx.write(root, &r)
        })
        .unwrap();
    }
    let media = pool.media().clone();
    if clean {
        pool.close().unwrap();
    }
    media.crash_simulator().unwrap().persisted_image()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A value to plant: often an edge (0, 1, all ones, a power of two), else random.
fn hostile(rng: &mut ChaCha8Rng) -> u64 {
    match rng.random_range(0..6) {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => 1 << rng.random_range(0..64),
        4 => rng.random_range(0..1 << 20),
        _ => rng.random(),
    }
}

/// The chunks with a header, and the blocks of each as (offset, length).
fn layout_of(image: &[u8]) -> Vec<(usize, Vec<(usize, usize)>)> {
    let mut out = Vec::new();
    for c in 0..(image.len().saturating_sub(DATA)) / CHUNK {
        let at = DATA + c * CHUNK;
        if &image[at..at + 4] != b"LHC1" {
            continue;
        }
        let mut blocks = Vec::new();
        let mut off = 64;
        while off + 24 <= CHUNK {
            let len = u32::from_le_bytes(image[at + off + 16..at + off + 20].try_into().unwrap());
            if u64_at(image, at + off) == 0 || len as usize > CHUNK {
                break;
            }
            let size = (24 + len as usize).next_multiple_of(16);
            blocks.push((off, size));
            off += size;
        }
        out.push((c, blocks));
    }
    out
}

/// Recomputes a chunk header's CRC (the documented format: CRC32C of bytes 0..60).
fn reseal_header(image: &mut [u8], chunk: usize) {
    let at = DATA + chunk * CHUNK;
    let crc = crc32c::crc32c(&image[at..at + 60]);
    image[at + 60..at + 64].copy_from_slice(&crc.to_le_bytes());
}

/// Recomputes a block's CRC: CRC32C over the chunk index, the chunk's generation, the
/// preamble's first 20 bytes and the entries.
fn reseal_block(image: &mut [u8], chunk: usize, off: usize) {
    let at = DATA + chunk * CHUNK;
    let generation = u64_at(image, at + 16);
    let b = at + off;
    let len = (u32::from_le_bytes(image[b + 16..b + 20].try_into().unwrap()) as usize)
        .min(CHUNK.saturating_sub(off + 24));
    let mut crc = crc32c::crc32c(&(chunk as u32).to_le_bytes());
    crc = crc32c::crc32c_append(crc, &generation.to_le_bytes());
    crc = crc32c::crc32c_append(crc, &image[b..b + 20]);
    crc = crc32c::crc32c_append(crc, &image[b + 24..b + 24 + len]);
    image[b + 20..b + 24].copy_from_slice(&crc.to_le_bytes());
}

/// One structure-aware mutation.
fn mutate(image: &mut Vec<u8>, rng: &mut ChaCha8Rng) {
    let chunks = layout_of(image);
    match rng.random_range(0..8) {
        // A header field, with the header's checksum recomputed or not.
        0 => {
            let at = 8 * rng.random_range(1..13);
            put_u64(image, at, hostile(rng));
            if rng.random_ratio(1, 2) {
                let crc = crc32c::crc32c(&image[..104]);
                image[104..108].copy_from_slice(&crc.to_le_bytes());
            }
        }
        // The superblock's marks and close record.
        1 => {
            let at = 512 + 8 * rng.random_range(0..16);
            put_u64(image, at, hostile(rng));
        }
        // A chunk header field (kind, owner, generation, predecessor, sequence), resealed.
        2 if !chunks.is_empty() => {
            let (c, _) = chunks[rng.random_range(0..chunks.len())];
            let at = DATA + c * CHUNK;
            match rng.random_range(0..4) {
                0 => image[at + 4 + rng.random_range(0..2)] = rng.random(),
                1 => image[at + 8..at + 12].copy_from_slice(&(hostile(rng) as u32).to_le_bytes()),
                2 => put_u64(image, at + 16, hostile(rng)),
                _ => put_u64(image, at + 24, hostile(rng)),
            }
            reseal_header(image, c);
        }
        // A block's version, peer, count or length, resealed: checksum-valid nonsense.
        3 | 4 if chunks.iter().any(|(_, b)| !b.is_empty()) => {
            let with: Vec<_> = chunks.iter().filter(|(_, b)| !b.is_empty()).collect();
            let (c, blocks) = with[rng.random_range(0..with.len())];
            let (off, _) = blocks[rng.random_range(0..blocks.len())];
            let b = DATA + c * CHUNK + off;
            match rng.random_range(0..3) {
                0 => put_u64(image, b, hostile(rng)),
                1 => put_u64(image, b + 8, hostile(rng)),
                _ => {
                    let len = (hostile(rng) as u32).to_le_bytes();
                    image[b + 16..b + 20].copy_from_slice(&len);
                }
            }
            reseal_block(image, *c, off);
        }
        // An entry header (home, tombstone, size) inside a block, resealed.
        5 if chunks.iter().any(|(_, b)| !b.is_empty()) => {
            let with: Vec<_> = chunks.iter().filter(|(_, b)| !b.is_empty()).collect();
            let (c, blocks) = with[rng.random_range(0..with.len())];
            let (off, size) = blocks[rng.random_range(0..blocks.len())];
            if size > 32 {
                let b = DATA + c * CHUNK + off;
                let at = b + 24 + 8 * rng.random_range(0..(size - 24) / 8);
                put_u64(image, at, hostile(rng));
                reseal_block(image, *c, off);
            }
        }
        // Cut the file short.
        6 => {
            let keep = rng.random_range(0..image.len());
            image.truncate(keep);
        }
        // Any byte.
        _ => {
            let at = rng.random_range(0..image.len());
            image[at] = rng.random();
        }
    }
}

/// Opens `image` and, when it opens, reads everything it holds: must not panic.
fn exercise(image: Vec<u8>) -> Result<bool, String> {
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let checked = logheap::check::check_image(image.clone()).map(|r| r.is_sound());
        let pool = match Pool::open_image(image, &config(), SimConfig::default()) {
            Ok(pool) => pool,
            Err(_) => return (false, checked),
        };
        let allocations = pool.allocations();
        let read = pool.read(|tx| {
            let mut buf = Vec::new();
            for &(home, len) in &allocations {
                buf.resize(len.min(1 << 16) as usize, 0);
                tx.read_bytes(home, &mut buf)?;
            }
            Ok::<_, Error>(())
        });
        // An open after a clean close checks the log's chunks after it: damage found
        // then fails the read that meets it, or is counted by the scrub (waited for).
        match read {
            Ok(()) => {}
            Err(Error::Corrupt { .. }) => return (false, checked),
            Err(e) => panic!("a read failed: {e}"),
        }
        let start = std::time::Instant::now();
        loop {
            let log = pool.stats().log().cloned().unwrap();
            if log.chunks_unchecked == 0 {
                return (log.chunks_damaged == 0, checked);
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(60),
                "no scrub"
            );
            std::thread::yield_now();
        }
    }));
    let (opened, checked) = outcome.map_err(|_| "panicked".to_string())?;
    if let Ok(sound) = checked
        && sound != opened
    {
        return Err(format!("check says sound={sound} but open={opened}"));
    }
    Ok(opened)
}

#[test]
fn hostile_pool_images_open_soundly_or_are_refused() {
    let bases = [base_image(true), base_image(false)];
    let mut rng = ChaCha8Rng::seed_from_u64(0x10c_4ea9);
    let (mut opened, mut refused) = (0, 0);
    let floor = LIVE.load(Ordering::Relaxed);
    PEAK.store(floor, Ordering::Relaxed);
    for case in 0..6000 {
        let mut image = bases[case % 2].clone();
        for _ in 0..rng.random_range(1..=3) {
            if !image.is_empty() {
                mutate(&mut image, &mut rng);
            }
        }
        match exercise(image) {
            Ok(true) => opened += 1,
            Ok(false) => refused += 1,
            Err(why) => panic!("case {case}: {why}"),
        }
    }
    eprintln!("{opened} opened, {refused} refused");
    assert!(
        opened > 400 && refused > 2000,
        "{opened} opened, {refused} refused"
    );
    // Opening a 270 KiB image needs a few MiB (its simulated media, the lock table, the
    // mapping); no hostile count or length may make it ask for more.
    let peak = PEAK.load(Ordering::Relaxed) - floor;
    assert!(peak < 64 << 20, "{peak} bytes at the peak");
}
