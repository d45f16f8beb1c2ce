//! Builds the PMDK peer engine (`csrc/pmdk_workloads.c`, the workloads on libpmemobj)
//! when `pkg-config` finds libpmemobj, and sets `cfg(logheap_pmdk)` for `src/pmdk.rs`.
//! Without it the crate builds without PMDK, and `logheap bench --engine pmdk` says so.
//! `LOGHEAP_NO_PMDK=1` builds without PMDK even where it is installed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(logheap_pmdk)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=csrc/pmdk_workloads.c");
    println!("cargo::rerun-if-env-changed=LOGHEAP_NO_PMDK");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    if std::env::var_os("LOGHEAP_NO_PMDK").is_some_and(|v| !v.is_empty() && v != "0") {
        println!("cargo::warning=LOGHEAP_NO_PMDK is set: building without the PMDK peer engine");
        return;
    }
    // The link lines are printed below, after the C library's, so that the linker sees
    // libpmemobj after the code that uses it.
    let lib = match pkg_config::Config::new()
        .cargo_metadata(false)
        .probe("libpmemobj")
    {
        Ok(lib) => lib,
        Err(e) => {
            let first = e.to_string().lines().next().unwrap_or_default().to_string();
            println!(
                "cargo::warning=libpmemobj not found by pkg-config ({first}): building without the PMDK peer engine (install libpmemobj-dev and pkg-config for `logheap bench --engine pmdk`)"
            );
            return;
        }
    };
    let mut build = cc::Build::new();
    build
        .file("csrc/pmdk_workloads.c")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true);
    for dir in &lib.include_paths {
        build.include(dir);
    }
    build.compile("logheap_pmdk_workloads");
    for dir in &lib.link_paths {
        println!("cargo::rustc-link-search=native={}", dir.display());
    }
    for name in &lib.libs {
        println!("cargo::rustc-link-lib={name}");
    }
    println!("cargo::rustc-cfg=logheap_pmdk");
}
