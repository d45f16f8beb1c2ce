//! The C examples, compiled with the system C compiler against `liblogheap_ffi.so`
//! (built for the test) and run on every engine.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory of a current `liblogheap_ffi.so`: built here by cargo, in a target
/// directory of its own (the test run's own is locked while tests run, and
/// `cargo test` builds only the crate's Rust library for its tests).
fn library_dir() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ffi-library");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(["build", "--offline", "-p", "logheap-ffi", "--lib"])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .unwrap_or_else(|e| panic!("running {cargo}: {e}"));
    assert!(status.success(), "cargo build -p logheap-ffi failed");
    target.join("debug")
}

/// Compiles `source` (under `examples/c`) into `out`, warnings as errors.
fn compile(source: &str, out: &Path) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library_dir();
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
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-llogheap_ffi")
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(status.success(), "{source} does not compile");
}

#[test]
fn the_c_hash_map_runs_on_every_engine() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("hashmap");
    compile("hashmap.c", &exe);
    for engine in ["log", "redo", "undo", "oop", "hoop"] {
        let pool = dir.path().join(format!("{engine}.pool"));
        let out = Command::new(&exe).arg(&pool).arg(engine).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.trim() == "ok",
            "hashmap on {engine}: {}\n{stdout}{stderr}",
            out.status
        );
    }
}
