//! The persistent heap (PAllocator, 002) through its public API: allocation policies,
//! reopening, bad input, damage, and threads.

use std::collections::BTreeMap;

use logheap::alloc::{Block, HeapOptions, PAddr, PersistentHeap};
use logheap::media::SimConfig;
use logheap::{Config, EngineKind, Error, Pool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn options() -> HeapOptions {
    HeapOptions {
        size: 8 << 20,
        segment_size: 256 << 10,
        arenas: 2,
        ..HeapOptions::default()
    }
}

/// The `i`th pointer slot of the root area.
fn slot(heap: &PersistentHeap, i: u64) -> PAddr {
    heap.root().checked_add(8 * i).unwrap()
}

/// Checks that no two blocks overlap and returns them by address.
fn disjoint(blocks: &[Block]) -> BTreeMap<PAddr, u64> {
    for w in blocks.windows(2) {
        assert!(
            w[0].addr.file() != w[1].addr.file()
                || w[0].addr.offset() + w[0].size <= w[1].addr.offset(),
            "{:?} overlaps {:?}",
            w[0],
            w[1]
        );
    }
    blocks.iter().map(|b| (b.addr, b.size)).collect()
}

#[test]
fn blocks_of_every_policy_survive_a_clean_reopen_with_their_contents() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap");
    let heap = PersistentHeap::create(&path, &options()).unwrap();
    let sizes = [
        1u64, 32, 33, 100, 4032, 4033, 5000, 100_000, 300_000, 600_000,
    ];
    let mut addrs = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let a = heap.allocate_into(slot(&heap, i as u64), size).unwrap();
        assert_eq!(heap.read_u64(slot(&heap, i as u64)).unwrap(), a.raw());
        assert!(heap.usable_size(a).unwrap() >= size);
        let fill = vec![i as u8 + 1; size as usize];
        heap.write(a, &fill).unwrap();
        heap.persist(a, size).unwrap();
        addrs.push(a);
    }
    let blocks = heap.blocks().unwrap();
    let found = disjoint(&blocks);
    assert_eq!(found.len(), sizes.len());
    for a in &addrs {
        assert!(found.contains_key(a), "{a} is not in the metadata");
    }
    let stats = heap.stats();
    assert_eq!(stats.allocations, sizes.len() as u64);
    assert!(stats.small_segments >= 1 && stats.big_segments >= 1 && stats.huge_blocks >= 1);
    heap.close().unwrap();

    let heap = PersistentHeap::open(&path).unwrap();
    assert!(heap.stats().recovery.was_clean);
    assert_eq!(heap.blocks().unwrap(), blocks);
    for (i, &size) in sizes.iter().enumerate() {
        let a = PAddr::from_raw(heap.read_u64(slot(&heap, i as u64)).unwrap());
        assert_eq!(a, addrs[i]);
        let mut buf = vec![0; size as usize];
        heap.read(a, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == i as u8 + 1), "block {i}");
    }
    for i in 0..sizes.len() as u64 {
        heap.deallocate(slot(&heap, i)).unwrap();
        assert_eq!(heap.read_u64(slot(&heap, i)).unwrap(), 0);
    }
    assert!(heap.blocks().unwrap().is_empty());
    assert_eq!(heap.stats().allocations, 0);
    heap.close().unwrap();
}

#[test]
fn freed_space_is_reused_and_a_full_heap_says_so() {
    let heap = PersistentHeap::create_sim(&options(), SimConfig::default()).unwrap();
    let a = heap.allocate_into(slot(&heap, 0), 64).unwrap();
    heap.deallocate(slot(&heap, 0)).unwrap();
    assert_eq!(heap.allocate_into(slot(&heap, 0), 64).unwrap(), a);
    let big = heap.allocate_into(slot(&heap, 1), 20_000).unwrap();
    heap.deallocate(slot(&heap, 1)).unwrap();
    assert_eq!(heap.allocate_into(slot(&heap, 1), 20_000).unwrap(), big);
    // Fill the heap with big blocks until it refuses, then free one and retry.
    let mut n = 2;
    let err = loop {
        match heap.allocate_into(slot(&heap, n), 200_000) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 500, "never full");
    };
    assert!(matches!(err, Error::PoolFull), "{err}");
    heap.deallocate(slot(&heap, 2)).unwrap();
    heap.allocate_into(slot(&heap, 2), 200_000).unwrap();
    disjoint(&heap.blocks().unwrap());
}

