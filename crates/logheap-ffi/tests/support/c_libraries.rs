//! The C libraries of the workspace (`liblogheap_ffi.so`, `liblogheap_itm.so`) for the
//! tests that compile C against them (included by the C tests of `logheap-ffi` and of
//! `logheap-itm` with `#[path]`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory holding current `liblogheap_ffi.so` and `liblogheap_itm.so`, built here
/// by cargo in a target directory of their own: the test run's own is locked while
/// tests run, and `cargo test` builds only the crates' Rust libraries for their tests.
pub fn library_dir() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-libraries");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args([
            "build",
            "--offline",
            "-p",
            "logheap-ffi",
            "-p",
            "logheap-itm",
            "--lib",
        ])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .unwrap_or_else(|e| panic!("running {cargo}: {e}"));
    assert!(status.success(), "cargo build of the C libraries failed");
    target.join("debug")
}
