#!/usr/bin/env bash
# The same C maps (crates/logheap-ffi/examples/c/cmaps.c: a chained hash map and a
# red-black tree) on logheap's C API, on each engine, and on PMDK's libpmemobj, in one
# run on /dev/shm: one operation per transaction, one thread. Prints a Markdown table
# of operations per second, each logheap figure beside its ratio to PMDK's.
#
#   scripts/c-maps-bench.sh [N]      (N keys, default 100000)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p logheap-ffi --lib
lib=$(cd "$target/release" && pwd)
work=$(mktemp -d /dev/shm/logheap-cmaps.XXXXXX)
trap 'rm -rf "$work"' EXIT
src=crates/logheap-ffi/examples/c/cmaps.c
cc -std=gnu11 -O2 "$src" -I crates/logheap-ffi/include -o "$work/cmaps-logheap" \
  -L "$lib" -llogheap_ffi -Wl,-rpath,"$lib"
cc -std=gnu11 -O2 -DBACKEND_PMDK "$src" -o "$work/cmaps-pmdk" \
  $(pkg-config --cflags --libs libpmemobj)
engines=(log redo undo oop hoop)
for e in "${engines[@]}"; do
  "$work/cmaps-logheap" "$work/$e.pool" "$e" "$n" > "$work/$e.txt"
done
PMEM_IS_PMEM_FORCE=1 "$work/cmaps-pmdk" "$work/pmdk.pool" pmdk "$n" > "$work/pmdk.txt"
python3 - "$work" "${engines[@]}" <<'PY'
import sys
work, engines = sys.argv[1], sys.argv[2:]
def load(name):
    return {(l.split()[0], l.split()[1]): float(l.split()[2]) for l in open(f"{work}/{name}.txt")}
pmdk = load("pmdk")
runs = {e: load(e) for e in engines}
print("| map | phase | pmdk | " + " | ".join(engines) + " |")
print("|---|---|---|" + "---|" * len(engines))
for key in pmdk:
    cells = [f"{runs[e][key]/1e3:,.0f} K ({runs[e][key]/pmdk[key]:.2f}x)" for e in engines]
    print(f"| {key[0]} | {key[1]} | {pmdk[key]/1e3:,.0f} K | " + " | ".join(cells) + " |")
PY
