#!/usr/bin/env python3
"""Closed-loop load with exact per-request latencies, for scenarios where
the tail is the point (tail.sh). CONNS threads, each on one keep-alive
connection, send GET URL back to back for DURATION seconds; prints one JSON
line: requests, answered (2xx/3xx), errors, p50/p95/p99/max in ms (from
every request's own time, no histogram). With RATE, a modest open load
instead: RATE requests a second in all, each thread starting its requests
on a fixed schedule (a late answer delays only its own thread's next).

    latency.py http://127.0.0.1:19612/slow?ms=1000 CONNS DURATION [RATE]
"""
import http.client, json, sys, threading, time, urllib.parse

url, conns, duration = urllib.parse.urlsplit(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rate = float(sys.argv[4]) if len(sys.argv) > 4 else None
target = url.path + ("?" + url.query if url.query else "")
lock = threading.Lock()
samples, statuses, errors = [], {}, [0]
end = time.monotonic() + duration


def client(index):
    connection = None
    mine, codes, failed = [], {}, 0
    sent = 0
    while time.monotonic() < end:
        if rate:
            # This thread's next slot: requests index, index + conns, ... of the whole schedule.
            due = begin + (sent * conns + index) / rate
            if due >= end:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            sent += 1
        try:
            if connection is None:
                connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
            start = time.monotonic()
            connection.request("GET", target)
            response = connection.getresponse()
            response.read()
            mine.append(time.monotonic() - start)
            codes[response.status] = codes.get(response.status, 0) + 1
            if response.will_close:
                connection.close()
                connection = None
        except Exception:
            failed += 1
            if connection is not None:
                connection.close()
            connection = None
    with lock:
        samples.extend(mine)
        errors[0] += failed
        for code, n in codes.items():
            statuses[code] = statuses.get(code, 0) + n


begin = end - duration
threads = [threading.Thread(target=client, args=(i,)) for i in range(conns)]
for t in threads:
    t.start()
for t in threads:
    t.join()
samples.sort()


def percentile(q):
    return round(samples[min(len(samples) - 1, int(q * len(samples)))] * 1000, 2) if samples else None


answered = sum(n for code, n in statuses.items() if 200 <= code < 400)
print(json.dumps({
    "requests": len(samples), "answered": answered, "non_2xx_3xx": len(samples) - answered, "socket_errors": errors[0],
    "p50_ms": percentile(0.50), "p95_ms": percentile(0.95), "p99_ms": percentile(0.99),
    "max_ms": round(samples[-1] * 1000, 2) if samples else None, "statuses": statuses,
}))
