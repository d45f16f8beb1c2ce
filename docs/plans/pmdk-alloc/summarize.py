#!/usr/bin/env python3
"""Aggregate results/*.txt into median [min-max] tables (markdown)."""
import re, statistics, sys, collections
d = sys.argv[1] if len(sys.argv) > 1 else "results"

def kv(line):
    return dict(re.findall(r'(\w+)=(\S+)', line))

def mmm(xs, fmt="{:.0f}"):
    xs = sorted(xs)
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(xs[0])}–{fmt.format(xs[-1])}]"

# alloc
rows = collections.OrderedDict()
for line in open(f"{d}/alloc.txt"):
    if not line.startswith("RESULT"): continue
    k = kv(line)
    # p99 etc. appear twice (alloc/free) -> parse manually
    m = re.search(r'alloc_ns_p50=(\d+) p99=(\d+) p999=(\d+) max=(\d+) free_ns_p50=(\d+) p99=(\d+) p999=(\d+)', line)
    key = (k['threads'], k['size'])
    rows.setdefault(key, []).append((float(k['total_ops_s']), float(k['per_thread_ops_s']),
        float(k.get('ops_per_cpu_s', 'nan')), *map(int, m.groups())))
print("| threads | size | runs | total ops/s | ops/s per thread | ops per CPU-second | alloc p50 / p99 / p99.9 ns | free p50 / p99 / p99.9 ns |")
print("|---|---|---|---|---|---|---|---|")
for (t, sz), v in rows.items():
    col = lambda i: [x[i] for x in v]
    med = lambda i: int(statistics.median(col(i)))
    print(f"| {t} | {sz} B | {len(v)} | {mmm(col(0))} | {mmm(col(1))} | {mmm(col(2))} | "
          f"{med(3)} / {med(4)} / {med(5)} | {med(7)} / {med(8)} / {med(9)} |")
print()

# open (in-process)
agg = collections.OrderedDict()
setup = []
for line in open(f"{d}/open.txt"):
    if not line.startswith("RESULT"): continue
    k = kv(line)
    if k['what'] == 'setup':
        setup.append(k); continue
    if k['what'] == 'sanity':
        agg.setdefault('sanity_foreach_walk', []).append(float(k['foreach_walk_ms'])); continue
    agg.setdefault(k['what'], []).append((float(k['min_ms']), float(k['median_ms']), float(k['max_ms'])))
print("setup:", "; ".join(f"create {s['create_1GiB_ms']} ms, fill {s.get('fill_1000000_blocks_s')} s, close {s['close_ms']} ms" for s in setup))
print()
print("| measurement (in one process) | min ms | median of per-rep medians ms [range] | max ms |")
print("|---|---|---|---|")
for w, v in agg.items():
    if w == 'sanity_foreach_walk':
        print(f"| POBJ_FOREACH walk of all objects | {min(v):.1f} | {statistics.median(v):.1f} | {max(v):.1f} |"); continue
    mins = [x[0] for x in v]; meds = [x[1] for x in v]; maxs = [x[2] for x in v]
    print(f"| {w} | {min(mins):.3f} | {mmm(meds, '{:.3f}')} | {max(maxs):.3f} |")
print()
o1 = [kv(l) for l in open(f"{d}/open1.txt") if l.startswith("RESULT")]
print(f"fresh process (n={len(o1)}):")
for f in ("open_ms", "first_alloc64_ms", "close_ms", "open_minflt", "alloc_minflt"):
    print(f"  {f}: median {statistics.median(float(x[f]) for x in o1):.3f} "
          f"min {min(float(x[f]) for x in o1):.3f} max {max(float(x[f]) for x in o1):.3f}")
