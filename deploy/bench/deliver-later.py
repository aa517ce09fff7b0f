#!/usr/bin/env python3
"""The accept path of deliver later (deploy/bench/deliver-later.sh).

For each storage.sync (full, then normal), upstream state and connection
count: a fresh store, the proxy (default workers, log level warning) with one
`delivery: { mode: later }` route, `wrk -t1` POSTing a 200-byte JSON body
(deliver-later.lua) for a 2 s warm-up and then DURATION.

- upstream **down**: nothing listens on the upstream's port; the cell starts
  once the health checks (every 250 ms) have marked it unreachable, so no
  delivery round is ever started: only the accept path runs (parse, store
  with group commit, 202) -- and, on the store's writer thread, the
  dispatcher's claims, which find nothing to take (see the backlog below).
- upstream **stuck**: the demo upstream, healthy, but every round waits 60 s
  (`/slow`, one try, timeout 90 s): the 64 rounds the dispatcher allows are
  in flight after the warm-up and it claims nothing more. The accept path
  alone, without the dispatcher's claims.
- upstream **up**: the demo upstream; accepting and delivering run together
  (each delivery is a claim, an upstream request and a finish in the store).

Per cell: requests/s and client p50/p99 (wrk), the store's write latency
(enqueue -> durable commit) p50/p99 from the histogram
happypath_delivery_store_write_seconds on /metrics (bucketed: the upper bound
of the bucket the quantile falls in), fsync/fdatasync calls of the proxy
(`perf stat` on the syscall tracepoints, if perf can attach), deliveries
completed during the run and the backlog left, and CPU in cores of the proxy
(and its busiest threads), wrk, the demo upstream and everything else on the
machine (from /proc, like pidstat).

Then the backlog (BACKLOG, default 50,000; 0 skips it): upstream down, sync
full, wrk -c64 in WINDOW (5 s) windows on one store until BACKLOG requests
are queued, each window's requests/s and the store writer thread's CPU; the
proxy's CPU while idle with that backlog; then the demo upstream starts and
deliveries/s are sampled every 5 s while it drains (DRAIN_LIMIT, 120 s). The bar: >= BAR requests/s on every
sync: full row (printed PASS/FAIL; STRICT=1 exits 1 on FAIL). Standard library only."""
import json, os, re, shutil, signal, subprocess, sys, time, urllib.request

BIN = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
DURATION = os.environ.get("DURATION", "10s")
CONNS = [int(c) for c in os.environ.get("CONNS", "64 256").split()]
SYNCS = os.environ.get("SYNCS", "full normal").split()
UPSTREAMS = os.environ.get("UPSTREAMS", "down stuck up").split()
BAR = float(os.environ.get("BAR", "5000"))
WARMUP = os.environ.get("WARMUP", "2s")
base = int(os.environ.get("PORT_BASE", "19620"))
UP, PX, ADMIN = base, base + 1, base + 2
OUT = os.environ.get("OUT", "/tmp/happypath-bench-deliver-later")
STORE_DIR = os.environ.get("STORE_DIR", "/var/tmp/happypath-bench-deliver-later")
os.makedirs(OUT, exist_ok=True)
os.makedirs(STORE_DIR, exist_ok=True)
STORE = f"{STORE_DIR}/deliveries.db"
TICK = os.sysconf("SC_CLK_TCK")
children = []


def seconds(d):
    return float(d[:-2]) / 1000 if d.endswith("ms") else float(d.rstrip("s"))


def http(port, path, timeout=2):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.read().decode()


