#!/usr/bin/env python3
"""results.tsv of deploy/bench/peers.sh -> a Markdown table on stdout.

One row per (mode, body, target): medians over the repeats of rps, p50, p99
and CPU microseconds per request (each repeat's target CPU time / its
requests; "of which kernel" is the stime part), then CPU/req and p99 as multiples of nginx's in the same mode and
body. `runs` counts the repeats, `errors` sums wrk's socket errors and
non-2xx answers, `foreign` is the largest share of a core that other
processes on the machine used during one of the runs (load we did not cause).
"""
import csv
import sys
from statistics import median


def main(path):
    cells = {}
    for row in csv.DictReader(open(path), delimiter="\t"):
        cells.setdefault((row["mode"], row["body"], row["target"]), []).append(row)
    if not cells:
        print("no results")
        return 1

    stats = {}
    for key, rows in cells.items():
        def med(f):
            return median(f(r) for r in rows)
        stats[key] = {
            "runs": len(rows),
            "rps": med(lambda r: float(r["rps"])),
            "p50": med(lambda r: float(r["p50_us"])) / 1000,
            "p99": med(lambda r: float(r["p99_us"])) / 1000,
            "cpu": med(lambda r: float(r["cpu_s"]) * 1e6 / max(int(r["requests"]), 1)),
            "sys": med(lambda r: float(r["sys_s"]) * 1e6 / max(int(r["requests"]), 1)),
            "errors": sum(int(r["errors"]) for r in rows),
            "foreign": max(float(r["foreign_pct"]) for r in rows),
        }

    modes = sorted({k[0] for k in stats}, key=lambda m: m != "pinned")
    print("| mode | target | body | rps | p50 ms | p99 ms | CPU µs/req | of which kernel | CPU/req vs nginx | p99 vs nginx | runs | errors | foreign CPU % (max) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode in modes:
        bodies = []
        for (m, b, _) in stats:
            if m == mode and b not in bodies:
                bodies.append(b)
        for body in bodies:
            ref = stats.get((mode, body, "nginx"))
            for (m, b, t), s in stats.items():
                if (m, b) != (mode, body):
                    continue
                vs_cpu = "%.2f" % (s["cpu"] / ref["cpu"]) if ref and ref["cpu"] else "-"
                vs_p99 = "%.2f" % (s["p99"] / ref["p99"]) if ref and ref["p99"] else "-"
                print("| %s | %s | %s | %s | %.3f | %.3f | %.1f | %.1f | %s | %s | %d | %d | %.0f |" % (
                    mode, t, body, format(round(s["rps"]), ","), s["p50"], s["p99"], s["cpu"], s["sys"],
                    vs_cpu, vs_p99, s["runs"], s["errors"], s["foreign"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
