//! `logheap create`, `check` and `inspect` on real pool files, sound and damaged.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use logheap::{Config, PPtr, Pool};

fn logheap(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_logheap"))
        .args(args)
        .output()
        .unwrap()
}

fn run(args: &[&str], pool: &Path) -> Output {
    let mut all: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    all.push(pool.as_os_str());
    logheap(&all)
}

/// A closed pool holding 50 objects of 100 bytes and a counter, in small chunks.
fn pool_with_data(dir: &Path) -> PathBuf {
    let path = dir.join("data.pool");
    let pool = Pool::create(&path, &Config::default().size(1 << 20).chunk_size(4096)).unwrap();
    let root: PPtr<u64> = pool.root().unwrap();
    for i in 0..50u8 {
        pool.transaction(|tx| {
            tx.alloc([i; 100])?;
            tx.write(root, &(i as u64 + 1))
        })
        .unwrap();
    }
    pool.close().unwrap();
    path
}

fn flip(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x04], at).unwrap();
}

#[test]
fn create_makes_a_pool_that_checks_sound_and_refuses_bad_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.pool");
    let out = run(&["create", "--size", "8M", "--chunk-size", "4K"], &path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pool = Pool::open(&path).unwrap();
    assert_eq!(pool.header().pool_size, 8 << 20);
    assert_eq!(pool.header().chunk_size, 4096);
    pool.close().unwrap();
    let out = run(&["check"], &path);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("sound"));

    // Creating it again, a tiny size, an absurd size, an unknown engine.
    let again = run(&["create", "--size", "8M"], &path);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    let tiny = run(&["create", "--size", "100"], &dir.path().join("tiny.pool"));
    let err = String::from_utf8_lossy(&tiny.stderr);
    assert!(err.contains("too small") && err.contains("40 KiB"), "{err}");
    let huge = dir.path().join("huge.pool");
    let out = run(&["create", "--size", "64T"], &huge);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("not enough space"),
        "{err}"
    );
    assert!(!huge.exists(), "a refused pool leaves no file");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "nothing else is left"
    );
    let out = run(
        &["create", "--size", "8M", "--engine", "lsm"],
        &dir.path().join("e.pool"),
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown engine"));
}

#[test]
fn check_finds_damage_lists_it_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = pool_with_data(dir.path());
    let sound = run(&["check", "--json"], &path);
    assert_eq!(sound.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&sound.stdout).unwrap();
    assert_eq!(v["allocations"], 50);
    assert_eq!(v["recovery"]["transactions"], 50);
    assert!(v["problems"].as_array().unwrap().is_empty());

    // Damage in three places: a chunk header, a block, the superblock.
    let data = 8192;
    for at in [data + 20, data + 300, 512 + 17] {
        flip(&path, at);
    }
    let out = run(&["check", "--json"], &path);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let problems = v["problems"].as_array().unwrap();
    assert!(problems.len() >= 3, "every problem is listed: {problems:?}");
    let offsets: Vec<u64> = problems
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect();
    assert!(offsets.contains(&data), "{offsets:?}");
    assert!(offsets.contains(&(512 + 16)), "{offsets:?}");
    // Opening refuses it too, naming the file, and changes nothing.
    let err = Pool::open(&path).unwrap_err().to_string();
    assert!(
        err.contains("data.pool") && err.contains("damaged"),
        "{err}"
    );
    assert_eq!(run(&["check"], &path).status.code(), Some(1));
}

