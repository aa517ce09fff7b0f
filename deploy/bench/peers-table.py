#!/usr/bin/env python3
"""results.tsv (and rss.tsv) of deploy/bench/peers.sh -> Markdown on stdout.

One row per (mode, body, target): medians over the repeats of rps, p50, p99
and CPU microseconds per request (each repeat's target CPU time / its
requests; "of which kernel" is the stime part), then CPU/req as multiples of
nginx's and Caddy's and p99 as a multiple of nginx's, in the same mode and
body. `runs` counts the repeats, `errors` sums wrk's socket errors and
non-2xx answers, `foreign` is the largest share of a core that other
processes on the machine used during one of the runs (load we did not cause).

Then resident memory after the many-connection run, and the speed issue's
bars, each marked met or short, from the pinned runs.
"""
import csv
import os
import sys
from statistics import median

# (target, what, limit): the bars of the speed work, checked on pinned runs.
BARS = [
    ("happypath", "cpu_vs_nginx", 1.6),
    ("happypath", "p99_vs_nginx", 2.0),
    ("happypath", "errors", 0),
    ("happypath-policies", "cpu_vs_nginx", 1.9),
    ("happypath-policies", "errors", 0),
    ("happypath", "cpu_vs_caddy", 0.5),
    ("happypath-policies", "cpu_vs_caddy", 0.5),
]
RSS_LIMIT_MIB = 64


def ratio(a, b):
    return a / b if b else None


def main(path, rss_path=None):
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
    for (mode, body, target), s in stats.items():
        nginx = stats.get((mode, body, "nginx"))
        caddy = stats.get((mode, body, "caddy"))
        s["cpu_vs_nginx"] = ratio(s["cpu"], nginx["cpu"]) if nginx else None
        s["p99_vs_nginx"] = ratio(s["p99"], nginx["p99"]) if nginx else None
        s["cpu_vs_caddy"] = ratio(s["cpu"], caddy["cpu"]) if caddy else None

    def fmt(v):
        return "-" if v is None else "%.2f" % v

    modes = sorted({k[0] for k in stats}, key=lambda m: m != "pinned")
    print("| mode | target | body | rps | p50 ms | p99 ms | CPU µs/req | of which kernel | CPU/req vs nginx | CPU/req vs Caddy | p99 vs nginx | runs | errors | foreign CPU % (max) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode in modes:
        bodies = []
        for (m, b, _) in stats:
            if m == mode and b not in bodies:
                bodies.append(b)
        for body in bodies:
            for (m, b, t), s in stats.items():
                if (m, b) != (mode, body):
                    continue
                print("| %s | %s | %s | %s | %.3f | %.3f | %.1f | %.1f | %s | %s | %s | %d | %d | %.0f |" % (
                    mode, t, body, format(round(s["rps"]), ","), s["p50"], s["p99"], s["cpu"], s["sys"],
                    fmt(s["cpu_vs_nginx"]), fmt(s["cpu_vs_caddy"]), fmt(s["p99_vs_nginx"]), s["runs"], s["errors"], s["foreign"]))

    rss = []
    if rss_path and os.path.exists(rss_path):
        rss = list(csv.DictReader(open(rss_path), delimiter="\t"))
    if rss:
        print()
        print("| target | RSS MiB after the run | peak RSS MiB | requests | errors |")
        print("|---|---:|---:|---:|---:|")
        for r in rss:
            print("| %s | %.1f | %.1f | %s | %s |" % (r["target"], int(r["rss_kib"]) / 1024, int(r["hwm_kib"]) / 1024, r["requests"], r["errors"]))

    print()
    print("| bar (pinned) | body | measured | limit | |")
    print("|---|---|---:|---:|---|")
    bodies = sorted({b for (m, b, _) in stats if m == "pinned"})
    for target, what, limit in BARS:
        for body in bodies:
            s = stats.get(("pinned", body, target))
            if s is None or s.get(what) is None:
                continue
            v = s[what]
            ok = v <= limit
            print("| %s %s | %s | %s | %s | %s |" % (
                target, what.replace("_", " "), body, v if what == "errors" else "%.2f" % v, limit, "met" if ok else "**short**"))
    for r in rss:
        if r["target"].startswith("happypath"):
            peak = int(r["hwm_kib"]) / 1024
            print("| %s peak RSS after -c400 on 16k | 16k | %.1f MiB | %d MiB | %s |" % (
                r["target"], peak, RSS_LIMIT_MIB, "met" if peak <= RSS_LIMIT_MIB else "**short**"))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
