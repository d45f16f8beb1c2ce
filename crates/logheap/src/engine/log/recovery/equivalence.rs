//! Parallel recovery must give exactly what sequential recovery gives: the same mapping
//! (piece by piece), the same allocator, the same live bytes per chunk, the same report
//! and repair, or the same problems in the same order. Checked on pools written through
//! the public API by several threads, and on hand-made logs (valid and hostile, with
//! checksums that hold) that no commit would write.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::alloc::home::HomeAllocator;
use crate::engine::log::layout::{ChunkHeader, EntryRef, HOME_LIMIT, encode_block};
use crate::engine::log::mapping::{MappingConfig, PartitionIndex, Piece};
use crate::engine::log::superblock_of;
use crate::media::{MediaConfig, SimConfig};
use crate::{Config, PPtr, Pool, PoolFile};

/// Everything recovery decided, in a comparable form.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    pieces: Vec<Piece>,
    nodes: u64,
    allocations: Vec<(u64, u64)>,
    /// What the rebuilt allocator hands out next (its free lists, not only its live set).
    next_allocations: Vec<u64>,
    live: Vec<i64>,
    free_chunks: Vec<u32>,
    max_generation: u64,
    max_owner: u32,
    tails: String,
    report: RecoveryReport,
    in_log: CloseRecord,
    erase: Vec<(u64, u64)>,
    reclaim: Vec<u32>,
}

fn pieces(mapping: &Mapping) -> Vec<Piece> {
    let mut pieces = Vec::new();
    mapping.for_each_piece(|p| pieces.push(p));
    pieces.sort_unstable_by_key(|p| p.home);
    pieces
}

fn next_allocations(mut allocator: HomeAllocator) -> Vec<u64> {
    [8, 100, 128, 4096, 5000, 70_000, 16, 3000]
        .iter()
        .cycle()
        .take(40)
        .map(|&size| allocator.alloc(size).unwrap_or(0))
        .collect()
}

/// Recovers (as opening does) with `threads` threads.
fn recover_with(
    media: &Media,
    geometry: &ChunkGeometry,
    marks: Marks,
    close: Option<CloseRecord>,
    config: MappingConfig,
    (threads, seed): (usize, Option<&Seed>),
) -> Result<Outcome, Vec<Damage>> {
    let mapping = Mapping::new(config);
    let r = recover(
        media,
        geometry,
        marks,
        close,
        Ok(None),
        &mapping,
        (threads, seed, false),
    )?;
    Ok(Outcome {
        pieces: pieces(&mapping),
        nodes: mapping.nodes(),
        allocations: r.allocator.allocations(),
        next_allocations: next_allocations(r.allocator),
        live: r.live,
        free_chunks: r.free_chunks,
        max_generation: r.max_generation,
        max_owner: r.max_owner,
        tails: format!("{:?}", r.tails),
        report: r.report,
        in_log: r.in_log,
        erase: r.erase,
        reclaim: r.reclaim,
    })
}

/// What examining (as `logheap check` does) with `threads` threads found, field by
/// field.
fn examine_with(
    media: &Media,
    geometry: &ChunkGeometry,
    marks: Marks,
    close: Option<CloseRecord>,
    config: MappingConfig,
    (threads, seed): (usize, Option<&Seed>),
) -> Vec<String> {
    let mapping = Mapping::new(config);
    let found = examine(
        media,
        geometry,
        marks,
        close,
        Ok(None),
        &mapping,
        (threads, seed),
    );
    let mut out = vec![
        format!("report {:?}", found.report),
        format!("logs {:?}", found.logs),
        format!(
            "allocations {} {} live {}",
            found.allocations, found.allocated_bytes, found.live_log_bytes
        ),
        format!("pieces {:?}", pieces(&mapping)),
    ];
    out.extend(found.problems.iter().map(|p| format!("problem {p:?}")));
    out
}

/// The first difference of two lists, for messages.
fn first_difference(a: &[String], b: &[String]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "item {i}:
  one thread: {}
  several:    {}",
            a[i], b[i]
        ),
        None => format!("lengths {} and {}", a.len(), b.len()),
    }
}

