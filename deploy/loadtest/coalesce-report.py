#!/usr/bin/env python3
"""The `coalesce` scenario's numbers, check and chart (coalesce.sh runs it
after its two runs): reads OUT/NAME.{requests.csv,parked.csv,run.json,
upstream.json,metrics.txt} of each run (`plain`: no `coalesce`; `coalesced`:
`coalesce: true`), prints a markdown table, and writes OUT/coalesce.md,
OUT/coalesce.json (the table's numbers, the upstream's arrivals per 100 ms
and each run's latency quantiles) and OUT/coalesce.png (matplotlib;
--no-chart skips it).

Times are on the upstream's clock: 0 is when its port began to listen
(capacity-upstream.py's `started`), the clients' start is -outage.

What each number is:
- upstream requests: requests for /r/* the upstream received (its own count,
  as each arrived, before any wait for a slot), in all, and the most in one
  100 ms.
- the replay: the parked requests are sent when the proxy learns the
  upstream is back: its health checks (every 250 ms) and, when connect
  failures opened the circuit breaker, the breaker's probe once its
  open_for (5 s) has passed, so up to 5 s after the upstream started.
  `replay at` is the first request the upstream received (seconds after it
  started); the recovery burst is what it received in the first second from
  then (the replayed requests: the clients answered by them wait 1 s before
  their next, so none of those is in it), and the next column the first 5 s.
- client requests, errors: every request the clients sent; an error is any
  answer but 200, a timeout or a broken connection (by problem code).
- p50, p99, max: latency of the requests answered 200, from send to the end
  of the answer; "p99 after" only of those sent after the replay began (the
  others waited parked for it).
- peak parked: the most happypath_parked_commands seen (every 250 ms).
- followers: happypath_coalesced_requests_total at the end (requests
  answered from another request's try).

The promise (checked with --short, exit 1 if broken; printed in any case):
the coalesced run has no client error, and its recovery burst is at most
5 x workers (one parked leader per path per worker, 5 paths). The plain
run's burst is only reported: how much larger it is depends on how many
clients were waiting, not on the proxy.
"""
import argparse, bisect, csv, json, re, sys

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--runs", nargs="+", default=["plain", "coalesced"])
parser.add_argument("--workers", type=int, required=True)
parser.add_argument("--short", action="store_true", help="exit 1 if the promise is broken")
parser.add_argument("--no-chart", action="store_true")
args = parser.parse_args()

BIN = 0.1  # seconds, the chart's and the peak's bins


def percentile(values, q):
    """values sorted; the nearest-rank q-quantile."""
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def metric_total(text, name):
    total, seen = 0.0, False
    for m in re.finditer(rf'^{name}(\{{[^}}]*\}})? ([0-9.eE+-]+)$', text, re.M):
        total += float(m.group(2))
        seen = True
    return total if seen else None


