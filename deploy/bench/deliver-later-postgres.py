#!/usr/bin/env python3
"""Deliver later on the shared PostgreSQL store (storage.url): the accept path.

Starts a private PostgreSQL server (Debian's `postgresql`: initdb in
STORE_DIR, a free port, run as `postgres` when this runs as root; the
server's default durability: fsync on, synchronous_commit on), then per
cell a fresh database and:

- **one proxy**: upstream down (the health checks mark it unreachable
  first, so only the accept path runs), `wrk -t1` POSTing a 200-byte JSON
  body with CONNS connections for DURATION after a WARMUP;
- **two proxies on one database**: the same, a wrk against each at once;
  the requests/s of both together.

Then the backlog: BACKLOG (default 20,000) requests queued on one proxy,
the accept rate measured again over it, and the plans PostgreSQL chooses
for the claim, the lease take-back and the expiry with that backlog
(each must use its partial index, not scan the table).

Bar: >= BAR (3,000) requests/s in each cell (PASS/FAIL; STRICT=1 exits 1 on
FAIL). Standard library only; every process started here is stopped at exit.

  deploy/bench/deliver-later-postgres.py path/to/happypath    (make bench-deliver-later runs it)
"""
import glob, json, os, shutil, signal, socket, subprocess, sys, time, urllib.request

BIN = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
DURATION = os.environ.get("DURATION", "10s")
WARMUP = os.environ.get("WARMUP", "2s")
CONNS = int(os.environ.get("PG_CONNS", "64"))
BAR = float(os.environ.get("BAR_PG", "3000"))
BACKLOG = int(os.environ.get("PG_BACKLOG", "20000"))
OUT = os.environ.get("OUT", "/tmp/happypath-bench-deliver-later")
STORE_DIR = os.environ.get("STORE_DIR", "/var/tmp/happypath-bench-deliver-later") + "/postgres"
os.makedirs(OUT, exist_ok=True)
children = []


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def pg_bin():
    versions = sorted((int(v) for v in os.listdir("/usr/lib/postgresql") if v.isdigit()), reverse=True) \
        if os.path.isdir("/usr/lib/postgresql") else []
    for v in versions:
        if os.access(f"/usr/lib/postgresql/{v}/bin/postgres", os.X_OK):
            return f"/usr/lib/postgresql/{v}/bin"
    sys.exit("bench deliver-later postgres: no PostgreSQL server here (apt-get install postgresql)")


BINDIR = pg_bin()
AS = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
PG_PORT, = free_ports(1)


def run(cmd, **kw):
    return subprocess.run(AS + cmd, capture_output=True, text=True, **kw)