/// Recovers and examines with 1 thread and with 2, 3 and 4, and requires the same
/// outcome. Returns whether recovery accepted the log.
fn same_with_any_threads(
    media: &Media,
    geometry: &ChunkGeometry,
    marks: Marks,
    close: Option<CloseRecord>,
    (config, seed): (MappingConfig, Option<&Seed>),
    what: &str,
) -> bool {
    let sequential = recover_with(media, geometry, marks, close, config, (1, seed));
    let examined = examine_with(media, geometry, marks, close, config, (1, seed));
    for threads in [2, 3, 4] {
        let parallel = recover_with(media, geometry, marks, close, config, (threads, seed));
        if parallel != sequential {
            let lines = |r: &Result<Outcome, Vec<Damage>>| match r {
                Ok(o) => format!("{o:#?}")
                    .lines()
                    .map(String::from)
                    .collect::<Vec<_>>(),
                Err(p) => p.iter().map(|d| format!("{d:?}")).collect(),
            };
            panic!(
                "{what}: recovery with {threads} threads differs from sequential recovery: {}",
                first_difference(&lines(&sequential), &lines(&parallel))
            );
        }
        let parallel = examine_with(media, geometry, marks, close, config, (threads, seed));
        assert!(
            parallel == examined,
            "{what}: examining with {threads} threads differs: {}",
            first_difference(&examined, &parallel)
        );
    }
    sequential.is_ok()
}

/// A mapping configuration: partitions from 64 B (entries and frees cut into many
/// pieces) to 64 KiB, either index, sometimes one list for everything.
fn mapping_config(rng: &mut ChaCha8Rng) -> MappingConfig {
    let mut config = MappingConfig::FULL;
    config.partition_size = [64, 256, 4096, 4096, 65536][rng.random_range(0..5)];
    if rng.random_ratio(1, 3) {
        config.index = PartitionIndex::SkipList;
    }
    if rng.random_ratio(1, 8) {
        config = MappingConfig::BASE;
    }
    config
}

/// Opens a pool image's log as [`LogEngine::open`](super::super::LogEngine::open) does
/// and compares recovery with one thread and with several.
fn same_for_image(image: Vec<u8>, config: MappingConfig, what: &str) -> bool {
    let file = PoolFile::open_image(image, &MediaConfig::default(), SimConfig::default())
        .expect("the image has a valid header");
    let media = file.media();
    let geometry = ChunkGeometry::of(file.header());
    let superblock = superblock_of(file.layout());
    let clean = file.was_clean();
    let Ok(marks) = superblock.read_marks(media, clean) else {
        return false;
    };
    let close = clean
        .then(|| superblock.read_close_record(media).ok())
        .flatten();
    same_with_any_threads(media, &geometry, marks, close, (config, None), what)
}

/// How many transactions recovering a crash image drops.
fn dropped_transactions(image: Vec<u8>) -> u64 {
    let file = PoolFile::open_image(image, &MediaConfig::default(), SimConfig::default()).unwrap();
    let media = file.media();
    let marks = superblock_of(file.layout())
        .read_marks(media, false)
        .unwrap();
    let geometry = ChunkGeometry::of(file.header());
    let config = MappingConfig::FULL;
    let recovered = recover_with(media, &geometry, marks, None, config, (1, None)).unwrap();
    recovered.report.dropped_transactions
}

/// Images of a pool written by several threads.
struct Images {
    /// After a crash once every transaction was committed.
    crashed: Vec<u8>,
    /// After a crash in the middle of a last transaction's commit (its blocks partly
    /// written: uncommitted blocks that recovery drops).
    torn: Vec<Vec<u8>>,
    /// Cleanly closed.
    clean: Vec<u8>,
}