def wait_ok(port, path, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if http(port, path)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    stop_all()
    sys.exit(f"bench deliver-later: no answer from :{port}{path} (logs in {OUT})")


def wait_for_state(check, what, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        if check(json.loads(http(ADMIN, "/admin/state", timeout=30)[1])):
            return
        time.sleep(0.05)
    stop_all()
    sys.exit(f"bench deliver-later: not seen within {timeout} s: {what}")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_all():
    for c in children:
        stop(c)


def metrics():
    """name{labels} -> value, of the lines this benchmark reads."""
    out = {}
    for line in http(ADMIN, "/metrics")[1].splitlines():
        if line.startswith(("happypath_delivery_store_write_seconds", "happypath_deliveries_total")):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def write_quantiles(before, after, qs):
    """Quantiles of the store's write latency over the run, from the histogram's
    cumulative buckets: the upper bound (seconds) of the bucket each falls in."""
    buckets = []
    for key, value in after.items():
        m = re.match(r'happypath_delivery_store_write_seconds_bucket\{.*le="([^"]+)"', key)
        if m:
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            buckets.append((le, value - before.get(key, 0)))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    result = []
    for q in qs:
        result.append(next((le for le, n in buckets if total > 0 and n >= q * total), None))
    return result, total


def counter(m, outcome):
    return sum(v for k, v in m.items() if k.startswith("happypath_deliveries_total") and f'outcome="{outcome}"' in k)


def proc_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except OSError:
        return 0


def thread_ticks(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[(tid, comm)] = int(fields[11]) + int(fields[12])
    return out


def machine_ticks():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq


def config(sync, mode="down"):
    path = f"{OUT}/deliver-later-{sync}-{mode}.yaml"
    # stuck: every round waits a minute for the upstream (one try), so the 64 rounds the
    # dispatcher allows are all in flight and it claims nothing more.
    stuck = "\n    timeout: 90s\n    retry: { attempts: 1, per_try_timeout: 90s }" if mode == "stuck" else ""
    with open(path, "w") as f:
        f.write(f"""listen: 127.0.0.1:{PX}
admin: {{ listen: 127.0.0.1:{ADMIN} }}
drain_timeout: 1s
storage: {{ path: {STORE}, sync: {sync} }}
upstreams:
  hooks:
    endpoints: [http://127.0.0.1:{UP}]
    max_connections: 256
    health_check: {{ interval: 250ms, timeout: 200ms }}
routes:
  - match: {{ path_prefix: /hooks/ }}
    upstream: hooks
    strip_prefix: /hooks{stuck}
    delivery: {{ mode: later, backoff: {{ base: 100ms, max: 1s }} }}
""")
    return path


def wrk(conns, duration, out, path="/hooks/ok"):
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{duration}", "--timeout", "10s", "-s", f"{HERE}/deliver-later.lua",
           f"http://127.0.0.1:{PX}{path}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    with open(out, "w") as f:
        f.write(r.stdout + r.stderr)
    line = next((l for l in r.stdout.splitlines() if l.startswith("WRK_JSON ")), None)
    if line is None:
        stop_all()
        sys.exit(f"bench deliver-later: wrk printed no summary ({out})")
    return json.loads(line[9:])


def fs_type(path):
    r = subprocess.run(["df", "-T", path], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    return lines[1].split()[1] if len(lines) > 1 else "?"


perf = shutil.which("perf")
fstype = fs_type(STORE_DIR)
print(f"== deliver later, the accept path: wrk -t1 POST 200-byte JSON, {WARMUP} warm-up + {DURATION} per cell; "
      f"store {STORE} ({fstype}); {os.cpu_count()} CPUs; {os.uname().release}", flush=True)
if fstype in ("tmpfs", "ramfs"):
    print(f"   WARNING: the store is on {fstype}: fsync costs nothing there; set STORE_DIR to a disk", flush=True)

rows = []
for sync in SYNCS:
    for upstream in UPSTREAMS:
        cfg = config(sync, upstream)
        path = "/hooks/slow?ms=60000" if upstream == "stuck" else "/hooks/ok"
        for conns in CONNS:
            name = f"{sync}-{upstream}-c{conns}"
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(STORE + suffix):
                    os.remove(STORE + suffix)
            demo = None
            if upstream in ("up", "stuck"):
                demo = subprocess.Popen([BIN, "demo-upstream", "--listen", f"127.0.0.1:{UP}"],
                                        stdout=subprocess.DEVNULL, stderr=open(f"{OUT}/{name}.demo.log", "w"))
                children.append(demo)
                wait_ok(UP, "/healthz")
            proxy = subprocess.Popen([BIN, "serve", "--config", cfg, "--log-level", "warning"],
                                     stdout=subprocess.DEVNULL, stderr=open(f"{OUT}/{name}.proxy.log", "w"))
            children.append(proxy)
            wait_ok(ADMIN, "/readyz")
            if upstream == "down":  # no round is started once the health checks know it is down
                wait_for_state(lambda st: not st["upstreams"][0]["reachable"], "the upstream marked unreachable")
            wrk(conns, WARMUP, f"{OUT}/{name}.warmup.txt", path)
            if upstream == "stuck":
                wait_for_state(lambda st: st["deliveries"]["rounds_in_flight"] >= 64, "64 rounds in flight")

            m0, t0, th0 = metrics(), time.time(), thread_ticks(proxy.pid)
            p0, d0, all0, self0 = proc_ticks(proxy.pid), proc_ticks(demo.pid) if demo else 0, machine_ticks(), os.times()
            perf_proc = None
            if perf:
                perf_proc = subprocess.Popen(
                    [perf, "stat", "--per-thread", "-x,", "-o", f"{OUT}/{name}.perf.txt", "-e",
                     "syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync", "-p", str(proxy.pid), "--",
                     "sleep", str(seconds(DURATION))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            w = wrk(conns, DURATION, f"{OUT}/{name}.wrk.txt", path)
            m1, t1, th1 = metrics(), time.time(), thread_ticks(proxy.pid)
            p1, d1, all1, self1 = proc_ticks(proxy.pid), proc_ticks(demo.pid) if demo else 0, machine_ticks(), os.times()
            state = json.loads(http(ADMIN, "/admin/state", timeout=30)[1])["deliveries"]
            fsyncs, syncing = None, {}  # syncing: thread id -> its fsync calls (the store's writer thread)
            if perf_proc:
                perf_proc.wait()
                try:
                    for line in open(f"{OUT}/{name}.perf.txt"):
                        c = line.split(",")
                        if len(c) > 3 and c[3].startswith("syscalls:") and c[1].isdigit():
                            tid = c[0].rsplit("-", 1)[-1]
                            syncing[tid] = syncing.get(tid, 0) + int(c[1])
                    fsyncs = sum(syncing.values())
                except OSError:
                    pass
            writer_tid = max(syncing, key=syncing.get) if syncing and max(syncing.values()) > 0 else None
            stop(proxy)
            if demo:
                stop(demo)

            wall = t1 - t0
            (p50, p99), writes = write_quantiles(m0, m1, [0.5, 0.99])
            wrk_cpu = (self1.children_user + self1.children_system) - (self0.children_user + self0.children_system)
            proxy_cpu = (p1 - p0) / TICK
            demo_cpu = (d1 - d0) / TICK
            foreign = max(0.0, (all1 - all0) / TICK - proxy_cpu - demo_cpu - wrk_cpu)
            def label(tid, comm):
                return "store writer" if tid == writer_tid else f"{comm}/{tid}"
            threads = sorted(((th1.get(k, 0) - th0.get(k, 0)) / TICK / wall, label(*k)) for k in th1)[::-1]
            rows.append({
                "sync": sync, "upstream": upstream, "conns": conns, "rps": w["rps"], "p50_ms": w["p50_ms"],
                "p99_ms": w["p99_ms"], "errors": w["non_2xx_3xx"] + w["socket_errors"], "requests": w["requests"],
                "writes": writes, "write_p50_ms": p50 * 1000 if p50 not in (None, float("inf")) else p50,
                "write_p99_ms": p99 * 1000 if p99 not in (None, float("inf")) else p99,
                "fsyncs_per_s": fsyncs / wall if fsyncs is not None else None,
                "per_fsync": w["requests"] / fsyncs if fsyncs else None,
                "delivered_per_s": (counter(m1, "delivered") - counter(m0, "delivered")) / wall,
                "backlog": state["queued"] + state["in_flight"], "rounds": state["rounds_in_flight"],
                "cpu_proxy": proxy_cpu / wall, "cpu_wrk": wrk_cpu / wall, "cpu_demo": demo_cpu / wall,
                "cpu_foreign": foreign / wall,
                "threads": [(round(c, 2), n) for c, n in threads[:4] if c >= 0.01],
                "body_bytes": w["body_bytes"],
            })
            r = rows[-1]
            print(f"   {name}: {r['rps']:.0f} req/s, p99 {r['p99_ms']:.2f} ms, errors {r['errors']}, "
                  f"proxy {r['cpu_proxy']:.2f} cores {r['threads']}", flush=True)

# --- the backlog: does the accept path keep its rate while an outage fills the store? ----------
BACKLOG = int(os.environ.get("BACKLOG", "50000"))
WINDOW = os.environ.get("WINDOW", "5s")
backlog = {"fill": [], "idle": None, "drain": []}


def pending():
    d = json.loads(http(ADMIN, "/admin/state", timeout=30)[1])["deliveries"]
    return d["queued"] + d["in_flight"]


if BACKLOG > 0:
    print(f"== the backlog: sync full, upstream down, wrk -t1 -c64 in {WINDOW} windows until {BACKLOG:,} are queued; "
          f"then idle; then the upstream starts and the backlog drains", flush=True)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(STORE + suffix):
            os.remove(STORE + suffix)
    proxy = subprocess.Popen([BIN, "serve", "--config", config("full"), "--log-level", "warning"],
                             stdout=subprocess.DEVNULL, stderr=open(f"{OUT}/backlog.proxy.log", "w"))
    children.append(proxy)
    wait_ok(ADMIN, "/readyz")
    wait_for_state(lambda st: not st["upstreams"][0]["reachable"], "the upstream marked unreachable")
    # The store's writer thread is the last one the proxy starts.
    writer = max(thread_ticks(proxy.pid), key=lambda k: int(k[0]))
    while True:
        q = pending()
        if q >= BACKLOG or len(backlog["fill"]) >= 20:
            break
        m0, th0, t0 = metrics(), thread_ticks(proxy.pid), time.time()
        w = wrk(64, WINDOW, f"{OUT}/backlog-{len(backlog['fill'])}.wrk.txt")
        m1, th1, t1 = metrics(), thread_ticks(proxy.pid), time.time()
        (wp99,), _ = write_quantiles(m0, m1, [0.99])
        backlog["fill"].append({"queued": q, "rps": w["rps"], "p50_ms": w["p50_ms"], "p99_ms": w["p99_ms"],
                                "errors": w["non_2xx_3xx"] + w["socket_errors"],
                                "write_p99_ms": wp99 * 1000 if wp99 not in (None, float("inf")) else wp99,
                                "writer_cpu": (th1.get(writer, 0) - th0.get(writer, 0)) / TICK / (t1 - t0)})
        f = backlog["fill"][-1]
        print(f"   {q:>7,} queued: {f['rps']:,.0f} req/s, p99 {f['p99_ms']:.1f} ms, "
              f"writer thread {f['writer_cpu']:.2f} cores", flush=True)
    q = pending()
    th0, p0, t0 = thread_ticks(proxy.pid), proc_ticks(proxy.pid), time.time()
    time.sleep(5)
    th1, p1, t1 = thread_ticks(proxy.pid), proc_ticks(proxy.pid), time.time()
    # What a scrape costs with this backlog (the store's counts are read for each).
    a0 = time.time(); pending(); a1 = time.time(); metrics(); a2 = time.time()
    backlog["idle"] = {"queued": q, "writer_cpu": (th1.get(writer, 0) - th0.get(writer, 0)) / TICK / (t1 - t0),
                       "proxy_cpu": (p1 - p0) / TICK / (t1 - t0), "state_ms": (a1 - a0) * 1000,
                       "metrics_ms": (a2 - a1) * 1000}
    print(f"   idle, {q:,} queued, no requests for 5 s: proxy {backlog['idle']['proxy_cpu']:.2f} cores, "
          f"of which the writer thread {backlog['idle']['writer_cpu']:.2f}; GET /admin/state "
          f"{backlog['idle']['state_ms']:.0f} ms, /metrics {backlog['idle']['metrics_ms']:.0f} ms", flush=True)
    demo = subprocess.Popen([BIN, "demo-upstream", "--listen", f"127.0.0.1:{UP}"],
                            stdout=subprocess.DEVNULL, stderr=open(f"{OUT}/backlog.demo.log", "w"))
    children.append(demo)
    wait_ok(UP, "/healthz")
    end = time.time() + float(os.environ.get("DRAIN_LIMIT", "120"))
    prev_t, prev_d = time.time(), counter(metrics(), "delivered")
    while time.time() < end:
        time.sleep(5)
        q, m, now = pending(), metrics(), time.time()
        d = counter(m, "delivered")
        backlog["drain"].append({"queued": q, "delivered_per_s": (d - prev_d) / (now - prev_t)})
        print(f"   draining: {backlog['drain'][-1]['delivered_per_s']:,.0f} delivered/s, {q:,} left", flush=True)
        prev_t, prev_d = now, d
        if q == 0:
            break
    stop(proxy)
    stop(demo)

stop_all()
json.dump({"cells": rows, "backlog": backlog}, open(f"{OUT}/results.json", "w"), indent=1)


def ms(v):
    return "-" if v is None else ("> 1000" if v == float("inf") else f"≤ {v:g}")


def num(v, fmt):
    return "-" if v is None else format(v, fmt)


print()
print(f"| sync | upstream | wrk -c | requests/s | p50 ms | p99 ms | errors | store write p50 / p99 ms (bucket) "
      f"| fsyncs/s | requests per fsync | delivered/s | backlog at end | CPU cores: proxy / wrk / demo / other | bar |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
failed = []
for r in rows:
    bar = ""
    if r["sync"] == "full":
        ok = r["rps"] >= BAR and r["errors"] == 0
        bar = "PASS" if ok else "FAIL"
        if not ok:
            failed.append(f"sync full, upstream {r['upstream']}, -c{r['conns']}: {r['rps']:.0f} requests/s, {r['errors']} errors")
    print(f"| {r['sync']} | {r['upstream']} | {r['conns']} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
          f"| {r['errors']} | {ms(r['write_p50_ms'])} / {ms(r['write_p99_ms'])} | {num(r['fsyncs_per_s'], ',.0f')} "
          f"| {num(r['per_fsync'], '.1f')} | {r['delivered_per_s']:,.0f} | {r['backlog']:,} "
          f"| {r['cpu_proxy']:.2f} / {r['cpu_wrk']:.2f} / {r['cpu_demo']:.2f} / {r['cpu_foreign']:.2f} | {bar} |")
print()
print("busiest proxy threads (cores): " + "; ".join(
    f"{r['sync']}-{r['upstream']}-c{r['conns']}: " + ", ".join(f"{n} {c}" for c, n in r["threads"]) for r in rows))
print("upstream down: no delivery round runs (the health checks marked it unreachable before the warm-up); besides the "
      "accept path, the store's writer thread runs the dispatcher's claims, which find nothing to take.")
print("upstream stuck: 64 rounds in flight for the whole cell, the dispatcher claims nothing: the accept path alone.")
print("upstream up: accepting and delivering together.")
if backlog["fill"]:
    print()
    print("| backlog (sync full, upstream down, -c64) | requests/s | p50 ms | p99 ms | store write p99 ms (bucket) "
          "| writer thread, cores | bar |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for f in backlog["fill"]:
        ok = f["rps"] >= BAR and f["errors"] == 0
        if not ok:
            failed.append(f"backlog {f['queued']:,} queued: {f['rps']:.0f} requests/s")
        print(f"| {f['queued']:,} queued | {f['rps']:,.0f} | {f['p50_ms']:.2f} | {f['p99_ms']:.2f} "
              f"| {ms(f['write_p99_ms'])} | {f['writer_cpu']:.2f} | {'PASS' if ok else 'FAIL'} |")
    i = backlog["idle"]
    print(f"idle with {i['queued']:,} queued and the upstream down: the proxy uses {i['proxy_cpu']:.2f} cores "
          f"(store writer thread {i['writer_cpu']:.2f}) with no requests at all; GET /admin/state took "
          f"{i['state_ms']:.0f} ms and /metrics {i['metrics_ms']:.0f} ms.")
    if backlog["drain"]:
        print("drain once the upstream is up (delivered/s per 5 s, backlog left): " + ", ".join(
            f"{d['delivered_per_s']:,.0f} ({d['queued']:,})" for d in backlog["drain"]))
print(f"bar: >= {BAR:,.0f} requests/s and no errors on every sync: full row -> "
      + ("PASS" if not failed else "FAIL (" + "; ".join(failed) + ")"))
print(f"raw output: {OUT}")
# Like the other benchmarks, a bar not met is reported, not an error (STRICT=1 makes it one).
sys.exit(1 if failed and os.environ.get("STRICT") == "1" else 0)
