//! The durability mode a pool runs in: chosen by its medium by default
//! ([`Durability::Auto`]), an explicit `pmem` refused where flushes do not make stores
//! durable unless process-crash durability is accepted.

use std::path::Path;

use logheap::media::MediaError;
use logheap::{Config, Durability, Error, Medium, PPtr, Pool};

/// A scratch directory on the disk the build runs on (not TMPDIR, which the workspace
/// points at memory for the other tests).
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// The medium of a fresh file in `dir`.
fn medium_in(dir: &Path) -> Medium {
    let path = dir.join("probe");
    let medium = Medium::of_file(&std::fs::File::create(&path).unwrap());
    std::fs::remove_file(path).unwrap();
    medium
}

#[test]
fn the_default_mode_is_chosen_by_the_medium() {
    let dir = disk_dir();
    let medium = medium_in(dir.path());
    let pool = Pool::create(dir.path().join("p"), &Config::default()).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.medium, medium);
    assert_eq!(stats.durability, medium.auto_durability());
    assert_ne!(stats.durability, Durability::Auto);
    if medium == Medium::PageCache {
        assert_eq!(stats.durability, Durability::Msync);
        assert_eq!(stats.survives(), "power loss");
    }
    // The mode commits run in: a commit is durable in it.
    let root: PPtr<u64> = pool.root().unwrap();
    pool.transaction(|tx| tx.write(root, &7)).unwrap();
    if stats.durability == Durability::Msync {
        assert!(pool.media().counters().fences > 0);
        assert_eq!(pool.media().msync_errors(), 0);
    }
    pool.close().unwrap();
}

#[test]
fn a_pool_in_dev_shm_runs_in_pmem_mode() {
    if !Path::new("/dev/shm").is_dir() {
        return; // not on this machine
    }
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let pool = Pool::create(dir.path().join("p"), &Config::default()).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.medium, Medium::Memory);
    assert_eq!(stats.durability, Durability::Pmem);
    assert!(stats.survives().contains("process crashes"));
    pool.close().unwrap();
}

#[test]
fn pmem_on_the_page_cache_is_refused_unless_accepted() {
    let dir = disk_dir();
    if medium_in(dir.path()) != Medium::PageCache {
        return; // the temporary directory is on DAX or in memory here
    }
    let path = dir.path().join("p");
    let pmem = Config::default().durability(Durability::Pmem);
    match Pool::create(&path, &pmem) {
        Err(Error::Media {
            source: MediaError::NotDurable { medium, .. },
            ..
        }) => assert_eq!(medium, Medium::PageCache),
        other => panic!("expected NotDurable, got {other:?}"),
    }
    assert!(!path.exists(), "a refused create leaves no file behind");
    let pool = Pool::create(&path, &pmem.accept_process_crash_only()).unwrap();
    assert_eq!(pool.stats().durability, Durability::Pmem);
    assert!(pool.stats().survives().contains("process crashes only"));
    pool.close().unwrap();
    // Reopening in pmem mode is refused the same way; in the default mode it is msync.
    assert!(matches!(
        Pool::open_with(&path, &pmem),
        Err(Error::Media {
            source: MediaError::NotDurable { .. },
            ..
        })
    ));
    let pool = Pool::open(&path).unwrap();
    assert_eq!(pool.stats().durability, Durability::Msync);
    pool.close().unwrap();
}
