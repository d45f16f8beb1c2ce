//! The persistent heap as a pool of several files (002): it grows by adding files in
//! `<pool>.d/`, gives each huge block a file of its own, shrinks by removing empty files,
//! and refuses or reports files that do not belong.

use std::path::{Path, PathBuf};

use logheap::alloc::{HeapOptions, PAddr, PersistentHeap};
use logheap::{Error, MapAddress};

const MIB: u64 = 1 << 20;

/// A heap of 4 MiB that may grow to 64 MiB by files of 4 MiB, in 1 MiB segments.
fn options() -> HeapOptions {
    HeapOptions {
        size: 4 * MIB,
        max_size: 64 * MIB,
        file_size: 4 * MIB,
        segment_size: MIB,
        arenas: 2,
        ..HeapOptions::default()
    }
}

fn slot(heap: &PersistentHeap, i: u64) -> PAddr {
    heap.root().checked_add(8 * i).unwrap()
}

fn files_dir(path: &Path) -> PathBuf {
    let mut d = path.as_os_str().to_owned();
    d.push(".d");
    d.into()
}

/// The `.lhf` files in the heap's directory.
fn files_in(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(files_dir(path))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".lhf"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A block's contents: `len` bytes derived from `seed`.
fn pattern(seed: u64, len: u64) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + seed * 7) as u8).collect()
}

#[test]
fn the_heap_grows_by_files_keeps_their_blocks_across_reopens_and_shrinks_when_they_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap");
    let heap = PersistentHeap::create(&path, &options()).unwrap();
    assert!(files_in(&path).is_empty());
    // 40 blocks of 300 KiB (big blocks, three per segment): far more than file 0 holds.
    let mut blocks = Vec::new();
    for i in 0..40 {
        let a = heap.allocate_into(slot(&heap, i), 300 << 10).unwrap();
        heap.write(a, &pattern(i, 300 << 10)).unwrap();
        heap.persist(a, 300 << 10).unwrap();
        blocks.push(a);
    }
    let grown = heap.stats();
    assert!(grown.files >= 2, "{grown:?}");
    assert_eq!(grown.file_bytes, grown.files * 4 * MIB);
    assert_eq!(files_in(&path).len() as u64, grown.files);
    assert!(
        blocks.iter().any(|a| a.file() != 0),
        "no block in an extension file"
    );
    heap.close().unwrap();

    let heap = PersistentHeap::open(&path).unwrap();
    assert_eq!(heap.stats().recovery.files, grown.files);
    for (i, &a) in blocks.iter().enumerate() {
        assert_eq!(heap.read_u64(slot(&heap, i as u64)).unwrap(), a.raw());
        let mut back = vec![0; 300 << 10];
        heap.read(a, &mut back).unwrap();
        assert!(back == pattern(i as u64, 300 << 10), "block {i} at {a}");
    }
    assert_eq!(heap.blocks().unwrap().len(), 40);
    // An extension file's bytes have one name only: file 0's offsets stop at its end.
    let base = heap.resolve(PAddr::new(0, 0).unwrap()).unwrap() as u64;
    let far = *blocks.iter().find(|a| a.file() != 0).unwrap();
    let alias = PAddr::new(0, heap.resolve(far).unwrap() as u64 - base).unwrap();
    assert!(heap.read_u64(alias).is_err());
    assert!(heap.resolve(alias).is_none());
    assert!(heap.write_u64(alias, 1).is_err());
    for i in 0..40 {
        heap.deallocate(slot(&heap, i)).unwrap();
    }
    let (removed, bytes) = heap.shrink().unwrap();
    assert_eq!((removed, bytes), (grown.files, grown.file_bytes));
    assert!(files_in(&path).is_empty(), "{:?}", files_in(&path));
    assert_eq!(heap.stats().files, 0);
    // A freed address in a removed file is refused, not followed.
    assert!(heap.read_u64(*blocks.last().unwrap()).is_err());
    assert!(heap.resolve(*blocks.last().unwrap()).is_none());
    // Still usable: it grows again.
    for i in 0..40 {
        heap.allocate_into(slot(&heap, i), 300 << 10).unwrap();
    }
    assert!(heap.stats().files >= 2);
    heap.close().unwrap();
    let heap = PersistentHeap::open(&path).unwrap();
    assert_eq!(heap.blocks().unwrap().len(), 40);
}