def analyse(name):
    run = json.load(open(f"{args.out}/{name}.run.json"))
    upstream = json.load(open(f"{args.out}/{name}.upstream.json"))
    started = upstream["started"]
    outage = started - run["zero"]
    arrivals = sorted(t - started for path, times in upstream["paths"].items() if path.startswith("/r/") for t in times)
    by_path = {path: len(times) for path, times in sorted(upstream["paths"].items()) if path.startswith("/r/")}
    with open(f"{args.out}/{name}.requests.csv") as f:
        requests = [(int(r["client"]), r["path"], float(r["sent_s"]) - outage, int(r["status"]), float(r["latency_ms"]),
                     r["problem_code"]) for r in csv.DictReader(f)]
    with open(f"{args.out}/{name}.parked.csv") as f:
        parked = [(float(r["t"]) - outage, float(r["parked"])) for r in csv.DictReader(f)]
    try:
        metrics = open(f"{args.out}/{name}.metrics.txt").read()
    except OSError:
        metrics = ""
    ok = sorted(r[4] for r in requests if r[3] == 200)
    after_start = [t for t in arrivals if t >= 0]
    replay = after_start[0] if after_start else None
    ok_after = sorted(r[4] for r in requests if r[3] == 200 and replay is not None and r[2] >= replay)
    errors = {}
    for r in requests:
        if r[3] != 200:
            key = f"{r[3]} {r[5]}".strip()
            errors[key] = errors.get(key, 0) + 1
    first = int(-outage // BIN) - 1
    last = int((run["duration_s"] - outage) // BIN) + 30
    bins = {}
    for t in arrivals:
        bins[int(t // BIN)] = bins.get(int(t // BIN), 0) + 1
    series = [[round(i * BIN, 1), bins.get(i, 0)] for i in range(first, max(last, max(bins, default=0) + 1) + 1)]
    count = lambda lo, hi: bisect.bisect_left(arrivals, hi) - bisect.bisect_left(arrivals, lo)
    return {
        "name": name, "clients": run["clients"], "duration_s": run["duration_s"], "outage_s": round(outage, 3),
        "paths": run["paths"], "pause_s": run["pause_s"], "slots": upstream.get("slots"), "service_ms": upstream.get("service_ms"),
        "upstream_total": len(arrivals), "upstream_before_start": count(float("-inf"), 0.0),
        "replay_at_s": None if replay is None else round(replay, 3),
        "burst_1s": 0 if replay is None else count(replay, replay + 1.0),
        "first_5s": 0 if replay is None else count(replay, replay + 5.0),
        "after_start_1s": count(0.0, 1.0), "after_start_5s": count(0.0, 5.0),
        "peak_per_100ms": max(bins.values(), default=0),
        "upstream_by_path": by_path,
        "client_requests": len(requests), "answered_200": len(ok), "client_errors": len(requests) - len(ok),
        "errors": dict(sorted(errors.items())),
        "p50_ms": percentile(ok, 0.5), "p99_ms": percentile(ok, 0.99), "max_ms": ok[-1] if ok else None,
        "p50_after_ms": percentile(ok_after, 0.5), "p99_after_ms": percentile(ok_after, 0.99),
        "peak_parked": max((p for _, p in parked), default=None),
        "followers": metric_total(metrics, "happypath_coalesced_requests_total"),
        "replayed": metric_total(metrics, "happypath_replayed_commands_total"),
        "upstream_tries": metric_total(metrics, "happypath_upstream_tries_total"),
        "handovers": metric_total(metrics, "happypath_coalesce_handovers_total"),
        "connections_opened": run["connections_opened"],
        "arrivals_per_100ms": series,
        "latency_quantiles_ms": {str(q): percentile(ok, q) for q in (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0)},
        "_parked": parked, "_latencies": ok,
    }


def n(value):
    """A count for people: 1,995."""
    return "-" if value is None else f"{value:,.0f}"


def ms(value):
    return "-" if value is None else (f"{value:,.0f}" if value >= 100 else f"{value:.1f}")


results = []
for name in args.runs:
    try:
        results.append(analyse(name))
    except (OSError, ValueError, KeyError) as error:
        print(f"{name}: no numbers ({error})")

paths = results[0]["paths"] if results else 5
bound = paths * args.workers
header = ["run", "upstream requests", "replay at s", "recovery burst (its first 1 s)", "its first 5 s", "most in 100 ms",
          "client requests", "errors", "p50 ms", "p99 ms", "max ms", "p99 ms sent after the replay", "peak parked",
          "followers"]
rows = [[r["name"], n(r["upstream_total"]), "-" if r["replay_at_s"] is None else f'{r["replay_at_s"]:.2f}',
         n(r["burst_1s"]), n(r["first_5s"]), n(r["peak_per_100ms"]),
         n(r["client_requests"]), n(r["client_errors"]), ms(r["p50_ms"]), ms(r["p99_ms"]), ms(r["max_ms"]),
         ms(r["p99_after_ms"]), n(r["peak_parked"]), n(r["followers"])] for r in results]
table = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)] + ["| " + " | ".join(row) + " |" for row in rows]
r0 = results[0] if results else None
intro = (f'{r0["clients"]:,} clients on /r/1 .. /r/{r0["paths"]}, each on its own connection, {r0["pause_s"]:g} s between '
         f'an answer and the next request, for {r0["duration_s"]:g} s; the upstream ({r0["slots"]} slots x '
         f'{r0["service_ms"]:g} ms) closed for the first {r0["outage_s"]:.1f} s; {args.workers} workers.') if r0 else ""
notes = []
for r in results:
    notes.append(f'- {r["name"]}: upstream by path {r["upstream_by_path"]}; errors {r["errors"] or "none"}; '
                 f'p50 sent after the replay {ms(r["p50_after_ms"])} ms; in the upstream\'s first 1 s / 5 s '
                 f'{n(r["after_start_1s"])} / {n(r["after_start_5s"])}; replayed {n(r["replayed"])}, '
                 f'upstream tries (proxy) {n(r["upstream_tries"])}, handovers {n(r["handovers"])}, '
                 f'client connections opened {n(r["connections_opened"])}')

by_name = {r["name"]: r for r in results}
coalesced, plain = by_name.get("coalesced"), by_name.get("plain")
problems, verdicts = [], []
if coalesced is None:
    problems.append("the coalesced run has no numbers")
else:
    if not coalesced["answered_200"]:
        problems.append("the coalesced run answered no request")
    if coalesced["client_errors"]:
        problems.append(f'{coalesced["client_errors"]:,} client errors in the coalesced run {coalesced["errors"]}')
    if not coalesced["upstream_total"]:
        problems.append("the upstream received nothing in the coalesced run")
    if coalesced["replay_at_s"] is None:
        problems.append("nothing reached the upstream after it started in the coalesced run")
    if coalesced["burst_1s"] > bound:
        problems.append(f'the coalesced recovery burst was {coalesced["burst_1s"]:,} (bound {bound:,})')
    verdicts.append(f'recovery burst with coalescing (requests at the upstream in the replay\'s first second): '
                    f'{coalesced["burst_1s"]:,}, bound {paths} paths x {args.workers} workers = {bound:,}')
    verdicts.append(f'client errors with coalescing: {coalesced["client_errors"]:,} of {coalesced["client_requests"]:,}')
    if plain is not None:
        times = plain["burst_1s"] / max(coalesced["burst_1s"], 1)
        verdicts.append(f'recovery burst without coalescing: {plain["burst_1s"]:,} ({times:,.0f}x; reported, not checked)')

report = ["# coalesce scenario", "", intro, "", *table, "", *notes, "", *[f"- {v}" for v in verdicts]]
print("\n".join(report[2:]))
open(f"{args.out}/coalesce.md", "w").write("\n".join(report) + "\n")
json.dump({"workers": args.workers, "bound": bound, "problems": problems,
           "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]},
          open(f"{args.out}/coalesce.json", "w"), indent=1)


def chart(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"plain": "tab:red", "coalesced": "tab:blue"}
    fig, ((timeline, zoom), (cdf, lot)) = plt.subplots(2, 2, figsize=(13, 9))
    for r in results:
        color = colors.get(r["name"], None)
        xs = [t for t, _ in r["arrivals_per_100ms"]]
        ys = [c for _, c in r["arrivals_per_100ms"]]
        for ax in (timeline, zoom):
            ax.step(xs, ys, where="post", color=color, linewidth=1.2,
                    label=f'{r["name"]}: {r["upstream_total"]:,} in all, {r["burst_1s"]:,} in the replay\'s first second')
        if r["_latencies"]:
            lat = r["_latencies"]
            cdf.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], color=color, linewidth=1.4,
                     label=f'{r["name"]}: p50 {ms(r["p50_ms"])} ms, p99 {ms(r["p99_ms"])} ms, {r["client_errors"]:,} errors')
        if r["_parked"]:
            lot.plot([t for t, _ in r["_parked"]], [max(p, 0.5) for _, p in r["_parked"]], color=color, linewidth=1.4,
                     label=f'{r["name"]}: at most {n(r["peak_parked"])}')
    outage = r0["outage_s"] if r0 else 0
    for ax in (timeline, zoom, lot):
        ax.axvspan(-outage, 0, color="tab:gray", alpha=0.12)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel("time since the upstream started, s (shaded: its outage)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    for ax in (timeline, zoom):
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("requests reaching the upstream per 100 ms (log scale)")
    timeline.set_title("upstream requests per 100 ms, the whole run")
    replays = [r["replay_at_s"] for r in results if r["replay_at_s"] is not None]
    if replays:
        zoom.set_xlim(min(replays) - 0.5, max(replays) + 2.5)
        for r in results:
            if r["replay_at_s"] is not None:
                zoom.axvspan(r["replay_at_s"], r["replay_at_s"] + 1, color=colors.get(r["name"], "tab:green"), alpha=0.06)
    zoom.set_title(f"the recovery burst (shaded: the replay's first second;\n"
                   f"checked with coalescing: at most {paths} paths x {args.workers} workers = {bound:,} in it)", fontsize=10)
    cdf.set_xscale("log")
    cdf.set_xlabel("latency, ms (log scale), requests answered 200")
    cdf.set_ylabel("share of requests answered within")
    cdf.set_title("client latency distribution")
    cdf.grid(True, alpha=0.3, which="both")
    cdf.legend(fontsize=8, loc="lower right")
    lot.set_yscale("log")
    lot.set_ylabel("parked commands (proxy, log scale)")
    lot.set_title("parked commands: with coalescing only the leaders park")
    fig.suptitle(intro, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if not args.no_chart and results:
    chart(f"{args.out}/coalesce.png")
    print(f"\nchart: {args.out}/coalesce.png   table: {args.out}/coalesce.md   data: {args.out}/coalesce.json")
else:
    print(f"\ntable: {args.out}/coalesce.md   data: {args.out}/coalesce.json")

missing = [name for name in args.runs if name not in by_name]
if missing:
    problems.append("no numbers for " + ", ".join(missing))
if problems:
    if args.short:
        print("loadtest coalesce: FAILED: " + "; ".join(problems))
        sys.exit(1)
    print("loadtest coalesce: promise NOT kept: " + "; ".join(problems))
else:
    print("loadtest coalesce: promise kept")