#[test]
fn bad_arguments_are_refused_and_change_nothing() {
    let heap = PersistentHeap::create_sim(&options(), SimConfig::default()).unwrap();
    let a = heap.allocate_into(slot(&heap, 0), 100).unwrap();
    let before = heap.blocks().unwrap();
    assert!(matches!(
        heap.allocate_into(slot(&heap, 1), 0),
        Err(Error::InvalidSize(0))
    ));
    assert!(matches!(
        heap.allocate_into(slot(&heap, 1), u64::MAX),
        Err(Error::InvalidSize(_))
    ));
    let misaligned = heap.root().checked_add(3).unwrap();
    assert!(matches!(
        heap.allocate_into(misaligned, 8),
        Err(Error::InvalidAddress { .. })
    ));
    // The header, the segment table and a chunk header are not places for pointers.
    for bad in [
        PAddr::from_raw(8),
        PAddr::new(0, 1 << 20).unwrap(),
        PAddr::new(5, 4096).unwrap(),
    ] {
        assert!(
            matches!(
                heap.allocate_into(bad, 8),
                Err(Error::InvalidAddress { .. })
            ),
            "{bad}"
        );
        assert!(heap.write(bad, &[1]).is_err());
    }
    let chunk_header = PAddr::new(0, a.offset() / 8192 * 8192).unwrap();
    assert!(heap.write_u64(chunk_header, 0).is_err());
    assert_eq!(
        heap.blocks().unwrap(),
        before,
        "the refused calls changed nothing"
    );
    // Freeing something that is not a block, twice, or through a moved pointer.
    heap.write_u64(slot(&heap, 2), a.raw() + 16).unwrap();
    assert!(matches!(
        heap.deallocate(slot(&heap, 2)),
        Err(Error::InvalidFree { .. })
    ));
    heap.write_u64(slot(&heap, 2), a.raw()).unwrap();
    heap.deallocate(slot(&heap, 2)).unwrap();
    assert!(matches!(
        heap.deallocate(slot(&heap, 0)),
        Err(Error::InvalidFree { .. })
    ));
    assert!(
        heap.deallocate(slot(&heap, 2)).is_ok(),
        "a null pointer frees nothing"
    );
    assert!(heap.usable_size(a).is_err());
    assert_eq!(before.len(), 1);
    assert!(heap.blocks().unwrap().is_empty());
}

#[test]
fn the_heap_and_the_transactional_pool_refuse_each_others_files() {
    let dir = tempfile::tempdir().unwrap();
    let heap_path = dir.path().join("heap");
    PersistentHeap::create(&heap_path, &options())
        .unwrap()
        .close()
        .unwrap();
    // `check` verifies either kind (a heap by recovering a copy of it).
    let report = logheap::check::check(&heap_path).unwrap();
    assert!(report.is_sound(), "{:?}", report.problems);
    assert_eq!(report.header.unwrap().engine, EngineKind::Alloc);
    let err = Pool::open(&heap_path).unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongEngine {
                found: EngineKind::Alloc,
                ..
            }
        ),
        "{err}"
    );
    let pool_path = dir.path().join("pool");
    Pool::create(&pool_path, &Config::default().size(4 << 20))
        .unwrap()
        .close()
        .unwrap();
    let err = PersistentHeap::open(&pool_path).unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongEngine {
                found: EngineKind::Log,
                ..
            }
        ),
        "{err}"
    );
    let held = PersistentHeap::open(&heap_path).unwrap();
    assert!(matches!(
        PersistentHeap::open(&heap_path),
        Err(Error::Locked { .. })
    ));
    drop(held);
    assert!(matches!(
        Pool::create(
            dir.path().join("x"),
            &Config::default().engine(EngineKind::Alloc)
        ),
        Err(Error::InvalidConfig(_))
    ));
}

