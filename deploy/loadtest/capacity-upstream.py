#!/usr/bin/env python3
"""An upstream of fixed capacity, for the `overload` scenario (overload.sh).

It serves at most SLOTS requests at a time, each holding its slot for
SERVICE_MS; a request beyond that waits in a FIFO queue inside the process,
so its latency grows with the queue, as a real service past its capacity
does (threads or a connection pool all busy). Capacity is SLOTS / SERVICE_MS
requests a second (4 / 25 ms = 160/s by default); nothing is ever refused.

    capacity-upstream.py PORT [SLOTS] [SERVICE_MS]

GET /_cap/stats answers at once (no slot) with JSON: `now` (this process's
monotonic clock, seconds), `served`, `busy_slot_seconds` (the sum over
requests of the time each held a slot: divided by SLOTS and by elapsed time
it is the utilisation), `in_service`, `queued`. Any other request holds a
slot, then answers 200 with a small body. asyncio, one thread: the slot
accounting needs no lock, and a few hundred requests a second cost a few
per cent of a core.

GET /_cap/arrivals answers at once with JSON for the `coalesce` scenario
(coalesce.sh): `started` (the monotonic clock when the port began to
listen), `now`, `slots`, `service_ms`, and `paths`: for each path
requested (query left out, `/_cap/` and `/healthz` not counted), the
monotonic times its requests arrived, as each head was read, before any
wait for a slot. Python's monotonic clock is CLOCK_MONOTONIC, one clock
for every process on the machine, so these times compare with the load
generator's.
"""
import asyncio, collections, json, sys, time

PORT = int(sys.argv[1])
SLOTS = int(sys.argv[2]) if len(sys.argv) > 2 else 4
SERVICE = (float(sys.argv[3]) if len(sys.argv) > 3 else 25.0) / 1000
BODY = b'{"ok":true}\n'


class Capacity:
    """SLOTS slots, FIFO waiters, and the busy time they add up to."""

    def __init__(self, slots):
        self.free = slots
        self.waiters = collections.deque()
        self.in_service = 0
        self.served = 0
        self.busy = 0.0

    async def serve(self):
        if self.free > 0 and not self.waiters:
            self.free -= 1
        else:
            # Woken by release() with the slot already handed over, so a
            # newcomer can never overtake a waiter.
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.release()  # the slot came with the cancellation: pass it on
                elif waiter in self.waiters:
                    self.waiters.remove(waiter)
                raise
        self.in_service += 1
        start = time.monotonic()
        try:
            await asyncio.sleep(SERVICE)
        finally:
            self.busy += time.monotonic() - start
            self.in_service -= 1
            self.served += 1
            self.release()

    def release(self):
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


capacity = Capacity(SLOTS)
started = None  # set once the port listens
arrivals = collections.defaultdict(list)  # path -> monotonic arrival times


def response(status, body, content_type=b"application/json"):
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, _, headers = head.partition(b"\r\n")
            length = 0
            for line in headers.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = min(int(value.strip() or b"0"), 1 << 20)
            if length:
                await reader.readexactly(length)
            target = request_line.split(b" ")[1] if request_line.count(b" ") >= 2 else b"/"
            if target.startswith(b"/_cap/stats"):
                stats = {"now": time.monotonic(), "served": capacity.served, "busy_slot_seconds": capacity.busy,
                         "in_service": capacity.in_service, "queued": len(capacity.waiters), "slots": SLOTS,
                         "service_ms": SERVICE * 1000}
                writer.write(response(b"200 OK", json.dumps(stats).encode()))
            elif target.startswith(b"/_cap/arrivals"):
                report = {"started": started, "now": time.monotonic(), "slots": SLOTS, "service_ms": SERVICE * 1000,
                          "paths": arrivals}
                writer.write(response(b"200 OK", json.dumps(report).encode()))
            elif target.startswith(b"/healthz"):
                writer.write(response(b"200 OK", b"ok\n", b"text/plain"))
            else:
                arrivals[target.split(b"?")[0].decode("latin-1")].append(time.monotonic())
                await capacity.serve()
                writer.write(response(b"200 OK", BODY))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        writer.close()


async def main():
    global started
    server = await asyncio.start_server(handle, "127.0.0.1", PORT, backlog=4096, reuse_address=True)
    started = time.monotonic()
    async with server:
        await server.serve_forever()


try:
    asyncio.run(main())
except KeyboardInterrupt:
    pass
