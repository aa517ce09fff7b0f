#!/usr/bin/env python3
"""Open-loop load and sampling for one configuration of the `overload`
scenario (overload.sh runs it once per configuration).

Three phases: `before` (critical traffic alone), `spike` (the same critical
traffic plus sheddable traffic at SPIKE times its rate), `after` (critical
alone again). Requests start on a fixed schedule whatever the answers do
(open load: a slow or refused answer does not slow the offered load, as
users and batch jobs do not wait for each other), critical ones each on a
new connection (many users), sheddable ones on an idle keep-alive
connection of their pool or a new one (a batch job). Latency is measured from the
scheduled start, so a generator that falls behind shows as latency rather
than hiding it. A request not answered within TIMEOUT seconds counts as
failed (status 0) and its connection is closed. The problem code of a
refusal (OVERLOADED, UPSTREAM_TIMEOUT, ...) is kept beside its status.

Every SAMPLE_MS the proxy's admin /metrics (the overload series, absent
before adaptive concurrency exists: empty cells) and the upstream's own
/_cap/stats are read.

Writes OUT/NAME.requests.csv (one row per request: class, scheduled start
in seconds from the run's start, status, latency ms), OUT/NAME.samples.csv
(one row per sample) and OUT/NAME.run.json (phases, rates, capacity).

    overload-load.py --name adaptive --proxy 127.0.0.1:P --admin 127.0.0.1:A \
        --upstream 127.0.0.1:U --out DIR --phases 10,20,10 --critical-rate 25 --spike 12
"""
import argparse, asyncio, csv, json, re, time

from http11 import get, problem_code, read_response, split

parser = argparse.ArgumentParser()
parser.add_argument("--name", required=True)
parser.add_argument("--proxy", required=True)
parser.add_argument("--admin", required=True)
parser.add_argument("--upstream", required=True)
parser.add_argument("--upstream-name", default="api")
parser.add_argument("--out", required=True)
parser.add_argument("--phases", default="10,20,10")
parser.add_argument("--critical-rate", type=float, default=25.0)
parser.add_argument("--spike", type=float, default=12.0)
# One second past the proxy's own deadline (5 s), so its 504 is what a late request gets.
parser.add_argument("--timeout", type=float, default=6.0)
# How long the answers still due at the end are waited for (default: the
# timeout); past it they count as failed (status 0, ABANDONED).
parser.add_argument("--drain", type=float, default=None)
parser.add_argument("--sample-ms", type=float, default=200.0)
parser.add_argument("--max-outstanding", type=int, default=4000)
args = parser.parse_args()

BEFORE, SPIKE, AFTER = (float(x) for x in args.phases.split(","))
TOTAL = BEFORE + SPIKE + AFTER
CRITICAL_RATE, SHEDDABLE_RATE = args.critical_rate, args.critical_rate * args.spike


PROXY, ADMIN, UPSTREAM = split(args.proxy), split(args.admin), split(args.upstream)



class Pool:
    """Idle keep-alive connections to the proxy, one pool per traffic class;
    with keep_alive False a new connection for every request."""

    def __init__(self, keep_alive):
        self.idle = []
        self.opened = 0
        self.keep_alive = keep_alive

    async def take(self):
        if self.idle:
            return self.idle.pop()
        self.opened += 1
        return await asyncio.open_connection(*PROXY)

    def give(self, connection):
        if self.keep_alive:
            self.idle.append(connection)
        else:
            connection[1].close()


# ---- the load

start = 0.0
records = []  # (class, scheduled s, status, latency ms, problem code of a refusal)
outstanding = {"critical": 0, "sheddable": 0}
# Critical requests are many users' (a login each): each on its own
# connection, so the kernel spreads them over the proxy's workers
# (SO_REUSEPORT) as it would many clients. On a couple of keep-alive
# connections they would all sit on one worker, and with a per-worker limit
# the row's numbers would depend on which worker that is (measured with
# max_connections 6: 58 % to 100 % critical availability between runs).
# Sheddable requests are a batch job's: a keep-alive pool, as large as its
# requests in flight need.
pools = {"critical": Pool(keep_alive=False), "sheddable": Pool(keep_alive=True)}
counter = [0]


