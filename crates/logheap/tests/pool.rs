//! Pool files: create, open, clean close, and every way opening can fail.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use logheap::media::SimConfig;
use logheap::{EngineKind, Error, MediaConfig, PoolFile, PoolOptions};
use logheap::{HEADER_SIZE, STATE_OFFSET};

fn options() -> PoolOptions {
    PoolOptions {
        size: 1 << 20,
        engine: EngineKind::Log,
        ..PoolOptions::default()
    }
}

fn new_pool(dir: &Path) -> PathBuf {
    let path = dir.join("p.pool");
    PoolFile::create(&path, &options())
        .unwrap()
        .close()
        .unwrap();
    path
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

fn open(path: &Path) -> Result<PoolFile, Error> {
    PoolFile::open(path, &MediaConfig::default())
}

#[test]
fn create_close_open_round_trip_and_clean_flag() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.pool");
    let pool = PoolFile::create(&path, &options()).unwrap();
    let uuid = pool.header().uuid;
    assert_eq!(pool.layout().root, HEADER_SIZE..2 * HEADER_SIZE);
    pool.media()
        .write(pool.layout().root.start as usize, b"root!");
    pool.media().persist(pool.layout().root.start as usize, 5);
    pool.close().unwrap();

    let (_, state) = PoolFile::inspect(&path).unwrap();
    assert!(state.clean);
    let pool = open(&path).unwrap();
    assert!(pool.was_clean());
    assert_eq!(pool.header().uuid, uuid);
    assert_eq!(pool.header().engine, EngineKind::Log);
    assert_eq!(pool.media().read_vec(4096, 5), b"root!");
    drop(pool); // opened but never marked open: the pool stays as it was
    assert!(PoolFile::inspect(&path).unwrap().1.clean);

    let pool = open(&path).unwrap();
    pool.mark_open();
    drop(pool); // marked open, then not closed: like a crash

    let pool = open(&path).unwrap();
    assert!(
        !pool.was_clean(),
        "a pool dropped without close needs recovery"
    );
    pool.close().unwrap();
    assert!(open(&path).unwrap().was_clean());
    // No temporary file is left behind by creation.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn create_refuses_existing_files_and_bad_geometry() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path());
    assert!(matches!(
        PoolFile::create(&path, &options()),
        Err(Error::AlreadyExists { .. })
    ));
    let tiny = PoolOptions {
        size: 4096,
        ..options()
    };
    let err = PoolFile::create(dir.path().join("tiny"), &tiny).unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    assert!(!dir.path().join("tiny").exists());
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = open(&dir.path().join("nope")).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(
        err.to_string().contains("nope"),
        "errors name the file: {err}"
    );
}

#[test]
fn too_small() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small");
    std::fs::write(&path, [0u8; 100]).unwrap();
    assert!(matches!(open(&path), Err(Error::TooSmall { len: 100, .. })));
}

#[test]
fn truncated() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path());
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(64 << 10)
        .unwrap();
    let err = open(&path).unwrap_err();
    assert!(
        matches!(err, Error::Truncated { expected, actual, .. } if expected == 1 << 20 && actual == 64 << 10),
        "{err}"
    );
}

#[test]
fn foreign_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foreign");
    std::fs::write(&path, vec![0x7fu8; 8192]).unwrap();
    let err = open(&path).unwrap_err();
    assert!(matches!(err, Error::BadMagic { .. }), "{err}");
    assert!(err.to_string().contains("not a logheap pool"));
}

#[test]
fn unsupported_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path());
    // Another format version, with its checksum: a pool this build cannot read.
    let mut head = std::fs::read(&path).unwrap()[..108].to_vec();
    head[8..12].copy_from_slice(&99u32.to_le_bytes());
    let crc = crc32c::crc32c(&head[..104]);
    head[104..108].copy_from_slice(&crc.to_le_bytes());
    patch(&path, 0, &head);
    assert!(matches!(
        open(&path),
        Err(Error::UnsupportedVersion { found: 99, .. })
    ));
    // A damaged version field fails the checksum: damage, not another format.
    patch(&path, 8, &[2, 0, 1, 0]);
    assert!(matches!(open(&path), Err(Error::Checksum { .. })));
}

#[test]
fn header_checksum_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path());
    patch(&path, 41, &[0x10]); // one bit of the pool size
    let err = open(&path).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Checksum {
                what: "pool header",
                offset: 0,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn state_word_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path());
    patch(&path, STATE_OFFSET + 2, &[0x01]);
    let err = open(&path).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Checksum {
                what: "pool state word",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unknown_engine_with_a_valid_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path());
    let mut head = std::fs::read(&path).unwrap()[..108].to_vec();
    head[32..36].copy_from_slice(&77u32.to_le_bytes());
    let crc = crc32c::crc32c(&head[..104]);
    head[104..108].copy_from_slice(&crc.to_le_bytes());
    patch(&path, 0, &head);
    let err = open(&path).unwrap_err();
    assert!(matches!(err, Error::BadHeader { .. }), "{err}");
    assert!(err.to_string().contains("engine code 77"));
}

#[test]
fn second_handle_in_this_process_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path());
    let first = open(&path).unwrap();
    assert!(matches!(open(&path), Err(Error::Locked { .. })));
    first.close().unwrap();
    open(&path).unwrap().close().unwrap();
}

const CHILD_ENV: &str = "LOGHEAP_TEST_CHILD_POOL";

/// Run by `second_process_is_refused` in a child process: tries to open the pool and
/// exits 0 if it could, 3 if it was locked, 4 on any other error.
#[test]
#[ignore = "helper: run in a child process by second_process_is_refused"]
fn child_process_opens_pool() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let code = match open(Path::new(&path)) {
        Ok(pool) => {
            pool.close().unwrap();
            0
        }
        Err(Error::Locked { .. }) => 3,
        Err(e) => {
            eprintln!("{e}");
            4
        }
    };
    std::process::exit(code);
}

fn child_open(path: &Path) -> i32 {
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_process_opens_pool",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, path)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    status.code().unwrap_or(-1)
}

#[test]
fn second_process_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_pool(dir.path());
    let held = open(&path).unwrap();
    assert_eq!(child_open(&path), 3, "the child must find the pool locked");
    held.close().unwrap();
    assert_eq!(child_open(&path), 0, "after close the child can open it");
}

#[test]
fn state_changes_are_crash_atomic() {
    // Every crash image taken while a pool is opened and closed opens again, either as
    // cleanly closed or as needing recovery: the state word can never be torn.
    let image = {
        let p = PoolFile::create_sim(&options(), SimConfig::default()).unwrap();
        p.media().crash_simulator().unwrap().persisted_image()
    };
    let pool = PoolFile::open_image(image, &MediaConfig::default(), SimConfig::default()).unwrap();
    let sim = pool.media().crash_simulator().unwrap();
    let outcomes = std::sync::Arc::new(std::sync::Mutex::new((0u32, 0u32)));
    let o = outcomes.clone();
    sim.set_fence_hook(Box::new(move |point| {
        for image in point.images() {
            let p =
                PoolFile::open_image(image, &MediaConfig::default(), SimConfig::default()).unwrap();
            let mut o = o.lock().unwrap();
            if p.was_clean() { o.0 += 1 } else { o.1 += 1 }
        }
    }));
    pool.close().unwrap();
    let (clean, unclean) = *outcomes.lock().unwrap();
    assert!(
        clean >= 1 && unclean >= 1,
        "clean {clean}, unclean {unclean}"
    );
}
