"""Summarises an A/B run of scripts/ab-bench.sh: median tx/s per (workload, threads)
for base and new, the ratio new/base, the spread (median absolute deviation over the
median) of each side, and whether the deterministic counters are identical."""
import json
import pathlib
import statistics
import sys

DETERMINISTIC = ("fences_per_write_tx", "lines_flushed_per_tx", "payload_bytes_per_tx")


def load(directory, side):
    runs = {}
    for path in sorted(pathlib.Path(directory).glob(f"{side}-*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.startswith("{"):
                continue  # not a result line ("results in ...")
            r = json.loads(line)
            runs.setdefault((r["workload"], r["threads"]), []).append(r)
    return runs


def spread(values):
    m = statistics.median(values)
    return statistics.median(abs(v - m) for v in values) / m if m else 0.0


def main():
    directory = sys.argv[1]
    base, new = load(directory, "base"), load(directory, "new")
    print("| workload | threads | base tx/s | new tx/s | new/base | spread base / new | counters |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for key in sorted(base):
        if key not in new:
            continue
        b = [r["tx_per_s"] for r in base[key]]
        n = [r["tx_per_s"] for r in new[key]]
        ratio = statistics.median(n) / statistics.median(b)
        ratios.append(ratio)
        same = "identical"
        if key[1] == 1:
            for field in DETERMINISTIC:
                if {r[field] for r in base[key]} != {r[field] for r in new[key]}:
                    same = f"{field} differs"
        else:
            same = "(2 threads: not deterministic)"
        print(
            f"| {key[0]} | {key[1]} | {statistics.median(b):,.0f} | {statistics.median(n):,.0f} "
            f"| {ratio:.3f} | {spread(b):.1%} / {spread(n):.1%} | {same} |"
        )
    if ratios:
        print(f"\ngeometric mean new/base: {statistics.geometric_mean(ratios):.3f}")


if __name__ == "__main__":
    main()
