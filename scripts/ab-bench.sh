#!/usr/bin/env bash
# A/B benchmark of two logheap binaries on the log engine: alternates BASE and NEW for
# ROUNDS rounds (so that drift of a noisy machine hits both alike) and prints, per
# workload and thread count, the median throughput of each and their ratio, and
# whether the deterministic per-transaction counters are identical.
#
#   scripts/ab-bench.sh BASE_BINARY NEW_BINARY [ROUNDS] [extra bench options...]
#
# Build the base binary from the base commit first, e.g. in a git worktree with its
# own CARGO_TARGET_DIR, and copy it out.
set -euo pipefail
base=$1 new=$2 rounds=${3:-5}
shift $(( $# < 3 ? $# : 3 ))
out=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  for side in base new; do
    bin=$base; [ "$side" = new ] && bin=$new
    "$bin" bench --engine log --emulation off --ops 100000 --elements 50000 \
      --threads 1 --threads 2 --json --out "$out/$side-$r" "$@" \
      >"$out/$side-$r.jsonl" 2>/dev/null
  done
done
python3 "$(dirname "$0")/ab_summary.py" "$out"