#[test]
fn a_huge_block_has_a_file_of_its_own_removed_when_it_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap");
    let heap = PersistentHeap::create(&path, &options()).unwrap();
    let size = 20 * MIB + 5;
    let a = heap.allocate_into(slot(&heap, 0), size).unwrap();
    assert_ne!(a.file(), 0);
    assert_eq!(files_in(&path).len(), 1);
    assert!(heap.usable_size(a).unwrap() >= size);
    let end = a.checked_add(size / 8 * 8 - 8).unwrap();
    heap.write_u64(a, 0x1234).unwrap();
    heap.write_u64(end, 0x5678).unwrap();
    heap.persist(a, 8).unwrap();
    heap.persist(end, 8).unwrap();
    // Through a native pointer too.
    let p = heap.resolve(a).unwrap();
    assert_eq!(heap.addr_of(p), Some(a));
    heap.close().unwrap();

    let heap = PersistentHeap::open(&path).unwrap();
    assert_eq!(heap.read_u64(a).unwrap(), 0x1234);
    assert_eq!(heap.read_u64(end).unwrap(), 0x5678);
    assert_eq!(heap.stats().huge_blocks, 1);
    heap.deallocate(slot(&heap, 0)).unwrap();
    assert_eq!(heap.read_u64(slot(&heap, 0)).unwrap(), 0);
    assert!(files_in(&path).is_empty());
    assert!(heap.read_u64(a).is_err());
    heap.close().unwrap();
    let heap = PersistentHeap::open(&path).unwrap();
    assert!(heap.blocks().unwrap().is_empty());
    // Larger than every slot together: refused.
    assert!(matches!(
        heap.allocate_into(slot(&heap, 0), 100 * MIB),
        Err(Error::InvalidSize(_))
    ));
    // 40 MiB takes 10 of the 15 slots; a second finds no room, and leaves no file.
    heap.allocate_into(slot(&heap, 0), 40 * MIB).unwrap();
    assert!(matches!(
        heap.allocate_into(slot(&heap, 1), 40 * MIB),
        Err(Error::PoolFull)
    ));
    assert_eq!(heap.read_u64(slot(&heap, 1)).unwrap(), 0);
    assert_eq!(files_in(&path).len(), 1);
}

#[test]
fn a_heap_of_one_file_stays_one_file_and_says_it_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap");
    let one = HeapOptions {
        max_size: 0,
        ..options()
    };
    let heap = PersistentHeap::create(&path, &one).unwrap();
    let mut full = false;
    for i in 0..40 {
        match heap.allocate_into(slot(&heap, i), 300 << 10) {
            Ok(_) => {}
            Err(Error::PoolFull) => {
                full = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(full);
    assert!(!files_dir(&path).exists());
    assert_eq!(heap.stats().files, 0);
}

/// A closed heap that grew by at least one file, and that file's name.
fn grown_heap(dir: &Path) -> (PathBuf, String) {
    let path = dir.join("heap");
    let heap = PersistentHeap::create(&path, &options()).unwrap();
    for i in 0..20 {
        heap.allocate_into(slot(&heap, i), 300 << 10).unwrap();
    }
    assert!(heap.stats().files >= 1);
    heap.close().unwrap();
    let first = files_in(&path).remove(0);
    (path, first)
}

#[test]
fn a_missing_extension_file_is_an_error_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let (path, name) = grown_heap(dir.path());
    std::fs::remove_file(files_dir(&path).join(&name)).unwrap();
    let err = PersistentHeap::open(&path).unwrap_err();
    assert!(matches!(err, Error::MetadataCorrupt { .. }), "{err}");
    assert!(err.to_string().contains(&name), "{err}");
}

#[test]
fn a_foreign_or_truncated_extension_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, name) = grown_heap(dir.path());
    let file = files_dir(&path).join(&name);
    let original = std::fs::read(&file).unwrap();
    // Another heap's file of the same name and size.
    let other = tempfile::tempdir().unwrap();
    let (other_path, other_name) = grown_heap(other.path());
    assert_eq!(other_name, name);
    std::fs::copy(files_dir(&other_path).join(&other_name), &file).unwrap();
    let err = PersistentHeap::open(&path).unwrap_err();
    assert!(err.to_string().contains("foreign"), "{err}");
    // Truncated.
    std::fs::write(&file, &original[..original.len() / 2]).unwrap();
    let err = PersistentHeap::open(&path).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    // Put back, it opens.
    std::fs::write(&file, &original).unwrap();
    let heap = PersistentHeap::open(&path).unwrap();
    assert_eq!(heap.blocks().unwrap().len(), 20);
}

