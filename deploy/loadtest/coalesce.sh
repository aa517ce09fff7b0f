#!/usr/bin/env bash
# Load-test scenario `coalesce` (deploy/loadtest/run.sh coalesce [--short],
# make loadtest SCENARIO=coalesce): what request coalescing (issue 50,
# docs/coalescing.md) does to the herd that meets an upstream back from an
# outage.
#
# The upstream (capacity-upstream.py) serves SLOTS=16 requests at a time,
# SERVICE_MS=100 each (160 a second), and counts what arrives, by path and
# time (/_cap/arrivals). Its port is closed for the first DOWN=10 s of the
# run (--short: 3), then it starts. CLIENTS=2,000 clients (--short: 400),
# each on its own keep-alive connection (coalesce-load.py, asyncio), client i
# GETs /r/(i % 5 + 1), waits 1 s after each answer and GETs again, for
# DURATION=30 s (--short: 8), first requests spread over the first second.
# The proxy: WORKERS=auto, one route to the upstream with
# reachability: { park_for: 30s }, health checks every 250 ms, timeout 40s,
# max_connections 4096 (no limit in the way). The same run twice, each with
# a fresh proxy and upstream: `plain` (no coalesce), then `coalesced`
# (coalesce: true). While the upstream is down, every request parks; with
# coalescing only each group's leader parks (one per path per worker) and
# its followers wait with it, so the replay reaches the upstream as at most
# one request per path per worker.
#
# Printed and written to $OUT/coalesce (default /tmp/happypath-loadtest/coalesce):
# a table of both runs (coalesce.md): upstream requests in all, in the
# replay's first second and first 5 s, client p50/p99/max latency and errors,
# peak parked; coalesce.json (the numbers, arrivals per 100 ms, latency
# quantiles), coalesce.png (matplotlib: upstream requests per 100 ms, latency
# distribution, parked commands), and per run its config, proxy log, every
# request (NAME.requests.csv) and the upstream's arrivals (NAME.upstream.json).
# Promise (checked with --short, exit 1 if broken): with coalescing, no client
# error, and the recovery burst (requests reaching the upstream in the first
# second of the replay) at most 5 x workers. The plain run's burst is printed
# beside it, not checked. The burst is counted from the replay's first
# request, not from the upstream's start: the first connect failures open the
# circuit breaker, and after an outage shorter than its open_for (5 s) the
# replay waits for its probe, seconds after the health checks saw the
# upstream back (--short: about 1.8 s after it started; docs/performance.md,
# "The coalesce scenario").
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SHORT=0; [ "${1:-}" = "--short" ] && SHORT=1
. "$HERE/lib.sh"
need python3; need curl
need_binary debug
OUT=${OUT:-/tmp/happypath-loadtest}/coalesce; mkdir -p "$OUT"
CLIENTS=${CLIENTS:-2000}; [ $SHORT = 1 ] && CLIENTS=${SHORT_CLIENTS:-400}
DURATION=${DURATION:-30}; [ $SHORT = 1 ] && DURATION=${SHORT_DURATION:-8}
DOWN=${DOWN:-10}; [ $SHORT = 1 ] && DOWN=${SHORT_DOWN:-3}
SLOTS=${SLOTS:-16}
SERVICE_MS=${SERVICE_MS:-100}
WORKERS=${WORKERS:-auto}
RUNS=${RUNS:-plain coalesced}
# What `workers: auto` becomes: one per online core (sysconf, as the proxy counts).
workers_n=$WORKERS; [ "$WORKERS" = auto ] && workers_n=$(getconf _NPROCESSORS_ONLN)
# Each client holds a connection to the proxy, which holds one to the
# upstream per request in flight: raise the soft limit for this shell's
# children as far as the hard one allows (coalesce-load.py checks its own).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# The chart needs matplotlib: Debian's package installs it for /usr/bin/python3,
# which may not be the python3 first on PATH (pyenv).
CHART_PYTHON=${CHART_PYTHON:-$(for p in /usr/bin/python3 python3; do "$p" -c 'import matplotlib' 2>/dev/null && { echo "$p"; break; }; done)}

