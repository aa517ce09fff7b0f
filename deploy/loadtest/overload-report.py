#!/usr/bin/env python3
"""The `overload` scenario's numbers, targets and chart (overload.sh runs it
after the configurations): reads OUT/NAME.{requests,samples}.csv and
OUT/NAME.run.json of each configuration, prints a markdown table and the
adaptive row's targets (PASS/FAIL), and writes OUT/overload.md,
OUT/overload-summary.csv and OUT/overload.png (matplotlib; --no-chart skips it).

What each number is (docs/performance.md, "The overload scenario"):
- unloaded p99: critical requests answered 200 in the `before` phase (its
  first 10 % left out: new connections), the yardstick of the other latencies.
- critical availability, p50, p99: critical requests scheduled in the spike
  or after it; available = answered 200 within the timeout; the percentiles
  are of those answered 200.
- sheddable goodput: sheddable requests answered 200 during the spike, a second.
- goodput / capacity: requests of either class answered 200 during the
  spike, a second, over the upstream's capacity (SLOTS / SERVICE).
- utilisation: the upstream's busy slot-seconds over SLOTS x seconds, during
  the spike (its own count; busy with a request the proxy gave up on counts
  too: that is work, not goodput).
- limit settles: the time from the spike's start (end) until the limit stays
  within max(2, 25 %) of where it ends up (the median of the phase's second
  half), from the samples of happypath_upstream_concurrency_limit.
- end-of-spike window: critical availability from 1 s before the spike ends
  to the end of the run (a dip there is the failure mode of controllers that
  re-measure at a forced low limit).
"""
import argparse, csv, json, statistics, sys

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--configs", nargs="+", required=True)
parser.add_argument("--check", action="store_true", help="exit 1 if an adaptive target fails")
parser.add_argument("--short", action="store_true", help="check only that every configuration produced numbers")
parser.add_argument("--no-chart", action="store_true")
args = parser.parse_args()

TARGETS = {"availability": 0.995, "p99_ratio": 2.0, "goodput": 0.90, "end_window": 0.995}


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def number(text):
    return float(text) if text not in ("", None) else None


def load(name):
    run = json.load(open(f"{args.out}/{name}.run.json"))
    with open(f"{args.out}/{name}.requests.csv") as f:
        requests = [(r["class"], float(r["scheduled_s"]), int(r["status"]), float(r["latency_ms"]), r["problem_code"])
                    for r in csv.DictReader(f)]
    with open(f"{args.out}/{name}.samples.csv") as f:
        samples = [{k: number(v) for k, v in r.items()} for r in csv.DictReader(f)]
    return run, requests, samples


def settle(samples, begin, end):
    """Seconds from `begin` until the limit stays within the band around the
    median of [middle, end), and that median; None without limit samples."""
    series = [(s["t"], s["concurrency_limit"]) for s in samples if begin <= s["t"] < end and s["concurrency_limit"] is not None]
    tail = [v for t, v in series if t >= (begin + end) / 2]
    if not series or not tail:
        return None, None, None
    final = statistics.median(tail)
    band = max(2.0, 0.25 * final)
    settled_at = begin
    for t, v in series:
        if abs(v - final) > band:
            settled_at = t
    spread = (min(tail), max(tail))
    return round(settled_at - begin, 2), final, spread


