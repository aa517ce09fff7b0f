#!/usr/bin/env bash
# The cost of shared limits (issue 48): one proxy in front of the demo
# upstream, its route's rate limit (never reached) counted in the process
# (`scope: process`), or in a redis-server on loopback (`scope: cluster`)
# with leases `auto` (500 tokens a round trip at 50,000/s) or of 1 (a
# round trip on every request), in one run, side by side: requests/s, the
# proxy's CPU per request, and the latency the client sees at p50 and p99
# (wrk -c64 --latency). The proxy is pinned to CPU 0; the upstream, Redis
# and wrk to CPU 1. Usage: deploy/bench/cluster.sh [path/to/happypath]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../loadtest/lib.sh"
need wrk; need python3; need curl; need taskset util-linux; need redis-server
need_binary release "${1:-}"
DURATION=${DURATION:-8s}
REPEATS=${REPEATS:-3}
read -r UP PX REDIS <<<"$(free_ports 3)"
OUT=${OUT:-/tmp/cluster-results.$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

start_bg taskset -c 1 "$BIN" demo-upstream --listen 127.0.0.1:$UP >"$OUT/demo.log" 2>&1; DEMO=$!
wait_http $DEMO "the demo upstream" "http://127.0.0.1:$UP/healthz" "$OUT/demo.log"
start_bg taskset -c 1 redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT" >"$OUT/redis.log" 2>&1
poll 10 sh -c "redis-cli -p $REDIS ping >/dev/null 2>&1" || { echo "redis-server did not start (see $OUT/redis.log)" >&2; exit 1; }

# The proxy's user and system CPU (the process is happypath itself: every step to it execs).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A RPS=() CPU=() P50=() P99=()
for i in $(seq "$REPEATS"); do
  for profile in process cluster cluster1; do
    start_bg env BENCH_UPSTREAM=127.0.0.1:$UP BENCH_LISTEN=127.0.0.1:$PX BENCH_OUT="$OUT" BENCH_PROFILE=$profile \
      BENCH_REDIS=127.0.0.1:$REDIS HAPPYPATH_BIN="$BIN" BENCH_WRAPPER="taskset -c 0" \
      "$HERE/run-happypath-for-bench.sh" >"$OUT/proxy-$profile.log" 2>&1
    PROXY=$!
    wait_http $PROXY "the proxy ($profile)" "http://127.0.0.1:$((PX + 100))/readyz" "$OUT/proxy-$profile.log"
    if [ "$profile" != process ]; then
      poll 10 sh -c "curl -s http://127.0.0.1:$((PX + 100))/admin/state | grep -q '\"mode\":\"shared\"'" ||
        { echo "the proxy ($profile) never shared its limits through Redis" >&2; exit 1; }
    fi
    taskset -c 1 wrk -t1 -c64 -d1s "http://127.0.0.1:$PX/ok" >/dev/null
    before=$(cpu_ticks "$PROXY")
    taskset -c 1 wrk -t1 -c64 -d"$DURATION" --latency "http://127.0.0.1:$PX/ok" >"$OUT/wrk-$profile-$i.txt"
    after=$(cpu_ticks "$PROXY")
    requests=$(awk '/requests in/{print $1}' "$OUT/wrk-$profile-$i.txt")
    RPS[$profile]+="$(awk '/Requests\/sec/{print $2}' "$OUT/wrk-$profile-$i.txt") "
    CPU[$profile]+="$(python3 -c "print(round(($after - $before) * 1e6 / $(getconf CLK_TCK) / $requests, 2))") "
    P50[$profile]+="$(awk '$1=="50%"{print $2}' "$OUT/wrk-$profile-$i.txt") "
    P99[$profile]+="$(awk '$1=="99%"{print $2}' "$OUT/wrk-$profile-$i.txt") "
    non2xx=$(awk '/Non-2xx/{print $5}' "$OUT/wrk-$profile-$i.txt")
    [ -z "$non2xx" ] || echo "   $profile run $i: $non2xx answers were not 2xx (see $OUT/wrk-$profile-$i.txt)" >&2
    stop "$PROXY"
  done
done
python3 - "$OUT/summary.md" <<PY
import statistics, sys
def ms(v):
    v = v.strip()
    for unit, f in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if v.endswith(unit): return float(v[:-len(unit)]) * f
    return float(v)
rows = {
    "process": ("${RPS[process]}", "${CPU[process]}", "${P50[process]}", "${P99[process]}"),
    "cluster": ("${RPS[cluster]}", "${CPU[cluster]}", "${P50[cluster]}", "${P99[cluster]}"),
    "cluster1": ("${RPS[cluster1]}", "${CPU[cluster1]}", "${P50[cluster1]}", "${P99[cluster1]}"),
}
names = {"process": "scope: process", "cluster": "scope: cluster, lease auto (500)", "cluster1": "scope: cluster, lease 1"}
med = {k: [statistics.median([ms(x) if i >= 2 else float(x) for x in col.split()]) for i, col in enumerate(v)] for k, v in rows.items()}
base = med["process"]
out = ["| route's rate limit (wrk -c64, median of runs) | requests/s | proxy CPU µs/request | p50 ms | p99 ms |",
       "|---|---:|---:|---:|---:|"]
for k in ("process", "cluster", "cluster1"):
    r, c, p50, p99 = med[k]
    extra = "" if k == "process" else f" ({c - base[1]:+.2f})"
    lat = "" if k == "process" else f" ({p50 - base[2]:+.3f})"
    lat99 = "" if k == "process" else f" ({p99 - base[3]:+.3f})"
    out.append(f"| {names[k]} | {r:,.0f} | {c:.2f}{extra} | {p50:.3f}{lat} | {p99:.3f}{lat99} |")
text = "\n".join(out)
print(text)
open(sys.argv[1], "w").write(text + "\n")
PY
echo "raw: $OUT"