/// Writes a pool with `threads` threads: objects of many sizes (some span partitions,
/// regions and chunks) allocated with initial data, overwritten in parts that overlap
/// earlier writes, freed and reallocated.
fn write_pool(seed: u64, threads: usize) -> Images {
    let config = Config::default().size(6 << 20).chunk_size(4096);
    let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
    std::thread::scope(|s| {
        for t in 0..threads {
            let pool = &pool;
            s.spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(seed * 100 + t as u64);
                let mut objects: Vec<(u64, u64)> = Vec::new();
                for _ in 0..60 {
                    let ops: Vec<(u32, u64, u64)> = (0..rng.random_range(1..6))
                        .map(|_| (rng.random_range(0..10), rng.random(), rng.random()))
                        .collect();
                    let before = objects.clone();
                    let done = pool.transaction(|tx| {
                        objects.clone_from(&before);
                        for &(op, a, b) in &ops {
                            match op {
                                0..=3 => {
                                    let size = match a % 10 {
                                        0..=5 => 8 + b % 300,
                                        6 | 7 => 300 + b % 5000,
                                        8 => 5000 + b % 20_000,
                                        _ => 60_000 + b % 80_000,
                                    };
                                    let home = tx.alloc_bytes(size)?;
                                    let fill = vec![(a as u8) | 1; (b % size + 1) as usize];
                                    tx.write_bytes(home + (size - fill.len() as u64), &fill)?;
                                    objects.push((home, size));
                                }
                                4 | 5 if !objects.is_empty() => {
                                    let (home, _) =
                                        objects.swap_remove((a as usize) % objects.len());
                                    tx.free(PPtr::<u8>::from_offset(home))?;
                                }
                                _ if !objects.is_empty() => {
                                    let (home, size) = objects[(a as usize) % objects.len()];
                                    let at = b % size;
                                    let len = (b >> 32) % (size - at).min(9000) + 1;
                                    tx.write_bytes(home + at, &vec![b as u8; len as usize])?;
                                }
                                _ => {}
                            }
                        }
                        Ok::<_, crate::Error>(())
                    });
                    if done.is_err() {
                        // The pool is full: free everything of this thread.
                        objects = before;
                        let _ = pool.transaction(|tx| {
                            for &(home, _) in &objects {
                                tx.free(PPtr::<u8>::from_offset(home))?;
                            }
                            Ok::<_, crate::Error>(())
                        });
                        objects.clear();
                    }
                }
            });
        }
    });
    let media = pool.media().clone();
    let sim = media.crash_simulator().unwrap();
    let crashed = sim.persisted_image();
    // A last transaction, crashed at its fence: every image a crash could leave.
    let torn = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = torn.clone();
    sim.set_fence_hook(Box::new(move |p| sink.lock().unwrap().extend(p.images())));
    pool.transaction(|tx| {
        let home = tx.alloc_bytes(9000)?;
        tx.write_bytes(home + 100, &[9; 5000])?;
        tx.write_bytes(crate::engine::log::ROOT_HOME, &[1; 8])
    })
    .ok();
    sim.take_fence_hook();
    let torn = std::mem::take(&mut *torn.lock().unwrap());
    pool.close().unwrap();
    Images {
        crashed,
        torn,
        clean: sim.persisted_image(),
    }
}

#[test]
fn pools_written_by_several_threads_recover_the_same_with_any_number_of_threads() {
    let (mut accepted, mut dropped) = (0, 0);
    for seed in 0..6 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let images = write_pool(seed, 1 + seed as usize % 3);
        // Images taken in the middle of the last commit: recovery drops what it wrote.
        let step = images.torn.len().div_ceil(8).max(1);
        for (k, image) in images.torn.iter().enumerate().step_by(step) {
            let name = format!("seed {seed}, torn image {k}");
            let before = fallbacks();
            assert!(same_for_image(image.clone(), MappingConfig::FULL, &name));
            assert_eq!(fallbacks(), before, "{name} was not replayed in parallel");
            dropped += dropped_transactions(image.clone());
        }
        for (what, image) in [("crashed", images.crashed), ("clean", images.clean)] {
            let config = mapping_config(&mut rng);
            let name = format!("seed {seed}, {what}, {}", config.label());
            let before = fallbacks();
            accepted += same_for_image(image.clone(), config, &name) as u32;
            assert_eq!(fallbacks(), before, "{name} was not replayed in parallel");
            // A few bytes changed: mostly refused, by the same problems.
            for k in 0..6 {
                let mut damaged = image.clone();
                for _ in 0..=k % 3 {
                    let at = rng.random_range(4096..damaged.len());
                    damaged[at] ^= 1 << rng.random_range(0..8);
                }
                same_for_image(damaged, config, &format!("{name}, damage {k}"));
            }
        }
    }
    assert_eq!(accepted, 12, "every undamaged pool is accepted");
    assert!(dropped > 0, "no image held part of the last commit");
}

