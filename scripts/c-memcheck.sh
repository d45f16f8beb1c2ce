#!/usr/bin/env bash
# The C examples of the C API (crates/logheap-ffi/examples/c) and of the GNU TM runtime
# (crates/logheap-itm/examples/c) under valgrind's memcheck: any invalid read or write,
# use of uninitialised memory or bad free, in the C code or in the libraries, fails
# the run. One engine each (valgrind runs them some 50 times slower); the test suite
# runs them all, without valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build -p logheap-ffi -p logheap-itm --lib
lib=$(cd "$target/debug" && pwd)
work=$(mktemp -d "${TMPDIR:-/dev/shm}/logheap-memcheck.XXXXXX")
trap 'rm -rf "$work"' EXIT
memcheck() { valgrind -q --error-exitcode=99 --errors-for-leak-kinds=none "$@"; }

for example in hashmap:log btree:undo rbtree:redo; do
  name=${example%%:*} engine=${example##*:}
  cc -std=c11 -O1 -g -pthread crates/logheap-ffi/examples/c/$name.c -I crates/logheap-ffi/include \
    -o "$work/$name" -L "$lib" -llogheap_ffi -Wl,-rpath,"$lib"
  echo "memcheck: $name on $engine"
  memcheck "$work/$name" "$work/$name-$engine.pool" "$engine"
done

gcc -fgnu-tm -std=gnu11 -O2 -g -pthread -c crates/logheap-itm/examples/c/bank.c \
  -I crates/logheap-itm/include -o "$work/bank.o"
gcc "$work/bank.o" -o "$work/bank" -L "$lib" -llogheap_itm -Wl,-rpath,"$lib" -pthread
echo "memcheck: GNU TM bank on redo"
memcheck "$work/bank" "$work/bank.pool" redo run
memcheck "$work/bank" "$work/bank.pool" redo check
echo "memcheck: no error"