/// A heap with blocks of every kind, cleanly closed, as an image.
fn closed_image() -> (Vec<u8>, Vec<Block>) {
    let heap = PersistentHeap::create_sim(&options(), SimConfig::default()).unwrap();
    for (i, size) in [48u64, 3000, 9000, 70_000, 400_000].into_iter().enumerate() {
        heap.allocate_into(slot(&heap, i as u64), size).unwrap();
    }
    let blocks = heap.blocks().unwrap();
    let sim = heap.media().clone();
    heap.close().unwrap();
    (sim.crash_simulator().unwrap().persisted_image(), blocks)
}

#[test]
fn a_flipped_byte_in_a_closed_heaps_metadata_is_reported_not_trusted() {
    let (image, blocks) = closed_image();
    let heap = PersistentHeap::open_image(image.clone(), &Default::default(), SimConfig::default())
        .unwrap();
    assert_eq!(heap.blocks().unwrap(), blocks);
    drop(heap);
    // Every byte of allocator metadata that holds something: the superblock, the
    // digest, the segment table's live entries, chunk headers and page tables.
    let mut checked = 0;
    let mut places: Vec<usize> = (512..640).chain(768..776).collect();
    let table = 8192; // data area start of a heap with a 4 KiB root
    places.extend(table..table + 5 * 64);
    // The segments' own metadata: each live table entry names its region (bytes 16..24)
    // and kind (byte 4: 1 small, 2 big); a small segment's chunk headers and a big one's
    // page table are at the region's start.
    for e in 0..5 {
        let entry = &image[table + 64 * e..table + 64 * (e + 1)];
        let region = u64::from_le_bytes(entry[16..24].try_into().unwrap()) as usize;
        match entry[4] {
            1 => places.extend(region..region + 4 * 64),
            2 => places.extend(region..region + 512),
            _ => {}
        }
    }
    for &at in &places {
        let mut damaged = image.clone();
        damaged[at] ^= 0x20;
        match PersistentHeap::open_image(damaged, &Default::default(), SimConfig::default()) {
            Err(_) => checked += 1,
            Ok(h) => assert_eq!(
                h.blocks().unwrap(),
                blocks,
                "a flip at {at} was accepted and changed the blocks"
            ),
        }
    }
    assert!(
        checked > places.len() / 2,
        "{checked} of {} refused",
        places.len()
    );
}

#[test]
fn threads_allocate_and_free_without_overlap_and_the_metadata_agrees() {
    let heap = PersistentHeap::create_sim(
        &HeapOptions {
            size: 32 << 20,
            ..options()
        },
        SimConfig::default(),
    )
    .unwrap();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let heap = &heap;
            s.spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(t);
                for _ in 0..3000 {
                    let i = t * 64 + rng.random_range(0..64);
                    let p = slot(heap, i);
                    if heap.read_u64(p).unwrap() == 0 {
                        let size = if rng.random_bool(0.7) {
                            rng.random_range(1..4096)
                        } else {
                            rng.random_range(4096..150_000)
                        };
                        let a = heap.allocate_into(p, size).unwrap();
                        heap.write(a, &i.to_le_bytes()).unwrap();
                    } else {
                        let a = PAddr::from_raw(heap.read_u64(p).unwrap());
                        assert_eq!(heap.read_u64(a).unwrap(), i, "another thread's block");
                        heap.deallocate(p).unwrap();
                    }
                }
            });
        }
    });
    let found = disjoint(&heap.blocks().unwrap());
    let referenced: Vec<PAddr> = (0..128)
        .map(|i| PAddr::from_raw(heap.read_u64(slot(&heap, i)).unwrap()))
        .filter(|a| !a.is_null())
        .collect();
    assert_eq!(found.len(), referenced.len(), "a leak or a lost block");
    for a in referenced {
        assert!(found.contains_key(&a));
    }
    assert_eq!(heap.stats().allocations, found.len() as u64);
}