/// A hand-made log: transactions (one block per kind each, every block its own cycle
/// so it counts as committed) appended to the three logs of log set 1.
struct LogImage {
    media: Media,
    geometry: ChunkGeometry,
    /// Per kind: (chunk, sequence number, next offset).
    tails: [Option<(u32, u32, usize)>; 3],
    next_chunk: u32,
}

const CHUNK: u64 = 64 << 10;

impl LogImage {
    fn new(chunks: u32) -> LogImage {
        let geometry = ChunkGeometry {
            start: 0,
            size: CHUNK,
            count: chunks,
        };
        let media = Media::sim(
            (CHUNK * chunks as u64) as usize,
            &MediaConfig::default(),
            SimConfig::default(),
        )
        .unwrap();
        LogImage {
            media,
            geometry,
            tails: [None; 3],
            next_chunk: 0,
        }
    }

    /// Appends one block of `version` to the log of `kind`; false when the pool is full.
    fn append(
        &mut self,
        kind: LogKind,
        version: u64,
        entries: &[EntryRef<'_>],
        committed: bool,
    ) -> bool {
        let k = kind.index();
        let mut block = Vec::new();
        let fits = |at: usize, block: &mut Vec<u8>, chunk: u32| {
            let peer = CHUNK * chunk as u64 + at as u64 + if committed { 0 } else { 8 };
            encode_block(block, chunk, 5, version, peer, entries.iter().copied());
            at + block.len() <= CHUNK as usize
        };
        let (chunk, at) = match self.tails[k] {
            Some((chunk, seq, at)) if !fits(at, &mut block, chunk) => {
                let Some(new) = self.new_chunk(kind, Some(chunk), seq + 1) else {
                    return false;
                };
                (new, 64)
            }
            Some((chunk, _, at)) => (chunk, at),
            None => {
                let Some(new) = self.new_chunk(kind, None, 0) else {
                    return false;
                };
                (new, 64)
            }
        };
        if !fits(at, &mut block, chunk) {
            return false;
        }
        self.media
            .write((CHUNK * chunk as u64) as usize + at, &block);
        let seq = self.tails[k].map_or(0, |t| if t.0 == chunk { t.1 } else { t.1 + 1 });
        self.tails[k] = Some((chunk, seq, at + block.len()));
        true
    }

    fn new_chunk(&mut self, kind: LogKind, prev: Option<u32>, seq: u32) -> Option<u32> {
        if self.next_chunk == self.geometry.count {
            return None;
        }
        let c = self.next_chunk;
        self.next_chunk += 1;
        let header = ChunkHeader {
            kind,
            zeroed: false,
            owner: 1,
            generation: 5,
            prev,
            seq,
        };
        self.media
            .write((CHUNK * c as u64) as usize, &header.encode());
        Some(c)
    }

    fn same_with_any_threads(&self, config: MappingConfig, what: &str) -> bool {
        let marks = Marks {
            generation: 0,
            formatted: self.geometry.count,
            cleaned: 0,
        };
        same_with_any_threads(
            &self.media,
            &self.geometry,
            marks,
            None,
            (config, None),
            what,
        )
    }
}

/// One entry of a hand-made transaction: home, tombstone, data.
type Entry = (u64, bool, Vec<u8>);

/// Builds a random log of allocations, frees and writes — with, one time in `odds` for
/// each kind (never when `odds` is 0), records no commit would write: frees of what is not allocated or with another length,
/// overlapping allocations, initial data outside its allocation, data outside the home
/// space, tombstones in update logs, records of other lengths, uncommitted
/// transactions. Valid or not, some initial data comes before its allocation record
/// (recovery must then look its allocation up), and transactions are appended to the
/// logs slightly out of version order (as committers racing for log sets do).
fn random_log(seed: u64, odds: u32) -> (LogImage, MappingConfig) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let config = mapping_config(&mut rng);
    let hostile = |rng: &mut ChaCha8Rng| odds > 0 && rng.random_ratio(1, odds);
    let mut allocator = HomeAllocator::new();
    let mut live: Vec<(u64, u64)> = Vec::new();
    let record = |home: u64, len: u64| (home, true, len.to_le_bytes().to_vec());
    let data = |home: u64, len: u64| (home, false, vec![(home % 251) as u8 | 1; len as usize]);
    // Per transaction: its version and its update, allocation and deallocation entries.
    let mut txs: Vec<(u64, [Vec<Entry>; 3])> = Vec::new();
    for version in 1..=400u64 {
        let [mut update, mut alloc, mut dealloc]: [Vec<Entry>; 3] = Default::default();
        for _ in 0..rng.random_range(0..3) {
            if !live.is_empty() && rng.random_ratio(1, 2) {
                let (home, size) = live.swap_remove(rng.random_range(0..live.len()));
                allocator.free(home).unwrap();
                dealloc.push(record(home, size));
            }
        }
        if hostile(&mut rng) {
            // A free of something not allocated, or with another length.
            let home = live.first().map_or(1 << 20, |l| l.0);
            dealloc.push(record(home, rng.random_range(1..9000)));
        }
        let mut allocs: Vec<(u64, u64)> = Vec::new();
        for _ in 0..rng.random_range(0..4) {
            let size = [16, 100, 128, 700, 4096, 5000, 70_000, 200_000][rng.random_range(0..8)];
            allocs.push((allocator.alloc(size).unwrap(), size));
        }
        let valid = allocs.len();
        if hostile(&mut rng) {
            // An allocation overlapping a live one (or longer than any pool).
            let (home, size) = live.first().copied().unwrap_or((1 << 20, 64));
            let len = if rng.random_ratio(1, 4) {
                1 << 40
            } else {
                size
            };
            allocs.push((home + size / 2, len));
        }
        for &(home, size) in &allocs {
            // Part of the image: up to three pieces, anywhere in the object.
            let image: Vec<Entry> = (0..rng.random_range(0..4))
                .map(|_| {
                    let at = rng.random_range(0..size.min(1 << 20));
                    data(home + at, rng.random_range(1..=(size - at).min(2000)))
                })
                .collect();
            if rng.random_ratio(1, 10) {
                // The image before its record: it follows another record, or none.
                alloc.extend(image);
                alloc.push(record(home, size));
            } else {
                alloc.push(record(home, size));
                alloc.extend(image);
            }
        }
        if hostile(&mut rng) {
            let home = match rng.random_ratio(1, 2) {
                true => 1 << 45,         // initial data outside any allocation
                false => HOME_LIMIT - 8, // data past the end of the home space
            };
            alloc.push(data(home, 16));
        }
        if hostile(&mut rng) {
            alloc.push((1 << 30, true, vec![1; 12])); // a record of 12 bytes
        }
        live.extend(&allocs[..valid]);
        for _ in 0..rng.random_range(0..5) {
            if let Some(&(home, size)) = live.get(rng.random_range(0..live.len().max(1))) {
                // Sometimes past the object's end, into whatever follows.
                let at = rng.random_range(0..size);
                update.push(data(
                    home + at,
                    rng.random_range(1..=(size - at + 200).min(6000)),
                ));
            }
        }
        if hostile(&mut rng) {
            update.push(record(1 << 20, 8)); // a tombstone in an update log
        }
        if hostile(&mut rng) {
            update.push(data(16, 8)); // the null page
        }
        txs.push((version, [update, alloc, dealloc]));
    }
    // Appended slightly out of version order.
    for i in 0..txs.len() - 1 {
        if rng.random_ratio(1, 6) {
            txs.swap(i, i + 1);
        }
    }
    let mut log = LogImage::new(96);
    for (version, logs) in &txs {
        // A transaction left uncommitted (a peer that is no block), rarely.
        let committed = !hostile(&mut rng);
        for (kind, entries) in LogKind::ALL.iter().zip(logs) {
            let refs: Vec<EntryRef<'_>> = entries
                .iter()
                .map(|(home, tombstone, data)| EntryRef {
                    home: *home,
                    tombstone: *tombstone,
                    data,
                })
                .collect();
            if !refs.is_empty() && !log.append(*kind, *version, &refs, committed) {
                return (log, config);
            }
        }
    }
    (log, config)
}