run() {
  local name=$1 coalesce=$2
  read -r UP PX ADMIN <<<"$(free_ports 3)"
  cat > "$OUT/$name.yaml" <<YAML
listen: 127.0.0.1:$PX
admin: { listen: 127.0.0.1:$ADMIN }
workers: $WORKERS
drain_timeout: 1s
limits: { max_parked: 20000 }
defaults: { timeout: 40s, reachability: { park_for: 30s }, health_check: { interval: 250ms, timeout: 200ms } }
upstreams:
  api:
    endpoints: [http://127.0.0.1:$UP]
    max_connections: 4096
routes:
  - { match: { path_prefix: /r/ }, upstream: api$coalesce }
YAML
  if ! "$BIN" check --config "$OUT/$name.yaml" >"$OUT/$name.check.txt" 2>&1; then
    echo "== $name: the proxy refuses its configuration ($OUT/$name.yaml):"; sed 's/^/   /' "$OUT/$name.check.txt"
    return 1
  fi
  start_bg "$BIN" serve --config "$OUT/$name.yaml" --log-level warning >"$OUT/$name.proxy.log" 2>&1; local proxy=$!
  wait_http $proxy "the proxy" "http://127.0.0.1:$ADMIN/readyz" "$OUT/$name.proxy.log"
  echo "== $name: $CLIENTS clients for ${DURATION}s, the upstream closed for the first ${DOWN}s; workers $WORKERS ($workers_n)${coalesce:+, coalesce: true}"
  rm -f "$OUT/$name".{started,requests.csv,parked.csv,run.json,upstream.json,metrics.txt}
  start_bg python3 "$HERE/coalesce-load.py" --name "$name" --proxy 127.0.0.1:$PX --admin 127.0.0.1:$ADMIN \
    --out "$OUT" --clients "$CLIENTS" --duration "$DURATION" $([ $SHORT = 1 ] && echo "--drain 5") \
    >"$OUT/$name.load.log" 2>&1; local load=$!
  poll 10 test -s "$OUT/$name.started" || { echo "the load generator did not start (its log: $OUT/$name.load.log)"; return 1; }
  # The outage: DOWN seconds from the clients' start, then the upstream starts.
  python3 -c 'import sys, time; time.sleep(max(0.0, float(open(sys.argv[1]).read()) + float(sys.argv[2]) - time.monotonic()))' \
    "$OUT/$name.started" "$DOWN"
  start_bg python3 "$HERE/capacity-upstream.py" "$UP" "$SLOTS" "$SERVICE_MS" >"$OUT/$name.upstream.log" 2>&1; local upstream=$!
  wait_http $upstream "the capacity upstream" "http://127.0.0.1:$UP/healthz" "$OUT/$name.upstream.log"
  wait $load || { echo "the load generator failed (its log: $OUT/$name.load.log):"; tail -n 5 "$OUT/$name.load.log" | sed 's/^/   /'; return 1; }
  curl -sf "http://127.0.0.1:$UP/_cap/arrivals" > "$OUT/$name.upstream.json"
  stop $proxy; stop $upstream
}

ran=()
for name in $RUNS; do
  case "$name" in
    plain) coalesce="" ;;
    coalesced) coalesce=", coalesce: true" ;;
    *) echo "unknown run $name (plain, coalesced)"; exit 2 ;;
  esac
  run "$name" "$coalesce" && ran+=("$name") || echo "== $name: no numbers"
done
[ ${#ran[@]} -gt 0 ] || { echo "loadtest coalesce: FAILED: no run produced numbers"; exit 1; }
[ -n "$CHART_PYTHON" ] || echo "   no matplotlib (apt-get install -y python3-matplotlib): no chart"
"${CHART_PYTHON:-python3}" "$HERE/coalesce-report.py" --out "$OUT" --runs $RUNS --workers "$workers_n" \
  $([ $SHORT = 1 ] && echo --short) $([ -z "$CHART_PYTHON" ] && echo --no-chart)