#[test]
fn an_orphan_file_is_reported_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = grown_heap(dir.path());
    let orphan = files_dir(&path).join("00000009.lhf");
    std::fs::write(&orphan, b"not ours").unwrap();
    let heap = PersistentHeap::open(&path).unwrap();
    assert_eq!(heap.stats().recovery.orphan_files, 1);
    // Growing past it never touches it.
    for i in 20..60 {
        heap.allocate_into(slot(&heap, i), 300 << 10).unwrap();
    }
    heap.close().unwrap();
    assert_eq!(std::fs::read(&orphan).unwrap(), b"not ours");
    assert_eq!(
        PersistentHeap::open(&path)
            .unwrap()
            .stats()
            .recovery
            .orphan_files,
        1
    );
}

#[test]
fn a_new_heap_does_not_take_the_files_of_an_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = grown_heap(dir.path());
    std::fs::remove_file(&path).unwrap();
    let err = PersistentHeap::create(&path, &options()).unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
}

#[test]
fn a_fixed_address_heap_maps_its_extension_files_in_its_range() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap");
    let fixed = HeapOptions {
        map_address: MapAddress::Fixed,
        ..options()
    };
    let heap = PersistentHeap::create(&path, &fixed).unwrap();
    let base = heap.map_address().unwrap();
    let mut pointers = Vec::new();
    for i in 0..20 {
        let a = heap.allocate_into(slot(&heap, i), 300 << 10).unwrap();
        pointers.push((a, heap.resolve(a).unwrap() as u64));
    }
    heap.close().unwrap();
    let heap = PersistentHeap::open(&path).unwrap();
    assert_eq!(heap.map_address(), Some(base));
    for (a, p) in pointers {
        assert_eq!(heap.resolve(a).unwrap() as u64, p);
    }
}

#[test]
fn remove_takes_the_pool_with_its_files_and_refuses_an_open_pool_or_a_foreign_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap");
    let heap = PersistentHeap::create(&path, &options()).unwrap();
    for i in 0..40 {
        heap.allocate_into(slot(&heap, i), 300 << 10).unwrap();
    }
    let files = files_in(&path).len() as u64;
    assert!(files >= 2);
    // Open here: refused, nothing removed.
    assert!(matches!(
        logheap::PoolFile::remove(&path),
        Err(Error::Locked { .. })
    ));
    assert!(path.exists());
    assert_eq!(files_in(&path).len() as u64, files);
    heap.close().unwrap();
    let removal = logheap::PoolFile::remove(&path).unwrap();
    assert_eq!(removal.extension_files, files);
    assert_eq!(removal.left_in_directory, 0);
    assert!(removal.bytes >= (files + 1) * 4 * MIB);
    assert!(!path.exists());
    assert!(!files_dir(&path).exists());
    // A file that is no pool is refused and left as it is.
    let other = dir.path().join("notes.txt");
    std::fs::write(&other, b"not a pool").unwrap();
    assert!(logheap::PoolFile::remove(&other).is_err());
    assert_eq!(std::fs::read(&other).unwrap(), b"not a pool");
    assert!(matches!(
        logheap::PoolFile::remove(dir.path().join("missing")),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn check_verifies_a_persistent_heap_with_its_extension_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap");
    let heap = PersistentHeap::create(&path, &options()).unwrap();
    for i in 0..5 {
        heap.allocate_into(slot(&heap, i), 1000).unwrap();
    }
    heap.close().unwrap();
    let report = logheap::check::check(&path).unwrap();
    assert!(report.is_sound(), "{:?}", report.problems);
    assert_eq!(report.allocations, 5);
    // Grown into extension files: checked on a copy with its files, which goes.
    let heap = PersistentHeap::open(&path).unwrap();
    for i in 5..40 {
        heap.allocate_into(slot(&heap, i), 300 << 10).unwrap();
    }
    heap.close().unwrap();
    let files: Vec<_> = files_in(&path)
        .iter()
        .map(|n| files_dir(&path).join(n))
        .collect();
    assert!(!files.is_empty());
    let before: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let report = logheap::check::check(&path).unwrap();
    assert!(report.is_sound(), "{:?}", report.problems);
    assert_eq!(report.allocations, 40);
    let after: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(before == after, "check changed an extension file");
    // A missing extension file is a problem the check reports, not an error.
    std::fs::remove_file(&files[files.len() - 1]).unwrap();
    let report = logheap::check::check(&path).unwrap();
    assert!(!report.is_sound());
}