#[test]
fn a_metadata_log_heap_keeps_every_block_through_crashes_and_clean_reopens() {
    use logheap::alloc::MetadataPolicy;
    let options = HeapOptions {
        metadata: MetadataPolicy::MetadataLog,
        log_records: 8,
        ..options()
    };
    let heap = PersistentHeap::create_sim(&options, SimConfig::default()).unwrap();
    let sim = heap.media().clone();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut replayed = 0;
    for round in 0..6 {
        for _ in 0..80 {
            let i = rng.random_range(0..40);
            let p = slot(&heap, i);
            if heap.read_u64(p).unwrap() == 0 {
                let size = [24, 700, 3900, 5000, 40_000][rng.random_range(0..5)];
                let a = heap.allocate_into(p, size).unwrap();
                heap.write_u64(a, i + 1).unwrap();
                heap.persist(a, 8).unwrap();
            } else {
                heap.deallocate(p).unwrap();
            }
        }
        // A crash now: every call has returned, so every block must be there.
        let image = sim.crash_simulator().unwrap().persisted_image();
        let crashed =
            PersistentHeap::open_image(image, &Default::default(), SimConfig::default()).unwrap();
        replayed += crashed.stats().recovery.replayed;
        let blocks = disjoint(&crashed.blocks().unwrap());
        let mut referenced = BTreeMap::new();
        for i in 0..40 {
            let a = PAddr::from_raw(crashed.read_u64(slot(&crashed, i)).unwrap());
            if !a.is_null() {
                assert_eq!(crashed.read_u64(a).unwrap(), i + 1, "round {round}");
                referenced.insert(a, crashed.usable_size(a).unwrap());
            }
        }
        assert_eq!(blocks, referenced, "round {round}: blocks against pointers");
    }
    assert!(replayed > 0, "no crash image had records to replay");
    let stats = heap.stats();
    assert_eq!(stats.metadata, MetadataPolicy::MetadataLog);
    assert!(stats.checkpoints > 10, "{stats:?}");
    let blocks = heap.blocks().unwrap();
    heap.close().unwrap();
    let image = sim.crash_simulator().unwrap().persisted_image();
    let reopened =
        PersistentHeap::open_image(image.clone(), &Default::default(), SimConfig::default())
            .unwrap();
    assert!(reopened.stats().recovery.was_clean);
    assert_eq!(reopened.stats().recovery.replayed, 0);
    assert_eq!(reopened.blocks().unwrap(), blocks);
    drop(reopened);
    // The rings follow the segment table and the micro-log slots (a page each here),
    // a header line and 8 records per arena. This thread's arena (round-robin over the
    // test binary's threads, so either) has its `base` moved past every checkpointed
    // record; the other's is still 1.
    let bases: Vec<(usize, u64)> = (0..2)
        .map(|a| {
            let at = 8192 + 4096 + 4096 + a * 9 * 64;
            (
                at,
                u64::from_le_bytes(image[at..at + 8].try_into().unwrap()),
            )
        })
        .collect();
    let &(header, base) = bases.iter().max_by_key(|&&(_, b)| b).unwrap();
    assert!(base > 8, "ring headers not where expected: {bases:?}");
    assert!(bases.iter().all(|&(_, b)| b == 1 || b == base), "{bases:?}");
    for bit in [0, 3, 12] {
        let mut damaged = image.clone();
        damaged[header + bit / 8] ^= 1 << (bit % 8);
        assert!(
            matches!(
                PersistentHeap::open_image(damaged, &Default::default(), SimConfig::default()),
                Err(Error::Checksum { .. })
            ),
            "a flipped bit {bit} of the ring base after a clean close was not refused"
        );
    }
}