def psql(db, sql):
    r = subprocess.run([f"{BINDIR}/psql", "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "happypath", "-d", db,
                        "-At", "-c", sql], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return r.stdout


def start_postgres():
    shutil.rmtree(STORE_DIR, ignore_errors=True)
    os.makedirs(STORE_DIR)
    if AS:
        subprocess.run(["chown", "postgres", STORE_DIR], check=True)
    r = run([f"{BINDIR}/initdb", "-D", f"{STORE_DIR}/data", "-U", "happypath", "--auth=trust", "-E", "UTF8"])
    if r.returncode != 0:
        sys.exit(f"initdb failed: {r.stderr}")
    server = subprocess.Popen(AS + [f"{BINDIR}/postgres", "-D", f"{STORE_DIR}/data", "-k", STORE_DIR,
                                    "-p", str(PG_PORT), "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=100"],
                              stdout=subprocess.DEVNULL, stderr=open(f"{OUT}/postgres.log", "w"))
    end = time.time() + 30
    while run([f"{BINDIR}/pg_isready", "-h", "127.0.0.1", "-p", str(PG_PORT), "-t", "1"]).returncode != 0:
        if time.time() > end or server.poll() is not None:
            sys.exit(f"bench deliver-later postgres: the server did not start ({OUT}/postgres.log)")
        time.sleep(0.1)
    return server


def stop_postgres(server):
    run([f"{BINDIR}/pg_ctl", "stop", "-D", f"{STORE_DIR}/data", "-m", "fast", "-w"])
    server.wait()
    shutil.rmtree(STORE_DIR, ignore_errors=True)


def http(port, path, timeout=5):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.read().decode()


def wait_for(check, what, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    stop_all()
    sys.exit(f"bench deliver-later postgres: not seen within {timeout} s: {what} (logs in {OUT})")


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


def proxy(name, db, upstream_port):
    px, admin = free_ports(2)
    cfg = f"{OUT}/pg-{name}.yaml"
    with open(cfg, "w") as f:
        f.write(f"""listen: 127.0.0.1:{px}
admin: {{ listen: 127.0.0.1:{admin} }}
drain_timeout: 1s
storage: {{ url: 'postgres://happypath@127.0.0.1:{PG_PORT}/{db}?sslmode=disable' }}
upstreams:
  hooks:
    endpoints: [http://127.0.0.1:{upstream_port}]
    health_check: {{ interval: 250ms, timeout: 200ms }}
routes:
  - match: {{ path_prefix: /hooks/ }}
    upstream: hooks
    strip_prefix: /hooks
    delivery: {{ mode: later, backoff: {{ base: 100ms, max: 1s }} }}
""")
    p = subprocess.Popen([BIN, "serve", "--config", cfg, "--log-level", "warning"],
                         stdout=subprocess.DEVNULL, stderr=open(f"{OUT}/pg-{name}.proxy.log", "w"))
    children.append(p)

    def ready():
        state = json.loads(http(admin, "/admin/state")[1])
        return http(admin, "/readyz")[0] == 200 and not state["upstreams"][0]["reachable"]
    wait_for(ready, f"proxy {name} ready, the upstream marked unreachable")
    return p, px, admin


def wrk(port, duration, out):
    cmd = ["wrk", "-t1", f"-c{CONNS}", f"-d{duration}", "--timeout", "10s", "-s", f"{HERE}/deliver-later.lua",
           f"http://127.0.0.1:{port}/hooks/ok"]
    return subprocess.Popen(cmd, stdout=open(out, "w"), stderr=subprocess.STDOUT)


def summary(out):
    line = next((l for l in open(out) if l.startswith("WRK_JSON ")), None)
    if line is None:
        stop_all()
        sys.exit(f"bench deliver-later postgres: wrk printed no summary ({out})")
    return json.loads(line[9:])


def cell(name, replicas):
    db = "bench_" + name.replace("-", "_")
    psql("postgres", f"CREATE DATABASE {db}")
    down, = free_ports(1)  # nothing listens there: the upstream is down
    proxies = [proxy(f"{name}-{i}", db, down) for i in range(replicas)]
    for _, px, _ in proxies:
        wrk(px, WARMUP, f"{OUT}/pg-{name}.warmup.txt").wait()
    t0 = time.time()
    runs = [wrk(px, DURATION, f"{OUT}/pg-{name}-{i}.wrk.txt") for i, (_, px, _) in enumerate(proxies)]
    for r in runs:
        r.wait()
    results = [summary(f"{OUT}/pg-{name}-{i}.wrk.txt") for i in range(replicas)]
    rows = int(psql(db, "SELECT count(*) FROM happypath_delivery").strip())
    for p, _, _ in proxies:
        stop(p)
    return {
        "cell": name, "replicas": replicas, "rps": sum(r["rps"] for r in results),
        "p99_ms": max(r["p99_ms"] for r in results),
        "errors": sum(r["non_2xx_3xx"] + r["socket_errors"] for r in results),
        "accepted": sum(r["requests"] for r in results), "rows": rows, "wall": time.time() - t0,
    }


for tool in ("wrk",):
    if not shutil.which(tool):
        sys.exit(f"missing: {tool} (make bench-deps)")
server = start_postgres()
try:
    print(f"== deliver later on PostgreSQL ({os.path.basename(os.path.dirname(BINDIR))}, default durability), "
          f"wrk -t1 -c{CONNS} per proxy, {WARMUP} warm-up + {DURATION}; {os.cpu_count()} CPUs", flush=True)
    rows = [cell("one-proxy", 1), cell("two-proxies", 2)]
    for r in rows:
        print(f"   {r['cell']}: {r['rps']:,.0f} req/s, p99 {r['p99_ms']:.1f} ms, errors {r['errors']}, "
              f"rows {r['rows']:,}", flush=True)

    # The backlog: accepts over BACKLOG queued rows, and the plans of the claim-side queries.
    plans, scanned = {}, []
    if BACKLOG > 0:
        psql("postgres", "CREATE DATABASE bench_backlog")
        down, = free_ports(1)
        p, px, admin = proxy("backlog", "bench_backlog", down)
        while int(psql("bench_backlog", "SELECT count(*) FROM happypath_delivery").strip()) < BACKLOG:
            wrk(px, "5s", f"{OUT}/pg-backlog-fill.wrk.txt").wait()
        queued = int(psql("bench_backlog", "SELECT count(*) FROM happypath_delivery").strip())
        w = wrk(px, DURATION, f"{OUT}/pg-backlog.wrk.txt")
        w.wait()
        s = summary(f"{OUT}/pg-backlog.wrk.txt")
        rows.append({"cell": f"one-proxy, {queued:,} queued", "replicas": 1, "rps": s["rps"], "p99_ms": s["p99_ms"],
                     "errors": s["non_2xx_3xx"] + s["socket_errors"], "accepted": s["requests"], "rows": queued})
        stop(p)
        psql("bench_backlog", "ANALYZE happypath_delivery")
        now = int(time.time() * 1000)
        queries = {
            "claim (one upstream's due rows)":
                f"SELECT seq FROM happypath_delivery WHERE state = 0 AND upstream = 'hooks' AND next_attempt_at <= {now} "
                f"ORDER BY next_attempt_at LIMIT 64 FOR UPDATE SKIP LOCKED",
            "upstreams with queued rows (loose scan)":
                "WITH RECURSIVE u AS ((SELECT upstream FROM happypath_delivery WHERE state = 0 ORDER BY upstream LIMIT 1) "
                "UNION ALL SELECT (SELECT d.upstream FROM happypath_delivery d WHERE d.state = 0 AND d.upstream > u.upstream "
                "ORDER BY d.upstream LIMIT 1) FROM u WHERE u.upstream IS NOT NULL) SELECT upstream FROM u",
            "leases run out": f"SELECT upstream FROM happypath_delivery WHERE state = 1 AND lease_until <= {now}",
            "past max_age": f"SELECT id FROM happypath_delivery WHERE state = 0 AND expires_at <= {now}",
        }
        for what, sql in queries.items():
            plan = psql("bench_backlog", "EXPLAIN (COSTS OFF) " + sql)
            plans[what] = plan
            scans = [l.strip() for l in plan.splitlines() if "Scan" in l]
            seq = any(l.startswith("Seq Scan") or "-> Seq Scan" in l for l in scans)
            print(f"   plan, {what}: {'SEQUENTIAL SCAN' if seq else 'index'}: {' | '.join(scans)}", flush=True)
            if seq:
                scanned.append(what)
finally:
    stop_all()
    stop_postgres(server)

json.dump({"cells": rows, "plans": plans}, open(f"{OUT}/postgres-results.json", "w"), indent=1)
print()
print("| store | proxies | requests/s (all proxies) | p99 ms | errors | rows at end | bar |")
print("|---|---:|---:|---:|---:|---:|---|")
failed = []
for r in rows:
    ok = r["rps"] >= BAR and r["errors"] == 0
    if not ok:
        failed.append(f"{r['cell']}: {r['rps']:.0f} requests/s, {r['errors']} errors")
    print(f"| PostgreSQL, {r['cell']} | {r['replicas']} | {r['rps']:,.0f} | {r['p99_ms']:.1f} | {r['errors']} "
          f"| {r['rows']:,} | {'PASS' if ok else 'FAIL'} |")
if scanned:
    failed.append("scans the whole table: " + ", ".join(scanned))
print(f"bar: >= {BAR:,.0f} requests/s, no errors, in each cell; the claim-side queries on their indexes")
if failed:
    print("FAIL: " + "; ".join(failed))
    if os.environ.get("STRICT") == "1":
        sys.exit(1)
