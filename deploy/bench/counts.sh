#!/usr/bin/env bash
# Counts that do not move with machine noise, for happypath (foundation
# profile: one worker, one route, no policies, log `warning`) beside nginx as
# a proxy, both in front of one nginx upstream, on /small (100 bytes):
#
#   user-space instructions per request  deploy/bench/callgrind.sh
#     (over HTTP/1.1, then over HTTP/2: h2c, h2load -m1 and -m10, one connection)
#   system calls per request             deploy/bench/per-request.sh (perf trace -s)
#   (and libc allocations per request, from the same run)
#
#   deploy/bench/counts.sh .build/release/happypath     (make bench-counts)
#
# Needs valgrind, perf and root (uprobes). OUT=dir keeps the raw files.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=${1:?usage: counts.sh PATH/TO/happypath}
OUT=${OUT:-/tmp/happypath-counts.$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
echo "== instructions (callgrind, N2 - N1 requests on one connection)"
OUT=$OUT/callgrind PORT_BASE=${PORT_BASE:-18680} "$here/callgrind.sh" happypath="$bin" nginx=nginx || exit 1
echo "== the cost of shaping: the same binary with a rate limit (never reached) and pacing (never paused)"
OUT=$OUT/shaping BENCH_PROFILE=shaping PORT_BASE=$(( ${PORT_BASE:-18680} + 20 )) "$here/callgrind.sh" shaping="$bin" || exit 1
echo "== the cost of hedging (armed, never due) and of keeping answers for serve_stale"
OUT=$OUT/hedge BENCH_PROFILE=hedge PORT_BASE=$(( ${PORT_BASE:-18680} + 30 )) "$here/callgrind.sh" hedge="$bin" || exit 1
OUT=$OUT/stale BENCH_PROFILE=stale PORT_BASE=$(( ${PORT_BASE:-18680} + 40 )) "$here/callgrind.sh" stale="$bin" || exit 1
echo "== the cost of coalesce: true for a request that shares with nobody (one connection: each leads alone)"
OUT=$OUT/coalesce BENCH_PROFILE=coalesce PORT_BASE=$(( ${PORT_BASE:-18680} + 190 )) "$here/callgrind.sh" coalesce="$bin" || exit 1
echo "== the cost of cors on a route (requests without Origin)"
OUT=$OUT/cors BENCH_PROFILE=cors PORT_BASE=$(( ${PORT_BASE:-18680} + 180 )) "$here/callgrind.sh" cors="$bin" || exit 1
echo "== the cost of a route that also takes WebSocket (upgrades: [websocket]) for its plain requests"
OUT=$OUT/upgrades BENCH_PROFILE=upgrades PORT_BASE=$(( ${PORT_BASE:-18680} + 50 )) "$here/callgrind.sh" upgrades="$bin" || exit 1
echo "== the cost of an adaptive concurrency limit (every try a latency sample) with a route priority"
OUT=$OUT/adaptive BENCH_PROFILE=adaptive PORT_BASE=$(( ${PORT_BASE:-18680} + 110 )) "$here/callgrind.sh" adaptive="$bin" || exit 1
echo "== the cost of tracing: sample_ratio 0 (no request traced) and 1 (every request)"
OUT=$OUT/tracing0 BENCH_PROFILE=tracing0 PORT_BASE=$(( ${PORT_BASE:-18680} + 60 )) "$here/callgrind.sh" tracing0="$bin" || exit 1
OUT=$OUT/tracing1 BENCH_PROFILE=tracing1 PORT_BASE=$(( ${PORT_BASE:-18680} + 70 )) "$here/callgrind.sh" tracing1="$bin" || exit 1
echo "== the cost of shared limits: the shaping profile's limit with scope: process, then scope: cluster"
echo "   (a redis-server on loopback; leases auto, 500 tokens a round trip here, and of 1, a round trip a request)"
redis_port=$(( ${PORT_BASE:-18680} + 140 ))
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT" >"$OUT/redis.log" 2>&1 & redis_pid=$!
for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
export BENCH_REDIS=127.0.0.1:$redis_port
OUT=$OUT/process BENCH_PROFILE=process PORT_BASE=$(( ${PORT_BASE:-18680} + 150 )) "$here/callgrind.sh" process="$bin" || { kill $redis_pid; exit 1; }
OUT=$OUT/cluster BENCH_PROFILE=cluster PORT_BASE=$(( ${PORT_BASE:-18680} + 160 )) "$here/callgrind.sh" cluster="$bin" || { kill $redis_pid; exit 1; }
OUT=$OUT/cluster1 BENCH_PROFILE=cluster1 PORT_BASE=$(( ${PORT_BASE:-18680} + 170 )) "$here/callgrind.sh" cluster1="$bin" || { kill $redis_pid; exit 1; }
kill $redis_pid; wait $redis_pid 2>/dev/null
echo "== the proxy's own HTTP/2 client: the same HTTP/1.1 requests to an h2c upstream (profile h2up, protocol: h2)"
OUT=$OUT/h2up BENCH_PROFILE=h2up UPSTREAM_H2=1 PORT_BASE=$(( ${PORT_BASE:-18680} + 120 )) "$here/callgrind.sh" h2up="$bin" || exit 1
echo "== HTTP/2 (h2c by prior knowledge, h2load on one connection): one stream at a time, then ten"
OUT=$OUT/h2m1 LOAD=h2 STREAMS=1 PORT_BASE=$(( ${PORT_BASE:-18680} + 80 )) "$here/callgrind.sh" happypath="$bin" nginx=nginx || exit 1
OUT=$OUT/h2m10 LOAD=h2 STREAMS=10 PORT_BASE=$(( ${PORT_BASE:-18680} + 90 )) "$here/callgrind.sh" happypath="$bin" nginx=nginx || exit 1
echo "== HTTP/2 POSTs of 1 KiB (h2load -d, one stream at a time): the body streamed to the upstream"
OUT=$OUT/h2post LOAD=h2 STREAMS=1 BODY=1024 PORT_BASE=$(( ${PORT_BASE:-18680} + 100 )) "$here/callgrind.sh" happypath="$bin" nginx=nginx || exit 1
echo "== system calls and allocations (perf trace -s, uprobes on libc; wrk -c64)"
OUT=$OUT/per-request PORT_BASE=$(( ${PORT_BASE:-18680} + 10 )) "$here/per-request.sh" happypath="$bin" || exit 1
echo "== the same over HTTP/2 (h2c, h2load -c64 -m1)"
OUT=$OUT/per-request-h2 LOAD=h2 PORT_BASE=$(( ${PORT_BASE:-18680} + 10 )) "$here/per-request.sh" happypath="$bin" || exit 1
python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import csv, re, sys
out = sys.argv[1]
instr = {}
for line in open(f"{out}/callgrind/summary.md"):
    m = re.match(r"\| \*\*total\*\* \| \*\*([\d,]+)\*\* \| \*\*([\d,]+)\*\* \|", line)
    if m:
        instr = {"happypath": int(m.group(1).replace(",", "")), "nginx": int(m.group(2).replace(",", ""))}
def per_request(path):
    sys_, alloc = {}, {}
    for row in csv.reader(open(path), delimiter="\t"):
        name, kind, _, what, per = row
        if kind == "syscalls":
            sys_[name] = sys_.get(name, 0) + float(per)
        elif what in ("malloc", "calloc", "realloc", "posix_memalign"):
            alloc[name] = alloc.get(name, 0) + float(per)
    return sys_, alloc
sys_, alloc = per_request(f"{out}/per-request/all.tsv")
sys_h2, alloc_h2 = per_request(f"{out}/per-request-h2/all.tsv")
def cell(d, k, f):
    return f.format(d[k]) if k in d else "-"
print()
for profile in ("shaping", "process", "cluster", "cluster1", "cors", "hedge", "stale", "coalesce", "upgrades", "adaptive", "h2up", "tracing0", "tracing1"):
    for line in open(f"{out}/{profile}/summary.md"):
        m = re.match(r"\| \*\*total\*\* \| \*\*([\d,]+)\*\* \|", line)
        if m:
            instr[profile] = int(m.group(1).replace(",", ""))
print("| per request (100 B, keep-alive) | nginx | happypath | limit | |")
print("|---|---:|---:|---:|---|")
for label, d, f, limit in [("user-space instructions", instr, "{:,.0f}", 80000),
                           ("system calls", sys_, "{:.2f}", 8),
                           ("allocations (malloc, calloc, realloc, posix_memalign)", alloc, "{:.1f}", None)]:
    verdict = "" if limit is None or "happypath" not in d else ("met" if d["happypath"] <= limit else "**short**")
    print(f"| {label} | {cell(d, 'nginx', f)} | {cell(d, 'happypath', f)} | {'' if limit is None else format(limit, ',')} | {verdict} |")
h2 = {}
for profile in ("h2m1", "h2m10", "h2post"):
    for line in open(f"{out}/{profile}/summary.md"):
        m = re.match(r"\| \*\*total\*\* \| \*\*([\d,]+)\*\* \| \*\*([\d,]+)\*\* \|", line)
        if m:
            h2[profile] = {"happypath": int(m.group(1).replace(",", "")), "nginx": int(m.group(2).replace(",", ""))}
# HTTP/2 beside HTTP/1.1: (over HTTP/1.1) and the ratio happypath/nginx as a multiple of
# HTTP/1.1's (issue 33's bar of 1.3 is on CPU per request, in make bench-h2)
for profile, streams in (("h2m1", 1), ("h2m10", 10)):
    if profile in h2 and "happypath" in instr and "nginx" in instr:
        d = h2[profile]
        over = (d["happypath"] / d["nginx"]) / (instr["happypath"] / instr["nginx"])
        print(f"| user-space instructions over HTTP/2 (h2c, h2load -m{streams}); happypath/nginx {over:.2f}× the HTTP/1.1 ratio "
              f"| {d['nginx']:,.0f} ({d['nginx'] - instr['nginx']:+,.0f}) | {d['happypath']:,.0f} ({d['happypath'] - instr['happypath']:+,.0f}) | | |")
if "h2post" in h2 and "h2m1" in h2:
    d, g = h2["h2post"], h2["h2m1"]
    print(f"| user-space instructions for an HTTP/2 POST of 1 KiB, streamed (h2load -m1 -d); over the GET "
          f"| {d['nginx']:,.0f} ({d['nginx'] - g['nginx']:+,.0f}) | {d['happypath']:,.0f} ({d['happypath'] - g['happypath']:+,.0f}) | | |")
for label, d, f in [("system calls over HTTP/2 (h2load -c64 -m1)", sys_h2, "{:.2f}"),
                    ("allocations over HTTP/2 (h2load -c64 -m1)", alloc_h2, "{:.1f}")]:
    print(f"| {label} | {cell(d, 'nginx', f)} | {cell(d, 'happypath', f)} | | |")
if "shaping" in instr and "happypath" in instr:
    extra = instr["shaping"] - instr["happypath"]
    print(f"| instructions with a rate limit and pacing (profile shaping) | | {instr['shaping']:,.0f} ({extra:+,.0f}) | +2,000 | {'met' if extra <= 2000 else '**short**'} |")
if "process" in instr and "happypath" in instr:
    extra = instr["process"] - instr["happypath"]
    print(f"| instructions with a rate limit, scope: process (profile process) | | {instr['process']:,.0f} ({extra:+,.0f}) | | |")
for profile, what in (("cluster", "leases auto: 500 tokens a round trip"), ("cluster1", "lease 1: a Redis round trip a request")):
    if profile in instr and "process" in instr:
        extra = instr[profile] - instr["process"]
        print(f"| instructions with the same limit, scope: cluster, {what} (profile {profile}; over scope: process) | | {instr[profile]:,.0f} ({extra:+,.0f}) | | |")
if "cors" in instr and "happypath" in instr:
    extra = instr["cors"] - instr["happypath"]
    print(f"| instructions on a route with cors, requests without Origin (profile cors) | | {instr['cors']:,.0f} ({extra:+,.0f}) | | |")
if "hedge" in instr and "happypath" in instr:
    extra = instr["hedge"] - instr["happypath"]
    print(f"| instructions with a hedge that is never due (profile hedge) | | {instr['hedge']:,.0f} ({extra:+,.0f}) | +1,000 | {'met' if extra <= 1000 else '**short**'} |")
if "stale" in instr and "happypath" in instr:
    extra = instr["stale"] - instr["happypath"]
    print(f"| instructions keeping every answer for serve_stale (profile stale) | | {instr['stale']:,.0f} ({extra:+,.0f}) | | |")
if "coalesce" in instr and "happypath" in instr:
    extra = instr["coalesce"] - instr["happypath"]
    # +9,000: the key (read from the request's fields as serve_stale's is, one string), its
    # hash, a group made and let go, and libcurl's and libevent's share of a slower request
    # (about +1,000 here, +4,000 in profile stale): docs/performance.md, "Request coalescing".
    print(f"| instructions on a route with coalesce: true, each request alone (profile coalesce) | | {instr['coalesce']:,.0f} ({extra:+,.0f}) | +9,000 | {'met' if extra <= 9000 else '**short**'} |")
if "upgrades" in instr and "happypath" in instr:
    extra = instr["upgrades"] - instr["happypath"]
    print(f"| instructions on a route with upgrades: [websocket], plain requests (profile upgrades) | | {instr['upgrades']:,.0f} ({extra:+,.0f}) | +500 | {'met' if extra <= 500 else '**short**'} |")
if "adaptive" in instr and "happypath" in instr:
    extra = instr["adaptive"] - instr["happypath"]
    # +2,500 since issue 44 (kinds of request, a fair share per client: about +1,270 in the
    # binary and Swift's runtime; docs/performance.md, "Overload").
    print(f"| instructions with adaptive_concurrency and a route priority (profile adaptive) | | {instr['adaptive']:,.0f} ({extra:+,.0f}) | +2,500 | {'met' if extra <= 2500 else '**short**'} |")
if "h2up" in instr and "happypath" in instr:
    extra = instr["h2up"] - instr["happypath"]
    print(f"| instructions towards an h2c upstream on the proxy's own HTTP/2 client (profile h2up; the HTTP/1.1 upstream's beside it) | | {instr['h2up']:,.0f} ({extra:+,.0f}) | | |")
if "tracing0" in instr:
    extra = instr["tracing0"] - instr["happypath"]
    print(f"| instructions with tracing, sample_ratio 0 (profile tracing0) | | {instr['tracing0']:,.0f} ({extra:+,.0f}) | +300 | {'met' if extra <= 300 else '**short**'} |")
if "tracing1" in instr:
    extra = instr["tracing1"] - instr["happypath"]
    print(f"| instructions with tracing, every request sampled (profile tracing1) | | {instr['tracing1']:,.0f} ({extra:+,.0f}) | | |")
PY
echo "raw: $OUT"