def analyse(name):
    run, requests, samples = load(name)
    before, spike, after = run["phases"]
    spike_start, spike_end, total = before, before + spike, before + spike + after
    capacity = run["slots"] / (run["service_ms"] / 1000)
    crit = [r for r in requests if r[0] == "critical"]
    unloaded = [r[3] for r in crit if 0.1 * before <= r[1] < spike_start and r[2] == 200]
    loaded = [r for r in crit if r[1] >= spike_start]
    loaded_ok = [r[3] for r in loaded if r[2] == 200]
    end_window = [r for r in crit if r[1] >= spike_end - 1]
    shed_sp = [r for r in requests if r[0] == "sheddable"]
    # Answered (not scheduled) in the spike: what the upstream delivered then.
    in_spike_ok = [r for r in requests if spike_start <= r[1] + r[3] / 1000 < spike_end and r[2] == 200]
    statuses = {}
    for r in loaded:
        key = f"{r[2]} {r[4]}" if r[4] else str(r[2])
        statuses[key] = statuses.get(key, 0) + 1
    # Utilisation in the spike, from the upstream's own counters at the samples nearest its edges.
    up = [s for s in samples if s.get("up_busy_slot_s") is not None]
    def nearest(t):
        return min(up, key=lambda s: abs(s["t"] - t)) if up else None
    a, b = nearest(spike_start), nearest(spike_end)
    utilisation = None
    if a and b and b["up_now"] > a["up_now"]:
        utilisation = (b["up_busy_slot_s"] - a["up_busy_slot_s"]) / (run["slots"] * (b["up_now"] - a["up_now"]))
    shed_delta = {}
    shed_rows = [s for s in samples if any(s.get(k) is not None for k in ("shed_critical", "shed_normal", "shed_sheddable"))]
    for k in ("shed_critical", "shed_normal", "shed_sheddable"):
        values = [s[k] for s in shed_rows if s.get(k) is not None]
        # A counter appears at its first increment: before it, it was 0.
        first = values[0] if values and shed_rows and shed_rows[0].get(k) is not None else 0.0
        shed_delta[k] = (values[-1] - first) if values else None
    start_settle, spike_limit, spike_spread = settle(samples, spike_start, spike_end)
    end_settle, after_limit, _ = settle(samples, spike_end, total)
    unloaded_p99 = percentile(unloaded, 0.99)
    p99 = percentile(loaded_ok, 0.99)
    return {
        "name": name, "run": run, "capacity": capacity, "requests": requests, "samples": samples,
        "critical_requests": len(loaded), "critical_failed": len(loaded) - len(loaded_ok),
        "critical_availability": len(loaded_ok) / len(loaded) if loaded else None,
        "critical_statuses": statuses,
        "unloaded_p99_ms": unloaded_p99, "critical_p50_ms": percentile(loaded_ok, 0.5), "critical_p99_ms": p99,
        "p99_ratio": (p99 / unloaded_p99) if p99 and unloaded_p99 else None,
        "sheddable_goodput": sum(1 for r in shed_sp if r[2] == 200 and spike_start <= r[1] + r[3] / 1000 < spike_end) / spike,
        "sheddable_offered": run["sheddable_rate"],
        "goodput_of_capacity": len(in_spike_ok) / spike / capacity,
        "utilisation": utilisation,
        "end_window_availability": sum(1 for r in end_window if r[2] == 200) / len(end_window) if end_window else None,
        "end_window_failed": sum(1 for r in end_window if r[2] != 200),
        "limit_settle_spike_s": start_settle, "limit_in_spike": spike_limit, "limit_spread_in_spike": spike_spread,
        "limit_settle_after_s": end_settle, "limit_after": after_limit,
        "shed_critical": shed_delta["shed_critical"], "shed_sheddable": shed_delta["shed_sheddable"],
    }


def settle_cells(r):
    """The two settling cells; without adaptive_concurrency in its configuration the limit is fixed."""
    try:
        adaptive = "adaptive_concurrency" in open(f'{args.out}/{r["name"]}.yaml').read()
    except OSError:
        adaptive = True
    if not adaptive or r["limit_settle_spike_s"] is None:
        return ["fixed", "fixed"] if not adaptive else ["-", "-"]
    return [f'{r["limit_settle_spike_s"]:.1f} s (at {r["limit_in_spike"]:.0f})',
            f'{r["limit_settle_after_s"]:.1f} s (at {r["limit_after"]:.0f})']


def fmt(value, unit="", digits=1, percent=False):
    if value is None:
        return "-"
    if percent:
        return f"{value * 100:.{digits}f} %"
    return f"{value:.{digits}f}{unit}"


results = []
for name in args.configs:
    try:
        results.append(analyse(name))
    except (OSError, ValueError, KeyError, ZeroDivisionError) as error:
        print(f"{name}: no numbers ({error})")

header = ["configuration", "critical availability", "critical p50 ms", "critical p99 ms", "unloaded p99 ms",
          "p99 / unloaded", "sheddable goodput /s", "goodput / capacity", "upstream utilisation",
          "limit settles after spike start", "limit settles after spike end", "critical availability at spike end"]