#[test]
fn check_repair_drops_what_damage_hides_after_a_backup() {
    let dir = tempfile::tempdir().unwrap();
    let path = pool_with_data(dir.path());
    let backup = dir.path().join("saved.pool");
    // Sound: nothing to do, no backup.
    let out = run(
        &["check", "--repair", "--backup", backup.to_str().unwrap()],
        &path,
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to do"));
    assert!(!backup.exists());
    // A damaged block: the log is cut back to before it. The first chunk is the update
    // log's: blocks of 48 bytes (a 40-byte block of one 8-byte store, padded) from
    // offset 64; byte 340 is in the data of the sixth.
    flip(&path, 8192 + 340);
    let damaged = std::fs::read(&path).unwrap();
    assert_eq!(run(&["check"], &path).status.code(), Some(1));
    let out = run(
        &["check", "--repair", "--backup", backup.to_str().unwrap()],
        &path,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("dropped") && text.contains("transaction"),
        "{text}"
    );
    assert_eq!(std::fs::read(&backup).unwrap(), damaged);
    assert_eq!(run(&["check"], &path).status.code(), Some(0));
    let pool = Pool::open(&path).unwrap();
    let root: PPtr<u64> = pool.root().unwrap();
    let counter = pool.read(|tx| tx.read(root)).unwrap();
    assert!(
        counter < 50,
        "the transactions from the damage on are dropped"
    );
    pool.close().unwrap();
    // The default backup name, and damage a repair cannot drop (the pool header).
    flip(&path, 10);
    let out = run(&["check", "--repair"], &path);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot repair"));
    let out = run(&["check", "--backup", "x"], &path);
    assert_eq!(
        out.status.code(),
        Some(2),
        "--backup without --repair is refused"
    );
}

#[test]
fn check_of_what_cannot_be_checked_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = run(&["check"], &dir.path().join("missing.pool"));
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no such pool file"));
    let path = pool_with_data(dir.path());
    let open = Pool::open(&path).unwrap();
    let busy = run(&["check"], &path);
    assert_eq!(busy.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&busy.stderr).contains("already open"));
    drop(open);
    let usage = logheap(&[std::ffi::OsStr::new("check")]);
    assert_eq!(usage.status.code(), Some(2));
    // Not a pool at all: that is damage (exit 1), with the reason.
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![7u8; 8192]).unwrap();
    let out = run(&["check"], &junk);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("not a logheap pool"));
}

#[test]
fn inspect_shows_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let path = pool_with_data(dir.path());
    let out = run(&["inspect", "--json"], &path);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let logs = v["logs"].as_array().unwrap();
    let kinds: Vec<&str> = logs.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert!(
        kinds.contains(&"update") && kinds.contains(&"allocation"),
        "{kinds:?}"
    );
    let chunks: u64 = logs.iter().map(|l| l["chunks"].as_u64().unwrap()).sum();
    assert!(chunks >= 2, "{logs:?}");
    let live: u64 = logs.iter().map(|l| l["live_bytes"].as_u64().unwrap()).sum();
    assert_eq!(live, 50 * 100 + 8, "each object and the counter, once");
    let text = String::from_utf8_lossy(&run(&["inspect"], &path).stdout).to_string();
    assert!(
        text.contains("allocation") && text.contains("live bytes"),
        "{text}"
    );
}