#[test]
fn defragmenting_gives_free_pages_back_and_keeps_every_live_block() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap");
    let heap = PersistentHeap::create(&path, &options()).unwrap();
    // Big blocks (8 KiB .. 40 KiB) and small ones, each filled, then every other freed.
    let mut live = BTreeMap::new();
    for i in 0..120u64 {
        let size = if i % 3 == 0 { 200 } else { 8192 * (1 + i % 5) };
        let a = heap.allocate_into(slot(&heap, i), size).unwrap();
        heap.write(a, &vec![i as u8 + 1; size as usize]).unwrap();
        heap.persist(a, size).unwrap();
        live.insert(i, (a, size));
    }
    for i in (0..120u64).step_by(2) {
        heap.deallocate(slot(&heap, i)).unwrap();
        live.remove(&i);
    }
    let blocks = heap.blocks().unwrap();
    let done = heap.defragment(u64::MAX).unwrap();
    assert!(done.holes > 0 && done.punched_bytes == done.free_bytes);
    let (before, after) = (
        done.disk_bytes_before.unwrap(),
        done.disk_bytes_after.unwrap(),
    );
    assert!(
        after + done.punched_bytes / 2 <= before,
        "the file gave back storage: {before} -> {after} bytes on disk, {} punched",
        done.punched_bytes
    );
    assert_eq!(heap.blocks().unwrap(), blocks, "no block came or went");
    let check = |heap: &PersistentHeap| {
        for (&i, &(a, size)) in &live {
            let mut buf = vec![0; size as usize];
            heap.read(a, &mut buf).unwrap();
            assert!(
                buf.iter().all(|&b| b == i as u8 + 1),
                "block {i} kept its bytes"
            );
        }
    };
    check(&heap);
    // A bounded target stops early: the largest range alone is enough here.
    let one = heap.defragment(1).unwrap();
    assert_eq!(one.holes, 1);
    // Punched pages are usable again, and the metadata still checks at a clean reopen.
    for i in (0..120u64).step_by(2) {
        let a = heap.allocate_into(slot(&heap, i), 8192).unwrap();
        heap.write(a, &[0xEE; 8192]).unwrap();
        heap.persist(a, 8192).unwrap();
    }
    heap.close().unwrap();
    let heap = PersistentHeap::open(&path).unwrap();
    check(&heap);
    assert_eq!(heap.blocks().unwrap().len(), 120);
}