rows = []
for r in results:
    rows.append([
        r["name"], fmt(r["critical_availability"], digits=2, percent=True), fmt(r["critical_p50_ms"]),
        fmt(r["critical_p99_ms"]), fmt(r["unloaded_p99_ms"]), fmt(r["p99_ratio"], "x", 2),
        f'{r["sheddable_goodput"]:.0f} of {r["sheddable_offered"]:.0f}', fmt(r["goodput_of_capacity"], percent=True),
        fmt(r["utilisation"], percent=True),
        *settle_cells(r),
        fmt(r["end_window_availability"], digits=2, percent=True),
    ])
lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(row) + " |" for row in rows]
notes = []
for r in results:
    run = r["run"]
    notes.append(f'- {r["name"]}: critical answers from the spike on {dict(sorted(r["critical_statuses"].items()))} '
                 f'(0 = none within {run["timeout_s"]:.0f} s); connections opened {run["connections_opened"]}'
                 + (f'; shed by the proxy: critical {r["shed_critical"] or 0:.0f}, sheddable {r["shed_sheddable"] or 0:.0f}'
                    if r["shed_critical"] is not None or r["shed_sheddable"] is not None else "")
                 + (f'; limit in the spike\'s second half {r["limit_spread_in_spike"][0]:.0f} to {r["limit_spread_in_spike"][1]:.0f}'
                    if r["limit_spread_in_spike"] else ""))

verdicts, failed = [], False
adaptive = next((r for r in results if r["name"] == "adaptive"), None)
if adaptive and not args.short:
    checks = [
        ("critical availability >= 99.5 %", adaptive["critical_availability"], TARGETS["availability"], ">="),
        ("critical p99 <= 2x unloaded p99", adaptive["p99_ratio"], TARGETS["p99_ratio"], "<="),
        ("goodput >= 90 % of capacity", adaptive["goodput_of_capacity"], TARGETS["goodput"], ">="),
        ("no dip in critical availability at the spike's end (>= 99.5 %)", adaptive["end_window_availability"], TARGETS["end_window"], ">="),
    ]
    for label, value, target, op in checks:
        ok = value is not None and (value >= target if op == ">=" else value <= target)
        failed |= not ok
        shown = fmt(value, "x", 2) if "p99" in label else fmt(value, digits=2, percent=True)
        verdicts.append(f'- {"PASS" if ok else "FAIL"}: {label} (measured {shown})')

run0 = results[0]["run"] if results else {}
intro = (f'Upstream: {run0.get("slots")} slots x {run0.get("service_ms")} ms = '
         f'{results[0]["capacity"]:.0f} requests/s capacity; critical {run0.get("critical_rate")}/s throughout, '
         f'sheddable {run0.get("sheddable_rate")}/s in the spike; phases {run0.get("phases")} s.') if results else ""
report = ["# overload scenario", "", intro, "", *lines, "", *notes]
if verdicts:
    report += ["", "Targets for the adaptive row:", *verdicts]
print("\n".join(report[2:]))
open(f"{args.out}/overload.md", "w").write("\n".join(report) + "\n")
with open(f"{args.out}/overload-summary.csv", "w", newline="") as f:
    keys = [k for k in (results[0] if results else {}) if k not in ("run", "requests", "samples", "critical_statuses", "limit_spread_in_spike")]
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    for r in results:
        w.writerow({k: r[k] for k in keys})


