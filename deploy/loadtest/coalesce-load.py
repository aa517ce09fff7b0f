#!/usr/bin/env python3
"""Closed-loop clients for one run of the `coalesce` scenario (coalesce.sh
runs it once with `coalesce` off, once on).

CLIENTS clients, each on its own keep-alive connection to the proxy (opened
at its first request, again after an error or a `Connection: close`):
client i GETs /r/(i % PATHS + 1), and after each answer (or error) waits
PAUSE seconds and GETs again, until DURATION seconds from the start. The
clients' first requests are spread evenly over the first SPREAD seconds
(users arrive over a moment, not in one instant). A request is timed from
its send to the end of its answer; one not answered within TIMEOUT seconds
counts as failed (status 0, TIMEOUT) and its connection is closed. Requests
still due DRAIN seconds after DURATION are cut (status 0, ABANDONED);
without --drain they are waited for up to TIMEOUT.

Once its clock's zero is set it writes OUT/NAME.started (that zero, on the
monotonic clock), so the caller can time the upstream's outage from it.
Every 250 ms it reads the proxy's admin /metrics for the parked commands
(happypath_parked_commands, all workers), and at the end the whole page
once more (OUT/NAME.metrics.txt).

Writes OUT/NAME.requests.csv (one row per request: client, path, sent in
seconds from the zero, status, latency ms, problem code of a refusal),
OUT/NAME.parked.csv (t, parked) and OUT/NAME.run.json (the run's numbers:
zero, clients, duration, connections opened, ...). The descriptor limit is
raised to its hard limit here; it needs about CLIENTS + 50.

    coalesce-load.py --name on --proxy 127.0.0.1:P --admin 127.0.0.1:A --out DIR \\
        --clients 2000 --duration 30 [--paths 5 --pause 1 --spread 1 --timeout 41 --drain 5]
"""
import argparse, asyncio, csv, json, re, resource, time

from http11 import get, problem_code, read_response, split

parser = argparse.ArgumentParser()
parser.add_argument("--name", required=True)
parser.add_argument("--proxy", required=True)
parser.add_argument("--admin", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--clients", type=int, default=2000)
parser.add_argument("--duration", type=float, default=30.0)
parser.add_argument("--paths", type=int, default=5)
parser.add_argument("--pause", type=float, default=1.0)
parser.add_argument("--spread", type=float, default=1.0)
# One second past the proxy's own deadline (40 s), so its 504 is what a late request gets.
parser.add_argument("--timeout", type=float, default=41.0)
parser.add_argument("--drain", type=float, default=None)
args = parser.parse_args()


PROXY, ADMIN = split(args.proxy), split(args.admin)

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft != resource.RLIM_INFINITY and soft < args.clients + 50:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft = hard
if soft != resource.RLIM_INFINITY and soft < args.clients + 50:
    raise SystemExit(f"coalesce-load: {args.clients:,} clients need about {args.clients + 50:,} descriptors; "
                     f"the hard limit is {hard:,} (ulimit -Hn)")



# ---- the clients

zero = 0.0
records = []  # (client, path, sent s, status, latency ms, problem code)
opened = [0]
done = [False]


async def client(index):
    path = f"/r/{index % args.paths + 1}"
    connection = None
    await asyncio.sleep(max(0.0, zero + args.spread * index / args.clients - time.monotonic()))
    end = zero + args.duration
    try:
        while time.monotonic() < end:
            sent = time.monotonic()
            status, code = 0, ""
            try:
                async def exchange():
                    nonlocal connection
                    if connection is None:
                        opened[0] += 1
                        connection = await asyncio.open_connection(*PROXY)
                    reader, writer = connection
                    writer.write(f"GET {path} HTTP/1.1\r\nHost: coalesce\r\n\r\n".encode())
                    return await read_response(reader)
                status, body, close = await asyncio.wait_for(exchange(), args.timeout)
                if status != 200:
                    code = problem_code(body)
                if close:
                    connection[1].close()
                    connection = None
            except asyncio.TimeoutError:
                status, code = 0, "TIMEOUT"
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as error:
                status, code = 0, type(error).__name__
            except asyncio.CancelledError:  # still due when the run ended (--drain)
                records.append((index, path, round(sent - zero, 4), 0, round((time.monotonic() - sent) * 1000, 2), "ABANDONED"))
                raise
            if status == 0 and connection is not None:
                connection[1].close()
                connection = None
            records.append((index, path, round(sent - zero, 4), status, round((time.monotonic() - sent) * 1000, 2), code))
            await asyncio.sleep(args.pause)
    finally:
        if connection is not None:
            connection[1].close()


# ---- sampling the proxy's parked commands

PARKED = re.compile(r'^happypath_parked_commands(\{[^}]*\})? ([0-9.eE+-]+)$', re.M)
parked = []  # (t, parked)


async def sampler():
    while not done[0]:
        try:
            _, body, _ = await get(ADMIN, "/metrics")
            parked.append((round(time.monotonic() - zero, 3), sum(float(m.group(2)) for m in PARKED.finditer(body.decode()))))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass
        await asyncio.sleep(0.25)


async def main():
    global zero
    zero = time.monotonic() + 0.05
    with open(f"{args.out}/{args.name}.started", "w") as f:
        f.write(f"{zero}\n")
    sampling = asyncio.ensure_future(sampler())
    tasks = [asyncio.ensure_future(client(i)) for i in range(args.clients)]
    # Past the end of the run, the answers still due are waited for (up to
    # DRAIN, or TIMEOUT: by then every request has ended by itself).
    await asyncio.sleep(max(0.0, zero + args.duration - time.monotonic()))
    _, late = await asyncio.wait(tasks, timeout=args.timeout if args.drain is None else args.drain)
    for task in late:
        task.cancel()
    if late:
        await asyncio.wait(late)
    done[0] = True
    await sampling
    try:
        _, body, _ = await get(ADMIN, "/metrics")
        open(f"{args.out}/{args.name}.metrics.txt", "wb").write(body)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
        pass
    with open(f"{args.out}/{args.name}.requests.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["client", "path", "sent_s", "status", "latency_ms", "problem_code"])
        w.writerows(sorted(records, key=lambda r: r[2]))
    with open(f"{args.out}/{args.name}.parked.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", "parked"])
        w.writerows(parked)
    json.dump({"name": args.name, "zero": zero, "clients": args.clients, "duration_s": args.duration,
               "paths": args.paths, "pause_s": args.pause, "spread_s": args.spread, "timeout_s": args.timeout,
               "drain_s": args.drain, "connections_opened": opened[0], "abandoned": len(late)},
              open(f"{args.out}/{args.name}.run.json", "w"))


asyncio.run(main())