/// Runs `logheap torture` and checks its outcome: `kills` kills, none losing an
/// acknowledged transaction.
fn torture(engine: &str, durability: &str, kills: u64, place: &Path) {
    let kills_arg = kills.to_string();
    let out = logheap(
        &[
            "torture",
            "--engine",
            engine,
            "--kills",
            &kills_arg,
            "--durability",
            durability,
            "--json",
            "--dir",
        ]
        .map(std::ffi::OsStr::new)
        .into_iter()
        .chain([place.as_os_str()])
        .collect::<Vec<_>>(),
    );
    assert!(
        out.status.success(),
        "{engine}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["engine"], engine, "{v}");
    assert_eq!(v["kills"].as_u64(), Some(kills), "{v}");
    assert_eq!(v["lost"], 0, "{v}");
    assert!(v["acknowledged"].as_u64().unwrap() > 100, "{v}");
    assert!(v["committed"].as_u64() >= v["acknowledged"].as_u64(), "{v}");
    assert!(v["kills_before_first_ack"].as_u64().unwrap() > 0, "{v}");
}

/// Kill tests on the log engine: a child running transactions on a pool file is killed
/// with SIGKILL 150 times (auto, which is pmem on tmpfs; some kills hit its recovery) and 60 times
/// (msync on an ordinary file, on the disk the build runs on); every acknowledged
/// transaction must be there after each kill.
#[test]
fn torture_loses_no_acknowledged_transaction() {
    let shm = std::path::Path::new("/dev/shm");
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let memory = if shm.is_dir() { shm } else { disk.path() };
    torture("log", "auto", 150, memory);
    torture("log", "msync", 60, disk.path());
}

/// The same kill test on every in-place engine, 40 kills each (pmem on tmpfs).
#[test]
fn torture_loses_nothing_on_any_in_place_engine() {
    let shm = std::path::Path::new("/dev/shm");
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let memory = if shm.is_dir() { shm } else { disk.path() };
    for engine in ["redo", "undo", "oop", "hoop"] {
        torture(engine, "auto", 40, memory);
    }
}

#[test]
fn bench_refuses_bad_plans_before_running_and_never_shares_a_results_directory() {
    let dir = tempfile::tempdir().unwrap();
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--workload",
            "sps",
            "--ops",
            "50",
            "--elements",
            "50",
        ];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_logheap"))
            .args(&args)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let err = |o: &Output| String::from_utf8_lossy(&o.stderr).to_string();
    let zero = bench(&["--threads", "0"]);
    assert!(
        !zero.status.success() && err(&zero).contains("--threads 0"),
        "{}",
        err(&zero)
    );
    let unknown = bench(&["--engine", "lsm"]);
    assert!(err(&unknown).contains("lsm") && err(&unknown).contains("log-2l-gu-c"));
    let file = dir.path().join("taken");
    std::fs::write(&file, "x").unwrap();
    let out = bench(&["--out", file.to_str().unwrap()]);
    assert!(
        err(&out).contains("taken") && err(&out).contains("is a file"),
        "{}",
        err(&out)
    );
    assert!(!dir.path().join("bench-results").exists(), "nothing ran");
    // Two runs at once: two results directories.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| bench(&["--engine", "log", "--emulation", "off"]));
        let b = s.spawn(|| bench(&["--engine", "log", "--emulation", "off"]));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(a.status.success() && b.status.success());
    let last = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .last()
            .unwrap()
            .to_string()
    };
    assert_ne!(last(&a), last(&b));
    assert_eq!(
        std::fs::read_dir(dir.path().join("bench-results"))
            .unwrap()
            .count(),
        2
    );
}

#[test]
fn compact_shrinks_a_pool_full_of_stale_data_and_keeps_its_objects() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stale.pool");
    let config = Config::default().size(1 << 20).chunk_size(4096);
    let pool = Pool::create(&path, &config).unwrap();
    let objs: Vec<PPtr<[u8; 200]>> = (0..20u8)
        .map(|i| pool.transaction(|tx| tx.alloc([i; 200])).unwrap())
        .collect();
    for n in 0..3_000u32 {
        let k = n as usize % objs.len();
        pool.transaction(|tx| tx.write(objs[k], &[(n % 251) as u8; 200]))
            .unwrap();
    }
    pool.close().unwrap();
    let out = run(&["compact", "--json"], &path);
    assert!(out.status.success(), "{out:?}");
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (before, after) = (
        c["chunks_before"].as_u64().unwrap(),
        c["chunks_after"].as_u64().unwrap(),
    );
    assert!(after < before, "{c}");
    assert!(run(&["check"], &path).status.success());
    let pool = Pool::open(&path).unwrap();
    assert!(pool.was_clean());
    for (k, &o) in objs.iter().enumerate() {
        let last = (0..3_000u32)
            .rev()
            .find(|n| *n as usize % objs.len() == k)
            .unwrap();
        let v = pool.read(|tx| tx.read(o)).unwrap();
        assert_eq!(v, [(last % 251) as u8; 200], "object {k}");
    }
    pool.abandon();
    let out = run(&["compact"], &path);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("chunks in use"));
    // Not a pool: a clear error, the file untouched.
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![7u8; 8192]).unwrap();
    let out = run(&["compact"], &junk);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("logheap:"),
        "{out:?}"
    );
    assert_eq!(std::fs::read(&junk).unwrap(), vec![7u8; 8192]);
}