def chart(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
    fig, axes = plt.subplots(3, len(results), figsize=(6 * len(results), 11), sharex=True, squeeze=False)
    for col, r in enumerate(results):
        before, spike, after = r["run"]["phases"]
        s = r["samples"]
        t = [x["t"] for x in s]
        top, middle, bottom = axes[0][col], axes[1][col], axes[2][col]
        def line(ax, key, label, color, scale=1.0, style="-", width=1.4, z=2):
            pts = [(x["t"], x[key] * scale) for x in s if x.get(key) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=label, linewidth=width, zorder=z)
        # The limit on top, thicker: in flight sits at it whenever requests wait.
        line(top, "concurrency_limit", "limit (proxy)", "tab:red", width=2.2, z=4)
        line(top, "in_flight", "in flight (proxy)", "tab:blue", width=1.0, z=3)
        line(top, "queued", "queued (proxy)", "tab:orange", width=1.0)
        up_total = [(x["t"], x["up_in_service"] + x["up_queued"]) for x in s if x.get("up_in_service") is not None]
        if up_total:
            top.plot([p[0] for p in up_total], [max(p[1], 0.5) for p in up_total], ":", color="tab:gray",
                     label="at the upstream (serving + queued)", linewidth=1.4)
        top.axhline(r["run"]["slots"], color="black", linewidth=0.8, linestyle="--", label=f'upstream slots ({r["run"]["slots"]})')
        top.set_yscale("log")
        top.set_ylabel("requests (log scale)")
        top.set_title(f'{r["name"]}: concurrency')
        # Latency per 500 ms of scheduled start, answered 200 only.
        bins = {}
        for kind, sched, status, latency, _ in r["requests"]:
            if status == 200:
                bins.setdefault((kind, int(sched * 2)), []).append(latency)
        nan = float("nan")
        for kind, color in (("critical", "tab:green"), ("sheddable", "tab:purple")):
            if not any(k[0] == kind for k in bins):
                continue
            # Every bin of the run, NaN where nothing was answered 200: a gap, not a line across it.
            xs = [i / 2 + 0.25 for i in range(int(2 * (before + spike + after)))]
            for q, style, width in ((0.99, ".-", 1.4), (0.5, "--", 1.0)):
                ys = [percentile(bins[(kind, i)], q) if (kind, i) in bins else nan for i in range(len(xs))]
                middle.plot(xs, ys, style, color=color, label=f"{kind} p{int(q * 100)}", linewidth=width, markersize=3)
        line(middle, "latency_baseline_seconds", "baseline (proxy)", "black", 1000, "-.")
        line(middle, "latency_recent_seconds", "recent (proxy)", "tab:red", 1000, ":")
        if r["unloaded_p99_ms"]:
            middle.axhline(2 * r["unloaded_p99_ms"], color="tab:green", linewidth=0.8, linestyle=":", label="2x unloaded critical p99")
        middle.set_yscale("log")
        middle.set_ylabel("latency, ms (log scale)")
        middle.set_title("latency (200s, by scheduled start, 500 ms bins)")
        # Answers a second by class and outcome, when they were answered.
        per_second = {}
        for kind, sched, status, latency, _ in r["requests"]:
            key = (kind if status == 200 else "failed", int(sched + latency / 1000))
            per_second[key] = per_second.get(key, 0) + 1
        seconds = range(int(before + spike + after) + 6)
        for kind, color in (("critical", "tab:green"), ("sheddable", "tab:purple"), ("failed", "tab:red")):
            bottom.plot([x + 0.5 for x in seconds], [per_second.get((kind, x), 0) for x in seconds], "-", color=color,
                        label=f"{kind} answered 200" if kind != "failed" else "failed (any class)", linewidth=1.4)
        bottom.axhline(r["capacity"], color="black", linewidth=0.8, linestyle="--", label=f'capacity ({r["capacity"]:.0f}/s)')
        bottom.set_ylabel("requests / s")
        bottom.set_xlabel("time since start, s")
        bottom.set_title("answers a second, by the time they were answered")
        for ax in (top, middle, bottom):
            ax.axvspan(before, before + spike, color="tab:orange", alpha=0.08)
            if ax is not bottom:
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "235" else ""))
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("overload scenario: shaded = sheddable spike", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if not args.no_chart and results:
    chart(f"{args.out}/overload.png")
    print(f"\nchart: {args.out}/overload.png   table: {args.out}/overload.md   data: {args.out}/*.csv")
else:
    print(f"\ntable: {args.out}/overload.md   data: {args.out}/*.csv")

problems = [f"{r['name']}: no critical request answered" for r in results if not r["critical_availability"]]
problems += [f"{name}: no numbers" for name in args.configs if name not in {r["name"] for r in results}]
if problems:
    print("loadtest overload: FAILED: " + "; ".join(problems))
    sys.exit(1)
if args.check and failed:
    print("loadtest overload: a target of the adaptive row FAILED")
    sys.exit(1)