#[test]
fn the_volatile_heap_costs_no_fence_stays_apart_and_is_empty_at_every_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap");
    let heap = PersistentHeap::create(&path, &options()).unwrap();
    let kept = heap.allocate_into(slot(&heap, 0), 5000).unwrap();
    heap.write(kept, &[9; 5000]).unwrap();
    heap.persist(kept, 5000).unwrap();
    let regions_before = heap.stats().regions_used;
    let media_before = heap.stats().media;
    // Small, big and huge volatile blocks (a segment here is 256 KiB).
    let sizes = [8u64, 100, 4032, 4033, 70_000, 300_000];
    let mut blocks = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let v = heap.allocate_volatile(size).unwrap();
        assert!(heap.usable_size(v).unwrap() >= size);
        heap.write(v, &vec![i as u8 + 1; size as usize]).unwrap();
        blocks.push((v, size));
    }
    let traffic = heap.stats().media.since(&media_before);
    assert_eq!(
        (traffic.fences, traffic.lines_flushed),
        (0, 0),
        "volatile allocation persists nothing"
    );
    let s = heap.stats();
    assert_eq!(s.volatile_allocations, sizes.len() as u64);
    assert!(s.volatile_allocated_bytes >= sizes.iter().sum::<u64>());
    assert_eq!(s.allocations, 1, "the persistent count is apart");
    // No volatile block overlaps another or a persistent block, and none is persistent.
    let persistent = heap.blocks().unwrap();
    assert_eq!(persistent.len(), 1);
    let mut all: Vec<Block> = blocks
        .iter()
        .map(|&(addr, _)| Block {
            addr,
            size: heap.usable_size(addr).unwrap(),
        })
        .chain(persistent)
        .collect();
    all.sort();
    disjoint(&all);
    for (i, &(v, size)) in blocks.iter().enumerate() {
        let mut buf = vec![0; size as usize];
        heap.read(v, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == i as u8 + 1));
    }
    // Persistent pointers may not live there; each side frees only its own blocks.
    let (small, _) = blocks[1];
    assert!(matches!(
        heap.allocate_into(small, 64),
        Err(Error::InvalidAddress { .. })
    ));
    assert!(matches!(
        heap.deallocate(small),
        Err(Error::InvalidAddress { .. })
    ));
    heap.write_u64(slot(&heap, 1), small.raw()).unwrap();
    assert!(matches!(
        heap.deallocate(slot(&heap, 1)),
        Err(Error::InvalidFree { .. })
    ));
    heap.write_u64(slot(&heap, 1), 0).unwrap();
    assert!(matches!(
        heap.deallocate_volatile(kept),
        Err(Error::InvalidFree { .. })
    ));
    // A persistent block may hold a pointer to a volatile one and vice versa.
    heap.write_u64(small, kept.raw()).unwrap();
    heap.write_u64(kept, small.raw()).unwrap();
    assert_eq!(heap.read_u64(small).unwrap(), kept.raw());
    assert_eq!(heap.read_u64(kept).unwrap(), small.raw());
    heap.write(kept, &[9; 8]).unwrap();
    // Freeing everything gives the regions back; a second free is refused.
    for &(v, _) in &blocks {
        heap.deallocate_volatile(v).unwrap();
        assert!(matches!(
            heap.deallocate_volatile(v),
            Err(Error::InvalidFree { .. })
        ));
    }
    let s = heap.stats();
    assert_eq!((s.volatile_allocations, s.volatile_allocated_bytes), (0, 0));
    assert!(s.regions_used <= regions_before + 2, "{s:?}");
    // Volatile blocks left at a clean close, and at a crash, are gone at the next open.
    for size in sizes {
        heap.allocate_volatile(size).unwrap();
    }
    heap.close().unwrap();
    let heap = PersistentHeap::open(&path).unwrap();
    assert_eq!(heap.stats().volatile_allocations, 0);
    assert_eq!(heap.stats().regions_used, regions_before);
    let v = heap.allocate_volatile(300_000).unwrap();
    drop(heap);
    let heap = PersistentHeap::open(&path).unwrap();
    assert!(!heap.stats().recovery.was_clean);
    assert_eq!(heap.stats().regions_used, regions_before);
    assert!(heap.read(v, &mut [0; 8]).is_err(), "its region is free");
    let mut buf = vec![0; 5000];
    heap.read(kept, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 9));
}

/// Builds a list of `n` nodes of 64 bytes whose first word is the native address of
/// the next node (0 at the end) and second word its number, with the head's native
/// address in root slot 0; returns the head.
fn native_list(heap: &PersistentHeap, n: u64) -> *const u8 {
    let mut next = 0u64;
    for i in (0..n).rev() {
        let node = heap.allocate_into(slot(heap, 1), 64).unwrap();
        heap.write_u64(node, next).unwrap();
        heap.write_u64(node.checked_add(8).unwrap(), i).unwrap();
        heap.persist(node, 16).unwrap();
        next = heap.direct(node, 64).unwrap() as u64;
        // The node is owned by the list from here: forget the slot (it is reused).
        heap.write_u64(slot(heap, 1), 0).unwrap();
    }
    heap.write_u64(slot(heap, 0), next).unwrap();
    heap.persist(slot(heap, 0), 8).unwrap();
    next as *const u8
}

/// Follows a native list from the head stored in root slot 0, checking each node's
/// number, and returns its length.
fn follow_native_list(heap: &PersistentHeap) -> u64 {
    let mut p = heap.read_u64(slot(heap, 0)).unwrap() as *const u64;
    let mut n = 0;
    while !p.is_null() {
        let addr = heap.addr_of(p.cast()).expect("a node inside the heap");
        heap.direct(addr, 64).expect("a node in a block");
        // SAFETY: `direct` just checked that 64 bytes at `p` lie in an allocated block
        // of this open heap's mapping.
        let (next, number) = unsafe { (p.read_volatile(), p.add(1).read_volatile()) };
        assert_eq!(number, n);
        n += 1;
        p = next as *const u64;
    }
    n
}