#[test]
fn compact_punches_the_free_space_out_of_a_persistent_heap_and_keeps_its_blocks() {
    use logheap::alloc::{HeapOptions, PersistentHeap};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heap.pool");
    let options = HeapOptions {
        size: 16 << 20,
        segment_size: 1 << 20,
        arenas: 1,
        ..HeapOptions::default()
    };
    let heap = PersistentHeap::create(&path, &options).unwrap();
    let slot = |i: u64| heap.root().checked_add(8 * i).unwrap();
    for i in 0..40 {
        let a = heap.allocate_into(slot(i), 64 << 10).unwrap();
        heap.write(a, &[i as u8 + 1; 64 << 10]).unwrap();
        heap.persist(a, 64 << 10).unwrap();
    }
    for i in 1..40 {
        heap.deallocate(slot(i)).unwrap();
    }
    let kept = heap.read_u64(slot(0)).unwrap();
    heap.close().unwrap();
    let out = run(&["compact", "--json"], &path);
    assert!(out.status.success(), "{out:?}");
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let punched = d["punched_bytes"].as_u64().unwrap();
    assert!(punched >= 39 * (64 << 10), "{d}");
    assert!(
        d["disk_bytes_after"].as_u64().unwrap() < d["disk_bytes_before"].as_u64().unwrap(),
        "{d}"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        16 << 20,
        "same size"
    );
    let heap = PersistentHeap::open(&path).unwrap();
    assert!(heap.stats().recovery.was_clean);
    let a = logheap::alloc::PAddr::from_raw(kept);
    let mut buf = vec![0u8; 64 << 10];
    heap.read(a, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 1), "block 0 kept its bytes");
    drop(heap);
    let out = run(&["compact"], &path);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("punched"));
}

#[test]
fn info_names_the_durability_mode_an_open_would_choose() {
    // On the disk the build runs on (an ordinary file system here): msync; in
    // /dev/shm (tmpfs): pmem, which survives process crashes.
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut places = vec![(disk.path().to_path_buf(), None)];
    let shm = std::path::Path::new("/dev/shm")
        .is_dir()
        .then(|| tempfile::tempdir_in("/dev/shm").unwrap());
    if let Some(shm) = &shm {
        places.push((shm.path().to_path_buf(), Some(("pmem", "memory"))));
    }
    for (dir, want) in places {
        let path = dir.join("p.pool");
        let made = run(&["create", "--size", "4M"], &path);
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let file = std::fs::File::open(&path).unwrap();
        let medium = logheap::Medium::of_file(&file);
        let (mode, medium_name) = want.unwrap_or((medium.auto_durability().name(), medium.name()));
        if want.is_none() && medium == logheap::Medium::PageCache {
            assert_eq!(mode, "msync");
        }
        let text = String::from_utf8_lossy(&run(&["info"], &path).stdout).to_string();
        assert!(
            text.contains(&format!(
                "durability  {mode} by default ({medium_name} medium"
            )),
            "{text}"
        );
        let json: serde_json::Value =
            serde_json::from_slice(&run(&["info", "--json"], &path).stdout).unwrap();
        assert_eq!(json["durability"]["mode"], mode, "{json}");
        assert_eq!(json["durability"]["medium"], medium_name, "{json}");
    }
}

#[test]
fn rm_removes_a_closed_pool_and_refuses_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = pool_with_data(dir.path());
    // Open in this process: refused.
    let pool = Pool::open(&path).unwrap();
    let out = run(&["rm"], &path);
    assert!(!out.status.success());
    assert!(path.exists());
    pool.close().unwrap();
    let out = run(&["rm", "--json"], &path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["extension_files"], 0, "{v}");
    assert!(!path.exists());
    // A file that is no pool: refused, kept.
    let other = dir.path().join("other");
    std::fs::write(&other, vec![7u8; 8192]).unwrap();
    let out = run(&["rm"], &other);
    assert!(!out.status.success());
    assert_eq!(std::fs::read(&other).unwrap(), vec![7u8; 8192]);
}