fn fallbacks() -> usize {
    super::parallel::FALLBACKS.with(|f| f.get())
}

/// Pools churned in a small space, so that their allocation and free records were
/// folded into allocation checkpoints, recover the same from the checkpoint with any
/// number of threads (in parallel, without falling back), whether new objects' data
/// has a log of its own or follows its records in the allocation log.
#[test]
fn pools_with_an_allocation_checkpoint_recover_the_same_with_any_number_of_threads() {
    for (seed, separate) in [(1, true), (2, false), (3, true)] {
        let config = Config::default()
            .size(256 << 10)
            .chunk_size(4096)
            .separate_initial_data(separate);
        let pool = Pool::create_sim(&config, SimConfig::default()).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut slots: Vec<Option<u64>> = vec![None; 32];
        let checkpoints = || pool.stats().log().unwrap().allocation_checkpoints;
        let mut done = 0;
        while checkpoints() < 3 || done % 7 != 3 {
            assert!(done < 200_000, "no checkpoint after {done} transactions");
            done += 1;
            let k = rng.random_range(0..slots.len());
            let len = rng.random_range(16..=300u64);
            let fill = vec![rng.random::<u8>() | 1; len as usize];
            pool.transaction(|tx| {
                if let Some(home) = slots[k] {
                    tx.free(PPtr::<u8>::from_offset(home))?;
                }
                if done % 3 != 0 {
                    let home = tx.alloc_bytes(len)?;
                    tx.write_bytes(home, &fill)?;
                    slots[k] = Some(home);
                } else {
                    slots[k] = None;
                }
                Ok::<_, crate::Error>(())
            })
            .unwrap();
        }
        let image = pool.media().crash_simulator().unwrap().persisted_image();
        pool.abandon();
        let file =
            PoolFile::open_image(image, &MediaConfig::default(), SimConfig::default()).unwrap();
        let media = file.media();
        let geometry = ChunkGeometry::of(file.header());
        let superblock = superblock_of(file.layout());
        let marks = superblock.read_marks(media, false).unwrap();
        let (_, seeded) =
            crate::engine::log::checkpoint::read_current(media, &geometry, &superblock)
                .unwrap()
                .expect("the pool has an allocation checkpoint");
        assert!(seeded.checkpoint.version > 0 && !seeded.checkpoint.allocations.is_empty());
        let what = format!("churned pool {seed} (separate initial data: {separate})");
        let before = fallbacks();
        let config = MappingConfig::FULL;
        assert!(
            same_with_any_threads(
                media,
                &geometry,
                marks,
                None,
                (config, Some(&seeded)),
                &what
            ),
            "{what} was refused"
        );
        assert_eq!(fallbacks(), before, "{what} was not replayed in parallel");
    }
}

#[test]
fn hand_made_logs_recover_the_same_with_any_number_of_threads() {
    for seed in 0..24 {
        let (log, config) = random_log(seed, 0);
        let what = format!("valid log {seed} ({})", config.label());
        let before = fallbacks();
        assert!(
            log.same_with_any_threads(config, &what),
            "{what} was refused"
        );
        assert_eq!(fallbacks(), before, "{what} was not replayed in parallel");
    }
}

#[test]
fn hostile_logs_are_refused_with_the_same_problems_by_any_number_of_threads() {
    let (mut accepted, mut refused) = (0, 0);
    for seed in 0..60 {
        // From a few hostile records in each log to one in a few logs.
        let odds = [30, 300, 3000][seed as usize % 3];
        let (log, config) = random_log(1000 + seed, odds);
        let what = format!("hostile log {seed} ({})", config.label());
        match log.same_with_any_threads(config, &what) {
            true => accepted += 1,
            false => refused += 1,
        }
    }
    assert!(
        refused >= 30 && accepted >= 5,
        "{accepted} accepted, {refused} refused"
    );
}