async def one(kind, scheduled):
    counter[0] += 1
    path = "/login" if kind == "critical" else f"/reports/{counter[0]}"
    pool = pools[kind]
    connection = None
    status, code = 0, ""
    try:
        async def exchange():
            nonlocal connection
            connection = await pool.take()
            reader, writer = connection
            close = "" if pool.keep_alive else "Connection: close\r\n"
            writer.write(f"GET {path} HTTP/1.1\r\nHost: overload\r\n{close}\r\n".encode())
            return await read_response(reader)
        status, body, close = await asyncio.wait_for(exchange(), args.timeout)
        if status != 200:
            code = problem_code(body)
        if close:
            connection[1].close()
        else:
            pool.give(connection)
    except (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
        status = 0
        if connection is not None:
            connection[1].close()
    except asyncio.CancelledError:  # still due when the run ended (--drain)
        status, code = 0, "ABANDONED"
        if connection is not None:
            connection[1].close()
    finally:
        outstanding[kind] -= 1
    records.append((kind, round(scheduled - start, 4), status, round((time.monotonic() - scheduled) * 1000, 2), code))


async def schedule(kind, rate, begin, end):
    """Starts request k at begin + k / rate until end, whatever the answers do."""
    if rate <= 0:
        return
    tasks = set()
    k = 0
    while True:
        due = start + begin + k / rate
        if due >= start + end:
            break
        now = time.monotonic()
        if due > now:
            await asyncio.sleep(due - now)
        if outstanding[kind] >= args.max_outstanding:
            records.append((kind, round(due - start, 4), -1, 0.0, "GENERATOR_CAP"))  # counted as failed
        else:
            outstanding[kind] += 1
            task = asyncio.ensure_future(one(kind, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        k += 1
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=args.timeout if args.drain is None else args.drain)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)


# ---- sampling

METRIC = re.compile(r'^(happypath_upstream_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$')
SERIES = ["concurrency_limit", "in_flight", "queued", "latency_baseline_seconds", "latency_recent_seconds"]
samples = []


def overload_series(text):
    """The overload gauges of our upstream, summed over workers if per worker,
    and shed_total by priority."""
    values, shed = {}, {}
    label = f'upstream="{args.upstream_name}"'
    for line in text.splitlines():
        m = METRIC.match(line)
        if not m or label not in (m.group(2) or ""):
            continue
        name, value = m.group(1)[len("happypath_upstream_"):], float(m.group(3))
        if name in SERIES:
            # Latencies are per upstream (one value); limit, in flight and
            # queued add up across workers if the proxy reports them so.
            if name.startswith("latency"):
                values[name] = value
            else:
                values[name] = values.get(name, 0.0) + value
        elif name == "shed_total":
            p = re.search(r'priority="([^"]+)"', m.group(2))
            key = p.group(1) if p else "?"
            shed[key] = shed.get(key, 0.0) + value
    return values, shed


async def sampler():
    next_at = start
    while time.monotonic() < start + TOTAL + 0.5:
        next_at += args.sample_ms / 1000
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        row = {"t": round(time.monotonic() - start, 3)}
        try:
            _, body, _ = await get(ADMIN, "/metrics")
            values, shed = overload_series(body.decode())
            row.update({k: values.get(k) for k in SERIES})
            row["shed_critical"] = shed.get("critical")
            row["shed_normal"] = shed.get("normal")
            row["shed_sheddable"] = shed.get("sheddable")
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass
        try:
            _, body, _ = await get(UPSTREAM, "/_cap/stats")
            stats = json.loads(body)
            row.update({"up_in_service": stats["in_service"], "up_queued": stats["queued"],
                        "up_busy_slot_s": round(stats["busy_slot_seconds"], 4), "up_served": stats["served"],
                        "up_now": stats["now"]})
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass
        samples.append(row)


async def main():
    global start
    # The upstream's counters at the start, so utilisation is this run's alone.
    _, body, _ = await get(UPSTREAM, "/_cap/stats")
    capacity = json.loads(body)
    start = time.monotonic() + 0.05
    await asyncio.gather(
        schedule("critical", CRITICAL_RATE, 0, TOTAL),
        schedule("sheddable", SHEDDABLE_RATE, BEFORE, BEFORE + SPIKE),
        sampler(),
    )
    for pool in pools.values():
        for _, writer in pool.idle:
            writer.close()
    with open(f"{args.out}/{args.name}.requests.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["class", "scheduled_s", "status", "latency_ms", "problem_code"])
        w.writerows(sorted(records, key=lambda r: r[1]))
    columns = ["t"] + SERIES + ["shed_critical", "shed_normal", "shed_sheddable",
                                "up_in_service", "up_queued", "up_busy_slot_s", "up_served", "up_now"]
    with open(f"{args.out}/{args.name}.samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for row in samples:
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    json.dump({"name": args.name, "phases": [BEFORE, SPIKE, AFTER], "critical_rate": CRITICAL_RATE,
               "sheddable_rate": SHEDDABLE_RATE, "timeout_s": args.timeout, "slots": capacity["slots"],
               "service_ms": capacity["service_ms"], "connections_opened": {k: p.opened for k, p in pools.items()}},
              open(f"{args.out}/{args.name}.run.json", "w"))


asyncio.run(main())