#[test]
fn dump_shows_the_root_and_every_allocation_with_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = pool_with_data(dir.path());
    let out = run(&["dump", "--json", "--bytes", "0"], &path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The root counter is 50, little-endian.
    assert!(
        v["root"]["bytes"]
            .as_str()
            .unwrap()
            .starts_with("3200000000000000"),
        "{}",
        v["root"]
    );
    let objects = v["allocations"].as_array().unwrap();
    assert_eq!(objects.len(), 50);
    let mut fills: Vec<u8> = objects
        .iter()
        .map(|o| {
            assert_eq!(o["size"], 100, "{o}");
            let hex = o["bytes"].as_str().unwrap();
            assert_eq!(hex.len(), 200, "{o}");
            let first = u8::from_str_radix(&hex[..2], 16).unwrap();
            assert_eq!(hex, format!("{first:02x}").repeat(100), "{o}");
            first
        })
        .collect();
    fills.sort_unstable();
    assert_eq!(fills, (0..50).collect::<Vec<u8>>());
    // Text: a line per 16 bytes shown (64 by default).
    let text = String::from_utf8_lossy(&run(&["dump"], &path).stdout).to_string();
    assert!(text.contains("allocations 50"), "{text}");
    assert_eq!(text.matches("object      ").count(), 50);
}

#[test]
fn check_verifies_a_pool_of_every_in_place_engine() {
    for engine in [
        logheap::EngineKind::Redo,
        logheap::EngineKind::Undo,
        logheap::EngineKind::Oop,
        logheap::EngineKind::Hoop,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pool");
        let pool = Pool::create(&path, &Config::default().size(8 << 20).engine(engine)).unwrap();
        let root: PPtr<u64> = pool.root().unwrap();
        for i in 0..30u8 {
            pool.transaction(|tx| {
                tx.alloc([i; 100])?;
                tx.write(root, &(i as u64 + 1))
            })
            .unwrap();
        }
        pool.close().unwrap();
        let out = run(&["check", "--json"], &path);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{engine}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["allocations"], 30, "{engine}: {v}");
        assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{engine}: {v}");
        // inspect shows the engine's structures: its log areas, and its checksum state.
        let text = String::from_utf8_lossy(&run(&["inspect"], &path).stdout).to_string();
        assert!(
            text.contains("log areas   1 ") && text.contains("data checksums off"),
            "{engine}: {text}"
        );
        assert!(!text.contains("chunk size"), "{engine}: no chunks: {text}");
        let v: serde_json::Value =
            serde_json::from_slice(&run(&["inspect", "--json"], &path).stdout).unwrap();
        assert!(
            v["structures"]["pm_bytes_used"].as_u64().unwrap() > 0,
            "{engine}: {v}"
        );
        // The file is only read.
        let before = std::fs::read(&path).unwrap();
        // A flipped byte in the heap's superblock: damaged, exit 1, one problem listed.
        flip(&path, 520);
        let out = run(&["check"], &path);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{engine}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("damaged"),
            "{engine}"
        );
        flip(&path, 520);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "{engine}: check wrote to the file"
        );
    }
}

#[test]
fn create_with_data_checksums_on_an_in_place_engine_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.pool");
    let out = run(
        &[
            "create",
            "--size",
            "8M",
            "--engine",
            "undo",
            "--data-checksums",
        ],
        &path,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&run(&["inspect"], &path).stdout).to_string();
    assert!(text.contains("data checksums on"), "{text}");
    assert_eq!(run(&["check"], &path).status.code(), Some(0));
    let out = run(
        &["create", "--size", "8M", "--data-checksums"],
        &dir.path().join("log.pool"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("data_checksums"),
        "{err}"
    );
}
