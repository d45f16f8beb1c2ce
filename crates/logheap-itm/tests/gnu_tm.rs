//! C programs with GNU TM transactions (`gcc -fgnu-tm`), linked against
//! `liblogheap_itm` instead of libitm, run on `redo` and `undo`: their transactions
//! persist (a second process finds everything), conflicts between threads are
//! retried, `__transaction_cancel` and serial irrevocable transactions work; built at
//! `-O2` and, where the CPU has AVX, at `-O3 -mavx` (vector barriers).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory holding a current `liblogheap_itm.so`, built here by cargo in a
/// target directory of its own (the test run's own is locked while tests run, and
/// `cargo test` builds only the crate's Rust library for its tests).
fn library_dir() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("itm-library");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(["build", "--offline", "-p", "logheap-itm", "--lib"])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .unwrap_or_else(|e| panic!("running {cargo}: {e}"));
    assert!(status.success(), "cargo build -p logheap-itm failed");
    target.join("debug")
}

/// Compiles `examples/c/bank.c` with `flags` and links it against the runtime (the
/// link without `-fgnu-tm`, so GCC's libitm stays out).
fn build(lib: &Path, out: &Path, flags: &[&str]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let object = out.with_extension("o");
    let compiled = Command::new(&cc)
        .args(["-fgnu-tm", "-std=gnu11", "-Wall", "-pthread", "-c"])
        .args(flags)
        .arg(dir.join("examples/c/bank.c"))
        .arg("-I")
        .arg(dir.join("include"))
        .arg("-o")
        .arg(&object)
        .status()
        .unwrap();
    assert!(compiled.success(), "bank.c does not compile with {flags:?}");
    let linked = Command::new(&cc)
        .arg(&object)
        .arg("-o")
        .arg(out)
        .arg("-L")
        .arg(lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-llogheap_itm", "-pthread"])
        .status()
        .unwrap();
    assert!(linked.success(), "bank.o does not link");
    let libs = Command::new("ldd").arg(out).output().unwrap();
    let libs = String::from_utf8_lossy(&libs.stdout);
    assert!(libs.contains("liblogheap_itm"), "{libs}");
    assert!(!libs.contains("libitm"), "GCC's libitm was linked: {libs}");
}

fn run(exe: &Path, pool: &Path, engine: &str, step: &str) -> (bool, String) {
    let out = Command::new(exe)
        .arg(pool)
        .arg(engine)
        .arg(step)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && text.trim() == "ok", text)
}

#[test]
fn gnu_tm_programs_persist_on_redo_and_undo() {
    let lib = library_dir();
    let dir = tempfile::tempdir().unwrap();
    let mut builds = vec![("O2", vec!["-O2"])];
    if std::arch::is_x86_feature_detected!("avx") {
        builds.push(("O3-avx", vec!["-O3", "-mavx"]));
    }
    for (name, flags) in builds {
        let exe = dir.path().join(format!("bank-{name}"));
        build(&lib, &exe, &flags);
        for engine in ["redo", "undo"] {
            let pool = dir.path().join(format!("{name}-{engine}.pool"));
            let (ok, text) = run(&exe, &pool, engine, "run");
            assert!(ok, "{name} {engine} run: {text}");
            let (ok, text) = run(&exe, &pool, engine, "check");
            assert!(ok, "{name} {engine} check in another process: {text}");
        }
        // The engines whose objects do not live at their home are refused.
        let (ok, text) = run(&exe, &dir.path().join("log.pool"), "log", "run");
        assert!(!ok && text.contains("redo, undo"), "{text}");
    }
}
