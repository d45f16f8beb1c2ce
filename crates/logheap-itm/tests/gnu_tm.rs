//! C programs with GNU TM transactions (`gcc -fgnu-tm`), linked against
//! `liblogheap_itm` instead of libitm, run on `redo` and `undo`: their transactions
//! persist (a second process finds everything), conflicts between threads are
//! retried, `__transaction_cancel` and serial irrevocable transactions work; built at
//! `-O2` and, where the CPU has AVX, at `-O3 -mavx` (vector barriers).

use std::path::Path;
use std::process::Command;

#[path = "../../logheap-ffi/tests/support/c_libraries.rs"]
mod c_libraries;
use c_libraries::library_dir;

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

/// The transfer count a finished `bank ... audit` printed (it checked the total).
fn audit(exe: &Path, pool: &Path, engine: &str) -> u64 {
    let out = Command::new(exe)
        .arg(pool)
        .arg(engine)
        .arg("audit")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "audit on {engine}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("audit printed {text:?}"))
}

/// Transfers on two threads, killed with SIGKILL at random moments, 50 times on each
/// engine: after every kill the total of the balances is intact and every transfer
/// the program acknowledged (printed after its commit) is in the pool.
#[test]
fn killed_transfers_keep_the_total_and_every_acknowledged_transfer() {
    use std::io::Read;
    let lib = library_dir();
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("bank-kill");
    build(&lib, &exe, &["-O3"]);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for engine in ["redo", "undo"] {
        let pool = dir.path().join(format!("kill-{engine}.pool"));
        let mut durable = audit(&exe, &pool, engine);
        for kill in 0..50 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut child = Command::new(&exe)
                .arg(&pool)
                .arg(engine)
                .arg("spin")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(5 + seed % 40));
            child.kill().unwrap();
            let mut printed = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut printed)
                .unwrap();
            let status = child.wait().unwrap();
            assert!(
                !status.success(),
                "{engine} kill {kill}: the spin ended by itself"
            );
            let acknowledged = printed
                .lines()
                .filter_map(|l| l.parse::<u64>().ok())
                .max()
                .unwrap_or(0);
            let now = audit(&exe, &pool, engine);
            assert!(
                now >= acknowledged.max(durable),
                "{engine} kill {kill}: {now} transfers in the pool, {acknowledged} acknowledged, {durable} before"
            );
            durable = now;
        }
        assert!(durable > 0, "{engine}: no transfer ever committed");
        eprintln!(
            "{engine}: 50 kills; {durable} transfers in the pool at the end, every acknowledged one among them"
        );
    }
}
