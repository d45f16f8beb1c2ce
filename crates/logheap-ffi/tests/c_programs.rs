//! The C examples, compiled with the system C compiler against `liblogheap_ffi.so`
//! (built for the test) and run on every engine.

use std::path::Path;
use std::process::Command;

#[path = "support/c_libraries.rs"]
mod c_libraries;
use c_libraries::library_dir;

/// Compiles `source` (under `examples/c`) into `out` against the library in `lib`,
/// warnings as errors.
fn compile(lib: &Path, source: &str, out: &Path) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        lib.join("liblogheap_ffi.so").exists(),
        "liblogheap_ffi.so is not in {}",
        lib.display()
    );
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg(crate_dir.join("examples/c").join(source))
        .arg("-I")
        .arg(crate_dir.join("include"))
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-pthread", "-o",
        ])
        .arg(out)
        .arg("-L")
        .arg(lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-llogheap_ffi")
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(status.success(), "{source} does not compile");
}

/// Compiles each example and runs it on every engine: each checks its answers and its
/// structure's invariants against a model, closes, reopens and checks again.
#[test]
fn the_c_examples_run_on_every_engine() {
    let dir = tempfile::tempdir().unwrap();
    let lib = library_dir();
    for example in ["hashmap", "btree", "rbtree"] {
        let exe = dir.path().join(example);
        compile(&lib, &format!("{example}.c"), &exe);
        for engine in ["log", "redo", "undo", "oop", "hoop"] {
            let pool = dir.path().join(format!("{example}-{engine}.pool"));
            let out = Command::new(&exe).arg(&pool).arg(engine).output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && stdout.trim() == "ok",
                "{example} on {engine}: {}\n{stdout}{stderr}",
                out.status
            );
        }
    }
}

/// The install layout of `install.sh` (a prefix with `include/logheap.h`,
/// `lib/liblogheap.so` and `lib/pkgconfig/logheap.pc` made from `logheap.pc.in`), then
/// the hash map built with nothing but `pkg-config --cflags --libs logheap`, on every
/// engine.
#[test]
fn a_program_builds_with_pkg_config_alone() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library_dir();
    let prefix = tempfile::tempdir().unwrap();
    let p = prefix.path();
    std::fs::create_dir_all(p.join("lib/pkgconfig")).unwrap();
    std::fs::create_dir_all(p.join("include")).unwrap();
    std::fs::copy(
        crate_dir.join("include/logheap.h"),
        p.join("include/logheap.h"),
    )
    .unwrap();
    std::fs::copy(lib.join("liblogheap_ffi.so"), p.join("lib/liblogheap.so")).unwrap();
    let pc = std::fs::read_to_string(crate_dir.join("logheap.pc.in"))
        .unwrap()
        .replace("@PREFIX@", &p.display().to_string())
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
    std::fs::write(p.join("lib/pkgconfig/logheap.pc"), pc).unwrap();
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "logheap"])
        .env("PKG_CONFIG_PATH", p.join("lib/pkgconfig"))
        .output()
        .expect("pkg-config (apt-get install pkg-config)");
    assert!(flags.status.success(), "pkg-config does not know logheap");
    let flags = String::from_utf8(flags.stdout).unwrap();
    let exe = p.join("hashmap");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg(crate_dir.join("examples/c/hashmap.c"))
        .args(["-std=c11", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&exe)
        .args(flags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", p.join("lib").display()))
        .status()
        .unwrap();
    assert!(status.success(), "hashmap.c does not build with {flags}");
    for engine in ["log", "redo", "undo", "oop", "hoop"] {
        let out = Command::new(&exe)
            .arg(p.join(format!("{engine}.pool")))
            .arg(engine)
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
            "{engine}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The maps of the C comparison with PMDK (`examples/c/cmaps.c`, run against PMDK by
/// `scripts/c-maps-bench.sh`) on every engine, small: every key inserted is found.
#[test]
fn the_c_maps_of_the_pmdk_comparison_run_on_every_engine() {
    let dir = tempfile::tempdir().unwrap();
    let lib = library_dir();
    let exe = dir.path().join("cmaps");
    compile(&lib, "cmaps.c", &exe);
    for engine in ["log", "redo", "undo", "oop", "hoop"] {
        let out = Command::new(&exe)
            .arg(dir.path().join(format!("cmaps-{engine}.pool")))
            .arg(engine)
            .arg("2000")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.lines().count() == 9,
            "cmaps on {engine}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
