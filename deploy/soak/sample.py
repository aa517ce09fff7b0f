#!/usr/bin/env python3
"""The soak test's sampler and judge (standard library only).

  sample.py sample PID ADMIN SECONDS OUT   one row a second into OUT/samples.csv
  sample.py verdict OUT                    checks the run, writes OUT/soak.svg, exit 1 if it failed

A row: seconds since start, the proxy's resident memory (KiB) and open
descriptors (/proc), parked and in-flight requests (/admin/state), and the
answers it gave in that second: all, and errors (any code but OK, leaving
out CLIENT_CLOSED: a client that hung up saw nothing). After SECONDS the
sampler goes on until nothing is in flight or parked (at most 60 s more):
every request the proxy took must get its answer.
"""
import csv, json, os, re, sys, time, urllib.request

FIELDS = ["t", "rss_kib", "fds", "parked", "in_flight", "answered", "errors", "error_codes"]
LINE = re.compile(r'^happypath_requests_total\{([^}]*)\} ([0-9.eE+-]+)$')


def get(url):
    try:
        return urllib.request.urlopen(url, timeout=2).read().decode()
    except Exception:
        return None


def answers(admin):
    """Requests answered so far, by code."""
    text = get(f"http://{admin}/metrics") or ""
    codes = {}
    for line in text.splitlines():
        m = LINE.match(line)
        # The hostile clients' own answers (hostile.py, the /hostile/ route) are theirs, not the soak's.
        if m and 'route="/hostile/"' not in m.group(1):
            code = re.search(r'code="([^"]+)"', m.group(1)).group(1)
            codes[code] = codes.get(code, 0) + float(m.group(2))
    return codes


def upstream_sockets(port):
    """Socket inodes of connections to 127.0.0.1:port (/proc/net/tcp)."""
    inodes = set()
    try:
        for line in open("/proc/net/tcp").readlines()[1:]:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == port:
                inodes.add(fields[9])
    except (OSError, IndexError, ValueError):
        pass
    return inodes


def proc(pid, upstream_port=None):
    rss = 0
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
        # Spool files (answers read ahead of slow clients: files without a
        # name, "(deleted)") come and go with those clients. With hostile
        # clients, so do the upstream connections libcurl keeps after their
        # bursts of streams (its cache, emptied by an outage): both are
        # left out of the count, which then holds the proxy's own and its
        # clients' descriptors.
        skip = upstream_sockets(upstream_port) if upstream_port else set()
        fds = 0
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.endswith("(deleted)") or (link.startswith("socket:[") and link[8:-1] in skip):
                continue
            fds += 1
    except OSError:
        return None, None
    return rss, fds


