#!/usr/bin/env python3
"""The "nothing lost" scenario of deliver later (deploy/loadtest/deliver-later.sh).

1. The proxy starts with a route that delivers later (sync: full) in front of
   a recording upstream that is not running yet.
2. REQUESTS POSTs, each with its own body and X-Request-Id, from many
   keep-alive connections; 1% carry a client Idempotency-Key and are sent a
   second time right away. Every answer is recorded: 202 and its id, or the
   problem.
3. The upstream starts. When it has received 20% of the accepted requests
   the proxy gets kill -9 and is started again on the same store; at 60%,
   again. Before each restart the store is read (read-only) for the rows that
   were in flight, which the proxy must put back to queued and log.
4. When /admin/state shows nothing queued or in flight, what the upstream
   received is compared with what was accepted.
With --kill-while-accepting the proxy is also killed halfway through step 2
(requests cut off then may or may not have been stored; every 202 must
arrive); with --max-bytes the store fills during step 2, so some requests are
refused (503 OVERLOADED) and must never arrive.

The promises checked (exit 1 if any is broken):
- every 202 arrived upstream at least once, with its body, path and
  X-Request-Id, under its Idempotency-Key (the client's, else the delivery id);
- a repeated client Idempotency-Key got the same id and arrived under one
  X-Request-Id;
- every answer that is not 202 is 503 OVERLOADED, and such a request never
  arrives upstream; nothing arrives that was not accepted;
- extra arrivals (duplicates) are no more than the rounds that were in flight
  at the kills, and each restart recovered exactly the rows in flight;
- the store holds exactly the accepted deliveries, all delivered, none dead.
Standard library only."""
import argparse, hashlib, http.client, json, os, signal, socket, sqlite3, subprocess, sys, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--out", required=True)
p.add_argument("--requests", type=int, default=10000)
p.add_argument("--threads", type=int, default=32)
p.add_argument("--port-base", type=int, default=0, help="ports BASE..BASE+2 (default: three free ports)")
p.add_argument("--drain-timeout", type=float, default=180)
p.add_argument("--max-bytes", default="", help="storage.max_bytes (e.g. 400KiB): a store that fills, so some are refused")
p.add_argument("--kill-while-accepting", action="store_true",
               help="also kill -9 the proxy halfway through accepting: every 202 must still arrive")
p.add_argument("--kill-at", default="0.2,0.6", help="fractions of accepted requests received upstream")
args = p.parse_args()

if args.port_base:
    UP, PX, ADMIN = args.port_base, args.port_base + 1, args.port_base + 2
