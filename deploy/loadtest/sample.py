#!/usr/bin/env python3
"""Samples the proxy's /metrics every 250 ms while a scenario runs, then
prints the scenario's table and writes an SVG chart of latency, requests and
errors over time. Standard library only."""
import json, re, sys, time, urllib.request

admin, out_prefix, seconds, wrk_json_file = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
LINE = re.compile(r'^([a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$')

def scrape():
    try:
        text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=1).read().decode()
    except Exception:
        return None
    series = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            series[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return series

def total(series, name, label_filter=""):
    return sum(v for (n, labels), v in series.items() if n == name and label_filter in labels)

def quantile(buckets, q):
    """Upper bound of the bucket holding quantile q, from cumulative counts."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    target = q * buckets[-1][1]
    for le, count in buckets:
        if count >= target:
            return le
    return buckets[-1][0]

def bucket_deltas(prev, cur):
    out = {}
    for (n, labels), v in cur.items():
        if n == "happypath_request_duration_seconds_bucket":
            le = re.search(r'le="([^"]+)"', labels).group(1)
            le = float("inf") if le == "+Inf" else float(le)
            out[le] = out.get(le, 0) + v - (prev.get((n, labels), 0) if prev else 0)
    return sorted(out.items())

samples, prev, start = [], scrape() or {}, time.time()
first = prev
peak_parked, breaker_seen = 0, 0
while time.time() - start < seconds:
    time.sleep(0.25)
    cur = scrape()
    if cur is None:
        continue
    t = time.time() - start
    d = lambda name, f="": total(cur, name, f) - total(prev, name, f)
    buckets = bucket_deltas(prev, cur)
    parked = total(cur, "happypath_parked_commands")
    peak_parked = max(peak_parked, parked)
    breaker_seen = max(breaker_seen, total(cur, "happypath_circuit_state"))
    samples.append({
        "t": t, "rps": d("happypath_requests_total") / 0.25,
        "errors": (d("happypath_requests_total") - d("happypath_requests_total", 'code="OK"')) / 0.25,
        "p50": quantile(buckets, 0.5), "p99": quantile(buckets, 0.99), "parked": parked,
    })
    prev = cur
last = prev

wrk = {}
for line in open(wrk_json_file):
    if line.startswith("WRK_JSON "):
        wrk = json.loads(line[len("WRK_JSON "):])
tries = total(last, "happypath_upstream_tries_total") - total(first, "happypath_upstream_tries_total")
retries = total(last, "happypath_retries_total") - total(first, "happypath_retries_total")
client_errors = wrk.get("non_2xx_3xx", 0) + wrk.get("socket_errors", 0)
replayed = None
result = {
    "requests": wrk.get("requests"), "rps": wrk.get("rps"), "p50_ms": wrk.get("p50_ms"), "p95_ms": wrk.get("p95_ms"),
    "p99_ms": wrk.get("p99_ms"), "client_errors": client_errors, "upstream_tries": int(tries), "retries": int(retries),
    "peak_parked": int(peak_parked), "breaker_opened": breaker_seen >= 2,
    "replayed": int(total(last, "happypath_replayed_commands_total") - total(first, "happypath_replayed_commands_total")),
    "token_refreshes": int(total(last, "happypath_token_refreshes_total") - total(first, "happypath_token_refreshes_total")),
    "error_codes": {re.search(r'code="([^"]+)"', labels).group(1): int(v - first.get((n, labels), 0))
                    for (n, labels), v in last.items()
                    if n == "happypath_requests_total" and 'code="OK"' not in labels and v - first.get((n, labels), 0) > 0},
}
rows = [("requests/s", f'{result["rps"]:.0f}' if result["rps"] else "-"),
        ("p50 / p95 / p99 ms", f'{result["p50_ms"]} / {result["p95_ms"]} / {result["p99_ms"]}'),
        ("client-visible errors", str(client_errors) + (f' {result["error_codes"]}' if result["error_codes"] else "")), ("upstream tries", str(result["upstream_tries"])),
        ("retries", str(result["retries"])), ("peak parked commands", str(result["peak_parked"])),
        ("replayed commands", str(result["replayed"])),
        ("breaker opened", "yes" if result["breaker_opened"] else "no"), ("token refreshes", str(result["token_refreshes"]))]
width = max(len(r[0]) for r in rows)
print("| metric | value |\n|---|---:|")
for k, v in rows:
    print(f"| {k.ljust(width)} | {v} |")
json.dump({"result": result, "samples": samples}, open(out_prefix + ".json", "w"))

# ---- SVG: latency (p50/p99, ms, log scale) above, requests and errors per second below
W, H, PAD = 960, 520, 60
ts = [s["t"] for s in samples] or [0, 1]
tmax = max(ts[-1], 1)
def x(t): return PAD + (W - 2 * PAD) * t / tmax
def panel(y0, h, series, color, ymax, label, slot, log=False):
    """One line per run of consecutive samples that have a value (an interval
    with no finished request leaves a gap instead of a misleading line)."""
    import math
    runs, pts = [], []
    for s in samples:
        v = s.get(series)
        if v is None or v != v or v == float("inf"):
            if pts: runs.append(pts)
            pts = []
            continue
        v = v * 1000 if log else v
        if log:
            y = y0 + h - h * (math.log10(max(v, 0.1)) + 1) / (math.log10(max(ymax, 1)) + 1)
        else:
            y = y0 + h - h * min(v, ymax) / ymax
        pts.append(f"{x(s['t']):.1f},{y:.1f}")
    if pts: runs.append(pts)
    lines = "".join(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(r)}"/>' for r in runs)
    return lines + f'<text x="{W - PAD + 5}" y="{y0 + 15 + 16 * slot}" fill="{color}" font-size="12">{label}</text>'
lat_max = max([s["p99"] * 1000 for s in samples if s.get("p99") not in (None, float("inf"))] or [10])
rps_max = max([s["rps"] for s in samples] + [1])
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{PAD}" y="25" font-size="16">{out_prefix.split("/")[-1]}: latency (top, ms, log scale) and requests / errors per second (bottom)</text>',
       f'<rect x="{PAD}" y="40" width="{W - 2 * PAD}" height="200" fill="none" stroke="#ccc"/>',
       f'<rect x="{PAD}" y="280" width="{W - 2 * PAD}" height="200" fill="none" stroke="#ccc"/>',
       panel(40, 200, "p50", "#1f77b4", lat_max, "p50", 0, log=True), panel(40, 200, "p99", "#d62728", lat_max, "p99", 1, log=True),
       panel(280, 200, "rps", "#2ca02c", rps_max, "req/s", 0), panel(280, 200, "errors", "#ff7f0e", rps_max, "errors/s", 1),
       f'<text x="{PAD}" y="{H - 15}" font-size="12">0 s</text><text x="{W - PAD - 30}" y="{H - 15}" font-size="12">{tmax:.0f} s</text>',
       f'<text x="{PAD + 5}" y="55" font-size="11" fill="#666">max {lat_max:.1f} ms</text>',
       f'<text x="{PAD + 5}" y="295" font-size="11" fill="#666">max {rps_max:.0f}/s</text>', '</svg>']
open(out_prefix + ".svg", "w").write("\n".join(svg))
print(f"chart: {out_prefix}.svg   data: {out_prefix}.json")
