#!/bin/sh
# Installs liblogheap (the C API) under PREFIX (default /usr/local): the shared and
# static libraries as liblogheap.so and liblogheap.a, the header logheap.h, and
# logheap.pc, so that `pkg-config --cflags --libs logheap` works.
#
#   crates/logheap-ffi/install.sh [PREFIX]
#   cc app.c $(pkg-config --cflags --libs logheap)
#
# With PREFIX outside the system paths, point PKG_CONFIG_PATH at PREFIX/lib/pkgconfig
# and the loader at PREFIX/lib (LD_LIBRARY_PATH, or -Wl,-rpath).
set -eu
prefix=${1:-/usr/local}
here=$(cd "$(dirname "$0")" && pwd)
target=${CARGO_TARGET_DIR:-$here/../../target}
cargo build --release -p logheap-ffi --manifest-path "$here/../../Cargo.toml"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/../../Cargo.toml" | head -n 1)
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
install -m 755 "$target/release/liblogheap_ffi.so" "$prefix/lib/liblogheap.so"
install -m 644 "$target/release/liblogheap_ffi.a" "$prefix/lib/liblogheap.a"
install -m 644 "$here/include/logheap.h" "$prefix/include/logheap.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$here/logheap.pc.in" \
    > "$prefix/lib/pkgconfig/logheap.pc"
echo "installed liblogheap $version under $prefix"
