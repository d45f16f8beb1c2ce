//! The committed C header (`include/logheap.h`) is what cbindgen makes of the crate
//! now. `LOGHEAP_BLESS=1 cargo test -p logheap-ffi --test header` rewrites it.

#[test]
fn the_committed_header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut generated);
    let path = format!("{dir}/include/logheap.h");
    if std::env::var_os("LOGHEAP_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/logheap.h is not current: run LOGHEAP_BLESS=1 cargo test -p logheap-ffi --test header"
    );
}