else:  # free a moment ago, and all different: no run meets another on a fixed port
    socks = [socket.socket() for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    UP, PX, ADMIN = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
OUT = args.out
os.makedirs(OUT, exist_ok=True)
STORE = f"{OUT}/deliveries.db"
CONFIG = f"{OUT}/deliver-later.yaml"
RECORDS = f"{OUT}/deliver-later.upstream.txt"
RUN = f"{int(time.time()) % 100000:05d}"
problems = []
children = []


def broken(message):
    problems.append(message)
    print(f"   BROKEN: {message}", flush=True)


def cleanup():
    for c in children:
        if c.poll() is None:
            c.kill()
            c.wait()


def get(port, path, timeout=2):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def get_json(port, path):
    status, body = get(port, path)
    if status != 200:
        raise RuntimeError(f"GET {path} on :{port}: {status}")
    return json.loads(body)


def wait_for(what, check, timeout=10, every=0.05):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if check():
                return
        except (OSError, http.client.HTTPException, ValueError):
            pass
        time.sleep(every)
    cleanup()
    sys.exit(f"deliver-later: {what} did not happen within {timeout} s")


for f in (STORE, STORE + "-wal", STORE + "-shm", RECORDS):
    if os.path.exists(f):
        os.remove(f)
with open(CONFIG, "w") as f:
    f.write(f"""listen: 127.0.0.1:{PX}
admin: {{ listen: 127.0.0.1:{ADMIN} }}
drain_timeout: 1s
storage: {{ path: {STORE}, sync: full{f", max_bytes: {args.max_bytes}" if args.max_bytes else ""} }}
upstreams:
  hooks:
    endpoints: [http://127.0.0.1:{UP}]
    max_connections: 256
    health_check: {{ path: /healthz, interval: 250ms, timeout: 200ms }}
routes:
  - match: {{ path_prefix: /hooks/ }}
    upstream: hooks
    delivery: {{ mode: later, max_attempts: 1000, max_age: 1h, backoff: {{ base: 100ms, max: 1s }} }}
""")
check = subprocess.run([args.bin, "check", "--config", CONFIG], capture_output=True, text=True)
if check.returncode != 0:
    sys.exit(f"deliver-later: happypath check refused {CONFIG}:\n{check.stdout}{check.stderr}")

# --- the proxy, started and killed ------------------------------------------------------
starts = []  # per start: log path, events seen by a subscriber that connected at once


def watch_events(seen, stop):
    """Connects to /admin/events as early as it can and keeps what arrives."""
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", ADMIN), timeout=0.5)
        except OSError:
            time.sleep(0.002)
            continue
        try:
            s.sendall(b"GET /admin/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # the admin listener refuses a Host that is not its own
            s.settimeout(0.5)
            buf = b""
            seen.append({"type": "_connected", "at": time.time()})
            while not stop.is_set():
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    continue
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.startswith(b"data: "):
                        try:
                            seen.append(json.loads(line[6:]))
                        except ValueError:
                            pass
        except OSError:
            pass
        finally:
            s.close()
        return


def start_proxy():
    n = len(starts) + 1
    log_path = f"{OUT}/deliver-later.proxy.{n}.log"
    seen, stop = [], threading.Event()
    threading.Thread(target=watch_events, args=(seen, stop), daemon=True).start()
    proc = subprocess.Popen(
        [args.bin, "serve", "--config", CONFIG, "--log-level", "warning"],
        stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    children.append(proc)
    wait_for(f"proxy start {n}", lambda: get(ADMIN, "/readyz")[0] == 200)
    wait_for(f"proxy start {n}: /admin/state", lambda: "deliveries" in get_json(ADMIN, "/admin/state"))
    time.sleep(0.2)  # the recovery warning is logged on the admin loop as it starts
    recovered = None
    for line in open(log_path):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "queued again" in entry.get("msg", ""):
            recovered = int(entry.get("count", 0))
    start = {"n": n, "proc": proc, "log": log_path, "recovered_logged": recovered, "events": seen, "stop": stop}
    starts.append(start)
    return start


def in_flight_in_store():
    """Rows the killed proxy left in_flight (state 1), read before the restart."""
    db = sqlite3.connect(f"file:{STORE}?mode=ro", uri=True)
    try:
        counts = dict(db.execute("SELECT state, count(*) FROM delivery GROUP BY state").fetchall())
    finally:
        db.close()
    return counts


def state():
    return get_json(ADMIN, "/admin/state")["deliveries"]


# --- 1. accept while the upstream is down ------------------------------------------------
proxy = start_proxy()
if proxy["recovered_logged"] is not None:
    broken(f"a fresh store logged {proxy['recovered_logged']} recovered deliveries")

items = []  # (n, client key or None, request id, body)
for n in range(args.requests):
    body = json.dumps({"event": "order.created", "n": n, "run": RUN, "customer": f"c-{n % 997:04d}",
                       "amount_cents": (n * 7919) % 100000, "note": "deliver later, nothing lost",
                       "pad": "x" * 40}).encode()
    if n % 100 == 50:  # 1%: a client key, sent twice in a row (often in the same group commit)
        key = f"client-{RUN}-{n}"
        items.append((n, key, f"dl-{RUN}-{n}-a", body))
        items.append((n, key, f"dl-{RUN}-{n}-b", body))
    else:
        items.append((n, None, f"dl-{RUN}-{n}", body))
results = [None] * len(items)
next_item = iter(range(len(items)))
take = threading.Lock()


def client():
    conn = None
    while True:
        with take:
            k = next(next_item, None)
        if k is None:
            break
        n, key, rid, body = items[k]
        headers = {"Content-Type": "application/json", "X-Request-Id": rid}
        if key:
            headers["Idempotency-Key"] = key
        if conn is None:  # refused: nothing was sent, so the same request is tried again
            conn = http.client.HTTPConnection("127.0.0.1", PX, timeout=30)
            for _ in range(1000):
                try:
                    conn.connect()
                    break
                except ConnectionRefusedError:
                    time.sleep(0.01)
        try:
            conn.request("POST", f"/hooks/event/{n}", body, headers)
            r = conn.getresponse()
            data = r.read()
            results[k] = (r.status, data, r.getheader("Retry-After"))
            if r.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = None
        except (OSError, http.client.HTTPException) as e:
            results[k] = (None, repr(e).encode(), None)
            if conn:
                conn.close()
            conn = None
    if conn:
        conn.close()


print(f"== deliver-later: {args.requests} POSTs ({sum(1 for i in items if i[1]) // 2} with a client Idempotency-Key, "
      f"sent twice) from {args.threads} connections; the upstream is down", flush=True)
t0 = time.time()
threads = [threading.Thread(target=client) for _ in range(args.threads)]
for t in threads:
    t.start()
kills = []
if args.kill_while_accepting:  # halfway: kill -9, restart; the clients reconnect
    while sum(1 for r in results if r is not None) < len(items) // 2:
        time.sleep(0.002)
    answered = sum(1 for r in results if r is not None)
    proxy["proc"].send_signal(signal.SIGKILL)
    proxy["proc"].wait()
    proxy["stop"].set()
    in_store = in_flight_in_store()
    killed_t = time.time()
    proxy = start_proxy()
    kills.append({"fraction": None, "received": 0, "answered": answered, "in_flight": in_store.get(1, 0),
                  "delivered": 0, "stored": sum(in_store.values()), "recovered": proxy["recovered_logged"] or 0,
                  "logged": proxy["recovered_logged"] is not None, "event": False, "down_s": time.time() - killed_t})
    print(f"   kill -9 while accepting, after {answered} answers: {sum(in_store.values())} stored, "
          f"{in_store.get(1, 0)} rounds in flight; restart logged {kills[-1]['recovered']} queued again", flush=True)
    if kills[-1]["recovered"] != kills[-1]["in_flight"]:
        broken(f"restart {proxy['n']}: {kills[-1]['in_flight']} rows were in flight in the store, "
               f"the proxy recovered {kills[-1]['recovered']}")
for t in threads:
    t.join()
accept_s = time.time() - t0

expected = {}  # Idempotency-Key upstream -> {"rids": set, "sha", "path", "id"}
refused_rids, others, id_of_key, same_id_pairs, pairs = set(), [], {}, 0, 0
ids = {}
retry_after = {}  # Retry-After of the 503s -> count
unanswered = {}  # request id -> (key, sha, path): cut off by the kill while accepting, may or may not be stored
for (n, key, rid, body), (status, data, retry) in zip(items, results):
    if status is None and args.kill_while_accepting:
        unanswered[rid] = (key, hashlib.sha1(body).hexdigest()[:16], f"/hooks/event/{n}")
    elif status == 202:
        try:
            answer = json.loads(data)
            did = answer["id"]
        except (ValueError, KeyError):
            others.append((rid, status, data[:200]))
            continue
        # A new delivery is queued; the later of a repeated key's two sends
        # (either may arrive first) gets the one stored and its state now,
        # which a round may have taken in flight meanwhile (the upstream is
        # down, so never further).
        states = ("queued", "in_flight") if key else ("queued",)
        if answer.get("state") not in states or not did.startswith("dlv_"):
            others.append((rid, status, data[:200]))
        upstream_key = key or did
        e = expected.setdefault(upstream_key, {"rids": set(), "sha": hashlib.sha1(body).hexdigest()[:16],
                                               "path": f"/hooks/event/{n}", "id": did})
        e["rids"].add(rid)
        if e["id"] != did:
            broken(f"Idempotency-Key {key}: two different ids, {e['id']} and {did}")
        if did in ids and ids[did] != upstream_key:
            broken(f"id {did} given to two different requests")
        ids[did] = upstream_key
    elif status == 503:
        try:
            code = json.loads(data).get("code")
        except ValueError:
            code = None
        if code != "OVERLOADED":
            others.append((rid, status, data[:200]))
        refused_rids.add(rid)
        retry_after[retry] = retry_after.get(retry, 0) + 1
    else:
        others.append((rid, status, data[:200]))
for e in expected.values():  # a repeated key: both sends got the one id
    if len(e["rids"]) == 2:
        pairs += 1
for rid, (key, _, _) in unanswered.items():  # the cut-off send of a repeated key may be the one stored
    if key in expected:
        expected[key]["rids"].add(rid)
keyed = sum(1 for i in items if i[1]) // 2
keyed_refused = sum(1 for i, r in zip(items, results) if i[1] and i[2].endswith("-a") and r[0] == 503)
accepted = len(expected)
refused = len(refused_rids)
for rid, status, data in others[:5]:
    broken(f"request {rid}: answered {status} {data!r} (only 202 or 503 OVERLOADED may be)")
if len(others) > 5:
    broken(f"... and {len(others) - 5} more answers that were neither 202 nor 503 OVERLOADED")
print(f"   {accepted} accepted, {refused} refused, {len(others)} other answers"
      f"{f', {len(unanswered)} cut off by the kill' if args.kill_while_accepting else ''} in {accept_s:.1f} s "
      f"({len(items) / accept_s:.0f} requests/s)", flush=True)
if accepted == 0:
    cleanup()
    sys.exit("deliver-later: nothing was accepted")

s = state()
held = s["queued"] + s["in_flight"] + s["delivered"] + s["dead"]
if not accepted <= held <= accepted + len(unanswered):
    broken(f"the store holds {held} deliveries, {accepted} were accepted"
           f"{f' and {len(unanswered)} cut off' if unanswered else ''} (state: {s})")

# --- 2. the upstream starts; kill -9 the proxy twice while deliveries flow ------------------
upstream = subprocess.Popen([sys.executable, f"{HERE}/recording-upstream.py", str(UP), RECORDS],
                            stdout=subprocess.DEVNULL, stderr=open(f"{OUT}/deliver-later.upstream.log", "w"))
children.append(upstream)
up_t0 = time.time()
wait_for("the recording upstream to listen", lambda: get(UP, "/healthz")[0] == 200)
print("   upstream started", flush=True)


def received():
    return get_json(UP, "/_stats")["received"]


samples = []  # (seconds since the upstream started, arrivals), every 50 ms until drained
sampling = threading.Event()


def sample():
    while not sampling.is_set():
        try:
            samples.append((time.time() - up_t0, received()))
        except (OSError, http.client.HTTPException, ValueError):
            pass
        time.sleep(0.05)


sampler = threading.Thread(target=sample, daemon=True)
sampler.start()


for fraction in [float(x) for x in args.kill_at.split(",") if x]:
    target = int(accepted * fraction)
    wait_for(f"{target} arrivals upstream", lambda: received() >= target, timeout=args.drain_timeout, every=0.005)
    proc = proxy["proc"]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at = received()
    proxy["stop"].set()
    in_store = in_flight_in_store()
    in_flight = in_store.get(1, 0)
    killed_t = time.time()
    proxy = start_proxy()
    recovered = proxy["recovered_logged"] or 0
    event = [e for e in proxy["events"] if e.get("type") == "deliveries_recovered"]
    subscribed = any(e.get("type") == "_connected" for e in proxy["events"])
    event_note = ("event deliveries_recovered seen" if event else
                  "event deliveries_recovered not seen by a subscriber that connected at once" if subscribed else
                  "no subscriber could connect to /admin/events")
    kills.append({"fraction": fraction, "received": at, "in_flight": in_flight, "delivered": in_store.get(2, 0),
                  "recovered": recovered, "logged": proxy["recovered_logged"] is not None, "event": bool(event),
                  "down_s": time.time() - killed_t})
    print(f"   kill -9 at {at} arrivals ({fraction:.0%}): {in_flight} in flight in the store, "
          f"{in_store.get(2, 0)} marked delivered; restart logged {recovered} queued again"
          f" ({event_note})",
          flush=True)
    if recovered != in_flight:
        broken(f"restart {proxy['n']}: {in_flight} rows were in flight in the store, the proxy recovered {recovered}")

# --- 3. drain ------------------------------------------------------------------------------
def drained():
    s = state()
    return s["queued"] + s["in_flight"] == 0


end = time.time() + args.drain_timeout
while time.time() < end:
    try:
        if drained():
            break
    except (OSError, http.client.HTTPException, ValueError):
        pass
    time.sleep(0.1)
drain_s = time.time() - up_t0
sampling.set()
sampler.join()
first_arrival = next((t for t, n in samples if n > 0), None)
final = state()
if final["queued"] + final["in_flight"] != 0:
    broken(f"not drained after {args.drain_timeout:.0f} s: {final}")
if final["dead"]:
    broken(f"{final['dead']} deliveries dead")
if not accepted <= final["delivered"] <= accepted + len(unanswered):
    broken(f"the store says {final['delivered']} delivered, {accepted} were accepted")

# --- 4. what arrived ------------------------------------------------------------------------
status, text = get(UP, "/_records", timeout=10)
arrivals = {}  # key -> [(rid, sha, path)]
unexpected = []
cut_off_arrived = set()  # keys of requests cut off by the kill that were stored and delivered
for line in text.decode().splitlines():
    key, rid, sha, path = line.split(" ", 3)
    arrivals.setdefault(key, []).append((rid, sha, path))
    if key in expected:
        continue
    if rid in unanswered:
        cut_off_arrived.add(key)
        if unanswered[rid][1:] != (sha, path):
            unexpected.append(line + " (differs from what was sent)")
    else:
        unexpected.append(line)
refused_arrived = [rid for got in arrivals.values() for (rid, _, _) in got if rid in refused_rids]
lost = [k for k in expected if k not in arrivals]
mismatched = []
for key, got in arrivals.items():
    e = expected.get(key)
    if not e:
        continue
    rids = {rid for rid, _, _ in got}
    if len(rids) != 1 or not rids <= e["rids"]:
        mismatched.append(f"{key}: X-Request-Id {sorted(rids)}, sent as {sorted(e['rids'])}")
    for rid, sha, path in got:
        if sha != e["sha"] or path != e["path"]:
            mismatched.append(f"{key}: arrived as {path} body {sha}, sent as {e['path']} body {e['sha']}")
total_arrivals = sum(len(v) for v in arrivals.values())
dup_keys = sum(1 for k, v in arrivals.items() if (k in expected or k in cut_off_arrived) and len(v) > 1)
extra = sum(len(v) - 1 for k, v in arrivals.items() if k in expected or k in cut_off_arrived)
bound = sum(k["in_flight"] for k in kills)

if lost:
    broken(f"{len(lost)} accepted requests never arrived, e.g. {lost[:5]}")
if unexpected:
    broken(f"{len(unexpected)} arrivals that were never accepted, e.g. {unexpected[:3]}")
if refused_arrived:
    broken(f"{len(refused_arrived)} requests answered 503 arrived upstream, e.g. {refused_arrived[:3]}")
if mismatched:
    broken(f"{len(mismatched)} arrivals differ from what was sent, e.g. {mismatched[:3]}")
if final["delivered"] != accepted + len(cut_off_arrived):
    broken(f"the store says {final['delivered']} delivered: {accepted} were accepted and "
           f"{len(cut_off_arrived)} cut off by the kill arrived")
if extra > bound:
    broken(f"{extra} extra arrivals, more than the {bound} rounds in flight at the kills")

# A clean stop at the end: SIGTERM, exit 0.
proxy["proc"].send_signal(signal.SIGTERM)
try:
    rc = proxy["proc"].wait(timeout=15)
    if rc != 0:
        broken(f"the last proxy exited {rc} on SIGTERM")
except subprocess.TimeoutExpired:
    broken("the last proxy did not stop within 15 s of SIGTERM")
proxy["stop"].set()
cleanup()

rows = [
    ("requests sent", f"{len(items)} ({args.requests} distinct, {keyed} sent twice with one Idempotency-Key)"),
    ("accepted (202), distinct ids", f"{accepted} in {accept_s:.1f} s, upstream down ({len(items) / accept_s:.0f} requests/s)"),
    ("repeated Idempotency-Key, same id", f"{pairs} of {keyed}" + (f" ({keyed_refused} first sends refused)" if keyed_refused else "")),
    ("refused (503 OVERLOADED)", f"{refused}" + (" (Retry-After: " + ", ".join(f"{v} x{c}" for v, c in sorted(retry_after.items(), key=str)) + ")" if refused else "")),
    ("any other answer or none", f"{len(others)}"),
]
if args.kill_while_accepting:
    rows.append(("cut off by the kill while accepting", f"{len(unanswered)} (no answer; {len(cut_off_arrived)} of them "
                 "had been stored and arrived, which is allowed)"))
for i, k in enumerate(kills, 1):
    when = (f"at {k['received']} arrivals ({k['fraction']:.0%} target)" if k["fraction"] is not None
            else f"while accepting, after {k['answered']} answers")
    rows.append((f"kill -9 #{i}", f"{when}; in flight in the store "
                 f"{k['in_flight']}, recovered at restart {k['recovered']}; back up in {k['down_s']:.1f} s"))
rows += [
    ("delivered, distinct keys", f"{len(expected) - len(lost)} of {accepted}"),
    ("arrivals upstream", f"{total_arrivals}"),
    ("duplicates", f"{dup_keys} keys arrived more than once, {extra} extra arrivals (bound: {bound} in flight at the kills)"),
    ("lost / never accepted / refused but arrived", f"{len(lost)} / {len(unexpected)} / {len(refused_arrived)}"),
    ("first arrival", f"{first_arrival:.2f} s after the upstream started" if first_arrival is not None else "none"),
    ("time to drain", f"{drain_s:.1f} s from the upstream's start ({accepted / drain_s:.0f} deliveries/s, restarts included)"),
    ("store at the end", f"delivered {final['delivered']}, dead {final['dead']}, queued {final['queued']}, in flight {final['in_flight']}"),
]
width = max(len(r[0]) for r in rows)
print()
for name, value in rows:
    print(f"   {name.ljust(width)}  {value}")
print()
json.dump({"samples": samples, "accepted": accepted, "refused": refused, "others": len(others), "delivered_unique": len(expected) - len(lost),
           "arrivals": total_arrivals, "duplicate_keys": dup_keys, "extra_arrivals": extra, "kills": kills,
           "accept_s": accept_s, "drain_s": drain_s, "problems": problems},
          open(f"{OUT}/deliver-later.json", "w"), indent=1)
if problems:
    print(f"loadtest deliver-later: FAILED: {len(problems)} broken promise(s) (logs and records in {OUT})")
    sys.exit(1)
print("loadtest deliver-later: promise kept (every 202 arrived; duplicates only from rounds in flight at a kill -9)")