#[test]
fn a_fixed_address_heap_maps_at_the_same_address_so_native_pointers_stay_valid() {
    use logheap::MapAddress;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fixed");
    let fixed = HeapOptions {
        map_address: MapAddress::Fixed,
        ..options()
    };
    let heap = PersistentHeap::create(&path, &fixed).unwrap();
    let at = heap.map_address().expect("a fixed heap says where it is");
    assert!(((32u64 << 40)..(96 << 40)).contains(&at), "{at:#x}");
    assert_eq!(
        heap.direct(heap.root(), 8).unwrap() as u64,
        at + heap.root().offset()
    );
    // A fixed mapping is made as a relocatable one is (MAP_SYNC where the file system
    // has it), and its format tells older builds to keep away.
    let relocatable = PersistentHeap::create(dir.path().join("relocatable"), &options()).unwrap();
    assert_eq!(heap.media().map_mode(), relocatable.media().map_mode());
    drop(relocatable);
    let version = u32::from_le_bytes(std::fs::read(&path).unwrap()[8..12].try_into().unwrap());
    assert_eq!(version, 4);
    native_list(&heap, 100);
    assert_eq!(follow_native_list(&heap), 100);
    heap.close().unwrap();
    // Reopened (cleanly, then after a crash), the same address and the same pointers.
    let heap = PersistentHeap::open(&path).unwrap();
    assert_eq!(heap.map_address(), Some(at));
    assert_eq!(follow_native_list(&heap), 100);
    drop(heap);
    let heap = PersistentHeap::open(&path).unwrap();
    assert!(!heap.stats().recovery.was_clean);
    assert_eq!(follow_native_list(&heap), 100);

    // Another pool that must live at the same address cannot be created or opened
    // while this one is mapped: a clear error, and nothing left behind.
    let other = dir.path().join("other");
    let err = PersistentHeap::create(
        &other,
        &HeapOptions {
            map_address: MapAddress::At(at),
            ..options()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Media {
                source: logheap::media::MediaError::AddressTaken { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains(&format!("{at:#x}")), "{err}");
    assert!(!other.exists());
    drop(heap);
    let heap = PersistentHeap::create(
        &other,
        &HeapOptions {
            map_address: MapAddress::At(at),
            ..options()
        },
    )
    .unwrap();
    heap.close().unwrap();
    let first = PersistentHeap::open(&other).unwrap();
    let err = PersistentHeap::open(&path).unwrap_err();
    assert!(err.to_string().contains("another mapping"), "{err}");
    drop(first);
    assert_eq!(
        follow_native_list(&PersistentHeap::open(&path).unwrap()),
        100
    );

    // Addresses a pool cannot be mapped at are refused at creation.
    for bad in [at + 1, 1 << 47, 4096] {
        let r = PersistentHeap::create(
            dir.path().join("bad"),
            &HeapOptions {
                map_address: MapAddress::At(bad),
                ..options()
            },
        );
        assert!(matches!(r, Err(Error::InvalidConfig(_))), "{bad:#x}");
    }
}

#[test]
fn a_relocatable_heap_resolves_addresses_against_its_mapping() {
    let heap = PersistentHeap::create_sim(&options(), SimConfig::default()).unwrap();
    assert_eq!(heap.map_address(), None);
    let a = heap.allocate_into(slot(&heap, 0), 100).unwrap();
    let p = heap.resolve(a).unwrap();
    assert_eq!(heap.direct(a, 100).unwrap(), p);
    assert_eq!(heap.addr_of(p), Some(a));
    assert!(heap.direct(a, 1 << 20).is_err(), "past the block's segment");
    assert!(heap.resolve(PAddr::new(0, 1 << 39).unwrap()).is_none());
    assert!(heap.resolve(PAddr::new(2, 64).unwrap()).is_none());
    assert_eq!(heap.addr_of(std::ptr::null()), None);
}