def sample(pid, admin, seconds, out, upstream_port=None):
    seconds = float(seconds)
    upstream_port = int(upstream_port) if upstream_port else None
    start = time.time()
    previous = answers(admin)
    with open(f"{out}/samples.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        tick = 0
        while True:
            tick += 1
            time.sleep(max(0, start + tick - time.time()))
            t = time.time() - start
            rss, fds = proc(pid, upstream_port)
            state = json.loads(get(f"http://{admin}/admin/state") or "{}")
            codes = answers(admin)
            delta = {c: codes.get(c, 0) - previous.get(c, 0) for c in codes}
            previous = codes or previous
            errors = {c: int(n) for c, n in delta.items() if c not in ("OK", "CLIENT_CLOSED") and n > 0}
            w.writerow([round(t, 1), rss, fds, state.get("parked", ""), state.get("in_flight", ""),
                        int(sum(delta.values())), sum(errors.values()), json.dumps(errors)])
            f.flush()
            if t >= seconds and (t >= seconds + 60 or (state.get("in_flight") == 0 and state.get("parked") == 0)):
                open(f"{out}/metrics-at-end.txt", "w").write(get(f"http://{admin}/metrics") or "")
                return


def chart(rows, windows, seconds, path):
    """Four panels over time (outages shaded): memory, descriptors, parked and in flight, errors a second."""
    width, height, left, panel_h, gap = 900, 560, 70, 110, 30
    xs = lambda t: left + (width - left - 20) * t / max(seconds, 1)
    panels = [("resident memory (MiB)", [r["rss_kib"] / 1024 for r in rows], "#1f77b4"),
              ("open descriptors", [r["fds"] for r in rows], "#2ca02c"),
              ("parked / in flight", [r["parked"] for r in rows], "#ff7f0e"),
              ("errors a second", [r["errors"] for r in rows], "#d62728")]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for i, (title, values, color) in enumerate(panels):
        top = 20 + i * (panel_h + gap)
        extra = [r["in_flight"] for r in rows] if i == 2 else []
        peak = max(values + extra + [1])
        ys = lambda v: top + panel_h - panel_h * v / peak
        for a, b in windows:
            svg.append(f'<rect x="{xs(a):.1f}" y="{top}" width="{max(1, xs(b) - xs(a)):.1f}" height="{panel_h}" fill="#eee"/>')
        svg.append(f'<text x="{left}" y="{top - 5}">{title} (max {peak:g})</text>')
        svg.append(f'<line x1="{left}" y1="{top + panel_h}" x2="{width - 20}" y2="{top + panel_h}" stroke="#999"/>')
        for series, c in [(values, color)] + ([(extra, "#9467bd")] if extra else []):
            points = " ".join(f"{xs(r['t']):.1f},{ys(v):.1f}" for r, v in zip(rows, series))
            svg.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{points}"/>')
    svg.append(f'<text x="{left}" y="{height - 5}">seconds (0 to {seconds:g}); grey: upstream down; purple: in flight</text>')
    svg.append("</svg>")
    open(path, "w").write("\n".join(svg))


def verdict(out):
    rows = []
    for r in csv.DictReader(open(f"{out}/samples.csv")):
        rows.append({k: (json.loads(v) if k == "error_codes" else float(v) if v not in ("", "None") else 0.0) for k, v in r.items()})
    events = [line.split() for line in open(f"{out}/events.txt") if line.strip()]
    starts = [float(t) for t, e in events if e == "outage_start"]
    ends = [float(t) for t, e in events if e == "outage_end"]
    # An outage's errors may surface until its parked requests time out
    # (park_for 25 s): they count as the outage's.
    windows = [(a, b + 26) for a, b in zip(starts, ends)]
    reloads = sum(1 for _, e in events if e == "reload")
    wrk = {}
    for line in open(f"{out}/wrk.txt"):
        if line.startswith("WRK_JSON "):
            wrk = json.loads(line[len("WRK_JSON "):])
    seconds = wrk.get("duration_s", rows[-1]["t"] if rows else 0)
    inside = lambda t: any(a <= t <= b for a, b in windows)
    outside_errors = [(r["t"], r["error_codes"]) for r in rows if r["errors"] and not inside(r["t"])]
    during_errors = sum(r["errors"] for r in rows if inside(r["t"]))
    # Under full load: wrk's connections close in its last second.
    loaded = [r for r in rows if r["t"] <= seconds - 2]
    warm_at = max(10.0, 0.1 * seconds)
    warm = next((r for r in loaded if r["t"] >= warm_at), loaded[0] if loaded else None)
    end = loaded[-1] if loaded else None
    final = rows[-1] if rows else None
    problems = []
    if not wrk.get("requests"):
        problems.append("no requests completed")
    if wrk.get("socket_errors", 0):
        problems.append(f'{wrk["socket_errors"]} client connections failed or timed out (an answer never came)')
    if outside_errors:
        problems.append(f"{sum(sum(c.values()) for _, c in outside_errors)} client-visible errors outside the outages: {outside_errors[:5]}")
    if final and (final["in_flight"] or final["parked"]):
        problems.append(f'requests never answered: {int(final["in_flight"])} in flight, {int(final["parked"])} parked at the end')
    if warm and end:
        if end["rss_kib"] > 1.1 * warm["rss_kib"]:
            problems.append(f'memory grew from {warm["rss_kib"] / 1024:.1f} to {end["rss_kib"] / 1024:.1f} MiB (over 10%)')
        if abs(end["fds"] - warm["fds"]) > 0.1 * warm["fds"]:
            problems.append(f'descriptors went from {int(warm["fds"])} to {int(end["fds"])} (over 10%)')
    chart(rows, [(a, b) for a, b in zip(starts, ends)], max(r["t"] for r in rows) if rows else 1, f"{out}/soak.svg")
    metrics = open(f"{out}/metrics-at-end.txt").read() if os.path.exists(f"{out}/metrics-at-end.txt") else ""
    count = lambda name: int(sum(float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines() if l.startswith(name)))
    summary = {
        "seconds": seconds, "requests": wrk.get("requests"), "rps": wrk.get("rps"), "p99_ms": wrk.get("p99_ms"),
        "client_non_2xx": wrk.get("non_2xx_3xx"), "outages": len(starts), "reloads": reloads,
        "errors_during_outages": int(during_errors), "errors_outside_outages": len(outside_errors),
        "peak_parked": int(max((r["parked"] for r in rows), default=0)),
        "replayed": count("happypath_replayed_commands_total"), "token_refreshes": count("happypath_token_refreshes_total"),
        "rss_mib_after_warmup": warm and round(warm["rss_kib"] / 1024, 1), "rss_mib_at_end": end and round(end["rss_kib"] / 1024, 1),
        "fds_after_warmup": warm and int(warm["fds"]), "fds_at_end": end and int(end["fds"]),
        "passed": not problems, "problems": problems,
    }
    json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
    for k, v in summary.items():
        if k != "problems":
            print(f"   {k:24} {v}")
    print(f"   samples: {out}/samples.csv  chart: {out}/soak.svg")
    if problems:
        print("soak: FAILED: " + "; ".join(problems))
        return 1
    print("soak: passed")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "sample":
        sample(*sys.argv[2:7])
    else:
        sys.exit(verdict(sys.argv[2]))
